"""The hot loop of PEM's server (:mod:`.pem`): OLH support of a short list of candidate values.

A level of PEM needs ``C(v) = #{reports : H_seed(v) = y}`` only for its candidates (the extensions of the previous
level's top prefixes), not for all ``2^ℓ`` values of the prefix domain that :func:`estimators.kernels.lh_support`
walks. :func:`candidate_support` is that count for an arbitrary ``int64`` candidate array: one ``lh_coeffs`` per report,
then one multiply-add-shift per (report, candidate), the same hash as the project's OLH
(:func:`estimators.kernels.lh_hash`). :func:`candidate_support_np` is its numpy twin (over
:func:`estimators.reference.lh_hash`); ``tests/test_sketch_pem.py`` checks them equal.

:func:`memo_olh` is a device's memoized OLH report of a prefix ``x`` (PEM's longitudinal use): words 0, 1, 2 of the
ChaCha20 stream ``(key, PRR, x)`` give the hash seed (word 0's low 32 bits), keep? (``unit(word 1) < p``) and the
other bucket (``other_than``), the same law as the project's OLH (:func:`estimators.kernels.lh_encode` then
:func:`estimators.kernels.grr_chain_randomize`), drawn from a keyed PRF of the memo key and the prefix, so a value
that does not change gets the same report forever; :func:`memo_olh_np` is its twin.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels import lh_coeffs, lh_hash
from ..randomness import LO32, PRR, fill_words, np_other_than, np_stream_words, np_unit, other_than, unit
from ..reference import lh_hash as _np_lh_hash

_CHUNK = 1 << 12  # reports per parallel chunk
_U32 = np.uint64(32)

TAG = np.uint32(0x47544d50)     # "PMTG": the memo tag of a memoized prefix (:mod:`.pem`)
__all__ = ["GROUP", "candidate_support", "candidate_support_np", "memo_olh", "memo_olh_np"]

GROUP = np.uint32(0x50524750)  # "PGRP": a PEM device's fixed group, a = 0 (treehist_kernels.keyed_choice)


@nb.njit(parallel=False, cache=True, nogil=True)  # serial: a parallel kernel doubles the cold compile
def candidate_support(hseeds, ys, cands, g):
    """``C[j] = #{i : H_{hseeds[i]}(cands[j]) == ys[i]}``, ``int64 (len(cands),)``; O(n |cands|)."""
    n = hseeds.shape[0]
    m = cands.shape[0]
    gg = np.uint64(g)
    cu = np.empty(m, dtype=np.uint64)
    for j in range(m):
        cu[j] = np.uint64(cands[j])
    nchunks = (n + _CHUNK - 1) // _CHUNK
    partial = np.zeros((nchunks, m), dtype=np.int64)
    for c in nb.prange(nchunks):
        row = partial[c]
        for i in range(c * _CHUNK, min(n, (c + 1) * _CHUNK)):
            a, b = lh_coeffs(hseeds[i])
            y = np.uint64(ys[i])
            for j in range(m):
                row[j] += np.int64((((a * cu[j] + b) >> _U32) * gg) >> _U32 == y)
    return partial.sum(axis=0)


def candidate_support_np(hseeds, ys, cands, g, block: int = 1 << 12):
    """Numpy twin of :func:`candidate_support` (blocks of reports, so memory stays ``block x |cands|``)."""
    hseeds = np.asarray(hseeds, dtype=np.uint32)
    ys = np.asarray(ys, dtype=np.int64)
    cands = np.asarray(cands, dtype=np.int64)
    out = np.zeros(cands.shape[0], dtype=np.int64)
    for r0 in range(0, hseeds.shape[0], block):
        h = _np_lh_hash(hseeds[r0:r0 + block, None], cands[None, :], g)
        out += (h == ys[r0:r0 + block, None]).sum(axis=0, dtype=np.int64)
    return out


@nb.njit(cache=True, nogil=True)
def memo_olh(prefixes, keys, g, p):
    """Memoized OLH reports (module doc): hash seeds ``uint32 (n,)`` and buckets ``int64 (n,)``."""
    n = prefixes.shape[0]
    pre = np.empty((n, 8), dtype=np.uint64)
    fill_words(keys, True, PRR, prefixes.astype(np.uint64), 0, n, pre)
    seeds = np.empty(n, dtype=np.uint32)
    ys = np.empty(n, dtype=np.int64)
    gg = np.uint64(g)
    for i in range(n):
        hs = pre[i, 0] & LO32
        a, b = lh_coeffs(hs)
        x = np.int64(lh_hash(a, b, prefixes[i], gg))
        if unit(pre[i, 1]) >= p:
            x = other_than(x, g, unit(pre[i, 2]))
        seeds[i] = np.uint32(hs)
        ys[i] = x
    return seeds, ys


def memo_olh_np(prefixes, keys, g, p):
    """The numpy twin of :func:`memo_olh`."""
    prefixes = np.asarray(prefixes, dtype=np.int64)
    if prefixes.shape[0] == 0:
        return np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=np.int64)
    pre = np_stream_words(keys, PRR, prefixes.astype(np.uint64), 3)
    seeds = (pre[:, 0] & LO32).astype(np.uint32)
    x = _np_lh_hash(seeds, prefixes, g).astype(np.int64)
    other = np_other_than(x, g, np_unit(pre[:, 2]))
    return seeds, np.where(np_unit(pre[:, 1]) >= p, other, x).astype(np.int64)
