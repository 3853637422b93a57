"""Issue 9 acceptance 3: multidimensional solutions through the real broker and Redis.

An ALLOMFREE campaign (a group of three attributes next to an attribute with its own protocol) and an RS+FD
campaign are published by simulated fleets and counted by one worker: the Redis counts and numbers of reports
of every attribute equal, exactly, the offline support of the same reports, and every final estimate (the
solution's estimator) lies within 4 standard deviations (the solution's exact variance at the true frequency,
with the number of reports the server counted) of the true frequency of the whole population.
"""
from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import numpy as np
import pytest

from ldpstream_dev.workers import (WorkerProcess, estimate_history, final_estimates, unique_campaign_file, wait_for_counts,
                              wait_until)
from producers.fleet import FleetConfig, publish
from wire.campaign import Campaign
from wire.topics import Topics

DATA = Path(__file__).parent / "data"
DEVICES, STEPS = 60_000, 3

pytestmark = pytest.mark.timeout(300)


def test_allomfree_and_rsfd_campaigns_end_to_end(local_stack, tmp_path) -> None:
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    app_id = f"md-{uuid.uuid4().hex[:6]}"
    paths = [unique_campaign_file(DATA / name, tmp_path) for name in ("allomfree.toml", "rsfd.toml")]
    campaigns = [Campaign.load(p) for p in paths]
    topic = Topics.with_prefix(f"{app_id}.").reports
    with WorkerProcess(paths, boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", partitions=2,
                       refresh_seconds=0.2, session_timeout=3.0, run_dir=tmp_path) as w:
        w.wait_ready(timeout=90)
        for seed, campaign in enumerate(campaigns, start=1):
            config = FleetConfig(campaign, DEVICES, STEPS, dataset="syn", p_change=0.25, base="zipf",
                                 batch_size=20_000, seed=seed)
            summary = asyncio.run(publish(config, boot, topic=topic, partitions=2))
            expected = {key: (v["support"], v["n"]) for key, v in summary.per_step.items()}
            wait_for_counts(redis_url, campaign.id, expected, timeout=90)
            for group in campaign.groups.values():
                ns = [summary.per_step[(m, 0)]["n"] for m in group.attributes]
                if group.solution.name in ("SMP", "L-SMP", "ALLOMFREE"):  # one sampled attribute per device
                    assert sum(ns) == DEVICES, ns
                else:  # every device reports every attribute (fake data for the non-sampled ones)
                    assert ns == [DEVICES] * len(ns), ns
            for attr in campaign.attributes:
                proto = campaign.attribute(attr).protocol
                hist = wait_until(lambda: estimate_history(w, campaign.id, attr),
                                  lambda h: len(final_estimates(h)) == STEPS, 60.0, f"every final of {attr}")
                for t, doc in final_estimates(hist).items():
                    step = summary.per_step[(attr, t)]
                    assert doc["final"] and doc["n"] == step["n"]
                    est = np.asarray(doc["frequencies"])
                    np.testing.assert_allclose(est, proto.estimate(step["support"], step["n"]))
                    sd = np.sqrt(proto.variance_exact(step["true_frequencies"], step["n"]))
                    z = np.abs(est - step["true_frequencies"]) / sd
                    assert z.max() < 4, f"{campaign.id}/{attr} t={t}: an estimate is {z.max():.2f} sd from the truth"
