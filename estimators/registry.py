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


def make(name: str, **params: Any) -> FrequencyProtocol:
    """Build a protocol: ``make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)``."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise LDPError(f"unknown protocol {name!r}; known: {', '.join(_REGISTRY)}") from None
    sig = inspect.signature(cls.__init__)
    accepted = [p for p in sig.parameters if p != "self"]
    unknown = set(params) - set(accepted)
    if unknown:
        raise LDPError(f"{name} does not take {', '.join(sorted(unknown))}; it takes {', '.join(accepted)}")
    missing = [p for p, spec in sig.parameters.items()
               if p != "self" and spec.default is inspect.Parameter.empty and p not in params]
    if missing:
        raise LDPError(f"{name} needs {', '.join(missing)}")
    return cls(**params)


def from_params(params: dict[str, Any]) -> FrequencyProtocol:
    """Inverse of ``proto.params()`` (used by campaign files and memo-state checks)."""
    p = dict(params)
    name = p.pop("protocol")
    p.pop("chosen", None)
    return make(name, **p)
