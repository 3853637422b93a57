"""``make_solution(name, **params)``: the one constructor of every multidimensional solution
(:mod:`estimators.multidim`), by its public name."""
from __future__ import annotations

import inspect
from typing import Any

from .multidim import Solution
from .registry import constructor_parameters, construct, lookup

_SOLUTIONS: dict[str, type[Solution]] = {}


def register_solution(cls: type[Solution]) -> type[Solution]:
    _SOLUTIONS[cls.name] = cls
    return cls


def solutions() -> tuple[str, ...]:
    return tuple(_SOLUTIONS)


def solution_parameters(name: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters ``make_solution(name, ...)`` accepts, with their defaults."""
    return constructor_parameters(lookup(_SOLUTIONS, name, "solution"))


def make_solution(solution: str, **params: Any) -> Solution:
    """Build a multidimensional solution: ``make_solution("ALLOMFREE", ks=[2, 10, 300], eps_inf=2.0,
    eps_1=1.0)``; ``make_solution(**sol.params())`` rebuilds ``sol``."""
    return construct(lookup(_SOLUTIONS, solution, "solution"), solution, params)


def solution_from_params(params: dict[str, Any]) -> Solution:
    """Inverse of ``solution.params()``."""
    return make_solution(**params)
