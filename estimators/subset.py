"""Subset selection: the ω-subset mechanism SS (ω-SM; Wang et al., arXiv:1607.08025, 2016; Ye &
Barg, IEEE Trans. Inf. Theory 2018), as described in Wang et al., Sensors 2020, §3.1.5 (Eq. 48,
Alg. 2, Eq. 49).

A report is a subset ``z`` of ``[0, k)`` with exactly ``ω`` elements: the true value is in it
w.p. ``ps = ω e^ε / (ω e^ε + k - ω)``, the other elements are uniform without replacement
from the rest. A report supports every value it contains, so ``C(v) = #{reports ∋ v}``.

Wire layouts (both sides derive the same one from ``(k, ω)``; ``layout=`` overrides):

* ``"bits"``: the subset as a k-bit vector packed little-endian into ``uint8 (n, ceil(k/8))``
  (like UE); support is a column bit count.
* ``"indices"``: the ``ω`` elements in increasing order, ``(n, ω)`` of the smallest unsigned
  dtype holding ``k - 1``. Increasing order is canonical: the order of sampling (true value
  first) never reaches the wire.

``"auto"`` takes ``"indices"`` when ``ω · itemsize < ceil(k/8)`` (small ω, i.e. large ε),
else ``"bits"``. The two layouts carry the same subset, hence the same estimates.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import kernels
from .base import SingleShot, SingleShotPure, uint_dtype
from .errors import InvalidReports, LDPError
from .randomness import noise_key
from .unary import check_bit_padding, packed_bit

LAYOUTS = ("auto", "bits", "indices")


def ss_optimal_omega(k: int, eps: float) -> int:
    """Variance-optimal subset size ``ω = max(1, round(k / (e^ε + 1)))`` (Wang et al., arXiv:1607.08025,
    2016)."""
    return max(1, int(np.floor(k / (np.exp(eps) + 1.0) + 0.5)))


def ss_probabilities(k: int, eps: float, omega: int) -> tuple[float, float]:
    """``(ps, qs)`` of ω-SM (θ_tr and θ_fr before Eq. 49 of Wang et al., Sensors 2020).

    ``ps = ω e^ε / (ω e^ε + k - ω)``; ``qs = ps (ω-1)/(k-1) + (1 - ps) ω/(k-1)``.
    """
    d = omega * np.exp(eps) + k - omega
    ps = omega * np.exp(eps) / d
    out = (k - omega) / d  # 1 - ps, without cancellation
    qs = ps * (omega - 1) / (k - 1) + out * omega / (k - 1)
    return float(ps), float(qs)


class SS(SingleShotPure):
    """ω-subset selection (ω-SM): each report is a subset of size ω (1-SM is GRR)."""

    name: ClassVar[str] = "SS"

    def __init__(self, k: int, eps: float, omega: int | None = None, layout: str = "auto") -> None:
        SingleShot.__init__(self, k, eps)
        if omega is None:
            omega = ss_optimal_omega(self.k, self.eps)
        if isinstance(omega, bool) or int(omega) != omega or not 1 <= omega <= self.k - 1:
            raise LDPError(f"omega must be an integer in [1, k-1] = [1, {self.k - 1}], got {omega}")
        self.omega = int(omega)
        if layout not in LAYOUTS:
            raise LDPError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if layout == "auto":
            small = self.omega * uint_dtype(self.k).itemsize < (self.k + 7) // 8
            layout = "indices" if small else "bits"
        self.layout = layout
        self.p, self.q = ss_probabilities(self.k, self.eps, self.omega)
        self._p_out = (self.k - self.omega) / (self.omega * np.exp(self.eps) + self.k - self.omega)

    def params(self) -> dict:
        return {"protocol": self.name, "k": self.k, "eps": self.eps, "omega": self.omega, "layout": self.layout}

    @property
    def eps_first(self) -> float:
        """ln of the largest output-probability ratio of Eq. 48.

        ``P(z | v) = ps / C(k-1, ω-1)`` if ``v ∈ z`` else ``(1 - ps) / C(k-1, ω)``; the worst
        ratio (``z ∋ v1``, ``z ∌ v2``) is ``ps (k - ω) / ((1 - ps) ω)``.
        """
        return float(np.log(self.p) - np.log(self._p_out) + np.log((self.k - self.omega) / self.omega))

    # ---------------------------------------------------------------- device side
    def randomize(self, values, rng=None, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        bits = kernels.ss_randomize(v, noise_key(rng), self.p, self.omega, self.k)
        if self.layout == "bits":
            return bits
        return kernels.packed_to_indices(bits, np.empty((v.shape[0], self.omega), dtype=self.report_dtype))

    # ---------------------------------------------------------------- wire codec
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint8) if self.layout == "bits" else uint_dtype(self.k)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return ((self.k + 7) // 8,) if self.layout == "bits" else (self.omega,)

    def _check_array(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        if r.ndim != 2 or r.shape[1:] != self.report_shape:
            raise InvalidReports(f"SS ({self.layout}) reports must have shape (n, {self.report_shape[0]}), "
                                 f"got {r.shape}")
        if self.layout == "bits" and r.dtype != np.uint8:
            raise InvalidReports(f"SS bit reports must be uint8, got {r.dtype}")
        if self.layout == "indices" and not np.issubdtype(r.dtype, np.integer):
            raise InvalidReports(f"SS index reports must be integers, got {r.dtype}")
        return r

    def validate_reports(self, reports: np.ndarray) -> None:
        r = self._check_array(reports)
        if not r.size:
            return
        if self.layout == "bits":
            check_bit_padding(r, self.k, "SS report")
            sizes = np.bitwise_count(r).sum(axis=1, dtype=np.int64)
            if (sizes != self.omega).any():
                bad = int(sizes[sizes != self.omega][0])
                raise InvalidReports(f"SS report has {bad} elements, expected omega = {self.omega}")
        else:
            if int(r.min()) < 0 or int(r.max()) >= self.k:
                raise InvalidReports(f"SS report element outside [0, {self.k})")
            if self.omega > 1 and not (r[:, 1:] > r[:, :-1]).all():
                raise InvalidReports("SS report elements must be distinct and in increasing order")

    # ---------------------------------------------------------------- server side
    def support(self, reports: np.ndarray) -> np.ndarray:
        """``C(v)`` = number of reported subsets containing ``v`` (Wang et al., Sensors 2020, before
        Eq. 49)."""
        r = self._check_array(reports)
        self.validate_reports(r)
        r = np.ascontiguousarray(r)
        if self.layout == "bits":
            return kernels.packed_bit_counts(r, self.k)
        return kernels.bincount(r.reshape(-1), self.k)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """``v1 ∈ z`` and ``v2 ∉ z``: probability ratio exactly ``e^{eps_first}``."""
        r = np.asarray(reports)
        if self.layout == "bits":
            return (packed_bit(r, v1) == 1) & (packed_bit(r, v2) == 0)
        return (r == v1).any(axis=1) & ~(r == v2).any(axis=1)
