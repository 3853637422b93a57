"""Kernels of the exact discrete Laplace mechanism (:mod:`estimators.numeric.laplace`) and their numpy twins.

Row ``i`` of a batch draws 64-bit words from its fixed slot of :data:`LAPLACE_SLOT` words of the batch noise
stream ``(nkey, NOISE, 0)`` (words ``[i W, (i+1) W)``) and, past the slot, from its own extension stream
``(nkey, NOISE_EXT, i)`` (:func:`estimators.randomness.stream_word` with ``skip = W``). The words are read as
a stream of random bits, low bit first (:func:`_take`: ``k`` bits are the next ``k`` bits of the stream, a
word is drawn when the current one runs out), and every draw is exact:

* ``Bernoulli(n / d)`` for integers ``0 <= n < d``: the uniform ``u = 0.b1 b2 ...`` (random bits) is compared
  lazily with the binary expansion of ``n / d`` (long division); the first differing bit decides, so
  ``P[u < n/d] = n/d`` exactly with 2 bits on average (:func:`_bern_ratio`);
* a uniform integer of ``[0, t)``: ``bit_length(t - 1)`` bits, redrawn while ``>= t`` (:func:`_uniform_below`).

A report, in order:

1. the unbiased randomized rounding of ``a = x N`` (``N = 2^m`` grid steps per unit) to ``k = floor(a) + 1``
   with probability ``ceil(f 2^53) / 2^53``, ``f = a - floor(a)``, else ``floor(a)``;
2. the discrete Laplace noise ``Z``, ``P[Z = z] = (1 - q) / (1 + q) q^|z|`` with ``q = exp(-s / t)``,
   by Canonne, Kamath & Steinke's exact sampler (NeurIPS 2020, Algorithm 2, with Algorithm 1 for the
   ``Bernoulli(exp(-γ))`` draws): no floating point touches the noise;
3. the report ``clip(k + Z, -C, C)`` (``C = 2^31 - 1``, an int32; a deterministic post-processing).

The numba kernel and its plain-Python twin consume the same words in the same order, so they give equal
reports from the same key (the tests check it).
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..kernels import _noise_slots  # the batch noise stream's row slots, shared with the frequency kernels
from ..randomness import NOISE, NOISE_EXT, stream_word
from ..reference import Draws, noise_slots

__all__ = ["LAPLACE_SLOT", "CLAMP", "laplace_randomize", "np_laplace_randomize", "words_per_row"]

LAPLACE_SLOT = 2           # words per row in the batch noise stream (more: the row's extension stream)
CLAMP = (1 << 31) - 1      # reports are clipped to [-CLAMP, CLAMP] (int32, symmetric)
_TWO53 = float(1 << 53)
# Serial for now: parallel=True doubles the cold compile (212 against 115 CPU s for the numeric tests on the
# 2-core machine) while the test suite has no room for it; `prange` runs as `range`.
_PAR = dict(parallel=False, cache=True, nogil=True)
_CHUNK = 1 << 12


@nb.njit(cache=True, nogil=True)
def _next_word(st, nkey, i, slot, cache):
    """Row ``i``'s next word (``st[2]``, then incremented): its slot, then its extension stream. Not inlined:
    one copy of the ChaCha20 block code keeps the kernel's compile time short."""
    w = stream_word(nkey, NOISE_EXT, i, slot, np.int64(st[2]), cache, LAPLACE_SLOT)
    st[2] += np.uint64(1)
    return w


@nb.njit(inline="always", cache=True)
def _take(st, k, nkey, i, slot, cache):
    """The next ``k`` (1..62) random bits of row ``i`` as an integer. ``st`` (uint64 (3,)): the unread bits of
    the current word (low bits), how many, the index of the next word."""
    buf, have = st[0], st[1]
    kk = np.uint64(k)
    if kk <= have:
        st[0] = buf >> kk
        st[1] = have - kk
        return buf & ((np.uint64(1) << kk) - np.uint64(1))
    w = _next_word(st, nkey, i, slot, cache)
    need = kk - have
    st[0] = w >> need
    st[1] = np.uint64(64) - need
    return buf | ((w & ((np.uint64(1) << need) - np.uint64(1))) << have)


@nb.njit(inline="always", cache=True)
def _bern_ratio(num, den, st, nkey, i, slot, cache):
    """``Bernoulli(num / den)`` exactly (uint64, ``den < 2^63``; ``num >= den`` is 1 with no draw): random bits
    against the binary expansion of ``num / den``, the first difference decides."""
    if num >= den:
        return True
    one = np.uint64(1)
    r = num
    while r != np.uint64(0):
        r = r << one
        c = np.uint64(0)
        if r >= den:
            r -= den
            c = one
        if _take(st, 1, nkey, i, slot, cache) != c:
            return c == one
    return False


@nb.njit(inline="always", cache=True)
def _uniform_below(t, tbits, st, nkey, i, slot, cache):
    """A uniform integer of ``[0, t)``: ``tbits = bit_length(t - 1)`` bits, redrawn while ``>= t``."""
    if tbits == 0:
        return np.uint64(0)
    while True:
        u = _take(st, tbits, nkey, i, slot, cache)
        if u < t:
            return u


@nb.njit(inline="always", cache=True)
def _bern_exp(num, den, st, nkey, i, slot, cache):
    """``Bernoulli(exp(-num/den))`` for ``0 <= num <= den`` (Canonne, Kamath & Steinke, NeurIPS 2020,
    Algorithm 1, γ in [0, 1]): ``K = 1``; while ``Bernoulli(γ / K)``: ``K += 1``; the draw is ``K`` odd."""
    k = np.uint64(1)
    while _bern_ratio(num, den * k, st, nkey, i, slot, cache):
        k += np.uint64(1)
    return (k & np.uint64(1)) == np.uint64(1)


@nb.njit(inline="always", cache=True)
def _laplace_row(x, n_grid, t, tbits, s, st, nkey, i, slot, cache):
    """One report (module doc): the rounded input plus the exact discrete Laplace noise of scale ``t / s``."""
    one = np.uint64(1)
    a = x * n_grid
    lo = math.floor(a)
    k = np.int64(lo)
    if _bern_ratio(np.uint64(math.ceil((a - lo) * _TWO53)), np.uint64(1 << 53), st, nkey, i, slot, cache):
        k += 1
    while True:  # Canonne, Kamath & Steinke, NeurIPS 2020, Algorithm 2
        u = _uniform_below(t, tbits, st, nkey, i, slot, cache)
        if not _bern_exp(u, t, st, nkey, i, slot, cache):
            continue
        v = np.uint64(0)
        while _bern_exp(one, one, st, nkey, i, slot, cache):
            v += one
        y = np.int64((u + t * v) // s)
        neg = _take(st, 1, nkey, i, slot, cache) == one
        if neg and y == 0:
            continue
        r = k - y if neg else k + y
        return min(max(r, -CLAMP), CLAMP)


@nb.njit(**_PAR)
def laplace_randomize(x, nkey, n_grid, t, s):
    """Reports (int32) of the unit inputs ``x`` (float64 in [-1, 1]) with ``N = n_grid`` grid steps per unit
    and noise scale ``t / s`` grid steps (module doc); ``t, s`` uint64 (``t < 2^48``), ``nkey`` the batch key."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.int32)
    w = LAPLACE_SLOT
    tbits = 0
    while (np.uint64(1) << np.uint64(tbits)) < t:
        tbits += 1
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, w, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        st = np.zeros(3, dtype=np.uint64)
        for i in range(r0, r1):
            o = (i - r0) * w
            cache[8] = 0  # the extension stream is the row's own
            st[0] = 0
            st[1] = 0
            st[2] = 0
            out[i] = _laplace_row(x[i], n_grid, t, tbits, s, st, nkey, i, noise[o:o + w], cache)
    return out


# ------------------------------------------------------------------ Python twin
class _Bits:
    """Row ``i``'s random bits (the twin of :func:`_take`), with exact Python integers."""

    def __init__(self, nkey, i: int, slot: np.ndarray) -> None:
        self.draws = Draws(nkey, NOISE_EXT, i, slot, skip=LAPLACE_SLOT)
        self.buf, self.have, self.j = 0, 0, 0

    def take(self, k: int) -> int:
        if k <= self.have:
            r = self.buf & ((1 << k) - 1)
            self.buf >>= k
            self.have -= k
            return r
        w = int(self.draws(self.j))
        self.j += 1
        need = k - self.have
        r = self.buf | ((w & ((1 << need) - 1)) << self.have)
        self.buf, self.have = w >> need, 64 - need
        return r

    def bern_ratio(self, num: int, den: int) -> bool:
        if num >= den:
            return True
        r = num
        while r:
            r <<= 1
            c = int(r >= den)
            r -= c * den
            if self.take(1) != c:
                return c == 1
        return False

    def uniform_below(self, t: int) -> int:
        k = (t - 1).bit_length()
        if k == 0:
            return 0
        while True:
            u = self.take(k)
            if u < t:
                return u

    def bern_exp(self, num: int, den: int) -> bool:
        k = 1
        while self.bern_ratio(num, den * k):
            k += 1
        return k % 2 == 1


def _np_row(x: float, n_grid: int, t: int, s: int, bits: _Bits) -> int:
    a = x * n_grid
    lo = math.floor(a)
    k = int(lo) + int(bits.bern_ratio(math.ceil((a - lo) * _TWO53), 1 << 53))
    while True:
        u = bits.uniform_below(t)
        if not bits.bern_exp(u, t):
            continue
        v = 0
        while bits.bern_exp(1, 1):
            v += 1
        y = (u + t * v) // s
        neg = bits.take(1) == 1
        if neg and y == 0:
            continue
        return min(max(k - y if neg else k + y, -CLAMP), CLAMP)


def np_laplace_randomize(x: np.ndarray, nkey: np.ndarray, n_grid: int, t: int, s: int,
                         used: np.ndarray | None = None) -> np.ndarray:
    """The twin of :func:`laplace_randomize` (a Python loop over rows with exact integers; slow); ``used``
    (int64 (n,)) gets the number of words each row drew."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    slots = noise_slots(nkey, n, LAPLACE_SLOT)
    out = np.empty(n, dtype=np.int32)
    for i in range(n):
        bits = _Bits(nkey, i, slots[i])
        out[i] = _np_row(float(x[i]), int(n_grid), int(t), int(s), bits)
        if used is not None:
            used[i] = bits.j
    return out


def words_per_row(x: np.ndarray, nkey: np.ndarray, n_grid: int, t: int, s: int) -> np.ndarray:
    """How many words each row draws (the twin's count; to size :data:`LAPLACE_SLOT`)."""
    used = np.zeros(np.asarray(x).shape[0], dtype=np.int64)
    np_laplace_randomize(x, nkey, n_grid, t, s, used)
    return used
