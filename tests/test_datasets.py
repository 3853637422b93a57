"""Evolving populations (producers.datasets)."""
from __future__ import annotations

import numpy as np
import pytest

from producers.datasets import EvolvingPopulation


def test_syn_changes_at_the_stated_rate() -> None:
    pop = EvolvingPopulation(n=200_000, k=360, kind="syn", p_change=0.25, rng=np.random.default_rng(0))
    a = pop.step().copy()
    b = pop.step()
    changed = np.mean(a != b)
    # a change redraws uniformly, so it keeps the same value w.p. 1/k
    expected = 0.25 * (1 - 1 / 360)
    sd = np.sqrt(expected * (1 - expected) / 200_000)
    assert abs(changed - expected) < 4 * sd


def test_zipf_population_matches_its_distribution() -> None:
    pop = EvolvingPopulation(n=400_000, k=50, kind="zipf", rng=np.random.default_rng(1))
    pop.step()
    f = pop.true_frequencies()
    p = pop.distribution
    sd = np.sqrt(p * (1 - p) / 400_000)
    assert np.all(np.abs(f - p) < 5 * sd)


@pytest.mark.parametrize("kw", [dict(kind="nope"), dict(p_change=1.5), dict(n=0)])
def test_bad_population(kw) -> None:
    args = dict(n=10, k=5) | kw
    with pytest.raises(ValueError):
        EvolvingPopulation(**args)
