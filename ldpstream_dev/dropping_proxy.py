"""A TCP proxy that loses the ingest's first answer: the tests of ``send()``'s retries (every device client).

:class:`DroppingProxy` forwards the first HTTP request to the ingest and closes the connection before the answer (the
ingest processed it; the device never hears back), then relays everything; it records each request's bytes, so a test
can check that a retry carries the same body and the same ``Idempotency-Key``.
"""
from __future__ import annotations

import socket
import threading

__all__ = ["DroppingProxy", "request_body", "request_header"]


class DroppingProxy:
    """A proxy on a free local port in front of ``127.0.0.1:upstream_port`` that drops the first answer."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @staticmethod
    def _read_message(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with client:
                request = self._read_message(client)
                self.requests.append(request)
                with socket.create_connection(("127.0.0.1", self.upstream)) as up:
                    up.sendall(request)
                    answer = self._read_message(up)
                if len(self.requests) > 1:
                    client.sendall(answer)
                # the first: closed with no answer

    def close(self) -> None:
        self.sock.close()


def request_body(request: bytes) -> bytes:
    """The body of a recorded request."""
    return request.partition(b"\r\n\r\n")[2]


def request_header(request: bytes, name: bytes) -> bytes | None:
    """A header of a recorded request (``name`` lower-case), ``None`` if absent."""
    for line in request.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None
