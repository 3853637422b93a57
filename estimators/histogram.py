"""Histogram encoding: SHE (summation) and THE (thresholding), Wang et al., USENIX Security
2017 (the survey of Wang et al., Sensors 2020, §4.1, gives the Laplace mechanism ``V + Lap(Δ/ε)``
and its variance ``2 (Δ/ε)^2`` per coordinate).

The device one-hot encodes its value ``x`` as ``B = e_x`` (L1 sensitivity ``Δ = 2`` between
two inputs) and adds Laplace noise of scale ``b = 2/ε`` to each of the ``k`` coordinates:
``y_j = B_j + Lap(b)``. That is ε-LDP; everything below is post-processing of ``y``.

* **SHE** sends ``y`` itself, with the Laplace noise replaced by its discrete analogue
  (integer reports, exact sampler and exact ε; see :class:`SHE`); the server sums.
* **THE** sends the set ``{j : y_j > θ}`` as a packed k-bit vector (like UE). Bit ``j`` is 1
  w.p. ``ps = 1 - F(θ - 1) = 1 - ½ e^{-ε(1-θ)/2}`` if ``j = x`` and ``qs = 1 - F(θ) =
  ½ e^{-εθ/2}`` otherwise (``F`` the Laplace(b) CDF, ``0 < θ < 1``), independently given
  ``x``, so THE is a pure protocol with UE's ε: ``ln(ps (1 - qs) / ((1 - ps) qs))``.
  Sampling: with ``u`` uniform, ``1{B_j + F⁻¹(u) > θ} = 1{u > F(θ - B_j)}`` has the
  law of ``1{u' < 1 - F(θ - B_j)}``; the device therefore compares one uniform per bit
  with ``ps``/``qs`` (the UE kernel), which is the thresholded Laplace output without the
  logarithm. As for UE the probabilities live on the 2^-32 grid of the 32-bit uniforms
  and every figure (estimator, variance, ε) uses the grid values.
"""
from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from . import kernels
from . import postprocess as _pp
from .base import SingleShot
from .errors import InfeasibleParameters, InvalidReports, LDPError
from .randomness import noise_key, quantize32
from .unary import UnaryEncoding


# ====================================================================== THE
def the_probabilities(eps: float, theta: float) -> tuple[float, float]:
    """``(ps, qs)`` of THE for ``0 < θ < 1``: ``ps = 1 - ½ e^{-ε(1-θ)/2}``, ``qs = ½ e^{-εθ/2}``."""
    return float(1.0 - 0.5 * np.exp(-eps * (1.0 - theta) / 2.0)), float(0.5 * np.exp(-eps * theta / 2.0))


def the_optimal_theta(eps: float) -> float:
    """θ in (0.5, 1) minimizing Var* = qs(1-qs)/(ps-qs)^2 (Wang et al., USENIX Security 2017),
    rounded to 1e-6.

    Found numerically (bounded Brent search); the rounding makes it a stable public parameter
    (it enters the protocol fingerprint) at a negligible cost in variance (the optimum is flat).
    """
    def var(theta: float) -> float:
        ps, qs = the_probabilities(eps, theta)
        return qs * (1.0 - qs) / (ps - qs) ** 2

    from scipy.optimize import minimize_scalar  # scipy loads on first use

    res = minimize_scalar(var, bounds=(0.5, 1.0), method="bounded", options={"xatol": 1e-10})
    return round(float(res.x), 6)


class THE(UnaryEncoding):
    """Thresholding with histogram encoding: report the coordinates whose noisy value exceeds θ.

    A single-shot UE protocol with bit probabilities ``(ps, qs)`` of :func:`the_probabilities`:
    its ε (:attr:`eps_first`, the UE ratio) equals, for the exact Laplace probabilities,
    ``ε/2 + ln(2 - e^{-ε(1-θ)/2}) + ln(2 - e^{-εθ/2}) <= ε`` (since ``ln(2 - e^{-a}) <= a``).
    """

    name: ClassVar[str] = "THE"

    def __init__(self, k: int, eps: float, theta: float | None = None) -> None:
        SingleShot.__init__(self, k, eps)
        if theta is None:
            theta = the_optimal_theta(self.eps)
        theta = float(theta)
        if not 0.0 < theta < 1.0:
            raise LDPError(f"theta must lie in (0, 1), got {theta}")
        self.theta = theta
        p, q = the_probabilities(self.eps, theta)
        self.p, self.q = quantize32(p), quantize32(q)
        if not 0.0 < self.q < self.p < 1.0:
            raise InfeasibleParameters(
                f"THE: eps = {self.eps:g}, theta = {theta:g} give bit probabilities (ps = {p:.3g}, "
                f"qs = {q:.3g}) that vanish on the 2^-32 sampling grid; use a smaller eps")

    def params(self) -> dict:
        return {"protocol": self.name, "k": self.k, "eps": self.eps, "theta": self.theta}


# ====================================================================== SHE
SHE_T_BITS = kernels.SHE_T_BITS  # γ = s / 2^48 (t = 2^48 in Canonne-Kamath-Steinke's notation)
SHE_TAIL = 40                    # clip |y| at 1 + ceil(40/γ): 40 noise scales beyond the one-hot
SHE_MIN_EPS = 1e-4               # |2γ - ε| / ε <= 2^-47 / ε < 1e-9 (7.1e-11); the bound fits int32
SHE_MAX_EPS = 64.0               # s <= 2^53: 2 s / 2^48 is exact in float64, int64 far from overflow


def she_noise_parameter(eps: float) -> int:
    """``s = floor((ε/2) 2^48)``: SHE's noise parameter ``γ = s / 2^48`` (``2γ <= ε``, and
    ``ε - 2γ < 2^-47``, i.e. relative ``< 7.1e-15 / ε``; ``2γ = ε`` exactly for dyadic ε).
    ``math.ldexp`` scales by a power of two exactly, so ``s`` is the exact floor."""
    return int(math.floor(math.ldexp(float(eps), SHE_T_BITS - 1)))


def _discrete_laplace_moments(s: int, c: int, bound: int) -> tuple[float, float]:
    """Mean and variance of ``clip(c + Z, -bound, bound)``, ``Z`` discrete Laplace with
    ``P(Z = z) = (1-α)/(1+α) α^|z|``, ``α = e^{-γ}``, ``γ = s / 2^48``.

    With ``T1(h) = E[(Z - h)^+] = α^{h+1} / ((1+α)(1-α))`` and ``T2(h) = E[(Z^2 - h^2) 1{Z > h}] =
    (1-α)/(1+α) α^h (2 h α / (1-α)^2 + α (1+α) / (1-α)^3)`` (``h >= 0``), clipping ``Z`` to
    ``[-lo, hi]`` (``lo = bound + c``, ``hi = bound - c``) gives ``E = T1(lo) - T1(hi)`` and
    ``E[.^2] = E[Z^2] - T2(hi) - T2(lo)``, ``E[Z^2] = Var(Z) = 2α / (1-α)^2``.
    """
    gamma = s / float(1 << SHE_T_BITS)
    one_a = -math.expm1(-gamma)   # 1 - α, accurate for small γ
    a = math.exp(-gamma)

    def t1(h: int) -> float:
        return math.exp(-gamma * (h + 1)) / ((1.0 + a) * one_a)

    def t2(h: int) -> float:
        return one_a / (1.0 + a) * math.exp(-gamma * h) * (2.0 * h * a / one_a ** 2 + a * (1.0 + a) / one_a ** 3)

    hi, lo = bound - c, bound + c
    e1 = t1(lo) - t1(hi)
    e2 = 2.0 * a / one_a ** 2 - t2(hi) - t2(lo)
    return float(c + e1), float(e2 - e1 * e1)


class SHE(SingleShot):
    """Summation with histogram encoding, with exact discrete Laplace noise and integer reports.

    Device: ``y_j = clip(B_j + Z_j, -C, C)`` (``B = e_x`` the one-hot vector), ``Z_j`` i.i.d.
    discrete Laplace (two-sided geometric), ``P(Z = z) = (1-α)/(1+α) α^|z|`` with ``α = e^{-γ}``:
    the geometric mechanism of Ghosh, Roughgarden & Sundararajan (STOC 2009) on each coordinate,
    in units of the sensitivity. ``γ = s / 2^48`` with ``s = floor((ε/2) 2^48)``
    (:func:`she_noise_parameter`), so ``2γ <= ε`` and ``ε - 2γ < 2^-47``; accepted:
    ``1e-4 <= ε <= 64`` (relative error ``< 7.1e-11``; ``s >= 1.4e10`` and ``s <= 2^53``).
    ``C = 1 + ceil(40/γ)``: a coordinate is clipped w.p. ``<= α^{C-1} / (1+α) <= e^{-40}``;
    reports are the smallest of int8 / int16 / int32 holding ``±C`` (int8 from ε ≈ 0.64, int32
    below ε ≈ 0.0025).

    Privacy, from this exact law: for one coordinate, ``P(c + Z = y) / P(c' + Z = y) =
    α^{|y - c| - |y - c'|}`` lies in ``[e^{-γ}, e^{γ}]`` when ``|c - c'| = 1`` (with equality on
    one side of the pair), and clipping is post-processing (the clipped tails
    ``P(Z >= m) = α^m / (1+α)`` give the same ratios). Two inputs differ in two coordinates,
    so the report's ε is exactly ``eps_first = 2γ = 2 s / 2^48``.

    Sampler: Canonne, Kamath & Steinke, "The Discrete Gaussian for Differential Privacy"
    (NeurIPS 2020), Alg. 2 (discrete Laplace from Bernoulli(exp(-U/t)) trials, their Alg. 1)
    in integer arithmetic on the ChaCha20 noise stream; every Bernoulli is exact
    (:func:`estimators.kernels.she_randomize` documents the bits it reads). No floating point
    is involved, so the stated ε is the true one.

    Server: the support is the int64 column sum of the reports (exact and additive). The
    estimator uses the exact moments of what is sent (:func:`_discrete_laplace_moments`):
    ``E[y_v] = μ0 + f (μ1 - μ0)`` with ``μ0 = 0`` (symmetry) and ``μ1 = 1`` up to the clip
    (relative ``<= e^{-40}``), so ``f̂ = (C(v)/n - μ0) / (μ1 - μ0)``, with the noise variance
    ``2α / (1-α)^2`` (``≈ 2/γ^2 = 8/ε^2`` for small ε). Var* (f → 0) = ``σ0² / (n (μ1 - μ0)^2)``;
    the exact variance (one report per i.i.d. user, as for the pure protocols) is
    ``(f σ1² + (1-f) σ0² + f(1-f)(μ1-μ0)^2) / (n (μ1-μ0)^2)``.
    """

    name: ClassVar[str] = "SHE"

    def __init__(self, k: int, eps: float) -> None:
        SingleShot.__init__(self, k, eps)
        if not SHE_MIN_EPS <= self.eps <= SHE_MAX_EPS:
            raise InfeasibleParameters(
                f"SHE supports {SHE_MIN_EPS:g} <= eps <= {SHE_MAX_EPS:g} (an exact rational noise parameter "
                f"s / 2^{SHE_T_BITS} within 1e-9 of eps/2, int32 reports), got {self.eps:g}")
        self.s = she_noise_parameter(self.eps)
        self.gamma = self.s / float(1 << SHE_T_BITS)   # per-coordinate ε of the geometric mechanism
        self.alpha = math.exp(-self.gamma)
        t = 1 << SHE_T_BITS
        self.bound = 1 + -(-SHE_TAIL * t // self.s)    # 1 + ceil(40 / γ), in integers
        self.slot = kernels.she_slot_words(self.k, self.s, SHE_T_BITS)
        self.mu0, self.var0 = _discrete_laplace_moments(self.s, 0, self.bound)
        self.mu1, self.var1 = _discrete_laplace_moments(self.s, 1, self.bound)
        self.gap = self.mu1 - self.mu0

    @property
    def eps_first(self) -> float:
        """``2γ = 2 s / 2^48``: twice the per-coordinate ``max_y ln(P(y | c) / P(y | c ± 1)) = γ``
        (see the class doc); exact in float64 (``s <= 2^53``)."""
        return float(2 * self.s) / float(1 << SHE_T_BITS)

    # ---------------------------------------------------------------- device side
    def randomize(self, values, rng=None, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        out = np.empty((v.shape[0], self.k), dtype=self.report_dtype)
        return kernels.she_randomize(v, noise_key(rng), self.s, SHE_T_BITS, self.bound, self.slot, out)

    # ---------------------------------------------------------------- wire codec
    @property
    def report_dtype(self) -> np.dtype:
        """The smallest signed integer type holding ``[-C, C]``."""
        for dt in (np.int8, np.int16, np.int32):
            if self.bound <= np.iinfo(dt).max:
                return np.dtype(dt)
        raise AssertionError("SHE's clip bound exceeds int32")  # pragma: no cover - excluded by SHE_MIN_EPS

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (self.k,)

    def _check_array(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        if r.dtype != self.report_dtype or r.ndim != 2 or r.shape[1] != self.k:
            raise InvalidReports(f"SHE reports must be {self.report_dtype} (n, {self.k}), got {r.dtype} {r.shape}")
        return r

    def validate_reports(self, reports: np.ndarray) -> None:
        r = self._check_array(reports)
        if r.size and (int(r.min()) < -self.bound or int(r.max()) > self.bound):
            raise InvalidReports(f"SHE report coordinate outside the clip range [-{self.bound}, {self.bound}]")

    # ---------------------------------------------------------------- server side
    def support(self, reports: np.ndarray) -> np.ndarray:
        """int64 sums of the integer coordinates (additive, exact)."""
        r = np.ascontiguousarray(self._check_array(reports))
        sums, bad = kernels.int_column_sums(r, self.bound)
        if bad:
            raise InvalidReports(f"{bad} SHE report coordinates outside [-{self.bound}, {self.bound}]")
        return sums

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """``f̂ = (C(v)/n - μ0) / (μ1 - μ0)`` (sum of noisy one-hot vectors / n, Wang et al.,
        USENIX Security 2017)."""
        c = self.check_counts(counts, n).astype(np.float64)
        if postprocess == "ibu":
            raise LDPError("SHE is not a pure protocol (its support is a sum of discrete Laplace noise): IBU is "
                           "not available; use 'clip', 'norm-sub' or 'project'")
        f = (c / n - self.mu0) / self.gap
        return _pp.apply(postprocess, f)

    def variance(self, n: int) -> float:
        """Var* = σ0² / (n (μ1 - μ0)^2) ≈ 2α / (n (1-α)^2) (≈ 8 / (n ε^2) for small ε)."""
        return float(self.variance_exact(0.0, n))

    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        f = np.asarray(f, dtype=np.float64)
        per = f * self.var1 + (1.0 - f) * self.var0 + f * (1.0 - f) * self.gap ** 2
        return per / (n * self.gap ** 2)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """``y_v1 >= 1`` and ``y_v2 <= 0``: probability ``1/(1+α)^2`` under ``v1`` and ``α^2/(1+α)^2``
        under ``v2`` (``P(Z >= 0) = 1/(1+α)``, ``P(Z >= 1) = α/(1+α)``; the clip keeps both events),
        a ratio of exactly ``α^{-2} = e^{2γ} = e^{eps_first}``."""
        r = np.asarray(reports)
        return (r[:, v1] >= 1) & (r[:, v2] <= 0)
