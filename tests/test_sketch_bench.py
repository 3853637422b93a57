"""The open-domain protocols against pure-ldp 1.2.0 (ldpstream_cli/bench_sketch.py): pure-ldp's client reports
through our support and estimator give pure-ldp's estimates (CMS: exactly once c is Apple's c_ε, the rest is the
quantization of q; HCMS: equal), pure-ldp's RAPPOR client never clears a set bit, ``ldp bench protocols -p sketch``
runs, and ``ldp audit CMS`` certifies most of ε within its Clopper-Pearson bound. Light: small n throughout (the
20x rates are a benchmark, docs/benchmarks.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm
from typer.testing import CliRunner

from ldpstream_cli import bench_sketch as B

pytest.importorskip("pure_ldp")
pytest.importorskip("xxhash")


@pytest.fixture(scope="module")
def same():
    return B.same_reports(n=2000, eps=1.0, m=64, k=4, n_cands=30, seed=1, rappor={"m": 32, "cohorts": 4})


def test_cms_same_reports_equal_up_to_the_quantized_c(same):
    d = same["CMS"]
    assert d["equal_with_c_eps"] and d["rel_diff_c_eps"] < 1e-12
    # the estimates are affine in c: the remaining difference is the quantization of q, relative ~|c - c_ε| / c
    assert 0 < d["c_rel_diff"] < 1e-8
    assert d["rel_diff"] < 20 * d["c_rel_diff"]
    assert d["mse"]["ours_on_pure_ldp_reports"] == pytest.approx(d["mse"]["pure_ldp"], rel=1e-6)


def test_hcms_same_reports_equal(same):
    d = same["HCMS"]
    assert d["c_rel_diff"] < 1e-14
    assert d["equal_with_c_eps"] and d["rel_diff"] < 1e-12


def test_rappor_pure_ldp_never_clears_a_set_bit(same):
    d = same["RAPPOR"]
    assert d["p_set_pure_ldp"] == 1.0                       # pure-ldp 1.2.0: P(B'=1 | B=1) = 1, not 1 - f/2
    assert abs(d["p_clear_pure_ldp"] - d["f"] / 2) < 0.02
    assert abs(d["p_set_ours"] - d["p_set_stated"]) < 0.03  # ours: 1 - f/2
    assert d["mse"]["ours_on_pure_ldp_reports_rescaled"] < d["mse"]["ours_on_pure_ldp_reports"]


def test_bench_protocols_sketch_runs():
    from ldpstream_cli.cli import app

    r = CliRunner().invoke(app, ["bench", "protocols", "-p", "sketch", "--n", "2000", "--repeats", "1",
                                 "--peer-seconds", "0.05", "--sketch-m", "64", "--sketch-rows", "4",
                                 "--topk-n", "20000", "--pem-peer-n", "2000", "--same-n", "500", "--json"])
    assert r.exit_code == 0, r.output
    for what in ("open-domain sketches vs pure-ldp", "same reports", "top-20 over 2^32", "PEM (pure-ldp)"):
        assert what in r.output


def _cms_slack(p, trials: int, confidence: float) -> tuple[float, float, float]:
    """The event's probabilities under v1 and v2 (rows where the two ids collide excluded: 1/m of them) and the
    expected loss of the Clopper-Pearson bound (normal approximation, the audit's α/4 per one-sided statement)
    and its standard deviation, in ε."""
    q = p.q
    keep = 1 - 1 / p.m
    p1, p2 = keep * (1 - q) ** 2, keep * q ** 2
    sd = math.sqrt((1 - p1) / (trials * p1) + (1 - p2) / (trials * p2))
    z = norm.ppf(1 - (1 - confidence) / 4)
    return p1, z * sd, sd


def test_audit_cms_tight_within_its_confidence_bound():
    trials, confidence = 100_000, 0.95
    job = B.sketch_audit_jobs(["CMS"], "first", eps=1.0, seed=3)[0]
    res = job.run(trials=trials, seed=3, confidence=confidence)
    _, slack, sd = _cms_slack(job.proto, trials, confidence)
    assert res.passed
    assert res.eps_lower >= res.eps_theory - slack - 4 * sd
    assert res.tightness >= 0.80


def test_ldp_audit_sketches_cli():
    from ldpstream_cli.cli import app

    r = CliRunner().invoke(app, ["audit", "CMS", "--round", "first", "--trials", "50000"])
    assert r.exit_code == 0, r.output
    assert "CMS" in r.output and "ok" in r.output
    r = CliRunner().invoke(app, ["audit", "RAPPOR", "--round", "prr", "--trials", "20000"])
    assert r.exit_code == 0, r.output
    assert "RAPPOR" in r.output and "ε∞" in r.output
