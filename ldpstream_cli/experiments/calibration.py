"""``ldp experiment calibration``: the empirical MSE of every protocol of the library against its analytical
variance, over ε and the domain size ``k`` (the grid of ``tests/test_accuracy.py``, larger).

Each repetition draws a fresh population i.i.d. from a Zipf histogram (exponent 1.1) and fresh devices
(new memo keys, so the reports of different devices are independent), randomizes, estimates, and records
the squared errors against the Zipf histogram (so the sampling of the population is part of the error,
as in ``variance_exact``); the analytical figure is ``variance_exact`` at the true frequencies (for a pure
protocol ``γ(1-γ)/(n(ps-qs)²)``, Arcolezi et al., DCN 2022, Thm. 2, Eq. 10), averaged over the values.
Single-shot protocols run at ε; longitudinal ones at ``ε1 = ε`` and ``ε∞ = 2ε`` (as ``ldp experiment
poisoning``); dBitFlipPM with ``b = k/4`` buckets and ``d = 2``. One plot per family, the 95% confidence band
of the empirical MSE over the repetitions around the analytical curve; ``z`` in the CSV is the deviation of
the mean MSE from the variance in analytical standard errors (``2 Σ Var_v² / k²`` per repetition for
independent Gaussian estimates; estimates that sum to one are negatively correlated, which inflates it for
small ``k``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer

import estimators
from estimators.errors import LDPError
from producers.datasets import zipf_weights

from ..options import build
from .runner import (OutOption, QuickOption, Run, SeedOption, WorkersOption, child_seeds, console, floats, mean_sd,
                     pyplot, run_tasks, save_figure)

FAMILIES: dict[str, tuple[str, ...]] = {
    "direct": ("GRR", "L-GRR", "ADP", "L-ADP"),
    "unary": ("SUE", "OUE", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE"),
    "hashing": ("BLH", "OLH", "LOLOHA"),
    "hadamard": ("HR", "FHR"),
    "subset and histogram": ("SS", "SHE", "THE"),
    "bucketed": ("dBitFlipPM",),
}
#: protocols whose aggregation (local hashing) or reports (SHE: k floats) are O(n k): fewer reports
HEAVY = ("BLH", "OLH", "LOLOHA", "SHE")


@dataclass(frozen=True)
class Config:
    n: int = 50_000
    n_heavy: int = 20_000
    ks: tuple[int, ...] = (4, 16, 100, 1000)
    eps: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    protocols: tuple[str, ...] = tuple(p for fam in FAMILIES.values() for p in fam)
    reps: int = 30
    seed: int = 0
    workers: int | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> "Config":
        return cls(**{"n": 20_000, "n_heavy": 5_000, "ks": (16, 100), "eps": (1.0, 4.0), "reps": 4, **overrides})


@dataclass(frozen=True)
class Task:
    protocol: str
    k: int
    eps: float
    seed: np.random.SeedSequence
    config: Config


def build_protocol(name: str, k: int, eps: float) -> estimators.FrequencyProtocol:
    """Single-shot at ε, longitudinal at ε1 = ε and ε∞ = 2ε, dBitFlipPM with b = k/4, d = 2."""
    extra = {"b": max(2, k // 4), "d": 2} if name == "dBitFlipPM" else {}
    return build(name, k=k, eps=eps, eps_inf=2 * eps, eps_1=eps, **extra)


def simulate(task: Task) -> dict[str, Any]:
    """``reps`` repetitions of one (protocol, k, ε): the MSE of each and the analytical variance."""
    c = task.config
    try:
        proto = build_protocol(task.protocol, task.k, task.eps)
    except LDPError as exc:
        return {"protocol": task.protocol, "k": task.k, "eps": task.eps, "skipped": str(exc)}
    n = c.n_heavy if task.protocol in HEAVY else c.n
    rng = np.random.default_rng(task.seed)
    weights = zipf_weights(task.k, 1.1)[rng.permutation(task.k)]
    size = proto.domain_size
    # the estimates are compared with the distribution the values are drawn from (i.i.d. devices), the
    # setting of ``variance_exact``; dBitFlipPM estimates the bucket masses
    truth = np.bincount((np.arange(task.k) * size) // task.k, weights=weights, minlength=size)
    mse, var, mse_var = [], [], []
    for _ in range(c.reps):
        values = rng.choice(task.k, size=n, p=weights)
        state = proto.new_state(n, rng)
        est = proto.estimate(proto.support(proto.randomize(values, rng, state=state)), n)
        v = np.asarray(proto.variance_exact(truth, n), dtype=np.float64)
        mse.append(float(np.mean((est - truth) ** 2)))
        var.append(float(v.mean()))
        mse_var.append(2.0 * float(np.sum(v ** 2)) / size ** 2)  # Var of the MSE for independent Gaussian errors
    return {"protocol": task.protocol, "k": task.k, "eps": task.eps, "n": n, "mse": mse, "variance": var,
            "mse_var": mse_var, "domain_size": size}


def tasks_for(config: Config) -> list[Task]:
    specs = [(p, k, e) for p in config.protocols for k in config.ks for e in config.eps]
    seeds = child_seeds(config.seed, "calibration", len(specs))
    # the O(n k) tasks are the longest: first, so the pool ends evenly
    order = sorted(range(len(specs)), key=lambda i: (specs[i][0] not in HEAVY, -specs[i][1]))
    return [Task(*specs[i], seeds[i], config) for i in order]


def summarize(results: list[dict]) -> list[dict]:
    rows = []
    for r in sorted(results, key=lambda r: (r["protocol"], r["k"], r["eps"])):
        if "skipped" in r:
            rows.append({"protocol": r["protocol"], "k": r["k"], "eps": r["eps"], "reps": 0, "note": r["skipped"]})
            continue
        mse, sd = mean_sd(r["mse"])
        var = float(np.mean(r["variance"]))
        reps = len(r["mse"])
        half = 1.96 * sd / math.sqrt(reps)
        se = math.sqrt(float(np.mean(r["mse_var"])) / reps)  # analytical standard error of the mean MSE
        rows.append({"protocol": r["protocol"], "k": r["k"], "eps": r["eps"], "n": r["n"], "reps": len(r["mse"]),
                     "domain_size": r["domain_size"], "mse": mse, "mse_ci95_low": mse - half,
                     "mse_ci95_high": mse + half, "variance": var, "mse_over_variance": mse / var,
                     "mse_se": se, "z": (mse - var) / se, "note": ""})
    return rows


def plot(rows: list[dict], config: Config, out: Path) -> list[Path]:
    """One figure per family, a column per k: top, empirical MSE (dots, 95% band over the repetitions) and
    analytical variance (line) against ε; bottom, their ratio with its band (1 = calibrated)."""
    plt = pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figures = []
    for family, members in FAMILIES.items():
        members = tuple(p for p in members if p in config.protocols)
        if not members:
            continue
        fig, axes = plt.subplots(2, len(config.ks), figsize=(3.6 * len(config.ks), 5.6), squeeze=False,
                                 sharex=True, gridspec_kw={"height_ratios": (3, 2)})
        for col, k in enumerate(config.ks):
            top, bottom = axes[0][col], axes[1][col]
            for i, p in enumerate(members):
                sel = sorted((r for r in rows if r["protocol"] == p and r["k"] == k and r["reps"]),
                             key=lambda r: r["eps"])
                if not sel:
                    continue
                x = [r["eps"] for r in sel]
                colour = colours[i % len(colours)]
                top.plot(x, [r["variance"] for r in sel], "-", color=colour, lw=1, label=p)
                top.fill_between(x, [max(r["mse_ci95_low"], 1e-300) for r in sel], [r["mse_ci95_high"] for r in sel],
                                 color=colour, alpha=0.2)
                top.plot(x, [r["mse"] for r in sel], "o", color=colour, ms=3)
                bottom.fill_between(x, [r["mse_ci95_low"] / r["variance"] for r in sel],
                                    [r["mse_ci95_high"] / r["variance"] for r in sel], color=colour, alpha=0.15)
                bottom.plot(x, [r["mse_over_variance"] for r in sel], "-o", color=colour, ms=3, lw=1)
            top.set_yscale("log")
            top.set_title(f"{family}, k = {k}", fontsize=9)
            top.grid(alpha=0.3, which="both")
            bottom.axhline(1.0, color="black", lw=0.8)
            bottom.set_xscale("log", base=2)
            bottom.set_xlabel("ε (longitudinal: ε1 = ε, ε∞ = 2ε)", fontsize=8)
            bottom.grid(alpha=0.3)
        axes[0][0].set_ylabel("MSE (dots, 95% band)\nvariance (line)", fontsize=8)
        axes[1][0].set_ylabel("MSE / variance", fontsize=8)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"{config.reps} repetitions per point, n = {config.n:,} ({config.n_heavy:,} for "
                     f"{', '.join(HEAVY)})", fontsize=8)
        fig.tight_layout()
        figures.append(save_figure(fig, out / f"calibration_{family.replace(' ', '_')}.png"))
    return figures


def run(config: Config, out: Path) -> dict[str, Path]:
    run_ = Run("calibration", {**asdict(config), "out": str(out)}, out)
    run_.announce()
    rows = summarize(run_tasks(simulate, tasks_for(config), "calibration (MSE vs variance)", config.workers))
    files = {"results": run_.csv(rows, "calibration.csv")}
    done = [r for r in rows if r["reps"]]
    worst = max(done, key=lambda r: abs(r["z"]))
    console.print(f"{len(done)} cells; mean MSE/variance {np.mean([r['mse_over_variance'] for r in done]):.4f}; "
                  f"largest |z| {abs(worst['z']):.2f} ({worst['protocol']}, k={worst['k']}, ε={worst['eps']:g})")
    run_.finish(plot(rows, config, out))
    return files


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment calibration``."""

    @group.command("calibration")
    def calibration(
            quick: QuickOption = False,
            out: OutOption = Path("experiments/calibration"),
            ks: Annotated[Optional[str], typer.Option(help="Domain sizes (default 4,16,100,1000).")] = None,
            eps: Annotated[Optional[str], typer.Option(help="ε values (default 0.5,1,2,4).")] = None,
            reps: Annotated[Optional[int], typer.Option(help="Repetitions per cell (default 30; quick 4).")] = None,
            protocol: Annotated[Optional[list[str]], typer.Option(
                "--protocol", "-p", help="Protocols (repeatable; default: all).")] = None,
            workers: WorkersOption = None,
            seed: SeedOption = 0,
    ) -> None:
        """Empirical MSE against the analytical variance for every protocol over ε and k, one plot per family."""
        overrides: dict[str, Any] = {"workers": workers, "seed": seed}
        if ks is not None:
            overrides["ks"] = tuple(int(x) for x in floats(ks, "--ks"))
        if eps is not None:
            overrides["eps"] = floats(eps, "--eps")
        if reps is not None:
            overrides["reps"] = reps
        if protocol:
            overrides["protocols"] = tuple(protocol)
        config = Config.quick(**overrides) if quick else Config(**overrides)
        run(config, out)
