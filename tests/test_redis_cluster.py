"""Redis Cluster: the count store on a real 3-master cluster (``ldpstream_dev.cluster.LocalRedisCluster``).

The end-to-end test of ``test_pipeline`` (a fleet of 100000 devices, 5 steps of two attributes, two
workers in one consumer group, exact counts against the offline truth, one final estimate per step)
runs with ``redis_url`` set to the cluster URL, the broker being the session's local stack. The
campaign's keys must then live on the master that owns their hash slot (and nowhere else), and
the store's whole surface must work for campaigns whose keys live on three different masters.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from ldpstream_dev.cluster import LocalRedisCluster, RedisReplyError, redis_command, slot_ranges
from ldpstream_dev.workers import read_counts
from stream_app.store import (APPLIED, DUPLICATE_BATCH_ID, CountStore, _cluster_seeds, closed_ts_key, cluster_url,
                              count_key, estimates_key, is_cluster_url, latest_key, steps_key)
from test_pipeline import STEPS, run_end_to_end  # the end-to-end test itself (tests/ is on sys.path)


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory):
    with LocalRedisCluster(run_dir=tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


def _slot(cluster: LocalRedisCluster, key: str) -> int:
    return redis_command(cluster.ports[0], "CLUSTER", "KEYSLOT", key)


def _assert_on_its_master(cluster: LocalRedisCluster, key: str) -> int:
    """``key`` exists on the master owning its slot; every other master redirects it (MOVED). Returns that port."""
    slot = _slot(cluster, key)
    owner = cluster.node_of_slot(slot)
    assert redis_command(owner, "EXISTS", key) == 1, f"{key} (slot {slot}) is not on its master {owner}"
    assert redis_command(owner, "CLUSTER", "COUNTKEYSINSLOT", slot) >= 1
    for port in cluster.ports:
        if port != owner:
            with pytest.raises(RedisReplyError, match=f"MOVED {slot} "):
                redis_command(port, "EXISTS", key)
    return owner


def test_cluster_urls() -> None:
    """``redis+cluster://`` lists seed nodes; credentials and options go to every node, db 0 only."""
    first, seeds = _cluster_seeds("redis+cluster://user:p%40ss@h1:7000,h2:7001,[::1]:7002/0?socket_timeout=3")
    assert seeds == [("h1", 7000), ("h2", 7001), ("::1", 7002)]
    assert first == "redis://user:p%40ss@h1:7000/0?socket_timeout=3"
    assert _cluster_seeds("rediss+cluster://h") == ("rediss://h:6379", [("h", 6379)])
    assert cluster_url([("127.0.0.1", 7000), ("::1", 7001)]) == "redis+cluster://127.0.0.1:7000,[::1]:7001"
    assert is_cluster_url("REDIS+CLUSTER://h:1") and is_cluster_url("rediss+cluster://h:1")
    assert not is_cluster_url("redis://h:6379/0") and not is_cluster_url("unix:///tmp/redis.sock")
    for bad in ("redis+cluster://h:7000/1", "redis+cluster://", "redis+cluster://h:port"):
        with pytest.raises(ValueError):
            _cluster_seeds(bad)


def test_the_cluster_has_three_masters_covering_every_slot(redis_cluster) -> None:
    assert is_cluster_url(redis_cluster.url) and redis_cluster.url.startswith("redis+cluster://")
    assert len(redis_cluster.ports) == 3
    for port in redis_cluster.ports:
        info = redis_cluster.info(port)
        assert (info["cluster_state"], info["cluster_size"], info["cluster_known_nodes"]) == ("ok", "3", "3")
        assert info["cluster_slots_assigned"] == "16384"
    # every node's view: three masters, each with its third of the slots
    slots = sorted((first, last, node[1]) for first, last, node, *_ in
                   redis_command(redis_cluster.ports[0], "CLUSTER", "SLOTS"))
    assert slots == [(first, last, port) for (first, last), port in zip(slot_ranges(3), redis_cluster.ports)]


def test_end_to_end_on_a_redis_cluster(local_stack, redis_cluster, tmp_path: Path) -> None:
    """The end-to-end test, with two workers, on the cluster; then its keys are where the slot map says."""
    campaign, summary = run_end_to_end(local_stack.info.kafka_bootstrap, redis_cluster.url, tmp_path, workers=2)
    owners = set()
    for attr in campaign.attributes:
        keys = [count_key(campaign.id, attr, t) for t in range(STEPS)]
        keys += [steps_key(campaign.id, attr), estimates_key(campaign.id, attr), latest_key(campaign.id, attr)]
        owners |= {_assert_on_its_master(redis_cluster, key) for key in keys}
    assert len(owners) == 1, "the hash tag keeps all keys of a campaign on one master"
    slot = _slot(redis_cluster, count_key(campaign.id, next(iter(campaign.attributes)), 0))
    # 5 count hashes + steps + estimates + latest per attribute at least
    assert redis_command(owners.pop(), "CLUSTER", "COUNTKEYSINSLOT", slot) >= 2 * (STEPS + 3)


def _campaigns_on_every_master(cluster: LocalRedisCluster) -> dict[int, str]:
    """One campaign id per master (``port -> id``), found by their keys' slots."""
    out: dict[int, str] = {}
    for i in range(1000):
        name = f"spread-{i}"
        out.setdefault(cluster.node_of_slot(_slot(cluster, count_key(name, "a", 0))), name)
        if len(out) == len(cluster.ports):
            return out
    raise AssertionError("no campaign ids covering every master")  # pragma: no cover


def test_the_store_on_campaigns_of_three_masters(redis_cluster) -> None:
    """Every kind of store call (scripts, pipeline, hashes, sorted sets, lease, pub/sub) goes through the
    cluster client to the right master, for campaigns and attributes spread over all three masters."""
    campaigns = _campaigns_on_every_master(redis_cluster)
    size = 8

    def counts_of(i: int) -> np.ndarray:
        return np.arange(size, dtype=np.int64) * (i + 1)

    async def scenario() -> None:
        store = CountStore.from_url(redis_cluster.url)
        try:
            wakeups = await store.subscribe_wakeups("cluster-app")
            for i, campaign in enumerate(campaigns.values()):
                for attr in ("a", "b"):
                    assert await store.apply_batch(campaign, attr, 0, counts_of(i), 10 + i, f"{campaign}:{attr}:0") \
                        == APPLIED
                    assert await store.apply_batch(campaign, attr, 0, counts_of(i), 10 + i, f"{campaign}:{attr}:0") \
                        == DUPLICATE_BATCH_ID
                    assert await store.apply_batch(campaign, attr, 1, counts_of(i), 20 + i, f"{campaign}:{attr}:1") \
                        == APPLIED
                    assert await store.apply_watermark(campaign, attr, 0) == APPLIED
                    await store.record_closed_at(campaign, attr, 0, 123.5)
                    await store.save_estimate(campaign, attr, 0, {"t": 0, "final": True})
                    await store.set_latest_estimate(campaign, attr, {"t": 0})
            for i, campaign in enumerate(campaigns.values()):
                for attr in ("a", "b"):
                    assert await store.reports_counted(campaign, attr, [0, 1, 2]) == [10 + i, 20 + i, 0]
                    assert await store.steps_from(campaign, attr, 0) == [0, 1]
                    assert await store.count_steps_through(campaign, attr, 1) == 2
                    assert await store.closed_times(campaign, attr, [0, 1]) == [123.5, None]
                    assert await store.final_estimates(campaign, attr, [0, 1]) == [{"t": 0, "final": True}, None]
                    assert await store.latest_estimate(campaign, attr) == {"t": 0}
                    step = await store.read_step(campaign, attr, 0, size)
                    assert step["closed"] and step["n"] == 10 + i
                    np.testing.assert_array_equal(step["counts"], counts_of(i))
            assert await store.claim_lease("cluster-app", "w1", 5.0)
            assert not await store.claim_lease("cluster-app", "w2", 5.0)
            await store.release_lease("cluster-app", "w1")
            assert await store.claim_lease("cluster-app", "w2", 5.0)
            await store.wake_estimator("cluster-app", "c", "a", 0)
            woken = False
            for _ in range(3):  # the first read may return the subscription's confirmation
                woken = woken or await wakeups.wait(2.0)
            assert woken, "the wake-up published through the cluster never arrived"
            await wakeups.close()
        finally:
            await store.close()

    asyncio.run(scenario())
    assert set(campaigns) == set(redis_cluster.ports)
    for port, campaign in campaigns.items():
        for attr in ("a", "b"):
            counts, n = read_counts(redis_cluster.url, campaign, attr, 1, size)  # the synchronous cluster client
            assert n == 20 + list(campaigns.values()).index(campaign)
            for key in (count_key(campaign, attr, 0), count_key(campaign, attr, 1), steps_key(campaign, attr),
                        closed_ts_key(campaign, attr), estimates_key(campaign, attr), latest_key(campaign, attr)):
                assert _assert_on_its_master(redis_cluster, key) == port


async def _ledger_scenario(store: CountStore, campaigns: list[str]) -> None:
    """Rate-limit slots and idempotency records (the ingest's :class:`RequestLedger`) whose keys spread
    over every master: claims win once, lose to the holder, expire, settle and replay."""
    from stream_app.ingest.limits import RequestLedger
    from stream_app.store import IngestClaim, RateSlot

    ledger = RequestLedger(store, idempotency_seconds=60, lease_seconds=30)
    slots = [(c, 7, f"slot-{c}".encode(), 60) for c in campaigns]
    request, body = f"request-{campaigns[0]}".encode().ljust(16, b"."), RequestLedger.body_hash(b"the body")
    first = await ledger.begin(slots, request, body)
    assert first.state == "new" and len(first.claimed) == len(slots) + 1
    assert (await ledger.begin(slots, request, body)).state == "in_progress"
    assert (await ledger.begin(slots, request, RequestLedger.body_hash(b"other"))).state == "key_reused"
    late = await ledger.begin(slots[1:], None, body)
    assert (late.state, late.conflicts) == ("rate_limited", list(range(len(slots) - 1)))
    await ledger.commit(first, 200, b'{"accepted":3}', body)
    replay = await ledger.begin(slots, request, body)
    assert (replay.state, replay.answer) == ("replay", (200, b'{"accepted":3}'))
    await ledger.abort(first)  # the slots go: the same device may send again
    again = await ledger.begin(slots, None, body)
    assert again.state == "new" and again.conflicts == []
    keys = [RateSlot(c, 9, f"claim-{i}".encode()) for i, c in enumerate(campaigns)]
    won = await store.claim_ingest_keys([IngestClaim(k, b"mine", 60) for k in keys])
    assert won == [b"mine"] * len(keys)
    lost = await store.claim_ingest_keys([IngestClaim(k, b"theirs", 60) for k in keys])
    assert lost == [b"mine"] * len(keys)  # each key's holder
    await store.settle_ingest_keys([IngestClaim(keys[0], b"done", 60)], keys[1:])
    assert await store.claim_ingest_keys([IngestClaim(k, b"next", 60) for k in keys]) \
        == [b"done"] + [b"next"] * (len(keys) - 1)


def test_the_ingest_ledger_on_a_cluster_and_on_one_node(redis_cluster, local_stack) -> None:
    """The ledger's claims run as pipelines on a cluster (keys on three masters) and as one script on one
    node: the same answers on both."""
    campaigns = list(_campaigns_on_every_master(redis_cluster).values())

    async def run(url: str, one_node: bool) -> None:
        store = CountStore.from_url(url)
        try:
            assert store._one_node is one_node
            await _ledger_scenario(store, [f"{c}-{one_node}" for c in campaigns] if one_node else campaigns)
        finally:
            await store.close()

    asyncio.run(run(redis_cluster.url, False))
    asyncio.run(run(local_stack.info.redis_url, True))
