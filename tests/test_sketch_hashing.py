"""The open-domain hash family (estimators/sketch/hashing.py): test vectors every implementation must reproduce,
the numba kernel against its numpy twin, and the family's collision rates against 1/m."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.sketch.hashing import np_sketch_hash, row_seeds, sketch_hash, value_id

#: (value, its id) and the hashes of those ids under row_seeds(42, 4) onto m = 1024
IDS = [(0, 0), (1, 1), (2**64 - 1, 2**64 - 1), ("hello", value_id("hello")),
       ("https://example.com/", value_id("https://example.com/"))]
VECTORS = [[232, 861, 84, 535], [989, 448, 42, 489], [217, 546, 963, 460], [331, 151, 231, 793],
           [510, 615, 277, 229]]


def test_value_ids_are_sha256_prefixes_and_integers_are_their_own() -> None:
    assert value_id("hello") == 0x0EA3B05FBA4DF22C  # sha256("hello") = 2cf24dba5fb0a30e...: its first 8 bytes, little-endian
    assert value_id(b"hello") == value_id("hello") and value_id(7) == 7
    for bad in (-1, 2**64, True):
        with pytest.raises((ValueError, TypeError)):
            value_id(bad)


def test_the_vectors_and_the_twin() -> None:
    ids = np.array([i for _, i in IDS], dtype=np.uint64)
    seeds = row_seeds(42, 4)
    assert sketch_hash(ids, seeds, 1024).tolist() == VECTORS == np_sketch_hash(ids, seeds, 1024).tolist()
    rng = np.random.default_rng(5)
    many = rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64, endpoint=True)
    for m in (2, 1000, 1 << 16):
        np.testing.assert_array_equal(sketch_hash(many, row_seeds(9, 3), m), np_sketch_hash(many, row_seeds(9, 3), m))


def test_collisions_happen_at_rate_one_over_m_and_rows_are_independent() -> None:
    rng = np.random.default_rng(11)
    n, m = 200_000, 256
    a = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    b = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    same = sketch_hash(a, row_seeds(3, 2), m) == sketch_hash(b, row_seeds(3, 2), m)
    p = 1 / m
    for j in range(2):  # a binomial rate: within 4 sd
        assert abs(same[:, j].mean() - p) < 4 * np.sqrt(p * (1 - p) / n)
    both = (same[:, 0] & same[:, 1]).mean()  # independent rows: p^2
    assert abs(both - p * p) < 4 * np.sqrt(p * p / n) + 1 / n
    # consecutive ids (a counter attribute) spread as well as random ones
    seq = np.arange(n, dtype=np.uint64)
    counts = np.bincount(sketch_hash(seq, row_seeds(3, 1), m)[:, 0], minlength=m)
    assert counts.max() - counts.min() < 8 * np.sqrt(n / m)
