"""Counter-based randomness shared by every randomizer kernel.

A uniform draw is a pure function of ``(key, a, b)``: ``unit(key, a, b)``. Two uses:

* **Memoization (PRR)**: with ``key`` = the device's secret memo key and ``a`` = the memoized
  input (a value, a hash value or a bucket), the permanent randomized response is a
  deterministic function of state that survives restarts: the same input always gives the
  same memoized output, and a restored key reproduces every memoized output exactly.
* **Fresh randomness (IRR, single-shot)**: with ``key`` = a per-batch seed drawn from the
  caller's ``numpy.random.Generator`` and ``a`` = the row index.

The mixer is SplitMix64's finalizer (Steele, Lea & Flood 2014). Each numba kernel has a
plain-numpy reference in this module's ``np_*`` twins; tests check they agree bit for bit.
"""
from __future__ import annotations

import numba as nb
import numpy as np

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO53 = 1.0 / 9007199254740992.0  # 2**-53


@nb.njit(inline="always", cache=True)
def mix64(z: np.uint64) -> np.uint64:
    """SplitMix64 finalizer: a bijective avalanche mix of a 64-bit word."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@nb.njit(inline="always", cache=True)
def word(key: np.uint64, a: np.uint64, b: np.uint64) -> np.uint64:
    """64 pseudo-random bits addressed by ``(key, a, b)``."""
    h = mix64(key + np.uint64(a) * np.uint64(0x9E3779B97F4A7C15))
    return mix64(h ^ (np.uint64(b) * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x8CB92BA72F3D8DD7)))


@nb.njit(inline="always", cache=True)
def unit(key: np.uint64, a: np.uint64, b: np.uint64) -> float:
    """Uniform double in [0, 1) with 53 random bits, addressed by ``(key, a, b)``."""
    return float(word(key, a, b) >> np.uint64(11)) * 1.1102230246251565e-16


@nb.njit(inline="always", cache=True)
def other_than(x: np.int64, m: np.int64, u: float) -> np.int64:
    """A value uniform over ``[0, m) \\ {x}`` from one uniform ``u``."""
    o = np.int64(u * (m - 1))
    if o >= x:
        o += 1
    return o


# ---------------------------------------------------------------- numpy references
def np_mix64(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def np_word(key, a, b) -> np.ndarray:
    key = np.asarray(key, dtype=np.uint64)
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = np_mix64(key + a * GOLDEN)
        return np_mix64(h ^ (b * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x8CB92BA72F3D8DD7)))


def np_unit(key, a, b) -> np.ndarray:
    return (np_word(key, a, b) >> np.uint64(11)).astype(np.float64) * _TWO53


def np_other_than(x: np.ndarray, m: int, u: np.ndarray) -> np.ndarray:
    o = (u * (m - 1)).astype(np.int64)
    return o + (o >= x)


def draw_seed(rng: np.random.Generator) -> np.uint64:
    """A fresh 64-bit batch seed from the caller's generator."""
    return np.uint64(rng.integers(0, 2**63, dtype=np.int64)) ^ (np.uint64(rng.integers(0, 2**63, dtype=np.int64)) << np.uint64(1))


# ---------------------------------------------------------------- per-row bit streams
# Protocols that need one uniform per domain element (UE, THE, ...) draw them from a stream
# addressed by ``(key, a, domain)``: word ``w`` of the stream is ``mix64(base + w * GOLDEN)``
# with ``base = word(key, a, domain)`` (SplitMix64's own sequence, Steele et al. 2014). It is
# still a pure function of ``(key, a)`` (so memoization and kernel/reference agreement hold),
# its words are independent of each other (so the loop vectorizes), and each word yields two
# 32-bit uniforms. Probabilities compared against 32-bit uniforms are quantized to multiples of
# 2^-32 by :func:`quantize32`; protocols use the quantized values everywhere (estimator,
# variance, ε), so the figures describe exactly what is sampled.
SCALE32 = float(1 << 32)
LO32 = np.uint64(0xFFFFFFFF)


def quantize32(p: float) -> float:
    """``p`` rounded to the 2^-32 grid on which 32-bit stream uniforms are compared."""
    return round(p * SCALE32) / SCALE32


def threshold32(p: float) -> np.uint64:
    """Integer threshold ``T`` with ``P(u32 < T) = quantize32(p)``."""
    return np.uint64(round(p * SCALE32))


@nb.njit(inline="always", cache=True)
def stream_word(base: np.uint64, w: int) -> np.uint64:
    """Word ``w`` of the stream starting at ``base``."""
    return mix64(base + np.uint64(w) * np.uint64(0x9E3779B97F4A7C15))


@nb.njit(inline="always", cache=True)
def stream_fill32(base: np.uint64, buf: np.ndarray, count: int) -> None:
    """The first ``count`` 32-bit uniforms of a stream into ``buf`` (uint64 array)."""
    for w in range((count + 1) // 2):
        z = stream_word(base, w)
        buf[2 * w] = z & np.uint64(0xFFFFFFFF)
        buf[2 * w + 1] = z >> np.uint64(32)


def np_stream_uniforms32(base, count: int) -> np.ndarray:
    """Reference: the first ``count`` 32-bit uniforms of each stream, ``(len(base), count)``."""
    base = np.asarray(base, dtype=np.uint64)[..., None]
    w = np.arange((count + 1) // 2, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np_mix64(base + w * GOLDEN)
    out = np.stack([z & LO32, z >> np.uint64(32)], axis=-1).reshape(z.shape[:-1] + (-1,))
    return out[..., :count]


# ---------------------------------------------------------------- 8 Bernoulli bits per stream word
# A 32-bit uniform ``u = hi * 2^24 + rest`` is compared with a threshold ``T`` lazily: its top
# byte ``hi`` decides unless it equals ``T``'s top byte (probability 1/256), and only then is the
# 24-bit ``rest`` drawn from a refinement word. One stream word thus carries the top bytes of 8
# uniforms, i.e. 8 Bernoulli bits, compared lane-wise with SWAR arithmetic (Hacker's Delight
# §6-1); the draw is exactly ``P(u < T) = T / 2^32``.
REFINE = 1 << 40  # stream word ``REFINE + 8 w + t`` refines lane t of word w
_H = np.uint64(0x8080808080808080)
_L7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_GATHER = np.uint64(0x0102040810204080)
EXPAND = np.array([sum(0xFF << (8 * t) for t in range(8) if b >> t & 1) for b in range(256)], dtype=np.uint64)


def split_threshold(t: int) -> tuple[np.uint64, np.uint64]:
    """``(hi, rest)`` with ``t = hi * 2^24 + rest`` and ``hi <= 255`` (``t = 2^32`` gives rest 2^24)."""
    hi = min(int(t) >> 24, 255)
    return np.uint64(hi), np.uint64(int(t) - (hi << 24))


def broadcast8(b: np.uint64) -> np.uint64:
    """The byte ``b`` in all 8 lanes."""
    return np.uint64(int(b) * 0x0101010101010101)


@nb.njit(inline="always", cache=True)
def lanes_lt(x: np.uint64, y: np.uint64) -> np.uint64:
    """8-bit mask: bit t set iff byte t of ``x`` < byte t of ``y`` (unsigned)."""
    d = (x | _H) - (y & _L7)
    m = ((~x & y) | (~(x ^ y) & ~d)) & _H
    return ((m >> np.uint64(7)) * _GATHER) >> np.uint64(56)


@nb.njit(inline="always", cache=True)
def lanes_eq(x: np.uint64, y: np.uint64) -> np.uint64:
    """8-bit mask: bit t set iff byte t of ``x`` == byte t of ``y``."""
    t = x ^ y
    nonzero = (((t & _L7) + _L7) | t) & _H
    return (((~nonzero & _H) >> np.uint64(7)) * _GATHER) >> np.uint64(56)


@nb.njit(inline="always", cache=True)
def bernoulli_bytes(base: np.uint64, hi_lanes: np.ndarray, sel: np.ndarray, rest_a: np.uint64,
                    rest_b: np.uint64, bits: np.ndarray, eq: np.ndarray) -> None:
    """Bytes ``b`` of ``bits`` := 8 Bernoulli bits each from stream word ``b``.

    Lane ``t`` of byte ``b`` has threshold top byte = byte t of ``hi_lanes[b]`` and 24-bit rest
    ``rest_a`` if bit t of ``sel[b]`` else ``rest_b``. The common case (top bytes differ) is a
    branch-free SWAR pass that vectorizes; lanes whose top byte ties (probability 1/256 each)
    are refined afterwards from the words ``REFINE + 8 b + t``.
    """
    nb_ = bits.shape[0]
    tie = np.uint64(0)
    for b in range(nb_):
        z = stream_word(base, b)
        bits[b] = lanes_lt(z, hi_lanes[b])
        eq[b] = lanes_eq(z, hi_lanes[b])
        tie |= eq[b]
    if tie:
        for b in range(nb_):
            e = eq[b]
            while e:
                t = 0
                while not (e >> np.uint64(t)) & np.uint64(1):
                    t += 1
                rest = stream_word(base, REFINE + 8 * b + t) & np.uint64(0xFFFFFF)
                if rest < (rest_a if (sel[b] >> np.uint64(t)) & np.uint64(1) else rest_b):
                    bits[b] |= np.uint64(1) << np.uint64(t)
                e &= e - np.uint64(1)


def np_bernoulli8(base, w: int, hi: np.ndarray, rest: np.ndarray) -> np.ndarray:
    """Reference of byte ``w`` of :func:`bernoulli_bytes`: ``hi``/``rest`` are per-lane ``(n, 8)``
    thresholds; the lane is 1 iff the 32-bit uniform ``top * 2^24 + refine`` is below them."""
    base = np.asarray(base, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np_mix64(base + np.uint64(w) * GOLDEN)
        lanes = np.arange(8, dtype=np.uint64)
        top = (z[:, None] >> (8 * lanes)) & np.uint64(0xFF)
        refine = np_mix64(base[:, None] + (np.uint64(REFINE + 8 * w) + lanes) * GOLDEN) & np.uint64(0xFFFFFF)
    bit = (top < hi) | ((top == hi) & (refine < rest))
    return (bit.astype(np.uint64) << lanes).sum(axis=1).astype(np.uint64)
