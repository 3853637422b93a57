"""The Redis count store: the only module of the project that speaks Redis.

Everything the pipeline keeps in Redis is defined here (key formats, hash fields, Lua scripts)
and read or written through :class:`CountStore` methods named after what they mean: the
counting agent applies batches and watermarks, the windowed estimator (:mod:`stream_app.windows`)
scans steps, holds its lease and records estimates, the web API reads estimates, and the
benchmarks and test harness read counts (:func:`read_step_sync`).

Keys (the braces are a Redis Cluster hash tag: all keys of a campaign live in one slot):

* ``ldp:{<campaign>}:<attribute>:<t>``: hash, the support counts of one time step (fields below);
* ``ldp:{<campaign>}:<attribute>:steps``: sorted set of the steps ``t`` of an attribute (score ``t``);
* ``ldp:{<campaign>}:<attribute>:estimates``: hash ``t -> JSON`` of the final estimates (the history);
* ``ldp:{<campaign>}:<attribute>:latest``: JSON of the latest estimate (highest ``t``);
* ``ldp:{<campaign>}:<attribute>:closed_ts``: hash ``t -> wall-clock time its watermark was applied``;
* ``ldp:estimator-lease:<app_id>``: the estimator lease (value: the holder's worker id);
* ``ldp:estimator-wake:<app_id>``: pub/sub channel that wakes the estimator after a watermark.

Fields of a step hash:

* ``c:<j>``: support count of value (or bucket) ``j``; absent means 0;
* ``n``: number of reports counted;
* ``off:<partition>``: last applied Kafka offset of that partition;
* ``b:<batch_id>``: the producer's id of an applied batch (value: ``<partition>:<offset>``);
* ``closed``: 1 once a watermark for the step was applied;
* ``first_ts`` / ``last_ts``: wall-clock time (s) of the first / last applied batch.

A batch is applied by one Lua script on one key that skips it if its batch id (from the
envelope, chosen by the producer) was already applied -- a re-sent batch (producer retry,
resumed fleet) never counts twice -- and otherwise unless its offset is newer than the
partition's last applied one: redelivery after a crash never counts twice (exactly-once
counting). A batch without an id has only the offset check. One key per script keeps it
Redis-Cluster-safe. Side indexes (the set of steps
of an attribute, final estimates) are idempotent writes outside the script.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterable, Mapping, TypedDict

import numpy as np
import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

__all__ = ["APPLIED", "DUPLICATE_BATCH_ID", "DUPLICATE_OFFSET", "CountStore", "RETRYABLE_ERRORS", "StepState",
           "WakeUps", "closed_ts_key", "count_key", "estimates_key", "latest_key", "lease_key", "read_step_sync", "steps_key", "wake_channel"]

# Errors after which a store call may succeed if retried (connection loss, loading, OOM, ...).
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (RedisError, ConnectionError, OSError)

_COUNT_FIELD = "c:"
_OFFSET_FIELD = "off:"
_BATCH_FIELD = "b:"
_BATCH_PREFIX = _BATCH_FIELD.encode()

# Results of the apply script.
APPLIED, DUPLICATE_OFFSET, DUPLICATE_BATCH_ID = 1, 0, 2

# KEYS[1] = count key. ARGV = partition, offset, now, n, closed(0/1), batch_id ('' = none), j1, c1, j2, c2, ...
# Returns 1 (applied), 0 (offset already applied) or 2 (batch id already applied).
_APPLY = """
if ARGV[6] ~= '' and redis.call('HEXISTS', KEYS[1], 'b:' .. ARGV[6]) == 1 then
  return 2
end
local last = redis.call('HGET', KEYS[1], 'off:' .. ARGV[1])
if last and tonumber(last) >= tonumber(ARGV[2]) then
  return 0
end
if ARGV[6] ~= '' then
  redis.call('HSETNX', KEYS[1], 'b:' .. ARGV[6], ARGV[1] .. ':' .. ARGV[2])
end
for i = 7, #ARGV, 2 do
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

# KEYS[1] = lease key. ARGV = holder, ttl (ms). Take a free lease or renew one's own.
_CLAIM_LEASE = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS[1] = lease key. ARGV = holder. Delete the lease only if the holder still owns it.
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


# ---------------------------------------------------------------------------- key formats
def _attribute_prefix(campaign: str, attribute: str) -> str:
    return f"ldp:{{{campaign}}}:{attribute}"


def count_key(campaign: str, attribute: str, t: int) -> str:
    """Hash of the support counts of step ``t``."""
    return f"{_attribute_prefix(campaign, attribute)}:{t}"


def steps_key(campaign: str, attribute: str) -> str:
    """Sorted set of the steps of an attribute."""
    return f"{_attribute_prefix(campaign, attribute)}:steps"


def estimates_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> JSON`` of the final estimates."""
    return f"{_attribute_prefix(campaign, attribute)}:estimates"


def latest_key(campaign: str, attribute: str) -> str:
    """JSON of the latest estimate (highest ``t``) of an attribute (for ``GET /estimates``)."""
    return f"{_attribute_prefix(campaign, attribute)}:latest"


def closed_ts_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> wall-clock time the watermark was applied`` (written by the agent)."""
    return f"{_attribute_prefix(campaign, attribute)}:closed_ts"


def lease_key(app_id: str) -> str:
    """The estimator lease of a consumer group."""
    return f"ldp:estimator-lease:{app_id}"


def wake_channel(app_id: str) -> str:
    """Pub/sub channel that wakes the estimator of a consumer group."""
    return f"ldp:estimator-wake:{app_id}"


# ---------------------------------------------------------------------------- step state
class StepState(TypedDict):
    """One step's hash, parsed: support counts, ``n``, watermark flag, batch times, partition offsets."""

    counts: np.ndarray  # int64, (support size,)
    n: int
    closed: bool
    first_ts: float | None
    last_ts: float | None
    offsets: dict[int, int]


def _parse_step(raw: Mapping[bytes, bytes], size: int) -> StepState:
    counts = np.zeros(size, dtype=np.int64)
    state = StepState(counts=counts, n=0, closed=False, first_ts=None, last_ts=None, offsets={})
    for k, v in raw.items():
        if k.startswith(_BATCH_PREFIX):  # applied batch ids: not part of the step's counts
            continue
        k = k.decode()
        if k.startswith(_COUNT_FIELD):
            j = int(k[len(_COUNT_FIELD):])
            if 0 <= j < size:
                counts[j] = int(v)
        elif k.startswith(_OFFSET_FIELD):
            state["offsets"][int(k[len(_OFFSET_FIELD):])] = int(v)
        elif k == "n":
            state["n"] = int(v)
        elif k == "closed":
            state["closed"] = True
        elif k == "first_ts":
            state["first_ts"] = float(v)
        elif k == "last_ts":
            state["last_ts"] = float(v)
    return state


def read_step_sync(redis_url: str, campaign: str, attribute: str, t: int, size: int) -> StepState:
    """:meth:`CountStore.read_step` from synchronous code (a test or a benchmark waiting for counts)."""
    client = redis.Redis.from_url(redis_url)
    try:
        return _parse_step(client.hgetall(count_key(campaign, attribute, t)), size)
    finally:
        client.close()


def _stamp(when: float) -> str:
    return f"{when:.6f}"


# ---------------------------------------------------------------------------- the store
class WakeUps:
    """A subscription to the estimator's wake-up channel (see :meth:`CountStore.subscribe_wakeups`)."""

    def __init__(self, pubsub: Any) -> None:
        self._pubsub = pubsub

    async def wait(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for a wake-up; ``True`` if one arrived."""
        msg = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout)
        return msg is not None

    async def close(self) -> None:
        await self._pubsub.aclose()


class CountStore:
    """Async access to the support counts, the step index, the estimates and the estimator lease."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.redis = client
        self._apply = client.register_script(_APPLY)
        self._claim_lease = client.register_script(_CLAIM_LEASE)
        self._release_lease = client.register_script(_RELEASE_LEASE)

    @classmethod
    def from_url(cls, url: str) -> "CountStore":
        return cls(aioredis.from_url(url))

    async def close(self) -> None:
        await self.redis.aclose()

    # ------------------------------------------------------------------ counting (the agent)
    async def apply_batch_status(self, campaign: str, attribute: str, t: int, partition: int, offset: int,
                                 counts: np.ndarray, n: int, batch_id: str = "") -> int:
        """Add a batch's support counts unless its ``batch_id`` or this partition offset was already applied.

        Returns :data:`APPLIED`, :data:`DUPLICATE_BATCH_ID` (the id was applied before: a re-sent
        batch) or :data:`DUPLICATE_OFFSET` (the offset was applied before: a redelivery); nothing
        changes for a duplicate. An empty ``batch_id`` has the offset check only."""
        nz = np.flatnonzero(counts)
        args: list[Any] = [partition, offset, _stamp(time.time()), int(n), 0, batch_id]
        pairs = np.empty(2 * nz.size, dtype=np.int64)
        pairs[0::2], pairs[1::2] = nz, np.asarray(counts)[nz]
        args.extend(pairs.tolist())
        status = int(await self._apply(keys=[count_key(campaign, attribute, t)], args=args))
        if status == APPLIED:
            await self.redis.zadd(steps_key(campaign, attribute), {str(t): t})
        return status

    async def apply_batch(self, campaign: str, attribute: str, t: int, partition: int, offset: int,
                          counts: np.ndarray, n: int, batch_id: str = "") -> bool:
        """:meth:`apply_batch_status` as a flag: ``False`` for a duplicate (nothing changed)."""
        return await self.apply_batch_status(campaign, attribute, t, partition, offset, counts, n,
                                             batch_id) == APPLIED

    async def apply_watermark(self, campaign: str, attribute: str, t: int, partition: int, offset: int) -> bool:
        """Mark step ``t`` closed (no more reports from its producer), exactly once."""
        applied = await self._apply(keys=[count_key(campaign, attribute, t)],
                                    args=[partition, offset, _stamp(time.time()), 0, 1, ""]) == APPLIED
        if applied:
            await self.redis.zadd(steps_key(campaign, attribute), {str(t): t})
        return bool(applied)

    async def record_closed_at(self, campaign: str, attribute: str, t: int, when: float) -> None:
        """Remember when step ``t``'s watermark was first applied (later calls keep the first time)."""
        await self.redis.hsetnx(closed_ts_key(campaign, attribute), str(t), _stamp(when))

    async def wake_estimator(self, app_id: str, campaign: str, attribute: str, t: int) -> None:
        """Wake the estimator loops of ``app_id`` (a step was closed)."""
        await self.redis.publish(wake_channel(app_id), f"{campaign}:{attribute}:{t}")

    # ------------------------------------------------------------------ steps (the estimator)
    async def read_step(self, campaign: str, attribute: str, t: int, size: int) -> StepState:
        """The counts and state of step ``t`` (``size``: the protocol's support size)."""
        return _parse_step(await self.redis.hgetall(count_key(campaign, attribute, t)), size)

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

    async def reports_counted(self, campaign: str, attribute: str, ts: Iterable[int]) -> list[int]:
        """``n`` of each step of ``ts`` (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in ts:
            pipe.hget(count_key(campaign, attribute, t), "n")
        return [int(v or 0) for v in await pipe.execute()]

    async def closed_times(self, campaign: str, attribute: str, ts: list[int]) -> list[float | None]:
        """When each step of ``ts`` was closed by its watermark (``None``: not closed by one)."""
        raw = await self.redis.hmget(closed_ts_key(campaign, attribute), [str(t) for t in ts])
        return [float(v) if v is not None else None for v in raw]

    # ------------------------------------------------------------------ estimates
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

    # ------------------------------------------------------------------ the estimator lease
    async def claim_lease(self, app_id: str, holder: str, ttl_seconds: float) -> bool:
        """Take the estimator lease of ``app_id`` if free, or renew it if ``holder`` has it."""
        return bool(await self._claim_lease(keys=[lease_key(app_id)], args=[holder, int(ttl_seconds * 1000)]))

    async def release_lease(self, app_id: str, holder: str) -> None:
        """Give the lease up if ``holder`` still has it."""
        await self._release_lease(keys=[lease_key(app_id)], args=[holder])

    async def subscribe_wakeups(self, app_id: str) -> WakeUps:
        """Subscribe to the wake-ups that :meth:`wake_estimator` sends."""
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(wake_channel(app_id))
        return WakeUps(pubsub)
