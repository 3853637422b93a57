"""``make(name, **params)``: every protocol by its public name, with the reference's keyword checks
(``estimators/registry.py``); ``make_numeric(name, **params)``: every numeric mechanism
(``estimators/numeric/__init__.py``)."""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from .adaptive import ADP, LADP
from .base import Protocol
from .bitflip import DBitFlipPM
from .direct import GRR, LGRR
from .errors import LDPError
from .hadamard import FHR, HR
from .hashing import BLH, LOLOHA, OLH
from .histogram import SHE, THE
from .numeric import NumericMechanism
from .subset import SS
from .unary import LOSUE, LOUE, LSOUE, LSUE, OUE, SUE

__all__ = ["PROTOCOLS", "MECHANISMS", "make", "make_numeric", "from_params", "parameters", "construct", "lookup"]

T = TypeVar("T")

PROTOCOLS: dict[str, type[Protocol]] = {c.name: c for c in (
    GRR, SUE, OUE, ADP, LGRR, LSUE, LOUE, LOSUE, LSOUE, LADP, HR, FHR, BLH, OLH, LOLOHA, DBitFlipPM, SS, SHE, THE)}

class _Mechanisms(Mapping):
    """Name -> class of the numeric mechanisms, each module imported on first use (a device that reports no
    numeric attribute never loads them: ``import ldp_device`` stays light)."""

    _WHERE = {"Laplace": ("laplace", "Laplace"), "Duchi": ("duchi", "Duchi"), "PM": ("piecewise", "PM"),
              "HM": ("piecewise", "HM"), "SW": ("square_wave", "SW"), "1BitMean": ("onebit", "OneBitMean")}

    def __getitem__(self, name: str) -> type[NumericMechanism]:
        module, cls = self._WHERE[name]
        return getattr(importlib.import_module(f"{__package__}.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(self._WHERE)

    def __len__(self) -> int:
        return len(self._WHERE)


#: the numeric mechanisms of a ``type = "numeric"`` attribute, by name (``estimators.numeric.MECHANISMS``)
MECHANISMS: Mapping[str, type[NumericMechanism]] = _Mechanisms()


def lookup(table: dict[str, T], name: str, what: str) -> T:
    try:
        return table[name]
    except (KeyError, TypeError):
        raise LDPError(f"unknown {what} {name!r}; known: {', '.join(table)}") from None


def constructor_parameters(cls: type) -> dict[str, bool]:
    """The keyword parameters of ``cls``'s constructor -> whether each is required (no default)."""
    init = cls.__init__
    code = init.__code__
    npos = code.co_argcount
    names = code.co_varnames[:npos + code.co_kwonlyargcount]
    defaults = init.__defaults__ or ()
    kwdefaults = init.__kwdefaults__ or {}
    out = {}
    for i, name in enumerate(names):
        if i == 0:
            continue  # self
        out[name] = (i < npos - len(defaults)) if i < npos else name not in kwdefaults
    return out


def construct(cls: type[T], name: str, params: dict[str, Any]) -> T:
    """``cls(**params)`` after checking the keywords against its constructor (unknown or missing ones)."""
    accepted = constructor_parameters(cls)
    unknown = set(params) - set(accepted)
    if unknown:
        raise LDPError(f"{name} does not take {', '.join(sorted(unknown))}; it takes {', '.join(accepted)}")
    missing = [p for p, required in accepted.items() if required and p not in params]
    if missing:
        raise LDPError(f"{name} needs {', '.join(missing)}")
    return cls(**params)


def parameters(name: str) -> dict[str, bool]:
    """The keyword parameters ``make(name, ...)`` accepts -> whether each is required."""
    return constructor_parameters(lookup(PROTOCOLS, name, "protocol"))


def make(name: str, **params: Any) -> Protocol:
    """Build a protocol: ``make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)``."""
    return construct(lookup(PROTOCOLS, name, "protocol"), name, params)


def make_numeric(name: str, **params: Any) -> NumericMechanism:
    """Build a numeric mechanism: ``make_numeric("PM", eps=1.0, lo=0.0, hi=600.0)``."""
    return construct(lookup(MECHANISMS, name, "numeric mechanism"), name, params)


def from_params(params: dict[str, Any]) -> Protocol:
    """Inverse of ``proto.params()`` (a protocol's, or a numeric mechanism's: ``{"mechanism": ..., ...}``)."""
    p = dict(params)
    if "mechanism" in p and "protocol" not in p:
        return make_numeric(p.pop("mechanism"), **p)
    name = p.pop("protocol")
    p.pop("chosen", None)
    return make(name, **p)
