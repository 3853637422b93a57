"""`ldp bench protocols` covers the multidimensional solutions next to multi-freq-ldpy (issue 9, point 5).

A smoke test with a tiny n: the command runs, prints a row per solution with our rates, the peer's and
the ratios. Nothing here asserts a timing.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ldpstream_cli import bench_peer
from ldpstream_cli.cli import _DEFAULT_SOLUTIONS, _solution_specs

SOLUTIONS = ("SPL[GRR]", "SMP[OUE]", "RS+FD[OUE-z]", "L-SPL[L-OSUE]", "ALLOMFREE")


def test_solution_specs_parse() -> None:
    assert _solution_specs(["RS+FD[OUE-z]", "ALLOMFREE", " L-SMP[L-GRR] "]) == [
        ("RS+FD", "OUE-z"), ("ALLOMFREE", None), ("L-SMP", "L-GRR")]
    assert len(_solution_specs(["default"])) == len(_DEFAULT_SOLUTIONS)
    for bad in ("SPL[", "SPL[]", "SPL[GRR"):
        with pytest.raises(ValueError):
            _solution_specs([bad])


def test_every_default_solution_has_a_peer_equivalent() -> None:
    assert all(spec in bench_peer.PEER_SOLUTIONS for spec in _solution_specs(["default"]))


def test_bench_protocols_prints_solution_ratios() -> None:
    assert bench_peer.peer_available(), "the peer is part of the bench extra: pip install -e '.[bench]'"
    args = [sys.executable, "-m", "ldpstream_cli", "bench", "protocols", "--ks", "2,5,20", "--n", "300",
            "--repeats", "1", "--peer-seconds", "0.05"]
    for s in SOLUTIONS:
        args += ["-s", s]
    run = subprocess.run(args, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "250"})
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "multidimensional solutions, d=3, ks=2,5,20" in out
    assert "protocol throughput" not in out  # -s alone: solutions only
    for label in SOLUTIONS:
        rows = [line for line in out.splitlines() if line.startswith(f"│ {label} ")]
        assert len(rows) == 1, f"no row for {label}:\n{out}"
        cells = [c.strip() for c in rows[0].strip("│").split("│")]
        assert len(cells) == 7, rows[0]
        assert all(cells[i] != "-" for i in (1, 2, 4, 5)), rows[0]  # ours and the peer's rates
        assert re.fullmatch(r"[\d,]+x (≥20 ok|<20!)", cells[3]), rows[0]
        assert re.fullmatch(r"[\d,]+x (≥20 ok|<20!)", cells[6]), rows[0]
