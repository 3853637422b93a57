"""`ldp soak`: the local stack under steady fleet load, with faults on a schedule (issue 8).

What runs
    A local stack (tansu with durable storage + redis-server with its AOF), ``workers`` stream-app
    worker processes in one consumer group (``partitions`` partitions, so an added worker gets
    some), and a seeded fleet (``ldp produce --seed --state-dir --rate``, a child process) sending
    one step of ``devices`` reports per attribute every ``step_seconds``, each step's batches
    followed by its watermarks.

Faults, one every ``fault_every`` seconds, in rotation (:data:`FAULT_KINDS`)
    ``worker_kill`` (SIGKILL, every other time the estimator lease holder; a replacement starts),
    ``duplicate_batch`` (a batch the fleet already sent, sent again: same reports, same batch id),
    ``producer_kill`` (SIGKILL of ``ldp produce``, resumed from its state directory),
    ``worker_add``, ``redis_restart`` and ``broker_restart`` (SIGKILL the first time, SIGTERM the
    next, alternating), ``worker_remove`` (SIGTERM). Each is logged with its time. A worker or
    producer that exits on its own is restarted too and reported as an unplanned exit.

The truth
    The fleet runs in simulation mode: every value, memo key and noise draw of step ``t`` comes
    from generators seeded by ``(seed, attribute, purpose, t)``, and a fleet resumed from its state
    directory holds the memo state and values committed after its last acknowledged step. So a
    killed and resumed producer re-sends a partly sent step with exactly the reports (and batch
    ids) of the first attempt, and the counts every step must end with are those of the same fleet
    re-simulated here, offline and without interruption (:class:`OfflineTruth`). (Re-using the
    killed producer's own records would not do: they die with it. Without ``--seed`` a re-sent
    step would carry fresh noise under the old batch ids, and the store would keep a mix of the
    two attempts that no offline run reproduces.)

The end
    Faults stop at the end of the fault window (``seconds``, or earlier once the fleet has sent
    every step, but never before every fault kind of the rotation ran once); the
    worker count is restored, the fleet finishes, the soak waits (bounded) for every final, then
    compares (:func:`compare`): counts and ``n`` of every ``(attribute, step)`` in Redis against the
    truth, the finals published on ``ldp.estimates`` (exactly one revision-0 final message per step,
    its ``n`` the truth's; no final with ``"complete": false``, since none of these faults loses data)
    and the store's finals index. :class:`SoakReport` holds the figures; the exit code is 0 only if
    nothing is off. Everything started is stopped on exit, Ctrl-C and SIGTERM.

Lateness
    The campaign runs with its own ``lateness_seconds`` (2 s in the demo campaign), so every pause a
    fault causes that is longer than that tests that finals wait for the data, not for the clock
    (issue 18). ``lateness`` (``--lateness``) sets another value, e.g. an hour, to see the counts
    alone under faults.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ldpstream_dev.errors import StackError
from ldpstream_dev.stack import LocalStack
from ldpstream_dev.workers import WorkerProcess, consume_json, keep_every_step, produce_messages, read_counts
from estimators.errors import LDPError
from estimators.randomness import SimulationWarning
from producers.fleet import Fleet, FleetConfig, StepData, ensure_topic
from stream_app.store import CountStore
from wire.campaign import Campaign
from wire.envelope import pack_reports
from wire.topics import ESTIMATES_TOPIC, REPORTS_TOPIC, message_key
from wire.transport import redact_url

from .common import DEMO_CAMPAIGN
from .terminal import print_table

__all__ = ["FAULT_KINDS", "OfflineTruth", "SoakConfig", "SoakReport", "compare", "run_soak"]

#: The faults, in the order of the rotation.
FAULT_KINDS = ("worker_kill", "duplicate_batch", "producer_kill", "worker_add", "redis_restart", "worker_remove",
               "broker_restart")
_ROOT = Path(__file__).resolve().parent.parent
APP_ID = "ldp-soak"
#: How long the end of a soak waits for every worker's ``/health`` to answer 200 (a worker restarted by the
#: last fault may still be starting or catching up on a loaded machine).
HEALTH_WAIT_SECONDS = 30.0
_DATASET, _P_CHANGE = "syn", 0.25  # the fleet's dataset, passed to `ldp produce` and to the offline truth
_METRICS = ("ldp_duplicate_batches_total", "ldp_reports_total", "ldp_rejected_batches_total",
            "ldp_store_resets_total", "ldp_count_regressions_total", "ldp_unrepairable_losses_total")


@dataclass
class SoakConfig:
    """What to run and for how long (``ldp soak`` options)."""

    campaign: Path = DEMO_CAMPAIGN
    seconds: float = 600.0          # the fault window; the fleet sends seconds / step_seconds steps
    devices: int = 20_000
    step_seconds: float = 3.0
    batch_size: int = 5_000
    workers: int = 3
    partitions: int = 8
    fault_every: float = 25.0
    faults: tuple[str, ...] = FAULT_KINDS
    seed: int = 8
    lateness: float | None = None   # the campaign's lateness_seconds in the soak (None: the campaign's own)
    producer_down_seconds: float = 2.0
    finish_timeout: float = 300.0   # after the fault window: the fleet finishing, then every final
    progress_every: int = 10        # a progress line every this many steps
    run_dir: Path | None = None
    keep_run_dir: bool = False

    def __post_init__(self) -> None:
        unknown = [f for f in self.faults if f not in FAULT_KINDS]
        if unknown:
            raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(FAULT_KINDS)}")
        if self.seconds <= 0 or self.step_seconds <= 0 or self.fault_every <= 0:
            raise ValueError("seconds, step_seconds and fault_every must be > 0")
        if self.devices < 1 or self.workers < 1 or self.partitions < 1 or self.batch_size < 1:
            raise ValueError("devices, workers, partitions and batch_size must be >= 1")
        if self.lateness is not None and not self.lateness > 0:
            raise ValueError("lateness must be > 0 seconds (or None: the campaign's own)")

    @property
    def steps(self) -> int:
        """Steps the fleet sends."""
        return max(1, math.ceil(self.seconds / self.step_seconds))

    def fleet_config(self, campaign: Campaign, *, steps: int | None = None, state_dir: Path | None = None,
                     rate: float | None = None) -> FleetConfig:
        """The seeded fleet of this soak: what ``ldp produce`` runs (:class:`ProducerProcess`, or
        :func:`producers.fleet.publish` in-process) and :class:`OfflineTruth` re-simulates."""
        return FleetConfig(campaign, self.devices, self.steps if steps is None else steps, dataset=_DATASET,
                           p_change=_P_CHANGE, batch_size=self.batch_size, seed=self.seed, state_dir=state_dir,
                           rate=rate)


# --------------------------------------------------------------------------- the truth
class OfflineTruth:
    """The seeded fleet of the soak, re-simulated offline step by step: ``expected[(attr, t)] = (support, n)``.

    :meth:`advance` simulates up to a step; the reports of the last simulated step stay available for
    re-sending one of its batches (:meth:`batch`)."""

    def __init__(self, campaign: Campaign, config: SoakConfig) -> None:
        with warnings.catch_warnings():  # the soak says once that it runs in simulation mode
            warnings.simplefilter("ignore", SimulationWarning)
            self.fleet = Fleet(config.fleet_config(campaign))
        self.batch_size = config.batch_size
        self.expected: dict[tuple[str, int], tuple[np.ndarray, int]] = {}
        self.last: dict[str, StepData] = {}
        self.next_step = 0

    def advance(self, through: int) -> None:
        """Simulate every step up to ``through`` (inclusive) not simulated yet."""
        for t in range(self.next_step, through + 1):
            for unit in self.fleet.units:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", SimulationWarning)
                    unit_data = self.fleet.randomize_unit(unit, t)
                for data in unit_data:
                    self.expected[(data.attribute, t)] = (data.support, data.n)
                    self.last[data.attribute] = data
            self.next_step = t + 1

    def batches(self, attr: str) -> int:
        """Batches of ``attr`` in the last simulated step (fewer for an attribute a group's devices sample)."""
        return max(1, math.ceil(self.last[attr].n / self.batch_size))

    def batch(self, attr: str, index: int) -> tuple[int, np.ndarray]:
        """``(t, reports)`` of batch ``index`` of ``attr`` in the last simulated step."""
        data = self.last[attr]
        lo = index * self.batch_size
        return data.t, data.reports[lo:lo + self.batch_size]


# --------------------------------------------------------------------------- the producer
class ProducerProcess:
    """``ldp produce --seed --state-dir`` in a child process, resumable after a kill."""

    def __init__(self, campaign_file: Path, bootstrap: str, config: SoakConfig, state_dir: Path, log_path: Path,
                 total_steps: int, reports_per_device: int) -> None:
        self.campaign_file, self.bootstrap, self.config = campaign_file, bootstrap, config
        self.state_dir, self.log_path, self.total_steps = state_dir, log_path, total_steps
        self.rate = config.devices * reports_per_device / config.step_seconds
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def committed_steps(self) -> int:
        """Steps the fleet committed (acknowledged by the broker, memo state saved)."""
        try:
            return int(json.loads((self.state_dir / "fleet.json").read_text())["next_step"])
        except FileNotFoundError:
            return 0

    def producer_id(self) -> str | None:
        """The fleet's producer id (its batch ids' prefix), once the fleet was created."""
        try:
            return str(json.loads((self.state_dir / "producer.json").read_text())["producer_id"])
        except FileNotFoundError:
            return None

    @property
    def finished(self) -> bool:
        return self.committed_steps() >= self.total_steps

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> int:
        """Start (or resume) the fleet; returns the first step it sends."""
        first = self.committed_steps()
        c = self.config
        cmd = [sys.executable, "-m", "ldpstream_cli", "produce", "--campaign", str(self.campaign_file), "--kafka",
               self.bootstrap, "--devices", str(c.devices), "--steps", str(self.total_steps - first),
               "--dataset", _DATASET, "--p-change", str(_P_CHANGE), "--batch-size", str(c.batch_size),
               "--rate", f"{self.rate:.3f}", "--state-dir", str(self.state_dir), "--partitions", str(c.partitions),
               "--seed", str(c.seed)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(_ROOT), os.environ.get("PYTHONPATH")) if x),
               "COLUMNS": "120"}
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- start {self.starts + 1} at step {first}: {' '.join(cmd)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(_ROOT), env=env,
                                         start_new_session=True)
        self.starts += 1
        return first

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


# --------------------------------------------------------------------------- the report
@dataclass
class SoakReport:
    """The figures of a soak; ``problems`` is empty iff the run passed."""

    config: dict[str, Any]
    seconds: float                  # the fault window
    total_seconds: float            # the window, the fleet finishing and the wait for the finals
    steps_expected: int
    attributes: list[str]
    reports_per_device: int         # per step: one per attribute, one per group whose devices sample an attribute
    reports_expected: int
    reports_counted: int
    lost_reports: int
    double_counted_reports: int
    steps_with_wrong_counts: int
    faults: dict[str, int]
    fault_log: list[dict[str, Any]]
    unplanned_exits: dict[str, int]
    duplicates_injected: int
    duplicate_batches_skipped: int
    lateness_seconds: float         # the campaign's lateness in the run
    finals_expected: int
    steps_finalized: int
    steps_without_final: int
    finals_per_step: dict[str, int]
    rev0_finals_wrong_n: int        # revision-0 final messages whose n is not the truth
    duplicate_rev0_messages: int    # revision-0 final messages past the first of their step
    revisions: int                  # finals with revision > 0 published
    incomplete_finals: int          # finals published with complete=false
    store_finals_ok: int
    triggers: dict[str, int]
    latency_p50: float | None
    latency_p99: float | None
    latency_max: float | None
    metrics: dict[str, float]
    workers_at_end: int
    workers_healthy_at_end: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "ok": self.ok}

    def table(self) -> Table:
        """The closing table."""
        t = Table(title=f"ldp soak: {self.seconds:,.0f} s of faults ({self.total_seconds:,.0f} s in all), "
                        f"{self.steps_expected} steps x {len(self.attributes)} attributes", show_header=False)
        t.add_column("what")
        t.add_column("figure", justify="right")
        fmt = lambda x: "-" if x is None else f"{x * 1000:,.1f} ms"  # noqa: E731
        rows = [
            ("reports expected (truth: every step once)", f"{self.reports_expected:,}"),
            ("reports counted (Redis)", f"{self.reports_counted:,}"),
            ("lost reports", f"{self.lost_reports:,}"),
            ("double-counted reports", f"{self.double_counted_reports:,}"),
            ("(attribute, step) with wrong counts", f"{self.steps_with_wrong_counts:,}"),
            ("faults", ", ".join(f"{k} {v}" for k, v in self.faults.items()) or "none"),
            ("unplanned exits (restarted)", ", ".join(f"{k} {v}" for k, v in self.unplanned_exits.items()) or "none"),
            ("duplicate batches injected", f"{self.duplicates_injected:,}"),
            ("duplicate batches skipped (ldp_duplicate_batches_total)", f"{self.duplicate_batches_skipped:,}"),
            ("campaign lateness_seconds", f"{self.lateness_seconds:g}"),
            ("steps finalized / expected", f"{self.steps_finalized:,} / {self.finals_expected:,}"),
            ("steps without a final", f"{self.steps_without_final:,}"),
            ("revision-0 finals per step", ", ".join(f"{k}: {v}" for k, v in self.finals_per_step.items())),
            ("revision-0 finals with a wrong n", f"{self.rev0_finals_wrong_n:,}"),
            ("duplicate revision-0 final messages", f"{self.duplicate_rev0_messages:,}"),
            ("revisions published", f"{self.revisions:,}"),
            ("finals with complete=false", f"{self.incomplete_finals:,}"),
            ("store finals index = truth", f"{self.store_finals_ok:,} / {self.finals_expected:,}"),
            ("final triggers", ", ".join(f"{k} {v}" for k, v in self.triggers.items())),
            ("estimate latency (last input -> final) p50 / p99 / max", f"{fmt(self.latency_p50)} / {fmt(self.latency_p99)} / "
                                                 f"{fmt(self.latency_max)}"),
            ("store resets / count regressions", f"{self.metrics.get('ldp_store_resets_total', 0):g} / "
                                                 f"{self.metrics.get('ldp_count_regressions_total', 0):g}"),
            ("rejected batches", f"{self.metrics.get('ldp_rejected_batches_total', 0):g}"),
            ("workers healthy at the end", f"{self.workers_healthy_at_end} / {self.workers_at_end}"),
            ("verdict", "[green]PASS[/green]" if self.ok else "[red]FAIL[/red]"),
        ]
        for row in rows:
            t.add_row(*row)
        return t


def compare(expected: dict[tuple[str, int], tuple[np.ndarray, int]],
            counted: dict[tuple[str, int], tuple[np.ndarray, int]],
            published: list[dict[str, Any]],
            store_finals: dict[str, dict[int, tuple[int, int]]] | None, *,
            loss_expected: bool = False) -> dict[str, Any]:
    """Counts, published finals (``ldp.estimates`` documents) and the store's finals index against the truth.

    Returns the figures of :class:`SoakReport` that depend only on these, and ``problems`` (empty: pass).
    A problem is

    * a count or ``n`` in Redis that differs from the truth (reports lost or counted twice);
    * a step of the truth without a revision-0 final on ``ldp.estimates``, or with more than one revision-0
      final *message* (the topic must carry exactly one per step, fenced; two identical ones are two);
    * a revision-0 final whose ``n`` differs from the truth (a final published before the step was whole);
    * a final (any revision) with ``"complete": false``, unless ``loss_expected`` (a broker data loss the
      fault schedule caused on purpose; the soak's faults never lose data): then such a final is allowed, and
      its ``n`` may be short, but a short final that claims to be complete is still a problem;
    * the store's finals index (unless ``store_finals`` is None: not checked) not holding
      ``(truth n, revision 0)`` for a step; a final for a step the fleet never sent.

    Revisions (finals with ``revision > 0``) are counted, not failed on their own: the worker publishes one
    only when the step's ``n`` grew past its revision-0 final's, so with every revision-0 final at the truth
    a revision means more than the truth was counted, which the count check fails. A document without
    ``complete`` (a worker older than the field) counts as complete."""
    problems: list[str] = []
    lost = extra = wrong = 0
    for key, (support, n) in expected.items():
        got_counts, got_n = counted.get(key, (np.zeros_like(support), 0))
        lost += max(0, n - got_n)
        extra += max(0, got_n - n)
        if got_n != n or not np.array_equal(got_counts, support):
            wrong += 1
            if wrong <= 5:
                problems.append(f"counts of {key[0]} t={key[1]}: n={got_n} (truth {n}), "
                                f"{int(np.sum(got_counts != support))} values differ")
    finals = [d for d in published if d.get("final")]
    rev0: Counter[tuple[str, int]] = Counter()
    wrong_n = excused = revisions = incomplete = unknown = 0
    triggers: Counter[str] = Counter()
    latencies: list[float] = []
    for d in finals:
        key = (str(d["attribute"]), int(d["t"]))
        revision = int(d.get("revision", 0))
        if key not in expected:
            unknown += 1
            if unknown <= 5:
                problems.append(f"a final for {key[0]} t={key[1]}, a step the fleet never sent")
            continue
        flagged = d.get("complete", True) is False
        if flagged:
            incomplete += 1
            if not loss_expected and incomplete <= 5:
                problems.append(f"final of {key[0]} t={key[1]} revision {revision} published with complete=false "
                                f"(n={d['n']}, truth {expected[key][1]}) though no data loss was expected")
        if revision > 0:
            revisions += 1
            continue
        rev0[key] += 1
        triggers[str(d.get("trigger"))] += 1
        if d.get("latency_seconds") is not None:
            latencies.append(float(d["latency_seconds"]))
        if int(d["n"]) != expected[key][1]:
            wrong_n += 1
            if loss_expected and flagged:
                excused += 1  # a short final that says so, after an expected loss
            elif wrong_n - excused <= 5:
                problems.append(f"revision-0 final of {key[0]} t={key[1]} with n={d['n']} (truth {expected[key][1]})"
                                f"{', marked complete' if loss_expected else ''}")
    if wrong_n - excused > 5:
        problems.append(f"{wrong_n - excused} revision-0 final(s) in all with a wrong n")
    per_step = Counter(rev0.get(key, 0) for key in expected)
    missing = [key for key in expected if rev0.get(key, 0) == 0]
    repeated = [key for key in expected if rev0.get(key, 0) > 1]
    duplicates = sum(rev0[key] - 1 for key in repeated)
    if missing:
        problems.append(f"{len(missing)} step(s) without a revision-0 final on {ESTIMATES_TOPIC}, e.g. "
                        + ", ".join(f"{a} t={t}" for a, t in missing[:5]))
    if repeated:
        problems.append(f"{len(repeated)} step(s) with more than one revision-0 final ({duplicates} extra "
                        "message(s)), e.g. " + ", ".join(f"{a} t={t} ({rev0[(a, t)]})" for a, t in repeated[:5]))
    if incomplete > 5 and not loss_expected:
        problems.append(f"{incomplete} final(s) in all with complete=false")
    store_ok = None if store_finals is None else \
        sum(1 for (a, t), (_, n) in expected.items() if store_finals.get(a, {}).get(t) == (n, 0))
    if store_ok is not None and store_ok != len(expected):
        problems.append(f"the store's finals index holds (truth n, revision 0) for {store_ok} of "
                        f"{len(expected)} steps")
    if lost:
        problems.append(f"{lost:,} report(s) lost")
    if extra:
        problems.append(f"{extra:,} report(s) counted twice")
    q = np.percentile(latencies, [50, 99]) if latencies else [None, None]
    return {
        "reports_expected": int(sum(n for _, n in expected.values())),
        "reports_counted": int(sum(counted.get(k, (None, 0))[1] for k in expected)),
        "lost_reports": int(lost), "double_counted_reports": int(extra), "steps_with_wrong_counts": wrong,
        "finals_expected": len(expected), "steps_finalized": len(expected) - len(missing),
        "steps_without_final": len(missing),
        "finals_per_step": {f"{c} final(s)": v for c, v in sorted(per_step.items())},
        "rev0_finals_wrong_n": wrong_n, "duplicate_rev0_messages": duplicates, "revisions": revisions,
        "incomplete_finals": incomplete, "store_finals_ok": store_ok,
        "triggers": dict(triggers),
        "latency_p50": None if q[0] is None else float(q[0]), "latency_p99": None if q[1] is None else float(q[1]),
        "latency_max": max(latencies) if latencies else None,
        "problems": problems,
    }


# --------------------------------------------------------------------------- helpers
def _metric_sums(text: str) -> dict[str, float]:
    """Sum over labels of each metric of :data:`_METRICS` in a Prometheus text exposition."""
    out = {}
    for name in _METRICS:
        out[name] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return out


def _get(url: str, timeout: float = 3.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except OSError:
        return None


def _final_index(redis_url: str, campaign: str, attributes: list[str]) -> dict[str, dict[int, tuple[int, int]]]:
    """``attribute -> t -> (n, revision)``: the store's finals index."""
    async def read() -> dict[str, dict[int, tuple[int, int]]]:
        store = CountStore.from_url(redis_url)
        try:
            return {a: await store.final_index(campaign, a) for a in attributes}
        finally:
            await store.close()
    return asyncio.run(read())


def soak_campaign(source: Path, dest: Path, lateness: float | None = None) -> Path:
    """A copy of campaign file ``source``, with ``lateness_seconds = lateness`` unless ``lateness`` is None
    (then the campaign's own: the soak runs with the lateness a deployment would have), and every attribute on the
    campaign's retention (:func:`ldpstream_dev.workers.keep_every_step`: the soak compares every step of the run with
    its truth, so an attribute's shorter retention must not prune them)."""
    text = keep_every_step(Path(source).read_text())
    if lateness is None:
        dest.write_text(text)
        Campaign.load(dest)
        return dest
    line = f"lateness_seconds = {float(lateness)!r}"
    text, n = re.subn(r"(?m)^\s*lateness_seconds\s*=.*$", line, text, count=1)
    if n == 0:
        text, n = re.subn(r"(?m)^\[campaign\]\s*$", f"[campaign]\n{line}", text, count=1)
    if n == 0:
        raise ValueError(f"{source} has no [campaign] table")
    dest.write_text(text)
    if Campaign.load(dest).lateness_seconds != float(lateness):  # pragma: no cover - the regex hit another line
        raise ValueError(f"could not set the lateness of {source}")
    return dest


# --------------------------------------------------------------------------- the soak
class Soak:
    """One soak run (:func:`run_soak` wraps it with signal handling and output)."""

    def __init__(self, config: SoakConfig, say: Callable[[str], None]) -> None:
        self.config = config
        self._say = say
        self.run_dir = Path(config.run_dir) if config.run_dir else Path(tempfile.mkdtemp(prefix="ldp-soak-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.campaign_file = soak_campaign(config.campaign, self.run_dir / "campaign.toml", config.lateness)
        self.campaign = Campaign.load(self.campaign_file)
        self.attributes = list(self.campaign.attributes)
        self.stack = LocalStack(run_dir=self.run_dir / "stack", broker_storage="durable")
        self.workers: list[WorkerProcess] = []
        self.producer: ProducerProcess | None = None
        self.truth = OfflineTruth(self.campaign, config)
        self.rng = random.Random(config.seed)
        self.fault_log: list[dict[str, Any]] = []
        self.faults: Counter[str] = Counter()
        self.unplanned: Counter[str] = Counter()
        self.problems: list[str] = []
        self.duplicates_injected = 0
        self.scraped: dict[str, dict[str, float]] = {}  # worker name -> last metric sums
        self._worker_serial = 0
        self._t0 = time.monotonic()
        self._last_scrape = 0.0
        self._last_progress_step = 0

    # ------------------------------------------------------------------ output
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def say(self, text: str) -> None:
        self._say(f"{self.elapsed():7.1f}s  {text}")

    def _record(self, kind: str, detail: str, planned: bool = True) -> None:
        entry = {"at_seconds": round(self.elapsed(), 2), "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 "kind": kind, "planned": planned, "detail": detail}
        self.fault_log.append(entry)
        (self.faults if planned else self.unplanned)[kind] += 1
        n = sum(self.faults.values()) if planned else sum(self.unplanned.values())
        self.say(f"{'fault' if planned else '[yellow]unplanned[/yellow]'} {n}: {kind}: {escape(detail)}")

    # ------------------------------------------------------------------ workers
    def _start_worker(self) -> WorkerProcess:
        self._worker_serial += 1
        info = self.stack.info
        assert info is not None
        w = WorkerProcess([self.campaign_file], info.kafka_bootstrap, info.redis_url, run_dir=self.run_dir,
                          name=f"worker-{self._worker_serial}", app_id=APP_ID, partitions=self.config.partitions,
                          refresh_seconds=0.5)
        w.start()
        self.workers.append(w)
        return w

    def _wait_ready(self, w: WorkerProcess, timeout: float = 120.0) -> str:
        started = time.monotonic()
        try:
            info = w.wait_ready(timeout=timeout)
        except (TimeoutError, RuntimeError) as exc:
            self.problems.append(f"{self._name(w)} did not become ready: {str(exc)[:300]}")
            return "not ready"
        return f"ready in {time.monotonic() - started:.1f} s with partitions {sorted(info['assigned'])}"

    @staticmethod
    def _name(w: WorkerProcess) -> str:
        return w.ready_file.name.split(".")[0]

    def _scrape(self, w: WorkerProcess) -> None:
        if not w.info:
            return
        text = _get(f"{w.url}/metrics")
        if text is not None:
            self.scraped[self._name(w)] = _metric_sums(text.decode(errors="replace"))

    def _scrape_all(self) -> None:
        for w in self.workers:
            self._scrape(w)
        self._last_scrape = time.monotonic()

    def _metric_totals(self) -> dict[str, float]:
        return {m: sum(s.get(m, 0.0) for s in self.scraped.values()) for m in _METRICS}

    def _leader(self) -> WorkerProcess | None:
        for w in self.workers:
            raw = _get(f"{w.url}/status") if w.info else None
            if raw and json.loads(raw).get("estimator_leader"):
                return w
        return None

    # ------------------------------------------------------------------ faults
    def _inject(self, kind: str) -> None:
        occurrence = self.faults[kind]  # 0 for the first of its kind
        try:
            detail = getattr(self, f"_fault_{kind}")(occurrence)
        except Exception as exc:  # noqa: BLE001 - a fault that could not be injected is a finding
            self.problems.append(f"fault {kind} failed: {exc!r}")
            detail = f"FAILED: {exc!r}"
        if detail is None:
            self.say(f"fault {kind} skipped (nothing to do now)")
            return
        self._record(kind, detail)

    def _fault_worker_kill(self, occurrence: int) -> str | None:
        if not self.workers:
            return None
        victim = self._leader() if occurrence % 2 == 0 else None
        role = "the estimator lease holder" if victim is not None else "a worker"
        victim = victim or self.rng.choice(self.workers)
        self._scrape(victim)
        pid = victim.proc.pid if victim.proc else None
        victim.kill()
        self.workers.remove(victim)
        new = self._start_worker()
        return f"SIGKILL {self._name(victim)} ({role}, pid {pid}); replacement {self._name(new)} {self._wait_ready(new)}"

    def _fault_worker_add(self, occurrence: int) -> str | None:
        new = self._start_worker()
        return f"added {self._name(new)} ({len(self.workers)} workers) {self._wait_ready(new)}"

    def _fault_worker_remove(self, occurrence: int) -> str | None:
        if len(self.workers) < 2:
            return None
        victim = self.workers[0]  # the oldest
        self._scrape(victim)
        code = victim.stop()
        self.workers.remove(victim)
        return f"SIGTERM {self._name(victim)} (exit code {code}; {len(self.workers)} workers left)"

    def _fault_producer_kill(self, occurrence: int) -> str | None:
        p = self.producer
        if p is None or not p.running():
            return None
        p.kill()
        at = p.committed_steps()
        time.sleep(self.config.producer_down_seconds)
        first = p.start()
        return (f"SIGKILL ldp produce with {at} step(s) committed; down {self.config.producer_down_seconds:g} s, "
                f"resumed from its state directory at step {first}")

    def _fault_duplicate_batch(self, occurrence: int) -> str | None:
        p = self.producer
        committed = p.committed_steps() if p else 0
        producer_id = p.producer_id() if p else None
        if committed == 0 or producer_id is None:
            return None
        self.truth.advance(committed - 1)
        attr = self.attributes[occurrence % len(self.attributes)]
        index = self.rng.randrange(self.truth.batches(attr))
        t, reports = self.truth.batch(attr, index)
        self.truth.fleet.producer_id = producer_id
        batch_id = self.truth.fleet.batch_id(t, attr, index)
        info = self.stack.info
        assert info is not None
        produce_messages(info.kafka_bootstrap, REPORTS_TOPIC,
                         [(message_key(t, attr), pack_reports(self.campaign, attr, t, reports, batch_id=batch_id))])
        self.duplicates_injected += 1
        return f"re-sent batch {batch_id} ({len(reports):,} reports, after the step's watermark)"

    def _fault_redis_restart(self, occurrence: int) -> str | None:
        kill = occurrence % 2 == 0
        started = time.monotonic()
        pid = self.stack.restart_redis(kill=kill)
        return f"{'SIGKILL' if kill else 'SIGTERM'} redis-server, back in {time.monotonic() - started:.1f} s (pid {pid})"

    def _fault_broker_restart(self, occurrence: int) -> str | None:
        kill = occurrence % 2 == 0
        started = time.monotonic()
        pid = self.stack.restart_broker(kill=kill)
        return f"{'SIGKILL' if kill else 'SIGTERM'} tansu, serving again in {time.monotonic() - started:.1f} s (pid {pid})"

    # ------------------------------------------------------------------ supervision
    def _supervise(self) -> None:
        """Restart a worker or the fleet that exited on its own (reported as unplanned)."""
        for w in list(self.workers):
            if w.proc is not None and w.proc.poll() is not None:
                self.workers.remove(w)
                tail = w.log_tail(5).replace("\n", " | ")[-300:]
                new = self._start_worker()
                self._record("worker_exit", f"{self._name(w)} exited with {w.proc.returncode} (log: {tail}); "
                                            f"replacement {self._name(new)} {self._wait_ready(new)}", planned=False)
        p = self.producer
        if p is not None and p.proc is not None and p.proc.poll() is not None and not p.finished:
            code = p.proc.returncode
            tail = " | ".join(p.log_path.read_text(errors="replace").splitlines()[-3:])[-300:]
            time.sleep(1.0)
            first = p.start()
            self._record("producer_exit", f"ldp produce exited with {code} (log: {tail}); resumed at step {first}",
                         planned=False)

    def _tick(self) -> None:
        """Supervision, metrics, the truth and progress lines: once per loop turn."""
        self._supervise()
        if time.monotonic() - self._last_scrape >= 2.0:
            self._scrape_all()
        committed = self.producer.committed_steps() if self.producer else 0
        self.truth.advance(committed - 1)
        every = self.config.progress_every
        if committed >= self._last_progress_step + every or (committed == self.truth_total and
                                                             committed > self._last_progress_step):
            self._last_progress_step = committed
            try:
                index = _final_index(self.stack.info.redis_url, self.campaign.id, self.attributes)  # type: ignore[union-attr]
                finals = str(sum(len(v) for v in index.values()))
            except Exception:  # noqa: BLE001 - Redis restarting
                finals = "?"
            dup = self._metric_totals()["ldp_duplicate_batches_total"]
            self.say(f"step {committed}/{self.truth_total} sent, {finals}/{self.truth_total * len(self.attributes)} "
                     f"finals, {len(self.workers)} workers, {dup:g} duplicate batches skipped")

    @property
    def truth_total(self) -> int:
        return self.config.steps

    # ------------------------------------------------------------------ the run
    def run(self) -> SoakReport:
        c = self.config
        self.say(f"run dir {self.run_dir}; starting the local stack (tansu, durable storage + redis-server)")
        info = self.stack.up(stop_on_exit=True)
        self.say(f"stack: kafka {info.kafka_bootstrap}, redis {redact_url(info.redis_url)}")
        asyncio.run(ensure_topic(info.kafka_bootstrap, REPORTS_TOPIC, c.partitions))
        for _ in range(c.workers):
            self._start_worker()
        for w in list(self.workers):
            self.say(f"{self._name(w)} {escape(self._wait_ready(w))}")
        self.producer = ProducerProcess(self.campaign_file, info.kafka_bootstrap, c, self.run_dir / "fleet-state",
                                        self.run_dir / "producer.log", c.steps, self.truth.fleet.reports_per_device)
        self.producer.start()
        self.say(f"fleet: {c.devices:,} devices x {len(self.attributes)} attributes, one step every "
                 f"{c.step_seconds:g} s, {c.steps} steps; faults every {c.fault_every:g} s: {', '.join(c.faults)}")
        started = time.monotonic()
        next_fault, rotation = started + c.fault_every, 0
        while rotation < len(c.faults) or (time.monotonic() < started + c.seconds and not self.producer.finished):
            self._tick()
            if time.monotonic() >= next_fault:
                self._inject(c.faults[rotation % len(c.faults)])
                rotation += 1
                next_fault = max(next_fault + c.fault_every, time.monotonic() + 1.0)
            time.sleep(0.25)
        window = time.monotonic() - started
        self.say("fault window over: no more faults; restoring the workers, letting the fleet finish")
        while len(self.workers) < c.workers:
            w = self._start_worker()
            self.say(f"{self._name(w)} {escape(self._wait_ready(w))}")
        deadline = time.monotonic() + c.finish_timeout
        while not self.producer.finished and time.monotonic() < deadline:
            self._tick()
            time.sleep(0.25)
        if not self.producer.finished:
            self.problems.append(f"the fleet committed {self.producer.committed_steps()} of {c.steps} steps "
                                 f"within {c.finish_timeout:g} s after the fault window")
        self._tick()
        self.truth.advance(c.steps - 1)
        self.say("the fleet is done; waiting for every final")
        store_finals = self._wait_for_finals(deadline)
        return self._report(window, store_finals)

    def _wait_for_finals(self, deadline: float) -> dict[str, dict[int, tuple[int, int]]]:
        info = self.stack.info
        assert info is not None
        want = {(a, t) for (a, t) in self.truth.expected}
        deadline = max(deadline, time.monotonic() + 60.0)
        index: dict[str, dict[int, tuple[int, int]]] = {}
        while True:
            self._supervise()
            try:
                index = _final_index(info.redis_url, self.campaign.id, self.attributes)
            except Exception:  # noqa: BLE001 - retried until the deadline
                pass
            have = {(a, t) for a, steps in index.items() for t in steps}
            if want <= have or time.monotonic() >= deadline:
                self.say(f"{len(want & have)}/{len(want)} finals in the store")
                return index
            time.sleep(0.5)

    def _report(self, window: float, store_finals: dict[str, dict[int, tuple[int, int]]]) -> SoakReport:
        info = self.stack.info
        assert info is not None
        self._scrape_all()
        counted = {(a, t): read_counts(info.redis_url, self.campaign.id, a, t, len(support))
                   for (a, t), (support, _) in self.truth.expected.items()}
        published = [d for d in consume_json(info.kafka_bootstrap, ESTIMATES_TOPIC, idle_seconds=2.0, timeout=180.0)
                     if d.get("campaign") == self.campaign.id]
        figures = compare(self.truth.expected, counted, published, store_finals)
        unhealthy = self._unhealthy_workers(HEALTH_WAIT_SECONDS)
        healthy = len(self.workers) - len(unhealthy)
        totals = self._metric_totals()
        problems = figures.pop("problems") + self.problems
        if unhealthy:
            problems.append(f"{len(unhealthy)} worker(s) not healthy at the end (within {HEALTH_WAIT_SECONDS:g} s): "
                            + "; ".join(unhealthy))
        cfg = {k: (str(v) if isinstance(v, Path) else v) for k, v in self.config.__dict__.items()}
        return SoakReport(config=cfg, seconds=round(window, 1), total_seconds=round(self.elapsed(), 1),
                          steps_expected=self.config.steps, lateness_seconds=self.campaign.lateness_seconds,
                          attributes=self.attributes, reports_per_device=self.truth.fleet.reports_per_device,
                          faults=dict(self.faults), fault_log=self.fault_log,
                          unplanned_exits=dict(self.unplanned), duplicates_injected=self.duplicates_injected,
                          duplicate_batches_skipped=int(totals["ldp_duplicate_batches_total"]), metrics=totals,
                          workers_at_end=len(self.workers), workers_healthy_at_end=healthy, problems=problems,
                          **figures)

    def _unhealthy_workers(self, seconds: float) -> list[str]:
        """The workers whose ``/health`` has not answered 200 within ``seconds`` (a worker that has just
        recovered from the last fault may still be catching up), each with its last ``/status`` problems."""
        deadline = time.monotonic() + seconds
        waiting = list(self.workers)
        while True:
            waiting = [w for w in waiting if not (w.info and _get(f"{w.url}/health") is not None)]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        found = []
        for w in waiting:
            status = _get(f"{w.url}/status") if w.info else None
            try:
                problems = [p.get("problem") for p in json.loads(status or b"{}").get("problems", [])]
            except ValueError:
                problems = []
            found.append(f"{self._name(w)}: {problems or 'no answer'}")
        return found

    def close(self) -> None:
        """Stop the fleet, the workers and the stack."""
        if self.producer is not None:
            self.producer.stop()
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.terminate()
        for w in self.workers:
            w.stop()
        self.stack.down()


def run_soak(config: SoakConfig, console: Console, json_path: Path | None = None) -> int:
    """Run a soak; returns the exit code: 0 pass, 1 fail, 2 could not run, 130 interrupted (Ctrl-C or SIGTERM)."""
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM cleans up like Ctrl-C
    soak: Soak | None = None
    code = 1
    try:
        soak = Soak(config, lambda line: console.print(line, highlight=False, soft_wrap=True))
        report = soak.run()
        print_table(console, report.table())
        for problem in report.problems:
            console.print(f"[red]problem:[/red] {escape(problem)}")
        if json_path is not None:
            json_path.write_text(json.dumps(report.to_json(), indent=1, default=str))
        code = 0 if report.ok else 1
        return code
    except KeyboardInterrupt:
        console.print("\n[yellow]interrupted[/yellow]")
        code = 130
        return code
    except (StackError, LDPError, OSError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        code = 2
        return code
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the cleanup short
        if soak is not None:
            with console.status("stopping the fleet, the workers and the stack ..."):
                soak.close()
            if code == 0 and not config.keep_run_dir and config.run_dir is None:
                shutil.rmtree(soak.run_dir, ignore_errors=True)
            else:
                console.print(f"logs and data kept in {soak.run_dir}")
        console.print("cleaned up")
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
