"""The test schedule of ``tests/conftest.py`` names tests that exist (a renamed test would silently lose its
place at the front of the run)."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import RUN_FIRST, TIMED_TOGETHER, _start_rank

ROOT = Path(__file__).resolve().parents[1]


def test_every_run_first_entry_names_a_test_module_or_function() -> None:
    missing = []
    for entry in RUN_FIRST:
        path, _, name = entry.partition("::")
        file = ROOT / path
        if not file.is_file():
            missing.append(entry)
            continue
        functions = {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
        if name and not any(f == name for f in functions):
            missing.append(entry)
    assert not missing, f"RUN_FIRST names no test: {missing}"
    assert len(set(RUN_FIRST)) == len(RUN_FIRST)


def test_timed_modules_exist_and_ranks_follow_the_list() -> None:
    assert all((ROOT / "tests" / f"{m}.py").is_file() for m in TIMED_TOGETHER)
    assert _start_rank(RUN_FIRST[0]) == 0
    assert _start_rank("tests/test_pipeline.py::test_exactly_once_after_sigkill[2]") == \
        RUN_FIRST.index("tests/test_pipeline.py::test_exactly_once_after_sigkill")
    assert _start_rank("tests/test_cli.py::test_version") == len(RUN_FIRST)


def test_kernel_warmup_groups_cover_every_protocol_once() -> None:
    import estimators
    from ldpstream_dev.kernels_warmup import FAMILIES, partition

    names = [n for _, family in FAMILIES for n in family]
    assert sorted(names) == sorted(estimators.PROTOCOLS)
    for parts in (1, 2, 3, 4):
        split = partition(parts)
        assert sorted(n for part in split for n in part) == sorted(names) and all(split)
