"""The local stack: a Kafka-protocol broker (tansu) and a real redis-server on free local ports.

``LocalStack(...).up()`` starts both services as child processes in their own sessions (so a
Ctrl-C in the parent's terminal does not reach them), waits until both really serve
(:mod:`devtools.probes`), and writes ``run_dir/stack.json``; ``down()`` stops them (SIGTERM, then
SIGKILL) and removes that file. ``LocalStack.from_run_dir(run_dir)`` re-attaches to a stack started
by another process, which is how ``ldp stack down`` in a second shell finds the services that
``ldp stack up`` left running. Binaries: :mod:`devtools.binaries`; processes and the state file:
:mod:`devtools.processes`.
"""
from __future__ import annotations

import atexit
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from stream_app.settings import free_port

from .binaries import broker_binary, redis_binary
from .errors import StackError, StackStartupError
from .processes import (
    HOST, STATE_FILE, StackInfo, is_zombie, log_tail, pid_alive, port_is_free, read_state, signal_group, spawn,
    write_state,
)
from .probes import kafka_metadata, kafka_round_trip, redis_ping, run_coro, tcp_accepts

__all__ = ["CLI_RUN_DIR", "LocalStack"]

#: Run directory of the stack that the ``ldp stack`` CLI manages (relative to the working dir).
CLI_RUN_DIR = Path(".run/stack")

BROKER_LOG = "broker.log"
REDIS_LOG = "redis.log"
CLUSTER_ID = "ldp-local"
_SERVICES = ("broker", "redis")
_PORT_ATTEMPTS = 3  # auto-picked ports are retried this often if another process grabs one


class LocalStack:
    """Start, inspect and stop the local broker + redis pair (also a context manager)."""

    def __init__(
        self,
        run_dir: Path | str | None = None,
        kafka_port: int | None = None,
        redis_port: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(
            tempfile.mkdtemp(prefix="ldp-stack-")
        )
        self.kafka_port = kafka_port
        self.redis_port = redis_port
        self._fixed_ports = {"broker": kafka_port is not None, "redis": redis_port is not None}
        self._ports: dict[str, int | None] = {"broker": kafka_port, "redis": redis_port}
        self._procs: dict[str, subprocess.Popen | None] = {"broker": None, "redis": None}
        self._info: StackInfo | None = None
        self._atexit_registered = False

    # ------------------------------------------------------------------ public API

    @property
    def info(self) -> StackInfo | None:
        """The running stack's info (None before ``up()`` / after ``down()``)."""
        return self._info

    @property
    def state_file(self) -> Path:
        return self.run_dir / STATE_FILE

    def up(self, timeout: float = 30.0, *, stop_on_exit: bool = False) -> StackInfo:
        """Start broker and redis, wait until both serve, write ``stack.json``.

        With ``stop_on_exit=True`` an atexit hook stops the services when this interpreter
        exits; otherwise they outlive it (the CLI case) until ``down()``.
        """
        if self._info is not None and self._all_running():
            if stop_on_exit:
                self._register_atexit()
            return self._info
        deadline = time.monotonic() + timeout
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_if_running_elsewhere()
        bins = {"broker": broker_binary(), "redis": redis_binary()}
        try:
            self._start_service("redis", bins["redis"], deadline)
            self._start_service("broker", bins["broker"], deadline)
            self._wait_kafka_ready(deadline)
            for name in _SERVICES:  # a stranger on our port would have answered the probes
                self._check_alive(name)
        except BaseException:
            self._stop_processes(timeout=5.0)
            raise
        broker, redis = self._procs["broker"], self._procs["redis"]
        assert broker is not None and redis is not None
        self._info = StackInfo(
            run_dir=self.run_dir.resolve(),
            kafka_bootstrap=f"{HOST}:{self._ports['broker']}",
            redis_url=f"redis://{HOST}:{self._ports['redis']}/0",
            broker_pid=broker.pid,
            redis_pid=redis.pid,
            broker_bin=bins["broker"],
            redis_bin=bins["redis"],
        )
        self.kafka_port, self.redis_port = self._ports["broker"], self._ports["redis"]
        write_state(self.state_file, self._info)
        if stop_on_exit:
            self._register_atexit()
        return self._info

    def down(self, timeout: float = 10.0) -> None:
        """Stop both services (SIGTERM, wait, SIGKILL) and remove ``stack.json``; idempotent."""
        if self._info is None and not any(self._procs.values()):
            self._try_load_state()  # `LocalStack(run_dir).down()` in another process
        self._stop_processes(timeout=timeout)
        if self._state_is_ours_or_stale():
            self._remove_state()
        self._info = None
        if self._atexit_registered:
            atexit.unregister(self._atexit_down)
            self._atexit_registered = False

    def restart_redis(self, *, kill: bool = True, timeout: float = 30.0) -> int:
        """Fault injection: stop redis-server (SIGKILL if ``kill``, else SIGTERM) and start it again
        on the same port with the same data directory (its AOF). Returns the new pid."""
        proc = self._procs["redis"]
        if self._info is None or proc is None:
            raise StackError("restart_redis needs a stack started by this LocalStack")
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        proc.wait(timeout=timeout)
        fixed = self._fixed_ports["redis"]
        self._fixed_ports["redis"] = True  # same port: clients reconnect to the same URL
        try:
            self._start_service("redis", self._info.redis_bin, time.monotonic() + timeout)
        finally:
            self._fixed_ports["redis"] = fixed
        new = self._procs["redis"]
        assert new is not None
        self._info = replace(self._info, redis_pid=new.pid)
        write_state(self.state_file, self._info)
        return new.pid

    def status(self) -> dict[str, Any]:
        """Per service: pid, port, running (pid alive) and ready (PING / Kafka metadata)."""
        info = self._info
        if info is None:
            self._try_load_state()
            info = self._info
        out: dict[str, Any] = {
            "run_dir": str(self.run_dir),
            "state_file": str(self.state_file) if self.state_file.exists() else None,
            "kafka_bootstrap": info.kafka_bootstrap if info else None,
            "redis_url": info.redis_url if info else None,
        }
        for name in _SERVICES:
            pid = self._pid(name)
            port = self._port(name)
            running = self._running(name)
            ready = False
            if running and port:
                if name == "redis":
                    ready = redis_ping(port)
                else:
                    try:
                        ready = bool(run_coro(kafka_metadata(f"{HOST}:{port}", 3.0)))
                    except Exception:  # noqa: BLE001 - not ready, whatever the reason
                        ready = False
            out[name] = {"pid": pid, "port": port, "running": running, "ready": ready}
        return out

    @classmethod
    def from_run_dir(cls, run_dir: Path | str) -> "LocalStack":
        """Re-attach to the stack whose ``stack.json`` is in ``run_dir``."""
        stack = cls(run_dir=Path(run_dir))
        if not stack._try_load_state():
            raise StackError(f"no local stack state in {stack.state_file} (is the stack up?)")
        return stack

    def __enter__(self) -> StackInfo:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def __repr__(self) -> str:
        state = "up" if self._info else "down"
        return f"LocalStack(run_dir={str(self.run_dir)!r}, {state})"

    # ------------------------------------------------------------------ internals

    def _pid(self, name: str) -> int | None:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.pid
        if self._info is not None:
            return self._info.broker_pid if name == "broker" else self._info.redis_pid
        return None

    def _bin(self, name: str) -> str | None:
        if self._info is not None:
            return self._info.broker_bin if name == "broker" else self._info.redis_bin
        proc = self._procs.get(name)
        return str(proc.args[0]) if proc is not None else None  # type: ignore[index]

    def _port(self, name: str) -> int | None:
        if self._info is not None:
            return self._info.kafka_port if name == "broker" else self._info.redis_port
        return self._ports.get(name)

    def _running(self, name: str) -> bool:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.poll() is None and not is_zombie(proc.pid)
        return pid_alive(self._pid(name), self._bin(name))

    def _all_running(self) -> bool:
        return all(self._running(n) for n in _SERVICES)

    def _log_path(self, name: str) -> Path:
        return self.run_dir / (BROKER_LOG if name == "broker" else REDIS_LOG)

    def _command(self, name: str, binary: str, port: int) -> list[str]:
        if name == "redis":
            return [
                # AOF, fsync every second (as in docker-compose): a redis-server killed with SIGKILL
                # comes back with everything applied up to about a second before
                binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "yes",
                "--appendfsync", "everysec", "--dir", str(self.run_dir.resolve()), "--daemonize", "no",
            ]
        url = f"tcp://{HOST}:{port}"
        return [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
            "--cluster-id", CLUSTER_ID,
        ]

    def _start_service(self, name: str, binary: str, deadline: float) -> None:
        """Spawn ``name`` and wait until it accepts (redis: answers PING) on its port."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            if self._fixed_ports[name]:
                port = self._ports[name]
                assert port is not None
                if not port_is_free(port):
                    raise StackStartupError(f"{name}: port {HOST}:{port} is already in use")
            else:
                port = free_port(HOST)
            self._ports[name] = port
            proc = spawn(self._command(name, binary, port), self._log_path(name), self.run_dir)
            self._procs[name] = proc
            probe = redis_ping if name == "redis" else tcp_accepts
            while True:
                if proc.poll() is not None:
                    break
                if probe(port):
                    return
                if time.monotonic() >= deadline:
                    raise StackStartupError(
                        f"{name} did not become ready on {HOST}:{port} in time; "
                        f"log tail of {self._log_path(name)}:\n{log_tail(self._log_path(name))}"
                    )
                time.sleep(0.05)
            tail = log_tail(self._log_path(name))
            self._procs[name] = None
            in_use = "in use" in tail.lower() or "addrinuse" in tail.lower()
            if in_use and not self._fixed_ports[name] and attempt < _PORT_ATTEMPTS:
                continue  # another process took the auto-picked port: pick another one
            raise StackStartupError(
                f"{name} ({binary}) exited with code {proc.returncode} during startup on "
                f"{HOST}:{port}; log tail of {self._log_path(name)}:\n{tail}"
            )

    def _wait_kafka_ready(self, deadline: float) -> None:
        bootstrap = f"{HOST}:{self._ports['broker']}"
        last_error: BaseException | None = None
        while True:
            self._check_alive("broker")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StackStartupError(
                    f"broker on {bootstrap} accepts connections but did not serve a metadata "
                    f"request and a produce/fetch round trip in time (last error: {last_error!r}); "
                    f"log tail of {self._log_path('broker')}:\n"
                    f"{log_tail(self._log_path('broker'))}"
                )
            try:
                per_try = min(remaining, 10.0)
                run_coro(kafka_metadata(bootstrap, per_try))
                run_coro(kafka_round_trip(bootstrap, min(deadline - time.monotonic(), 15.0)))
                return
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - retried until the deadline
                last_error = exc
                time.sleep(0.2)

    def _check_alive(self, name: str) -> None:
        proc = self._procs[name]
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            raise StackStartupError(
                f"{name} died during startup (exit code {code}); log tail of "
                f"{self._log_path(name)}:\n{log_tail(self._log_path(name))}"
            )

    def _stop_processes(self, timeout: float) -> None:
        targets = []
        for name in _SERVICES:
            pid = self._pid(name)
            if pid and self._running(name):
                targets.append((name, pid))
        for _, pid in targets:
            signal_group(pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while any(self._running(n) for n, _ in targets) and time.monotonic() < end:
            time.sleep(0.05)
        for name, pid in targets:
            if self._running(name):
                signal_group(pid, signal.SIGKILL)
        end = time.monotonic() + 5.0
        while any(self._running(n) for n, _ in targets) and time.monotonic() < end:
            time.sleep(0.05)
        for name in _SERVICES:
            proc = self._procs.get(name)
            if proc is not None:
                try:
                    proc.wait(timeout=1.0)
                except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL'd above
                    pass
                self._procs[name] = None
        still = [n for n, _ in targets if pid_alive(dict(targets)[n], self._bin(n))]
        if still:  # pragma: no cover - SIGKILL does not fail for our own children
            raise StackError(f"could not stop {still}")

    def _try_load_state(self) -> bool:
        info = read_state(self.state_file)
        if info is None:
            return False
        self._info = info
        self._ports = {"broker": info.kafka_port, "redis": info.redis_port}
        self.kafka_port, self.redis_port = info.kafka_port, info.redis_port
        return True

    def _state_is_ours_or_stale(self) -> bool:
        """True if stack.json describes this stack, or a stack none of whose pids is alive."""
        try:
            info = read_state(self.state_file)
        except StackError:
            return True
        if info is None:
            return False
        if self._info is not None and (info.broker_pid, info.redis_pid) == (
            self._info.broker_pid, self._info.redis_pid
        ):
            return True
        return not (pid_alive(info.broker_pid, info.broker_bin)
                    or pid_alive(info.redis_pid, info.redis_bin))

    def _remove_state(self) -> None:
        try:
            self.state_file.unlink()
        except FileNotFoundError:
            pass

    def _refuse_if_running_elsewhere(self) -> None:
        try:
            info = read_state(self.state_file)
        except StackError:
            info = None
        if info is None:
            return
        alive = [
            name for name, pid, binary in (
                ("broker", info.broker_pid, info.broker_bin),
                ("redis", info.redis_pid, info.redis_bin),
            ) if pid_alive(pid, binary)
        ]
        if alive:
            raise StackError(
                f"a local stack is already running from {self.run_dir} ({', '.join(alive)}: "
                f"kafka {info.kafka_bootstrap}, redis {info.redis_url}); stop it first "
                "(`ldp stack down`) or use another run directory"
            )
        self._remove_state()  # stale state of a stack that died

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._atexit_down)
            self._atexit_registered = True

    def _atexit_down(self) -> None:
        try:
            self.down(timeout=5.0)
        except Exception:  # noqa: BLE001 - never raise during interpreter shutdown
            pass
