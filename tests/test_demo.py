"""`ldp demo` prints its dashboard URL (the page answers) and stops everything it started on SIGTERM, as on
Ctrl-C (no tansu, Redis or worker left); run from any directory it finds its campaign, and it leaves no
`ldp-demo-*` run directory in the temporary directory unless --keep-run-dir."""
from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


def _children(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (from /proc; zombies excluded)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                parent[int(d.name)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - out
        out |= frontier
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _private_tmp(tmp_path: Path) -> Path:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return tmp


def test_demo_cleans_up_on_sigterm(tmp_path):
    log = tmp_path / "demo.log"
    tmp = _private_tmp(tmp_path)
    with open(log, "w") as out:  # not from the repository root: the default campaign is the CLI's own
        demo = subprocess.Popen([sys.executable, "-m", "ldpstream_cli", "demo", "--devices", "2000", "--steps", "50",
                                 "--workers", "1", "--step-seconds", "1"], cwd=tmp_path, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "120", "TMPDIR": str(tmp)},
                                # its own process group, as a demo in a terminal: no signal meant for the test
                                # runner's group reaches it (twice the demo died by a SIGINT nobody here sends)
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "dashboard: http" not in log.read_text() and time.monotonic() < deadline:
            assert demo.poll() is None, log.read_text()
            time.sleep(0.5)
        assert "workers:" in log.read_text(), log.read_text()
        # the printed dashboard URL serves the built-in page
        url = re.search(r"dashboard: (http://\S+/)", log.read_text()).group(1)
        with urllib.request.urlopen(url, timeout=10) as page:
            assert page.status == 200 and b"dashboard.js" in page.read()
        started = _children(demo.pid)
        assert len(started) >= 3  # tansu, redis-server, a worker (at least)
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(timeout=120) == 130, log.read_text()[-4000:]
    finally:
        if demo.poll() is None:
            demo.kill()
    text = log.read_text()
    assert "interrupted" in text and "cleaned up" in text
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in started if _alive(p)], text
    assert not list(tmp.glob("ldp-demo-*")), text


def test_demo_runs_to_the_end_and_leaves_no_run_directory(tmp_path):
    """A second, complete run (exit 0): its run directory is removed too."""
    tmp = _private_tmp(tmp_path)
    run = subprocess.run([sys.executable, "-m", "ldpstream_cli", "demo", "--devices", "1000", "--steps", "1",
                          "--workers", "1", "--step-seconds", "0"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "120", "TMPDIR": str(tmp)}, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "final estimates" in run.stdout and "cleaned up" in run.stdout
    assert not list(tmp.glob("ldp-demo-*")), run.stdout


@pytest.mark.parametrize("keep", [False, True])
def test_keep_run_dir(tmp_path, monkeypatch, keep):
    """The removal itself, without a stack: ``run_demo`` keeps the run directory only with ``keep_run_dir``."""
    from rich.console import Console

    from ldpstream_cli import demo
    from ldpstream_cli.common import DEMO_CAMPAIGN

    monkeypatch.setenv("TMPDIR", str(_private_tmp(tmp_path)))
    monkeypatch.setattr(demo.tempfile, "tempdir", None)  # re-read TMPDIR
    seen: list[Path] = []

    def fake_run(run: Path, *args: object) -> int:
        (run / "stack").mkdir()
        seen.append(run)
        return 0

    monkeypatch.setattr(demo, "_run", fake_run)
    out = io.StringIO()
    assert demo.run_demo(DEMO_CAMPAIGN, 10, 1, 1, 10, 0.0, None, 1, Console(file=out), keep_run_dir=keep) == 0
    assert seen[0].name.startswith("ldp-demo-") and seen[0].parent == tmp_path / "tmp"
    assert seen[0].is_dir() == keep
    assert (f"run directory kept: {seen[0]}" in out.getvalue()) == keep
