"""Seed-aware worst-case longitudinal ε of LOLOHA and dBitFlipPM, computed exactly from the output
law (docs/privacy.md, "Limit of the accounted longitudinal ε")."""
import itertools
import math

import numpy as np
import pytest

from estimators.bitflip import DBitFlipPM
from estimators.hashing import LOLOHA
from estimators.seedaware import (bitflip_exact_loss, grr_irr_eps, loloha_exact_loss, loloha_seed_aware_bound,
                                  loloha_sequence_law)


def test_sequence_law_is_a_law_and_matches_one_report():
    p = LOLOHA(8, 2.0, 1.0, g=3)
    for cells in [(0,), (0, 0, 1), (2, 1, 0, 2)]:
        law = loloha_sequence_law(p.p1, p.p2, 3, cells)
        assert law.sum() == pytest.approx(1.0)
    one = loloha_sequence_law(p.p1, p.p2, 3, (0,))
    assert one[0] == pytest.approx(p.ps) and one[1] == pytest.approx((1 - p.ps) / 2)


def test_law_against_the_implementation():
    """(1) is the law of the library's LOLOHA reports given the seed: devices that share a cell
    sequence (read from their seeds) report y with the computed frequencies."""
    p = LOLOHA(16, 2.0, 1.0, g=2)
    n, seq = 200_000, (0, 1, 2)
    st = p.new_state(n, rng=np.random.default_rng(1))
    rng = np.random.default_rng(2)
    reps = [p.randomize(np.full(n, v), rng, state=st) for v in seq]
    cells = np.stack([p.hash_values(reps[0], v) for v in seq], axis=1)
    ys = np.stack([r["y"].astype(np.int64) for r in reps], axis=1)
    for c in [(0, 0, 0), (0, 1, 0), (1, 0, 0)]:
        rows = (cells == np.array(c)).all(axis=1)
        law = loloha_sequence_law(p.p1, p.p2, 2, c)
        code = ys[rows] @ np.array([4, 2, 1])
        freq = np.bincount(code, minlength=8) / rows.sum()
        assert np.abs(freq - law).max() < 5 * np.sqrt(0.25 / rows.sum()), (c, freq, law)


@pytest.mark.parametrize("g, taus", [(2, range(1, 7)), (3, range(1, 6))])
def test_loloha_exact_worst_case_exceeds_g_eps_inf(g, taus):
    p = LOLOHA(8, 2.0, 1.0, g=g)
    e_irr = grr_irr_eps(p.p2, g)
    exact = [loloha_exact_loss(p.p1, p.p2, g, t) for t in taus]
    assert exact[0] == pytest.approx(p.eps_first)  # one report: ε1
    assert all(b > a for a, b in zip(exact, exact[1:]))  # grows with every report
    for t, e in zip(taus, exact):
        assert e <= loloha_seed_aware_bound(p.eps_first, e_irr, t) + 1e-9  # the published bound holds
        assert e <= p.longitudinal_bound(t) + 1e-9
    if g == 2:
        assert exact[-1] > g * p.eps_inf  # τ = 6: 4.75 > g ε∞ = 4
    assert math.isinf(p.worst_case_loss)


def test_loloha_exact_g3_tau6_exceeds_g_eps_inf():
    p = LOLOHA(8, 2.0, 1.0, g=3)
    assert loloha_exact_loss(p.p1, p.p2, 3, 6) > 3 * p.eps_inf  # 6.63 > 6 (the published figure before)


def test_same_cell_pattern_is_bounded_by_accounted():
    """With the same cell pattern the loss is the accounted m ε∞ at most (the PRRs compose)."""
    p = LOLOHA(8, 2.0, 1.0, g=3)
    for c1, c2 in [((0, 0, 1, 1), (2, 2, 0, 0)), ((0, 1, 2, 0), (1, 2, 0, 1))]:
        l1, l2 = (np.log(loloha_sequence_law(p.p1, p.p2, 3, c)) for c in (c1, c2))
        m = len(set(c1))
        assert np.abs(l1 - l2).max() <= m * p.eps_inf + 1e-9


@pytest.mark.parametrize("d, b, k", [(1, 8, 8), (2, 4, 8), (4, 4, 8), (1, 2, 2), (3, 4, 4), (2, 4, 4)])
def test_bitflip_unbounded_unless_cases_follow_values(d, b, k):
    p = DBitFlipPM(k, b, d, 2.0)
    assert bitflip_exact_loss(p.p, p.q, d, b, k, 1) == pytest.approx(p.eps_first)
    exact = bitflip_exact_loss(p.p, p.q, d, b, k, 2)
    assert math.isinf(exact) == (not (b == k and d >= b - 1))
    assert exact <= p.longitudinal_bound(2) + 1e-9
    assert math.isinf(p.worst_case_loss) == (not (b == k and d >= b - 1))


def test_bitflip_d1_b8_two_reports_law():
    """d = 1, b = 8 from the law: seq (0, 1) vs (2, 3) on devices that sampled bucket 0: the second
    report differs from the first with positive probability under (0, 1) and never under (2, 3)."""
    p = DBitFlipPM(8, 8, 1, 2.0)
    n = 50_000
    changed = []
    for seq in [(0, 1), (2, 3)]:
        st = p.new_state(n, rng=np.random.default_rng(3))
        r = [p.randomize(np.full(n, v), state=st) for v in seq]
        on0 = (r[0][:, 0] >> 1) == 0
        changed.append(int((on0 & (r[0][:, 0] != r[1][:, 0])).sum()))
    assert changed[0] > 0 and changed[1] == 0
