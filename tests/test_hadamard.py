"""HR (Hadamard randomized response; Wang et al., Sensors 2020, §3.1.4) and FHR (Flexible Hadamard
Response; Zhao et al., arXiv 2022)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import estimators
from estimators import kernels, randomness, reference
from estimators.audit import audit
from estimators.errors import InvalidReports, LDPError
from estimators.hadamard import FHR, HR, MAX_K, hadamard_entry, hadamard_order

NAMES = ["HR", "FHR"]


def zipf_histogram(k: int, s: float = 1.1) -> np.ndarray:
    """A skewed true histogram over ``k`` values (Zipf with exponent ``s``)."""
    w = 1.0 / np.arange(1, k + 1) ** s
    return w / w.sum()


def sylvester(K: int) -> np.ndarray:
    """Zhao et al., arXiv 2022, Eq. 6: H_{r+1} = [[H_r, H_r], [H_r, -H_r]]."""
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < K:
        h = np.block([[h, h], [h, -h]])
    return h


def fixed_values(f: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """A shuffled population of ``n`` values with counts ``round(n f)`` (last value takes the rest)."""
    counts = np.floor(f * n).astype(np.int64)
    counts[0] += n - counts.sum()
    v = np.repeat(np.arange(f.size), counts)
    rng.shuffle(v)
    return v


# ---------------------------------------------------------------- Hadamard matrix and FWHT
def test_hadamard_entries_and_fwht_match_sylvester() -> None:
    for K in (2, 4, 16, 64):
        H = sylvester(K)
        r, c = np.meshgrid(np.arange(K), np.arange(K), indexing="ij")
        np.testing.assert_array_equal(hadamard_entry(r, c), H)
        a = np.random.default_rng(K).integers(-50, 50, K)
        np.testing.assert_array_equal(kernels.fwht(a.copy()), a @ H)
    assert [hadamard_order(k) for k in (2, 3, 4, 7, 8, 100, 127, 128)] == [4, 4, 8, 8, 16, 128, 128, 256]


# ---------------------------------------------------------------- kernels vs numpy references
@pytest.mark.parametrize("k", [2, 7, 100, 1000])
def test_hr_kernels_match_reference(k: int) -> None:
    g = np.random.default_rng(k)
    K = hadamard_order(k)
    v = g.integers(0, k, 9000)  # three kernel chunks, the last one partial
    nkey = randomness.noise_key(np.random.default_rng(11))
    a = kernels.hr_randomize(v, nkey, 0.7, K)
    b = reference.hr_randomize(v, nkey, 0.7, K)
    np.testing.assert_array_equal(a, b)
    # the fast FWHT support equals the naive O(n k) count, on reports of any layout
    for r in (a, g.integers(0, 2 * K, 40_000)):
        np.testing.assert_array_equal(kernels.hr_support(r, K, k), reference.hr_support(r, K, k))


@pytest.mark.parametrize("k", [2, 7, 100, 1000])
def test_fhr_kernels_match_reference(k: int) -> None:
    g = np.random.default_rng(k + 1)
    K = hadamard_order(k)
    v = g.integers(0, k, 9000)  # three kernel chunks, the last one partial
    nkey = randomness.noise_key(np.random.default_rng(12))
    a = kernels.fhr_randomize(v, nkey, 0.7, K)
    b = reference.fhr_randomize(v, nkey, 0.7, K)
    np.testing.assert_array_equal(a, b)
    P = g.integers(0, K, 40_000)
    M = (P + g.integers(1, K, 40_000)) % K
    for r in (a, np.stack([P, M], axis=1)):
        np.testing.assert_array_equal(kernels.fhr_support(r, K, k), reference.fhr_support(r, K, k))


def test_protocol_support_equals_reference_on_its_own_reports(rng) -> None:
    for name in NAMES:
        proto = estimators.make(name, k=100, eps=1.0)
        r = proto.randomize(rng.integers(0, 100, 50_000), rng)
        ref = (reference.hr_support if name == "HR" else reference.fhr_support)(r, proto.K, 100)
        np.testing.assert_array_equal(proto.support(r), ref)


# ---------------------------------------------------------------- HR: channel, ps = p, qs = 1/2
def hr_channel(proto: HR) -> np.ndarray:
    """P(report = 2 j + b | v), shape (k, 2K), from the mechanism's definition."""
    K, p = proto.K, proto.p
    j = np.arange(K)
    P = np.zeros((proto.k, 2 * K))
    for v in range(proto.k):
        bit = (hadamard_entry(j, v + 1) + 1) // 2
        P[v, 2 * j + bit] = p / K
        P[v, 2 * j + 1 - bit] = (1 - p) / K
    return P


def test_hr_is_pure_with_qs_one_half() -> None:
    proto = estimators.make("HR", k=6, eps=1.3)
    P = hr_channel(proto)
    K = proto.K
    reports = np.arange(2 * K)
    # supports[r, v]: report r supports v iff its bit matches H[j, v + 1]
    supports = np.stack([proto.support(np.array([r], dtype=proto.report_dtype)) for r in reports])
    S = P @ supports  # S[u, v] = P(a report of u supports v)
    np.testing.assert_allclose(np.diag(S), proto.p, rtol=1e-12)
    np.testing.assert_allclose(S[~np.eye(proto.k, dtype=bool)], 0.5, rtol=1e-12)
    assert proto.ps == proto.p and proto.qs == 0.5
    # ε from the output probabilities: the worst ratio over every pair of inputs and output
    eps = max(np.log(P[u] / P[w]).max() for u, w in itertools.permutations(range(proto.k), 2))
    assert proto.eps_first == pytest.approx(eps, rel=1e-12) and proto.eps_first == pytest.approx(1.3, rel=1e-12)


def test_hr_randomize_follows_its_channel(rng) -> None:
    proto = estimators.make("HR", k=5, eps=1.0)
    n = 200_000
    P = hr_channel(proto)
    for v in (0, 4):
        r = proto.randomize(np.full(n, v), rng)
        emp = np.bincount(r, minlength=2 * proto.K)
        sd = np.sqrt(n * P[v] * (1 - P[v]))
        assert np.all(np.abs(emp - n * P[v]) <= 4.5 * sd)


def test_hr_variances_closed_forms() -> None:
    eps, n = 1.0, 10_000
    proto = estimators.make("HR", k=100, eps=eps)
    e, p = np.exp(eps), proto.p
    assert proto.variance(n) == pytest.approx((e + 1) ** 2 / (n * (e - 1) ** 2), rel=1e-12)
    # Wang et al., Sensors 2020, Eq. 47 is the exact variance of a value held by everyone (f = 1)
    assert proto.variance_exact(1.0, n) == pytest.approx(4 * p * (1 - p) / (n * (2 * p - 1) ** 2), rel=1e-12)
    assert proto.variance_exact(1.0, n) == pytest.approx(4 * e / (n * (e - 1) ** 2), rel=1e-12)


# ---------------------------------------------------------------- FHR: channel, FLDP, Eqs. 7-10
def fhr_channel(proto: FHR) -> np.ndarray:
    """P((P, M) | t), shape (k, K, K), from Zhao et al., arXiv 2022, Alg. 1 (uniform +1 position x,
    -1 position y)."""
    K, p = proto.K, proto.p
    C = np.zeros((proto.k, K, K))
    for t in range(proto.k):
        h = hadamard_entry(t + 1, np.arange(K))
        for x in np.flatnonzero(h == 1):
            for y in np.flatnonzero(h == -1):
                C[t, x, y] += p / (K // 2) ** 2       # kept: +1 at x, -1 at y
                C[t, y, x] += (1 - p) / (K // 2) ** 2  # flipped
    return C


def test_fhr_privacy_figures_from_the_channel() -> None:
    proto = estimators.make("FHR", k=6, eps=0.8)
    C = fhr_channel(proto)
    np.testing.assert_allclose(C.sum(axis=(1, 2)), 1.0, rtol=1e-12)
    hi, lo = proto.output_probabilities()
    assert set(np.unique(C.round(15))) == {0.0, round(lo, 15), round(hi, 15)}
    etas, ratios = [], []
    for t, u in itertools.permutations(range(proto.k), 2):
        Rt, Ru = C[t] > 0, C[u] > 0
        etas.append((Rt & Ru).sum() / max(Rt.sum(), Ru.sum()))  # Eq. 3
        both = Rt & Ru
        ratios.append(np.log(C[t][both] / C[u][both]).max())  # Eq. 4
        assert (Rt & ~Ru).any()  # an output of t that u never produces: not ε-LDP
    assert min(etas) == pytest.approx(proto.eta) and proto.eta == 0.5
    assert max(ratios) == pytest.approx(proto.eps_fldp, rel=1e-12) and proto.eps_fldp == pytest.approx(0.8, rel=1e-12)
    assert proto.eps_ldp == np.inf and proto.eps_first == np.inf and proto.eps_inf == np.inf


def test_fhr_per_report_distributions_eq8_eq9() -> None:
    """b . H(t): 𝒳 = ±2 w.p. (p, 1-p) for the holder; 𝒴 = (2, 0, -2) w.p. (1/4, 1/2, 1/4) otherwise."""
    proto = estimators.make("FHR", k=5, eps=1.1)
    C = fhr_channel(proto)
    K = proto.K
    Pm, Mm = np.meshgrid(np.arange(K), np.arange(K), indexing="ij")
    for t, u in itertools.product(range(proto.k), repeat=2):
        dot = hadamard_entry(u + 1, Pm) - hadamard_entry(u + 1, Mm)  # b . H(u) for b = e_P - e_M
        dist = [C[t][dot == s].sum() for s in (2, 0, -2)]
        want = [proto.p, 0.0, 1 - proto.p] if t == u else [0.25, 0.5, 0.25]
        np.testing.assert_allclose(dist, want, atol=1e-12)


def test_fhr_randomize_follows_its_channel(rng) -> None:
    proto = estimators.make("FHR", k=5, eps=1.0)
    n = 400_000
    C = fhr_channel(proto)
    K = proto.K
    for t in (0, 3):
        r = proto.randomize(np.full(n, t), rng).astype(np.int64)
        emp = np.bincount(r[:, 0] * K + r[:, 1], minlength=K * K)
        want = C[t].ravel()
        sd = np.sqrt(n * want * (1 - want))
        assert np.all(np.abs(emp - n * want) <= 4.5 * sd + 1e-9)


def test_fhr_estimate_is_eq7(rng) -> None:
    eps, k, n = 1.5, 50, 20_000
    proto = estimators.make("FHR", k=k, eps=eps)
    r = proto.randomize(rng.integers(0, k, n), rng).astype(np.int64)
    z = np.zeros(proto.K)
    np.add.at(z, r[:, 0], 1.0)
    np.add.at(z, r[:, 1], -1.0)
    H = hadamard_entry(np.arange(1, k + 1)[:, None], np.arange(proto.K)[None, :])
    e = np.exp(eps)
    eq7 = (e + 1) / (2 * (e - 1)) * (H @ z) / n
    np.testing.assert_allclose(proto.estimate(proto.support(r), n), eq7, rtol=1e-12, atol=1e-15)


def test_fhr_variances_eq10() -> None:
    eps, n, nt = 1.0, 50_000, 12_345
    proto = estimators.make("FHR", k=100, eps=eps)
    e = np.exp(eps)
    a = (e + 1) ** 2 / (2 * (e - 1) ** 2)
    assert proto.variance(n) == pytest.approx(a / n, rel=1e-12)
    # Eq. 10 on counts (n_t holders out of n), divided by n^2 for frequencies
    assert proto.variance_exact(nt / n, n) == pytest.approx((a * n + (a - 1) * nt) / n**2, rel=1e-12)
    # FHR's Var* is half of HR's at the same ε (its reports carry two positions)
    assert proto.variance(n) == pytest.approx(estimators.make("HR", k=100, eps=eps).variance(n) / 2, rel=1e-12)


# ---------------------------------------------------------------- accuracy vs the exact variance
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_empirical_mse_matches_exact_variance(name: str, eps: float) -> None:
    k, n, reps = 100, 100_000, 30
    proto = estimators.make(name, k=k, eps=eps)
    g = np.random.default_rng(7)
    f = zipf_histogram(k)
    v = fixed_values(f, n, g)
    true = np.bincount(v, minlength=k) / n
    se = []
    for rep in range(reps):
        est = proto.estimate(proto.support(proto.randomize(v, np.random.default_rng(1000 + rep))), n)
        se.append((est - true) ** 2)
    mse = np.mean(se)
    var = proto.variance_exact(true, n).mean()
    assert mse == pytest.approx(var, rel=0.15), (mse, var)


@pytest.mark.parametrize("name", NAMES)
def test_single_estimates_within_four_sigma(name: str, rng) -> None:
    k, n = 30, 200_000
    proto = estimators.make(name, k=k, eps=1.0)
    v = fixed_values(zipf_histogram(k), n, rng)
    true = np.bincount(v, minlength=k) / n
    est = proto.estimate(proto.support(proto.randomize(v, rng)), n)
    assert np.all(np.abs(est - true) <= 4 * np.sqrt(proto.variance_exact(true, n)))


# ---------------------------------------------------------------- codec, additivity, validation
@pytest.mark.parametrize("name,k,dtype,shape", [("HR", 100, np.uint8, ()), ("HR", 128, np.uint16, ()),
                                                ("FHR", 100, np.uint8, (2,)), ("FHR", 300, np.uint16, (2,))])
def test_codec_roundtrip_and_additivity(name: str, k: int, dtype, shape, rng) -> None:
    proto = estimators.make(name, k=k, eps=1.0)
    assert proto.report_dtype == np.dtype(dtype) and proto.report_shape == shape
    a = proto.randomize(rng.integers(0, k, 5000), rng)
    b = proto.randomize(rng.integers(0, k, 7000), rng)
    assert a.dtype == np.dtype(dtype) and a.shape == (5000, *shape)
    blob = proto.encode(a)
    np.testing.assert_array_equal(proto.decode(blob), a)
    np.testing.assert_array_equal(proto.support(np.concatenate([a, b])), proto.support(a) + proto.support(b))
    assert proto.support(a[:0]).tolist() == [0] * k


def test_hr_codec_rejects_rows_outside_the_matrix() -> None:
    proto = estimators.make("HR", k=10, eps=1.0)  # K = 16: reports 2 j + b in [0, 32)
    good = np.arange(32, dtype=np.uint8)
    assert proto.decode(proto.encode(good)).tolist() == good.tolist()
    for bad in (32, 255):
        blob = proto.encode(np.array([0, bad], dtype=np.uint8))
        with pytest.raises(InvalidReports, match="row"):
            proto.decode(blob)
        with pytest.raises(InvalidReports):
            proto.support(np.array([0, bad], dtype=np.uint8))
    with pytest.raises(InvalidReports):
        proto.decode(proto.encode(good)[:-1])  # truncated body
    with pytest.raises(InvalidReports):
        proto.support(np.array([-1, 3]))
    with pytest.raises(InvalidReports):
        proto.support(np.zeros((3, 2), dtype=np.uint8))
    with pytest.raises(InvalidReports):
        proto.support(np.array([0.0, 1.0]))


def test_fhr_codec_rejects_bad_positions() -> None:
    proto = estimators.make("FHR", k=10, eps=1.0)  # K = 16
    ok = np.array([[0, 1], [15, 3]], dtype=np.uint8)
    np.testing.assert_array_equal(proto.decode(proto.encode(ok)), ok)
    for bad, match in (([[0, 16]], "lie in"), ([[200, 1]], "lie in"), ([[5, 5]], "same position")):
        arr = np.array(bad, dtype=np.uint8)
        with pytest.raises(InvalidReports, match=match):
            proto.decode(proto.encode(arr))
        with pytest.raises(InvalidReports, match=match):
            proto.support(arr)
    with pytest.raises(InvalidReports):
        proto.support(np.zeros(4, dtype=np.uint8))
    with pytest.raises(InvalidReports):
        proto.support(np.array([[-1, 2]]))
    with pytest.raises(InvalidReports):
        proto.encode(np.zeros((3, 3), dtype=np.uint8))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("params,match", [(dict(k=1, eps=1.0), "k must"), (dict(k=2.5, eps=1.0), "k must"),
                                          (dict(k=10, eps=0.0), "eps"), (dict(k=10, eps=-1.0), "eps"),
                                          (dict(k=10, eps=float("inf")), "eps"), (dict(k=10, eps=float("nan")), "eps"),
                                          (dict(k=MAX_K + 1, eps=1.0), "supports k"),
                                          (dict(k=10), "needs eps"), (dict(k=10, eps=1.0, eta=0.5), "does not take")])
def test_bad_parameters_raise(name: str, params: dict, match: str) -> None:
    with pytest.raises(LDPError, match=match):
        estimators.make(name, **params)


@pytest.mark.parametrize("name", NAMES)
def test_values_state_and_counts_are_checked(name: str, rng) -> None:
    proto = estimators.make(name, k=10, eps=1.0)
    with pytest.raises(LDPError, match="outside the domain"):
        proto.randomize(np.array([0, 10]), rng)
    with pytest.raises(LDPError, match="integers"):
        proto.randomize(np.array([0.5]), rng)
    with pytest.raises(LDPError, match="memoryless"):
        proto.randomize(np.zeros(3, dtype=int), rng, state=object())
    with pytest.raises(LDPError, match="shape"):
        proto.estimate(np.zeros(9), 10)
    assert proto.new_state(5) is None and proto.memo_size == 0
    assert estimators.from_params(proto.params()).fingerprint == proto.fingerprint
    assert np.isinf(proto.worst_case_loss)


def test_postprocessing(rng) -> None:
    k, n = 20, 20_000
    for name in NAMES:
        proto = estimators.make(name, k=k, eps=2.0)
        c = proto.support(proto.randomize(rng.integers(0, k, n), rng))
        for method in ("clip", "norm-sub", "project") + (("ibu",) if name == "HR" else ()):
            f = proto.estimate(c, n, postprocess=method)
            assert f.min() >= 0 and f.sum() == pytest.approx(1.0)
    with pytest.raises(LDPError, match="not pure"):
        estimators.make("FHR", k=k, eps=2.0).estimate(np.zeros(k, dtype=np.int64), n, postprocess="ibu")


# ---------------------------------------------------------------- audit events
def test_hr_audit_event_rates(rng) -> None:
    proto = estimators.make("HR", k=10, eps=1.0)
    n = 200_000
    for v, want in ((2, proto.p / 2), (7, (1 - proto.p) / 2)):
        rate = proto.audit_event(proto.randomize(np.full(n, v), rng), 2, 7).mean()
        assert abs(rate - want) <= 4 * np.sqrt(want * (1 - want) / n)
    res = audit(proto, v1=2, v2=7, trials=100_000, seed=3)
    assert res.passed and 0.7 < res.eps_lower <= proto.eps_first


def test_fhr_audit_exposes_the_infinite_ldp_epsilon(rng) -> None:
    proto = estimators.make("FHR", k=10, eps=1.0)
    n = 200_000
    rate = proto.audit_event(proto.randomize(np.full(n, 2), rng), 2, 7).mean()
    assert abs(rate - 0.5) <= 4 * np.sqrt(0.25 / n)
    assert not proto.audit_event(proto.randomize(np.full(n, 7), rng), 2, 7).any()
    res = audit(proto, v1=2, v2=7, trials=100_000, seed=3)
    assert res.hits2 == 0 and res.eps_lower > 5 * proto.eps_fldp  # far beyond the FLDP ε ...
    assert res.passed and res.eps_theory == np.inf                 # ... and below the true LDP ε
