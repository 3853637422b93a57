"""Poisoning attacks (Cao, Jia & Gong, USENIX Security 2021) and the defenses of estimators.poisoning.

Pure math, seeded (simulation mode), no services. Tolerances are derived from the variances: a
realized gain against its closed form within 5 sd of the genuine reports' noise; a false-rejection
count within 5 binomial sd of its exact rate; an average estimate within 5 standard errors.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import estimators
from estimators import kernels
from estimators import poisoning as P

K, N, R = 30, 20_000, 3
PROTOS = {"GRR": dict(eps=1.0), "OUE": dict(eps=1.0), "L-OSUE": dict(eps_inf=2.0, eps_1=1.0), "OLH": dict(eps=1.0)}


def _proto(name: str, k: int = K):
    return estimators.make(name, k=k, **PROTOS[name])


def _zipf(rng: np.random.Generator, k: int, n: int) -> np.ndarray:
    w = 1.0 / np.arange(1, k + 1) ** 1.1
    return rng.choice(k, size=n, p=(w / w.sum())[rng.permutation(k)])


def _genuine(p, rng, n: int = N, k: int = K):
    values = _zipf(rng, k, n)
    return values, p.randomize(values, rng, state=p.new_state(n, rng))


def _target_sum_var(p, values: np.ndarray, targets: np.ndarray) -> float:
    """Variance of Σ_t C_t over the genuine reports of ``values`` (fixed values; random reports).
    Direct: one Bernoulli per report; unary: independent bits; hashing: bounded by r Σ_t Var(b_t)."""
    ps, qs = P.honest_law(p)
    r = targets.size
    in_t = np.isin(values, targets)
    fam = P.family(p)
    if fam == "direct":
        pi = np.where(in_t, ps + (r - 1) * qs, r * qs)
        return float(np.sum(pi * (1 - pi)))
    per_t = np.where(in_t, ps * (1 - ps) + (r - 1) * qs * (1 - qs), r * qs * (1 - qs))
    return float(np.sum(per_t)) * (r if fam == "hashing" else 1)


# ---------------------------------------------------------------- the attacks
@pytest.mark.parametrize("name", list(PROTOS))
@pytest.mark.parametrize("attack", ["MGA", "RIA", "RVA"])
def test_fake_reports_belong_to_the_output_space(name, attack, rng):
    p = _proto(name)
    fake = P.craft_reports(p, attack, np.array([1, 4, 9]), 500, rng)
    back = p.decode(p.encode(fake))
    assert back.shape[0] == 500
    assert p.support(back).shape == (K,)


@pytest.mark.parametrize("name", list(PROTOS))
@pytest.mark.parametrize("beta", [0.01, 0.10])
def test_mga_gain_matches_the_closed_form(name, beta, rng):
    """(a) the realized MGA gain against Cao et al.'s expected gain, within 5 sd of the genuine noise
    (the fakes' target support is deterministic: m for GRR, m r for unary and, with colliding seeds,
    for local hashing)."""
    p = _proto(name)
    values, genuine = _genuine(p, rng)
    targets = np.sort(rng.choice(K, R, replace=False))
    m = P.fake_count(N, beta)
    fake = P.craft_reports(p, "MGA", targets, m, rng)
    s_t = P.target_support(p, "MGA", R)
    assert p.support(fake)[targets].sum() == pytest.approx(m * s_t)
    before = p.estimate(p.support(genuine), N)
    after = p.estimate(p.support(np.concatenate([genuine, fake])), N + m)
    gain = P.frequency_gain(after, before, targets)
    f_t = float(np.isin(values, targets).mean())
    expected = P.expected_gain(p, beta, s_t, R, f_t)
    ps, qs = P.honest_law(p)
    b = m / (N + m)
    sd = b * math.sqrt(_target_sum_var(p, values, targets)) / (N * (ps - qs))
    assert abs(gain - expected) <= 5 * sd + 1e-9, (gain, expected, sd)


def test_the_closed_forms_are_cao_et_al():
    """expected_gain with s_T of MGA / RIA is Cao et al.'s closed forms for kRR, OUE and OLH."""
    eps, k, r, beta, f_t = 1.0, 50, 4, 0.05, 0.03
    e = math.exp(eps)
    grr, oue, olh = (estimators.make(x, k=k, eps=eps) for x in ("GRR", "OUE", "OLH"))
    assert P.expected_gain(grr, beta, P.target_support(grr, "MGA", r), r, f_t) == pytest.approx(
        beta * (1 - f_t) + beta * (k - r) / (e - 1))
    assert P.expected_gain(oue, beta, P.target_support(oue, "MGA", r), r, f_t) == pytest.approx(
        beta * (2 * r - f_t) + 2 * r * beta / (e - 1), rel=1e-8)
    ps, qs = P.honest_law(olh)  # OLH with the integer g = round(e^ε + 1) of the project
    assert P.expected_gain(olh, beta, P.target_support(olh, "MGA", r), r, f_t) == pytest.approx(
        beta * (r * (1 - qs) / (ps - qs) - f_t))
    for p in (grr, oue, olh):
        assert P.expected_gain(p, beta, P.target_support(p, "RIA", r), r, f_t) == pytest.approx(beta * (1 - f_t))


# ---------------------------------------------------------------- defense 1: plausible sizes
@pytest.mark.parametrize("name", ["OUE", "L-OSUE", "SUE"])
def test_honest_reports_pass_the_plausibility_check_at_the_stated_rate(name, rng):
    """(c) the exact false-rejection rate is at most α, and honest reports are rejected at that rate."""
    p = estimators.make(name, k=K, **(PROTOS.get(name) or dict(eps=1.0)))
    n = 200_000
    _, reports = _genuine(p, rng, n)
    for alpha in (0.05, 1e-3, P.DEFAULT_ALPHA):
        chk = P.plausibility_check(p, alpha)
        assert 0.0 <= chk.false_rejection <= alpha
        bad = int(P.implausible(p, reports, alpha).sum())
        assert bad == P.count_implausible(p, reports, alpha)
        mean = n * chk.false_rejection
        assert abs(bad - mean) <= 5 * math.sqrt(mean * (1 - chk.false_rejection)) + 1, (alpha, bad, mean)
    chk = P.plausibility_check(p)
    assert chk.lo <= P.honest_law(p)[0] + (K - 1) * P.honest_law(p)[1] <= chk.hi


def test_the_size_law_is_the_empirical_one(rng):
    p = _proto("L-OSUE")
    _, reports = _genuine(p, rng, 100_000)
    hist = np.bincount(P.set_bits(reports), minlength=K + 1) / 100_000
    law = P.support_size_law(p)
    assert law.sum() == pytest.approx(1.0)
    assert np.all(np.abs(hist - law) <= 5 * np.sqrt(law * (1 - law) / 100_000) + 1e-12)


def test_set_bits_kernel_counts_bits(rng):
    bits = rng.integers(0, 256, size=(1000, 7), dtype=np.uint8)
    assert np.array_equal(P.set_bits(bits), np.bitwise_count(bits).sum(axis=1))


def test_the_estimator_over_kept_reports_is_unbiased(rng):
    """A large α (5%) makes the size filter's bias visible; the kept-law estimator removes it."""
    p = estimators.make("OUE", k=10, eps=2.0)
    chk = P.plausibility_check(p, 0.05)
    f = np.array([0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.04, 0.03, 0.02, 0.01])
    kept, naive, reps, n = [], [], 30, 50_000
    for _ in range(reps):
        r = p.randomize(rng.choice(10, n, p=f), rng)
        ok = ~P.implausible(p, r, 0.05)
        c = p.support(r[ok])
        kept.append(chk.estimate(c, int(ok.sum())))
        naive.append(p.estimate(c, int(ok.sum())))
    kept, naive = np.array(kept), np.array(naive)
    se = kept.std(axis=0, ddof=1) / math.sqrt(reps)
    assert np.all(np.abs(kept.mean(axis=0) - f) <= 5 * se)
    assert np.max(np.abs(naive.mean(axis=0) - f) / se) > 10  # the naive estimator is visibly biased


# ---------------------------------------------------------------- defense 2: itemsets
def test_itemset_compensation_is_unbiased_on_honest_reports(rng):
    p = estimators.make("OUE", k=12, eps=1.0)
    ps, qs = P.honest_law(p)
    f = np.r_[0.3, 0.2, np.full(10, 0.05)]
    s = (0, 1, 5)
    est, reps, n = [], 30, 40_000
    for _ in range(reps):
        x = P.support_matrix(p, p.randomize(rng.choice(12, n, p=f), rng))
        keep = ~x[:, list(s)].all(axis=1)
        est.append(P.itemset_estimate(x[keep].sum(axis=0), int(keep.sum()), ps, qs, s))
    est = np.array(est)
    se = est.std(axis=0, ddof=1) / math.sqrt(reps)
    assert np.all(np.abs(est.mean(axis=0) - f) <= 5 * se)


def test_seed_conditional_estimate_is_unbiased_after_a_seed_selection(rng):
    p = estimators.make("OLH", k=15, eps=1.0)
    f = np.full(15, 0.5 / 14)
    f[7] = 0.5
    est, plain, reps, n = [], [], 20, 30_000
    for _ in range(reps):
        r = p.randomize(rng.choice(15, n, p=f), rng)
        h = P.hash_matrix(p, r)
        keep = h[:, 3] != h[:, 7]  # what detect_seed_itemset drops for the pair (3, 7)
        est.append(P.seed_conditional_estimate(p, r[keep]))
        plain.append(p.estimate(p.support(r[keep]), int(keep.sum())))
    est, plain = np.array(est), np.array(plain)
    se = est.std(axis=0, ddof=1) / math.sqrt(reps)
    assert np.all(np.abs(est.mean(axis=0) - f) <= 5 * se)
    assert abs(plain.mean(axis=0)[3] - f[3]) > 10 * se[3]  # the protocol's estimator is not


def test_collision_rates_are_the_hash_family_s(rng):
    """ρ(|i − j|) from the Monte Carlo row against direct counts over other random seeds and pairs."""
    k, g = 40, 4
    rho = P.collision_rates(k, g)
    seeds = rng.integers(0, 1 << 32, 200_000, dtype=np.uint32)
    for i, j in ((5, 12), (0, 39), (17, 18)):
        hit = np.mean(kernels.lh_hash_rows(seeds, np.full(seeds.size, i), g)
                      == kernels.lh_hash_rows(seeds, np.full(seeds.size, j), g))
        sd = math.sqrt(rho[j - i] * (1 - rho[j - i]) * (1 / seeds.size + 1 / P.COLLISION_SEEDS))
        assert abs(hit - rho[j - i]) <= 5 * sd


@pytest.mark.parametrize("name", ["OUE", "L-OSUE", "OLH"])
def test_no_false_alarm_on_honest_reports(name, rng):
    p = _proto(name)
    for _ in range(3):
        _, reports = _genuine(p, rng)
        d = P.defend(p, reports)
        assert d.itemset == () and d.dropped == 0
        plain = p.estimate(p.support(reports), N)
        np.testing.assert_allclose(d.estimate, plain, atol=1e-4)  # unary: the kept law differs by O(α)


@pytest.mark.parametrize("name", ["OUE", "L-OSUE", "OLH"])
def test_defended_gain_is_lower_for_mga(name, rng):
    """(b) the defenses remove MGA's gain (unary: padded MGA by the co-support itemset, MGA-nopad by
    the size check; local hashing: by the seed collisions), within the estimator's noise, and leave
    RIA's, which no report-level defense can see, untouched."""
    p = _proto(name)
    values, genuine = _genuine(p, rng)
    targets = np.sort(rng.choice(K, R, replace=False))
    before = p.estimate(p.support(genuine), N)
    noise = 5 * math.sqrt(R * p.variance(N) * 2)  # a few sd of a sum over the targets, with dropped reports
    attacks = ["MGA", "MGA-nopad", "RIA"] if P.family(p) == "unary" else ["MGA", "RIA"]
    for attack in attacks:
        m = P.fake_count(N, 0.05)
        fake = P.craft_reports(p, attack, targets, m, rng)
        reports = np.concatenate([genuine, fake])
        gain = P.frequency_gain(p.estimate(p.support(reports), N + m), before, targets)
        d = P.defend(p, reports)
        defended = P.frequency_gain(d.estimate, before, targets)
        if attack == "RIA":
            assert defended == pytest.approx(gain, abs=1e-3)
            continue
        assert gain > 0.3
        assert abs(defended) <= noise, (attack, gain, defended)
        assert (~d.kept[N:]).mean() > 0.9  # the fakes were dropped
        if attack == "MGA-nopad" and R < P.plausibility_check(p).lo:
            assert d.dropped_implausible >= m


def test_the_size_check_drops_unpadded_mga_reports(rng):
    """At k = 100, ε = 1 an honest OUE report sets 8 to 50 bits (α = 1e-6): MGA-nopad's 3 do not pass."""
    p = estimators.make("OUE", k=100, eps=1.0)
    assert P.plausibility_check(p).lo > R
    fake = P.craft_reports(p, "MGA-nopad", np.array([1, 2, 3]), 1000, rng)
    assert P.implausible(p, fake).all()
    padded = P.craft_reports(p, "MGA", np.array([1, 2, 3]), 1000, rng)
    assert not P.implausible(p, padded).any()  # Cao et al.'s MGA pads to the honest mean size


# ---------------------------------------------------------------- defense 3: the per-step score
def test_detection_score_is_standard_normal_on_honest_steps(rng):
    p = _proto("OUE")
    z = []
    for _ in range(60):
        _, reports = _genuine(p, rng, 5_000)
        z.append(P.detection_score(p, p.support(reports), 5_000))
    z = np.array(z)
    assert abs(z.mean()) <= 5 / math.sqrt(z.size)
    assert 0.6 <= z.std(ddof=1) <= 1.4  # ± 5 sd of a sample sd of 60 draws is about ± 0.46


def test_detection_score_flags_reports_of_an_implausible_size(rng):
    p = _proto("OUE")
    _, genuine = _genuine(p, rng)
    fake = P.craft_reports(p, "MGA-nopad", np.array([2, 3]), P.fake_count(N, 0.05), rng)
    reports = np.concatenate([genuine, fake])
    assert P.detection_score(p, p.support(reports), len(reports)) < -P.detection_threshold()
    assert P.detection_score(_proto("GRR"), np.ones(K), K) is None
    assert P.detection_score(_proto("OLH"), np.ones(K), K) is None


def test_plausibility_check_refuses_other_families():
    with pytest.raises(estimators.LDPError):
        P.plausibility_check(_proto("GRR"))
    assert P.count_implausible(_proto("GRR"), np.zeros(4, dtype=np.uint8)) == 0


def test_the_estimate_document_carries_the_step_score(rng):
    """stream_app.windows.build_estimate publishes the score (null for GRR) and its threshold; no services."""
    from stream_app.windows import build_estimate
    from wire.campaign import Campaign

    c = Campaign.from_dict({"campaign": {"id": "poison", "time_step_seconds": 60.0},
                            "attributes": [{"name": "u", "k": K, "protocol": "OUE", "eps": 1.0},
                                           {"name": "g", "k": K, "protocol": "GRR", "eps": 1.0}]})
    u, g = c.attribute("u"), c.attribute("g")
    _, reports = _genuine(u.protocol, rng, 5_000)
    counts = u.protocol.support(reports)
    doc = build_estimate(c, u, 0, {"n": 5_000, "counts": counts}, 1, final=True, trigger="watermark", now=0.0)
    assert doc["poisoning_score"] == pytest.approx(P.detection_score(u.protocol, counts, 5_000))
    assert doc["poisoning_threshold"] == pytest.approx(P.detection_threshold())
    doc = build_estimate(c, g, 0, {"n": 3, "counts": np.array([1, 2] + [0] * (K - 2))}, 1, final=True,
                         trigger="watermark", now=0.0)
    assert doc["poisoning_score"] is None


@pytest.mark.parametrize(("n", "p"), [(0, 0.3), (1, 0.3), (19, 0.2689), (299, 0.01), (4095, 0.4), (20000, 1e-3),
                                      (7, 0.0), (7, 1.0)])
def test_binomial_pmf_matches_scipy(n, p):
    """The plausibility check's binomial law (computed without scipy at a worker's start) is scipy's."""
    from scipy import stats

    ours, ref = P.binomial_pmf(n, p), stats.binom.pmf(np.arange(n + 1), n, p)
    assert ours.shape == (n + 1,)
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-15)
    assert ours.sum() == pytest.approx(1.0, abs=1e-12)


def test_normal_quantiles_match_scipy():
    from scipy import stats

    for alpha in (0.05, 1e-3, 1e-9):
        assert P.detection_threshold(alpha) == pytest.approx(float(stats.norm.isf(alpha / 2)), rel=1e-12)
