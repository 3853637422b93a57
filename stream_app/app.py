"""The Faust application: the counting agent on ``ldp.reports`` and the services around it.

``create_app(...)`` builds one app instance (one worker). Several instances with the same ``app_id``
(separate processes) form one consumer group and share the partitions of ``ldp.reports``. This module is
the thin Faust layer; the parts it wires together have no Faust dependency:

* :class:`stream_app.pipeline.Pipeline`, the hot path: each message is decoded, validated, counted and applied
  to Redis by one Lua script that skips a batch id already applied to its step (a producer's retry or resume,
  Faust's at-least-once redelivery after a crash, a rebalance, a commit that did not happen, a replay) and
  records the message's consumer position with the counts;
* :class:`stream_app.recovery.Recovery`, the loss checks (epoch, Redis run id, cursors, anchors, replay),
  called on assignment (:meth:`~stream_app.recovery.Recovery.on_assignment`), from the hot path on a loss
  answer of the store, and every 2 s (:meth:`~stream_app.recovery.Recovery.watch`);
* :class:`stream_app.consumer.FaustConsumer`, the consumer positions (the only code that touches Faust's and
  aiokafka's consumer internals);
* :class:`stream_app.windows.Estimator`, the windowed estimator, and the web views (:mod:`stream_app.api`).

:class:`Worker` holds them, constructed complete; ``get_worker(app)`` returns the app's.
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
from typing import Any

import faust
import mode

from wire.campaign import Campaign, load_campaigns
from wire.topics import Topics, estimate_key
from wire.transport import KafkaSecurity

from .api import WebContext, register
from .broker import TopicReader
from .consumer import FaustConsumer, limit_fetch_wait
from .health import Health, add_worker_probes
from .metrics import Metrics
from .pipeline import Pipeline, SendJson, StoreCalls
from .publisher import EstimatePublisher
from .recovery import BrokerView, ConsumerControl, Recovery
from .settings import WorkerSettings, free_port
from .store import CountStore
from .windows import Estimator, StreamView

__all__ = ["Worker", "create_app", "get_worker"]

log = logging.getLogger(__name__)


class Worker:
    """One app instance outside Faust: campaigns, count store, metrics, health, pipeline, recovery, estimator.

    Everything is built here from the arguments; the Faust layer (:func:`create_app`) passes its consumer
    (``consumer``), the broker reader (``broker``) and the two topic senders. Without them (tools and tests
    driving a store alone) rejections and estimates are only counted, and the broker checks are skipped.
    """

    def __init__(self, campaigns: dict[str, Campaign], redis_url: str, *, app_id: str, topics: Topics,
                 refresh_seconds: float = 1.0, worker_id: str | None = None,
                 consumer: "FaustConsumer | ConsumerControl | None" = None,
                 broker: "TopicReader | BrokerView | None" = None,
                 send_rejected: SendJson | None = None, send_estimate: SendJson | None = None,
                 web_host: str = "127.0.0.1", web_port: int | None = None, ready_file: Path | None = None,
                 per_value_metrics: bool = False, per_value_metrics_max_k: int = 1000) -> None:
        self.campaigns, self.app_id, self.topics = campaigns, app_id, topics
        self.worker_id = worker_id or f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.web_host, self.web_port, self.ready_file = web_host, web_port, ready_file
        self.serving = False  # the web server and the services are up (set by the LdpService)
        self.metrics = Metrics(per_value_metrics=per_value_metrics, per_value_metrics_max_k=per_value_metrics_max_k)
        self.alarms: dict[str, dict[str, Any]] = {}  # name -> {component, since, error}: shown by /status
        # what keeps this worker from progressing (GET /health, ldp_worker_healthy); an alarm with
        # "blocking": True counts too (stream_app/health.py)
        self.health = Health(self.metrics, [self.alarms])
        self.health.fail("starting", "worker", "waiting for the first partition assignment and the warm-up",
                         level=logging.INFO)
        self.store = CountStore.from_url(redis_url)
        self.calls = StoreCalls(self.health, self.metrics)
        self.recovery = Recovery(campaigns, self.store, self.metrics, self.health, self.alarms, calls=self.calls,
                                 app_id=app_id, topic=topics.reports, consumer=consumer, broker=broker)
        highwater = consumer.highwater if isinstance(consumer, FaustConsumer) else None
        self.pipeline = Pipeline(campaigns, self.store, self.metrics, calls=self.calls, recovery=self.recovery,
                                 app_id=app_id, topics=topics, worker_id=self.worker_id, send_rejected=send_rejected,
                                 highwater=highwater)
        self._send_estimate = send_estimate
        stream: StreamView | None = broker if isinstance(broker, TopicReader) else None
        self.estimator = Estimator(campaigns, self.store, self.metrics, self._publish_estimate, app_id=app_id,
                                   worker_id=self.worker_id, refresh_seconds=refresh_seconds, stream=stream,
                                   reports_topic=topics.reports)

    async def _publish_estimate(self, doc: dict[str, Any]) -> None:
        if self._send_estimate is not None:
            await self._send_estimate(estimate_key(doc["campaign"], doc["attribute"], doc["t"]), doc)

    async def step_counts(self, campaign: str, attribute: str, t: int) -> tuple[Any, int]:
        """Step ``t``'s support counts and ``n`` (zeros and 0 for a step without reports)."""
        proto = self.campaigns[campaign].attributes[attribute].protocol
        state = await self.store.read_step(campaign, attribute, t, proto.support_size)
        return state["counts"], int(state["n"])

    def status(self) -> dict[str, Any]:
        """This worker for ``GET /status``: ids, assigned partitions, estimator lease, messages processed,
        ``healthy`` and the ``problems`` that keep it from progressing (:mod:`stream_app.health`)."""
        est, problems = self.estimator, self.health.problems()
        return {"worker_id": self.worker_id, "app_id": self.app_id, "assigned": self.recovery.assigned,
                "estimator_leader": bool(est.is_leader), "processed": self.pipeline.processed,
                "web_port": self.web_port, "replaying": self.recovery.holding,
                "alarms": [{"name": k, **v} for k, v in {**self.alarms, **est.alarms}.items()],
                "healthy": not problems, "problems": problems}

    def on_assigned(self, partitions: list[int]) -> None:
        """The consumer owns ``partitions`` of the reports topic now (before the rebalance completes)."""
        self.recovery.assigned = sorted(partitions)
        self.pipeline.forget_partitions(set(partitions))
        self.write_ready()

    def begin_stop(self, grace: float = 1.0) -> None:
        """SIGTERM/SIGINT: store calls stop retrying (:meth:`stream_app.pipeline.StoreCalls.begin_stop`)."""
        self.calls.begin_stop(grace)

    async def close(self) -> None:
        await self.store.close()

    def write_ready(self) -> None:
        """Write the ready file (JSON: pid, ports, assigned partitions) atomically, once serving."""
        if self.ready_file is None or not self.serving:
            return
        info = {"pid": os.getpid(), "app_id": self.app_id, "worker_id": self.worker_id,
                "web_host": self.web_host, "web_port": self.web_port,
                "web_url": f"http://{self.web_host}:{self.web_port}" if self.web_port else None,
                "topics": {"reports": self.topics.reports, "rejected": self.topics.rejected,
                           "estimates": self.topics.estimates},
                "assigned": sorted(self.recovery.assigned), "campaigns": sorted(self.campaigns),
                "ready_at": time.time()}
        tmp = self.ready_file.with_name(self.ready_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, self.ready_file)


def get_worker(app: faust.App) -> Worker:
    """The :class:`Worker` of an app made by :func:`create_app`."""
    return app.ldp  # type: ignore[attr-defined]


def _faust_conf(s: WorkerSettings, port: int, datadir: Path) -> dict[str, Any]:
    """The Faust settings of one worker."""
    brokers = [f"kafka://{h.strip()}" for h in s.kafka_bootstrap.split(",") if h.strip()]
    conf: dict[str, Any] = dict(
        broker=brokers, store="memory://", topic_partitions=s.partitions, topic_replication_factor=1,
        web_enabled=True, web_port=port, web_host=s.web_host, web_bind=s.web_bind or s.web_host,
        web_stats_enabled=False, web_graph_enabled=False, web_router_enabled=False, web_tables_enabled=False,
        datadir=str(datadir), autodiscover=False, producer_acks=-1,
        stream_buffer_maxsize=s.stream_buffer_maxsize, consumer_max_fetch_size=s.consumer_max_fetch_size,
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
    if s.session_timeout is not None:
        conf.update(broker_session_timeout=float(s.session_timeout),
                    broker_heartbeat_interval=max(0.1, min(3.0, s.session_timeout / 3.0)),
                    broker_rebalance_timeout=max(float(s.session_timeout), 5.0),
                    broker_request_timeout=max(30.0, float(s.session_timeout) + 5.0))
    return conf


def create_app(settings: WorkerSettings, *, campaigns: dict[str, Campaign] | None = None) -> faust.App:
    """Build one stream-app instance from its :class:`~stream_app.settings.WorkerSettings` (see the module doc).

    ``session_timeout`` (seconds) shortens the consumer-group session (heartbeat = a third of it,
    at most 3 s): a killed member then stops blocking the group's rejoin after that long instead
    of Faust's 60 s. ``web_port=None`` picks a free port; ``web_bind`` defaults to ``web_host``.
    ``ready_file`` receives JSON (pid, web port/url, assigned partitions) once the worker owns
    partitions and serves HTTP, and again after every rebalance. ``campaigns`` may replace
    ``campaign_paths``. ``topic_prefix`` renames the three topics (``{prefix}ldp.reports`` ...).
    The app's :class:`Worker` is ``get_worker(app)``.
    """
    s = settings
    if campaigns is None:
        campaigns = load_campaigns(list(s.campaign_paths))
    if not campaigns:
        raise ValueError("at least one campaign is required")
    topics = Topics.with_prefix(s.topic_prefix)
    port = s.web_port if s.web_port is not None else free_port()
    own_datadir = s.data_dir is None  # a temporary directory, removed at shutdown
    datadir = Path(s.data_dir) if s.data_dir is not None else Path(tempfile.mkdtemp(prefix=f"{s.app_id}-"))
    app = faust.App(s.app_id, **_faust_conf(s, port, datadir))
    limit_fetch_wait(app, s.consumer_fetch_max_wait)

    # internal=True: Faust creates it with `partitions` before subscribing; otherwise the subscription
    # makes the broker auto-create it with its default partition count (4 on tansu), whatever `partitions` says
    reports_topic = app.topic(topics.reports, key_type=bytes, value_type=bytes, key_serializer="raw",
                              value_serializer="raw", partitions=s.partitions, internal=True)
    rejected_topic = app.topic(topics.rejected, key_type=bytes, key_serializer="raw", value_serializer="json",
                               partitions=s.partitions)
    # declared here (created with `estimates_partitions` at start, as compose's kafka-init creates it); written by
    # the EstimatePublisher below
    estimates_topic = app.topic(topics.estimates, key_type=bytes, key_serializer="raw", value_serializer="json",
                                partitions=s.estimates_partitions)

    async def send_rejected(key: bytes | None, doc: dict[str, Any]) -> None:
        await rejected_topic.send(key=key, value=doc)

    # estimates go out one produce request each, never resent behind the estimator's back (stream_app.publisher);
    # an estimate counts as published once the broker acknowledged it
    publisher = EstimatePublisher(s.kafka_bootstrap, topics.estimates, partitions=s.estimates_partitions)

    async def send_estimate(key: bytes | None, doc: dict[str, Any]) -> None:
        await publisher.send(key, doc)

    consumer = FaustConsumer(app, topics.reports)
    reader = TopicReader(s.kafka_bootstrap, topics)
    worker = Worker(campaigns, s.redis_url, app_id=s.app_id, topics=topics, refresh_seconds=s.refresh_seconds,
                    consumer=consumer, broker=reader, send_rejected=send_rejected, send_estimate=send_estimate,
                    web_host=s.web_host, web_port=port, ready_file=s.ready_file,
                    per_value_metrics=s.per_value_metrics, per_value_metrics_max_k=s.per_value_metrics_max_k)
    app.ldp = worker  # type: ignore[attr-defined]
    pipeline = worker.pipeline

    @app.on_rebalance_complete.connect
    async def restore_positions(sender: Any, **kwargs: Any) -> None:
        # Faust seeks every assigned partition to its committed offset right after this signal: the
        # recovery moves the consumer to the store's positions first (FaustConsumer.move_to)
        await worker.recovery.on_assignment(consumer.assigned())

    @app.agent(reports_topic, concurrency=1)
    async def count_reports(stream: faust.StreamT) -> None:
        # concurrency=1: messages of one partition are handled in offset order, so the position recorded in
        # Redis after each one never passes a message that was not handled (and a watermark never overtakes
        # the batches of its step)
        async for event in stream.events():
            msg = event.message
            await pipeline.process(msg.value, msg.partition, msg.offset, msg.key, msg.timestamp)

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: Any = None, **kwargs: Any) -> None:
        worker.on_assigned([tp.partition for tp in (assigned or ()) if tp.topic == topics.reports])
        log.warning("ldp worker %s owns %s partitions %s; web http://%s:%s", worker.worker_id, topics.reports,
                    worker.recovery.assigned, s.web_host, port)

    @app.service
    class LdpService(mode.Service):
        """Declares the topics, runs the estimator loop, the health probes and the periodic loss checks."""

        async def on_start(self) -> None:
            for topic in (reports_topic, rejected_topic, estimates_topic):
                await topic.maybe_declare()
            try:  # connected before this worker may hold the lease (Faust's own producer is, at its start)
                await asyncio.wait_for(publisher.start(), 5.0)
            except Exception as exc:  # noqa: BLE001 - the broker away at start: the first estimate connects
                log.info("the estimate publisher could not connect at start (%s); it connects on first use", exc)
            pipeline.warm_up()
            # Faust starts services after the first assignment and after the web server
            worker.serving = True
            worker.write_ready()
            add_worker_probes(worker.health, redis_ping=lambda: worker.store.redis.ping(),
                              kafka_bootstrap=s.kafka_bootstrap, rebalancing=lambda: bool(app.rebalancing),
                              rebalance_limit=max(30.0, 3.0 * (s.session_timeout or 10.0)))
            worker.health.clear("starting", level=logging.INFO)
            self._tasks = (asyncio.ensure_future(worker.estimator.run()), asyncio.ensure_future(worker.health.run()),
                           asyncio.ensure_future(worker.recovery.watch()))

        async def on_stop(self) -> None:
            worker.serving = False
            worker.begin_stop()
            worker.health.stop()
            worker.estimator.stop()
            # the estimator releases its lease in Redis: do not wait long for an unreachable one, nor
            # for a cancelled task whose clean-up waits for it
            redis_down = worker.health.has("redis") or worker.health.has("store_retry")
            tasks = self._tasks
            _, pending = await asyncio.wait(tasks, timeout=0.25 if redis_down else 5.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=0.5)
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.error("stream-app service task failed", exc_info=task.exception())
            for close in (worker.close, reader.close, publisher.close):
                try:
                    await asyncio.wait_for(close(), 2.0)
                except Exception:  # noqa: BLE001 - shutting down: report and go on
                    log.exception("closing a client at shutdown failed (Redis or the broker unreachable?)")
            if own_datadir:
                shutil.rmtree(datadir, ignore_errors=True)

    register(app, WebContext(
        campaigns=campaigns, status=worker.status, render_metrics=worker.metrics.render,
        latest_estimate=lambda c, a: worker.store.latest_estimate_json(c, a),
        estimate_history=lambda c, a: worker.store.estimates(c, a),
        step_counts=worker.step_counts))
    return app
