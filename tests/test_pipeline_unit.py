"""The worker's hot path as pure logic (:class:`stream_app.pipeline.Pipeline`): no Faust, no Kafka, no Redis.

The pipeline is driven with an in-memory store that implements :class:`stream_app.pipeline.StepStore` (per-step
counts, the batch ids applied, positions) and the real :class:`stream_app.recovery.Recovery` without a consumer or
broker. These are unit tests of the decode -> validate -> support -> apply logic; the same paths against a real
Redis and broker are in test_worker.py, test_fuzz.py and test_exactly_once.py.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_app.health import Health
from stream_app.metrics import Metrics
from stream_app.pipeline import Pipeline, StoreCalls
from stream_app.recovery import Recovery
from stream_app.store import (ALREADY_CLOSED, APPLIED, DUPLICATE_BATCH_ID, FUTURE_STEP, STORE_RESET, Position,
                              StepBound)
from wire import envelope
from wire.campaign import Campaign
from wire.topics import Topics

CAMPAIGN = Campaign.load(Path(__file__).parent / "data" / "e2e.toml")
ATTR = "app_version"


class MemoryStore:
    """A :class:`~stream_app.pipeline.StepStore` in memory: counts and n per step, batch ids, positions."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int], np.ndarray] = {}
        self.n: dict[tuple[str, str, int], int] = {}
        self.batch_ids: set[tuple[str, str, int, str]] = set()
        self.closed: set[tuple[str, str, int]] = set()
        self.positions: dict[int, tuple[int, str]] = {}
        self.reset_next = False  # answer the next apply with STORE_RESET (Redis lost the campaign's keys)
        self.calls = 0
        self.incomplete: dict[tuple[str, str, int], str] = {}  # step -> why the broker may have lost its reports
        self.loss_marks_: dict[int, dict[str, tuple[int, str]]] = {}  # partition -> campaign -> (since, why)

    async def server_id(self) -> str:  # the recovery's side: one server, never restarted
        return "memory"

    async def apply_batch(self, campaign: str, attribute: str, t: int, counts: np.ndarray, n: int, batch_id: str,
                          where: str = "", position: Position | None = None, bound: StepBound = StepBound(), *,
                          rejected: int = 0, reports: bytes = b"") -> int:
        self.calls += 1
        if self.reset_next:
            self.reset_next = False
            return STORE_RESET
        if envelope.is_wall_clock(batch_id) and t > bound.wall_limit:  # only the wall-clock bound is modelled
            return FUTURE_STEP
        if (campaign, attribute, t, batch_id) in self.batch_ids:
            status = DUPLICATE_BATCH_ID
        else:
            self.batch_ids.add((campaign, attribute, t, batch_id))
            key = (campaign, attribute, t)
            self.counts[key] = self.counts.get(key, 0) + np.asarray(counts, dtype=np.int64)
            self.n[key] = self.n.get(key, 0) + n
            status = APPLIED
        if position is not None:
            await self.set_position(position)
        return status

    async def apply_watermark(self, campaign: str, attribute: str, t: int, position: Position | None = None,
                              bound: StepBound = StepBound(), count: int = 0) -> int:
        self.calls += 1
        first = (campaign, attribute, t) not in self.closed
        self.closed.add((campaign, attribute, t))
        if position is not None:
            await self.set_position(position)
        return APPLIED if first else ALREADY_CLOSED

    async def set_position(self, position: Position) -> None:
        self.positions[position.partition] = (position.offset, position.ident)

    async def set_loss_marks(self, app_id: str, topic: str, marks) -> None:
        for p, by_campaign in marks.items():
            self.loss_marks_.setdefault(p, {}).update(by_campaign)

    async def loss_marks(self, app_id: str, topic: str, partitions):
        return {p: dict(m) for p, m in self.loss_marks_.items() if p in set(partitions)}

    async def clear_loss_mark(self, app_id: str, topic: str, partition: int, campaign: str) -> None:
        self.loss_marks_.get(partition, {}).pop(campaign, None)

    async def record_closed_at(self, campaign: str, attribute: str, t: int, when: float) -> None:
        pass

    async def wake_estimator(self, app_id: str, campaign: str, attribute: str, t: int) -> None:
        pass

    # the recovery's side of an unrepairable broker loss
    async def unfinished_steps(self, campaign: str, attribute: str) -> list[int]:
        return sorted(t for (c, a, t) in self.n if (c, a) == (campaign, attribute) and (c, a, t) not in self.closed)

    async def mark_incomplete(self, campaign: str, attribute: str, ts, why: str) -> None:
        for t in ts:
            self.incomplete[(campaign, attribute, t)] = why


def _rig() -> tuple[Pipeline, MemoryStore, Recovery, list[dict[str, Any]]]:
    campaigns = {CAMPAIGN.id: CAMPAIGN}
    store, metrics = MemoryStore(), Metrics()
    health = Health(metrics, [])
    calls = StoreCalls(health, metrics)
    alarms: dict[str, dict[str, Any]] = {}
    recovery = Recovery(campaigns, store, metrics, health, alarms, calls=calls, app_id="unit",  # type: ignore[arg-type]
                        topic=Topics().reports)
    published: list[dict[str, Any]] = []

    async def send_rejected(key: bytes | None, doc: dict[str, Any]) -> None:
        published.append(doc)

    pipe = Pipeline(campaigns, store, metrics, calls=calls, recovery=recovery, app_id="unit", topics=Topics(),
                    worker_id="w", send_rejected=send_rejected)
    return pipe, store, recovery, published


def _reports(n: int, seed: int) -> np.ndarray:
    proto = CAMPAIGN.attribute(ATTR).protocol
    rng = np.random.default_rng(seed)
    return proto.randomize(rng.integers(0, proto.k, n), rng, state=proto.new_state(n, rng=rng))


def test_counts_duplicates_watermarks_and_rejections():
    pipe, store, recovery, published = _rig()
    proto = CAMPAIGN.attribute(ATTR).protocol
    a, b = _reports(300, 1), _reports(200, 2)
    blob_a = envelope.pack_reports(CAMPAIGN, ATTR, 0, a, batch_id="u:0:a:0")
    blob_b = envelope.pack_reports(CAMPAIGN, ATTR, 0, b, batch_id="u:0:a:1")
    bad = envelope.pack(CAMPAIGN.id, ATTR, proto.name, "00" * 8, 0, len(a), proto.encode(a), batch_id="u:bad")

    async def run() -> list[str]:
        return [await pipe.process(blob_a, 0, 0), await pipe.process(blob_a, 0, 1),  # a redelivery
                await pipe.process(bad, 0, 2), await pipe.process(b"garbage", 0, 3), await pipe.process(None, 0, 4),
                await pipe.process(blob_b, 1, 0), await pipe.process(envelope.pack_watermark(CAMPAIGN, ATTR, 0), 1, 1),
                await pipe.process(blob_b, 1, 2)]

    assert asyncio.run(run()) == ["applied", "duplicate", "rejected", "rejected", "rejected", "applied", "watermark",
                                  "duplicate"]
    key = (CAMPAIGN.id, ATTR, 0)
    assert store.n[key] == 500 and np.array_equal(store.counts[key], proto.support(a) + proto.support(b))
    assert store.closed == {key}
    assert [d["reason"] for d in published] == ["wrong_fingerprint", "malformed", "malformed"]
    assert all(d["source"] == "kafka" and d["worker"] == "w" for d in published)
    # every message is recorded as handled, rejected ones too: the stream's progress passes them
    assert store.positions[0][0] == 4 and store.positions[1][0] == 2
    assert recovery.last_offsets == {0: 4, 1: 2} and recovery.applied_offsets == {(CAMPAIGN.id, 0): 1,
                                                                                  (CAMPAIGN.id, 1): 2}
    sample = pipe.metrics.registry.get_sample_value
    assert sample("ldp_reports_total", {"campaign": CAMPAIGN.id, "attribute": ATTR}) == 500
    assert sample("ldp_duplicate_batches_total", {"campaign": CAMPAIGN.id, "attribute": ATTR}) == 2
    assert sample("ldp_rejected_batches_total", {"reason": "malformed"}) == 2
    assert sample("ldp_watermarks_total", {"campaign": CAMPAIGN.id, "attribute": ATTR}) == 1
    assert pipe.processed == 8


def test_a_store_loss_holds_the_stream_until_the_replay():
    """A STORE_RESET answer: the message is held (not counted, not recorded), the ``store_reset`` alarm blocks the
    worker, and every later message is held until the recovery's replay starts (on the next assignment)."""
    pipe, store, recovery, _ = _rig()
    a = _reports(50, 3)
    store.reset_next = True

    async def run() -> list[str]:
        out = [await pipe.process(envelope.pack_reports(CAMPAIGN, ATTR, 0, a, batch_id="u:1:a:0"), 0, 7),
               await pipe.process(envelope.pack_reports(CAMPAIGN, ATTR, 0, a, batch_id="u:1:a:1"), 0, 8),
               await pipe.process(b"garbage", 0, 9)]
        await recovery.restored({0: 7})  # the rebalance moved the consumer back to the store's position
        out += [await pipe.process(envelope.pack_reports(CAMPAIGN, ATTR, 0, a, batch_id="u:1:a:1"), 0, 8),
                await pipe.process(envelope.pack_reports(CAMPAIGN, ATTR, 0, a, batch_id="u:1:a:0"), 0, 7)]
        return out

    assert asyncio.run(run()) == ["held", "held", "rejected", "held", "applied"]
    assert store.n == {(CAMPAIGN.id, ATTR, 0): 50} and store.positions == {0: (7, envelope.message_ident(
        envelope.parse(envelope.pack_reports(CAMPAIGN, ATTR, 0, a, batch_id="u:1:a:0"))))}
    assert recovery.alarms["store_reset"]["blocking"] is False  # the replay runs: listed, no longer blocking
    assert not recovery.holding
    assert pipe.metrics.registry.get_sample_value("ldp_store_resets_total", {"campaign": CAMPAIGN.id}) == 1


def test_an_unrepairable_loss_marks_the_steps_the_lost_backlog_may_have_held():
    """The broker lost a partition's unread backlog (steps 3..5 were sent, never read: the store never saw them);
    the partition's next message is of step 5. Steps 2..5 of every attribute are marked incomplete before step 5's
    batch is counted, and only once; another partition's messages mark nothing."""
    pipe, store, recovery, _ = _rig()
    blob = lambda t, i: envelope.pack_reports(CAMPAIGN, ATTR, t, _reports(50, 10 + i), batch_id=f"u:{t}:a:{i}")

    async def run() -> None:
        await pipe.process(blob(2, 0), 0, 0)  # the worker's stream step: 2
        await recovery.broker_lost([0], "the broker lost partition 0")
        assert set(store.incomplete) == {(CAMPAIGN.id, ATTR, 2)}  # what the store knew at the loss
        marked_before = set()

        async def mark(*args) -> None:  # the marks are stored before the batch's counts
            marked_before.update(k for k in store.incomplete if k not in store.n)
            return await real_apply(*args)

        real_apply, store.apply_batch = store.apply_batch, mark
        await pipe.process(blob(5, 1), 0, 0)
        assert {(CAMPAIGN.id, ATTR, 5)} <= marked_before
        store.apply_batch = real_apply
        await pipe.process(blob(9, 2), 1, 0)  # partition 1 lost nothing
        await pipe.process(blob(8, 3), 0, 1)  # the loss is marked once, at the partition's first message after it

    asyncio.run(run())
    want = {(CAMPAIGN.id, a, t) for a in CAMPAIGN.attributes for t in range(2, 6)}
    assert set(store.incomplete) == want and recovery.lost_from == {}


def test_a_loss_mark_follows_its_partition_to_the_worker_that_owns_it_next():
    """Worker A detects the loss of partition 0's backlog; a rebalance gives the partition to worker B (a new
    recovery on the same store) before its next message: B marks the lost steps before counting it, as A would have,
    and the mark is gone from the store afterwards."""
    pipe_a, store, recovery_a, _ = _rig()
    pipe_b, _, recovery_b, _ = _rig()
    pipe_b.store = recovery_b.store = store  # one count store, two workers
    blob = lambda t, i: envelope.pack_reports(CAMPAIGN, ATTR, t, _reports(50, 10 + i), batch_id=f"m:{t}:a:{i}")

    async def run() -> None:
        await pipe_a.process(blob(2, 0), 0, 0)
        await recovery_a.broker_lost([0], "the broker lost partition 0")
        assert store.loss_marks_[0][CAMPAIGN.id][0] == 2
        await recovery_b.load_loss_marks([0])  # what its on_assignment does first
        assert recovery_b.lost_before(0, CAMPAIGN.id)
        await pipe_b.process(blob(4, 1), 0, 0)

    asyncio.run(run())
    want = {(CAMPAIGN.id, a, t) for a in CAMPAIGN.attributes for t in range(2, 5)}
    assert set(store.incomplete) >= want and not store.loss_marks_[0]


class _HoleBroker:
    """The reports topic as the recovery reads it outside the group: messages everywhere but at ``missing``."""

    def __init__(self, missing: set[int]) -> None:
        self.missing = missing

    async def report_ends(self) -> dict[int, int]:
        return {0: 150}

    async def ident_at(self, partition: int, offset: int) -> str | None:
        return None if offset in self.missing else f"id-{offset}"


class _Seeks:
    def __init__(self) -> None:
        self.seeks: list[tuple[int, int]] = []

    def reseek(self, partition: int, offset: int) -> None:
        self.seeks.append((partition, offset))

    async def earliest_offsets(self, partitions: list[int]) -> dict[int, int]:
        return {p: 0 for p in partitions}


class _Positions:
    async def positions(self, app_id: str, topic: str) -> dict[int, tuple[int, str]]:
        return {0: (106, "id-106")}


@pytest.mark.parametrize("missing", [{107, 108}, {107}])
def test_a_stalled_partition_steps_over_a_hole_in_the_brokers_log(missing):
    """Seen in a CI run after a durable broker's SIGKILL: the store's position was 106, the broker kept 109.. but not
    107 and 108, and a consumer sought to 107 waits there for ever (the fetch answers nothing), while offset 109 came
    first after the seek. The stall check reads the offsets in between outside the group: if none is there, the
    partition goes on at 109; if one is (108), it is sought to 107 again, as before."""
    _, _, recovery, _ = _rig()
    consumer = _Seeks()
    recovery.broker, recovery.consumer, recovery.store = _HoleBroker(missing), consumer, _Positions()
    recovery.assigned = [0]
    recovery.replay_from[0] = 107  # the positions were restored to the store's
    assert not recovery.admit(0, 109) and consumer.seeks == [(0, 107)]
    recovery.progress_at[0] = time.monotonic() - 20  # then nothing arrived
    asyncio.run(recovery._check_stalls())
    hole = missing == {107, 108}
    assert consumer.seeks[-1] == (0, 109 if hole else 107)
    assert recovery.admit(0, 109) is hole


def test_a_far_future_step_is_rejected_and_recorded():
    pipe, store, _, published = _rig()
    blob = envelope.pack_reports(CAMPAIGN, ATTR, 10**9, _reports(10, 4), batch_id="http:x")  # a wall-clock batch
    assert asyncio.run(pipe.process(blob, 2, 5)) == "rejected"
    assert published[-1]["reason"] == "future_step" and store.n == {} and store.positions[2][0] == 5


@pytest.mark.parametrize("partition_offsets", [[(0, 3), (0, 4)], [(1, 0)]])
def test_the_pipeline_needs_no_service(partition_offsets):
    """Constructed complete: nothing is assigned after construction, and no connection is opened."""
    pipe, store, _, _ = _rig()
    blob = envelope.pack_reports(CAMPAIGN, ATTR, 3, _reports(5, 5), batch_id="u:3:a:0")
    statuses = [asyncio.run(pipe.process(blob, p, o)) for p, o in partition_offsets]
    assert statuses[0] == "applied" and all(s == "duplicate" for s in statuses[1:])
    assert store.calls == len(partition_offsets)
