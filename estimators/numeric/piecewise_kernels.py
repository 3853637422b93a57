"""Kernels of the discrete Piecewise and Hybrid Mechanisms and of their k-of-d sampling
(:mod:`estimators.numeric.piecewise`), with their numpy twins.

The law sampled (:mod:`.piecewise`'s module doc): ``M`` output cells, a window of ``K`` cells, cell masses
``A / Z`` in the window and ``B / Z`` outside (``Z = K A + L B <= 2^64``, ``L = M - K``, integers), the window
starting at cell ``s0`` or ``s0 + 1`` with probabilities ``1 - π`` and ``π``, ``π = q / D``, ``D = A - B``:
``t = (x + 1) / 2 · L``, ``s0 = min(floor t, L - 1)``, ``q = rint((t - s0) D)`` (``q = D`` when
``t - s0 = 1``; clamped to ``D``). The mixture's masses are integers over ``Z``: the ``K - 1`` cells
``s0 + 1 .. s0 + K - 1`` are in both windows (``A``), cell ``s0`` has ``A - q`` and cell ``s0 + K`` has
``B + q`` (together ``A + B``), and the other ``L - 1`` cells ``B``. So **one** 64-bit word ``w`` per report
draws the whole law, the input's rounding included: words ``w >= Z`` are redrawn (probability
``(2^64 - Z) / 2^64 < (K e^ε + L + K) / 2^64``: below ``2^-40`` for ε <= 10 at the default grid, at most
1/2 near the saturation of very large ε), then

* ``w < (K - 1) A``: the cell ``s0 + 1 + floor(w / A)``;
* else ``v = w - (K - 1) A < A + B``: cell ``s0`` if ``v < A - q``, else ``s0 + K``;
* else ``u = floor((v - A - B) / B) in [0, L - 1)``: the cell ``u`` (``u < s0``) or ``u + K + 1``.

Each cell takes exactly as many accepted words as its integer mass: the law is exact.

Words come from the batch noise stream ``(nkey, NOISE, 0)`` (row ``i``'s fixed slot) and, past the slot (the
redraws), from the row's own extension stream ``(nkey, NOISE_EXT, i)``
(:func:`estimators.randomness.stream_word`, ``skip`` = the slot's width). **PM** rows use a slot of
:data:`PM_SLOT` = 1 word. **HM** rows use :data:`HM_SLOT` = 2: word 0 picks the branch (PM iff
``w0 < T_α``, ``P = T_α / 2^64``); word 1 is PM's word, or Duchi et al.'s sign: ``+B`` (code ``M + 1``) iff
``w1 >> 11 < T_lo + rint((x + 1) S)`` (a 53-bit uniform against an integer threshold, as :mod:`.duchi` does),
else ``-B`` (code ``M``). **k-of-d** rows (Wang et al., ICDE 2019, Algorithm 4) use ``k + k W`` words (``W``
the base's slot width): words ``0 .. k-1`` draw a uniform k-subset of the ``d`` attributes by a partial
Fisher-Yates shuffle (word ``t``: an index of ``[t, d)``, the word modulo ``d - t`` once it is at most
``lim_t = 2^64 - 1 - (2^64 mod (d - t))``: exactly uniform), the subset is sorted, and the ``t``-th sampled
attribute is randomized with words ``k + t W .. k + (t+1) W - 1``. A row's extension words are shared by its
draws in that order.

The numba kernels and their numpy twins consume the same words in the same order, so they give equal reports
from the same key (the tests check it, with parameters that force redraws too).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels import _noise_slots  # the batch noise stream's row slots, shared with the frequency kernels
from ..randomness import NOISE, NOISE_EXT, stream_word
from ..reference import Draws, noise_slots
from .base import to_unit

__all__ = ["PM_SLOT", "HM_SLOT", "cell_moments", "hm_moments", "pm_randomize", "pm_randomize_values", "hm_randomize",
           "kofd_randomize", "np_cell_moments", "np_hm_moments", "np_pm_randomize", "np_pm_randomize_values",
           "np_hm_randomize", "np_kofd_randomize"]

PM_SLOT = 1     # words per PM report
HM_SLOT = 2     # words per HM report: the branch, then PM's word or Duchi's sign
# Serial for now: parallel=True doubles the cold compile (212 against 115 CPU s for the numeric tests on the
# 2-core machine) while the test suite has no room for it; `prange` runs as `range`.
# Serial PM randomizes over 100M reports/s in the kernel on one core since the rare redraws left its hot loop
# (:func:`_redraw`; 2026-11-27, docs/benchmarks.md).
_PAR = dict(parallel=False, cache=True, nogil=True)
_CHUNK = 1 << 12
_SHIFT53 = np.uint64(11)


@nb.njit(cache=True, nogil=True)
def _redraw(w, lim, nkey, i, slot, j, cache, skip):
    """``w`` redrawn from row ``i``'s extension stream (draw index ``j`` on; ``slot`` the row's slot, ``skip`` its
    width) while ``w > lim``. Returns ``(word, next draw index)``. Not inlined: it runs for a few rows in 2^40 at
    the default grid, and one copy of the ChaCha20 block code (not one per call site) keeps the compile short and
    the kernels' hot loops free of it (the row's slot is sliced only here, not for every row)."""
    while w > lim:
        w = stream_word(nkey, NOISE_EXT, i, slot, j, cache, skip)
        j += 1
    return w, j


@nb.njit(inline="always", cache=True)
def _pm_cell(x, w, l_f, k, a, b, d_ab, d_f, ka1):
    """PM's cell for unit input ``x`` from an accepted word ``w <= Z - 1`` (:func:`_redraw`): module doc.
    ``l_f = float(L)``, ``d_ab = D = A - B`` (uint64), ``d_f = float(D)``, ``ka1 = (K - 1) A`` (uint64)."""
    t = (x + 1.0) * 0.5 * l_f
    s0 = np.floor(t)
    if s0 > l_f - 1.0:
        s0 = l_f - 1.0
    f = t - s0
    if f >= 1.0:
        q = d_ab
    else:
        q = np.uint64(np.rint(f * d_f))
        if q > d_ab:
            q = d_ab
    s = np.int64(s0)
    if w < ka1:
        return s + 1 + np.int64(w // a)
    v = w - ka1
    if v < a + b:
        return s if v < a - q else s + k
    u = np.int64((v - a - b) // b)
    return u if u < s else u + k + 1


@nb.njit(inline="always", cache=True)
def _duchi_code(x, w, d_tlo, d_s, m):
    """Duchi et al.'s sign as an HM code: ``m + 1`` (``+B``) iff ``w >> 11 < T_lo + rint((x + 1) S)``, else ``m``."""
    thr = np.uint64(d_tlo + np.int64(np.rint((x + 1.0) * d_s)))
    return m + 1 if (w >> _SHIFT53) < thr else m


@nb.njit(**_PAR)
def pm_randomize(x, nkey, l, k, a, b, zlim, out):
    """PM cells of the unit inputs ``x`` (float64 in [-1, 1]) into ``out`` (uint16 or uint32): ``l`` = L,
    ``k`` = K (int64), ``a`` = A, ``b`` = B, ``zlim`` = Z - 1 (uint64); ``nkey`` the batch key (module doc)."""
    n = x.shape[0]
    l_f = float(l)
    d_ab = a - b
    d_f = float(d_ab)
    ka1 = a * np.uint64(k - 1)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, PM_SLOT, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        for i in range(r0, r1):
            o = i - r0
            w = noise[o]
            if w > zlim:  # rare: the row's extension stream (a fresh cache: the stream is the row's own)
                cache[8] = 0
                w, _ = _redraw(w, zlim, nkey, i, noise[o:o + PM_SLOT], PM_SLOT, cache, PM_SLOT)
            out[i] = _pm_cell(x[i], w, l_f, k, a, b, d_ab, d_f, ka1)
    return out


@nb.njit(inline="always", cache=True)
def _to_unit(v, lo, hi, span):
    """One value of :func:`estimators.numeric.base.to_unit` (not NaN), with its float operations in its order:
    ``clip(2 (clip(v, lo, hi) - lo) / span - 1, -1, 1)``, ``span = hi - lo``."""
    if v < lo:
        v = lo
    if v > hi:
        v = hi
    x = 2.0 * (v - lo) / span - 1.0
    if x < -1.0:
        x = -1.0
    if x > 1.0:
        x = 1.0
    return x


@nb.njit(**_PAR)
def pm_randomize_values(v, lo, hi, nkey, l, k, a, b, zlim, out):
    """:func:`pm_randomize` of ``to_unit(v, lo, hi)`` in one pass (``v`` float64 in metric units, no NaN; ``lo``,
    ``hi`` float64): the same reports from the same key, without the unit inputs' temporary arrays (the numpy
    mapping took 40% of PM's randomize)."""
    n = v.shape[0]
    span = hi - lo
    l_f = float(l)
    d_ab = a - b
    d_f = float(d_ab)
    ka1 = a * np.uint64(k - 1)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, PM_SLOT, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        for i in range(r0, r1):
            o = i - r0
            w = noise[o]
            if w > zlim:  # rare, as in pm_randomize
                cache[8] = 0
                w, _ = _redraw(w, zlim, nkey, i, noise[o:o + PM_SLOT], PM_SLOT, cache, PM_SLOT)
            out[i] = _pm_cell(_to_unit(v[i], lo, hi, span), w, l_f, k, a, b, d_ab, d_f, ka1)
    return out


@nb.njit(**_PAR)
def hm_randomize(x, nkey, t_alpha, l, k, a, b, zlim, d_tlo, d_s, out):
    """HM codes (uint32) of the unit inputs ``x`` into ``out``: PM (cells ``0 .. M-1``, parameters as in
    :func:`pm_randomize`) iff ``w0 < t_alpha``, else Duchi's ``-B`` / ``+B`` as codes ``M`` / ``M + 1``
    (``d_tlo`` = T_lo int64, ``d_s`` = S float64)."""
    n = x.shape[0]
    m = l + k
    l_f = float(l)
    d_ab = a - b
    d_f = float(d_ab)
    ka1 = a * np.uint64(k - 1)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, HM_SLOT, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        for i in range(r0, r1):
            o = (i - r0) * HM_SLOT
            if noise[o] < t_alpha:
                w = noise[o + 1]
                if w > zlim:  # rare, as in pm_randomize
                    cache[8] = 0
                    w, _ = _redraw(w, zlim, nkey, i, noise[o:o + HM_SLOT], HM_SLOT, cache, HM_SLOT)
                out[i] = _pm_cell(x[i], w, l_f, k, a, b, d_ab, d_f, ka1)
            else:
                out[i] = _duchi_code(x[i], noise[o + 1], d_tlo, d_s, m)
    return out


@nb.njit(**_PAR)
def kofd_randomize(x, nkey, kk, lims, hm, t_alpha, l, k, a, b, zlim, d_tlo, d_s, idx_out, rep_out):
    """k-of-d (Wang et al., ICDE 2019, Algorithm 4): for row ``i`` of the unit inputs ``x`` ``(n, d)``, a
    uniform ``kk``-subset of the attributes (sorted, into ``idx_out[i]``) and each one's PM (``hm`` False) or
    HM report (into ``rep_out[i]``); ``lims[t]`` is the rejection limit of ``[0, d - t)``; the other
    parameters as in :func:`hm_randomize` (module doc)."""
    n, d = x.shape[0], x.shape[1]
    wb = HM_SLOT if hm else PM_SLOT
    w = kk + kk * wb
    m = l + k
    l_f = float(l)
    d_ab = a - b
    d_f = float(d_ab)
    ka1 = a * np.uint64(k - 1)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, w, r0, r1)
        cache = np.zeros(9, dtype=np.uint64)
        perm = np.arange(d)
        rs = np.empty(kk, dtype=np.int64)
        sel = np.empty(kk, dtype=np.int64)
        for i in range(r0, r1):
            o = (i - r0) * w
            slot = noise[o:o + w]
            cache[8] = 0
            j = w
            for t in range(kk):  # partial Fisher-Yates
                wd = slot[t]
                if wd > lims[t]:
                    wd, j = _redraw(wd, lims[t], nkey, i, slot, j, cache, w)
                r = t + np.int64(wd % np.uint64(d - t))
                rs[t] = r
                tmp = perm[t]
                perm[t] = perm[r]
                perm[r] = tmp
            for t in range(kk):
                sel[t] = perm[t]
            for t in range(kk - 1, -1, -1):  # undo the swaps: perm is the identity again
                r = rs[t]
                tmp = perm[t]
                perm[t] = perm[r]
                perm[r] = tmp
            for t in range(1, kk):  # insertion sort of the (few) sampled attributes
                v = sel[t]
                q = t - 1
                while q >= 0 and sel[q] > v:
                    sel[q + 1] = sel[q]
                    q -= 1
                sel[q + 1] = v
            for t in range(kk):
                col = sel[t]
                xv = x[i, col]
                base = kk + t * wb
                idx_out[i, t] = col
                if hm and not slot[base] < t_alpha:
                    rep_out[i, t] = _duchi_code(xv, slot[base + 1], d_tlo, d_s, m)
                else:
                    wd = slot[base + 1 if hm else base]
                    if wd > zlim:
                        wd, j = _redraw(wd, zlim, nkey, i, slot, j, cache, w)
                    rep_out[i, t] = _pm_cell(xv, wd, l_f, k, a, b, d_ab, d_f, ka1)
    return idx_out, rep_out


# ------------------------------------------------------------------ the server's aggregate
@nb.njit(cache=True, nogil=True)
def cell_moments(c):
    """``[Σ c, Σ c^2]`` of cell indices (int64, exact): PM's aggregate, one pass."""
    s1 = np.int64(0)
    s2 = np.int64(0)
    for i in range(c.shape[0]):
        v = np.int64(c[i])
        s1 += v
        s2 += v * v
    out = np.empty(2, dtype=np.int64)
    out[0] = s1
    out[1] = s2
    return out


@nb.njit(cache=True, nogil=True)
def hm_moments(c, m):
    """``[PM reports, Σ c, Σ c^2 over them, codes M (-B), codes M + 1 (+B)]`` (int64): HM's aggregate, one pass."""
    out = np.zeros(5, dtype=np.int64)
    for i in range(c.shape[0]):
        v = np.int64(c[i])
        if v < m:
            out[0] += 1
            out[1] += v
            out[2] += v * v
        elif v == m:
            out[3] += 1
        else:
            out[4] += 1
    return out


# ------------------------------------------------------------------ numpy twins
def np_cell_moments(c: np.ndarray) -> np.ndarray:
    """Twin of :func:`cell_moments`."""
    v = np.asarray(c).astype(np.int64)
    return np.array([v.sum(), (v * v).sum()], dtype=np.int64)


def np_hm_moments(c: np.ndarray, m: int) -> np.ndarray:
    """Twin of :func:`hm_moments`."""
    v = np.asarray(c).astype(np.int64)
    pm = v[v < m]
    return np.array([pm.size, pm.sum(), (pm * pm).sum(), np.count_nonzero(v == m), np.count_nonzero(v > m)],
                    dtype=np.int64)


class _Ext:
    """Each row's draws past its slot (:class:`~estimators.reference.Draws`, one per row, made on first use) and
    the index of its next draw."""

    def __init__(self, nkey, slots: np.ndarray) -> None:
        self.nkey, self.slots, self.skip = nkey, slots, slots.shape[1]
        self.draws: dict[int, Draws] = {}
        self.next: dict[int, int] = {}

    def __call__(self, i: int) -> np.uint64:
        if i not in self.draws:
            self.draws[i] = Draws(self.nkey, NOISE_EXT, i, self.slots[i], skip=self.skip)
            self.next[i] = self.skip
        j = self.next[i]
        self.next[i] = j + 1
        return self.draws[i](j)


def _np_redraw(w: np.ndarray, lim, rows: np.ndarray, ext: _Ext) -> np.ndarray:
    """``w`` with every word above ``lim`` redrawn from its row's extension stream (row ``rows[q]`` for
    ``w[q]``)."""
    w = w.copy()
    lim = np.uint64(lim)
    for q in np.nonzero(w > lim)[0]:
        while w[q] > lim:
            w[q] = ext(int(rows[q]))
    return w


def np_pm_cells(x: np.ndarray, w: np.ndarray, l: int, k: int, a: int, b: int, zlim: int, rows: np.ndarray,
                ext: _Ext) -> np.ndarray:
    """The twin of :func:`_pm_cell` for inputs ``x`` and words ``w`` of rows ``rows`` (int64 cells)."""
    a, b, zlim = np.uint64(a), np.uint64(b), np.uint64(zlim)
    d_ab = a - b
    t = (x + 1.0) * 0.5 * float(l)
    s0 = np.minimum(np.floor(t), float(l) - 1.0)
    f = t - s0
    q = np.minimum(np.rint(np.where(f >= 1.0, 0.0, f) * float(d_ab)).astype(np.uint64), d_ab)
    q = np.where(f >= 1.0, d_ab, q)
    s = s0.astype(np.int64)
    w = _np_redraw(w, zlim, rows, ext)
    ka1 = a * np.uint64(k - 1)
    inner = s + 1 + (w // a).astype(np.int64)
    v = w - ka1                                   # wraps where w < ka1: not used there
    edge = np.where(v < a - q, s, s + k)
    u = ((v - a - b) // b).astype(np.int64)       # wraps where v < a + b: not used there
    far = np.where(u < s, u, u + k + 1)
    return np.where(w < ka1, inner, np.where(v < a + b, edge, far))


def _np_duchi(x: np.ndarray, w: np.ndarray, d_tlo: int, d_s: float, m: int) -> np.ndarray:
    thr = (np.int64(d_tlo) + np.rint((x + 1.0) * d_s).astype(np.int64)).astype(np.uint64)
    return np.where((w >> _SHIFT53) < thr, m + 1, m).astype(np.int64)


def np_pm_randomize(x: np.ndarray, nkey: np.ndarray, l: int, k: int, a: int, b: int, zlim: int,
                    dtype=np.uint32) -> np.ndarray:
    """The numpy twin of :func:`pm_randomize` (vectorized; a Python loop only over redrawn rows)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    slots = noise_slots(nkey, n, PM_SLOT)
    return np_pm_cells(x, slots[:, 0], l, k, a, b, zlim, np.arange(n), _Ext(nkey, slots)).astype(dtype)


def np_pm_randomize_values(v: np.ndarray, lo: float, hi: float, nkey: np.ndarray, l: int, k: int, a: int, b: int,
                           zlim: int, dtype=np.uint32) -> np.ndarray:
    """The numpy twin of :func:`pm_randomize_values`: :func:`np_pm_randomize` of ``to_unit(v, lo, hi)``."""
    return np_pm_randomize(to_unit(v, lo, hi)[0], nkey, l, k, a, b, zlim, dtype=dtype)


def np_hm_randomize(x: np.ndarray, nkey: np.ndarray, t_alpha: int, l: int, k: int, a: int, b: int, zlim: int,
                    d_tlo: int, d_s: float) -> np.ndarray:
    """The numpy twin of :func:`hm_randomize`."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    slots = noise_slots(nkey, n, HM_SLOT)
    rows = np.nonzero(slots[:, 0] < np.uint64(t_alpha))[0]
    out = _np_duchi(x, slots[:, 1], d_tlo, d_s, l + k)
    out[rows] = np_pm_cells(x[rows], slots[rows, 1], l, k, a, b, zlim, rows, _Ext(nkey, slots))
    return out.astype(np.uint32)


def np_kofd_randomize(x: np.ndarray, nkey: np.ndarray, kk: int, lims: np.ndarray, hm: bool, t_alpha: int,
                      l: int, k: int, a: int, b: int, zlim: int, d_tlo: int, d_s: float,
                      dtype=np.uint32) -> tuple[np.ndarray, np.ndarray]:
    """The numpy twin of :func:`kofd_randomize`: ``(indices uint16 (n, kk), reports (n, kk))``."""
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    wb = HM_SLOT if hm else PM_SLOT
    w = kk + kk * wb
    slots = noise_slots(nkey, n, w)
    rows = np.arange(n)
    ext = _Ext(nkey, slots)
    perm = np.tile(np.arange(d, dtype=np.int64), (n, 1))
    for t in range(kk):
        wd = _np_redraw(slots[:, t], lims[t], rows, ext)
        r = t + (wd % np.uint64(d - t)).astype(np.int64)
        held = perm[rows, t].copy()
        perm[rows, t] = perm[rows, r]
        perm[rows, r] = held
    sel = np.sort(perm[:, :kk], axis=1)
    reports = np.empty((n, kk), dtype=np.int64)
    for t in range(kk):
        xv = x[rows, sel[:, t]]
        base = kk + t * wb
        if hm:
            pm = slots[:, base] < np.uint64(t_alpha)
            reports[:, t] = _np_duchi(xv, slots[:, base + 1], d_tlo, d_s, l + k)
            off = base + 1
        else:
            pm = np.ones(n, dtype=bool)
            off = base
        pr = rows[pm]
        reports[pr, t] = np_pm_cells(xv[pm], slots[pr, off], l, k, a, b, zlim, pr, ext)
    return sel.astype(np.uint16), reports.astype(dtype)
