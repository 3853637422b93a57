"""Empirical privacy audit of the numeric mechanisms: events on a discretization of the output.

The same test as :mod:`estimators.audit` (LDP-Audit, Arcolezi & Gambs, PETS 2024), with its statistics
(:func:`estimators.audit.eps_lower_bound`, one-sided Clopper-Pearson with the complement, Bonferroni) and its
:class:`~estimators.audit.AuditResult`: the real randomizer (:meth:`.base.NumericMechanism.randomize`, the
kernels of real devices, keyed in the labelled simulation mode from ``seed``) runs ``trials`` times on each of
two inputs ``x1 != x2`` (metric units, default the range ends ``lo`` and ``hi``, where every mechanism here
attains its ε), and a distinguishing event ``E`` counted under each gives the lower bound on ε.

**The event.** Outputs are the reports' values in the unit domain (``mech.unit_outputs``: ``±B`` for Duchi,
the cell centres of PM and Square Wave, ``x̂(b)`` for 1BitMean, the grid values of Laplace), binned on a
fixed discretization (:func:`output_edges`): ``bins`` equal bins over ``[-R, R]``, ``R`` the smallest power of
two that holds all but :data:`TAIL_MASS` of both laws, and the two tails ``(-inf, -R)`` and ``[R, inf)``.
From the *exact* law (:meth:`.base.NumericMechanism.output_mass` of both inputs; no sample is used) the bins
are ranked by likelihood ratio ``P[bin | x1] / P[bin | x2]`` (Neyman-Pearson: the most powerful events are
the top-ranked sets) and ``E`` is the top set whose *predicted* lower bound (the bound of the expected
counts ``n P[E | xi]``, at the audit's ``trials`` and confidence) is largest; bins of zero mass under both
laws join the event of their neighbour, so ``E`` is a range of outputs for the monotone laws here. The
event is fixed before any report is drawn, so the bound is valid whatever the law says: a randomizer that
departs from its stated law is measured as it is. For the binary mechanisms ``E`` is one report value
(Duchi's sign ``-1``, 1BitMean's bit ``0``; the complement, tested too, is the other).

**Rounds** (:data:`ROUNDS`):

``"first"``
    One report per device against ``min(eps, eps_first)`` (the stated ε and the exact ε of the implemented
    law, ``eps_first <= eps`` by construction). A memoizing mechanism (1BitMean) gets a NEW device (a fresh
    memo key, hence a fresh α-point and fresh memoized bits) for every trial and reports through its memo
    state, as a device does.
``"prr"``
    Memoizing mechanisms only: the memoized bit alone (RAPPOR's permanent randomized response; Erlingsson,
    Pihur & Korolova, CCS 2014), a fresh device per trial, against ``min(eps, eps_memo)`` (``ε∞`` of the
    tables). The memoized bit is the report of the same mechanism without output perturbation
    (``gamma = 0``: the bit depends on the device key and the thresholds only, which ``gamma`` does not
    change), drawn by the same kernel; with ``gamma = 0`` the round is the first round.

The longitudinal round of :mod:`estimators.audit` does not apply here (not implemented for numeric
mechanisms: :func:`plan_numeric_round` lists 1BitMean as skipped there).

Cited: Duchi, Jordan & Wainwright, JASA 2018 (Duchi); Wang et al., ICDE 2019 (PM, HM); Li et al., SIGMOD 2020
(Square Wave); Ding, Kulkarni & Yekhanin, NeurIPS 2017 (1BitMean, α-point rounding and memoization).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..audit import (DEFAULT_CHUNK, DEFAULT_TRIALS, EPS, AuditResult, ProgressCallback, SkippedCase,
                     _check_confidence, _check_positive, eps_interval, eps_lower_bound, eps_point_estimate)
from ..errors import LDPError
from .base import NumericMechanism

__all__ = ["DEFAULT_BINS", "NumericAuditJob", "OutputEvent", "ROUNDS", "TAIL_MASS", "audit_numeric",
           "default_numeric_cases", "output_edges", "plan_event", "plan_numeric_round"]

#: the rounds that apply to numeric mechanisms (the longitudinal round does not, see the module doc)
ROUNDS: tuple[str, ...] = ("first", "prr")
#: equal bins of the discretization between ``-R`` and ``R`` (plus the two tails)
DEFAULT_BINS = 256
#: the mass of either law allowed outside ``[-R, R]`` (the tails are bins of their own)
TAIL_MASS = 1e-3
_MAX_LOG2_R = 40
_LEVEL_DIGITS = 9  # ratios equal to 9 significant digits are one level of the ranking


def _is_memoizing(mech: NumericMechanism) -> bool:
    return int(getattr(mech, "memo_size", 0)) > 0


def _check_round(mech: NumericMechanism, round: str) -> str:
    if round not in ROUNDS:
        raise LDPError(f"round must be one of {', '.join(ROUNDS)} for a numeric mechanism, got {round!r}")
    if round == "prr" and not _is_memoizing(mech):
        raise LDPError(f"{mech.name} does not memoize: no memoized bit to audit (the PRR round needs 1BitMean)")
    return round


def _memo_mechanism(mech: NumericMechanism) -> NumericMechanism:
    """The mechanism whose report is ``mech``'s memoized output: ``mech`` without output perturbation."""
    params = mech.params()
    if not params.get("gamma"):
        return mech
    return type(mech)(**{**{k: v for k, v in params.items() if k != "mechanism"}, "gamma": 0.0})


def _claim(mech: NumericMechanism, round: str) -> float:
    """The ε the round tests: the stated ``eps`` or the implemented law's, whichever is smaller."""
    implemented = mech.eps_memo if round == "prr" else mech.eps_first  # type: ignore[attr-defined]
    return float(min(mech.eps, implemented))


def _unit_input(mech: NumericMechanism, x: float, name: str) -> float:
    x = float(x)
    if not (math.isfinite(x) and mech.lo <= x <= mech.hi):
        raise LDPError(f"{name} must be a value of the range [{mech.lo}, {mech.hi}], got {x!r}")
    return float(mech.prepare(np.array([x]))[0][0])


def output_edges(mech: NumericMechanism, u1: float, u2: float, bins: int = DEFAULT_BINS) -> np.ndarray:
    """Bin edges of the unit outputs: ``-inf``, ``bins`` equal bins over ``[-R, R]``, ``inf`` (module doc).

    ``R`` is the smallest power of two ``>= 1`` with at most :data:`TAIL_MASS` of the exact law of either unit
    input ``u1``, ``u2`` outside ``[-R, R]``; with ``bins`` a power of two ``>= 2R`` every edge is a multiple of
    a power of two (``±1`` among them)."""
    bins = _check_positive("bins", bins)
    for p in range(_MAX_LOG2_R + 1):
        r = float(2 ** p)
        inside = np.array([-r, r])
        if min(float(mech.output_mass(u, inside).sum()) for u in (u1, u2)) >= 1.0 - TAIL_MASS:
            break
    return np.concatenate([[-np.inf], np.linspace(-r, r, bins + 1), [np.inf]])


def _bin_index(edges: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The bin of each output (bins ``[e_j, e_{j+1})``, the last closed: :meth:`output_mass`'s convention)."""
    j = np.searchsorted(edges, y, side="right") - 1
    last = edges.shape[0] - 2
    j[y == edges[-1]] = last
    return np.clip(j, 0, last)


@dataclass(frozen=True)
class OutputEvent:
    """A distinguishing event: the bins of ``edges`` in ``member``, its exact probabilities under both inputs
    and the lower bound predicted from them (:func:`plan_event`)."""

    edges: np.ndarray
    member: np.ndarray
    p1: float
    p2: float
    predicted: float
    #: the event favours the second input: the audit draws it first (its ``v1``) and the first one second
    swap: bool = False

    def hits(self, y: np.ndarray) -> int:
        """How many of the unit outputs ``y`` fall in the event."""
        return int(np.count_nonzero(self.member[_bin_index(self.edges, y)]))

    @property
    def label(self) -> str:
        """``x̂ < b``, ``x̂ >= a`` or ``a <= x̂ < b`` (unit outputs) when the event is one range of bins."""
        idx = np.flatnonzero(self.member)
        if idx.size == 0 or idx[-1] - idx[0] + 1 != idx.size:
            return f"{idx.size} of {self.member.size} bins"
        a, b = self.edges[idx[0]], self.edges[idx[-1] + 1]
        if a == -np.inf:
            return f"x̂ < {b:g}"
        if b == np.inf:
            return f"x̂ >= {a:g}"
        return f"{a:g} <= x̂ < {b:g}"


def plan_event(mech: NumericMechanism, u1: float, u2: float, trials: int, confidence: float = 0.95,
               bins: int = DEFAULT_BINS) -> OutputEvent:
    """The event of the audit of unit inputs ``u1``, ``u2`` at ``trials`` reports each (module doc), from the
    exact law alone. ``p1``, ``p2`` are its probabilities under ``u1``, ``u2``, or under ``u2``, ``u1`` when
    ``swap`` (the top set's complement, which favours ``u2``, carries the predicted bound)."""
    edges = output_edges(mech, u1, u2, bins)
    m1 = np.clip(np.asarray(mech.output_mass(u1, edges), dtype=np.float64), 0.0, 1.0)
    m2 = np.clip(np.asarray(mech.output_mass(u2, edges), dtype=np.float64), 0.0, 1.0)
    live = (m1 > 0) | (m2 > 0)
    if not live.any():
        raise LDPError(f"{mech!r}: the output law puts no mass in the audit's bins")
    with np.errstate(divide="ignore", invalid="ignore"):  # log 0; dead bins (0 - 0) are masked
        ratio = np.where(live, np.log(m1) - np.log(m2), -np.inf)  # +inf where only x1 reaches the bin
    level = np.where(np.isfinite(ratio), np.round(ratio, _LEVEL_DIGITS), ratio)
    order = np.argsort(-level, kind="stable")[: int(live.sum())]  # live bins, most x1-favouring first
    cum1, cum2 = np.cumsum(m1[order]), np.cumsum(m2[order])
    # candidate events: every top set that ends where the ranking changes level (neither empty nor all)
    ends = [i for i in range(order.size - 1) if level[order[i]] != level[order[i + 1]]]
    if not ends:  # one level: the two laws agree on the bins; any split, e.g. the first bin
        ends = [0]
    best, best_end, swap = -1.0, ends[0], False
    for i in ends:
        c1 = int(min(trials, round(trials * min(1.0, cum1[i]))))
        c2 = int(min(trials, round(trials * min(1.0, cum2[i]))))
        bound = eps_lower_bound(c1, c2, trials, confidence)
        if bound > best:  # oriented by the statement that carries it: E for x1, or its complement for x2
            best, best_end = bound, i
            swap = (eps_lower_bound(trials - c2, trials - c1, trials, confidence, complement=False)
                    > eps_lower_bound(c1, c2, trials, confidence, complement=False))
    chosen = np.zeros(m1.shape[0], dtype=bool)
    chosen[order[: best_end + 1]] = True
    # a zero-mass bin joins the event iff its nearest live bin on the left does (the right one at the start)
    member = chosen.copy()
    live_idx = np.flatnonzero(live)
    for j in np.flatnonzero(~live):
        left = live_idx[live_idx < j]
        member[j] = chosen[left[-1]] if left.size else chosen[live_idx[0]]
    if swap:
        member, m1, m2 = ~member, m2, m1
    return OutputEvent(edges, member, float(m1[member].sum()), float(m2[member].sum()), float(max(best, 0.0)),
                       swap)


def audit_numeric(mech: NumericMechanism, x1: float | None = None, x2: float | None = None,
                  trials: int | None = None, seed: int = 0, confidence: float = 0.95, round: str = "first",
                  bins: int = DEFAULT_BINS, on_progress: ProgressCallback | None = None,
                  chunk: int = DEFAULT_CHUNK) -> AuditResult:
    """Audit a numeric mechanism: ``trials`` reports of the real randomizer on each of ``x1`` and ``x2``
    (metric units; default ``lo`` and ``hi``), the event of :func:`plan_event`, the lower bound and the claim
    of the round (module doc). ``trials=None`` takes :data:`estimators.audit.DEFAULT_TRIALS`; reports are
    drawn in chunks of ``chunk``, ``on_progress(done, 2 * trials)`` after each. Seeded simulation mode: one
    independent stream per input from ``SeedSequence(seed)``."""
    round = _check_round(mech, round)
    x1 = mech.lo if x1 is None else x1
    x2 = mech.hi if x2 is None else x2
    u1, u2 = _unit_input(mech, x1, "x1"), _unit_input(mech, x2, "x2")
    if u1 == u2:
        raise LDPError(f"x1 and x2 must differ, got {x1} and {x2}")
    trials = _check_positive("trials", DEFAULT_TRIALS[round] if trials is None else trials)
    chunk = _check_positive("chunk", chunk)
    confidence = _check_confidence(confidence)
    source = _memo_mechanism(mech) if round == "prr" else mech
    event = plan_event(source, u1, u2, trials, confidence, bins)
    memoizing = _is_memoizing(source)

    if event.swap:  # the event favours x2: x2 is the result's v1 (the complement keeps both directions)
        x1, x2 = x2, x1

    total, done, hits = 2 * trials, 0, []
    for x, ss in zip((float(x1), float(x2)), np.random.SeedSequence(seed).spawn(2)):
        rng = np.random.default_rng(ss)
        count, left = 0, trials
        while left:
            m = min(chunk, left)
            values = np.full(m, x, dtype=np.float64)
            if memoizing:  # a fresh device (memo key) per trial, reporting through its memo state
                reports = source.randomize(values, rng, state=source.new_state(m, rng=rng))  # type: ignore[call-arg]
            else:
                reports = source.randomize(values, rng)
            y = np.asarray(source.unit_outputs(reports), dtype=np.float64)  # type: ignore[attr-defined]
            if y.shape != (m,):
                raise LDPError(f"{mech.name}.unit_outputs gave shape {y.shape} for {m} reports")
            count += event.hits(y)
            left -= m
            done += m
            if on_progress is not None:
                on_progress(done, total)
        hits.append(count)

    c1, c2 = hits
    return AuditResult(
        protocol=mech.name, params=mech.params(), v1=float(x1), v2=float(x2), trials=trials,  # type: ignore[arg-type]
        confidence=confidence, hits1=c1, hits2=c2,
        eps_hat=eps_point_estimate(c1, c2, trials),
        eps_hat_ci=eps_interval(c1, c2, trials, confidence),
        eps_lower=eps_lower_bound(c1, c2, trials, confidence),
        eps_theory=_claim(mech, round), round=round, event=event.label,
    )


@dataclass(frozen=True)
class NumericAuditJob:
    """One numeric audit to run (the interface of :class:`estimators.audit.AuditJob`)."""

    name: str
    proto: NumericMechanism
    round: str
    x1: float | None = None
    x2: float | None = None
    seq1: tuple[int, ...] | None = None  # no sequences: the longitudinal round does not apply
    seq2: tuple[int, ...] | None = None

    def reports(self, trials: int | None = None) -> int:
        return 2 * (DEFAULT_TRIALS[self.round] if trials is None else trials)

    def run(self, trials: int | None = None, seed: int = 0, confidence: float = 0.95,
            on_progress: ProgressCallback | None = None) -> AuditResult:
        return audit_numeric(self.proto, self.x1, self.x2, trials=trials, seed=seed, confidence=confidence,
                             round=self.round, on_progress=on_progress)


def default_numeric_cases(eps: float = EPS) -> list[tuple[str, NumericMechanism]]:
    """Every mechanism of :data:`estimators.numeric.MECHANISMS` at ``eps`` (default parameters, range
    ``[-1, 1]``), and 1BitMean also with output perturbation ``gamma = 0.1`` (its first round then claims less
    than its memoized bit's ``eps_memo``)."""
    from . import MECHANISMS, make_numeric

    cases = [(name, make_numeric(name, eps=eps)) for name in MECHANISMS]
    if "1BitMean" in MECHANISMS:
        cases.append(("1BitMean", make_numeric("1BitMean", eps=eps, gamma=0.1)))
    return cases


def plan_numeric_round(cases: list[tuple[str, NumericMechanism]], round: str, x1: float | None = None,
                       x2: float | None = None) -> tuple[list[NumericAuditJob], list[SkippedCase]]:
    """The audits of one round (a name of :data:`estimators.audit.ROUNDS`) over numeric mechanisms: every case
    in ``"first"``, the memoizing ones in ``"prr"``; in ``"longitudinal"`` the memoizing ones are skipped (not
    implemented for numeric mechanisms) and the others do not apply."""
    jobs: list[NumericAuditJob] = []
    skipped: list[SkippedCase] = []
    for name, mech in cases:
        if round == "first" or (round == "prr" and _is_memoizing(mech)):
            jobs.append(NumericAuditJob(name, mech, round, x1, x2))
        elif round == "longitudinal" and _is_memoizing(mech):
            params: dict[str, Any] = mech.params()
            skipped.append(SkippedCase(name, params, "longitudinal round not implemented for numeric mechanisms "
                                                     "(the PRR round audits the memoized bit)"))
    return jobs, skipped
