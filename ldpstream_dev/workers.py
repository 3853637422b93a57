"""Stream-app workers and ingests in child processes, for tests, benchmarks and the demo, and reading counts back.

:class:`WorkerProcess` runs ``python -m ldpstream_cli worker`` with its :class:`~stream_app.settings.WorkerSettings`
passed as environment variables (``WorkerSettings.to_env``), so a test worker goes through the same
entry point and settings as a deployed one. Kafka and Redis security (``LDP_KAFKA_*``, ``LDP_REDIS_PASSWORD`` ...,
:mod:`wire.transport`) come from this process's environment, which the child inherits; the Kafka clients here
(:func:`produce_messages`, :func:`consume_json`) and the count reads use the same. :class:`IngestProcess`
runs ``python -m ldpstream_cli ingest`` the same way: the one HTTP door for device reports (a worker has none).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO, Any

import numpy as np

from stream_app.ingest.settings import IngestSettings, ingest_setting_specs
from stream_app.settings import WorkerSettings, free_port, setting_specs
from stream_app.store import read_step_sync
from wire.campaign import Campaign
from wire.transport import kafka_client_options

from .contract import check_answer
from .processes import log_tail, stop_child, wait_http_ok

__all__ = ["IngestProcess", "WorkerProcess", "read_counts", "unique_campaign_file", "wait_for_counts"]

#: The repository root, put on the child's ``PYTHONPATH`` (the packages need not be installed).
_ROOT = Path(__file__).resolve().parent.parent
#: Consumer-group session of a harness worker unless given: a killed worker frees its partitions fast.
HARNESS_SESSION_TIMEOUT = 6.0


class WorkerProcess:
    """A worker in a child process (``python -m ldpstream_cli worker``).

    ``start()`` launches it; ``wait_ready()`` waits for its ready file (``info`` then holds the ports
    and assigned partitions); ``stop()`` sends SIGTERM and waits (clean shutdown); ``kill()`` sends
    SIGKILL (crash). The worker's output goes to ``log_path``. ``options`` are
    :class:`~stream_app.settings.WorkerSettings` fields (``app_id``, ``topic_prefix``,
    ``refresh_seconds``, ``session_timeout``, ``partitions``, ``web_port``, ``loglevel``, ...); the
    ready file and data directory are ``run_dir/{name}.ready.json`` and ``run_dir/{name}.data``.
    """

    def __init__(self, campaign_paths: list[Path], kafka_bootstrap: str, redis_url: str, *,
                 run_dir: Path | None = None, name: str = "worker", **options: Any) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-worker-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = self.run_dir / f"{name}.ready.json"
        self.log_path = self.run_dir / f"{name}.log"
        options.setdefault("session_timeout", HARNESS_SESSION_TIMEOUT)
        self.settings = WorkerSettings(
            campaign_paths=tuple(Path(p).resolve() for p in campaign_paths), kafka_bootstrap=kafka_bootstrap,
            redis_url=redis_url, ready_file=self.ready_file, data_dir=self.run_dir / f"{name}.data", **options)
        self.command = [sys.executable, "-m", "ldpstream_cli", "worker"]
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the worker's web server (after :meth:`wait_ready`)."""
        return self.info["web_url"]

    def environment(self) -> dict[str, str]:
        """The child's environment: ours without any worker setting, plus this worker's settings."""
        own = {spec["env"] for spec in setting_specs().values()}
        env = {k: v for k, v in os.environ.items() if k not in own}
        env.update(self.settings.to_env())
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(_ROOT), env.get("PYTHONPATH", "")) if x)
        return env

    def start(self) -> "WorkerProcess":
        self.ready_file.unlink(missing_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(self.run_dir),
                                     env=self.environment(), start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0, partitions: int | None = None) -> dict[str, Any]:
        """Wait for the ready file (and, if given, for exactly ``partitions`` assigned partitions)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            try:
                info = json.loads(self.ready_file.read_text())
            except (OSError, ValueError):
                info = None
            if info and (partitions is None or len(info["assigned"]) == partitions) and _http_ok(info):
                self.info = info
                return info
            time.sleep(0.05)
        raise TimeoutError(f"worker not ready after {timeout} s; log:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash: no commit, no group leave, no lease release)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> "WorkerProcess":
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class IngestProcess:
    """``ldp ingest`` in a child process (``python -m ldpstream_cli ingest``), settings passed as environment
    variables (``IngestSettings.to_env``).

    ``options`` are :class:`~stream_app.ingest.settings.IngestSettings` fields (``topic_prefix``, ``processes``,
    ``linger_seconds``, ``open_mode``, ...); the port is a free one unless given. Without ``secret_file`` (a file
    holding the device-token secret, as ``LDP_DEVICE_SECRET_FILE``) the ingest runs in open mode (development:
    no credential, no rate limit). ``start()``, ``wait_ready()`` (``GET /health`` answers 200), ``stop()``
    (SIGTERM, then SIGKILL); its output goes to ``run_dir/{name}.log``.
    """

    def __init__(self, campaign_paths: list[Path], kafka_bootstrap: str, redis_url: str, *,
                 run_dir: Path | None = None, name: str = "ingest", secret_file: Path | None = None,
                 **options: Any) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-ingest-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.run_dir / f"{name}.log"
        self.secret_file = secret_file
        options.setdefault("port", free_port())
        options.setdefault("open_mode", secret_file is None)
        self.settings = IngestSettings(campaign_paths=tuple(Path(p).resolve() for p in campaign_paths),
                                       kafka_bootstrap=kafka_bootstrap, redis_url=redis_url, **options)
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL of the ingest (``{url}/reports`` takes reports)."""
        return f"http://127.0.0.1:{self.settings.port}"

    def environment(self) -> dict[str, str]:
        """The child's environment: ours without any ingest or worker setting or secret, plus this ingest's."""
        own = {spec["env"] for spec in (*ingest_setting_specs().values(), *setting_specs().values())}
        env = {k: v for k, v in os.environ.items()
               if k not in own and k not in ("LDP_DEVICE_SECRET", "LDP_DEVICE_SECRET_FILE")}
        env.update(self.settings.to_env())
        if self.secret_file is not None:
            env["LDP_DEVICE_SECRET_FILE"] = str(self.secret_file)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(_ROOT), env.get("PYTHONPATH", "")) if x)
        return env

    def start(self) -> "IngestProcess":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "ldpstream_cli", "ingest"], stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=str(self.run_dir), env=self.environment(),
                                     start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until ``GET /health`` answers 200."""
        wait_http_ok(f"{self.url}/health", self.proc, timeout, "ingest", self.log_tail)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM to its process group and wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.proc is None:
            return None
        stop_child(self.proc, timeout)
        if self._log is not None:
            self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> "IngestProcess":
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_ok(info: dict[str, Any]) -> bool:
    url = f"{info['web_url']}/status"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status != 200:
                return False
            body = resp.read()
    except OSError:
        return False
    check_answer(url, 200, json.loads(body))  # against api-status.v1, in a test session
    return True


def keep_every_step(text: str) -> str:
    """A campaign file's text without its attributes' own ``retention_steps`` (the lines after the first
    ``[[attributes]]``): every attribute keeps the campaign's retention, so a run shorter than it can compare every
    step of every attribute with its truth (the demo's open-domain sketch keeps 6 steps of its own)."""
    head, sep, tail = text.partition("[[attributes]]")
    return head + sep + re.sub(r"(?m)^[ \t]*retention_steps[ \t]*=.*\n?", "", tail)


def unique_campaign_file(path: Path, dest_dir: Path, suffix: str | None = None, *, every_step: bool = False) -> Path:
    """Copy a campaign file under a new id ``"{id}-{suffix}"`` (random suffix by default); ``every_step``: with
    :func:`keep_every_step`.

    Redis keys are per campaign id: tests that share one Redis must not share a campaign id, or their
    counts (and batch ids) mix."""
    old = Campaign.load(path).id
    new = f"{old}-{suffix or uuid.uuid4().hex[:8]}"
    source = Path(path).read_text()
    text, n = re.subn(r'(?m)^(\s*id\s*=\s*)(["\'])' + re.escape(old) + r"\2", rf"\g<1>\g<2>{new}\g<2>",
                      keep_every_step(source) if every_step else source, count=1)
    if n != 1:
        raise ValueError(f"cannot find the id line of campaign {old!r} in {path}")
    out = Path(dest_dir) / f"{Path(path).stem}-{new}.toml"
    out.write_text(text)
    if Campaign.load(out).id != new:  # pragma: no cover - the regex hit another table's id
        raise ValueError(f"rewriting the id of {path} failed")
    return out


def read_counts(redis_url: str, campaign: str, attribute: str, t: int, size: int) -> tuple[np.ndarray, int]:
    """``(counts, n)`` of one step, read synchronously from the count store."""
    step = read_step_sync(redis_url, campaign, attribute, t, size)
    return step["counts"], step["n"]


def wait_for_counts(redis_url: str, campaign: str, expected: dict[tuple[str, int], tuple[np.ndarray, int]],
                    timeout: float = 60.0, poll: float = 0.05) -> dict[tuple[str, int], tuple[np.ndarray, int]]:
    """Wait until every ``(attribute, t) -> (counts, n)`` of ``expected`` is in Redis, exactly.

    Returns the last read counts (equal to ``expected`` on success); raises ``TimeoutError``
    naming the first differing step otherwise. Counts that overshoot never converge: the
    function keeps polling until the timeout, so a double count is reported as a failure.
    """
    deadline = time.monotonic() + timeout
    got: dict[tuple[str, int], tuple[np.ndarray, int]] = {}
    while True:
        bad = None
        for (attr, t), (counts, n) in expected.items():
            got[(attr, t)] = read_counts(redis_url, campaign, attr, t, len(counts))
            if bad is None and (got[(attr, t)][1] != n or not np.array_equal(got[(attr, t)][0], counts)):
                bad = (attr, t)
        if bad is None:
            return got
        if time.monotonic() >= deadline:
            c, n = got[bad]
            raise TimeoutError(f"counts of {campaign}/{bad[0]}/t={bad[1]} never matched: n={n} expected "
                               f"{expected[bad][1]}, {int((c != expected[bad][0]).sum())} values differ")
        time.sleep(poll)


# ---------------------------------------------------------------- observing a worker from outside (tests)
def produce_messages(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    """Send ``(key, value)`` messages to ``topic`` one by one, each acknowledged (``acks=all``)."""
    import asyncio

    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=32 << 20,
                                    **kafka_client_options())
        await producer.start()
        try:
            for key, value in messages:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()
    asyncio.run(send())


def consume_json(bootstrap: str, topic: str, *, idle_seconds: float = 1.0, timeout: float = 30.0) -> list[Any]:
    """Every message of ``topic`` (all partitions, from the beginning) as decoded JSON, read until no new
    message arrived for ``idle_seconds`` (for checking what a worker published on ``ldp.estimates``)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def read() -> list[Any]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False, **kafka_client_options())
        await consumer.start()
        out: list[Any] = []
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=int(idle_seconds * 1000))
                if not batch:
                    break
                out.extend(json.loads(m.value) for msgs in batch.values() for m in msgs)
        finally:
            await consumer.stop()
        return out
    return asyncio.run(read())


def estimate_history(worker: WorkerProcess, campaign: str, attribute: str) -> Any:
    """The worker's ``GET /estimates/{campaign}/{attribute}/history`` document (checked against its schema in a
    test session: :func:`ldpstream_dev.contract.check_answer`)."""
    url = f"{worker.url}/estimates/{campaign}/{attribute}/history"
    with urllib.request.urlopen(url, timeout=5) as r:
        doc = json.loads(r.read())
        check_answer(url, r.status, doc)
    return doc


def final_estimates(history: Any) -> dict[int, dict]:
    """``t -> estimate`` of the final estimates in a history document."""
    items = history.get("estimates", history) if isinstance(history, dict) else history
    if isinstance(items, dict):
        items = list(items.values())
    return {int(d["t"]): d for d in items if d.get("final")}


def wait_until(fetch, ok, timeout: float, what: str = "condition", describe=lambda last: str(last)) -> Any:
    """Poll ``fetch()`` every 0.2 s until ``ok(result)``; return that result, else raise
    ``AssertionError`` naming ``what`` and ``describe(last result)`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = fetch()
        if ok(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what} not reached in {timeout} s; last: {describe(last)[:300]}")


# ---------------------------------------------------------------- a group of workers (scale-out tests, benchmark)
def group_assignment(procs: list[WorkerProcess]) -> list[list[int] | None]:
    """Each worker's partitions of ``ldp.reports`` as its ready file last said (None: not written yet)."""
    out: list[list[int] | None] = []
    for p in procs:
        try:
            out.append(json.loads(p.ready_file.read_text())["assigned"])
        except (OSError, ValueError, KeyError):
            out.append(None)
    return out


def assignment_is_balanced(assigned: list[list[int] | None], partitions: int) -> bool:
    """Every partition owned exactly once, and every worker owns one when there are enough partitions."""
    if any(a is None for a in assigned):
        return False
    owned = [p for a in assigned for p in a or ()]
    if len(owned) != len(set(owned)) or set(owned) != set(range(partitions)):
        return False
    return sum(1 for a in assigned if a) == min(len(assigned), partitions)


def wait_for_balanced_group(procs: list[WorkerProcess], partitions: int, timeout: float = 120.0,
                            poll: float = 0.25) -> list[list[int]]:
    """Wait until the workers' group settled on an assignment that :func:`assignment_is_balanced` accepts (the
    same on two reads in a row: a rebalance rewrites the ready files one by one); returns it, else raises
    ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        now = group_assignment(procs)
        if now == last and assignment_is_balanced(now, partitions):
            return [list(a or ()) for a in now]
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the {len(procs)} workers did not settle on an assignment of all {partitions} "
                               f"partitions in {timeout} s; last: {now}")
        last = now
        time.sleep(poll)
