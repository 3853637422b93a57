"""Acceptance 2 of issue 2: for every protocol, the empirical MSE of ``estimate`` over 30 seeded
repetitions matches the exact analytical variance averaged over the values (within 15%).

Each repetition draws a fresh population iid from a fixed Zipf histogram and fresh devices
(new memo keys), so the reports of different devices are independent and the exact variance
of :meth:`variance_exact` applies. The empirical MSE averages 30 x k squared errors; its
relative standard deviation is about sqrt(2 / (30 k)) = 2.6% at k = 100, so 15% is a
several-sigma tolerance that still catches any biased estimator or wrong variance formula.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

import estimators
from ldpstream_cli.options import build
from producers.datasets import zipf_weights as zipf_histogram

REPS = 30
K = 100
# n = 100000 reports, 20000 for protocols whose aggregation or randomization is O(n k) (local hashing; SHE draws
# k Laplace noises per report). The tolerance does not depend on n: the relative standard deviation of the
# MSE estimate is that of a mean of 30 k squared errors (module doc), for any n.
N_DEFAULT, N_HASHING = 100_000, 20_000
HASHING = {"BLH", "OLH", "LOLOHA", "SHE"}
OPTIONS = dict(k=K, eps=1.0, eps_inf=2.0, eps_1=1.0)
EXTRA = {"dBitFlipPM": dict(b=25, d=2)}


def _empirical_and_theory(proto: estimators.FrequencyProtocol, n: int, seed: int) -> tuple[float, float]:
    f = zipf_histogram(K)
    rng = np.random.default_rng(seed)
    truth = f if proto.domain_size == K else np.bincount((np.arange(K) * proto.domain_size) // K, weights=f,
                                                         minlength=proto.domain_size)
    sq = []
    for _ in range(REPS):
        values = rng.choice(K, size=n, p=f)
        state = proto.new_state(n, rng=rng)
        est = proto.estimate(proto.support(proto.randomize(values, rng, state=state)), n)
        sq.append((est - truth) ** 2)
    return float(np.mean(sq)), float(np.mean(proto.variance_exact(truth, n)))


@pytest.mark.slow
@pytest.mark.parametrize("name", estimators.PROTOCOLS)
def test_empirical_mse_matches_exact_variance(name: str) -> None:
    proto = build(name, **OPTIONS, **EXTRA.get(name, {}))
    n = N_HASHING if name in HASHING else N_DEFAULT
    mse, var = _empirical_and_theory(proto, n, seed=zlib.crc32(name.encode()))
    assert abs(mse / var - 1) < 0.15, f"{proto}: empirical MSE {mse:.4e} vs exact variance {var:.4e}"


@pytest.mark.parametrize("name", ["L-GRR", "LOLOHA"])
def test_paper_calibration_is_also_unbiased(name: str) -> None:
    proto = build(name, **OPTIONS, calibration="paper")
    mse, var = _empirical_and_theory(proto, N_HASHING, seed=11)
    assert abs(mse / var - 1) < 0.15


def test_the_mse_check_can_fail() -> None:
    """A biased estimator (reports of a GRR with another ε) is caught by the same check."""
    proto = estimators.make("GRR", k=K, eps=1.0)
    wrong = estimators.make("GRR", k=K, eps=1.3)
    f = zipf_histogram(K)
    rng = np.random.default_rng(3)
    sq = [(wrong.estimate(proto.support(proto.randomize(rng.choice(K, size=N_DEFAULT, p=f), rng)), N_DEFAULT) - f) ** 2
          for _ in range(REPS)]
    assert abs(np.mean(sq) / np.mean(wrong.variance_exact(f, N_DEFAULT)) - 1) > 0.15
