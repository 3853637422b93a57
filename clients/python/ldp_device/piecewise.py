"""The Piecewise Mechanism (PM) and the Hybrid Mechanism (HM) of Wang et al. (ICDE 2019) on an exact discrete
output grid (``estimators/numeric/piecewise.py``; the draws of ``piecewise_kernels.py``).

**PM**: ``M = 2^grid_bits`` cells, a window of ``K`` cells starting at ``s0`` or ``s0 + 1``; the cell masses are
integers over ``Z = K A + L B <= 2^64`` (``L = M - K``), so ONE 64-bit word of the report's noise slot draws
the cell (redrawn from the extension stream while ``>= Z``). Reports: uint16 cells (``grid_bits <= 16``), else
uint32. **HM**: word 0 picks the branch (PM iff ``w0 < T_α``), word 1 is PM's word (redraws from the extension
stream) or Duchi et al.'s sign (code ``M`` for ``-B``, ``M + 1`` for ``+B``). Reports: uint32 codes.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState
from .duchi import duchi_sign
from .errors import InfeasibleParameters
from .numeric import NumericMechanism, check_int
from .streams import KeySource, NoiseDraws

__all__ = ["PM", "HM", "EPS_STAR", "hm_alpha", "pm_cell"]

_TWO64 = 1 << 64
_TWO53 = 1 << 53
MIN_BITS, MAX_BITS = 4, 24
PM_SLOT, HM_SLOT = 1, 2

#: Wang et al.'s threshold below which HM is Duchi et al.'s mechanism alone (§III-C): ≈ 0.61
EPS_STAR = math.log((-5.0 + 2.0 * (6353.0 - 405.0 * math.sqrt(241.0)) ** (1.0 / 3.0)
                     + 2.0 * (6353.0 + 405.0 * math.sqrt(241.0)) ** (1.0 / 3.0)) / 27.0)


def _expm1(v: float) -> float:
    return math.expm1(min(v, 700.0))


def hm_alpha(eps: float) -> float:
    """Wang et al.'s HM mixing probability: ``1 - e^{-ε/2}`` for ``ε > ε*``, else 0."""
    return -math.expm1(-eps / 2.0) if eps > EPS_STAR else 0.0


def pm_cell(pm: "PM", x: float, draws: NoiseDraws, j0: int) -> int:
    """PM's cell for unit input ``x`` from draw ``j0`` of ``draws`` (the next draws while a word is ``>= Z``):
    ``piecewise_kernels._pm_cell``."""
    l_f = float(pm.l)
    t = (x + 1.0) * 0.5 * l_f
    s0 = math.floor(t)  # an integral float in the kernel: compared and subtracted as such
    s0f = float(s0)
    if s0f > l_f - 1.0:
        s0f = l_f - 1.0
    f = t - s0f
    d_ab = pm.a - pm.b
    if f >= 1.0:
        q = d_ab
    else:
        q = min(int(round(f * float(d_ab))), d_ab)
    s = int(s0f)
    w, j = draws.word(j0), j0 + 1
    while w > pm.zlim:
        w = draws.word(j)
        j += 1
    a, b, k = pm.a, pm.b, pm.kw
    ka1 = a * (k - 1)
    if w < ka1:
        return s + 1 + w // a
    v = w - ka1
    if v < a + b:
        return s if v < a - q else s + k
    u = (v - a - b) // b
    return u if u < s else u + k + 1


class PM(NumericMechanism):
    """Wang et al.'s Piecewise Mechanism on ``2^grid_bits`` exact output cells. Reports: cell indices."""

    name: ClassVar[str] = "PM"
    support_size = 2  # the server's aggregate: [Σ c, Σ c^2]
    _derived = (("m", "k", "l"), ("a", "b", "z"), ())

    def _figure(self, name: str) -> Any:
        return self.kw if name == "k" else getattr(self, name)

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, grid_bits: int = 16) -> None:
        from decimal import ROUND_FLOOR, Decimal, localcontext  # on first use

        self._init_numeric(eps, lo, hi)
        self.grid_bits = check_int("grid_bits", grid_bits, MIN_BITS, MAX_BITS)
        self.m = 1 << self.grid_bits
        ea = _expm1(self.eps / 2.0) + 1.0
        self.kw = int(min(max(round(self.m / (ea + 1.0)), 1), self.m // 2))  # K: the window's cells
        self.l = self.m - self.kw
        with localcontext() as ctx:
            ctx.prec = 80
            e = Decimal(min(self.eps, 100.0)).exp()
            b = int((Decimal(_TWO64) / (self.kw * e + self.l)).to_integral_value(rounding=ROUND_FLOOR))
            b = max(b, 1)
            a = int((b * e).to_integral_value(rounding=ROUND_FLOOR))
        a = min(a, (_TWO64 - self.l * b) // self.kw)
        if a - b < 1 << 32:
            raise InfeasibleParameters(f"PM: ε = {self.eps} is too small for grid_bits = {self.grid_bits} (the "
                                       "cell masses' integers differ by less than 2^32); use a coarser grid")
        self.a, self.b = a, b
        self.z = self.kw * a + self.l * b
        self.zlim = self.z - 1

    def params(self) -> dict[str, Any]:
        return {**super().params(), "grid_bits": self.grid_bits}

    @property
    def eps_first(self) -> float:
        """``log(A / B)``, ``<= eps``."""
        return math.log1p((self.a - self.b) / self.b)

    @property
    def report_itemsize(self) -> int:
        return 2 if self.grid_bits <= 16 else 4

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:
        return self._report(pm_cell(self, x, NoiseDraws(draw_key(), PM_SLOT), 0))


class HM(NumericMechanism):
    """Wang et al.'s Hybrid Mechanism: PM with probability ``α``, else Duchi et al.'s sign. Reports: uint32 codes,
    ``0 .. M-1`` PM cells, ``M`` = ``-B``, ``M + 1`` = ``+B``."""

    name: ClassVar[str] = "HM"
    support_size = 5  # [PM reports, Σ c, Σ c^2 over them, reports of -B, of +B]
    _derived = (("m", "k", "l"), ("a", "b", "z", "t_alpha", "d_tlo", "d_s"), ("B",))

    def _figure(self, name: str) -> Any:
        return self.pm._figure(name) if name in ("k", "l", "a", "b", "z") else getattr(self, name)

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, grid_bits: int = 16) -> None:
        from decimal import Decimal, localcontext

        self._init_numeric(eps, lo, hi)
        self.pm = PM(self.eps, lo, hi, grid_bits)
        self.grid_bits, self.m = self.pm.grid_bits, self.pm.m
        self.alpha_paper = hm_alpha(self.eps)
        self.t_alpha = min(round(self.alpha_paper * _TWO64), _TWO64 - 1)
        with localcontext() as ctx:
            ctx.prec = 60
            self.d_tlo = max(1, math.ceil(Decimal(_TWO53) / (Decimal(min(self.eps, 100.0)).exp() + 1)))
        self.d_s = (1 << 52) - self.d_tlo
        self.B = float((1 << 52) / self.d_s)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "grid_bits": self.grid_bits}

    @property
    def duchi_eps(self) -> float:
        return math.log1p((_TWO53 - 2 * self.d_tlo) / self.d_tlo)

    @property
    def eps_first(self) -> float:
        """``max(ε of PM's cells, ε of Duchi's signs)`` over the branches that can occur."""
        return max(self.duchi_eps, self.pm.eps_first if self.t_alpha > 0 else 0.0)

    @property
    def report_itemsize(self) -> int:
        return 4

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:
        draws = NoiseDraws(draw_key(), HM_SLOT)
        if draws.word(0) < self.t_alpha:
            return self._report(pm_cell(self.pm, x, draws, 1))
        return self._report(self.m + 1 if duchi_sign(x, draws.word(1), self.d_tlo, self.d_s) else self.m)
