"""How a worker publishes estimates: one produce request per message, never resent by the Kafka client.

Why not the app's Faust/aiokafka producer
    aiokafka resends a produce request whose answer it did not get (a broker killed after it stored the
    message, a connection reset) until the request timeout, and without an idempotent producer the broker
    stores it twice. Idempotent producers would make that resend harmless, but the local broker (tansu) answers
    ``InitProducerId`` with an error, and aiokafka has no ``retries=0``. A final estimate has its own retry,
    which looks before it leaps (:mod:`stream_app.windows`: a claim left *pending* is first looked for on
    ``ldp.estimates`` and published again only if it is not there), so the client must not retry behind it:
    :class:`EstimatePublisher` sends each message once, with aiokafka's own connection, metadata, record-batch
    and protocol classes, and reports any failure to the caller.

The partition of a key is the Kafka default partitioner's (murmur2, as every Kafka client), so all revisions
of a step share one partition and stay in order. Every message carries the headers of the estimates contract
(:func:`wire.estimates.estimate_headers`: content type, schema version, campaign, attribute; ``docs/estimates.md``).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiokafka.errors as kafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.structs import TopicPartition

from wire.estimates import estimate_headers
from wire.transport import kafka_client_options

__all__ = ["EstimatePublisher", "PublishError"]

log = logging.getLogger(__name__)

#: magic byte of Kafka record batches since 0.11
_RECORD_BATCH_MAGIC = 2


class PublishError(Exception):
    """A message was not acknowledged by the broker (it may or may not be stored)."""


class EstimatePublisher:
    """Sends estimate documents (JSON, with their headers) to one topic, one acknowledged (``acks=all``) produce
    request each, no resend. ``partitions``: the partition count the topic should have (a warning when the broker's
    differs: ``estimates_partitions`` of the worker settings)."""

    def __init__(self, bootstrap: str, topic: str, *, request_timeout: float = 10.0,
                 partitions: int | None = None) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.request_timeout = request_timeout
        self.expected_partitions = partitions
        self._warned = False
        self._client: AIOKafkaClient | None = None
        self._partitions: list[int] = []
        self._partitioner = DefaultPartitioner()
        self._lock = asyncio.Lock()

    async def send(self, key: bytes | None, doc: dict[str, Any]) -> int:
        """Publish ``doc`` (JSON) under ``key``; returns its offset. Raises :class:`PublishError` (or a Kafka
        error) when the broker did not acknowledge it: the caller decides whether and how to publish again."""
        value = json.dumps(doc, separators=(",", ":")).encode()
        headers = estimate_headers(doc)
        async with self._lock:  # one request at a time: messages of a key stay in order
            try:
                return await self._send(key, value, headers)
            except Exception:
                await self.close()  # a fresh connection and fresh metadata next time
                raise

    async def start(self) -> None:
        """Connect and read the topic's metadata now, so that the first estimate (a new lease holder's) does not
        wait for them; on failure (broker away) the first :meth:`send` connects."""
        async with self._lock:
            await self._connect()

    async def _send(self, key: bytes | None, value: bytes, headers: list[tuple[str, bytes]]) -> int:
        client = await self._connect()
        partition = self._partitioner(key, self._partitions, self._partitions)
        leader = client.cluster.leader_for_partition(TopicPartition(self.topic, partition))
        if leader is None or leader < 0:
            raise PublishError(f"{self.topic} partition {partition} has no leader now")
        builder = DefaultRecordBatchBuilder(_RECORD_BATCH_MAGIC, 0, is_transactional=0, producer_id=-1,
                                            producer_epoch=-1, base_sequence=-1,
                                            batch_size=len(value) + len(key or b"") + 1024)
        if builder.append(0, timestamp=int(time.time() * 1000), key=key, value=value, headers=headers) is None:
            raise PublishError(f"a message of {len(value)} bytes does not fit a record batch")
        request = ProduceRequest(transactional_id=None, required_acks=-1,
                                 timeout=int(self.request_timeout * 1000),
                                 topics=[(self.topic, [(partition, bytes(builder.build()))])])
        response = await client.send(leader, request)
        for _, partitions in response.topics:
            for info in partitions:
                if info[0] != partition:
                    continue
                error = kafka_errors.for_code(info[1])
                if error is not kafka_errors.NoError:
                    raise PublishError(f"{self.topic} partition {partition}: the broker refused the message "
                                       f"({error.__name__})")
                return int(info[2])
        raise PublishError(f"the broker's answer names no partition {partition} of {self.topic}")

    async def _connect(self) -> AIOKafkaClient:
        if self._client is None:
            client = AIOKafkaClient(bootstrap_servers=self.bootstrap,
                                    request_timeout_ms=int(self.request_timeout * 1000), **kafka_client_options())
            try:
                await client.bootstrap()
                client.add_topic(self.topic)
                await client.force_metadata_update()
                partitions = sorted(client.cluster.partitions_for_topic(self.topic) or ())
                if not partitions:
                    raise PublishError(f"topic {self.topic} is unknown to the broker")
            except Exception:
                await client.close()
                raise
            if self.expected_partitions not in (None, len(partitions)) and not self._warned:
                self._warned = True
                log.warning("%s has %d partitions, the settings say %d (estimates_partitions): every deployment "
                            "should create it alike (docs/estimates.md)", self.topic, len(partitions),
                            self.expected_partitions)
            self._client, self._partitions = client, partitions
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
