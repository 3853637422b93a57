"""Issue 3 acceptance 1 and 2: the whole pipeline on the real broker and Redis.

A fleet of 100000 devices sends 5 time steps of an L-OSUE and an OLOLOHA attribute through
tansu; stream-app workers (separate processes) count them into Redis. The Redis counts must
equal, exactly, the offline ``support`` of the same reports, also when a worker is killed with
SIGKILL mid-stream and restarted, and with two workers in one consumer group; every final
estimate must lie within 4 standard deviations (exact variance at the true frequency) of the
true frequency.
"""
from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldpstream_dev.workers import (WorkerProcess, estimate_history, final_estimates, unique_campaign_file, wait_for_counts,
                              wait_until)
from producers.fleet import FleetConfig, publish
from wire.campaign import Campaign
from wire.topics import Topics

CAMPAIGN = Path(__file__).parent / "data" / "e2e.toml"
DEVICES, STEPS = 100_000, 5


def _fleet(campaign: Path, batch_size: int = 20_000, seed: int = 1, rate: float | None = None) -> FleetConfig:
    return FleetConfig(Campaign.load(campaign), DEVICES, STEPS, dataset="syn", p_change=0.25, base="zipf",
                       batch_size=batch_size, seed=seed, rate=rate)


def _expected(summary) -> dict[tuple[str, int], tuple[np.ndarray, int]]:
    return {key: (v["support"], v["n"]) for key, v in summary.per_step.items()}


def _worker(kafka_bootstrap: str, redis_url: str, app_id: str, run_dir: Path, campaign: Path,
            name: str = "worker") -> WorkerProcess:
    return WorkerProcess([campaign], kafka_bootstrap, redis_url, app_id=app_id,
                         topic_prefix=f"{app_id}.", partitions=4, refresh_seconds=0.2, session_timeout=3.0,
                         run_dir=run_dir, name=name)


def test_end_to_end_counts_and_estimates(local_stack, tmp_path) -> None:
    run_end_to_end(local_stack.info.kafka_bootstrap, local_stack.info.redis_url, tmp_path)


def run_end_to_end(kafka_bootstrap: str, redis_url: str, run_dir: Path, workers: int = 1) -> tuple[Campaign, Any]:
    """The end-to-end run on a broker and a Redis (one node, or a cluster URL): ``workers`` workers of one
    consumer group count the fleet; the counts must equal the offline support exactly and every step gets
    a final estimate. Returns the campaign (a fresh id) and the fleet's summary."""
    app_id = f"e2e-{uuid.uuid4().hex[:6]}"
    path = unique_campaign_file(CAMPAIGN, run_dir)
    campaign = Campaign.load(path)
    ws = [_worker(kafka_bootstrap, redis_url, app_id, run_dir, path, name=f"w{i}").start() for i in range(workers)]
    try:
        for w in ws:
            w.wait_ready(timeout=90)
        summary = asyncio.run(publish(_fleet(path), kafka_bootstrap,
                                      topic=Topics.with_prefix(f"{app_id}.").reports, partitions=4))
        assert summary.reports_sent == DEVICES * STEPS * 2
        wait_for_counts(redis_url, campaign.id, _expected(summary), timeout=90)
        for attr in campaign.attributes:
            proto = campaign.attribute(attr).protocol
            hist = wait_until(lambda: estimate_history(ws[-1], campaign.id, attr),
                              lambda h: len(final_estimates(h)) == STEPS, 30.0, "every final", _finals_summary)
            for t, doc in final_estimates(hist).items():
                truth = summary.per_step[(attr, t)]["true_frequencies"]
                assert doc["n"] == DEVICES and doc["final"]
                est = np.asarray(doc["frequencies"])
                sd = np.sqrt(proto.variance_exact(truth, DEVICES))
                z = np.abs(est - truth) / sd
                assert z.max() < 4, f"{attr} t={t}: an estimate is {z.max():.2f} sd from the truth"
                # and it is the estimator applied to exactly the offline counts
                np.testing.assert_allclose(est, proto.estimate(summary.per_step[(attr, t)]["support"], DEVICES))
    finally:
        for w in ws:
            w.stop()
    return campaign, summary


def _finals_summary(last) -> str:
    return str({t: d.get("final") for t, d in final_estimates(last).items()} if isinstance(last, dict) else last)


@pytest.mark.parametrize("workers", [1, 2])
def test_exactly_once_after_sigkill(local_stack, tmp_path, workers: int) -> None:
    """Kill a worker with SIGKILL while the stream is flowing, restart it: counts stay exact."""
    app_id = f"eo{workers}-{uuid.uuid4().hex[:6]}"
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    kafka, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    ws = [_worker(kafka, redis_url, app_id, tmp_path, path, name=f"w{i}").start() for i in range(workers)]
    try:
        for w in ws:
            w.wait_ready(timeout=90)
        victim = ws[0]

        async def run():
            killed = asyncio.Event()

            def on_progress(p) -> None:
                # kill the first worker once about 40% of the stream is out
                if not killed.is_set() and p.reports_sent >= 0.4 * p.reports_total:
                    victim.kill()
                    killed.set()
            summary = await publish(_fleet(path, batch_size=5_000, seed=2, rate=400_000), local_stack.info.kafka_bootstrap,
                                    topic=Topics.with_prefix(f"{app_id}.").reports, partitions=4, on_progress=on_progress)
            assert killed.is_set()
            return summary

        summary = asyncio.run(run())
        restarted = _worker(kafka, redis_url, app_id, tmp_path, path, name="w0-restarted").start()
        ws.append(restarted)
        restarted.wait_ready(timeout=90)
        wait_for_counts(local_stack.info.redis_url, Campaign.load(path).id, _expected(summary), timeout=120)
    finally:
        for w in ws:
            w.stop()
