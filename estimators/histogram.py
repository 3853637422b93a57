"""Histogram encoding: SHE (summation) and THE (thresholding), Wang et al., USENIX Security
2017 ([35] of seed 003; seed 003 §4.1 gives the Laplace mechanism ``V + Lap(Δ/ε)`` and its
variance ``2 (Δ/ε)^2`` per coordinate).

The device one-hot encodes its value ``x`` as ``B = e_x`` (L1 sensitivity ``Δ = 2`` between
two inputs) and adds Laplace noise of scale ``b = 2/ε`` to each of the ``k`` coordinates:
``y_j = B_j + Lap(b)``. That is ε-LDP; everything below is post-processing of ``y``.

* **SHE** sends ``y`` itself in fixed point (see :class:`SHE`); the server sums.
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

from typing import ClassVar

import numpy as np
from scipy.optimize import minimize_scalar

from . import kernels
from . import postprocess as _pp
from ._rand import draw_seed, quantize32, threshold32
from .base import FrequencyProtocol, SingleShotPure, check_domain, check_eps
from .errors import InfeasibleParameters, InvalidReports, LDPError
from .longitudinal import ue_eps
from .unary import _UnaryReports

_NO_KEYS = np.zeros(0, dtype=np.uint64)
_NO_SEEN = np.zeros((0, 0), dtype=np.uint8)
_ONE_ROUND = (np.uint64(1 << 32), np.uint64(0))  # IRR disabled: keep every PRR bit


# ====================================================================== THE
def the_probabilities(eps: float, theta: float) -> tuple[float, float]:
    """``(ps, qs)`` of THE for ``0 < θ < 1``: ``ps = 1 - ½ e^{-ε(1-θ)/2}``, ``qs = ½ e^{-εθ/2}``."""
    return float(1.0 - 0.5 * np.exp(-eps * (1.0 - theta) / 2.0)), float(0.5 * np.exp(-eps * theta / 2.0))


def the_optimal_theta(eps: float) -> float:
    """θ in (0.5, 1) minimizing Var* = qs(1-qs)/(ps-qs)^2 (Wang et al. 2017), rounded to 1e-6.

    Found numerically (bounded Brent search); the rounding makes it a stable public parameter
    (it enters the protocol fingerprint) at a negligible cost in variance (the optimum is flat).
    """
    def var(theta: float) -> float:
        ps, qs = the_probabilities(eps, theta)
        return qs * (1.0 - qs) / (ps - qs) ** 2

    res = minimize_scalar(var, bounds=(0.5, 1.0), method="bounded", options={"xatol": 1e-10})
    return round(float(res.x), 6)


class THE(_UnaryReports, SingleShotPure):
    """Thresholding with histogram encoding: report the coordinates whose noisy value exceeds θ."""

    name: ClassVar[str] = "THE"

    def __init__(self, k: int, eps: float, theta: float | None = None) -> None:
        self.k = check_domain(k)
        self.eps = check_eps("eps", eps)
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

    @property
    def eps_first(self) -> float:
        """UE ratio ``ln(ps(1-qs) / ((1-ps) qs))``: the worst case for independent bits (seed 003 Eq. 24).

        For the exact Laplace probabilities it equals ``ε/2 + ln(2 - e^{-ε(1-θ)/2}) +
        ln(2 - e^{-εθ/2}) <= ε`` (since ``ln(2 - e^{-a}) <= a``).
        """
        return ue_eps(self.p, self.q)

    def randomize(self, values, rng, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        return kernels.ue_chain_randomize(v, _NO_KEYS, False, _NO_SEEN, draw_seed(rng),
                                          threshold32(self.p), threshold32(self.q), *_ONE_ROUND, self.k)


# ====================================================================== SHE
SHE_SCALE_BITS = 12
SHE_SCALE = 1 << SHE_SCALE_BITS  # fixed-point units per 1.0 of the noisy one-hot vector
SHE_TAIL = 16.0                  # clip |y| at 1 + 16 noise scales
SHE_MIN_EPS = 1e-4               # the clip bound must fit in int32
SHE_MAX_EPS = 16.0               # the clip bound must lie well inside the sampler's range (see SHE)


def _rounded_laplace_moments(beta: float, c: int, bound: int) -> tuple[float, float]:
    """Mean and variance of ``clip(c + D, -bound, bound)``, ``D = round(Laplace(beta))``.

    ``D`` rounded half away from zero has ``P(D = 0) = 1 - r^{1/2}`` and ``P(D = m) = a r^|m|``
    (``r = e^{-1/beta}``, ``a = sinh(1/(2 beta))``). With ``T1(t) = E[(D - t)^+] = a r^{t+1} /
    (1-r)^2`` and ``T2(t) = E[(D^2 - t^2) 1{D > t}] = a r^t (2 t r / (1-r)^2 + r (1+r) / (1-r)^3)``,
    clipping ``D`` to ``[-lo, hi]`` (``lo = bound + c``, ``hi = bound - c``) gives
    ``E = T1(lo) - T1(hi)`` and ``E[.^2] = E[D^2] - T2(hi) - T2(lo)``, ``E[D^2] = 2 a r (1+r)/(1-r)^3``.
    """
    lam = 1.0 / beta
    one_r = -np.expm1(-lam)
    r = 1.0 - one_r
    a = np.sinh(lam / 2.0)

    def t1(t: int) -> float:
        return a * np.exp(-lam * (t + 1)) / one_r ** 2

    def t2(t: int) -> float:
        return a * np.exp(-lam * t) * (2.0 * t * r / one_r ** 2 + r * (1.0 + r) / one_r ** 3)

    hi, lo = bound - c, bound + c
    e1 = t1(lo) - t1(hi)
    e2 = 2.0 * a * r * (1.0 + r) / one_r ** 3 - t2(hi) - t2(lo)
    return float(c + e1), float(e2 - e1 * e1)


class SHE(FrequencyProtocol):
    """Summation with histogram encoding, sent in fixed point.

    Device: ``Q_j = clip(S B_j + round(S L_j), -C, C)`` as int32 with ``S = 2^12``,
    ``L_j ~ Laplace(2/ε)``, rounding half away from zero and ``C = ceil(S (1 + 16 · 2/ε))``
    (16 noise scales beyond the one-hot's range: a coordinate is clipped w.p. about
    ``½ e^{-16} ≈ 6e-8``). Rounding and clipping are post-processing of the Laplace
    output, so the report is ε-LDP; :attr:`eps_first` recomputes it from the report's own
    probabilities: per coordinate ``P(Q = y | B = 1) / P(Q = y | B = 0) <= r^{-S} = e^{ε/2}``
    (interior points, and the geometric tails at ``±C``), and two inputs differ in two
    coordinates, so ``eps_first = 2 S / beta = ε``.

    Server: the support is the int64 column sum of the reports (exact and additive).
    The estimator uses the exact moments of what is sent (:func:`_rounded_laplace_moments`):
    ``E[Q_v] = μ0 + f (μ1 - μ0)`` with ``μ0 = 0`` (symmetry) and ``μ1 = S`` up to the clip
    (``≈ S - (beta/2)(e^{-16} - e^{-16-ε})``, relative ``<= e^{-16} ≈ 1.1e-7``), so
    ``f̂ = (C(v)/n - μ0) / (μ1 - μ0)``; rounding adds Sheppard's ``1/12`` to the noise
    variance ``2 beta^2`` (``beta = 2S/ε``, the noise scale in fixed-point units), i.e. the
    variance is ``8/(n ε^2)`` up to relative ``O(ε^2 / S^2)``. Var* (f → 0) =
    ``σ0² / (n (μ1 - μ0)^2)``; the exact variance (one report per i.i.d. user, as for the
    pure protocols) is ``(f σ1² + (1-f) σ0² + f(1-f)(μ1-μ0)^2) / (n (μ1-μ0)^2)``.

    Sampler: ``S L = -beta sign(t) ln(1 - 2|t|)`` with ``t`` on a symmetric 2^-53 grid reaches
    ``53 ln 2 ≈ 36.7`` noise scales; ``eps <= 16`` keeps the clip (``|y| = 1 + 16 b``, hit
    from either one-hot value) inside that range, so both inputs have the same output support. As with
    any floating-point Laplace sampler (Mironov 2012) the probabilities of individual
    outputs deep in the tail deviate from the ideal ones by the grid's granularity; the
    clip confines this to events of probability ``< e^{-16}``.
    """

    name: ClassVar[str] = "SHE"

    def __init__(self, k: int, eps: float) -> None:
        self.k = check_domain(k)
        self.eps = check_eps("eps", eps)
        if not SHE_MIN_EPS <= self.eps <= SHE_MAX_EPS:
            raise InfeasibleParameters(
                f"SHE supports {SHE_MIN_EPS:g} <= eps <= {SHE_MAX_EPS:g} (fixed-point int32 reports clipped at "
                f"1 + {SHE_TAIL:g} noise scales), got {self.eps:g}")
        self.b = 2.0 / self.eps                    # Laplace scale of the mechanism
        self.beta = SHE_SCALE * self.b             # the same in fixed-point units
        self.bound = int(np.ceil(SHE_SCALE * (1.0 + SHE_TAIL * self.b)))
        self.mu0, self.var0 = _rounded_laplace_moments(self.beta, 0, self.bound)
        self.mu1, self.var1 = _rounded_laplace_moments(self.beta, SHE_SCALE, self.bound)
        self.gap = self.mu1 - self.mu0

    def params(self) -> dict:
        return {"protocol": self.name, "k": self.k, "eps": self.eps}

    @property
    def eps_first(self) -> float:
        """``2 max_y ln(P(Q = y | B = 1) / P(Q = y | B = 0)) = 2 S / beta`` (see the class doc)."""
        return float(2.0 * SHE_SCALE / self.beta)

    # ---------------------------------------------------------------- device side
    def randomize(self, values, rng, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        return kernels.she_randomize(v, draw_seed(rng), self.beta, float(SHE_SCALE), float(self.bound), self.k)

    # ---------------------------------------------------------------- wire codec
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (self.k,)

    def _check_array(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        if r.dtype != np.int32 or r.ndim != 2 or r.shape[1] != self.k:
            raise InvalidReports(f"SHE reports must be int32 (n, {self.k}), got {r.dtype} {r.shape}")
        return r

    def validate_reports(self, reports: np.ndarray) -> None:
        r = self._check_array(reports)
        if r.size and (int(r.min()) < -self.bound or int(r.max()) > self.bound):
            raise InvalidReports(f"SHE report coordinate outside the fixed-point range [-{self.bound}, {self.bound}]")

    # ---------------------------------------------------------------- server side
    def support(self, reports: np.ndarray) -> np.ndarray:
        """int64 sums of the fixed-point coordinates (additive, exact)."""
        r = np.ascontiguousarray(self._check_array(reports))
        sums, bad = kernels.int_column_sums(r, self.bound)
        if bad:
            raise InvalidReports(f"{bad} SHE report coordinates outside [-{self.bound}, {self.bound}]")
        return sums

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """``f̂ = (C(v)/n - μ0) / (μ1 - μ0)`` (sum of noisy one-hot vectors / n, Wang et al. 2017)."""
        c = self.check_counts(counts, n).astype(np.float64)
        if postprocess == "ibu":
            raise LDPError("SHE is not a pure protocol (its support is a sum of Laplace noise): IBU is not "
                           "available; use 'clip', 'norm-sub' or 'project'")
        f = (c / n - self.mu0) / self.gap
        return _pp.apply(postprocess, f)

    def variance(self, n: int) -> float:
        """Var* = σ0² / (n (μ1 - μ0)^2) ≈ 8 / (n ε^2) (seed 003 §4.1 with Δ = 2)."""
        return float(self.variance_exact(0.0, n))

    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        f = np.asarray(f, dtype=np.float64)
        per = f * self.var1 + (1.0 - f) * self.var0 + f * (1.0 - f) * self.gap ** 2
        return per / (n * self.gap ** 2)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """``y_v1 > 1`` and ``y_v2 < 0`` (``Q_v1 > S``, ``Q_v2 < 0``): probability ``r/4`` under ``v1``
        and ``r^{2S+1}/4`` under ``v2`` (``P(D > 0) = r^{1/2}/2``, ``P(D > S) = r^{S+1/2}/2``), a ratio
        of exactly ``r^{-2S} = e^ε``. It beats the difference event ``y_v1 - y_v2 > 1``, whose
        ratio is only ``e^ε / (1 + ε/2)``."""
        r = np.asarray(reports)
        return (r[:, v1] > SHE_SCALE) & (r[:, v2] < 0)
