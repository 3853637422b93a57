"""Numba kernels of RAPPOR with Bloom filters (:mod:`.rappor`) and their plain-numpy twins (``np_*``).

Same inputs, same ChaCha20 streams (:mod:`estimators.randomness`), same outputs; ``tests/test_sketch_rappor.py``
compares them exactly. Every Bernoulli bit is one 32-bit uniform (bit ``b`` of a row: half ``b & 1`` of word
``b >> 1``, low half first) compared with a threshold on the 2^-32 grid (:func:`estimators.randomness.threshold32`),
so ``P(bit = 1)`` is exactly ``T / 2^32``.

Streams:

* the device's cohort: word 0 of ``(key, COHORT, 0)`` reduced by rejection onto ``[0, cohorts)`` (words 1..7 of the
  block if word 0 is rejected; the chance that all 8 are, ``< (cohorts / 2^64)^8``, is ignored: then word 7 mod);
* the PRR of value id ``v``: the stream ``(key, PRR, v)``, a keyed PRF of the device's memo key and the id, so the
  same device reporting the same value gets the same memoized bits forever (RAPPOR's PRR, Erlingsson, Pihur &
  Korolova, CCS 2014, §2 step 2);
* the IRR: row ``i``'s slot of ``ceil(m/2)`` words of the batch noise stream ``(nkey, NOISE, 0)`` (fresh per report,
  §2 step 3);
* the memo tag of value id ``v`` (the accounting, :mod:`.rappor`): word 0 of ``(key, TAG, v)``, inserted in the
  device's tag table by :func:`.treehist_kernels.mark_tags` (the same table as TreeHist's). The kernels' own
  ``seen``/``slots`` marking (one bit per slot) is the former accounting, no longer used by :class:`.rappor.RAPPOR`.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..kernels import _mark
from ..randomness import KEY_WORDS, LO32, NOISE, PRR, fill_run, fill_words, np_stream_words, rejection_limit
from ..reference import noise_slots

__all__ = ["COHORT", "TAG", "np_rappor_cohorts", "np_rappor_randomize", "np_rappor_support", "rappor_cohorts",
           "rappor_randomize", "rappor_support"]

COHORT = np.uint32(0x54524843)  # "CHRT": a RAPPOR device's fixed cohort, a = 0
TAG = np.uint32(0x47545052)     # "RPTG": the memo tag of a memoized value id, a = the id (:mod:`.rappor`)
_CHUNK = 1 << 10
_U32 = np.uint64(32)


def prr_words(m: int) -> int:
    """Words of the PRR prefix of an ``m``-bit filter (whole ChaCha20 blocks)."""
    return ((m + 1) // 2 + 7) // 8 * 8


@nb.njit(cache=True, nogil=True)
def rappor_cohorts(keys, cohorts, limit):
    """Each device's cohort, ``int64 (n,)``, from its memo key (``limit`` = :func:`rejection_limit` ``(cohorts)``)."""
    n = keys.shape[0]
    out = np.empty(n, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.uint64)
    pre = np.empty((n, 8), dtype=np.uint64)
    fill_words(keys, True, COHORT, zeros, 0, n, pre)
    cc = np.uint64(cohorts)
    for i in range(n):
        w = pre[i, 7]
        for j in range(8):
            if pre[i, j] <= limit:
                w = pre[i, j]
                break
        out[i] = np.int64(w % cc)
    return out


def np_rappor_cohorts(keys, cohorts, limit):
    pre = np_stream_words(keys, COHORT, np.zeros(keys.shape[0], dtype=np.uint64), 8)
    ok = pre <= np.uint64(limit)
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), 7)
    return (pre[np.arange(pre.shape[0]), first] % np.uint64(cohorts)).astype(np.int64)


@nb.njit(inline="always", cache=True)
def _u32(words, b):
    return (words[b >> 1] >> (_U32 * np.uint64(b & 1))) & LO32


@nb.njit(parallel=False, cache=True, nogil=True)  # serial: a parallel kernel doubles the cold compile
def rappor_randomize(ids, pos, keys, seen, slots, nkey, t1p, t1q, t2p, t2q, m, irr):
    """RAPPOR reports of ``n`` devices, ``m`` bits packed little-endian into ``uint8 (n, ceil(m/8))``.

    ``pos`` ``int64 (n, h)``: the Bloom bits of ``ids[i]`` in device ``i``'s cohort. PRR bit ``b`` is 1 with
    probability ``t1p / 2^32`` if ``b`` is a Bloom bit else ``t1q / 2^32`` (drawn from ``(keys[i], PRR, ids[i])``);
    with ``irr`` the IRR bit is 1 with ``t2p / 2^32`` where the PRR bit is 1 else ``t2q / 2^32`` (noise slot).
    Marks ``slots[i]`` in ``seen`` (the memo accounting) when ``seen`` has rows."""
    n, h = pos.shape
    nbytes = (m + 7) // 8
    half = (m + 1) // 2
    pw = ((half + 7) // 8) * 8
    out = np.zeros((n, nbytes), dtype=np.uint8)
    mark = seen.shape[0] > 0
    nchunks = (n + _CHUNK - 1) // _CHUNK
    for c in nb.prange(nchunks):
        r0, r1 = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        prr = np.empty((r1 - r0, pw), dtype=np.uint64)
        fill_words(keys, True, PRR, ids, r0, r1, prr)
        noise = np.empty((r1 - r0) * half if irr else 0, dtype=np.uint64)
        if irr:
            fill_run(nkey, NOISE, 0, r0 * half, noise)
        bloom = np.zeros(m, dtype=np.bool_)
        for i in range(r0, r1):
            if mark:
                _mark(seen, i, slots[i])
            for b in range(m):
                bloom[b] = False
            for j in range(h):
                bloom[pos[i, j]] = True
            pre = prr[i - r0]
            slot = noise[(i - r0) * half:(i - r0 + 1) * half]
            for b in range(m):
                bit = _u32(pre, b) < (t1p if bloom[b] else t1q)
                if irr:
                    bit = _u32(slot, b) < (t2p if bit else t2q)
                if bit:
                    out[i, b >> 3] |= np.uint8(1 << (b & 7))
    return out


def np_rappor_randomize(ids, pos, keys, seen, slots, nkey, t1p, t1q, t2p, t2q, m, irr):
    n, h = pos.shape
    half = (m + 1) // 2
    if seen.shape[0]:
        rows = np.arange(n)
        np.bitwise_or.at(seen, (rows, slots >> 3), (1 << (slots & 7)).astype(np.uint8))
    bloom = np.zeros((n, m), dtype=bool)
    bloom[np.repeat(np.arange(n), h), pos.reshape(-1)] = True

    def u32(words):
        lo, hi = words & np.uint64(0xFFFFFFFF), words >> np.uint64(32)
        return np.stack([lo, hi], axis=2).reshape(words.shape[0], -1)[:, :m]

    keys = np.asarray(keys, dtype=np.uint32).reshape(-1, KEY_WORDS)
    u1 = u32(np_stream_words(keys, PRR, ids, half)) if n else np.zeros((0, m), dtype=np.uint64)
    bits = u1 < np.where(bloom, np.uint64(t1p), np.uint64(t1q))
    if irr and n:
        u2 = u32(noise_slots(nkey, n, half))
        bits = u2 < np.where(bits, np.uint64(t2p), np.uint64(t2q))
    return np.packbits(bits, axis=1, bitorder="little")


@nb.njit(cache=True, nogil=True)
def rappor_support(cohort, bits, cohorts, m):
    """Per cohort ``j``: ``[N_j, c_j0 .. c_j(m-1)]`` (reports, then the count of 1s of each bit), flat
    ``int64 (cohorts * (m + 1),)``."""
    out = np.zeros((cohorts, m + 1), dtype=np.int64)
    for i in range(bits.shape[0]):
        row = out[cohort[i]]
        row[0] += 1
        for b in range(m):
            if (bits[i, b >> 3] >> (b & 7)) & 1:
                row[b + 1] += 1
    return out.reshape(-1)


def np_rappor_support(cohort, bits, cohorts, m):
    out = np.zeros((cohorts, m + 1), dtype=np.int64)
    np.add.at(out[:, 0], cohort, 1)
    unpacked = np.unpackbits(bits, axis=1, bitorder="little")[:, :m].astype(np.int64)
    np.add.at(out[:, 1:], cohort, unpacked)
    return out.reshape(-1)


def cohort_limit(cohorts: int) -> np.uint64:
    return rejection_limit(cohorts)
