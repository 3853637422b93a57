"""The contract of an open-domain protocol: what the pipeline asks of a sketch or heavy-hitter protocol whose
values are strings (or 64-bit integers) nobody listed in advance.

A device's value is its 64-bit id (:func:`.hashing.value_id`: a string's SHA-256, an integer itself); the protocol
randomizes ids and its support counts are a fixed-size integer vector (a sketch matrix), additive over reports,
so the count store keeps it exactly once like any other step vector. The server answers two questions from a
step's support:

* :meth:`OpenDomainProtocol.estimate`: the frequencies of given candidate ids (a campaign's candidate list, a
  query of the HTTP API);
* :meth:`OpenDomainProtocol.top_k`: the ``k`` most frequent items with 95 % intervals; a sketch ranks the
  candidates it is given, a heavy-hitter protocol finds them without a list.

An item is an id's top :attr:`OpenDomainProtocol.item_bits` bits (64 for the sketches: the id itself): a
heavy-hitter protocol over fewer bits cannot tell two ids with the same top bits apart, and names an item by the
smallest id of its prefix; :meth:`OpenDomainProtocol.items_of` maps candidate ids to their items, so a caller can
name a found item by the candidate strings it knows.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..base import FrequencyProtocol
from ..errors import LDPError

__all__ = ["OpenDomainProtocol", "TopK", "Z95", "as_ids"]

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def as_ids(values) -> np.ndarray:
    """Value ids as ``uint64 (n,)`` from any integer array (negative or non-integer refused)."""
    v = np.asarray(values)
    if v.ndim != 1:
        raise LDPError(f"ids must be a 1-d array, got shape {v.shape}")
    if v.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if v.dtype == np.uint64:
        return np.ascontiguousarray(v)
    if not np.issubdtype(v.dtype, np.integer):
        raise LDPError(f"ids must be integers (value ids of strings: estimators.sketch.value_ids), got {v.dtype}")
    if v.min() < 0:
        raise LDPError("ids must be non-negative 64-bit integers")
    return np.ascontiguousarray(v, dtype=np.uint64)


@dataclass(frozen=True)
class TopK:
    """The ``k`` most frequent items of a step, most frequent first: ``items`` (``uint64``, an item's smallest id:
    its ``item_bits`` top bits followed by zeros), estimated frequencies (fractions of ``n``) and their 95 %
    intervals."""

    items: np.ndarray
    freq: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    item_bits: int = 64


class OpenDomainProtocol(FrequencyProtocol):
    """A frequency protocol over 64-bit value ids (module doc)."""

    open_domain: ClassVar[bool] = True
    item_bits: ClassVar[int] = 64
    #: a heavy-hitter protocol: :meth:`top_k` finds the items without candidates (a sketch ranks candidates)
    finds_items: ClassVar[bool] = False

    @property
    def domain_size(self) -> int:
        raise LDPError(f"{self.name} estimates over an open domain: pass the candidate ids to estimate()")

    def check_values(self, values) -> np.ndarray:
        return as_ids(values)

    def items_of(self, ids) -> np.ndarray:
        """The item of each id (``uint64``): its top :attr:`item_bits` bits, followed by zeros."""
        d = as_ids(ids)
        if self.item_bits >= 64:
            return d
        shift = np.uint64(64 - self.item_bits)
        return (d >> shift) << shift

    @abstractmethod
    def reports_in(self, support: np.ndarray) -> int:
        """How many reports a support vector counts (its ``n``)."""

    @abstractmethod
    def estimate(self, support: np.ndarray, n: int, ids=None, postprocess: str | None = None) -> np.ndarray:
        """Estimated frequencies (fractions of ``n``) of the candidate ``ids``."""

    def top_k(self, support: np.ndarray, n: int, k: int, candidates=None) -> TopK:
        """The ``k`` most frequent of ``candidates`` with 95 % intervals from :meth:`variance_exact`. A
        heavy-hitter protocol overrides it to find items without candidates."""
        k = int(k)
        if candidates is None or len(candidates) == 0:
            empty = np.zeros(0)
            return TopK(np.zeros(0, dtype=np.uint64), empty, empty, empty, self.item_bits)
        ids = np.unique(self.items_of(candidates))
        f = np.asarray(self.estimate(support, n, ids), dtype=np.float64)
        top = np.argsort(-f, kind="stable")[:k]
        half = Z95 * np.sqrt(np.asarray(self.variance_exact(np.clip(f[top], 0.0, 1.0), n), dtype=np.float64))
        return TopK(ids[top], f[top], f[top] - half, f[top] + half, self.item_bits)
