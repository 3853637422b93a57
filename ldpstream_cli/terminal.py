"""What the commands print with: the progress bar of every long run and the tables (rich).

A table is never cut: on a terminal it takes the terminal's width, elsewhere (a pipe, a file) its
natural width. With ``--json`` or ``--csv`` a command prints its tables in that format on stdout and
everything else on stderr."""
from __future__ import annotations

import csv
import json
import math
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from .common import error_console, fail

__all__ = ["JSON_FLAG", "CSV_FLAG", "TableOutput", "print_table", "progress_bar", "table_data"]

JSON_FLAG = Annotated[bool, typer.Option("--json", help="Print the tables as JSON on stdout (everything else on "
                                                        "stderr).")]
CSV_FLAG = Annotated[bool, typer.Option("--csv", help="Print the tables as CSV on stdout (everything else on "
                                                      "stderr).")]


#: Seconds between two progress lines where the console is not a terminal (a log file, a pipe).
LOG_PROGRESS_EVERY = 30.0


class _LoggedProgress(Progress):
    """A rich progress bar that, where the console is not a terminal (rich then draws nothing until the end),
    prints a plain line per task at most every :data:`LOG_PROGRESS_EVERY` seconds and when it completes:
    ``description: done/total (pct), elapsed, about N s left``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._logged: dict[Any, float] = {}

    def update(self, task_id: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().update(task_id, **kwargs)
        self._log(task_id)

    def advance(self, task_id: Any, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log(task_id)

    def _log(self, task_id: Any) -> None:
        if self.console.is_terminal:
            return
        task = next(t for t in self.tasks if t.id == task_id)
        now = time.monotonic()
        if not task.finished and now - self._logged.get(task_id, task.start_time or now) < LOG_PROGRESS_EVERY:
            return
        self._logged[task_id] = now
        total = f"/{task.total:g} ({100 * task.completed / task.total:.0f}%)" if task.total else ""
        left = f", about {task.time_remaining:.0f} s left" if task.time_remaining and not task.finished else ""
        self.console.print(f"{Text.from_markup(str(task.description)).plain}: {task.completed:g}{total}, "
                           f"{task.elapsed or 0:.0f} s{left}", highlight=False)


def progress_bar(console: Console) -> Progress:
    """Description, bar, done/total, elapsed and remaining time, printed on ``console`` (kept when done); where
    ``console`` is not a terminal, a plain line every 30 s instead."""
    return _LoggedProgress(TextColumn("[progress.description]{task.description}"), BarColumn(),
                           MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                           transient=False)


def print_table(console: Console, table: Table) -> None:
    """Print ``table`` uncut: at the terminal's width, or at its natural width when ``console`` is not a terminal."""
    if console.is_terminal:
        console.print(table)
        return
    natural = console.measure(table, options=console.options.update_width(1 << 20)).maximum
    width = console.width
    console.width = max(width, natural)
    try:
        console.print(table)
    finally:
        console.width = width


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _value(text: str) -> int | float | str:
    """A cell as JSON: a finite number where the text is one, ``null`` for ``∞`` (an unbounded ε, as
    the estimate documents' ``_finite``), else the text (``inf`` stays a string)."""
    if text == "∞":
        return None
    for kind in (int, float):
        try:
            number = kind(text)
        except ValueError:
            continue
        return number if math.isfinite(number) else text
    return text


def table_data(table: Table) -> dict[str, Any]:
    """``{"title", "columns", "rows"}`` of a rich table, its cells as plain text (markup removed)."""
    columns = [_plain(c.header) for c in table.columns]
    cells = [[_plain(cell) for cell in c.cells] for c in table.columns]
    return {"title": _plain(table.title or ""), "columns": columns, "rows": [list(r) for r in zip(*cells)]}


class TableOutput:
    """Where a command's tables go: rich tables on ``console``, or, with ``--json`` / ``--csv``, collected and
    written to stdout by :meth:`close` (then :attr:`console`, for everything else, is stderr)."""

    def __init__(self, console: Console, as_json: bool = False, as_csv: bool = False) -> None:
        if as_json and as_csv:
            fail(ValueError("--json and --csv exclude each other"))
        self.format = "json" if as_json else "csv" if as_csv else "table"
        self.console = console if self.format == "table" else error_console
        self._tables: list[dict[str, Any]] = []

    def show(self, table: Table) -> None:
        """Print ``table`` now (rich), or keep it for :meth:`close`."""
        if self.format == "table":
            print_table(self.console, table)
        else:
            self._tables.append(table_data(table))

    def close(self) -> None:
        """Write the kept tables: JSON, a list of ``{"title", "columns", "rows"}``; CSV, per table a ``# title``
        line, the header and the rows, tables separated by an empty line."""
        if self.format == "json":
            for t in self._tables:
                t["rows"] = [[_value(c) for c in row] for row in t["rows"]]
            json.dump(self._tables, sys.stdout, ensure_ascii=False, indent=1, allow_nan=False)
            sys.stdout.write("\n")
        elif self.format == "csv":
            writer = csv.writer(sys.stdout, lineterminator="\n")
            for i, t in enumerate(self._tables):
                if i:
                    sys.stdout.write("\n")
                sys.stdout.write(f"# {t['title']}\n")
                writer.writerow(t["columns"])
                writer.writerows(t["rows"])
        sys.stdout.flush()
