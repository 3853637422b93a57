"""The windowed estimator: turns the Redis support counts of open time steps into estimates.

Who runs it
    Every worker runs the loop, but only the holder of a Redis *lease*
    (:meth:`CountStore.claim_lease <stream_app.store.CountStore.claim_lease>`: ``SET NX PX``
    renewed every tick by a compare-and-expire script) computes and publishes. Why not Faust's ``on_leader`` timers: with no changelog tables
    Faust uses the round-robin assignor and has no leader partition, and a leader elected through
    the consumer group is lost for a whole session timeout when it is killed (tansu delays the
    rejoin); the lease moves to another worker after ``lease_ttl`` seconds whatever the group does,
    and it guarantees a single publisher, so ``ldp.estimates`` carries each final estimate once
    (a publisher killed between publishing and recording a final may publish it twice; the Redis
    history is idempotent).

When a step is final
    * its watermark was applied (``store.read_step(...)["closed"]``: the producer promised no more
      reports for the step; all batches of a step share the key ``"{t}:{attr}"`` and hence one
      partition, so every report sent before the watermark is already counted), trigger
      ``"watermark"``; or
    * ``now >= max((t + 1) * time_step_seconds, last_ts) + lateness_seconds``, trigger
      ``"lateness"``: for HTTP-ingested steps (``t = floor(now / time_step_seconds)``) the step
      closes ``lateness_seconds`` after its wall-clock end, later if reports keep arriving; for
      logical steps (simulated fleets number steps 0, 1, 2, ... so their wall-clock end is long
      past) this reduces to ``lateness_seconds`` of silence, and a fleet should send watermarks.

    A final estimate is published once on ``ldp.estimates`` and stored in the Redis history
    (``store.save_estimate``). Reports that arrive after it (late data, still counted: Redis
    counts are never refused) produce a *revised* final estimate (``revision`` + 1) for the
    ``recheck_steps`` most recent final steps of each attribute.

Open steps get a non-final estimate on every tick in which their ``n`` changed. The loop ticks
every ``refresh_seconds`` and at once when a worker applied a watermark (Redis pub/sub wake-up
channel), so a final estimate follows its watermark within milliseconds on the lease holder.

Privacy figures "so far" (server side)
    The server cannot see a device's memo, only how many time steps an attribute has had. A device
    sends at most one report per attribute and step, so after ``S`` steps (the number of steps
    ``<= t`` in the attribute's step index) it memoized at most ``min(S, memo_size)`` distinct
    values: ``eps_longitudinal_worst = proto.longitudinal_loss(S)`` (``min(S, memo_size) * eps_inf``
    for L-* protocols, ``min(S, d+1, b) * eps_inf`` for dBitFlipPM, ``eps_1`` then ``inf`` for
    single-shot protocols). ``eps_longitudinal_bound`` is the protocol's bound over an unbounded
    stream (``proto.worst_case_loss``). Infinite values are ``null`` in JSON and ``+Inf`` in Prometheus.
"""
from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from wire.campaign import Attribute, Campaign

from .metrics import Metrics
from .store import CountStore, StepState, WakeUps

__all__ = ["Estimator", "build_estimate", "due_at"]

log = logging.getLogger(__name__)
Publish = Callable[[dict[str, Any]], Awaitable[None]]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def due_at(campaign: Campaign, t: int, state: StepState) -> float:
    """Wall-clock time at which a step without watermark becomes final (see module doc)."""
    last = state.get("last_ts") or 0.0
    return max((t + 1) * campaign.time_step_seconds, last) + campaign.lateness_seconds


def build_estimate(campaign: Campaign, attr: Attribute, t: int, state: StepState, steps_so_far: int, *,
                   final: bool, trigger: str | None, now: float, closed_ts: float | None = None,
                   revision: int = 0, worker: str = "") -> dict[str, Any]:
    """The JSON document of one estimate (published on ``ldp.estimates``)."""
    proto = attr.protocol
    n = int(state["n"])
    freq = freq_ns = var = half = None
    if n > 0:
        counts = state["counts"]
        freq = proto.estimate(counts, n).tolist()
        freq_ns = proto.estimate(counts, n, postprocess="norm-sub").tolist()
        var = float(proto.variance(n))
        half = 1.96 * math.sqrt(var)
    last_input = max(x for x in (state.get("last_ts"), closed_ts, 0.0) if x is not None)
    return {
        "campaign": campaign.id, "attribute": attr.name, "protocol": proto.name,
        "fingerprint": proto.fingerprint, "t": int(t), "final": bool(final), "trigger": trigger,
        "revision": int(revision), "n": n,
        "frequencies": freq, "frequencies_norm_sub": freq_ns,
        "variance": var, "ci95_halfwidth": half,
        "eps_1": _finite(proto.eps_first), "eps_inf": _finite(proto.eps_inf),
        "eps_longitudinal_worst": _finite(float(proto.longitudinal_loss(max(int(steps_so_far), 1)))),
        "eps_longitudinal_bound": _finite(float(proto.worst_case_loss)),
        "steps_so_far": int(steps_so_far),
        "labels": list(attr.labels) if attr.labels else None,
        "first_ts": state.get("first_ts"), "last_ts": state.get("last_ts"), "closed_ts": closed_ts,
        "updated_at": now,
        "latency_seconds": (now - last_input) if last_input else None,
        "worker": worker,
    }


@dataclass
class _AttrState:
    finalized: dict[int, tuple[int, int]] = field(default_factory=dict)  # t -> (n at final, revision)
    published: dict[int, tuple[int, bool]] = field(default_factory=dict)  # open t -> (n, closed) last sent
    low: int = 0  # every step below is final
    below: int = -1  # number of steps below `low` when it was last set (-1: unknown)
    recent: list[int] = field(default_factory=list)  # the most recent final steps (late-data rechecks)
    latest_t: int = -1


class Estimator:
    """Periodic estimator over all campaigns; run :meth:`run` as a task, or call :meth:`tick`."""

    def __init__(self, campaigns: dict[str, Campaign], store: CountStore, metrics: Metrics, publish: Publish, *,
                 app_id: str, worker_id: str | None = None, refresh_seconds: float = 1.0,
                 lease_ttl: float | None = None, recheck_steps: int = 16, min_tick_interval: float = 0.02,
                 rescan_ticks: int = 300) -> None:
        if refresh_seconds <= 0:
            raise ValueError("refresh_seconds must be positive")
        self.campaigns = campaigns
        self.store = store
        self.metrics = metrics
        self.publish = publish
        self.app_id = app_id
        self.worker_id = worker_id or f"{uuid.uuid4().hex[:12]}"
        self.refresh_seconds = refresh_seconds
        self.lease_ttl = lease_ttl if lease_ttl is not None else max(2.0, 3.0 * refresh_seconds)
        self.recheck_steps = recheck_steps
        self.min_tick_interval = min_tick_interval
        self.rescan_ticks = rescan_ticks
        self.is_leader = False
        self.ticks = 0
        self._state: dict[tuple[str, str], _AttrState] = {}
        self._stopping = asyncio.Event()

    @property
    def redis(self) -> Any:
        """The store's Redis client (tests wrap its commands to inject races)."""
        return self.store.redis

    # ------------------------------------------------------------------ lease
    async def _hold_lease(self) -> bool:
        ok = await self.store.claim_lease(self.app_id, self.worker_id, self.lease_ttl)
        if ok and not self.is_leader:
            log.info("estimator lease acquired by %s", self.worker_id)
            await self._load_state()
        elif not ok and self.is_leader:
            log.warning("estimator lease lost by %s", self.worker_id)
            self._drop_state()
        self.is_leader = ok
        self.metrics.estimator_leader.set(1 if ok else 0)
        return ok

    async def release(self) -> None:
        """Give the lease up (clean shutdown) so another worker takes over at once."""
        try:
            await self.store.release_lease(self.app_id, self.worker_id)
        finally:
            self.is_leader = False
            self.metrics.estimator_leader.set(0)

    async def _load_state(self) -> None:
        self._state = {}
        for c in self.campaigns.values():
            for a in c.attributes.values():
                st = _AttrState()
                done = await self.store.final_steps(c.id, a.name)
                st.recent = done[-self.recheck_steps:]
                st.finalized = dict.fromkeys(done, (-1, 0))  # (n, revision) matter for `recent` only
                for t, doc in zip(st.recent, await self.store.final_estimates(c.id, a.name, st.recent)):
                    doc = doc or {}
                    st.finalized[t] = (int(doc.get("n", 0)), int(doc.get("revision", 0)))
                latest = await self.store.latest_estimate(c.id, a.name)
                if latest:
                    st.latest_t = int(latest.get("t", -1))
                self._state[(c.id, a.name)] = st

    def _drop_state(self) -> None:
        self._state = {}
        for g in (self.metrics.estimated_frequency, self.metrics.step_reports, self.metrics.latest_step,
                  self.metrics.eps_first, self.metrics.eps_inf, self.metrics.eps_longitudinal_worst):
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
        self.metrics.update_rate()
        if not await self._hold_lease():
            return []
        out: list[dict[str, Any]] = []
        for c in self.campaigns.values():
            for a in c.attributes.values():
                out.extend(await self._tick_attribute(c, a, now))
        return out

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
        open_ts = [t for t in cand if t not in st.finalized]
        late: list[int] = []
        if st.recent:
            counted = await store.reports_counted(c.id, a.name, st.recent)
            late = [t for t, n in zip(st.recent, counted) if n != st.finalized[t][0]]
        todo = sorted(set(open_ts) | set(late))
        docs: list[dict[str, Any]] = []
        if todo:
            states = await asyncio.gather(*(store.read_step(c.id, a.name, t, size) for t in todo))
            closed = await store.closed_times(c.id, a.name, todo)
            t_now = time.time() if now is None else now
            for t, s, cts in zip(todo, states, closed):
                if t in st.finalized:  # late data after a final estimate: publish a revision
                    final, trigger, revision = True, "late", st.finalized[t][1] + 1
                elif s["closed"]:
                    final, trigger, revision = True, "watermark", 0
                elif t_now >= due_at(c, t, s):
                    final, trigger, revision = True, "lateness", 0
                else:
                    final, trigger, revision = False, None, 0
                    if st.published.get(t) == (s["n"], s["closed"]):
                        continue
                steps_so_far = await store.count_steps_through(c.id, a.name, t)
                doc = build_estimate(c, a, t, s, steps_so_far, final=final, trigger=trigger,
                                     now=time.time() if now is None else now, closed_ts=cts,
                                     revision=revision, worker=self.worker_id)
                await self._emit(c, a, st, doc)
                docs.append(doc)
        # every step below the first open one is final: the next scan starts there
        rest = [t for t in cand if t not in st.finalized]
        low = min(rest) if rest else (max(cand) + 1 if cand else st.low)
        if low != st.low:
            # count only what this tick saw (all final): a step that appeared below the new `low`
            # meanwhile makes next tick's count differ and is rescanned, never skipped
            st.below += sum(1 for t in cand if st.low <= t < low)
            st.low = low
        if len(st.finalized) > 100_000:  # bounded memory; the Redis history stays authoritative
            for t in sorted(st.finalized)[:-50_000]:
                del st.finalized[t]
        return docs

    async def _emit(self, c: Campaign, a: Attribute, st: _AttrState, doc: dict[str, Any]) -> None:
        t = doc["t"]
        await self.publish(doc)
        if doc["final"]:
            await self.store.save_estimate(c.id, a.name, t, doc)
            st.finalized[t] = (doc["n"], doc["revision"])
            st.published.pop(t, None)
            if t not in st.recent:
                bisect.insort(st.recent, t)
                del st.recent[:-self.recheck_steps]
            if doc["latency_seconds"] is not None and doc["revision"] == 0:
                self.metrics.estimate_latency.labels(doc["trigger"]).observe(doc["latency_seconds"])
        else:
            st.published[t] = (doc["n"], False)
        self.metrics.estimates_published.labels("true" if doc["final"] else "false").inc()
        if t >= st.latest_t and (doc["n"] > 0 or st.latest_t < 0):
            st.latest_t = t
            await self.store.set_latest_estimate(c.id, a.name, doc)
            self._export(c, a, doc)

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
        freq = doc["frequencies"]
        if freq is not None:
            for j, f in enumerate(freq):
                m.estimated_frequency.labels(c.id, a.name, a.label(j) if a.labels else str(j)).set(f)
