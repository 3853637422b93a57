"""``make(name, **params)``: the one constructor of every protocol, by its public name."""
from __future__ import annotations

import inspect
from typing import Any

from .base import FrequencyProtocol
from .errors import LDPError

_REGISTRY: dict[str, type[FrequencyProtocol]] = {}


def register(cls: type[FrequencyProtocol]) -> type[FrequencyProtocol]:
    _REGISTRY[cls.name] = cls
    return cls


def protocols() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def _protocol_class(name: str) -> type[FrequencyProtocol]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LDPError(f"unknown protocol {name!r}; known: {', '.join(_REGISTRY)}") from None


def parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``make(name, ...)`` accepts, with their defaults."""
    sig = inspect.signature(_protocol_class(name).__init__)
    return {p: spec for p, spec in sig.parameters.items() if p != "self"}


def make(name: str, **params: Any) -> FrequencyProtocol:
    """Build a protocol: ``make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)``."""
    cls = _protocol_class(name)
    accepted = parameters(name)
    unknown = set(params) - set(accepted)
    if unknown:
        raise LDPError(f"{name} does not take {', '.join(sorted(unknown))}; it takes {', '.join(accepted)}")
    missing = [p for p, spec in accepted.items() if spec.default is inspect.Parameter.empty and p not in params]
    if missing:
        raise LDPError(f"{name} needs {', '.join(missing)}")
    return cls(**params)


def from_params(params: dict[str, Any]) -> FrequencyProtocol:
    """Inverse of ``proto.params()`` (used by campaign files and memo-state checks)."""
    p = dict(params)
    name = p.pop("protocol")
    p.pop("chosen", None)
    return make(name, **p)
