"""The local stack's Redis keeps what it applied through a SIGKILL (AOF, fsync every second)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from devtools.stack import LocalStack
from stream_app.store import CountStore, read_step_sync

pytestmark = pytest.mark.timeout(180)


async def _apply(url: str) -> bool:
    store = CountStore.from_url(url)
    try:
        return await store.apply_batch("crash", "x", 3, 0, 41, np.array([5, 0, 7], dtype=np.int64), 12,
                                       batch_id="p:3:x:0")
    finally:
        await store.close()


def test_counts_survive_a_redis_sigkill(tmp_path):
    stack = LocalStack(run_dir=tmp_path / "stack")
    info = stack.up(stop_on_exit=True)
    try:
        assert asyncio.run(_apply(info.redis_url))
        time.sleep(1.5)  # appendfsync everysec
        old_pid = info.redis_pid
        new_pid = stack.restart_redis(kill=True)
        assert new_pid != old_pid
        state = read_step_sync(info.redis_url, "crash", "x", 3, 3)
        assert state["n"] == 12 and state["counts"].tolist() == [5, 0, 7] and state["offsets"] == {0: 41}
        # the applied batch id survived too: re-applying the same batch is a duplicate
        assert not asyncio.run(_apply(info.redis_url))
        assert read_step_sync(info.redis_url, "crash", "x", 3, 3)["n"] == 12
    finally:
        stack.down()
