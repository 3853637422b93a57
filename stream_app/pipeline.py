"""The worker's hot path, without Faust: decode -> validate -> support -> apply, one Kafka message at a time.

:class:`Pipeline` is constructed with everything it needs: the campaigns, a :class:`StepStore` (the count
store's apply and position methods; :class:`stream_app.store.CountStore` in a worker, an in-memory fake in
unit tests), the metrics, the store-call policy (:class:`StoreCalls`), the loss checks (:class:`LossChecks`,
implemented by :class:`stream_app.recovery.Recovery`) and the two callables the Faust layer provides (publish
a rejection, read a partition's high watermark). It holds no Kafka client and opens no connection.

Per message (:meth:`Pipeline.process`) it does no per-report Python work: the envelope header is parsed with
``struct``, the payload is decoded zero-copy (``np.frombuffer``), the support counts come from the protocol's
numba kernel, and the store receives only the counts. Each batch is applied by one store call that skips a
batch id already applied to its step (exactly-once counting across re-sends, redeliveries and replays) and
records the message's consumer position with the counts. Nothing is JSON-encoded per batch except rejections.

The loss checks are called at three points only: before a message (:meth:`LossChecks.admit`: is the
partition waiting for its replay start, is the stream held), on a loss answer of the store
(:meth:`LossChecks.on_loss`: ``store_reset``, ``server_changed``), and after a message was handled
(:meth:`LossChecks.handled`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any, Awaitable, Callable, Protocol

import numpy as np

from estimators.poisoning import count_implausible
from estimators.warmup import warm_up_protocol
from wire import envelope
from wire.campaign import Campaign, step_at
from wire.errors import BadPayload, EnvelopeError, ExpiredStep, FutureStep, MalformedBatch
from wire.topics import Topics

from .defense import defenses_of
from .health import Health
from .metrics import Metrics
from .store import (APPLIED, EXPIRED, FUTURE_STEP, RETRYABLE_ERRORS, SERVER_CHANGED, STORE_RESET, Position,
                    StepBound)

__all__ = ["LOSS_ANSWERS", "LossChecks", "Pipeline", "SendJson", "StepStore", "StoreCalls"]

log = logging.getLogger(__name__)

#: Store answers that mean Redis lost (or may have lost) data: handed to :meth:`LossChecks.on_loss`.
LOSS_ANSWERS = (STORE_RESET, SERVER_CHANGED)

SendJson = Callable[[bytes | None, dict[str, Any]], Awaitable[Any]]


class StepStore(Protocol):
    """What the hot path needs of the count store (the public methods of :class:`stream_app.store.CountStore`)."""

    async def apply_batch(self, campaign: str, attribute: str, t: int, counts: np.ndarray, n: int, batch_id: str,
                          where: str = "", position: Position | None = None, bound: StepBound = ..., *,
                          rejected: int = 0, reports: bytes = b"") -> int: ...

    async def apply_watermark(self, campaign: str, attribute: str, t: int, position: Position | None = None,
                              bound: StepBound = ..., count: int = 0) -> int: ...

    async def set_position(self, position: Position) -> None: ...

    async def record_closed_at(self, campaign: str, attribute: str, t: int, when: float) -> None: ...

    async def wake_estimator(self, app_id: str, campaign: str, attribute: str, t: int) -> None: ...


class LossChecks(Protocol):
    """The recovery side of the hot path (:class:`stream_app.recovery.Recovery`)."""

    @property
    def holding(self) -> bool:
        """The store lost data: nothing is applied or recorded until the replay starts."""

    def admit(self, partition: int, offset: int) -> bool:
        """Whether the message at ``offset`` may be handled (``False``: held for the replay's start)."""

    async def hold(self) -> None:
        """Called for each message while :attr:`holding` (asks again for the rebalance that starts the replay)."""

    async def on_loss(self, status: int, campaign: str, partition: int, offset: int) -> bool:
        """A loss answer of the store: ``True`` if the message is held (a replay follows), ``False`` to apply again."""

    def handled(self, partition: int, offset: int, ident: str, campaign: str | None = None,
                t: int | None = None) -> None:
        """The message was handled (``campaign``: and applied to that campaign's step ``t``)."""

    def lost_before(self, partition: int, campaign: str) -> bool:
        """Whether the broker lost messages of ``partition`` that this campaign's next message follows."""

    async def mark_lost_steps(self, partition: int, campaign: str, t: int) -> None:
        """Mark incomplete the steps of ``campaign`` the lost messages before step ``t``'s message may have held."""


class StoreCalls:
    """Redis must apply every batch: a store call is retried until it succeeds (never skipped, never rejected).

    While one fails, the ``store_retry`` problem makes the worker unhealthy. Once the worker stops
    (:meth:`begin_stop`) a failing call is abandoned with ``CancelledError``: the message is not recorded as
    handled in Redis, so it is delivered again after the restart and counted once."""

    def __init__(self, health: Health, metrics: Metrics) -> None:
        self.health, self.metrics = health, metrics
        self.stopping = asyncio.Event()  # set at SIGTERM/SIGINT (begin_stop): store calls stop retrying
        self._calls: dict[asyncio.Task, float] = {}  # tasks inside a call -> since (cancelled if stuck at stop)

    def _redis_down(self) -> bool:
        return self.health.has("redis") or self.health.has("store_retry")

    async def __call__(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``await fn(*args)``, retried with backoff (0.1 s doubling to 5 s) while Redis fails."""
        if self.stopping.is_set() and self._redis_down():
            raise asyncio.CancelledError("the worker is stopping and Redis is unavailable")
        task = asyncio.current_task()
        if task is not None:
            self._calls.setdefault(task, time.monotonic())
        delay, failures = 0.1, 0
        try:
            while True:
                try:
                    result = await fn(*args)
                except RETRYABLE_ERRORS as exc:
                    failures += 1
                    self.metrics.store_retries_total.inc()
                    self.health.fail("store_retry", "redis", f"a store call failed {failures} time(s), retrying "
                                     f"until Redis answers: {type(exc).__name__}: {exc}")
                    if self.stopping.is_set():
                        raise asyncio.CancelledError("the worker is stopping while Redis is unavailable") from exc
                    log.warning("redis unavailable (%s); retrying in %.1f s", exc, delay)
                    try:
                        await asyncio.wait_for(self.stopping.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                    delay = min(5.0, delay * 2)
                    continue
                if failures:
                    self.health.clear("store_retry")
                return result
        finally:
            if task is not None:
                self._calls.pop(task, None)

    def begin_stop(self, grace: float = 1.0) -> None:
        """The worker was asked to stop (SIGTERM/SIGINT): failing store calls give up, and from now on a
        store call that has waited ``grace`` seconds for Redis (an unresponsive server) is cancelled."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.health.fail("stopping", "worker", "shutting down", level=logging.INFO)
        loop = asyncio.get_running_loop()
        stop_began = time.monotonic()

        def cancel_stuck_calls() -> None:
            now = time.monotonic()
            for task, since in list(self._calls.items()):
                if now - max(since, stop_began) >= grace and not task.done():
                    log.warning("cancelling a store call that waited %.1f s for Redis at shutdown", now - since)
                    self._calls.pop(task, None)
                    task.cancel()
            if now - stop_began < 60.0:  # a worker that has not exited by then is past its watchdog anyway
                loop.call_later(grace / 4, cancel_stuck_calls)

        loop.call_later(grace / 4, cancel_stuck_calls)


class Pipeline:
    """One worker's hot path (module doc): :meth:`process` a message, :meth:`reject` a bad one."""

    def __init__(self, campaigns: dict[str, Campaign], store: StepStore, metrics: Metrics, *, calls: StoreCalls,
                 recovery: LossChecks, app_id: str, topics: Topics, worker_id: str,
                 send_rejected: SendJson | None = None,
                 highwater: Callable[[int], int | None] | None = None) -> None:
        self.campaigns = campaigns
        self.store = store
        self.metrics = metrics
        self.calls = calls
        self.recovery = recovery
        self.app_id = app_id
        self.topics = topics
        self.worker_id = worker_id
        self.send_rejected = send_rejected
        self.highwater = highwater
        self.processed = 0
        self._dup_warned: set[tuple[str, str]] = set()
        self._lag_children: dict[int, tuple[Any, Any]] = {}
        self._ca_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        # the attributes with a poisoning defense (campaign `defense`; stream_app.defense)
        self.defenses = defenses_of(campaigns)
        for c in campaigns.values():  # the per-attribute counters exist (at 0) from the start: no missing series
            for attribute in c.attributes:
                self._ca(c.id, attribute)

    def warm_up(self) -> None:
        """Compile the numba support kernels before the first batch arrives."""
        for c in self.campaigns.values():
            for name, reports in c.sample_reports(4).items():
                warm_up_protocol(c.attributes[name].protocol, reports, defended=(c.id, name) in self.defenses)

    # ------------------------------------------------------------------ the hot path
    async def process(self, value: bytes | None, partition: int, offset: int, key: bytes | None = None,
                      timestamp: float | None = None) -> str:
        """Apply one Kafka message; returns ``"applied" | "duplicate" | "watermark" | "empty" | "rejected" | "held"``
        (``"held"``: not applied because the store lost data and a replay is pending)."""
        self.processed += 1
        if not self.recovery.admit(partition, offset):
            return "held"
        now = time.time()
        self._observe_lag(partition, offset, now, timestamp)
        env = None
        screened = None  # what the attribute's poisoning defense counts of the batch (None: no defense)
        try:
            if value is None:
                raise MalformedBatch("message without a value")
            env = envelope.parse(value)
            campaign = envelope.validate(env, self.campaigns)
            if env.kind == envelope.WATERMARK:
                counts = None
            elif env.count == 0:  # nothing to count (the header was validated; no step is opened)
                await self._handled(partition, offset, value)
                return "empty"
            else:
                reports = envelope.decode_reports(env, campaign)
                defense = self.defenses.get((env.campaign, env.attribute))
                screened = defense.screen(reports) if defense is not None else None
                if screened is not None:
                    reports = screened.reports
                counts = campaign.attributes[env.attribute].protocol.support(reports)
        except EnvelopeError as exc:
            await self.reject(exc.reason, exc.detail, partition=partition, offset=offset, key=key, env=env,
                              size=len(value) if value is not None else 0)
            await self._handled(partition, offset, value)
            return "rejected"
        except Exception as exc:  # noqa: BLE001 - a batch that breaks the decoder is never counted
            log.exception("unexpected error while decoding the batch at partition %s offset %s", partition, offset)
            await self.reject(BadPayload.reason, f"unexpected {type(exc).__name__}: {exc}", partition=partition,
                              offset=offset, key=key, env=env, size=len(value) if value is not None else 0)
            await self._handled(partition, offset, value)
            return "rejected"
        c_reports, c_batches, c_dups = self._ca(env.campaign, env.attribute)
        if self.recovery.holding:  # the store lost data: hold everything until the replay restarts the stream
            await self.recovery.hold()
            return "held"
        if self.recovery.lost_before(partition, env.campaign):  # before the counts: no final may miss the mark
            await self.recovery.mark_lost_steps(partition, env.campaign, env.t)
        position = Position(self.app_id, self.topics.reports, partition, offset, envelope.message_ident(env))
        bound = StepBound(wall_limit=step_at(campaign, now) + campaign.max_steps_ahead, ahead=campaign.max_steps_ahead)
        while True:
            if counts is None:
                status = await self.calls(self.store.apply_watermark, env.campaign, env.attribute, env.t, position,
                                          bound, env.count)
            else:
                apply = self.store.apply_batch if screened is None else partial(
                    self.store.apply_batch, rejected=screened.rejected, reports=screened.log)
                status = await self.calls(apply, env.campaign, env.attribute, env.t, counts, len(reports),
                                          env.batch_id, f"{partition}:{offset}", position, bound)
            if status not in LOSS_ANSWERS:
                break
            if await self.recovery.on_loss(status, env.campaign, partition, offset):
                return "held"
        if counts is None and status == APPLIED:
            self.metrics.watermarks_total.labels(env.campaign, env.attribute).inc()
            await self.calls(self._after_watermark, env.campaign, env.attribute, env.t)
        if status in (EXPIRED, FUTURE_STEP):
            if status == EXPIRED:
                reason, detail = ExpiredStep.reason, "is beyond the campaign's retention (already pruned)"
            else:
                reason, detail = FutureStep.reason, (f"is more than max_steps_ahead = {campaign.max_steps_ahead} steps "
                                                     f"past the newest final step (or the wall-clock step)")
            await self.reject(reason, f"step {env.t} of {env.campaign}/{env.attribute} {detail}", partition=partition,
                              offset=offset, key=key, env=env, size=len(value))
            await self._handled(partition, offset, value, position)
            return "rejected"
        self.recovery.handled(partition, offset, position.ident, env.campaign, env.t)
        if counts is None:
            return "watermark"
        if status == APPLIED:
            c_reports.inc(len(reports))
            c_batches.inc()
            if screened is not None:
                if screened.rejected:
                    self.metrics.rejected_reports_total.labels(env.campaign, env.attribute, "implausible").inc(
                        screened.rejected)
            else:
                # without a defense, unary reports of an implausible size are counted all the same and flagged
                implausible = count_implausible(campaign.attributes[env.attribute].protocol, reports)
                if implausible:
                    self.metrics.implausible_reports_total.labels(env.campaign, env.attribute).inc(implausible)
            return "applied"
        c_dups.inc()
        if (env.campaign, env.attribute) not in self._dup_warned:
            self._dup_warned.add((env.campaign, env.attribute))
            log.warning("skipped a batch of %s/%s whose batch id %r was already applied (a producer retry or resume, "
                        "a redelivery or a replay; partition %s offset %s); further skips are only counted in "
                        "ldp_duplicate_batches_total", env.campaign, env.attribute, env.batch_id, partition, offset)
        return "duplicate"

    async def _handled(self, partition: int, offset: int, value: bytes | None, position: Position | None = None) -> None:
        """Record a message that counted nothing (rejected, empty) as handled: the stream's progress
        (:meth:`Estimator.stream_caught_up <stream_app.windows.Estimator>`) must pass it too."""
        if self.recovery.holding:
            return
        if position is None:
            position = Position(self.app_id, self.topics.reports, partition, offset, envelope.ident_of(value))
        await self.calls(self.store.set_position, position)
        self.recovery.handled(partition, offset, position.ident)

    async def _after_watermark(self, campaign: str, attribute: str, t: int) -> None:
        await self.store.record_closed_at(campaign, attribute, t, time.time())
        await self.store.wake_estimator(self.app_id, campaign, attribute, t)

    # ------------------------------------------------------------------ metrics
    def _observe_lag(self, partition: int, offset: int, now: float, timestamp: float | None) -> None:
        lag, lag_s = self._lag(partition)
        if timestamp:
            lag_s.set(max(0.0, now - timestamp))
        if self.highwater is not None:
            hw = self.highwater(partition)
            if hw is not None:
                lag.set(max(0, hw - offset - 1))

    def _lag(self, partition: int) -> tuple[Any, Any]:
        ch = self._lag_children.get(partition)
        if ch is None:
            p = str(partition)
            ch = self._lag_children[partition] = (self.metrics.consumer_lag.labels(p),
                                                  self.metrics.consumer_lag_seconds.labels(p))
        return ch

    def forget_partitions(self, keep: set[int]) -> None:
        """Drop the lag gauges of partitions this worker no longer owns (after a rebalance)."""
        for p in [p for p in self._lag_children if p not in keep]:
            del self._lag_children[p]
            for g in (self.metrics.consumer_lag, self.metrics.consumer_lag_seconds):
                try:
                    g.remove(str(p))
                except KeyError:
                    pass

    def _ca(self, campaign: str, attribute: str) -> tuple[Any, Any, Any]:
        ch = self._ca_children.get((campaign, attribute))
        if ch is None:
            m = self.metrics
            ch = self._ca_children[(campaign, attribute)] = (
                m.reports_total.labels(campaign, attribute), m.batches_total.labels(campaign, attribute),
                m.duplicate_batches_total.labels(campaign, attribute))
        return ch

    # ------------------------------------------------------------------ rejections
    async def reject(self, reason: str, detail: str, *, partition: int | None = None, offset: int | None = None,
                     key: bytes | None = None, env: envelope.Envelope | None = None, size: int = 0,
                     source: str = "kafka", extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Count a rejection and publish its record on ``ldp.rejected``."""
        self.metrics.rejected_total.labels(reason).inc()
        doc: dict[str, Any] = {
            "reason": reason, "detail": detail, "source": source,
            "partition": partition, "offset": offset,
            "key": key.decode("utf-8", "replace") if isinstance(key, (bytes, bytearray)) else key,
            "campaign": env.campaign if env else None, "attribute": env.attribute if env else None,
            "t": env.t if env else None, "protocol": env.protocol if env else None,
            "count": env.count if env else None, "size": size,
            "worker": self.worker_id, "rejected_at": time.time(),
        }
        if extra:
            doc.update({k: v for k, v in extra.items() if doc.get(k) is None})
        log.info("rejected (%s): %s", reason, detail)
        if self.send_rejected is not None:
            try:
                await self.send_rejected(doc["key"].encode() if doc["key"] else None, doc)
            except Exception:  # noqa: BLE001 - the metric still counts it
                log.exception("could not publish a rejection record")
        return doc
