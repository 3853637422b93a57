"""Data poisoning of frequency oracles, and the defenses that are sound for them.

The threat model of Cao, Jia & Gong, "Data Poisoning Attacks to Local Differential Privacy
Protocols", USENIX Security 2021: an attacker injects ``m`` fake devices next to ``n`` genuine
ones (``β = m / (n + m)``); each fake sends a crafted report of the protocol's output space, the
server estimates over all ``n + m`` reports, and the attacker's *frequency gain* is
``G = Σ_{t∈T} (f̃_t,after − f̃_t,before)`` over its ``r`` target items ``T``.

Attacks (:func:`craft_reports`), for the three families of the project (direct: GRR, L-GRR;
unary: SUE, OUE and the memoized L-UE chains L-OUE/L-SUE/L-OSUE/L-SOUE; local hashing: BLH,
OLH, LOLOHA):

* ``RVA`` (random value): a uniformly random point of the output space.
* ``RIA`` (random item): a uniformly random target, randomized honestly by the protocol.
* ``MGA`` (maximal gain): the report that supports every target. GRR: a random target; unary:
  the target bits set, plus ``l − r`` random other bits, ``l`` the honest expected number of set
  bits, so that the report does not stand out by its size (Cao et al.'s construction); local
  hashing: a hash seed under which the targets share one hash value (the best of a pool of random
  seeds), and that value.
* ``MGA-nopad`` (unary only): the target bits alone, the naive MGA that ignores detection.

A report of a pure protocol supports its value w.p. ``ps`` and any other w.p. ``qs``, so by
linearity, for fake reports that support the targets ``s_T`` times on average,
``E[G] = β ((s_T − r qs) / (ps − qs) − f_T)`` (:func:`expected_gain`; Cao et al.'s closed forms
are its cases: RIA ``s_T = ps + (r−1) qs`` gives ``β (1 − f_T)`` for every protocol; GRR's MGA
``s_T = 1`` gives ``β (1 − f_T) + β (k − r) / (e^ε − 1)``; OUE's and OLH's MGA ``s_T = r``
gives about ``β (2r − f_T) + 2rβ / (e^ε − 1)``).

Defenses, each sound in the sense that honest data keep an unbiased estimator and a stated
false-alarm rate ``α`` (default :data:`DEFAULT_ALPHA` = 1e-6):

1. **Plausibility of a unary report** (:func:`plausibility_check`). The number of set bits of an
   honest report is ``Bern(ps) + Bin(k − 1, qs)`` whatever the value (the bits are independent;
   for the L-UE chains ``ps``/``qs`` are the chain's, Arcolezi et al., DCN 2022, Eq. 9, since the
   PRR and the IRR draw every bit independently). A report outside ``[lo, hi]``, the exact two-sided
   tails of that law at ``α``, is implausible. Dropping such reports keeps an exactly unbiased
   estimator: the kept reports are pure with ``ps' = ps a1 / κ`` and ``qs' = qs a0 / κ`` (``κ`` the
   acceptance probability, ``a1``/``a0`` the acceptance probability given that bit ``i`` is set and
   ``i`` is / is not the value; :class:`PlausibilityCheck`). The check stops reports of an
   implausible size (MGA-nopad at small ``r``, RVA's half-set vectors at small ε); Cao et al.'s MGA
   pads to a plausible size and passes. The "Diffstats" detector of Li, Li, Wang & Sun,
   "Mitigating Data Poisoning Attacks to Local Differential Privacy", arXiv 2506.02156, 2025, tests
   the same statistic.
2. **Fake-report detection by itemsets**, Cao et al.'s countermeasure "detecting fake users" (the
   MGA reports of OUE and OLH all support the same target itemset).
   Unary (:func:`detect_itemset`): for honest reports the bits are independent given the value, and
   across the population slightly *negatively* correlated; MGA makes the targets' bits strongly
   positively correlated. The pair of largest ``√n φ`` (φ the Pearson correlation of two columns)
   seeds an itemset, grown greedily while a value's bit is positively correlated with "supports
   the whole set", each step at a Bonferroni level. The reports supporting the whole set are
   dropped and :func:`itemset_estimate` compensates exactly for the honest reports that support it
   by chance. Local hashing (:func:`detect_seed_itemset`): an MGA report's seed makes the targets
   collide; honest seeds are uniform and independent of the values, so the number of reports whose
   seed makes two values collide has an exact binomial law (no frequency enters); the reports whose
   seed makes the pair of largest excess collide are dropped, a selection on the seeds alone, and
   :func:`seed_conditional_estimate` (the estimator given the kept seeds) stays unbiased. Both need
   ``r ≥ 2`` targets; neither applies to GRR.
3. **A per-step detection statistic from counts alone** (:func:`detection_score`, unary): the total
   support ``Σ_v c_v`` of ``n`` honest reports has mean ``n (ps + (k−1) qs)`` and variance
   ``n (ps (1−ps) + (k−1) qs (1−qs))`` whatever the distribution. Its z-score flags a step in which
   reports set too many or too few bits (MGA-nopad, RVA). It only alarms; it filters nothing. For
   local hashing the same total has no closed-form law: the project's hash family is pairwise but
   not 3-wise independent, and the support size of an honest OLH report has up to twice the
   binomial variance (measured: 9.7 instead of 4.7 at ε = 3, k = 100), so no score is given.

What an attacker aware of the defenses can still do (the limits): an RIA report *is* an honest
report of a target value, so its gain ``β (1 − f_T)`` survives every report-level defense (only
the number of fake devices, i.e. authentication and rate limits, bounds it); an MGA padded to a
plausible size passes (1) and (3); against (2) the attacker can spread its targets (each fake
supporting a different one), which divides its MGA gain by about ``r`` but is not detected, and
with ``r = 1`` MGA is indistinguishable from a popular value; the statistics of (2) grow like
``β √n``, so few fakes in a small step go unseen, and for local hashing the fakes whose seeds do
not make the one detected pair collide stay. GRR (and L-GRR) reports are single
values: no per-report check exists, ``Σ_v c_v = n`` always, and no defense here reduces a GRR gain.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from math import lgamma, log, log1p
from statistics import NormalDist
from typing import Literal

import numba as nb
import numpy as np

from . import kernels
from .adaptive import Adaptive
from .base import FrequencyProtocol, PureProtocol
from .direct import GRR, LGRR
from .errors import LDPError
from .hashing import LOLOHA, LocalHashing
from .multidim import ChannelView
from .unary import UnaryReports

__all__ = ["ATTACKS", "DEFAULT_ALPHA", "Family", "PlausibilityCheck", "ItemsetDetection", "Defended", "family",
           "honest_law", "fake_count", "craft_reports", "target_support", "expected_gain", "frequency_gain",
           "support_size_law", "plausibility_check", "set_bits", "implausible", "count_implausible",
           "support_matrix", "hash_matrix", "detect_itemset", "itemset_estimate", "collision_rates",
           "detect_seed_itemset", "seed_conditional_estimate", "detection_score", "detection_threshold", "defend"]

Family = Literal["direct", "unary", "hashing"]
ATTACKS: tuple[str, ...] = ("MGA", "MGA-nopad", "RIA", "RVA")

#: default false-alarm rate of every defense: the fraction of honest reports a plausibility check
#: drops, and the probability that an honest step raises the itemset detection or the step score
DEFAULT_ALPHA = 1e-6


# ====================================================================== protocol families and their laws
def _base(proto: FrequencyProtocol) -> FrequencyProtocol:
    """The protocol whose reports the server sees: ADP/L-ADP's chosen one, SPL/SMP's channel."""
    while True:
        if isinstance(proto, Adaptive):
            proto = proto.chosen
        elif isinstance(proto, ChannelView):
            proto = proto.channel
        else:
            return proto


def family(proto: FrequencyProtocol) -> Family | None:
    """``"direct"`` (GRR, L-GRR), ``"unary"`` (SUE, OUE, L-UE chains), ``"hashing"`` (BLH, OLH,
    LOLOHA), or ``None`` for the protocols this module does not model (HR, SS, SHE, THE, dBitFlipPM,
    fake-data views of multidimensional solutions)."""
    p = _base(proto)
    if isinstance(p, (GRR, LGRR)):
        return "direct"
    if isinstance(p, UnaryReports) and isinstance(p, PureProtocol):
        return "unary"
    if isinstance(p, (LocalHashing, LOLOHA)):
        return "hashing"
    return None


def _family(proto: FrequencyProtocol) -> Family:
    fam = family(proto)
    if fam is None:
        raise LDPError(f"{proto.name}: poisoning attacks and defenses are modelled for GRR, unary and local-hashing "
                       "protocols only")
    return fam


def honest_law(proto: FrequencyProtocol) -> tuple[float, float]:
    """``(ps, qs)``: P(an honest report supports its value), P(it supports another value)."""
    p = _base(proto)
    _family(p)
    return float(p.ps), float(p.qs)  # type: ignore[attr-defined]


def fake_count(n_genuine: int, beta: float) -> int:
    """Fake devices ``m`` for a fraction ``β = m / (n + m)`` of fakes (Cao et al.'s β)."""
    if not 0.0 <= beta < 1.0:
        raise LDPError(f"the fraction of fake devices must lie in [0, 1), got {beta}")
    return int(round(beta * n_genuine / (1.0 - beta)))


# ====================================================================== attacks
def _attacker_rng(rng: np.random.Generator | None) -> np.random.Generator:
    """The attacker's own choices (targets, padding, seeds): ``rng`` in simulation, else a generator
    seeded from the OS CSPRNG (an attacker's draws protect nobody's privacy)."""
    return rng if rng is not None else np.random.default_rng(secrets.randbits(128))


def _check_targets(proto: FrequencyProtocol, targets: np.ndarray) -> np.ndarray:
    t = np.unique(np.asarray(targets, dtype=np.int64))
    if t.size == 0 or t.size != np.asarray(targets).size or t.min() < 0 or t.max() >= proto.k:
        raise LDPError(f"targets must be distinct values of [0, {proto.k}), got {targets!r}")
    return t


def _pack_bits(bits: np.ndarray) -> np.ndarray:
    return np.packbits(bits.astype(np.uint8, copy=False), axis=1, bitorder="little")


def _honest_size_mean(proto: FrequencyProtocol) -> float:
    ps, qs = honest_law(proto)
    return ps + (proto.k - 1) * qs


def _lh_reports(p: FrequencyProtocol, seeds: np.ndarray, ys: np.ndarray) -> np.ndarray:
    out = np.empty(seeds.shape[0], dtype=p.report_dtype)
    out["seed"] = seeds
    out["y"] = ys
    return out


def _mga_seeds(p: FrequencyProtocol, targets: np.ndarray, rng: np.random.Generator,
               pool: int) -> tuple[np.ndarray, np.ndarray]:
    """Among ``pool`` random hash seeds, those under which the most targets share one hash value,
    and that value (Cao et al. search hash functions the same way)."""
    g = int(p.g)  # type: ignore[attr-defined]
    pool = max(1, min(pool, (1 << 24) // max(g, 1)))
    seeds = rng.integers(0, 1 << 32, size=pool, dtype=np.uint32)
    r = targets.size
    h = kernels.lh_hash_rows(np.repeat(seeds, r), np.tile(targets, pool), g).reshape(pool, r)
    hist = np.bincount((np.arange(pool)[:, None] * g + h).ravel(), minlength=pool * g).reshape(pool, g)
    best = hist.max(axis=1)
    good = np.flatnonzero(best == best.max())
    return seeds[good], hist[good].argmax(axis=1)


def craft_reports(proto: FrequencyProtocol, attack: str, targets: np.ndarray, m: int,
                  rng: np.random.Generator | None = None, *, seed_pool: int = 1 << 16) -> np.ndarray:
    """``m`` fake reports of ``attack`` (see the module doc) promoting ``targets``, in the
    protocol's report format (what :meth:`~estimators.base.FrequencyProtocol.encode` takes).

    ``rng``: the attacker's randomness; a numpy Generator is the labelled simulation mode (RIA
    then randomizes through the protocol in simulation mode too), ``None`` draws from the OS CSPRNG.
    """
    fam = _family(proto)
    p = _base(proto)
    t = _check_targets(proto, targets)
    k, r = proto.k, t.size
    if m < 0:
        raise LDPError(f"m must be >= 0, got {m}")
    a = _attacker_rng(rng)
    if attack == "RIA":
        values = t[a.integers(0, r, m)]
        state = p.new_state(m, rng)
        return p.randomize(values, rng, state=state)
    if attack == "RVA":
        if fam == "direct":
            return a.integers(0, k, m).astype(p.report_dtype)
        if fam == "unary":
            return _pack_bits(a.random((m, k)) < 0.5)
        g = int(p.g)  # type: ignore[attr-defined]
        return _lh_reports(p, a.integers(0, 1 << 32, m, dtype=np.uint32), a.integers(0, g, m))
    if attack not in ("MGA", "MGA-nopad"):
        raise LDPError(f"unknown attack {attack!r}; known: {', '.join(ATTACKS)}")
    if attack == "MGA-nopad" and fam != "unary":
        raise LDPError("MGA-nopad is an attack on unary reports only")
    if fam == "direct":
        return t[a.integers(0, r, m)].astype(p.report_dtype)
    if fam == "unary":
        bits = np.zeros((m, k), dtype=bool)
        bits[:, t] = True
        pad = max(0, int(round(_honest_size_mean(p))) - r) if attack == "MGA" else 0
        if pad:
            others = np.setdiff1d(np.arange(k), t)
            pick = np.argpartition(a.random((m, others.size)), pad - 1, axis=1)[:, :pad]
            bits[np.arange(m)[:, None], others[pick]] = True
        return _pack_bits(bits)
    seeds, ys = _mga_seeds(p, t, a, seed_pool)
    pick = a.integers(0, seeds.size, m)
    return _lh_reports(p, seeds[pick], ys[pick])


def target_support(proto: FrequencyProtocol, attack: str, r: int) -> float:
    """Expected number of targets a fake report of ``attack`` supports, ``s_T`` (MGA on local
    hashing: ``r``, reached when the seed pool holds seeds under which all targets collide)."""
    fam = _family(proto)
    ps, qs = honest_law(proto)
    if attack == "RIA":
        return ps + (r - 1) * qs
    if attack == "RVA":
        return {"direct": r / proto.k, "unary": r / 2, "hashing": r * qs}[fam]
    if attack in ("MGA", "MGA-nopad"):
        return 1.0 if fam == "direct" else float(r)
    raise LDPError(f"unknown attack {attack!r}; known: {', '.join(ATTACKS)}")


def expected_gain(proto: FrequencyProtocol, beta: float, s_t: float, r: int, f_t: float) -> float:
    """``E[G] = β ((s_T − r qs) / (ps − qs) − f_T)``: the expected frequency gain of fakes that
    support the ``r`` targets ``s_T`` times per report, when the genuine devices hold them with
    total frequency ``f_T`` (Cao et al.'s gains of RVA, RIA and MGA are its cases, module doc)."""
    ps, qs = honest_law(proto)
    return float(beta * ((s_t - r * qs) / (ps - qs) - f_t))


def frequency_gain(after: np.ndarray, before: np.ndarray, targets: np.ndarray) -> float:
    """``G = Σ_{t∈T} (f̃_t,after − f̃_t,before)`` (Cao et al.'s frequency gain)."""
    t = np.asarray(targets, dtype=np.int64)
    return float(np.sum(np.asarray(after)[t] - np.asarray(before)[t]))


# ====================================================================== defense 1: plausible report sizes
def binomial_pmf(n: int, p: float) -> np.ndarray:
    """pmf ``(n + 1,)`` of ``Bin(n, p)``, in log space with exact log-factorials (``math.lgamma``).

    The standard library's, not ``scipy.stats.binom``: every worker computes it at start (the plausibility
    check of each unary attribute), and importing ``scipy.stats`` costs a worker more CPU than the rest of its
    start; ``tests/test_poisoning.py`` compares the two."""
    if not 0.0 <= p <= 1.0 or n < 0:
        raise LDPError(f"Bin(n={n}, p={p}) is not a distribution")
    out = np.zeros(n + 1)
    if p in (0.0, 1.0):
        out[0 if p == 0.0 else n] = 1.0
        return out
    i = np.arange(n + 1)
    log_fact = np.array([lgamma(j + 1.0) for j in range(n + 1)])
    return np.exp(log_fact[n] - log_fact - log_fact[::-1] + i * log(p) + (n - i) * log1p(-p))


def support_size_law(proto: FrequencyProtocol) -> np.ndarray:
    """pmf ``(k + 1,)`` of the number of set bits of an honest unary report:
    ``Bern(ps) + Bin(k − 1, qs)`` (its bits are independent, module doc)."""
    if _family(proto) != "unary":
        raise LDPError(f"{proto.name}: the size law is that of unary reports")
    ps, qs = honest_law(proto)
    b = binomial_pmf(proto.k - 1, qs)
    out = np.zeros(proto.k + 1)
    out[:-1] += (1 - ps) * b
    out[1:] += ps * b
    return out


def _interval_prob(pmf: np.ndarray, lo: int, hi: int) -> float:
    lo, hi = max(lo, 0), min(hi, pmf.size - 1)
    return float(pmf[lo:hi + 1].sum()) if hi >= lo else 0.0


@dataclass(frozen=True)
class PlausibilityCheck:
    """Accept a unary report iff its number of set bits lies in ``[lo, hi]``.

    ``false_rejection`` is the exact probability that an honest report is dropped (``≤ alpha``);
    ``kept_ps`` / ``kept_qs`` are the pure law of the kept honest reports, so
    ``(c − n qs') / (n (ps' − qs'))`` over the kept reports is exactly unbiased.
    """

    k: int
    lo: int
    hi: int
    alpha: float
    false_rejection: float
    kept_ps: float
    kept_qs: float

    def estimate(self, counts: np.ndarray, n: int) -> np.ndarray:
        """The unbiased estimator over ``n`` kept reports with support counts ``counts``."""
        return (np.asarray(counts, dtype=np.float64) / n - self.kept_qs) / (self.kept_ps - self.kept_qs)


_CHECKS: dict[tuple[str, float], PlausibilityCheck] = {}


def plausibility_check(proto: FrequencyProtocol, alpha: float = DEFAULT_ALPHA) -> PlausibilityCheck:
    """The two-sided exact-tail check of a unary protocol at false-rejection rate ``alpha``:
    ``lo`` the largest size with ``P(size < lo) ≤ α/2``, ``hi`` the smallest with
    ``P(size > hi) ≤ α/2`` (cached per protocol fingerprint)."""
    if _family(proto) != "unary":
        raise LDPError(f"{proto.name}: the plausibility check applies to unary reports only")
    if not 0.0 < alpha < 1.0:
        raise LDPError(f"alpha must lie in (0, 1), got {alpha}")
    key = (proto.fingerprint, float(alpha))
    if key in _CHECKS:
        return _CHECKS[key]
    k = proto.k
    ps, qs = honest_law(proto)
    pmf = support_size_law(proto)
    below = np.concatenate(([0.0], np.cumsum(pmf)))          # below[s] = P(size < s)
    above = np.concatenate((np.cumsum(pmf[::-1])[::-1][1:], [0.0]))  # above[s] = P(size > s)
    lo = int(np.flatnonzero(below <= alpha / 2).max())
    hi = int(np.flatnonzero(above <= alpha / 2).min())
    kappa = _interval_prob(pmf, lo, hi)
    b1 = binomial_pmf(k - 1, qs)                               # the other k-1 bits
    b2 = binomial_pmf(k - 2, qs)                               # the k-2 bits besides i and the value
    a1 = _interval_prob(b1, lo - 1, hi - 1)                    # bit i set, i the value
    a0 = (1 - ps) * _interval_prob(b2, lo - 1, hi - 1) + ps * _interval_prob(b2, lo - 2, hi - 2)
    chk = PlausibilityCheck(k, lo, hi, float(alpha), 1.0 - kappa, ps * a1 / kappa, qs * a0 / kappa)
    _CHECKS[key] = chk
    return chk


_POP8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


@nb.njit(parallel=True, cache=True, nogil=True)
def _row_bits(bits, pop):
    n, nbytes = bits.shape
    out = np.empty(n, dtype=np.int64)
    for i in nb.prange(n):
        s = 0
        for b in range(nbytes):
            s += pop[bits[i, b]]
        out[i] = s
    return out


@nb.njit(parallel=True, cache=True, nogil=True)
def _count_outside(bits, pop, lo, hi):
    n, nbytes = bits.shape
    bad = 0
    for i in nb.prange(n):
        s = 0
        for b in range(nbytes):
            s += pop[bits[i, b]]
        if s < lo or s > hi:
            bad += 1
    return bad


def set_bits(reports: np.ndarray) -> np.ndarray:
    """Number of set bits of every packed unary report, ``int64 (n,)``."""
    r = np.ascontiguousarray(reports, dtype=np.uint8)
    return _row_bits(r.reshape(r.shape[0], int(np.prod(r.shape[1:], dtype=np.int64))), _POP8)


def implausible(proto: FrequencyProtocol, reports: np.ndarray, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """Boolean ``(n,)``: the unary reports the plausibility check drops."""
    chk = plausibility_check(proto, alpha)
    s = set_bits(reports)
    return (s < chk.lo) | (s > chk.hi)


def count_implausible(proto: FrequencyProtocol, reports: np.ndarray, alpha: float = DEFAULT_ALPHA) -> int:
    """How many reports of a batch fail the plausibility check (0 for protocols without one):
    the worker's flag, one pass over the packed bytes."""
    if family(proto) != "unary" or len(reports) == 0:
        return 0
    chk = plausibility_check(proto, alpha)
    r = np.ascontiguousarray(reports, dtype=np.uint8)
    return int(_count_outside(r.reshape(r.shape[0], -1), _POP8, chk.lo, chk.hi))


# ====================================================================== defense 2: co-supported itemsets
def support_matrix(proto: FrequencyProtocol, reports: np.ndarray) -> np.ndarray:
    """Boolean ``(n, k)``: which values each report supports (unary: its bits; local hashing:
    ``H_seed(v) == y``). Column sums are :meth:`support`'s counts."""
    fam = _family(proto)
    if fam == "unary":
        return np.unpackbits(np.asarray(reports, dtype=np.uint8), axis=1, count=proto.k,
                             bitorder="little").astype(bool)
    if fam == "hashing":
        return hash_matrix(proto, reports) == np.asarray(reports)["y"].astype(np.int64)[:, None]
    raise LDPError(f"{proto.name}: a direct report supports one value; no itemset to detect")


def hash_matrix(proto: FrequencyProtocol, reports: np.ndarray) -> np.ndarray:
    """``int64 (n, k)``: ``H_seed(v)`` of every local-hashing report's seed and every value."""
    p = _base(proto)
    if _family(p) != "hashing":
        raise LDPError(f"{proto.name} reports carry no hash seed")
    return np.stack([p.hash_values(reports, v) for v in range(proto.k)], axis=1)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ItemsetDetection:
    """The detected itemset (empty: nothing detected), its seeding pair's z and the reports that
    are dropped for it (``flagged``)."""

    itemset: tuple[int, ...]
    z: float
    flagged: np.ndarray = field(repr=False)


def _z_one_sided(alpha: float, tests: int) -> float:
    return -NormalDist().inv_cdf(alpha / max(tests, 1))


def _best_pair(z: np.ndarray, alpha: float) -> tuple[int, int, float] | None:
    k = z.shape[0]
    z = z.copy()
    z[np.tril_indices(k)] = -np.inf
    i, j = np.unravel_index(int(np.argmax(z)), z.shape)
    if z[i, j] <= _z_one_sided(alpha, k * (k - 1) // 2):
        return None
    return int(i), int(j), float(z[i, j])


def detect_itemset(x: np.ndarray, alpha: float = DEFAULT_ALPHA) -> ItemsetDetection:
    """Cao et al.'s "detecting fake users" on the support matrix ``x`` ``(n, k)`` of unary
    reports (module doc); ``flagged``: the reports that support the whole itemset.

    ``√n φ_ij`` is asymptotically standard normal for independent supports and has a negative mean
    for honest reports, so the one-sided Bonferroni thresholds (over the ``k (k−1)/2`` pairs, then
    over the ``k`` candidates of each growth step) keep a false alarm below ``alpha`` per call.
    """
    n, k = x.shape
    none = ItemsetDetection((), 0.0, np.zeros(n, dtype=bool))
    if n < 2 or k < 2:
        return none
    xf = x.astype(np.float32 if n < 1 << 24 else np.float64)  # float32 sums of 0/1 are exact below 2^24
    c = xf.sum(axis=0, dtype=np.float64)
    gam = c / n
    m = (xf.T @ xf).astype(np.float64)
    sd = np.sqrt(np.outer(gam * (1 - gam), gam * (1 - gam)))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, (m / n - np.outer(gam, gam)) / sd * np.sqrt(n), 0.0)
    seed = _best_pair(z, alpha)
    if seed is None:
        return none
    i, j, zbest = seed
    items = [i, j]
    rows = x[:, i] & x[:, j]
    thr = _z_one_sided(alpha, k)
    while len(items) < k:
        na = int(rows.sum())
        pa = na / n
        if na == 0 or na == n:
            break
        cnt = x[rows].sum(axis=0, dtype=np.float64)
        sdl = np.sqrt(pa * (1 - pa) * gam * (1 - gam))
        with np.errstate(divide="ignore", invalid="ignore"):
            zl = np.where(sdl > 0, (cnt / n - pa * gam) / sdl * np.sqrt(n), 0.0)
        zl[items] = -np.inf
        best = int(np.argmax(zl))
        if zl[best] <= thr:
            break
        items.append(best)
        rows &= x[:, best]
    return ItemsetDetection(tuple(sorted(items)), zbest, rows)


def itemset_estimate(counts: np.ndarray, n_kept: int, ps: float, qs: float, itemset: tuple[int, ...]) -> np.ndarray:
    """Unbiased frequencies from ``n_kept`` reports with support ``counts`` after dropping every
    report that supports the whole ``itemset`` S (``s = |S|``), when the kept reports follow the
    pure law ``(ps, qs)`` with independent supports (unary reports).

    An honest report supports all of S w.p. ``P_S = qs^s + u qs^(s−1)``, ``u = f_S (ps − qs)``;
    the kept reports support ``i ∈ S`` w.p. ``(qs + f_i (ps − qs) − P_S) / (1 − P_S)`` and
    ``i ∉ S`` w.p. ``(qs (1 − P_S) + f_i (ps − qs)(1 − qs^s)) / (1 − P_S)``. Summing the first
    over S gives ``u = (κ − s qs + (s − κ) qs^s) / (1 − (s − κ) qs^(s−1))``, ``κ = Σ_{i∈S} c_i / n_kept``,
    hence ``P_S``, the honest total ``n_kept / (1 − P_S)`` and every ``f_i`` in closed form.
    """
    c = np.asarray(counts, dtype=np.float64)
    s = len(itemset)
    if s == 0:
        return (c / n_kept - qs) / (ps - qs)
    idx = np.asarray(itemset, dtype=np.int64)
    kap = float(c[idx].sum() / n_kept)
    u = (kap - s * qs + (s - kap) * qs ** s) / (1.0 - (s - kap) * qs ** (s - 1))
    p_s = qs ** s + u * qs ** (s - 1)
    n_h = n_kept / (1.0 - p_s)
    f = (c / n_h - qs * (1.0 - p_s)) / ((ps - qs) * (1.0 - qs ** s))
    f[idx] = (c[idx] / n_h - qs + p_s) / (ps - qs)
    return f


#: random hash seeds of the Monte Carlo collision rates (a fixed public sample: results are reproducible)
COLLISION_SEEDS = 1 << 22
_RATES: dict[tuple[int, int], np.ndarray] = {}


@nb.njit(parallel=True, cache=True, nogil=True)
def _collision_counts(seeds, k, g):
    """``out[d] = #{seeds : H(0) = H(d)}`` for ``d < k``."""
    n = seeds.shape[0]
    gg = np.uint64(g)
    nchunks = min(64, n)
    part = np.zeros((nchunks, k), dtype=np.int64)
    step = (n + nchunks - 1) // nchunks
    for c in nb.prange(nchunks):
        for i in range(c * step, min(n, (c + 1) * step)):
            a, b = kernels.lh_coeffs(seeds[i])
            h0 = kernels.lh_hash(a, b, 0, gg)
            for d in range(1, k):
                if kernels.lh_hash(a, b, d, gg) == h0:
                    part[c, d] += 1
    return part.sum(axis=0)


@nb.njit(parallel=True, cache=True, nogil=True)
def _pair_collisions(h):
    """``K[i, j] = #{rows : h[row, i] == h[row, j]}`` for ``i < j``."""
    n, k = h.shape
    nchunks = min(16, max(n, 1))
    part = np.zeros((nchunks, k, k), dtype=np.int64)
    step = (n + nchunks - 1) // nchunks
    for c in nb.prange(nchunks):
        for r in range(c * step, min(n, (c + 1) * step)):
            for i in range(k):
                hi = h[r, i]
                for j in range(i + 1, k):
                    if h[r, j] == hi:
                        part[c, i, j] += 1
    return part.sum(axis=0)


def collision_rates(k: int, g: int) -> np.ndarray:
    """``ρ[d] = P_seed(H(v) = H(v + d))`` over uniformly random 32-bit seeds, ``d < k``, estimated
    on :data:`COLLISION_SEEDS` seeds (cached). With ``b`` uniform, ``(a v + b, a (v + d) + b)``
    depends on ``v`` only through ``d``, so one row of pairs gives every pair's rate."""
    key = (int(k), int(g))
    if key not in _RATES:
        seeds = np.random.default_rng(0x4C445053).integers(0, 1 << 32, COLLISION_SEEDS, dtype=np.uint32)
        _RATES[key] = _collision_counts(seeds, int(k), int(g)) / COLLISION_SEEDS
    return _RATES[key]


def detect_seed_itemset(proto: FrequencyProtocol, reports: np.ndarray,
                        alpha: float = DEFAULT_ALPHA) -> ItemsetDetection:
    """The fake-report detection of local hashing: MGA reports carry seeds under which the targets
    collide; honest seeds are uniform and independent of the values, so the number of reports whose
    seed makes ``i`` and ``j`` collide is ``Bin(n, ρ_ij)`` with ``ρ`` from :func:`collision_rates`
    (no frequency enters). If the pair of largest excess passes the one-sided Bonferroni threshold
    over the pairs, every report whose seed makes that pair collide is flagged: a selection on the
    seeds alone (about ``1/g`` of the honest reports), for which :func:`seed_conditional_estimate`
    stays unbiased.

    One round only: the project's multiply-add-shift hash family is pairwise but not 3-wise
    independent, so after a selection on one pair's collisions the other pairs' rates are no longer
    ``ρ``. (The same dependence correlates the supports of one honest report across values, which is
    why the co-support test of unary reports does not carry over; and a seed whose multiplier is
    small maps every value to one bucket, which is mostly what a search for seeds under which the
    targets collide finds.)
    """
    n, k = len(reports), proto.k
    none = ItemsetDetection((), 0.0, np.zeros(n, dtype=bool))
    if n < 2:
        return none
    h = hash_matrix(proto, reports)
    g = int(_base(proto).g)  # type: ignore[attr-defined]
    rho = collision_rates(k, g)[np.abs(np.subtract.outer(np.arange(k), np.arange(k)))]
    counts = _pair_collisions(h).astype(np.float64)
    var = n * rho * (1 - rho) * (1.0 + n / COLLISION_SEEDS)  # binomial + the Monte Carlo error of ρ
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, (counts - n * rho) / np.sqrt(var), 0.0)
    pair = _best_pair(np.triu(z, 1), alpha)
    if pair is None:
        return none
    i, j, zij = pair
    return ItemsetDetection((i, j), zij, h[:, i] == h[:, j])


def seed_conditional_estimate(proto: FrequencyProtocol, reports: np.ndarray) -> np.ndarray:
    """Unbiased frequencies from local-hashing reports *given their seeds*, whatever selection
    on the seeds kept them: a report whose seed makes ``v`` and its value ``x`` collide supports
    ``v`` w.p. ``p``, otherwise w.p. ``q = (1 − p)/(g − 1)``, so ``E[c] = n q + (p − q) C f`` with
    ``C[v, x]`` the number of reports whose seed makes ``v`` and ``x`` collide (``C[v, v] = n``);
    the estimate solves that ``k × k`` system. Without selection ``C ≈ n (1/g + (1 − 1/g) I)`` and it
    is the protocol's estimator; after :func:`detect_seed_itemset` dropped the reports whose seed
    makes a pair collide, the protocol's estimator is biased (the kept seeds never make that pair
    collide) and this one is not."""
    p = _base(proto)
    if _family(p) != "hashing":
        raise LDPError(f"{proto.name} reports carry no hash seed")
    n, k, g = len(reports), proto.k, int(p.g)  # type: ignore[attr-defined]
    pr = float(p.p)  # type: ignore[attr-defined]
    q = (1.0 - pr) / (g - 1)
    upper = _pair_collisions(hash_matrix(p, reports)).astype(np.float64)
    c_mat = upper + upper.T + n * np.eye(k)
    counts = p.support(reports).astype(np.float64)
    return np.linalg.solve((pr - q) * c_mat, counts - n * q)


# ====================================================================== defense 3: the per-step statistic
def detection_score(proto: FrequencyProtocol, counts: np.ndarray, n: int) -> float | None:
    """z-score of the step's total support ``Σ_v c_v`` against its honest law (module doc), from
    the support counts and ``n`` alone; ``None`` where it carries no information or has no exact
    law: GRR (the total is ``n``), local hashing (module doc) and the protocols not modelled."""
    if family(proto) != "unary" or n <= 0:
        return None
    ps, qs = honest_law(proto)
    k = proto.k
    mean = ps + (k - 1) * qs
    var = ps * (1 - ps) + (k - 1) * qs * (1 - qs)
    total = float(np.asarray(counts, dtype=np.float64).sum())
    return (total - n * mean) / float(np.sqrt(n * var))


def detection_threshold(alpha: float = DEFAULT_ALPHA) -> float:
    """``|z|`` above which :func:`detection_score` flags a step (two-sided normal tail ``alpha``)."""
    return -NormalDist().inv_cdf(alpha / 2)


# ====================================================================== all defenses of a protocol
@dataclass(frozen=True)
class Defended:
    """The estimate after every defense that applies to the protocol, and what they did."""

    estimate: np.ndarray
    received: int
    dropped_implausible: int
    itemset: tuple[int, ...]
    dropped_itemset: int
    kept: np.ndarray = field(repr=False)

    @property
    def dropped(self) -> int:
        return self.dropped_implausible + self.dropped_itemset


def defend(proto: FrequencyProtocol, reports: np.ndarray, alpha: float = DEFAULT_ALPHA) -> Defended:
    """Apply the report-level defenses that are sound for the protocol and estimate over what they
    keep: unary: the size check (1), then the co-support itemset (2) with the compensated estimator;
    local hashing: the seed-collision itemset (2); GRR: nothing. Unbiased for honest data (exactly for
    each defense alone; after both unary ones, up to the ``O(alpha)`` dependence the size check
    leaves between the bits)."""
    fam = _family(proto)
    n = len(reports)
    if fam == "direct":
        return Defended(proto.estimate(proto.support(reports), n), n, 0, (), 0, np.ones(n, dtype=bool))
    if fam == "hashing":
        det = detect_seed_itemset(proto, reports, alpha)
        keep = ~det.flagged
        if not keep.any():
            raise LDPError("every report was dropped by the defenses")
        est = (seed_conditional_estimate(proto, reports[keep]) if det.itemset
               else proto.estimate(proto.support(reports), n))
        return Defended(est, n, 0, det.itemset, int(det.flagged.sum()), keep)
    chk = plausibility_check(proto, alpha)
    ok = ~implausible(proto, reports, alpha)
    x = support_matrix(proto, reports[ok])
    det = detect_itemset(x, alpha)
    keep = ~det.flagged
    n_kept = int(keep.sum())
    if n_kept == 0:
        raise LDPError("every report was dropped by the defenses")
    est = itemset_estimate(x[keep].sum(axis=0), n_kept, chk.kept_ps, chk.kept_qs, det.itemset)
    kept = np.zeros(n, dtype=bool)
    kept[np.flatnonzero(ok)[keep]] = True
    return Defended(est, n, int(n - ok.sum()), det.itemset, int(det.flagged.sum()), kept)
