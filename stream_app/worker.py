"""Run one stream-app worker in the current process (``ldp worker`` and ``python -m stream_app.worker``).

The worker blocks until SIGTERM or SIGINT, then stops cleanly: it flushes the HTTP ingest queue,
releases the estimator lease, commits offsets and leaves the consumer group.

Readiness: with ``ready_file`` set, the worker writes JSON there (pid, ``web_port``, ``web_url``,
``assigned`` partitions of ``ldp.reports``, topic names) once it owns partitions and serves HTTP,
and rewrites it after every rebalance; it also logs ``ldp worker <id> owns ... partitions [...]; web http://...``
(WARNING level, so it shows at the default log level)::

    python -m stream_app.worker --campaign deploy/campaigns/demo.toml \\
        --kafka 127.0.0.1:9092 --redis redis://127.0.0.1:6379/0 --web-port 6066 \\
        --session-timeout 6 --ready-file /tmp/w1.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["WorkerProcess", "main", "read_counts", "run_worker", "unique_campaign_file", "wait_for_counts"]


def run_worker(campaign_paths: list[Path], kafka_bootstrap: str, redis_url: str, web_port: int | None = None,
               loglevel: str = "warning", *, app_id: str = "ldp-stream", partitions: int = 4,
               refresh_seconds: float = 1.0, session_timeout: float | None = None, data_dir: Path | None = None,
               web_host: str = "127.0.0.1", web_bind: str | None = None, topic_prefix: str = "",
               ready_file: Path | None = None, logfile: str | None = None) -> None:
    """Build the app (:func:`stream_app.app.create_app`) and run it until SIGTERM/SIGINT.

    The support kernels run single-threaded in a worker: a worker is one event loop on one core,
    and numba's thread pool only adds launch overhead and oversubscription next to the broker;
    scale out with more workers (partitions) instead.
    """
    import faust
    import numba

    from .app import create_app

    numba.set_num_threads(1)

    app = create_app(list(campaign_paths), kafka_bootstrap, redis_url, app_id=app_id, web_port=web_port,
                     partitions=partitions, refresh_seconds=refresh_seconds, session_timeout=session_timeout,
                     data_dir=data_dir, web_host=web_host, web_bind=web_bind, topic_prefix=topic_prefix,
                     ready_file=ready_file)
    worker = faust.Worker(app, loglevel=loglevel, logfile=logfile, quiet=True,
                          redirect_stdouts=False)
    worker.spinner = None  # no terminal spinner escape codes in log files
    worker.execute_from_commandline()


class WorkerProcess:
    """A worker in a child process (``python -m stream_app.worker``), for tests, benches and the demo.

    ``start()`` launches it; ``wait_ready()`` waits for its ready file (``info`` then holds the ports
    and assigned partitions); ``stop()`` sends SIGTERM and waits (clean shutdown); ``kill()`` sends
    SIGKILL (crash). The worker's output goes to ``log_path``.
    """

    def __init__(self, campaign_paths: list[Path], kafka_bootstrap: str, redis_url: str, *,
                 app_id: str = "ldp-stream", web_port: int | None = None, partitions: int = 4,
                 refresh_seconds: float = 1.0, session_timeout: float | None = 6.0, topic_prefix: str = "",
                 run_dir: Path | None = None, loglevel: str = "warning", name: str = "worker",
                 extra_args: list[str] | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-worker-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ready_file = self.run_dir / f"{name}.ready.json"
        self.log_path = self.run_dir / f"{name}.log"
        self.args = [sys.executable, "-m", "stream_app.worker", "--kafka", kafka_bootstrap, "--redis", redis_url,
                     "--app-id", app_id, "--partitions", str(partitions), "--refresh", str(refresh_seconds),
                     "--topic-prefix", topic_prefix, "--ready-file", str(self.ready_file),
                     "--data-dir", str(self.run_dir / f"{name}.data"), "--loglevel", loglevel]
        for p in campaign_paths:
            self.args += ["--campaign", str(Path(p).resolve())]
        if web_port is not None:
            self.args += ["--web-port", str(web_port)]
        if session_timeout is not None:
            self.args += ["--session-timeout", str(session_timeout)]
        self.args += list(extra_args or [])
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}

    @property
    def url(self) -> str:
        """Base URL of the worker's web server (after :meth:`wait_ready`)."""
        return self.info["web_url"]

    def start(self) -> "WorkerProcess":
        self.ready_file.unlink(missing_ok=True)
        root = Path(__file__).resolve().parent.parent
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(root), env.get("PYTHONPATH", "")) if x)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(self.run_dir),
                                     env=env, start_new_session=True)
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

    def refresh_info(self) -> dict[str, Any]:
        self.info = json.loads(self.ready_file.read_text())
        return self.info

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
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash: no commit, no group leave, no lease release)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None:
            self._log.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "WorkerProcess":
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _http_ok(info: dict[str, Any]) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{info['web_url']}/status", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def unique_campaign_file(path: Path, dest_dir: Path, suffix: str | None = None) -> Path:
    """Copy a campaign file under a new id ``"{id}-{suffix}"`` (random suffix by default).

    Redis keys are per campaign id and the offset check is per (key, partition): tests that share
    one Redis but use fresh topics (offsets restarting at 0) must not share a campaign id, or the
    new batches are skipped as already applied."""
    import re
    import uuid

    from estimators.campaign import Campaign

    old = Campaign.load(path).id
    new = f"{old}-{suffix or uuid.uuid4().hex[:8]}"
    text, n = re.subn(r'(?m)^(\s*id\s*=\s*)(["\'])' + re.escape(old) + r"\2", rf"\g<1>\g<2>{new}\g<2>",
                      Path(path).read_text(), count=1)
    if n != 1:
        raise ValueError(f"cannot find the id line of campaign {old!r} in {path}")
    out = Path(dest_dir) / f"{Path(path).stem}-{new}.toml"
    out.write_text(text)
    if Campaign.load(out).id != new:  # pragma: no cover - the regex hit another table's id
        raise ValueError(f"rewriting the id of {path} failed")
    return out


def read_counts(redis_url: str, campaign: str, attribute: str, t: int, size: int) -> tuple[np.ndarray, int]:
    """``(counts, n)`` of one step, read synchronously from Redis."""
    import redis

    from .store import count_key

    client = redis.Redis.from_url(redis_url)
    try:
        raw = client.hgetall(count_key(campaign, attribute, t))
    finally:
        client.close()
    counts = np.zeros(size, dtype=np.int64)
    for k, v in raw.items():
        if k.startswith(b"c:"):
            counts[int(k[2:])] = int(v)
    return counts, int(raw.get(b"n", 0))


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m stream_app.worker", description=__doc__.split("\n")[0])
    ap.add_argument("--campaign", "-c", action="append", required=True, type=Path,
                    help="campaign TOML file (repeatable)")
    ap.add_argument("--kafka", required=True, help="bootstrap servers, host:port[,host:port]")
    ap.add_argument("--redis", required=True, help="redis URL, e.g. redis://127.0.0.1:6379/0")
    ap.add_argument("--web-port", type=int, default=None, help="HTTP port (default: a free port)")
    ap.add_argument("--web-host", default="127.0.0.1", help="host name in URLs (and bind address)")
    ap.add_argument("--web-bind", default=None, help="bind address (default: --web-host; 0.0.0.0 in containers)")
    ap.add_argument("--app-id", default="ldp-stream", help="Faust app id = consumer group")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--refresh", type=float, default=1.0, help="estimator refresh period (s)")
    ap.add_argument("--session-timeout", type=float, default=None, help="consumer-group session timeout (s)")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--topic-prefix", default="")
    ap.add_argument("--ready-file", type=Path, default=None)
    ap.add_argument("--loglevel", default="warning")
    ap.add_argument("--logfile", default=None)
    a = ap.parse_args(argv)
    run_worker(a.campaign, a.kafka, a.redis, a.web_port, a.loglevel, app_id=a.app_id, partitions=a.partitions,
               refresh_seconds=a.refresh, session_timeout=a.session_timeout, data_dir=a.data_dir,
               web_host=a.web_host, web_bind=a.web_bind, topic_prefix=a.topic_prefix, ready_file=a.ready_file,
               logfile=a.logfile)


if __name__ == "__main__":
    main(sys.argv[1:])
