"""Outages: workers and the fleet producer against a local stack whose Redis or broker goes away.

Each test injects one fault into a stack of its own module (durable broker storage, so a
restarted broker keeps its topics, records and group offsets) and checks what the issue asked
for: the health check tells the truth (``GET /health`` 503, ``ldp_worker_healthy`` 0), the worker
waits for a broker that is not there yet instead of exiting, SIGTERM stops a worker in every
state within seconds, and the counts are exact once the fault is repaired.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ldpstream_dev.probes import redis_ping
from ldpstream_dev.contract import check_topics
from ldpstream_dev.stack import LocalStack
from ldpstream_dev.workers import WorkerProcess, produce_messages, read_counts, unique_campaign_file, wait_for_counts, \
    wait_until
from producers.fleet import FleetConfig, publish_sync
from wire import envelope
from wire.campaign import Campaign
from wire.topics import Topics, message_key

pytestmark = pytest.mark.timeout(240)

DEMO = Path(__file__).resolve().parent / "data" / "fleet-health.toml"
#: A clean stop (2-3 s on a quiet machine, up to ~15 s on a loaded one) must end the worker before its
#: shutdown watchdog would (exit status 0, asserted below; the watchdog's forced exit has another status).
#: The harness gives the watchdog 20 s here and waits for the exit a little longer, so that a stuck
#: shutdown shows as the watchdog's status and log rather than as a wait that ran out.
WATCHDOG = 20.0
STOP_WITHIN = WATCHDOG + 10.0


# ---------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A stack of this module only: its services are killed and restarted by the tests."""
    s = LocalStack(run_dir=tmp_path_factory.mktemp("outage-stack"), broker_storage="durable")
    s.up(timeout=60.0, stop_on_exit=True)
    try:
        yield s
        checked, broken = check_topics(s.info.kafka_bootstrap)  # what the outages left published (docs/estimates.md)
    finally:
        s.down()
    assert not broken, f"{len(broken)} of {checked} estimates break the contract:\n" + "\n".join(broken[:10])


def _setup(stack: LocalStack, run_dir: Path) -> SimpleNamespace:
    """A fresh campaign id, consumer group and topic prefix, and a way to start workers on them."""
    tag = uuid.uuid4().hex[:8]
    cfile = unique_campaign_file(DEMO, run_dir, tag)
    info = stack.info
    assert info is not None

    def worker(name: str = "worker") -> WorkerProcess:
        return WorkerProcess([cfile], info.kafka_bootstrap, info.redis_url, app_id=f"outage-{tag}",
                             topic_prefix=f"{tag}.", refresh_seconds=0.5, run_dir=run_dir, name=name,
                             shutdown_timeout=WATCHDOG)

    return SimpleNamespace(campaign=Campaign.load(cfile), worker=worker, kafka=info.kafka_bootstrap,
                           redis=info.redis_url, reports=Topics.with_prefix(f"{tag}.").reports)


def _ready(worker: WorkerProcess) -> WorkerProcess:
    worker.start()
    worker.wait_ready(timeout=120, partitions=4)
    return worker


def _step(campaign: Campaign, attr: str, t: int, sizes: list[int], seed: int,
          watermark: bool = False) -> tuple[list[tuple[bytes, bytes]], dict]:
    """Batches (with stable batch ids) of one step, optionally its watermark, and the expected counts."""
    proto = campaign.attributes[attr].protocol
    rng = np.random.default_rng(seed)
    reports = proto.randomize(rng.integers(0, proto.k, sum(sizes)), rng, state=proto.new_state(sum(sizes)))
    key, msgs, lo = message_key(t, attr), [], 0
    for i, n in enumerate(sizes):
        msgs.append((key, envelope.pack_reports(campaign, attr, t, reports[lo:lo + n], batch_id=f"s{seed}:{t}:{i}")))
        lo += n
    if watermark:
        msgs.append((key, envelope.pack_watermark(campaign, attr, t)))
    return msgs, {(attr, t): (proto.support(reports), len(reports))}


def _health(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{worker.url}/health", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _status(worker: WorkerProcess) -> tuple[int, dict[str, Any]]:
    with urllib.request.urlopen(f"{worker.url}/status", timeout=5) as resp:
        return resp.status, json.loads(resp.read())


def _problems(doc: dict[str, Any]) -> set[str]:
    return {p["problem"] for p in doc["problems"]}


def _metrics(worker: WorkerProcess) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"{worker.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _stop_redis(stack: LocalStack, sig: int) -> None:
    """SIGTERM: Redis exits (fsyncing its AOF), clients are refused; SIGSTOP: it hangs, clients wait."""
    assert stack.info is not None
    os.kill(stack.info.redis_pid, sig)
    if sig == signal.SIGTERM:
        wait_until(lambda: redis_ping(stack.info.redis_port), lambda up: not up, 10, "redis-server stopped")


def _restore_redis(stack: LocalStack, sig: int) -> None:
    assert stack.info is not None
    if sig == signal.SIGSTOP:
        os.kill(stack.info.redis_pid, signal.SIGCONT)
    else:
        stack.restart_redis(kill=False)


def _sigterm(worker: WorkerProcess) -> tuple[float, int | None]:
    """SIGTERM ``worker``; (seconds until it exited, exit status), or fail after ``STOP_WITHIN`` s (then SIGKILL)."""
    assert worker.proc is not None
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        status = worker.proc.wait(STOP_WITHIN)
    except subprocess.TimeoutExpired:
        worker.kill()
        pytest.fail(f"the worker did not stop within {STOP_WITHIN} s of SIGTERM; log:\n{worker.log_tail()}")
    worker.stop()  # closes the log
    return time.monotonic() - began, status


# ---------------------------------------------------------------------------- the faults
def test_redis_outage_fails_the_health_check_and_counting_resumes_exactly(stack, tmp_path):
    env = _setup(stack, tmp_path)
    c = env.campaign
    worker = _ready(env.worker())
    try:
        status, doc = _health(worker)
        assert (status, doc["healthy"], doc["problems"]) == (200, True, [])
        assert _metrics(worker)[("ldp_worker_healthy", frozenset())] == 1.0
        before, expected = _step(c, "opt_in", 1, [300, 200], seed=1)
        produce_messages(env.kafka, env.reports, before)
        wait_for_counts(env.redis, c.id, expected, timeout=60)

        _stop_redis(stack, signal.SIGTERM)
        try:
            during, expected_during = _step(c, "opt_in", 1, [150, 50], seed=2, watermark=True)
            produce_messages(env.kafka, env.reports, during)
            status, doc = wait_until(lambda: _health(worker), lambda r: r[0] == 503 and {"redis", "store_retry"}
                                     <= _problems(r[1]), 10, "/health 503 naming redis and store_retry",
                                     describe=lambda r: json.dumps(r))
            assert not doc["healthy"] and {p["component"] for p in doc["problems"]} == {"redis"}
            status, st = _status(worker)  # /status keeps answering, and tells the same
            assert status == 200 and st["healthy"] is False and {"redis", "store_retry"} <= _problems(st)
            m = _metrics(worker)
            assert m[("ldp_worker_healthy", frozenset())] == 0.0
            assert m[("ldp_worker_problem_seconds", frozenset({("problem", "redis"), ("component", "redis")}))] >= 0
            assert m[("ldp_store_retries_total", frozenset())] >= 1
        finally:
            _restore_redis(stack, signal.SIGTERM)
        # the batches that waited are counted once, with the ones from before the outage
        (key, (c1, n1)), = expected.items()
        c2, n2 = expected_during[key]
        wait_for_counts(env.redis, c.id, {key: (c1 + c2, n1 + n2)}, timeout=60)
        status, doc = wait_until(lambda: _health(worker), lambda r: r[0] == 200, 10, "/health 200 again",
                                 describe=lambda r: json.dumps(r))
        assert doc["problems"] == [] and _metrics(worker)[("ldp_worker_healthy", frozenset())] == 1.0
        assert _metrics(worker)[("ldp_reports_total", frozenset({("campaign", c.id), ("attribute", "opt_in")}))] \
            == n1 + n2
    finally:
        worker.stop()


def test_a_worker_started_while_the_broker_is_down_waits_for_it_then_counts(stack, tmp_path):
    env = _setup(stack, tmp_path)
    assert stack.info is not None
    os.kill(stack.info.broker_pid, signal.SIGKILL)
    worker = env.worker()
    worker.start()
    try:
        try:
            wait_until(lambda: worker.log_path.read_text(errors="replace"),
                       lambda log: log.count("is unreachable (attempt") >= 3, 30,
                       "three logged attempts to reach the broker", describe=lambda log: log[-600:])
            assert worker.proc is not None and worker.proc.poll() is None  # still waiting, not exited
        finally:
            stack.restart_broker()
        worker.wait_ready(timeout=120, partitions=4)
        msgs, expected = _step(env.campaign, "app_version", 4, [400, 100], seed=3, watermark=True)
        produce_messages(env.kafka, env.reports, msgs)
        wait_for_counts(env.redis, env.campaign.id, expected, timeout=60)
        assert "answers after" in worker.log_path.read_text(errors="replace")
    finally:
        worker.stop()


@pytest.mark.parametrize("fault", ["redis-stopped", "redis-frozen", "broker-down"])
def test_sigterm_stops_a_worker_that_cannot_progress_and_nothing_is_lost(stack, tmp_path, fault):
    """SIGTERM while Redis refuses (the store call retrying), hangs (the call waiting), or the broker is gone."""
    env = _setup(stack, tmp_path)
    c = env.campaign
    assert stack.info is not None
    worker = _ready(env.worker())
    msgs, expected = _step(c, "opt_in", 7, [250, 250], seed=4, watermark=True)
    try:
        if fault == "broker-down":
            produce_messages(env.kafka, env.reports, msgs)
            wait_for_counts(env.redis, c.id, expected, timeout=60)
            os.kill(stack.info.broker_pid, signal.SIGKILL)
            symptom = "kafka"
        else:
            sig = signal.SIGTERM if fault == "redis-stopped" else signal.SIGSTOP
            _stop_redis(stack, sig)
            produce_messages(env.kafka, env.reports, msgs)
            symptom = "store_retry" if fault == "redis-stopped" else "redis"
        try:
            wait_until(lambda: _status(worker)[1], lambda st: symptom in _problems(st) and st["processed"] >= 1, 15,
                       f"the worker stuck with {symptom} and a message in hand", describe=json.dumps)
            seconds, exit_status = _sigterm(worker)
            print(f"{fault}: stopped {seconds:.2f} s after SIGTERM, exit status {exit_status}")
            assert exit_status == 0, worker.log_tail()  # a clean stop, not the watchdog's forced exit
        finally:
            if fault == "broker-down":
                stack.restart_broker()
            else:
                _restore_redis(stack, sig)
        # nothing was lost nor counted twice: a new worker finishes the job
        with env.worker("successor") as successor:
            wait_for_counts(env.redis, c.id, expected, timeout=90)
            assert read_counts(env.redis, c.id, "opt_in", 7, 2)[1] == 500
            assert successor.proc is not None and successor.proc.poll() is None
    finally:
        worker.stop()


def test_the_fleet_producer_survives_a_broker_outage_with_exact_counts(stack, tmp_path):
    env = _setup(stack, tmp_path)
    assert stack.info is not None
    worker = _ready(env.worker())
    restarted = threading.Event()

    def restart() -> None:
        stack.restart_broker()
        restarted.set()

    def outage_after_first_step(t: int, summary: Any) -> None:
        if t == 0:  # step 0 is acknowledged; the broker dies and comes back 4 s later
            os.kill(stack.info.broker_pid, signal.SIGKILL)
            threading.Timer(4.0, restart).start()

    try:
        cfg = FleetConfig(env.campaign, n_devices=3000, steps=3, batch_size=1000, seed=11)
        # a short request timeout: the client gives a batch up during the outage, the publisher resends it
        summary = publish_sync(cfg, env.kafka, env.reports, on_step=outage_after_first_step, retry_deadline=60,
                               producer_options={"request_timeout_ms": 2000})
        # (the publisher may finish before restart_broker's own readiness wait returns)
        assert restarted.wait(30) and summary.outages >= 1 and summary.resent >= 1
        assert summary.reports_sent == 3000 * len(env.campaign.attributes) * 3
        expected = {key: (d["support"], d["n"]) for key, d in summary.per_step.items()}
        assert len(expected) == 3 * len(env.campaign.attributes)
        wait_for_counts(env.redis, env.campaign.id, expected, timeout=120)
    finally:
        if not restarted.wait(30):
            stack.restart_broker()
        worker.stop()
