"""The device SDK: one real device's randomizer, memo state and privacy budget.

```python
from producers.sdk import Device, BudgetExceeded
dev = Device(Campaign.load("deploy/campaigns/demo.toml"), Path("~/.ldp-device"),
             budget_eps=10.0, ingest_url="http://127.0.0.1:6066/reports")
dev.send("app_version", 42)          # randomize locally, POST one report
obj = dev.report("opt_in", 1, t=7)   # or build the JSON object and send it yourself
```

State directory (``state_path``)::

    device.json        # campaign id and fingerprint the state belongs to
    <attr>.memo.npz    # one MemoState of a single device per memoizing attribute (atomic writes)
    budget.json        # reports spent by memoryless attributes (atomic writes)
    .lock              # flock: one Device at a time per state directory

Privacy budget: the device's total longitudinal loss is the sum over attributes of
``proto.longitudinal_loss(memoized_count)`` for memoizing protocols plus ``reports x eps_first``
for memoryless ones. A report that would push it over ``budget_eps`` raises
:class:`BudgetExceeded`: nothing is memoized, saved or sent. Re-reporting a value whose memoized
response already exists costs nothing and is always allowed. State is saved *before* a report
leaves :meth:`Device.report`, so a crash can only over-count spending, never forget it.

The report object matches the stream app's ``POST /reports`` endpoint::

    {"campaign": "...", "attribute": "...", "t": 7, "payload": base64(proto.encode(reports))}

``t`` defaults to the current time step ``floor(unix_time / campaign.time_step_seconds)``.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from estimators import MemoState
from estimators.base import FrequencyProtocol
from estimators.campaign import Campaign
from estimators.errors import InvalidState, LDPError
from estimators.fileio import atomic_write

__all__ = ["Device", "BudgetExceeded", "IngestError", "DeviceStateError"]

_DEVICE_FORMAT = "ldp-stream/device"
_TOL = 1e-9


class BudgetExceeded(LDPError):
    """The report would push the device's lifetime privacy loss over its budget."""

    def __init__(self, attribute: str, spent: float, cost: float, budget: float) -> None:
        super().__init__(f"privacy budget exceeded: reporting {attribute!r} would raise the device's "
                         f"longitudinal loss from {spent:.4g} to {spent + cost:.4g} > budget {budget:.4g}; "
                         "nothing was memoized or sent")
        self.attribute, self.spent, self.cost, self.budget = attribute, spent, cost, budget


class IngestError(LDPError):
    """The ingest endpoint did not accept a report (``status`` is None if unreachable)."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status, self.body = status, body


class DeviceStateError(LDPError):
    """A state directory that does not belong to this campaign or cannot be read."""


class Device:
    """One device of ``campaign`` whose state lives in the directory ``state_path``."""

    def __init__(self, campaign: Campaign, state_path: str | Path, budget_eps: float | None = None,
                 ingest_url: str | None = None, *, rng: np.random.Generator | None = None,
                 timeout: float = 10.0) -> None:
        if budget_eps is not None and not budget_eps >= 0:
            raise ValueError(f"budget_eps must be >= 0 or None, got {budget_eps}")
        self.campaign = campaign
        self.state_path = Path(state_path).expanduser()
        self.budget_eps = None if budget_eps is None else float(budget_eps)
        self.ingest_url = ingest_url
        self.timeout = timeout
        self._rng = rng if rng is not None else np.random.default_rng()
        self.state_path.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.state_path / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        self.states: dict[str, MemoState | None] = {}
        self.spent_reports: dict[str, int] = {}
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

    @property
    def _budget_path(self) -> Path:
        return self.state_path / "budget.json"

    def _check_or_write_identity(self) -> None:
        path = self.state_path / "device.json"
        ident = {"format": _DEVICE_FORMAT, "campaign": self.campaign.id, "fingerprint": self.campaign.fingerprint}
        if path.exists():
            try:
                old = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise DeviceStateError(f"cannot read {path}: {exc}") from exc
            if old.get("campaign") != ident["campaign"] or old.get("fingerprint") != ident["fingerprint"]:
                raise DeviceStateError(
                    f"{self.state_path} holds the state of campaign {old.get('campaign')!r} "
                    f"(fingerprint {old.get('fingerprint')}), not {self.campaign.id!r} ({self.campaign.fingerprint}); "
                    "a device must keep its memo state for the campaign's lifetime, use another directory")
        else:
            atomic_write(path, json.dumps(ident).encode())

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
        for name, attr in self.campaign.attributes.items():
            if attr.protocol.memo_size == 0:
                self.states[name] = None
            elif self._changed(self._memo_path(name)) or name not in self.states:
                self.states[name] = self._load_or_create(name, attr.protocol)
                self._changed(self._memo_path(name))
        if self._changed(self._budget_path):
            self.spent_reports = self._load_budget()

    def _load_or_create(self, name: str, proto: FrequencyProtocol) -> MemoState | None:
        if proto.memo_size == 0:
            return None
        path = self._memo_path(name)
        if path.exists():
            try:
                st = MemoState.load(path, fingerprint=proto.fingerprint)
            except InvalidState as exc:
                raise DeviceStateError(str(exc)) from exc
            if st.n_devices != 1:
                raise DeviceStateError(f"{path} holds {st.n_devices} devices, a device state holds 1")
            return st
        st = proto.new_state(1)  # secret key from the OS CSPRNG
        st.save(path)
        return st

    def _load_budget(self) -> dict[str, int]:
        path = self._budget_path
        if not path.exists():
            return {}
        try:
            data = json.loads(path.read_text())
            return {str(k): int(v) for k, v in data["spent_reports"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DeviceStateError(f"cannot read {path}: {exc}") from exc

    def _save_budget(self, spent: dict[str, int]) -> None:
        data = {"campaign": self.campaign.id, "spent_reports": spent}
        atomic_write(self._budget_path, json.dumps(data).encode())

    # ------------------------------------------------------------------ accounting
    def _attr_loss(self, name: str, memoized: int | None = None, spent: int | None = None) -> float:
        proto = self.campaign.attribute(name).protocol
        st = self.states[name]
        if st is None:
            reports = self.spent_reports.get(name, 0) if spent is None else spent
            return reports * float(proto.eps_first)
        m = int(st.memoized_count()[0]) if memoized is None else memoized
        return float(proto.longitudinal_loss(m))

    def privacy_loss(self, attribute: str | None = None) -> float:
        """Longitudinal ε spent so far (one attribute, or the sum over all)."""
        with self._locked():
            self._refresh()
        return self._loss(attribute)

    def _loss(self, attribute: str | None = None) -> float:
        names = [attribute] if attribute is not None else list(self.campaign.attributes)
        return float(sum(self._attr_loss(n) for n in names))

    def remaining_budget(self) -> float:
        """``budget_eps - privacy_loss()`` (``inf`` without a budget)."""
        return float("inf") if self.budget_eps is None else self.budget_eps - self.privacy_loss()

    def memoized_count(self, attribute: str) -> int:
        """Distinct memoized inputs of ``attribute`` (0 for memoryless protocols)."""
        with self._locked():
            self._refresh()
        st = self.states[attribute]
        return 0 if st is None else int(st.memoized_count()[0])

    # ------------------------------------------------------------------ reporting
    def current_step(self) -> int:
        return int(time.time() // self.campaign.time_step_seconds)

    def randomize(self, attribute: str, value: int) -> np.ndarray:
        """Randomize one value (reports array of one row), enforcing and recording the budget."""
        proto = self.campaign.attribute(attribute).protocol
        v = int(value)
        if not 0 <= v < proto.k:
            raise LDPError(f"value {value} of {attribute!r} is outside the domain [0, {proto.k})")
        values = np.array([v], dtype=np.int64)
        with self._locked():
            self._refresh()
            st = self.states[attribute]
            before = self._attr_loss(attribute)
            total_before = self._loss()
            if st is None:
                n_spent = self.spent_reports.get(attribute, 0) + 1
                after = self._attr_loss(attribute, spent=n_spent)
                self._check_budget(attribute, total_before, after - before)
                reports = proto.randomize(values, self._rng, state=None)
                spent = dict(self.spent_reports, **{attribute: n_spent})
                self._save_budget(spent)  # spend first: a crash may over-count, never under-count
                self.spent_reports = spent
                self._changed(self._budget_path)
                return reports
            trial = MemoState(st.fingerprint, st.keys.copy(), st.seen.copy(), st.memo_size)
            reports = proto.randomize(values, self._rng, state=trial)
            m_after = int(trial.memoized_count()[0])
            if m_after != int(st.memoized_count()[0]):
                after = self._attr_loss(attribute, memoized=m_after)
                self._check_budget(attribute, total_before, after - before)
                trial.save(self._memo_path(attribute))
                self.states[attribute] = trial
                self._changed(self._memo_path(attribute))
            return reports

    def _check_budget(self, attribute: str, spent: float, cost: float) -> None:
        if self.budget_eps is not None and spent + cost > self.budget_eps + _TOL:
            raise BudgetExceeded(attribute, spent, cost, self.budget_eps)

    def report(self, attribute: str, value: int, t: int | None = None) -> dict[str, Any]:
        """The JSON object of one randomized report, as accepted by ``POST /reports``."""
        proto = self.campaign.attribute(attribute).protocol
        step = self.current_step() if t is None else int(t)
        if step < 0:
            raise LDPError(f"time step must be >= 0, got {step}")
        reports = self.randomize(attribute, value)
        return {"campaign": self.campaign.id, "attribute": attribute, "t": step,
                "payload": base64.b64encode(proto.encode(reports)).decode("ascii")}

    def send(self, attribute: str, value: int, t: int | None = None) -> dict[str, Any]:
        """Randomize and POST one report to :attr:`ingest_url`; returns the endpoint's JSON reply."""
        if not self.ingest_url:
            raise IngestError("no ingest_url configured for this device")
        obj = self.report(attribute, value, t)
        return post_report(self.ingest_url, obj, timeout=self.timeout)


def post_report(url: str, obj: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """POST one report object as JSON; raises :class:`IngestError` unless the reply is 2xx."""
    req = urllib.request.Request(url, data=json.dumps(obj).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
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
