"""What every ``ldp experiment`` shares: seeded parallel repetitions, CSV and configuration files,
the printed configuration, the wall time and matplotlib set-up.

Repetitions run in a :class:`concurrent.futures.ProcessPoolExecutor` over ``os.cpu_count()`` spawned workers.
Task ``i`` of an experiment gets the ``i``-th child of ``numpy.random.SeedSequence(seed)`` (and data
sets get children of their own), so the results depend on the seed only, never on the number of
workers or on the order in which tasks finish. Everything here is the labelled simulation mode
(:class:`estimators.randomness.SimulationWarning`): seeded device keys and noise are NOT private.
"""
from __future__ import annotations

import contextlib
import csv
import json
import math
import multiprocessing
import os
import platform
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, Iterable, Iterator, Optional, Sequence, TypeVar

import numpy as np
import typer
from rich.console import Console

from estimators.randomness import SimulationWarning

from ..terminal import progress_bar

# The options every experiment takes (``ldp experiment NAME --quick --out DIR --workers N --seed S``).
QuickOption = Annotated[bool, typer.Option("--quick", help="CI-sized run (under a minute).")]
OutOption = Annotated[Path, typer.Option(help="Output folder (config.json, CSVs, PNGs).")]
WorkersOption = Annotated[Optional[int], typer.Option(help="Worker processes (default: every core).")]
SeedOption = Annotated[int, typer.Option(help="Seed of every draw (simulation mode).")]

console = Console()

SIMULATION_BANNER = ("[bold yellow]SIMULATION MODE[/]: --seed {seed} seeds every data set, device key and noise "
                     "draw; the reports are reproducible and NOT private.")

T = TypeVar("T")
R = TypeVar("R")



def default_workers() -> int:
    """Worker processes: every available core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def child_seeds(seed: int, label: str, count: int) -> list[np.random.SeedSequence]:
    """``count`` independent seeds for the stream ``label`` of an experiment seeded with ``seed``
    (streams of different labels never overlap: the label is part of the entropy)."""
    root = np.random.SeedSequence([seed, *label.encode()])
    return root.spawn(count)


def _single_threaded_worker() -> None:
    """Worker initializer: one numba thread per worker process (the pool already uses every core;
    nested kernel threads would oversubscribe them several times over)."""
    try:
        import numba

        numba.set_num_threads(1)
    except (ImportError, ValueError):  # pragma: no cover - numba is a dependency
        pass


@contextlib.contextmanager
def _one_numba_thread() -> Iterator[None]:
    """One numba thread in this process while it runs the tasks itself (``workers=1``): the kernels' OpenMP
    threads otherwise spin between the many small parallel calls (``ldp experiment longitudinal --quick
    --workers 1`` took 32 CPU s and 34 s of wall time with them, 11 and 11 without: docs/benchmarks.md)."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def _call_quietly(fn: Callable[[T], R], task: T) -> R:
    """Run one task in a worker with the simulation warning silenced (the banner said it once)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        return fn(task)


def run_tasks(fn: Callable[[T], R], tasks: Sequence[T], description: str, workers: int | None = None) -> list[R]:
    """``[fn(t) for t in tasks]`` in worker processes with a progress bar; results in task order.

    ``fn`` must be a module-level function and each task must carry its own seed: the result of a
    task is then the same whatever ``workers`` is. ``workers=1`` runs in this process.
    """
    workers = default_workers() if workers is None else max(1, int(workers))
    results: list[Any] = [None] * len(tasks)
    with progress_bar(console) as bar:
        tid = bar.add_task(description, total=len(tasks))
        if workers == 1 or len(tasks) <= 1:
            with _one_numba_thread() if workers == 1 else contextlib.nullcontext():
                for i, task in enumerate(tasks):
                    results[i] = _call_quietly(fn, task)
                    bar.advance(tid)
            return results
        # spawned, not forked: a fork of a process whose numba thread pool (OpenMP) or event-loop threads already
        # ran (a test session, a notebook) can abort in the child
        with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), initializer=_single_threaded_worker,
                                 mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_call_quietly, fn, task): i for i, task in enumerate(tasks)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.advance(tid)
    return results


# ====================================================================== files
def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> Path:
    """Rows of dicts to CSV (columns: the union of the keys, in first-seen order)."""
    rows = list(rows)
    names: list[str] = []
    for r in rows:
        names.extend(k for k in r if k not in names)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=names)
        w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(v) for k, v in r.items()})
    return path


def _fmt(value: Any) -> Any:
    if isinstance(value, (float, np.floating)):
        return repr(float(value)) if math.isfinite(value) else str(float(value))
    if isinstance(value, np.integer):
        return int(value)
    return value


def read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV written by :func:`write_csv`, numbers parsed back."""
    with open(path, newline="") as fh:
        return [{k: _parse(v) for k, v in r.items()} for r in csv.DictReader(fh)]


def _parse(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


@dataclass
class Run:
    """One invocation of an experiment: its name, configuration, output folder and clock."""

    name: str
    config: dict[str, Any]
    out: Path
    started: float = field(default_factory=time.perf_counter)

    def announce(self) -> None:
        """Print the simulation banner and the configuration; write ``config.json`` now (so a run
        that fails half-way still says what it was)."""
        self.out.mkdir(parents=True, exist_ok=True)
        console.print(SIMULATION_BANNER.format(seed=self.config.get("seed")))
        console.print(f"[bold]ldp experiment {self.name}[/] configuration:")
        for key, value in self.config.items():
            if key == "workers" and value is None:
                value = f"{default_workers()} (every core)"
            console.print(f"  {key} = {value}")
        self._write_config()

    def _write_config(self, **extra: Any) -> None:
        meta = {"experiment": self.name, **self.config, "workers": self.config.get("workers") or default_workers(),
                "cpu_count": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__, **extra}
        (self.out / "config.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")

    def csv(self, rows: Iterable[dict[str, Any]], filename: str) -> Path:
        path = write_csv(rows, self.out / filename)
        console.print(f"CSV: {path}")
        return path

    def finish(self, figures: Sequence[Path] = ()) -> float:
        """Print the figures and the wall time, and record the wall time in ``config.json``."""
        for fig in figures:
            console.print(f"plot: {fig}")
        wall = time.perf_counter() - self.started
        self._write_config(wall_time_s=round(wall, 2))
        workers = f" ({self.config.get('workers') or default_workers()} workers)" if "workers" in self.config else ""
        console.print(f"[bold]wall time[/]: {wall:.1f} s{workers}")
        return wall


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, dpi: int = 110) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


def split_names(text: str | None) -> tuple[str, ...]:
    """A comma-separated list of names, each stripped, empty ones dropped (CLI option parsing; ``None``: none)."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def floats(text: str, what: str) -> tuple[float, ...]:
    """A comma-separated list of numbers (CLI option parsing)."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise typer.BadParameter(f"{what}: a comma-separated list of numbers, got {text!r}") from None
