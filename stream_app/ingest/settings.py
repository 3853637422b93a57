"""The settings of ``ldp ingest``: :class:`IngestSettings`, each with its environment variable and option.

Precedence as for the worker (:mod:`stream_app.settings`): option > environment variable > default; an
empty variable counts as unset. The broker, Redis, campaigns and topic prefix use the worker's variables,
so one environment serves both.

- ``campaign_paths`` (required): ``LDP_CAMPAIGNS``, ``--campaign`` / ``-c``
- ``kafka_bootstrap`` (required): ``LDP_KAFKA_BOOTSTRAP``, ``--kafka``
- ``redis_url`` (required): ``LDP_REDIS_URL``, ``--redis``
- ``topic_prefix``: ``LDP_TOPIC_PREFIX``, ``--topic-prefix``
- ``host``: ``LDP_INGEST_HOST``, ``--host``
- ``port``: ``LDP_INGEST_PORT``, ``--port``
- ``processes``: ``LDP_INGEST_PROCESSES``, ``--processes``
- ``linger_seconds``: ``LDP_INGEST_LINGER``, ``--linger``
- ``max_batch_reports``: ``LDP_INGEST_MAX_BATCH``, ``--max-batch``
- ``max_body_bytes``: ``LDP_INGEST_MAX_BODY``, ``--max-body``
- ``max_device_reports``: ``LDP_INGEST_MAX_DEVICE_REPORTS``, ``--max-device-reports``
- ``max_relay_reports``: ``LDP_INGEST_MAX_RELAY_REPORTS``, ``--max-relay-reports``
- ``max_late_seconds``: ``LDP_INGEST_MAX_LATE``, ``--max-late``
- ``max_early_seconds``: ``LDP_INGEST_MAX_EARLY``, ``--max-early``
- ``idempotency_seconds``: ``LDP_INGEST_IDEMPOTENCY_SECONDS``, ``--idempotency-seconds``
- ``publish_timeout``: ``LDP_INGEST_PUBLISH_TIMEOUT``, ``--publish-timeout``
- ``shutdown_timeout``: ``LDP_INGEST_SHUTDOWN_TIMEOUT``, ``--shutdown-timeout``
- ``request_timeout``: ``LDP_INGEST_REQUEST_TIMEOUT``, ``--request-timeout``
- ``keepalive_seconds``: ``LDP_INGEST_KEEPALIVE``, ``--keepalive``
- ``max_connections``: ``LDP_INGEST_MAX_CONNECTIONS``, ``--max-connections``
- ``max_connections_per_ip``: ``LDP_INGEST_MAX_CONNECTIONS_PER_IP``, ``--max-connections-per-ip``
- ``first_byte_timeout``: ``LDP_INGEST_FIRST_BYTE_TIMEOUT``, ``--first-byte-timeout``
- ``device_requests_per_second``: ``LDP_INGEST_DEVICE_REQUEST_RATE``, ``--device-request-rate``
- ``relay_requests_per_second``: ``LDP_INGEST_RELAY_REQUEST_RATE``, ``--relay-request-rate``
- ``relay_reports_per_second``: ``LDP_INGEST_RELAY_REPORT_RATE``, ``--relay-report-rate``
- ``revocation_refresh_seconds``: ``LDP_INGEST_REVOCATION_REFRESH``, ``--revocation-refresh``
- ``open_mode``: ``LDP_INGEST_OPEN``, ``--open`` (development only: no credential, no rate limit)
- ``loglevel``: ``LDP_LOGLEVEL``, ``--loglevel``

The device-token secret is not a setting (an option would show in ``ps``): ``LDP_DEVICE_SECRET`` or
``LDP_DEVICE_SECRET_FILE`` (:class:`stream_app.ingest.auth.DeviceSecret`). Kafka and Redis credentials:
:mod:`wire.transport`.
"""
from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from ..settings import LOCALHOST, SettingsError, _paths, _setting

__all__ = ["IngestSettings", "MAX_LINGER_SECONDS", "ingest_setting_specs", "parse_bool"]

MAX_LINGER_SECONDS = 0.010


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


@dataclass(frozen=True)
class IngestSettings:
    """Everything one ``ldp ingest`` needs (module doc)."""

    campaign_paths: tuple[Path, ...] = _setting(
        "LDP_CAMPAIGNS", ("--campaign", "-c"), "Campaign file (TOML); repeatable.", _paths)
    kafka_bootstrap: str = _setting("LDP_KAFKA_BOOTSTRAP", ("--kafka",), "Kafka bootstrap host:port[,host:port].")
    redis_url: str = _setting("LDP_REDIS_URL", ("--redis",), "Redis URL (rate limits and idempotency records).")
    topic_prefix: str = _setting("LDP_TOPIC_PREFIX", ("--topic-prefix",), "Prefix of the topic names.", default="")
    host: str = _setting("LDP_INGEST_HOST", ("--host",), "Bind address.", default=LOCALHOST)
    port: int = _setting("LDP_INGEST_PORT", ("--port",), "HTTP port, shared by every process.", int, default=8080)
    processes: int = _setting("LDP_INGEST_PROCESSES", ("--processes",),
                              "Server processes on the port (each with its own Kafka producer).", int, default=1)
    linger_seconds: float = _setting(
        "LDP_INGEST_LINGER", ("--linger",), f"Wait this long (s, <= {MAX_LINGER_SECONDS}) after a first report for "
        "more before publishing a batch.", float, default=0.005)
    max_batch_reports: int = _setting("LDP_INGEST_MAX_BATCH", ("--max-batch",),
                                      "Reports per published batch at most (a full batch is sent at once).", int,
                                      default=10_000)
    max_body_bytes: int = _setting("LDP_INGEST_MAX_BODY", ("--max-body",),
                                   "Request body size limit (bytes): 413 past it.", int, default=1 << 20)
    max_device_reports: int = _setting("LDP_INGEST_MAX_DEVICE_REPORTS", ("--max-device-reports",),
                                       "Reports per request at most with a device token.", int, default=256)
    max_relay_reports: int = _setting("LDP_INGEST_MAX_RELAY_REPORTS", ("--max-relay-reports",),
                                      "Reports per request at most with a relay token.", int, default=100_000)
    max_late_seconds: float = _setting(
        "LDP_INGEST_MAX_LATE", ("--max-late",), "Accept a report this long (s) after its step and the campaign's "
        "lateness ended; its rate-limit slot lives that long.", float, default=3600.0)
    max_early_seconds: float = _setting("LDP_INGEST_MAX_EARLY", ("--max-early",),
                                        "Accept a report of a step that begins at most this long (s) ahead of the "
                                        "ingest's clock (device clock skew).", float, default=60.0)
    idempotency_seconds: int = _setting("LDP_INGEST_IDEMPOTENCY_SECONDS", ("--idempotency-seconds",),
                                        "How long (s) an Idempotency-Key's first answer is kept.", int, default=3600)
    publish_timeout: float = _setting("LDP_INGEST_PUBLISH_TIMEOUT", ("--publish-timeout",),
                                      "Broker acknowledgement timeout (s): 503 after it.", float, default=10.0)
    shutdown_timeout: float = _setting("LDP_INGEST_SHUTDOWN_TIMEOUT", ("--shutdown-timeout",),
                                       "After SIGTERM, wait this long (s) for the requests in flight.", float,
                                       default=10.0)
    request_timeout: float = _setting("LDP_INGEST_REQUEST_TIMEOUT", ("--request-timeout",),
                                      "A request must arrive whole within this long (s) of its first byte: 408 "
                                      "after it (slow clients).", float, default=30.0)
    keepalive_seconds: float = _setting("LDP_INGEST_KEEPALIVE", ("--keepalive",),
                                        "Close a keep-alive connection idle this long (s).", float, default=75.0)
    max_connections: int = _setting("LDP_INGEST_MAX_CONNECTIONS", ("--max-connections",),
                                    "Open connections per process at most: a new one past it is closed at once.",
                                    int, default=10_000)
    max_connections_per_ip: int = _setting("LDP_INGEST_MAX_CONNECTIONS_PER_IP", ("--max-connections-per-ip",),
                                           "Open connections per process from one client address at most: a new "
                                           "one past it is closed at once.", int, default=1_000)
    first_byte_timeout: float = _setting("LDP_INGEST_FIRST_BYTE_TIMEOUT", ("--first-byte-timeout",),
                                         "Close a new connection that sent no byte within this long (s).", float,
                                         default=10.0)
    device_requests_per_second: float = _setting(
        "LDP_INGEST_DEVICE_REQUEST_RATE", ("--device-request-rate",), "Requests per second per device token and "
        "process (refused ones included; bursts of twice as many): 429 past it.", float, default=5.0)
    relay_requests_per_second: float = _setting(
        "LDP_INGEST_RELAY_REQUEST_RATE", ("--relay-request-rate",), "Requests per second per relay token and "
        "process (refused ones included; bursts of twice as many): 429 past it.", float, default=100.0)
    relay_reports_per_second: float = _setting(
        "LDP_INGEST_RELAY_REPORT_RATE", ("--relay-report-rate",), "Reports per second per relay token and process "
        "(bursts of max(this, max_relay_reports)): 429 past it.", float, default=100_000.0)
    revocation_refresh_seconds: float = _setting(
        "LDP_INGEST_REVOCATION_REFRESH", ("--revocation-refresh",), "Read the revocation list's version this often "
        "(s): a revoked token is refused by every process within it.", float, default=0.5)
    open_mode: bool = _setting("LDP_INGEST_OPEN", ("--open",), "Development only: accept reports without a "
                               "credential (no rate limit).", parse_bool, default=False)
    loglevel: str = _setting("LDP_LOGLEVEL", ("--loglevel",), "Log level.", default="warning")

    def __post_init__(self) -> None:
        paths = self.campaign_paths
        paths = (paths,) if isinstance(paths, (str, Path)) else paths
        object.__setattr__(self, "campaign_paths", tuple(Path(p) for p in paths))
        if not self.campaign_paths:
            raise SettingsError("no campaign file: set LDP_CAMPAIGNS or --campaign")
        for name in ("kafka_bootstrap", "redis_url"):
            if not getattr(self, name):
                raise SettingsError(f"{name} is empty: {_describe(name)}")
        if not 0 <= self.linger_seconds <= MAX_LINGER_SECONDS:
            raise SettingsError(f"linger_seconds must lie in [0, {MAX_LINGER_SECONDS}], got {self.linger_seconds}")
        for name in ("port", "processes", "max_batch_reports", "max_body_bytes", "max_device_reports",
                     "max_relay_reports", "idempotency_seconds", "max_connections", "max_connections_per_ip"):
            if getattr(self, name) < 1:
                raise SettingsError(f"{name} must be >= 1, got {getattr(self, name)} ({_describe(name)})")
        for name in ("max_late_seconds", "max_early_seconds"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("publish_timeout", "shutdown_timeout", "request_timeout", "keepalive_seconds",
                     "first_byte_timeout", "device_requests_per_second", "relay_requests_per_second",
                     "relay_reports_per_second", "revocation_refresh_seconds"):
            if not getattr(self, name) > 0:
                raise SettingsError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> "IngestSettings":
        """Settings from ``options`` (field names; ``None`` = not given), else ``environ``, else defaults."""
        specs = ingest_setting_specs()
        unknown = set(options) - set(specs)
        if unknown:
            raise TypeError(f"unknown ingest settings: {sorted(unknown)}")
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, spec in specs.items():
            raw = env.get(spec["env"], "")
            if raw != "":
                try:
                    values[name] = spec["parse"](raw)
                except ValueError as exc:
                    raise SettingsError(f"{spec['env']}={raw!r}: {exc}") from exc
        values.update({k: v for k, v in options.items() if v is not None})
        missing = [name for name, spec in specs.items() if spec["required"] and name not in values]
        if missing:
            raise SettingsError("missing ingest setting(s): " + "; ".join(_describe(n) for n in missing))
        return cls(**values)

    def to_env(self) -> dict[str, str]:
        """Environment variables that :meth:`from_env` reads back into these settings."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.metadata["env"]] = (os.pathsep.join(str(p) for p in value) if f.name == "campaign_paths"
                                      else str(value))
        return out


def ingest_setting_specs() -> dict[str, dict[str, Any]]:
    """Field name -> ``{"env", "option", "help", "parse", "default", "required"}`` of every ingest setting."""
    return {f.name: {**f.metadata, "default": None if f.default is MISSING else f.default,
                     "required": f.default is MISSING} for f in fields(IngestSettings)}


def _describe(name: str) -> str:
    meta = ingest_setting_specs()[name]
    return f"{name} (option {meta['option'][0]}, environment variable {meta['env']})"
