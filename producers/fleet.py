"""A simulated device fleet and its Kafka publisher.

One :class:`Fleet` simulates ``n_devices`` devices of one campaign in a single process: per
attribute, one vectorized :class:`~producers.datasets.EvolvingPopulation` (the devices' true
values) and one :class:`~estimators.MemoState` (row ``i`` = device ``i``'s memo). A step
randomizes every device's value of every attribute with the protocol's numba kernel.

:func:`publish` sends each step to Kafka: per ``(t, attribute)`` the reports are cut into
batches of ``batch_size`` (one batch envelope = one Kafka message, key
:func:`wire.topics.message_key`), followed by a watermark envelope with the same key, hence in
the same partition and after the batches. Sends are pipelined (a bounded window of un-acked
futures, ``acks="all"``); an ``on_step`` hook runs once each step is acknowledged (the demo
paces its steps and draws its live view there). A broker outage is waited out and the
unacknowledged messages are sent again, unchanged (:func:`publish`, ``retry_deadline``).

Randomness: by default (``seed=None``) the fleet is private like real devices: memo keys and
the noise of every batch are 256-bit keys from the OS CSPRNG (:mod:`estimators.randomness`);
only the simulated true values come from a generator (seeded by a random population seed kept
in the state directory, so a resumed fleet's values continue). With an integer ``seed`` the
fleet runs in the labelled *simulation mode*: every draw comes from a generator seeded by
``(seed, attribute, purpose, t)``, so a fleet is a pure function of its config and a fleet
resumed from ``state_dir`` continues exactly as the uninterrupted one would have (same values,
same memo keys, same reports) -- and anyone who knows the seed can re-derive every report, so
it is for tests and benchmarks only (:attr:`Fleet.simulation` says which mode is on).

State directory layout (``state_dir``)::

    fleet.json              # committed pointer: campaign, fingerprint, n_devices, next_step, snapshot,
                            #   producer_id
    producer.json           # the producer id, written when the fleet is first created (before any commit)
    step-000004/            # the snapshot after step 4: one file pair per attribute
        <attr>.memo.npz     #   MemoState.save (keys + memoized bitset)
        <attr>.values.npy   #   the population's current values (Syn evolution continues)

A snapshot is written to a temporary directory, fsynced, renamed, and only then made current
by atomically replacing ``fleet.json``; a crash at any point leaves the previous snapshot
current and intact.

Exactly-once: every batch envelope carries a stable batch id ``<producer>:<t>:<attribute>:<index>``
(:meth:`Fleet.batch_id`; ``index`` is the batch's position in the step, the batching being
deterministic). The producer id (:attr:`Fleet.producer_id`, 128 random bits in hex) is made once
and kept in the state directory, so a fleet killed after sending (part of) a step and resumed
re-sends that step under the same ids and the count store skips what it already applied; a
fleet without a state directory gets a fresh id.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from estimators import MemoState
from estimators.base import FrequencyProtocol, uint_dtype
from estimators.errors import LDPError
from estimators.fileio import atomic_write, fsync_dir
from wire.campaign import Campaign
from wire.envelope import pack_reports, pack_watermark
from wire.topics import REPORTS_TOPIC, message_key
from wire.transport import kafka_client_options

from .datasets import KINDS, EvolvingPopulation

__all__ = ["FleetConfig", "Fleet", "StepData", "FleetSummary", "Progress", "FleetStateError", "PublishError",
           "publish", "publish_sync", "ensure_topic"]

_STATE_FORMAT = "ldp-stream/fleet-state"
_PRODUCER_FILE = "producer.json"
_STATE_VERSION = 1
_ENVELOPE_OVERHEAD = 1024  # envelope header + names, generous

log = logging.getLogger(__name__)

#: Backoff of the publisher while the broker is unavailable: first wait and cap (s).
_RETRY_FIRST, _RETRY_MAX = 0.5, 10.0

# purposes of the derived generators
_POPULATION, _KEYS, _EVOLVE, _RANDOMIZE, _GROUP = 0, 1, 2, 3, 4


class FleetStateError(LDPError):
    """A fleet state directory that cannot be resumed with this configuration."""


class PublishError(LDPError):
    """The broker cannot be reached or refused the fleet's batches."""


@dataclass
class FleetConfig:
    """What to simulate and how fast to send it.

    ``first_step=None`` starts after the last step persisted in ``state_dir`` (or at 0);
    ``rate`` is a target in reports per second (``None``: as fast as possible).
    """

    campaign: Campaign
    n_devices: int
    steps: int
    dataset: str = "syn"
    p_change: float = 0.25
    base: str = "zipf"
    batch_size: int = 50_000
    rate: float | None = None
    seed: int | None = None
    state_dir: Path | None = None
    first_step: int | None = None
    zipf_s: float = 1.1

    def __post_init__(self) -> None:
        if self.n_devices < 1:
            raise ValueError(f"n_devices must be >= 1, got {self.n_devices}")
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        if self.dataset not in KINDS:
            raise ValueError(f"unknown dataset {self.dataset!r}; choose one of {', '.join(KINDS)}")
        if self.base not in ("uniform", "zipf"):
            raise ValueError(f"base must be 'uniform' or 'zipf', got {self.base!r}")
        if not 1 <= self.batch_size <= self.campaign.max_batch_reports:
            raise ValueError(f"batch_size must lie in [1, max_batch_reports={self.campaign.max_batch_reports}], "
                             f"got {self.batch_size}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0 reports/s (or None), got {self.rate}")
        if self.first_step is not None and self.first_step < 0:
            raise ValueError(f"first_step must be >= 0, got {self.first_step}")
        if self.state_dir is not None:
            self.state_dir = Path(self.state_dir)


@dataclass
class StepData:
    """One attribute of one simulated time step."""

    attribute: str
    t: int
    values: np.ndarray            # true values int64 (n,)
    reports: np.ndarray           # randomized reports (n, ...) of the protocol's report dtype
    true_frequencies: np.ndarray  # float (domain_size,)
    support: np.ndarray           # proto.support(reports), int64 (support_size,)
    n: int


@dataclass
class Progress:
    """Passed to ``on_progress`` after every batch (and once per finished step)."""

    t: int
    attribute: str
    step_index: int         # 0-based index of t among the steps to send
    steps: int              # number of steps to send
    reports_sent: int       # so far, all steps
    reports_total: int      # n_devices * attributes * steps
    batches: int
    bytes_sent: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.reports_sent / self.seconds if self.seconds > 0 else 0.0


@dataclass
class FleetSummary:
    """What :func:`publish` sent; ``per_step[(attr, t)] = {"n", "support", "true_frequencies"}``."""

    reports_sent: int
    batches: int
    watermarks: int
    bytes_sent: int
    seconds: float
    rate: float
    steps: list[int] = field(default_factory=list)
    per_step: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    outages: int = 0  # broker outages survived (each ended by the broker answering again)
    resent: int = 0   # messages sent again after an outage (the store skips what it already applied)

    @property
    def mb_per_s(self) -> float:
        return self.bytes_sent / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        """Human-readable summary lines (for the CLI)."""
        return [f"reports sent : {self.reports_sent:,}",
                f"batches      : {self.batches:,} (+{self.watermarks:,} watermarks)",
                f"bytes        : {self.bytes_sent / 1e6:,.1f} MB",
                f"time         : {self.seconds:,.2f} s",
                f"rate         : {self.rate:,.0f} reports/s, {self.mb_per_s:,.1f} MB/s"] + (
                [f"outages      : {self.outages} survived ({self.resent:,} messages sent again)"]
                if self.outages else [])


# --------------------------------------------------------------------------- helpers
def _attr_tag(name: str) -> int:
    """Stable per-attribute seed component (does not depend on attribute order)."""
    return zlib.crc32(name.encode())


def true_frequencies(proto: FrequencyProtocol, values: np.ndarray) -> np.ndarray:
    """Histogram of true values over the protocol's estimated domain (buckets for dBitFlipPM)."""
    v = values
    if proto.domain_size != proto.k and hasattr(proto, "bucket"):
        v = proto.bucket(values)
    return np.bincount(v, minlength=proto.domain_size).astype(np.float64) / max(len(v), 1)


# --------------------------------------------------------------------------- the fleet
class Fleet:
    """``n_devices`` simulated devices of one campaign (all attributes, vectorized)."""

    def __init__(self, config: FleetConfig) -> None:
        self.config = config
        self.campaign = config.campaign
        self.attributes: list[str] = list(self.campaign.attributes)
        # what is randomized together: an attribute with its own protocol, or a group's solution (its attributes
        # are randomized by one call, each device's budget spent once over the group)
        self.units: list[str] = self.campaign.ungrouped + list(self.campaign.groups)
        self.populations: dict[str, EvolvingPopulation] = {}
        self.states: dict[str, MemoState | None] = {}  # ungrouped attributes
        self.group_states: dict[str, Any] = {}  # group -> the solution's MultiState
        n = config.n_devices
        self.population_seed = config.seed if config.seed is not None else secrets.randbits(63)
        for name in self.attributes:
            proto = self.proto(name)
            tag = _attr_tag(name)
            self.populations[name] = EvolvingPopulation(
                n, proto.k, kind=config.dataset, p_change=config.p_change, base=config.base,  # type: ignore[arg-type]
                zipf_s=config.zipf_s, rng=np.random.default_rng([self.population_seed, tag, _POPULATION]))
            if self.campaign.attributes[name].group is None:
                self.states[name] = proto.new_state(n, rng=self._device_rng(tag, _KEYS))
        for g in self.campaign.groups.values():
            self.group_states[g.name] = g.solution.new_state(n, rng=self._device_rng(_attr_tag(g.name), _GROUP, _KEYS))
        self.resumed = False
        self.next_step = 0
        self.producer_id = os.urandom(16).hex()  # 128 random bits (not the device-key entropy path)
        if config.state_dir is not None:
            self.resumed = self._load()
            self._keep_producer_id()
        if config.first_step is not None:
            self.next_step = config.first_step

    # ------------------------------------------------------------------ basics
    def batch_id(self, t: int, attribute: str, index: int) -> str:
        """The stable id of batch ``index`` (0-based position in the step) of ``attribute`` at step ``t``."""
        bid = f"{self.producer_id}:{t}:{attribute}:{index}"
        if len(bid.encode()) > 255:  # the envelope carries at most 255 bytes: shorten a very long name
            tag = hashlib.sha256(attribute.encode()).hexdigest()[:32]
            bid = f"{self.producer_id}:{t}:#{tag}:{index}"
        return bid

    def _keep_producer_id(self) -> None:
        """Persist the producer id in the state directory before anything is sent (a crash before the
        first commit must not change it)."""
        root = self.config.state_dir
        assert root is not None
        path = root / _PRODUCER_FILE
        if path.exists():
            return
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"producer_id": self.producer_id}).encode())

    @property
    def simulation(self) -> bool:
        """True in the seeded simulation mode (reproducible, not private)."""
        return self.config.seed is not None

    def _device_rng(self, *purpose: int) -> np.random.Generator | None:
        """The generator of a device-side draw: ``None`` (OS CSPRNG) unless in simulation mode."""
        return None if self.config.seed is None else np.random.default_rng([self.config.seed, *purpose])

    def proto(self, attribute: str) -> FrequencyProtocol:
        return self.campaign.attribute(attribute).protocol

    @property
    def n_devices(self) -> int:
        return self.config.n_devices

    @property
    def reports_per_device(self) -> int:
        """Reports a device sends per step: one per ungrouped attribute, and per group one (a solution that
        samples an attribute) or one per attribute (split budget, fake data)."""
        groups = self.campaign.groups.values()
        return len(self.campaign.ungrouped) + sum(1 if g.solution.layout == "sample" else g.solution.d for g in groups)

    @property
    def step_range(self) -> range:
        """The time steps a full run (:meth:`run`, :func:`publish`) covers."""
        return range(self.next_step, self.next_step + self.config.steps)

    def memoized_counts(self, attribute: str) -> np.ndarray | None:
        """Distinct memoized inputs per device (``None`` for memoryless protocols and grouped attributes)."""
        st = self.states.get(attribute)
        return None if st is None else st.memoized_count()

    def longitudinal_loss(self) -> np.ndarray:
        """Per-device worst-case longitudinal ε so far, summed over the ungrouped attributes (memo protocols)
        and the groups (each group's solution accounts for its attributes together)."""
        total = np.zeros(self.n_devices)
        for name, st in self.states.items():
            if st is not None:
                total += np.asarray(self.proto(name).longitudinal_loss(st.memoized_count()), dtype=np.float64)
        for g in self.campaign.groups.values():
            total += np.asarray(g.solution.longitudinal_loss(self.group_states[g.name]), dtype=np.float64)
        return total

    # ------------------------------------------------------------------ simulation
    def _values_at(self, name: str, t: int) -> np.ndarray:
        """Advance ``name``'s population to step ``t``: every device's true value (reproducible per step)."""
        pop = self.populations[name]
        pop.rng = np.random.default_rng([self.population_seed, _attr_tag(name), _EVOLVE, t])
        pop.t = t - 1
        return pop.step().copy()

    def randomize_attribute(self, name: str, t: int) -> StepData:
        """Advance ungrouped attribute ``name``'s population to step ``t`` and randomize every device once."""
        proto = self.proto(name)
        values = self._values_at(name, t)
        reports = proto.randomize(values, self._device_rng(_attr_tag(name), _RANDOMIZE, t), state=self.states[name])
        return StepData(name, t, values, reports, true_frequencies(proto, values),
                        proto.support(reports), int(values.shape[0]))

    def randomize_group(self, group: str, t: int) -> list[StepData]:
        """Advance the group's attributes to step ``t`` and randomize every device once through the group's
        solution: per attribute, the reports the solution sends (SMP-like solutions: only the devices that
        sampled the attribute; ``values`` and ``true_frequencies`` are over every device)."""
        g = self.campaign.groups[group]
        values = np.stack([self._values_at(m, t) for m in g.attributes], axis=1)
        out = g.solution.randomize(values, self._device_rng(_attr_tag(group), _GROUP, _RANDOMIZE, t),
                                   state=self.group_states[group])
        data = []
        for j, m in enumerate(g.attributes):
            view, reports = self.proto(m), out.reports[j]
            data.append(StepData(m, t, values[:, j], reports, true_frequencies(view, values[:, j]),
                                 view.support(reports), int(len(reports))))
        return data

    def randomize_unit(self, unit: str, t: int) -> list[StepData]:
        """:meth:`randomize_attribute` or :meth:`randomize_group` of one of :attr:`units`."""
        return self.randomize_group(unit, t) if unit in self.campaign.groups else [self.randomize_attribute(unit, t)]

    def step(self, t: int | None = None, *, persist: bool = True) -> dict[str, StepData]:
        """Simulate time step ``t`` (default: :attr:`next_step`) for every attribute.

        With a ``state_dir`` and ``persist``, the memo states and values are committed to
        disk afterwards (``publish`` commits only once the step's batches are acknowledged).
        """
        t = self.next_step if t is None else int(t)
        out = {d.attribute: d for unit in self.units for d in self.randomize_unit(unit, t)}
        self.next_step = t + 1
        if persist:
            self.commit(t)
        return {name: out[name] for name in self.attributes}

    def run(self) -> Iterator[tuple[int, dict[str, StepData]]]:
        """Simulate every step of :attr:`step_range` offline (no broker)."""
        for t in self.step_range:
            yield t, self.step(t)

    # ------------------------------------------------------------------ persistence
    def _meta(self, t: int, snapshot: str) -> dict[str, Any]:
        c = self.config
        return {"format": _STATE_FORMAT, "version": _STATE_VERSION, "campaign": self.campaign.id,
                "fingerprint": self.campaign.fingerprint, "n_devices": c.n_devices,
                "attributes": self.attributes, "dataset": c.dataset, "base": c.base,
                "p_change": c.p_change, "seed": c.seed,
                "population_seed": self.population_seed, "last_step": t, "next_step": t + 1,
                "snapshot": snapshot, "producer_id": self.producer_id, "saved_at": time.time()}

    def commit(self, t: int) -> None:
        """Persist every attribute's memo state and values as the state after step ``t``."""
        root = self.config.state_dir
        if root is None:
            return
        root.mkdir(parents=True, exist_ok=True)
        name = f"step-{t:06d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        try:
            for group, gst in self.group_states.items():
                gst.save(tmp / f"{group}.group.npz")
            for attr in self.attributes:
                st = self.states.get(attr)
                if st is not None:
                    st.save(tmp / f"{attr}.memo.npz")
                vals = self.populations[attr].values
                if vals is not None:
                    with open(tmp / f"{attr}.values.npy", "wb") as f:
                        np.save(f, vals.astype(uint_dtype(self.proto(attr).k)))
                        f.flush()
                        os.fsync(f.fileno())
            fsync_dir(tmp)
            final = root / name
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        atomic_write(root / "fleet.json", json.dumps(self._meta(t, name), indent=1).encode())
        for old in root.iterdir():  # older snapshots and crashed temporaries
            if old.is_dir() and old.name != name and (old.name.startswith("step-") or old.name.startswith(".step-")):
                shutil.rmtree(old, ignore_errors=True)

    def _load(self) -> bool:
        root = self.config.state_dir
        assert root is not None
        meta_path = root / "fleet.json"
        pid_path = root / _PRODUCER_FILE
        if pid_path.exists():
            try:
                self.producer_id = str(json.loads(pid_path.read_text())["producer_id"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise FleetStateError(f"cannot read {pid_path}: {exc}") from exc
        if not meta_path.exists():
            return False
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as exc:
            raise FleetStateError(f"cannot read {meta_path}: {exc}") from exc
        if meta.get("format") != _STATE_FORMAT or meta.get("version") != _STATE_VERSION:
            raise FleetStateError(f"{meta_path} is not a version-{_STATE_VERSION} fleet state")
        if meta.get("campaign") != self.campaign.id or meta.get("fingerprint") != self.campaign.fingerprint:
            raise FleetStateError(f"{root} holds the state of campaign {meta.get('campaign')!r} "
                                  f"(fingerprint {meta.get('fingerprint')}), not of {self.campaign.id!r} "
                                  f"({self.campaign.fingerprint}); use another state directory")
        if meta.get("n_devices") != self.n_devices:
            raise FleetStateError(f"{root} holds {meta.get('n_devices')} devices, the fleet has {self.n_devices}")
        if self.config.seed is None and meta.get("population_seed") is not None:
            self.population_seed = int(meta["population_seed"])  # the simulated values continue
        snap = root / str(meta["snapshot"])
        for group, gst in self.group_states.items():
            self.group_states[group] = type(gst).load(snap / f"{group}.group.npz",
                                                      solution=self.campaign.groups[group].solution)
        for attr in self.attributes:
            proto = self.proto(attr)
            if self.states.get(attr) is not None:
                self.states[attr] = MemoState.load(snap / f"{attr}.memo.npz", fingerprint=proto.fingerprint)
            vpath = snap / f"{attr}.values.npy"
            if vpath.exists():
                vals = np.load(vpath, allow_pickle=False).astype(np.int64)
                if vals.shape != (self.n_devices,) or (vals.size and int(vals.max()) >= proto.k):
                    raise FleetStateError(f"{vpath} does not hold {self.n_devices} values of [0, {proto.k})")
                pop = self.populations[attr]
                pop.values = vals
                pop.t = int(meta["last_step"])
        if meta.get("producer_id"):
            self.producer_id = str(meta["producer_id"])
        self.next_step = int(meta["next_step"])
        return True


# --------------------------------------------------------------------------- publishing
async def ensure_topic(bootstrap: str, topic: str, partitions: int) -> bool:
    """Create ``topic`` with ``partitions`` partitions unless it exists; True if created."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **kafka_client_options())
    await admin.start()
    try:
        if topic in await admin.list_topics():
            return False
        try:
            resp = await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
        except TopicAlreadyExistsError:
            return False
        for entry in getattr(resp, "topic_errors", []):
            if entry[1] == 36:
                return False
            if entry[1] != 0:
                raise LDPError(f"cannot create topic {topic!r}: {entry}")
        return True
    finally:
        await admin.close()


ProgressHook = Callable[[Progress], Any]
StepHook = Callable[[int, "FleetSummary"], Any]


async def _call(hook: Callable[..., Any], *args: Any) -> None:
    """Call a plain or coroutine function."""
    res = hook(*args)
    if asyncio.iscoroutine(res):
        await res


class _Outage:
    """The publisher's retries while the broker is unavailable: backoff, logging, the deadline."""

    def __init__(self, bootstrap: str, deadline: float, summary: FleetSummary) -> None:
        self.bootstrap, self.deadline, self.summary = bootstrap, deadline, summary
        self.began: float | None = None
        self.attempts = 0
        self.delay = _RETRY_FIRST

    async def wait(self, what: str, exc: BaseException) -> None:
        """Back off after ``exc`` (failing to ``what``); :class:`PublishError` once past the deadline."""
        now = time.monotonic()
        if self.began is None:
            self.began = now
            self.summary.outages += 1
        waited = now - self.began
        if waited >= self.deadline:
            raise PublishError(
                f"the broker at {self.bootstrap} has been unavailable for {waited:.0f} s, longer than the retry "
                f"deadline ({self.deadline:g} s); last error (while trying to {what}): {_describe(exc)}. "
                f"What was acknowledged is in Kafka; with a state directory, running the fleet again resumes after "
                f"its last committed step (batches already counted are skipped by their batch ids)") from exc
        self.attempts += 1
        wait = min(self.delay, self.deadline - waited)
        log.warning("the broker at %s is unavailable (could not %s: %s); retry %d in %.1f s (giving up %.0f s "
                    "from now)", self.bootstrap, what, _describe(exc), self.attempts, wait, self.deadline - waited)
        await asyncio.sleep(wait)
        self.delay = min(_RETRY_MAX, self.delay * 2)

    def over(self) -> None:
        """The broker answered again."""
        if self.began is not None:
            log.warning("the broker at %s is back after %.1f s (%d retries); publishing resumes", self.bootstrap,
                        time.monotonic() - self.began, self.attempts)
        self.began, self.attempts, self.delay = None, 0, _RETRY_FIRST


def _describe(exc: BaseException) -> str:
    """``"Type: message"`` once (aiokafka's messages often start with their type already)."""
    text = str(exc)
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}"


def _retriable(exc: BaseException) -> bool:
    """A Kafka error that an available broker would not raise (connection, timeout, leadership, ...)."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

    return isinstance(exc, (KafkaConnectionError, KafkaTimeoutError)) or bool(getattr(exc, "retriable", False))


async def publish(fleet_or_config: Fleet | FleetConfig, bootstrap: str, topic: str = REPORTS_TOPIC, *,
                  on_progress: ProgressHook | None = None, on_step: StepHook | None = None,
                  keep_supports: bool = True, partitions: int | None = None, window_bytes: int = 64 << 20,
                  window_messages: int = 256, linger_ms: int = 5, retry_deadline: float = 300.0,
                  producer_options: dict[str, Any] | None = None) -> FleetSummary:
    """Simulate and send every step of the fleet; returns what was sent.

    ``partitions``: create ``topic`` with that many partitions first if it does not exist.
    At most ``window_bytes`` / ``window_messages`` are awaiting acknowledgement at a time.
    ``on_step(t, summary)`` runs once every batch and watermark of step ``t`` is acknowledged
    (``summary.per_step`` then holds the step's supports and true frequencies if
    ``keep_supports``); the next step is sent only after it returns. ``on_progress`` and
    ``on_step`` may be plain functions or coroutine functions.

    Broker outages: while the broker is unavailable (the producer cannot start, the topic cannot be
    created, a send or an acknowledgement fails with a retriable Kafka error after the client's own
    retries), the publisher backs off (0.5 s doubling to 10 s, each retry logged with its error) and
    resumes once the broker is back: every message from the first unacknowledged one on is sent
    again, in order, with the same bytes (nothing is randomized again; the count store skips a batch
    id it already applied and a watermark applied twice changes nothing), so the counts end exact.
    It gives up with :class:`PublishError` once one outage has lasted ``retry_deadline`` seconds.
    """
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    fleet = fleet_or_config if isinstance(fleet_or_config, Fleet) else Fleet(fleet_or_config)
    cfg = fleet.config
    campaign = fleet.campaign
    steps = list(fleet.step_range)
    max_msg = max(fleet.proto(a).report_nbytes for a in fleet.attributes) * cfg.batch_size + _ENVELOPE_OVERHEAD
    summary = FleetSummary(0, 0, 0, 0, 0.0, 0.0, steps=steps)
    outage = _Outage(bootstrap, retry_deadline, summary)
    if partitions is not None:
        while True:
            try:
                await ensure_topic(bootstrap, topic, partitions)
                break
            except KafkaError as exc:
                if not _retriable(exc):
                    raise PublishError(f"cannot create topic {topic!r} on {bootstrap}: {exc}") from exc
                await outage.wait(f"create topic {topic!r}", exc)
    options = dict(bootstrap_servers=bootstrap, acks="all", linger_ms=linger_ms, compression_type=None,
                   max_request_size=max(1 << 20, 2 * max_msg), max_batch_size=1 << 20,
                   request_timeout_ms=30_000, **kafka_client_options())  # SASL / TLS: LDP_KAFKA_* (wire.transport)
    options.update(producer_options or {})
    while True:
        producer = AIOKafkaProducer(**options)
        try:
            await producer.start()
            break
        except KafkaError as exc:
            await producer.stop()
            if not _retriable(exc):
                raise PublishError(f"cannot start a Kafka producer on {bootstrap}: {exc}") from exc
            await outage.wait("start a Kafka producer", exc)
    outage.over()

    total = cfg.n_devices * len(steps) * fleet.reports_per_device
    # the window: [future or None, key, envelope] of every message not yet acknowledged, in send order
    inflight: deque[list[Any]] = deque()
    inflight_bytes = 0

    def refused(exc: KafkaError) -> PublishError:
        return PublishError(f"the broker at {bootstrap} refused a batch of topic {topic!r}: {exc}")

    async def resend(what: str, exc: KafkaError) -> None:
        """Back off, then send the window again from its first unacknowledged message, until accepted."""
        nonlocal inflight_bytes
        while True:
            if not _retriable(exc):
                raise refused(exc) from exc
            await outage.wait(what, exc)
            pending = [e[0] for e in inflight if e[0] is not None and not e[0].done()]
            if pending:  # let the client's own retries settle: never two copies in flight
                await asyncio.wait(pending)
            failed = [e[0] for e in inflight if e[0] is not None and (e[0].cancelled() or e[0].exception())]
            while inflight and inflight[0][0] is not None and inflight[0][0] not in failed:
                inflight_bytes -= len(inflight.popleft()[2])  # acknowledged: not sent again
            try:
                for entry in inflight:
                    entry[0] = await producer.send(topic, entry[2], key=entry[1])
                summary.resent += len(inflight)
                return
            except KafkaError as again:
                exc, what = again, "send a batch again"

    async def drain(limit_bytes: int, limit_msgs: int) -> None:
        nonlocal inflight_bytes
        while inflight and (inflight_bytes > limit_bytes or len(inflight) > limit_msgs):
            fut = inflight[0][0]
            try:
                await fut
            except KafkaError as exc:
                await resend("have a batch acknowledged", exc)
                continue
            outage.over()
            inflight_bytes -= len(inflight.popleft()[2])

    async def report(t: int, attr: str, i: int) -> None:
        if on_progress is not None:
            await _call(on_progress, Progress(t, attr, i, len(steps), summary.reports_sent, total, summary.batches,
                                              summary.bytes_sent, time.perf_counter() - start))

    async def send(key: bytes, blob: bytes) -> None:
        nonlocal inflight_bytes
        entry: list[Any] = [None, key, blob]
        inflight.append(entry)
        inflight_bytes += len(blob)
        summary.bytes_sent += len(blob)
        try:
            entry[0] = await producer.send(topic, blob, key=key)
        except KafkaError as exc:
            await resend(f"send a {len(blob):,}-byte batch to {topic!r}", exc)  # sends this one too
        await drain(window_bytes, window_messages)

    # Randomization (numba, GIL released) of the next (t, attr) runs in a worker thread while
    # the current one is sent. It never crosses a step boundary when the state is persisted:
    # a committed snapshot must hold exactly the state after its step.
    items = [(i, t, unit) for i, t in enumerate(steps) for unit in fleet.units]
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1, thread_name_prefix="ldp-fleet")

    def compute(j: int) -> asyncio.Future:
        _, t, unit = items[j]
        return loop.run_in_executor(executor, fleet.randomize_unit, unit, t)

    start = time.perf_counter()
    ahead: asyncio.Future | None = None
    try:
        for j, (i, t, unit) in enumerate(items):
            unit_data = await (ahead if ahead is not None else compute(j))
            ahead = None
            if j + 1 < len(items) and (cfg.state_dir is None or items[j + 1][1] == t):
                ahead = compute(j + 1)
            for data in unit_data:
                attr = data.attribute
                key = message_key(t, attr)
                for index, lo in enumerate(range(0, data.n, cfg.batch_size)):
                    chunk = data.reports[lo:lo + cfg.batch_size]
                    await send(key, pack_reports(campaign, attr, t, chunk, batch_id=fleet.batch_id(t, attr, index)))
                    summary.reports_sent += len(chunk)
                    summary.batches += 1
                    if cfg.rate is not None:
                        wait = summary.reports_sent / cfg.rate - (time.perf_counter() - start)
                        if wait > 0:
                            await asyncio.sleep(wait)
                    await report(t, attr, i)
                await send(key, pack_watermark(campaign, attr, t, count=data.n))
                summary.watermarks += 1
                if keep_supports:
                    summary.per_step[(attr, t)] = {"n": data.n, "support": data.support,
                                                   "true_frequencies": data.true_frequencies}
            del unit_data
            if unit == fleet.units[-1]:  # end of step t
                fleet.next_step = t + 1
                if cfg.state_dir is not None or on_step is not None:
                    await drain(-1, -1)  # the whole step is acknowledged ...
                if cfg.state_dir is not None:
                    fleet.commit(t)      # ... before its memo state is committed
                await report(t, attr, i)
                if on_step is not None:
                    await _call(on_step, t, summary)
        await drain(-1, -1)
    finally:
        if ahead is not None:
            await asyncio.gather(ahead, return_exceptions=True)
        executor.shutdown(wait=True)
        await producer.stop()
    summary.seconds = time.perf_counter() - start
    summary.rate = summary.reports_sent / summary.seconds if summary.seconds > 0 else 0.0
    return summary


def publish_sync(fleet_or_config: Fleet | FleetConfig, bootstrap: str, topic: str = REPORTS_TOPIC,
                 **kwargs: Any) -> FleetSummary:
    """:func:`publish` from synchronous code."""
    return asyncio.run(publish(fleet_or_config, bootstrap, topic, **kwargs))
