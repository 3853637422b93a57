"""`ldp demo` prints its dashboard URL (the page answers) and stops everything it started on SIGTERM, as on
Ctrl-C (no tansu, Redis or worker left)."""
from __future__ import annotations

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


def test_demo_cleans_up_on_sigterm(tmp_path):
    log = tmp_path / "demo.log"
    with open(log, "w") as out:
        demo = subprocess.Popen([sys.executable, "-m", "ldpstream_cli", "demo", "--devices", "2000", "--steps", "50",
                                 "--workers", "1", "--step-seconds", "1"], cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "120"})
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
        assert demo.wait(timeout=120) == 130
    finally:
        if demo.poll() is None:
            demo.kill()
    text = log.read_text()
    assert "interrupted" in text and "cleaned up" in text
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in started if _alive(p)], text
