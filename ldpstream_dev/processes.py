"""Service processes of the local stack: ports, spawning, liveness via /proc, the state file.

A service runs in its own session (``start_new_session``), so a Ctrl-C in the parent's terminal
does not reach it, and is stopped through its process group. A running stack is described by
``run_dir/stack.json`` (:class:`StackInfo`), which lets another process re-attach to it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

from .errors import StackError

__all__ = [
    "HOST", "STATE_FILE", "StackInfo", "is_zombie", "log_tail", "pid_alive", "port_is_free", "read_state",
    "signal_group", "spawn", "stop_child", "write_state",
]

HOST = "127.0.0.1"
#: Name of the state file written into the run directory while the stack is up.
STATE_FILE = "stack.json"
# Environment variables tansu reads as defaults of its flags / exporters; the flags we pass win
# over the first ones anyway, the others would change behaviour, so children never see them.
_TANSU_ENV_DROP = (
    "CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
    "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT",
)
# Nor the caller's AWS settings (endpoint, credentials, profile): tansu's s3:// engine reads them,
# and the stack points it at its own object server through ``spawn(extra_env=...)``.
_ENV_DROP_PREFIXES = ("AWS_",)


# --------------------------------------------------------------------------- ports


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on ``host:port`` and the port can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------- processes


def spawn(command: list[str], log_path: Path, cwd: Path,
          extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` in its own session, appending its output to ``log_path``.

    The child gets this environment less tansu's and AWS's settings, plus ``extra_env``.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in _TANSU_ENV_DROP and not k.startswith(_ENV_DROP_PREFIXES)}
    env.update(extra_env or {})
    with open(log_path, "ab") as log:
        log.write(f"=== ldp stack {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                  f"{' '.join(repr(c) if c == '' else c for c in command)}\n".encode())
        log.flush()
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            env=env,
            start_new_session=True,  # own session + process group: no terminal SIGINT/SIGHUP
            close_fds=True,
        )


def _proc_runs(pid: int, binary: str) -> bool:
    """Whether ``pid`` runs ``binary``, judged by /proc/PID/exe (True where /proc cannot tell).

    Guards against a recycled pid in a stale stack.json. argv is no good for this: redis-server
    rewrites its process title ("redis-server 127.0.0.1:PORT").
    """
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return True
    exe = exe.removesuffix(" (deleted)")
    want = os.path.realpath(binary)
    return exe == want or os.path.basename(exe) == os.path.basename(want)


def is_zombie(pid: int) -> bool:
    """True if /proc says ``pid`` has exited but was not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def pid_alive(pid: int | None, binary: str | None = None) -> bool:
    """True if ``pid`` runs (not a zombie) and, where /proc tells, runs ``binary``."""
    if not pid or pid <= 0:
        return False
    try:  # reap it if it is our own exited child (e.g. stopped through another handle)
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if is_zombie(pid):
        return False
    if binary and not _proc_runs(pid, binary):
        return False  # the pid was reused by an unrelated process
    return True


def signal_group(pid: int, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to the process group led by ``pid`` (our children lead their own)."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    try:
        if pgid == pid:
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_child(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Stop a child started with ``start_new_session=True`` (and its own children): SIGTERM to its process
    group, SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_http_ok(url: str, proc: subprocess.Popen | None, timeout: float, what: str,
                 log: Callable[[], str], poll: float = 0.05) -> None:
    """Wait until ``GET url`` answers 200 (a service's readiness); ``RuntimeError`` with ``log()`` if ``proc``
    exits first, ``TimeoutError`` with it after ``timeout`` seconds. ``what`` names the service in both."""
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; log:\n{log()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(poll)
    raise TimeoutError(f"{what} not ready after {timeout} s; log:\n{log()}")


def log_tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a service log, indented for an error message."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) if tail else "(log is empty)"


# --------------------------------------------------------------------------- state file


@dataclass
class StackInfo:
    """Where a running local stack lives; also the content of ``run_dir/stack.json``."""

    run_dir: Path
    kafka_bootstrap: str  # "127.0.0.1:PORT"
    redis_url: str  # "redis://127.0.0.1:PORT/0"
    broker_pid: int
    redis_pid: int
    broker_bin: str
    redis_bin: str
    # where the broker keeps its data: "memory" (gone when it stops) or "durable" (files in
    # run_dir served by the object server below); the defaults read a stack.json of older versions
    broker_storage: str = "memory"
    objects_url: str | None = None  # "http://127.0.0.1:PORT" of the object server (durable only)
    objects_pid: int | None = None
    objects_bin: str | None = None
    # a stack with Kafka SASL / TLS (ldpstream_dev/kafkagate.py in front of the broker): kafka_bootstrap is the
    # gateway's address, the broker listens on broker_port (loopback, never advertised); kafka_security is
    # the clients' KafkaSecurity.to_env() (password included: the state file is written mode 0600)
    broker_port: int | None = None
    gateway_pid: int | None = None
    gateway_bin: str | None = None
    kafka_security: dict[str, str] | None = None

    @property
    def objects_port(self) -> int | None:
        return int(self.objects_url.rsplit(":", 1)[1]) if self.objects_url else None

    @property
    def kafka_port(self) -> int:
        return int(self.kafka_bootstrap.rsplit(":", 1)[1])

    @property
    def redis_port(self) -> int:
        return int(self.redis_url.rsplit(":", 1)[1].split("/", 1)[0])

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StackInfo":
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = required - set(data)
        if missing:
            raise StackError(f"{STATE_FILE} lacks {sorted(missing)}")
        kwargs = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        kwargs["run_dir"] = Path(kwargs["run_dir"])
        kwargs["broker_pid"] = int(kwargs["broker_pid"])
        kwargs["redis_pid"] = int(kwargs["redis_pid"])
        for name in ("objects_pid", "gateway_pid", "broker_port"):
            if kwargs.get(name) is not None:
                kwargs[name] = int(kwargs[name])
        return cls(**kwargs)


def write_state(path: Path, info: StackInfo) -> None:
    """Write ``info`` to ``path`` atomically (temporary file + rename)."""
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold the stack's passwords
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(info.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> StackInfo | None:
    """The stack described by ``path``; ``None`` if there is no such file."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StackError(f"unreadable {path}: {exc}") from exc
    return StackInfo.from_json(data)
