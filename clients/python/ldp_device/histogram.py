"""Histogram encoding: SHE (exact discrete Laplace noise, integer reports) and THE (thresholding, a UE chain)
(``estimators/histogram.py``; the bit reader of ``kernels.she_randomize`` / ``reference.she_randomize``).

SHE's report reads its noise as one bit string: its slot words of ``(noise key, NOISE, 0)``, then its
extension stream ``(noise key, NOISE_EXT, 0)``, each word from its least significant bit up; coordinate ``j``
takes its bits in turn in the order of Canonne, Kamath & Steinke (NeurIPS 2020), Alg. 2, every Bernoulli
exact (integer arithmetic only)."""
from __future__ import annotations

from typing import Any, ClassVar

from .base import MemoState, SingleShot
from .calibration import (SHE_DIGIT_BITS, SHE_MAX_EPS, SHE_MIN_EPS, SHE_T_BITS, SHE_TAIL, she_noise_parameter,
                          she_slot_words, the_optimal_theta, the_probabilities)
from .errors import InfeasibleParameters, LDPError
from .streams import KeySource, NoiseDraws, quantize32
from .unary import UnaryEncoding

__all__ = ["SHE", "THE"]


class THE(UnaryEncoding):
    """Thresholding with histogram encoding: a single-shot UE protocol with ``(ps, qs)`` of THE."""

    name: ClassVar[str] = "THE"

    def __init__(self, k: int, eps: float, theta: float | None = None) -> None:
        self._init(k, eps)
        if theta is None:
            theta = the_optimal_theta(self.eps)
        theta = float(theta)
        if not 0.0 < theta < 1.0:
            raise LDPError(f"theta must lie in (0, 1), got {theta}")
        self.theta = theta
        p, q = the_probabilities(self.eps, theta)
        self.p, self.q = quantize32(p), quantize32(q)
        if not 0.0 < self.q < self.p < 1.0:
            raise InfeasibleParameters(
                f"THE: eps = {self.eps:g}, theta = {theta:g} give bit probabilities (ps = {p:.3g}, "
                f"qs = {q:.3g}) that vanish on the 2^-32 sampling grid; use a smaller eps")

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "k": self.k, "eps": self.eps, "theta": self.theta}


class _Bits:
    """A report's draws as a bit string: its slot words, then its extension stream, each word from its least
    significant bit up (``reference._SheBits``)."""

    __slots__ = ("draws", "j", "buf", "have")

    def __init__(self, nkey: bytes, slot: int) -> None:
        self.draws = NoiseDraws(nkey, slot)
        self.j, self.buf, self.have = 0, 0, 0

    def __call__(self, m: int) -> int:
        while self.have < m:
            self.buf |= self.draws.word(self.j) << self.have
            self.j += 1
            self.have += 64
        v = self.buf & ((1 << m) - 1)
        self.buf >>= m
        self.have -= m
        return v


def _bern_frac(g: int, t_bits: int, bits: _Bits) -> bool:
    """Bernoulli(g / 2^t_bits): a uniform t_bits-bit integer read digit by digit from its top is < g."""
    if g <= 0 or g >= 1 << t_bits:
        return g > 0
    for i in reversed(range(0, t_bits, SHE_DIGIT_BITS)):
        b, u = bits(SHE_DIGIT_BITS), (g >> i) % (1 << SHE_DIGIT_BITS)
        if b != u:
            return b < u
    return False


def _bern_inv(kk: int, bits: _Bits) -> bool:
    """Bernoulli(1 / kk), kk >= 2: a uniform integer in [0, kk) (rejection) is 0."""
    n = (kk - 1).bit_length()
    while True:
        v = bits(n)
        if v < kk:
            return v == 0


def _bern_exp(g: int, t_bits: int, bits: _Bits) -> bool:
    """Bernoulli(exp(-g / 2^t_bits)) (Canonne, Kamath & Steinke, NeurIPS 2020, Alg. 1)."""
    kk = 1
    while (kk == 1 or _bern_inv(kk, bits)) and _bern_frac(g, t_bits, bits):
        kk += 1
    return kk % 2 == 1


def _discrete_laplace(s: int, t_bits: int, vcap: int, bits: _Bits) -> int:
    """Canonne, Kamath & Steinke, NeurIPS 2020, Alg. 2, with ``V`` stopped at ``vcap``."""
    t = 1 << t_bits
    while True:
        u = bits(t_bits)
        if not _bern_exp(u, t_bits, bits):
            continue
        v = 0
        while v < vcap and _bern_exp(t, t_bits, bits):
            v += 1
        y = (u + t * v) // s
        neg = bits(1) == 1
        if neg and y == 0:
            continue
        return -y if neg else y


class SHE(SingleShot):
    """Summation with histogram encoding: ``y_j = clip(1{j = x} + Z_j, -C, C)``, ``Z_j`` discrete Laplace."""

    name: ClassVar[str] = "SHE"

    def __init__(self, k: int, eps: float) -> None:
        self._init(k, eps)
        if not SHE_MIN_EPS <= self.eps <= SHE_MAX_EPS:
            raise InfeasibleParameters(
                f"SHE supports {SHE_MIN_EPS:g} <= eps <= {SHE_MAX_EPS:g} (an exact rational noise parameter "
                f"s / 2^{SHE_T_BITS} within 1e-9 of eps/2, int32 reports), got {self.eps:g}")
        self.s = she_noise_parameter(self.eps)
        self.gamma = self.s / float(1 << SHE_T_BITS)
        t = 1 << SHE_T_BITS
        self.bound = 1 + -(-SHE_TAIL * t // self.s)
        self.slot = she_slot_words(self.k, self.s, SHE_T_BITS)

    @property
    def eps_first(self) -> float:
        return float(2 * self.s) / float(1 << SHE_T_BITS)

    @property
    def ps(self) -> float:
        raise LDPError("SHE is not a pure protocol")

    @property
    def report_itemsize(self) -> int:
        for size in (1, 2, 4):
            if self.bound <= (1 << (8 * size - 1)) - 1:
                return size
        raise AssertionError("SHE's clip bound exceeds int32")  # pragma: no cover

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (self.k,)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        s, bound, size = self.s, self.bound, self.report_itemsize
        vcap = -(-s * (bound + 1) // (1 << SHE_T_BITS))
        bits = _Bits(draw_key(), self.slot)
        out = bytearray()
        for j in range(self.k):
            z = _discrete_laplace(s, SHE_T_BITS, vcap, bits) + (j == v)
            out += min(max(z, -bound), bound).to_bytes(size, "little", signed=True)
        return bytes(out)
