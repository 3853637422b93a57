"""Whether a worker can make progress: its problems, the health verdict and the outage helpers.

A worker is *healthy* while nothing keeps it from counting. :class:`Health` holds the current
problems, each ``{"problem", "component", "since", "error"}``:

* ``starting`` / ``stopping`` (component ``worker``): not serving yet (no partition assignment,
  numba warm-up) or shutting down;
* ``redis`` (``redis``): the count store does not answer ``PING`` (probed every second);
* ``store_retry`` (``redis``): a store call of the hot path failed and is being retried (the batch
  is neither skipped nor rejected: the worker waits for Redis);
* ``kafka`` (``kafka``): the broker does not answer a metadata request (probed every 2 s);
* ``rebalance`` (``kafka``): the consumer group has been rebalancing for longer than the limit;
* every alarm that says ``"blocking": True``, in the alarm dictionaries given to :class:`Health`
  (``Worker.alarms`` of :mod:`stream_app.app`, ``Estimator.alarms``: other parts of the worker raise and clear those;
  alarms without that flag report data-quality events, listed by ``/status`` under ``alarms``,
  and leave the worker healthy).

``GET /health`` answers 200 while there is none and 503 otherwise; ``GET /status`` always answers
200 with ``healthy`` and ``problems``; the gauges ``ldp_worker_healthy`` (1/0) and
``ldp_worker_problem_seconds{problem,component}`` (age of each current problem) say the same to
Prometheus. A problem is logged once when it starts (ERROR) and once when it clears (WARNING).

:func:`kafka_reachable` is the broker probe (also used by the worker's start-up wait), and
:func:`limit_repeated_logs` rate-limits the client libraries' repeated errors during an outage
(aiokafka logs each failed fetch, metadata and connection attempt, about 10 a second).
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from .metrics import Metrics

__all__ = ["Health", "RepeatFilter", "add_worker_probes", "kafka_reachable", "limit_repeated_logs"]

log = logging.getLogger(__name__)

#: A probe returns ``None`` when its component is fine, else the error text.
Probe = Callable[[], Awaitable[str | None]]


@dataclass
class _ProbeSpec:
    name: str
    component: str
    probe: Probe
    every: float
    timeout: float
    due: float = 0.0


class Health:
    """The current problems of one worker (see the module doc); ``run()`` drives the probes."""

    def __init__(self, metrics: Metrics, alarm_sources: list[dict[str, dict[str, Any]]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.alarm_sources = alarm_sources if alarm_sources is not None else []
        self._clock = clock
        self._problems: dict[str, dict[str, Any]] = {}
        self._probes: list[_ProbeSpec] = []
        self._stop = asyncio.Event()
        metrics.worker_healthy.set_function(lambda: 1.0 if self.healthy else 0.0)

    # ------------------------------------------------------------------ problems
    def fail(self, name: str, component: str, error: str, *, level: int = logging.ERROR) -> bool:
        """Record problem ``name`` (or update its error); ``True`` when it is new (then it is logged at ``level``)."""
        current = self._problems.get(name)
        if current is not None:
            current["error"] = error
            return False
        self._problems[name] = {"component": component, "since": self._clock(), "error": error}
        log.log(level, "worker cannot make progress: %s (%s): %s", name, component, error)
        return True

    def clear(self, name: str, *, level: int = logging.WARNING) -> float | None:
        """Forget problem ``name`` (logged at ``level``); returns how long it lasted (``None``: there was none)."""
        current = self._problems.pop(name, None)
        if current is None:
            return None
        lasted = self._clock() - current["since"]
        log.log(level, "%s (%s) cleared after %.1f s", name, current["component"], lasted)
        return lasted

    def has(self, name: str) -> bool:
        return name in self._problems

    def _blocking_alarms(self) -> list[tuple[str, dict[str, Any]]]:
        return [(name, a) for source in self.alarm_sources for name, a in list(source.items()) if a.get("blocking")]

    @property
    def healthy(self) -> bool:
        return not self._problems and not self._blocking_alarms()

    def problems(self) -> list[dict[str, Any]]:
        """The current problems (blocking alarms included), oldest first; brings the problem gauges up to date."""
        out = [{"problem": name, **p} for name, p in self._problems.items()]
        out += [{"problem": name, "component": a.get("component", "worker"), "since": a.get("since"),
                 "error": a.get("error", "")} for name, a in self._blocking_alarms()]
        out.sort(key=lambda p: p["since"] or 0.0)
        self._export(out)
        return out

    def _export(self, problems: list[dict[str, Any]]) -> None:
        gauge = self.metrics.worker_problem_seconds
        gauge.clear()
        now = self._clock()
        for p in problems:
            gauge.labels(p["problem"], p["component"]).set(max(0.0, now - (p["since"] or now)))

    # ------------------------------------------------------------------ probes
    def add_probe(self, name: str, component: str, probe: Probe, *, every: float = 1.0,
                  timeout: float = 2.0) -> None:
        """Run ``probe`` every ``every`` seconds (at most ``timeout`` each); it raises or clears ``name``."""
        self._probes.append(_ProbeSpec(name, component, probe, every, timeout))

    async def check(self) -> None:
        """Run the probes that are due once."""
        now = time.monotonic()
        due = [p for p in self._probes if now >= p.due]
        for p in due:
            p.due = now + p.every
        results = await asyncio.gather(*(self._run_probe(p) for p in due))
        for p, error in zip(due, results):
            if error is None:
                self.clear(p.name)
            else:
                self.fail(p.name, p.component, error)
        self.problems()

    async def _run_probe(self, p: _ProbeSpec) -> str | None:
        try:
            return await asyncio.wait_for(p.probe(), p.timeout)
        except asyncio.TimeoutError:
            return f"no answer within {p.timeout:g} s"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing probe is the problem it reports
            return f"{type(exc).__name__}: {exc}"

    async def run(self, interval: float = 0.5) -> None:
        """Check the probes every ``interval`` seconds until :meth:`stop`."""
        while not self._stop.is_set():
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the monitor must outlive a broken probe
                log.exception("health check failed")
            try:
                await asyncio.wait_for(self._stop.wait(), interval)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------------------- probes
async def kafka_reachable(bootstrap: str, timeout: float = 2.0) -> str | None:
    """``None`` once some broker of ``bootstrap`` (``host:port[,host:port]``) answers a metadata
    request within ``timeout`` seconds, else the last error (nothing is logged)."""
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    from wire.transport import kafka_client_options

    security = kafka_client_options()  # SASL / TLS of LDP_KAFKA_* (wire.transport)
    error = "no bootstrap address"
    for hostport in (h.strip() for h in bootstrap.split(",") if h.strip()):
        host, _, port = hostport.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host or "localhost", int(port), client_id="ldp-health",
                            request_timeout_ms=max(100, int(timeout * 1000)), **security), timeout)
        except Exception as exc:  # noqa: BLE001 - refused, unresolvable, timed out: all mean unreachable
            error = f"cannot connect to {hostport}: {type(exc).__name__}: {exc}"
            continue
        try:
            await asyncio.wait_for(conn.send(MetadataRequest([])), timeout)
            return None
        except Exception as exc:  # noqa: BLE001
            error = f"{hostport} did not answer a metadata request: {type(exc).__name__}: {exc}"
        finally:
            conn.close()
    return error


# ---------------------------------------------------------------------------- logging
class RepeatFilter(logging.Filter):
    """Lets each repeated WARNING-or-worse message (same logger, same format string) through once per
    ``interval`` seconds; the next one that passes says how many were held back."""

    def __init__(self, interval: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self._clock = clock
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [next time allowed, held back]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, record.msg if isinstance(record.msg, str) else repr(record.msg))
        now = self._clock()
        seen = self._seen.get(key)
        if seen is not None and now < seen[0]:
            seen[1] += 1
            return False
        held = int(seen[1]) if seen is not None else 0
        self._seen[key] = [now + self.interval, 0]
        if held and isinstance(record.msg, str):
            record.msg = f"{record.msg} [and {held} more like this in the last {self.interval:g} s]"
        return True


def limit_repeated_logs(prefixes: tuple[str, ...] = ("aiokafka", "faust", "mode"),
                        interval: float = 30.0) -> RepeatFilter:
    """Add one :class:`RepeatFilter` to every logger named under ``prefixes`` (import those libraries
    first: a logger created later is not covered) and to the prefixes' own loggers."""
    filt = RepeatFilter(interval)
    names = set(prefixes) | {n for n in logging.Logger.manager.loggerDict
                             if any(n == p or n.startswith(p + ".") for p in prefixes)}
    for name in sorted(names):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(filt)
    return filt


# ---------------------------------------------------------------------------- a worker's probes
def add_worker_probes(health: Health, *, redis_ping: Callable[[], Awaitable[Any]], kafka_bootstrap: str,
                      rebalancing: Callable[[], bool], rebalance_limit: float) -> None:
    """The probes of a running worker: Redis ``PING`` every second, a broker metadata request every 2 s,
    and a consumer-group rebalance that lasts longer than ``rebalance_limit`` seconds."""
    async def redis() -> str | None:
        await redis_ping()
        return None

    async def kafka() -> str | None:
        return await kafka_reachable(kafka_bootstrap, 2.0)

    began: list[float] = []

    async def rebalance() -> str | None:
        if not rebalancing():
            began.clear()
            return None
        if not began:
            began.append(time.monotonic())
        waited = time.monotonic() - began[0]
        return None if waited < rebalance_limit else f"the consumer group has been rebalancing for {waited:.0f} s"

    health.add_probe("redis", "redis", redis, every=1.0, timeout=2.0)
    health.add_probe("kafka", "kafka", kafka, every=2.0, timeout=3.0)
    health.add_probe("rebalance", "kafka", rebalance, every=1.0)
