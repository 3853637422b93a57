"""Errors of the local stack."""
from __future__ import annotations

__all__ = ["BinaryNotFoundError", "StackError", "StackStartupError"]


class StackError(RuntimeError):
    """Any failure of the local stack."""


class BinaryNotFoundError(StackError):
    """A service binary (tansu or redis-server) cannot be found."""


class StackStartupError(StackError):
    """A service died during startup or did not become ready in time."""
