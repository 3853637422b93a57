"""The ingest's HTTP/1.1 server: httptools' parser (llhttp, Node.js's) driven by an asyncio protocol on the
process's own event loop (uvloop), one thread per process.

Why not a framework (:mod:`.service` has the measurements): the ingest's cost at moderate load is wake-ups and
hand-offs, not parsing. A server whose network I/O runs on another thread (granian, whose Rust runtime hands
each request to the Python event loop and each answer back) pays two cross-thread wake-ups and GIL hand-offs
per request; an ASGI server (uvicorn) pays a scope, ``receive`` and ``send`` coroutines per request. Here a
readable socket is parsed in the callback that read it, and a request becomes one task (or joins its
connection's running one).

What a request gets (:class:`Request`): method, path (query string dropped), headers with lower-case names
(repeated fields joined by ``", "``), the whole body, and ``too_large`` when the body exceeded
``max_body_bytes``. The server, not the handler, enforces the transport's limits (:class:`HttpLimits`):

- malformed HTTP (llhttp's strict parsing: ``Content-Length`` with ``Transfer-Encoding``, bad chunk sizes,
  invalid characters; the smuggling vectors) → 400 ``bad_request``, connection closed;
- request line and headers over ``max_header_bytes`` → 431 ``headers_too_large``, connection closed (counted
  exactly for complete fields; a field still arriving is caught at the first read that takes it past the
  limit, so what one connection makes the parser hold stays under the limit plus one read);
- a body over ``max_body_bytes`` (announced by ``Content-Length``, or while a chunked body arrives) → the
  handler gets the request at once with ``too_large`` set and no body (it answers 413), the rest of the body
  is not read and the connection is closed after the answer;
- a request not complete ``request_seconds`` after its first byte (slow clients) → 408 ``request_timeout``;
  a keep-alive connection idle for ``keepalive_seconds`` is closed;
- pipelined requests are answered in order, at most ``max_pipelined`` queued before reading pauses; reading
  also pauses while the client does not read its answers (transport flow control);
- ``Expect: 100-continue`` gets its interim answer when the body is acceptable;
- past ``max_connections`` open connections a new one is closed at once (``too_many_connections``), before
  the process runs out of file descriptors;
- an upgrade (``Upgrade:``, ``CONNECT``) is not supported: the request is answered as a plain one, then the
  connection is closed.

Each refusal of the server calls ``on_refusal(reason)`` (the ingest counts them in
``ldp_ingest_refused_total{reason}``). A handler's exception is logged and answered 500. A request whose client
went away still runs to its end (its reports may be on their way to the broker); its answer is dropped, and
the requests it had pipelined behind it are not begun (a client retries them, with their ``Idempotency-Key``).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass
from email.utils import formatdate
from http import HTTPStatus
from typing import Awaitable, Callable, NamedTuple, Sequence

import httptools

__all__ = ["HttpLimits", "HttpServer", "Request", "Response"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpLimits:
    """Limits of one connection's requests (module doc)."""

    max_body_bytes: int = 1 << 20
    max_header_bytes: int = 16 << 10
    request_seconds: float = 30.0
    keepalive_seconds: float = 75.0
    max_pipelined: int = 16
    max_connections: int = 10_000

    def __post_init__(self) -> None:
        if self.max_body_bytes < 0 or self.max_header_bytes < 256 or self.max_pipelined < 1 or self.max_connections < 1:
            raise ValueError(f"bad HTTP limits: {self}")
        if not (self.request_seconds > 0 and self.keepalive_seconds > 0):
            raise ValueError(f"bad HTTP timeouts: {self}")


class Request(NamedTuple):
    """One request, read whole (module doc)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    too_large: bool = False


class Response(NamedTuple):
    """An answer: status, headers (the server adds ``date``, ``content-length`` and ``connection``), body."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


Handler = Callable[[Request], Awaitable[Response]]
_JSON = ("content-type", "application/json")
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode("ascii") for s in HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_INTERNAL = Response(500, (_JSON,), b'{"error":"internal_error"}')
_NO_REQUEST = Request("", "", {}, b"")


class _Stop(Exception):
    """Raised from a parser callback: read nothing more from this connection."""


def _head(status: int, headers: Sequence[tuple[str, str]], length: int, date: bytes, close: bool,
          keep_alive_1_0: bool) -> bytes:
    line = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Status\r\n".encode("ascii")
    parts = [line, b"date: ", date, b"\r\ncontent-length: ", str(length).encode("ascii"), b"\r\n"]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"an answer's header cannot hold a line break: {name!r}")
        parts += (name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n")
    if close:
        parts.append(b"connection: close\r\n")
    elif keep_alive_1_0:
        parts.append(b"connection: keep-alive\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One client connection: parses what arrives, queues complete requests, answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        #: (request, keep alive, HTTP/1.0, the server's own answer or None: the handler's)
        self.queue: deque[tuple[Request, bool, bool, Response | None]] = deque()
        self.task: asyncio.Task | None = None
        self.reading = True  # False once no more requests are read from this connection
        self.paused_queue = self.paused_writes = False
        self.last = server.now  # last activity, for the keep-alive timeout
        self.in_message = False  # between a request's first byte and its dispatch
        self._reset()

    def _reset(self) -> None:
        """The state of the request being read, empty."""
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = self.head = self.partial = 0
        self.headers_done = self.too_large = False
        self.begun = self.server.now

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if len(self.server.connections) >= self.limits.max_connections:
            self.server.on_refusal("too_many_connections")
            self.reading = False
            transport.close()
            return
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.reading = False

    def pause_writing(self) -> None:
        self.paused_writes = True
        self._update_reading()

    def resume_writing(self) -> None:
        self.paused_writes = False
        self._update_reading()

    def _update_reading(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if self.paused_queue or self.paused_writes:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if not self.reading:
            return
        self.last = self.server.now
        if self.in_message and not self.headers_done:
            self.partial += len(data)  # header bytes the parser may be holding (one field growing without end)
        try:
            self.parser.feed_data(data)
        except _Stop:
            self.reading = False
        except httptools.HttpParserCallbackError as exc:
            self.reading = False
            if not isinstance(exc.__context__, _Stop):  # a bug of this module: logged, the connection dropped
                log.error("reading a request failed", exc_info=exc.__context__ or exc)
                if self.transport is not None:
                    self.transport.close()
        except httptools.HttpParserUpgrade:
            self.reading = False  # answer what was complete, then close (module doc)
            self._close_after_queue()
        except httptools.HttpParserError as exc:
            self._refuse(400, "bad_request", f"malformed HTTP request: {exc}")
            return
        if self.reading and self.in_message and not self.headers_done and self.partial > self.limits.max_header_bytes:
            self._refuse(431, "headers_too_large", f"the request line and headers exceed "
                                                   f"{self.limits.max_header_bytes} bytes")

    # ------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        self._reset()
        self.in_message = True

    def on_url(self, url: bytes) -> None:
        self.url += url
        self.head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head += len(name) + len(value) + 4
        if self.head > self.limits.max_header_bytes:
            self._refuse(431, "headers_too_large", f"the request line and headers exceed "
                                                   f"{self.limits.max_header_bytes} bytes")
            raise _Stop
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self.headers_done = True
        length = self.headers.get("content-length")
        if length is not None and length.isdecimal() and int(length) > self.limits.max_body_bytes:
            self.too_large = True
            self._dispatch(keep_alive=False)
            raise _Stop
        if (self.headers.get("expect", "").lower() == "100-continue" and self.task is None
                and self.parser.get_http_version() == "1.1" and self.transport is not None):
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > self.limits.max_body_bytes:
            self.too_large = True
            self.body = []
            self._dispatch(keep_alive=False)
            raise _Stop
        self.body.append(body)

    def on_message_complete(self) -> None:
        self._dispatch(keep_alive=self.parser.should_keep_alive())

    # ------------------------------------------------------------------ requests and answers
    def _dispatch(self, keep_alive: bool) -> None:
        self.in_message = False
        url = self.url
        cut = url.find(b"?")
        path = (url if cut < 0 else url[:cut]).decode("latin-1")
        body = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        request = Request(self.parser.get_method().decode("ascii"), path, self.headers, body, self.too_large)
        version_1_0 = self.parser.get_http_version() == "1.0"
        self.queue.append((request, keep_alive, version_1_0, None))
        if not keep_alive:
            self.reading = False
        if self.task is None:
            self.task = self.server.loop.create_task(self._answer_queue())
        elif len(self.queue) >= self.limits.max_pipelined and not self.paused_queue:
            self.paused_queue = True
            self._update_reading()

    async def _answer_queue(self) -> None:
        server = self.server
        queue = self.queue
        try:
            while queue:
                if self.transport is None or self.transport.is_closing():
                    queue.clear()  # the client is gone: its pipelined requests not yet begun are dropped
                    break
                request, keep_alive, version_1_0, response = queue.popleft()
                if response is None:
                    server.in_flight += 1
                    try:
                        response = await server.handler(request)
                    except Exception:  # noqa: BLE001 - one request's failure: logged, answered 500
                        log.exception("the handler failed on %s %s", request.method, request.path)
                        response = _INTERNAL
                    finally:
                        server.in_flight -= 1
                close = not keep_alive or server.stopping
                transport = self.transport
                if transport is None or transport.is_closing():
                    break
                try:
                    head = _head(response.status, response.headers, len(response.body), server.date, close,
                                 version_1_0 and keep_alive)
                except ValueError:
                    log.exception("an answer to %s %s could not be written", request.method, request.path)
                    response, close = _INTERNAL, True
                    head = _head(500, _INTERNAL.headers, len(_INTERNAL.body), server.date, True, False)
                transport.write(head if request.method == "HEAD" else head + response.body)
                if close:
                    queue.clear()
                    self.reading = False
                    transport.close()
                    break
                if self.paused_queue and len(queue) < self.limits.max_pipelined:
                    self.paused_queue = False
                    self._update_reading()
        finally:
            self.task = None
            self.last = server.now
            if not self.reading and self.transport is not None and not self.in_message:
                self.transport.close()  # the last request answered (upgrade, or a too-large body)
            server.answered()

    def _close_after_queue(self) -> None:
        self.in_message = False
        if self.task is None and self.transport is not None:
            self.transport.close()

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """A refusal by the server itself: answered after the requests queued before it; connection closed."""
        self.reading = False
        self.in_message = False
        self.server.on_refusal(reason)
        log.debug("refused a request from %s: %s", self._peer(), detail)
        body = json.dumps({"error": reason, "detail": detail}, separators=(",", ":")).encode()
        self.queue.append((_NO_REQUEST, False, False, Response(status, (_JSON,), body)))
        if self.task is None:
            self.task = self.server.loop.create_task(self._answer_queue())

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"

    def idle(self) -> bool:
        return self.task is None and not self.queue


class HttpServer:
    """The connections of one process: ``await start(host, port)``, ``await stop(timeout)``."""

    def __init__(self, handler: Handler, limits: HttpLimits = HttpLimits(), *,
                 on_refusal: Callable[[str], None] = lambda reason: None) -> None:
        self.handler = handler
        self.limits = limits
        self.on_refusal = on_refusal
        self.connections: set[_Connection] = set()
        self.in_flight = 0
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.now = 0.0
        self.date = b""
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._drained: asyncio.Event | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = True, backlog: int = 1024) -> None:
        """Listen on ``host:port`` (``SO_REUSEPORT``: several processes share the port)."""
        self.loop = asyncio.get_running_loop()
        self._tick()
        self._server = await self.loop.create_server(lambda: _Connection(self), host, port, reuse_port=reuse_port,
                                                     backlog=backlog)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, timeout: float) -> bool:
        """Stop accepting, close idle connections, wait up to ``timeout`` s for the requests in flight (each
        answered with ``connection: close``), then close every connection; ``True`` if none was cut off."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.idle() and conn.transport is not None:
                conn.transport.close()
        self._drained = asyncio.Event()
        if self._busy():
            try:
                await asyncio.wait_for(self._drained.wait(), timeout)
            except asyncio.TimeoutError:
                pass
        drained = not self._busy()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        return drained

    def _busy(self) -> bool:
        """A handler still runs (its client there or gone), or a connection has requests to answer."""
        return self.in_flight > 0 or any(not c.idle() for c in self.connections)

    def answered(self) -> None:
        if self._drained is not None and not self._busy():
            self._drained.set()

    def _tick(self) -> None:
        """Once a second: the clock of the timeouts, the ``date`` header, the timeouts themselves."""
        self.now = self.loop.time()
        self.date = formatdate(usegmt=True).encode("ascii")
        limits = self.limits
        for conn in list(self.connections):
            if not conn.idle() or conn.transport is None:
                continue
            if conn.in_message and conn.reading:
                if self.now - conn.begun > limits.request_seconds:
                    conn._refuse(408, "request_timeout", f"the request was not complete within "
                                                         f"{limits.request_seconds:g} s")
            elif self.now - conn.last > limits.keepalive_seconds:
                conn.transport.close()
        self._sweeper = self.loop.call_later(1.0, self._tick)
