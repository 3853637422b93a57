"""The device SDK: one real device's randomizer, memo state and privacy budget.

```python
from pathlib import Path
from producers.sdk import Device
from wire.campaign import Campaign

dev = Device(Campaign.load("deploy/campaigns/demo.toml"), Path("~/.ldp-device"), budget_eps=20.0,
             ingest_url="http://127.0.0.1:8080/reports", token=TOKEN)   # `ldp ingest`, `ldp tokens issue`
print(dev.budget_plan)                # what the budget memoizes, and why
dev.send("app_version", 42)           # randomize locally, POST one report (retried with one Idempotency-Key)
dev.send("opt_in", "yes")             # a label of the campaign instead of an index
obj = dev.report("crash_minute", 95, t=7)   # or build the JSON object and send it yourself
dev.send_group("device", {"dark_mode": "on", "country": 3, "device_model": 17})   # a [[groups]] solution
dev.send("crash_signature", "NullPointerException@Foo.java:42")   # type = "string": any string, hashed here
```

Open-domain attributes
----------------------
An attribute of ``type = "string"`` takes a ``str``, one of ``type = "u64"`` an ``int`` in ``[0, 2^64)``; anything
else is refused with :class:`LDPError` before anything is spent. The device computes the value's 64-bit id
(:meth:`wire.campaign.Attribute.value_id`: the first 8 bytes of the string's SHA-256, an integer itself) and
randomizes the id with the attribute's open-domain protocol (``estimators.sketch``: CMS, HCMS); only the report
leaves the device. CMS and HCMS are memoryless: every report spends a fresh ``eps_first`` from the budget, as the
single-shot protocols do, and is refused (:class:`BudgetExceeded`) when it does not fit. The ledger of a
memoryless attribute holds its number of reports only: no value, no id and no memo state is ever written, so a
restored state directory never holds the raw strings a device reported (nor their ids, which a dictionary of
candidate strings would invert).

TreeHist memoizes: a memoizing open-domain attribute has a memo state like any memoizing attribute (its 256-bit
key in the key store, the memo file holding ``memo_slots`` bits read as a table of ``memo_slots / 64`` 64-bit tags,
keyed PRFs of the memoized prefixes: the memo key and the tags, nothing else in clear), its level is fixed for life
by the key, its row and first GRR are memoized per level prefix, so a restarted device reports the same bytes for
the same value (without ``eps_1``). Each NEW prefix (a tag not in the table, ``proto.memoized_counts``) costs one
ε∞ (``proto.longitudinal_loss``), reserved and frozen as below; a new prefix met by a full tag table is refused
(:class:`MemoTableFull`, nothing memoized or sent) rather than memoized unaccounted. Its last value (what a frozen
attribute keeps reporting) is recorded as the hex of the device's memoized report of it (level, row, first-GRR
bucket: randomized, ε∞-LDP), never the string nor its id; a frozen report is that memoized report with a fresh
IRR drawn on top, the bytes ``proto.randomize`` would give for the last value.

State directory (``state_path``)::

    device.json        # campaign id, one fingerprint per attribute and group, "a ledger exists"
    <attr>.memo.npz    # one MemoState of a single device per memoizing attribute (atomic writes), its key zeroed
    memo.<attr>.key    # that attribute's 256-bit memo key (default FileKeyStore; ``keystore=``: an OS keystore)
    <group>.group.npz  # one MultiState of a single device per group (atomic writes): memo keys and
                       # marks per attribute, the sampled attribute, the fixed fake inputs
    budget.json        # the budget ledger (atomic writes): reports spent by memoryless attributes,
                       # memo slots reserved by memoizing ones, the value each memoizing
                       # attribute last reported (the value a frozen attribute keeps reporting),
                       # and the group reports reserved per group; the key id of every attribute and
                       # group that has reported, the loss its resets retired, each scope's reserved loss
    .lock              # flock: one Device at a time per state directory

The directory is created with mode 0700 (an existing one is tightened to it), its files 0600.

Device state
------------
A device never reports with a key it cannot account for (``docs/privacy.md``, "Device state fails
closed"). The ledger records the id of an attribute's (a group's) key before the first report that
uses it leaves the SDK; a memo or group file the ledger names that is missing, truncated, unreadable
or holds another key, protocol or sampled attribute makes :meth:`Device.report` /
:meth:`Device.report_group` raise :class:`DeviceStateError` for that attribute (nothing randomized,
saved or sent; the other attributes go on). A lost ledger or identity next to existing state
refuses the whole device. :meth:`Device.reset` with ``accept_privacy_loss=True`` is the only way on
for one attribute: the old key's reserved loss stays in the ledger (``retired``) and the fresh
key's first memo slot (ε∞), or a fresh group state's first step, is reserved at once; the first
report after it reserves one more slot, as every report does (an over-count by at most one ε∞).

*Campaigns evolve.* ``device.json`` records a fingerprint per attribute and per group
(``proto.fingerprint`` / ``solution.fingerprint``: protocol, k, ε and the other protocol
parameters; not the step length, retention or labels). Adding or removing an attribute keeps every
other one's keys, memo state and ledger; a removed attribute's recorded loss stays counted. An
attribute whose fingerprint changed after it reported is a new attribute: refused with
:class:`DeviceStateError` until :meth:`Device.reset`; one that never reported takes the new
fingerprint silently.

Lifetime privacy budget
-----------------------
The rule is built so that what the server sees of a device, *which* scheduled reports arrive and
which are refused, depends only on the device's schedule (which attribute it reports when) and on
its configuration, never on its values. Everything value-dependent stays inside the randomized
payload, whose cost the longitudinal ε accounting already covers.

*Actual loss.* :meth:`Device.privacy_loss` is the device's longitudinal loss: the sum over
attributes of ``proto.longitudinal_loss(memoized_count)`` for memoizing protocols plus
``reports x eps_first`` for memoryless ones. It depends on the values (how many distinct inputs
were memoized), so no visible decision may be taken on it.

*Reserved loss.* Each report of a memoizing attribute reserves one more *memo slot* (while the
attribute has fewer than ``memo_size`` slots and the reservation fits in ``budget_eps``): the
room to memoize one new input, whether or not the value turns out to be new. The reserved loss
(:meth:`Device.reserved_loss`) is the sum of ``proto.longitudinal_loss(slots)`` over memoizing
attributes plus ``reports x eps_first`` over memoryless ones. It depends on the schedule only,
and it bounds the actual loss (an attribute never memoizes more inputs than it has slots), so
``privacy_loss() <= reserved_loss() <= budget_eps`` at all times.

*Freezing.* A report of a memoizing attribute whose value is already memoized costs nothing and
randomizes that value (its memoized PRR is reused). A value that would need a new memoization is
memoized if the attribute has a free slot (and, should ``budget_eps`` have been lowered, if the
actual loss stays within it). Otherwise the attribute is *frozen*: the report is still made, on
schedule, but it randomizes the value the attribute last reported, which is memoized, instead of
the new one. Its memoized PRR is reused, no new ε∞ is spent, nothing is memoized and the memo
file does not change. The server cannot tell a frozen device from one whose value did not change.
A frozen attribute reports its true value again whenever that value is one it has memoized.

*Refusals.* :class:`BudgetExceeded` (nothing memoized, saved or sent) is raised only by
decisions on the reserved loss, which are data-independent: a memoryless report whose
``eps_first`` does not fit, or the *first* report of a memoizing attribute when the budget cannot
reserve its first memo slot (earlier reports of other attributes reserved it). A memoizing
attribute that has reported once is never refused again: it freezes instead. A budget too small
to memoize even one value of some memoizing attribute of the campaign is refused when the
:class:`Device` is built (``ValueError``): such an attribute could never report, and refusing
its first value at report time would be the only behaviour left, so the configuration is
rejected up front instead.

The reservation is schedule-driven, so a shared budget is handed out in report order: an
attribute that reports often reserves its slots early (up to ``memo_size``), and an attribute or
memoryless report that comes later may find the budget reserved even when few values actually
changed. That conservatism is the price of not leaking, through a refusal, how many values the
*other* attributes memoized. With a single memoizing attribute it makes no difference: the
attribute memoizes new values until ``longitudinal_loss`` would pass the budget, then freezes.

*Accounting.* The longitudinal ε accounting is unchanged: a frozen report is one more report of
an already memoized input, so the loss stays ``proto.longitudinal_loss(memoized_count)`` summed
as above, at most ``budget_eps``.

*Bias.* A frozen attribute keeps contributing the value it held when it froze, so estimates lag
true changes: the estimated histogram is biased toward the values held at freeze time. The
estimator stays unbiased for the *reported* values; for the true values, the bias of the
frequency of ``x`` at a step is ``phi x (g(x) - h(x))``, where ``phi`` is the fraction of devices
reporting a substituted (frozen) value at that step, ``g`` the distribution of their frozen
values and ``h`` the distribution of their current true values. Its size is at most ``phi`` per
frequency (and ``phi`` in total variation); it is zero when frozen devices' values did not in
fact move, and it grows as the population drifts away from what the frozen devices hold.

*Crash safety.* The ledger is written *before* a report leaves :meth:`Device.report`, and a new
memoization is written as: ledger with the reserved slot (and the key id), memo state, ledger with
the new last value. A crash can only over-count the reservation, never under-count it, and the
recorded last value is always a memoized one. A fresh key is saved to its memo file before the
ledger names it, so a crash before the first report leaves an unused key (used again) or none
(drawn again: nothing was sent with it).

*Older state.* A state directory written before this rule has no slots or last values: its slots
start at its memoized count, and until a memoizing attribute has reported once under this SDK it
has no last value to freeze to, so such an attribute is refused (:class:`BudgetExceeded`) rather
than frozen if its very next value needs a memoization it cannot afford.

Groups
------
The attributes of a ``[[groups]]`` entry of the campaign are randomized together by the group's
multidimensional solution (:mod:`estimators.multidim`), one budget for the whole tuple:
:meth:`Device.report_group` takes the device's value of every attribute of the group and returns
one report object per attribute the solution sends (SMP, L-SMP, ALLOMFREE: the one sampled
attribute; SPL, L-SPL, RS+FD, L-RS+FD, ALLOMFREE with fake data: every attribute, real or fake).
:meth:`Device.report` and :meth:`Device.randomize` refuse a grouped attribute. Which attribute a
device sampled, its memo keys and its fake inputs are the group's ``MultiState``, created once
(OS CSPRNG) and kept for the device's life.

*Reserved loss of a group.* Every group report reserves one more *group step*. After ``S``
reserved steps the group's reserved loss is the solution's worst case after ``S`` steps, whatever
the values: ``solution.loss_bound(S)`` for longitudinal solutions (each step memoizes at most one
new input in each attribute it reports real data for, so no attribute memoizes more than ``S``;
the bound stops growing once ``S`` reaches the memo sizes; with fixed sampling it is the largest
channel's bound, not the sampled attribute's, so a refusal never tells the server which attribute
a fake-data device sampled), and ``S x solution.eps_first`` for single-shot ones (SPL, SMP,
RS+FD), sequential composition over the steps as for memoryless attributes (Dwork & Roth, Found.
Trends TCS 2014, Thm. 3.16; ``eps_first`` is the tuple-level ε of one step, and with a fixed
sampled attribute each step's likelihood ratio given the sampled index is at most
``e^eps_first``, so the mixture over the index is at most ``e^(S eps_first)``). The
library's ``longitudinal_loss`` of a single-shot solution is ``inf`` from the second report of an
attribute (no memo: unbounded over an unbounded number of reports), which would allow one group
report under any finite budget; the SDK counts the reports instead.

*Actual loss of a group.* ``solution.longitudinal_loss(state)`` for longitudinal solutions (the
channels' losses of the inputs memoized from real data: value-dependent), and the reserved loss
for single-shot ones (their loss does not depend on the values). Both are at most the reserved
loss, so ``privacy_loss() <= reserved_loss() <= budget_eps`` holds with groups included.

*Refusals.* A group report whose reservation ``bound(S + 1) - bound(S)`` does not fit in
``budget_eps`` next to everything reserved so far is refused with :class:`BudgetExceeded`
before anything is randomized, memoized, saved or sent: the decision depends on the schedule
only. Groups do not *freeze*: a step's reservation already covers the worst case of that step
(a new memoized input wherever the solution memoizes), so the group's actual loss can never
outrun its reservation and no value ever has to be substituted, which is the only thing freezing
is for. The price is that a group whose next step does not fit stops reporting, where a single
attribute would keep reporting frozen values. Freezing a group (randomizing the last reported
tuple when a new one does not fit) is not offered: it would need memo slots per attribute inside
the solution's own accounting (the largest channel loss with fixed sampling, the sum with
per-step sampling, fake inputs at no cost), and with per-step sampling a newly sampled attribute
may have no memoized value to fall back on; refusing the step is the simplest rule that is sound
for every solution. A longitudinal group whose ``S`` reaches the memo sizes reserves nothing
more and is never refused again. A budget too small for even one group report is not refused
when the :class:`Device` is built: such a group is refused at its first report (a
data-independent refusal, as for memoryless attributes).

*Crash safety.* The ledger with the new reservation is written before the group state, and both
before the report objects leave :meth:`Device.report_group`: a crash can only over-count.

The report object is the single-report JSON of :mod:`wire.single_report`, what the ingest's
``POST /reports`` endpoint (``ldp ingest``) decodes::

    {"campaign": "...", "attribute": "...", "t": 7, "payload": base64(proto.encode(reports))}

``t`` defaults to the current time step :func:`wire.campaign.step_at`,
``floor(unix_time / campaign.time_step_seconds)``.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import operator
import os
import secrets
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from estimators import MemoState, MultiState
from estimators.base import FrequencyProtocol
from estimators.errors import InvalidState, LDPError
from estimators.fileio import atomic_write
from estimators.numeric.protocol import NumericProtocol
from producers.keystore import FileKeyStore, KeyStore
from wire.campaign import Campaign, CampaignError, Group, step_at
from wire.single_report import check_step, encode_single_report

log = logging.getLogger(__name__)

__all__ = ["Device", "BudgetExceeded", "IngestError", "DeviceStateError", "MemoTableFull"]

_DEVICE_FORMAT = "ldp-stream/device"
_TOL = 1e-9
_LOAD_ERRORS = (InvalidState, OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile)


class BudgetExceeded(LDPError):
    """The report would push the device's reserved privacy loss over its budget.

    Raised only on data-independent grounds (see the module docstring): nothing was memoized,
    saved or sent. ``spent`` is the reserved loss before the report, ``cost`` what it needed.
    """

    def __init__(self, attribute: str, spent: float, cost: float, budget: float,
                 detail: str | None = None) -> None:
        msg = (f"privacy budget exceeded: reporting {attribute!r} would raise the device's reserved "
               f"longitudinal loss from {spent:.4g} to {spent + cost:.4g} > budget {budget:.4g}; "
               "nothing was memoized or sent")
        super().__init__(msg if detail is None else f"{msg} ({detail})")
        self.attribute, self.spent, self.cost, self.budget = attribute, spent, cost, budget


class MemoTableFull(LDPError):
    """A memoizing attribute met a new value while its memo table is full (TreeHist: ``memo_slots / 64`` tags, one
    per distinct memoized prefix): the loss of a new memoized value could not be accounted, so the value is
    refused. Nothing was memoized, saved or sent; the values already memoized still report."""

    def __init__(self, attribute: str, capacity: int) -> None:
        super().__init__(f"the memo table of {attribute!r} is full: it holds {capacity} distinct memoized values "
                         "and a new one could not be accounted for, so it is refused (nothing was memoized or "
                         "sent; values already memoized still report; a campaign with a larger memo_slots, or "
                         "Device.reset with accept_privacy_loss=True, makes room)")
        self.attribute, self.capacity = attribute, capacity


class IngestError(LDPError):
    """The ingest endpoint did not accept a report (``status`` is None if unreachable)."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status, self.body = status, body


class DeviceStateError(LDPError):
    """A state directory (or one attribute's state in it) that does not belong to this campaign, is
    missing, or cannot be read: the device refuses to report what it cannot account for."""


def _ledger_number(v: Any, last: bool = False) -> int | float | str:
    """A count, index or last value of the ledger: an int, a float (a numeric attribute's last measurement) or,
    for a ``last`` value, a string of hex digits (a memoizing open-domain attribute's memoized report,
    :func:`_open_last`)."""
    if isinstance(v, str) and last:
        if not v or len(v) % 2 or v.strip("0123456789abcdef"):
            raise ValueError(f"a ledger string is not the hex of a report: {v!r}")
        return v
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"a ledger number is not finite: {v}")
        return v
    return int(v)


def _private_dir(path: Path) -> None:
    """Create the state directory with mode 0700, or tighten an existing one to 0700 (files are 0600)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)


def _copy_state(st: MemoState) -> MemoState:
    """A scratch copy to randomize on: the real state only changes once the budget agrees."""
    return dataclasses.replace(st, keys=st.keys.copy(), seen=st.seen.copy())


def _key_id(st: MemoState | MultiState, with_sampled: bool = False) -> str:
    """Short hash of a state's secrets (memo keys; a group's fixed sampled attribute and fake inputs):
    the ledger records it, so a memo or group file of another key is told from the device's own."""
    h = hashlib.sha256()
    if isinstance(st, MemoState):
        h.update(np.ascontiguousarray(st.keys).tobytes())
    else:
        for m in st.memos:
            h.update(b"-" if m is None else np.ascontiguousarray(m.keys).tobytes())
        for arr in (st.fake, st.sampled if with_sampled else None):
            h.update(b"-" if arr is None else np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:32]


def _open_last(proto: FrequencyProtocol, row: np.ndarray, st: MemoState) -> str:
    """What the ledger records as the last value of a memoizing open-domain attribute: the hex of the device's
    memoized report of it (``proto.memoized_outputs``: TreeHist's level, row and first GRR bucket), never the value
    nor its id. That report is randomized (ε∞-LDP), already what the server sees but for the IRR, and all a frozen
    report needs: :func:`_open_frozen` draws the IRR on top of it."""
    return bytes(np.ascontiguousarray(proto.memoized_outputs(row, st)).reshape(-1).view(np.uint8)).hex()


def _open_frozen(proto: FrequencyProtocol, last: str) -> np.ndarray:
    """A frozen report of a memoizing open-domain attribute from its recorded memoized report: the bytes
    ``proto.randomize`` gives for any value of that memoized input (one noise key drawn; with ``eps_1`` the IRR from
    words 4 and 5 of its noise slot, rejections from its extension stream, as :mod:`.treehist_kernels`)."""
    from estimators.randomness import NOISE_EXT, noise_key, rejection_limit
    from estimators.reference import Draws, noise_slots
    from estimators.sketch import treehist_kernels as tk

    if proto.name != "TreeHist":  # pragma: no cover - the only memoizing open-domain protocol so far
        raise LDPError(f"{proto.name}: no frozen report from a memoized one")
    prr = np.frombuffer(bytes.fromhex(last), dtype=np.uint8).reshape(1, -1).copy()
    lv, rw, y = proto.unpack(prr)  # InvalidReports (an LDPError) for a corrupt ledger entry
    nkey = noise_key(None)
    if proto.t2 < 1 << 53:
        slot = noise_slots(nkey, 1, tk.SLOT)[0]
        draws = Draws(nkey, NOISE_EXT, 0, slot, skip=tk.SLOT)
        y[0], _ = tk._np_grr(int(y[0]), proto.g, slot[4], slot[5], np.uint64(proto.t2),
                             rejection_limit(proto.g - 1), draws, tk.SLOT)
    return proto.pack(lv, rw, y)


def _count(st: MemoState, proto: FrequencyProtocol) -> int | float:
    """The device's distinct memoized inputs as its protocol counts them (``proto.memoized_counts``: TreeHist's
    tag table), ``inf`` for a table that overflowed (never saved by the SDK: :class:`MemoTableFull`)."""
    c = float(proto.memoized_counts(st)[0])
    return c if math.isinf(c) else int(c)


def _copy_group_state(st: MultiState) -> MultiState:
    """A scratch copy of a group's state to randomize on (the solution updates its state in place)."""
    return MultiState(st.fingerprint, None if st.sampled is None else st.sampled.copy(),
                      [None if m is None else _copy_state(m) for m in st.memos],
                      None if st.fake is None else st.fake.copy(), st.reported.copy())


class Device:
    """One device of ``campaign`` whose state lives in the directory ``state_path``.

    ``budget_eps`` is the device's lifetime longitudinal ε over all attributes (``None``: no
    limit). Memoizing attributes never stop reporting once they have reported: past the budget
    they *freeze* on the value they last reported (module docstring: the rule, its accounting and
    the bias it puts on estimates). ``ValueError`` if the budget cannot memoize even one value of
    some memoizing attribute.

    The attributes of a campaign group are reported together by :meth:`report_group` /
    :meth:`send_group` (module docstring, "Groups"); :meth:`report` refuses them.

    Randomness: a real device is never in simulation mode. Its memo keys (256 bits per attribute),
    a group's sampled attribute and fake inputs, and the noise key of every report (256 bits) come
    from the OS CSPRNG (:mod:`estimators.randomness`); the SDK takes no random generator at all.
    """

    def __init__(self, campaign: Campaign, state_path: str | Path, budget_eps: float | None = None,
                 ingest_url: str | None = None, *, timeout: float = 10.0, token: str | None = None,
                 keystore: KeyStore | None = None, retries: int = 3, backoff_seconds: float = 0.5) -> None:
        if budget_eps is not None and not budget_eps >= 0:
            raise ValueError(f"budget_eps must be >= 0 or None, got {budget_eps}")
        if budget_eps is not None:
            for name in campaign.ungrouped:
                proto = campaign.attributes[name].protocol
                first = float(proto.longitudinal_loss(1)) if proto.memo_size else 0.0
                if first > budget_eps + _TOL:
                    raise ValueError(
                        f"budget_eps={budget_eps:.4g} cannot memoize a single value of {name!r} "
                        f"({proto.name}, one memoized value costs {first:.4g}): the budget must allow "
                        "at least one memoized value of every memoizing attribute")
        self.campaign = campaign
        self.state_path = Path(state_path).expanduser()
        self.budget_eps = None if budget_eps is None else float(budget_eps)
        self.ingest_url = ingest_url
        self.timeout = timeout
        self.token = token  # the device's ingest token (`ldp tokens issue`), sent as Authorization: Bearer
        if retries < 0 or backoff_seconds < 0:
            raise ValueError(f"retries and backoff_seconds must be >= 0, got {retries} and {backoff_seconds}")
        self.retries, self.backoff_seconds = int(retries), float(backoff_seconds)  # send(): the same request again
        self.budget_plan = budget_plan(campaign, self.budget_eps)  # what the budget allows, and why
        log.info("%s", self.budget_plan)
        _private_dir(self.state_path)
        self.keystore: KeyStore = FileKeyStore(self.state_path) if keystore is None else keystore
        self._lock_fd = os.open(self.state_path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        self.states: dict[str, MemoState | None] = {}
        self.spent_reports: dict[str, int] = {}   # memoryless attribute -> reports made
        self.memo_slots: dict[str, int] = {}      # memoizing attribute -> memo slots reserved
        self.last_values: dict[str, int | float] = {}  # memoizing attribute -> value last reported
        self._clipped: dict[str, int] = {}        # numeric attribute -> values clipped to its range (this object)
        self.group_states: dict[str, MultiState] = {}  # group -> its solution's state of this device
        self.group_reports: dict[str, int] = {}   # group -> group steps reserved
        self.keyed: dict[str, str] = {}           # "a:<attr>" / "g:<group>" -> key id of a state that reported
        self.retired: dict[str, float] = {}       # scope -> loss of the keys/versions it reset (stays counted)
        self.recorded: dict[str, float] = {}      # scope -> its reserved loss at the last ledger write
        self.fingerprints: dict[str, str] = {}    # scope -> protocol/solution fingerprint (device.json)
        self._broken: dict[str, str] = {}         # scope -> why it cannot report (DeviceStateError message)
        self._changed_scopes: set[str] = set()    # scopes whose protocol/solution changed since they reported
        self._seen_files: dict[Path, tuple[int, int] | None] = {}
        with self._locked():
            self._check_or_write_identity()
            self._refresh()

    # ------------------------------------------------------------------ state files
    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    @contextmanager
    def _locked(self) -> Iterator[None]:
        if self._lock_fd < 0:
            raise LDPError("this Device is closed")
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _memo_path(self, attribute: str) -> Path:
        return self.state_path / f"{attribute}.memo.npz"

    def _group_path(self, group: str) -> Path:
        return self.state_path / f"{group}.group.npz"

    @property
    def _budget_path(self) -> Path:
        return self.state_path / "budget.json"

    @property
    def _ident_path(self) -> Path:
        return self.state_path / "device.json"

    def _scopes(self) -> dict[str, str]:
        """Every scope of the campaign (``a:<attribute>`` ungrouped, ``g:<group>``) -> its fingerprint."""
        out = {f"a:{n}": self.campaign.attributes[n].protocol.fingerprint for n in self.campaign.ungrouped}
        out.update({f"g:{g.name}": g.solution.fingerprint for g in self.campaign.groups.values()})
        return out

    def _write_identity(self, fingerprints: dict[str, str]) -> None:
        ident = {"format": _DEVICE_FORMAT, "campaign": self.campaign.id, "ledger": True,
                 "fingerprints": dict(sorted(fingerprints.items()))}
        atomic_write(self._ident_path, json.dumps(ident).encode())
        self.fingerprints = dict(fingerprints)
        self._changed(self._ident_path)

    def _read_identity(self) -> dict[str, Any]:
        try:
            old = json.loads(self._ident_path.read_text())
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
            return old
        except (OSError, ValueError) as exc:
            raise DeviceStateError(f"cannot read {self._ident_path} ({exc}): the device cannot tell which attributes "
                                   "its state belongs to; it refuses to report rather than start again with new keys "
                                   "(a new device: a new state directory and a new token)") from exc

    def _check_or_write_identity(self) -> None:
        """Check ``device.json`` (the campaign id; per-scope fingerprints, checked per attribute by :meth:`_refresh`)
        and that a ledger exists wherever state does; a new directory gets an empty ledger, then its identity."""
        state_files = sorted(p.name for pat in ("*.npz", "*.key") for p in self.state_path.glob(pat))
        if not self._ident_path.exists():
            ledger = self._load_budget_raw() if self._budget_path.exists() else {}
            used = any(ledger.get(k) for k in (*self._LEDGER, "keyed", "retired"))
            if used or state_files:
                raise DeviceStateError(
                    f"{self._ident_path} is missing but {self.state_path} holds device state "
                    f"({', '.join(state_files) or 'budget.json'}): the device cannot check which attributes it belongs "
                    "to and refuses to report; no recovery keeps the loss counted (a new device: a new state directory "
                    "and a new token)")
            if not self._budget_path.exists():  # the ledger first: device.json says that one exists
                atomic_write(self._budget_path, json.dumps(self._ledger_data()).encode())
            self._write_identity(self._scopes())
            return
        old = self._read_identity()
        if old.get("campaign") != self.campaign.id:
            raise DeviceStateError(
                f"{self.state_path} holds the state of campaign {old.get('campaign')!r}, not {self.campaign.id!r}; "
                "a device must keep its memo state for the campaign's lifetime, use another directory")
        if "fingerprints" not in old:  # an older SDK's identity: one campaign-wide fingerprint
            if old.get("fingerprint") != self.campaign.fingerprint:
                raise DeviceStateError(
                    f"{self.state_path} holds the state of campaign {old.get('campaign')!r} (fingerprint "
                    f"{old.get('fingerprint')}, written by an older SDK), not {self.campaign.fingerprint}: the "
                    "per-attribute fingerprints cannot be recovered; open it with the campaign that wrote it once")
            self._write_identity(self._scopes())
        if not self._budget_path.exists():
            raise DeviceStateError(
                f"{self._budget_path} (the privacy ledger) is missing while {self._ident_path} says it exists: the loss "
                "this device has spent is unknown, so it refuses to report; no recovery keeps the loss counted "
                "(a new device: a new state directory and a new token)")

    def _changed(self, path: Path) -> bool:
        """True if ``path`` was replaced since we last read it (atomic writes change the inode)."""
        try:
            st = os.stat(path)
            ident: tuple[int, int] | None = (st.st_ino, st.st_mtime_ns)
        except FileNotFoundError:
            ident = None
        if path in self._seen_files and self._seen_files[path] == ident:
            return False
        self._seen_files[path] = ident
        return True

    def _refresh(self) -> None:
        """Re-read whatever another Device on the same directory changed (call under the lock)."""
        meta = False
        if self._changed(self._ident_path):
            if not self._ident_path.exists():
                raise DeviceStateError(f"{self._ident_path} was removed: the device refuses to report")
            fps = self._read_identity().get("fingerprints")
            if not isinstance(fps, dict):
                raise DeviceStateError(f"{self._ident_path} has no per-attribute fingerprints")
            self.fingerprints = {str(k): str(v) for k, v in fps.items()}
            meta = True
        if self._changed(self._budget_path):
            if not self._budget_path.exists():
                raise DeviceStateError(
                    f"{self._budget_path} (the privacy ledger) was removed: the loss this device has spent is unknown, "
                    "so it refuses to report; no recovery keeps the loss counted (a new device: a new state "
                    "directory and a new token)")
            self._set_ledger(self._load_budget_raw())
            meta = True
        new = {s: fp for s, fp in self._scopes().items() if s not in self.fingerprints}
        if new:  # attributes added to the campaign: their fingerprints are recorded before any state
            self._write_identity({**self.fingerprints, **new})
        for name in self.campaign.ungrouped:
            proto = self.campaign.attributes[name].protocol
            path = self._memo_path(name)
            if self._changed(path) or meta or name not in self.states:
                self.states[name] = self._load_or_create(name, proto)
                self._changed(path)
        for group in self.campaign.groups.values():
            path = self._group_path(group.name)
            if self._changed(path) or meta or group.name not in self.group_states:
                st = self._load_or_create_group(group)
                if st is not None:
                    self.group_states[group.name] = st
                self._changed(path)

    def _used(self, scope: str) -> bool:
        """True once the scope has reported (its loss is in the ledger): its state may no longer be replaced."""
        kind, name = scope.split(":", 1)
        if scope in self.keyed:
            return True
        if kind == "a":
            return self.spent_reports.get(name, 0) > 0 or self.memo_slots.get(name, 0) > 0
        return self.group_reports.get(name, 0) > 0

    def _check_fingerprint(self, scope: str, fingerprint: str) -> bool:
        """False (and the scope marked broken) if its protocol changed after it reported; a scope that never
        reported takes the new fingerprint silently."""
        self._broken.pop(scope, None)
        self._changed_scopes.discard(scope)
        if self.fingerprints.get(scope) == fingerprint:
            return True
        if not self._used(scope):
            self._write_identity({**self.fingerprints, scope: fingerprint})
            return True
        kind, name = scope.split(":", 1)
        what = "attribute" if kind == "a" else "group"
        self._changed_scopes.add(scope)
        self._broken[scope] = (
            f"{what} {name!r} changed (protocol, domain or ε: fingerprint {self.fingerprints.get(scope)} in "
            f"{self._ident_path}, {fingerprint} in the campaign): it is a new {what} with new keys, refused until "
            f"Device.reset({name!r}{', group=True' if kind == 'g' else ''}, accept_privacy_loss=True) starts it anew; its "
            f"ε is then counted in the lifetime budget and the {self.recorded.get(scope, 0.0):.4g} the old one spent stays "
            "in the ledger")
        return False

    def _broken_file(self, scope: str, path: Path, problem: str) -> None:
        kind, name = scope.split(":", 1)
        cost = ("a fresh key whose first memoized value costs a new ε∞, counted in the lifetime budget" if kind == "a"
                else "a fresh group state (keys, sampled attribute, fake inputs) whose loss is counted again")
        self._broken[scope] = (
            f"{path} {problem}, but the ledger {self._budget_path} shows this {'attribute' if kind == 'a' else 'group'} "
            f"has reported with it: reporting with a new state would re-randomize memoized values (an averaging "
            f"attack) without counting the loss, so nothing is sent. Restore the file, or call "
            f"Device.reset({name!r}{', group=True' if kind == 'g' else ''}, accept_privacy_loss=True): {cost}")

    def _load_or_create(self, name: str, proto: FrequencyProtocol) -> MemoState | None:
        scope = f"a:{name}"
        if not self._check_fingerprint(scope, proto.fingerprint) or proto.memo_size == 0:
            return None
        path = self._memo_path(name)
        if not path.exists():
            if scope in self.keyed:
                self._broken_file(scope, path, "is missing")
                return None
            st = proto.new_state(1)  # secret key from the OS CSPRNG; recorded in the ledger at its first report
            self._save_memo(name, st, new_key=True)
            return st
        try:
            st = MemoState.load(path, fingerprint=proto.fingerprint)
            if st.n_devices != 1:
                raise InvalidState(f"{path} holds {st.n_devices} devices, a device state holds 1")
            key = self.keystore.get(self._key_name(name))
            if key is None and st.keys.any():  # an older SDK kept the key in the memo file: move it
                self._save_memo(name, st, new_key=True)
            elif key is None:
                raise InvalidState(f"its key {self._key_name(name)!r} is missing from the key store")
            else:
                if len(key) != st.keys.nbytes:
                    raise InvalidState(f"its key {self._key_name(name)!r} in the key store has {len(key)} bytes, "
                                       f"not {st.keys.nbytes}")
                st.keys = np.frombuffer(key, dtype="<u4").astype(np.uint32).reshape(st.keys.shape)
        except _LOAD_ERRORS as exc:
            self._broken_file(scope, path, f"cannot be used ({type(exc).__name__}: {exc})")
            return None
        if scope in self.keyed and self.keyed[scope] != _key_id(st):
            self._broken_file(scope, path, "holds another key than the one the ledger recorded")
            return None
        return st

    @staticmethod
    def _key_name(attribute: str) -> str:
        return f"memo.{attribute}"

    def _save_memo(self, name: str, st: MemoState, new_key: bool = False) -> None:
        """Write a memo state: its key through the key store (``new_key``: first), the bitset to the memo file."""
        if new_key:
            self.keystore.put(self._key_name(name), st.keys.astype("<u4").tobytes())
        dataclasses.replace(st, keys=np.zeros_like(st.keys)).save(self._memo_path(name))

    def _load_or_create_group(self, group: Group) -> MultiState | None:
        scope = f"g:{group.name}"
        self.group_states.pop(group.name, None)
        if not self._check_fingerprint(scope, group.solution.fingerprint):
            return None
        path = self._group_path(group.name)
        if not path.exists():
            if scope in self.keyed:
                self._broken_file(scope, path, "is missing")
                return None
            st = group.solution.new_state(1)  # keys, sampled attribute, fake inputs from the OS CSPRNG
            st.save(path)
            return st
        try:
            st = MultiState.load(path, solution=group.solution)  # checks the solution's fingerprint
            if st.n_devices != 1:
                raise InvalidState(f"{path} holds {st.n_devices} devices, a device state holds 1")
        except _LOAD_ERRORS as exc:
            self._broken_file(scope, path, f"cannot be used ({type(exc).__name__}: {exc})")
            return None
        if scope in self.keyed and self.keyed[scope] != self._group_key_id(group.name, st):
            self._broken_file(scope, path, "holds other keys or another sampled attribute than the ledger recorded")
            return None
        return st

    def _group_key_id(self, group: str, st: MultiState) -> str:
        return _key_id(st, with_sampled=self.campaign.groups[group].solution.sampling == "fixed")

    def _usable(self, scope: str) -> None:
        """Raise :class:`DeviceStateError` (nothing randomized, saved or sent) if the scope cannot report."""
        if scope in self._broken:
            raise DeviceStateError(self._broken[scope])

    _LEDGER = ("spent_reports", "memo_slots", "last_values", "group_reports")

    def _load_budget_raw(self) -> dict[str, Any]:
        path = self._budget_path
        try:
            data = json.loads(path.read_text())
            out: dict[str, Any] = {key: {str(k): _ledger_number(v, key == "last_values")
                                         for k, v in data.get(key, {}).items()}
                                   for key in self._LEDGER}
            out["keyed"] = {str(k): str(v) for k, v in data.get("keyed", {}).items()}
            out["retired"] = {str(k): float(v) for k, v in data.get("retired", {}).items()}
            out["recorded"] = {str(k): float(v) for k, v in data.get("recorded", {}).items()}
            return out
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DeviceStateError(f"cannot read {path} (the privacy ledger): {exc}; the device refuses to report "
                                   "(the loss it has spent is unknown)") from exc

    def _set_ledger(self, data: dict[str, Any]) -> None:
        self.spent_reports, self.memo_slots, self.last_values, self.group_reports = (
            dict(data[k]) for k in self._LEDGER)
        self.keyed, self.retired, self.recorded = dict(data["keyed"]), dict(data["retired"]), dict(data["recorded"])

    def _ledger_data(self) -> dict[str, Any]:
        return {"campaign": self.campaign.id, "spent_reports": self.spent_reports, "memo_slots": self.memo_slots,
                "last_values": self.last_values, "group_reports": self.group_reports, "keyed": self.keyed,
                "retired": self.retired, "recorded": self.recorded}

    def _save_budget(self, spent: dict[str, int] | None = None, slots: dict[str, int] | None = None,
                     last: dict[str, int] | None = None, groups: dict[str, int] | None = None,
                     keyed: dict[str, str] | None = None, retired: dict[str, float] | None = None) -> None:
        """Write the ledger (the parts not given are kept) and make it this object's view; each scope's
        reserved loss is recorded too, so it stays counted once the scope is removed or changed."""
        old = self._ledger_data()
        for key, val in zip((*self._LEDGER, "keyed", "retired"), (spent, slots, last, groups, keyed, retired)):
            if val is not None:
                setattr(self, key, dict(val))
        rec = dict(self.recorded)
        for scope in self._scopes():
            if scope not in self._changed_scopes:
                kind, name = scope.split(":", 1)
                rec[scope] = self._attr_reserved(name) if kind == "a" else self._group_reserved(name)
        self.recorded = rec
        data = self._ledger_data()
        if data == old and self._budget_path.exists():
            return
        atomic_write(self._budget_path, json.dumps(data).encode())
        self._changed(self._budget_path)

    # ------------------------------------------------------------------ accounting
    def _own(self, attribute: str) -> FrequencyProtocol:
        """The protocol of an attribute reported on its own (not by a group's solution)."""
        attr = self.campaign.attribute(attribute)  # CampaignError for an unknown attribute
        if attr.group is not None:
            sol = self.campaign.groups[attr.group].solution
            raise LDPError(f"attribute {attribute!r} is randomized with the other attributes of group "
                           f"{attr.group!r} ({sol.name}, one budget over the group): use "
                           f"Device.report_group({attr.group!r}, values) or send_group")
        return attr.protocol

    def _group(self, group: str) -> Group:
        try:
            return self.campaign.groups[group]
        except KeyError:
            have = ", ".join(map(repr, self.campaign.groups)) or "none"
            raise CampaignError(f"campaign {self.campaign.id!r} has no group {group!r} (groups: {have})") from None

    def _group_steps(self, group: str) -> int:
        """Group steps reserved (at least the real reports of any attribute in the state, a lower bound)."""
        st = self.group_states.get(group)
        if st is None:  # broken: the ledger alone
            return self.group_reports.get(group, 0)
        return max(self.group_reports.get(group, 0), int(st.reported.max()) if st.reported.size else 0)

    def _group_bound(self, group: str, steps: int) -> float:
        """Reserved loss of ``steps`` group steps (module docstring): schedule only."""
        sol = self.campaign.groups[group].solution
        if steps <= 0:
            return 0.0
        if sol.longitudinal:
            return float(sol.loss_bound(steps))
        return steps * float(sol.eps_first)

    def _group_reserved(self, group: str) -> float:
        """Reserved loss of a group's current state and version, plus what its resets retired."""
        return self._version_reserved(f"g:{group}") + self.retired.get(f"g:{group}", 0.0)

    def _version_reserved(self, scope: str) -> float:
        """Reserved loss of a scope's current key and version (a changed one: what the ledger recorded)."""
        kind, name = scope.split(":", 1)
        if scope in self._changed_scopes:
            return self.recorded.get(scope, 0.0) - self.retired.get(scope, 0.0)
        if kind == "g":
            return self._group_bound(name, self._group_steps(name))
        proto = self.campaign.attribute(name).protocol
        if proto.memo_size == 0:
            return self.spent_reports.get(name, 0) * float(proto.eps_first)
        return float(proto.longitudinal_loss(self._slots(name)))

    def _group_loss(self, group: str) -> float:
        """Actual loss of a group (value-dependent for longitudinal solutions: never decide on it visibly)."""
        sol = self.campaign.groups[group].solution
        st = self.group_states.get(group)
        if sol.longitudinal and st is not None and f"g:{group}" not in self._broken:
            return float(sol.longitudinal_loss(st)[0]) + self.retired.get(f"g:{group}", 0.0)
        return self._group_reserved(group)

    def _attr_loss(self, name: str, memoized: int | None = None, spent: int | None = None) -> float:
        """Actual longitudinal loss of one attribute (value-dependent: never decide on it visibly)."""
        proto = self.campaign.attribute(name).protocol
        st = self.states.get(name)
        if f"a:{name}" in self._broken:  # the memo cannot be read: its reservation bounds it
            return self._attr_reserved(name)
        retired = self.retired.get(f"a:{name}", 0.0)
        if st is None:
            reports = self.spent_reports.get(name, 0) if spent is None else spent
            return reports * float(proto.eps_first) + retired
        m = _count(st, proto) if memoized is None else memoized
        return float(proto.longitudinal_loss(m)) + retired

    def _slots(self, name: str) -> int:
        """Memo slots of a memoizing attribute (at least its memoized count: older state dirs)."""
        st = self.states.get(name)
        if st is None:
            return self.memo_slots.get(name, 0)
        count = _count(st, self.campaign.attribute(name).protocol)  # inf: no tag table, refused when it reports
        return self.memo_slots.get(name, 0) if math.isinf(count) else max(self.memo_slots.get(name, 0), count)

    def _attr_reserved(self, name: str) -> float:
        """Reserved loss of one attribute: depends on the schedule only (and what its resets retired)."""
        return self._version_reserved(f"a:{name}") + self.retired.get(f"a:{name}", 0.0)

    def _reserved(self, attribute: str | None = None, group: str | None = None) -> float:
        if attribute is not None:
            return self._attr_reserved(attribute)
        if group is not None:
            return self._group_reserved(group)
        return float(sum(self._attr_reserved(n) for n in self.campaign.ungrouped)
                     + sum(self._group_reserved(g) for g in self.campaign.groups) + self._gone_loss())

    def _gone_loss(self) -> float:
        """Loss of the attributes and groups the campaign no longer has: stays counted, as the ledger recorded it."""
        scopes = self._scopes()
        return float(sum(v for k, v in self.recorded.items() if k not in scopes))

    def _fits(self, spent: float, cost: float) -> bool:
        return self.budget_eps is None or spent + cost <= self.budget_eps + _TOL

    def _slot_cost(self, name: str, slots: int) -> float | None:
        """Reserved loss one more memo slot adds (``None``: the attribute has all its slots)."""
        proto = self.campaign.attribute(name).protocol
        if slots >= proto.memo_size:
            return None
        return float(proto.longitudinal_loss(slots + 1)) - float(proto.longitudinal_loss(slots))

    def _check_scope(self, attribute: str | None, group: str | None) -> None:
        if attribute is not None and group is not None:
            raise LDPError("give an attribute or a group, not both")
        if attribute is not None:
            self._own(attribute)
        if group is not None:
            self._group(group)

    def privacy_loss(self, attribute: str | None = None, *, group: str | None = None) -> float:
        """Longitudinal ε actually spent so far: one ungrouped attribute, one group, or the sum over
        the ungrouped attributes and the groups."""
        self._check_scope(attribute, group)
        with self._locked():
            self._refresh()
        return self._loss(attribute, group)

    def _loss(self, attribute: str | None = None, group: str | None = None) -> float:
        if attribute is not None:
            return self._attr_loss(attribute)
        if group is not None:
            return self._group_loss(group)
        return float(sum(self._attr_loss(n) for n in self.campaign.ungrouped)
                     + sum(self._group_loss(g) for g in self.campaign.groups) + self._gone_loss())

    def reserved_loss(self, attribute: str | None = None, *, group: str | None = None) -> float:
        """Longitudinal ε reserved so far (>= :meth:`privacy_loss`, <= ``budget_eps``), scoped as
        :meth:`privacy_loss`."""
        self._check_scope(attribute, group)
        with self._locked():
            self._refresh()
        return self._reserved(attribute, group)

    def group_steps(self, group: str) -> int:
        """Group steps reserved so far by ``group``: one per :meth:`report_group` call that was not refused."""
        self._group(group)
        with self._locked():
            self._refresh()
        return self._group_steps(group)

    def remaining_budget(self) -> float:
        """``budget_eps - reserved_loss()``: what new reservations may still use (``inf`` without a budget)."""
        return float("inf") if self.budget_eps is None else self.budget_eps - self.reserved_loss()

    def memoized_count(self, attribute: str) -> int:
        """Distinct memoized inputs of ``attribute`` (0 for memoryless protocols)."""
        self._own(attribute)
        with self._locked():
            self._refresh()
            self._usable(f"a:{attribute}")
        st = self.states[attribute]
        return 0 if st is None else _count(st, self.campaign.attribute(attribute).protocol)

    def last_value(self, attribute: str) -> int | float | str | None:
        """The value the last report of a memoizing attribute randomized (what it freezes on); for a memoizing
        open-domain attribute (TreeHist) the hex of its memoized report of that value, not the value."""
        self._own(attribute)
        with self._locked():
            self._refresh()
        return self.last_values.get(attribute)

    def frozen(self, attribute: str) -> bool:
        """True if the next report of a value ``attribute`` has not memoized would be frozen.

        Always False for memoryless attributes (they are refused, not frozen) and for an attribute
        that has memoized all its ``memo_size`` inputs (every value is then already memoized).
        This is local knowledge: the server sees the same reports either way.
        """
        self._own(attribute)
        with self._locked():
            self._refresh()
            self._usable(f"a:{attribute}")
        st = self.states[attribute]
        if st is None:
            return False
        proto = self.campaign.attribute(attribute).protocol
        count, slots = _count(st, proto), self._slots(attribute)
        if count >= proto.memo_size:
            return False
        grow = self._slot_cost(attribute, slots)
        if count >= slots and (grow is None or not self._fits(self._reserved(), grow)):
            return True
        new_cost = float(proto.longitudinal_loss(count + 1)) - float(proto.longitudinal_loss(count))
        return not self._fits(self._loss(), new_cost)

    # ------------------------------------------------------------------ recovery
    def reset(self, name: str, *, group: bool = False, accept_privacy_loss: bool = False) -> float:
        """Start an attribute (``group=True``: a group) anew: a fresh key / group state from the OS CSPRNG.

        The only way past a :class:`DeviceStateError` of one attribute (its memo or group file lost,
        truncated or foreign, or its protocol changed). Its new key re-randomizes values the server has
        seen under the old one, so the loss is counted: everything the attribute reserved stays in the
        ledger, and the fresh key's first memo slot (ε∞; for a group, its first step: the new state's
        worst case, the new sampled attribute's channel included) is reserved at once. Returns the
        device's reserved loss after the reset. ``accept_privacy_loss`` must be True.
        """
        if accept_privacy_loss is not True:
            raise ValueError("reset starts the attribute anew with a fresh key and counts its loss again: "
                             "pass accept_privacy_loss=True")
        if group:
            g = self._group(name)
            scope, fingerprint = f"g:{name}", g.solution.fingerprint
        else:
            proto = self._own(name)
            scope, fingerprint = f"a:{name}", proto.fingerprint
        with self._locked():
            self._refresh()
            retired = dict(self.retired, **{scope: self._version_reserved(scope) + self.retired.get(scope, 0.0)})
            self._changed_scopes.discard(scope)
            self._broken.pop(scope, None)
            keyed = dict(self.keyed)
            keyed.pop(scope, None)
            if group:
                st = g.solution.new_state(1)
                st.save(self._group_path(name))  # the state first: until the ledger names it, it is refused
                self.group_states[name] = st
                self._changed(self._group_path(name))
                keyed[scope] = self._group_key_id(name, st)
                self._save_budget(groups=dict(self.group_reports, **{name: 1}), keyed=keyed, retired=retired)
            elif proto.memo_size:
                mst = proto.new_state(1)
                self._save_memo(name, mst, new_key=True)
                self.states[name] = mst
                self._changed(self._memo_path(name))
                keyed[scope] = _key_id(mst)
                last = {k: v for k, v in self.last_values.items() if k != name}
                self._save_budget(slots=dict(self.memo_slots, **{name: 1}), last=last, keyed=keyed, retired=retired)
            else:
                self.states[name] = None
                self._save_budget(spent=dict(self.spent_reports, **{name: 0}), keyed=keyed, retired=retired)
            if self.fingerprints.get(scope) != fingerprint:  # last: a crash before it leaves the scope refused
                self._write_identity({**self.fingerprints, scope: fingerprint})
            return self._reserved()

    # ------------------------------------------------------------------ reporting
    def current_step(self) -> int:
        """The time step of the current time (:func:`wire.campaign.step_at`)."""
        return step_at(self.campaign)

    def value_index(self, attribute: str, value: int | str) -> int:
        """The domain index of ``value``: an index in ``[0, k)`` or one of the attribute's labels (the campaign's
        ``labels``); :class:`LDPError` otherwise."""
        a = self.campaign.attribute(attribute)
        if a.open_domain:
            raise LDPError(f"attribute {attribute!r} is open-domain ({a.value_type}): its values have no domain index "
                           f"(report the value itself: Device.value_id)")
        if isinstance(value, str):
            if value in a.labels:
                return a.labels.index(value)
            if not a.labels:
                raise LDPError(f"attribute {attribute!r} has no labels in campaign {self.campaign.id!r}: send an index "
                               f"in [0, {a.k}), not {value!r}")
            shown = ", ".join(map(repr, a.labels[:8])) + (", ..." if len(a.labels) > 8 else "")
            raise LDPError(f"{value!r} is not a label of {attribute!r} (labels: {shown})")
        try:
            v = operator.index(value)
        except TypeError:
            raise LDPError(f"value {value!r} of {attribute!r} must be an index or a label") from None
        if not 0 <= v < a.k:
            raise LDPError(f"value {v} of {attribute!r} is outside the domain [0, {a.k})")
        return v

    def value_id(self, attribute: str, value: str | int) -> int:
        """An open-domain attribute's value as its 64-bit id (``type = "string"``: a ``str``, the first 8 bytes of
        its SHA-256; ``"u64"``: an ``int`` in ``[0, 2^64)``, itself); :class:`LDPError` otherwise."""
        a = self.campaign.attribute(attribute)
        if not a.open_domain:
            raise LDPError(f"attribute {attribute!r} is not open-domain (type {a.value_type!r})")
        return a.value_id(value)  # a CampaignError (an LDPError) for a value of another type

    def numeric_value(self, attribute: str, value: float) -> float:
        """A numeric attribute's measurement as a float: a finite number (outside the range it is clipped to the
        nearest end when randomized, and counted: :meth:`clipped`); :class:`LDPError` otherwise."""
        if isinstance(value, (bool, str)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise LDPError(f"value {value!r} of numeric attribute {attribute!r} must be a number")
        v = float(value)
        if not math.isfinite(v):
            raise LDPError(f"value {value!r} of numeric attribute {attribute!r} is not a finite number")
        return v

    def clipped(self, attribute: str) -> int:
        """How many values of numeric ``attribute`` this Device object clipped to the range before randomizing
        them (kept on the device: the server never learns which reports were clipped)."""
        return self._clipped.get(attribute, 0)

    def _input(self, attribute: str, value: int | float | str) -> np.ndarray:
        """One value as the protocol's input row: a domain index (categorical), a float (numeric) or a 64-bit value
        id (open-domain, hashed here: the raw value goes no further)."""
        self._own(attribute)
        if self.campaign.attributes[attribute].open_domain:
            return np.array([self.value_id(attribute, value)], dtype=np.uint64)  # type: ignore[arg-type]
        if isinstance(self._own(attribute), NumericProtocol):
            return np.array([self.numeric_value(attribute, value)], dtype=np.float64)  # type: ignore[arg-type]
        return np.array([self.value_index(attribute, value)], dtype=np.int64)

    def _count_clipped(self, attribute: str, row: np.ndarray) -> None:
        """Count a numeric value outside the range once its report is made (a refused report counts nothing)."""
        proto = self._own(attribute)
        if isinstance(proto, NumericProtocol) and proto.clipped(row)[0]:
            self._clipped[attribute] = self._clipped.get(attribute, 0) + 1

    def randomize(self, attribute: str, value: int | float | str) -> np.ndarray:
        """Randomize one value (reports array of one row), enforcing and recording the budget.

        A memoizing attribute past its budget randomizes its last reported value instead of
        ``value`` (module docstring); :class:`BudgetExceeded` only on data-independent grounds.
        """
        proto = self._own(attribute)
        row = self._input(attribute, value)
        reports = self._randomize_row(attribute, proto, row)
        self._count_clipped(attribute, row)
        return reports

    def _randomize_row(self, attribute: str, proto: FrequencyProtocol, row: np.ndarray) -> np.ndarray:
        with self._locked():
            self._refresh()
            self._usable(f"a:{attribute}")  # a memo the ledger says reported, missing or foreign: nothing sent
            st = self.states[attribute]
            reserved = self._reserved()
            if st is None:
                cost = float(proto.eps_first)
                if not self._fits(reserved, cost):
                    raise BudgetExceeded(attribute, reserved, cost, self.budget_eps or 0.0)
                reports = proto.randomize(row, None, state=None)
                n_spent = self.spent_reports.get(attribute, 0) + 1
                # spend first: a crash may over-count, never under-count
                self._save_budget(spent=dict(self.spent_reports, **{attribute: n_spent}))
                return reports
            return self._randomize_memoized(attribute, proto, st, row, reserved)

    def _randomize_memoized(self, attribute: str, proto: FrequencyProtocol, st: MemoState, row: np.ndarray,
                            reserved: float) -> np.ndarray:
        if math.isinf(_count(st, proto)):  # no tag table (an earlier release's slot bitset): nothing to account on
            raise DeviceStateError(
                f"the memo state of {attribute!r} in {self._memo_path(attribute)} cannot be accounted (it is no "
                f"{proto.name} memo tag table: a memo state of an earlier release); nothing was sent. "
                f"Device.reset({attribute!r}, accept_privacy_loss=True) starts it anew with its loss counted")
        count, slots = _count(st, proto), self._slots(attribute)
        # 1. reserve one more memo slot: decided on the schedule alone
        grow = self._slot_cost(attribute, slots)
        can_grow = grow is not None and self._fits(reserved, grow)
        if slots == 0 and not can_grow:
            raise BudgetExceeded(attribute, reserved, grow if grow is not None else float("inf"),
                                 self.budget_eps or 0.0)
        new_slots = dict(self.memo_slots, **{attribute: slots + 1 if can_grow else slots})
        keyed = dict(self.keyed, **{f"a:{attribute}": _key_id(st)})  # in the ledger before the first report leaves
        # 2. the value itself, if it is memoized or may be memoized now
        trial = _copy_state(st)
        reports = proto.randomize(row, None, state=trial)
        opened = self.campaign.attributes[attribute].open_domain
        # the value as the ledger records it: an index, a numeric measurement, or an open-domain attribute's
        # memoized report (never the value or its id: _open_last)
        v = _open_last(proto, row, trial) if opened else row[0].item()
        if _count(trial, proto) == count:  # already memoized: its PRR is reused, nothing spent
            self._save_budget(slots=new_slots, last=dict(self.last_values, **{attribute: v}), keyed=keyed)
            return reports
        new_cost = float(proto.longitudinal_loss(count + 1)) - float(proto.longitudinal_loss(count))
        if count < new_slots[attribute] and self._fits(self._loss(), new_cost):
            if math.isinf(_count(trial, proto)):  # a new value the memo table cannot account for: refused
                raise MemoTableFull(attribute, getattr(proto, "memo_tags", proto.memo_size))
            self._save_budget(slots=new_slots, keyed=keyed)  # reserve first: a crash may over-count only
            self._save_memo(attribute, trial)
            self.states[attribute] = trial
            self._changed(self._memo_path(attribute))
            self._save_budget(last=dict(self.last_values, **{attribute: v}))
            return reports
        # 3. frozen: randomize the last reported value (memoized) instead of the new one
        last = self.last_values.get(attribute)
        if last is None:
            raise BudgetExceeded(attribute, reserved, new_cost, self.budget_eps or 0.0,
                                 detail="no recorded last value to freeze on: state from an older SDK")
        if opened:  # the memoized report of the last value, the IRR drawn on top: nothing memoized
            reports = _open_frozen(proto, str(last))
            self._save_budget(slots=new_slots, keyed=keyed)
            return reports
        trial = _copy_state(st)
        reports = proto.randomize(np.array([last], dtype=row.dtype), None, state=trial)
        if _count(trial, proto) != count:
            raise DeviceStateError(f"the last value of {attribute!r} in {self._budget_path} is not memoized "
                                   f"in {self._memo_path(attribute)}: the state directory is inconsistent")
        self._save_budget(slots=new_slots, keyed=keyed)
        return reports

    def report(self, attribute: str, value: int | float | str, t: int | None = None) -> dict[str, Any]:
        """The JSON object of one randomized report (:func:`wire.single_report.encode_single_report`); ``value``: an
        index or a label, a numeric attribute's measurement, or an open-domain attribute's ``str`` / ``int``."""
        self._own(attribute)  # an unknown or grouped attribute fails before anything is spent
        step = check_step(self.current_step() if t is None else t)
        reports = self.randomize(attribute, value)
        return encode_single_report(self.campaign, attribute, step, reports)

    def send(self, attribute: str, value: int | float | str, t: int | None = None) -> dict[str, Any]:
        """Randomize one report (``value``: as :meth:`report`) and POST it to :attr:`ingest_url`; returns the
        endpoint's JSON reply.

        The report is randomized once. The request carries one ``Idempotency-Key`` (128 random bits) and is
        sent again with the same key and the same bytes after a dropped connection, a 5xx answer or 409
        ``request_in_progress``, up to :attr:`retries` more times with exponential backoff from
        :attr:`backoff_seconds`: the ingest counts it once, and the device never randomizes the value again (a
        second randomization of one value would be an averaging attack on itself). Any other refusal raises
        :class:`IngestError` at once."""
        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        obj = self.report(attribute, value, t)
        return self._post(obj)

    # ------------------------------------------------------------------ groups
    def _group_values(self, group: Group, values: Mapping[str, int | str] | Sequence[int | str]) -> np.ndarray:
        """The device's tuple, ``int64 (1, d)`` in the solution's attribute order; clear errors otherwise."""
        names = group.attributes
        if isinstance(values, Mapping):
            unknown = [str(a) for a in values if a not in names]
            missing = [a for a in names if a not in values]
            if unknown or missing:
                raise LDPError(f"group {group.name!r} reports the attributes {list(names)}: "
                               + "; ".join(([f"unknown {unknown}"] if unknown else [])
                                           + ([f"missing {missing}"] if missing else [])))
            row = [values[a] for a in names]
        elif isinstance(values, (Sequence, np.ndarray)) and not isinstance(values, (str, bytes)):
            row = list(values)
            if len(row) != len(names):
                raise LDPError(f"group {group.name!r} needs {len(names)} values (for {list(names)}), got {len(row)}")
        else:
            raise LDPError(f"values of group {group.name!r} must be a dict {{attribute: value}} or a sequence in "
                           f"the order {list(names)}, got {type(values).__name__}")
        out = np.empty((1, len(names)), dtype=np.int64)
        for j, (name, v) in enumerate(zip(names, row)):
            out[0, j] = self.value_index(name, v)
        return out

    def report_group(self, group: str, values: Mapping[str, int | str] | Sequence[int | str],
                     t: int | None = None) -> list[dict[str, Any]]:
        """Randomize the device's tuple through the group's solution and return one report object per
        attribute the solution sends (SMP, L-SMP, ALLOMFREE: the sampled one; SPL, L-SPL, RS+FD,
        L-RS+FD: every attribute), in the group's attribute order.

        ``values``: ``{attribute: value}`` for every attribute of the group, or a sequence in the
        group's order. One group step is reserved first: :class:`BudgetExceeded` (nothing
        randomized, saved or sent) if it does not fit (module docstring, "Groups").
        """
        g = self._group(group)
        v = self._group_values(g, values)
        step = check_step(self.current_step() if t is None else t)
        with self._locked():
            self._refresh()
            self._usable(f"g:{group}")
            steps = self._group_steps(group)
            reserved = self._reserved()
            cost = self._group_bound(group, steps + 1) - self._group_bound(group, steps)
            if not self._fits(reserved, cost):
                raise BudgetExceeded(group, reserved, cost, self.budget_eps or 0.0,
                                     detail=f"group {group!r} ({g.solution.name}): one more group step reserves "
                                            f"its worst-case loss")
            trial = _copy_group_state(self.group_states[group])
            out = g.solution.randomize(v, None, state=trial)  # rng=None: OS CSPRNG / ChaCha20 streams
            objs = [encode_single_report(self.campaign, name, step, out.reports[j])
                    for j, name in enumerate(g.attributes) if len(out.reports[j])]
            # reserve first: a crash may over-count, never under-count
            self._save_budget(groups=dict(self.group_reports, **{group: steps + 1}),
                              keyed=dict(self.keyed, **{f"g:{group}": self._group_key_id(group, trial)}))
            trial.save(self._group_path(group))
            self.group_states[group] = trial
            self._changed(self._group_path(group))
        return objs

    def send_group(self, group: str, values: Mapping[str, int | str] | Sequence[int | str],
                   t: int | None = None) -> dict[str, Any]:
        """:meth:`report_group` and POST its report objects to :attr:`ingest_url` as one request (the
        ingest is all-or-nothing per request: the server never counts part of a step's tuple)."""
        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        objs = self.report_group(group, values, t)
        return self._post(objs)

    def send_binary(self, objs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """POST report objects (from :meth:`report` / :meth:`report_group`, possibly several collected) as one
        compact binary body (``application/x-ldp-reports``, ``docs/wire-format.md``): the same reports as raw
        bytes (about 40% smaller than their JSON, no JSON parse at the ingest), in one request that the
        ingest accepts or refuses whole.
        Each object is checked first as the server will check it (:class:`~wire.errors.EnvelopeError`)."""
        from wire.compact import encode_compact
        from wire.single_report import decode_single_report

        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        items = [objs] if isinstance(objs, Mapping) else list(objs)
        campaigns = {self.campaign.id: self.campaign}
        body = encode_compact([decode_single_report(dict(o), campaigns) for o in items])
        return self._post(body)

    def _post(self, body: Any) -> dict[str, Any]:
        """:func:`post_report` to :attr:`ingest_url`, with the device's token if it has one, one idempotency key
        and the retries of :meth:`send`."""
        key = secrets.token_hex(16)
        for attempt in range(self.retries + 1):
            try:
                return post_report(self.ingest_url, body, timeout=self.timeout, idempotency_key=key,
                                   **({"token": self.token} if self.token else {}))
            except IngestError as exc:
                if attempt == self.retries or not _retryable(exc):
                    raise
                log.info("report request failed (%s); sending the same request again (attempt %d of %d)",
                         exc, attempt + 2, self.retries + 1)
                time.sleep(self.backoff_seconds * (2 ** attempt))
        raise AssertionError("unreachable")  # pragma: no cover


def budget_plan(campaign: Campaign, budget_eps: float | None) -> str:
    """What a lifetime budget allows on ``campaign``'s attributes, and why (logged when a :class:`Device` is built):
    the cost of each memoizing attribute's first and further memo slots, how many values it could memoize alone,
    what each memoryless report costs, and how many values the budget memoizes when every memoizing attribute
    reports in turn (slots are reserved by reports, not by value changes: module docstring)."""
    if budget_eps is None:
        return "no lifetime budget: every memoizing attribute memoizes up to its memo_size values"
    lines = [f"lifetime budget ε = {budget_eps:g}:"]
    memoizing: list[tuple[str, FrequencyProtocol]] = []
    for name in campaign.ungrouped:
        proto = campaign.attributes[name].protocol
        if not proto.memo_size:
            lines.append(f"  {name} ({proto.name}, memoryless): every report spends ε1 = {float(proto.eps_first):.4g}")
            continue
        memoizing.append((name, proto))
        first = float(proto.longitudinal_loss(1))
        alone = max((m for m in range(1, proto.memo_size + 1) if float(proto.longitudinal_loss(m)) <= budget_eps + _TOL),
                    default=0)
        more = float(proto.longitudinal_loss(2)) - first if proto.memo_size > 1 else 0.0
        lines.append(f"  {name} ({proto.name}): its first memoized value reserves {first:.4g}, each further one "
                     f"{more:.4g}; alone in the budget it could memoize {alone} of its {proto.memo_size} possible inputs")
    for g in campaign.groups.values():
        lines.append(f"  group {g.name} ({g.solution.name}): every group step reserves its solution's worst-case loss")
    if memoizing:
        slots = {name: 0 for name, _ in memoizing}
        reserved, open_ = 0.0, [name for name, _ in memoizing]
        protos = dict(memoizing)
        while open_:
            for name in list(open_):
                p, m = protos[name], slots[name]
                cost = float(p.longitudinal_loss(m + 1)) - float(p.longitudinal_loss(m)) if m < p.memo_size else math.inf
                if reserved + cost > budget_eps + _TOL:
                    open_.remove(name)
                    continue
                reserved, slots[name] = reserved + cost, m + 1
        lines.append("  reporting in turn, the memoizing attributes memoize " + ", ".join(f"{n} {slots[n]}" for n in slots)
                     + f" value(s) ({sum(slots.values())} reports reserve {reserved:.4g}); every report of a memoizing "
                       "attribute reserves a slot whether or not its value changed, and an attribute whose slots are "
                       "used freezes on its last value (reports go on)")
    return "\n".join(lines)


def _retryable(exc: IngestError) -> bool:
    """A failure after which the same request may be sent again: no answer, a 5xx, or 409 (the first attempt
    still in progress at the ingest)."""
    return exc.status is None or exc.status >= 500 or exc.status == 409


def post_report(url: str, obj: dict[str, Any] | list[dict[str, Any]] | bytes, timeout: float = 10.0, *,
                token: str | None = None, idempotency_key: str | None = None) -> dict[str, Any]:
    """POST one report object (or a list of them, one request) as JSON, or ``bytes``: a compact binary body
    (:meth:`Device.send_binary`); raises :class:`IngestError` unless the reply is 2xx. ``token``: the device
    token (``Authorization: Bearer``); ``idempotency_key``: reuse it when retrying the same request (the
    ingest then answers the first answer and counts the reports once)."""
    from wire.compact import CONTENT_TYPE

    binary = isinstance(obj, (bytes, bytearray))
    req = urllib.request.Request(url, data=bytes(obj) if binary else json.dumps(obj).encode(), method="POST",
                                 headers={"Content-Type": CONTENT_TYPE if binary else "application/json",
                                          "Accept": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {}),
                                          **({"Idempotency-Key": idempotency_key} if idempotency_key else {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read().decode("utf-8", "replace")
            status = resp.status
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        raise IngestError(f"ingest endpoint {url} rejected the report: HTTP {exc.code}: {body[:500]}",
                          exc.code, body) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise IngestError(f"cannot reach ingest endpoint {url}: {reason}") from None
    try:
        return json.loads(body) if body.strip() else {"status": status}
    except ValueError:
        return {"status": status, "body": body}
