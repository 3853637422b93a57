"""The device: one real device's randomizers, memo state and lifetime privacy budget (``producers/sdk.py``'s
``Device``, with the standard library and ``cryptography`` only).

```python
from ldp_device import Campaign, Device

dev = Device(Campaign.load("deploy/campaigns/demo.toml"), "~/.ldp-device", budget_eps=20.0,
             ingest_url="http://127.0.0.1:8080/reports", token=TOKEN)   # `ldp ingest`, `ldp tokens issue`
print(dev.budget_plan)                # what the budget memoizes, and why
dev.send("app_version", 42)           # randomize locally, POST one report (retried with one Idempotency-Key)
dev.send("opt_in", "yes")             # a label of the campaign instead of an index
obj = dev.report("crash_minute", 95, t=7)   # or build the JSON object and send it yourself
dev.send_group("device", {"dark_mode": "on", "country": 3, "device_model": 17})   # a [[groups]] solution
dev.send("session_seconds", 312.5)    # a numeric attribute (type = "numeric"): a measurement, clipped to its range
dev.send("crash_signature", "NullPointerException@Foo.java:42")   # type = "string": any string (hashed here)
```

An open-domain attribute (``type = "string"`` or ``"u64"``) takes a ``str`` or an integer in ``[0, 2^64)``: the
device computes its id (:func:`ldp_device.sketch.value_id`) and randomizes the id with the attribute's protocol
(CMS, HCMS: memoryless, each report spends ``eps_first``; TreeHist: memoizing, one ε∞ per newly marked memo slot);
only the report leaves the device. The ledger records the number of reports of a memoryless attribute, and for
TreeHist the hex of the memoized report of its last value (what a frozen report is drawn from), never the value or
its id; its memo file holds the memo key and the seen-slot bitset.

Randomness: every memo key, a group's sampled attribute and fake inputs, and the noise key of every report
(256 bits each) come from the OS CSPRNG (:func:`secrets.token_bytes`); a device takes no seed and no key source.
The ledger rules are :mod:`ldp_device.ledger`'s; the state directory :mod:`ldp_device.state`'s.

Device state fails closed: the ledger records the id of an attribute's (a group's) key before the first
report that uses it leaves the SDK; a memo or group file the ledger names that is missing, unreadable or holds
another key makes that attribute refuse (:class:`DeviceStateError`) until
``reset(name, accept_privacy_loss=True)``, which starts it anew and keeps the old key's loss counted; a lost
ledger or identity next to existing state refuses the whole device. An attribute whose protocol changed after
it reported is a new attribute: refused until :meth:`Device.reset`.
"""
from __future__ import annotations

import base64
import hashlib
import json
import operator
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import MemoState, Protocol
from .campaign import Campaign, Group, step_at
from .codec import check_step, encode_compact, encode_payload, single_report
from .errors import BudgetExceeded, CampaignError, DeviceStateError, IngestError, InvalidState, LDPError, MemoTableFull
from .ledger import LEDGER_KEYS, TOL, Ledger, budget_plan
from .numeric import NumericMechanism, numeric_value
from .solutions import MultiState
from .state import (DEVICE_FORMAT, GROUP_FORMAT, MEMO_FORMAT, STATE_VERSION, DirLock, private_dir, read_json,
                    write_json)
from .streams import os_key
from .transport import post_with_retries

__all__ = ["Device"]


def _log():  # logging is imported when a device first logs (it is not light to import)
    import logging
    return logging.getLogger("ldp_device")


_LOAD_ERRORS = (InvalidState, OSError, ValueError, KeyError, TypeError)


def _key_id(st: MemoState | MultiState, with_sampled: bool = False) -> str:
    """Short hash of a state's secrets (memo keys; a group's fake inputs and fixed sampled attribute)."""
    h = hashlib.sha256()
    if isinstance(st, MemoState):
        h.update(st.key)
    else:
        for m in st.memos:
            h.update(b"-" if m is None else m.key)
        for arr in (st.fake, st.sampled if with_sampled else None):
            h.update(b"-" if arr is None else json.dumps(arr).encode())
    return h.hexdigest()[:32]


class Device:
    """One device of ``campaign`` whose state lives in the directory ``state_path``.

    ``budget_eps``: the device's lifetime longitudinal ε over all its attributes (``None``: no limit);
    ``ValueError`` if it cannot memoize even one value of some memoizing attribute. ``ingest_url``: the
    ingest's ``POST /reports`` endpoint, ``token`` the device token (``Authorization: Bearer``); a request is
    sent again with the same bytes and ``Idempotency-Key`` after a dropped connection, a 5xx or a 409, up to
    ``retries`` more times with exponential backoff from ``backoff_seconds``; ``timeout`` per attempt.
    """

    def __init__(self, campaign: Campaign, state_path: str | os.PathLike[str], budget_eps: float | None = None,
                 ingest_url: str | None = None, *, token: str | None = None, retries: int = 3,
                 backoff_seconds: float = 0.5, timeout: float = 10.0) -> None:
        if budget_eps is not None and not budget_eps >= 0:
            raise ValueError(f"budget_eps must be >= 0 or None, got {budget_eps}")
        if budget_eps is not None:
            for name in campaign.ungrouped:
                proto = campaign.attributes[name].protocol
                first = float(proto.longitudinal_loss(1)) if proto.memo_size else 0.0
                if first > budget_eps + TOL:
                    raise ValueError(
                        f"budget_eps={budget_eps:.4g} cannot memoize a single value of {name!r} "
                        f"({proto.name}, one memoized value costs {first:.4g}): the budget must allow "
                        "at least one memoized value of every memoizing attribute")
        if retries < 0 or backoff_seconds < 0:
            raise ValueError(f"retries and backoff_seconds must be >= 0, got {retries} and {backoff_seconds}")
        self.campaign = campaign
        self.state_path = Path(state_path).expanduser()
        self.budget_eps = None if budget_eps is None else float(budget_eps)
        self.ingest_url, self.token, self.timeout = ingest_url, token, timeout
        self.retries, self.backoff_seconds = int(retries), float(backoff_seconds)
        self.budget_plan = budget_plan(campaign, self.budget_eps)
        _log().info("%s", self.budget_plan)
        private_dir(self.state_path)
        self._lock = DirLock(self.state_path)
        self.ledger = Ledger(campaign, self.budget_eps)
        self._clipped: dict[str, int] = {}  # numeric attribute -> values clipped to its range (this object)
        self.fingerprints: dict[str, str] = {}
        self._seen_files: dict[Path, tuple[int, int] | None] = {}
        try:
            with self._lock.held():
                self._check_or_write_identity()
                self._refresh()
        except BaseException:
            self._lock.close()
            raise

    # ------------------------------------------------------------------ the ledger's views
    @property
    def memo_slots(self) -> dict[str, int]:
        return self.ledger.memo_slots

    @property
    def spent_reports(self) -> dict[str, int]:
        return self.ledger.spent_reports

    @property
    def group_reports(self) -> dict[str, int]:
        return self.ledger.group_reports

    @property
    def last_values(self) -> dict[str, int | float]:
        return self.ledger.last_values

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self._lock.close()

    def __enter__(self) -> "Device":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ state files
    def _memo_path(self, attribute: str) -> Path:
        return self.state_path / f"{attribute}.memo.json"

    def _group_path(self, group: str) -> Path:
        return self.state_path / f"{group}.group.json"

    @property
    def _budget_path(self) -> Path:
        return self.state_path / "budget.json"

    @property
    def _ident_path(self) -> Path:
        return self.state_path / "device.json"

    def _write_identity(self, fingerprints: dict[str, str]) -> None:
        write_json(self._ident_path, {"format": DEVICE_FORMAT, "version": STATE_VERSION, "campaign": self.campaign.id,
                                      "ledger": True, "fingerprints": dict(sorted(fingerprints.items()))})
        self.fingerprints = dict(fingerprints)
        self._changed(self._ident_path)

    def _read_identity(self) -> dict[str, Any]:
        try:
            old = read_json(self._ident_path)
            if not isinstance(old, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:
            raise DeviceStateError(f"cannot read {self._ident_path} ({exc}): the device cannot tell which attributes "
                                   "its state belongs to; it refuses to report rather than start again with new keys "
                                   "(a new device: a new state directory and a new token)") from exc
        if old.get("format") != DEVICE_FORMAT:
            raise DeviceStateError(f"{self._ident_path} is not a state directory of this SDK (format "
                                   f"{old.get('format')!r}); a device keeps one state directory per SDK")
        return old

    def _load_ledger(self) -> dict[str, Any]:
        try:
            return Ledger.parse(read_json(self._budget_path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DeviceStateError(f"cannot read {self._budget_path} (the privacy ledger): {exc}; the device refuses "
                                   "to report (the loss it has spent is unknown)") from exc

    def _check_or_write_identity(self) -> None:
        state_files = sorted(p.name for pat in ("*.memo.json", "*.group.json") for p in self.state_path.glob(pat))
        if not self._ident_path.exists():
            ledger = self._load_ledger() if self._budget_path.exists() else {}
            used = any(ledger.get(k) for k in (*LEDGER_KEYS, "keyed", "retired"))
            if used or state_files:
                raise DeviceStateError(
                    f"{self._ident_path} is missing but {self.state_path} holds device state "
                    f"({', '.join(state_files) or 'budget.json'}): the device cannot check which attributes it belongs "
                    "to and refuses to report; no recovery keeps the loss counted (a new device: a new state directory "
                    "and a new token)")
            if not self._budget_path.exists():  # the ledger first: device.json says that one exists
                write_json(self._budget_path, self.ledger.data())
            self._write_identity(self.ledger.scopes())
            return
        old = self._read_identity()
        if old.get("campaign") != self.campaign.id:
            raise DeviceStateError(
                f"{self.state_path} holds the state of campaign {old.get('campaign')!r}, not {self.campaign.id!r}; "
                "a device must keep its memo state for the campaign's lifetime, use another directory")
        if not self._budget_path.exists():
            raise DeviceStateError(
                f"{self._budget_path} (the privacy ledger) is missing while {self._ident_path} says it exists: the "
                "loss this device has spent is unknown, so it refuses to report (a new device: a new state directory "
                "and a new token)")

    def _changed(self, path: Path) -> bool:
        """True if ``path`` was replaced since it was last read (atomic writes change the inode)."""
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
        """Re-read whatever another Device on the same directory changed (under the lock)."""
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
                raise DeviceStateError(f"{self._budget_path} (the privacy ledger) was removed: the loss this device "
                                       "has spent is unknown, so it refuses to report")
            self.ledger.set(self._load_ledger())
            meta = True
        new = {s: fp for s, fp in self.ledger.scopes().items() if s not in self.fingerprints}
        if new:  # attributes added to the campaign: their fingerprints are recorded before any state
            self._write_identity({**self.fingerprints, **new})
        for name in self.campaign.ungrouped:
            proto = self.campaign.attributes[name].protocol
            path = self._memo_path(name)
            if self._changed(path) or meta or name not in self.ledger.states:
                self.ledger.states[name] = self._load_or_create(name, proto)
                self._changed(path)
        for group in self.campaign.groups.values():
            path = self._group_path(group.name)
            if self._changed(path) or meta or group.name not in self.ledger.group_states:
                st = self._load_or_create_group(group)
                if st is not None:
                    self.ledger.group_states[group.name] = st
                self._changed(path)

    def _check_fingerprint(self, scope: str, fingerprint: str) -> bool:
        """False (and the scope marked broken) if its protocol changed after it reported."""
        led = self.ledger
        led.broken.pop(scope, None)
        led.changed_scopes.discard(scope)
        if self.fingerprints.get(scope) == fingerprint:
            return True
        if not led.used(scope):
            self._write_identity({**self.fingerprints, scope: fingerprint})
            return True
        kind, name = scope.split(":", 1)
        what = "attribute" if kind == "a" else "group"
        led.changed_scopes.add(scope)
        led.broken[scope] = (
            f"{what} {name!r} changed (protocol, domain or ε: fingerprint {self.fingerprints.get(scope)} in "
            f"{self._ident_path}, {fingerprint} in the campaign): it is a new {what} with new keys, refused until "
            f"Device.reset({name!r}{', group=True' if kind == 'g' else ''}, accept_privacy_loss=True) starts it anew; "
            f"its ε is then counted in the lifetime budget and the {led.recorded.get(scope, 0.0):.4g} the old one "
            "spent stays in the ledger")
        return False

    def _broken_file(self, scope: str, path: Path, problem: str) -> None:
        kind, name = scope.split(":", 1)
        self.ledger.broken[scope] = (
            f"{path} {problem}, but the ledger {self._budget_path} shows this "
            f"{'attribute' if kind == 'a' else 'group'} "
            f"has reported with it: reporting with a new state would re-randomize memoized values (an averaging "
            f"attack) without counting the loss, so nothing is sent. Restore the file, or call "
            f"Device.reset({name!r}{', group=True' if kind == 'g' else ''}, accept_privacy_loss=True)")

    def _save_memo(self, name: str, st: MemoState) -> None:
        write_json(self._memo_path(name), {"format": MEMO_FORMAT, "version": STATE_VERSION, **st.to_json()})

    def _load_or_create(self, name: str, proto: Protocol) -> MemoState | None:
        scope = f"a:{name}"
        if not self._check_fingerprint(scope, proto.fingerprint) or proto.memo_size == 0:
            return None
        path = self._memo_path(name)
        if not path.exists():
            if scope in self.ledger.keyed:
                self._broken_file(scope, path, "is missing")
                return None
            st = proto.new_state(os_key)  # a secret key from the OS CSPRNG; recorded at its first report
            self._save_memo(name, st)  # type: ignore[arg-type]
            return st
        try:
            obj = read_json(path)
            if not isinstance(obj, dict) or obj.get("format") != MEMO_FORMAT or obj.get("version") != STATE_VERSION:
                raise InvalidState("not a memo state file of this SDK")
            st = MemoState.from_json(obj)
            st.check(proto.fingerprint)
            if st.memo_size != proto.memo_size:
                raise InvalidState(f"memo size {st.memo_size}, the protocol's is {proto.memo_size}")
        except _LOAD_ERRORS as exc:
            self._broken_file(scope, path, f"cannot be used ({type(exc).__name__}: {exc})")
            return None
        if scope in self.ledger.keyed and self.ledger.keyed[scope] != _key_id(st):
            self._broken_file(scope, path, "holds another key than the one the ledger recorded")
            return None
        return st

    def _save_group(self, name: str, st: MultiState) -> None:
        write_json(self._group_path(name), {"format": GROUP_FORMAT, "version": STATE_VERSION, **st.to_json()})

    def _load_or_create_group(self, group: Group) -> MultiState | None:
        scope = f"g:{group.name}"
        self.ledger.group_states.pop(group.name, None)
        if not self._check_fingerprint(scope, group.solution.fingerprint):
            return None
        path = self._group_path(group.name)
        if not path.exists():
            if scope in self.ledger.keyed:
                self._broken_file(scope, path, "is missing")
                return None
            st = group.solution.new_state(os_key)
            self._save_group(group.name, st)
            return st
        try:
            obj = read_json(path)
            if not isinstance(obj, dict) or obj.get("format") != GROUP_FORMAT or obj.get("version") != STATE_VERSION:
                raise InvalidState("not a group state file of this SDK")
            st = MultiState.from_json(obj)
            group.solution.check_state(st)
        except _LOAD_ERRORS as exc:
            self._broken_file(scope, path, f"cannot be used ({type(exc).__name__}: {exc})")
            return None
        if scope in self.ledger.keyed and self.ledger.keyed[scope] != self._group_key_id(group.name, st):
            self._broken_file(scope, path, "holds other keys or another sampled attribute than the ledger recorded")
            return None
        return st

    def _group_key_id(self, group: str, st: MultiState) -> str:
        return _key_id(st, with_sampled=self.campaign.groups[group].solution.sampling == "fixed")

    def _usable(self, scope: str) -> None:
        if scope in self.ledger.broken:
            raise DeviceStateError(self.ledger.broken[scope])

    def _save_budget(self, spent: dict[str, int] | None = None, slots: dict[str, int] | None = None,
                     last: dict[str, int] | None = None, groups: dict[str, int] | None = None,
                     keyed: dict[str, str] | None = None, retired: dict[str, float] | None = None) -> None:
        """Write the ledger (the parts not given are kept), each scope's reserved loss recorded too."""
        led = self.ledger
        old = json.loads(json.dumps(led.data()))
        for key, val in zip((*LEDGER_KEYS, "keyed", "retired"), (spent, slots, last, groups, keyed, retired)):
            if val is not None:
                setattr(led, key, dict(val))
        led.record()
        data = led.data()
        if data == old and self._budget_path.exists():
            return
        write_json(self._budget_path, data)
        self._changed(self._budget_path)

    # ------------------------------------------------------------------ scopes
    def _own(self, attribute: str) -> Protocol:
        """The protocol of an attribute reported on its own (not by a group's solution)."""
        attr = self.campaign.attribute(attribute)
        if attr.group is not None:
            sol = self.campaign.groups[attr.group].solution
            raise LDPError(f"attribute {attribute!r} is randomized with the other attributes of group "
                           f"{attr.group!r} ({sol.name}, one budget over the group): use "
                           f"Device.report_group({attr.group!r}, values) or send_group")
        return attr.protocol  # type: ignore[return-value]

    def _group(self, group: str) -> Group:
        try:
            return self.campaign.groups[group]
        except KeyError:
            have = ", ".join(map(repr, self.campaign.groups)) or "none"
            raise CampaignError(f"campaign {self.campaign.id!r} has no group {group!r} (groups: {have})") from None

    def _check_scope(self, attribute: str | None, group: str | None) -> None:
        if attribute is not None and group is not None:
            raise LDPError("give an attribute or a group, not both")
        if attribute is not None:
            self._own(attribute)
        if group is not None:
            self._group(group)

    # ------------------------------------------------------------------ accounting
    def privacy_loss(self, attribute: str | None = None, *, group: str | None = None) -> float:
        """Longitudinal ε actually spent so far: one ungrouped attribute, one group, or everything."""
        self._check_scope(attribute, group)
        with self._lock.held():
            self._refresh()
        return self.ledger.loss(attribute, group)

    def reserved_loss(self, attribute: str | None = None, *, group: str | None = None) -> float:
        """Longitudinal ε reserved so far (``>= privacy_loss()``, ``<= budget_eps``), scoped likewise."""
        self._check_scope(attribute, group)
        with self._lock.held():
            self._refresh()
        return self.ledger.reserved(attribute, group)

    def remaining_budget(self) -> float:
        """``budget_eps - reserved_loss()`` (``inf`` without a budget)."""
        return float("inf") if self.budget_eps is None else self.budget_eps - self.reserved_loss()

    def group_steps(self, group: str) -> int:
        self._group(group)
        with self._lock.held():
            self._refresh()
        return self.ledger.group_steps(group)

    def memoized_count(self, attribute: str) -> int:
        """Distinct memoized inputs of ``attribute`` (0 for memoryless protocols)."""
        self._own(attribute)
        with self._lock.held():
            self._refresh()
            self._usable(f"a:{attribute}")
        st = self.ledger.states[attribute]
        return 0 if st is None else self.campaign.attribute(attribute).protocol.memoized_count(st)

    def last_value(self, attribute: str) -> int | float | None:
        """The value the last report of a memoizing attribute randomized (what it freezes on): an index, or the
        measurement of a numeric attribute."""
        self._own(attribute)
        with self._lock.held():
            self._refresh()
        return self.ledger.last_values.get(attribute)

    def frozen(self, attribute: str) -> bool:
        """True if the next report of a value ``attribute`` has not memoized would be frozen (local knowledge:
        the server sees the same reports either way)."""
        self._own(attribute)
        with self._lock.held():
            self._refresh()
            self._usable(f"a:{attribute}")
        led = self.ledger
        st = led.states[attribute]
        if st is None:
            return False
        proto = self.campaign.attribute(attribute).protocol
        count, slots = proto.memoized_count(st), led.slots(attribute)
        if count >= proto.memo_size:
            return False
        grow = led.slot_cost(attribute, slots)
        if count >= slots and (grow is None or not led.fits(led.reserved(), grow)):
            return True
        new_cost = float(proto.longitudinal_loss(count + 1)) - float(proto.longitudinal_loss(count))
        return not led.fits(led.loss(), new_cost)

    # ------------------------------------------------------------------ recovery
    def reset(self, name: str, *, group: bool = False, accept_privacy_loss: bool = False) -> float:
        """Start an attribute (``group=True``: a group) anew with a fresh key / group state; its old loss stays
        counted and the fresh key's first memo slot (a group: its first step) is reserved at once. Returns the
        device's reserved loss after the reset. ``accept_privacy_loss`` must be True."""
        if accept_privacy_loss is not True:
            raise ValueError("reset starts the attribute anew with a fresh key and counts its loss again: "
                             "pass accept_privacy_loss=True")
        led = self.ledger
        if group:
            g = self._group(name)
            scope, fingerprint = f"g:{name}", g.solution.fingerprint
        else:
            proto = self._own(name)
            scope, fingerprint = f"a:{name}", proto.fingerprint
        with self._lock.held():
            self._refresh()
            retired = dict(led.retired, **{scope: led.version_reserved(scope) + led.retired.get(scope, 0.0)})
            led.changed_scopes.discard(scope)
            led.broken.pop(scope, None)
            keyed = dict(led.keyed)
            keyed.pop(scope, None)
            if group:
                st = g.solution.new_state(os_key)
                self._save_group(name, st)  # the state first: until the ledger names it, it is refused
                led.group_states[name] = st
                self._changed(self._group_path(name))
                keyed[scope] = self._group_key_id(name, st)
                self._save_budget(groups=dict(led.group_reports, **{name: 1}), keyed=keyed, retired=retired)
            elif proto.memo_size:
                mst = proto.new_state(os_key)
                assert mst is not None
                self._save_memo(name, mst)
                led.states[name] = mst
                self._changed(self._memo_path(name))
                keyed[scope] = _key_id(mst)
                last = {k: v for k, v in led.last_values.items() if k != name}
                self._save_budget(slots=dict(led.memo_slots, **{name: 1}), last=last, keyed=keyed, retired=retired)
            else:
                led.states[name] = None
                self._save_budget(spent=dict(led.spent_reports, **{name: 0}), keyed=keyed, retired=retired)
            if self.fingerprints.get(scope) != fingerprint:  # last: a crash before it leaves the scope refused
                self._write_identity({**self.fingerprints, scope: fingerprint})
            return led.reserved()

    # ------------------------------------------------------------------ reporting
    def current_step(self) -> int:
        """The time step of the current time, ``floor(unix time / time_step_seconds)``."""
        return step_at(self.campaign)

    def value_index(self, attribute: str, value: int | str) -> int:
        """The domain index of ``value``: an index in ``[0, k)`` or one of the attribute's labels."""
        a = self.campaign.attribute(attribute)
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

    def numeric_value(self, attribute: str, value: float) -> float:
        """A numeric attribute's measurement as a float: a finite number (outside the range it is clipped to the
        nearest end when randomized, and counted: :meth:`clipped`); :class:`LDPError` otherwise."""
        return numeric_value(value, f"value {value!r} of numeric attribute {attribute!r}")

    def clipped(self, attribute: str) -> int:
        """How many values of numeric ``attribute`` this Device object clipped to the range before randomizing
        them (kept on the device: the server never learns which reports were clipped)."""
        return self._clipped.get(attribute, 0)

    def value_id(self, attribute: str, value: str | int) -> int:
        """An open-domain attribute's value as its 64-bit id: a ``str`` (``type = "string"``, the first 8 bytes of
        its SHA-256) or an integer in ``[0, 2^64)`` (``"u64"``, its own id); :class:`LDPError` otherwise."""
        a = self.campaign.attribute(attribute)
        if not a.open_domain:
            raise LDPError(f"attribute {attribute!r} is not open-domain (type {a.value_type!r})")
        return a.value_id(value)

    def _input(self, attribute: str, value: int | float | str) -> int | float:
        """One value as the protocol's input: a domain index (categorical), a float (numeric, counted when it
        lies outside the range) or a 64-bit value id (open-domain)."""
        proto = self._own(attribute)
        if self.campaign.attribute(attribute).open_domain:
            return self.value_id(attribute, value)  # type: ignore[arg-type]
        if isinstance(proto, NumericMechanism):
            v = self.numeric_value(attribute, value)  # type: ignore[arg-type]
            if proto.clipped(v):
                self._clipped[attribute] = self._clipped.get(attribute, 0) + 1
            return v
        return self.value_index(attribute, value)  # type: ignore[arg-type]

    def randomize(self, attribute: str, value: int | float | str) -> bytes:
        """Randomize one value (the report bytes of this device), enforcing and recording the budget: an index or
        a label, a number for a numeric attribute (clipped to its range), a string or an integer in ``[0, 2^64)``
        for an open-domain attribute (``type = "string"`` / ``"u64"``).

        A memoizing attribute past its budget randomizes its last reported value instead of ``value``;
        :class:`BudgetExceeded` only on data-independent grounds (nothing memoized, saved or sent)."""
        proto = self._own(attribute)
        v = self._input(attribute, value)
        led = self.ledger
        with self._lock.held():
            self._refresh()
            self._usable(f"a:{attribute}")
            st = led.states[attribute]
            reserved = led.reserved()
            if st is None:
                cost = float(proto.eps_first)
                if not led.fits(reserved, cost):
                    raise BudgetExceeded(attribute, reserved, cost, self.budget_eps or 0.0)
                report = proto.randomize(v, os_key)
                # spend first: a crash may over-count, never under-count
                self._save_budget(spent=dict(led.spent_reports, **{attribute: led.spent_reports.get(attribute, 0) + 1}))
                return report
            return self._randomize_memoized(attribute, proto, st, v, reserved)

    def _randomize_memoized(self, attribute: str, proto: Protocol, st: MemoState, v: int | float,
                            reserved: float) -> bytes:
        led = self.ledger
        if math.isinf(proto.memoized_count(st)):  # no tag table (an earlier release's slot bitset): refused
            raise DeviceStateError(
                f"the memo state of {attribute!r} in {self._memo_path(attribute)} cannot be accounted (it is no "
                f"{proto.name} memo tag table: a memo state of an earlier release); nothing was sent. "
                f"Device.reset({attribute!r}, accept_privacy_loss=True) starts it anew with its loss counted")
        count, slots = proto.memoized_count(st), led.slots(attribute)
        # 1. reserve one more memo slot: decided on the schedule alone
        grow = led.slot_cost(attribute, slots)
        can_grow = grow is not None and led.fits(reserved, grow)
        if slots == 0 and not can_grow:
            raise BudgetExceeded(attribute, reserved, grow if grow is not None else float("inf"),
                                 self.budget_eps or 0.0)
        new_slots = dict(led.memo_slots, **{attribute: slots + 1 if can_grow else slots})
        keyed = dict(led.keyed, **{f"a:{attribute}": _key_id(st)})  # in the ledger before the first report leaves
        # 2. the value itself, if it is memoized or may be memoized now
        trial = st.copy()
        report = proto.randomize(v, os_key, trial)
        opened = self.campaign.attribute(attribute).open_domain
        # the ledger's last value: an index, a measurement, or an open-domain attribute's memoized report (TreeHist:
        # never the value or its id; its frozen reports are drawn from it, as producers/sdk.py's)
        last_v: int | float | str = proto.memoized_output(v, trial).hex() if opened else v
        if proto.memoized_count(trial) == count:  # already memoized: its PRR is reused, nothing spent
            self._save_budget(slots=new_slots, last=dict(led.last_values, **{attribute: last_v}), keyed=keyed)
            return report
        new_cost = float(proto.longitudinal_loss(count + 1)) - float(proto.longitudinal_loss(count))
        if count < new_slots[attribute] and led.fits(led.loss(), new_cost):
            if math.isinf(proto.memoized_count(trial)):  # a new value the memo table cannot account for: refused
                raise MemoTableFull(attribute, getattr(proto, "memo_tags", proto.memo_size))
            self._save_budget(slots=new_slots, keyed=keyed)  # reserve first: a crash may over-count only
            self._save_memo(attribute, trial)
            led.states[attribute] = trial
            self._changed(self._memo_path(attribute))
            self._save_budget(last=dict(led.last_values, **{attribute: last_v}))
            return report
        # 3. frozen: randomize the last reported value (memoized) instead of the new one
        last = led.last_values.get(attribute)
        if last is None:
            raise BudgetExceeded(attribute, reserved, new_cost, self.budget_eps or 0.0,
                                 detail="no recorded last value to freeze on")
        if opened:  # the memoized report of the last value, the IRR drawn on top: nothing memoized
            report = proto.from_memoized(bytes.fromhex(str(last)), os_key)  # type: ignore[attr-defined]
            self._save_budget(slots=new_slots, keyed=keyed)
            return report
        trial = st.copy()
        report = proto.randomize(last, os_key, trial)
        if proto.memoized_count(trial) != count:
            raise DeviceStateError(f"the last value of {attribute!r} in {self._budget_path} is not memoized "
                                   f"in {self._memo_path(attribute)}: the state directory is inconsistent")
        self._save_budget(slots=new_slots, keyed=keyed)
        return report

    def _object(self, attribute: str, t: int, report: bytes) -> dict[str, Any]:
        proto = self.campaign.attribute(attribute).protocol
        return single_report(self.campaign.id, attribute, t, encode_payload([report], proto.report_nbytes))

    def report(self, attribute: str, value: int | float | str, t: int | None = None) -> dict[str, Any]:
        """The JSON object of one randomized report: ``{campaign, attribute, t, payload}`` (``value``: an index, a
        label, the measurement of a numeric attribute, or the string / u64 of an open-domain attribute)."""
        self._own(attribute)  # an unknown or grouped attribute fails before anything is spent
        step = check_step(self.current_step() if t is None else t)
        return self._object(attribute, step, self.randomize(attribute, value))

    def send(self, attribute: str, value: int | float | str, t: int | None = None) -> dict[str, Any]:
        """Randomize one report (an index, a label, a measurement, or an open-domain string / u64), POST it to
        ``ingest_url``; the endpoint's JSON reply.

        Randomized once: retries send the same bytes with the same ``Idempotency-Key``."""
        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        return self._post(self.report(attribute, value, t))

    # ------------------------------------------------------------------ groups
    def _group_values(self, group: Group, values: Mapping[str, int | str] | Sequence[int | str]) -> list[int]:
        names = group.attributes
        if isinstance(values, Mapping):
            unknown = [str(a) for a in values if a not in names]
            missing = [a for a in names if a not in values]
            if unknown or missing:
                raise LDPError(f"group {group.name!r} reports the attributes {list(names)}: "
                               + "; ".join(([f"unknown {unknown}"] if unknown else [])
                                           + ([f"missing {missing}"] if missing else [])))
            row = [values[a] for a in names]
        elif isinstance(values, Sequence) and not isinstance(values, (str, bytes)):
            row = list(values)
            if len(row) != len(names):
                raise LDPError(f"group {group.name!r} needs {len(names)} values (for {list(names)}), got {len(row)}")
        else:
            raise LDPError(f"values of group {group.name!r} must be a dict {{attribute: value}} or a sequence in "
                           f"the order {list(names)}, got {type(values).__name__}")
        return [self.value_index(name, v) for name, v in zip(names, row)]

    def report_group(self, group: str, values: Mapping[str, int | str] | Sequence[int | str],
                     t: int | None = None) -> list[dict[str, Any]]:
        """Randomize the device's tuple through the group's solution: one report object per attribute the
        solution sends, in the group's order. One group step is reserved first (:class:`BudgetExceeded`,
        nothing randomized, saved or sent, if it does not fit)."""
        g = self._group(group)
        v = self._group_values(g, values)
        step = check_step(self.current_step() if t is None else t)
        led = self.ledger
        with self._lock.held():
            self._refresh()
            self._usable(f"g:{group}")
            steps = led.group_steps(group)
            reserved = led.reserved()
            cost = led.group_bound(group, steps + 1) - led.group_bound(group, steps)
            if not led.fits(reserved, cost):
                raise BudgetExceeded(group, reserved, cost, self.budget_eps or 0.0,
                                     detail=f"group {group!r} ({g.solution.name}): one more group step reserves "
                                            f"its worst-case loss")
            trial = led.group_states[group].copy()
            out = g.solution.randomize(v, os_key, trial)
            objs = [self._object(name, step, out[j]) for j, name in enumerate(g.attributes)  # type: ignore[arg-type]
                    if out[j] is not None]
            # reserve first: a crash may over-count, never under-count
            self._save_budget(groups=dict(led.group_reports, **{group: steps + 1}),
                              keyed=dict(led.keyed, **{f"g:{group}": self._group_key_id(group, trial)}))
            self._save_group(group, trial)
            led.group_states[group] = trial
            self._changed(self._group_path(group))
        return objs

    def send_group(self, group: str, values: Mapping[str, int | str] | Sequence[int | str],
                   t: int | None = None) -> dict[str, Any]:
        """:meth:`report_group` and POST its report objects as one request (all or nothing at the ingest)."""
        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        return self._post(self.report_group(group, values, t))

    def send_binary(self, objs: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """POST report objects (from :meth:`report` / :meth:`report_group`) as one compact binary body."""
        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        items = [objs] if isinstance(objs, Mapping) else list(objs)
        sections = []
        for o in items:
            if o.get("campaign") != self.campaign.id:
                raise LDPError(f"report of campaign {o.get('campaign')!r}, this device reports {self.campaign.id!r}")
            attr = self.campaign.attribute(str(o.get("attribute")))
            sections.append((self.campaign.id, attr.name, attr.protocol.fingerprint, o.get("t"),
                             base64.b64decode(o["payload"], validate=True)))
        return self._post(encode_compact(sections))

    def _post(self, body: Any) -> dict[str, Any]:
        assert self.ingest_url
        return post_with_retries(self.ingest_url, body, token=self.token, timeout=self.timeout, retries=self.retries,
                                 backoff_seconds=self.backoff_seconds)
