"""``make(name, **params)``: the one constructor of every protocol, by its public name, and
``make_solution(name, **params)``: the same for the multidimensional solutions (:mod:`estimators.multidim`)."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from .base import FrequencyProtocol
from .errors import LDPError

if TYPE_CHECKING:
    from .multidim import Solution

_REGISTRY: dict[str, type[FrequencyProtocol]] = {}
_SOLUTIONS: dict[str, type["Solution"]] = {}


def register(cls: type[FrequencyProtocol]) -> type[FrequencyProtocol]:
    _REGISTRY[cls.name] = cls
    return cls


def register_solution(cls: type["Solution"]) -> type["Solution"]:
    _SOLUTIONS[cls.name] = cls
    return cls


def protocols() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def solutions() -> tuple[str, ...]:
    return tuple(_SOLUTIONS)


def _lookup(table: dict[str, type], name: str, what: str) -> type:
    try:
        return table[name]
    except KeyError:
        raise LDPError(f"unknown {what} {name!r}; known: {', '.join(table)}") from None


def _protocol_class(name: str) -> type[FrequencyProtocol]:
    return _lookup(_REGISTRY, name, "protocol")


def _keywords(cls: type) -> dict[str, inspect.Parameter]:
    sig = inspect.signature(cls.__init__)
    return {p: spec for p, spec in sig.parameters.items() if p != "self"}


def _build(cls: type, name: str, params: dict[str, Any]) -> Any:
    """``cls(**params)`` after checking the keywords against its constructor (unknown or missing ones)."""
    accepted = _keywords(cls)
    unknown = set(params) - set(accepted)
    if unknown:
        raise LDPError(f"{name} does not take {', '.join(sorted(unknown))}; it takes {', '.join(accepted)}")
    missing = [p for p, spec in accepted.items() if spec.default is inspect.Parameter.empty and p not in params]
    if missing:
        raise LDPError(f"{name} needs {', '.join(missing)}")
    return cls(**params)


def parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``make(name, ...)`` accepts, with their defaults."""
    return _keywords(_protocol_class(name))


def solution_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``make_solution(name, ...)`` accepts, with their defaults."""
    return _keywords(_lookup(_SOLUTIONS, name, "solution"))


def make(name: str, **params: Any) -> FrequencyProtocol:
    """Build a protocol: ``make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)``."""
    return _build(_protocol_class(name), name, params)


def make_solution(solution: str, **params: Any) -> "Solution":
    """Build a multidimensional solution: ``make_solution("ALLOMFREE", ks=[2, 10, 300], eps_inf=2.0,
    eps_1=1.0)``; ``make_solution(**sol.params())`` rebuilds ``sol``."""
    return _build(_lookup(_SOLUTIONS, solution, "solution"), solution, params)


def from_params(params: dict[str, Any]) -> FrequencyProtocol:
    """Inverse of ``proto.params()`` (used by campaign files and memo-state checks)."""
    p = dict(params)
    name = p.pop("protocol")
    p.pop("chosen", None)
    return make(name, **p)


def solution_from_params(params: dict[str, Any]) -> "Solution":
    """Inverse of ``solution.params()``."""
    return make_solution(**params)
