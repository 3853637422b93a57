"""Device SDK and HTTP ingest for campaign groups (issue 9): ``Device.report_group`` / ``send_group``.

A group's attributes are randomized together by its multidimensional solution under one budget: the
device sends what the solution sends (one sampled attribute, or every attribute with fake data), keeps
the solution's state in ``<group>.group.npz``, reserves one group step per report (refusals on the
schedule only) and the reports go through ``POST /reports`` into the per-attribute counts.
"""
from __future__ import annotations

import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import producers.sdk as sdk
from ldpstream_dev.workers import IngestProcess, WorkerProcess, unique_campaign_file, wait_for_counts
from estimators import MultiState, make_solution
from estimators.errors import LDPError
from producers.sdk import BudgetExceeded, Device, DeviceStateError, IngestError
from wire.campaign import Campaign, CampaignError
from wire.single_report import decode_single_report

pytestmark = pytest.mark.timeout(120)

DATA = Path(__file__).parent / "data"
KS = (4, 6, 8)
NAMES = ("os", "lang", "size")
LEVEL = {"name": "level", "k": 8, "protocol": "L-GRR", "eps_inf": 1.0, "eps_1": 0.5}
CLICK = {"name": "click", "k": 4, "protocol": "GRR", "eps": 0.5}

# solution parameters of a group over NAMES; "sample": SMP-like (one attribute per report)
SOLUTIONS = {
    "SPL": ({"solution": "SPL", "protocol": "GRR", "eps": 2.0}, False),
    "SMP": ({"solution": "SMP", "protocol": "OUE", "eps": 1.0}, True),
    "RS+FD-GRR": ({"solution": "RS+FD", "protocol": "GRR", "eps": 1.0, "amplification": "paper"}, False),
    "RS+FD-OUE-z": ({"solution": "RS+FD", "protocol": "OUE-z", "eps": 1.0, "amplification": "paper"}, False),
    "RS+FD-OUE-r": ({"solution": "RS+FD", "protocol": "OUE-r", "eps": 1.0, "amplification": "none"}, False),
    "RS+FD-ADP": ({"solution": "RS+FD", "protocol": "ADP", "eps": 1.0, "amplification": "paper"}, False),
    "L-SPL": ({"solution": "L-SPL", "protocol": "L-OSUE", "eps_inf": 3.0, "eps_1": 1.5}, False),
    "L-SMP": ({"solution": "L-SMP", "protocol": "L-GRR", "eps_inf": 2.0, "eps_1": 1.0}, True),
    "L-SMP-per-step": ({"solution": "L-SMP", "protocol": "LOLOHA", "eps_inf": 2.0, "eps_1": 1.0,
                        "sampling": "per-step"}, True),
    "ALLOMFREE": ({"solution": "ALLOMFREE", "eps_inf": 2.0, "eps_1": 1.0}, True),
    "ALLOMFREE-fake": ({"solution": "ALLOMFREE", "eps_inf": 2.0, "eps_1": 1.0, "fake_data": True,
                        "amplification": "paper"}, False),
    "L-RS+FD": ({"solution": "L-RS+FD", "protocol": "L-GRR", "eps_inf": 2.0, "eps_1": 1.0,
                 "amplification": "none"}, False),
}


def _campaign(group: dict, *extra: dict, cid: str = "sdk-groups") -> Campaign:
    attrs = [{"name": n, "k": k} for n, k in zip(NAMES, KS)] + list(extra)
    return Campaign.from_dict({"campaign": {"id": cid}, "attributes": attrs,
                               "groups": [{"name": "g", "attributes": list(NAMES), **group}]})


def _state(dev: Device) -> MultiState:
    return MultiState.load(dev.state_path / "g.group.npz", solution=dev.campaign.groups["g"].solution)


def _files(dev: Device) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dev.state_path.iterdir()) if p.name != ".lock"}


@pytest.mark.parametrize("name", list(SOLUTIONS))
def test_report_group_sends_what_the_solution_sends(tmp_path, name):
    spec, sampled_only = SOLUTIONS[name]
    camp = _campaign(spec)
    sol = camp.groups["g"].solution
    dev = Device(camp, tmp_path / "dev", budget_eps=None)
    rng = np.random.default_rng(1)
    for t in range(4):
        values = {n: int(rng.integers(k)) for n, k in zip(NAMES, KS)}
        objs = dev.report_group("g", values, t=t)
        st = _state(dev)
        if sampled_only:  # the one attribute the device sampled (fixed for life, or re-drawn per step)
            assert [o["attribute"] for o in objs] == [NAMES[int(st.sampled[0])]]
        else:  # every attribute, in the group's order
            assert [o["attribute"] for o in objs] == list(NAMES)
        for o in objs:  # each object is a valid single report of the attribute's server view
            rep = decode_single_report(o, {camp.id: camp})
            assert (rep.attribute, rep.t, len(rep.reports)) == (o["attribute"], t, 1)
            assert camp.attribute(o["attribute"]).protocol.support(rep.reports).sum() >= 0
        assert dev.group_steps("g") == t + 1
        assert dev.privacy_loss() <= dev.reserved_loss() + 1e-9
    st = _state(dev)
    if sol.layout == "split":
        assert st.reported[0].tolist() == [4, 4, 4]
    else:  # real data for one attribute per step
        assert int(st.reported[0].sum()) == 4
        if sol.sampling == "fixed":
            assert st.reported[0, int(st.sampled[0])] == 4
    # accounting: the solution's own figures on the saved state
    expected = sol.loss_bound(4) if sol.longitudinal else 4 * sol.eps_first
    assert dev.reserved_loss(group="g") == pytest.approx(expected)
    actual = float(sol.longitudinal_loss(st)[0]) if sol.longitudinal else expected
    assert dev.privacy_loss(group="g") == pytest.approx(actual)


def test_values_and_names_are_checked_before_anything_is_spent(tmp_path):
    camp = _campaign(SOLUTIONS["ALLOMFREE"][0], LEVEL)
    dev = Device(camp, tmp_path / "dev", budget_eps=10.0)
    dev.report_group("g", [1, 2, 3], t=0)
    before = _files(dev)
    bad = [({"os": 1, "lang": 2}, r"missing \['size'\]"),
           ({"os": 1, "lang": 2, "size": 3, "level": 0}, r"unknown \['level'\]"),
           ({"os": 4, "lang": 2, "size": 3}, r"value 4 of 'os' is outside the domain \[0, 4\)"),
           ([1, 2, -1], r"value -1 of 'size' is outside"),
           ([1, 2], "needs 3 values"),
           ([1, 2.5, 3], "value 2.5 of 'lang' must be an index or a label"),
           ("123", "must be a dict")]
    for values, msg in bad:
        with pytest.raises(LDPError, match=msg):
            dev.report_group("g", values, t=1)
    with pytest.raises(CampaignError, match="no group 'h'"):
        dev.report_group("h", [1, 2, 3], t=1)
    with pytest.raises(LDPError, match="time step"):
        dev.report_group("g", [1, 2, 3], t=-1)
    # grouped attributes are reported through their group only
    for call in (lambda: dev.report("lang", 1, t=1), lambda: dev.randomize("lang", 1),
                 lambda: dev.memoized_count("lang"), lambda: dev.privacy_loss("lang")):
        with pytest.raises(LDPError, match=r"group 'g' \(ALLOMFREE.*report_group"):
            call()
    assert _files(dev) == before and dev.group_steps("g") == 1
    # numpy integers, a numpy row and a dict in any order are the same tuple
    dev.report_group("g", np.array([1, 2, 3]), t=1)
    dev.report_group("g", {"size": np.int64(3), "os": 1, "lang": 2}, t=2)
    assert dev.group_steps("g") == 3


def test_group_state_persists_and_reloads_to_the_same_memoized_responses(tmp_path):
    """dBitFlipPM has no IRR round: a memoized response is repeated exactly, so the reports of a
    reloaded device equal the first device's, bit for bit, for the sampled and the fake attributes."""
    for name, spec in {"L-SMP": {"solution": "L-SMP"},
                       "L-RS+FD": {"solution": "L-RS+FD", "amplification": "none"}}.items():
        camp = _campaign({**spec, "protocol": "dBitFlipPM", "eps_inf": 2.0, "protocol_params": {"b": 4, "d": 4}})
        path = tmp_path / name
        with Device(camp, path) as dev:
            first = dev.report_group("g", [3, 5, 7], t=0)
            saved = _state(dev)
        with Device(camp, path) as dev:  # a new process would do the same: load and check the file
            again = dev.report_group("g", [3, 5, 7], t=1)
            loaded = _state(dev)
        assert [(o["attribute"], o["payload"]) for o in first] == [(o["attribute"], o["payload"]) for o in again]
        assert saved.fingerprint == loaded.fingerprint == camp.groups["g"].solution.fingerprint
        for a, b in zip(saved.memos, loaded.memos):
            np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(saved.sampled, loaded.sampled)
        assert loaded.reported.sum() == 2 * saved.reported.sum()
    # a state of another solution, or of several devices, in place of a group file the ledger says
    # reported, is refused when the group reports (nothing sent), naming the file
    camp = _campaign(SOLUTIONS["L-SMP"][0])
    other = make_solution("L-SMP", ks=list(KS), protocol="L-GRR", eps_inf=1.0, eps_1=0.5)
    for name, st, match in [("other", other.new_state(1), "belongs to solution"),
                            ("two", camp.groups["g"].solution.new_state(2), "holds 2 devices")]:
        with Device(camp, tmp_path / name) as dev:
            dev.report_group("g", [1, 2, 3], t=0)
        st.save(tmp_path / name / "g.group.npz")
        with Device(camp, tmp_path / name) as dev, pytest.raises(DeviceStateError, match=match):
            dev.report_group("g", [1, 2, 3], t=1)
    # state files without the device's identity and ledger are refused when the Device is built
    (tmp_path / "bare").mkdir()
    other.new_state(1).save(tmp_path / "bare" / "g.group.npz")
    with pytest.raises(DeviceStateError, match="device.json is missing"):
        Device(camp, tmp_path / "bare")


def _run(dev: Device, schedule: list[tuple[str, object]]) -> list[str]:
    """Report each step of the schedule at t = its index; 'sent' or 'refused' per step; on a refusal
    nothing in the state directory changes."""
    out = []
    for t, (unit, value) in enumerate(schedule):
        before = _files(dev)
        try:
            if unit == "g":
                dev.report_group("g", value, t=t)
            else:
                dev.report(unit, value, t=t)
            out.append("sent")
        except BudgetExceeded:
            assert _files(dev) == before
            out.append("refused")
        assert dev.privacy_loss() <= dev.reserved_loss() + 1e-9
        assert dev.reserved_loss() <= dev.budget_eps + 1e-9
    return out


@pytest.mark.parametrize("spec,other", [(SOLUTIONS["ALLOMFREE"][0], LEVEL), (SOLUTIONS["L-SPL"][0], LEVEL),
                                        (SOLUTIONS["RS+FD-ADP"][0], CLICK)], ids=["ALLOMFREE", "L-SPL", "RS+FD"])
def test_group_refusals_do_not_depend_on_values(tmp_path, spec, other):
    camp = _campaign(spec, other)
    sol = camp.groups["g"].solution
    budget = 2.5 * float(sol.loss_bound(1) if sol.longitudinal else sol.eps_first) + 1.2
    outcomes, devs = {}, {}
    for case in ("constant", "changing"):
        dev = Device(camp, tmp_path / case, budget_eps=budget)
        schedule = []
        for i in range(8):
            tup = [0, 0, 0] if case == "constant" else [i % 4, i % 6, i % 8]
            schedule += [("g", tup), (other["name"], 0 if case == "constant" else i % 4)]
        outcomes[case], devs[case] = _run(dev, schedule), dev
    assert outcomes["constant"] == outcomes["changing"]
    assert outcomes["constant"][0::2] == ["sent"] * 2 + ["refused"] * 6  # group steps: the third does not fit
    for case, dev in devs.items():
        st = _state(dev)
        assert dev.group_steps("g") == 2
        if sol.longitudinal:  # direct computation: the channels' losses of the inputs memoized from real data
            rows = [j for j in range(3) if st.reported[0, j]]
            distinct = 1 if case == "constant" else 2
            direct = sum(float(sol.channels[j].longitudinal_loss(distinct)) for j in rows)
            assert dev.privacy_loss(group="g") == pytest.approx(direct)
            assert dev.reserved_loss(group="g") == pytest.approx(float(sol.loss_bound(2)))
        else:
            assert dev.privacy_loss(group="g") == dev.reserved_loss(group="g") == pytest.approx(2 * sol.eps_first)
    if sol.longitudinal:  # a constant tuple memoizes less than a changing one, invisibly
        assert devs["constant"].privacy_loss(group="g") < devs["changing"].privacy_loss(group="g")


def test_send_group_posts_one_request(tmp_path, monkeypatch):
    camp = _campaign(SOLUTIONS["RS+FD-GRR"][0])
    posted = []
    monkeypatch.setattr(sdk, "post_report", lambda url, obj, timeout=10.0, **kw: posted.append((url, obj)) or {"accepted": 3})
    dev = Device(camp, tmp_path / "dev", ingest_url="http://ingest.invalid/reports")
    assert dev.send_group("g", [0, 1, 2], t=5) == {"accepted": 3}
    [(url, objs)] = posted
    assert url == "http://ingest.invalid/reports" and [o["attribute"] for o in objs] == list(NAMES)
    assert json.loads(json.dumps(objs)) == objs and {o["t"] for o in objs} == {5}
    with pytest.raises(IngestError, match="no ingest_url"):
        Device(camp, tmp_path / "dev2").send_group("g", [0, 1, 2], t=5)


# ---------------------------------------------------------------------------- through the real stack
DEVICES, STEPS = 250, 2


def test_group_reports_through_http_ingest(local_stack, tmp_path, monkeypatch) -> None:
    """ALLOMFREE and RS+FD devices send their group reports through the ingest's POST /reports (half one object per
    request, half with send_group's one request per step): the Redis counts and n of every attribute
    equal the offline support of exactly the reports sent."""
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    app_id = f"sdkg-{uuid.uuid4().hex[:6]}"
    paths = [unique_campaign_file(DATA / name, tmp_path) for name in ("allomfree.toml", "rsfd.toml")]
    campaigns = {c.id: c for c in map(Campaign.load, paths)}
    sent: list[dict] = []
    lock = threading.Lock()
    real_post = sdk.post_report

    def recording_post(url: str, obj, timeout: float = 10.0, **kw) -> dict:
        reply = real_post(url, obj, timeout, **kw)
        with lock:
            sent.extend(obj if isinstance(obj, list) else [obj])
        return reply

    monkeypatch.setattr(sdk, "post_report", recording_post)  # send_group posts through it too

    def run_device(campaign: Campaign, seed: int, i: int, url: str) -> None:
        group = next(iter(campaign.groups.values()))
        rng = np.random.default_rng([seed, i])  # the values; the device's randomness is the OS CSPRNG
        with Device(campaign, tmp_path / campaign.id / f"d{i}", budget_eps=10.0, ingest_url=url) as dev:
            for t in range(STEPS):
                values = {a: int(rng.zipf(1.5) - 1) % campaign.attribute(a).k for a in group.attributes}
                if i % 2:
                    dev.send_group(group.name, values, t=t)
                else:
                    for obj in dev.report_group(group.name, values, t=t):
                        recording_post(url, obj)

    with WorkerProcess(paths, boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", refresh_seconds=0.2,
                       session_timeout=3.0, run_dir=tmp_path) as w, \
            IngestProcess(paths, boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp_path) as ingest:
        w.wait_ready(timeout=90)
        url = f"{ingest.url}/reports"
        with ThreadPoolExecutor(16) as pool:  # one thread per device at a time: a Device is not shared
            for f in [pool.submit(run_device, c, seed, i, url) for seed, c in enumerate(campaigns.values())
                      for i in range(DEVICES)]:
                f.result()
        # a payload that the attribute's view cannot decode is refused, never counted
        wrong = next(o for o in sent if o["attribute"] == "dark_mode")  # an L-GRR report, as the L-OSUE "screen"
        with pytest.raises(IngestError, match="HTTP 400.*truncated"):
            real_post(url, {**wrong, "attribute": "screen"})
        expected: dict[str, dict[tuple[str, int], tuple[np.ndarray, int]]] = {}
        for o in sent:
            c = campaigns[o["campaign"]]
            rep = decode_single_report(o, campaigns)
            view = c.attribute(rep.attribute).protocol
            counts, n = expected.setdefault(c.id, {}).get((rep.attribute, rep.t), (0, 0))
            expected[c.id][(rep.attribute, rep.t)] = (counts + view.support(rep.reports), n + 1)
        for cid, exp in expected.items():
            wait_for_counts(redis_url, cid, exp, timeout=30)
            c = campaigns[cid]
            group = next(iter(c.groups.values()))
            ns = [[exp.get((m, t), (None, 0))[1] for m in group.attributes] for t in range(STEPS)]
            if group.solution.layout == "sample":  # ALLOMFREE: one sampled attribute per device, fixed for life
                assert sum(ns[0]) == DEVICES and min(ns[0]) > 0 and all(row == ns[0] for row in ns), ns
            else:  # RS+FD: every device reports every attribute
                assert ns == [[DEVICES] * group.solution.d] * STEPS, ns
    assert set(campaigns) == set(expected)
