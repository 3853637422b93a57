"""dBitFlipPM (``estimators/bitflip.py``; the draws of ``kernels.bitflip_randomize``): ``d`` memoized bits out
of ``b`` buckets, one round, no fresh noise at all.

The sampled buckets ``J`` come from the device's stream ``(memo key, BITFLIP_J, 0)``: Floyd's algorithm (step
``s`` inserts from ``[0, b-d+s]`` with word ``s``) when ``d^2 <= 4 b``, else selection sampling (bucket ``t``
decided by word ``t``). The case of bucket ``floor(v b / k)`` is its index in ``J`` (``d`` if unsampled); bit
``l`` is ``unit(word l of (memo key, BITFLIP_BIT, case)) < (p if l == case else q)``. A report is the ``d``
pair codes ``2 j_l + x_l``."""
from __future__ import annotations

import math
from typing import Any, ClassVar

from .base import MemoState, Protocol, pure_variance, uint_size
from .calibration import check_domain, check_eps
from .errors import LDPError
from .streams import BITFLIP_BIT, BITFLIP_J, KeySource, Stream

__all__ = ["DBitFlipPM"]


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    try:
        ok = not isinstance(value, bool) and int(value) == value
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or value < lo or (hi is not None and value > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise LDPError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


class DBitFlipPM(Protocol):
    name: ClassVar[str] = "dBitFlipPM"
    longitudinal: ClassVar[bool] = True
    MAX_BUCKETS: ClassVar[int] = (1 << 31) - 1

    def __init__(self, k: int, b: int, d: int, eps_inf: float) -> None:
        self.k = check_domain(k)
        self.b = _check_int("b (number of buckets)", b, 2, self.MAX_BUCKETS)
        if self.b > self.k:
            raise LDPError(f"b = {self.b} buckets cannot exceed the domain size k = {self.k}")
        if self.k * self.b >= 1 << 63:
            raise LDPError(f"k * b = {self.k * self.b} overflows the int64 bucket map floor(v b / k)")
        self.d = _check_int("d (sampled buckets per device)", d, 1)
        if self.d > self.b:
            raise LDPError(f"d = {self.d} sampled buckets cannot exceed b = {self.b}")
        self.requested_eps_inf = check_eps("eps_inf", eps_inf)
        h = math.exp(self.requested_eps_inf / 2)
        self.p = h / (h + 1)
        self.q = 1 / (h + 1)
        self.floyd = self.d * self.d <= 4 * self.b

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "k": self.k, "b": self.b, "d": self.d, "eps_inf": self.requested_eps_inf}

    def bucket(self, v: int) -> int:
        return (v * self.b) // self.k

    def bucket_edges(self) -> list[int]:
        return [-((-j * self.k) // self.b) for j in range(self.b + 1)]

    @property
    def eps_inf(self) -> float:
        if self.d == 1:
            return math.log(self.p / self.q)
        return math.log(self.p * (1 - self.q) / ((1 - self.p) * self.q))

    @property
    def eps_first(self) -> float:
        return self.eps_inf

    @property
    def memo_size(self) -> int:
        return self.b

    @property
    def memo_cases(self) -> int:
        return min(self.d + 1, self.b)

    def longitudinal_loss(self, memoized: int) -> float:
        return min(max(memoized, 0), self.memo_cases) * self.eps_inf

    @property
    def cases_follow_values(self) -> bool:
        return self.b == self.k and self.d >= self.b - 1

    @property
    def worst_case_loss(self) -> float:
        r = max(self.memo_size, 2)
        return float(self.longitudinal_loss(r)) if self.cases_follow_values else math.inf

    @property
    def domain_size(self) -> int:
        return self.b

    @property
    def ps(self) -> float:
        return self.d / self.b * self.p

    @property
    def qs(self) -> float:
        return self.d / self.b * self.q

    def variance(self, n: int) -> float:
        return pure_variance(self.ps, self.qs, n)

    @property
    def report_itemsize(self) -> int:
        return uint_size(2 * self.b)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (self.d,)

    def sampled_buckets(self, key: bytes) -> list[int]:
        """The device's sampled buckets ``J`` (increasing), a pure function of its memo key."""
        b, d = self.b, self.d
        js = Stream(key, BITFLIP_J, 0, min(d, 64) if self.floyd else min(b, 16))
        if self.floyd:
            row: list[int] = []
            for s in range(d):
                t = b - d + s
                r = int(js.unit(s) * (t + 1))
                row.append(t if r in row else r)
            return sorted(row)
        row = []
        for t in range(b):
            need = d - len(row)
            if need == 0:
                break
            rem = b - t
            if need == rem or js.unit(t) * rem < need:
                row.append(t)
        return row

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        assert state is not None
        x = self.bucket(v)
        state.mark(x)
        row = self.sampled_buckets(state.key)
        case = row.index(x) if x in row else self.d
        bits = Stream(state.key, BITFLIP_BIT, case, self.d)
        size = self.report_itemsize
        out = bytearray()
        for pos, j in enumerate(row):
            bit = bits.unit(pos) < (self.p if pos == case else self.q)
            out += (j * 2 + bit).to_bytes(size, "little")
        return bytes(out)

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        """No second round: exactly what :meth:`randomize` reports (nothing marked)."""
        v = self.check_value(value)
        st = self._state_for(state)
        assert st is not None
        return self._randomize(v, lambda: bytes(32), st.copy())
