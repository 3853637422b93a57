"""``ldp experiment heavy-hitters``: heavy-hitter identification over open domains (issue 24): precision and
recall of the top-K and the MSE of the found items' frequencies against ε and n, for this library's PEM (the
prefix extending method of Wang, Li & Jha, IEEE TDSC 2021, arXiv 1708.06674, 2017), pure-ldp 1.2.0's PEM on the
same data with the same seeds, and this library's CMS and HCMS (Apple Differential Privacy Team, Apple Machine
Learning Journal 2017) ranking a candidate list; TreeHist (Bassily, Nissim, Stemmer & Thakurta, NeurIPS 2017)
when :mod:`estimators.sketch.treehist` is installed.

**Data.** Two populations of ``n`` devices, each holding one value:

* ``zipf``: Zipf(``s`` = 1.1) over ``2^32`` items (:func:`estimators.sketch.pem.zipf_items`: ranks spread over the
  domain by an affine map, so heavy items share no prefix by construction);
* ``words``: the words of a real English text drawn i.i.d. from its word frequencies. The default corpus is the
  Python Language Reference that every CPython installation carries for ``pydoc`` (the standard library's
  ``pydoc_data/topics.py``: the ``topics`` dict of help texts; about 64,000 words, 3,100 distinct);
  ``--corpus FILE`` reads any UTF-8 text file instead. Words are lower-cased runs of ``a-z`` (an apostrophe
  inside a word kept); a word's 64-bit id is :func:`estimators.sketch.hashing.value_ids` (SHA-256) and its
  32-bit item the id's top 32 bits (:func:`estimators.sketch.pem.id_items`).

Every protocol sees the same ids: an item's id is its 32 bits followed by 32 zero bits for ``zipf`` and the
word's id for ``words``, so that a found id's top 32 bits are the item everywhere (PEM and TreeHist find
32-bit items, the sketches rank 64-bit ids).

**Protocols** (:data:`PROTOCOLS`; one entry each, a module-level function ``(Cell) -> (items, frequencies)``):

* ``PEM``: :class:`estimators.sketch.pem.PEM` over 32 bits, ``start_bits`` 4, ``step`` 4 (7 groups, prefixes of
  8, 12, ..., 32 bits), ``K' = K``;
* ``pure-ldp PEM``: pure-ldp 1.2.0's ``PEMClient``/``PEMServer`` with the same levels over the items' 32-bit
  binary strings, seeded through ``random`` and ``numpy.random`` with the same integer as ours, its OLH server
  replaced by :func:`estimators.sketch.pem._lazy_lh_server_class` (the same hash and estimator, evaluating the
  asked candidates only); skipped with a note when pure-ldp or xxhash is missing;
* ``CMS``, ``HCMS``: :mod:`estimators.sketch.cms` with ``m`` = 1024 columns and 64 rows, ranking a candidate
  list: for ``zipf`` every distinct item present in the data (an oracle dictionary: the most favourable list a
  sketch can be given), for ``words`` the corpus vocabulary (every distinct word of the corpus, drawn or not).
  The sketches need that list; PEM and TreeHist do not;
* ``TreeHist``: :class:`estimators.sketch.treehist.TreeHist` over 32 bits with PEM's levels (``start_bits`` 4,
  ``step`` 4: the ``2^4``-ary tree, not the paper's binary one) and ``K' = K``, 256 public hash rows, so that it
  differs from PEM by its oracle only (public hash rows instead of a private OLH seed per report); skipped with a
  note when the module is missing.

**Metrics** per (data set, protocol, ε, n, repetition), with ``T`` the items whose true count is at least the
``K``-th largest (ties at the boundary all count as top-``K``): precision ``|found ∩ T| / |found|``, recall
``min(|found ∩ T|, K) / K`` (every protocol returns ``K`` items, so the two coincide unless one returns
fewer), ``recall_top5`` the share of the true top 5 found, and the MSE of the found items' estimated
frequencies against their true frequencies (fractions of ``n``; an item nobody holds has frequency 0).

**Sweeps.** ε ∈ {1, 2, 4, 6} at n = 10^6 and n ∈ {10^5, 3·10^5, 10^6} at ε = 4, 3 repetitions (seeded: the
data of repetition ``r`` is shared by every protocol and ε). pure-ldp's PEM costs about 45 s of CPU per
10^6 reports (a Python loop per report and per candidate), over 90 % of the full run (2,000 s of CPU: about 17
minutes on 2 free cores; 30 minutes measured on the shared 2-core development machine).
"""
from __future__ import annotations

import functools
import math
import re
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import numpy as np
import typer

from estimators.errors import LDPError
from estimators.sketch.hashing import value_ids
from estimators.sketch.pem import PEM, id_items, zipf_items

from ..terminal import print_table
from .runner import (OutOption, QuickOption, Run, SeedOption, WorkersOption, child_seeds, console, floats, pyplot,
                     run_tasks, save_figure)

DATASETS = ("zipf", "words")
BITS = 32
#: the default word corpus: the Python Language Reference's help texts of pydoc (standard library)
CORPUS_MODULE = "pydoc_data.topics"
#: candidate ids estimated per call by the sketches (bounds the (candidates × rows) hash matrix)
CHUNK = 1 << 15


@dataclass(frozen=True)
class Config:
    """Parameters of one run (full-size defaults)."""

    k: int = 20
    eps: tuple[float, ...] = (1.0, 2.0, 4.0, 6.0)
    n: int = 1_000_000
    ns: tuple[int, ...] = (100_000, 300_000, 1_000_000)
    n_eps: float = 4.0
    reps: int = 3
    zipf_s: float = 1.1
    start_bits: int = 4
    step: int = 4
    cms_m: int = 1024
    cms_rows: int = 64
    corpus: str = ""  # "" = the standard library's pydoc_data/topics.py
    protocols: tuple[str, ...] = ()  # () = every available one
    seed: int = 0
    workers: int | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> "Config":
        """A CI-sized run (a few seconds, in this process): 10^4 devices, one repetition, two ε."""
        quick = {"eps": (2.0, 6.0), "n": 10_000, "ns": (5_000, 10_000), "n_eps": 6.0, "reps": 1, "workers": 1}
        return cls(**{**quick, **{k: v for k, v in overrides.items() if v is not None or k != "workers"}})

    def cells(self) -> list[tuple[float, int]]:
        """The (ε, n) points of both sweeps, without duplicates."""
        pts = [(float(e), int(self.n)) for e in self.eps] + [(float(self.n_eps), int(m)) for m in self.ns]
        return list(dict.fromkeys(pts))


# ====================================================================== data
def corpus_text(corpus: str = "") -> tuple[str, str]:
    """The text of the word corpus and where it came from. Default: the ``topics`` dict of the standard
    library's ``pydoc_data/topics.py``; else the UTF-8 file ``corpus``. Raises :class:`FileNotFoundError`
    saying where it looked."""
    if corpus:
        path = Path(corpus)
        if not path.is_file():
            raise FileNotFoundError(f"the word corpus {path} is not a file (--corpus: any UTF-8 text file)")
        return path.read_text(encoding="utf-8", errors="replace"), str(path)
    try:
        from pydoc_data.topics import topics
    except ImportError:
        import sysconfig

        where = Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data" / "topics.py"
        raise FileNotFoundError(f"the default word corpus, the standard library's module {CORPUS_MODULE} "
                                f"({where}), is missing (some distributions strip it); pass --corpus FILE (any "
                                "UTF-8 text)") from None
    import pydoc_data.topics as mod

    return "\n".join(topics[key] for key in sorted(topics)), f"{CORPUS_MODULE} ({mod.__file__})"


WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


@functools.lru_cache(maxsize=4)
def vocabulary(corpus: str = "") -> tuple[tuple[str, ...], np.ndarray, np.ndarray, str]:
    """``(words, counts, token_index, source)``: the distinct words (most frequent first), their counts in the
    corpus, every token's index into ``words``, and where the corpus came from."""
    text, source = corpus_text(corpus)
    tokens = WORD.findall(text.lower())
    if not tokens:
        raise LDPError(f"the word corpus {source} holds no word")
    words, inverse, counts = np.unique(np.asarray(tokens), return_inverse=True, return_counts=True)
    order = np.lexsort((words, -counts))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return tuple(words[order].tolist()), counts[order], rank[inverse].astype(np.int64), source


@functools.lru_cache(maxsize=4)
def vocabulary_ids(corpus: str = "") -> np.ndarray:
    """The 64-bit ids (:func:`value_ids`) of the vocabulary's words, in :func:`vocabulary`'s order."""
    return value_ids(vocabulary(corpus)[0])


def population(dataset: str, n: int, seed: int, config: Config) -> np.ndarray:
    """The ``n`` devices' 64-bit ids (``uint64``); their items are the ids' top 32 bits."""
    if dataset == "zipf":
        return zipf_items(n, BITS, config.zipf_s, seed).astype(np.uint64) << np.uint64(64 - BITS)
    _, _, tokens, _ = vocabulary(config.corpus)
    draw = np.random.default_rng(seed).integers(0, tokens.shape[0], n)
    return vocabulary_ids(config.corpus)[tokens[draw]]


def candidates(dataset: str, ids: np.ndarray, config: Config) -> np.ndarray:
    """The sketches' candidate ids: every distinct id of the data (``zipf``), the corpus vocabulary (``words``)."""
    return np.unique(ids) if dataset == "zipf" else np.unique(vocabulary_ids(config.corpus))


def population_frequencies(dataset: str, config: Config, top: int) -> list[dict[str, Any]]:
    """The ``top`` most probable items of a data set's law (Zipf's ``r^-s / Σ`` over ``2^32`` ranks; the corpus
    word frequencies), for ``data.csv``."""
    if dataset == "zipf":
        from scipy.special import zeta

        norm = float(zeta(config.zipf_s) - zeta(config.zipf_s, 2.0 ** BITS + 1))
        return [{"dataset": dataset, "rank": r, "value": f"rank {r}", "probability": r ** -config.zipf_s / norm}
                for r in range(1, top + 1)]
    words, counts, tokens, _ = vocabulary(config.corpus)
    items = id_items(vocabulary_ids(config.corpus), BITS)
    return [{"dataset": dataset, "rank": r + 1, "value": words[r], "item": int(items[r]),
             "probability": float(counts[r]) / tokens.shape[0]} for r in range(min(top, len(words)))]


# ====================================================================== protocols
@dataclass(frozen=True)
class Cell:
    """One protocol on one population at one ε: what a protocol function gets."""

    dataset: str
    protocol: str
    eps: float
    n: int
    rep: int
    data_seed: int
    noise_seed: int
    config: Config


def _items(ids: np.ndarray) -> np.ndarray:
    return id_items(np.asarray(ids, dtype=np.uint64), BITS)


def run_pem(cell: Cell, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = cell.config
    pem = PEM(BITS, cell.eps, c.k, step=c.step, start_bits=c.start_bits)
    res = pem.decode(pem.randomize(_items(ids), np.random.default_rng(cell.noise_seed)))
    return res.items, res.freq


def run_pure_ldp(cell: Cell, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pure-ldp 1.2.0's PEM on the 32-bit binary strings of the items (module doc)."""
    import random

    from estimators.sketch.pem import _lazy_lh_server_class, _pure_ldp_pem_classes

    c = cell.config
    PEMClient, PEMServer, LHServer = _pure_ldp_pem_classes()
    random.seed(cell.noise_seed)
    np.random.seed(cell.noise_seed)
    client = PEMClient(epsilon=cell.eps, start_length=c.start_bits, max_string_length=BITS, fragment_length=c.step)
    server = PEMServer(epsilon=cell.eps, start_length=c.start_bits, max_string_length=BITS, fragment_length=c.step,
                       fo_server=_lazy_lh_server_class(LHServer)(cell.eps, 2, use_olh=True))
    fmt = f"0{BITS}b"
    for v in _items(ids).tolist():
        server.aggregate(client.privatise(format(v, fmt)))
    found, counts = server.find_heavy_hitters(k=c.k)
    return (np.array([int(h, 2) for h in found], dtype=np.int64),
            np.asarray(counts, dtype=np.float64) / cell.n)  # its estimates are counts (g × the group's)


def _run_sketch(cls_name: str, cell: Cell, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CMS or HCMS ranking the candidate list: every candidate estimated (in chunks), the top ``K`` kept."""
    from estimators.sketch import cms

    c = cell.config
    proto = getattr(cms, cls_name)(cell.eps, c.cms_m, c.cms_rows, seed=cell.noise_seed)
    support = proto.support(proto.randomize(ids, np.random.default_rng(cell.noise_seed)))
    cand = candidates(cell.dataset, ids, c)
    f = np.concatenate([proto.estimate(support, cell.n, cand[i:i + CHUNK]) for i in range(0, cand.shape[0], CHUNK)])
    top = np.argsort(-f, kind="stable")[:c.k]
    return _items(cand[top]), f[top]


def run_cms(cell: Cell, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _run_sketch("CMS", cell, ids)


def run_hcms(cell: Cell, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _run_sketch("HCMS", cell, ids)


def run_treehist(cell: Cell, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from estimators.sketch.treehist import TreeHist

    c = cell.config
    th = TreeHist(cell.eps, bits=BITS, step=c.step, start_bits=c.start_bits, k_prime=c.k, seed=cell.noise_seed)
    support = th.support(th.randomize(ids, np.random.default_rng(cell.noise_seed)))
    top = th.top_k(support, cell.n, cell.config.k)
    return _items(top.items), np.asarray(top.freq, dtype=np.float64)


#: name -> (function, what it needs to be importable, relative CPU cost per report, plot style)
PROTOCOLS: dict[str, tuple[Callable[[Cell, np.ndarray], tuple[np.ndarray, np.ndarray]], tuple[str, ...], float,
                           tuple[str, str]]] = {
    "PEM": (run_pem, (), 1.0, ("tab:red", "o")),
    "pure-ldp PEM": (run_pure_ldp, ("pure_ldp", "xxhash"), 40.0, ("tab:gray", "s")),
    "CMS": (run_cms, (), 8.0, ("tab:blue", "^")),
    "HCMS": (run_hcms, (), 2.0, ("tab:cyan", "v")),
    "TreeHist": (run_treehist, ("estimators.sketch.treehist",), 1.0, ("tab:green", "D")),
}


def available(names: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """The protocols to run (``names``, or every one) whose modules import, and notes on those skipped."""
    import importlib.util

    wanted = list(names) or list(PROTOCOLS)
    unknown = [p for p in wanted if p not in PROTOCOLS]
    if unknown:
        raise LDPError(f"unknown protocol(s) {unknown}; known: {', '.join(PROTOCOLS)}")
    run, notes = [], []
    for p in wanted:
        missing = []
        for mod in PROTOCOLS[p][1]:
            try:
                found = importlib.util.find_spec(mod) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                missing.append(mod)
        if missing:
            notes.append(f"{p} skipped: {', '.join(missing)} not installed")
        else:
            run.append(p)
    return run, notes


# ====================================================================== one task
@functools.lru_cache(maxsize=2)
def _population(dataset: str, n: int, seed: int, config: Config) -> np.ndarray:
    return population(dataset, n, seed, config)


def simulate(cell: Cell) -> dict[str, Any]:
    """One protocol on one population (the runner's entry point): precision, recall, MSE, seconds."""
    config = cell.config
    ids = _population(cell.dataset, cell.n, cell.data_seed, config)
    items = _items(ids)
    u, counts = np.unique(items, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    kth = counts[order[min(config.k, u.shape[0]) - 1]]
    top_set = set(u[counts >= kth].tolist())
    top5 = set(u[order[:5]].tolist())
    fn = PROTOCOLS[cell.protocol][0]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="simulation mode")
        found, freq = fn(cell, ids)
    seconds = time.perf_counter() - t0
    found = np.asarray(found, dtype=np.int64)
    pos = np.clip(np.searchsorted(u, found), 0, u.shape[0] - 1)
    f_true = np.where(u[pos] == found, counts[pos], 0) / cell.n
    hit = len(set(found.tolist()) & top_set)
    return {"dataset": cell.dataset, "protocol": cell.protocol, "eps": cell.eps, "n": cell.n, "rep": cell.rep,
            "k": config.k, "found": int(found.shape[0]), "top_k_size": len(top_set),
            "precision": hit / found.shape[0] if found.shape[0] else math.nan,
            "recall": min(hit, config.k) / config.k, "recall_top5": len(set(found.tolist()) & top5) / len(top5),
            "mse": float(np.mean((np.asarray(freq, dtype=np.float64) - f_true) ** 2)) if found.shape[0] else math.nan,
            "distinct_items": int(u.shape[0]), "seconds": seconds}


def tasks_for(config: Config, protocols: list[str]) -> list[Cell]:
    """Every (data set, ε, n, repetition, protocol), largest first (the pool then ends evenly). Repetition
    ``r`` of a data set at ``n`` draws its population from one seed shared by every ε and protocol; the noise
    seed of a (data set, ε, n, repetition) is shared by every protocol (pure-ldp's included)."""
    cells = config.cells()
    tasks = []
    for dataset in DATASETS:
        data = {m: child_seeds(config.seed, f"heavy-hitters-data-{dataset}-{m}", config.reps)
                for m in sorted({m for _, m in cells})}
        noise = child_seeds(config.seed, f"heavy-hitters-noise-{dataset}", len(cells) * config.reps)
        for i, (e, m) in enumerate(cells):
            for r in range(config.reps):
                ds = int(data[m][r].generate_state(1, np.uint32)[0])
                ns = int(noise[i * config.reps + r].generate_state(1, np.uint32)[0])
                tasks.extend(Cell(dataset, p, e, m, r, ds, ns, config) for p in protocols)
    return sorted(tasks, key=lambda t: -t.n * PROTOCOLS[t.protocol][2])


# ====================================================================== summaries
def summarize(results: list[dict]) -> list[dict]:
    """Per (data set, protocol, ε, n): mean and standard error over the repetitions."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[(r["dataset"], r["protocol"], r["eps"], r["n"])].append(r)
    rows = []
    for (dataset, protocol, e, n), rs in groups.items():
        row: dict[str, Any] = {"dataset": dataset, "protocol": protocol, "eps": e, "n": n, "reps": len(rs)}
        for key in ("precision", "recall", "recall_top5", "mse", "seconds"):
            a = np.asarray([r[key] for r in rs], dtype=np.float64)
            row[key] = float(a.mean())
            row[f"{key}_se"] = float(a.std(ddof=1) / math.sqrt(a.size)) if a.size > 1 else 0.0
        rows.append(row)
    order = {p: i for i, p in enumerate(PROTOCOLS)}
    return sorted(rows, key=lambda r: (DATASETS.index(r["dataset"]), r["n"], r["eps"], order[r["protocol"]]))


# ====================================================================== plots
METRICS = (("precision", "precision of the top-K", False), ("recall", "recall of the top-K", False),
           ("mse", "MSE of the found items' frequencies", True))


def plot_sweep(config: Config, rows: list[dict], protocols: list[str], sweep: str, out: Path) -> Path:
    """precision, recall and MSE (columns) per data set (rows) against ε (at ``n``) or n (at ``n_eps``)."""
    plt = pyplot()
    fig, axes = plt.subplots(len(DATASETS), len(METRICS), figsize=(12, 3.4 * len(DATASETS)), squeeze=False)
    for i, dataset in enumerate(DATASETS):
        for j, (key, label, log) in enumerate(METRICS):
            ax = axes[i][j]
            for p in protocols:
                colour, marker = PROTOCOLS[p][3]
                sel = [r for r in rows if r["dataset"] == dataset and r["protocol"] == p
                       and (r["n"] == config.n if sweep == "eps" else r["eps"] == config.n_eps)]
                sel.sort(key=lambda r: r[sweep])
                if not sel:
                    continue
                ax.errorbar([r[sweep] for r in sel], [r[key] for r in sel], yerr=[1.96 * r[f"{key}_se"] for r in sel],
                            fmt=f"-{marker}", ms=4, lw=1, color=colour, capsize=2, label=p)
            if log:
                ax.set_yscale("log")
            else:
                ax.set_ylim(-0.03, 1.03)
            if sweep == "n":
                ax.set_xscale("log")
            ax.set_xlabel("ε" if sweep == "eps" else "n (devices)")
            ax.set_title(f"{dataset}: {label}", fontsize=9)
            ax.grid(alpha=0.3, which="both")
    axes[0][0].legend(fontsize=7)
    at = f"n = {config.n:,}" if sweep == "eps" else f"ε = {config.n_eps:g}"
    fig.suptitle(f"heavy hitters, K = {config.k}, {at}, {config.reps} repetitions (95% bars); zipf: Zipf("
                 f"{config.zipf_s:g}) over 2^32; words: corpus word frequencies; CMS/HCMS rank a candidate list",
                 fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.08, top=0.9, hspace=0.38, wspace=0.2)
    return save_figure(fig, out / f"vs_{sweep}.png")


def plot_data(config: Config, data_rows: list[dict], out: Path) -> Path:
    """The two laws' most probable items, the K-th marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for dataset, colour in zip(DATASETS, ("tab:purple", "tab:olive")):
        sel = [r for r in data_rows if r["dataset"] == dataset]
        ax.plot([r["rank"] for r in sel], [r["probability"] for r in sel], "-o", ms=2.5, lw=1, color=colour,
                label=dataset)
    ax.axvline(config.k, color="black", lw=0.8, ls=":", label=f"K = {config.k}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rank")
    ax.set_ylabel("frequency")
    ax.set_title("the populations' most frequent items", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.13, right=0.98, bottom=0.14, top=0.9)
    return save_figure(fig, out / "data.png")


def _table(config: Config, rows: list[dict], protocols: list[str]) -> None:
    from rich.table import Table

    for dataset in DATASETS:
        t = Table(title=f"{dataset}: ε = {config.n_eps:g}, n = {max(config.ns):,}, K = {config.k} "
                        f"(mean over {config.reps} repetitions)")
        for col in ("protocol", "precision", "recall", "recall of the top 5", "MSE", "s per run"):
            t.add_column(col, justify="right")
        for p in protocols:
            for r in rows:
                if (r["dataset"], r["protocol"], r["eps"], r["n"]) == (dataset, p, config.n_eps, max(config.ns)):
                    t.add_row(p, f"{r['precision']:.3f}", f"{r['recall']:.3f}", f"{r['recall_top5']:.2f}",
                              f"{r['mse']:.3g}", f"{r['seconds']:.2f}")
        print_table(console, t)


# ====================================================================== run
def run(config: Config, out: Path) -> dict[str, Path]:
    """The whole experiment; returns the files written."""
    protocols, notes = available(config.protocols)
    run_ = Run("heavy-hitters", {**asdict(config), "out": str(out)}, out)
    run_.announce()
    words, counts, tokens, source = vocabulary(config.corpus)
    data_note = (f"words: {tokens.shape[0]:,} words, {len(words):,} distinct, of {source}; zipf: Zipf("
                 f"{config.zipf_s:g}) over 2^32 items")
    run_.config["data_note"] = data_note
    run_.config["protocols_run"] = protocols
    run_.config["skipped"] = notes
    console.print(data_note)
    for note in notes:
        console.print(f"[yellow]note[/]: {note}")
    results = run_tasks(simulate, tasks_for(config, protocols), "heavy hitters", config.workers)
    order = list(PROTOCOLS)
    results.sort(key=lambda r: (DATASETS.index(r["dataset"]), r["n"], r["eps"], r["rep"], order.index(r["protocol"])))
    rows = summarize(results)
    data_rows = [r for d in DATASETS for r in population_frequencies(d, config, 50)]
    files = {"runs": run_.csv(results, "runs.csv"), "summary": run_.csv(rows, "summary.csv"),
             "data": run_.csv(data_rows, "data.csv")}
    _table(config, rows, protocols)
    figures = [plot_sweep(config, rows, protocols, "eps", out), plot_sweep(config, rows, protocols, "n", out),
               plot_data(config, data_rows, out)]
    run_.finish(figures)
    return files


def register(group: typer.Typer) -> None:
    """Add ``ldp experiment heavy-hitters``."""

    @group.command("heavy-hitters")
    def heavy_hitters(
            quick: QuickOption = False,
            out: OutOption = Path("experiments/heavy_hitters"),
            eps: Annotated[Optional[str], typer.Option(help="ε grid at fixed n (default 1,2,4,6; quick 2,6).")] = None,
            n: Annotated[Optional[int], typer.Option(help="n of the ε sweep (default 10^6; quick 10^4).")] = None,
            ns: Annotated[Optional[str], typer.Option(
                help="n grid at ε = --n-eps (default 100000,300000,1000000; quick 5000,10000).")] = None,
            n_eps: Annotated[Optional[float], typer.Option(help="ε of the n sweep (default 4; quick 6).")] = None,
            reps: Annotated[Optional[int], typer.Option(help="Repetitions per point (default 3; quick 1).")] = None,
            k: Annotated[int, typer.Option("-k", help="K of the top-K.")] = 20,
            protocol: Annotated[Optional[list[str]], typer.Option(
                "--protocol", "-p", help=f"Protocols to run (repeatable; default every available one: "
                                         f"{', '.join(PROTOCOLS)}).")] = None,
            corpus: Annotated[Optional[Path], typer.Option(
                help="UTF-8 text file of the words data set (default: the standard library's pydoc_data/topics.py, "
                     "the Python Language Reference's help texts).")] = None,
            workers: WorkersOption = None,
            seed: SeedOption = 0,
    ) -> None:
        """Precision and recall of the top-K and MSE of the found items vs ε and n: PEM, pure-ldp's PEM, CMS and
        HCMS over a candidate list and TreeHist, on Zipf(1.1) over 2^32 items and on the
        word frequencies of a real English text."""
        overrides: dict[str, Any] = {"workers": workers, "seed": seed, "k": k,
                                     "corpus": str(corpus) if corpus else "", "protocols": tuple(protocol or ())}
        if eps is not None:
            overrides["eps"] = floats(eps, "--eps")
        if ns is not None:
            overrides["ns"] = tuple(int(x) for x in floats(ns, "--ns"))
        for name, value in (("n", n), ("n_eps", n_eps), ("reps", reps)):
            if value is not None:
                overrides[name] = value
        try:
            config = Config.quick(**overrides) if quick else Config(**overrides)
            if config.n_eps not in config.eps or config.n not in config.ns:
                console.print("[yellow]note[/]: the two sweeps share no point (--n-eps not in --eps or --n not in "
                              "--ns)")
            run(config, out)
        except (LDPError, FileNotFoundError) as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
