"""Readiness probes of the local stack's services.

Redis is ready when it answers ``PING``; the object server (durable broker storage) when a
``HEAD`` of its bucket answers 200; the broker when it answers a metadata request *and* a
produce (acks=all) + fetch round trip on a scratch topic succeeds (tansu accepts TCP before it
serves). aiokafka is imported lazily, by the Kafka probes only.
"""
from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
import time
import uuid
from typing import Any, Coroutine

from .errors import StackError
from .processes import HOST

__all__ = ["http_head_ok", "kafka_metadata", "kafka_round_trip", "redis_ping", "run_coro", "tcp_accepts"]


def tcp_accepts(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    """True if ``host:port`` accepts a TCP connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _resp(*args: str) -> bytes:
    """One RESP command."""
    out = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def redis_ping(port: int, host: str = HOST, timeout: float = 1.0, *, password: str | None = None,
               username: str | None = None, ssl_context: ssl.SSLContext | None = None) -> bool:
    """True if a RESP ``PING`` on ``host:port`` is answered with ``+PONG`` (after ``AUTH [username] password`` if a
    password is given; over TLS with ``ssl_context``)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            s = ssl_context.wrap_socket(raw, server_hostname=host) if ssl_context is not None else raw
            s.settimeout(timeout)

            def line() -> bytes:
                buf = b""
                while not buf.endswith(b"\r\n"):
                    chunk = s.recv(1)
                    if not chunk:
                        break
                    buf += chunk
                return buf

            if password is not None:
                s.sendall(_resp("AUTH", *((username,) if username else ()), password))
                if not line().startswith(b"+OK"):
                    return False
            s.sendall(_resp("PING"))
            return line().startswith(b"+PONG")
    except OSError:
        return False


def http_head_ok(port: int, path: str, host: str = HOST, timeout: float = 1.0) -> bool:
    """True if ``HEAD http://host:port/path`` answers 200."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("HEAD", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def run_coro(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to completion, also when called from inside a running event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coro)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=target, name="ldp-stack-probe", daemon=True)
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


async def kafka_metadata(bootstrap: str, timeout: float, client_options: dict[str, Any] | None = None) -> bool:
    """True once ``bootstrap`` answered a metadata request (raises on failure).

    ``client_options``: SASL / TLS keyword arguments of the clients (default: ``LDP_KAFKA_*``, :mod:`wire.transport`)."""
    from aiokafka import AIOKafkaConsumer

    ms = max(1000, int(timeout * 1000))
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, request_timeout_ms=ms, enable_auto_commit=False, **_security(client_options)
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout)
        await asyncio.wait_for(consumer.topics(), timeout)  # forces a fresh MetadataRequest
        return True
    finally:
        await consumer.stop()


def _security(client_options: dict[str, Any] | None) -> dict[str, Any]:
    from wire.transport import kafka_client_options

    return kafka_client_options() if client_options is None else client_options


async def kafka_round_trip(bootstrap: str, timeout: float, client_options: dict[str, Any] | None = None) -> None:
    """Create a 1-partition scratch topic, produce one record (acks=all), fetch it back (``client_options``: as
    :func:`kafka_metadata`)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    topic = f"__ldp_stack_ready_{uuid.uuid4().hex[:12]}"
    payload = uuid.uuid4().bytes
    ms = max(1000, int(timeout * 1000))
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    security = _security(client_options)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=ms, **security)
    await asyncio.wait_for(admin.start(), left())
    try:
        try:
            resp = await asyncio.wait_for(
                admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)]),
                left(),
            )
            for entry in getattr(resp, "topic_errors", []):
                code = entry[1]
                if code not in (0, 36):  # 36 = TOPIC_ALREADY_EXISTS
                    raise StackError(f"CreateTopics of the readiness topic failed: {entry}")
        except TopicAlreadyExistsError:
            pass

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", request_timeout_ms=ms, **security)
        await asyncio.wait_for(producer.start(), left())
        try:
            md = await asyncio.wait_for(producer.send_and_wait(topic, payload, partition=0), left())
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, request_timeout_ms=ms, **security
        )
        await asyncio.wait_for(consumer.start(), left())
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, md.offset)
            while True:
                batch = await asyncio.wait_for(
                    consumer.getmany(tp, timeout_ms=int(min(1.0, left()) * 1000)), left()
                )
                if any(rec.value == payload for rec in batch.get(tp, [])):
                    break
                if time.monotonic() >= deadline:
                    raise StackError("the readiness record was produced but never fetched back")
        finally:
            await consumer.stop()
        try:  # keep the topic list clean for the pipeline; failure here is harmless
            await asyncio.wait_for(admin.delete_topics([topic]), min(5.0, left()))
        except Exception:  # noqa: BLE001
            pass
    finally:
        await admin.close()
