"""`ldp bench pipeline`: end-to-end reports/s with 1, 2, 4, ... workers and estimate latency, next to the raw broker.

Both measurements use the same pre-encoded envelopes (same bytes, same batch sizes):

* **raw broker**: produce the envelopes to a scratch topic (acks=all) while one consumer reads
  them back; no processing. Rate = reports / (first send → last message consumed).
* **pipeline**: produce them to ``ldp.reports`` for a campaign with one attribute, followed by a
  watermark per step; the stream-app workers decode, count into Redis and finalize each step.
  Rate = reports / (first send → final estimate of the last step available); latency of a step =
  its watermark sent → its final estimate published (the watermark follows the step's last batch).

The batches of a step share one key, hence one partition; the steps of a run are numbered so that
they take the partitions in turn (:func:`spread_steps`), so every worker of a balanced group gets
its share. :func:`run_scaling` measures one protocol with 1, 2, 4, ... workers on one stack: one
consumer group per row, settled (every worker owns partitions) and warm before any clock starts,
the rows measured in turns while the other groups are frozen.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator

import numpy as np

from wire import envelope
from wire.campaign import Campaign
from wire.topics import Topics, message_key
from wire.transport import kafka_client_options


@dataclass
class Workload:
    campaign: Campaign
    attribute: str
    steps: list[list[bytes]]       # per step, the batch envelopes
    watermarks: list[bytes]        # per step
    reports: int
    nbytes: int


#: the metric range of a numeric attribute's workload (values uniform on it)
NUMERIC_RANGE = (0.0, 100.0)


def is_numeric(protocol: str) -> bool:
    """Whether ``protocol`` names a numeric mechanism (:data:`estimators.numeric.MECHANISMS`): its workload is a
    ``type = "numeric"`` attribute on :data:`NUMERIC_RANGE`, not a categorical one of ``k`` values."""
    from estimators.numeric import MECHANISMS

    return protocol in MECHANISMS


def attribute_spec(protocol: str, k: int, **params) -> dict[str, Any]:
    """The campaign table of the workload's one attribute ``x``: a categorical attribute of ``k`` values with
    ``protocol``, or a numeric attribute with the mechanism ``protocol`` (:func:`is_numeric`; ``k`` unused)."""
    if is_numeric(protocol):
        return {"name": "x", "type": "numeric", "range": list(NUMERIC_RANGE), "mechanism": protocol, **params}
    return {"name": "x", "k": k, "protocol": protocol, **params}


def report_nbytes(protocol: str, k: int, **params) -> int:
    """Wire bytes of one report of the workload's attribute (:func:`attribute_spec`)."""
    from wire.campaign import Campaign

    camp = Campaign.from_dict({"campaign": {"id": "size", "time_step_seconds": 3600.0},
                               "attributes": [attribute_spec(protocol, k, **params)]})
    return camp.attribute("x").protocol.report_nbytes


def make_workload(protocol: str, k: int, steps: int, reports_per_step: int, batch: int, seed: int = 0,
                  campaign_id: str | None = None, **params) -> Workload:
    """Randomize ``steps x reports_per_step`` reports (fresh devices) and encode them as envelopes: values uniform
    on ``[0, k)``, or on :data:`NUMERIC_RANGE` for a numeric mechanism (:func:`attribute_spec`)."""
    cid = campaign_id or f"bench-{uuid.uuid4().hex[:8]}"
    attr = attribute_spec(protocol, k, **params)
    numeric = is_numeric(protocol)
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
            values = rng.uniform(*NUMERIC_RANGE, m) if numeric else rng.integers(0, k, m)
            state = proto.new_state(m)  # device keys and noise from the OS CSPRNG, as on real devices
            blob = envelope.pack_reports(campaign, "x", t, proto.randomize(values, state=state),
                                         batch_id=f"bench:{t}:{lo}")
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
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_client_options())
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    total = sum(len(s) for s in work.steps)
    max_bytes = max(len(b) for s in work.steps for b in s) + 1024
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=max(max_bytes, 1 << 20),
                                linger_ms=5, **kafka_client_options())
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, fetch_max_bytes=64 << 20,
                                max_partition_fetch_bytes=max(max_bytes, 1 << 20) * 4, **kafka_client_options())
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
                                linger_ms=5, **kafka_client_options())
    store = CountStore.from_url(redis_url)
    await producer.start()
    marks_sent: dict[int, float] = {}
    finals: dict[int, float] = {}
    sent_reports = [0]
    try:
        t0 = time.perf_counter()

        async def acknowledged(t: int, fut: Awaitable[Any]) -> None:
            await fut
            marks_sent[t] = time.perf_counter()

        async def send() -> None:
            # no wait between steps, as in the raw broker run: a step's watermark follows its batches in
            # their partition, and its clock starts when the broker acknowledged it
            futs: list[Awaitable[Any]] = []
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
                futs.append(asyncio.ensure_future(acknowledged(t, await producer.send(reports_topic, mark, key=key))))
            await asyncio.gather(*futs)

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
            await asyncio.sleep(0.02)
        await sender
        end = max(finals.values())
        return PipelineResult(work.reports / (end - t0), [finals[t] - marks_sent[t] for t in sorted(finals)], end - t0)
    finally:
        await store.close()
        await producer.stop()


@dataclass
class ScalingRow:
    """One worker count of the scaling run: one entry per measured run in each list."""
    workers: int
    rates: list[float] = field(default_factory=list)          # reports/s end to end
    saturated_p95: list[float] = field(default_factory=list)  # p95 latency inside the saturated run (s)
    owners: int = 0                                           # workers that owned partitions
    rebalanced: bool = False                                  # a kept run saw its group rebalance

    @property
    def rate(self) -> float:
        return float(np.median(self.rates))


def worker_counts(max_workers: int) -> list[int]:
    """1, 2, 4, ... below ``max_workers``, then ``max_workers``."""
    if max_workers < 1:
        raise ValueError(f"workers must be >= 1, got {max_workers}")
    counts, n = [], 1
    while n < max_workers:
        counts.append(n)
        n *= 2
    return counts + [max_workers]


def spread_steps(attribute: str, partitions: int, count: int, first_t: int) -> list[int]:
    """``count`` increasing steps ``>= first_t`` whose keys (``"{t}:{attr}"``, one partition per step) go
    to the partitions in turn, so every worker of a balanced group gets the same share of the steps."""
    from aiokafka.partitioner import DefaultPartitioner

    partitioner, all_p = DefaultPartitioner(), list(range(partitions))
    out, t = [], first_t
    while len(out) < count:
        if partitioner(message_key(t, attribute), all_p, all_p) == len(out) % partitions:
            out.append(t)
        t += 1
    return out


#: Consumer-group session of the benchmark's workers. A group stays frozen (SIGSTOP: no heartbeats) while
#: the other rows run, and must still be the same group when it resumes; tansu holds a first join for
#: about half of it (the rebalance timeout follows the session timeout), paid once, by all groups at once.
FROZEN_SESSION_TIMEOUT = 30.0
#: Runs of a row measured again after its group rebalanced during them (frozen for longer than the session).
REMEASURES = 2


class _Group:
    """The workers of one row: a consumer group of its own (own topics), frozen while not measured."""

    def __init__(self, procs: list[Any], prefix: str) -> None:
        self.procs, self.prefix = procs, prefix
        self.owned: list[list[int]] = []

    def signal(self, sig: int) -> None:
        for p in self.procs:
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(sig)

    def assignments(self) -> list[Any]:
        """The workers' ready files: rewritten at every assignment, so any change means a rebalance."""
        out = []
        for p in self.procs:
            try:
                out.append(p.ready_file.read_text())
            except OSError:
                out.append(None)
        return out

    @contextlib.contextmanager
    def thawed(self) -> Iterator[None]:
        """SIGCONT for the time of the block, SIGSTOP after it."""
        self.signal(signal.SIGCONT)
        try:
            yield
        finally:
            self.signal(signal.SIGSTOP)


def _stop_groups(groups: list[_Group], timeout: float = 20.0) -> None:
    """SIGCONT (a stopped process would only see the SIGTERM once continued) and SIGTERM to every worker at
    once, then wait for each (``WorkerProcess.stop``: SIGKILL after ``timeout``)."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        for group in groups:
            group.signal(sig)
    deadline = time.monotonic() + timeout
    for group in groups:
        for p in group.procs:
            if p.proc is not None:
                try:
                    p.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            p.stop(timeout=5.0)


def run_scaling(protocol: str, k: int, steps: int, reports_per_step: int, batch: int, max_workers: int = 1, *,
                partitions: int | None = None, runs: int = 3, latency_load: float | None = 0.5,
                on_status: Callable[[str], None] = print, **params: Any) -> dict[str, Any]:
    """The scaling run of one protocol on one local stack: the raw broker and the pipeline with 1, 2,
    4, ... ``max_workers`` workers (:func:`worker_counts`), each measured ``runs`` times, in turns.

    Every row is a consumer group of its own (own topics). All groups start first: their workers are
    ready, each group settled on a balanced assignment (``ldpstream_dev.workers.wait_for_balanced_group``:
    every worker owns partitions) and a warm-up step went through every partition; then they are
    frozen (SIGSTOP: no CPU). Each turn measures the raw broker, then every row once (ascending in
    even turns, descending in odd ones), thawing one group at a time for one run of the workload (new
    step numbers each time): the rows share the machine's load of that moment instead of each getting
    the load of its own minute. A run during which its group rebalanced (its workers' ready files
    changed) is measured again once the group settled. With ``latency_load``, the latency of each
    step's final estimate is measured last, with ``max_workers`` workers, under a sustained load of
    ``latency_load`` x their median rate (a saturated run only measures its own queue). The run
    directory (worker logs) is removed after a run that raised nothing."""
    import shutil
    import tempfile
    from pathlib import Path

    from ldpstream_dev.stack import LocalStack
    from ldpstream_dev.workers import WorkerProcess, wait_for_balanced_group

    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    counts = worker_counts(max_workers)
    parts = partitions or max(4, max_workers)
    run = Path(tempfile.mkdtemp(prefix="ldp-bench-"))
    on_status(f"{protocol} k={k}: encoding {steps} x {reports_per_step:,} reports in batches of {batch:,}")
    work = make_workload(protocol, k, steps, reports_per_step, batch, **params)
    warm = make_workload(protocol, k, parts, batch, batch, seed=1, campaign_id=work.campaign.id, **params)
    camp_file = run / "bench.toml"
    _write_campaign(camp_file, work)
    rows = {n: ScalingRow(n) for n in counts}
    raw: list[float] = []
    groups: dict[int, _Group] = {}
    next_t = [0]

    def fresh(w: Workload, count: int) -> Workload:  # new step numbers: new Redis keys, spread over partitions
        ts = spread_steps(w.attribute, parts, count, next_t[0])
        next_t[0] = ts[-1] + 1
        return retime(w, ts)

    def measure(n: int, info: Any, pace: float | None = None) -> PipelineResult:
        """One run of row ``n`` with its group thawed; again if the group rebalanced meanwhile."""
        group = groups[n]
        for attempt in range(REMEASURES + 1):
            with group.thawed():
                before = group.assignments()
                res = asyncio.run(pipeline_rate(info.kafka_bootstrap, info.redis_url, fresh(work, steps),
                                                group.prefix, pace=pace))
                if group.assignments() == before:
                    return res
                on_status(f"{protocol} {n} worker(s): the group rebalanced during the run; measuring again")
                group.owned = wait_for_balanced_group(group.procs, parts)
        rows[n].rebalanced = True  # rebalanced during every attempt: the last one is kept, the row is marked
        return res

    paced: PipelineResult | None = None
    stack = LocalStack(run_dir=run / "stack")
    with stack as info:
        try:
            for n in counts:
                prefix = f"bench{uuid.uuid4().hex[:6]}."
                groups[n] = _Group([WorkerProcess([camp_file], info.kafka_bootstrap, info.redis_url,
                                                  app_id=prefix.rstrip("."), topic_prefix=prefix, partitions=parts,
                                                  session_timeout=FROZEN_SESSION_TIMEOUT, run_dir=run,
                                                  name=f"{prefix}w{i}").start() for i in range(n)], prefix)
            on_status(f"{protocol}: {sum(counts)} workers in {len(counts)} groups starting (the first join of a "
                      f"group takes about {FROZEN_SESSION_TIMEOUT / 2:g} s)")
            for n in counts:
                group = groups[n]
                for p in group.procs:
                    p.wait_ready(timeout=180)
                group.owned = wait_for_balanced_group(group.procs, parts, timeout=180)
                rows[n].owners = sum(1 for a in group.owned if a)
                asyncio.run(pipeline_rate(info.kafka_bootstrap, info.redis_url, fresh(warm, parts), group.prefix))
                on_status(f"{protocol} {n} worker(s) ready and warm, partitions {group.owned}")
            for group in groups.values():
                group.signal(signal.SIGSTOP)
            for r in range(runs):
                raw.append(asyncio.run(raw_broker_rate(info.kafka_bootstrap, work, partitions=parts)))
                line = [f"raw broker {raw[-1] / 1e6:.1f}M"]
                for n in (counts if r % 2 == 0 else counts[::-1]):
                    res = measure(n, info)
                    rows[n].rates.append(res.rate)
                    rows[n].saturated_p95.append(res.p95_latency)
                    line.append(f"{n} worker(s) {res.rate / 1e6:.1f}M")
                on_status(f"{protocol} run {r + 1}/{runs}, reports/s: " + ", ".join(line))
            if latency_load:
                pace = latency_load * rows[max_workers].rate
                on_status(f"{protocol} latency with {max_workers} worker(s): the same steps again, paced at "
                          f"{latency_load:.0%} of their rate ({pace / 1e6:.1f}M/s)")
                paced = measure(max_workers, info, pace=pace)
        finally:
            _stop_groups(list(groups.values()))
    shutil.rmtree(run, ignore_errors=True)
    top, raw_rate = rows[max_workers], float(np.median(raw))
    return {"protocol": protocol, "k": k, "reports": work.reports, "bytes": work.nbytes, "partitions": parts,
            "broker_storage": stack.broker_storage, "runs": runs, "rows": [rows[n] for n in counts],
            "raw_rates": raw, "raw_rate": raw_rate, "pipeline_rate": top.rate, "ratio": top.rate / raw_rate,
            "workers": max_workers, "saturated_p95_latency": float(np.median(top.saturated_p95)),
            "p95_latency": paced.p95_latency if paced else float("nan"),
            "latencies": paced.latencies if paced else [], "paced_rate": latency_load * top.rate if paced else None}


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


def retime(work: Workload, ts: list[int]) -> Workload:
    """The workload with its step ``i`` re-encoded as step ``ts[i]`` (same payloads and counts)."""
    steps, marks = [], []
    for t, batches in zip(ts, work.steps):
        new = []
        for blob in batches:
            env = envelope.parse(blob)
            new.append(envelope.pack(env.campaign, env.attribute, env.protocol, env.fingerprint, t, env.count,
                                     bytes(env.payload), batch_id=f"{env.batch_id}@{t}"))
        steps.append(new)
        marks.append(envelope.pack_watermark(work.campaign, work.attribute, t))
    return Workload(work.campaign, work.attribute, steps, marks, work.reports, work.nbytes)
