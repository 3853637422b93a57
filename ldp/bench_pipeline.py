"""`ldp bench pipeline`: end-to-end reports/s and estimate latency, next to the raw broker.

Both measurements use the same pre-encoded envelopes (same bytes, same batch sizes):

* **raw broker**: produce the envelopes to a scratch topic (acks=all) while one consumer reads
  them back; no processing. Rate = reports / (first send → last message consumed).
* **pipeline**: produce them to ``ldp.reports`` for a campaign with one attribute, followed by a
  watermark per step; the stream-app workers decode, count into Redis and finalize each step.
  Rate = reports / (first send → final estimate of the last step available); latency of a step =
  its watermark sent → its final estimate published (the watermark follows the step's last batch).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import numpy as np

from estimators import envelope
from estimators.campaign import Campaign


@dataclass
class Workload:
    campaign: Campaign
    attribute: str
    steps: list[list[bytes]]       # per step, the batch envelopes
    watermarks: list[bytes]        # per step
    reports: int
    nbytes: int


def make_workload(protocol: str, k: int, steps: int, reports_per_step: int, batch: int, seed: int = 0,
                  campaign_id: str | None = None, **params) -> Workload:
    """Randomize ``steps x reports_per_step`` reports (fresh devices) and encode them as envelopes."""
    cid = campaign_id or f"bench-{uuid.uuid4().hex[:8]}"
    attr = {"name": "x", "k": k, "protocol": protocol, **params}
    campaign = Campaign.from_dict({"campaign": {"id": cid, "time_step_seconds": 3600.0, "lateness_seconds": 3600.0,
                                                "max_batch_reports": max(batch, 1)},
                                   "attributes": [attr]})
    proto = campaign.attribute("x").protocol
    rng = np.random.default_rng(seed)
    out, marks, nbytes = [], [], 0
    for t in range(steps):
        batches = []
        for lo in range(0, reports_per_step, batch):
            m = min(batch, reports_per_step - lo)
            values = rng.integers(0, k, m)
            state = proto.new_state(m, rng=rng)
            blob = envelope.pack_reports(campaign, "x", t, proto.randomize(values, rng, state=state))
            nbytes += len(blob)
            batches.append(blob)
        out.append(batches)
        marks.append(envelope.pack_watermark(campaign, "x", t))
    return Workload(campaign, "x", out, marks, steps * reports_per_step, nbytes)


async def raw_broker_rate(bootstrap: str, work: Workload, partitions: int = 4) -> float:
    """Reports/s of produce (acks=all) + consume of the workload's bytes through the broker alone."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    topic = f"bench.raw.{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    total = sum(len(s) for s in work.steps)
    max_bytes = max(len(b) for s in work.steps for b in s) + 1024
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=max(max_bytes, 1 << 20),
                                linger_ms=5)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_bytes=64 << 20,
                                max_partition_fetch_bytes=max(max_bytes, 1 << 20) * 4)
    await producer.start()
    await consumer.start()
    try:
        got = 0
        t0 = time.perf_counter()

        async def send() -> None:
            futs = []
            for t, batches in enumerate(work.steps):
                for blob in batches:
                    futs.append(await producer.send(topic, blob, key=f"{t}:x".encode()))
            await asyncio.gather(*futs)

        sender = asyncio.create_task(send())
        while got < total:
            recs = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            got += sum(len(v) for v in recs.values())
        elapsed = time.perf_counter() - t0
        await sender
        return work.reports / elapsed
    finally:
        await consumer.stop()
        await producer.stop()
