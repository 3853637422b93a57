"""Device randomness: one cryptographic primitive, ChaCha20, for every random draw.

A randomizer's draws come from *streams*. The stream ``(key, domain, a)`` is the ChaCha20
keystream (Bernstein 2008, as specified in RFC 8439 §2.3) under the 256-bit ``key`` with the
96-bit nonce ``(domain, a mod 2^32, a >> 32)`` and the block counter running from 0; its word
``j`` is the 64-bit little-endian integer in keystream bytes ``8j .. 8j+7``. Two uses:

* **Memoized responses (PRR).** ``key`` is the device's secret memo key (256 bits from the OS
  CSPRNG, one per device and attribute) and ``a`` the memoized input (a value, a hash value or a
  bucket): the stream is a keyed PRF of (device key, attribute, input, index), so the same input
  gives the same memoized response forever, a restored key reproduces every one of them, and
  without the key the responses of different inputs are computationally independent (RAPPOR's
  client derives its PRR the same way with HMAC-SHA256; Erlingsson, Pihur & Korolova, CCS 2014).
* **Fresh noise (IRR, single-shot protocols).** ``key`` is a per-batch key of 256 bits from the
  OS CSPRNG, drawn anew for every ``randomize`` call, and ``a`` the row: reports of different
  devices and batches are computationally independent.

``domain`` separates the uses (:data:`PRR`, :data:`NOISE`, :data:`LH_SEED`, :data:`BITFLIP_J`,
:data:`BITFLIP_BIT`, :data:`ONEBIT_ALPHA`), so no stream ever serves two purposes.

Seeded randomness exists only as the labelled *simulation mode*: a caller that passes a
``numpy.random.Generator`` gets keys drawn from it (reproducible tests, benchmarks,
``ldp produce --seed``) and a :class:`SimulationWarning`; with ``None`` (the default everywhere
a device is concerned) keys come from :func:`secrets.token_bytes`.

Kernels compute stream prefixes many rows at a time with :func:`fill_words` (16 ChaCha20
blocks in the lanes of one SIMD loop) and draw beyond a prefix, rarely, with
:func:`stream_word` (one scalar block). Every numba function has a plain-numpy twin
(``np_*``); the tests check both against RFC 8439's vectors and the ``cryptography`` library.
"""
from __future__ import annotations

import secrets
import sys
import warnings

import numba as nb
import numpy as np

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("estimators.randomness assumes a little-endian machine")

KEY_BYTES = 32
KEY_WORDS = 8          # a key is 8 little-endian uint32 words
BLOCK_WORDS = 8        # 64-bit words per ChaCha20 block
LANES = 16             # blocks computed together by :func:`fill_words`

# Stream domains (nonce word 0): ASCII tags.
PRR = np.uint32(0x31525250)          # "PRR1": memoized responses, a = memoized input
NOISE = np.uint32(0x5349494E)        # "NIIS": fresh noise, a = row
LH_SEED = np.uint32(0x44534C48)      # "HLSD": a device's fixed local-hashing seed (LOLOHA), a = 0
BITFLIP_J = np.uint32(0x4A504642)    # "BFPJ": dBitFlipPM's sampled buckets, a = 0
BITFLIP_BIT = np.uint32(0x42504642)  # "BFPB": dBitFlipPM's memoized bits, a = case
NOISE_EXT = np.uint32(0x5458454E)    # "NEXT": draws of row a beyond its fixed noise slot
ONEBIT_ALPHA = np.uint32(0x48504C41)  # "ALPH": a 1BitMean device's rounding point alpha, a = 0
NO_WORDS = np.zeros(0, dtype=np.uint64)  # an empty prefix (a stream read from word 0 on demand)

_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_TWO53 = 1.0 / 9007199254740992.0  # 2**-53


# ---------------------------------------------------------------- keys
class SimulationWarning(UserWarning):
    """Seeded (reproducible) randomness is in use: reports are NOT private."""


def warn_simulation(what: str = "randomness") -> None:
    """Say that seeded simulation randomness is in use (shown once per call site)."""
    warnings.warn(f"simulation mode: {what} drawn from a seeded numpy Generator; reproducible, "
                  "and therefore not private. Pass rng=None on real devices.", SimulationWarning, stacklevel=3)


def keys_from(rng: np.random.Generator | None, n: int) -> np.ndarray:
    """``n`` 256-bit keys, ``uint32 (n, 8)``: OS CSPRNG for ``rng=None``, else simulation mode."""
    if n < 0:
        raise ValueError(f"number of keys must be >= 0, got {n}")
    if rng is None:
        return np.frombuffer(secrets.token_bytes(KEY_BYTES * n), dtype="<u4").reshape(n, KEY_WORDS).copy()
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be None (OS CSPRNG) or a numpy Generator (simulation), got {type(rng).__name__}")
    warn_simulation("keys")
    return rng.integers(0, 1 << 32, size=(n, KEY_WORDS), dtype=np.uint32)


def noise_key(rng: np.random.Generator | None = None) -> np.ndarray:
    """A fresh 256-bit batch key, ``uint32 (8,)`` (see :func:`keys_from`)."""
    return keys_from(rng, 1)[0]


# ---------------------------------------------------------------- ChaCha20 block, scalar
# The ChaCha20 core (these six functions) is NOT inlined at numba's IR level (``inline="always"``): LLVM inlines
# or calls it as it sees fit, at the same speed, while IR inlining copied its 80 quarter-round calls into every
# kernel and call site and cost 50 of the 130 CPU seconds of a cold compile of every kernel (docs/benchmarks.md).
# The small per-word helpers further down stay inlined: they sit in the kernels' inner loops (SHE: 9x slower as calls).
@nb.njit(cache=True)
def _rotl(v, c):
    return np.uint32((np.uint32(v) << np.uint32(c)) | (np.uint32(v) >> np.uint32(32 - c)))


@nb.njit(cache=True)
def _block(key, counter, n0, n1, n2):
    """RFC 8439 §2.3: the 16 uint32 words of block ``counter`` under ``key`` (8 uint32) and nonce
    ``(n0, n1, n2)``, as a tuple."""
    s0, s1, s2, s3 = np.uint32(0x61707865), np.uint32(0x3320646E), np.uint32(0x79622D32), np.uint32(0x6B206574)
    s4, s5, s6, s7 = np.uint32(key[0]), np.uint32(key[1]), np.uint32(key[2]), np.uint32(key[3])
    s8, s9, s10, s11 = np.uint32(key[4]), np.uint32(key[5]), np.uint32(key[6]), np.uint32(key[7])
    s12, s13, s14, s15 = np.uint32(counter), np.uint32(n0), np.uint32(n1), np.uint32(n2)
    x0, x1, x2, x3, x4, x5, x6, x7 = s0, s1, s2, s3, s4, s5, s6, s7
    x8, x9, x10, x11, x12, x13, x14, x15 = s8, s9, s10, s11, s12, s13, s14, s15
    for _ in range(10):
        # column rounds
        x0 = np.uint32(x0 + x4); x12 = _rotl(x12 ^ x0, 16); x8 = np.uint32(x8 + x12); x4 = _rotl(x4 ^ x8, 12)
        x0 = np.uint32(x0 + x4); x12 = _rotl(x12 ^ x0, 8); x8 = np.uint32(x8 + x12); x4 = _rotl(x4 ^ x8, 7)
        x1 = np.uint32(x1 + x5); x13 = _rotl(x13 ^ x1, 16); x9 = np.uint32(x9 + x13); x5 = _rotl(x5 ^ x9, 12)
        x1 = np.uint32(x1 + x5); x13 = _rotl(x13 ^ x1, 8); x9 = np.uint32(x9 + x13); x5 = _rotl(x5 ^ x9, 7)
        x2 = np.uint32(x2 + x6); x14 = _rotl(x14 ^ x2, 16); x10 = np.uint32(x10 + x14); x6 = _rotl(x6 ^ x10, 12)
        x2 = np.uint32(x2 + x6); x14 = _rotl(x14 ^ x2, 8); x10 = np.uint32(x10 + x14); x6 = _rotl(x6 ^ x10, 7)
        x3 = np.uint32(x3 + x7); x15 = _rotl(x15 ^ x3, 16); x11 = np.uint32(x11 + x15); x7 = _rotl(x7 ^ x11, 12)
        x3 = np.uint32(x3 + x7); x15 = _rotl(x15 ^ x3, 8); x11 = np.uint32(x11 + x15); x7 = _rotl(x7 ^ x11, 7)
        # diagonal rounds
        x0 = np.uint32(x0 + x5); x15 = _rotl(x15 ^ x0, 16); x10 = np.uint32(x10 + x15); x5 = _rotl(x5 ^ x10, 12)
        x0 = np.uint32(x0 + x5); x15 = _rotl(x15 ^ x0, 8); x10 = np.uint32(x10 + x15); x5 = _rotl(x5 ^ x10, 7)
        x1 = np.uint32(x1 + x6); x12 = _rotl(x12 ^ x1, 16); x11 = np.uint32(x11 + x12); x6 = _rotl(x6 ^ x11, 12)
        x1 = np.uint32(x1 + x6); x12 = _rotl(x12 ^ x1, 8); x11 = np.uint32(x11 + x12); x6 = _rotl(x6 ^ x11, 7)
        x2 = np.uint32(x2 + x7); x13 = _rotl(x13 ^ x2, 16); x8 = np.uint32(x8 + x13); x7 = _rotl(x7 ^ x8, 12)
        x2 = np.uint32(x2 + x7); x13 = _rotl(x13 ^ x2, 8); x8 = np.uint32(x8 + x13); x7 = _rotl(x7 ^ x8, 7)
        x3 = np.uint32(x3 + x4); x14 = _rotl(x14 ^ x3, 16); x9 = np.uint32(x9 + x14); x4 = _rotl(x4 ^ x9, 12)
        x3 = np.uint32(x3 + x4); x14 = _rotl(x14 ^ x3, 8); x9 = np.uint32(x9 + x14); x4 = _rotl(x4 ^ x9, 7)
    return (np.uint32(x0 + s0), np.uint32(x1 + s1), np.uint32(x2 + s2), np.uint32(x3 + s3),
            np.uint32(x4 + s4), np.uint32(x5 + s5), np.uint32(x6 + s6), np.uint32(x7 + s7),
            np.uint32(x8 + s8), np.uint32(x9 + s9), np.uint32(x10 + s10), np.uint32(x11 + s11),
            np.uint32(x12 + s12), np.uint32(x13 + s13), np.uint32(x14 + s14), np.uint32(x15 + s15))


@nb.njit(cache=True, nogil=True)
def chacha20_block(key, counter, n0, n1, n2, out) -> None:
    """The block (RFC 8439 §2.3) as 16 uint32 words into ``out``."""
    w = _block(key, counter, n0, n1, n2)
    for j in range(16):
        out[j] = w[j]


@nb.njit(cache=True)
def _block_words(key, counter, n0, n1, n2, out) -> None:
    """The block as 8 little-endian uint64 words into ``out[0:8]``."""
    w = _block(key, counter, n0, n1, n2)
    for j in range(8):
        out[j] = np.uint64(w[2 * j]) | (np.uint64(w[2 * j + 1]) << np.uint64(32))


# ---------------------------------------------------------------- ChaCha20, 16 blocks in SIMD lanes
@nb.njit(cache=True)
def _qr_lanes(x, a, b, c, d) -> None:
    xa, xb, xc, xd = x[a], x[b], x[c], x[d]
    for l in range(LANES):
        va = np.uint32(xa[l] + xb[l])
        t = np.uint32(xd[l] ^ va)
        vd = np.uint32((t << np.uint32(16)) | (t >> np.uint32(16)))
        vc = np.uint32(xc[l] + vd)
        t = np.uint32(xb[l] ^ vc)
        vb = np.uint32((t << np.uint32(12)) | (t >> np.uint32(20)))
        va = np.uint32(va + vb)
        t = np.uint32(vd ^ va)
        vd = np.uint32((t << np.uint32(8)) | (t >> np.uint32(24)))
        vc = np.uint32(vc + vd)
        t = np.uint32(vb ^ vc)
        vb = np.uint32((t << np.uint32(7)) | (t >> np.uint32(25)))
        xa[l], xb[l], xc[l], xd[l] = va, vb, vc, vd


@nb.njit(cache=True)
def _blocks_lanes(state, x) -> None:
    """``x`` (16, LANES) := the ChaCha20 blocks of the 16 input states in ``state`` (lane = block)."""
    for w in range(16):
        for l in range(LANES):
            x[w, l] = state[w, l]
    for _ in range(10):
        _qr_lanes(x, 0, 4, 8, 12)
        _qr_lanes(x, 1, 5, 9, 13)
        _qr_lanes(x, 2, 6, 10, 14)
        _qr_lanes(x, 3, 7, 11, 15)
        _qr_lanes(x, 0, 5, 10, 15)
        _qr_lanes(x, 1, 6, 11, 12)
        _qr_lanes(x, 2, 7, 8, 13)
        _qr_lanes(x, 3, 4, 9, 14)
    for w in range(16):
        for l in range(LANES):
            x[w, l] = np.uint32(x[w, l] + state[w, l])


@nb.njit(cache=True)
def _lane_states(key, domain):
    """``(16, LANES)`` ChaCha20 input states, one per lane: the constants, ``key`` and the
    ``domain`` nonce word; the caller sets the counter (word 12) and ``a`` (words 14-15)."""
    state = np.empty((16, LANES), dtype=np.uint32)
    for l in range(LANES):
        state[0, l] = np.uint32(0x61707865)
        state[1, l] = np.uint32(0x3320646E)
        state[2, l] = np.uint32(0x79622D32)
        state[3, l] = np.uint32(0x6B206574)
        for j in range(KEY_WORDS):
            state[4 + j, l] = key[j]
        state[13, l] = np.uint32(domain)
    return state


@nb.njit(cache=True, nogil=True)
def fill_words(keys, per_row_key, domain, inputs, r0, r1, out) -> None:
    """Prefixes of the streams of rows ``r0 .. r1-1`` into ``out[0 : r1-r0, :]`` (uint64).

    Row ``r``'s stream is ``(keys[r] if per_row_key else keys[0], domain, inputs[r])`` (``r``
    itself when ``inputs`` is empty); ``out`` gets its first ``out.shape[1]`` words (a multiple
    of 8: whole blocks). The blocks of consecutive rows fill the 16 lanes of one SIMD pass.
    """
    by_row = inputs.shape[0] == 0
    nblocks = out.shape[1] // BLOCK_WORDS
    total = (r1 - r0) * nblocks
    state = _lane_states(keys[0], domain)
    x = np.empty((16, LANES), dtype=np.uint32)
    lane_row = np.zeros(LANES, dtype=np.int64)
    lane_blk = np.zeros(LANES, dtype=np.int64)
    row, blk = 0, 0  # (row - r0, block) of the next block to schedule
    for g0 in range(0, total, LANES):
        m = min(LANES, total - g0)
        for l in range(m):
            r = r0 + row
            a = np.uint64(r) if by_row else np.uint64(inputs[r])
            if per_row_key:
                for j in range(KEY_WORDS):
                    state[4 + j, l] = keys[r, j]
            state[12, l] = np.uint32(blk)
            state[14, l] = np.uint32(a & np.uint64(0xFFFFFFFF))
            state[15, l] = np.uint32(a >> np.uint64(32))
            lane_row[l] = row
            lane_blk[l] = blk
            blk += 1
            if blk == nblocks:
                blk = 0
                row += 1
        _blocks_lanes(state, x)
        for l in range(m):
            dst = out[lane_row[l]]
            base = lane_blk[l] * BLOCK_WORDS
            for j in range(BLOCK_WORDS):
                dst[base + j] = np.uint64(x[2 * j, l]) | (np.uint64(x[2 * j + 1, l]) << np.uint64(32))


@nb.njit(cache=True, nogil=True)
def fill_run(key, domain, a, w0, out) -> None:
    """Words ``w0 .. w0 + len(out) - 1`` of the single stream ``(key, domain, a)`` into ``out``.

    Fresh noise for a batch is one such stream: row ``r`` takes the fixed slot of words
    ``[r W, (r+1) W)``, so rows share blocks and no keystream is wasted (16 consecutive
    blocks per SIMD pass).
    """
    n = out.shape[0]
    if n == 0:
        return
    b0, b1 = w0 // BLOCK_WORDS, (w0 + n + BLOCK_WORDS - 1) // BLOCK_WORDS
    if b1 > (1 << 32):
        raise ValueError("a stream holds at most 2^32 blocks (256 GiB)")
    aa = np.uint64(a)
    state = _lane_states(key, domain)
    x = np.empty((16, LANES), dtype=np.uint32)
    for l in range(LANES):
        state[14, l] = np.uint32(aa & np.uint64(0xFFFFFFFF))
        state[15, l] = np.uint32(aa >> np.uint64(32))
    for g in range(b0, b1, LANES):
        m = min(LANES, b1 - g)
        for l in range(LANES):
            state[12, l] = np.uint32(g + l)
        _blocks_lanes(state, x)
        for l in range(m):
            base = (g + l) * BLOCK_WORDS - w0
            for j in range(BLOCK_WORDS):
                f = base + j
                if 0 <= f < n:
                    out[f] = np.uint64(x[2 * j, l]) | (np.uint64(x[2 * j + 1, l]) << np.uint64(32))


@nb.njit(inline="always", cache=True)
def stream_word(key, domain, a, prefix, j, cache, skip=0):
    """Word ``j`` of a row's draws: ``prefix[j]`` while ``j < len(prefix)``, else word
    ``j - skip`` of the stream ``(key, domain, a)``.

    With ``skip = 0`` the prefix IS the start of that stream (memoized responses: word ``j`` is a
    pure function of ``(key, a, j)`` whatever the prefix width); with ``skip = len(prefix)`` the
    prefix is a row's noise slot and the draws go on in the row's own extension stream
    (:data:`NOISE_EXT`). Words past the prefix are computed one block at a time into ``cache``
    (uint64 (9,); word 8 holds the cached block's index + 1, 0 when empty; use one cache per
    stream).
    """
    if j < prefix.shape[0]:
        return prefix[j]
    jj = j - skip
    blk = jj >> 3
    if cache[8] != np.uint64(blk + 1):
        aa = np.uint64(a)
        _block_words(key, blk, domain, np.uint32(aa & np.uint64(0xFFFFFFFF)), np.uint32(aa >> np.uint64(32)), cache)
        cache[8] = np.uint64(blk + 1)
    return cache[jj & 7]


def words_for(count: int) -> int:
    """Prefix width (in 64-bit words, whole blocks) holding at least ``count`` words."""
    return max(1, -(-int(count) // BLOCK_WORDS)) * BLOCK_WORDS


# ---------------------------------------------------------------- draws from words
@nb.njit(inline="always", cache=True)
def unit(w: np.uint64) -> float:
    """Uniform double in [0, 1) with 53 random bits from one stream word."""
    return float(w >> np.uint64(11)) * 1.1102230246251565e-16


@nb.njit(inline="always", cache=True)
def other_than(x: np.int64, m: np.int64, u: float) -> np.int64:
    """A value uniform over ``[0, m) \\ {x}`` from one uniform ``u``."""
    o = np.int64(u * (m - 1))
    if o >= x:
        o += 1
    return o


def rejection_limit(m: int) -> np.uint64:
    """``2^64 - 1 - (2^64 mod m)``: the largest 64-bit word a uniform draw of ``[0, m)`` by ``word % m`` accepts
    (a larger word is drawn again), so that every residue has the same number of accepted words."""
    if m < 1:
        raise ValueError(f"a uniform draw needs m >= 1, got {m}")
    return np.uint64((1 << 64) - 1 - ((1 << 64) % m))


# ---------------------------------------------------------------- numpy references
def np_chacha20_blocks(keys: np.ndarray, counters: np.ndarray, nonces: np.ndarray) -> np.ndarray:
    """RFC 8439 §2.3 block function for many inputs: ``keys (n, 8)``, ``counters (n,)``,
    ``nonces (n, 3)`` (uint32) -> ``(n, 16)`` uint32."""
    keys = np.asarray(keys, dtype=np.uint32).reshape(-1, KEY_WORDS)
    counters = np.asarray(counters, dtype=np.uint32).reshape(-1)
    nonces = np.asarray(nonces, dtype=np.uint32).reshape(-1, 3)
    n = max(keys.shape[0], counters.shape[0], nonces.shape[0])
    s = np.empty((16, n), dtype=np.uint32)
    s[:4] = np.array(_SIGMA, dtype=np.uint32)[:, None]
    s[4:12] = np.broadcast_to(keys, (n, KEY_WORDS)).T
    s[12] = np.broadcast_to(counters, (n,))
    s[13:16] = np.broadcast_to(nonces, (n, 3)).T
    x = s.copy()

    def rotl(v, c):
        return (v << np.uint32(c)) | (v >> np.uint32(32 - c))

    def qr(a, b, c, d):
        x[a] += x[b]; x[d] = rotl(x[d] ^ x[a], 16)
        x[c] += x[d]; x[b] = rotl(x[b] ^ x[c], 12)
        x[a] += x[b]; x[d] = rotl(x[d] ^ x[a], 8)
        x[c] += x[d]; x[b] = rotl(x[b] ^ x[c], 7)

    for _ in range(10):
        qr(0, 4, 8, 12); qr(1, 5, 9, 13); qr(2, 6, 10, 14); qr(3, 7, 11, 15)
        qr(0, 5, 10, 15); qr(1, 6, 11, 12); qr(2, 7, 8, 13); qr(3, 4, 9, 14)
    return (x + s).T.copy()


def np_stream_words(keys: np.ndarray, domain, inputs, nwords: int) -> np.ndarray:
    """Words ``0 .. nwords-1`` of the streams ``(keys[r] or keys, domain, inputs[r])``, ``(n, nwords)`` uint64."""
    inputs = np.asarray(inputs, dtype=np.uint64).reshape(-1)
    keys = np.asarray(keys, dtype=np.uint32).reshape(-1, KEY_WORDS)
    n, nblocks = inputs.shape[0], words_for(nwords) // BLOCK_WORDS
    rows = np.repeat(np.arange(n), nblocks)
    key_rows = keys[rows] if keys.shape[0] == n and n != 1 else np.broadcast_to(keys[0], (rows.shape[0], KEY_WORDS))
    a = inputs[rows]
    nonces = np.stack([np.full(rows.shape[0], domain, dtype=np.uint32),
                       (a & np.uint64(0xFFFFFFFF)).astype(np.uint32), (a >> np.uint64(32)).astype(np.uint32)], axis=1)
    counters = np.tile(np.arange(nblocks, dtype=np.uint32), n)
    blocks = np_chacha20_blocks(key_rows, counters, nonces)
    return blocks.reshape(n, nblocks * 16).view(np.uint64)[:, :nwords]


def np_unit(w) -> np.ndarray:
    return (np.asarray(w, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * _TWO53


def np_other_than(x: np.ndarray, m: int, u: np.ndarray) -> np.ndarray:
    o = (u * (m - 1)).astype(np.int64)
    return o + (o >= x)


# ---------------------------------------------------------------- exact Bernoulli bits, 8 per word
# Probabilities compared against 32-bit uniforms live on the 2^-32 grid (:func:`quantize32`);
# protocols use the quantized values everywhere (estimator, variance, ε), so the figures
# describe exactly what is sampled. A 32-bit uniform ``u = hi 2^24 + rest`` is compared with a
# threshold ``T`` lazily: its top byte ``hi`` decides unless it equals ``T``'s top byte
# (probability 1/256), and only then are 24 more bits drawn (a *refinement* word). One 64-bit
# word thus carries the top bytes of 8 uniforms, i.e. 8 Bernoulli bits, compared lane-wise with
# SWAR arithmetic (Warren, Hacker's Delight, 2nd ed. 2012, §6-1); the draw is exactly
# ``P(u < T) = T / 2^32``.
SCALE32 = float(1 << 32)
LO32 = np.uint64(0xFFFFFFFF)
_H = np.uint64(0x8080808080808080)
_L7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_GATHER = np.uint64(0x0102040810204080)
EXPAND = np.array([sum(0xFF << (8 * t) for t in range(8) if b >> t & 1) for b in range(256)], dtype=np.uint64)


def quantize32(p: float) -> float:
    """``p`` rounded to the 2^-32 grid on which 32-bit uniforms are compared."""
    return round(p * SCALE32) / SCALE32


def threshold32(p: float) -> np.uint64:
    """Integer threshold ``T`` with ``P(u32 < T) = quantize32(p)``."""
    return np.uint64(round(p * SCALE32))


def split_threshold(t: int) -> tuple[np.uint64, np.uint64]:
    """``(hi, rest)`` with ``t = hi 2^24 + rest`` and ``hi <= 255`` (``t = 2^32`` gives rest 2^24)."""
    hi = min(int(t) >> 24, 255)
    return np.uint64(hi), np.uint64(int(t) - (hi << 24))


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
def bernoulli_top(words, w0, hi_lanes, bits, eq) -> np.uint64:
    """Byte ``b`` of ``bits`` := lanes of word ``words[w0 + b]`` whose top byte is below the
    threshold's (``hi_lanes[b]``, one byte per lane); ``eq[b]`` marks the ties. Returns the OR
    of all tie masks (non-zero: call :func:`bernoulli_refine`). Branch-free; vectorizes."""
    tie = np.uint64(0)
    for b in range(bits.shape[0]):
        z = words[w0 + b]
        bits[b] = lanes_lt(z, hi_lanes[b])
        eq[b] = lanes_eq(z, hi_lanes[b])
        tie |= eq[b]
    return tie


@nb.njit(inline="always", cache=True)
def bernoulli_refine(bits, eq, sel, rest_a, rest_b, key, domain, a, prefix, j, cache, skip) -> int:
    """Settle the tied lanes of :func:`bernoulli_top` in order (byte, lane): the r-th tie is 1
    iff the low 24 bits of draw ``j + r`` (:func:`stream_word`) are below its threshold's rest,
    ``rest_a`` where bit t of ``sel[b]`` is set, else ``rest_b``. Returns the next draw index."""
    for b in range(bits.shape[0]):
        e = eq[b]
        while e:
            t = 0
            while not (e >> np.uint64(t)) & np.uint64(1):
                t += 1
            rest = stream_word(key, domain, a, prefix, j, cache, skip) & np.uint64(0xFFFFFF)
            j += 1
            if rest < (rest_a if (sel[b] >> np.uint64(t)) & np.uint64(1) else rest_b):
                bits[b] |= np.uint64(1) << np.uint64(t)
            e &= e - np.uint64(1)
    return j
