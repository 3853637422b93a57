"""The estimator lease, its fencing tokens, the campaigns' fences, and the estimator's wake-ups.

One worker of a consumer group holds the lease (``lua/claim_lease.lua``) and publishes finals; every
acquisition draws a new fencing token, and a campaign's fence (raised by each claim) refuses the claims of an
older holder. A fence counter that is missing (a new or emptied store) starts at the current time in
milliseconds, so a token drawn after a store loss is still above every token drawn before it.
"""
from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis

from .connection import StoreConnection
from .keys import fence_counter_key, fence_key, lease_key, wake_channel

__all__ = ["Lease", "WakeUps"]


class WakeUps:
    """A subscription to the estimator's wake-up channel (see :meth:`CountStore.subscribe_wakeups`)."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    async def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for a wake-up; ``True`` if one arrived."""
        msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        return msg is not None

    async def close(self) -> None:
        """End the subscription."""
        await self._pubsub.aclose()


class Lease(StoreConnection):
    """The estimator lease and fences, and the estimator's wake-ups (module doc)."""

    async def claim_lease(self, app_id: str, holder: str, ttl_seconds: float) -> int:
        """Take the estimator lease of ``app_id`` if free, or renew it if ``holder`` has it; returns the holder's
        fencing token (a new one at every acquisition, higher than any before), 0 if another worker holds it."""
        return int(await self._scripts["claim_lease"](keys=[lease_key(app_id), fence_counter_key(app_id)],
                                           args=[holder, int(ttl_seconds * 1000), int(time.time() * 1000)]))

    async def release_lease(self, app_id: str, holder: str) -> None:
        """Give the lease up if ``holder`` still has it."""
        await self._scripts["release_lease"](keys=[lease_key(app_id)], args=[holder])

    async def raise_fence(self, campaign: str, app_id: str, token: int) -> None:
        """Refuse the claims of ``app_id``'s older lease holders from now on (a new holder, before it reads)."""
        await self._scripts["raise_floor"](keys=[fence_key(campaign, app_id)], args=[int(token)])

    async def fence_holds(self, campaign: str, app_id: str, token: int) -> bool:
        """Whether ``token`` is still at or above ``campaign``'s fence (no newer lease holder raised it)."""
        raw = await self.redis.get(fence_key(campaign, app_id))
        return raw is None or int(raw) <= int(token)

    async def wake_estimator(self, app_id: str, campaign: str, attribute: str, t: int) -> None:
        """Wake the estimator loops of ``app_id`` (a step was closed)."""
        await self.redis.publish(wake_channel(app_id), f"{campaign}:{attribute}:{t}")

    async def subscribe_wakeups(self, app_id: str) -> WakeUps:
        """Subscribe to the wake-ups that :meth:`wake_estimator` sends.

        On a cluster the subscription lives on the master of the channel's slot (PUBLISH reaches every
        node); the cluster client needs its slot map first to pick that node."""
        if isinstance(self.redis, aioredis.RedisCluster):
            await self.redis.initialize()  # idempotent; a fresh client has no slot map yet
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(wake_channel(app_id))
        return WakeUps(pubsub)
