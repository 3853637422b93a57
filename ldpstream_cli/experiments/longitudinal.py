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
* for dBitFlipPM with ``d ∈ {1, b}`` (``b = k``), the percentage of users for whom the server detected
  every bucket change: each collection where the user's bucket changed gave a report different from the
  previous one (EDBT 2023, Table 2).

Protocols (EDBT 2023, §5.1): RAPPOR (L-SUE), L-OSUE, L-GRR, BiLOLOHA (``g = 2``), OLOLOHA (``g`` of
Eq. 6), 1BitFlipPM and bBitFlipPM (ε∞ is dBitFlipPM's only parameter; the library reports its true
per-report ε, which is ε∞/2 for ``d = 1``).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer

import estimators
from estimators.errors import LDPError
from producers.datasets import EvolvingPopulation

from ..terminal import print_table
from .runner import (OutOption, QuickOption, Run, SeedOption, WorkersOption, child_seeds, console, floats, mean_sd,
                     pyplot, run_tasks, save_figure)

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

    @classmethod
    def quick(cls, **overrides: Any) -> "Config":
        """A CI-sized run (well under a minute): fewer users, collections, ε∞ and α."""
        return cls(**{"n": 5_000, "tau": 30, "eps_inf": (1.0, 3.0, 5.0), "alphas": (0.4, 0.6), "reps": 2,
                      **overrides})


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


def build_protocol(label: str, k: int, eps_inf: float, alpha: float | None,
                   calibration: str = "exact") -> estimators.FrequencyProtocol:
    """The library's protocol behind a label of EDBT 2023, §5.1."""
    name, extra = PROTOCOLS[label]
    if name == "dBitFlipPM":
        return estimators.make(name, k=k, b=k, d=k if extra["d"] == "b" else extra["d"], eps_inf=eps_inf)
    return estimators.make(name, k=k, eps_inf=eps_inf, eps_1=alpha * eps_inf, calibration=calibration, **extra)


def checkpoints(tau: int, count: int = 12) -> list[int]:
    """Collections (1-based) at which the averaged loss is recorded: about ``count``, ending at ``τ``."""
    step = max(1, tau // count)
    return sorted({*range(step, tau + 1, step), tau})


def fixed_population_variance(proto: estimators.FrequencyProtocol, truth: np.ndarray, n: int) -> np.ndarray:
    """Variance of a pure protocol's estimates around the frequencies ``truth`` of a FIXED population of
    ``n`` devices: ``variance_exact`` (i.i.d. devices: binomial counts, Arcolezi et al., DCN 2022, Eq. 10)
    less the sampling variance of the population, ``f (1 - f) / n``. (Each device supports a value
    independently w.p. ``ps`` or ``qs``, so ``Var[C] = n γ (1 - γ) - n f (1 - f) (ps - qs)²``.)"""
    return np.asarray(proto.variance_exact(truth, n)) - truth * (1.0 - truth) / n


def simulate(task: Task) -> dict[str, Any]:
    """Run one task: the Syn users report at every collection; the metrics of the module doc."""
    c = task.config
    proto = build_protocol(task.label, c.k, task.eps_inf, task.alpha, c.calibration)
    population = EvolvingPopulation(n=c.n, k=c.k, kind="syn", p_change=c.p_change,
                                    rng=np.random.default_rng(task.data_seed))
    rng = np.random.default_rng(task.noise_seed)
    state = proto.new_state(c.n, rng)
    bitflip = task.label in BITFLIP
    to_domain = proto.bucket if bitflip else (lambda v: v)
    size = proto.domain_size
    sq_err = variance = 0.0
    changes = np.zeros(c.n, dtype=np.int64)          # value changes per user
    bucket_changes = np.zeros(c.n, dtype=np.int64)   # dBitFlipPM: bucket changes per user
    all_detected = np.ones(c.n, dtype=bool)          # dBitFlipPM: every bucket change gave a new report
    previous_values = previous_cells = previous_reports = None
    marks = set(checkpoints(c.tau))
    loss_curve: list[tuple[int, float, float]] = []
    for t in range(1, c.tau + 1):
        values = population.step().copy()
        cells = to_domain(values)
        reports = proto.randomize(values, rng, state=state)
        truth = np.bincount(cells, minlength=size) / c.n
        estimate = proto.estimate(proto.support(reports), c.n)
        sq_err += float(np.mean((estimate - truth) ** 2))
        variance += float(np.mean(fixed_population_variance(proto, truth, c.n)))
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
           "mse_avg": sq_err / c.tau, "variance_avg": variance / c.tau,
           "eps_avg": float(np.mean(proto.longitudinal_loss(memoized))),
           "mean_changes": float(changes.mean()), "mean_memoized": float(memoized.mean()),
           "eps_first_true": proto.eps_first, "eps_inf_true": proto.eps_inf,
           "worst_case_loss": proto.worst_case_loss, "g": getattr(proto, "g", ""),
           "detected_all_pct": (100.0 * float(np.mean(all_detected & (bucket_changes > 0))) if bitflip else ""),
           "loss_curve": loss_curve}
    return row


def tasks_for(config: Config) -> list[Task]:
    """Every task of a run. dBitFlipPM does not depend on α: one task per (ε∞, repetition), its result
    shown in every α panel."""
    data = child_seeds(config.seed, "syn-data", config.reps)
    specs = [(label, e, None if label in BITFLIP else a, r)
             for r in range(config.reps) for label in config.protocols for e in config.eps_inf
             for a in (config.alphas[:1] if label in BITFLIP else config.alphas)]
    noise = child_seeds(config.seed, "noise", len(specs))
    # the bBitFlipPM tasks are the longest: submit them first so the pool ends evenly
    order = sorted(range(len(specs)), key=lambda i: specs[i][0] != "bBitFlipPM")
    return [Task(specs[i][0], specs[i][1], specs[i][2], specs[i][3], data[specs[i][3]], noise[i], config)
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
                var = float(np.mean([r["variance_avg"] for r in reps]))
                loss, loss_sd = mean_sd([r["eps_avg"] for r in reps])
                first = reps[0]
                rows.append({"protocol": label, "eps_inf": e, "alpha": a, "eps_1": round(a * e, 6),
                             "reps": len(reps), "mse_avg": mse, "mse_sd": mse_sd, "variance_avg": var,
                             "mse_over_variance": mse / var, "eps_avg": loss, "eps_avg_sd": loss_sd,
                             "mean_changes": float(np.mean([r["mean_changes"] for r in reps])),
                             "mean_memoized": float(np.mean([r["mean_memoized"] for r in reps])),
                             "eps_first_true": first["eps_first_true"], "eps_inf_true": first["eps_inf_true"],
                             "worst_case_loss": first["worst_case_loss"], "g": first["g"],
                             "domain_size": config.k,
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
    """EDBT 2023, Figs. 3a and 4a (MSE_avg and ε̌_avg against ε∞, one panel per α) and ε̌_avg over
    the collections."""
    plt = pyplot()
    figures = []
    colours = dict(zip(config.protocols, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    markers = dict(zip(config.protocols, "osv^D<>"))
    for metric, ylabel, filename in (("mse_avg", "MSE$_{avg}$ (Eq. 7)", "mse_avg.png"),
                                     ("eps_avg", "averaged loss $\\epsilon_{avg}$ (Eq. 8)", "eps_avg.png")):
        fig, axes = plt.subplots(1, len(config.alphas), figsize=(4.2 * len(config.alphas), 3.6), squeeze=False,
                                 sharey=True)
        for ax, a in zip(axes[0], config.alphas):
            for label in config.protocols:
                sel = [r for r in rows if r["protocol"] == label and r["alpha"] == a]
                x = [r["eps_inf"] for r in sel]
                ax.plot(x, [r[metric] for r in sel], marker=markers[label], ms=4, color=colours[label], label=label)
                if metric == "mse_avg":
                    ax.plot(x, [r["variance_avg"] for r in sel], ":", color=colours[label], lw=1)
            ax.set_yscale("log")
            ax.set_title(f"Syn, $\\epsilon_1 = {a:g}\\,\\epsilon_\\infty$", fontsize=10)
            ax.set_xlabel("$\\epsilon_\\infty$")
            ax.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel(ylabel)
        handles, labels = axes[0][0].get_legend_handles_labels()
        note = " (dotted: analytical variance)" if metric == "mse_avg" else ""
        fig.suptitle(f"n={config.n:,}, k={config.k}, τ={config.tau}, p_change={config.p_change}, "
                     f"{config.reps} reps{note}", fontsize=9)
        fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8)
        fig.tight_layout(rect=(0, 0.08, 1, 0.95))
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
    ax.set_title(f"Syn, $\\epsilon_\\infty={e:g}$, $\\epsilon_1={a:g}\\,\\epsilon_\\infty$", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    figures.append(save_figure(fig, out / "loss_over_time.png"))
    return figures


def detection_table(detection: list[dict]) -> Any:
    from rich.table import Table

    t = Table(title="users whose every bucket change the server detected (EDBT 2023, Table 2, Syn)")
    t.add_column("ε∞", justify="right")
    for label in BITFLIP:
        t.add_column(label, justify="right")
    for r in detection:
        t.add_row(f"{r['eps_inf']:g}", *(f"{r.get(f'{lb}_detected_all_pct', float('nan')):.4g}%" for lb in BITFLIP))
    return t


def summary_table(rows: list[dict], metric: str, alpha: float) -> Any:
    """One metric at one α: a row per ε∞, a column per protocol."""
    from rich.table import Table

    title = {"mse_avg": "MSE_avg (Eq. 7)", "eps_avg": "ε̌_avg (Eq. 8)"}[metric]
    t = Table(title=f"{title} at ε1 = {alpha:g} ε∞")
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    t.add_column("ε∞", justify="right")
    for label in protocols:
        t.add_column(label, justify="right")
    cell = {(r["protocol"], r["eps_inf"]): r[metric] for r in rows if r["alpha"] == alpha}
    for e in sorted({r["eps_inf"] for r in rows}):
        t.add_row(f"{e:g}", *(f"{cell[(p, e)]:{'.2e' if metric == 'mse_avg' else '.3g'}}" for p in protocols))
    return t


def run(config: Config, out: Path) -> dict[str, Path]:
    """The whole experiment: simulate, summarize, write CSVs and plots; returns the files written."""
    run_ = Run("longitudinal", {**asdict(config), "out": str(out)}, out)
    run_.announce()
    results = run_tasks(simulate, tasks_for(config), "longitudinal (Syn)", config.workers)
    rows, curves, detection = summarize(results, config)
    files = {"results": run_.csv(rows, "longitudinal.csv"), "loss_over_time": run_.csv(curves, "loss_over_time.csv"),
             "detection": run_.csv(detection, "detection.csv")}
    for a in config.alphas:
        print_table(console, summary_table(rows, "mse_avg", a))
    print_table(console, summary_table(rows, "eps_avg", config.alphas[-1]))
    print_table(console, detection_table(detection))
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
            workers: WorkersOption = None,
            seed: SeedOption = 0,
    ) -> None:
        """Arcolezi et al., EDBT 2023, §5 on Syn: MSE_avg (Eq. 7), ε̌_avg (Eq. 8) and dBitFlipPM's change
        detection (Table 2) for RAPPOR, L-OSUE, L-GRR, BiLOLOHA, OLOLOHA, 1BitFlipPM and bBitFlipPM."""
        overrides: dict[str, Any] = {"calibration": calibration, "workers": workers, "seed": seed}
        for key, value in (("n", n), ("k", k), ("tau", tau), ("reps", reps)):
            if value is not None:
                overrides[key] = value
        if eps_inf is not None:
            overrides["eps_inf"] = floats(eps_inf, "--eps-inf")
        if alphas is not None:
            overrides["alphas"] = floats(alphas, "--alphas")
        config = Config.quick(**overrides) if quick else Config(**overrides)
        try:
            run(config, out)
        except LDPError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
