"""What the commands print with: the progress bar of every long run (rich)."""
from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["progress_bar"]


def progress_bar(console: Console) -> Progress:
    """Description, bar, done/total, elapsed and remaining time, printed on ``console`` (kept when done)."""
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
