"""The ingest's HTTP server (uvicorn with stream_app/ingest/server.py's guards, serving
stream_app/ingest/asgi.py) over real sockets: keep-alive, pipelining, chunked bodies, ``Expect: 100-continue``,
the limits and timeouts (first byte, headers, body, slow requests, connections per process and per address),
malformed requests and request smuggling, graceful stop; and uvicorn's supervisor as ``ldp ingest`` runs it
(processes sharing a port, a crashed one replaced, a failed start, SIGTERM, the supervisor killed)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
import uvicorn
import uvloop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_app.ingest.asgi import IngestAsgi
from stream_app.ingest.handler import BodyTooLarge
from stream_app.ingest.server import ConnectionGuard, IngestHttpProtocol
from stream_app.ingest.service import Request, Response

ROOT = Path(__file__).resolve().parent.parent


class EchoApp:
    """Stands in for :class:`IngestApp` behind the real ASGI adapter: ``route`` echoes what it got, as JSON (a
    ``POST /slow`` waits for ``release``, ``/fail`` raises)."""

    def __init__(self, max_body_bytes: int, **guard: Any) -> None:
        self.settings = SimpleNamespace(max_body_bytes=max_body_bytes, loglevel="warning", processes=1,
                                        request_timeout=guard.get("request_seconds", 30.0),
                                        first_byte_timeout=guard.get("first_byte_seconds", 5.0),
                                        max_connections=guard.get("max_connections", 10_000),
                                        max_connections_per_ip=guard.get("max_connections_per_ip", 1_000))
        self.max_header_bytes = guard.get("max_header_bytes", 16 << 10)
        self.refusals: list[str] = []
        self.seen: list[Request] = []
        self.release = asyncio.Event()

    async def start(self) -> None:
        self.release = asyncio.Event()  # on the server's loop

    async def stop(self) -> None:
        pass

    def http_refused(self, reason: str) -> None:
        self.refusals.append(reason)

    async def route(self, request: Request) -> Response:
        # a request counts as seen once its body is read, as the ingest's handler acts on a request (a malformed
        # body is refused by the server while the handler waits for it, and the handler never returns)
        try:
            body, too_large = await request.read(self.settings.max_body_bytes), False
        except BodyTooLarge:
            body, too_large = b"", True
        self.seen.append(request)
        if request.path == "/slow":
            await self.release.wait()
        if request.path == "/fail":
            raise RuntimeError("the handler failed")
        doc = {"method": request.method, "path": request.path, "body": body.decode("latin-1"),
               "too_large": too_large, "headers": request.headers}
        return Response(200, (("content-type", "application/json"),), json.dumps(doc).encode())


class _EchoAsgi(IngestAsgi):
    """The adapter with the echo app's header limit (not a setting of the ingest: 16 KiB there)."""

    def guard(self, app: Any) -> ConnectionGuard:
        guard = super().guard(app)
        guard.max_header_bytes = app.max_header_bytes
        return guard


class ServerThread:
    """uvicorn with :class:`IngestHttpProtocol` and :class:`IngestAsgi` over an :class:`EchoApp`, on its own
    event loop in a thread."""

    def __init__(self, max_body_bytes: int = 1000, keepalive: float = 3.0, **guard: Any) -> None:
        self.app = EchoApp(max_body_bytes, **guard)
        asgi = _EchoAsgi(lambda: self.app)
        config = uvicorn.Config(asgi, host="127.0.0.1", port=0, http=IngestHttpProtocol, loop="asyncio", ws="none",
                                lifespan="on", timeout_keep_alive=keepalive, timeout_graceful_shutdown=10,
                                access_log=False, log_config=None)
        self.server = uvicorn.Server(config)
        self.loop = uvloop.new_event_loop()  # as in `ldp ingest`
        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(self.server.serve()), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def refusals(self) -> list[str]:
        return self.app.refusals

    @property
    def seen(self) -> list[Request]:
        return self.app.seen

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.app.release.set)

    def close(self) -> None:
        self.server.should_exit = True
        self.release()
        self.thread.join(15)


@pytest.fixture
def server() -> Iterator[ServerThread]:
    srv = ServerThread(max_header_bytes=2048, request_seconds=2.0, first_byte_seconds=2.0)
    yield srv
    srv.close()


def test_the_uvicorn_internals_the_guards_use_are_still_there() -> None:
    """stream_app/ingest/server.py subclasses uvicorn's httptools protocol: what it overrides and reads must exist
    (pyproject.toml pins uvicorn's range; this fails first when a new uvicorn renames them)."""
    import inspect

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    for name in ("connection_made", "connection_lost", "data_received", "on_message_begin", "on_url", "on_header",
                 "on_headers_complete", "on_message_complete", "_unset_keepalive_if_required"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    assert {"config", "server_state", "app_state"} <= set(inspect.signature(HttpToolsProtocol.__init__).parameters)
    init = inspect.getsource(HttpToolsProtocol.__init__) + inspect.getsource(HttpToolsProtocol.connection_made)
    for attr in ("self.parser", "self.app_state", "self.connections", "self.cycle", "self.logger", "self.loop",
                 "self.transport", "self.client"):
        assert attr in init, attr
    cycle = inspect.getsource(RequestResponseCycle.__init__)
    assert "self.response_started" in cycle and "self.response_complete" in cycle


def connect(srv: ServerThread) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    sock.settimeout(10)
    return sock


def read_answer(sock: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One answer from ``sock`` (``buf``: bytes read past the previous answer)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer; read {bytes(buf)!r}")
        buf += chunk
    end = buf.index(b"\r\n\r\n")
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    del buf[:end + 4]
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers["content-length"])
    while len(buf) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed within a body")
        buf += chunk
    body = bytes(buf[:length])
    del buf[:length]
    return status, headers, body


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def test_keep_alive_and_pipelined_requests_are_answered_in_order(server: ServerThread) -> None:
    sock, buf = connect(server), bytearray()
    sock.sendall(post("/a?x=1", b"one") + post("/b", b"two", "X-Twice: 1\r\nx-twice: 2\r\n") + post("/c", b""))
    answers = [read_answer(sock, buf) for _ in range(3)]
    assert [json.loads(b)["path"] for _, _, b in answers] == ["/a", "/b", "/c"]
    assert [json.loads(b)["body"] for _, _, b in answers] == ["one", "two", ""]
    assert json.loads(answers[1][2])["headers"]["x-twice"] == "1, 2"
    assert all(s == 200 and "connection" not in h and "date" in h for s, h, _ in answers)
    sock.sendall(post("/d", b"again"))  # the connection is still open
    assert json.loads(read_answer(sock, buf)[2])["body"] == "again"


def test_a_request_split_into_single_bytes_and_a_chunked_body(server: ServerThread) -> None:
    sock, buf = connect(server), bytearray()
    for byte in post("/split", b"abc"):
        sock.sendall(bytes([byte]))
    assert json.loads(read_answer(sock, buf)[2])["body"] == "abc"
    sock.sendall(b"POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n")
    assert json.loads(read_answer(sock, buf)[2])["body"] == "abcdefg"


def test_http_1_0_and_connection_close(server: ServerThread) -> None:
    sock, buf = connect(server), bytearray()
    sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
    status, headers, _ = read_answer(sock, buf)
    assert status == 200 and headers["connection"] == "close" and closed_by_server(sock)
    sock, buf = connect(server), bytearray()
    sock.sendall(post("/x", b"1", "Connection: close\r\n"))
    assert read_answer(sock, buf)[1]["connection"] == "close" and closed_by_server(sock)


def test_expect_100_continue(server: ServerThread) -> None:
    sock, buf = connect(server), bytearray()
    sock.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    interim = sock.recv(100)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(b"hello")
    assert json.loads(read_answer(sock, buf)[2])["body"] == "hello"
    # a body announced over the limit: no 100, the handler sees too_large at once, then the connection closes
    sock.sendall(b"POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n")
    status, headers, body = read_answer(sock, buf)
    assert json.loads(body)["too_large"] is True and headers["connection"] == "close" and closed_by_server(sock)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_over_the_limit_is_not_read_and_closes_the_connection(server: ServerThread, chunked: bool) -> None:
    sock, buf = connect(server), bytearray()
    big = b"x" * 5000
    if chunked:
        sock.sendall(b"POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"".join(b"%x\r\n%s\r\n" % (100, big[i:i + 100]) for i in range(0, 5000, 100)) + b"0\r\n\r\n")
    else:
        sock.sendall(post("/big", big))
    status, headers, body = read_answer(sock, buf)
    doc = json.loads(body)
    assert doc["too_large"] is True and doc["body"] == "" and headers["connection"] == "close"
    assert closed_by_server(sock)
    assert len(server.seen) == 1  # the rest of the body was never parsed into a request


def test_headers_over_the_limit_are_refused_with_431(server: ServerThread) -> None:
    many = [b"GET / HTTP/1.1\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 50) for i in range(60)) + b"\r\n"]
    endless = [b"GET / HTTP/1.1\r\nX-Long: "] + [b"v" * 1000] * 20  # one field that never ends, in several reads
    for pieces in (many, endless):
        sock, buf = connect(server), bytearray()
        for piece in pieces:
            try:
                sock.sendall(piece)
            except OSError:
                break  # refused and closed already
            time.sleep(0.05)
        status, headers, body = read_answer(sock, buf)
        assert status == 431 and json.loads(body)["error"] == "headers_too_large" and closed_by_server(sock)
    assert server.refusals == ["headers_too_large"] * 2 and not server.seen


@pytest.mark.parametrize("raw", [
    b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"GET / HTTP/1.1\r\nBad Header: 1\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS client hello on the plain port
    b"GET / HTTP/9.9\r\n\r\n",
], ids=["cl-and-te", "two-lengths", "bad-chunk", "space-in-name", "tls", "version"])
def test_malformed_and_smuggling_requests_are_refused_with_400(server: ServerThread, raw: bytes) -> None:
    sock, buf = connect(server), bytearray()
    sock.sendall(raw)
    status, headers, body = read_answer(sock, buf)
    assert status == 400 and json.loads(body)["error"] == "bad_request" and headers["connection"] == "close"
    assert closed_by_server(sock)
    assert server.refusals == ["bad_request"] and not server.seen


def test_a_connection_that_sends_nothing_is_closed_after_the_first_byte_timeout(server: ServerThread) -> None:
    silent, talking = connect(server), connect(server)
    t0 = time.monotonic()
    time.sleep(1.0)
    talking.sendall(b"P")  # its first byte in time: from now on the request timeout (2 s) applies
    assert closed_by_server(silent)
    assert 1.5 <= time.monotonic() - t0 <= 4.0  # first_byte_seconds = 2
    talking.sendall(b"OST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    assert read_answer(talking, bytearray())[0] == 200
    assert server.refusals == ["first_byte_timeout"]


def test_slow_requests_get_408_and_idle_connections_are_closed(server: ServerThread) -> None:
    slow, buf = connect(server), bytearray()
    slow.sendall(b"POST /slow-client HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    idle = connect(server)
    idle.sendall(post("/x", b"1"))
    read_answer(idle, bytearray())
    t0 = time.monotonic()
    status, _, body = read_answer(slow, buf)
    assert status == 408 and json.loads(body)["error"] == "request_timeout" and closed_by_server(slow)
    assert 1.5 <= time.monotonic() - t0 <= 4.5  # request_seconds = 2
    assert closed_by_server(idle)  # keepalive_seconds = 3
    assert 2.5 <= time.monotonic() - t0 <= 6.0
    assert server.refusals == ["request_timeout"]


@pytest.mark.parametrize("limit", ["max_connections", "max_connections_per_ip"])
def test_connections_past_the_limit_are_closed_at_once(limit: str) -> None:
    srv = ServerThread(**{limit: 3})
    try:
        held = [connect(srv) for _ in range(3)]
        for sock in held:
            sock.sendall(post("/x", b"1"))
            read_answer(sock, bytearray())
        extra = connect(srv)
        assert closed_by_server(extra)
        assert srv.refusals == ["too_many_connections" + ("_per_ip" if limit.endswith("ip") else "")]
        held.pop().close()
        time.sleep(0.2)
        again, buf = connect(srv), bytearray()
        again.sendall(post("/x", b"after"))
        assert json.loads(read_answer(again, buf)[2])["body"] == "after"
    finally:
        srv.close()


def test_a_failing_handler_answers_500_and_keeps_the_connection(server: ServerThread) -> None:
    sock, buf = connect(server), bytearray()
    sock.sendall(post("/fail", b"") + post("/after", b"ok"))
    assert read_answer(sock, buf)[0] == 500
    assert json.loads(read_answer(sock, buf)[2])["body"] == "ok"


def test_pipelining_past_the_queue_limit_pauses_reading_and_loses_nothing(server: ServerThread) -> None:
    sock, buf = connect(server), bytearray()
    sock.sendall(b"".join(post(f"/slow-{i}" if i else "/slow", str(i).encode()) for i in range(40)))
    time.sleep(0.3)
    assert len(server.seen) == 1  # the first waits; the others are unread (reading paused)
    server.release()
    bodies = [json.loads(read_answer(sock, buf)[2])["body"] for _ in range(40)]
    assert bodies == [str(i) for i in range(40)]


def test_a_client_gone_mid_request_drops_its_pipelined_requests_not_begun(server: ServerThread) -> None:
    sock = connect(server)
    sock.sendall(post("/slow", b"begun") + post("/queued", b"not begun"))
    time.sleep(0.3)
    sock.close()
    time.sleep(0.3)
    server.release()
    time.sleep(0.3)
    assert [r.path for r in server.seen] == ["/slow"]  # the one begun ran to its end, the other never began


def test_stop_answers_requests_in_flight_with_connection_close(server: ServerThread) -> None:
    busy, idle = connect(server), connect(server)
    idle.sendall(post("/x", b"1"))
    read_answer(idle, bytearray())
    busy.sendall(post("/slow", b"in flight"))
    time.sleep(0.2)
    server.server.should_exit = True  # what SIGTERM does
    time.sleep(0.5)
    assert closed_by_server(idle)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    server.release()
    status, headers, body = read_answer(busy, bytearray())
    assert status == 200 and headers["connection"] == "close" and json.loads(body)["body"] == "in flight"
    server.thread.join(10)
    assert not server.thread.is_alive()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"POST / HTTP/1.1\r\n", b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n", b"\r\n",
                     b"0\r\n\r\n", b"5\r\nhello\r\n", b"Expect: 100-continue\r\n", b"GET /x HTTP/1.0\r\n",
                     b"Connection: close\r\n", b"Upgrade: h2c\r\n", b"Content-Length: 99999\r\n"])), max_size=12))
def test_fuzz_any_bytes_get_answers_or_a_close_never_a_crash(server: ServerThread, data: list[bytes]) -> None:
    """Whatever arrives, the server stays up and a well-formed request on a new connection is answered."""
    sock = connect(server)
    sock.settimeout(2)
    try:
        for piece in data:
            sock.sendall(piece)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    except OSError:
        pass
    finally:
        sock.close()
    check, buf = connect(server), bytearray()
    check.sendall(post("/alive", b"yes"))
    assert json.loads(read_answer(check, buf)[2])["body"] == "yes"
    check.close()


# ---------------------------------------------------------------------------- uvicorn's supervisor
_SUPERVISED_APP = """
import os
from types import SimpleNamespace
from stream_app.ingest.service import Response

class App:
    settings = SimpleNamespace(max_body_bytes=1000, loglevel="warning", processes=3, request_timeout=30.0,
                               first_byte_timeout=5.0, max_connections=100, max_connections_per_ip=100)
    async def start(self):
        if os.environ.get("SUPERVISED_MODE") == "fail":
            raise RuntimeError("cannot reach the broker")
    async def stop(self):
        pass
    def http_refused(self, reason):
        pass
    async def route(self, request):
        return Response(200, (), str(os.getpid()).encode())

def create():
    from stream_app.ingest.asgi import IngestAsgi
    return IngestAsgi(App)
"""
_SUPERVISED = """
import sys, uvicorn
from stream_app.ingest.server import PROTOCOL
from stream_app.ingest.service import run_server
if __name__ == "__main__":  # uvicorn's worker processes are spawned: they import this module again
    config = uvicorn.Config("supervised_app:create", factory=True, host="127.0.0.1", port=int(sys.argv[1]),
                            http=PROTOCOL, loop="uvloop", ws="none", lifespan="on", workers=3, access_log=False,
                            log_config=None)
    sys.exit(run_server(config))
"""


def _pid_of_answer(port: int) -> int:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return int(read_answer(sock, bytearray())[2])
    finally:
        sock.close()


def _start_supervised(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, int]:
    from stream_app.settings import free_port

    script = tmp_path / "supervised.py"
    script.write_text(_SUPERVISED)
    (tmp_path / "supervised_app.py").write_text(_SUPERVISED_APP)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(ROOT))), "SUPERVISED_MODE": mode}
    proc = subprocess.Popen([sys.executable, str(script), str(port)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    return proc, port


def _answering_pids(proc: subprocess.Popen, port: int, n: int) -> set[int]:
    """The pids of the ``n`` processes behind ``port``, once each answered a request (within 30 s)."""
    deadline = time.monotonic() + 30
    pids: set[int] = set()
    while len(pids) < n:
        assert time.monotonic() < deadline and proc.poll() is None, f"pids answering: {pids}"
        try:
            pids.add(_pid_of_answer(port))
        except OSError:
            time.sleep(0.1)
    return pids


def test_workers_share_the_port_a_crashed_one_is_replaced_and_sigterm_stops_all(tmp_path: Path) -> None:
    proc, port = _start_supervised(tmp_path, "ok")
    try:
        pids = _answering_pids(proc, port, 3)
        victim = min(pids)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        now: set[int] = set()
        while len(now - pids) < 1 or victim in now:
            assert time.monotonic() < deadline and proc.poll() is None, f"pids answering: {now}"
            try:
                pid = _pid_of_answer(port)
                now.add(pid)
                now.discard(victim)
            except OSError:
                time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
        assert proc.returncode == 0, out
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_worker_that_fails_to_start_stops_the_service(tmp_path: Path) -> None:
    proc, port = _start_supervised(tmp_path, "fail")
    out = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 1, out
    assert "cannot reach the broker" in out


def test_workers_stop_when_the_supervisor_is_killed(tmp_path: Path) -> None:
    proc, port = _start_supervised(tmp_path, "ok")
    pids: set[int] = set()
    try:
        pids = _answering_pids(proc, port, 3)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, [pid for pid in pids if _alive(pid)]
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped by init) counts as gone
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
