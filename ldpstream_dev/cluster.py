"""A local Redis Cluster: three redis-server masters on free ports (tests, experiments).

``LocalRedisCluster()`` used as a context manager starts three ``redis-server`` processes (the
binary of :func:`ldpstream_dev.binaries.redis_binary`, the same as the local stack's) with
``--cluster-enabled yes`` (Redis 7 or later: the cluster-bus port is given with ``--cluster-port``,
a free one like the client port), each with its own directory (cluster config file ``nodes.conf``, AOF)
under the run directory, and forms the cluster with plain commands (no ``redis-cli``): each node
gets its configuration epoch and one third of the 16384 hash slots (``CLUSTER ADDSLOTS``, the split
``redis-cli --cluster create`` makes), then the first node meets the others (``CLUSTER MEET``).
It is ready once every node reports ``cluster_state:ok`` and knows all nodes. ``url`` is the
cluster URL that :mod:`stream_app.store` understands (``redis+cluster://127.0.0.1:P1,...``);
exit stops every node and removes a run directory it created.

It starts Redis only: a test runs the broker of a :class:`ldpstream_dev.stack.LocalStack` next to it
and points its workers' ``redis_url`` at ``cluster.url``. Forming the cluster takes a few admin
commands, sent over RESP directly on a node's port (as :func:`ldpstream_dev.probes.redis_ping` does):
the data path goes through :mod:`stream_app.store` only.
"""
from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from stream_app.settings import free_port
from stream_app.store import cluster_url

from .binaries import redis_binary
from .errors import StackError, StackStartupError
from .processes import HOST, log_tail, signal_group, spawn
from .probes import redis_ping

__all__ = ["CLUSTER_SLOTS", "LocalRedisCluster", "RedisReplyError", "redis_command", "slot_ranges"]

#: Hash slots of a Redis Cluster.
CLUSTER_SLOTS = 16384
_PORT_ATTEMPTS = 3  # an auto-picked port taken by another process is retried this often


class RedisReplyError(StackError):
    """A node answered an admin command with a RESP error."""


# ---------------------------------------------------------------------------- RESP, for admin commands
def _encode(args: tuple[Any, ...]) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(stream: Any) -> Any:
    line = stream.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed in the middle of a reply")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise RedisReplyError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        return None if size < 0 else stream.read(size + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        size = int(body)
        return None if size < 0 else [_read_reply(stream) for _ in range(size)]
    raise ConnectionError(f"unexpected RESP reply {line[:40]!r}")


def redis_command(port: int, *args: Any, host: str = HOST, timeout: float = 5.0) -> Any:
    """Send one command to the Redis node at ``host:port`` and return its decoded reply.

    For admin commands of the dev tooling (forming a cluster); raises :class:`RedisReplyError`
    on an error reply and ``OSError`` if the node cannot be reached."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(_encode(args))
        with sock.makefile("rb") as stream:
            return _read_reply(stream)


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The inclusive slot range of each master: the slots split evenly, in order."""
    bounds = [round(i * CLUSTER_SLOTS / masters) for i in range(masters + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(masters)]


# ---------------------------------------------------------------------------- the launcher
class LocalRedisCluster:
    """Start, inspect and stop a local Redis Cluster of ``masters`` redis-server nodes (no replicas).

    ``up()`` (or ``with``) returns once the cluster serves; ``url`` is its cluster URL, ``ports``
    the node ports in order (node ``i`` owns ``slot_ranges(masters)[i]``); ``down()`` stops it."""

    def __init__(self, run_dir: Path | str | None = None, masters: int = 3, node_timeout_ms: int = 5000) -> None:
        if masters < 1:
            raise ValueError(f"a cluster needs at least one master, got {masters}")
        self._own_run_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="ldp-redis-cluster-"))
        self.masters = masters
        self.node_timeout_ms = node_timeout_ms
        self.ports: list[int] = []
        self.bus_ports: list[int] = []
        self._procs: list[subprocess.Popen] = []
        self._atexit_registered = False

    # ------------------------------------------------------------------ public API
    @property
    def url(self) -> str:
        """The cluster URL (``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``) of the running cluster."""
        if not self.ports:
            raise StackError("the Redis cluster is not up")
        return cluster_url([(HOST, port) for port in self.ports])

    def up(self, timeout: float = 30.0) -> "LocalRedisCluster":
        """Start the nodes, form the cluster and wait until every node serves all slots."""
        if self._procs:
            return self
        deadline = time.monotonic() + timeout
        self.run_dir.mkdir(parents=True, exist_ok=True)
        binary = redis_binary()
        self._register_atexit()
        try:
            for index in range(self.masters):
                self._start_node(index, binary, deadline)
            self._form(deadline)
        except BaseException:
            self.down()
            raise
        return self

    def down(self, timeout: float = 10.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL) and remove a run directory this object created."""
        for proc in self._procs:
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGTERM)
        end = time.monotonic() + timeout
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5.0)
        self._procs, self.ports, self.bus_ports = [], [], []
        if self._own_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if self._atexit_registered:
            atexit.unregister(self.down)
            self._atexit_registered = False

    def node_of_slot(self, slot: int) -> int:
        """The port of the node that owns hash slot ``slot``."""
        for port, (first, last) in zip(self.ports, slot_ranges(self.masters)):
            if first <= slot <= last:
                return port
        raise ValueError(f"slot {slot} is outside 0..{CLUSTER_SLOTS - 1}")

    def info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of one node as a dict (``cluster_state``, ``cluster_known_nodes``, ...)."""
        text = redis_command(port, "CLUSTER", "INFO")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def __enter__(self) -> "LocalRedisCluster":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"LocalRedisCluster(run_dir={str(self.run_dir)!r}, ports={self.ports})"

    # ------------------------------------------------------------------ internals
    def _node_dir(self, index: int) -> Path:
        return self.run_dir / f"node-{index}"

    def _log_path(self, index: int) -> Path:
        return self._node_dir(index) / "redis.log"

    def _command(self, binary: str, port: int, bus_port: int, node_dir: Path) -> list[str]:
        return [
            binary, "--port", str(port), "--bind", HOST, "--daemonize", "no", "--dir", str(node_dir.resolve()),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus_port),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction",
        ]

    def _start_node(self, index: int, binary: str, deadline: float) -> None:
        """Spawn node ``index`` on a free port (and a free cluster-bus port) and wait until it answers PING."""
        node_dir = self._node_dir(index)
        node_dir.mkdir(parents=True, exist_ok=True)
        log = self._log_path(index)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port, bus_port = free_port(HOST), free_port(HOST)  # the bus port: not the default port + 10000
            proc = spawn(self._command(binary, port, bus_port, node_dir), log, node_dir)
            while proc.poll() is None and not redis_ping(port):
                if time.monotonic() >= deadline:
                    self._procs.append(proc)  # stopped by down()
                    raise StackStartupError(f"redis cluster node {index} did not answer PING on {HOST}:{port} "
                                            f"in time; log tail of {log}:\n{log_tail(log)}")
                time.sleep(0.05)
            if proc.poll() is None:
                self._procs.append(proc)
                self.ports.append(port)
                self.bus_ports.append(bus_port)
                return
            tail = log_tail(log)
            if "in use" in tail.lower() and attempt < _PORT_ATTEMPTS:
                continue  # another process took the auto-picked port
            raise StackStartupError(f"redis cluster node {index} ({binary}) exited with code {proc.returncode} "
                                    f"on {HOST}:{port}; log tail of {log}:\n{tail}")

    def _form(self, deadline: float) -> None:
        """Give each node its epoch and slots, introduce the nodes, wait for ``cluster_state:ok`` everywhere."""
        for epoch, (port, (first, last)) in enumerate(zip(self.ports, slot_ranges(self.masters)), start=1):
            redis_command(port, "CLUSTER", "SET-CONFIG-EPOCH", epoch)  # distinct epochs: no collision round
            redis_command(port, "CLUSTER", "ADDSLOTS", *range(first, last + 1))
        for port, bus_port in zip(self.ports[1:], self.bus_ports[1:]):
            redis_command(self.ports[0], "CLUSTER", "MEET", HOST, port, bus_port)
        while True:
            states = {port: self.info(port) for port in self.ports}
            if all(s.get("cluster_state") == "ok" and s.get("cluster_known_nodes") == str(self.masters)
                   and s.get("cluster_slots_assigned") == str(CLUSTER_SLOTS) for s in states.values()):
                return
            for index, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    raise StackStartupError(f"redis cluster node {index} died while the cluster formed; log tail "
                                            f"of {self._log_path(index)}:\n{log_tail(self._log_path(index))}")
            if time.monotonic() >= deadline:
                summary = {p: (s.get("cluster_state"), s.get("cluster_known_nodes")) for p, s in states.items()}
                raise StackStartupError(f"the redis cluster did not reach cluster_state:ok on every node in time "
                                        f"(port: (state, known nodes)): {summary}")
            time.sleep(0.05)

    def _register_atexit(self) -> None:
        if not self._atexit_registered:
            atexit.register(self.down)
            self._atexit_registered = True
