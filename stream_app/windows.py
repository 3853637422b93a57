"""The windowed estimator: turns the Redis support counts of open time steps into estimates.

Who runs it
    Every worker runs the loop, but only the holder of a Redis *lease*
    (:meth:`CountStore.claim_lease <stream_app.store.CountStore.claim_lease>`, renewed every tick) computes and
    publishes. Why not Faust's ``on_leader`` timers: with no changelog tables Faust uses the round-robin assignor
    and has no leader partition, and a leader elected through the consumer group is lost for a whole session
    timeout when it is killed (tansu delays the rejoin); the lease moves to another worker after ``lease_ttl``
    seconds whatever the group does.

One revision-0 final per step, fenced
    Every acquisition of the lease draws a new *fencing token*, higher than any before (a counter that, if the
    store lost it, restarts at the clock in milliseconds). A new holder first raises each campaign's fence to its
    token, so a holder that lost the lease (stalled past it: a broker outage, SIGSTOP, a long pause) can no longer
    claim anything. Publishing a final (or a revision) first *claims* ``(campaign, attribute, t, revision)`` with
    the token in one script (:meth:`~stream_app.store.CountStore.claim_final`): the document goes into the
    history and the finals index, marked *pending*; only the claimant publishes it, and the broker's
    acknowledgement clears the mark. A claim left pending (its holder failed or died before the
    acknowledgement) is published again by the next tick of whoever holds the lease, unchanged: same key
    (:func:`wire.topics.estimate_key`), same document, so a retried publication is idempotent for consumers.
    That retry is the only one: the publisher sends each estimate in one produce request and never resends it
    behind the estimator's back (:mod:`stream_app.publisher`).
    The topic is the record of what was published: a new holder, and a holder that sees Redis restarted, reads
    ``ldp.estimates`` from where the store last read it (:meth:`Estimator._rebuild_from_topic`) and records the
    finals the store lost (an AOF cut short, a store emptied) before it publishes anything.

When a step is final (stream progress, not the clock alone)
    * its watermark was applied (``closed``: the producer promised no more reports for the step; all batches of
      a step share the key ``"{t}:{attr}"`` and hence one partition, so every report sent before the watermark
      is already counted), trigger ``"watermark"``; or
    * its grace is over and the store holds everything the broker had then, trigger ``"lateness"``. The grace:
      for a *logical* step (a fleet's 0, 1, 2, ...), ``lateness_seconds`` after stream time passed it (the first
      tick that saw a later step's reports counted), later if its own reports keep arriving; for a *wall-clock*
      step (counted from the HTTP ingest, ``t = floor(now / time_step_seconds)``), ``lateness_seconds`` after its
      window (:func:`due_at`). Then the step's *barrier*: the end offsets of every partition of ``ldp.reports``
      when it first became due; it is final once the consumer positions recorded in the store
      (``CountStore.positions``) are past them, as Kafka Streams' stream time and grace period work. So while
      Redis or the broker is away, or partitions are unassigned or lagging, nothing that may still receive
      counted data becomes final; a logical step that stream time never passes (the last step of a producer
      that died for good) stays open.

    A final carries ``complete: false`` (and why, in ``incomplete``) when the broker may have lost some of its
    reports: its watermark states more reports than were counted, or an unrepairable broker loss
    (``stream_app.app``) marked the step while it was open. A step that is due with ``n == 0`` (a watermark
    without reports, or a step in the index whose counts are gone) gets no final: it is *settled* silently, and
    its first batch after that publishes its first final (trigger ``"late"``).

Late data
    Reports counted after a step's final (the agent counts every batch of a step within
    retention) produce a *revised* final, ``revision`` + 1, trigger ``"late"``, within a tick,
    for any final step within retention: the agent marks each applied batch's step in the
    attribute's *touched* set (``store.mark_touched``), and every tick the estimator reads the
    marks, compares the ``n`` of each marked final step with its final's, and removes the marks
    it handled (a mark incremented meanwhile stays for the next tick, so a leader that dies
    mid-tick loses none). A mark lost anyway (a worker killed between counting a batch and
    marking it) is caught by the *audit*: every tick also re-reads the ``n`` of ``audit_steps``
    final steps, round robin over all the retained ones.

    A revision is published only if ``n`` grew. If the store's ``n`` of a final step is *below*
    the final's (Redis lost data), nothing is published: the step gets an alarm in
    :attr:`Estimator.alarms` (for ``GET /status``), an error in the log and
    ``ldp_count_regressions_total`` once per step, and revisions resume only when ``n`` exceeds
    the published final again (a replay restored the counts, then late data came). So no final
    is ever published with ``n == 0`` or with an ``n`` below an earlier final's of the step.

Retention (``Campaign.retention_steps``, R; an attribute's own ``retention_steps`` for it)
    Each tick the leader sets the attribute's floor to ``min(F, first open step)``, ``F`` the R-th
    newest final (or settled) step, once there are R: the R most recent final steps are kept, the
    floor never passes a step without a final and never goes down. It counts final steps, not step
    numbers, so a gap in the steps, a wall-clock step next to logical ones (0, 1, 2, ...) or a
    device's far-future ``t`` deletes nothing early. The floor is kept in Redis
    (``store.raise_retention_floor``) so every worker can refuse batches for expired steps; the
    leader prunes at most ``prune_batch`` steps below it (``store.prune_steps``: count hash,
    index, history, finals index, watermark time, touched mark). Steps below the floor are never
    published, even if a batch recreated one (a worker that counted it before seeing the floor):
    the pruner deletes it again.

Open steps get a non-final estimate on every tick in which their ``n`` changed. The loop ticks
every ``refresh_seconds`` and at once when a worker applied a watermark (Redis pub/sub wake-up
channel), so a final estimate follows its watermark within milliseconds on the lease holder.

Privacy figures "so far" (server side)
    The server cannot see a device's memo, only how many time steps an attribute has had. A device
    sends at most one report per attribute and step, so after ``S`` steps (the number of steps
    ``<= t`` in the attribute's step index, plus the steps pruned below the retention floor) it
    memoized at most ``min(S, memo_size)`` distinct values:
    ``eps_longitudinal_worst = proto.longitudinal_bound(S)`` (``min(S, memo_size) * eps_inf`` for L-GRR and
    the L-UE chains; ``eps_1`` then ``S * eps_IRR`` for LOLOHA and ``eps_inf`` then ``inf`` for dBitFlipPM
    unless ``b = k``, ``d >= b - 1``, against a server that reads the public seeds, docs/privacy.md; ``eps_1`` then
    ``inf`` for single-shot protocols). ``eps_longitudinal_bound`` is the protocol's bound over an unbounded
    stream (``proto.worst_case_loss``). Infinite values are ``null`` in JSON and ``+Inf`` in Prometheus.
"""
from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import logging
import math
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

import numpy as np

from estimators.numeric.protocol import QUANTILES
from estimators.sketch.base import Z95
from estimators.poisoning import detection_score, detection_threshold
from wire.campaign import Attribute, Campaign
from wire.estimates import SCHEMA_VERSION, STATUS_INSUFFICIENT, STATUS_OK
from wire.topics import REPORTS_TOPIC

from .defense import StepEstimate, defenses_of
from .metrics import Metrics
from .store import CLAIM_EXISTS, CLAIM_STALE, CountStore, StepState, WakeUps

__all__ = ["Estimator", "StreamView", "build_estimate", "due_at"]

#: ``revision`` of a settled step: due with ``n == 0``, no final published (see the module doc).
SETTLED = -1

log = logging.getLogger(__name__)
Publish = Callable[[dict[str, Any]], Awaitable[None]]


class StreamView(Protocol):
    """What the estimator reads from the broker (``stream_app.broker.TopicReader``)."""

    async def report_ends(self) -> dict[int, int]:
        """``partition -> log end offset`` of ``ldp.reports``."""

    async def estimate_ends(self) -> dict[int, int]:
        """``partition -> log end offset`` of ``ldp.estimates``."""

    async def published_finals(self, since: dict[int, int]) -> tuple[list[dict[str, Any]], dict[int, int]]:
        """The finals on ``ldp.estimates`` from ``since`` to the end, and the end offsets."""


class _Fenced(Exception):
    """A lease holder with a newer fencing token claimed a final: this one lost the lease."""


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None else _finite(x)


#: |z| of ``poisoning_score`` above which a step is flagged (two-sided, 1e-6 of honest steps)
POISONING_THRESHOLD = detection_threshold()


def counted_n(doc: dict[str, Any]) -> int:
    """The reports the worker had counted for an estimate's step (``n_counted``; ``n`` in documents without it):
    what later counts of the step are compared with. An attribute's poisoning defense may estimate over fewer
    (``n``) when the final detection drops some."""
    return int(doc.get("n_counted", doc["n"]))


def due_at(campaign: Campaign, t: int, state: StepState) -> float:
    """Wall-clock time at which a step without watermark becomes final (see module doc)."""
    last = state.get("last_ts") or 0.0
    return max((t + 1) * campaign.time_step_seconds, last) + campaign.lateness_seconds


def build_estimate(campaign: Campaign, attr: Attribute, t: int, state: StepState, steps_so_far: int, *,
                   final: bool, trigger: str | None, now: float, closed_ts: float | None = None,
                   revision: int = 0, worker: str = "", fence: int = 0,
                   defended: StepEstimate | None = None) -> dict[str, Any]:
    """The JSON document of one estimate (published on ``ldp.estimates``; schema ``wire/schemas/estimate.v1``,
    fields in ``docs/estimates.md``).

    A step of fewer than the campaign's ``min_n`` reports gets ``status = "insufficient"`` and no frequencies,
    variance or confidence interval (final or not): its counts are still kept, and late data that bring ``n`` to
    ``min_n`` publish a revision with them.

    ``defended``: the step's estimate under the attribute's poisoning defense (:mod:`stream_app.defense`), whose
    ``n`` and ``n_rejected`` it publishes; without it, the protocol's estimate over every counted report.

    ``complete`` is false when the broker may have lost some of the step's reports before they were counted
    (``incomplete``: why); ``fence``: the fencing token of the lease holder that published it; ``clock``:
    ``"wall"`` for a wall-clock step of the HTTP ingest, ``"logical"`` for a fleet's numbered step."""
    proto = attr.protocol
    numeric: dict[str, Any] = {}
    open_domain: dict[str, Any] = {}
    counted = int(state["n"])
    n, rejected = counted, int(state.get("rejected") or 0)
    if defended is not None:
        n, rejected = defended.n, defended.rejected
    enough = n >= campaign.min_n  # min_n >= 1: never an estimate over no report
    freq = freq_ns = var = half = None
    if enough and defended is not None:
        freq, freq_ns = defended.frequencies.tolist(), defended.frequencies_norm_sub.tolist()
        var = _finite(defended.variance)
        half = 1.96 * math.sqrt(var) if var is not None else None
    elif enough and attr.numeric:
        numeric = numeric_fields(campaign, attr, t, state["counts"], n, final=final)
        var, half = numeric["mean_variance"], numeric["mean_ci95_halfwidth"]
    elif enough and attr.open_domain:
        open_domain = open_fields(attr, state["counts"], n)
        var = float(proto.variance(n))
        half = 1.96 * math.sqrt(var)
    elif enough:
        counts = state["counts"]
        freq = proto.estimate(counts, n).tolist()
        freq_ns = proto.estimate(counts, n, postprocess="norm-sub").tolist()
        var = float(proto.variance(n))
        half = 1.96 * math.sqrt(var)
    last_input = max(x for x in (state.get("last_ts"), closed_ts, 0.0) if x is not None)
    expected = int(state.get("expected") or 0)
    received = counted + int(state.get("rejected") or 0)
    incomplete = state.get("incomplete") or (
        f"{received} of the {expected} reports its producer sent were received: the broker lost the others before "
        f"they were counted" if expected > received else None)
    return {
        "schema_version": SCHEMA_VERSION,
        "campaign": campaign.id, "attribute": attr.name, "protocol": proto.name,
        "fingerprint": proto.fingerprint, "t": int(t), "final": bool(final), "trigger": trigger,
        "revision": int(revision), "status": STATUS_OK if enough else STATUS_INSUFFICIENT, "min_n": campaign.min_n,
        "n": n, "n_counted": counted,
        # reports of the step its poisoning defense left out (n + n_rejected = the valid reports received)
        "n_rejected": rejected, "defense": attr.defense,
        "frequencies": freq, "frequencies_norm_sub": freq_ns,
        "variance": var, "ci95_halfwidth": half,
        "eps_1": _finite(proto.eps_first), "eps_inf": _finite(proto.eps_inf),
        "eps_longitudinal_worst": _finite(float(proto.longitudinal_bound(max(int(steps_so_far), 1)))),
        "eps_longitudinal_bound": _finite(float(proto.worst_case_loss)),
        "steps_so_far": int(steps_so_far),
        # per-step poisoning statistic from the counts alone (estimators.poisoning.detection_score; null where
        # it has no exact law): z of the total support, |z| > poisoning_threshold flags the step
        "poisoning_score": _finite_or_none(detection_score(proto, state["counts"], counted)
                                           if counted > 0 and defended is None else None),
        "poisoning_threshold": POISONING_THRESHOLD,
        "labels": list(attr.labels) if attr.labels else None,
        "first_ts": state.get("first_ts"), "last_ts": state.get("last_ts"), "closed_ts": closed_ts,
        "updated_at": now,
        "latency_seconds": (now - last_input) if last_input else None,
        "worker": worker, "fence": int(fence),
        "clock": "wall" if state.get("wall") else "logical",
        "complete": incomplete is None, "incomplete": incomplete, "expected_n": expected or None,
        **_numeric_doc(attr, numeric),
        **_open_doc(attr, open_domain),
    }


def _numeric_doc(attr: Attribute, numeric: dict[str, Any]) -> dict[str, Any]:
    """The numeric fields of an estimate (``docs/estimates.md``, "Numeric attributes"): null for a categorical
    attribute, and for a numeric one whose step is insufficient."""
    empty = {"mean": None, "mean_variance": None, "mean_ci95_halfwidth": None, "mean_ci95": None,
             "distribution": None, "quantiles": None}
    if attr.open_domain:
        return {"kind": attr.value_type, "range": None, **empty}
    if not attr.numeric:
        return {"kind": "categorical", "range": None, **empty}
    return {"kind": "numeric", "range": [attr.protocol.lo, attr.protocol.hi], **empty, **numeric}


def _open_doc(attr: Attribute, fields: dict[str, Any]) -> dict[str, Any]:
    """The open-domain fields of an estimate (``docs/estimates.md``, "Open-domain attributes"): null for other
    attributes, and for an open-domain one whose step is insufficient."""
    return {"top_k": fields.get("top_k"), "candidates": fields.get("candidates")}


def _value_text(attr: Attribute, value: str | int) -> str:
    """A candidate as the estimates write it: the string, or a ``u64``'s decimal digits (exact in JSON readers
    whose numbers are doubles)."""
    return value if isinstance(value, str) else str(int(value))


def open_fields(attr: Attribute, counts: Any, n: int) -> dict[str, Any]:
    """An open-domain attribute's step: its top-``top`` items, each with its id (16 hex digits: the item's smallest
    id), the candidate that names it (or null), its frequency and 95% interval; and the frequency of every
    candidate of the campaign with its 95% interval."""
    proto = attr.protocol
    names = attr.candidate_names()
    ids = attr.candidate_ids()
    top = proto.top_k(counts, n, attr.top, candidates=None if proto.finds_items or not ids.size else ids)
    top_k = [{"item": f"{int(i):016x}", "value": _value_text(attr, names[int(i)]) if int(i) in names else None,
              "frequency": float(f), "ci95": [float(lo), float(hi)]}
             for i, f, lo, hi in zip(top.items, top.freq, top.lo, top.hi)]
    cands = None
    if ids.size:
        f = np.asarray(proto.estimate(counts, n, ids), dtype=np.float64)
        half = Z95 * np.sqrt(np.asarray(proto.variance_exact(np.clip(f, 0.0, 1.0), n), dtype=np.float64))
        cands = [{"value": _value_text(attr, c), "frequency": float(x), "ci95": [float(x - h), float(x + h)]}
                 for c, x, h in zip(attr.candidates, f, half)]
    return {"top_k": top_k, "candidates": cands}


def numeric_fields(campaign: Campaign, attr: Attribute, t: int, counts: Any, n: int, *, final: bool) -> dict[str, Any]:
    """The mean with its variance and 95% interval and, for Square Wave, the distribution over its grid and the
    quantiles p50, p90, p99 (with bootstrap intervals on a final; a provisional estimate has the point values
    only: the bootstrap costs ``B`` EMS runs). The bootstrap is seeded by the step (server-side resampling, not
    device randomness), so every revision of the same counts publishes the same intervals."""
    proto = attr.protocol
    seed = [zlib.crc32(f"{campaign.id}/{attr.name}".encode()), int(t)]
    est = proto.estimate_step(counts, n, rng=np.random.default_rng(seed)) if final and proto.is_distribution \
        else None
    mean = est.mean if est is not None else proto.estimate_mean(counts, n)
    half = _finite(mean.ci95_halfwidth)
    out: dict[str, Any] = {
        "mean": mean.mean, "mean_variance": _finite(mean.variance), "mean_ci95_halfwidth": half,
        "mean_ci95": [mean.mean - half, mean.mean + half] if half is not None else None}
    if proto.is_distribution:
        sw = proto.mechanism
        dist = est.distribution if est is not None else proto.estimate(counts, n)
        out["distribution"] = {"grid": sw.grid().tolist(), "probabilities": dist.tolist()}
        if est is not None:
            qs = est.quantiles
        else:
            point = sw.quantiles(dist, QUANTILES)
            qs = {q: (float(v), None, None) for q, v in zip(QUANTILES, point)}
        out["quantiles"] = {f"p{round(q * 100)}": {"value": v, "lower": lo, "upper": hi}
                            for q, (v, lo, hi) in qs.items()}
    return out


@dataclass
class _AttrState:
    finalized: dict[int, tuple[int, int]] = field(default_factory=dict)  # t -> (n at final, revision or SETTLED)
    order: list[int] = field(default_factory=list)  # the keys of `finalized`, ascending
    published: dict[int, tuple[int, bool]] = field(default_factory=dict)  # open t -> (n, closed) last sent
    low: int = 0  # every step below is final
    below: int = -1  # number of steps below `low` when it was last set (-1: unknown)
    latest_t: int = -1
    floor: int = 0  # the retention floor: steps below are expired (mirrors store.retention_floor)
    pruned: int = 0  # steps pruned from the step index (mirrors store.pruned_steps)
    audit_next: int = 0  # the audit resumes at the first final step >= this
    passed: dict[int, float] = field(default_factory=dict)  # open logical t -> when stream time was seen past it
    barrier: dict[int, dict[int, int]] = field(default_factory=dict)  # due t -> the reports' end offsets then


class Estimator:
    """Periodic estimator over all campaigns; run :meth:`run` as a task, or call :meth:`tick`.

    Per attribute and tick: at most ``touched_batch`` touched marks are read, ``audit_steps`` final
    steps re-read and ``prune_batch`` steps pruned (module doc)."""

    def __init__(self, campaigns: dict[str, Campaign], store: CountStore, metrics: Metrics, publish: Publish, *,
                 app_id: str, worker_id: str | None = None, refresh_seconds: float = 1.0,
                 lease_ttl: float | None = None, min_tick_interval: float = 0.02, rescan_ticks: int = 300,
                 touched_batch: int = 4096, audit_steps: int = 64, prune_batch: int = 256,
                 max_alarms: int = 1000, stream: StreamView | None = None, reports_topic: str = REPORTS_TOPIC,
                 checkpoint_ticks: int = 30) -> None:
        if refresh_seconds <= 0:
            raise ValueError("refresh_seconds must be positive")
        if touched_batch < 1 or prune_batch < 1 or audit_steps < 0 or max_alarms < 1:
            raise ValueError("touched_batch, prune_batch and max_alarms must be >= 1 and audit_steps >= 0")
        self.campaigns = campaigns
        self.defenses = defenses_of(campaigns)
        self.store = store
        self.metrics = metrics
        self.publish = publish
        self.app_id = app_id
        self.worker_id = worker_id or f"{uuid.uuid4().hex[:12]}"
        self.refresh_seconds = refresh_seconds
        self.lease_ttl = lease_ttl if lease_ttl is not None else max(2.0, 3.0 * refresh_seconds)
        self.min_tick_interval = min_tick_interval
        self.rescan_ticks = rescan_ticks
        self.touched_batch = touched_batch  # marks read per attribute and tick
        self.audit_steps = audit_steps  # final steps whose n is re-read per attribute and tick
        self.prune_batch = prune_batch  # steps pruned per attribute and tick at most
        self.max_alarms = max_alarms
        self.stream = stream  # None: no broker to compare with (tools and tests driving a store alone)
        self.reports_topic = reports_topic
        self.checkpoint_ticks = checkpoint_ticks
        self.is_leader = False
        self.fence = 0  # the fencing token of this holder's lease (0: not the holder)
        self._loaded_fence = 0  # the token under which the state was last loaded
        self._server: str | None = None  # the Redis server the state was loaded from (its run id)
        self._stream_high: dict[str, int] = {}  # campaign -> highest logical step with counted reports seen
        self._progress: tuple[dict[int, int], dict[int, int]] | None = None  # this tick's (positions, report ends)
        self._progress_warned = 0.0
        self._pending_seen = False
        self.ticks = 0
        #: Problems for ``GET /status``: name -> {component, since, error, ...}; a count regression is
        #: ``"count_regression:<campaign>/<attribute>/<t>"`` with campaign, attribute, t, final_n, store_n,
        #: revision and, once the store's n is back at the final's, recovered_at.
        self.alarms: dict[str, dict[str, Any]] = {}
        self._top_series: dict[tuple[str, str], set[tuple[str, str, str]]] = {}  # exported top-K series
        self._state: dict[tuple[str, str], _AttrState] = {}
        self._stopping = asyncio.Event()

    @property
    def redis(self) -> Any:
        """The store's Redis client (tests wrap its commands to inject races)."""
        return self.store.redis

    # ------------------------------------------------------------------ lease
    async def _hold_lease(self) -> bool:
        token = await self.store.claim_lease(self.app_id, self.worker_id, self.lease_ttl)
        self.is_leader = bool(token)
        self.metrics.estimator_leader.set(1 if token else 0)
        if not token:
            if self._loaded_fence:
                log.warning("estimator lease lost by %s", self.worker_id)
                self._lose_state()
            return False
        if token != self._loaded_fence:  # a new acquisition (or a retry of a load that failed)
            log.info("estimator lease acquired by %s (fencing token %s)", self.worker_id, token)
            self.fence = token
            await self._load_state()
            self._loaded_fence = token
        return True

    def _lose_state(self) -> None:
        self.is_leader = False
        self.fence = self._loaded_fence = 0
        self.metrics.estimator_leader.set(0)
        self._drop_state()

    async def release(self) -> None:
        """Give the lease up (clean shutdown) so another worker takes over at once."""
        try:
            await self.store.release_lease(self.app_id, self.worker_id)
        finally:
            self.is_leader = False
            self.fence = self._loaded_fence = 0
            self.metrics.estimator_leader.set(0)

    async def _load_state(self) -> None:
        """What a new lease holder does before it publishes anything: refuse older holders' claims (the campaigns'
        fences), rebuild the finals the store lost from ``ldp.estimates``, then load the finals index."""
        self._state = {}
        store = self.store
        server = await store.server_id()  # recorded once the load succeeded: a failed one is done again
        for c in self.campaigns.values():
            await store.raise_fence(c.id, self.app_id, self.fence)
        await self._rebuild_from_topic()
        for c in self.campaigns.values():
            newest = await store.newest_final(c.id)
            self._stream_high[c.id] = newest if newest is not None else -1
            for a in c.attributes.values():
                st = _AttrState()
                st.floor = await store.retention_floor(c.id, a.name)
                st.pruned = await store.pruned_steps(c.id, a.name)
                finals = await store.final_index(c.id, a.name)
                missing = [t for t in await store.final_steps(c.id, a.name) if t not in finals]
                for i in range(0, len(missing), 512):  # a history recorded before the finals index existed
                    chunk = missing[i:i + 512]
                    found = {t: (counted_n(doc), int(doc.get("revision", 0)))
                             for t, doc in zip(chunk, await store.final_estimates(c.id, a.name, chunk)) if doc}
                    await store.index_finals(c.id, a.name, found)
                    finals.update(found)
                st.finalized = finals  # those below the floor too: _retain prunes what is left of them
                st.order = sorted(st.finalized)
                latest = await store.latest_estimate(c.id, a.name)
                if latest:
                    st.latest_t = int(latest.get("t", -1))
                self._state[(c.id, a.name)] = st
                self.metrics.retention_floor.labels(c.id, a.name).set(st.floor)
        self._server = server

    async def _rebuild_from_topic(self) -> None:
        """Record in the store every final on ``ldp.estimates`` it does not know (it lost them: an AOF that lost
        its tail, a store emptied), from where the store last read the topic; clear the pending marks of the
        finals found there (they were published)."""
        if self.stream is None:
            return
        since = await self.store.estimates_read(self.app_id)
        docs, ends = await self.stream.published_finals(since)
        restored = 0
        for doc in docs:
            c = self.campaigns.get(doc.get("campaign"))
            a = c.attributes.get(doc.get("attribute")) if c is not None else None
            if a is None or not isinstance(doc.get("t"), int) or not isinstance(doc.get("n"), int):
                continue
            restored += await self.store.restore_final(c.id, a.name, doc, self.app_id)
        await self.store.set_estimates_read(self.app_id, ends)
        if restored:
            log.warning("rebuilt %d finals from the estimates topic that the store did not hold (it lost data)",
                        restored)

    def _drop_state(self) -> None:
        self._state = {}
        self._stream_high = {}
        for g in (self.metrics.estimated_frequency, self.metrics.step_reports, self.metrics.latest_step,
                  self.metrics.eps_first, self.metrics.eps_inf, self.metrics.eps_longitudinal_worst,
                  self.metrics.retention_floor, self.metrics.poisoning_score, self.metrics.estimated_mean,
                  self.metrics.estimated_mean_ci95, self.metrics.estimated_quantile):
            g.clear()

    # ------------------------------------------------------------------ loop
    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        """Tick every ``refresh_seconds`` and on wake-ups until :meth:`stop`."""
        wakeups: WakeUps | None = None
        try:
            wakeups = await self.store.subscribe_wakeups(self.app_id)
        except Exception as exc:  # noqa: BLE001 - wake-ups are an optimisation
            log.warning("estimator wake-up channel unavailable (%s); polling only", exc)
            wakeups = None
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - keep estimating; Redis/Kafka may come back
                    log.exception("estimator tick failed")
                await asyncio.sleep(self.min_tick_interval)
                await self._wait(wakeups, self.refresh_seconds - (time.monotonic() - started))
        finally:
            if wakeups is not None:
                try:
                    await wakeups.close()
                except Exception:  # noqa: BLE001
                    pass
            try:
                await self.release()
            except Exception:  # noqa: BLE001
                pass

    async def _wait(self, wakeups: WakeUps | None, timeout: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if wakeups is None:
                await asyncio.sleep(min(left, 0.1))
                continue
            try:
                woken = await wakeups.wait(min(left, 0.25))
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                await asyncio.sleep(min(left, 0.1))
                continue
            if woken:
                return

    # ------------------------------------------------------------------ one tick
    async def tick(self, now: float | None = None) -> list[dict[str, Any]]:
        """One pass over all attributes; returns the documents published."""
        self.ticks += 1
        if not await self._hold_lease():
            return []
        server = await self.store.server_id()
        if server != self._server:  # Redis restarted under this holder: it may have lost finals
            log.warning("Redis restarted (server %s, was %s): rebuilding the finals from the estimates topic before "
                        "publishing", server, self._server)
            await self._load_state()
        self._progress = None
        self._pending_seen = False
        out: list[dict[str, Any]] = []
        try:
            for c in self.campaigns.values():
                for a in c.attributes.values():
                    await self._republish_pending(c, a)
                    out.extend(await self._tick_attribute(c, a, now))
            if self.stream is not None and self.ticks % self.checkpoint_ticks == 0 and not self._pending_seen:
                await self.store.set_estimates_read(self.app_id, await self.stream.estimate_ends())
        except _Fenced as exc:
            log.warning("estimator lease of %s is stale (%s): it stops publishing", self.worker_id, exc)
            self._lose_state()
        return out

    async def _republish_pending(self, c: Campaign, a: Attribute) -> None:
        """Publish again, unchanged, the claimed finals whose publication was not confirmed (a holder that
        failed or died between claiming and the broker's acknowledgement): same key, same document. Those the
        estimates topic holds already (the broker stored it, its answer was lost) are only confirmed."""
        pending = await self.store.pending_finals(c.id, a.name)
        if not pending:
            return
        self._pending_seen = True
        if self.stream is not None:
            await self._rebuild_from_topic()  # clears the marks of the finals found on the topic
            pending = await self.store.pending_finals(c.id, a.name)
        ts = sorted(pending)
        for t, doc in zip(ts, await self.store.final_estimates(c.id, a.name, ts)):
            if doc is not None and int(doc.get("revision", 0)) == pending[t]:
                log.info("%s/%s step %s: publishing revision %s again (claimed, its publication unconfirmed)", c.id,
                         a.name, t, pending[t])
                await self.publish(doc)
            await self.store.confirm_final(c.id, a.name, t, pending[t])

    async def _tick_attribute(self, c: Campaign, a: Attribute, now: float | None) -> list[dict[str, Any]]:
        st = self._state.setdefault((c.id, a.name), _AttrState())
        size = a.protocol.support_size
        store = self.store
        # steps below `low` are final, unless one appeared there since (a device reporting an old t
        # for the first time, or a step whose first batch landed after later steps'): the count of
        # steps below `low` tells, plus a full rescan now and then. It is read BEFORE the candidates,
        # so a step added in between is seen either as a candidate or as a count change next tick.
        below = await store.count_steps_below(c.id, a.name, st.low)
        cand = set(await store.steps_from(c.id, a.name, st.low))
        if below != st.below or self.ticks % self.rescan_ticks == 0:
            unknown = [t for t in await store.steps_below(c.id, a.name, st.low) if t not in st.finalized]
            if unknown:
                done = set(await store.final_steps(c.id, a.name))
                cand.update(t for t in unknown if t not in done)
            st.below = below
        seen = cand
        cand = {t for t in seen if t >= st.floor}  # below the floor: expired, never published (pruned below)
        open_ts = [t for t in cand if t not in st.finalized]
        marks = await store.touched(c.id, a.name, self.touched_batch)
        late = await self._late_steps(c, a, st, marks)
        todo = sorted(set(open_ts) | set(late))
        docs: list[dict[str, Any]] = []
        if todo:
            states = await store.read_steps(c.id, a.name, todo, size)  # one pipeline: no connection per step
            closed = await store.closed_times(c.id, a.name, todo)
            t_now = time.time() if now is None else now
            high = self._stream_high.get(c.id, -1)
            for t, s in zip(todo, states):
                if s["n"] > 0 and not s["wall"] and t > high:
                    high = self._stream_high[c.id] = t
            for t, s, cts in zip(todo, states, closed):
                if t in st.finalized:  # late data after a final estimate: publish a revision
                    final_n, revision = st.finalized[t]
                    if s["n"] <= final_n:  # not grown after all (read again since the check)
                        continue
                    final, trigger, revision = True, "late", revision + 1
                elif s["closed"] or (self._grace_over(c, st, t, s, t_now) and await self._caught_up(st, t)):
                    if s["n"] == 0:  # never a final with n == 0
                        log.info("step %s of %s/%s is due with no report counted: no final estimate", t, c.id,
                                 a.name)
                        self._set_final(st, t, 0, SETTLED)
                        continue
                    final, trigger, revision = True, "watermark" if s["closed"] else "lateness", 0
                else:
                    final, trigger, revision = False, None, 0
                    if s["n"] == 0 or st.published.get(t) == (s["n"], s["closed"]):  # nothing (new) to estimate
                        continue
                steps_so_far = st.pruned + await store.count_steps_through(c.id, a.name, t)
                defended = await self._defended(c, a, t, s, final)
                build = functools.partial(
                    build_estimate, c, a, t, s, steps_so_far, final=final, trigger=trigger,
                    now=time.time() if now is None else now, closed_ts=cts, revision=revision,
                    worker=self.worker_id, fence=self.fence, defended=defended)
                # a numeric distribution's final bootstraps its quantile intervals (tens of ms): off the event loop
                doc = await asyncio.to_thread(build) if final and a.numeric and a.protocol.is_distribution \
                    else build()
                if await self._emit(c, a, st, doc):
                    docs.append(doc)
                    if final and revision == 0 and defended is not None and defended.rejected > s["rejected"]:
                        self.metrics.rejected_reports_total.labels(c.id, a.name, "itemset").inc(
                            defended.rejected - s["rejected"])
        await store.clear_touched(c.id, a.name, marks)  # after the revisions were recorded
        # every step below the first open one is final: the next scan starts there
        rest = [t for t in cand if t not in st.finalized]
        low = min(rest) if rest else (max(cand) + 1 if cand else st.low)
        if low != st.low:
            # count only what this tick saw (all final): a step that appeared below the new `low`
            # meanwhile makes next tick's count differ and is rescanned, never skipped
            st.below += sum(1 for t in seen if st.low <= t < low)
            st.low = low
        await self._retain(c, a, st)
        return docs

    async def _late_steps(self, c: Campaign, a: Attribute, st: _AttrState, marks: dict[int, float]) -> list[int]:
        """The final steps whose ``n`` grew past their final's: the touched ones and this tick's audit slice.

        A step whose ``n`` fell below its final's raises a count-regression alarm instead (module doc)."""
        check = {t for t in marks if t >= st.floor and t in st.finalized}
        check.update(self._audit_slice(st))
        if not check:
            return []
        ts = sorted(check)
        late: list[int] = []
        for t, n in zip(ts, await self.store.reports_counted(c.id, a.name, ts)):
            final_n, revision = st.finalized[t]
            if n < final_n:
                self._count_regression(c, a, t, final_n, n, revision)
                continue
            alarm = self.alarms.get(_regression_name(c, a, t))
            if alarm is not None and "recovered_at" not in alarm:
                alarm["recovered_at"], alarm["store_n"] = time.time(), n
                log.warning("%s/%s step %s: the store's n is back at %s (the final's: %s)", c.id, a.name, t, n,
                            final_n)
            if n > final_n:
                late.append(t)
        return late

    def _audit_slice(self, st: _AttrState) -> list[int]:
        """The next ``audit_steps`` final steps within retention, round robin (all of them, if fewer)."""
        order = st.order
        if not order or self.audit_steps == 0:
            return []
        first = bisect.bisect_left(order, st.floor)
        i = max(first, bisect.bisect_left(order, st.audit_next))
        out = order[i:i + self.audit_steps]
        if len(out) < self.audit_steps:  # wrap around, up to where this slice began
            out += order[first:min(i, first + self.audit_steps - len(out))]
        st.audit_next = out[-1] + 1 if out else 0
        return out

    def _count_regression(self, c: Campaign, a: Attribute, t: int, final_n: int, n: int, revision: int) -> None:
        """The store's ``n`` of a final step is below the final's: alarm, log and count it once per step."""
        name = _regression_name(c, a, t)
        alarm = self.alarms.get(name)
        if alarm is not None:
            alarm["store_n"] = n
            alarm.pop("recovered_at", None)
            return
        self.alarms[name] = {
            "component": "estimator", "since": time.time(),
            "error": (f"{c.id}/{a.name} step {t}: Redis counts n={n} reports, below the {final_n} of its published "
                      f"final (revision {revision}): Redis lost data; no revision is published while n is lower"),
            "campaign": c.id, "attribute": a.name, "t": t, "final_n": final_n, "store_n": n, "revision": revision}
        while len(self.alarms) > self.max_alarms:
            del self.alarms[next(iter(self.alarms))]
        self.metrics.count_regressions.labels(c.id, a.name).inc()
        log.error("count regression: %s", self.alarms[name]["error"])

    async def _retain(self, c: Campaign, a: Attribute, st: _AttrState) -> None:
        """Raise the retention floor and prune a bounded batch of steps below it (module doc)."""
        keep = c.retention_of(a)
        target = st.floor
        if len(st.order) >= keep:
            target = max(target, min(st.order[-keep], st.low))
        if target <= 0:
            return
        # every tick, not only when it moves: a Redis that lost the key gets it back at once
        st.floor = await self.store.raise_retention_floor(c.id, a.name, target)
        self.metrics.retention_floor.labels(c.id, a.name).set(st.floor)
        ts = set(await self.store.steps_before(c.id, a.name, st.floor, self.prune_batch))
        ts.update(st.order[:min(self.prune_batch, bisect.bisect_left(st.order, st.floor))])
        batch = sorted(ts)[:self.prune_batch]
        if not batch:
            return
        removed, st.pruned = await self.store.prune_steps(c.id, a.name, batch)
        if st.below >= 0:
            st.below -= removed  # all were below `low` (the floor never passes it)
        for t in batch:
            st.finalized.pop(t, None)
            st.published.pop(t, None)
            st.passed.pop(t, None)
            st.barrier.pop(t, None)
        del st.order[:bisect.bisect_right(st.order, batch[-1])]
        self.metrics.steps_pruned.labels(c.id, a.name).inc(len(batch))
        log.debug("pruned %d steps of %s/%s below the retention floor %d", len(batch), c.id, a.name, st.floor)

    def _set_final(self, st: _AttrState, t: int, n: int, revision: int) -> None:
        if t not in st.finalized:
            bisect.insort(st.order, t)
        st.finalized[t] = (n, revision)
        st.published.pop(t, None)
        st.passed.pop(t, None)
        st.barrier.pop(t, None)

    async def _emit(self, c: Campaign, a: Attribute, st: _AttrState, doc: dict[str, Any]) -> bool:
        """Publish an estimate; a final is first claimed with this holder's fencing token (one script: exactly
        one document per revision of a step, and none from a holder that lost the lease), then published, then
        confirmed. Returns whether it was published."""
        t = doc["t"]
        if doc["final"]:
            status, held = await self.store.claim_final(c.id, a.name, doc, self.fence, self.app_id)
            if status == CLAIM_STALE:
                raise _Fenced(f"the campaign's fence is at token {held}, this holder's is {self.fence}")
            if status == CLAIM_EXISTS:  # claimed before this holder knew (a rebuilt or concurrent claim)
                n, _, revision = held.partition(":")
                log.info("%s/%s step %s: revision %s is claimed already (%s); not published again", c.id, a.name, t,
                         doc["revision"], held)
                self._set_final(st, t, int(n), int(revision))
                return False
            self._set_final(st, t, counted_n(doc), doc["revision"])
            # A holder paused between its claim and its send (SIGSTOP, a long GC or swap) may have lost the lease
            # meanwhile: the new holder then publishes the pending claim itself, and this one must not send it too.
            if not await self.store.fence_holds(c.id, self.app_id, self.fence):
                raise _Fenced(f"the campaign's fence passed token {self.fence} after its claim of {a.name} t={t}")
            await self.publish(doc)
            await self.store.confirm_final(c.id, a.name, t, doc["revision"])
            if doc["latency_seconds"] is not None and doc["revision"] == 0:
                self.metrics.estimate_latency.labels(doc["trigger"]).observe(doc["latency_seconds"])
            if not doc["complete"]:
                self.metrics.incomplete_finals.labels(c.id, a.name).inc()
                log.error("%s/%s step %s: final revision %s published incomplete (n=%s): %s", c.id, a.name, t,
                          doc["revision"], doc["n"], doc["incomplete"])
        else:
            await self.publish(doc)
            st.published[t] = (counted_n(doc), False)
        self.metrics.estimates_published.labels("true" if doc["final"] else "false").inc()
        if t >= st.latest_t and (doc["n"] > 0 or st.latest_t < 0):
            st.latest_t = t
            await self.store.set_latest_estimate(c.id, a.name, doc)
            self._export(c, a, doc)
        return True

    async def _defended(self, c: Campaign, a: Attribute, t: int, s: StepState, final: bool) -> StepEstimate | None:
        """The step's estimate under the attribute's poisoning defense (None without one); a final of an
        ``itemset`` defense runs the detection over the step's report log."""
        defense = self.defenses.get((c.id, a.name))
        if defense is None or s["n"] == 0:
            return None
        log = await self.store.step_reports(c.id, a.name, t) if final and defense.keeps_log else None
        return defense.estimate(s["counts"], s["n"], s["rejected"], log)

    # ------------------------------------------------------------------ when a step is due
    def _grace_over(self, c: Campaign, st: _AttrState, t: int, s: StepState, now: float) -> bool:
        """Whether a step without a watermark is past its grace: a wall-clock step ``lateness_seconds`` after its
        window (:func:`due_at`); a logical step ``lateness_seconds`` after stream time passed it (a later step's
        reports were counted), later if its own reports keep arriving. Never by the clock alone."""
        if s["wall"]:
            return now >= due_at(c, t, s)
        passed = st.passed.get(t)
        if passed is None:
            if self._stream_high.get(c.id, -1) <= t:
                return False
            passed = st.passed[t] = now
        return now >= max(passed, s.get("last_ts") or 0.0) + c.lateness_seconds

    async def _caught_up(self, st: _AttrState, t: int) -> bool:
        """Whether the count store holds everything the broker had for step ``t`` when it became due: the
        recorded position of every partition of ``ldp.reports`` is past that partition's end offset then (the
        step's *barrier*, taken at its first look; taken again if the topic went back, a recreated topic)."""
        if self.stream is None:
            return True
        try:
            if self._progress is None:
                ends = await self.stream.report_ends()
                positions = {p: off for p, (off, _) in (await self.store.positions(self.app_id,
                                                                                 self.reports_topic)).items()}
                self._progress = (positions, ends)
        except Exception as exc:  # noqa: BLE001 - Redis errors fail the tick; a broker away holds the finals
            if time.monotonic() - self._progress_warned > 30.0:
                self._progress_warned = time.monotonic()
                log.warning("cannot read the end offsets of %s (%s): no step is final by lateness until the "
                            "broker answers", self.reports_topic, exc)
            return False
        positions, ends = self._progress
        barrier = st.barrier.get(t)
        if barrier is None or any(ends.get(p, 0) < off for p, off in barrier.items()):
            barrier = st.barrier[t] = dict(ends)
        return all(positions.get(p, -1) + 1 >= off for p, off in barrier.items() if off > 0)

    def _export(self, c: Campaign, a: Attribute, doc: dict[str, Any]) -> None:
        m = self.metrics
        lab = (c.id, a.name)
        m.step_reports.labels(*lab).set(doc["n"])
        m.latest_step.labels(*lab).set(doc["t"])
        inf = float("inf")
        m.eps_first.labels(*lab).set(doc["eps_1"] if doc["eps_1"] is not None else inf)
        m.eps_inf.labels(*lab).set(doc["eps_inf"] if doc["eps_inf"] is not None else inf)
        worst = doc["eps_longitudinal_worst"]
        m.eps_longitudinal_worst.labels(*lab).set(worst if worst is not None else inf)
        if doc.get("poisoning_score") is not None:
            m.poisoning_score.labels(*lab).set(doc["poisoning_score"])
        if doc.get("mean") is not None:
            m.estimated_mean.labels(*lab).set(doc["mean"])
            half = doc["mean_ci95_halfwidth"]
            m.estimated_mean_ci95.labels(*lab).set(half if half is not None else inf)
        for name, q in (doc.get("quantiles") or {}).items():
            for bound in ("value", "lower", "upper"):
                if q[bound] is not None:
                    m.estimated_quantile.labels(*lab, name, bound).set(q[bound])
                else:  # a provisional estimate has no interval: no stale bounds of an older final next to it
                    with contextlib.suppress(KeyError):
                        m.estimated_quantile.remove(*lab, name, bound)
        if doc.get("top_k") is not None:
            self._export_top(lab, doc["top_k"])
        freq = doc["frequencies"]
        if freq is not None and m.per_value(a.k):  # off by default: k series (stream_app.metrics)
            for j, f in enumerate(freq):
                m.estimated_frequency.labels(c.id, a.name, a.label(j) if a.labels else str(j)).set(f)


    def _export_top(self, lab: tuple[str, str], top_k: list[dict[str, Any]]) -> None:
        """The top-K of an open-domain attribute as one series per rank, the old series of a rank removed when its
        item changes (K series per attribute, whatever the number of items ever seen)."""
        gauge = self.metrics.top_frequency
        new = {(str(rank), e["item"], e["value"] or ""): e["frequency"] for rank, e in enumerate(top_k, 1)}
        for old in self._top_series.get(lab, set()) - set(new):
            with contextlib.suppress(KeyError):
                gauge.remove(*lab, *old)
        for key, f in new.items():
            gauge.labels(*lab, *key).set(f)
        self._top_series[lab] = set(new)


def _regression_name(c: Campaign, a: Attribute, t: int) -> str:
    return f"count_regression:{c.id}/{a.name}/{t}"
