"""dBitFlipPM (Ding, Kulkarni & Yekhanin, NeurIPS 2017), as described in Arcolezi et al., EDBT 2023,
§2.4.4 (below "EDBT 2023").

Device side
    * ``bucket(v) = floor(v b / k)``: ``b`` contiguous buckets of close values (EDBT 2023, §2.4.4
      "close values will fall into the same bucket"); bucket ``j`` holds the values
      ``[ceil(j k / b), ceil((j + 1) k / b))``, so bucket widths differ by at most one.
    * Each device draws ``d`` distinct bucket indices ``j_1 < ... < j_d`` uniformly without
      replacement ONCE: they are a deterministic function of the device's secret 256-bit memo
      key (its ChaCha20 stream ``(key, BITFLIP_J, 0)``, :mod:`estimators.randomness`), so they
      are fixed forever and survive restarts with the key.
    * Its report is the ``d`` pairs ``(j_l, x_l)`` with ``P(x_l = 1) = p = e^{ε/2}/(e^{ε/2}+1)``
      if ``bucket(v) = j_l`` else ``q = 1/(e^{ε/2}+1)`` (EDBT 2023, §2.4.4). There is no IRR
      round: the response is memoized and every later report with the same bucket repeats it.

Memoization and longitudinal loss
    The response distribution depends on the bucket only through its *case*: ``l`` if
    ``bucket(v) = j_l`` and "none of the sampled buckets" otherwise, i.e. ``d + 1`` cases
    (``b`` when ``d = b``). The memoized bits are addressed by ``(memo key, case)``, so the
    same bucket always gives the same bits, and all unsampled buckets share one memoized
    response. A device therefore holds at most ``min(d + 1, b)`` independently randomized
    responses, each ε∞-LDP, which is exactly the sequential-composition argument behind EDBT
    2023, Table 1 / Section 4 ("worst-case longitudinal privacy of min(d + 1, b) ε∞ ... cf.
    Definition 3.2 and Proposition 2.3"). (Addressing the bits by the bucket itself would give
    each unsampled bucket its own independent response: up to ``b`` of them, for which
    composition only gives ``min(m, b) ε∞``, and bucket changes between unsampled buckets
    would become detectable.) The ``seen`` bitset of the memo state still records buckets
    (``memo_size = b``); ``longitudinal_loss(m) = min(m, d + 1, b) ε∞``. The bits of case ``c``
    are the stream ``(memo key, BITFLIP_BIT, c)``: a keyed PRF, so the responses of different
    cases are computationally independent and reveal nothing about the key.

ε of one report (computed, not echoed)
    ``J`` is independent of the value, so only the bits matter. With ``d >= 2`` two sampled
    buckets can swap roles in one report: the worst ratio is the UE one (EDBT 2023, §2.3.3,
    ``ln(p(1-q)/((1-p)q))``) which equals the requested ε. With ``d = 1`` a single bit is
    reported and the worst ratio is ``p/q = e^{ε/2}``: 1BitFlipPM is ε/2-LDP per report.
    ``eps_inf`` (= ``eps_first``, one round) reports that true value.

Server side (a pure protocol over buckets)
    Support counts are the ones per bucket, ``C(j) = #{devices that sampled j and reported 1}``.
    A device holding bucket ``j`` samples ``j`` w.p. ``d/b`` and then reports 1 w.p. ``p``; a
    device holding another bucket samples ``j`` w.p. ``d/b`` (``J`` is independent of the
    value) and reports 1 w.p. ``q``. So the protocol is pure with ``ps = (d/b) p`` and
    ``qs = (d/b) q`` relative to ``n``, and :class:`~estimators.base.PureProtocol`'s estimator
    ``(C - n qs) / (n (ps - qs)) = (C - (nd/b) q) / ((nd/b)(p - q))`` is EDBT 2023, Eq. 1 with
    ``n`` replaced by ``nd/b`` (§2.4.4). Estimates have length ``b`` (``domain_size = b``).

Two estimators (``estimator=`` of :meth:`DBitFlipPM.estimate`)
    Write ``π = d/b``, ``S_i = 1`` if device ``i`` sampled bucket ``j``, ``N(j) = Σ_i S_i`` the
    *realized* number of devices that sampled ``j`` (:meth:`DBitFlipPM.sampled`), ``f`` the true
    frequency of ``j`` and ``h = e^{ε/2}``, so ``p = h/(h+1)``, ``q = 1/(h+1)``, ``p q = h/(h+1)^2``
    and ``p - q = (h-1)/(h+1)``. The ``S_i`` are independent Bernoulli(π) across devices (each
    device's J is uniform and independent of its value), which is all the derivations use.

    ``"expected"`` (the default; EDBT 2023, §2.4.4's text: Eq. 1 with ``n`` replaced by the
    *expected* number of samplers ``nπ``): ``f̂ = (C(j) - nπ q) / (nπ (p - q))``. ``C(j)`` is a sum
    of ``n`` independent Bernoulli(``πp``) (holders) or Bernoulli(``πq``) (others) terms, so
        ``Var = [f p (1 - πp) + (1 - f) q (1 - πq)] / (nπ (p - q)^2)``
    (:class:`~estimators.base.PureProtocol`'s γ(1-γ) formula with ``ps = πp``, ``qs = πq``), and
    at ``f = 0``: ``Var* = b (h + 1 - d/b) / (n d (h - 1)^2)``.

    ``"realized"`` (Ding, Kulkarni & Yekhanin, NeurIPS 2017: the estimator of their dBitFlip mechanism,
    ``(b/(nd)) Σ_{i: j ∈ J_i} (x_i (h+1) - 1)/(h-1)``, which is also what Arcolezi et al.'s code,
    multi-freq-ldpy's ``dBitFlipPM_Aggregator``, computes): each *sampled* bit is debiased,
    ``f̂ = Σ_i S_i (x_i - q)/(p - q) / (nπ) = (C(j) - N(j) q) / (nπ (p - q))``. Its terms
    ``Y_i = S_i (x_i - q)/(p - q)`` are independent with ``E Y_i = π [holder]`` and
    ``E Y_i^2 = π (p q/(p - q)^2 + [holder])`` (``E(x - q)^2 = pq`` for a non-holder and
    ``pq + (p - q)^2`` for a holder, since ``p (1 - p) = q (1 - q) = pq``), so
        ``Var = p q / (nπ (p - q)^2) + f (1 - π) / (nπ) = b h / (n d (h - 1)^2) + f (b/d - 1) / n``
    and at ``f = 0``: ``Var* = b h / (n d (h - 1)^2)``. Both are unbiased; the expected-count
    estimator's Var* is larger by the factor ``(h + 1 - d/b) / h`` (1.78 at ε∞ = 0.5, 1.37 at
    ε∞ = 2, 1.08 at ε∞ = 5 for d = 1, b = 360): the realized count removes the binomial noise
    of ``N(j)`` from the ``q`` term. With ``d = b`` (``N(j) = n``) the two coincide.

Variance against the paper (see :meth:`DBitFlipPM.seed_variance`)
    EDBT 2023, §4, quotes ``b / (2 d n sinh(ε/2)) = b h / (n d (h^2 - 1))``, which is smaller than
    the expected-count Var* by the factor ``(h + 1)(h + 1 - d/b) / (h (h - 1))`` (about 2.95 at
    ε = 2, d = 1, b = 90; 14.3, 2.96 and 1.28 at ε = 0.5, 2 and 5 for d = 1, b = 360) and
    smaller than the realized-count Var* by ``(h + 1)/(h - 1)`` (8.04, 2.16 and 1.18 there). The
    test suite measures each estimator's empirical MSE: it matches that estimator's formula, not
    the paper's approximation.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import kernels
from . import postprocess as _pp
from .base import PureProtocol, check_domain, check_eps, uint_dtype
from .errors import InvalidReports, LDPError
from .memo import MemoState


def _check_int(name: str, value: int, lo: int, hi: int | None = None) -> int:
    try:
        ok = not isinstance(value, bool) and int(value) == value
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok or value < lo or (hi is not None and value > hi):
        span = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise LDPError(f"{name} must be an integer {span}, got {value!r}")
    return int(value)


class DBitFlipPM(PureProtocol):
    """dBitFlipPM: ``d`` memoized SUE bits out of ``b`` buckets, one round (EDBT 2023, §2.4.4).

    Reports are ``(n, d)`` arrays of pair codes ``2 j_l + x_l`` (bucket index and bit in one
    unsigned integer: uint8 when ``b <= 128``), the bucket indices strictly increasing within a
    report. The bit lives in the code's low bit, so every code encodes a bit in {0, 1}; a
    report is malformed iff a bucket index is ``>= b`` or the indices are not strictly
    increasing (repeated or out of order).
    """

    name: ClassVar[str] = "dBitFlipPM"
    longitudinal: ClassVar[bool] = True

    #: pair codes ``2 j + x`` must fit uint32
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
        h = np.exp(self.requested_eps_inf / 2)
        self.p = float(h / (h + 1))  # EDBT 2023, §2.4.4
        self.q = float(1 / (h + 1))
        # J sampler: Floyd's algorithm (d draws, O(d^2) work) for small d, else selection
        # sampling (one pass over the b buckets); a pure function of (d, b), so both sides agree.
        self._floyd = self.d * self.d <= 4 * self.b
        self._dtype = uint_dtype(2 * self.b)  # pair codes 2 j + x lie in [0, 2 b)

    # ---------------------------------------------------------------- identity
    def params(self) -> dict:
        return {"protocol": self.name, "k": self.k, "b": self.b, "d": self.d,
                "eps_inf": self.requested_eps_inf}

    # ---------------------------------------------------------------- buckets
    def bucket(self, values: np.ndarray) -> np.ndarray:
        """``floor(v b / k)`` of checked values (int64)."""
        v = self.check_values(values)
        return (v * self.b) // self.k

    def bucket_edges(self) -> np.ndarray:
        """``int64 (b + 1,)``: bucket ``j`` holds the values ``[edges[j], edges[j + 1])``."""
        j = np.arange(self.b + 1, dtype=np.int64)
        return -((-j * self.k) // self.b)  # ceil(j k / b)

    # ---------------------------------------------------------------- privacy
    @property
    def eps_inf(self) -> float:
        """True ε of the memoized response: UE ratio (d >= 2) or ``ln(p/q)`` (d = 1)."""
        if self.d == 1:
            return float(np.log(self.p / self.q))
        return float(np.log(self.p * (1 - self.q) / ((1 - self.p) * self.q)))

    @property
    def eps_first(self) -> float:
        """No IRR round: the first report is the memoized response."""
        return self.eps_inf

    @property
    def memo_size(self) -> int:
        return self.b

    @property
    def memo_cases(self) -> int:
        """Number of distinct memoized responses a device can ever hold: ``min(d + 1, b)``."""
        return min(self.d + 1, self.b)

    def longitudinal_loss(self, memoized: np.ndarray | int) -> np.ndarray | float:
        """``min(m, d + 1, b) ε∞`` after ``m`` distinct memoized buckets (EDBT 2023, Table 1, §4)."""
        m = np.asarray(memoized)
        return np.minimum(np.maximum(m, 0), self.memo_cases) * self.eps_inf

    @property
    def cases_follow_values(self) -> bool:
        """Whether the case pattern of every sequence is its value pattern, for every sampled set:
        only when each bucket holds one value and at most one bucket is unsampled (``b = k``,
        ``d >= b - 1``), so that the case map is injective."""
        return self.b == self.k and self.d >= self.b - 1

    def public_cells(self, reports: np.ndarray, v: int) -> np.ndarray:
        """The case of ``v`` on each device, read from the sampled buckets of its report: the index
        ``l`` of the pair that names ``v``'s bucket, or ``d`` ("not sampled")."""
        j = self._check_reports(reports).astype(np.int64) >> 1  # pair code 2 j + x
        hit = j == int(self.bucket(np.array([v]))[0])
        return np.where(hit.any(axis=1), hit.argmax(axis=1), self.d).astype(np.int64)

    def longitudinal_bound(self, reports: int) -> float:
        """Worst case after ``reports`` reports against a server that reads the sampled buckets in
        the reports: ``ε∞`` for one; for more, ``min(reports, b) ε∞`` when ``b = k`` and ``d >= b - 1`` and
        ``inf`` otherwise. No IRR round: where one sequence's values share a case (bucket unsampled,
        or one bucket) and the other's do not, the report cannot change under the first and can
        under the second (docs/privacy.md; tests/test_seedaware.py). ``longitudinal_loss`` keeps
        the paper's accounted ``min(m, d + 1, b) ε∞`` (EDBT 2023, Table 1)."""
        r = max(int(reports), 0)
        if r <= 1 or self.cases_follow_values:
            return float(self.longitudinal_loss(r))
        return float("inf")

    @property
    def worst_case_loss(self) -> float:
        return self.longitudinal_bound(max(self.memo_size, 2))

    # ---------------------------------------------------------------- device side
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None,
                  state: MemoState | None = None) -> np.ndarray:
        """Memoized reports ``(n, d)`` of pair codes; ``rng`` is unused (no fresh randomness)."""
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._respond(v, st.keys, st.seen)

    def memoized_outputs(self, values: np.ndarray, state: MemoState) -> np.ndarray:
        """The devices' memoized responses for ``values`` without marking anything memoized.

        There is no second round: this is exactly what :meth:`randomize` reports."""
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._respond(v, st.keys, st.seen.copy())

    def _respond(self, v: np.ndarray, keys: np.ndarray, seen: np.ndarray) -> np.ndarray:
        """The one call of the dBitFlipPM kernel: memoized responses, marking buckets in ``seen``."""
        out = np.empty((v.shape[0], self.d), dtype=self._dtype)
        return kernels.bitflip_randomize(v, keys, seen, out, self.k, self.b, self.p, self.q, self._floyd)

    # ---------------------------------------------------------------- server side
    @property
    def domain_size(self) -> int:
        return self.b

    @property
    def ps(self) -> float:
        """``(d/b) p``: the holder's bucket is sampled (d/b) and reported 1 (p)."""
        return self.d / self.b * self.p

    @property
    def qs(self) -> float:
        """``(d/b) q``: another device samples the bucket (d/b) and reports 1 (q)."""
        return self.d / self.b * self.q

    @property
    def effective_n_factor(self) -> float:
        return self.d / self.b

    # ---------------------------------------------------------------- the two estimators
    #: ``"expected"``: divide by the expected number of samplers ``n d / b`` (EDBT 2023, §2.4.4);
    #: ``"realized"``: debias each sampled bit, as Ding, Kulkarni & Yekhanin, NeurIPS 2017 (dBitFlip)
    ESTIMATORS: ClassVar[tuple[str, ...]] = ("expected", "realized")

    def _check_estimator(self, estimator: str) -> str:
        if estimator not in self.ESTIMATORS:
            raise LDPError(f"estimator must be one of {self.ESTIMATORS}, got {estimator!r}")
        return estimator

    def sampled(self, reports: np.ndarray) -> np.ndarray:
        """``N(j)``: the number of reports that sampled bucket ``j``, ``int64 (b,)``; additive over
        disjoint report sets like :meth:`support`; raises :class:`InvalidReports` on malformed
        reports. The realized-count estimator needs it besides the support counts."""
        r = self._check_reports(reports)
        self._count(r)  # validation: buckets < b, strictly increasing
        return np.bincount((r >> 1).ravel().astype(np.intp), minlength=self.b).astype(np.int64)

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None, *,
                 estimator: str = "expected", sampled: np.ndarray | None = None) -> np.ndarray:
        """Unbiased bucket frequencies from the ones per bucket ``counts`` of ``n`` reports.

        ``estimator="expected"`` (default): ``(C - (nd/b) q) / ((nd/b)(p - q))``, EDBT 2023, Eq. 1
        with ``n`` replaced by ``nd/b`` (§2.4.4). ``estimator="realized"``: ``(C - N q) / ((nd/b)
        (p - q))`` with ``N = sampled`` (:meth:`sampled` of the same reports), Ding, Kulkarni &
        Yekhanin, NeurIPS 2017 (dBitFlip). Variances: :meth:`variance_exact` (module docstring).
        """
        if self._check_estimator(estimator) == "expected":
            if sampled is not None:
                raise LDPError("sampled is only used by estimator='realized'")
            return super().estimate(counts, n, postprocess)
        if sampled is None:
            raise LDPError("estimator='realized' needs sampled=proto.sampled(reports) (the number "
                           "of devices that sampled each bucket)")
        c = self.check_counts(counts, n).astype(np.float64)
        m = np.asarray(sampled)
        if m.shape != (self.b,):
            raise LDPError(f"sampled must have shape ({self.b},), got {m.shape}")
        if (m < 0).any() or (m > n).any() or (c > m).any():
            raise LDPError("sampled must satisfy counts <= sampled <= n in every bucket")
        ne = n * self.effective_n_factor
        f = (c - m.astype(np.float64) * self.q) / (ne * (self.p - self.q))
        return _pp.apply(postprocess, f, counts=c, n=n, ps=self.ps, qs=self.qs)

    def variance(self, n: int, estimator: str = "expected") -> float:
        """Var* (true frequency 0): ``b (h + 1 - d/b) / (n d (h-1)^2)`` (expected) or
        ``b h / (n d (h-1)^2)`` (realized), ``h = e^{ε∞/2}`` as requested."""
        return float(self.variance_exact(0.0, n, estimator))

    def variance_exact(self, f: np.ndarray | float, n: int, estimator: str = "expected") -> np.ndarray:
        """Exact variance of a bucket of true frequency ``f`` under the implemented law (module
        docstring): ``[f p (1-πp) + (1-f) q (1-πq)] / (nπ (p-q)^2)`` (expected) or
        ``p q / (nπ (p-q)^2) + f (1-π) / (nπ)`` (realized), ``π = d/b``."""
        if self._check_estimator(estimator) == "expected":
            return super().variance_exact(f, n)
        pi = self.effective_n_factor
        ff = np.asarray(f, dtype=np.float64)
        return self.p * self.q / (n * pi * (self.p - self.q) ** 2) + ff * (1 - pi) / (n * pi)

    def seed_variance(self, n: int) -> float:
        """The approximate variance ``b / (2 d n sinh(ε∞/2))`` of EDBT 2023, §4 (ε∞ as requested).

        An approximation that understates the estimator's variance; :meth:`variance` is exact.
        """
        return float(self.b / (2 * self.d * n * np.sinh(self.requested_eps_inf / 2)))

    def _check_reports(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        if r.dtype != self._dtype or r.ndim != 2 or r.shape[1] != self.d:
            raise InvalidReports(f"{self.name} reports must be {self._dtype} (n, {self.d}), "
                                 f"got {r.dtype} {r.shape}")
        return np.ascontiguousarray(r)

    def _count(self, r: np.ndarray) -> np.ndarray:
        counts, out_of_range, unordered = kernels.bitflip_support(r, self.b)
        if out_of_range:
            raise InvalidReports(f"{out_of_range} report pair(s) name a bucket outside [0, {self.b})")
        if unordered:
            raise InvalidReports(f"{unordered} report pair(s) repeat a bucket index or break the "
                                 "strictly increasing bucket order")
        return counts

    def support(self, reports: np.ndarray) -> np.ndarray:
        """Ones per bucket, ``int64 (b,)``; raises :class:`InvalidReports` on malformed reports."""
        return self._count(self._check_reports(reports))

    @property
    def report_dtype(self) -> np.dtype:
        return self._dtype

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (self.d,)

    def validate_reports(self, reports: np.ndarray) -> None:
        self._count(self._check_reports(reports))

    # ---------------------------------------------------------------- audit hook
    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """The distinguishing event of the privacy audit.

        With ``d >= 2``: both buckets sampled, bucket(v1) reported 1 and bucket(v2) reported 0,
        whose probability ratio is exactly ``p(1-q)/(q(1-p)) = e^{eps_first}`` (the two bits
        swap roles). With ``d = 1``: bucket(v1) sampled and reported 1, ratio ``p/q``. If v1 and
        v2 share a bucket their report distributions are identical and no event separates them;
        then the event is "bucket(v1) sampled and reported 1" (ratio 1).
        """
        b1, b2 = (int(x) for x in self.bucket(np.array([v1, v2], dtype=np.int64)))
        r = np.asarray(reports)
        buckets, bits = r >> 1, (r & 1).astype(bool)
        one1 = ((buckets == b1) & bits).any(axis=1)
        if b1 == b2:
            return one1
        if self.d >= 2:
            zero2 = ((buckets == b2) & ~bits).any(axis=1)
            return one1 & zero2
        return one1 & ~((buckets == b2) & bits).any(axis=1)
