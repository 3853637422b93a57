"""``ldp ingest``: the stateless HTTP ingest of single device reports, several processes on one port.

Routes: ``POST /reports`` (:class:`~stream_app.ingest.handler.ReportHandler`: the whole request life),
``GET /health`` (200 ``{"healthy": true}`` while Redis answers and the producer runs, else 503 with the
problems), ``GET /metrics`` (Prometheus, summed over the processes: :mod:`.metrics`).

HTTP server: uvicorn (httptools' parser, uvloop; ``--processes N`` is uvicorn's ``workers``: N processes
accept on one socket, a dead one is replaced) serving :mod:`.asgi`, with the connection guards of
:mod:`.server` (first-byte and request timeouts, header size, connections per process and per client
address). It replaced a home-made HTTP/1.1 server after ``ldp bench ingest --server own|uvicorn``
(docs/benchmarks.md, "Ingest HTTP server").

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
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from wire.campaign import Campaign, load_campaigns
from wire.topics import Topics
from wire.transport import kafka_client_options

from ..settings import SettingsError
from ..store import RETRYABLE_ERRORS, CountStore
from .auth import DeviceSecret, TokenAuthority
from .batcher import Batcher
from .handler import BodyTooLarge, HandlerLimits, ReadBody, ReportHandler
from .limits import RequestLedger
from .metrics import MULTIPROC_ENV, IngestMetrics, render, use_multiprocess_values
from .revocation import RevocationCache
from .server import PROTOCOL
from .settings import IngestSettings
from .token_rate import TokenRates

__all__ = ["IngestApp", "Request", "Response", "create_app", "serve"]

log = logging.getLogger(__name__)

_JSON = ("content-type", "application/json")
_STARTUP_SECONDS = 30.0
#: The ASGI application factory uvicorn imports in each worker process.
ASGI_FACTORY = "stream_app.ingest.asgi:create_asgi"


class Request(NamedTuple):
    """One request: method, path (no query string), headers (lower-case names, repeated fields joined by
    ``", "``) and ``read``, which reads the body when the handler asks for it, after the checks that need only the
    headers (:data:`~stream_app.ingest.handler.ReadBody`: ``BodyTooLarge`` past the limit it is given or
    ``max_body_bytes``)."""

    method: str
    path: str
    headers: dict[str, str]
    read: ReadBody


class Response(NamedTuple):
    """An answer: status, headers (the server adds ``date``, ``content-length`` and ``connection``), body."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


def _handler_limits(s: IngestSettings) -> HandlerLimits:
    return HandlerLimits(max_body_bytes=s.max_body_bytes, max_device_reports=s.max_device_reports,
                         max_relay_reports=s.max_relay_reports, max_open_reports=s.max_relay_reports,
                         max_late_seconds=s.max_late_seconds, max_early_seconds=s.max_early_seconds)


def _request_rates(s: IngestSettings) -> dict[bool, TokenRates]:
    """Requests per token (relay? -> its buckets; bursts of two seconds' worth, at least 1)."""
    return {relay: TokenRates(rate, max(1.0, 2 * rate)) for relay, rate in
            ((False, s.device_requests_per_second), (True, s.relay_requests_per_second))}


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
        self.revocations: RevocationCache | None = None
        self._revocation_task: asyncio.Task | None = None
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
        self.revocations = RevocationCache(self.store, s.revocation_refresh_seconds)
        try:
            await self.revocations.refresh()  # in force from the first request
        except RETRYABLE_ERRORS as exc:
            log.warning("the revocation list cannot be read yet: %s", exc)
        self._revocation_task = asyncio.get_running_loop().create_task(self.revocations.run())
        self.handler = ReportHandler(self.campaigns, self.batcher.submit, self.metrics, authority=self.authority,
                                     ledger=ledger, limits=_handler_limits(s), revoked=self.revocations,
                                     request_rates=_request_rates(s),
                                     relay_reports=TokenRates(s.relay_reports_per_second,
                                                              max(s.relay_reports_per_second, s.max_relay_reports)))
        if self.authority is None:
            log.warning("ldp ingest in OPEN mode: reports are accepted without a credential and without rate "
                        "limits (development only)")

    async def stop(self) -> None:
        """Publish what the batcher holds and close the clients (the HTTP server has already waited, at most
        ``shutdown_timeout``, for the requests in flight)."""
        self._stopping = True
        if self._revocation_task is not None:
            self._revocation_task.cancel()
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
        """Answer one request (:mod:`.asgi` calls it)."""
        path, method = request.path, request.method
        if path == "/reports":
            if method != "POST":
                return Response(405, (_JSON, ("allow", "POST")), b'{"error":"method_not_allowed"}')
            reply = await self.handler.handle(request.headers, request.read)  # type: ignore[union-attr]
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
        """A refusal by the HTTP server itself (:mod:`.server`: malformed request, headers too large, too slow,
        too many connections)."""
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


def configure_logging(settings: IngestSettings) -> None:
    """The log format and level of the ingest's processes (uvicorn's worker processes call it too)."""
    logging.basicConfig(level=settings.loglevel.upper(),
                        format="%(asctime)s %(levelname)s ldp-ingest[%(process)d] %(name)s: %(message)s")


def serve(settings: IngestSettings) -> int:
    """Run the ingest (module doc) until SIGTERM/SIGINT; returns the exit status."""
    configure_logging(settings)
    IngestApp(settings, secret=DeviceSecret.from_env())  # fail here, not in every process: secret, campaigns
    os.environ.update(settings.to_env())  # the server processes read the settings back (create_app)
    own_dir = not os.environ.get(MULTIPROC_ENV)
    metrics_dir = Path(os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="ldp-ingest-metrics-"))
    for stale in metrics_dir.glob("*.db"):  # counters start at 0 with the service
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(metrics_dir)
    try:
        log.info("ldp ingest on http://%s:%d, %d process(es)", settings.host, settings.port, settings.processes)
        return run_server(uvicorn_config(settings))
    finally:
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def uvicorn_config(settings: IngestSettings) -> Any:
    """uvicorn's configuration of the ingest: httptools with :mod:`.server`'s guards, uvloop, ``processes``
    workers, the keep-alive and graceful-stop timeouts of the settings, no access log."""
    import uvicorn

    return uvicorn.Config(ASGI_FACTORY, factory=True, host=settings.host, port=settings.port, http=PROTOCOL,
                          loop="uvloop", ws="none", lifespan="on", workers=settings.processes,
                          timeout_keep_alive=settings.keepalive_seconds,  # type: ignore[arg-type] # a float works
                          timeout_graceful_shutdown=settings.shutdown_timeout,  # type: ignore[arg-type]
                          access_log=False, log_config=None, server_header=False, backlog=1024)


def run_server(config: Any) -> int:
    """Serve uvicorn's ``config`` until SIGTERM/SIGINT (``workers`` > 1: uvicorn's supervisor, which replaces a
    process that dies); 1 if a process could not start (the broker or Redis unreachable, the port taken), else 0."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    if config.workers == 1:
        server = uvicorn.Server(config)
        server.run()
        return 0 if server.started else 1
    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    return 1 if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes) else 0
