"""RAPPOR with Bloom filters over an open domain (Erlingsson, Pihur & Korolova, "RAPPOR: Randomized Aggregatable
Privacy-Preserving Ordinal Response", CCS 2014, §2 the client, §4 the decoding), on 64-bit value ids
(:mod:`.hashing`). A first increment: not wired into the pipeline.

The client (§2, as the deployed client does it):

1. *Cohort.* A device belongs to one of ``cohorts`` cohorts for life, derived from its memo key: the first word of the
   ChaCha20 stream ``(key, COHORT, 0)`` (:mod:`.rappor_kernels`) reduced onto ``[0, cohorts)`` by rejection, so it is
   uniform, secret-keyed, and reproduced by a restored key.
2. *Bloom filter.* Cohort ``c``'s ``h`` hash functions are the public family of :mod:`.hashing` with the seeds
   ``row_seeds(seed, cohorts * h + 1)[c*h : c*h + h]`` (rows ``c*h .. c*h+h-1``; the last row, ``cohorts * h``, hashes
   an id onto a memo-accounting slot, below). The value's ``m``-bit filter ``B`` sets bits ``h_{c,0}(v) ..
   h_{c,h-1}(v)``.
3. *PRR* (memoized): ``B'_i = 1`` w.p. ``f/2``, ``0`` w.p. ``f/2``, ``B_i`` w.p. ``1 - f``, i.e. ``P(B'_i = 1) = 1 - f/2``
   if ``B_i`` else ``f/2``, drawn from the stream ``(key, PRR, v)``: a keyed PRF of the device's memo key and the value
   id, so the same device reporting the same value gets the same ``B'`` forever (the memoization of the two-round
   framework, :mod:`estimators.longitudinal`; :class:`~estimators.memo.MemoState` holds the key).
4. *IRR* (per report): ``S_i = 1`` w.p. ``q`` if ``B'_i`` else ``p``, from the batch's fresh noise stream.

A report is ``uint8 (2 + ceil(m/8),)``: the cohort as a little-endian ``uint16``, then ``S`` packed little-endian.

Every probability lives on the 2^-32 grid (:func:`estimators.randomness.threshold32`; ``f/2`` is rounded and the
PRR's ``1 - f/2`` is its exact complement), and ``f``, ``p``, ``q`` below are the quantized values, so the ε and
the decoding describe exactly what is sampled. With ``p* = P(S_i = 1 | B_i = 0) = (f/2) q + (1 - f/2) p`` and
``q* = P(S_i = 1 | B_i = 1) = (1 - f/2) q + (f/2) p`` (§3):

* ε∞ = 2h ln((1 - f/2) / (f/2)) (§3, Thm. 1): two values whose filters share no bit differ in ``2h`` bits, each
  costing ln((1-f/2)/(f/2)); it is ``h`` times the UE ε of the PRR round (:func:`~estimators.longitudinal.ue_eps`).
* ε1 = h ln(q*(1 - p*) / (p*(1 - q*))) (§3): ``h`` times the UE-chain ε1 of the two rounds
  (:func:`~estimators.longitudinal.ue_chain_eps_first`).

Both are exact worst cases over an open domain when ``m >= 2h`` (required: then some pair of values has disjoint
``h``-bit filters).

*Longitudinal accounting.* A device leaks ε∞ per distinct value it memoizes (Arcolezi et al., EDBT 2023, Eq. 8).
The domain is open, so the memo state cannot hold one bit per value: its ``memo_slots`` bits (a multiple of 64) are a
table of ``memo_slots / 64`` little-endian 64-bit tags, TreeHist's (:mod:`.treehist`): the tag of value id ``v`` is
word 0 of the keyed stream ``(key, TAG, v)`` (:data:`.rappor_kernels.TAG`, a domain of its own) with its low bit set,
inserted by linear probing (:func:`.treehist_kernels.mark_tags`); a tag found is a repeat (no new loss), a new value
takes an empty slot. :meth:`RAPPOR.memoized_counts` (the nonzero tags) is the number of distinct values memoized,
exact up to a tag collision (probability ``2^-63`` a pair); a full table meeting a new value writes the all-ones
sentinel in slot 0 and the count is ``inf`` from then on. (The former accounting marked one bit per slot
``h_{seed_{cohorts*h}}(v) mod memo_slots`` and under-counted two values sharing a slot; the row ``cohorts*h`` of the
seeds is kept, unused, so the cohorts' rows stay the same.) RAPPOR is not wired into the pipeline or the device
SDKs.

The decoding (§4), against a list of candidate ids:

* per cohort ``j`` and bit ``i``, ``t̂_ij = (c_ij - (p + f q/2 - f p/2) N_j) / ((1 - f)(q - p))``, ``c_ij`` the
  reports of cohort ``j`` with bit ``i`` set, ``N_j`` its reports: the estimated number of its devices whose
  filter sets bit ``i``;
* least squares of ``t̂`` (all ``cohorts * m`` entries) on the design matrix ``X`` (``X[(j,i), k] = 1`` iff candidate
  ``k``'s filter in cohort ``j`` sets bit ``i``): ``β̂ = (XᵀX)⁻¹ Xᵀ t̂``, a candidate's count per cohort, so its
  estimated count is ``cohorts · β̂``;
* standard errors from the least-squares covariance ``σ̂² (XᵀX)⁻¹``, ``σ̂² = RSS / (cohorts m - K)``, and the
  significance test: a candidate is reported when its coefficient is significantly positive (one-sided ``t`` test
  with ``cohorts m - K`` degrees of freedom) at the Bonferroni level ``0.05 / K`` (§4).

The paper first selects candidates with the Lasso when the list is long; here the list goes to least squares
directly (it must have full column rank, ``K <= cohorts m``).

:meth:`RAPPOR.variance` is the exact variance of ``cohorts · β̂_k`` when each device sends one report, its cohort
uniform and independent of the others' (keys drawn independently), and every device's value is on the candidate
list: then ``cohorts · β̂_k = Σ_d Z_d`` with independent per-device terms, and the estimate is unbiased.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidReports, LDPError
from ..longitudinal import Rounds, ue_chain_eps_first, ue_eps
from ..memo import MemoState
from ..randomness import noise_key, rejection_limit, threshold32
from . import rappor_kernels as rk
from . import treehist_kernels as tk
from .base import TagMemo
from .hashing import row_seeds, sketch_hash

__all__ = ["RAPPOR", "RapporEstimate"]

_SCALE = float(1 << 32)
MAX_COHORTS = 1 << 16


@dataclass(frozen=True)
class RapporEstimate:
    """The decoding of a candidate list (§4): per candidate its estimated count, the standard error from the
    least-squares covariance, the one-sided ``t`` statistic and p-value, and whether it passes the Bonferroni test
    at ``level`` (``alpha / K``)."""

    ids: np.ndarray
    counts: np.ndarray
    std_errors: np.ndarray
    t_stats: np.ndarray
    p_values: np.ndarray
    selected: np.ndarray
    level: float
    dof: int


class RAPPOR(TagMemo):
    """RAPPOR with Bloom filters: ``m`` bits, ``h`` hash functions, ``cohorts`` cohorts, PRR ``f``, IRR ``(p, q)``,
    public hash seed ``seed``; ``memo_slots`` bits of memo accounting per device."""

    name = "RAPPOR"

    def __init__(self, m: int, h: int, cohorts: int, f: float, p: float, q: float, seed: int = 0,
                 memo_slots: int = 4096) -> None:
        if not (isinstance(m, (int, np.integer)) and isinstance(h, (int, np.integer)) and h >= 1 and m >= 2 * h):
            raise LDPError(f"RAPPOR needs integers h >= 1 and m >= 2h, got m={m!r}, h={h!r}")
        if not (1 <= cohorts <= MAX_COHORTS):
            raise LDPError(f"cohorts must lie in [1, {MAX_COHORTS}], got {cohorts!r}")
        if not (0.0 < f < 1.0 and 0.0 <= p < q <= 1.0):
            raise LDPError(f"RAPPOR needs 0 < f < 1 and 0 <= p < q <= 1, got f={f!r}, p={p!r}, q={q!r}")
        self.memo_slots = self.check_memo_slots(memo_slots)
        self.m, self.h, self.cohorts, self.seed = int(m), int(h), int(cohorts), int(seed)
        self.requested = (float(f), float(p), float(q))
        self.t1q = threshold32(f / 2)                      # P(B' = 1 | B = 0) = f/2
        self.t1p = np.uint64((1 << 32) - int(self.t1q))    # P(B' = 1 | B = 1) = 1 - f/2, its exact complement
        self.t2p, self.t2q = threshold32(q), threshold32(p)  # P(S = 1 | B' = 1) = q, P(S = 1 | B' = 0) = p
        if not (0 < int(self.t1q) < 1 << 31 and int(self.t2q) < int(self.t2p)):
            raise LDPError("f, p, q collapse on the 2^-32 grid")
        self.f = 2 * int(self.t1q) / _SCALE
        self.p, self.q = int(self.t2q) / _SCALE, int(self.t2p) / _SCALE
        seeds = row_seeds(self.seed, self.cohorts * self.h + 1)
        self.seeds = seeds[:-1]          # cohort c's hash functions: rows c*h .. c*h+h-1
        self.memo_seed = seeds[-1:]      # row cohorts*h: unused since the tag tables (module doc)
        self.rounds = Rounds(1 - self.f / 2, self.f / 2, self.q, self.p)
        blob = json.dumps(self.params(), sort_keys=True, separators=(",", ":")).encode()
        self.fingerprint = hashlib.sha256(blob).hexdigest()[:16]

    def params(self) -> dict:
        f, p, q = self.requested
        return {"protocol": self.name, "m": self.m, "h": self.h, "cohorts": self.cohorts, "f": f, "p": p, "q": q,
                "seed": self.seed, "memo_slots": self.memo_slots}

    # ---------------------------------------------------------------- privacy
    @property
    def p_star(self) -> float:
        """``P(S_i = 1 | B_i = 0) = (f/2) q + (1 - f/2) p``."""
        return self.rounds.qs

    @property
    def q_star(self) -> float:
        """``P(S_i = 1 | B_i = 1) = (1 - f/2) q + (f/2) p``."""
        return self.rounds.ps

    @property
    def eps_inf(self) -> float:
        """ε of the memoized PRR: 2h ln((1 - f/2)/(f/2)) (§3, Thm. 1)."""
        return self.h * ue_eps(self.rounds.p1, self.rounds.q1)

    @property
    def eps_first(self) -> float:
        """ε of one report through both rounds: h ln(q*(1 - p*) / (p*(1 - q*))) (§3)."""
        return self.h * ue_chain_eps_first(self.rounds)

    # ---------------------------------------------------------------- client
    def device_cohorts(self, state: MemoState) -> np.ndarray:
        """Each device's cohort, ``int64 (n_devices,)``, from its memo key."""
        return rk.rappor_cohorts(np.ascontiguousarray(state.keys), self.cohorts, rejection_limit(self.cohorts))

    def bloom_bits(self, ids: np.ndarray, cohort: np.ndarray) -> np.ndarray:
        """The Bloom bits of ``ids[i]`` in cohort ``cohort[i]``, ``int64 (n, h)``."""
        ids = np.ascontiguousarray(ids, dtype=np.uint64)
        out = np.empty((ids.shape[0], self.h), dtype=np.int64)
        for c in np.unique(cohort):
            rows = np.flatnonzero(cohort == c)
            out[rows] = sketch_hash(ids[rows], self.seeds[c * self.h:(c + 1) * self.h], self.m)
        return out

    def _check_ids(self, ids) -> np.ndarray:
        v = np.asarray(ids)
        if v.ndim != 1 or not (v.dtype == np.uint64 or (v.dtype.kind in "iu" and (v.size == 0 or v.min() >= 0))):
            raise LDPError(f"RAPPOR takes value ids uint64 (n,), got {v.dtype} {v.shape}")
        return np.ascontiguousarray(v, dtype=np.uint64)

    def _state(self, state: MemoState | None, n: int) -> MemoState:
        if state is None:
            raise LDPError("RAPPOR memoizes: pass state=proto.new_state(n_devices)")
        state.check(self.fingerprint, n)
        return state

    def _reports(self, ids, state, nkey, irr: bool, mark: bool) -> np.ndarray:
        cohort = self.device_cohorts(state)
        pos = self.bloom_bits(ids, cohort)
        keys = np.ascontiguousarray(state.keys)
        bits = rk.rappor_randomize(ids, pos, keys, np.zeros((0, 0), dtype=np.uint8), np.zeros(0, dtype=np.int64),
                                   nkey, self.t1p, self.t1q, self.t2p, self.t2q, self.m, irr)
        if mark and ids.shape[0]:
            tk.mark_tags(keys, rk.TAG, ids, state.seen)  # in place: the accounting (module doc)
        head = cohort.astype("<u2").view(np.uint8).reshape(-1, 2)
        return np.concatenate([head, bits], axis=1)

    def randomize(self, ids, rng: np.random.Generator | None = None, state: MemoState | None = None) -> np.ndarray:
        """Reports of devices ``0 .. n-1`` holding ``ids`` (``uint64 (n,)``), ``uint8 (n, 2 + ceil(m/8))``: PRR
        memoized per (device key, id), IRR fresh from ``rng`` (``None``: the OS CSPRNG; a Generator: simulation)."""
        v = self._check_ids(ids)
        st = self._state(state, v.shape[0])
        return self._reports(v, st, noise_key(rng), True, True)

    def memoized_outputs(self, ids, state: MemoState) -> np.ndarray:
        """The devices' PRR filters ``B'`` (same layout as reports), without the IRR and without marking anything."""
        v = self._check_ids(ids)
        st = self._state(state, v.shape[0])
        return self._reports(v, st, np.zeros(8, dtype=np.uint32), False, False)

    # ---------------------------------------------------------------- server
    @property
    def report_shape(self) -> tuple[int]:
        return (2 + (self.m + 7) // 8,)

    def split_reports(self, reports: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(cohort int64 (n,), bits uint8 (n, ceil(m/8)))`` of valid reports; raises :class:`InvalidReports`."""
        r = np.asarray(reports)
        if r.dtype != np.uint8 or r.ndim != 2 or r.shape[1] != self.report_shape[0]:
            raise InvalidReports(f"RAPPOR reports must be uint8 (n, {self.report_shape[0]}), got {r.dtype} {r.shape}")
        cohort = np.ascontiguousarray(r[:, :2]).view("<u2")[:, 0].astype(np.int64)
        if cohort.size and cohort.max() >= self.cohorts:
            raise InvalidReports(f"a report names cohort {int(cohort.max())} of {self.cohorts}")
        bits = np.ascontiguousarray(r[:, 2:])
        pad = (-self.m) % 8
        if pad and bits.size and (bits[:, -1] >> np.uint8(8 - pad)).any():
            raise InvalidReports(f"a report sets bits beyond m = {self.m}")
        return cohort, bits

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``int64 (cohorts * (m + 1),)``: per cohort ``j`` its report count ``N_j`` then ``c_j0 .. c_j(m-1)``."""
        cohort, bits = self.split_reports(reports)
        return rk.rappor_support(cohort, bits, self.cohorts, self.m)

    def design(self, candidate_ids) -> np.ndarray:
        """The design matrix ``float64 (cohorts * m, K)``: row ``j m + i``, column ``k`` is 1 iff candidate ``k``'s
        filter in cohort ``j`` sets bit ``i``."""
        c = self._check_ids(candidate_ids)
        X = np.zeros((self.cohorts, self.m, c.shape[0]))
        cols = np.arange(c.shape[0])
        for j in range(self.cohorts):
            pos = sketch_hash(c, self.seeds[j * self.h:(j + 1) * self.h], self.m)
            for r in range(self.h):
                X[j, pos[:, r], cols] = 1.0
        return X.reshape(self.cohorts * self.m, c.shape[0])

    def debiased(self, support: np.ndarray) -> np.ndarray:
        """``t̂_ij = (c_ij - (p + f q/2 - f p/2) N_j) / ((1 - f)(q - p))`` (§4), ``float64 (cohorts, m)``."""
        s = np.asarray(support, dtype=np.int64)
        if s.shape != (self.cohorts * (self.m + 1),):
            raise LDPError(f"support must be int64 ({self.cohorts * (self.m + 1)},), got {s.shape}")
        s = s.reshape(self.cohorts, self.m + 1)
        f, p, q = self.f, self.p, self.q
        return (s[:, 1:] - (p + f * q / 2 - f * p / 2) * s[:, :1]) / ((1 - f) * (q - p))

    def _solver(self, X: np.ndarray) -> np.ndarray:
        """``(XᵀX)⁻¹``; raises unless ``X`` has full column rank."""
        if X.shape[1] == 0 or X.shape[1] >= X.shape[0] or np.linalg.matrix_rank(X) < X.shape[1]:
            raise LDPError(f"the candidates' design matrix ({X.shape[0]} x {X.shape[1]}) is not of full column rank "
                           "with residual degrees of freedom: fewer candidates, or more cohorts or bits")
        return np.linalg.inv(X.T @ X)

    def estimate(self, support: np.ndarray, candidate_ids, alpha: float = 0.05) -> RapporEstimate:
        """The decoding of §4 against ``candidate_ids``: least squares, standard errors, Bonferroni test."""
        from scipy.stats import t as student_t  # scipy.stats costs a worker's start; only the decoding needs it

        ids = self._check_ids(candidate_ids)
        y = self.debiased(support).reshape(-1)
        X = self.design(ids)
        G = self._solver(X)
        beta = G @ (X.T @ y)
        dof = X.shape[0] - X.shape[1]
        sigma2 = float(np.sum((y - X @ beta) ** 2)) / dof
        se_beta = np.sqrt(np.maximum(sigma2 * np.diag(G), 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            tstat = np.where(se_beta > 0, beta / se_beta, np.sign(beta) * np.inf)
        pval = student_t.sf(tstat, dof)
        level = alpha / ids.shape[0]
        return RapporEstimate(ids, self.cohorts * beta, self.cohorts * se_beta, tstat, pval, pval < level, level, dof)

    def variance(self, candidate_ids, counts) -> np.ndarray:
        """Exact variance of each candidate's estimated count when ``counts[v]`` devices hold candidate ``v`` (and no
        device holds another value), each sending one report from a uniform, independent cohort.

        ``cohorts · β̂_k = Σ_d Z_d``, ``Z_d = K Σ_i a_k(J_d, i) (S_di - p*)`` with ``a_k`` row ``k`` of ``(XᵀX)⁻¹Xᵀ``
        and ``K = cohorts / ((1 - f)(q - p))``; for a device holding ``v``, given its cohort ``j`` the bits are
        independent with ``P_ji(v) = q*`` on ``v``'s filter else ``p*``, so
        ``Var Z_d = (1/C) Σ_j K² Σ_i a_k(j,i)² P(1 - P) + C² Var_j(u_vj)``, ``u_vj = Σ_i a_k(j,i) X_v(j,i)``."""
        ids = self._check_ids(candidate_ids)
        n_v = np.asarray(counts, dtype=np.float64)
        X = self.design(ids)
        A = self._solver(X) @ X.T                                   # (K, C m)
        C, m = self.cohorts, self.m
        scale = C / ((1 - self.f) * (self.q - self.p))
        ps, qs = self.p_star, self.q_star
        vp, vq = ps * (1 - ps), qs * (1 - qs)
        A2 = A ** 2
        term1 = scale ** 2 / C * (vp * A2.sum(axis=1) * n_v.sum() + (vq - vp) * (A2 @ X) @ n_v)
        u = np.einsum("kji,jiv->kjv", A.reshape(-1, C, m), X.reshape(C, m, -1))   # (K, C, V)
        term2 = C ** 2 * ((u ** 2).mean(axis=1) - u.mean(axis=1) ** 2) @ n_v
        return term1 + term2
