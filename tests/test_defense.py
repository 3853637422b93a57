"""The live poisoning defense (campaign ``defense``; stream_app/defense.py): which attributes may have one, what
the worker counts of a batch, the defended estimate of a step, the count store's exactly-once report log, and the
attack sent through the real ingest, broker and worker (``ldp experiment poisoning --pipeline``)."""
from __future__ import annotations

import asyncio
import json
import math
import tomllib
import warnings

import numpy as np
import pytest

from estimators import poisoning as P
from estimators.randomness import SimulationWarning
from estimators.registry import make
from stream_app.defense import AttributeDefense
from wire.campaign import Attribute, Campaign, CampaignError

K, EPS = 100, 1.0


def _campaign(attribute: str) -> Campaign:
    return _from_toml(f'[campaign]\nid = "c"\n\n[[attributes]]\nname = "a"\n{attribute}\n')


def _from_toml(text: str) -> Campaign:
    return Campaign.from_dict(tomllib.loads(text))


def _unary(name: str = "OUE"):
    return make(name, k=K, eps=EPS) if name == "OUE" else make(name, k=K, eps_1=EPS, eps_inf=2 * EPS)


@pytest.mark.parametrize("spec, message", [
    ('k = 10\nprotocol = "GRR"\neps = 1.0\ndefense = "itemset"', "GRR has no sound report-level"),
    ('k = 10\nprotocol = "L-GRR"\neps_1 = 1.0\neps_inf = 2.0\ndefense = "plausibility"', "no sound report-level"),
    ('k = 10\nprotocol = "LOLOHA"\neps_1 = 1.0\neps_inf = 2.0\ndefense = "itemset"', "LOLOHA"),
    ('k = 10\nprotocol = "OLH"\neps = 1.0\ndefense = "plausibility"', "applies to unary reports"),
    ('k = 10\nprotocol = "OUE"\neps = 1.0\ndefense = "strict"', "defense must be one of"),
])
def test_only_sound_defenses_are_accepted(spec, message):
    with pytest.raises(CampaignError, match=message):
        _campaign(spec)


def test_a_group_attribute_has_no_defense():
    with pytest.raises(CampaignError, match="only defense"):
        _from_toml('[campaign]\nid = "c"\n\n[[attributes]]\nname = "a"\nk = 4\ndefense = "itemset"\n\n'
                           '[[attributes]]\nname = "b"\nk = 4\n\n[[groups]]\nname = "g"\nsolution = "SPL"\n'
                           'attributes = ["a", "b"]\neps = 1.0\n')


def test_the_defense_is_server_side_not_in_the_fingerprint():
    plain = _campaign('k = 10\nprotocol = "OUE"\neps = 1.0')
    defended = _campaign('k = 10\nprotocol = "OUE"\neps = 1.0\ndefense = "itemset"')
    assert plain.attributes["a"].defense == "none" and defended.attributes["a"].defense == "itemset"
    assert plain.fingerprint == defended.fingerprint
    assert plain.attributes["a"].protocol.fingerprint == defended.attributes["a"].protocol.fingerprint


def _honest(proto, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        weights = np.r_[np.full(10, 0.05), np.full(K - 10, 0.5 / (K - 10))]
        values = rng.choice(K, size=n, p=weights)
        return values, proto.randomize(values, rng, state=proto.new_state(n, rng))


def test_screen_drops_exactly_the_implausible_reports_and_logs_the_rest():
    proto = _unary()
    d = AttributeDefense(Attribute("a", K, proto, defense="itemset"))
    _, honest = _honest(proto, 500, 1)
    fakes = P.craft_reports(proto, "MGA-nopad", np.arange(5), 40, np.random.default_rng(2))  # 5 bits: implausible
    batch = np.concatenate([honest, fakes])
    out = d.screen(batch)
    bad = P.implausible(proto, batch)
    assert bad[500:].all() and out.rejected == int(bad.sum()) >= 40
    assert np.array_equal(out.reports, batch[~bad])
    assert np.array_equal(d.rows(out.log), batch[~bad])
    assert AttributeDefense(Attribute("a", K, proto, defense="plausibility")).screen(batch).log == b""


@pytest.mark.parametrize("name", ["OUE", "L-OSUE"])
def test_the_plausibility_estimate_is_unbiased_on_honest_data(name):
    """Over the kept reports with the kept law (ps', qs'), every frequency within 4.5 standard deviations (the
    variance of the pure law of the kept reports; 100 values, so a family-wise false failure below 1e-3)."""
    proto = _unary(name)
    d = AttributeDefense(Attribute("a", K, proto, defense="plausibility"))
    values, reports = _honest(proto, 40_000, 3)
    out = d.screen(reports)
    est = d.estimate(proto.support(out.reports), len(out.reports), out.rejected)
    truth = np.bincount(values, minlength=K) / len(values)
    chk = d.check
    gamma = chk.kept_qs + truth * (chk.kept_ps - chk.kept_qs)
    sd = np.sqrt(gamma * (1 - gamma) / (est.n * (chk.kept_ps - chk.kept_qs) ** 2))
    assert np.all(np.abs(est.frequencies - truth) <= 4.5 * sd)
    assert est.n + est.rejected == len(values) and est.rejected <= 2  # at most ~1e-6 of honest reports
    assert math.isclose(est.variance, float(np.min(sd) ** 2), rel_tol=0.2)


@pytest.mark.parametrize("name", ["OUE", "L-OSUE"])
def test_the_final_itemset_detection_removes_the_mga_gain(name):
    """n = 20,000, β = 5%, MGA with r = 5 targets: the gain of the counts (provisional estimate) stays near
    Cao et al.'s expected gain, the final one is within 4 standard deviations of the gain estimate's noise."""
    proto = _unary(name)
    d = AttributeDefense(Attribute("a", K, proto, defense="itemset"))
    values, genuine = _honest(proto, 20_000, 4)
    rng = np.random.default_rng(5)
    targets = np.sort(rng.choice(K, size=5, replace=False))
    m = P.fake_count(20_000, 0.05)
    reports = np.concatenate([genuine, P.craft_reports(proto, "MGA", targets, m, rng)])[rng.permutation(20_000 + m)]
    before = proto.estimate(proto.support(genuine), 20_000)
    counts, n, rejected, log = np.zeros(proto.support_size, dtype=np.int64), 0, 0, b""
    for i in range(0, len(reports), 1_000):  # batch by batch, as the worker
        s = d.screen(reports[i:i + 1_000])
        counts, n, rejected, log = counts + proto.support(s.reports), n + len(s.reports), rejected + s.rejected, log + s.log
    provisional = d.estimate(counts, n, rejected)
    final = d.estimate(counts, n, rejected, log)
    f_t = float(np.isin(values, targets).mean())
    expected = P.expected_gain(proto, 0.05, P.target_support(proto, "MGA", 5), 5, f_t)
    assert abs(P.frequency_gain(provisional.frequencies, before, targets) - expected) < 0.1
    assert abs(P.frequency_gain(final.frequencies, before, targets)) <= 4 * _final_gain_sd(proto, 20_000) <= 0.02
    assert final.itemset == tuple(int(x) for x in targets)
    assert final.n + final.rejected == 20_000 + m and final.rejected >= m
    assert final.rejected - m <= 0.01 * 20_000  # genuine reports that supported the whole itemset by chance


def _final_gain_sd(proto, n: int, r: int = 5) -> float:
    """Standard deviation of the defended gain against the genuine estimate: they differ by the genuine reports
    that support the whole itemset by chance (about ``n qs^r``), dropped and compensated on average; each moves
    the r targets' support by one: sd ≈ sqrt(r · n qs^r) / (n (ps − qs))."""
    ps, qs = P.honest_law(proto)
    return math.sqrt(r * n * qs ** r) / (n * (ps - qs))


def test_the_count_store_appends_the_report_log_and_rejections_once(local_stack):
    """A re-sent batch id changes neither the step's ``rejected`` nor its report log (one script)."""
    from stream_app.store import DUPLICATE_BATCH_ID, CountStore

    proto = _unary()
    d = AttributeDefense(Attribute("a", K, proto, defense="itemset"))
    _, honest = _honest(proto, 200, 6)
    fakes = P.craft_reports(proto, "MGA-nopad", np.arange(5), 10, np.random.default_rng(7))
    s = d.screen(np.concatenate([honest, fakes]))

    async def run() -> tuple[int, int, dict, bytes]:
        store = CountStore.from_url(local_stack.info.redis_url)
        try:
            cid = f"defense-{np.random.default_rng().integers(1 << 30)}"
            args = (cid, "a", 3, proto.support(s.reports), len(s.reports), "p:3:a:0")
            first = await store.apply_batch(*args, rejected=s.rejected, reports=s.log)
            again = await store.apply_batch(*args, rejected=s.rejected, reports=s.log)
            return first, again, await store.read_step(cid, "a", 3, proto.support_size), \
                await store.step_reports(cid, "a", 3)
        finally:
            await store.close()

    first, again, state, log = asyncio.run(run())
    assert (first, again) == (1, DUPLICATE_BATCH_ID)
    assert state["n"] == len(s.reports) and state["rejected"] == s.rejected >= 10
    assert log == s.log and np.array_equal(d.rows(log), s.reports)


def test_attacks_through_the_ingest_broker_and_worker(local_stack):
    """``ldp experiment poisoning --pipeline`` at n = 4,000: OUE's MGA gain removed by the live defense (4 standard
    deviations of the gain's noise), GRR's unchanged (no defense), n + n_rejected = the reports sent."""
    from ldpstream_cli.poisoning_pipeline import run_pipeline

    n = 4_000
    rows = {r.protocol: r for r in run_pipeline(["OUE", "GRR"], "MGA", n=n, stack=local_stack, on_status=lambda s: None)}
    oue, grr = rows["OUE"], rows["GRR"]
    sd_gain = _final_gain_sd(_unary(), n)
    assert oue.gain > 0.5 and abs(oue.gain_defended) <= 4 * sd_gain
    assert oue.n_final + oue.rejected_by_worker + oue.refused_at_ingest == n + oue.m
    assert oue.genuine_rejected == 0 and oue.genuine_rejected_attacked <= 0.01 * n
    assert grr.defense == "none" and grr.gain == grr.gain_defended > 1.0


def test_the_ingest_refuses_implausible_reports_one_by_one():
    """The ingest's handler (no services: nothing is published) refuses a compact body holding MGA-nopad reports of
    a defended attribute with 422 ``implausible_report`` and the index of each, and counts them; the same body
    for the attribute without a defense passes the check."""
    from stream_app.ingest.handler import ReportHandler
    from stream_app.ingest.metrics import IngestMetrics
    from wire.compact import CONTENT_TYPE, encode_compact

    c = _from_toml('[campaign]\nid = "c"\n\n[[attributes]]\nname = "plain"\nk = 100\nprotocol = "OUE"\neps = 1.0\n\n'
                   '[[attributes]]\nname = "guarded"\nk = 100\nprotocol = "OUE"\neps = 1.0\ndefense = "plausibility"\n')
    proto = c.attributes["guarded"].protocol
    _, honest = _honest(proto, 50, 8)
    fakes = P.craft_reports(proto, "MGA-nopad", np.arange(5), 7, np.random.default_rng(9))
    rows = np.concatenate([honest, fakes])[np.random.default_rng(10).permutation(57)]
    bad = np.flatnonzero(P.implausible(proto, rows))
    published: list = []

    async def submit(items):  # nothing reaches it when the check refuses
        published.extend(items)

    metrics = IngestMetrics(None)
    handler = ReportHandler({c.id: c}, submit, metrics, authority=None, ledger=None)

    def post(attribute: str):
        body = encode_compact([(c, "plain", 1, honest[:3]), (c, attribute, 1, rows)])

        async def read(limit: int) -> bytes:
            return body
        return asyncio.run(handler.handle({"content-type": CONTENT_TYPE, "content-length": str(len(body))}, read))

    reply = post("guarded")
    doc = json.loads(reply.body)
    assert reply.status == 422 and doc["error"] == "implausible_report" and doc["rejected"] == len(bad) >= 7
    assert [e["index"] for e in doc["errors"]] == [3 + int(i) for i in bad]  # numbered across the sections
    assert published == []
    labels = {"campaign": "c", "attribute": "guarded", "reason": "implausible"}
    assert metrics.rejected_reports_total.labels(**labels)._value.get() == len(bad)
    assert post("plain").status != 422
