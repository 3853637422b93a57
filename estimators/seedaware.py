"""Worst-case longitudinal ε of LOLOHA and dBitFlipPM against a seed-aware server, from the output law.

A LOLOHA device fixes a public hash seed ``s`` (it travels in every report; Arcolezi et al.,
EDBT 2023, Alg. 1 line 1), memoizes one PRR per *cell* ``c = H_s(v)`` of ``[0, g)`` (GRR with
``(p1, q1)``) and re-randomizes it per report (GRR with ``(p2, q2)``). Given ``s``, a value
sequence ``V = (v_1 .. v_τ)`` acts only through its cell sequence ``C = (H_s(v_t))_t`` and

    P(y | s, V) = prod over cells c used by C of  sum_x P1(x | c) prod_{t : C_t = c} P2(y_t | x)   (1)

The seed's law does not depend on ``V``, so the server's loss on ``(s, y)`` is the log ratio of
(1) under the two cell sequences. The accounted ``m ε∞`` (m memoized cells, EDBT 2023, Def. 3.2,
Thm. 3.5) bounds it only when both cell sequences repeat cells at the same steps; two value
sequences with the same change pattern get different cell patterns on the seeds that hash two
of one sequence's values together and not the other's, and then the IRR reports of the merged
steps agree more than those of the split ones: the loss grows with τ. :func:`loloha_exact_loss`
evaluates the worst case exactly by enumeration for small ``g``, ``τ``;
:func:`loloha_seed_aware_bound` is the upper bound the library publishes (see docs/privacy.md):
drawing all ``g`` PRRs up front (a table ``X`` independent of ``V``), each report is ``P2(y_t | X_{C_t})``,
whose ratio under two cells is at most ``p2 / q2 = e^{ε_IRR}``, so the loss is at most
``ε_IRR`` times the number of steps whose values differ (and ``ε1`` for a single report).

dBitFlipPM has no IRR: the report is the memoized response of the value's *case* (sampled
bucket ``j_l``, or "none"), so merging two steps that the other sequence splits makes a change
of report impossible under one sequence and possible under the other: infinite loss from
``τ = 2`` unless the case pattern is fixed by the value pattern, i.e. ``b = k`` and ``d >= b - 1``.
"""
from __future__ import annotations

import itertools
import math

import numpy as np


def loloha_sequence_law(p1: float, p2: float, g: int, cells: tuple[int, ...]) -> np.ndarray:
    """``P(y | C)`` of (1) for every ``y`` in ``[0, g)^τ`` (``float (g^τ,)``, ``y`` in
    lexicographic order), for the GRR chain ``(p1, q1 = (1 - p1)/(g - 1))``,
    ``(p2, q2 = (1 - p2)/(g - 1))`` over ``[0, g)``."""
    tau = len(cells)
    q1, q2 = (1 - p1) / (g - 1), (1 - p2) / (g - 1)
    ys = np.array(list(itertools.product(range(g), repeat=tau)), dtype=np.int64).reshape(-1, tau)
    law = np.ones(ys.shape[0])
    for c in sorted(set(cells)):
        steps = [t for t in range(tau) if cells[t] == c]
        group = np.zeros(ys.shape[0])
        for x in range(g):
            px = p1 if x == c else q1
            k2 = np.where(ys[:, steps] == x, p2, q2).prod(axis=1)
            group += px * k2
        law *= group
    return law


def loloha_exact_loss(p1: float, p2: float, g: int, tau: int) -> float:
    """Exact worst-case loss ``max over C, C', y of ln P(y | C) / P(y | C')`` over all pairs of
    cell sequences in ``[0, g)^τ`` (enumeration; ``g^τ`` laws of ``g^τ`` outputs each).

    Every pair is reached by two value sequences with the same change pattern (all values
    distinct, ``k >= 2 τ``) on the seeds that hash them so; the worst case over value pairs is
    therefore this maximum whenever such a seed exists."""
    laws = np.array([loloha_sequence_law(p1, p2, g, c) for c in itertools.product(range(g), repeat=tau)])
    logs = np.log(laws)
    return float((logs.max(axis=0) - logs.min(axis=0)).max())


def grr_irr_eps(p2: float, g: int) -> float:
    """ε_IRR = ln(p2 / q2) of the GRR IRR round over ``[0, g)``."""
    return math.log(p2 * (g - 1) / (1 - p2))


def loloha_seed_aware_bound(eps_first: float, eps_irr: float, reports: int | float) -> float:
    """Upper bound on the seed-aware loss after ``reports`` reports whose values differ:
    ``0`` for none, ``ε1`` for one, ``reports · ε_IRR`` for more (``inf`` for unbounded)."""
    if reports <= 0:
        return 0.0
    if reports == 1:
        return float(eps_first)
    return float(reports * eps_irr)


def bitflip_exact_loss(p: float, q: float, d: int, b: int, k: int, tau: int) -> float:
    """Exact worst-case loss of dBitFlipPM over pairs of value sequences with the same change
    pattern, by enumeration of the cases: ``inf`` as soon as some sampled set ``J`` gives the
    two sequences different case patterns (``tau >= 2``, unless ``b = k`` and ``d >= b - 1``), else the
    composition of the memoized responses (``min(m, b) ε∞``, checked by the same enumeration
    on the reports' law for tiny ``b``)."""
    if tau <= 1:
        return math.log(p * (1 - q) / ((1 - p) * q)) if d >= 2 else math.log(p / q)
    buckets = [(v * b) // k for v in range(k)]
    for J in itertools.combinations(range(b), d):
        case = [J.index(bk) if bk in J else d for bk in buckets]
        # two values with the same pattern (distinct) whose cases merge under one and not the other
        for v1, a in itertools.permutations(range(k), 2):
            for v2, bb in itertools.permutations(range(k), 2):
                if (case[v1] == case[a]) != (case[v2] == case[bb]):
                    return math.inf
    eps = math.log(p * (1 - q) / ((1 - p) * q)) if d >= 2 else math.log(p / q)
    return min(tau, b) * eps
