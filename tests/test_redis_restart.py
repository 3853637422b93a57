"""The local stack's Redis keeps what it applied through a SIGKILL (AOF, fsync every second)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from ldpstream_dev.stack import LocalStack
from stream_app.store import APPLIED, DUPLICATE_BATCH_ID, CountStore, read_step_sync

pytestmark = pytest.mark.timeout(180)


async def _apply(url: str) -> int:
    store = CountStore.from_url(url)
    try:
        return await store.apply_batch("crash", "x", 3, np.array([5, 0, 7], dtype=np.int64), 12, "p:3:x:0")
    finally:
        await store.close()


def test_counts_survive_a_redis_sigkill(tmp_path):
    stack = LocalStack(run_dir=tmp_path / "stack")
    info = stack.up(stop_on_exit=True)
    try:
        assert asyncio.run(_apply(info.redis_url)) == APPLIED
        time.sleep(1.5)  # appendfsync everysec
        old_pid = info.redis_pid
        new_pid = stack.restart_redis(kill=True)
        assert new_pid != old_pid
        state = read_step_sync(info.redis_url, "crash", "x", 3, 3)
        assert state["n"] == 12 and state["counts"].tolist() == [5, 0, 7]
        # the applied batch id survived too: re-applying the same batch is a duplicate
        assert asyncio.run(_apply(info.redis_url)) == DUPLICATE_BATCH_ID
        assert read_step_sync(info.redis_url, "crash", "x", 3, 3)["n"] == 12
    finally:
        stack.down()


def test_an_apply_after_a_restart_that_lost_writes_waits_for_the_cursor_check(tmp_path):
    """Redis restarts from an AOF without its last writes while a worker is between two messages: the next
    apply (here a watermark) must not land on the restored server unchecked (its position would pass the
    lost batch). The script refuses it with SERVER_CHANGED, and the campaign's cursor shows what was lost."""
    import shutil

    from stream_app.store import SERVER_CHANGED, Position

    stack = LocalStack(run_dir=tmp_path / "stack")
    info = stack.up(stop_on_exit=True)
    snapshot = tmp_path / "aof-before"

    async def run() -> None:
        store = CountStore.from_url(info.redis_url)
        at = lambda offset, ident: Position("app", "reports", 0, offset, ident)  # noqa: E731
        try:
            counts = np.array([1, 2, 0], dtype=np.int64)
            assert await store.apply_batch("aof", "x", 0, counts, 3, "p:0:x:0", position=at(0, "p:0:x:0")) == APPLIED
            await asyncio.sleep(1.5)  # appendfsync everysec: the first batch is on disk
            shutil.copytree(tmp_path / "stack" / "appendonlydir", snapshot)
            assert await store.apply_batch("aof", "x", 0, counts, 3, "p:0:x:1", position=at(1, "p:0:x:1")) == APPLIED
            assert await store.cursors("aof", "app", "reports") == {0: (1, "p:0:x:1")}

            def lose_the_last_writes(data_dir) -> None:
                shutil.rmtree(data_dir / "appendonlydir")
                shutil.copytree(snapshot, data_dir / "appendonlydir")

            stack.restart_redis(kill=True, while_stopped=lose_the_last_writes)
            await store.redis.connection_pool.disconnect()
            assert await store.apply_watermark("aof", "x", 0, position=at(2, "wm:x:0")) == SERVER_CHANGED
            # nothing was applied or recorded: the step is open, the cursor and position still name offset 0
            state = await store.read_step("aof", "x", 0, 3)
            assert (state["n"], state["closed"]) == (3, False)
            assert await store.cursors("aof", "app", "reports") == {0: (0, "p:0:x:0")}
            assert await store.positions("app", "reports") == {0: (0, "p:0:x:0")}
            # still refused until the worker accepts the new server; then applied on it
            assert await store.apply_watermark("aof", "x", 0, position=at(2, "wm:x:0")) == SERVER_CHANGED
            store.accept_server("aof")
            assert await store.apply_batch("aof", "x", 0, counts, 3, "p:0:x:1", position=at(1, "p:0:x:1")) == APPLIED
            assert (await store.read_step("aof", "x", 0, 3))["n"] == 6
        finally:
            await store.close()

    try:
        asyncio.run(run())
    finally:
        stack.down()


def test_a_restart_is_caught_on_the_connection_that_carries_the_next_apply(tmp_path):
    """No ``INFO`` per batch: the run id is read once per new connection. A Redis that restarts (here with all
    its data) between two applies is caught on the next apply even though the store's pooled connection is
    still the old one (redis-py reconnects and may retry the command on its own): the new connection sees
    another run id and replaces the campaign's server marker before the apply runs, so the apply is refused
    (SERVER_CHANGED) until the worker checked the cursors. Another worker's store that never applied under
    the old marker is not disturbed; a second store that had is refused too, once."""
    from stream_app.store import RETRYABLE_ERRORS, SERVER_CHANGED, Position

    stack = LocalStack(run_dir=tmp_path / "stack")
    info = stack.up(stop_on_exit=True)
    at = lambda offset: Position("app", "reports", 0, offset, f"p:{offset}")  # noqa: E731
    counts = np.array([1, 0, 2], dtype=np.int64)

    async def apply(store: CountStore, batch: str, offset: int) -> int:
        for _ in range(20):  # as the worker's retry loop does when the connection broke
            try:
                return await store.apply_batch("rs", "x", 0, counts, 3, batch, position=at(offset))
            except RETRYABLE_ERRORS:
                await asyncio.sleep(0.2)
        raise AssertionError("the store never came back")

    async def run() -> None:
        first, second = CountStore.from_url(info.redis_url), CountStore.from_url(info.redis_url)
        try:
            assert await apply(first, "b0", 0) == APPLIED
            assert await apply(second, "b1", 1) == APPLIED
            assert await apply(first, "b2", 2) == APPLIED  # the same server: no check, no refusal
            await asyncio.sleep(1.5)  # appendfsync everysec: everything is on disk
            stack.restart_redis(kill=True)
            assert await apply(first, "b3", 3) == SERVER_CHANGED
            assert (await first.read_step("rs", "x", 0, 3))["n"] == 9  # nothing applied
            assert await first.cursors("rs", "app", "reports") == {0: (2, "p:2")}  # the worker compares: all there
            first.accept_server("rs")
            assert await apply(first, "b3", 3) == APPLIED
            assert await apply(second, "b4", 4) == SERVER_CHANGED  # it applied before the restart: checked too
            second.accept_server("rs")
            assert await apply(second, "b4", 4) == APPLIED
            assert await apply(first, "b5", 5) == APPLIED  # the second's check did not refuse the first again
            fresh = CountStore.from_url(info.redis_url)  # a worker started after the restart: nothing to check
            try:
                assert await apply(fresh, "b6", 6) == APPLIED
            finally:
                await fresh.close()
            assert (await first.read_step("rs", "x", 0, 3))["n"] == 21
        finally:
            await first.close()
            await second.close()

    try:
        asyncio.run(run())
    finally:
        stack.down()
