"""Issue 12: observability proven with the real tools.

A real Prometheus server (Debian's ``prometheus``, installed by :mod:`ldpstream_dev.debian` when missing) runs the
deployed configuration (``deploy/prometheus/prometheus.yml``: same jobs and relabelings, targets replaced by
this module's worker and ingest service, 1 s scrapes) while a simulated fleet streams a campaign through the
real broker and Redis. The tests read the pipeline's figures back through Prometheus's query API, run every
query of the Grafana dashboard against that Prometheus (each must return data), check the metric names
with ``promtool check metrics`` and Prometheus's conventions, and load the worker's built-in dashboard page in
headless Chromium (Debian's ``chromium``), waiting until every chart has data, watching it update while more
steps stream, and saving a screenshot; ``ldp top --once`` prints the same figures. The campaign has two
categorical attributes and two numeric ones (issue 23: a Piecewise Mechanism mean, a Square Wave distribution),
whose means, half-widths and quantiles are read back through Prometheus, the dashboard's "Numeric metrics" panels
and the page's numeric charts; and an open-domain one (issue 24: strings nobody listed, an HCMS sketch ranking its
candidates), whose top-K is read back through Prometheus (one series per rank), the dashboard's "Open domains"
panels and the page's top-K table.

Skips (loudly, with the reason) only where the Debian packages cannot be installed (not root, no apt-get); a
failed apt-get install fails the test with apt's output.
The apt install, when needed, happens in the first test's setup: its timeout allows for it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import subprocess
import sys
import time
import os
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import yaml

from ldpstream_dev.debian import ToolUnavailable
from ldpstream_dev.prometheus import PrometheusServer, promtool_binary, prometheus_binary, render_config
from ldpstream_dev.processes import stop_child
from ldpstream_dev.workers import (WorkerProcess, estimate_history, final_estimates, produce_messages,
                              unique_campaign_file, wait_for_counts, wait_until)
from producers.fleet import FleetConfig, publish
from stream_app.settings import free_port
from wire.campaign import Campaign
from wire.topics import Topics

# setup may apt-get install prometheus (and the browser test chromium): minutes on a slow mirror
pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "tests" / "data" / "e2e.toml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "ldp-stream.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DEVICES, STEPS, RATE = 10_000, 5, 25_000.0  # 5 attributes: 250k reports over ~10 s: Prometheus sees the stream flow
# Issue 23: numeric attributes beside the campaign's categorical ones (appended to it in the run directory)
NUMERIC_ATTRIBUTES = """
[[attributes]]
name = "session_seconds"
type = "numeric"
range = [0.0, 600.0]
mechanism = "PM"
eps = 2.0

[[attributes]]
name = "latency_ms"
type = "numeric"
range = [0.0, 1000.0]
mechanism = "SW"
eps = 2.0
d_in = 64
d_out = 64
"""
# Issue 24: an open-domain attribute (the fleet's devices hold Zipf strings "crash_signature-0000003"): an HCMS sketch
# ranks its candidates, 5 of them in each step's top-K
OPEN_ATTRIBUTES = """
[[attributes]]
name = "crash_signature"
type = "string"
protocol = "HCMS"
eps = 4.0
m = 256
k = 16
top = 5
candidates = ["crash_signature-0000000", "crash_signature-0000001", "crash_signature-0000002",
              "crash_signature-0000003", "crash_signature-0000004", "crash_signature-0000005", "not-a-crash"]
"""
OPEN_TOP = 5
SCRAPE = 1.0  # seconds between scrapes
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval: 4 scrape intervals
WORKER_JOB, INGEST_JOB = "ldp-workers", "ldp-ingest"
# label names a series of this project may carry (all bounded: no device, token or free text)
BOUNDED_LABELS = {"campaign", "attribute", "value", "reason", "partition", "trigger", "final", "problem",
                  "rank", "item",  # an open domain's top-K: one series per rank, its item replaced (not added)
                  "component", "status", "le", "quantile", "percentile", "bound",
                  "version", "python_version", "numpy_version", "numba_version"}  # ldp_build_info: one per build


def _installed_or_skip(find: Callable[[], str]) -> str:
    """``find()`` (the path of a binary, installed with apt if missing), or a loud skip where this machine cannot
    install packages."""
    try:
        return find()
    except ToolUnavailable as exc:
        message = f"SKIPPED, observability not proven: {exc}"
        warnings.warn(message, stacklevel=2)
        print(f"\n*** {message} ***", file=sys.stderr)
        pytest.skip(message)


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def _post_json(url: str, doc: Any) -> int:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# ---------------------------------------------------------------------------- the observed pipeline
@pytest.fixture(scope="module")
def prometheus_bin() -> str:
    return _installed_or_skip(prometheus_binary)


@pytest.fixture(scope="module")
def pipeline(local_stack, tmp_path_factory, prometheus_bin) -> Iterator[SimpleNamespace]:
    """A worker and an ingest service scraped by a real Prometheus while a fleet streams STEPS steps."""
    run = tmp_path_factory.mktemp("observability")
    info = local_stack.info
    path = unique_campaign_file(CAMPAIGN, run)
    path.write_text(path.read_text() + NUMERIC_ATTRIBUTES + OPEN_ATTRIBUTES)
    campaign = Campaign.load(path)
    assert [a.numeric for a in campaign.attributes.values()] == [False, False, True, True, False]
    assert [a.open_domain for a in campaign.attributes.values()] == [False, False, False, False, True]
    app_id = f"obs-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(f"{app_id}.")
    # per_value_metrics: the dashboard's histogram panels read ldp_estimated_frequency_ratio (off by default)
    worker = WorkerProcess([path], info.kafka_bootstrap, info.redis_url, app_id=app_id, topic_prefix=f"{app_id}.",
                           partitions=2, refresh_seconds=0.5, run_dir=run, name="worker",
                           per_value_metrics=True).start()
    # The ingest publishes to a topic of its own (no worker here consumes it): this module checks that
    # Prometheus scrapes it; tests/test_ingest_service.py checks the pipeline behind it.
    ingest_port = free_port()
    ingest_log = open(run / "ingest.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    env.update(local_stack.client_env(), PYTHONPATH=str(ROOT))
    ingest = subprocess.Popen(
        [sys.executable, "-m", "ldpstream_cli", "ingest", "-c", str(path), "--kafka", info.kafka_bootstrap, "--redis",
         info.redis_url, "--topic-prefix", f"{app_id}-ingest.", "--port", str(ingest_port), "--processes", "1",
         "--open"], stdout=ingest_log, stderr=subprocess.STDOUT, env=env, cwd=run, start_new_session=True)
    ingest_url = f"http://127.0.0.1:{ingest_port}"
    prom = PrometheusServer(run / "prometheus")
    try:
        worker.wait_ready(timeout=90)
        host = worker.url.removeprefix("http://")
        config = render_config({WORKER_JOB: [host], "prometheus": ["self"], INGEST_JOB: [f"127.0.0.1:{ingest_port}"]},
                               scrape_interval=f"{SCRAPE:g}s")
        prom.start(config)
        wait_until(prom.targets, lambda ts: len(ts) == 3 and all(t["health"] == "up" for t in ts), 60.0,
                   "every target up", lambda ts: str([(t["job"], t["health"], t.get("lastError")) for t in ts or []]))
        started = time.time()
        # two requests to the ingest service, one of them refused: first, so that the ingest's series have
        # samples over most of the run (a rate needs two in its window)
        proto = campaign.attribute("app_version").protocol
        reports = proto.randomize(np.array([1, 2]), np.random.default_rng(3), state=proto.new_state(2))
        docs = [{"campaign": campaign.id, "attribute": "app_version",
                 "payload": base64.b64encode(proto.encode(reports[i:i + 1])).decode()} for i in range(2)]
        assert _post_json(f"{ingest_url}/reports", docs) == 200, ingest_log.name
        assert _post_json(f"{ingest_url}/reports", {"campaign": campaign.id, "attribute": "nope"}) == 400
        summary = asyncio.run(publish(
            FleetConfig(campaign, DEVICES, STEPS, dataset="syn", p_change=0.25, base="zipf", batch_size=5_000,
                        seed=12, rate=RATE), info.kafka_bootstrap, topic=topics.reports, partitions=2))
        # one batch that does not validate: a rejection, by reason
        produce_messages(info.kafka_bootstrap, topics.reports, [(b"0:app_version", b"not an envelope")])
        expected = {key: (v["support"], v["n"]) for key, v in summary.per_step.items()}
        wait_for_counts(info.redis_url, campaign.id, expected, timeout=90)
        for attr in campaign.attributes:
            wait_until(lambda: estimate_history(worker, campaign.id, attr),
                       lambda h: len(final_estimates(h)) == STEPS, 60.0, f"every final of {attr}")
        # Prometheus has scraped the end of the stream: every report, the rejection, every final's latency
        total, finals = DEVICES * STEPS * len(campaign.attributes), STEPS * len(campaign.attributes)
        scraped = (f'sum(ldp_reports_total{{campaign="{campaign.id}"}}) == {total} and on() '
                   f"sum(ldp_rejected_batches_total) == 1 and on() sum(ldp_estimate_latency_seconds_count) >= {finals}")
        _eventually(prom, scraped, bool, "Prometheus scraped the whole stream")
        yield SimpleNamespace(campaign=campaign, worker=worker, ingest_url=ingest_url, prom=prom, started=started,
                              summary=summary, run=run, bootstrap=info.kafka_bootstrap, topics=topics)
    finally:
        prom.stop()
        stop_child(ingest)
        ingest_log.close()
        worker.stop()


def _values(result: list[dict[str, Any]]) -> list[float]:
    """Every finite sample of a query or query_range result."""
    out = []
    for series in result:
        for _, v in series.get("values", [series["value"]] if "value" in series else []):
            if math.isfinite(float(v)):
                out.append(float(v))
    return out


def _numeric(c: Campaign, *, distribution: bool = False) -> list[str]:
    """The campaign's numeric attributes (``distribution``: those whose mechanism estimates a distribution, SW)."""
    return [n for n, a in c.attributes.items() if a.numeric and (a.protocol.is_distribution or not distribution)]


def _open(c: Campaign) -> list[str]:
    """The campaign's open-domain attributes (``type = "string"`` or ``"u64"``: a top-K, no histogram)."""
    return [n for n, a in c.attributes.items() if a.open_domain]


def _eventually(prom: PrometheusServer, expr: str, ok, what: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Poll the instant query ``expr`` until ``ok(result)`` (Prometheus sees new values one scrape later)."""
    return wait_until(lambda: prom.query(expr), ok, timeout, what, lambda r: json.dumps(r))


# ---------------------------------------------------------------------------- Prometheus
def test_prometheus_reads_back_the_pipeline_figures(pipeline) -> None:
    prom, c = pipeline.prom, pipeline.campaign
    sel = f'campaign="{c.id}"'
    total = DEVICES * STEPS * len(c.attributes)
    # every report counted, seen through Prometheus
    _eventually(prom, f"sum(ldp_reports_total{{{sel}}})", lambda r: _values(r) == [total], f"{total} reports")
    # reports/s: the rate of the counter during the stream, in all and per worker (no gauge repeats it)
    rates = _values(prom.query_range(f"sum(rate(ldp_reports_total{{{sel}}}[{RATE_INTERVAL}]))",
                                     pipeline.started, time.time(), SCRAPE))
    assert max(rates) > 0.2 * RATE, f"peak reports/s {max(rates):.0f} (the fleet sent {RATE:.0f}/s)"
    per_worker = prom.query_range(f"sum by (instance) (rate(ldp_reports_total{{{sel}}}[{RATE_INTERVAL}]))",
                                  pipeline.started, time.time(), SCRAPE)
    assert len(per_worker) == 1 and max(_values(per_worker)) > 0.2 * RATE, per_worker
    # estimated frequencies: k values per categorical attribute, summing to ~1 (unbiased, raw); a numeric one's mean,
    # its 95% half-width and (Square Wave) its quantiles with their bootstrap bounds: those of the latest final
    for attr, a in c.attributes.items():
        latest = json.loads(_get(f"{pipeline.worker.url}/estimates/{c.id}/{attr}"))
        assert latest["t"] == STEPS - 1 and latest["final"], latest["t"]
        if a.open_domain:  # issue 24: the latest top-K, one series per rank (1 = most frequent)
            assert latest["kind"] == "string" and latest["frequencies"] is None and len(latest["top_k"]) == OPEN_TOP
            top = _eventually(prom, f'ldp_estimated_top_frequency_ratio{{{sel}, attribute="{attr}"}}',
                              lambda r: len(r) == OPEN_TOP, f"{OPEN_TOP} top-K series of {attr}")
            got = {s["metric"]["rank"]: (s["metric"]["item"], s["metric"]["value"], float(s["value"][1])) for s in top}
            assert sorted(got, key=int) == [str(r) for r in range(1, OPEN_TOP + 1)], sorted(got)
            want = {str(r): (e["item"], e["value"] or "", e["frequency"]) for r, e in enumerate(latest["top_k"], 1)}
            assert {r: g[:2] for r, g in got.items()} == {r: w[:2] for r, w in want.items()}, got
            ranks = [str(r) for r in range(1, OPEN_TOP + 1)]
            assert [got[r][2] for r in ranks] == pytest.approx([want[r][2] for r in ranks], rel=1e-12)
            assert {e["value"] for e in latest["top_k"]} <= set(a.candidates)  # a sketch ranks its candidates
        elif a.numeric:
            got = _eventually(prom, f'{{__name__=~"ldp_estimated_mean|ldp_estimated_mean_ci95_halfwidth", {sel}, '
                              f'attribute="{attr}"}}', lambda r: len(r) == 2, f"the mean of {attr}")
            got = {s["metric"]["__name__"]: float(s["value"][1]) for s in got}
            assert got == pytest.approx({"ldp_estimated_mean": latest["mean"],
                                         "ldp_estimated_mean_ci95_halfwidth": latest["mean_ci95_halfwidth"]}, rel=1e-12)
            lo, hi = latest["range"]
            assert latest["frequencies"] is None and lo <= latest["mean"] <= hi, latest["mean"]
            quantiles = _eventually(prom, f'ldp_estimated_quantile{{{sel}, attribute="{attr}"}}',
                                    lambda r, n=9 * a.protocol.is_distribution: len(r) == n, f"the quantiles of {attr}")
            got = {(s["metric"]["percentile"], s["metric"]["bound"]): float(s["value"][1]) for s in quantiles}
            want = {(q, b): v for q, bounds in (latest["quantiles"] or {}).items() for b, v in bounds.items()}
            assert got == pytest.approx(want, rel=1e-12) and set(want) <= {(q, b) for q in ("p50", "p90", "p99")
                                                                         for b in ("value", "lower", "upper")}
            assert all(lo <= got[q, "lower"] <= got[q, "value"] <= got[q, "upper"] <= hi for q, _ in want), got
        else:
            freq = _eventually(prom, f'ldp_estimated_frequency_ratio{{{sel}, attribute="{attr}"}}',
                               lambda r, k=a.k: len(r) == k, f"{a.k} frequencies of {attr}")
            by_value = {s["metric"]["value"]: float(s["value"][1]) for s in freq}
            assert by_value == pytest.approx({str(j): f for j, f in enumerate(latest["frequencies"])}, rel=1e-12)
        assert prom.value(f'ldp_latest_step{{{sel}, attribute="{attr}"}}') == STEPS - 1
        assert prom.value(f'ldp_step_reports{{{sel}, attribute="{attr}"}}') == DEVICES
        # privacy figures: the campaign's ε1 and ε∞, and the worst-case longitudinal loss within its bound
        assert prom.value(f'ldp_eps_first{{{sel}, attribute="{attr}"}}') == pytest.approx(a.protocol.eps_first)
        assert prom.value(f'ldp_eps_inf{{{sel}, attribute="{attr}"}}') == pytest.approx(a.protocol.eps_inf)
        worst = prom.value(f'ldp_eps_longitudinal_worst{{{sel}, attribute="{attr}"}}')
        # null: infinite (a memoryless numeric mechanism's loss after its second report)
        assert worst == pytest.approx(latest["eps_longitudinal_worst"] if latest["eps_longitudinal_worst"] is not None
                                      else math.inf)
        assert a.protocol.eps_first <= worst <= a.protocol.worst_case_loss + 1e-9, worst
    # rejections by reason: the one bad batch
    rejected = _eventually(prom, "ldp_rejected_batches_total > 0", lambda r: len(r) == 1, "one rejection reason")
    assert rejected[0]["metric"]["reason"] and _values(rejected) == [1.0], rejected
    # consumer lag: a series per owned partition, drained to 0
    lag = _eventually(prom, "ldp_consumer_lag_messages", lambda r: len(r) == 2 and _values(r) == [0.0, 0.0],
                      "lag 0 on both partitions")
    assert {s["metric"]["partition"] for s in lag} == {"0", "1"}
    assert prom.value("max(ldp_consumer_lag_seconds)") is not None
    # estimate latency: one observation per final estimate at least, and a finite p95
    finals = STEPS * len(c.attributes)
    _eventually(prom, "sum(ldp_estimate_latency_seconds_count)", lambda r: _values(r) and _values(r)[0] >= finals,
                f">= {finals} latency observations")
    p95 = _values(prom.query_range("histogram_quantile(0.95, sum by (le) (rate(ldp_estimate_latency_seconds_bucket"
                                   f"[{RATE_INTERVAL}])))", pipeline.started, time.time(), SCRAPE))
    assert p95 and 0 < max(p95) < 60, p95
    # the ingest service is scraped too: its accepted reports and its refusal, by reason
    _eventually(prom, f'sum(ldp_ingest_reports_total{{{sel}, job="{INGEST_JOB}"}})', lambda r: _values(r) == [2.0],
                "2 reports through the ingest")
    _eventually(prom, f'sum(ldp_ingest_refused_requests_total{{job="{INGEST_JOB}"}})', lambda r: _values(r) == [1.0],
                "1 refused ingest request")


def _grafana_vars(expr: str, campaign: str, attribute: str, range_s: float) -> str:
    # the numeric panels repeat over $numeric or $distribution, the open-domain ones over $open: one attribute per
    # repetition, as $attribute's row
    values = {"campaign": campaign, "attribute": attribute, "numeric": attribute, "distribution": attribute,
              "open": attribute,
              "__rate_interval": RATE_INTERVAL, "__interval": f"{SCRAPE:g}s", "__range": f"{math.ceil(range_s)}s"}
    return re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: values[m.group(1)], expr)


def _panel_attributes(expr: str, c: Campaign) -> list[str]:
    """The attributes a query is meant to show data for: the numeric ones for $numeric, Square Wave's for
    $distribution, the open-domain ones for $open, the categorical ones for the per-value frequencies (a numeric or
    open-domain attribute has none), else all."""
    if "$open" in expr:
        return _open(c)
    if "$numeric" in expr:
        return _numeric(c)
    if "$distribution" in expr:
        return _numeric(c, distribution=True)
    if "ldp_estimated_frequency_ratio" in expr:
        return [n for n, a in c.attributes.items() if not a.numeric and not a.open_domain]
    return list(c.attributes)


def test_every_grafana_panel_returns_data(pipeline) -> None:
    """Every query of the dashboard, with its variables set as Grafana would, returns data over the run."""
    prom, c = pipeline.prom, pipeline.campaign
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (datasource,) = yaml.safe_load(DATASOURCES.read_text(encoding="utf-8"))["datasources"]
    panels = [p for top in dashboard["panels"] for p in (top, *top.get("panels", []))]
    # the variables list this run's campaign and exactly its attributes (numeric: those with a mean; distribution:
    # those with quantiles; open: those with a top-K), their queries run as Grafana would with every attribute selected
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    expected = {"campaign": None, "attribute": list(c.attributes), "numeric": _numeric(c),
                "distribution": _numeric(c, distribution=True), "open": _open(c)}
    assert set(variables) == set(expected), sorted(variables)
    for name, want in expected.items():
        assert variables[name]["datasource"]["uid"] == datasource["uid"]
        q = variables[name]["query"] if isinstance(variables[name]["query"], str) else variables[name]["query"]["query"]
        match, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q).groups()
        match = match.replace("$campaign", c.id).replace("$attribute", ".*")
        got = prom.label_values(label, match)
        assert (c.id in got) if want is None else sorted(got) == sorted(want), (name, got)
    empty: list[str] = []
    checked = 0
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == datasource["uid"], panel["title"]
            for attr in _panel_attributes(target["expr"], c):  # a repeated row or panel once per attribute
                end = time.time()
                expr = _grafana_vars(target["expr"], c.id, attr, end - pipeline.started)
                result = prom.query_range(expr, pipeline.started, end, SCRAPE)
                checked += 1
                if not _values(result):
                    empty.append(f"{panel['title']!r} {target['refId']} ({attr}): {expr}")
    assert checked >= 40
    assert not empty, "panels without data:\n" + "\n".join(empty)


# ---------------------------------------------------------------------------- metric names
def _families(text: str) -> dict[str, tuple[str, list[tuple[str, dict[str, str]]]]]:
    """family -> (type, [(sample name, labels)]) of a text exposition."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    out: dict[str, tuple[str, list]] = {name: (kind, []) for name, kind in types.items()}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ")[0] else (line.split(" ")[0], "", "")
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
        family = max((f for f in out if name.startswith(f)), key=len)
        out[family][1].append((name, labels))
    return out


@pytest.mark.parametrize("service", ["worker", "ingest"])
def test_metric_names_follow_prometheus_conventions(pipeline, service: str) -> None:
    url = pipeline.worker.url if service == "worker" else pipeline.ingest_url
    text = _get(f"{url}/metrics").decode()
    lint = subprocess.run([promtool_binary(), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=30)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr
    families = _families(text)
    # issue 22: the build, the process metrics, and no "<name>_created" series beside counters and histograms
    assert not [ln for ln in text.splitlines() if "_created" in ln], "a _created series"
    (build,) = families["ldp_build_info"][1]
    assert build[1]["version"] and build[1]["python_version"], build
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds"):
        samples = families[name][1]
        # the ingest: one series per process (pid); its test runs one process
        assert len(samples) == 1 and (service == "worker") != ("pid" in samples[0][1]), (name, samples)
    ours = {f: v for f, v in families.items() if f.startswith("ldp_")}
    assert len(ours) >= (20 if service == "worker" else 5), sorted(ours)
    # (an open-domain attribute's k is its sketch's support; its top-K has `top` series)
    k_max = max(a.k for a in pipeline.campaign.attributes.values() if not a.open_domain)
    for family, (kind, samples) in ours.items():
        assert re.fullmatch(r"ldp_[a-z0-9_]+", family), family
        names = {s for s, _ in samples}
        if kind == "counter":
            assert family.endswith("_total") and names <= {family}, f"counter {family} must end in _total: {names}"
        else:
            assert not family.endswith("_total"), f"{family} is a {kind}: only counters end in _total"
        if kind == "histogram" or re.search(r"latency|duration|lag_seconds|_seconds", family):
            assert family.endswith("_seconds"), f"{family}: a time must be in seconds, named _seconds"
        if re.search(r"millis|_ms$|micro|minutes|_kb|_mb|percent", family):
            pytest.fail(f"{family}: use base units (seconds, bytes, ratios)")
        label_names = {k for _, labels in samples for k in labels}
        assert label_names <= BOUNDED_LABELS, f"{family}: unbounded or unexpected labels {label_names - BOUNDED_LABELS}"
        # bounded cardinality: at most one series per domain value (and bucket) of each attribute
        assert len(samples) <= 2 * (k_max + 20) * len(pipeline.campaign.attributes), (family, len(samples))


# ---------------------------------------------------------------------------- ldp top
def test_ldp_top_prints_the_live_figures(pipeline) -> None:
    c = pipeline.campaign
    out = subprocess.run([sys.executable, "-m", "ldpstream_cli", "top", "--url", pipeline.worker.url, "--once"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    print(text)  # shown on failure (and with -s)
    reason = pipeline.prom.query("ldp_rejected_batches_total > 0")[0]["metric"]["reason"]
    assert f"{DEVICES * STEPS * len(c.attributes):,}" in text and f"{reason} 1" in text, text
    for attr in c.attributes:
        assert f"{c.id} / {attr}" in text, text
    closed = [n for n in c.attributes if n not in _open(c)]  # an open-domain panel: its top items, no privacy row
    assert text.count(f"t={STEPS - 1} final") == len(c.attributes) and text.count("ε∞=2.00") == len(closed), text
    for attr in _open(c):
        latest = json.loads(_get(f"{pipeline.worker.url}/estimates/{c.id}/{attr}"))
        assert f"1. {latest['top_k'][0]['value']}" in text, text
    assert "consumer lag" in text and "estimate latency" in text and "worst-case longitudinal" in text
    down = subprocess.run([sys.executable, "-m", "ldpstream_cli", "top", "--url", f"http://127.0.0.1:{free_port()}", "--once"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "no answer" in down.stdout


# ---------------------------------------------------------------------------- the built-in dashboard page
MORE_STEPS = 3  # streamed while the page is open: it must update without a reload
SCREENSHOT_DIR_ENV = "LDP_SCREENSHOT_DIR"  # also save the screenshot there (docs/ for the README's picture)
_CHARTS_JS = """[...document.querySelectorAll('figure.chart')].map(f => ({
  id: f.id, chart: f.dataset.chart, attribute: f.dataset.attribute || null, points: Number(f.dataset.points),
  t: f.dataset.t || null, previousT: f.dataset.previousT || null, data: Object.assign({}, f.dataset),
  legend: f.querySelector('.legend').textContent, marks: f.querySelectorAll('svg rect, svg path').length,
  bands: f.querySelectorAll('svg .bands > *').length,
  quantileLines: f.querySelectorAll('svg line.quantile').length}))"""
# the rows of the page's top-K tables: the top-K's, then the candidates'
_TOP_TABLES_JS = """Object.fromEntries([...document.querySelectorAll('figure[data-chart=topk]')].map(f => [
  f.dataset.attribute, {
  top: [...f.querySelectorAll('tbody.top tr')].map(r => ({item: r.dataset.item || null,
                                                            cells: [...r.cells].map(c => c.textContent)})),
  candidates: [...f.querySelectorAll('tbody.candidates tr')].filter(r => r.cells.length === 4)
    .map(r => [...r.cells].map(c => c.textContent)),
  bars: f.querySelectorAll('tbody svg.ibar').length}]))"""


@pytest.fixture(scope="module")
def chromium_bin() -> str:
    from ldpstream_dev.browser import chromium_binary

    return _installed_or_skip(chromium_binary)


def test_dashboard_page_in_headless_chromium(pipeline, chromium_bin, tmp_path) -> None:
    """Runs last in this module: it streams MORE_STEPS more steps while the page is open."""
    from ldpstream_dev.browser import HeadlessChromium

    c = pipeline.campaign
    last = STEPS + MORE_STEPS - 1
    with HeadlessChromium(width=1440, height=900, run_dir=tmp_path / "chromium") as browser:
        browser.open(f"{pipeline.worker.url}/")
        try:
            browser.wait_for("document.body.dataset.ready === 'true'", 60.0, "every chart has data")
        except TimeoutError as exc:  # which charts are still empty
            charts = [(x["id"], x["points"], x["data"].get("settled")) for x in browser.evaluate(_CHARTS_JS)]
            raise AssertionError(f"{exc}; charts (id, points, settled): {charts}; status: "
                                 f"{browser.evaluate('document.getElementById(`status`).textContent')}") from None
        assert not browser.errors, browser.errors
        before = {x["id"]: x for x in browser.evaluate(_CHARTS_JS)}
        assert {x["t"] for x in before.values() if x["chart"] in ("histogram", "mean", "topk")} == {str(STEPS - 1)}
        sections = browser.evaluate("Object.fromEntries([...document.querySelectorAll('#attributes section')]"
                                    ".map(s => [s.dataset.attribute, s.dataset.type]))")
        assert sections == {n: "string" if a.open_domain else "numeric" if a.numeric else "categorical"
                            for n, a in c.attributes.items()}, sections
        # live: more steps while the page is open, no reload
        asyncio.run(publish(FleetConfig(c, DEVICES, MORE_STEPS, dataset="syn", p_change=0.25, base="zipf",
                                        batch_size=5_000, seed=13, rate=RATE, first_step=STEPS),
                            pipeline.bootstrap, topic=pipeline.topics.reports))
        browser.wait_for(f"[...document.querySelectorAll('figure[data-chart=histogram]')]"
                         f".every(f => f.dataset.t === '{last}' && f.dataset.previousT === '{last - 1}')",
                         60.0, "the histograms show the new last step next to the previous one")
        browser.wait_for(f"[...document.querySelectorAll('figure[data-chart=heatmap], figure[data-chart=mean], "
                         f"figure[data-chart=topk_time]')]"
                         f".every(f => f.dataset.points === '{STEPS + MORE_STEPS}')", 60.0,
                         "every final in the heatmaps and the means over time")
        browser.wait_for(f"[...document.querySelectorAll('figure[data-chart=mean], figure[data-chart=distribution], "
                         f"figure[data-chart=topk]')]"
                         f".every(f => f.dataset.t === '{last}' && f.dataset.final === 'true')",
                         30.0, "the numeric charts and the top-K tables show the last step's final")
        browser.wait_for("Math.max(...ops.map(s => s.rps)) > 0 && ops[ops.length - 1].lag === 0", 30.0,
                         "reports/s seen during the stream, the lag drained after it")
        charts = browser.evaluate(_CHARTS_JS)
        tables = browser.evaluate(_TOP_TABLES_JS)
        shot = browser.screenshot(tmp_path / "dashboard.png")
        assert not browser.errors, browser.errors
    by_attr: dict[str, dict[str, dict]] = {}
    for x in charts:
        by_attr.setdefault(x["attribute"] or "", {})[x["chart"]] = x
    assert set(by_attr) == {"", *c.attributes}, sorted(by_attr)
    finals = STEPS + MORE_STEPS
    for attr in _numeric(c):  # issue 23: the mean over time in its band; Square Wave's distribution and quantiles
        a, charts_of = c.attributes[attr], by_attr[attr]
        latest = json.loads(_get(f"{pipeline.worker.url}/estimates/{c.id}/{attr}"))
        assert latest["t"] == last and latest["final"], latest["t"]
        want = {"mean", "privacy"} | ({"distribution", "quantiles"} if a.protocol.is_distribution else set())
        assert set(charts_of) == want, sorted(charts_of)
        mean = charts_of["mean"]
        assert mean["points"] == finals and mean["bands"] >= 1 and "95% band" in mean["legend"], mean
        assert float(mean["data"]["mean"]) == pytest.approx(latest["mean"], rel=1e-12), mean["data"]
        assert float(mean["data"]["halfwidth"]) == pytest.approx(latest["mean_ci95_halfwidth"], rel=1e-12)
        assert mean["points"] > before["mean-" + f"{c.id}-{attr}".replace(".", "_")]["points"]
        # ε1 and ε∞ per final, the worst case while finite (a memoryless mechanism's is infinite from step 2 on)
        finite = sum(math.isfinite(a.protocol.longitudinal_bound(s)) for s in range(1, finals + 1))
        assert charts_of["privacy"]["points"] == 2 * finals + finite, charts_of["privacy"]
        if a.protocol.is_distribution:
            dist, quant = charts_of["distribution"], charts_of["quantiles"]
            grid = latest["distribution"]["grid"]
            assert dist["points"] == len(grid) and dist["t"] == str(last), dist
            # a bar per grid point and an interval per quantile, a line at each quantile; the final's figures
            assert dist["marks"] >= len(grid) + 3 and dist["quantileLines"] == 3, dist
            assert json.loads(dist["data"]["quantiles"]) == {q: [v["value"], v["lower"], v["upper"]]
                                                              for q, v in latest["quantiles"].items()}, dist["data"]
            assert all(f"{q} " in dist["legend"] for q in ("p50", "p90", "p99")) and "[" in dist["legend"], dist
            assert quant["points"] == 3 * finals and quant["bands"] >= 3, quant  # p50, p90, p99 each in its band
            assert all(f"{q} (95% interval)" in quant["legend"] for q in ("p50", "p90", "p99")), quant["legend"]
    for attr in _open(c):  # issue 24: the latest top-K as a table, its items over time, the privacy chart
        a, charts_of, table = c.attributes[attr], by_attr[attr], tables[attr]
        latest = json.loads(_get(f"{pipeline.worker.url}/estimates/{c.id}/{attr}"))
        assert latest["t"] == last and latest["final"] and len(latest["top_k"]) == OPEN_TOP, latest["t"]
        assert set(charts_of) == {"topk", "topk_time", "privacy"}, sorted(charts_of)
        top = charts_of["topk"]
        assert top["points"] == OPEN_TOP and top["t"] == str(last), top
        assert json.loads(top["data"]["items"]) == [[e["item"], e["value"], e["frequency"]] for e in latest["top_k"]]
        # a row per item, most frequent first: its rank, name (the candidate, else the item id), frequency and interval
        assert [r["item"] for r in table["top"]] == [e["item"] for e in latest["top_k"]], table
        for rank, (row, e) in enumerate(zip(table["top"], latest["top_k"]), 1):
            rank_cell, name, freq, interval = row["cells"]
            assert rank_cell == str(rank) and name == (e["value"] or e["item"]) and freq.endswith("%"), row
            assert float(freq[:-1]) == pytest.approx(100 * e["frequency"], abs=0.051), (row, e)
            lo, hi = (float(x.strip(" []%")) for x in interval.split(","))
            assert [lo, hi] == pytest.approx([100 * e["ci95"][0], 100 * e["ci95"][1]], abs=0.051), (row, e)
        # the candidates below, in the campaign's order; an interval bar per row
        assert [r[1] for r in table["candidates"]] == [x["value"] for x in latest["candidates"]] == list(a.candidates)
        assert table["bars"] == OPEN_TOP + len(a.candidates), table["bars"]
        over_time = charts_of["topk_time"]
        assert over_time["points"] == finals and over_time["data"]["items"] == str(OPEN_TOP), over_time
        assert all(f"{r}. {e['value']}" in over_time["legend"] for r, e in enumerate(latest["top_k"], 1)), over_time
        assert over_time["points"] > before["toptime-" + f"{c.id}-{attr}".replace(".", "_")]["points"]
        finite = sum(math.isfinite(a.protocol.longitudinal_bound(s)) for s in range(1, finals + 1))
        assert charts_of["privacy"]["points"] == 2 * finals + finite, charts_of["privacy"]
    for attr, a in c.attributes.items():
        if a.numeric or a.open_domain:
            continue
        hist, heat, priv = (by_attr[attr][k] for k in ("histogram", "heatmap", "privacy"))
        assert hist["points"] == a.k and hist["marks"] >= 2 * a.k, hist  # a bar and a band per value
        assert "previous step" in hist["legend"] and "95% band" in hist["legend"], hist["legend"]
        assert heat["points"] == finals and heat["marks"] >= a.k * finals, heat
        assert priv["points"] == 3 * finals, priv  # ε1, ε∞ and the worst case per final step
        assert "worst-case longitudinal" in priv["legend"]
        assert heat["points"] > before["heat-" + f"{c.id}-{attr}".replace(".", "_")]["points"]
    ops = by_attr[""]
    assert set(ops) == {"reports_per_second", "rejections", "consumer_lag", "estimate_latency"}, sorted(ops)
    assert all(x["points"] >= 2 for x in ops.values()), ops
    assert all(attr in ops["estimate_latency"]["legend"] for attr in c.attributes), ops["estimate_latency"]["legend"]
    reason = pipeline.prom.query("ldp_rejected_batches_total > 0")[0]["metric"]["reason"]
    assert reason in ops["rejections"]["legend"], ops["rejections"]["legend"]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 40_000, len(png)  # a blank page is a few kB
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width == 1440 and height >= 900, (width, height)
    if os.environ.get(SCREENSHOT_DIR_ENV):
        target = Path(os.environ[SCREENSHOT_DIR_ENV]) / "dashboard.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(png)
