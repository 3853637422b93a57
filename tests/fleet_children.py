"""``ldp produce`` in children of a multiprocessing forkserver (tests/test_fleet_resume.py).

A fresh interpreter spends about 1.5 s importing the CLI. The forkserver imports this module (and with
it the CLI) once; each child it forks runs the ``ldp produce`` command in-process with its arguments,
from the first line of its code path. (Making numba's first call in the forkserver as well was tried:
it made each child's first numba call slower, 1.0-2.0 s instead of 0.25-0.5 s to open a fleet.)
"""
from __future__ import annotations

import multiprocessing
import os
import sys

import aiokafka.admin  # noqa: F401 - imported once, by the forkserver (as what follows)

import ldpstream_cli.cli
import producers.fleet  # noqa: F401
import stream_app.health  # noqa: F401


def run_cli(argv: list[str], log: str) -> None:
    """``ldp *argv`` (``ldpstream_cli.cli.app``), its output appended to ``log``, its exit status the process's."""
    multiprocessing.set_start_method("fork", force=True)  # numba's process lock: not left to the resource tracker
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    try:
        ldpstream_cli.cli.app(args=argv, prog_name="ldp")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
