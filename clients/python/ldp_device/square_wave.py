"""Square Wave (SW) of Li et al. (SIGMOD 2020) on ``d_out`` exact output cells over ``d_in`` input grid points
(``estimators/numeric/square_wave.py``; the draws of ``sw_kernels.py``).

A report reads the 4 words of its noise slot: word 0 rounds ``t = v (d_in - 1)`` (``v = (x + 1) / 2``) to a grid
point ``g`` without bias, word 1 the window start of ``g`` (``s_lo[g]`` or one more), word 2 "near" (``w2 < T``,
``P = T / 2^64``), word 3 a uniform cell of the window (``K`` cells) or outside it (``L = d_out - K``): the word
modulo ``m`` once it is at most ``2^64 - 1 - (2^64 mod m)``, redrawn from the extension stream otherwise.
Reports: uint16 cells.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState
from .numeric import NumericMechanism, check_int
from .streams import KeySource, NoiseDraws, unit

__all__ = ["SW", "optimal_b"]

_TWO64 = 1 << 64
_TWO53 = 1 << 53
MAX_CELLS = 1 << 16
SW_SLOT = 4


def optimal_b(eps: float) -> float:
    """Li et al.'s ``b = (ε e^ε - e^ε + 1) / (2 e^ε (e^ε - 1 - ε))``, written with ``expm1``."""
    em1 = math.expm1(eps)
    return (eps * (em1 + 1.0) - em1) / (2.0 * (em1 + 1.0) * (em1 - eps))


def _limit(m: int) -> int:
    """The largest 64-bit word a uniform draw of ``[0, m)`` by ``word % m`` accepts."""
    return _TWO64 - 1 - (_TWO64 % m)


class SW(NumericMechanism):
    """Square Wave on ``d_out`` output cells over ``d_in`` input grid points. Reports: uint16 cells."""

    name: ClassVar[str] = "SW"
    _derived = (("k", "l"), ("t_near",), ("b",))

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, d_in: int = 1024, d_out: int = 1024) -> None:
        from decimal import Decimal, localcontext  # on first use

        self._init_numeric(eps, lo, hi)
        self.d_in = check_int("d_in (input grid points)", d_in, 2, MAX_CELLS)
        self.d_out = check_int("d_out (output cells)", d_out, 2, MAX_CELLS)
        self.support_size = self.d_out  # the server's aggregate: reports per cell
        self.b = optimal_b(self.eps)
        kw = min(max(round(2.0 * self.b * self.d_out / (1.0 + 2.0 * self.b)), 1), self.d_out - 1)
        self.kw, self.l = int(kw), int(self.d_out - kw)
        with localcontext() as ctx:
            ctx.prec = 80
            ke = Decimal(self.kw) * Decimal(self.eps).exp()
            t = int((Decimal(_TWO64) * ke / (ke + Decimal(self.l))).to_integral_value(rounding="ROUND_FLOOR"))
        self.t_near = min(max(t, 1), _TWO64 - 1)
        self.lim_k, self.lim_l = _limit(self.kw), _limit(self.l)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "d_in": self.d_in, "d_out": self.d_out}

    def _figure(self, name: str) -> Any:
        return self.kw if name == "k" else getattr(self, name)

    @property
    def eps_first(self) -> float:
        """``log(T L / ((2^64 - T) K))``, ``<= eps`` (60-digit decimal logarithms)."""
        from decimal import Decimal, localcontext

        with localcontext() as ctx:
            ctx.prec = 60
            return float(Decimal(self.t_near * self.l).ln() - Decimal((_TWO64 - self.t_near) * self.kw).ln())

    def start(self, g: int) -> tuple[int, int]:
        """``(s_lo[g], s_thr[g])``: grid point ``g``'s lower window start and the threshold (over ``2^53``) of
        the start one cell later."""
        den = self.d_in - 1
        m = g * self.l
        return m // den, (2 * (m % den) * _TWO53 + den) // (2 * den)

    @property
    def report_itemsize(self) -> int:
        return 2

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:
        draws = NoiseDraws(draw_key(), SW_SLOT)
        t = (x + 1.0) * 0.5 * float(self.d_in - 1)
        i0 = min(max(math.floor(t), 0), self.d_in - 2)
        g = i0 + 1 if unit(draws.word(0)) < t - i0 else i0
        s_lo, s_thr = self.start(g)
        s = s_lo + (1 if (draws.word(1) >> 11) < s_thr else 0)
        near = draws.word(2) < self.t_near
        m, lim = (self.kw, self.lim_k) if near else (self.l, self.lim_l)
        w, j = draws.word(3), SW_SLOT
        while w > lim:
            w = draws.word(j)
            j += 1
        u = w % m
        if near:
            return self._report(s + u)
        return self._report(u + self.kw if u >= s else u)
