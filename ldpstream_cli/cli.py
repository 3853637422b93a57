"""The ``ldp`` command: ``ldp demo``, ``ldp protocols``, ``ldp audit``, ``ldp bench protocols``."""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import estimators
from ldpstream_dev.stack import CLI_RUN_DIR
from estimators.errors import LDPError
from stream_app.settings import setting_specs

from .common import DEMO_CAMPAIGN, error_console, fail, fmt_eps, stack_addresses
from .options import build, check_options
from .terminal import CSV_FLAG, JSON_FLAG, TableOutput, print_table, progress_bar

app = typer.Typer(help="ldp-stream: telemetry under local differential privacy.", no_args_is_help=True,
                  pretty_exceptions_show_locals=False, add_completion=False)
bench_app = typer.Typer(help="Benchmarks that print ratios measured side by side in one run.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")
stack_app = typer.Typer(help="The embedded local stack: a Kafka-protocol broker (tansu) and redis-server.",
                        no_args_is_help=True)
app.add_typer(stack_app, name="stack")
RUN_DIR = Annotated[str, typer.Option("--run-dir", help="Run directory of the stack (state file, logs).")]
console = Console()

K = Annotated[int, typer.Option("--k", "-k", help="Domain size.")]
EPS = Annotated[float, typer.Option(help="ε of single-shot protocols.")]
EPS_INF = Annotated[float, typer.Option("--eps-inf", help="ε∞ of longitudinal protocols (one memoized value).")]
EPS_1 = Annotated[float, typer.Option("--eps-1", help="ε1 of longitudinal protocols (one report).")]
SEED = Annotated[int, typer.Option(help="Seed of every random draw (runs are reproducible).")]
SIM_SEED = Annotated[Optional[int], typer.Option(
    help="Simulation mode: seed every device key and noise draw (reproducible, NOT private). "
         "Default: 256-bit keys from the OS CSPRNG, as on real devices.")]
SIMULATION_BANNER = ("[bold yellow]SIMULATION MODE[/]: --seed {seed} seeds every device key and noise draw; "
                     "the reports are reproducible by anyone who knows the seed and are NOT private.")
CAL = Annotated[str, typer.Option(help="p2 calibration of L-GRR and LOLOHA: exact or paper.")]


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        print(f"ldp-stream {version('ldp-stream')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", is_eager=True,
                                                callback=_print_version)] = False) -> None:
    """ldp-stream: telemetry under local differential privacy."""



@app.command()
def protocols(k: K = 100, eps: EPS = 1.0, eps_inf: EPS_INF = 2.0, eps_1: EPS_1 = 1.0,
              n: Annotated[int, typer.Option(help="Reports (devices, for the solutions) for Var*.")] = 10_000,
              ks: Annotated[str, typer.Option(
                  "--ks", help="Domain sizes of the multidimensional solutions' attributes, comma-separated.")]
              = "2,10,50,200",
              as_json: JSON_FLAG = False, as_csv: CSV_FLAG = False) -> None:
    """List every protocol and multidimensional solution with its privacy figures and approximate variance."""
    out = TableOutput(console, as_json, as_csv)
    domains = _sequence(ks, "--ks") or ()
    try:
        check_options(k=k, eps=eps, eps_inf=eps_inf, eps_1=eps_1, n=n)
        check_options(ks=min(domains, default=0))
    except ValueError as exc:
        fail(exc)
    t = Table(title=f"protocols at k={k}, ε={eps}, ε∞={eps_inf}, ε1={eps_1}, Var* at n={n}")
    for col in ("protocol", "parameters", "ε1 (true)", "ε∞ (true)", "worst-case ε", "Var*"):
        t.add_column(col, justify="right" if col not in ("protocol", "parameters") else "left")
    for name in estimators.PROTOCOLS:
        try:
            p = build(name, k=k, eps=eps, eps_inf=eps_inf, eps_1=eps_1)
        except LDPError as exc:  # this protocol cannot take these options (the options themselves are valid)
            t.add_row(name, f"[yellow]{exc}[/yellow]", "", "", "", "")
            continue
        extra = {a: v for a, v in p.params().items() if a not in ("protocol", "k")}
        t.add_row(name, " ".join(f"{a}={v}" for a, v in extra.items()), f"{p.eps_first:.4f}", f"{p.eps_inf:.4f}",
                  fmt_eps(p.worst_case_loss, ".4g"), f"{p.variance(n):.3e}")
    out.show(t)
    t = Table(title=f"multidimensional solutions (one budget over d={len(domains)} attributes, ks={ks}; ε={eps}, "
                    f"ε∞={eps_inf}, ε1={eps_1}), Var* per attribute at n={n} devices")
    for col in ("solution", "channels", "ε1 (tuple)", "ε∞ (tuple)", "worst-case ε", "Var* per attribute"):
        t.add_column(col, justify="left" if col in ("solution", "channels", "Var* per attribute") else "right")
    for sol_name, proto in _solution_specs(list(_LISTED_SOLUTIONS)):
        label = _solution_label(sol_name, proto)
        try:
            sol = _build_solution(sol_name, proto, domains, eps, eps_inf, eps_1)
        except LDPError as exc:
            t.add_row(label, f"[yellow]{exc}[/yellow]", "", "", "", "")
            continue
        t.add_row(label, " ".join(c.name for c in sol.channels), f"{sol.eps_first:.4f}", f"{sol.eps_inf:.4f}",
                  fmt_eps(sol.worst_case_loss, ".4g"), " ".join(f"{sol.variance(j, n):.2e}" for j in range(sol.d)))
    out.show(t)
    out.close()


@app.command()
def demo(campaign: CAMPAIGN = DEMO_CAMPAIGN,
         devices: Annotated[int, typer.Option(help="Simulated devices.")] = 100_000,
         steps: Annotated[int, typer.Option(help="Time steps.")] = 6,
         workers: Annotated[int, typer.Option(help="Stream-app worker processes.")] = 2,
         batch_size: Annotated[int, typer.Option(help="Reports per Kafka message.")] = 50_000,
         step_seconds: Annotated[float, typer.Option(help="Minimum wall time per step (to watch it).")] = 2.0,
         top: Annotated[int, typer.Option(help="Values shown per attribute.")] = 8,
         seed: SIM_SEED = None,
         keep_run_dir: Annotated[bool, typer.Option(
             help="Keep the run directory (stack data, worker logs; ldp-demo-* in the temporary directory).")]
         = False) -> None:
    """The whole pipeline on the embedded local stack: stack up, workers, a simulated fleet, and a live
    view of true vs estimated histograms and privacy figures; everything is stopped on exit or Ctrl-C."""
    from .demo import run_demo

    try:
        check_options(devices=devices, steps=steps, workers=workers, batch_size=batch_size, top=top)
    except ValueError as exc:
        fail(exc)
    if seed is not None:
        console.print(SIMULATION_BANNER.format(seed=seed))
    code = run_demo(campaign, devices, steps, workers, batch_size, step_seconds, seed, top, console, keep_run_dir)
    if code == 130:
        # interrupted, and everything it started is stopped and removed: leave at once. The interpreter's
        # finalization (thread joins, atexit, the clients' finalizers) has nothing left to do, and after a
        # SIGTERM it has been seen to end the process by SIGINT (status -2) instead of 130
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    raise typer.Exit(code)


@app.command()
def top(url: Annotated[str, typer.Option(help="A worker's base URL (its web server; `ldp demo` prints it).")]
        = "http://127.0.0.1:6066",
        interval: Annotated[float, typer.Option(help="Seconds between polls.")] = 1.0,
        once: Annotated[bool, typer.Option("--once", help="Print one frame and exit (1 if the worker did not "
                                                           "answer).")] = False,
        values: Annotated[int, typer.Option(help="Top values shown per attribute.")] = 3) -> None:
    """A worker's live figures in the terminal (for SSH sessions): reports/s, rejections, lag, latency, and per
    attribute the latest histogram, top values and privacy figures."""
    from .top import run_top

    raise typer.Exit(run_top(url, interval, once, values, console))


@app.command()
def simulate(n: Annotated[int, typer.Option(help="Devices in the simulated fleet.")] = 100_000,
         k: K = 50, steps: Annotated[int, typer.Option(help="Time steps.")] = 5,
         eps: EPS = 1.0, eps_inf: EPS_INF = 2.0, eps_1: EPS_1 = 1.0,
         dataset: Annotated[str, typer.Option(help="uniform, zipf or syn (the evolving Syn model of Arcolezi et al., EDBT 2023).")] = "syn",
         p_change: Annotated[float, typer.Option(help="Per-step change probability (syn).")] = 0.25,
         protocol: Annotated[Optional[list[str]], typer.Option("--protocol", "-p", help="Restrict to these protocols.")] = None,
         seed: SEED = 7) -> None:
    """Offline simulation (no broker): an evolving population, every protocol, true vs estimated
    frequencies and privacy figures."""
    from producers.datasets import EvolvingPopulation
    from producers.fleet import true_frequencies

    names = protocol or list(estimators.PROTOCOLS)
    try:
        check_options(n=n, k=k, steps=steps, eps=eps, eps_inf=eps_inf, eps_1=eps_1)
    except ValueError as exc:
        fail(exc)
    console.print(f"[bold]ldp-stream offline demo[/bold]: {n:,} devices, k={k}, {steps} steps, dataset={dataset} "
                  f"(zipf base, p_change={p_change}), ε={eps}, ε∞={eps_inf}, ε1={eps_1}")
    try:
        protos = {name: build(name, k=k, eps=eps, eps_inf=eps_inf, eps_1=eps_1) for name in names}
    except LDPError as exc:
        fail(exc)
    console.print(SIMULATION_BANNER.format(seed=seed))
    rng = np.random.default_rng(seed)
    pop = EvolvingPopulation(n=n, k=k, kind=dataset, p_change=p_change, base="zipf", rng=np.random.default_rng(seed + 1))
    states = {name: p.new_state(n, rng=np.random.default_rng(seed + 2)) for name, p in protos.items()}
    sq_err = {name: [] for name in protos}
    last: dict[str, np.ndarray] = {}
    with progress_bar(console) as bar:
        task = bar.add_task("randomize → support → estimate", total=steps * len(protos))
        for _t in range(steps):
            values = pop.step()
            for name, p in protos.items():
                reports = p.randomize(values, rng, state=states[name])
                est = p.estimate(p.support(reports), n)
                truth = true_frequencies(p, values)
                sq_err[name].append(np.mean((est - truth) ** 2))
                last[name] = est
                bar.advance(task)
    t = Table(title=f"after {steps} steps (MSE_avg of Arcolezi et al., EDBT 2023, Eq. 7; ε̌_avg of Eq. 8 from the devices' memo state)")
    for col in ("protocol", "MSE_avg", "Var* (avg over values)", "ε1", "ε∞", "ε̌_avg (measured)", "worst case"):
        t.add_column(col, justify="left" if col == "protocol" else "right")
    for name, p in protos.items():
        st = states[name]
        loss = float(np.mean(p.longitudinal_loss(p.memoized_counts(st)))) if st is not None else float("inf")
        truth = true_frequencies(p, pop.values)
        t.add_row(name, f"{np.mean(sq_err[name]):.3e}", f"{np.mean(p.variance_exact(truth, n)):.3e}",
                  f"{p.eps_first:.3f}", f"{p.eps_inf:.3f}", fmt_eps(loss, ".3g"), fmt_eps(p.worst_case_loss, ".3g"))
    print_table(console, t)
    truth = pop.true_frequencies()
    top = np.argsort(truth)[::-1][:10]
    show = [nm for nm in ("L-OSUE", "LOLOHA", "OLH", "GRR") if nm in last and protos[nm].domain_size == k][:3]
    h = Table(title="true vs estimated frequency, last step, 10 most frequent values")
    h.add_column("value", justify="right")
    h.add_column("true", justify="right")
    for nm in show:
        h.add_column(nm, justify="right")
    for v in top:
        h.add_row(str(v), f"{truth[v]:.4f}", *(f"{last[nm][v]:.4f}" for nm in show))
    print_table(console, h)


_ROUND_TITLES = {"first": "first round (one report per device, claim ε1)",
                 "prr": "PRR round (memoized response alone, claim ε∞)",
                 "longitudinal": "longitudinal round (τ reports per device, claim = published bound B(τ), seed-aware events)"}


def _sequence(text: Optional[str], name: str) -> Optional[tuple[int, ...]]:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        fail(LDPError(f"{name} must be comma-separated integers, got {text!r}"))


@app.command()
def audit(protocol: Annotated[Optional[str], typer.Argument(
              help="Protocol, numeric mechanism (Laplace, Duchi, PM, HM, SW, 1BitMean) or open-domain sketch "
                   "(CMS, HCMS, RAPPOR, PEM, TreeHist; 'sketch' for the five) to audit; omit for every one.")] = None,
          k: K = 8, eps: EPS = 1.0, eps_inf: EPS_INF = 2.0, eps_1: EPS_1 = 1.0,
          g: Annotated[Optional[int], typer.Option(help="LOLOHA hash range.")] = None,
          b: Annotated[Optional[int], typer.Option(help="dBitFlipPM buckets (default k).")] = None,
          d: Annotated[Optional[int], typer.Option(help="dBitFlipPM sampled buckets (default 1).")] = None,
          calibration: CAL = "exact",
          gamma: Annotated[Optional[float], typer.Option(help="1BitMean output perturbation (default 0).")] = None,
          round_: Annotated[Optional[list[str]], typer.Option(
              "--round", "-r", help="Round to audit: first (ε1 of one report), prr (ε∞ of the memoized "
              "response) or longitudinal (a device's τ reports vs the published longitudinal bound, with "
              "seed-aware events for LOLOHA and dBitFlipPM); "
              "repeat for several. Default: all three.")] = None,
          v1: Annotated[int, typer.Option(help="First input.")] = 0,
          v2: Annotated[int, typer.Option(help="Second input.")] = 1,
          x1: Annotated[Optional[float], typer.Option(
              help="Numeric mechanisms: first input (default the range's low end, -1).")] = None,
          x2: Annotated[Optional[float], typer.Option(
              help="Numeric mechanisms: second input (default the range's high end, 1).")] = None,
          tau: Annotated[int, typer.Option(help="Longitudinal round: reports per device (constant and "
                                                "switching sequences of this length).")] = 16,
          seq1: Annotated[Optional[str], typer.Option(
              help="Longitudinal round: first input sequence, comma-separated (with --seq2; replaces the "
                   "default pairs).")] = None,
          seq2: Annotated[Optional[str], typer.Option(help="Longitudinal round: second input sequence.")] = None,
          trials: Annotated[Optional[int], typer.Option(
              help="Reports per input (first, prr) or devices per sequence (longitudinal). Default per "
                   "round: first 1000000, prr 1000000, longitudinal 200000.")] = None,
          confidence: Annotated[float, typer.Option(help="Confidence of the Clopper-Pearson bound.")] = 0.95,
          seed: SEED = 0) -> None:
    """Empirical privacy audit: an ε lower bound (Clopper-Pearson) next to the stated ε, per round; numeric
    mechanisms on an event of a discretization of their output."""
    import warnings

    from estimators import audit as A
    from estimators.numeric import MECHANISMS, make_numeric
    from estimators.numeric import audit as NA
    from estimators.randomness import SimulationWarning

    from . import bench_sketch

    warnings.simplefilter("ignore", SimulationWarning)
    console.print(f"audit devices run in the seeded simulation mode (--seed {seed}) so that a run can be "
                  "reproduced; the kernels are those of real devices")
    rounds = list(dict.fromkeys(round_ or A.ROUNDS))
    bad = [r for r in rounds if r not in A.ROUNDS]
    if bad:
        fail(LDPError(f"--round must be one of {', '.join(A.ROUNDS)}, got {', '.join(bad)}"))
    s1, s2 = _sequence(seq1, "--seq1"), _sequence(seq2, "--seq2")
    if (s1 is None) != (s2 is None):
        fail(LDPError("pass both --seq1 and --seq2, or neither"))
    try:
        numeric: list = []  # numeric mechanisms: (name, mechanism), audited by estimators.numeric.audit
        sketches: list = []  # open-domain protocols, audited by ldpstream_cli.bench_sketch
        if protocol is None:
            plan = A.plan_audit_cases(k)
            cases = [(name, estimators.make(name, **params)) for name, params in plan.cases]
            skipped = list(plan.skipped)
            numeric = NA.default_numeric_cases()
            sketches = list(bench_sketch.SKETCHES)
        elif protocol in MECHANISMS and protocol not in estimators.PROTOCOLS:
            cases, skipped = [], []
            numeric = [(protocol, make_numeric(protocol, eps=eps, **({} if gamma is None else {"gamma": gamma})))]
        elif protocol in bench_sketch.SKETCHES or protocol == "sketch":
            cases, skipped = [], []
            sketches = list(bench_sketch.SKETCHES) if protocol == "sketch" else [protocol]
        else:
            cases = [(protocol, build(protocol, k=k, eps=eps, eps_inf=eps_inf, eps_1=eps_1, g=g, b=b, d=d,
                                      calibration=calibration))]
            skipped = []
        plans = {}
        for r in rounds:
            jobs, skip = A.plan_round(cases, r, v1=v1, v2=v2, tau=tau, seq1=s1, seq2=s2)
            njobs, nskip = NA.plan_numeric_round(numeric, r, x1=x1, x2=x2)
            plans[r] = jobs + njobs + bench_sketch.sketch_audit_jobs(sketches, r, eps=eps, v1=v1, v2=v2, seed=seed)
            skipped += skip + nskip
    except LDPError as exc:
        fail(exc)
    if not any(plans.values()):
        fail(LDPError(f"nothing to audit in round(s) {', '.join(rounds)}: the PRR and longitudinal rounds "
                       "need a memoizing protocol"))
    failed = False
    for r in rounds:
        jobs = plans[r]
        if not jobs:
            console.print(f"[yellow]{_ROUND_TITLES[r]}: not applicable (no memoizing protocol)[/yellow]")
            continue
        results = []
        with progress_bar(console) as bar:
            for job in jobs:
                task = bar.add_task(f"{r} {getattr(job, 'label', None) or repr(job.proto)}"[:60],
                                    total=job.reports(trials))
                try:
                    results.append(job.run(trials=trials, seed=seed, confidence=confidence,
                                           on_progress=lambda done, tot, t=task: bar.update(t, completed=done)))
                except LDPError as exc:
                    fail(exc)
        n = A.DEFAULT_TRIALS[r] if trials is None else trials
        unit = (f"{n:,} devices per sequence" if r == "longitudinal"
                else f"{n:,} {'fresh devices' if r == 'prr' else 'reports'} per input")
        t = Table(title=f"privacy audit, {_ROUND_TITLES[r]}: {unit}, {confidence:.0%} Clopper-Pearson")
        longi = r == "longitudinal"
        events = longi or any(res.event for res in results)  # numeric mechanisms: the event on their output
        cols = ("protocol", "inputs", "claim", "ε claimed", "ε lower bound", "ε̂ [CI]", "tightness", "verdict")
        if longi:  # the accounted ε (EDBT 2023, Eq. 8) for comparison, and which event gave the bound
            cols = cols[:4] + ("accounted", "event") + cols[4:]
        elif events:
            cols = cols[:4] + ("event",) + cols[4:]
        for col in cols:
            t.add_column(col, justify="left" if col in ("protocol", "inputs", "event") else "right")
        for res in results:
            extra = " ".join(f"{a}={v}" for a, v in res.params.items() if a not in ("protocol", "mechanism", "k"))
            more = ((f"{res.accounted_label} = {fmt_eps(res.eps_accounted)}", escape(res.event)) if longi
                    else (escape(res.event or "-"),) if events else ())
            t.add_row(f"{res.protocol} {extra}", A.describe_inputs(res), res.theory_label, fmt_eps(res.eps_theory),
                      *more, f"{res.eps_lower:.4f}",
                      f"{res.eps_hat:.4f} [{res.eps_hat_ci[0]:.3f}, {res.eps_hat_ci[1]:.3f}]", f"{res.tightness:.1%}",
                      "[green]ok[/green]" if res.passed else "[red]LEAKS MORE THAN STATED[/red]")
        print_table(console, t)
        failed |= not all(res.passed for res in results)
    for s in skipped:
        console.print(f"[yellow]skipped[/yellow] {s}")
    if failed:
        raise typer.Exit(1)


@bench_app.command("protocols")
def bench_protocols(k: K = 100, n: Annotated[int, typer.Option(help="Reports per measurement.")] = 100_000,
                    eps: EPS = 1.0, eps_inf: EPS_INF = 2.0, eps_1: EPS_1 = 1.0,
                    protocol: Annotated[Optional[list[str]], typer.Option(
                        "--protocol", "-p", help="Protocol or numeric mechanism, e.g. 'OLH', 'PM' (repeatable; 'all' "
                                                 "for every one, 'numeric' for every numeric mechanism); open-domain "
                                                 "CMS, HCMS, RAPPOR, PEM vs pure-ldp ('sketch' for the four; only "
                                                 "when named).")] = None,
                    solution: Annotated[Optional[list[str]], typer.Option(
                        "--solution", "-s",
                        help="Multidimensional solution, e.g. 'SPL[GRR]', 'RS+FD[OUE-z]', 'L-SMP[L-OSUE]', "
                             "'ALLOMFREE' (repeatable; 'default' for the standard set). With neither -p nor -s: "
                             "every protocol, every numeric mechanism and the standard set of solutions.")] = None,
                    ks: Annotated[str, typer.Option(
                        "--ks", help="Domain sizes of the solutions' attributes, comma-separated.")] = "2,10,50,200",
                    repeats: Annotated[int, typer.Option(help="Best of this many runs of ours.")] = 5,
                    peer_seconds: Annotated[float, typer.Option(help="Time budget of each peer measurement.")] = 4.0,
                    sketch_m: Annotated[int, typer.Option(help="Sketches: CMS/HCMS cells m.")] = 1024,
                    sketch_rows: Annotated[int, typer.Option(help="Sketches: CMS/HCMS rows k.")] = 16,
                    topk_n: Annotated[int, typer.Option(help="PEM/TreeHist: devices of the top-K over 2^32.")] = 1_000_000,
                    pem_peer_n: Annotated[int, typer.Option(
                        help="PEM: devices of the run beside pure-ldp's PEM (0: none; = --topk-n: one run).")] = 100_000,
                    same_n: Annotated[int, typer.Option(
                        help="Sketches: reports of the same-report comparison (at most -n).")] = 20_000,
                    seed: SEED = 0, as_json: JSON_FLAG = False, as_csv: CSV_FLAG = False) -> None:
    """reports/s of randomize and support (+estimate), ours vs multi-freq-ldpy, in one run: single-attribute
    protocols (domain size --k), numeric mechanisms (ε = --eps, values on [0, 100]) and multidimensional solutions
    (domain sizes --ks)."""
    from estimators.numeric import make_numeric
    from estimators.numeric.protocol import NumericProtocol

    from . import bench_peer

    out = TableOutput(console, as_json, as_csv)
    con = out.console
    try:
        check_options(k=k, eps=eps, eps_inf=eps_inf, eps_1=eps_1, n=n, repeats=repeats, peer_seconds=peer_seconds)
    except ValueError as exc:
        fail(exc)

    from . import bench_sketch

    sketches = [nm for nm in bench_sketch.SKETCHES if protocol and ("sketch" in protocol or nm in protocol)]
    if protocol is not None:
        protocol = [p for p in protocol if p != "sketch" and p not in bench_sketch.SKETCHES]
    have_peer = bench_peer.peer_available()
    if not have_peer and not (sketches and not protocol):
        con.print("[yellow]multi-freq-ldpy is not installed (pip install -e '.[bench]'): peer columns empty[/yellow]")
    names, mechanisms = _bench_selection(protocol, solution)
    try:
        sols = _solution_specs(solution or ([] if protocol or sketches else ["default"]))
    except ValueError as exc:
        fail(exc)
    domains = _sequence(ks, "--ks") or ()
    if sols and (not domains or min(domains) < 2):
        fail(LDPError(f"--ks needs at least one domain size, each >= 2, got {ks!r}"))
    # randomize: >= 20x with cryptographic device randomness (ChaCha20 streams, 256-bit keys)
    targets = {("OUE", "rand"): 20, ("OLH", "rand"): 20, ("L-OSUE", "rand"): 20, ("GRR", "rand"): 20,
               ("OLH", "agg"): 50, ("LOLOHA", "agg"): 50}
    targets.update({(_solution_label(*s), kind): 20 for s in sols for kind in ("rand", "agg")})
    rows, sol_rows, num_rows, prefixes = [], [], [], []
    with progress_bar(con) as bar:
        task = bar.add_task("benchmarking", total=len(names) + len(mechanisms) + len(sols))
        for name in names:
            bar.update(task, description=f"bench {name}")
            try:
                p = build(name, k=k, eps=eps, eps_inf=eps_inf, eps_1=eps_1)
            except LDPError as exc:
                con.print(f"[yellow]{name}: {exc}[/yellow]")
                bar.advance(task)
                continue
            ours_r, ours_a = _time_ours(p, n, repeats, seed)
            peer_r = peer_a = None
            if have_peer and name in bench_peer.PEER_PROTOCOLS:
                single = not p.longitudinal
                kw = dict(eps=eps if single else None, eps_inf=None if single else eps_inf,
                          eps_1=None if single else eps_1, seed=seed, max_seconds=peer_seconds)
                if name == "dBitFlipPM":
                    kw.update(b=p.domain_size, d_bits=p.params().get("d", 1))
                peer_r = bench_peer.time_peer_randomize(name, k, n, **kw)
                peer_a = bench_peer.time_peer_support(name, k, n, **kw)
            rows.append((name, ours_r, peer_r, ours_a, peer_a))
            bar.advance(task)
        for name in mechanisms:
            bar.update(task, description=f"bench {name}")
            try:
                mech = NumericProtocol(make_numeric(name, eps=eps, lo=_NUMERIC_RANGE[0], hi=_NUMERIC_RANGE[1]))
            except LDPError as exc:
                con.print(f"[yellow]{name}: {exc}[/yellow]")
                bar.advance(task)
                continue
            num_rows.append((name, mech, *_time_numeric(mech, n, repeats, seed)))
            bar.advance(task)
        if sols:
            values = bench_peer.solution_values(domains, n, seed)
        for sol_name, proto in sols:
            label = _solution_label(sol_name, proto)
            bar.update(task, description=f"bench {label}")
            try:
                sol = _build_solution(sol_name, proto, domains, eps, eps_inf, eps_1)
            except LDPError as exc:
                con.print(f"[yellow]{label}: {exc}[/yellow]")
                bar.advance(task)
                continue
            ours_r, ours_a = _time_ours_solution(sol, values, repeats)
            peer_r = peer_a = None
            if have_peer and (sol_name, proto) in bench_peer.PEER_SOLUTIONS:
                kw = dict(eps=eps, eps_inf=eps_inf, eps_1=eps_1, seed=seed, max_seconds=peer_seconds)
                peer_r, m_r = bench_peer.time_peer_solution_randomize(sol_name, proto, domains, n, **kw)
                peer_a, m_a = bench_peer.time_peer_solution_support(sol_name, proto, domains, n, **kw)
                prefixes += [f"{label} {what} m={m:,}" for what, m in (("client", m_r), ("aggregator", m_a)) if m < n]
            sol_rows.append((label, ours_r, peer_r, ours_a, peer_a))
            bar.advance(task)

    def ratio(name: str, kind: str, a: float, b: float | None) -> str:
        if not b:
            return "-"
        r = a / b
        target = targets.get((name, kind))
        mark = "" if target is None else (f" [green]≥{target} ok[/green]" if r >= target else f" [red]<{target}![/red]")
        return f"{r:,.0f}x{mark}"

    tables = []
    if rows:
        tables.append((f"protocol throughput, k={k}, n={n:,} (reports/s; ratio = ours / multi-freq-ldpy, same run)",
                       "protocol", rows))
    if num_rows:
        t = Table(title=f"numeric mechanisms, ε={eps:g}, values uniform on [{_NUMERIC_RANGE[0]:g}, "
                        f"{_NUMERIC_RANGE[1]:g}], n={n:,} (reports/s; support+estimate = the exact aggregate, then "
                        f"the mean and its variance from it)")
        for col in ("mechanism", "report", "randomize", "randomize target", "support+estimate", "aggregate target"):
            t.add_column(col, justify="left" if col in ("mechanism", "report") else "right")
        for name, mech, r_o, a_o, _ in num_rows:
            t.add_row(name, str(mech.report_dtype), _si(r_o), _numeric_target(name, "rand", r_o), _si(a_o),
                      _numeric_target(name, "agg", a_o))
        tables.append(t)
    if sol_rows:
        tables.append((f"multidimensional solutions, d={len(domains)}, ks={','.join(map(str, domains))}, ε={eps:g} "
                       f"(longitudinal: ε∞={eps_inf:g}, ε1={eps_1:g}), n={n:,} (devices/s, one report each; "
                       f"ratio = ours / multi-freq-ldpy, same run)", "solution", sol_rows))
    for entry in tables:
        if isinstance(entry, Table):
            out.show(entry)
            continue
        title, first, table_rows = entry
        t = Table(title=title)
        for col in (first, "randomize", "peer client", "ratio", "support+estimate", "peer aggregator", "ratio"):
            t.add_column(col, justify="left" if col == first else "right")
        for name, r_o, r_p, a_o, a_p in table_rows:
            t.add_row(name, _si(r_o), _si(r_p), ratio(name, "rand", r_o, r_p),
                      _si(a_o), _si(a_p), ratio(name, "agg", a_o, a_p))
        out.show(t)
    sketch_notes: list[str] = []
    if sketches:
        with progress_bar(con) as bar:
            task = bar.add_task("sketches vs pure-ldp", total=None)
            sketch_tables, sketch_notes = bench_sketch.bench_tables(
                sketches, n=n, eps=eps, m=sketch_m, rows=sketch_rows, repeats=repeats, peer_seconds=peer_seconds,
                seed=seed, topk_n=topk_n, pem_peer_n=pem_peer_n or None, same_n=same_n,
                on_step=lambda what: bar.update(task, description=f"bench {what}"))
        for t in sketch_tables:
            out.show(t)
    out.close()
    for note in sketch_notes:
        con.print(note)
    for name, _, _, _, step_seconds in num_rows:
        if step_seconds is not None:
            con.print(f"{name}: the published distribution of a step (EMS and its quantiles' bootstrap intervals, "
                      f"once per step whatever its reports) took {step_seconds:.2f} s")
    if sol_rows:
        con.print("solutions: ours = randomize of n devices (OS CSPRNG keys; state made once, outside the timing) "
                      "and support + report counts + every attribute's estimate; peer = one client call per device, "
                      "then one aggregator call (ALLOMFREE vs the peer's L-SMP[L-ADP], its 'ALLOMFREE')")
        if prefixes:
            con.print(f"peer subsampled (per-report rate over the first m of the {n:,} devices, "
                          f"--peer-seconds {peer_seconds:g}): " + "; ".join(prefixes))


_DEFAULT_SOLUTIONS = ("SPL[GRR]", "SPL[OUE]", "SPL[ADP]", "SMP[GRR]", "SMP[OUE]", "SMP[ADP]", "RS+FD[GRR]",
                      "RS+FD[OUE-z]", "RS+FD[OUE-r]", "RS+FD[ADP]", "L-SPL[L-GRR]", "L-SPL[L-OSUE]",
                      "L-SMP[L-GRR]", "L-SMP[L-OSUE]", "ALLOMFREE")
# `ldp protocols` lists the standard set and every solution it leaves out
_LISTED_SOLUTIONS = (*_DEFAULT_SOLUTIONS, "L-RS+FD[L-GRR]", "L-RS+FD[L-OSUE]")


def _solution_specs(texts: list[str]) -> list[tuple[str, Optional[str]]]:
    """'SPL[GRR]' -> ('SPL', 'GRR'); 'ALLOMFREE' -> ('ALLOMFREE', None); 'default' -> the standard set."""
    specs: list[tuple[str, Optional[str]]] = []
    for text in texts:
        if text.strip() == "default":
            specs += _solution_specs(list(_DEFAULT_SOLUTIONS))
            continue
        name, bracket, rest = text.strip().partition("[")
        if bracket and not (rest.endswith("]") and rest[:-1].strip()):
            raise ValueError(f"--solution {text!r}: write SOLUTION[PROTOCOL], e.g. 'RS+FD[OUE-z]'")
        specs.append((name.strip(), rest[:-1].strip() if bracket else None))
    return specs


def _solution_label(name: str, protocol: Optional[str]) -> str:
    return name if protocol is None else f"{name}[{protocol}]"


def _build_solution(name: str, protocol: Optional[str], ks: tuple[int, ...], eps: float, eps_inf: float,
                    eps_1: float) -> estimators.Solution:
    """``estimators.make_solution`` with the options the solution takes (ε, or ε∞ and ε1; the protocol)."""
    from estimators.solution_registry import solution_parameters

    takes = solution_parameters(name)
    if protocol is not None and "protocol" not in takes:
        raise LDPError(f"{name} takes no protocol (it chooses its own); write {name}")
    opts = dict(eps=eps, eps_inf=eps_inf, eps_1=eps_1, protocol=protocol)
    return estimators.make_solution(name, ks=list(ks),
                                    **{o: v for o, v in opts.items() if o in takes and v is not None})


def _support_estimate(sol: estimators.Solution, out: estimators.MultiReports) -> list[np.ndarray]:
    """What the server does with one step's reports: support counts, report counts, d estimates."""
    counts, ns = sol.support(out), sol.report_counts(out)
    return [sol.estimate(j, counts[j], ns[j]) for j in range(len(counts))]


def _time_ours_solution(sol: estimators.Solution, values: np.ndarray, repeats: int) -> tuple[float, float]:
    """Best-of-``repeats`` devices/s of a solution's randomize and of support + estimate (after a warm-up).

    As on real devices, keys and the per-device state (sampled attribute, memo keys) come from the OS
    CSPRNG; the state is made once, before the timing, like the memo keys of ``_time_ours``."""
    n = len(values)
    warm = min(n, 64)
    _support_estimate(sol, sol.randomize(values[:warm], state=sol.new_state(warm)))
    state = sol.new_state(n)
    best_r = best_a = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = sol.randomize(values, state=state)
        t1 = time.perf_counter()
        _support_estimate(sol, out)
        t2 = time.perf_counter()
        best_r, best_a = min(best_r, t1 - t0), min(best_a, t2 - t1)
    return n / best_r, n / best_a


@bench_app.command("devices")
def bench_devices(k: K = 100, eps_inf: EPS_INF = 4.0, eps_1: EPS_1 = 1.0,
                  n: Annotated[int, typer.Option(help="Devices per call of the numba kernel.")] = 100_000,
                  seconds: Annotated[float, typer.Option(help="Seconds each implementation runs.")] = 2.0,
                  as_json: JSON_FLAG = False, as_csv: CSV_FLAG = False) -> None:
    """reports/s of L-OSUE randomization on one core, side by side in one run: the numba kernel (a batch), the
    reference SDK path, the light Python SDK (clients/python) and the JavaScript client (clients/js, Node)."""
    from .bench_devices import run

    out = TableOutput(console, as_json, as_csv)
    con = out.console
    try:
        check_options(k=k, eps_inf=eps_inf, eps_1=eps_1, n=n)
        if not seconds > 0:
            raise ValueError(f"--seconds must be > 0, got {seconds}")
    except ValueError as exc:
        fail(exc)
    with progress_bar(con) as bar:
        task = bar.add_task("benchmarking", total=4)

        started: list[str] = []

        def step(label: str) -> None:
            if started:
                bar.advance(task)
            started.append(label)
            bar.update(task, description=f"bench {label}")

        rates = run(k, eps_inf, eps_1, n, seconds, progress=step)
        bar.update(task, completed=4)
    base = rates[0].reports_per_second
    t = Table(title=f"device randomization, L-OSUE k={k}, ε∞={eps_inf:g}, ε1={eps_1:g}, one core (reports/s; ratio = "
                    "rate / numba kernel's, same run; a fresh CSPRNG noise key per call)")
    for col in ("implementation", "reports/s", "ratio", "≥ 20,000/s", "note"):
        t.add_column(col, justify="left" if col in ("implementation", "note") else "right")
    for r in rates:
        rate = r.reports_per_second
        t.add_row(r.name, _si(rate), "-" if rate is None or not base else f"{rate / base:.4f}",
                  "-" if rate is None else ("yes" if rate >= 20_000 else "NO"), r.note)
    out.show(t)
    out.close()


@bench_app.command("pipeline")
def bench_pipeline(steps: Annotated[int, typer.Option(help="Time steps per protocol and measurement.")] = 8,
                   grr_reports: Annotated[int, typer.Option(help="GRR reports per step.")] = 5_000_000,
                   losue_reports: Annotated[int, typer.Option(help="L-OSUE reports per step.")] = 1_000_000,
                   numeric_reports: Annotated[int, typer.Option(
                       help="Reports per step of a numeric mechanism (-p PM, ...: a numeric attribute on [0, 100], "
                            "ε = 1).")] = 5_000_000,
                   message_bytes: Annotated[int, typer.Option(help="Target Kafka message size (bytes).")] = 1_000_000,
                   workers: Annotated[int, typer.Option(
                       help="Most stream-app worker processes: the scaling table has 1, 2, 4, ... and this many.")] = 1,
                   partitions: Annotated[Optional[int], typer.Option(
                       help="Partitions of ldp.reports (same in every row); default: max(4, --workers).")] = None,
                   runs: Annotated[int, typer.Option(
                       help="Measured runs per row and of the raw broker, in turns; the table shows the median "
                            "and the range.")] = 3,
                   protocol: Annotated[Optional[list[str]], typer.Option(
                       "--protocol", "-p", help="GRR, L-OSUE and/or a numeric mechanism, e.g. PM (repeatable); "
                                                "default: GRR and L-OSUE.")] = None,
                   latency: Annotated[bool, typer.Option(
                       help="Also measure the latency under a paced load (with --workers workers).")] = True,
                   as_json: JSON_FLAG = False, as_csv: CSV_FLAG = False) -> None:
    """End-to-end reports/s (produce → final estimate) with 1, 2, 4, ... workers and latency, next to the raw
    broker, same bytes, one run."""
    from estimators.numeric import MECHANISMS

    from .bench_pipeline import report_nbytes, run_scaling

    out = TableOutput(console, as_json, as_csv)
    con = out.console

    known = {"GRR": (grr_reports, dict(eps=1.0)), "L-OSUE": (losue_reports, dict(eps_inf=2.0, eps_1=1.0))}
    names = protocol or list(known)
    known.update({m: (numeric_reports, dict(eps=1.0)) for m in MECHANISMS})
    bad = [n for n in names if n not in known]
    try:
        if bad:
            raise ValueError(f"unknown protocol(s) {bad} (GRR, L-OSUE, {', '.join(MECHANISMS)})")
        check_options(steps=steps, grr_reports=grr_reports, losue_reports=losue_reports,
                      numeric_reports=numeric_reports, message_bytes=message_bytes, workers=workers,
                      partitions=partitions, runs=runs)
    except ValueError as exc:
        fail(exc)
    targets = {"rate": 2e6, "ratio": 0.25, "p95": 2.0, "scale": 0.9}
    ratio_target = {m: 0.8 for m in MECHANISMS}  # a numeric attribute: ≥ 0.8 of the raw broker (issue 23)

    def vs_raw(name: str, ratio: float, default: float | None) -> str:
        want = ratio_target.get(name, default)
        return f"{ratio:.2f}" + ("" if want is None or ratio >= want else f" [red]<{want:g}[/red]")
    results = []
    for name in names:
        per, params = known[name]
        per_report = report_nbytes(name, 100, **params)
        batch = max(1_000, min(per, message_bytes // per_report))
        results.append(run_scaling(name, 100, steps, per, batch, workers, partitions=partitions, runs=runs,
                                   latency_load=0.5 if latency else None,
                                   on_status=lambda s: con.print(f"[dim]{s}[/dim]"), **params))
    parts = results[0]["partitions"]
    raw = " / ".join(f"{r['protocol']} {_si(r['raw_rate'])}" for r in results)
    t = Table(title=f"pipeline scaling, k=100, {parts} partitions, ~{message_bytes / 1e6:g} MB messages, "
                    f"{steps} steps per run, {results[0]['broker_storage']} broker storage "
                    f"(same run{f', median of {runs} runs' if runs > 1 else ''})")
    for col in ("protocol", "workers", "owning", "reports/s", "range", "x raw broker", "x 1 worker", "p95 saturated"):
        t.add_column(col, justify="left" if col == "protocol" else "right")
    for r in results:
        one = r["rows"][0].rate
        for row in r["rows"]:
            vs1 = row.rate / one
            mark = "" if row.workers == 1 or vs1 >= targets["scale"] else " [red]<0.9![/red]"
            spread = f"{_si(min(row.rates))}–{_si(max(row.rates))}" if len(row.rates) > 1 else "-"
            owning = str(row.owners) + (" [yellow](rebalanced)[/yellow]" if row.rebalanced else "")
            t.add_row(r["protocol"], str(row.workers), owning, _si(row.rate) + "/s", spread,
                      vs_raw(r["protocol"], row.rate / r["raw_rate"], None), f"{vs1:.2f}{mark}",
                      f"{np.median(row.saturated_p95):.2f} s")
    out.show(t)
    con.print(f"raw broker = produce (acks=all) + consume of the same bytes, no processing (median {raw} reports/s); "
                  f"each row is a consumer group of its own, started, settled (each worker owns partitions) and "
                  f"warmed up first, then frozen while the others run; the rows and the raw broker are measured in "
                  f"turns; the steps of a run take the {parts} partitions in turn")
    if latency:
        t = Table(title=f"pipeline throughput and latency, k=100, {workers} worker(s), "
                        f"~{message_bytes / 1e6:g} MB messages (same run)")
        for col in ("protocol", "reports", "MB", "raw broker", "end to end", "ratio", "latency p95", "latency max",
                    "p95 saturated"):
            t.add_column(col, justify="left" if col == "protocol" else "right")
        for r in results:
            ok_rate = r["protocol"] != "GRR" or r["pipeline_rate"] >= targets["rate"]
            t.add_row(r["protocol"], f"{r['reports']:,}", f"{r['bytes'] / 1e6:.0f}", _si(r["raw_rate"]) + "/s",
                      ("" if ok_rate else "[red]") + _si(r["pipeline_rate"]) + "/s",
                      vs_raw(r["protocol"], r["ratio"], targets["ratio"]),
                      f"{r['p95_latency']:.2f} s" + ("" if r["p95_latency"] < targets["p95"] else " [red]≥2s[/red]"),
                      f"{max(r['latencies']):.2f} s", f"{r['saturated_p95_latency']:.2f} s")
        out.show(t)
        con.print("latency: last report of a step (its watermark acknowledged) → final estimate on "
                      "ldp.estimates, with the producer paced at 50% of the measured end-to-end rate; 'saturated' = "
                      "the same in the throughput run, where it is the queue of a producer outrunning the workers")
    con.print("targets: GRR ≥ 2M reports/s end to end, ≥ 0.25 of the raw broker, p95 latency < 2 s; "
                  "every row ≥ 0.9x the 1-worker row; a numeric mechanism ≥ 0.8 of the raw broker")
    out.close()


@bench_app.command("ingest")
def bench_ingest(processes: Annotated[int, typer.Option(help="Processes of `ldp ingest` (one port).")] = 2,
                 server: Annotated[str, typer.Option(
                     help="The ingest's HTTP server: uvicorn (httptools, uvloop), as `ldp ingest` runs it; the own "
                          "server it was measured against is gone (docs/benchmarks.md).")] = "uvicorn",
                 seconds: Annotated[float, typer.Option(help="Measured seconds per point.")] = 3.0,
                 warmup: Annotated[float, typer.Option(help="Warm-up seconds before each point.")] = 1.0,
                 workload: Annotated[Optional[list[str]], typer.Option(
                     "--workload", "-w", help="json, binary and/or batch (repeatable); default: all three.")] = None,
                 batch: Annotated[int, typer.Option(help="Reports per request of the batch workload.")] = 1000,
                 generator: Annotated[str, typer.Option(
                     help="Closed-loop load generator: auto (wrk if installed), wrk or python.")] = "auto",
                 start_clients: Annotated[int, typer.Option(help="Clients of the first saturation point.")] = 4,
                 max_clients: Annotated[int, typer.Option(help="Most clients of the saturation search.")] = 1024,
                 worker: Annotated[bool, typer.Option(help="Also run a counting worker.")] = False,
                 broker_storage: Annotated[str, typer.Option(help="memory or durable.")] = "memory",
                 linger_ms: Annotated[Optional[float], typer.Option(
                     help="The ingest's linger in ms (its default if omitted).")] = None,
                 idempotency: Annotated[bool, typer.Option(help="An Idempotency-Key on every request.")] = True,
                 half_clients: Annotated[Optional[int], typer.Option(
                     help="Connections of the open-loop half-saturation point (default: the saturation point's, at "
                          "most 256).")]
                 = None,
                 redis_aof_rewrite_mb: Annotated[Optional[int], typer.Option(
                     help="The local Redis's auto-aof-rewrite-min-size in MB (default: Redis's 64 MB). Each AOF "
                          "rewrite forks a child that takes a core for about a second.")] = None,
                 compact_redis: Annotated[bool, typer.Option(
                     help="Rewrite the local Redis's AOF before each open-loop point, so that the rewrite the "
                          "saturation search's writes would trigger does not fall into it.")] = True,
                 rate: Annotated[Optional[float], typer.Option(
                     help="Only an open-loop point at this many requests/s per workload (no saturation search, "
                          "no targets): the latency at the rate you expect.")] = None,
                 json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the results here.")]
                 = None) -> None:
    """Requests/s, reports/s and p50/p99 latency of `ldp ingest` at saturation and at half of it (single JSON
    reports, single binary reports, binary batches), with the local stack, in one run (ldpstream_cli/bench_ingest.py)."""
    from .bench_ingest import BenchConfig, main as bench_main

    cfg = BenchConfig(processes=processes, seconds=seconds, warmup=warmup, batch=batch,
                      workloads=tuple(workload or ("json", "binary", "batch")), generator=generator,
                      start_clients=start_clients, max_clients=max_clients, worker=worker,
                      broker_storage=broker_storage, linger_ms=linger_ms, idempotency=idempotency, json_path=json_out,
                      half_clients=half_clients, redis_aof_rewrite_mb=redis_aof_rewrite_mb, compact_redis=compact_redis,
                      rate=rate, server=server)
    try:
        code = bench_main(cfg, console)
    except (ValueError, RuntimeError, TimeoutError) as exc:
        fail(exc)
    raise typer.Exit(code)


def _si(rate: float | None) -> str:
    """Compact rate: 27.4M, 463k."""
    if not rate:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= div:
            return f"{rate / div:.3g}{unit}"
    return f"{rate:.3g}"


def _bench_selection(protocol: Optional[list[str]], solution: Optional[list[str]]) -> tuple[list[str], list[str]]:
    """``(protocols, numeric mechanisms)`` that ``bench protocols`` measures: every one with neither ``-p`` nor ``-s``
    or with ``-p all``; every numeric mechanism with ``-p numeric``; else those named by ``-p``."""
    from estimators.numeric import MECHANISMS

    given = list(protocol or ())
    everything = (protocol is None and solution is None) or "all" in given
    names = list(estimators.PROTOCOLS) if everything else [p for p in given if p not in MECHANISMS and p != "numeric"]
    mechanisms = list(MECHANISMS) if everything or "numeric" in given else [p for p in given if p in MECHANISMS]
    return names, mechanisms


#: the numeric mechanisms' metric range in ``bench protocols`` (values drawn uniformly on it)
_NUMERIC_RANGE = (0.0, 100.0)
#: reports/s targets of ``bench protocols`` for numeric mechanisms (issue 23): ``(name, "rand" | "agg") -> rate``
_NUMERIC_TARGETS = {("PM", "rand"): 50e6, ("PM", "agg"): 100e6}


def _numeric_target(name: str, kind: str, rate: float) -> str:
    target = _NUMERIC_TARGETS.get((name, kind))
    if target is None:
        return "-"
    return f"[green]≥{_si(target)} ok[/green]" if rate >= target else f"[red]<{_si(target)}![/red]"


def _time_numeric(p: Any, n: int, repeats: int, seed: int) -> tuple[float, float, float | None]:
    """Best-of-``repeats`` reports/s of a numeric attribute's randomize and of support + the mean estimate (after
    a warm-up), and, for a distribution mechanism (Square Wave), the seconds of one step's published estimate
    (:meth:`~estimators.numeric.protocol.NumericProtocol.estimate_step`: a cost per step, not per report).

    As on real devices, batch noise keys come from the OS CSPRNG and a memo state (1BitMean) is made once, outside
    the timing (``seed`` only draws the values, uniform on the range)."""
    values = np.random.default_rng(seed).uniform(p.lo, p.hi, n)
    state = p.new_state(n)
    reports = p.randomize(values[:64], state=None if state is None else state.subset(slice(0, 64)))
    p.estimate_mean(p.support(reports), 64)
    best_r = best_a = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        reports = p.randomize(values, state=state)
        t1 = time.perf_counter()
        p.estimate_mean(p.support(reports), n)
        t2 = time.perf_counter()
        best_r, best_a = min(best_r, t1 - t0), min(best_a, t2 - t1)
    step = None
    if p.is_distribution:
        t0 = time.perf_counter()
        p.estimate_step(p.support(reports), n, rng=np.random.default_rng(seed))
        step = time.perf_counter() - t0
    return n / best_r, n / best_a, step


def _time_ours(p: estimators.FrequencyProtocol, n: int, repeats: int, seed: int) -> tuple[float, float]:
    """Best-of-``repeats`` reports/s of randomize and of support + estimate (after a warm-up).

    ``randomize`` runs as on real devices: 256-bit memo keys and batch noise keys from the OS
    CSPRNG (``seed`` only draws the input values)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, p.k, n)
    state = p.new_state(n)
    reports = p.randomize(values[:64], state=None if state is None else state.subset(slice(0, 64)))
    p.estimate(p.support(reports), 64)
    best_r = best_a = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        reports = p.randomize(values, state=state)
        t1 = time.perf_counter()
        p.estimate(p.support(reports), n)
        t2 = time.perf_counter()
        best_r, best_a = min(best_r, t1 - t0), min(best_a, t2 - t1)
    return n / best_r, n / best_a


CAMPAIGN = Annotated[Path, typer.Option(
    "--campaign", "-c", help="Campaign file (TOML). Default: the demo campaign (deploy/campaigns/demo.toml, shipped "
                             "with the CLI).", exists=True, dir_okay=False, show_default=False)]
KAFKA = Annotated[Optional[str], typer.Option("--kafka", help="Kafka bootstrap host:port (default: `ldp stack up`'s).")]
REDIS = Annotated[Optional[str], typer.Option("--redis", help="Redis URL (default: `ldp stack up`'s).")]


@app.command()
def produce(campaign: CAMPAIGN = DEMO_CAMPAIGN, kafka: KAFKA = None,
            devices: Annotated[int, typer.Option(help="Simulated devices.")] = 100_000,
            steps: Annotated[int, typer.Option(help="Time steps to send (after those a --state-dir holds).")] = 5,
            dataset: Annotated[str, typer.Option(help="uniform, zipf or syn.")] = "syn",
            p_change: Annotated[float, typer.Option(help="Per-step change probability (syn).")] = 0.25,
            batch_size: Annotated[int, typer.Option(help="Reports per Kafka message.")] = 50_000,
            rate: Annotated[Optional[float], typer.Option(help="Target reports/s (default: as fast as possible).")] = None,
            state_dir: Annotated[Optional[Path], typer.Option(
                help="The fleet's state directory (docs/fleet.md): memo keys, each step drawn before it is sent, "
                     "options. Resumable; locked while a producer uses it.")] = None,
            topic_prefix: Annotated[str, typer.Option(
                help="Prefix of the reports topic ({prefix}ldp.reports), as the workers' --topic-prefix.")] = "",
            partitions: Annotated[int, typer.Option(help="Partitions of ldp.reports if it must be created.")] = 4,
            retry_deadline: Annotated[float, typer.Option(
                help="Broker outages: retry (with backoff) for this many seconds, then give up.")] = 300.0,
            seed: SIM_SEED = None) -> None:
    """Simulate a device fleet and publish its randomized reports to ldp.reports."""
    import aiokafka  # noqa: F401 - its loggers must exist before their repeated errors are limited

    from producers.fleet import Fleet, FleetConfig, publish
    from stream_app.health import limit_repeated_logs
    from wire.campaign import Campaign, CampaignError
    from wire.topics import Topics

    limit_repeated_logs(("aiokafka",))

    bootstrap, _ = stack_addresses(kafka, None, need_redis=False)
    try:  # a state directory that is locked, unreadable or made with other options is refused here
        camp = Campaign.load(campaign)
        fleet = Fleet(FleetConfig(camp, devices, steps, dataset=dataset, p_change=p_change, batch_size=batch_size,
                                  rate=rate, seed=seed, state_dir=state_dir))
    except (CampaignError, ValueError, OSError) as exc:  # FleetStateError is a ValueError
        fail(exc)
    with fleet:
        topic = Topics.with_prefix(topic_prefix).reports
        total = devices * steps * fleet.reports_per_device
        console.print(SIMULATION_BANNER.format(seed=seed) if seed is not None else
                      "randomness: 256-bit device keys and batch noise keys from the OS CSPRNG (ChaCha20 streams)")
        if fleet.resent_step is not None:
            console.print(f"resuming {state_dir}: step {fleet.resent_step} was drawn before the stop and is sent "
                          "again unchanged (the count store skips the batches it already applied)")
        elif fleet.resumed:
            console.print(f"resuming {state_dir} at step {fleet.next_step}")
        console.print(f"fleet of {devices:,} devices x {len(camp.attributes)} attributes x {steps} steps "
                      f"= {total:,} reports → {topic} at {bootstrap}")
        with progress_bar(console) as bar:
            task = bar.add_task("publishing", total=total)

            def hook(p) -> None:
                bar.update(task, completed=p.reports_sent,
                           description=f"step {p.t} {p.attribute} {p.rate / 1e6:.1f}M/s")
            try:
                summary = asyncio.run(publish(fleet, bootstrap, topic, on_progress=hook, keep_supports=False,
                                              partitions=partitions, retry_deadline=retry_deadline))
            except (LDPError, OSError) as exc:  # PublishError, FleetStateError; a state directory that cannot be written
                fail(exc)
    for line in summary.lines():
        console.print("  " + line)


def _setting_option(name: str, **kwargs: Any) -> Any:
    """The `ldp worker` option of worker setting ``name``: flags, help and variable from stream_app.settings."""
    spec = setting_specs()[name]
    default = "" if spec["default"] in (None, "") else f" Default: {spec['default']}."
    return typer.Option(*spec["option"], help=f"{spec['help']}{default} Environment: {spec['env']}.",
                        show_default=False, **kwargs)


@app.command()
def worker(campaign_paths: Annotated[Optional[list[Path]], _setting_option("campaign_paths", exists=True,
                                                                            dir_okay=False)] = None,
           kafka_bootstrap: Annotated[Optional[str], _setting_option("kafka_bootstrap")] = None,
           redis_url: Annotated[Optional[str], _setting_option("redis_url")] = None,
           app_id: Annotated[Optional[str], _setting_option("app_id")] = None,
           partitions: Annotated[Optional[int], _setting_option("partitions")] = None,
           estimates_partitions: Annotated[Optional[int], _setting_option("estimates_partitions")] = None,
           topic_prefix: Annotated[Optional[str], _setting_option("topic_prefix")] = None,
           refresh_seconds: Annotated[Optional[float], _setting_option("refresh_seconds")] = None,
           session_timeout: Annotated[Optional[float], _setting_option("session_timeout")] = None,
           web_port: Annotated[Optional[int], _setting_option("web_port")] = None,
           web_host: Annotated[Optional[str], _setting_option("web_host")] = None,
           web_bind: Annotated[Optional[str], _setting_option("web_bind")] = None,
           data_dir: Annotated[Optional[Path], _setting_option("data_dir")] = None,
           ready_file: Annotated[Optional[Path], _setting_option("ready_file")] = None,
           loglevel: Annotated[Optional[str], _setting_option("loglevel")] = None,
           logfile: Annotated[Optional[Path], _setting_option("logfile")] = None,
           stream_buffer_maxsize: Annotated[Optional[int], _setting_option("stream_buffer_maxsize")] = None,
           consumer_max_fetch_size: Annotated[Optional[int], _setting_option("consumer_max_fetch_size")] = None,
           consumer_fetch_max_wait: Annotated[Optional[float], _setting_option("consumer_fetch_max_wait")] = None,
           shutdown_timeout: Annotated[Optional[float], _setting_option("shutdown_timeout")] = None,
           per_value_metrics: Annotated[Optional[bool], _setting_option("per_value_metrics")] = None,
           per_value_metrics_max_k: Annotated[Optional[int], _setting_option("per_value_metrics_max_k")] = None,
           redis_memory_bytes: Annotated[Optional[str], _setting_option("redis_memory_bytes")] = None,
           retention_batches_per_step: Annotated[Optional[int],
                                                 _setting_option("retention_batches_per_step")] = None) -> None:
    """Run a stream-app worker: count reports into Redis, publish estimates, serve the API.

    Each option falls back to its environment variable, then to its default (stream_app.settings);
    --kafka and --redis, given by neither, to the addresses of `ldp stack up`."""
    given = dict(locals())  # the parameters are named after the WorkerSettings fields
    from stream_app.settings import SettingsError, WorkerSettings, parse_memory
    from stream_app.store.memory import RetentionTooLarge
    from stream_app.worker import run_worker

    try:
        if redis_memory_bytes is not None:  # 512mb, 2gb ... as the variable
            try:
                given["redis_memory_bytes"] = parse_memory(redis_memory_bytes)
            except ValueError as exc:
                raise SettingsError(f"--redis-memory: {exc}") from exc
        values = WorkerSettings.merge(given)
        if "campaign_paths" in values and not {"kafka_bootstrap", "redis_url"} <= values.keys():
            values["kafka_bootstrap"], values["redis_url"] = stack_addresses(values.get("kafka_bootstrap"),
                                                                              values.get("redis_url"))
        settings = WorkerSettings.from_values(values)
    except SettingsError as exc:
        fail(exc)
    missing = [str(p) for p in settings.campaign_paths if not p.is_file()]
    if missing:
        fail(LDPError(f"campaign file(s) not found: {', '.join(missing)}"))
    from wire.transport import KafkaSecurity, RedisSecurity, TransportConfigError

    try:  # LDP_KAFKA_* / LDP_REDIS_* (wire.transport): a clear message now rather than a client's traceback later
        KafkaSecurity.from_env()
        RedisSecurity.from_env().client_kwargs(settings.redis_url)
    except TransportConfigError as exc:
        fail(exc)
    try:
        run_worker(settings)
    except RetentionTooLarge as exc:  # the campaigns' retention cannot fit the Redis memory: refused at start
        fail(exc)


@app.command()
def soak(minutes: Annotated[float, typer.Option(help="Length of the fault window (the fleet sends that long).")] = 10.0,
         seconds: Annotated[Optional[float], typer.Option(help="The same in seconds (overrides --minutes).")] = None,
         campaign: CAMPAIGN = DEMO_CAMPAIGN,
         devices: Annotated[int, typer.Option(help="Simulated devices (reports per attribute and step).")] = 20_000,
         step_seconds: Annotated[float, typer.Option(help="One fleet step every this many seconds.")] = 3.0,
         batch_size: Annotated[int, typer.Option(help="Reports per Kafka message.")] = 5_000,
         workers: Annotated[int, typer.Option(help="Stream-app workers (one consumer group).")] = 3,
         partitions: Annotated[int, typer.Option(help="Partitions of ldp.reports.")] = 8,
         fault_every: Annotated[float, typer.Option(help="Seconds between two faults.")] = 25.0,
         faults: Annotated[Optional[str], typer.Option(help="Comma-separated fault kinds in rotation order "
                                                       "(default: all).")] = None,
         seed: Annotated[int, typer.Option(help="Simulation-mode seed of the fleet (the offline truth needs it).")] = 8,
         lateness: Annotated[Optional[float], typer.Option(
             help="The campaign's lateness_seconds in the soak (default: the campaign's own, e.g. 2 s in the demo; "
                  "a pause longer than it must still end in exact finals).")] = None,
         json_path: Annotated[Optional[Path], typer.Option("--json", help="Write the report as JSON here.")] = None,
         run_dir: Annotated[Optional[Path], typer.Option(help="Run directory (kept); default: a temporary one, "
                                                         "removed after a passing run.")] = None,
         keep_run_dir: Annotated[bool, typer.Option(help="Keep the temporary run directory (logs).")] = False) -> None:
    """Soak test: the local stack under steady fleet load with faults on a schedule (worker SIGKILL,
    worker added/removed, producer killed and resumed, a duplicate batch, Redis and broker restarts);
    every count is compared with the offline truth at the end. Exit 0 only if nothing is off."""
    from .soak import FAULT_KINDS, SoakConfig, run_soak

    try:
        cfg = SoakConfig(campaign=campaign, seconds=seconds if seconds is not None else minutes * 60.0,
                         devices=devices, step_seconds=step_seconds, batch_size=batch_size, workers=workers,
                         partitions=partitions, fault_every=fault_every, seed=seed, lateness=lateness, run_dir=run_dir,
                         keep_run_dir=keep_run_dir,
                         faults=tuple(f.strip() for f in faults.split(",") if f.strip()) if faults else FAULT_KINDS)
    except ValueError as exc:
        fail(exc)
    console.print(SIMULATION_BANNER.format(seed=seed) + " (the soak re-simulates the fleet offline as its truth)")
    raise typer.Exit(run_soak(cfg, console, json_path))


@stack_app.command("up")
def stack_up(run_dir: RUN_DIR = str(CLI_RUN_DIR),
             kafka_port: Annotated[Optional[int], typer.Option(help="Broker port (default: a free one).")] = None,
             redis_port: Annotated[Optional[int], typer.Option(help="Redis port (default: a free one).")] = None,
             broker_storage: Annotated[Optional[str], typer.Option(
                 help="durable (the broker's data kept in the run dir) or memory "
                      "(default: $LDP_BROKER_STORAGE, else durable).")] = None,
             kafka_sasl: Annotated[Optional[str], typer.Option(
                 help="SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN: Kafka clients must authenticate (user ldp, a random "
                      "password kept in the run dir's stack.json; `ldp worker`/`ldp produce` use it).")] = None,
             redis_auth: Annotated[bool, typer.Option(
                 "--redis-auth", help="redis-server requires a random password (carried by the stack's Redis URL).")]
             = False,
             tls: Annotated[bool, typer.Option("--tls", help="Kafka and Redis over TLS (a local CA in the run dir).")]
             = False) -> None:
    """Start the broker and Redis in the background; `ldp stack down` stops them."""
    import secrets

    from ldpstream_dev.errors import StackError
    from ldpstream_dev.stack import LocalStack
    from wire.transport import redact_url

    try:
        with console.status("starting tansu and redis-server ..."):
            stack = LocalStack(run_dir=Path(run_dir), kafka_port=kafka_port, redis_port=redis_port,
                               broker_storage=broker_storage, kafka_sasl=kafka_sasl, tls=tls,
                               redis_password=secrets.token_urlsafe(18) if redis_auth else None)
            info = stack.up()
    except StackError as exc:
        fail(exc)
    console.print(f"[green]stack up[/green] in {info.run_dir}\n  kafka  {info.kafka_bootstrap} "
                  f"({stack.kafka_security.describe()})\n  redis  {redact_url(info.redis_url)}"
                  f"\n  broker storage  {info.broker_storage}")


@stack_app.command("down")
def stack_down(run_dir: RUN_DIR = str(CLI_RUN_DIR)) -> None:
    """Stop the broker and Redis started by `ldp stack up`."""
    from ldpstream_dev.errors import StackError
    from ldpstream_dev.stack import LocalStack

    try:
        LocalStack.from_run_dir(Path(run_dir)).down()
    except StackError as exc:
        fail(exc)
    console.print("[green]stack down[/green]")


@stack_app.command("status")
def stack_status(run_dir: RUN_DIR = str(CLI_RUN_DIR)) -> None:
    """Show whether the broker and Redis run and answer."""
    import json

    from ldpstream_dev.errors import StackError
    from ldpstream_dev.stack import LocalStack

    try:
        st = LocalStack.from_run_dir(Path(run_dir)).status()
    except StackError as exc:
        fail(exc)
    console.print_json(json.dumps(st, default=str))


from .ingest_cli import register as _register_ingest  # noqa: E402 - `ldp ingest`, `ldp tokens`

_register_ingest(app)

from .experiments import register as _register_experiments  # noqa: E402 - `ldp experiment ...` (ldpstream_cli/experiments/)

_register_experiments(app)


def main() -> None:
    from ldpstream_dev.errors import DevExtraMissingError

    try:
        app()
    except DevExtraMissingError as exc:  # `ldp demo`, the benches ... without the dev extra: one line, exit 2
        error_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
