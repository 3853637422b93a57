"""The ingest as an ASGI application for uvicorn (:func:`create_asgi`, a factory: one per worker process):
:meth:`~.service.IngestApp.route` behind the ASGI interface.

Lifespan startup starts the process's :class:`~.service.IngestApp` (producer, Redis), puts its
:class:`~.server.ConnectionGuard` in the lifespan state (the connections' limits, refusals counted by the
app), quiets the garbage collector (:func:`~.service.quiet_garbage_collector`) and, in a worker process of a
supervisor, watches that supervisor (killed with SIGKILL, nobody forwards SIGTERM: the worker stops within a
second). Shutdown stops the app. A request reaches the handler as a :class:`~.service.Request`: lower-case
header names, repeated fields joined by ``", "``, and a reader of the body, which the handler calls only after
the checks that need the headers alone (a token, the ``Content-Length`` its kind allows), so a request refused
there costs nothing of its body: uvicorn drops what still arrives. A body read past its limit (announced or while
it arrives), or one never read that is larger than ``max_body_bytes`` or of unknown length, is answered with
``Connection: close``: the rest of it is not read.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Awaitable, Callable

from .handler import BodyTooLarge
from .server import GUARD_KEY, ConnectionGuard
from .service import IngestApp, Request, Response, configure_logging, create_app, quiet_garbage_collector

__all__ = ["IngestAsgi", "create_asgi"]

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
_INTERNAL = Response(500, (("content-type", "application/json"),), b'{"error":"internal_error"}')


class _ClientGone(Exception):
    """The client disconnected while its body was read."""


class IngestAsgi:
    """ASGI 3 application over :meth:`IngestApp.route` (module doc)."""

    def __init__(self, factory: Callable[[], IngestApp] = create_app) -> None:
        self.factory = factory
        self.app: IngestApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.app = app = self.factory()
                    s = app.settings
                    configure_logging(s)
                    await app.start()
                    if "state" in scope:
                        scope["state"][GUARD_KEY] = self.guard(app)
                    if s.processes > 1:
                        _watch_supervisor()
                    quiet_garbage_collector()
                except Exception as exc:  # noqa: BLE001 - told to the server, which exits
                    log.exception("the ingest could not start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.app is not None:
                    await self.app.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def guard(self, app: IngestApp) -> ConnectionGuard:
        """The connection guard of this process (:mod:`.server`), from the app's settings."""
        s = app.settings
        return ConnectionGuard(request_seconds=s.request_timeout, first_byte_seconds=s.first_byte_timeout,
                               max_connections=s.max_connections, max_connections_per_ip=s.max_connections_per_ip,
                               on_refusal=app.http_refused)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.app
        assert app is not None, "lifespan startup has not run"
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            old = headers.get(name)
            headers[name] = value if old is None else f"{old}, {value}"
        limit = app.settings.max_body_bytes
        length = headers.get("content-length")
        announced = int(length) if length is not None and length.isdecimal() else None
        state = {"read": False, "cut": False}  # the body was read / its reading stopped past a limit

        async def read_body(most: int) -> bytes:
            most = min(most, limit)
            state["read"] = True
            if announced is not None and announced > most:
                state["cut"] = True
                raise BodyTooLarge()
            chunks: list[bytes] = []
            size, more = 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    raise _ClientGone()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > most:
                    state["cut"] = True
                    raise BodyTooLarge()
                chunks.append(chunk)
                more = message.get("more_body", False)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)

        request = Request(scope["method"], scope["path"], headers, read_body)
        try:
            response = await app.route(request)
        except _ClientGone:
            return  # nothing to answer
        except Exception:  # noqa: BLE001 - one request's failure: logged, answered 500
            log.exception("the handler failed on %s %s", request.method, request.path)
            response = _INTERNAL
        out = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
        out.append((b"content-length", str(len(response.body)).encode("ascii")))
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        unread = not state["read"] and ((announced is not None and announced > limit) or (announced is None and chunked))
        if state["cut"] or unread:
            out.append((b"connection", b"close"))  # the rest of the body is not read
        await send({"type": "http.response.start", "status": response.status, "headers": out})
        await send({"type": "http.response.body", "body": response.body})


def _watch_supervisor() -> None:
    """SIGTERM to this process once its parent (the supervisor) is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        log.error("the supervisor (pid %d) is gone: stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="watch-supervisor", daemon=True).start()


def create_asgi() -> IngestAsgi:
    """The ASGI application of one uvicorn worker process (settings and secret from the environment)."""
    return IngestAsgi()
