"""A real Prometheus server (Debian's ``prometheus`` binary) scraping local workers, for tests.

:func:`render_config` turns the deployed configuration (``deploy/prometheus/prometheus.yml``) into one for
local processes: the same jobs, metrics paths and relabelings, each job's service discovery replaced by
static targets (the job's ``host:port`` list given by the caller), a short scrape interval, and jobs the
caller adds (a service the compose file does not run yet). :class:`PrometheusServer` runs the binary on
a free loopback port with a temporary TSDB and answers PromQL through the HTTP query API; the binary
comes from :func:`ldpstream_dev.debian.ensure_binary`.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from stream_app.settings import free_port

from .debian import ensure_binary
from .processes import log_tail, stop_child

__all__ = ["DEPLOYED_CONFIG", "PrometheusServer", "prometheus_binary", "promtool_binary", "render_config"]

DEPLOYED_CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "prometheus" / "prometheus.yml"
_SD_KEYS = ("static_configs", "dns_sd_configs", "file_sd_configs", "kubernetes_sd_configs", "consul_sd_configs",
            "docker_sd_configs", "http_sd_configs")


def prometheus_binary() -> str:
    """``prometheus`` (Debian package ``prometheus``, installed if missing)."""
    return ensure_binary("prometheus", "prometheus")


def promtool_binary() -> str:
    """``promtool`` (shipped in Debian's ``prometheus`` package)."""
    return ensure_binary("promtool", "prometheus")


def render_config(targets: dict[str, list[str]], *, scrape_interval: str = "1s", source: Path = DEPLOYED_CONFIG,
                  extra_jobs: dict[str, str] | None = None) -> dict[str, Any]:
    """The deployed configuration with each job's targets replaced by ``targets[job]`` (``host:port``).

    Jobs without targets are dropped (the ``prometheus`` self-scrape gets this server's own address from
    :class:`PrometheusServer`). ``extra_jobs`` maps job names absent from the source to their metrics path.
    """
    config = yaml.safe_load(Path(source).read_text(encoding="utf-8"))
    glob = config.setdefault("global", {})
    glob["scrape_interval"] = glob["evaluation_interval"] = scrape_interval
    glob["scrape_timeout"] = scrape_interval
    jobs = []
    for job in config.get("scrape_configs", []):
        name = job["job_name"]
        if not targets.get(name):
            continue
        job = {k: v for k, v in job.items() if k not in _SD_KEYS}
        job.pop("scrape_interval", None)
        job.pop("scrape_timeout", None)
        job["static_configs"] = [{"targets": list(targets[name])}]
        jobs.append(job)
    known = {j["job_name"] for j in config.get("scrape_configs", [])}
    for name, path in (extra_jobs or {}).items():
        if name in known:
            raise ValueError(f"job {name!r} is in {source} already: give its targets instead")
        if targets.get(name):
            jobs.append({"job_name": name, "metrics_path": path, "static_configs": [{"targets": list(targets[name])}]})
    config["scrape_configs"] = jobs
    config.pop("rule_files", None)
    config.pop("alerting", None)
    return config


class PrometheusServer:
    """``prometheus`` on ``127.0.0.1:<free port>`` with a fresh TSDB under ``run_dir``.

    ``start(config)`` writes the configuration, launches the binary and waits until ``/-/ready`` answers;
    :meth:`query` / :meth:`query_range` / :meth:`label_values` / :meth:`targets` call the HTTP API;
    :meth:`stop` ends the process (SIGTERM, then SIGKILL).
    """

    def __init__(self, run_dir: Path | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-prometheus-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = self.run_dir / "prometheus.yml"
        self.log_path = self.run_dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, config: dict[str, Any], timeout: float = 60.0) -> "PrometheusServer":
        config = json.loads(json.dumps(config))
        for job in config.get("scrape_configs", []):
            if job["job_name"] == "prometheus":  # its own address
                job["static_configs"] = [{"targets": [f"127.0.0.1:{self.port}"]}]
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [prometheus_binary(), f"--config.file={self.config_path}", f"--storage.tsdb.path={self.run_dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h",
             "--web.console.templates=/dev/null", "--web.console.libraries=/dev/null", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.run_dir, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"prometheus not ready after {timeout} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None:
            stop_child(self.proc, timeout)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    # ------------------------------------------------------------------ HTTP API
    def api(self, path: str, **params: Any) -> Any:
        """``GET /api/v1/{path}`` with ``params``; returns ``data`` (raises on an error status)."""
        query = urllib.parse.urlencode([(k, v) for k, vs in params.items()
                                        for v in (vs if isinstance(vs, (list, tuple)) else [vs])])
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            doc = json.loads(r.read())
        if doc.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector result of ``expr`` now (``[{"metric": {...}, "value": [ts, "v"]}, ...]``)."""
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict[str, Any]]:
        """Range result of ``expr`` (``[{"metric": {...}, "values": [[ts, "v"], ...]}, ...]``)."""
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["result"]

    def label_values(self, label: str, match: str) -> list[str]:
        return self.api(f"label/{label}/values", **{"match[]": match})

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets (``job``, ``scrapeUrl``, ``health``, ``lastError`` ...)."""
        return [{"job": t["labels"].get("job"), **t} for t in self.api("targets")["activeTargets"]]

    def value(self, expr: str) -> float | None:
        """The single value of ``expr`` now (None when the result is empty; the sum when it has several series)."""
        result = self.query(expr)
        return sum(float(s["value"][1]) for s in result) if result else None

    def __enter__(self) -> "PrometheusServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
