"""The Piecewise and Hybrid Mechanisms on an exact output grid, and their k-of-d sampling (Wang et al., ICDE 2019).

Pure math: exact ε from the output laws, the implemented laws against the paper's, unbiasedness and variance
(exact and Monte Carlo), the samplers against the laws, the issue's acceptance test on the mean's MSE,
clipping, the numba kernels against their twins, the wire codec and the two randomness modes.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import stats

from estimators.errors import InfeasibleParameters, InvalidReports, LDPError
from estimators.numeric import eps_of_law, make_numeric
from estimators.numeric import piecewise_kernels as pk
from estimators.numeric.piecewise import (EPS_STAR, HM, PM, PiecewiseMultidim, duchi_paper_variance, hm_alpha,
                                          kofd_k, pm_paper_variance)
from estimators.randomness import SimulationWarning, noise_key

EPSILONS = (0.5, 1.0, 4.0)
P_MIN = 1e-4  # p-value threshold of the goodness-of-fit tests, fixed in advance


def _edges(values: np.ndarray) -> np.ndarray:
    """Bin edges giving each distinct output value its own bin (midpoints, open ends)."""
    v = np.unique(values)
    assert v.size == values.size  # every code has its own output value
    return np.concatenate([[v[0] - 1.0], (v[:-1] + v[1:]) / 2, [v[-1] + 1.0]])


def _law_inputs(m: PM) -> np.ndarray:
    """-1, 1, 0, inputs whose window start is an integer (where the law changes), and inputs between."""
    s = np.array([1, 2, m.l // 3, m.l // 2, m.l - 2, m.l - 1])
    at = 2.0 * s / m.l - 1.0
    return np.concatenate([[-1.0, 1.0, 0.0, -1.0 + 1e-12, 1.0 - 1e-12], at, at + 0.5 / m.l, [0.123456789, -0.77]])


def _chi2_pvalue(observed: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square goodness of fit, cells with expected count < 5 pooled into one."""
    small = expected < 5
    o = np.append(observed[~small], observed[small].sum())
    e = np.append(expected[~small], expected[small].sum())
    if e[-1] == 0:
        o, e = o[:-1], e[:-1]
    return float(stats.chisquare(o, e * o.sum() / e.sum()).pvalue)


# ------------------------------------------------------------------ exact ε
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("bits", [10, 16])
def test_pm_eps_of_law_is_exact(eps, bits):
    m = PM(eps, grid_bits=bits)
    inputs = _law_inputs(m)
    edges = _edges(m.unit_outputs(np.arange(m.m)))
    assert eps_of_law(m, inputs, edges) == pytest.approx(m.eps_first, rel=1e-9)
    # the implemented ε: log(A / B) <= ε, below it by less than 1 / A
    assert m.eps_first == pytest.approx(math.log(m.a / m.b), rel=1e-12)
    assert m.eps_first <= eps and eps - m.eps_first <= 1.0 / m.a + 1e-15
    # the integer law the kernel samples: masses between B and A over Z, summing to Z
    for x in inputs:
        s0, w = m.cell_weights(float(x))
        assert m.b <= min(w) and max(w) <= m.a and sum(w) + (m.l - 1) * m.b == m.z
    # wide, irregular bins give no more
    coarse = np.concatenate([[-np.inf], np.linspace(-m.c_impl, m.c_impl, 37) + 1e-3, [np.inf]])
    assert eps_of_law(m, inputs, coarse) <= m.eps_first * (1 + 1e-12)
    # negative check: the law of a larger ε exceeds the smaller one
    big = PM(2 * eps, grid_bits=bits)
    assert eps_of_law(big, _law_inputs(big), _edges(big.unit_outputs(np.arange(big.m)))) > eps * 1.5


@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0])
def test_hm_eps_of_law_is_exact(eps):
    m = HM(eps, grid_bits=10)
    inputs = _law_inputs(m.pm)
    edges = _edges(m.unit_outputs(np.arange(m.m + 2)))
    assert eps_of_law(m, inputs, edges) == pytest.approx(m.eps_first, rel=1e-9)
    assert m.eps_first <= eps * (1 + 1e-15) and m.eps_first == pytest.approx(eps, rel=1e-12)
    if eps < EPS_STAR:  # Duchi alone: no PM cell has mass
        assert m.t_alpha == 0 and m.code_mass(0.3)[:m.m].sum() == 0
    else:
        assert m.eps_first == max(m.pm.eps_first, m.duchi_eps)
    for x in inputs:
        assert m.code_mass(float(x)).sum() == pytest.approx(1.0, abs=1e-12)
    big = HM(2 * eps, grid_bits=10)
    assert eps_of_law(big, inputs, _edges(big.unit_outputs(np.arange(big.m + 2)))) > eps * 1.5


def test_huge_and_tiny_eps():
    m = PM(60.0)  # K e^ε + L > 2^64: B = 1, the ε saturates below 60
    assert m.b == 1 and m.k == 1 and m.eps_first < 60 and m.eps_first == pytest.approx(math.log(m.a), rel=1e-12)
    edges = _edges(m.unit_outputs(np.arange(m.m)))
    assert eps_of_law(m, np.array([-1.0, 0.2, 1.0]), edges) == pytest.approx(m.eps_first, rel=1e-9)
    for huge in (1e3, 1e300):  # saturates alike, no overflow
        assert (PM(huge).a, PM(huge).b) == (m.a, m.b) and HM(huge).d_tlo == 1
    with pytest.raises(InfeasibleParameters):
        PM(1e-9)
    with pytest.raises(InfeasibleParameters):
        HM(1e-9)
    assert PM(1e-4).eps_first == pytest.approx(1e-4, rel=1e-9)


# ------------------------------------------------------------------ the law against the paper's
@pytest.mark.parametrize("eps", EPSILONS)
def test_pm_law_is_the_papers_on_a_grid(eps):
    a = math.exp(eps / 2)
    C = (a + 1) / (a - 1)
    for bits, tol in ((16, 2e-4), (20, 2e-5)):
        m = PM(eps, grid_bits=bits)
        assert m.c_paper == pytest.approx(C, rel=1e-14)
        assert m.c_impl == pytest.approx(C, rel=1e-8)  # C' = M / (σ L)
        # the piece: P[window] = e^{ε/2} / (e^{ε/2} + 1); the window's width C - 1 of 2C
        assert m.p_near == pytest.approx(a / (a + 1), rel=tol)
        assert m.k / m.m == pytest.approx((C - 1) / (2 * C), rel=tol)
        # densities: p = (e^ε - e^{ε/2}) / (2 e^{ε/2} + 2) in the window, p / e^ε outside (cell width 2C'/M)
        h = 2 * m.c_impl / m.m
        p = (math.exp(eps) - a) / (2 * a + 2)
        assert m.a / m.z / h == pytest.approx(p, rel=tol)
        assert m.b / m.z / h == pytest.approx(p / math.exp(eps), rel=tol)
        # the window of x: [ℓ(x), r(x)], ℓ(x) = (C + 1)/2 x - (C - 1)/2, for x on the start grid
        for s in (0, m.l // 4, m.l):
            x = 2.0 * s / m.l - 1.0
            lo_edge = -m.c_impl + s * h
            assert lo_edge == pytest.approx((C + 1) / 2 * x - (C - 1) / 2, abs=2 * C / m.k)
            mass = m.cell_mass(x)
            assert np.allclose(mass[s:s + m.k], m.a / m.z, rtol=1e-9) and mass.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("eps", EPSILONS)
def test_pm_unbiased_and_variance_exact(eps):
    m = PM(eps, grid_bits=12)
    vals = m.unit_outputs(np.arange(m.m))
    tol = (1.0 / m.d_ab + 2.0 ** -52) / m.l + 1e-13
    for x in np.concatenate([_law_inputs(m), np.linspace(-1, 1, 23)]):
        mass = m.cell_mass(float(x))
        mean = float(mass @ vals)
        assert abs(mean - x) <= tol
        assert float(mass @ (vals - x) ** 2) == pytest.approx(m.unit_variance(float(x)), rel=1e-9)
    assert np.shape(m.unit_variance(np.zeros(3))) == (3,) and isinstance(m.unit_variance(0.5), float)


@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0])
def test_hm_unbiased_and_variance_exact(eps):
    m = HM(eps, grid_bits=12)
    vals = m.unit_outputs(np.arange(m.m + 2))
    for x in np.linspace(-1, 1, 17):
        mass = m.code_mass(float(x))
        assert abs(float(mass @ vals) - x) <= 1e-12 + m.B * 2.0 ** -51
        assert float(mass @ (vals - x) ** 2) == pytest.approx(m.unit_variance(float(x)), rel=1e-9)


def test_variance_converges_to_the_papers():
    x = np.linspace(-1, 1, 41)
    for eps in (0.5, 1.0, 4.0, 8.0):
        errs = []
        for bits in (12, 16, 20):
            m = PM(eps, grid_bits=bits)
            errs.append(float(np.max(np.abs(m.unit_variance(x) / m.paper_variance(x) - 1))))
        # the rounding of K dominates: a relative O(1 / K)
        assert errs[0] < 0.5 / PM(eps, grid_bits=12).k and errs[1] < 3e-4 and errs[2] < 2e-5, (eps, errs)
        assert errs[2] < errs[1] < errs[0], (eps, errs)
        # Wang et al.'s worst case 4 e^{ε/2} / (3 (e^{ε/2} - 1)^2) at x = ±1 (survey, Table IX)
        a = math.exp(eps / 2)
        assert pm_paper_variance(1.0, eps) == pytest.approx(4 * a / (3 * (a - 1) ** 2), rel=1e-12)
        hm = HM(eps)
        assert np.max(np.abs(hm.unit_variance(x) / hm.paper_variance(x) - 1)) < 0.5 / hm.pm.k


@pytest.mark.parametrize("name, eps, x", [("PM", 1.0, -1.0), ("PM", 1.0, 0.3), ("PM", 4.0, 1.0),
                                          ("HM", 1.0, 0.3), ("HM", 4.0, -1.0), ("HM", 0.4, 0.7)])
def test_variance_against_monte_carlo(name, eps, x):
    m = make_numeric(name, eps=eps)
    n = 400_000
    est = m.unit_outputs(m.randomize(np.full(n, x), np.random.default_rng(21)))
    var = m.unit_variance(x)
    assert abs(est.mean() - x) < 5 * math.sqrt(var / n)
    # the sample variance's relative sd is sqrt((kurtosis - 1) / n) <= 0.3% here: 2% is > 6 sd
    assert est.var() / var == pytest.approx(1.0, abs=0.02)


# ------------------------------------------------------------------ HM's rule
def test_hm_alpha_rule_and_worst_case():
    # ε* = ln((-5 + 2 ∛(6353 - 405 √241) + 2 ∛(6353 + 405 √241)) / 27): a = e^{ε*/2} solves 3a^3 - a^2 + a - 7 = 0
    a = math.exp(EPS_STAR / 2)
    assert EPS_STAR == pytest.approx(0.6094, abs=1e-4) and abs(3 * a ** 3 - a ** 2 + a - 7) < 1e-12
    # ... where Duchi's variance B^2 equals PM's at x = 0 mixed in at α's kink: the break-even of the two rules
    assert (a + 3) / (3 * (a - 1) ** 2) == pytest.approx(duchi_paper_variance(0.0, EPS_STAR), rel=1e-9)
    assert hm_alpha(0.6) == 0.0 and hm_alpha(0.62) == pytest.approx(1 - math.exp(-0.31), rel=1e-15)
    x = np.linspace(-1, 1, 201)
    for eps in np.concatenate([np.linspace(0.05, 1.5, 30), [2.0, 4.0, 8.0]]):
        worst = HM.paper_worst_variance(eps)
        paper = HM(eps, grid_bits=8).paper_variance(x)
        assert paper.max() == pytest.approx(worst, rel=1e-12)
        # never worse than PM's or Duchi's worst case
        assert worst <= min(pm_paper_variance(1.0, eps), duchi_paper_variance(0.0, eps)) * (1 + 1e-12)
        if eps > EPS_STAR:  # with α = 1 - e^{-ε/2} the variance does not depend on x
            assert np.ptp(paper) <= 1e-9 * worst
    for eps in EPSILONS:  # the implemented worst cases, likewise
        hm, pm = HM(eps), PM(eps)
        duchi_worst = hm.B ** 2
        assert hm.unit_variance(x).max() <= min(pm.unit_variance(x).max(), duchi_worst) * (1 + 1e-6)
        assert hm.alpha == pytest.approx(hm_alpha(eps), rel=1e-15)


# ------------------------------------------------------------------ samplers against the laws
@pytest.mark.parametrize("eps", [0.5, 4.0])
@pytest.mark.parametrize("x", [-1.0, -0.3, 0.0123, 0.77, 1.0])
def test_pm_samples_follow_the_law(eps, x):
    m = PM(eps, grid_bits=8)
    n = 200_000
    r = m.randomize(np.full(n, x), np.random.default_rng(31))
    assert _chi2_pvalue(np.bincount(r, minlength=m.m), m.cell_mass(x) * n) > P_MIN


@pytest.mark.parametrize("eps", [0.4, 1.0, 4.0])
@pytest.mark.parametrize("x", [-1.0, 0.31, 1.0])
def test_hm_samples_follow_the_law(eps, x):
    m = HM(eps, grid_bits=8)
    n = 200_000
    r = m.randomize(np.full(n, x), np.random.default_rng(32))
    assert _chi2_pvalue(np.bincount(r, minlength=m.m + 2), m.code_mass(x) * n) > P_MIN


def test_samples_follow_the_law_default_grid_binned():
    m = PM(1.0)
    n, x = 400_000, -0.4321
    out = m.unit_outputs(m.randomize(np.full(n, x), np.random.default_rng(33)))
    edges = np.linspace(-m.c_impl, m.c_impl, 129)  # 512 cells a bin
    assert _chi2_pvalue(np.histogram(out, bins=edges)[0], m.output_mass(x, edges) * n) > P_MIN


# ------------------------------------------------------------------ acceptance 1: MSE of the mean
LO, HI = 10.0, 50.0
R, N_DEV = 2000, 300  # the MSE's relative sd from R repetitions is ~ sqrt(2 / R) = 3.2%: 15% is 4.7 sd


def _population(kind: str, n: int = N_DEV, lo: float = LO, hi: float = HI, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng({"uniform": 1, "skewed": 2, "bimodal": 3}[kind] + 10 * seed)
    if kind == "uniform":
        return g.uniform(lo, hi, n)
    if kind == "skewed":
        return lo + (hi - lo) * g.beta(2, 8, n)
    return np.where(g.random(n) < 0.5, lo + 0.01 * (hi - lo), hi - 0.02 * (hi - lo) * g.random(n))


@pytest.mark.parametrize("name", ["PM", "HM"])
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("kind", ["uniform", "skewed", "bimodal"])
def test_mse_of_the_mean_matches_the_variance(name, eps, kind):
    m = make_numeric(name, eps=eps, lo=LO, hi=HI)
    values = _population(kind)
    reports = m.randomize(np.tile(values, R), np.random.default_rng(100))
    sums = m.summands(reports).reshape(R, N_DEV).sum(axis=1)
    est = np.array([m.estimate_mean(s, N_DEV) for s in sums])
    mse = float(np.mean((est - values.mean()) ** 2))
    assert abs(mse / m.mean_variance(values) - 1) < 0.15
    # and unbiased: the mean error is within 4 sd of the mean of R estimates
    assert abs(est.mean() - values.mean()) < 4 * math.sqrt(m.mean_variance(values) / R)


# ------------------------------------------------------------------ clipping, NaN, parameters
@pytest.mark.parametrize("name", ["PM", "HM"])
def test_clipping(name):
    m = make_numeric(name, eps=1.0, lo=0.0, hi=100.0)
    values = np.array([-5.0, 0.0, 50.0, 100.0, 100.5, 1e9, -np.inf, np.inf, 33.3])
    a = m.randomize(values, np.random.default_rng(7))
    b = m.randomize(np.clip(values, 0.0, 100.0), np.random.default_rng(7))
    assert np.array_equal(a, b)
    x, mask = m.prepare(values)
    assert mask.tolist() == [True, False, False, False, True, True, True, True, False]
    assert x.min() == -1.0 and x.max() == 1.0
    with pytest.raises(LDPError):
        m.randomize(np.array([1.0, np.nan]), np.random.default_rng(7))


def test_parameters_and_registry():
    m = make_numeric("PM", eps=1.0, lo=0, hi=10, grid_bits=12)
    assert isinstance(m, PM) and m.params() == {"mechanism": "PM", "eps": 1.0, "lo": 0.0, "hi": 10.0,
                                                "grid_bits": 12}
    assert m.fingerprint != PM(1.0, 0, 10).fingerprint and PM(1.0).params()["grid_bits"] == 16
    h = make_numeric("HM", eps=2.0)
    assert isinstance(h, HM) and h.params() == {"mechanism": "HM", "eps": 2.0, "lo": -1.0, "hi": 1.0,
                                                "grid_bits": 16}
    assert PM(1.0).report_dtype == np.uint16 and PM(1.0, grid_bits=17).report_dtype == np.uint32
    assert h.report_dtype == np.uint32
    for bad in (3, 25, 2.5, True):
        with pytest.raises(LDPError):
            PM(1.0, grid_bits=bad)
    with pytest.raises(LDPError):
        HM(0.0)


# ------------------------------------------------------------------ kernels == twins
#: law parameters with Z = 11 · 2^60 (31% of the words redrawn): exercises the extension streams
FORCED = (np.int64(5), np.int64(3), np.uint64(1 << 61), np.uint64(1 << 60), np.uint64(11 * (1 << 60) - 1))


@pytest.mark.parametrize("n", [0, 1, 2, 1000, 4100])
def test_pm_kernel_equals_twin(n):
    g = np.random.default_rng(n)
    x = np.clip(g.uniform(-1.1, 1.1, n), -1, 1)
    if n >= 1000:
        x[:6] = [-1.0, 1.0, 0.0, 1e-300, -1e-20, 1 - 1e-16]
    for eps, bits in ((0.3, 16), (4.0, 20), (60.0, 16)):
        m = PM(eps, grid_bits=bits)
        key = noise_key(g)
        a = pk.pm_randomize(x, key, *m.kernel_args(), np.empty(n, dtype=m.report_dtype))
        assert a.dtype == m.report_dtype
        assert np.array_equal(a, pk.np_pm_randomize(x, key, *m.kernel_args(), dtype=m.report_dtype))
    if n <= 1000:  # redraws are slow in the twin
        key = noise_key(g)
        a = pk.pm_randomize(x, key, *FORCED, np.empty(n, dtype=np.uint32))
        assert np.array_equal(a, pk.np_pm_randomize(x, key, *FORCED))
        assert np.all(a < 8)


@pytest.mark.parametrize("n", [0, 1, 2, 1000, 4100])
def test_hm_kernel_equals_twin(n):
    g = np.random.default_rng(100 + n)
    x = np.clip(g.uniform(-1.1, 1.1, n), -1, 1)
    for eps in (0.3, 1.0, 4.0):
        m = HM(eps)
        key = noise_key(g)
        a = pk.hm_randomize(x, key, *m.kernel_args(), np.empty(n, dtype=np.uint32))
        assert np.array_equal(a, pk.np_hm_randomize(x, key, *m.kernel_args()))
    if n <= 1000:
        args = (np.uint64(1 << 63), *FORCED, np.int64(m.d_tlo), float(m.d_s))
        key = noise_key(g)
        a = pk.hm_randomize(x, key, *args, np.empty(n, dtype=np.uint32))
        assert np.array_equal(a, pk.np_hm_randomize(x, key, *args))


@pytest.mark.parametrize("n", [0, 1, 2, 300, 4100])
@pytest.mark.parametrize("base", ["PM", "HM"])
def test_kofd_kernel_equals_twin(n, base):
    g = np.random.default_rng(200 + n)
    for d, eps in ((4, 5.0), (7, 12.0), (1, 3.0), (3, 1.0))[: 1 if n > 1000 else 4]:
        md = PiecewiseMultidim(d, eps, base=base)
        x = np.clip(g.uniform(-1.1, 1.1, (n, d)), -1, 1)
        m0 = md.mechs[0]
        if base == "HM":
            t_alpha, *pm_args, d_tlo, d_s = m0.kernel_args()
        else:
            t_alpha, pm_args, d_tlo, d_s = np.uint64(0), m0.kernel_args(), np.int64(1), 1.0
        forced = (np.full(md.k, 1 << 63, dtype=np.uint64), (np.uint64(1 << 63), *FORCED))
        for lims, (ta, *law) in ((md.lims, (t_alpha, *pm_args)), forced)[: 1 if n > 1000 else 2]:
            key = noise_key(g)
            args = (x, key, np.int64(md.k), lims, base == "HM", ta, *law, d_tlo, d_s)
            idx, rep = pk.kofd_randomize(*args, np.empty((n, md.k), dtype=np.uint16),
                                         np.empty((n, md.k), dtype=md.report_dtype))
            idx2, rep2 = pk.np_kofd_randomize(*args, dtype=md.report_dtype)
            assert np.array_equal(idx, idx2) and np.array_equal(rep, rep2) and rep.dtype == md.report_dtype


# ------------------------------------------------------------------ wire codec
@pytest.mark.parametrize("name, bits", [("PM", 12), ("PM", 16), ("PM", 20), ("HM", 16)])
def test_encode_decode(name, bits):
    m = make_numeric(name, eps=1.0, grid_bits=bits)
    r = m.randomize(np.linspace(-1, 1, 257), np.random.default_rng(3))
    blob = m.encode(r)
    assert len(blob) == r.size * m.report_dtype.itemsize
    assert np.array_equal(m.decode(blob), r) and m.decode(blob).dtype == m.report_dtype
    assert m.decode(b"").size == 0
    with pytest.raises(InvalidReports):
        m.decode(blob[:-1])
    with pytest.raises(InvalidReports):
        m.encode(r.astype(np.float64))
    if m.report_dtype.itemsize == 4 or m.m < 1 << 16:  # a value past the output space fits the dtype
        top = m.m + 2 if name == "HM" else m.m
        bad = np.array([top], dtype=m.report_dtype)
        with pytest.raises(InvalidReports):
            m.decode(bad.astype(bad.dtype.newbyteorder("<")).tobytes())
        with pytest.raises(InvalidReports):
            m.encode(bad)
    with pytest.raises(InvalidReports):
        m.validate_reports(r.reshape(1, -1))


def test_hm_below_eps_star_refuses_pm_cells():
    m = HM(0.5)
    r = m.randomize(np.linspace(-1, 1, 100), np.random.default_rng(4))
    assert set(np.unique(r).tolist()) <= {m.m, m.m + 1}
    with pytest.raises(InvalidReports):
        m.decode(np.array([5], dtype="<u4").tobytes())


# ------------------------------------------------------------------ randomness modes
@pytest.mark.parametrize("name", ["PM", "HM"])
def test_csprng_and_simulation_modes(name):
    m = make_numeric(name, eps=1.0, lo=0.0, hi=1.0)
    v = np.linspace(0, 1, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulationWarning)
        a, b = m.randomize(v), m.randomize(v)
    assert a.dtype == m.report_dtype and a.shape == (1000,)
    assert not np.array_equal(a, b)  # fresh batch keys
    m.validate_reports(a)
    with pytest.warns(SimulationWarning):
        c = m.randomize(v, np.random.default_rng(5))
    with pytest.warns(SimulationWarning):
        assert np.array_equal(c, m.randomize(v, np.random.default_rng(5)))
    with pytest.raises(TypeError):
        m.randomize(v, 5)


# ------------------------------------------------------------------ k-of-d
def test_kofd_k_and_parameters():
    assert [kofd_k(4, e) for e in (0.5, 2.49, 2.5, 5.0, 7.6, 12.5, 100.0)] == [1, 1, 1, 2, 3, 4, 4]
    assert kofd_k(1, 10.0) == 1 and kofd_k(10, 7.4) == 2
    md = PiecewiseMultidim(4, 5.0, ranges=[(0, 1), (0, 10), (-5, 5), (100, 200)])
    assert md.k == 2 and md.eps_attr == 2.5 and md.eps_first <= 5.0 * (1 + 1e-15)
    assert md.eps_first == pytest.approx(5.0, rel=1e-12)
    assert md.params()["ranges"][3] == [100.0, 200.0] and md.params()["mechanism"] == "PM-k-of-d"
    assert PiecewiseMultidim(3, 1.0, ranges=(0, 5)).ranges.tolist() == [[0.0, 5.0]] * 3
    with pytest.raises(LDPError):
        PiecewiseMultidim(4, 5.0, ranges=[(0, 1)] * 3)
    with pytest.raises(LDPError):
        PiecewiseMultidim(0, 5.0)
    with pytest.raises(LDPError):
        PiecewiseMultidim(4, 5.0, base="Duchi")
    with pytest.raises(LDPError):
        md.randomize(np.zeros((3, 5)), np.random.default_rng(0))
    with pytest.raises(LDPError):
        md.randomize(np.full((3, 4), np.nan), np.random.default_rng(0))


def test_kofd_sampling_is_uniform_and_clipped():
    md = PiecewiseMultidim(4, 5.0, ranges=(0.0, 1.0))
    n = 60_000
    values = np.tile([[-1.0, 0.5, 2.0, 1.0]], (n, 1))
    idx, rep = md.randomize(values, np.random.default_rng(41))
    assert idx.shape == rep.shape == (n, 2) and idx.dtype == np.uint16 and rep.dtype == np.uint16
    md.validate_reports(idx, rep)
    code = np.bincount(idx[:, 0].astype(np.int64) * 4 + idx[:, 1], minlength=16)
    pairs = [a * 4 + b for a, b in itertools.combinations(range(4), 2)]
    assert code[pairs].sum() == n  # distinct, ascending
    assert _chi2_pvalue(code[pairs], np.full(6, n / 6)) > P_MIN
    # clipping: the reports equal those of the clipped values under the same key
    idx2, rep2 = md.randomize(np.clip(values, 0.0, 1.0), np.random.default_rng(41))
    assert np.array_equal(idx, idx2) and np.array_equal(rep, rep2)
    _, clipped = md.prepare(values[:2])
    assert clipped.tolist() == [[True, False, True, False]] * 2
    with pytest.raises(InvalidReports):
        md.validate_reports(idx[:, ::-1].copy(), rep)
    with pytest.raises(InvalidReports):
        md.validate_reports(idx.astype(np.int32), rep)


@pytest.mark.parametrize("base", ["PM", "HM"])
def test_kofd_unbiased_with_the_papers_variance(base):
    """d = 4 at ε = 5 (k = 2): per attribute, the MSE of the mean matches the variance and the bias is nil."""
    d, eps, reps, n = 4, 5.0, 1500, 200
    ranges = [(LO, HI), (0.0, 1.0), (-3.0, 3.0), (0.0, 100.0)]
    md = PiecewiseMultidim(d, eps, ranges=ranges, base=base)
    values = np.stack([_population(kind, n, lo, hi, seed=1)
                       for kind, (lo, hi) in zip(["uniform", "skewed", "bimodal", "skewed"], ranges)], axis=1)
    idx, rep = md.randomize(np.tile(values, (reps, 1)), np.random.default_rng(51))
    vals = md.mechs[0].unit_outputs(rep.ravel()).reshape(reps, n * md.k)
    att = idx.reshape(reps, n * md.k).astype(np.int64)
    cell = (att + d * np.arange(reps)[:, None]).ravel()
    sums = np.bincount(cell, weights=vals.ravel(), minlength=reps * d).reshape(reps, d)
    assert np.allclose(sums[0], md.attribute_sums(idx[:n], rep[:n]))
    est = np.stack([md.estimate_means(s, n) for s in sums])
    truth = values.mean(axis=0)
    var = md.mean_variance(values)
    mse = np.mean((est - truth) ** 2, axis=0)
    assert np.all(np.abs(mse / var - 1) < 0.15), mse / var
    assert np.all(np.abs(est.mean(axis=0) - truth) < 4 * np.sqrt(var / reps))
    # the implemented variance is the paper's (Wang et al., §IV) to the grid's precision
    x, _ = md.prepare(values)
    assert np.allclose(md.unit_variance(x), md.paper_variance(x), rtol=2e-4)


def test_kofd_csprng_and_simulation_modes():
    md = PiecewiseMultidim(5, 8.0, base="HM")
    v = np.zeros((500, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulationWarning)
        a, b = md.randomize(v), md.randomize(v)
    assert a[0].shape == (500, 3) and a[1].dtype == np.uint32
    assert not np.array_equal(a[1], b[1])
    with pytest.warns(SimulationWarning):
        md.randomize(v, np.random.default_rng(1))
