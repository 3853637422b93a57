"""`ldp top`: a worker's live figures in the terminal, for SSH sessions (the dashboard page's content as text).

Polls one worker's HTTP API (``GET /campaigns``, ``/estimates/{c}/{a}`` and ``.../history``, ``/metrics``,
``/status``) and redraws: operations (reports/s: the increase of ``ldp_reports_total`` between two polls, none
with ``--once``; reports counted, rejections by reason, consumer lag, estimate
latency), and per attribute the latest step (final or open, ``n``), a sparkline of its histogram, the top
values with the 95% half-width, and the privacy figures (ε1, ε∞, worst-case longitudinal ε so far and its bound).
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

__all__ = ["Snapshot", "fetch_snapshot", "render", "reports_per_second", "run_top"]

_BLOCKS = " ▁▂▃▄▅▆▇█"


@dataclass
class Snapshot:
    """What one poll of a worker returned (``None`` / empty where it did not answer)."""

    url: str
    campaigns: list[dict[str, Any]] = field(default_factory=list)
    latest: dict[tuple[str, str], dict[str, Any] | None] = field(default_factory=dict)
    finals: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)  # metric -> samples
    status: dict[str, Any] | None = None
    taken: float = field(default_factory=time.monotonic)  # when the poll began

    def total(self, metric: str, **labels: str) -> float:
        return sum(v for lab, v in self.samples.get(metric, []) if all(lab.get(k) == x for k, x in labels.items()))


def _get(url: str, timeout: float = 5.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except (urllib.error.URLError, OSError):
        return None


def _json(url: str) -> Any:
    raw = _get(url)
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return None


def fetch_snapshot(url: str) -> Snapshot:
    """One poll of the worker at ``url`` (its base URL)."""
    url = url.rstrip("/")
    snap = Snapshot(url, status=_json(f"{url}/status"))
    snap.campaigns = (_json(f"{url}/campaigns") or {}).get("campaigns", [])
    for c in snap.campaigns:
        for a in c["attributes"]:
            base = f"{url}/estimates/{urllib.parse.quote(c['id'])}/{urllib.parse.quote(a['name'])}"
            snap.latest[(c["id"], a["name"])] = _json(base)
            hist = _json(f"{base}/history") or {}
            snap.finals[(c["id"], a["name"])] = sorted((d for d in hist.get("estimates", []) if d.get("final")),
                                                       key=lambda d: d["t"])
    text = _get(f"{url}/metrics")
    if text is not None:
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                snap.samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return snap


def _fmt(x: float | None, digits: int = 2) -> str:
    return "∞" if x is None else f"{x:.{digits}f}"


def _sparkline(values: list[float], width: int = 48) -> str:
    if not values:
        return ""
    chunk = max(1, -(-len(values) // width))
    cols = [max(values[i:i + chunk]) for i in range(0, len(values), chunk)]
    top = max(max(cols), 1e-12)
    return "".join(_BLOCKS[min(len(_BLOCKS) - 1, max(0, round(v / top * (len(_BLOCKS) - 1))))] for v in cols)


def reports_per_second(snap: Snapshot, previous: Snapshot | None) -> float | None:
    """Reports counted per second between two polls (``ldp_reports_total``; none without a previous poll, or
    after the worker restarted)."""
    if previous is None or previous.status is None or snap.taken <= previous.taken:
        return None
    grown = snap.total("ldp_reports_total") - previous.total("ldp_reports_total")
    return grown / (snap.taken - previous.taken) if grown >= 0 else None


def render(snap: Snapshot, values: int = 3, previous: Snapshot | None = None) -> Group:
    """The frame of one snapshot (``previous``: the poll before, for reports/s)."""
    st = snap.status
    if st is None:
        return Group(Panel(f"[red]no answer from {snap.url}[/red] (is the worker running? its web port?)"))
    ops = Table.grid(padding=(0, 3))
    rejected = {lab.get("reason", ""): v for lab, v in snap.samples.get("ldp_rejected_batches_total", []) if v > 0}
    latency_n = snap.total("ldp_estimate_latency_seconds_count")
    latency = snap.total("ldp_estimate_latency_seconds_sum") / latency_n if latency_n else None
    rate = reports_per_second(snap, previous)
    ops.add_row("reports/s", "-" if rate is None else f"{rate:,.0f}",
                "reports counted", f"{snap.total('ldp_reports_total'):,.0f}",
                "consumer lag", f"{snap.total('ldp_consumer_lag_messages'):,.0f} messages",
                "estimate latency", "-" if latency is None else f"{latency:.3f} s mean of {latency_n:.0f}")
    ops.add_row("rejected", ", ".join(f"{r} {v:,.0f}" for r, v in sorted(rejected.items())) or "none", "", "", "", "",
                "", "")
    problems = ", ".join(p.get("problem", "?") for p in st.get("problems", []))
    title = (f"worker {st.get('worker_id')} · partitions {st.get('assigned')}"
             f"{' · estimator' if st.get('estimator_leader') else ''}"
             f"{' · [red]problems: ' + problems + '[/red]' if problems else ''}")
    panels: list[Any] = [Panel(ops, title=f"Operations — {title}", title_align="left")]
    for c in snap.campaigns:
        for a in c["attributes"]:
            doc = snap.latest.get((c["id"], a["name"]))
            head = f"{c['id']} / {a['name']}  [{a['protocol']}, k={a['k']}]"
            if not doc:
                panels.append(Panel("waiting for the first estimate …", title=head, title_align="left"))
                continue
            if doc.get("kind") == "numeric":
                panels.append(Panel(_numeric_grid(doc, snap.finals.get((c["id"], a["name"]), [])),
                                    title=f"{c['id']} / {a['name']}  [{a['protocol']}, range "
                                          f"{a['range'][0]:g}..{a['range'][1]:g}]", title_align="left"))
                continue
            if doc.get("kind") in ("string", "u64"):
                panels.append(Panel(_open_grid(doc, snap.finals.get((c["id"], a["name"]), []), values),
                                    title=f"{c['id']} / {a['name']}  [{a['protocol']}, open domain]",
                                    title_align="left"))
                continue
            freq = doc.get("frequencies_norm_sub") or []
            labels = a.get("labels")
            order = sorted(range(len(freq)), key=lambda j: -freq[j])[:values]
            best = "  ".join(f"{labels[j] if labels else j}: {freq[j]:.4f}" for j in order)
            finals = snap.finals.get((c["id"], a["name"]), [])
            prev = [d for d in finals if d["t"] < doc["t"]]
            grid = Table.grid(padding=(0, 2))
            grid.add_row(f"t={doc['t']} {'final' if doc.get('final') else 'open'}", f"n={doc['n']:,}",
                         f"±{_fmt(doc.get('ci95_halfwidth'), 4)} (95%)", f"top: {best}")
            grid.add_row("histogram", _sparkline(freq), "previous", _sparkline(prev[-1]["frequencies_norm_sub"])
                         if prev and prev[-1].get("frequencies_norm_sub") else "-")
            grid.add_row("privacy", f"ε1={_fmt(doc.get('eps_1'))}  ε∞={_fmt(doc.get('eps_inf'))}",
                         f"worst-case longitudinal ε so far={_fmt(doc.get('eps_longitudinal_worst'))}",
                         f"bound {_fmt(doc.get('eps_longitudinal_bound'))} · {len(finals)} final steps")
            panels.append(Panel(grid, title=head, title_align="left"))
    return Group(*panels)


def _open_grid(doc: dict[str, Any], finals: list[dict[str, Any]], values: int) -> Table:
    """An open-domain attribute's latest estimate: its top items (the candidate's name, else the item id) with
    their frequencies ± 95%, and the frequency of each over the last finals."""
    grid = Table.grid(padding=(0, 2))
    status = "insufficient" if doc.get("top_k") is None else f"±{_fmt(doc.get('ci95_halfwidth'), 4)} (95%, noise floor)"
    grid.add_row(f"t={doc['t']} {'final' if doc.get('final') else 'open'}", f"n={doc['n']:,}", status)
    for rank, e in enumerate((doc.get("top_k") or [])[:values], 1):
        past = [next((x["frequency"] for x in (d.get("top_k") or []) if x["item"] == e["item"]), 0.0)
                for d in finals[-40:]]
        half = (e["ci95"][1] - e["ci95"][0]) / 2
        grid.add_row(f"{rank}. {e['value'] or e['item']}", f"{e['frequency']:.4f} ±{half:.4f}",
                     _sparkline(past) if past else "-")
    return grid


def _numeric_grid(doc: dict[str, Any], finals: list[dict[str, Any]]) -> Table:
    """A numeric attribute's latest estimate: the mean ± 95%, the means of the last finals, the quantiles."""
    grid = Table.grid(padding=(0, 2))
    mean = "insufficient" if doc.get("mean") is None else f"mean {doc['mean']:.4g} ±{_fmt(doc.get('mean_ci95_halfwidth'), 4)} (95%)"
    grid.add_row(f"t={doc['t']} {'final' if doc.get('final') else 'open'}", f"n={doc['n']:,}", mean)
    means = [d["mean"] for d in finals[-40:] if d.get("mean") is not None]
    grid.add_row("mean over time", _sparkline(means) if means else "-", f"{len(finals)} final steps")
    qs = doc.get("quantiles") or {}
    if qs:
        grid.add_row("quantiles", "  ".join(f"{q} {b['value']:.4g}" + (f" [{b['lower']:.4g}, {b['upper']:.4g}]"
                                                                         if b.get("lower") is not None else "")
                                            for q, b in qs.items()), "")
    grid.add_row("privacy", f"ε1={_fmt(doc.get('eps_1'))}  ε∞={_fmt(doc.get('eps_inf'))}",
                 f"worst-case longitudinal ε so far={_fmt(doc.get('eps_longitudinal_worst'))}")
    return grid


def run_top(url: str, interval: float, once: bool, values: int, console: Console) -> int:
    """Draw until Ctrl-C (``once``: one frame, exit 0 if the worker answered, else 1)."""
    if once:
        snap = fetch_snapshot(url)
        console.print(render(snap, values))
        return 0 if snap.status is not None else 1
    try:
        previous = fetch_snapshot(url)
        with Live(render(previous, values), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                time.sleep(interval)
                snap = fetch_snapshot(url)
                live.update(render(snap, values, previous))
                previous = snap
    except KeyboardInterrupt:
        return 0
