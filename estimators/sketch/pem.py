"""PEM, the prefix extending method: heavy hitters over a ``bits``-bit domain of value ids (Wang, Li & Jha, "Locally Differentially Private Heavy Hitter Identification", IEEE TDSC 2021, arXiv
1708.06674, 2017; summarized in Wang, Zhang, Feng & Yang, "A Comprehensive Survey on Local Differential Privacy toward
Data Statistics and Analysis", Sensors 2020). First increment of issue 24 part 2: a simulation-side module, not wired
into the pipeline.

**Items.** A device's item is an integer in ``[0, 2^bits)``, ``bits <= 32`` (the project's OLH hashes 32-bit inputs:
``k <= 2^32``). A numeric attribute below ``2^bits`` is its own item; an open-domain value's 64-bit id
(:func:`estimators.sketch.hashing.value_id`, a hash) is reduced to its top ``bits`` bits by :func:`id_items`
(two values share an item with probability ``2^-bits``; mapping items back to values needs a dictionary of
candidates, outside this module).

**Client.** Devices are split into ``g`` groups, by a uniform draw (``rng.integers``) or by index (``i mod g``) in
simulation. Group ``i = 1..g`` reports the top ``ℓ_i = min(bits, start_bits + i * step)`` bits of its item through
the project's OLH over ``2^ℓ_i`` values (``estimators.make("OLH", k=2**ℓ_i, eps=eps)``: one hash seed and one
hashed, GRR-randomized value per report), so each device spends its whole ε once; ``g = ceil((bits -
start_bits) / step)``. This is the paper's numbering (its ``s_0 = ⌈log2 k⌉`` is ``start_bits``, ``η`` is ``step``)
and pure-ldp's (``start_length + (i + 1) * fragment_length``, ``i`` from 0).

**Server.** The prefix-tree walk of :mod:`.prefix` (shared with TreeHist): level 1 estimates all ``2^ℓ_1``
prefixes; level ``i > 1`` estimates only the ``K' 2^(ℓ_i - ℓ_{i-1})`` extensions of level ``i - 1``'s top-``K'``
prefixes (:func:`.pem_kernels.candidate_support`, O(n_i |candidates|), never the ``2^ℓ_i`` domain). The last
level keeps the top ``K`` full items. A group's estimate ``f = (C - m qs) / (m (ps - qs))`` over its own ``m``
reports estimates the population frequency because groups are a uniform split.

**Longitudinal use.** With a :class:`~estimators.memo.MemoState` (:meth:`PEM.new_state`) a device's group is
fixed for life by a keyed PRF of its memo key, and its OLH report (hash seed and GRR bucket) of its group prefix is
drawn from the stream ``(key, PRR, prefix)`` (:func:`.pem_kernels.memo_olh`): a value that does not change gives
the same report forever, the PRR rule of the frequency protocols. The accounting is RAPPOR's (:mod:`.rappor`):
``memo_slots`` bits per device (a multiple of 64), read as a table of ``memo_slots / 64`` keyed 64-bit tags of
the memoized prefixes, TreeHist's (:func:`.treehist_kernels.mark_tags`, its own stream domain): a repeated prefix is
found, a new one costs ε∞ (OLH's ε), a full table makes the loss ``inf``; :meth:`PEM.longitudinal_loss` of
:meth:`PEM.memoized_counts` is exact.

**Intervals.** Each returned item carries ``f ± 1.96 sqrt(Var)`` with OLH's exact variance
``Var = γ (1 - γ) / (m (ps - qs)^2)``, ``γ = qs + f (ps - qs)`` (:meth:`estimators.base.PureProtocol.variance_exact`,
at ``f`` clipped to ``[0, 1]``) for the last group's ``m ≈ n / g`` reports: that is the frequency oracle's Var*
(``f = 0``) for ``n`` reports scaled by ``g``, corrected upward for heavy items (at ε = 4, ``f = 0.1`` raises it 3.5
times). The interval is per item and normal-approximate; it ignores the selection (items are reported because
their estimate was large, which biases the smallest of the top ``K`` upward).
"""
from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidReports, LDPError
from ..memo import MemoState
from ..randomness import rejection_limit
from ..registry import make
from .pem_kernels import GROUP, candidate_support, memo_olh
from .pem_kernels import TAG as PEM_TAG
from .base import TagMemo
from .treehist_kernels import mark_tags
from .treehist_kernels import keyed_choice
from .prefix import default_start_bits, level_schedule, prefix_walk

Z95 = 1.959963984540054  # two-sided 95 % normal quantile

__all__ = ["PEM", "PEMReports", "PEMResult", "id_items", "zipf_items", "compare_with_pure_ldp", "run_pure_ldp_pem"]


def id_items(ids, bits: int) -> np.ndarray:
    """The top ``bits`` bits of 64-bit value ids (:func:`estimators.sketch.hashing.value_ids`), ``int64 (n,)``."""
    _check_bits(bits)
    return (np.asarray(ids, dtype=np.uint64) >> np.uint64(64 - bits)).astype(np.int64)


def _check_bits(bits: int) -> int:
    if isinstance(bits, bool) or int(bits) != bits or not 1 <= bits <= 32:
        raise LDPError(f"PEM: bits must be an integer in [1, 32], got {bits}")
    return int(bits)


@dataclass(frozen=True)
class PEMReports:
    """OLH reports of every group: ``levels[i]`` holds the reports of the devices that sent ``ℓ_{i+1}``-bit
    prefixes."""

    levels: tuple[np.ndarray, ...]

    @property
    def n(self) -> int:
        return int(sum(r.shape[0] for r in self.levels))


@dataclass(frozen=True)
class PEMResult:
    """The top-``K`` items, most frequent first, with estimated frequencies and 95 % intervals."""

    items: np.ndarray  # int64 (K,)
    freq: np.ndarray   # float64 (K,)
    lo: np.ndarray
    hi: np.ndarray
    group_sizes: tuple[int, ...]


class PEM(TagMemo):
    """Prefix extending method over ``[0, 2^bits)`` with ε-LDP OLH per group (module docstring).

    ``k``: the number of heavy hitters returned; ``k_prime`` (default ``k``, the paper's choice): prefixes kept per
    level; ``start_bits`` (default ``ceil(log2 k_prime)``, the paper's ``s_0``) and ``step`` (``η``) fix the levels.
    """

    def __init__(self, bits: int, eps: float, k: int, step: int = 4, start_bits: int | None = None,
                 k_prime: int | None = None, memo_slots: int = 4096) -> None:
        self.bits = _check_bits(bits)
        if int(k) != k or k < 1:
            raise LDPError(f"PEM: k must be a positive integer, got {k}")
        self.k = int(k)
        self.k_prime = self.k if k_prime is None else int(k_prime)
        if self.k_prime < self.k:
            raise LDPError(f"PEM: k_prime = {k_prime} must be at least k = {k}")
        s0 = default_start_bits(self.k_prime) if start_bits is None else start_bits
        self.prefix_bits = level_schedule(self.bits, s0, step, "PEM")
        self.step, self.start_bits = int(step), int(s0)
        self.eps = float(eps)
        self.oracles = tuple(make("OLH", k=2 ** ell, eps=self.eps) for ell in self.prefix_bits)
        self.memo_slots = self.check_memo_slots(memo_slots)

    def params(self) -> dict:
        return {"protocol": "PEM", "bits": self.bits, "eps": self.eps, "k": self.k, "step": self.step,
                "start_bits": self.start_bits, "k_prime": self.k_prime, "memo_slots": self.memo_slots}

    @property
    def fingerprint(self) -> str:
        blob = json.dumps(self.params(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # ---------------------------------------------------------------- longitudinal use
    @property
    def eps_inf(self) -> float:
        """ε of one (memoized) OLH report: every group's OLH has the same ``g`` and ``p``."""
        return self.oracles[0].eps_first

    def device_groups(self, state: MemoState) -> np.ndarray:
        """Each device's group for life, ``int64 (n_devices,)``, from its memo key (a keyed PRF, as TreeHist's
        level)."""
        return keyed_choice(np.ascontiguousarray(state.keys), GROUP, self.groups, rejection_limit(self.groups))

    @property
    def groups(self) -> int:
        return len(self.prefix_bits)

    def assign_groups(self, n: int, rng: np.random.Generator | None = None, by_index: bool = False) -> np.ndarray:
        """Group of each device, ``int64 (n,)``: ``i mod g`` with ``by_index``, else uniform draws from ``rng``."""
        if by_index:
            return np.arange(n, dtype=np.int64) % self.groups
        return np.random.default_rng(rng).integers(0, self.groups, n)

    def randomize(self, items, rng: np.random.Generator | None = None, by_index: bool = False,
                  state: MemoState | None = None) -> PEMReports:
        """Every device's report: group split, then OLH of the group's prefix. Without ``state`` (simulation) the
        groups are drawn (or ``by_index``) and every report is fresh; with a memo state a device's group is fixed by
        its memo key and its report of a prefix is memoized (:func:`.pem_kernels.memo_olh`), marking the prefix in
        the state's memo slots (the accounting of :meth:`longitudinal_loss`)."""
        v = np.asarray(items, dtype=np.int64)
        if v.ndim != 1 or (v.size and (v.min() < 0 or v.max() >= (1 << self.bits))):
            raise LDPError(f"PEM: items must be a 1-d array of integers in [0, 2^{self.bits})")
        if state is not None:
            return self._memoized(v, state, mark=True)
        rng = np.random.default_rng(rng)
        grp = self.assign_groups(v.shape[0], rng, by_index)
        out = []
        for i, (ell, oracle) in enumerate(zip(self.prefix_bits, self.oracles)):
            out.append(oracle.randomize(v[grp == i] >> (self.bits - ell), rng))
        return PEMReports(tuple(out))

    def _memoized(self, v: np.ndarray, state: MemoState, mark: bool) -> PEMReports:
        state.check(self.fingerprint, v.shape[0])
        grp = self.device_groups(state)
        out = []
        for i, (ell, oracle) in enumerate(zip(self.prefix_bits, self.oracles)):
            rows = np.flatnonzero(grp == i)
            x = v[rows] >> (self.bits - ell)
            seeds, ys = memo_olh(np.ascontiguousarray(x), np.ascontiguousarray(state.keys[rows]), oracle.g, oracle.p)
            if mark and rows.size:  # the prefix's tag in the device's table (module doc)
                seen = np.ascontiguousarray(state.seen[rows])
                mark_tags(np.ascontiguousarray(state.keys[rows]), PEM_TAG,
                          x.astype(np.uint64) << np.uint64(64 - ell), seen)
                state.seen[rows] = seen
            r = np.empty(rows.shape[0], dtype=oracle.report_dtype)
            r["seed"], r["y"] = seeds, ys
            out.append(r)
        return PEMReports(tuple(out))

    def memoized_outputs(self, items, state: MemoState) -> PEMReports:
        """The devices' memoized reports, without marking anything."""
        return self._memoized(np.asarray(items, dtype=np.int64), state, mark=False)

    def _level_estimates(self, level: int, reports: np.ndarray, cands: np.ndarray) -> tuple[np.ndarray, int]:
        oracle = self.oracles[level]
        r = np.asarray(reports)
        if r.ndim != 1 or r.dtype != oracle.report_dtype:
            raise InvalidReports(f"PEM level {level}: reports must be a 1-d array of dtype {oracle.report_dtype}")
        oracle.validate_reports(r)
        m = r.shape[0]
        if m == 0:
            raise InvalidReports(f"PEM level {level}: no reports")
        c = candidate_support(np.ascontiguousarray(r["seed"]), np.ascontiguousarray(r["y"]).astype(np.int64),
                              cands, oracle.g)
        return (c - m * oracle.qs) / (m * (oracle.ps - oracle.qs)), m

    def decode(self, reports: PEMReports) -> PEMResult:
        """Level-by-level prefix extension (module docstring); the top-``k`` items, most frequent first."""
        if len(reports.levels) != self.groups:
            raise InvalidReports(f"PEM: {len(reports.levels)} groups of reports, expected {self.groups}")
        sizes = []

        def level_estimate(lvl: int, cands: np.ndarray) -> np.ndarray:
            f, m = self._level_estimates(lvl, reports.levels[lvl], cands)
            sizes.append(m)
            return f

        items, freq = prefix_walk(self.prefix_bits, level_estimate, self.k, self.k_prime)
        var = self.oracles[-1].variance_exact(np.clip(freq, 0.0, 1.0), sizes[-1])
        half = Z95 * np.sqrt(var)
        return PEMResult(items, freq, freq - half, freq + half, tuple(sizes))


# ------------------------------------------------------------------------------ the acceptance comparison
def zipf_items(n: int, bits: int, s: float, seed: int) -> np.ndarray:
    """``n`` draws of Zipf(``s``) over ``2^bits`` values (ranks by rejection from numpy's zeta, ``rank <= 2^bits``),
    rank ``r`` placed at item ``((r - 1) * a + b) mod 2^bits`` (``a`` odd, ``a, b`` from ``seed``) so that heavy
    items spread over prefixes; ``int64 (n,)``."""
    rng = np.random.default_rng(seed)
    size = 1 << bits
    ranks = np.empty(0, dtype=np.int64)
    while ranks.shape[0] < n:
        r = rng.zipf(s, 2 * (n - ranks.shape[0]) + 16)
        ranks = np.concatenate([ranks, r[(r >= 1) & (r <= size)][: n - ranks.shape[0]]])
    a = int(rng.integers(0, size)) | 1
    b = int(rng.integers(0, size))
    return ((ranks - 1) * a + b) % size


def _true_top(items: np.ndarray, k: int) -> np.ndarray:
    u, c = np.unique(items, return_counts=True)
    return u[np.argsort(-c, kind="stable")[:k]]


def _pure_ldp_pem_classes():
    """pure-ldp 1.2.0's PEMClient / PEMServer / LHServer without running its package ``__init__`` files (they import
    every oracle, RAPPOR's scikit-learn included)."""
    import importlib
    import os
    import sys
    import types

    import pure_ldp
    base = os.path.dirname(pure_ldp.__file__)
    for sub in ("frequency_oracles", "heavy_hitters"):
        name = f"pure_ldp.{sub}"
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(base, sub)]
            sys.modules[name] = mod
    client = importlib.import_module("pure_ldp.heavy_hitters.prefix_extending.pem_client").PEMClient
    server = importlib.import_module("pure_ldp.heavy_hitters.prefix_extending.pem_server").PEMServer
    lh = importlib.import_module("pure_ldp.frequency_oracles.local_hashing.lh_server").LHServer
    return client, server, lh


def _lazy_lh_server_class(LHServer):
    """pure-ldp's OLH server with the same hash (xxh32 of ``str(index)``), probabilities and estimator
    (``g / (p g - 1) C - n / (p g - 1)``), but storing reports and counting the support of the asked candidates only:
    its own ``aggregate`` walks the whole domain per report (``2^32`` at PEM's last level) and ``reset`` allocates
    two arrays of ``d`` floats."""
    import xxhash

    class LazyLHServer(LHServer):
        def reset(self):
            self.seeds, self.ys, self.n, self.last_estimated = [], [], 0, 0

        def aggregate(self, priv_data):
            self.ys.append(priv_data[0])
            self.seeds.append(priv_data[1])
            self.n += 1

        def estimate_all(self, data_list, suppress_warnings=False, normalization=0):
            ys = np.asarray(self.ys, dtype=np.int64)
            a = self.g / (self.p * self.g - 1)
            b = self.n / (self.p * self.g - 1)
            out = []
            for x in data_list:
                key = str(self.index_mapper(x))
                h = np.fromiter((xxhash.xxh32_intdigest(key, s) for s in self.seeds), dtype=np.int64,
                                count=len(self.seeds))
                out.append(a * int(np.count_nonzero(h % self.g == ys)) - b)
            return np.asarray(out)

    return LazyLHServer


def compare_with_pure_ldp(n: int = 10**6, seed: int = 0, bits: int = 32, eps: float = 4.0, k: int = 20,
                          s: float = 1.1, start_bits: int = 4, step: int = 4, k_prime: int | None = None,
                          run_pure_ldp: bool = True) -> dict:
    """Issue 24's acceptance: Zipf(``s``) over ``2^bits`` values, ``n`` devices, ε; recall of the true top-``k``
    by this PEM and by pure-ldp 1.2.0's PEM (same data, same ``start_bits``/``step``; pure-ldp seeded with ``seed``
    through ``random`` and ``np.random``), with wall times. ``(bits - start_bits)`` must be a multiple of ``step``
    (pure-ldp's last fragment would otherwise overrun ``bits``). Needs the ``bench`` extra (pure-ldp, xxhash)."""
    if (bits - start_bits) % step:
        raise LDPError("compare_with_pure_ldp: bits - start_bits must be a multiple of step")
    items = zipf_items(n, bits, s, seed)
    truth = set(_true_top(items, k).tolist())
    pem = PEM(bits, eps, k, step=step, start_bits=start_bits, k_prime=k_prime)
    t0 = time.perf_counter()
    with warnings.catch_warnings():  # a seeded simulation is reproducible on purpose
        warnings.filterwarnings("ignore", message="simulation mode")
        rep = pem.randomize(items, np.random.default_rng(seed))
    t1 = time.perf_counter()
    res = pem.decode(rep)
    t2 = time.perf_counter()
    ours = set(res.items.tolist())
    f_true = {int(u): c / n for u, c in zip(*np.unique(items, return_counts=True)) if int(u) in ours}
    covered = sum(lo <= f_true.get(int(it), 0.0) <= hi for it, lo, hi in zip(res.items, res.lo, res.hi))
    out = {"n": n, "bits": bits, "eps": eps, "k": k, "zipf_s": s, "seed": seed, "start_bits": start_bits,
           "step": step, "groups": pem.groups, "k_prime": pem.k_prime,
           "ours": {"recall": len(ours & truth) / k, "randomize_s": t1 - t0, "decode_s": t2 - t1,
                    "interval_coverage": covered / k}}
    if run_pure_ldp:
        out["pure_ldp"] = run_pure_ldp_pem(items, truth, seed, bits, eps, k, start_bits, step)
    return out


def run_pure_ldp_pem(items: np.ndarray, truth: set, seed: int, bits: int, eps: float, k: int, start_bits: int,
                     step: int) -> dict:
    """pure-ldp 1.2.0's PEM on ``items`` (seeded with ``seed`` through ``random`` and ``np.random``): its recall of
    the set ``truth`` among its top-``k`` and its wall times (the peer of every heavy-hitter acceptance run)."""
    import random

    PEMClient, PEMServer, LHServer = _pure_ldp_pem_classes()
    random.seed(seed)
    np.random.seed(seed)
    client = PEMClient(epsilon=eps, start_length=start_bits, max_string_length=bits, fragment_length=step)
    server = PEMServer(epsilon=eps, start_length=start_bits, max_string_length=bits, fragment_length=step,
                       fo_server=_lazy_lh_server_class(LHServer)(eps, 2, use_olh=True))
    fmt = f"0{bits}b"
    t0 = time.perf_counter()
    priv = [client.privatise(format(int(v), fmt)) for v in items]
    t1 = time.perf_counter()
    for p in priv:
        server.aggregate(p)
    hh, _ = server.find_heavy_hitters(k=k)
    t2 = time.perf_counter()
    theirs = {int(h, 2) for h in hh}
    return {"recall": len(theirs & truth) / k, "randomize_s": t1 - t0, "decode_s": t2 - t1}
