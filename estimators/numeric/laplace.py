"""The Laplace mechanism on ``[-1, 1]`` (the baseline of every numeric mechanism), sampled exactly.

A device adds Laplace noise of scale ``Δ / ε = 2 / ε`` to its value (Dwork, McSherry, Nissim & Smith, TCC
2006; as an LDP mean estimator: Wang, Zhang, Feng & Yang's survey, §4.1: variance ``8 / ε^2``, Table IX).
Floating-point Laplace noise (``-b log u``) leaks the value through the noise's low-order bits (Mironov, CCS
2012), so this implementation works on a grid and samples an exact *discrete* Laplace noise:

* **Grid.** Step ``g = 2^-m`` (``grid_bits = m``, default 12), ``N = 2^m`` steps per unit: the output is an
  integer grid index, the report (int32).
* **Rounding.** ``a = x N`` (exact: a power-of-two scaling) is rounded to ``k = floor(a) + 1`` with
  probability ``p = ceil(f 2^53) / 2^53``, ``f = a - floor(a)``, else to ``floor(a)`` (one 53-bit uniform
  compared with ``f``). ``E[k] = a`` up to ``2^-53`` steps: unbiased. Its law is a mixture of the point inputs
  ``floor(a)`` and ``floor(a) + 1``, so every output ratio between two inputs is at most the largest ratio
  between two grid inputs of ``[-N, N]``: the sensitivity is ``Δ = 2N`` steps (exactly ``2`` in units), with
  no ``+ g`` term as deterministic rounding would need.
* **Noise.** ``Z`` with ``P[Z = z] = (1 - q) / (1 + q) q^|z|``, ``q = exp(-s / t)`` for integers ``s = 2^20``
  and ``t = ceil(2N s / ε)``, sampled by Canonne, Kamath & Steinke's exact algorithm (NeurIPS 2020,
  Algorithms 1-2) with exact integer comparisons on the bits of the ChaCha20 noise stream
  (:mod:`.laplace_kernels`).
* **Report** ``clip(k + Z, -C, C)``, ``C = 2^31 - 1`` (post-processing; a parameter set whose noise would
  reach the clip with probability above ``2^-64`` is refused).

**Privacy.** The output law for a grid input ``k`` is ``P[k + Z = y] ∝ q^|y - k|``, so two inputs at distance
``≤ 2N`` have log-ratio ``≤ 2N s / t``, attained (for ``k = -N, N`` and every ``y`` outside ``(-N, N)``):
``eps_first = 2N s / t <= ε``, below ``ε`` by a relative ``< 1/t`` (about ``ε 2^-33`` at the default grid).

**Estimator and variance.** ``E[g (k + Z)] = x``, so ``g × mean(reports)`` is unbiased for the unit mean.
One report's variance is ``g^2 (Var Z + p (1 - p))`` with ``Var Z = 2q / (1-q)^2 = 1 / (2 sinh^2(λ/2))``,
``λ = s / t = eps_first / (2N)``. Since ``1 / (2 sinh^2(λ/2)) = 2/λ^2 - 1/6 + O(λ^2)``,
``g^2 Var Z = 8 / eps_first^2 - g^2 / 6 + O(g^4 ε^2)``: the continuous Laplace's ``8 / ε^2``, less ``g^2/6``,
plus the rounding's ``p (1 - p) g^2 <= g^2 / 4`` (``1.5e-8`` at the default grid). The clip at ``±C``
(probability ``< 2^-64``) is left out of the mean and the variance.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InfeasibleParameters, InvalidReports, LDPError
from ..randomness import noise_key
from . import laplace_kernels as lk
from .base import NumericMechanism

__all__ = ["Laplace"]

NOISE_S = 1 << 20  # the noise's q = exp(-s / t): s fixed, t = ceil(2N s / ε)
_TAIL_LOG = 64 * math.log(2.0)  # refuse parameters whose noise reaches the clip with probability > 2^-64


def _z_mass(a: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
    """``P[a <= Z <= b]`` for the discrete Laplace ``P[Z = z] = (1-q)/(1+q) q^|z|``, ``q = e^-λ``; ``a, b``
    float arrays of integers or ``±inf``, ``a <= b``. Written with ``expm1`` so that tail masses keep their
    relative precision."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64))
    q = math.exp(-lam)
    out = np.zeros(a.shape, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        mid = (a <= 0) & (b >= 0)  # [(1 - q^(b+1)) + q (1 - q^(-a))] / (1 + q)
        out[mid] = (-np.expm1(-lam * (b[mid] + 1.0)) - q * np.expm1(lam * a[mid])) / (1.0 + q)
        right = a > 0  # (q^a - q^(b+1)) / (1 + q)
        out[right] = np.exp(-lam * a[right]) * -np.expm1(-lam * (b[right] + 1.0 - a[right])) / (1.0 + q)
        left = b < 0   # the mirror image
        out[left] = np.exp(lam * b[left]) * -np.expm1(-lam * (b[left] + 1.0 - a[left])) / (1.0 + q)
    return out


class Laplace(NumericMechanism):
    """Laplace noise on a ``2^-grid_bits`` grid, sampled exactly (module doc). Reports: int32 grid indices."""

    name = "Laplace"

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, grid_bits: int = 12) -> None:
        super().__init__(eps, lo, hi)
        if int(grid_bits) != grid_bits or not 0 <= grid_bits <= 24:
            raise LDPError(f"grid_bits must be an integer in [0, 24], got {grid_bits}")
        self.grid_bits = int(grid_bits)
        self.n_grid = 1 << self.grid_bits
        self.step = 2.0 ** -self.grid_bits
        self.noise_s = NOISE_S
        self.noise_t = math.ceil(Fraction(2 * self.n_grid * NOISE_S) / Fraction(self.eps))
        if self.noise_t >= 1 << 48:
            raise InfeasibleParameters(f"Laplace: ε = {self.eps} is too small for grid_bits = {self.grid_bits}")
        self.lam = NOISE_S / self.noise_t  # -log q, per grid step
        if (lk.CLAMP - self.n_grid) * self.lam < _TAIL_LOG:
            raise InfeasibleParameters(
                f"Laplace: with ε = {self.eps} the noise of grid_bits = {self.grid_bits} would overflow an int32 "
                "report; use a coarser grid (smaller grid_bits)")

    def params(self) -> dict[str, Any]:
        return {**super().params(), "grid_bits": self.grid_bits}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """``2N s / t`` (module doc): the exact ε of the implemented law, ``<= eps``."""
        return float(Fraction(2 * self.n_grid * self.noise_s, self.noise_t))

    def _rounding(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(floor(x N), p)``: the lower grid index and the exact probability of rounding up."""
        a = np.asarray(x, dtype=np.float64) * self.n_grid
        lo = np.floor(a)
        return lo, np.ceil((a - lo) * 2.0 ** 53) / 2.0 ** 53

    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """Mass of the output value ``g × report`` in each bin of ``edges`` (unit domain), exact: the rounding
        mixture of two shifted discrete Laplace laws, clipped at ``±C``."""
        e = np.asarray(edges, dtype=np.float64) * self.n_grid  # edges in grid steps (exact scaling)
        first = np.ceil(e[:-1])
        last = np.ceil(e[1:]) - 1.0
        last[-1] = np.floor(e[-1])  # the last bin is closed
        c = float(lk.CLAMP)
        first = np.where(first <= -c, -np.inf, first)
        last = np.where(last >= c, np.inf, last)
        live = (first <= last) & (first <= c) & (last >= -c)
        lo, p = self._rounding(float(x))
        lo, p = float(lo), float(p)
        out = np.zeros(first.shape[0], dtype=np.float64)
        f, l = first[live], last[live]
        out[live] = (1.0 - p) * _z_mass(f - lo, l - lo, self.lam) + p * _z_mass(f - lo - 1.0, l - lo - 1.0, self.lam)
        return out

    # ---------------------------------------------------------------- device side
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        x, _ = self.prepare(values)
        return lk.laplace_randomize(np.ascontiguousarray(x), noise_key(rng), float(self.n_grid),
                                    np.uint64(self.noise_t), np.uint64(self.noise_s))

    # ---------------------------------------------------------------- server side
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.int32)

    def validate_reports(self, reports: np.ndarray) -> None:
        super().validate_reports(reports)
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"Laplace reports are one index each, got shape {r.shape}")
        if r.size and int(r.min()) < -lk.CLAMP:
            raise InvalidReports(f"a Laplace report is below -{lk.CLAMP}")

    def unit_outputs(self, reports: np.ndarray) -> np.ndarray:
        """The reports as values of the unit domain (``g × index``): what :meth:`output_mass` bins."""
        return np.asarray(reports, dtype=np.float64) * self.step

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``[Σ index]`` (int64): the step's aggregate."""
        self.validate_reports(np.asarray(reports))
        return np.array([np.sum(reports, dtype=np.int64)], dtype=np.int64)

    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """The mean ``g Σ index / n`` and its variance ``g^2 (1 / (2 sinh^2(λ/2)) + 1/4) / n``: the noise's exact
        variance plus the rounding's at its largest (``p = 1/2``), so the interval never undercovers."""
        mean = self.estimate_unit_mean(float(support[0]), n)
        return mean, self.step ** 2 * (0.5 / math.sinh(self.lam / 2.0) ** 2 + 0.25) / n

    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        if n <= 0:
            raise LDPError("no report: no mean")
        return float(report_sum) * self.step / n

    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``g^2 (1 / (2 sinh^2(λ/2)) + p (1 - p))`` (module doc), ``≈ 8 / ε^2``."""
        _, p = self._rounding(x)
        v = self.step ** 2 * (0.5 / math.sinh(self.lam / 2.0) ** 2 + p * (1.0 - p))
        return float(v) if np.ndim(v) == 0 else v
