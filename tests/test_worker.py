"""The stream app against the real local stack (tansu + redis-server): a worker in a subprocess.

Every test module run uses its own campaign id, consumer group and topic prefix, so it shares
the session's broker and Redis with other tests without sharing state.
"""
from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest

from ldpstream_dev.contract import check_answer
from ldpstream_dev.workers import (IngestProcess, WorkerProcess, produce_messages, read_counts, unique_campaign_file,
                                   wait_for_counts)
from wire import envelope
from wire.campaign import Campaign
from wire.topics import Topics, message_key

pytestmark = pytest.mark.timeout(240)

DEMO = Path(__file__).resolve().parent / "data" / "fleet-health.toml"
DEMO_CAMPAIGN = Path(__file__).resolve().parents[1] / "deploy" / "campaigns" / "demo.toml"  # all six attributes


# ---------------------------------------------------------------------------- helpers
produce = produce_messages


async def _consume(bootstrap: str, topic: str, done: Callable[[list[dict]], bool], timeout: float) -> list[dict]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    docs: list[dict] = []
    try:
        deadline = time.monotonic() + timeout
        parts = None
        while not parts and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await consumer.topics()
                await asyncio.sleep(0.1)
        assert parts, f"topic {topic} does not exist"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        while time.monotonic() < deadline:
            batch = await consumer.getmany(*tps, timeout_ms=200)
            for recs in batch.values():
                docs.extend(json.loads(r.value) for r in recs)
            if done(docs):
                return docs
        raise TimeoutError(f"{topic}: condition not met after {timeout} s; got {len(docs)} records")
    finally:
        await consumer.stop()


def consume(bootstrap: str, topic: str, done: Callable[[list[dict]], bool], timeout: float = 30.0) -> list[dict]:
    return asyncio.run(_consume(bootstrap, topic, done, timeout))


def partition_count(bootstrap: str, topic: str) -> int:
    async def read() -> int:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
        await consumer.start()
        try:
            await consumer.topics()
            return len(consumer.partitions_for_topic(topic) or ())
        finally:
            await consumer.stop()
    return asyncio.run(read())


def http(method: str, url: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    """One request; a JSON answer to a GET is checked against its route's schema (``ldpstream_dev.contract``)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, payload, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    if "json" not in ctype:
        return status, payload.decode()
    doc = json.loads(payload)
    if method == "GET":
        check_answer(url, status, doc)
    return status, doc


def metric(text: str, name: str, **labels: str) -> float:
    """Value of one sample of the Prometheus text ``text`` (0 if absent)."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, value = line.rsplit(" ", 1)
        found = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if head.split("{")[0] == name and all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return 0.0


def b64_report(proto: Any, report: np.ndarray) -> str:
    return base64.b64encode(proto.encode(report)).decode()


# ---------------------------------------------------------------------------- the worker
@pytest.fixture(scope="module")
def env(local_stack, tmp_path_factory):
    info = local_stack.info
    tag = uuid.uuid4().hex[:8]
    run_dir = tmp_path_factory.mktemp("worker")
    cfile = unique_campaign_file(DEMO, run_dir, tag)
    demo = unique_campaign_file(DEMO_CAMPAIGN, run_dir, f"demo-{tag}")  # the deployed campaign: its /metrics
    worker = WorkerProcess([cfile, demo], info.kafka_bootstrap, info.redis_url, app_id=f"ldp-test-{tag}",
                           topic_prefix=f"{tag}.", session_timeout=6.0, refresh_seconds=0.5, run_dir=run_dir)
    worker.start()
    t0 = time.monotonic()
    worker.wait_ready(timeout=90, partitions=4)
    print(f"worker ready in {time.monotonic() - t0:.1f} s at {worker.url}")
    topics = Topics.with_prefix(f"{tag}.")
    yield SimpleNamespace(worker=worker, campaign=Campaign.load(cfile), cfile=cfile, tag=tag, demo=Campaign.load(demo),
                          kafka=info.kafka_bootstrap, redis=info.redis_url, run_dir=run_dir,
                          reports=topics.reports, rejected=topics.rejected, estimates=topics.estimates)
    worker.stop()


def _fleet(campaign: Campaign, n_devices: int, steps: int, rng: np.random.Generator):
    """Simulated devices with memo state; yields per (attr, t): (true values, reports)."""
    out = {}
    for a in campaign.attributes.values():
        proto = a.protocol
        state = proto.new_state(n_devices)
        weights = 1.0 / np.arange(1, a.k + 1) ** 1.1  # Zipf-like
        values = rng.choice(a.k, size=n_devices, p=weights / weights.sum())
        for t in range(steps):
            if t:
                move = rng.random(n_devices) < 0.2  # the Syn model: 20 % of devices change value
                values = np.where(move, rng.choice(a.k, size=n_devices, p=weights / weights.sum()), values)
            out[(a.name, t)] = (values.copy(), proto.randomize(values, rng, state=state))
    return out


def test_counts_exact_and_final_estimates(env):
    c = env.campaign
    n_dev, steps = 30_000, 2
    fleet = _fleet(c, n_dev, steps, np.random.default_rng(20261122))
    msgs, expected = [], {}
    for (attr, t), (_values, reports) in fleet.items():
        key = message_key(t, attr)
        for part in np.array_split(np.arange(n_dev), 3):  # three batches per step
            msgs.append((key, envelope.pack_reports(c, attr, t, reports[part], batch_id=f"w:{t}:{attr}:{part[0]}")))
        expected[(attr, t)] = (c.attributes[attr].protocol.support(reports), n_dev)
    for (attr, t) in fleet:
        msgs.append((message_key(t, attr), envelope.pack_watermark(c, attr, t)))
    t0 = time.monotonic()
    produce(env.kafka, env.reports, msgs)
    wait_for_counts(env.redis, c.id, expected, timeout=60)
    print(f"{len(msgs)} messages counted exactly in {time.monotonic() - t0:.2f} s")

    def all_final(docs: list[dict]) -> bool:
        return {(d["attribute"], d["t"]) for d in docs if d["campaign"] == c.id and d["final"]} >= set(fleet)

    docs = consume(env.kafka, env.estimates, all_final, timeout=30)
    finals = {(d["attribute"], d["t"]): d for d in docs if d["campaign"] == c.id and d["final"]}
    assert len([d for d in docs if d["campaign"] == c.id and d["final"]]) == len(fleet)  # each final once
    for (attr, t), (values, _reports) in fleet.items():
        d, proto = finals[(attr, t)], c.attributes[attr].protocol
        true = np.bincount(values, minlength=proto.k) / n_dev
        est = np.asarray(d["frequencies"])
        sd = np.sqrt(proto.variance_exact(true, n_dev))
        assert d["trigger"] == "watermark" and d["n"] == n_dev and d["revision"] == 0
        assert np.all(np.abs(est - true) <= 5 * sd), f"{attr} t={t}: max z {np.max(np.abs(est - true) / sd):.2f}"
        np.testing.assert_allclose(est, proto.estimate(expected[(attr, t)][0], n_dev))
        ns = np.asarray(d["frequencies_norm_sub"])
        assert abs(ns.sum() - 1) < 1e-9 and ns.min() >= 0
        assert d["variance"] == pytest.approx(proto.variance(n_dev))
        assert d["ci95_halfwidth"] == pytest.approx(1.96 * math.sqrt(proto.variance(n_dev)))
        assert d["eps_1"] == pytest.approx(proto.eps_first) and d["eps_inf"] == pytest.approx(proto.eps_inf)
        assert d["eps_longitudinal_worst"] == pytest.approx(float(proto.longitudinal_bound(t + 1)))
        assert d["steps_so_far"] == t + 1
        assert d["latency_seconds"] is not None and d["latency_seconds"] < 2.0
    opt = finals[("opt_in", 1)]
    assert opt["labels"] == ["no", "yes"] and opt["eps_longitudinal_worst"] == pytest.approx(4.0, rel=1e-6)

    # the HTTP API: latest and history
    status, latest = http("GET", f"{env.worker.url}/estimates/{c.id}/app_version")
    assert status == 200 and latest["t"] == 1 and latest["final"] and latest["n"] == n_dev
    status, hist = http("GET", f"{env.worker.url}/estimates/{c.id}/app_version/history")
    assert status == 200 and [e["t"] for e in hist["estimates"]] == [0, 1]
    assert hist["estimates"][0]["frequencies"] == finals[("app_version", 0)]["frequencies"]

    # the metrics
    status, text = http("GET", f"{env.worker.url}/metrics")
    assert status == 200
    for a in c.attributes:
        assert metric(text, "ldp_reports_total", campaign=c.id, attribute=a) == steps * n_dev
        assert metric(text, "ldp_step_reports", campaign=c.id, attribute=a) == n_dev
        assert metric(text, "ldp_watermarks_total", campaign=c.id, attribute=a) == steps
        proto = c.attributes[a].protocol
        assert metric(text, "ldp_eps_inf", campaign=c.id, attribute=a) == pytest.approx(proto.eps_inf)
        assert metric(text, "ldp_eps_longitudinal_worst", campaign=c.id, attribute=a) == pytest.approx(
            float(proto.longitudinal_bound(steps)))  # the published (seed-aware) figure, as in the documents
    # per-value frequencies are off by default (k series per attribute): the HTTP API has them
    assert "ldp_estimated_frequency_ratio{" not in text
    assert metric(text, "ldp_estimate_latency_seconds_count", trigger="watermark") >= len(fleet)
    assert "ldp_consumer_lag_messages{" in text and "ldp_reports_per_second" not in text  # rate(ldp_reports_total)


def test_metrics_of_the_demo_campaign_stay_bounded(env):
    """Issue 22: a worker's /metrics with the deployed demo campaign (six attributes, 754 domain values) once every
    attribute has a final: under 300 series by default, ldp_build_info and the process metrics, no _created series
    (tests/test_observability.py runs promtool on it)."""
    from producers.fleet import FleetConfig, publish

    demo = env.demo
    asyncio.run(publish(FleetConfig(demo, 400, 1, dataset="syn", base="zipf", batch_size=200, seed=22), env.kafka,
                        topic=env.reports))
    for attr in demo.attributes:
        deadline = time.monotonic() + 60
        while True:
            status, latest = http("GET", f"{env.worker.url}/estimates/{demo.id}/{attr}")
            if status == 200 and latest.get("final") and latest["n"] > 0:
                break
            assert time.monotonic() < deadline, f"no final of {demo.id}/{attr}: {latest}"
            time.sleep(0.2)
    time.sleep(0.5)  # the metrics of the last final are exported with its publication
    status, text = http("GET", f"{env.worker.url}/metrics")
    assert status == 200
    series = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    other = [ln for ln in series if f'campaign="{env.campaign.id}"' in ln]  # the other campaign of this worker
    own = len(series) - len(other)
    print(f"/metrics of a worker with the demo campaign ({len(demo.attributes)} attributes, "
          f"k = {sum(a.k for a in demo.attributes.values())} values in all), every attribute final: {own} series "
          f"({len(series)} with the {len(other)} of this worker's second campaign {env.campaign.id})")
    assert own < 300, own
    assert metric(text, "ldp_step_reports", campaign=demo.id, attribute="device_model") > 0  # the estimates are in
    assert not [ln for ln in text.splitlines() if "_created" in ln]
    assert "ldp_estimated_frequency_ratio{" not in text
    assert re.search(r'^ldp_build_info\{.*version="[^"]+".*\} 1\.0$', text, re.M), text[:2000]
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds"):
        assert re.search(rf"^{name} \S+$", text, re.M), name


def test_rejected_batches_leave_counts_unchanged(env):
    c = env.campaign
    attr, t = "opt_in", 50
    proto = c.attributes[attr].protocol
    rng = np.random.default_rng(7)
    good = proto.randomize(rng.integers(0, 2, 1000), rng, state=proto.new_state(1000))
    valid = envelope.pack_reports(c, attr, t, good, batch_id=f"w:{t}:{attr}:valid")
    payload = proto.encode(good)
    bad_domain = np.full(10, 7, dtype=proto.report_dtype)  # L-GRR k=2: 7 is outside the output space
    bad = {
        "wrong_fingerprint": envelope.pack(c.id, attr, proto.name, "00" * 8, t, len(good), payload, batch_id="w:bad"),
        "unknown_campaign": envelope.pack("no-such-campaign", attr, proto.name, proto.fingerprint, t, len(good),
                                          payload, batch_id="w:bad"),
        "garbage": b"\x00\x01garbage bytes, not an envelope",
        "truncated": valid[:-100],
        "oversized": envelope.pack(c.id, attr, proto.name, proto.fingerprint, t, c.max_batch_reports + 1, payload, batch_id="w:bad"),
        "out_of_domain": envelope.pack(c.id, attr, proto.name, proto.fingerprint, t, 10, proto.encode(bad_domain), batch_id="w:bad"),
    }
    expected_reason = {}
    for name, blob in bad.items():  # the offline envelope code decides the reason
        try:
            e = envelope.parse(blob)
            envelope.decode_reports(e, envelope.validate(e, {c.id: c}))
        except envelope.EnvelopeError as exc:
            expected_reason[name] = exc.reason
        else:  # pragma: no cover - the test data is wrong
            raise AssertionError(f"{name} is a valid batch")
    assert expected_reason["wrong_fingerprint"] == "wrong_fingerprint"
    assert expected_reason["unknown_campaign"] == "unknown_campaign"
    assert expected_reason["garbage"] == "malformed"
    assert expected_reason["truncated"] == "truncated"
    assert expected_reason["oversized"] == "oversized"
    assert expected_reason["out_of_domain"] == "bad_payload"

    _, before = http("GET", f"{env.worker.url}/metrics")
    msgs = [(f"{t}:{attr}:{name}".encode(), blob) for name, blob in bad.items()]
    msgs.append((message_key(t, attr), valid))  # the worker keeps running: a valid batch after them
    produce(env.kafka, env.reports, msgs)
    wait_for_counts(env.redis, c.id, {(attr, t): (proto.support(good), len(good))}, timeout=30)

    keys = {f"{t}:{attr}:{name}": name for name in bad}
    docs = consume(env.kafka, env.rejected, lambda ds: keys.keys() <= {d["key"] for d in ds}, timeout=30)
    got = {keys[d["key"]]: d for d in docs if d["key"] in keys}
    for name, d in got.items():
        assert d["reason"] == expected_reason[name], name
        assert d["source"] == "kafka" and d["offset"] is not None and d["size"] == len(bad[name])
    assert got["wrong_fingerprint"]["campaign"] == c.id and got["wrong_fingerprint"]["t"] == t
    assert [d["key"] for d in docs].count(f"{t}:{attr}:garbage") == 1
    counts, n = read_counts(env.redis, c.id, attr, t, 2)
    assert n == len(good) and np.array_equal(counts, proto.support(good))

    _, after = http("GET", f"{env.worker.url}/metrics")
    for reason in set(expected_reason.values()):
        want = sum(1 for r in expected_reason.values() if r == reason)
        assert metric(after, "ldp_rejected_batches_total", reason=reason) - \
            metric(before, "ldp_rejected_batches_total", reason=reason) == want, reason


def test_http_reports_through_the_ingest(env):
    """Single reports reach this worker's counts through the ingest service (the one HTTP door, open mode):
    JSON objects, lists, a default step; bad requests are refused with their reason and never counted."""
    c = env.campaign
    rng = np.random.default_rng(11)
    t = 70
    p_opt, p_app = c.attributes["opt_in"].protocol, c.attributes["app_version"].protocol
    r_opt = p_opt.randomize(np.array([1]), rng, state=p_opt.new_state(1))
    r_app = p_app.randomize(np.array([3, 5, 5]), rng, state=p_app.new_state(3))
    single = {"campaign": c.id, "attribute": "opt_in", "t": t, "payload": b64_report(p_opt, r_opt),
              "protocol": p_opt.name, "fingerprint": p_opt.fingerprint}
    many = [{"campaign": c.id, "attribute": "app_version", "t": t, "payload": b64_report(p_app, r_app[i:i + 1])}
            for i in range(3)]
    no_t = {"campaign": c.id, "attribute": "opt_in", "payload": b64_report(p_opt, r_opt)}
    with IngestProcess([env.cfile], env.kafka, env.redis, run_dir=env.run_dir, topic_prefix=f"{env.tag}.") as ingest:
        url = f"{ingest.url}/reports"
        t_default0 = math.floor(time.time() / c.time_step_seconds)
        assert http("POST", url, single) == (200, {"accepted": 1})
        assert http("POST", url, many) == (200, {"accepted": 3})
        assert http("POST", url, no_t) == (200, {"accepted": 1})
        t_default1 = math.floor(time.time() / c.time_step_seconds)
        wait_for_counts(env.redis, c.id, {("opt_in", t): (p_opt.support(r_opt), 1),
                                          ("app_version", t): (p_app.support(r_app), 3)}, timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # t defaults to floor(now / time_step_seconds)
            n_default = sum(read_counts(env.redis, c.id, "opt_in", td, 2)[1] for td in {t_default0, t_default1})
            if n_default:
                break
            time.sleep(0.05)
        assert n_default == 1

        _, before = http("GET", f"{ingest.url}/metrics")
        cases = {
            "bad_json": (None, b"{not json"),
            "wrong_fingerprint": ({**single, "fingerprint": "0" * 16}, None),
            "wrong_protocol": ({**single, "protocol": "GRR"}, None),
            "unknown_attribute": ({**single, "attribute": "nope"}, None),
            "bad_payload": ({**single, "payload": b64_report(p_opt, np.concatenate([r_opt, r_opt]))}, None),
            "truncated": ({**single, "payload": base64.b64encode(p_opt.encode(r_opt)[:-1]).decode()}, None),
        }
        for reason, (body, raw) in cases.items():
            status, resp = http("POST", url, body, raw)
            assert status == 400 and resp["error"] == reason, (reason, resp)
        # all-or-nothing: a valid report next to a bad one is not published
        status, resp = http("POST", url, [single, {**single, "t": -1}])
        assert status == 400 and resp["errors"] == [{"index": 1, "reason": "bad_json",
                                                     "detail": resp["errors"][0]["detail"]}]
        _, after = http("GET", f"{ingest.url}/metrics")
        for reason in cases:
            want = 2 if reason == "bad_json" else 1
            assert metric(after, "ldp_ingest_refused_requests_total", reason=reason) - \
                metric(before, "ldp_ingest_refused_requests_total", reason=reason) == want, reason
        assert metric(after, "ldp_ingest_reports_total", campaign=c.id, attribute="app_version") == 3
    time.sleep(0.5)  # nothing of the refused requests reaches Redis
    counts, n = read_counts(env.redis, c.id, "opt_in", t, 2)
    assert n == 1 and np.array_equal(counts, p_opt.support(r_opt))


def test_the_worker_takes_no_reports(env):
    """The ingest is the one door for device reports: a worker answers POST /reports with 404 or 405."""
    body = {"campaign": env.campaign.id, "attribute": "opt_in", "t": 0, "payload": "AA=="}
    status, _ = http("POST", f"{env.worker.url}/reports", body)
    assert status in (404, 405)


def test_campaigns_dashboard_and_errors(env):
    c = env.campaign
    status, page = http("GET", f"{env.worker.url}/")
    assert status == 200 and "<html" in page and 'src="dashboard.js"' in page
    status, script = http("GET", f"{env.worker.url}/dashboard.js")  # the page's script, served by the worker
    assert status == 200 and "estimates/" in script and "metrics" in script
    status, doc = http("GET", f"{env.worker.url}/campaigns")
    assert status == 200
    (cd,) = [x for x in doc["campaigns"] if x["id"] == c.id]
    assert cd["fingerprint"] == c.fingerprint
    assert {a["name"]: a["fingerprint"] for a in cd["attributes"]} == \
        {a.name: a.protocol.fingerprint for a in c.attributes.values()}
    assert http("GET", f"{env.worker.url}/estimates/nope/x")[0] == 404
    assert http("GET", f"{env.worker.url}/estimates/{c.id}/nope/history")[0] == 404
    status, st = http("GET", f"{env.worker.url}/status")
    assert status == 200 and st["assigned"] == [0, 1, 2, 3] and st["estimator_leader"] is True
    status, health = http("GET", f"{env.worker.url}/health")
    assert status == 200 and health["healthy"] is True and health["schema_version"] == 1
    # the worker created its estimates topic with estimates_partitions (default 1), as compose does
    assert partition_count(env.kafka, env.estimates) == 1


def test_lateness_finalization_revisions_and_lease(local_stack, tmp_path):
    """The estimator without watermarks (in-process, real Redis): lateness rule, late data, lease hand-over."""
    from stream_app.windows import Estimator
    from stream_app.metrics import Metrics
    from stream_app.store import CountStore

    tag = uuid.uuid4().hex[:8]
    c = Campaign.load(unique_campaign_file(DEMO, tmp_path, tag))
    proto = c.attributes["opt_in"].protocol
    redis_url = local_stack.info.redis_url
    T, L = c.time_step_seconds, c.lateness_seconds

    async def scenario() -> None:
        store = CountStore.from_url(redis_url)
        sent: list[dict] = []

        async def publish(doc: dict) -> None:
            sent.append(doc)

        est = Estimator({c.id: c}, store, Metrics(), publish, app_id=f"lease-{tag}", worker_id="a")
        other = Estimator({c.id: c}, CountStore.from_url(redis_url), Metrics(), publish, app_id=f"lease-{tag}",
                          worker_id="b")
        try:
            # a logical step (t=3: a fleet's numbering) and a wall-clock step (a batch of the HTTP ingest); start
            # well clear of a step boundary, or the wall-clock step would close during the first ticks
            to_boundary = (math.floor(time.time() / T) + 1) * T - time.time()
            if to_boundary < 2.0:
                time.sleep(to_boundary + 0.1)
            t_wall = math.floor(time.time() / T)
            await store.apply_batch(c.id, "opt_in", 3, np.array([40, 60]), 100, "b:3:1")
            await store.apply_batch(c.id, "opt_in", t_wall, np.array([40, 60]), 100, "http:b-wall")
            now = time.time()
            docs = await est.tick(now=now + L - 0.5)
            assert {(d["t"], d["final"], d["clock"]) for d in docs} == {(3, False, "logical"), (t_wall, False, "wall")}
            assert await other.tick(now=now) == []  # b does not hold the lease
            assert await est.tick(now=now + L - 0.4) == []  # nothing changed: nothing published
            # a logical step is never final by the clock alone: stream time must pass it (a later step's reports);
            # the wall-clock step is, by its window
            later = max(now + 10 * L, (t_wall + 1) * T + L) + 1
            docs = await est.tick(now=later)
            assert [(d["t"], d["final"], d["trigger"]) for d in docs] == [(t_wall, True, "lateness")]
            await store.apply_batch(c.id, "opt_in", 4, np.array([1, 1]), 2, "b:4:1")
            docs = await est.tick(now=later + 1)  # stream time passed step 3: its grace begins
            assert [(d["t"], d["final"]) for d in docs] == [(4, False)]
            assert await est.tick(now=later + 1 + L - 0.1) == []
            docs = await est.tick(now=later + 1 + L + 0.1)
            assert [(d["t"], d["final"], d["trigger"]) for d in docs] == [(3, True, "lateness")]
            # late data after the final estimate: a revision
            await store.apply_batch(c.id, "opt_in", 3, np.array([10, 0]), 10, "b:3:late")
            docs = await est.tick()
            assert [(d["t"], d["trigger"], d["revision"], d["n"]) for d in docs] == [(3, "late", 1, 110)]
            hist = await store.estimates(c.id, "opt_in")
            assert hist[3]["revision"] == 1 and hist[3]["n"] == 110 and hist[t_wall]["n"] == 100
            f = np.asarray(hist[3]["frequencies"])
            np.testing.assert_allclose(f, proto.estimate(np.array([50, 60]), 110))
            # a step older than every final one, reported for the first time, is still found
            await store.apply_batch(c.id, "opt_in", 1, np.array([5, 5]), 10, "b:1:first")
            now = time.time()
            docs = await est.tick(now=now)
            assert [(d["t"], d["final"], d["n"]) for d in docs] == [(1, False, 10)]
            docs = await est.tick(now=now + L + 0.5)
            assert [(d["t"], d["final"], d["trigger"]) for d in docs] == [(1, True, "lateness")]
            # hand-over: b takes the lease and does not republish the finals
            await est.release()
            n_sent = len(sent)
            docs = await other.tick()  # the open step 4 gets b's first (non-final) estimate
            assert other.is_leader and [(d["t"], d["final"]) for d in docs] == [(4, False)]
            assert [d for d in sent[n_sent:] if d["final"]] == []
        finally:
            await est.release()
            await other.release()
            await store.close()
            await other.store.close()

    asyncio.run(scenario())


def test_redelivered_batches_are_not_counted(local_stack, tmp_path):
    """The hot path in-process: a batch id applied once is skipped at any partition or offset (a redelivery,
    a replay from an earlier offset, a recreated topic's offsets); a rejection does not count."""
    from stream_app.app import Worker

    tag = uuid.uuid4().hex[:8]
    c = Campaign.load(unique_campaign_file(DEMO, tmp_path, tag))
    proto = c.attributes["app_version"].protocol
    rng = np.random.default_rng(3)
    reports = proto.randomize(rng.integers(0, proto.k, 5000), rng, state=proto.new_state(5000))
    blob = envelope.pack_reports(c, "app_version", 0, reports, batch_id="hot:0:app_version:0")
    other = envelope.pack_reports(c, "app_version", 0, reports, batch_id="hot:0:app_version:1")

    async def scenario() -> list[str]:
        worker = Worker({c.id: c}, local_stack.info.redis_url, app_id=f"hot-{tag}", topics=Topics())
        pipe = worker.pipeline
        try:
            return [await pipe.process(blob, 2, 10), await pipe.process(blob, 2, 10),
                    await pipe.process(blob, 2, 9), await pipe.process(blob[:-3], 2, 11),
                    await pipe.process(blob, 3, 0), await pipe.process(other, 2, 3)]
        finally:
            await worker.close()

    assert asyncio.run(scenario()) == ["applied", "duplicate", "duplicate", "rejected", "duplicate", "applied"]
    counts, n = read_counts(local_stack.info.redis_url, c.id, "app_version", 0, proto.k)
    assert n == 2 * len(reports) and np.array_equal(counts, 2 * proto.support(reports))


def test_sigkill_and_restart_counts_exactly_once(env):
    """Kill the worker with SIGKILL mid-stream, restart it in the same group: counts stay exact."""
    c = env.campaign
    attr = "crash_minute"
    proto = c.attributes[attr].protocol
    rng = np.random.default_rng(99)
    n_batches, per = 60, 5_000
    t = 90
    reports = proto.randomize(rng.integers(0, proto.k, n_batches * per), rng, state=proto.new_state(n_batches * per))
    msgs = [(message_key(t, attr), envelope.pack_reports(c, attr, t, reports[i * per:(i + 1) * per],
                                                      batch_id=f"kill:{t}:{i}"))
            for i in range(n_batches)]
    expected = {(attr, t): (proto.support(reports), len(reports))}
    produce(env.kafka, env.reports, msgs[:20])
    # wait until the worker counted part of the stream, then crash it (no commit, no group leave)
    deadline = time.monotonic() + 30
    while read_counts(env.redis, c.id, attr, t, proto.k)[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    env.worker.kill()
    produce(env.kafka, env.reports, msgs[20:])
    counted = read_counts(env.redis, c.id, attr, t, proto.k)[1]
    assert 0 < counted < len(reports)
    t0 = time.monotonic()
    env.worker.start()
    env.worker.wait_ready(timeout=90, partitions=4)
    wait_for_counts(env.redis, c.id, expected, timeout=60)
    print(f"restarted and caught up in {time.monotonic() - t0:.1f} s (counted {counted} before the kill)")
    status, text = http("GET", f"{env.worker.url}/metrics")
    # the restarted worker counted exactly what the killed one had not (redeliveries skipped by offset)
    assert metric(text, "ldp_reports_total", campaign=c.id, attribute=attr) + counted == len(reports)


def test_sigterm_stops_cleanly(env):
    code = env.worker.stop(timeout=30)
    assert code == 0, env.worker.log_tail()
    assert "Traceback" not in env.worker.log_path.read_text(errors="replace")
