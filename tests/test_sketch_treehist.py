"""TreeHist heavy hitters (estimators/sketch/treehist.py, treehist_kernels.py) and the prefix-tree walk it shares with
PEM (prefix.py): kernels against their numpy twins on fixed keys, the exact ε of the implemented GRR, the MSE of the
estimator against the derived variance (finite-row collision and level-split terms included), the walk finding a
planted top-10, memoized reports and their accounting, the wire format's validation, parameters."""
from __future__ import annotations

import math
import warnings
from decimal import Decimal, localcontext

import numpy as np
import pytest

from estimators.errors import InfeasibleParameters, InvalidReports, LDPError
from estimators.longitudinal import grr_chain_eps_first
from estimators.memo import MemoState
from estimators.randomness import noise_key, rejection_limit
from estimators.sketch import treehist_kernels as K
from estimators.sketch.prefix import level_schedule, prefix_walk
from estimators.sketch.treehist import TreeHist, grr_threshold53

pytestmark = pytest.mark.filterwarnings("ignore:simulation mode")

TWO53 = 1 << 53


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)


def _kernel_args(th, ids, state=None, irr=True, forced=False):
    lim = (np.uint64(1 << 63),) * 3 if forced else th._limits  # half the words rejected: extension draws
    if state is None:
        keys, lv, av = np.zeros((0, 8), np.uint32), np.zeros(0, np.int64), np.zeros(0, np.uint64)
    else:
        keys, lv = state.keys, th.device_levels(state)
        av = th.memo_inputs(ids, lv)
    t2 = np.uint64(th.t2 if irr else TWO53)
    return (ids, th.plen, th.seeds, th.R, th.g, noise_key(np.random.default_rng(7)), keys, lv, av,
            np.uint64(th.t1), t2, *lim)


# ------------------------------------------------------------------ kernels against twins
@pytest.mark.parametrize("memo", [False, True])
@pytest.mark.parametrize("forced", [False, True])
def test_randomize_kernel_equals_twin(memo, forced):
    th = TreeHist(1.0, bits=20, step=3, start_bits=2, rows=5, seed=9, eps_1=0.5)
    n = 300 if forced else 2000
    ids = _ids(n, 1)
    st = th.new_state(n, np.random.default_rng(2)) if memo else None
    for irr in (False, True):
        args = _kernel_args(th, ids, st, irr, forced)
        a, b = K.treehist_randomize(*args), K.np_treehist_randomize(*args)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
        th.validate_reports(th.pack(*a))


def test_level_and_candidate_kernels_equal_twins():
    keys = np.random.default_rng(3).integers(0, 2**32, (500, 8), dtype=np.uint32)
    for L in (1, 7, 26):
        np.testing.assert_array_equal(K.keyed_choice(keys, K.LEVEL, L, rejection_limit(L)),
                                      K.np_keyed_choice(keys, K.LEVEL, L, rejection_limit(L)))
    lim = np.uint64(1 << 62)  # 3 of 4 words rejected: the later words of the block decide
    np.testing.assert_array_equal(K.keyed_choice(keys, K.LEVEL, 5, lim), K.np_keyed_choice(keys, K.LEVEL, 5, lim))
    rng = np.random.default_rng(4)
    seeds = rng.integers(0, 2**64 - 1, 9, dtype=np.uint64, endpoint=True)
    cells = rng.integers(0, 100, (9, 56))
    cands = np.concatenate([rng.integers(0, 2**64 - 1, 300, dtype=np.uint64, endpoint=True),
                            np.array([0, 2**64 - 1], dtype=np.uint64)])
    np.testing.assert_array_equal(K.candidate_counts(cands, seeds, cells, 56), K.np_candidate_counts(cands, seeds,
                                                                                                       cells, 56))


# ------------------------------------------------------------------ exact ε
@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0, 9.0])
def test_eps_of_the_law_is_exact(eps):
    th = TreeHist(eps, bits=16, rows=3)
    g, T = th.g, th.t1
    assert g == max(2, int(math.floor(math.exp(eps) + 1.5)))
    assert T == grr_threshold53(eps, g)
    with localcontext() as ctx:  # T is the largest integer whose ratio T (g-1) / (2^53 - T) stays <= e^eps
        ctx.prec = 60
        e = Decimal(eps).exp()
        assert Decimal(T) * (g - 1) <= e * (TWO53 - T) and Decimal(T + 1) * (g - 1) > e * (TWO53 - T - 1)
    p1, q1 = T / TWO53, (1 - T / TWO53) / (g - 1)
    assert th.eps_inf == pytest.approx(math.log(p1 / q1), rel=1e-12) and th.eps_inf <= eps
    assert eps - th.eps_inf < 1e-13 * max(1.0, g)
    assert th.eps_first == th.eps_inf
    assert th.ps + (g - 1) * th.qn == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("eps, eps_1", [(4.0, 2.0), (2.0, 1.5), (1.0, 0.2)])
def test_eps_with_irr_is_the_chain(eps, eps_1):
    th = TreeHist(eps, bits=16, rows=3, eps_1=eps_1)
    r = th.rounds
    assert r.p2 == th.t2 / TWO53 and r.q2 == pytest.approx((1 - r.p2) / (th.g - 1), rel=1e-15)
    assert th.eps_first == grr_chain_eps_first(r) and th.eps_first <= eps_1 + 1e-12
    assert eps_1 - th.eps_first < 1e-9  # the 53-bit quantization of p2 costs nothing visible
    assert th.eps_first == pytest.approx(math.log(th.ps / th.qn), rel=1e-12)
    with pytest.raises(InfeasibleParameters):
        TreeHist(eps, eps_1=eps)


def test_the_sampled_law():
    """One level, one row: the report keeps the hashed bucket w.p. p1, else is uniform over the g - 1 others (5 sd);
    with an IRR the keep rate is ps."""
    n = 40_000
    for eps_1 in (None, 2.0):
        th = TreeHist(4.0, bits=4, start_bits=0, step=4, rows=1, seed=1, eps_1=eps_1)
        v = np.full(n, 0x5 << 60, dtype=np.uint64)
        _, rw, y = th.unpack(th.randomize(v, np.random.default_rng(3)))
        x = int(K.np_sketch_hash(np.array([5], np.uint64), th.seeds[:1], th.g)[0, 0])
        kept = int((y == x).sum())
        p = th.ps
        assert abs(kept - n * p) < 5 * math.sqrt(n * p * (1 - p))
        other = np.bincount(y[y != x], minlength=th.g)
        exp = (n - kept) / (th.g - 1)
        assert other[x] == 0 and np.all(np.abs(np.delete(other, x) - exp) < 5 * math.sqrt(exp))


# ------------------------------------------------------------------ unbiasedness and MSE against the variance
REPS, N_DEV = 1500, 500  # the MSE's relative sd from REPS repetitions is ~ sqrt(2 / REPS) = 3.7%: 15% is 4 sd


def _population():
    """N_DEV devices over 8-bit items (Zipf(1.1) over 200 of them, ids = item << 56)."""
    rng = np.random.default_rng(2025)
    items = rng.permutation(256)[:200]
    w = 1.0 / np.arange(1, 201) ** 1.1
    counts = rng.multinomial(N_DEV, w / w.sum())
    pop = np.repeat(items, counts).astype(np.uint64) << np.uint64(56)
    rng.shuffle(pop)
    absent = np.setdiff1d(np.arange(256), items)[0]
    cand = np.array([items[0], items[4], absent], dtype=np.uint64) << np.uint64(56)
    f = np.array([np.count_nonzero(pop == c) for c in cand]) / N_DEV
    sumsq = float(((counts / N_DEV) ** 2).sum())
    return pop, cand, f, sumsq


@pytest.mark.parametrize("eps, eps_1, rows", [(1.0, None, 4), (4.0, None, 3), (4.0, 2.0, 6)])
def test_unbiased_and_mse_matches_the_variance(eps, eps_1, rows):
    """Two levels (4 and 8 bits), a uniform level per report, few rows: the noise, the finite-row collision and the
    level-split terms are all visible; a fresh public seed per repetition (the variance is over the hash family)."""
    pop, cand, f, sumsq = _population()
    assert f[0] > 0.1 and f[1] > 0.02 and f[2] == 0
    rng = np.random.default_rng(int(eps * 10) + rows)
    est = np.empty((REPS, cand.shape[0]))
    for r in range(REPS):
        th = TreeHist(eps, bits=8, step=4, start_bits=0, rows=rows, seed=1000 * r + 17, eps_1=eps_1)
        est[r] = th.estimate(th.support(th.randomize(pop, rng)), N_DEV, cand)
    assert th.L == 2
    var = th.variance_exact(f, N_DEV, sumsq - f ** 2)
    mse = ((est - f) ** 2).mean(axis=0)
    assert np.all(np.abs(mse / var - 1) < 0.15), mse / var
    assert np.all(np.abs(est.mean(axis=0) - f) < 4 * np.sqrt(var / REPS))
    assert th.variance(N_DEV) == pytest.approx(float(th.variance_exact(0.0, N_DEV, 1.0 / N_DEV)))


def test_variance_reduces_to_olh():
    """R → ∞, one level, f = 0: OLH's Var* = (1/g)(1 - 1/g) / (n (p - 1/g)^2)."""
    th = TreeHist(4.0, bits=8, step=8, start_bits=0, rows=1 << 16)
    g, p, n = th.g, th.ps, 10_000
    olh = (1 / g) * (1 - 1 / g) / (n * (p - 1 / g) ** 2)
    assert th.variance(n) == pytest.approx(olh, rel=1e-4)


# ------------------------------------------------------------------ the prefix walk
def test_level_schedule_and_walk():
    assert level_schedule(32, 6, 1)[:3] == (7, 8, 9) and len(level_schedule(32, 6, 1)) == 26
    assert level_schedule(32, 4, 4) == (8, 12, 16, 20, 24, 28, 32)
    assert level_schedule(10, 3, 4) == (7, 10)
    for bad in ((32, 32, 1), (32, 0, 0), (32, 30, 1), (64, 30, 1)):
        with pytest.raises(LDPError):
            level_schedule(*bad) if bad[2] else level_schedule(32, 4, 0)
    truth = {0b1011: 0.5, 0b0110: 0.3, 0b1111: 0.1}     # 4-bit items, levels of 2 then 4 bits

    def est(lvl, cands):
        shift = 2 if lvl == 0 else 0
        return np.array([sum(f for i, f in truth.items() if i >> shift == c) for c in cands])

    items, f = prefix_walk((2, 4), est, 2, 2)
    assert items.tolist() == [0b1011, 0b0110] and f.tolist() == [0.5, 0.3]
    items, _ = prefix_walk((2, 4), est, 3, 1, dtype=np.uint64)  # k_prime = 1 loses 0b0110 at level 0
    assert items.dtype == np.uint64 and items[0] == 0b1011 and 0b0110 not in items.tolist()


def test_top_k_finds_a_planted_top_10():
    """2 x 10^5 devices, 40 % of them on 10 planted 20-bit items with Zipf(1.1) weights (15 % down to 1.2 %), the
    rest on random ids: the walk (step 2, 8 levels, 25k reports each) returns exactly the planted items, in order of
    frequency up to the noise, each estimate within 5 sd of the truth and covered by its interval."""
    n = 200_000
    rng = np.random.default_rng(11)
    planted = rng.choice(1 << 20, 10, replace=False).astype(np.uint64) << np.uint64(44)
    w = 1.0 / np.arange(1, 11) ** 1.1
    counts = np.round(0.4 * n * w / w.sum()).astype(int)
    pop = np.concatenate([np.repeat(planted, counts), _ids(n - counts.sum(), 12)])
    rng.shuffle(pop)
    th = TreeHist(4.0, bits=20, step=2, start_bits=4, rows=128, k_prime=16, seed=5)
    s = th.support(th.randomize(pop, rng))
    res = th.top_k(s, n, 10)
    assert res.item_bits == 20 and res.items.dtype == np.uint64
    assert set(res.items.tolist()) == set(planted.tolist())
    f = np.array([counts[planted.tolist().index(i)] for i in res.items.tolist()]) / n
    sd = np.sqrt(th.variance_exact(f, n, np.sum((counts / n) ** 2) - f ** 2))
    assert np.all(np.abs(res.freq - f) < 5 * sd)
    assert np.sum((res.lo <= f) & (f <= res.hi)) >= 8
    assert np.all(np.abs(th.estimate(s, n, res.items) - f) < 5 * sd)  # the plain estimates (no cancellation)
    plain = th.top_k(s, n, 10, cancel=0)
    np.testing.assert_allclose(plain.freq, th.estimate(s, n, plain.items))
    # with candidates: the base ranking of the candidates' items
    ranked = th.top_k(s, n, 2, candidates=np.concatenate([planted[:3], _ids(5, 13)]))
    assert set(ranked.items.tolist()) <= set(planted[:3].tolist())


# ------------------------------------------------------------------ memoized reports and accounting
def test_memoized_reports():
    th = TreeHist(4.0, bits=32, rows=64, seed=3)
    n = 400
    st = th.new_state(n, np.random.default_rng(1))
    ids = _ids(n, 2)
    r1 = th.randomize(ids, np.random.default_rng(5), state=st)
    r2 = th.randomize(ids, None, state=st)                      # other noise key: the same reports
    np.testing.assert_array_equal(r1, r2)
    np.testing.assert_array_equal(th.memoized_outputs(ids, st), r1)
    restored = MemoState(st.fingerprint, st.keys.copy(), np.zeros_like(st.seen), st.memo_size)
    np.testing.assert_array_equal(th.randomize(ids, state=restored), r1)
    # the level is the device's for life, uniform over the levels across devices
    lv = r1[:, 0].astype(int)
    np.testing.assert_array_equal(th.randomize(_ids(n, 3), state=st)[:, 0], lv)
    assert np.bincount(lv, minlength=th.L).min() > 0
    # different devices, the same value: different rows and buckets
    same = np.full(n, ids[0], dtype=np.uint64)
    rs = th.randomize(same, state=th.new_state(n, np.random.default_rng(9)))
    assert len({tuple(x) for x in rs.tolist()}) > n // 2
    # values sharing the device's level prefix share its report; others do not
    shift = (64 - th.plen[lv]).astype(np.uint64)
    sib = ((ids >> shift) << shift) | ((np.uint64(1) << shift) - np.uint64(1))  # same level prefix, other id
    np.testing.assert_array_equal(th.randomize(sib, state=st), r1)


def test_memo_accounting_and_irr():
    th = TreeHist(4.0, bits=32, rows=16, seed=3, eps_1=1.0, memo_slots=1 << 16)
    n = 200
    st = th.new_state(n, np.random.default_rng(1))
    ids = _ids(n, 2)
    prr = th.memoized_outputs(ids, st)
    assert th.memoized_counts(st).sum() == 0                    # memoized_outputs marks nothing
    a = th.randomize(ids, np.random.default_rng(5), state=st)
    b = th.randomize(ids, np.random.default_rng(6), state=st)
    assert not np.array_equal(a, b) and np.array_equal(a[:, :3], prr[:, :3])  # fresh IRR buckets, memoized rows
    np.testing.assert_array_equal(th.memoized_outputs(ids, st), prr)
    assert th.memoized_counts(st).tolist() == [1] * n
    th.randomize(ids ^ np.uint64(1 << 63), state=st)            # a new value (other prefixes): one more input each
    assert th.memoized_counts(st).tolist() == [2] * n
    np.testing.assert_allclose(th.longitudinal_loss(th.memoized_counts(st)), 2 * th.eps_inf)
    assert th.longitudinal_loss(3) == pytest.approx(3 * th.eps_inf)
    assert th.eps_first < th.eps_inf
    with pytest.raises(Exception):
        th.randomize(ids, state=TreeHist(4.0, rows=16, seed=4, eps_1=1.0).new_state(n))  # another configuration
    with pytest.raises(Exception):
        th.randomize(ids[:10], state=st)


def _old_slot(th, a):
    """The memo slot the former (RAPPOR-style) accounting marked for the memoized inputs ``a``."""
    from estimators.sketch.hashing import sketch_hash
    return sketch_hash(np.asarray(a, dtype=np.uint64), th.memo_seed, th.memo_slots)[:, 0]


def test_memo_tags_charge_each_distinct_prefix_once_even_where_the_old_slots_collided():
    th = TreeHist(4.0, bits=32, rows=4, seed=3, memo_slots=128)     # 2 tags (the old scheme: 128 slots)
    assert th.memo_tags == 2
    st = th.new_state(1, np.random.default_rng(1))
    lv = th.device_levels(st)
    # a pair of values of distinct level prefixes that shared a memo slot under the old scheme (found by search)
    cand = _ids(400, 8)
    a = th.memo_inputs(cand, np.repeat(lv, cand.shape[0]))
    slots = _old_slot(th, a)
    pair = next((i, j) for i in range(len(a)) for j in range(i) if slots[i] == slots[j] and a[i] != a[j])
    v1, v2 = cand[list(pair)]
    for _ in range(3):                                           # a repeated value: charged once
        th.randomize(np.array([v1], dtype=np.uint64), state=st)
    assert th.memoized_counts(st).tolist() == [1.0]
    th.randomize(np.array([v2], dtype=np.uint64), state=st)     # the old slot's twin: charged again
    assert th.memoized_counts(st).tolist() == [2.0]
    np.testing.assert_allclose(th.longitudinal_loss(th.memoized_counts(st)), 2 * th.eps_inf)
    for v in (v1, v2, v1):                                      # repeats: nothing new, no overflow
        th.randomize(np.array([v], dtype=np.uint64), state=st)
    assert th.memoized_counts(st).tolist() == [2.0]
    tags = st.seen[0].view("<u8")
    assert (tags & np.uint64(1)).all() and len(set(tags.tolist())) == 2  # nonzero tags, nothing in clear
    assert not {int(x) for x in a[list(pair)]} & set(tags.tolist())
    # a third distinct prefix on a full table: the loss can no longer be accounted (inf), and stays so
    third = next(v for v, x in zip(cand, a) if x not in (a[pair[0]], a[pair[1]]))
    th.randomize(np.array([third], dtype=np.uint64), state=st)
    assert th.memoized_counts(st).tolist() == [math.inf] and th.longitudinal_loss(th.memoized_counts(st))[0] == math.inf
    assert int(st.seen[0].view("<u8")[0]) == int(K.OVERFLOW)
    th.randomize(np.array([v1], dtype=np.uint64), state=st)
    assert th.memoized_counts(st).tolist() == [math.inf]
    # a state of an earlier release (one bit per slot: a nonzero word with its low bit clear) is no tag table
    legacy = th.new_state(2, np.random.default_rng(1))
    legacy.seen[0, 2] = 0x10
    legacy.seen[1, 8] = 0x01                                    # bit 64: a word whose low bit is set: looks like a tag
    assert th.memoized_counts(legacy).tolist() == [math.inf, 1.0]


def test_mark_tags_kernel_equals_twin_and_tags_survive_a_restart(tmp_path):
    th = TreeHist(2.0, bits=16, start_bits=0, step=4, rows=4, seed=5, memo_slots=256)  # 4 tags, few prefixes
    n = 300
    st = th.new_state(n, np.random.default_rng(2))
    twin = MemoState(st.fingerprint, st.keys.copy(), st.seen.copy(), st.memo_size)
    lv = th.device_levels(st)
    rng = np.random.default_rng(4)
    for _ in range(7):                                          # repeats, probing collisions and overflows
        a = th.memo_inputs(rng.integers(0, 1 << 3, n, dtype=np.uint64) << np.uint64(61), lv)
        got = K.mark_tags(np.ascontiguousarray(st.keys), K.TAG, a, st.seen)
        want = K.np_mark_tags(twin.keys, K.TAG, a, twin.seen)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(st.seen, twin.seen)
    c = th.memoized_counts(st)
    assert {-1, 0, 1} >= set(got.tolist()) and np.isinf(c).any() and (c[~np.isinf(c)] <= 4).all() and (c > 0).all()
    # a subset view writes through, as the randomizer's
    sub = st.subset(slice(0, 10))
    th.randomize(np.full(10, 1 << 63, dtype=np.uint64), state=sub)
    np.testing.assert_array_equal(th.memoized_counts(sub), th.memoized_counts(st)[:10])
    # restarts keep the tags: a saved and loaded state counts the same, and a repeat adds nothing
    st.save(tmp_path / "memo.npz")
    back = MemoState.load(tmp_path / "memo.npz", th.fingerprint)
    np.testing.assert_array_equal(th.memoized_counts(back), th.memoized_counts(st))
    th.randomize(a, state=back)                                 # the last batch's prefixes again: all memoized
    np.testing.assert_array_equal(th.memoized_counts(back), th.memoized_counts(st))
    np.testing.assert_array_equal(back.seen, st.seen)


def test_the_protocol_counts_memoized_inputs_for_the_fleet():
    """``FrequencyProtocol.memoized_counts`` defaults to the state's marked cells; TreeHist's counts its tags."""
    from estimators.registry import make

    lo = make("L-OSUE", k=16, eps_inf=2.0, eps_1=1.0)
    lst = lo.new_state(3, np.random.default_rng(0))
    lo.randomize(np.array([1, 2, 2]), np.random.default_rng(1), state=lst)
    np.testing.assert_array_equal(lo.memoized_counts(lst), lst.memoized_count())
    th = TreeHist(4.0, rows=4)
    st = th.new_state(3, np.random.default_rng(0))
    th.randomize(_ids(3, 1), state=st)
    assert th.memoized_counts(st).tolist() == [1.0] * 3 and st.memoized_count().tolist() != [1] * 3


# ------------------------------------------------------------------ wire format, validation, parameters
def test_reports_support_and_validation():
    th = TreeHist(2.0, bits=16, rows=300, k_prime=4, seed=1)
    rng = np.random.default_rng(0)
    r = th.randomize(_ids(3000, 5), rng)
    assert r.dtype == np.uint8 and r.shape == (3000, 5) and th.report_nbytes == 5
    assert np.array_equal(th.decode(th.encode(r)), r)
    s1, s2 = th.support(r[:1000]), th.support(r[1000:])
    np.testing.assert_array_equal(s1 + s2, th.support(r))         # additive: one step vector
    assert th.support_size == th.L * (1 + 300 * th.g) and th.reports_in(s1 + s2) == 3000
    assert th.level_reports(s1).sum() == 1000
    bad_level = r[:5].copy(); bad_level[0, 0] = th.L
    bad_row = r[:5].copy(); bad_row[1, 1:3] = np.array([300], "<u2").view(np.uint8)
    bad_y = r[:5].copy(); bad_y[2, 3:5] = np.array([th.g], "<u2").view(np.uint8)
    for bad in (bad_level, bad_row, bad_y, r[:, :4], r.astype(np.int16), r[:, 0]):
        with pytest.raises(InvalidReports):
            th.support(bad)
    with pytest.raises(InvalidReports):
        th.decode(th.encode(bad_y))
    with pytest.raises(LDPError):
        th.estimate(s1, 999, [1])                                # n disagrees with the support
    with pytest.raises(LDPError):
        th.estimate(s1, 1000)                                    # candidates required
    with pytest.raises(LDPError):
        th.randomize(np.array([-1, 2]))


def test_params_and_fingerprint():
    th = TreeHist(4.0)
    assert th.params() == {"protocol": "TreeHist", "eps": 4.0, "bits": 32, "step": th.step,
                           "start_bits": th.start_bits, "rows": th.R, "oracle": "lh", "k_prime": th.k_prime,
                           "seed": 0, "eps_1": None, "memo_slots": 4096}
    assert th.item_bits == 32 and th.open_domain and th.name == "TreeHist"
    assert th.fingerprint != TreeHist(4.0, seed=1).fingerprint != TreeHist(4.0, eps_1=1.0).fingerprint
    assert TreeHist(4.0, bits=64, start_bits=16, step=8).items_of([2**64 - 1])[0] == 2**64 - 1
    assert TreeHist(4.0, bits=8, start_bits=0, step=8).items_of([2**64 - 1])[0] == 0xFF << 56
    for bad in (dict(bits=0), dict(bits=65), dict(step=0), dict(rows=0), dict(k_prime=0), dict(seed=-1),
                dict(oracle="hr"), dict(start_bits=32), dict(eps=0.0), dict(eps=12.0), dict(memo_slots=0),
                dict(memo_slots=100), dict(memo_slots=32)):
        with pytest.raises(LDPError):
            TreeHist(**{"eps": 4.0, **bad})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TreeHist(4.0, rows=2).randomize(_ids(3, 1))              # CSPRNG by default: no simulation warning


def test_collision_cancellation_removes_the_heavy_collision_term():
    """One level over 8-bit items, 4 rows, one item at 40 %: an absent item's plain estimate carries the heavy item's
    collisions (the finite-row term), the cancelled one does not (fresh public seeds over 60 repetitions)."""
    n, reps = 4000, 60
    rng = np.random.default_rng(21)
    pop = np.concatenate([np.full(int(0.4 * n), 0xAB, np.uint64), rng.integers(0, 256, n - int(0.4 * n)).astype(
        np.uint64)]) << np.uint64(56)
    truth = np.bincount((pop >> np.uint64(56)).astype(np.int64), minlength=256) / n
    cands = np.arange(256, dtype=np.uint64)
    err_plain, err_cancel = 0.0, 0.0
    for r in range(reps):
        th = TreeHist(4.0, bits=8, step=8, start_bits=0, rows=4, seed=r)
        s = th.support(th.randomize(pop, rng))
        err_plain += np.sum((th.level_estimate(s, 0, cands) - truth) ** 2)
        err_cancel += np.sum((th.level_estimate(s, 0, cands, cancel=8) - truth) ** 2)
    var = th.variance_exact(0.0, n, 0.4 ** 2)       # the plain law: the heavy item's collisions included
    assert err_plain / (256 * reps) == pytest.approx(float(var), rel=0.25)
    assert err_cancel < 0.5 * err_plain
    h = rng.integers(0, 5, (60, 7))
    np.testing.assert_array_equal(K.collision_fractions(h, np.array([0, 3, 59])),
                                  K.np_collision_fractions(h, np.array([0, 3, 59])))


@pytest.mark.parametrize("eps_1", [None, 0.5])
def test_audit_lower_bound_is_tight(eps_1):
    from estimators.sketch.cms import audit_lower_bound

    th = TreeHist(1.0, bits=16, rows=4, seed=3, eps_1=eps_1)
    lb = audit_lower_bound(th, 1 << 62, 3 << 62, 40_000, np.random.default_rng(5))
    assert 0.8 * th.eps_first <= lb <= th.eps_first


def test_a_level_nobody_reported_at_gives_no_items_and_zero_estimates() -> None:
    """A tiny step may leave a level empty: the walk finds nothing, a candidate's estimate is 0 (no data), no
    error (the estimator publishes every step)."""
    proto = TreeHist(4.0, bits=16, step=4, rows=4, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reports = proto.randomize(np.full(2, 7, dtype=np.uint64), np.random.default_rng(0))
    support = proto.support(reports)
    assert (proto.level_reports(support) == 0).any()
    top = proto.top_k(support, 2, 5)
    assert top.items.size == 0 and top.freq.size == 0
    est = proto.estimate(support, 2, np.array([7], dtype=np.uint64))
    assert est.shape == (1,) and np.isfinite(est).all()


def test_the_fleet_accounts_a_treehist_attribute_by_its_tags():
    """producers/fleet.py asks the protocol: a TreeHist device's loss is its distinct memoized prefixes × ε∞."""
    from producers.fleet import Fleet, FleetConfig
    from wire.campaign import Campaign

    camp = Campaign.from_dict({"campaign": {"id": "fleet-tags"}, "attributes": [
        {"name": "url", "type": "string", "protocol": "TreeHist", "eps": 2.0, "rows": 4, "memo_slots": 256}]})
    fleet = Fleet(FleetConfig(camp, n_devices=50, steps=3, batch_size=50, seed=1))
    for _ in fleet.run():
        pass
    th = camp.attribute("url").protocol
    counts = fleet.memoized_counts("url")
    assert counts.tolist() == th.memoized_counts(fleet.states["url"]).tolist() and (counts >= 1).all()
    np.testing.assert_allclose(fleet.longitudinal_loss(), counts * th.eps_inf)
