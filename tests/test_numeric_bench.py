"""Issue 23, acceptance 4: the numeric mechanisms in `ldp bench protocols` and `ldp bench pipeline`, and the kernels
made faster for it.

The fused PM kernel (the unit mapping inside the kernel) gives the reports of the unit inputs' kernel, word for word;
the warm-up compiles every numeric mechanism once; the benchmarks take the numeric mechanisms. Nothing here
asserts a timing (the rates are measured by the benchmarks: docs/benchmarks.md).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import estimators
from estimators.errors import LDPError
from estimators.numeric import MECHANISMS, make_numeric
from estimators.numeric import piecewise_kernels as pk
from estimators.numeric.base import to_unit
from estimators.randomness import noise_key

#: law parameters with Z = 11 · 2^60 (31% of the words redrawn): the extension streams (as in test_numeric_piecewise)
FORCED = (np.int64(5), np.int64(3), np.uint64(1 << 61), np.uint64(1 << 60), np.uint64(11 * (1 << 60) - 1))


def _values(g: np.random.Generator, n: int, lo: float, hi: float) -> np.ndarray:
    """Values on and beyond ``[lo, hi]``, the ends, the infinities, signed zeros and neighbours of the ends."""
    v = g.uniform(lo - 0.2 * (hi - lo), hi + 0.2 * (hi - lo), n)
    edge = [lo, hi, np.inf, -np.inf, -0.0, 0.0, np.nextafter(lo, np.inf), np.nextafter(hi, -np.inf),
            np.nextafter(lo, -np.inf), np.nextafter(hi, np.inf), (lo + hi) / 2, 1e-300]
    v[:min(n, len(edge))] = edge[:n]
    return v


@pytest.mark.parametrize("n", [0, 1, 300, 4100])
def test_fused_pm_kernel_equals_the_unit_kernel_and_its_twin(n):
    g = np.random.default_rng(2300 + n)
    for (lo, hi), eps, bits in (((0.0, 100.0), 1.0, 16), ((-3.7, 1e6), 0.3, 16), ((-1.0, 1.0), 4.0, 20),
                                ((1e-3, 2e-3), 60.0, 12)):
        m = make_numeric("PM", eps=eps, lo=lo, hi=hi, grid_bits=bits)
        v = _values(g, n, lo, hi)
        key = noise_key(g)
        fused = pk.pm_randomize_values(v, lo, hi, key, *m.kernel_args(), np.empty(n, dtype=m.report_dtype))
        unit = pk.pm_randomize(to_unit(v, lo, hi)[0], key, *m.kernel_args(), np.empty(n, dtype=m.report_dtype))
        assert np.array_equal(fused, unit)
        assert np.array_equal(fused, pk.np_pm_randomize_values(v, lo, hi, key, *m.kernel_args(),
                                                               dtype=m.report_dtype))
        # the mechanism (fused path) and the labelled simulation mode: the same reports from the same seed
        assert np.array_equal(m.randomize(v, np.random.default_rng(7)),
                              pk.pm_randomize(m.prepare(v)[0], noise_key(np.random.default_rng(7)), *m.kernel_args(),
                                              np.empty(n, dtype=m.report_dtype)))
    if n <= 300:  # redraws (slow in the twin)
        v = _values(g, n, 0.0, 10.0)
        key = noise_key(g)
        a = pk.pm_randomize_values(v, 0.0, 10.0, key, *FORCED, np.empty(n, dtype=np.uint32))
        assert np.array_equal(a, pk.np_pm_randomize_values(v, 0.0, 10.0, key, *FORCED))
        assert np.array_equal(a, pk.pm_randomize(to_unit(v, 0.0, 10.0)[0], key, *FORCED, np.empty(n, np.uint32)))


def test_pm_randomize_refuses_nan_and_keeps_other_shapes_on_the_unit_path():
    m = make_numeric("PM", eps=1.0, lo=0.0, hi=10.0)
    with pytest.raises(LDPError, match="NaN"):
        m.randomize(np.array([1.0, np.nan]))
    ints = m.randomize(np.arange(11), np.random.default_rng(1))  # integers: as float64
    assert np.array_equal(ints, m.randomize(np.arange(11.0), np.random.default_rng(1)))
    assert m.randomize(np.zeros(0)).shape == (0,) and ints.dtype == m.report_dtype


def test_warmup_compiles_every_numeric_mechanism_once():
    from estimators.sketch.registry import OPEN_PROTOCOLS
    from ldpstream_dev.kernels_warmup import NUMERIC_FAMILIES, partition, plan

    names = [n for _, family in NUMERIC_FAMILIES for n in family]
    assert sorted(names) == sorted([*MECHANISMS, "k-of-d"])
    for parts in (1, 2, 3, 4):
        split = plan(parts)
        assert sorted(n for _, numeric, _ in split for n in numeric) == sorted(names)
        assert [protocols for protocols, _, _ in split] == partition(parts)
        assert sorted(n for _, _, open_domain in split for n in open_domain) == sorted(
            [*OPEN_PROTOCOLS, "PEM", "RAPPOR"])


def test_bench_protocols_includes_the_numeric_mechanisms():
    from ldpstream_cli.cli import _bench_selection, app

    runner = CliRunner()
    res = runner.invoke(app, ["bench", "protocols", "-p", "PM", "-p", "Duchi", "--n", "300", "--repeats", "1",
                              "--json"])
    assert res.exit_code == 0, res.output
    tables = json.loads(res.stdout)
    assert [t["columns"][0] for t in tables] == ["mechanism"]  # -p names mechanisms only: no protocol table
    assert tables[0]["columns"] == ["mechanism", "report", "randomize", "randomize target", "support+estimate",
                                    "aggregate target"]
    rows = {row[0]: row for row in tables[0]["rows"]}
    assert set(rows) == {"PM", "Duchi"} and rows["PM"][1] == "uint16"
    assert all(row[2] not in ("-", "") and row[4] not in ("-", "") for row in rows.values())  # rates measured
    assert rows["PM"][3] != "-" and rows["PM"][5] != "-" and rows["Duchi"][3] == "-"  # PM's targets (issue 23)
    # what runs: every mechanism by default, with -p all or -p numeric; none with -s alone
    protocols = list(estimators.PROTOCOLS)
    assert _bench_selection(None, None) == (protocols, list(MECHANISMS))
    assert _bench_selection(["all"], ["SPL[GRR]"]) == (protocols, list(MECHANISMS))
    assert _bench_selection(["numeric", "OLH"], None) == (["OLH"], list(MECHANISMS))
    assert _bench_selection(["HM", "OLH", "PM"], None) == (["OLH"], ["HM", "PM"])
    assert _bench_selection(None, ["SPL[GRR]"]) == ([], [])


def test_bench_pipeline_builds_a_numeric_attribute():
    from ldpstream_cli.bench_pipeline import attribute_spec, make_workload, report_nbytes
    from wire import envelope

    assert attribute_spec("PM", 100, eps=1.0) == {"name": "x", "type": "numeric", "range": [0.0, 100.0],
                                                  "mechanism": "PM", "eps": 1.0}
    assert attribute_spec("GRR", 100, eps=1.0) == {"name": "x", "k": 100, "protocol": "GRR", "eps": 1.0}
    assert report_nbytes("PM", 100, eps=1.0) == 2 and report_nbytes("GRR", 100, eps=1.0) == 1
    work = make_workload("PM", 100, 2, 50, 20, eps=1.0)
    attr = work.campaign.attribute("x")
    assert attr.numeric and attr.protocol.name == "PM" and (attr.protocol.lo, attr.protocol.hi) == (0.0, 100.0)
    assert work.reports == 100 and [len(s) for s in work.steps] == [3, 3]
    env = envelope.parse(work.steps[0][0])
    assert env.count == 20 and env.protocol == "PM"
