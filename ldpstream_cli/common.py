"""What the command modules share: the one error exit, the local stack's addresses, the demo campaign."""
from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from ldpstream_dev.stack import CLI_RUN_DIR

__all__ = ["DEMO_CAMPAIGN", "error_console", "fail", "fmt_eps", "stack_addresses"]

#: The campaign of `ldp demo`, `ldp produce` and `ldp soak` by default: package data (an installed wheel has no
#: deploy/ directory), a copy of deploy/campaigns/demo.toml (tests/test_cli.py checks that they are equal).
DEMO_CAMPAIGN = Path(__file__).resolve().parent / "campaigns" / "demo.toml"
error_console = Console(stderr=True)


def fmt_eps(x: float, spec: str = ".4f") -> str:
    """An ε for a table: ``∞`` for an unbounded loss (LOLOHA's and dBitFlipPM's worst case against a
    seed-aware server, single-shot protocols over several reports), else ``format(x, spec)``."""
    x = float(x)
    return "∞" if x == float("inf") else format(x, spec)


def fail(exc: Exception) -> NoReturn:
    """Print ``error: <exc>`` as one line on stderr and exit with status 2 (a usage error)."""
    error_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


def stack_addresses(kafka: str | None, redis_url: str | None, need_redis: bool = True,
                    run_dir: str = str(CLI_RUN_DIR)) -> tuple[str, str | None]:
    """Broker and Redis addresses: the options, else those of `ldp stack up`."""
    if kafka and (redis_url or not need_redis):
        return kafka, redis_url
    from ldpstream_dev.errors import StackError
    from ldpstream_dev.stack import LocalStack

    try:
        info = LocalStack.from_run_dir(Path(run_dir)).info
    except StackError:
        fail(ValueError("no --kafka given and no local stack running (start one with `ldp stack up`)"))
    if not kafka and info.kafka_security and not os.environ.get("LDP_KAFKA_SECURITY_PROTOCOL"):
        os.environ.update(info.kafka_security)  # a secured stack's SASL / TLS settings (wire.transport)
    return kafka or info.kafka_bootstrap, redis_url or info.redis_url
