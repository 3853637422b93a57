"""`ldp bench ingest` (ldpstream_cli/bench_ingest.py): the load generator against a small server, and a smoke run of the
whole bench against the real ingest on the local stack."""
from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ldpstream_cli.bench_ingest import Point, PythonLoad, Workload, find_saturation

ROOT = Path(__file__).resolve().parent.parent


class _Server:
    """A keep-alive HTTP/1.1 server in a thread: answers 200 (429 for a request whose body is ``b"no"``) after
    ``delay`` seconds, its answer split in two writes; records the requests it saw."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.loop = asyncio.new_event_loop()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.sock = sock
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.ready = threading.Event()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.server = await asyncio.start_server(self._serve, sock=self.sock)
            self.ready.set()
            await self.server.serve_forever()

        try:
            self.loop.run_until_complete(main())
        except asyncio.CancelledError:
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers["content-length"]))
                self.requests.append((headers, body))
                if self.delay:
                    await asyncio.sleep(self.delay)
                status, text = (429, b'{"error":"rate_limited"}') if body == b"no" else (200, b'{"accepted":1}')
                head = f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(text)}\r\n\r\n"
                answer = head.encode() + text
                writer.write(answer[:7])
                await writer.drain()
                writer.write(answer[7:])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def __enter__(self) -> "_Server":
        self.thread.start()
        self.ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks(self.loop)])
        self.thread.join(5)


def _tokens(n: int, _counter=[0]) -> list[str]:
    out = [f"device-{_counter[0] + i}" for i in range(n)]
    _counter[0] += n
    return out


def test_python_load_closed_loop_counts_answers_and_never_reuses_a_device_token():
    with _Server() as server:
        work = Workload("x", 3, "127.0.0.1", "/reports", "application/x-ldp-reports", [b"a", b"bb", b"no"],
                        tokens=_tokens)
        p = PythonLoad("127.0.0.1", server.port).run(work, clients=4, seconds=0.6, warmup=0.2, expect=50)
    assert p.ok > 20 and p.failed.get("429", 0) > 0
    assert abs(p.failed["429"] - p.ok / 2) <= 0.1 * p.ok + 8  # every third request is refused
    assert p.reports_s == pytest.approx(3 * p.requests_s) and 0 < p.p50_ms <= p.p99_ms
    tokens = [h["authorization"] for h, _ in server.requests]
    keys = [h["idempotency-key"] for h, _ in server.requests]
    assert len(set(tokens)) == len(tokens) == len(set(keys))  # more than `expect`: issued on the fly, never reused
    assert all(t.startswith("Bearer device-") for t in tokens)
    assert {h["content-type"] for h, _ in server.requests} == {"application/x-ldp-reports"}


def test_python_load_open_loop_keeps_its_rate_and_counts_latency_from_the_schedule():
    with _Server(delay=0.02) as server:
        work = Workload("y", 1, "127.0.0.1", "/reports", "application/json", [b"{}"], token="relay")
        p = PythonLoad("127.0.0.1", server.port).run(work, clients=8, seconds=1.0, warmup=0.2, rate=100.0)
        slow = PythonLoad("127.0.0.1", server.port).run(work, clients=1, seconds=1.0, warmup=0.2, rate=200.0)
    assert p.requests_s == pytest.approx(100.0, rel=0.1) and p.rate == 100.0 and not p.failed
    assert 18.0 <= p.p50_ms < 60.0
    # one connection cannot carry 200/s at 20 ms each: requests queue and their latency grows (no omission)
    assert slow.requests_s < 60.0 and slow.p99_ms > 200.0
    assert {h["authorization"] for h, _ in server.requests} == {"Bearer relay"}


def test_saturation_search_stops_when_the_rate_flattens():
    rates = {4: 100.0, 8: 190.0, 16: 195.0, 32: 198.0, 64: 150.0, 128: 500.0}
    seen = []

    def measure(c: int) -> Point:
        seen.append(c)
        return Point("z", c, 1.0, int(rates[c]), 1, 1.0, 2.0)

    points = find_saturation(measure, start=4, max_clients=128)
    assert seen == [4, 8, 16, 32] and max(points, key=lambda p: p.requests_s).clients == 32


def test_bench_ingest_smoke(tmp_path):
    """The whole bench, tiny: local stack, `ldp ingest`, a counting worker, the three workloads, the python
    generator."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ldpstream_cli", "bench", "ingest", "--processes", "1", "--seconds", "0.5", "--warmup", "0.3",
           "--start-clients", "4", "--max-clients", "8", "--batch", "100", "--generator", "python", "--worker",
           "--json", str(out)]
    t0 = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert [w["workload"] for w in doc["workloads"]] == ["json x1", "binary x1", "binary x100"]
    for w in doc["workloads"]:
        for p in (w["saturation"], w["half"], *w["curve"]):
            assert p["ok"] > 0 and not p["failed"] and p["p50_ms"] <= p["p99_ms"]
            assert isinstance(p["redis_aof_rewrites"], int) and p["redis_aof_rewrites"] >= 0
        assert w["half"]["rate"] == pytest.approx(w["saturation"]["requests_s"] / 2, rel=1e-6)
    # every acknowledged report was published (a few more may have been in flight when a point ended), and the
    # worker counted exactly what was published
    assert doc["published_reports"] >= doc["acknowledged_reports"] > 0
    assert doc["counted_reports"] == doc["published_reports"]
    # the local Redis's AOF is rewritten before each open-loop point (the rewrite forks a child that takes a core)
    assert doc["redis_compacted_before_half"] is True
    assert len(re.findall(r"AOF rewritten in [0-9.]+ s", run.stdout)) == len(doc["workloads"])
    assert "ldp bench ingest" in run.stdout and time.monotonic() - t0 < 600


def test_bench_ingest_at_a_given_rate_runs_only_the_open_loop_point(tmp_path):
    """``--rate``: one open-loop point per workload at that rate, no saturation search, no targets."""
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "ldpstream_cli", "bench", "ingest", "--processes", "1", "--seconds", "1", "--warmup", "0.3",
           "-w", "binary", "--rate", "300", "--half-clients", "16", "--generator", "python", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["rate"] == 300 and [w["workload"] for w in doc["workloads"]] == ["binary x1"]
    assert doc["server"] == "uvicorn"  # `ldp ingest`'s server, the only one left (docs/benchmarks.md)
    w = doc["workloads"][0]
    assert w["saturation"] is None and w["curve"] == []
    half = w["half"]
    assert half["rate"] == 300 and half["clients"] == 16 and not half["failed"]
    # an open-loop point keeps its schedule: 300/s over the measured second, within what a 1 s window allows
    assert 240 <= half["requests_s"] <= 360, half
    assert "saturation search" not in run.stdout and "met" not in run.stdout.split("reports acknowledged")[-1]
    bad = subprocess.run([*cmd[:-2], "--rate", "0"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert bad.returncode != 0 and "--rate must be > 0" in bad.stdout + bad.stderr
    own = subprocess.run([*cmd, "--server", "own"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert own.returncode != 0 and "unknown server 'own'" in own.stdout + own.stderr
