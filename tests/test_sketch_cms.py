"""Apple's Count Mean Sketch and Hadamard Count Mean Sketch (estimators/sketch/cms.py): the kernels against their
numpy twins on fixed keys, the exact ε of the implemented laws, the estimator's bias and MSE against the derived
variance over a Zipf population (fresh public seeds per repetition), the reports' validation, and the audit's
distinguishing event."""
from __future__ import annotations

import math
import warnings
from decimal import Decimal, localcontext

import numpy as np
import pytest

from estimators.errors import InvalidReports, LDPError
from estimators.randomness import noise_key
from estimators.sketch import cms_kernels as K
from estimators.sketch.cms import CMS, HCMS, audit_lower_bound, flip_threshold
from estimators.sketch.hashing import value_id


# ------------------------------------------------------------------ kernels against twins
@pytest.mark.parametrize("forced_rejections", [False, True])
@pytest.mark.parametrize("m, k", [(37, 5), (64, 6), (8, 1)])
def test_cms_kernel_equals_twin(m, k, forced_rejections):
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 2**64 - 1, 300 if forced_rejections else 1500, dtype=np.uint64, endpoint=True)
    p = CMS(1.5, m, k, seed=11)
    key = noise_key(np.random.default_rng(m * k))
    limit = np.uint64(1 << 63) if forced_rejections else p.limit  # half the row words rejected: extension draws
    a = K.cms_randomize(ids, p.seeds, m, key, limit, p.t_hi, p.t_rest)
    b = K.np_cms_randomize(ids, p.seeds, m, key, limit, p.t_hi, p.t_rest)
    np.testing.assert_array_equal(a, b)
    p.validate_reports(a)


@pytest.mark.parametrize("forced_rejections", [False, True])
def test_hcms_kernel_equals_twin(forced_rejections):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 2**64 - 1, 300 if forced_rejections else 3000, dtype=np.uint64, endpoint=True)
    p = HCMS(2.0, 128, 7, seed=5)
    key = noise_key(np.random.default_rng(8))
    limit = np.uint64(1 << 63) if forced_rejections else p.limit
    a = K.hcms_randomize(ids, p.seeds, p.m, key, limit, np.uint64(p.T))
    np.testing.assert_array_equal(a, K.np_hcms_randomize(ids, p.seeds, p.m, key, limit, np.uint64(p.T)))
    p.validate_reports(a)


def test_fwht_rows_equals_twin_and_inverts():
    x = np.random.default_rng(1).integers(-9, 9, (5, 32))
    y = K.fwht_rows(x.copy())
    np.testing.assert_array_equal(y, K.np_fwht_rows(x))
    np.testing.assert_array_equal(K.fwht_rows(y.copy()), 32 * x)  # H H = m I


# ------------------------------------------------------------------ exact ε of the implemented laws
@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0, 10.0])
def test_eps_of_the_law_is_exact(eps):
    cms, hcms = CMS(eps, 64, 4, 0), HCMS(eps, 64, 4, 0)
    for p, bits, share in ((cms, 32, eps / 2), (hcms, 53, eps)):
        T, S = p.T, 1 << bits
        assert T == flip_threshold(share, bits)
        # T is the least integer with (S - T) / T <= e^share (exact rational comparison at 60 digits)
        with localcontext() as ctx:
            ctx.prec = 60
            e = Decimal(share).exp()
            assert Decimal(S - T) <= e * T and Decimal(S - T + 1) > e * (T - 1)
        assert p.q == T / S and p.c == pytest.approx(1 / (1 - 2 * p.q), rel=1e-15)
    # CMS: two ids differ in two bits of the chosen row, each of likelihood ratio (1 - q) / q
    ratio = ((1 - cms.q) / cms.q) ** 2
    assert cms.eps_first == pytest.approx(math.log(ratio), rel=1e-12) and cms.eps_first <= eps
    assert eps - cms.eps_first < 1e-7 * max(1.0, math.exp(eps / 2))
    # HCMS: one bit, ratio (1 - q) / q
    assert hcms.eps_first == pytest.approx(math.log((1 - hcms.q) / hcms.q), rel=1e-12) and hcms.eps_first <= eps
    assert eps - hcms.eps_first < 1e-12 * math.exp(eps)
    assert cms.eps_inf == cms.eps_first


def test_the_sampled_flip_rate_is_the_law():
    """The non-hot bits of CMS reports are 1 w.p. q; HCMS bits disagree with H w.p. q (binomial, 5 sd)."""
    rng = np.random.default_rng(9)
    ids = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True)
    p = CMS(1.0, 64, 3, 2)
    r = p.randomize(ids, rng)
    bits = np.unpackbits(r[:, 2:], axis=1, bitorder="little")
    rows = r[:, 0].astype(np.int64)
    hot = K._np_hash_rows(ids, p.seeds, rows, 64)
    hot_bits = bits[np.arange(len(ids)), hot]
    cold = bits.sum() - hot_bits.sum()
    N = bits.size - len(ids)
    assert abs(cold - N * p.q) < 5 * math.sqrt(N * p.q * (1 - p.q))
    assert abs((1 - hot_bits).sum() - len(ids) * p.q) < 5 * math.sqrt(len(ids) * p.q * (1 - p.q))
    assert np.all(np.abs(np.bincount(rows, minlength=3) - len(ids) / 3) < 5 * math.sqrt(len(ids) * 2 / 9))


# ------------------------------------------------------------------ unbiasedness and MSE against the variance
R, N_DEV = 1500, 500  # the MSE's relative sd from R repetitions is ~ sqrt(2 / R) = 3.7%: 15% is 4 sd
DOMAIN = 10_000


def _zipf_population():
    rng = np.random.default_rng(2024)
    dom = rng.integers(0, 2**64 - 1, DOMAIN, dtype=np.uint64, endpoint=True)
    w = 1.0 / np.arange(1, DOMAIN + 1) ** 1.1
    counts = rng.multinomial(N_DEV, w / w.sum())
    pop = np.repeat(dom, counts)
    rng.shuffle(pop)
    absent = np.uint64(value_id("an id nobody holds"))
    assert absent not in set(dom.tolist())
    cand = np.array([dom[0], dom[4], absent], dtype=np.uint64)   # the heaviest, a heavy one, a zero-frequency id
    f = np.array([np.count_nonzero(pop == c) for c in cand]) / N_DEV
    sumsq = float(((counts / N_DEV) ** 2).sum())
    return pop, cand, f, sumsq


@pytest.mark.parametrize("cls, m, k", [(CMS, 64, 6), (HCMS, 64, 4)])
@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_unbiased_and_mse_matches_the_variance(cls, m, k, eps):
    pop, cand, f, sumsq = _zipf_population()
    assert f[0] > 0.1 and f[1] > 0.015 and f[2] == 0
    rng = np.random.default_rng(int(eps * 10) + m + k)
    est = np.empty((R, cand.shape[0]))
    for r in range(R):  # a fresh public seed each time: the variance is over the hash family too
        p = cls(eps, m, k, seed=1000 * r + 17)
        est[r] = p.estimate(p.support(p.randomize(pop, rng)), N_DEV, cand)
    var = p.variance_exact(f, N_DEV, sumsq - f ** 2)
    mse = ((est - f) ** 2).mean(axis=0)
    assert np.all(np.abs(mse / var - 1) < 0.15), mse / var
    assert np.all(np.abs(est.mean(axis=0) - f) < 4 * np.sqrt(var / R))
    # the published form: distinct values elsewhere, f = 0
    assert p.variance(N_DEV) == pytest.approx(float(p.variance_exact(0.0, N_DEV, 1.0 / N_DEV)))


def test_variance_closed_forms():
    m, n = 64, 1000
    c = CMS(2.0, m, 8, 0)
    e = math.exp(1.0)
    assert c.variance(n) == pytest.approx(((m / (m - 1)) ** 2 * e / (e - 1) ** 2 + 1 / (m - 1)) / n, rel=1e-6)
    h = HCMS(2.0, m, 8, 0)
    ch = (math.exp(2) + 1) / (math.exp(2) - 1)
    assert h.variance(n) == pytest.approx((m / (m - 1)) ** 2 * (ch ** 2 - 1 / m ** 2) / n, rel=1e-9)


# ------------------------------------------------------------------ interface, validation
def test_params_ids_and_errors():
    p = CMS(1.0, 100, 3, seed=7)
    assert p.params() == {"protocol": "CMS", "eps": 1.0, "m": 100, "k": 3, "seed": 7}
    assert p.fingerprint != CMS(1.0, 100, 3, seed=8).fingerprint
    assert p.report_shape == (2 + 13,) and p.support_size == 3 * 101
    rng = np.random.default_rng(0)
    r1 = p.randomize(["a", "b", "a"], rng)
    assert r1.shape == (3, 15)
    with pytest.raises(LDPError):
        p.randomize(np.array([-1, 2]))
    with pytest.raises(LDPError):
        p.randomize(np.array([1, 2]), state=object())
    s = p.support(r1)
    assert s.reshape(3, 101)[:, 100].sum() == 3
    with pytest.raises(LDPError):
        p.estimate(s, 4, ["a"])       # n disagrees with the support
    with pytest.raises(LDPError):
        p.estimate(s, 3)              # open domain: candidates required
    for bad in (dict(m=1), dict(k=0), dict(seed=-1)):
        with pytest.raises(LDPError):
            CMS(**{**dict(eps=1.0, m=8, k=2, seed=0), **bad})
    with pytest.raises(LDPError):
        HCMS(1.0, 48, 2, 0)


def test_invalid_reports_are_rejected():
    rng = np.random.default_rng(1)
    p = CMS(1.0, 37, 5, 3)
    r = p.randomize(np.arange(50, dtype=np.uint64), rng)
    assert np.array_equal(p.decode(p.encode(r)), r)
    bad_row = r.copy(); bad_row[0, 0] = 5
    pad = r.copy(); pad[1, -1] |= 0x80            # bit 39 of a 37-bit report
    for bad in (bad_row, pad, r[:, :-1], r.astype(np.int16)):
        with pytest.raises(InvalidReports):
            p.support(bad)
    with pytest.raises(InvalidReports):
        p.decode(p.encode(bad_row))
    h = HCMS(1.0, 16, 3, 3)
    rh = h.randomize(np.arange(50, dtype=np.uint64), rng)
    assert np.array_equal(h.decode(h.encode(rh)), rh) and rh.max() < 2 * 3 * 16
    for bad in (np.array([2 * 3 * 16], dtype=np.uint64), rh.astype(np.int64), rh.reshape(5, 10)):
        with pytest.raises(InvalidReports):
            h.support(bad)


# ------------------------------------------------------------------ audit
@pytest.mark.parametrize("cls", [CMS, HCMS])
def test_audit_lower_bound_is_tight(cls):
    p = cls(1.0, 64, 4, seed=3)
    lb = audit_lower_bound(p, 1, 2, 40_000, np.random.default_rng(5))
    assert 0.8 * p.eps_first <= lb <= p.eps_first


@pytest.mark.parametrize("m", [8, 61, 256])
def test_cms_support_kernel_equals_its_numpy_twin(m) -> None:
    from estimators.sketch.cms_kernels import cms_support, np_cms_support

    proto = CMS(1.0, m, 5, 11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = proto.randomize(np.arange(3000, dtype=np.uint64), np.random.default_rng(m))
    got = cms_support(r, 5, m)
    assert np.array_equal(got, np_cms_support(r, 5, m)) and got[:, m].sum() == 3000
    assert got[:, :m].sum() == np.unpackbits(r[:, 2:], axis=1, bitorder="little")[:, :m].sum()
