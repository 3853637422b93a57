"""Empirical privacy audit of a protocol's ε, round by round (in the spirit of LDP-Audit).

LDP-Audit (Arcolezi & Gambs, PETS 2024) checks an LDP implementation from the outside: run the
randomizer many times on two inputs ``v1 != v2``, count how often a *distinguishing event* ``E``
happens under each, and turn the counts into a statistical lower bound on ε. ε-LDP requires
``P(E | v1) <= e^ε P(E | v2)`` for every event, so a lower bound above the claimed ε is a proof
(at the chosen confidence) that the implementation leaks more than it states.

Three rounds are audited (``round=``, :data:`ROUNDS`):

``"first"`` (ε1, the default of :func:`audit`)
    One report per device: ``trials`` reports with input ``v1`` and ``trials`` with ``v2``; a
    memoizing protocol gets a NEW device for every trial (fresh memo keys). ``E`` is the
    protocol's ``audit_event(reports, v1, v2)``; the theoretical value is ``proto.eps_first``.
``"prr"`` (ε∞)
    Memoizing protocols only: the memoized first round alone, RAPPOR's permanent randomized
    response (PRR; Erlingsson, Pihur & Korolova, CCS 2014), from ``proto.memoized_outputs`` on a
    fresh device per trial, without the instantaneous round (IRR). ``E`` is
    ``proto.memoized_audit_event``; the theoretical value is ``proto.eps_inf``.
``"longitudinal"`` (published longitudinal bound after ``τ`` reports)
    Memoizing protocols only: every trial is a fresh device that reports ``τ`` times, the inputs
    following ``seq1`` (resp. ``seq2``), two sequences of the same length ``τ``. Events on the
    whole sequence of reports (and the public fields they carry):

    * vote events: with per-report events ``e(r, a, b)`` = ``audit_event(r, a, b)``, the device's
      score ``S = sum_t e(r_t, seq1_t, seq2_t) - e(r_t, seq2_t, seq1_t)`` over the steps where the
      sequences differ is a vote that averages the IRR noise away and so estimates the memoized
      PRR outputs (for L-GRR, the count of reports equal to v1 minus those equal to v2; for UE
      chains, the ones of bit v1 minus the ones of bit v2); events ``E_c = {S >= c}``,
      ``c = 1 .. L`` (``L`` differing steps);
    * seed-aware events (protocols whose memo cell of a value is read from public report fields,
      ``proto.public_cells``: LOLOHA's hash seed, dBitFlipPM's sampled buckets; sequences with at
      least two distinct values): conditioning on the seed, the server knows which value groups
      share a memo cell under ``seq1`` and under ``seq2``. Where a pair of groups is merged under
      one and split under the other (same value pattern, different cell pattern), the reports of
      the two groups' steps agree more under the merged sequence (LOLOHA: one PRR behind both;
      dBitFlipPM, no IRR: identical reports). Events ``{split under seq1, disagreeing report
      pairs >= c}`` and ``{merged under seq1, agreeing pairs >= c}`` (at most
      :data:`SEED_THRESHOLDS` thresholds each, see :func:`_seed_scores`).

    All events are tested with the Bonferroni correction below. The claim is the PUBLISHED figure
    ``proto.longitudinal_bound(τ)`` (what ``/status`` and the estimate documents state as
    ``eps_longitudinal_worst`` after ``τ`` steps): ``min(τ, memo_size) ε∞`` for L-GRR and the UE
    chains, ``τ ε_IRR`` for LOLOHA, ``inf`` for dBitFlipPM unless ``b = k`` and ``d >= b - 1``
    (docs/privacy.md, "Limit of the accounted longitudinal ε"). The result also carries the
    ACCOUNTED longitudinal ε of the pair, ``eps_accounted = max(proto.longitudinal_loss(m1),
    proto.longitudinal_loss(m2))`` with ``mi`` the largest number of distinct memoized inputs of a
    device after ``seqi``, read from the memo states (Arcolezi, Palamidessi, Pinzón & Gambs, EDBT
    2023, Def. 3.2 and Eq. 8): for LOLOHA and dBitFlipPM the seed-aware events exceed it on the
    switching pairs of :func:`longitudinal_pairs` (tests/test_audit.py), which is why it is not
    the claim. Constant sequences ``(v1, ..., v1)`` vs ``(v2, ..., v2)`` memoize one input and for
    a GRR chain the vote recovers nearly all of ε∞ once ``τ`` is ~16.
    The two sequences must repeat values at the same steps: memoization reveals whether an input
    repeats (the same memoized response comes back).

With hit counts ``c1``, ``c2`` out of ``n = trials`` each:

* point estimate ``ε̂ = ln(p̂1 / p̂2)`` with ``p̂i = ci / n``, and its two-sided interval
  ``[ln(L1/U2), ln(U1/L2)]`` from two-sided Clopper-Pearson intervals at level ``1 - α/2`` each;
* lower bound (one-sided, confidence ``1 - α``): the maximum of
  ``ln(CP_lower(c1) / CP_upper(c2))`` (event ``E``) and ``ln(CP_lower(n - c2) / CP_upper(n - c1))``
  (the complement ``¬E`` with the roles of ``v1`` and ``v2`` swapped, since ε-LDP also bounds
  ``P(¬E | v2) / P(¬E | v1)``). The two bounds rest on four one-sided Clopper-Pearson
  statements, each made at level ``α/4`` (Bonferroni), so the maximum is a valid lower bound
  with probability ``>= 1 - α``. With ``m`` events (the longitudinal thresholds) each of the
  ``4 m`` statements is made at ``α / (4 m)``. ε >= 0 for every mechanism, so the bound is
  floored at 0. For several events ``ε̂`` and its interval are those of the event with the
  largest lower bound (selected after the fact: informative, not a confidence statement).

The numeric mechanisms (:mod:`estimators.numeric`) are audited by :mod:`estimators.numeric.audit` with these
statistics and this result type: events on a discretization of their output, chosen from the exact output law,
in the first and PRR rounds.

Default trial counts (:data:`DEFAULT_TRIALS`): 1 000 000 reports per input for the first and PRR
rounds, 200 000 devices per sequence for the longitudinal round (``τ = 16`` reports each, 3.2
million reports per sequence); ``ldp audit`` with these defaults runs all three rounds over
every default case in about 30 s on 2 cores. Reports are drawn in chunks (default 200 000 per
chunk) so a million trials of a k = 1024 unary protocol never hold more than one chunk of
reports and memo state in memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .base import FrequencyProtocol
from .errors import LDPError
from .registry import parameters

ProgressCallback = Callable[[int, int], None]

DEFAULT_CHUNK = 200_000
CHUNK_BYTES = 64 << 20  # memory budget of one chunk's reports + memo state (SHE at k = 1024: up to 4 KiB a report)
_SLACK = 1e-9  # float slack of ``passed``: ε computed in float64 vs a bound that can meet it exactly


# ---------------------------------------------------------------- Clopper-Pearson
def _check_binomial(c: int, n: int) -> tuple[int, int]:
    if int(n) != n or n < 1:
        raise LDPError(f"n must be a positive integer, got {n}")
    if int(c) != c or not 0 <= c <= n:
        raise LDPError(f"count must be an integer in [0, {n}], got {c}")
    return int(c), int(n)


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise LDPError(f"alpha must lie in (0, 1), got {alpha}")
    return alpha


def cp_lower(c: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound: ``P(p >= L) >= 1 - alpha``; ``L`` = Beta(c, n-c+1) α-quantile."""
    c, n = _check_binomial(c, n)
    alpha = _check_alpha(alpha)
    from scipy.stats import beta as _beta  # scipy loads on first use

    return 0.0 if c == 0 else float(_beta.ppf(alpha, c, n - c + 1))


def cp_upper(c: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound: ``P(p <= U) >= 1 - alpha``; ``U`` = Beta(c+1, n-c) (1-α)-quantile."""
    c, n = _check_binomial(c, n)
    alpha = _check_alpha(alpha)
    from scipy.stats import beta as _beta

    return 1.0 if c == n else float(_beta.isf(alpha, c + 1, n - c))


def clopper_pearson(c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of a binomial proportion at level ``confidence``."""
    alpha = 1.0 - _check_confidence(confidence)
    return cp_lower(c, n, alpha / 2), cp_upper(c, n, alpha / 2)


def _check_confidence(confidence: float) -> float:
    confidence = float(confidence)
    if not 0.0 < confidence < 1.0:
        raise LDPError(f"confidence must lie in (0, 1), got {confidence}")
    return confidence


def _log_ratio(a: float, b: float) -> float:
    """``ln(a / b)`` for probabilities, with the limits ``-inf`` (a = 0) and ``+inf`` (b = 0)."""
    if a <= 0.0:
        return -math.inf if b > 0.0 else math.nan
    if b <= 0.0:
        return math.inf
    return math.log(a / b)


def eps_point_estimate(c1: int, c2: int, n: int) -> float:
    """``ε̂ = ln(p̂1 / p̂2)`` (``inf`` if the event never happened under v2, ``nan`` if never at all)."""
    return _log_ratio(c1 / n, c2 / n)


def eps_interval(c1: int, c2: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided interval of ``ln(p1/p2)``: each ``pi`` in its two-sided CP interval at ``1 - α/2``."""
    alpha = 1.0 - _check_confidence(confidence)
    l1, u1 = clopper_pearson(c1, n, 1.0 - alpha / 2)
    l2, u2 = clopper_pearson(c2, n, 1.0 - alpha / 2)
    return _log_ratio(l1, u2), _log_ratio(u1, l2)


def eps_lower_bound(c1: int, c2: int, n: int, confidence: float = 0.95, complement: bool = True) -> float:
    """One-sided lower bound on ε at level ``confidence`` (Bonferroni over the bounds tested).

    ``E``: ``ln(CP_lower(c1) / CP_upper(c2))``; with ``complement`` also ``¬E`` with roles swapped:
    ``ln(CP_lower(n - c2) / CP_upper(n - c1))``. Each of the ``2 m`` one-sided CP statements
    (``m`` = number of events) is made at ``α / (2 m)``; the result is the largest bound, floored at 0.
    """
    return eps_lower_bound_events([c1], [c2], n, confidence, complement)[0]


def eps_lower_bound_events(c1: list[int], c2: list[int], n: int, confidence: float = 0.95,
                           complement: bool = True) -> tuple[float, int]:
    """:func:`eps_lower_bound` over several events ``E_i`` with hit counts ``c1[i]``, ``c2[i]``.

    Every event (and with ``complement`` its complement, roles swapped) is tested, each of the
    ``2 m`` one-sided CP statements (``m`` = number of events tested) at ``α / (2 m)``, so the
    largest bound holds with probability ``>= 1 - α``. Returns ``(bound floored at 0, index of
    the event it came from)`` (index 0 when no event gives a positive bound).
    """
    alpha = 1.0 - _check_confidence(confidence)
    if len(c1) != len(c2) or not len(c1):
        raise LDPError(f"need the same positive number of counts under both inputs, got {len(c1)} and {len(c2)}")
    for a, b in zip(c1, c2):
        _check_binomial(a, n)
        _check_binomial(b, n)
    events = [(i, hi, lo) for i, (a, b) in enumerate(zip(c1, c2))
              for hi, lo in [(a, b)] + ([(n - b, n - a)] if complement else [])]
    a = alpha / (2 * len(events))
    best, where = 0.0, 0
    for i, hi, lo in events:
        bound = _log_ratio(cp_lower(hi, n, a), cp_upper(lo, n, a))
        if not math.isnan(bound) and bound > best:
            best, where = bound, i
    return best, where


# ---------------------------------------------------------------- the audit
ROUNDS: tuple[str, ...] = ("first", "prr", "longitudinal")
DEFAULT_TAU = 16  # reports per device in the longitudinal round
#: default trials per round: reports per input (first, PRR), devices per sequence (longitudinal)
DEFAULT_TRIALS: dict[str, int] = {"first": 1_000_000, "prr": 1_000_000, "longitudinal": 200_000}
_THEORY = {"first": "ε1", "prr": "ε∞", "longitudinal": "accounted ε"}


@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit: hit counts, ε̂ with its interval, the lower bound and the claimed ε.

    ``eps_theory`` is the claim the round tests: ``eps_first`` (round ``"first"``), ``eps_inf``
    (``"prr"``) or the accounted longitudinal ε of the sequence pair (``"longitudinal"``).
    For the longitudinal round ``trials`` counts devices per sequence, ``seq1``/``seq2`` are the
    input sequences, ``memoized`` the largest number of memoized inputs of a device after each
    and ``event`` the event whose counts are reported (``"S>=c"``).
    """

    protocol: str
    params: dict
    v1: int
    v2: int
    trials: int
    confidence: float
    hits1: int
    hits2: int
    eps_hat: float
    eps_hat_ci: tuple[float, float]
    eps_lower: float
    eps_theory: float
    round: str = "first"
    seq1: tuple[int, ...] = ()
    seq2: tuple[int, ...] = ()
    memoized: tuple[int, int] = (0, 0)
    event: str = ""
    eps_accounted: float = math.nan

    @property
    def passed(self) -> bool:
        """No evidence of a leak: the lower bound does not exceed the claimed ε."""
        return self.eps_lower <= self.eps_theory + _SLACK

    @property
    def tightness(self) -> float:
        """``eps_lower / eps_theory`` (1 = the audit certifies the full claimed ε; 0 against an
        unbounded claim)."""
        return self.eps_lower / self.eps_theory if self.eps_theory > 0 else math.nan

    @property
    def accounted_label(self) -> str:
        """``L(m)``: the accounted longitudinal loss of ``m`` memoized inputs (longitudinal round), else ``""``."""
        return f"L(m={max(self.memoized)})" if self.round == "longitudinal" else ""

    @property
    def theory_label(self) -> str:
        """Which ε ``eps_theory`` is: ``ε1``, ``ε∞`` or ``B(τ)`` (the published longitudinal bound
        after ``τ`` reports, ``proto.longitudinal_bound(τ)``)."""
        if self.round == "longitudinal":
            return f"B(τ={len(self.seq1)})"
        return _THEORY.get(self.round, self.round)

    @property
    def p1_hat(self) -> float:
        return self.hits1 / self.trials

    @property
    def p2_hat(self) -> float:
        return self.hits2 / self.trials


def _check_input(proto: FrequencyProtocol, v: int, name: str) -> int:
    if isinstance(v, (bool, np.bool_)) or int(v) != v or not 0 <= v < proto.k:
        raise LDPError(f"{name} must be an integer value in [0, {proto.k}), got {v!r}")
    return int(v)


def _bytes_per_trial(proto: FrequencyProtocol) -> int:
    """Bytes of one report plus one device's memo state (key and ``seen`` bitset)."""
    one = proto.new_state(1) if proto.memo_size else None  # measured: the key format is the state's business
    memo = one.keys.nbytes + one.seen.nbytes if one is not None else 0
    return max(1, proto.report_nbytes + memo)


def has_memoized_outputs(proto: FrequencyProtocol) -> bool:
    """Whether ``proto`` memoizes and implements :meth:`~estimators.base.FrequencyProtocol.memoized_outputs`."""
    return proto.memo_size > 0 and type(proto).memoized_outputs is not FrequencyProtocol.memoized_outputs


def _check_round(round: str) -> str:
    if round not in ROUNDS:
        raise LDPError(f"round must be one of {', '.join(ROUNDS)}, got {round!r}")
    return round


def _check_event(proto: FrequencyProtocol, event: np.ndarray, m: int, hook: str) -> np.ndarray:
    event = np.asarray(event)
    if event.shape != (m,):
        raise LDPError(f"{proto.name}.{hook} must return a boolean array of shape ({m},), "
                       f"got {event.dtype} {event.shape}")
    return event


def audit(proto: FrequencyProtocol, v1: int = 0, v2: int = 1, trials: int | None = None, seed: int = 0,
          confidence: float = 0.95, on_progress: ProgressCallback | None = None,
          chunk: int = DEFAULT_CHUNK, round: str = "first", tau: int = DEFAULT_TAU,
          seq1: Sequence[int] | None = None, seq2: Sequence[int] | None = None) -> AuditResult:
    """Audit one round of ``proto`` on inputs ``v1`` and ``v2`` (see the module docstring).

    * ``round="first"``: ``trials`` single reports of ``v1`` and of ``v2`` against ``eps_first``;
      memoizing protocols get a new device (fresh memo key) per trial.
    * ``round="prr"``: ``trials`` memoized PRR outputs (``memoized_outputs``, fresh device per
      trial) of each input against ``eps_inf``.
    * ``round="longitudinal"``: ``trials`` devices per sequence, each reporting ``seq1``
      (resp. ``seq2``), by default ``(v1,) * tau`` and ``(v2,) * tau``; against the accounted
      longitudinal ε (see :func:`audit_longitudinal`).

    ``trials=None`` takes :data:`DEFAULT_TRIALS` of the round. Reports are drawn in chunks of at
    most ``chunk`` rows, fewer when one chunk of reports and memo state would exceed
    :data:`CHUNK_BYTES`. ``on_progress(done, total)`` is called after every chunk (every step of
    a chunk in the longitudinal round) with the number of reports drawn so far.
    """
    round = _check_round(round)
    if round == "longitudinal":
        if (seq1 is None) != (seq2 is None):
            raise LDPError("pass both seq1 and seq2, or neither")
        if seq1 is None:
            tau = _check_positive("tau", tau)
            seq1, seq2 = (_check_input(proto, v1, "v1"),) * tau, (_check_input(proto, v2, "v2"),) * tau
        return audit_longitudinal(proto, seq1, seq2, trials, seed, confidence, on_progress, chunk)
    if seq1 is not None or seq2 is not None:
        raise LDPError(f"seq1 and seq2 are inputs of the longitudinal round, not of the {round!r} round")
    v1 = _check_input(proto, v1, "v1")
    v2 = _check_input(proto, v2, "v2")
    if v1 == v2:
        raise LDPError(f"v1 and v2 must differ, got {v1} twice")
    trials = _check_positive("trials", DEFAULT_TRIALS[round] if trials is None else trials)
    chunk = _check_positive("chunk", chunk)
    confidence = _check_confidence(confidence)

    memoizing = proto.memo_size > 0
    if round == "prr" and not has_memoized_outputs(proto):
        raise LDPError(f"{proto.name} has no memoized first round to audit (the PRR round needs a "
                       "memoizing protocol with memoized_outputs)")
    chunk = min(chunk, max(1024, CHUNK_BYTES // _bytes_per_trial(proto)))
    total, done = 2 * trials, 0
    hits = []
    for ss in np.random.SeedSequence(seed).spawn(2):  # one independent stream per input
        rng = np.random.default_rng(ss)
        v = v1 if not hits else v2
        count, left = 0, trials
        while left:
            m = min(chunk, left)
            values = np.full(m, v, dtype=np.int64)
            if round == "prr":  # the memoized output alone, a fresh device per trial
                prr = proto.memoized_outputs(values, proto.new_state(m, rng=rng))
                event = _check_event(proto, proto.memoized_audit_event(prr, v1, v2), m, "memoized_audit_event")
            else:
                state = proto.new_state(m, rng=rng) if memoizing else None
                reports = proto.randomize(values, rng, state=state)
                event = _check_event(proto, proto.audit_event(reports, v1, v2), m, "audit_event")
            count += int(np.count_nonzero(event))
            left -= m
            done += m
            if on_progress is not None:
                on_progress(done, total)
        hits.append(count)

    c1, c2 = hits
    return AuditResult(
        protocol=proto.name, params=proto.params(), v1=v1, v2=v2, trials=trials, confidence=confidence,
        hits1=c1, hits2=c2,
        eps_hat=eps_point_estimate(c1, c2, trials),
        eps_hat_ci=eps_interval(c1, c2, trials, confidence),
        eps_lower=eps_lower_bound(c1, c2, trials, confidence),
        eps_theory=float(proto.eps_first if round == "first" else proto.eps_inf),
        round=round,
    )


def _check_positive(name: str, x: int) -> int:
    if isinstance(x, bool) or int(x) != x or x < 1:
        raise LDPError(f"{name} must be a positive integer, got {x}")
    return int(x)


def _pattern(seq: tuple[int, ...]) -> tuple[int, ...]:
    """The equality pattern of a sequence: each step's index of the first step with the same value."""
    first: dict[int, int] = {}
    return tuple(first.setdefault(v, t) for t, v in enumerate(seq))


Seq = tuple[int, ...]


def _check_sequences(proto: FrequencyProtocol, seq1: Sequence[int], seq2: Sequence[int]) -> tuple[Seq, Seq]:
    s1 = tuple(_check_input(proto, v, "seq1 values") for v in seq1)
    s2 = tuple(_check_input(proto, v, "seq2 values") for v in seq2)
    if not s1 or len(s1) != len(s2):
        raise LDPError(f"seq1 and seq2 must be non-empty and of the same length, got {len(s1)} and {len(s2)}")
    if s1 == s2:
        raise LDPError("seq1 and seq2 must differ at some step")
    if _pattern(s1) != _pattern(s2):
        raise LDPError("seq1 and seq2 must change value at the same steps (seq1[t] == seq1[u] exactly when "
                       "seq2[t] == seq2[u]): memoization reveals whether a device's input repeats, so the "
                       "accounted loss of memoized inputs does not bound sequences that differ in that")
    return s1, s2


def _groups(seq: Seq) -> list[list[int]]:
    """The steps of each distinct value of ``seq``, in order of first appearance."""
    where: dict[int, list[int]] = {}
    for t, v in enumerate(seq):
        where.setdefault(v, []).append(t)
    return list(where.values())


def _same_report(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise equality of two report arrays (structured 1-d, or ``(n, d)``)."""
    eq = np.asarray(a == b)
    return eq.all(axis=tuple(range(1, eq.ndim))) if eq.ndim > 1 else eq


#: thresholds of each seed-aware event family (fewer events, less Bonferroni cost)
SEED_THRESHOLDS = 16


def _seed_thresholds(pmax: int) -> list[int]:
    """At most :data:`SEED_THRESHOLDS` thresholds spread over ``1 .. pmax``."""
    return sorted({max(1, math.ceil(pmax * i / SEED_THRESHOLDS)) for i in range(1, SEED_THRESHOLDS + 1)})


def _seed_scores(proto: FrequencyProtocol, reps: list[np.ndarray], groups: list[list[int]],
                 vals1: list[int], vals2: list[int], pmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Seed-aware scores of one chunk of devices: ``(orientation, score)``, ``int64 (m,)`` each.

    From the public part of the reports (``proto.public_cells``: LOLOHA's hash seed, dBitFlipPM's
    sampled buckets) the server knows, for each device, which value groups share a memo cell
    under ``seq1`` and under ``seq2``. The first pair of groups ``(i, j)`` merged under one
    sequence and split under the other is the witness: orientation ``+1`` when split under
    ``seq1`` (score = disagreeing report pairs between the groups' steps), ``-1`` when merged
    under ``seq1`` (score = agreeing pairs), ``0`` without a witness. Both are larger under
    ``seq1``; the orientation depends on the seed alone, whose law is the same under both."""
    m = reps[0].shape[0]
    cells1 = [proto.public_cells(reps[0], v) for v in vals1]
    cells2 = [proto.public_cells(reps[0], v) for v in vals2]
    orient = np.zeros(m, dtype=np.int64)
    score = np.zeros(m, dtype=np.int64)
    for i in range(len(groups)):
        for j in range(i + 1, len(groups)):
            m1, m2 = cells1[i] == cells1[j], cells2[i] == cells2[j]
            sel = np.flatnonzero((orient == 0) & (m1 != m2))
            if not sel.size:
                continue
            orient[sel] = np.where(m1[sel], -1, 1)
            agree = np.zeros(sel.size, dtype=np.int64)
            for t in groups[i]:
                for u in groups[j]:
                    agree += _same_report(reps[t][sel], reps[u][sel])
            pairs = len(groups[i]) * len(groups[j])
            # scale to [0, pmax] so that every witness pair uses the same thresholds
            raw = np.where(orient[sel] == 1, pairs - agree, agree)
            score[sel] = (raw * pmax) // pairs
    return orient, score


def audit_longitudinal(proto: FrequencyProtocol, seq1: Sequence[int], seq2: Sequence[int],
                       trials: int | None = None, seed: int = 0, confidence: float = 0.95,
                       on_progress: ProgressCallback | None = None, chunk: int = DEFAULT_CHUNK) -> AuditResult:
    """Longitudinal audit: ``trials`` fresh devices report ``seq1`` (resp. ``seq2``) step by step.

    Vote events: device score ``S = sum_t e(r_t, seq1_t, seq2_t) - e(r_t, seq2_t, seq1_t)`` over
    the ``L`` steps where the sequences differ (``e`` = ``proto.audit_event``); events
    ``{S >= c}``, ``c = 1 .. L``. Seed-aware events (protocols whose memo cells depend on public
    report fields, ``proto.public_cells``: LOLOHA, dBitFlipPM; sequences with at least two
    distinct values): see :func:`_seed_scores`, events ``{orientation = ±1, score >= c}``.
    Bonferroni over all of them (:func:`eps_lower_bound_events`). The claim is the published
    ``proto.longitudinal_bound(τ)`` over the ``τ`` steps (``eps_accounted`` keeps
    ``max_i proto.longitudinal_loss(max memoized inputs of a device after seq_i)``, read from the
    memo states, Arcolezi et al., EDBT 2023, Eq. 8).
    ``on_progress(done, total)`` counts reports, ``total = 2 * trials * len(seq1)``.
    """
    if proto.memo_size <= 0:
        raise LDPError(f"{proto.name} does not memoize: its longitudinal loss is unbounded and the "
                       "longitudinal round does not apply")
    s1, s2 = _check_sequences(proto, seq1, seq2)
    trials = _check_positive("trials", DEFAULT_TRIALS["longitudinal"] if trials is None else trials)
    chunk = _check_positive("chunk", chunk)
    confidence = _check_confidence(confidence)
    tau = len(s1)
    diff = [t for t in range(tau) if s1[t] != s2[t]]
    L = len(diff)
    groups = _groups(s1)
    vals1, vals2 = [s1[g[0]] for g in groups], [s2[g[0]] for g in groups]
    seed_aware = len(groups) >= 2 and type(proto).public_cells is not FrequencyProtocol.public_cells
    per_trial = _bytes_per_trial(proto) + 8 + (tau * proto.report_nbytes if seed_aware else 0)
    chunk = min(chunk, max(1024, CHUNK_BYTES // per_trial))
    pmax = max(len(a) * len(b) for a in groups for b in groups) if seed_aware else 0
    thresholds = _seed_thresholds(pmax) if seed_aware else []

    total, done = 2 * trials * tau, 0
    hist = [np.zeros(2 * L + 1, dtype=np.int64), np.zeros(2 * L + 1, dtype=np.int64)]
    shist = [{o: np.zeros(pmax + 1, dtype=np.int64) for o in (1, -1)} for _ in range(2)]
    memoized = [0, 0]
    for side, ss in enumerate(np.random.SeedSequence(seed).spawn(2)):  # one stream per sequence
        rng = np.random.default_rng(ss)
        seq = (s1, s2)[side]
        left = trials
        while left:
            m = min(chunk, left)
            state = proto.new_state(m, rng=rng)  # fresh devices
            score = np.zeros(m, dtype=np.int64)
            reps: list[np.ndarray] = []
            for t, v in enumerate(seq):
                reports = proto.randomize(np.full(m, v, dtype=np.int64), rng, state=state)
                if seed_aware:
                    reps.append(reports)
                if s1[t] != s2[t]:
                    score += _check_event(proto, proto.audit_event(reports, s1[t], s2[t]), m, "audit_event")
                    score -= _check_event(proto, proto.audit_event(reports, s2[t], s1[t]), m, "audit_event")
                done += m
                if on_progress is not None:
                    on_progress(done, total)
            hist[side] += np.bincount(score + L, minlength=2 * L + 1)
            if seed_aware:
                orient, sscore = _seed_scores(proto, reps, groups, vals1, vals2, pmax)
                for o in (1, -1):
                    shist[side][o] += np.bincount(sscore[orient == o], minlength=pmax + 1)
            memoized[side] = max(memoized[side], int(np.max(proto.memoized_counts(state))))
            left -= m

    # hits of E_c = {S >= c}: tail sums of the score histograms, c = 1 .. L
    tails = [np.cumsum(h[::-1])[::-1] for h in hist]
    c1 = [int(tails[0][c + L]) for c in range(1, L + 1)]
    c2 = [int(tails[1][c + L]) for c in range(1, L + 1)]
    names = [f"S>={c}" for c in range(1, L + 1)]
    for o, label in ((1, "seed:split-differ"), (-1, "seed:merged-agree")):
        stails = [np.cumsum(h[o][::-1])[::-1] for h in shist]
        c1 += [int(stails[0][c]) for c in thresholds]
        c2 += [int(stails[1][c]) for c in thresholds]
        names += [f"{label}>={c}/{pmax}" for c in thresholds]
    lower, i = eps_lower_bound_events(c1, c2, trials, confidence)
    accounted = max(float(proto.longitudinal_loss(memoized[0])), float(proto.longitudinal_loss(memoized[1])))
    return AuditResult(
        protocol=proto.name, params=proto.params(), v1=s1[diff[0]], v2=s2[diff[0]], trials=trials,
        confidence=confidence, hits1=c1[i], hits2=c2[i],
        eps_hat=eps_point_estimate(c1[i], c2[i], trials),
        eps_hat_ci=eps_interval(c1[i], c2[i], trials, confidence),
        eps_lower=lower, eps_theory=float(proto.longitudinal_bound(tau)),
        round="longitudinal", seq1=s1, seq2=s2, memoized=(memoized[0], memoized[1]), event=names[i],
        eps_accounted=accounted,
    )


def longitudinal_pairs(k: int, v1: int = 0, v2: int = 1, tau: int = DEFAULT_TAU) -> list[tuple[Seq, Seq]]:
    """The default sequence pairs of the longitudinal round for a domain of size ``k``.

    * constant: ``(v1,) * tau`` vs ``(v2,) * tau``: one memoized input each, accounted ε = ε∞
      (the vote over ``tau`` reports recovers the PRR, so the bound approaches ε∞);
    * switching (``k >= 4``, ``tau >= 2``): ``v1`` then ``a`` vs ``v2`` then ``b``, half of the
      steps each, with ``a``, ``b`` the two smallest values other than ``v1``, ``v2``: two memoized
      inputs each (fewer for a device whose hash or bucket collides), accounted ``2 ε∞``
      (``min(2, d + 1) ε∞`` for dBitFlipPM).
    """
    tau = _check_positive("tau", tau)
    pairs = [((v1,) * tau, (v2,) * tau)]
    if k >= 4 and tau >= 2:
        a, b = [v for v in range(k) if v not in (v1, v2)][:2]
        h = tau // 2
        pairs.append(((v1,) * h + (a,) * (tau - h), (v2,) * h + (b,) * (tau - h)))
    return pairs


@dataclass(frozen=True)
class AuditJob:
    """One audit to run: a protocol, a round and its inputs (values, or sequences for the
    longitudinal round)."""

    name: str
    proto: FrequencyProtocol
    round: str
    v1: int = 0
    v2: int = 1
    seq1: tuple[int, ...] | None = None
    seq2: tuple[int, ...] | None = None

    def reports(self, trials: int | None = None) -> int:
        """Reports the job draws with ``trials`` (default: the round's)."""
        n = DEFAULT_TRIALS[self.round] if trials is None else trials
        return 2 * n * (len(self.seq1) if self.seq1 else 1)

    def run(self, trials: int | None = None, seed: int = 0, confidence: float = 0.95,
            on_progress: ProgressCallback | None = None) -> AuditResult:
        return audit(self.proto, self.v1, self.v2, trials=trials, seed=seed, confidence=confidence,
                     on_progress=on_progress, round=self.round, seq1=self.seq1, seq2=self.seq2)


def plan_round(cases: list[tuple[str, FrequencyProtocol]], round: str, v1: int = 0, v2: int = 1,
               tau: int = DEFAULT_TAU, seq1: Sequence[int] | None = None,
               seq2: Sequence[int] | None = None) -> tuple[list[AuditJob], list[SkippedCase]]:
    """The audits of one round over built protocols ``(name, proto)``.

    ``"first"``: every case. ``"prr"`` and ``"longitudinal"``: memoizing cases only (memoryless
    protocols have no memoized round and an unbounded longitudinal loss: not applicable, not
    skipped); a memoizing protocol without ``memoized_outputs`` is skipped in the PRR round.
    The longitudinal round runs ``seq1``/``seq2`` if given, else :func:`longitudinal_pairs`.
    """
    round = _check_round(round)
    jobs: list[AuditJob] = []
    skipped: list[SkippedCase] = []
    for name, proto in cases:
        if round == "first":
            jobs.append(AuditJob(name, proto, round, v1, v2))
        elif proto.memo_size <= 0:
            continue
        elif round == "prr":
            if has_memoized_outputs(proto):
                jobs.append(AuditJob(name, proto, round, v1, v2))
            else:
                skipped.append(SkippedCase(name, proto.params(), "no memoized_outputs (PRR round)"))
        else:
            pairs = ([(tuple(seq1), tuple(seq2))] if seq1 is not None and seq2 is not None
                     else longitudinal_pairs(proto.k, v1, v2, tau))
            jobs += [AuditJob(name, proto, round, v1, v2, a, b) for a, b in pairs]
    return jobs, skipped


# ---------------------------------------------------------------- default cases
EPS = 1.0       # single-shot ε
EPS_INF = 2.0   # memoized ε∞
EPS_1 = 1.0     # requested single-report ε1 of memoizing protocols
_EPS_1_FALLBACK = (0.5, 0.4, 0.3)  # fractions of ε∞ tried when ε1 = 1 is infeasible


@dataclass(frozen=True)
class SkippedCase:
    """A default case that could not be built, and why."""

    name: str
    params: dict
    reason: str


@dataclass
class AuditPlan:
    """The default cases: buildable ``(name, params)`` pairs and the skipped ones."""

    cases: list[tuple[str, dict]] = field(default_factory=list)
    skipped: list[SkippedCase] = field(default_factory=list)


def _candidates(name: str, k: int) -> list[dict]:
    """Parameter sets to try for a protocol name (the first buildable one of each group wins)."""
    single = {"k": k, "eps": EPS}
    memo = {"k": k, "eps_inf": EPS_INF, "eps_1": EPS_1}
    if name in ("L-GRR", "L-ADP", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE"):
        return [memo]
    if name == "LOLOHA":
        return [memo, {**memo, "g": 2}]
    if name == "dBitFlipPM":
        # b = k so that the default inputs 0 and 1 fall in different buckets: with contiguous
        # buckets (⌊v b / k⌋) any b < k puts them together, their report distributions are equal
        # and the audit is vacuous (audit bucketed configurations with v2 >= k / b instead)
        return [{"k": k, "b": k, "d": 1, "eps_inf": EPS_INF},
                {"k": k, "b": k, "d": 2, "eps_inf": EPS_INF}]
    return [single]


_KNOWN = frozenset({"GRR", "SUE", "OUE", "BLH", "OLH", "SS", "SHE", "THE", "HR", "FHR", "ADP",
                    "L-GRR", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE", "L-ADP", "LOLOHA", "dBitFlipPM"})
# GRR chains differ between the calibrations; for UE chains Arcolezi et al., DCN 2022, Eq. 14 is
# exact, so both coincide
_BOTH_CALIBRATIONS = frozenset({"L-GRR", "L-ADP", "LOLOHA"})
_GENERIC = {"k": None, "eps": EPS, "eps_inf": EPS_INF, "eps_1": EPS_1}


def _fill_generic(name: str, k: int) -> tuple[dict | None, str]:
    """Parameters of an unknown protocol from its constructor signature, or the reason why not."""
    params: dict[str, Any] = {}
    for p, spec in parameters(name).items():
        if spec.kind in (spec.VAR_POSITIONAL, spec.VAR_KEYWORD):
            continue
        if p in _GENERIC:
            params[p] = k if p == "k" else _GENERIC[p]
        elif spec.default is spec.empty:
            return None, f"no default audit value for required parameter {p!r}"
    return params, ""


def _build(name: str, params: dict) -> tuple[dict | None, str]:
    """``params`` (possibly with a smaller feasible ε1) if ``make`` accepts them, else the reason."""
    from . import make

    tries = [params]
    if "eps_1" in params and "eps_inf" in params:
        tries += [{**params, "eps_1": round(f * params["eps_inf"], 12)} for f in _EPS_1_FALLBACK
                  if f * params["eps_inf"] < params["eps_1"]]
    reason = ""
    for p in tries:
        try:
            make(name, **p)
        except Exception as exc:  # any constructor failure is recorded, never raised
            reason = f"{type(exc).__name__}: {exc}"
            continue
        return p, ""
    return None, reason


def plan_audit_cases(k: int = 8) -> AuditPlan:
    """Default audit cases for every registered protocol, and the cases that had to be skipped.

    Single-shot protocols use ε = 1; memoizing ones ε∞ = 2, ε1 = 1 (or 0.5/0.4/0.3 ε∞ when ε1 = 1
    is infeasible); L-GRR, L-ADP and LOLOHA are audited under both calibrations, LOLOHA with its
    default (optimal) g and with g = 2; dBitFlipPM with b = k and d = 1, 2.
    Unknown names get parameters from their constructor signature.
    """
    from . import PROTOCOLS

    plan = AuditPlan()
    for name in PROTOCOLS:
        takes = list(parameters(name))
        known = _candidates(name, k) if name in _KNOWN else None
        if known is None:
            generic, why = _fill_generic(name, k)
            if generic is None:
                plan.skipped.append(SkippedCase(name, {}, why))
                continue
            known = [generic]
        for base in known:
            variants = ([{**base, "calibration": c} for c in ("exact", "paper")]
                        if "calibration" in takes and name in _BOTH_CALIBRATIONS else [base])
            for params in variants:
                built, why = _build(name, params)
                if built is None:
                    plan.skipped.append(SkippedCase(name, params, why))
                else:
                    plan.cases.append((name, built))
    return plan


def default_audit_cases(k: int = 8) -> list[tuple[str, dict]]:
    """``(name, make-params)`` of every buildable default case (see :func:`plan_audit_cases`)."""
    return plan_audit_cases(k).cases


def _runs(seq: tuple[int, ...]) -> str:
    """Run-length text of a sequence: ``(0, 0, 0, 2, 2)`` -> ``0x3,2x2``."""
    out: list[str] = []
    i = 0
    while i < len(seq):
        j = i
        while j < len(seq) and seq[j] == seq[i]:
            j += 1
        out.append(f"{seq[i]}x{j - i}")
        i = j
    return ",".join(out)


def describe_inputs(r: AuditResult) -> str:
    """``v1 vs v2``, or the two sequences (run-length) of a longitudinal result."""
    if r.round == "longitudinal":
        return f"{_runs(r.seq1)} vs {_runs(r.seq2)}"
    return f"{r.v1} vs {r.v2}"


def format_results(results: list[AuditResult], skipped: list[SkippedCase] = ()) -> str:
    """A plain-text table of audit results, one block per round (and the skipped cases).

    Columns: the round, the protocol and its parameters, the inputs (values, or sequences of the
    longitudinal round), which ε is claimed (``ε1``, ``ε∞`` or ``B(τ=...)``, the published
    longitudinal bound after ``τ`` reports; ``∞`` when unbounded), its value, the lower bound, ε̂,
    the tightness, and for the longitudinal round the accounted ``L(m=...)`` and the event.
    """
    def extra(p: dict) -> str:
        return " ".join(f"{k}={v}" for k, v in p.items() if k not in ("protocol", "mechanism", "k"))

    def num(x: float, width: int) -> str:
        return f"{'∞':>{width}}" if x == math.inf else f"{x:>{width}.4f}"

    lines = [f"{'round':<12} {'protocol':<11} {'params':<52} {'inputs':<15} {'claim':>7} {'eps_theory':>10} "
             f"{'eps_lower':>10} {'eps_hat':>8} {'tight':>6} {'pass':>5} {'accounted':>16} event"]
    for r in results:
        acct = f"{r.accounted_label}={num(r.eps_accounted, 0)}" if r.round == "longitudinal" else "-"
        lines.append(f"{r.round:<12} {r.protocol:<11} {extra(r.params):<52} {describe_inputs(r):<15} "
                     f"{r.theory_label:>7} {num(r.eps_theory, 10)} {r.eps_lower:>10.4f} {r.eps_hat:>8.4f} "
                     f"{r.tightness:>6.3f} {str(r.passed):>5} {acct:>16} {r.event or '-'}")
    for s in skipped:
        lines.append(f"{s.name:<11} SKIPPED {extra(s.params)}: {s.reason}")
    return "\n".join(lines)
