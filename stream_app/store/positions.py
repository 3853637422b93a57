"""Consumer positions and the campaigns' cursors.

A worker restores its consumer position from the store, not from Kafka's commits: the position lives with the
counts. ``ldp:positions:<app_id>`` holds the last handled message of each partition; a campaign's cursor hash
(in the campaign's slot, written by the apply scripts with the counts) its last message of each partition whose
effects the store holds. On one node the apply scripts write the position too (the same round trip); on a
cluster, whose positions key lives in another slot, :meth:`Positions.set_position` follows the apply.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple

from .connection import StoreConnection
from .keys import closed_ts_key, cursor_key, loss_marks_key, positions_key

__all__ = ["Position", "Positions", "position_entry"]


class Position(NamedTuple):
    """The message a worker handled last on a partition: what :meth:`CountStore.positions` returns later."""

    app_id: str
    topic: str
    partition: int
    offset: int
    ident: str


def position_entry(position: Position) -> tuple[str, str]:
    """The field and value of ``position`` in the positions hash."""
    return f"{position.topic}:{position.partition}", f"{position.offset}|{position.ident}"


def _parse_positions(raw: Mapping[Any, Any], prefix: str) -> dict[int, tuple[int, str]]:
    """``partition -> (offset, ident)`` from a positions or cursor hash: the fields ``<prefix><partition>``
    and their values ``<offset>|<ident>`` (:func:`position_entry`)."""
    out: dict[int, tuple[int, str]] = {}
    for field_, value in raw.items():
        field_ = field_.decode() if isinstance(field_, bytes) else field_
        value = value.decode() if isinstance(value, bytes) else value
        if field_.startswith(prefix) and field_[len(prefix):].isdigit():
            offset, _, ident = value.partition("|")
            out[int(field_[len(prefix):])] = (int(offset), ident)
    return out


class Positions(StoreConnection):
    """Positions and cursors (module doc)."""

    async def cursors(self, campaign: str, app_id: str, topic: str) -> dict[int, tuple[int, str]]:
        """``partition -> (offset, ident)``: the campaign's last message of each partition that the store holds."""
        return _parse_positions(await self.redis.hgetall(cursor_key(campaign)), f"{app_id}|{topic}:")

    async def set_position(self, position: Position) -> None:
        """Record ``position`` as its partition's last handled message (moves a position back before a replay)."""
        await self.redis.hset(positions_key(position.app_id), *position_entry(position))

    async def forget_positions(self, app_id: str, topic: str, partitions: Iterable[int]) -> None:
        """Drop the recorded positions of ``partitions`` (their topic was recreated: replay it from the start)."""
        fields_ = [f"{topic}:{p}" for p in partitions]
        if fields_:
            await self.redis.hdel(positions_key(app_id), *fields_)

    async def set_loss_marks(self, app_id: str, topic: str,
                             marks: Mapping[int, Mapping[str, tuple[int, str]]]) -> None:
        """Record ``partition -> campaign -> (stream step at the loss, why)`` of an unrepairable broker loss."""
        fields_ = {f"{topic}:{p}:{campaign}": f"{int(since)}|{why}"
                   for p, by_campaign in marks.items() for campaign, (since, why) in by_campaign.items()}
        if fields_:
            await self.redis.hset(loss_marks_key(app_id), mapping=fields_)

    async def loss_marks(self, app_id: str, topic: str,
                         partitions: Iterable[int]) -> dict[int, dict[str, tuple[int, str]]]:
        """The recorded loss marks of ``partitions`` (:meth:`set_loss_marks`)."""
        wanted = {int(p) for p in partitions}
        out: dict[int, dict[str, tuple[int, str]]] = {}
        for field_, value in (await self.redis.hgetall(loss_marks_key(app_id))).items():
            field_ = field_.decode() if isinstance(field_, bytes) else field_
            value = value.decode() if isinstance(value, bytes) else value
            head, _, campaign = field_.rpartition(":")
            t, _, p = head.rpartition(":")
            if t == topic and p.isdigit() and int(p) in wanted:
                since, _, why = value.partition("|")
                out.setdefault(int(p), {})[campaign] = (int(since), why)
        return out

    async def clear_loss_mark(self, app_id: str, topic: str, partition: int, campaign: str) -> None:
        """Drop one loss mark: its lost steps were marked incomplete."""
        await self.redis.hdel(loss_marks_key(app_id), f"{topic}:{partition}:{campaign}")

    async def positions(self, app_id: str, topic: str) -> dict[int, tuple[int, str]]:
        """``partition -> (offset, ident)`` of the last handled message of each partition of ``topic``."""
        return _parse_positions(await self.redis.hgetall(positions_key(app_id)), f"{topic}:")
