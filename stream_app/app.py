"""The Faust application: the counting agent on ``ldp.reports`` and the services around it.

``create_app(...)`` builds one app instance (one worker). Several instances with the same
``app_id`` (separate processes) form one consumer group and share the partitions of
``ldp.reports``; each batch is applied to Redis by one Lua script that skips already-applied
batch ids (a batch re-sent by its producer) and partition offsets, so neither a producer's retry
or resume nor Faust's at-least-once redelivery (after a crash, a rebalance, a commit that did not
happen) counts a batch twice.

The hot path (:meth:`Pipeline.process`) does no per-report Python work: the envelope header is
parsed with ``struct``, the payload is decoded zero-copy (``np.frombuffer``), the support counts
come from the protocol's numba kernel, and the Redis script receives only the non-zero
``(value, count)`` pairs. Nothing is JSON-encoded per batch except rejections.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiokafka
import aiokafka.errors
import faust
import mode
import numpy as np

from estimators.poisoning import count_implausible
from wire import envelope
from wire.campaign import Campaign, load_campaigns, step_at
from wire.errors import BadPayload, EnvelopeError, ExpiredStep, FutureStep, MalformedBatch
from wire.topics import Topics, estimate_key
from wire.transport import KafkaSecurity, kafka_client_options

from .api import WebContext, register
from .broker import TopicReader
from .health import Health, add_worker_probes
from .ingest.batcher import Batcher
from .metrics import Metrics
from .settings import WorkerSettings, free_port
from .store import (APPLIED, EXPIRED, FUTURE_STEP, RETRYABLE_ERRORS, SERVER_CHANGED, STORE_RESET, CountStore, Position,
                    StepBound)
from .windows import Estimator, StreamView

__all__ = ["Pipeline", "create_app", "get_pipeline"]

log = logging.getLogger(__name__)


SendJson = Callable[[bytes | None, dict[str, Any]], Awaitable[Any]]
SendRaw = Callable[[bytes, bytes], Awaitable[Any]]


class Pipeline:
    """The state of one app instance outside Faust: campaigns, Redis store, metrics, estimator.

    ``send_rejected`` / ``send_estimate`` / ``send_reports`` are set by :func:`create_app` (Faust
    topics); the class itself has no Faust dependency, so the hot path can be driven directly.
    """

    def __init__(self, campaigns: dict[str, Campaign], redis_url: str, *, app_id: str, topics: Topics,
                 refresh_seconds: float = 1.0, worker_id: str | None = None) -> None:
        self.campaigns = campaigns
        self.redis_url = redis_url
        self.app_id = app_id
        self.topics = topics
        self.refresh_seconds = refresh_seconds
        self.worker_id = worker_id or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.metrics = Metrics()
        self.send_rejected: SendJson | None = None
        self.send_estimate: SendJson | None = None
        self.send_reports: SendRaw | None = None
        self.highwater: Callable[[Any], int | None] | None = None
        self.web_port: int | None = None
        self.web_host: str = "127.0.0.1"
        self.ready_file: Path | None = None
        self.assigned: list[int] = []
        self.serving = False  # the web server and the services are up (set by the LdpService)
        self._dup_warned: set[tuple[str, str]] = set()
        self.alarms: dict[str, dict[str, Any]] = {}  # name -> {component, since, error}: shown by /status
        # what keeps this worker from progressing (GET /health, ldp_worker_healthy); an alarm with
        # "blocking": True counts too (stream_app/health.py)
        self.health = Health(self.metrics, [self.alarms])
        self.health.fail("starting", "worker", "waiting for the first partition assignment and the warm-up",
                         level=logging.INFO)
        self.stopping = asyncio.Event()  # set at SIGTERM/SIGINT (begin_stop): store calls stop retrying
        self._store_calls: dict[asyncio.Task, float] = {}  # tasks inside _retry -> since (cancelled if stuck at stop)
        self.resyncing = False  # the store lost data; nothing is applied until the replay starts
        self._replay_requested_at = -1e9
        self.last_offsets: dict[int, int] = {}  # partition -> last offset handled by this worker
        # (campaign, partition) -> last offset of the campaign applied by this worker since its assignment:
        # compared with the campaign's cursors in the store after a Redis restart (:meth:`server_changed`)
        self.applied_offsets: dict[tuple[str, int], int] = {}
        # partition -> (offset, ident) of the first message handled since the last assignment: if it is not
        # at its offset any more, the topic was recreated under this worker (see watch_incarnations)
        self.anchors: dict[int, tuple[int, str]] = {}
        self._redis_run_id: str | None = None  # the Redis server last seen (its run id changes at a restart)
        self.request_replay: Callable[[], Awaitable[None]] | None = None
        self.earliest_offsets: Callable[[list[int]], Awaitable[dict[int, int]]] | None = None
        self.fetch_ident: Callable[[int, int], Awaitable[str | None]] | None = None
        self.stream_view: StreamView | None = None  # the broker as the estimator reads it (stream_app.broker)
        # partition -> the offset its first message must have after the positions were restored, and a seek there
        self.replay_from: dict[int, int] = {}
        self._reseeks: dict[int, tuple[int, int]] = {}  # partition -> (seeks, the offset that came first last time)
        self.progress_at: dict[int, float] = {}  # partition -> when a message of it was last handled (monotonic)
        self.reseek: Callable[[int, int], None] | None = None
        self.processed = 0
        self._store: CountStore | None = None
        self._estimator: Estimator | None = None
        self._lag_children: dict[int, tuple[Any, Any]] = {}
        self._ca_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}
        for c in campaigns.values():  # the per-attribute counters exist (at 0) from the start: no missing series
            for attribute in c.attributes:
                self._ca(c.id, attribute)

    # ------------------------------------------------------------------ lazily bound to the loop
    @property
    def store(self) -> CountStore:
        if self._store is None:
            self._store = CountStore.from_url(self.redis_url)
        return self._store

    @property
    def estimator(self) -> Estimator:
        if self._estimator is None:
            self._estimator = Estimator(self.campaigns, self.store, self.metrics, self._publish_estimate,
                                        app_id=self.app_id, worker_id=self.worker_id,
                                        refresh_seconds=self.refresh_seconds, stream=self.stream_view,
                                        reports_topic=self.topics.reports)
        return self._estimator

    def status(self) -> dict[str, Any]:
        """This worker for ``GET /status``: ids, assigned partitions, estimator lease, messages processed,
        ``healthy`` and the ``problems`` that keep it from progressing (:mod:`stream_app.health`)."""
        est = self._estimator
        problems = self.health.problems()
        return {"worker_id": self.worker_id, "app_id": self.app_id, "assigned": self.assigned,
                "estimator_leader": bool(est and est.is_leader), "processed": self.processed,
                "web_port": self.web_port, "replaying": self.resyncing,
                "alarms": [{"name": k, **v} for k, v in {**self.alarms, **(est.alarms if est else {})}.items()],
                "healthy": not problems, "problems": problems}

    async def _publish_estimate(self, doc: dict[str, Any]) -> None:
        if self.send_estimate is not None:
            await self.send_estimate(estimate_key(doc["campaign"], doc["attribute"], doc["t"]), doc)

    def warm_up(self) -> None:
        """Compile the numba support kernels before the first batch arrives."""
        for c in self.campaigns.values():
            samples: dict[str, np.ndarray] = {}  # attribute -> a few reports
            for g in c.groups.values():  # a group's devices randomize through its solution
                out = g.solution.randomize(np.zeros((4, g.solution.d), dtype=np.int64), None,
                                           state=g.solution.new_state(4))
                samples.update(zip(g.attributes, out.reports))
            for a in c.attributes.values():
                p = a.protocol
                reports = samples.get(a.name)
                if reports is None:
                    reports = p.randomize(np.zeros(4, dtype=np.int64), None, state=p.new_state(4))
                p.support(p.decode(p.encode(reports)))
                count_implausible(p, reports)  # compiles the poisoning flag's kernel
                p.estimate(p.support(reports), max(len(reports), 1))

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    # ------------------------------------------------------------------ the hot path
    async def process(self, value: bytes | None, partition: int, offset: int, key: bytes | None = None,
                      timestamp: float | None = None) -> str:
        """Apply one Kafka message; returns ``"applied" | "duplicate" | "watermark" | "empty" | "rejected" | "held"``
        (``"held"``: not applied because the store lost data and a replay is pending)."""
        self.processed += 1
        self.progress_at[partition] = time.monotonic()
        if partition in self.replay_from and not self._at_replay_start(partition, offset):
            return "held"
        now = time.time()
        lag, lag_s = self._lag(partition)
        if timestamp:
            lag_s.set(max(0.0, now - timestamp))
        if self.highwater is not None:
            hw = self.highwater(partition)
            if hw is not None:
                lag.set(max(0, hw - offset - 1))
        env = None
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
        if self.resyncing:  # the store lost data: hold everything until the replay restarts the stream
            await self._request_replay()
            return "held"
        position = Position(self.app_id, self.topics.reports, partition, offset, envelope.message_ident(env))
        bound = StepBound(wall_limit=step_at(campaign, now) + campaign.max_steps_ahead, ahead=campaign.max_steps_ahead)
        while True:
            if counts is None:
                status = await self._retry(self.store.apply_watermark, env.campaign, env.attribute, env.t, position,
                                           bound, env.count)
            else:
                status = await self._retry(self.store.apply_batch, env.campaign, env.attribute, env.t, counts,
                                           env.count, env.batch_id, f"{partition}:{offset}", position, bound)
            if status != SERVER_CHANGED:
                break
            if await self.server_changed(env.campaign, partition, offset):
                return "held"
        if counts is None and status == APPLIED:
            self.metrics.watermarks_total.labels(env.campaign, env.attribute).inc()
            await self._retry(self._after_watermark, env.campaign, env.attribute, env.t)
        if status == STORE_RESET:
            await self.store_lost(env.campaign, partition, offset)
            return "held"
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
        self.last_offsets[partition] = offset
        self.applied_offsets[(env.campaign, partition)] = offset
        if partition not in self.anchors:
            self.anchors[partition] = (offset, position.ident)
        if counts is None:
            return "watermark"
        if status == APPLIED:
            c_reports.inc(env.count)
            c_batches.inc()
            self.metrics.count_reports(env.count)
            # poisoning flag (estimators.poisoning): unary reports of an implausible size are counted all the
            # same (dropping them would change n under the estimator) and reported here
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

    # ------------------------------------------------------------------ positions and replay
    def _at_replay_start(self, partition: int, offset: int) -> bool:
        """After positions were restored (:meth:`start_offsets`), the first message of a partition must be the one
        at its start offset. One fetched before the seek (Faust delivers what it buffered, then drops every
        offset below the last it delivered: seen after a broker lost its topic) is not handled, and the partition
        is sought to its start again, after every such message. The same offset arriving first again right after
        a seek means the broker has nothing at the start offset (deleted meanwhile): the stream goes on there."""
        want = self.replay_from[partition]
        count, last = self._reseeks.get(partition, (0, -1))
        if offset == want or (offset == last and offset > want):
            if offset != want:
                log.warning("partition %s: no message at offset %s any more; going on at %s", partition, want, offset)
            del self.replay_from[partition]
            self._reseeks.pop(partition, None)
            return True
        if offset < want:  # handled before the restore: the store holds it
            return False
        self._reseeks[partition] = (count + 1, offset)
        if count == 0:
            log.warning("partition %s: offset %s arrived first after the positions were restored to %s (fetched "
                        "before the seek): not handled; seeking to %s again", partition, offset, want, want)
        if self.reseek is not None:
            self.reseek(partition, want)
        return False

    async def _handled(self, partition: int, offset: int, value: bytes | None, position: Position | None = None) -> None:
        """Record a message that counted nothing (rejected, empty) as handled: the stream's progress
        (:meth:`Estimator.stream_caught_up <stream_app.windows.Estimator>`) must pass it too."""
        if self.resyncing:
            return
        if position is None:
            position = Position(self.app_id, self.topics.reports, partition, offset, envelope.ident_of(value))
        await self._retry(self.store.set_position, position)
        self.last_offsets[partition] = offset
        if partition not in self.anchors:
            self.anchors[partition] = (offset, position.ident)

    async def store_lost(self, campaign: str, partition: int, offset: int, why: str = "") -> None:
        """Redis lost data (the campaign's epoch changed): raise the alarm and replay from the store's positions.

        Nothing more is applied until the consumer group has rebalanced and every partition restarts at the
        position the store still has (:meth:`start_offsets`); the replayed batches whose ids survived are
        skipped, the others are counted again, so the counts end exact if Kafka still holds the messages."""
        self.metrics.store_resets_total.labels(campaign).inc()
        why = why or f"campaign {campaign!r}: its epoch changed (seen at partition {partition} offset {offset})"
        self.alarms["store_reset"] = {"component": "redis", "since": time.time(), "blocking": True, "error": (
            f"Redis lost data ({why}); holding the stream until the replay from the positions Redis still "
            f"holds starts")}
        log.error("Redis lost data (%s): holding the stream and replaying from the store's positions", why)
        self.resyncing = True
        await self._request_replay()

    async def _request_replay(self) -> None:
        """Ask for the rebalance that starts the replay (again every 10 s while it has not happened)."""
        now = time.monotonic()
        if self.request_replay is None or now - self._replay_requested_at < 10.0:
            return
        self._replay_requested_at = now
        try:
            await self.request_replay()
        except Exception:  # noqa: BLE001 - asked again in 10 s; the alarm stays up meanwhile
            log.exception("could not request the consumer-group rebalance that starts the replay")

    async def _recorded_message_is_there(self, partition: int, offset: int, ident: str) -> bool:
        """Whether the message recorded at ``offset`` is still there (retried; if the broker cannot tell, the
        answer is no: the partition is replayed from its start, and the applied batch ids are skipped)."""
        if self.fetch_ident is None:
            return True
        for attempt in range(5):
            try:
                return await self.fetch_ident(partition, offset) == ident
            except Exception as exc:  # noqa: BLE001 - the broker may be coming back
                log.warning("cannot read back partition %s offset %s (%s); attempt %s of 5", partition, offset,
                            exc, attempt + 1)
                await asyncio.sleep(1.0)
        return False

    async def watch_incarnations(self, every: float = 2.0) -> None:
        """Check every ``every`` seconds that each partition's anchor message is still where it was read.

        A broker that comes back without its data (memory storage) recreates the topics with offsets from
        0, and a consumer that kept its assignment goes on fetching at its old offset: the new incarnation's
        messages below it would never be read. When an anchor is gone, the partition's recorded position
        (which may already name a message of the new incarnation) is dropped, the stream is held and the
        group rebalances: the partition is replayed from its first offset (applied batch ids are skipped)."""
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), every)
                return
            except asyncio.TimeoutError:
                pass
            if self.resyncing:
                continue
            try:
                await self._check_redis_restart()
                await self._check_anchors()
                await self._check_stalls()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the broker or Redis may be down: look again next time
                log.debug("incarnation check failed: %s", exc)

    async def _check_anchors(self) -> None:
        """The broker lost data under this worker? A partition whose log start passed a message not yet handled
        (retention deleted it), or whose anchor message is gone (the topic was recreated, offsets went back) is
        an unrepairable loss (:meth:`broker_lost`); the latter is also replayed from the new incarnation's start.
        (Not the recorded position against the end offset: tansu's memory storage, restarted, has served a
        message at its own end offset.)"""
        if not self.anchors or self.fetch_ident is None:
            return
        parts = sorted(self.anchors)
        earliest = await self.earliest_offsets(parts) if self.earliest_offsets else {}
        for p in parts:
            last = self.last_offsets.get(p)
            if last is not None and earliest.get(p, 0) > last + 1:
                key = f"unrepairable_loss:{p}"
                if self.alarms.get(key, {}).get("first_kept") != earliest[p]:
                    await self.broker_lost([p], f"partition {p}: offsets {last + 1}..{earliest[p] - 1} were deleted by "
                                                f"the broker before they were counted")
                    self.alarms[key]["first_kept"] = earliest[p]
        for p, (offset, ident) in list(self.anchors.items()):
            if offset < earliest.get(p, 0):  # deleted by the broker's retention: re-anchor
                self.anchors.pop(p, None)
                continue
            if await self.fetch_ident(p, offset) != ident and self.anchors.get(p) == (offset, ident):
                await self.topic_recreated(p, offset, ident)
                return

    async def _check_stalls(self, after: float = 10.0) -> None:
        """An assigned partition with messages waiting past the store's position, none of them handled for
        ``after`` seconds while Redis answers, is sought to that position again (seen after a broker lost its
        topic: a consumer left fetching beyond the new incarnation's end, where tansu answers nothing)."""
        if self.stream_view is None or self.reseek is None or not self.assigned or self.resyncing \
                or self.health.has("redis") or self.health.has("store_retry"):
            return
        now = time.monotonic()
        stalled = [p for p in self.assigned if now - self.progress_at.setdefault(p, now) > after]
        if not stalled:
            return
        ends = await self.stream_view.report_ends()
        recorded = await self.store.positions(self.app_id, self.topics.reports)
        earliest = await self.earliest_offsets(stalled) if self.earliest_offsets else {}
        for p in stalled:
            start = recorded[p][0] + 1 if p in recorded else earliest.get(p, 0)
            if ends.get(p, 0) > start:
                log.warning("partition %s: messages %s..%s wait and none was handled for %.0f s: seeking to %s again", p,
                            start, ends[p] - 1, now - self.progress_at[p], start)
                self.replay_from[p] = start
                self._reseeks.pop(p, None)
                self.reseek(p, start)
            self.progress_at[p] = now

    async def broker_lost(self, partitions: list[int], why: str) -> None:
        """An unrepairable broker loss: the ``unrepairable_loss`` alarm (``GET /status``), the metric, an error in
        the log, and every step not final yet marked incomplete: its final says ``complete: false``."""
        now = time.time()
        for p in partitions:
            self.alarms[f"unrepairable_loss:{p}"] = {"component": "kafka", "since": now, "error": (
                f"{why}; the counts of the steps not final yet may be short: their finals say complete=false")}
        self.metrics.unrepairable_losses_total.inc()
        log.error("unrepairable broker loss: %s; marking the steps not final yet incomplete", why)
        for c in self.campaigns.values():
            for attribute in c.attributes:
                ts = await self._retry(self.store.unfinished_steps, c.id, attribute)
                if ts:
                    await self._retry(self.store.mark_incomplete, c.id, attribute, ts, why)

    async def _check_redis_restart(self) -> None:
        """After Redis restarted, the positions it recorded must still reach what this worker handled: an AOF
        that lost its last second (``appendfsync everysec``) lost counts too, and the campaign epochs survive
        it. If a position is behind, those counts are replayed (as after a loss of the whole store)."""
        run_id = await self.store.server_id()
        previous, self._redis_run_id = self._redis_run_id, run_id
        if previous is None or previous == run_id:
            return
        handled = dict(self.last_offsets)
        recorded = await self.store.positions(self.app_id, self.topics.reports)
        behind = {p: (recorded[p][0] if p in recorded else None, last) for p, last in handled.items()
                  if p not in recorded or recorded[p][0] < last}
        log.warning("Redis restarted (server %s, was %s); positions behind what this worker handled: %s",
                    run_id, previous, behind or "none")
        if behind:
            p, (have, last) = next(iter(behind.items()))
            await self.store_lost("*", p, last, why=f"Redis restarted without its last writes: partition {p} is "
                                                    f"recorded at offset {have}, this worker had handled {last}")

    async def server_changed(self, campaign: str, partition: int, offset: int) -> bool:
        """Redis restarted since this worker last applied to ``campaign`` (:data:`SERVER_CHANGED`): compare what
        the store holds (the cursors of every campaign this worker applied to, and the positions) with what
        this worker applied since its assignment. If something is missing (an AOF that lost its last
        second, a failover to a replica that lagged), the positions of the partitions concerned are moved
        back to the last message the store still holds, and the stream is held and replayed from there
        (batch ids applied before are skipped); returns ``True``. Otherwise the new server is accepted."""
        store, topic = self.store, self.topics.reports
        lost: dict[int, tuple[int, str] | None] = {}  # partition -> last message the store holds (None: none)

        def lower(p: int, have: tuple[int, str] | None) -> None:
            if p not in lost or (lost[p] is not None and (have is None or have[0] < lost[p][0])):
                lost[p] = have

        for c in sorted({c for c, _ in self.applied_offsets}):
            cursors = await self._retry(store.cursors, c, self.app_id, topic)
            for (c2, p), last in self.applied_offsets.items():
                if c2 == c and (p not in cursors or cursors[p][0] < last):
                    lower(p, cursors.get(p))
        positions = await self._retry(store.positions, self.app_id, topic)
        for p, last in self.last_offsets.items():
            if p not in positions or positions[p][0] < last:
                lower(p, positions.get(p))
        if not lost:
            log.warning("Redis restarted (seen applying to campaign %r at partition %s offset %s); it holds "
                        "everything this worker applied", campaign, partition, offset)
            store.accept_server(campaign)
            return False
        for p, have in sorted(lost.items()):
            if have is None:
                await self._retry(store.forget_positions, self.app_id, topic, [p])
            elif p not in positions or positions[p][0] > have[0]:
                await self._retry(store.set_position, Position(self.app_id, topic, p, *have))
        detail = ", ".join(f"partition {p}: store holds up to {'nothing' if h is None else h[0]}, this worker "
                           f"applied up to {self.last_offsets.get(p)}" for p, h in sorted(lost.items()))
        await self.store_lost(campaign, partition, offset, why=f"Redis restarted without its last writes ({detail})")
        return True

    async def topic_recreated(self, partition: int, offset: int, ident: str) -> None:
        """The anchor of ``partition`` is gone: the broker lost the topic (an unrepairable loss: what it held
        and this worker had not handled is gone); replay every assigned partition's new incarnation from its
        start."""
        log.warning("partition %s: the message read at offset %s (%s) is not there any more: the topic was "
                    "recreated (a broker that lost its data); replaying its new incarnation from the start",
                    partition, offset, ident)
        self.metrics.topic_incarnations_total.inc()
        mine = sorted(set(self.anchors) | set(self.assigned) | {partition})
        await self.broker_lost(mine, f"the reports topic was recreated under this worker (partition {partition}: the "
                                     f"message read at offset {offset} is gone)")
        self.resyncing = True
        await self._retry(self.store.forget_positions, self.app_id, self.topics.reports, mine)
        await self._request_replay()

    async def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Where each partition of the reports topic restarts: after the last message the store handled.

        The recorded message is looked up again in the topic (:attr:`fetch_ident`): if it is not there (the
        topic was recreated, its offsets restarted) the partition restarts at its first offset; if the store
        has no position (a new or emptied store) too. Messages the broker deleted before they were handled
        raise the ``unrepairable_loss`` alarm."""
        positions = await self._retry(self.store.positions, self.app_id, self.topics.reports)
        earliest = await self.earliest_offsets(partitions) if self.earliest_offsets else {}
        out: dict[int, int] = {}
        for p in partitions:
            first = earliest.get(p, 0)
            if p not in positions:
                out[p] = first
                continue
            offset, ident = positions[p]
            if offset + 1 < first:
                await self.broker_lost([p], f"partition {p}: offsets {offset + 1}..{first - 1} were deleted by the "
                                            f"broker before they were counted")
                out[p] = first
            elif offset + 1 == first or await self._recorded_message_is_there(p, offset, ident):
                out[p] = offset + 1
            else:
                log.warning("partition %s: the message recorded at offset %s (%s) is not in the topic any more "
                            "(the topic was recreated); replaying the partition from offset %s", p, offset,
                            ident, first)
                out[p] = first
        return out

    async def _after_watermark(self, campaign: str, attribute: str, t: int) -> None:
        await self.store.record_closed_at(campaign, attribute, t, time.time())
        await self.store.wake_estimator(self.app_id, campaign, attribute, t)

    async def _retry(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Redis must apply the batch: retry any store failure until it succeeds (never skip, never reject).

        While it fails, the ``store_retry`` problem makes the worker unhealthy. Once the worker stops
        (:meth:`begin_stop`) a failing call is abandoned with ``CancelledError``: the message is not
        recorded as handled in Redis, so it is delivered again after the restart and counted once."""
        if self.stopping.is_set() and (self.health.has("redis") or self.health.has("store_retry")):
            raise asyncio.CancelledError("the worker is stopping and Redis is unavailable")
        task = asyncio.current_task()
        if task is not None:
            self._store_calls.setdefault(task, time.monotonic())
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
                self._store_calls.pop(task, None)

    def begin_stop(self, grace: float = 1.0) -> None:
        """The worker was asked to stop (SIGTERM/SIGINT): failing store calls give up, and from now on a
        store call that has waited ``grace`` seconds for Redis (an unresponsive server) is cancelled."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self.health.fail("stopping", "worker", "shutting down", level=logging.INFO)
        loop = asyncio.get_running_loop()

        def cancel_stuck_calls() -> None:
            now = time.monotonic()
            for task, since in list(self._store_calls.items()):
                if now - max(since, stop_began) >= grace and not task.done():
                    log.warning("cancelling a store call that waited %.1f s for Redis at shutdown", now - since)
                    self._store_calls.pop(task, None)
                    task.cancel()
            if now - stop_began < 60.0:  # a worker that has not exited by then is past its watchdog anyway
                loop.call_later(grace / 4, cancel_stuck_calls)

        stop_began = time.monotonic()
        loop.call_later(grace / 4, cancel_stuck_calls)

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

    # ------------------------------------------------------------------ ready file
    def write_ready(self) -> None:
        """Write the ready file (JSON: pid, ports, assigned partitions) atomically, once serving."""
        if self.ready_file is None or not self.serving:
            return
        info = {"pid": os.getpid(), "app_id": self.app_id, "worker_id": self.worker_id,
                "web_host": self.web_host, "web_port": self.web_port,
                "web_url": f"http://{self.web_host}:{self.web_port}" if self.web_port else None,
                "topics": {"reports": self.topics.reports, "rejected": self.topics.rejected,
                           "estimates": self.topics.estimates},
                "assigned": sorted(self.assigned), "campaigns": sorted(self.campaigns), "ready_at": time.time()}
        tmp = self.ready_file.with_name(self.ready_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, self.ready_file)


def get_pipeline(app: faust.App) -> Pipeline:
    """The :class:`Pipeline` of an app made by :func:`create_app`."""
    return app.ldp  # type: ignore[attr-defined]


def _limit_fetch_wait(app: faust.App, seconds: float) -> None:
    """Make the worker consumer of ``app`` wait at most ``seconds`` in a fetch that finds no data.

    Faust creates its aiokafka consumer with a fixed ``fetch_max_wait_ms=1500``, and tansu answers a
    waiting fetch only when that wait is over, even if batches arrived meanwhile: the fewer
    partitions a worker owns (the more workers), the more often its batches sat there 1.5 s. The
    value is set on the consumer between its creation and its start (aiokafka reads it at start)."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    app.ldp_fetch_max_wait_ms = max(1, int(round(seconds * 1000)))  # type: ignore[attr-defined]
    create = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(create, "_ldp_fetch_wait", False):
        return

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        wait_ms = getattr(self.app, "ldp_fetch_max_wait_ms", None)  # apps not made by create_app: unchanged
        if wait_ms is not None:
            consumer._fetch_max_wait_ms = wait_ms
        return consumer
    _create_worker_consumer._ldp_fetch_wait = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]


def create_app(settings: WorkerSettings, *, campaigns: dict[str, Campaign] | None = None) -> faust.App:
    """Build one stream-app instance from its :class:`~stream_app.settings.WorkerSettings` (see the module doc).

    ``session_timeout`` (seconds) shortens the consumer-group session (heartbeat = a third of it,
    at most 3 s): a killed member then stops blocking the group's rejoin after that long instead
    of Faust's 60 s. ``web_port=None`` picks a free port; ``web_bind`` defaults to ``web_host``.
    ``ready_file`` receives JSON (pid, web port/url, assigned partitions) once the worker owns
    partitions and serves HTTP, and again after every rebalance. ``campaigns`` may replace
    ``campaign_paths``. ``topic_prefix`` renames the three topics (``{prefix}ldp.reports`` ...).
    The app's :class:`Pipeline` is ``get_pipeline(app)``.
    """
    s = settings
    campaign_paths, kafka_bootstrap, redis_url, app_id = s.campaign_paths, s.kafka_bootstrap, s.redis_url, s.app_id
    partitions, topic_prefix, refresh_seconds = s.partitions, s.topic_prefix, s.refresh_seconds
    session_timeout, data_dir, ready_file = s.session_timeout, s.data_dir, s.ready_file
    web_port, web_host, web_bind = s.web_port, s.web_host, s.web_bind
    stream_buffer_maxsize, consumer_max_fetch_size = s.stream_buffer_maxsize, s.consumer_max_fetch_size
    ingest_flush_seconds, ingest_max_reports = s.ingest_flush_seconds, s.ingest_max_reports
    if campaigns is None:
        campaigns = load_campaigns(list(campaign_paths))
    if not campaigns:
        raise ValueError("at least one campaign is required")
    topics = Topics.with_prefix(topic_prefix)
    port = web_port if web_port is not None else free_port()
    own_datadir = data_dir is None  # a temporary directory, removed at shutdown
    datadir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix=f"{app_id}-"))
    brokers = [f"kafka://{h.strip()}" for h in kafka_bootstrap.split(",") if h.strip()]
    conf: dict[str, Any] = dict(
        broker=brokers, store="memory://", topic_partitions=partitions, topic_replication_factor=1,
        web_enabled=True, web_port=port, web_host=web_host, web_bind=web_bind or web_host,
        web_application_options={"client_max_size": 32 * 1024 * 1024},  # POST /reports lists of 10k+
        web_stats_enabled=False, web_graph_enabled=False, web_router_enabled=False, web_tables_enabled=False,
        datadir=str(datadir), autodiscover=False, producer_acks=-1,
        stream_buffer_maxsize=stream_buffer_maxsize, consumer_max_fetch_size=consumer_max_fetch_size,
        producer_max_request_size=16 * 1024 * 1024, consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0, worker_redirect_stdouts=False,
        # no tables, so no standbys: with Faust's default of 1 its sticky assignor keeps up to
        # ceil(partitions / workers) per member, and a worker that joins later gets none; with 0
        # (and no changelog tables) Faust uses aiokafka's round-robin assignor: every worker up
        # to the partition count owns partitions
        table_standby_replicas=0,
        # SASL / TLS of the Kafka clients from LDP_KAFKA_* (wire.transport; the password is never logged)
        broker_credentials=KafkaSecurity.from_env().faust_credentials(),
    )
    if session_timeout is not None:
        conf.update(broker_session_timeout=float(session_timeout),
                    broker_heartbeat_interval=max(0.1, min(3.0, session_timeout / 3.0)),
                    broker_rebalance_timeout=max(float(session_timeout), 5.0),
                    broker_request_timeout=max(30.0, float(session_timeout) + 5.0))
    app = faust.App(app_id, **conf)
    _limit_fetch_wait(app, s.consumer_fetch_max_wait)
    pipe = Pipeline(campaigns, redis_url, app_id=app_id, topics=topics, refresh_seconds=refresh_seconds)
    pipe.web_port, pipe.web_host, pipe.ready_file = port, web_host, ready_file
    app.ldp = pipe  # type: ignore[attr-defined]

    # internal=True: Faust creates it with `partitions` before subscribing; otherwise the subscription
    # makes the broker auto-create it with its default partition count (4 on tansu), whatever `partitions` says
    reports_topic = app.topic(topics.reports, key_type=bytes, value_type=bytes, key_serializer="raw",
                              value_serializer="raw", partitions=partitions, internal=True)
    rejected_topic = app.topic(topics.rejected, key_type=bytes, key_serializer="raw", value_serializer="json",
                               partitions=partitions)
    estimates_topic = app.topic(topics.estimates, key_type=bytes, key_serializer="raw", value_serializer="json",
                                partitions=partitions)

    async def send_rejected(key: bytes | None, doc: dict[str, Any]) -> None:
        await rejected_topic.send(key=key, value=doc)

    async def send_estimate(key: bytes | None, doc: dict[str, Any]) -> None:
        fut = await estimates_topic.send(key=key, value=doc)
        await fut  # an estimate counts as published once the broker acknowledged it

    async def send_reports(key: bytes, value: bytes) -> Any:
        return await app.producer.send_and_wait(topics.reports, key, value, None, None, None)

    pipe.send_rejected, pipe.send_estimate, pipe.send_reports = send_rejected, send_estimate, send_reports

    def highwater(partition: int) -> int | None:
        try:
            return app.consumer.highwater(faust.types.TP(topics.reports, partition))
        except Exception:  # noqa: BLE001 - not known yet
            return None

    pipe.highwater = highwater
    reader = TopicReader(kafka_bootstrap, topics)

    async def earliest_offsets(partitions: list[int]) -> dict[int, int]:
        tps = [faust.types.TP(topics.reports, p) for p in partitions]
        found = await app.consumer.earliest_offsets(*tps)
        return {tp.partition: int(off) for tp, off in found.items() if off is not None}

    async def request_replay() -> None:
        """Make the consumer group rebalance: every worker then restarts at the store's positions."""
        thread = app.consumer._thread  # type: ignore[attr-defined]

        async def rejoin() -> None:
            thread._ensure_consumer()._coordinator.request_rejoin()

        await thread.call_thread(rejoin)

    pipe.earliest_offsets, pipe.fetch_ident, pipe.request_replay = earliest_offsets, reader.ident_at, request_replay
    pipe.stream_view = reader

    def reseek(partition: int, offset: int) -> None:
        """Seek ``partition`` to ``offset`` once Faust has recorded the message it is delivering (soon after)."""
        tp = faust.types.TP(topics.reports, partition)

        def later() -> None:
            app.consumer._read_offset[tp] = None  # type: ignore[attr-defined]
            asyncio.ensure_future(app.consumer.seek_wait({tp: offset}))
        asyncio.get_running_loop().call_soon(later)

    pipe.reseek = reseek

    @app.on_rebalance_complete.connect
    async def restore_positions(sender: Any, **kwargs: Any) -> None:
        # Faust seeks every assigned partition to its committed offset right after this signal: commit the
        # positions the store holds first, so the stream restarts after the last message counted in Redis
        # (state and position together), whatever Kafka's own commits say.
        tps = [tp for tp in app.consumer.assignment() if tp.topic == topics.reports]
        pipe.store.forget_epochs()
        if tps:
            targets = await pipe.start_offsets(sorted(tp.partition for tp in tps))
            await app.consumer._commit({tp: targets[tp.partition] for tp in tps})  # type: ignore[attr-defined]
            # aiokafka's seek_to_committed leaves a committed offset of 0 alone: seek ourselves, in the consumer's
            # thread (seek_wait runs there, between fetches; Consumer.seek would race the fetcher)
            await app.consumer.seek_wait({tp: targets[tp.partition] for tp in tps})
            for tp in tps:  # Faust drops offsets below the last it delivered: the replay starts lower
                app.consumer._read_offset[tp] = None  # type: ignore[attr-defined]
            pipe.replay_from, pipe._reseeks = {tp.partition: targets[tp.partition] for tp in tps}, {}
            pipe.progress_at = {tp.partition: time.monotonic() for tp in tps}
            log.info("restored positions from the store: %s", {tp.partition: targets[tp.partition] for tp in tps})
        pipe.last_offsets, pipe.applied_offsets, pipe.anchors = {}, {}, {}
        try:  # the Redis server whose positions were just read: a later restart is checked against it
            pipe._redis_run_id = await pipe.store.server_id()
        except RETRYABLE_ERRORS:
            pipe._redis_run_id = None
        if pipe.resyncing:
            pipe.resyncing = False
            alarm = pipe.alarms.get("store_reset")
            if alarm is not None:  # the replay runs: the alarm stays listed in /status, the worker is healthy
                alarm.update(blocking=False, replay_started_at=time.time())
            log.warning("replaying the reports topic from the store's positions")

    @app.agent(reports_topic, concurrency=1)
    async def count_reports(stream: faust.StreamT) -> None:
        # concurrency=1: messages of one partition are handled in offset order, so the position recorded in
        # Redis after each one never passes a message that was not handled (and a watermark never overtakes
        # the batches of its step)
        async for event in stream.events():
            msg = event.message
            await pipe.process(msg.value, msg.partition, msg.offset, msg.key, msg.timestamp)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: Any = None, **kwargs: Any) -> None:
        pipe.assigned = sorted(tp.partition for tp in (assigned or ()) if tp.topic == topics.reports)
        pipe.forget_partitions(set(pipe.assigned))
        pipe.write_ready()
        log.warning("ldp worker %s owns %s partitions %s; web http://%s:%s", pipe.worker_id, topics.reports,
                    pipe.assigned, web_host, port)

    ingest = Batcher(campaigns, send_reports, linger_seconds=ingest_flush_seconds, max_reports=ingest_max_reports,
                     on_published=lambda c, a, n: pipe.metrics.http_reports_total.labels(c, a).inc(n))

    @app.service
    class LdpService(mode.Service):
        """Declares the topics, runs the estimator loop; at stop, publishes what POST /reports batched."""

        async def on_start(self) -> None:
            for topic in (reports_topic, rejected_topic, estimates_topic):
                await topic.maybe_declare()
            pipe.warm_up()
            # Faust starts services after the first assignment and after the web server
            pipe.serving = True
            pipe.write_ready()
            add_worker_probes(pipe.health, redis_ping=lambda: pipe.store.redis.ping(), kafka_bootstrap=kafka_bootstrap,
                              rebalancing=lambda: bool(app.rebalancing),
                              rebalance_limit=max(30.0, 3.0 * (session_timeout or 10.0)))
            pipe.health.clear("starting", level=logging.INFO)
            self._est_task = asyncio.ensure_future(pipe.estimator.run())
            self._health_task = asyncio.ensure_future(pipe.health.run())
            self._incarnation_task = asyncio.ensure_future(pipe.watch_incarnations())

        async def on_stop(self) -> None:
            pipe.serving = False
            pipe.begin_stop()
            pipe.health.stop()
            pipe.estimator.stop()
            try:  # reports waiting for an unreachable broker get 503 (their devices retry)
                await asyncio.wait_for(ingest.stop(), 5.0)
            except asyncio.TimeoutError:
                log.warning("the HTTP ingest queue could not be flushed to the broker within 5 s")
            # the estimator releases its lease in Redis: do not wait long for an unreachable one, nor
            # for a cancelled task whose clean-up waits for it
            redis_down = pipe.health.has("redis") or pipe.health.has("store_retry")
            tasks = (self._est_task, self._health_task, self._incarnation_task)
            _, pending = await asyncio.wait(tasks, timeout=0.25 if redis_down else 5.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=0.5)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.error("stream-app service task failed", exc_info=task.exception())
            for close in (pipe.close, reader.close):
                try:
                    await asyncio.wait_for(close(), 2.0)
                except Exception:  # noqa: BLE001 - shutting down: report and go on
                    log.exception("closing a client at shutdown failed (Redis or the broker unreachable?)")
            if own_datadir:
                shutil.rmtree(datadir, ignore_errors=True)

    register(app, WebContext(
        campaigns=campaigns, status=pipe.status, render_metrics=pipe.metrics.render,
        latest_estimate=lambda c, a: pipe.store.latest_estimate_json(c, a),
        estimate_history=lambda c, a: pipe.store.estimates(c, a),
        reject=pipe.reject, submit=ingest.submit, store=pipe.store, registry=pipe.metrics.registry,
        open_reports=s.open_reports))
    return app
