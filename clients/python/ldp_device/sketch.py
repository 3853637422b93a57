"""Open-domain values: their 64-bit ids, the public hash family of the sketches, and the device side of an
open-domain protocol (``estimators/sketch/hashing.py``, ``base.py``; ``type = "string"`` / ``"u64"`` attributes).

A string's id is the little-endian first 8 bytes of the SHA-256 of its UTF-8 bytes; an integer in ``[0, 2^64)`` is
its own id (:func:`value_id`). The device hashes on the device: only the randomized report of the id leaves it.

The hash family (exact 64-bit arithmetic on Python integers)::

    h_seed(v) = top(mix64(v ^ spread(seed)), m),   spread(s) = mix64(s * 0x9E3779B97F4A7C15 + 0x5348),
    top(z, m) = ((z >> 32) * m) >> 32,             row_seeds(s, rows)[j] = mix64(s + j + 1)

``mix64`` the SplitMix64 finalizer. :class:`OpenDomainProtocol` is what an open-domain protocol module (CMS and
HCMS in :mod:`ldp_device.cms`, TreeHist in :mod:`ldp_device.treehist`) builds on: a report of ONE id, fresh noise per
report (memoryless), the parameters ``{"protocol", "eps", ..., "seed"}`` of the reference.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, ClassVar

from .base import MemoState, Protocol
from .errors import LDPError
from .streams import KeySource, os_key

__all__ = ["M64", "SEED_SPREAD_MUL", "SEED_SPREAD_ADD", "value_id", "mix64", "spread", "row_seeds", "sketch_hash",
           "rejection_limit", "flip_threshold", "OpenDomainProtocol"]

M64 = (1 << 64) - 1
SEED_SPREAD_MUL = 0x9E3779B97F4A7C15
SEED_SPREAD_ADD = 0x5348  # "SH"


def value_id(value: str | bytes | int) -> int:
    """The 64-bit id of an open-domain value: an ``int`` in ``[0, 2^64)`` is its own id, a ``str`` (UTF-8) or
    ``bytes`` the little-endian first 8 bytes of its SHA-256."""
    if isinstance(value, bool):
        raise LDPError("a boolean is not an open-domain value")
    if isinstance(value, int):
        if not 0 <= value <= M64:
            raise LDPError(f"an integer value must lie in [0, 2^64), got {value}")
        return value
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray)):
        data = bytes(value)
    else:
        raise LDPError(f"an open-domain value is a string or an integer in [0, 2^64), got {value!r}")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def mix64(z: int) -> int:
    """The SplitMix64 finalizer of ``z mod 2^64``."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def spread(seed: int) -> int:
    """``mix64(seed * 0x9E3779B97F4A7C15 + 0x5348)``: a row seed spread over 64 bits."""
    return mix64(seed * SEED_SPREAD_MUL + SEED_SPREAD_ADD)


def row_seeds(seed: int, rows: int) -> list[int]:
    """The public seeds of ``rows`` hash functions of a protocol with public seed ``seed``: ``mix64(seed + j + 1)``."""
    return [mix64(seed + j + 1) for j in range(rows)]


def sketch_hash(vid: int, row_seed: int, m: int) -> int:
    """``h_{row_seed}(vid)`` in ``[0, m)`` (the reference's ``sketch_hash`` of one id and one row)."""
    z = mix64(vid ^ spread(row_seed))
    return ((z >> 32) * m) >> 32


def rejection_limit(m: int) -> int:
    """``2^64 - 1 - (2^64 mod m)``: the largest word a uniform draw of ``[0, m)`` by ``word % m`` accepts."""
    return M64 - ((1 << 64) % m)


def flip_threshold(eps: float, bits: int) -> int:
    """``T = ceil(2^bits / (e^eps + 1))``, at least 1 (60-digit decimal arithmetic, as the reference)."""
    from decimal import Decimal, localcontext  # on first use: `import ldp_device` stays light

    with localcontext() as ctx:
        ctx.prec = 60
        return max(1, math.ceil(Decimal(1 << bits) / (Decimal(float(eps)).exp() + 1)))


class OpenDomainProtocol(Protocol):
    """The device side of an open-domain protocol: randomizes ONE 64-bit value id per report (fresh noise, no memo
    state). A campaign attribute's ``k`` is the protocol's support size, not a domain size."""

    open_domain: ClassVar[bool] = True
    seed: int

    @property
    def domain_size(self) -> int:
        raise LDPError(f"{self.name} randomizes open-domain values (64-bit ids): it has no domain size")

    def check_value(self, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= M64:
            raise LDPError(f"{self.name} randomizes value ids, integers in [0, 2^64) (a string's id: "
                           f"ldp_device.sketch.value_id), got {value!r}")
        return value

    def randomize_value(self, value: str | int, draw_key: KeySource = os_key) -> bytes:
        """The report of one device holding ``value`` (a string, or an integer id in ``[0, 2^64)``)."""
        return self.randomize(value_id(value), draw_key)

    def randomize(self, value: int, draw_key: KeySource = os_key, state: MemoState | None = None) -> bytes:
        return super().randomize(value, draw_key, state)

    def params(self) -> dict[str, Any]:
        raise NotImplementedError
