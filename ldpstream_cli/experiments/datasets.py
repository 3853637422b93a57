"""Real data sets of the papers' experiments (``ldp experiment longitudinal|allomfree|numeric --dataset NAME|PATH``).

The files live in the shared data folder, never in the repository: ``../shared/data/`` next to the
repository root (:data:`DEFAULT_DATA_DIR`), or the folder of ``--data-dir`` or of the ``LDP_DATA_DIR``
environment variable (:func:`resolve_data_dir`). Its README gives the sources and row counts.

Longitudinal data (:class:`Collections`, values ``steps × users``):

* ``adult``: Arcolezi et al., EDBT 2023 (LOLOHA), §5.1: UCI Adult's ``hours-per-week`` over the training
  and test files without the rows holding a missing value ("?"), k = 96 distinct values, τ = 260
  collections, each a random permutation of the users' values;
* ``db_mt``: EDBT 2023's DB_MT: the 80 replicate weights PWGTP1..PWGTP80 of the ACS PUMS 2018 of Montana,
  one collection per column (τ = 80), k = 1,412 distinct values over all the columns (dBitFlipPM with
  ``b = ⌊k/4⌋``);
* a CSV file (:func:`load_csv_collections`): a column per collection, or one categorical column permuted
  τ times.

Multidimensional data (:class:`Table`, values ``users × attributes``), Arcolezi et al., DCN 2022
(ALLOMFREE), §5.1: ``nursery`` (9 attributes) and ``adult`` (its 9 categorical attributes), or every
column of a CSV file (:func:`load_csv_table`).

Values are coded ``0..k-1`` in the order of their labels (numbers in numeric order, else text order).

Numeric data (:class:`NumericColumns`, values as floats, ``ldp experiment numeric``): ``adult``, Adult's ``age``
and ``hours-per-week`` over the training file without the rows holding a "?" (30,161 rows;
:func:`load_adult_numeric`), or the numeric columns of a CSV file (:func:`load_csv_numeric`).
"""
from __future__ import annotations

import csv
import gzip
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

#: the repository's sibling folder of shared data sets (never copied into the repository)
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DATA_DIR_ENV = "LDP_DATA_DIR"
ADULT_FILES = ("adult.data.gz", "adult.test.gz")
NURSERY_FILE = "nursery.data.gz"
DB_MT_FILE = "PWGTP_Montana.csv.gz"
#: DCN 2022's 9 categorical attributes of Adult (k = [7, 16, 7, 14, 6, 5, 2, 41, 2] in the paper)
ADULT_CATEGORICAL = ("workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                     "native-country", "income")
#: EDBT 2023's number of collections for Adult (random permutations of hours-per-week)
ADULT_TAU = 260
#: the most distinct values a CSV column may have to count as categorical (``--max-k``)
MAX_K = 4096
MISSING = ("?", "")
LONGITUDINAL_NAMES = ("adult", "db_mt")
MULTIDIM_NAMES = ("adult", "nursery")
NUMERIC_NAMES = ("adult",)
#: the numeric experiment's Adult populations (data set name: column) over the training file only
ADULT_NUMERIC = {"adult-age": "age", "adult-hours": "hours-per-week"}


class DatasetError(ValueError):
    """A data set that cannot be loaded: missing file, unknown name, column not categorical or not numeric."""


class DatasetNotFound(DatasetError):
    """A data set's file is not where it was looked for (the message says where, and how to point elsewhere)."""


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$LDP_DATA_DIR``, else :data:`DEFAULT_DATA_DIR`."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir)
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env) if env else DEFAULT_DATA_DIR


def _require(path: Path, what: str, shared: bool = True) -> Path:
    """``path`` if it is a file, else a :class:`DatasetNotFound` saying where it looked and how to point elsewhere."""
    if not path.is_file():
        how = (f"Put the file there (sources: ../shared/data/README.md) or point elsewhere with --data-dir DIR or "
               f"the {DATA_DIR_ENV} environment variable." if shared else
               "Pass --dataset with the path of an existing CSV file (absolute, or relative to the current folder).")
        raise DatasetNotFound(f"{what} not found: looked for {path.resolve()}. {how}")
    return path


def looks_like_path(dataset: str) -> bool:
    """Whether ``--dataset`` names a CSV file rather than a built-in data set."""
    return dataset.lower().endswith((".csv", ".csv.gz")) or os.sep in dataset or Path(dataset).exists()


def _open(path: Path):
    return gzip.open(path, "rt", newline="") if path.suffix == ".gz" else open(path, newline="")


def _read(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a (gzipped) CSV file, spaces after commas skipped, blank lines dropped."""
    with _open(path) as fh:
        rows = [r for r in csv.reader(fh, skipinitialspace=True) if r and any(c.strip() for c in r)]
    if not rows:
        raise DatasetError(f"{path} is empty")
    return [h.strip() for h in rows[0]], [[c.strip() for c in r] for r in rows[1:]]


def _sort_key(labels: Sequence[str]):
    try:
        [float(x) for x in labels]
        return float
    except ValueError:
        return str


def encode(labels_in: Sequence[str] | np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes ``0..k-1`` (int16, or int32 for k > 32,767) of the values and the labels in code order
    (numeric order when every label is a number)."""
    raw = np.asarray(labels_in, dtype=str)
    distinct = set(raw.ravel().tolist())
    uniq = sorted(distinct, key=_sort_key(list(distinct)))
    index = {v: i for i, v in enumerate(uniq)}
    codes = np.fromiter((index[v] for v in raw.ravel()), dtype=np.int32, count=raw.size).reshape(raw.shape)
    return _compact(codes, len(uniq)), tuple(uniq)


def _compact(codes: np.ndarray, k: int) -> np.ndarray:
    """int16 codes when ``k`` allows (the data travels with every task of an experiment), else int32."""
    return codes.astype(np.int16 if k <= np.iinfo(np.int16).max else np.int32)


def _check_categorical(path: Path, column: str, values: Sequence[str], max_k: int) -> None:
    distinct = len(set(values))
    if distinct < 2:
        raise DatasetError(f"column {column!r} of {path} has {distinct} distinct value(s): nothing to estimate")
    if distinct > max_k:
        raise DatasetError(f"column {column!r} of {path} is not categorical: {distinct:,} distinct values, "
                           f"more than --max-k {max_k:,} (bucket a numeric column first, or raise --max-k)")
    if len(values) >= 100 and distinct > len(values) // 2:
        raise DatasetError(f"column {column!r} of {path} is not categorical: {distinct:,} distinct values in "
                           f"{len(values):,} rows (an identifier or a continuous measurement?)")


# ====================================================================== longitudinal
@dataclass(frozen=True)
class Collections:
    """A longitudinal data set: ``τ`` collections of the same ``n`` users over the domain ``[0, k)``.

    ``columns`` (int16 or int32, ``c × n``) holds the users' values; with ``permute`` there is one column and the
    value of collection ``t`` are that column in the order of a random permutation drawn per collection
    (EDBT 2023's Adult), else collection ``t`` is column ``t`` (``c = τ``)."""

    name: str
    columns: np.ndarray
    k: int
    labels: tuple[str, ...]
    tau: int
    permute: bool
    note: str
    bitflip_b: int | None = None  # dBitFlipPM's buckets as the paper sets them (None: b = k)

    @property
    def n(self) -> int:
        return int(self.columns.shape[1])

    def steps(self, seed: np.random.SeedSequence | int | None = 0) -> Iterator[np.ndarray]:
        """The values (int64, ``(n,)``) of each collection in turn; the permutations come from ``seed``."""
        rng = np.random.default_rng(seed)
        for t in range(self.tau):
            if self.permute:
                yield self.columns[0][rng.permutation(self.n)].astype(np.int64)
            else:
                yield self.columns[t].astype(np.int64)

    def values(self, seed: np.random.SeedSequence | int | None = 0) -> np.ndarray:
        """Every collection at once: int64 ``τ × n``."""
        return np.stack(list(self.steps(seed)))

    def subset(self, n: int | None = None, tau: int | None = None,
               seed: np.random.SeedSequence | int | None = 0) -> "Collections":
        """A random sample of ``n`` users (all if ``None`` or larger) and the first ``tau`` collections."""
        columns, note = self.columns, self.note
        if n is not None and 0 < n < self.n:
            keep = np.sort(np.random.default_rng(seed).choice(self.n, size=n, replace=False))
            columns = columns[:, keep]
            note += f"; a random sample of {n:,} users"
        new_tau = self.tau
        if tau is not None and tau > 0:
            if not self.permute and tau > self.tau:
                raise DatasetError(f"{self.name} has {self.tau} collections (columns); asked for {tau}")
            new_tau = tau
            if not self.permute:
                columns = columns[:tau]
            if tau != self.tau:
                note += f"; τ = {tau} of {self.tau}"
        return replace(self, columns=np.ascontiguousarray(columns), tau=new_tau, note=note)


def load_adult_rows(data_dir: str | Path | None = None,
                    files: Sequence[str] = ADULT_FILES) -> tuple[list[str], list[list[str]], int]:
    """Adult's header and rows (of ``files``: default the training then the test file) without a missing
    value, and the rows read. The test file's income labels lose their trailing ``.``."""
    folder = resolve_data_dir(data_dir)
    header: list[str] = []
    rows: list[list[str]] = []
    read = 0
    for name in files:
        header, body = _read(_require(folder / name, f"UCI Adult ({name})"))
        read += len(body)
        rows.extend(r for r in body if len(r) == len(header) and not any(c in MISSING for c in r))
    income = header.index("income")
    for r in rows:
        r[income] = r[income].rstrip(".")
    return header, rows, read


def load_adult(data_dir: str | Path | None = None, tau: int = ADULT_TAU) -> Collections:
    """EDBT 2023's Adult: ``hours-per-week``, k = 96, ``tau`` random permutations (default 260)."""
    header, rows, read = load_adult_rows(data_dir)
    col = header.index("hours-per-week")
    codes, labels = encode([r[col] for r in rows])
    note = (f"Adult hours-per-week: {read:,} rows read from {' + '.join(ADULT_FILES)}, {len(rows):,} without "
            f"'?' (the papers say 45,222), k = {len(labels)}, τ = {tau} random permutations")
    return Collections("adult", codes[None, :], len(labels), labels, tau, True, note)


def load_db_mt(data_dir: str | Path | None = None) -> Collections:
    """EDBT 2023's DB_MT: PWGTP1..PWGTP80 as 80 collections, k = distinct values over all columns
    (1,412), dBitFlipPM's b = ⌊k/4⌋."""
    path = _require(resolve_data_dir(data_dir) / DB_MT_FILE, "DB_MT (ACS PUMS 2018 Montana PWGTP)")
    header, rows = _read(path)
    cols = [i for i, h in enumerate(header) if h.upper().startswith("PWGTP") and h[5:].isdigit()]
    cols.sort(key=lambda i: int(header[i][5:]))
    table = np.array([[r[i] for i in cols] for r in rows if len(r) == len(header)], dtype=np.int64)
    uniq = np.unique(table)
    k = int(uniq.size)
    codes = _compact(np.ascontiguousarray(np.searchsorted(uniq, table).T), k)
    note = (f"DB_MT: {table.shape[0]:,} users of {DB_MT_FILE}, {len(cols)} collections (PWGTP1..{len(cols)}), "
            f"k = {k:,}, dBitFlipPM b = {k // 4}")
    return Collections("db_mt", codes, k, tuple(str(int(v)) for v in uniq), len(cols), False, note,
                       bitflip_b=k // 4)


def _csv_columns(path: str | Path,
                 columns: Sequence[str]) -> tuple[Path, list[str], list, list[str], list[int], list]:
    """A CSV data set's path, header, rows, chosen ``columns`` (default all) and their indices, and its rows with no
    missing value (empty or ``?``) in them; a clear error for a missing file or column."""
    path = _require(Path(path), "CSV data set", shared=False)
    header, rows = _read(path)
    chosen = list(columns) or header
    missing = [c for c in chosen if c not in header]
    if missing:
        raise DatasetError(f"{path} has no column {', '.join(map(repr, missing))}; its columns: {', '.join(header)}")
    idx = [header.index(c) for c in chosen]
    return path, header, rows, chosen, idx, _complete(header, rows, idx)


def _complete(header: list[str], rows: list[list[str]], idx: Sequence[int]) -> list[list[str]]:
    """The rows of full length with no missing value (empty or ``?``) in the columns ``idx``."""
    return [r for r in rows if len(r) == len(header) and not any(r[i] in MISSING for i in idx)]


def load_csv_collections(path: str | Path, columns: Sequence[str] = (), tau: int | None = None,
                         max_k: int = MAX_K) -> Collections:
    """A CSV file with a header line: the ``columns`` (default every column) as one collection each over
    their common domain, or, for a single column, that column permuted ``tau`` times (default 260, as
    EDBT 2023's Adult). Rows with an empty or ``?`` cell in a chosen column are dropped."""
    path, header, rows, chosen, idx, kept = _csv_columns(path, columns)
    if not kept:
        raise DatasetError(f"{path}: no row without a missing value in {', '.join(chosen)}")
    for c, i in zip(chosen, idx):
        _check_categorical(path, c, [r[i] for r in kept], max_k)
    codes, labels = encode([[r[i] for r in kept] for i in idx])
    _check_categorical(path, "+".join(chosen), list(labels), max_k)
    permute = len(chosen) == 1
    steps = (tau or ADULT_TAU) if permute else len(chosen)
    how = f"column {chosen[0]!r} permuted {steps} times" if permute else f"{steps} columns as collections"
    note = f"{path.name}: {len(kept):,} users ({len(rows) - len(kept):,} rows with a missing value dropped), {how}, " \
           f"k = {len(labels)}"
    return Collections(path.stem, codes, len(labels), labels, steps, permute, note)


def load_collections(dataset: str, data_dir: str | Path | None = None, columns: Sequence[str] = (),
                     max_k: int = MAX_K) -> Collections:
    """``adult``, ``db_mt`` or the path of a CSV file (:func:`load_csv_collections`)."""
    if dataset.lower() == "adult":
        return load_adult(data_dir)
    if dataset.lower() == "db_mt":
        return load_db_mt(data_dir)
    if looks_like_path(dataset):
        return load_csv_collections(dataset, columns, max_k=max_k)
    raise DatasetError(f"unknown data set {dataset!r}: use {', '.join(LONGITUDINAL_NAMES)} or the path of a CSV file")


# ====================================================================== multidimensional
@dataclass(frozen=True)
class Table:
    """A multidimensional data set: ``n`` users' values (int16, ``n × d``) of ``d`` categorical
    attributes of domain sizes ``ks``."""

    name: str
    values: np.ndarray
    ks: tuple[int, ...]
    attributes: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]
    note: str

    @property
    def n(self) -> int:
        return int(self.values.shape[0])

    def steps(self, tau: int, seed: np.random.SeedSequence | int | None = 0) -> Iterator[np.ndarray]:
        """``tau`` collections (int64 ``n × d``): the rows as they are, then a random permutation of the rows
        per collection (every user's record changes, the histograms do not)."""
        rng = np.random.default_rng(seed)
        for t in range(tau):
            rows = self.values if t == 0 else self.values[rng.permutation(self.n)]
            yield rows.astype(np.int64)

    def subset(self, n: int | None, seed: np.random.SeedSequence | int | None = 0) -> "Table":
        if n is None or n <= 0 or n >= self.n:
            return self
        keep = np.sort(np.random.default_rng(seed).choice(self.n, size=n, replace=False))
        return replace(self, values=self.values[keep], note=self.note + f"; a random sample of {n:,} users")


def _table(name: str, header: list[str], rows: list[list[str]], attributes: Sequence[str], note: str,
           path: Path, max_k: int = MAX_K) -> Table:
    idx = [header.index(a) for a in attributes]
    cols, labels = [], []
    for a, i in zip(attributes, idx):
        vals = [r[i] for r in rows]
        _check_categorical(path, a, vals, max_k)
        c, lab = encode(vals)
        cols.append(c)
        labels.append(lab)
    ks = tuple(len(lab) for lab in labels)
    values = np.stack(cols, axis=1).astype(np.int32 if max(ks) > np.iinfo(np.int16).max else np.int16)
    return Table(name, values, ks, tuple(attributes), tuple(labels), f"{note}, ks = {list(ks)}")


def load_nursery(data_dir: str | Path | None = None) -> Table:
    """DCN 2022's Nursery: its 9 attributes (k = [3, 5, 4, 4, 3, 2, 3, 3, 5])."""
    path = _require(resolve_data_dir(data_dir) / NURSERY_FILE, "UCI Nursery")
    header, rows = _read(path)
    rows = [r for r in rows if len(r) == len(header)]
    return _table("nursery", header, rows, header, f"Nursery: {len(rows):,} users of {NURSERY_FILE}", path)


def load_adult_table(data_dir: str | Path | None = None) -> Table:
    """DCN 2022's Adult: the 9 categorical attributes over the rows without a missing value."""
    header, rows, read = load_adult_rows(data_dir)
    return _table("adult", header, rows, ADULT_CATEGORICAL,
                  f"Adult: {read:,} rows read, {len(rows):,} without '?' (the papers say 45,222; native-country "
                  "has 40 values, the paper 41)", resolve_data_dir(data_dir) / ADULT_FILES[0])


def load_csv_table(path: str | Path, columns: Sequence[str] = (), max_k: int = MAX_K) -> Table:
    """Every column (or ``columns``) of a CSV file with a header line as a categorical attribute."""
    path, header, rows, chosen, idx, kept = _csv_columns(path, columns)
    return _table(path.stem, header, kept, chosen, f"{path.name}: {len(kept):,} users", path, max_k)


def load_table(dataset: str, data_dir: str | Path | None = None, columns: Sequence[str] = (),
               max_k: int = MAX_K) -> Table:
    """``nursery``, ``adult`` or the path of a CSV file (:func:`load_csv_table`)."""
    if dataset.lower() == "nursery":
        return load_nursery(data_dir)
    if dataset.lower() == "adult":
        return load_adult_table(data_dir)
    if looks_like_path(dataset):
        return load_csv_table(dataset, columns, max_k)
    raise DatasetError(f"unknown data set {dataset!r}: use {', '.join(MULTIDIM_NAMES)} or the path of a CSV file")


# ====================================================================== numeric
@dataclass(frozen=True)
class NumericColumns:
    """Numeric columns of the same ``n`` rows: ``values[column]`` (float64, ``(n,)``) in ``[lo[column],
    hi[column]]``, the column's min and max; ``read`` rows read, ``n`` kept (no missing value in a column)."""

    name: str
    values: dict[str, np.ndarray]
    lo: dict[str, float]
    hi: dict[str, float]
    read: int
    note: str

    @property
    def n(self) -> int:
        return int(next(iter(self.values.values())).shape[0])


def _as_number(cell: str) -> float | None:
    try:
        x = float(cell)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _is_numeric(rows: list[list[str]], i: int) -> bool:
    """Whether every present cell of column ``i`` is a finite number (and one is present)."""
    cells = [r[i] for r in rows if i < len(r) and r[i] not in MISSING]
    return bool(cells) and all(_as_number(c) is not None for c in cells)


def _numeric(name: str, path: Path, kept: list[list[str]], columns: dict[str, int], read: int,
             what: str) -> NumericColumns:
    """The float columns (``name: index``) of the complete rows ``kept``; a :class:`DatasetError` for a cell
    that is not a number or for a column with fewer than two distinct values."""
    if not kept:
        raise DatasetError(f"{path}: no row without a missing value in {', '.join(columns)}")
    values, lo, hi = {}, {}, {}
    for col, i in columns.items():
        parsed = [_as_number(r[i]) for r in kept]
        bad = next((r[i] for r, x in zip(kept, parsed) if x is None), None)
        if bad is not None:
            raise DatasetError(f"column {col!r} of {path} is not numeric: it holds {bad!r} (choose numeric "
                               "columns with --columns)")
        v = np.array(parsed, dtype=np.float64)
        lo[col], hi[col] = float(v.min()), float(v.max())
        if lo[col] == hi[col]:
            raise DatasetError(f"column {col!r} of {path} is constant ({lo[col]:g}): nothing to estimate")
        values[col] = v
    note = (f"{what}: {read:,} rows read, {len(kept):,} without a missing value (empty or '?'); "
            + ", ".join(f"{c} in [{lo[c]:g}, {hi[c]:g}]" for c in columns))
    return NumericColumns(name, values, lo, hi, read, note)


def load_adult_numeric(data_dir: str | Path | None = None) -> NumericColumns:
    """Adult's ``age`` and ``hours-per-week`` (as ``adult-age`` and ``adult-hours``) over the rows of the
    training file without a "?" (30,161 of 32,560), as Wang et al., ICDE 2019 use Adult's numeric columns."""
    header, rows, read = load_adult_rows(data_dir, ADULT_FILES[:1])
    columns = {name: header.index(col) for name, col in ADULT_NUMERIC.items()}
    path = resolve_data_dir(data_dir) / ADULT_FILES[0]
    return _numeric("adult", path, rows, columns, read, f"Adult ({ADULT_FILES[0]})")


def load_csv_numeric(path: str | Path, columns: Sequence[str] = ()) -> NumericColumns:
    """The numeric ``columns`` of a CSV file with a header line (default: every column whose present cells are
    all numbers); rows with an empty or "?" cell in one of them are dropped. A chosen column holding text is
    refused, naming a bad value."""
    path, header, rows, chosen, idx, kept = _csv_columns(path, columns)
    if not columns:
        idx = [i for i in idx if _is_numeric(rows, i)]
        if not idx:
            raise DatasetError(f"{path} has no numeric column; its columns: {', '.join(header)}")
        chosen, kept = [header[i] for i in idx], _complete(header, rows, idx)
    return _numeric(path.stem, path, kept, dict(zip(chosen, idx)), len(rows), path.name)


def load_numeric(dataset: str, data_dir: str | Path | None = None, columns: Sequence[str] = ()) -> NumericColumns:
    """``adult`` (:func:`load_adult_numeric`) or the path of a CSV file (:func:`load_csv_numeric`)."""
    if dataset.lower() == "adult":
        return load_adult_numeric(data_dir)
    if looks_like_path(dataset):
        return load_csv_numeric(dataset, columns)
    raise DatasetError(f"unknown data set {dataset!r}: use syn, {', '.join(NUMERIC_NAMES)} or the path of a CSV "
                       "file")


def clip_normalize(estimate: np.ndarray) -> np.ndarray:
    """The authors' post-processing (Arcolezi et al.'s code for EDBT 2023 and DCN 2022): estimates clipped
    at 0 and renormalized to sum to 1 (uniform if every estimate is clipped)."""
    e = np.clip(np.asarray(estimate, dtype=np.float64), 0.0, None)
    total = e.sum()
    return e / total if total > 0 else np.full(e.shape, 1.0 / e.size)
