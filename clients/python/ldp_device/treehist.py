"""TreeHist on the device (``estimators/sketch/treehist.py``; the draws of ``estimators/sketch/treehist_kernels.py``,
byte for byte): heavy hitters over the top ``bits`` bits of 64-bit value ids, one level of a prefix tree per
device, a public hash row per report, GRR over ``g = round(e^ε + 1)`` buckets.

Levels: ``ℓ_l = min(bits, start_bits + (l + 1) step)``, ``L = ceil((bits - start_bits) / step)``. Public row seeds:
``row_seeds(seed, L R + 1)``: level ``l``, row ``j`` hashes with ``seeds[l R + j]``, the last one is unused (it
placed a memoized input in a memo slot before the tag tables). A report is 5 bytes: the level (uint8), the row
(uint16 LE), the bucket (uint16 LE).

Draws (every uniform integer by rejection against ``rejection_limit``; every keep decision ``z >> 11 < T``, ``T`` a
53-bit threshold: ``T1`` the largest integer with ``T1 (g - 1) / (2^53 - T1) <= e^ε``, ``T2 = floor(p2 2^53)`` of
the IRR's calibrated ``p2``, ``2^53`` without IRR):

* **without a memo state**: the report's noise slot of 6 words (``(noise key, NOISE, 0)``): 0 the level, 1 the row,
  2 keep?, 3 the other bucket, 4 and 5 the IRR's keep? and other bucket; rejected words are replaced by the
  extension stream ``(noise key, NOISE_EXT, 0)``, one counter for all of them, in draw order;
* **with a memo state** (key ``K``): the level, fixed for life, is the first accepted of words 0..7 of
  ``(K, "THVL", 0)`` (word 7 if all are rejected) mod ``L``; ``a`` is the smallest id of the device's level prefix;
  the row, keep? and other bucket are words 0, 1, 2 of ``(K, PRR, a)`` (rejections: its words 3, 4, ..), so the
  first GRR is memoized per prefix; the IRR uses words 4 and 5 of the noise slot (a noise key is drawn for every
  report).

Memo accounting (the reference's tag table, byte for byte): the state's ``memo_slots`` bits (a multiple of 64) are
``T = memo_slots / 64`` little-endian uint64 tags. The tag of ``a`` is word 0 of ``(K, "THTG", a)`` with its low
bit set (the all-ones word replaced by ``0xFF..FD``), inserted by linear probing from slot ``tag mod T``: found, a
repeat (no new loss); else the first empty slot, one ε∞. A full table meeting a new prefix writes the all-ones
sentinel in slot 0: :meth:`TreeHist.memoized_count` is then ``inf`` (the device refuses such a value instead:
``MemoTableFull``); so is a state holding a nonzero word with its low bit clear (no tag table: the slot bitset of an
earlier release, which the device refuses to report with until the attribute is reset).
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext
from typing import Any, ClassVar

from .base import MemoState
from .calibration import Rounds, check_eps, grr_chain_eps_first, grr_chain_p2, olh_g
from .errors import LDPError
from .sketch import M64, OpenDomainProtocol, rejection_limit, row_seeds, sketch_hash
from .streams import PRR, KeySource, NoiseDraws, Stream, os_key

__all__ = ["TreeHist", "LEVEL", "SLOT", "REPORT_BYTES", "grr_threshold53", "level_schedule"]

LEVEL = 0x4C564854   # "THVL": a TreeHist device's fixed level, a = 0
TAG = 0x47544854     # "THTG": the memo tag of a memoized prefix, a = the prefix's smallest id
OVERFLOW = (1 << 64) - 1  # slot 0 of an overflowed tag table
SLOT = 6             # noise words per report
REPORT_BYTES = 5
TWO53 = 1 << 53
DEFAULT_START_BITS = 2
MAX_FIRST_LEVEL_BITS = 24
_MAX_ROWS = 1 << 16


def _integer(name: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or int(x) != x:
        raise LDPError(f"TreeHist: {name} must be an integer, got {x!r}")
    return int(x)


def grr_threshold53(eps: float, g: int) -> int:
    """The largest ``T`` with ``T (g - 1) / (2^53 - T) <= e^eps`` (60-digit decimal arithmetic, as the reference)."""
    with localcontext() as ctx:
        ctx.prec = 60
        e = Decimal(float(eps)).exp()
        t = int((Decimal(TWO53) * e / (e + (g - 1))).to_integral_value(rounding="ROUND_FLOOR"))
        while Decimal(t + 1) * (g - 1) <= e * (TWO53 - t - 1):
            t += 1
        while Decimal(t) * (g - 1) > e * (TWO53 - t):
            t -= 1
    return t


def level_schedule(bits: int, start_bits: int, step: int) -> tuple[int, ...]:
    """The prefix lengths ``min(bits, start_bits + i step)``, ``i = 1 .. L`` (``estimators.sketch.prefix``)."""
    step, start_bits = _integer("step", step), _integer("start_bits", start_bits)
    if step < 1:
        raise LDPError(f"TreeHist: step must be a positive integer, got {step}")
    if not 0 <= start_bits < bits:
        raise LDPError(f"TreeHist: start_bits must lie in [0, bits), got {start_bits}")
    L = -(-(bits - start_bits) // step)
    out = tuple(min(bits, start_bits + i * step) for i in range(1, L + 1))
    if out[0] > MAX_FIRST_LEVEL_BITS:
        raise LDPError("TreeHist: the first level enumerates 2^{} prefixes; lower start_bits + step".format(out[0]))
    return out


class TreeHist(OpenDomainProtocol):
    """TreeHist (module doc): report ``uint8 (5,)``, level, row (uint16 LE), bucket (uint16 LE)."""

    name: ClassVar[str] = "TreeHist"
    longitudinal: ClassVar[bool] = True

    def __init__(self, eps: float, bits: int = 32, step: int = 3, start_bits: int | None = None, rows: int = 1024,
                 oracle: str = "lh", k_prime: int = 32, seed: int = 0, eps_1: float | None = None,
                 memo_slots: int = 4096) -> None:
        self.eps = check_eps("eps", eps)
        bits = _integer("bits", bits)
        if not 1 <= bits <= 64:
            raise LDPError(f"TreeHist: bits must be an integer in [1, 64], got {bits}")
        self.bits = self.item_bits = bits
        if oracle != "lh":
            raise LDPError(f"TreeHist: oracle must be one of ('lh',), got {oracle!r}")
        self.oracle = oracle
        self.k_prime = _integer("k_prime", k_prime)
        if self.k_prime < 1:
            raise LDPError(f"TreeHist: k_prime must be a positive integer, got {k_prime}")
        s0 = (DEFAULT_START_BITS if bits > DEFAULT_START_BITS else 0) if start_bits is None else start_bits
        self.prefix_bits = level_schedule(bits, s0, step)
        self.step, self.start_bits = int(step), int(s0)
        self.L = len(self.prefix_bits)
        self.R = _integer("rows", rows)
        if not 1 <= self.R <= _MAX_ROWS:
            raise LDPError(f"TreeHist: rows must be an integer in [1, {_MAX_ROWS}], got {rows}")
        self.seed = _integer("seed", seed)
        if not 0 <= self.seed <= M64:
            raise LDPError(f"TreeHist: seed must be an integer in [0, 2^64), got {seed}")
        self.memo_slots = _integer("memo_slots", memo_slots)
        if self.memo_slots < 64 or self.memo_slots % 64:
            raise LDPError(f"TreeHist: memo_slots must be a positive multiple of 64 (bits of memo state: "
                           f"memo_slots / 64 tags of 64 bits), got {memo_slots}")
        self.g = olh_g(self.eps)
        if self.g > 1 << 16:
            raise LDPError(f"TreeHist: ε = {self.eps:g} needs g = {self.g} > 2^16 buckets")
        seeds = row_seeds(self.seed, self.L * self.R + 1)
        self.seeds, self.memo_seed = seeds[:-1], seeds[-1]
        g = self.g
        self.t1 = grr_threshold53(self.eps, g)
        p1 = self.t1 / TWO53
        q1 = (1.0 - p1) / (g - 1)
        self.eps_1 = None if eps_1 is None else check_eps("eps_1", eps_1)
        if self.eps_1 is None:
            self.t2 = TWO53
            self.rounds = Rounds(p1, q1, 1.0, 0.0)
        else:
            p2 = grr_chain_p2(p1, q1, g, self.eps_1, self.eps_inf, "exact", "TreeHist")
            self.t2 = int(p2 * TWO53)
            p2 = self.t2 / TWO53
            self.rounds = Rounds(p1, q1, p2, (1.0 - p2) / (g - 1))
        self.lim_L, self.lim_R, self.lim_g = rejection_limit(self.L), rejection_limit(self.R), rejection_limit(g - 1)

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "eps": self.eps, "bits": self.bits, "step": self.step,
                "start_bits": self.start_bits, "rows": self.R, "oracle": self.oracle, "k_prime": self.k_prime,
                "seed": self.seed, "eps_1": self.eps_1, "memo_slots": self.memo_slots}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_inf(self) -> float:
        """``ln(T1 (g - 1) / (2^53 - T1))`` (60 digits, rounded once)."""
        with localcontext() as ctx:
            ctx.prec = 60
            return float((Decimal(self.t1) * (self.g - 1) / Decimal(TWO53 - self.t1)).ln())

    @property
    def eps_first(self) -> float:
        return self.eps_inf if self.eps_1 is None else grr_chain_eps_first(self.rounds)

    @property
    def memo_size(self) -> int:
        return self.memo_slots

    @property
    def memo_tags(self) -> int:
        """Tags in the device's table: at most this many distinct memoized prefixes are accounted."""
        return self.memo_slots // 64

    def longitudinal_loss(self, memoized: int | float) -> float:
        """One ε∞ per distinct memoized prefix (``inf`` for an overflowed table)."""
        return memoized * self.eps_inf

    def _tags(self, state: MemoState) -> list[int]:
        return [int.from_bytes(state.seen[8 * s:8 * s + 8], "little") for s in range(self.memo_tags)]

    def memoized_count(self, state: MemoState) -> int | float:
        """Distinct memoized prefixes: the nonzero tags of the table; ``inf`` once it overflowed, or when a nonzero
        word has its low bit clear (no tag table: the slot bitset of an earlier release)."""
        tags = self._tags(state)
        if (tags and tags[0] == OVERFLOW) or any(t and not t & 1 for t in tags):
            return math.inf
        return sum(1 for t in tags if t)

    def memo_tag(self, a: int, state: MemoState) -> int:
        """The tag of the memoized input ``a``: word 0 of ``(K, TAG, a)``, low bit set, never all ones."""
        t = Stream(state.key, TAG, a, 8).word(0) | 1
        return OVERFLOW ^ 2 if t == OVERFLOW else t

    def mark_tag(self, a: int, state: MemoState) -> int:
        """Insert ``a``'s tag (module doc): 1 new, 0 a repeat, -1 an overflowed table."""
        T = self.memo_tags
        if int.from_bytes(state.seen[0:8], "little") == OVERFLOW:
            return -1
        t = self.memo_tag(a, state)
        h = t % T
        for k in range(T):
            s = (h + k) % T
            c = int.from_bytes(state.seen[8 * s:8 * s + 8], "little")
            if c == t:
                return 0
            if c == 0:
                state.seen[8 * s:8 * s + 8] = t.to_bytes(8, "little")
                return 1
        state.seen[0:8] = OVERFLOW.to_bytes(8, "little")
        return -1

    @property
    def worst_case_loss(self) -> float:
        return float(self.longitudinal_loss(self.memo_slots))

    @property
    def support_size(self) -> int:
        return self.L * (1 + self.R * self.g)

    # ---------------------------------------------------------------- wire
    @property
    def report_itemsize(self) -> int:
        return 1

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (REPORT_BYTES,)

    # ---------------------------------------------------------------- device side
    def device_level(self, state: MemoState) -> int:
        """The device's level for life, from its memo key."""
        s = Stream(state.key, LEVEL, 0, 8)
        w = s.word(7)
        for j in range(8):
            if s.word(j) <= self.lim_L:
                w = s.word(j)
                break
        return w % self.L

    def memo_input(self, vid: int, state: MemoState) -> int:
        """The memoized input of ``vid``: the smallest id of the device's level prefix (all the report depends on)."""
        shift = 64 - self.prefix_bits[self.device_level(state)]
        return (vid >> shift) << shift

    @staticmethod
    def _uniform(z: int, limit: int, m: int, draw, j: int) -> tuple[int, int]:
        while z > limit:
            z = draw(j)
            j += 1
        return z % m, j

    def _grr(self, x: int, keep: int, other: int, t53: int, draw, j: int) -> tuple[int, int]:
        if (keep >> 11) < t53:
            return x, j
        o, j = self._uniform(other, self.lim_g, self.g - 1, draw, j)
        return o + (o >= x), j

    def randomize(self, value: int, draw_key: KeySource = os_key, state: MemoState | None = None) -> bytes:
        """One report: with ``state`` the memoized PRR (and the IRR with ``eps_1``), inserting its memo tag; without
        it fresh noise only (a uniform level). A noise key is drawn for every report."""
        v = self.check_value(value)
        if state is not None:
            state.check(self.fingerprint)
        return self._report(v, draw_key(), state, True)

    def randomize_value(self, value: str | int, draw_key: KeySource = os_key,
                        state: MemoState | None = None) -> bytes:
        from .sketch import value_id
        return self.randomize(value_id(value), draw_key, state)

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        """The device's PRR report of ``value`` (no IRR, nothing marked, no key drawn)."""
        if state is None:
            raise LDPError("TreeHist.memoized_output needs a memo state")
        state.check(self.fingerprint)
        return self._report(self.check_value(value), None, state, False)

    def from_memoized(self, prr: bytes, draw_key: KeySource = os_key) -> bytes:
        """A report from the device's memoized report ``prr`` (:meth:`memoized_output` of a value): what
        :meth:`randomize` gives for any value of that memoized input, one noise key drawn (the IRR on top with
        ``eps_1``), nothing marked. A frozen device reports its last value this way: its ledger records ``prr``,
        never the value (``producers/sdk.py``)."""
        if len(prr) != REPORT_BYTES:
            raise LDPError(f"a TreeHist report has {REPORT_BYTES} bytes, got {len(prr)}")
        l, j, y = prr[0], int.from_bytes(prr[1:3], "little"), int.from_bytes(prr[3:5], "little")
        if l >= self.L or j >= self.R or y >= self.g:
            raise LDPError(f"not a TreeHist report of these parameters: {prr.hex()}")
        nkey = draw_key()
        if self.t2 < TWO53:
            nd = NoiseDraws(nkey, SLOT)
            y, _ = self._grr(y, nd.word(4), nd.word(5), self.t2, nd.word, SLOT)
        return bytes([l]) + j.to_bytes(2, "little") + y.to_bytes(2, "little")

    def _report(self, v: int, nkey: bytes | None, state: MemoState | None, fresh: bool) -> bytes:
        nd = None if nkey is None else NoiseDraws(nkey, SLOT)
        jn = SLOT
        if state is not None:
            l = self.device_level(state)
            shift = 64 - self.prefix_bits[l]
            a = (v >> shift) << shift
            prr = Stream(state.key, PRR, a, 8)
            j, jp = self._uniform(prr.word(0), self.lim_R, self.R, prr.word, 3)
        else:
            assert nd is not None
            l, jn = self._uniform(nd.word(0), self.lim_L, self.L, nd.word, jn)
            j, jn = self._uniform(nd.word(1), self.lim_R, self.R, nd.word, jn)
        x = sketch_hash(v >> (64 - self.prefix_bits[l]), self.seeds[l * self.R + j], self.g)
        if state is not None:
            y, jp = self._grr(x, prr.word(1), prr.word(2), self.t1, prr.word, jp)
            if fresh:
                self.mark_tag(a, state)
        else:
            assert nd is not None
            y, jn = self._grr(x, nd.word(2), nd.word(3), self.t1, nd.word, jn)
        if fresh and self.t2 < TWO53:
            assert nd is not None
            y, jn = self._grr(y, nd.word(4), nd.word(5), self.t2, nd.word, jn)
        return bytes([l]) + j.to_bytes(2, "little") + y.to_bytes(2, "little")
