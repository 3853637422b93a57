"""Fleet resumes that cannot diverge (issue 18): the state directory holds what a step drew before it is sent.

Unit level (no broker): a drawn step is re-sent byte for byte by a resumed private-mode fleet, its
group's sampling and its devices' keys included; a resume with another batch-shaping option is
refused naming it; one producer per state directory (an exclusive lock); an unreadable state file is
a :class:`FleetStateError` naming the file. Through the pipeline (a real broker, a worker counting into
a real Redis): ``ldp produce`` in private mode SIGKILLed at 20 random points and resumed (every count
exact, group sums exact, a re-sent batch byte-identical), a second producer and a changed
``--batch-size`` refused; broker errors retried or reported, never a step committed unacknowledged.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import fleet_children
from ldpstream_dev.workers import WorkerProcess, unique_campaign_file, wait_for_counts
from producers.fleet import Fleet, FleetConfig, FleetStateError, PublishError, _retriable, publish
from wire.campaign import Campaign
from wire.envelope import REPORTS, WATERMARK, decode_reports, parse
from wire.topics import Topics

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "deploy" / "campaigns" / "demo.toml"  # three attributes and an ALLOMFREE group of three


def _campaign() -> Campaign:
    return Campaign.load(DEMO)


def _config(state: Path | None, **kw) -> FleetConfig:
    base = dict(campaign=_campaign(), n_devices=3_000, steps=3, batch_size=700, state_dir=state)
    return FleetConfig(**{**base, **kw})


def _messages(fleet: Fleet, data) -> list[tuple[bytes, bytes]]:
    return [(key, blob) for d in data for key, blob, _ in fleet.messages(d)]


def _device_state(fleet: Fleet) -> dict[str, np.ndarray]:
    """Every array that decides a device's future reports: memo keys and marks, a group's sampling and memos."""
    out: dict[str, np.ndarray] = {}
    for name, st in fleet.states.items():
        if st is not None:
            out[f"{name}.keys"], out[f"{name}.seen"] = st.keys, st.seen
    for group, gst in fleet.group_states.items():
        out[f"{group}.sampled"], out[f"{group}.reported"] = gst.sampled, gst.reported
        for j, memo in enumerate(gst.memos):
            if memo is not None:
                out[f"{group}.{j}.keys"], out[f"{group}.{j}.seen"] = memo.keys, memo.seen
    for name, pop in fleet.populations.items():
        out[f"{name}.values"] = pop.values
    return out


# --------------------------------------------------------------------------- unit level
def test_private_fleet_resumed_mid_step_resends_identical_bytes(tmp_path):
    state = tmp_path / "state"
    first = Fleet(_config(state))
    assert not first.simulation and first.resent_step is None
    data = first.draw(0)                    # what publish does before the step's first batch
    sent = _messages(first, data)
    drawn = {k: v.copy() for k, v in _device_state(first).items()}
    meta = json.loads((state / "fleet.json").read_text())
    assert meta["pending"] and meta["next_step"] == 0 and meta["snapshot"] is None
    first.close()                           # the crash: some batches out, nothing committed

    second = Fleet(_config(state))
    assert second.resumed and second.resent_step == 0 and list(second.step_range) == [0, 1, 2]
    assert second.producer_id == first.producer_id
    again = second.draw(0)
    assert _messages(second, again) == sent  # same bytes, same batch ids, same order
    after = _device_state(second)
    assert set(after) == set(drawn)
    for name, arr in drawn.items():         # the state after step 0: group sampling, keys, memo marks, values
        assert np.array_equal(after[name], arr), name
    # ALLOMFREE: each device reports the one attribute it sampled; the three counts sum to the fleet
    group = [d for d in again if d.attribute in ("dark_mode", "country", "device_model")]
    assert sum(d.n for d in group) == 3_000
    assert [d.n for d in group] == list(np.bincount(after["device.sampled"], minlength=3))
    # the step is sent again, not drawn again, however often the fleet asks for it
    assert second.draw(0) is again
    with pytest.raises(FleetStateError, match="step 0 was drawn"):
        second.draw(1)
    second.commit(0)
    assert not list(state.glob("step-*/*.reports.npy"))  # acknowledged: its reports are not kept
    step1 = _messages(second, second.draw(1))
    assert not set(step1) & set(sent)
    second.close()

    # a fleet of new devices (another state directory) draws other keys and another sampling: the
    # comparisons above could fail
    other = Fleet(_config(tmp_path / "other"))
    other.draw(0)
    assert not np.array_equal(_device_state(other)["device.sampled"], drawn["device.sampled"])
    other.close()


def test_committed_step_resumes_at_the_next_with_the_same_devices(tmp_path):
    state = tmp_path / "state"
    with Fleet(_config(state)) as first:
        first.draw(0)
        first.commit(0)
        keys = {k: v.copy() for k, v in _device_state(first).items()}
    with Fleet(_config(state)) as second:
        assert second.resumed and second.resent_step is None and second.next_step == 1
        for name, arr in keys.items():
            assert np.array_equal(_device_state(second)[name], arr), name
    meta = json.loads((state / "fleet.json").read_text())
    assert meta["next_step"] == 1 and meta["pending"] is None and len(list(state.glob("step-*"))) == 1


@pytest.mark.parametrize("option, value, shown", [
    ("batch_size", 350, "--batch-size 700; this run has --batch-size 350"),
    ("dataset", "uniform", "--dataset syn; this run has --dataset uniform"),
    ("p_change", 0.5, "--p-change 0.25; this run has --p-change 0.5"),
    ("seed", 7, "--seed none (private mode); this run has --seed 7"),
    ("n_devices", 2_000, "--devices 3000; this run has --devices 2000"),
])
def test_resume_with_another_batch_shaping_option_is_refused(tmp_path, option, value, shown):
    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.draw(0)
    with pytest.raises(FleetStateError, match=shown.replace("(", r"\(").replace(")", r"\)")):
        Fleet(_config(state, **{option: value}))
    with Fleet(_config(state)) as fleet:    # the refusal changed nothing
        assert fleet.resent_step == 0


def test_options_of_a_fleet_that_never_drew_may_change(tmp_path):
    state = tmp_path / "state"
    Fleet(_config(state)).close()           # killed before drawing anything: nothing was sent
    with Fleet(_config(state, batch_size=350)) as fleet:
        assert not fleet.resumed
    assert json.loads((state / "fleet.json").read_text())["options"]["batch_size"] == 350


def test_one_producer_per_state_directory(tmp_path):
    state = tmp_path / "state"
    first = Fleet(_config(state))
    with pytest.raises(FleetStateError, match=rf"is in use by another producer \(pid {os.getpid()}\)"):
        Fleet(_config(state))
    first.close()
    Fleet(_config(state)).close()
    # another process holding it; the kernel releases the lock when that process is SIGKILLed
    code = ("import sys, time; from producers.fleet import Fleet, FleetConfig; from wire.campaign import Campaign; "
            f"f = Fleet(FleetConfig(Campaign.load({str(DEMO)!r}), 3000, 1, batch_size=700, state_dir={str(state)!r})); "
            "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(FleetStateError, match=rf"in use by another producer \(pid {proc.pid}\)"):
            Fleet(_config(state))
    finally:
        proc.kill()
        proc.wait()
    Fleet(_config(state)).close()


def _corrupt(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("target", ["app_version.memo.npz", "device.group.npz", "opt_in.values.npy",
                                    "country.reports.npy", "manifest.json", "fleet.json", "producer.json"])
def test_a_corrupt_state_file_is_a_clear_error(tmp_path, target):
    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.draw(0)
    snap = state / json.loads((state / "fleet.json").read_text())["pending"]
    path = state / target if target.endswith(".json") and target != "manifest.json" else snap / target
    _corrupt(path)
    with pytest.raises(FleetStateError) as info:
        Fleet(_config(state))
    text = str(info.value)
    assert str(path) in text and "another --state-dir" in text and "backup" in text, text


def test_a_pointer_to_the_wrong_step_is_refused(tmp_path):
    """A fleet.json that is intact (its checksum holds) but names a snapshot of another step."""
    from producers.fleet import _checked_json

    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.draw(0)
    meta = json.loads((state / "fleet.json").read_text())
    (state / "fleet.json").write_bytes(_checked_json({**meta, "next_step": 1}))
    with pytest.raises(FleetStateError, match="state after step 0, .*fleet.json says 1"):
        Fleet(_config(state))


@pytest.mark.parametrize("garbage", [b"PK\x03\x04 not a zip", b""])
def test_a_corrupt_legacy_state_file_is_a_clear_error(tmp_path, garbage):
    """A version-1 state (no checksums): the loaders' own errors (BadZipFile, ValueError) name the file."""
    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.step(0)
    meta = json.loads((state / "fleet.json").read_text())
    snap = state / meta["snapshot"]
    (snap / "manifest.json").unlink()
    legacy = {k: v for k, v in meta.items() if k not in ("options", "pending", "simulation", "sha256")}
    legacy.update(version=1, n_devices=3_000, dataset="syn", base="zipf", p_change=0.25, seed=None)
    (state / "fleet.json").write_text(json.dumps(legacy))
    with Fleet(_config(state)) as fleet:    # an intact legacy state is resumed
        assert fleet.resumed and fleet.next_step == 1
    (snap / "device.group.npz").write_bytes(garbage)
    with pytest.raises(FleetStateError, match=str(snap / "device.group.npz")):
        Fleet(_config(state))


def test_broker_errors_that_are_retried():
    from aiokafka.errors import (KafkaConnectionError, MessageSizeTooLargeError, NotLeaderForPartitionError,
                                 TopicAuthorizationFailedError, UnknownError)

    assert _retriable(UnknownError()) and _retriable(KafkaConnectionError()) and _retriable(NotLeaderForPartitionError())
    assert not _retriable(MessageSizeTooLargeError()) and not _retriable(TopicAuthorizationFailedError())


# --------------------------------------------------------------------------- through the pipeline
def _read_topic(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of every record of ``topic``, partition by partition in offset order."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def read() -> list[tuple[bytes, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            assert topic in await consumer.topics()  # (fetches the metadata)
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            assert tps, f"topic {topic} has no partitions"
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            out: dict[int, list] = defaultdict(list)
            deadline = time.monotonic() + 30
            while any([await consumer.position(tp) < end[tp] for tp in tps]):
                assert time.monotonic() < deadline, "reading the topic back timed out"
                for tp, recs in (await consumer.getmany(*tps, timeout_ms=500)).items():
                    out[tp.partition].extend((r.key, r.value) for r in recs)
            return [kv for p in sorted(out) for kv in out[p]]
        finally:
            await consumer.stop()
    return asyncio.run(read())


def _sent(campaign: Campaign, records: list[tuple[bytes, bytes]]) -> tuple[dict, dict, int]:
    """What the topic holds: ``(attr, t) -> (support, n)`` over distinct batch ids, the watermarks per
    ``(attr, t)``, and how many batch ids were sent more than once. Asserts that every copy of a batch id has
    the same bytes (a re-sent batch is the same randomization, not a second one) and that each step's batches
    are indices ``0..m-1`` of ``batch_size`` reports (the last one shorter)."""
    copies: dict[str, set[bytes]] = defaultdict(set)
    sends: dict[str, int] = defaultdict(int)
    marks: dict[tuple[str, int], int] = defaultdict(int)
    for _, blob in records:
        env = parse(blob)
        if env.kind == WATERMARK:
            marks[(env.attribute, env.t)] += 1
        else:
            assert env.kind == REPORTS
            copies[env.batch_id].add(blob)
            sends[env.batch_id] += 1
    differing = [bid for bid, blobs in copies.items() if len(blobs) > 1]
    assert not differing, f"{len(differing)} batch ids were sent with different reports, e.g. {differing[0]}"
    per_step: dict[tuple[str, int], dict[int, tuple[np.ndarray, int]]] = defaultdict(dict)
    for bid, (blob,) in copies.items():
        env = parse(blob)
        proto = campaign.attribute(env.attribute).protocol
        per_step[(env.attribute, env.t)][int(bid.rsplit(":", 1)[1])] = (proto.support(decode_reports(env, campaign)),
                                                                         env.count)
    out = {}
    for key, batches in per_step.items():
        assert sorted(batches) == list(range(len(batches))), (key, sorted(batches))
        sizes = [batches[i][1] for i in range(len(batches))]
        assert all(size == sizes[0] for size in sizes[:-1]) and sizes[-1] <= sizes[0], (key, sizes)
        out[key] = (np.sum([b[0] for b in batches.values()], axis=0), int(sum(sizes)))
    return out, dict(marks), sum(1 for n in sends.values() if n > 1)


@contextlib.contextmanager
def _killing(children: list[multiprocessing.Process]) -> Iterator[None]:
    """On the way out (a failed assertion included), SIGKILL every child still running."""
    try:
        yield
    finally:
        for proc in children:
            if proc.is_alive():
                proc.kill()
                proc.join()


def _ldp_produce(argv: list[str]) -> subprocess.CompletedProcess:
    """``python -m ldpstream_cli produce ...`` as a fresh process (how an operator runs it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH")) if x),
           "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "ldpstream_cli", "produce", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_private_fleet_sigkilled_at_20_points_counts_exact(local_stack, tmp_path):
    """Issue 18, acceptance 3: a private-mode ``ldp produce`` SIGKILLed at 20 random points and resumed from
    its state directory each time; a real worker counts into Redis. Every (attribute, step) count exact, the
    ALLOMFREE group's counts sum to the fleet every step (each device's sampled attribute, for its life), a
    batch sent twice has the same bytes; a second producer on the directory and a changed --batch-size refused.

    The 20 runs are children of a multiprocessing forkserver that imported the CLI once (``fleet_children``: a
    fresh interpreter spends about 2 s starting): each runs the ``ldp produce`` command in-process with its
    arguments. The batch-size refusal runs ``python -m ldpstream_cli produce`` itself. Kill ``i`` waits until the run holds the state
    directory and a step at or after ``i * (STEPS - 2) // 20`` is drawn (fleet.json points to it, pending), then a
    seeded random part of a step's sending time (a kill may still land in a commit or the next draw: the test
    process is not scheduled at once on a busy machine)."""
    steps, devices, batch, rate = 10, 2_000, 250, 20_000.0  # 8,000 reports a step: 0.4 s each at that rate
    cfile = unique_campaign_file(DEMO, tmp_path, every_step=True)  # every step compared with its truth
    campaign = Campaign.load(cfile)
    app_id = f"fr-{uuid.uuid4().hex[:6]}"
    prefix = f"{app_id}."
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    state = tmp_path / "state"
    log = tmp_path / "produce.log"
    rng = random.Random(18)

    def argv(remaining: int, *extra: str) -> list[str]:
        return ["--campaign", str(cfile), "--kafka", boot, "--devices", str(devices), "--steps", str(remaining),
                "--batch-size", str(batch), "--state-dir", str(state), "--topic-prefix", prefix,
                "--partitions", "2", *extra]

    def meta() -> dict:
        try:
            return json.loads((state / "fleet.json").read_text())
        except (OSError, ValueError):  # not yet written (atomic replace: never half written)
            return {}

    def committed() -> int:
        return int(meta().get("next_step", 0))

    def holder() -> int | None:
        """The pid that holds the state directory's lock (written once it holds it)."""
        try:
            return int((state / "fleet.lock").read_text())
        except (OSError, ValueError):
            return None

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["fleet_children"])

    children: list[multiprocessing.Process] = []

    def start(rate_: float = rate, to: Path = log) -> multiprocessing.Process:
        proc = ctx.Process(target=fleet_children.run_cli, args=(["produce", *argv(steps - committed(), "--rate", str(rate_))],
                                                  str(to)))
        proc.start()
        children.append(proc)
        return proc

    worker = WorkerProcess([cfile], boot, redis_url, app_id=app_id, topic_prefix=prefix, partitions=2,
                           refresh_seconds=0.5, session_timeout=3.0, run_dir=tmp_path)
    with worker, _killing(children):
        kills, landed, second_producer, batch_refused, holder_pid = 0, [], None, None, None
        for i in range(20):
            target = i * (steps - 2) // 20  # two steps more: a killed run never ends the fleet
            assert committed() < steps, f"the fleet finished after {kills} kills"
            slow = i == 5  # the run a second producer meets: slow enough to be running then
            # a fleet ahead of the kill schedule (a busy machine let a run draw more than one step before its kill)
            # resumes ten times slower, so that the later kills still land before its last step
            ahead = committed() > target
            proc = start(rate_=rate / 20 if slow else rate / 10 if ahead else rate)
            deadline = time.monotonic() + 30
            while not (holder() == proc.pid and (slow or ((m := meta()).get("pending") and m["next_step"] >= target))):
                assert proc.is_alive(), f"ldp produce exited {proc.exitcode}: {log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"step {target} never drawn: {log.read_text()[-3000:]}"
                time.sleep(0.005)
            if slow:  # a second producer on the directory while this one runs
                holder_pid = proc.pid
                second = start(to=tmp_path / "second.log")
                second.join(30)
                second_producer = (second.exitcode, (tmp_path / "second.log").read_text())
            time.sleep(rng.uniform(0.0, 8_000 / rate))
            assert proc.is_alive(), f"ldp produce ended before kill {i + 1}: {log.read_text()[-3000:]}"
            proc.kill()
            proc.join()
            kills += 1
            m = meta()
            landed.append((m.get("next_step"), bool(m.get("pending"))))
            if i == 10:  # the fleet has drawn steps: a resume with another batch size is refused
                res = _ldp_produce(argv(steps, "--batch-size", str(batch + 50)))
                batch_refused = (res.returncode, res.stdout + res.stderr)
        final = start()
        final.join(60)
        assert final.exitcode == 0, log.read_text()[-3000:]
        assert committed() == steps and meta()["pending"] is None

        # the refusals: a clear error (exit 2), no traceback
        for res, needle in ((second_producer, f"is in use by another producer (pid {holder_pid})"),
                            (batch_refused, f"--batch-size {batch}; this run has --batch-size {batch + 50}")):
            assert res is not None and res[0] == 2, res
            text = " ".join(res[1].split())
            assert needle in text and "Traceback" not in text, text
        # kills landed in the middle of drawn steps (sent in part, then again)
        assert kills == 20 and sum(pending for _, pending in landed) >= 10, landed

        records = _read_topic(boot, Topics.with_prefix(prefix).reports)
        sent, marks, resent = _sent(campaign, records)
        assert resent > 0, "no batch was ever sent twice: the kills did not interrupt a step"
        keys = {(a, t) for a in campaign.attributes for t in range(steps)}
        assert set(sent) == keys and set(marks) == keys
        wait_for_counts(redis_url, campaign.id, sent, timeout=60)  # Redis holds exactly the distinct batches
        group = campaign.groups["device"].attributes
        with Fleet(FleetConfig(campaign, devices, 0, batch_size=batch, state_dir=state)) as fleet:
            sampled = np.bincount(fleet.group_states["device"].sampled, minlength=len(group))
        for t in range(steps):
            for attr in campaign.ungrouped:
                assert sent[(attr, t)][1] == devices, (attr, t)
            # each device reports the attribute it sampled for its life: the committed sampling, every step
            assert [sent[(attr, t)][1] for attr in group] == list(sampled), t
            assert sum(sent[(attr, t)][1] for attr in group) == devices


def _flaky_sends(monkeypatch, errors: dict[int, Exception]) -> list[int]:
    """The broker answers the ``n``-th send of the run (1-based) with ``errors[n]`` instead of storing it (as
    tansu answers a produce request with error -1 while its storage fails); every other send goes to the real
    broker. Returns the list of send numbers so far (its length)."""
    from aiokafka import AIOKafkaProducer

    real = AIOKafkaProducer.send
    calls: list[int] = []

    async def send(self, topic, value=None, key=None, *args, **kwargs):
        calls.append(len(calls) + 1)
        exc = errors.get(len(calls))
        if exc is None:
            return await real(self, topic, value, key, *args, **kwargs)
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(exc)
        return fut

    monkeypatch.setattr(AIOKafkaProducer, "send", send)
    return calls


def test_broker_unknown_error_is_retried_and_a_refusal_commits_nothing_unacknowledged(local_stack, tmp_path,
                                                                                      monkeypatch):
    from aiokafka.errors import MessageSizeTooLargeError, UnknownError

    campaign = _campaign()
    boot = local_stack.info.kafka_bootstrap
    # 3,000 devices, batches of 700: 5 per own attribute, about 2 per group attribute, and a watermark each
    own = len(campaign.ungrouped)
    per_step = own * 5 + (len(campaign.attributes) - own) * 2 + len(campaign.attributes)
    # UnknownError (twice) in the middle of step 1: retried, the step sent again from its first unacknowledged
    # message, the same bytes
    topic = f"fr-unknown-{uuid.uuid4().hex[:8]}"
    _flaky_sends(monkeypatch, {per_step + 4: UnknownError(), per_step + 5: UnknownError()})
    with Fleet(_config(tmp_path / "a")) as fleet:
        summary = asyncio.run(publish(fleet, boot, topic, partitions=2, retry_deadline=60))
    assert summary.outages == 1 and summary.resent > 0 and summary.steps == [0, 1, 2]
    sent, marks, _ = _sent(campaign, _read_topic(boot, topic))
    assert set(sent) == set(marks) == {(a, t) for a in campaign.attributes for t in range(3)}
    assert all(sent[key][1] == rec["n"] and np.array_equal(sent[key][0], rec["support"])
               for key, rec in summary.per_step.items())
    assert json.loads((tmp_path / "a" / "fleet.json").read_text())["next_step"] == 3

    # an error that sending again cannot cure, in step 1: a clear PublishError; step 0 committed, step 1 not
    # (drawn, to be sent again by the next run)
    topic = f"fr-refused-{uuid.uuid4().hex[:8]}"
    monkeypatch.undo()
    _flaky_sends(monkeypatch, {per_step + 4: MessageSizeTooLargeError()})
    with Fleet(_config(tmp_path / "b")) as fleet:
        with pytest.raises(PublishError, match="MessageSizeTooLarge.*cannot help"):
            asyncio.run(publish(fleet, boot, topic, partitions=2, retry_deadline=60))
    meta = json.loads((tmp_path / "b" / "fleet.json").read_text())
    assert meta["next_step"] == 1 and meta["pending"] and meta["last_step"] == 0
    monkeypatch.undo()
    with Fleet(_config(tmp_path / "b", steps=2)) as fleet:
        assert fleet.resent_step == 1
        asyncio.run(publish(fleet, boot, topic))
    sent, marks, _ = _sent(campaign, _read_topic(boot, topic))
    assert set(sent) == {(a, t) for a in campaign.attributes for t in range(3)}
