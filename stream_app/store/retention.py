"""Late data and retention: the touched marks and the retention floor.

The leader estimator raises an attribute's floor (never lowers it: ``lua/raise_floor.lua``) as finals accumulate
(``Campaign.retention_steps``) and prunes the steps below it, a bounded batch per tick, each batch in one script
(``lua/prune.lua``: count hashes ``UNLINK``-ed, their entries in ``steps``, ``estimates``, ``finals``,
``closed_ts``, ``touched`` and ``pending`` removed). The apply scripts refuse a batch below the floor. Memory per
retained step and attribute: the "Retention" section of the operations docs (README today).
"""
from __future__ import annotations

from typing import Mapping

from .connection import StoreConnection
from .keys import (closed_ts_key, count_key, estimates_key, finals_key, floor_key, pending_key, pruned_key,
                   steps_key, touched_key)

__all__ = ["Retention"]


class Retention(StoreConnection):
    """Touched marks, the retention floor and pruning (module doc)."""

    async def mark_touched(self, campaign: str, attribute: str, t: int) -> None:
        """Mark step ``t`` touched, as :meth:`apply_batch` does for every applied batch: the estimator then
        re-reads the step and revises its final if it has one (late data)."""
        await self.redis.zincrby(touched_key(campaign, attribute), 1, str(t))

    async def touched(self, campaign: str, attribute: str, limit: int) -> dict[int, float]:
        """At most ``limit`` marked steps, ``t -> mark`` (pass them to :meth:`clear_touched` once handled)."""
        raw = await self.redis.zrange(touched_key(campaign, attribute), 0, limit - 1, withscores=True)
        return {int(t): float(score) for t, score in raw}

    async def clear_touched(self, campaign: str, attribute: str, marks: Mapping[int, float]) -> int:
        """Remove the marks read by :meth:`touched` that no batch incremented since; returns how many."""
        if not marks:
            return 0
        args: list[str] = []
        for t, score in marks.items():
            args += [str(t), repr(float(score))]
        return int(await self._scripts["clear_touched"](keys=[touched_key(campaign, attribute)], args=args))

    async def retention_floor(self, campaign: str, attribute: str) -> int:
        """The attribute's retention floor: steps ``t`` below it are expired (0 before any pruning)."""
        raw = await self.redis.get(floor_key(campaign, attribute))
        return int(raw) if raw is not None else 0

    async def expired(self, campaign: str, attribute: str, t: int) -> bool:
        """Whether step ``t`` is beyond retention: its batches must not be counted (the agent's "expired")."""
        return t < await self.retention_floor(campaign, attribute)

    async def raise_retention_floor(self, campaign: str, attribute: str, floor: int) -> int:
        """Raise the retention floor to ``floor`` (never lower it); returns the floor now in force."""
        return int(await self._scripts["raise_floor"](keys=[floor_key(campaign, attribute)], args=[int(floor)]))

    async def steps_before(self, campaign: str, attribute: str, t: int, limit: int) -> list[int]:
        """At most ``limit`` steps ``< t`` of the step index, ascending."""
        return [int(x) for x in await self.redis.zrangebyscore(steps_key(campaign, attribute), "-inf", f"({t}",
                                                               start=0, num=limit)]

    async def prune_steps(self, campaign: str, attribute: str, ts: list[int]) -> tuple[int, int]:
        """Delete every trace of the steps ``ts`` that are below the floor (others are left alone): count hash,
        step index, history, finals index, watermark time, touched mark. Returns how many left the step index
        and :meth:`pruned_steps` after it."""
        keys = [floor_key(campaign, attribute), steps_key(campaign, attribute), estimates_key(campaign, attribute),
                finals_key(campaign, attribute), closed_ts_key(campaign, attribute), touched_key(campaign, attribute),
                pruned_key(campaign, attribute), pending_key(campaign, attribute)]
        keys += [count_key(campaign, attribute, t) for t in ts]
        removed, count = await self._scripts["prune"](keys=keys, args=[str(t) for t in ts])
        return int(removed), int(count)

    async def pruned_steps(self, campaign: str, attribute: str) -> int:
        """How many steps were pruned from the attribute's step index (all below the retention floor)."""
        return int(await self.redis.hget(pruned_key(campaign, attribute), "count") or 0)
