"""``ldp ingest`` through the real local stack: a real ingest (two processes on one port) in front of a real
worker, tansu and redis-server. Unauthenticated, forged, expired, over-limit and oversized requests are
refused with their reason and metric and nothing of them is counted; a retried request with the same
Idempotency-Key is counted once; valid requests are counted exactly once.
"""
from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ldpstream_dev.processes import stop_child
from ldpstream_dev.workers import WorkerProcess, read_counts, unique_campaign_file, wait_for_counts
from stream_app.ingest.auth import RELAY, TOKEN_PREFIX, DeviceSecret, TokenAuthority
from stream_app.settings import free_port
from wire.campaign import Campaign, step_at
from wire.compact import CONTENT_TYPE as COMPACT, encode_compact

pytestmark = pytest.mark.timeout(180)

DATA = Path(__file__).resolve().parent / "data" / "fleet-health.toml"
ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- helpers
def post(url: str, body: Any = None, *, token: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict, dict[str, str]]:
    """POST to the ingest: (status, JSON answer, lower-case headers)."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    data = raw if raw is not None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/reports", body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        return resp.status, json.loads(payload) if payload else {}, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def post_raw(url: str, headers: dict[str, str], parts: list[bytes]) -> tuple[int, dict]:
    """POST over a bare socket, still reading the answer if the server answers (and closes) before the body is
    sent: how a refusal from ``Content-Length`` or in the middle of a chunked body reaches a client."""
    import socket

    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    head = "POST /reports HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            sock.sendall(head.encode())
            for part in parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1][:_length(data)])


def _length(data: bytes) -> int:
    m = re.search(rb"(?i)content-length: *(\d+)", data)
    return int(m.group(1)) if m else 0


def get(url: str) -> tuple[int, str]:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def report(campaign: Campaign, attr: str, t: int, value: int, seed: int) -> tuple[dict, np.ndarray]:
    """One randomized report (simulation-mode randomness: a fixed seed) and its report row."""
    proto = campaign.attributes[attr].protocol
    rep = proto.randomize(np.array([value]), np.random.default_rng(seed), state=proto.new_state(1))
    return {"campaign": campaign.id, "attribute": attr, "t": t,
            "payload": base64.b64encode(proto.encode(rep)).decode()}, rep


# ---------------------------------------------------------------------------- the stack
@pytest.fixture(scope="module")
def env(local_stack, tmp_path_factory):
    run = tmp_path_factory.mktemp("ingest")
    info = local_stack.info
    camp_path = unique_campaign_file(DATA, run)
    campaign = Campaign.load(camp_path)
    prefix = f"ingest-{uuid.uuid4().hex[:6]}."
    worker = WorkerProcess([camp_path], info.kafka_bootstrap, info.redis_url, run_dir=run, app_id=f"ingest-{prefix}",
                           topic_prefix=prefix, partitions=2, refresh_seconds=0.5)
    worker.start()
    secret = DeviceSecret.generate()
    secret_file = run / "secret"
    secret_file.write_text(secret.hex() + "\n")
    secret_file.chmod(0o600)
    port = free_port()
    envvars = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    envvars.update(local_stack.client_env(), LDP_DEVICE_SECRET_FILE=str(secret_file),
                   PYTHONPATH=os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x))
    log = open(run / "ingest.log", "wb")
    ingest = subprocess.Popen([sys.executable, "-m", "ldpstream_cli", "ingest", "-c", str(camp_path), "--kafka",
                               info.kafka_bootstrap, "--redis", info.redis_url, "--topic-prefix", prefix,
                               "--port", str(port), "--processes", "2", "--loglevel", "info"],
                              stdout=log, stderr=subprocess.STDOUT, env=envvars, cwd=run, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        worker.wait_ready(timeout=60)
        deadline = time.monotonic() + 30
        while True:
            try:
                if get(f"{url}/health")[0] == 200:
                    break
            except OSError:
                pass
            assert ingest.poll() is None, (run / "ingest.log").read_text()
            assert time.monotonic() < deadline, (run / "ingest.log").read_text()
            time.sleep(0.1)
        yield SimpleNamespace(url=url, redis=info.redis_url, campaign=campaign, authority=TokenAuthority(secret),
                              ingest=ingest, log=run / "ingest.log", worker=worker)
    finally:
        stop_child(ingest)
        log.close()
        worker.stop()


def now_step(env) -> int:
    return step_at(env.campaign, time.time())


def refused(env) -> str:
    return get(f"{env.url}/metrics")[1]


def counted(env, attr: str, t: int) -> tuple[np.ndarray, int]:
    """The counts and n of (attr, t) now (earlier tests may have counted reports of the same step)."""
    return read_counts(env.redis, env.campaign.id, attr, t, env.campaign.attributes[attr].protocol.support_size)


def expect(env, before: dict[tuple[str, int], tuple[np.ndarray, int]], added: dict[tuple[str, int], np.ndarray]) -> None:
    """Wait until each (attr, t) holds exactly ``before`` plus the reports ``added`` (an overshoot fails)."""
    want = {}
    for key, rows in added.items():
        proto = env.campaign.attributes[key[0]].protocol
        c0, n0 = before[key]
        want[key] = (c0 + (proto.support(rows) if len(rows) else 0), n0 + len(rows))
    wait_for_counts(env.redis, env.campaign.id, want, timeout=30)
    time.sleep(0.5)  # nothing else arrives
    for key, (counts, n) in want.items():
        got = counted(env, *key)
        assert got[1] == n and np.array_equal(got[0], counts), key


# ---------------------------------------------------------------------------- tests
def test_unauthenticated_forged_expired_and_oversized_requests_are_refused_and_not_counted(env):
    c, t = env.campaign, now_step(env)
    obj, _ = report(c, "opt_in", t, 1, seed=1)
    before, before_counts = refused(env), {("opt_in", t): counted(env, "opt_in", t)}
    other = TokenAuthority(DeviceSecret.generate()).issue(3600)  # signed with another secret
    expired = env.authority.issue(-5)
    valid = env.authority.issue(3600)
    cases = {
        "missing_token": dict(token=None),
        "malformed_token": dict(token="not-a-token"),
        "forged_token": dict(token=other),
        "expired_token": dict(token=expired),
    }
    for reason, kw in cases.items():
        status, doc, headers = post(f"{env.url}/reports", obj, **kw)
        assert status == 401 and doc["error"] == reason, (reason, doc)
        assert headers["www-authenticate"].startswith("Bearer")
    # a tampered token: one bit of the expiry flipped
    raw = bytearray(base64.urlsafe_b64decode(valid[5:] + "=="))
    raw[3] ^= 1
    tampered = "ldp1." + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    assert post(f"{env.url}/reports", obj, token=tampered)[1]["error"] == "forged_token"
    # the body limit (1 MiB by default): 413 from Content-Length, and while reading a chunked body
    auth = {"Authorization": f"Bearer {valid}", "Content-Type": "application/json"}
    status, doc = post_raw(env.url, {**auth, "Content-Length": str((1 << 20) + 1)}, [])  # refused before the body
    assert status == 413 and doc["error"] == "body_too_large", doc
    chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
    status, doc = post_raw(env.url, {**auth, "Transfer-Encoding": "chunked"}, [chunk] * 17 + [b"0\r\n\r\n"])
    assert status == 413 and doc["error"] == "body_too_large", doc
    # too many reports for a device, a step outside the window, an unknown content type
    many = [report(c, "opt_in", t, 0, seed=100 + i)[0] for i in range(257)]
    assert post(f"{env.url}/reports", many, token=valid)[:2][0] == 413
    far = {**obj, "t": t + 1000}
    assert post(f"{env.url}/reports", far, token=valid)[1]["error"] == "step_out_of_window"
    assert post(f"{env.url}/reports", raw=b"x", token=valid, headers={"Content-Type": "text/plain"})[0] == 415
    # refused by the HTTP server before the handler: a smuggling attempt (Content-Length and Transfer-Encoding)
    host, port = env.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        body = json.dumps(obj).encode()
        sock.sendall(b"POST /reports HTTP/1.1\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                     % (valid.encode(), len(body), len(body), body))
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ") and b'"error":"bad_request"' in answer, answer

    after = refused(env)
    for reason, want in {"missing_token": 1, "malformed_token": 1, "forged_token": 2, "expired_token": 1,
                         "body_too_large": 2, "too_many_reports": 1, "step_out_of_window": 1,
                         "unsupported_media_type": 1, "bad_request": 1}.items():
        got = metric(after, "ldp_ingest_refused_requests_total", reason=reason) - \
            metric(before, "ldp_ingest_refused_requests_total", reason=reason)
        assert got == want, (reason, got)
    # the same token then sends its one valid report of the step: that report, and only it, is counted
    obj2, rep2 = report(c, "opt_in", t, 1, seed=2)
    assert post(f"{env.url}/reports", obj2, token=valid)[:2] == (200, {"accepted": 1})
    expect(env, before_counts, {("opt_in", t): rep2})


def test_one_report_per_device_attribute_and_step(env):
    c, t = env.campaign, now_step(env)
    dev1, dev2 = env.authority.issue(3600), env.authority.issue(3600)
    a1, r1 = report(c, "app_version", t, 3, seed=11)
    a1b, _ = report(c, "app_version", t, 7, seed=12)
    a2, r2 = report(c, "app_version", t, 5, seed=13)
    m1, rm1 = report(c, "crash_minute", t, 42, seed=14)
    before = refused(env)
    before_counts = {(a, t): counted(env, a, t) for a in ("app_version", "crash_minute")}
    assert post(f"{env.url}/reports", a1, token=dev1)[:2] == (200, {"accepted": 1})
    status, doc, _ = post(f"{env.url}/reports", a1b, token=dev1)  # a second report of the same step: refused
    assert status == 429 and doc["error"] == "rate_limited" and doc["conflicts"] == [0], doc
    # all-or-nothing: a request whose second report collides publishes neither, and releases the first's slot
    status, doc, _ = post(f"{env.url}/reports", [m1, a1b], token=dev1)
    assert status == 429 and doc["conflicts"] == [1], doc
    assert post(f"{env.url}/reports", m1, token=dev1)[:2] == (200, {"accepted": 1})
    assert post(f"{env.url}/reports", a2, token=dev2)[:2] == (200, {"accepted": 1})  # another device
    # a device sends one report per (campaign, attribute, t), even in one request
    assert post(f"{env.url}/reports", [a2, a2], token=env.authority.issue(3600))[0] == 429
    after = refused(env)
    assert metric(after, "ldp_ingest_refused_requests_total", reason="rate_limited") - \
        metric(before, "ldp_ingest_refused_requests_total", reason="rate_limited") == 3
    expect(env, before_counts, {("app_version", t): np.concatenate([r1, r2]), ("crash_minute", t): rm1})


def test_a_retry_with_the_same_idempotency_key_is_counted_once(env):
    c = env.campaign
    t = now_step(env)
    dev = env.authority.issue(3600)
    obj, rep = report(c, "opt_in", t, 0, seed=21)
    before, before_counts = refused(env), {("opt_in", t): counted(env, "opt_in", t)}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = post(f"{env.url}/reports", obj, token=dev, headers=key)
    assert first[:2] == (200, {"accepted": 1})
    for _ in range(3):  # a lost answer, retried: the first answer again, nothing published
        status, doc, headers = post(f"{env.url}/reports", obj, token=dev, headers=key)
        assert (status, doc) == first[:2] and headers.get("idempotent-replayed") == "true"
    # the same key for another body is refused
    other, _ = report(c, "crash_minute", t, 1, seed=22)
    assert post(f"{env.url}/reports", other, token=dev, headers=key)[1]["error"] == "idempotency_key_reused"
    after = refused(env)
    replayed = "ldp_ingest_replayed_requests_total"
    assert metric(after, replayed) - metric(before, replayed) == 3
    assert metric(after, "ldp_ingest_publish_seconds_count") > 0
    expect(env, before_counts, {("opt_in", t): rep})  # counted once


def test_relay_batches_in_the_compact_body(env):
    c, t = env.campaign, now_step(env)
    relay = env.authority.issue(3600, kind=RELAY)
    proto = c.attributes["crash_minute"].protocol
    rng = np.random.default_rng(31)
    reps = proto.randomize(rng.integers(0, 360, 1000), rng, state=proto.new_state(1000))
    body = encode_compact([(c, "crash_minute", t, reps)])
    before_counts = {("crash_minute", t): counted(env, "crash_minute", t)}
    status, doc, _ = post(f"{env.url}/reports", raw=body, token=relay, headers={"Content-Type": COMPACT})
    assert (status, doc) == (200, {"accepted": 1000})
    # a device token may not send a batch (one report per device and step)
    status, doc, _ = post(f"{env.url}/reports", raw=body, token=env.authority.issue(3600),
                          headers={"Content-Type": COMPACT})
    assert status == 413 and doc["error"] == "too_many_reports"
    expect(env, before_counts, {("crash_minute", t): reps})


def test_the_sdk_sends_its_token_and_retries_with_one_idempotency_key(env, tmp_path):
    from producers.sdk import Device, IngestError, post_report

    c, t = env.campaign, now_step(env)
    token = env.authority.issue(3600)
    before_counts = {("app_version", t): counted(env, "app_version", t)}
    with Device(c, tmp_path / "device", ingest_url=f"{env.url}/reports", token=token) as dev:
        obj = dev.report("app_version", 17, t=t)
        key = uuid.uuid4().hex
        assert post_report(dev.ingest_url, obj, token=token, idempotency_key=key) == {"accepted": 1}
        assert post_report(dev.ingest_url, obj, token=token, idempotency_key=key) == {"accepted": 1}  # a retry
        with pytest.raises(IngestError) as err:  # a second report of the step, without the key: refused
            dev.send("app_version", 17, t=t)
        assert err.value.status == 429
    proto = c.attributes["app_version"].protocol
    expect(env, before_counts, {("app_version", t): proto.decode(base64.b64decode(obj["payload"]))})


def test_a_retry_after_a_crash_is_in_doubt_never_published_twice(env):
    """The ledger alone, on the stack's Redis: an attempt that claimed and never answered (its process died)."""
    import asyncio

    from stream_app.ingest.limits import RequestLedger
    from stream_app.store import CountStore

    c = env.campaign
    slot = [(c.id, 7, uuid.uuid4().bytes, 60)]
    request, body = uuid.uuid4().bytes, RequestLedger.body_hash(b"the body")

    async def run() -> list[str]:
        store = CountStore.from_url(env.redis)
        ledger = RequestLedger(store, idempotency_seconds=60, lease_seconds=0.3)
        try:
            first = await ledger.begin(slot, request, body)  # ... and the process dies before publishing/answering
            states = [first.state, (await ledger.begin(slot, request, body)).state]  # within the lease
            await asyncio.sleep(0.4)
            doubt = await ledger.begin(slot, request, body)
            states.append(doubt.state)
            await ledger.commit(doubt, 200, b'{"accepted":0,"in_doubt":1}', body)
            again = await ledger.begin(slot, request, body)
            states += [again.state, (await ledger.begin(slot, None, body)).state]  # a retry without the key
            assert again.answer == (200, b'{"accepted":0,"in_doubt":1}')
            return states
        finally:
            await store.close()

    assert asyncio.run(run()) == ["new", "in_progress", "in_doubt", "replay", "rate_limited"]


def test_token_tags_and_keyed_hashes_are_hmac_sha256_of_the_derived_keys():
    """The authority's keyed hashes (computed from a keyed state copied per message) are the plain HMAC-SHA256
    of the module doc: tokens, rate-limit slots and request ids stay what other issuers compute."""
    import hashlib
    import hmac

    secret = DeviceSecret.generate()
    authority = TokenAuthority(secret)
    k_token, k_rate, k_idem = (secret.derive(label) for label in ("token", "rate", "idempotency"))
    token = authority.issue(60.0, token_id=bytes(range(16)))
    text = token.removeprefix(TOKEN_PREFIX)
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    assert raw[-32:] == hmac.digest(k_token, raw[:-32], hashlib.sha256)
    device = bytes(range(16, 32))
    for campaign, t, attr in (("c1", 5, "os"), ("c1", 6, "os"), ("c2", 5, "app_version")):
        step_key = hmac.digest(k_rate, f"rate|{campaign}|{t}".encode(), hashlib.sha256)
        assert authority.rate_slot(campaign, t, device, attr) == \
            hmac.digest(step_key, device + attr.encode(), hashlib.sha256)[:16]
    assert authority.request_id(device, "key-1") == hmac.digest(k_idem, device + b"key-1", hashlib.sha256)[:16]
    assert authority.rate_slot("c1", 5, device, "os") != authority.rate_slot("c1", 5, device[::-1], "os")


def test_the_ingest_has_no_open_door_unless_asked():
    """No unauthenticated write path by default (no services): the ingest refuses to start without the
    device-token secret unless in open mode; its handler asks for a token with a secret, and accepts a report
    without one only in open mode. (The worker has no door for reports at all: test_worker.py.)"""
    import asyncio
    from dataclasses import replace

    from prometheus_client import CollectorRegistry

    from stream_app.ingest.handler import ReportHandler
    from stream_app.ingest.metrics import IngestMetrics
    from stream_app.ingest.service import IngestApp
    from stream_app.ingest.settings import IngestSettings
    from stream_app.settings import SettingsError

    campaign = Campaign.load(DATA)
    settings = IngestSettings(campaign_paths=(DATA,), kafka_bootstrap="127.0.0.1:9", redis_url="redis://127.0.0.1:9")
    secret = DeviceSecret.generate()
    with pytest.raises(SettingsError, match="secret"):
        IngestApp(settings, secret=None)
    assert IngestApp(settings, secret=secret).authority is not None
    assert IngestApp(replace(settings, open_mode=True), secret=None).authority is None
    assert IngestApp(replace(settings, open_mode=True), secret=secret).authority is None

    obj, _ = report(campaign, "opt_in", 5, 1, seed=3)
    body = json.dumps(obj).encode()
    submitted: list[int] = []

    async def submit(items: list) -> int:
        submitted.append(len(items))
        return len(items)

    async def answer(authority: TokenAuthority | None) -> tuple[int, dict]:
        handler = ReportHandler({campaign.id: campaign}, submit, IngestMetrics(CollectorRegistry()),
                                authority=authority, ledger=None)

        async def read(limit: int) -> bytes:
            return body

        reply = await handler.handle({"content-type": "application/json"}, read)
        return reply.status, json.loads(reply.body)

    assert asyncio.run(answer(TokenAuthority(secret)))[1]["error"] == "missing_token"
    assert asyncio.run(answer(None)) == (200, {"accepted": 1})
    assert submitted == [1]


def test_a_request_fails_only_if_a_batch_holding_its_reports_failed():
    """The batcher (no services): one linger, two groups, the broker refuses one; 5 ms linger by default."""
    import asyncio

    from stream_app.ingest.batcher import Batcher
    from wire import envelope

    campaign = Campaign.load(DATA)
    sent: list[str] = []

    async def send(key: bytes, blob: bytes) -> None:
        env_ = envelope.parse(blob)
        if env_.attribute == "crash_minute":
            raise ConnectionError("broker down for this partition")
        sent.append(env_.attribute)

    async def run() -> list[Any]:
        batcher = Batcher({campaign.id: campaign}, send)
        assert batcher.linger_seconds == 0.005
        a = [report(campaign, "opt_in", 5, 1, seed=s)[1] for s in (1, 2)]
        b = report(campaign, "crash_minute", 5, 3, seed=3)[1]
        from wire.single_report import SingleReport
        reqs = [[SingleReport(campaign, "opt_in", 5, a[0])], [SingleReport(campaign, "opt_in", 5, a[1]),
                                                              SingleReport(campaign, "crash_minute", 5, b)]]
        out = await asyncio.gather(*(batcher.submit(r) for r in reqs), return_exceptions=True)
        await batcher.stop()
        return out

    first, second = asyncio.run(run())
    assert first == 1 and sent == ["opt_in"]  # one envelope for both requests' opt_in reports
    assert isinstance(second.cause, ConnectionError) and second.published == {(campaign.id, "opt_in", 5)}


def test_a_partly_published_request_keeps_the_slots_of_its_published_reports(local_stack):
    """The handler with a broker that acknowledged one of two batches: 502 naming the published report, whose
    slot stays held; the other report's slot is free again; a retry with the key gets the same answer."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from stream_app.ingest.batcher import PublishError
    from stream_app.ingest.handler import ReportHandler
    from stream_app.ingest.limits import RequestLedger
    from stream_app.ingest.metrics import IngestMetrics
    from stream_app.store import CountStore

    campaign = Campaign.load(unique_campaign_file(DATA, Path(local_stack.run_dir)))
    authority = TokenAuthority(DeviceSecret.generate())
    t = step_at(campaign, time.time())
    a, _ = report(campaign, "opt_in", t, 1, seed=41)
    b, _ = report(campaign, "app_version", t, 2, seed=42)
    calls: list[int] = []

    async def submit(items: list) -> int:
        calls.append(len(items))
        if len(items) == 2:  # the app_version batch was not acknowledged
            raise PublishError(ConnectionError("leader gone"), {(campaign.id, "opt_in", t)})
        return len(items)

    async def run() -> list[tuple[int, dict]]:
        store = CountStore.from_url(local_stack.info.redis_url)
        handler = ReportHandler({campaign.id: campaign}, submit, IngestMetrics(CollectorRegistry()),
                                authority=authority, ledger=RequestLedger(store))
        token = authority.issue(3600)

        async def send(objs: list[dict], key: str | None = None) -> tuple[int, dict]:
            body = json.dumps(objs).encode()

            async def read(limit: int) -> bytes:
                return body

            headers = {"authorization": f"Bearer {token}", **({"idempotency-key": key} if key else {})}
            reply = await handler.handle(headers, read)
            return reply.status, json.loads(reply.body)

        try:
            return [await send([a, b], "k1"), await send([a, b], "k1"), await send([a]), await send([b])]
        finally:
            await store.close()

    first, retry, again_a, only_b = asyncio.run(run())
    assert first[0] == 502 and first[1]["error"] == "partially_published" and first[1]["published"] == [0]
    assert retry == first and calls == [2, 1]  # the retry was answered from the record, nothing resent
    assert again_a[0] == 429 and only_b == (200, {"accepted": 1})


def test_the_handler_answers_an_in_doubt_retry_as_not_accepted(local_stack):
    """The handler whose first attempt claimed its record and slots and died before answering (here: its task was
    cancelled while the broker had not acknowledged): a retry with the key after the lease is answered 200 with
    ``accepted: 0`` and ``in_doubt: n`` (not as counted), and nothing is sent again."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from stream_app.ingest.handler import ReportHandler
    from stream_app.ingest.limits import RequestLedger
    from stream_app.ingest.metrics import IngestMetrics
    from stream_app.store import CountStore

    campaign = Campaign.load(unique_campaign_file(DATA, Path(local_stack.run_dir)))
    authority = TokenAuthority(DeviceSecret.generate())
    obj, _ = report(campaign, "opt_in", step_at(campaign, time.time()), 1, seed=43)
    calls: list[int] = []

    async def run() -> tuple[int, dict]:
        store = CountStore.from_url(local_stack.info.redis_url)
        stuck = asyncio.Event()

        async def submit(items: list) -> int:
            calls.append(len(items))
            await stuck.wait()  # the broker never answers: the process dies here
            return len(items)

        handler = ReportHandler({campaign.id: campaign}, submit, IngestMetrics(CollectorRegistry()),
                                authority=authority, ledger=RequestLedger(store, lease_seconds=0.3))
        headers = {"authorization": f"Bearer {authority.issue(3600)}", "idempotency-key": "k-doubt"}
        body = json.dumps([obj]).encode()

        async def read(limit: int) -> bytes:
            return body

        try:
            first = asyncio.ensure_future(handler.handle(headers, read))
            while not calls:
                await asyncio.sleep(0.01)
            first.cancel()
            await asyncio.sleep(0.4)  # past the first attempt's lease
            reply = await handler.handle(headers, read)
            return reply.status, json.loads(reply.body)
        finally:
            await store.close()

    status, doc = asyncio.run(run())
    assert status == 200 and doc["accepted"] == 0 and doc["in_doubt"] == 1, doc
    assert calls == [1]  # not sent again


def test_sigterm_answers_requests_in_flight_then_exits(env):
    """Last: stops the ingest. Requests sent right before SIGTERM are answered; the process exits 0.

    A request the ingest had not begun to read when SIGTERM came (still in the listen backlog, or accepted
    with its headers not yet parsed) is closed without an answer, as uvicorn's graceful stop does: the device
    sees a dropped connection and sends again. Such a request, like a refused one, must not be counted; any
    other outcome (an error status, a timeout) fails."""
    import concurrent.futures

    c, t = env.campaign, now_step(env)
    objs = [report(c, "app_version", t, i % 100, seed=1000 + i) for i in range(40)]
    tokens = [env.authority.issue(3600) for _ in objs]
    before_counts = {("app_version", t): counted(env, "app_version", t)}

    def send(i: int) -> int:
        try:
            return post(f"{env.url}/reports", objs[i][0], token=tokens[i])[0]
        except ConnectionRefusedError:
            return -1  # not connected: the port was closed already
        except (ConnectionResetError, BrokenPipeError):  # http.client.RemoteDisconnected is a ConnectionResetError
            return -2  # closed without an answer: never begun
        except OSError:
            return -3

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(send, i) for i in range(len(objs))]
        time.sleep(0.05)
        env.ingest.send_signal(signal.SIGTERM)
        results = [f.result() for f in futs]
    assert env.ingest.wait(30) == 0, env.log.read_text()[-3000:]
    assert set(results) <= {200, -1, -2} and results.count(200) >= 1, results
    # every answered request was counted, none of the others
    expect(env, before_counts, {("app_version", t): np.concatenate([objs[i][1] for i, r in enumerate(results)
                                                                     if r == 200])})
