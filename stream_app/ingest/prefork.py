"""Pre-fork supervision: N server processes forked from this one, each listening on the same port
(``SO_REUSEPORT``: the kernel spreads the connections over them).

The supervisor forks the processes, waits until each reported ready, and then watches them:

- SIGTERM or SIGINT: forwarded (as SIGTERM) to every process, which stops accepting, answers its requests in
  flight and exits; a process still alive after ``kill_timeout`` seconds is killed;
- a process that exits before it reported ready (cannot reach the broker, cannot bind the port) stops the
  service: the others are stopped and the exit status is 1;
- a process that exits later on its own (a crash, the OOM killer) is logged and replaced, at most once a
  second, so one failure does not take the port's other processes down with it;
- the supervisor killed (SIGKILL): each process notices within a second and stops as on SIGTERM.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable

__all__ = ["run_processes"]

log = logging.getLogger(__name__)

#: ``target(index, ready)``: serve until SIGTERM; call ``ready()`` once listening.
Target = Callable[[int, Callable[[], None]], None]


def _watch_parent(parent: int) -> None:
    """SIGTERM to this process once its supervisor is gone (killed with SIGKILL: no one forwards signals)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    log.error("the supervisor (pid %d) is gone: stopping", parent)
    os.kill(os.getpid(), signal.SIGTERM)


def _child(target: Target, index: int, ready: Connection, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor turns ^C into SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # until the target installs its own
    threading.Thread(target=_watch_parent, args=(parent,), name="watch-supervisor", daemon=True).start()

    def say_ready() -> None:
        ready.send(os.getpid())
        ready.close()

    target(index, say_ready)


class _Slot:
    """Process ``index``: the running one, whether it reported ready, when it started."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: Any = None
        self.ready_conn: Connection | None = None
        self.ready = False
        self.started = 0.0


def run_processes(target: Target, processes: int, *, kill_timeout: float, startup_timeout: float = 120.0,
                  name: str = "server") -> int:
    """Run ``processes`` forks of ``target`` until SIGTERM/SIGINT (module doc); returns the exit status."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, not {processes}")
    ctx = multiprocessing.get_context("fork")
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    slots = [_Slot(i) for i in range(processes)]

    def spawn(slot: _Slot) -> None:
        parent_end, child_end = ctx.Pipe(duplex=False)
        slot.proc = ctx.Process(target=_child, args=(target, slot.index, child_end, os.getpid()),
                                name=f"{name}-{slot.index}",
                                daemon=False)
        slot.proc.start()
        child_end.close()
        slot.ready_conn, slot.ready, slot.started = parent_end, False, time.monotonic()

    status = 0
    try:
        for slot in slots:
            spawn(slot)
        announced = False
        while not stopping:
            waitables: list[Any] = [s.proc.sentinel for s in slots]
            waitables += [s.ready_conn for s in slots if s.ready_conn is not None]
            for obj in wait(waitables, timeout=0.5):
                for slot in slots:
                    if obj is slot.ready_conn:
                        try:
                            slot.ready_conn.recv()
                            slot.ready = True
                        except EOFError:
                            pass  # it exited before saying so: its sentinel tells
                        slot.ready_conn.close()
                        slot.ready_conn = None
            for slot in slots:
                if slot.proc.is_alive():
                    if not slot.ready and time.monotonic() - slot.started > startup_timeout:
                        log.error("%s process %d (pid %d) not ready after %.0f s", name, slot.index, slot.proc.pid,
                                  startup_timeout)
                        return (status := 1)
                    continue
                code = slot.proc.exitcode
                if stopping:
                    break
                if not slot.ready:
                    log.error("%s process %d (pid %d) exited with status %s before it was ready", name, slot.index,
                              slot.proc.pid, code)
                    return (status := 1)
                log.error("%s process %d (pid %d) exited with status %s; starting another", name, slot.index,
                          slot.proc.pid, code)
                time.sleep(max(0.0, 1.0 - (time.monotonic() - slot.started)))
                spawn(slot)
            if not announced and all(s.ready for s in slots):
                announced = True
                log.info("%s: %d process(es) ready", name, processes)
        return status
    finally:
        _stop_all(slots, kill_timeout, name)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_all(slots: list[_Slot], kill_timeout: float, name: str) -> None:
    alive = [s.proc for s in slots if s.proc is not None and s.proc.is_alive()]
    for proc in alive:
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + kill_timeout
    for proc in alive:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            log.warning("%s process pid %d still running %.0f s after SIGTERM: killing it", name, proc.pid,
                        kill_timeout)
            proc.kill()
            proc.join(5.0)
