"""Campaign files and the batch envelope (wire.campaign, wire.envelope)."""
from __future__ import annotations

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
    assert set(campaign.attributes) == {"app_version", "crash_minute", "opt_in"}
    assert campaign.attribute("crash_minute").protocol.name == "LOLOHA"
    assert campaign.attribute("opt_in").label(1) == "yes"
    assert len(campaign.fingerprint) == 16


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
    blob = E.pack_reports(campaign, "app_version", 7, reports)
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


def test_every_bad_batch_has_a_reason(campaign: Campaign) -> None:
    cs = {campaign.id: campaign}
    proto = campaign.attribute("opt_in").protocol
    rng = np.random.default_rng(1)
    reports = proto.randomize(rng.integers(0, 2, 100), rng, state=proto.new_state(100, rng=rng))
    good = E.pack_reports(campaign, "opt_in", 0, reports)
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
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 100, proto.encode(bad)), cs) == "bad_payload"
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 99, proto.encode(reports)), cs) == "bad_payload"
    assert _reason(E.pack(campaign.id, "opt_in", proto.name, proto.fingerprint, 0, 2_000_000, b""), cs) == "oversized"
