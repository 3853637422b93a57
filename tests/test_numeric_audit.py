"""Empirical privacy audit of the numeric mechanisms (estimators/numeric/audit.py): every mechanism is audited
(events on a discretization of its output, chosen from the exact law), no lower bound exceeds the stated ε,
the audit is tight (>= 80%) for Duchi and 1BitMean at ε = 1, and it flags mechanisms whose randomizer runs at a
larger ε than they state."""
from __future__ import annotations

import math

import numpy as np
import pytest

import estimators
from estimators.audit import ROUNDS as FREQUENCY_ROUNDS
from estimators.errors import LDPError
from estimators.numeric import MECHANISMS, make_numeric
from estimators.numeric.audit import (ROUNDS, audit_numeric, default_numeric_cases, output_edges, plan_event,
                                      plan_numeric_round)
from estimators.numeric.duchi import Duchi
from estimators.numeric.onebit import OneBitMean
from estimators.numeric.piecewise import PM

CASES = default_numeric_cases()
RUNS = [(name, mech, rnd) for name, mech in CASES for rnd in ROUNDS if rnd == "first" or mech.longitudinal]


def _id(run) -> str:
    name, mech, rnd = run
    return f"{name}[gamma={mech.params()['gamma']}]-{rnd}" if "gamma" in mech.params() else f"{name}-{rnd}"


# ---------------------------------------------------------------- coverage
def test_every_numeric_mechanism_is_audited_without_name_clash() -> None:
    assert {name for name, _ in CASES} == set(MECHANISMS)
    assert not set(MECHANISMS) & set(estimators.PROTOCOLS)  # `ldp audit NAME` is unambiguous
    assert set(ROUNDS) < set(FREQUENCY_ROUNDS)
    first, _ = plan_numeric_round(CASES, "first")
    prr, _ = plan_numeric_round(CASES, "prr")
    longi, skipped = plan_numeric_round(CASES, "longitudinal")
    assert len(first) == len(CASES)
    assert {j.name for j in prr} == {"1BitMean"} and len(prr) == 2  # gamma = 0 and 0.1
    assert not longi and {s.name for s in skipped} == {"1BitMean"}


# ---------------------------------------------------------------- (1) no false alarm
@pytest.mark.parametrize("run", RUNS, ids=[_id(r) for r in RUNS])
def test_no_numeric_mechanism_leaks_more_than_stated(run) -> None:
    name, mech, rnd = run
    r = audit_numeric(mech, trials=50_000, seed=11, round=rnd)
    claim = mech.eps_memo if rnd == "prr" else mech.eps_first
    assert r.eps_theory == pytest.approx(min(mech.eps, claim)) and r.eps_theory <= mech.eps
    assert r.protocol == name and r.round == rnd and (r.v1, r.v2) in ((-1.0, 1.0), (1.0, -1.0))
    assert r.eps_lower <= r.eps_theory, f"{mech!r} {rnd}: ε_LB = {r.eps_lower:.4f} > {r.eps_theory:.4f}"
    assert r.passed and r.tightness > 0.5 and r.event


# ---------------------------------------------------------------- (2) tightness
@pytest.mark.parametrize("name", ["Duchi", "1BitMean"])
def test_audit_is_tight_for_duchi_and_onebit(name: str) -> None:
    """The issue's setting: ε = 1, 10^6 reports per input (2·10^6 in all), 95% confidence: ε_LB >= 0.8 ε."""
    mech = make_numeric(name, eps=1.0)
    r = audit_numeric(mech, trials=1_000_000, seed=3)
    assert r.passed and r.tightness >= 0.8 and r.eps_lower >= 0.8 * mech.eps
    lo, hi = r.eps_hat_ci
    assert lo <= r.eps_theory <= hi


def test_binary_event_is_one_report_value_with_ratio_e_eps() -> None:
    """Duchi's event is "report = -1" (the bin of -B and the empty bins up to +B's), ratio e^ε exactly."""
    mech = Duchi(1.0)
    ev = plan_event(mech, -1.0, 1.0, 100_000)
    assert ev.hits(np.array([-mech.B, -mech.B, mech.B])) == 2
    assert math.log(ev.p1 / ev.p2) == pytest.approx(mech.eps_first, rel=1e-12)
    edges = output_edges(mech, -1.0, 1.0)
    assert edges[0] == -np.inf and edges[-1] == np.inf and {-1.0, 1.0} <= set(edges)


# ---------------------------------------------------------------- (3) the audit flags a leak
class LeakyDuchi(Duchi):
    """States ε but randomizes with Duchi at 2ε."""

    def randomize(self, values, rng=None):
        return Duchi(2 * self.eps, self.lo, self.hi).randomize(values, rng)


class LeakyPM(PM):
    """States ε (its law, its event) but randomizes with PM at 2ε (same grid)."""

    def randomize(self, values, rng=None):
        return PM(2 * self.eps, self.lo, self.hi, self.grid_bits).randomize(values, rng)


class LeakyOneBit(OneBitMean):
    """States ε (eps_first, eps_memo, output law) but its memoized bits use the thresholds of 2ε."""

    def __init__(self, eps, lo=-1.0, hi=1.0, s=16, gamma=0.0):
        super().__init__(eps, lo, hi, s, gamma)
        twin = OneBitMean(2 * eps, lo, hi, s, gamma)
        self.t_lo, self.step = twin.t_lo, twin.step


@pytest.mark.parametrize("mech, rnd", [(LeakyDuchi(1.0), "first"), (LeakyPM(1.0), "first"),
                                       (LeakyOneBit(1.0), "first"), (LeakyOneBit(1.0, gamma=0.1), "prr")],
                         ids=["Duchi", "PM", "1BitMean", "1BitMean-prr"])
def test_audit_flags_a_randomizer_above_its_stated_eps(mech, rnd: str) -> None:
    r = audit_numeric(mech, trials=100_000, seed=9, round=rnd)
    assert r.eps_theory <= mech.eps + 1e-12
    assert r.eps_lower > r.eps_theory and not r.passed


# ---------------------------------------------------------------- mechanics
def test_reproducible_progress_and_chunks() -> None:
    mech = make_numeric("PM", eps=1.0, lo=0.0, hi=10.0)
    seen: list[tuple[int, int]] = []
    a = audit_numeric(mech, trials=30_000, seed=4, chunk=7_000, on_progress=lambda d, t: seen.append((d, t)))
    b = audit_numeric(mech, trials=30_000, seed=4, chunk=7_000)
    assert (a.hits1, a.hits2, a.eps_lower) == (b.hits1, b.hits2, b.eps_lower)
    assert {a.v1, a.v2} == {0.0, 10.0} and a.params["lo"] == 0.0
    assert seen[-1] == (60_000, 60_000) and len(seen) == 10


@pytest.mark.parametrize("kwargs, match", [
    ({"round": "prr"}, "memoiz"), ({"round": "longitudinal"}, "round"), ({"x1": 2.0}, "range"),
    ({"x1": 0.5, "x2": 0.5}, "differ"), ({"trials": 0}, "trials"),
])
def test_bad_arguments_raise(kwargs: dict, match: str) -> None:
    with pytest.raises(LDPError, match=match):
        audit_numeric(Duchi(1.0), **kwargs)
