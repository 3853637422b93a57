"""The device SDK's side of sending: labels where indices are accepted, open-domain values (strings and u64 ids,
hashed on the device; other values refused; nothing of the value stored), the budget's plan said at construction,
and ``send()`` retried after a dropped connection through the real ingest: counted once, never randomized again."""
from __future__ import annotations

import base64
import json
import logging
import math
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from estimators.errors import LDPError
from ldpstream_dev.dropping_proxy import DroppingProxy, request_body, request_header
from ldpstream_dev.workers import IngestProcess, WorkerProcess, unique_campaign_file, wait_for_counts
from producers.sdk import BudgetExceeded, Device, IngestError
from wire.campaign import Campaign

DEMO = Path(__file__).resolve().parents[1] / "deploy" / "campaigns" / "demo.toml"
E2E = Path(__file__).parent / "data" / "e2e.toml"


def test_labels_are_accepted_wherever_indices_are(tmp_path):
    dev = Device(Campaign.load(DEMO), tmp_path / "dev", budget_eps=None)
    yes = dev.report("opt_in", "yes", t=1)
    assert yes["attribute"] == "opt_in" and dev.value_index("opt_in", "yes") == 1 == dev.value_index("opt_in", 1)
    with pytest.raises(LDPError, match="'maybe' is not a label of 'opt_in' \\(labels: 'no', 'yes'\\)"):
        dev.report("opt_in", "maybe")
    with pytest.raises(LDPError, match="'app_version' has no labels"):
        dev.report("app_version", "v1")
    with pytest.raises(LDPError, match="outside the domain"):
        dev.report("opt_in", 2)
    objs = dev.report_group("device", {"dark_mode": "on", "country": 3, "device_model": 17}, t=1)
    assert objs and all(o["attribute"] in ("dark_mode", "country", "device_model") for o in objs)
    with pytest.raises(LDPError, match="not a label of 'dark_mode'"):
        dev.report_group("device", {"dark_mode": "dim", "country": 3, "device_model": 17}, t=2)


OPEN = {"campaign": {"id": "open-test"}, "attributes": [
    {"name": "crash", "type": "string", "protocol": "HCMS", "eps": 4.0, "m": 256, "k": 16, "top": 5,
     "candidates": ["a", "b", "c"]},
    {"name": "pid", "type": "u64", "protocol": "CMS", "eps": 1.0, "m": 100, "k": 4},
    {"name": "opt_in", "k": 2, "protocol": "GRR", "eps": 1.0, "labels": ["no", "yes"]}]}


def test_open_domain_values_are_hashed_on_the_device_and_decode(tmp_path):
    """A string / u64 attribute: its report decodes with the worker's codec, a value of another type is refused
    before anything is spent, each report spends eps_first (memoryless), a restored ledger goes on counting, and
    the state directory holds neither the strings nor their ids."""
    from wire.single_report import decode_single_report

    campaign = Campaign.from_dict(OPEN)
    crash, pid = campaign.attribute("crash"), campaign.attribute("pid")
    eps = float(crash.protocol.eps_first), float(pid.protocol.eps_first)
    secret = "NullPointerException in café ☕"
    dev = Device(campaign, tmp_path / "dev", budget_eps=10.0)
    objs = [dev.report("crash", secret, t=3), dev.report("pid", (1 << 64) - 1, t=3), dev.report("pid", 0, t=3)]
    for obj, attr in zip(objs, ("crash", "pid", "pid")):
        got = decode_single_report(obj, {campaign.id: campaign})
        assert (got.attribute, got.t, len(got.reports)) == (attr, 3, 1)
        assert got.reports.dtype == campaign.attribute(attr).protocol.report_dtype
    for attr, bad in (("crash", 3), ("crash", b"x"), ("crash", None), ("pid", "3"), ("pid", -1), ("pid", 1 << 64),
                      ("pid", True), ("pid", 2.0)):
        with pytest.raises(LDPError, match=f"attribute '{attr}' takes"):
            dev.report(attr, bad, t=3)
    with pytest.raises(LDPError, match="is open-domain"):
        dev.value_index("crash", "a")
    with pytest.raises(LDPError, match="is not open-domain"):
        dev.value_id("opt_in", "yes")
    assert dev.value_id("crash", "a") == crash.value_id("a") and dev.value_id("pid", 5) == 5
    assert dev.privacy_loss() == pytest.approx(eps[0] + 2 * eps[1]) == dev.reserved_loss()
    assert dev.spent_reports == {"crash": 1, "pid": 2} and dev.last_values == {}
    dev.close()
    stored = b"".join(p.read_bytes() for p in (tmp_path / "dev").rglob("*") if p.is_file())
    assert secret.encode() not in stored and b"caf" not in stored
    assert str(crash.value_id(secret)).encode() not in stored and crash.value_id(secret).to_bytes(8, "little") not in stored
    dev = Device(campaign, tmp_path / "dev", budget_eps=10.0)  # the ledger restored: 5.x spent of 10
    assert dev.privacy_loss() == pytest.approx(eps[0] + 2 * eps[1])
    dev.report("crash", "another", t=4)
    with pytest.raises(BudgetExceeded):  # memoryless: a report that does not fit is refused, never frozen
        dev.report("crash", secret, t=4)
    dev.close()


TREEHIST = {"campaign": {"id": "treehist-test"}, "attributes": [
    {"name": "url", "type": "string", "protocol": "TreeHist", "eps": 2.0, "rows": 16, "memo_slots": 256},
    {"name": "pid", "type": "u64", "protocol": "TreeHist", "eps": 2.0, "eps_1": 1.0, "bits": 64, "step": 16,
     "start_bits": 0, "rows": 8, "memo_slots": 64},
    {"name": "crash", "type": "string", "protocol": "HCMS", "eps": 1.0, "m": 16, "k": 2}]}


def _treehist_prefixes(proto, st, values) -> list[int]:
    """The memoized inputs (level prefixes) of the values on the device of ``st``, in order."""
    ids = np.array(values, dtype=np.uint64)
    return [int(x) for x in proto.memo_inputs(ids, np.repeat(proto.device_levels(st), len(values)))]


def test_treehist_memoizes_across_restarts_counts_prefixes_freezes_and_stores_no_value(tmp_path):
    """TreeHist (a memoizing open-domain protocol): the memo state (key, seen slots) is created and persisted, a
    restarted device reports the same bytes for the same value, each newly marked slot costs one eps_inf, a full
    budget freezes on the last value's memoized report, a budget that cannot hold one slot is refused up front, and
    the state directory holds neither the strings nor their ids nor their prefixes."""
    campaign = Campaign.from_dict(TREEHIST)
    url = campaign.attribute("url").protocol
    e_inf = float(url.eps_inf)
    secrets_ = ["https://example.com/a?q=café", "https://example.com/b", "https://other.org/", "x", "y", "z"]
    ids = [campaign.attribute("url").value_id(v) for v in secrets_]
    with pytest.raises(ValueError, match="cannot memoize a single value"):
        Device(campaign, tmp_path / "small", budget_eps=0.5 * e_inf)
    dev = Device(campaign, tmp_path / "dev", budget_eps=None)
    first = dev.randomize("url", secrets_[0])
    assert first.dtype == np.uint8 and first.shape == (1, 5)
    assert np.array_equal(dev.randomize("url", secrets_[0]), first)  # the memoized report, no IRR: the same bytes
    st = dev.states["url"]
    assert dev.memoized_count("url") == 1 and dev.privacy_loss("url") == pytest.approx(e_inf)
    assert int(first[0, 0]) == int(url.device_levels(st)[0])  # the level is the device's, for life
    dev.close()
    dev = Device(campaign, tmp_path / "dev", budget_eps=None)  # restarted: key and seen slots restored
    assert np.array_equal(dev.randomize("url", secrets_[0]), first)
    assert dev.memoized_count("url") == 1
    for v in secrets_[1:3]:
        dev.randomize("url", v)
    st = dev.states["url"]
    want = set(_treehist_prefixes(url, st, ids[:3]))  # one tag per distinct prefix: exact, no slot collisions
    tags = st.seen[0].view("<u8")
    assert int((tags != 0).sum()) == len(want) == url.memoized_counts(st)[0]
    assert dev.memoized_count("url") == len(want)
    assert dev.privacy_loss("url") == pytest.approx(len(want) * e_inf) == float(url.longitudinal_loss(len(want)))
    dev.close()
    stored = b"".join(p.read_bytes() for p in (tmp_path / "dev").rglob("*") if p.is_file())
    for v, i in zip(secrets_[:3], ids[:3]):
        assert v.encode() not in stored and str(i).encode() not in stored and f"{i:016x}".encode() not in stored
        assert i.to_bytes(8, "little") not in stored
    a = url.memo_inputs(np.array(ids[:3], dtype=np.uint64), np.repeat(url.device_levels(st), 3))
    assert not any(str(int(x)).encode() in stored or f"{int(x):016x}".encode() in stored for x in a if x)

    # a budget of 2 slots: the third new prefix freezes on the last value's memoized report
    dev = Device(campaign, tmp_path / "budget", budget_eps=2 * e_inf + 1e-9)
    reps, distinct = [], []
    for v, i in zip(secrets_, ids):
        reps.append(dev.randomize("url", v))
        a = _treehist_prefixes(url, dev.states["url"], [i])[0]
        if a not in distinct:
            distinct.append(a)
        if len(distinct) > 2:
            break
    assert len(distinct) == 3, "three values of three distinct prefixes"
    assert dev.memoized_count("url") == 2 and dev.frozen("url")
    assert np.array_equal(reps[-1], reps[-2])  # frozen: the last reported value's memoized report
    assert dev.privacy_loss() <= dev.reserved_loss() <= 2 * e_inf + 1e-9
    with pytest.raises(BudgetExceeded):  # the budget is reserved: a memoryless report is refused, nothing sent
        dev.randomize("crash", "boom")
    with pytest.raises(BudgetExceeded):  # and so is the first report of another memoizing attribute
        dev.randomize("pid", 5)
    last = dev.last_value("url")
    assert isinstance(last, str) and last == reps[-1].tobytes().hex()  # the memoized report, not the value
    dev.close()
    dev = Device(campaign, tmp_path / "budget", budget_eps=2 * e_inf + 1e-9)  # restarted: still frozen on it
    new_id = np.array([campaign.attribute("url").value_id("a value never seen")], dtype=np.uint64)
    own = url.memoized_outputs(new_id, dev.states["url"])  # its own memoized report, if its prefix is memoized
    known = _treehist_prefixes(url, dev.states["url"], [int(new_id[0])])[0] in distinct[:2]
    assert np.array_equal(dev.randomize("url", "a value never seen"), own if known else reps[-1])
    assert dev.memoized_count("url") == 2 and dev.last_value("url") == last
    dev.close()


def test_treehist_charges_each_new_prefix_once_keeps_its_tags_and_refuses_a_full_table(tmp_path):
    """The reference SDK's ledger counts TreeHist's tag table: a repeated value costs one eps_inf once (also after a
    restart: the tags persist), and a device whose table is full (memo_slots = 64: one tag) refuses a new prefix
    with MemoTableFull instead of memoizing it unaccounted; nothing is memoized, saved or sent."""
    from producers.sdk import MemoTableFull

    campaign = Campaign.from_dict({"campaign": {"id": "treehist-tags"}, "attributes": [
        {"name": "u", "type": "u64", "protocol": "TreeHist", "eps": 2.0, "bits": 64, "step": 16, "start_bits": 0,
         "rows": 4, "memo_slots": 64}]})
    u = campaign.attribute("u").protocol
    assert u.memo_tags == 1
    dev = Device(campaign, tmp_path / "dev", budget_eps=None)
    first = dev.randomize("u", 0)
    for _ in range(3):
        assert np.array_equal(dev.randomize("u", 0), first)
    assert dev.memoized_count("u") == 1 and dev.privacy_loss("u") == pytest.approx(float(u.eps_inf))
    dev.close()
    dev = Device(campaign, tmp_path / "dev", budget_eps=None)  # restarted: the tag restored, the repeat free
    assert np.array_equal(dev.randomize("u", 0), first) and dev.memoized_count("u") == 1
    saved = (tmp_path / "dev" / "u.memo.npz").read_bytes()
    with pytest.raises(MemoTableFull, match="memo table of 'u' is full"):
        dev.randomize("u", (1 << 64) - 1)  # another prefix at every level
    assert (tmp_path / "dev" / "u.memo.npz").read_bytes() == saved
    assert dev.memoized_count("u") == 1 and dev.privacy_loss("u") == pytest.approx(float(u.eps_inf))
    assert np.array_equal(dev.randomize("u", 0), first)  # the memoized value still reports
    dev.close()
    # a memo state of an earlier release (a slot bitset: a nonzero word with its low bit clear) is no tag table: its
    # loss cannot be accounted, so the device refuses until the attribute is reset
    from estimators.memo import MemoState
    from producers.sdk import DeviceStateError
    legacy = MemoState.load(tmp_path / "dev" / "u.memo.npz")
    legacy.seen[0, :] = 0
    legacy.seen[0, 2] = 0x10                                 # slot 20 of the former bitset
    legacy.save(tmp_path / "dev" / "u.memo.npz")
    dev = Device(campaign, tmp_path / "dev", budget_eps=None)
    assert u.memoized_counts(legacy)[0] == math.inf
    with pytest.raises(DeviceStateError, match="cannot be accounted"):
        dev.randomize("u", 0)
    dev.reset("u", accept_privacy_loss=True)
    dev.randomize("u", 0)
    assert dev.memoized_count("u") == 1
    dev.close()


def test_treehist_frozen_report_is_the_randomizer_s_for_the_last_value(monkeypatch):
    """With eps_1 (an IRR): the frozen report drawn from the recorded memoized report is byte for byte what
    ``randomize`` gives for the last value under the same noise key (rejections included)."""
    from estimators.randomness import keys_from
    from estimators.sketch import treehist as th
    from producers import sdk

    proto = Campaign.from_dict(TREEHIST).attribute("pid").protocol
    st = proto.new_state(1)
    for v in [0, 1, (1 << 64) - 1, 1 << 63, 12345] * 4:
        nkey = keys_from(None, 1)[0]
        monkeypatch.setattr(th, "noise_key", lambda rng=None, k=nkey: k)
        monkeypatch.setattr("estimators.randomness.noise_key", lambda rng=None, k=nkey: k)
        row = np.array([v], dtype=np.uint64)
        trial = sdk._copy_state(st)
        want = proto.randomize(row, None, state=trial)
        last = sdk._open_last(proto, row, trial)
        assert len(last) == 10 and np.array_equal(sdk._open_frozen(proto, last), want)


def test_the_budget_says_what_it_memoizes_at_construction(tmp_path, caplog):
    """budget_eps=10 on the demo campaign: 4 memo slots in all when the attributes report in turn (the issue's
    "fully reserved after 3 reports" came without a word); the plan is logged and kept on the device."""
    with caplog.at_level(logging.INFO, logger="producers.sdk"):
        dev = Device(Campaign.load(DEMO), tmp_path / "dev", budget_eps=10.0)
    plan = dev.budget_plan
    assert plan in caplog.text
    assert "app_version (L-OSUE): its first memoized value reserves 2, each further one 2; alone in the budget it " \
           "could memoize 5 of its 100 possible inputs" in plan
    # the demo's crash_signature (TreeHist, ε = 4) memoizes too: one slot of ε∞ ≈ 4 per new level prefix
    assert "crash_signature (TreeHist): its first memoized value reserves 4, each further one 4; alone in the " \
           "budget it could memoize 2 of its 4096 possible inputs" in plan
    assert "memoize app_version 1, crash_minute 1, opt_in 1, crash_signature 1 value(s) (4 reports reserve 10)" in plan
    # the plan is what happens: four first reports in turn reserve the whole budget
    for attr, value in (("app_version", 1), ("crash_minute", 2), ("opt_in", 0),
                        ("crash_signature", "NullPointerException@Foo.java:42")):
        dev.report(attr, value, t=1)
    assert dev.reserved_loss() == pytest.approx(10.0) and dev.remaining_budget() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="cannot memoize a single value"):
        Device(Campaign.load(DEMO), tmp_path / "small", budget_eps=1.0)




def test_send_retried_after_a_dropped_connection_counts_once_and_never_randomizes_again(local_stack, tmp_path):
    path = unique_campaign_file(E2E, tmp_path)
    campaign = Campaign.load(path)
    app_id = f"send-{uuid.uuid4().hex[:6]}"
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    attr = "app_version"
    proto = campaign.attribute(attr).protocol
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", refresh_seconds=0.2,
                       session_timeout=3.0, run_dir=tmp_path), \
            IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp_path) as ingest:
        proxy = DroppingProxy(ingest.settings.port)
        try:
            dev = Device(campaign, tmp_path / "dev", budget_eps=10.0,
                         ingest_url=f"http://127.0.0.1:{proxy.port}/reports", retries=3, backoff_seconds=0.05)
            t = dev.current_step()
            reply = dev.send(attr, 42, t=t)
        finally:
            proxy.close()
        assert reply == {"accepted": 1}
        first, second = proxy.requests
        assert request_body(first) == request_body(second)  # the same randomized report, not a second randomization
        assert request_header(first, b"idempotency-key") == request_header(second, b"idempotency-key") is not None
        assert dev.memo_slots[attr] == 1  # one report reserved, once
        obj = json.loads(request_body(first))
        support = proto.support(proto.decode(base64.b64decode(obj["payload"])))
        wait_for_counts(redis_url, campaign.id, {(attr, t): (support, 1)}, timeout=30)

        # a refusal that a retry cannot mend is not retried: IngestError at once (a 60 s backoff would show)
        dev2 = Device(campaign, tmp_path / "dev2", budget_eps=10.0, ingest_url=f"{ingest.url}/no-such-path",
                      retries=3, backoff_seconds=60.0)
        started = time.monotonic()
        with pytest.raises(IngestError) as refused:
            dev2.send(attr, 1, t=t)
        assert refused.value.status == 404 and time.monotonic() - started < 30
