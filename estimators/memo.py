"""Per-device memoization state (the device side of the two-round framework).

A device's memo state is a secret 256-bit key (from the OS CSPRNG) plus the set of inputs it has
memoized. The permanent randomized response (PRR) of input ``x`` is drawn from the ChaCha20
stream ``(key, PRR, x)`` (:mod:`estimators.randomness`), a keyed PRF, so the same true value
(or hash value, or bucket) yields the same memoized output forever, a restored key reproduces
all of them, and the responses reveal nothing about the key. The ``seen`` bitset
records which inputs have been memoized: it drives the longitudinal privacy accounting
(Arcolezi et al., EDBT 2023, Eq. 8: each newly memoized input leaks a fresh ε∞).

The file format is versioned; version 1 (64-bit keys of the SplitMix-based randomness, which a
server could recover from linked reports) is refused: such devices must start anew.

State files are written atomically (temporary file, fsync, rename) so a crash mid-write
never leaves a device with a truncated or half-new state: losing memo state would make the
device re-randomize memoized values, which is exactly the averaging attack memoization
exists to prevent.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import InvalidState
from .fileio import atomic_write
from .randomness import KEY_WORDS, keys_from

_FORMAT = "ldp-stream/memo-state"
_VERSION = 2


@dataclass
class MemoState:
    """Memo state of ``n_devices`` devices for one protocol.

    Attributes:
        fingerprint: fingerprint of the protocol parameters the state belongs to.
        keys: ``uint32 (n_devices, 8)`` secret 256-bit memo keys.
        seen: ``uint8 (n_devices, ceil(memo_size/8))`` packed bitset (little bit order) of
            memoized inputs.
        memo_size: number of distinct memoizable inputs (k, g or b).
    """

    fingerprint: str
    keys: np.ndarray
    seen: np.ndarray
    memo_size: int

    @classmethod
    def fresh(cls, fingerprint: str, n_devices: int, memo_size: int,
              rng: np.random.Generator | None = None) -> "MemoState":
        """New devices with 256-bit keys from the OS CSPRNG (default) or, in the labelled
        simulation mode, from ``rng`` (:func:`estimators.randomness.keys_from`)."""
        if n_devices < 0:
            raise InvalidState(f"n_devices must be >= 0, got {n_devices}")
        keys = keys_from(rng, n_devices)
        seen = np.zeros((n_devices, (memo_size + 7) // 8), dtype=np.uint8)
        return cls(fingerprint, keys, seen, memo_size)

    @property
    def n_devices(self) -> int:
        return int(self.keys.shape[0])

    def memoized_count(self) -> np.ndarray:
        """Number of distinct memoized inputs per device, ``int64 (n_devices,)``."""
        return np.unpackbits(self.seen, axis=1, bitorder="little")[:, : self.memo_size].sum(axis=1, dtype=np.int64)

    def subset(self, rows: np.ndarray | slice) -> "MemoState":
        """A view of some devices (writes to ``seen`` go through to this state)."""
        return MemoState(self.fingerprint, self.keys[rows], self.seen[rows], self.memo_size)

    def check(self, fingerprint: str, n_rows: int) -> None:
        """Raise :class:`InvalidState` unless this state fits a protocol and a batch."""
        if self.fingerprint != fingerprint:
            raise InvalidState("memo state belongs to another protocol configuration "
                               f"(state {self.fingerprint}, protocol {fingerprint})")
        if n_rows != self.n_devices:
            raise InvalidState(f"batch has {n_rows} values but the state holds {self.n_devices} devices")

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write atomically: a reader sees the old file or the new one, never a mix."""
        path = Path(path)
        header = json.dumps({"format": _FORMAT, "version": _VERSION, "fingerprint": self.fingerprint,
                             "n_devices": self.n_devices, "memo_size": self.memo_size}).encode()
        buf = io.BytesIO()
        np.savez(buf, header=np.frombuffer(header, dtype=np.uint8), keys=self.keys, seen=self.seen)
        atomic_write(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike, fingerprint: str | None = None) -> "MemoState":
        """Read a state saved by :meth:`save`; optionally require a protocol fingerprint."""
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(z["header"].tobytes().decode())
                keys, seen = z["keys"].copy(), z["seen"].copy()
        except (OSError, ValueError, KeyError) as exc:
            raise InvalidState(f"cannot read memo state {path}: {exc}") from exc
        if header.get("format") != _FORMAT:
            raise InvalidState(f"{path} is not a memo state file")
        if header.get("version") != _VERSION:
            raise InvalidState(
                f"{path} is a version-{header.get('version')} memo state file; this release reads version "
                f"{_VERSION} only. Version 1 held 64-bit keys of a non-cryptographic generator, which a server "
                "could recover from linked reports: its devices cannot be kept private. A device SDK refuses to "
                "report the attribute until Device.reset(attribute, accept_privacy_loss=True) starts it anew with "
                "a new key whose loss is counted; a simulated fleet starts from a new state directory.")
        n, m = header["n_devices"], header["memo_size"]
        if keys.dtype != np.uint32 or keys.shape != (n, KEY_WORDS) or seen.shape != (n, (m + 7) // 8):
            raise InvalidState(f"{path}: arrays do not match the header")
        state = cls(header["fingerprint"], keys, seen, m)
        if fingerprint is not None and state.fingerprint != fingerprint:
            raise InvalidState(f"{path} belongs to protocol {state.fingerprint}, not {fingerprint}")
        return state
