"""The Redis count store: one hash per (campaign, attribute, time step).

Key ``ldp:{<campaign>}:<attribute>:<t>`` (the braces are a Redis Cluster hash tag: all keys of
a campaign live in one slot). Fields:

* ``c:<j>``: support count of value (or bucket) ``j``; absent means 0;
* ``n``: number of reports counted;
* ``off:<partition>``: last applied Kafka offset of that partition;
* ``closed``: 1 once a watermark for the step was applied;
* ``first_ts`` / ``last_ts``: wall-clock time (s) of the first / last applied batch.

A batch is applied by one Lua script on one key that skips it unless its offset is newer than
the partition's last applied one: redelivery after a crash never counts twice (exactly-once
counting), and one key per script keeps it Redis-Cluster-safe. Side indexes (the set of steps
of an attribute, final estimates) are idempotent writes outside the script.
"""
from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import redis.asyncio as aioredis

# KEYS[1] = count key. ARGV = partition, offset, now, n, closed(0/1), j1, c1, j2, c2, ...
_APPLY = """
local last = redis.call('HGET', KEYS[1], 'off:' .. ARGV[1])
if last and tonumber(last) >= tonumber(ARGV[2]) then
  return 0
end
for i = 6, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
end
if tonumber(ARGV[4]) > 0 then
  redis.call('HINCRBY', KEYS[1], 'n', ARGV[4])
  redis.call('HSETNX', KEYS[1], 'first_ts', ARGV[3])
  redis.call('HSET', KEYS[1], 'last_ts', ARGV[3])
end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'closed', 1)
end
redis.call('HSET', KEYS[1], 'off:' .. ARGV[1], ARGV[2])
return 1
"""


def count_key(campaign: str, attribute: str, t: int) -> str:
    return f"ldp:{{{campaign}}}:{attribute}:{t}"


def steps_key(campaign: str, attribute: str) -> str:
    return f"ldp:{{{campaign}}}:{attribute}:steps"


def estimates_key(campaign: str, attribute: str) -> str:
    return f"ldp:{{{campaign}}}:{attribute}:estimates"


class CountStore:
    """Async access to the support-count tables."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.redis = client
        self._apply = client.register_script(_APPLY)

    @classmethod
    def from_url(cls, url: str) -> "CountStore":
        return cls(aioredis.from_url(url))

    async def close(self) -> None:
        await self.redis.aclose()

    async def apply_batch(self, campaign: str, attribute: str, t: int, partition: int, offset: int,
                          counts: np.ndarray, n: int) -> bool:
        """Add a batch's support counts unless this partition offset was already applied.

        Returns ``False`` for a duplicate (nothing changed)."""
        nz = np.flatnonzero(counts)
        args: list[Any] = [partition, offset, f"{time.time():.6f}", int(n), 0]
        pairs = np.empty(2 * nz.size, dtype=np.int64)
        pairs[0::2], pairs[1::2] = nz, np.asarray(counts)[nz]
        args.extend(pairs.tolist())
        applied = await self._apply(keys=[count_key(campaign, attribute, t)], args=args)
        if applied:
            await self.redis.zadd(steps_key(campaign, attribute), {str(t): t})
        return bool(applied)

    async def apply_watermark(self, campaign: str, attribute: str, t: int, partition: int, offset: int) -> bool:
        """Mark step ``t`` closed (no more reports from its producer), exactly once."""
        applied = await self._apply(keys=[count_key(campaign, attribute, t)],
                                    args=[partition, offset, f"{time.time():.6f}", 0, 1])
        if applied:
            await self.redis.zadd(steps_key(campaign, attribute), {str(t): t})
        return bool(applied)

    async def read(self, campaign: str, attribute: str, t: int, size: int) -> dict[str, Any]:
        """``{"counts": int64 (size,), "n", "closed", "first_ts", "last_ts", "offsets"}``."""
        raw = await self.redis.hgetall(count_key(campaign, attribute, t))
        counts = np.zeros(size, dtype=np.int64)
        offsets: dict[int, int] = {}
        out: dict[str, Any] = {"n": 0, "closed": False, "first_ts": None, "last_ts": None}
        for k, v in raw.items():
            k = k.decode()
            if k.startswith("c:"):
                j = int(k[2:])
                if 0 <= j < size:
                    counts[j] = int(v)
            elif k.startswith("off:"):
                offsets[int(k[4:])] = int(v)
            elif k == "n":
                out["n"] = int(v)
            elif k == "closed":
                out["closed"] = True
            elif k in ("first_ts", "last_ts"):
                out[k] = float(v)
        out["counts"] = counts
        out["offsets"] = offsets
        return out

    async def steps(self, campaign: str, attribute: str) -> list[int]:
        return [int(x) for x in await self.redis.zrange(steps_key(campaign, attribute), 0, -1)]

    async def save_estimate(self, campaign: str, attribute: str, t: int, doc: dict[str, Any]) -> None:
        await self.redis.hset(estimates_key(campaign, attribute), str(t), json.dumps(doc))

    async def estimates(self, campaign: str, attribute: str) -> dict[int, dict[str, Any]]:
        raw = await self.redis.hgetall(estimates_key(campaign, attribute))
        return {int(k): json.loads(v) for k, v in raw.items()}
