"""Plain-numpy references of the numba kernels in :mod:`estimators.kernels`.

Same inputs, same counter-based randomness, same outputs: the tests compare them exactly.
They are slow and memory-hungry on purpose (clarity first); never call them on hot paths.
"""
from __future__ import annotations

import numpy as np

from ._rand import GOLDEN, np_bernoulli8, np_mix64, np_other_than, np_unit, np_word, split_threshold
from .kernels import _HOT, _IRR, _PRR


def _addr(values, keys, memo, seed):
    n = values.shape[0]
    if memo:
        return keys.astype(np.uint64), values.astype(np.uint64)
    return np.full(n, seed, dtype=np.uint64), np.arange(n, dtype=np.uint64)


def _mark(seen, values):
    rows = np.arange(values.shape[0])
    np.bitwise_or.at(seen, (rows, values >> 3), (1 << (values & 7)).astype(np.uint8))


def grr_chain_randomize(values, keys, memo, seen, seed, p1, p2, m):
    values = values.astype(np.int64)
    n = values.shape[0]
    key, a = _addr(values, keys, memo, seed)
    if memo:
        _mark(seen, values)
    x = values.copy()
    flip = np_unit(key, a, 0) >= p1
    x[flip] = np_other_than(x, m, np_unit(key, a, 1))[flip]
    if p2 < 1.0:
        i = np.arange(n, dtype=np.uint64)
        flip2 = np_unit(seed, i, 2) >= p2
        x[flip2] = np_other_than(x, m, np_unit(seed, i, 3))[flip2]
    return x


def ue_chain_randomize(values, keys, memo, seen, seed, t1p, t1q, t2p, t2q, k):
    values = values.astype(np.int64)
    n = values.shape[0]
    key, a = _addr(values, keys, memo, seed)
    if memo:
        _mark(seen, values)
    base = np_word(key, a, _PRR)
    ibase = np_word(seed, np.arange(n, dtype=np.uint64), _IRR)
    with np.errstate(over="ignore"):
        hot = (np_mix64(base + np.uint64(_HOT) * GOLDEN) & np.uint64(0xFFFFFFFF)) < t1p
    lanes = np.arange(8, dtype=np.uint64)
    nbytes = (k + 7) // 8
    out = np.zeros((n, nbytes), dtype=np.uint8)
    q1 = split_threshold(t1q)
    for b in range(nbytes):
        bits = np_bernoulli8(base, b, np.full((n, 8), q1[0]), np.full((n, 8), q1[1]))
        mine = (values >> 3) == b
        m = np.uint64(1) << (values & 7).astype(np.uint64)
        bits = np.where(mine & hot, bits | m, np.where(mine, bits & ~m, bits))
        if not (t2p == 1 << 32 and t2q == 0):
            prr = ((bits[:, None] >> lanes) & np.uint64(1)).astype(bool)
            (p_hi, p_rest), (q_hi, q_rest) = split_threshold(t2p), split_threshold(t2q)
            bits = np_bernoulli8(ibase, b, np.where(prr, p_hi, q_hi), np.where(prr, p_rest, q_rest))
        if b == nbytes - 1 and k & 7:
            bits &= np.uint64((1 << (k & 7)) - 1)
        out[:, b] = bits.astype(np.uint8)
    return out


def packed_bit_counts(bits, k):
    return np.unpackbits(bits, axis=1, bitorder="little")[:, :k].sum(axis=0, dtype=np.int64)


def bincount(values, m):
    return np.bincount(values, minlength=m).astype(np.int64)


# ------------------------------------------------------------------ Hadamard response (HR, FHR)
def _h(r, c):
    """Hadamard entries ``(-1)^popcount(r & c)`` as int64 ±1 (broadcasting)."""
    return 1 - 2 * (np.bitwise_count(np.bitwise_and(r, c)).astype(np.int64) & 1)


def hr_randomize(values, seed, p, K):
    i = np.arange(values.shape[0], dtype=np.uint64)
    j = (np_unit(seed, i, 0) * K).astype(np.int64)
    bit = (_h(j, values.astype(np.int64) + 1) + 1) // 2
    bit = np.where(np_unit(seed, i, 1) >= p, 1 - bit, bit)
    return (j << 1) | bit


def hr_support(reports, K, k):
    """Naive O(n k) twin: count, for every value, the reports whose bit matches its column."""
    r = reports.astype(np.int64)
    sign = 2 * (r & 1) - 1
    cols = np.arange(1, k + 1, dtype=np.int64)
    return (_h((r >> 1)[:, None], cols[None, :]) == sign[:, None]).sum(axis=0, dtype=np.int64)


def fhr_randomize(values, seed, p, K):
    i = np.arange(values.shape[0], dtype=np.uint64)
    w = values.astype(np.int64) + 1
    low = w & -w
    x = (np_unit(seed, i, 0) * K).astype(np.int64)
    x = np.where(_h(w, x) == -1, x ^ low, x)
    y = (np_unit(seed, i, 1) * K).astype(np.int64)
    y = np.where(_h(w, y) == 1, y ^ low, y)
    keep = np_unit(seed, i, 2) < p
    return np.stack([np.where(keep, x, y), np.where(keep, y, x)], axis=1)


def fhr_support(reports, K, k):
    """Naive O(n k) twin: ``sum_i (H[t+1, P_i] - H[t+1, M_i]) / 2`` for every value t."""
    r = reports.astype(np.int64)
    rows = np.arange(1, k + 1, dtype=np.int64)[None, :]
    return ((_h(r[:, :1], rows) - _h(r[:, 1:], rows)) // 2).sum(axis=0, dtype=np.int64)


# ------------------------------------------------------------------ local hashing (BLH, OLH, LOLOHA)
from ._rand import np_word as _np_word  # noqa: E402
from .kernels import LH_A, LH_B, LH_DEVICE_MSG, SIP_K1  # noqa: E402


def _np_rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _np_sip_round(v0, v1, v2, v3):
    v0 = v0 + v1
    v1 = _np_rotl(v1, 13) ^ v0
    v0 = _np_rotl(v0, 32)
    v2 = v2 + v3
    v3 = _np_rotl(v3, 16) ^ v2
    v0 = v0 + v3
    v3 = _np_rotl(v3, 21) ^ v0
    v2 = v2 + v1
    v1 = _np_rotl(v1, 17) ^ v2
    v2 = _np_rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(k0, k1, m):
    """SipHash-2-4 of one 8-byte message word, vectorized over numpy uint64 arrays."""
    k0, k1, m = (np.asarray(t, dtype=np.uint64) for t in (k0, k1, m))
    last = np.uint64(8 << 56)
    with np.errstate(over="ignore"):
        v0 = k0 ^ np.uint64(0x736F6D6570736575)
        v1 = k1 ^ np.uint64(0x646F72616E646F6D)
        v2 = k0 ^ np.uint64(0x6C7967656E657261)
        v3 = (k1 ^ np.uint64(0x7465646279746573)) ^ m
        for _ in range(2):
            v0, v1, v2, v3 = _np_sip_round(v0, v1, v2, v3)
        v0 = v0 ^ m
        v3 = v3 ^ last
        for _ in range(2):
            v0, v1, v2, v3 = _np_sip_round(v0, v1, v2, v3)
        v0 = v0 ^ last
        v2 = v2 ^ np.uint64(0xFF)
        for _ in range(4):
            v0, v1, v2, v3 = _np_sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def lh_hash(hseeds, values, g):
    """``H_seed(v)`` broadcast over ``hseeds`` and ``values`` (multiply-add-shift, see kernels)."""
    h = np.asarray(hseeds, dtype=np.uint64)
    a, b = _np_word(h, 0, LH_A), _np_word(h, 0, LH_B)
    with np.errstate(over="ignore"):
        return ((((a * np.asarray(values, dtype=np.uint64) + b) >> np.uint64(32)) * np.uint64(g))
                >> np.uint64(32)).astype(np.int64)


def lh_encode(values, keys, memo, seed, g):
    n = values.shape[0]
    if memo:
        s = siphash24(keys, SIP_K1, LH_DEVICE_MSG)
    else:
        s = siphash24(seed, SIP_K1, np.arange(n, dtype=np.uint64))
    hseeds = (s & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return hseeds, lh_hash(hseeds, values, g)


def lh_hash_rows(hseeds, values, g):
    return lh_hash(hseeds, values, g)


def lh_support(hseeds, ys, k, g):
    h = lh_hash(np.asarray(hseeds)[:, None], np.arange(k)[None, :], g)
    return (h == np.asarray(ys, dtype=np.int64)[:, None]).sum(axis=0, dtype=np.int64)


# ------------------------------------------------------------------ dBitFlipPM
from .kernels import BITFLIP_J  # noqa: E402


def bitflip_randomize(values, keys, seen, out, k, b, p, q, floyd):
    n, d = out.shape
    x = values.astype(np.int64) * b // k
    _mark(seen, x)
    keys = np.asarray(keys, dtype=np.uint64)
    J = np.zeros((n, d), dtype=np.int64)
    if floyd:
        for col, t in enumerate(range(b - d, b)):
            r = (np_unit(keys, BITFLIP_J, t) * (t + 1)).astype(np.int64)
            dup = (J[:, :col] == r[:, None]).any(axis=1)
            J[:, col] = np.where(dup, t, r)
        J.sort(axis=1)
    else:
        sel = np.zeros(n, dtype=np.int64)
        rows = np.arange(n)
        for t in range(b):
            need = d - sel
            take = (need > 0) & ((need == b - t) | (np_unit(keys, BITFLIP_J, t) * (b - t) < need))
            J[rows[take], sel[take]] = t
            sel += take
    hit = J == x[:, None]
    case = np.where(hit.any(axis=1), hit.argmax(axis=1), d)
    l = np.arange(d)
    u = np_unit(keys[:, None], case.astype(np.uint64)[:, None], l.astype(np.uint64)[None, :])
    bits = u < np.where(l[None, :] == case[:, None], p, q)
    out[...] = J * 2 + bits
    return out


def bitflip_support(reports, b):
    j = reports.astype(np.int64) >> 1
    ok = j < b
    counts = np.bincount(j[ok], weights=(reports.astype(np.int64) & 1)[ok], minlength=b).astype(np.int64)
    prev = np.concatenate([np.full((j.shape[0], 1), -1, dtype=np.int64), j[:, :-1]], axis=1)
    return counts[:b], int((~ok).sum()), int((j <= prev).sum())


# ------------------------------------------------------------------ subset selection (SS)
def ss_randomize(values, seed, ps, omega, k):
    """Floyd's algorithm run in lockstep over all rows (step ``s`` active while ``s < m``)."""
    x = values.astype(np.int64)
    n = x.shape[0]
    i = np.arange(n, dtype=np.uint64)
    rows = np.arange(n)
    member = np.zeros((n, k), dtype=bool)
    keep = np_unit(seed, i, 0) < ps
    member[rows[keep], x[keep]] = True
    m = np.where(keep, omega - 1, omega)
    for s in range(omega):
        act = s < m
        j = np.where(act, (k - 1) - m + s, 0)  # inactive rows: any in-range index, discarded
        t = (np_unit(seed, i, 1 + s) * (j + 1)).astype(np.int64)
        vt = t + (t >= x)
        hit = member[rows, vt]
        vt = np.where(hit, j + (j >= x), vt)
        member[rows[act], vt[act]] = True
    return np.packbits(member, axis=1, bitorder="little")


def packed_to_indices(bits, out):
    k = bits.shape[1] * 8
    member = np.unpackbits(bits, axis=1, bitorder="little")[:, :k].astype(bool)
    out[...] = np.nonzero(member)[1].reshape(out.shape)
    return out


# ------------------------------------------------------------------ histogram encoding (SHE)
import math  # noqa: E402

_log = np.frompyfunc(math.log, 1, 1)  # libm's log, as in the kernel (numpy's SIMD log may differ by an ulp)


def she_randomize(values, seed, beta, shift, bound, k):
    x = values.astype(np.int64)
    n = x.shape[0]
    i = np.arange(n, dtype=np.uint64)[:, None]
    j = np.arange(k, dtype=np.uint64)[None, :]
    t = np_unit(seed, i, j) - 0.5 + 2.0 ** -54
    d = np.floor(-beta * _log(1.0 - 2.0 * np.abs(t)).astype(np.float64) + 0.5)
    d = np.where(t < 0.0, -d, d)
    d = d + np.where(np.arange(k)[None, :] == x[:, None], shift, 0.0)
    return np.clip(d, -bound, bound).astype(np.int32)


def int_column_sums(reports, bound):
    r = reports.astype(np.int64)
    return r.sum(axis=0), int(((r > bound) | (r < -bound)).sum())
