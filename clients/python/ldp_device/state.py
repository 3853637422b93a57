"""A device's state directory: JSON files written atomically, a private directory, one process at a time.

::

    device.json          # format, campaign id, one fingerprint per attribute and group, "a ledger exists"
    budget.json          # the privacy ledger (producers/sdk.py's fields)
    <attr>.memo.json     # a memoizing attribute's memo state: its 256-bit key (hex) and memoized cells
    <group>.group.json   # a group's solution state: memo keys and cells per attribute, sampled attribute, fake inputs
    .lock                # flock: one Device at a time per directory

The directory has mode 0700 (an existing one is tightened to it), its files 0600. Every write goes to a
temporary file in the directory, is flushed and fsynced, renamed over the old file, and the directory entry is
fsynced: a reader (or a restart after a crash) sees the old file or the new one, never a mix. Losing memo
state would make a device re-randomize memoized values, which is the averaging attack memoization prevents.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

try:  # POSIX; elsewhere a Device still works, without the cross-process lock
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = ["private_dir", "atomic_write", "write_json", "read_json", "DirLock", "DEVICE_FORMAT", "MEMO_FORMAT",
           "GROUP_FORMAT", "STATE_VERSION"]

DEVICE_FORMAT = "ldp-stream/device-light"
MEMO_FORMAT = "ldp-stream/memo-state-light"
GROUP_FORMAT = "ldp-stream/group-state-light"
STATE_VERSION = 1


def private_dir(path: Path) -> None:
    """Create ``path`` with mode 0700, or tighten an existing directory to 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_DIRECTORY)
    except (AttributeError, OSError):  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file 0600, fsync, rename, fsync of the directory)."""
    import tempfile  # on first write (it is not light to import)

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, sort_keys=True).encode())


def read_json(path: Path) -> Any:
    """The JSON value of ``path`` (``OSError`` / ``ValueError`` if it cannot be read or parsed)."""
    return json.loads(path.read_bytes())


class DirLock:
    """An exclusive ``flock`` on ``<dir>/.lock`` while a Device reads or changes its state."""

    def __init__(self, directory: Path) -> None:
        self.fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)

    @contextmanager
    def held(self) -> Iterator[None]:
        if self.fd < 0:
            from .errors import LDPError
            raise LDPError("this Device is closed")
        if fcntl is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
