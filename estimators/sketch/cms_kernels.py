"""Numba kernels of the Count Mean Sketch oracles (:mod:`.cms`), each with a plain-numpy twin (``np_*``) computing
the same function from the same ChaCha20 streams; ``tests/test_sketch_cms.py`` checks that they agree exactly.

Every draw comes from the batch noise stream ``(nkey, NOISE, 0)`` of :mod:`estimators.randomness`, row ``i``
owning a fixed slot of it, and, rarely, from the row's extension stream ``(nkey, NOISE_EXT, i)``; every hash is
:func:`.hashing.sketch_hash` (one call per report, on one-element views).

* **Row.** Slot word 0 ``z``; while ``z > rejection_limit(k)`` (probability below ``k 2^-64``) the next draw is
  taken; the row is ``z mod k`` (exactly uniform).
* **CMS** (``w = 1 + B + 2`` words, ``B = ceil(m / 8)``): the flip mask's byte ``b`` is 8 exact lazy Bernoulli
  bits from slot word ``1 + b`` with the 32-bit threshold ``T`` (:func:`estimators.randomness.bernoulli_top`;
  ties settled by :func:`~estimators.randomness.bernoulli_refine` from the slot's last 2 words, then the
  extension stream). The report's bits are the mask with bit ``h_j(id)`` inverted.
* **HCMS** (``w = 3`` words): word 1 gives the coefficient ``l = z & (m - 1)`` (``m`` a power of 2), word 2
  the flip, ``z >> 11 < T`` (53-bit threshold); the bit is ``[H[h_j(id), l] = +1]`` xor the flip, with
  ``H[r, c] = (-1)^popcount(r & c)`` (Sylvester order).

Draws past the slot (row rejections, then refinements) share one counter starting after the slot's fixed
words, in that order.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels import _parity
from ..randomness import NOISE, NOISE_EXT, bernoulli_refine, bernoulli_top, fill_run, stream_word
from ..reference import Draws, _bernoulli_row, noise_slots
from .hashing import np_sketch_hash, sketch_hash

__all__ = ["CMS_REFINE_SLOTS", "HCMS_SLOT", "cms_randomize", "cms_slot_words", "cms_support", "np_cms_support", "fwht_rows", "hcms_randomize",
           "np_cms_randomize", "np_fwht_rows", "np_hcms_randomize", "ROW_BYTES"]

_PAR = dict(parallel=False, cache=True, nogil=True)
_CHUNK = 1 << 10
CMS_REFINE_SLOTS = 2  # refinement draws held in a CMS row's noise slot (more: extension stream)
HCMS_SLOT = 3         # noise words per HCMS row: 0 the sketch row, 1 the coefficient, 2 flip?
ROW_BYTES = 2         # a CMS report starts with its row, little-endian uint16


def cms_slot_words(m: int) -> int:
    return 1 + (m + 7) // 8 + CMS_REFINE_SLOTS


@nb.njit(inline="always", cache=True)
def _draw_row(nkey, i, slot, k, limit, jn, cache, w):
    z = slot[0]
    while z > limit:
        z = stream_word(nkey, NOISE_EXT, i, slot, jn, cache, w)
        jn += 1
    return np.int64(z % np.uint64(k)), jn


@nb.njit(**_PAR)
def cms_randomize(ids, seeds, m, nkey, limit, t_hi, t_rest):
    """CMS reports ``uint8 (n, 2 + ceil(m/8))`` of the ids ``uint64 (n,)`` (module doc); ``limit`` is
    ``rejection_limit(k)``, ``(t_hi, t_rest)`` the split 32-bit flip threshold."""
    n, k = ids.shape[0], seeds.shape[0]
    nbytes = (m + 7) // 8
    w = 1 + nbytes + CMS_REFINE_SLOTS
    out = np.zeros((n, ROW_BYTES + nbytes), dtype=np.uint8)
    lanes = t_hi * np.uint64(0x0101010101010101)
    last = np.uint64((1 << (m & 7)) - 1) if m & 7 else np.uint64(0xFF)
    hi = np.empty(nbytes, dtype=np.uint64)
    for b in range(nbytes):
        hi[b] = lanes
    bits = np.empty(nbytes, dtype=np.uint64)
    eq = np.empty(nbytes, dtype=np.uint64)
    sel = np.zeros(nbytes, dtype=np.uint64)
    cache = np.zeros(9, dtype=np.uint64)
    for r0 in range(0, n, _CHUNK):
        r1 = min(n, r0 + _CHUNK)
        noise = np.empty((r1 - r0) * w, dtype=np.uint64)
        fill_run(nkey, NOISE, 0, r0 * w, noise)
        for i in range(r0, r1):
            slot = noise[(i - r0) * w:(i - r0 + 1) * w]
            cache[8] = 0
            j, jn = _draw_row(nkey, i, slot, k, limit, 1 + nbytes, cache, w)
            if bernoulli_top(slot, 1, hi, bits, eq):
                jn = bernoulli_refine(bits, eq, sel, t_rest, t_rest, nkey, NOISE_EXT, i, slot, jn, cache, w)
            h = sketch_hash(ids[i:i + 1], seeds[j:j + 1], m)[0, 0]
            bits[h >> 3] ^= np.uint64(1) << np.uint64(h & 7)
            bits[nbytes - 1] &= last
            out[i, 0] = np.uint8(j & 0xFF)
            out[i, 1] = np.uint8(j >> 8)
            for b in range(nbytes):
                out[i, ROW_BYTES + b] = np.uint8(bits[b])
    return out


def _np_rows(nkey, slots, k, limit, start, w):
    """Rows of every report and, per report, the next draw index (rejections taken in the extension stream)."""
    n = slots.shape[0]
    rows = np.empty(n, dtype=np.int64)
    nxt = np.full(n, start, dtype=np.int64)
    z = slots[:, 0].copy()
    for i in np.nonzero(z > limit)[0]:
        d = Draws(nkey, NOISE_EXT, i, slots[i], skip=w)
        j = start
        while z[i] > limit:
            z[i] = d(j)
            j += 1
        nxt[i] = j
    rows[:] = (z % np.uint64(k)).astype(np.int64)
    return rows, nxt


def _np_hash_rows(ids, seeds, rows, m):
    """``h_{seeds[rows[i]]}(ids[i])`` with :func:`.hashing.np_sketch_hash`, one call per row used."""
    h = np.empty(ids.shape[0], dtype=np.int64)
    for j in np.unique(rows):
        sel = rows == j
        h[sel] = np_sketch_hash(ids[sel], seeds[j:j + 1], m)[:, 0]
    return h


def np_cms_randomize(ids, seeds, m, nkey, limit, t_hi, t_rest):
    """The numpy twin of :func:`cms_randomize`."""
    ids = np.asarray(ids, dtype=np.uint64)
    n, k = ids.shape[0], seeds.shape[0]
    nbytes = (m + 7) // 8
    w = 1 + nbytes + CMS_REFINE_SLOTS
    slots = noise_slots(nkey, n, w)
    rows, nxt = _np_rows(nkey, slots, k, np.uint64(limit), 1 + nbytes, w)
    hi, rest = np.full((nbytes, 8), np.uint64(t_hi)), np.full((nbytes, 8), np.uint64(t_rest))
    bits = np.empty((n, nbytes * 8), dtype=bool)
    for i in range(n):
        b, _ = _bernoulli_row(slots[i, 1:1 + nbytes], hi, rest, Draws(nkey, NOISE_EXT, i, slots[i], skip=w), nxt[i])
        bits[i] = b.reshape(-1)
    h = _np_hash_rows(ids, seeds, rows, m)
    bits[np.arange(n), h] ^= True
    bits[:, m:] = False
    out = np.zeros((n, ROW_BYTES + nbytes), dtype=np.uint8)
    out[:, 0] = (rows & 0xFF).astype(np.uint8)
    out[:, 1] = (rows >> 8).astype(np.uint8)
    out[:, ROW_BYTES:] = np.packbits(bits, axis=1, bitorder="little")
    return out


@nb.njit(**_PAR)
def hcms_randomize(ids, seeds, m, nkey, limit, t53):
    """HCMS reports ``uint64 (n,)``: ``((j m + l) << 1) | bit`` (module doc); ``t53`` the 53-bit flip threshold."""
    n, k = ids.shape[0], seeds.shape[0]
    out = np.empty(n, dtype=np.uint64)
    mask = np.uint64(m - 1)
    cache = np.zeros(9, dtype=np.uint64)
    for r0 in range(0, n, _CHUNK):
        r1 = min(n, r0 + _CHUNK)
        noise = np.empty((r1 - r0) * HCMS_SLOT, dtype=np.uint64)
        fill_run(nkey, NOISE, 0, r0 * HCMS_SLOT, noise)
        for i in range(r0, r1):
            slot = noise[(i - r0) * HCMS_SLOT:(i - r0 + 1) * HCMS_SLOT]
            cache[8] = 0
            j, _ = _draw_row(nkey, i, slot, k, limit, HCMS_SLOT, cache, HCMS_SLOT)
            l = np.int64(slot[1] & mask)
            h = sketch_hash(ids[i:i + 1], seeds[j:j + 1], m)[0, 0]
            bit = 1 - _parity(h & l)
            if (slot[2] >> np.uint64(11)) < t53:
                bit = 1 - bit
            out[i] = np.uint64(((j * m + l) << 1) | bit)
    return out


def np_hcms_randomize(ids, seeds, m, nkey, limit, t53):
    """The numpy twin of :func:`hcms_randomize`."""
    ids = np.asarray(ids, dtype=np.uint64)
    n, k = ids.shape[0], seeds.shape[0]
    slots = noise_slots(nkey, n, HCMS_SLOT)
    rows, _ = _np_rows(nkey, slots, k, np.uint64(limit), HCMS_SLOT, HCMS_SLOT)
    l = (slots[:, 1] & np.uint64(m - 1)).astype(np.int64)
    h = _np_hash_rows(ids, seeds, rows, m)
    bit = 1 - (np.bitwise_count(h & l).astype(np.int64) & 1)
    flip = (slots[:, 2] >> np.uint64(11)) < np.uint64(t53)
    bit = np.where(flip, 1 - bit, bit)
    return (((rows * m + l) << 1) | bit).astype(np.uint64)


@nb.njit(cache=True, nogil=True)
def fwht_rows(a):
    """In place, each row of ``a`` (int64 ``(k, m)``, ``m`` a power of 2): ``a[j, c] <- sum_r a[j, r] H[r, c]``."""
    for j in range(a.shape[0]):
        row = a[j]
        m = row.shape[0]
        h = 1
        while h < m:
            for s in range(0, m, 2 * h):
                for t in range(s, s + h):
                    x = row[t]
                    y = row[t + h]
                    row[t] = x + y
                    row[t + h] = x - y
            h *= 2
    return a


def np_fwht_rows(a):
    """The numpy twin of :func:`fwht_rows` (returns a new array)."""
    a = np.array(a, dtype=np.int64)
    k, m = a.shape
    h = 1
    while h < m:
        v = a.reshape(k, m // (2 * h), 2, h)
        x, y = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
        v[:, :, 0, :], v[:, :, 1, :] = x + y, x - y
        h *= 2
    return a



@nb.njit(cache=True, nogil=True)
def cms_support(reports, k, m):
    """CMS support ``int64 (k, m + 1)`` of reports ``uint8 (n, 2 + ceil(m/8))``: per row the reports with each bit
    set, and in column ``m`` the row's reports (:class:`.cms.CMS`); rows must lie in ``[0, k)`` (validated
    before). One increment per report byte (a histogram of each row's byte values), expanded into bits once."""
    nbytes = (m + 7) // 8
    hist = np.zeros((k, nbytes, 256), dtype=np.int64)
    out = np.zeros((k, m + 1), dtype=np.int64)
    for i in range(reports.shape[0]):
        row = np.int64(reports[i, 0]) | (np.int64(reports[i, 1]) << 8)
        out[row, m] += 1
        for b in range(nbytes):
            hist[row, b, reports[i, ROW_BYTES + b]] += 1
    for j in range(k):
        for b in range(nbytes):
            for v in range(1, 256):
                c = hist[j, b, v]
                if c:
                    for bit in range(8):
                        if (v >> bit) & 1 and 8 * b + bit < m:
                            out[j, 8 * b + bit] += c
    return out


def np_cms_support(reports: np.ndarray, k: int, m: int) -> np.ndarray:
    """The numpy twin of :func:`cms_support`: the reports' bits unpacked, summed per row."""
    r = np.asarray(reports)
    rows = r[:, 0].astype(np.int64) | (r[:, 1].astype(np.int64) << 8)
    out = np.zeros((k, m + 1), dtype=np.int64)
    out[:, m] = np.bincount(rows, minlength=k)
    step = max(1, (1 << 24) // max(m, 1))
    for s in range(0, r.shape[0], step):
        bits = np.unpackbits(r[s:s + step, ROW_BYTES:], axis=1, bitorder="little")[:, :m].astype(np.int64)
        np.add.at(out[:, :m], rows[s:s + step], bits)
    return out
