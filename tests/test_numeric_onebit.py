"""1BitMean with α-point rounding, memoization and output perturbation (estimators.numeric.onebit; Ding, Kulkarni
& Yekhanin, NeurIPS 2017): exact ε, the sampler against the law, unbiasedness and the variance with its rounding
term, memoized repeated reports and their longitudinal accounting, the kernels against their numpy twins."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from estimators.errors import InfeasibleParameters, InvalidReports, InvalidState, LDPError
from estimators.memo import MemoState
from estimators.numeric import eps_of_law, make_numeric
from estimators.numeric import onebit_kernels as obk
from estimators.numeric.onebit import OneBitMean
from estimators.randomness import SimulationWarning, noise_key

EPSILONS = (0.5, 1.0, 4.0)
P_MIN = 1e-4  # p-value threshold of the goodness-of-fit tests, fixed in advance


@pytest.fixture(autouse=True)
def _quiet_simulation():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        yield


def _edges(m: OneBitMean) -> np.ndarray:
    a, b = m.unit_outputs(np.array([0, 1]))
    return np.array([a - 1.0, (a + b) / 2.0, b + 1.0])


def _law_inputs(m: OneBitMean) -> np.ndarray:
    points = 2.0 * np.arange(m.s + 1) / m.s - 1.0
    return np.unique(np.concatenate([points, (points[1:] + points[:-1]) / 2.0, np.linspace(-1, 1, 23)]))


# ---------------------------------------------------------------- 1. exact ε
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("s,gamma", [(1, 0.0), (16, 0.0), (7, 0.1), (1000, 0.3)])
def test_eps_of_law_is_exact(eps, s, gamma):
    m = OneBitMean(eps, 0.0, 10.0, s=s, gamma=gamma)
    assert eps_of_law(m, _law_inputs(m), _edges(m)) == pytest.approx(m.eps_first, rel=1e-9)
    assert m.eps_first <= eps and m.eps_memo <= eps
    assert m.eps_memo == pytest.approx(eps, rel=1e-9)  # the memoized bit: 1BitMean's ε (Eq. 1 at x = 0, m)
    if gamma == 0.0:
        assert m.eps_first == pytest.approx(m.eps_memo, rel=1e-12)
    else:  # output perturbation: ln of ((1-2γ) e^ε/(e^ε+1) + γ) / ((1-2γ)/(e^ε+1) + γ)
        e = np.exp(eps)
        hi, lo = (1 - 2 * gamma) * e / (e + 1) + gamma, (1 - 2 * gamma) / (e + 1) + gamma
        assert m.eps_first == pytest.approx(np.log(hi / lo), rel=1e-9) and m.eps_first < m.eps_memo


@pytest.mark.parametrize("eps", EPSILONS)
def test_eps_of_law_negative(eps):
    small, big = OneBitMean(eps), OneBitMean(2.0 * eps)
    assert eps_of_law(big, _law_inputs(big), _edges(big)) > small.eps_first + 0.9 * eps


# ---------------------------------------------------------------- 2. sampler against the law
@pytest.mark.parametrize("x", [-1.0, -0.3, 0.123456, 1.0])
@pytest.mark.parametrize("memo", [False, True])
def test_samples_follow_the_law(x, memo):
    """Fresh devices (single shot, or a new memo state: fresh keys and α) report 1 with ``P(x)``."""
    m = OneBitMean(1.0, s=5, gamma=0.05)
    n = 100_000
    rng = np.random.default_rng(int(100 * (x + 2)) + memo)
    state = m.new_state(n, rng) if memo else None
    ones = int(m.randomize(np.full(n, x), rng, state=state).sum())
    assert stats.binomtest(ones, n, m.p_one(x)).pvalue > P_MIN
    np.testing.assert_allclose(m.output_mass(x, _edges(m)), [1 - m.p_one(x), m.p_one(x)])


# ---------------------------------------------------------------- 3. acceptance: MSE of the mean
def _inputs(kind: str, n: int, rng: np.random.Generator, lo: float, hi: float) -> np.ndarray:
    if kind == "uniform":
        u = rng.uniform(0.0, 1.0, n)
    elif kind == "skewed":
        u = rng.beta(2.0, 8.0, n)
    else:  # bimodal near the ends
        u = np.clip(np.where(rng.random(n) < 0.5, rng.normal(0.03, 0.02, n), rng.normal(0.97, 0.02, n)), 0, 1)
    return lo + (hi - lo) * u


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("kind", ["uniform", "skewed", "bimodal"])
def test_mse_of_mean_matches_the_variance(eps, kind):
    """The empirical MSE of ``R`` repetitions estimates the variance with relative sd ``sqrt(2/R)`` (3.7% at
    R = 1500): 15% is four of them. Single-shot reports (a fresh device per report)."""
    m = OneBitMean(eps, lo=10.0, hi=50.0)
    rng = np.random.default_rng([int(eps * 10), ["uniform", "skewed", "bimodal"].index(kind)])
    n, R = 200, 1500
    values = _inputs(kind, n, rng, m.lo, m.hi)
    sums = m.randomize(np.tile(values, R), rng).reshape(R, n).sum(axis=1)
    est = np.array([m.estimate_mean(s, n) for s in sums])
    assert abs(np.mean((est - values.mean()) ** 2) / m.mean_variance(values) - 1.0) < 0.15


def test_mse_with_memoized_devices():
    """The same check with devices that hold memo states (new devices every repetition): α-point rounding
    keeps the estimator unbiased, and its rounding term is part of the variance (module doc)."""
    m = OneBitMean(1.0, lo=0.0, hi=1.0, s=4)
    rng = np.random.default_rng(77)
    n, R = 200, 1500
    values = rng.uniform(0.0, 1.0, n)
    state = m.new_state(n * R, rng)
    sums = m.randomize(np.tile(values, R), state=state).reshape(R, n).sum(axis=1)
    est = np.array([m.estimate_mean(s, n) for s in sums])
    assert abs(np.mean((est - values.mean()) ** 2) / m.mean_variance(values) - 1.0) < 0.15


# ---------------------------------------------------------------- unbiasedness and the rounding term
def test_unbiased_over_devices_with_the_rounding_variance():
    m = OneBitMean(2.0, lo=0.0, hi=100.0, s=10)
    x_metric = 33.3  # u = 0.333: between the points 3/10 and 4/10 (f = 0.33)
    n = 400_000
    state = m.new_state(n, np.random.default_rng(8))
    bits = m.randomize(np.full(n, x_metric), state=state)
    assert abs(m.estimate_mean(bits.sum(), n) - x_metric) < 4.0 * np.sqrt(m.mean_variance(np.full(n, x_metric)))
    # the rounded points over α: unbiased for u, with variance (u - L)(R - u)
    u = 0.333
    j = np.unpackbits(state.seen[:50_000], axis=1, bitorder="little")[:, : m.s + 1].argmax(axis=1)
    assert abs(j.mean() / m.s - u) < 4.0 * np.sqrt((u - 0.3) * (0.4 - u) / 50_000)
    assert np.var(j / m.s) == pytest.approx((u - 0.3) * (0.4 - u), rel=0.05)
    # variance = bit noise + rounding term, and the rounding term is (u - L)(R - u) in unit scale (x4)
    x = np.array([-1.0, -0.334, 0.0, 0.2718, 0.999, 1.0])
    bit, rounding = m.unit_variance_parts(x)
    np.testing.assert_allclose(bit + rounding, m.unit_variance(x), rtol=1e-12)
    uu = (x + 1) / 2
    lo = np.minimum(np.floor(uu * m.s), m.s - 1) / m.s
    np.testing.assert_allclose(rounding, 4 * (uu - lo) * (lo + 1 / m.s - uu), atol=1e-12)
    assert np.all(rounding[[0, 2, 5]] < 1e-15) and np.all(rounding[[1, 3]] > 1e-3)


def test_rounding_costs_no_accuracy():
    """DKY, §3.1: the variance does not depend on s (P(x) is affine), only its split does."""
    x = np.linspace(-1, 1, 13)
    base = OneBitMean(1.0, s=1).unit_variance(x)
    for s in (2, 16, 1000):
        np.testing.assert_allclose(OneBitMean(1.0, s=s).unit_variance(x), base, rtol=1e-9)
    e = np.exp(1.0)  # DKY's 1BitMean: Var of one unit estimate = 4 p (1 - p) ((e+1)/(e-1))^2
    p = 1 / (e + 1) + (x + 1) / 2 * (e - 1) / (e + 1)
    np.testing.assert_allclose(base, 4 * p * (1 - p) * ((e + 1) / (e - 1)) ** 2, rtol=1e-9)


# ---------------------------------------------------------------- memoization
def test_repeated_reports_of_one_value_repeat_the_bit():
    m = OneBitMean(1.0, lo=0.0, hi=60.0, s=6)
    state = m.new_state(1, np.random.default_rng(3))
    bits = {int(m.randomize(np.array([25.0]), state=state)[0]) for _ in range(100)}
    assert len(bits) == 1
    assert state.memoized_count()[0] == 1
    assert m.state_loss(state)[0] == pytest.approx(m.eps_memo)  # no growth with the number of reports
    # many devices, 100 reports each of the same value: the same bit every time
    many = m.new_state(2000, np.random.default_rng(4))
    v = np.random.default_rng(5).uniform(0, 60, 2000)
    first = m.randomize(v, state=many)
    for _ in range(99):
        np.testing.assert_array_equal(m.randomize(v, state=many), first)
    assert np.all(m.state_loss(many) == pytest.approx(m.eps_memo))
    # without memo state every report is a fresh device: the bits vary
    fresh = m.randomize(np.full(100, 25.0), np.random.default_rng(6))
    assert 0 < fresh.sum() < 100


def test_values_rounding_to_the_same_point_share_the_bit():
    m = OneBitMean(1.0, lo=0.0, hi=10.0, s=10)
    state = m.new_state(500, np.random.default_rng(12))
    alpha = m.alphas(state)
    # values 3 + δ round down to 3 for every δ < α (the device's α-point in the bucket [3, 4))
    a = m.randomize(np.full(500, 3.0), state=state)
    b = m.randomize(3.0 + 0.999 * alpha, state=state)
    np.testing.assert_array_equal(a, b)
    assert np.all(state.memoized_count() == 1)


def test_longitudinal_loss_counts_distinct_points_capped():
    m = OneBitMean(1.0, lo=0.0, hi=1.0, s=4)
    state = m.new_state(1, np.random.default_rng(1))
    for k, v in enumerate([0.0, 0.25, 0.5, 0.5, 0.25, 0.75, 1.0, 0.0], start=1):
        m.randomize(np.array([v]), state=state)
    assert state.memoized_count()[0] == 5
    assert m.state_loss(state)[0] == pytest.approx(5 * m.eps_memo)
    np.testing.assert_allclose(m.longitudinal_loss(np.array([0, 1, 3, 5, 6, 1000])),
                               np.array([0, 1, 3, 5, 5, 5]) * m.eps_memo)
    assert m.longitudinal_loss(2) == pytest.approx(2 * m.eps_memo)


def test_memo_state_restores_the_same_bits(tmp_path):
    m = OneBitMean(1.0, lo=0.0, hi=1.0, s=8)
    state = m.new_state(300, np.random.default_rng(2))
    v = np.random.default_rng(3).uniform(0, 1, 300)
    first = m.randomize(v, state=state)
    state.save(tmp_path / "memo.npz")
    again = MemoState.load(tmp_path / "memo.npz", m.fingerprint)
    np.testing.assert_array_equal(m.randomize(v, state=again), first)
    np.testing.assert_array_equal(m.alphas(again), m.alphas(state))
    with pytest.raises(InvalidState):
        m.randomize(v[:10], state=state)
    with pytest.raises(InvalidState):
        OneBitMean(1.0, lo=0.0, hi=1.0, s=9).randomize(v, state=state)


def test_alpha_is_uniform_and_keyed():
    m = OneBitMean(1.0)
    state = m.new_state(20_000, np.random.default_rng(21))
    alpha = m.alphas(state)
    assert stats.kstest(alpha, "uniform").pvalue > P_MIN
    assert len(np.unique(alpha)) == alpha.size


def test_output_perturbation_flips_with_probability_gamma():
    """DKY, §4: each report is the memoized bit flipped with probability γ (fresh noise)."""
    m0, m = OneBitMean(1.0, s=4), OneBitMean(1.0, s=4, gamma=0.2)
    state = m.new_state(2000, np.random.default_rng(31))
    v = np.random.default_rng(32).uniform(-1, 1, 2000)
    memo = m0.randomize(v, state=MemoState(m0.fingerprint, state.keys, state.seen.copy(), state.memo_size))
    rng = np.random.default_rng(33)
    flips = sum(int((m.randomize(v, rng, state=state) != memo).sum()) for _ in range(20))
    assert stats.binomtest(flips, 20 * 2000, m.g / 2**53).pvalue > P_MIN
    assert np.all(state.memoized_count() == 1)


# ---------------------------------------------------------------- 4. clipping
def test_clipping_and_nan():
    m = OneBitMean(1.0, lo=0.0, hi=100.0)
    values = np.array([-5.0, 0.0, 50.0, 100.0, 250.0, 1e9, -1e9])
    clipped = np.clip(values, 0.0, 100.0)
    np.testing.assert_array_equal(m.randomize(values, np.random.default_rng(11)),
                                  m.randomize(clipped, np.random.default_rng(11)))
    s1, s2 = m.new_state(7, np.random.default_rng(1)), m.new_state(7, np.random.default_rng(1))
    np.testing.assert_array_equal(m.randomize(values, state=s1), m.randomize(clipped, state=s2))
    assert m.prepare(values)[1].sum() == 4
    with pytest.raises(LDPError):
        m.randomize(np.array([1.0, np.nan]))


# ---------------------------------------------------------------- 5. kernels == numpy twins
@pytest.mark.parametrize("n", [0, 1, 2, 4097, 10_000])
@pytest.mark.parametrize("s,gamma", [(1, 0.0), (16, 0.0), (7, 0.25)])
def test_kernels_equal_twins(n, s, gamma):
    m = OneBitMean(1.0, s=s, gamma=gamma)
    rng = np.random.default_rng(n + s)
    x = rng.uniform(-1.0, 1.0, n)
    x[: min(n, 3)] = [-1.0, 1.0, 0.0][: min(n, 3)]
    key = noise_key(rng)
    t_lo, step, g = np.uint64(m.t_lo), np.uint64(m.step), np.uint64(m.g)
    np.testing.assert_array_equal(obk.onebit_randomize(x, key, m.s, t_lo, step, g),
                                  obk.np_onebit_randomize(x, key, m.s, m.t_lo, m.step, m.g))
    a = m.new_state(n, rng)
    b = MemoState(a.fingerprint, a.keys.copy(), a.seen.copy(), a.memo_size)
    np.testing.assert_array_equal(obk.onebit_randomize_memo(x, a.keys, a.seen, key, m.s, t_lo, step, g),
                                  obk.np_onebit_randomize_memo(x, b.keys, b.seen, key, m.s, m.t_lo, m.step, m.g))
    np.testing.assert_array_equal(a.seen, b.seen)
    np.testing.assert_array_equal(obk.onebit_alpha(a.keys), obk.np_onebit_alpha(a.keys))


# ---------------------------------------------------------------- 6. wire format
def test_encode_decode():
    m = OneBitMean(1.0)
    r = m.randomize(np.linspace(-1, 1, 1000), np.random.default_rng(1))
    assert r.dtype == np.uint8 and set(np.unique(r)) <= {0, 1}
    np.testing.assert_array_equal(m.decode(m.encode(r)), r)
    with pytest.raises(InvalidReports):
        m.decode(np.array([0, 1, 2], dtype=np.uint8).tobytes())
    with pytest.raises(InvalidReports):
        m.encode(r.astype(np.int16))
    assert m.decode(b"").shape == (0,)


# ---------------------------------------------------------------- 7. randomness modes
def test_csprng_and_simulation_warning():
    m = OneBitMean(1.0, gamma=0.1)
    r = m.randomize(np.zeros(100))
    assert r.shape == (100,) and r.dtype == np.uint8
    state = m.new_state(3)  # OS CSPRNG keys
    with warnings.catch_warnings():
        warnings.simplefilter("error", SimulationWarning)
        m.randomize(np.zeros(3))
        m.randomize(np.zeros(3), state=state)
        with pytest.raises(SimulationWarning):
            m.randomize(np.zeros(3), np.random.default_rng(0))
        with pytest.raises(SimulationWarning):
            m.new_state(3, np.random.default_rng(0))


# ---------------------------------------------------------------- identity
def test_params_registry_and_validation():
    m = make_numeric("1BitMean", eps=1.0, lo=0.0, hi=5.0, s=8, gamma=0.1)
    assert isinstance(m, OneBitMean) and m.longitudinal and m.aggregate == "mean"
    assert m.params() == {"mechanism": "1BitMean", "eps": 1.0, "lo": 0.0, "hi": 5.0, "s": 8, "gamma": 0.1}
    assert m.new_state(2).memo_size == 9
    for bad in (dict(s=0), dict(s=2.5), dict(gamma=0.5), dict(gamma=-0.1)):
        with pytest.raises(LDPError):
            OneBitMean(1.0, **bad)
    with pytest.raises(InfeasibleParameters):
        OneBitMean(1e-13, s=1 << 20)
