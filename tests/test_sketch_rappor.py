"""RAPPOR with Bloom filters (estimators/sketch/rappor.py; Erlingsson, Pihur & Korolova, CCS 2014, §2-§4): kernels
against their numpy twins, exact ε of the implemented law, memoization, the §4 decoding and its variance."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from estimators.errors import InvalidReports, LDPError
from estimators.randomness import noise_key, rejection_limit
from estimators.sketch import rappor_kernels as rk
from estimators.sketch.hashing import sketch_hash
from estimators.sketch.rappor import RAPPOR


def _proto(**kw):
    base = dict(m=20, h=3, cohorts=5, f=0.5, p=0.25, q=0.75, seed=11)
    base.update(kw)
    return RAPPOR(**base)


# ------------------------------------------------------------------ kernels == twins
@pytest.mark.parametrize("irr", [True, False])
def test_kernels_match_numpy_twins(irr):
    P = _proto()
    rng = np.random.default_rng(3)
    n = 300
    st = P.new_state(n, rng)
    keys = np.ascontiguousarray(st.keys)
    limit = rejection_limit(P.cohorts)
    cohort = rk.rappor_cohorts(keys, P.cohorts, limit)
    assert np.array_equal(cohort, rk.np_rappor_cohorts(keys, P.cohorts, limit))
    assert set(np.unique(cohort)) == set(range(P.cohorts))
    ids = rng.integers(0, 1 << 63, size=n, dtype=np.uint64) * np.uint64(2)
    pos = P.bloom_bits(ids, cohort)
    slots = sketch_hash(ids, P.memo_seed, P.memo_slots)[:, 0]
    nkey = noise_key(rng)
    seen_a, seen_b = st.seen.copy(), st.seen.copy()
    args = (P.t1p, P.t1q, P.t2p, P.t2q, P.m, irr)
    a = rk.rappor_randomize(ids, pos, keys, seen_a, slots, nkey, *args)
    b = rk.np_rappor_randomize(ids, pos, keys, seen_b, slots, nkey, *args)
    assert a.shape == (n, 3) and np.array_equal(a, b) and np.array_equal(seen_a, seen_b)
    assert not (a[:, -1] >> np.uint8(4)).any()  # m = 20: the pad bits stay 0
    assert np.array_equal(rk.rappor_support(cohort, a, P.cohorts, P.m), rk.np_rappor_support(cohort, a, P.cohorts, P.m))


def test_bloom_bits_are_the_cohorts_rows_of_the_public_family():
    P = _proto()
    ids = np.array([1, 2, 3, 1 << 60], dtype=np.uint64)
    cohort = np.array([0, 4, 2, 4])
    pos = P.bloom_bits(ids, cohort)
    for i, c in enumerate(cohort):
        assert np.array_equal(pos[i], sketch_hash(ids[i:i + 1], P.seeds[c * 3:c * 3 + 3], 20)[0])
    X = P.design(ids).reshape(5, 20, 4)
    for k, c in enumerate(cohort):
        assert set(np.flatnonzero(X[c, :, k])) == set(pos[k])


# ------------------------------------------------------------------ ε of the implemented law
def _bit_law(P):
    """P(S_i = 1 | B_i) of the implemented law, from the thresholds."""
    t1p, t1q, t2p, t2q = (int(t) / 2.0 ** 32 for t in (P.t1p, P.t1q, P.t2p, P.t2q))
    return {1: t1p * t2p + (1 - t1p) * t2q, 0: t1q * t2p + (1 - t1q) * t2q}, {1: t1p, 0: t1q}


@pytest.mark.parametrize("f,p,q", [(0.5, 0.25, 0.75), (0.1, 0.3, 0.9), (0.75, 0.0, 1.0)])
def test_eps_exact_for_the_implemented_law(f, p, q):
    P = RAPPOR(m=4, h=2, cohorts=1, f=f, p=p, q=q)
    fq = 2 * int(P.t1q) / 2.0 ** 32
    assert P.eps_inf == pytest.approx(2 * 2 * np.log((1 - fq / 2) / (fq / 2)), rel=1e-12)
    law, prr = _bit_law(P)
    assert P.p_star == pytest.approx(law[0], rel=1e-12) and P.q_star == pytest.approx(law[1], rel=1e-12)
    # brute force: the worst log-likelihood ratio of any output between two filters (all pairs of 1..h-bit filters)
    filters = [b for b in itertools.product((0, 1), repeat=4) if 1 <= sum(b) <= 2]

    def worst(bitp):
        eps = 0.0
        for u, v in itertools.permutations(filters, 2):
            for s in itertools.product((0, 1), repeat=4):
                lu = np.prod([bitp[b] if o else 1 - bitp[b] for b, o in zip(u, s)])
                lv = np.prod([bitp[b] if o else 1 - bitp[b] for b, o in zip(v, s)])
                if lu > 0 and lv > 0:
                    eps = max(eps, np.log(lu / lv))
        return eps

    assert worst(prr) == pytest.approx(P.eps_inf, rel=1e-9)
    assert worst(law) == pytest.approx(P.eps_first, rel=1e-9)
    assert P.eps_first == pytest.approx(2 * np.log(law[1] * (1 - law[0]) / (law[0] * (1 - law[1]))), rel=1e-12)
    assert P.eps_first <= P.eps_inf  # equal when the IRR keeps every bit (p = 0, q = 1)


def test_bad_parameters_refused():
    for kw in (dict(m=5, h=3), dict(f=0.0), dict(f=1.0), dict(p=0.6, q=0.5), dict(cohorts=0), dict(memo_slots=100),
               dict(memo_slots=0)):
        with pytest.raises(LDPError):
            _proto(**kw)


# ------------------------------------------------------------------ memoization
def test_memo_tags_count_distinct_values_exactly_where_the_old_slots_collided_and_overflow_to_inf():
    """The tag table (TreeHist's, domain "RPTG"): two values that shared a memo slot under the former one-bit-per-slot
    accounting are charged twice, a repeat nothing, a full table meeting a new value overflows (inf), kernel == twin."""
    from estimators.sketch import treehist_kernels as tk

    P = _proto(memo_slots=128)                           # 2 tags; the former accounting had 128 slots
    assert P.memo_tags == 2
    ids = np.arange(1, 400, dtype=np.uint64) * np.uint64(7919)
    slots = sketch_hash(ids, P.memo_seed, P.memo_slots)[:, 0]
    i, j = next((i, j) for i in range(len(ids)) for j in range(i) if slots[i] == slots[j])
    st = P.new_state(1, np.random.default_rng(2))
    for v in (ids[i], ids[i], ids[j], ids[j], ids[i]):
        P.randomize(np.array([v], dtype=np.uint64), np.random.default_rng(3), st)
    assert P.memoized_counts(st).tolist() == [2.0]
    np.testing.assert_allclose(P.longitudinal_loss(P.memoized_counts(st)), 2 * P.eps_inf)
    P.randomize(np.array([ids[i] + np.uint64(1)], dtype=np.uint64), np.random.default_rng(3), st)
    assert P.memoized_counts(st).tolist() == [np.inf] and np.isinf(P.longitudinal_loss(P.memoized_counts(st))[0])
    # the kernel and its twin, over many devices and a few values (repeats, probing, overflows)
    n = 200
    st = P.new_state(n, np.random.default_rng(4))
    seen_b = st.seen.copy()
    rng = np.random.default_rng(5)
    for _ in range(4):
        v = rng.integers(0, 3, n).astype(np.uint64)
        got = tk.mark_tags(np.ascontiguousarray(st.keys), rk.TAG, v, st.seen)
        assert np.array_equal(got, tk.np_mark_tags(st.keys, rk.TAG, v, seen_b)) and np.array_equal(st.seen, seen_b)
    c = P.memoized_counts(st)
    assert np.isinf(c).any() and (c[~np.isinf(c)] <= 2).all()



def test_memoized_prr_fixed_irr_fresh_loss_does_not_grow():
    P = _proto(m=64, h=2, cohorts=4)
    rng = np.random.default_rng(5)
    n = 200
    st = P.new_state(n, rng)
    ids = np.full(n, 123456789, dtype=np.uint64)
    prr1 = P.memoized_outputs(ids, st)
    assert P.memoized_counts(st).sum() == 0  # memoized_outputs marks nothing
    r1 = P.randomize(ids, rng, st)
    loss1 = P.longitudinal_loss(P.memoized_counts(st))
    r2 = P.randomize(ids, rng, st)
    prr2 = P.memoized_outputs(ids, st)
    assert np.array_equal(prr1, prr2)                       # same device, same value: same PRR
    assert np.array_equal(r1[:, :2], r2[:, :2])             # same cohort
    assert not np.array_equal(r1[:, 2:], r2[:, 2:])         # fresh IRR
    assert np.array_equal(P.memoized_counts(st), np.ones(n))
    assert np.array_equal(P.longitudinal_loss(P.memoized_counts(st)), loss1)
    assert np.allclose(loss1, P.eps_inf)
    # another value: a second PRR, one more ε∞
    other = np.full(n, 987654321, dtype=np.uint64)
    assert not np.array_equal(P.memoized_outputs(other, st), prr1)
    P.randomize(other, rng, st)
    assert np.allclose(P.longitudinal_loss(P.memoized_counts(st)), 2 * P.eps_inf)
    # the PRR's bit law: P(B' = 1) = 1 - f/2 on the filter, f/2 off it
    cohort = P.device_cohorts(st)
    B = np.zeros((n, 64), dtype=bool)
    B[np.repeat(np.arange(n), 2), P.bloom_bits(ids, cohort).reshape(-1)] = True
    bits = np.unpackbits(prr1[:, 2:], axis=1, bitorder="little").astype(bool)
    assert abs(bits[B].mean() - (1 - P.f / 2)) < 4 * np.sqrt(0.25 * 0.75 / B.sum())
    assert abs(bits[~B].mean() - P.f / 2) < 4 * np.sqrt(0.25 * 0.75 / (~B).sum())


def test_support_rejects_bad_reports():
    P = _proto()
    with pytest.raises(InvalidReports):
        P.support(np.zeros((3, 4), dtype=np.uint8))
    bad = np.zeros((2, 5), dtype=np.uint8)
    bad[0, 0] = 9  # cohort 9 of 5
    with pytest.raises(InvalidReports):
        P.support(bad)
    bad[0, 0], bad[1, 4] = 0, 0x80  # a pad bit (m = 20)
    with pytest.raises(InvalidReports):
        P.support(bad)


# ------------------------------------------------------------------ decoding (§4)
def _population(cands, counts):
    return np.repeat(cands, counts.astype(np.int64))


def test_decoding_finds_planted_candidates_and_rejects_nulls():
    P = RAPPOR(m=32, h=2, cohorts=8, f=0.5, p=0.25, q=0.75, seed=7)
    rng = np.random.default_rng(2024)
    cands = np.arange(1, 31, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15 >> 8)
    truth = np.zeros(30)
    truth[:5] = [8000, 5000, 4000, 3000, 2500]
    vals = _population(cands, truth)
    st = P.new_state(vals.shape[0], rng)
    est = P.estimate(P.support(P.randomize(vals, rng, st)), cands)
    assert est.level == pytest.approx(0.05 / 30) and est.dof == 8 * 32 - 30
    assert est.selected[:5].all() and not est.selected[5:].any()
    assert (np.abs(est.counts - truth) < 4 * est.std_errors).all()
    # the least-squares standard errors agree with the exact variance of the estimator (within 15%)
    sd = np.sqrt(P.variance(cands, truth))
    assert np.allclose(est.std_errors, sd, rtol=0.15)


def test_empirical_mse_matches_the_analytical_variance():
    P = RAPPOR(m=16, h=2, cohorts=4, f=0.5, p=0.25, q=0.75, seed=3)
    cands = np.array([11, 22, 33, 44, 55, 66], dtype=np.uint64)
    truth = np.array([1500, 1000, 700, 400, 0, 400.0])
    vals = _population(cands, truth)
    var = P.variance(cands, truth)
    rng = np.random.default_rng(99)
    reps = 600
    z2 = np.empty((reps, cands.shape[0]))
    for r in range(reps):
        st = P.new_state(vals.shape[0], rng)  # new keys: new cohorts and PRRs each repetition
        est = P.estimate(P.support(P.randomize(vals, rng, st)), cands)
        z2[r] = (est.counts - truth) ** 2 / var
    per_candidate = z2.mean(axis=0)
    assert abs(z2.mean() - 1) < 0.15, per_candidate
    assert (np.abs(per_candidate - 1) < 0.3).all(), per_candidate
