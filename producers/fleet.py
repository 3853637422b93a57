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
paces its steps and draws its live view there). A broker outage, or a broker error worth retrying
(:func:`_retriable`), is waited out and the unacknowledged messages are sent again, unchanged
(:func:`publish`, ``retry_deadline``).

Randomness: by default (``seed=None``) the fleet is private like real devices: memo keys, a group's
sampling and the noise of every batch come from 256-bit keys of the OS CSPRNG
(:mod:`estimators.randomness`); only the simulated true values come from a generator (seeded by a
random population seed kept in the state directory, so a resumed fleet's values continue). With an
integer ``seed`` the fleet runs in the labelled *simulation mode*: every draw comes from a generator
seeded by ``(seed, attribute, purpose, t)``, so a fleet is a pure function of its config -- and anyone
who knows the seed can re-derive every report, so it is for tests and benchmarks only
(:attr:`Fleet.simulation` says which mode is on).

Resumes that cannot diverge (``state_dir``): a step is drawn whole (:meth:`Fleet.draw`) and written
to the state directory -- its reports and every device's state after it -- before its first batch is
sent; :func:`publish` commits it (:meth:`Fleet.commit`) once every batch and watermark of it is
acknowledged. A fleet killed in between re-sends that step from the record: the same bytes under the
same batch ids, private mode too (the record holds what was drawn, not a seed), so the count store
skips what it applied and nobody sees a device randomized twice. ``fleet.json`` records every option
that shapes the batches (:data:`_SHAPING`); a resume with another is refused naming it
(:class:`FleetStateError`), as is a second fleet on a directory in use (an exclusive ``flock`` held
from :class:`Fleet` construction to :meth:`Fleet.close`; the kernel releases it when the process
dies) and a state file that cannot be read (missing, truncated, or not matching its SHA-256).
``docs/fleet.md`` has the whole story.

State directory layout (``state_dir``)::

    fleet.json              # the pointer: campaign, fingerprint, options, producer id, population seed,
                            #   next_step, last_step, snapshot (committed), pending (drawn, being sent)
    producer.json           # the producer id, written when the fleet is first created (before any draw)
    fleet.lock              # the lock; holds the pid of the fleet that has it
    step-000004-XXXXXXXX/   # the state after step 4: manifest.json (SHA-256 of every file) and per attribute
        <attr>.memo.npz     #   MemoState.save (keys + memoized bitset), or <group>.group.npz (MultiState)
        <attr>.values.npy   #   the population's current values (Syn evolution continues)
        <attr>.reports.npy  #   while step 4 is pending: its reports, sent again as they are after a crash

A directory is written and fsynced in full before ``fleet.json`` (replaced atomically) points to it;
a crash at any point leaves the previous pointer current and its directory intact (an unreferenced
directory is removed by the next run).

Exactly-once: every batch envelope carries a stable batch id ``<producer>:<t>:<attribute>:<index>``
(:meth:`Fleet.batch_id`; ``index`` is the batch's position in the step, :meth:`Fleet.messages`). The
producer id (:attr:`Fleet.producer_id`, 128 random bits in hex) is made once and kept in the state
directory, so a fleet killed after sending (part of) a step and resumed re-sends that step under the
same ids and the count store skips what it already applied; a fleet without a state directory gets a
fresh id.
"""
from __future__ import annotations

import asyncio
import fcntl
import hashlib
import io
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
import zipfile
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
from estimators.numeric.protocol import NumericProtocol
from estimators.sketch.base import OpenDomainProtocol
from wire.campaign import Campaign
from wire.envelope import pack_reports, pack_watermark
from wire.topics import REPORTS_TOPIC, message_key
from wire.transport import kafka_client_options

from .datasets import KINDS, DriftingMetric, EvolvingPopulation, open_population, open_value, open_value_ids

__all__ = ["FleetConfig", "Fleet", "StepData", "FleetSummary", "Progress", "FleetStateError", "PublishError",
           "publish", "publish_sync", "ensure_topic"]

_STATE_FORMAT = "ldp-stream/fleet-state"
_SNAPSHOT_FORMAT = "ldp-stream/fleet-snapshot"
_STATE_FILE = "fleet.json"
_PRODUCER_FILE = "producer.json"
_LOCK_FILE = "fleet.lock"
_MANIFEST = "manifest.json"
_STATE_VERSION = 2  # version 1 (no options, no drawn-step record, no checksums) is still read
#: The options that shape a fleet's batches (recorded in fleet.json; a resume must keep them), as
#: ``(FleetConfig field, its name in messages: the option of `ldp produce`)``.
_SHAPING = (("n_devices", "--devices"), ("batch_size", "--batch-size"), ("dataset", "--dataset"),
            ("p_change", "--p-change"), ("base", "base distribution"), ("zipf_s", "Zipf exponent"),
            ("seed", "--seed"))
#: What a fleet whose state cannot be read does, and why (appended to those errors).
_CORRUPT = ("the fleet does not go on from a state it cannot read: new keys, or a new draw for devices that have "
            "already reported, would randomize them again (an averaging attack). Restore the state directory "
            "from a backup, or start a new fleet (new devices) with another --state-dir")
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
    values: np.ndarray            # true values int64 (n,); float64 for a numeric attribute
    reports: np.ndarray           # randomized reports (n, ...) of the protocol's report dtype
    true_frequencies: np.ndarray  # float (domain_size,)
    support: np.ndarray           # proto.support(reports), int64 (support_size,)
    n: int

    @property
    def clipped(self) -> int:
        """Devices whose value was outside a numeric attribute's range (clipped before randomization); 0 else."""
        proto = self.proto
        return int(np.count_nonzero(proto.clipped(self.values))) if isinstance(proto, NumericProtocol) else 0

    proto: FrequencyProtocol | None = None


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
    """Histogram of true values over the protocol's estimated domain (buckets for dBitFlipPM); for a numeric
    attribute, ``[mean of the values clipped to the range]``: what its estimate targets."""
    if isinstance(proto, NumericProtocol):
        return np.array([np.clip(values, proto.lo, proto.hi).mean() if len(values) else 0.0])
    if isinstance(proto, OpenDomainProtocol):  # no domain to histogram: the truth is :func:`_open_truth`'s
        return np.zeros(0)
    v = values
    if proto.domain_size != proto.k and hasattr(proto, "bucket"):
        v = proto.bucket(values)
    return np.bincount(v, minlength=proto.domain_size).astype(np.float64) / max(len(v), 1)


def _numeric_truth(data: StepData) -> dict[str, Any]:
    """A numeric attribute's step as the estimate targets it: the values clipped to the range, their mean and
    quantiles (p50, p90, p99), and how many were clipped; empty for a categorical attribute."""
    proto = data.proto
    if not isinstance(proto, NumericProtocol):
        return {}
    v = np.clip(data.values, proto.lo, proto.hi)
    return {"true_mean": float(v.mean()), "clipped": data.clipped,
            "true_quantiles": dict(zip(("p50", "p90", "p99"), np.quantile(v, [0.5, 0.9, 0.99]).tolist()))}


#: the most frequent true items an open-domain attribute's step summary lists
TRUE_TOP = 50


def _open_truth(data: StepData) -> dict[str, Any]:
    """An open-domain attribute's step as its estimate targets it: the ``TRUE_TOP`` most frequent strings, each
    with the item of its id (16 hex digits), its count and frequency, most frequent first; empty for other
    attributes."""
    proto = data.proto
    if not isinstance(proto, OpenDomainProtocol):
        return {}
    idx, counts = np.unique(data.values, return_counts=True)
    order = np.lexsort((idx, -counts))[:TRUE_TOP]
    items = proto.items_of(open_value_ids(data.attribute, idx[order]))
    n = max(len(data.values), 1)
    return {"true_top": [{"item": f"{int(i):016x}", "value": open_value(data.attribute, int(v)), "count": int(c),
                          "frequency": int(c) / n} for i, v, c in zip(items, idx[order], counts[order])]}


# --------------------------------------------------------------------------- the fleet
class Fleet:
    """``n_devices`` simulated devices of one campaign (all attributes, vectorized).

    With a ``state_dir`` the fleet holds an exclusive lock on it from construction until
    :meth:`close` (or the process ends): a second fleet on the same directory gets a
    :class:`FleetStateError` at once.
    """

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
        self._build_populations()
        for name in self.attributes:
            if self.campaign.attributes[name].group is None:
                self.states[name] = self.proto(name).new_state(n, rng=self._device_rng(_attr_tag(name), _KEYS))
        for g in self.campaign.groups.values():
            self.group_states[g.name] = g.solution.new_state(n, rng=self._device_rng(_attr_tag(g.name), _GROUP, _KEYS))
        self.resumed = False  # a committed snapshot or a drawn step was read from state_dir
        self.resent_step: int | None = None  # the drawn, uncommitted step read from state_dir (sent again)
        self.next_step = 0
        self.producer_id = os.urandom(16).hex()  # 128 random bits (not the device-key entropy path)
        self._lock_fd: int | None = None
        self._snapshot: str | None = None  # the committed snapshot (a directory name in state_dir)
        self._last_step: int | None = None  # the step it is the state after
        self._pending: tuple[int, str | None, list[StepData]] | None = None  # a drawn step not yet committed
        if config.state_dir is not None:
            self._lock()
            try:
                self._load()
                if config.first_step is not None and self._pending is not None \
                        and config.first_step != self._pending[0]:
                    raise FleetStateError(
                        f"{config.state_dir}: step {self._pending[0]} was drawn and may have been partly sent; it "
                        f"is sent again, unchanged, before any other step (first_step={config.first_step} refused)")
            except BaseException:
                self.close()
                raise
        if config.first_step is not None:
            self.next_step = config.first_step

    def _build_populations(self) -> None:
        c = self.config
        for name in self.attributes:
            proto = self.proto(name)
            rng = np.random.default_rng([self.population_seed, _attr_tag(name), _POPULATION])
            if isinstance(proto, NumericProtocol):
                self.populations[name] = DriftingMetric(c.n_devices, proto.lo, proto.hi, p_change=c.p_change, rng=rng)
                continue
            if self.campaign.attributes[name].open_domain:  # strings of a Zipf law, whatever the categorical dataset
                self.populations[name] = open_population(c.n_devices, c.p_change, c.zipf_s, rng)
                continue
            self.populations[name] = EvolvingPopulation(
                c.n_devices, self.proto(name).k, kind=c.dataset, p_change=c.p_change,  # type: ignore[arg-type]
                base=c.base, zipf_s=c.zipf_s,  # type: ignore[arg-type]
                rng=np.random.default_rng([self.population_seed, _attr_tag(name), _POPULATION]))

    # ------------------------------------------------------------------ basics
    def batch_id(self, t: int, attribute: str, index: int) -> str:
        """The stable id of batch ``index`` (0-based position in the step) of ``attribute`` at step ``t``."""
        bid = f"{self.producer_id}:{t}:{attribute}:{index}"
        if len(bid.encode()) > 255:  # the envelope carries at most 255 bytes: shorten a very long name
            tag = hashlib.sha256(attribute.encode()).hexdigest()[:32]
            bid = f"{self.producer_id}:{t}:#{tag}:{index}"
        return bid

    def messages(self, data: StepData) -> Iterator[tuple[bytes, bytes, int]]:
        """``(key, envelope, reports)`` of every message of one attribute's step, in send order: its batches
        (``batch_size`` reports each, the last one shorter; batch ids :meth:`batch_id`), then its watermark
        (``reports`` 0), which states the step's report count (a step counted short of it lost reports)."""
        key = message_key(data.t, data.attribute)
        size = self.config.batch_size
        for index, lo in enumerate(range(0, data.n, size)):
            chunk = data.reports[lo:lo + size]
            yield key, pack_reports(self.campaign, data.attribute, data.t, chunk,
                                    batch_id=self.batch_id(data.t, data.attribute, index)), len(chunk)
        yield key, pack_watermark(self.campaign, data.attribute, data.t, count=data.n), 0

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
        return None if st is None else self.proto(attribute).memoized_counts(st)

    def longitudinal_loss(self) -> np.ndarray:
        """Per-device worst-case longitudinal ε so far, summed over the ungrouped attributes (memo protocols)
        and the groups (each group's solution accounts for its attributes together)."""
        total = np.zeros(self.n_devices)
        for name, st in self.states.items():
            if st is not None:
                total += np.asarray(self.proto(name).longitudinal_loss(self.proto(name).memoized_counts(st)),
                                    dtype=np.float64)
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
        reports = proto.randomize(self.inputs(name, values), self._device_rng(_attr_tag(name), _RANDOMIZE, t),
                                  state=self.states[name])
        return StepData(name, t, values, reports, true_frequencies(proto, values),
                        proto.support(reports), int(values.shape[0]), proto=proto)

    def inputs(self, name: str, values: np.ndarray) -> np.ndarray:
        """What the devices of ungrouped attribute ``name`` randomize for their true ``values``: the values, or for
        an open-domain attribute the 64-bit ids of the strings they hold (hashed on the device side)."""
        return open_value_ids(name, values) if self.campaign.attributes[name].open_domain else values

    def value_bound(self, name: str) -> int:
        """The values of ``name``'s population lie in ``[0, value_bound)`` (an open-domain attribute: the indices
        of its strings)."""
        pop = self.populations[name]
        return pop.k if isinstance(pop, EvolvingPopulation) else self.proto(name).k

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

    def draw(self, t: int, *, persist: bool = True) -> list[StepData]:
        """Every report of step ``t`` (all units, in :attr:`units` order), drawn once.

        With a ``state_dir`` (and ``persist``) the drawn step -- its reports and every device's state after
        it (memo keys and marks, a group's sampling, the values) -- is written to the state directory before
        this returns, so :func:`publish` sends nothing that is not on disk first. A step drawn and not yet
        committed is returned again, never drawn anew: from memory, or from the state directory after a
        restart (:attr:`resent_step`), so a resumed fleet re-sends the very same reports.
        """
        if self._pending is not None:
            if self._pending[0] != t:
                raise FleetStateError(f"step {self._pending[0]} was drawn but not committed; it is sent (again) "
                                      f"before any other step (step {t} asked for)")
            return self._pending[2]
        data = [d for unit in self.units for d in self.randomize_unit(unit, t)]
        if persist and self.config.state_dir is not None:
            self._prepare(t, data)
        return data

    def step(self, t: int | None = None, *, persist: bool = True) -> dict[str, StepData]:
        """Simulate time step ``t`` (default: :attr:`next_step`) for every attribute.

        With a ``state_dir`` and ``persist``, the memo states and values are committed to
        disk afterwards (``publish`` commits only once the step's batches are acknowledged).
        """
        t = self.next_step if t is None else int(t)
        out = {d.attribute: d for d in self.draw(t, persist=False)}
        self.next_step = t + 1
        if persist:
            self.commit(t)
        return {name: out[name] for name in self.attributes}

    def run(self) -> Iterator[tuple[int, dict[str, StepData]]]:
        """Simulate every step of :attr:`step_range` offline (no broker)."""
        for t in self.step_range:
            yield t, self.step(t)

    # ------------------------------------------------------------------ persistence
    def _meta(self, next_step: int, pending: str | None) -> dict[str, Any]:
        c = self.config
        return {"format": _STATE_FORMAT, "version": _STATE_VERSION, "campaign": self.campaign.id,
                "fingerprint": self.campaign.fingerprint, "attributes": self.attributes,
                "options": {name: getattr(c, name) for name, _ in _SHAPING}, "simulation": self.simulation,
                "population_seed": self.population_seed, "producer_id": self.producer_id,
                "last_step": self._last_step, "next_step": next_step, "snapshot": self._snapshot,
                "pending": pending, "saved_at": time.time()}

    def _write_meta(self, next_step: int, pending: str | None = None) -> None:
        assert self.config.state_dir is not None
        atomic_write(self.config.state_dir / _STATE_FILE, _checked_json(self._meta(next_step, pending)))

    def _write_snapshot(self, t: int, data: list[StepData] | None = None) -> str:
        """Write every device's state (after step ``t``) and, if given, the step's reports to a new directory
        of ``state_dir`` (files fsynced, their SHA-256 in its manifest); returns its name. Nothing points to
        it yet: a crash leaves an unreferenced directory, removed by the next run."""
        root = self.config.state_dir
        assert root is not None
        root.mkdir(parents=True, exist_ok=True)
        snap = Path(tempfile.mkdtemp(prefix=f"step-{t:06d}-", dir=root))
        files: dict[str, str] = {}

        def put(name: str, blob: bytes) -> None:
            with os.fdopen(os.open(snap / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            files[name] = hashlib.sha256(blob).hexdigest()

        def npy(array: np.ndarray) -> bytes:
            buf = io.BytesIO()
            np.save(buf, array, allow_pickle=False)
            return buf.getvalue()

        try:
            for group, gst in self.group_states.items():
                gst.save(snap / f"{group}.group.npz")  # atomic, fsynced
                files[f"{group}.group.npz"] = _sha256(snap / f"{group}.group.npz")
            for attr in self.attributes:
                st = self.states.get(attr)
                if st is not None:
                    st.save(snap / f"{attr}.memo.npz")
                    files[f"{attr}.memo.npz"] = _sha256(snap / f"{attr}.memo.npz")
                vals = self.populations[attr].values
                if vals is not None:
                    numeric = isinstance(self.proto(attr), NumericProtocol)  # a numeric metric: the baselines
                    put(f"{attr}.values.npy", npy(vals.astype(np.float64 if numeric else uint_dtype(self.value_bound(attr)))))
            for d in data or ():
                put(f"{d.attribute}.reports.npy", npy(d.reports))
            manifest = {"format": _SNAPSHOT_FORMAT, "t": t, "files": files, "batch_size": self.config.batch_size,
                        "reports": {d.attribute: d.n for d in data or ()}}
            put(_MANIFEST, _checked_json(manifest))
            fsync_dir(snap)
            fsync_dir(root)
        except BaseException:
            shutil.rmtree(snap, ignore_errors=True)
            raise
        return snap.name

    def _prepare(self, t: int, data: list[StepData]) -> None:
        """Commit what was drawn for step ``t`` before any of it is sent: the reports and the state after the
        step, then ``fleet.json`` pointing to them as the step to send (again, after a crash)."""
        name = self._write_snapshot(t, data)
        self._write_meta(t, pending=name)
        self._pending = (t, name, data)
        self._cleanup()

    def commit(self, t: int) -> None:
        """Make the state after step ``t`` the committed one (the drawn step's record if there is one, else a
        snapshot written now); the fleet then resumes at ``t + 1``."""
        root = self.config.state_dir
        if root is None:
            self._pending = None
            return
        if self._pending is not None and self._pending[0] != t:
            raise FleetStateError(f"step {self._pending[0]} was drawn but not committed; cannot commit step {t}")
        name = self._pending[1] if self._pending is not None else None
        if name is None:
            name = self._write_snapshot(t)
        self._snapshot, self._last_step, self._pending = name, t, None
        self._write_meta(t + 1)
        for reports in (root / name).glob("*.reports.npy"):  # sent and acknowledged: not needed any more
            reports.unlink()
        self._cleanup()

    def _cleanup(self) -> None:
        """Remove every snapshot directory that ``fleet.json`` does not point to (older ones, crashed writes)."""
        root = self.config.state_dir
        assert root is not None
        keep = {self._snapshot, self._pending[1] if self._pending is not None else None}
        for old in root.iterdir():
            if old.is_dir() and old.name not in keep and (old.name.startswith("step-") or old.name.startswith(".step-")):
                shutil.rmtree(old, ignore_errors=True)

    def _lock(self) -> None:
        """Take the exclusive lock of ``state_dir`` (``flock``; the kernel releases it when the process ends,
        however it ends)."""
        root = self.config.state_dir
        assert root is not None
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the devices' secret keys
        path = root / _LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            except OSError:
                holder = "unknown"
            os.close(fd)
            raise FleetStateError(f"{root} is in use by another producer (pid {holder}): a fleet state directory "
                                  "serves one producer at a time. Let that one finish (or stop it) and run again, "
                                  "or use another --state-dir") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def close(self) -> None:
        """Release the state directory's lock (idempotent); the fleet must not be used afterwards."""
        fd, self._lock_fd = getattr(self, "_lock_fd", None), None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _keep_producer_id(self) -> None:
        """Persist the producer id in the state directory before anything is sent (a crash before the
        first commit must not change it)."""
        root = self.config.state_dir
        assert root is not None
        path = root / _PRODUCER_FILE
        if path.exists():
            return
        atomic_write(path, _checked_json({"producer_id": self.producer_id}))

    def _load(self) -> None:
        root = self.config.state_dir
        assert root is not None
        meta_path = root / _STATE_FILE
        pid_path = root / _PRODUCER_FILE
        if pid_path.exists():
            try:
                self.producer_id = str(_read_json(pid_path)["producer_id"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise FleetStateError(f"cannot read {pid_path} ({exc}); {_CORRUPT}") from exc
        meta: dict[str, Any] | None = None
        if meta_path.exists():
            try:
                meta = _read_json(meta_path)
            except (OSError, ValueError) as exc:
                raise FleetStateError(f"cannot read {meta_path} ({exc}); {_CORRUPT}") from exc
            if meta.get("format") != _STATE_FORMAT or meta.get("version") not in (1, _STATE_VERSION):
                raise FleetStateError(f"{meta_path} is not a fleet state this release reads (version 1 or "
                                      f"{_STATE_VERSION}); use another --state-dir")
        if meta is None or not (meta.get("snapshot") or meta.get("pending")):
            # nothing was ever drawn here (so nothing sent): a fresh fleet, whatever its options
            self._keep_producer_id()
            self._cleanup()
            self._write_meta(self.config.first_step or 0)
            return
        self._check_options(meta)
        if self.config.seed is None and meta.get("population_seed") is not None \
                and int(meta["population_seed"]) != self.population_seed:
            self.population_seed = int(meta["population_seed"])  # the simulated values continue
            self._build_populations()
        if meta.get("producer_id"):
            self.producer_id = str(meta["producer_id"])
        version = int(meta["version"])
        try:
            self.next_step = int(meta["next_step"])
            if meta.get("snapshot"):
                self._snapshot, self._last_step = str(meta["snapshot"]), int(meta["last_step"])
            pending = meta.get("pending")
        except (KeyError, TypeError, ValueError) as exc:
            raise FleetStateError(f"{meta_path}: malformed fleet state ({exc!r}); {_CORRUPT}") from exc
        if pending:
            # the step drawn and perhaps partly sent: its state (after the step) and reports, to send again
            t = self.next_step
            data = self._read_snapshot(str(pending), t, version, reports=True)
            assert data is not None
            self._pending = (t, str(pending), data)
            self.resent_step = t
        elif self._snapshot is not None:
            self._read_snapshot(self._snapshot, int(self._last_step), version)  # type: ignore[arg-type]
        self.resumed = True
        self._keep_producer_id()
        self._cleanup()

    def _check_options(self, meta: dict[str, Any]) -> None:
        """Refuse a state directory of another campaign, or one whose batches another option shaped."""
        root = self.config.state_dir
        if meta.get("campaign") != self.campaign.id or meta.get("fingerprint") != self.campaign.fingerprint:
            raise FleetStateError(f"{root} holds the state of campaign {meta.get('campaign')!r} "
                                  f"(fingerprint {meta.get('fingerprint')}), not of {self.campaign.id!r} "
                                  f"({self.campaign.fingerprint}); use another state directory")
        recorded = meta.get("options")
        if not isinstance(recorded, dict):  # version 1: these options only
            recorded = {k: meta[k] for k in ("n_devices", "dataset", "base", "p_change", "seed") if k in meta}
        for name, flag in _SHAPING:
            if name not in recorded:
                continue
            old, new = recorded[name], getattr(self.config, name)
            if old != new:
                raise FleetStateError(
                    f"{root} holds a fleet made with {flag} {_show(old)}; this run has {flag} {_show(new)}. A "
                    f"resumed fleet must keep every option that shapes its batches (a step drawn before the stop "
                    f"is sent again batch by batch, under the same batch ids): run it with {flag} {_show(old)}, "
                    "or start a new fleet (new devices) with another --state-dir")

    def _read_snapshot(self, name: str, t: int, version: int, *, reports: bool = False) -> list[StepData] | None:
        """Load the devices' state after step ``t`` from snapshot ``name`` (and, with ``reports``, step ``t``'s
        drawn reports); every file is checked against the manifest's SHA-256 first."""
        root = self.config.state_dir
        assert root is not None
        snap = root / name
        if not snap.is_dir():
            raise FleetStateError(f"{snap} is missing but {root / _STATE_FILE} points to it; {_CORRUPT}")
        manifest: dict[str, Any] = {}
        if version >= 2:
            mpath = snap / _MANIFEST
            try:
                manifest = _read_json(mpath)
                files = manifest["files"]
                if manifest.get("format") != _SNAPSHOT_FORMAT or not isinstance(files, dict):
                    raise ValueError("not a fleet snapshot manifest")
                if manifest.get("t") != t:
                    raise ValueError(f"it is the state after step {manifest.get('t')}, {root / _STATE_FILE} says {t}")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise FleetStateError(f"cannot read {mpath} ({exc}); {_CORRUPT}") from exc
            for fname, digest in files.items():
                if fname.endswith(".reports.npy") and not reports:
                    continue
                try:
                    ok = _sha256(snap / str(fname)) == digest
                except OSError as exc:
                    raise FleetStateError(f"cannot read {snap / str(fname)} ({exc}); {_CORRUPT}") from exc
                if not ok:
                    raise FleetStateError(f"{snap / str(fname)} is corrupt (its SHA-256 differs from the one in "
                                          f"{mpath}); {_CORRUPT}")
        for group, gst in self.group_states.items():
            path = snap / f"{group}.group.npz"
            self.group_states[group] = _read(path, lambda: type(gst).load(
                path, solution=self.campaign.groups[group].solution))
        for attr in self.attributes:
            proto = self.proto(attr)
            if self.states.get(attr) is not None:
                path = snap / f"{attr}.memo.npz"
                self.states[attr] = _read(path, lambda: MemoState.load(path, fingerprint=proto.fingerprint))
            vpath = snap / f"{attr}.values.npy"
            if vpath.exists():
                numeric = isinstance(proto, NumericProtocol)
                vals = _read(vpath, lambda: np.load(vpath, allow_pickle=False).astype(np.float64 if numeric else np.int64))
                if numeric and (vals.shape != (self.n_devices,) or not np.all(np.isfinite(vals))):
                    raise FleetStateError(f"{vpath} does not hold {self.n_devices} finite baselines; {_CORRUPT}")
                bound = self.value_bound(attr)
                if not numeric and (vals.shape != (self.n_devices,)
                                    or (vals.size and (int(vals.min()) < 0 or int(vals.max()) >= bound))):
                    raise FleetStateError(f"{vpath} does not hold {self.n_devices} values of [0, {bound}); "
                                          f"{_CORRUPT}")
                pop = self.populations[attr]
                pop.values = vals
                pop.t = t
        if not reports:
            return None
        if manifest.get("batch_size") != self.config.batch_size:  # the options check has said so already
            raise FleetStateError(f"{snap} was drawn with batch size {manifest.get('batch_size')}, not "
                                  f"{self.config.batch_size}")
        data = []
        for attr in self.attributes:
            proto, values = self.proto(attr), self.populations[attr].values
            rpath = snap / f"{attr}.reports.npy"
            rep = _read(rpath, lambda: np.load(rpath, allow_pickle=False))
            if values is None or rep.dtype != proto.report_dtype or rep.shape[1:] != tuple(proto.report_shape) \
                    or len(rep) != manifest["reports"].get(attr):
                raise FleetStateError(f"{rpath} does not hold the reports its manifest lists; {_CORRUPT}")
            values = values.copy()
            data.append(StepData(attr, t, values, rep, true_frequencies(proto, values), proto.support(rep), len(rep),
                                 proto=proto))
        by_name = {d.attribute: d for d in data}  # in the order draw() returns them: unit by unit
        return [by_name[a] for u in self.units for a in (self.campaign.groups[u].attributes
                                                          if u in self.campaign.groups else [u])]


def _checked_json(obj: dict[str, Any]) -> bytes:
    """``obj`` as JSON with a ``"sha256"`` of its canonical form: a flipped byte that leaves valid JSON (another
    producer id, step or seed) is detected by :func:`_read_json` like one that does not."""
    body = {k: v for k, v in obj.items() if k != "sha256"}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return json.dumps({**body, "sha256": digest}, indent=1).encode()


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object written by :func:`_checked_json` (checked), or an older one without a checksum."""
    obj = json.loads(path.read_text())
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    if "sha256" in obj:
        body = {k: v for k, v in obj.items() if k != "sha256"}
        if hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() != obj["sha256"]:
            raise ValueError("its content differs from its SHA-256: the file is corrupt")
    return obj


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read(path: Path, load: Callable[[], Any]) -> Any:
    """``load()``, any failure to read ``path`` (missing, truncated, not a zip or npy file, wrong arrays) as a
    :class:`FleetStateError` that names the file."""
    try:
        return load()
    except FleetStateError:
        raise
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:  # InvalidState is a ValueError
        raise FleetStateError(f"cannot read {path} ({_describe(exc)}); {_CORRUPT}") from exc


def _show(value: Any) -> str:
    return "none (private mode)" if value is None else str(value)


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
    """A Kafka error worth retrying: one an available, healthy broker would not raise (connection, timeout,
    leadership, ...), or the broker's own "unexpected server error" (``UnknownError``, error code -1: a broker
    restarting, or one whose storage failed, answers it; a retry sends the same bytes under the same batch ids,
    so at worst the store skips a copy). Errors that sending again cannot cure (a message too large, an
    authorization or configuration error) are not retried."""
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, UnknownError

    return (isinstance(exc, (KafkaConnectionError, KafkaTimeoutError, UnknownError))
            or bool(getattr(exc, "retriable", False)))


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
    ``on_step`` may be plain functions or coroutine functions. Given a :class:`FleetConfig`, the
    fleet is made here and closed (its state directory unlocked) at the end.

    With a state directory, each step is drawn whole (:meth:`Fleet.draw`: written to the state
    directory before its first batch is sent), sent, and committed (:meth:`Fleet.commit`) only once
    every batch and watermark of it is acknowledged; a fleet resumed after a crash re-sends the drawn
    step unchanged. Without one, the next attribute is randomized while the current one is sent.

    Broker errors: while the broker is unavailable or failing (the producer cannot start, the topic
    cannot be created, a send or an acknowledgement fails with a retriable Kafka error, ``UnknownError``
    included, after the client's own retries: :func:`_retriable`), the publisher backs off (0.5 s
    doubling to 10 s, each retry logged with its error) and resumes once the broker answers again:
    every message from the first unacknowledged one on is sent again, in order, with the same bytes
    (nothing is randomized again; the count store skips a batch id it already applied and a
    watermark applied twice changes nothing), so the counts end exact. It gives up with
    :class:`PublishError` once one outage has lasted ``retry_deadline`` seconds, and at once on an
    error that sending again cannot cure; either way nothing unacknowledged was committed.
    """
    fleet = fleet_or_config if isinstance(fleet_or_config, Fleet) else Fleet(fleet_or_config)
    try:
        return await _publish(fleet, bootstrap, topic, on_progress=on_progress, on_step=on_step,
                              keep_supports=keep_supports, partitions=partitions, window_bytes=window_bytes,
                              window_messages=window_messages, linger_ms=linger_ms, retry_deadline=retry_deadline,
                              producer_options=producer_options)
    finally:
        if fleet is not fleet_or_config:
            fleet.close()


async def _publish(fleet: Fleet, bootstrap: str, topic: str, *, on_progress: ProgressHook | None,
                   on_step: StepHook | None, keep_supports: bool, partitions: int | None, window_bytes: int,
                   window_messages: int, linger_ms: int, retry_deadline: float,
                   producer_options: dict[str, Any] | None) -> FleetSummary:
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    cfg = fleet.config
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
                    raise PublishError(f"cannot create topic {topic!r} on {bootstrap}: {_describe(exc)}") from exc
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
            await _stop(producer)
            if not _retriable(exc):
                raise PublishError(f"cannot start a Kafka producer on {bootstrap}: {_describe(exc)}") from exc
            await outage.wait("start a Kafka producer", exc)
    outage.over()

    total = cfg.n_devices * len(steps) * fleet.reports_per_device
    # the window: [future or None, key, envelope] of every message not yet acknowledged, in send order
    inflight: deque[list[Any]] = deque()
    inflight_bytes = 0

    def refused(exc: KafkaError) -> PublishError:
        return PublishError(f"the broker at {bootstrap} refused a batch of topic {topic!r}: {_describe(exc)}; "
                            "sending it again cannot help. Nothing unacknowledged was committed: with a state "
                            "directory, running the fleet again resumes at its first unacknowledged step")

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

    # Randomization (numba, GIL released) runs in a worker thread while the previous unit is sent.
    # With a state directory a unit of work is a whole step (Fleet.draw: drawn and written to disk
    # before its first batch goes out) and nothing is drawn ahead: a step is drawn only after the
    # previous one is committed. Without one, a unit is one attribute or group, drawn one ahead.
    persist = cfg.state_dir is not None
    items: list[tuple[int, int, str | None]] = (
        [(i, t, None) for i, t in enumerate(steps)] if persist
        else [(i, t, unit) for i, t in enumerate(steps) for unit in fleet.units])
    loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(1, thread_name_prefix="ldp-fleet")

    def compute(j: int) -> asyncio.Future:
        _, t, unit = items[j]
        if unit is None:
            return loop.run_in_executor(executor, fleet.draw, t)
        return loop.run_in_executor(executor, fleet.randomize_unit, unit, t)

    start = time.perf_counter()
    ahead: asyncio.Future | None = None
    try:
        for j, (i, t, unit) in enumerate(items):
            unit_data = await (ahead if ahead is not None else compute(j))
            ahead = None
            if j + 1 < len(items) and not persist:
                ahead = compute(j + 1)
            for data in unit_data:
                attr = data.attribute
                for key, blob, n_reports in fleet.messages(data):
                    await send(key, blob)
                    if not n_reports:  # the watermark
                        summary.watermarks += 1
                        continue
                    summary.reports_sent += n_reports
                    summary.batches += 1
                    if cfg.rate is not None:
                        wait = summary.reports_sent / cfg.rate - (time.perf_counter() - start)
                        if wait > 0:
                            await asyncio.sleep(wait)
                    await report(t, attr, i)
                if keep_supports:
                    summary.per_step[(attr, t)] = {"n": data.n, "support": data.support,
                                                   "true_frequencies": data.true_frequencies,
                                                   **_numeric_truth(data), **_open_truth(data)}
            del unit_data
            if unit is None or unit == fleet.units[-1]:  # end of step t
                if persist or on_step is not None:
                    await drain(-1, -1)  # the whole step is acknowledged ...
                if persist:
                    fleet.commit(t)      # ... before it is committed
                fleet.next_step = t + 1
                await report(t, attr, i)
                if on_step is not None:
                    await _call(on_step, t, summary)
        await drain(-1, -1)
    finally:
        if ahead is not None:
            await asyncio.gather(ahead, return_exceptions=True)
        executor.shutdown(wait=True)
        await _stop(producer)
    summary.seconds = time.perf_counter() - start
    summary.rate = summary.reports_sent / summary.seconds if summary.seconds > 0 else 0.0
    return summary


async def _stop(producer: Any) -> None:
    """Stop a Kafka producer; its own errors are logged, never raised (they would hide the error that ended
    the run, or fail a run whose every message was acknowledged)."""
    try:
        await producer.stop()
    except Exception as exc:  # noqa: BLE001 - whatever the client raises while closing
        log.warning("stopping the Kafka producer failed: %s", _describe(exc))


def publish_sync(fleet_or_config: Fleet | FleetConfig, bootstrap: str, topic: str = REPORTS_TOPIC,
                 **kwargs: Any) -> FleetSummary:
    """:func:`publish` from synchronous code."""
    return asyncio.run(publish(fleet_or_config, bootstrap, topic, **kwargs))
