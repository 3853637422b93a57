"""``ldp ingest``: the stateless HTTP ingest of single device reports, several processes on one port.

Routes: ``POST /reports`` (:class:`~stream_app.ingest.handler.ReportHandler`: the whole request life),
``GET /health`` (200 ``{"healthy": true}`` while Redis answers and the producer runs, else 503 with the
problems), ``GET /metrics`` (Prometheus, summed over the processes: :mod:`.metrics`).

HTTP stack: granian (a Rust HTTP server, hyper underneath) calling this module's RSGI application on a
uvloop event loop, one per process. Measured on the 2-core development machine with ``wrk -t1 -c64``
against a trivial handler (read the body, ``json.loads``, answer a small JSON), one server process, while
other jobs loaded the machine (load average about 4), two runs each, requests/s:

=====================================  ==============  ==============
server                                 run 1           run 2
=====================================  ==============  ==============
aiohttp 3.14 (asyncio loop)            8,100           14,800
aiohttp 3.14 + uvloop                  6,500           15,100
uvicorn 0.54 + uvloop + httptools      10,900          17,800
granian 2.8 ASGI + uvloop              13,500          23,700
granian 2.8 RSGI + uvloop              35,400          31,100
=====================================  ==============  ==============

granian's RSGI interface leaves 2-2.5x aiohttp's headroom per core to the handler, which is where the
time goes here (decoding, HMACs, Redis, Kafka); uvloop alone does not speed aiohttp up. granian is also
a pre-fork server: ``--processes N`` binds the port once and forks N processes that accept on it, each
with its own event loop, Kafka producer and Redis client; all shared state (rate-limit slots,
idempotency records) is in Redis, so the processes, and any number of hosts behind a load balancer,
are interchangeable. SIGTERM (granian forwards it to every process): a process stops accepting, waits
up to ``shutdown_timeout`` for the requests in flight (each answered once the broker acknowledged its
reports), publishes what its batcher holds, and closes its producer and Redis client.
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
from typing import Any

from wire.campaign import Campaign, load_campaigns
from wire.topics import Topics
from wire.transport import kafka_client_options

from ..settings import SettingsError
from ..store import RETRYABLE_ERRORS, CountStore
from .auth import DeviceSecret, TokenAuthority
from .batcher import Batcher
from .handler import BodyTooLarge, HandlerLimits, ReportHandler
from .limits import RequestLedger
from .metrics import MULTIPROC_ENV, IngestMetrics, render, use_multiprocess_values
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
    """The ingest of one server process, as an RSGI application (granian calls ``__rsgi_init__`` before
    serving, ``__rsgi__`` per request and ``__rsgi_del__`` once stopped)."""

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
        self._inflight = 0
        self._idle = asyncio.Event()
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
        """Wait for the requests in flight (at most ``shutdown_timeout``), flush, close the clients."""
        self._stopping = True
        if self._inflight:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), self.settings.shutdown_timeout)
            except asyncio.TimeoutError:
                log.warning("%d request(s) still in flight after %.1f s", self._inflight, self.settings.shutdown_timeout)
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

    def __rsgi_init__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.start())
        _quiet_garbage_collector()

    def __rsgi_del__(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.run_until_complete(self.stop())

    # ------------------------------------------------------------------ requests
    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        path, method = scope.path, scope.method
        if path == "/reports":
            if method != "POST":
                proto.response_bytes(405, [_JSON, ("allow", "POST")], b'{"error":"method_not_allowed"}')
                return
            self._inflight += 1
            try:
                reply = await self.handler.handle(scope.headers, _body_reader(scope, proto))  # type: ignore[union-attr]
            finally:
                self._inflight -= 1
                if not self._inflight:
                    self._idle.set()
            proto.response_bytes(reply.status, [_JSON, *reply.headers], reply.body)
        elif path == "/health" and method == "GET":
            healthy, problems = await self.health()
            body = json.dumps({"healthy": healthy, "problems": problems}).encode()
            proto.response_bytes(200 if healthy else 503, [_JSON], body)
        elif path == "/metrics" and method == "GET":
            from prometheus_client import CONTENT_TYPE_LATEST

            proto.response_bytes(200, [("content-type", CONTENT_TYPE_LATEST)], render(self.registry))
        else:
            proto.response_bytes(404, [_JSON], b'{"error":"not_found"}')

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


def _body_reader(scope: Any, proto: Any):
    """A :data:`~stream_app.ingest.handler.ReadBody` over an RSGI request."""

    async def read(limit: int) -> bytes:
        if scope.headers.get("content-length") is not None:  # the handler checked it against the limit
            body = await proto()
            if len(body) > limit:
                raise BodyTooLarge()
            return body
        chunks, size = [], 0
        async for chunk in proto:
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge()
            chunks.append(chunk)
        return b"".join(chunks)

    return read


def create_app() -> IngestApp:
    """granian's factory, run in each server process: the settings and secret from the environment."""
    return IngestApp(IngestSettings.from_env(), secret=DeviceSecret.from_env())


#: Allocations between two young-generation collections (CPython's default is 700). A request allocates a few
#: hundred objects, almost none of them in reference cycles; collecting every couple of requests cost CPU, and
#: the full collections that follow scan every long-lived object (tail latency).
GC_YOUNG_THRESHOLD = 50_000


def _quiet_garbage_collector() -> None:
    """Move what start-up built (campaigns, protocol tables, compiled kernels, clients) out of the cyclic
    garbage collector's reach (``gc.freeze``) and collect the young generation less often, so that a
    process serving thousands of requests a second does not pause to rescan them."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def serve(settings: IngestSettings) -> int:
    """Run the ingest (module doc) until SIGTERM/SIGINT; returns the exit status."""
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    IngestApp(settings, secret=DeviceSecret.from_env())  # fail here, not in every process: secret, campaigns
    os.environ.update(settings.to_env())  # the server processes read the settings back (create_app)
    own_dir = not os.environ.get(MULTIPROC_ENV)
    metrics_dir = Path(os.environ.get(MULTIPROC_ENV) or tempfile.mkdtemp(prefix="ldp-ingest-metrics-"))
    for stale in metrics_dir.glob("*.db"):  # counters start at 0 with the service
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(metrics_dir)
    try:
        loop = Loops.uvloop if _has_uvloop() else Loops.asyncio
        server = Granian("stream_app.ingest.service:create_app", factory=True, address=settings.host,
                         port=settings.port, interface=Interfaces.RSGI, workers=settings.processes, loop=loop,
                         log_level=LogLevels(settings.loglevel.lower()), log_access=False,
                         workers_kill_timeout=int(settings.shutdown_timeout + settings.publish_timeout + 5))
        server.serve()
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        if own_dir:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None
