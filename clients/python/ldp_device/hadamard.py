"""Hadamard response: HR and FHR (``estimators/hadamard.py``; the draws of ``kernels.hr_randomize`` and
``kernels.fhr_randomize``). Value ``v`` is row/column ``v + 1`` of the Sylvester Hadamard matrix of order ``K``
(the smallest power of two ``> k``), ``H[r, c] = (-1)^popcount(r & c)``."""
from __future__ import annotations

import math
from typing import ClassVar

from .base import MemoState, SingleShot, uint_size
from .calibration import hadamard_order, keep_probability, log1p
from .errors import LDPError
from .streams import KeySource, NoiseDraws

__all__ = ["HR", "FHR", "MAX_K"]

MAX_K = 1 << 24
HR_SLOT = 2   # noise words: 0 the row j, 1 keep?
FHR_SLOT = 3  # noise words: 0 the +1 column x, 1 the -1 column y, 2 keep?


def _parity(x: int) -> int:
    return x.bit_count() & 1


class _Hadamard(SingleShot):
    def __init__(self, k: int, eps: float) -> None:
        self._init(k, eps)
        if self.k > MAX_K:
            raise LDPError(f"{self.name} supports k <= {MAX_K}, got {self.k}")
        self.K = hadamard_order(self.k)
        self.p = keep_probability(self.eps)


class HR(_Hadamard):
    """Hadamard randomized response: report ``2 j + bit`` (bit 1 = +1)."""

    name: ClassVar[str] = "HR"

    @property
    def ps(self) -> float:
        return self.p

    @property
    def qs(self) -> float:
        return 0.5

    @property
    def eps_first(self) -> float:
        return math.log(self.p) - log1p(-self.p)

    @property
    def report_itemsize(self) -> int:
        return uint_size(2 * self.K)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        noise = NoiseDraws(draw_key(), HR_SLOT)
        j = int(noise.unit(0) * self.K)
        bit = 1 - _parity(j & (v + 1))
        if noise.unit(1) >= self.p:
            bit = 1 - bit
        return ((j << 1) | bit).to_bytes(self.report_itemsize, "little")


class FHR(_Hadamard):
    """Flexible Hadamard Response: report ``(P, M)``, the positions of the +1 and of the -1."""

    name: ClassVar[str] = "FHR"

    @property
    def eta(self) -> float:
        return (4 * (self.K // 4) ** 2) / (2 * (self.K // 2) ** 2)

    @property
    def eps_fldp(self) -> float:
        hi, lo = 4.0 * self.p / self.K ** 2, 4.0 * (1.0 - self.p) / self.K ** 2
        return math.log(hi) - math.log(lo)

    @property
    def eps_first(self) -> float:
        return math.inf if self.eta < 1.0 else self.eps_fldp

    @property
    def ps(self) -> float:  # not a pure protocol; Var* is computed by the reference's formula
        raise LDPError("FHR is not a pure protocol")

    def variance(self, n: int) -> float:
        a2 = (2.0 * self.p - 1.0) ** 2
        return ((1.0 + 0.0) / (2.0 * a2) - 0.0) / n

    @property
    def report_itemsize(self) -> int:
        return uint_size(self.K)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (2,)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        noise = NoiseDraws(draw_key(), FHR_SLOT)
        w = v + 1
        low = w & -w
        x = int(noise.unit(0) * self.K)
        if _parity(w & x) == 1:
            x ^= low
        y = int(noise.unit(1) * self.K)
        if _parity(w & y) == 0:
            y ^= low
        pos, neg = (x, y) if noise.unit(2) < self.p else (y, x)
        size = self.report_itemsize
        return pos.to_bytes(size, "little") + neg.to_bytes(size, "little")
