"""HTTP API on the Faust web server.

Routes (JSON unless said otherwise):

* ``GET /`` - the built-in dashboard page (``stream_app/static``: plain SVG drawn by ``GET /dashboard.js`` from
  this API and ``/metrics``, polled every second; no network beyond the worker): per attribute the latest
  histogram with its 95% band next to the previous step, the frequencies over time (a numeric attribute: its mean
  over time with the 95% band, and for Square Wave the latest distribution and the quantiles over time), the
  privacy figures, and the worker's operations (reports/s, rejections, lag, estimate latency);
* ``GET /campaigns`` - campaigns, attributes, protocols, privacy parameters, fingerprints;
* ``GET /estimates/{campaign}/{attribute}`` - the latest estimate (404 before the first);
* ``GET /estimates/{campaign}/{attribute}/history`` - the final estimates, by ``t``;
* ``GET /metrics`` - Prometheus text format;
* ``GET /status`` - this worker: id, assigned partitions, estimator lease, batches processed,
  ``healthy`` and the ``problems`` that keep it from progressing (always 200);
* ``GET /health`` - ``{"healthy", "problems"}``: 200 while the worker can make progress, 503 while it
  cannot (Redis or the broker unreachable, starting, stopping, ...: :mod:`stream_app.health`).

Every JSON answer carries ``schema_version`` and validates against its JSON Schema in ``wire/schemas``
(:mod:`wire.estimates`; the answers and their meaning: ``docs/estimates.md``); an error is ``{"schema_version",
"error"}`` with status 404.

The worker takes no device reports over HTTP: the ingest service (``ldp ingest``, :mod:`stream_app.ingest`)
is the one door for them; a ``POST /reports`` to a worker gets 404 or 405.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import faust

from wire.campaign import Campaign
from wire.estimates import SCHEMA_VERSION

from .metrics import CONTENT_TYPE

__all__ = ["WebContext", "register"]


#: The dashboard page and its script (package data, read once at import).
STATIC = Path(__file__).with_name("static")
DASHBOARD_HTML = (STATIC / "index.html").read_text(encoding="utf-8")
DASHBOARD_JS = (STATIC / "dashboard.js").read_bytes()


# ---------------------------------------------------------------------------- views
def campaign_doc(c: Campaign) -> dict[str, Any]:
    def num(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return {
        "id": c.id, "description": c.description, "fingerprint": c.fingerprint,
        "time_step_seconds": c.time_step_seconds, "lateness_seconds": c.lateness_seconds,
        "max_batch_reports": c.max_batch_reports, "min_n": c.min_n,
        "attributes": [{
            "name": a.name, "k": a.k, "protocol": a.protocol.name, "params": a.protocol.params(),
            "fingerprint": a.protocol.fingerprint, "eps_1": num(a.protocol.eps_first),
            "eps_inf": num(a.protocol.eps_inf), "eps_longitudinal_bound": num(a.protocol.worst_case_loss),
            "memo_size": a.protocol.memo_size, "domain_size": a.protocol.domain_size,
            "labels": list(a.labels) if a.labels else None,
            "type": "numeric" if a.numeric else "categorical",
            "range": [a.protocol.lo, a.protocol.hi] if a.numeric else None,
        } for a in c.attributes.values()],
    }


@dataclass(frozen=True)
class WebContext:
    """What the views need from a worker, built by :func:`stream_app.app.create_app`.

    The web layer sees only this (it never imports the app): the campaigns and read-only views of the
    worker and of the count store.
    """

    campaigns: Mapping[str, Campaign]
    status: Callable[[], dict[str, Any]]  # GET /status document (GET /health: its healthy and problems)
    render_metrics: Callable[[], bytes]  # Prometheus text exposition
    latest_estimate: Callable[[str, str], Awaitable[bytes | None]]  # (campaign, attribute) -> stored JSON
    estimate_history: Callable[[str, str], Awaitable[dict[int, dict[str, Any]]]]  # -> t -> final estimate


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
        return self.json({"schema_version": SCHEMA_VERSION,
                          "campaigns": [campaign_doc(c) for c in web.campaigns.values()]})

    @app.page("/status")
    async def status(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.json({"schema_version": SCHEMA_VERSION, **web.status()})

    @app.page("/health")
    async def health(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        doc = web.status()
        healthy = bool(doc.get("healthy", True))
        return self.json({"schema_version": SCHEMA_VERSION, "healthy": healthy, "problems": doc.get("problems", []),
                          "worker_id": doc.get("worker_id")}, status=200 if healthy else 503)

    @app.page("/metrics")
    async def metrics(self: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        return self.bytes(web.render_metrics(), headers={"Content-Type": CONTENT_TYPE})

    @app.page("/estimates/{campaign}/{attribute}")
    async def latest(self: faust.web.View, request: faust.web.Request, campaign: str,
                     attribute: str) -> faust.web.Response:
        err = lookup(campaign, attribute)
        if err:
            return self.json({"schema_version": SCHEMA_VERSION, "error": err}, status=404)
        raw = await web.latest_estimate(campaign, attribute)
        if raw is None:
            return self.json({"schema_version": SCHEMA_VERSION, "error": "no estimate yet"}, status=404)
        return self.bytes(raw, content_type="application/json")

    @app.page("/estimates/{campaign}/{attribute}/history")
    async def history(self: faust.web.View, request: faust.web.Request, campaign: str,
                      attribute: str) -> faust.web.Response:
        err = lookup(campaign, attribute)
        if err:
            return self.json({"schema_version": SCHEMA_VERSION, "error": err}, status=404)
        docs = await web.estimate_history(campaign, attribute)
        return self.json({"schema_version": SCHEMA_VERSION, "campaign": campaign, "attribute": attribute,
                          "estimates": [docs[t] for t in sorted(docs)]})
