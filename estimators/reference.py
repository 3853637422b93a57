"""Plain-numpy references of the numba kernels in :mod:`estimators.kernels`.

Same inputs, same counter-based randomness, same outputs: the tests compare them exactly.
They are slow and memory-hungry on purpose (clarity first); never call them on hot paths.
"""
from __future__ import annotations

import numpy as np

from ._rand import np_other_than, np_unit


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


def ue_chain_randomize(values, keys, memo, seen, seed, p1, q1, p2, q2, k):
    values = values.astype(np.int64)
    n = values.shape[0]
    key, a = _addr(values, keys, memo, seed)
    if memo:
        _mark(seen, values)
    j = np.arange(k, dtype=np.uint64)[None, :]
    hot = j == values.astype(np.uint64)[:, None]
    bits = np_unit(key[:, None], a[:, None], j) < np.where(hot, p1, q1)
    if not (p2 == 1.0 and q2 == 0.0):
        i = np.arange(n, dtype=np.uint64)[:, None]
        bits = np_unit(seed, i, k + j) < np.where(bits, p2, q2)
    return np.packbits(bits, axis=1, bitorder="little")


def packed_bit_counts(bits, k):
    return np.unpackbits(bits, axis=1, bitorder="little")[:, :k].sum(axis=0, dtype=np.int64)


def bincount(values, m):
    return np.bincount(values, minlength=m).astype(np.int64)
