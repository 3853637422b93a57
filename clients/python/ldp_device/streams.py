"""Device randomness: ChaCha20 streams, the draws taken from them, and the keys behind them.

The stream ``(key, domain, a)`` is the RFC 8439 ChaCha20 keystream under the 256-bit ``key`` with the 96-bit
nonce ``(domain, a mod 2^32, a >> 32)`` and the block counter from 0; its word ``j`` is the little-endian
64-bit integer in keystream bytes ``8j .. 8j+7`` (the reference: ``estimators/randomness.py``). Memoized
responses use the device's secret memo key (:data:`PRR`, :data:`LH_SEED`, :data:`BITFLIP_J`,
:data:`BITFLIP_BIT`, :data:`ONEBIT_ALPHA`); fresh noise uses a fresh 256-bit key per report: the report is
row 0 of a batch of one, so its noise slot is words ``0 .. W-1`` of ``(noise key, NOISE, 0)`` and draws beyond the
slot come from ``(noise key, NOISE_EXT, 0)``.

Keys: every randomizer takes ``draw_key``, a callable returning 32 fresh bytes per call, consumed in the
reference's order of key draws (``keys_from``); the default :func:`os_key` is the OS CSPRNG
(:func:`secrets.token_bytes`). :func:`key_tape` replays recorded keys (the randomizer vectors): a test mode,
not private.
"""
from __future__ import annotations

import secrets
import struct
from typing import Callable, Iterable

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

__all__ = ["PRR", "NOISE", "LH_SEED", "BITFLIP_J", "BITFLIP_BIT", "NOISE_EXT", "ONEBIT_ALPHA", "KEY_BYTES",
           "KeySource", "os_key", "key_tape", "keystream", "Stream", "NoiseDraws", "unit", "other_than", "quantize32",
           "threshold32", "split_threshold", "lt_table", "GATHER", "pack_lanes"]

KEY_BYTES = 32
BLOCK_BYTES = 64

# Stream domains (nonce word 0): ASCII tags, as in estimators/randomness.py.
PRR = 0x31525250          # "PRR1": memoized responses, a = memoized input
NOISE = 0x5349494E        # "NIIS": fresh noise, a = row (0 on a device)
LH_SEED = 0x44534C48      # "HLSD": local-hashing seeds
BITFLIP_J = 0x4A504642    # "BFPJ": dBitFlipPM's sampled buckets, a = 0
BITFLIP_BIT = 0x42504642  # "BFPB": dBitFlipPM's memoized bits, a = case
NOISE_EXT = 0x5458454E    # "NEXT": draws of row a beyond its fixed noise slot
ONEBIT_ALPHA = 0x48504C41  # "ALPH": a 1BitMean device's rounding point alpha, a = 0

TWO_M53 = 1.1102230246251565e-16  # 2**-53
SCALE32 = float(1 << 32)

KeySource = Callable[[], bytes]


def os_key() -> bytes:
    """A fresh 256-bit key from the OS CSPRNG (the default key source of every randomizer)."""
    return secrets.token_bytes(KEY_BYTES)


def key_tape(keys: Iterable[str | bytes]) -> KeySource:
    """A key source replaying recorded keys (64 hex digits or 32 bytes each) in order: test vectors only.

    The returned callable has ``left`` (keys not drawn yet) and ``drawn`` (keys drawn so far)."""
    left = [bytes.fromhex(k) if isinstance(k, str) else bytes(k) for k in keys]
    if any(len(k) != KEY_BYTES for k in left):
        raise ValueError("a key has 32 bytes (64 hex digits)")
    left.reverse()

    def draw() -> bytes:
        if not left:
            raise AssertionError("the randomizer drew more keys than the tape holds")
        draw.drawn += 1  # type: ignore[attr-defined]
        return left.pop()

    draw.drawn = 0  # type: ignore[attr-defined]
    draw.left = lambda: len(left)  # type: ignore[attr-defined]
    return draw


def keystream(key: bytes, domain: int, a: int, block0: int, nblocks: int) -> bytes:
    """Blocks ``block0 .. block0 + nblocks - 1`` of the stream ``(key, domain, a)`` (RFC 8439 ChaCha20: the
    encryption of zeros; ``cryptography`` takes the 4-byte little-endian counter and the 12-byte nonce)."""
    if nblocks <= 0:
        return b""
    if block0 + nblocks > 1 << 32:
        raise ValueError("a stream holds at most 2^32 blocks")
    nonce = struct.pack("<IIII", block0, domain, a & 0xFFFFFFFF, a >> 32)
    enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
    return enc.update(bytes(BLOCK_BYTES * nblocks))


class Stream:
    """One stream ``(key, domain, a)``, computed a few blocks at a time on demand; ``buf`` holds its first
    ``len(buf) // 8`` words as keystream bytes."""

    __slots__ = ("key", "domain", "a", "buf")

    def __init__(self, key: bytes, domain: int, a: int = 0, words: int = 8) -> None:
        if len(key) != KEY_BYTES:
            raise ValueError("a stream key has 32 bytes")
        if a < 0 or a >= 1 << 64:
            raise ValueError(f"stream input must lie in [0, 2^64), got {a}")
        self.key, self.domain, self.a = key, domain, a
        self.buf = keystream(key, domain, a, 0, -(-words // 8))

    def ensure(self, words: int) -> None:
        """Make sure words ``0 .. words-1`` are computed (grows geometrically)."""
        have = len(self.buf) // BLOCK_BYTES
        need = -(-words // 8)
        if need > have:
            more = max(need - have, have, 1)
            self.buf += keystream(self.key, self.domain, self.a, have, more)

    def word(self, j: int) -> int:
        if 8 * j + 8 > len(self.buf):
            self.ensure(j + 1)
        return int.from_bytes(self.buf[8 * j:8 * j + 8], "little")

    def low24(self, j: int) -> int:
        if 8 * j + 8 > len(self.buf):
            self.ensure(j + 1)
        return int.from_bytes(self.buf[8 * j:8 * j + 3], "little")

    def low32(self, j: int) -> int:
        if 8 * j + 8 > len(self.buf):
            self.ensure(j + 1)
        return int.from_bytes(self.buf[8 * j:8 * j + 4], "little")

    def unit(self, j: int) -> float:
        return (self.word(j) >> 11) * TWO_M53

    def bytes_of(self, j0: int, n: int) -> bytes:
        """The keystream bytes of words ``j0 .. j0+n-1`` (their 8 byte lanes each)."""
        self.ensure(j0 + n)
        return self.buf[8 * j0:8 * (j0 + n)]


class NoiseDraws:
    """A report's fresh draws: word ``j`` of its noise slot (``(nkey, NOISE, 0)``, ``slot`` words) while
    ``j < slot``, then word ``j - slot`` of its extension stream ``(nkey, NOISE_EXT, 0)``
    (``stream_word`` with ``skip = slot`` in the reference)."""

    __slots__ = ("nkey", "slot", "main", "_ext")

    def __init__(self, nkey: bytes, slot: int) -> None:
        self.nkey, self.slot = nkey, slot
        self.main = Stream(nkey, NOISE, 0, max(slot, 1))
        self._ext: Stream | None = None

    def _at(self, j: int) -> tuple[Stream, int]:
        if j < self.slot:
            return self.main, j
        if self._ext is None:
            self._ext = Stream(self.nkey, NOISE_EXT, 0, 8)
        return self._ext, j - self.slot

    def word(self, j: int) -> int:
        s, i = self._at(j)
        return s.word(i)

    def low24(self, j: int) -> int:
        s, i = self._at(j)
        return s.low24(i)

    def unit(self, j: int) -> float:
        s, i = self._at(j)
        return s.unit(i)


# ---------------------------------------------------------------- draws from words
def unit(w: int) -> float:
    """Uniform double in [0, 1) with 53 random bits from one stream word: ``(w >> 11) 2^-53``."""
    return (w >> 11) * TWO_M53


def other_than(x: int, m: int, u: float) -> int:
    """A value uniform over ``[0, m) \\ {x}`` from one uniform ``u``."""
    o = int(u * (m - 1))
    return o + 1 if o >= x else o


# ---------------------------------------------------------------- the 2^-32 grid
def quantize32(p: float) -> float:
    """``p`` rounded to the 2^-32 grid on which 32-bit uniforms are compared (round half to even)."""
    return round(p * SCALE32) / SCALE32


def threshold32(p: float) -> int:
    """Integer threshold ``T`` with ``P(u32 < T) = quantize32(p)``."""
    return round(p * SCALE32)


def split_threshold(t: int) -> tuple[int, int]:
    """``(hi, rest)`` with ``t = hi 2^24 + rest`` and ``hi <= 255`` (``t = 2^32`` gives rest 2^24)."""
    hi = min(t >> 24, 255)
    return hi, t - (hi << 24)


# ---------------------------------------------------------------- exact lazy Bernoulli lanes
# A 32-bit uniform u = hi 2^24 + rest is compared with a threshold T lazily: its top byte (one byte lane of a
# stream word) decides unless it equals T's top byte; ties are settled in lane order by the low 24 bits of
# further draws. Lanes are handled many at a time: ``bytes.translate`` with :func:`lt_table` turns the top
# bytes into one 0/1 byte per lane, ``int.from_bytes`` makes that an integer with lane i at bit 8i, and
# :func:`pack_lanes` gathers bit 8i to bit i (packed little-endian bits).
_LT: dict[int, bytes] = {}
#: multiplier that gathers bits 0, 8, ..., 56 of a 64-bit word into its top byte (Warren, Hacker's Delight)
GATHER = 0x0102040810204080


def lt_table(hi: int) -> bytes:
    """Translation table: byte z -> 1 if z < hi else 0."""
    t = _LT.get(hi)
    if t is None:
        t = _LT[hi] = bytes(1 if z < hi else 0 for z in range(256))
    return t


def pack_lanes(lanes: int, nbytes: int) -> bytes:
    """Packed little-endian bits (``nbytes`` bytes) of an integer holding lane ``i`` at bit ``8i`` (0 or 1).

    ``lanes * GATHER`` moves the 8 lanes of word ``j`` into byte ``8j + 7`` of the product; no two partial
    products share a bit position, so nothing carries between lanes or words."""
    return (lanes * GATHER).to_bytes(8 * nbytes + 8, "little")[7::8][:nbytes]
