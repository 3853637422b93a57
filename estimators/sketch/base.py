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
from ..memo import MemoState
from .treehist_kernels import tag_counts

__all__ = ["OpenDomainProtocol", "TagMemo", "TopK", "Z95", "as_ids"]

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


class TagMemo:
    """The exact longitudinal accounting of the open-domain protocols that memoize (TreeHist, RAPPOR, PEM): a
    device's ``memo_slots`` bits of memo state are a table of ``memo_slots / 64`` keyed 64-bit tags of the inputs it
    memoized (:func:`.treehist_kernels.mark_tags`, each protocol its own stream domain), one ε∞ charged per distinct
    input, ``inf`` once the table overflowed. A subclass sets ``memo_slots`` with :meth:`check_memo_slots` and has
    ``fingerprint`` and ``eps_inf``."""

    memo_slots: int
    fingerprint: str
    eps_inf: float

    @classmethod
    def check_memo_slots(cls, memo_slots: int) -> int:
        """``memo_slots`` as an int: a positive multiple of 64 (else :class:`LDPError`)."""
        if isinstance(memo_slots, bool) or int(memo_slots) != memo_slots or memo_slots < 64 or memo_slots % 64:
            raise LDPError(f"{cls.__name__}: memo_slots must be a positive multiple of 64 (bits of memo state: "
                           f"memo_slots / 64 tags of 64 bits), got {memo_slots!r}")
        return int(memo_slots)

    @property
    def memo_size(self) -> int:
        return self.memo_slots

    @property
    def memo_tags(self) -> int:
        """Tags in a device's table: at most this many distinct memoized inputs are accounted."""
        return self.memo_slots // 64

    def new_state(self, n_devices: int, rng: np.random.Generator | None = None) -> MemoState:
        return MemoState.fresh(self.fingerprint, n_devices, self.memo_slots, rng)

    def memoized_counts(self, state: MemoState) -> np.ndarray:
        """Distinct memoized inputs of each device, ``float64 (n_devices,)``: the nonzero tags of its table, ``inf``
        once it overflowed. The argument of :meth:`longitudinal_loss`."""
        if state.seen.shape[1] != self.memo_tags * 8:
            raise LDPError(f"{type(self).__name__}: a memo state of {state.seen.shape[1]} bytes per device is no "
                           f"table of {self.memo_tags} tags")
        return tag_counts(state.seen)

    def longitudinal_loss(self, memoized: np.ndarray | int) -> np.ndarray | float:
        """ε on a device's values after memoizing ``memoized`` distinct inputs: one ε∞ each (``inf``, an overflowed
        tag table: ``inf``)."""
        return np.asarray(memoized) * self.eps_inf


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
