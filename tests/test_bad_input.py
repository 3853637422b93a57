"""Issue 3 acceptance 3: bad input is rejected with its reason, counted in a metric, and never
changes the counts; the worker keeps running (real broker, real Redis, worker in a subprocess)."""
from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np

from ldpstream_dev.workers import IngestProcess, WorkerProcess, unique_campaign_file, wait_for_counts
from wire import envelope as E
from wire.campaign import Campaign
from wire.topics import Topics

CAMPAIGN = Path(__file__).parent / "data" / "e2e.toml"
ATTR = "app_version"


def _batch(campaign: Campaign, t: int, n: int, seed: int) -> tuple[bytes, np.ndarray]:
    proto = campaign.attribute(ATTR).protocol
    rng = np.random.default_rng(seed)
    reports = proto.randomize(rng.integers(0, proto.k, n), rng, state=proto.new_state(n, rng=rng))
    return E.pack_reports(campaign, ATTR, t, reports, batch_id=f"bad-input:{t}:{seed}"), proto.support(reports)


def _bad_messages(campaign: Campaign) -> dict[str, bytes]:
    proto = campaign.attribute(ATTR).protocol
    good, _ = _batch(campaign, 0, 1000, seed=5)
    rng = np.random.default_rng(6)
    reports = proto.randomize(rng.integers(0, proto.k, 1000), rng, state=proto.new_state(1000, rng=rng))
    payload = proto.encode(reports)
    out_of_domain = bytearray(payload)
    out_of_domain[-1] |= 0xF0  # set bits beyond k = 100 in the last report
    oversized = E.pack(campaign.id, ATTR, proto.name, proto.fingerprint, 0, campaign.max_batch_reports + 1,
                       b"", batch_id="bad:oversized")
    return {
        "truncated": good[:-7],
        "wrong_fingerprint": E.pack(campaign.id, ATTR, proto.name, "0123456789abcdef", 0, 1000, payload),
        "unknown_campaign": E.pack("no-such-campaign", ATTR, proto.name, proto.fingerprint, 0, 1000, payload),
        "bad_payload": E.pack(campaign.id, ATTR, proto.name, proto.fingerprint, 0, 1000, bytes(out_of_domain),
                              batch_id="bad:payload"),
        "malformed": bytes(np.random.default_rng(7).integers(0, 256, 3000, dtype=np.uint8)),
        "oversized": oversized,
        "missing_batch_id": E.pack(campaign.id, ATTR, proto.name, proto.fingerprint, 0, 1000, payload),
    }


async def _send(bootstrap: str, topic: str, messages: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=8 << 20)
    await producer.start()
    try:
        for m in messages:
            await producer.send_and_wait(topic, m, key=b"0:" + ATTR.encode())
    finally:
        await producer.stop()


async def _rejections(bootstrap: str, topic: str, want: int, timeout: float = 30.0) -> list[dict]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    out: list[dict] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(out) < want and loop.time() < deadline:
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(json.loads(r.value) for r in recs)
    finally:
        await consumer.stop()
    return out


def _metric(text: str, reason: str, name: str = "ldp_rejected_batches_total") -> float:
    m = re.search(r'^%s\{[^}]*reason="%s"[^}]*\} (\S+)$' % (name, reason), text, re.M)
    return float(m.group(1)) if m else 0.0


def test_bad_input_is_rejected_and_never_counted(local_stack, tmp_path) -> None:
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    campaign = Campaign.load(path)
    app_id = f"bad-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(f"{app_id}.")
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.",
                       refresh_seconds=0.2, session_timeout=3.0, run_dir=tmp_path) as w:
        first, c1 = _batch(campaign, 0, 2000, seed=1)
        last, c2 = _batch(campaign, 0, 3000, seed=2)
        bad = _bad_messages(campaign)
        asyncio.run(_send(boot, topics.reports, [first, *bad.values(), last]))
        # the worker went on after every bad batch, and only the two good ones are counted
        wait_for_counts(redis_url, campaign.id, {(ATTR, 0): (c1 + c2, 5000)}, timeout=60)

        # bad JSON and a bad report on the HTTP ingest (the one door for single reports): refused, counted by reason
        with IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp_path) as ingest:
            for body, reason in ((b"{not json", "bad_json"),
                                 (json.dumps({"campaign": campaign.id, "attribute": ATTR, "t": 0,
                                              "payload": "AAAA"}).encode(), None)):
                req = urllib.request.Request(f"{ingest.url}/reports", data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(req, timeout=10)
                    raise AssertionError("the endpoint accepted a bad request")
                except urllib.error.HTTPError as exc:
                    assert exc.code == 400
                    doc = json.loads(exc.read())
                    if reason:
                        assert doc["error"] == reason
            with urllib.request.urlopen(f"{ingest.url}/metrics", timeout=10) as r:
                assert _metric(r.read().decode(), "bad_json", "ldp_ingest_refused_requests_total") == 1

        got = asyncio.run(_rejections(boot, topics.rejected, want=len(bad)))
        reasons = [r["reason"] for r in got]
        for reason in bad:
            assert reason in reasons, f"no rejection with reason {reason!r} on {topics.rejected}: {reasons}"
        with urllib.request.urlopen(f"{w.url}/metrics", timeout=10) as r:
            text = r.read().decode()
        for reason in bad:
            assert _metric(text, reason) >= 1, f"metric ldp_rejected_batches_total{{reason={reason!r}}} missing"
        # the counts did not move after all that
        wait_for_counts(redis_url, campaign.id, {(ATTR, 0): (c1 + c2, 5000)}, timeout=5)


def test_device_sdk_reports_through_http_ingest(local_stack, tmp_path) -> None:
    """Real devices: the SDK's single reports go through the ingest's POST /reports into the counts."""
    import base64

    from producers.sdk import Device, post_report

    path = unique_campaign_file(CAMPAIGN, tmp_path)
    campaign = Campaign.load(path)
    app_id = f"sdk-{uuid.uuid4().hex[:6]}"
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.",
                       refresh_seconds=0.2, session_timeout=3.0, run_dir=tmp_path), \
            IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp_path) as ingest:
        proto = campaign.attribute(ATTR).protocol
        expected = np.zeros(proto.support_size, dtype=np.int64)
        for i in range(20):
            dev = Device(campaign, tmp_path / f"device{i}", budget_eps=10.0, ingest_url=f"{ingest.url}/reports")
            obj = dev.report(ATTR, i % 7, t=3)
            expected += proto.support(proto.decode(base64.b64decode(obj["payload"])))
            post_report(f"{ingest.url}/reports", obj)
        wait_for_counts(redis_url, campaign.id, {(ATTR, 3): (expected, 20)}, timeout=30)

