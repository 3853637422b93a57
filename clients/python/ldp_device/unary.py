"""Unary encoding: SUE, OUE and the memoized chains L-OUE, L-SUE, L-OSUE, L-SOUE (``estimators/unary.py``;
the draws of ``kernels.ue_chain_randomize``).

Each round's bit ``i`` (byte ``i >> 3``, bit ``i & 7`` of the packed report) is an exact lazy Bernoulli draw on
the 2^-32 grid: byte lane ``i`` of the round's words (word ``i >> 3``, byte ``i & 7``) is compared with the top
byte of the bit's 32-bit threshold, and a tie is settled, in lane order, by the low 24 bits of the round's next
refinement draw. The lanes of a whole round are compared at once (``bytes.translate`` and big-integer masks,
:mod:`ldp_device.streams`); only ties (1/256 per lane) are visited one by one.
"""
from __future__ import annotations

from typing import ClassVar

from .base import MemoState, Protocol, SingleShot, pure_variance
from .calibration import (Rounds, check_domain, oue_irr, oue_probabilities, sue_irr, sue_probabilities,
                          ue_chain_eps_first, ue_eps)
from .direct import TwoRoundProtocol
from .errors import LDPError
from .streams import NOISE, NOISE_EXT, PRR, KeySource, Stream, keystream, lt_table, pack_lanes, quantize32, \
    split_threshold, threshold32

__all__ = ["UE_REFINE_SLOTS", "UEChain", "SUE", "OUE", "LOUE", "LSUE", "LOSUE", "LSOUE", "UnaryReports"]

UE_REFINE_SLOTS = 2  # refinement draws held in a UE row's noise slot / PRR prefix (more: extension)
NO_IRR = (1 << 32, 0)  # (t2p, t2q): keep the round-1 bits


class UEChain:
    """The UE chain of one configuration: ``k`` bits, 32-bit thresholds ``(t1p, t1q)`` of the PRR and
    ``(t2p, t2q)`` of the IRR (``(2^32, 0)``: no IRR), the draw layout precomputed.

    :meth:`run` randomizes one device's value: the PRR from the stream ``(memo key, PRR, x)`` when a memo state
    is given (words ``0 .. B-1`` the lanes, ``B`` the hot bit, then refinements), else from the noise slot
    (same layout); the IRR from the slot's next ``B`` words; refinements of noise rounds take the slot's last
    :data:`UE_REFINE_SLOTS` words, then the extension stream.
    """

    __slots__ = ("k", "nbytes", "t1p", "t1q", "irr", "q1", "p2", "q2", "lt_q1", "lt_p2", "lt_q2", "mask", "pw",
                 "hi_q1", "hi_p2", "hi_q2", "prr_blocks", "noise_blocks", "first", "refine0", "slot")

    def __init__(self, k: int, t1p: int, t1q: int, t2p: int, t2q: int, memo: bool = True) -> None:
        self.k, self.nbytes = k, (k + 7) // 8
        nb = self.nbytes
        self.t1p, self.t1q = t1p, t1q
        self.irr = not (t2p == 1 << 32 and t2q == 0)
        self.q1 = split_threshold(t1q)
        self.p2, self.q2 = split_threshold(t2p), split_threshold(t2q)
        self.lt_q1, self.lt_p2, self.lt_q2 = lt_table(self.q1[0]), lt_table(self.p2[0]), lt_table(self.q2[0])
        self.hi_q1, self.hi_p2, self.hi_q2 = bytes([self.q1[0]]), bytes([self.p2[0]]), bytes([self.q2[0]])
        self.mask = (1 << (8 * k)) - 1  # lanes >= k cleared (only bits 8i are ever set)
        self.pw = ((nb + 1 + UE_REFINE_SLOTS + 7) // 8) * 8  # PRR prefix: whole blocks
        self.prr_blocks = self.pw // 8
        # the noise slot of a memoized (first = 0) or single-shot (first = B + 1) chain
        self.first = 0 if memo else nb + 1
        self.refine0 = self.first + (nb if self.irr else 0)
        self.slot = self.refine0 + UE_REFINE_SLOTS
        self.noise_blocks = -(-self.slot // 8)

    def run(self, x: int, nkey: bytes, memo: MemoState | None) -> bytes:
        """The packed report of one device holding ``x`` (``memo``: its memo state, marked; ``None`` for a
        single-shot chain, built with ``memo=False``)."""
        nb = self.nbytes
        n8 = 8 * nb
        first, refine0 = self.first, self.refine0
        if (memo is None) != (first != 0):
            raise ValueError("this UE chain was built for the other kind of PRR (memoized or not)")
        noise = keystream(nkey, NOISE, 0, 0, self.noise_blocks)  # the slot: one ChaCha20 call
        ext: Stream | None = None
        q1_rest = self.q1[1]
        jn = refine0
        # ---- round 1 (PRR): lanes of words 0 .. B-1 and the hot bit (word B), ties refined from word B+1 on of
        # the PRR stream (memo) or from the slot's refinement words, then the extension stream (single-shot)
        if memo is not None:
            memo.mark(x)
            cache_key = (self.k, self.t1p, self.t1q, x)
            lanes = memo.responses.get(cache_key)
            if lanes is None:
                lanes = memo.responses[cache_key] = self._prr(x, memo.key)
        else:
            top = noise[:n8]
            lanes = int.from_bytes(top.translate(self.lt_q1), "little")
            if self.hi_q1 in top:
                for i in _positions(top, self.hi_q1):
                    if jn < self.slot:
                        rest = int.from_bytes(noise[8 * jn:8 * jn + 3], "little")
                    else:
                        ext = ext or Stream(nkey, NOISE_EXT, 0, 8)
                        rest = ext.low24(jn - self.slot)
                    if rest < q1_rest:
                        lanes |= 1 << (8 * i)
                    jn += 1
            bit = 1 << (8 * x)
            lanes = lanes | bit if int.from_bytes(noise[n8:n8 + 4], "little") < self.t1p else lanes & ~bit
        # ---- round 2 (IRR): thresholds p2 where the PRR bit is 1, q2 where it is 0
        if self.irr:
            z = noise[8 * first:8 * first + n8]
            sel = lanes * 255
            out = (int.from_bytes(z.translate(self.lt_p2), "little") & sel) | \
                  (int.from_bytes(z.translate(self.lt_q2), "little") & ~sel)
            if self.hi_p2 in z or self.hi_q2 in z:
                p2_rest, q2_rest = self.p2[1], self.q2[1]
                for i in self._ties(z, lanes):
                    if jn < self.slot:
                        rest = int.from_bytes(noise[8 * jn:8 * jn + 3], "little")
                    else:  # past the slot: the report's extension stream
                        ext = ext or Stream(nkey, NOISE_EXT, 0, 8)
                        rest = ext.low24(jn - self.slot)
                    if rest < (p2_rest if lanes >> (8 * i) & 1 else q2_rest):
                        out |= 1 << (8 * i)
                    jn += 1
            lanes = out
        return pack_lanes(lanes & self.mask, nb)

    def _prr(self, x: int, key: bytes) -> int:
        """The memoized PRR lanes of input ``x`` under the memo key: words ``0 .. B-1`` of ``(key, PRR, x)``, the
        hot bit from word ``B``, ties refined from word ``B+1`` on."""
        nb = self.nbytes
        n8 = 8 * nb
        src = keystream(key, PRR, x, 0, self.prr_blocks)
        top = src[:n8]
        lanes = int.from_bytes(top.translate(self.lt_q1), "little")
        if self.hi_q1 in top:
            j = nb + 1
            q1_rest = self.q1[1]
            for i in _positions(top, self.hi_q1):
                if 8 * j + 8 > len(src):  # past the prefix: the same stream, one more block
                    src += keystream(key, PRR, x, len(src) // 64, 1)
                if int.from_bytes(src[8 * j:8 * j + 3], "little") < q1_rest:
                    lanes |= 1 << (8 * i)
                j += 1
        bit = 1 << (8 * x)
        return lanes | bit if int.from_bytes(src[n8:n8 + 4], "little") < self.t1p else lanes & ~bit

    def _ties(self, z: bytes, lanes: int) -> list[int]:
        """Lanes (increasing) whose byte equals the top byte of the threshold their PRR bit selects."""
        if self.hi_p2 == self.hi_q2:  # one byte value serves both thresholds: every occurrence ties
            return _positions(z, self.hi_p2)
        out = [i for i in _positions(z, self.hi_p2) if lanes >> (8 * i) & 1]
        out += [i for i in _positions(z, self.hi_q2) if not lanes >> (8 * i) & 1]
        out.sort()
        return out


def _positions(z: bytes, byte: bytes) -> list[int]:
    out = []
    i = z.find(byte)
    while i >= 0:
        out.append(i)
        i = z.find(byte, i + 1)
    return out


class UnaryReports(Protocol):
    """Reports are k-bit vectors packed little-endian into ``ceil(k/8)`` bytes."""

    @property
    def report_itemsize(self) -> int:
        return 1

    @property
    def report_shape(self) -> tuple[int, ...]:
        return ((self.k + 7) // 8,)


class UnaryEncoding(UnaryReports, SingleShot):
    """Single-shot unary encoding with bit probabilities ``(p, q)`` on the 2^-32 grid."""

    _chain_: UEChain | None = None

    def __init__(self, k: int, eps: float) -> None:
        self._init(k, eps)
        self.p, self.q = self._probabilities(self.eps)

    @staticmethod
    def _probabilities(eps: float) -> tuple[float, float]:
        raise NotImplementedError

    @property
    def eps_first(self) -> float:
        return ue_eps(self.p, self.q)

    @property
    def chain(self) -> UEChain:
        if self._chain_ is None:
            self._chain_ = UEChain(self.k, threshold32(self.p), threshold32(self.q), *NO_IRR, memo=False)
        return self._chain_

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        return self.chain.run(v, draw_key(), None)


class SUE(UnaryEncoding):
    name: ClassVar[str] = "SUE"
    _probabilities = staticmethod(sue_probabilities)


class OUE(UnaryEncoding):
    name: ClassVar[str] = "OUE"
    _probabilities = staticmethod(oue_probabilities)


class LongitudinalUE(UnaryReports, TwoRoundProtocol):
    """A memoized UE chain; ``prr`` and ``irr`` name the round shapes ("OUE" or "SUE")."""

    prr: ClassVar[str]
    irr: ClassVar[str]
    _chain_: UEChain | None = None

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration: str = "exact") -> None:
        self._init_rounds(check_domain(k), eps_inf, eps_1, calibration)

    def _solve_rounds(self) -> Rounds:
        first = {"OUE": oue_probabilities, "SUE": sue_probabilities}[self.prr]
        p1, q1 = first(self.requested_eps_inf)
        second = {"OUE": oue_irr, "SUE": sue_irr}[self.irr]
        p2, q2 = second(p1, q1, self.requested_eps_1, self.requested_eps_inf, self.name)
        return Rounds(p1, q1, quantize32(p2), quantize32(q2))

    @property
    def eps_inf(self) -> float:
        return ue_eps(self.p1, self.q1)

    @property
    def eps_first(self) -> float:
        return ue_chain_eps_first(self.rounds)

    def variance(self, n: int) -> float:
        return pure_variance(self.ps, self.qs, n)

    @property
    def chain(self) -> UEChain:
        if self._chain_ is None:
            self._chain_ = UEChain(self.k, threshold32(self.p1), threshold32(self.q1), threshold32(self.p2),
                                   threshold32(self.q2))
        return self._chain_

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        if state is None:
            raise LDPError(f"{self.name} memoizes: pass a memo state")
        return self.chain.run(v, draw_key(), state)

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        v = self.check_value(value)
        st = self._state_for(state)
        assert st is not None
        return pack_lanes(self.chain._prr(v, st.key) & self.chain.mask, self.chain.nbytes)


class LOUE(LongitudinalUE):
    """OUE then OUE (L-OUE)."""
    name: ClassVar[str] = "L-OUE"
    prr, irr = "OUE", "OUE"


class LSUE(LongitudinalUE):
    """SUE then SUE: basic RAPPOR (L-SUE)."""
    name: ClassVar[str] = "L-SUE"
    prr, irr = "SUE", "SUE"


class LOSUE(LongitudinalUE):
    """OUE then SUE (L-OSUE)."""
    name: ClassVar[str] = "L-OSUE"
    prr, irr = "OUE", "SUE"


class LSOUE(LongitudinalUE):
    """SUE then OUE (L-SOUE)."""
    name: ClassVar[str] = "L-SOUE"
    prr, irr = "SUE", "OUE"
