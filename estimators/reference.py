"""Plain-numpy references of the numba kernels in :mod:`estimators.kernels`.

Same inputs, same ChaCha20 streams (:mod:`estimators.randomness`), same outputs: the tests compare them exactly.
They are slow and memory-hungry on purpose (clarity first); never call them on hot paths.
"""
from __future__ import annotations

import numpy as np

from .kernels import LH_A, LH_B, UE_REFINE_SLOTS
from .randomness import (LH_SEED, LO32, NOISE, NOISE_EXT, PRR, np_other_than, np_stream_words, np_unit,
                         split_threshold)


class Draws:
    """A row's draws: ``prefix[j]`` while ``j < len(prefix)``, else word ``j - skip`` of the stream
    ``(key, domain, a)`` (the twin of :func:`estimators.randomness.stream_word`)."""

    def __init__(self, key, domain, a, prefix, skip: int = 0) -> None:
        self.key, self.domain, self.a, self.prefix, self.skip = key, domain, int(a), prefix, skip
        self._ext = np.zeros(0, dtype=np.uint64)

    def __call__(self, j: int) -> np.uint64:
        if j < self.prefix.shape[0]:
            return self.prefix[j]
        jj = j - self.skip
        if jj >= self._ext.shape[0]:
            self._ext = np_stream_words(self.key, self.domain, [self.a], max(2 * jj + 8, 16))[0]
        return self._ext[jj]


def noise_slots(nkey, n: int, w: int) -> np.ndarray:
    """Row ``i``'s ``w``-word slot of the batch noise stream ``(nkey, NOISE, 0)``, ``(n, w)``."""
    if n * w == 0:
        return np.zeros((n, w), dtype=np.uint64)
    return np_stream_words(nkey, NOISE, [0], n * w)[0].reshape(n, w)


def _mark(seen, values):
    rows = np.arange(values.shape[0])
    np.bitwise_or.at(seen, (rows, values >> 3), (1 << (values & 7)).astype(np.uint8))


def grr_chain_randomize(values, keys, memo, seen, nkey, p1, p2, m):
    values = values.astype(np.int64)
    n = values.shape[0]
    irr = p2 < 1.0
    first = 0 if memo else 2
    noise = noise_slots(nkey, n, first + (2 if irr else 0))
    if memo:
        _mark(seen, values)
        pre = np_stream_words(keys, PRR, values, 2)
        w0, w1 = pre[:, 0], pre[:, 1]
    else:
        w0, w1 = noise[:, 0], noise[:, 1]
    x = values.copy()
    flip = np_unit(w0) >= p1
    x[flip] = np_other_than(x, m, np_unit(w1))[flip]
    if irr:
        flip2 = np_unit(noise[:, first]) >= p2
        x[flip2] = np_other_than(x, m, np_unit(noise[:, first + 1]))[flip2]
    return x


def _bernoulli_row(top, hi, rest, draw, j):
    """Exact lazy Bernoulli bits ``(nbytes, 8)`` from the top-byte words ``top``; ties settled in
    (byte, lane) order by successive draws ``j, j+1, ...``. Returns the bits and the next ``j``."""
    lanes = np.arange(8, dtype=np.uint64)
    byte = (np.asarray(top, dtype=np.uint64)[:, None] >> (np.uint64(8) * lanes)) & np.uint64(0xFF)
    bits = byte < hi
    for b, t in zip(*np.nonzero(byte == hi)):
        bits[b, t] = (draw(j) & np.uint64(0xFFFFFF)) < rest[b, t]
        j += 1
    return bits, j


def ue_chain_randomize(values, keys, memo, seen, nkey, t1p, t1q, t2p, t2q, k):
    values = values.astype(np.int64)
    n = values.shape[0]
    nbytes = (k + 7) // 8
    irr = not (t2p == 1 << 32 and t2q == 0)
    first = 0 if memo else nbytes + 1
    refine0 = first + (nbytes if irr else 0)
    w = refine0 + UE_REFINE_SLOTS
    noise = noise_slots(nkey, n, w)
    if memo:
        _mark(seen, values)
    q_hi, q_rest = split_threshold(t1q)
    (p2_hi, p2_rest), (q2_hi, q2_rest) = split_threshold(t2p), split_threshold(t2q)
    lanes = np.arange(8, dtype=np.uint64)
    out = np.zeros((n, nbytes), dtype=np.uint8)
    for i in range(n):
        x = int(values[i])
        slot = noise[i]
        noise_draws = Draws(nkey, NOISE_EXT, i, slot, skip=w)
        hi, rest = np.full((nbytes, 8), q_hi), np.full((nbytes, 8), q_rest)
        jn = refine0
        if memo:
            prefix = np_stream_words(keys[i], PRR, [x], nbytes + 1)[0]
            bits, _ = _bernoulli_row(prefix[:nbytes], hi, rest, Draws(keys[i], PRR, x, prefix), nbytes + 1)
            hot = prefix[nbytes]
        else:
            bits, jn = _bernoulli_row(slot[:nbytes], hi, rest, noise_draws, jn)
            hot = slot[nbytes]
        bits[x >> 3, x & 7] = (hot & LO32) < t1p
        if irr:
            hi, rest = np.where(bits, p2_hi, q2_hi), np.where(bits, p2_rest, q2_rest)
            bits, jn = _bernoulli_row(slot[first:first + nbytes], hi, rest, noise_draws, jn)
        flat = bits.reshape(-1)
        flat[k:] = False
        out[i] = (bits.astype(np.uint64) << lanes).sum(axis=1).astype(np.uint8)
    return out


def packed_bit_counts(bits, k):
    return np.unpackbits(bits, axis=1, bitorder="little")[:, :k].sum(axis=0, dtype=np.int64)


def bincount(values, m):
    return np.bincount(values, minlength=m).astype(np.int64)


# ------------------------------------------------------------------ Hadamard response (HR, FHR)
from .kernels import FHR_SLOT, HR_SLOT  # noqa: E402


def _h(r, c):
    """Hadamard entries ``(-1)^popcount(r & c)`` as int64 ±1 (broadcasting)."""
    return 1 - 2 * (np.bitwise_count(np.bitwise_and(r, c)).astype(np.int64) & 1)


def hr_randomize(values, nkey, p, K):
    u = np_unit(noise_slots(nkey, values.shape[0], HR_SLOT))
    j = (u[:, 0] * K).astype(np.int64)
    bit = (_h(j, values.astype(np.int64) + 1) + 1) // 2
    bit = np.where(u[:, 1] >= p, 1 - bit, bit)
    return (j << 1) | bit


def hr_support(reports, K, k):
    """Naive O(n k) twin: count, for every value, the reports whose bit matches its column."""
    r = reports.astype(np.int64)
    sign = 2 * (r & 1) - 1
    cols = np.arange(1, k + 1, dtype=np.int64)
    return (_h((r >> 1)[:, None], cols[None, :]) == sign[:, None]).sum(axis=0, dtype=np.int64)


def fhr_randomize(values, nkey, p, K):
    u = np_unit(noise_slots(nkey, values.shape[0], FHR_SLOT))
    w = values.astype(np.int64) + 1
    low = w & -w
    x = (u[:, 0] * K).astype(np.int64)
    x = np.where(_h(w, x) == -1, x ^ low, x)
    y = (u[:, 1] * K).astype(np.int64)
    y = np.where(_h(w, y) == 1, y ^ low, y)
    keep = u[:, 2] < p
    return np.stack([np.where(keep, x, y), np.where(keep, y, x)], axis=1)


def fhr_support(reports, K, k):
    """Naive O(n k) twin: ``sum_i (H[t+1, P_i] - H[t+1, M_i]) / 2`` for every value t."""
    r = reports.astype(np.int64)
    rows = np.arange(1, k + 1, dtype=np.int64)[None, :]
    return ((_h(r[:, :1], rows) - _h(r[:, 1:], rows)) // 2).sum(axis=0, dtype=np.int64)


# ------------------------------------------------------------------ local hashing (BLH, OLH, LOLOHA)
def np_mix64(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def lh_coeffs(hseeds):
    with np.errstate(over="ignore"):
        h = np_mix64(np.asarray(hseeds, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))
    return np_mix64(h ^ LH_A), np_mix64(h ^ LH_B)


def lh_hash(hseeds, values, g):
    """``H_seed(v)`` broadcast over ``hseeds`` and ``values`` (multiply-add-shift, see kernels)."""
    a, b = lh_coeffs(hseeds)
    with np.errstate(over="ignore"):
        return ((((a * np.asarray(values, dtype=np.uint64) + b) >> np.uint64(32)) * np.uint64(g))
                >> np.uint64(32)).astype(np.int64)


def lh_encode(values, keys, memo, nkey, g):
    n = values.shape[0]
    if memo:
        s = np_stream_words(keys, LH_SEED, np.zeros(n, dtype=np.uint64), 1)[:, 0]
    else:
        s = np_stream_words(nkey, LH_SEED, [1], n)[0] if n else np.zeros(0, dtype=np.uint64)
    hseeds = (s & LO32).astype(np.uint32)
    return hseeds, lh_hash(hseeds, values, g)


def lh_hash_rows(hseeds, values, g):
    return lh_hash(hseeds, values, g)


def lh_support(hseeds, ys, k, g):
    h = lh_hash(np.asarray(hseeds)[:, None], np.arange(k)[None, :], g)
    return (h == np.asarray(ys, dtype=np.int64)[:, None]).sum(axis=0, dtype=np.int64)


# ------------------------------------------------------------------ dBitFlipPM
from .randomness import BITFLIP_BIT, BITFLIP_J  # noqa: E402


def bitflip_randomize(values, keys, seen, out, k, b, p, q, floyd):
    """Whole streams per device: J from words ``0 .. d-1`` (Floyd) or ``0 .. b-1`` (selection
    sampling) of ``(keys[i], BITFLIP_J, 0)``, the bits from words ``0 .. d-1`` of
    ``(keys[i], BITFLIP_BIT, case)``."""
    n, d = out.shape
    x = values.astype(np.int64) * b // k
    _mark(seen, x)
    keys = np.asarray(keys, dtype=np.uint32).reshape(n, 8)
    zero = np.zeros(n, dtype=np.uint64)
    J = np.zeros((n, d), dtype=np.int64)
    if floyd:
        u = np_unit(np_stream_words(keys, BITFLIP_J, zero, d))
        for s in range(d):
            t = b - d + s
            r = (u[:, s] * (t + 1)).astype(np.int64)
            dup = (J[:, :s] == r[:, None]).any(axis=1)
            J[:, s] = np.where(dup, t, r)
        J.sort(axis=1)
    else:
        u = np_unit(np_stream_words(keys, BITFLIP_J, zero, b))
        sel = np.zeros(n, dtype=np.int64)
        rows = np.arange(n)
        for t in range(b):
            need = d - sel
            take = (need > 0) & ((need == b - t) | (u[:, t] * (b - t) < need))
            J[rows[take], sel[take]] = t
            sel += take
    hit = J == x[:, None]
    case = np.where(hit.any(axis=1), hit.argmax(axis=1), d)
    l = np.arange(d)
    u = np_unit(np_stream_words(keys, BITFLIP_BIT, case.astype(np.uint64), d))
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
def ss_randomize(values, nkey, ps, omega, k):
    """Floyd's algorithm run in lockstep over all rows (step ``s`` active while ``s < m``);
    row ``i``'s slot of ``1 + ω`` noise words: 0 keep?, ``1 + s`` Floyd step ``s``."""
    x = values.astype(np.int64)
    n = x.shape[0]
    u = np_unit(noise_slots(nkey, n, 1 + omega))
    rows = np.arange(n)
    member = np.zeros((n, k), dtype=bool)
    keep = u[:, 0] < ps
    member[rows[keep], x[keep]] = True
    m = np.where(keep, omega - 1, omega)
    for s in range(omega):
        act = s < m
        j = np.where(act, (k - 1) - m + s, 0)  # inactive rows: any in-range index, discarded
        t = (u[:, 1 + s] * (j + 1)).astype(np.int64)
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
from .kernels import SHE_DIGIT_BITS  # noqa: E402


class _SheBits:
    """Row ``r``'s draws as a bit string (the twin of ``kernels._she_bits``): its slot words,
    then its :data:`NOISE_EXT` stream, each word from its least significant bit up."""

    def __init__(self, nkey, r: int, slot: np.ndarray) -> None:
        self.word = Draws(nkey, NOISE_EXT, r, slot, skip=slot.shape[0])
        self.j, self.buf, self.have = 0, 0, 0

    def __call__(self, m: int) -> int:
        while self.have < m:
            self.buf |= int(self.word(self.j)) << self.have
            self.j += 1
            self.have += 64
        v = self.buf & ((1 << m) - 1)
        self.buf >>= m
        self.have -= m
        return v


def _she_bern_frac(g: int, t_bits: int, bits: _SheBits) -> bool:
    """Bernoulli(g / 2^t_bits): a uniform t_bits-bit integer, read digit by digit
    (``SHE_DIGIT_BITS`` bits) from its top, is < g."""
    if g <= 0 or g >= 1 << t_bits:
        return g > 0
    for i in reversed(range(0, t_bits, SHE_DIGIT_BITS)):
        b, u = bits(SHE_DIGIT_BITS), (g >> i) % (1 << SHE_DIGIT_BITS)
        if b != u:
            return b < u
    return False


def _she_bern_inv(kk: int, bits: _SheBits) -> bool:
    """Bernoulli(1 / kk), kk >= 2: a uniform integer in [0, kk) (rejection) is 0."""
    while True:
        v = bits((kk - 1).bit_length())
        if v < kk:
            return v == 0


def _she_bern_exp(g: int, t_bits: int, bits: _SheBits) -> bool:
    """Bernoulli(exp(-g / 2^t_bits)), Canonne, Kamath & Steinke, NeurIPS 2020, Alg. 1."""
    kk = 1
    while (kk == 1 or _she_bern_inv(kk, bits)) and _she_bern_frac(g, t_bits, bits):
        kk += 1
    return kk % 2 == 1


def _she_discrete_laplace(s: int, t_bits: int, vcap: int, bits: _SheBits) -> int:
    """Canonne, Kamath & Steinke, NeurIPS 2020, Alg. 2, with ``V`` stopped at ``vcap``."""
    t = 1 << t_bits
    while True:
        u = bits(t_bits)
        if not _she_bern_exp(u, t_bits, bits):
            continue
        v = 0
        while v < vcap and _she_bern_exp(t, t_bits, bits):
            v += 1
        y = (u + t * v) // s
        neg = bits(1) == 1
        if neg and y == 0:
            continue
        return -y if neg else y


def she_randomize(values, nkey, s, t_bits, bound, slot, out):
    """Row by row, coordinate by coordinate, in Python integers."""
    x = values.astype(np.int64)
    n, k = out.shape
    s, t_bits, bound, slot = int(s), int(t_bits), int(bound), int(slot)
    vcap = -(-s * (bound + 1) // (1 << t_bits))
    slots = noise_slots(nkey, n, slot)
    for i in range(n):
        bits = _SheBits(nkey, i, slots[i])
        for j in range(k):
            z = _she_discrete_laplace(s, t_bits, vcap, bits) + (j == x[i])
            out[i, j] = min(max(z, -bound), bound)
    return out


def int_column_sums(reports, bound):
    r = reports.astype(np.int64)
    return r.sum(axis=0), int(((r > bound) | (r < -bound)).sum())
