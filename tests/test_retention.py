"""Late data, retention and the count guard of the windowed estimator, against a real Redis.

The agent's part is played by :func:`_count` (apply a batch, then mark its step touched, as
``stream_app.pipeline.Pipeline.process`` does) and :func:`_close` (apply a watermark and record its time).
Finals come from watermarks only: the campaign's steps are an hour long and every tick but the
n == 0 test passes ``now=0.0``, so no step is ever due by lateness.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_app.metrics import Metrics
from stream_app.store import (APPLIED, DUPLICATE_BATCH_ID, EXPIRED, CountStore, closed_ts_key, count_key, estimates_key,
                              finals_key, floor_key, steps_key, touched_key)
from stream_app.windows import Estimator, build_estimate
from wire.campaign import Campaign, CampaignError, default_retention_steps

pytestmark = pytest.mark.timeout(120)

COUNTS = np.array([5, 1, 0, 2], dtype=np.int64)  # one batch of 8 reports
N = 8


def _campaign(cid: str, retention_steps: int | None = None) -> Campaign:
    head: dict[str, Any] = {"id": cid, "time_step_seconds": 3600.0, "lateness_seconds": 3600.0}
    if retention_steps is not None:
        head["retention_steps"] = retention_steps
    return Campaign.from_dict({"campaign": head, "attributes": [{"name": "a", "k": 4, "protocol": "GRR", "eps": 1.0}]})


async def _count(store: CountStore, cid: str, t: int, counts: np.ndarray = COUNTS, n: int = N,
                 batch_id: str | None = None, mark: bool = True) -> int:
    status = await store.apply_batch(cid, "a", t, counts, n, batch_id or f"p:{t}:a:{uuid.uuid4().hex[:8]}")
    if status == APPLIED and not mark:  # as if the worker was killed between counting and marking
        await store.clear_touched(cid, "a", {t: float(score)} if (score := (await store.touched(cid, "a", 10**6)).get(t))
                                  else {})
    return status


async def _close(store: CountStore, cid: str, t: int) -> None:
    await store.apply_watermark(cid, "a", t)
    await store.record_closed_at(cid, "a", t, 1.0)


class _Harness:
    """An estimator over one campaign, its store, metrics and the documents it published."""

    def __init__(self, url: str, campaign: Campaign, **options: Any) -> None:
        self.campaign = campaign
        self.cid = campaign.id
        self.store = CountStore.from_url(url)
        self.metrics = Metrics()
        self.published: list[dict] = []
        options.setdefault("refresh_seconds", 0.05)
        self.est = Estimator({campaign.id: campaign}, self.store, self.metrics, self._publish, app_id=campaign.id,
                             **options)

    async def _publish(self, doc: dict) -> None:
        self.published.append(doc)

    async def tick(self, now: float | None = 0.0) -> list[dict]:
        return await self.est.tick(now=now)

    def metric(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name, {"campaign": self.cid, "attribute": "a"})

    async def close(self) -> None:
        await self.est.release()
        await self.store.close()


def _run(coro) -> Any:
    return asyncio.run(coro)


def _cid() -> str:
    return f"ret-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------- the campaign file
def test_retention_steps_default_is_seven_days_of_steps_and_not_in_the_fingerprint() -> None:
    hourly = _campaign("c")
    assert hourly.retention_steps == default_retention_steps(3600.0) == 168
    assert Campaign.from_dict({"campaign": {"id": "c", "time_step_seconds": 10.0}, "attributes": [
        {"name": "a", "k": 4, "protocol": "GRR", "eps": 1.0}]}).retention_steps == 60480
    kept = _campaign("c", retention_steps=5)
    assert kept.retention_steps == 5
    assert kept.fingerprint == hourly.fingerprint  # a server-side setting: device and fleet states stay valid


@pytest.mark.parametrize("value", [0, -3, 2.5, "10", True])
def test_a_bad_retention_is_refused_with_a_clear_error(value: Any) -> None:
    with pytest.raises(CampaignError, match=r"retention_steps must be an integer >= 1 .*got"):
        _campaign("c", retention_steps=value)


# ---------------------------------------------------------------- the touched set
def test_a_touched_mark_incremented_after_it_was_read_is_kept(local_stack) -> None:
    async def run() -> None:
        store = CountStore.from_url(local_stack.info.redis_url)
        cid = _cid()
        for _ in range(2):
            await store.mark_touched(cid, "a", 7)
        await store.mark_touched(cid, "a", 9)
        marks = await store.touched(cid, "a", 100)
        assert marks == {7: 2.0, 9: 1.0}
        await store.mark_touched(cid, "a", 7)  # a batch applied while the estimator handled step 7
        assert await store.clear_touched(cid, "a", marks) == 1
        assert await store.touched(cid, "a", 100) == {7: 3.0}
        await store.close()

    _run(run())


# ---------------------------------------------------------------- late data
def test_late_data_for_a_step_older_than_16_finals_publishes_a_revision_with_the_exact_n(local_stack) -> None:
    """The old estimator re-read only the 16 most recent finals: late data for step 2 of 0..20 was
    counted but never re-published. ``audit_steps=0``: only the touched mark can find it."""
    campaign = _campaign(_cid())
    proto = campaign.attribute("a").protocol

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign, audit_steps=0)
        cid = h.cid
        for t in range(21):
            await _count(h.store, cid, t)
            await _close(h.store, cid, t)
        docs = await h.tick()
        assert sorted(d["t"] for d in docs if d["final"]) == list(range(21))
        late = np.array([1, 2, 3, 0], dtype=np.int64)
        assert await _count(h.store, cid, 2, late, 6, batch_id="late:2:a:0") == APPLIED
        docs = await h.tick()
        assert len(docs) == 1
        doc = docs[0]
        assert (doc["t"], doc["final"], doc["trigger"], doc["revision"], doc["n"]) == (2, True, "late", 1, N + 6)
        assert doc["frequencies"] == proto.estimate(COUNTS + late, N + 6).tolist()
        assert (await h.store.estimates(cid, "a"))[2]["revision"] == 1
        assert (await h.store.final_index(cid, "a"))[2] == (N + 6, 1)
        assert await h.store.touched(cid, "a", 100) == {}
        assert await h.tick() == []  # handled once
        # the same batch re-sent is a duplicate: nothing counted, nothing marked, nothing published
        assert await _count(h.store, cid, 2, late, 6, batch_id="late:2:a:0") == DUPLICATE_BATCH_ID
        assert await h.tick() == []
        await h.close()

    _run(run())


def test_a_late_batch_whose_mark_was_lost_is_found_by_the_audit(local_stack) -> None:
    campaign = _campaign(_cid())

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign, audit_steps=8)
        for t in range(21):
            await _count(h.store, h.cid, t)
            await _close(h.store, h.cid, t)
        await h.tick()
        await _count(h.store, h.cid, 3, mark=False)  # a worker killed between counting and marking
        revisions = []
        for _ in range(3):  # 21 final steps, 8 per tick: each is audited within 3 ticks
            revisions += [d for d in await h.tick() if d["trigger"] == "late"]
        assert [(d["t"], d["revision"], d["n"]) for d in revisions] == [(3, 1, 2 * N)]
        await h.close()

    _run(run())


def test_a_new_leader_continues_the_revisions_and_indexes_an_older_history(local_stack) -> None:
    campaign = _campaign(_cid())

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign, audit_steps=0)
        for t in range(3):
            await _count(h.store, h.cid, t)
            await _close(h.store, h.cid, t)
        await h.tick()
        await _count(h.store, h.cid, 1)
        assert [(d["t"], d["revision"]) for d in await h.tick()] == [(1, 1)]
        await h.close()
        # a history recorded before the finals index existed: the next leader rebuilds the index
        await h.store.redis.delete(finals_key(h.cid, "a"))
        h2 = _Harness(local_stack.info.redis_url, campaign, audit_steps=0)
        await _count(h2.store, h2.cid, 1)
        docs = await h2.tick()
        assert [(d["t"], d["trigger"], d["revision"], d["n"]) for d in docs] == [(1, "late", 2, 3 * N)]
        assert await h2.store.final_index(h2.cid, "a") == {0: (N, 0), 1: (3 * N, 2), 2: (N, 0)}
        await h2.close()

    _run(run())


# ---------------------------------------------------------------- the guard
def test_a_count_below_the_final_publishes_nothing_and_raises_one_alarm(local_stack, caplog) -> None:
    """Redis lost a final step's counts and some batches were counted again: n is partial."""
    campaign = _campaign(_cid())

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign)
        cid = h.cid
        for t in range(4):
            await _count(h.store, cid, t)
            await _close(h.store, cid, t)
        await h.tick()
        await h.store.redis.delete(count_key(cid, "a", 1))  # the loss
        await _count(h.store, cid, 1, np.array([2, 1, 0, 0]), 3)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="stream_app.windows"):
            assert await h.tick() == []
            await _count(h.store, cid, 1, np.array([1, 0, 1, 0]), 2)
            assert await h.tick() == []
            assert await h.tick() == []
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "step 1" in errors[0].getMessage()
        assert h.metric("ldp_count_regressions_total") == 1.0
        alarm = h.est.alarms[f"count_regression:{cid}/a/1"]
        assert (alarm["final_n"], alarm["store_n"], alarm["revision"]) == (N, 5, 0)
        assert "recovered_at" not in alarm
        assert (await h.store.estimates(cid, "a"))[1]["n"] == N  # the good final stays
        # the counts are back above the final (a replay, then late data): revisions resume
        await _count(h.store, cid, 1, np.array([1, 1, 1, 1]), 4)
        docs = await h.tick()
        assert [(d["t"], d["revision"], d["n"]) for d in docs] == [(1, 1, 9)]
        assert "recovered_at" in alarm
        await h.close()

    _run(run())


def test_no_final_with_n_zero(local_stack) -> None:
    """A step in the index whose hash is empty, and a watermark without reports, get no final; the
    first batch after that publishes the step's first final. A settled step does not hold the
    retention floor back."""
    campaign = _campaign(_cid(), retention_steps=3)

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign)
        cid = h.cid
        await h.store.redis.zadd(steps_key(cid, "a"), {"0": 0})  # counts gone, index entry left
        await _close(h.store, cid, 1)  # a watermark, no report
        for t in (2, 3):
            await _count(h.store, cid, t)
            await _close(h.store, cid, t)
        docs = await h.tick(now=None)  # step 0 (no batch, no watermark) waits for its grace after stream time
        assert sorted(d["t"] for d in docs) == [2, 3]
        assert all(d["n"] > 0 for d in docs)
        assert await h.store.retention_floor(cid, "a") == 0  # step 0 is open: nothing below it is pruned
        assert await h.tick(now=time.time() + campaign.lateness_seconds + 1) == []  # its grace is over: settled
        assert set(await h.store.estimates(cid, "a")) == {2, 3}
        assert await h.store.retention_floor(cid, "a") == 1  # 3 - 3 + 1: step 0 is pruned, settled or not
        assert await h.store.steps_from(cid, "a", 0) == [1, 2, 3]
        assert await h.tick(now=None) == []
        await _count(h.store, cid, 3)  # late data for a final step: a revision
        await _count(h.store, cid, 1, np.array([0, 0, 3, 0]), 3)  # the first report of a settled step
        await _count(h.store, cid, 4)
        docs = await h.tick()
        assert sorted((d["t"], d["final"], d["trigger"], d["revision"], d["n"]) for d in docs) == [
            (1, True, "late", 0, 3), (3, True, "late", 1, 2 * N), (4, False, None, 0, N)]
        await h.close()

    _run(run())


# ---------------------------------------------------------------- retention
def test_steps_beyond_retention_are_pruned_in_bounded_batches_and_never_published(local_stack) -> None:
    campaign = _campaign(_cid(), retention_steps=5)

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign, prune_batch=4)
        cid, r = h.cid, h.store.redis
        for t in range(21):
            await _count(h.store, cid, t)
            await _close(h.store, cid, t)

        async def kept(key_of_t) -> list[int]:
            return [t for t in range(21) if await key_of_t(t)]

        await h.tick()
        assert await h.store.retention_floor(cid, "a") == 16  # 20 - 5 + 1
        assert await kept(lambda t: r.exists(count_key(cid, "a", t))) == list(range(4, 21))  # 4 per tick
        for _ in range(3):
            await h.tick()
        expected = list(range(16, 21))
        assert await kept(lambda t: r.exists(count_key(cid, "a", t))) == expected
        assert await h.store.steps_from(cid, "a", 0) == expected
        assert sorted(await h.store.estimates(cid, "a")) == expected
        assert sorted(await h.store.final_index(cid, "a")) == expected
        assert sorted(int(t) for t in await r.hkeys(closed_ts_key(cid, "a"))) == expected
        assert h.metric("ldp_steps_pruned_total") == 16.0
        assert h.metric("ldp_retention_floor") == 16.0
        assert await h.store.expired(cid, "a", 15) and not await h.store.expired(cid, "a", 16)
        # a batch for expired step 3 is refused by the apply script (the agent rejects it as "expired")
        assert await h.store.apply_batch(cid, "a", 3, COUNTS, N, "p:3:a:late") == EXPIRED
        assert await h.store.apply_watermark(cid, "a", 3) == EXPIRED
        assert await h.tick() == []
        assert not await r.exists(count_key(cid, "a", 3)) and await h.store.steps_from(cid, "a", 0) == expected
        assert await r.zcard(touched_key(cid, "a")) == 0
        # late data within retention still revises; its "steps so far" (privacy figures) still count the
        # 16 pruned steps, once each
        assert await h.store.pruned_steps(cid, "a") == 16
        await _count(h.store, cid, 16)
        assert [(d["t"], d["revision"], d["steps_so_far"]) for d in await h.tick()] == [(16, 1, 17)]
        await h.close()

    _run(run())


def test_the_floor_never_passes_a_step_without_a_final(local_stack) -> None:
    campaign = _campaign(_cid(), retention_steps=2)

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign)
        cid = h.cid
        for t in range(10):
            await _count(h.store, cid, t)
            if t != 1:
                await _close(h.store, cid, t)
        await h.tick()
        assert await h.store.retention_floor(cid, "a") == 1  # step 1 is open
        assert await h.store.steps_from(cid, "a", 0) == list(range(1, 10))
        await _close(h.store, cid, 1)
        docs = await h.tick()
        assert [(d["t"], d["trigger"]) for d in docs] == [(1, "watermark")]
        assert await h.store.retention_floor(cid, "a") == 8
        assert await h.store.steps_from(cid, "a", 0) == [8, 9]
        assert await h.store.redis.get(floor_key(cid, "a")) == b"8"
        await h.close()

    _run(run())


def test_retention_counts_final_steps_not_step_numbers(local_stack) -> None:
    """A wall-clock step among logical ones (or a device's far-future t) must not expire the others."""
    campaign = _campaign(_cid(), retention_steps=3)

    async def run() -> None:
        h = _Harness(local_stack.info.redis_url, campaign)
        for t in (0, 1, 480_000):
            await _count(h.store, h.cid, t)
            await _close(h.store, h.cid, t)
        await h.tick()
        assert await h.store.retention_floor(h.cid, "a") == 0
        assert await h.store.steps_from(h.cid, "a", 0) == [0, 1, 480_000]
        await _count(h.store, h.cid, 480_001)
        await _close(h.store, h.cid, 480_001)
        await h.tick()
        assert await h.store.retention_floor(h.cid, "a") == 1  # 4 finals, 3 kept
        assert await h.store.steps_from(h.cid, "a", 0) == [1, 480_000, 480_001]
        await h.close()

    _run(run())


def test_a_raised_floor_is_never_lowered(local_stack) -> None:
    async def run() -> None:
        store = CountStore.from_url(local_stack.info.redis_url)
        cid = _cid()
        assert await store.retention_floor(cid, "a") == 0 and not await store.expired(cid, "a", 0)
        await _count(store, cid, 12)
        await _count(store, cid, 11)
        assert await store.raise_retention_floor(cid, "a", 12) == 12
        assert await store.raise_retention_floor(cid, "a", 7) == 12
        assert await store.retention_floor(cid, "a") == 12
        # prune_steps leaves a step at or above the floor alone
        assert await store.prune_steps(cid, "a", [11, 12]) == (1, 1)  # (left the index, pruned so far)
        assert await store.steps_from(cid, "a", 0) == [12]
        assert await store.redis.exists(count_key(cid, "a", 12)) and not await store.redis.exists(
            estimates_key(cid, "a"))
        await store.close()

    _run(run())


# ---------------------------------------------------------------- memory per attribute per step
MEMORY_BATCHES = (1, 100, 1000)  # batches per step (each of 1000 reports; the batch ids dominate)


async def _measure_memory(url: str) -> dict[str, dict[str, int]]:
    """Bytes (Redis ``MEMORY USAGE ... SAMPLES 0``) of what one step of one attribute keeps in Redis.

    Per protocol (k=100): the step hash after 1, 100 and 1000 applied batches of 1000 reports with
    fleet-style batch ids, and one entry of each per-step index (history JSON of a real final,
    finals index, step index, watermark time), the latter averaged over 600 steps."""
    rng = np.random.default_rng(7)
    out: dict[str, dict[str, int]] = {}
    store = CountStore.from_url(url)
    r = store.redis
    try:
        for proto_name, params in (("GRR", {"eps": 1.0}), ("L-OSUE", {"eps_inf": 2.0, "eps_1": 1.0})):
            cid = _cid()
            c = Campaign.from_dict({"campaign": {"id": cid}, "attributes": [
                {"name": "a", "k": 100, "protocol": proto_name, **params}]})
            proto = c.attribute("a").protocol
            reports = proto.randomize(rng.integers(0, 100, 1000), rng, state=proto.new_state(1000, rng=rng))
            counts = proto.support(reports)
            producer = uuid.uuid4().hex  # the fleet's producer id: 128 random bits in hex
            row: dict[str, int] = {}
            for t, batches in enumerate(MEMORY_BATCHES):
                for i in range(batches):
                    await store.apply_batch(cid, "a", t, counts, 1000, f"{producer}:{t}:a:{i}", f"3:{1_000_000 + i}")
                name = f"step hash, {batches} batch{'es' if batches > 1 else ''}"
                row[name] = int(await r.memory_usage(count_key(cid, "a", t), samples=0))
            steps = 600  # past the listpack limits (512 hash, 128 zset entries), as any real retention
            state = await store.read_step(cid, "a", 0, proto.support_size)
            for t in range(steps):
                if t >= len(MEMORY_BATCHES):
                    await store.apply_batch(cid, "a", t, counts, 1000, f"{producer}:{t}:a:0")
                await _close(store, cid, t)
                doc = build_estimate(c, c.attribute("a"), t, state, t + 1, final=True, trigger="watermark",
                                     now=1.7e9, closed_ts=1.7e9, worker="0123456789ab")
                await store.claim_final(cid, "a", doc, token=1, app_id="memory")
                await store.confirm_final(cid, "a", t, 0)
            for name, key in (("history entry (final JSON)", estimates_key(cid, "a")),
                              ("finals index entry", finals_key(cid, "a")),
                              ("step index entry", steps_key(cid, "a")),
                              ("watermark time entry", closed_ts_key(cid, "a"))):
                row[name] = round(int(await r.memory_usage(key, samples=0)) / steps)
            out[proto_name] = row
    finally:
        await store.close()
    return out


def test_memory_per_attribute_per_step_matches_the_docs(local_stack) -> None:
    """Prints the table of docs/operations.md, "Redis memory per retained step" (``pytest
    tests/test_retention.py -k memory -s``) and checks its figures are within 20% of what this Redis measures."""
    measured = _run(_measure_memory(local_stack.info.redis_url))
    lines = ["| what (k = 100) | GRR | L-OSUE |", "| --- | ---: | ---: |"]
    for name in measured["GRR"]:
        lines.append(f"| {name} | {measured['GRR'][name]:,} B | {measured['L-OSUE'][name]:,} B |")
    print("\n" + "\n".join(lines))  # shown with -s
    doc = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    for name in measured["GRR"]:
        row = next((ln for ln in doc.splitlines() if ln.startswith(f"| {name} |")), None)
        assert row is not None, f"docs/operations.md has no row {name!r}"
        documented = [int(x.strip().rstrip(" B").replace(",", "")) for x in row.split("|")[2:4]]
        for doc_value, (proto, got) in zip(documented, ((p, measured[p][name]) for p in ("GRR", "L-OSUE"))):
            assert abs(doc_value - got) <= 0.2 * got, f"docs/operations.md {name!r} {proto}: {doc_value} B, measured {got} B"
