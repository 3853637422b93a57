"""1BitMean with α-point rounding and memoization (Ding, Kulkarni & Yekhanin, NeurIPS 2017;
``estimators/numeric/onebit.py``, the draws of ``onebit_kernels.py``).

A device's memo state is a 256-bit key: its ``α = unit(word 0 of (key, ONEBIT_ALPHA, 0))`` is fixed forever, a
value rounds to point ``j + 1`` of ``{0, ..., s}`` iff ``α < f`` (``t = (x + 1) / 2 · s``, ``j = min(floor t,
s - 1)``, ``f = t - j``), and the bit of point ``j'`` is ``1`` iff the top 53 bits of word 0 of ``(key, PRR, j')``
are below ``T_lo + j' step`` (memoized: the same point always gives the same bit; the point is marked in the memo
state). With ``gamma > 0`` each report flips the bit iff the top 53 bits of its fresh noise word are below
``G = round(γ 2^53)``. Reports: uint8 bits.

The ledger: ``memo_size = s + 1`` points, longitudinal loss ``ε_memo × distinct points``.
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState
from .errors import InfeasibleParameters, LDPError
from .numeric import NumericMechanism
from .streams import NOISE, ONEBIT_ALPHA, PRR, KeySource, Stream, unit

__all__ = ["OneBitMean", "MAX_S"]

_TWO53 = 1 << 53
_TWO106 = 1 << 106
MAX_S = 1 << 20


def _log_ratio(num: int, den: int) -> float:
    """``log(num / den)`` of two big integers (60-digit decimal logarithms)."""
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 60
        return float(Decimal(num).ln() - Decimal(den).ln())


class OneBitMean(NumericMechanism):
    """1BitMean over ``s`` rounding buckets with output perturbation ``gamma``. Reports: uint8 bits."""

    name: ClassVar[str] = "1BitMean"
    longitudinal: ClassVar[bool] = True
    _derived = ((), ("t_lo", "step", "g"), ("eps_memo",))

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, s: int = 16, gamma: float = 0.0) -> None:
        from decimal import Decimal, localcontext  # on first use

        self._init_numeric(eps, lo, hi)
        try:
            ok = not isinstance(s, bool) and int(s) == s and 1 <= s <= MAX_S
        except (TypeError, ValueError, OverflowError):
            ok = False
        if not ok:
            raise LDPError(f"s (rounding buckets) must be an integer in [1, {MAX_S}], got {s!r}")
        self.s = int(s)
        try:
            gamma = float(gamma)
        except (TypeError, ValueError):
            raise LDPError(f"gamma (output perturbation) must lie in [0, 0.5), got {gamma!r}") from None
        if not 0.0 <= gamma < 0.5:
            raise LDPError(f"gamma (output perturbation) must lie in [0, 0.5), got {gamma}")
        self.gamma = gamma
        with localcontext() as ctx:
            ctx.prec = 60
            t_lo = int((Decimal(_TWO53) / (Decimal(self.eps).exp() + 1)).to_integral_value(rounding="ROUND_CEILING"))
        self.t_lo = max(1, t_lo)
        self.step = (_TWO53 - 2 * self.t_lo) // self.s
        if self.step < 1:
            raise InfeasibleParameters(f"1BitMean: ε = {self.eps} is too small for s = {self.s} buckets")
        self.t_hi = self.t_lo + self.s * self.step
        self.g = int(round(gamma * _TWO53))
        self._n0 = self.g * _TWO53 + (_TWO53 - 2 * self.g) * self.t_lo
        self._n1 = (_TWO53 - 2 * self.g) * self.step

    def params(self) -> dict[str, Any]:
        return {**super().params(), "s": self.s, "gamma": self.gamma}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """``log max(P_s / P_0, (1 - P_0) / (1 - P_s))`` of one report, ``<= eps``."""
        n_s = self._n0 + self.s * self._n1
        return max(_log_ratio(n_s, self._n0), _log_ratio(_TWO106 - self._n0, _TWO106 - n_s))

    @property
    def eps_memo(self) -> float:
        """ε of one memoized bit: ``log max(T_s / T_lo, (2^53 - T_lo) / (2^53 - T_s))``."""
        return max(_log_ratio(self.t_hi, self.t_lo), _log_ratio(_TWO53 - self.t_lo, _TWO53 - self.t_hi))

    @property
    def eps_inf(self) -> float:
        return self.eps_memo

    @property
    def memo_size(self) -> int:
        """Memoizable rounded points ``{0, ..., s}``."""
        return self.s + 1

    def longitudinal_loss(self, memoized: int) -> float:
        """``ε_memo × min(k, s + 1)`` after ``k`` distinct rounded points."""
        return min(max(int(memoized), 0), self.memo_size) * self.eps_memo

    # ---------------------------------------------------------------- device side
    @property
    def report_itemsize(self) -> int:
        return 1

    def _state_for(self, state: MemoState | None) -> MemoState | None:
        """A memo state (the device's: memoized), or ``None``: a fresh device per report (single shot)."""
        if state is not None:
            state.check(self.fingerprint)
        return state

    def point(self, x: float, alpha: float) -> int:
        """α-point rounding of unit input ``x`` to a point of ``{0, ..., s}``: ``j + 1`` iff ``alpha < f``."""
        t = (x + 1.0) * 0.5 * self.s
        j = min(max(math.floor(t), 0), self.s - 1)
        return j + 1 if alpha < t - j else j

    def alpha(self, state: MemoState) -> float:
        """The device's α in ``[0, 1)``: ``unit`` of word 0 of ``(memo key, ONEBIT_ALPHA, 0)``."""
        a = state.responses.get(("1bit-alpha",))
        if a is None:
            a = state.responses[("1bit-alpha",)] = unit(Stream(state.key, ONEBIT_ALPHA, 0, 1).word(0))
        return a

    def memoized_bit(self, j: int, state: MemoState) -> int:
        """The device's permanent bit of rounded point ``j``: word 0 of ``(memo key, PRR, j)`` below ``T_j``."""
        ck = ("1bit", self.t_lo, self.step, j)
        b = state.responses.get(ck)
        if b is None:
            w = Stream(state.key, PRR, j, 1).word(0)
            b = state.responses[ck] = int((w >> 11) < self.t_lo + j * self.step)
        return b

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:
        if state is None:  # single shot: α, the bit and the flip from the report's noise slot
            words = Stream(draw_key(), NOISE, 0, 3 if self.g > 0 else 2)
            j = self.point(x, unit(words.word(0)))
            bit = int((words.word(1) >> 11) < self.t_lo + j * self.step)
            if self.g > 0 and (words.word(2) >> 11) < self.g:
                bit ^= 1
            return self._report(bit)
        nkey = draw_key() if self.g > 0 else None
        j = self.point(x, self.alpha(state))
        state.mark(j)
        bit = self.memoized_bit(j, state)
        if nkey is not None and (Stream(nkey, NOISE, 0, 1).word(0) >> 11) < self.g:
            bit ^= 1
        return self._report(bit)
