"""Finals you can trust (issue 18), mechanism by mechanism, against a real Redis and a real broker.

* a step without a watermark is final only by stream progress: stream time past it (a later step's
  reports counted), its grace (``lateness_seconds``), and the store's positions past what the broker held;
* a final is claimed with the lease holder's fencing token before it is published: one document per
  revision of a step, none from a holder that lost the lease, and a claim whose publication was not
  acknowledged is published again unchanged;
* a new lease holder rebuilds the finals the store lost from ``ldp.estimates`` before it publishes;
* a step closed with fewer reports than its watermark states, or open when the broker lost data, is
  published ``complete: false``;
* a batch further ahead than ``max_steps_ahead`` is rejected (``future_step``) and moves no floor.

The fault tests of whole pipelines (killed workers, Redis and broker restarts) are in
``tests/test_finals_faults.py`` and ``ldp soak``.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import numpy as np
import pytest

from ldpstream_dev.workers import produce_messages
from stream_app.app import Worker
from stream_app.broker import TopicReader
from stream_app.metrics import Metrics
from stream_app.publisher import EstimatePublisher
from stream_app.store import (CLAIM_EXISTS, CLAIM_STALE, CLAIMED, FUTURE_STEP, CountStore, Position, StepBound,
                              count_key, estimates_key, finals_key, pending_key, steps_key)
from stream_app.windows import Estimator
from wire import envelope
from wire.campaign import Campaign, step_at
from wire.topics import Topics, estimate_key, message_key

COUNTS = np.array([5, 1, 0, 2])
N = 8


def _campaign(**head: Any) -> Campaign:
    cid = f"fin-{uuid.uuid4().hex[:8]}"
    return Campaign.from_dict({"campaign": {"id": cid, "time_step_seconds": 10.0, "lateness_seconds": 2.0, **head},
                               "attributes": [{"name": "a", "k": 4, "protocol": "GRR", "eps": 1.0}]})


class _Holder:
    """An estimator of its own (one worker's) over a shared app id; ``published`` is what it sent."""

    def __init__(self, redis_url: str, campaign: Campaign, app_id: str, name: str, **options: Any) -> None:
        self.store = CountStore.from_url(redis_url)
        self.published: list[dict] = []
        self.fail_publish = False
        self.est = Estimator({campaign.id: campaign}, self.store, Metrics(), self._publish, app_id=app_id,
                             worker_id=name, **options)

    async def _publish(self, doc: dict) -> None:
        if self.fail_publish:
            raise ConnectionError("the broker is away")
        self.published.append(json.loads(json.dumps(doc)))

    async def close(self) -> None:
        await self.est.release()
        await self.store.close()


async def _close_step(store: CountStore, cid: str, t: int, count: int = 0) -> None:
    await store.apply_batch(cid, "a", t, COUNTS, N, f"p:{t}:a:0")
    await store.apply_watermark(cid, "a", t, count=count)


def _finals(docs: list[dict]) -> list[tuple[int, int, int]]:
    return sorted((d["t"], d["revision"], d["n"]) for d in docs if d["final"])


def test_fencing_tokens_grow_and_a_stale_holder_cannot_claim(local_stack) -> None:
    c = _campaign()
    app = f"fence-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        store = CountStore.from_url(local_stack.info.redis_url)
        try:
            a = await store.claim_lease(app, "a", 0.3)
            assert a > 0 and await store.claim_lease(app, "a", 0.3) == a  # renewed: the same token
            assert await store.claim_lease(app, "b", 0.3) == 0
            await asyncio.sleep(0.4)
            b = await store.claim_lease(app, "b", 5.0)
            assert b > a
            doc = {"t": 0, "n": N, "revision": 0, "final": True}
            assert await store.claim_final(c.id, "a", doc, b, app) == (CLAIMED, "")
            assert await store.claim_final(c.id, "a", dict(doc, n=1), b, app) == (CLAIM_EXISTS, f"{N}:0")
            assert (await store.claim_final(c.id, "a", dict(doc, t=1), a, app))[0] == CLAIM_STALE
            assert await store.pending_finals(c.id, "a") == {0: 0}
            await store.confirm_final(c.id, "a", 0, 0)
            assert await store.pending_finals(c.id, "a") == {}
            # another consumer group (its own lease, its own tokens) is not fenced by this one's
            assert (await store.claim_final(c.id, "a", dict(doc, t=1), 1, "another-app"))[0] == CLAIMED
            await store.confirm_final(c.id, "a", 1, 0)
            # a store that lost the counter draws tokens above every earlier one (the counter starts at the clock)
            await store.release_lease(app, "b")
            await store.redis.delete(f"ldp:{{estimator:{app}}}:fence")
            assert await store.claim_lease(app, "c", 5.0) > b
        finally:
            await store.close()

    asyncio.run(run())


def test_a_holder_that_lost_its_lease_mid_tick_publishes_nothing(local_stack) -> None:
    """A holder stalled between renewing its lease and claiming (SIGSTOP, a long GC pause) resumes with a stale
    token: its claim is refused, it drops its state, and the step keeps the new holder's one final."""
    c = _campaign()
    app = f"stall-{uuid.uuid4().hex[:6]}"
    url = local_stack.info.redis_url

    async def run() -> None:
        old, new = _Holder(url, c, app, "old", lease_ttl=0.3), _Holder(url, c, app, "new", lease_ttl=5.0)
        try:
            await _close_step(old.store, c.id, 0)
            assert _finals(await old.est.tick()) == [(0, 0, N)]
            stale = old.est.fence
            await asyncio.sleep(0.4)  # the old holder's lease expires while it is stalled
            await _close_step(old.store, c.id, 1)
            assert _finals(await new.est.tick()) == [(1, 0, N)] and new.est.fence > stale
            await _close_step(old.store, c.id, 2)

            async def stale_renewal(*args: Any) -> int:  # the stall fell after the renewal
                return stale
            old.store.claim_lease = stale_renewal  # type: ignore[method-assign]
            assert await old.est.tick() == [] and not old.est.is_leader
            assert [d["t"] for d in old.published] == [0]
            assert _finals(await new.est.tick()) == [(2, 0, N)]
            assert {d["fence"] for d in new.published} == {new.est.fence}
        finally:
            await old.close()
            await new.close()

    asyncio.run(run())


def test_a_holder_paused_between_its_claim_and_its_send_leaves_the_claim_to_the_new_holder(local_stack) -> None:
    """A holder stopped after its claim and before its send (a CI run: SIGSTOP past the lease, then SIGCONT) finds
    the fence raised when it resumes and does not send; the new holder publishes the pending claim: one message."""
    c = _campaign()
    app = f"pause-{uuid.uuid4().hex[:6]}"
    url = local_stack.info.redis_url

    async def run() -> None:
        old, new = _Holder(url, c, app, "old", lease_ttl=0.3), _Holder(url, c, app, "new", lease_ttl=5.0)
        try:
            await _close_step(old.store, c.id, 0)
            claim = old.store.claim_final

            async def claim_then_pause(*args: Any) -> Any:
                out = await claim(*args)
                await asyncio.sleep(0.4)  # paused past its lease; the new holder takes it and raises the fence
                assert await new.est._hold_lease()
                return out
            old.store.claim_final = claim_then_pause  # type: ignore[method-assign]
            assert await old.est.tick() == [] and old.published == []
            assert await new.store.pending_finals(c.id, "a") == {0: 0}
            await new.est.tick()
            assert _finals(new.published) == [(0, 0, N)] and new.published[0]["worker"] == "old"
            assert await new.store.pending_finals(c.id, "a") == {}
        finally:
            await old.close()
            await new.close()

    asyncio.run(run())


def test_an_unacknowledged_final_is_published_again_unchanged_by_the_next_holder(local_stack) -> None:
    c = _campaign()
    app = f"pend-{uuid.uuid4().hex[:6]}"
    url = local_stack.info.redis_url

    async def run() -> None:
        first, second = _Holder(url, c, app, "first", lease_ttl=0.3), _Holder(url, c, app, "second")
        try:
            await _close_step(first.store, c.id, 0)
            first.fail_publish = True
            with pytest.raises(ConnectionError):
                await first.est.tick()
            claimed = json.loads(await first.store.redis.hget(estimates_key(c.id, "a"), "0"))
            assert await first.store.pending_finals(c.id, "a") == {0: 0}
            await asyncio.sleep(0.4)  # the first holder dies with its claim unconfirmed
            await second.est.tick()
            assert second.published == [claimed]  # the same document, not a second claim
            assert await second.store.pending_finals(c.id, "a") == {}
            assert await second.est.tick() == [] and len(second.published) == 1
        finally:
            await first.close()
            await second.close()

    asyncio.run(run())


def test_a_new_holder_rebuilds_the_finals_the_store_lost_from_the_estimates_topic(local_stack) -> None:
    """Redis lost the tail of its finals (an AOF cut short): the next holder reads them back from ldp.estimates
    and publishes no second revision 0, while the counts show the step closed with its full n."""
    c = _campaign()
    app = f"topic-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(f"{app}.")
    url, boot = local_stack.info.redis_url, local_stack.info.kafka_bootstrap

    async def run() -> None:
        reader = TopicReader(boot, topics)
        first = _Holder(url, c, app, "first", lease_ttl=0.3, stream=reader, reports_topic=topics.reports)
        second = _Holder(url, c, app, "second", stream=reader, reports_topic=topics.reports)

        publisher = EstimatePublisher(boot, topics.estimates)

        async def to_topic(doc: dict) -> None:
            first.published.append(doc)
            await publisher.send(estimate_key(doc["campaign"], doc["attribute"], doc["t"]), doc)
        first.est.publish = to_topic
        try:
            for t in (0, 1):
                await _close_step(first.store, c.id, t)
            assert _finals(await first.est.tick()) == [(0, 0, N), (1, 0, N)]
            r = first.store.redis  # the store loses every trace of the finals, the counts stay
            await r.delete(finals_key(c.id, "a"), estimates_key(c.id, "a"), pending_key(c.id, "a"),
                           f"ldp:estimates-read:{app}", f"ldp:{{{c.id}}}:newest-final")
            await asyncio.sleep(0.4)
            assert await second.est.tick() == []
            assert await second.store.final_index(c.id, "a") == {0: (N, 0), 1: (N, 0)}
            assert await second.store.estimates_read(app)  # where the next holder starts reading
        finally:
            await publisher.close()
            await reader.close()
            await first.close()
            await second.close()

    asyncio.run(run())


def test_a_due_step_waits_until_the_store_holds_what_the_broker_had(local_stack) -> None:
    """Stream time passed step 3 and its grace is over, but a message of the reports topic is not handled yet
    (a worker killed, a partition unassigned, Redis away): no final until the recorded position passes it."""
    c = _campaign()
    app = f"prog-{uuid.uuid4().hex[:6]}"
    topics = Topics.with_prefix(f"{app}.")
    url, boot = local_stack.info.redis_url, local_stack.info.kafka_bootstrap
    blob = envelope.pack_reports(c, "a", 3, np.zeros(2, dtype=np.int64), batch_id="q:3:a:1")
    produce_messages(boot, topics.reports, [(message_key(3, "a"), blob)])  # waiting in the broker

    async def run() -> None:
        reader = TopicReader(boot, topics)
        h = _Holder(url, c, app, "h", stream=reader, reports_topic=topics.reports)
        try:
            ends = await reader.report_ends()
            (p, end), = [(p, e) for p, e in ends.items() if e > 0]
            for t in (3, 4):
                await h.store.apply_batch(c.id, "a", t, COUNTS, N, f"q:{t}:a:0")
            now = time.time()
            assert _finals(await h.est.tick(now=now)) == []  # stream time passes 3: its grace begins
            assert _finals(await h.est.tick(now=now + 3.0)) == []  # grace over, the broker's message not handled
            await h.store.set_position(Position(app, topics.reports, p, end - 1, envelope.ident_of(blob)))
            assert _finals(await h.est.tick(now=now + 3.1)) == [(3, 0, N)]
            assert _finals(await h.est.tick(now=now + 60)) == []  # step 4: stream time never passed it
        finally:
            await reader.close()
            await h.close()

    asyncio.run(run())


def test_fewer_reports_than_the_watermark_states_make_an_incomplete_final(local_stack) -> None:
    c = _campaign()
    app = f"inc-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        h = _Holder(local_stack.info.redis_url, c, app, "h")
        try:
            await _close_step(h.store, c.id, 0, count=N)
            await _close_step(h.store, c.id, 1, count=3 * N)  # two batches of the step never reached the store
            docs = {d["t"]: d for d in await h.est.tick() if d["final"]}
            assert docs[0]["complete"] and docs[0]["incomplete"] is None
            assert not docs[1]["complete"] and docs[1]["expected_n"] == 3 * N and "lost" in docs[1]["incomplete"]
            assert h.est.metrics.registry.get_sample_value(
                "ldp_incomplete_finals_total", {"campaign": c.id, "attribute": "a"}) == 1
        finally:
            await h.close()

    asyncio.run(run())


def test_a_broker_loss_marks_the_open_steps_incomplete(local_stack) -> None:
    c = _campaign()
    app = f"loss-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        worker = Worker({c.id: c}, local_stack.info.redis_url, app_id=app, topics=Topics.with_prefix(f"{app}."))
        h = _Holder(local_stack.info.redis_url, c, app, "h")
        try:
            await _close_step(h.store, c.id, 0)
            assert _finals(await h.est.tick()) == [(0, 0, N)]
            await h.store.apply_batch(c.id, "a", 1, COUNTS, N, "p:1:a:0")
            await worker.recovery.broker_lost([0], "test: the broker lost its log")
            assert "unrepairable_loss:0" in worker.alarms
            assert worker.metrics.registry.get_sample_value("ldp_unrepairable_losses_total") == 1
            await h.store.apply_watermark(c.id, "a", 1)
            docs = {d["t"]: d for d in await h.est.tick() if d["final"]}
            assert list(docs) == [1] and not docs[1]["complete"] and "lost its log" in docs[1]["incomplete"]
        finally:
            await worker.close()
            await h.close()

    asyncio.run(run())


def test_a_far_future_step_is_rejected_and_moves_no_floor(local_stack) -> None:
    """Steps bounded in time (acceptance 4): with retention 3 and max_steps_ahead 10, batches at t = 10^6, 10^8
    and 2^32 - 1 after four final steps are rejected as future_step; the floor stays where the finals put it,
    and steps sent afterwards are counted and finalized. A wall-clock (HTTP ingest) batch too far past the
    current wall-clock step is rejected too."""
    c = _campaign(retention_steps=3, max_steps_ahead=10)
    app = f"future-{uuid.uuid4().hex[:6]}"
    proto = c.attribute("a").protocol
    reports = np.array([0, 1, 1, 3], dtype=np.int64)

    def batch(t: int, i: int = 0, prefix: str = "f") -> bytes:
        return envelope.pack_reports(c, "a", t, reports, batch_id=f"{prefix}:{t}:a:{i}")

    async def run() -> None:
        worker = Worker({c.id: c}, local_stack.info.redis_url, app_id=app, topics=Topics.with_prefix(f"{app}."))
        h = _Holder(local_stack.info.redis_url, c, app, "h")
        offset = 0

        async def send(blob: bytes) -> str:
            nonlocal offset
            offset += 1
            return await worker.pipeline.process(blob, 0, offset)
        try:
            for t in range(4):
                assert await send(batch(t)) == "applied"
                assert await send(envelope.pack_watermark(c, "a", t, count=len(reports))) == "watermark"
            await h.est.tick()
            floor = await h.store.retention_floor(c.id, "a")
            assert floor == 1
            for t in (10**6, 10**8, 2**32 - 1, 3 + 11):
                assert await send(batch(t)) == "rejected"
                assert await send(envelope.pack_watermark(c, "a", t)) == "rejected"
            assert await send(batch(3 + 10)) == "applied"  # within the bound
            wall = step_at(c)
            assert await send(batch(wall + 11, prefix="http")) == "rejected"
            assert await send(batch(wall, prefix="http")) == "applied"
            assert worker.metrics.registry.get_sample_value("ldp_rejected_batches_total", {"reason": "future_step"}) == 9
            assert max(int(t) for t in await h.store.redis.zrange(steps_key(c.id, "a"), 0, -1)) == wall
            for t in (4, 5):
                assert await send(batch(t)) == "applied"
                assert await send(envelope.pack_watermark(c, "a", t, count=len(reports))) == "watermark"
            await h.est.tick()
            assert await h.store.retention_floor(c.id, "a") == 3  # the real steps 3, 4, 5 kept
            assert not await h.store.redis.exists(count_key(c.id, "a", 10**6))
            assert (await h.store.final_index(c.id, "a"))[5] == (len(reports), 0)
            # the bound in the store, without the worker: the campaign's newest final step is its reference
            status = await h.store.apply_batch(c.id, "a", 5 + 11, proto.support(reports), 4, "s:16:a:0",
                                               bound=StepBound(ahead=10))
            assert status == FUTURE_STEP
        finally:
            await worker.close()
            await h.close()

    asyncio.run(run())
