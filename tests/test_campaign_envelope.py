"""Campaign files and the batch envelope (wire.campaign, wire.envelope)."""
from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from wire import envelope as E
from wire.campaign import Campaign, CampaignError

DEMO = Path(__file__).parent.parent / "deploy" / "campaigns" / "demo.toml"


@pytest.fixture(scope="module")
def campaign() -> Campaign:
    return Campaign.load(DEMO)


def test_demo_campaign_loads(campaign: Campaign) -> None:
    assert campaign.id == "fleet-health"
    assert set(campaign.attributes) == {"app_version", "crash_minute", "opt_in", "session_seconds", "latency_ms",
                                        "crash_signature", "dark_mode", "country", "device_model"}
    assert campaign.ungrouped == ["app_version", "crash_minute", "opt_in", "session_seconds", "latency_ms",
                                  "crash_signature"]
    crash = campaign.attribute("crash_signature")
    assert crash.open_domain and crash.protocol.name == "TreeHist" and campaign.retention_of(crash) == 6
    assert campaign.attribute("session_seconds").numeric and not campaign.attribute("app_version").numeric
    assert campaign.attribute("crash_minute").protocol.name == "LOLOHA"
    assert campaign.attribute("opt_in").label(1) == "yes"
    assert len(campaign.fingerprint) == 16
    group = campaign.groups["device"]
    assert group.solution.name == "ALLOMFREE" and group.attributes == ("dark_mode", "country", "device_model")
    assert group.solution.ks == (2, 40, 250)
    for j, name in enumerate(group.attributes):  # each grouped attribute's protocol is the solution's view of it
        a = campaign.attribute(name)
        assert a.group == "device" and a.protocol.fingerprint == group.solution.attribute_protocol(j).fingerprint
    assert campaign.attribute("dark_mode").label(1) == "on"


_GROUP_HEAD = "[campaign]\nid='g'\n[[attributes]]\nname='a'\nk=2\n[[attributes]]\nname='b'\nk=5\n"


@pytest.mark.parametrize("text,match", [
    # a budget spent twice: a grouped attribute with its own protocol or eps, or in two groups
    ("[campaign]\nid='g'\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1\n[[attributes]]\nname='b'\nk=5\n"
     "[[groups]]\nname='x'\nsolution='SMP'\nprotocol='GRR'\neps=1\nattributes=['a','b']", "spent twice"),
    ("[campaign]\nid='g'\n[[attributes]]\nname='a'\nk=2\neps=1\n[[attributes]]\nname='b'\nk=5\n"
     "[[groups]]\nname='x'\nsolution='SMP'\nprotocol='GRR'\neps=1\nattributes=['a','b']", "spent twice"),
    (_GROUP_HEAD + "[[groups]]\nname='x'\nsolution='SMP'\nprotocol='GRR'\neps=1\nattributes=['a','b']\n"
     "[[groups]]\nname='y'\nsolution='SPL'\nprotocol='GRR'\neps=1\nattributes=['b','a']", "spent twice"),
    ("[campaign]\nid='g'\n[[attributes]]\nname='a'\nk=2\n[[attributes]]\nname='b'\nk=5\nprotocol='GRR'\neps=1\n"
     "[[groups]]\nname='x'\nsolution='SMP'\nprotocol='GRR'\neps=1\nattributes=['a','c']", "undeclared"),
    (_GROUP_HEAD + "[[groups]]\nname='x'\nsolution='SMP'\nprotocol='GRR'\neps=1\nattributes=['a']", "at least 2"),
    (_GROUP_HEAD + "[[groups]]\nname='x'\nsolution='NOPE'\neps=1\nattributes=['a','b']", "group 'x'"),
    (_GROUP_HEAD + "[[groups]]\nname='x'\nsolution='SMP'\nprotocol='GRR'\nattributes=['a','b']", "group 'x'"),
    # fake data must say which epsilon it means (the paper's amplification is the epsilon of one attribute)
    (_GROUP_HEAD + "[[groups]]\nname='x'\nsolution='RS+FD'\nprotocol='GRR'\neps=1\nattributes=['a','b']",
     "amplification"),
    (_GROUP_HEAD + "[[groups]]\nname='x'\nsolution='ALLOMFREE'\neps_inf=2\neps_1=1\nfake_data=true\n"
     "attributes=['a','b']", "amplification"),
    ("[campaign]\nid='g'\n[[attributes]]\nname='a'\nk=2\n", "needs a protocol"),
])
def test_bad_groups_are_refused(text: str, match: str) -> None:
    with pytest.raises(CampaignError, match=match):
        Campaign.from_dict(tomllib.loads(text))


def test_a_group_with_fake_data_states_its_amplification() -> None:
    base = _GROUP_HEAD + "[[groups]]\nname='x'\nsolution='RS+FD'\nprotocol='GRR'\neps=1\nattributes=['a','b']\n"
    paper = Campaign.from_dict(tomllib.loads(base + "amplification='paper'"))
    none = Campaign.from_dict(tomllib.loads(base + "amplification='none'"))
    # the published tuple-level epsilon: amplified with the paper's budget, the stated one without
    assert paper.attribute("a").protocol.eps_first == pytest.approx(np.log(2 * (np.e - 1) + 1))
    assert none.attribute("a").protocol.eps_first == pytest.approx(1.0)
    assert paper.fingerprint != none.fingerprint


@pytest.mark.parametrize("text,match", [
    ("", "needs a \\[campaign\\]"),
    ("[campaign]\nid='x y'\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1", "campaign id"),
    ("[campaign]\nid='x'\n", "at least one"),
    ("[campaign]\nid='x'\n[[attributes]]\nname='a'\nk=2\nprotocol='NOPE'\neps=1", "unknown protocol"),
    ("[campaign]\nid='x'\n[[attributes]]\nname='a'\nk=10\nprotocol='L-OUE'\neps_inf=1\neps_1=0.9", "cannot reach"),
    ("[campaign]\nid='x'\nbogus=1\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1", "unknown \\[campaign\\] keys"),
    ("[campaign]\nid='x'\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1\nlabels=['x']", "labels"),
    ("[campaign]\nid='x'\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1", "twice"),
    ("not toml [", "cannot read"),
])
def test_bad_campaigns(tmp_path, text: str, match: str) -> None:
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(CampaignError, match=match):
        Campaign.load(p)


def test_envelope_roundtrip_zero_copy(campaign: Campaign) -> None:
    proto = campaign.attribute("app_version").protocol
    rng = np.random.default_rng(0)
    reports = proto.randomize(rng.integers(0, 100, 500), rng, state=proto.new_state(500, rng=rng))
    blob = E.pack_reports(campaign, "app_version", 7, reports, batch_id="p:7:app_version:0")
    env = E.parse(blob)
    assert (env.kind, env.campaign, env.attribute, env.t, env.count) == (E.REPORTS, "fleet-health", "app_version", 7, 500)
    assert env.key == b"7:app_version"
    assert E.validate(env, {campaign.id: campaign}) is campaign
    out = E.decode_reports(env, campaign)
    np.testing.assert_array_equal(out, reports)
    assert not out.flags.owndata  # a view of the message bytes


def test_watermark(campaign: Campaign) -> None:
    env = E.parse(E.pack_watermark(campaign, "opt_in", 3))
    assert env.kind == E.WATERMARK and env.t == 3 and env.count == 0


def _reason(blob: bytes, campaigns) -> str:
    with pytest.raises(E.EnvelopeError) as info:
        env = E.parse(blob)
        c = E.validate(env, campaigns)
        E.decode_reports(env, c)
    return info.value.reason


def test_a_batch_of_reports_without_batch_id_is_rejected(campaign: Campaign) -> None:
    proto = campaign.attribute("opt_in").protocol
    rng = np.random.default_rng(2)
    reports = proto.randomize(rng.integers(0, 2, 10), rng, state=proto.new_state(10, rng=rng))
    blob = E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 10, proto.encode(reports))
    assert _reason(blob, {campaign.id: campaign}) == "missing_batch_id"
    with pytest.raises(TypeError):
        E.pack_reports(campaign, "opt_in", 0, reports)  # type: ignore[call-arg]  # the id is required
    assert E.message_ident(E.parse(E.pack_watermark(campaign, "opt_in", 3))) == "wm:opt_in:3"


def test_every_bad_batch_has_a_reason(campaign: Campaign) -> None:
    cs = {campaign.id: campaign}
    proto = campaign.attribute("opt_in").protocol
    rng = np.random.default_rng(1)
    reports = proto.randomize(rng.integers(0, 2, 100), rng, state=proto.new_state(100, rng=rng))
    good = E.pack_reports(campaign, "opt_in", 0, reports, batch_id="p:0:opt_in:0")
    assert _reason(good[:-3], cs) == "truncated"
    assert _reason(good[:10], cs) == "malformed"
    assert _reason(b"\x00garbage" * 10, cs) == "malformed"
    assert _reason(good[:4] + bytes([9]) + good[5:], cs) == "bad_version"
    assert _reason(E.pack("nope", "opt_in", proto.name, proto.fingerprint, 0, 100, proto.encode(reports)), cs) == "unknown_campaign"
    assert _reason(E.pack(campaign.id, "nope", proto.name, proto.fingerprint, 0, 100, proto.encode(reports)), cs) == "unknown_attribute"
    assert _reason(E.pack(campaign.id, "opt_in", "GRR", proto.fingerprint, 0, 100, proto.encode(reports)), cs) == "wrong_protocol"
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, "00" * 8, 0, 100, proto.encode(reports)), cs) == "wrong_fingerprint"
    bad = reports.copy()
    bad[0] = 5  # out of the domain [0, 2)
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 100, proto.encode(bad), batch_id="b"), cs) == "bad_payload"
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 99, proto.encode(reports), batch_id="b"), cs) == "bad_payload"
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 2_000_000, b"", batch_id="b"), cs) == "oversized"


def test_a_time_step_whose_wall_clock_number_overflows_the_wire_is_refused() -> None:
    """A report without ``t`` gets ``floor(now / time_step_seconds)``: below 1 s steps it exceeds the u32 ``t``."""
    text = "[campaign]\nid='x'\ntime_step_seconds={}\n[[attributes]]\nname='a'\nk=2\nprotocol='GRR'\neps=1"
    with pytest.raises(CampaignError, match="32-bit"):
        Campaign.from_dict(tomllib.loads(text.format(0.1)))
    assert Campaign.from_dict(tomllib.loads(text.format(1.0))).time_step_seconds == 1.0
