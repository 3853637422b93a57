"""An ingest that survives hostile clients (issue 20, point 4), against a real ``ldp ingest`` (two processes on
one port, real sockets) on the local stack (tansu + redis-server):

* twice the service's per-address connection cap of idle sockets from one address: the connections past the
  cap are closed at once, the others after the first-byte timeout, and 20 clients from other addresses
  (127.0.0.2 .. 127.0.0.21) all get 200 meanwhile;
* a 1 MiB body of 10,000 reports with a device token is refused (413) from its headers, before a byte of it is
  read, with at most 2 ms of ingest CPU
  (the ingest processes' scheduler time, median over 20 requests, minus the median of idle intervals);
* a token revoked with ``ldp tokens revoke`` is refused by every ingest process within 1 s;
* a token of campaign A is refused for campaign B (403); a device token's requests are rate-limited, refused
  ones included (429 ``token_rate_limited``); a relay over its reports per second gets 429.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from ldpstream_dev.workers import IngestProcess, unique_campaign_file
from stream_app.ingest.auth import RELAY, DeviceSecret, TokenAuthority
from stream_app.ingest.server import ConnectionGuard
from stream_app.ingest.settings import IngestSettings
from test_ingest_service import get, metric, report
from wire.campaign import Campaign, step_at
from wire.compact import CONTENT_TYPE as COMPACT, encode_compact

pytestmark = pytest.mark.timeout(180)

DATA = Path(__file__).resolve().parent / "data" / "fleet-health.toml"
PER_IP, PROCESSES, FIRST_BYTE = 10, 2, 10.0  # the default first-byte timeout: it also ends idle keep-alives,
# and a test that holds one while a CLI command starts (seconds on a busy machine) must keep it
RELAY_RATE = 1000


@pytest.fixture(scope="module")
def ingest(local_stack, tmp_path_factory):
    run = tmp_path_factory.mktemp("hostile")
    info = local_stack.info
    path_a, path_b = (unique_campaign_file(DATA, run, suffix=f"{x}{uuid.uuid4().hex[:6]}") for x in "ab")
    secret = DeviceSecret.generate()
    secret_file = run / "secret"
    secret_file.write_text(secret.hex() + "\n")
    secret_file.chmod(0o600)
    ing = IngestProcess([path_a, path_b], info.kafka_bootstrap, info.redis_url, run_dir=run, secret_file=secret_file,
                        host="0.0.0.0", topic_prefix=f"hostile-{uuid.uuid4().hex[:6]}.", processes=PROCESSES,
                        max_connections_per_ip=PER_IP, first_byte_timeout=FIRST_BYTE, max_relay_reports=RELAY_RATE,
                        relay_reports_per_second=RELAY_RATE).start()
    try:
        ing.wait_ready()
        deadline = time.monotonic() + 60
        while len(psutil.Process(ing.proc.pid).children()) < PROCESSES:  # every server process is up
            assert ing.proc.poll() is None and time.monotonic() < deadline, ing.log_tail()
            time.sleep(0.1)
        yield SimpleNamespace(url=ing.url, port=ing.settings.port, proc=ing.proc, a=Campaign.load(path_a),
                              b=Campaign.load(path_b), authority=TokenAuthority(secret), env=ing.environment(),
                              redis=info.redis_url, log=ing.log_path)
    finally:
        ing.stop()


def workers(ing) -> list[psutil.Process]:
    return psutil.Process(ing.proc.pid).children()


def request(conn: http.client.HTTPConnection, body: bytes, token: str | None,
            ctype: str = "application/json") -> tuple[int, dict]:
    headers = {"Content-Type": ctype, **({"Authorization": f"Bearer {token}"} if token else {})}
    conn.request("POST", "/reports", body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data else {}


class BoundConnection(http.client.HTTPConnection):
    """An HTTP connection from a chosen source address (loopback accepts any 127.x.y.z)."""

    def __init__(self, port: int, source: str) -> None:
        super().__init__("127.0.0.1", port, timeout=30, source_address=(source, 0))


def refusals(ing) -> str:
    return get(f"{ing.url}/metrics")[1]


def refused_delta(before: str, after: str, reason: str) -> float:
    return metric(after, "ldp_ingest_refused_requests_total", reason=reason) - \
        metric(before, "ldp_ingest_refused_requests_total", reason=reason)


# ---------------------------------------------------------------------------- defaults
def test_the_first_byte_timeout_is_10_s_by_default():
    s = IngestSettings.from_env({}, campaign_paths=(DATA,), kafka_bootstrap="k:1", redis_url="redis://r")
    assert s.first_byte_timeout == 10.0 == ConnectionGuard().first_byte_seconds
    assert s.max_connections_per_ip == 1_000


# ---------------------------------------------------------------------------- connections
def test_idle_sockets_from_one_address_do_not_shut_out_other_clients(ingest):
    before = refusals(ingest)
    idle = [socket.create_connection(("127.0.0.1", ingest.port), timeout=10) for _ in range(2 * PER_IP * PROCESSES)]
    try:
        t = step_at(ingest.a, time.time())
        for i in range(20):
            conn = BoundConnection(ingest.port, f"127.0.0.{2 + i}")
            obj, _ = report(ingest.a, "opt_in", t, i % 2, seed=i)
            try:
                status, doc = request(conn, json.dumps(obj).encode(),
                                      ingest.authority.issue(600, campaign=ingest.a.id))
            finally:
                conn.close()
            assert (status, doc) == (200, {"accepted": 1}), (i, doc)
        # past the cap: closed at once; the others after the first-byte timeout
        deadline = time.monotonic() + FIRST_BYTE + 3
        for sock in idle:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                assert sock.recv(1) == b""
            except ConnectionResetError:
                pass
        assert time.monotonic() <= deadline
    finally:
        for sock in idle:
            sock.close()
    after = refusals(ingest)
    assert refused_delta(before, after, "too_many_connections_per_ip") >= PER_IP * PROCESSES
    assert refused_delta(before, after, "first_byte_timeout") >= 1


# ---------------------------------------------------------------------------- CPU of a refusal
def _cpu_ns(procs: list[psutil.Process]) -> int:
    """Scheduler time (ns) of every thread of ``procs`` (``/proc/<pid>/task/<tid>/schedstat``: ns resolution)."""
    total = 0
    for p in procs:
        for task in Path(f"/proc/{p.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(), reason="needs /proc/<pid>/schedstat")
def test_a_1_mib_body_of_10000_reports_is_refused_before_decoding(ingest):
    t = step_at(ingest.a, time.time())
    obj, _ = report(ingest.a, "opt_in", t, 1, seed=5)
    body = json.dumps([obj] * 10_000, separators=(",", ":")).encode()
    assert len(body) <= 1 << 20, len(body)
    procs = workers(ingest)
    conns = [http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30) for _ in range(4)]
    costs, idle, walls = [], [], []
    try:
        for i in range(20):
            token = ingest.authority.issue(600, campaign=ingest.a.id)
            conn = conns[i % len(conns)]
            w0, c0 = time.perf_counter(), _cpu_ns(procs)
            status, doc = request(conn, body, token)
            c1, w1 = _cpu_ns(procs), time.perf_counter()
            assert status == 413 and doc["error"] == "body_too_large", doc
            costs.append(c1 - c0)
            walls.append(w1 - w0)
            c2 = _cpu_ns(procs)
            time.sleep(w1 - w0)  # an idle interval as long: the processes' background work (timers, refreshes)
            idle.append(_cpu_ns(procs) - c2)
    finally:
        for conn in conns:
            conn.close()
    cost_ms = (statistics.median(costs) - statistics.median(idle)) / 1e6
    # issue 20: at most 2 ms. A device token's Content-Length is refused before the body is read (reading,
    # counting and decoding the 1 MiB cost 1.6-2.2 ms, decoding alone ~100 ms)
    print(f"ingest CPU per 1 MiB refusal: {cost_ms:.3f} ms (median of 20, idle baseline subtracted)")
    assert cost_ms <= 2.0, (cost_ms, sorted(costs), sorted(idle), sorted(walls))


# ---------------------------------------------------------------------------- revocation
def _server_pid(conn: http.client.HTTPConnection, procs: list[psutil.Process]) -> int | None:
    """The ingest process holding the server side of ``conn``."""
    local = conn.sock.getsockname()
    for p in procs:
        for c in p.net_connections(kind="tcp"):
            if c.raddr and (c.raddr.ip, c.raddr.port) == local:
                return p.pid
    return None


def test_a_revoked_token_is_refused_by_every_process_within_1_s(ingest):
    token = ingest.authority.issue(600, campaign=ingest.a.id)
    procs = workers(ingest)
    conns: dict[int, http.client.HTTPConnection] = {}
    for _ in range(40):  # a keep-alive connection to each process (probed with fresh tokens: the per-token rate)
        conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30)
        probe = ingest.authority.issue(600, campaign=ingest.a.id)
        assert request(conn, b"x", probe, "text/plain")[0] == 415  # accepted: refused for its content type
        pid = _server_pid(conn, procs)
        if pid is not None and pid not in conns:
            conns[pid] = conn
        else:
            conn.close()  # at once: open ones count against the per-address cap of every later test
        if len(conns) == PROCESSES:
            break
    assert len(conns) == PROCESSES, "no connection reached every process"
    for conn in conns.values():  # the token works on each before it is revoked
        assert request(conn, b"x", token, "text/plain")[0] == 415
    before = refusals(ingest)
    try:
        subprocess.run([sys.executable, "-m", "ldpstream_cli", "tokens", "revoke", token, "--redis", ingest.redis],
                       env=ingest.env, check=True, capture_output=True, timeout=60)
        t0 = time.monotonic()
        refused_at = {}
        while len(refused_at) < PROCESSES and time.monotonic() - t0 < 3.0:
            for pid, conn in conns.items():
                if pid not in refused_at:
                    status, doc = request(conn, b"x", token, "text/plain")
                    if status == 401:
                        assert doc["error"] == "revoked_token", doc
                        refused_at[pid] = time.monotonic() - t0
            time.sleep(0.05)
    finally:
        for conn in conns.values():
            conn.close()
    assert set(refused_at) == set(conns) and max(refused_at.values()) <= 1.0, refused_at
    assert refused_delta(before, refusals(ingest), "revoked_token") >= PROCESSES
    other = ingest.authority.issue(600, campaign=ingest.a.id)  # another token of the same campaign still works
    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30)
    try:
        assert request(conn, b"x", other, "text/plain")[0] == 415
    finally:
        conn.close()


# ---------------------------------------------------------------------------- scopes and rates
def test_a_token_of_campaign_a_is_refused_for_campaign_b(ingest):
    token = ingest.authority.issue(600, campaign=ingest.a.id)
    now = time.time()
    obj_b, _ = report(ingest.b, "opt_in", step_at(ingest.b, now), 1, seed=7)
    obj_a, _ = report(ingest.a, "opt_in", step_at(ingest.a, now), 1, seed=8)
    before = refusals(ingest)
    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30)
    try:
        status, doc = request(conn, json.dumps(obj_b).encode(), token)
        assert status == 403 and doc["error"] == "wrong_campaign", doc
        assert request(conn, json.dumps(obj_a).encode(), token) == (200, {"accepted": 1})
        # a token for every campaign (issued without one) reports for both
        assert request(conn, json.dumps(obj_b).encode(), ingest.authority.issue(600)) == (200, {"accepted": 1})
    finally:
        conn.close()
    assert refused_delta(before, refusals(ingest), "wrong_campaign") == 1


def test_refused_requests_count_against_a_tokens_request_rate(ingest):
    token = ingest.authority.issue(600, campaign=ingest.a.id)
    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30)
    try:
        answers = [request(conn, b"x", token, "text/plain") for _ in range(30)]
    finally:
        conn.close()
    statuses = [s for s, _ in answers]
    assert statuses[0] == 415 and statuses[-1] == 429, statuses
    assert {d["error"] for s, d in answers if s == 429} == {"token_rate_limited"}
    assert statuses.count(415) <= 12  # a burst of 10 (5 a second), nothing more


def test_a_relay_over_its_reports_per_second_gets_429(ingest):
    relay = ingest.authority.issue(600, kind=RELAY, campaign=ingest.a.id)
    c = ingest.a
    proto = c.attributes["crash_minute"].protocol
    import numpy as np

    rng = np.random.default_rng(3)
    reps = proto.randomize(rng.integers(0, 360, RELAY_RATE), rng, state=proto.new_state(RELAY_RATE))
    body = encode_compact([(c, "crash_minute", step_at(c, time.time()), reps)])
    before = refusals(ingest)
    conn = http.client.HTTPConnection("127.0.0.1", ingest.port, timeout=30)  # one process: its own buckets
    try:
        assert request(conn, body, relay, COMPACT) == (200, {"accepted": RELAY_RATE})
        status, doc = request(conn, body, relay, COMPACT)
        assert status == 429 and doc["error"] == "relay_rate_limited", doc
    finally:
        conn.close()
    assert refused_delta(before, refusals(ingest), "relay_rate_limited") == 1


def test_tokens_issue_needs_a_campaign_or_an_explicit_any_campaign(tmp_path):
    """`ldp tokens issue` scopes device tokens to a campaign: without --campaign it refuses (exit 2, one line),
    --any-campaign is the explicit opt-out (a relay or load generator serving several campaigns)."""
    secret = tmp_path / "secret"
    env = {**os.environ, "LDP_DEVICE_SECRET_FILE": str(secret)}
    made = subprocess.run([sys.executable, "-m", "ldpstream_cli", "tokens", "new-secret"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    secret.write_text(made.stdout)
    issue = [sys.executable, "-m", "ldpstream_cli", "tokens", "issue"]
    bare = subprocess.run(issue, env=env, capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "--campaign ID" in bare.stderr and not bare.stdout, bare
    scoped = subprocess.run([*issue, "--campaign", "fleet-health"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert scoped.returncode == 0, scoped
    authority = TokenAuthority(DeviceSecret.from_hex(made.stdout.strip()))
    claims = authority.verify(scoped.stdout.strip())
    assert claims.allows("fleet-health") and not claims.allows("other")
    wild = subprocess.run([*issue, "--any-campaign"], env=env, capture_output=True, text=True, timeout=60)
    assert wild.returncode == 0 and authority.verify(wild.stdout.strip()).allows("other"), wild
