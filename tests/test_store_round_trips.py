"""The count store's hot path against the real local Redis: what one batch costs, watched with ``MONITOR``.

A batch apply is one ``EVALSHA`` (one round trip) on one node: the epoch is cached, the server's identity is
a marker compared inside the script (no ``INFO``, not even from Lua), and the consumer position is written
by the same script. A run-id check happens once per new connection, never per batch.
"""
from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import numpy as np
import pytest
import redis

from stream_app.store import APPLIED, DUPLICATE_BATCH_ID, CountStore, Position

pytestmark = pytest.mark.timeout(120)


class Monitor:
    """The commands a Redis server runs between two ``ECHO`` markers (``MONITOR`` in a thread)."""

    def __init__(self, url: str) -> None:
        self.start, self.end = f"start-{uuid.uuid4().hex}", f"end-{uuid.uuid4().hex}"
        self.commands: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._client = redis.Redis.from_url(url)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._client.monitor() as m:
            self._ready.set()
            seen = False
            for cmd in m.listen():
                if self.end in cmd["command"]:
                    return
                if seen:
                    self.commands.append(cmd)
                seen = seen or self.start in cmd["command"]

    def __enter__(self) -> "Monitor":
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(10)
        self._client.close()

    def names(self, lua: bool) -> list[str]:
        """The command names run by clients (``lua=False``) or from scripts (``lua=True``)."""
        return [c["command"].split()[0].upper() for c in self.commands if (c.get("client_type") == "lua") is lua]


async def _measure(store: CountStore, monitor: Monitor, call: Any) -> Any:
    await store.redis.echo(monitor.start)
    out = await call
    await store.redis.echo(monitor.end)
    return out


def test_a_batch_costs_one_round_trip_and_no_info(local_stack) -> None:
    url = local_stack.info.redis_url
    campaign = f"hot-{uuid.uuid4().hex[:8]}"
    at = lambda offset: Position("hot-app", "reports", 0, offset, f"p:{offset}")  # noqa: E731
    counts = np.array([3, 0, 1, 4], dtype=np.int64)

    async def run() -> None:
        store = CountStore.from_url(url)
        try:  # the first batch of a campaign reads (and creates) its epoch, once per campaign and store; a script's
            # first call on a server loads it (NOSCRIPT, SCRIPT LOAD), once per script and server
            assert await store.apply_batch(campaign, "x", 0, counts, 8, "b0", "0:0", at(0)) == APPLIED
            assert await store.apply_watermark(campaign, "y", 0) == APPLIED
            with Monitor(url) as mon:
                status = await _measure(store, mon, store.apply_batch(campaign, "x", 0, counts, 8, "b1", "0:1", at(1)))
            assert status == APPLIED
            assert mon.names(lua=False) == ["EVALSHA"], mon.commands
            lua = mon.names(lua=True)
            assert "INFO" not in lua and "HINCRBY" in lua and "HSET" in lua, lua
            # a duplicate and a watermark: one round trip each too
            for call, want in ((store.apply_batch(campaign, "x", 0, counts, 8, "b1", "0:1", at(1)), DUPLICATE_BATCH_ID),
                               (store.apply_watermark(campaign, "x", 0, at(2), count=16), APPLIED)):
                with Monitor(url) as mon:
                    assert await _measure(store, mon, call) == want
                assert mon.names(lua=False) == ["EVALSHA"], mon.commands
                assert "INFO" not in mon.names(lua=True)
            # what the one round trip did: counts, step index, touched mark, cursor and position
            state = await store.read_step(campaign, "x", 0, 4)
            assert (state["n"], state["counts"].tolist(), state["closed"], state["expected"]) == \
                (16, [6, 0, 2, 8], True, 16)
            assert await store.steps_from(campaign, "x", 0) == [0]
            assert await store.touched(campaign, "x", 10) == {0: 2.0}
            assert await store.cursors(campaign, "hot-app", "reports") == {0: (2, "p:2")}
            assert await store.positions("hot-app", "reports") == {0: (2, "p:2")}
        finally:
            await store.close()

    asyncio.run(run())


def test_the_step_vector_records_its_type(local_stack) -> None:
    """One key format for every kind of aggregate: dtype and shape live in the step's hash; a float vector (a
    sum) and a matrix (a sketch) are stored flat under the same fields as support counts."""
    url = local_stack.info.redis_url
    campaign = f"typed-{uuid.uuid4().hex[:8]}"

    async def run() -> None:
        store = CountStore.from_url(url)
        try:
            await store.apply_batch(campaign, "k", 0, np.array([2, 0, 5], dtype=np.int64), 7, "a")
            await store.apply_batch(campaign, "m", 0, np.array([[1, 0], [0, 3]], dtype=np.int64), 4, "a")
            await store.apply_batch(campaign, "s", 0, np.array([0.5, -1.25]), 2, "a")
            await store.apply_batch(campaign, "s", 0, np.array([0.25, 0.0]), 2, "b")
            raw = {a: await store.redis.hgetall(f"ldp:{{{campaign}}}:{a}:0") for a in "kms"}
            assert (raw["k"][b"dtype"], raw["k"][b"shape"]) == (b"int64", b"3")
            assert (raw["m"][b"dtype"], raw["m"][b"shape"]) == (b"int64", b"2,2")
            assert (raw["s"][b"dtype"], raw["s"][b"shape"]) == (b"float64", b"2")
            assert (await store.read_step(campaign, "k", 0, 3))["counts"].tolist() == [2, 0, 5]
            assert (await store.read_step(campaign, "m", 0, 4))["counts"].tolist() == [1, 0, 0, 3]
            assert (await store.read_step(campaign, "s", 0, 2))["counts"].tolist() == [0.75, -1.25]
        finally:
            await store.close()

    asyncio.run(run())
