"""Local hashing: BLH, OLH and the memoized LOLOHA (``estimators/hashing.py``; the draws of
``kernels.lh_encode`` and ``kernels.grr_chain_randomize``).

``H_seed(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32`` with ``(a, b)`` spread from the 32-bit seed by the
SplitMix64 finalizer. A report is ``(seed u32, y)``, ``y`` in the smallest unsigned integer holding ``g - 1``.
BLH/OLH draw a fresh seed per report (word 0 of ``(noise key, LH_SEED, 1)``); LOLOHA's seed is the device's,
word 0 of ``(memo key, LH_SEED, 0)``."""
from __future__ import annotations

import struct
from typing import Any, ClassVar

from .base import MemoState, Protocol, SingleShot, pure_variance, uint_size
from .calibration import (MAX_HASH_RANGE, check_domain, check_eps, grr_eps, grr_probabilities, olh_g, ololoha_g)
from .direct import GRRChain, TwoRoundProtocol, grr_chain
from .errors import InfeasibleParameters, LDPError
from .streams import LH_SEED, KeySource, Stream

__all__ = ["BLH", "OLH", "LOLOHA", "lh_hash", "mix64"]

M64 = (1 << 64) - 1
LH_A = 0x1A
LH_B = 0x1B


def mix64(z: int) -> int:
    """SplitMix64 finalizer (mod 2^64)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def lh_hash(hseed: int, v: int, g: int) -> int:
    """``H_seed(v)`` in ``[0, g)``."""
    h = mix64((hseed * 0x9E3779B97F4A7C15) & M64)
    a, b = mix64(h ^ LH_A), mix64(h ^ LH_B)
    return ((((a * v + b) & M64) >> 32) * g) >> 32


def _check_g(g: Any) -> int:
    if isinstance(g, bool) or not isinstance(g, (int, float)) or int(g) != g or not 2 <= g < MAX_HASH_RANGE:
        raise LDPError(f"g must be an integer in [2, 2^32), got {g}")
    return int(g)


class _HashedReports(Protocol):
    g: int

    @property
    def report_itemsize(self) -> int:
        return 4 + uint_size(self.g)

    def _pack(self, seed: int, y: int) -> bytes:
        return struct.pack("<I", seed) + y.to_bytes(uint_size(self.g), "little")


class LocalHashing(_HashedReports, SingleShot):
    """Single-shot LH over ``[0, g)``: a fresh hash function per report, then GRR."""

    def _init_lh(self, k: int, eps: float, g: int) -> None:
        self._init(k, eps)
        if self.k > MAX_HASH_RANGE:
            raise LDPError(f"k must be at most 2^32 for local hashing, got {k}")
        self.g = _check_g(g)
        self.p, self.q = grr_probabilities(self.eps, self.g)

    @property
    def ps(self) -> float:
        return self.p

    @property
    def qs(self) -> float:
        return 1.0 / self.g

    @property
    def eps_first(self) -> float:
        return grr_eps(self.p, self.q)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        nkey = draw_key()
        seed = Stream(nkey, LH_SEED, 1, 8).word(0) & 0xFFFFFFFF
        x = lh_hash(seed, v, self.g)
        return self._pack(seed, grr_chain(x, self.g, self.p, 1.0, nkey, None))


class BLH(LocalHashing):
    name: ClassVar[str] = "BLH"

    def __init__(self, k: int, eps: float) -> None:
        self._init_lh(k, eps, 2)


class OLH(LocalHashing):
    name: ClassVar[str] = "OLH"

    def __init__(self, k: int, eps: float) -> None:
        self._init_lh(k, eps, olh_g(check_eps("eps", eps)))


class LOLOHA(_HashedReports, GRRChain):
    """Longitudinal local hashing: the device's fixed hash function, then the GRR chain over ``[0, g)``."""

    name: ClassVar[str] = "LOLOHA"

    def __init__(self, k: int, eps_inf: float, eps_1: float, g: int | None = None,
                 calibration: str = "exact") -> None:
        k = check_domain(k)
        if k > MAX_HASH_RANGE:
            raise LDPError(f"k must be at most 2^32 for local hashing, got {k}")
        eps_inf, eps_1 = check_eps("eps_inf", eps_inf), check_eps("eps_1", eps_1)
        if eps_1 >= eps_inf:
            raise InfeasibleParameters(f"LOLOHA: ε1 = {eps_1:g} must be smaller than ε∞ = {eps_inf:g}")
        self.g = ololoha_g(eps_inf, eps_1) if g is None else _check_g(g)
        self._init_rounds(k, eps_inf, eps_1, calibration)

    @property
    def chain_size(self) -> int:
        return self.g

    def _support_q1(self) -> float:
        return 1.0 / self.g

    def params(self) -> dict[str, Any]:
        return {**TwoRoundProtocol.params(self), "g": self.g}

    @property
    def memo_size(self) -> int:
        return self.g

    @property
    def worst_case_loss(self) -> float:
        return float("inf")

    def variance(self, n: int) -> float:
        return pure_variance(self.ps, self.qs, n)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        assert state is not None
        nkey = draw_key()
        seed = state.responses.get("lh_seed")
        if seed is None:  # the device's fixed hash seed: a function of its memo key
            seed = state.responses["lh_seed"] = Stream(state.key, LH_SEED, 0, 8).word(0) & 0xFFFFFFFF
        x = lh_hash(seed, v, self.g)
        return self._pack(seed, grr_chain(x, self.g, self.p1, self.p2, nkey, state))

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        v = self.check_value(value)
        st = self._state_for(state).copy()  # type: ignore[union-attr]
        seed = Stream(st.key, LH_SEED, 0, 8).word(0) & 0xFFFFFFFF
        return self._pack(seed, grr_chain(lh_hash(seed, v, self.g), self.g, self.p1, 1.0, bytes(32), st))
