"""The interface of every numeric mechanism: a value in ``[lo, hi]`` in, one randomized report out.

A numeric mechanism (mean or distribution estimation of a bounded numeric metric under ε-LDP) maps the
device's value to the mechanism's input domain ``[-1, 1]`` (``x = 2 (v - lo) / (hi - lo) - 1``; a value
outside ``[lo, hi]`` is clipped to the nearest end, and the device counts it as clipped: the server never
learns which reports were clipped), randomizes it with draws from ChaCha20 streams
(:mod:`estimators.randomness`: a fresh 256-bit batch key per call from the OS CSPRNG, or the labelled
simulation mode with a seeded Generator), and the server estimates from the reports' aggregate: the mean from
``(sum of reports, n)`` for the mean mechanisms, the distribution from bucket counts for Square Wave.

Privacy figures come from the output law: :meth:`NumericMechanism.output_mass` gives the probability of each
output bin for an input, and :func:`eps_of_law` the largest log-ratio of two inputs' masses over a grid of
inputs and bins; the tests check that it equals :attr:`NumericMechanism.eps_first` (the analytical ε).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from dataclasses import dataclass

import numpy as np

from ..base import check_eps
from ..errors import InvalidReports, LDPError

__all__ = ["MeanEstimate", "NumericMechanism", "eps_of_law", "linear_mean", "to_unit", "from_unit"]

#: the normal quantile of a two-sided 95% interval
Z95 = 1.959963984540054


@dataclass(frozen=True)
class MeanEstimate:
    """The unbiased mean of a step (metric units) and the estimated variance of that estimate."""

    mean: float
    variance: float  # of the mean; inf with fewer than two reports
    n: int

    @property
    def ci95_halfwidth(self) -> float:
        """Half-width of the normal 95% interval ``mean ± 1.96 sd``."""
        return Z95 * math.sqrt(self.variance) if math.isfinite(self.variance) else math.inf


def linear_mean(z_sum: int, z_sq_sum: int, n: int, slope: float, intercept: float) -> tuple[float, float]:
    """``(mean of y, estimated variance of that mean)`` for per-report values ``y = slope z + intercept`` of an
    integer statistic ``z`` with exact sums ``Σz`` and ``Σz^2`` over ``n`` reports: the sample variance
    ``(n Σz^2 - (Σz)^2) / (n (n - 1))`` in exact integers, scaled by ``slope^2 / n`` (an unbiased estimate of the
    variance of the mean of independent reports, plus the spread of the devices' own means: conservative)."""
    n, zs, zq = int(n), int(z_sum), int(z_sq_sum)
    if n <= 0:
        raise LDPError("no report: no mean")
    mean = slope * (zs / n) + intercept
    if n < 2:
        return mean, math.inf
    spread = n * zq - zs * zs  # exact: Python integers
    if spread < 0:
        raise LDPError("inconsistent sums: Σz^2 is below (Σz)^2 / n")
    return mean, slope * slope * (spread / (n * (n - 1))) / n


def to_unit(values: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """``values`` mapped to ``[-1, 1]`` (float64), and the mask of the values clipped (outside ``[lo, hi]``
    or not finite: NaN is refused, not clipped)."""
    v = np.asarray(values, dtype=np.float64)
    if np.isnan(v).any():
        raise LDPError("a numeric value is NaN: not a measurement")
    clipped = (v < lo) | (v > hi)
    x = 2.0 * (np.clip(v, lo, hi) - lo) / (hi - lo) - 1.0
    return np.clip(x, -1.0, 1.0), clipped


def from_unit(x: np.ndarray | float, lo: float, hi: float) -> np.ndarray | float:
    """The inverse map of :func:`to_unit`: a mean (or a point) of ``[-1, 1]`` in the metric's units."""
    return lo + (np.asarray(x, dtype=np.float64) + 1.0) * (hi - lo) / 2.0


def eps_of_law(mech: "NumericMechanism", inputs: np.ndarray, edges: np.ndarray) -> float:
    """The largest ``log(P[out in bin | x] / P[out in bin | x'])`` over ``inputs`` x, x' and the bins
    between ``edges`` where either mass is positive (``inf`` where one is zero and the other not)."""
    mass = np.stack([mech.output_mass(float(x), edges) for x in inputs])  # (inputs, bins)
    hi, lo = mass.max(axis=0), mass.min(axis=0)
    live = hi > 0
    if (lo[live] <= 0).any():
        return float("inf")
    return float(np.max(np.log(hi[live] / lo[live]))) if live.any() else 0.0


class NumericMechanism(ABC):
    """A numeric LDP mechanism on ``[lo, hi]`` (module doc). Subclasses set :attr:`name` and implement the
    abstract methods; everything is in the unit domain ``[-1, 1]`` except :meth:`randomize`'s input and
    :meth:`estimate_mean`'s output, which are in the metric's units."""

    name: ClassVar[str]
    #: ``"mean"`` (the store aggregates the reports' sum and count) or ``"distribution"`` (bucket counts)
    aggregate: ClassVar[str] = "mean"
    longitudinal: ClassVar[bool] = False

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0) -> None:
        self.eps = check_eps("eps", eps)
        lo, hi = float(lo), float(hi)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise LDPError(f"the range must be finite with lo < hi, got [{lo}, {hi}]")
        self.lo, self.hi = lo, hi

    # ---------------------------------------------------------------- identity
    def params(self) -> dict[str, Any]:
        """Canonical parameters (everything device and server must agree on)."""
        return {"mechanism": self.name, "eps": self.eps, "lo": self.lo, "hi": self.hi}

    @functools.cached_property
    def fingerprint(self) -> str:
        blob = json.dumps(self.params(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items() if k != "mechanism")
        return f"{self.name}({inner})"

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """ε of one report, from the output law (equals :attr:`eps` unless a subclass accounts more)."""
        return self.eps

    @abstractmethod
    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """``P[output in [edges[j], edges[j+1])]`` for input ``x`` of ``[-1, 1]``, ``(len(edges) - 1,)``; the
        last bin is closed. Exact (closed form), not sampled."""

    # ---------------------------------------------------------------- device side
    def prepare(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``values`` in ``[-1, 1]`` and the clipped mask (:func:`to_unit`)."""
        return to_unit(values, self.lo, self.hi)

    @abstractmethod
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Reports of a batch of values (metric units), device ``i`` = row ``i``: ``rng=None`` draws the batch
        key from the OS CSPRNG; a Generator is the labelled simulation mode."""

    # ---------------------------------------------------------------- server side
    @property
    @abstractmethod
    def report_dtype(self) -> np.dtype:
        """The dtype of one report (little-endian on the wire)."""

    def validate_reports(self, reports: np.ndarray) -> None:
        """Raise :class:`InvalidReports` unless every report lies in the output space."""
        r = np.asarray(reports)
        if r.dtype != self.report_dtype:
            raise InvalidReports(f"{self.name} reports are {self.report_dtype}, got {r.dtype}")

    def encode(self, reports: np.ndarray) -> bytes:
        r = np.asarray(reports)
        self.validate_reports(r)
        return r.astype(self.report_dtype.newbyteorder("<"), copy=False).tobytes()

    def decode(self, blob: bytes | memoryview) -> np.ndarray:
        size = self.report_dtype.itemsize
        if len(blob) % size:
            raise InvalidReports(f"{self.name}: {len(blob)} bytes is not a whole number of {size}-byte reports")
        r = np.frombuffer(blob, dtype=self.report_dtype.newbyteorder("<")).astype(self.report_dtype)
        self.validate_reports(r)
        return r

    # ---------------------------------------------------------------- the store's aggregate
    @property
    def support_size(self) -> int:
        """Length of the aggregate vector the count store keeps per step (:meth:`support`)."""
        return 1

    @abstractmethod
    def support(self, reports: np.ndarray) -> np.ndarray:
        """The aggregate of a batch: ``int64 (support_size,)``, exact integers, additive over disjoint batches (the
        count store adds them per step exactly once)."""

    @abstractmethod
    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """``(unbiased unit mean, estimated variance of it)`` from a step's aggregate of ``n`` reports."""

    def check_support(self, support: np.ndarray, n: int) -> np.ndarray:
        s = np.asarray(support)
        if s.shape != (self.support_size,):
            raise LDPError(f"{self.name}: the aggregate has shape ({self.support_size},), got {s.shape}")
        if int(n) != n or n <= 0:
            raise LDPError(f"n must be a positive integer, got {n}")
        return s

    def estimate_from_support(self, support: np.ndarray, n: int) -> MeanEstimate:
        """The mean (metric units) and its variance from a step's aggregate (:meth:`unit_estimate`, scaled)."""
        mean, var = self.unit_estimate(self.check_support(support, n), int(n))
        scale = (self.hi - self.lo) / 2.0
        return MeanEstimate(float(from_unit(mean, self.lo, self.hi)), float(var * scale * scale), int(n))

    @abstractmethod
    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        """The unbiased estimate of the mean of the inputs in ``[-1, 1]`` from the sum of ``n`` reports."""

    def estimate_mean(self, report_sum: float, n: int) -> float:
        """The unbiased estimate of the mean value in the metric's units."""
        if n <= 0:
            raise LDPError("no report: no mean")
        return float(from_unit(self.estimate_unit_mean(report_sum, n), self.lo, self.hi))

    @abstractmethod
    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """Variance of one report's unbiased estimate of ``x`` (unit domain), the paper's formula."""

    def mean_variance(self, values: np.ndarray) -> float:
        """Variance of :meth:`estimate_mean` over the devices' ``values`` (metric units): the average of the
        per-report variances over n, scaled to the metric's range."""
        x, _ = self.prepare(values)
        scale = (self.hi - self.lo) / 2.0
        return float(np.mean(self.unit_variance(x)) / x.shape[0] * scale * scale)
