"""Late data, retention and the count guard of the windowed estimator, against a real Redis.

The agent's part is played by :func:`_count` (apply a batch, then mark its step touched, as
``stream_app.pipeline.Pipeline.process`` does) and :func:`_close` (apply a watermark and record its time).
Finals come from watermarks only: the campaign's steps are an hour long and every tick but the
n == 0 test passes ``now=0.0``, so no step is ever due by lateness.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_app.metrics import Metrics
from stream_app.store import (APPLIED, DUPLICATE_BATCH_ID, EXPIRED, CountStore, closed_ts_key, count_key, estimates_key,
                              finals_key, floor_key, steps_key, touched_key)
from stream_app.store.memory import (INDEX_ENTRIES_BYTES, MEMORY_FRACTION, MemoryLimit, RetentionTooLarge,
                                     campaign_need, check_retention, history_entry_bytes, step_bytes, step_hash_bytes)
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
        assert h.metric("ldp_retention_floor_step") == 16.0
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
    # the byte model of the retention check (stream_app/store/memory.py) against the same measurements: at most
    # 20% under, at most 35% over (it rounds up: the counts of every value set, the longest floats)
    model = {**{f"step hash, {b} batch{'es' if b > 1 else ''}": step_hash_bytes(100, b) for b in MEMORY_BATCHES},
             "history entry (final JSON)": history_entry_bytes(100)}
    for name, predicted in model.items():
        for proto in ("GRR", "L-OSUE"):
            got = measured[proto][name]
            assert 0.8 * got <= predicted <= 1.35 * got, f"model {name!r}: {predicted} B, {proto} measured {got} B"
    indexes = sum(measured["L-OSUE"][n] for n in ("finals index entry", "step index entry", "watermark time entry"))
    assert 0.8 * indexes <= INDEX_ENTRIES_BYTES <= 1.2 * indexes, (INDEX_ENTRIES_BYTES, indexes)


# ---------------------------------------------------------------- the retention check at a worker's start (issue 22)
DEMO_CAMPAIGNS = sorted((Path(__file__).resolve().parents[1] / "deploy" / "campaigns").glob("*.toml"))
#: the demo campaign itself (six attributes, the longest retention of the deployed campaigns)
DEMO_CAMPAIGN = Path(__file__).resolve().parents[1] / "deploy" / "campaigns" / "demo.toml"


def test_retention_check_formula_message_and_what_fits() -> None:
    """The check's arithmetic: retention_steps × Σ attributes' bytes per step against 80% of the memory; the
    refusal names the campaign, the formula with its numbers, the memory and what to change, and the figures it
    suggests are right (the suggested retention fits, one more step does not; the suggested maxmemory fits)."""
    demo = Campaign.load(DEMO_CAMPAIGN)
    need = campaign_need(demo, 100)
    assert need.step_bytes == sum(step_bytes(a, 100) for a in demo.attributes.values() if a.retention_steps is None)
    own = demo.attributes["crash_signature"]  # the open-domain sketch keeps its own, shorter retention
    assert need.own_total == own.retention_steps * step_bytes(own, 100) > 0
    assert need.total == demo.retention_steps * need.step_bytes + need.own_total
    # a step hash past 512 fields is a hash table: dearer per batch id
    assert step_hash_bytes(100, 1000) - step_hash_bytes(100, 999) > step_hash_bytes(100, 100) - step_hash_bytes(100, 99)
    limit = MemoryLimit(64 << 20, "maxmemory of redis://h:6379/0 (CONFIG GET maxmemory)", "h")
    with pytest.raises(RetentionTooLarge) as refused:
        check_retention({demo.id: demo}, {demo.id: limit}, 100)
    msg = str(refused.value)
    print(msg)
    fits = int(re.search(r"Lower retention_steps .* to ([\d,]+) or less", msg).group(1).replace(",", ""))
    raise_to = int(re.search(r"raise Redis maxmemory to ([\d,]+) B", msg).group(1).replace(",", ""))
    shared = len(need.per_attribute)
    for text in (f"campaign {demo.id}", f"retention_steps {demo.retention_steps:,} × {shared} attributes × "
                 f"{need.step_bytes / shared:,.0f} B per attribute and step", f"= {need.total:,} B",
                 f"crash_signature's own retention_steps {own.retention_steps} × {step_bytes(own, 100):,} B",
                 f"{64 << 20:,} B (64.0 MiB, maxmemory of redis://h:6379/0 (CONFIG GET maxmemory))", "80%",
                 f"device_model {step_bytes(demo.attributes['device_model'], 100):,}", "100 batches per step",
                 "LDP_RETENTION_BATCHES_PER_STEP"):
        assert text in msg, text
    usable = int((64 << 20) * MEMORY_FRACTION)
    assert fits * need.step_bytes <= usable - need.own_total < (fits + 1) * need.step_bytes
    assert raise_to * MEMORY_FRACTION >= need.total and (raise_to - 2) * MEMORY_FRACTION < need.total
    shorter = Campaign.from_dict({"campaign": {"id": demo.id, "retention_steps": fits}, "attributes": [
        {"name": "a", "k": 2, "protocol": "GRR", "eps": 1.0}]})
    assert campaign_need(shorter).total < need.total
    assert check_retention({demo.id: demo}, {demo.id: MemoryLimit(raise_to, "x", "h")}, 100) == []
    # fewer batches per step fit more steps; two campaigns on one Redis share it, on two masters they do not
    other = Campaign.from_dict({"campaign": {"id": "other", "retention_steps": demo.retention_steps},
                                "attributes": [{"name": "a", "k": 100, "protocol": "GRR", "eps": 1.0}]})
    both = {demo.id: demo, other.id: other}
    roomy = MemoryLimit(raise_to, "x", "h")
    with pytest.raises(RetentionTooLarge, match=r"next to other \(") as shared:
        check_retention(both, {demo.id: roomy, other.id: roomy}, 100)
    assert f"campaign {other.id}:" in str(shared.value)
    assert check_retention(both, {demo.id: roomy, other.id: MemoryLimit(raise_to, "x", "h2")}, 100) == []
    # maxmemory 0 bounds nothing: a warning with the figures, no refusal
    (warning,) = check_retention({demo.id: demo}, {demo.id: MemoryLimit(0, "maxmemory of r", "h")}, 100)
    assert "unbounded" in warning and f"{need.total:,} B" in warning
    # the itemset defense's report log is outside the model: said
    itemset = Campaign.from_dict({"campaign": {"id": "it", "retention_steps": 10}, "attributes": [
        {"name": "a", "k": 8, "protocol": "OUE", "eps": 1.0, "defense": "itemset"}]})
    assert any("itemset" in w for w in check_retention({"it": itemset}, {"it": roomy}))


def test_deployed_campaigns_set_a_retention_that_fits_512_mib() -> None:
    """deploy/campaigns/*.toml set retention_steps themselves (the default, 7 days of steps, needs gigabytes), and
    it fits `maxmemory 512mb` under the default batches per step."""
    import tomllib

    assert DEMO_CAMPAIGNS
    for path in DEMO_CAMPAIGNS:
        assert "retention_steps" in tomllib.loads(path.read_text())["campaign"], path
        c = Campaign.load(path)
        assert check_retention({c.id: c}, {c.id: MemoryLimit(512 << 20, "maxmemory", "h")}) == [], path
        need = campaign_need(c)
        print(f"{path.name}: {need.formula()}: maxmemory >= {need.total / MEMORY_FRACTION:,.0f} B")


def test_the_check_reads_maxmemory_from_redis(local_stack) -> None:
    """Without LDP_REDIS_MEMORY_BYTES the check reads CONFIG GET maxmemory (0 on the test Redis: a warning). The
    shared test Redis gets a huge maxmemory for a moment (no other test comes near it), then 0 again."""
    from stream_app.settings import WorkerSettings
    from stream_app.store import connect_sync
    from stream_app.worker import check_retention_memory

    url = local_stack.info.redis_url
    huge = Campaign.from_dict({"campaign": {"id": _cid(), "retention_steps": 10 ** 9}, "attributes": [
        {"name": "a", "k": 100, "protocol": "GRR", "eps": 1.0}]})
    settings = WorkerSettings(campaign_paths=(Path("x.toml"),), kafka_bootstrap="127.0.0.1:9", redis_url=url)
    (unbounded,) = check_retention_memory(settings, {huge.id: huge})
    assert "unbounded" in unbounded and "CONFIG GET maxmemory" in unbounded, unbounded
    r = connect_sync(url)
    before = r.config_get("maxmemory")["maxmemory"]
    assert before == "0"
    try:
        r.config_set("maxmemory", str(1 << 40))
        with pytest.raises(RetentionTooLarge, match=r"1,099,511,627,776 B \(1,024\.0 GiB, maxmemory of redis://"):
            check_retention_memory(settings, {huge.id: huge})
    finally:
        r.config_set("maxmemory", before)
        r.close()
    # the setting wins, and asks nothing of Redis
    far = WorkerSettings(campaign_paths=(Path("x.toml"),), kafka_bootstrap="127.0.0.1:9",
                         redis_url="redis://127.0.0.1:9/0", redis_memory_bytes=1 << 30)
    with pytest.raises(RetentionTooLarge, match=r"1,073,741,824 B \(1\.0 GiB, LDP_REDIS_MEMORY_BYTES\)"):
        check_retention_memory(far, {huge.id: huge})
    # a Redis that does not answer: nothing checked, said
    (unchecked,) = check_retention_memory(WorkerSettings(campaign_paths=(Path("x.toml"),),
                                                         kafka_bootstrap="127.0.0.1:9",
                                                         redis_url="redis://127.0.0.1:9/0"), {huge.id: huge},
                                     redis_timeout=0.5)
    assert "cannot read the maxmemory" in unchecked


def test_a_worker_refuses_a_retention_that_does_not_fit(local_stack, tmp_path) -> None:
    """A real worker with the demo campaign and LDP_REDIS_MEMORY_BYTES=64mb exits at start (status 2) with the
    formula, its numbers and what to change; nothing of it joined the group."""
    from ldpstream_dev.workers import WorkerProcess, unique_campaign_file

    info = local_stack.info
    path = unique_campaign_file(DEMO_CAMPAIGN, tmp_path)
    demo = Campaign.load(path)
    worker = WorkerProcess([path], info.kafka_bootstrap, info.redis_url, run_dir=tmp_path, app_id=_cid(),
                           redis_memory_bytes=64 << 20).start()
    try:
        assert worker.proc is not None
        code = worker.proc.wait(60)
    finally:
        worker.stop()
    log = " ".join(worker.log_path.read_text(errors="replace").split())  # rich wraps the line
    print(log)
    need = campaign_need(demo)
    assert code == 2, log
    for text in ("error:", f"campaign {demo.id}", f"retention_steps {demo.retention_steps:,} × {len(need.per_attribute)} attributes",
                 f"= {need.total:,} B", "67,108,864 B (64.0 MiB, LDP_REDIS_MEMORY_BYTES)", "Lower retention_steps",
                 "raise Redis maxmemory to"):
        assert text in log, text
    assert "Traceback" not in log and not worker.ready_file.exists()
