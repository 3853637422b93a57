"""HTTP API on the Faust web server.

Routes (JSON unless said otherwise):

* ``GET /`` - a small self-contained dashboard page (polls the JSON API, draws bars);
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


DASHBOARD_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>ldp-stream</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em} h2{font-size:1.05em;margin:1.4em 0 .3em}
.meta{color:#555;font-size:.9em;margin-bottom:.4em}
.hist{display:flex;align-items:flex-end;height:140px;gap:1px;border-bottom:1px solid #999;
      background:#fff;padding:4px;position:relative}
.col{flex:1;position:relative;height:100%;min-width:1px}
.bar{position:absolute;bottom:0;left:0;right:0;background:#3b7dd8}
.ci{position:absolute;left:50%;width:2px;margin-left:-1px;background:#d33;opacity:.7}
.lab{display:flex;gap:1px;font-size:9px;color:#666;overflow:hidden;height:1.2em;padding:0 4px}
.lab span{flex:1;text-align:center;overflow:hidden;min-width:1px}
.final{color:#080} .open{color:#b60}
</style></head><body>
<h1>ldp-stream: live estimates</h1><div id="status" class="meta">loading...</div><div id="root"></div>
<script>
const root=document.getElementById('root'), status=document.getElementById('status');
let campaigns=[];
function fmt(x,d){return x===null||x===undefined?'&infin;':Number(x).toFixed(d)}
async function getJSON(u){const r=await fetch(u);if(!r.ok)return null;return r.json()}
function draw(a,c,e){
  const id='a-'+c.id+'-'+a.name; let box=document.getElementById(id);
  if(!box){box=document.createElement('div');box.id=id;root.appendChild(box)}
  if(!e){box.innerHTML='<h2>'+c.id+' / '+a.name+' ('+a.protocol+', k='+a.k+')</h2><div class="meta">no estimate yet</div>';return}
  const f=e.frequencies_norm_sub||[], h=e.ci95_halfwidth||0;
  const top=Math.max(1e-9,...f.map(x=>x+h));
  let bars='';
  f.forEach((x,j)=>{const lo=Math.max(0,x-h),hi=x+h;
    bars+='<div class="col" title="'+(a.labels?a.labels[j]:j)+': '+x.toFixed(4)+'">'+
      '<div class="bar" style="height:'+(100*x/top)+'%"></div>'+
      '<div class="ci" style="bottom:'+(100*lo/top)+'%;height:'+(100*(hi-lo)/top)+'%"></div></div>'});
  let labs='';
  if(f.length<=40) f.forEach((x,j)=>{labs+='<span>'+(a.labels?a.labels[j]:j)+'</span>'});
  box.innerHTML='<h2>'+c.id+' / '+a.name+' ('+a.protocol+', k='+a.k+')</h2>'+
    '<div class="meta">t='+e.t+' <b class="'+(e.final?'final':'open')+'">'+(e.final?'final':'open')+'</b>'+
    ' &middot; n='+e.n+' &middot; &plusmn;'+fmt(h,4)+' (95%)'+
    ' &middot; &epsilon;<sub>1</sub>='+fmt(e.eps_1,2)+' &epsilon;<sub>&infin;</sub>='+fmt(e.eps_inf,2)+
    ' &middot; worst longitudinal &epsilon; so far='+fmt(e.eps_longitudinal_worst,2)+
    ' &middot; updated '+new Date(e.updated_at*1000).toLocaleTimeString()+'</div>'+
    '<div class="hist">'+bars+'</div><div class="lab">'+labs+'</div>';
}
async function poll(){
  try{
    if(!campaigns.length){const d=await getJSON('campaigns');campaigns=d?d.campaigns:[]}
    for(const c of campaigns) for(const a of c.attributes)
      draw(a,c,await getJSON('estimates/'+encodeURIComponent(c.id)+'/'+encodeURIComponent(a.name)));
    status.textContent='updated '+new Date().toLocaleTimeString()+' (norm-sub frequencies, red: 95% interval)';
  }catch(err){status.textContent='error: '+err}
  setTimeout(poll,1000);
}
poll();
</script></body></html>
"""
