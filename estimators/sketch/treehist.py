"""TreeHist: heavy hitters over the top ``bits`` bits of 64-bit value ids with a prefix tree whose levels are
frequency oracles over PUBLIC hash rows (Bassily, Nissim, Stemmer & Thakurta, "Practical Locally Private Heavy
Hitters", NeurIPS 2017, extended in JMLR 21(16), 2020: TreeHist and its frequency oracle Hashtogram).

**Why TreeHist (and not Apple's SFP) as the second heavy-hitter protocol.** Its oracle hashes with ``R`` public rows
per level, so the server's aggregate of a level is a fixed ``R x g`` integer matrix plus a report count, additive
over reports: the count store keeps a step's support exactly once as an ordinary step vector and merges workers and
steps by addition. PEM's OLH (:mod:`.pem`) draws a private hash seed per report, so its server must keep every report
to evaluate new candidates later. SFP (Apple Differential Privacy Team, "Learning with Privacy at Scale", 2017)
needs two sketches and a puzzle-piece join over word fragments; TreeHist needs one oracle and the prefix walk PEM
already uses.

**Items and levels.** An item is the top ``bits`` bits of an id (``1 <= bits <= 64``; :attr:`item_bits`), named by
its smallest id. The levels are those of :func:`.prefix.level_schedule`: level ``l`` holds prefixes of
``ℓ_l = min(bits, start_bits + (l + 1)·step)`` bits, ``L = ceil((bits - start_bits) / step)`` levels; ``step = 1``
is the paper's binary tree, a larger ``step`` the ``2^step``-ary generalization (fewer levels, so more reports per
level, at ``2^step`` candidates per kept prefix). A device reports at one level: uniform per report in simulation;
with a memo state, fixed for life from a keyed PRF of its memo key (as RAPPOR's cohort).

**Client** (``oracle="lh"``, the default). The device draws a row ``j`` uniformly from ``[0, R)``, hashes its level
prefix with the public function ``h_{l,j}`` (:func:`.hashing.sketch_hash`, seed ``row_seeds(seed, L R + 1)[l R + j]``)
onto ``g = round(e^ε + 1)`` buckets, OLH's optimal range (:func:`estimators.hashing.olh_g`), and
reports the bucket through GRR over ``g``: kept with ``p1 = T1 / 2^53``, ``T1`` the largest integer with
``T1 (g - 1) / (2^53 - T1) <= e^ε``, else a uniform other bucket (:mod:`.treehist_kernels`). So the implemented ε is
exactly ``ln(p1 / q1)``, ``q1 = (1 - p1)/(g - 1)`` (:attr:`eps_inf`): the level and the row are independent of the
value, and two values' buckets differ at most in one GRR input. Hashtogram's own response (``oracle="hr"``: one bit
of a Hadamard row in the bucket, the paper's choice for communication) has per-report variance
``((e^ε + 1)/(e^ε - 1))^2`` against OLH's ``4 e^ε / (e^ε - 1)^2``: ``(e^ε + 1)^2 / (4 e^ε)`` = 14.2 times more at
ε = 4 (1.0 at ε → 0; the project's ``HR`` against ``OLH`` measured 13.2 times the MSE at ε = 4, docs/protocols.md);
it is not implemented: reports here are 5 bytes anyway.

**Longitudinal use.** With a :class:`~estimators.memo.MemoState` the row and the first GRR of a device are its
memoized PRR, drawn from the ChaCha20 stream ``(key, PRR, a)``, ``a`` the smallest id of the device's level prefix
(the only part of the value the report depends on): a value that does not change gives the same report forever, and
values sharing that prefix share it. ``eps_1`` adds an IRR per report: a second GRR over the ``g`` buckets from
fresh noise with ``p2`` solved by :func:`estimators.longitudinal.grr_chain_p2` (exact calibration) and quantized to
53 bits downward; ε1 is :func:`~estimators.longitudinal.grr_chain_eps_first` of the quantized rounds. The memo
accounting is exact: the state's ``memo_slots`` bits per device (a multiple of 64; 4096 by default, 512 bytes) are a
table of ``T = memo_slots / 64`` little-endian uint64 TAGS. The tag of a memoized input ``a`` is a keyed PRF of
(memo key, ``a``): word 0 of the ChaCha20 stream ``(key, TAG, a)`` (:data:`.treehist_kernels.TAG`, a domain of its
own) with its low bit set, so the table holds no value in clear and two inputs share a tag with probability
``2^-63``. It is inserted by linear probing from slot ``tag mod T``: a tag found is a repeat (no new loss), a new
input takes the first empty slot (:func:`.treehist_kernels.mark_tags`). :meth:`memoized_counts` is the number of
nonzero tags, the number of distinct memoized prefixes, and :meth:`longitudinal_loss` charges one ε∞ each. A full
table that meets a new input cannot account for it: it writes the all-ones sentinel
(:data:`.treehist_kernels.OVERFLOW`) in slot 0 and :meth:`memoized_counts` is ``inf`` for that device from then on
(so its loss is ``inf``; a device SDK refuses the new value instead). A state whose bytes hold a nonzero word with
its low bit clear is no tag table (the one-bit-per-slot bitset the accounting used before, below): it counts ``inf``
as well, and a device SDK refuses to report with it until the attribute is reset. The memoized reports do not depend
on the table. (Before, the accounting was the one-bit-per-slot approximation RAPPOR used too: slot ``h(a) mod
memo_slots``, one ε∞ per marked slot, which under-counted two inputs sharing a slot.)

**Server.** The support is, per level, the report count ``m_l`` and the ``R x g`` cell counts. A candidate prefix
``d`` at level ``l`` has ``C(d) = Σ_j cells[l, j, h_{l,j}(d)]`` and ``f̂ = (C - m/g) / (m (ps - 1/g))``, with
``ps = p1 p2 + (1 - p1) q2`` (``ps = p1`` without IRR) and ``qn = q1 p2 + (1 - q1) q2`` the probability of
reporting a given bucket other than the input (``ps + (g - 1) qn = 1``, so a non-holder hits ``h_j(d)`` with
probability ``1/g`` over the hash family: unbiased). :meth:`estimate` answers candidate ids at the last level with
this ``f̂``. :meth:`top_k` walks the tree (:func:`.prefix.prefix_walk`, ``k_prime`` prefixes kept per level) and
removes, level by level, the collision bias of the ``cancel`` (default ``k_prime``) largest candidates: given the
public hashes, ``E[f̂_d | h] = f_d + g/(g-1) Σ_{u≠d} f_u (β_u(d) - 1/g)`` (the derivation below), so
``f̃_d = f̂_d - g/(g-1) Σ_{u∈H, u≠d} max(f̃_u, 0) (β_u(d) - 1/g)`` over the heavy candidates ``H`` (three Jacobi
rounds, :func:`.treehist_kernels.collision_fractions`). It takes the heavy part out of the finite-row term below
(``S2`` then sums the uncancelled prefixes only, ``(1 - f)/n`` in the intervals); measured on the acceptance data
it is what lets 1024 rows match PEM's per-report hash seeds (docs/protocols.md).

**Variance** (derived for the implemented law over the devices' draws, their level split and the public seed, i.e. a
family whose rows hash independently and uniformly, the model of :mod:`.cms`). At a level with ``m`` reports, a
report of a holder of ``u != d`` hits ``h_J(d)`` with probability ``π_u = qn + δ β_u``, ``δ = ps - qn``, ``β_u``
the fraction of rows where ``u`` and ``d`` collide (mean ``1/g``, variance ``a/R``, ``a = (1/g)(1 - 1/g)``).
``E[π_u(1 - π_u)] = a (1 - δ^2/R)`` and ``Var[Σ_i π_i] = δ^2 (a/R) Σ_u m_u^2``, so with ``D = ps - 1/g``:

    Var f̂ = [f ps (1 - ps) + (1 - f) a (1 - δ^2/R)] / (m D^2) + δ^2 a S2_l / (R D^2) + f (1 - f)(1/m - 1/n),

the last term the level split (a uniform ``1/L`` sample of the ``n`` devices, ``m = n / L``), ``S2_l =
S2 + (1 - f - S2)(1/m - 1/n)`` the expected sum of the other prefixes' squared frequencies among the level's
reports, ``S2`` the population's (default ``(1 - f)/n``: every other device distinct). At ``R → ∞``, ``f = 0``,
``L = 1`` it is OLH's ``Var* = a / (m D^2)``; the finite-row term is the price of public rows (a frequent item
colliding with ``d`` in some rows) and shrinks as ``1/R``. :meth:`top_k`'s 95 % intervals use the exact variance
at the estimate (``S2``: the default after cancellation; without it, the squared estimates of the returned items,
the heavy part of the true ``S2``). Like PEM's they ignore the selection of the top items.
"""
from __future__ import annotations

import time
import warnings
from decimal import Decimal, localcontext
from typing import Any

import numpy as np

from ..base import check_eps
from ..errors import InvalidReports, LDPError
from ..hashing import olh_g
from ..longitudinal import Rounds, grr_chain_eps_first, grr_chain_p2
from ..memo import MemoState
from ..randomness import noise_key, rejection_limit
from . import treehist_kernels as tk
from .base import Z95, OpenDomainProtocol, TagMemo, TopK, as_ids
from .hashing import row_seeds, sketch_hash
from .prefix import level_schedule, prefix_walk

__all__ = ["TreeHist", "grr_threshold53", "compare_with_pure_ldp"]

_TWO53 = 1 << 53
_MAX_ROWS = 1 << 16
_MASK64 = (1 << 64) - 1
ORACLES = ("lh",)
REPORT_BYTES = 5  # level (uint8), row (uint16 LE), bucket (uint16 LE)
CANCEL_ROUNDS = 3
DEFAULT_START_BITS = 2  # with step 3: levels of 5, 8, .., 32 bits (the measured default, docs/protocols.md)


def grr_threshold53(eps: float, g: int) -> int:
    """The largest ``T`` with ``T (g - 1) / (2^53 - T) <= e^eps`` (60-digit decimal arithmetic): GRR over ``g``
    buckets keeps the input with ``p = T / 2^53`` and its ratio ``p / q`` never exceeds ``e^eps``."""
    with localcontext() as ctx:
        ctx.prec = 60
        e = Decimal(float(eps)).exp()
        t = int((Decimal(_TWO53) * e / (e + (g - 1))).to_integral_value(rounding="ROUND_FLOOR"))
        while Decimal(t + 1) * (g - 1) <= e * (_TWO53 - t - 1):  # guard the last digit both ways
            t += 1
        while Decimal(t) * (g - 1) > e * (_TWO53 - t):
            t -= 1
    return t


def _grr_eps(t: int, g: int) -> float:
    """``ln(T (g - 1) / (2^53 - T))`` at 60 digits, rounded once."""
    with localcontext() as ctx:
        ctx.prec = 60
        return float((Decimal(t) * (g - 1) / Decimal(_TWO53 - t)).ln())


class TreeHist(TagMemo, OpenDomainProtocol):
    """TreeHist over the top ``bits`` bits of 64-bit ids (module doc). Reports: ``uint8 (n, 5)``, the level, the row
    (little-endian ``uint16``) and the bucket (little-endian ``uint16``); support ``int64 (L (1 + R g),)``: level
    ``l``'s block starts at ``l (1 + R g)`` with its report count, then its ``R x g`` cells row-major."""

    name = "TreeHist"
    finds_items = True

    def __init__(self, eps: float, bits: int = 32, step: int = 3, start_bits: int | None = None, rows: int = 1024,
                 oracle: str = "lh", k_prime: int = 32, seed: int = 0, eps_1: float | None = None,
                 memo_slots: int = 4096) -> None:
        self.eps = check_eps("eps", eps)
        if isinstance(bits, bool) or int(bits) != bits or not 1 <= bits <= 64:
            raise LDPError(f"TreeHist: bits must be an integer in [1, 64], got {bits}")
        self.item_bits = self.bits = int(bits)
        if oracle not in ORACLES:
            raise LDPError(f"TreeHist: oracle must be one of {ORACLES}, got {oracle!r} (module doc: 'hr')")
        self.oracle = oracle
        if isinstance(k_prime, bool) or int(k_prime) != k_prime or k_prime < 1:
            raise LDPError(f"TreeHist: k_prime must be a positive integer, got {k_prime}")
        self.k_prime = int(k_prime)
        s0 = (DEFAULT_START_BITS if self.bits > DEFAULT_START_BITS else 0) if start_bits is None else start_bits
        self.prefix_bits = level_schedule(self.bits, s0, step, "TreeHist")
        self.step, self.start_bits = int(step), int(s0)
        self.L = len(self.prefix_bits)
        if self.L > 255:
            raise LDPError("TreeHist: at most 255 levels")  # pragma: no cover (bits <= 64)
        if isinstance(rows, bool) or int(rows) != rows or not 1 <= rows <= _MAX_ROWS:
            raise LDPError(f"TreeHist: rows must be an integer in [1, {_MAX_ROWS}], got {rows}")
        self.R = int(rows)
        if isinstance(seed, bool) or int(seed) != seed or not 0 <= seed <= _MASK64:
            raise LDPError(f"TreeHist: seed must be an integer in [0, 2^64), got {seed}")
        self.seed = int(seed)
        self.memo_slots = self.check_memo_slots(memo_slots)
        self.g = olh_g(self.eps)
        if self.g > 1 << 16:
            raise LDPError(f"TreeHist: ε = {self.eps:g} needs g = {self.g} > 2^16 buckets")
        seeds = row_seeds(self.seed, self.L * self.R + 1)
        self.seeds = seeds[:-1]          # level l, row j: seeds[l R + j]
        self.memo_seed = seeds[-1:]      # unused since the tag tables (kept: the row seeds stay the same)
        self.plen = np.array(self.prefix_bits, dtype=np.int64)
        g = self.g
        self.t1 = grr_threshold53(self.eps, g)
        p1 = self.t1 / _TWO53
        q1 = (1.0 - p1) / (g - 1)
        self.eps_1 = None if eps_1 is None else check_eps("eps_1", eps_1)
        if self.eps_1 is None:
            self.t2 = _TWO53
            self.rounds = Rounds(p1, q1, 1.0, 0.0)
        else:
            p2 = grr_chain_p2(p1, q1, g, self.eps_1, self.eps_inf, "exact", "TreeHist")
            self.t2 = int(p2 * _TWO53)               # downward: the single-report ratio only shrinks
            p2 = self.t2 / _TWO53
            self.rounds = Rounds(p1, q1, p2, (1.0 - p2) / (g - 1))
        self.ps = self.rounds.ps
        self.qn = self.rounds.qs
        self._limits = (rejection_limit(self.L), rejection_limit(self.R), rejection_limit(g - 1))

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "eps": self.eps, "bits": self.bits, "step": self.step,
                "start_bits": self.start_bits, "rows": self.R, "oracle": self.oracle, "k_prime": self.k_prime,
                "seed": self.seed, "eps_1": self.eps_1, "memo_slots": self.memo_slots}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_inf(self) -> float:
        """ε of the (memoized) first GRR: ``ln(p1 / q1) = ln(T1 (g - 1) / (2^53 - T1)) <= eps``."""
        return _grr_eps(self.t1, self.g)

    @property
    def eps_first(self) -> float:
        """ε of one report: ``eps_inf`` without an IRR, else the GRR chain's ``ln(ps / qn)``."""
        return self.eps_inf if self.eps_1 is None else grr_chain_eps_first(self.rounds)

    # ---------------------------------------------------------------- device side
    def device_levels(self, state: MemoState) -> np.ndarray:
        """Each device's level for life, ``int64 (n_devices,)``, from its memo key."""
        return tk.keyed_choice(np.ascontiguousarray(state.keys), tk.LEVEL, self.L, self._limits[0])

    def memo_inputs(self, ids, levels: np.ndarray) -> np.ndarray:
        """The memoized input of each device: the smallest id of its level prefix, ``uint64 (n,)``."""
        shift = (64 - self.plen[levels]).astype(np.uint64)
        return (as_ids(ids) >> shift) << shift

    def _run(self, ids, state: MemoState | None, nkey, irr: bool, mark: bool) -> np.ndarray:
        v = self.check_values(ids)
        n = v.shape[0]
        if state is None:
            keys = np.zeros((0, 8), dtype=np.uint32)
            levels = np.zeros(0, dtype=np.int64)
            avals = np.zeros(0, dtype=np.uint64)
        else:
            state.check(self.fingerprint, n)
            keys = np.ascontiguousarray(state.keys)
            levels = self.device_levels(state)
            avals = self.memo_inputs(v, levels)
            if mark and n:
                tk.mark_tags(keys, tk.TAG, avals, state.seen)  # in place (a subset view writes through)
        lv, rw, y = tk.treehist_randomize(v, self.plen, self.seeds, self.R, self.g, nkey, keys, levels, avals,
                                          np.uint64(self.t1), np.uint64(self.t2 if irr else _TWO53), *self._limits)
        return self.pack(lv, rw, y)

    def randomize(self, values, rng: np.random.Generator | None = None, state: MemoState | None = None) -> np.ndarray:
        """Reports of devices ``0 .. n-1`` holding the ids ``values``: with ``state`` the memoized PRR (and the IRR
        when ``eps_1`` is set), marking the memoized inputs; without it a fresh report per call (a uniform level).
        Noise from ``rng`` (``None``: the OS CSPRNG; a Generator: the labelled simulation mode)."""
        return self._run(values, state, noise_key(rng), True, True)

    def memoized_outputs(self, values, state: MemoState) -> np.ndarray:
        """The devices' PRR reports (same layout), without the IRR and without marking anything."""
        if state is None:
            raise LDPError("TreeHist.memoized_outputs needs a memo state")
        return self._run(values, state, np.zeros(8, dtype=np.uint32), False, False)

    # ---------------------------------------------------------------- audit hook
    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """Reports whose bucket is ``v1``'s prefix bucket in their (level, row) where ``v1``'s and ``v2``'s buckets
        differ: probability ratio exactly ``ps / qn = e^{eps_first}`` (the level and row do not depend on the
        value)."""
        lv, rw, y = self.unpack(reports)
        ids = np.array([v1, v2], dtype=np.uint64)
        h = np.empty((2, self.L * self.R), dtype=np.int64)
        for l in range(self.L):
            pre = ids >> np.uint64(64 - self.prefix_bits[l])
            h[:, l * self.R:(l + 1) * self.R] = sketch_hash(pre, self.seeds[l * self.R:(l + 1) * self.R], self.g)
        s = lv * self.R + rw
        return (y == h[0, s]) & (h[0, s] != h[1, s])

    # ---------------------------------------------------------------- wire format
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (REPORT_BYTES,)

    @staticmethod
    def pack(level, row, y) -> np.ndarray:
        out = np.empty((np.shape(level)[0], REPORT_BYTES), dtype=np.uint8)
        out[:, 0] = level
        out[:, 1:3] = np.asarray(row, dtype="<u2")[:, None].view(np.uint8)
        out[:, 3:5] = np.asarray(y, dtype="<u2")[:, None].view(np.uint8)
        return out

    def unpack(self, reports) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(level, row, bucket)``, three ``int64 (n,)``, of valid reports; raises :class:`InvalidReports`."""
        r = np.asarray(reports)
        if r.dtype != np.uint8 or r.ndim != 2 or r.shape[1:] != self.report_shape:
            raise InvalidReports(f"TreeHist reports must be uint8 (n, {REPORT_BYTES}), got {r.dtype} {r.shape}")
        lv = r[:, 0].astype(np.int64)
        rw = r[:, 1].astype(np.int64) | (r[:, 2].astype(np.int64) << 8)
        y = r[:, 3].astype(np.int64) | (r[:, 4].astype(np.int64) << 8)
        if r.shape[0]:
            if lv.max() >= self.L:
                raise InvalidReports(f"a TreeHist report names level {int(lv.max())} of {self.L}")
            if rw.max() >= self.R:
                raise InvalidReports(f"a TreeHist report names row {int(rw.max())} of {self.R}")
            if y.max() >= self.g:
                raise InvalidReports(f"a TreeHist report names bucket {int(y.max())} of {self.g}")
        return lv, rw, y

    def validate_reports(self, reports: np.ndarray) -> None:
        self.unpack(reports)

    # ---------------------------------------------------------------- server side
    @property
    def _block(self) -> int:
        return 1 + self.R * self.g

    @property
    def support_size(self) -> int:
        return self.L * self._block

    def support(self, reports: np.ndarray) -> np.ndarray:
        lv, rw, y = self.unpack(reports)
        b = self._block
        out = np.bincount(lv * b, minlength=self.support_size)
        out += np.bincount(lv * b + 1 + rw * self.g + y, minlength=self.support_size)
        return out.astype(np.int64)

    def _levels_view(self, support) -> np.ndarray:
        s = np.asarray(support)
        if s.shape != (self.support_size,):
            raise LDPError(f"support must have shape ({self.support_size},), got {s.shape}")
        return s.reshape(self.L, self._block)

    def reports_in(self, support: np.ndarray) -> int:
        return int(self._levels_view(support)[:, 0].sum())

    def level_reports(self, support: np.ndarray) -> np.ndarray:
        """``m_l`` of every level, ``int64 (L,)``."""
        return self._levels_view(support)[:, 0].astype(np.int64)

    def level_estimate(self, support: np.ndarray, level: int, prefixes, cancel: int = 0) -> np.ndarray:
        """``f̂`` of candidate prefixes (integers of ``prefix_bits[level]`` bits) at ``level`` (module doc); with
        ``cancel > 0`` the collision bias of the ``cancel`` largest candidates is removed (module doc)."""
        s = self._levels_view(support)[level]
        m = int(s[0])
        if m <= 0:  # a level no device reported at (a tiny step): no information, the estimate of no data
            return np.zeros(len(prefixes))
        cells = np.ascontiguousarray(s[1:].reshape(self.R, self.g), dtype=np.int64)
        seeds = self.seeds[level * self.R:(level + 1) * self.R]
        cands = np.ascontiguousarray(prefixes, dtype=np.uint64)
        c = tk.candidate_counts(cands, seeds, cells, self.g)
        f = (c - m / self.g) / (m * (self.ps - 1.0 / self.g))
        if cancel <= 0 or f.shape[0] < 2:
            return f
        g = self.g
        heavy = np.argsort(-f, kind="stable")[:int(cancel)]
        B = (g / (g - 1.0)) * (tk.collision_fractions(sketch_hash(cands, seeds, g), heavy) - 1.0 / g)
        B[heavy, np.arange(heavy.shape[0])] = 0.0          # a candidate does not collide with itself
        out = f
        for _ in range(CANCEL_ROUNDS):                     # Jacobi: the heavy estimates are themselves corrected
            out = f - B @ np.clip(out[heavy], 0.0, None)
        return out

    def _check(self, support, n) -> None:
        if int(n) != n or n <= 0:
            raise LDPError(f"n must be a positive integer, got {n}")
        if self.reports_in(support) != n:
            raise LDPError(f"the support counts {self.reports_in(support)} reports, not n = {n}")

    def estimate(self, support: np.ndarray, n: int, ids=None, postprocess: str | None = None) -> np.ndarray:
        """Estimated frequencies of the items of the candidate ``ids`` (their top ``bits`` bits), at the last
        level."""
        if ids is None:
            raise LDPError("TreeHist estimates candidate ids (or finds the top items: top_k)")
        if postprocess is not None:
            raise LDPError("TreeHist has no post-processing yet")
        self._check(support, n)
        prefixes = as_ids(ids) >> np.uint64(64 - self.bits)
        return self.level_estimate(support, self.L - 1, prefixes)

    def top_k(self, support: np.ndarray, n: int, k: int, candidates=None, cancel: int | None = None) -> TopK:
        """The ``k`` most frequent items found by the prefix walk (no candidates needed; with ``candidates`` the
        base ranking of those), most frequent first, with 95 % intervals (module doc). ``cancel``: candidates per
        level whose collision bias is removed (default ``k_prime``; 0: the plain estimates)."""
        if candidates is not None:
            return super().top_k(support, n, k, candidates)
        if int(k) != k or k < 1:
            raise LDPError(f"k must be a positive integer, got {k}")
        self._check(support, n)
        if np.any(self.level_reports(support) == 0):  # a level nobody reported at: the walk cannot pass it
            empty = np.zeros(0)
            return TopK(np.zeros(0, dtype=np.uint64), empty, empty, empty, self.bits)
        k = int(k)
        kp = max(self.k_prime, k)
        cancel = kp if cancel is None else int(cancel)
        prefixes, f = prefix_walk(self.prefix_bits, lambda lvl, c: self.level_estimate(support, lvl, c, cancel), k,
                                  kp, dtype=np.uint64)
        items = prefixes << np.uint64(64 - self.bits) if self.bits < 64 else prefixes
        fc = np.clip(f, 0.0, 1.0)
        sumsq = None if cancel > 0 else np.maximum(float((fc ** 2).sum()) - fc ** 2, (1.0 - fc) / n)
        half = Z95 * np.sqrt(self.variance_exact(fc, n, sumsq))
        return TopK(items, f, f - half, f + half, self.bits)

    def variance(self, n: int) -> float:
        """The variance of an item nobody holds, every device holding a distinct value (module doc)."""
        return float(self.variance_exact(0.0, n))

    def variance_exact(self, f, n: int, sumsq=None) -> np.ndarray:
        """Variance of the last level's estimate of an item of frequency ``f`` among ``n`` reports (module doc);
        ``sumsq``: the sum of the other last-level prefixes' squared frequencies (default ``(1 - f)/n``)."""
        f = np.asarray(f, dtype=np.float64)
        g, R = self.g, self.R
        m = n / self.L
        a = (1.0 / g) * (1.0 - 1.0 / g)
        d = self.ps - self.qn
        D = self.ps - 1.0 / g
        s2 = (1.0 - f) / n if sumsq is None else np.asarray(sumsq, dtype=np.float64)
        s2l = s2 + (1.0 - f - s2) * (1.0 / m - 1.0 / n)
        noise = (f * self.ps * (1.0 - self.ps) + (1.0 - f) * a * (1.0 - d * d / R)) / (m * D * D)
        return noise + d * d * a * s2l / (R * D * D) + f * (1.0 - f) * (1.0 / m - 1.0 / n)


# ------------------------------------------------------------------------------ the acceptance comparison
def compare_with_pure_ldp(n: int = 10**6, seed: int = 0, bits: int = 32, eps: float = 4.0, k: int = 20,
                          s: float = 1.1, run_pure_ldp: bool = True, pure_start_bits: int = 4, pure_step: int = 4,
                          **treehist_kwargs) -> dict:
    """Issue 24's acceptance for TreeHist: Zipf(``s``) over ``2^bits`` values (:func:`.pem.zipf_items`, the same
    data as PEM's run for the same ``seed``), ``n`` devices, ε; recall of the true top-``k`` by TreeHist (public
    seed ``seed``, simulation noise seeded with ``seed``) and by pure-ldp 1.2.0's PEM (``pure_start_bits``,
    ``pure_step``, seeded with ``seed``), with wall times. Needs the ``bench`` extra (pure-ldp, xxhash)."""
    from .pem import _true_top, run_pure_ldp_pem, zipf_items

    items = zipf_items(n, bits, s, seed)
    truth = set(_true_top(items, k).tolist())
    th = TreeHist(eps, bits=bits, seed=seed, **treehist_kwargs)
    ids = items.astype(np.uint64) << np.uint64(64 - bits)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # a seeded simulation is reproducible on purpose
        warnings.filterwarnings("ignore", message="simulation mode")
        rep = th.randomize(ids, np.random.default_rng(seed))
    t1 = time.perf_counter()
    sup = th.support(rep)
    t2 = time.perf_counter()
    res = th.top_k(sup, n, k)
    t3 = time.perf_counter()
    ours = (res.items >> np.uint64(64 - bits)).astype(np.int64)
    u, c = np.unique(items, return_counts=True)
    f_true = dict(zip(u.tolist(), (c / n).tolist()))
    covered = sum(lo <= f_true.get(int(it), 0.0) <= hi for it, lo, hi in zip(ours, res.lo, res.hi))
    out = {"n": n, "bits": bits, "eps": eps, "k": k, "zipf_s": s, "seed": seed, "treehist": th.params(),
           "levels": th.L, "ours": {"recall": len(set(ours.tolist()) & truth) / k, "randomize_s": t1 - t0,
                                    "support_s": t2 - t1, "decode_s": t3 - t2, "interval_coverage": covered / k}}
    if run_pure_ldp:
        out["pure_ldp"] = run_pure_ldp_pem(items, truth, seed, bits, eps, k, pure_start_bits, pure_step)
    return out


if __name__ == "__main__":  # the acceptance run: python -m estimators.sketch.treehist [seed ...]
    import json
    import sys

    for sd in [int(a) for a in sys.argv[1:]] or [0, 1, 2]:
        print(json.dumps(compare_with_pure_ldp(seed=sd)), flush=True)
