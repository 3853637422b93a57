"""``make(name, **params)``: every protocol by its public name, with the reference's keyword checks
(``estimators/registry.py``); ``make_numeric(name, **params)``: every numeric mechanism
(``estimators/numeric/__init__.py``); ``make_open(name, **params)``: every open-domain protocol of a
``type = "string"`` / ``"u64"`` attribute (``estimators/sketch/registry.py``). Adding an open-domain protocol is a
module (an :class:`ldp_device.sketch.OpenDomainProtocol`) and one line of :data:`OPEN_PROTOCOLS`."""
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

__all__ = ["PROTOCOLS", "MECHANISMS", "OPEN_PROTOCOLS", "make", "make_numeric", "make_open", "from_params",
           "parameters", "construct", "lookup"]

T = TypeVar("T")

PROTOCOLS: dict[str, type[Protocol]] = {c.name: c for c in (
    GRR, SUE, OUE, ADP, LGRR, LSUE, LOUE, LOSUE, LSOUE, LADP, HR, FHR, BLH, OLH, LOLOHA, DBitFlipPM, SS, SHE, THE)}

class _Lazy(Mapping):
    """Name -> class, each module imported on first use (``_WHERE``: name -> (module, class))."""

    _WHERE: dict[str, tuple[str, str]] = {}

    def __getitem__(self, name: str) -> type:
        module, cls = self._WHERE[name]
        return getattr(importlib.import_module(f"{__package__}.{module}"), cls)

    def __iter__(self) -> Iterator[str]:
        return iter(self._WHERE)

    def __len__(self) -> int:
        return len(self._WHERE)


class _Mechanisms(_Lazy):
    """Name -> class of the numeric mechanisms, each module imported on first use (a device that reports no
    numeric attribute never loads them: ``import ldp_device`` stays light)."""

    _WHERE = {"Laplace": ("laplace", "Laplace"), "Duchi": ("duchi", "Duchi"), "PM": ("piecewise", "PM"),
              "HM": ("piecewise", "HM"), "SW": ("square_wave", "SW"), "1BitMean": ("onebit", "OneBitMean")}


class _OpenProtocols(_Lazy):
    """Name -> class of the open-domain protocols (``estimators.sketch.OPEN_PROTOCOLS``), imported on first use.
    A new protocol: its module and one line here."""

    _WHERE = {"CMS": ("cms", "CMS"), "HCMS": ("cms", "HCMS"), "TreeHist": ("treehist", "TreeHist")}


#: the numeric mechanisms of a ``type = "numeric"`` attribute, by name (``estimators.numeric.MECHANISMS``)
MECHANISMS: Mapping[str, type[NumericMechanism]] = _Mechanisms()
#: the open-domain protocols of a ``type = "string"`` / ``"u64"`` attribute, by name
OPEN_PROTOCOLS: Mapping[str, type[Protocol]] = _OpenProtocols()


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


def make_open(name: str, **params: Any) -> Protocol:
    """Build an open-domain protocol: ``make_open("HCMS", eps=4.0, m=256, k=16, seed=value_id("crash"))``."""
    return construct(lookup(OPEN_PROTOCOLS, name, "open-domain protocol"), name, params)


def from_params(params: dict[str, Any]) -> Protocol:
    """Inverse of ``proto.params()`` (a protocol's, a numeric mechanism's: ``{"mechanism": ..., ...}``, or an
    open-domain protocol's)."""
    p = dict(params)
    if "mechanism" in p and "protocol" not in p:
        return make_numeric(p.pop("mechanism"), **p)
    if p.get("protocol") in OPEN_PROTOCOLS:
        return make_open(p.pop("protocol"), **p)
    name = p.pop("protocol")
    p.pop("chosen", None)
    return make(name, **p)
