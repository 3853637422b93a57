"""HTTP API on the Faust web server.

Routes (JSON unless said otherwise):

* ``GET /`` - the built-in dashboard page (``stream_app/static``: plain SVG drawn by ``GET /dashboard.js`` from
  this API and ``/metrics``, polled every second; no network beyond the worker): per attribute the latest
  histogram with its 95% band next to the previous step, the frequencies over time, the privacy figures, and the
  worker's operations (reports/s, rejections, lag, estimate latency);
* ``GET /campaigns`` - campaigns, attributes, protocols, privacy parameters, fingerprints;
* ``GET /estimates/{campaign}/{attribute}`` - the latest estimate (404 before the first);
* ``GET /estimates/{campaign}/{attribute}/history`` - the final estimates, by ``t``;
* ``GET /metrics`` - Prometheus text format;
* ``GET /status`` - this worker: id, assigned partitions, estimator lease, batches processed,
  ``healthy`` and the ``problems`` that keep it from progressing (always 200);
* ``GET /health`` - ``{"healthy", "problems"}``: 200 while the worker can make progress, 503 while it
  cannot (Redis or the broker unreachable, starting, stopping, ...: :mod:`stream_app.health`);
* ``POST /reports`` - single reports, the ingest's handler (:mod:`stream_app.ingest.handler`: JSON, one
  object or a list, or the compact binary body; all-or-nothing; 200 ``{"accepted": n}`` once the
  broker acknowledged them). Who may post (:mod:`stream_app.ingest`, "Worker POST /reports"): device
  tokens with rate limits and idempotency records when ``LDP_DEVICE_SECRET`` is set; anyone (no rate
  limit) with ``--open-reports``, for development only; nobody otherwise (403 ``reports_disabled``).
  A bad report gives 400 with the reasons, a record per bad object on ``ldp.rejected`` and the rejection
  metric; the reports are batched by :class:`stream_app.ingest.batcher.Batcher` (linger
  ``ingest_flush_seconds``, ``ingest_max_reports`` per batch).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import faust
from aiohttp import web as aioweb

from wire.campaign import Campaign
from wire.single_report import SingleReport

from .ingest.auth import DeviceSecret, TokenAuthority
from .ingest.handler import BodyTooLarge, HandlerLimits, ReportHandler
from .ingest.limits import RequestLedger
from .ingest.metrics import IngestMetrics
from .metrics import CONTENT_TYPE
from .store import CountStore

__all__ = ["WORKER_REPORT_LIMITS", "WebContext", "register", "worker_report_handler"]

log = logging.getLogger(__name__)

#: The dashboard page and its script (package data, read once at import).
STATIC = Path(__file__).with_name("static")
DASHBOARD_HTML = (STATIC / "index.html").read_text(encoding="utf-8")
DASHBOARD_JS = (STATIC / "dashboard.js").read_bytes()

#: The worker's POST /reports: bodies up to the web server's 32 MiB (lists of 10k+ reports in open mode).
WORKER_REPORT_LIMITS = HandlerLimits(max_body_bytes=32 << 20, max_open_reports=1_000_000)
_DISABLED = ("POST /reports needs device tokens: set LDP_DEVICE_SECRET (or LDP_DEVICE_SECRET_FILE) on the worker, "
             "or send reports to `ldp ingest`; --open-reports accepts them without a credential, for development only")


# ---------------------------------------------------------------------------- views
def campaign_doc(c: Campaign) -> dict[str, Any]:
    def num(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {
        "id": c.id, "description": c.description, "fingerprint": c.fingerprint,
        "time_step_seconds": c.time_step_seconds, "lateness_seconds": c.lateness_seconds,
        "max_batch_reports": c.max_batch_reports,
        "attributes": [{
            "name": a.name, "k": a.k, "protocol": a.protocol.name, "params": a.protocol.params(),
            "fingerprint": a.protocol.fingerprint, "eps_1": num(a.protocol.eps_first),
            "eps_inf": num(a.protocol.eps_inf), "eps_longitudinal_bound": num(a.protocol.worst_case_loss),
            "memo_size": a.protocol.memo_size, "domain_size": a.protocol.domain_size,
            "labels": list(a.labels) if a.labels else None,
        } for a in c.attributes.values()],
    }


@dataclass(frozen=True)
class WebContext:
    """What the views need from a worker, built by :func:`stream_app.app.create_app`.

    The web layer sees only this (it never imports the app): the campaigns, read-only views of
    the worker and of the count store, two actions (record a rejection, submit valid reports), and
    what ``POST /reports`` needs besides (the count store for rate limits and idempotency records, the
    worker's metrics registry, the ``open_reports`` development switch).
    """

    campaigns: Mapping[str, Campaign]
    status: Callable[[], dict[str, Any]]  # GET /status document (GET /health: its healthy and problems)
    render_metrics: Callable[[], bytes]  # Prometheus text exposition
    latest_estimate: Callable[[str, str], Awaitable[bytes | None]]  # (campaign, attribute) -> stored JSON
    estimate_history: Callable[[str, str], Awaitable[dict[int, dict[str, Any]]]]  # -> t -> final estimate
    reject: Callable[..., Awaitable[dict[str, Any]]]  # (reason, detail, *, source, size, extra) -> record
    submit: Callable[[list[SingleReport]], Awaitable[int]]  # queue valid reports, wait for the broker
    store: CountStore | None = None  # rate-limit slots and idempotency records of POST /reports
    registry: Any = None  # the worker's prometheus CollectorRegistry (POST /reports adds its metrics)
    open_reports: bool = False  # development: POST /reports without credentials when no secret is set


def worker_report_handler(web: WebContext, environ: Mapping[str, str] | None = None) -> ReportHandler:
    """The worker's ``POST /reports`` handler: tokens if ``LDP_DEVICE_SECRET`` is set, else open with
    ``web.open_reports``, else disabled (module doc)."""
    secret = DeviceSecret.from_env(environ)
    metrics = IngestMetrics(web.registry, reports=False)
    ledger = RequestLedger(web.store) if web.store is not None else None
    common = dict(limits=WORKER_REPORT_LIMITS, reject=web.reject)
    if secret is not None:
        return ReportHandler(web.campaigns, web.submit, metrics, authority=TokenAuthority(secret), ledger=ledger,
                             **common)
    if web.open_reports:
        log.warning("POST /reports is OPEN: reports are accepted without a credential (development only)")
        return ReportHandler(web.campaigns, web.submit, metrics, authority=None, ledger=ledger, **common)
    return ReportHandler(web.campaigns, web.submit, metrics, authority=None, ledger=None, disabled=_DISABLED, **common)


def register(app: faust.App, web: WebContext) -> None:
    """Add the routes of the module doc to ``app``'s web server."""

    def lookup(campaign: str, attribute: str) -> str | None:
        c = web.campaigns.get(campaign)
        if c is None:
            return f"unknown campaign {campaign!r}"
        if attribute not in c.attributes:
            return f"campaign {campaign!r} has no attribute {attribute!r}"
        return None

    @app.page("/")
    async def dashboard(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.html(DASHBOARD_HTML)

    @app.page("/dashboard.js")
    async def dashboard_js(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.bytes(DASHBOARD_JS, content_type="application/javascript",
                          headers={"Cache-Control": "no-cache"})

    @app.page("/campaigns")
    async def campaigns(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.json({"campaigns": [campaign_doc(c) for c in web.campaigns.values()]})

    @app.page("/status")
    async def status(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.json(web.status())

    @app.page("/health")
    async def health(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        doc = web.status()
        healthy = bool(doc.get("healthy", True))
        return self.json({"healthy": healthy, "problems": doc.get("problems", []),
                          "worker_id": doc.get("worker_id")}, status=200 if healthy else 503)

    @app.page("/metrics")
    async def metrics(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.bytes(web.render_metrics(), headers={"Content-Type": CONTENT_TYPE})

    @app.page("/estimates/{campaign}/{attribute}")
    async def latest(self: faust.web.View, request: faust.web.Request, campaign: str,
                     attribute: str) -> faust.web.Response:
        err = lookup(campaign, attribute)
        if err:
            return self.json({"error": err}, status=404)
        raw = await web.latest_estimate(campaign, attribute)
        if raw is None:
            return self.json({"error": "no estimate yet"}, status=404)
        return self.bytes(raw, content_type="application/json")

    @app.page("/estimates/{campaign}/{attribute}/history")
    async def history(self: faust.web.View, request: faust.web.Request, campaign: str,
                      attribute: str) -> faust.web.Response:
        err = lookup(campaign, attribute)
        if err:
            return self.json({"error": err}, status=404)
        docs = await web.estimate_history(campaign, attribute)
        return self.json({"campaign": campaign, "attribute": attribute,
                          "estimates": [docs[t] for t in sorted(docs)]})

    reports_handler = worker_report_handler(web)

    @app.page("/reports")
    class Reports(faust.web.View):
        async def post(self, request: faust.web.Request) -> faust.web.Response:
            async def read(limit: int) -> bytes:
                try:
                    body = await request.read()  # aiohttp stops at the web server's client_max_size
                except aioweb.HTTPRequestEntityTooLarge:
                    raise BodyTooLarge() from None
                if len(body) > limit:
                    raise BodyTooLarge()
                return body

            reply = await reports_handler.handle(request.headers, read)
            return self.bytes(reply.body, content_type="application/json", status=reply.status,
                              headers=dict(reply.headers) or None)
