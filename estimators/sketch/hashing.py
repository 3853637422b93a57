"""The hash functions of the open-domain protocols (sketches and heavy hitters), defined once.

An open-domain value is a 64-bit integer: a device holding a string maps it to :func:`value_id`, the first 8
bytes (little-endian) of its SHA-256 (collisions among 10^6 distinct strings: probability below 3·10^-8), and
an integer attribute (``u64``) is its own id. Everything after that sees only ids.

A sketch or a Bloom filter hashes an id with one of a family of public functions indexed by a 64-bit seed
(a sketch row's, a RAPPOR cohort's hash function): nothing secret enters a hash, the randomization that follows
draws from the device's ChaCha20 streams (:mod:`estimators.randomness`). The family:

    h_seed(v) = top(mix64(v ^ spread(seed)), m),   spread(s) = mix64(s * 0x9E3779B97F4A7C15 + 0x5348),
    top(z, m) = ((z >> 32) * m) >> 32   (Lemire's multiply-shift range reduction onto [0, m), m < 2^32),

``mix64`` the SplitMix64 finalizer (Steele, Lea & Flood, OOPSLA 2014; :func:`estimators.kernels.mix64`), a
bijection of the 64-bit words: two ids never collide before the range reduction, and for a fixed pair of ids
the rows' hashes behave as independent draws (the tests measure the collision rate against ``1/m``).
Row ``j``'s seed of a protocol with public seed ``s`` is :func:`row_seeds` ``(s, rows)[j] = mix64(s + j + 1)``.

:func:`sketch_hash` is the numba kernel (every row of every id), :func:`np_sketch_hash` its numpy twin;
``tests/test_sketch_hashing.py`` holds test vectors that every implementation (device clients included) must
reproduce.
"""
from __future__ import annotations

import hashlib

import numba as nb
import numpy as np

from ..kernels import mix64

__all__ = ["SEED_SPREAD_MUL", "SEED_SPREAD_ADD", "np_row_seeds", "np_sketch_hash", "row_seeds", "sketch_hash",
           "spread", "value_id", "value_ids"]

SEED_SPREAD_MUL = np.uint64(0x9E3779B97F4A7C15)
SEED_SPREAD_ADD = np.uint64(0x5348)  # "SH"
_U32 = np.uint64(32)
_MASK64 = (1 << 64) - 1


def value_id(value: str | bytes | int) -> int:
    """The 64-bit id of an open-domain value: an ``int`` in ``[0, 2^64)`` is its own id, a ``str`` (UTF-8) or
    ``bytes`` the little-endian first 8 bytes of its SHA-256."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not an open-domain value")
    if isinstance(value, int):
        if not 0 <= value <= _MASK64:
            raise ValueError(f"an integer value must lie in [0, 2^64), got {value}")
        return value
    data = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def value_ids(values) -> np.ndarray:
    """:func:`value_id` of each value, ``uint64 (n,)``."""
    return np.fromiter((value_id(v) for v in values), dtype=np.uint64)


def spread(seed: int) -> int:
    """``mix64(seed * 0x9E3779B97F4A7C15 + 0x5348)`` (Python integers, exact)."""
    return _mix64_int((int(seed) * int(SEED_SPREAD_MUL) + int(SEED_SPREAD_ADD)) & _MASK64)


def _mix64_int(z: int) -> int:
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def row_seeds(seed: int, rows: int) -> np.ndarray:
    """The public seeds of ``rows`` hash functions of a protocol with public seed ``seed``: ``mix64(seed + j + 1)``."""
    return np.array([_mix64_int(int(seed) + j + 1) for j in range(int(rows))], dtype=np.uint64)


np_row_seeds = row_seeds  # pure Python integers: the same function serves as the reference


@nb.njit(cache=True, nogil=True)
def sketch_hash(ids, seeds, m):
    """``h_{seeds[j]}(ids[i])`` for every id and row: ``int64 (n, len(seeds))`` in ``[0, m)``."""
    n, r = ids.shape[0], seeds.shape[0]
    mm = np.uint64(m)
    spreads = np.empty(r, dtype=np.uint64)
    for j in range(r):
        spreads[j] = mix64(seeds[j] * SEED_SPREAD_MUL + SEED_SPREAD_ADD)
    out = np.empty((n, r), dtype=np.int64)
    for i in range(n):
        v = np.uint64(ids[i])
        for j in range(r):
            z = mix64(v ^ spreads[j])
            out[i, j] = np.int64(((z >> _U32) * mm) >> _U32)
    return out


def np_sketch_hash(ids: np.ndarray, seeds: np.ndarray, m: int) -> np.ndarray:
    """The numpy twin of :func:`sketch_hash`."""
    v = np.asarray(ids, dtype=np.uint64)[:, None]
    with np.errstate(over="ignore"):
        s = np.asarray(seeds, dtype=np.uint64) * SEED_SPREAD_MUL + SEED_SPREAD_ADD
        sp = _np_mix64(s)[None, :]
        z = _np_mix64(v ^ sp)
        return (((z >> _U32) * np.uint64(m)) >> _U32).astype(np.int64)


def _np_mix64(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
