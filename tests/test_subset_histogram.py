"""SS (ω-subset selection), SHE and THE (histogram encoding): accuracy against the exact
variance, kernels vs numpy references, wire codec, additivity and parameter validation."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2

import estimators
from estimators import kernels, randomness, reference
from estimators.errors import InfeasibleParameters, InvalidReports, LDPError
from estimators.histogram import SHE_T_BITS, she_noise_parameter, the_optimal_theta, the_probabilities
from estimators.subset import ss_optimal_omega, ss_probabilities


def zipf_histogram(k: int, s: float = 1.1) -> np.ndarray:
    w = 1.0 / np.arange(1, k + 1) ** s
    return w / w.sum()


def fixed_values(f: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Exactly ``round(f n)`` users per value (largest remainders), and the true frequencies."""
    raw = f * n
    c = np.floor(raw).astype(np.int64)
    c[np.argsort(c - raw)[: n - c.sum()]] += 1
    return np.repeat(np.arange(f.size), c), c / n


# ---------------------------------------------------------------- accuracy
ACCURACY = [("SS", dict(eps=1.0)),    # omega = 27, packed bits
            ("SS", dict(eps=4.0)),    # omega = 2, sorted indices
            ("THE", dict(eps=1.0)),
            ("THE", dict(eps=3.0)),
            ("SHE", dict(eps=1.0)),
            ("SHE", dict(eps=4.0))]


@pytest.mark.parametrize("name,kw", ACCURACY, ids=[f"{n}-{kw['eps']}" for n, kw in ACCURACY])
def test_mse_matches_exact_variance(name: str, kw: dict) -> None:
    """Users draw their values i.i.d. from ``f``: the model of ``variance_exact`` (as in Arcolezi
    et al., DCN 2022, Thm. 2)."""
    # SHE draws k Laplace noises per report: n = 20,000 for it; the 15% tolerance is several standard deviations
    # of the MSE estimate (a mean of reps k = 3,000 squared errors) whatever n is
    k, n, reps = 100, 20_000 if name == "SHE" else 100_000, 30
    proto = estimators.make(name, k=k, **kw)
    f = zipf_histogram(k)
    rng = np.random.default_rng(1234)
    sq = np.zeros(k)
    for _ in range(reps):
        values = rng.choice(k, size=n, p=f)
        est = proto.estimate(proto.support(proto.randomize(values, rng)), n)
        sq += (est - f) ** 2
    mse = sq.sum() / (reps * k)
    expected = float(np.mean(proto.variance_exact(f, n)))
    assert mse == pytest.approx(expected, rel=0.15), (mse, expected)


# ---------------------------------------------------------------- kernels vs references
@pytest.mark.parametrize("k,omega,ps", [(2, 1, 0.7), (10, 1, 0.5), (10, 9, 0.9), (37, 5, 0.3),
                                        (100, 27, 0.6), (21, 4, 0.0), (21, 4, 1.0)])
def test_ss_kernel_matches_reference(k: int, omega: int, ps: float) -> None:
    g = np.random.default_rng(k * 100 + omega)
    v = g.integers(0, k, 4000)
    nkey = randomness.noise_key(np.random.default_rng(77))
    a = kernels.ss_randomize(v, nkey, ps, omega, k)
    b = reference.ss_randomize(v, nkey, ps, omega, k)
    np.testing.assert_array_equal(a, b)
    assert (np.bitwise_count(a).sum(axis=1) == omega).all()
    i1 = kernels.packed_to_indices(a, np.empty((v.size, omega), np.uint8))
    i2 = reference.packed_to_indices(a, np.empty((v.size, omega), np.uint8))
    np.testing.assert_array_equal(i1, i2)
    assert (i1 < k).all() and (np.diff(i1.astype(int), axis=1) > 0).all()
    np.testing.assert_array_equal(kernels.packed_bit_counts(a, k), reference.packed_bit_counts(a, k))


@pytest.mark.parametrize("eps", [1e-4, 0.3, 1.0, 4.0, 16.0, 64.0])
@pytest.mark.parametrize("slot", ["default", 8])
def test_she_kernel_matches_reference(eps: float, slot) -> None:
    """Bit for bit, for the same batch key; ``slot = 8`` sends most draws to the extension streams."""
    proto = estimators.make("SHE", k=17, eps=eps)
    v = np.random.default_rng(3).integers(0, 17, 700)
    nkey = randomness.noise_key(np.random.default_rng(int(eps * 1e4)))
    w = proto.slot if slot == "default" else slot
    a = kernels.she_randomize(v, nkey, proto.s, SHE_T_BITS, proto.bound, w, np.empty((700, 17), proto.report_dtype))
    b = reference.she_randomize(v, nkey, proto.s, SHE_T_BITS, proto.bound, w, np.empty((700, 17), proto.report_dtype))
    np.testing.assert_array_equal(a, b)
    assert a.dtype == proto.report_dtype and np.abs(a.astype(np.int64)).max() <= proto.bound
    s1, bad1 = kernels.int_column_sums(a, proto.bound)
    s2, bad2 = reference.int_column_sums(a, proto.bound)
    np.testing.assert_array_equal(s1, s2)
    assert bad1 == bad2 == 0


def test_int_column_sums_counts_out_of_range() -> None:
    r = np.array([[5, -7, 0], [9, 1, -10]], dtype=np.int32)
    s, bad = kernels.int_column_sums(r, 8)
    np.testing.assert_array_equal(s, [14, -6, -10])
    assert bad == 2 and reference.int_column_sums(r, 8)[1] == 2


@pytest.mark.parametrize("name,kw", [("SS", dict(eps=1.0)), ("SS", dict(eps=4.0)), ("SHE", dict(eps=2.0))])
def test_randomize_uses_kernel_seeded_by_rng(name: str, kw: dict) -> None:
    proto = estimators.make(name, k=30, **kw)
    v = np.random.default_rng(5).integers(0, 30, 500)
    out = proto.randomize(v, np.random.default_rng(42))
    seed = randomness.noise_key(np.random.default_rng(42))  # what randomize draws from the same rng
    if name == "SS":
        bits = reference.ss_randomize(v, seed, proto.ps, proto.omega, 30)
        if proto.layout == "indices":
            bits = reference.packed_to_indices(bits, np.empty((500, proto.omega), proto.report_dtype))
        np.testing.assert_array_equal(out, bits)
    else:
        np.testing.assert_array_equal(out, reference.she_randomize(v, seed, proto.s, SHE_T_BITS, proto.bound,
                                                                   proto.slot, np.empty((500, 30), out.dtype)))


# ---------------------------------------------------------------- mechanism details
def test_ss_probabilities_match_seed_eq48() -> None:
    k, eps = 50, 1.3
    omega = ss_optimal_omega(k, eps)
    assert omega == max(1, round(k / (np.exp(eps) + 1)))
    ps, qs = ss_probabilities(k, eps, omega)
    e = np.exp(eps)
    assert ps == pytest.approx(omega * e / (omega * e + k - omega), rel=1e-14)
    d = omega * e + k - omega
    theta_fr = omega * e / d * (omega - 1) / (k - 1) + (k - omega) / d * omega / (k - 1)
    assert qs == pytest.approx(theta_fr, rel=1e-14)
    # every report has exactly omega elements, so sum_v C(v) = n omega, i.e. ps + (k-1) qs = omega
    assert ps + (k - 1) * qs == pytest.approx(omega, rel=1e-14)
    for e_ in (0.1, 1.0, 5.0, 12.0):
        for om in (1, 3, 25):
            assert estimators.make("SS", k=k, eps=e_, omega=om).eps_first == pytest.approx(e_, rel=1e-12)
    assert estimators.make("SS", k=2, eps=1.0).omega == 1
    assert estimators.make("SS", k=100, eps=10.0).omega == 1


def test_ss_empirical_inclusion_rates() -> None:
    k, n = 20, 200_000
    proto = estimators.make("SS", k=k, eps=1.0, omega=5)
    r = proto.randomize(np.full(n, 3), np.random.default_rng(9))
    c = proto.support(r)
    assert c.sum() == n * 5
    assert abs(c[3] - n * proto.ps) < 4 * np.sqrt(n * proto.ps * (1 - proto.ps))
    others = np.delete(c, 3)
    assert np.all(np.abs(others - n * proto.qs) < 4.5 * np.sqrt(n * proto.qs * (1 - proto.qs)))


def test_ss_layouts_agree() -> None:
    v = np.random.default_rng(2).integers(0, 40, 5000)
    bits = estimators.make("SS", k=40, eps=2.0, layout="bits")
    idx = estimators.make("SS", k=40, eps=2.0, layout="indices")
    rb, ri = bits.randomize(v, np.random.default_rng(8)), idx.randomize(v, np.random.default_rng(8))
    assert rb.shape == (5000, 5) and ri.shape == (5000, idx.omega)
    np.testing.assert_array_equal(bits.support(rb), idx.support(ri))
    member = np.unpackbits(rb, axis=1, bitorder="little")[:, :40].astype(bool)
    np.testing.assert_array_equal(np.nonzero(member)[1].reshape(ri.shape), ri)
    # auto layout: indices only when they are smaller than the bit vector
    assert estimators.make("SS", k=100, eps=1.0).layout == "bits"
    assert estimators.make("SS", k=100, eps=4.0).layout == "indices"
    assert estimators.make("SS", k=1000, eps=4.0).report_dtype == np.uint16


def test_the_probabilities_and_eps() -> None:
    for eps in (0.1, 0.5, 1.0, 2.0, 5.0, 10.0):
        proto = estimators.make("THE", k=10, eps=eps)
        t = proto.theta
        assert 0.5 < t < 1.0
        ps, qs = the_probabilities(eps, t)
        assert proto.ps == pytest.approx(ps, abs=2**-32) and proto.qs == pytest.approx(qs, abs=2**-32)
        closed = eps / 2 + np.log(2 - np.exp(-eps * (1 - t) / 2)) + np.log(2 - np.exp(-eps * t / 2))
        assert proto.eps_first == pytest.approx(closed, rel=1e-6)
        assert proto.eps_first <= eps
        # default theta minimizes Var*
        var = lambda th: (lambda p, q: q * (1 - q) / (p - q) ** 2)(*the_probabilities(eps, th))  # noqa: E731
        assert var(t) <= min(var(t - 0.01), var(t + 0.01))
    assert the_optimal_theta(1.0) == pytest.approx(0.618553, abs=2e-6)
    assert estimators.make("THE", k=10, eps=1.0, theta=0.9).theta == 0.9


def test_the_empirical_bit_rates() -> None:
    n = 200_000
    proto = estimators.make("THE", k=12, eps=1.5, theta=0.7)
    c = proto.support(proto.randomize(np.full(n, 4), np.random.default_rng(10)))
    assert abs(c[4] - n * proto.ps) < 4 * np.sqrt(n * proto.ps * (1 - proto.ps))
    assert np.all(np.abs(np.delete(c, 4) - n * proto.qs) < 4.5 * np.sqrt(n * proto.qs * (1 - proto.qs)))


def she_output_log_law(s: int, c: int, bound: int) -> np.ndarray:
    """``ln P(y | c)`` for ``y = -bound .. bound``: ``y = clip(c + Z, -bound, bound)`` with
    ``P(Z = z) ∝ exp(-γ|z|)``, ``γ = s / 2^48``, computed here from the pmf alone (the clipped
    tails by direct summation of the pmf), independently of the protocol's formulas."""
    gamma = s / 2.0 ** SHE_T_BITS
    alpha = np.exp(-gamma)
    norm = (1 - alpha) / (1 + alpha)
    pmf = lambda z: norm * alpha ** np.abs(z)  # noqa: E731
    y = np.arange(-bound, bound + 1)
    p = pmf(y - c)
    far = int(np.ceil(80 / gamma)) + 2  # alpha^far < e^-80: the rest of a tail is below float resolution
    p[-1] = pmf(np.arange(bound - c, bound - c + far)).sum()
    p[0] = pmf(np.arange(-bound - c - far + 1, -bound - c + 1)).sum()
    assert abs(p.sum() - 1) < 1e-12
    return np.log(p)


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0, 8.0, 16.0, 0.3, 1.7])
def test_she_exact_eps_equals_stated_eps(eps: float) -> None:
    """Acceptance: SHE's exact ε equals the stated ε (relative error < 1e-9).

    The exact ε of the report law: two inputs differ in two coordinates (one goes 0 -> 1, the
    other 1 -> 0) and the coordinates are independent, so ε = max_y ln P(y|1)/P(y|0) +
    max_y ln P(y|0)/P(y|1), each over the whole clipped output range."""
    proto = estimators.make("SHE", k=10, eps=eps)
    assert proto.s == she_noise_parameter(eps) == int(np.floor(eps / 2 * 2.0 ** SHE_T_BITS))
    l0, l1 = she_output_log_law(proto.s, 0, proto.bound), she_output_log_law(proto.s, 1, proto.bound)
    exact = float(np.max(l1 - l0) + np.max(l0 - l1))
    print(f"SHE eps = {eps:g}: exact eps = {exact!r}, eps_first = {proto.eps_first!r}, "
          f"relative error {abs(exact - eps) / eps:.2e}")
    assert abs(exact - eps) / eps < 1e-9
    assert abs(exact - proto.eps_first) / eps < 1e-9
    assert proto.eps_first <= eps and abs(proto.eps_first - eps) / eps < 1e-9
    # the whole accepted range keeps 2 gamma within 1e-9 of eps, from below
    for e in (1e-4, 1.23456789e-4, 3e-3, 0.7, 33.3, 64.0):
        p = estimators.make("SHE", k=4, eps=e)
        assert p.eps_first <= e and (e - p.eps_first) / e < 1e-9


def she_noise_sample(eps: float, n: int, k: int, seed: int) -> np.ndarray:
    """``(n, k-1)`` clipped noise draws: reports of value 0, coordinates 1 .. k-1."""
    proto = estimators.make("SHE", k=k, eps=eps)
    with pytest.warns(randomness.SimulationWarning):
        r = proto.randomize(np.zeros(n, np.int64), np.random.default_rng(seed))
    return r[:, 1:].astype(np.int64).ravel()


def chi_square_pvalue(z: np.ndarray, gamma: float, bound: int) -> float:
    """Goodness of fit of clipped draws to the discrete Laplace law with parameter ``gamma``
    (cells with expected count < 5 pooled into the two tails)."""
    alpha = np.exp(-gamma)
    vals = np.arange(-bound, bound + 1)
    p = (1 - alpha) / (1 + alpha) * alpha ** np.abs(vals)
    p[0] += alpha ** (bound + 1) / (1 + alpha)
    p[-1] += alpha ** (bound + 1) / (1 + alpha)
    obs = np.bincount(z + bound, minlength=2 * bound + 1).astype(np.float64)
    keep = np.nonzero(p * z.size >= 5)[0]
    lo, hi = keep[0], keep[-1]
    e = np.concatenate([[p[: lo + 1].sum()], p[lo + 1: hi], [p[hi:].sum()]]) * z.size
    o = np.concatenate([[obs[: lo + 1].sum()], obs[lo + 1: hi], [obs[hi:].sum()]])
    stat = float(((o - e) ** 2 / e).sum())
    return float(chi2.sf(stat, e.size - 1))


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_she_noise_follows_the_discrete_laplace_law(eps: float) -> None:
    """~200k kernel draws match P(Z = z) ∝ e^{-γ|z|} (chi-square), and a 3% wrong γ fails."""
    proto = estimators.make("SHE", k=50, eps=eps)
    z = she_noise_sample(eps, 4000, 50, seed=int(100 * eps))
    assert z.size == 196_000
    assert chi_square_pvalue(z, proto.gamma, proto.bound) > 1e-3
    # negative controls: the same draws reject a γ that is 3% too large or too small
    assert chi_square_pvalue(z, 1.03 * proto.gamma, proto.bound) < 1e-6
    assert chi_square_pvalue(z, 0.97 * proto.gamma, proto.bound) < 1e-6
    # per-value counts within 4.5 standard deviations
    alpha = proto.alpha
    for v in range(-3, 4):
        pv = (1 - alpha) / (1 + alpha) * alpha ** abs(v)
        assert abs((z == v).sum() - z.size * pv) < 4.5 * np.sqrt(z.size * pv * (1 - pv))


def test_she_moments_and_noise() -> None:
    for eps in (0.5, 1.0, 4.0, 16.0, 0.3):
        p = estimators.make("SHE", k=5, eps=eps)
        assert p.eps_first == pytest.approx(eps, rel=1e-9)
        a = p.alpha
        # exact moments of the clipped report law, by summation over the output range
        y = np.arange(-p.bound, p.bound + 1)
        for c, mu, var in ((0, p.mu0, p.var0), (1, p.mu1, p.var1)):
            law = np.exp(she_output_log_law(p.s, c, p.bound))
            m = float((law * y).sum())
            assert mu == pytest.approx(m, rel=1e-12, abs=1e-14)
            assert var == pytest.approx(float((law * (y - m) ** 2).sum()), rel=1e-10)
        assert p.mu0 == 0.0 and p.mu1 == pytest.approx(1.0, rel=1e-15)
        # unclipped: Var(Z) = 2 alpha / (1 - alpha)^2; the clip removes a relative e^-40
        assert p.var0 == pytest.approx(2 * a / (1 - a) ** 2, rel=1e-12)
        assert p.variance(1000) == pytest.approx(2 * a / (1 - a) ** 2 / 1000, rel=1e-12)
    assert estimators.make("SHE", k=5, eps=1e-3).variance(1000) == pytest.approx(8 / (1000 * 1e-3 ** 2), rel=1e-6)
    p = estimators.make("SHE", k=4, eps=1.0)
    n = 200_000
    r = p.randomize(np.full(n, 1), np.random.default_rng(11)).astype(np.float64)
    sd = np.sqrt(p.var0 / n)
    assert abs(r[:, 1].mean() - p.mu1) < 4 * sd and abs(r[:, 0].mean()) < 4 * sd
    assert r[:, 0].var() == pytest.approx(p.var0, rel=0.03)
    assert np.abs(r).max() <= p.bound
    # report types: the smallest signed integer holding the clip bound 1 + ceil(40 / gamma)
    for eps, bound, dt in ((64.0, 3, np.int8), (1.0, 81, np.int8), (0.5, 161, np.int16), (1e-4, 800_002, np.int32)):
        p = estimators.make("SHE", k=5, eps=eps)
        assert (p.bound, p.report_dtype) == (bound, np.dtype(dt))


def test_she_postprocessing() -> None:
    p = estimators.make("SHE", k=20, eps=2.0)
    values, f = fixed_values(zipf_histogram(20), 20_000)
    counts = p.support(p.randomize(values, np.random.default_rng(12)))
    for method in ("clip", "norm-sub", "project"):
        est = p.estimate(counts, 20_000, postprocess=method)
        assert est.sum() == pytest.approx(1.0) and (est >= 0).all()
    with pytest.raises(LDPError, match="IBU"):
        p.estimate(counts, 20_000, postprocess="ibu")
    with pytest.raises(LDPError):
        p.estimate(counts, 20_000, postprocess="nope")
    est = estimators.make("THE", k=20, eps=2.0)
    c2 = est.support(est.randomize(values, np.random.default_rng(12)))
    assert est.estimate(c2, 20_000, postprocess="ibu").sum() == pytest.approx(1.0)


@pytest.mark.parametrize("name,kw,k", [("SS", dict(eps=1.0, omega=3), 10),
                                       ("SS", dict(eps=1.0, omega=3, layout="indices"), 10),
                                       ("THE", dict(eps=1.0), 10), ("SHE", dict(eps=1.0), 6)])
def test_audit_event_ratio(name: str, kw: dict, k: int) -> None:
    """The audit event separates v1 from v2 by a log-ratio of exactly eps_first."""
    proto = estimators.make(name, k=k, **kw)
    n = 200_000
    g = np.random.default_rng(13)
    p1 = proto.audit_event(proto.randomize(np.full(n, 1), g), 1, 2).mean()
    p2 = proto.audit_event(proto.randomize(np.full(n, 2), g), 1, 2).mean()
    est = np.log(p1 / p2)
    sd = np.sqrt((1 - p1) / (n * p1) + (1 - p2) / (n * p2))
    assert abs(est - proto.eps_first) < 4 * sd


# ---------------------------------------------------------------- codec, validation, additivity
CODEC = [("SS", dict(k=100, eps=1.0)), ("SS", dict(k=100, eps=4.0)), ("SS", dict(k=13, eps=0.5, omega=1)),
         ("THE", dict(k=100, eps=1.0)), ("SHE", dict(k=30, eps=1.0))]


@pytest.mark.parametrize("name,kw", CODEC, ids=[f"{n}-{kw}" for n, kw in CODEC])
def test_codec_round_trip_and_additivity(name: str, kw: dict) -> None:
    proto = estimators.make(name, **kw)
    g = np.random.default_rng(14)
    v = g.integers(0, proto.k, 3001)
    r = proto.randomize(v, g)
    assert r.dtype == proto.report_dtype and r.shape == (3001, *proto.report_shape)
    back = proto.decode(proto.encode(r))
    np.testing.assert_array_equal(back, r)
    counts = proto.support(r)
    assert counts.dtype == np.int64 and counts.shape == (proto.k,)
    np.testing.assert_array_equal(proto.support(r[:1000]) + proto.support(r[1000:]), counts)
    np.testing.assert_array_equal(proto.support(r[:0]), np.zeros(proto.k, np.int64))
    clone = estimators.from_params(proto.params())
    assert clone.fingerprint == proto.fingerprint and clone.params() == proto.params()


def _reject(proto, bad: np.ndarray) -> None:
    with pytest.raises(InvalidReports):
        proto.support(bad)
    with pytest.raises(InvalidReports):
        proto.decode(proto.encode(bad))


def test_ss_bits_rejects_out_of_domain() -> None:
    proto = estimators.make("SS", k=100, eps=1.0)  # 100 bits: 4 pad bits in the last byte
    r = proto.randomize(np.arange(50) % 100, np.random.default_rng(15))
    bad = r.copy()
    bad[3, -1] |= np.uint8(0x80)  # bit 103, beyond k (and one element too many)
    _reject(proto, bad)
    bad = r.copy()
    j = int(np.nonzero(np.unpackbits(bad[0], bitorder="little") == 0)[0][0])
    bad[0, j >> 3] |= np.uint8(1 << (j & 7))  # omega + 1 elements
    _reject(proto, bad)
    bad = r.copy()
    bad[1] = 0  # empty subset
    _reject(proto, bad)
    with pytest.raises(InvalidReports):
        proto.support(r.astype(np.int16))
    with pytest.raises(InvalidReports):
        proto.support(r[:, :-1])


def test_ss_indices_rejects_out_of_domain() -> None:
    proto = estimators.make("SS", k=100, eps=4.0)
    assert proto.layout == "indices" and proto.omega == 2
    r = proto.randomize(np.arange(50) % 100, np.random.default_rng(16))
    for row in ([5, 5], [7, 3], [10, 100], [200, 255]):
        bad = r.copy()
        bad[4] = row
        _reject(proto, bad)
    with pytest.raises(InvalidReports):
        proto.support(np.zeros((4, 3), np.uint8))  # three elements instead of two
    wrong_size = estimators.make("SS", k=100, eps=4.0, omega=3, layout="indices")
    blob = wrong_size.encode(np.tile(np.array([1, 2, 3], np.uint8), (5, 1)))
    with pytest.raises(InvalidReports):
        proto.decode(blob)
    with pytest.raises(InvalidReports):
        proto.support(np.array([[-1, 4]]))


def test_the_and_she_reject_out_of_domain() -> None:
    the = estimators.make("THE", k=100, eps=1.0)
    r = the.randomize(np.zeros(10, int), np.random.default_rng(17))
    bad = r.copy()
    bad[2, -1] |= np.uint8(0x40)
    _reject(the, bad)
    she = estimators.make("SHE", k=8, eps=1.0)
    r = she.randomize(np.zeros(10, int), np.random.default_rng(18))
    for val in (she.bound + 1, -she.bound - 1, np.iinfo(she.report_dtype).min):
        bad = r.copy()
        bad[5, 3] = val
        _reject(she, bad)
    with pytest.raises(InvalidReports):
        she.support(r.astype(np.int64))
    with pytest.raises(InvalidReports):
        she.support(r[:, :7])


def test_parameter_validation() -> None:
    for bad in (0, 100, 2.5, True, -1):
        with pytest.raises(LDPError):
            estimators.make("SS", k=100, eps=1.0, omega=bad)
    with pytest.raises(LDPError):
        estimators.make("SS", k=100, eps=1.0, layout="bytes")
    for name in ("SS", "SHE", "THE"):
        for eps in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(LDPError):
                estimators.make(name, k=10, eps=eps)
        with pytest.raises(LDPError):
            estimators.make(name, k=1, eps=1.0)
        with pytest.raises(LDPError):
            estimators.make(name, k=10)
        with pytest.raises(LDPError):
            estimators.make(name, k=10, eps=1.0, bogus=1)
    for theta in (0.0, 1.0, -0.2, 1.5, float("nan")):
        with pytest.raises(LDPError):
            estimators.make("THE", k=10, eps=1.0, theta=theta)
    with pytest.raises(InfeasibleParameters):
        estimators.make("THE", k=10, eps=200.0)
    for eps in (5e-5, 9.9e-5, 64.5, 1000.0):
        with pytest.raises(InfeasibleParameters):
            estimators.make("SHE", k=10, eps=eps)
    she = estimators.make("SHE", k=10, eps=1.0)
    with pytest.raises(LDPError):
        she.randomize(np.array([0, 10]), np.random.default_rng(0))
    with pytest.raises(LDPError):
        she.randomize(np.array([0, 1]), np.random.default_rng(0), state=object())
    with pytest.raises(LDPError):
        she.estimate(np.zeros(9, np.int64), 10)
    for name in ("SS", "SHE", "THE"):
        p = estimators.make(name, k=10, eps=1.0)
        assert p.memo_size == 0 and p.new_state(5) is None and p.eps_inf == p.eps_first
        assert name in estimators.PROTOCOLS
