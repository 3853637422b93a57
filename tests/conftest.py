"""Shared fixtures of the test suite."""
from __future__ import annotations

import ast
import json
import os
import resource
import subprocess
import sys
import time

from pathlib import Path

import numpy as np
import pytest

# The suite runs more numba processes than cores (two test processes per core, each starting workers and
# producers): OpenMP threads that spin while they wait for a descheduled sibling burned several times the CPU
# of the work itself (test_multidim: 85 CPU s spinning vs 23 s sleeping, with 4 processes on 2 cores). Set
# before any process here loads libgomp; children inherit it. docs/operations.md says the same to operators.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Compile every numba kernel into numba's on-disk cache before any test runs, once per run (in the xdist
    controller, not in each test process): one process per CPU, each compiling its own kernel families
    (``ldpstream_dev.kernels_warmup``). Without it every test process, worker and producer that starts before
    the cache holds a kernel compiles it again (a fresh clone has none: about two CPU minutes in all).
    ``LDP_SKIP_KERNEL_WARMUP=1`` skips it."""
    if hasattr(session.config, "workerinput") or os.environ.get("LDP_SKIP_KERNEL_WARMUP") == "1":
        return
    from ldpstream_dev.kernels_warmup import FAMILIES

    parts = max(1, min(len(FAMILIES), os.cpu_count() or 1))
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "ldpstream_dev.kernels_warmup", "--part", str(i), "--parts",
                               str(parts)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(parts)]
    errors = [p.communicate()[1].decode(errors="replace") for p in procs if p.wait() != 0]
    if errors:
        raise pytest.UsageError("compiling the numba kernels failed:\n" + "\n".join(errors))
    print(f"numba kernels compiled or loaded from the cache in {time.monotonic() - start:.0f} s "
          f"({parts} processes)", file=sys.stderr)


#: Environment variable: a file to which every test appends one JSON line, its CPU seconds (the test process's and
#: those of the child processes it reaped: workers, ingests, producers) and wall seconds: what a test costs on a
#: machine whose cores are all busy, where wall times mislead (``LDP_TEST_CPU_LOG=/tmp/cpu.jsonl make test``).
TEST_CPU_ENV = "LDP_TEST_CPU_LOG"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """With ``LDP_TEST_CPU_LOG`` set: each test's CPU and wall seconds (setup, call and teardown) to that file."""
    path = os.environ.get(TEST_CPU_ENV)
    if not path:
        yield
        return
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    line = {"test": item.nodeid, "cpu_s": round(_cpu_seconds() - cpu, 3), "wall_s": round(time.monotonic() - wall, 3),
            "process": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(path, "a", encoding="utf-8") as log:
        log.write(json.dumps(line) + "\n")


def pytest_configure(config):
    """API answers read through the harness are checked against their schemas (``ldpstream_dev.contract``)."""
    from ldpstream_dev import contract

    contract.enable()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory):
    """A real local stack (tansu broker + redis-server) shared by the whole session.

    Yields the started ``ldpstream_dev.stack.LocalStack``; ``local_stack.info`` has
    ``kafka_bootstrap`` ("127.0.0.1:PORT") and ``redis_url`` ("redis://127.0.0.1:PORT/0").
    The broker keeps its topics in the stack's run dir (durable storage, the default), which lives only
    as long as the session: tests should use their own topic and group names.

    At the end, every message of every ``*estimates`` topic the session's tests published on it is checked
    against the estimates contract (``ldpstream_dev.contract.check_topics``: schema, key, headers); a message that
    breaks it fails the session's last test using the stack (an error at teardown) and names the message.
    """
    from ldpstream_dev.contract import check_topics
    from ldpstream_dev.stack import LocalStack

    stack = LocalStack(run_dir=tmp_path_factory.mktemp("local-stack"))
    stack.up(timeout=60.0, stop_on_exit=True)
    try:
        yield stack
        start = time.monotonic()
        checked, problems = check_topics(stack.info.kafka_bootstrap)
        print(f"estimates contract: {checked} messages checked in {time.monotonic() - start:.1f} s", file=sys.stderr)
    finally:
        stack.down()
    if problems:
        pytest.fail(f"{len(problems)} problem(s) in the {checked} messages of the estimates topics "
                    f"(docs/estimates.md):\n" + "\n".join(problems[:20]), pytrace=False)


#: Modules whose tests time the pipeline with several workers each (finals within 2 s of a lease holder's
#: SIGKILL): they run one after another on one test process, not next to each other.
TIMED_TOGETHER = {"test_finals_faults"}


def _modules_sharing_a_fixture(tests: Path) -> set[str]:
    """Test modules (file stems) that define a module-, class- or package-scoped fixture."""
    out = set(TIMED_TOGETHER)
    for path in tests.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.keyword) and node.arg == "scope" and isinstance(node.value, ast.Constant) \
                    and node.value.value in ("module", "class", "package"):
                out.add(path.stem)
    return out


#: Scopes (a module, or a test id; a prefix matches) that start first, longest first, as measured with
#: ``--durations`` (docs/benchmarks.md): the longest tests must not be the last to start, or the run ends with
#: one test process working and the others idle. A test not listed starts after these, in collection order.
RUN_FIRST = (
    "tests/test_finals_faults.py",
    "tests/test_outages.py",
    "tests/test_fleet_resume.py::test_private_fleet_sigkilled_at_20_points_counts_exact",
    "tests/test_soak.py::test_half_minute_soak_with_every_fault_counts_exactly",
    "tests/test_fuzz.py",
    "tests/test_experiments.py",
    "tests/test_install.py",
    "tests/test_scaleout.py::test_workers_joining_one_by_one_all_own_partitions_and_count_exactly",
    "tests/test_observability.py",
    "tests/test_defense.py::test_attacks_through_the_ingest_broker_and_worker",
    "tests/test_bench_ingest.py::test_bench_ingest_smoke",
    "tests/test_pipeline.py::test_exactly_once_after_sigkill",
    "tests/test_secured.py",
    "tests/test_worker.py",
    "tests/test_sdk_groups.py::test_group_reports_through_http_ingest",
    "tests/test_bad_input.py::test_device_sdk_reports_through_http_ingest",
    "tests/test_redis_cluster.py",
    "tests/test_device_sdk_install.py",
    "tests/test_js_client.py",
    "tests/test_device_light.py",
    "tests/test_numeric_pipeline.py",
    "tests/test_soak.py::test_soak_stops_everything_on_sigterm",
    "tests/test_store_loss.py",
    "tests/test_ingest_service.py",
    "tests/test_demo.py",
    "tests/test_audit.py::test_chunks_respect_the_memory_budget",
    "tests/test_bench_ingest.py",
    "tests/test_bench_solutions.py",
    "tests/test_multidim_pipeline.py",
    "tests/test_accuracy.py",
    "tests/test_bad_input.py",
    "tests/test_pipeline.py",
    "tests/test_exactly_once.py",
    "tests/test_subset_histogram.py",
    "tests/test_multidim.py",
)


def _start_rank(scope: str) -> int:
    """Where ``scope`` starts: its first matching entry of :data:`RUN_FIRST`, else after all of them."""
    return next((i for i, entry in enumerate(RUN_FIRST) if scope.startswith(entry)), len(RUN_FIRST))


def pytest_xdist_make_scheduler(config, log):
    """Under ``pytest -n N`` (``make test``) tests go to whichever test process is free, one by one, except the
    tests of a module that shares a module- or class-scoped fixture (a pipeline, an ingest, a built venv) or is
    in :data:`TIMED_TOGETHER`: those stay together on one process, so the fixture is built once. (pytest-xdist's
    ``loadgroup`` marks cannot do it on pytest 9.2, whose node ids no longer take xdist's group suffix.) The
    longest scopes start first (:data:`RUN_FIRST`), and a process is given its next scope only when it starts
    its last one, so that no long test waits in the queue of a busy process while another process is idle."""
    from xdist.scheduler import LoadScopeScheduling

    together = _modules_sharing_a_fixture(Path(__file__).parent)

    class FreeProcessScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).stem in together else nodeid

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:  # once, when the whole collection is in the queue
                self._ordered = True
                order = sorted(self.workqueue.items(), key=lambda unit: _start_rank(unit[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(order)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:  # the one it runs: give it the one after
                self._assign_work_unit(node)

    return FreeProcessScheduling(config, log)
