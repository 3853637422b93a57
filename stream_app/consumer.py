"""The worker's Kafka consumer positions, through Faust: the one module that touches its consumer's internals.

:class:`FaustConsumer` implements :class:`stream_app.recovery.ConsumerControl` (and the high-watermark read of
the hot path) on a Faust app's consumer. Faust offers no public way to commit chosen offsets, to forget the
offset it last delivered, to make the group rebalance, or to set aiokafka's ``fetch_max_wait_ms``; the private
attributes used for those are listed, with why and the pinned versions, in ``docs/architecture.md``
("Private internals of Faust and aiokafka"), and ``tests/test_internals.py`` fails if the installed libraries
change them.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import faust

__all__ = ["FaustConsumer", "limit_fetch_wait"]

log = logging.getLogger(__name__)


class FaustConsumer:
    """Positions of the reports topic on ``app``'s consumer (module doc)."""

    def __init__(self, app: faust.App, topic: str) -> None:
        self.app, self.topic = app, topic

    def _tp(self, partition: int) -> Any:
        return faust.types.TP(self.topic, partition)

    def assigned(self) -> list[int]:
        """The partitions of the reports topic this consumer owns now."""
        return sorted(tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.topic)

    def highwater(self, partition: int) -> int | None:
        """The partition's high watermark as the consumer last saw it (``None``: not known yet)."""
        try:
            return self.app.consumer.highwater(self._tp(partition))
        except Exception:  # noqa: BLE001 - not known yet
            return None

    async def earliest_offsets(self, partitions: list[int]) -> dict[int, int]:
        found = await self.app.consumer.earliest_offsets(*[self._tp(p) for p in partitions])
        return {tp.partition: int(off) for tp, off in found.items() if off is not None}

    async def request_rejoin(self) -> None:
        """Make the consumer group rebalance: every worker then restarts at the store's positions."""
        thread = self.app.consumer._thread  # type: ignore[attr-defined]

        async def rejoin() -> None:
            thread._ensure_consumer()._coordinator.request_rejoin()

        await thread.call_thread(rejoin)

    async def move_to(self, targets: dict[int, int]) -> None:
        """Faust seeks every assigned partition to its committed offset right after a rebalance: commit
        ``targets`` first, so the stream restarts after the last message counted in Redis (state and position
        together), whatever Kafka's own commits say; then seek there ourselves (aiokafka's
        ``seek_to_committed`` leaves a committed offset of 0 alone), in the consumer's thread (``seek_wait``
        runs there, between fetches; ``Consumer.seek`` would race the fetcher). Faust drops offsets below the
        last one it delivered, and the replay starts lower: that record is cleared."""
        consumer = self.app.consumer
        offsets = {self._tp(p): off for p, off in targets.items()}
        await consumer._commit(offsets)  # type: ignore[attr-defined]
        await consumer.seek_wait(offsets)
        for tp in offsets:
            consumer._read_offset[tp] = None  # type: ignore[attr-defined]

    def reseek(self, partition: int, offset: int) -> None:
        """Seek ``partition`` to ``offset`` once Faust has recorded the message it is delivering (soon after)."""
        tp = self._tp(partition)
        consumer = self.app.consumer

        def later() -> None:
            consumer._read_offset[tp] = None  # type: ignore[attr-defined]
            asyncio.ensure_future(consumer.seek_wait({tp: offset}))
        asyncio.get_running_loop().call_soon(later)


def limit_fetch_wait(app: faust.App, seconds: float) -> None:
    """Make the worker consumer of ``app`` wait at most ``seconds`` in a fetch that finds no data.

    Faust creates its aiokafka consumer with a fixed ``fetch_max_wait_ms=1500``, and tansu answers a
    waiting fetch only when that wait is over, even if batches arrived meanwhile: the fewer
    partitions a worker owns (the more workers), the more often its batches sat there 1.5 s. The
    value is set on the consumer between its creation and its start (aiokafka reads it at start)."""
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    app.ldp_fetch_max_wait_ms = max(1, int(round(seconds * 1000)))  # type: ignore[attr-defined]
    create = AIOKafkaConsumerThread._create_worker_consumer
    if getattr(create, "_ldp_fetch_wait", False):
        return

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        wait_ms = getattr(self.app, "ldp_fetch_max_wait_ms", None)  # apps not made by create_app: unchanged
        if wait_ms is not None:
            consumer._fetch_max_wait_ms = wait_ms
        return consumer
    _create_worker_consumer._ldp_fetch_wait = True  # type: ignore[attr-defined]
    AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]
