"""Counting: the apply of a batch or a watermark, the batch ledger, and the typed step vectors.

The aggregate of one (campaign, attribute, step) is a typed, additive vector whose dtype and shape come from the
protocol (support counts today: ``int64`` of shape ``(k,)``; sums, histograms and sketch matrices later): one
hash per step (:func:`.keys.count_key`), whatever the kind of report. Fields of a step hash:

* ``c:<j>``: element ``j`` of the flattened vector (absent: 0); ``dtype`` (``int64`` or ``float64``) and ``shape``
  (``"k"`` or ``"r,c"``): recorded by the step's first batch (:class:`VectorType`);
* ``n``: reports counted; ``b:<batch_id>``: an applied batch (value ``<partition>:<offset>``): the batch ledger;
* ``rejected``: reports of applied batches that the attribute's poisoning defense did not count (absent: 0);
* ``closed``: 1 once a watermark for the step was applied; ``expected``: the reports its watermark says the
  producer sent (absent: not stated);
* ``first_ts`` / ``last_ts``: wall-clock time (s) of the first / last applied batch; ``wall``: 1 if the step got
  a batch of the HTTP ingest (a wall-clock step); ``incomplete``: why the step may miss reports.

A batch is applied by one Lua script (``lua/apply_prelude.lua`` + ``apply_batch.lua`` + ``apply_epilogue.lua``):
one ``EVALSHA``, the only round trip of a batch on one node. It skips a batch whose id (chosen by the producer)
was applied to the step before: a re-sent batch, a redelivery or a replay from Kafka never counts twice, whatever
its partition or offset. The same script checks the campaign's epoch (gone: Redis lost the campaign's keys,
:data:`STORE_RESET`), its server marker (:mod:`.connection`: :data:`SERVER_CHANGED`), the retention floor
(:data:`EXPIRED`) and the step bound (:data:`FUTURE_STEP`), indexes the step, marks it touched and writes the
campaign's cursor and (one node) the consumer position, all atomically. Every key but the position shares the
campaign's hash tag (Redis-Cluster-safe). For an attribute whose defense runs over a step's reports
(``defense = "itemset"``) the same script appends the batch's counted reports, packed, to the step's report log
(:func:`.keys.step_reports_key`), so the log holds exactly the counted reports, each once.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping, NamedTuple, TypedDict

import numpy as np

from wire.envelope import is_wall_clock

from .connection import connect_sync, is_cluster_url, _shared_cluster_client, new_token
from .keys import (closed_ts_key, count_key, cursor_key, epoch_key, floor_key, newest_final_key, positions_key,
                   server_marker_key, step_reports_key, steps_key, touched_key)
from .positions import Position, Positions, position_entry

__all__ = ["ALREADY_CLOSED", "APPLIED", "Counts", "DUPLICATE_BATCH_ID", "EXPIRED", "FUTURE_STEP", "SERVER_CHANGED",
           "STORE_RESET", "StepBound", "StepState", "VectorType", "read_step_sync"]

# Results of the apply scripts.
APPLIED = 1             # the batch was counted / the watermark closed the step
ALREADY_CLOSED = 0      # a watermark of a step already closed (idempotent: nothing changed)
DUPLICATE_BATCH_ID = 2  # the batch id was applied before (a re-send, redelivery or replay): nothing changed
STORE_RESET = 3         # the campaign's epoch is not the worker's: Redis lost data; nothing changed
EXPIRED = 4             # the step is below the attribute's retention floor (pruned): nothing changed
SERVER_CHANGED = 5      # Redis restarted or was replaced since the last apply to the campaign: nothing changed until
                        # the worker checked the cursors and called CountStore.accept_server (or replays what was lost)
FUTURE_STEP = 6         # the step is further ahead than the campaign's bound (Campaign.max_steps_ahead): nothing
                        # changed (the agent rejects it as ``future_step``)

_COUNT_FIELD = "c:"
_BATCH_FIELD = "b:"
_BATCH_PREFIX = _BATCH_FIELD.encode()


class VectorType(NamedTuple):
    """The dtype and shape of a step vector, as recorded in its hash (``int64`` / ``float64``; any shape)."""

    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, values: np.ndarray) -> "VectorType":
        """The type of ``values`` (an integer array counts as ``int64``, any other as ``float64``)."""
        return cls("int64" if values.dtype.kind in "iub" else "float64", tuple(int(s) for s in values.shape))

    def args(self) -> list[str]:
        """The script arguments: dtype and shape (``"r,c"``)."""
        return [self.dtype, ",".join(str(s) for s in self.shape)]

    def pairs(self, values: np.ndarray) -> list[Any]:
        """``flat index, value, ...`` of the non-zero elements."""
        flat = np.asarray(values).reshape(-1)
        nz = np.flatnonzero(flat)
        if self.dtype == "int64":
            out = np.empty(2 * nz.size, dtype=np.int64)
            out[0::2], out[1::2] = nz, flat[nz]
            return out.tolist()
        return [x for j in nz.tolist() for x in (j, repr(float(flat[j])))]


class StepBound(NamedTuple):
    """How far ahead of the stream a batch's step may be (``Campaign.max_steps_ahead``; the default: unbounded).

    A logical step (a fleet's 0, 1, 2, ...) may be at most ``ahead`` steps past the campaign's newest final step
    (no bound before the first final, or after a store loss until the finals are rebuilt); a wall-clock step of
    the HTTP ingest (:func:`wire.envelope.is_wall_clock`) at most ``wall_limit``. Beyond: :data:`FUTURE_STEP`."""

    wall_limit: int = 2 ** 53
    ahead: int = 2 ** 53

    def args(self, wall: bool) -> list[Any]:
        """The script arguments: wall ('1' / '0'), wall limit, ahead."""
        return ["1" if wall else "0", int(self.wall_limit), int(self.ahead)]


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
    rejected: int  # reports the attribute's poisoning defense did not count


def _parse_step(raw: Mapping[bytes, bytes], size: int) -> StepState:
    """A step hash as read (``size``: the length of the flat vector wanted)."""
    counts = np.zeros(size, dtype=np.float64 if raw.get(b"dtype") == b"float64" else np.int64)
    state = StepState(counts=counts, n=0, closed=False, first_ts=None, last_ts=None, wall=False, expected=0,
                      incomplete=None, rejected=0)
    for k, v in raw.items():
        if k.startswith(_BATCH_PREFIX):  # applied batch ids: not part of the step's counts
            continue
        k = k.decode()
        if k.startswith(_COUNT_FIELD):
            j = int(k[len(_COUNT_FIELD):])
            if 0 <= j < size:
                counts[j] = float(v) if counts.dtype.kind == "f" else int(v)
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
        elif k == "rejected":
            state["rejected"] = int(v)
        elif k == "incomplete":
            state["incomplete"] = v.decode(errors="replace")
    return state


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


class Counts(Positions):
    """The apply of batches and watermarks, and reading steps back (module doc)."""

    async def epoch(self, campaign: str) -> str:
        """The campaign's store epoch (created if absent: a new store, or one that lost its data)."""
        cached = self._epochs.get(campaign)
        if cached is None:
            key = epoch_key(campaign)
            await self.redis.set(key, new_token(), nx=True)
            raw = await self.redis.get(key)
            cached = self._epochs[campaign] = raw.decode() if isinstance(raw, bytes) else str(raw)
        return cached

    def _apply_keys(self, campaign: str, attribute: str, t: int, position: Position | None) -> list[str]:
        """KEYS of the apply scripts (``lua/apply_prelude.lua``); the positions key on one node only."""
        keys = [count_key(campaign, attribute, t), epoch_key(campaign), floor_key(campaign, attribute),
                steps_key(campaign, attribute), touched_key(campaign, attribute), newest_final_key(campaign),
                server_marker_key(campaign), cursor_key(campaign)]
        if self._one_node and position is not None:
            keys.append(positions_key(position.app_id))
        return keys

    async def _run_apply(self, script: str, campaign: str, attribute: str, t: int, wall: bool, bound: "StepBound",
                         position: Position | None, tail: list[Any]) -> int:
        """Run an apply script (one round trip); then, on a cluster, record the position."""
        cursor_field = cursor_value = position_field = ""
        if position is not None:
            position_field, cursor_value = position_entry(position)
            cursor_field = f"{position.app_id}|{position_field}"
        epoch = await self.epoch(campaign)
        args = [epoch, int(t), *bound.args(wall), self._expected_marker(campaign), new_token(), cursor_field,
                cursor_value, position_field, *tail]
        status, marker = await self._scripts[script](keys=self._apply_keys(campaign, attribute, t, position),
                                                     args=args)
        status = int(status)
        self._saw_marker(campaign, marker.decode() if isinstance(marker, bytes) else str(marker),
                         status == SERVER_CHANGED)
        if status == STORE_RESET:  # the marker went with the data: the next apply takes the new one
            self._epochs.pop(campaign, None)
            self._markers.pop(campaign, None)
        elif status not in (EXPIRED, SERVER_CHANGED, FUTURE_STEP) and position is not None and not self._one_node:
            # a cluster: the positions key is in another slot than the campaign's (a refused step records
            # nothing here: the agent rejects the message and records it then)
            await self.set_position(position)
        return status

    async def apply_batch(self, campaign: str, attribute: str, t: int, counts: np.ndarray, n: int, batch_id: str,
                          where: str = "", position: Position | None = None, bound: StepBound = StepBound(), *,
                          rejected: int = 0, reports: bytes = b"") -> int:
        """Add a batch's step vector (``counts``: the protocol's aggregate of the batch, any shape) unless its
        ``batch_id`` was already applied to step ``t``.

        Returns :data:`APPLIED`, :data:`DUPLICATE_BATCH_ID` (nothing changed: a re-sent, redelivered or
        replayed batch), :data:`EXPIRED` (nothing changed: step ``t`` is below the retention floor),
        :data:`STORE_RESET` (nothing changed: the campaign's epoch is gone or new, so Redis lost data since
        this store last saw it; the next call uses the new epoch) or :data:`SERVER_CHANGED` (nothing changed:
        Redis restarted since the last apply to the campaign; call :meth:`accept_server` once the campaign's
        :meth:`cursors` showed nothing lost). ``where`` (``"<partition>:<offset>"``) is kept with the batch id
        for diagnosis. ``position``: the message's consumer position, recorded with the batch unless the step was
        refused: the position never runs ahead of the counts, even after an AOF loss. ``bound``: how far ahead
        step ``t`` may be (:class:`StepBound`); beyond it :data:`FUTURE_STEP`, nothing changed. ``rejected``: the
        batch's reports the poisoning defense did not count (added to the step's ``rejected``); ``reports``: the
        counted reports, packed, appended to the step's report log (:meth:`step_reports`)."""
        if not batch_id:
            raise ValueError("a batch must have a batch id")
        values = np.asarray(counts)
        vtype = VectorType.of(values)
        return await self._run_apply("apply_batch", campaign, attribute, t, is_wall_clock(batch_id), bound, position,
                                     [_stamp(time.time()), int(n), batch_id, where, *vtype.args(), int(rejected),
                                      reports, *vtype.pairs(values)])

    async def apply_watermark(self, campaign: str, attribute: str, t: int, position: Position | None = None,
                              bound: StepBound = StepBound(), count: int = 0) -> int:
        """Mark step ``t`` closed (no more reports from its producer, which sent ``count`` of them; 0: not
        stated): :data:`APPLIED` the first time, :data:`ALREADY_CLOSED` after, :data:`STORE_RESET` as in
        :meth:`apply_batch` (``position``, ``bound`` too)."""
        return await self._run_apply("apply_watermark", campaign, attribute, t, False, bound, position, [int(count)])

    async def read_step(self, campaign: str, attribute: str, t: int, size: int) -> StepState:
        """The counts and state of step ``t`` (``size``: the protocol's support size)."""
        return _parse_step(await self.redis.hgetall(count_key(campaign, attribute, t)), size)

    async def step_reports(self, campaign: str, attribute: str, t: int) -> bytes:
        """The report log of step ``t``: the packed reports of its applied batches, in the order applied
        (empty unless the attribute keeps one: ``defense = "itemset"``)."""
        return bytes(await self.redis.get(step_reports_key(campaign, attribute, t)) or b"")

    async def read_steps(self, campaign: str, attribute: str, ts: list[int], size: int) -> list[StepState]:
        """:meth:`read_step` of each step of ``ts`` in one round trip (one connection, however many steps)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in ts:
            pipe.hgetall(count_key(campaign, attribute, t))
        return [_parse_step(raw, size) for raw in await pipe.execute()] if ts else []

    async def reports_counted(self, campaign: str, attribute: str, ts: Iterable[int]) -> list[int]:
        """``n`` of each step of ``ts`` (one round trip)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in ts:
            pipe.hget(count_key(campaign, attribute, t), "n")
        return [int(v or 0) for v in await pipe.execute()]

    async def record_closed_at(self, campaign: str, attribute: str, t: int, when: float) -> None:
        """Remember when step ``t``'s watermark was first applied (later calls keep the first time)."""
        await self.redis.hsetnx(closed_ts_key(campaign, attribute), str(t), _stamp(when))

    async def closed_times(self, campaign: str, attribute: str, ts: list[int]) -> list[float | None]:
        """When each step of ``ts`` was closed by its watermark (``None``: not closed by one)."""
        raw = await self.redis.hmget(closed_ts_key(campaign, attribute), [str(t) for t in ts])
        return [float(v) if v is not None else None for v in raw]

    async def mark_incomplete(self, campaign: str, attribute: str, ts: Iterable[int], why: str) -> None:
        """Mark steps whose reports the broker may have lost before they were counted: their finals say
        ``complete: false`` (an unrepairable loss, ``stream_app.app``)."""
        pipe = self.redis.pipeline(transaction=False)
        for t in ts:
            pipe.hset(count_key(campaign, attribute, t), "incomplete", why)
        await pipe.execute()
