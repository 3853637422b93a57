"""The settings of one stream-app worker, in one place: :class:`WorkerSettings`.

Every worker option is a field of :class:`WorkerSettings` with its default, its environment variable
and its ``ldp worker`` option; the CLI, the test harness (``ldpstream_dev.workers.WorkerProcess``) and
docker-compose all go through it. Precedence: command-line option > environment variable > default.

- ``campaign_paths`` (required): ``LDP_CAMPAIGNS`` (``os.pathsep``-separated), ``--campaign`` / ``-c``
- ``kafka_bootstrap`` (required): ``LDP_KAFKA_BOOTSTRAP``, ``--kafka``
- ``redis_url`` (required): ``LDP_REDIS_URL``, ``--redis`` (one node, or ``redis+cluster://host:port,...``)
- ``app_id``: ``LDP_APP_ID``, ``--app-id``
- ``partitions``: ``LDP_PARTITIONS``, ``--partitions``
- ``estimates_partitions``: ``LDP_ESTIMATES_PARTITIONS``, ``--estimates-partitions``
- ``topic_prefix``: ``LDP_TOPIC_PREFIX``, ``--topic-prefix``
- ``refresh_seconds``: ``LDP_REFRESH_SECONDS``, ``--refresh``
- ``session_timeout``: ``LDP_SESSION_TIMEOUT``, ``--session-timeout``
- ``web_port``: ``LDP_WEB_PORT``, ``--web-port``
- ``web_host``: ``LDP_WEB_HOST``, ``--web-host``
- ``web_bind``: ``LDP_WEB_BIND``, ``--web-bind``
- ``data_dir``: ``LDP_DATA_DIR``, ``--data-dir``
- ``ready_file``: ``LDP_READY_FILE``, ``--ready-file``
- ``loglevel``: ``LDP_LOGLEVEL``, ``--loglevel``
- ``logfile``: ``LDP_LOGFILE``, ``--logfile``
- ``stream_buffer_maxsize``: ``LDP_STREAM_BUFFER_MAXSIZE``, ``--stream-buffer-maxsize``
- ``consumer_max_fetch_size``: ``LDP_CONSUMER_MAX_FETCH_SIZE``, ``--consumer-max-fetch-size``
- ``consumer_fetch_max_wait``: ``LDP_CONSUMER_FETCH_MAX_WAIT``, ``--consumer-fetch-max-wait``
- ``shutdown_timeout``: ``LDP_SHUTDOWN_TIMEOUT``, ``--shutdown-timeout``
- ``per_value_metrics``: ``LDP_PER_VALUE_METRICS``, ``--per-value-metrics``
- ``per_value_metrics_max_k``: ``LDP_PER_VALUE_METRICS_MAX_K``, ``--per-value-metrics-max-k``
- ``redis_memory_bytes``: ``LDP_REDIS_MEMORY_BYTES``, ``--redis-memory``
- ``retention_batches_per_step``: ``LDP_RETENTION_BATCHES_PER_STEP``, ``--retention-batches-per-step``

Kafka and Redis security is not a worker option but environment variables read by every client of the project
(:mod:`wire.transport`), so that no secret is ever on a command line: ``LDP_KAFKA_SECURITY_PROTOCOL``,
``LDP_KAFKA_SASL_MECHANISM``, ``LDP_KAFKA_USERNAME``, ``LDP_KAFKA_PASSWORD`` / ``LDP_KAFKA_PASSWORD_FILE``,
``LDP_KAFKA_CAFILE`` / ``LDP_KAFKA_CERTFILE`` / ``LDP_KAFKA_KEYFILE``; ``LDP_REDIS_USERNAME``,
``LDP_REDIS_PASSWORD`` / ``LDP_REDIS_PASSWORD_FILE``, ``LDP_REDIS_CAFILE`` ... (a ``redis_url`` may also carry
``user:password@`` and be ``rediss://``; it is only ever shown redacted).

An environment variable set to the empty string counts as unset. The source of these names is
each field's metadata (:func:`setting_specs`), which ``ldp worker`` and :meth:`WorkerSettings.to_env`
read; ``tests/test_settings.py`` checks that this list agrees with it.
"""
from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["SettingsError", "WorkerSettings", "free_port", "parse_memory", "setting_specs"]

LOCALHOST = "127.0.0.1"


class SettingsError(ValueError):
    """A worker setting is missing or invalid (the message names its option and variable)."""


def _paths(text: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in text.split(os.pathsep) if p)


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _flag(text: str) -> bool:
    low = text.strip().lower()
    if low not in _TRUE | _FALSE:
        raise ValueError(f"expected true/false (1/0, yes/no, on/off), got {text!r}")
    return low in _TRUE


#: Redis's memory units (``maxmemory 512mb``): k/m/g are powers of 1000, kb/mb/gb of 1024.
_MEMORY_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1024, "m": 1000 ** 2, "mb": 1024 ** 2, "g": 1000 ** 3, "gb": 1024 ** 3}


def parse_memory(text: str) -> int:
    """Bytes of a memory size written as Redis writes ``maxmemory``: ``268435456``, ``256mb``, ``1gb``, ``2g``."""
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _MEMORY_UNITS:
        raise ValueError(f"expected bytes, or a number with a unit of Redis (kb, mb, gb, k, m, g), got {text!r}")
    return int(m.group(1)) * _MEMORY_UNITS[unit]


def _setting(env: str, option: tuple[str, ...], help: str, parse: Callable[[str], Any] = str,
             default: Any = MISSING) -> Any:
    """A dataclass field with its environment variable, CLI option names, help and parser."""
    meta = {"env": env, "option": option, "help": help, "parse": parse}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


@dataclass(frozen=True)
class WorkerSettings:
    """Everything one worker process needs (see the module doc for the names of each setting)."""

    campaign_paths: tuple[Path, ...] = _setting(
        "LDP_CAMPAIGNS", ("--campaign", "-c"), "Campaign file (TOML); repeatable.", _paths)
    kafka_bootstrap: str = _setting("LDP_KAFKA_BOOTSTRAP", ("--kafka",), "Kafka bootstrap host:port[,host:port].")
    redis_url: str = _setting("LDP_REDIS_URL", ("--redis",), "Redis URL: redis://127.0.0.1:6379/0 (one node) or "
                              "redis+cluster://host:port[,host:port...] (a Redis Cluster; rediss+cluster:// for TLS).")
    app_id: str = _setting("LDP_APP_ID", ("--app-id",), "Faust app id (= consumer group).", default="ldp-stream")
    partitions: int = _setting("LDP_PARTITIONS", ("--partitions",), "Partitions of the reports topic.", int,
                               default=4)
    estimates_partitions: int = _setting(
        "LDP_ESTIMATES_PARTITIONS", ("--estimates-partitions",),
        "Partitions of the estimates topic when the worker creates it (every deployment creates it alike: "
        "docs/estimates.md).", int, default=1)
    topic_prefix: str = _setting("LDP_TOPIC_PREFIX", ("--topic-prefix",),
                                 "Prefix of the three topic names ({prefix}ldp.reports ...).", default="")
    refresh_seconds: float = _setting("LDP_REFRESH_SECONDS", ("--refresh",), "Estimator refresh period (s).", float,
                                      default=1.0)
    session_timeout: float | None = _setting(
        "LDP_SESSION_TIMEOUT", ("--session-timeout",),
        "Consumer-group session timeout (s): a killed worker's partitions move to the survivors after about "
        "this long (failover in seconds; Faust's own default is 60 s).", float, default=10.0)
    web_port: int | None = _setting("LDP_WEB_PORT", ("--web-port",),
                                    "HTTP API / metrics port; default: a free one.", int, default=None)
    web_host: str = _setting("LDP_WEB_HOST", ("--web-host",), "Host name in the worker's URLs (and bind address).",
                             default=LOCALHOST)
    web_bind: str | None = _setting("LDP_WEB_BIND", ("--web-bind",),
                                    "Bind address (default: the web host; 0.0.0.0 in containers).", default=None)
    data_dir: Path | None = _setting("LDP_DATA_DIR", ("--data-dir",),
                                     "Faust data directory; default: a temporary one, removed at exit.", Path,
                                     default=None)
    ready_file: Path | None = _setting(
        "LDP_READY_FILE", ("--ready-file",),
        "JSON file written once serving (pid, web port/url, assigned partitions).", Path, default=None)
    loglevel: str = _setting("LDP_LOGLEVEL", ("--loglevel",), "Log level.", default="warning")
    logfile: Path | None = _setting("LDP_LOGFILE", ("--logfile",), "Log file; default: stderr.", Path,
                                    default=None)
    stream_buffer_maxsize: int = _setting("LDP_STREAM_BUFFER_MAXSIZE", ("--stream-buffer-maxsize",),
                                          "Faust stream buffer (messages).", int, default=64)
    consumer_max_fetch_size: int = _setting("LDP_CONSUMER_MAX_FETCH_SIZE", ("--consumer-max-fetch-size",),
                                            "Consumer max fetch size (bytes).", int, default=8 * 1024 * 1024)
    consumer_fetch_max_wait: float = _setting(
        "LDP_CONSUMER_FETCH_MAX_WAIT", ("--consumer-fetch-max-wait",),
        "Longest wait (s) of a Kafka fetch while the worker's partitions have no new data (Faust's own: 1.5 s; "
        "tansu answers a waiting fetch only when the wait is over, so new batches waited that long).", float,
        default=0.1)
    shutdown_timeout: float = _setting(
        "LDP_SHUTDOWN_TIMEOUT", ("--shutdown-timeout",),
        "After SIGTERM/SIGINT, exit by force (status 1, logging where it hung) if the clean stop has not finished "
        "within this many seconds (Redis or the broker unreachable).", float, default=10.0)
    per_value_metrics: bool = _setting(
        "LDP_PER_VALUE_METRICS", ("--per-value-metrics",),
        "Export the estimated frequency of every value to Prometheus (ldp_estimated_frequency_ratio{value}: k series "
        "per attribute, for attributes with k <= per_value_metrics_max_k). Off: the HTTP API has them.", _flag,
        default=False)
    per_value_metrics_max_k: int = _setting(
        "LDP_PER_VALUE_METRICS_MAX_K", ("--per-value-metrics-max-k",),
        "With per_value_metrics: only attributes whose domain size k is at most this export their values.", int,
        default=1000)
    redis_memory_bytes: int | None = _setting(
        "LDP_REDIS_MEMORY_BYTES", ("--redis-memory",),
        "Redis memory the campaigns' retention must fit (bytes, or 512mb, 2gb ...; per master of a Redis Cluster); "
        "default: Redis's maxmemory (CONFIG GET; no check when it is 0). For a Redis whose CONFIG is disabled.",
        parse_memory, default=None)
    retention_batches_per_step: int = _setting(
        "LDP_RETENTION_BATCHES_PER_STEP", ("--retention-batches-per-step",),
        "Batches per attribute and step that the retention check assumes (each leaves its batch id in Redis for "
        "the step's retention).", int, default=100)

    def __post_init__(self) -> None:
        paths = self.campaign_paths
        paths = (paths,) if isinstance(paths, (str, Path)) else paths
        object.__setattr__(self, "campaign_paths", tuple(Path(p) for p in paths))
        for name in ("data_dir", "ready_file", "logfile"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))
        if not self.campaign_paths:
            raise SettingsError(f"no campaign file: {_describe('campaign_paths')}")
        for name in ("kafka_bootstrap", "redis_url", "app_id"):
            if not getattr(self, name):
                raise SettingsError(f"{name} is empty: {_describe(name)}")
        if self.partitions < 1:
            raise SettingsError(f"partitions must be >= 1, got {self.partitions}")
        if self.estimates_partitions < 1:
            raise SettingsError(f"estimates_partitions must be >= 1, got {self.estimates_partitions}")
        for name in ("refresh_seconds", "session_timeout", "shutdown_timeout",
                     "consumer_fetch_max_wait"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise SettingsError(f"{name} must be > 0, got {value}")
        for name in ("per_value_metrics_max_k", "retention_batches_per_step", "redis_memory_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingsError(f"{name} must be >= 1, got {value}")
        if self.web_port is not None and not 0 < self.web_port < 65536:
            raise SettingsError(f"web_port must be in 1..65535, got {self.web_port}")

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> "WorkerSettings":
        """Settings from ``options`` (field names; ``None`` = not given), else ``environ``, else defaults."""
        return cls.from_values(cls.merge(options, environ))

    @classmethod
    def merge(cls, options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The values given by ``options`` (non-``None``) over those of ``environ`` (``os.environ``)."""
        unknown = set(options) - set(setting_specs())
        if unknown:
            raise TypeError(f"unknown worker settings: {sorted(unknown)}")
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"], "")
            if raw != "":
                try:
                    values[f.name] = f.metadata["parse"](raw)
                except ValueError as exc:
                    raise SettingsError(f"{f.metadata['env']}={raw!r}: {exc}") from exc
        values.update({k: v for k, v in options.items() if v is not None})
        return values

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> "WorkerSettings":
        """Settings from merged values; a missing required setting raises :class:`SettingsError`."""
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in values]
        if missing:
            raise SettingsError("missing worker setting(s): " + "; ".join(_describe(n) for n in missing))
        return cls(**values)

    def __repr__(self) -> str:
        """The settings, the Redis URL's password masked (``wire.transport.redact_url``): safe to log."""
        from wire.transport import redact_url

        shown = (f"{f.name}={redact_url(v)!r}" if f.name == "redis_url" else f"{f.name}={v!r}"
                 for f in fields(self) for v in (getattr(self, f.name),))
        return f"{type(self).__name__}({', '.join(shown)})"

    # ------------------------------------------------------------------ exporting
    def to_env(self) -> dict[str, str]:
        """Environment variables that :meth:`from_env` reads back into these settings (``None`` omitted)."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            out[f.metadata["env"]] = (os.pathsep.join(str(p) for p in value) if f.name == "campaign_paths"
                                      else str(value))
        return out


def setting_specs() -> dict[str, dict[str, Any]]:
    """Field name -> ``{"env", "option", "help", "parse", "default"}`` of every worker setting."""
    return {f.name: {**f.metadata, "default": None if f.default is MISSING else f.default}
            for f in fields(WorkerSettings)}


def _describe(name: str) -> str:
    meta = setting_specs()[name]
    return f"{name} (option {meta['option'][0]}, environment variable {meta['env']})"


_reserved_ports: set[int] = set()
_reserved_lock = threading.Lock()


def free_port(host: str = LOCALHOST) -> int:
    """A currently free TCP port on ``host``, never the same twice within this process.

    The worker's web port when none is set; the dev stack picks its broker and Redis ports here too,
    so ports handed out in one process never collide."""
    with _reserved_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _reserved_ports:
                _reserved_ports.add(port)
                return port
    raise RuntimeError("could not find a free local port")  # pragma: no cover
