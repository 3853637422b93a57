"""The ingest's HTTP server: uvicorn (httptools' parser, uvloop, ``workers`` processes sharing the port) with
the connection guards uvicorn's httptools protocol lacks, as a subclass of it (:class:`IngestHttpProtocol`,
given to uvicorn as ``http=``).

uvicorn already gives: malformed HTTP (llhttp's strict parsing: ``Content-Length`` with ``Transfer-Encoding``,
bad chunk sizes, invalid characters; the smuggling vectors) → 400 and the connection closed; pipelined requests
answered in order (reading paused meanwhile); flow control; ``Expect: 100-continue``; keep-alive connections
idle ``timeout_keep_alive`` seconds closed; SIGTERM: stop accepting, answer the requests in flight
(``connection: close``), lifespan shutdown; a worker process that dies replaced. :class:`ConnectionGuard` adds,
per process:

- a connection that sent no byte ``first_byte_seconds`` after it opened is closed (``first_byte_timeout``);
- past ``max_connections`` open connections, or ``max_connections_per_ip`` from one client address, a new
  connection is closed at once (``too_many_connections``, ``too_many_connections_per_ip``);
- request line and headers over ``max_header_bytes`` → 431 ``headers_too_large``, connection closed (a field
  still arriving is caught at the first read that takes it past the limit);
- a request not complete ``request_seconds`` after its first byte (slow clients) → 408 ``request_timeout``,
  connection closed.

Each refusal calls ``on_refusal(reason)`` (the ingest counts them in ``ldp_ingest_refused_requests_total{reason}``;
malformed requests as ``bad_request``). The ASGI application puts its guard in the lifespan state under
:data:`GUARD_KEY` (uvicorn hands that state to every connection); without one the defaults hold.
The subclass uses these attributes of uvicorn's ``HttpToolsProtocol``: ``parser``, ``transport``, ``client``,
``connections``, ``cycle``, ``app_state``, ``loop``, ``logger``, ``_unset_keepalive_if_required`` (pinned by the
uvicorn range in ``pyproject.toml``; ``tests/test_ingest_http.py`` fails if they change).
"""
from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GUARD_KEY", "ConnectionGuard", "IngestHttpProtocol", "PROTOCOL"]

#: The lifespan-state key of the process's :class:`ConnectionGuard`.
GUARD_KEY = "ldp.connection_guard"
#: ``http=`` for uvicorn (an import string: worker processes are spawned, the configuration is pickled).
PROTOCOL = "stream_app.ingest.server:IngestHttpProtocol"


@dataclass
class ConnectionGuard:
    """The limits of one process's connections (module doc), and the open connections per client address."""

    max_header_bytes: int = 16 << 10
    request_seconds: float = 30.0
    first_byte_seconds: float = 10.0
    max_connections: int = 10_000
    max_connections_per_ip: int = 1_000
    on_refusal: Callable[[str], None] = lambda reason: None
    per_ip: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.max_header_bytes < 256 or self.max_connections < 1 or self.max_connections_per_ip < 1:
            raise ValueError(f"bad HTTP limits: {self}")
        if not (self.request_seconds > 0 and self.first_byte_seconds > 0):
            raise ValueError(f"bad HTTP timeouts: {self}")


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the request line and headers are over the limit."""


class IngestHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guards of :class:`ConnectionGuard` (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        guard = self.app_state.get(GUARD_KEY)
        self.guard: ConnectionGuard = guard if isinstance(guard, ConnectionGuard) else ConnectionGuard()
        self._ip: str | None = None
        self._timer: asyncio.TimerHandle | None = None  # the first-byte or the request timeout
        self._in_head = False  # between a request's first byte and the end of its headers
        self._in_message = False  # between a request's first byte and its end
        self._head = self._partial = 0

    # ------------------------------------------------------------------ transport events
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        if len(self.connections) > guard.max_connections:
            self._drop("too_many_connections")
            return
        ip = self.client[0] if self.client else None
        if ip is not None:
            if guard.per_ip[ip] >= guard.max_connections_per_ip:
                self._drop("too_many_connections_per_ip")
                return
            guard.per_ip[ip] += 1
            self._ip = ip
        self._timer = self.loop.call_later(guard.first_byte_seconds, self._drop, "first_byte_timeout")

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._ip is not None:
            per_ip = self.guard.per_ip
            per_ip[self._ip] -= 1
            if per_ip[self._ip] <= 0:
                del per_ip[self._ip]
            self._ip = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        if self._timer is not None and not self._in_message:
            self._cancel_timer()  # the first byte came
        if self._in_head:
            self._partial += len(data)  # header bytes the parser may be holding (one field growing without end)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _HeadTooLarge):
                self._refuse(431, "headers_too_large", f"the request line and headers exceed "
                                                       f"{self.guard.max_header_bytes} bytes")
            else:  # a bug of a callback: logged, the connection dropped
                self.logger.error("reading a request failed", exc_info=exc.__context__ or exc)
                self.transport.close()
            return
        except httptools.HttpParserUpgrade:
            pass  # answered as a plain request (no WebSocket here)
        except httptools.HttpParserError as exc:
            self._refuse(400, "bad_request", f"malformed HTTP request: {exc}")
            return
        if self._in_head and self._partial > self.guard.max_header_bytes:
            self._refuse(431, "headers_too_large", f"the request line and headers exceed "
                                                   f"{self.guard.max_header_bytes} bytes")

    # ------------------------------------------------------------------ parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = self._in_message = True
        self._head = self._partial = 0
        self._cancel_timer()
        self._timer = self.loop.call_later(self.guard.request_seconds, self._request_timeout)

    def on_url(self, url: bytes) -> None:
        self._head += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value) + 4
        if self._head > self.guard.max_header_bytes:
            raise _HeadTooLarge
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_message = False
        self._cancel_timer()
        super().on_message_complete()

    # ------------------------------------------------------------------ refusals
    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _request_timeout(self) -> None:
        self._timer = None
        if self._in_message:
            self._refuse(408, "request_timeout", f"the request was not complete within "
                                                 f"{self.guard.request_seconds:g} s")

    def _drop(self, reason: str) -> None:
        """Close the connection without an answer."""
        self._timer = None
        self.guard.on_refusal(reason)
        if not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int, reason: str, detail: str) -> None:
        """Answer ``status`` (unless an answer is under way) and close the connection."""
        self._in_head = self._in_message = False
        self._cancel_timer()
        self.guard.on_refusal(reason)
        self.logger.debug("refused a request from %s: %s", self.client, detail)
        transport = self.transport
        if transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = json.dumps({"error": reason, "detail": detail}, separators=(",", ":")).encode()
            phrase = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large"}[status]
            transport.write(f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: "
                            f"{len(body)}\r\nconnection: close\r\n\r\n".encode("ascii") + body)
        transport.close()
