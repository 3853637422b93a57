"""Numba kernels: the hot loops of every randomizer and support counter.

Each kernel has a plain-numpy twin in :mod:`estimators.reference` computing the same function
from the same ChaCha20 streams (:mod:`estimators.randomness`); the tests check that they agree
exactly. Randomizers take ``keys`` (per-device 256-bit memo keys, ``uint32 (n, 8)``), ``memo``
and ``nkey`` (the batch's 256-bit noise key): with ``memo`` the first round (PRR) draws from the
stream ``(keys[i], PRR, memoized input)`` and so is permanent; fresh draws come from the
batch's noise stream, row ``i`` owning a fixed slot of it (see :func:`randomness.fill_run`).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .randomness import (EXPAND, KEY_WORDS, LH_SEED, LO32, NOISE, NOISE_EXT, PRR, bernoulli_refine, bernoulli_top,
                         fill_run, fill_words, other_than, unit)

_PAR = dict(parallel=True, cache=True, nogil=True)
_CHUNK = 1 << 12
_UE_CHUNK = 1 << 10
UE_REFINE_SLOTS = 2  # refinement draws held in a UE row's noise slot / PRR prefix (more: extension)

# Arguments of the chain kernels for the rounds a call does not run:
NO_KEYS = np.zeros((0, KEY_WORDS), dtype=np.uint32)  # memo keys of a single-shot call (``memo=False``)
NO_SEEN = np.zeros((0, 0), dtype=np.uint8)           # its memo bitset (never marked)
UE_NO_IRR = (np.uint64(1 << 32), np.uint64(0))       # ``(t2p, t2q)`` of ue_chain_randomize: keep round-1 bits


@nb.njit(inline="always", cache=True)
def _mark(seen: np.ndarray, i: int, x: int) -> None:
    seen[i, x >> 3] |= np.uint8(1 << (x & 7))


@nb.njit(inline="always", cache=True)
def _noise_slots(nkey, w, r0, r1):
    """The noise slots of rows ``r0 .. r1-1`` (``w`` words each), flat."""
    buf = np.empty((r1 - r0) * w, dtype=np.uint64)
    fill_run(nkey, NOISE, 0, r0 * w, buf)
    return buf


# ------------------------------------------------------------------ direct encoding (GRR chain)
@nb.njit(**_PAR)
def grr_chain_randomize(values, keys, memo, seen, nkey, p1, p2, m):
    """Two GRR rounds over ``[0, m)``: PRR with ``p1`` (memoized if ``memo``), IRR with ``p2``.

    Draws: the first round uses words 0 (keep?) and 1 (which other value) of the PRR stream
    ``(keys[i], PRR, x)`` if ``memo``, else of row ``i``'s noise slot; the IRR (``p2 < 1``;
    ``p2 = 1`` disables it) uses the next two words of the noise slot.
    """
    n = values.shape[0]
    out = np.empty(n, dtype=np.int64)
    irr = p2 < 1.0
    first = 0 if memo else 2
    w = first + (2 if irr else 0)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, w, r0, r1)
        prr = np.empty((r1 - r0 if memo else 0, 8), dtype=np.uint64)
        if memo:
            fill_words(keys, True, PRR, values, r0, r1, prr)
        for i in range(r0, r1):
            x = np.int64(values[i])
            o = (i - r0) * w
            if memo:
                _mark(seen, i, x)
                w0, w1 = prr[i - r0, 0], prr[i - r0, 1]
            else:
                w0, w1 = noise[o], noise[o + 1]
            if unit(w0) >= p1:
                x = other_than(x, m, unit(w1))
            if irr and unit(noise[o + first]) >= p2:
                x = other_than(x, m, unit(noise[o + first + 1]))
            out[i] = x
    return out


# ------------------------------------------------------------------ unary encoding (UE chain)
@nb.njit(inline="always", cache=True)
def _split(t):
    hi, rest = t >> np.uint64(24), t & np.uint64(0xFFFFFF)
    if hi > 255:
        hi, rest = np.uint64(255), t - np.uint64(255 << 24)
    return hi, rest


@nb.njit(**_PAR)
def ue_chain_randomize(values, keys, memo, seen, nkey, t1p, t1q, t2p, t2q, k):
    """Two UE rounds over ``k`` bits, packed little-endian into ``uint8 (n, ceil(k/8))``.

    Thresholds are 32-bit (:func:`randomness.threshold32`). PRR bit j is 1 w.p. ``t1p`` if j is
    the value's bit else ``t1q``; IRR bit j is 1 w.p. ``t2p`` if the PRR bit is 1 else ``t2q``;
    ``t2p = 2^32, t2q = 0`` disables the second round (single-shot SUE / OUE / THE). Each round's
    byte ``b`` is 8 exact lazy Bernoulli bits from one word (:func:`randomness.bernoulli_top`).

    Draws: the PRR from the stream ``(keys[i], PRR, x)`` if ``memo`` (words ``0 .. B-1`` the
    bytes, ``B`` the hot bit, then refinements), else from row ``i``'s noise slot (same layout);
    the IRR from the noise slot's next ``B`` words. Refinements of noise rounds take the slot's
    last :data:`UE_REFINE_SLOTS` words, then the row's extension stream.
    """
    n = values.shape[0]
    nbytes = (k + 7) // 8
    out = np.zeros((n, nbytes), dtype=np.uint8)
    irr = not (t2p == np.uint64(1 << 32) and t2q == np.uint64(0))
    q1_hi, q1_rest = _split(t1q)
    p2_hi, p2_rest = _split(t2p)
    q2_hi, q2_rest = _split(t2q)
    ones = np.uint64(0x0101010101010101)
    q1_lanes, p2_lanes, q2_lanes = q1_hi * ones, p2_hi * ones, q2_hi * ones
    last = np.uint64((1 << (k & 7)) - 1) if k & 7 else np.uint64(0xFF)
    first = 0 if memo else nbytes + 1
    refine0 = first + (nbytes if irr else 0)
    w = refine0 + UE_REFINE_SLOTS
    pw = ((nbytes + 1 + UE_REFINE_SLOTS + 7) // 8) * 8 if memo else 0  # whole blocks
    nchunks = (n + _UE_CHUNK - 1) // _UE_CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _UE_CHUNK, min(n, (c + 1) * _UE_CHUNK)
        noise = _noise_slots(nkey, w, r0, r1)
        prr = np.empty((r1 - r0, pw), dtype=np.uint64)
        if memo:
            fill_words(keys, True, PRR, values, r0, r1, prr)
        bits = np.empty(nbytes, dtype=np.uint64)
        hi = np.empty(nbytes, dtype=np.uint64)
        sel = np.zeros(nbytes, dtype=np.uint64)
        eq = np.empty(nbytes, dtype=np.uint64)
        pcache = np.zeros(9, dtype=np.uint64)
        ncache = np.zeros(9, dtype=np.uint64)
        for i in range(r0, r1):
            x = np.int64(values[i])
            slot = noise[(i - r0) * w:(i - r0 + 1) * w]
            ncache[8] = 0
            for b in range(nbytes):
                hi[b] = q1_lanes
                sel[b] = 0
            jn = refine0
            if memo:
                _mark(seen, i, x)
                pre = prr[i - r0]
                pcache[8] = 0
                if bernoulli_top(pre, 0, hi, bits, eq):
                    bernoulli_refine(bits, eq, sel, q1_rest, q1_rest, keys[i], PRR, x, pre, nbytes + 1, pcache, 0)
                hot = pre[nbytes]
            else:
                if bernoulli_top(slot, 0, hi, bits, eq):
                    jn = bernoulli_refine(bits, eq, sel, q1_rest, q1_rest, nkey, NOISE_EXT, i, slot, jn, ncache, w)
                hot = slot[nbytes]
            mb = np.uint64(1) << np.uint64(x & 7)
            if (hot & LO32) < t1p:
                bits[x >> 3] |= mb
            else:
                bits[x >> 3] &= ~mb
            if irr:
                for b in range(nbytes):
                    e = EXPAND[bits[b]]
                    hi[b] = (e & p2_lanes) | (~e & q2_lanes)
                    sel[b] = bits[b]
                if bernoulli_top(slot, first, hi, bits, eq):
                    jn = bernoulli_refine(bits, eq, sel, p2_rest, q2_rest, nkey, NOISE_EXT, i, slot, jn, ncache, w)
            bits[nbytes - 1] &= last
            for b in range(nbytes):
                out[i, b] = np.uint8(bits[b])
    return out


@nb.njit(**_PAR)
def packed_bit_counts(bits, k):
    """Column sums of a little-endian packed bit matrix ``uint8 (n, ceil(k/8))``.

    Per block of rows, a histogram of the byte values of each byte column (one increment per byte, no
    bit loop: 10x faster than counting bits for unary reports), then the bit counts of each byte value.
    ``int32`` histograms (half the cache traffic of int64) with at most 2**30 rows per block; at most 32
    blocks (enough for the threads to share) and at most ~4 MiB of histograms (``blocks x nbytes x 1 KiB``)."""
    n, nbytes = bits.shape
    nblocks = max(1, min((n + _CHUNK - 1) // _CHUNK, 32, 4096 // max(nbytes, 1)), (n + (1 << 30) - 1) >> 30)
    step = (n + nblocks - 1) // nblocks
    hist = np.zeros((nblocks, nbytes, 256), dtype=np.int32)
    for c in nb.prange(nblocks):
        h = hist[c]
        for i in range(c * step, min(n, (c + 1) * step)):
            for b in range(nbytes):
                h[b, bits[i, b]] += 1
    total = np.zeros((nbytes, 256), dtype=np.int64)
    for c in range(nblocks):
        total += hist[c]
    out = np.zeros(nbytes * 8, dtype=np.int64)
    for b in range(nbytes):
        for v in range(1, 256):
            cnt = total[b, v]
            if cnt:
                for t in range(8):
                    if (v >> t) & 1:
                        out[b * 8 + t] += cnt
    return out[:k]


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


__all__ = ["grr_chain_randomize", "ue_chain_randomize", "packed_bit_counts", "bincount"]


# ------------------------------------------------------------------ Hadamard response (HR, FHR)
# H[r, c] = (-1)^popcount(r & c) (Sylvester order, the recursion of Zhao et al., arXiv 2022, Eq. 6);
# value v is row/column v + 1.
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


HR_SLOT = 2   # noise words per HR row: 0 the row j, 1 keep?
FHR_SLOT = 3  # noise words per FHR row: 0 the +1 column x, 1 the -1 column y, 2 keep?


@nb.njit(**_PAR)
def hr_randomize(values, nkey, p, K):
    """HR: row ``j`` uniform in [0, K), bit = [H[j, v+1] = +1] kept w.p. ``p``; report ``2 j + bit``.

    Draws: row ``i``'s noise slot (:data:`HR_SLOT` words) of the batch key ``nkey``."""
    n = values.shape[0]
    out = np.empty(n, dtype=np.int64)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, HR_SLOT, r0, r1)
        for i in range(r0, r1):
            o = (i - r0) * HR_SLOT
            j = np.int64(unit(noise[o]) * K)
            bit = 1 - _parity(j & (np.int64(values[i]) + 1))
            if unit(noise[o + 1]) >= p:
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
def fhr_randomize(values, nkey, p, K):
    """FHR (Zhao et al., arXiv 2022, Alg. 1): ``x`` uniform among the +1 columns of row v+1, ``y`` among the -1
    columns; kept (``b = +e_x - e_y``) w.p. ``p`` else flipped. Report ``(P, M)`` = positions of
    the +1 and the -1 of ``b``. A uniform column is moved into the wanted coset of the row by
    xor-ing the row's lowest set bit (a bijection between the two halves).

    Draws: row ``i``'s noise slot (:data:`FHR_SLOT` words) of the batch key ``nkey``."""
    n = values.shape[0]
    out = np.empty((n, 2), dtype=np.int64)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, FHR_SLOT, r0, r1)
        for i in range(r0, r1):
            o = (i - r0) * FHR_SLOT
            w = np.int64(values[i]) + 1
            low = w & -w
            x = np.int64(unit(noise[o]) * K)
            if _parity(w & x) == 1:
                x ^= low
            y = np.int64(unit(noise[o + 1]) * K)
            if _parity(w & y) == 0:
                y ^= low
            if unit(noise[o + 2]) < p:
                out[i, 0] = x
                out[i, 1] = y
            else:
                out[i, 0] = y
                out[i, 1] = x
    return out


def fhr_support(reports, K, k):
    """FHR support ``C(t) = (z . H(t)) / 2`` with ``z = sum_i b_i`` (Zhao et al., arXiv 2022, Eq. 7),
    via FWHT.

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
# A report carries its 32-bit hash seed (Bassily & Smith, STOC 2015; Wang et al., USENIX Security
# 2017). The seed is public by design, so it comes from a stream of its own: for LOLOHA the
# device's fixed seed is word 0 of ``(keys[i], LH_SEED, 0)`` (Arcolezi et al., EDBT 2023, Alg. 1
# line 1: one hash function per device, forever, which links the device's reports, as in the
# paper, and nothing else), for BLH/OLH a fresh one per report is word ``i`` of the batch
# stream ``(nkey, LH_SEED, 1)``. The hash family itself is public: Dietzfelbinger's
# multiply-add-shift (strongly universal for uniform ``(a, b)``) with ``(a, b)`` spread from the
# seed by SplitMix64's finalizer (Steele, Lea & Flood, OOPSLA 2014) and a multiply-shift range
# reduction to ``[0, g)``:
#     H_seed(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32.
# No secret enters the hash function; the GRR rounds that follow draw from other streams.
LH_A = np.uint64(0x1A)
LH_B = np.uint64(0x1B)
_U32 = np.uint64(32)


@nb.njit(inline="always", cache=True)
def mix64(z: np.uint64) -> np.uint64:
    """SplitMix64 finalizer: a public bijective mix (spreads a public hash seed, nothing secret)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always", cache=True)
def lh_coeffs(hseed) -> tuple[np.uint64, np.uint64]:
    """Multiply-add-shift coefficients ``(a, b)`` of the hash function with seed ``hseed``."""
    h = mix64(np.uint64(hseed) * np.uint64(0x9E3779B97F4A7C15))
    return mix64(h ^ LH_A), mix64(h ^ LH_B)


@nb.njit(inline="always", cache=True)
def lh_hash(a: np.uint64, b: np.uint64, v, g: np.uint64) -> np.uint64:
    """``H(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32`` in ``[0, g)``."""
    return (((a * np.uint64(v) + b) >> _U32) * g) >> _U32


@nb.njit(**_PAR)
def lh_encode(values, keys, memo, nkey, g):
    """Hash seeds ``uint32 (n,)`` and hashed values ``x = H_seed(v)`` ``int64 (n,)``.

    With ``memo`` the seed is the device's fixed one (word 0 of ``(keys[i], LH_SEED, 0)``),
    otherwise a fresh one per report (word ``i`` of ``(nkey, LH_SEED, 1)``).
    """
    n = values.shape[0]
    gg = np.uint64(g)
    hseeds = np.empty(n, dtype=np.uint32)
    x = np.empty(n, dtype=np.int64)
    zeros = np.zeros(n if memo else 0, dtype=np.uint64)  # a = 0: the seed stream of every device
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        if memo:
            pre = np.empty((r1 - r0, 8), dtype=np.uint64)
            fill_words(keys, True, LH_SEED, zeros, r0, r1, pre)
            seeds = pre[:, 0].copy()
        else:
            seeds = np.empty(r1 - r0, dtype=np.uint64)
            fill_run(nkey, LH_SEED, 1, r0, seeds)
        for i in range(r0, r1):
            hs = seeds[i - r0] & LO32
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


__all__ += ["lh_encode", "lh_hash_rows", "lh_support"]


# ------------------------------------------------------------------ dBitFlipPM
# Ding, Kulkarni & Yekhanin, NeurIPS 2017, as described in Arcolezi et al., EDBT 2023, §2.4.4.
from .randomness import BITFLIP_BIT, BITFLIP_J, NO_WORDS, stream_word  # noqa: E402


@nb.njit(cache=True, nogil=True)
def _memo_block(key, domain, a, j, cache) -> None:
    """Load the block holding word ``j`` of the stream ``(key, domain, a)`` into ``cache``
    (:func:`stream_word`); called rather than inlined, so one compiled ChaCha20 block serves
    every call site (compile time)."""
    stream_word(key, domain, a, NO_WORDS, j, cache)


@nb.njit(inline="always", cache=True)
def _memo_word(key, domain, a, prefix, j, cache):
    """:func:`stream_word` with ``skip = 0``: word ``j`` of the memoized stream ``(key, domain, a)``
    whose first ``len(prefix)`` words are ``prefix``; beyond it, one call per block."""
    if j < prefix.shape[0]:
        return prefix[j]
    if cache[8] != np.uint64((j >> 3) + 1):
        _memo_block(key, domain, a, j, cache)
    return cache[j & 7]


_BITFLIP_PREFIX = 64      # stream words per row computed in SIMD passes (Floyd's J, the bits)
_BITFLIP_SEL_PREFIX = 16  # ... for selection sampling's J (up to b draws; the rest on demand)


@nb.njit(**_PAR)
def bitflip_randomize(values, keys, seen, out, k, b, p, q, floyd):
    """dBitFlipPM reports into ``out`` ``(n, d)``: pair codes ``2 j_l + x_l``, ``j_l`` increasing.

    ``J = {j_1 < ... < j_d}`` is drawn from the device's stream ``(keys[i], BITFLIP_J, 0)``:
    Floyd's algorithm (step ``s = 0 .. d-1`` inserts from ``[0, b-d+s]`` with word ``s``) if
    ``floyd`` else selection sampling (step ``t = 0 .. b-1`` decides bucket ``t`` with word
    ``t``). The case ``c`` of bucket ``x = floor(v b / k)`` is ``l`` if ``x = j_l`` else ``d``;
    bit ``l`` is ``unit(word l of (keys[i], BITFLIP_BIT, c)) < (p if l == c else q)``. Both are
    pure functions of the key: a device's J is fixed forever and its bits are memoized per case,
    so it holds at most ``d + 1`` distinct responses. ``seen`` marks the bucket.
    """
    n, d = out.shape
    wj = 8 * ((min(d, _BITFLIP_PREFIX) + 7) // 8) if floyd else 8 * ((min(b, _BITFLIP_SEL_PREFIX) + 7) // 8)
    wb = 8 * ((min(d, _BITFLIP_PREFIX) + 7) // 8)
    zeros = np.zeros(n, dtype=np.uint64)
    cases = np.empty(n, dtype=np.uint64)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        cache = np.zeros(9, dtype=np.uint64)
        jw = np.empty((r1 - r0, wj), dtype=np.uint64)
        fill_words(keys, True, BITFLIP_J, zeros, r0, r1, jw)
        for i in range(r0, r1):
            x = (np.int64(values[i]) * b) // k
            _mark(seen, i, x)
            key = keys[i]
            pre = jw[i - r0]
            cache[8] = 0
            row = out[i]
            if floyd:
                cnt = 0
                for s in range(d):
                    t = b - d + s
                    r = np.int64(unit(_memo_word(key, BITFLIP_J, np.uint64(0), pre, s, cache)) * (t + 1))
                    val = r
                    for e in range(cnt):
                        if np.int64(row[e]) == r:
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
                    if need == rem or unit(_memo_word(key, BITFLIP_J, np.uint64(0), pre, t, cache)) * rem < need:
                        row[sel] = t
                        sel += 1
            case = d
            for l in range(d):
                if np.int64(row[l]) == x:
                    case = l
                    break
            cases[i] = np.uint64(case)
        bw = np.empty((r1 - r0, wb), dtype=np.uint64)
        fill_words(keys, True, BITFLIP_BIT, cases, r0, r1, bw)
        for i in range(r0, r1):
            key = keys[i]
            pre = bw[i - r0]
            cache[8] = 0
            a = cases[i]
            case = np.int64(a)
            row = out[i]
            for l in range(d):
                bit = unit(_memo_word(key, BITFLIP_BIT, a, pre, l, cache)) < (p if l == case else q)
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


# ------------------------------------------------------------------ subset selection (SS)
# ω-SM as described in Wang et al., Sensors 2020, §3.1.5.
_SS_SLOT_WORDS = 1 << 16  # noise words per SS chunk (at most; at least one row)


@nb.njit(**_PAR)
def ss_randomize(values, nkey, ps, omega, k):
    """ω-SM (Wang et al., Sensors 2020, Alg. 2) as a packed little-endian bit set ``uint8 (n, ceil(k/8))``.

    Row ``i`` draws from its noise slot of ``W = 1 + ω`` words of the batch key ``nkey``. The
    true value is kept w.p. ``ps`` (word 0); then ``m = ω - 1`` (kept) or ``ω`` (not kept)
    distinct others are drawn uniformly from ``[0, k) \\ {x}`` by Floyd's algorithm over
    population indices ``p in [0, k-1)`` (value ``p + (p >= x)``), step ``s`` using word
    ``1 + s``; the row itself is the membership set.
    """
    n = values.shape[0]
    out = np.zeros((n, (k + 7) // 8), dtype=np.uint8)
    pop = k - 1
    w = 1 + omega
    rows = max(1, min(_CHUNK, _SS_SLOT_WORDS // w))  # bounds a chunk's noise buffer
    nchunks = (n + rows - 1) // rows
    for c in nb.prange(nchunks):
        r0, r1 = c * rows, min(n, (c + 1) * rows)
        noise = _noise_slots(nkey, w, r0, r1)
        for i in range(r0, r1):
            o = (i - r0) * w
            x = np.int64(values[i])
            m = omega
            if unit(noise[o]) < ps:
                out[i, x >> 3] |= np.uint8(1 << (x & 7))
                m = omega - 1
            for s in range(m):
                j = np.int64(pop - m + s)
                t = np.int64(unit(noise[o + 1 + s]) * (j + 1))
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
import math  # noqa: E402

from .randomness import NOISE_EXT as _SHE_EXT, stream_word as _she_word, words_for  # noqa: E402

SHE_T_BITS = 48  # SHE's noise parameter is the rational gamma = s / 2^SHE_T_BITS
SHE_DIGIT_BITS = 4  # lazy comparisons read uniform integers 4 bits at a time (t_bits: a multiple of 4)
_SHE_CHUNK_WORDS = 1 << 16  # noise words per SHE chunk (at most; at least one row)
# A row's bit reader is the state (j, cur, have): its next word is word j of its draws, ``cur``
# holds the ``have`` unread bits of the current word (low-aligned); the functions below take
# the state and return it updated, so that it stays in registers.


@nb.njit(cache=True)
def _she_refill(nkey, r, slot, cache, j, cur, have, m):
    """:func:`_she_bits` past the current word (out of line: it may compute a ChaCha20 block)."""
    w = _she_word(nkey, _SHE_EXT, r, slot, j, cache, slot.shape[0])
    need = m - have
    v = cur | ((w & ((np.uint64(1) << np.uint64(need)) - np.uint64(1))) << np.uint64(have))
    return np.int64(v), j + 1, w >> np.uint64(need), np.int64(64 - need)


@nb.njit(inline="always", cache=True)
def _she_bits(nkey, r, slot, cache, j, cur, have, m):
    """The next ``m`` (1..63) bits of row ``r``'s draws as an integer, and the new state.

    The row's draws are its 64-bit words in order (``slot``, then its :data:`NOISE_EXT`
    stream, see :func:`stream_word`), each read from its least significant bit up; the first
    bit read is the least significant of the result.
    """
    if have >= m:
        return (np.int64(cur & ((np.uint64(1) << np.uint64(m)) - np.uint64(1))), j, cur >> np.uint64(m),
                have - m)
    return _she_refill(nkey, r, slot, cache, j, cur, have, m)


@nb.njit(inline="always", cache=True)
def _she_bern_frac(g, t_bits, nkey, r, slot, cache, j, cur, have):
    """Bernoulli(g / 2^t_bits) for ``0 <= g <= 2^t_bits``, exactly: ``R < g`` for a uniform
    ``t_bits``-bit ``R`` read one :data:`SHE_DIGIT_BITS`-bit digit at a time from its most
    significant digit, stopping at the first digit that differs from ``g``'s (4.27 bits on
    average); a certain outcome (``g = 0`` or ``2^t_bits``) reads nothing."""
    if g <= 0 or g >= (np.int64(1) << t_bits):
        return g > 0, j, cur, have
    for i in range(t_bits - SHE_DIGIT_BITS, -1, -SHE_DIGIT_BITS):
        b, j, cur, have = _she_bits(nkey, r, slot, cache, j, cur, have, SHE_DIGIT_BITS)
        u = (g >> i) & ((1 << SHE_DIGIT_BITS) - 1)
        if b != u:
            return b < u, j, cur, have
    return False, j, cur, have


@nb.njit(inline="always", cache=True)
def _she_bern_inv(kk, nkey, r, slot, cache, j, cur, have):
    """Bernoulli(1 / kk) for ``kk >= 2``, exactly: a uniform integer in ``[0, kk)``, drawn by
    rejection on ``bit_length(kk - 1)`` bits, is 0."""
    nbits = np.int64(0)
    m = kk - 1
    while m > 0:
        nbits += 1
        m >>= 1
    while True:
        v, j, cur, have = _she_bits(nkey, r, slot, cache, j, cur, have, nbits)
        if v < kk:
            return v == 0, j, cur, have


@nb.njit(inline="always", cache=True)
def _she_bern_exp(g, t_bits, nkey, r, slot, cache, j, cur, have):
    """Bernoulli(exp(-g / 2^t_bits)) for ``0 <= g <= 2^t_bits`` (Canonne, Kamath & Steinke,
    NeurIPS 2020, Alg. 1): ``K = 1``; while Bernoulli(γ/K) (drawn as Bernoulli(1/K), then Bernoulli(γ)),
    ``K += 1``; the result is ``K`` odd."""
    kk = np.int64(1)
    while True:
        if kk > 1:
            a, j, cur, have = _she_bern_inv(kk, nkey, r, slot, cache, j, cur, have)
            if not a:
                break
        a, j, cur, have = _she_bern_frac(g, t_bits, nkey, r, slot, cache, j, cur, have)
        if not a:
            break
        kk += 1
    return (kk & 1) == 1, j, cur, have


@nb.njit(inline="always", cache=True)
def _she_discrete_laplace(s, t_bits, vcap, nkey, r, slot, cache, j, cur, have):
    """``Z`` with ``P(Z = z) ∝ exp(-|z| s / 2^t_bits)`` (Canonne, Kamath & Steinke, NeurIPS 2020,
    Alg. 2),
    except that ``V`` stops at ``vcap`` (then ``|Z| >= floor(2^t_bits vcap / s)``, beyond the
    caller's clip bound, which maps it to the same value as any larger ``|Z|``)."""
    t = np.int64(1) << t_bits
    while True:
        u, j, cur, have = _she_bits(nkey, r, slot, cache, j, cur, have, t_bits)
        d, j, cur, have = _she_bern_exp(u, t_bits, nkey, r, slot, cache, j, cur, have)
        if not d:
            continue
        v = np.int64(0)
        while v < vcap:
            a, j, cur, have = _she_bern_exp(t, t_bits, nkey, r, slot, cache, j, cur, have)
            if not a:
                break
            v += 1
        y = (u + t * v) // s
        b, j, cur, have = _she_bits(nkey, r, slot, cache, j, cur, have, 1)
        if b == 1 and y == 0:
            continue
        return (-y if b == 1 else y), j, cur, have


def she_slot_words(k: int, s: int, t_bits: int) -> int:
    """Noise-slot width (words) of an SHE row with ``k`` coordinates: at least the mean number
    of bits they read plus one standard deviation, rounded up to whole blocks; rows that read
    more go on in their extension stream (the slot width changes where the bits come from,
    never their law). A coordinate reads about ``t_bits + 11`` bits per attempt of
    CKS Alg. 2 (measured: 58.3 at ``t_bits = 48``) over ``2 / ((1 - e^-1)(1 + α))`` attempts
    on average (``α = e^{-s / 2^t_bits}``), with a standard deviation below its mean."""
    alpha = math.exp(-s / 2.0 ** t_bits)
    per = 2.0 * (t_bits + 11) / ((1.0 - math.exp(-1.0)) * (1.0 + alpha))
    return words_for(math.ceil(per * (k + math.sqrt(k)) / 64.0))


@nb.njit(**_PAR)
def she_randomize(values, nkey, s, t_bits, bound, slot, out):
    """SHE device: ``out[i, j] = clip(1{j = values[i]} + Z_ij, -bound, bound)`` (any signed
    integer dtype), ``Z_ij`` i.i.d. discrete Laplace, ``P(Z = z) ∝ exp(-γ|z|)``, ``γ = s / 2^t_bits``.

    Word consumption: row ``i`` reads a fixed slot of ``slot`` words of the batch noise stream
    ``(nkey, NOISE, 0)`` (words ``[i slot, (i+1) slot)``) and then its extension stream
    ``(nkey, NOISE_EXT, i)``, as one bit string (:func:`_she_bits`). Its coordinates
    ``j = 0 .. k-1`` take their bits in turn, each in the order of Canonne-Kamath-Steinke's
    Alg. 2: ``t_bits`` bits for ``U``; the Bernoulli trials of ``D`` and then of each ``A``
    (Alg. 1, each trial Bernoulli(1/K) by rejection on ``bit_length(K-1)`` bits, then
    Bernoulli(U/2^t_bits) by lazy comparison; trials with a certain outcome read nothing);
    then 1 bit for ``B``; a rejected attempt starts over with the next bits. ``V`` stops at
    ``vcap = ceil(s (bound + 1) / 2^t_bits)``, beyond which the clipped output no longer
    depends on it (and ``U + 2^t_bits V`` stays far inside int64).
    """
    n, k = out.shape
    t = np.int64(1) << t_bits
    vcap = (s * (bound + 1) + t - 1) >> t_bits
    rows = max(1, min(_CHUNK, _SHE_CHUNK_WORDS // slot))  # bounds a chunk's noise buffer
    nchunks = (n + rows - 1) // rows
    for c in nb.prange(nchunks):
        r0, r1 = c * rows, min(n, (c + 1) * rows)
        noise = _noise_slots(nkey, slot, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        for i in range(r0, r1):
            o = (i - r0) * slot
            row = noise[o:o + slot]
            cache[8] = 0
            j, cur, have = np.int64(0), np.uint64(0), np.int64(0)
            x = np.int64(values[i])
            for col in range(k):
                z, j, cur, have = _she_discrete_laplace(s, t_bits, vcap, nkey, i, row, cache, j, cur, have)
                if col == x:
                    z += 1
                out[i, col] = min(max(z, -bound), bound)
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
