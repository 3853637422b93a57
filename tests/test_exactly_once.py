"""Exactly-once from producer to count (issue 8): a batch re-sent by its producer is counted once.

Every batch envelope carries a stable batch id chosen by its producer; the count store's Lua
script applies each id at most once (``b:<batch_id>`` in the step hash) and the agent counts the
skip in ``ldp_duplicate_batches_total``. Real broker + Redis + worker process.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest

from ldpstream_dev.workers import (WorkerProcess, estimate_history, final_estimates, produce_messages, read_counts,
                              unique_campaign_file, wait_for_counts, wait_until)
from producers.fleet import Fleet, FleetConfig, publish
from wire import envelope as E
from wire.campaign import Campaign
from wire.topics import Topics, message_key

CAMPAIGN = Path(__file__).parent / "data" / "e2e.toml"
ATTR = "app_version"


def _worker(stack, app_id: str, run_dir: Path, campaign: Path) -> WorkerProcess:
    return WorkerProcess([campaign], stack.info.kafka_bootstrap, stack.info.redis_url, app_id=app_id,
                         topic_prefix=f"{app_id}.", partitions=2, refresh_seconds=0.2, session_timeout=3.0,
                         run_dir=run_dir)


def _metrics(w: WorkerProcess) -> str:
    with urllib.request.urlopen(f"{w.url}/metrics", timeout=5) as r:
        return r.read().decode()


def _duplicates(text: str, campaign: str, attribute: str) -> float:
    total = 0.0
    for m in re.finditer(r"^ldp_duplicate_batches_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("campaign") == campaign and labels.get("attribute") == attribute:
            total += float(m.group(2))
    return total


def _finals(w: WorkerProcess, campaign: str, attribute: str) -> dict[int, dict]:
    return final_estimates(estimate_history(w, campaign, attribute))


def test_envelope_id_roundtrip() -> None:
    campaign = Campaign.load(CAMPAIGN)
    proto = campaign.attribute(ATTR).protocol
    reports = proto.randomize(np.arange(10) % proto.k, np.random.default_rng(1), state=proto.new_state(10))
    env = E.parse(E.pack_reports(campaign, ATTR, 3, reports, batch_id="p:3:app_version:0"))
    assert env.batch_id == "p:3:app_version:0" and env.count == 10 and env.t == 3
    assert E.parse(E.pack_watermark(campaign, ATTR, 3)).batch_id == ""


def test_same_envelope_sent_three_times_is_counted_once(local_stack, tmp_path) -> None:
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    campaign = Campaign.load(path)
    proto = campaign.attribute(ATTR).protocol
    app_id = f"eo-{uuid.uuid4().hex[:6]}"
    topic = Topics.with_prefix(f"{app_id}.").reports
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    n = 1000
    rng = np.random.default_rng(11)
    reports = proto.randomize(rng.integers(0, proto.k, n), rng, state=proto.new_state(n, rng=rng))
    support = proto.support(reports)
    blob = E.pack_reports(campaign, ATTR, 0, reports, batch_id=f"{uuid.uuid4().hex}:0:{ATTR}:0")
    key = message_key(0, ATTR)
    with _worker(local_stack, app_id, tmp_path, path) as w:
        produce_messages(boot, topic, [(key, blob), (key, blob), (key, E.pack_watermark(campaign, ATTR, 0))])
        wait_for_counts(redis_url, campaign.id, {(ATTR, 0): (support, n)}, timeout=30)
        wait_until(lambda: _duplicates(_metrics(w), campaign.id, ATTR), lambda v: v == 1, 20,
              "one batch-id duplicate")
        finals = wait_until(lambda: _finals(w, campaign.id, ATTR), lambda f: 0 in f, 20, "a final of step 0")
        assert finals[0]["n"] == n
        # a third copy after the step's watermark (and its final) is skipped as well
        produce_messages(boot, topic, [(key, blob)])
        wait_until(lambda: _duplicates(_metrics(w), campaign.id, ATTR), lambda v: v == 2, 20,
              "two batch-id duplicates")
        counts, got_n = read_counts(redis_url, campaign.id, ATTR, 0, len(support))
        assert got_n == n and np.array_equal(counts, support)
        time.sleep(1.0)  # a refresh of the estimator would publish a revision if anything had changed
        finals = _finals(w, campaign.id, ATTR)
        assert finals[0]["n"] == n
        text = _metrics(w)
        assert re.search(r"^ldp_reports_total\{[^}]*\} 1000\.0$", text, re.M), "reports counted more than once"


def test_resumed_fleet_resending_a_step_is_counted_once(local_stack, tmp_path) -> None:
    """A fleet killed after sending step 0 but before committing it re-sends step 0 when resumed: the very
    same bytes (private mode too: the step was written to the state directory before it was sent)."""
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    campaign = Campaign.load(path)
    app_id = f"eo-{uuid.uuid4().hex[:6]}"
    topic = Topics.with_prefix(f"{app_id}.").reports
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    state = tmp_path / "fleet-state"
    devices, batch = 20_000, 6_000  # 4 batches per attribute (the last one short)

    def config() -> FleetConfig:  # private mode
        return FleetConfig(campaign, devices, 1, batch_size=batch, seed=None, state_dir=state)

    class Killed(Exception):
        pass

    def killed(t: int) -> None:
        raise Killed(f"killed after sending step {t}, before committing it")

    with _worker(local_stack, app_id, tmp_path, path) as w:
        first = Fleet(config())
        first.commit = killed  # type: ignore[method-assign]
        with pytest.raises(Killed):
            asyncio.run(publish(first, boot, topic=topic, partitions=2))
        drawn = first.draw(0)  # what it sent (the drawn step, never drawn again)
        first.close()
        assert json.loads((state / "fleet.json").read_text())["next_step"] == 0
        second = Fleet(config())
        assert second.resumed and second.resent_step == 0 and second.next_step == 0
        assert second.producer_id == first.producer_id  # kept in the state directory
        second_summary = asyncio.run(publish(second, boot, topic=topic))
        second.close()
        assert second_summary.batches == 4 * len(campaign.attributes)

        expected = {(d.attribute, 0): (d.support, d.n) for d in drawn}
        assert set(second_summary.per_step) == set(expected)
        for key, rec in second_summary.per_step.items():
            assert np.array_equal(rec["support"], expected[key][0])  # the same reports were sent again
        wait_for_counts(redis_url, campaign.id, expected, timeout=30)
        for attr in campaign.attributes:
            wait_until(lambda: _duplicates(_metrics(w), campaign.id, attr), lambda v: v == 4, 20,
                  f"four batch-id duplicates of {attr}")
        # every re-sent batch was skipped: the counts are still exactly the first copy
        wait_for_counts(redis_url, campaign.id, expected, timeout=2)
        for attr in campaign.attributes:
            finals = wait_until(lambda: _finals(w, campaign.id, attr), lambda f: 0 in f, 20, f"a final of {attr}")
            assert finals[0]["n"] == devices
        # and the fleet committed step 0 with its producer id
        meta = json.loads((state / "fleet.json").read_text())
        assert meta["producer_id"] == first.producer_id and meta["next_step"] == 1


def test_fleet_without_state_dir_gets_a_fresh_producer_id() -> None:
    campaign = Campaign.load(CAMPAIGN)
    a, b = (Fleet(FleetConfig(campaign, 10, 1, seed=1)) for _ in range(2))
    assert a.producer_id != b.producer_id and len(a.producer_id) == 32
    assert a.batch_id(3, ATTR, 2) == f"{a.producer_id}:3:{ATTR}:2"
