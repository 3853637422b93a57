"""Numeric attributes on the device: the base of every numeric mechanism (``estimators/numeric/base.py`` and
``protocol.py``: a mechanism behind the protocol contract).

A numeric campaign attribute (``type = "numeric"``, ``range = [lo, hi]``, ``mechanism``, ``eps`` and the
mechanism's own parameters) holds a measurement, not a domain index. The device maps it to the mechanism's input
``x = 2 (clip(v, lo, hi) - lo) / (hi - lo) - 1`` in ``[-1, 1]`` (float64, the reference's operations in its
order; a value outside ``[lo, hi]`` is clipped to the nearest end and the device counts it, the server never
learns it), then randomizes ``x`` into ONE little-endian integer report with draws from ChaCha20 streams: the
report's noise slot ``(noise key, NOISE, 0)`` and, past the slot, its extension stream ``(noise key, NOISE_EXT,
0)`` (:class:`ldp_device.streams.NoiseDraws`); 1BitMean's memoized draws come from the device's memo key.

The families: :mod:`.laplace` (exact discrete Laplace), :mod:`.duchi`, :mod:`.piecewise` (PM, HM),
:mod:`.square_wave` (SW), :mod:`.onebit` (1BitMean, memoized). Every calibrated figure is computed with exact
integers (``decimal`` where the reference uses it), so the reports are the reference's byte for byte
(``tests/data/randomizer-vectors.json``, section ``numeric``).
"""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState, Protocol
from .calibration import check_eps
from .errors import LDPError
from .streams import KeySource, os_key

__all__ = ["NumericMechanism", "to_unit", "numeric_value", "check_int"]


def numeric_value(value: Any, what: str = "a numeric value") -> float:
    """``value`` as a float: a finite number (int or float, not a bool or a string); :class:`LDPError` otherwise."""
    if isinstance(value, (bool, str, bytes)) or not isinstance(value, (int, float)):
        try:  # numbers of other types (numpy scalars, Decimal, Fraction): whatever converts with __float__
            if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
                raise TypeError
            v = float(value)
        except (TypeError, ValueError):
            raise LDPError(f"{what} must be a number, got {value!r}") from None
    else:
        v = float(value)
    if not math.isfinite(v):
        raise LDPError(f"{what} is not a finite number, got {value!r}")
    return v


def to_unit(v: float, lo: float, hi: float) -> tuple[float, bool]:
    """``(x, clipped)``: the value in ``[-1, 1]`` (``estimators.numeric.base.to_unit``) and whether it was
    outside ``[lo, hi]``."""
    clipped = v < lo or v > hi
    x = 2.0 * (min(max(v, lo), hi) - lo) / (hi - lo) - 1.0
    return min(max(x, -1.0), 1.0), clipped


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """An integer parameter in ``[lo, hi]`` (an integral float is accepted, a bool is not)."""
    try:
        ok = not isinstance(value, bool) and int(value) == value and lo <= value <= hi
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise LDPError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


class NumericMechanism(Protocol):
    """A numeric mechanism on ``[lo, hi]`` as a campaign attribute's protocol: parameters ``{"mechanism", "eps",
    "lo", "hi", ...}``, one integer report (:attr:`report_itemsize` bytes, little-endian) per value."""

    name: ClassVar[str]
    #: the size of the server's aggregate (the attribute's ``k``): 1 for most mean mechanisms
    support_size: int = 1
    #: the calibrated figures of the vectors' ``derived`` (small integers, 64-bit integers, floats)
    _derived: ClassVar[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = ((), (), ())

    def _init_numeric(self, eps: float, lo: float, hi: float) -> None:
        self.eps = check_eps("eps", eps)
        try:
            lo, hi = float(lo), float(hi)
        except (TypeError, ValueError):
            raise LDPError(f"the range must be two numbers, got [{lo!r}, {hi!r}]") from None
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise LDPError(f"the range must be finite with lo < hi, got [{lo}, {hi}]")
        self.lo, self.hi = lo, hi

    # ---------------------------------------------------------------- identity
    def params(self) -> dict[str, Any]:
        return {"mechanism": self.name, "eps": self.eps, "lo": self.lo, "hi": self.hi}

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items() if k != "mechanism")
        return f"{self.name}({inner})"

    @property
    def k(self) -> int:  # type: ignore[override]
        """The attribute's ``k``: the size of the server's aggregate (a numeric attribute has no domain)."""
        return self.support_size

    @property
    def numeric(self) -> bool:
        return True

    @property
    def domain_size(self) -> int:
        return self.support_size

    def derived(self) -> dict[str, Any]:
        """The calibrated figures (the randomizer vectors' ``derived``: 64-bit integers as decimal strings)."""
        small, big, floats = self._derived
        out: dict[str, Any] = {"eps_first": float(self.eps_first), "eps_inf": float(self.eps_inf),
                               "memo_size": self.memo_size}
        out.update({n: int(self._figure(n)) for n in small})
        out.update({n: str(int(self._figure(n))) for n in big})
        out.update({n: float(self._figure(n)) for n in floats})
        return out

    def _figure(self, name: str) -> Any:
        return getattr(self, name)

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        return self.eps

    # ---------------------------------------------------------------- device side
    def check_value(self, value: Any) -> float:  # type: ignore[override]
        """A measurement: a finite number (outside ``[lo, hi]`` it is clipped when randomized)."""
        return numeric_value(value)

    def clipped(self, value: Any) -> bool:
        """Whether ``value`` lies outside ``[lo, hi]`` (it is clipped to the nearest end before randomizing)."""
        v = self.check_value(value)
        return v < self.lo or v > self.hi

    def unit(self, value: Any) -> float:
        """The mechanism's input ``x`` in ``[-1, 1]`` of a measurement."""
        return to_unit(self.check_value(value), self.lo, self.hi)[0]

    def randomize(self, value: Any, draw_key: KeySource = os_key,  # type: ignore[override]
                  state: MemoState | None = None) -> bytes:
        """The report bytes of one device measuring ``value`` (metric units): fresh noise from keys of
        ``draw_key``, memoized draws (1BitMean) from ``state``'s key, marking the rounded point."""
        x = self.unit(value)
        return self._randomize(x, draw_key, self._state_for(state))  # type: ignore[arg-type]

    def _randomize(self, x: float, draw_key: KeySource, state: MemoState | None) -> bytes:  # type: ignore[override]
        raise NotImplementedError

    def _report(self, v: int) -> bytes:
        """One report as its little-endian bytes."""
        return v.to_bytes(self.report_itemsize, "little", signed=self.signed)

    signed: ClassVar[bool] = False
