"""The Laplace baseline (exact discrete Laplace on a grid) and Duchi et al.'s one-dimensional mechanism.

Pure math: exact ε from the output laws, the samplers against the laws, the issue's acceptance test on the
mean's MSE, clipping, the numba kernels against their twins, the wire codec and the two randomness modes.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from estimators.errors import InfeasibleParameters, InvalidReports, LDPError
from estimators.numeric import eps_of_law, make_numeric
from estimators.numeric import laplace_kernels as lk
from estimators.numeric.duchi import Duchi, duchi_randomize, np_duchi_randomize
from estimators.numeric.laplace import Laplace
from estimators.randomness import SimulationWarning, noise_key

EPSILONS = (0.5, 1.0, 4.0)
P_MIN = 1e-4  # p-value threshold of the goodness-of-fit tests, fixed in advance


def _laplace_window(m: Laplace, scales: float = 12.0) -> np.ndarray:
    """Half-integer edges (unit domain) around every grid output within ``scales`` noise scales of [-1, 1]."""
    w = m.n_grid + int(scales / m.lam)
    return (np.arange(-w, w + 2) - 0.5) * m.step


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
def test_duchi_eps_of_law_is_exact(eps):
    m = Duchi(eps)
    inputs = np.concatenate([[-1.0, 1.0], np.linspace(-1, 1, 41), [-0.999999, 1e-300, 0.3333333]])
    edges = np.array([-m.B - 1.0, 0.0, m.B + 1.0])
    assert eps_of_law(m, inputs, edges) == pytest.approx(m.eps_first, rel=1e-9)
    # the implemented law's ε is the stated one, from below, to a relative (e^ε + 1) 2^-53
    assert m.eps_first <= eps * (1 + 1e-15)
    assert m.eps_first == pytest.approx(eps, rel=1e-12)
    # Wang et al., ICDE 2019, Alg. 1: p(x) = (e^ε - 1) / (2 e^ε + 2) x + 1/2, B = (e^ε + 1) / (e^ε - 1)
    e = math.exp(eps)
    x = np.linspace(-1, 1, 101)
    assert np.allclose(m.p_plus(x), (e - 1) / (2 * e + 2) * x + 0.5, rtol=0, atol=1e-15)
    assert m.B == pytest.approx((e + 1) / (e - 1), rel=1e-13)
    # unbiased: E[B report] = B (2 p(x) - 1) = x up to B 2^-52
    assert np.abs(m.B * (2 * m.p_plus(x) - 1) - x).max() <= m.B * 2.0 ** -52
    # negative check: the law of a larger ε exceeds the smaller one
    assert eps_of_law(Duchi(2 * eps), inputs, np.array([-10.0, 0.0, 10.0])) > eps * 1.5


def test_duchi_huge_eps_saturates_below_eps():
    m = Duchi(50.0)
    assert m.t_lo == 1 and m.eps_first == pytest.approx(53 * math.log(2), rel=1e-12) and m.eps_first < 50
    assert eps_of_law(m, np.array([-1.0, 1.0]), np.array([-3.0, 0.0, 3.0])) == pytest.approx(m.eps_first, rel=1e-9)


@pytest.mark.parametrize("eps", EPSILONS)
def test_laplace_eps_of_law_is_exact(eps):
    m = Laplace(eps)
    g = m.step
    inputs = np.array([-1.0, 1.0, 0.0, -1 + g, 1 - g, 0.5 * g, -0.3 + 0.25 * g, 0.123456789, 1 - 0.5 * g])
    assert eps_of_law(m, inputs, _laplace_window(m)) == pytest.approx(m.eps_first, rel=1e-9)
    # eps_first = 2N s / t <= ε, below it by a relative < 1 / t
    assert m.eps_first <= eps and m.eps_first > eps * (1 - 1e-9)
    # wide, irregular bins (and open-ended ones) give no more than the law's ε
    edges = np.concatenate([[-np.inf], np.linspace(-3.0, 3.0, 37) + 0.1 * g, [np.inf]])
    assert eps_of_law(m, inputs, edges) <= m.eps_first * (1 + 1e-12)
    # negative check
    assert eps_of_law(Laplace(2 * eps), inputs, _laplace_window(m)) > eps * 1.5


def test_laplace_every_grid_input_coarse_grid():
    """On a coarse grid, every grid input and the midpoints: the largest ratio is between -1 and 1."""
    m = Laplace(1.0, grid_bits=3)
    inputs = np.linspace(-1, 1, 33)  # grid points (step 1/8) and midpoints
    assert eps_of_law(m, inputs, _laplace_window(m, 40.0)) == pytest.approx(m.eps_first, rel=1e-9)
    assert m.eps_first == 1.0  # 2N s / t is exact for ε = 1: t = 2^24
    # masses sum to 1 over the whole line, and the mean is x up to g 2^-52 (randomized rounding)
    for x in (-1.0, -0.3, 0.0, 0.01, 0.77, 1.0):
        edges = _laplace_window(m, 60.0)
        mass = m.output_mass(x, edges)
        assert mass.sum() == pytest.approx(1.0, abs=1e-12)
        centers = (edges[:-1] + edges[1:]) / 2
        assert float(mass @ centers) == pytest.approx(x, abs=1e-9)
        lo, p = m._rounding(x)
        assert abs((float(lo) + float(p)) * m.step - x) <= m.step * 2.0 ** -52


def test_laplace_variance_relates_to_continuous():
    for eps in EPSILONS:
        m = Laplace(eps)
        # g^2 Var Z = 8 / eps_first^2 - g^2 / 6 + O(g^4 ε^2); the rounding adds at most g^2 / 4
        assert abs(m.unit_variance(0.0) - 8 / m.eps_first ** 2) <= m.step ** 2 / 6 * 1.01
        assert abs(m.unit_variance(0.5 * m.step) - 8 / m.eps_first ** 2) <= m.step ** 2 / 4
        assert np.shape(m.unit_variance(np.zeros(3))) == (3,)


def test_parameters_and_registry():
    m = make_numeric("Laplace", eps=1.0, lo=0, hi=10, grid_bits=8)
    assert isinstance(m, Laplace) and m.params() == {"mechanism": "Laplace", "eps": 1.0, "lo": 0.0, "hi": 10.0,
                                                     "grid_bits": 8}
    assert m.fingerprint != Laplace(1.0, 0, 10).fingerprint
    assert isinstance(make_numeric("Duchi", eps=2.0), Duchi)
    assert Duchi(1.0).params() == {"mechanism": "Duchi", "eps": 1.0, "lo": -1.0, "hi": 1.0}
    with pytest.raises(LDPError):
        Laplace(1.0, grid_bits=2.5)
    with pytest.raises(LDPError):
        Laplace(1.0, grid_bits=25)
    with pytest.raises(InfeasibleParameters):  # the noise would overflow an int32 report
        Laplace(1e-5)
    with pytest.raises(LDPError):
        Duchi(0.0)


# ------------------------------------------------------------------ samplers against the laws
@pytest.mark.parametrize("x", [-1.0, -0.3, 0.7, 1.0])
def test_duchi_samples_follow_the_law(x):
    m = Duchi(1.0)
    n = 2_000_000  # the proportion's sd is 3.5e-4
    r = m.randomize(np.full(n, x), np.random.default_rng(11))
    mass = m.output_mass(x, np.array([-5.0, 0.0, 5.0]))
    observed = np.array([(r == -1).sum(), (r == 1).sum()])
    assert _chi2_pvalue(observed, mass * n) > P_MIN


@pytest.mark.parametrize("x", [-1.0, 0.1, 0.6180339887])
@pytest.mark.parametrize("eps, bits", [(1.0, 2), (8.0, 0)])
def test_laplace_samples_follow_the_law_point_by_point(x, eps, bits):
    """Coarse grids (g = 1/4 with a noise of 8 grid steps; g = 1 with P[Z = 0] = 0.96, where the output shows
    the rounding): every output point is its own cell, so the rounding mixture and the noise's exact law are
    both checked."""
    m = Laplace(eps, grid_bits=bits)
    n = 200_000
    r = m.randomize(np.full(n, x), np.random.default_rng(12))
    edges = _laplace_window(m, 30.0)
    lo_idx = int(round(edges[0] / m.step + 0.5))
    observed = np.bincount(np.clip(r.astype(np.int64) - lo_idx, 0, edges.size - 2), minlength=edges.size - 1)
    assert _chi2_pvalue(observed, m.output_mass(x, edges) * n) > P_MIN


@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_laplace_samples_follow_the_law_binned(eps):
    m = Laplace(eps)
    n = 200_000
    x = -0.4321
    r = m.unit_outputs(m.randomize(np.full(n, x), np.random.default_rng(13)))
    edges = np.concatenate([[-np.inf], np.linspace(-20 / eps, 20 / eps, 60), [np.inf]])
    observed = np.histogram(r, bins=edges)[0]
    assert _chi2_pvalue(observed, m.output_mass(x, edges) * n) > P_MIN


# ------------------------------------------------------------------ acceptance 1: MSE of the mean
LO, HI = 10.0, 50.0
R, N_DEV = 2000, 300  # the MSE's relative sd from R repetitions is ~ sqrt(2 / R) = 3.2%: 15% is 4.7 sd


def _population(kind: str) -> np.ndarray:
    g = np.random.default_rng({"uniform": 1, "skewed": 2, "bimodal": 3}[kind])
    if kind == "uniform":
        return g.uniform(LO, HI, N_DEV)
    if kind == "skewed":
        return LO + (HI - LO) * g.beta(2, 8, N_DEV)
    return np.where(g.random(N_DEV) < 0.5, LO + 0.01 * (HI - LO), HI - 0.02 * (HI - LO) * g.random(N_DEV))


@pytest.mark.parametrize("name", ["Laplace", "Duchi"])
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("kind", ["uniform", "skewed", "bimodal"])
def test_mse_of_the_mean_matches_the_variance(name, eps, kind):
    m = make_numeric(name, eps=eps, lo=LO, hi=HI)
    values = _population(kind)
    reports = m.randomize(np.tile(values, R), np.random.default_rng(100)).reshape(R, N_DEV)
    sums = reports.sum(axis=1, dtype=np.int64)
    est = np.array([m.estimate_mean(float(s), N_DEV) for s in sums])
    mse = float(np.mean((est - values.mean()) ** 2))
    assert abs(mse / m.mean_variance(values) - 1) < 0.15
    # and unbiased: the mean error is within 4 sd of the mean of R estimates
    assert abs(est.mean() - values.mean()) < 4 * math.sqrt(m.mean_variance(values) / R)


# ------------------------------------------------------------------ clipping, NaN
@pytest.mark.parametrize("name", ["Laplace", "Duchi"])
def test_clipping(name):
    m = make_numeric(name, eps=1.0, lo=0.0, hi=100.0)
    values = np.array([-5.0, 0.0, 50.0, 100.0, 100.5, 1e9, -np.inf, np.inf, 33.3])
    clipped = np.clip(values, 0.0, 100.0)
    a = m.randomize(values, np.random.default_rng(7))
    b = m.randomize(clipped, np.random.default_rng(7))
    assert np.array_equal(a, b)
    x, mask = m.prepare(values)
    assert int(mask.sum()) == 5 and mask.tolist() == [True, False, False, False, True, True, True, True, False]
    assert x.min() == -1.0 and x.max() == 1.0
    with pytest.raises(LDPError):
        m.randomize(np.array([1.0, np.nan]), np.random.default_rng(7))


# ------------------------------------------------------------------ kernels == twins
@pytest.mark.parametrize("n", [0, 1, 2, 1000, 4100])
def test_duchi_kernel_equals_twin(n):
    g = np.random.default_rng(n)
    x = np.clip(g.uniform(-1.1, 1.1, n), -1, 1)
    for eps in (0.3, 4.0, 50.0):
        m = Duchi(eps)
        key = noise_key(g)
        a = duchi_randomize(x, key, np.int64(m.t_lo), float(m.s))
        assert a.dtype == np.int8 and np.array_equal(a, np_duchi_randomize(x, key, m.t_lo, float(m.s)))


@pytest.mark.parametrize("n", [0, 1, 2, 300, 4100])
def test_laplace_kernel_equals_twin(n):
    g = np.random.default_rng(1000 + n)
    x = np.clip(g.uniform(-1.1, 1.1, n), -1, 1)
    if n >= 300:
        x[:5] = [-1.0, 1.0, 0.0, 1e-300, -1e-20]
    extended = 0
    for eps, bits in ((1.0, 12), (0.05, 10), (7.0, 0))[: 1 if n > 1000 else 3]:
        m = Laplace(eps, grid_bits=bits)
        key = noise_key(g)
        a = lk.laplace_randomize(x, key, float(m.n_grid), np.uint64(m.noise_t), np.uint64(m.noise_s))
        used = np.zeros(n, dtype=np.int64)
        b = lk.np_laplace_randomize(x, key, m.n_grid, m.noise_t, m.noise_s, used)
        assert a.dtype == np.int32 and np.array_equal(a, b)
        extended += int((used > lk.LAPLACE_SLOT).sum())
    if n >= 300:
        assert extended > 0  # rows that read past their slot (the extension stream) are compared too


# ------------------------------------------------------------------ wire codec
@pytest.mark.parametrize("name", ["Laplace", "Duchi"])
def test_encode_decode(name):
    m = make_numeric(name, eps=1.0)
    r = m.randomize(np.linspace(-1, 1, 257), np.random.default_rng(3))
    blob = m.encode(r)
    assert len(blob) == r.size * m.report_dtype.itemsize
    assert np.array_equal(m.decode(blob), r) and m.decode(blob).dtype == m.report_dtype
    assert m.decode(b"").size == 0
    if m.report_dtype.itemsize > 1:
        with pytest.raises(InvalidReports):
            m.decode(blob[:-1])
    with pytest.raises(InvalidReports):
        m.encode(r.astype(np.float64))
    bad = np.array([0], dtype=np.int8) if name == "Duchi" else np.array([-(1 << 31)], dtype=np.int32)
    with pytest.raises(InvalidReports):
        m.decode(bad.astype(bad.dtype.newbyteorder("<")).tobytes())
    with pytest.raises(InvalidReports):
        m.encode(bad)
    if name == "Duchi":
        with pytest.raises(InvalidReports):
            m.decode(np.array([1, 2], dtype=np.int8).tobytes())


# ------------------------------------------------------------------ randomness modes
@pytest.mark.parametrize("name", ["Laplace", "Duchi"])
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
