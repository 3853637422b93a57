"""The `ldp` command in a terminal and out of one: tables never cut when stdout is a pipe, `--json` / `--csv`,
an invalid option exits 2 once with one line on stderr, `ldp --version`, the demo campaign shipped with the CLI."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

import estimators
from ldpstream_cli.cli import _LISTED_SOLUTIONS, app
from ldpstream_cli.common import DEMO_CAMPAIGN
from ldpstream_cli.options import check_options
from ldpstream_cli.terminal import print_table, table_data

ROOT = Path(__file__).resolve().parents[1]


def _ldp(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``ldp ARGS`` in a child process whose stdout and stderr are pipes (not a terminal), no COLUMNS set."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run([sys.executable, "-m", "ldpstream_cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def test_protocols_through_a_pipe_prints_every_cell_in_full(tmp_path):
    """`ldp protocols | cat`: the tables take their natural width (not 80 columns), nothing is cut."""
    run = _ldp("protocols", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "calibration=exact" in run.stdout
    assert "…" not in run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) > 80
    rows = {line.split("│")[1].strip() for line in run.stdout.splitlines() if line.startswith("│")}
    assert set(estimators.PROTOCOLS) <= rows
    # the multidimensional solutions: every registered one, in the standard set or beside it
    assert set(_LISTED_SOLUTIONS) <= rows
    assert {label.partition("[")[0] for label in _LISTED_SOLUTIONS} == set(estimators.SOLUTIONS)


def test_an_invalid_option_exits_2_with_one_line_on_stderr():
    """`ldp protocols --eps -1` (a child process): exit 2, nothing on stdout, one line on stderr."""
    run = _ldp("protocols", "--eps", "-1")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout == "" and run.stderr == "error: --eps must be a positive number, got -1\n"


@pytest.mark.parametrize("args, flag", [
    (("protocols", "--k", "1"), "--k"),
    (("protocols", "--eps-1", "3"), "--eps-1"),
    (("protocols", "--ks", "2,x"), "--ks"),
    (("bench", "protocols", "--n", "0"), "--n"),
    (("bench", "protocols", "--peer-seconds", "0"), "--peer-seconds"),
    (("bench", "pipeline", "--runs", "0"), "--runs"),
    (("simulate", "--eps-inf", "nan"), "--eps-inf"),
    (("demo", "--devices", "0"), "--devices"),
])
def test_every_numeric_option_is_checked_once(args, flag):
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 2, res.output
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], res.stderr


def test_version():
    run = _ldp("--version")
    assert run.returncode == 0 and run.stdout == f"ldp-stream {version('ldp-stream')}\n"


def test_protocols_as_json_and_csv():
    runner = CliRunner()
    res = runner.invoke(app, ["protocols", "--k", "20", "--json"])
    assert res.exit_code == 0, res.output
    tables = json.loads(res.stdout)
    assert [t["columns"][0] for t in tables] == ["protocol", "solution"]
    protocols = {row[0]: row for row in tables[0]["rows"]}
    assert set(protocols) == set(estimators.PROTOCOLS)
    assert "calibration=exact" in protocols["L-GRR"][1] and protocols["GRR"][2] == 1.0  # ε1 as a number
    assert {row[0] for row in tables[1]["rows"]} == set(_LISTED_SOLUTIONS)
    res = runner.invoke(app, ["protocols", "--k", "20", "--csv"])
    assert res.exit_code == 0, res.output
    first = res.stdout.split("\n\n")[0].splitlines()
    assert first[0].startswith("# protocols at k=20")
    rows = list(csv.reader(first[1:]))
    assert rows[0][:2] == ["protocol", "parameters"] and {r[0] for r in rows[1:]} == set(estimators.PROTOCOLS)
    both = runner.invoke(app, ["protocols", "--json", "--csv"])
    assert both.exit_code == 2 and both.stdout == ""


def test_print_table_is_uncut_off_a_terminal_and_table_data_is_plain():
    t = Table(title="t")
    t.add_column("name")
    t.add_column("value", justify="right")
    t.add_row("a" * 70, "[green]calibration=exact[/green]")
    out = io.StringIO()
    console = Console(file=out, width=40)  # not a terminal
    print_table(console, t)
    assert "a" * 70 in out.getvalue() and "calibration=exact" in out.getvalue() and "…" not in out.getvalue()
    assert console.width == 40
    assert table_data(t) == {"title": "t", "columns": ["name", "value"], "rows": [["a" * 70, "calibration=exact"]]}


def test_check_options():
    check_options(k=2, eps=0.5, eps_inf=2.0, eps_1=1.0, n=1, peer_seconds=0.1, runs=None)
    for bad, flag in ((dict(k=1), "--k"), (dict(eps=0.0), "--eps"), (dict(eps=float("inf")), "--eps"),
                      (dict(n=0), "--n"), (dict(peer_seconds=0), "--peer-seconds"),
                      (dict(eps_inf=1.0, eps_1=1.0), "--eps-1")):
        with pytest.raises(ValueError, match=flag):
            check_options(**bad)


def test_the_demo_campaign_ships_with_the_cli():
    """`ldp demo` finds its campaign from any directory: the package's copy equals deploy/campaigns/demo.toml."""
    assert DEMO_CAMPAIGN.is_relative_to(ROOT / "ldpstream_cli")
    assert DEMO_CAMPAIGN.read_bytes() == (ROOT / "deploy" / "campaigns" / "demo.toml").read_bytes()


def test_progress_prints_plain_lines_where_the_console_is_not_a_terminal(monkeypatch) -> None:
    """A long run written to a log file (not a terminal, where rich draws nothing until the end) still shows its
    progress: a plain line at most every LOG_PROGRESS_EVERY seconds, and one when done."""
    import io

    from rich.console import Console

    from ldpstream_cli import terminal

    clock = [100.0]
    monkeypatch.setattr(terminal.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=100)
    bar = terminal.progress_bar(console)
    bar.get_time = lambda: clock[0]  # type: ignore[method-assign]
    tid = bar.add_task("tasks", total=10)
    for _ in range(10):
        clock[0] += 10.0  # every 10 s: a line every third advance (30 s), and the last
        bar.advance(tid)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("tasks:")]
    assert lines == ["tasks: 3/10 (30%), 30 s, about 70 s left", "tasks: 6/10 (60%), 60 s, about 40 s left",
                     "tasks: 9/10 (90%), 90 s, about 10 s left", "tasks: 10/10 (100%), 100 s"], lines
