"""The production stack (docker-compose.yml and deploy/) agrees with itself and with the code.

No Docker engine is needed: the files are parsed (PyYAML, json) and their cross-references are
checked: compose services and their dependencies, the commands the containers run (against the
``ldp`` CLI's real options), the campaign file the containers mount, the topics kafka-init
creates, the Prometheus scrape targets, the Grafana provisioning and every PromQL metric the
dashboard queries (against the metrics the stream app really registers).

The production settings (issue 22): three KRaft brokers with replication 3 and min.insync.replicas 2, TLS on
every listener, one Kafka login per role with its ACLs, no Grafana default password nor anonymous access, no
Prometheus lifecycle API, each service only the secrets it uses, resource limits on every service, the simulated
producer only in the ``demo`` profile, Redis ``maxmemory`` with ``noeviction``. External validators, installed when
missing: ``promtool check rules`` / ``promtool test rules`` / ``promtool check config`` (Debian's ``prometheus``) on
the alert rules, and the Kubernetes manifests against the Kubernetes schemas (``kubernetes-validate``, offline).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "ldp-stream.json"

# The metrics the issue asks the dashboard to show (names as Prometheus sees them).
CONTRACT_METRICS = {
    "ldp_estimated_frequency_ratio", "ldp_reports_total", "ldp_step_reports",
    "ldp_rejected_batches_total", "ldp_consumer_lag_messages", "ldp_eps_first", "ldp_eps_inf",
    "ldp_eps_longitudinal_worst", "ldp_estimate_latency_seconds",
    # numeric attributes (issue 23): the mean with its 95% half-width, Square Wave's quantiles with their bounds
    "ldp_estimated_mean", "ldp_estimated_mean_ci95_halfwidth", "ldp_estimated_quantile",
}
# Series Prometheus itself adds to every scrape (allowed in the dashboard besides ldp_*).
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
GRAFANA_BUILTIN_VARS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s",
                        "__range_ms", "__from", "__to", "__dashboard", "__name"}
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
SERVICES = {*BROKERS, "kafka-init", "redis", "worker", "ingest", "ingest-tls", "producer", "kafka-exporter",
            "redis-exporter", "prometheus", "grafana"}
# The services of the ldp image that talk to Kafka, and the Kafka login (role) of each.
KAFKA_ROLES = {"worker": "worker", "ingest": "ingest", "producer": "producer"}


# ----------------------------------------------------------------------------- loading
def _yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(ROOT / "docker-compose.yml")


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def prometheus() -> dict[str, Any]:
    return _yaml(DEPLOY / "prometheus" / "prometheus.yml")


@pytest.fixture(scope="module")
def datasources() -> list[dict[str, Any]]:
    return _yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml")["datasources"]


@pytest.fixture(scope="module")
def providers() -> list[dict[str, Any]]:
    return _yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml")["providers"]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _expand(value: str) -> str:
    """Compose interpolation with the defaults: ``${NAME:-default}`` -> ``default``; ``$$`` -> ``$``."""
    value = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", str(value))
    return value.replace("$$", "$")


def _command(service: dict[str, Any]) -> list[str]:
    cmd = service["command"]
    return [_expand(c) for c in (shlex.split(cmd) if isinstance(cmd, str) else cmd)]


def _options(argv: list[str]) -> dict[str, str]:
    """``["worker", "--a", "1", "--b", "2"]`` -> ``{"--a": "1", "--b": "2"}`` (every option takes a value; a
    repeated option: its last value, :func:`_option_values` has them all)."""
    opts = {}
    it = iter(argv[1:])
    for tok in it:
        assert tok.startswith("--"), f"unexpected positional {tok!r} in {argv}"
        opts[tok] = next(it)
    return opts


def _option_values(argv: list[str], name: str) -> list[str]:
    """Every value of the (repeatable) option ``name`` in ``argv``."""
    return [argv[i + 1] for i, tok in enumerate(argv[:-1]) if tok == name]


def _bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path of the service's bind mounts (short syntax ``./host:/ctr[:ro]``)."""
    mounts = {}
    for vol in service.get("volumes", []):
        host, ctr, *_ = vol.split(":")
        if host.startswith((".", "/")):
            mounts[ctr] = (ROOT / host).resolve()
    return mounts


def _host_path(service: dict[str, Any], container_path: str) -> Path:
    """The host file a container path of ``service`` resolves to through its bind mounts."""
    p = PurePosixPath(container_path)
    for ctr, host in _bind_mounts(service).items():
        try:
            rel = p.relative_to(ctr)
        except ValueError:
            continue
        return host / rel
    raise AssertionError(f"{container_path} is not under a bind mount of the service: {_bind_mounts(service)}")


def _host_port(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows keep their panels inside
    return out


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]
            exprs.append(q if isinstance(q, str) else q["query"])
    return exprs


# ----------------------------------------------------------------------------- what the app exports
def exported_metric_names() -> set[str]:
    """Series names the stream app (workers and ingest) exposes on /metrics.

    ``stream_app.metrics.METRIC_NAMES`` when the module defines it; otherwise the names are read
    from the registry of a fresh ``stream_app.metrics.Metrics()`` (counter ``x`` -> ``x_total``,
    histogram ``x`` -> ``x_bucket``/``x_sum``/``x_count``), i.e. from the code itself.
    """
    from prometheus_client import CollectorRegistry

    import stream_app.metrics as metrics_mod
    from stream_app.ingest.metrics import IngestMetrics

    names = getattr(metrics_mod, "METRIC_NAMES", None)
    if names is not None:
        return set(names)
    out: set[str] = set()
    ingest = CollectorRegistry()
    IngestMetrics(ingest)  # the ingest service's own series (job ldp-ingest)
    for fam in [*metrics_mod.Metrics().registry.collect(), *ingest.collect()]:
        if fam.type == "counter":
            out.add(fam.name + "_total")
        elif fam.type == "histogram":
            out.update(fam.name + s for s in ("_bucket", "_sum", "_count"))
        elif fam.type == "summary":
            out.update(fam.name + s for s in ("", "_sum", "_count"))
        else:
            out.add(fam.name)
    return out


_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _base(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def _is_exported(name: str, exported: set[str]) -> bool:
    """``name`` (a series or family name) is one of ``exported``, up to counter/histogram suffixes."""
    return name in exported or _base(name) in {_base(e) for e in exported} | exported


# ----------------------------------------------------------------------------- compose
def test_compose_services_and_dependencies(services: dict[str, dict[str, Any]]) -> None:
    assert SERVICES <= set(services), f"missing services: {SERVICES - set(services)}"
    for name, svc in services.items():
        deps = svc.get("depends_on", {})
        assert isinstance(deps, dict), f"{name}: use the long depends_on syntax with conditions"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            cond = spec["condition"]
            if cond == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy; {dep} has no healthcheck"
            elif cond == "service_completed_successfully":
                assert services[dep].get("restart") == "no", f"{dep} is a one-shot job: restart must be 'no'"
            else:
                assert cond == "service_started", f"{name} -> {dep}: unknown condition {cond}"
    for name in SERVICES - {"kafka-init", "producer"}:
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    # the workers wait for their topics and for Redis; Grafana for Prometheus
    assert services["worker"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert int(_expand(services["worker"]["deploy"]["replicas"])) >= 2


def test_kafka_is_kraft_and_advertises_the_address_clients_use(services: dict[str, dict[str, Any]]) -> None:
    advertised = set()
    for broker in BROKERS:
        env = services[broker]["environment"]
        assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
        assert "ZOOKEEPER" not in " ".join(env).upper()
        advertised |= {u.split("://")[1] for u in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    for name in ("worker", "ingest", "producer"):
        bootstrap = _options(_command(services[name]))["--kafka"]
        assert len(bootstrap.split(",")) == len(BROKERS), f"{name} should list every broker: {bootstrap}"
        for hp in bootstrap.split(","):
            host, port = _host_port(hp)
            assert host in services, f"{name}: Kafka host {host} is not a compose service"
            assert f"{host}:{port}" in advertised, f"{name} bootstraps {hp}, the brokers advertise {advertised}"


def test_kafka_init_creates_the_pipeline_topics(services: dict[str, dict[str, Any]]) -> None:
    from wire.topics import Topics

    script = " ".join(_command(services["kafka-init"]))
    created = set(re.findall(r"--create\b[^\n]*?--topic\s+(\S+)", script))
    topics = Topics.with_prefix("")
    assert {topics.reports, topics.rejected, topics.estimates} <= created, created
    assert "--if-not-exists" in script  # re-running the stack must not fail
    m = re.search(rf"--topic\s+{re.escape(topics.reports)}[\s\\]+--partitions\s+\"?\$REPORTS_PARTITIONS", script)
    assert m, "ldp.reports must be created with $REPORTS_PARTITIONS partitions"
    partitions = int(_expand(services["kafka-init"]["environment"]["REPORTS_PARTITIONS"]))
    assert partitions >= int(_expand(services["worker"]["deploy"]["replicas"])), "fewer partitions than workers"
    assert int(_options(_command(services["worker"]))["--partitions"]) == partitions
    # ldp.estimates: kafka-init and the workers agree on its partition count (LDP_ESTIMATES_PARTITIONS), and it is the
    # workers' own default
    from stream_app.settings import setting_specs

    m = re.search(rf"--topic\s+{re.escape(topics.estimates)}[\s\\]+--partitions\s+\"?\$ESTIMATES_PARTITIONS", script)
    assert m, "ldp.estimates must be created with $ESTIMATES_PARTITIONS partitions"
    estimates = int(_expand(services["kafka-init"]["environment"]["ESTIMATES_PARTITIONS"]))
    assert int(_options(_command(services["worker"]))["--estimates-partitions"]) == estimates
    assert estimates == setting_specs()["estimates_partitions"]["default"]


def test_worker_and_producer_commands(services: dict[str, dict[str, Any]]) -> None:
    from wire.campaign import Campaign

    worker = _options(_command(services["worker"]))
    redis_url = urlparse(worker["--redis"])
    assert redis_url.scheme == "redis" and redis_url.hostname in services, worker["--redis"]
    assert worker["--web-bind"] == "0.0.0.0", "the worker must listen beyond the container's loopback"
    for name in ("worker", "ingest", "producer"):
        svc = services[name]
        assert _command(svc)[0] == {"worker": "worker", "ingest": "ingest", "producer": "produce"}[name]
        for path in _option_values(_command(svc), "--campaign"):
            campaign_file = _host_path(svc, path)
            assert campaign_file.is_file(), f"{name} mounts {campaign_file}, which does not exist"
            campaign = Campaign.load(campaign_file)
            assert campaign.attributes, campaign_file
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile" and (ROOT / svc["build"]["context"]).is_dir()
    producer = _options(_command(services["producer"]))
    assert int(producer["--devices"]) >= 100_000 and int(producer["--steps"]) >= 1 and float(producer["--rate"]) > 0
    # the healthcheck polls the health endpoint on the port the worker serves
    health = " ".join(services["worker"]["healthcheck"]["test"])
    assert f":{worker['--web-port']}/health" in health, health


def test_compose_commands_match_the_cli(services: dict[str, dict[str, Any]]) -> None:
    """Every option the containers pass exists on the ``ldp`` subcommand they run."""
    import typer

    from ldpstream_cli.cli import app

    group = typer.main.get_command(app)
    for name in ("worker", "ingest", "producer"):
        argv = _command(services[name])
        cmd = group.commands.get(argv[0])  # type: ignore[attr-defined]
        assert cmd is not None, f"`ldp {argv[0]}` (run by the {name} service) is not a command of ldpstream_cli.cli"
        known = {opt for p in cmd.params for opt in getattr(p, "opts", [])}
        unknown = set(_options(argv)) - known
        assert not unknown, f"`ldp {argv[0]}` has no option(s) {sorted(unknown)}; it has {sorted(known)}"


# ----------------------------------------------------------------------------- prometheus
def test_prometheus_scrapes_every_worker(services: dict[str, dict[str, Any]], prometheus: dict[str, Any]) -> None:
    web_port = int(_options(_command(services["worker"]))["--web-port"])
    jobs = {j["job_name"]: j for j in prometheus["scrape_configs"]}
    workers = jobs["ldp-workers"]
    assert workers.get("metrics_path", "/metrics") == "/metrics"
    sd = workers["dns_sd_configs"]
    assert [n for c in sd for n in c["names"]] == ["worker"], "scrape the replicated service by its DNS name"
    assert all(c["type"] == "A" and c["port"] == web_port for c in sd)
    for job in prometheus["scrape_configs"]:
        for c in job.get("dns_sd_configs", []):
            for n in c["names"]:
                assert n in services, f"Prometheus resolves {n}, which is not a compose service"
        for c in job.get("static_configs", []):
            for target in c["targets"]:
                host, _ = _host_port(target)
                assert host in services or host == "localhost", f"static target {target} is not a compose service"
    ingest = jobs["ldp-ingest"]  # every ingest replica, by DNS, on the port it serves
    ingest_port = int(_options(_command(services["ingest"]))["--port"])
    assert [(n, c["type"], c["port"]) for c in ingest["dns_sd_configs"] for n in c["names"]] == [("ingest", "A", ingest_port)]
    mounts = _bind_mounts(services["prometheus"])
    assert mounts["/etc/prometheus/prometheus.yml"] == (DEPLOY / "prometheus" / "prometheus.yml").resolve()
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]


# ----------------------------------------------------------------------------- grafana
def test_grafana_provisioning(services: dict[str, dict[str, Any]], datasources: list[dict[str, Any]],
                              providers: list[dict[str, Any]]) -> None:
    (ds,) = datasources
    assert ds["type"] == "prometheus" and ds["uid"] and ds.get("isDefault")
    url = urlparse(ds["url"])
    assert url.hostname == "prometheus" and url.hostname in services
    assert url.port == 9090 and any(str(p).endswith(":9090") for p in services["prometheus"]["ports"])
    grafana = services["grafana"]
    mounts = _bind_mounts(grafana)
    assert mounts["/etc/grafana/provisioning/datasources"] == (DEPLOY / "grafana/provisioning/datasources").resolve()
    assert mounts["/etc/grafana/provisioning/dashboards"] == (DEPLOY / "grafana/provisioning/dashboards").resolve()
    (provider,) = providers
    assert provider["type"] == "file"
    dash_dir = _host_path(grafana, provider["options"]["path"])
    assert dash_dir == DASHBOARD.parent.resolve() and DASHBOARD.is_file()
    env = grafana["environment"]
    assert _host_path(grafana, env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]) == DASHBOARD.resolve()


def test_dashboard_structure(dashboard: dict[str, Any], datasources: list[dict[str, Any]]) -> None:
    uid = datasources[0]["uid"]
    assert dashboard["uid"] == "ldp-stream" and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    kinds = {p["type"] for p in panels}
    assert {"row", "stat", "timeseries", "barchart"} <= kinds, kinds
    for p in panels:
        gp = p["gridPos"]
        assert 0 <= gp["x"] and gp["w"] > 0 and gp["x"] + gp["w"] <= 24 and gp["h"] > 0, (p["title"], gp)
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": uid}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == uid, p["title"]
            assert t["expr"].count("(") == t["expr"].count(")"), t["expr"]
    # panels of one row do not overlap
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        gp = p["gridPos"]
        for x in range(gp["x"], gp["x"] + gp["w"]):
            for y in range(gp["y"], gp["y"] + gp["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    titles = " ".join(p["title"] for p in panels)
    for needed in ("histogram", "Reports/s", "Rejected", "lag", "latency", "ε1", "ε∞", "longitudinal"):
        assert needed in titles, f"no panel about {needed!r}"


def test_dashboard_variables(dashboard: dict[str, Any], datasources: list[dict[str, Any]]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"campaign", "attribute"} <= set(variables)
    for name in ("campaign", "attribute"):
        v = variables[name]
        q = v["query"] if isinstance(v["query"], str) else v["query"]["query"]
        assert v["type"] == "query" and v["datasource"]["uid"] == datasources[0]["uid"]
        assert re.fullmatch(rf"label_values\(.+,\s*{name}\)", q), q
    texts = _exprs(dashboard) + [p["title"] for p in _panels(dashboard)]
    used = {m for t in texts for m in re.findall(r"\$\{?([A-Za-z_]\w*)", t)}
    undefined = used - set(variables) - GRAFANA_BUILTIN_VARS
    assert not undefined, f"undefined dashboard variables: {undefined}"
    repeated = [p for p in _panels(dashboard) if p.get("repeat")]
    assert all(p["repeat"] in variables for p in repeated)


def test_dashboard_metrics_are_exported(dashboard: dict[str, Any]) -> None:
    exported = exported_metric_names()
    missing_contract = {m for m in CONTRACT_METRICS if not _is_exported(m, exported)}
    assert not missing_contract, f"the app does not export {sorted(missing_contract)}"
    used: set[str] = set()
    for expr in _exprs(dashboard):
        # drop label matchers and string literals, then take the identifiers that name series
        bare = re.sub(r"\{[^}]*\}|\"[^\"]*\"|`[^`]*`", " ", expr)
        used.update(re.findall(r"\b(ldp_[a-z0-9_]+)\b", bare))
        used.update(set(re.findall(r"\b([a-z_]+)\b", bare)) & PROMETHEUS_SERIES)
    not_exported = sorted(m for m in used if m.startswith("ldp_") and not _is_exported(m, exported))
    assert not not_exported, f"the dashboard queries metrics the app does not export: {not_exported}"
    not_shown = sorted(m for m in CONTRACT_METRICS if not any(_is_exported(u, {m}) for u in used))
    assert not not_shown, f"contract metrics without a panel: {not_shown}"


def test_dashboard_numeric_metrics_row(dashboard: dict[str, Any]) -> None:
    """Issue 23: a "Numeric metrics" row with, per numeric attribute, its mean over time inside the 95% band (two
    series mean -/+ half-width, Grafana's fillBelowTo between them) and, per Square Wave attribute, p50/p90/p99 with
    their bootstrap bounds (one band per quantile); both repeat over a variable of the attributes that export them."""
    panels = _panels(dashboard)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    (row,) = [p for p in panels if p["type"] == "row" and "Numeric metrics" in p["title"]]
    below = [p for p in panels if p["type"] != "row" and p["gridPos"]["y"] > row["gridPos"]["y"]
             and not any(r["type"] == "row" and row["gridPos"]["y"] < r["gridPos"]["y"] < p["gridPos"]["y"]
                         for r in panels)]

    def fill_pairs(panel: dict[str, Any]) -> dict[str, str]:
        """series name -> the series its band is filled down to (the fillBelowTo overrides)."""
        out = {}
        for o in panel["fieldConfig"]["overrides"]:
            for prop in o["properties"]:
                if prop["id"] == "custom.fillBelowTo":
                    assert o["matcher"]["id"] == "byName", o
                    out[o["matcher"]["options"]] = prop["value"]
        return out

    def repeat_var(panel: dict[str, Any], metric: str) -> str:
        """The panel repeats over a variable listing the attributes with ``metric`` (within $campaign, $attribute)."""
        name = panel["repeat"]
        q = variables[name]["query"] if isinstance(variables[name]["query"], str) else variables[name]["query"]["query"]
        expected = rf'label_values\({metric}\{{campaign="\$campaign", attribute=~"\$attribute"\}},\s*attribute\)'
        assert re.fullmatch(expected, q), q
        assert variables[name]["includeAll"] and variables[name]["multi"], name
        assert f"${name}" in panel["title"], panel["title"]
        return name

    (mean,) = [p for p in below if "ldp_estimated_mean{" in " ".join(t["expr"] for t in p["targets"])]
    assert mean["type"] == "timeseries" and "mean over time" in mean["title"].lower(), mean["title"]
    var = repeat_var(mean, "ldp_estimated_mean")
    sel = f'{{campaign="$campaign", attribute="${var}"}}'
    m, h = f"max(ldp_estimated_mean{sel})", f"max(ldp_estimated_mean_ci95_halfwidth{sel})"
    series = {t["legendFormat"]: re.sub(r"\s+", " ", t["expr"]).strip() for t in mean["targets"]}
    ((upper, lower),) = fill_pairs(mean).items()
    assert series[upper] == f"{m} + {h}" and series[lower] == f"{m} - {h}", series
    assert m in series.values(), series  # and the mean itself

    (quant,) = [p for p in below if "ldp_estimated_quantile" in " ".join(t["expr"] for t in p["targets"])]
    assert quant["type"] == "timeseries", quant["title"]
    assert all(q in quant["title"] for q in ("p50", "p90", "p99")), quant["title"]
    var = repeat_var(quant, "ldp_estimated_quantile")
    from estimators.numeric.protocol import QUANTILES  # the label values the worker exports: p50, p90, p99
    from stream_app.metrics import Metrics

    assert set(Metrics().estimated_quantile._labelnames) == {"campaign", "attribute", "percentile", "bound"}

    qs = [f"p{round(q * 100)}" for q in QUANTILES]
    assert qs == ["p50", "p90", "p99"], qs
    by_bound = {}
    for t in quant["targets"]:
        (bound,) = re.findall(r'bound="(\w+)"', t["expr"])
        assert f'attribute="${var}"' in t["expr"] and re.search(r"\bby \(percentile\)", t["expr"]), t["expr"]
        assert "{{percentile}}" in t["legendFormat"], t
        by_bound[bound] = t["legendFormat"]
    assert set(by_bound) == {"value", "lower", "upper"}, by_bound
    # the series each quantile's band joins: the legends of its upper and lower bounds, for p50, p90, p99
    names = {b: {q: fmt.replace("{{percentile}}", q) for q in qs} for b, fmt in by_bound.items()}
    assert fill_pairs(quant) == {names["upper"][q]: names["lower"][q] for q in qs}, fill_pairs(quant)


# ----------------------------------------------------------------------------- image
def test_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    assert re.search(r"^RUN pip install \.(\s|$)", text, re.M), "the image installs the project with `pip install .`"
    for ln in lines:
        if ln.startswith("COPY ") and "--from" not in ln:
            for src in ln.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repository"
    assert 'ENTRYPOINT ["ldp"]' in lines
    web_port = _options(_command(services["worker"]))["--web-port"]
    assert f"EXPOSE {web_port}" in lines


# ============================================================================= production settings (issue 22)
COMPOSE_FILE = ROOT / "docker-compose.yml"
PROMETHEUS_DIR = DEPLOY / "prometheus"
KUBERNETES = DEPLOY / "kubernetes"
# Metrics of the exporters the compose file runs (danielqsj/kafka-exporter v1.8.0, oliver006/redis_exporter
# v1.67.0): what the alert rules and the Kafka and Redis dashboards may query.
EXPORTER_METRICS = {
    "kafka_brokers", "kafka_topic_partitions", "kafka_topic_partition_current_offset",
    "kafka_topic_partition_oldest_offset", "kafka_topic_partition_in_sync_replica", "kafka_topic_partition_replicas",
    "kafka_topic_partition_leader", "kafka_topic_partition_leader_is_preferred",
    "kafka_topic_partition_under_replicated_partition", "kafka_consumergroup_current_offset",
    "kafka_consumergroup_current_offset_sum", "kafka_consumergroup_lag", "kafka_consumergroup_lag_sum",
    "kafka_consumergroup_members",
    "redis_up", "redis_memory_used_bytes", "redis_memory_used_rss_bytes", "redis_memory_max_bytes", "redis_db_keys",
    "redis_evicted_keys_total", "redis_aof_last_write_status", "redis_aof_last_bgrewrite_status",
    "redis_commands_processed_total", "redis_connected_clients", "redis_blocked_clients",
    "redis_rejected_connections_total", "redis_net_input_bytes_total", "redis_net_output_bytes_total",
}
# What each service mounts: only what it uses (issue 22). kafka-init registers every role's SCRAM login, hence
# every role's Kafka password; nobody else holds another role's.
EXPECTED_SECRETS = {
    **{b: {"tls_ca", "kafka_admin_password", "kafka_keystore_password", f"kafka_{b[-1]}_keystore"} for b in BROKERS},
    "kafka-init": {"tls_ca", "kafka_admin_password", "kafka_ingest_password", "kafka_producer_password",
                   "kafka_worker_password", "kafka_exporter_password"},
    "redis": {"redis_password"},
    "worker": {"tls_ca", "kafka_worker_password", "redis_password"},
    "ingest": {"tls_ca", "kafka_ingest_password", "redis_password", "device_secret"},
    "ingest-tls": {"ingest_tls_cert", "ingest_tls_key"},
    "producer": {"tls_ca", "kafka_producer_password"},
    "kafka-exporter": {"tls_ca", "kafka_exporter_password"},
    "redis-exporter": {"redis_password"},
    "prometheus": set(),
    "grafana": {"grafana_admin_password"},
}


def _script(service: dict[str, Any]) -> str:
    """The shell script of a service run as ``entrypoint: [sh, -c]`` + ``command: [script]``, interpolated."""
    assert service.get("entrypoint", [None])[-1] == "-c", service.get("entrypoint")
    (script,) = service["command"]
    return _expand(script)


def _shell_lines(script: str) -> list[str]:
    """The script's logical lines: backslash continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", script)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _secrets_of(service: dict[str, Any]) -> dict[str, str]:
    """Secret name -> its file name under /run/secrets of a service (short or long syntax)."""
    out = {}
    for s in service.get("secrets", []):
        if isinstance(s, str):
            out[s] = s
        else:
            out[s["source"]] = s.get("target", s["source"])
    return out


def _mem_bytes(value: str) -> int:
    """Compose / Redis / Kubernetes memory sizes: 512M, 2G, 1536M, 1gb, 2Gi ..."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)", str(value).strip().lower())
    assert m, value
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


def _acls(services: dict[str, dict[str, Any]]) -> set[tuple[str, str, str, str, str]]:
    """(principal, operation, resource type, pattern type, name) of every ``acl`` line of kafka-init."""
    init = services["kafka-init"]
    app_id = init["environment"]["APP_ID"]
    out = set()
    for line in _shell_lines(_script(init)):
        if not line.startswith("acl "):
            continue
        args = [a.replace("$APP_ID", app_id) for a in shlex.split(line)[1:]]
        user, args = args[0], args[1:]
        ops, resources, pattern = [], [], "literal"
        it = iter(args)
        for tok in it:
            if tok == "--operation":
                ops.append(next(it))
            elif tok in ("--topic", "--group", "--transactional-id"):
                resources.append((tok[2:], next(it)))
            elif tok == "--cluster":
                resources.append(("cluster", "kafka-cluster"))
            elif tok == "--resource-pattern-type":
                pattern = next(it)
            else:
                raise AssertionError(f"unexpected acl argument {tok!r} in {line!r}")
        out |= {(user, op, kind, pattern, name) for op in ops for kind, name in resources}
    return out


def _promtool() -> str:
    from ldpstream_dev.debian import ToolUnavailable
    from ldpstream_dev.prometheus import promtool_binary

    try:
        return promtool_binary()
    except ToolUnavailable as exc:  # pragma: no cover - machines without apt-get
        pytest.skip(f"promtool is not installed and cannot be: {exc}")


def _promql_names(expr: str) -> set[str]:
    """The series names a PromQL expression reads (label matchers, strings and Grafana variables dropped)."""
    bare = re.sub(r"\{[^}]*\}|\"[^\"]*\"|`[^`]*`|\$\{?\w+\}?", " ", expr)
    return set(re.findall(r"\b((?:ldp|kafka|redis)_[a-z0-9_]+)\b", bare)) | (
        set(re.findall(r"\b([a-z_]+)\b", bare)) & PROMETHEUS_SERIES)


# ----------------------------------------------------------------------------- Kafka: brokers, TLS, roles
def test_three_kraft_brokers_replication_3_min_isr_2(services: dict[str, dict[str, Any]]) -> None:
    envs = [services[b]["environment"] for b in BROKERS]
    assert sorted(int(e["KAFKA_NODE_ID"]) for e in envs) == [1, 2, 3]
    assert len({e["CLUSTER_ID"] for e in envs}) == 1, "one cluster id for the three"
    voters = {v for e in envs for v in e["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")}
    assert voters == {f"{e['KAFKA_NODE_ID']}@{b}:9093" for b, e in zip(BROKERS, envs)}, voters
    for b, e in zip(BROKERS, envs):
        assert services[b]["hostname"] == b and e["KAFKA_ADVERTISED_LISTENERS"] == f"INTERNAL://{b}:9092"
        assert services[b]["image"].startswith("apache/kafka:")
        for key in ("KAFKA_DEFAULT_REPLICATION_FACTOR", "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
                    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
            assert int(e[key]) == 3, (b, key)
        assert int(e["KAFKA_MIN_INSYNC_REPLICAS"]) == 2 and int(e["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"]) == 2
        assert e["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false" and e["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false"
        assert f"kafka-{e['KAFKA_NODE_ID']}-data:/var/lib/kafka/data" in services[b]["volumes"]
    # every topic kafka-init creates: 3 replicas, 2 in sync
    creates = [ln for ln in _shell_lines(_script(services["kafka-init"])) if "--create" in ln]
    assert len(creates) >= 3
    for line in creates:
        assert "--replication-factor 3" in line and "--config min.insync.replicas=2" in line, line
    for b in BROKERS:
        assert services["kafka-init"]["depends_on"][b]["condition"] == "service_healthy"


def test_every_kafka_listener_is_tls(services: dict[str, dict[str, Any]]) -> None:
    from wire.transport import KafkaSecurity

    for b in BROKERS:
        env, mounted = services[b]["environment"], _secrets_of(services[b])
        protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        listeners = {u.split("://")[0] for u in env["KAFKA_LISTENERS"].split(",")}
        assert listeners == set(protocols), (listeners, protocols)
        assert all(p == "SASL_SSL" for p in protocols.values()), f"{b}: a listener without TLS: {protocols}"
        assert not services[b].get("ports"), f"{b} is published on the host"
        for key in ("KAFKA_SSL_KEYSTORE_LOCATION", "KAFKA_SSL_TRUSTSTORE_LOCATION"):
            assert PurePosixPath(env[key]).name in mounted.values() and env[key].startswith("/run/secrets/"), key
        assert env["KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM"] == "https"
        script = _script(services[b])
        for needed in ("KAFKA_SSL_KEYSTORE_PASSWORD", "KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG",
                       "KAFKA_LISTENER_NAME_CONTROLLER_PLAIN_SASL_JAAS_CONFIG",
                       "KAFKA_LISTENER_NAME_INTERNAL_SCRAM___SHA___512_SASL_JAAS_CONFIG", "security.protocol=SASL_SSL"):
            assert needed in script, f"{b}: {needed} not set at start"
    # every Kafka client: SASL over TLS, trusting the CA it mounts
    for name in KAFKA_ROLES:
        env, mounted = services[name]["environment"], _secrets_of(services[name])
        assert env["LDP_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert PurePosixPath(env["LDP_KAFKA_CAFILE"]).name in mounted.values(), name
        KafkaSecurity(env["LDP_KAFKA_SECURITY_PROTOCOL"], env["LDP_KAFKA_SASL_MECHANISM"], env["LDP_KAFKA_USERNAME"],
                      "a password")  # a combination wire.transport accepts
    exporter = _script(services["kafka-exporter"])
    assert "--tls.enabled" in exporter and "--tls.ca-file=/run/secrets/tls_ca" in exporter
    assert "security.protocol=SASL_SSL" in _script(services["kafka-init"])


def test_one_kafka_principal_per_role_with_its_acls(services: dict[str, dict[str, Any]]) -> None:
    from stream_app.settings import setting_specs

    for b in BROKERS:
        env = services[b]["environment"]
        assert env["KAFKA_AUTHORIZER_CLASS_NAME"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        assert env["KAFKA_SUPER_USERS"] == "User:admin" and env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    # each ldp client logs in as its own role with its own password file
    for name, role in KAFKA_ROLES.items():
        env = services[name]["environment"]
        assert env["LDP_KAFKA_USERNAME"] == role and env["LDP_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
        assert env["LDP_KAFKA_PASSWORD_FILE"] == f"/run/secrets/kafka_{role}_password", name
    assert "--sasl.username=exporter" in _script(services["kafka-exporter"])
    # kafka-init registers a SCRAM login for exactly these roles
    script = _script(services["kafka-init"])
    (roles,) = re.findall(r"for role in ([a-z ]+); do", script)
    assert set(roles.split()) == {*KAFKA_ROLES.values(), "exporter"}
    app_id = services["kafka-init"]["environment"]["APP_ID"]
    assert app_id == setting_specs()["app_id"]["default"], "the group ACL must name the workers' consumer group"
    assert f"--topic \"$APP_ID-__assignor-__leader\"" in script, "Faust's topic is created with the others"
    reports = ("topic", "literal", "ldp.reports")
    expected = {
        *{(r, op, *reports) for r in ("ingest", "producer") for op in ("Write", "Describe")},
        *{("worker", op, *reports) for op in ("Read", "Describe")},
        *{("worker", op, "topic", "literal", "ldp.rejected") for op in ("Write", "Describe")},
        *{("worker", op, "topic", "literal", "ldp.estimates") for op in ("Write", "Read", "Describe")},
        *{("worker", op, "topic", "prefixed", f"{app_id}-") for op in ("Read", "Write", "Describe")},
        ("worker", "Read", "group", "literal", app_id),
        ("exporter", "Describe", "topic", "prefixed", "ldp."),
        ("exporter", "Describe", "group", "literal", app_id),
    }
    acls = _acls(services)
    assert acls == expected, f"missing: {expected - acls}; not expected: {acls - expected}"
    # who may write ldp.reports: the ingest and the simulated producer, nobody else
    assert {a[0] for a in acls if a[1] == "Write" and a[4] == "ldp.reports"} == {"ingest", "producer"}


# ----------------------------------------------------------------------------- secrets, Grafana, Prometheus
def test_each_service_gets_only_the_secrets_it_uses(compose: dict[str, Any],
                                                    services: dict[str, dict[str, Any]]) -> None:
    assert set(EXPECTED_SECRETS) == set(services), set(services) ^ set(EXPECTED_SECRETS)
    for name, svc in services.items():
        mounted = _secrets_of(svc)
        assert set(mounted) == EXPECTED_SECRETS[name], f"{name} mounts {sorted(mounted)}"
        # ... and uses every one: its file is named by the service's variables, scripts, health check or the
        # configuration files it mounts
        text = json.dumps([svc.get("environment", {}), svc.get("command", []), svc.get("healthcheck", {})])
        text += "".join(p.read_text(encoding="utf-8") for p in _bind_mounts(svc).values() if p.is_file())
        text = _expand(text)
        roles = re.findall(r"for role in ([a-z ]+); do", text)
        used = set(re.findall(r"/run/secrets/([a-z0-9_]+)(?![a-z0-9_$])", text))
        for template in re.findall(r"/run/secrets/([a-z0-9_]*\$\{role\}[a-z0-9_]*)", text):
            used |= {template.replace("${role}", r) for rs in roles for r in rs.split()}
        assert used == set(mounted.values()), f"{name}: mounts {sorted(mounted.values())}, uses {sorted(used)}"
        # a secret is never a plain variable
        for key, value in svc.get("environment", {}).items():
            if re.search(r"PASSWORD|SECRET", key) and not key.endswith("FILE"):
                raise AssertionError(f"{name}: {key}={value!r} puts a secret in the environment")
    declared = set(compose["secrets"])
    assert declared == set().union(*EXPECTED_SECRETS.values()), "a secret nobody uses, or one not declared"
    for name, spec in compose["secrets"].items():
        assert spec["file"].startswith("./deploy/secrets/"), f"{name}: secrets live in the git-ignored deploy/secrets"
    assert (DEPLOY / "secrets" / ".gitignore").read_text().split() == ["*", "!.gitignore"]
    # never in the image's build context
    assert "deploy/secrets" in (DEPLOY / "Dockerfile.dockerignore").read_text().split()


def test_grafana_has_no_default_password_nor_anonymous_access(services: dict[str, dict[str, Any]]) -> None:
    grafana = services["grafana"]
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert "GF_AUTH_ANONYMOUS_ORG_ROLE" not in env
    assert "GF_SECURITY_ADMIN_PASSWORD" not in env, "the admin password comes from a secret file"
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_admin_password"
    assert "grafana_admin_password" in _secrets_of(grafana)
    assert env["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert not any("admin" == str(v) for k, v in env.items() if "PASSWORD" in k)
    assert all(_expand(p).startswith("127.0.0.1:") for p in grafana["ports"]), grafana["ports"]


def test_prometheus_has_no_lifecycle_api_and_loads_the_alert_rules(services: dict[str, dict[str, Any]],
                                                                    prometheus: dict[str, Any]) -> None:
    command = services["prometheus"]["command"]
    assert not any(c.startswith(("--web.enable-lifecycle", "--web.enable-admin-api")) for c in command), command
    assert prometheus["rule_files"] == ["alerts.yml"]
    mounts = _bind_mounts(services["prometheus"])
    assert mounts["/etc/prometheus/alerts.yml"] == (PROMETHEUS_DIR / "alerts.yml").resolve()
    jobs = {j["job_name"]: j for j in prometheus["scrape_configs"]}
    assert [t for c in jobs["kafka"]["static_configs"] for t in c["targets"]] == ["kafka-exporter:9308"]
    assert [t for c in jobs["redis"]["static_configs"] for t in c["targets"]] == ["redis-exporter:9121"]
    assert services["redis-exporter"]["environment"]["REDIS_ADDR"] == "redis://redis:6379"


# ----------------------------------------------------------------------------- resources, profiles, Redis
def test_every_service_has_resource_limits_and_reservations(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        assert not {"mem_limit", "mem_reservation", "cpus", "cpu_shares", "memswap_limit"} & set(svc), \
            f"{name}: resources go in deploy.resources"
        res = svc.get("deploy", {}).get("resources", {})
        limits, reservations = res.get("limits", {}), res.get("reservations", {})
        assert {"cpus", "memory"} <= set(limits), f"{name}: no cpu or memory limit"
        assert {"cpus", "memory"} <= set(reservations), f"{name}: no cpu or memory reservation"
        assert float(limits["cpus"]) >= float(reservations["cpus"]) > 0, name
        assert _mem_bytes(limits["memory"]) >= _mem_bytes(reservations["memory"]) > 0, name
    # the JVM heap of a broker fits its limit with room for the rest of the process
    for b in BROKERS:
        heap = re.search(r"-Xmx(\S+)", services[b]["environment"]["KAFKA_HEAP_OPTS"]).group(1)
        assert _mem_bytes(heap) * 1.5 <= _mem_bytes(services[b]["deploy"]["resources"]["limits"]["memory"]), b


def test_the_simulated_producer_runs_only_in_the_demo_profile(services: dict[str, dict[str, Any]]) -> None:
    from wire.campaign import Campaign

    assert services["producer"]["profiles"] == ["demo"]
    for name, svc in services.items():
        if name != "producer":
            assert "profiles" not in svc, f"{name} must start by default"
            assert "producer" not in svc.get("depends_on", {}), f"{name} would pull the demo producer in"
    # its own campaign: simulated reports never count into the real devices' campaign (the ingest's)
    def ids(name: str) -> set[str]:
        return {Campaign.load(_host_path(services[name], p)).id for p in _option_values(_command(services[name]),
                                                                                       "--campaign")}
    assert not ids("producer") & ids("ingest"), "the simulated fleet writes into the real devices' campaign"
    assert ids("producer") | ids("ingest") <= ids("worker"), "the workers count both"
    fleet = Campaign.load(DEPLOY / "campaigns" / "demo-fleet.toml")
    real = Campaign.load(DEPLOY / "campaigns" / "demo.toml")
    assert list(fleet.attributes) == list(real.attributes) and fleet.id != real.id
    for name, attr in real.attributes.items():
        assert fleet.attributes[name].protocol.params() == attr.protocol.params(), name
    assert "redis_password" not in _secrets_of(services["producer"])
    assert "--redis" not in _command(services["producer"])


def test_redis_has_maxmemory_with_noeviction_and_the_campaigns_fit(services: dict[str, dict[str, Any]]) -> None:
    from stream_app.settings import parse_memory
    from stream_app.store.memory import MemoryLimit, check_retention
    from wire.campaign import Campaign

    redis = services["redis"]
    script = _script(redis)
    assert '--maxmemory "$REDIS_MAXMEMORY"' in script and "--maxmemory-policy noeviction" in script, script
    assert "--appendonly yes" in script
    maxmemory = parse_memory(_expand(redis["environment"]["REDIS_MAXMEMORY"]))
    assert maxmemory > 0
    # the container has room above maxmemory (the AOF rewrite's copy-on-write, client buffers)
    assert _mem_bytes(redis["deploy"]["resources"]["limits"]["memory"]) >= 1.5 * maxmemory
    # every campaign the workers keep in this Redis fits 80% of it together (the workers refuse otherwise)
    campaigns = {c.id: c for c in (Campaign.load(_host_path(services["worker"], p))
                                   for p in _option_values(_command(services["worker"]), "--campaign"))}
    limit = MemoryLimit(maxmemory, "maxmemory", "redis")
    check_retention(campaigns, {cid: limit for cid in campaigns})


# ----------------------------------------------------------------------------- the TLS front of the ingest
def test_the_ingest_is_reached_through_tls_only(services: dict[str, dict[str, Any]]) -> None:
    ingest, front = services["ingest"], services["ingest-tls"]
    assert not ingest.get("ports"), "the plain-HTTP ingest must not be published"
    port = int(_options(_command(ingest))["--port"])
    assert [_expand(p) for p in front["ports"]] == ["8443:8443"]
    conf = _bind_mounts(front)["/etc/nginx/nginx.conf"].read_text(encoding="utf-8")
    conf = re.sub(r"#[^\n]*", "", conf)
    assert re.search(r"listen\s+8443\s+ssl;", conf)
    assert f"ssl_certificate     /run/secrets/{_secrets_of(front)['ingest_tls_cert']};" in conf
    assert f"ssl_certificate_key /run/secrets/{_secrets_of(front)['ingest_tls_key']};" in conf
    assert re.search(rf"server\s+ingest:{port}\b", conf), "the front proxies to the ingest's port"
    assert re.findall(r"location\s+=\s+(\S+)\s*\{\s*limit_except", conf) == ["/reports", "/health"]
    assert "client_max_body_size 1m;" in conf  # = the ingest's --max-body default
    assert front["depends_on"]["ingest"]["condition"] == "service_healthy"
    assert ingest["environment"]["LDP_INGEST_MAX_CONNECTIONS_PER_IP"] == "10000"  # one client: the proxy


def test_the_services_start_scripts_parse(services: dict[str, dict[str, Any]]) -> None:
    """``bash -n`` on each shell-wrapped start script (after Compose's interpolation)."""
    for name, svc in services.items():
        if svc.get("entrypoint", [None])[-1] != "-c":
            continue
        shell = "bash" if svc["entrypoint"][0].endswith("bash") else "sh"
        run = subprocess.run([shell, "-n", "-c", _script(svc)], capture_output=True, text=True)
        assert run.returncode == 0, f"{name}: {run.stderr}"


def test_the_secret_and_trial_certificate_scripts(tmp_path: Path, compose: dict[str, Any]) -> None:
    """deploy/make-secrets.sh and deploy/tls/make-trial-certs.sh make every file the compose file's secrets name;
    the brokers' keystores open with their password and name their broker, the certificates chain to the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import pkcs12

    if not shutil.which("openssl"):
        pytest.skip("no openssl")
    secrets = tmp_path / "secrets"
    run = subprocess.run(["bash", str(DEPLOY / "make-secrets.sh"), str(secrets)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    run = subprocess.run(["bash", str(DEPLOY / "tls" / "make-trial-certs.sh"), str(secrets / "tls")],
                         capture_output=True, text=True, env={**os.environ, "LDP_INGEST_TLS_NAMES": "ingest.test"})
    assert run.returncode == 0, run.stderr
    made = {str(p.relative_to(secrets)) for p in secrets.rglob("*") if p.is_file()} - {"tls/ca.key"}
    wanted = {spec["file"].removeprefix("./deploy/secrets/") for spec in compose["secrets"].values()}
    assert made == wanted, (made ^ wanted)
    assert all(len((secrets / f).read_text().strip()) == 64 for f in wanted if "/" not in f)
    # a second run keeps the passwords
    before = (secrets / "redis_password").read_text()
    subprocess.run(["bash", str(DEPLOY / "make-secrets.sh"), str(secrets)], check=True, capture_output=True)
    assert (secrets / "redis_password").read_text() == before
    tls = secrets / "tls"
    ca = x509.load_pem_x509_certificate((tls / "ca.pem").read_bytes())
    password = (tls / "keystore_password").read_text().strip().encode()

    def names(cert: x509.Certificate) -> set[str]:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
            str(i) for i in san.get_values_for_type(x509.IPAddress)}

    for b in BROKERS:
        key, cert, _ = pkcs12.load_key_and_certificates((tls / f"{b}.p12").read_bytes(), password)
        assert key is not None and b in names(cert), (b, names(cert))
        cert.verify_directly_issued_by(ca)
    ingest = x509.load_pem_x509_certificates((tls / "ingest.crt").read_bytes())
    assert {"ingest.test", "127.0.0.1"} <= names(ingest[0])
    ingest[0].verify_directly_issued_by(ca)
    assert (tls / "ca.key").stat().st_mode & 0o077 == 0
    keytool = shutil.which("keytool")
    if keytool:  # the JVM of the Kafka image reads the keystore too
        run = subprocess.run([keytool, "-list", "-storetype", "PKCS12", "-keystore", str(tls / "kafka-1.p12"),
                              "-storepass", password.decode()], capture_output=True, text=True)
        assert run.returncode == 0 and "PrivateKeyEntry" in run.stdout, run.stdout + run.stderr


# ----------------------------------------------------------------------------- alerts
REQUIRED_ALERTS = {  # issue 22: worker unhealthy, lag growing, store reset, count regression, unrepairable loss,
    "LdpWorkerUnhealthy", "LdpConsumerLagGrowing", "LdpStoreReset", "LdpCountRegression",  # ingest 5xx, rejected
    "LdpUnrepairableLoss", "LdpIngestErrors", "LdpRejectedBatchesSpike", "LdpRejectedReportsHigh",  # spike, Redis
    "LdpRedisMemoryHigh", "LdpEstimatesLate",  # memory over 80%, estimates late
}


def test_alert_rules_pass_promtool_check_and_unit_tests() -> None:
    promtool = _promtool()
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts.test.yml"],
                 ["check", "config", "prometheus.yml"]):
        run = subprocess.run([promtool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"promtool {' '.join(args)}:\n{run.stdout}\n{run.stderr}"
    rules = [r for g in _yaml(PROMETHEUS_DIR / "alerts.yml")["groups"] for r in g["rules"]]
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts)) and REQUIRED_ALERTS <= set(alerts), REQUIRED_ALERTS - set(alerts)
    tests = _yaml(PROMETHEUS_DIR / "alerts.test.yml")
    assert tests["rule_files"] == ["alerts.yml"]
    firing = {c["alertname"] for t in tests["tests"] for c in t["alert_rule_test"] if c["exp_alerts"]}
    assert set(alerts) <= firing, f"alerts without a test case where they fire: {set(alerts) - firing}"
    exported = exported_metric_names()
    for r in rules:
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"], r["alert"]
        for name in _promql_names(r["expr"]):
            if name.startswith("ldp_"):
                assert _is_exported(name, exported), f"{r['alert']}: the app exports no {name}"
            elif name not in PROMETHEUS_SERIES:
                assert name in EXPORTER_METRICS, f"{r['alert']}: no exporter of the stack exports {name}"
        for job in re.findall(r'job="([^"]+)"', r["expr"]):
            assert job in {j["job_name"] for j in _yaml(PROMETHEUS_DIR / "prometheus.yml")["scrape_configs"]}


def test_the_kafka_and_redis_dashboards(providers: list[dict[str, Any]], datasources: list[dict[str, Any]]) -> None:
    """The exporters' dashboards: provisioned beside ldp-stream.json, sound panels, queries that parse (promtool)
    and read only what the exporters export; every dashboard's PromQL parses."""
    uid = datasources[0]["uid"]
    boards = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(DASHBOARD.parent.glob("*.json"))}
    assert {"kafka", "redis", "ldp-stream"} <= set(boards)
    assert len({b["uid"] for b in boards.values()}) == len(boards)
    rules = []
    for stem, board in boards.items():
        for expr in (t["expr"] for p in _panels(board) for t in p.get("targets", [])):  # not label_values()
            expr = re.sub(r"\$\{?(\w+)\}?", lambda m: "1m" if m.group(1).startswith("__") else "x", expr)
            rules.append({"record": f"dashboard:{stem.replace('-', '_')}:q{len(rules)}", "expr": expr})
        if stem == "ldp-stream":
            continue  # its structure and metrics: the tests above
        panels = _panels(board)
        assert len({p["id"] for p in panels}) == len(panels), stem
        cells: dict[tuple[int, int], str] = {}
        for p in panels:
            gp = p["gridPos"]
            assert gp["x"] >= 0 and gp["w"] > 0 and gp["x"] + gp["w"] <= 24 and gp["h"] > 0, (stem, p["title"])
            for xy in ((x, y) for x in range(gp["x"], gp["x"] + gp["w"]) for y in range(gp["y"], gp["y"] + gp["h"])):
                assert xy not in cells, f"{stem}: {p['title']!r} overlaps {cells[xy]!r}"
                cells[xy] = p["title"]
            if p["type"] == "row":
                continue
            assert p["datasource"]["uid"] == uid and p["targets"] and p.get("description"), (stem, p["title"])
            for t in p["targets"]:
                assert t["datasource"]["uid"] == uid
                names = _promql_names(t["expr"])
                assert names and names <= EXPORTER_METRICS, f"{stem}: {p['title']!r} reads {names - EXPORTER_METRICS}"
                assert all(n.startswith(stem + "_") for n in names), (stem, names)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "dashboards.rules.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}), encoding="utf-8")
        run = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr


# ----------------------------------------------------------------------------- Kubernetes
def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            out += [(path.name, d) for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return out


def test_kubernetes_manifests_validate_against_the_schemas() -> None:
    """Every manifest is a valid object of Kubernetes 1.31 (strict: no unknown field), offline."""
    kv = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    docs = _k8s_docs()
    kinds = {d["kind"] for _, d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "Ingress"} <= kinds, kinds
    for name, doc in docs:
        try:
            kv.validate(doc, "1.31.0", strict=True)
        except (ValidationError, SchemaNotFoundError) as exc:
            raise AssertionError(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {exc}") from None
        assert doc["kind"] == "Namespace" or doc["metadata"]["namespace"] == "ldp-stream", name
    kustomization = _yaml(KUBERNETES / "kustomization.yaml")
    assert set(kustomization["resources"]) == {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}


def test_kubernetes_workloads_probes_resources_disruption_budgets_and_settings() -> None:
    from dataclasses import fields

    from stream_app.ingest.settings import IngestSettings
    from stream_app.settings import WorkerSettings
    from wire.transport import KAFKA_ENV, REDIS_ENV

    docs = [d for _, d in _k8s_docs()]
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    transport = {*KAFKA_ENV.values(), *REDIS_ENV.values(), KAFKA_ENV["password"] + "_FILE",
                 REDIS_ENV["password"] + "_FILE"}
    settings = {"worker": (WorkerSettings, {"NUMBA_NUM_THREADS"}),
                "ingest": (IngestSettings, {"NUMBA_NUM_THREADS", "LDP_DEVICE_SECRET_FILE"})}
    # what the worker's ConfigMap may leave out, and why (the comment in worker.yaml says it too)
    unset_ok = {"LDP_REDIS_MEMORY_BYTES", "LDP_READY_FILE", "LDP_LOGFILE"}
    campaigns = by_kind["ConfigMap"]["ldp-campaigns"]["data"]
    assert campaigns["demo.toml"] == (DEPLOY / "campaigns" / "demo.toml").read_text(encoding="utf-8"), \
        "deploy/kubernetes/campaigns.yaml must carry deploy/campaigns/demo.toml as it is"
    assert set(by_kind["Deployment"]) == {"ldp-worker", "ldp-ingest"}
    for dep in by_kind["Deployment"].values():
        pod = dep["spec"]["template"]
        labels = pod["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert dep["spec"]["replicas"] >= 2
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False and spec["securityContext"]["runAsNonRoot"] is True
        (container,) = spec["containers"]
        command = container["args"][0]
        cls, extra = settings[command]
        # probes on /health (readiness and start); liveness present
        for probe in ("readinessProbe", "startupProbe"):
            assert container[probe]["httpGet"]["path"] == "/health", (command, probe)
        assert "livenessProbe" in container, command
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        port = ports[container["readinessProbe"]["httpGet"]["port"]]
        # resources
        res = container["resources"]
        for part in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(res[part]), (command, part)
        assert _mem_bytes(res["limits"]["memory"]) >= _mem_bytes(res["requests"]["memory"])
        # a disruption budget and a Service select the pods
        pdbs = [p for p in by_kind["PodDisruptionBudget"].values()
                if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(pdbs) == 1, (command, pdbs)
        assert any(s["spec"]["selector"].items() <= labels.items() and s["spec"]["ports"][0]["port"] == port
                   for s in by_kind["Service"].values()), command
        # the settings: real variables only, parsed as the service would
        (ref,) = container["envFrom"]
        env = by_kind["ConfigMap"][ref["configMapRef"]["name"]]["data"]
        names = {f.metadata["env"] for f in fields(cls)}
        unknown = set(env) - names - transport - extra
        assert not unknown, f"{command}: variables no setting reads: {sorted(unknown)}"
        if command == "worker":
            assert names - set(env) <= unset_ok, f"worker settings missing from the ConfigMap: {names - set(env)}"
            assert int(env["LDP_WEB_PORT"]) == port
        else:
            assert int(env["LDP_INGEST_PORT"]) == port
        cls.from_env(environ=env)
        assert env["LDP_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL" and env["LDP_KAFKA_USERNAME"] == command
        # the files the variables name are in the pod's volumes: its own secrets, the campaigns
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        for key, value in env.items():
            if key.endswith("_FILE") or key in ("LDP_KAFKA_CAFILE",):
                where, _, item = value.rpartition("/")
                sources = volumes[mounts[where]]["projected"]["sources"]
                assert item in {i["path"] for s in sources for i in s["secret"]["items"]}, (command, key)
        secret_names = {s["secret"]["name"] for v in volumes.values()
                        for s in v.get("projected", {}).get("sources", [])}
        assert secret_names == {f"ldp-{command}", "ldp-kafka-ca"}, (command, secret_names)
        for path in env["LDP_CAMPAIGNS"].split(":"):
            where, _, item = path.rpartition("/")
            assert volumes[mounts[where]]["configMap"]["name"] == "ldp-campaigns" and item in campaigns, path
    ingress = by_kind["Ingress"]["ldp-ingest"]["spec"]
    assert ingress["tls"]
    assert {p["path"] for r in ingress["rules"] for p in r["http"]["paths"]} == {"/reports", "/health"}
