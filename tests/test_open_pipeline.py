"""Issue 24 acceptance 3: open-domain attributes through the real broker and Redis, the fleet, a worker and the
HTTP ingest.

A campaign of string attributes (``tests/data/open.toml``) is published by a simulated fleet whose devices hold
strings of a Zipf law over 10^6 strings (``producers.datasets.open_population``) and counted by one worker:

* per attribute and step the Redis sketch and the count of reports equal, exactly, the offline aggregate of the
  same reports;
* every final lists the true top-10 strings of its step in its top-K, with frequencies those of the offline
  estimate; a sketch's candidates carry their estimated frequency;
* ``GET /estimates/{campaign}/{attribute}/query?value=`` answers the estimate of any string from the step's
  sketch, and refuses a query it cannot answer with the reason.

Then SDK devices (``producers.sdk.Device``) send strings through ``ldp ingest``: the worker counts each report
once and publishes the step.
"""
from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

from ldpstream_dev.workers import (IngestProcess, WorkerProcess, estimate_history, final_estimates, unique_campaign_file,
                                   wait_for_counts, wait_until)
from producers.fleet import FleetConfig, publish
from producers.sdk import Device
from stream_app.windows import open_fields
from wire.campaign import Campaign
from wire.topics import Topics

DATA = Path(__file__).parent / "data"
DEVICES, STEPS, TRUE_TOP = 100_000, 3, 10

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def open_worker(local_stack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("open")
    path = unique_campaign_file(DATA / "open.toml", tmp)
    app_id = f"open-{uuid.uuid4().hex[:6]}"
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", partitions=2,
                       refresh_seconds=0.2, session_timeout=3.0, run_dir=tmp) as w:
        w.wait_ready(timeout=90)
        yield w, path, app_id, boot, redis_url, tmp


def test_fleet_top_k_found_every_step_counts_exact(open_worker) -> None:
    w, path, app_id, boot, redis_url, _ = open_worker
    campaign = Campaign.load(path)
    config = FleetConfig(campaign, DEVICES, STEPS, p_change=0.25, batch_size=10_000, seed=24)
    summary = asyncio.run(publish(config, boot, topic=Topics.with_prefix(f"{app_id}.").reports, partitions=2))
    wait_for_counts(redis_url, campaign.id, {key: (v["support"], v["n"]) for key, v in summary.per_step.items()},
                    timeout=90)
    for name, attr in campaign.attributes.items():
        proto = attr.protocol
        hist = wait_until(lambda: estimate_history(w, campaign.id, name),
                          lambda h: len(final_estimates(h)) == STEPS, 60.0, f"every final of {name}")
        for t, doc in final_estimates(hist).items():
            step = summary.per_step[(name, t)]
            assert doc["kind"] == "string" and doc["n"] == step["n"] == DEVICES and doc["frequencies"] is None
            # the worker's estimate of the exact counts (JSON keeps a float's every digit)
            offline = json.loads(json.dumps(open_fields(attr, step["support"], step["n"])))
            assert doc["top_k"] == offline["top_k"] and doc["candidates"] == offline["candidates"]
            found = [e["item"] for e in doc["top_k"]]
            named = {e["item"]: e["value"] for e in doc["top_k"]}
            if attr.protocol.name == "TreeHist":  # a heavy hitter finds the top items without a list
                truth = step["true_top"][:TRUE_TOP]
                missed = {e["value"] for e in truth} - {e["value"] for e in truth if e["item"] in named}
                assert not missed, f"{name} t={t}: {missed} of the true top-{TRUE_TOP} not found"
                for e in truth:  # found items are named by the campaign's candidates
                    assert named[e["item"]] == (e["value"] if e["value"] in attr.candidates else None)
            else:  # a sketch ranks its candidates
                assert set(named.values()) <= set(attr.candidates) and len(found) == attr.top
            true_freq = {e["value"]: e["frequency"] for e in step["true_top"]}
            assert [c["value"] for c in doc["candidates"]] == list(attr.candidates)
            for c in doc["candidates"]:  # within 4 standard deviations (the 95% half-width is 1.96)
                half = (c["ci95"][1] - c["ci95"][0]) / 2
                z = abs(c["frequency"] - true_freq.get(c["value"], 0.0)) / (half / 1.96)
                assert z < 4, f"{name} t={t}: {c['value']} is {z:.1f} sd from its true frequency"
        # any string's estimate from the latest step's sketch
        last = max(final_estimates(hist))
        top = summary.per_step[(name, last)]["true_top"][0]
        q = urllib.parse.urlencode([("value", top["value"]), ("value", "never-seen"), ("t", str(last))])
        ans = _get(f"{w.url}/estimates/{campaign.id}/{name}/query?{q}")
        assert ans["t"] == last and ans["n"] == DEVICES and ans["status"] == "ok"
        want = proto.estimate(summary.per_step[(name, last)]["support"], DEVICES,
                              np.array([attr.value_id(top["value"]), attr.value_id("never-seen")], dtype=np.uint64))
        assert [v["frequency"] for v in ans["values"]] == pytest.approx(want, rel=1e-9, abs=1e-12)
        lo, hi = ans["values"][0]["ci95"]
        assert lo <= top["frequency"] <= hi or abs(ans["values"][0]["frequency"] - top["frequency"]) < 4 * (hi - lo)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{w.url}/estimates/{campaign.id}/{name}/query", timeout=5)
    assert err.value.code == 400 and "value" in json.loads(err.value.read())["error"]


def test_sdk_devices_send_strings_through_the_ingest(open_worker) -> None:
    w, path, app_id, boot, redis_url, tmp = open_worker
    campaign = Campaign.load(path)
    name = "home_page"
    proto = campaign.attribute(name).protocol
    pages = ["https://example.org/", "https://example.org/", "https://news.example/ü", "home_page-0000000"] * 3
    supports = []
    with IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp) as ingest:
        ingest.wait_ready(timeout=60)
        t = None
        for i, page in enumerate(pages):
            dev = Device(campaign, tmp / f"dev{i}", budget_eps=50.0, ingest_url=f"{ingest.url}/reports")
            t = dev.current_step() if t is None else t
            obj = dev.report(name, page, t=t)
            assert page.encode() not in json.dumps(obj).encode()  # the string never leaves the device
            req = urllib.request.Request(f"{ingest.url}/reports", data=json.dumps(obj).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert json.loads(r.read()) == {"accepted": 1}
            supports.append(proto.support(proto.decode(base64.b64decode(obj["payload"]))))
            dev.close()
    wait_for_counts(redis_url, campaign.id, {(name, t): (np.sum(supports, axis=0), len(pages))}, timeout=60)
    url = f"{w.url}/estimates/{campaign.id}/{name}"
    doc = wait_until(lambda: _try_get(url), lambda d: d is not None and d.get("n") == len(pages), 30.0, "estimate")
    assert doc["kind"] == "string" and doc["t"] == t and len(doc["candidates"]) == len(campaign.attribute(name).candidates)


def _try_get(url: str) -> dict | None:
    try:
        return _get(url)
    except OSError:
        return None


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())
