"""Duchi, Jordan & Wainwright's one-dimensional mechanism (``estimators/numeric/duchi.py``).

The report is ``+1`` iff the top 53 bits of the report's one noise word are below ``T_lo + rint((x + 1) S)``,
``T_lo = ceil(2^53 / (e^ε + 1))`` (60-digit decimal arithmetic), ``S = 2^52 - T_lo``; else ``-1``: an int8 sign.
"""
from __future__ import annotations

import math
from typing import ClassVar

from .base import MemoState
from .numeric import NumericMechanism
from .streams import NOISE, KeySource, Stream

__all__ = ["Duchi", "duchi_threshold_low", "duchi_sign"]

_TWO53 = 1 << 53


def duchi_threshold_low(eps: float) -> int:
    """``T_lo = ceil(2^53 / (e^ε + 1))``, at least 1 (``duchi.duchi_threshold_low``; HM caps ε at 100)."""
    from decimal import Decimal, localcontext  # on first use (it is not light to import)

    with localcontext() as ctx:
        ctx.prec = 60
        return max(1, math.ceil(Decimal(_TWO53) / (Decimal(float(eps)).exp() + 1)))


def duchi_sign(x: float, w: int, t_lo: int, s: int) -> bool:
    """Whether the sign is ``+1``: ``w >> 11 < T_lo + rint((x + 1) S)`` (``round`` is round-half-even, as rint)."""
    return (w >> 11) < t_lo + round((x + 1.0) * float(s))


class Duchi(NumericMechanism):
    """Duchi et al.'s mechanism. Reports: int8 signs ±1."""

    name: ClassVar[str] = "Duchi"
    signed: ClassVar[bool] = True
    _derived = ((), ("t_lo", "s"), ("B",))

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0) -> None:
        self._init_numeric(eps, lo, hi)
        self.t_lo = duchi_threshold_low(self.eps)
        self.s = (1 << 52) - self.t_lo
        self.B = float((1 << 52) / self.s)

    @property
    def eps_first(self) -> float:
        """``log((2^53 - T_lo) / T_lo)``, ``<= eps``."""
        return math.log(_TWO53 - self.t_lo) - math.log(self.t_lo)

    @property
    def report_itemsize(self) -> int:
        return 1

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:
        w = Stream(draw_key(), NOISE, 0, 1).word(0)
        return self._report(1 if duchi_sign(x, w, self.t_lo, self.s) else -1)
