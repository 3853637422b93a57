"""The Laplace mechanism on a ``2^-grid_bits`` grid, sampled exactly (``estimators/numeric/laplace.py`` and the draws
of ``laplace_kernels.py``).

A report of unit input ``x``: ``a = x N`` (``N = 2^grid_bits``) rounded up to ``floor(a) + 1`` with probability
``ceil(f 2^53) / 2^53`` (``f = a - floor(a)``), plus the discrete Laplace noise ``P[Z = z] ∝ q^|z|``,
``q = exp(-s / t)`` (``s = 2^20``, ``t = ceil(2N s / ε)``) by Canonne, Kamath & Steinke's exact sampler
(NeurIPS 2020, Algorithms 1-2), clipped to ``[-C, C]`` (``C = 2^31 - 1``): an int32 grid index. The words of the
report's noise slot (2 words) and then of its extension stream are read as a stream of random bits, low bit first.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState
from .errors import InfeasibleParameters
from .numeric import NumericMechanism, check_int
from .streams import KeySource, NoiseDraws

__all__ = ["Laplace", "LAPLACE_SLOT", "CLAMP", "NOISE_S"]

LAPLACE_SLOT = 2
CLAMP = (1 << 31) - 1
NOISE_S = 1 << 20
_TWO53 = float(1 << 53)
_TAIL_LOG = 64 * math.log(2.0)


class _Bits:
    """A report's random bits: the words of its noise draws, low bit first (``laplace_kernels._take``)."""

    __slots__ = ("draws", "buf", "have", "j")

    def __init__(self, draws: NoiseDraws) -> None:
        self.draws, self.buf, self.have, self.j = draws, 0, 0, 0

    def take(self, k: int) -> int:
        if k <= self.have:
            r = self.buf & ((1 << k) - 1)
            self.buf >>= k
            self.have -= k
            return r
        w = self.draws.word(self.j)
        self.j += 1
        need = k - self.have
        r = self.buf | ((w & ((1 << need) - 1)) << self.have)
        self.buf, self.have = w >> need, 64 - need
        return r

    def bern_ratio(self, num: int, den: int) -> bool:
        """``Bernoulli(num / den)`` exactly: random bits against the binary expansion of ``num / den``."""
        if num >= den:
            return True
        r = num
        while r:
            r <<= 1
            c = int(r >= den)
            r -= c * den
            if self.take(1) != c:
                return c == 1
        return False

    def uniform_below(self, t: int, tbits: int) -> int:
        if tbits == 0:
            return 0
        while True:
            u = self.take(tbits)
            if u < t:
                return u

    def bern_exp(self, num: int, den: int) -> bool:
        """``Bernoulli(exp(-num/den))``, ``0 <= num <= den`` (Canonne, Kamath & Steinke, Algorithm 1)."""
        k = 1
        while self.bern_ratio(num, den * k):
            k += 1
        return k % 2 == 1


class Laplace(NumericMechanism):
    """Laplace noise on a ``2^-grid_bits`` grid, sampled exactly. Reports: int32 grid indices."""

    name: ClassVar[str] = "Laplace"
    signed: ClassVar[bool] = True
    _derived = (("n_grid",), ("noise_s", "noise_t"), ())

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, grid_bits: int = 12) -> None:
        self._init_numeric(eps, lo, hi)
        self.grid_bits = check_int("grid_bits", grid_bits, 0, 24)
        self.n_grid = 1 << self.grid_bits
        self.noise_s = NOISE_S
        num, den = self.eps.as_integer_ratio()
        self.noise_t = -(-(2 * self.n_grid * NOISE_S * den) // num)  # ceil(2N s / ε), ε's exact binary value
        if self.noise_t >= 1 << 48:
            raise InfeasibleParameters(f"Laplace: ε = {self.eps} is too small for grid_bits = {self.grid_bits}")
        self.lam = NOISE_S / self.noise_t
        if (CLAMP - self.n_grid) * self.lam < _TAIL_LOG:
            raise InfeasibleParameters(
                f"Laplace: with ε = {self.eps} the noise of grid_bits = {self.grid_bits} would overflow an int32 "
                "report; use a coarser grid (smaller grid_bits)")
        self.tbits = (self.noise_t - 1).bit_length()

    def params(self) -> dict[str, Any]:
        return {**super().params(), "grid_bits": self.grid_bits}

    @property
    def eps_first(self) -> float:
        """``2N s / t`` (correctly rounded), ``<= eps``."""
        return (2 * self.n_grid * self.noise_s) / self.noise_t

    @property
    def report_itemsize(self) -> int:
        return 4

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:
        bits = _Bits(NoiseDraws(draw_key(), LAPLACE_SLOT))
        a = x * float(self.n_grid)
        lo = math.floor(a)
        k = int(lo) + int(bits.bern_ratio(math.ceil((a - lo) * _TWO53), 1 << 53))
        t, s = self.noise_t, self.noise_s
        while True:
            u = bits.uniform_below(t, self.tbits)
            if not bits.bern_exp(u, t):
                continue
            v = 0
            while bits.bern_exp(1, 1):
                v += 1
            y = (u + t * v) // s
            neg = bits.take(1) == 1
            if neg and y == 0:
                continue
            return self._report(min(max(k - y if neg else k + y, -CLAMP), CLAMP))
