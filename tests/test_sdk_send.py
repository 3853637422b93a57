"""The device SDK's side of sending: labels where indices are accepted, the budget's plan said at construction,
and ``send()`` retried after a dropped connection through the real ingest: counted once, never randomized again."""
from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from estimators.errors import LDPError
from ldpstream_dev.dropping_proxy import DroppingProxy, request_body, request_header
from ldpstream_dev.workers import IngestProcess, WorkerProcess, unique_campaign_file, wait_for_counts
from producers.sdk import Device, IngestError
from wire.campaign import Campaign

DEMO = Path(__file__).resolve().parents[1] / "deploy" / "campaigns" / "demo.toml"
E2E = Path(__file__).parent / "data" / "e2e.toml"


def test_labels_are_accepted_wherever_indices_are(tmp_path):
    dev = Device(Campaign.load(DEMO), tmp_path / "dev", budget_eps=None)
    yes = dev.report("opt_in", "yes", t=1)
    assert yes["attribute"] == "opt_in" and dev.value_index("opt_in", "yes") == 1 == dev.value_index("opt_in", 1)
    with pytest.raises(LDPError, match="'maybe' is not a label of 'opt_in' \\(labels: 'no', 'yes'\\)"):
        dev.report("opt_in", "maybe")
    with pytest.raises(LDPError, match="'app_version' has no labels"):
        dev.report("app_version", "v1")
    with pytest.raises(LDPError, match="outside the domain"):
        dev.report("opt_in", 2)
    objs = dev.report_group("device", {"dark_mode": "on", "country": 3, "device_model": 17}, t=1)
    assert objs and all(o["attribute"] in ("dark_mode", "country", "device_model") for o in objs)
    with pytest.raises(LDPError, match="not a label of 'dark_mode'"):
        dev.report_group("device", {"dark_mode": "dim", "country": 3, "device_model": 17}, t=2)


def test_the_budget_says_what_it_memoizes_at_construction(tmp_path, caplog):
    """budget_eps=10 on the demo campaign: 5 memo slots in all when the attributes report in turn (the issue's
    "fully reserved after 3 reports" came without a word); the plan is logged and kept on the device."""
    with caplog.at_level(logging.INFO, logger="producers.sdk"):
        dev = Device(Campaign.load(DEMO), tmp_path / "dev", budget_eps=10.0)
    plan = dev.budget_plan
    assert plan in caplog.text
    assert "app_version (L-OSUE): its first memoized value reserves 2, each further one 2; alone in the budget it " \
           "could memoize 5 of its 100 possible inputs" in plan
    assert "memoize app_version 2, crash_minute 2, opt_in 1 value(s) (5 reports reserve 10)" in plan
    # the plan is what happens: five first reports in turn reserve the whole budget
    for attr, value in (("app_version", 1), ("crash_minute", 2), ("opt_in", 0), ("app_version", 3),
                        ("crash_minute", 4)):
        dev.report(attr, value, t=1)
    assert dev.reserved_loss() == pytest.approx(10.0) and dev.remaining_budget() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="cannot memoize a single value"):
        Device(Campaign.load(DEMO), tmp_path / "small", budget_eps=1.0)




def test_send_retried_after_a_dropped_connection_counts_once_and_never_randomizes_again(local_stack, tmp_path):
    path = unique_campaign_file(E2E, tmp_path)
    campaign = Campaign.load(path)
    app_id = f"send-{uuid.uuid4().hex[:6]}"
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    attr = "app_version"
    proto = campaign.attribute(attr).protocol
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", refresh_seconds=0.2,
                       session_timeout=3.0, run_dir=tmp_path), \
            IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp_path) as ingest:
        proxy = DroppingProxy(ingest.settings.port)
        try:
            dev = Device(campaign, tmp_path / "dev", budget_eps=10.0,
                         ingest_url=f"http://127.0.0.1:{proxy.port}/reports", retries=3, backoff_seconds=0.05)
            t = dev.current_step()
            reply = dev.send(attr, 42, t=t)
        finally:
            proxy.close()
        assert reply == {"accepted": 1}
        first, second = proxy.requests
        assert request_body(first) == request_body(second)  # the same randomized report, not a second randomization
        assert request_header(first, b"idempotency-key") == request_header(second, b"idempotency-key") is not None
        assert dev.memo_slots[attr] == 1  # one report reserved, once
        obj = json.loads(request_body(first))
        support = proto.support(proto.decode(base64.b64decode(obj["payload"])))
        wait_for_counts(redis_url, campaign.id, {(attr, t): (support, 1)}, timeout=30)

        # a refusal that a retry cannot mend is not retried: IngestError at once (a 60 s backoff would show)
        dev2 = Device(campaign, tmp_path / "dev2", budget_eps=10.0, ingest_url=f"{ingest.url}/no-such-path",
                      retries=3, backoff_seconds=60.0)
        started = time.monotonic()
        with pytest.raises(IngestError) as refused:
            dev2.send(attr, 1, t=t)
        assert refused.value.status == 404 and time.monotonic() - started < 30
