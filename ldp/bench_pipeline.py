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

from wire import envelope
from wire.campaign import Campaign
from wire.topics import Topics, message_key


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
            state = proto.new_state(m)  # device keys and noise from the OS CSPRNG, as on real devices
            blob = envelope.pack_reports(campaign, "x", t, proto.randomize(values, state=state))
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
                    futs.append(await producer.send(topic, blob, key=message_key(t, work.attribute)))
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


@dataclass
class PipelineResult:
    rate: float                    # reports/s, first send -> last final estimate
    latencies: list[float]         # per step: watermark sent -> final estimate received
    seconds: float

    @property
    def p95_latency(self) -> float:
        return float(np.percentile(self.latencies, 95)) if self.latencies else float("nan")


async def pipeline_rate(bootstrap: str, redis_url: str, work: Workload, topic_prefix: str, timeout: float = 300.0,
                        pace: float | None = None) -> PipelineResult:
    """Send the workload to ``{prefix}ldp.reports`` (a watermark after each step) and wait for
    every step's final estimate (polling the estimate history the workers write in Redis at the
    moment they publish it on ``ldp.estimates``); ``pace`` caps the send rate (reports/s) to
    measure latency under a sustained load rather than a saturated queue."""
    from aiokafka import AIOKafkaProducer

    from stream_app.store import CountStore

    reports_topic = Topics.with_prefix(topic_prefix).reports
    wanted = {envelope.parse(m).t for m in work.watermarks}
    max_bytes = max(len(b) for s in work.steps for b in s) + 1024
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=max(max_bytes, 1 << 20),
                                linger_ms=5)
    store = CountStore.from_url(redis_url)
    await producer.start()
    marks_sent: dict[int, float] = {}
    finals: dict[int, float] = {}
    sent_reports = [0]
    try:
        t0 = time.perf_counter()

        async def send() -> None:
            futs = []
            for batches, mark in zip(work.steps, work.watermarks):
                t = envelope.parse(mark).t
                key = message_key(t, work.attribute)
                for blob in batches:
                    futs.append(await producer.send(reports_topic, blob, key=key))
                    if pace:
                        sent_reports[0] += envelope.parse(blob).count
                        ahead = t0 + sent_reports[0] / pace - time.perf_counter()
                        if ahead > 0:
                            await asyncio.sleep(ahead)
                await asyncio.gather(*futs)
                futs = []
                await producer.send_and_wait(reports_topic, mark, key=key)
                marks_sent[t] = time.perf_counter()

        sender = asyncio.create_task(send())
        deadline = t0 + timeout
        while len(finals) < len(wanted):
            if time.perf_counter() > deadline:
                raise TimeoutError(f"only {len(finals)} of {len(wanted)} final estimates after {timeout} s")
            final_steps = await store.final_steps(work.campaign.id, work.attribute)
            now = time.perf_counter()
            for t in final_steps:
                if t in wanted and t not in finals:
                    finals[t] = now
            await asyncio.sleep(0.01)
        await sender
        end = max(finals.values())
        return PipelineResult(work.reports / (end - t0), [finals[t] - marks_sent[t] for t in sorted(finals)], end - t0)
    finally:
        await store.close()
        await producer.stop()


def run_bench(protocol: str, k: int, steps: int, reports_per_step: int, batch: int, workers: int = 1,
              on_status=print, latency_load: float = 0.5, **params) -> dict:
    """Stack up, workers up, warm-up step, then raw broker and pipeline on the same workload, then
    the latency of each step's final estimate under a sustained load of ``latency_load`` x the
    measured end-to-end rate (a saturated run only measures its own queue)."""
    import tempfile
    from pathlib import Path

    from devtools.stack import LocalStack
    from devtools.workers import WorkerProcess

    run = Path(tempfile.mkdtemp(prefix="ldp-bench-"))
    on_status(f"{protocol} k={k}: encoding {steps} x {reports_per_step:,} reports in batches of {batch:,}")
    work = make_workload(protocol, k, steps, reports_per_step, batch, **params)
    warm = make_workload(protocol, k, 1, batch, batch, seed=1, campaign_id=work.campaign.id, **params)
    camp_file = run / "bench.toml"
    _write_campaign(camp_file, work)
    with LocalStack(run_dir=run / "stack") as info:
        prefix = f"bench{uuid.uuid4().hex[:6]}."
        procs = [WorkerProcess([camp_file], info.kafka_bootstrap, info.redis_url, app_id=prefix.rstrip("."),
                               topic_prefix=prefix, refresh_seconds=0.05, session_timeout=3.0, run_dir=run,
                               name=f"w{i}").start() for i in range(workers)]
        try:
            for p in procs:
                p.wait_ready(timeout=120)
            on_status("warm-up step (numba compilation in the workers)")
            asyncio.run(pipeline_rate(info.kafka_bootstrap, info.redis_url, warm, prefix))
            work = _shift_steps(work, 1)
            on_status("raw broker: produce + consume the same bytes")
            raw = asyncio.run(raw_broker_rate(info.kafka_bootstrap, work))
            on_status("pipeline: produce -> workers -> Redis -> final estimates")
            res = asyncio.run(pipeline_rate(info.kafka_bootstrap, info.redis_url, work, prefix))
            pace = latency_load * res.rate
            on_status(f"latency: the same steps again, paced at {latency_load:.0%} of that rate ({pace / 1e6:.1f}M/s)")
            paced = asyncio.run(pipeline_rate(info.kafka_bootstrap, info.redis_url, _shift_steps(work, steps + 1), prefix,
                                              pace=pace))
        finally:
            for p in procs:
                p.stop()
    return {"protocol": protocol, "k": k, "reports": work.reports, "bytes": work.nbytes, "raw_rate": raw,
            "pipeline_rate": res.rate, "ratio": res.rate / raw, "saturated_p95_latency": res.p95_latency,
            "p95_latency": paced.p95_latency, "latencies": paced.latencies, "paced_rate": pace, "workers": workers}


def _write_campaign(path, work: Workload) -> None:
    """The workload's campaign as a TOML file for the worker processes."""
    src = work.campaign.source
    head, attrs = src["campaign"], src["attributes"]

    def val(v):
        return f'"{v}"' if isinstance(v, str) else repr(v)
    lines = ["[campaign]"] + [f"{k} = {val(v)}" for k, v in head.items()]
    for a in attrs:
        lines += ["", "[[attributes]]"] + [f"{k} = {val(v)}" for k, v in a.items()]
    path.write_text("\n".join(lines) + "\n")


def _shift_steps(work: Workload, by: int) -> Workload:
    """Re-encode the envelopes' time steps as ``t + by`` (after the warm-up step)."""
    steps, marks = [], []
    for t, batches in enumerate(work.steps):
        new = []
        for blob in batches:
            env = envelope.parse(blob)
            new.append(envelope.pack(env.campaign, env.attribute, env.protocol, env.fingerprint, t + by, env.count,
                                     bytes(env.payload)))
        steps.append(new)
        marks.append(envelope.pack_watermark(work.campaign, work.attribute, t + by))
    return Workload(work.campaign, work.attribute, steps, marks, work.reports, work.nbytes)
