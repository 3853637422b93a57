"""``ldp experiment longitudinal``: the evaluation of Arcolezi et al., "Frequency Estimation of Evolving
Data Under Local Differential Privacy", EDBT 2023 (LOLOHA), §5, on its Syn data set.

Syn (EDBT 2023, §5.1): ``n`` users, domain ``k``, ``τ`` collections; the first value is uniform and at
each later collection a user changes value with probability ``p_change``, drawing a new uniform value
(:class:`producers.datasets.EvolvingPopulation`). For every protocol, ε∞ of the grid and
``ε1 = α ε∞``, every user reports at every collection through the library's protocol (its memo state
kept across collections), and the experiment records:

* ``MSE_avg`` (EDBT 2023, Eq. 7): the squared error of the estimated histogram, averaged over values and
  collections, next to the library's analytical variance of the same estimates (``variance_exact`` at
  the true frequencies less the population's own sampling variance, :func:`fixed_population_variance`,
  averaged the same way), whose ratio must be 1 within the sampling error;
* ``ε̌_avg`` (EDBT 2023, Eq. 8): the users' longitudinal privacy loss after the last collection,
  averaged over users, from the library's accounting (``proto.longitudinal_loss`` of each user's
  number of memoized inputs), also at intermediate collections (``loss_over_time.csv``);
* for dBitFlipPM with ``d ∈ {1, b}`` (``b = k``), the percentage of users, among those whose bucket
  changed at least once, for whom the server detected every bucket change: each collection where the
  user's bucket changed gave a report different from the previous one (EDBT 2023, Table 2).

Real data (``--dataset``, :mod:`.datasets`): EDBT 2023's Adult (``hours-per-week``, k = 96, τ = 260
random permutations) and DB_MT (80 PWGTP columns as 80 collections, k = 1,412, dBitFlipPM with
``b = ⌊k/4⌋``, left out of the MSE plots as in the paper), or a CSV file. Every run reports two MSEs:
``mse_avg``, of the raw (unbiased) estimates, and ``mse_avg_clip_norm``, the authors' metric (their
code clips the estimates at 0 and renormalizes them to sum to 1 before the squared errors).

Protocols (EDBT 2023, §5.1): RAPPOR (L-SUE), L-OSUE, L-GRR, BiLOLOHA (``g = 2``), OLOLOHA (``g`` of
Eq. 6), 1BitFlipPM and bBitFlipPM (ε∞ is dBitFlipPM's only parameter; the library reports its true
per-report ε, which is ε∞/2 for ``d = 1``).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer

import estimators
from estimators.bitflip import DBitFlipPM
from estimators.errors import LDPError
from producers.datasets import EvolvingPopulation

from ..terminal import print_table
from .datasets import Collections, DatasetError, clip_normalize, load_collections
from .runner import (OutOption, QuickOption, Run, SeedOption, WorkersOption, child_seeds, console, floats, mean_sd,
                     pyplot, run_tasks, save_figure, split_names)

#: (label, registry name, extra parameters); dBitFlipPM's ``b`` is set to ``k`` when built
PROTOCOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "RAPPOR": ("L-SUE", {}),
    "L-OSUE": ("L-OSUE", {}),
    "L-GRR": ("L-GRR", {}),
    "BiLOLOHA": ("LOLOHA", {"g": 2}),
    "OLOLOHA": ("LOLOHA", {}),
    "1BitFlipPM": ("dBitFlipPM", {"d": 1}),
    "bBitFlipPM": ("dBitFlipPM", {"d": "b"}),
}
BITFLIP = ("1BitFlipPM", "bBitFlipPM")


@dataclass(frozen=True)
class Config:
    """Parameters of one run (EDBT 2023, §5.1 for the full-size defaults)."""

    n: int = 10_000
    k: int = 360
    tau: int = 120
    p_change: float = 0.25
    eps_inf: tuple[float, ...] = tuple(0.5 * i for i in range(1, 11))
    alphas: tuple[float, ...] = (0.4, 0.5, 0.6)
    protocols: tuple[str, ...] = tuple(PROTOCOLS)
    reps: int = 5
    calibration: str = "exact"
    seed: int = 0
    workers: int | None = None
    #: "syn" or a real data set (adult, db_mt, a CSV path); with one, n and tau are set by the data
    #: (requested n / tau: a random sample of users / the first collections; 0: all)
    dataset: str = "syn"
    data_dir: str = ""
    columns: tuple[str, ...] = ()
    b: int = 0  # dBitFlipPM's buckets (0: b = k)
    #: dBitFlipPM's estimator: "expected" (EDBT 2023, §2.4.4's nd/b) or "realized" (Ding et al., NeurIPS 2017)
    bitflip_estimator: str = "expected"
    data_note: str = ""

    @classmethod
    def quick(cls, **overrides: Any) -> "Config":
        """A CI-sized run (well under a minute): fewer users, collections, ε∞ and α (on real data: a sample of
        2,000 users, 10 collections, ε∞ 1 and 5, one α, one repetition: a few seconds)."""
        if overrides.get("dataset", "syn") != "syn":
            return cls(**{"n": 2_000, "tau": 10, "eps_inf": (1.0, 5.0), "alphas": (0.5,), "reps": 1, **overrides})
        return cls(**{"n": 5_000, "tau": 30, "eps_inf": (1.0, 3.0, 5.0), "alphas": (0.4, 0.6), "reps": 2,
                      **overrides})

    @property
    def bitflip_b(self) -> int:
        return self.b or self.k

    @property
    def title(self) -> str:
        return "Syn" if self.dataset == "syn" else Path(self.dataset).name


@dataclass(frozen=True)
class Task:
    """One repetition of one protocol at one (ε∞, α); ``data_seed`` is shared by every protocol of the
    repetition (they all see the same Syn users), ``noise_seed`` is the task's own."""

    label: str
    eps_inf: float
    alpha: float | None
    rep: int
    data_seed: np.random.SeedSequence
    noise_seed: np.random.SeedSequence
    config: Config
    data: Collections | None = None  # real data (None: Syn)


def build_protocol(label: str, k: int, eps_inf: float, alpha: float | None,
                   calibration: str = "exact", b: int | None = None) -> estimators.FrequencyProtocol:
    """The library's protocol behind a label of EDBT 2023, §5.1 (dBitFlipPM with ``b`` buckets, default k)."""
    name, extra = PROTOCOLS[label]
    if name == "dBitFlipPM":
        b = b or k
        return estimators.make(name, k=k, b=b, d=b if extra["d"] == "b" else extra["d"], eps_inf=eps_inf)
    return estimators.make(name, k=k, eps_inf=eps_inf, eps_1=alpha * eps_inf, calibration=calibration, **extra)


def checkpoints(tau: int, count: int = 12) -> list[int]:
    """Collections (1-based) at which the averaged loss is recorded: about ``count``, ending at ``τ``."""
    step = max(1, tau // count)
    return sorted({*range(step, tau + 1, step), tau})


def fixed_population_variance(proto: estimators.FrequencyProtocol, truth: np.ndarray, n: int,
                              **estimator: str) -> np.ndarray:
    """Variance of a pure protocol's estimates around the frequencies ``truth`` of a FIXED population of
    ``n`` devices: ``variance_exact`` (i.i.d. devices: binomial counts, Arcolezi et al., DCN 2022, Eq. 10)
    less the sampling variance of the population, ``f (1 - f) / n``. (Each device supports a value
    independently w.p. ``ps`` or ``qs``, so ``Var[C] = n γ (1 - γ) - n f (1 - f) (ps - qs)²``.)"""
    return np.asarray(proto.variance_exact(truth, n, **estimator)) - truth * (1.0 - truth) / n


def simulate(task: Task) -> dict[str, Any]:
    """Run one task: the users (Syn or real data) report at every collection; the metrics of the module doc."""
    c = task.config
    proto = build_protocol(task.label, c.k, task.eps_inf, task.alpha, c.calibration, c.bitflip_b)
    if task.data is None:
        population = EvolvingPopulation(n=c.n, k=c.k, kind="syn", p_change=c.p_change,
                                        rng=np.random.default_rng(task.data_seed))
        stream = population.steps(c.tau)
    else:
        stream = task.data.steps(task.data_seed)
    rng = np.random.default_rng(task.noise_seed)
    state = proto.new_state(c.n, rng)
    bitflip = task.label in BITFLIP
    to_domain = proto.bucket if bitflip else (lambda v: v)
    size = proto.domain_size
    estimator = {"estimator": c.bitflip_estimator} if bitflip else {}
    sq_err = sq_err_clip = variance = 0.0
    changes = np.zeros(c.n, dtype=np.int64)          # value changes per user
    bucket_changes = np.zeros(c.n, dtype=np.int64)   # dBitFlipPM: bucket changes per user
    all_detected = np.ones(c.n, dtype=bool)          # dBitFlipPM: every bucket change gave a new report
    previous_values = previous_cells = previous_reports = None
    marks = set(checkpoints(c.tau))
    loss_curve: list[tuple[int, float, float]] = []
    for t in range(1, c.tau + 1):
        values = next(stream).copy()
        cells = to_domain(values)
        reports = proto.randomize(values, rng, state=state)
        truth = np.bincount(cells, minlength=size) / c.n
        sampled = {"sampled": proto.sampled(reports)} if estimator.get("estimator") == "realized" else {}
        estimate = proto.estimate(proto.support(reports), c.n, **estimator, **sampled)
        sq_err += float(np.mean((estimate - truth) ** 2))
        sq_err_clip += float(np.mean((clip_normalize(estimate) - truth) ** 2))
        variance += float(np.mean(fixed_population_variance(proto, truth, c.n, **estimator)))
        if previous_values is not None:
            changes += values != previous_values
            if bitflip:
                moved = cells != previous_cells
                bucket_changes += moved
                new_report = np.any(reports != previous_reports, axis=tuple(range(1, reports.ndim)))
                all_detected &= ~moved | new_report
        previous_values, previous_cells, previous_reports = values, cells, reports
        if t in marks:
            loss = float(np.mean(proto.longitudinal_loss(proto.memoized_counts(state))))
            loss_curve.append((t, loss, float(changes.mean())))
    memoized = proto.memoized_counts(state)
    row = {"protocol": task.label, "eps_inf": task.eps_inf, "alpha": task.alpha, "rep": task.rep,
           "mse_avg": sq_err / c.tau, "mse_avg_clip_norm": sq_err_clip / c.tau, "variance_avg": variance / c.tau,
           "eps_avg": float(np.mean(proto.longitudinal_loss(memoized))),
           "mean_changes": float(changes.mean()), "mean_memoized": float(memoized.mean()),
           "eps_first_true": proto.eps_first, "eps_inf_true": proto.eps_inf,
           "worst_case_loss": proto.worst_case_loss, "g": getattr(proto, "g", ""),
           # users without a bucket change have nothing to detect: the share is over those with one
           "detected_all_pct": ((100.0 * float(np.mean(all_detected[bucket_changes > 0]))
                                 if np.any(bucket_changes > 0) else float("nan")) if bitflip else ""),
           "loss_curve": loss_curve}
    return row


def tasks_for(config: Config, data: Collections | None = None) -> list[Task]:
    """Every task of a run. dBitFlipPM does not depend on α: one task per (ε∞, repetition), its result
    shown in every α panel."""
    seeds = child_seeds(config.seed, "syn-data" if data is None else f"{config.dataset}-data", config.reps)
    specs = [(label, e, None if label in BITFLIP else a, r)
             for r in range(config.reps) for label in config.protocols for e in config.eps_inf
             for a in (config.alphas[:1] if label in BITFLIP else config.alphas)]
    noise = child_seeds(config.seed, "noise", len(specs))
    # the bBitFlipPM tasks are the longest: submit them first so the pool ends evenly
    order = sorted(range(len(specs)), key=lambda i: specs[i][0] != "bBitFlipPM")
    return [Task(specs[i][0], specs[i][1], specs[i][2], specs[i][3], seeds[specs[i][3]], noise[i], config, data)
            for i in order]


def summarize(results: list[dict[str, Any]], config: Config) -> tuple[list[dict], list[dict], list[dict]]:
    """Mean over repetitions: the main table, the loss-over-time table and Table 2 (detection)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[(r["protocol"], r["eps_inf"], r["alpha"])].append(r)
    rows, curves = [], []
    for label in config.protocols:
        for e in config.eps_inf:
            for a in config.alphas:
                reps = groups[(label, e, None if label in BITFLIP else a)]
                mse, mse_sd = mean_sd([r["mse_avg"] for r in reps])
                clip, clip_sd = mean_sd([r["mse_avg_clip_norm"] for r in reps])
                var = float(np.mean([r["variance_avg"] for r in reps]))
                loss, loss_sd = mean_sd([r["eps_avg"] for r in reps])
                first = reps[0]
                rows.append({"protocol": label, "eps_inf": e, "alpha": a, "eps_1": round(a * e, 6),
                             "reps": len(reps), "mse_avg": mse, "mse_sd": mse_sd,
                             "mse_avg_clip_norm": clip, "mse_clip_norm_sd": clip_sd, "variance_avg": var,
                             "mse_over_variance": mse / var, "eps_avg": loss, "eps_avg_sd": loss_sd,
                             "mean_changes": float(np.mean([r["mean_changes"] for r in reps])),
                             "mean_memoized": float(np.mean([r["mean_memoized"] for r in reps])),
                             "eps_first_true": first["eps_first_true"], "eps_inf_true": first["eps_inf_true"],
                             "worst_case_loss": first["worst_case_loss"], "g": first["g"],
                             "domain_size": config.k, "dataset": config.title,
                             "detected_all_pct": (float(np.mean([r["detected_all_pct"] for r in reps]))
                                                  if label in BITFLIP else "")})
                for i, (t, _, _) in enumerate(first["loss_curve"]):
                    curves.append({"protocol": label, "eps_inf": e, "alpha": a, "t": t,
                                   "eps_avg": float(np.mean([r["loss_curve"][i][1] for r in reps])),
                                   "mean_changes": float(np.mean([r["loss_curve"][i][2] for r in reps]))})
    detection = []
    for e in config.eps_inf:
        row: dict[str, Any] = {"eps_inf": e}
        for label in BITFLIP:
            if label in config.protocols:
                reps = groups[(label, e, None)]
                row[f"{label}_detected_all_pct"] = float(np.mean([r["detected_all_pct"] for r in reps]))
        detection.append(row)
    return rows, curves, detection


# ====================================================================== plots
def plot(rows: list[dict], curves: list[dict], config: Config, out: Path) -> list[Path]:
    """EDBT 2023, Figs. 3-4 (MSE_avg, raw and the authors' clipped-renormalized metric, and ε̌_avg against
    ε∞, one panel per α) and ε̌_avg over the collections. With ``b != k`` (DB_MT) dBitFlipPM estimates
    buckets, not values: left out of the MSE plots, as in the paper."""
    plt = pyplot()
    figures = []
    colours = dict(zip(config.protocols, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    markers = dict(zip(config.protocols, "osv^D<>"))
    for metric, ylabel, filename in (("mse_avg", "MSE$_{avg}$ (Eq. 7), raw unbiased estimates", "mse_avg.png"),
                                     ("mse_avg_clip_norm", "MSE$_{avg}$, estimates clipped at 0 and\nrenormalized "
                                      "(the authors' metric)", "mse_avg_clip_norm.png"),
                                     ("eps_avg", "averaged loss $\\epsilon_{avg}$ (Eq. 8)", "eps_avg.png")):
        drawn = [label for label in config.protocols
                 if not (metric.startswith("mse") and label in BITFLIP and config.bitflip_b != config.k)]
        if not drawn:  # only dBitFlipPM over buckets (DB_MT's Table 2 run): no MSE plot
            continue
        wide = len(config.alphas) > 1
        size = (max(4.2 * len(config.alphas), 6.4), 3.6 if wide else 4.4)
        fig, axes = plt.subplots(1, len(config.alphas), figsize=size, squeeze=False, sharey=True)
        for ax, a in zip(axes[0], config.alphas):
            for label in drawn:
                sel = [r for r in rows if r["protocol"] == label and r["alpha"] == a]
                x = [r["eps_inf"] for r in sel]
                ax.plot(x, [r[metric] for r in sel], marker=markers[label], ms=4, color=colours[label], label=label)
                if metric == "mse_avg":
                    ax.plot(x, [r["variance_avg"] for r in sel], ":", color=colours[label], lw=1)
            ax.set_yscale("log")
            ax.set_title(f"{config.title}, $\\epsilon_1 = {a:g}\\,\\epsilon_\\infty$", fontsize=10)
            ax.set_xlabel("$\\epsilon_\\infty$")
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel(ylabel)
        handles, labels = axes[0][0].get_legend_handles_labels()
        note = " (dotted: analytical variance)" if metric == "mse_avg" else ""
        dyn = f"p_change={config.p_change}" if config.dataset == "syn" else config.title
        fig.suptitle(f"n={config.n:,}, k={config.k}, τ={config.tau}, {dyn}, {config.reps} reps{note}", fontsize=9)
        ncol = len(labels) if len(config.alphas) > 1 else 3  # one narrow panel: the legend on three rows
        fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8)
        fig.tight_layout(rect=(0, 0.08 if ncol == len(labels) else 0.2, 1, 0.95))
        figures.append(save_figure(fig, out / filename))
    # ε̌_avg over the collections at the middle α and the ε∞ closest to 2
    a = config.alphas[len(config.alphas) // 2]
    e = min(config.eps_inf, key=lambda x: abs(x - 2.0))
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for label in config.protocols:
        sel = [r for r in curves if r["protocol"] == label and r["alpha"] == a and r["eps_inf"] == e]
        ax.plot([r["t"] for r in sel], [r["eps_avg"] for r in sel], marker=markers[label], ms=3,
                color=colours[label], label=label)
    ax.set_yscale("log")
    ax.set_xlabel("collections t")
    ax.set_ylabel("averaged loss $\\epsilon_{avg}$ (Eq. 8) after t collections")
    ax.set_title(f"{config.title}, $\\epsilon_\\infty={e:g}$, $\\epsilon_1={a:g}\\,\\epsilon_\\infty$", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    figures.append(save_figure(fig, out / "loss_over_time.png"))
    return figures


def detection_table(detection: list[dict], dataset: str = "Syn") -> Any:
    from rich.table import Table

    t = Table(title=f"users whose every bucket change the server detected (EDBT 2023, Table 2, {dataset})")
    t.add_column("ε∞", justify="right")
    for label in BITFLIP:
        t.add_column(label, justify="right")
    for r in detection:
        t.add_row(f"{r['eps_inf']:g}", *(f"{r.get(f'{lb}_detected_all_pct', float('nan')):.4g}%" for lb in BITFLIP))
    return t


def summary_table(rows: list[dict], metric: str, alpha: float) -> Any:
    """One metric at one α: a row per ε∞, a column per protocol."""
    from rich.table import Table

    title = {"mse_avg": "MSE_avg (Eq. 7), raw estimates", "mse_avg_clip_norm": "MSE_avg, estimates clipped at 0 and "
             "renormalized (the authors' metric)", "eps_avg": "ε̌_avg (Eq. 8)"}[metric]
    t = Table(title=f"{title} at ε1 = {alpha:g} ε∞")
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    t.add_column("ε∞", justify="right")
    for label in protocols:
        t.add_column(label, justify="right")
    cell = {(r["protocol"], r["eps_inf"]): r[metric] for r in rows if r["alpha"] == alpha}
    for e in sorted({r["eps_inf"] for r in rows}):
        t.add_row(f"{e:g}", *(f"{cell[(p, e)]:{'.2e' if metric.startswith('mse') else '.3g'}}" for p in protocols))
    return t


def run(config: Config, out: Path) -> dict[str, Path]:
    """The whole experiment: simulate, summarize, write CSVs and plots; returns the files written."""
    data = None
    if config.dataset != "syn":
        data = load_collections(config.dataset, config.data_dir or None, config.columns)
        data = data.subset(config.n or None, config.tau or None, child_seeds(config.seed, "sample", 1)[0])
        config = replace(config, n=data.n, k=data.k, tau=data.tau, b=config.b or (data.bitflip_b or 0),
                         data_note=data.note)
    run_ = Run("longitudinal", {**asdict(config), "out": str(out)}, out)
    run_.announce()
    results = run_tasks(simulate, tasks_for(config, data), f"longitudinal ({config.title})", config.workers)
    rows, curves, detection = summarize(results, config)
    files = {"results": run_.csv(rows, "longitudinal.csv"), "loss_over_time": run_.csv(curves, "loss_over_time.csv"),
             "detection": run_.csv(detection, "detection.csv")}
    for a in config.alphas:
        print_table(console, summary_table(rows, "mse_avg", a))
        print_table(console, summary_table(rows, "mse_avg_clip_norm", a))
    print_table(console, summary_table(rows, "eps_avg", config.alphas[-1]))
    print_table(console, detection_table(detection, config.title))
    figures = plot(rows, curves, config, out)
    run_.finish(figures)
    return files


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment longitudinal``."""

    @group.command("longitudinal")
    def longitudinal(
            quick: QuickOption = False,
            out: OutOption = Path("experiments/longitudinal"),
            n: Annotated[Optional[int], typer.Option(help="Users (default 10,000; quick 5,000).")] = None,
            k: Annotated[Optional[int], typer.Option("--k", "-k", help="Domain size (default 360).")] = None,
            tau: Annotated[Optional[int], typer.Option(help="Collections τ (default 120; quick 30).")] = None,
            eps_inf: Annotated[Optional[str], typer.Option(
                "--eps-inf", help="ε∞ grid, comma-separated (default 0.5,1,...,5; quick 1,3,5).")] = None,
            alphas: Annotated[Optional[str], typer.Option(
                help="α of ε1 = α ε∞, comma-separated (default 0.4,0.5,0.6; quick 0.4,0.6).")] = None,
            reps: Annotated[Optional[int], typer.Option(help="Repetitions (default 5; quick 2).")] = None,
            calibration: Annotated[str, typer.Option(help="p2 calibration of L-GRR and LOLOHA: exact or paper.")
                                   ] = "exact",
            dataset: Annotated[str, typer.Option(
                help="syn (default), adult (hours-per-week, k=96, τ=260 permutations), db_mt (80 PWGTP columns, "
                     "k=1,412) or a CSV file (a column per collection, or one column permuted τ times); real data: "
                     "--n and --tau sample users and collections (quick: 2,000 and 10).")] = "syn",
            data_dir: Annotated[Optional[Path], typer.Option(
                help="Folder of the data sets (default $LDP_DATA_DIR, else ../shared/data next to the repository).")
                                ] = None,
            columns: Annotated[Optional[str], typer.Option(
                help="CSV columns to use, comma-separated (default all; one column: permuted τ times).")] = None,
            protocols: Annotated[Optional[str], typer.Option(
                help=f"Protocols, comma-separated (default all: {','.join(PROTOCOLS)}).")] = None,
            bitflip_estimator: Annotated[str, typer.Option(
                help="dBitFlipPM's estimator: expected (divide by the expected nd/b users per bucket, EDBT 2023, "
                     "§2.4.4) or realized (debias the bits of the users who sampled it, Ding et al. 2017).")
                                         ] = "expected",
            workers: WorkersOption = None,
            seed: SeedOption = 0,
    ) -> None:
        """Arcolezi et al., EDBT 2023, §5 on Syn, Adult, DB_MT or a CSV file (--dataset): MSE_avg (Eq. 7), ε̌_avg
        (Eq. 8) and dBitFlipPM's change detection (Table 2) for RAPPOR, L-OSUE, L-GRR, BiLOLOHA, OLOLOHA, 1BitFlipPM
        and bBitFlipPM."""
        if bitflip_estimator not in DBitFlipPM.ESTIMATORS:
            console.print("[red]error:[/red] --bitflip-estimator must be "
                          f"{' or '.join(DBitFlipPM.ESTIMATORS)}, got {bitflip_estimator!r}")
            raise typer.Exit(2)
        overrides: dict[str, Any] = {"calibration": calibration, "workers": workers, "seed": seed,
                                     "bitflip_estimator": bitflip_estimator}
        if dataset.lower() != "syn":
            overrides.update(dataset=dataset, data_dir=str(data_dir or ""), n=0, tau=0,
                             columns=split_names(columns))
            if quick:
                del overrides["n"], overrides["tau"]
        for key, value in (("n", n), ("k", k), ("tau", tau), ("reps", reps)):
            if value is not None:
                overrides[key] = value
        if protocols is not None:
            chosen = split_names(protocols)
            unknown = [p for p in chosen if p not in PROTOCOLS]
            if unknown or not chosen:
                console.print(f"[red]error:[/red] --protocols: unknown {unknown or protocols!r}; choose from "
                              f"{', '.join(PROTOCOLS)}")
                raise typer.Exit(2)
            overrides["protocols"] = chosen
        if eps_inf is not None:
            overrides["eps_inf"] = floats(eps_inf, "--eps-inf")
        if alphas is not None:
            overrides["alphas"] = floats(alphas, "--alphas")
        config = Config.quick(**overrides) if quick else Config(**overrides)
        try:
            run(config, out)
        except (LDPError, DatasetError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
