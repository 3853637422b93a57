"""Empirical privacy audit (estimators/audit.py): no protocol leaks more than its stated ε1,
the audit is tight for GRR, it catches a deliberately leaky protocol, and its Clopper-Pearson
bounds match known values."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

import estimators
from estimators.audit import (CHUNK_BYTES, AuditResult, audit, clopper_pearson, cp_lower, cp_upper, default_audit_cases,
                              eps_interval, eps_lower_bound, eps_point_estimate, plan_audit_cases)
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
    """SHE at k = 1024 has 4 KiB reports: chunks shrink so one chunk stays within CHUNK_BYTES."""
    proto = estimators.make("SHE", k=1024, eps=1.0)
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
