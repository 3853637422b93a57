"""``make(name, **params)``: the one constructor of every protocol, by its public name, and the checked
construction both registries use (the solutions' own: :mod:`estimators.solution_registry`)."""
from __future__ import annotations

import inspect
from typing import Any, TypeVar

from .base import FrequencyProtocol
from .errors import LDPError

T = TypeVar("T")

_REGISTRY: dict[str, type[FrequencyProtocol]] = {}


def register(cls: type[FrequencyProtocol]) -> type[FrequencyProtocol]:
    _REGISTRY[cls.name] = cls
    return cls


def protocols() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def lookup(table: dict[str, T], name: str, what: str) -> T:
    """``table[name]``, or an :class:`LDPError` naming the known ``what``s."""
    try:
        return table[name]
    except KeyError:
        raise LDPError(f"unknown {what} {name!r}; known: {', '.join(table)}") from None


def _protocol_class(name: str) -> type[FrequencyProtocol]:
    return lookup(_REGISTRY, name, "protocol")


def constructor_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The keyword parameters of ``cls``'s constructor, with their defaults."""
    sig = inspect.signature(cls.__init__)
    return {p: spec for p, spec in sig.parameters.items() if p != "self"}


def construct(cls: type[T], name: str, params: dict[str, Any]) -> T:
    """``cls(**params)`` after checking the keywords against its constructor (unknown or missing ones)."""
    accepted = constructor_parameters(cls)
    unknown = set(params) - set(accepted)
    if unknown:
        raise LDPError(f"{name} does not take {', '.join(sorted(unknown))}; it takes {', '.join(accepted)}")
    missing = [p for p, spec in accepted.items() if spec.default is inspect.Parameter.empty and p not in params]
    if missing:
        raise LDPError(f"{name} needs {', '.join(missing)}")
    return cls(**params)


def parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``make(name, ...)`` accepts, with their defaults."""
    return constructor_parameters(_protocol_class(name))


def make(name: str, **params: Any) -> FrequencyProtocol:
    """Build a protocol: ``make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)``."""
    return construct(_protocol_class(name), name, params)


def from_params(params: dict[str, Any]) -> FrequencyProtocol:
    """Inverse of ``proto.params()`` (used by campaign files and memo-state checks)."""
    p = dict(params)
    name = p.pop("protocol")
    p.pop("chosen", None)
    return make(name, **p)
