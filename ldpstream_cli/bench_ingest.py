"""`ldp bench ingest`: an HTTP load generator against the ingest service, started in the same run.

:func:`run_bench` starts the local stack (broker and Redis), ``ldp ingest --processes N`` on it and,
optionally, a counting worker, then measures three workloads on ``POST /reports``:

* ``json x1``: one JSON report per request (``application/json``, :mod:`wire.single_report`), each
  request with its own device token (``Authorization: Bearer``) and ``Idempotency-Key``, as devices
  send them (so no request is a replay or a rate-limit refusal: one report per device and step);
* ``binary x1``: the same in the compact body (``application/x-ldp-reports``, :mod:`wire.compact`);
* ``binary x1000``: 1,000 reports per compact body with a relay token (a gateway's batches).

For each workload the **saturation** is found by doubling the concurrent keep-alive clients (closed
loop: a client sends its next request when the previous one is answered) until the request rate
grows less than 5% twice in a row; the best point is the saturation. The ingest is then driven
**open loop at half that rate**: requests are scheduled at a fixed rate and a request's latency
counts from its scheduled time, so a stalled server cannot hide its queue (no coordinated omission).
That point uses the saturation's connections, at most :data:`HALF_CLIENTS_MAX` (``--half-clients``):
since a request waiting for a free connection waits on the clock too, fewer connections hide nothing,
while more of them only make the server read its requests in larger bursts.
Before each open-loop point the local Redis's append-only file is rewritten (``BGREWRITEAOF``, waited
for; ``--no-compact-redis`` skips it): the saturation search writes a few hundred MB of rate-limit slots
and idempotency records, and Redis rewrites its AOF each time the file doubled, in a forked child that
takes one of the machine's cores for seconds on a dataset that size. Left alone, that rewrite falls into
the following point at random, an artefact of running Redis on the ingest's two cores (a Redis host
rewrites on its own cores); each point reports the rewrites that ran during it (``AOF rewrites``).
Each point gives requests/s and reports/s acknowledged (2xx), p50/p99 latency, the refusals, and
the CPU (in cores) of the ingest processes, the broker, Redis and the load generator, and the ingest's CPU
microseconds per answered request (the figure that depends least on what else loads the machine, though it
moves with the host's speed).

Load generators: ``wrk`` (a C load generator: Debian/Ubuntu ``apt-get install wrk``, macOS ``brew
install wrk``) runs the closed-loop points when it is on ``PATH``, since it costs the shared 2-core
machine least; otherwise, and for the open-loop points, :class:`PythonLoad`, a lean asyncio client
(no HTTP library: pre-built requests, Content-Length answers). The Makefile's tests never need wrk.
"""
from __future__ import annotations

import asyncio
import gc
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["Workload", "Point", "PythonLoad", "WrkLoad", "wrk_available", "find_saturation", "BenchConfig",
           "run_bench", "TARGETS", "SERVERS"]

#: Connections of the open-loop half-saturation point at most (``--half-clients`` overrides): about
#: rate x latency are busy at once (7,000/s x 20 ms = 140), and at 512-1024 connections the p99 at half
#: saturation was 30-61 ms against 22-24 ms at 256, all of it burstiness in the server's reads.
HALF_CLIENTS_MAX = 256

#: The issue's targets on the 2-core machine, load generator included.
TARGETS = {"single_requests_s": 10_000, "batch_reports_s": 1_000_000, "half_p99_ms": 50.0}
_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- workloads and points
class Workload:
    """Requests of one kind: a few distinct bodies sent in turn, each request with its own ``Idempotency-Key``
    and either one credential for all (``token``: a relay's) or a fresh device token each (``tokens(n)`` issues
    ``n`` new ones; a device token is never used twice, so no request meets the rate limit)."""

    def __init__(self, name: str, reports_per_request: int, host: str, path: str, content_type: str,
                 bodies: Sequence[bytes], *, token: str | None = None,
                 tokens: Callable[[int], list[str]] | None = None, idempotency: bool = True) -> None:
        if token is not None and tokens is not None:
            raise ValueError("give one token for every request or a source of device tokens, not both")
        self.name, self.reports_per_request = name, reports_per_request
        self.content_type = content_type
        self.bodies = list(bodies)
        self.token, self._issue = token, tokens
        self.idempotency = idempotency
        self.key_prefix = uuid.uuid4().hex[:12]
        self.sent = 0  # requests built so far
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
        if token is not None:
            head += f"Authorization: Bearer {token}\r\n"
        self.head = head
        self._heads = [(head + f"Content-Length: {len(b)}\r\n").encode("latin-1") for b in self.bodies]

    @property
    def device_tokens(self) -> bool:
        return self._issue is not None

    def take_tokens(self, n: int) -> list[str]:
        """``n`` device tokens never used before (none without a token source)."""
        return self._issue(n) if self._issue is not None else []

    def request(self, i: int, token: str | None = None) -> bytes:
        """Request ``i`` (``token``: its device token)."""
        j = i % len(self.bodies)
        extra = f"Authorization: Bearer {token}\r\n" if token is not None else ""
        if self.idempotency:
            extra += f"Idempotency-Key: {self.key_prefix}-{i}\r\n"
        return self._heads[j] + extra.encode("latin-1") + b"\r\n" + self.bodies[j]


@dataclass
class Point:
    """One measurement: ``clients`` keep-alive connections, closed loop or scheduled at ``rate`` requests/s."""

    workload: str
    clients: int
    seconds: float
    ok: int                     # 2xx answers within the measured window
    reports_per_request: int
    p50_ms: float
    p99_ms: float
    failed: dict[str, int] = field(default_factory=dict)  # non-2xx statuses and socket errors, by kind
    rate: float | None = None   # open loop: the scheduled requests/s
    generator: str = "python"
    total_ok: int = 0           # 2xx answers over the whole run (warm-up included): reports acknowledged
    cpu: dict[str, float] = field(default_factory=dict)  # cores used during the run, by process group
    run_seconds: float = 0.0    # the whole run (warm-up included), over which ``cpu`` is measured
    redis_rewrites: int | None = None  # AOF rewrites the local Redis started or finished during the run

    @property
    def requests_s(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def reports_s(self) -> float:
        return self.requests_s * self.reports_per_request

    @property
    def ingest_us(self) -> float:
        """CPU microseconds of the ingest processes per answered request (the whole run's CPU and answers)."""
        n = self.total_ok / self.run_seconds if self.run_seconds else self.requests_s
        return self.cpu.get("ingest", math.nan) / n * 1e6 if n else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "clients": self.clients, "rate": self.rate, "generator": self.generator,
                "seconds": round(self.seconds, 3), "ok": self.ok, "requests_s": round(self.requests_s, 1),
                "reports_s": round(self.reports_s, 1), "p50_ms": round(self.p50_ms, 3),
                "p99_ms": round(self.p99_ms, 3), "failed": self.failed,
                "cpu_cores": {k: round(v, 2) for k, v in self.cpu.items()}, "redis_aof_rewrites": self.redis_rewrites,
                "ingest_cpu_us_per_request": round(self.ingest_us, 1)}


# ---------------------------------------------------------------------------- the Python client
class _Shared:
    """What the connections of one run share: the workload, the clock window, the results."""

    def __init__(self, work: Workload, tokens: list[str], t_start: float, t_end: float, rate: float | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.work, self.tokens = work, tokens
        self.first = work.sent
        self.t_start, self.t_end = t_start, t_end
        self.rate = rate
        self.loop = loop
        self.latencies: list[float] = []
        self.ok = self.total_ok = 0
        self.failed: dict[str, int] = {}
        self.slot = 0

    def request(self) -> bytes:
        w = self.work
        i = w.sent
        w.sent += 1
        if not w.device_tokens:
            return w.request(i)
        k = i - self.first
        if k >= len(self.tokens):  # more requests than foreseen: issue more (slower, still never reused)
            self.tokens += w.take_tokens(max(1000, len(self.tokens)))
        return w.request(i, self.tokens[k])

    def record(self, sent: float, done: float, status: int) -> None:
        ok = 200 <= status < 300
        self.total_ok += ok
        if self.t_start <= done < self.t_end:
            if ok:
                self.ok += 1
                self.latencies.append(done - sent)
            else:
                self.error(str(status))

    def error(self, what: str) -> None:
        self.failed[what] = self.failed.get(what, 0) + 1


class _Connection(asyncio.Protocol):
    """One keep-alive client: a request, its answer, the next request (closed loop); or each request at its
    scheduled time (open loop, latency counted from the schedule)."""

    def __init__(self, shared: _Shared, origin: float) -> None:
        self.s = shared
        self.origin = origin  # open loop: the time of slot 0
        self.buf = b""
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None
        self.closed = shared.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def start(self, origin: float) -> None:
        """Send the first request (every connection is open: the clock starts now)."""
        self.origin = origin
        self._next()

    def _next(self) -> None:
        s = self.s
        now = time.perf_counter()
        if now >= s.t_end:
            if self.transport is not None:
                self.transport.close()
            return
        if s.rate is None:
            self._send(now)
            return
        slot = self.origin + s.slot / s.rate
        s.slot += 1
        if slot > now:
            s.loop.call_later(slot - now, self._send, slot)
        else:
            self._send(slot)

    def _send(self, sent: float) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.sent = sent
        self.transport.write(self.s.request())

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        while True:
            buf = self.buf
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = buf[:head_end].lower()
            i = head.find(b"\r\ncontent-length:")
            if i < 0:
                self.s.error("answer without content-length")
                self.transport.close()  # type: ignore[union-attr]
                return
            j = head.find(b"\r\n", i + 2)
            end = head_end + 4 + int(head[i + 17:j if j >= 0 else len(head)])
            if len(buf) < end:
                return
            self.buf = buf[end:]
            self.s.record(self.sent, time.perf_counter(), int(buf[9:12]))
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if time.perf_counter() < self.s.t_end:
            self.s.error("connection lost")
        if not self.closed.done():
            self.closed.set_result(None)


class PythonLoad:
    """The lean asyncio load generator (uvloop if installed)."""

    name = "python"

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def run(self, work: Workload, clients: int, seconds: float, warmup: float = 1.0, rate: float | None = None,
            expect: int = 10_000) -> Point:
        """``clients`` connections for ``warmup + seconds`` (only the last ``seconds`` are measured), closed loop
        or open loop at ``rate`` requests/s; ``expect``: the requests foreseen (their device tokens are issued
        before the clock starts)."""
        tokens = work.take_tokens(expect)
        gc.collect()
        gc.disable()  # a collection of this process's objects would pause the clock of every request in flight
        try:
            return _run_loop(self._run(work, tokens, clients, seconds, warmup, rate))
        finally:
            gc.enable()

    async def _run(self, work: Workload, tokens: list[str], clients: int, seconds: float, warmup: float,
                   rate: float | None) -> Point:
        loop = asyncio.get_running_loop()
        conns: list[_Connection] = []
        shared = _Shared(work, tokens, math.inf, math.inf, rate, loop)
        for _ in range(clients):
            _, proto = await loop.create_connection(lambda: _Connection(shared, 0.0), self.host, self.port)
            conns.append(proto)
        t0 = time.perf_counter()
        shared.t_start, shared.t_end = t0 + warmup, t0 + warmup + seconds
        for c in conns:
            c.start(t0)
        await asyncio.wait([c.closed for c in conns], timeout=warmup + seconds + 30.0)
        for c in conns:
            if c.transport is not None:
                c.transport.close()
        lat = np.asarray(shared.latencies) * 1e3
        return Point(work.name, clients, seconds, shared.ok, work.reports_per_request,
                     float(np.percentile(lat, 50)) if lat.size else math.nan,
                     float(np.percentile(lat, 99)) if lat.size else math.nan, shared.failed, rate, self.name,
                     shared.total_ok)


def _run_loop(coro: Any) -> Any:
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# ---------------------------------------------------------------------------- wrk
_WRK_LUA = r"""
-- bodies from a file of "<length>\n<bytes>" records, sent in turn; device tokens from a file (one a line;
-- thread i of n takes lines i, i+n, ...); each request its own Idempotency-Key
local bodies, tokens, nb, nt, i = {}, {}, 0, 0, 0
local tid, nthreads, counter = 0, %(threads)d, 0
local head = "%(head)s"
local prefix = "%(prefix)s"
local idem = %(idempotency)s
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end
function init(args)
  tid = tonumber(wrk.thread:get("tid")) or 0
  local f = assert(io.open("%(bodies)s", "rb"))
  local data = f:read("*a")
  f:close()
  local at = 1
  while at <= #data do
    local nl = string.find(data, "\n", at, true)
    local len = tonumber(string.sub(data, at, nl - 1))
    nb = nb + 1
    bodies[nb] = string.sub(data, nl + 1, nl + len)
    at = nl + 1 + len
  end
  local k = 0
  for line in io.lines("%(tokens)s") do
    if k %% nthreads == tid then
      nt = nt + 1
      tokens[nt] = line
    end
    k = k + 1
  end
end
function request()
  i = i + 1
  local b = bodies[(i - 1) %% nb + 1]
  local h = head .. "Content-Length: " .. #b .. "\r\n"
  if nt > 0 then h = h .. "Authorization: Bearer " .. tokens[(i - 1) %% nt + 1] .. "\r\n" end
  if idem then h = h .. "Idempotency-Key: " .. prefix .. tid .. "-" .. i .. "\r\n" end
  return h .. "\r\n" .. b
end
function done(summary, latency, requests)
  io.write(string.format('WRKJSON {"requests": %%d, "duration_us": %%d, "status": %%d, "connect": %%d, ' ..
    '"read": %%d, "write": %%d, "timeout": %%d, "p50_us": %%d, "p99_us": %%d}\n',
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


def wrk_available() -> str | None:
    """The path of ``wrk`` if it is installed."""
    return shutil.which("wrk")


def _lua_string(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")


class WrkLoad:
    """Closed-loop points with ``wrk`` (one thread by default: the rest of the machine serves)."""

    name = "wrk"

    def __init__(self, host: str, port: int, path: str = "/reports", threads: int = 1) -> None:
        self.url = f"http://{host}:{port}{path}"
        self.threads = threads
        self.dir = Path(tempfile.mkdtemp(prefix="ldp-bench-wrk-"))

    def run(self, work: Workload, clients: int, seconds: float, warmup: float = 1.0, rate: float | None = None,
            expect: int = 10_000) -> Point:
        """Like :meth:`PythonLoad.run`, closed loop only; ``wrk`` has no warm-up window, so the whole run of
        ``round(warmup + seconds)`` seconds is measured."""
        if rate is not None:
            raise ValueError("wrk runs closed loop only")
        tag = uuid.uuid4().hex[:8]
        bodies, tokens, script = (self.dir / f"{tag}.{x}" for x in ("bodies", "tokens", "lua"))
        with bodies.open("wb") as f:
            for b in work.bodies:
                f.write(b"%d\n" % len(b) + b)
        issued = work.take_tokens(expect)
        tokens.write_text("".join(t + "\n" for t in issued))
        threads = min(self.threads, clients)
        script.write_text(_WRK_LUA % {"threads": threads, "head": _lua_string(work.head), "bodies": str(bodies),
                                      "tokens": str(tokens), "idempotency": "true" if work.idempotency else "false",
                                      "prefix": f"{work.key_prefix}-{tag}-"})
        cmd = ["wrk", f"-t{threads}", f"-c{clients}", f"-d{max(1, round(warmup + seconds))}s", "--timeout", "10s",
               "-s", str(script), self.url]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup + seconds + 60)
        finally:
            for path in (bodies, tokens, script):
                path.unlink(missing_ok=True)
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("WRKJSON ")), None)
        if line is None:
            raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-500:]} {out.stderr[-500:]}")
        d = json.loads(line[len("WRKJSON "):])
        failed = {("non-2xx" if k == "status" else k): d[k] for k in ("status", "connect", "read", "write", "timeout")
                  if d[k]}
        if work.device_tokens and d["requests"] > len(issued):
            failed["device tokens reused"] = d["requests"] - len(issued)
        work.sent += d["requests"]
        ok = d["requests"] - d["status"]
        return Point(work.name, clients, d["duration_us"] / 1e6, ok, work.reports_per_request, d["p50_us"] / 1e3,
                     d["p99_us"] / 1e3, failed, None, self.name, ok)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------------------- saturation
def find_saturation(measure: Callable[[int], Point], start: int = 4, max_clients: int = 1024,
                    gain: float = 1.05, on_point: Callable[[Point], None] | None = None) -> list[Point]:
    """Points at ``start, 2 start, 4 start, ...`` clients until the rate grew less than ``gain`` twice in a row
    (or past ``max_clients``); the saturation is the point of highest rate."""
    points: list[Point] = []
    best, flat, clients = 0.0, 0, start
    while clients <= max_clients:
        p = measure(clients)
        points.append(p)
        if on_point:
            on_point(p)
        flat = 0 if p.requests_s > best * gain else flat + 1
        best = max(best, p.requests_s)
        if flat >= 2:
            break
        clients *= 2
    return points


# ---------------------------------------------------------------------------- CPU of the processes
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds) of every process (Linux ``/proc``; empty elsewhere)."""
    out: dict[int, tuple[int, float]] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        out[int(d.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    return out


def _cpu_of(roots: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds of each group of process trees (a root and all its descendants)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out = {}
    for name, pids in roots.items():
        total, todo, seen = 0.0, list(pids), set()
        while todo:
            pid = todo.pop()
            if pid in seen or pid not in table:
                continue
            seen.add(pid)
            total += table[pid][1]
            todo += children.get(pid, [])
        out[name] = total
    return out


def _self_cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime  # kids: wrk, once it has been waited for


# ---------------------------------------------------------------------------- the run
@dataclass
class BenchConfig:
    """Options of ``ldp bench ingest`` (see the command's help)."""

    processes: int = 2
    seconds: float = 3.0
    warmup: float = 1.0
    batch: int = 1000
    workloads: tuple[str, ...] = ("json", "binary", "batch")
    generator: str = "auto"          # auto (wrk if installed), wrk, python
    start_clients: int = 4
    max_clients: int = 1024
    worker: bool = False
    broker_storage: str = "memory"
    linger_ms: float | None = None
    idempotency: bool = True
    json_path: Path | None = None
    half_clients: int | None = None  # connections of the open-loop point (default: HALF_CLIENTS_MAX at most)
    redis_aof_rewrite_mb: int | None = None  # Redis's auto-aof-rewrite-min-size (None: Redis's default, 64 MB)
    compact_redis: bool = True  # rewrite the local Redis's AOF before each open-loop point (module doc)
    rate: float | None = None  # open loop at this many requests/s instead of half the saturation (no search)
    server: str = "uvicorn"  # the ingest's HTTP server (SERVERS)


BENCH_ATTRIBUTE = "app_version"
#: How the bench starts the ingest (its settings travel as environment variables, the secret too).
INGEST_COMMAND = (sys.executable, "-m", "ldpstream_cli", "ingest")
#: The HTTP servers the bench can put in front of the ingest's handler (``--server``): ``uvicorn``, as ``ldp ingest``
#: runs it (:mod:`stream_app.ingest.server`). The own HTTP/1.1 server it was measured against is gone
#: (docs/benchmarks.md, "Ingest HTTP server").
SERVERS = ("uvicorn",)


def bench_campaign(cid: str, batch: int) -> dict[str, Any]:
    """The campaign of the bench: one L-OSUE attribute over k = 100 (13-byte reports), one-hour steps."""
    return {"campaign": {"id": cid, "time_step_seconds": 3600.0, "lateness_seconds": 3600.0,
                         "max_batch_reports": max(batch, 10_000)},
            "attributes": [{"name": BENCH_ATTRIBUTE, "k": 100, "protocol": "L-OSUE", "eps_inf": 2.0, "eps_1": 1.0}]}


def _toml(doc: dict[str, Any]) -> str:
    def val(v: Any) -> str:
        return json.dumps(v) if isinstance(v, str) else repr(v)

    lines = ["[campaign]"] + [f"{k} = {val(v)}" for k, v in doc["campaign"].items()]
    for a in doc["attributes"]:
        lines += ["", "[[attributes]]"] + [f"{k} = {val(v)}" for k, v in a.items()]
    return "\n".join(lines) + "\n"


def make_workloads(cfg: BenchConfig, campaign: Any, host: str,
                   issue: Callable[[int, bool], list[str]]) -> list[Workload]:
    """The workloads of ``cfg.workloads`` (reports randomized as real devices do: OS CSPRNG keys)."""
    from wire.campaign import step_at
    from wire.compact import CONTENT_TYPE, encode_compact
    from wire.single_report import encode_single_report

    proto = campaign.attribute(BENCH_ATTRIBUTE).protocol
    t = step_at(campaign)

    def reports(n: int) -> np.ndarray:
        rng = np.random.default_rng()  # only picks the true values; randomization keys come from the OS
        return proto.randomize(rng.integers(0, proto.k, n), None, state=proto.new_state(n))

    singles = reports(256)
    out = []
    for kind in cfg.workloads:
        if kind == "json":
            bodies = [json.dumps(encode_single_report(campaign, BENCH_ATTRIBUTE, t, singles[i:i + 1])).encode()
                      for i in range(len(singles))]
            out.append(Workload("json x1", 1, host, "/reports", "application/json", bodies,
                                tokens=lambda n: issue(n, False), idempotency=cfg.idempotency))
        elif kind == "binary":
            bodies = [encode_compact([(campaign, BENCH_ATTRIBUTE, t, singles[i:i + 1])]) for i in range(len(singles))]
            out.append(Workload("binary x1", 1, host, "/reports", CONTENT_TYPE, bodies,
                                tokens=lambda n: issue(n, False), idempotency=cfg.idempotency))
        elif kind == "batch":
            bodies = [encode_compact([(campaign, BENCH_ATTRIBUTE, t, reports(cfg.batch))]) for _ in range(16)]
            out.append(Workload(f"binary x{cfg.batch}", cfg.batch, host, "/reports", CONTENT_TYPE, bodies,
                                token=issue(1, True)[0], idempotency=cfg.idempotency))
        else:
            raise ValueError(f"unknown workload {kind!r}: json, binary, batch")
    return out


class _Ingest:
    """``ldp ingest`` in child processes on the local stack (and a counting worker if asked)."""

    def __init__(self, cfg: BenchConfig, run_dir: Path, on_status: Callable[[str], None]) -> None:
        self.cfg, self.run_dir, self.say = cfg, run_dir, on_status
        self.proc: subprocess.Popen | None = None
        self.worker: Any = None
        self.stack: Any = None

    def start(self) -> tuple[Any, str, int]:
        """Start everything; returns (the campaign, the host, the port)."""
        from ldpstream_dev.stack import LocalStack
        from stream_app.ingest.auth import DeviceSecret
        from stream_app.ingest.settings import IngestSettings, ingest_setting_specs
        from stream_app.settings import free_port
        from wire.campaign import Campaign

        self.say(f"starting the local stack ({self.cfg.broker_storage} broker storage)")
        rewrite = self.cfg.redis_aof_rewrite_mb
        self.stack = LocalStack(run_dir=self.run_dir / "stack", broker_storage=self.cfg.broker_storage,
                                redis_options=() if rewrite is None else ("--auto-aof-rewrite-min-size", f"{rewrite}mb"))
        info = self.stack.up(stop_on_exit=True)
        doc = bench_campaign(f"bench-ingest-{uuid.uuid4().hex[:8]}", self.cfg.batch)
        path = self.run_dir / "campaign.toml"
        path.write_text(_toml(doc))
        self.campaign = Campaign.load(path)
        self.started = time.time()
        self.secret = DeviceSecret.generate()
        self.port = free_port()
        linger = {} if self.cfg.linger_ms is None else {"linger_seconds": self.cfg.linger_ms / 1e3}
        settings = IngestSettings(campaign_paths=(path,), kafka_bootstrap=info.kafka_bootstrap,
                                  redis_url=info.redis_url, host="127.0.0.1", port=self.port,
                                  processes=self.cfg.processes, **linger,
                                  # every client comes from 127.0.0.1, and a point opens all its connections
                                  # before the first request (1,024 of them can take seconds)
                                  max_connections_per_ip=max(1000, 2 * self.cfg.max_clients), first_byte_timeout=60.0,
                                  # one relay token, and a device token per request, at full speed
                                  relay_requests_per_second=1e9, relay_reports_per_second=1e12)
        own = {spec["env"] for spec in ingest_setting_specs().values()}
        env = {k: v for k, v in os.environ.items() if k not in own and not k.startswith("LDP_DEVICE_SECRET")}
        env.update(self.stack.client_env(), **settings.to_env(), LDP_DEVICE_SECRET=self.secret.hex())
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(_ROOT), env.get("PYTHONPATH", "")) if x)
        cmd = [*INGEST_COMMAND]
        self.say(f"starting the ingest ({self.cfg.server} server, {self.cfg.processes} process(es)) on port {self.port}")
        self.log = open(self.run_dir / "ingest.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=str(self.run_dir))
        self._wait_ready(60.0)
        if self.cfg.worker:
            from ldpstream_dev.workers import WorkerProcess

            self.say("starting a counting worker")
            self.worker = WorkerProcess([path], info.kafka_bootstrap, info.redis_url, run_dir=self.run_dir / "worker")
            self.worker.start()
            self.worker.wait_ready()
        return self.campaign, "127.0.0.1", self.port

    def _wait_ready(self, timeout: float) -> None:
        from ldpstream_dev.processes import wait_http_ok

        wait_http_ok(f"http://127.0.0.1:{self.port}/health", self.proc, timeout, "ldp ingest", self.log_tail, poll=0.2)

    def log_tail(self, lines: int = 30) -> str:
        from ldpstream_dev.processes import log_tail

        return log_tail(self.run_dir / "ingest.log", lines)

    def issue(self, n: int, relay: bool) -> list[str]:
        from stream_app.ingest.auth import DEVICE, RELAY, TokenAuthority

        authority = TokenAuthority(self.secret)
        return [authority.issue(7200.0, kind=RELAY if relay else DEVICE) for _ in range(n)]

    def pids(self) -> dict[str, list[int]]:
        info = self.stack.info
        out = {"ingest": [self.proc.pid] if self.proc else [], "broker": [info.broker_pid] +
               ([info.objects_pid] if info.objects_pid else []) + ([info.gateway_pid] if info.gateway_pid else []),
               "redis": [info.redis_pid]}
        if self.worker is not None and self.worker.proc is not None:
            out["worker"] = [self.worker.proc.pid]
        return out

    def _redis(self) -> Any:
        from stream_app.store import connect_sync

        return connect_sync(self.stack.info.redis_url)

    def aof_rewrites(self) -> int:
        """AOF rewrites of the local Redis so far, the one under way included."""
        with self._redis() as r:
            info = r.info("persistence")
        return int(info.get("aof_rewrites", 0)) + int(info["aof_rewrite_in_progress"]) + \
            int(info["aof_rewrite_scheduled"])

    def compact_redis(self, timeout: float = 600.0) -> float:
        """Rewrite the local Redis's AOF now (``BGREWRITEAOF``) and wait for the rewrite; returns its seconds."""
        start = time.monotonic()
        with self._redis() as r:
            while r.info("persistence")["aof_rewrite_in_progress"]:  # one started by the load: let it end first
                self._wait(start, timeout)
            r.bgrewriteaof()
            while True:
                info = r.info("persistence")
                if not (info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]):
                    return time.monotonic() - start
                self._wait(start, timeout)

    @staticmethod
    def _wait(start: float, timeout: float) -> None:
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"the local Redis's AOF rewrite took more than {timeout:.0f} s")
        time.sleep(0.1)

    def published(self) -> float | None:
        """``ldp_ingest_reports_total`` summed over the ingest's processes (``None`` if unavailable)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        total = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("ldp_ingest_reports_total{")]
        return sum(total) if total else None

    def counted(self, published: float | None, on_status: Callable[[str], None], timeout: float = 120.0) -> int:
        """The reports the worker counted into Redis, once it counted ``published`` (or after ``timeout``)."""
        from ldpstream_dev.workers import read_counts
        from wire.campaign import step_at

        on_status("waiting for the worker to count every published report")
        attr = self.campaign.attribute(BENCH_ATTRIBUTE)
        steps = {step_at(self.campaign, self.started), step_at(self.campaign)}
        deadline = time.monotonic() + timeout
        while True:
            n = sum(read_counts(self.stack.info.redis_url, self.campaign.id, BENCH_ATTRIBUTE, t,
                                attr.protocol.support_size)[1] for t in steps)
            if (published is not None and n >= published) or time.monotonic() > deadline:
                return n
            time.sleep(0.5)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self.proc is not None:
            from ldpstream_dev.processes import stop_child

            stop_child(self.proc)
        if self.stack is not None:
            self.stack.down()


def _measure(gen: Any, work: Workload, clients: int, cfg: BenchConfig, ingest: _Ingest,
             rate: float | None = None, expect: int = 10_000) -> Point:
    """One point, with the CPU of every process group and the local Redis's AOF rewrites over its run."""
    roots = ingest.pids()
    rewrites = ingest.aof_rewrites()
    before, gen_before, wall = _cpu_of(roots), _self_cpu(), time.perf_counter()
    p = gen.run(work, clients, cfg.seconds, cfg.warmup, rate=rate, expect=expect)
    wall = time.perf_counter() - wall
    after, gen_after = _cpu_of(roots), _self_cpu()
    p.redis_rewrites = ingest.aof_rewrites() - rewrites
    p.cpu = {k: (after[k] - before[k]) / wall for k in roots}
    p.cpu["generator"] = (gen_after - gen_before) / wall
    p.run_seconds = wall
    return p


@dataclass
class WorkloadResult:
    workload: str
    curve: list[Point]
    saturation: Point | None  # None with ``--rate`` (no saturation search)
    half: Point               # the open-loop point: half the saturation, or ``--rate``


def run_bench(cfg: BenchConfig, on_status: Callable[[str], None] = print,
              on_point: Callable[[Point], None] | None = None) -> dict[str, Any]:
    """Start the ingest (module doc), measure every workload, stop everything; returns the results."""
    if cfg.generator not in ("auto", "wrk", "python"):
        raise ValueError(f"unknown generator {cfg.generator!r}: auto, wrk or python")
    if cfg.server not in SERVERS:
        raise ValueError(f"unknown server {cfg.server!r}: {' or '.join(SERVERS)}")
    unknown = [w for w in cfg.workloads if w not in ("json", "binary", "batch")]
    counts = (cfg.processes, cfg.batch, cfg.start_clients, 1 if cfg.half_clients is None else cfg.half_clients)
    if cfg.rate is not None and not cfg.rate > 0:
        raise ValueError(f"--rate must be > 0 requests/s, got {cfg.rate}")
    if unknown or not cfg.workloads or min(counts) < 1:
        raise ValueError(f"unknown workload(s) {unknown}: json, binary, batch" if unknown else
                         "give a workload; --processes, --batch, --start-clients and --half-clients must be >= 1")
    if cfg.generator == "wrk" and not wrk_available():
        raise RuntimeError("wrk is not installed (Debian/Ubuntu: apt-get install wrk; macOS: brew install wrk)")
    use_wrk = cfg.generator == "wrk" or (cfg.generator == "auto" and wrk_available() is not None)
    run_dir = Path(tempfile.mkdtemp(prefix="ldp-bench-ingest-"))
    ingest = _Ingest(cfg, run_dir, on_status)
    results: list[WorkloadResult] = []
    acknowledged = 0
    try:
        campaign, host, port = ingest.start()
        works = make_workloads(cfg, campaign, host, ingest.issue)
        python = PythonLoad(host, port)
        closed = WrkLoad(host, port) if use_wrk else python
        try:
            for work in works:
                curve: list[Point] = []
                sat: Point | None = None
                if cfg.rate is None:
                    on_status(f"{work.name}: saturation search ({closed.name}, {cfg.warmup:g} s warm-up + "
                              f"{cfg.seconds:g} s per point)")
                    last = [1000.0]

                    def measure(clients: int) -> Point:
                        expect = int(max(2000, 3 * last[0] * (cfg.warmup + cfg.seconds + 1)))
                        p = _measure(closed, work, clients, cfg, ingest, expect=expect)
                        last[0] = max(last[0], p.requests_s)
                        return p

                    curve = find_saturation(measure, cfg.start_clients, cfg.max_clients, on_point=on_point)
                    sat = max(curve, key=lambda p: p.requests_s)
                rate = sat.requests_s / 2 if sat is not None else cfg.rate
                if cfg.compact_redis:
                    on_status(f"{work.name}: rewriting the local Redis's AOF")
                    on_status(f"{work.name}: AOF rewritten in {ingest.compact_redis():.1f} s")
                on_status(f"{work.name}: open loop at " + (f"half the saturation, {rate:,.0f} requests/s" if sat else
                                                           f"{rate:,.0f} requests/s (--rate)"))
                clients = cfg.half_clients or (max(min(sat.clients, HALF_CLIENTS_MAX), 4) if sat else HALF_CLIENTS_MAX)
                half = _measure(python, work, clients, cfg, ingest, rate=rate,
                                expect=int(rate * (cfg.warmup + cfg.seconds) * 1.2) + 100)
                if on_point:
                    on_point(half)
                acknowledged += sum(p.total_ok * p.reports_per_request for p in [*curve, half])
                results.append(WorkloadResult(work.name, curve, sat, half))
        finally:
            if isinstance(closed, WrkLoad):
                closed.close()
        published = ingest.published()
        counted = ingest.counted(published, on_status) if cfg.worker else None
    finally:
        ingest.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    doc = {"server": cfg.server, "processes": cfg.processes, "generator": "wrk" if use_wrk else "python", "cpus": os.cpu_count(),
           "broker_storage": cfg.broker_storage, "redis_aof_rewrite_mb": cfg.redis_aof_rewrite_mb or 64,
           "redis_compacted_before_half": cfg.compact_redis,
           "acknowledged_reports": acknowledged, "published_reports": published,
           "counted_reports": counted,
           "rate": cfg.rate,
           "workloads": [{"workload": r.workload, "saturation": r.saturation.as_dict() if r.saturation else None,
                          "half": r.half.as_dict(),
                          "curve": [p.as_dict() for p in r.curve]} for r in results]}
    doc["results"] = results
    return doc


def targets_met(doc: dict[str, Any]) -> dict[str, bool]:
    """Which of :data:`TARGETS` the run met (for the workloads it measured; none with ``--rate``)."""
    out = {}
    for r in doc["results"]:
        if r.saturation is None:
            continue
        if r.saturation.reports_per_request == 1:
            out[f"{r.workload}: >= {TARGETS['single_requests_s']:,} requests/s"] = \
                r.saturation.requests_s >= TARGETS["single_requests_s"]
        else:
            out[f"{r.workload}: >= {TARGETS['batch_reports_s']:,} reports/s"] = \
                r.saturation.reports_s >= TARGETS["batch_reports_s"]
        out[f"{r.workload}: p99 < {TARGETS['half_p99_ms']:g} ms at half saturation"] = \
            r.half.p99_ms < TARGETS["half_p99_ms"]
    return out


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def render(doc: dict[str, Any], console: Any) -> None:
    """The results table and the targets (rich console)."""
    from rich.table import Table

    from .terminal import print_table

    t = Table(title=f"ldp bench ingest: {doc['server']} HTTP server, {doc['processes']} ingest process(es), {doc['cpus']} CPUs, load generator "
                    f"{doc['generator']} (closed loop) + python (open loop), {doc['broker_storage']} broker storage, "
                    f"Redis AOF rewrite from {doc['redis_aof_rewrite_mb']} MB"
                    f"{' and before each open-loop point' if doc['redis_compacted_before_half'] else ''}")
    worker = any("worker" in p.cpu for r in doc["results"] for p in (r.saturation, r.half) if p is not None)
    for col in ("workload", "point", "clients", "requests/s", "reports/s", "p50", "p99", "refused/errors",
                "CPU ingest", "µs/request", "broker", "redis", "generator", *(("worker",) if worker else ()),
                "AOF rewrites"):
        t.add_column(col, justify="left" if col in ("workload", "point", "refused/errors") else "right")
    for r in doc["results"]:
        for label, p in (("saturation", r.saturation), ("half (open loop)" if r.saturation else "open loop", r.half)):
            if p is None:
                continue
            t.add_row(r.workload, label, str(p.clients), _fmt_rate(p.requests_s), _fmt_rate(p.reports_s),
                      f"{p.p50_ms:.2f} ms", f"{p.p99_ms:.2f} ms",
                      ", ".join(f"{k}: {v}" for k, v in p.failed.items()) or "-",
                      f"{p.cpu.get('ingest', 0):.2f}", f"{p.ingest_us:.0f}", f"{p.cpu.get('broker', 0):.2f}",
                      f"{p.cpu.get('redis', 0):.2f}",
                      f"{p.cpu.get('generator', 0):.2f}", *((f"{p.cpu.get('worker', 0):.2f}",) if worker else ()),
                      "-" if p.redis_rewrites is None else str(p.redis_rewrites))
    print_table(console, t)
    for r in [r for r in doc["results"] if r.curve]:
        curve = "  ".join(f"{p.clients}: {_fmt_rate(p.requests_s)}" for p in r.curve)
        console.print(f"[dim]{r.workload} saturation search, clients: requests/s  {curve}[/dim]")
    if doc["published_reports"] is not None:
        counted = "" if doc["counted_reports"] is None else f", counted by the worker {doc['counted_reports']:,}"
        console.print(f"reports acknowledged (2xx) {doc['acknowledged_reports']:,}, published by the ingest "
                      f"(ldp_ingest_reports_total) {doc['published_reports']:,.0f}{counted} (published >= "
                      f"acknowledged: a point's last requests may be published after its clients stopped)")
    for name, ok in targets_met(doc).items():
        console.print(f"  {'[green]met[/green]' if ok else '[red]missed[/red]'}  {name}")


def main(cfg: BenchConfig, console: Any) -> int:
    """``ldp bench ingest``: run, print, write the JSON if asked; exit status 0 (1 if a request failed)."""
    def point(p: Point) -> None:
        what = f"open loop {p.rate:,.0f}/s" if p.rate else f"{p.clients} clients"
        errs = f"  refused/errors {p.failed}" if p.failed else ""
        errs += f"  Redis AOF rewrites {p.redis_rewrites}" if p.redis_rewrites else ""
        console.print(f"[dim]  {p.workload:<13} {what:>22}: {_fmt_rate(p.requests_s):>8} requests/s "
                      f"{_fmt_rate(p.reports_s):>10} reports/s  p50 {p.p50_ms:7.2f} ms  p99 {p.p99_ms:7.2f} ms"
                      f"{errs}[/dim]", soft_wrap=True)

    doc = run_bench(cfg, on_status=lambda s: console.print(f"[dim]{s}[/dim]"), on_point=point)
    render(doc, console)
    if cfg.json_path is not None:
        cfg.json_path.write_text(json.dumps({k: v for k, v in doc.items() if k != "results"}, indent=1) + "\n")
    failed = any(p.failed for r in doc["results"] for p in [*r.curve, r.half])
    return 1 if failed else 0

