"""The hot loop of PEM's server (:mod:`.pem`): OLH support of a short list of candidate values.

A level of PEM needs ``C(v) = #{reports : H_seed(v) = y}`` only for its candidates (the extensions of the previous
level's top prefixes), not for all ``2^ℓ`` values of the prefix domain that :func:`estimators.kernels.lh_support`
walks. :func:`candidate_support` is that count for an arbitrary ``int64`` candidate array: one ``lh_coeffs`` per report,
then one multiply-add-shift per (report, candidate), the same hash as the project's OLH
(:func:`estimators.kernels.lh_hash`). :func:`candidate_support_np` is its numpy twin (over
:func:`estimators.reference.lh_hash`); ``tests/test_sketch_pem.py`` checks them equal.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels import lh_coeffs
from ..reference import lh_hash as _np_lh_hash

_CHUNK = 1 << 12  # reports per parallel chunk
_U32 = np.uint64(32)

__all__ = ["candidate_support", "candidate_support_np"]


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
