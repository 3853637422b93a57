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
* ``GET /estimates/{campaign}/{attribute}/query?value=...[&value=...][&t=...]`` - an open-domain attribute
  (``type = "string"`` or ``"u64"``): the estimated frequency and 95% interval of each value (at most 100) in step
  ``t`` (default: the latest estimate's step), from the step's sketch in the count store;
* ``GET /metrics`` - Prometheus text format;
* ``GET /status`` - this worker: id, assigned partitions, estimator lease, batches processed,
  ``healthy`` and the ``problems`` that keep it from progressing (always 200);
* ``GET /health`` - ``{"healthy", "problems"}``: 200 while the worker can make progress, 503 while it
  cannot (Redis or the broker unreachable, starting, stopping, ...: :mod:`stream_app.health`).

Every JSON answer carries ``schema_version`` and validates against its JSON Schema in ``wire/schemas``
(:mod:`wire.estimates`; the answers and their meaning: ``docs/estimates.md``); an error is ``{"schema_version",
"error"}`` with status 404 (400: a query that cannot be answered, with the reason).

The worker takes no device reports over HTTP: the ingest service (``ldp ingest``, :mod:`stream_app.ingest`)
is the one door for them; a ``POST /reports`` to a worker gets 404 or 405.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

import faust
import numpy as np

from estimators.sketch.base import Z95
from wire.campaign import Attribute, Campaign
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
            "memo_size": a.protocol.memo_size, "domain_size": None if a.open_domain else a.protocol.domain_size,
            "labels": list(a.labels) if a.labels else None,
            "type": a.value_type,
            "range": [a.protocol.lo, a.protocol.hi] if a.numeric else None,
            "top": a.top if a.open_domain else None,
            "candidates": [c if isinstance(c, str) else str(c) for c in a.candidates] if a.open_domain else None,
        } for a in c.attributes.values()],
    }


#: the most values one query may ask for
MAX_QUERY_VALUES = 100


def query_args(attr: Attribute, values: list[str], t: str | None) -> tuple[list[str | int], int | None]:
    """The values and step of ``GET /estimates/{campaign}/{attribute}/query?value=...&value=...[&t=...]``;
    ``ValueError`` with the reason for a request that cannot be answered."""
    if not attr.open_domain:
        raise ValueError(f"attribute {attr.name!r} is {attr.value_type}: only an open-domain attribute (type = "
                         f"\"string\" or \"u64\") answers queries of values")
    if not values:
        raise ValueError("give at least one value: ?value=...")
    if len(values) > MAX_QUERY_VALUES:
        raise ValueError(f"at most {MAX_QUERY_VALUES} values per query, got {len(values)}")
    out: list[str | int] = list(values)
    if attr.value_type == "u64":
        try:
            out = [int(v, 10) for v in values]
        except ValueError:
            raise ValueError("a u64 attribute's values are decimal integers") from None
        if any(not 0 <= v < 1 << 64 for v in out):  # type: ignore[operator]
            raise ValueError("a u64 attribute's values lie in [0, 2^64)")
    step = None
    if t is not None:
        try:
            step = int(t)
        except ValueError:
            raise ValueError(f"t must be a step number, got {t!r}") from None
        if step < 0:
            raise ValueError(f"t must be a step number, got {t!r}")
    return out, step


def query_answer(campaign: Campaign, attr: Attribute, t: int, values: list[str | int], counts: Any,
                 n: int) -> dict[str, Any]:
    """The answer of a query: each value's estimated frequency and 95% interval in step ``t`` (``status``
    ``"insufficient"`` and null frequencies below the campaign's ``min_n``)."""
    enough = n >= campaign.min_n
    out: list[dict[str, Any]] = []
    if enough:
        ids = np.array([attr.value_id(v) for v in values], dtype=np.uint64)
        f = np.asarray(attr.protocol.estimate(counts, n, ids), dtype=np.float64)
        half = Z95 * np.sqrt(np.asarray(attr.protocol.variance_exact(np.clip(f, 0.0, 1.0), n), dtype=np.float64))
    for j, v in enumerate(values):
        text = v if isinstance(v, str) else str(v)
        out.append({"value": text, "frequency": float(f[j]) if enough else None,
                    "ci95": [float(f[j] - half[j]), float(f[j] + half[j])] if enough else None})
    return {"schema_version": SCHEMA_VERSION, "campaign": campaign.id, "attribute": attr.name, "t": int(t), "n": n,
            "status": "ok" if enough else "insufficient", "values": out}


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
    # (campaign, attribute, t) -> the step's support counts and n (an open-domain attribute's query)
    step_counts: Callable[[str, str, int], Awaitable[tuple[Any, int]]]


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

    @app.page("/estimates/{campaign}/{attribute}/query")
    async def query(self: faust.web.View, request: faust.web.Request, campaign: str,
                    attribute: str) -> faust.web.Response:
        err = lookup(campaign, attribute)
        if err:
            return self.json({"schema_version": SCHEMA_VERSION, "error": err}, status=404)
        attr = web.campaigns[campaign].attributes[attribute]
        try:
            values, t = query_args(attr, request.query.getall("value", []), request.query.get("t"))
        except ValueError as exc:
            return self.json({"schema_version": SCHEMA_VERSION, "error": str(exc)}, status=400)
        if t is None:
            latest = await web.latest_estimate(campaign, attribute)
            if latest is None:
                return self.json({"schema_version": SCHEMA_VERSION, "error": "no estimate yet"}, status=404)
            t = int(json.loads(latest)["t"])
        counts, n = await web.step_counts(campaign, attribute, t)
        return self.json(query_answer(web.campaigns[campaign], attr, t, values, counts, n))

    @app.page("/estimates/{campaign}/{attribute}/history")
    async def history(self: faust.web.View, request: faust.web.Request, campaign: str,
                      attribute: str) -> faust.web.Response:
        err = lookup(campaign, attribute)
        if err:
            return self.json({"schema_version": SCHEMA_VERSION, "error": err}, status=404)
        docs = await web.estimate_history(campaign, attribute)
        return self.json({"schema_version": SCHEMA_VERSION, "campaign": campaign, "attribute": attribute,
                          "estimates": [docs[t] for t in sorted(docs)]})
