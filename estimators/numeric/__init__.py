"""Numeric mechanisms: the mean (and, for Square Wave, the distribution) of a bounded numeric metric under
ε-LDP (:mod:`estimators.numeric.base`: the interface). One module per family:

* :mod:`.laplace`: Laplace on ``[-1, 1]`` sampled exactly (the baseline);
* :mod:`.duchi`: Duchi, Jordan & Wainwright's one-dimensional mechanism (JASA 2018);
* :mod:`.piecewise`: the Piecewise and Hybrid Mechanisms, and their k-of-d sampling (Wang et al., ICDE 2019);
* :mod:`.square_wave`: Square Wave with EMS reconstruction of the distribution (Li et al., SIGMOD 2020);
* :mod:`.onebit`: 1BitMean with α-point rounding memoization for repeated collection (Ding, Kulkarni &
  Yekhanin, NeurIPS 2017).
"""
from __future__ import annotations

import importlib
from typing import Any

from .base import NumericMechanism, eps_of_law, from_unit, to_unit

__all__ = ["MECHANISMS", "NumericMechanism", "eps_of_law", "from_unit", "make_numeric", "to_unit"]

#: mechanism name -> "module:class" (imported on first use)
MECHANISMS: dict[str, str] = {
    "Laplace": "laplace:Laplace",
    "Duchi": "duchi:Duchi",
    "PM": "piecewise:PM",
    "HM": "piecewise:HM",
    "SW": "square_wave:SW",
    "1BitMean": "onebit:OneBitMean",
}


def make_numeric(name: str, **params: Any) -> NumericMechanism:
    """The numeric mechanism ``name`` (a key of :data:`MECHANISMS`) with ``params`` (``eps``, ``lo``, ``hi``,
    and the mechanism's own)."""
    if name not in MECHANISMS:
        raise KeyError(f"unknown numeric mechanism {name!r}; known: {', '.join(MECHANISMS)}")
    module, cls = MECHANISMS[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)(**params)
