"""``ldp experiment allomfree``: the evaluation of Arcolezi et al., "Improving the utility of locally
differentially private protocols for longitudinal and multidimensional frequency estimates", Digital
Communications and Networks (DCN) 2022, §5, on synthetic multidimensional data.

The paper runs four real data sets (Nursery, Adult, MS-FIMU, Census-Income: 6 to 33 attributes with
domain sizes 2 to 52) for one collection; here ``n`` users hold ``d`` attributes of domain sizes ``ks``
(2 to a few hundred), Zipf-distributed (exponent 1.1, random rank order) or uniform by attribute, which
evolve like EDBT 2023's Syn (each value changes w.p. ``p_change`` per collection) over ``τ``
collections. Every solution reports at every collection through the library's multidimensional
solutions (:func:`estimators.make_solution`, memo states kept), and the experiment records:

* ``MSE_avg`` (DCN 2022, §5.1: squared errors averaged over values, attributes and collections), also
  per collection (``mse_over_time.csv``), next to the library's analytical variance averaged the same
  way;
* the accuracy gains ``U_L-SUE`` and ``U_L-OUE`` of ALLOMFREE (DCN 2022, Eq. 17), per ε∞, for
  ``ε1 = 0.3 ε∞`` and ``0.6 ε∞`` (the layout of its Tables 3-4);
* ``ε̌_avg`` (Arcolezi et al., EDBT 2023, Eq. 8) from the library's accounting
  (``Solution.longitudinal_loss``).

Real data (``--dataset``, :mod:`.datasets`): DCN 2022's Nursery (9 attributes, 12,960 users) and Adult
(its 9 categorical attributes), or every column of a CSV file, for one collection (τ = 1, as in the
paper) or, with ``--tau``, a random permutation of the rows per later collection (the longitudinal
setting). Every run reports two MSEs: ``mse_avg``, of the raw (unbiased) estimates, and
``mse_avg_clip_norm``, the authors' metric (estimates clipped at 0 and renormalized to sum to 1), and the
gains of both.

Solutions: ALLOMFREE (DCN 2022, Alg. 1, the library's exact calibration) and with the paper's
calibration, L-SMP with L-SUE (basic RAPPOR), L-OUE, L-OSUE and L-SOUE (DCN 2022, §4), and the
library's extensions: ALLOMFREE with fake data (L-RS+FD with the per-attribute choice), ALLOMFREE with
the ``loss`` objective (LOLOHA among the candidates), L-RS+FD[L-OSUE] and L-SPL[L-OSUE].
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer

import estimators
from estimators.errors import InfeasibleParameters, LDPError
from producers.datasets import EvolvingPopulation

from ..terminal import print_table
from .datasets import DatasetError, Table, clip_normalize, load_table
from .runner import (OutOption, QuickOption, Run, SeedOption, WorkersOption, child_seeds, console, floats, mean_sd,
                     pyplot, run_tasks, save_figure, split_names)

#: label -> (solution, parameters besides ks and the budget)
SOLUTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "ALLOMFREE": ("ALLOMFREE", {}),
    "ALLOMFREE (paper cal.)": ("ALLOMFREE", {"calibration": "paper"}),
    "L-SUE": ("L-SMP", {"protocol": "L-SUE"}),
    "L-OUE": ("L-SMP", {"protocol": "L-OUE"}),
    "L-OSUE": ("L-SMP", {"protocol": "L-OSUE"}),
    "L-SOUE": ("L-SMP", {"protocol": "L-SOUE"}),
    "ALLOMFREE+fake data": ("ALLOMFREE", {"fake_data": True}),
    "ALLOMFREE (loss)": ("ALLOMFREE", {"objective": "loss"}),
    "L-RS+FD[L-OSUE]": ("L-RS+FD", {"protocol": "L-OSUE"}),
    "L-SPL[L-OSUE]": ("L-SPL", {"protocol": "L-OSUE"}),
}
PAPER_SOLUTIONS = ("ALLOMFREE", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE")


@dataclass(frozen=True)
class Config:
    """Parameters of one run (DCN 2022, §5.1 for the privacy grid)."""

    n: int = 50_000
    ks: tuple[int, ...] = (2, 3, 5, 10, 50, 200)
    distributions: tuple[str, ...] = ("zipf", "uniform", "zipf", "uniform", "zipf", "uniform")
    tau: int = 10
    p_change: float = 0.25
    eps_inf: tuple[float, ...] = tuple(0.5 * i for i in range(1, 9))
    alphas: tuple[float, ...] = (0.3, 0.6)
    solutions: tuple[str, ...] = tuple(SOLUTIONS)
    reps: int = 5
    seed: int = 0
    workers: int | None = None
    #: "synthetic" or a real data set (nursery, adult, a CSV path): its users and attributes replace n, ks
    #: and distributions (n > 0: a random sample of n users); tau = 1 as in the paper unless given
    dataset: str = "synthetic"
    data_dir: str = ""
    data_note: str = ""

    @property
    def title(self) -> str:
        return "synthetic" if self.dataset == "synthetic" else Path(self.dataset).name

    @classmethod
    def quick(cls, **overrides: Any) -> "Config":
        """A CI-sized run: fewer users, ε∞ values, collections and solutions (real data: every user, one
        collection, ALLOMFREE against L-SUE and L-OUE)."""
        if overrides.get("dataset", "synthetic") != "synthetic":
            return cls(**{"n": 0, "eps_inf": (0.5, 2.0, 4.0), "tau": 1, "reps": 2,
                          "solutions": ("ALLOMFREE", "L-SUE", "L-OUE"), **overrides})
        return cls(**{"n": 20_000, "eps_inf": (0.5, 2.0, 4.0), "tau": 20, "reps": 2,
                      "solutions": ("ALLOMFREE", "L-SUE", "L-OUE", "L-OSUE", "ALLOMFREE+fake data"), **overrides})


@dataclass(frozen=True)
class Task:
    """One repetition of one solution at one (ε∞, α)."""

    label: str
    eps_inf: float
    alpha: float
    rep: int
    data_seed: np.random.SeedSequence
    noise_seed: np.random.SeedSequence
    config: Config
    data: Table | None = None  # real data (None: synthetic)


def build_solution(label: str, ks: tuple[int, ...], eps_inf: float, alpha: float) -> estimators.Solution:
    name, extra = SOLUTIONS[label]
    return estimators.make_solution(name, ks=list(ks), eps_inf=eps_inf, eps_1=alpha * eps_inf, **extra)


def populations(config: Config, seed: np.random.SeedSequence) -> list[EvolvingPopulation]:
    """One evolving population per attribute (Syn dynamics, uniform or Zipf base law)."""
    seeds = seed.spawn(len(config.ks))
    return [EvolvingPopulation(n=config.n, k=k, kind="syn", p_change=config.p_change, base=dist,
                               rng=np.random.default_rng(s))
            for k, dist, s in zip(config.ks, config.distributions, seeds)]


def simulate(task: Task) -> dict[str, Any]:
    """One task: every user reports at every collection; MSE_avg per collection, variance, ε̌_avg."""
    c = task.config
    try:
        sol = build_solution(task.label, c.ks, task.eps_inf, task.alpha)
    except InfeasibleParameters as exc:
        return {"label": task.label, "eps_inf": task.eps_inf, "alpha": task.alpha, "rep": task.rep,
                "infeasible": str(exc)}
    if task.data is None:
        pops = populations(c, task.data_seed)
        stream = (np.stack([p.step() for p in pops], axis=1) for _ in range(c.tau))
    else:
        stream = task.data.steps(c.tau, task.data_seed)
    rng = np.random.default_rng(task.noise_seed)
    state = sol.new_state(c.n, rng)
    mse_t, clip_t, var_t, se_t = [], [], [], []
    for values in stream:
        out = sol.randomize(values, rng, state=state)
        counts, ns = sol.support(out), sol.report_counts(out)
        per_attr_mse, per_attr_clip, per_attr_var, per_attr_sd2 = [], [], [], []
        for j, k in enumerate(c.ks):
            truth = np.bincount(values[:, j], minlength=k) / c.n
            est = sol.estimate(j, counts[j], ns[j])
            var = np.asarray(sol.variance_exact(j, truth, c.n), dtype=np.float64)
            per_attr_mse.append(float(np.mean((est - truth) ** 2)))
            per_attr_clip.append(float(np.mean((clip_normalize(est) - truth) ** 2)))
            per_attr_var.append(float(var.mean()))
            # variance of the attribute's mean squared error: 2 Var² per Gaussian estimate, doubled for
            # the estimates' correlation (sum to one; exact for k = 2)
            per_attr_sd2.append(4.0 * float(np.sum(var ** 2)) / k ** 2)
        mse_t.append(float(np.mean(per_attr_mse)))
        clip_t.append(float(np.mean(per_attr_clip)))
        var_t.append(float(np.mean(per_attr_var)))
        se_t.append(math.sqrt(sum(per_attr_sd2)) / len(c.ks))
    loss = sol.longitudinal_loss(state)
    return {"label": task.label, "eps_inf": task.eps_inf, "alpha": task.alpha, "rep": task.rep,
            "mse_t": mse_t, "mse_clip_norm_t": clip_t, "variance_t": var_t, "mse_se_bound": float(np.mean(se_t)),
            "eps_avg": float(np.mean(loss)), "worst_case_loss": float(sol.worst_case_loss),
            "choices": " ".join(name for name, _ in sol.choices) if hasattr(sol, "choices") else ""}


def tasks_for(config: Config, table: Table | None = None) -> list[Task]:
    data = child_seeds(config.seed, "multidim-data" if table is None else f"{config.dataset}-data", config.reps)
    specs = [(label, e, a, r) for r in range(config.reps) for label in config.solutions
             for e in config.eps_inf for a in config.alphas]
    noise = child_seeds(config.seed, "noise", len(specs))
    return [Task(lb, e, a, r, data[r], s, config, table) for (lb, e, a, r), s in zip(specs, noise)]


def summarize(results: list[dict], config: Config) -> tuple[list[dict], list[dict], list[dict]]:
    """The main table (one row per solution, ε∞, α), MSE per collection, and the gains (Eq. 17)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[(r["label"], r["eps_inf"], r["alpha"])].append(r)
    rows, over_time = [], []
    for label in config.solutions:
        for a in config.alphas:
            for e in config.eps_inf:
                reps = groups[(label, e, a)]
                if "infeasible" in reps[0]:
                    rows.append({"solution": label, "eps_inf": e, "alpha": a, "eps_1": round(a * e, 6),
                                 "reps": 0, "mse_avg": math.nan, "mse_avg_clip_norm": math.nan,
                                 "note": reps[0]["infeasible"]})
                    continue
                mse, sd = mean_sd([float(np.mean(r["mse_t"])) for r in reps])
                clip, clip_sd = mean_sd([float(np.mean(r["mse_clip_norm_t"])) for r in reps])
                var = float(np.mean([np.mean(r["variance_t"]) for r in reps]))
                bound = float(np.mean([r["mse_se_bound"] for r in reps])) / math.sqrt(len(reps))
                rows.append({"solution": label, "eps_inf": e, "alpha": a, "eps_1": round(a * e, 6), "reps": len(reps),
                             "mse_avg": mse, "mse_sd": sd, "mse_avg_clip_norm": clip, "mse_clip_norm_sd": clip_sd,
                             "variance_avg": var, "mse_over_variance": mse / var,
                             "mse_rel_se_bound": bound / var,
                             "eps_avg": float(np.mean([r["eps_avg"] for r in reps])),
                             "worst_case_loss": reps[0]["worst_case_loss"], "channels": reps[0]["choices"],
                             "note": ""})
                for t in range(config.tau):
                    over_time.append({"solution": label, "eps_inf": e, "alpha": a, "t": t + 1,
                                      "mse": float(np.mean([r["mse_t"][t] for r in reps])),
                                      "mse_clip_norm": float(np.mean([r["mse_clip_norm_t"][t] for r in reps])),
                                      "variance": float(np.mean([r["variance_t"][t] for r in reps]))})
    gains = []
    index = {(r["solution"], r["eps_inf"], r["alpha"]): r for r in rows}
    for a in config.alphas:
        for e in config.eps_inf:
            ours = index.get(("ALLOMFREE", e, a))
            if ours is None:
                continue
            row: dict[str, Any] = {"alpha": a, "eps_inf": e}
            for metric, suffix in (("mse_avg", ""), ("mse_avg_clip_norm", "_clip_norm")):
                for ref in ("L-SUE", "L-OUE"):
                    other = index.get((ref, e, a))
                    row[f"U_{ref}{suffix}_pct"] = (100.0 * (other[metric] - ours[metric]) / other[metric]
                                                   if other is not None else math.nan)
            gains.append(row)
    return rows, over_time, gains


# ====================================================================== plots and tables
def plot(rows: list[dict], over_time: list[dict], config: Config, out: Path) -> list[Path]:
    """DCN 2022, Figs. 4-7 layout (MSE_avg against ε∞, top ε1 = 0.3 ε∞, bottom 0.6 ε∞) and the MSE per
    collection at the middle ε∞."""
    plt = pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {lb: colours[i % len(colours)] for i, lb in enumerate(config.solutions)}
    style = {lb: ("-" if lb in PAPER_SOLUTIONS else "--") for lb in config.solutions}
    figures = []
    for metric, ylabel, filename in (("mse_avg", "MSE$_{avg}$, raw estimates", "mse_avg.png"),
                                     ("mse_avg_clip_norm", "MSE$_{avg}$, clipped at 0 and\nrenormalized (authors')",
                                      "mse_avg_clip_norm.png")):
        fig, axes = plt.subplots(len(config.alphas), 1, figsize=(7.5, 3.2 * len(config.alphas)), squeeze=False,
                                 sharex=True)
        for ax, a in zip(axes[:, 0], config.alphas):
            for label in config.solutions:
                sel = [r for r in rows if r["solution"] == label and r["alpha"] == a and r["reps"]]
                ax.plot([r["eps_inf"] for r in sel], [r[metric] for r in sel], style[label], marker="o", ms=3,
                        color=colour[label], label=label)
            ax.set_yscale("log")
            ax.set_ylabel(ylabel)
            ax.set_title(f"$\\epsilon_1 = {a:g}\\,\\epsilon_\\infty$", fontsize=10)
            ax.grid(alpha=0.3, which="both")
        axes[-1][0].set_xlabel("$\\epsilon_\\infty$")
        axes[0][0].legend(fontsize=7, ncol=2)
        fig.suptitle(f"{config.title}, n={config.n:,}, ks={list(config.ks)}, τ={config.tau}, {config.reps} reps "
                     "(dashed: beyond the paper)", fontsize=8)
        fig.tight_layout()
        figures.append(save_figure(fig, out / filename))
    e = config.eps_inf[len(config.eps_inf) // 2]
    fig, axes = plt.subplots(1, len(config.alphas), figsize=(4.5 * len(config.alphas), 3.4), squeeze=False)
    for ax, a in zip(axes[0], config.alphas):
        for label in ("ALLOMFREE", "L-SUE", "L-OUE"):
            sel = [r for r in over_time if r["solution"] == label and r["alpha"] == a and r["eps_inf"] == e]
            if sel:
                ax.plot([r["t"] for r in sel], [r["mse"] for r in sel], marker="o", ms=3, color=colour[label],
                        label=label)
                ax.plot([r["t"] for r in sel], [r["variance"] for r in sel], ":", color=colour[label])
                ax.plot([r["t"] for r in sel], [r["mse_clip_norm"] for r in sel], "--", color=colour[label], lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("collection t")
        ax.set_title(f"$\\epsilon_\\infty={e:g}$, $\\epsilon_1={a:g}\\,\\epsilon_\\infty$", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("MSE at collection t\n(solid: raw; dashed: clipped and renormalized;\n"
                          "dotted: analytical variance)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    figures.append(save_figure(fig, out / "mse_over_time.png"))
    return figures


def gains_table(gains: list[dict], alpha: float) -> Any:
    from rich.table import Table as RichTable

    t = RichTable(title=f"accuracy gain of ALLOMFREE (DCN 2022, Eq. 17), ε1 = {alpha:g} ε∞ (Tables 3-4 layout; "
                        "raw MSE, and clipped-renormalized MSE: the authors' metric)")
    keys = ("U_L-SUE_pct", "U_L-OUE_pct", "U_L-SUE_clip_norm_pct", "U_L-OUE_clip_norm_pct")
    for col in ("ε∞", "U_L-SUE (%)", "U_L-OUE (%)", "U_L-SUE clip-norm (%)", "U_L-OUE clip-norm (%)"):
        t.add_column(col, justify="right")
    sel = [g for g in gains if g["alpha"] == alpha]
    for g in sel:
        t.add_row(f"{g['eps_inf']:g}", *(f"{g[key]:.2f}" for key in keys))
    if sel:
        t.add_row("Mean", *(f"{np.nanmean([g[key] for g in sel]):.2f}" for key in keys))
    return t


def run(config: Config, out: Path) -> dict[str, Path]:
    table = None
    if config.dataset != "synthetic":
        table = load_table(config.dataset, config.data_dir or None)
        table = table.subset(config.n or None, child_seeds(config.seed, "sample", 1)[0])
        config = replace(config, n=table.n, ks=table.ks, distributions=tuple("data" for _ in table.ks),
                         data_note=table.note + (f"; τ = {config.tau}" if config.tau == 1 else
                                                 f"; τ = {config.tau} (later collections: random row permutations)"))
    if len(config.distributions) != len(config.ks):
        raise LDPError("give one distribution (zipf or uniform) per attribute")
    run_ = Run("allomfree", {**asdict(config), "out": str(out)}, out)
    run_.announce()
    results = run_tasks(simulate, tasks_for(config, table), f"allomfree ({config.title})", config.workers)
    rows, over_time, gains = summarize(results, config)
    files = {"results": run_.csv(rows, "allomfree.csv"), "over_time": run_.csv(over_time, "mse_over_time.csv"),
             "gains": run_.csv(gains, "gains.csv")}
    for a in config.alphas:
        print_table(console, gains_table(gains, a))
    figures = plot(rows, over_time, config, out)
    run_.finish(figures)
    return files


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment allomfree``."""

    @group.command("allomfree")
    def allomfree(
            quick: QuickOption = False,
            out: OutOption = Path("experiments/allomfree"),
            n: Annotated[Optional[int], typer.Option(help="Users (default 50,000; quick 20,000).")] = None,
            ks: Annotated[Optional[str], typer.Option(help="Domain sizes, comma-separated.")] = None,
            distributions: Annotated[Optional[str], typer.Option(
                help="zipf or uniform per attribute, comma-separated.")] = None,
            tau: Annotated[Optional[int], typer.Option(help="Collections τ (default 10; quick 20).")] = None,
            eps_inf: Annotated[Optional[str], typer.Option(
                "--eps-inf", help="ε∞ grid (default 0.5,1,...,4; quick 0.5,2,4).")] = None,
            alphas: Annotated[Optional[str], typer.Option(help="α of ε1 = α ε∞ (default 0.3,0.6).")] = None,
            reps: Annotated[Optional[int], typer.Option(help="Repetitions (default 5; quick 2).")] = None,
            dataset: Annotated[str, typer.Option(
                help="synthetic (default), nursery, adult (9 categorical attributes) or a CSV file (every column an "
                     "attribute): one collection unless --tau; --n samples users (default all).")] = "synthetic",
            data_dir: Annotated[Optional[Path], typer.Option(
                help="Folder of the data sets (default $LDP_DATA_DIR, else ../shared/data next to the repository).")
                                ] = None,
            workers: WorkersOption = None,
            seed: SeedOption = 0,
    ) -> None:
        """Arcolezi et al., DCN 2022, §5 on synthetic multidimensional data: MSE_avg of ALLOMFREE, L-SUE,
        L-OUE, L-OSUE, L-SOUE and the library's other solutions, and the gains of Eq. 17 (Tables 3-4)."""
        overrides: dict[str, Any] = {"workers": workers, "seed": seed}
        if dataset.lower() not in ("synthetic", "syn"):
            overrides.update(dataset=dataset, data_dir=str(data_dir or ""), n=0, tau=1)
        for key, value in (("n", n), ("tau", tau), ("reps", reps)):
            if value is not None:
                overrides[key] = value
        if ks is not None:
            overrides["ks"] = tuple(int(x) for x in floats(ks, "--ks"))
            if distributions is None:
                overrides["distributions"] = tuple(("zipf", "uniform")[i % 2] for i in range(len(overrides["ks"])))
        if distributions is not None:
            overrides["distributions"] = split_names(distributions)
        if eps_inf is not None:
            overrides["eps_inf"] = floats(eps_inf, "--eps-inf")
        if alphas is not None:
            overrides["alphas"] = floats(alphas, "--alphas")
        config = Config.quick(**overrides) if quick else Config(**overrides)
        try:
            run(config, out)
        except (LDPError, ValueError, DatasetError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
