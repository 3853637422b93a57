"""The prefix-tree walk shared by the heavy-hitter protocols (PEM, :mod:`.pem`; TreeHist, :mod:`.treehist`), defined
once.

Both protocols find the frequent ``bits``-bit items without a candidate list by the same server-side walk (Wang, Li & Jha, IEEE TDSC 2021, the "prefix extending method"; Bassily, Nissim, Stemmer & Thakurta,
"Practical Locally Private Heavy Hitters", NeurIPS 2017, the TreeHist server): a device reports a prefix of its
item at one level of a tree, and the server

1. estimates every prefix of the first level (``2^ℓ_1`` candidates),
2. keeps the ``k_prime`` most frequent and extends each by every possible next ``ℓ_{i+1} - ℓ_i`` bits,
3. estimates only those candidates at the next level, and so on; the last level keeps the top ``k``.

**Level schedule** (:func:`level_schedule`): ``ℓ_i = min(bits, start_bits + i·step)``, ``i = 1 .. L``,
``L = ceil((bits - start_bits) / step)`` (PEM's ``s_0 = start_bits``, ``η = step``; TreeHist's binary tree is
``step = 1``, a ``2^step``-ary tree otherwise). What differs between the protocols is only the frequency oracle that
estimates a level's candidates: the ``estimate(level, candidates)`` callable of :func:`prefix_walk`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..errors import LDPError

__all__ = ["default_start_bits", "level_schedule", "prefix_walk", "MAX_FIRST_LEVEL_BITS"]

MAX_FIRST_LEVEL_BITS = 24  # the first level enumerates 2^ℓ_1 prefixes


def default_start_bits(k_prime: int) -> int:
    """``ceil(log2 k_prime)``: the paper's ``s_0`` (PEM), so the first level holds at least ``2 k_prime`` prefixes."""
    return max(0, math.ceil(math.log2(int(k_prime))))


def level_schedule(bits: int, start_bits: int, step: int, who: str = "prefix tree") -> tuple[int, ...]:
    """The prefix lengths ``(ℓ_1, .., ℓ_L)``, ``ℓ_i = min(bits, start_bits + i·step)`` (module doc)."""
    if isinstance(step, bool) or int(step) != step or step < 1:
        raise LDPError(f"{who}: step must be a positive integer, got {step}")
    if isinstance(start_bits, bool) or int(start_bits) != start_bits or not 0 <= start_bits < bits:
        raise LDPError(f"{who}: start_bits must lie in [0, bits), got {start_bits}")
    s0, step = int(start_bits), int(step)
    L = math.ceil((bits - s0) / step)
    out = tuple(min(int(bits), s0 + i * step) for i in range(1, L + 1))
    if out[0] > MAX_FIRST_LEVEL_BITS:
        raise LDPError(f"{who}: the first level enumerates 2^{out[0]} prefixes; lower start_bits + step")
    return out


def prefix_walk(prefix_bits: tuple[int, ...], estimate: Callable[[int, np.ndarray], np.ndarray], k: int,
                k_prime: int, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """The walk of the module doc: ``estimate(level, candidates)`` returns the estimated frequencies (``float``,
    one per candidate prefix of ``prefix_bits[level]`` bits); returns the top-``k`` prefixes of the last level
    (``dtype``: ``int64`` up to 63 bits, ``uint64`` for 64) and their estimates, most frequent first (ties: the
    smaller candidate index, a stable sort)."""
    dt = np.dtype(dtype)
    cands = np.arange(1 << prefix_bits[0], dtype=dt)
    last = len(prefix_bits) - 1
    for lvl in range(len(prefix_bits)):
        f = np.asarray(estimate(lvl, cands), dtype=np.float64)
        top = np.argsort(-f, kind="stable")[:(k if lvl == last else k_prime)]
        if lvl == last:
            return cands[top], f[top]
        ext = prefix_bits[lvl + 1] - prefix_bits[lvl]
        cands = ((cands[top][:, None] << dt.type(ext)) | np.arange(1 << ext, dtype=dt)[None, :]).ravel()
    raise LDPError("prefix_walk: no levels")  # pragma: no cover
