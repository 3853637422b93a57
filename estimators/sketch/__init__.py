"""Open-domain protocols: frequency oracles over values nobody listed in advance (sketches: CMS, HCMS, RAPPOR with
Bloom filters) and heavy hitters (PEM, TreeHist, on the prefix-tree walk of :mod:`.prefix`), on 64-bit value ids
(:mod:`.hashing`: the ids and the public hash family, defined once). The heavy hitters are exported lazily (their
numba kernels load on first use, not with the hash functions)."""
from __future__ import annotations

from importlib import import_module
from typing import Any

from .hashing import row_seeds, sketch_hash, value_id, value_ids

__all__ = ["PEM", "TreeHist", "level_schedule", "prefix_walk", "row_seeds", "sketch_hash", "value_id", "value_ids"]

_LAZY = {"PEM": ".pem", "TreeHist": ".treehist", "level_schedule": ".prefix", "prefix_walk": ".prefix"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
