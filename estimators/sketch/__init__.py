"""Open-domain protocols: frequency oracles over values nobody listed in advance (sketches: CMS, HCMS, RAPPOR with
Bloom filters) and heavy hitters (PEM), on 64-bit value ids (:mod:`.hashing`: the ids and the public hash family,
defined once)."""
from __future__ import annotations

from .hashing import row_seeds, sketch_hash, value_id, value_ids

__all__ = ["row_seeds", "sketch_hash", "value_id", "value_ids"]
