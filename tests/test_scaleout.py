"""Scale-out: every worker of the group, up to the partition count, owns partitions and counts.

Workers join one after another (as when an operator adds one): after each join the group must
settle on an assignment in which every worker owns at least one partition of ``ldp.reports``,
no partition is owned twice and none is left out; batches sent on every partition are then
counted exactly (no loss, no double count across the rebalances) and every worker counted some.
Faust's sticky assignor, used with its default of one standby replica, gave a third worker that
joined a settled two-worker group nothing; the app runs without standbys (it has no tables), so
Faust uses aiokafka's round-robin assignor.

A worker's Kafka fetches wait at most ``consumer_fetch_max_wait`` for data (Faust fixes 1.5 s, and
tansu holds a waiting fetch that long even when batches arrive meanwhile).
"""
from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka.partitioner import DefaultPartitioner

from ldpstream_dev.workers import (WorkerProcess, assignment_is_balanced, group_assignment, produce_messages,
                              unique_campaign_file, wait_for_balanced_group, wait_for_counts, wait_until)
from ldpstream_cli.bench_pipeline import spread_steps, worker_counts
from stream_app.app import create_app
from stream_app.settings import WorkerSettings
from wire import envelope as E
from wire.campaign import Campaign
from wire.topics import Topics, message_key

pytestmark = pytest.mark.timeout(420)

CAMPAIGN = Path(__file__).parent / "data" / "e2e.toml"
ATTR = "app_version"
PARTITIONS = 4
WORKERS = 4  # joined one by one: the group passes through 1, 2, 3 and 4 workers


def _status(worker: WorkerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{worker.url}/status", timeout=5) as r:
        return json.loads(r.read())


def test_workers_joining_one_by_one_all_own_partitions_and_count_exactly(local_stack, tmp_path) -> None:
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    campaign = Campaign.load(path)
    proto = campaign.attribute(ATTR).protocol
    app_id = f"so-{uuid.uuid4().hex[:6]}"
    topic = Topics.with_prefix(f"{app_id}.").reports
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    rng = np.random.default_rng(5)
    expected: dict[tuple[str, int], tuple[np.ndarray, int]] = {}
    next_t = 0
    workers: list[WorkerProcess] = []
    try:
        for n in range(1, WORKERS + 1):
            workers.append(WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.",
                                         partitions=PARTITIONS, refresh_seconds=0.2, session_timeout=3.0,
                                         run_dir=tmp_path, name=f"w{n - 1}").start())
            workers[-1].wait_ready(timeout=90)
            # settled: every worker owns >= 1 partition, none is owned twice, none is left out
            assigned = wait_for_balanced_group(workers, PARTITIONS, timeout=90)
            assert len(assigned) == n and all(assigned)
            before = [_status(w)["processed"] for w in workers]
            # two batches on every partition, then the counts of every step sent so far must be exact
            messages = []
            steps = spread_steps(ATTR, PARTITIONS, PARTITIONS, next_t)  # step i's key goes to partition i
            for t in steps:
                total, n_total = 0, 0
                for i in range(2):
                    m = 300 + 7 * i
                    reports = proto.randomize(rng.integers(0, proto.k, m), rng, state=proto.new_state(m, rng=rng))
                    total += proto.support(reports)
                    n_total += m
                    messages.append((message_key(t, ATTR),
                                     E.pack_reports(campaign, ATTR, t, reports, batch_id=f"{app_id}:{t}:{i}")))
                expected[(ATTR, t)] = (total, n_total)
            next_t = steps[-1] + 1
            produce_messages(boot, topic, messages)
            wait_for_counts(redis_url, campaign.id, expected, timeout=60)
            after = wait_until(lambda: [_status(w)["processed"] for w in workers],
                               lambda now: all(a > b for a, b in zip(now, before)), 30,
                               f"every one of the {n} workers processing batches of its partitions",
                               describe=lambda now: f"processed before {before}, now {now}, "
                                                    f"assigned {group_assignment(workers)}")
            assert len(after) == n
    finally:
        for w in workers:
            w.stop()


def test_reports_topic_gets_the_configured_partitions(local_stack, tmp_path) -> None:
    """A fresh ``ldp.reports`` is created with ``partitions`` (6 here), not the broker's default (4 on
    tansu): the worker declares it before subscribing, and one worker then owns all six."""
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    app_id = f"so-{uuid.uuid4().hex[:6]}"
    with WorkerProcess([path], local_stack.info.kafka_bootstrap, local_stack.info.redis_url, app_id=app_id,
                       topic_prefix=f"{app_id}.", partitions=6, session_timeout=3.0, run_dir=tmp_path) as w:
        assert sorted(wait_for_balanced_group([w], 6, timeout=60)[0]) == [0, 1, 2, 3, 4, 5]


def test_worker_consumer_fetch_waits_at_most_the_setting() -> None:
    """The consumer Faust builds for a worker carries the setting, not Faust's fixed 1.5 s."""
    async def fetch_wait_ms(**options: Any) -> int:
        app = create_app(WorkerSettings(campaign_paths=(CAMPAIGN,), kafka_bootstrap="127.0.0.1:9",
                                        redis_url="redis://127.0.0.1:9/0", **options))
        consumer = app.consumer._thread._create_worker_consumer(app.transport)  # not started: no connection
        try:
            return consumer._fetch_max_wait_ms
        finally:
            await consumer.stop()

    assert asyncio.run(fetch_wait_ms()) == 100
    assert asyncio.run(fetch_wait_ms(consumer_fetch_max_wait=0.25)) == 250


def test_balanced_assignment_rule() -> None:
    assert assignment_is_balanced([[0, 3], [1], [2]], 4)
    assert assignment_is_balanced([[0], [1], [2], [3], []], 4)  # more workers than partitions: one idles
    assert not assignment_is_balanced([[2, 3], [0, 1], []], 4)  # the bug: a worker without partitions
    assert not assignment_is_balanced([[0, 1], [1, 2, 3]], 4)  # a partition owned twice
    assert not assignment_is_balanced([[0], [1, 2]], 4)  # a partition owned by nobody
    assert not assignment_is_balanced([[0, 1, 2, 3], None], 4)  # a worker not ready yet


def test_bench_rows_and_steps_spread_over_partitions() -> None:
    assert worker_counts(1) == [1] and worker_counts(4) == [1, 2, 4] and worker_counts(6) == [1, 2, 4, 6]
    steps = spread_steps(ATTR, 4, 8, first_t=10)
    assert steps == sorted(set(steps)) and steps[0] >= 10
    partitioner = DefaultPartitioner()
    assert [partitioner(message_key(t, ATTR), [0, 1, 2, 3], [0, 1, 2, 3]) for t in steps] == [0, 1, 2, 3] * 2
