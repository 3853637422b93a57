"""Numba kernels of TreeHist (:mod:`.treehist`), each with a plain-numpy twin (``np_*``) computing the same function
from the same ChaCha20 streams (:mod:`estimators.randomness`); ``tests/test_sketch_treehist.py`` checks them equal.

A report is ``(level l, row j, y)``: the device's item prefix at level ``l`` (the top ``plen[l]`` bits of its 64-bit
id) is hashed with the public function of seed ``seeds[l R + j]`` (:func:`.hashing.sketch_hash`, the family defined
once) onto ``[0, g)`` and the bucket goes through GRR over ``g`` buckets (then, with an IRR, through a second GRR).

Draws (every uniform integer by rejection, so exactly uniform; every keep/flip decision a 53-bit integer
threshold, so its probability is exactly ``T / 2^53``):

* **Without a memo state** (simulation; a fresh report each call): row ``i``'s slot of :data:`SLOT` words of the
  batch noise stream ``(nkey, NOISE, 0)``: word 0 the level (``z mod L``, ``z <= rejection_limit(L)``), 1 the row,
  2 keep? (``z >> 11 < t1``), 3 the other bucket (uniform over the ``g - 1`` others), 4 and 5 the IRR's keep? and
  other bucket. Rejected words are replaced by the next words of the row's extension stream
  ``(nkey, NOISE_EXT, i)``, one counter for all of them, in the order of the draws.
* **With a memo state**: the level is the device's (:func:`keyed_choice` with :data:`LEVEL`: the first accepted of
  words 0..7 of the keyed stream ``(key, LEVEL, 0)``, word 7 when all 8 are rejected, probability below
  ``(L / 2^64)^8``, as RAPPOR's cohort); the PRR (row, keep?, other bucket) comes from words 0, 1, 2 of the stream
  ``(key, PRR, a)``, ``a`` the smallest id of the device's level prefix (a keyed PRF of the memo key and the
  memoized input; rejections take words 3, 4, .. of the same stream), so it is the same forever; the IRR from
  words 4 and 5 of the noise slot.

**Memo tags** (:func:`mark_tags`, the accounting of :meth:`.treehist.TreeHist.memoized_counts`): a device's ``seen``
bytes are a table of ``T = len(seen row) / 8`` little-endian uint64 tags. The tag of the memoized input ``a`` is
word 0 of the keyed stream ``(key, TAG, a)`` with its low bit set (``| 1``: never 0, the empty slot), the
all-ones word (:data:`OVERFLOW`) replaced by ``0xFF..FD``; it is inserted by linear probing from slot
``tag mod T``: found, a repeat; an empty slot first, a new input (one more ε∞). A full table meeting a new input
writes :data:`OVERFLOW` in slot 0: the device's loss can no longer be accounted (``inf``) and stays so. A table
holding a nonzero word with its low bit clear is no tag table (the slot bitset of an earlier release): it counts
``inf`` too (:func:`tag_counts`).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..randomness import NOISE, NOISE_EXT, PRR, fill_run, fill_words, np_stream_words, stream_word
from ..reference import Draws, noise_slots
from .hashing import np_sketch_hash, sketch_hash

__all__ = ["LEVEL", "OVERFLOW", "SLOT", "TAG", "candidate_counts", "mark_tags", "np_mark_tags", "tag_counts",
           "collision_fractions", "keyed_choice", "np_candidate_counts",
           "np_collision_fractions", "np_keyed_choice",
           "np_treehist_randomize", "treehist_randomize"]

LEVEL = np.uint32(0x4C564854)  # "THVL": a TreeHist device's fixed level, a = 0
TAG = np.uint32(0x47544854)    # "THTG": the memo tag of a memoized input, a = that input (module doc)
OVERFLOW = np.uint64(0xFFFFFFFFFFFFFFFF)  # slot 0 of a device whose tag table overflowed (module doc)
_TAG_SWAP = np.uint64(0xFFFFFFFFFFFFFFFD)  # the tag of a word whose `| 1` is OVERFLOW
SLOT = 6                       # noise words per report (module doc)
PRR_WORDS = 8                  # prefix of a memoized report's PRR stream (one block)
_CHUNK = 1 << 12
_S11 = np.uint64(11)
_U64 = np.uint64(64)


@nb.njit(cache=True, nogil=True)  # not inlined: one copy of the ChaCha20 block (a faster cold compile)
def _uniform(z, limit, m, key, domain, a, prefix, j, cache, skip):
    """``z mod m`` of the first accepted word (``z <= limit``), drawing replacements from ``stream_word``."""
    while z > limit:
        z = stream_word(key, domain, a, prefix, j, cache, skip)
        j += 1
    return np.int64(z % np.uint64(m)), j


@nb.njit(cache=True, nogil=True)
def _grr(x, g, keep, other, t53, limit, key, domain, a, prefix, j, cache, skip):
    """GRR over ``[0, g)``: ``x`` when ``keep >> 11 < t53``, else a uniform other bucket from ``other``."""
    if (keep >> _S11) < t53:
        return x, j
    o, j = _uniform(other, limit, g - 1, key, domain, a, prefix, j, cache, skip)
    if o >= x:
        o += 1
    return o, j


@nb.njit(cache=True, nogil=True)
def keyed_choice(keys, domain, m, limit):
    """Each device's fixed choice in ``[0, m)``, ``int64 (n,)``, from its memo key: the first accepted
    (``<= limit = rejection_limit(m)``) of words 0..7 of the stream ``(key, domain, 0)``, word 7 when all are
    rejected. TreeHist's level (:data:`LEVEL`), PEM's group (:data:`.pem_kernels.GROUP`)."""
    n = keys.shape[0]
    out = np.empty(n, dtype=np.int64)
    zeros = np.zeros(n, dtype=np.uint64)
    pre = np.empty((n, 8), dtype=np.uint64)
    fill_words(keys, True, domain, zeros, 0, n, pre)
    for i in range(n):
        w = pre[i, 7]
        for j in range(8):
            if pre[i, j] <= limit:
                w = pre[i, j]
                break
        out[i] = np.int64(w % np.uint64(m))
    return out


def np_keyed_choice(keys, domain, m, limit):
    """The numpy twin of :func:`keyed_choice`."""
    pre = np_stream_words(keys, domain, np.zeros(keys.shape[0], dtype=np.uint64), 8)
    ok = pre <= np.uint64(limit)
    first = np.where(ok.any(axis=1), ok.argmax(axis=1), 7)
    return (pre[np.arange(pre.shape[0]), first] % np.uint64(m)).astype(np.int64)


@nb.njit(cache=True, nogil=True)
def treehist_randomize(ids, plen, seeds, R, g, nkey, keys, levels, avals, t1, t2, lim_L, lim_R, lim_g):
    """Reports of ``n`` devices holding ``ids`` (``uint64 (n,)``): ``(level, row, y)``, three ``int64 (n,)``.

    ``plen`` the levels' prefix lengths, ``seeds`` the ``L R`` public row seeds (level-major), ``t1`` the PRR's and
    ``t2`` the IRR's 53-bit keep thresholds (``t2 = 2^53``: no IRR). With memo keys (``keys`` has ``n`` rows)
    ``levels`` are the devices' levels and ``avals`` the memoized inputs (module doc); else both are empty and
    everything is drawn from the noise slot. ``lim_*`` are the rejection limits of ``L``, ``R`` and ``g - 1``."""
    n = ids.shape[0]
    L = plen.shape[0]
    memo = keys.shape[0] > 0
    irr = t2 < np.uint64(1 << 53)
    lv = np.empty(n, dtype=np.int64)
    rw = np.empty(n, dtype=np.int64)
    ys = np.empty(n, dtype=np.int64)
    ncache = np.zeros(9, dtype=np.uint64)
    pcache = np.zeros(9, dtype=np.uint64)
    for r0 in range(0, n, _CHUNK):
        r1 = min(n, r0 + _CHUNK)
        noise = np.empty((r1 - r0) * SLOT if (irr or not memo) else 0, dtype=np.uint64)
        if noise.shape[0]:
            fill_run(nkey, NOISE, 0, r0 * SLOT, noise)
        prr = np.empty((r1 - r0 if memo else 0, PRR_WORDS), dtype=np.uint64)
        if memo:
            fill_words(keys, True, PRR, avals, r0, r1, prr)
        for i in range(r0, r1):
            slot = noise[(i - r0) * SLOT:(i - r0 + 1) * SLOT]
            ncache[8] = 0
            jn = SLOT
            if memo:
                l = levels[i]
                pre = prr[i - r0]
                pcache[8] = 0
                jp = 3
                j, jp = _uniform(pre[0], lim_R, R, keys[i], PRR, avals[i], pre, jp, pcache, 0)
            else:
                l, jn = _uniform(slot[0], lim_L, L, nkey, NOISE_EXT, i, slot, jn, ncache, SLOT)
                j, jn = _uniform(slot[1], lim_R, R, nkey, NOISE_EXT, i, slot, jn, ncache, SLOT)
            s = l * R + j
            v = ids[i] >> (_U64 - np.uint64(plen[l]))
            x = sketch_hash(np.full(1, v, dtype=np.uint64), seeds[s:s + 1], g)[0, 0]
            if memo:
                y, jp = _grr(x, g, pre[1], pre[2], t1, lim_g, keys[i], PRR, avals[i], pre, jp, pcache, 0)
            else:
                y, jn = _grr(x, g, slot[2], slot[3], t1, lim_g, nkey, NOISE_EXT, i, slot, jn, ncache, SLOT)
            if irr:
                y, jn = _grr(y, g, slot[4], slot[5], t2, lim_g, nkey, NOISE_EXT, i, slot, jn, ncache, SLOT)
            lv[i], rw[i], ys[i] = l, j, y
    return lv, rw, ys


@nb.njit(inline="always", cache=True)
def _get_tag(seen, i, s):
    t = np.uint64(0)
    for b in range(8):
        t |= np.uint64(seen[i, 8 * s + b]) << np.uint64(8 * b)
    return t


@nb.njit(inline="always", cache=True)
def _set_tag(seen, i, s, t):
    for b in range(8):
        seen[i, 8 * s + b] = np.uint8((t >> np.uint64(8 * b)) & np.uint64(0xFF))


@nb.njit(cache=True, nogil=True)
def mark_tags(keys, domain, avals, seen):
    """Insert each device's memoized input ``avals[i]`` (``uint64 (n,)``) in its tag table, the row ``seen[i]``
    (``uint8 (n, 8 T)``, updated in place; module doc), the tag from the keyed stream ``(keys[i], domain, avals[i])``
    (:data:`TAG` for TreeHist; RAPPOR's :data:`.rappor_kernels.TAG`). Returns ``int8 (n,)``: 1 a new input (a tag
    inserted), 0 a repeat (its tag found), -1 an overflowed table (full on a new input, or already overflowed)."""
    n = avals.shape[0]
    T = seen.shape[1] // 8
    out = np.zeros(n, dtype=np.int8)
    for r0 in range(0, n, _CHUNK):
        r1 = min(n, r0 + _CHUNK)
        words = np.empty((r1 - r0, 8), dtype=np.uint64)
        fill_words(keys, True, domain, avals, r0, r1, words)
        for i in range(r0, r1):
            if _get_tag(seen, i, 0) == OVERFLOW:
                out[i] = -1
                continue
            t = words[i - r0, 0] | np.uint64(1)
            if t == OVERFLOW:
                t = _TAG_SWAP
            h = np.int64(t % np.uint64(T))
            res = -1
            for k in range(T):
                s = (h + k) % T
                c = _get_tag(seen, i, s)
                if c == t:
                    res = 0
                    break
                if c == 0:
                    _set_tag(seen, i, s, t)
                    res = 1
                    break
            if res < 0:
                _set_tag(seen, i, 0, OVERFLOW)
            out[i] = res
    return out


def np_mark_tags(keys, domain, avals, seen):
    """The numpy twin of :func:`mark_tags`: the probes vectorized over the devices."""
    avals = np.asarray(avals, dtype=np.uint64)
    n, T = avals.shape[0], seen.shape[1] // 8
    out = np.zeros(n, dtype=np.int8)
    if n == 0:
        return out
    tags = np.ascontiguousarray(seen).view("<u8").copy()  # (n, T)
    t = np_stream_words(keys, domain, avals, 1)[:, 0] | np.uint64(1)
    t[t == OVERFLOW] = _TAG_SWAP
    over = tags[:, 0] == OVERFLOW
    out[over] = -1
    pending = ~over
    h = (t % np.uint64(T)).astype(np.int64)
    rows = np.arange(n)
    for k in range(T):
        if not pending.any():
            break
        s = (h + k) % T
        c = tags[rows, s]
        hit = pending & (c == t)
        empty = pending & (c == 0)
        out[hit] = 0
        out[empty] = 1
        tags[rows[empty], s[empty]] = t[empty]
        pending &= ~(hit | empty)
    out[pending] = -1
    tags[pending, 0] = OVERFLOW
    seen[...] = tags.view(np.uint8).reshape(seen.shape)
    return out


def tag_counts(seen) -> np.ndarray:
    """Distinct memoized inputs per device from the tag tables ``seen`` (``uint8 (n, 8 T)``): the nonzero tags,
    ``inf`` for an overflowed table and for a table holding a nonzero word that is no tag (its low bit 0: e.g. the
    one-bit-per-slot bitset of an earlier release, whose loss the table cannot account); ``float64 (n,)``."""
    tags = np.ascontiguousarray(seen).view("<u8")
    out = (tags != 0).sum(axis=1).astype(np.float64)
    if tags.shape[1]:
        bad = (tags[:, 0] == OVERFLOW) | ((tags != 0) & ((tags & np.uint64(1)) == 0)).any(axis=1)
        out[bad] = np.inf
    return out


def _np_uniform(z, limit, m, draw, j):
    while z > limit:
        z = draw(j)
        j += 1
    return int(z % np.uint64(m)), j


def _np_grr(x, g, keep, other, t53, limit, draw, j):
    if (keep >> _S11) < t53:
        return x, j
    o, j = _np_uniform(other, limit, g - 1, draw, j)
    return o + (o >= x), j


def np_treehist_randomize(ids, plen, seeds, R, g, nkey, keys, levels, avals, t1, t2, lim_L, lim_R, lim_g):
    """The numpy twin of :func:`treehist_randomize`: the draws vectorized, rejections (rare) row by row."""
    ids = np.asarray(ids, dtype=np.uint64)
    n, L = ids.shape[0], plen.shape[0]
    memo = keys.shape[0] > 0
    irr = int(t2) < (1 << 53)
    lim_L, lim_R, lim_g, t1, t2 = (np.uint64(v) for v in (lim_L, lim_R, lim_g, t1, t2))
    slots = noise_slots(nkey, n, SLOT)
    if memo:
        pre = np_stream_words(keys, PRR, avals, PRR_WORDS) if n else np.zeros((0, PRR_WORDS), dtype=np.uint64)
        lv = np.asarray(levels, dtype=np.int64).copy()
        zr, keep1, other1 = pre[:, 0], pre[:, 1], pre[:, 2]
    else:
        lv = (slots[:, 0] % np.uint64(L)).astype(np.int64)
        zr, keep1, other1 = slots[:, 1], slots[:, 2], slots[:, 3]
    rw = (zr % np.uint64(R)).astype(np.int64)
    v = ids >> (np.uint64(64) - plen[lv].astype(np.uint64))
    x = np.zeros(n, dtype=np.int64)
    s_idx = lv * R + rw
    for s in np.unique(s_idx):
        sel = s_idx == s
        x[sel] = np_sketch_hash(v[sel], seeds[s:s + 1], g)[:, 0]
    # the common path: no rejection anywhere
    oth1 = (other1 % np.uint64(g - 1)).astype(np.int64)
    y = np.where((keep1 >> _S11) < t1, x, oth1 + (oth1 >= x))
    if irr:
        oth2 = (slots[:, 5] % np.uint64(g - 1)).astype(np.int64)
        y = np.where((slots[:, 4] >> _S11) < t2, y, oth2 + (oth2 >= y))
    bad = (other1 > lim_g) | (zr > lim_R)
    bad |= (slots[:, 5] > lim_g) if irr else False
    if not memo:
        bad |= slots[:, 0] > lim_L
    for i in np.flatnonzero(bad):  # the exact sequential draws of the kernel
        nd = Draws(nkey, NOISE_EXT, i, slots[i], skip=SLOT)
        jn = SLOT
        if memo:
            pd = Draws(keys[i], PRR, avals[i], pre[i], skip=0)
            jp = 3
            j, jp = _np_uniform(pre[i, 0], lim_R, R, pd, jp)
            l = int(lv[i])
        else:
            l, jn = _np_uniform(slots[i, 0], lim_L, L, nd, jn)
            j, jn = _np_uniform(slots[i, 1], lim_R, R, nd, jn)
        s = l * R + j
        vi = ids[i:i + 1] >> np.uint64(64 - int(plen[l]))
        xi = int(np_sketch_hash(vi, seeds[s:s + 1], g)[0, 0])
        if memo:
            yi, jp = _np_grr(xi, g, pre[i, 1], pre[i, 2], t1, lim_g, pd, jp)
        else:
            yi, jn = _np_grr(xi, g, slots[i, 2], slots[i, 3], t1, lim_g, nd, jn)
        if irr:
            yi, jn = _np_grr(yi, g, slots[i, 4], slots[i, 5], t2, lim_g, nd, jn)
        lv[i], rw[i], y[i] = l, j, yi
    return lv, rw, np.asarray(y, dtype=np.int64)


@nb.njit(cache=True, nogil=True)
def candidate_counts(cands, seeds, cells, g):
    """``C[c] = Σ_j cells[j, h_j(cands[c])]`` over a level's ``R`` rows (``seeds``, ``cells int64 (R, g)``):
    the level's support of each candidate prefix (``uint64``), ``int64 (len(cands),)``."""
    h = sketch_hash(cands, seeds, g)
    out = np.zeros(cands.shape[0], dtype=np.int64)
    for c in range(cands.shape[0]):
        s = np.int64(0)
        for j in range(seeds.shape[0]):
            s += cells[j, h[c, j]]
        out[c] = s
    return out


def np_candidate_counts(cands, seeds, cells, g):
    """The numpy twin of :func:`candidate_counts`."""
    h = np_sketch_hash(np.asarray(cands, dtype=np.uint64), seeds, g)
    return cells[np.arange(seeds.shape[0])[None, :], h].sum(axis=1).astype(np.int64)


@nb.njit(cache=True, nogil=True)
def collision_fractions(h, heavy):
    """``β[c, i]`` = the fraction of rows where candidate ``c`` and candidate ``heavy[i]`` hash alike (``h``: the
    candidates' buckets, ``int64 (K, R)``), ``float64 (K, len(heavy))``; O(K |heavy| R)."""
    K, R = h.shape
    out = np.zeros((K, heavy.shape[0]))
    for c in range(K):
        for i in range(heavy.shape[0]):
            u = heavy[i]
            s = 0
            for j in range(R):
                if h[c, j] == h[u, j]:
                    s += 1
            out[c, i] = s / R
    return out


def np_collision_fractions(h, heavy):
    """The numpy twin of :func:`collision_fractions`."""
    return np.stack([(h == h[u][None, :]).mean(axis=1) for u in heavy], axis=1) if len(heavy) else \
        np.zeros((h.shape[0], 0))
