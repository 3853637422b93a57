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

import faust
import mode
import numpy as np

from wire import envelope
from wire.campaign import Campaign, load_campaigns
from wire.errors import BadPayload, EnvelopeError, MalformedBatch
from wire.topics import Topics, estimate_key

from .api import HttpIngest, WebContext, register
from .metrics import Metrics
from .settings import WorkerSettings, free_port
from .store import APPLIED, DUPLICATE_BATCH_ID, DUPLICATE_OFFSET, RETRYABLE_ERRORS, CountStore
from .windows import Estimator

__all__ = ["Pipeline", "create_app", "get_pipeline"]

# A batch the store skipped: the metric's reason label and what it means (for the one warning per attribute).
_DUPLICATES = {
    DUPLICATE_BATCH_ID: ("batch_id", "a re-sent batch (its batch id was already applied: a producer retry or resume)"),
    DUPLICATE_OFFSET: ("offset", "an already-applied offset (a redelivery after a crash or rebalance, or a "
                                 "recreated topic whose offsets restarted while Redis kept the old ones: then "
                                 "clear Redis)"),
}

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
        self._dup_warned: set[tuple[str, str, str]] = set()
        self.processed = 0
        self._store: CountStore | None = None
        self._estimator: Estimator | None = None
        self._lag_children: dict[int, tuple[Any, Any]] = {}
        self._ca_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}

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
                                        refresh_seconds=self.refresh_seconds)
        return self._estimator

    def status(self) -> dict[str, Any]:
        """This worker for ``GET /status``: ids, assigned partitions, estimator lease, messages processed."""
        est = self._estimator
        return {"worker_id": self.worker_id, "app_id": self.app_id, "assigned": self.assigned,
                "estimator_leader": bool(est and est.is_leader), "processed": self.processed,
                "web_port": self.web_port}

    async def _publish_estimate(self, doc: dict[str, Any]) -> None:
        if self.send_estimate is not None:
            await self.send_estimate(estimate_key(doc["campaign"], doc["attribute"], doc["t"]), doc)

    def warm_up(self) -> None:
        """Compile the numba support kernels before the first batch arrives."""
        for c in self.campaigns.values():
            for a in c.attributes.values():
                p = a.protocol
                values = np.zeros(4, dtype=np.int64)
                reports = p.randomize(values, None, state=p.new_state(4))
                p.support(p.decode(p.encode(reports)))
                p.estimate(p.support(reports), 4)

    async def close(self) -> None:
        if self._store is not None:
            await self._store.close()
            self._store = None

    # ------------------------------------------------------------------ the hot path
    async def process(self, value: bytes | None, partition: int, offset: int, key: bytes | None = None,
                      timestamp: float | None = None) -> str:
        """Apply one Kafka message; returns ``"applied" | "duplicate" | "watermark" | "empty" | "rejected"``."""
        self.processed += 1
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
                return "empty"
            else:
                reports = envelope.decode_reports(env, campaign)
                counts = campaign.attributes[env.attribute].protocol.support(reports)
        except EnvelopeError as exc:
            await self.reject(exc.reason, exc.detail, partition=partition, offset=offset, key=key, env=env,
                              size=len(value) if value is not None else 0)
            return "rejected"
        except Exception as exc:  # noqa: BLE001 - a batch that breaks the decoder is never counted
            log.exception("unexpected error while decoding the batch at partition %s offset %s", partition, offset)
            await self.reject(BadPayload.reason, f"unexpected {type(exc).__name__}: {exc}", partition=partition,
                              offset=offset, key=key, env=env, size=len(value) if value is not None else 0)
            return "rejected"
        c_reports, c_batches, c_dups = self._ca(env.campaign, env.attribute)
        if counts is None:
            applied = await self._retry(self.store.apply_watermark, env.campaign, env.attribute, env.t,
                                        partition, offset)
            if applied:
                self.metrics.watermarks_total.labels(env.campaign, env.attribute).inc()
                await self._retry(self._after_watermark, env.campaign, env.attribute, env.t)
            return "watermark"
        status = await self._retry(self.store.apply_batch_status, env.campaign, env.attribute, env.t, partition,
                                   offset, counts, env.count, env.batch_id)
        applied = status == APPLIED
        if applied:
            c_reports.inc(env.count)
            c_batches.inc()
            self.metrics.count_reports(env.count)
        else:
            reason, why = _DUPLICATES[status]
            c_dups[status].inc()
            if (env.campaign, env.attribute, reason) not in self._dup_warned:
                self._dup_warned.add((env.campaign, env.attribute, reason))
                log.warning("skipped %s of %s/%s (batch id %r, partition %s offset %s); further skips are only "
                            "counted in ldp_duplicate_batches_total{reason=%r}", why, env.campaign, env.attribute,
                            env.batch_id, partition, offset, reason)
        return "applied" if applied else "duplicate"

    async def _after_watermark(self, campaign: str, attribute: str, t: int) -> None:
        await self.store.record_closed_at(campaign, attribute, t, time.time())
        await self.store.wake_estimator(self.app_id, campaign, attribute, t)

    async def _retry(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Redis must apply the batch: retry any store failure forever (never skip, never reject)."""
        delay = 0.1
        while True:
            try:
                return await fn(*args)
            except RETRYABLE_ERRORS as exc:
                log.warning("redis unavailable (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)

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
                {status: m.duplicate_batches_total.labels(campaign, attribute, reason)
                 for status, (reason, _) in _DUPLICATES.items()})
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
    )
    if session_timeout is not None:
        conf.update(broker_session_timeout=float(session_timeout),
                    broker_heartbeat_interval=max(0.1, min(3.0, session_timeout / 3.0)),
                    broker_rebalance_timeout=max(float(session_timeout), 5.0),
                    broker_request_timeout=max(30.0, float(session_timeout) + 5.0))
    app = faust.App(app_id, **conf)
    pipe = Pipeline(campaigns, redis_url, app_id=app_id, topics=topics, refresh_seconds=refresh_seconds)
    pipe.web_port, pipe.web_host, pipe.ready_file = port, web_host, ready_file
    app.ldp = pipe  # type: ignore[attr-defined]

    reports_topic = app.topic(topics.reports, key_type=bytes, value_type=bytes, key_serializer="raw",
                              value_serializer="raw", partitions=partitions)
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

    @app.agent(reports_topic, concurrency=1)
    async def count_reports(stream: faust.StreamT) -> None:
        # concurrency=1: batches of one partition must be applied in offset order (the store's
        # offset check would otherwise skip an earlier batch that is applied after a later one)
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

    ingest = HttpIngest(campaigns, send_reports, pipe.metrics, flush_seconds=ingest_flush_seconds,
                        max_reports=ingest_max_reports)

    @app.service
    class LdpService(mode.Service):
        """Declares the topics, runs the estimator loop and the HTTP ingest flusher."""

        async def on_start(self) -> None:
            for topic in (reports_topic, rejected_topic, estimates_topic):
                await topic.maybe_declare()
            pipe.warm_up()
            # Faust starts services after the first assignment and after the web server
            pipe.serving = True
            pipe.write_ready()
            self._est_task = asyncio.ensure_future(pipe.estimator.run())
            self._ingest_task = asyncio.ensure_future(ingest.run())

        async def on_stop(self) -> None:
            pipe.serving = False
            pipe.estimator.stop()
            await ingest.stop()
            for task in (self._est_task, self._ingest_task):
                try:
                    await asyncio.wait_for(task, 5.0)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    task.cancel()
                except Exception:  # noqa: BLE001
                    log.exception("stream-app service task failed")
            await pipe.close()
            if own_datadir:
                shutil.rmtree(datadir, ignore_errors=True)

    register(app, WebContext(
        campaigns=campaigns, status=pipe.status, render_metrics=pipe.metrics.render,
        latest_estimate=lambda c, a: pipe.store.latest_estimate_json(c, a),
        estimate_history=lambda c, a: pipe.store.estimates(c, a),
        reject=pipe.reject, submit=ingest.submit))
    return app
