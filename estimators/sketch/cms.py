"""Apple's Count Mean Sketch (CMS) and Hadamard Count Mean Sketch (HCMS): frequency oracles over the open domain of
64-bit value ids (Apple Differential Privacy Team, "Learning with Privacy at Scale", Apple Machine Learning Journal
2017, §3: Algorithms 1-2 (client and server CMS) and 3-4 (client and server HCMS); the survey of Wang, Zhang, Feng
& Yang, "A Comprehensive Survey on Local Differential Privacy toward Data Statistics and Analysis", Sensors 2020,
§3 (frequency oracles over large domains)).

Both keep a sketch of ``k`` rows of ``m`` cells; row ``j`` hashes with the public function ``h_j`` of seed
``row_seeds(seed, k)[j]`` (:mod:`.hashing`, the family defined once). A device picks a row ``j`` uniformly.

**CMS.** The device encodes ``v = -1^m`` with ``v[h_j(id)] = +1`` and flips every entry independently with
probability ``q = T / 2^32``, ``T = ceil(2^32 / (e^{ε/2} + 1))``; the report is ``(j, the m entries as bits)``
(bit 1 = +1). Two ids differ in at most two entries of the same row, so the implemented ε is
``2 log((2^32 - T) / T) <= ε`` (:attr:`CMS.eps_first`). The server (Apple's Alg. 2) adds
``x~ = k (c/2 x + 1/2)`` into row ``j`` with ``c = 1 / (1 - 2q)`` (Apple's ``c_ε = (e^{ε/2}+1)/(e^{ε/2}-1)``,
here of the implemented ``q``, so that ``E[c x_l] = v_l`` exactly) and estimates the count of ``d`` as
``f~(d) = m/(m-1) (1/k Σ_j M[j, h_j(d)] - n/m)``. The additive integer support is, per row, the number of reports
in the row and per cell the number of reports whose bit is 1: ``M[j, l] = k (c ones[j, l] - (c-1)/2 n_j)``.

**HCMS.** ``m`` a power of 2; the device draws a coefficient ``l`` uniformly and sends the bit
``H[h_j(id), l]`` (``H[r, c] = (-1)^popcount(r & c)``) flipped with probability ``q = T / 2^53``,
``T = ceil(2^53 / (e^ε + 1))``, and ``(j, l)``: ε is ``log((2^53 - T) / T) <= ε`` (:attr:`HCMS.eps_first`).
The server (Apple's Alg. 4) adds ``k c w`` to ``M_H[j, l]`` (``c = 1 / (1 - 2q)``), transforms each row back,
``M = M_H H^T`` (fast Walsh-Hadamard), and estimates as CMS. The support is, per ``(j, l)``, the number of
reports and the number of them with bit +1.

**Variances** (derived here for the implemented law, over the draws of the devices and of the public seed, i.e.
of a hash family whose rows and values hash independently and uniformly, the model of Apple's analysis; the
tests measure it). Write ``Z_i`` for report ``i``'s contribution to ``1/k Σ_j M[j, h_j(d)]``, ``a = (1/m)(1 -
1/m)``, ``f`` the frequency of ``d`` and ``S2 = Σ_{u != d} f_u^2``. Given the hashes, ``E[Z_i] = β_i``, the
fraction of rows where ``h_j(v_i) = h_j(d)`` (1 for ``v_i = d``; else mean ``1/m``, variance ``a / k``, equal for
the holders of one value). CMS: ``Var[Z_i | h] = (c^2 - 1)/4 + β_i (1 - β_i)``; HCMS: ``c^2 - β_i^2``. With the
collision term ``Var[Σ β_i] = a/k Σ_u n_u^2``, the variance of the estimated frequency is

* CMS: ``(m/(m-1))^2 [((c^2 - 1)/4 + (1 - f) a (1 - 1/k)) / n + a S2 / k]``;
* HCMS: ``(m/(m-1))^2 [(c^2 - f - (1 - f)(1/m^2 + a/k)) / n + a S2 / k]``.

When every other device holds a distinct value (``S2 = (1 - f)/n``) they reduce to
``[(m/(m-1))^2 (c^2 - 1)/4 + (1 - f)/(m - 1)] / n`` (CMS; ``(c^2-1)/4 = e^{ε/2} / (e^{ε/2} - 1)^2``) and
``(m/(m-1))^2 (c^2 - f - (1 - f)/m^2) / n`` (HCMS), the expressions of :meth:`variance` at ``f = 0``.
(Apple's published variance omits parts of these terms; see Zhang et al., "Count-mean Sketch as an Optimized
Framework for Frequency Estimation with Local Differential Privacy", arXiv:2406.03785, 2024, which corrects it.)
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext
from typing import Any

import numpy as np

from ..base import check_eps
from ..errors import InvalidReports, LDPError
from ..randomness import noise_key, rejection_limit, split_threshold
from .base import OpenDomainProtocol
from .cms_kernels import ROW_BYTES, cms_randomize, cms_support, fwht_rows, hcms_randomize
from .hashing import row_seeds, sketch_hash, value_id

__all__ = ["CMS", "HCMS", "audit_lower_bound", "flip_threshold"]

_MAX_ROWS = 1 << 16
_MASK64 = (1 << 64) - 1


def flip_threshold(eps: float, bits: int) -> int:
    """``T = ceil(2^bits / (e^eps + 1))``, at least 1 (60-digit decimal arithmetic): a flip with probability
    ``T / 2^bits <= 1 / (e^eps + 1)``, so the implemented ratio ``(2^bits - T) / T`` is at most ``e^eps``."""
    with localcontext() as ctx:
        ctx.prec = 60
        return max(1, math.ceil(Decimal(1 << bits) / (Decimal(float(eps)).exp() + 1)))


def _ids(values) -> np.ndarray:
    """Ids ``uint64 (n,)`` from an integer array (non-negative, below 2^64) or a sequence of str/bytes/int."""
    if isinstance(values, np.ndarray) and values.dtype != object:
        v = values
        if v.ndim != 1:
            raise LDPError(f"ids must be a 1-d array, got shape {v.shape}")
        if v.size and not np.issubdtype(v.dtype, np.integer):
            raise LDPError(f"ids must be integers, got dtype {v.dtype}")
        if v.size and v.dtype.kind == "i" and v.min() < 0:
            raise LDPError("ids must be non-negative")
        return np.ascontiguousarray(v, dtype=np.uint64)
    try:
        return np.fromiter((value_id(x) for x in values), dtype=np.uint64)
    except (TypeError, ValueError) as exc:
        raise LDPError(f"invalid id: {exc}") from None


class _CountMeanSketch(OpenDomainProtocol):
    """What CMS and HCMS share: parameters, rows, ids, the debiased estimator from the sketch matrix."""

    flip_bits: int
    flip_eps_share: float  # the flip probability is 1/(e^{share ε} + 1)

    def __init__(self, eps: float, m: int, k: int, seed: int) -> None:
        self.eps = check_eps("eps", eps)
        if int(m) != m or m < 2 or m >= 1 << 31:
            raise LDPError(f"m must be an integer in [2, 2^31), got {m}")
        if int(k) != k or not 1 <= k <= _MAX_ROWS:
            raise LDPError(f"k (rows) must be an integer in [1, {_MAX_ROWS}], got {k}")
        if int(seed) != seed or not 0 <= seed <= _MASK64:
            raise LDPError(f"seed must be an integer in [0, 2^64), got {seed}")
        self.m, self.k, self.seed = int(m), int(k), int(seed)
        self.seeds = row_seeds(self.seed, self.k)
        self.limit = rejection_limit(self.k)
        self.T = flip_threshold(self.flip_eps_share * self.eps, self.flip_bits)
        self.q = self.T / float(1 << self.flip_bits)                 # exact (T < 2^53)
        self.c = float(1 << self.flip_bits) / ((1 << self.flip_bits) - 2 * self.T)  # 1 / (1 - 2q)

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "eps": self.eps, "m": self.m, "k": self.k, "seed": self.seed}

    def _flip_eps(self, times: int = 1) -> float:
        """``times · log((2^bits - T) / T)`` at 60 digits, then rounded once (so never above ``eps``)."""
        with localcontext() as ctx:
            ctx.prec = 60
            return float(times * (Decimal((1 << self.flip_bits) - self.T) / Decimal(self.T)).ln())

    # ---------------------------------------------------------------- device side
    def check_values(self, values) -> np.ndarray:
        return _ids(values)

    def randomize(self, values, rng: np.random.Generator | None = None, state=None) -> np.ndarray:
        if state is not None:
            raise LDPError(f"{self.name} is memoryless; do not pass a memo state")
        return self._randomize(self.check_values(values), noise_key(rng))

    # ---------------------------------------------------------------- server side
    def sketch(self, support: np.ndarray) -> np.ndarray:
        """Apple's sketch matrix ``M`` (float ``(k, m)``) from the integer support."""
        raise NotImplementedError

    def reports_in(self, support: np.ndarray) -> int:
        raise NotImplementedError

    def estimate(self, support: np.ndarray, n: int, ids=None, postprocess: str | None = None) -> np.ndarray:
        """Estimated frequencies (fractions of ``n``) of the candidate ``ids``:
        ``m/(m-1) (1/k Σ_j M[j, h_j(d)] - n/m) / n`` (Apple, Alg. 2's debiasing)."""
        if ids is None:
            raise LDPError(f"{self.name} estimates over an open domain: pass the candidate ids")
        if postprocess is not None:
            raise LDPError(f"{self.name} has no post-processing yet")
        s = np.asarray(support)
        if s.shape != (self.support_size,):
            raise LDPError(f"support must have shape ({self.support_size},), got {s.shape}")
        if int(n) != n or n <= 0:
            raise LDPError(f"n must be a positive integer, got {n}")
        if self.reports_in(s) != n:
            raise LDPError(f"the support counts {self.reports_in(s)} reports, not n = {n}")
        d = _ids(ids)
        M = self.sketch(s)
        h = sketch_hash(d, self.seeds, self.m)                      # (len(d), k)
        mean = M[np.arange(self.k)[None, :], h].sum(axis=1) / self.k
        m = self.m
        return (m / (m - 1)) * (mean - n / m) / n

    def variance(self, n: int) -> float:
        """Variance of the estimated frequency of an id nobody holds, every device holding a distinct value
        (module doc)."""
        return float(self.variance_exact(0.0, n))

    def variance_exact(self, f, n: int, sumsq=None) -> np.ndarray:
        """Variance of the estimated frequency of an id of frequency ``f`` (module doc), ``sumsq`` the sum of the
        squared frequencies of the other values (default: all distinct, ``(1 - f) / n``)."""
        f = np.asarray(f, dtype=np.float64)
        m, k = self.m, self.k
        a = (1.0 / m) * (1.0 - 1.0 / m)
        s2 = (1.0 - f) / n if sumsq is None else np.asarray(sumsq, dtype=np.float64)
        return (m / (m - 1)) ** 2 * (self._per_report(f, a) / n + a * s2 / k)

    def _per_report(self, f, a):
        raise NotImplementedError


class CMS(_CountMeanSketch):
    """Apple's Count Mean Sketch (module doc). Reports: ``uint8 (2 + ceil(m/8),)``, the row (little-endian
    uint16) then the ``m`` bits, little-endian packed; support ``int64 (k (m + 1),)``: row ``j``'s cells
    ``[j (m+1), j (m+1) + m)`` count reports of row ``j`` with bit 1, entry ``j (m+1) + m`` the reports of row j."""

    name = "CMS"
    flip_bits = 32
    flip_eps_share = 0.5

    def __init__(self, eps: float, m: int, k: int, seed: int) -> None:
        super().__init__(eps, m, k, seed)
        self.t_hi, self.t_rest = split_threshold(self.T)

    @property
    def eps_first(self) -> float:
        """``2 log((2^32 - T) / T) <= eps``: two entries of one row differ between any two ids."""
        return self._flip_eps(2)

    def _randomize(self, ids, nkey):
        return cms_randomize(ids, self.seeds, self.m, nkey, self.limit, self.t_hi, self.t_rest)

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (ROW_BYTES + (self.m + 7) // 8,)

    @property
    def support_size(self) -> int:
        return self.k * (self.m + 1)

    def _rows(self, r: np.ndarray) -> np.ndarray:
        return r[:, 0].astype(np.int64) | (r[:, 1].astype(np.int64) << 8)

    def validate_reports(self, reports: np.ndarray) -> None:
        r = np.asarray(reports)
        if r.dtype != np.uint8 or r.ndim != 2 or r.shape[1:] != self.report_shape:
            raise InvalidReports(f"CMS reports must be uint8 (n, {self.report_shape[0]}), got {r.dtype} {r.shape}")
        if r.shape[0] == 0:
            return
        if self._rows(r).max() >= self.k:
            raise InvalidReports(f"a CMS report names a row outside [0, {self.k})")
        if self.m & 7 and np.any(r[:, -1] >> (self.m & 7)):
            raise InvalidReports("a CMS report sets bits beyond m")

    def support(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        self.validate_reports(r)
        return cms_support(r, self.k, self.m).reshape(-1)

    def reports_in(self, support):
        return int(np.asarray(support).reshape(self.k, self.m + 1)[:, self.m].sum())

    def sketch(self, support):
        s = np.asarray(support, dtype=np.int64).reshape(self.k, self.m + 1)
        if s.min() < 0 or np.any(s[:, :self.m] > s[:, self.m:]):
            raise LDPError("CMS support: a cell counts more reports than its row")
        c = self.c
        return self.k * (c * s[:, :self.m] - (c - 1.0) / 2.0 * s[:, self.m:])

    def _per_report(self, f, a):
        return (self.c ** 2 - 1.0) / 4.0 + (1.0 - f) * a * (1.0 - 1.0 / self.k)

    # ---------------------------------------------------------------- audit hook
    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """Reports whose row's cell of ``v1`` is 1 and of ``v2`` is 0 (ids ``v1``, ``v2``; rows where they collide
        never count)."""
        r = np.asarray(reports)
        rows = self._rows(r)
        h = sketch_hash(np.array([v1, v2], dtype=np.uint64), self.seeds, self.m)
        h1, h2 = h[0][rows], h[1][rows]
        data = r[:, ROW_BYTES:]
        n = np.arange(r.shape[0])
        b1 = (data[n, h1 >> 3] >> (h1 & 7)) & 1
        b2 = (data[n, h2 >> 3] >> (h2 & 7)) & 1
        return (b1 == 1) & (b2 == 0) & (h1 != h2)


class HCMS(_CountMeanSketch):
    """Apple's Hadamard Count Mean Sketch (module doc). Reports: ``uint64``, ``((j m + l) << 1) | bit``;
    support ``int64 (2 k m,)``: the reports of each ``(j, l)`` (index ``j m + l``), then those with bit +1."""

    name = "HCMS"
    flip_bits = 53
    flip_eps_share = 1.0

    def __init__(self, eps: float, m: int, k: int, seed: int) -> None:
        if int(m) != m or m < 2 or int(m) & (int(m) - 1):
            raise LDPError(f"HCMS needs m a power of 2, got {m}")
        super().__init__(eps, m, k, seed)

    @property
    def eps_first(self) -> float:
        """``log((2^53 - T) / T) <= eps``: one bit, flipped with probability ``T / 2^53``."""
        return self._flip_eps()

    def _randomize(self, ids, nkey):
        return hcms_randomize(ids, self.seeds, self.m, nkey, self.limit, np.uint64(self.T))

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint64)

    @property
    def support_size(self) -> int:
        return 2 * self.k * self.m

    def validate_reports(self, reports: np.ndarray) -> None:
        r = np.asarray(reports)
        if r.dtype != np.uint64 or r.ndim != 1:
            raise InvalidReports(f"HCMS reports must be uint64 (n,), got {r.dtype} {r.shape}")
        if r.size and r.max() >= np.uint64(2 * self.k * self.m):
            raise InvalidReports(f"an HCMS report is outside [0, {2 * self.k * self.m})")

    def support(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        self.validate_reports(r)
        km = self.k * self.m
        cell = (r >> np.uint64(1)).astype(np.int64)
        plus = (r & np.uint64(1)).astype(bool)
        return np.concatenate([np.bincount(cell, minlength=km), np.bincount(cell[plus], minlength=km)]).astype(np.int64)

    def reports_in(self, support):
        return int(np.asarray(support)[:self.k * self.m].sum())

    def sketch(self, support):
        s = np.asarray(support, dtype=np.int64).reshape(2, self.k, self.m)
        if s.min() < 0 or np.any(s[1] > s[0]):
            raise LDPError("HCMS support: more +1 bits than reports in a cell")
        d = np.ascontiguousarray(2 * s[1] - s[0])                   # Σ of the ±1 bits per (j, l)
        return (self.k * self.c) * fwht_rows(d).astype(np.float64)

    def _per_report(self, f, a):
        return self.c ** 2 - f - (1.0 - f) * (1.0 / self.m ** 2 + a / self.k)

    # ---------------------------------------------------------------- audit hook
    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """Reports whose bit is ``v1``'s Hadamard entry where ``v1``'s and ``v2``'s entries differ."""
        r = np.asarray(reports, dtype=np.uint64)
        cell = (r >> np.uint64(1)).astype(np.int64)
        rows, l = cell // self.m, cell % self.m
        h = sketch_hash(np.array([v1, v2], dtype=np.uint64), self.seeds, self.m)
        e1 = 1 - (np.bitwise_count(h[0][rows] & l).astype(np.int64) & 1)
        e2 = 1 - (np.bitwise_count(h[1][rows] & l).astype(np.int64) & 1)
        return (e1 != e2) & ((r & np.uint64(1)).astype(np.int64) == e1)


def audit_lower_bound(proto: _CountMeanSketch, v1: int, v2: int, n: int, rng: np.random.Generator | None = None,
                      confidence: float = 0.95) -> float:
    """A Clopper-Pearson lower bound on the ε of ``proto`` (:func:`estimators.audit.eps_lower_bound`) from ``n``
    reports of the id ``v1`` and ``n`` of ``v2`` and the protocol's distinguishing event (:meth:`audit_event`),
    whose probability ratio is exactly ``e^{eps_first}``: ``ldp audit``'s test for one setting."""
    from ..audit import eps_lower_bound  # the audit helpers load scipy on first use

    c1 = int(proto.audit_event(proto.randomize(np.full(n, v1, dtype=np.uint64), rng), v1, v2).sum())
    c2 = int(proto.audit_event(proto.randomize(np.full(n, v2, dtype=np.uint64), rng), v1, v2).sum())
    return eps_lower_bound(c1, c2, n, confidence)
