"""What a worker reads from the broker outside its consumer group.

:class:`TopicReader` holds one aiokafka consumer without a group (nothing committed, nothing joined) and
answers three questions:

* :meth:`~TopicReader.ident_at`: which message sits at an offset of ``ldp.reports`` (a recorded consumer
  position is recognized by it: a topic recreated under the worker has other messages there);
* :meth:`~TopicReader.report_ends`: the log end offset of every partition of ``ldp.reports``: the *stream
  progress* barrier of a step (``stream_app.windows``: a step is final only once the count store's positions
  passed what the broker held when the step became due);
* :meth:`~TopicReader.published_finals`: the final estimates on ``ldp.estimates`` from given offsets to the end:
  the topic is the record of what was published, read by a new estimator lease holder (and after Redis lost
  data) to rebuild the claims before it publishes anything.

One request at a time (a lock); any client error closes the consumer, so the next call starts afresh.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiokafka
import aiokafka.errors

from wire import envelope
from wire.topics import Topics
from wire.transport import kafka_client_options

__all__ = ["TopicReader"]

log = logging.getLogger(__name__)


class TopicReader:
    """Reads ``ldp.reports`` and ``ldp.estimates`` outside the consumer group (module doc)."""

    def __init__(self, bootstrap: str, topics: Topics, *, request_timeout: float = 10.0) -> None:
        self.bootstrap, self.topics = bootstrap, topics
        self.request_timeout = request_timeout
        self._consumer: aiokafka.AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def _client(self) -> aiokafka.AIOKafkaConsumer:
        if self._consumer is None:
            consumer = aiokafka.AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                                 enable_auto_commit=False, auto_offset_reset="earliest",
                                                 request_timeout_ms=int(self.request_timeout * 1000),
                                                 **kafka_client_options())
            try:
                await consumer.start()
            except Exception:
                await consumer.stop()
                raise
            self._consumer = consumer
        return self._consumer

    async def _guarded(self, coro_fn: Any, *args: Any) -> Any:
        async with self._lock:
            try:
                return await coro_fn(*args)
            except aiokafka.errors.OffsetOutOfRangeError:
                return None
            except Exception:
                await self.close()  # start again with a fresh client next time
                raise

    async def _partitions(self, topic: str) -> list[aiokafka.TopicPartition]:
        consumer = await self._client()
        # a metadata request: the partitions as the broker has them now (the consumer's own cache only follows
        # the topics it was assigned)
        cluster = await consumer._client.fetch_all_metadata()
        parts = cluster.partitions_for_topic(topic) or set()
        return [aiokafka.TopicPartition(topic, p) for p in sorted(parts)]

    # ------------------------------------------------------------------ ldp.reports
    async def ident_at(self, partition: int, offset: int) -> str | None:
        """:func:`wire.envelope.ident_of` the message at ``offset`` of ``ldp.reports`` (``None``: none there).

        Raises the client's error if the broker cannot be reached (the caller decides)."""
        return await self._guarded(self._ident_at, partition, offset)

    async def _ident_at(self, partition: int, offset: int) -> str | None:
        consumer = await self._client()
        tp = aiokafka.TopicPartition(self.topics.reports, partition)
        consumer.assign([tp])
        if offset >= (await consumer.end_offsets([tp]))[tp]:
            return None
        consumer.seek(tp, offset)
        batch = await consumer.getmany(tp, timeout_ms=5000, max_records=1)
        for msg in batch.get(tp, []):
            if msg.offset != offset:
                return None
            return envelope.ident_of(msg.value)  # what the worker recorded for it, a rejected message's too
        return None

    async def report_ends(self) -> dict[int, int]:
        """``partition -> log end offset`` of every partition of ``ldp.reports`` (raises if the broker is away)."""
        return await self._guarded(self._ends, self.topics.reports)

    async def _ends(self, topic: str) -> dict[int, int]:
        tps = await self._partitions(topic)
        if not tps:
            return {}
        consumer = await self._client()
        return {tp.partition: int(off) for tp, off in (await consumer.end_offsets(tps)).items()}

    # ------------------------------------------------------------------ ldp.estimates
    async def estimate_ends(self) -> dict[int, int]:
        """``partition -> log end offset`` of ``ldp.estimates``."""
        return await self._guarded(self._ends, self.topics.estimates)

    async def published_finals(self, since: dict[int, int]) -> tuple[list[dict[str, Any]], dict[int, int]]:
        """The final estimates on ``ldp.estimates`` from ``since`` (partition -> offset; a partition not named:
        from its first offset) to the end offsets at the time of the call, and those end offsets."""
        out = await self._guarded(self._published_finals, since)
        return out if out is not None else ([], {})

    async def _published_finals(self, since: dict[int, int]) -> tuple[list[dict[str, Any]], dict[int, int]]:
        tps = await self._partitions(self.topics.estimates)
        if not tps:
            return [], {}
        consumer = await self._client()
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
        # from where the store read last, or from the start where the topic is shorter than that (recreated)
        todo = {tp: max(int(starts[tp]), int(since.get(tp.partition, 0)) if since.get(tp.partition, 0) <= ends[tp]
                        else 0) for tp in tps}
        todo = {tp: off for tp, off in todo.items() if off < ends[tp]}
        docs: list[dict[str, Any]] = []
        if todo:
            consumer.assign(list(todo))
            for tp, off in todo.items():
                consumer.seek(tp, off)
            while todo:
                batch = await consumer.getmany(*todo, timeout_ms=2000, max_records=5000)
                if not batch:
                    raise TimeoutError(f"no answer while reading {self.topics.estimates} up to its end offsets")
                for tp, msgs in batch.items():
                    for msg in msgs:
                        if msg.offset >= ends[tp]:
                            break
                        try:
                            doc = json.loads(msg.value) if msg.value else None
                        except ValueError:
                            log.warning("%s partition %s offset %s is not JSON: skipped", tp.topic, tp.partition,
                                        msg.offset)
                            continue
                        if isinstance(doc, dict) and doc.get("final"):
                            docs.append(doc)
                    if await consumer.position(tp) >= ends[tp]:
                        todo.pop(tp, None)
        return docs, {tp.partition: int(off) for tp, off in ends.items()}

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                await consumer.stop()
            except Exception:  # noqa: BLE001 - a client of an unreachable broker
                log.debug("closing the topic reader failed", exc_info=True)
