"""Kernels of 1BitMean with α-point rounding and memoization (:mod:`estimators.numeric.onebit`) and their numpy
twins.

A report of unit input ``x`` (``u = (x + 1) / 2``, ``t = u s``, ``j = min(floor t, s - 1)``, ``f = t - j``):

* **α-point rounding** (Ding, Kulkarni & Yekhanin, NeurIPS 2017, §3.1): the rounded point is ``j + 1`` iff
  ``α < f`` with ``α = unit(word)`` (53 bits), i.e. with probability ``ceil(f 2^53) / 2^53``, else ``j``;
* **the 1BitMean bit of the rounded point** (§2.1, Eq. 1): ``1`` iff ``word >> 11 < T_lo + j' step``
  (``j'`` the rounded point, integer thresholds over ``2^53``);
* **output perturbation** (§4), when ``G > 0``: the bit is flipped iff ``word >> 11 < G``.

Two modes draw these words from different streams:

* *single shot* (no memo state): all three from row ``i``'s slot of the batch noise stream ``(nkey, NOISE, 0)``
  (words ``[W i, W (i + 1))``, ``W = 2`` or 3 with the perturbation): a fresh device per report;
* *memoized* (a device's memo state): ``α`` from word 0 of ``(key_i, ONEBIT_ALPHA, 0)`` (fixed forever by the
  device's secret 256-bit key), the bit of rounded point ``j'`` from word 0 of ``(key_i, PRR, j')`` (a keyed PRF
  of the point: the same point always gives the same bit), the perturbation from the batch noise stream
  (one word a row). ``seen`` (packed bits, little bit order) marks the rounded points reported.

The numba kernels and their numpy twins read the same words, so they give equal reports from the same keys.
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..kernels import _noise_slots  # the batch noise stream's row slots, shared with the frequency kernels
from ..randomness import NOISE, ONEBIT_ALPHA, PRR, fill_words, np_stream_words, np_unit, unit
from ..reference import noise_slots

__all__ = ["onebit_randomize", "onebit_randomize_memo", "np_onebit_randomize",
           "np_onebit_randomize_memo", "onebit_alpha", "np_onebit_alpha"]

# Serial for now: parallel=True doubles the cold compile (212 against 115 CPU s for the numeric tests on the
# 2-core machine) while the test suite has no room for it; `prange` runs as `range`.
_PAR = dict(parallel=False, cache=True, nogil=True)
_CHUNK = 1 << 12
_SHIFT53 = np.uint64(11)


@nb.njit(inline="always", cache=True)
def _round(x, s, alpha):
    """α-point rounding of unit input ``x`` to a point of ``{0, ..., s}``: ``j + 1`` iff ``alpha < f``."""
    t = (x + 1.0) * 0.5 * s
    j = np.int64(math.floor(t))
    if j > s - 1:
        j = s - 1
    if j < 0:
        j = 0
    if alpha < t - j:
        j += 1
    return j


@nb.njit(**_PAR)
def onebit_randomize(x, nkey, s, t_lo, step, g):
    """Single-shot reports (uint8 bits) of unit inputs ``x``: ``s`` rounding buckets, thresholds ``t_lo + j step``
    over ``2^53`` (uint64), perturbation threshold ``g`` (uint64 over ``2^53``; 0 = none)."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.uint8)
    w = 3 if g > 0 else 2
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, w, r0, r1)
        for i in range(r0, r1):
            o = (i - r0) * w
            j = _round(x[i], s, unit(noise[o]))
            bit = (noise[o + 1] >> _SHIFT53) < t_lo + np.uint64(j) * step
            if w == 3 and (noise[o + 2] >> _SHIFT53) < g:
                bit = not bit
            out[i] = 1 if bit else 0
    return out


@nb.njit(**_PAR)
def onebit_randomize_memo(x, keys, seen, nkey, s, t_lo, step, g):
    """Memoized reports (uint8 bits) of unit inputs ``x`` of the devices with memo ``keys`` (uint32 ``(n, 8)``),
    marking each rounded point in ``seen`` (uint8 ``(n, ceil((s + 1) / 8))``); ``nkey`` (the batch key) is read
    only when ``g > 0``."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.uint8)
    zeros = np.zeros(n, dtype=np.uint64)
    points = np.empty(n, dtype=np.uint64)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        aw = np.empty((r1 - r0, 8), dtype=np.uint64)
        fill_words(keys, True, ONEBIT_ALPHA, zeros, r0, r1, aw)
        for i in range(r0, r1):
            j = _round(x[i], s, unit(aw[i - r0, 0]))
            points[i] = np.uint64(j)
            seen[i, j >> 3] |= np.uint8(1 << (j & 7))
        bw = np.empty((r1 - r0, 8), dtype=np.uint64)
        fill_words(keys, True, PRR, points, r0, r1, bw)
        if g > 0:
            noise = _noise_slots(nkey, 1, r0, r1)
        else:
            noise = np.zeros(r1 - r0, dtype=np.uint64)
        for i in range(r0, r1):
            bit = (bw[i - r0, 0] >> _SHIFT53) < t_lo + points[i] * step
            if g > 0 and (noise[i - r0] >> _SHIFT53) < g:
                bit = not bit
            out[i] = 1 if bit else 0
    return out


@nb.njit(**_PAR)
def onebit_alpha(keys):
    """The devices' α (float64 in [0, 1)): ``unit`` of word 0 of ``(key, ONEBIT_ALPHA, 0)``."""
    n = keys.shape[0]
    out = np.empty(n)
    zeros = np.zeros(n, dtype=np.uint64)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        aw = np.empty((r1 - r0, 8), dtype=np.uint64)
        fill_words(keys, True, ONEBIT_ALPHA, zeros, r0, r1, aw)
        for i in range(r0, r1):
            out[i] = unit(aw[i - r0, 0])
    return out


# ------------------------------------------------------------------ numpy twins
def _np_round(x: np.ndarray, s: int, alpha: np.ndarray) -> np.ndarray:
    t = (np.asarray(x, dtype=np.float64) + 1.0) * 0.5 * s
    j = np.clip(np.floor(t).astype(np.int64), 0, s - 1)
    return j + (alpha < t - j)


def np_onebit_randomize(x: np.ndarray, nkey: np.ndarray, s: int, t_lo: int, step: int, g: int) -> np.ndarray:
    """The numpy twin of :func:`onebit_randomize`."""
    x = np.asarray(x, dtype=np.float64)
    w = 3 if g > 0 else 2
    slots = noise_slots(nkey, x.shape[0], w)
    j = _np_round(x, s, np_unit(slots[:, 0]))
    bit = (slots[:, 1] >> _SHIFT53) < np.uint64(t_lo) + j.astype(np.uint64) * np.uint64(step)
    if g > 0:
        bit ^= (slots[:, 2] >> _SHIFT53) < np.uint64(g)
    return bit.astype(np.uint8)


def np_onebit_alpha(keys: np.ndarray) -> np.ndarray:
    """The twin of :func:`onebit_alpha`."""
    n = keys.shape[0]
    if n == 0:
        return np.zeros(0)
    return np_unit(np_stream_words(keys, ONEBIT_ALPHA, np.zeros(n, dtype=np.uint64), 1)[:, 0])


def np_onebit_randomize_memo(x: np.ndarray, keys: np.ndarray, seen: np.ndarray, nkey: np.ndarray, s: int,
                             t_lo: int, step: int, g: int) -> np.ndarray:
    """The numpy twin of :func:`onebit_randomize_memo` (marks ``seen`` the same way)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    j = _np_round(x, s, np_onebit_alpha(keys))
    np.bitwise_or.at(seen, (np.arange(n), j >> 3), (1 << (j & 7)).astype(np.uint8))
    words = np_stream_words(keys, PRR, j.astype(np.uint64), 1)[:, 0]
    bit = (words >> _SHIFT53) < np.uint64(t_lo) + j.astype(np.uint64) * np.uint64(step)
    if g > 0:
        bit ^= (noise_slots(nkey, n, 1)[:, 0] >> _SHIFT53) < np.uint64(g)
    return bit.astype(np.uint8)
