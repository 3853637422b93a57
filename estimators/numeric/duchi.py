"""Duchi, Jordan & Wainwright's one-dimensional mechanism (JASA 2018), as Wang et al. present it (ICDE 2019,
Algorithm 1, "Duchi et al.'s solution for one-dimensional numeric data").

Input ``x in [-1, 1]``; output ``+B`` with probability ``p(x) = (e^ε - 1) / (2 e^ε + 2) · x + 1/2``, else
``-B``, ``B = (e^ε + 1) / (e^ε - 1)``. Derivation: ``p(±1) = e^ε / (e^ε + 1)`` and ``1 / (e^ε + 1)``, whose
ratio (and that of ``1 - p``) is ``e^ε``: ε-LDP, attained at ``x = ±1``. ``E[out] = B (2p(x) - 1) =
B x (e^ε - 1) / (e^ε + 1) = x``: unbiased; ``E[out^2] = B^2``, so ``Var[out] = B^2 - x^2`` (the
worst case ``B^2 = ((e^ε + 1) / (e^ε - 1))^2`` is the entry of Table IX in Wang, Zhang, Feng & Yang's
survey, §4.1).

**Implemented law.** The Bernoulli draw compares the top 53 bits ``u`` of one 64-bit ChaCha20 word with an
integer threshold: the report is ``+1`` iff ``u < T(x)``, so ``P[+1] = T(x) / 2^53`` exactly, with

* ``T_lo = ceil(2^53 / (e^ε + 1))`` (60-digit decimal arithmetic), ``T(-1) = T_lo``, ``T(1) = 2^53 - T_lo``;
* ``T(x) = T_lo + rint((x + 1) S)``, ``S = 2^52 - T_lo`` (exact integers in float64; the product is at most
  ``2S``, so ``T(x)`` is monotone and stays in ``[T_lo, 2^53 - T_lo]``).

The implemented ε is ``log((2^53 - T_lo) / T_lo) <= ε`` (:attr:`Duchi.eps_first`), equal to ε up to a relative
``~ (e^ε + 1) 2^-53`` (``1e-14`` at ε = 4); it saturates near ``log 2^53 ≈ 36.7`` for larger ε. With the
implemented ``B = 2^52 / S`` (``= (e^ε+1)/(e^ε-1)`` to the same precision) ``E[B · report] = x`` up to
``B 2^-52`` (the ``rint``), and the variance is ``B^2 - x^2``.

Reports are the signs (int8 ±1); the server estimates the unit mean as ``B × sum / n``.
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numba as nb
import numpy as np

from ..errors import InvalidReports, LDPError
from ..kernels import _noise_slots
from ..randomness import noise_key
from ..reference import noise_slots
from .base import NumericMechanism, linear_mean

__all__ = ["Duchi", "duchi_randomize", "np_duchi_randomize", "duchi_threshold_low"]

_TWO53 = 1 << 53
# Serial for now: parallel=True doubles the cold compile (212 against 115 CPU s for the numeric tests on the
# 2-core machine) while the test suite has no room for it; `prange` runs as `range`.
_PAR = dict(parallel=False, cache=True, nogil=True)
_CHUNK = 1 << 14


def duchi_threshold_low(eps: float) -> int:
    """``T_lo = ceil(2^53 / (e^ε + 1))``, at least 1 (module doc)."""
    with localcontext() as ctx:
        ctx.prec = 60
        return max(1, math.ceil(Decimal(_TWO53) / (Decimal(float(eps)).exp() + 1)))


@nb.njit(**_PAR)
def duchi_randomize(x, nkey, t_lo, s):
    """Signs (int8 ±1) of the unit inputs ``x``: ``+1`` iff ``word >> 11 < T_lo + rint((x + 1) S)``, one word of
    row ``i``'s one-word slot of the batch noise stream (``t_lo`` int64, ``s = S`` float64)."""
    n = x.shape[0]
    out = np.empty(n, dtype=np.int8)
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        noise = _noise_slots(nkey, 1, r0, r1)
        for i in range(r0, r1):
            thr = np.uint64(t_lo + np.int64(np.rint((x[i] + 1.0) * s)))
            out[i] = 1 if (noise[i - r0] >> np.uint64(11)) < thr else -1
    return out


def np_duchi_randomize(x: np.ndarray, nkey: np.ndarray, t_lo: int, s: float) -> np.ndarray:
    """The numpy twin of :func:`duchi_randomize`."""
    x = np.asarray(x, dtype=np.float64)
    u = noise_slots(nkey, x.shape[0], 1)[:, 0] >> np.uint64(11)
    thr = (np.int64(t_lo) + np.rint((x + 1.0) * s).astype(np.int64)).astype(np.uint64)
    return np.where(u < thr, 1, -1).astype(np.int8)


class Duchi(NumericMechanism):
    """Duchi et al.'s one-dimensional mechanism (module doc). Reports: int8 signs ±1."""

    name = "Duchi"

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0) -> None:
        super().__init__(eps, lo, hi)
        self.t_lo = duchi_threshold_low(self.eps)
        self.s = (1 << 52) - self.t_lo              # S; an exact float64 (< 2^52)
        self.B = float((1 << 52) / self.s)          # the implemented (e^ε+1)/(e^ε-1)

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """``log((2^53 - T_lo) / T_lo)``: the ε of the implemented law, ``<= eps``."""
        return math.log(_TWO53 - self.t_lo) - math.log(self.t_lo)

    def p_plus(self, x: np.ndarray | float) -> np.ndarray | float:
        """``P[report = +1 | x] = T(x) / 2^53`` exactly (module doc)."""
        t = self.t_lo + np.rint((np.asarray(x, dtype=np.float64) + 1.0) * float(self.s))
        return t / float(_TWO53)

    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """Mass of the output value ``B × report`` (``-B`` or ``+B``) in each bin of ``edges``."""
        e = np.asarray(edges, dtype=np.float64)
        p = float(self.p_plus(float(x)))
        out = np.zeros(e.shape[0] - 1, dtype=np.float64)
        for value, mass in ((-self.B, 1.0 - p), (self.B, p)):
            if e[0] <= value <= e[-1]:
                j = min(int(np.searchsorted(e, value, side="right")) - 1, out.shape[0] - 1)
                out[j] += mass
        return out

    # ---------------------------------------------------------------- device side
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        x, _ = self.prepare(values)
        return duchi_randomize(np.ascontiguousarray(x), noise_key(rng), np.int64(self.t_lo), float(self.s))

    # ---------------------------------------------------------------- server side
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.int8)

    def validate_reports(self, reports: np.ndarray) -> None:
        super().validate_reports(reports)
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"Duchi reports are one sign each, got shape {r.shape}")
        if r.size and not np.all((r == 1) | (r == -1)):
            raise InvalidReports("a Duchi report is not ±1")

    def unit_outputs(self, reports: np.ndarray) -> np.ndarray:
        """The reports as values of the unit domain (``±B``): what :meth:`output_mass` bins."""
        return np.asarray(reports, dtype=np.float64) * self.B

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``[reports of +1]`` (int64): the step's aggregate."""
        self.validate_reports(np.asarray(reports))
        return np.array([np.count_nonzero(np.asarray(reports) > 0)], dtype=np.int64)

    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """``B (2 n₊ - n) / n`` and the sample variance of ``±B`` over ``n`` (:func:`.base.linear_mean`)."""
        plus = int(support[0])
        if not 0 <= plus <= n:
            raise LDPError(f"Duchi: {plus} reports of +1 among {n}")
        return linear_mean(plus, plus, n, 2.0 * self.B, -self.B)

    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        if n <= 0:
            raise LDPError("no report: no mean")
        return self.B * float(report_sum) / n

    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``B^2 - x^2`` (module doc), with the implemented ``B``."""
        v = self.B ** 2 - np.asarray(x, dtype=np.float64) ** 2
        return float(v) if np.ndim(v) == 0 else v
