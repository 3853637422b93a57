"""State and position together (issue 8): a Redis that lost data is repaired by a replay from Kafka.

The consumer position of every partition is restored from what the count store recorded (not from
Kafka's committed offsets), and a campaign epoch in the apply script tells a worker that Redis lost
the campaign's keys. Real broker, real Redis, real worker processes: the data loss is a FLUSHALL (what
a restart without persistence or a failover to an empty replica leaves), the topic incarnation a
broker restart with memory storage (topics come back empty, offsets restart at 0).
"""
from __future__ import annotations

import re
import shutil
from contextlib import contextmanager
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import redis

from ldpstream_dev.stack import LocalStack
from ldpstream_dev.workers import (WorkerProcess, consume_json, produce_messages, read_counts, unique_campaign_file,
                              wait_for_counts, wait_until)
from wire import envelope as E
from wire.campaign import Campaign
from wire.topics import Topics, message_key

CAMPAIGN = Path(__file__).parent / "data" / "e2e.toml"
ATTR = "app_version"

pytestmark = pytest.mark.timeout(240)


def _metric(w: WorkerProcess, name: str) -> float:
    with urllib.request.urlopen(f"{w.url}/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def _steps(campaign: Campaign, steps: range, batches: int, per: int, seed: int):
    """Messages (3 batches + a watermark per step, batch ids like a fleet's) and the truth per step."""
    proto = campaign.attribute(ATTR).protocol
    rng = np.random.default_rng(seed)
    producer = uuid.uuid4().hex
    msgs, truth = [], {}
    for t in steps:
        reports = proto.randomize(rng.integers(0, proto.k, batches * per), rng,
                                  state=proto.new_state(batches * per, rng=rng))
        for i in range(batches):
            msgs.append((message_key(t, ATTR), E.pack_reports(campaign, ATTR, t, reports[i * per:(i + 1) * per],
                                                              batch_id=f"{producer}:{t}:{ATTR}:{i}")))
        msgs.append((message_key(t, ATTR), E.pack_watermark(campaign, ATTR, t)))
        truth[(ATTR, t)] = (proto.support(reports), len(reports))
    return msgs, truth


@contextmanager
def _scenario(tmp_path: Path, name: str, broker_storage: str | None = None) -> Iterator[tuple]:
    """A local stack of its own, a fresh campaign copy and topics; yields ``(stack, info, campaign, topics,
    worker)`` where ``worker()`` is the test's worker process (2 partitions, fast refresh and failover)."""
    stack = LocalStack(run_dir=tmp_path / "stack", broker_storage=broker_storage)
    info = stack.up(stop_on_exit=True)
    try:
        path = unique_campaign_file(CAMPAIGN, tmp_path)
        app_id = f"{name}-{uuid.uuid4().hex[:6]}"

        def worker() -> WorkerProcess:
            return WorkerProcess([path], info.kafka_bootstrap, info.redis_url, app_id=app_id,
                                 topic_prefix=f"{app_id}.", partitions=2, refresh_seconds=0.2, session_timeout=3.0,
                                 run_dir=tmp_path)

        yield stack, info, Campaign.load(path), Topics.with_prefix(f"{app_id}."), worker
    finally:
        stack.down()


def _published_finals(boot: str, topics: Topics) -> list[dict]:
    return [d for d in consume_json(boot, topics.estimates) if d.get("final") and d.get("attribute") == ATTR]


def test_redis_data_loss_is_replayed_from_kafka_and_ends_exact(tmp_path) -> None:
    with _scenario(tmp_path, "loss", broker_storage="memory") as (stack, info, campaign, topics, worker):
        before, truth_before = _steps(campaign, range(0, 2), 3, 2_000, seed=1)
        after, truth_after = _steps(campaign, range(2, 4), 3, 2_000, seed=2)
        truth = {**truth_before, **truth_after}
        with worker() as w:
            produce_messages(info.kafka_bootstrap, topics.reports, before)
            wait_for_counts(info.redis_url, campaign.id, truth_before, timeout=60)
            wait_until(lambda: _published_finals(info.kafka_bootstrap, topics), lambda f: len(f) >= 2, 30,
                       "finals of steps 0 and 1")
            redis.Redis.from_url(info.redis_url).flushall()  # Redis lost everything
            produce_messages(info.kafka_bootstrap, topics.reports, after)
            # the worker notices (the campaign's epoch is gone), holds, and replays from the start of the topic
            try:
                wait_for_counts(info.redis_url, campaign.id, truth, timeout=90)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\nworker log:\n{w.log_tail(60)}") from None
            assert _metric(w, "ldp_store_resets_total") >= 1
            with urllib.request.urlopen(f"{w.url}/status", timeout=5) as r:
                status = r.read().decode()
            assert "Redis lost data" in status
            finals = wait_until(lambda: _published_finals(info.kafka_bootstrap, topics),
                                lambda f: {d["t"] for d in f} >= {0, 1, 2, 3}, 60, "finals of steps 0..3")
            for d in finals:  # never a final with a partial (or zero) n, before or after the loss
                assert d["n"] == truth[(ATTR, d["t"])][1], d
            assert sorted(d["t"] for d in finals if d["revision"] == 0) == [0, 1, 2, 3]


def test_a_redis_that_lost_its_last_writes_is_replayed(tmp_path) -> None:
    """Redis restarts from an AOF without its last writes (``appendfsync everysec`` after a crash): the
    campaign epoch survives, so only the positions tell; the worker sees the restart (a new run id), finds
    the positions behind what it handled, and replays."""
    with _scenario(tmp_path, "aof") as (stack, info, campaign, topics, worker):
        before, truth_before = _steps(campaign, range(0, 2), 3, 1_000, seed=6)
        after, truth_after = _steps(campaign, range(2, 4), 3, 1_000, seed=7)
        snapshot = tmp_path / "aof-before"
        with worker() as w:
            produce_messages(info.kafka_bootstrap, topics.reports, before)
            wait_for_counts(info.redis_url, campaign.id, truth_before, timeout=60)
            time.sleep(1.5)  # appendfsync everysec: steps 0-1 are on disk
            shutil.copytree(tmp_path / "stack" / "appendonlydir", snapshot)
            produce_messages(info.kafka_bootstrap, topics.reports, after)
            wait_for_counts(info.redis_url, campaign.id, {**truth_before, **truth_after}, timeout=60)

            def lose_the_last_writes(data_dir: Path) -> None:
                shutil.rmtree(data_dir / "appendonlydir")
                shutil.copytree(snapshot, data_dir / "appendonlydir")

            stack.restart_redis(kill=True, while_stopped=lose_the_last_writes)
            assert read_counts(info.redis_url, campaign.id, ATTR, 3, len(truth_after[(ATTR, 3)][0]))[1] == 0
            try:
                wait_for_counts(info.redis_url, campaign.id, {**truth_before, **truth_after}, timeout=60)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\nworker log:\n{w.log_tail(60)}") from None
            assert _metric(w, "ldp_store_resets_total") >= 1


def test_a_recreated_topic_is_replayed_not_skipped(tmp_path) -> None:
    """A memory broker restarts empty: the new incarnation's offsets restart at 0, below the positions the
    store recorded. Its messages must be counted, not skipped as "already applied"."""
    with _scenario(tmp_path, "inc", broker_storage="memory") as (stack, info, campaign, topics, worker):
        first, truth_first = _steps(campaign, range(0, 4), 3, 1_000, seed=3)
        first = first[:-1]  # step 3 stays open: its watermark and more batches come after the restart
        more, truth_more = _steps(campaign, range(3, 4), 2, 1_000, seed=4)
        second = more + _steps(campaign, range(4, 5), 2, 1_000, seed=5)[0]
        proto = campaign.attribute(ATTR).protocol
        truth = {**truth_first, (ATTR, 4): _steps(campaign, range(4, 5), 2, 1_000, seed=5)[1][(ATTR, 4)],
                 (ATTR, 3): (truth_first[(ATTR, 3)][0] + truth_more[(ATTR, 3)][0],
                             truth_first[(ATTR, 3)][1] + truth_more[(ATTR, 3)][1])}
        assert len(truth[(ATTR, 3)][0]) == proto.support_size
        with worker() as w:
            produce_messages(info.kafka_bootstrap, topics.reports, first)
            wait_for_counts(info.redis_url, campaign.id, truth_first, timeout=60)
            stack.restart_broker()  # memory storage: the topics come back empty
            w.wait_ready(timeout=60)
            # offsets from 0 again, into step 3 whose hash already holds batches from offsets up to 8
            produce_messages(info.kafka_bootstrap, topics.reports, second)
            try:
                wait_for_counts(info.redis_url, campaign.id, truth, timeout=90)
            except TimeoutError as exc:
                raise AssertionError(f"{exc}\nworker log:\n{w.log_tail(80)}") from None
            # (batches of the new incarnation applied before the recreation was noticed are replayed and
            # skipped by their batch ids: the counts above are exact either way)
