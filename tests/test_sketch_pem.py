"""PEM heavy hitters (estimators/sketch/pem.py), its candidate-support and memoized-report kernels (pem_kernels.py) and
its longitudinal use."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.errors import LDPError
from estimators.kernels import lh_support
from estimators.memo import MemoState
from estimators.sketch.hashing import value_ids
from estimators.sketch.pem import PEM, compare_with_pure_ldp, id_items, zipf_items
from estimators.sketch.pem_kernels import candidate_support, candidate_support_np, memo_olh, memo_olh_np

PLANTED = np.array([0xABCDE, 0x12345, 0xFFFFF, 0x00001, 0x80000])
PLANTED_F = np.array([0.10, 0.08, 0.06, 0.05, 0.04])


def planted(n: int, seed: int, bits: int = 20) -> np.ndarray:
    """``PLANTED_F`` of the devices hold the planted items, the rest uniform draws over ``[0, 2^bits)``."""
    rng = np.random.default_rng(seed)
    counts = (PLANTED_F * n).astype(int)
    items = np.concatenate([np.repeat(PLANTED, counts), rng.integers(0, 1 << bits, n - counts.sum())])
    return rng.permutation(items)


@pytest.mark.parametrize("g", [2, 56, 1000])
def test_kernel_equals_numpy_twin(g):
    rng = np.random.default_rng(g)
    seeds = rng.integers(0, 2**32, 5000, dtype=np.uint32)
    ys = rng.integers(0, g, 5000)
    cands = np.concatenate([rng.integers(0, 2**32, 200), [0, 2**32 - 1]])
    np.testing.assert_array_equal(candidate_support(seeds, ys, cands, g), candidate_support_np(seeds, ys, cands, g))
    # on the whole small domain it is the project's OLH support
    np.testing.assert_array_equal(candidate_support(seeds, ys, np.arange(300), g),
                                  lh_support(seeds, ys.astype(np.uint16), 300, g))


def test_levels_and_parameters():
    assert PEM(32, 4.0, 20, step=4, start_bits=4).prefix_bits == (8, 12, 16, 20, 24, 28, 32)
    p = PEM(20, 4.0, 5)  # start_bits = ceil(log2 5) = 3 (the paper's s_0)
    assert p.prefix_bits == (7, 11, 15, 19, 20) and p.groups == 5
    assert [o.k for o in p.oracles] == [2**b for b in p.prefix_bits]
    for bad in (dict(bits=33), dict(bits=0), dict(k=0), dict(step=0), dict(k_prime=3), dict(start_bits=20)):
        kw = dict(bits=20, eps=4.0, k=5) | bad
        with pytest.raises(LDPError):
            PEM(**kw)
    assert np.bincount(p.assign_groups(10, by_index=True)).tolist() == [2, 2, 2, 2, 2]


def test_id_items_are_top_bits():
    ids = value_ids(["a", "b", 2**63 + 5])
    np.testing.assert_array_equal(id_items(ids, 20), (ids >> np.uint64(44)).astype(np.int64))
    assert id_items(np.array([2**63 + 5], dtype=np.uint64), 1)[0] == 1


def test_planted_heavy_hitters_found():
    """2^20 values, n = 10^5, ε = 4: the 5 planted items (4 % to 10 %) are the top 5, in order. A level's m = n/5
    reports give σ = sqrt(Var*(m)) ≈ 0.002 (Var* = qs(1-qs)/(m(ps-qs)^2) ≈ 0.076/m at ε = 4), so the smallest
    planted item sits 20σ above the noise and the estimates lie within 5σ (exact variance, f ≤ 0.1) of the truth."""
    n = 100_000
    pem = PEM(20, 4.0, 5)
    res = pem.decode(pem.randomize(planted(n, 1), np.random.default_rng(1)))
    np.testing.assert_array_equal(res.items, PLANTED)
    assert sum(res.group_sizes) == n
    sd = np.sqrt(pem.oracles[-1].variance_exact(PLANTED_F, res.group_sizes[-1]))
    assert np.all(np.abs(res.freq - PLANTED_F) < 5 * sd)
    assert np.all(res.lo < res.freq) and np.all(res.freq < res.hi)


def test_intervals_cover():
    """20 nominal 95 % intervals (4 seeds x the 5 planted items, independent data and noise): the number covering
    is Binomial(20, 0.95) when the intervals are right; at least 16 is required (P(<= 15) = 0.3 %)."""
    n, covered = 100_000, 0
    pem = PEM(20, 4.0, 5)
    for seed in range(4):
        res = pem.decode(pem.randomize(planted(n, 10 + seed), np.random.default_rng(seed), by_index=True))
        truth = dict(zip(PLANTED.tolist(), PLANTED_F))
        covered += sum(lo <= truth.get(int(i), 0.0) <= hi for i, lo, hi in zip(res.items, res.lo, res.hi))
    assert covered >= 16


def test_zipf_items_range_and_head():
    items = zipf_items(50_000, 32, 1.1, 3)
    assert items.min() >= 0 and items.max() < 2**32
    assert np.unique(items, return_counts=True)[1].max() > 0.05 * items.size  # rank 1 holds ~10 %


def test_compare_with_pure_ldp_small():
    """The peer (the bench extra, which make test installs) runs on the same data and seed through the same function
    (the full-size comparison, n = 10^6 over 2^32, is a measurement, not a test: docs/benchmarks.md)."""
    r = compare_with_pure_ldp(n=20_000, seed=0, bits=16, k=5, start_bits=4, step=4)
    assert r["groups"] == 3
    assert 0.0 <= r["pure_ldp"]["recall"] <= 1.0 and r["ours"]["recall"] >= 0.6


# ------------------------------------------------------------------ longitudinal use: memoized reports
def test_memo_olh_kernel_equals_twin():
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**32, (3000, 8), dtype=np.uint32)
    x = rng.integers(0, 2**32, 3000)
    for g, p in ((56, 0.5), (3, 0.4)):
        a, b = memo_olh(x, keys, g, p), memo_olh_np(x, keys, g, p)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])


def test_memoized_reports_and_loss():
    """With a memo state a device's group is fixed by its key and its report of an unchanged value is the same
    forever (restored keys included); the loss is one ε∞ per distinct memoized prefix; the decoding still finds the
    planted items (each device reports once)."""
    n = 50_000
    pem = PEM(20, 4.0, 5)
    items = planted(n, 3)
    st = pem.new_state(n, np.random.default_rng(1))
    a = pem.randomize(items, state=st)
    b = pem.randomize(items, np.random.default_rng(9), state=st)
    restored = MemoState(st.fingerprint, st.keys.copy(), np.zeros_like(st.seen), st.memo_size)
    for x, y, z, w in zip(a.levels, b.levels, pem.randomize(items, state=restored).levels,
                          pem.memoized_outputs(items, st).levels):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
        np.testing.assert_array_equal(x, w)
    sizes = np.bincount(pem.device_groups(st), minlength=pem.groups)
    assert sizes.tolist() == [r.shape[0] for r in a.levels] and sizes.min() > 0.18 * n
    assert pem.memoized_counts(st).tolist() == [1] * n
    acc = PEM(20, 4.0, 5, memo_slots=128)                 # a table of 2 tags: exact, whatever the prefixes
    st2 = acc.new_state(500, np.random.default_rng(3))
    acc.randomize(items[:500], state=st2)
    acc.randomize(items[:500], state=st2)                 # the same value again: nothing new
    assert acc.memoized_counts(st2).tolist() == [1] * 500
    acc.randomize(items[:500] ^ (1 << 19), state=st2)     # another top bit: a new prefix at every level
    assert acc.memoized_counts(st2).tolist() == [2] * 500
    np.testing.assert_allclose(acc.longitudinal_loss(acc.memoized_counts(st2)), 2 * acc.eps_inf)
    acc.randomize(items[:500] ^ (1 << 18), state=st2)     # a third prefix: the table is full, the loss unaccountable
    assert np.isinf(acc.longitudinal_loss(acc.memoized_counts(st2))).all()
    assert pem.eps_inf == pytest.approx(4.0)
    same = pem.randomize(np.full(n, 7), state=pem.new_state(n, np.random.default_rng(2)))
    assert len(np.unique(np.concatenate([r["seed"] for r in same.levels]))) > 0.99 * n   # devices differ
    res = pem.decode(a)
    np.testing.assert_array_equal(np.sort(res.items), np.sort(PLANTED))
    with pytest.raises(Exception):
        pem.randomize(items, state=PEM(20, 4.0, 6).new_state(n))     # another configuration's state
    assert pem.params()["protocol"] == "PEM" and pem.fingerprint != PEM(20, 4.0, 5, memo_slots=64).fingerprint
    with pytest.raises(LDPError, match="multiple of 64"):
        PEM(20, 4.0, 5, memo_slots=100)
