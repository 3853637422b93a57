"""``ldp experiment poisoning``: the frequency gain of Cao, Jia & Gong's attacks (USENIX Security 2021)
with and without the defenses of :mod:`estimators.poisoning`.

For each protocol and ε, ``n`` genuine devices draw values from a Zipf law (exponent 1.1, a random
permutation of ranks) and report once; the attacker picks ``r`` random target values. For each
attack and fraction β of fake devices (``m = β n / (1 − β)``), the fakes' reports are added to the
same genuine reports, and the experiment records:

* ``gain``: ``Σ_t f̃_t(genuine + fake) − f̃_t(genuine)`` with the protocol's estimator, no defense;
* ``gain_defended``: the same with the estimate of :func:`estimators.poisoning.defend` (the
  report-level defenses that are sound for the protocol) after the attack, against the plain
  estimate of the genuine reports;
* ``expected``: Cao et al.'s expected gain ``β ((s_T − r qs) / (ps − qs) − f_T)``
  (:func:`estimators.poisoning.expected_gain`; for MGA on local hashing ``s_T`` is the fakes'
  realized target support, since the seed search may not make every target collide);
* which reports the defenses dropped (fakes, genuine), and the per-step score
  (:func:`estimators.poisoning.detection_score`) with its alarm at the same α.

A row with β = 0 (attack ``none``) per protocol shows what the defenses do to honest data.
Everything is seeded (simulation mode: the reports are NOT private).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional, Sequence

import numpy as np
import typer

from estimators import poisoning as P
from estimators.randomness import SimulationWarning
from producers.datasets import zipf_weights

from .experiments import runner
from .experiments.runner import floats
from .common import fail
from .options import build
from .terminal import print_table

if TYPE_CHECKING:
    from rich.table import Table

DEFAULT_PROTOCOLS = ("GRR", "OUE", "OLH")
DEFAULT_ATTACKS = ("MGA", "MGA-nopad", "RIA", "RVA")
DEFAULT_BETAS = (0.01, 0.05, 0.10)
DEFAULT_EPS = (1.0, 3.0)


@dataclass
class Row:
    """One (protocol, ε, attack, β) measurement."""

    protocol: str
    eps: float
    attack: str
    beta: float
    n: int
    m: int
    r: int
    f_targets: float
    expected: float
    gain: float
    gain_defended: float
    fakes_dropped: int
    genuine_dropped: int
    itemset: str
    score: float | None
    flagged: bool

    @property
    def drop(self) -> float:
        """Fraction of the gain the defenses removed (nan without a gain to remove)."""
        return 1.0 - self.gain_defended / self.gain if abs(self.gain) > 1e-12 else math.nan


def _proto(name: str, k: int, eps: float):
    """Single-shot protocols at ``eps``; longitudinal ones at ``ε1 = eps``, ``ε∞ = 2 eps``."""
    return build(name, k=k, eps=eps, eps_inf=2 * eps, eps_1=eps)


def run(protocols: Sequence[str] = DEFAULT_PROTOCOLS, eps_values: Sequence[float] = DEFAULT_EPS,
        attacks: Sequence[str] = DEFAULT_ATTACKS, betas: Sequence[float] = DEFAULT_BETAS, n: int = 100_000,
        k: int = 100, r: int = 5, seed: int = 0, alpha: float = P.DEFAULT_ALPHA,
        on_row: Callable[[Row], None] | None = None) -> list[Row]:
    """Every measurement, in order (protocol, ε, then the honest row and the attacks by β)."""
    rows: list[Row] = []
    thr = P.detection_threshold(alpha)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        for name in protocols:
            for eps in eps_values:
                proto = _proto(name, k, eps)
                rng = np.random.default_rng([seed, k, n, int(eps * 1000), sum(map(ord, name))])
                weights = zipf_weights(k, 1.1)[rng.permutation(k)]
                values = rng.choice(k, size=n, p=weights)
                targets = np.sort(rng.choice(k, size=r, replace=False))
                f_t = float(np.isin(values, targets).mean())
                genuine = proto.randomize(values, rng, state=proto.new_state(n, rng))
                before = proto.estimate(proto.support(genuine), n)
                fam = P.family(proto)
                cases = [("none", 0.0)] + [(a, b) for a in attacks for b in betas
                                           if not (a == "MGA-nopad" and fam != "unary")]
                for attack, beta in cases:
                    m = P.fake_count(n, beta) if attack != "none" else 0
                    fake = P.craft_reports(proto, attack, targets, m, rng) if m else genuine[:0]
                    reports = np.concatenate([genuine, fake])
                    counts = proto.support(reports)
                    after = proto.estimate(counts, n + m)
                    defended = P.defend(proto, reports, alpha)
                    if attack == "none":
                        expected = 0.0
                    else:
                        s_t = (float(proto.support(fake)[targets].sum()) / m if attack == "MGA" and fam == "hashing"
                               else P.target_support(proto, attack, r))
                        expected = P.expected_gain(proto, beta, s_t, r, f_t)
                    score = P.detection_score(proto, counts, n + m)
                    row = Row(name, float(eps), attack, float(beta), n, m, r, f_t, expected,
                              P.frequency_gain(after, before, targets),
                              P.frequency_gain(defended.estimate, before, targets),
                              int((~defended.kept[n:]).sum()), int((~defended.kept[:n]).sum()),
                              " ".join(map(str, defended.itemset)), score,
                              bool(score is not None and abs(score) > thr))
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    return rows


def write_csv(rows: Sequence[Row], path: Path) -> None:
    """One line per row, the dataclass fields plus ``drop``."""
    runner.write_csv([{**asdict(row), "drop": row.drop} for row in rows], path)


def plot(rows: Sequence[Row], path: Path) -> None:
    """Gain vs β: one panel per (protocol, attack), one colour per ε; solid = no defense,
    dashed = defended, dotted = Cao et al.'s expected gain."""
    plt = runner.pyplot()
    protos = list(dict.fromkeys(r.protocol for r in rows))
    attacks = list(dict.fromkeys(r.attack for r in rows if r.attack != "none"))
    eps_values = list(dict.fromkeys(r.eps for r in rows))
    fig, axes = plt.subplots(len(protos), len(attacks), figsize=(3.2 * len(attacks), 2.6 * len(protos)),
                             squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, p in enumerate(protos):
        for j, a in enumerate(attacks):
            ax = axes[i][j]
            ax.set_title(f"{p} · {a}", fontsize=9)
            if not any(r.protocol == p and r.attack == a for r in rows):
                ax.text(0.5, 0.5, "n/a", ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
                continue
            for c, e in enumerate(eps_values):
                sel = sorted((r for r in rows if r.protocol == p and r.attack == a and r.eps == e),
                             key=lambda r: r.beta)
                if not sel:
                    continue
                x = [100 * r.beta for r in sel]
                col = colours[c % len(colours)]
                ax.plot(x, [r.gain for r in sel], "-o", color=col, label=f"ε={e:g}")
                ax.plot(x, [r.gain_defended for r in sel], "--s", color=col, label=f"ε={e:g} defended")
                ax.plot(x, [r.expected for r in sel], ":", color=col)
            ax.axhline(0.0, color="grey", lw=0.5)
            ax.set_xlabel("fake devices β (%)", fontsize=8)
            if j == 0:
                ax.set_ylabel("frequency gain")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=max(1, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    runner.save_figure(fig, path, dpi=120)


# ====================================================================== the command
def table(rows: Sequence[Row], title: str) -> Table:
    """The rich table of :func:`run`'s rows."""
    from rich.table import Table

    t = Table(title=title)
    for col in ("protocol", "ε", "attack", "β", "fakes", "expected", "gain", "defended", "drop",
                "fakes dropped", "genuine dropped", "itemset", "step z"):
        t.add_column(col, justify="left" if col in ("protocol", "attack", "itemset") else "right")
    for r in rows:
        drop = "" if r.attack == "none" or math.isnan(r.drop) else f"{100 * r.drop:.0f}%"
        z = "-" if r.score is None else f"{r.score:+.1f}" + (" [red]alarm[/red]" if r.flagged else "")
        fakes = f"{r.fakes_dropped}/{r.m}" if r.m else "-"
        t.add_row(r.protocol, f"{r.eps:g}", r.attack, f"{100 * r.beta:g}%", f"{r.m:,}",
                  f"{r.expected:.4f}", f"{r.gain:.4f}", f"{r.gain_defended:.4f}", drop, fakes,
                  f"{r.genuine_dropped:,}", r.itemset or "-", z)
    return t


def _pipeline(protocol: Optional[list[str]], attack: Optional[list[str]], betas: str, eps: str, n: int, k: int,
              r: int, seed: int, csv_path: Path) -> None:
    """``--pipeline``: :func:`ldpstream_cli.poisoning_pipeline.run_pipeline` and its table."""
    from rich.console import Console
    from rich.table import Table

    from .poisoning_pipeline import PIPELINE_PROTOCOLS, run_pipeline

    console = Console()
    beta_values, eps_values = floats(betas, "--betas"), floats(eps, "--eps")
    attacks = attack or ["MGA"]
    if len(beta_values) != 1 or len(eps_values) != 1 or len(attacks) != 1:
        fail("--pipeline runs one attack at one β and one ε: give --betas, --eps and --attack one value each "
             "(e.g. --betas 0.05 --eps 1 --attack MGA)")
    console.print(f"[bold yellow]SIMULATION MODE[/]: --seed {seed} seeds every device and attacker draw; "
                  "the reports are NOT private.")
    rows = run_pipeline(protocol or PIPELINE_PROTOCOLS, attacks[0], n=n, beta=beta_values[0], eps=eps_values[0],
                        k=k, r=r, seed=seed, on_status=lambda s: console.print(f"[dim]{s}[/dim]"))
    tab = Table(title=f"poisoning through the pipeline: {attacks[0]}, n={n:,} genuine, β={beta_values[0]:g}, "
                      f"ε={eps_values[0]:g}, k={k}, r={r}, seed {seed}")
    for col in ("protocol", "defense", "fakes", "gain without", "gain with", "refused at ingest",
                "n_rejected (final)", "genuine rejected (attacked step, ≥)", "genuine rejected (honest step)"):
        tab.add_column(col, justify="left" if col in ("protocol", "defense") else "right")
    for row in rows:
        tab.add_row(row.protocol, row.defense if row.defense != "none" else "none sound", f"{row.m:,}",
                    f"{row.gain:.3f}", f"{row.gain_defended:.3f}", f"{row.refused_at_ingest:,}",
                    f"{row.rejected_by_worker:,}",
                    f"{row.genuine_rejected_attacked:,} ({100 * row.genuine_rejected_attacked / row.n:.2f}%)",
                    f"{row.genuine_rejected:,} ({100 * row.genuine_rejected_fraction:.2f}%)")
    print_table(console, tab)
    console.print("gain = Σ over the targets of (final estimate − estimate of the genuine reports alone); "
                  "\"none sound\": the protocol has no sound report-level defense, the gain with = without "
                  "(docs/privacy.md, \"Poisoning\"); genuine rejected in the attacked step: what the defense left "
                  "out beyond the fakes (a lower bound); in the honest step: what it left out of the same genuine "
                  "reports sent alone")
    runner.write_csv([{**asdict(row), "genuine_rejected_attacked": row.genuine_rejected_attacked,
                       "genuine_rejected_fraction": row.genuine_rejected_fraction} for row in rows], csv_path)
    console.print(f"CSV: {csv_path}")


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment poisoning`` to the ``experiment`` group (created by :mod:`ldpstream_cli.experiments`)."""
    from rich.console import Console

    console = Console()

    @group.command("poisoning")
    def poisoning(
            protocol: Annotated[Optional[list[str]], typer.Option(
                "--protocol", "-p", help="Protocols (repeatable): GRR, L-GRR, SUE, OUE, L-OSUE, ..., BLH, OLH, "
                                         "LOLOHA. Default: GRR, OUE, OLH.")] = None,
            attack: Annotated[Optional[list[str]], typer.Option(
                "--attack", "-a", help=f"Attacks (repeatable): {', '.join(P.ATTACKS)}. Default: all.")] = None,
            betas: Annotated[Optional[str], typer.Option(
                help="Fractions of fake devices β = m / (n + m). Default: 0.01,0.05,0.10 (--pipeline: 0.05).")] = None,
            eps: Annotated[Optional[str], typer.Option(
                help="ε values (longitudinal protocols: ε1 = ε, ε∞ = 2ε). Default: 1,3 (--pipeline: 1).")] = None,
            n: Annotated[Optional[int], typer.Option(
                help="Genuine devices. Default: 100,000 (--pipeline: 20,000).")] = None,
            k: Annotated[int, typer.Option("--k", "-k", help="Domain size.")] = 100,
            targets: Annotated[int, typer.Option("--targets", "-r", help="Target values r of the attacker.")] = 5,
            alpha: Annotated[float, typer.Option(help="False-alarm rate of every defense.")] = P.DEFAULT_ALPHA,
            seed: Annotated[int, typer.Option(help="Seed of every draw (simulation mode).")] = 0,
            csv_path: Annotated[Path, typer.Option("--csv", help="CSV output.")] = Path("poisoning.csv"),
            plot_path: Annotated[Optional[Path], typer.Option(
                "--plot", help="PNG plot (needs matplotlib, from the bench extra).")] = Path("poisoning.png"),
            pipeline: Annotated[bool, typer.Option(
                "--pipeline", help="Send the attack through a local stack, the HTTP ingest and a worker, with and "
                                   "without the live defense (campaign `defense`): one β, one ε, one attack; "
                                   "defaults n=20,000, β=5%, ε=1, MGA, protocols OUE, L-OSUE, GRR, L-GRR, "
                                   "LOLOHA.")] = False,
    ) -> None:
        """Frequency gain of MGA / RIA / RVA (Cao, Jia & Gong, USENIX Security 2021) with and without the
        defenses, at several fractions of fake devices: a table, a CSV file and a plot."""
        from estimators.errors import LDPError

        if pipeline:
            _pipeline(protocol, attack, betas or "0.05", eps or "1", n or 20_000, k, targets, seed, csv_path)
            return
        betas, eps, n = betas or "0.01,0.05,0.10", eps or "1,3", n or 100_000

        bad = [a for a in (attack or []) if a not in P.ATTACKS]
        if bad:
            raise typer.BadParameter(f"unknown attack(s) {bad}; known: {', '.join(P.ATTACKS)}")
        console.print(f"[bold yellow]SIMULATION MODE[/]: --seed {seed} seeds every device and attacker draw; "
                      "the reports are NOT private.")
        try:
            rows = run(protocol or DEFAULT_PROTOCOLS, floats(eps, "--eps"), attack or DEFAULT_ATTACKS,
                       floats(betas, "--betas"), n=n, k=k, r=targets, seed=seed, alpha=alpha)
        except LDPError as exc:
            fail(exc)
        print_table(console, table(rows, f"poisoning: n={n:,} genuine devices (Zipf 1.1), k={k}, r={targets} targets, "
                                  f"α={alpha:g}, seed {seed}"))
        console.print("gain = Σ over the targets of (estimate after the attack − estimate of the genuine reports); "
                      "defended = the same after the defenses that are sound for the protocol (unary: report-size "
                      "check + co-support itemset; local hashing: seed-collision itemset; GRR: none); expected = "
                      "Cao et al.'s closed form; step z = the per-step score from the counts (unary), alarm at "
                      f"|z| > {P.detection_threshold(alpha):.2f}")
        write_csv(rows, csv_path)
        console.print(f"CSV: {csv_path}")
        if plot_path is not None:
            try:
                plot(rows, plot_path)
                console.print(f"plot: {plot_path}")
            except ImportError:
                console.print("[yellow]no plot: matplotlib is not installed (pip install -e '.\\[bench]')[/yellow]")
