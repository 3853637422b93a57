"""Numba kernels: the hot loops of every randomizer and support counter.

Each kernel has a plain-numpy twin in :mod:`estimators.reference` computing the same
function from the same counter-based randomness (:mod:`estimators._rand`); the tests check
that they agree exactly. Randomizers take ``keys`` (per-device memo keys) and ``memo``:
with ``memo`` the first round (PRR) is addressed by ``(key, memoized input)`` and so is
permanent; without it the first round uses the batch ``seed`` and the row index.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ._rand import EXPAND, bernoulli_bytes, other_than, stream_word, unit, word

_PRR = np.uint64(0x50F5F5F5)  # stream domain separators of the two rounds
_IRR = np.uint64(0x1BD11BDA)
_HOT = 1 << 41  # stream word of the PRR's hot bit
_LO32 = np.uint64(0xFFFFFFFF)

_PAR = dict(parallel=True, cache=True, nogil=True)
_CHUNK = 1 << 12


@nb.njit(inline="always", cache=True)
def _mark(seen: np.ndarray, i: int, x: int) -> None:
    seen[i, x >> 3] |= np.uint8(1 << (x & 7))


# ------------------------------------------------------------------ direct encoding (GRR chain)
@nb.njit(**_PAR)
def grr_chain_randomize(values, keys, memo, seen, seed, p1, p2, m):
    """Two GRR rounds over ``[0, m)``: PRR with ``p1`` (memoized if ``memo``), IRR with ``p2``.

    ``p2 = 1`` disables the second round (single-shot GRR).
    """
    n = values.shape[0]
    out = np.empty(n, dtype=np.int64)
    for i in nb.prange(n):
        x = np.int64(values[i])
        if memo:
            k = keys[i]
            a = np.uint64(x)
            _mark(seen, i, x)
        else:
            k = seed
            a = np.uint64(i)
        if unit(k, a, np.uint64(0)) >= p1:
            x = other_than(x, m, unit(k, a, np.uint64(1)))
        if p2 < 1.0 and unit(seed, np.uint64(i), np.uint64(2)) >= p2:
            x = other_than(x, m, unit(seed, np.uint64(i), np.uint64(3)))
        out[i] = x
    return out


# ------------------------------------------------------------------ unary encoding (UE chain)
@nb.njit(**_PAR)
def ue_chain_randomize(values, keys, memo, seen, seed, t1p, t1q, t2p, t2q, k):
    """Two UE rounds over ``k`` bits, packed little-endian into ``uint8 (n, ceil(k/8))``.

    Thresholds are 32-bit (:func:`estimators._rand.threshold32`). PRR bit j is 1 w.p.
    ``t1p`` if j is the value's bit else ``t1q``, drawn from the stream of ``(key, value)`` if
    ``memo`` else of ``(seed, row)``; IRR bit j is 1 w.p. ``t2p`` if the PRR bit is 1 else
    ``t2q``, from the stream of ``(seed, row, IRR)``. ``t2p = 2^32, t2q = 0`` disables the
    second round (single-shot SUE / OUE / THE). Output byte ``b`` of a round is 8 lazy
    Bernoulli bits from stream word ``b`` (:func:`estimators._rand.bernoulli_bytes`); the hot
    bit of the PRR is redrawn from stream word ``HOT`` with threshold ``t1p``.
    """
    n = values.shape[0]
    nbytes = (k + 7) // 8
    out = np.zeros((n, nbytes), dtype=np.uint8)
    irr = not (t2p == np.uint64(1 << 32) and t2q == np.uint64(0))
    q1_hi, q1_rest = t1q >> np.uint64(24), t1q & np.uint64(0xFFFFFF)
    if q1_hi > 255:
        q1_hi, q1_rest = np.uint64(255), t1q - np.uint64(255 << 24)
    p2_hi, p2_rest = t2p >> np.uint64(24), t2p & np.uint64(0xFFFFFF)
    if p2_hi > 255:
        p2_hi, p2_rest = np.uint64(255), t2p - np.uint64(255 << 24)
    q2_hi, q2_rest = t2q >> np.uint64(24), t2q & np.uint64(0xFFFFFF)
    if q2_hi > 255:
        q2_hi, q2_rest = np.uint64(255), t2q - np.uint64(255 << 24)
    ones = np.uint64(0x0101010101010101)
    q1_lanes, p2_lanes, q2_lanes = q1_hi * ones, p2_hi * ones, q2_hi * ones
    last = np.uint64((1 << (k & 7)) - 1) if k & 7 else np.uint64(0xFF)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        bits = np.empty(nbytes, dtype=np.uint64)
        hi = np.full(nbytes, q1_lanes, dtype=np.uint64)
        sel = np.zeros(nbytes, dtype=np.uint64)
        eq = np.empty(nbytes, dtype=np.uint64)
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            x = np.int64(values[i])
            if memo:
                base = word(keys[i], np.uint64(x), _PRR)
                _mark(seen, i, x)
            else:
                base = word(seed, np.uint64(i), _PRR)
            for b in range(nbytes):
                hi[b] = q1_lanes
                sel[b] = 0
            bernoulli_bytes(base, hi, sel, q1_rest, q1_rest, bits, eq)
            m = np.uint64(1) << np.uint64(x & 7)
            if (stream_word(base, _HOT) & _LO32) < t1p:
                bits[x >> 3] |= m
            else:
                bits[x >> 3] &= ~m
            if irr:
                for b in range(nbytes):
                    e = EXPAND[bits[b]]
                    hi[b] = (e & p2_lanes) | (~e & q2_lanes)
                    sel[b] = bits[b]
                bernoulli_bytes(word(seed, np.uint64(i), _IRR), hi, sel, p2_rest, q2_rest, bits, eq)
            bits[nbytes - 1] &= last
            for b in range(nbytes):
                out[i, b] = np.uint8(bits[b])
    return out


@nb.njit(**_PAR)
def packed_bit_counts(bits, k):
    """Column sums of a little-endian packed bit matrix ``uint8 (n, ceil(k/8))``."""
    n, nbytes = bits.shape
    nchunks = (n + _CHUNK - 1) // _CHUNK
    partial = np.zeros((nchunks, nbytes * 8), dtype=np.int64)
    for c in nb.prange(nchunks):
        row = partial[c]
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            for b in range(nbytes):
                byte = bits[i, b]
                if byte:
                    for t in range(8):
                        row[b * 8 + t] += (byte >> t) & 1
    return partial.sum(axis=0)[:k]


@nb.njit(**_PAR)
def bincount(values, m):
    """``np.bincount(values, minlength=m)`` for int arrays already checked to lie in [0, m)."""
    n = values.shape[0]
    nchunks = (n + _CHUNK - 1) // _CHUNK
    partial = np.zeros((nchunks, m), dtype=np.int64)
    for c in nb.prange(nchunks):
        row = partial[c]
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            row[values[i]] += 1
    return partial.sum(axis=0)


__all__ = ["grr_chain_randomize", "ue_chain_randomize", "packed_bit_counts", "bincount", "word"]


# ------------------------------------------------------------------ Hadamard response (HR, FHR)
# H[r, c] = (-1)^popcount(r & c) (Sylvester order, seed 004 Eq. 6); value v is row/column v + 1.
@nb.njit(inline="always", cache=True)
def _parity(x: np.int64) -> np.int64:
    """popcount(x) mod 2 for 0 <= x < 2**63."""
    x ^= x >> 32
    x ^= x >> 16
    x ^= x >> 8
    x ^= x >> 4
    x ^= x >> 2
    x ^= x >> 1
    return x & 1


@nb.njit(cache=True, nogil=True)
def fwht(a):
    """In-place fast Walsh-Hadamard transform: ``a[c] <- sum_r a[r] H[r, c]`` (len a power of 2)."""
    m = a.shape[0]
    h = 1
    while h < m:
        for s in range(0, m, 2 * h):
            for j in range(s, s + h):
                x = a[j]
                y = a[j + h]
                a[j] = x + y
                a[j + h] = x - y
        h *= 2
    return a


@nb.njit(**_PAR)
def hr_randomize(values, seed, p, K):
    """HR: row ``j`` uniform in [0, K), bit = [H[j, v+1] = +1] kept w.p. ``p``; report ``2 j + bit``."""
    n = values.shape[0]
    out = np.empty(n, dtype=np.int64)
    for i in nb.prange(n):
        a = np.uint64(i)
        j = np.int64(unit(seed, a, np.uint64(0)) * K)
        bit = 1 - _parity(j & (np.int64(values[i]) + 1))
        if unit(seed, a, np.uint64(1)) >= p:
            bit = 1 - bit
        out[i] = (j << 1) | bit
    return out


def hr_support(reports, K, k):
    """HR support ``C(v) = #{(j, bit): H[j, v+1] = ±1 matches bit}`` in O(n + K log K).

    ``D[j] = #(j, +1) - #(j, -1)``; ``C(v) = (n + FWHT(D)[v+1]) / 2``. Reports checked < 2K.
    """
    return _hr_support(reports, K, k, nb.get_num_threads())


@nb.njit(**_PAR)
def _hr_support(reports, K, k, threads):
    n = reports.shape[0]
    parts = max(1, min(threads, n // _CHUNK))
    partial = np.zeros((parts, K), dtype=np.int64)
    for c in nb.prange(parts):
        row = partial[c]
        for i in range(c * n // parts, (c + 1) * n // parts):
            x = np.int64(reports[i])
            row[x >> 1] += 2 * (x & 1) - 1
    d = fwht(partial.sum(axis=0))
    return (n + d[1:k + 1]) // 2


@nb.njit(**_PAR)
def fhr_randomize(values, seed, p, K):
    """FHR (seed 004 Alg. 1): ``x`` uniform among the +1 columns of row v+1, ``y`` among the -1
    columns; kept (``b = +e_x - e_y``) w.p. ``p`` else flipped. Report ``(P, M)`` = positions of
    the +1 and the -1 of ``b``. A uniform column is moved into the wanted coset of the row by
    xor-ing the row's lowest set bit (a bijection between the two halves)."""
    n = values.shape[0]
    out = np.empty((n, 2), dtype=np.int64)
    for i in nb.prange(n):
        a = np.uint64(i)
        w = np.int64(values[i]) + 1
        low = w & -w
        x = np.int64(unit(seed, a, np.uint64(0)) * K)
        if _parity(w & x) == 1:
            x ^= low
        y = np.int64(unit(seed, a, np.uint64(1)) * K)
        if _parity(w & y) == 0:
            y ^= low
        if unit(seed, a, np.uint64(2)) < p:
            out[i, 0] = x
            out[i, 1] = y
        else:
            out[i, 0] = y
            out[i, 1] = x
    return out


def fhr_support(reports, K, k):
    """FHR support ``C(t) = (z . H(t)) / 2`` with ``z = sum_i b_i`` (seed 004 Eq. 7), via FWHT.

    Reports ``(P, M)`` checked ``< K``; ``b_i . H(t) = H[t+1, P] - H[t+1, M]`` is even.
    """
    return _fhr_support(reports, K, k, nb.get_num_threads())


@nb.njit(**_PAR)
def _fhr_support(reports, K, k, threads):
    n = reports.shape[0]
    parts = max(1, min(threads, n // _CHUNK))
    partial = np.zeros((parts, K), dtype=np.int64)
    for c in nb.prange(parts):
        row = partial[c]
        for i in range(c * n // parts, (c + 1) * n // parts):
            row[np.int64(reports[i, 0])] += 1
            row[np.int64(reports[i, 1])] -= 1
    z = fwht(partial.sum(axis=0))
    return z[1:k + 1] // 2


# ------------------------------------------------------------------ local hashing (BLH, OLH, LOLOHA)
# Hash seeds travel in the reports, so they must not reveal the secret they are derived from
# (the batch seed, or a device's memo key, both of which also drive the GRR coins). ``word``
# is a bijection of its key (SplitMix64 is invertible), so hash seeds come from SipHash-2-4
# (Aumasson & Bernstein 2012), a keyed PRF, truncated to 32 bits. The hash family itself is
# Dietzfelbinger's multiply-add-shift (strongly universal for uniform ``(a, b)``), with
# ``(a, b) = word(seed, 0, LH_A|LH_B)`` and a multiply-shift range reduction to ``[0, g)``:
#     H_seed(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32.
LH_A = np.uint64(0x1A)
LH_B = np.uint64(0x1B)
SIP_K1 = np.uint64(0x4C4F4C4F48415348)  # SipHash key word 1: domain separator ("LOLOHASH")
LH_DEVICE_MSG = np.uint64(0x4445564943454853)  # SipHash message of a device's fixed hash seed
_U32 = np.uint64(32)


@nb.njit(inline="always", cache=True)
def _sip_round(v0, v1, v2, v3):
    v0 += v1
    v1 = (v1 << np.uint64(13)) | (v1 >> np.uint64(51))
    v1 ^= v0
    v0 = (v0 << np.uint64(32)) | (v0 >> np.uint64(32))
    v2 += v3
    v3 = (v3 << np.uint64(16)) | (v3 >> np.uint64(48))
    v3 ^= v2
    v0 += v3
    v3 = (v3 << np.uint64(21)) | (v3 >> np.uint64(43))
    v3 ^= v0
    v2 += v1
    v1 = (v1 << np.uint64(17)) | (v1 >> np.uint64(47))
    v1 ^= v2
    v2 = (v2 << np.uint64(32)) | (v2 >> np.uint64(32))
    return v0, v1, v2, v3


@nb.njit(inline="always", cache=True)
def siphash24(k0: np.uint64, k1: np.uint64, m: np.uint64) -> np.uint64:
    """SipHash-2-4 of the 8-byte little-endian message ``m`` under the key ``(k0, k1)``."""
    v0 = k0 ^ np.uint64(0x736F6D6570736575)
    v1 = k1 ^ np.uint64(0x646F72616E646F6D)
    v2 = k0 ^ np.uint64(0x6C7967656E657261)
    v3 = k1 ^ np.uint64(0x7465646279746573)
    last = np.uint64(8) << np.uint64(56)
    v3 ^= m
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0 ^= m
    v3 ^= last
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= np.uint64(0xFF)
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    v0, v1, v2, v3 = _sip_round(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@nb.njit(inline="always", cache=True)
def lh_coeffs(hseed) -> tuple[np.uint64, np.uint64]:
    """Multiply-add-shift coefficients ``(a, b)`` of the hash function with seed ``hseed``."""
    h = np.uint64(hseed)
    return word(h, np.uint64(0), LH_A), word(h, np.uint64(0), LH_B)


@nb.njit(inline="always", cache=True)
def lh_hash(a: np.uint64, b: np.uint64, v, g: np.uint64) -> np.uint64:
    """``H(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32`` in ``[0, g)``."""
    return (((a * np.uint64(v) + b) >> _U32) * g) >> _U32


@nb.njit(**_PAR)
def lh_encode(values, keys, memo, seed, g):
    """Hash seeds ``uint32 (n,)`` and hashed values ``x = H_seed(v)`` ``int64 (n,)``.

    With ``memo`` the seed is the device's fixed one, ``SipHash(key, DEVICE)`` (seed 001 Alg. 1
    line 1: one hash function per device, forever); otherwise a fresh one per report,
    ``SipHash(seed, row)``.
    """
    n = values.shape[0]
    gg = np.uint64(g)
    hseeds = np.empty(n, dtype=np.uint32)
    x = np.empty(n, dtype=np.int64)
    for i in nb.prange(n):
        if memo:
            s = siphash24(keys[i], SIP_K1, LH_DEVICE_MSG)
        else:
            s = siphash24(seed, SIP_K1, np.uint64(i))
        hs = s & np.uint64(0xFFFFFFFF)
        hseeds[i] = np.uint32(hs)
        a, b = lh_coeffs(hs)
        x[i] = np.int64(lh_hash(a, b, values[i], gg))
    return hseeds, x


@nb.njit(**_PAR)
def lh_hash_rows(hseeds, values, g):
    """``H_{hseeds[i]}(values[i])`` for every row, ``int64 (n,)``."""
    n = hseeds.shape[0]
    gg = np.uint64(g)
    out = np.empty(n, dtype=np.int64)
    for i in nb.prange(n):
        a, b = lh_coeffs(hseeds[i])
        out[i] = np.int64(lh_hash(a, b, values[i], gg))
    return out


@nb.njit(**_PAR)
def lh_support(hseeds, ys, k, g):
    """``C(v) = #{i : H_{hseeds[i]}(v) == ys[i]}`` for every ``v < k`` (O(n k), the hot loop).

    ``a v + b`` is walked incrementally over ``v`` so the inner loop is add / shift / 32x32
    multiply / compare, which LLVM vectorizes; per-chunk ``int32`` rows cannot overflow
    (a chunk holds at most ``2^14`` reports).
    """
    n = hseeds.shape[0]
    gg = np.uint64(g)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    partial = np.zeros((nchunks, k), dtype=np.int32)
    for c in nb.prange(nchunks):
        row = partial[c]
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            a, b = lh_coeffs(hseeds[i])
            y = np.uint64(ys[i])
            acc = b
            for v in range(k):
                row[v] += np.int32((((acc >> _U32) * gg) >> _U32) == y)
                acc += a
    return partial.astype(np.int64).sum(axis=0)


__all__ += ["siphash24", "lh_encode", "lh_hash_rows", "lh_support"]


# ------------------------------------------------------------------ dBitFlipPM (seed 001 §2.4.4)
BITFLIP_J = np.uint64(0xFFFFFFFFFFFFFFFF)  # address of the sampled-bucket draws (never a memo case)


@nb.njit(**_PAR)
def bitflip_randomize(values, keys, seen, out, k, b, p, q, floyd):
    """dBitFlipPM reports into ``out`` ``(n, d)``: pair codes ``2 j_l + x_l``, ``j_l`` increasing.

    ``J = {j_1 < ... < j_d}`` is drawn from ``unit(key, BITFLIP_J, t)``: Floyd's algorithm
    (``t = b-d .. b-1``) if ``floyd`` else selection sampling (``t = 0 .. b-1``). The case
    ``c`` of bucket ``x = floor(v b / k)`` is ``l`` if ``x = j_l`` else ``d``; bit ``l`` is
    ``unit(key, c, l) < (p if l == c else q)``: memoized per case, so a device holds at most
    ``d + 1`` distinct responses. ``seen`` marks the bucket.
    """
    n, d = out.shape
    for i in nb.prange(n):
        x = (np.int64(values[i]) * b) // k
        _mark(seen, i, x)
        key = keys[i]
        row = out[i]
        if floyd:
            cnt = 0
            for t in range(b - d, b):
                r = np.int64(unit(key, BITFLIP_J, np.uint64(t)) * (t + 1))
                val = r
                for s in range(cnt):
                    if np.int64(row[s]) == r:
                        val = np.int64(t)
                        break
                pos = cnt
                while pos > 0 and np.int64(row[pos - 1]) > val:
                    row[pos] = row[pos - 1]
                    pos -= 1
                row[pos] = val
                cnt += 1
        else:
            sel = 0
            for t in range(b):
                need = d - sel
                if need == 0:
                    break
                rem = b - t
                if need == rem or unit(key, BITFLIP_J, np.uint64(t)) * rem < need:
                    row[sel] = t
                    sel += 1
        c = d
        for l in range(d):
            if np.int64(row[l]) == x:
                c = l
                break
        for l in range(d):
            bit = unit(key, np.uint64(c), np.uint64(l)) < (p if l == c else q)
            row[l] = np.int64(row[l]) * 2 + (1 if bit else 0)
    return out


@nb.njit(**_PAR)
def bitflip_support(reports, b):
    """Ones per bucket of pair codes ``(n, d)``, plus the numbers of pairs whose bucket is
    ``>= b`` and of pairs not strictly after the previous bucket of their report."""
    n, d = reports.shape
    nchunks = (n + _CHUNK - 1) // _CHUNK
    partial = np.zeros((nchunks, b), dtype=np.int64)
    bad = np.zeros((nchunks, 2), dtype=np.int64)
    for c in nb.prange(nchunks):
        row = partial[c]
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            prev = np.int64(-1)
            for l in range(d):
                code = np.int64(reports[i, l])
                j = code >> 1
                if j >= b:
                    bad[c, 0] += 1
                else:
                    row[j] += code & 1
                if j <= prev:
                    bad[c, 1] += 1
                prev = j
    return partial.sum(axis=0), bad[:, 0].sum(), bad[:, 1].sum()


__all__ += ["bitflip_randomize", "bitflip_support"]


# ------------------------------------------------------------------ subset selection (SS, seed 003 §3.1.5)
@nb.njit(**_PAR)
def ss_randomize(values, seed, ps, omega, k):
    """ω-SM (seed 003 Alg. 2) as a packed little-endian bit set ``uint8 (n, ceil(k/8))``.

    The true value is kept w.p. ``ps`` (``unit(seed, i, 0)``); then ``m = ω - 1`` (kept) or
    ``ω`` (not kept) distinct others are drawn uniformly from ``[0, k) \\ {x}`` by Floyd's
    algorithm over population indices ``p in [0, k-1)`` (value ``p + (p >= x)``), step ``s``
    using ``unit(seed, i, 1 + s)``; the row itself is the membership set.
    """
    n = values.shape[0]
    out = np.zeros((n, (k + 7) // 8), dtype=np.uint8)
    pop = k - 1
    for i in nb.prange(n):
        x = np.int64(values[i])
        a = np.uint64(i)
        m = omega
        if unit(seed, a, np.uint64(0)) < ps:
            out[i, x >> 3] |= np.uint8(1 << (x & 7))
            m = omega - 1
        for s in range(m):
            j = np.int64(pop - m + s)
            t = np.int64(unit(seed, a, np.uint64(1 + s)) * (j + 1))
            vt = t + 1 if t >= x else t
            if (out[i, vt >> 3] >> (vt & 7)) & 1:
                vt = j + 1 if j >= x else j
            out[i, vt >> 3] |= np.uint8(1 << (vt & 7))
    return out


@nb.njit(**_PAR)
def packed_to_indices(bits, out):
    """Increasing positions of the set bits of each packed row, written into ``out (n, ω)``.

    Rows must have exactly ``ω = out.shape[1]`` bits set (as :func:`ss_randomize` makes them).
    """
    n, nbytes = bits.shape
    for i in nb.prange(n):
        c = 0
        for b in range(nbytes):
            byte = bits[i, b]
            if byte:
                for t in range(8):
                    if (byte >> t) & 1:
                        out[i, c] = b * 8 + t
                        c += 1
    return out


# ------------------------------------------------------------------ histogram encoding (SHE)
_HALF_ULP53 = 2.0 ** -54  # centres the 2^-53 grid of ``unit`` so that u - 1/2 is symmetric


@nb.njit(**_PAR)
def she_randomize(values, seed, beta, shift, bound, k):
    """SHE device: fixed-point one-hot plus Laplace noise, ``int32 (n, k)``.

    Coordinate j of row i: ``t = unit(seed, i, j) - 1/2 + 2^-54`` (a symmetric grid in
    (-1/2, 1/2)), Laplace by inverse CDF ``L = -beta sign(t) ln(1 - 2|t|)`` (scale ``beta``
    in fixed-point units), rounded half away from zero, plus ``shift`` on the value's
    coordinate, clipped to ``[-bound, bound]``. ``beta``, ``shift``, ``bound`` are floats
    holding integers.
    """
    n = values.shape[0]
    out = np.empty((n, k), dtype=np.int32)
    for i in nb.prange(n):
        x = np.int64(values[i])
        a = np.uint64(i)
        for j in range(k):
            t = unit(seed, a, np.uint64(j)) - 0.5 + _HALF_ULP53
            d = np.floor(-beta * np.log(1.0 - 2.0 * abs(t)) + 0.5)
            if t < 0.0:
                d = -d
            if j == x:
                d += shift
            out[i, j] = np.int32(min(max(d, -bound), bound))
    return out


@nb.njit(**_PAR)
def int_column_sums(reports, bound):
    """Column sums (int64) of an integer matrix and the number of entries outside ``[-bound, bound]``."""
    n, k = reports.shape
    nchunks = (n + _CHUNK - 1) // _CHUNK
    partial = np.zeros((nchunks, k), dtype=np.int64)
    bad = np.zeros(nchunks, dtype=np.int64)
    for c in nb.prange(nchunks):
        row = partial[c]
        nbad = 0
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            for j in range(k):
                v = np.int64(reports[i, j])
                row[j] += v
                if v > bound or v < -bound:
                    nbad += 1
        bad[c] = nbad
    return partial.sum(axis=0), bad.sum()


__all__ += ["ss_randomize", "packed_to_indices", "she_randomize", "int_column_sums"]
