"""``ldp ingest``: the stateless HTTP ingest of single device reports, several processes on one port.

Routes: ``POST /reports`` (:class:`~stream_app.ingest.handler.ReportHandler`: the whole request life),
``GET /health`` (200 ``{"healthy": true}`` while Redis answers and the producer runs, else 503 with the
problems), ``GET /metrics`` (Prometheus, summed over the processes: :mod:`.metrics`).

HTTP stack: this package's own small HTTP/1.1 server (:mod:`.http`: httptools' parser on the process's
uvloop event loop, one thread) and pre-fork supervisor (:mod:`.prefork`: ``--processes N`` forks N
processes that each listen on the port with ``SO_REUSEPORT``). Measured side by side in one
``ldp bench ingest -w binary -w json`` run each on the 2-core development machine, 2 processes, the same
handler (2026-11-25):

============================  ===================  ============  ====================  ============
server                        binary saturation    half p99      json saturation       half p99
============================  ===================  ============  ====================  ============
granian 2.8 RSGI + uvloop     14,128 req/s (100)   51.2 ms       14,217 req/s (98)     43.4 ms
:mod:`.http` + uvloop         14,924 req/s (84)    32.9 ms       16,578 req/s (71)     15.0 ms
============================  ===================  ============  ====================  ============

(in brackets: the ingest's CPU µs per request). At a fixed 5,000 requests/s the ingest spent 194-197 µs of
CPU per request under granian against 125-155 µs here. granian had been chosen over aiohttp, uvicorn and
its own ASGI mode, on a trivial handler, for its throughput (31-35k requests/s against 11-18k for uvicorn and
8-15k for aiohttp); what it costs at moderate load is the hand-off of each request from its Rust thread to
the event loop and of each answer back (wake-ups, GIL hand-offs), and at half saturation the two cores were
90% busy. Here a readable socket is parsed in the event loop's own callback and a request is one task.

All shared state (rate-limit slots, idempotency records) is in Redis, so the processes, and any number of
hosts behind a load balancer, are interchangeable. SIGTERM (the supervisor forwards it to every process):
a process stops accepting, waits up to ``shutdown_timeout`` for the requests in flight (each answered once
the broker acknowledged its reports), publishes what its batcher holds, and closes its producer and Redis
client.
"""
from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from wire.campaign import Campaign, load_campaigns
from wire.topics import Topics
from wire.transport import kafka_client_options

from ..settings import SettingsError
from ..store import RETRYABLE_ERRORS, CountStore
from .auth import DeviceSecret, TokenAuthority
from .batcher import Batcher
from .handler import BodyTooLarge, HandlerLimits, ReadBody, ReportHandler
from .http import HttpLimits, HttpServer, Request, Response
from .limits import RequestLedger
from .metrics import MULTIPROC_ENV, IngestMetrics, render, use_multiprocess_values
from .prefork import run_processes
from .settings import IngestSettings

__all__ = ["IngestApp", "create_app", "serve"]

log = logging.getLogger(__name__)

_JSON = ("content-type", "application/json")
_STARTUP_SECONDS = 30.0


def _handler_limits(s: IngestSettings) -> HandlerLimits:
    return HandlerLimits(max_body_bytes=s.max_body_bytes, max_device_reports=s.max_device_reports,
                         max_relay_reports=s.max_relay_reports, max_open_reports=s.max_relay_reports,
                         max_late_seconds=s.max_late_seconds, max_early_seconds=s.max_early_seconds)


class IngestApp:
    """The ingest of one server process: :meth:`start`, :meth:`route` per request (the HTTP server's
    handler), :meth:`stop`."""

    def __init__(self, settings: IngestSettings, *, secret: DeviceSecret | None,
                 campaigns: dict[str, Campaign] | None = None) -> None:
        if secret is None and not settings.open_mode:
            raise SettingsError("the ingest needs the device-token secret (LDP_DEVICE_SECRET or LDP_DEVICE_SECRET_FILE; "
                                "`ldp tokens new-secret` makes one), or --open for development")
        self.settings = settings
        self.authority = TokenAuthority(secret) if secret is not None and not settings.open_mode else None
        self.campaigns = campaigns if campaigns is not None else load_campaigns(list(settings.campaign_paths))
        self.topics = Topics.with_prefix(settings.topic_prefix)
        self.registry: Any = None
        self.metrics: IngestMetrics | None = None
        self.handler: ReportHandler | None = None
        self.batcher: Batcher | None = None
        self.store: CountStore | None = None
        self.producer: Any = None
        self._stopping = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Connect the producer (retrying for a while: the broker may start after us) and Redis."""
        from aiokafka import AIOKafkaProducer
        from prometheus_client import CollectorRegistry

        s = self.settings
        use_multiprocess_values()
        self.registry = CollectorRegistry()
        self.metrics = IngestMetrics(None if os.environ.get(MULTIPROC_ENV) else self.registry)
        self.store = CountStore.from_url(s.redis_url)
        deadline = time.monotonic() + _STARTUP_SECONDS
        while True:
            producer = AIOKafkaProducer(bootstrap_servers=s.kafka_bootstrap, acks="all", linger_ms=0,
                                        max_request_size=16 << 20, request_timeout_ms=int(s.publish_timeout * 1000),
                                        **kafka_client_options())
            try:
                await producer.start()
                break
            except Exception as exc:  # noqa: BLE001 - the broker may not be up yet
                await producer.stop()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the ingest cannot reach the broker at {s.kafka_bootstrap}: {exc}") from exc
                await asyncio.sleep(0.5)
        self.producer = producer
        topic = self.topics.reports

        async def send_reports(key: bytes, value: bytes) -> Any:
            return await producer.send_and_wait(topic, value=value, key=key)

        self.batcher = Batcher(self.campaigns, send_reports, linger_seconds=s.linger_seconds,
                               max_reports=s.max_batch_reports)
        ledger = RequestLedger(self.store, idempotency_seconds=s.idempotency_seconds,
                               lease_seconds=s.publish_timeout + 5.0)
        self.handler = ReportHandler(self.campaigns, self.batcher.submit, self.metrics, authority=self.authority,
                                     ledger=ledger, limits=_handler_limits(s))
        if self.authority is None:
            log.warning("ldp ingest in OPEN mode: reports are accepted without a credential and without rate "
                        "limits (development only)")

    async def stop(self) -> None:
        """Publish what the batcher holds and close the clients (the HTTP server has already waited, at most
        ``shutdown_timeout``, for the requests in flight)."""
        self._stopping = True
        if self.batcher is not None:
            try:
                await asyncio.wait_for(self.batcher.stop(), self.settings.publish_timeout)
            except asyncio.TimeoutError:
                log.warning("the batcher could not publish to the broker within %.1f s", self.settings.publish_timeout)
        for close in (self.producer.stop if self.producer else None, self.store.close if self.store else None):
            if close is not None:
                try:
                    await asyncio.wait_for(close(), 5.0)
                except Exception:  # noqa: BLE001 - shutting down: report and go on
                    log.exception("closing a client of the ingest failed")

    # ------------------------------------------------------------------ requests
    async def route(self, request: Request) -> Response:
        """Answer one request of the HTTP server (:mod:`.http`)."""
        path, method = request.path, request.method
        if path == "/reports":
            if method != "POST":
                return Response(405, (_JSON, ("allow", "POST")), b'{"error":"method_not_allowed"}')
            reply = await self.handler.handle(request.headers, _body_reader(request))  # type: ignore[union-attr]
            return Response(reply.status, (_JSON, *reply.headers), reply.body)
        if path == "/health" and method in ("GET", "HEAD"):
            healthy, problems = await self.health()
            body = json.dumps({"healthy": healthy, "problems": problems}).encode()
            return Response(200 if healthy else 503, (_JSON,), body)
        if path == "/metrics" and method in ("GET", "HEAD"):
            from prometheus_client import CONTENT_TYPE_LATEST

            return Response(200, (("content-type", CONTENT_TYPE_LATEST),), render(self.registry))
        return Response(404, (_JSON,), b'{"error":"not_found"}')

    def http_refused(self, reason: str) -> None:
        """A refusal by the HTTP server itself (malformed request, headers too large, too slow)."""
        if self.metrics is not None:
            self.metrics.refused_total.labels(reason).inc()

    async def health(self) -> tuple[bool, list[str]]:
        """``(healthy, problems)``: Redis answers a ping within 1 s, the producer runs, not stopping."""
        problems = []
        if self._stopping:
            problems.append("stopping")
        if self.producer is None or self.producer._closed:  # noqa: SLF001 - aiokafka has no public flag
            problems.append("kafka")
        try:
            await asyncio.wait_for(self.store.redis.ping(), 1.0)  # type: ignore[union-attr]
        except (asyncio.TimeoutError, *RETRYABLE_ERRORS):
            problems.append("redis")
        return not problems, problems


def _body_reader(request: Request) -> ReadBody:
    """A :data:`~stream_app.ingest.handler.ReadBody` over a request the server read whole (or found too large)."""

    async def read(limit: int) -> bytes:
        if request.too_large or len(request.body) > limit:
            raise BodyTooLarge()
        return request.body

    return read


def create_app() -> IngestApp:
    """The ingest of one server process: the settings and secret from the environment."""
    return IngestApp(IngestSettings.from_env(), secret=DeviceSecret.from_env())


#: Allocations between two young-generation collections (CPython's default is 700). A request allocates a few
#: hundred objects, almost none of them in reference cycles; collecting every couple of requests cost CPU, and
#: the full collections that follow scan every long-lived object (tail latency).
GC_YOUNG_THRESHOLD = 50_000


def quiet_garbage_collector() -> None:
    """Move what start-up built (campaigns, protocol tables, compiled kernels, clients) out of the cyclic
    garbage collector's reach (``gc.freeze``) and collect the young generation less often, so that a
    process serving thousands of requests a second does not pause to rescan them."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def http_limits(settings: IngestSettings) -> HttpLimits:
    """The HTTP server's limits from the ingest's settings."""
    return HttpLimits(max_body_bytes=settings.max_body_bytes, request_seconds=settings.request_timeout,
                      keepalive_seconds=settings.keepalive_seconds, max_connections=settings.max_connections)


def _serve_process(index: int, ready: Callable[[], None]) -> None:
    """One server process (forked by :func:`serve`): the ingest on this process's uvloop until SIGTERM."""
    if _has_uvloop():
        import uvloop

        uvloop.run(_serve_until_stopped(ready))
    else:
        asyncio.run(_serve_until_stopped(ready))


async def _serve_until_stopped(ready: Callable[[], None]) -> None:
    app = create_app()
    s = app.settings
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await app.start()
    server = HttpServer(app.route, http_limits(s), on_refusal=app.http_refused)
    try:
        await server.start(s.host, s.port)
        quiet_garbage_collector()
        ready()
        await stop.wait()
        log.info("stopping: answering the requests in flight")
        if not await server.stop(s.shutdown_timeout):
            log.warning("requests still in flight after %.1f s were cut off", s.shutdown_timeout)
    finally:
        await app.stop()


def serve(settings: IngestSettings) -> int:
    """Run the ingest (module doc) until SIGTERM/SIGINT; returns the exit status."""
    logging.basicConfig(level=settings.loglevel.upper(),
                        format="%(asctime)s %(levelname)s ldp-ingest[%(process)d] %(name)s: %(message)s")
    IngestApp(settings, secret=DeviceSecret.from_env())  # fail here, not in every process: secret, campaigns
    os.environ.update(settings.to_env())  # the server processes read the settings back (create_app)
    own_dir = not os.environ.get(MULTIPROC_ENV)
    metrics_dir = Path(os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="ldp-ingest-metrics-"))
    for stale in metrics_dir.glob("*.db"):  # counters start at 0 with the service
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(metrics_dir)
    try:
        log.info("ldp ingest on http://%s:%d, %d process(es)", settings.host, settings.port, settings.processes)
        return run_processes(_serve_process, settings.processes, name="ldp ingest",
                             kill_timeout=settings.shutdown_timeout + settings.publish_timeout + 5)
    finally:
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None
