"""``ldp experiment numerical``: the papers' numerical analyses under both calibrations of the IRR round.

* Arcolezi et al., DCN 2022, Table 1: Var* (its Eq. 11, ``n = 10000``) of L-GRR (``k`` = 2, 32, 1024),
  L-OSUE, L-SUE, L-SOUE and L-OUE for ε∞ ∈ {0.5, 1, 2, 4} and ε1 = α ε∞, α ∈ {0.6, ..., 0.1}; and
  Table 2: Var* of GRR, OUE and SUE. The printed values sit next to the library's under the paper's
  calibration (DCN 2022, Eqs. 12-13) and under the exact one (:mod:`estimators.longitudinal`).
* Arcolezi et al., EDBT 2023, Fig. 1: OLOLOHA's ``g`` (its Eq. 6) against ε∞ for α ∈ {0.1, ..., 0.6},
  next to the ``g`` that minimizes Var* under each calibration (direct search); and Fig. 2: Var*
  (its Eq. 5, ``n = 10000``) of BiLOLOHA, OLOLOHA, RAPPOR (L-SUE) and L-OSUE.
* Where the calibration changes a conclusion: the largest domain size ``k`` for which L-GRR has a smaller
  Var* than L-OSUE (so ALLOMFREE, DCN 2022 Alg. 1, picks L-GRR), per (ε∞, α), under each calibration.

Everything is closed-form (no randomness, no repetitions): it takes seconds.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

import estimators
from estimators.errors import InfeasibleParameters
from estimators.hashing import loloha_optimal_g, ololoha_g

from ..terminal import print_table
from .runner import OutOption, Run, console, pyplot, save_figure

N = 10_000
CALIBRATIONS = ("paper", "exact")
TABLE1_ALPHAS = (0.6, 0.5, 0.4, 0.3, 0.2, 0.1)
TABLE1_EPS = (0.5, 1.0, 2.0, 4.0)
TABLE1_COLUMNS = (("L-GRR", 2), ("L-GRR", 32), ("L-GRR", 1024), ("L-OSUE", None), ("L-SUE", None),
                  ("L-SOUE", None), ("L-OUE", None))
#: DCN 2022, Table 1 as printed, one row per (α, ε∞) (the ε1 = 0.3 ε∞ block's row labels repeat two
#: ε∞ values in the paper; the printed numbers are those of ε∞ = 2 and 4)
TABLE1_PRINTED = {
    (0.6, 0.5): "0.001103 0.980969 26706 0.004411 0.004436 0.005306 0.005549",
    (0.6, 1.0): "0.000270 0.125036 3153 0.001078 0.001103 0.001234 0.001347",
    (0.6, 2.0): "0.000062 0.006327 117 0.000247 0.000270 0.000264 0.000310",
    (0.6, 4.0): "0.000011 0.000078 0.25903 0.000044 0.000062 0.000045 0.000057",
    (0.5, 0.5): "0.001592 2.088372 60218 0.006367 0.006392 0.007336 0.007611",
    (0.5, 1.0): "0.000392 0.268074 7198 0.001567 0.001592 0.001740 0.001872",
    (0.5, 2.0): "0.000092 0.013926 281 0.000368 0.000392 0.000389 0.000447",
    (0.5, 4.0): "0.000018 0.000188 0.74088 0.000072 0.000092 0.000073 0.000092",
    (0.4, 0.5): "0.002492 4.530779 135874 0.009967 0.009992 0.011012 0.011324",
    (0.4, 1.0): "0.000617 0.586823 16443 0.002467 0.002492 0.002658 0.002812",
    (0.4, 2.0): "0.000148 0.031552 673 0.000593 0.000617 0.000617 0.000690",
    (0.4, 4.0): "0.000032 0.000484 2.12772 0.000127 0.000148 0.000128 0.000156",
    (0.3, 0.5): "0.004436 10 329836 0.017744 0.017769 0.018863 0.019214",
    (0.3, 1.0): "0.001103 1.398568 40412 0.004411 0.004436 0.004620 0.004799",
    (0.3, 2.0): "0.000270 0.078202 1737 0.001078 0.001103 0.001106 0.001198",
    (0.3, 4.0): "0.000062 0.001389 6 0.000247 0.000270 0.000248 0.000291",
    (0.2, 0.5): "0.009992 30 972656 0.039967 0.039992 0.041148 0.041536",
    (0.2, 1.0): "0.002492 4.080052 120651 0.009967 0.009992 0.010190 0.010394",
    (0.2, 2.0): "0.000617 0.237925 5443 0.002467 0.002492 0.002498 0.002610",
    (0.2, 4.0): "0.000148 0.004939 24 0.000593 0.000617 0.000595 0.000659",
    (0.1, 0.5): "0.039992 154 4941829 0.159967 0.159992 0.161191 0.161608",
    (0.1, 1.0): "0.009992 20 620584 0.039967 0.039992 0.040201 0.040424",
    (0.1, 2.0): "0.002492 1.255550 29356 0.009967 0.009992 0.010000 0.010130",
    (0.1, 4.0): "0.000617 0.030494 156 0.002467 0.002492 0.002469 0.002560",
}
#: DCN 2022, Table 2 as printed: ε → GRR(k=2) GRR(k=32) GRR(k=1024) OUE SUE
TABLE2_PRINTED = {
    0.5: "0.000392 0.007520 0.243240 0.001567 0.001592",
    1.0: "0.000092 0.001108 0.034707 0.000368 0.000392",
    2.0: "0.000018 0.000092 0.002522 0.000072 0.000092",
    4.0: "0.000002 0.000003 0.000037 0.000008 0.000018",
}
FIG_EPS = tuple(0.5 * i for i in range(1, 11))
FIG_ALPHAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
FIG2_PROTOCOLS = {"BiLOLOHA": ("LOLOHA", {"g": 2}), "OLOLOHA": ("LOLOHA", {}), "RAPPOR": ("L-SUE", {}),
                  "L-OSUE": ("L-OSUE", {})}
MAX_K = 1024


def _var(name: str, k: int, eps_inf: float, eps_1: float, calibration: str, **extra: Any) -> float:
    try:
        return estimators.make(name, k=k, eps_inf=eps_inf, eps_1=eps_1, calibration=calibration,
                               **extra).variance(N)
    except InfeasibleParameters:
        return math.nan


def _digits(cell: str) -> int:
    """Decimal places of a printed cell (the paper rounds some cells and truncates others)."""
    return len(cell.split(".")[1]) if "." in cell else 0


def table1() -> list[dict]:
    """DCN 2022, Table 1: printed, paper calibration, exact calibration (one row per cell)."""
    rows = []
    for (alpha, e), printed in TABLE1_PRINTED.items():
        e1 = round(alpha * e, 12)
        for (name, k), cell in zip(TABLE1_COLUMNS, printed.split()):
            paper, exact = (_var(name, k or 16, e, e1, cal) for cal in CALIBRATIONS)
            rows.append({"alpha": alpha, "eps_inf": e, "eps_1": e1, "protocol": name, "k": k or "",
                         "printed": float(cell), "printed_digits": _digits(cell), "paper_calibration": paper,
                         "exact_calibration": exact, "exact_over_paper": exact / paper})
    return rows


def table2() -> list[dict]:
    """DCN 2022, Table 2 (single-shot GRR, OUE, SUE): printed against the library."""
    rows = []
    for eps, printed in TABLE2_PRINTED.items():
        protos = [("GRR", 2), ("GRR", 32), ("GRR", 1024), ("OUE", None), ("SUE", None)]
        for (name, k), cell in zip(protos, printed.split()):
            rows.append({"eps": eps, "protocol": name, "k": k or "", "printed": float(cell),
                         "library": estimators.make(name, k=k or 16, eps=eps).variance(N)})
    return rows


def optimal_g() -> list[dict]:
    """EDBT 2023, Fig. 1: Eq. 6's g and the Var*-minimizing g under each calibration."""
    rows = []
    for alpha in FIG_ALPHAS:
        for e in FIG_EPS:
            e1 = alpha * e
            rows.append({"alpha": alpha, "eps_inf": e, "g_eq6": ololoha_g(e, e1),
                         **{f"g_best_{cal}": loloha_optimal_g(e, e1, cal, g_max=256) for cal in CALIBRATIONS}})
    return rows


def figure2() -> list[dict]:
    """EDBT 2023, Fig. 2: Var* (n = 10000) of the LOLOHA protocols, RAPPOR and L-OSUE, both calibrations
    (OLOLOHA's g from Eq. 6 in both)."""
    rows = []
    for alpha in FIG_ALPHAS:
        for e in FIG_EPS:
            for label, (name, extra) in FIG2_PROTOCOLS.items():
                row = {"alpha": alpha, "eps_inf": e, "protocol": label}
                for cal in CALIBRATIONS:
                    row[f"var_{cal}"] = _var(name, 360, e, alpha * e, cal, **extra)
                rows.append(row)
    return rows


def lgrr_crossover() -> list[dict]:
    """Largest ``k`` (up to 1024) with Var*(L-GRR) < Var*(L-OSUE), per (ε∞, α) and calibration: ALLOMFREE
    picks L-GRR for every attribute with a domain size up to it (DCN 2022, Alg. 1)."""
    rows = []
    for alpha in FIG_ALPHAS:
        for e in FIG_EPS:
            e1 = alpha * e
            osue = _var("L-OSUE", 2, e, e1, "exact")
            row: dict[str, Any] = {"alpha": alpha, "eps_inf": e, "var_l_osue": osue}
            for cal in CALIBRATIONS:
                best = 0
                for k in range(2, MAX_K + 1):
                    if _var("L-GRR", k, e, e1, cal) < osue:
                        best = k
                    else:
                        break  # L-GRR's Var* grows with k
                row[f"max_k_lgrr_{cal}"] = best
            rows.append(row)
    return rows


# ====================================================================== plots
def plot(t1: list[dict], g_rows: list[dict], f2: list[dict], cross: list[dict], out: Path) -> list[Path]:
    plt = pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    figures = []
    # Fig. 1
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, cal in zip(axes, CALIBRATIONS):
        for i, a in enumerate(FIG_ALPHAS):
            sel = [r for r in g_rows if r["alpha"] == a]
            ax.plot([r["eps_inf"] for r in sel], [r["g_eq6"] for r in sel], "-o", ms=3, color=colours[i],
                    label=f"α={a:g} Eq. 6")
            ax.plot([r["eps_inf"] for r in sel], [r[f"g_best_{cal}"] for r in sel], "--x", ms=4, color=colours[i],
                    label=f"α={a:g} best ({cal})")
        ax.set_title(f"OLOLOHA g (EDBT 2023, Fig. 1): Eq. 6 vs best under the {cal} calibration", fontsize=8)
        ax.set_xlabel("$\\epsilon_\\infty$")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("g")
    axes[1].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    figures.append(save_figure(fig, out / "fig1_optimal_g.png"))
    # Fig. 2
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5), sharex=True)
    for ax, a in zip(axes.flat, FIG_ALPHAS):
        for i, label in enumerate(FIG2_PROTOCOLS):
            sel = [r for r in f2 if r["alpha"] == a and r["protocol"] == label]
            ax.plot([r["eps_inf"] for r in sel], [r["var_paper"] for r in sel], "-", color=colours[i],
                    label=f"{label} (paper)")
            ax.plot([r["eps_inf"] for r in sel], [r["var_exact"] for r in sel], "--", color=colours[i],
                    label=f"{label} (exact)")
        ax.set_yscale("log")
        ax.set_title(f"$\\epsilon_1 = {a:g}\\,\\epsilon_\\infty$", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    for ax in axes[-1]:
        ax.set_xlabel("$\\epsilon_\\infty$")
    for ax in axes[:, 0]:
        ax.set_ylabel("Var* (n = 10000)")
    axes[0][0].legend(fontsize=6)
    fig.suptitle("EDBT 2023, Fig. 2: approximate variance, k = 360 (solid: paper calibration, dashed: exact)",
                 fontsize=9)
    fig.tight_layout()
    figures.append(save_figure(fig, out / "fig2_variance.png"))
    # Table 1: exact / paper for L-GRR
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    for i, k in enumerate((2, 32, 1024)):
        for j, a in enumerate((0.6, 0.3, 0.1)):
            sel = [r for r in t1 if r["protocol"] == "L-GRR" and r["k"] == k and r["alpha"] == a]
            ax.plot([r["eps_inf"] for r in sel], [r["exact_over_paper"] for r in sel], ["-", "--", ":"][j],
                    marker="o", ms=3, color=colours[i], label=f"L-GRR k={k}, α={a:g}")
    ax.set_yscale("log")
    ax.set_xlabel("$\\epsilon_\\infty$")
    ax.set_ylabel("Var* exact / Var* paper")
    ax.set_title("DCN 2022, Table 1: L-GRR under the exact calibration", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)
    ax = axes[1]
    for i, a in enumerate(FIG_ALPHAS):
        sel = [r for r in cross if r["alpha"] == a]
        ax.plot([r["eps_inf"] for r in sel], [r["max_k_lgrr_paper"] for r in sel], "-o", ms=3, color=colours[i],
                label=f"α={a:g} paper")
        ax.plot([r["eps_inf"] for r in sel], [r["max_k_lgrr_exact"] for r in sel], "--x", ms=4, color=colours[i],
                label=f"α={a:g} exact")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("$\\epsilon_\\infty$")
    ax.set_ylabel("largest k where L-GRR beats L-OSUE")
    ax.set_title("ALLOMFREE's choice (DCN 2022, Alg. 1) by calibration", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    figures.append(save_figure(fig, out / "table1_calibration.png"))
    return figures


def run(out: Path) -> dict[str, Path]:
    run_ = Run("numerical", {"n": N, "fig_eps_inf": list(FIG_EPS), "fig_alphas": list(FIG_ALPHAS), "k_fig2": 360,
                             "seed": None, "out": str(out)}, out)
    run_.announce()
    t1, t2, g_rows, f2, cross = table1(), table2(), optimal_g(), figure2(), lgrr_crossover()
    files = {"table1": run_.csv(t1, "table1.csv"), "table2": run_.csv(t2, "table2.csv"),
             "optimal_g": run_.csv(g_rows, "fig1_optimal_g.csv"), "fig2": run_.csv(f2, "fig2_variance.csv"),
             "crossover": run_.csv(cross, "lgrr_crossover.csv")}
    _print(t1, g_rows, cross)
    run_.finish(plot(t1, g_rows, f2, cross, out))
    return files


def _print(t1: list[dict], g_rows: list[dict], cross: list[dict]) -> None:
    from rich.table import Table

    t = Table(title="DCN 2022, Table 1 (Var*, n = 10000): printed / paper calibration / exact calibration")
    for col in ("α", "ε∞", "protocol", "k", "printed", "paper cal.", "exact cal."):
        t.add_column(col, justify="right")
    for r in t1:
        t.add_row(f"{r['alpha']:g}", f"{r['eps_inf']:g}", r["protocol"], str(r["k"]), f"{r['printed']:.6g}",
                  f"{r['paper_calibration']:.6g}", f"{r['exact_calibration']:.6g}")
    print_table(console, t)
    changed = [r for r in cross if r["max_k_lgrr_paper"] != r["max_k_lgrr_exact"]]
    console.print(f"ALLOMFREE picks L-GRR for larger domains under the exact calibration at {len(changed)} of "
                  f"{len(cross)} (ε∞, α) points, e.g. " + ", ".join(
                      f"ε∞={r['eps_inf']:g} α={r['alpha']:g}: k ≤ {r['max_k_lgrr_paper']} → k ≤ {r['max_k_lgrr_exact']}"
                      for r in changed[:4]))
    moved = [r for r in g_rows if r["g_best_exact"] != r["g_eq6"]]
    console.print(f"OLOLOHA: Eq. 6's g differs from the exact-calibration optimum at {len(moved)} of {len(g_rows)} "
                  "points")


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment numerical``."""

    @group.command("numerical")
    def numerical(
            quick: Annotated[bool, typer.Option("--quick", help="Accepted for symmetry: the run takes seconds.")
                             ] = False,
            out: OutOption = Path("experiments/numerical"),
    ) -> None:
        """DCN 2022, Tables 1-2 and EDBT 2023, Figs. 1-2 (approximate variances, OLOLOHA's g) under the
        paper's and the exact calibration, and where ALLOMFREE's L-GRR / L-OSUE choice changes."""
        run(out)
