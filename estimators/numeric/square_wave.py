"""Square Wave (SW) with EMS reconstruction of the distribution (Li, Wang, Lopuhaä-Zwakenberg, Li & Škorić,
"Estimating Numerical Distributions under Local Differential Privacy", SIGMOD 2020; below "Li et al.").

**The paper's mechanism** (Li et al., §4). Input ``v in [0, 1]`` (here ``v = (x + 1) / 2`` of the unit input
``x in [-1, 1]``), output ``ṽ in [-b, 1 + b]`` with density ``p`` where ``|ṽ - v| <= b`` and ``q`` elsewhere,
``p = e^ε / (2 b e^ε + 1)``, ``q = 1 / (2 b e^ε + 1)`` (so ``2 b p + q = 1`` and ``p / q = e^ε``), and the
``b`` that maximizes the upper bound on the mutual information between input and output (Li et al., §4.2):

    ``b = (ε e^ε - e^ε + 1) / (2 e^ε (e^ε - 1 - ε))``

(``b -> 1/2`` as ``ε -> 0``: numerator and denominator are ``ε^2/2 + O(ε^3)`` and ``ε^2 + O(ε^3)``; ``b -> 0``
as ``ε -> ∞``.) The server bins the outputs into ``d_out`` buckets and reconstructs a histogram over ``d_in``
input buckets with EMS (Li et al., §5).

**The implemented law: discrete, and exact.** A continuous ṽ in floating point is neither sampleable exactly
nor needed (the server buckets it anyway), so the output space *is* the ``d_out`` cells of ``[-b', 1 + b']``:

* ``K = round(2b d_out / (1 + 2b))`` cells form a window (clamped to ``[1, d_out - 1]``), ``L = d_out - K``; a
  window starts at cell ``s in {0, ..., L}``, cell width ``h = 1 / L`` in units of ``v`` and the implemented
  ``b' = K / (2L)`` (``≈ b``): the window of ``v = s / L`` covers ``[v - b', v + b']`` exactly.
* The input is the grid ``v_i = i / (d_in - 1)``, ``i = 0 .. d_in - 1``: ``v`` is rounded to ``v_i`` or
  ``v_{i+1}`` without bias (randomized rounding, probability ``ceil(f 2^53) / 2^53`` of rounding up,
  ``f = v (d_in - 1) - i``). Grid point ``i`` starts its window at ``s_lo[i] = floor(i L / (d_in - 1))`` or one
  cell later with probability ``π_i = round(r_i 2^53 / (d_in - 1)) / 2^53``, ``r_i = i L mod (d_in - 1)`` (an
  exact integer threshold): ``E[s | i] = i L / (d_in - 1)`` up to ``2^-54``, so ``E[s | v] = v L``.
* "Near" with probability ``P = T / 2^64``, ``T = floor(2^64 K e^ε / (K e^ε + L))`` (one 64-bit word against
  the integer ``T``), then a uniform cell of the window, else a uniform cell outside it (exact uniform draws:
  :mod:`.sw_kernels`). Every cell of the window has mass ``p_c = T / (2^64 K)`` and every other cell
  ``q_c = (2^64 - T) / (2^64 L)`` for every start: the law of each input is a mixture of such laws.

**Privacy.** Every cell's mass lies in ``[q_c, p_c]`` for every input, and a cell inside the window of
``x = -1`` (start 0) but outside that of ``x = 1`` (start ``L``) attains both ends, so the implemented ε is
exactly ``eps_first = log(p_c / q_c) = log(T L / ((2^64 - T) K)) <= ε`` (floor of ``T``), below ``ε`` by a
relative ``~ 2^-64 e^ε / ε``.

**Mean (unbiased, linear).** With cells indexed ``0 .. d_out - 1``, a window at ``s`` gives
``E[c | s] = P (s + (K - 1)/2) + (1 - P) F(s)``, ``F(s)`` the mean far cell
``= ((d_out (d_out - 1) - K (K - 1)) / 2 - K s) / L = (d_out + K - 1) / 2 - K s / L``, hence
``E[c | v] = a L v + c0`` with ``a = P - (1 - P) K / L`` (``> 0`` since ``p_c > q_c``) and
``c0 = (P (K - 1) + (1 - P)(d_out + K - 1)) / 2``: affine in ``v``. So ``x̂(c) = 2 (c - c0) / (a L) - 1`` is an
unbiased estimate of ``x`` per report (:meth:`SW.unit_outputs`) and the unit mean is
``2 (sum c / n - c0) / (a L) - 1`` (:meth:`SW.estimate_unit_mean`). Its variance
``4 Var(c | x) / (a L)^2`` is computed exactly from the law: ``E[c^2 | s]`` in closed form
(``Σ_{k < m} k^2 = (m - 1) m (2m - 1) / 6``) mixed over the (at most four) starts of ``x``
(:meth:`SW.unit_variance`).

**Distribution (EMS, Li et al., §5).** The transition matrix ``M`` (``d_out × d_in``, column ``i`` the exact
law of grid point ``i``) is ``q_c 1 1ᵀ + (p_c - q_c) W Gᵀ`` with ``W`` the window indicator (``d_out × (L+1)``)
and ``G`` the start law of the grid points (``d_in × (L+1)``, two entries a row): ``M θ`` and ``Mᵀ y`` cost
``O(d_in + d_out)`` with cumulative sums (:meth:`SW.forward`, :meth:`SW.adjoint`). EMS: ``θ`` uniform; repeat
the EM step ``θ <- θ ⊙ Mᵀ (c / M θ)`` (normalized), then the smoothing ``θ_i <- (θ_{i-1} + 2 θ_i + θ_{i+1}) / 4``
(binomial weights; the end points take ``(2 θ_0 + θ_1) / 3`` and ``(θ_{d-2} + 2 θ_{d-1}) / 3``, as in public
implementations derived from the authors' code), until the log-likelihood ``Σ c log (M θ)`` changes by at most
``tol`` times its magnitude (Li et al. stop on the log-likelihood's improvement; those implementations use an
absolute ``1e-3``). ``tol = 1e-9`` by default: with ``1e-6`` EMS stopped early (Beta(2, 5), n = 10^5, ε = 1:
W1 0.010-0.014 against 0.005-0.006, and the 0.99 quantile 0.89 for 0.71). The numba kernel
:func:`.sw_kernels.sw_ems` runs the rows (bootstrap replicates); :meth:`SW.ems_numpy` is its twin.
The estimate is a histogram over the ``d_in`` grid points: that of the randomized-rounded inputs, i.e. the input
distribution smoothed by a hat of half-width ``1 / (d_in - 1)``.

**Quantile intervals.** A parametric bootstrap (Efron & Tibshirani, "An Introduction to the Bootstrap", 1993,
§6 and §13): ``B`` count vectors drawn from ``Multinomial(n, M θ̂)``, each reconstructed by EMS, estimate each
quantile's sd ``σ*`` and bias ``β*``; the default interval ``q̂ ± (z σ* + |β*|)`` allows for a bias of
either sign up to ``|β*|`` (:meth:`SW.quantile_intervals`). The bias-corrected centre ``q̂ - β*`` is not used:
the replicates come from the smoother ``θ̂``, so ``β*`` misjudges EMS's smoothing bias at ``θ`` (in our
simulations it recentred the wrong way on fine grids). The default therefore also widens each interval by ``g``,
the distance between EMS's quantile and that of :data:`EM_REFINE_ITERATIONS` unsmoothed EM steps from ``θ̂``
(towards the maximum-likelihood estimate, which has no smoothing bias): on the fleet's drifting metric
(``producers.datasets.DriftingMetric``, ε = 1, d = 64, n = 2·10^4, 40 steps) it took the misses of the
0.5 / 0.9 / 0.99 quantiles from 3 / 1 / 7 to 0 / 0 / 2. The figures below are without ``g``. Measured coverage of the devices' true 0.5 / 0.9 / 0.99
quantiles (ε = 1, n = 10^4, B = 50): Beta(2, 5), d = 1024: 0.97 / 0.97 / 0.97 (100 steps); d = 128:
0.98 / 0.99 / 0.93 (300 steps); d = 64: 0.95 / 0.98 / 0.80. It falls short where EMS's smoothing bias exceeds
what the bootstrap sees: sharp features on coarse grids (two narrow modes, σ = 0.05, at d = 128: the 0.99
quantile 0.01) and quantiles where the CDF is flat (the median between those modes: 0.50).
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from statistics import NormalDist
from typing import Any, NamedTuple, Sequence

import numpy as np

from ..errors import InvalidReports, LDPError
from ..randomness import noise_key, rejection_limit
from . import sw_kernels as swk
from .base import NumericMechanism, from_unit, linear_mean

__all__ = ["SW", "QuantileIntervals", "optimal_b"]

_TWO64 = 1 << 64
_TWO53 = 1 << 53
#: unsmoothed EM steps of :meth:`SW.em_refine` (the smoothing-bias term of the quantile intervals)
EM_REFINE_ITERATIONS = 1000
MAX_CELLS = 1 << 16  # reports are uint16 cell indices


def optimal_b(eps: float) -> float:
    """Li et al.'s ``b = (ε e^ε - e^ε + 1) / (2 e^ε (e^ε - 1 - ε))`` (module doc), written with ``expm1``."""
    em1 = math.expm1(eps)
    return (eps * (em1 + 1.0) - em1) / (2.0 * (em1 + 1.0) * (em1 - eps))


def _check_int(name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or int(value) != value or not lo <= value <= hi:
        raise LDPError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


class QuantileIntervals(NamedTuple):
    """Quantile estimates and their bootstrap intervals, in the metric's units (one entry per level ``qs``)."""

    qs: np.ndarray
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


class SW(NumericMechanism):
    """Square Wave on ``d_out`` output cells over ``d_in`` input grid points (module doc). Reports: uint16 cells."""

    name = "SW"
    aggregate = "distribution"

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, d_in: int = 1024, d_out: int = 1024) -> None:
        super().__init__(eps, lo, hi)
        self.d_in = _check_int("d_in (input grid points)", d_in, 2, MAX_CELLS)
        self.d_out = _check_int("d_out (output cells)", d_out, 2, MAX_CELLS)
        self.b = optimal_b(self.eps)
        k = min(max(round(2.0 * self.b * self.d_out / (1.0 + 2.0 * self.b)), 1), self.d_out - 1)
        self.k, self.l = int(k), int(self.d_out - k)
        self.b_impl = self.k / (2.0 * self.l)
        with localcontext() as ctx:
            ctx.prec = 80
            ke = Decimal(self.k) * Decimal(self.eps).exp()
            t = int((Decimal(_TWO64) * ke / (ke + Decimal(self.l))).to_integral_value(rounding="ROUND_FLOOR"))
        self.t_near = min(max(t, 1), _TWO64 - 1)
        self.p_near = self.t_near / _TWO64
        self.p_cell = float(Fraction(self.t_near, _TWO64 * self.k))
        self.q_cell = float(Fraction(_TWO64 - self.t_near, _TWO64 * self.l))
        # window starts of the grid points: s_lo[i] + Bernoulli(thr[i] / 2^53), E = i L / (d_in - 1)
        den = self.d_in - 1
        num = [i * self.l for i in range(self.d_in)]
        self.s_lo = np.array([m // den for m in num], dtype=np.int64)
        thr = [(2 * (m % den) * _TWO53 + den) // (2 * den) for m in num]
        self.s_thr = np.array(thr, dtype=np.uint64)
        self.pi = np.array(thr, dtype=np.float64) / _TWO53
        self.lim_k, self.lim_l = rejection_limit(self.k), rejection_limit(self.l)
        # the unbiased linear estimator (module doc)
        P = self.p_near
        self.slope = P - (1.0 - P) * self.k / self.l
        self.c0 = 0.5 * (P * (self.k - 1) + (1.0 - P) * (self.d_out + self.k - 1))
        # index tables of the structured operator
        starts = np.arange(self.l + 1)
        self._a_lo = np.searchsorted(self.s_lo, starts, side="left")
        self._a_hi = np.searchsorted(self.s_lo, starts, side="right")
        self._b_lo = np.searchsorted(self.s_lo + 1, starts, side="left")
        self._b_hi = np.searchsorted(self.s_lo + 1, starts, side="right")
        cells = np.arange(self.d_out)
        self._win_hi = np.minimum(cells, self.l) + 1
        self._win_lo = np.maximum(cells - self.k + 1, 0)
        self._s_next = np.minimum(self.s_lo + 1, self.l)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "d_in": self.d_in, "d_out": self.d_out}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """``log(T L / ((2^64 - T) K))``: the exact ε of the implemented law, ``<= eps`` (module doc)."""
        with localcontext() as ctx:
            ctx.prec = 60
            return float(Decimal(self.t_near * self.l).ln() - Decimal((_TWO64 - self.t_near) * self.k).ln())

    def _start_law(self, x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """The window starts of unit inputs ``x`` and their probabilities, ``(n, 4)`` each (exact)."""
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        t = (x + 1.0) * 0.5 * float(self.d_in - 1)
        i0 = np.clip(np.floor(t).astype(np.int64), 0, self.d_in - 2)
        pu = np.ceil((t - i0) * float(_TWO53)) / float(_TWO53)
        i1 = i0 + 1
        starts = np.stack([self.s_lo[i0], self.s_lo[i0] + 1, self.s_lo[i1], self.s_lo[i1] + 1], axis=1)
        probs = np.stack([(1 - pu) * (1 - self.pi[i0]), (1 - pu) * self.pi[i0],
                          pu * (1 - self.pi[i1]), pu * self.pi[i1]], axis=1)
        return np.minimum(starts, self.l), probs

    def cell_mass(self, x: float) -> np.ndarray:
        """``P[report = c | x]`` for every cell ``c``, ``(d_out,)``: exact (a mixture of window laws)."""
        starts, probs = self._start_law(float(x))
        c = np.arange(self.d_out)
        inside = np.zeros(self.d_out, dtype=np.float64)
        for s, w in zip(starts[0], probs[0]):
            inside += w * ((c >= s) & (c < s + self.k))
        return self.q_cell + (self.p_cell - self.q_cell) * inside

    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """Mass of the output value ``x̂(c)`` (:meth:`unit_outputs`) in each bin of ``edges``."""
        e = np.asarray(edges, dtype=np.float64)
        vals = self.unit_outputs(np.arange(self.d_out))
        j = np.searchsorted(e, vals, side="right") - 1
        j[vals == e[-1]] = e.shape[0] - 2
        keep = (j >= 0) & (j < e.shape[0] - 1)
        return np.bincount(j[keep], weights=self.cell_mass(x)[keep], minlength=e.shape[0] - 1)

    # ---------------------------------------------------------------- device side
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        x, _ = self.prepare(values)
        return swk.sw_randomize(np.ascontiguousarray(x), noise_key(rng), self.d_in, self.s_lo, self.s_thr,
                                np.uint64(self.t_near), self.k, self.l, self.lim_k, self.lim_l)

    # ---------------------------------------------------------------- reports
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint16)

    def validate_reports(self, reports: np.ndarray) -> None:
        super().validate_reports(reports)
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"SW reports are one cell index each, got shape {r.shape}")
        if r.size and int(r.max()) >= self.d_out:
            raise InvalidReports(f"an SW report names a cell outside [0, {self.d_out})")

    def support(self, reports: np.ndarray) -> np.ndarray:
        """Reports per output cell, ``int64 (d_out,)`` (the aggregate the store keeps)."""
        self.validate_reports(reports)
        return np.bincount(np.asarray(reports), minlength=self.d_out).astype(np.int64)

    @property
    def support_size(self) -> int:
        return self.d_out

    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """The unbiased linear mean (:meth:`estimate_unit_mean`) and the sample variance of ``x̂(c)`` over ``n``,
        from the cell counts (exact integer moments)."""
        c = np.asarray(support).astype(np.int64)
        if c.min() < 0 or int(c.sum()) != n:
            raise LDPError(f"SW: the cell counts sum to {int(c.sum())}, not n = {n}")
        idx = np.arange(self.d_out, dtype=np.int64)
        z1, z2 = int(np.dot(idx, c)), int(np.dot(idx * idx, c))
        slope = 2.0 / (self.slope * self.l)
        return linear_mean(z1, z2, n, slope, -slope * self.c0 - 1.0)

    def unit_outputs(self, reports: np.ndarray) -> np.ndarray:
        """Each report's unbiased estimate ``x̂(c) = 2 (c - c0) / (a L) - 1`` of its unit input (module doc)."""
        return 2.0 * (np.asarray(reports, dtype=np.float64) - self.c0) / (self.slope * self.l) - 1.0

    # ---------------------------------------------------------------- mean
    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        """``2 (Σ c / n - c0) / (a L) - 1`` from the sum of the reports' cell indices (module doc)."""
        if n <= 0:
            raise LDPError("no report: no mean")
        return 2.0 * (float(report_sum) / n - self.c0) / (self.slope * self.l) - 1.0

    def estimate_mean_from_counts(self, counts: np.ndarray, n: int) -> float:
        """The unbiased mean (metric units) from the cell counts: the linear estimator of ``Σ c counts[c]``."""
        c = self._check_counts(counts, n)
        return self.estimate_mean(float(np.dot(np.arange(self.d_out, dtype=np.float64), c)), n)

    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``4 Var(c | x) / (a L)^2``, exact for the implemented law (module doc)."""
        scalar = np.ndim(x) == 0
        starts, probs = self._start_law(x)
        s = starts.astype(np.float64)
        P, K, L, D = self.p_near, float(self.k), float(self.l), float(self.d_out)

        def sq(m):  # Σ_{k < m} k^2
            return (m - 1.0) * m * (2.0 * m - 1.0) / 6.0

        mean_c = P * (s + (K - 1.0) / 2.0) + (1.0 - P) * ((D + K - 1.0) / 2.0 - K * s / L)
        win2 = sq(s + K) - sq(s)
        sq_c = P * win2 / K + (1.0 - P) * (sq(D) - win2) / L
        m1 = np.sum(probs * mean_c, axis=1)
        var = np.sum(probs * sq_c, axis=1) - m1 * m1
        v = 4.0 * var / (self.slope * self.l) ** 2
        return float(v[0]) if scalar else v

    # ---------------------------------------------------------------- distribution
    def grid(self) -> np.ndarray:
        """The input grid points in the metric's units, ``(d_in,)``: what the distribution is over."""
        return self.lo + (self.hi - self.lo) * np.arange(self.d_in) / (self.d_in - 1)

    def start_matrix(self) -> np.ndarray:
        """``G`` (``d_in × (L + 1)``): the window-start law of each grid point (dense; for checks)."""
        g = np.zeros((self.d_in, self.l + 1))
        rows = np.arange(self.d_in)
        g[rows, self.s_lo] += 1.0 - self.pi
        g[rows, self._s_next] += self.pi
        return g

    def transition_matrix(self) -> np.ndarray:
        """``M`` (``d_out × d_in``): ``M[c, i] = P[report = c | grid point i]``, exact (dense)."""
        c = np.arange(self.d_out)[:, None]
        s = np.arange(self.l + 1)[None, :]
        w = ((c >= s) & (c < s + self.k)).astype(np.float64)
        return self.q_cell + (self.p_cell - self.q_cell) * (w @ self.start_matrix().T)

    def forward(self, theta: np.ndarray) -> np.ndarray:
        """``θ Mᵀ`` for rows ``θ`` (``(B, d_in)`` -> ``(B, d_out)``) in ``O(d_in + d_out)`` per row."""
        theta = np.atleast_2d(theta)
        zero = np.zeros((theta.shape[0], 1))
        ca = np.concatenate([zero, np.cumsum(theta * (1.0 - self.pi), axis=1)], axis=1)
        cb = np.concatenate([zero, np.cumsum(theta * self.pi, axis=1)], axis=1)
        w = ca[:, self._a_hi] - ca[:, self._a_lo] + cb[:, self._b_hi] - cb[:, self._b_lo]  # (B, L + 1)
        cw = np.concatenate([zero, np.cumsum(w, axis=1)], axis=1)
        inside = cw[:, self._win_hi] - cw[:, self._win_lo]
        return self.q_cell * theta.sum(axis=1, keepdims=True) + (self.p_cell - self.q_cell) * inside

    def adjoint(self, y: np.ndarray) -> np.ndarray:
        """``y M`` for rows ``y`` (``(B, d_out)`` -> ``(B, d_in)``) in ``O(d_in + d_out)`` per row."""
        y = np.atleast_2d(y)
        cy = np.concatenate([np.zeros((y.shape[0], 1)), np.cumsum(y, axis=1)], axis=1)
        starts = np.arange(self.l + 1)
        ws = cy[:, starts + self.k] - cy[:, starts]  # window sums, (B, L + 1)
        inside = (1.0 - self.pi) * ws[:, self.s_lo] + self.pi * ws[:, self._s_next]
        return self.q_cell * y.sum(axis=1, keepdims=True) + (self.p_cell - self.q_cell) * inside

    @staticmethod
    def smooth(theta: np.ndarray) -> np.ndarray:
        """The binomial smoothing ``[1, 2, 1] / 4`` of rows ``θ`` (ends ``[2, 1] / 3``), Li et al., §5."""
        out = np.empty_like(theta)
        out[:, 1:-1] = (theta[:, :-2] + 2.0 * theta[:, 1:-1] + theta[:, 2:]) / 4.0
        out[:, 0] = (2.0 * theta[:, 0] + theta[:, 1]) / 3.0
        out[:, -1] = (theta[:, -2] + 2.0 * theta[:, -1]) / 3.0
        return out

    def ems(self, counts: np.ndarray, tol: float = 1e-9, max_iter: int = 10000) -> np.ndarray:
        """EMS (module doc) on count rows ``(B, d_out)``, each until its own stopping rule: ``(B, d_in)``
        (the numba kernel :func:`.sw_kernels.sw_ems`)."""
        counts = np.ascontiguousarray(np.atleast_2d(np.asarray(counts, dtype=np.float64)))
        theta, _ = swk.sw_ems(counts, self.pi, self.s_lo, self._s_next, self.k, self.l, self.q_cell,
                              self.p_cell - self.q_cell, float(tol), int(max_iter))
        return theta

    def ems_numpy(self, counts: np.ndarray, tol: float = 1e-9, max_iter: int = 10000) -> np.ndarray:
        """The numpy twin of :meth:`ems` (rows vectorized with :meth:`forward` / :meth:`adjoint`)."""
        counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
        nb_ = counts.shape[0]
        theta = np.full((nb_, self.d_in), 1.0 / self.d_in)
        pm = self.forward(theta)
        ll = np.sum(counts * np.log(pm), axis=1)
        active = np.arange(nb_)
        for _ in range(int(max_iter)):
            th, c = theta[active], counts[active]
            th = th * self.adjoint(c / pm[active])
            th = self.smooth(th / th.sum(axis=1, keepdims=True))
            th /= th.sum(axis=1, keepdims=True)
            p_new = self.forward(th)
            ll_new = np.sum(c * np.log(p_new), axis=1)
            done = np.abs(ll_new - ll[active]) <= tol * np.abs(ll[active])
            theta[active], pm[active], ll[active] = th, p_new, ll_new
            active = active[~done]
            if active.size == 0:
                break
        return theta

    def em_refine(self, counts: np.ndarray, theta: np.ndarray, iters: int = EM_REFINE_ITERATIONS) -> np.ndarray:
        """``iters`` EM steps without the smoothing from ``θ`` (rows), towards the maximum-likelihood estimate:
        EMS's smoothing bias shows as the distance between the two (:meth:`quantile_intervals`)."""
        c = np.atleast_2d(np.asarray(counts, dtype=np.float64))
        th = np.array(np.atleast_2d(theta), dtype=np.float64)
        for _ in range(int(iters)):
            th = th * self.adjoint(c / np.maximum(self.forward(th), 1e-300))
            th /= th.sum(axis=1, keepdims=True)
        return th

    def _check_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        c = np.asarray(counts)
        if c.shape != (self.d_out,):
            raise LDPError(f"SW counts are ({self.d_out},), got {c.shape}")
        if c.size and (not np.all(np.isfinite(c)) or c.min() < 0):
            raise LDPError("SW counts must be finite and non-negative")
        if n <= 0:
            raise LDPError("no report: no estimate")
        if not math.isclose(float(c.sum()), float(n), rel_tol=1e-12):
            raise LDPError(f"the counts sum to {float(c.sum())}, not n = {n}")
        return c.astype(np.float64)

    def estimate_distribution(self, counts: np.ndarray, n: int, tol: float = 1e-9,
                              max_iter: int = 10000) -> np.ndarray:
        """EMS estimate of the distribution over the ``d_in`` grid points (:meth:`grid`): non-negative, sums to 1."""
        return self.ems(self._check_counts(counts, n)[None, :], tol, max_iter)[0]

    def mean_of_distribution(self, dist: np.ndarray) -> float:
        """The mean (metric units) of a distribution over the grid (EMS's plug-in mean; not unbiased)."""
        return float(np.dot(np.asarray(dist, dtype=np.float64), self.grid()) / np.sum(dist))

    def _unit_quantiles(self, dist: np.ndarray, qs: np.ndarray) -> np.ndarray:
        """Quantiles in ``[0, 1]`` of distributions over the grid (rows), each grid point's mass spread uniformly
        over its cell ``[v_i - h/2, v_i + h/2] ∩ [0, 1]`` (``h = 1 / (d_in - 1)``): ``(B, len(qs))``."""
        dist = np.atleast_2d(dist)
        h = 1.0 / (self.d_in - 1)
        edges = np.concatenate([[0.0], (np.arange(self.d_in - 1) + 0.5) * h, [1.0]])
        cum = np.concatenate([np.zeros((dist.shape[0], 1)), np.cumsum(dist, axis=1)], axis=1)
        cum /= cum[:, -1:]
        out = np.empty((dist.shape[0], qs.shape[0]))
        rows = np.arange(dist.shape[0])
        for j, q in enumerate(qs):
            idx = np.clip((cum < q).sum(axis=1) - 1, 0, self.d_in - 1)
            mass = dist[rows, idx] / np.sum(dist, axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                frac = np.where(mass > 0, (q - cum[rows, idx]) / mass, 0.0)
            out[:, j] = edges[idx] + np.clip(frac, 0.0, 1.0) * (edges[idx + 1] - edges[idx])
        return out

    @staticmethod
    def _check_qs(qs: Sequence[float]) -> np.ndarray:
        q = np.atleast_1d(np.asarray(qs, dtype=np.float64))
        if q.ndim != 1 or not np.all((q >= 0) & (q <= 1)):
            raise LDPError(f"quantile levels must lie in [0, 1], got {qs!r}")
        return q

    def quantiles(self, dist: np.ndarray, qs: Sequence[float] = (0.5, 0.9, 0.99)) -> np.ndarray:
        """Quantiles of a distribution over the grid, in the metric's units (monotone in ``qs``, in [lo, hi])."""
        d = np.asarray(dist, dtype=np.float64)
        if d.shape != (self.d_in,) or d.min() < 0 or not d.sum() > 0:
            raise LDPError(f"a distribution over the grid is ({self.d_in},), non-negative, with positive mass")
        u = self._unit_quantiles(d, self._check_qs(qs))[0]
        return np.clip(self.lo + (self.hi - self.lo) * u, self.lo, self.hi)

    def quantile_intervals(self, counts: np.ndarray, n: int, qs: Sequence[float] = (0.5, 0.9, 0.99),
                           level: float = 0.95, B: int = 50, rng: np.random.Generator | None = None,
                           method: str = "bias_bounded", tol: float = 1e-9,
                           max_iter: int = 10000) -> QuantileIntervals:
        """Quantile estimates and ``level`` intervals by a parametric bootstrap (module doc): ``B`` multinomial
        count vectors from ``M θ̂``, each reconstructed by EMS, give the bootstrap sd ``σ*`` and bias
        ``β* = mean(q*) - q̂`` of each quantile. ``method``:

        * ``"bias_bounded"`` (default): ``q̂ ± (z σ* + |β*| + g)``, ``g`` the distance between EMS's quantile and
          that of :meth:`em_refine` (unsmoothed EM from ``θ̂``): covering whenever the estimator's bias is at most
          ``|β*| + g`` in magnitude, whatever its sign;
        * ``"bias_aware"``: ``q̂ ± cv(|β*| / σ*) σ*``, ``cv(t)`` the ``level`` quantile of ``|N(t, 1)|``
          (Armstrong & Kolesár, "Simple and Honest Confidence Intervals in Nonparametric Regression",
          Quantitative Economics 2020, §2): narrower, same premise;
        * ``"percentile"`` (``q*`` quantiles) and ``"basic"`` (``2 q̂ - q*``), Efron & Tibshirani, 1993, §13.

        EMS's smoothing bias is what the bootstrap underestimates (the replicates are drawn from the smoother
        ``θ̂``); the default's coverage was measured by simulation (tests/test_numeric_square_wave.py).
        ``rng``: the server's resampling Generator (seeded for reproducibility)."""
        if not 0 < level < 1:
            raise LDPError(f"level must lie in (0, 1), got {level}")
        if isinstance(B, bool) or int(B) != B or B < 2:
            raise LDPError(f"B must be an integer >= 2, got {B}")
        if method not in ("bias_bounded", "bias_aware", "basic", "percentile"):
            raise LDPError(f"unknown interval method {method!r}")
        q = self._check_qs(qs)
        c = self._check_counts(counts, n)
        gen = rng if rng is not None else np.random.default_rng()
        theta = self.ems(c[None, :], tol, max_iter)
        est = self._unit_quantiles(theta, q)[0]
        probs = np.clip(self.forward(theta)[0], 0.0, None)
        boot = gen.multinomial(int(round(c.sum())), probs / probs.sum(), size=int(B)).astype(np.float64)
        qb = self._unit_quantiles(self.ems(boot, tol, max_iter), q)
        sd, bias = qb.std(axis=0, ddof=1), qb.mean(axis=0) - est
        if method == "bias_bounded":
            gap = np.abs(self._unit_quantiles(self.em_refine(c, theta), q)[0] - est)
            half = NormalDist().inv_cdf(0.5 + level / 2.0) * sd + np.abs(bias) + gap
            lower, upper = est - half, est + half
        elif method == "bias_aware":
            half = np.array([_folded_normal_quantile(abs(b) / s, level) * s if s > 0 else abs(b)
                             for b, s in zip(bias, sd)])
            lower, upper = est - half, est + half
        else:
            a, b = np.quantile(qb, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0)
            lower, upper = (a, b) if method == "percentile" else (2.0 * est - b, 2.0 * est - a)
        to = lambda u: np.clip(self.lo + (self.hi - self.lo) * np.clip(u, 0.0, 1.0), self.lo, self.hi)  # noqa: E731
        return QuantileIntervals(q, to(est), to(lower), to(upper))


def _folded_normal_quantile(t: float, level: float) -> float:
    """``c`` with ``P[|N(t, 1)| <= c] = level`` (bisection; ``c`` in ``[t, t + 10]``)."""
    nd = NormalDist()
    lo, hi = 0.0, t + 10.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if nd.cdf(mid - t) - nd.cdf(-mid - t) < level:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)
