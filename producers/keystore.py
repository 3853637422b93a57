"""Where a device keeps its memo keys: a small interface an app can back with the OS keystore.

The SDK (:class:`producers.sdk.Device`) stores the 256-bit memo key of each memoizing attribute
through a :class:`KeyStore` (``get`` / ``put`` of named secrets of at least 128 bits); the memo
file then holds only the memoized bitset. :class:`FileKeyStore`, the default, writes one file per
secret in the device's state directory (mode 0600, atomic writes); an app may pass an adapter to
the Android Keystore, the iOS Keychain or a TPM-sealed store instead, so the keys survive (or are
protected) apart from the rest of the state.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Protocol, runtime_checkable

from estimators.fileio import atomic_write

__all__ = ["KeyStore", "FileKeyStore", "MIN_SECRET_BYTES"]

MIN_SECRET_BYTES = 16  # 128 bits
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")


@runtime_checkable
class KeyStore(Protocol):
    """Named secrets of a device. ``get`` returns None for a name never ``put``."""

    def get(self, name: str) -> bytes | None: ...

    def put(self, name: str, secret: bytes) -> None: ...


def check_secret(name: str, secret: bytes) -> None:
    """``ValueError`` unless ``name`` is a plain file-safe name and ``secret`` has at least 128 bits."""
    if not _NAME.match(name):
        raise ValueError(f"key name {name!r} must match {_NAME.pattern}")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret {name!r} has {8 * len(secret)} bits, a key store holds at least 128")


class FileKeyStore:
    """One file ``<name>.key`` per secret in ``directory`` (0600, written atomically)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def get(self, name: str) -> bytes | None:
        check_secret(name, b"\0" * MIN_SECRET_BYTES)
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None

    def put(self, name: str, secret: bytes) -> None:
        check_secret(name, secret)
        atomic_write(self._path(name), bytes(secret))
