"""Apple's Count Mean Sketch (CMS) and Hadamard Count Mean Sketch (HCMS) on the device (``estimators/sketch/cms.py``;
the draws of ``estimators/sketch/cms_kernels.py``, byte for byte).

Both keep ``k`` rows of ``m`` cells; the device picks a row ``j`` uniformly and hashes its value id with row ``j``'s
public function (:func:`ldp_device.sketch.sketch_hash` with ``row_seeds(seed, k)[j]``). Every draw comes from the
report's noise slot, words ``0 .. W-1`` of ``(noise key, NOISE, 0)``, then its extension stream
``(noise key, NOISE_EXT, 0)`` (:class:`ldp_device.streams.NoiseDraws`):

* **row**: slot word 0 ``z``; while ``z > rejection_limit(k)`` the next draw is taken (a shared counter, see below);
  the row is ``z mod k``;
* **CMS** (``W = 1 + B + 2``, ``B = ceil(m / 8)``): byte lane ``t`` of slot word ``1 + b`` is the flip bit
  ``8 b + t`` (its top byte against the top byte of the 32-bit threshold ``T = ceil(2^32 / (e^{ε/2} + 1))``, a tie
  settled, in lane order, by the low 24 bits of the next draw); the report's bits are the flips with bit
  ``h_j(id)`` inverted, bits ``>= m`` cleared; report: row (uint16 LE), then the ``m`` bits packed little-endian;
* **HCMS** (``W = 3``): word 1 gives the coefficient ``l = z & (m - 1)``, word 2 the flip, ``z >> 11 < T``
  (``T = ceil(2^53 / (e^ε + 1))``); the bit is ``[(-1)^popcount(h_j(id) & l) = +1]`` xor the flip; report:
  ``((j m + l) << 1) | bit`` as a uint64 LE.

Draws past the slot's fixed words (row rejections, then CMS tie refinements) share one counter that starts at the
slot's refinement words (CMS: word ``1 + B``; HCMS: word 3, i.e. the extension stream).
"""
from __future__ import annotations

from decimal import Decimal, localcontext
from typing import Any, ClassVar

from .base import MemoState
from .calibration import check_eps
from .errors import LDPError
from .sketch import M64, OpenDomainProtocol, flip_threshold, rejection_limit, row_seeds, sketch_hash
from .streams import KeySource, NoiseDraws, lt_table, pack_lanes, split_threshold

__all__ = ["CMS", "HCMS", "CMS_REFINE_SLOTS", "HCMS_SLOT", "ROW_BYTES"]

CMS_REFINE_SLOTS = 2  # refinement draws held in a CMS report's noise slot (more: extension stream)
HCMS_SLOT = 3         # noise words of an HCMS report: 0 the row, 1 the coefficient, 2 flip?
ROW_BYTES = 2         # a CMS report starts with its row, little-endian uint16
_MAX_ROWS = 1 << 16


def _integer(name: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or int(x) != x:
        raise LDPError(f"{name} must be an integer, got {x!r}")
    return int(x)


class _CountMeanSketch(OpenDomainProtocol):
    """What CMS and HCMS share: parameters, rows, the flip threshold and ε."""

    flip_bits: ClassVar[int]
    flip_eps_share: ClassVar[float]

    def __init__(self, eps: float, m: int, k: int, seed: int) -> None:
        self.eps = check_eps("eps", eps)
        m, k, seed = _integer("m", m), _integer("k (rows)", k), _integer("seed", seed)
        if m < 2 or m >= 1 << 31:
            raise LDPError(f"m must be an integer in [2, 2^31), got {m}")
        if not 1 <= k <= _MAX_ROWS:
            raise LDPError(f"k (rows) must be an integer in [1, {_MAX_ROWS}], got {k}")
        if not 0 <= seed <= M64:
            raise LDPError(f"seed must be an integer in [0, 2^64), got {seed}")
        self.m, self.k, self.seed = m, k, seed  # k: the rows (Apple's notation), as the reference's
        self.seeds = row_seeds(seed, k)
        self.limit = rejection_limit(k)
        self.T = flip_threshold(self.flip_eps_share * self.eps, self.flip_bits)
        self.q = self.T / float(1 << self.flip_bits)

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "eps": self.eps, "m": self.m, "k": self.k, "seed": self.seed}

    def _flip_eps(self, times: int = 1) -> float:
        with localcontext() as ctx:
            ctx.prec = 60
            return float(times * (Decimal((1 << self.flip_bits) - self.T) / Decimal(self.T)).ln())

    def _row(self, d: NoiseDraws, jn: int) -> tuple[int, int]:
        """The sketch row from slot word 0 (rejections from draw ``jn`` on) and the next draw index."""
        z = d.word(0)
        while z > self.limit:
            z = d.word(jn)
            jn += 1
        return z % self.k, jn

    @property
    def support_size(self) -> int:
        raise NotImplementedError


class CMS(_CountMeanSketch):
    """Apple's Count Mean Sketch: report ``uint8 (2 + ceil(m/8),)``, the row then the ``m`` bits (module doc)."""

    name: ClassVar[str] = "CMS"
    flip_bits = 32
    flip_eps_share = 0.5

    def __init__(self, eps: float, m: int, k: int, seed: int) -> None:
        super().__init__(eps, m, k, seed)
        self.nbytes = (self.m + 7) // 8
        self.t_hi, self.t_rest = split_threshold(self.T)

    @property
    def eps_first(self) -> float:
        """``2 log((2^32 - T) / T) <= eps``: two entries of one row differ between any two ids."""
        return self._flip_eps(2)

    @property
    def support_size(self) -> int:
        return self.k * (self.m + 1)

    @property
    def report_itemsize(self) -> int:
        return 1

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (ROW_BYTES + self.nbytes,)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        nb = self.nbytes
        d = NoiseDraws(draw_key(), 1 + nb + CMS_REFINE_SLOTS)
        j, jn = self._row(d, 1 + nb)
        top = d.main.bytes_of(1, nb)
        lanes = int.from_bytes(top.translate(lt_table(self.t_hi)), "little")
        hi = bytes([self.t_hi])
        i = top.find(hi)
        while i >= 0:  # ties, in lane order: the low 24 bits of the next draws
            if d.low24(jn) < self.t_rest:
                lanes |= 1 << (8 * i)
            jn += 1
            i = top.find(hi, i + 1)
        bits = int.from_bytes(pack_lanes(lanes, nb), "little")
        bits ^= 1 << sketch_hash(v, self.seeds[j], self.m)
        bits &= (1 << self.m) - 1
        return j.to_bytes(ROW_BYTES, "little") + bits.to_bytes(nb, "little")


class HCMS(_CountMeanSketch):
    """Apple's Hadamard Count Mean Sketch: report ``uint64``, ``((j m + l) << 1) | bit`` (module doc)."""

    name: ClassVar[str] = "HCMS"
    flip_bits = 53
    flip_eps_share = 1.0

    def __init__(self, eps: float, m: int, k: int, seed: int) -> None:
        mm = _integer("m", m)
        if mm < 2 or mm & (mm - 1):
            raise LDPError(f"HCMS needs m a power of 2, got {m}")
        super().__init__(eps, m, k, seed)

    @property
    def eps_first(self) -> float:
        """``log((2^53 - T) / T) <= eps``: one bit, flipped with probability ``T / 2^53``."""
        return self._flip_eps()

    @property
    def support_size(self) -> int:
        return 2 * self.k * self.m

    @property
    def report_itemsize(self) -> int:
        return 8

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        d = NoiseDraws(draw_key(), HCMS_SLOT)
        j, _ = self._row(d, HCMS_SLOT)
        l = d.word(1) & (self.m - 1)
        h = sketch_hash(v, self.seeds[j], self.m)
        bit = 1 - ((h & l).bit_count() & 1)
        if (d.word(2) >> 11) < self.T:
            bit = 1 - bit
        return (((j * self.m + l) << 1) | bit).to_bytes(8, "little")
