"""Producers: the simulated fleet (offline and against the real broker) and the device SDK."""
from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import uuid
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from producers.fleet import Fleet, FleetConfig, FleetStateError, StepData, publish
from producers.sdk import BudgetExceeded, Device, DeviceStateError, IngestError
from wire.campaign import Campaign
from wire.envelope import REPORTS, WATERMARK, decode_reports, parse, validate

pytestmark = pytest.mark.timeout(180)


def _campaign(cid: str = "prod-test", attrs: list[dict] | None = None, **head) -> Campaign:
    attrs = attrs or [
        {"name": "ver", "k": 40, "protocol": "L-OSUE", "eps_inf": 2.0, "eps_1": 1.0},
        {"name": "minute", "k": 60, "protocol": "LOLOHA", "eps_inf": 2.0, "eps_1": 1.0},
        {"name": "flag", "k": 2, "protocol": "L-GRR", "eps_inf": 2.0, "eps_1": 1.0},
        {"name": "bucket", "k": 16, "protocol": "GRR", "eps": 1.0},
    ]
    return Campaign.from_dict({"campaign": {"id": cid, **head}, "attributes": attrs})


# --------------------------------------------------------------------------- fleet, offline
def test_fleet_step_supports_are_additive_and_estimates_unbiased():
    camp = _campaign()
    fleet = Fleet(FleetConfig(camp, n_devices=20_000, steps=1, batch_size=3_000, seed=3))
    data = fleet.step()
    assert set(data) == set(camp.attributes) and fleet.next_step == 1
    for name, d in data.items():
        proto = camp.attribute(name).protocol
        assert isinstance(d, StepData) and d.n == 20_000 and d.t == 0
        assert d.values.min() >= 0 and d.values.max() < proto.k
        assert np.isclose(d.true_frequencies.sum(), 1.0)
        parts = [proto.support(d.reports[lo:lo + 3_000]) for lo in range(0, d.n, 3_000)]
        assert np.array_equal(np.sum(parts, axis=0), d.support)
        assert np.array_equal(proto.support(d.reports), d.support)
        est = proto.estimate(d.support, d.n)
        sd = np.sqrt(proto.variance_exact(d.true_frequencies, d.n))
        z = np.abs(est - d.true_frequencies) / sd
        assert z.max() < 4.5, (name, z.max())


def test_fleet_is_deterministic_and_syn_evolves():
    camp = _campaign()
    cfg = dict(campaign=camp, n_devices=5_000, steps=3, dataset="syn", p_change=0.25, seed=11)
    a = [d for _, d in Fleet(FleetConfig(**cfg)).run()]
    b = [d for _, d in Fleet(FleetConfig(**cfg)).run()]
    for da, db in zip(a, b):
        for name in camp.attributes:
            assert np.array_equal(da[name].values, db[name].values)
            assert np.array_equal(da[name].reports, db[name].reports)
    # Syn: a device redraws w.p. p_change from the base law, which may land on the same value
    dist = Fleet(FleetConfig(**cfg)).populations["ver"].distribution
    p = 0.25 * (1 - np.sum(dist ** 2))
    for s in (1, 2):
        changed = np.mean(a[s]["ver"].values != a[s - 1]["ver"].values)
        assert abs(changed - p) < 5 * np.sqrt(p * (1 - p) / 5_000), (changed, p)
    other = [d for _, d in Fleet(FleetConfig(**{**cfg, "seed": 12})).run()]
    assert not np.array_equal(other[0]["ver"].reports, a[0]["ver"].reports)


def _prr(fleet: Fleet, values: np.ndarray) -> np.ndarray:
    """The memoized (permanent) L-GRR response of every device for ``values`` (IRR disabled)."""
    proto = fleet.proto("flag")
    st = fleet.states["flag"]
    return proto.memoized_outputs(values, st).astype(np.int64)


def test_fleet_resume_from_state_dir(tmp_path):
    camp = _campaign()
    cfg = dict(campaign=camp, n_devices=4_000, steps=4, seed=5)
    full = Fleet(FleetConfig(**cfg, state_dir=tmp_path / "full"))
    ref = dict(full.run())
    # the same fleet interrupted after two steps, then resumed by a new Fleet object
    first = Fleet(FleetConfig(**{**cfg, "steps": 2}, state_dir=tmp_path / "split"))
    assert not first.resumed
    list(first.run())
    first.close()  # the state directory's lock (a second fleet on it is refused: tests/test_fleet_resume.py)
    meta = json.loads((tmp_path / "split" / "fleet.json").read_text())
    assert meta["next_step"] == 2 and (tmp_path / "split" / meta["snapshot"]).is_dir()
    resumed = Fleet(FleetConfig(**{**cfg, "steps": 2}, state_dir=tmp_path / "split"))
    assert resumed.resumed and list(resumed.step_range) == [2, 3]
    for t, data in resumed.run():
        for name in camp.attributes:
            assert np.array_equal(data[name].reports, ref[t][name].reports), (t, name)
    for name in camp.attributes:
        a, b = full.states[name], resumed.states[name]
        assert (a is None) == (b is None)
        if a is not None:
            assert np.array_equal(a.keys, b.keys) and np.array_equal(a.seen, b.seen)
    resumed.close()
    # the resumed devices kept their memo keys: the same PRR outputs as the uninterrupted fleet, other keys not
    fresh = Fleet(FleetConfig(**{**cfg, "seed": 999}))
    values = np.random.default_rng(0).integers(0, 2, 4_000)
    assert np.array_equal(_prr(resumed, values), _prr(full, values))
    assert np.mean(_prr(fresh, values) != _prr(full, values)) > 0.05
    assert np.array_equal(resumed.memoized_counts("flag"), full.memoized_counts("flag"))
    # a state directory of another campaign or fleet size, or made with another seed, is refused
    with pytest.raises(FleetStateError, match="campaign"):
        Fleet(FleetConfig(_campaign("another"), 4_000, 1, state_dir=tmp_path / "split"))
    with pytest.raises(FleetStateError, match="devices"):
        Fleet(FleetConfig(camp, 3_000, 1, state_dir=tmp_path / "split"))
    with pytest.raises(FleetStateError, match="--seed 5; this run has --seed 999"):
        Fleet(FleetConfig(**{**cfg, "seed": 999}, state_dir=tmp_path / "split"))


def test_fleet_config_errors():
    camp = _campaign(max_batch_reports=1000)
    with pytest.raises(ValueError, match="dataset"):
        FleetConfig(camp, 10, 1, dataset="nope")
    with pytest.raises(ValueError, match="batch_size"):
        FleetConfig(camp, 10, 1, batch_size=5000)
    with pytest.raises(ValueError, match="rate"):
        FleetConfig(camp, 10, 1, batch_size=100, rate=0)


# --------------------------------------------------------------------------- fleet -> real broker
async def _consume_all(bootstrap: str, topic: str) -> list:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        parts = sorted(consumer.partitions_for_topic(topic) or await _partitions(consumer, topic))
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out = []
        deadline = time.monotonic() + 60
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            assert time.monotonic() < deadline, "consuming the topic back timed out"
            batch = await consumer.getmany(*tps, timeout_ms=1000)
            for recs in batch.values():
                out.extend(recs)
        return out
    finally:
        await consumer.stop()


async def _partitions(consumer, topic: str) -> set[int]:
    for _ in range(50):
        await consumer._client.force_metadata_update()
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return parts
        await asyncio.sleep(0.1)
    raise AssertionError(f"topic {topic} has no partitions")


def test_publish_to_broker_matches_offline_supports(local_stack):
    bootstrap = local_stack.info.kafka_bootstrap
    camp = _campaign()
    topic = f"prod-test-{uuid.uuid4().hex[:8]}"
    cfg = FleetConfig(camp, n_devices=30_000, steps=3, batch_size=7_000, seed=21)
    events = []
    summary = asyncio.run(publish(cfg, bootstrap, topic, partitions=3, on_progress=events.append))

    n_attr = len(camp.attributes)
    assert summary.reports_sent == 30_000 * 3 * n_attr
    assert summary.batches == 5 * 3 * n_attr and summary.watermarks == 3 * n_attr
    assert events and events[-1].reports_sent == events[-1].reports_total == summary.reports_sent
    # the recorded supports are those of an offline fleet with the same config
    offline = dict(Fleet(cfg).run())
    for (attr, t), rec in summary.per_step.items():
        assert np.array_equal(rec["support"], offline[t][attr].support)
        assert np.allclose(rec["true_frequencies"], offline[t][attr].true_frequencies)

    records = asyncio.run(_consume_all(bootstrap, topic))
    assert len(records) == summary.batches + summary.watermarks
    assert sum(len(r.value) for r in records) == summary.bytes_sent
    sums: dict[tuple[str, int], np.ndarray] = {}
    counts: dict[tuple[str, int], int] = defaultdict(int)
    where: dict[tuple[str, int], set[int]] = defaultdict(set)
    sealed: set[tuple[str, int]] = set()
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        env = parse(rec.value)
        validate(env, {camp.id: camp})
        key = (env.attribute, env.t)
        assert rec.key == f"{env.t}:{env.attribute}".encode()
        where[key].add(rec.partition)
        if env.kind == WATERMARK:
            assert key not in sealed, f"two watermarks for {key}"
            sealed.add(key)
            continue
        assert env.kind == REPORTS and key not in sealed, f"batch of {key} after its watermark"
        proto = camp.attribute(env.attribute).protocol
        sup = proto.support(decode_reports(env, camp))
        sums[key] = sums.get(key, 0) + sup
        counts[key] += env.count
    assert sealed == set(summary.per_step) == set(sums)
    for key, rec in summary.per_step.items():
        assert len(where[key]) == 1, f"{key} spread over partitions {where[key]}"
        assert counts[key] == rec["n"] == 30_000
        assert np.array_equal(sums[key], rec["support"]), key


def test_publish_paces_to_rate_and_resumes(local_stack, tmp_path):
    bootstrap = local_stack.info.kafka_bootstrap
    camp = _campaign(attrs=[{"name": "flag", "k": 2, "protocol": "L-GRR", "eps_inf": 2.0, "eps_1": 1.0}])
    topic = f"prod-rate-{uuid.uuid4().hex[:8]}"
    cfg = FleetConfig(camp, n_devices=10_000, steps=2, batch_size=2_000, rate=50_000.0, seed=1,
                      state_dir=tmp_path / "state")
    summary = asyncio.run(publish(cfg, bootstrap, topic, partitions=1))  # closes the fleet it made
    assert summary.reports_sent == 20_000
    assert summary.seconds >= 0.9 * 20_000 / 50_000 and summary.rate <= 1.1 * 50_000
    # the memo state was committed after the acknowledged steps; a new run continues at t = 2
    fleet = Fleet(FleetConfig(camp, n_devices=10_000, steps=1, batch_size=2_000, state_dir=tmp_path / "state",
                              seed=1))  # the options that shape batches as before (another batch size is refused)
    assert fleet.resumed and list(fleet.step_range) == [2]
    again = asyncio.run(publish(fleet, bootstrap, topic))
    fleet.close()
    assert again.steps == [2] and set(again.per_step) == {("flag", 2)}


# --------------------------------------------------------------------------- device SDK
def _sdk_campaign(cid: str = "sdk-test") -> Campaign:
    return _campaign(cid, attrs=[
        {"name": "level", "k": 4, "protocol": "L-GRR", "eps_inf": 1.0, "eps_1": 0.5},
        {"name": "click", "k": 4, "protocol": "GRR", "eps": 0.5},
        {"name": "ver", "k": 20, "protocol": "L-OSUE", "eps_inf": 1.0, "eps_1": 0.5},
    ])


def _device_prr(dev: Device, value: int) -> int:
    proto = dev.campaign.attribute("level").protocol
    st = dev.states["level"]
    return int(proto.memoized_outputs(np.array([value]), st)[0])


def _mode(dev: Device, value: int, n: int = 300) -> int:
    proto = dev.campaign.attribute("level").protocol
    reps = [int(proto.decode(base64.b64decode(dev.report("level", value, t=0)["payload"]))[0]) for _ in range(n)]
    return int(np.bincount(reps, minlength=proto.k).argmax())


def test_device_budget_refusal_and_restart(tmp_path):
    camp = _sdk_campaign()
    path = tmp_path / "dev"
    dev = Device(camp, path, budget_eps=2.6)
    level = camp.attribute("level").protocol
    dev.report("level", 0, t=3)
    assert dev.memoized_count("level") == 1 and dev.privacy_loss() == pytest.approx(level.eps_inf)
    for _ in range(5):  # re-reporting a memoized value costs nothing
        dev.report("level", 0, t=3)
    dev.report("level", 1, t=3)
    assert dev.memoized_count("level") == 2 and dev.privacy_loss() == pytest.approx(2 * level.eps_inf)
    memo_file = path / "level.memo.npz"
    before = memo_file.read_bytes()
    # past the budget a new value is not refused (that would leak it): the attribute freezes on
    # its last reported value, 1, whose memoized response is reused
    assert dev.frozen("level")
    dev.report("level", 2, t=3)
    assert memo_file.read_bytes() == before and dev.memoized_count("level") == 2
    assert dev.last_value("level") == 1
    dev.report("level", 1, t=4)  # still allowed
    # a memoryless attribute spends eps_first per report
    click = camp.attribute("click").protocol
    dev.report("click", 3, t=3)
    assert dev.privacy_loss() == pytest.approx(2 * level.eps_inf + click.eps_first)
    with pytest.raises(BudgetExceeded):
        dev.report("click", 3, t=3)
    assert json.loads((path / "budget.json").read_text())["spent_reports"] == {"click": 1}
    # a new memoizing attribute would also exceed the budget (its first memo slot cannot be reserved)
    with pytest.raises(BudgetExceeded):
        dev.report("ver", 5, t=3)
    assert dev.memoized_count("ver") == 0
    prr0, prr1, mode0 = _device_prr(dev, 0), _device_prr(dev, 1), _mode(dev, 0)
    loss = dev.privacy_loss()
    dev.close()

    # restart: same memo (same keys, same memoized outputs), same spent budget
    dev2 = Device(camp, path, budget_eps=2.6)
    assert dev2.privacy_loss() == pytest.approx(loss) and dev2.memoized_count("level") == 2
    assert _device_prr(dev2, 0) == prr0 and _device_prr(dev2, 1) == prr1
    assert _mode(dev2, 0) == mode0 == prr0
    dev2.report("level", 3, t=5)  # frozen on 0, the value it last reported
    assert dev2.memoized_count("level") == 2 and dev2.last_value("level") == 0
    with pytest.raises(BudgetExceeded):
        dev2.report("click", 0, t=5)
    # a larger budget on the same device allows more, from the same spent total
    dev3 = Device(camp, path, budget_eps=10.0)
    dev3.report("level", 3, t=6)
    assert dev3.privacy_loss() == pytest.approx(loss + level.eps_inf)
    # two Device objects on one directory see each other's spending
    assert dev2.privacy_loss() == pytest.approx(loss + level.eps_inf)


def test_device_report_payload_decodes(tmp_path):
    camp = _sdk_campaign()
    dev = Device(camp, tmp_path / "dev")
    for name, attr in camp.attributes.items():
        obj = dev.report(name, attr.k - 1, t=7)
        assert set(obj) == {"campaign", "attribute", "t", "payload"}
        assert (obj["campaign"], obj["attribute"], obj["t"]) == (camp.id, name, 7)
        reports = attr.protocol.decode(base64.b64decode(obj["payload"]))
        assert len(reports) == 1 and attr.protocol.support(reports).sum() >= 0
    now = dev.report("ver", 1)["t"]
    assert abs(now - time.time() / camp.time_step_seconds) < 2
    with pytest.raises(Exception, match="domain"):
        dev.report("ver", 20)
    with pytest.raises(DeviceStateError, match="campaign"):
        Device(_sdk_campaign("other-campaign"), tmp_path / "dev")


class _Ingest(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        obj = json.loads(body)
        if obj["attribute"] == "click":
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "bad_payload"}')
            return
        _Ingest.received.append(obj)
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"accepted": 1}')

    def log_message(self, *args):
        pass


def test_device_send_posts_json(tmp_path):
    server = HTTPServer(("127.0.0.1", 0), _Ingest)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/reports"
        dev = Device(_sdk_campaign(), tmp_path / "dev", ingest_url=url)
        assert dev.send("level", 2, t=1) == {"accepted": 1}
        assert _Ingest.received[-1]["attribute"] == "level" and _Ingest.received[-1]["t"] == 1
        with pytest.raises(IngestError, match="HTTP 400") as info:
            dev.send("click", 0, t=1)
        assert info.value.status == 400
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(IngestError, match="cannot reach"):
        Device(_sdk_campaign(), tmp_path / "dev", ingest_url=url).send("level", 2, t=1)
