"""Shared fixtures of the test suite."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


def zipf_histogram(k: int, s: float = 1.1) -> np.ndarray:
    """A skewed true histogram over ``k`` values (Zipf with exponent ``s``)."""
    w = 1.0 / np.arange(1, k + 1) ** s
    return w / w.sum()
