"""Hadamard-response frequency oracles: HR and FHR.

Both encode value ``v`` (0-based) by row/column ``v + 1`` of the Sylvester Hadamard matrix of
order ``K`` = the smallest power of two ``> k`` (row 0, all ones, is never used), whose
entries ``H[r, c] = (-1)^popcount(r & c)`` (the Sylvester recursion of Zhao et al., arXiv 2022,
§5.1, Eq. 6) are computed on the fly.

* **HR** (Hadamard randomized response, HRR of Cormode, Kulkarni & Srivastava, SIGMOD 2018, as
  summarized in Wang et al., Sensors 2020, §3.1.4, Eqs. 46-47): a device samples a row
  ``j`` uniformly in ``[0, K)``, takes the entry ``H[j, v+1]`` and keeps it w.p.
  ``p = e^ε / (e^ε + 1)`` (binary RR), else flips it. The report is ``(j, bit)``. The support
  of ``v`` counts the reports whose bit matches ``H[j, v+1]``: ``ps = p``; for another value
  ``u``, the columns ``u+1`` and ``v+1`` agree on exactly half of the ``K`` rows, so
  ``qs = p/2 + (1-p)/2 = 1/2`` exactly. HR is therefore pure and gets the estimator
  ``(C - n/2) / (n (p - 1/2))`` -- algebraically the survey's "estimate the Hadamard
  coefficients (Eq. 46), then invert the transform" -- and its variances from ``(ps, qs)``.
  Server cost O(n + K log K): a per-row histogram and one fast Walsh-Hadamard transform.
* **FHR** (Flexible Hadamard Response, Zhao et al., arXiv 2022, Alg. 1): a device picks one
  ``+1`` position ``x`` and one ``-1`` position ``y`` of its row ``H(t)`` uniformly, and sends
  the sparse vector ``b = ±(e_x - e_y)`` (``+`` w.p. ``p``). The estimator is Eq. 7,
  ``f_t = (e^ε+1) / (2 (e^ε-1)) * (z . H(t)) / n`` with ``z = sum_i b_i``, and its exact
  variance follows from the per-report distributions 𝒳 (Eq. 8) and 𝒴 (Eq. 9) as in Eq. 10.
  FHR is *not* pure in the sense of :class:`PureProtocol` (a report contributes -1, 0 or +1 to
  a value's count), so it implements the estimator and the variances itself.

FHR's privacy notion is (ε, η)-FLDP (Zhao et al., arXiv 2022, Def. 2), **not** ε-LDP: the ratio
of output probabilities is bounded by ``e^ε`` only on the *intersection* of two inputs' output
ranges (Eq. 4, Theorem 2), and the ranges of two inputs overlap on only half of their outputs
(η = 1/2, Eq. 3). An output outside the intersection has probability 0 under the other input,
so the standard LDP ε of FHR is infinite, whatever ε: :attr:`FHR.eps_first` (the project's
single-report ε, used by the privacy audit and the dashboards) is ``inf``;
:attr:`FHR.eps_fldp` and :attr:`FHR.eta` give the paper's FLDP guarantee.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import kernels
from . import postprocess as _pp
from .base import PureProtocol, SingleShot, uint_dtype
from .errors import InvalidReports, LDPError
from .memo import MemoState
from .randomness import noise_key

MAX_K = 1 << 24  # the server keeps a K-long int64 table per thread (K <= 2**25: 256 MiB)


def hadamard_order(k: int) -> int:
    """``K`` = the smallest power of two ``> k``: rows/columns ``1..k`` encode the values."""
    return 1 << int(k).bit_length()


def hadamard_entry(r: np.ndarray | int, c: np.ndarray | int) -> np.ndarray:
    """``H[r, c] = (-1)^popcount(r & c)`` as int64 ±1 (Zhao et al., arXiv 2022, §5.1), broadcasting."""
    x = np.bitwise_and(np.asarray(r, dtype=np.int64), np.asarray(c, dtype=np.int64))
    return 1 - 2 * (np.bitwise_count(x).astype(np.int64) & 1)


def _keep_probability(eps: float) -> float:
    """Binary RR: ``p = e^ε / (e^ε + 1)`` (Wang et al., Sensors 2020, §3.1.4; Zhao et al., arXiv 2022,
    Alg. 1 line 6)."""
    return float(1.0 / (1.0 + np.exp(-eps)))


def _check_integer_reports(name: str, r: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    r = np.asarray(r)
    if r.ndim != 1 + len(shape) or r.shape[1:] != shape:
        raise InvalidReports(f"{name} reports must have shape (n, *{shape}), got {r.shape}")
    if r.size and not np.issubdtype(r.dtype, np.integer):
        raise InvalidReports(f"{name} reports must be integers, got dtype {r.dtype}")
    return r


class _Hadamard(SingleShot):
    """Shared parameters of HR and FHR."""

    def __init__(self, k: int, eps: float) -> None:
        SingleShot.__init__(self, k, eps)
        if self.k > MAX_K:
            raise LDPError(f"{self.name} supports k <= {MAX_K}, got {self.k}")
        self.K = hadamard_order(self.k)
        self.p = _keep_probability(self.eps)


class HR(_Hadamard, PureProtocol):
    """Hadamard randomized response: report ``(j, bit)`` packed as ``2 j + bit`` (bit 1 = +1).

    The packed report is one unsigned integer of the smallest width holding ``[0, 2K)``
    (``uint8`` up to ``k = 127``, ``uint16`` up to ``k = 32767``, else ``uint32``).
    """

    name: ClassVar[str] = "HR"

    @property
    def ps(self) -> float:
        """A report supports the holder's value iff its bit was kept: ``p``."""
        return self.p

    @property
    def qs(self) -> float:
        """Columns ``u+1 != v+1`` agree on exactly ``K/2`` of the ``K`` rows: ``qs = 1/2``."""
        return 0.5

    @property
    def eps_first(self) -> float:
        """``P((j, b) | v)`` is ``p / K`` if ``b = H[j, v+1]`` else ``(1-p) / K``: ε = ln(p / (1-p)).

        Var* of HR is ``(e^ε+1)^2 / (n (e^ε-1)^2)``; Wang et al., Sensors 2020, Eq. 47
        (``4p(1-p) / (n (2p-1)^2)``) is the exact variance at ``f = 1`` (it leaves out the variance
        of the row sampling).
        """
        return float(np.log(self.p) - np.log1p(-self.p))

    # ---------------------------------------------------------------- codec
    @property
    def report_dtype(self) -> np.dtype:
        return uint_dtype(2 * self.K)

    def validate_reports(self, reports: np.ndarray) -> None:
        r = _check_integer_reports(self.name, reports, ())
        if r.size and (int(r.min()) < 0 or int(r.max()) >= 2 * self.K):
            bad = r[(r < 0) | (r >= 2 * self.K)][0]
            raise InvalidReports(f"HR report {int(bad)} is outside [0, {2 * self.K}): row {int(bad) >> 1} "
                                 f"is not a row of the order-{self.K} Hadamard matrix")

    # ---------------------------------------------------------------- device / server
    def randomize(self, values, rng=None, state: MemoState | None = None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        return kernels.hr_randomize(v, noise_key(rng), self.p, self.K).astype(self.report_dtype)

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``C(v)`` = number of reports ``(j, b)`` with ``H[j, v+1] = b``, via one FWHT."""
        self.validate_reports(reports)
        return kernels.hr_support(np.ascontiguousarray(reports), self.K, self.k)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """The report's bit agrees with ``H[j, v1+1]`` and disagrees with ``H[j, v2+1]``."""
        r = np.asarray(reports).astype(np.int64)
        j, b = r >> 1, 2 * (r & 1) - 1
        return (hadamard_entry(j, v1 + 1) == b) & (hadamard_entry(j, v2 + 1) != b)


class FHR(_Hadamard):
    """Flexible Hadamard Response (Zhao et al., arXiv 2022, Alg. 1); satisfies (ε, η = 1/2)-FLDP,
    not ε-LDP.

    Report: ``(P, M)``, the positions of the ``+1`` and of the ``-1`` of the sparse vector
    ``b``, each the smallest unsigned integer holding ``[0, K)``. This carries exactly the
    information of ``b`` (2 log2 K bits). The paper's literal triple ``(index_x, x', index_y)``
    would also reveal which position is the ``+1`` of ``H(t)``, i.e. ``H(t)`` at both positions
    with no noise at all; ``(P, M)`` is the output whose probabilities Theorem 2 analyses.
    The paper has no parameter besides ε (η = 1/2 is fixed by the construction).
    """

    name: ClassVar[str] = "FHR"

    # ---------------------------------------------------------------- privacy
    def output_probabilities(self) -> tuple[float, float]:
        """``P(s | t)`` on ``R(t)``: ``4p / K^2`` if ``(H_t[P], H_t[M]) = (+1, -1)`` (kept),
        ``4(1-p) / K^2`` if ``(-1, +1)`` (flipped); 0 off ``R(t)`` (equal entries)."""
        return 4.0 * self.p / self.K**2, 4.0 * (1.0 - self.p) / self.K**2

    @property
    def eta(self) -> float:
        """Eq. 3: ``|R(t) ∩ R(t')| / |R(t)|``. Split the K positions into four classes of K/4 by
        ``(H_t, H_t')``; ``R(t)`` = pairs with ``H_t[P] != H_t[M]`` (``2 (K/2)^2``), the
        intersection also needs ``H_t'[P] != H_t'[M]`` (``4 (K/4)^2``): η = 1/2 (Theorem 2)."""
        return (4 * (self.K // 4) ** 2) / (2 * (self.K // 2) ** 2)

    @property
    def eps_fldp(self) -> float:
        """Eq. 4: the largest log-ratio of output probabilities on ``R(t) ∩ R(t')``: ln(p / (1-p))."""
        hi, lo = self.output_probabilities()
        return float(np.log(hi) - np.log(lo))

    @property
    def eps_ldp(self) -> float:
        """Standard LDP ε (Def. 1): ``inf``, since η < 1 (an output of ``t`` outside ``R(t')``
        has probability 0 under ``t'``)."""
        return float("inf") if self.eta < 1.0 else self.eps_fldp

    @property
    def eps_first(self) -> float:
        """The single-report ε in the project's (LDP) sense: :attr:`eps_ldp` (= inf)."""
        return self.eps_ldp

    # ---------------------------------------------------------------- codec
    @property
    def report_dtype(self) -> np.dtype:
        return uint_dtype(self.K)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return (2,)

    def validate_reports(self, reports: np.ndarray) -> None:
        r = _check_integer_reports(self.name, reports, (2,))
        if r.size:
            if int(r.min()) < 0 or int(r.max()) >= self.K:
                raise InvalidReports(f"FHR report positions must lie in [0, {self.K})")
            if (r[:, 0] == r[:, 1]).any():
                raise InvalidReports("FHR report puts its +1 and its -1 at the same position")

    # ---------------------------------------------------------------- device / server
    def randomize(self, values, rng=None, state: MemoState | None = None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        return kernels.fhr_randomize(v, noise_key(rng), self.p, self.K).astype(self.report_dtype)

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``C(t) = (z . H(t)) / 2`` with ``z = sum_i b_i`` (integer; may be negative), via one FWHT."""
        self.validate_reports(reports)
        return kernels.fhr_support(np.ascontiguousarray(reports), self.K, self.k)

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """Eq. 7 divided by n: ``f_t = (e^ε+1) / (2 (e^ε-1)) (z . H(t)) / n = C(t) / (n (2p - 1))``."""
        c = self.check_counts(counts, n).astype(np.float64)
        if postprocess == "ibu":
            raise LDPError("ibu needs a pure protocol's (ps, qs); FHR is not pure: "
                           "use clip, norm-sub or project")
        return _pp.apply(postprocess, c / (n * (2.0 * self.p - 1.0)))

    def variance(self, n: int) -> float:
        """Var* (f → 0) from Eq. 10: ``(e^ε+1)^2 / (2 (e^ε-1)^2 n)``."""
        return float(self.variance_exact(0.0, n))

    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        """Eq. 10 / n^2: ``D(𝒳) = 4 - 4(2p-1)^2`` (Eq. 8), ``D(𝒴) = 2`` (Eq. 9), scaled by
        ``c^2 = 1 / (4 (2p-1)^2)``: ``[(1 + f) / (2 (2p-1)^2) - f] / n``."""
        f = np.asarray(f, dtype=np.float64)
        a2 = (2.0 * self.p - 1.0) ** 2
        return ((1.0 + f) / (2.0 * a2) - f) / n

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """``b`` lies in ``R(v1) \\ R(v2)``: ``H_v1[P] != H_v1[M]`` and ``H_v2[P] = H_v2[M]``.

        Probability 1/2 under ``v1`` and 0 under ``v2``: the audit exposes the infinite LDP ε.
        """
        r = np.asarray(reports).astype(np.int64)
        d = r[:, 0] ^ r[:, 1]
        return (hadamard_entry(d, v1 + 1) == -1) & (hadamard_entry(d, v2 + 1) == 1)
