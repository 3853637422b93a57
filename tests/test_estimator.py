"""The windowed estimator against a real Redis: finals follow watermarks whatever their order."""
from __future__ import annotations

import asyncio
import uuid

import numpy as np

from stream_app.windows import Estimator
from stream_app.metrics import Metrics
from stream_app.store import CountStore
from wire.campaign import Campaign


def _campaign(cid: str) -> Campaign:
    return Campaign.from_dict({"campaign": {"id": cid, "time_step_seconds": 3600.0, "lateness_seconds": 3600.0,
                                            "min_n": 1},  # its steps have 8 reports: estimates with frequencies
                               "attributes": [{"name": "a", "k": 4, "protocol": "GRR", "eps": 1.0}]})


def test_a_step_that_appears_below_the_scan_start_is_finalized_at_once(local_stack) -> None:
    """Regression: steps 2 and 3 were counted and closed before step 1 got its first batch; the
    incremental scan had moved past 1 and left it for a periodic rescan (final ~14 s late)."""
    cid = f"est-{uuid.uuid4().hex[:6]}"
    campaign = _campaign(cid)
    published: list[dict] = []

    async def run() -> None:
        store = CountStore.from_url(local_stack.info.redis_url)
        est = Estimator({cid: campaign}, store, Metrics(), lambda doc: _append(published, doc), app_id=cid,
                        refresh_seconds=0.05, rescan_ticks=10_000)
        counts = np.array([5, 1, 0, 2])
        offset = 0
        for t in (2, 3):
            await store.apply_batch(cid, "a", t, counts, 8, f"b:{t}:{offset}")
            await store.apply_watermark(cid, "a", t)
            offset += 2
        # step 1 gets its batch and watermark while a tick is between reading its candidate
        # steps and moving its scan start past 3 (the interleaving that used to lose it)
        original = est.redis.zrangebyscore
        armed = [True]

        async def racing_zrangebyscore(*args, **kwargs):
            out = await original(*args, **kwargs)
            if armed[0]:
                armed[0] = False
                await store.apply_batch(cid, "a", 1, counts, 8, "b:1:racing")
                await store.apply_watermark(cid, "a", 1)
            return out

        est.redis.zrangebyscore = racing_zrangebyscore
        await est.tick()
        assert {d["t"] for d in published if d["final"]} == {2, 3}
        await est.tick()
        finals = {d["t"]: d for d in published if d["final"]}
        assert 1 in finals, "step 1 was skipped by the scan"
        assert finals[1]["n"] == 8 and list(finals[1]["frequencies"]) == list(
            campaign.attribute("a").protocol.estimate(counts, 8))
        assert set((await store.estimates(cid, "a"))) == {1, 2, 3}
        await est.release()
        await store.close()

    asyncio.run(run())


async def _append(out: list, doc: dict) -> None:
    out.append(doc)
