"""Kernels of the discrete Square Wave mechanism (:mod:`estimators.numeric.square_wave`) and their numpy twins.

Row ``i`` of a batch reads the four words of its fixed slot of the batch noise stream ``(nkey, NOISE, 0)``
(words ``[4 i, 4 i + 4)``) and, only when the uniform-cell draw rejects a word (probability below ``2^-48``
for 16-bit cell counts), further words of its own extension stream ``(nkey, NOISE_EXT, i)``
(:func:`estimators.randomness.stream_word` with ``skip = 4``). A report, in order:

1. word 0: the unbiased randomized rounding of ``t = v (d_in - 1)``, ``v = (x + 1) / 2``, to the input grid
   point ``i0 + 1`` iff ``unit(w0) < t - i0`` (``i0 = min(floor t, d_in - 2)``), i.e. with probability
   ``ceil(f 2^53) / 2^53``, ``f = t - i0``;
2. word 1: the window start of grid point ``i``, ``s = s_lo[i] + [w1 >> 11 < s_thr[i]]`` (a randomized
   rounding of ``i L / (d_in - 1)`` with the exact integer threshold ``s_thr[i]`` over ``2^53``);
3. word 2: "near" iff ``w2 < t_near`` (a 64-bit threshold: ``P = t_near / 2^64`` exactly);
4. word 3 (and extension words on rejection): a uniform integer ``u`` of ``[0, m)`` (``m = K`` near, ``L``
   far): the word modulo ``m`` once it is at most ``lim_m = 2^64 - 1 - (2^64 mod m)`` (the accepted words
   ``[0, 2^64 - (2^64 mod m))`` are a whole number of periods of ``m``: exactly uniform). The cell is ``s + u``
   (near) or ``u``, shifted by ``K`` past the window when ``u >= s`` (far).

The numba kernel and its numpy twin consume the same words in the same order, so they give equal reports
from the same key (the tests check it).
"""
from __future__ import annotations

import math

import numba as nb
import numpy as np

from ..kernels import _noise_slots  # the batch noise stream's row slots, shared with the frequency kernels
from ..randomness import NOISE, NOISE_EXT, np_unit, stream_word, unit
from ..reference import Draws, noise_slots

__all__ = ["SW_SLOT", "sw_randomize", "np_sw_randomize"]

SW_SLOT = 4                # words per row in the batch noise stream (more only on rejection: extension stream)
# Serial for now: parallel=True doubles the cold compile (212 against 115 CPU s for the numeric tests on the
# 2-core machine) while the test suite has no room for it; `prange` runs as `range`.
# The rare rejections are out of the hot loop (:func:`_redraw`): twice the rate (2026-11-27, docs/benchmarks.md).
_PAR = dict(parallel=False, cache=True, nogil=True)
_CHUNK = 1 << 12
_SHIFT53 = np.uint64(11)


@nb.njit(cache=True, nogil=True)
def _redraw(w, lim, nkey, i, slot, cache):
    """Slot word 3 ``w`` redrawn from row ``i``'s extension stream while it exceeds ``lim`` (``slot`` the row's
    slot). Not inlined: it runs for fewer than 2^-48 of the rows, and out of the hot loop (one copy of the
    ChaCha20 block code; the row's slot sliced only here) the kernel runs several times faster."""
    j = SW_SLOT
    while w > lim:
        w = stream_word(nkey, NOISE_EXT, i, slot, j, cache, SW_SLOT)
        j += 1
    return w


@nb.njit(**_PAR)
def sw_randomize(x, nkey, d_in, s_lo, s_thr, t_near, k, l, lim_k, lim_l):
    """Cell indices (uint16) of the unit inputs ``x`` (float64 in [-1, 1]) under the discrete Square Wave law
    (module doc): ``d_in`` input grid points, window start table ``s_lo`` (int64) / ``s_thr`` (uint64, over
    2^53), near threshold ``t_near`` (uint64, over 2^64), window ``k`` cells, ``l = d_out - k`` starts - 1,
    rejection limits ``lim_k``, ``lim_l`` (uint64)."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.uint16)
    top = d_in - 2
    scale = float(d_in - 1)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, SW_SLOT, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        for i in range(r0, r1):
            o = (i - r0) * SW_SLOT
            t = (x[i] + 1.0) * 0.5 * scale
            i0 = np.int64(math.floor(t))
            if i0 > top:
                i0 = top
            if i0 < 0:
                i0 = 0
            f = t - i0
            g = i0 + 1 if unit(noise[o]) < f else i0
            s = s_lo[g]
            if (noise[o + 1] >> _SHIFT53) < s_thr[g]:
                s += 1
            near = noise[o + 2] < t_near
            m, lim = (k, lim_k) if near else (l, lim_l)
            w = noise[o + 3]
            if w > lim:  # rare: the row's extension stream (a fresh cache: the stream is the row's own)
                cache[8] = 0
                w = _redraw(w, lim, nkey, i, noise[o:o + SW_SLOT], cache)
            u = np.int64(w % np.uint64(m))  # uniform on [0, m): the word is below lim_m + 1
            if near:
                cell = s + u
            else:
                cell = u + k if u >= s else u
            out[i] = np.uint16(cell)
    return out


def np_sw_randomize(x: np.ndarray, nkey: np.ndarray, d_in: int, s_lo: np.ndarray, s_thr: np.ndarray,
                    t_near: np.uint64, k: int, l: int, lim_k: np.uint64, lim_l: np.uint64) -> np.ndarray:
    """The numpy twin of :func:`sw_randomize` (vectorized; a Python loop only over the rare rejected rows)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    w = noise_slots(nkey, n, SW_SLOT)
    t = (x + 1.0) * 0.5 * float(d_in - 1)
    i0 = np.clip(np.floor(t).astype(np.int64), 0, d_in - 2)
    f = t - i0
    g = i0 + (np_unit(w[:, 0]) < f)
    s = s_lo[g] + ((w[:, 1] >> _SHIFT53) < s_thr[g])
    near = w[:, 2] < np.uint64(t_near)
    m = np.where(near, np.uint64(k), np.uint64(l))
    lim = np.where(near, np.uint64(lim_k), np.uint64(lim_l))
    u = w[:, 3].copy()
    for i in np.nonzero(u > lim)[0]:
        draws, j = Draws(nkey, NOISE_EXT, int(i), w[i], skip=SW_SLOT), SW_SLOT
        while u[i] > lim[i]:
            u[i] = draws(j)
            j += 1
    u = (u % m).astype(np.int64)
    cell = np.where(near, s + u, np.where(u >= s, u + k, u))
    return cell.astype(np.uint16)


# ------------------------------------------------------------------ EMS (server side)
@nb.njit(inline="always", cache=True)
def _forward_row(th, pi, s_lo, s_next, k, l, q, pq, ca, out):
    """``out = M θ`` for one row (the structured operator of :meth:`SW.forward`): the start weights
    ``w[s] = Σ_i θ_i P[start s | i]`` (scatter), then window sums over the starts by a running cumulative sum
    (``ca``, work array of ``l + 2``)."""
    d_in = th.shape[0]
    for s in range(l + 2):
        ca[s] = 0.0
    tot = 0.0
    for i in range(d_in):
        ca[s_lo[i] + 1] += th[i] * (1.0 - pi[i])
        ca[s_next[i] + 1] += th[i] * pi[i]
        tot += th[i]
    for s in range(l + 1):
        ca[s + 1] += ca[s]
    for c in range(out.shape[0]):
        hi = min(c, l) + 1
        lo = max(c - k + 1, 0)
        out[c] = q * tot + pq * (ca[hi] - ca[lo])


@nb.njit(inline="always", cache=True)
def _adjoint_row(y, pi, s_lo, s_next, k, q, pq, cy, out):
    """``out = Mᵀ y`` for one row (:meth:`SW.adjoint`); ``cy`` work array of ``d_out + 1``."""
    cy[0] = 0.0
    for c in range(y.shape[0]):
        cy[c + 1] = cy[c] + y[c]
    tot = cy[y.shape[0]]
    for i in range(out.shape[0]):
        a, b = s_lo[i], s_next[i]
        out[i] = q * tot + pq * ((1.0 - pi[i]) * (cy[a + k] - cy[a]) + pi[i] * (cy[b + k] - cy[b]))


@nb.njit(inline="always", cache=True)
def _normalize(th):
    t = 0.0
    for i in range(th.shape[0]):
        t += th[i]
    for i in range(th.shape[0]):
        th[i] /= t


@nb.njit(parallel=False, cache=True, nogil=True)
def sw_ems(counts, pi, s_lo, s_next, k, l, q, pq, tol, max_iter):
    """EMS (Li et al., SIGMOD 2020, §5) on every row of ``counts`` (float64 ``(B, d_out)``), row by row:
    ``θ`` uniform; EM step ``θ <- θ ⊙ Mᵀ (c / M θ)``, normalized; smoothing ``[1, 2, 1] / 4`` (ends
    ``[2, 1] / 3``), normalized; stop when the log-likelihood ``Σ c log M θ`` changes by at most ``tol`` times
    its magnitude, or after ``max_iter`` steps. Returns ``(θ (B, d_in), iterations (B,))``."""
    nrows, d_out = counts.shape
    d_in = pi.shape[0]
    theta = np.empty((nrows, d_in))
    iters = np.zeros(nrows, dtype=np.int64)
    for r in nb.prange(nrows):
        c = counts[r]
        th = np.full(d_in, 1.0 / d_in)
        tmp = np.empty(d_in)
        pm = np.empty(d_out)
        y = np.empty(d_out)
        ca = np.empty(l + 2)
        cy = np.empty(d_out + 1)
        _forward_row(th, pi, s_lo, s_next, k, l, q, pq, ca, pm)
        ll = 0.0
        for j in range(d_out):
            if c[j] > 0:
                ll += c[j] * math.log(pm[j])
        it = 0
        while it < max_iter:
            it += 1
            for j in range(d_out):
                y[j] = c[j] / pm[j]
            _adjoint_row(y, pi, s_lo, s_next, k, q, pq, cy, tmp)
            for i in range(d_in):
                th[i] *= tmp[i]
            _normalize(th)
            if d_in >= 2:
                for i in range(1, d_in - 1):
                    tmp[i] = 0.25 * (th[i - 1] + 2.0 * th[i] + th[i + 1])
                tmp[0] = (2.0 * th[0] + th[1]) / 3.0
                tmp[d_in - 1] = (th[d_in - 2] + 2.0 * th[d_in - 1]) / 3.0
                for i in range(d_in):
                    th[i] = tmp[i]
            _normalize(th)
            _forward_row(th, pi, s_lo, s_next, k, l, q, pq, ca, pm)
            ll_new = 0.0
            for j in range(d_out):
                if c[j] > 0:
                    ll_new += c[j] * math.log(pm[j])
            done = abs(ll_new - ll) <= tol * abs(ll)
            ll = ll_new
            if done:
                break
        theta[r] = th
        iters[r] = it
    return theta, iters
