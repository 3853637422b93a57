"""`ldp soak` (issue 8): steady fleet load with every fault kind, then every count against the offline truth.

The end-to-end test runs the real command (local stack, worker processes, `ldp produce` child) for half a
minute with at least one fault of each kind (the soak injects the whole rotation even past its window) and
checks its JSON report; the comparison itself is checked on hand-made data (a double count, a loss, a missing
or wrong final must each fail the verdict); a SIGTERM must leave no process behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ldpstream_cli.soak import FAULT_KINDS, SoakConfig, compare, soak_campaign
from wire.campaign import Campaign

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "deploy" / "campaigns" / "demo.toml"


def _soak_command(run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "ldpstream_cli", "soak", "--run-dir", str(run_dir), *args]


def _processes_in(run_dir: Path) -> set[int]:
    """Live processes whose working directory or an argument lies in ``run_dir`` (stack, workers, fleet)."""
    mark = str(run_dir.resolve())
    found = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            args = (d / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(d / "cwd")
        except OSError:
            continue
        if mark in args or cwd.startswith(mark):
            found.add(int(d.name))
    return found


def _wait_gone(run_dir: Path, seconds: float = 15.0) -> set[int]:
    deadline = time.monotonic() + seconds
    while (left := _processes_in(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


# --------------------------------------------------------------------------- the comparison
def _truth() -> dict[tuple[str, int], tuple[np.ndarray, int]]:
    return {("a", 0): (np.array([3, 1, 6]), 10), ("a", 1): (np.array([2, 2, 6]), 10)}


def _final(t: int, n: int, revision: int = 0, latency: float = 0.01, **extra) -> dict:
    return {"campaign": "c", "attribute": "a", "t": t, "n": n, "final": True, "revision": revision,
            "trigger": "watermark" if revision == 0 else "late", "latency_seconds": latency, **extra}


def test_compare_passes_exact_counts_and_one_final_per_step() -> None:
    truth = _truth()
    out = compare(truth, dict(truth), [_final(0, 10, complete=True, fence=3), _final(1, 10, latency=0.03),
                                       {"attribute": "a", "t": 1, "n": 4, "final": False}],
                  {"a": {0: (10, 0), 1: (10, 0)}})
    assert out["problems"] == []
    assert (out["lost_reports"], out["double_counted_reports"], out["steps_finalized"]) == (0, 0, 2)
    assert out["finals_per_step"] == {"1 final(s)": 2} and out["triggers"] == {"watermark": 2}
    assert (out["rev0_finals_wrong_n"], out["duplicate_rev0_messages"], out["revisions"], out["incomplete_finals"],
            out["steps_without_final"]) == (0, 0, 0, 0, 0)
    assert out["latency_p50"] == pytest.approx(0.02)


def test_compare_fails_a_double_count_a_loss_and_wrong_finals() -> None:
    truth = _truth()
    counted = {("a", 0): (np.array([6, 2, 12]), 20), ("a", 1): (np.array([2, 2, 5]), 9)}
    out = compare(truth, counted, [_final(0, 20), _final(0, 10), _final(0, 12, revision=1)],
                  {"a": {0: (12, 1)}})
    assert out["double_counted_reports"] == 10 and out["lost_reports"] == 1
    assert out["steps_with_wrong_counts"] == 2
    assert out["rev0_finals_wrong_n"] == 1 and out["revisions"] == 1 and out["duplicate_rev0_messages"] == 1
    assert out["steps_finalized"] == 1 and out["steps_without_final"] == 1 and out["store_finals_ok"] == 0
    assert out["finals_per_step"] == {"0 final(s)": 1, "2 final(s)": 1}
    text = " | ".join(out["problems"])
    for what in ("counted twice", "lost", "without a revision-0 final", "more than one revision-0 final",
                 "finals index", "with n=20"):
        assert what in text, what


def _exact(truth) -> dict:
    return {"counted": dict(truth), "store_finals": {"a": {t: (n, 0) for (_, t), (_, n) in truth.items()}}}


def test_compare_fails_each_finals_rule_alone() -> None:
    """With exact counts and the store's index right, each rule of the final check fails the run by itself."""
    truth = _truth()
    cases = {
        "a partial revision-0 final, then the revision that completes it": (
            [_final(0, 6), _final(0, 10, revision=1), _final(1, 10)], "with n=6"),
        "two revision-0 messages of one step, both right": (
            [_final(0, 10), _final(0, 10), _final(1, 10)], "more than one revision-0 final (1 extra"),
        "a final with complete=false, though no loss was expected": (
            [_final(0, 10, complete=False), _final(1, 10)], "complete=false"),
        "a step without a final": ([_final(0, 10)], "without a revision-0 final"),
    }
    for what, (published, needle) in cases.items():
        out = compare(truth, **_exact(truth), published=published)
        assert any(needle in p for p in out["problems"]), (what, out["problems"])
        assert len(out["problems"]) == 1, (what, out["problems"])


def test_compare_counts_revisions_without_failing_on_them_alone() -> None:
    """A revision follows a right revision-0 final only if more than the truth was counted: the counts fail."""
    truth = _truth()
    published = [_final(0, 10), _final(0, 11, revision=1), _final(1, 10)]
    out = compare(truth, **_exact(truth), published=published)
    assert out["revisions"] == 1 and out["problems"] == []
    over = {**truth, ("a", 0): (np.array([3, 1, 7]), 11)}
    out = compare(truth, over, published, {"a": {0: (11, 1), 1: (10, 0)}})
    assert out["revisions"] == 1 and any("counted twice" in p for p in out["problems"])


def test_compare_with_an_expected_loss_accepts_short_finals_that_say_so() -> None:
    truth = _truth()
    flagged = [_final(0, 7, complete=False), _final(1, 10)]
    out = compare(truth, **_exact(truth), published=flagged, loss_expected=True)
    assert out["problems"] == [] and out["incomplete_finals"] == 1 and out["rev0_finals_wrong_n"] == 1
    # a short final that claims to be complete fails, loss or not; so do duplicates
    out = compare(truth, **_exact(truth), published=[_final(0, 7, complete=True), _final(1, 10)], loss_expected=True)
    assert any("with n=7" in p and "marked complete" in p for p in out["problems"]), out["problems"]
    out = compare(truth, **_exact(truth), published=[*flagged, _final(1, 10, complete=False)], loss_expected=True)
    assert any("more than one revision-0 final" in p for p in out["problems"]), out["problems"]
    # without an expected loss the same flagged final fails
    out = compare(truth, **_exact(truth), published=flagged)
    assert any("complete=false" in p for p in out["problems"]) and any("with n=7" in p for p in out["problems"])


def test_soak_campaign_sets_the_lateness(tmp_path) -> None:
    path = soak_campaign(DEMO, tmp_path / "c.toml", 1234.0)
    original, soak = Campaign.load(DEMO), Campaign.load(path)
    assert soak.lateness_seconds == 1234.0
    assert soak.fingerprint == original.fingerprint  # lateness is a server-side setting
    # by default the soak keeps the campaign's own lateness (2 s in the demo), no longer an hour
    assert Campaign.load(soak_campaign(DEMO, tmp_path / "d.toml")).lateness_seconds == original.lateness_seconds == 2.0
    assert SoakConfig().lateness is None
    with pytest.raises(ValueError):
        SoakConfig(lateness=0)


# --------------------------------------------------------------------------- the soak itself
@pytest.mark.timeout(600)
def test_half_minute_soak_with_every_fault_counts_exactly(tmp_path) -> None:
    run_dir, report_path = tmp_path / "run", tmp_path / "report.json"
    proc = subprocess.run(_soak_command(run_dir, "--seconds", "30", "--fault-every", "4", "--devices", "5000",
                                        "--batch-size", "2000", "--json", str(report_path)),
                          cwd=ROOT, capture_output=True, text=True, timeout=540,
                          env={**os.environ, "COLUMNS": "160"})
    output = proc.stdout + proc.stderr
    assert report_path.exists(), output[-4000:]
    report = json.loads(report_path.read_text())
    assert proc.returncode == 0 and report["ok"], f"{report['problems']}\n{output[-4000:]}"
    assert set(report["faults"]) == set(FAULT_KINDS) and min(report["faults"].values()) >= 1, report["faults"]
    steps = report["steps_expected"] * len(report["attributes"])
    assert report["reports_counted"] == report["reports_expected"] == 5000 * report["steps_expected"] * \
        report["reports_per_device"]
    assert report["lost_reports"] == report["double_counted_reports"] == report["steps_with_wrong_counts"] == 0
    assert report["steps_finalized"] == report["store_finals_ok"] == report["finals_expected"] == steps
    assert report["finals_per_step"] == {"1 final(s)": steps} and report["steps_without_final"] == 0
    assert report["rev0_finals_wrong_n"] == report["duplicate_rev0_messages"] == report["revisions"] == 0
    assert report["incomplete_finals"] == 0
    assert report["lateness_seconds"] == 2.0  # the demo campaign's own: pauses of the faults are longer
    # the injected duplicate (sent after its step's final) was skipped, not counted
    assert report["duplicate_batches_skipped"] >= report["duplicates_injected"] >= 1
    assert report["latency_p50"] is not None and report["latency_p99"] >= report["latency_p50"]
    planned = [e["kind"] for e in report["fault_log"] if e["planned"]]
    assert planned[:len(FAULT_KINDS)] == list(FAULT_KINDS)  # in rotation order
    assert not _wait_gone(run_dir), "processes left behind"


@pytest.mark.timeout(300)
def test_soak_stops_everything_on_sigterm(tmp_path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "soak.log"
    with open(log, "w") as out:
        soak = subprocess.Popen(_soak_command(run_dir, "--seconds", "300", "--workers", "1", "--devices", "2000",
                                              "--fault-every", "3", "--faults", "duplicate_batch"),
                                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "160"})
    try:
        deadline = time.monotonic() + 180
        while "fault 1:" not in log.read_text() and time.monotonic() < deadline:
            assert soak.poll() is None, log.read_text()
            time.sleep(0.5)
        assert "fault 1:" in log.read_text(), log.read_text()
        started = _processes_in(run_dir)
        assert len(started) >= 5, started  # redis, object server, tansu, a worker, the fleet
        soak.send_signal(signal.SIGTERM)
        assert soak.wait(timeout=120) == 130, log.read_text()
    finally:
        if soak.poll() is None:
            soak.kill()
    text = log.read_text()
    assert "interrupted" in text and "cleaned up" in text
    assert not _wait_gone(run_dir), text
