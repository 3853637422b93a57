"""Adaptive protocol choice by the smaller approximate variance (``estimators/adaptive.py``): ADP picks GRR or
OUE, L-ADP picks L-GRR or L-OSUE. The choice depends only on public parameters, so both sides agree on it."""
from __future__ import annotations

from typing import Any, ClassVar

from .base import MemoState, Protocol
from .direct import GRR, LGRR
from .streams import KeySource
from .unary import LOSUE, OUE

__all__ = ["ADP", "LADP"]

_N_REF = 10_000  # Var* scales as 1/n: any n gives the same choice


class Adaptive(Protocol):
    """Delegates every call to the candidate with the smaller Var*; ``chosen`` tells which."""

    def _choose(self, a: Protocol, b: Protocol) -> None:
        self.chosen: Protocol = a if a.variance(_N_REF) <= b.variance(_N_REF) else b  # type: ignore[attr-defined]
        self.k = self.chosen.k

    def params(self) -> dict[str, Any]:
        inner = dict(self.chosen.params())
        inner["chosen"] = inner.pop("protocol")
        return {"protocol": self.name, **inner}

    eps_first = property(lambda self: self.chosen.eps_first)
    eps_inf = property(lambda self: self.chosen.eps_inf)
    memo_size = property(lambda self: self.chosen.memo_size)
    report_itemsize = property(lambda self: self.chosen.report_itemsize)
    report_shape = property(lambda self: self.chosen.report_shape)
    ps = property(lambda self: self.chosen.ps)
    qs = property(lambda self: self.chosen.qs)

    def longitudinal_loss(self, memoized: int) -> float:
        return self.chosen.longitudinal_loss(memoized)

    def variance(self, n: int) -> float:
        return self.chosen.variance(n)  # type: ignore[attr-defined]

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        return self.chosen._randomize(v, draw_key, state)

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        v = self.check_value(value)
        self._state_for(state)
        return self.chosen.memoized_output(v, MemoState(self.chosen.fingerprint, state.key, state.memo_size,
                                                        bytearray(state.seen)))


class ADP(Adaptive):
    name: ClassVar[str] = "ADP"
    longitudinal: ClassVar[bool] = False

    def __init__(self, k: int, eps: float) -> None:
        self._choose(GRR(k, eps), OUE(k, eps))


class LADP(Adaptive):
    name: ClassVar[str] = "L-ADP"
    longitudinal: ClassVar[bool] = True

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration: str = "exact") -> None:
        self._choose(LGRR(k, eps_inf, eps_1, calibration), LOSUE(k, eps_inf, eps_1, calibration))
