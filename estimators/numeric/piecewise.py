"""The Piecewise Mechanism (PM), the Hybrid Mechanism (HM) and their k-of-d sampling for ``d`` attributes
(Wang, Xiao, Yang, Zhao, Hu, Cho, Shin & Xiao, "Collecting and Analyzing Multidimensional Data with Local
Differential Privacy", ICDE 2019; below "Wang et al."), on an exact discrete output grid.

**The paper's PM** (Wang et al., §III-B, Algorithm 2). With ``a = e^{ε/2}`` and ``C = (a + 1) / (a - 1)``, an
input ``x in [-1, 1]`` has the window ``[ℓ(x), r(x)]``, ``ℓ(x) = (C + 1) / 2 · x - (C - 1) / 2``,
``r(x) = ℓ(x) + C - 1``; the output is uniform on the window with probability ``a / (a + 1)``, else uniform on
``[-C, ℓ(x)) ∪ (r(x), C]``: density ``p = (e^ε - a) / (2a + 2)`` on the window and ``p / e^ε`` outside
(survey of Wang, Zhang, Feng & Yang, Eq. 62). It is unbiased with
``Var = x^2 / (a - 1) + (a + 3) / (3 (a - 1)^2)`` (Wang et al., §III-B, the variance lemma; the worst case
``4a / (3 (a - 1)^2)`` at ``x = ±1`` is the survey's Table IX entry). Derivation check: the window has width
``C - 1 = 2 / (a - 1)``, so ``p (C - 1) = a / (a + 1)`` and the far mass ``(p / e^ε)(C + 1) = 1 / (a + 1)``;
:meth:`PM.paper_variance` is the limit of the implemented variance on finer grids (the tests).

**Why a grid.** The paper's output is a real number. Sampled in floating point, the output's low-order bits
depend on how the sampler rounds ``ℓ(x) + u (C - 1)``: the set of representable outputs differs between
inputs, so the float output can reveal the input beyond the law (Mironov, CCS 2012, for Laplace), and its ε
cannot be computed from the law. This implementation samples an exact *discrete* PM instead, whose ε is
computed from the integer cell masses, and reports integers:

* **Cells.** ``M = 2^grid_bits`` cells (default ``2^16``: ``uint16`` reports; finer grids ``uint32``), a
  window of ``K = round(M / (a + 1))`` cells (the paper's window-to-range ratio ``(C - 1) / (2C)``), clamped
  to ``[1, M / 2]``, and ``L = M - K``. The window of an input starts at a cell ``s in {0, ..., L}``.
* **Cell masses.** Integers ``B = floor(2^64 / (K e^ε + L))`` and ``A = floor(B e^ε)`` (80-digit decimal
  arithmetic), ``Z = K A + L B <= 2^64``: for a window at ``s``, its ``K`` cells have mass ``A / Z`` each and
  the ``L`` others ``B / Z``. The piece is thus chosen with the exact probability ``P = K A / Z`` (the paper's
  ``a / (a + 1)`` up to the rounding of ``K``) and the cell within it is exactly uniform.
* **Input rounding.** ``t = (x + 1) / 2 · L`` is rounded to ``s0 = min(floor t, L - 1)`` or ``s0 + 1``, up with
  probability ``π = q / D``, ``D = A - B``, ``q = rint((t - s0) D)`` (``x = -1`` starts at cell 0, ``x = 1`` at
  cell ``L``: the window ends at the last cell, as ``ℓ(-1) = -C`` and ``r(1) = C``). ``E[s | x] = t`` up to
  ``1 / (2D) + 2^-53`` cells (``D >= 2^32`` is required).
* **Sampling.** The mixture of the two windows has integer masses over ``Z`` (cell ``s0``: ``A - q``, cell
  ``s0 + K``: ``B + q``, the ``K - 1`` cells between: ``A``, the rest ``B``), so one 64-bit ChaCha20 word per
  report, compared with integer thresholds, draws the cell exactly (:mod:`.piecewise_kernels`).

**Privacy.** For every input, each cell's mass is a mixture (over the two starts) of ``A / Z`` and
``B / Z``; cells ``0 .. K-1`` are in the window of ``x = -1`` and outside that of ``x = 1`` (``K <= L``), so
the implemented ε is exactly ``eps_first = log(A / B) <= ε``, below ``ε`` by less than ``1 / A`` (``A``
``>= 2^64 / M``). For very large ε (``K e^ε + L > 2^64``) ``B = 1`` and ``A = floor((2^64 - L) / K)``:
``eps_first`` saturates below ε.

**Estimator.** Cell ``c``'s value is ``x̂(c) = (2c + 1 - M) / (σ L)`` with the slope
``σ = P - (1 - P) K / L = K (A - B) / Z``: the cell centre of ``[-C', C']``, ``C' = M / (σ L)`` (the
implemented ``C``, which tends to the paper's as the grid gets finer). It is unbiased for the implemented law:
a window at ``s`` gives ``E[c | s] = (M - 1) / 2 + σ (s - L/2)`` (the window's mean ``s + (K - 1)/2`` with
mass ``P``, the far cells' ``((M (M-1) - K (K-1)) / 2 - K s) / L`` with ``1 - P``), and ``E[s | x] = t``, so
``E[x̂ | x] = x`` up to ``(1/D + 2^-52) / L``. The unit mean is ``(2 Σc / n + 1 - M) / (σ L)`` from the sum of
the reports' cell indices (:meth:`PM.estimate_unit_mean`).

**Variance of the implemented law** (:meth:`PM.unit_variance`): ``4 Var(c | x) / (σ L)^2`` with
``Var(c | x) = E_s[Var(c | s)] + π (1 - π) σ^2`` (the two starts) and
``Var(c | s) = P (K^2 - 1)/12 + (1 - P) V_far(s) + P (1 - P) (μ_win - μ_far)^2``, ``V_far`` the variance of the
far cells (two runs of consecutive integers). It converges to the paper's formula as ``M`` grows (the
discretisation adds ``O(h^2)``, ``h = 2C / M``, and the rounding of ``K`` changes ``P`` by ``O(1/K)``).

**HM** (Wang et al., §III-C). With probability ``α`` report PM's cell (with ε), else Duchi et al.'s sign
(Wang et al., Algorithm 1: ``+B`` with probability ``(e^ε - 1) / (2e^ε + 2) x + 1/2``,
``B = (e^ε + 1) / (e^ε - 1)``), with ``α = 1 - e^{-ε/2}`` for ``ε > ε*`` and ``α = 0`` otherwise,
``ε* = ln((-5 + 2 ∛(6353 - 405 √241) + 2 ∛(6353 + 405 √241)) / 27) ≈ 0.61``. Derivation: both branches are
unbiased, so ``Var_HM(x) = α Var_PM(x) + (1 - α)(B^2 - x^2)``, whose coefficient of ``x^2`` is
``α a / (a - 1) - 1``: zero at ``α = 1 - 1/a`` (the variance no longer depends on ``x``). The worst case over
``x`` is minimised there unless ``α = 0`` is better, i.e. unless ``(a + 3) / (3 (a - 1)^2) >= B^2``; equality
is ``(a + 3)(a + 1)^2 = 3 (a^2 + 1)^2``, i.e. ``3a^3 - a^2 + a - 7 = 0`` (``a = e^{ε*/2} ≈ 1.3562``), whose
root squared is the closed form above. The worst-case variance is then
``(a + 3) / (3a (a - 1)) + (e^ε + 1)^2 / (a (e^ε - 1)^2)`` (``ε > ε*``) or ``B^2`` (survey, Eq. 63): never
above PM's or Duchi's. Implemented: the branch is one 64-bit word against ``T_α = round(α 2^64)``
(``α' = T_α / 2^64``), PM is the discrete PM above, and Duchi's branch the law of :mod:`.duchi`
(``P[+B] = (T_lo + rint((x + 1) S)) / 2^53``, ``T_lo = ceil(2^53 / (e^ε + 1))``, ``S = 2^52 - T_lo``, the
implemented ``B = 2^52 / S``). A report is one ``uint32`` code: PM's cell ``0 .. M-1``, ``M`` for ``-B``,
``M + 1`` for ``+B``. The law is public, so the server telling the branch apart is harmless; each code's mass
is ``α'`` (or ``1 - α'``) times its branch's mass for every input, so
``eps_first = max(PM's, Duchi's) <= ε``. The estimate is the mean of the per-report unbiased values
(:meth:`HM.unit_outputs`), so HM's aggregate is ``Σ unit_outputs`` (:meth:`HM.summands`), not the raw codes'
sum.

**k-of-d** (Wang et al., §IV, Algorithm 4): ``k = max(1, min(d, floor(ε / 2.5)))``; a device samples ``k``
of its ``d`` attributes uniformly (from the ChaCha20 noise stream: :mod:`.piecewise_kernels`) and reports each
with ε/k by PM or HM; the server's estimate of attribute ``j``'s unit mean is ``d / k · Σ x̂ / n`` over the
reports on ``j``. Per device ``Y = (d/k) x̂ 1[j sampled]`` is unbiased with
``Var = (d/k) (Var_base(x; ε/k) + x^2) - x^2`` (for PM: ``(d/k)(a x^2 / (a - 1) + (a + 3)/(3 (a - 1)^2)) - x^2``
with ``a = e^{ε/(2k)}``). By composition over the ``k`` reports (the sampling does not depend on the data) a
device spends ``k · eps_first(ε/k) <= ε``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from decimal import ROUND_FLOOR, Decimal, localcontext
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from ..base import check_eps
from ..errors import InfeasibleParameters, InvalidReports, LDPError
from ..randomness import noise_key, rejection_limit
from . import piecewise_kernels as pk
from .base import NumericMechanism, from_unit, linear_mean, to_unit

__all__ = ["PM", "HM", "PiecewiseMultidim", "EPS_STAR", "hm_alpha", "kofd_k", "pm_paper_variance",
           "duchi_paper_variance"]

_TWO64 = 1 << 64
_TWO53 = 1 << 53
MIN_BITS, MAX_BITS = 4, 24

#: Wang et al.'s threshold below which HM is Duchi et al.'s mechanism alone (§III-C): ≈ 0.61
EPS_STAR = math.log((-5.0 + 2.0 * (6353.0 - 405.0 * math.sqrt(241.0)) ** (1.0 / 3.0)
                     + 2.0 * (6353.0 + 405.0 * math.sqrt(241.0)) ** (1.0 / 3.0)) / 27.0)


def _expm1(v: float) -> float:
    """``e^v - 1``, saturated at ``v = 700`` (no overflow for huge ε; every figure using it has converged)."""
    return math.expm1(min(v, 700.0))


def _check_bits(grid_bits: Any) -> int:
    if isinstance(grid_bits, bool) or int(grid_bits) != grid_bits or not MIN_BITS <= grid_bits <= MAX_BITS:
        raise LDPError(f"grid_bits must be an integer in [{MIN_BITS}, {MAX_BITS}], got {grid_bits!r}")
    return int(grid_bits)


def pm_paper_variance(x: np.ndarray | float, eps: float) -> np.ndarray | float:
    """The paper's PM variance ``x^2 / (a - 1) + (a + 3) / (3 (a - 1)^2)``, ``a = e^{ε/2}`` (Wang et al.,
    §III-B)."""
    am1 = _expm1(eps / 2.0)
    return np.asarray(x, dtype=np.float64) ** 2 / am1 + (am1 + 4.0) / (3.0 * am1 * am1)


def duchi_paper_variance(x: np.ndarray | float, eps: float) -> np.ndarray | float:
    """Duchi et al.'s variance ``B^2 - x^2``, ``B = (e^ε + 1) / (e^ε - 1)`` (Wang et al., §III-A)."""
    em1 = _expm1(eps)
    return ((em1 + 2.0) / em1) ** 2 - np.asarray(x, dtype=np.float64) ** 2


def hm_alpha(eps: float) -> float:
    """Wang et al.'s HM mixing probability (§III-C): ``1 - e^{-ε/2}`` for ``ε > ε*``, else 0."""
    return -math.expm1(-eps / 2.0) if eps > EPS_STAR else 0.0


def kofd_k(d: int, eps: float) -> int:
    """``k = max(1, min(d, floor(ε / 2.5)))`` (Wang et al., Algorithm 4)."""
    return max(1, min(int(d), int(math.floor(eps / 2.5))))


def _scalar(v: np.ndarray, scalar: bool) -> np.ndarray | float:
    return float(v[0]) if scalar else v


class PM(NumericMechanism):
    """Wang et al.'s Piecewise Mechanism on ``2^grid_bits`` exact output cells (module doc). Reports: cell
    indices (uint16 up to 16 bits, else uint32)."""

    name = "PM"

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, grid_bits: int = 16) -> None:
        super().__init__(eps, lo, hi)
        self.grid_bits = _check_bits(grid_bits)
        self.m = 1 << self.grid_bits
        ea = _expm1(self.eps / 2.0) + 1.0
        self.k = int(min(max(round(self.m / (ea + 1.0)), 1), self.m // 2))
        self.l = self.m - self.k
        with localcontext() as ctx:
            ctx.prec = 80
            e = Decimal(min(self.eps, 100.0)).exp()  # beyond 100 the integers saturate alike (B = 1)
            b = int((Decimal(_TWO64) / (self.k * e + self.l)).to_integral_value(rounding=ROUND_FLOOR))
            b = max(b, 1)
            a = int((b * e).to_integral_value(rounding=ROUND_FLOOR))
        a = min(a, (_TWO64 - self.l * b) // self.k)
        if a - b < 1 << 32:
            raise InfeasibleParameters(f"PM: ε = {self.eps} is too small for grid_bits = {self.grid_bits} (the "
                                       "cell masses' integers differ by less than 2^32); use a coarser grid")
        self.a, self.b, self.d_ab = a, b, a - b
        self.z = self.k * a + self.l * b
        self.zlim = np.uint64(self.z - 1)
        self.p_near = self.k * a / self.z
        #: x̂(c) = (2c + 1 - M) · scale, scale = 1 / (σ L) = Z / (K L (A - B))
        self.scale = float(Fraction(self.z, self.k * self.l * (a - b)))
        self.slope = float(Fraction(self.k * (a - b), self.z))
        self.c_impl = self.m * self.scale
        self.c_paper = 1.0 + 2.0 / _expm1(self.eps / 2.0)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "grid_bits": self.grid_bits}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """``log(A / B)``: the exact ε of the implemented law, ``<= eps`` (module doc)."""
        return math.log1p((self.a - self.b) / self.b)

    def _rounding(self, x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """``(s0, q)``: the lower window start of unit inputs ``x`` and the integer ``q`` (``π = q / D``),
        with the same float operations as the kernel (module doc)."""
        x = np.atleast_1d(np.asarray(x, dtype=np.float64))
        t = (x + 1.0) * 0.5 * float(self.l)
        s0 = np.minimum(np.floor(t), float(self.l) - 1.0)
        f = t - s0
        d = np.uint64(self.d_ab)
        q = np.minimum(np.rint(np.where(f >= 1.0, 0.0, f) * float(self.d_ab)).astype(np.uint64), d)
        return s0.astype(np.int64), np.where(f >= 1.0, d, q)

    def _starts(self, x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """``(s0, π)``: the lower window start and the probability ``π = q / D`` of ``s0 + 1``."""
        s0, q = self._rounding(x)
        return s0, q.astype(np.float64) / float(self.d_ab)

    def cell_mass(self, x: float) -> np.ndarray:
        """``P[report = c | x]`` for every cell ``c``, ``(M,)``: exact (the mixture of two window laws)."""
        s0, pi = self._starts(float(x))
        s0, pi = int(s0[0]), float(pi[0])
        out = np.full(self.m, self.b / self.z)
        bump = (self.a - self.b) / self.z
        out[s0:s0 + self.k] += (1.0 - pi) * bump
        out[s0 + 1:s0 + 1 + self.k] += pi * bump
        return out

    def cell_weights(self, x: float) -> tuple[int, list[int]]:
        """``(s0, integer masses over Z of the cells s0 .. s0 + K)``: the exact law the kernel samples (the
        other cells have ``B``)."""
        s0, q = self._rounding(float(x))
        q = int(q[0])
        return int(s0[0]), [self.a - q] + [self.a] * (self.k - 1) + [self.b + q]

    def unit_outputs(self, reports: np.ndarray) -> np.ndarray:
        """Each report's unbiased estimate ``x̂(c) = (2c + 1 - M) / (σ L)`` of its unit input (module doc)."""
        return (2.0 * np.asarray(reports, dtype=np.float64) + (1.0 - self.m)) * self.scale

    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """Mass of the output value ``x̂(c)`` (:meth:`unit_outputs`) in each bin of ``edges``."""
        return _bin_mass(self.unit_outputs(np.arange(self.m)), self.cell_mass(x), edges)

    # ---------------------------------------------------------------- device side
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 1:  # not one value per report: the unit inputs' path (and its errors)
            x, _ = self.prepare(v)
            out = np.empty(x.shape[0], dtype=self.report_dtype)
            return pk.pm_randomize(np.ascontiguousarray(x), noise_key(rng), *self.kernel_args(), out)
        if np.isnan(v).any():
            raise LDPError("a numeric value is NaN: not a measurement")
        # the unit mapping (:meth:`prepare`) inside the kernel: the same reports, without its temporary arrays
        out = np.empty(v.shape[0], dtype=self.report_dtype)
        return pk.pm_randomize_values(np.ascontiguousarray(v), self.lo, self.hi, noise_key(rng), *self.kernel_args(),
                                      out)

    def kernel_args(self) -> tuple:
        """``(l, k, a, b, zlim)`` as the kernels take them."""
        return np.int64(self.l), np.int64(self.k), np.uint64(self.a), np.uint64(self.b), self.zlim

    # ---------------------------------------------------------------- server side
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint16 if self.grid_bits <= 16 else np.uint32)

    def validate_reports(self, reports: np.ndarray) -> None:
        super().validate_reports(reports)
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"PM reports are one cell index each, got shape {r.shape}")
        if r.size and int(r.max()) >= self.m:
            raise InvalidReports(f"a PM report names a cell outside [0, {self.m})")

    def summands(self, reports: np.ndarray) -> np.ndarray:
        """What the aggregate sums for :meth:`estimate_unit_mean`: the cell indices (int64, exact)."""
        return np.asarray(reports).astype(np.int64)

    @property
    def support_size(self) -> int:
        return 2

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``[Σ c, Σ c^2]`` of the reports' cells (int64, exact): the step's aggregate."""
        self.validate_reports(np.asarray(reports))
        return pk.cell_moments(np.ascontiguousarray(reports))

    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """:meth:`estimate_unit_mean` and the sample variance of ``x̂(c)`` over ``n`` (:func:`.base.linear_mean`)."""
        return linear_mean(int(support[0]), int(support[1]), n, 2.0 * self.scale, (1.0 - self.m) * self.scale)

    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        """``(2 Σc / n + 1 - M) / (σ L)`` from the sum of the reports' cell indices (module doc)."""
        if n <= 0:
            raise LDPError("no report: no mean")
        return (2.0 * float(report_sum) / n + (1.0 - self.m)) * self.scale

    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``4 Var(c | x) / (σ L)^2``, exact for the implemented law (module doc)."""
        scalar = np.ndim(x) == 0
        s0, pi = self._starts(x)
        vs = [self._var_given_start(s0 + j) for j in (0, 1)]
        var_c = (1.0 - pi) * vs[0] + pi * vs[1] + pi * (1.0 - pi) * self.slope ** 2
        return _scalar(4.0 * var_c * self.scale ** 2, scalar)

    def _var_given_start(self, s: np.ndarray) -> np.ndarray:
        """``Var(c | s)``: the window (mass ``P``) and far cells (two runs of consecutive cells) mixed."""
        P, K, M = self.p_near, float(self.k), float(self.m)
        s = s.astype(np.float64)
        n1, n2 = s, M - s - K
        m1, m2 = (s - 1.0) / 2.0, (s + K + M - 1.0) / 2.0
        L = n1 + n2
        v_far = (n1 * (n1 * n1 - 1.0) + n2 * (n2 * n2 - 1.0)) / (12.0 * L) + n1 * n2 * (m2 - m1) ** 2 / (L * L)
        mu_far = (n1 * m1 + n2 * m2) / L
        mu_win = s + (K - 1.0) / 2.0
        return P * (K * K - 1.0) / 12.0 + (1.0 - P) * v_far + P * (1.0 - P) * (mu_win - mu_far) ** 2

    def paper_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """The paper's continuous PM variance at ``eps`` (:func:`pm_paper_variance`)."""
        return pm_paper_variance(x, self.eps)


class HM(NumericMechanism):
    """Wang et al.'s Hybrid Mechanism: PM (cells, module doc) with probability ``α``, else Duchi et al.'s ±B.
    Reports: uint32 codes, ``0 .. M-1`` PM cells, ``M`` = ``-B``, ``M + 1`` = ``+B``."""

    name = "HM"

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, grid_bits: int = 16) -> None:
        super().__init__(eps, lo, hi)
        self.pm = PM(self.eps, lo, hi, grid_bits)
        self.grid_bits, self.m = self.pm.grid_bits, self.pm.m
        self.alpha_paper = hm_alpha(self.eps)
        self.t_alpha = min(round(self.alpha_paper * _TWO64), _TWO64 - 1)
        self.alpha = float(Fraction(self.t_alpha, _TWO64))
        with localcontext() as ctx:
            ctx.prec = 60
            self.d_tlo = max(1, math.ceil(Decimal(_TWO53) / (Decimal(min(self.eps, 100.0)).exp() + 1)))
        self.d_s = (1 << 52) - self.d_tlo            # S, an exact float64
        self.B = float((1 << 52) / self.d_s)        # the implemented (e^ε + 1) / (e^ε - 1)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "grid_bits": self.grid_bits}

    # ---------------------------------------------------------------- privacy
    @property
    def duchi_eps(self) -> float:
        """``log((2^53 - T_lo) / T_lo)``: the ε of the implemented Duchi branch."""
        return math.log1p((_TWO53 - 2 * self.d_tlo) / self.d_tlo)

    @property
    def eps_first(self) -> float:
        """``max(ε of PM's cells, ε of Duchi's signs)`` over the branches that can occur, ``<= eps``."""
        return max(self.duchi_eps, self.pm.eps_first if self.t_alpha > 0 else 0.0)

    def p_plus(self, x: np.ndarray | float) -> np.ndarray | float:
        """``P[+B | x, Duchi's branch] = (T_lo + rint((x + 1) S)) / 2^53`` exactly."""
        return (self.d_tlo + np.rint((np.asarray(x, dtype=np.float64) + 1.0) * float(self.d_s))) / float(_TWO53)

    def code_mass(self, x: float) -> np.ndarray:
        """``P[report = code | x]`` for every code ``0 .. M+1``: exact."""
        p = float(self.p_plus(float(x)))
        pm = self.alpha * self.pm.cell_mass(x) if self.t_alpha else np.zeros(self.m)
        return np.concatenate([pm, [(1.0 - self.alpha) * (1.0 - p), (1.0 - self.alpha) * p]])

    def unit_outputs(self, reports: np.ndarray) -> np.ndarray:
        """Each report's unbiased estimate of its unit input: ``x̂(c)`` for PM's cells, ``∓B`` for ``M, M+1``."""
        r = np.asarray(reports).astype(np.int64)
        out = self.pm.unit_outputs(r)
        out[r == self.m] = -self.B
        out[r == self.m + 1] = self.B
        return out

    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """Mass of the output value (:meth:`unit_outputs`) in each bin of ``edges``."""
        return _bin_mass(self.unit_outputs(np.arange(self.m + 2)), self.code_mass(x), edges)

    # ---------------------------------------------------------------- device side
    def kernel_args(self) -> tuple:
        """``(t_alpha, l, k, a, b, zlim, d_tlo, d_s)`` as the kernels take them."""
        return (np.uint64(self.t_alpha), *self.pm.kernel_args(), np.int64(self.d_tlo), float(self.d_s))

    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        x, _ = self.prepare(values)
        out = np.empty(x.shape[0], dtype=np.uint32)
        return pk.hm_randomize(np.ascontiguousarray(x), noise_key(rng), *self.kernel_args(), out)

    # ---------------------------------------------------------------- server side
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint32)

    def validate_reports(self, reports: np.ndarray) -> None:
        super().validate_reports(reports)
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"HM reports are one code each, got shape {r.shape}")
        if r.size and int(r.max()) >= self.m + 2:
            raise InvalidReports(f"an HM report is outside the codes [0, {self.m + 2})")
        if r.size and self.t_alpha == 0 and int(r.min()) < self.m:
            raise InvalidReports("an HM report names a PM cell, but α = 0")

    def summands(self, reports: np.ndarray) -> np.ndarray:
        """What the aggregate sums for :meth:`estimate_unit_mean`: the unbiased values (:meth:`unit_outputs`)."""
        self.validate_reports(np.asarray(reports))
        return self.unit_outputs(reports)

    @property
    def support_size(self) -> int:
        return 5

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``[PM reports, Σ c, Σ c^2 over them, reports of -B, reports of +B]`` (int64, exact): the step's aggregate."""
        self.validate_reports(np.asarray(reports))
        return pk.hm_moments(np.ascontiguousarray(reports), np.int64(self.m))

    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """The mean of the per-report unbiased values and their sample variance over ``n``, from the exact sums."""
        n_pm, c1, c2, minus, plus = (int(v) for v in support)
        if n_pm + minus + plus != n or min(n_pm, minus, plus) < 0:
            raise LDPError(f"HM: the aggregate counts {n_pm + minus + plus} reports, not n = {n}")
        sc, off = self.pm.scale, 1 - self.m
        s1 = sc * (2 * c1 + off * n_pm) + self.B * (plus - minus)
        s2 = sc * sc * (4 * c2 + 4 * off * c1 + off * off * n_pm) + self.B ** 2 * (plus + minus)
        mean = s1 / n
        if n < 2:
            return mean, math.inf
        return mean, max(s2 - s1 * s1 / n, 0.0) / (n - 1) / n

    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        """The mean of the per-report unbiased values; ``report_sum`` is ``Σ unit_outputs`` (:meth:`summands`)."""
        if n <= 0:
            raise LDPError("no report: no mean")
        return float(report_sum) / n

    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``α' (Var_PM(x) + x^2) + (1 - α') B^2 - x^2`` with the implemented PM, ``α'`` and ``B``."""
        x2 = np.asarray(x, dtype=np.float64) ** 2
        pm = self.pm.unit_variance(x) + x2 if self.t_alpha else 0.0
        v = self.alpha * pm + (1.0 - self.alpha) * self.B ** 2 - x2
        return float(v) if np.ndim(v) == 0 else v

    def paper_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``α Var_PM(x) + (1 - α)(B^2 - x^2)`` with the paper's α, PM and B (Wang et al., §III-C)."""
        al = self.alpha_paper
        return al * pm_paper_variance(x, self.eps) + (1.0 - al) * duchi_paper_variance(x, self.eps)

    @staticmethod
    def paper_worst_variance(eps: float) -> float:
        """The worst case over ``x``: ``(a + 3) / (3a (a - 1)) + (e^ε + 1)^2 / (a (e^ε - 1)^2)`` for
        ``ε > ε*``, else ``((e^ε + 1) / (e^ε - 1))^2`` (survey of Wang, Zhang, Feng & Yang, Eq. 63)."""
        em1 = _expm1(eps)
        b2 = ((em1 + 2.0) / em1) ** 2
        if eps <= EPS_STAR:
            return b2
        a = _expm1(eps / 2.0) + 1.0
        return (a + 3.0) / (3.0 * a * (a - 1.0)) + b2 / a


def _bin_mass(values: np.ndarray, mass: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The masses of points ``values`` summed per bin of ``edges`` (last bin closed)."""
    e = np.asarray(edges, dtype=np.float64)
    j = np.searchsorted(e, values, side="right") - 1
    j[values == e[-1]] = e.shape[0] - 2
    keep = (j >= 0) & (j < e.shape[0] - 1)
    return np.bincount(j[keep], weights=mass[keep], minlength=e.shape[0] - 1)


class PiecewiseMultidim:
    """Wang et al.'s k-of-d collection of ``d`` numeric attributes (Algorithm 4, module doc): each device
    reports ``k`` uniformly sampled attributes with ε/k each, by PM or HM (``base``). ``ranges``: one
    ``(lo, hi)`` for every attribute, or one per attribute (``(d, 2)``); default ``[-1, 1]``."""

    def __init__(self, d: int, eps: float, ranges: Sequence[float] | Sequence[Sequence[float]] | None = None,
                 base: str = "PM", grid_bits: int = 16) -> None:
        if isinstance(d, bool) or int(d) != d or not 1 <= d <= 1 << 16:
            raise LDPError(f"d must be an integer in [1, 65536], got {d!r}")
        self.d = int(d)
        self.eps = check_eps("eps", eps)
        if base not in ("PM", "HM"):
            raise LDPError(f"base must be 'PM' or 'HM', got {base!r}")
        self.base = base
        r = np.asarray([-1.0, 1.0] if ranges is None else ranges, dtype=np.float64)
        if r.shape == (2,):
            r = np.tile(r, (self.d, 1))
        if r.shape != (self.d, 2):
            raise LDPError(f"ranges must be one (lo, hi) or {self.d} of them, got shape {r.shape}")
        self.ranges = r
        self.k = kofd_k(self.d, self.eps)
        self.eps_attr = self.eps / self.k
        cls = PM if base == "PM" else HM
        self.mechs = [cls(self.eps_attr, float(lo), float(hi), grid_bits) for lo, hi in r]
        self.grid_bits = self.mechs[0].grid_bits
        self.lims = np.array([rejection_limit(self.d - t) for t in range(self.k)], dtype=np.uint64)

    def params(self) -> dict[str, Any]:
        return {"mechanism": f"{self.base}-k-of-d", "d": self.d, "eps": self.eps, "k": self.k,
                "ranges": self.ranges.tolist(), "grid_bits": self.grid_bits}

    @functools.cached_property
    def fingerprint(self) -> str:
        blob = json.dumps(self.params(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"PiecewiseMultidim(d={self.d}, eps={self.eps!r}, k={self.k}, base={self.base!r})"

    @property
    def eps_first(self) -> float:
        """``k`` times the per-report ε of the base at ε/k (sequential composition), ``<= eps``."""
        return self.k * self.mechs[0].eps_first

    @property
    def report_dtype(self) -> np.dtype:
        return self.mechs[0].report_dtype

    # ---------------------------------------------------------------- device side
    def prepare(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unit values ``(n, d)`` and the clipped mask, attribute by attribute (:func:`to_unit`)."""
        v = np.asarray(values, dtype=np.float64)
        if v.ndim != 2 or v.shape[1] != self.d:
            raise LDPError(f"values must be (n, {self.d}), got shape {v.shape}")
        x, clipped = to_unit(v, self.ranges[:, 0], self.ranges[:, 1])
        return np.ascontiguousarray(x), clipped

    def randomize(self, values: np.ndarray,
                  rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(indices uint16 (n, k), reports (n, k))``: row ``i``'s sampled attributes (ascending) and their
        reports; ``rng`` as in :meth:`NumericMechanism.randomize`."""
        x, _ = self.prepare(values)
        n = x.shape[0]
        m0 = self.mechs[0]
        if self.base == "HM":
            t_alpha, *pm_args, d_tlo, d_s = m0.kernel_args()
        else:
            t_alpha, pm_args, d_tlo, d_s = np.uint64(0), m0.kernel_args(), np.int64(1), 1.0
        idx = np.empty((n, self.k), dtype=np.uint16)
        rep = np.empty((n, self.k), dtype=self.report_dtype)
        return pk.kofd_randomize(x, noise_key(rng), np.int64(self.k), self.lims, self.base == "HM", t_alpha,
                                 *pm_args, d_tlo, d_s, idx, rep)

    # ---------------------------------------------------------------- server side
    def validate_reports(self, indices: np.ndarray, reports: np.ndarray) -> None:
        idx, rep = np.asarray(indices), np.asarray(reports)
        if idx.dtype != np.uint16 or idx.ndim != 2 or idx.shape[1] != self.k or rep.shape != idx.shape:
            raise InvalidReports(f"k-of-d reports are uint16 indices and reports of shape (n, {self.k})")
        if idx.size and int(idx.max()) >= self.d:
            raise InvalidReports(f"an attribute index is outside [0, {self.d})")
        if idx.size and self.k > 1 and not np.all(np.diff(idx.astype(np.int64), axis=1) > 0):
            raise InvalidReports("a device's sampled attributes are not distinct and ascending")
        self.mechs[0].validate_reports(rep.ravel())

    def attribute_sums(self, indices: np.ndarray, reports: np.ndarray) -> np.ndarray:
        """``(d,)``: the sum of the unbiased unit values of the reports on each attribute (the aggregate)."""
        self.validate_reports(indices, reports)
        vals = self.mechs[0].unit_outputs(np.asarray(reports).ravel())
        return np.bincount(np.asarray(indices).ravel().astype(np.int64), weights=vals, minlength=self.d)

    def estimate_unit_means(self, sums: np.ndarray, n: int) -> np.ndarray:
        """``d / k · sums / n``: the unbiased unit means of the ``d`` attributes."""
        if n <= 0:
            raise LDPError("no report: no mean")
        return self.d / self.k * np.asarray(sums, dtype=np.float64) / n

    def estimate_means(self, sums: np.ndarray, n: int) -> np.ndarray:
        """The unbiased means of the ``d`` attributes in their units."""
        return from_unit(self.estimate_unit_means(sums, n), self.ranges[:, 0], self.ranges[:, 1])

    def unit_variance(self, x: np.ndarray) -> np.ndarray:
        """``(d/k)(Var_base(x) + x^2) - x^2`` per device and attribute (``x`` unit values ``(..., d)``)."""
        x = np.asarray(x, dtype=np.float64)
        return self.d / self.k * (self.mechs[0].unit_variance(x) + x * x) - x * x

    def paper_variance(self, x: np.ndarray) -> np.ndarray:
        """The same with the paper's continuous base variance at ε/k (Wang et al., §IV)."""
        x = np.asarray(x, dtype=np.float64)
        return self.d / self.k * (self.mechs[0].paper_variance(x) + x * x) - x * x

    def mean_variance(self, values: np.ndarray) -> np.ndarray:
        """``(d,)``: the variance of :meth:`estimate_means` over the devices' ``values`` ``(n, d)``."""
        x, _ = self.prepare(values)
        scale = (self.ranges[:, 1] - self.ranges[:, 0]) / 2.0
        return np.mean(self.unit_variance(x), axis=0) / x.shape[0] * scale * scale
