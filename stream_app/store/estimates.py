"""Estimates: the step index as the estimator reads it, the history, and the finals (claim, pending, confirm).

A final is claimed by the holder of the estimator lease with its fencing token in one script
(``lua/claim_final.lua``): recorded in the history (``estimates``), the finals index (``finals``, what the
estimator compares a step's ``n`` with) and the pending finals until the broker acknowledged its publication
(:meth:`Estimates.confirm_final`). A new lease holder reads ``ldp.estimates`` back from where the store knows it
(:meth:`Estimates.estimates_read`) and records what it finds (``lua/restore_final.lua``).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from .connection import StoreConnection
from .keys import (estimates_key, estimates_read_key, fence_key, finals_key, floor_key, latest_key, newest_final_key,
                   pending_key, steps_key)

__all__ = ["CLAIMED", "CLAIM_EXISTS", "CLAIM_STALE", "Estimates"]

# Results of Estimates.claim_final.
CLAIM_STALE = 0         # a lease holder with a newer fencing token claimed a final of the campaign: this one lost
CLAIMED = 1             # the final is this holder's to publish
CLAIM_EXISTS = 2        # this or a later revision of the step was claimed before


class Estimates(StoreConnection):
    """The step index, the history of estimates and the finals (module doc)."""

    async def steps_from(self, campaign: str, attribute: str, t: int) -> list[int]:
        """The steps ``>= t``, ascending."""
        return [int(x) for x in await self.redis.zrangebyscore(steps_key(campaign, attribute), t, "+inf")]

    async def steps_below(self, campaign: str, attribute: str, t: int) -> list[int]:
        """The steps ``< t``, ascending."""
        return [int(x) for x in await self.redis.zrangebyscore(steps_key(campaign, attribute), "-inf", f"({t}")]

    async def count_steps_below(self, campaign: str, attribute: str, t: int) -> int:
        """How many steps ``< t`` the attribute has."""
        return int(await self.redis.zcount(steps_key(campaign, attribute), "-inf", f"({t}"))

    async def count_steps_through(self, campaign: str, attribute: str, t: int) -> int:
        """How many steps ``<= t`` the attribute has (the "steps so far" of step ``t``)."""
        return int(await self.redis.zcount(steps_key(campaign, attribute), "-inf", t))

    async def unfinished_steps(self, campaign: str, attribute: str) -> list[int]:
        """The indexed steps without a final (the open ones, and settled ones that got no final)."""
        steps = await self.redis.zrangebyscore(steps_key(campaign, attribute), "-inf", "+inf")
        finals = set(await self.redis.hkeys(finals_key(campaign, attribute)))
        return [int(t) for t in steps if t not in finals]

    async def save_estimate(self, campaign: str, attribute: str, t: int, doc: dict[str, Any]) -> None:
        """Record (or replace, for a revision) the final estimate of step ``t`` in the history."""
        await self.redis.hset(estimates_key(campaign, attribute), str(t), json.dumps(doc))

    async def estimates(self, campaign: str, attribute: str) -> dict[int, dict[str, Any]]:
        """The history: ``t -> final estimate``."""
        raw = await self.redis.hgetall(estimates_key(campaign, attribute))
        return {int(k): json.loads(v) for k, v in raw.items()}

    async def final_steps(self, campaign: str, attribute: str) -> list[int]:
        """The steps with a final estimate, ascending."""
        return sorted(int(x) for x in await self.redis.hkeys(estimates_key(campaign, attribute)))

    async def final_estimates(self, campaign: str, attribute: str, ts: list[int]) -> list[dict[str, Any] | None]:
        """The final estimates of the steps ``ts`` (``None`` where a step has none)."""
        if not ts:
            return []
        raw = await self.redis.hmget(estimates_key(campaign, attribute), [str(t) for t in ts])
        return [json.loads(v) if v else None for v in raw]

    async def set_latest_estimate(self, campaign: str, attribute: str, doc: dict[str, Any]) -> None:
        await self.redis.set(latest_key(campaign, attribute), json.dumps(doc))

    async def latest_estimate_json(self, campaign: str, attribute: str) -> bytes | None:
        """The latest estimate of an attribute as stored (JSON bytes), ``None`` before the first."""
        raw = await self.redis.get(latest_key(campaign, attribute))
        return raw.encode() if isinstance(raw, str) else raw

    async def latest_estimate(self, campaign: str, attribute: str) -> dict[str, Any] | None:
        raw = await self.latest_estimate_json(campaign, attribute)
        return json.loads(raw) if raw else None

    async def claim_final(self, campaign: str, attribute: str, doc: dict[str, Any], token: int,
                          app_id: str) -> tuple[int, str]:
        """Claim a final (``doc``: its estimate, with ``t``, ``n`` and ``revision``) for the holder of ``app_id``'s
        estimator lease with fencing token ``token``, in one script: ``(CLAIMED, "")`` and the final is in the history, the finals index and
        the pending finals (publish it, then :meth:`confirm_final`); ``(CLAIM_EXISTS, "<n>:<revision>")`` if this
        or a later revision of the step was claimed before; ``(CLAIM_STALE, "<fence>")`` if a holder with a newer
        token claimed a final of the campaign (this one lost the lease)."""
        t = int(doc["t"])
        status, detail = await self._scripts["claim_final"](
            keys=self._final_keys(campaign, attribute, app_id),
            args=[int(token), t, int(doc["revision"]), int(doc.get("n_counted", doc["n"])), json.dumps(doc),
                  "1" if doc.get("clock") == "wall" else "0"])
        return int(status), detail.decode() if isinstance(detail, bytes) else str(detail)

    def _final_keys(self, campaign: str, attribute: str, app_id: str) -> list[str]:
        return [fence_key(campaign, app_id), finals_key(campaign, attribute), estimates_key(campaign, attribute),
                pending_key(campaign, attribute), newest_final_key(campaign)]

    async def confirm_final(self, campaign: str, attribute: str, t: int, revision: int) -> None:
        """The broker acknowledged the publication of revision ``revision`` of step ``t``: not pending any more."""
        await self._scripts["confirm_final"](keys=[pending_key(campaign, attribute)], args=[int(t), int(revision)])

    async def pending_finals(self, campaign: str, attribute: str) -> dict[int, int]:
        """``t -> revision`` of the claimed finals whose publication was not confirmed."""
        raw = await self.redis.hgetall(pending_key(campaign, attribute))
        return {int(t): int(rev) for t, rev in raw.items()}

    async def restore_final(self, campaign: str, attribute: str, doc: dict[str, Any], app_id: str) -> bool:
        """Record a final read back from ``ldp.estimates`` unless the store knows a later revision (or the step is
        expired); clear its pending mark. Returns whether the history changed."""
        return bool(await self._scripts["restore_final"](
            keys=self._final_keys(campaign, attribute, app_id) + [floor_key(campaign, attribute)],
            args=[int(doc.get("fence") or 0), int(doc["t"]), int(doc.get("revision", 0)),
                  int(doc.get("n_counted", doc["n"])),
                  json.dumps(doc), "1" if doc.get("clock") == "wall" else "0"]))

    async def estimates_read(self, app_id: str) -> dict[int, int]:
        """How far (``partition -> offset``) the finals on ``ldp.estimates`` are known to the store."""
        raw = await self.redis.hgetall(estimates_read_key(app_id))
        return {int(p): int(off) for p, off in raw.items()}

    async def set_estimates_read(self, app_id: str, offsets: Mapping[int, int]) -> None:
        if offsets:
            await self.redis.hset(estimates_read_key(app_id), mapping={str(p): int(o) for p, o in offsets.items()})

    async def newest_final(self, campaign: str) -> int | None:
        """The campaign's newest final logical step (``None`` before the first)."""
        raw = await self.redis.get(newest_final_key(campaign))
        return int(raw) if raw is not None else None

    async def final_index(self, campaign: str, attribute: str) -> dict[int, tuple[int, int]]:
        """``t -> (n, revision)`` of the published finals (the finals index)."""
        raw = await self.redis.hgetall(finals_key(campaign, attribute))
        out: dict[int, tuple[int, int]] = {}
        for t, value in raw.items():
            n, _, revision = (value.decode() if isinstance(value, bytes) else value).partition(":")
            out[int(t)] = (int(n), int(revision or 0))
        return out

    async def index_finals(self, campaign: str, attribute: str, finals: Mapping[int, tuple[int, int]]) -> None:
        """Add ``t -> (n, revision)`` entries to the finals index (finals recorded before the index existed)."""
        if finals:
            await self.redis.hset(finals_key(campaign, attribute),
                                  mapping={str(t): f"{n}:{rev}" for t, (n, rev) in finals.items()})
