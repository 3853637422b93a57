"""HTTP API on the Faust web server, and the batching HTTP ingest of single device reports.

Routes (JSON unless said otherwise):

* ``GET /`` - a small self-contained dashboard page (polls the JSON API, draws bars);
* ``GET /campaigns`` - campaigns, attributes, protocols, privacy parameters, fingerprints;
* ``GET /estimates/{campaign}/{attribute}`` - the latest estimate (404 before the first);
* ``GET /estimates/{campaign}/{attribute}/history`` - the final estimates, by ``t``;
* ``GET /metrics`` - Prometheus text format;
* ``GET /status`` - this worker: id, assigned partitions, estimator lease, batches processed;
* ``POST /reports`` - one report object or a list of them::

      {"campaign": "fleet-health", "attribute": "opt_in", "t": 172345,   # t optional
       "payload": "<base64 of proto.encode(one-row report array)>",
       "protocol": "L-GRR", "fingerprint": "15aadc3a8fac7208"}         # optional, checked if present

  ``t`` defaults to ``floor(now / time_step_seconds)``. Every object is decoded by
  :func:`wire.single_report.decode_single_report` and validated like a batch
  (campaign, attribute, protocol and fingerprint if given, the payload must decode to exactly one
  report); the request is all-or-nothing: any bad object gives HTTP 400 with the reasons, a record
  per bad object on ``ldp.rejected`` and the rejection metric, and nothing of the request is
  published. A valid request returns 200 ``{"accepted": n}`` once its reports are in Kafka:
  reports are grouped per (campaign, attribute, t) and published as ordinary batch envelopes on
  ``ldp.reports`` every ``flush_seconds`` (0.1 s) or as soon as ``max_reports`` (10000) wait.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

import faust
import numpy as np

from wire import envelope
from wire.campaign import Campaign
from wire.errors import EnvelopeError
from wire.single_report import SingleReport, decode_report_request, decode_single_report
from wire.topics import message_key

from .metrics import CONTENT_TYPE, Metrics

__all__ = ["HttpIngest", "WebContext", "register"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- ingest batching
SendReports = Callable[[bytes, bytes], Awaitable[Any]]  # (message key, batch envelope) -> broker ack


class HttpIngest:
    """Groups single reports per (campaign, attribute, t) and publishes them as batch envelopes.

    Each envelope gets a fresh unique batch id (``http:<uuid4 hex>``), so the count store applies it
    at most once whatever the broker or the consumer redeliver.
    """

    def __init__(self, campaigns: Mapping[str, Campaign], send_reports: SendReports, metrics: Metrics,
                 flush_seconds: float = 0.1, max_reports: int = 10_000) -> None:
        self.campaigns = campaigns
        self.send_reports = send_reports
        self.metrics = metrics
        self.flush_seconds = flush_seconds
        self.max_reports = max_reports
        self._groups: dict[tuple[str, str, int], list[np.ndarray]] = {}
        self._waiters: list[asyncio.Future] = []
        self._pending = 0
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self.batches_sent = 0
        self.reports_sent = 0

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def submit(self, items: list[SingleReport]) -> int:
        """Queue validated reports; returns once they are acknowledged by the broker."""
        if self._stopping:
            raise RuntimeError("the worker is shutting down")
        fut = asyncio.get_running_loop().create_future()
        for campaign, attr, t, reports in items:
            self._groups.setdefault((campaign.id, attr, t), []).append(reports)
        self._waiters.append(fut)
        self._pending += len(items)
        if self._pending >= self.max_reports:
            self._event().set()
        await fut
        return len(items)

    async def run(self) -> None:
        """Flush every ``flush_seconds`` (or at once when ``max_reports`` wait) until :meth:`stop`."""
        ev = self._event()
        while not self._stopping:
            try:
                await asyncio.wait_for(ev.wait(), self.flush_seconds)
            except asyncio.TimeoutError:
                pass
            ev.clear()
            await self.flush()

    async def stop(self) -> None:
        self._stopping = True
        self._event().set()
        await self.flush()

    async def flush(self) -> None:
        if not self._waiters:
            return
        groups, waiters = self._groups, self._waiters
        self._groups, self._waiters, self._pending = {}, [], 0
        try:
            sends = []
            n_reports = 0
            for (cid, attr, t), rows in groups.items():
                campaign = self.campaigns[cid]
                reports = np.concatenate(rows) if len(rows) > 1 else rows[0]
                step = max(1, min(self.max_reports, campaign.max_batch_reports))
                for i in range(0, len(reports), step):
                    chunk = reports[i:i + step]
                    # a fresh unique batch id: the store applies it at most once
                    blob = envelope.pack_reports(campaign, attr, t, chunk, batch_id=f"http:{uuid.uuid4().hex}")
                    sends.append(self.send_reports(message_key(t, attr), blob))
                    n_reports += len(chunk)
            await asyncio.gather(*sends)
            self.batches_sent += len(sends)
            self.reports_sent += n_reports
            for (cid, attr, _t), rows in groups.items():
                self.metrics.http_reports_total.labels(cid, attr).inc(sum(len(r) for r in rows))
        except Exception as exc:  # noqa: BLE001 - the requests fail with 503, devices retry
            log.exception("HTTP ingest flush failed")
            for f in waiters:
                if not f.done():
                    f.set_exception(exc)
            return
        for f in waiters:
            if not f.done():
                f.set_result(None)


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
    the worker and of the count store, and two actions (record a rejection, submit valid reports).
    """

    campaigns: Mapping[str, Campaign]
    status: Callable[[], dict[str, Any]]  # GET /status document
    render_metrics: Callable[[], bytes]  # Prometheus text exposition
    latest_estimate: Callable[[str, str], Awaitable[bytes | None]]  # (campaign, attribute) -> stored JSON
    estimate_history: Callable[[str, str], Awaitable[dict[int, dict[str, Any]]]]  # -> t -> final estimate
    reject: Callable[..., Awaitable[dict[str, Any]]]  # (reason, detail, *, source, size, extra) -> record
    submit: Callable[[list[SingleReport]], Awaitable[int]]  # queue valid reports, wait for the broker


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

    @app.page("/reports")
    class Reports(faust.web.View):
        async def post(self, request: faust.web.Request) -> faust.web.Response:
            body = await request.read()
            try:
                objs = decode_report_request(body)
            except EnvelopeError as exc:
                doc = await web.reject(exc.reason, exc.detail, source="http", size=len(body))
                return self.json({"error": exc.reason, "detail": doc["detail"], "rejected": 1}, status=400)
            now = time.time()
            good, bad = [], []
            for i, obj in enumerate(objs):
                try:
                    good.append(decode_single_report(obj, web.campaigns, now))
                except EnvelopeError as exc:
                    extra = {k: obj.get(k) for k in ("campaign", "attribute", "t")} if isinstance(obj, dict) else {}
                    extra = {k: v for k, v in extra.items() if isinstance(v, (str, int)) and not isinstance(v, bool)}
                    await web.reject(exc.reason, exc.detail, source="http", size=len(body),
                                     extra={**extra, "index": i})
                    bad.append({"index": i, "reason": exc.reason, "detail": exc.detail})
            if bad:
                return self.json({"error": bad[0]["reason"], "detail": bad[0]["detail"], "rejected": len(bad),
                                  "errors": bad, "accepted": 0}, status=400)
            try:
                n = await web.submit(good)
            except Exception as exc:  # noqa: BLE001 - Kafka unavailable or shutting down
                return self.json({"error": "unavailable", "detail": str(exc)}, status=503)
            return self.json({"accepted": n})


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
