"""The open-domain protocols a campaign attribute may name (``type = "string"`` or ``"u64"``) and their checked
construction; the device SDKs and the worker build them from the same names and keywords."""
from __future__ import annotations

from typing import Any

from ..errors import LDPError
from .base import OpenDomainProtocol
from .cms import CMS, HCMS
from .treehist import TreeHist

__all__ = ["OPEN_PROTOCOLS", "make_open"]

#: name -> class of every open-domain protocol a campaign may name
OPEN_PROTOCOLS: dict[str, type[OpenDomainProtocol]] = {"CMS": CMS, "HCMS": HCMS, "TreeHist": TreeHist}


def make_open(name: str, **params: Any) -> OpenDomainProtocol:
    """The open-domain protocol ``name`` with its keyword parameters (a clear error for an unknown name or
    parameter)."""
    cls = OPEN_PROTOCOLS.get(name)
    if cls is None:
        raise LDPError(f"unknown open-domain protocol {name!r}; one of {', '.join(OPEN_PROTOCOLS)}")
    try:
        return cls(**params)
    except TypeError as exc:
        raise LDPError(f"{name}: {exc}") from exc
