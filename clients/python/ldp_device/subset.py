"""Subset selection: the ω-subset mechanism SS (``estimators/subset.py``; the draws of ``kernels.ss_randomize``).

The noise slot holds ``1 + ω`` words: word 0 decides whether the true value is in the subset (``ps``), then
Floyd's algorithm draws the ``m`` (``ω - 1`` or ``ω``) other elements from ``[0, k) \\ {x}`` (population index
``p`` is the value ``p + (p >= x)``), step ``s`` with word ``1 + s``. Layouts: ``"bits"`` (packed k-bit vector)
or ``"indices"`` (the ω elements increasing)."""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState, SingleShot, uint_size
from .calibration import ss_optimal_omega, ss_probabilities
from .errors import LDPError
from .streams import KeySource, NoiseDraws

__all__ = ["SS", "LAYOUTS"]

LAYOUTS = ("auto", "bits", "indices")


class SS(SingleShot):
    name: ClassVar[str] = "SS"

    def __init__(self, k: int, eps: float, omega: int | None = None, layout: str = "auto") -> None:
        self._init(k, eps)
        if omega is None:
            omega = ss_optimal_omega(self.k, self.eps)
        if isinstance(omega, bool) or not isinstance(omega, (int, float)) or int(omega) != omega \
                or not 1 <= omega <= self.k - 1:
            raise LDPError(f"omega must be an integer in [1, k-1] = [1, {self.k - 1}], got {omega}")
        self.omega = int(omega)
        if layout not in LAYOUTS:
            raise LDPError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if layout == "auto":
            layout = "indices" if self.omega * uint_size(self.k) < (self.k + 7) // 8 else "bits"
        self.layout = layout
        self.p, self.q = ss_probabilities(self.k, self.eps, self.omega)
        self._p_out = (self.k - self.omega) / (self.omega * math.exp(self.eps) + self.k - self.omega)

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "k": self.k, "eps": self.eps, "omega": self.omega, "layout": self.layout}

    @property
    def eps_first(self) -> float:
        return math.log(self.p) - math.log(self._p_out) + math.log((self.k - self.omega) / self.omega)

    @property
    def report_itemsize(self) -> int:
        return 1 if self.layout == "bits" else uint_size(self.k)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return ((self.k + 7) // 8,) if self.layout == "bits" else (self.omega,)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        k, omega, x = self.k, self.omega, v
        noise = NoiseDraws(draw_key(), 1 + omega)
        member = 0
        m = omega
        if noise.unit(0) < self.p:
            member |= 1 << x
            m = omega - 1
        pop = k - 1
        for s in range(m):
            j = pop - m + s
            t = int(noise.unit(1 + s) * (j + 1))
            vt = t + 1 if t >= x else t
            if member >> vt & 1:
                vt = j + 1 if j >= x else j
            member |= 1 << vt
        if self.layout == "bits":
            return member.to_bytes((k + 7) // 8, "little")
        size = uint_size(k)
        return b"".join(i.to_bytes(size, "little") for i in range(k) if member >> i & 1)
