"""Evolving populations of device values (one array per time step): categorical (:class:`EvolvingPopulation`),
numeric (:class:`DriftingMetric`) and open-domain strings (an :class:`EvolvingPopulation` over
:data:`OPEN_DOMAIN_VALUES` strings, :func:`open_population`, the values named by :func:`open_value`).

* ``uniform``: every step, each device holds a uniform value.
* ``zipf``: values follow a Zipf law (exponent ``s``) over the domain, through a random
  permutation of ranks fixed for the population.
* ``syn``: the Syn model of Arcolezi et al., EDBT 2023, §5.1: the first value is uniform; at
  each later step a device changes its value with probability ``p_change`` (0.25 in the paper),
  drawing the new value from the base distribution (uniform in the paper; any of the above here).

Populations are vectorized: one call advances millions of devices.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Literal

import numpy as np

from estimators.sketch.hashing import value_ids

Kind = Literal["uniform", "zipf", "syn"]
KINDS: tuple[str, ...] = ("uniform", "zipf", "syn")


def zipf_weights(k: int, s: float = 1.1) -> np.ndarray:
    """Zipf probabilities over ranks ``1..k``."""
    w = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** s
    return w / w.sum()


@dataclass
class EvolvingPopulation:
    """``n`` devices whose values over ``[0, k)`` evolve step by step."""

    n: int
    k: int
    kind: Kind = "syn"
    p_change: float = 0.25
    base: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = 1.1
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    permute: bool = True  # Zipf ranks through a random permutation of the values (else value r has rank r)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown dataset {self.kind!r}; choose one of {', '.join(KINDS)}")
        if not 0.0 <= self.p_change <= 1.0:
            raise ValueError(f"p_change must lie in [0, 1], got {self.p_change}")
        if self.n < 1 or self.k < 2:
            raise ValueError("a population needs n >= 1 devices and a domain k >= 2")
        dist = "zipf" if self.kind == "zipf" else self.base
        self._p = None if dist == "uniform" else zipf_weights(self.k, self.zipf_s)
        if self._p is not None and self.permute:
            self._p = self._p[self.rng.permutation(self.k)]
        self.values: np.ndarray | None = None
        self.t = -1

    @property
    def distribution(self) -> np.ndarray:
        """The base distribution new values are drawn from."""
        return np.full(self.k, 1.0 / self.k) if self._p is None else self._p

    def _draw(self, size: int) -> np.ndarray:
        if self._p is None:
            return self.rng.integers(0, self.k, size)
        return self.rng.choice(self.k, size=size, p=self._p)

    def step(self) -> np.ndarray:
        """Advance one time step and return the devices' values (int64 ``(n,)``)."""
        self.t += 1
        if self.values is None or self.kind != "syn":
            self.values = self._draw(self.n)
        else:
            change = np.flatnonzero(self.rng.random(self.n) < self.p_change)
            self.values[change] = self._draw(change.size)
        return self.values

    def steps(self, tau: int) -> Iterator[np.ndarray]:
        for _ in range(tau):
            yield self.step()

    def true_frequencies(self) -> np.ndarray:
        """Histogram of the current values."""
        assert self.values is not None, "call step() first"
        return np.bincount(self.values, minlength=self.k) / self.n


#: how many distinct strings the simulated devices of an open-domain attribute draw from
OPEN_DOMAIN_VALUES = 1_000_000


def open_population(n: int, p_change: float, zipf_s: float, rng: np.random.Generator) -> EvolvingPopulation:
    """The simulated input of a ``type = "string"`` attribute: ``n`` devices whose values are indices of
    :data:`OPEN_DOMAIN_VALUES` strings, Zipf(``zipf_s``) with index ``r`` the ``r+1``-th most likely (no
    permutation: :func:`open_value` of the top ranks names the heavy hitters), changing with the Syn model's churn."""
    return EvolvingPopulation(n, OPEN_DOMAIN_VALUES, kind="syn", p_change=p_change, base="zipf", zipf_s=zipf_s,
                              rng=rng, permute=False)


def open_value(attribute: str, index: int) -> str:
    """The string a simulated device of ``attribute`` holds as its value ``index`` (``crash-0000003``)."""
    return f"{attribute}-{index:07d}"


def open_value_ids(attribute: str, indices: np.ndarray) -> np.ndarray:
    """The 64-bit ids (:func:`estimators.sketch.value_id`) of the strings of ``indices``, ``uint64``: each distinct
    string hashed once."""
    uniq, inverse = np.unique(np.asarray(indices, dtype=np.int64), return_inverse=True)
    return value_ids(open_value(attribute, int(i)) for i in uniq)[inverse]


@dataclass
class DriftingMetric:
    """``n`` devices measuring a numeric metric on ``[lo, hi]`` whose population drifts step by step: the
    simulated input of a ``type = "numeric"`` attribute.

    Each device has a baseline (``lo + 0.8 (hi - lo) Beta(2, 5)``, so the peak of the drift stays inside the range;
    a fraction ``outliers`` of devices sits past ``hi``, so their values are clipped and counted as clipped); at each step after the first a device redraws
    its baseline with probability ``p_change`` (the Syn model's churn), and every value is its baseline times
    the population's drift ``1 + 0.25 sin(2 pi t / period)`` (a daily cycle of ``period`` steps): the mean moves
    step by step. ``values`` holds the baselines (the state a resumed fleet restores); :meth:`step` returns the
    measurements."""

    n: int
    lo: float
    hi: float
    p_change: float = 0.25
    period: int = 12
    outliers: float = 0.005
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    def __post_init__(self) -> None:
        if not 0.0 <= self.p_change <= 1.0:
            raise ValueError(f"p_change must lie in [0, 1], got {self.p_change}")
        if self.n < 1 or not self.lo < self.hi:
            raise ValueError("a metric needs n >= 1 devices and lo < hi")
        self.values: np.ndarray | None = None
        self.t = -1

    def _draw(self, size: int) -> np.ndarray:
        base = self.lo + 0.8 * (self.hi - self.lo) * self.rng.beta(2.0, 5.0, size)
        out = self.rng.random(size) < self.outliers
        base[out] = self.hi + (self.hi - self.lo) * self.rng.random(int(out.sum()))
        return base

    def drift(self, t: int) -> float:
        """The population's multiplier at step ``t``."""
        return 1.0 + 0.25 * float(np.sin(2.0 * np.pi * t / self.period))

    def step(self) -> np.ndarray:
        """Advance one time step and return the devices' measurements (float64 ``(n,)``)."""
        self.t += 1
        if self.values is None:
            self.values = self._draw(self.n)
        else:
            change = np.flatnonzero(self.rng.random(self.n) < self.p_change)
            self.values[change] = self._draw(change.size)
        return self.lo + (self.values - self.lo) * self.drift(self.t)
