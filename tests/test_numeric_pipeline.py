"""Issue 23 acceptance 3: numeric attributes through the real broker and Redis, the fleet and the HTTP ingest.

A campaign with one attribute per numeric mechanism (PM, Square Wave, 1BitMean with memoization, HM, Duchi,
Laplace; ``tests/data/numeric.toml``) is published by a simulated fleet whose metrics drift step by step
(``producers.datasets.DriftingMetric``, some devices past the range: clipped and counted) and counted by one worker:

* per attribute and step the Redis aggregate and the count of reports equal, exactly, the offline aggregate of the
  same reports;
* every final publishes the mean of the offline aggregate, and it lies within 4 of its published standard
  deviations of the devices' true mean (of the values clipped to the range);
* Square Wave's quantiles p50, p90, p99 lie within their published 95% intervals in at least 95% of the (step,
  quantile) pairs of the run.

Then SDK devices (``producers.sdk.Device``) send numbers through ``ldp ingest``: the worker counts each report
once and publishes the step's mean.
"""
from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

from ldpstream_dev.workers import (IngestProcess, WorkerProcess, estimate_history, final_estimates,
                                   unique_campaign_file, wait_for_counts, wait_until)
from producers.fleet import FleetConfig, publish
from producers.sdk import Device
from wire.campaign import Campaign
from wire.topics import Topics

DATA = Path(__file__).parent / "data"
DEVICES, STEPS = 20_000, 16

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def numeric_worker(local_stack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("numeric")
    path = unique_campaign_file(DATA / "numeric.toml", tmp)
    app_id = f"num-{uuid.uuid4().hex[:6]}"
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", partitions=2,
                       refresh_seconds=0.2, session_timeout=3.0, run_dir=tmp) as w:
        w.wait_ready(timeout=90)
        yield w, path, app_id, boot, redis_url, tmp


def test_fleet_means_and_quantiles_end_to_end(numeric_worker) -> None:
    w, path, app_id, boot, redis_url, _ = numeric_worker
    campaign = Campaign.load(path)
    config = FleetConfig(campaign, DEVICES, STEPS, p_change=0.25, batch_size=10_000, seed=23)
    summary = asyncio.run(publish(config, boot, topic=Topics.with_prefix(f"{app_id}.").reports, partitions=2))
    wait_for_counts(redis_url, campaign.id, {key: (v["support"], v["n"]) for key, v in summary.per_step.items()},
                    timeout=90)
    assert sum(v["clipped"] for v in summary.per_step.values()) > 0  # the fleet's outliers were clipped
    covered, pairs = 0, 0
    for name, attr in campaign.attributes.items():
        proto = attr.protocol
        hist = wait_until(lambda: estimate_history(w, campaign.id, name),
                          lambda h: len(final_estimates(h)) == STEPS, 60.0, f"every final of {name}")
        for t, doc in final_estimates(hist).items():
            step = summary.per_step[(name, t)]
            assert doc["kind"] == "numeric" and doc["n"] == step["n"] == DEVICES and doc["frequencies"] is None
            offline = proto.estimate_mean(step["support"], step["n"])
            assert doc["mean"] == pytest.approx(offline.mean, rel=1e-12)
            z = abs(doc["mean"] - step["true_mean"]) / np.sqrt(doc["mean_variance"])
            assert z < 4, f"{name} t={t}: the mean is {z:.2f} sd from the truth"
            if proto.is_distribution:
                for q, truth in step["true_quantiles"].items():
                    band = doc["quantiles"][q]
                    pairs += 1
                    covered += band["lower"] <= truth <= band["upper"]
    assert pairs == 3 * STEPS and covered >= 0.95 * pairs, f"{covered} of {pairs} quantiles within their intervals"


def test_sdk_devices_send_numbers_through_the_ingest(numeric_worker) -> None:
    w, path, app_id, boot, redis_url, tmp = numeric_worker
    campaign = Campaign.load(path)
    names = ["session_seconds", "battery_drain", "latency_ms"]
    sent: dict[str, list[np.ndarray]] = {n: [] for n in names}
    with IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp) as ingest:
        ingest.wait_ready(timeout=60)
        rng = np.random.default_rng(7)
        t = None
        for i in range(12):
            dev = Device(campaign, tmp / f"dev{i}", budget_eps=50.0, ingest_url=f"{ingest.url}/reports")
            t = dev.current_step() if t is None else t
            for name in names:
                value = float(rng.uniform(-50.0, 700.0))  # some outside the range: clipped on the device
                obj = dev.report(name, value, t=t)
                req = urllib.request.Request(f"{ingest.url}/reports", data=json.dumps(obj).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    assert json.loads(r.read()) == {"accepted": 1}
                proto = campaign.attribute(name).protocol
                sent[name].append(proto.support(proto.decode(base64.b64decode(obj["payload"]))))
            dev.close()
    wait_for_counts(redis_url, campaign.id, {(n, t): (np.sum(sent[n], axis=0), 12) for n in names}, timeout=60)
    for name in names:
        url = f"{w.url}/estimates/{campaign.id}/{name}"
        doc = wait_until(lambda: _get(url), lambda d: d is not None and d.get("n") == 12, 30.0, f"{name} estimate")
        assert doc["kind"] == "numeric" and doc["mean"] is not None and doc["t"] == t


def _get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None
