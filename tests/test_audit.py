"""Empirical privacy audit (estimators/audit.py): no protocol leaks more than its stated ε1,
ε∞ (the memoized PRR round) or accounted longitudinal ε (a device's sequence of reports); the
audit is tight for GRR and L-GRR, it catches deliberately leaky protocols in every round, and
its Clopper-Pearson bounds match known values."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

import estimators
from estimators.audit import (CHUNK_BYTES, DEFAULT_TRIALS, ROUNDS, AuditResult, audit, audit_longitudinal,
                              clopper_pearson, cp_lower, cp_upper, default_audit_cases, eps_interval,
                              eps_lower_bound, eps_lower_bound_events, eps_point_estimate, format_results,
                              longitudinal_pairs, plan_audit_cases, plan_round)
from estimators.base import FrequencyProtocol
from estimators.direct import GRR, LGRR
from estimators.errors import LDPError
from estimators.registry import _REGISTRY

K = 8
PLAN = plan_audit_cases(K)


def _case_id(case: tuple[str, dict]) -> str:
    name, params = case
    return name + "[" + ",".join(f"{k}={v}" for k, v in params.items() if k != "k") + "]"


# ---------------------------------------------------------------- (1) no protocol leaks more than stated
def test_default_cases_cover_every_registered_protocol() -> None:
    covered = {name for name, _ in PLAN.cases}
    missing = [n for n in estimators.PROTOCOLS if n not in covered]
    reasons = "; ".join(f"{s.name} {s.params}: {s.reason}" for s in PLAN.skipped)
    assert not missing, f"protocols without an audit case: {missing} ({reasons})"
    assert not PLAN.skipped, f"default cases that could not be built: {reasons}"


def test_default_cases_include_both_calibrations_and_loloha_g2() -> None:
    cals = {(n, p.get("calibration")) for n, p in PLAN.cases}
    for name in ("L-GRR", "LOLOHA"):
        if name in estimators.PROTOCOLS:
            assert {(name, "exact"), (name, "paper")} <= cals
    if "LOLOHA" in estimators.PROTOCOLS:
        assert any(n == "LOLOHA" and p.get("g") == 2 for n, p in PLAN.cases)
        assert any(n == "LOLOHA" and "g" not in p for n, p in PLAN.cases)
    assert default_audit_cases(K) == PLAN.cases


@pytest.mark.parametrize("case", PLAN.cases, ids=[_case_id(c) for c in PLAN.cases])
def test_no_protocol_leaks_more_than_stated(case: tuple[str, dict]) -> None:
    name, params = case
    proto = estimators.make(name, **params)
    r = audit(proto, v1=0, v2=1, trials=200_000, seed=11)
    assert r.protocol == name and r.trials == 200_000
    assert 0 <= r.hits1 <= r.trials and 0 <= r.hits2 <= r.trials
    assert r.eps_theory == pytest.approx(proto.eps_first)
    assert r.eps_lower <= r.eps_theory, (
        f"{proto!r} leaks: ε_LB = {r.eps_lower:.4f} > ε1 = {r.eps_theory:.4f} "
        f"(hits {r.hits1}/{r.hits2}, ε̂ = {r.eps_hat:.4f})")
    assert r.passed


# ---------------------------------------------------------------- (2) tightness
def test_grr_audit_is_tight() -> None:
    """The issue's requirement: GRR at ε = 1, k = 2, 10^6 trials certifies ε_LB >= 0.8 ε."""
    r = audit(estimators.make("GRR", k=2, eps=1.0), trials=1_000_000, seed=3)
    assert r.passed
    assert r.eps_lower >= 0.8 * 1.0
    assert r.tightness >= 0.8
    lo, hi = r.eps_hat_ci
    assert lo <= 1.0 <= hi
    assert lo <= r.eps_hat <= hi and r.eps_lower <= lo + 1e-12  # one-sided bound below the two-sided one


def test_memoizing_audit_uses_a_new_device_per_trial() -> None:
    """For L-GRR the event rate under v1 is ps (one PRR+IRR per fresh device), so ε̂ estimates ε1, not ε∞."""
    proto = estimators.make("L-GRR", k=2, eps_inf=2.0, eps_1=1.0)
    n = 400_000
    r = audit(proto, trials=n, seed=5, chunk=150_000)
    sd1 = math.sqrt(proto.ps * (1 - proto.ps) / n)
    sd2 = math.sqrt(proto.qs * (1 - proto.qs) / n)
    assert abs(r.p1_hat - proto.ps) < 4 * sd1
    assert abs(r.p2_hat - proto.qs) < 4 * sd2
    assert r.eps_hat_ci[0] <= proto.eps_first <= r.eps_hat_ci[1]
    assert r.passed and r.tightness > 0.8


# ---------------------------------------------------------------- (3) the audit can fail
class LeakyGRR(GRR):
    """GRR that runs at its real ε but claims half of it."""

    @property
    def eps_first(self) -> float:
        return 0.5 * super().eps_first


class LeakyLGRR(LGRR):
    """L-GRR whose claimed ε1 is 80% of its true single-report ε."""

    @property
    def eps_first(self) -> float:
        return 0.8 * super().eps_first


def test_audit_catches_a_leaky_protocol() -> None:
    r = audit(LeakyGRR(k=2, eps=1.0), trials=200_000, seed=7)
    assert r.eps_theory == pytest.approx(0.5)
    assert r.eps_lower > r.eps_theory
    assert r.passed is False


def test_audit_catches_a_leaky_memoizing_protocol() -> None:
    r = audit(LeakyLGRR(k=4, eps_inf=3.0, eps_1=1.5), trials=500_000, seed=8)
    assert r.passed is False


# ---------------------------------------------------------------- (4) Clopper-Pearson
@pytest.mark.parametrize("c, n, lo, hi", [
    (5, 10, 0.1870860, 0.8129140),     # R: binom.test(5, 10)$conf.int
    (7, 20, 0.1539092, 0.5921885),     # R: binom.test(7, 20)$conf.int
    (1, 100, 0.0002531460, 0.0544593854),
    (0, 10, 0.0, 1 - 0.025 ** 0.1),    # closed form at the edges
    (10, 10, 0.025 ** 0.1, 1.0),
])
def test_clopper_pearson_known_values(c: int, n: int, lo: float, hi: float) -> None:
    got = clopper_pearson(c, n, 0.95)
    assert got[0] == pytest.approx(lo, rel=1e-6, abs=1e-12)
    assert got[1] == pytest.approx(hi, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("c, n", [(1, 7), (37, 100), (499_000, 1_000_000), (3, 1_000_000)])
@pytest.mark.parametrize("alpha", [0.05, 0.0125])
def test_clopper_pearson_defining_property(c: int, n: int, alpha: float) -> None:
    """L solves P(X >= c | L) = α and U solves P(X <= c | U) = α (the CP definition)."""
    lo, hi = cp_lower(c, n, alpha), cp_upper(c, n, alpha)
    assert binom.sf(c - 1, n, lo) == pytest.approx(alpha, rel=1e-6)
    assert binom.cdf(c, n, hi) == pytest.approx(alpha, rel=1e-6)
    assert lo < c / n < hi


def test_one_sided_edges() -> None:
    assert cp_upper(0, 50, 0.05) == pytest.approx(1 - 0.05 ** (1 / 50))
    assert cp_lower(50, 50, 0.05) == pytest.approx(0.05 ** (1 / 50))
    assert cp_lower(0, 50, 0.05) == 0.0 and cp_upper(50, 50, 0.05) == 1.0
    with pytest.raises(LDPError):
        cp_lower(51, 50, 0.05)
    with pytest.raises(LDPError):
        cp_upper(1, 50, 1.5)


def test_lower_bound_is_bonferroni_max_of_event_and_complement() -> None:
    n, c1, c2 = 10_000, 7_000, 3_500
    a = 0.05 / 4
    e = math.log(cp_lower(c1, n, a) / cp_upper(c2, n, a))
    not_e = math.log(cp_lower(n - c2, n, a) / cp_upper(n - c1, n, a))
    assert eps_lower_bound(c1, c2, n, 0.95) == pytest.approx(max(e, not_e))
    single = math.log(cp_lower(c1, n, 0.025) / cp_upper(c2, n, 0.025))
    assert eps_lower_bound(c1, c2, n, 0.95, complement=False) == pytest.approx(single)
    # symmetric under exchanging the event and its complement (with v1, v2 swapped)
    assert eps_lower_bound(n - c2, n - c1, n, 0.95) == pytest.approx(max(e, not_e))
    # no evidence (or an event that never fires) gives the trivial bound 0
    assert eps_lower_bound(100, 200, n) == 0.0
    assert eps_lower_bound(0, 0, n) == 0.0
    assert eps_lower_bound(1, 0, n) >= 0.0


def test_point_estimate_and_interval() -> None:
    assert eps_point_estimate(600, 300, 1000) == pytest.approx(math.log(2))
    assert eps_point_estimate(5, 0, 1000) == math.inf
    lo, hi = eps_interval(600, 300, 1000, 0.95)
    l1, u1 = clopper_pearson(600, 1000, 0.975)
    l2, u2 = clopper_pearson(300, 1000, 0.975)
    assert (lo, hi) == pytest.approx((math.log(l1 / u2), math.log(u1 / l2)))


# ---------------------------------------------------------------- API details
def test_progress_callback_and_chunking() -> None:
    calls: list[tuple[int, int]] = []
    r = audit(estimators.make("OUE", k=1024, eps=1.0), v1=3, v2=1000, trials=25_000, seed=1,
              chunk=10_000, on_progress=lambda d, t: calls.append((d, t)))
    assert [d for d, _ in calls] == [10_000, 20_000, 25_000, 35_000, 45_000, 50_000]
    assert all(t == 50_000 for _, t in calls)
    assert (r.v1, r.v2, r.trials) == (3, 1000, 25_000)
    assert r.passed


def test_chunks_respect_the_memory_budget() -> None:
    """SHE at k = 1024 and ε = 1e-3 has 4 KiB reports (int32: clip bound 80001): chunks shrink so
    one chunk stays within CHUNK_BYTES."""
    proto = estimators.make("SHE", k=1024, eps=1e-3)
    assert proto.report_dtype == np.int32
    per = np.dtype(proto.report_dtype).itemsize * int(np.prod(proto.report_shape))
    calls: list[int] = []
    audit(proto, trials=40_000, seed=2, on_progress=lambda d, t: calls.append(d))
    steps = np.diff([0, *calls])
    assert steps.max() * per <= CHUNK_BYTES and len(calls) > 2


def test_audit_is_reproducible_from_its_seed() -> None:
    proto = estimators.make("L-OSUE", k=16, eps_inf=2.0, eps_1=1.0)
    a = audit(proto, trials=20_000, seed=4)
    b = audit(proto, trials=20_000, seed=4)
    assert (a.hits1, a.hits2) == (b.hits1, b.hits2)
    assert isinstance(a, AuditResult) and a.params == proto.params()
    with pytest.raises(Exception):
        a.hits1 = 0  # type: ignore[misc]  # frozen


def test_result_properties() -> None:
    r = AuditResult("GRR", {}, 0, 1, 10, 0.95, 5, 1, 1.6, (0.1, 3.0), 1.0 + 5e-10, 1.0)
    assert r.passed and r.tightness == pytest.approx(1.0)
    r = AuditResult("GRR", {}, 0, 1, 10, 0.95, 5, 1, 1.6, (0.1, 3.0), 1.01, 1.0)
    assert not r.passed


@pytest.mark.parametrize("kwargs", [dict(v1=1, v2=1), dict(v1=0, v2=8), dict(v1=-1, v2=0),
                                    dict(trials=0), dict(confidence=1.0), dict(confidence=0.0)])
def test_bad_arguments_raise(kwargs: dict) -> None:
    with pytest.raises(LDPError):
        audit(estimators.make("GRR", k=8, eps=1.0), **{"trials": 100, **kwargs})


class _BadEvent(GRR):
    def audit_event(self, reports, v1, v2):
        return np.ones(3, dtype=bool)


def test_malformed_audit_event_is_rejected() -> None:
    with pytest.raises(LDPError, match="audit_event"):
        audit(_BadEvent(k=4, eps=1.0), trials=100)


class _Broken(GRR):
    name = "BROKEN-TEST"

    def __init__(self, k: int, eps: float) -> None:
        raise LDPError("this constructor always fails")


class _NeedsSomething(GRR):
    name = "NEEDS-TEST"

    def __init__(self, k: int, eps: float, widget: int) -> None:
        super().__init__(k, eps)


def test_plan_skips_unbuildable_cases_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    for cls in (_Broken, _NeedsSomething):
        monkeypatch.setitem(_REGISTRY, cls.name, cls)
    monkeypatch.setattr(estimators, "PROTOCOLS", (*estimators.PROTOCOLS, _Broken.name, _NeedsSomething.name))
    plan = plan_audit_cases(K)
    skipped = {s.name: s.reason for s in plan.skipped}
    assert "always fails" in skipped["BROKEN-TEST"]
    assert "widget" in skipped["NEEDS-TEST"]
    assert {n for n, _ in plan.cases} >= {n for n, _ in PLAN.cases}



# ================================================================ the PRR and longitudinal rounds
MEMO_CASES = [(n, p) for n, p in PLAN.cases if estimators.make(n, **p).memo_size > 0]
LONGITUDINAL = ("L-GRR", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE", "L-ADP", "LOLOHA", "dBitFlipPM")


def test_every_memoizing_protocol_has_a_prr_case() -> None:
    assert {n for n, _ in MEMO_CASES} == {n for n in LONGITUDINAL if n in estimators.PROTOCOLS}
    built = [(n, estimators.make(n, **p)) for n, p in PLAN.cases]
    jobs, skipped = plan_round(built, "prr")
    assert not skipped and [(j.name, j.proto.params()) for j in jobs] == [
        (n, estimators.make(n, **p).params()) for n, p in MEMO_CASES]
    first, _ = plan_round(built, "first")
    assert len(first) == len(PLAN.cases)
    longi, _ = plan_round(built, "longitudinal", tau=8)
    assert len(longi) == 2 * len(MEMO_CASES)  # constant and switching pair (k = 8)
    assert all(len(j.seq1) == len(j.seq2) == 8 for j in longi)


# ---------------------------------------------------------------- memoized_outputs (the PRR alone)
@pytest.mark.parametrize("case", MEMO_CASES, ids=[_case_id(c) for c in MEMO_CASES])
def test_memoized_outputs_are_the_permanent_first_round(case: tuple[str, dict]) -> None:
    """Inspection marks nothing, is permanent, and the reports are the PRR output re-randomized."""
    name, params = case
    proto = estimators.make(name, **params)
    n = 20_000
    rng = np.random.default_rng(31)
    state = proto.new_state(n, rng=rng)
    v = rng.integers(0, proto.k, n)
    prr = proto.memoized_outputs(v, state)
    assert not state.seen.any()  # works on a copy of ``seen``
    assert prr.dtype == proto.report_dtype and prr.shape == (n, *proto.report_shape)
    proto.validate_reports(prr)
    reports = proto.randomize(v, rng, state=state)
    assert (state.memoized_count() == 1).all()
    np.testing.assert_array_equal(proto.memoized_outputs(v, state), prr)  # permanent
    # a second state (new keys) gives other memoized outputs
    assert not np.array_equal(proto.memoized_outputs(v, proto.new_state(n, rng=rng)), prr)
    if name == "dBitFlipPM":
        np.testing.assert_array_equal(reports, prr)  # no second round: the report IS the PRR
    else:
        assert not np.array_equal(reports, prr)  # the IRR re-randomizes


def test_lgrr_reports_keep_the_prr_output_with_probability_p2() -> None:
    proto = estimators.make("L-GRR", k=8, eps_inf=2.0, eps_1=1.0)
    n = 200_000
    rng = np.random.default_rng(32)
    state = proto.new_state(n, rng=rng)
    v = np.zeros(n, dtype=np.int64)
    prr = proto.memoized_outputs(v, state)
    assert abs(np.mean(prr == 0) - proto.p1) < 4 * math.sqrt(proto.p1 * (1 - proto.p1) / n)
    keep = np.mean(proto.randomize(v, rng, state=state) == prr)
    assert abs(keep - proto.p2) < 4 * math.sqrt(proto.p2 * (1 - proto.p2) / n)


def test_ue_prr_bits_have_the_first_round_probabilities() -> None:
    proto = estimators.make("L-OSUE", k=16, eps_inf=2.0, eps_1=1.0)
    n = 100_000
    state = proto.new_state(n, rng=np.random.default_rng(33))
    prr = np.unpackbits(proto.memoized_outputs(np.full(n, 3), state), axis=1, bitorder="little")[:, :16]
    assert abs(prr[:, 3].mean() - proto.p1) < 4 * math.sqrt(proto.p1 * (1 - proto.p1) / n)
    cold = np.delete(prr, 3, axis=1).mean()
    assert abs(cold - proto.q1) < 4 * math.sqrt(proto.q1 * (1 - proto.q1) / (15 * n))


def test_ladp_memoized_outputs_delegate_to_the_chosen_protocol() -> None:
    for k in (4, 64):  # L-GRR is chosen for small k, L-OSUE for large k
        proto = estimators.make("L-ADP", k=k, eps_inf=2.0, eps_1=1.0)
        state = proto.new_state(1000, rng=np.random.default_rng(34))
        v = np.arange(1000) % k
        mine = proto.memoized_outputs(v, state)
        inner = state.__class__(proto.chosen.fingerprint, state.keys, state.seen, state.memo_size)
        np.testing.assert_array_equal(mine, proto.chosen.memoized_outputs(v, inner))
        assert not state.seen.any()
    with pytest.raises(LDPError):
        proto.memoized_outputs(v, None)


# ---------------------------------------------------------------- (a) PRR round: no leak beyond ε∞
@pytest.mark.parametrize("case", MEMO_CASES, ids=[_case_id(c) for c in MEMO_CASES])
def test_prr_round_passes_for_every_memoizing_protocol(case: tuple[str, dict]) -> None:
    name, params = case
    proto = estimators.make(name, **params)
    r = audit(proto, trials=200_000, seed=12, round="prr")
    assert r.round == "prr" and r.theory_label == "ε∞"
    assert r.eps_theory == pytest.approx(proto.eps_inf)
    assert r.eps_lower <= r.eps_theory, (
        f"{proto!r} PRR leaks: ε_LB = {r.eps_lower:.4f} > ε∞ = {r.eps_theory:.4f} (hits {r.hits1}/{r.hits2})")
    assert r.passed
    assert r.tightness > 0.7  # the PRR event is exact (ratio e^ε∞): the audit is not vacuous
    if proto.eps_first < 0.8 * proto.eps_inf:  # two rounds (dBitFlipPM has one: ε1 = ε∞)
        assert r.eps_lower > proto.eps_first  # it measures the PRR, not one report


# ---------------------------------------------------------------- (b) PRR round: negative control
class UnderstatedPRR(LGRR):
    """L-GRR whose stated ε∞ is 80% of its PRR's true ε."""

    @property
    def eps_inf(self) -> float:
        return 0.8 * super().eps_inf


def test_prr_round_catches_an_understated_eps_inf() -> None:
    proto = UnderstatedPRR(k=4, eps_inf=3.0, eps_1=1.5)
    r = audit(proto, trials=200_000, seed=13, round="prr")
    assert r.eps_theory == pytest.approx(2.4)
    assert r.eps_lower > r.eps_theory
    assert r.passed is False
    # the first round only checks ε1, which this protocol states correctly
    assert audit(proto, trials=200_000, seed=13).passed


# ---------------------------------------------------------------- (e) PRR round: tight for L-GRR
def test_prr_round_is_tight_for_lgrr() -> None:
    """L-GRR, k = 2, 10^6 fresh devices per input: ε_LB within 20% of ε∞."""
    proto = estimators.make("L-GRR", k=2, eps_inf=2.0, eps_1=1.0)
    r = audit(proto, trials=1_000_000, seed=14, round="prr")
    assert r.passed and r.tightness >= 0.8
    n = r.trials
    assert abs(r.p1_hat - proto.p1) < 4 * math.sqrt(proto.p1 * (1 - proto.p1) / n)  # the PRR alone: p1, not ps
    assert abs(r.p2_hat - proto.q1) < 4 * math.sqrt(proto.q1 * (1 - proto.q1) / n)
    assert r.eps_hat_ci[0] <= proto.eps_inf <= r.eps_hat_ci[1]


# ---------------------------------------------------------------- (c) longitudinal round
LONGI_CASES = [("L-GRR", dict(k=8, eps_inf=2.0, eps_1=1.0)),
               ("L-OSUE", dict(k=8, eps_inf=2.0, eps_1=1.0)),
               ("L-SUE", dict(k=8, eps_inf=2.0, eps_1=1.0)),
               ("LOLOHA", dict(k=8, eps_inf=2.0, eps_1=1.0)),
               ("LOLOHA", dict(k=8, eps_inf=2.0, eps_1=1.0, g=2)),
               ("dBitFlipPM", dict(k=8, b=8, d=1, eps_inf=2.0)),
               ("dBitFlipPM", dict(k=8, b=8, d=2, eps_inf=2.0))]


@pytest.mark.parametrize("case", LONGI_CASES, ids=[_case_id(c) for c in LONGI_CASES])
def test_longitudinal_round_passes(case: tuple[str, dict]) -> None:
    name, params = case
    proto = estimators.make(name, **params)
    pairs = longitudinal_pairs(proto.k, 0, 1, tau=16)
    assert len(pairs) == 2
    results = []
    for (s1, s2), memoized in zip(pairs, (1, 2)):
        r = audit_longitudinal(proto, s1, s2, trials=100_000, seed=15)
        results.append(r)
        assert r.round == "longitudinal" and r.seq1 == s1 and r.seq2 == s2
        assert max(r.memoized) == memoized  # read from the memo states
        assert r.eps_accounted == pytest.approx(float(proto.longitudinal_loss(memoized)))
        assert r.accounted_label == f"L(m={memoized})"
        # the claim is the published figure after τ = 16 reports, not the accounted ε
        assert r.eps_theory == proto.longitudinal_bound(16) and r.theory_label == "B(τ=16)"
        assert r.eps_lower <= r.eps_theory, (
            f"{proto!r} {s1} vs {s2}: ε_LB = {r.eps_lower:.4f} > published ε = {r.eps_theory:.4f}")
        assert r.passed
    # the constant pair: the vote over 16 reports recovers most of ε∞ (not vacuous)
    assert results[0].eps_lower > 0.6 * proto.eps_inf
    if name in ("LOLOHA", "dBitFlipPM"):
        # the switching pair: conditioning on the public seed / sampled buckets beats the accounted
        # ε (issue 20.5), not the published bound
        sw = results[1]
        assert sw.event.startswith("seed:") and sw.eps_lower > sw.eps_accounted, sw


def test_longitudinal_round_is_tight_for_lgrr() -> None:
    """Constant sequences, τ = 16: the majority vote recovers the PRR, ε_LB close to ε∞ = 2."""
    proto = estimators.make("L-GRR", k=2, eps_inf=2.0, eps_1=1.0)
    r = audit(proto, trials=200_000, seed=16, round="longitudinal", tau=16)
    assert r.eps_accounted == pytest.approx(proto.eps_inf) and r.memoized == (1, 1)
    # published after 16 reports: min(16, k = 2) ε∞ (any sequence), the vote nears the accounted ε∞
    assert r.eps_theory == pytest.approx(2 * proto.eps_inf)
    assert r.passed and r.eps_lower >= 0.9 * r.eps_accounted
    assert r.eps_lower > 1.5 * proto.eps_first  # far beyond what one report can show


def test_longitudinal_accounting_counts_memo_cells() -> None:
    """LOLOHA memoizes per hash value and dBitFlipPM per bucket: two values in one cell count once."""
    # dBitFlipPM with b = 2 buckets: 0 and 1 share bucket 0, 2 and 3 share bucket 1
    bf = estimators.make("dBitFlipPM", k=4, b=2, d=1, eps_inf=2.0)
    r = audit_longitudinal(bf, (0, 1) * 4, (2, 3) * 4, trials=20_000, seed=17)
    assert r.memoized == (1, 1) and r.eps_accounted == pytest.approx(bf.eps_inf) and r.passed
    assert r.eps_theory == math.inf  # published: b < k, the cases do not follow the values
    # LOLOHA with g = 2 and values that change at every step: at most g memoized inputs
    lo = estimators.make("LOLOHA", k=16, eps_inf=2.0, eps_1=1.0, g=2)
    r = audit_longitudinal(lo, tuple(range(0, 8)), tuple(range(8, 16)), trials=20_000, seed=17)
    assert r.memoized == (2, 2) and r.eps_accounted == pytest.approx(2 * lo.eps_inf) and r.passed
    assert r.eps_theory == pytest.approx(8 * lo.eps_irr)


# ---------------------------------------------------------------- (d) longitudinal: negative controls
class ForgetfulLGRR(LGRR):
    """Re-randomizes its PRR at every report (a new memo state per step, the averaging attack
    memoization exists to prevent) while the caller's state is marked as if it memoized."""

    def randomize(self, values, rng, state=None):
        super().randomize(values, rng, state=state)  # accounting: the state says "one memoized input"
        return super().randomize(values, rng, state=self.new_state(len(values), rng=rng))


class UnderAccountingLGRR(LGRR):
    """Claims ε∞ for a device however many inputs it memoized."""

    def longitudinal_loss(self, memoized):
        return np.where(np.asarray(memoized) > 0, self.eps_inf, 0.0)


def test_longitudinal_round_catches_a_protocol_that_forgets_its_prr() -> None:
    proto = ForgetfulLGRR(k=2, eps_inf=2.0, eps_1=1.0)
    r = audit(proto, trials=50_000, seed=18, round="longitudinal", tau=16)
    assert r.memoized == (1, 1) and r.eps_accounted == pytest.approx(proto.eps_inf)
    assert r.eps_theory == pytest.approx(2 * proto.eps_inf)  # published min(16, k = 2) ε∞
    assert r.eps_lower > r.eps_theory and r.passed is False
    # each report alone is still ε1-LDP and its PRR still ε∞: only the longitudinal round sees it
    assert audit(proto, trials=50_000, seed=18).passed
    assert audit(proto, trials=50_000, seed=18, round="prr").passed


def test_longitudinal_round_catches_under_accounting() -> None:
    proto = UnderAccountingLGRR(k=8, eps_inf=2.0, eps_1=1.0)
    _, switching = longitudinal_pairs(8, 0, 1, tau=16)
    r = audit_longitudinal(proto, *switching, trials=100_000, seed=19)
    assert r.memoized == (2, 2) and r.eps_theory == pytest.approx(proto.eps_inf)  # longitudinal_loss(16)
    assert r.passed is False
    # the same pair against the honest accounting (2 ε∞) passes
    assert audit_longitudinal(LGRR(k=8, eps_inf=2.0, eps_1=1.0), *switching, trials=100_000, seed=19).passed


class SeedBlindLOLOHA(estimators.hashing.LOLOHA):
    """Publishes the accounted ``min(τ, g) ε∞`` (EDBT 2023, Thm. 3.5) as its longitudinal bound."""

    def longitudinal_bound(self, reports):
        return float(self.longitudinal_loss(min(int(reports), self.g)))


def test_longitudinal_round_catches_the_seed_blind_bound() -> None:
    """Issue 20.5: against a server that reads the public hash seed, g ε∞ is not a bound; the
    seed-aware events show it (two values merged by the seed vs split)."""
    proto = SeedBlindLOLOHA(k=8, eps_inf=2.0, eps_1=1.0, g=2)
    _, switching = longitudinal_pairs(8, 0, 1, tau=16)
    r = audit_longitudinal(proto, *switching, trials=100_000, seed=23)
    assert r.eps_theory == pytest.approx(2 * proto.eps_inf) and r.event.startswith("seed:")
    assert r.passed is False


def test_public_cells_read_the_seed_and_the_sampled_buckets() -> None:
    rng = np.random.default_rng(24)
    lo = estimators.make("LOLOHA", k=8, eps_inf=2.0, eps_1=1.0, g=2)
    reps = lo.randomize(np.zeros(500, dtype=np.int64), rng, state=lo.new_state(500, rng=rng))
    assert np.array_equal(lo.public_cells(reps, 3), lo.hash_values(reps, 3))
    bf = estimators.make("dBitFlipPM", k=8, b=4, d=2, eps_inf=2.0)
    reps = bf.randomize(np.zeros(500, dtype=np.int64), rng, state=bf.new_state(500, rng=rng))
    j = reps.astype(np.int64) >> 1
    for v in range(8):
        case = bf.public_cells(reps, v)
        sampled = j == v * 4 // 8
        assert np.array_equal(case == 2, ~sampled.any(axis=1))
        assert np.array_equal(j[np.arange(500), np.minimum(case, 1)][case < 2], np.full((case < 2).sum(), v * 4 // 8))
    assert estimators.make("L-GRR", k=8, eps_inf=2.0, eps_1=1.0).public_cells(reps, 0) is None


# ---------------------------------------------------------------- rounds: API details
def test_longitudinal_bound_is_bonferroni_over_thresholds() -> None:
    proto = estimators.make("L-GRR", k=2, eps_inf=2.0, eps_1=1.0)
    r = audit(proto, trials=20_000, seed=20, round="longitudinal", tau=4)
    c = int(r.event.removeprefix("S>="))
    assert 1 <= c <= 4
    # one event of four thresholds: each CP statement at α / (4 * 4), so below the single-event bound
    assert r.eps_lower < eps_lower_bound(r.hits1, r.hits2, r.trials, r.confidence)
    single, where = eps_lower_bound_events([r.hits1], [r.hits2], r.trials, r.confidence)
    assert where == 0 and single == pytest.approx(eps_lower_bound(r.hits1, r.hits2, r.trials, r.confidence))


def test_eps_lower_bound_events_takes_the_best_event() -> None:
    n = 10_000
    c1, c2 = [6_000, 7_000, 500], [3_000, 2_000, 450]
    lb, i = eps_lower_bound_events(c1, c2, n, 0.95)
    a = 0.05 / 12
    expect = [max(math.log(cp_lower(x, n, a) / cp_upper(y, n, a)),
                  math.log(cp_lower(n - y, n, a) / cp_upper(n - x, n, a))) for x, y in zip(c1, c2)]
    assert i == int(np.argmax(expect)) == 1 and lb == pytest.approx(max(expect))
    with pytest.raises(LDPError):
        eps_lower_bound_events([1, 2], [1], n)


def test_longitudinal_progress_and_reproducibility() -> None:
    proto = estimators.make("L-OUE", k=8, eps_inf=2.0, eps_1=1.0)
    calls: list[tuple[int, int]] = []
    a = audit(proto, trials=5_000, seed=21, round="longitudinal", tau=3, chunk=2_000,
              on_progress=lambda d, t: calls.append((d, t)))
    assert all(t == 2 * 5_000 * 3 for _, t in calls) and calls[-1][0] == 30_000
    assert [d for d, _ in calls][:3] == [2_000, 4_000, 6_000]  # after every step of a chunk
    b = audit(proto, trials=5_000, seed=21, round="longitudinal", tau=3, chunk=2_000)
    assert (a.hits1, a.hits2, a.eps_lower) == (b.hits1, b.hits2, b.eps_lower)


@pytest.mark.parametrize("kwargs, match", [
    (dict(round="third"), "round"),
    (dict(round="longitudinal", seq1=(0, 1)), "both"),
    (dict(round="longitudinal", seq1=(0, 1), seq2=(1,)), "same length"),
    (dict(round="longitudinal", seq1=(0, 0), seq2=(0, 0)), "differ"),
    (dict(round="longitudinal", seq1=(0, 0), seq2=(1, 2)), "same steps"),
    (dict(round="longitudinal", seq1=(0, 9), seq2=(1, 2)), "seq1"),
    (dict(round="prr", seq1=(0, 0), seq2=(1, 1)), "longitudinal round"),
    (dict(round="longitudinal", tau=0), "tau"),
])
def test_round_arguments_are_checked(kwargs: dict, match: str) -> None:
    with pytest.raises(LDPError, match=match):
        audit(estimators.make("L-GRR", k=8, eps_inf=2.0, eps_1=1.0), trials=100, **kwargs)


@pytest.mark.parametrize("rnd", ["prr", "longitudinal"])
def test_memoryless_protocols_have_no_prr_or_longitudinal_round(rnd: str) -> None:
    with pytest.raises(LDPError, match="memoiz"):
        audit(estimators.make("GRR", k=8, eps=1.0), trials=100, round=rnd)


class _NoPRR(LGRR):
    name = "NOPRR-TEST"
    memoized_outputs = FrequencyProtocol.memoized_outputs


def test_memoizing_protocol_without_memoized_outputs_is_skipped_in_the_prr_round() -> None:
    proto = _NoPRR(k=4, eps_inf=2.0, eps_1=1.0)
    jobs, skipped = plan_round([("NOPRR-TEST", proto)], "prr")
    assert not jobs and "memoized_outputs" in skipped[0].reason
    with pytest.raises(LDPError, match="memoized first round"):
        audit(proto, trials=100, round="prr")
    longi, _ = plan_round([("NOPRR-TEST", proto)], "longitudinal")
    assert len(longi) == 2  # the longitudinal round needs only randomize


def test_default_trials_and_rounds() -> None:
    assert ROUNDS == ("first", "prr", "longitudinal")
    assert DEFAULT_TRIALS == {"first": 1_000_000, "prr": 1_000_000, "longitudinal": 200_000}
    assert longitudinal_pairs(8, 0, 1, tau=4) == [((0, 0, 0, 0), (1, 1, 1, 1)), ((0, 0, 2, 2), (1, 1, 3, 3))]
    assert longitudinal_pairs(3, 0, 1, tau=4) == [((0, 0, 0, 0), (1, 1, 1, 1))]  # no spare values


def test_format_results_shows_round_and_claim() -> None:
    proto = estimators.make("L-GRR", k=8, eps_inf=2.0, eps_1=1.0)
    rs = [audit(proto, trials=5_000, seed=22, round=rnd) for rnd in ("first", "prr")]
    rs.append(audit_longitudinal(proto, (0, 0, 2, 2), (1, 1, 3, 3), trials=5_000, seed=22))
    text = format_results(rs)
    lines = text.splitlines()
    assert "round" in lines[0] and "claim" in lines[0] and "tight" in lines[0]
    assert lines[1].split()[0] == "first" and " ε1 " in lines[1]
    assert lines[2].split()[0] == "prr" and " ε∞ " in lines[2]
    assert lines[3].split()[0] == "longitudinal" and "B(τ=4)" in lines[3] and "0x2,2x2 vs 1x2,3x2" in lines[3]
    assert f"{rs[2].eps_theory:.4f}" == "8.0000" and "8.0000" in lines[3]  # published min(4, k) ε∞
    assert "L(m=2)=4.0000" in lines[3] and rs[2].event in lines[3]  # the accounted ε, for comparison


# ---------------------------------------------------------------- the command line
def test_cli_audit_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from ldpstream_cli import cli
    from ldpstream_cli.cli import app

    monkeypatch.setattr(cli.console, "width", 240)  # no wrapping in the tables
    runner = CliRunner()
    ok = runner.invoke(app, ["audit", "L-GRR", "--round", "prr", "--round", "longitudinal", "--trials", "20000",
                             "--tau", "8"])
    assert ok.exit_code == 0, ok.output
    assert "PRR round" in ok.output and "longitudinal round" in ok.output and "first round" not in ok.output
    assert "L(m=2)" in ok.output and "B(τ=8)" in ok.output
    monkeypatch.setitem(_REGISTRY, "LEAKY-PRR", type("LeakyPRR", (UnderstatedPRR,), {"name": "LEAKY-PRR"}))
    bad = runner.invoke(app, ["audit", "LEAKY-PRR", "--round", "prr", "--trials", "200000", "--k", "4",
                              "--eps-inf", "3", "--eps-1", "1.5"])
    assert bad.exit_code == 1, bad.output
    assert "LEAKS MORE THAN STATED" in bad.output
    none = runner.invoke(app, ["audit", "GRR", "--round", "prr", "--trials", "100"])
    assert none.exit_code == 2 and "memoizing" in none.output
    seqs = runner.invoke(app, ["audit", "L-GRR", "--round", "longitudinal", "--seq1", "0,0,2", "--seq2", "1,1,3",
                               "--trials", "5000"])
    assert seqs.exit_code == 0 and "0x2,2x1 vs 1x2,3x1" in seqs.output
    mismatch = runner.invoke(app, ["audit", "L-GRR", "--round", "longitudinal", "--seq1", "0,0", "--seq2", "1,2"])
    assert mismatch.exit_code == 2 and "same steps" in mismatch.output


def test_cli_audit_numeric_mechanisms(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ldp audit NAME` audits a numeric mechanism (tests/test_numeric_audit.py): the event on its output."""
    from typer.testing import CliRunner

    from ldpstream_cli import cli
    from ldpstream_cli.cli import app

    monkeypatch.setattr(cli.console, "width", 240)
    runner = CliRunner()
    ok = runner.invoke(app, ["audit", "Duchi", "--round", "first", "--trials", "20000"])
    assert ok.exit_code == 0, ok.output
    assert "Duchi eps=1.0 lo=-1.0 hi=1.0" in ok.output and "x̂ < 2.15625" in ok.output and "ok" in ok.output
    memo = runner.invoke(app, ["audit", "1BitMean", "--round", "prr", "--gamma", "0.1", "--trials", "20000"])
    assert memo.exit_code == 0 and "PRR round" in memo.output and "gamma=0.1" in memo.output, memo.output
    none = runner.invoke(app, ["audit", "PM", "--round", "prr", "--trials", "100"])
    assert none.exit_code == 2 and "memoizing" in none.output
    same = runner.invoke(app, ["audit", "SW", "--round", "first", "--x1", "0.5", "--x2", "0.5", "--trials", "100"])
    assert same.exit_code == 2 and "differ" in same.output
