"""The two-round framework, the GRR/UE families, memo state, codec and post-processing."""
from __future__ import annotations

import numpy as np
import pytest

import estimators
from estimators import kernels, reference
from estimators.randomness import keys_from, threshold32
from estimators.errors import InfeasibleParameters, InvalidReports, InvalidState, LDPError
from estimators.longitudinal import NO_NOISE_KEY, Rounds, ue_chain_eps_first
from estimators.memo import MemoState
from estimators import postprocess as pp

LONGITUDINAL = [("L-GRR", dict(k=20, eps_inf=2.0, eps_1=1.0)), ("L-SUE", dict(k=20, eps_inf=2.0, eps_1=1.0)),
                ("L-OUE", dict(k=20, eps_inf=2.0, eps_1=1.0)), ("L-OSUE", dict(k=20, eps_inf=2.0, eps_1=1.0)),
                ("L-SOUE", dict(k=20, eps_inf=2.0, eps_1=1.0)), ("L-ADP", dict(k=20, eps_inf=2.0, eps_1=1.0))]


# ---------------------------------------------------------------- kernels vs numpy references
@pytest.mark.parametrize("memo", [False, True])
@pytest.mark.parametrize("p2", [1.0, 0.7])
def test_grr_kernel_matches_reference(memo: bool, p2: float) -> None:
    g = np.random.default_rng(1)
    v = g.integers(0, 13, 3000)
    keys, nkey = keys_from(g, 3000), keys_from(g, 1)[0]
    s1, s2 = np.zeros((3000, 2), np.uint8), np.zeros((3000, 2), np.uint8)
    a = kernels.grr_chain_randomize(v, keys, memo, s1, nkey, 0.4, p2, 13)
    b = reference.grr_chain_randomize(v, keys, memo, s2, nkey, 0.4, p2, 13)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(kernels.bincount(a, 13), reference.bincount(a, 13))


@pytest.mark.parametrize("memo", [False, True])
@pytest.mark.parametrize("k", [8, 21])
def test_ue_kernel_matches_reference(memo: bool, k: int) -> None:
    g = np.random.default_rng(2)
    v = g.integers(0, k, 2000)
    keys = keys_from(g, 2000)
    s1, s2 = np.zeros((2000, (k + 7) // 8), np.uint8), np.zeros((2000, (k + 7) // 8), np.uint8)
    # p near a byte boundary makes top-byte ties (and so refinements past the prefix) frequent
    th = [threshold32(p) for p in ((0.5, 0.2, 0.8, 0.2) if memo else (0.5, 0.2, 1.0, 0.0))]
    if k == 21:
        th[1] = np.uint64((51 << 24) + 7)  # q1's top byte 51: every lane ties w.p. 1/256, rest decides
    args = (keys_from(g, 1)[0], *th, k)
    a = kernels.ue_chain_randomize(v, keys, memo, s1, *args)
    b = reference.ue_chain_randomize(v, keys, memo, s2, *args)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(s1, s2)
    np.testing.assert_array_equal(kernels.packed_bit_counts(a, k), reference.packed_bit_counts(a, k))


@pytest.mark.parametrize("n", [0, 1, 7, 4096, 4097, 100_003])
@pytest.mark.parametrize("k", [2, 9, 200])
def test_packed_bit_counts_match_the_reference_on_every_block_shape(n: int, k: int) -> None:
    """The byte-histogram kernel against the plain numpy twin: empty, tiny, block-boundary and uneven sizes."""
    bits = np.packbits(np.random.default_rng(n + k).random((n, k)) < 0.3, axis=1, bitorder="little")
    np.testing.assert_array_equal(kernels.packed_bit_counts(bits, k), reference.packed_bit_counts(bits, k))


# ---------------------------------------------------------------- solvers and privacy figures
def test_losue_p2_matches_seed_eq15() -> None:
    ei, e1 = 2.0, 0.8
    proto = estimators.make("L-OSUE", k=10, eps_inf=ei, eps_1=e1)
    a, b = np.exp(ei), np.exp(e1)
    eq15 = (1 - a * b) / (b - a - a * b + 1)
    # UE probabilities live on the 2^-32 grid of the sampler (estimators.randomness.quantize32)
    assert proto.p2 == pytest.approx(eq15, abs=2**-32)
    assert proto.q2 == pytest.approx(1 - eq15, abs=2**-32)
    assert proto.eps_first == pytest.approx(e1, abs=1e-8) and proto.eps_inf == pytest.approx(ei, abs=1e-8)


def test_lgrr_paper_p2_matches_seed_eq13() -> None:
    ei, e1, k = 2.0, 1.2, 32
    proto = estimators.make("L-GRR", k=k, eps_inf=ei, eps_1=e1, calibration="paper")
    eq13 = (np.exp(e1 + ei) - 1) / (-k * np.exp(e1) + (k - 1) * np.exp(ei) + np.exp(e1) + np.exp(e1 + ei) - 1)
    assert proto.p2 == pytest.approx(eq13, rel=1e-12)


@pytest.mark.parametrize("name,params", LONGITUDINAL)
def test_eps_figures_are_computed(name: str, params: dict) -> None:
    proto = estimators.make(name, **params)
    # computed from the (2^-32-quantized) probabilities in use, so equal to the request to ~1e-9
    assert proto.eps_first == pytest.approx(params["eps_1"], abs=1e-8)
    assert proto.eps_inf == pytest.approx(params["eps_inf"], abs=1e-8)
    assert proto.worst_case_loss == pytest.approx(params["k"] * params["eps_inf"], abs=1e-6)


def test_eps_first_reflects_parameters_in_use() -> None:
    r = Rounds(0.5, 0.1, 0.9, 0.1)
    assert ue_chain_eps_first(r) == pytest.approx(np.log(r.ps * (1 - r.qs) / ((1 - r.ps) * r.qs)))


@pytest.mark.parametrize("name,params,match", [
    ("L-OSUE", dict(k=10, eps_inf=1.0, eps_1=1.0), "smaller than"),
    ("L-GRR", dict(k=10, eps_inf=1.0, eps_1=1.5), "smaller than"),
    ("L-OUE", dict(k=10, eps_inf=2.0, eps_1=1.8), "cannot reach"),
    ("L-SOUE", dict(k=10, eps_inf=0.5, eps_1=0.4), "cannot reach"),
    ("GRR", dict(k=1, eps=1.0), "k must be"),
    ("GRR", dict(k=10, eps=-1.0), "positive"),
    ("OUE", dict(k=10, eps=float("nan")), "finite"),
    ("L-GRR", dict(k=10, eps_inf=2.0, eps_1=1.0, calibration="magic"), "calibration"),
    ("NOPE", dict(k=10), "unknown protocol"),
    ("GRR", dict(k=10), "needs eps"),
    ("GRR", dict(k=10, eps=1.0, g=3), "does not take g"),
])
def test_bad_parameters_raise(name: str, params: dict, match: str) -> None:
    with pytest.raises(LDPError, match=match):
        estimators.make(name, **params)


def test_infeasible_is_a_distinct_error() -> None:
    with pytest.raises(InfeasibleParameters):
        estimators.make("L-OUE", k=10, eps_inf=2.0, eps_1=1.8)


# ---------------------------------------------------------------- memoization
@pytest.mark.parametrize("name,params", LONGITUDINAL)
def test_memo_is_permanent_and_survives_restart(name: str, params: dict, tmp_path, rng) -> None:
    proto = estimators.make(name, **params)
    n = 4000
    state = proto.new_state(n, rng=np.random.default_rng(5))
    values = rng.integers(0, proto.k, n)
    # with the IRR disabled we would see the PRR directly; instead check the PRR through the
    # kernel with p2 = 1: same device + same value -> same memoized output, across batches
    prr = _prr(proto, values, state)
    assert np.array_equal(prr, _prr(proto, values, state))
    path = tmp_path / "devices.memo"
    state.save(path)
    restored = MemoState.load(path, fingerprint=proto.fingerprint)
    assert np.array_equal(prr, _prr(proto, values, restored))
    assert np.array_equal(restored.seen, state.seen)
    # a different device key memoizes differently (the memo is secret per device)
    other = proto.new_state(n, rng=np.random.default_rng(6))
    assert not np.array_equal(prr, _prr(proto, values, other))
    # reports themselves are re-randomized by the IRR each time
    r1 = proto.randomize(values, rng, state=state)
    r2 = proto.randomize(values, rng, state=state)
    assert not np.array_equal(r1, r2)


def _prr(proto, values, state):
    """The memoized PRR outputs of a batch (the kernel with the IRR switched off)."""
    chosen = getattr(proto, "chosen", proto)
    seen = state.seen.copy()
    if chosen.name == "L-GRR":
        return kernels.grr_chain_randomize(values, state.keys, True, seen, NO_NOISE_KEY, chosen.p1, 1.0, chosen.k)
    th = [threshold32(p) for p in (chosen.p1, chosen.q1, 1.0, 0.0)]
    return kernels.ue_chain_randomize(values, state.keys, True, seen, NO_NOISE_KEY, *th, chosen.k)


def test_memo_accounting_counts_distinct_values(rng) -> None:
    proto = estimators.make("L-OSUE", k=16, eps_inf=2.0, eps_1=1.0)
    state = proto.new_state(3, rng=rng)
    for vals in ([0, 1, 2], [0, 5, 2], [0, 6, 2]):
        proto.randomize(np.array(vals), rng, state=state)
    np.testing.assert_array_equal(state.memoized_count(), [1, 3, 1])
    np.testing.assert_allclose(proto.longitudinal_loss(state.memoized_count()), [2.0, 6.0, 2.0])


def test_state_checks(tmp_path, rng) -> None:
    a = estimators.make("L-OSUE", k=16, eps_inf=2.0, eps_1=1.0)
    b = estimators.make("L-OSUE", k=16, eps_inf=2.0, eps_1=0.5)
    state = a.new_state(10, rng=rng)
    with pytest.raises(InvalidState, match="another protocol"):
        b.randomize(np.zeros(10, dtype=int), rng, state=state)
    with pytest.raises(InvalidState, match="holds 10 devices"):
        a.randomize(np.zeros(9, dtype=int), rng, state=state)
    with pytest.raises(LDPError, match="memoizes"):
        a.randomize(np.zeros(10, dtype=int), rng)
    with pytest.raises(LDPError, match="memoryless"):
        estimators.make("OUE", k=16, eps=1.0).randomize(np.zeros(10, dtype=int), rng, state=state)
    state.save(tmp_path / "s")
    with pytest.raises(InvalidState):
        MemoState.load(tmp_path / "s", fingerprint=b.fingerprint)
    (tmp_path / "junk").write_bytes(b"not a state")
    with pytest.raises(InvalidState):
        MemoState.load(tmp_path / "junk")


def test_state_save_is_atomic(tmp_path, rng, monkeypatch) -> None:
    proto = estimators.make("L-GRR", k=4, eps_inf=2.0, eps_1=1.0)
    state = proto.new_state(100, rng=rng)
    path = tmp_path / "s"
    state.save(path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        proto.new_state(100, rng=np.random.default_rng(1)).save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["s"]


def test_default_state_keys_come_from_the_os() -> None:
    proto = estimators.make("L-GRR", k=4, eps_inf=2.0, eps_1=1.0)
    a, b = proto.new_state(4), proto.new_state(4)
    assert not np.array_equal(a.keys, b.keys)


# ---------------------------------------------------------------- values, codec, support
@pytest.mark.parametrize("name,params", [("GRR", dict(k=300, eps=1.0)), ("OUE", dict(k=21, eps=1.0)),
                                         ("L-OSUE", dict(k=21, eps_inf=2.0, eps_1=1.0))])
def test_codec_roundtrip_and_additivity(name: str, params: dict, rng) -> None:
    proto = estimators.make(name, **params)
    v = rng.integers(0, proto.k, 1000)
    state = proto.new_state(1000, rng=rng)
    r = proto.randomize(v, rng, state=state)
    blob = proto.encode(r)
    back = proto.decode(blob)
    np.testing.assert_array_equal(back, r)
    np.testing.assert_array_equal(proto.support(r), proto.support(r[:400]) + proto.support(r[400:]))
    for bad in (blob[:-1], blob[:5], b"XXXX" + blob[4:], blob + b"\0"):
        with pytest.raises(InvalidReports):
            proto.decode(bad)


def test_codec_rejects_out_of_domain(rng) -> None:
    grr = estimators.make("GRR", k=5, eps=1.0)
    with pytest.raises(InvalidReports, match="outside"):
        grr.decode(grr.encode(np.array([1, 7], dtype=np.uint8)))
    oue = estimators.make("OUE", k=5, eps=1.0)
    with pytest.raises(InvalidReports, match="beyond the domain"):
        oue.decode(oue.encode(np.array([[0b100000]], dtype=np.uint8)))


@pytest.mark.parametrize("values,match", [([0, 10], "outside the domain"), ([-1], "outside"),
                                          ([0.5], "integers"), ([[1]], "1-d")])
def test_out_of_domain_values_raise(values, match, rng) -> None:
    with pytest.raises(LDPError, match=match):
        estimators.make("GRR", k=10, eps=1.0).randomize(np.array(values), rng)


def test_estimate_checks_counts() -> None:
    proto = estimators.make("GRR", k=4, eps=1.0)
    with pytest.raises(LDPError, match="shape"):
        proto.estimate(np.zeros(5), 10)
    with pytest.raises(LDPError, match="positive"):
        proto.estimate(np.zeros(4), 0)
    with pytest.raises(LDPError, match="unknown post-processing"):
        proto.estimate(np.ones(4), 4, postprocess="magic")


# ---------------------------------------------------------------- post-processing
def test_postprocessing_gives_distributions(rng) -> None:
    proto = estimators.make("OUE", k=50, eps=0.5)
    f = np.zeros(50)
    f[:5] = 0.2
    values = rng.choice(50, size=20_000, p=f)
    counts = proto.support(proto.randomize(values, rng))
    raw = proto.estimate(counts, 20_000)
    assert (raw < 0).any()
    for method in pp.METHODS:
        est = proto.estimate(counts, 20_000, postprocess=method)
        assert est.min() >= 0 and est.sum() == pytest.approx(1.0)
        if method in ("norm-sub", "project"):
            # projecting onto a convex set that holds the truth never moves away from it
            assert np.linalg.norm(est - f) <= np.linalg.norm(raw - f)


def test_norm_sub_equals_simplex_projection(rng) -> None:
    for _ in range(50):
        x = rng.normal(0.02, 0.1, 40)
        np.testing.assert_allclose(pp.norm_sub(x), pp.project(x), atol=1e-12)


def test_ibu_recovers_a_noiseless_channel() -> None:
    ps, qs, n = 0.6, 0.1, 10_000
    f = np.array([0.5, 0.3, 0.2, 0.0])
    counts = n * (qs + (ps - qs) * f)
    np.testing.assert_allclose(pp.ibu(counts, n, ps, qs, iters=20_000, tol=1e-15), f, atol=1e-4)


# ---------------------------------------------------------------- the 8-bits-per-word sampler
def test_swar_lane_comparisons_match_bytewise() -> None:
    import numba as nb
    from estimators.randomness import lanes_eq, lanes_lt

    @nb.njit
    def both(x, y):
        out = np.empty((x.shape[0], 2), dtype=np.uint64)
        for i in range(x.shape[0]):
            out[i, 0] = lanes_lt(x[i], y[i])
            out[i, 1] = lanes_eq(x[i], y[i])
        return out

    g = np.random.default_rng(9)
    x = g.integers(0, 256, (20_000, 8), dtype=np.uint8)
    y = np.where(g.random((20_000, 8)) < 0.3, x, g.integers(0, 256, (20_000, 8), dtype=np.uint8))
    got = both(x.view(np.uint64).ravel(), y.view(np.uint64).ravel())
    weights = (1 << np.arange(8)).astype(np.uint64)
    np.testing.assert_array_equal(got[:, 0], ((x < y) * weights).sum(axis=1))
    np.testing.assert_array_equal(got[:, 1], ((x == y) * weights).sum(axis=1))


@pytest.mark.parametrize("p", [0.25 + 0.5 / 256, 0.5, 2**-20, 1.0])
def test_bit_probability_is_exactly_the_threshold(p: float) -> None:
    """Ties of the top byte (probability 1/256 per lane) are refined from 24 more bits: at
    p = 1/4 + 1/512 half of the tied lanes must come out as 1, which a top-byte-only sampler
    would miss by 14 standard deviations."""
    n, k = 100_000, 100
    t = threshold32(p)
    bits = kernels.ue_chain_randomize(np.zeros(n, dtype=np.int64), np.zeros((0, 8), np.uint32), False,
                                      np.zeros((0, 0), np.uint8), keys_from(np.random.default_rng(3), 1)[0], t, t,
                                      threshold32(1.0), np.uint64(0), k)
    rate = np.unpackbits(bits, axis=1, bitorder="little")[:, :k].mean()
    sd = np.sqrt(p * (1 - p) / (n * k))
    assert abs(rate - p) <= 4 * sd + 1e-12


@pytest.mark.parametrize(("eps_inf", "eps_1"), [(2.0, 1.0), (4.0, 0.5), (1.0, 0.05), (8.0, 7.9), (0.5, 1e-4)])
def test_round_solver_matches_scipy_brentq(eps_inf, eps_1):
    """The IRR rounds of the UE chains are solved by bisection (no scipy import at a worker's start): the root
    agrees with scipy's brentq to its own tolerance, and ε1 of the solved chain is the one asked for."""
    from scipy.optimize import brentq

    from estimators.longitudinal import _solve
    from estimators.unary import sue_probabilities

    p1, q1 = sue_probabilities(eps_inf)
    eps_of = lambda p: ue_chain_eps_first(Rounds(p1, q1, p, 1 - p))  # noqa: E731 - the L-SUE IRR round
    ours = _solve("L-SUE", eps_of, 0.5, 1.0 - 1e-15, eps_1, eps_inf)
    ref = brentq(lambda p: eps_of(p) - eps_1, 0.5, 1.0 - 1e-15, xtol=1e-15, rtol=4 * np.finfo(float).eps)
    assert ours == pytest.approx(ref, abs=2e-15)
    assert eps_of(ours) == pytest.approx(eps_1, rel=1e-12)


def test_every_protocol_randomizes_with_the_csprng_by_default() -> None:
    """The protocol contract (``FrequencyProtocol.randomize``): ``rng`` defaults to None, the CSPRNG path, for every
    registered protocol (SHE required it: ``ldp bench protocols`` failed on it)."""
    import inspect

    from estimators.registry import _protocol_class

    for name in estimators.PROTOCOLS:
        rng = inspect.signature(_protocol_class(name).randomize).parameters["rng"]
        assert rng.default is None, f"{name}.randomize: rng has no default None"
    she = estimators.make("SHE", k=4, eps=1.0)
    assert she.randomize(np.arange(8) % 4).shape == (8, 4)
