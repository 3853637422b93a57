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

from ._rand import other_than, unit, word

_PAR = dict(parallel=True, cache=True, nogil=True)
_CHUNK = 1 << 14


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
def ue_chain_randomize(values, keys, memo, seen, seed, p1, q1, p2, q2, k):
    """Two UE rounds over ``k`` bits, packed little-endian into ``uint8 (n, ceil(k/8))``.

    PRR bit j is 1 w.p. ``p1`` if j is the value's bit else ``q1`` (memoized if ``memo``);
    IRR bit j is 1 w.p. ``p2`` if the PRR bit is 1 else ``q2``. ``p2 = 1, q2 = 0``
    disables the second round (single-shot SUE / OUE).
    """
    n = values.shape[0]
    nbytes = (k + 7) // 8
    out = np.zeros((n, nbytes), dtype=np.uint8)
    irr = not (p2 == 1.0 and q2 == 0.0)
    for i in nb.prange(n):
        x = np.int64(values[i])
        if memo:
            key = keys[i]
            a = np.uint64(x)
            _mark(seen, i, x)
        else:
            key = seed
            a = np.uint64(i)
        for j in range(k):
            b = unit(key, a, np.uint64(j)) < (p1 if j == x else q1)
            if irr:
                b = unit(seed, np.uint64(i), np.uint64(k + j)) < (p2 if b else q2)
            if b:
                out[i, j >> 3] |= np.uint8(1 << (j & 7))
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
