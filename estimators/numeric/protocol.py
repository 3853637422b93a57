"""A numeric mechanism behind the protocol contract: what a campaign attribute with ``type = "numeric"`` holds.

The pipeline (codec, envelope, support, count store, ingest, SDKs) handles every attribute through
:class:`estimators.base.FrequencyProtocol`; :class:`NumericProtocol` gives a :class:`.base.NumericMechanism` that
shape, so a numeric attribute travels the same path as a categorical one:

* its parameters and fingerprint are the mechanism's (``{"mechanism", "eps", "lo", "hi", ...}``);
* a report is the mechanism's report (one integer code), in the batch payload of every protocol (header + raw
  little-endian array, :meth:`estimators.base.FrequencyProtocol.encode`);
* the support counts are the mechanism's aggregate (:meth:`.base.NumericMechanism.support`: exact ``int64`` sums,
  counts or, for Square Wave, the cell histogram), which the count store adds per step exactly once;
* the estimate of a step is :meth:`estimate_step`: the mean with its variance and 95% interval, and for Square
  Wave the EMS distribution with quantiles and their intervals; :meth:`estimate` (the frequency contract) is the
  distribution for Square Wave and refused for the mean mechanisms, whose attribute has no histogram;
* memoization (1BitMean's α-point rounding) uses the device memo state of the frequency protocols.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..base import FrequencyProtocol
from ..errors import LDPError
from ..memo import MemoState
from .base import MeanEstimate, NumericMechanism

__all__ = ["NumericProtocol", "NumericStepEstimate", "QUANTILES"]

#: the quantile levels published for a distribution (Square Wave)
QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)
#: bootstrap replicates of a published quantile interval
QUANTILE_BOOTSTRAP = 50


@dataclass(frozen=True)
class NumericStepEstimate:
    """A step's numeric estimate: the mean and, for a distribution mechanism, the distribution and quantiles."""

    mean: MeanEstimate
    #: grid points (metric units) and their estimated probabilities; ``None`` for a mean mechanism
    grid: np.ndarray | None = None
    distribution: np.ndarray | None = None
    #: ``level -> (estimate, lower, upper)`` in metric units
    quantiles: dict[float, tuple[float, float, float]] | None = None


class NumericProtocol(FrequencyProtocol):
    """A :class:`NumericMechanism` as a campaign attribute's protocol (module doc)."""

    def __init__(self, mechanism: NumericMechanism) -> None:
        self.mechanism = mechanism
        self.name = mechanism.name  # type: ignore[misc]
        self.longitudinal = mechanism.longitudinal  # type: ignore[misc]
        self.k = mechanism.support_size

    @property
    def lo(self) -> float:
        return self.mechanism.lo

    @property
    def hi(self) -> float:
        return self.mechanism.hi

    @property
    def is_distribution(self) -> bool:
        """Whether the mechanism estimates a distribution (Square Wave), not only a mean."""
        return self.mechanism.aggregate == "distribution"

    def params(self) -> dict[str, Any]:
        return self.mechanism.params()

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        return self.mechanism.eps_first

    @property
    def eps_inf(self) -> float:
        """ε of one memoized point (1BitMean: ``eps_memo``); ``eps_first`` for the memoryless mechanisms."""
        return float(getattr(self.mechanism, "eps_memo", self.mechanism.eps_first))

    @property
    def memo_size(self) -> int:
        return int(getattr(self.mechanism, "memo_size", 0))

    def longitudinal_loss(self, memoized: np.ndarray | int) -> np.ndarray | float:
        if self.memo_size:
            return self.mechanism.longitudinal_loss(memoized)  # type: ignore[attr-defined]
        return super().longitudinal_loss(memoized)

    # ---------------------------------------------------------------- device side
    def new_state(self, n_devices: int, rng: np.random.Generator | None = None) -> MemoState | None:
        if not self.memo_size:
            return None
        return self.mechanism.new_state(n_devices, rng)  # type: ignore[attr-defined]

    def check_values(self, values: np.ndarray) -> np.ndarray:
        """Numeric values as float64 ``(n,)``: finite numbers (outside ``[lo, hi]`` they are clipped); NaN refused."""
        v = np.asarray(values)
        if v.ndim != 1:
            raise LDPError(f"values must be a 1-d array, got shape {v.shape}")
        if v.size and not (np.issubdtype(v.dtype, np.floating) or np.issubdtype(v.dtype, np.integer)):
            raise LDPError(f"numeric values must be numbers, got dtype {v.dtype}")
        v = np.ascontiguousarray(v, dtype=np.float64)
        if v.size and not np.all(np.isfinite(v)):
            raise LDPError("a numeric value is NaN or infinite: not a measurement")
        return v

    def clipped(self, values: np.ndarray) -> np.ndarray:
        """The mask of the values outside ``[lo, hi]`` (clipped before randomization; a device counts them)."""
        return self.mechanism.prepare(self.check_values(values))[1]

    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None,
                  state: MemoState | None = None) -> np.ndarray:
        v = self.check_values(values)
        if self.memo_size:
            return self.mechanism.randomize(v, rng, state=state)  # type: ignore[call-arg]
        self._state_for(state, v.shape[0])
        return self.mechanism.randomize(v, rng)

    # ---------------------------------------------------------------- server side
    @property
    def report_dtype(self) -> np.dtype:
        return self.mechanism.report_dtype

    def validate_reports(self, reports: np.ndarray) -> None:
        self.mechanism.validate_reports(np.asarray(reports))

    @property
    def domain_size(self) -> int:
        """The support size: a numeric attribute has no categorical domain."""
        return self.mechanism.support_size

    def support(self, reports: np.ndarray) -> np.ndarray:
        return self.mechanism.support(reports)

    def estimate_mean(self, counts: np.ndarray, n: int) -> MeanEstimate:
        """The step's mean (metric units) and its variance from the aggregate of ``n`` reports."""
        return self.mechanism.estimate_from_support(counts, n)

    def estimate_step(self, counts: np.ndarray, n: int, *, quantiles: Sequence[float] = QUANTILES,
                      rng: np.random.Generator | None = None) -> NumericStepEstimate:
        """The published estimate of a step (module doc). ``rng`` seeds the quantile intervals' bootstrap
        (server-side resampling of the estimated law, not device randomness)."""
        mean = self.estimate_mean(counts, n)
        if not self.is_distribution:
            return NumericStepEstimate(mean)
        sw = self.mechanism
        qi = sw.quantile_intervals(counts, n, quantiles, B=QUANTILE_BOOTSTRAP, rng=rng)  # type: ignore[attr-defined]
        dist = sw.estimate_distribution(counts, n)  # type: ignore[attr-defined]
        qs = {float(q): (float(e), float(lo), float(hi)) for q, e, lo, hi in zip(qi.qs, qi.estimate, qi.lower,
                                                                               qi.upper)}
        return NumericStepEstimate(mean, sw.grid(), dist, qs)  # type: ignore[attr-defined]

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """Square Wave: the EMS distribution over its grid; a mean mechanism has no histogram (refused)."""
        if not self.is_distribution:
            raise LDPError(f"{self.name} estimates a mean, not frequencies: use estimate_step")
        return self.mechanism.estimate_distribution(self.check_counts(counts, n), n)  # type: ignore[attr-defined]

    def variance(self, n: int) -> float:
        """The variance of the unit mean over ``n`` reports at the worst input (``x = ±1`` or 0, the larger)."""
        return float(max(self.mechanism.unit_variance(np.array([-1.0, 0.0, 1.0])))) / n

    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        """The variance of the unit mean of ``n`` reports of the unit input ``f``."""
        return np.asarray(self.mechanism.unit_variance(f), dtype=np.float64) / n

    @property
    def worst_case_loss(self) -> float:
        if self.memo_size:
            return float(self.longitudinal_loss(self.memo_size))
        return math.inf
