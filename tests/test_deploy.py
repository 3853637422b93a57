"""The production stack (docker-compose.yml and deploy/) agrees with itself and with the code.

No Docker engine is needed: the files are parsed (PyYAML, json) and their cross-references are
checked: compose services and their dependencies, the commands the containers run (against the
``ldp`` CLI's real options), the campaign file the containers mount, the topics kafka-init
creates, the Prometheus scrape targets, the Grafana provisioning and every PromQL metric the
dashboard queries (against the metrics the stream app really registers). When the
``docker compose`` plugin or ``promtool`` is installed, their offline checks run too.
"""
from __future__ import annotations

import json
import re
import shlex
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
    "ldp_estimated_frequency", "ldp_reports_total", "ldp_reports_per_second", "ldp_step_reports",
    "ldp_rejected_batches_total", "ldp_consumer_lag_messages", "ldp_eps_first", "ldp_eps_inf",
    "ldp_eps_longitudinal_worst", "ldp_estimate_latency_seconds",
}
# Series Prometheus itself adds to every scrape (allowed in the dashboard besides ldp_*).
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
GRAFANA_BUILTIN_VARS = {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s",
                        "__range_ms", "__from", "__to", "__dashboard", "__name"}
SERVICES = {"kafka", "kafka-init", "redis", "worker", "ingest", "producer", "prometheus", "grafana"}


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
    """``["worker", "--a", "1", "--b", "2"]`` -> ``{"--a": "1", "--b": "2"}`` (every option takes a value)."""
    opts = {}
    it = iter(argv[1:])
    for tok in it:
        assert tok.startswith("--"), f"unexpected positional {tok!r} in {argv}"
        opts[tok] = next(it)
    return opts


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
    for name in ("kafka", "redis", "worker", "ingest", "prometheus", "grafana"):
        assert "healthcheck" in services[name], f"{name} has no healthcheck"
    # the workers wait for their topics and for Redis; Grafana for Prometheus
    assert services["worker"]["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
    assert services["worker"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    assert int(_expand(services["worker"]["deploy"]["replicas"])) >= 2


def test_kafka_is_kraft_and_advertises_the_address_clients_use(services: dict[str, dict[str, Any]]) -> None:
    env = services["kafka"]["environment"]
    assert "controller" in env["KAFKA_PROCESS_ROLES"] and "broker" in env["KAFKA_PROCESS_ROLES"]
    assert "ZOOKEEPER" not in " ".join(env).upper()
    advertised = {u.split("://")[1] for u in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    for name in ("worker", "producer"):
        bootstrap = _options(_command(services[name]))["--kafka"]
        for hp in bootstrap.split(","):
            host, port = _host_port(hp)
            assert host in services, f"{name}: Kafka host {host} is not a compose service"
            assert f"{host}:{port}" in advertised, f"{name} bootstraps {hp}, kafka advertises {advertised}"


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


def test_worker_and_producer_commands(services: dict[str, dict[str, Any]]) -> None:
    from wire.campaign import Campaign

    worker = _options(_command(services["worker"]))
    redis_url = urlparse(worker["--redis"])
    assert redis_url.scheme == "redis" and redis_url.hostname in services, worker["--redis"]
    assert worker["--web-bind"] == "0.0.0.0", "the worker must listen beyond the container's loopback"
    for name in ("worker", "producer"):
        svc = services[name]
        assert _command(svc)[0] == {"worker": "worker", "producer": "produce"}[name]
        campaign_file = _host_path(svc, _options(_command(svc))["--campaign"])
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
    assert env["GF_AUTH_ANONYMOUS_ENABLED"] == "true" and env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
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
