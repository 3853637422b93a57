"""`ldp demo`: the whole pipeline on the embedded local stack, with a live terminal view.

Stack up (tansu + redis-server on free ports) → stream-app workers (separate processes) → a
simulated fleet publishing one step at a time through :func:`producers.fleet.publish` (reports,
then a watermark per attribute; its ``on_step`` hook paces the steps and draws the view) → the
final estimates read back from a worker's HTTP API and shown next to the true histograms,
with the privacy figures; the first worker's dashboard URL (its built-in page) is printed and stays in the
view's header. Everything is stopped on exit, Ctrl-C or SIGTERM, and the run directory (stack data, logs) is
removed unless it is to be kept.
"""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from producers.fleet import Fleet, FleetConfig, FleetSummary, publish
from wire.campaign import Campaign
from wire.topics import REPORTS_TOPIC
from wire.transport import redact_url


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _view(campaign: Campaign, truth: dict, finals: dict, header: str, top: int) -> Group:
    panels = []
    for attr, a in campaign.attributes.items():
        done = sorted(t for (x, t) in finals if x == attr)
        if not done:
            panels.append(Panel(f"waiting for the first final estimate of {attr} ...", title=attr))
            continue
        t = done[-1]
        doc, step = finals[(attr, t)], truth[(attr, t)]
        f = step["true_frequencies"]
        if doc["status"] == "insufficient":  # fewer reports than the campaign's min_n (docs/estimates.md)
            panels.append(Panel(f"step {t}: n={doc['n']:,} is below min_n = {doc['min_n']}: no estimate", title=attr))
            continue
        if a.numeric:
            panels.append(_numeric_panel(attr, a, t, doc, step))
            continue
        if a.open_domain:
            panels.append(_open_panel(attr, a, t, doc, step, top))
            continue
        est, ci = np.asarray(doc["frequencies"]), doc.get("ci95_halfwidth") or 0.0
        sd = np.sqrt(a.protocol.variance_exact(f, doc["n"]))
        tab = Table(expand=True, show_edge=False, pad_edge=False)
        for col in ("value", "true", "estimate", "± 95%", "|z|"):
            tab.add_column(col, justify="left" if col == "value" else "right")
        for v in np.argsort(f)[::-1][:top]:
            tab.add_row(a.label(int(v)), f"{f[v]:.4f}", f"{est[v]:.4f}", f"{ci:.4f}", f"{abs(est[v] - f[v]) / sd[v]:.2f}")
        worst = doc.get("eps_longitudinal_worst")
        title = f"{attr}  [{a.protocol.name}, k={a.k}]  step {t}  n={doc['n']:,}"
        privacy = (f"ε1={doc['eps_1']:.3f}  ε∞={doc['eps_inf']:.3f}  worst-case longitudinal ε so far="
                   f"{'∞' if worst is None else f'{worst:.3g}'}")
        panels.append(Panel(tab, title=title, title_align="left", subtitle=privacy, subtitle_align="left"))
    return Group(header, *panels)


def _numeric_panel(attr: str, a: Any, t: int, doc: dict, step: dict) -> Panel:
    """A numeric attribute's final: true and estimated mean with its 95% interval, and Square Wave's quantiles."""
    tab = Table(expand=True, show_edge=False, pad_edge=False)
    for col in ("statistic", "true", "estimate", "95% interval", "|z| / inside"):
        tab.add_column(col, justify="left" if col == "statistic" else "right")
    lo, hi = doc["mean_ci95"]
    z = abs(doc["mean"] - step["true_mean"]) / math.sqrt(doc["mean_variance"])
    tab.add_row("mean", f"{step['true_mean']:.2f}", f"{doc['mean']:.2f}", f"[{lo:.2f}, {hi:.2f}]", f"{z:.2f}")
    for q, band in (doc.get("quantiles") or {}).items():
        true_q = step["true_quantiles"][q]
        inside = "yes" if band["lower"] is not None and band["lower"] <= true_q <= band["upper"] else "no"
        tab.add_row(q, f"{true_q:.2f}", f"{band['value']:.2f}", f"[{band['lower']:.2f}, {band['upper']:.2f}]", inside)
    title = (f"{attr}  [{a.protocol.name}, {a.protocol.lo:g}..{a.protocol.hi:g}]  step {t}  n={doc['n']:,}  "
             f"clipped: {step['clipped']:,}")
    return Panel(tab, title=title, title_align="left", subtitle=f"ε1={doc['eps_1']:.3f} per report",
                 subtitle_align="left")


def _open_panel(attr: str, a: Any, t: int, doc: dict, step: dict, top: int) -> Panel:
    """An open-domain attribute's final: the true most frequent strings, each with its rank among the published
    top-K (found or not), the estimate and its 95% interval."""
    tab = Table(expand=True, show_edge=False, pad_edge=False)
    for col in ("true rank", f"value ({attr}-…)", "true", "found at", "estimate", "95% interval"):
        tab.add_column(col, justify="left" if col.startswith("value") else "right")
    found = {e["item"]: (rank, e) for rank, e in enumerate(doc["top_k"], 1)}
    for rank, e in enumerate(step["true_top"][:top], 1):
        at, est = found.get(e["item"], (None, None))
        tab.add_row(str(rank), e["value"].removeprefix(f"{attr}-"), f"{e['frequency']:.4f}", "-" if at is None else str(at),
                    "-" if est is None else f"{est['frequency']:.4f}",
                    "-" if est is None else f"[{est['ci95'][0]:.4f}, {est['ci95'][1]:.4f}]")
    hits = sum(e["item"] in found for e in step["true_top"][:a.top])
    title = f"{attr}  [{a.protocol.name}, open domain, top {a.top}]  step {t}  n={doc['n']:,}"
    return Panel(tab, title=title, title_align="left", subtitle_align="left",
                 subtitle=f"{hits} of the true top-{a.top} found · ε1={doc['eps_1']:.3f} per report")


def _deviation(campaign: Campaign, key: tuple[str, int], doc: dict, step: dict) -> float:
    """The largest |z| of a final against the truth: each frequency (exact variance) or the mean (its published
    variance); 0 for an insufficient step."""
    if doc["status"] == "insufficient":
        return 0.0
    if doc.get("kind") == "numeric":
        return abs(doc["mean"] - step["true_mean"]) / math.sqrt(doc["mean_variance"])
    if doc.get("kind") in ("string", "u64"):  # the found items that are true top items, against their truth
        truth = {e["item"]: e["frequency"] for e in step["true_top"]}
        zs = [abs(e["frequency"] - truth[e["item"]]) / ((e["ci95"][1] - e["ci95"][0]) / (2 * 1.959963984540054))
              for e in doc["top_k"] if e["item"] in truth and e["ci95"][1] > e["ci95"][0]]
        return max(zs, default=0.0)
    f = step["true_frequencies"]
    sd = np.sqrt(campaign.attribute(key[0]).protocol.variance_exact(f, doc["n"]))
    return float(np.max(np.abs(np.asarray(doc["frequencies"]) - f) / sd))


def run_demo(campaign_path: Path, devices: int, steps: int, workers: int, batch: int, step_seconds: float,
             seed: int | None, top: int, console: Console, keep_run_dir: bool = False) -> int:
    """Run the demo; returns the exit code (0 done, 130 interrupted by Ctrl-C or SIGTERM). The run directory
    (``ldp-demo-*`` in the system's temporary directory) is removed at the end unless ``keep_run_dir``."""
    campaign = Campaign.load(campaign_path)
    _terminated.clear()
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM cleans up like Ctrl-C
    previous_int = signal.getsignal(signal.SIGINT)
    run = Path(tempfile.mkdtemp(prefix="ldp-demo-"))
    try:
        return _run(run, campaign_path, campaign, devices, steps, workers, batch, step_seconds, seed, top, console)
    except KeyboardInterrupt:  # one that came out of a cleanup step: cleaned up as far as it got
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if not _terminated:
            # interrupted: the process exits now, and a late SIGINT must not turn the exit into a crash by
            # signal (an uncaught KeyboardInterrupt makes Python exit by SIGINT, status -2)
            signal.signal(signal.SIGINT, previous_int)
        if keep_run_dir:
            console.print(f"run directory kept: {run}", soft_wrap=True)
        else:
            shutil.rmtree(run, ignore_errors=True)


#: Set by SIGTERM: the exception the handler raises can land in code that swallows it (a ``__del__``, a
#: library's cleanup), so the demo's own loop checks this flag too and stops at its next refresh.
_terminated: list[int] = []


#: True while the fleet's event loop runs: a SIGTERM then only sets the flag, and the loop's own check raises
#: (an exception raised by the handler inside asyncio's or a client's internals does not always come out).
_in_loop: list[bool] = [False]


def _interrupt(signum: int, frame: Any) -> None:
    _terminated.append(signum)
    if not _in_loop[0]:
        raise KeyboardInterrupt(f"signal {signum}")


def _check_interrupted() -> None:
    if _terminated:
        raise KeyboardInterrupt(f"signal {_terminated[0]}")


def _run(run: Path, campaign_path: Path, campaign: Campaign, devices: int, steps: int, workers: int, batch: int,
         step_seconds: float, seed: int | None, top: int, console: Console) -> int:
    from ldpstream_dev.stack import LocalStack
    from ldpstream_dev.workers import WorkerProcess

    stack = LocalStack(run_dir=run / "stack")
    procs: list[WorkerProcess] = []
    try:
        with console.status("starting the local stack (tansu + redis-server) ..."):
            info = stack.up(stop_on_exit=True)
        console.print(f"stack: kafka {info.kafka_bootstrap}, redis {redact_url(info.redis_url)} (run dir {run})")
        with console.status(f"starting {workers} stream-app worker(s) ..."):
            procs = [WorkerProcess([campaign_path], info.kafka_bootstrap, info.redis_url, refresh_seconds=0.5,
                                   session_timeout=6.0, run_dir=run, name=f"worker{i}").start() for i in range(workers)]
            for p in procs:
                p.wait_ready(timeout=120)
        urls = [p.url for p in procs]
        console.print("workers: " + ", ".join(f"{u}/ (dashboard), {u}/metrics" for u in urls))
        dashboard = f"{urls[0]}/"
        console.print(f"[bold]dashboard: {dashboard}[/bold] (live: open it in a browser while the demo runs)")
        fleet = Fleet(FleetConfig(campaign, devices, steps, dataset="syn", p_change=0.25, base="zipf",
                                  batch_size=batch, seed=seed))
        truth: dict[tuple[str, int], dict] = {}  # the fleet's summary of each (attribute, step)
        finals: dict[tuple[str, int], dict] = {}

        async def main(live: Live) -> None:
            t0 = time.perf_counter()
            _check_interrupted()

            async def after_step(t: int, summary: FleetSummary) -> None:
                """Step ``t`` is acknowledged: show the estimates until its finals are in and the step is over."""
                for attr in campaign.attributes:
                    truth[(attr, t)] = summary.per_step[(attr, t)]
                sent = summary.reports_sent
                step_end = time.perf_counter() + step_seconds
                while time.perf_counter() < step_end or any((a, t) not in finals for a in campaign.attributes):
                    _check_interrupted()
                    for attr in campaign.attributes:
                        hist = _get(f"{urls[0]}/estimates/{campaign.id}/{attr}/history") or {}
                        for doc in hist.get("estimates", []):
                            finals[(attr, int(doc["t"]))] = doc
                    rate = sent / (time.perf_counter() - t0)
                    header = (f"[bold]ldp-stream demo[/bold] — campaign {campaign.id}: {devices:,} devices, "
                              f"step {t + 1}/{steps}, {sent:,} reports sent ({rate / 1e6:.2f}M/s), "
                              f"{len(finals)} final estimates · dashboard {dashboard}")
                    live.update(_view(campaign, truth, finals, header, top))
                    await asyncio.sleep(0.25)

            await publish(fleet, info.kafka_bootstrap, REPORTS_TOPIC, on_step=after_step,
                          on_progress=lambda _: _check_interrupted())

        with Live(console=console, refresh_per_second=4, transient=False) as live:
            _in_loop[0] = True
            try:
                asyncio.run(main(live))
            finally:
                _in_loop[0] = False
        _check_interrupted()
        zmax = max((_deviation(campaign, k, finals[k], truth[k]) for k in finals if k in truth), default=0.0)
        console.print()
        console.print(f"[green]done[/green]: {len(finals)} final estimates, largest deviation {zmax:.2f} standard "
                      f"deviations (frequencies: of the exact variance; means: of their published variance)")
        return 0
    except KeyboardInterrupt:
        console.print("\n[yellow]interrupted[/yellow]")
        return 130
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short,
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # nor a SIGINT (a child's process group may include us)
        with console.status("stopping workers and the stack ..."):
            for p in procs:
                p.stop()
            stack.down()
        console.print("cleaned up")
