"""The private internals of Faust and aiokafka the worker uses (docs/architecture.md, "Private internals of Faust and
aiokafka") still exist on the installed versions, with the signatures the worker calls them with.

No services: the classes are inspected, and an aiokafka consumer and producer are built (not started). A library
upgrade that renames or changes one of them fails here, not in a worker during an outage.
"""
from __future__ import annotations

import asyncio
import inspect
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def _assigns(fn: object, attribute: str) -> bool:
    """``fn``'s source assigns ``self.<attribute>``."""
    return f"self.{attribute} = " in inspect.getsource(fn)  # type: ignore[arg-type]


def test_the_pinned_ranges_hold_the_installed_versions():
    """The internals below were checked on these ranges: pyproject.toml pins them, and the installed versions lie
    inside (an upgrade past a range must come with this test run again)."""
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {d.split(">")[0].split("<")[0].split("=")[0].strip(): d for d in deps}
    for dist in ("faust-streaming", "aiokafka"):
        spec = SpecifierSet(pins[dist][len(dist):].strip())
        assert spec.contains(Version(version(dist))), (dist, version(dist), str(spec))
        assert any(s.operator == "<" for s in spec), f"{dist} has no upper bound in pyproject.toml"
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert "## Private internals of Faust and aiokafka (and uvicorn)" in doc


def test_faust_consumer_internals():
    from faust.transport.consumer import Consumer, ThreadDelegateConsumer
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    # consumer.py limit_fetch_wait: the factory wrapped between creation and start
    assert _params(AIOKafkaConsumerThread._create_worker_consumer) == ["self", "transport"]
    # consumer.py FaustConsumer.move_to / worker.py _bound_shutdown_waits: commit chosen offsets
    assert inspect.iscoroutinefunction(ThreadDelegateConsumer._commit)
    assert _params(ThreadDelegateConsumer._commit) == ["self", "offsets"]
    # consumer.py move_to / reseek: the last delivered offset per partition, None = deliver any
    assert _assigns(Consumer.__init__, "_read_offset")
    assert "get_read_offset(tp)" in inspect.getsource(Consumer._drain_messages)
    # consumer.py request_rejoin: the consumer thread, its aiokafka consumer, a call on its loop
    assert _assigns(ThreadDelegateConsumer.__init__, "_thread")
    assert _params(AIOKafkaConsumerThread._ensure_consumer) == ["self"]
    assert inspect.iscoroutinefunction(AIOKafkaConsumerThread.call_thread)
    # worker.py: the thread's stop, which closes self._consumer
    assert inspect.iscoroutinefunction(AIOKafkaConsumerThread.on_thread_stop)
    assert _assigns(AIOKafkaConsumerThread.on_start, "_consumer")
    # the public calls used next to them
    for name in ("seek_wait", "earliest_offsets"):
        assert inspect.iscoroutinefunction(getattr(ThreadDelegateConsumer, name)), name
    for name in ("assignment", "highwater"):
        assert callable(getattr(ThreadDelegateConsumer, name)), name


def test_faust_producer_internals():
    from faust.transport.drivers.aiokafka import Producer

    assert inspect.iscoroutinefunction(Producer.flush) and _params(Producer.flush) == ["self"]
    assert inspect.iscoroutinefunction(Producer.on_stop) and _params(Producer.on_stop) == ["self"]
    assert "self._producer" in inspect.getsource(Producer.on_stop)


def test_aiokafka_consumer_internals():
    from aiokafka import AIOKafkaConsumer
    from aiokafka.client import AIOKafkaClient
    from aiokafka.consumer.group_coordinator import GroupCoordinator

    async def build() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(bootstrap_servers="127.0.0.1:9", fetch_max_wait_ms=123)

    consumer = asyncio.run(build())
    assert consumer._fetch_max_wait_ms == 123  # consumer.py limit_fetch_wait: read at start
    assert "self._fetch_max_wait_ms" in inspect.getsource(AIOKafkaConsumer.start)
    assert isinstance(consumer._client, AIOKafkaClient)  # broker.py: a fresh metadata request
    assert inspect.iscoroutinefunction(AIOKafkaClient.fetch_all_metadata)
    assert _params(AIOKafkaClient.fetch_all_metadata) == ["self"]
    assert _assigns(AIOKafkaConsumer.start, "_coordinator")  # consumer.py request_rejoin
    assert _params(GroupCoordinator.request_rejoin) == ["self"]


def test_aiokafka_producer_internals():
    from aiokafka import AIOKafkaProducer

    async def build() -> AIOKafkaProducer:
        return AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")

    producer = asyncio.run(build())
    assert producer._closed is False  # ingest/service.py health
    assert inspect.iscoroutinefunction(producer._sender.close)  # worker.py _bounded_producer_stop
    assert inspect.iscoroutinefunction(producer.client.close)


def test_aiokafka_low_level_classes_of_the_estimate_publisher():
    """stream_app/publisher.py builds one record batch and one produce request itself and sends it with the
    client's ``send`` (no resend); the request and response shapes it relies on."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.partitioner import DefaultPartitioner
    from aiokafka.protocol.produce import ProduceRequest
    from aiokafka.record.default_records import DefaultRecordBatchBuilder, DefaultRecordBatch

    assert _params(ProduceRequest.__init__)[1:] == ["transactional_id", "required_acks", "timeout", "topics"]
    assert {"bootstrap", "add_topic", "force_metadata_update", "send", "close"} <= set(dir(AIOKafkaClient))
    builder = DefaultRecordBatchBuilder(2, 0, is_transactional=0, producer_id=-1, producer_epoch=-1,
                                        base_sequence=-1, batch_size=1024)
    assert builder.append(0, timestamp=1, key=b"k", value=b"{}", headers=[]) is not None
    batch = DefaultRecordBatch(bytes(builder.build()))
    assert [(r.key, r.value) for r in batch] == [(b"k", b"{}")]
    # the Kafka default partitioner (murmur2): the partition of every Kafka client for a key
    assert DefaultPartitioner()(b"c:a:0", [0, 1, 2, 3], [0, 1, 2, 3]) == 2


@pytest.mark.parametrize("module", ["stream_app/consumer.py", "stream_app/worker.py", "stream_app/broker.py",
                                    "stream_app/publisher.py"])
def test_the_document_names_every_module_that_uses_them(module):
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("## Private internals of Faust and aiokafka (and uvicorn)", 1)[1]
    assert f"`{module}`" in section or f"`{module.split('/', 1)[1]}`" in section
