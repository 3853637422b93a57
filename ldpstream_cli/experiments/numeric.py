"""``ldp experiment numeric``: the numeric mechanisms of :mod:`estimators.numeric` against the claims of their
papers, on synthetic data and on real numeric columns (Adult's, or a CSV file's: ``--dataset``).

* **Data** (``--dataset``, loaded by :func:`.datasets.load_numeric`). ``adult`` (the default): the synthetic
  populations and Adult's ``age`` and ``hours-per-week`` (``adult-age``, ``adult-hours``: UCI's training
  file ``adult.data.gz``, rows with a missing value "?" removed, 30,161; the full run stops with exit 2
  without the file, ``--quick`` runs the synthetic data only and says so); ``syn``: the synthetic populations
  only (no file read); a CSV path: the synthetic populations and the file's numeric columns (``--columns``,
  default every numeric one; rows with an empty or "?" cell dropped), each a data set named after its
  column, range its min and max. The folder of Adult's file is ``--data-dir``, else ``$LDP_DATA_DIR``, else
  ``../shared/data`` next to the repository (:func:`.datasets.resolve_data_dir`). Real columns longer than
  ``n`` (30,161; quick 1,000) are sampled to ``n`` rows. ``config.json`` records ``dataset`` and the rows
  read and kept (``data_note``).
* **Mean (MSE against ε).** Laplace, Duchi, PM and HM (Wang, Xiao, Yang, Zhao, Hu, Cho, Shin & Xiao, ICDE
  2019; below "Wang et al.") estimate the mean of a fixed population: uniform and skewed (Beta(5, 2))
  synthetic values, and the real columns. Each repetition randomizes every device once (fresh noise) and
  estimates through the server's path (``support`` then ``estimate_from_support``); the MSE of the
  unit-domain mean (values mapped to ``[-1, 1]``, the papers' normalization) sits next to the implemented
  law's variance (``mean_variance``) and the papers' formulas (Laplace ``8/ε²``, Duchi ``B² - x²``, PM and
  HM of Wang et al., §III, averaged over the data).
* **Worst case.** The same at the two inputs where the variances peak (every device at the midpoint,
  ``x = 0``: Duchi's worst case; every device at an end, ``x = ±1``: PM's): the measured worst-case variance
  of each mechanism against Wang et al.'s claim that PM's is below Duchi's above ε ≈ 1.29 and the claim of
  the survey of Wang, Zhang, Feng & Yang (Sensors 2020, Eq. 63 and Table IX) that HM's is never above either.
  On data the crossover of PM and Duchi depends on ``E[x²]`` only (both variances are linear in ``x²``):
  from ε* ≈ 0.61 (all values at the midpoint) up, PM never winning for values at the ends; the experiment
  computes each data set's crossover from the implemented laws and checks the measured ordering against it.
* **Distribution (Wasserstein).** Square Wave with EMS (Li, Wang, Lopuhaä-Zwakenberg, Li & Škorić, SIGMOD
  2020) against two histograms from PM's reports on the same data: PM's cells binned to the same ``d``
  output buckets and reconstructed by the same EMS over the exact transition matrix of PM's implemented law
  ("PM+EMS"), and binned and debiased by inverting that matrix, made consistent by Norm-Sub (Wang,
  Lopuhaä-Zwakenberg, Li, Škorić & Li, NDSS 2020; "PM debiased"). The metric is the Wasserstein distance W1
  between the estimate (each grid point's mass spread over its cell, as the library's quantiles do) and the
  devices' values on ``[0, 1]``; ``w1_floor`` is that of the exact expected rounding of the values to the grid.
* **1BitMean over 100 collections** (Ding, Kulkarni & Yekhanin, NeurIPS 2017): devices whose value is redrawn
  with probability ``p_change`` per collection report every collection with α-point rounding and
  memoization (one memo state kept) or as fresh devices each time (re-randomizing); the longitudinal loss
  comes from the mechanism's accounting (``state_loss``: ``ε_memo`` per distinct rounded point) against
  ``collections × eps_first`` by composition, and the MSE of every collection's mean from both.

Every ordering is checked with a tolerance of ``sigmas`` standard errors of the repetitions (``checks.csv``;
the MSE of ``r`` repetitions of a Gaussian error has relative standard error ``sqrt(2/r)``; W1 uses the
sample standard deviation over its repetitions); the MSE against the variance at the same two-sided level of
the exact χ² law of ``r × MSE / variance`` (:func:`chi2_z`). The command exits 1 when one fails, after writing
every file.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Optional, Sequence

import numpy as np
import typer

from estimators.errors import LDPError
from estimators.numeric import make_numeric
from estimators.numeric.piecewise import HM, duchi_paper_variance, pm_paper_variance
from estimators.numeric.square_wave import SW

from ..terminal import print_table
from .datasets import ADULT_NUMERIC, DatasetError, DatasetNotFound, load_numeric, resolve_data_dir
from .runner import (OutOption, QuickOption, Run, SeedOption, WorkersOption, child_seeds, console, floats, pyplot,
                     run_tasks, save_figure, split_names)

MEAN_MECHANISMS = ("Laplace", "Duchi", "PM", "HM")
SYNTHETIC = ("uniform", "skewed")
WORST_INPUTS = ("mid", "ends")
#: the crossover row of the worst-case inputs (``crossover.csv``)
WORST_CASE = "worst case"
#: names a CSV column may not have (the experiment's own populations)
RESERVED = (*SYNTHETIC, *WORST_INPUTS, WORST_CASE)
W1_METHODS = ("SW+EMS", "PM+EMS", "PM debiased")
#: rows of adult.data without a missing value ("?"): the synthetic populations have as many devices
ADULT_ROWS = 30_161
#: reports randomized per call (repetitions are batched up to this many reports)
BATCH = 1 << 21


@dataclass(frozen=True)
class Config:
    """Parameters of one run (full-size defaults)."""

    n: int = ADULT_ROWS
    eps: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0)
    reps: int = 1000
    laplace_share: float = 0.1
    worst_n: int = 1000
    worst_reps: int = 10_000
    w_eps: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 4.0)
    w_d: int = 256
    w_reps: int = 20
    onebit_eps: float = 1.0
    onebit_s: int = 16
    onebit_n: int = 10_000
    onebit_reps: int = 50
    collections: int = 100
    p_change: tuple[float, ...] = (0.0, 0.01, 0.1, 1.0)
    #: "adult" (the synthetic populations and Adult's two columns), "syn" (synthetic only) or a CSV path
    dataset: str = "adult"
    columns: tuple[str, ...] = ()  # the CSV's columns (default: every numeric one)
    data_dir: str = ""  # "" : resolve_data_dir (LDP_DATA_DIR, else ../shared/data)
    sigmas: float = 4.0
    seed: int = 0
    workers: int | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> "Config":
        """A CI-sized run (a few seconds, in this process): few devices, many repetitions (the orderings'
        power depends on the repetitions only), four ε."""
        quick = {"n": 1000, "eps": (0.5, 1.0, 2.0, 4.0), "reps": 300, "worst_n": 200, "worst_reps": 1000,
                 "w_eps": (1.0, 4.0), "w_d": 32, "w_reps": 20, "onebit_n": 1000, "onebit_reps": 10,
                 "p_change": (0.0, 0.1, 1.0), "workers": 1}
        return cls(**{**quick, **{k: v for k, v in overrides.items() if v is not None or k != "workers"}})


# ====================================================================== data
@dataclass(frozen=True)
class Dataset:
    """A fixed population of values in ``[lo, hi]`` (metric units)."""

    name: str
    values: np.ndarray
    lo: float
    hi: float
    note: str


def datasets(config: Config, required: bool) -> tuple[list[Dataset], str]:
    """The populations of the mean and Wasserstein parts, and a note on the real data. Synthetic: ``n`` values on
    ``[0, 1]``; real (``config.dataset``: Adult's ``age`` and ``hours-per-week`` or a CSV file's numeric columns,
    :func:`.datasets.load_numeric`): every complete row, or a random sample of ``n`` when there are more, range the
    column's min and max. Without Adult's file: an error if ``required``, else the synthetic data sets only, and
    the note says so."""
    seeds = child_seeds(config.seed, "numeric-data", 3)
    uni = np.random.default_rng(seeds[0]).uniform(0.0, 1.0, config.n)
    skew = np.random.default_rng(seeds[1]).beta(5.0, 2.0, config.n)
    out = [Dataset("uniform", uni, 0.0, 1.0, f"U(0, 1), n = {config.n:,}"),
           Dataset("skewed", skew, 0.0, 1.0, f"Beta(5, 2) on [0, 1], n = {config.n:,}")]
    if config.dataset == "syn":
        return out, "synthetic data only (--dataset syn)"
    adult = config.dataset == "adult"
    try:
        real = load_numeric(config.dataset, config.data_dir or None, config.columns)
    except DatasetNotFound as exc:
        if required or not adult:
            raise
        return out, f"Adult skipped: {exc}"
    clash = [c for c in real.values if c in RESERVED]
    if clash:
        raise DatasetError(f"{config.dataset}: column {', '.join(map(repr, clash))} has the name of one of the "
                           f"experiment's own populations ({', '.join(RESERVED)}); rename it or pick others with "
                           "--columns")
    kept = real.n
    sample = None
    if config.n < kept:
        sample = np.sort(np.random.default_rng(seeds[2]).choice(kept, size=config.n, replace=False))
    for name, col in real.values.items():
        vals = col if sample is None else col[sample]
        lo, hi = real.lo[name], real.hi[name]
        what = f"Adult {ADULT_NUMERIC[name]}" if adult else f"{Path(config.dataset).name} {name}"
        out.append(Dataset(name, vals, lo, hi, f"{what} in [{lo:g}, {hi:g}], n = {vals.shape[0]:,}"))
    used = f"all {kept:,}" if sample is None else f"a random {config.n:,} of the {kept:,}"
    return out, f"{real.note}; {used} used"


def worst_inputs(n: int) -> list[Dataset]:
    """Every device at the midpoint (unit ``x = 0``) or at the ends (``x = ±1``, half each), on ``[0, 1]``."""
    ends = np.where(np.arange(n) % 2 == 0, 0.0, 1.0)
    mid, ends_name = WORST_INPUTS
    return [Dataset(mid, np.full(n, 0.5), 0.0, 1.0, "every device at x = 0"),
            Dataset(ends_name, ends, 0.0, 1.0, "half the devices at x = -1, half at x = +1")]


# ====================================================================== analytical variances
def paper_unit_variance(mech: str, x: np.ndarray, eps: float) -> np.ndarray:
    """One report's variance at unit inputs ``x`` by the papers' formulas: Laplace ``8/ε²`` (survey, Table
    IX), Duchi ``B² - x²``, PM and HM (Wang et al., §III-B and §III-C)."""
    x = np.asarray(x, dtype=np.float64)
    if mech == "Laplace":
        return np.full(x.shape, 8.0 / eps ** 2)
    if mech == "Duchi":
        return duchi_paper_variance(x, eps)
    if mech == "PM":
        return pm_paper_variance(x, eps)
    return HM(eps).paper_variance(x)


def paper_worst_variance(mech: str, eps: float) -> float:
    """The papers' worst case over the inputs: ``8/ε²``, ``B²`` (x = 0), ``4a / (3 (a - 1)²)`` (x = ±1) and
    HM's (survey, Eq. 63)."""
    if mech == "Laplace":
        return 8.0 / eps ** 2
    if mech == "Duchi":
        return float(duchi_paper_variance(0.0, eps))
    if mech == "PM":
        return float(pm_paper_variance(1.0, eps))
    return HM.paper_worst_variance(eps)


def _root(f, lo: float, hi: float) -> float:
    """The root of ``f`` on ``[lo, hi]`` (brentq); ``nan`` when ``f`` has the same sign at both ends."""
    from scipy.optimize import brentq

    a, b = f(lo), f(hi)
    if a == 0.0:
        return lo
    if a * b > 0:
        return math.nan
    return float(brentq(f, lo, hi, xtol=1e-10))


def worst_crossover_paper() -> float:
    """ε where PM's worst-case variance (paper) equals Duchi's: Wang et al.'s ε ≈ 1.29."""
    return _root(lambda e: paper_worst_variance("PM", e) - paper_worst_variance("Duchi", e), 0.3, 5.0)


def worst_crossover_implemented() -> float:
    """The same for the implemented laws (PM's cells at x = ±1, Duchi's at x = 0)."""
    return _root(lambda e: (make_numeric("PM", eps=e).unit_variance(1.0)
                            - make_numeric("Duchi", eps=e).unit_variance(0.0)), 0.3, 5.0)


def data_crossover(ds: Dataset) -> tuple[float, float]:
    """``(implemented, paper)``: the ε above which PM's variance of the mean of ``ds`` is below Duchi's
    (``nan`` where PM never wins below ε = 30; both variances are linear in ``E[x²]``)."""
    def impl(e: float) -> float:
        pm = make_numeric("PM", eps=e, lo=ds.lo, hi=ds.hi)
        return pm.mean_variance(ds.values) - make_numeric("Duchi", eps=e, lo=ds.lo, hi=ds.hi).mean_variance(ds.values)

    x = 2.0 * (ds.values - ds.lo) / (ds.hi - ds.lo) - 1.0
    m2 = float(np.mean(x * x))
    paper = _root(lambda e: m2 * (1.0 / math.expm1(e / 2.0) + 1.0) + float(pm_paper_variance(0.0, e))
                  - float(duchi_paper_variance(0.0, e)), 0.05, 30.0)
    return _root(impl, 0.05, 30.0), paper


# ====================================================================== tasks
@dataclass(frozen=True)
class MeanTask:
    """``reps`` repetitions of one mechanism at one ε on one population."""

    dataset: str
    kind: str  # "data" or "worst"
    mech: str
    eps: float
    values: np.ndarray
    lo: float
    hi: float
    reps: int
    seed: np.random.SeedSequence


@dataclass(frozen=True)
class W1Task:
    """``reps`` repetitions of SW+EMS and of PM's two histograms at one ε on one population."""

    dataset: str
    eps: float
    values: np.ndarray
    lo: float
    hi: float
    d: int
    reps: int
    seed: np.random.SeedSequence


@dataclass(frozen=True)
class OneBitTask:
    """One repetition of the 100 collections at one ``p_change``."""

    p_change: float
    rep: int
    seed: np.random.SeedSequence
    config: Config


def simulate(task: MeanTask | W1Task | OneBitTask) -> dict[str, Any]:
    """Run one task (the runner's entry point)."""
    if isinstance(task, MeanTask):
        return simulate_mean(task)
    if isinstance(task, W1Task):
        return simulate_w1(task)
    return simulate_onebit(task)


def simulate_mean(task: MeanTask) -> dict[str, Any]:
    """The squared errors of the unit-domain mean over the repetitions (each one fresh randomization of every
    device, estimated by ``support`` and ``estimate_from_support``), and the variances."""
    mech = make_numeric(task.mech, eps=task.eps, lo=task.lo, hi=task.hi)
    rng = np.random.default_rng(task.seed)
    values = np.asarray(task.values, dtype=np.float64)
    n = values.shape[0]
    scale = (task.hi - task.lo) / 2.0
    truth = float(np.mean(values))
    errors = np.empty(task.reps)
    est_var = np.empty(task.reps)
    per_call = max(1, BATCH // n)
    done = 0
    while done < task.reps:
        b = min(per_call, task.reps - done)
        reports = mech.randomize(np.tile(values, b), rng=rng)
        for j in range(b):
            est = mech.estimate_from_support(mech.support(reports[j * n:(j + 1) * n]), n)
            errors[done + j] = (est.mean - truth) / scale
            est_var[done + j] = est.variance / scale ** 2
        done += b
    x, _ = mech.prepare(values)
    sq = errors ** 2
    return {"dataset": task.dataset, "kind": task.kind, "mechanism": task.mech, "eps": task.eps, "n": n,
            "reps": task.reps, "mse": float(sq.mean()),
            "mse_sd_empirical": float(sq.std(ddof=1)) if task.reps > 1 else math.nan,
            "mean_error": float(errors.mean()), "estimated_variance": float(est_var.mean()),
            "variance": mech.mean_variance(values) / scale ** 2,
            "paper_variance": float(np.mean(paper_unit_variance(task.mech, x, task.eps))) / n,
            "m2": float(np.mean(x * x)), "eps_first": mech.eps_first, "scale": scale}


def pm_transition(pm: Any, d: int) -> np.ndarray:
    """``T`` (``d × d``): ``T[j, i] = P[PM's cell in output bucket j | grid point i]``, exact; the ``M`` cells
    in ``d`` equal buckets, grid point ``i`` the unit input ``2i/(d-1) - 1``."""
    if pm.m % d:
        raise LDPError(f"the W1 buckets d = {d} must divide PM's {pm.m} cells (a power of two)")
    grid = 2.0 * np.arange(d) / (d - 1) - 1.0
    return np.stack([pm.cell_mass(float(x)).reshape(d, -1).sum(axis=1) for x in grid], axis=1)


def ems_dense(t: np.ndarray, counts: np.ndarray, tol: float = 1e-9, max_iter: int = 10_000) -> np.ndarray:
    """EMS (Li et al., §5) over a dense transition matrix: the EM step, the binomial smoothing of
    :meth:`SW.smooth`, and :meth:`SW.ems`'s stopping rule (relative change of the log-likelihood)."""
    theta = np.full(t.shape[1], 1.0 / t.shape[1])
    p = t @ theta
    ll = float(counts @ np.log(p))
    for _ in range(max_iter):
        theta = theta * (t.T @ (counts / p))
        theta = SW.smooth((theta / theta.sum())[None, :])[0]
        theta /= theta.sum()
        p = t @ theta
        ll_new = float(counts @ np.log(p))
        if abs(ll_new - ll) <= tol * abs(ll):
            break
        ll = ll_new
    return theta


def norm_sub(theta: np.ndarray) -> np.ndarray:
    """Norm-Sub (Wang et al., NDSS 2020): ``max(θ - δ, 0)`` with the ``δ`` that makes it sum to one."""
    s = np.sort(theta)[::-1]
    cs = np.cumsum(s) - 1.0
    k = np.arange(1, s.shape[0] + 1)
    rho = int(np.nonzero(s - cs / k > 0)[0][-1])
    return np.maximum(theta - cs[rho] / (rho + 1), 0.0)


def w1(theta: np.ndarray, truth: np.ndarray) -> float:
    """W1 on ``[0, 1]`` between a histogram over the grid ``i/(d-1)`` (each mass uniform over its cell
    ``[v_i - h/2, v_i + h/2] ∩ [0, 1]``) and the sorted values ``truth``, exactly: ``∫ |F - G|``, ``F``
    piecewise linear, ``G`` a step function."""
    d = theta.shape[0]
    edges = np.concatenate([[0.0], (np.arange(d - 1) + 0.5) / (d - 1), [1.0]])
    cdf = np.concatenate([[0.0], np.cumsum(theta / theta.sum())])
    b = np.unique(np.concatenate([edges, truth]))
    g = np.searchsorted(truth, b[:-1], side="right") / truth.shape[0]
    g0, g1 = np.interp(b[:-1], edges, cdf) - g, np.interp(b[1:], edges, cdf) - g
    w = np.diff(b)
    same = g0 * g1 >= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        cross = (g0 * g0 + g1 * g1) / (2.0 * (np.abs(g0) + np.abs(g1)))
    return float(np.sum(w * np.where(same, (np.abs(g0) + np.abs(g1)) / 2.0, cross)))


def rounded(truth: np.ndarray, d: int) -> np.ndarray:
    """The expected randomized rounding of values of ``[0, 1]`` to the grid ``i/(d-1)``: what a perfect
    estimate over the grid is."""
    t = truth * (d - 1)
    i0 = np.clip(np.floor(t).astype(np.int64), 0, d - 2)
    f = t - i0
    return np.bincount(i0, weights=1.0 - f, minlength=d) + np.bincount(i0 + 1, weights=f, minlength=d)


def simulate_w1(task: W1Task) -> dict[str, Any]:
    """W1 of SW+EMS, PM+EMS and PM debiased over the repetitions (fresh reports each)."""
    rng = np.random.default_rng(task.seed)
    values = np.asarray(task.values, dtype=np.float64)
    n, d = values.shape[0], task.d
    sw = SW(task.eps, task.lo, task.hi, d_in=d, d_out=d)
    pm = make_numeric("PM", eps=task.eps, lo=task.lo, hi=task.hi)
    t = pm_transition(pm, d)
    t_inv = np.linalg.pinv(t)
    truth = np.sort((values - task.lo) / (task.hi - task.lo))
    out: dict[str, list[float]] = {m: [] for m in W1_METHODS}
    for _ in range(task.reps):
        out["SW+EMS"].append(w1(sw.estimate_distribution(sw.support(sw.randomize(values, rng=rng)), n), truth))
        cells = pm.randomize(values, rng=rng).astype(np.int64)
        counts = np.bincount(cells * d // pm.m, minlength=d).astype(np.float64)
        out["PM+EMS"].append(w1(ems_dense(t, counts), truth))
        out["PM debiased"].append(w1(norm_sub(t_inv @ (counts / n)), truth))
    return {"dataset": task.dataset, "eps": task.eps, "n": n, "d": d, "reps": task.reps, "w1": out,
            "w1_floor": w1(rounded(truth, d), truth)}


def simulate_onebit(task: OneBitTask) -> dict[str, Any]:
    """``collections`` collections of ``onebit_n`` devices (values redrawn from U(0, 1) with probability
    ``p_change`` each collection): memoized reports (one memo state) and fresh devices each time."""
    c = task.config
    mech = make_numeric("1BitMean", eps=c.onebit_eps, lo=0.0, hi=1.0, s=c.onebit_s)
    rng = np.random.default_rng(task.seed)
    n = c.onebit_n
    values = rng.uniform(0.0, 1.0, n)
    state = mech.new_state(n, rng)
    changes = np.zeros(n, dtype=np.int64)
    sq_memo = sq_fresh = variance = 0.0
    marks = {1, 2, 5, *range(10, c.collections + 1, 10), c.collections}
    curve = []
    for t in range(1, c.collections + 1):
        if t > 1:
            moved = rng.random(n) < task.p_change
            values = np.where(moved, rng.uniform(0.0, 1.0, n), values)
            changes += moved
        truth = 2.0 * float(values.mean()) - 1.0  # unit domain (scale 1/2)
        memo = mech.estimate_from_support(mech.support(mech.randomize(values, rng=rng, state=state)), n)
        fresh = mech.estimate_from_support(mech.support(mech.randomize(values, rng=rng)), n)
        sq_memo += (2.0 * memo.mean - 1.0 - truth) ** 2
        sq_fresh += (2.0 * fresh.mean - 1.0 - truth) ** 2
        variance += 4.0 * mech.mean_variance(values)
        if t in marks:
            loss = mech.state_loss(state)
            curve.append((t, float(loss.mean()), float(loss.max())))
    loss = mech.state_loss(state)
    static = changes == 0
    return {"p_change": task.p_change, "rep": task.rep, "mse_memo": sq_memo / c.collections,
            "mse_fresh": sq_fresh / c.collections, "variance": variance / c.collections,
            "loss_mean": float(loss.mean()), "loss_max": float(loss.max()),
            "static_devices": int(static.sum()),
            "static_loss_min": float(loss[static].min()) if static.any() else math.nan,
            "static_loss_max": float(loss[static].max()) if static.any() else math.nan,
            "mean_changes": float(changes.mean()), "mean_points": float(state.memoized_count().mean()),
            "eps_memo": mech.eps_memo, "eps_first": mech.eps_first, "memo_size": mech.memo_size, "curve": curve}


def tasks_for(config: Config, data: list[Dataset]) -> list[MeanTask | W1Task | OneBitTask]:
    """Every task of a run, the slowest (Laplace's exact sampler, W1's EMS) first."""
    specs: list[tuple] = []
    for ds in data:
        for e in config.eps:
            for m in MEAN_MECHANISMS:
                specs.append((ds, "data", m, e, config.reps))
    for ds in worst_inputs(config.worst_n):
        for e in config.eps:
            for m in MEAN_MECHANISMS:
                specs.append((ds, "worst", m, e, config.worst_reps))
    seeds = child_seeds(config.seed, "numeric-mean", len(specs))
    tasks: list[Any] = []
    for (ds, kind, m, e, reps), s in zip(specs, seeds):
        r = max(2, round(reps * config.laplace_share)) if m == "Laplace" else reps
        tasks.append(MeanTask(ds.name, kind, m, e, ds.values, ds.lo, ds.hi, r, s))
    w_specs = [(ds, e) for ds in data for e in config.w_eps]
    for (ds, e), s in zip(w_specs, child_seeds(config.seed, "numeric-w1", len(w_specs))):
        tasks.append(W1Task(ds.name, e, ds.values, ds.lo, ds.hi, config.w_d, config.w_reps, s))
    o_specs = [(p, r) for p in config.p_change for r in range(config.onebit_reps)]
    for (p, r), s in zip(o_specs, child_seeds(config.seed, "numeric-1bit", len(o_specs))):
        tasks.append(OneBitTask(p, r, s, config))
    cost = {"Laplace": 0, "W1": 1}
    return sorted(tasks, key=lambda t: cost.get(getattr(t, "mech", "W1" if isinstance(t, W1Task) else ""), 2))


# ====================================================================== summaries
def _se(mse: float, reps: int) -> float:
    """Standard error of the mean of ``reps`` squared Gaussian errors of variance ``mse``."""
    return mse * math.sqrt(2.0 / reps)


def chi2_z(mse: float, variance: float, reps: int) -> float:
    """The deviation of a mean of ``reps`` squared Gaussian errors of variance ``variance`` from it, as the
    Gaussian z of the same two-sided p-value (``reps × mse / variance`` is χ² with ``reps`` degrees of
    freedom: exact for the skewed distribution of an MSE over few repetitions)."""
    from scipy.stats import chi2, norm

    q = reps * mse / variance
    p = 2.0 * min(chi2.cdf(q, reps), chi2.sf(q, reps))
    return math.copysign(float(norm.isf(min(p, 1.0) / 2.0)), q - reps)


def summarize_mean(results: list[dict]) -> list[dict]:
    rows = []
    for r in results:
        se = _se(r["mse"], r["reps"])
        z = (r["mse"] - r["variance"]) / _se(r["variance"], r["reps"])
        rows.append({k: r[k] for k in ("dataset", "kind", "mechanism", "eps", "n", "reps", "mse")}
                    | {"mse_se": se, "mse_sd_empirical": r["mse_sd_empirical"], "variance": r["variance"],
                       "paper_variance": r["paper_variance"], "mse_over_variance": r["mse"] / r["variance"], "z": z,
                       "z_chi2": chi2_z(r["mse"], r["variance"], r["reps"]),
                       "n_mse": r["n"] * r["mse"], "n_variance": r["n"] * r["variance"],
                       "n_paper_variance": r["n"] * r["paper_variance"], "mean_error": r["mean_error"],
                       "estimated_variance": r["estimated_variance"], "m2": r["m2"], "eps_first": r["eps_first"],
                       "mse_metric": r["mse"] * r["scale"] ** 2})
    order = {m: i for i, m in enumerate(MEAN_MECHANISMS)}
    return sorted(rows, key=lambda r: (r["kind"], r["dataset"], r["eps"], order[r["mechanism"]]))


def worst_rows(mean: list[dict], config: Config) -> list[dict]:
    """Per (mechanism, ε): the measured worst case (the MSE at the input where the implemented variance is
    largest, ``mid`` or ``ends``), per report (``n ×``), next to the papers' worst case."""
    cell = {(r["dataset"], r["mechanism"], r["eps"]): r for r in mean if r["kind"] == "worst"}
    rows = []
    for e in config.eps:
        for m in MEAN_MECHANISMS:
            a, b = cell[("mid", m, e)], cell[("ends", m, e)]
            w = a if a["variance"] >= b["variance"] else b
            rows.append({"mechanism": m, "eps": e, "worst_input": w["dataset"], "n": w["n"], "reps": w["reps"],
                         "n_mse": w["n_mse"], "n_mse_se": w["n"] * w["mse_se"], "n_variance": w["n_variance"],
                         "paper_worst": paper_worst_variance(m, e), "mse": w["mse"], "mse_se": w["mse_se"],
                         "n_mse_mid": a["n_mse"], "n_mse_ends": b["n_mse"]})
    return rows


def interpolated_crossover(xs: list[float], ratio: list[float]) -> float:
    """ε where ``ratio`` (PM / Duchi) crosses 1, linear in log ratio between the grid points (first
    crossing downwards; ``nan`` if none)."""
    for (x0, r0), (x1, r1) in zip(zip(xs, ratio), zip(xs[1:], ratio[1:])):
        if r0 >= 1.0 > r1:
            l0, l1 = math.log(r0), math.log(r1)
            return x0 + (x1 - x0) * l0 / (l0 - l1)
    return math.nan


def summarize_w1(results: list[dict], names: Sequence[str]) -> list[dict]:
    """One row per (data set, ε), the data sets in the order of ``names``."""
    rows = []
    for r in sorted(results, key=lambda r: (list(names).index(r["dataset"]), r["eps"])):
        row: dict[str, Any] = {"dataset": r["dataset"], "eps": r["eps"], "n": r["n"], "d": r["d"], "reps": r["reps"],
                               "w1_floor": r["w1_floor"]}
        for m in W1_METHODS:
            a = np.asarray(r["w1"][m])
            key = m.replace("+", "_").replace(" ", "_").lower()
            row[f"w1_{key}"] = float(a.mean())
            row[f"w1_{key}_se"] = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else math.nan
        for other in ("pm_ems", "pm_debiased"):
            se = math.hypot(row["w1_sw_ems_se"], row[f"w1_{other}_se"])
            row[f"z_sw_vs_{other}"] = (row["w1_sw_ems"] - row[f"w1_{other}"]) / se if se > 0 else math.nan
        rows.append(row)
    return rows


def summarize_onebit(results: list[dict], config: Config) -> tuple[list[dict], list[dict]]:
    groups: dict[float, list[dict]] = defaultdict(list)
    for r in results:
        groups[r["p_change"]].append(r)
    rows, curves = [], []
    for p in config.p_change:
        reps = groups[p]
        f = reps[0]
        k = len(reps)
        static = [r for r in reps if r["static_devices"]]
        var = float(np.mean([r["variance"] for r in reps]))
        rows.append({"p_change": p, "reps": k, "n": config.onebit_n, "collections": config.collections,
                     "eps": config.onebit_eps, "s": config.onebit_s, "eps_first": f["eps_first"],
                     "eps_memo": f["eps_memo"], "memo_bound": f["memo_size"] * f["eps_memo"],
                     "rerandomize_loss": config.collections * f["eps_first"],
                     "memo_loss_mean": float(np.mean([r["loss_mean"] for r in reps])),
                     "memo_loss_max": float(max(r["loss_max"] for r in reps)),
                     "static_devices": float(np.mean([r["static_devices"] for r in reps])),
                     "static_loss_min": min((r["static_loss_min"] for r in static), default=math.nan),
                     "static_loss_max": max((r["static_loss_max"] for r in static), default=math.nan),
                     "mean_changes": float(np.mean([r["mean_changes"] for r in reps])),
                     "mean_points": float(np.mean([r["mean_points"] for r in reps])),
                     "mse_memo": float(np.mean([r["mse_memo"] for r in reps])),
                     "mse_fresh": float(np.mean([r["mse_fresh"] for r in reps])), "variance": var,
                     # memoized errors may be fully correlated across collections; fresh ones are independent
                     "mse_memo_se": _se(var, k), "mse_fresh_se": _se(var, k * config.collections),
                     **{f"mse_{m}_se_empirical": float(np.std([r[f"mse_{m}"] for r in reps], ddof=1) / math.sqrt(k))
                        if k > 1 else math.nan for m in ("memo", "fresh")}})
        for i, (t, _, _) in enumerate(f["curve"]):
            curves.append({"p_change": p, "t": t,
                           "memo_loss_mean": float(np.mean([r["curve"][i][1] for r in reps])),
                           "memo_loss_max": float(max(r["curve"][i][2] for r in reps)),
                           "rerandomize_loss": t * f["eps_first"]})
    return rows, curves


# ====================================================================== checks
def check(claim: str, where: str, statistic: float, bound: float, holds: bool, source: str) -> dict[str, Any]:
    return {"claim": claim, "where": where, "statistic": statistic, "bound": bound, "holds": bool(holds),
            "source": source}


def checks(config: Config, mean: list[dict], worst: list[dict], cross: list[dict], w1_rows: list[dict],
           onebit: list[dict], x_paper: float, x_impl: float) -> list[dict]:
    """Every claim as rows of ``checks.csv``: ``statistic <= bound`` (or the stated comparison) holds."""
    z = config.sigmas
    out = []
    wang, survey = "Wang et al., ICDE 2019", "Wang, Zhang, Feng & Yang, Sensors 2020"
    for r in mean:
        out.append(check("MSE = variance of the implemented law", f"{r['dataset']} {r['mechanism']} ε={r['eps']:g}",
                         abs(r["z_chi2"]), z, abs(r["z_chi2"]) <= z, "library"))
    out.append(check("worst-case crossover of PM and Duchi ≈ 1.29", "paper formulas", x_paper, 1.29,
                     round(x_paper, 2) == 1.29, wang))
    out.append(check("worst-case crossover of PM and Duchi ≈ 1.29", "implemented laws", abs(x_impl - x_paper), 0.01,
                     abs(x_impl - x_paper) <= 0.01, wang))
    wc = {(r["mechanism"], r["eps"]): r for r in worst}

    def diff(a: dict, b: dict) -> tuple[float, float]:
        return a["mse"] - b["mse"], math.hypot(a["mse_se"], b["mse_se"])

    for e in config.eps:
        pm, du, hm = wc[("PM", e)], wc[("Duchi", e)], wc[("HM", e)]
        dd, se = diff(pm, du)
        if e > x_paper:
            out.append(check("worst case: PM not above Duchi above ε ≈ 1.29", f"ε={e:g}", dd / se, z, dd <= z * se,
                             wang))
        else:
            out.append(check("worst case: Duchi not above PM below ε ≈ 1.29", f"ε={e:g}", -dd / se, z, -dd <= z * se,
                             wang))
        best = min((pm, du), key=lambda r: r["n_variance"])
        dh, se = diff(hm, best)
        out.append(check("worst case: HM not above min(PM, Duchi)", f"ε={e:g} (vs {best['mechanism']})", dh / se, z,
                         dh <= z * se, survey))
    top = max(config.eps)
    dd, se = diff(wc[("PM", top)], wc[("Duchi", top)])
    out.append(check("worst case: PM significantly below Duchi at the largest ε", f"ε={top:g}", dd / se, -z,
                     dd < -z * se, wang))
    grid = np.linspace(0.05, 10.0, 400)
    gap = max(paper_worst_variance("HM", e) / min(paper_worst_variance("PM", e), paper_worst_variance("Duchi", e))
              for e in grid)
    out.append(check("worst case: HM ≤ min(PM, Duchi), formulas", "ε in [0.05, 10], 400 points", gap, 1.0,
                     gap <= 1.0 + 1e-12, survey))
    cell = {(r["dataset"], r["mechanism"], r["eps"]): r for r in mean if r["kind"] == "data"}
    for c in cross:
        if c["dataset"] == WORST_CASE:
            continue
        for e in config.eps:
            pm, du, hm = (cell[(c["dataset"], m, e)] for m in ("PM", "Duchi", "HM"))
            dd, se = diff(pm, du)
            xc = c["eps_crossover"]
            if not math.isnan(xc) and e > xc:
                out.append(check("data: PM not above Duchi above the data's crossover", f"{c['dataset']} ε={e:g}",
                                 dd / se, z, dd <= z * se, wang))
            else:
                out.append(check("data: Duchi not above PM below the data's crossover", f"{c['dataset']} ε={e:g}",
                                 -dd / se, z, -dd <= z * se, wang))
            worse = max((pm, du), key=lambda r: r["variance"])
            dh, se = diff(hm, worse)
            out.append(check("data: HM never worse than both PM and Duchi", f"{c['dataset']} ε={e:g}", dh / se, z,
                             dh <= z * se, survey))
    for r in w1_rows:
        where = f"{r['dataset']} ε={r['eps']:g}"
        out.append(check("W1: SW+EMS significantly below PM debiased", where, r["z_sw_vs_pm_debiased"], -z,
                         r["z_sw_vs_pm_debiased"] < -z, "Li et al., SIGMOD 2020"))
        out.append(check("W1: SW+EMS not above PM+EMS", where, r["z_sw_vs_pm_ems"], z, r["z_sw_vs_pm_ems"] <= z,
                         "Li et al., SIGMOD 2020"))
    dky = "Ding, Kulkarni & Yekhanin, NeurIPS 2017"
    for r in onebit:
        where = f"p_change={r['p_change']:g}"
        if r["static_devices"]:
            ok = r["static_loss_min"] == r["static_loss_max"] == r["eps_memo"]
            out.append(check("1BitMean: a device whose value stays put costs one ε_memo", where, r["static_loss_max"],
                             r["eps_memo"], ok, dky))
        ok = r["memo_loss_max"] <= r["memo_bound"] * (1 + 1e-12) and r["memo_bound"] < r["rerandomize_loss"]
        out.append(check("1BitMean: memoized loss ≤ (s+1) ε_memo < re-randomizing", where, r["memo_loss_max"],
                         min(r["memo_bound"], r["rerandomize_loss"]), ok, dky))
        for mode in ("memo", "fresh"):
            zz = (r[f"mse_{mode}"] - r["variance"]) / r[f"mse_{mode}_se"]
            out.append(check(f"1BitMean: MSE ({mode}) = variance", where, abs(zz), z, abs(zz) <= z, dky))
    return out


# ====================================================================== plots
COLOURS = {"Laplace": "tab:gray", "Duchi": "tab:blue", "PM": "tab:orange", "HM": "tab:green"}
MARKERS = {"Laplace": "s", "Duchi": "o", "PM": "^", "HM": "D"}


def plot(config: Config, mean: list[dict], worst: list[dict], cross: list[dict], w1_rows: list[dict],
         onebit: list[dict], curves: list[dict], x_paper: float, out: Path) -> list[Path]:
    plt = pyplot()
    figures = []
    band = 1.96
    # ---- worst case: variances and ratios
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    fine = np.linspace(min(config.eps), max(config.eps), 300)
    ax = axes[0]
    for m in MEAN_MECHANISMS:
        ax.plot(fine, [paper_worst_variance(m, e) for e in fine], "-", lw=1, color=COLOURS[m], label=f"{m} (paper)")
        sel = [r for r in worst if r["mechanism"] == m]
        ax.errorbar([r["eps"] for r in sel], [r["n_mse"] for r in sel], yerr=[band * r["n_mse_se"] for r in sel],
                    fmt=MARKERS[m], ms=4, color=COLOURS[m], capsize=2, label=f"{m} measured")
    ax.axvline(x_paper, color="black", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("ε")
    ax.set_ylabel("worst-case variance of one report (unit domain)")
    ax.set_title(f"worst case: n × MSE at x = 0 or ±1 ({config.worst_reps:,} reps, n = {config.worst_n:,})", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[1]
    wc = {(r["mechanism"], r["eps"]): r for r in worst}
    xs = list(config.eps)
    for label, num, den, colour in (("PM / Duchi", ("PM",), ("Duchi",), "tab:orange"),
                                    ("HM / min(PM, Duchi)", ("HM",), ("PM", "Duchi"), "tab:green")):
        ax.plot(fine, [paper_worst_variance(num[0], e) / min(paper_worst_variance(m, e) for m in den) for e in fine],
                "-", lw=1, color=colour, label=f"{label} (paper)")
        ratio, err = [], []
        for e in xs:
            a = wc[(num[0], e)]
            b = min((wc[(m, e)] for m in den), key=lambda r: r["n_variance"])
            q = a["mse"] / b["mse"]
            ratio.append(q)
            err.append(band * q * math.hypot(a["mse_se"] / a["mse"], b["mse_se"] / b["mse"]))
        ax.errorbar(xs, ratio, yerr=err, fmt="o", ms=4, color=colour, capsize=2, label=f"{label} measured")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axvline(x_paper, color="black", lw=0.8, ls=":")
    ax.text(x_paper, ax.get_ylim()[1] * 0.97, f" ε = {x_paper:.3f}", fontsize=8, va="top")
    ax.set_xlabel("ε")
    ax.set_ylabel("ratio of worst-case variances")
    ax.set_title("Wang et al.: PM below Duchi above ε ≈ 1.29; HM below both", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.92, wspace=0.22)
    figures.append(save_figure(fig, out / "worst_case.png"))
    # ---- MSE of the mean on the data sets
    names = [c["dataset"] for c in cross if c["dataset"] != WORST_CASE]  # the data sets in their order
    cols = 2
    rows_ = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(10, 3.6 * rows_), squeeze=False, sharex=True)
    xc = {c["dataset"]: c for c in cross}
    for ax, name in zip(axes.flat, names):
        sel = [r for r in mean if r["kind"] == "data" and r["dataset"] == name]
        for m in MEAN_MECHANISMS:
            s = sorted((r for r in sel if r["mechanism"] == m), key=lambda r: r["eps"])
            ax.plot([r["eps"] for r in s], [r["paper_variance"] for r in s], "-", lw=1, color=COLOURS[m])
            ax.errorbar([r["eps"] for r in s], [r["mse"] for r in s], yerr=[band * r["mse_se"] for r in s],
                        fmt=MARKERS[m], ms=4, color=COLOURS[m], capsize=2, label=m)
        c = xc.get(name)
        if c and not math.isnan(c["eps_crossover"]):
            ax.axvline(c["eps_crossover"], color="tab:orange", lw=0.8, ls=":")
        ax.set_yscale("log")
        n = sel[0]["n"]
        title = f"{name} (n = {n:,}, E[x²] = {sel[0]['m2']:.3f}"
        has_cross = c is not None and not math.isnan(c["eps_crossover"])
        title += f", PM < Duchi above ε = {c['eps_crossover']:.2f})" if has_cross else ")"
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("ε")
    for ax in axes[:, 0]:
        ax.set_ylabel("MSE of the mean (unit domain)")
    axes[0][0].legend(fontsize=7)
    laplace_reps = max(2, round(config.reps * config.laplace_share))
    fig.suptitle(f"dots: measured ({config.reps:,} reps; Laplace {laplace_reps:,}), "
                 "95% bars; lines: the papers' variances", fontsize=9)
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.08 if rows_ > 1 else 0.13, top=0.9 if rows_ > 1 else 0.85,
                        hspace=0.25, wspace=0.18)
    figures.append(save_figure(fig, out / "mse_vs_eps.png", dpi=96))
    # ---- Wasserstein
    names = list(dict.fromkeys(r["dataset"] for r in w1_rows))
    fig, axes = plt.subplots(1, len(names), figsize=(3.3 * len(names), 3.6), squeeze=False, sharey=True)
    styles = {"sw_ems": ("SW+EMS", "tab:red", "o"), "pm_ems": ("PM+EMS", "tab:orange", "^"),
              "pm_debiased": ("PM debiased", "tab:purple", "v")}
    for ax, name in zip(axes[0], names):
        sel = [r for r in w1_rows if r["dataset"] == name]
        x = [r["eps"] for r in sel]
        for key, (label, colour, marker) in styles.items():
            ax.errorbar(x, [r[f"w1_{key}"] for r in sel], yerr=[band * r[f"w1_{key}_se"] for r in sel],
                        fmt=f"-{marker}", ms=4, lw=1, color=colour, capsize=2, label=label)
        ax.plot(x, [r["w1_floor"] for r in sel], "k:", lw=1, label="grid floor")
        ax.set_yscale("log")
        ax.set_xlabel("ε")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("Wasserstein distance W1 on [0, 1]")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"distribution estimates, d = {config.w_d} buckets, {config.w_reps} reps (95% bars)", fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.14, top=0.84, wspace=0.08)
    figures.append(save_figure(fig, out / "wasserstein.png"))
    # ---- 1BitMean
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, p in enumerate(config.p_change):
        sel = [r for r in curves if r["p_change"] == p]
        ax.plot([r["t"] for r in sel], [r["memo_loss_mean"] for r in sel], "-o", ms=3, color=colours[i],
                label=f"memoized, p_change = {p:g} (mean)")
        ax.plot([r["t"] for r in sel], [r["memo_loss_max"] for r in sel], "--", lw=1, color=colours[i])
    sel = [r for r in curves if r["p_change"] == config.p_change[0]]
    ax.plot([r["t"] for r in sel], [r["rerandomize_loss"] for r in sel], "k-", lw=1.5, label="re-randomizing (t ε)")
    ax.axhline(onebit[0]["memo_bound"], color="black", lw=0.8, ls=":", label="(s + 1) ε_memo")
    ax.set_yscale("log")
    ax.set_xlabel("collections t")
    ax.set_ylabel("longitudinal ε after t collections")
    ax.set_title(f"1BitMean, ε = {config.onebit_eps:g}, s = {config.onebit_s} (dashed: max over devices)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax = axes[1]
    x = np.arange(len(onebit))
    ax.bar(x - 0.2, [r["mse_memo"] for r in onebit], 0.4, label="memoized", color="tab:blue", capsize=2,
           yerr=[band * r["mse_memo_se_empirical"] for r in onebit])
    ax.bar(x + 0.2, [r["mse_fresh"] for r in onebit], 0.4, label="re-randomizing", color="tab:gray", capsize=2,
           yerr=[band * r["mse_fresh_se_empirical"] for r in onebit])
    for i, r in enumerate(onebit):
        ax.plot([i - 0.4, i + 0.4], [r["variance"]] * 2, "k-", lw=1.5, label="variance" if i == 0 else None)
    ax.set_xticks(x, [f"p_change = {r['p_change']:g}" for r in onebit], fontsize=8)
    ax.set_ylabel("MSE of each collection's mean (unit domain)")
    ax.set_title(f"n = {config.onebit_n:,}, {config.collections} collections, {config.onebit_reps} reps (95% bars)",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.92, wspace=0.22)
    figures.append(save_figure(fig, out / "onebit.png"))
    return figures


# ====================================================================== printing
def _tables(config: Config, worst: list[dict], cross: list[dict], w1_rows: list[dict], onebit: list[dict]) -> None:
    from rich.table import Table

    t = Table(title="worst-case variance of one report: measured n × MSE / papers' formula")
    t.add_column("ε", justify="right")
    for m in MEAN_MECHANISMS:
        t.add_column(m, justify="right")
    wc = {(r["mechanism"], r["eps"]): r for r in worst}
    for e in config.eps:
        t.add_row(f"{e:g}", *(f"{wc[(m, e)]['n_mse']:.4g} / {wc[(m, e)]['paper_worst']:.4g}" for m in MEAN_MECHANISMS))
    print_table(console, t)
    t = Table(title="crossover ε of PM and Duchi (PM's variance below Duchi's above it)")
    for col in ("where", "E\\[x²]", "implemented", "paper", "measured (interpolated)"):
        t.add_column(col, justify="right")
    for c in cross:
        t.add_row(c["dataset"], f"{c['m2']:.4f}" if c["m2"] == c["m2"] else "", f"{c['eps_crossover']:.4f}",
                  f"{c['eps_crossover_paper']:.4f}", f"{c['eps_crossover_measured']:.3f}")
    print_table(console, t)
    t = Table(title=f"W1 on [0, 1] (d = {config.w_d}): SW+EMS / PM+EMS / PM debiased")
    t.add_column("data set")
    for e in config.w_eps:
        t.add_column(f"ε={e:g}", justify="right")
    for name in dict.fromkeys(r["dataset"] for r in w1_rows):
        cells = {r["eps"]: r for r in w1_rows if r["dataset"] == name}
        t.add_row(name, *(f"{cells[e]['w1_sw_ems']:.4f} / {cells[e]['w1_pm_ems']:.4f} / "
                          f"{cells[e]['w1_pm_debiased']:.3f}" for e in config.w_eps))
    print_table(console, t)
    t = Table(title=f"1BitMean after {config.collections} collections (ε = {config.onebit_eps:g})")
    for col in ("p_change", "loss memoized (mean / max)", "re-randomizing", "MSE memo / fresh / variance"):
        t.add_column(col, justify="right")
    for r in onebit:
        t.add_row(f"{r['p_change']:g}", f"{r['memo_loss_mean']:.3f} / {r['memo_loss_max']:.3f}",
                  f"{r['rerandomize_loss']:.1f}", f"{r['mse_memo']:.3e} / {r['mse_fresh']:.3e} / {r['variance']:.3e}")
    print_table(console, t)


def _report_checks(rows: list[dict]) -> bool:
    from rich.table import Table

    t = Table(title="the papers' claims, checked (tolerance: sigmas standard errors of the repetitions)")
    for col in ("claim", "source", "checked", "hold"):
        t.add_column(col)
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["claim"]].append(r)
    for claim, rs in by.items():
        good = sum(r["holds"] for r in rs)
        t.add_row(claim, rs[0]["source"], str(len(rs)), f"{good}" if good == len(rs) else f"[red]{good}[/red]")
    print_table(console, t)
    failed = [r for r in rows if not r["holds"]]
    for r in failed:
        console.print(f"[red]FAILED[/red] {r['claim']} at {r['where']}: {r['statistic']:.4g} vs {r['bound']:.4g}")
    console.print(f"{len(rows) - len(failed)} of {len(rows)} checks hold")
    return not failed


# ====================================================================== run
def run(config: Config, out: Path, require_adult: bool = True) -> tuple[dict[str, Path], bool]:
    """The whole experiment; returns the files written and whether every check holds."""
    data_dir = str(resolve_data_dir(config.data_dir or None)) if config.dataset == "adult" else config.data_dir
    run_ = Run("numeric", {**asdict(config), "data_dir": data_dir, "out": str(out)}, out)
    run_.announce()
    data, note = datasets(config, required=require_adult)
    run_.config["data_note"] = note  # recorded in config.json by finish()
    console.print(("[yellow]note[/]: " if note.startswith("Adult skipped") else "") + note)
    for ds in data:
        console.print(f"  {ds.name}: {ds.note}")
    results = run_tasks(simulate, tasks_for(config, data), "numeric (mean, W1, 1BitMean)", config.workers)
    mean = summarize_mean([r for r in results if "mechanism" in r])
    worst = worst_rows(mean, config)
    x_paper, x_impl = worst_crossover_paper(), worst_crossover_implemented()
    wc = {(r["mechanism"], r["eps"]): r for r in worst}
    xs = list(config.eps)
    x_measured = interpolated_crossover(xs, [wc[("PM", e)]["mse"] / wc[("Duchi", e)]["mse"] for e in xs])
    cross = [{"dataset": WORST_CASE, "m2": math.nan, "eps_crossover": x_impl, "eps_crossover_paper": x_paper,
              "eps_crossover_measured": x_measured}]
    data_cell = {(r["dataset"], r["mechanism"], r["eps"]): r for r in mean if r["kind"] == "data"}
    for ds in data:
        impl, paper = data_crossover(ds)
        ratio = [data_cell[(ds.name, "PM", e)]["mse"] / data_cell[(ds.name, "Duchi", e)]["mse"] for e in xs]
        cross.append({"dataset": ds.name, "m2": data_cell[(ds.name, "PM", xs[0])]["m2"], "eps_crossover": impl,
                      "eps_crossover_paper": paper, "eps_crossover_measured": interpolated_crossover(xs, ratio)})
    w1_rows = summarize_w1([r for r in results if "w1" in r], [ds.name for ds in data])
    onebit, curves = summarize_onebit([r for r in results if "p_change" in r], config)
    check_rows = checks(config, mean, worst, cross, w1_rows, onebit, x_paper, x_impl)
    files = {"mean": run_.csv(mean, "mean.csv"), "worst_case": run_.csv(worst, "worst_case.csv"),
             "crossover": run_.csv(cross, "crossover.csv"), "wasserstein": run_.csv(w1_rows, "wasserstein.csv"),
             "onebit": run_.csv(onebit, "onebit.csv"), "onebit_loss": run_.csv(curves, "onebit_loss.csv"),
             "checks": run_.csv(check_rows, "checks.csv")}
    _tables(config, worst, cross, w1_rows, onebit)
    ok = _report_checks(check_rows)
    run_.finish(plot(config, mean, worst, cross, w1_rows, onebit, curves, x_paper, out))
    return files, ok


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment numeric``."""

    @group.command("numeric")
    def numeric(
            quick: QuickOption = False,
            out: OutOption = Path("experiments/numeric"),
            eps: Annotated[Optional[str], typer.Option(
                help="ε grid of the mean part (default 0.25,0.5,...,5; quick 0.5,1,2,4).")] = None,
            reps: Annotated[Optional[int], typer.Option(
                help="Repetitions per mean cell (default 1000, Laplace a tenth; quick 300).")] = None,
            dataset: Annotated[str, typer.Option(
                help="adult (default: the synthetic populations and Adult's age and hours-per-week), syn (the "
                     "synthetic populations only) or a CSV file (the synthetic populations and the CSV's numeric "
                     "columns, each a data set named after its column).")] = "adult",
            columns: Annotated[Optional[str], typer.Option(
                help="CSV columns to use, comma-separated (default every numeric column).")] = None,
            data_dir: Annotated[Optional[Path], typer.Option(
                help="Folder of adult.data.gz (default $LDP_DATA_DIR, else ../shared/data next to the repository; "
                     "the full run with --dataset adult needs it, --quick skips Adult without it).")] = None,
            workers: WorkersOption = None,
            seed: SeedOption = 0,
    ) -> None:
        """MSE of the mean vs ε for Laplace, Duchi, PM and HM (synthetic data, Adult's or a CSV's numeric
        columns, and the worst-case inputs) next to the analytical variances; SW+EMS vs PM histograms in
        Wasserstein distance; 1BitMean's loss over 100 collections with memoization vs re-randomizing. Exit 1 if
        a paper's ordering fails."""
        name = dataset.lower() if dataset.lower() in ("adult", "syn") else dataset
        chosen = split_names(columns)
        if chosen and name in ("adult", "syn"):
            console.print(f"[red]error:[/red] --columns applies to a CSV file's --dataset, not to {name}")
            raise typer.Exit(2)
        overrides: dict[str, Any] = {"workers": workers, "seed": seed, "dataset": name, "columns": chosen,
                                     "data_dir": str(data_dir or "")}
        if eps is not None:
            overrides["eps"] = floats(eps, "--eps")
        if reps is not None:
            overrides["reps"] = reps
        try:
            config = Config.quick(**overrides) if quick else Config(**overrides)
            _, ok = run(config, out, require_adult=not quick)
        except (LDPError, DatasetError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
        if not ok:
            raise typer.Exit(1)
