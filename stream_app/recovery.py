"""What a worker does when Redis or the broker lost data: the loss checks behind one interface.

:class:`Recovery` keeps, per assigned partition, what this worker handled since its assignment (the last
offset, the last offset applied per campaign, the first message read: its *anchor*), and compares it with
what the count store and the broker hold. The Faust layer (:mod:`stream_app.app`) calls it at clear points:

* on assignment: :meth:`Recovery.on_assignment` (where each partition restarts: after the last message the
  store holds, or at the partition's first offset; the consumer is moved there, the partition state is
  forgotten, the Redis server remembered, a pending replay ends);
* periodically: :meth:`Recovery.watch` (a restarted Redis that lost its last writes, a recreated topic, a
  partition whose start the broker deleted, a stalled partition);

and the hot path (:class:`stream_app.pipeline.Pipeline`, through :class:`stream_app.pipeline.LossChecks`) at
three: before a message (:meth:`Recovery.admit`, :attr:`Recovery.holding`), on a loss answer of the store
(:meth:`Recovery.on_loss`) and after a message was handled (:meth:`Recovery.handled`).

A loss is repaired by a *replay*: nothing more is applied (:attr:`Recovery.holding`), the consumer group
rebalances (:meth:`ConsumerControl.request_rejoin`), every partition restarts at the position the store still
holds, and the replayed batches whose ids survived are skipped, the others counted again, so the counts end
exact if Kafka still holds the messages. A loss Kafka cannot repair (messages deleted before they were counted,
a topic recreated under the worker) raises the ``unrepairable_loss`` alarm and marks the steps not final yet
incomplete (:meth:`Recovery.broker_lost`).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from wire.campaign import Campaign

from .health import Health
from .metrics import Metrics
from .pipeline import StoreCalls
from .store import RETRYABLE_ERRORS, SERVER_CHANGED, STORE_RESET, CountStore, Position

__all__ = ["BrokerView", "ConsumerControl", "Recovery"]

#: at most this many steps before a lost partition's next message are marked incomplete (a wall-clock campaign's
#: steps are numbered from 1970: its stream step at the loss is near its next message's, never 28 million away)
MAX_LOST_STEPS = 10_000
#: a stalled partition whose seek target and the offset that arrived first instead are at most this far apart is
#: checked for a hole in the broker's log (each offset read once, outside the consumer group)
MAX_HOLE = 16

log = logging.getLogger(__name__)


class ConsumerControl(Protocol):
    """The worker's consumer, as recovery needs it (:class:`stream_app.consumer.FaustConsumer`)."""

    async def earliest_offsets(self, partitions: list[int]) -> dict[int, int]:
        """``partition -> first offset`` the broker still holds, of the reports topic."""

    def reseek(self, partition: int, offset: int) -> None:
        """Make the consumer deliver ``partition`` from ``offset`` again (soon, not at once)."""

    async def request_rejoin(self) -> None:
        """Make the consumer group rebalance (every member then restarts at the store's positions)."""

    async def move_to(self, targets: dict[int, int]) -> None:
        """Commit ``partition -> offset`` and seek there, before the consumer delivers anything of them."""


class BrokerView(Protocol):
    """The reports topic read outside the consumer group (:class:`stream_app.broker.TopicReader`)."""

    async def ident_at(self, partition: int, offset: int) -> str | None: ...

    async def report_ends(self) -> dict[int, int]: ...


class Recovery:
    """The loss checks of one worker (module doc)."""

    def __init__(self, campaigns: dict[str, Campaign], store: CountStore, metrics: Metrics, health: Health,
                 alarms: dict[str, dict[str, Any]], *, calls: StoreCalls, app_id: str, topic: str,
                 consumer: ConsumerControl | None = None, broker: BrokerView | None = None) -> None:
        self.campaigns, self.store, self.metrics, self.health = campaigns, store, metrics, health
        self.alarms = alarms  # name -> {component, since, error}: shown by /status
        self.calls = calls
        self.app_id, self.topic = app_id, topic
        self.consumer, self.broker = consumer, broker  # None: a store alone (tools and tests): no broker checks
        self.assigned: list[int] = []
        self.resyncing = False  # the store lost data; nothing is applied until the replay starts
        self._replay_requested_at = -1e9
        self.last_offsets: dict[int, int] = {}  # partition -> last offset handled by this worker
        # (campaign, partition) -> last offset of the campaign applied by this worker since its assignment:
        # compared with the campaign's cursors in the store after a Redis restart (:meth:`server_changed`)
        self.applied_offsets: dict[tuple[str, int], int] = {}
        # partition -> (offset, ident) of the first message handled since the last assignment: if it is not
        # at its offset any more, the topic was recreated under this worker (see watch)
        self.anchors: dict[int, tuple[int, str]] = {}
        self._redis_run_id: str | None = None  # the Redis server last seen (its run id changes at a restart)
        # partition -> the offset its first message must have after the positions were restored, and a seek there
        self.replay_from: dict[int, int] = {}
        self._reseeks: dict[int, tuple[int, int]] = {}  # partition -> (seeks, the offset that came first last time)
        self.progress_at: dict[int, float] = {}  # partition -> when a message of it was last admitted (monotonic)
        self.stream_steps: dict[str, int] = {}  # campaign -> the newest step this worker applied a message of
        # partition -> campaign -> (its stream step at an unrepairable loss, why): marked by mark_lost_steps
        self.lost_from: dict[int, dict[str, tuple[int, str]]] = {}

    # ------------------------------------------------------------------ the hot path's side (LossChecks)
    @property
    def holding(self) -> bool:
        return self.resyncing

    def admit(self, partition: int, offset: int) -> bool:
        """Note the partition's progress; ``False`` while the partition waits for the message at its replay start.

        After positions were restored (:meth:`start_offsets`), the first message of a partition must be the one
        at its start offset. One fetched before the seek (Faust delivers what it buffered, then drops every
        offset below the last it delivered: seen after a broker lost its topic) is not handled, and the partition
        is sought to its start again, after every such message. The same offset arriving first again right after
        a seek means the broker has nothing at the start offset (deleted meanwhile): the stream goes on there."""
        want = self.replay_from.get(partition)
        if want is None:
            self.progress_at[partition] = time.monotonic()
            return True
        count, last = self._reseeks.get(partition, (0, -1))
        if offset == want or (offset == last and offset > want):
            if offset != want:
                log.warning("partition %s: no message at offset %s any more; going on at %s", partition, want, offset)
            del self.replay_from[partition]
            self._reseeks.pop(partition, None)
            self.progress_at[partition] = time.monotonic()
            return True
        # a message refused here is no progress: if only such messages arrive (buffered ones, each sought back
        # and dropped again), the stall check (_check_stalls) seeks the partition to the store's position anew
        if offset < want:  # handled before the restore: the store holds it
            return False
        self._reseeks[partition] = (count + 1, offset)
        if count == 0:
            log.warning("partition %s: offset %s arrived first after the positions were restored to %s (fetched "
                        "before the seek): not handled; seeking to %s again", partition, offset, want, want)
        if self.consumer is not None:
            self.consumer.reseek(partition, want)
        return False

    async def hold(self) -> None:
        await self._request_replay()

    async def on_loss(self, status: int, campaign: str, partition: int, offset: int) -> bool:
        if status == STORE_RESET:
            await self.store_lost(campaign, partition, offset)
            return True
        if status == SERVER_CHANGED:
            return await self.server_changed(campaign, partition, offset)
        return False

    def handled(self, partition: int, offset: int, ident: str, campaign: str | None = None,
                t: int | None = None) -> None:
        self.last_offsets[partition] = offset
        if campaign is not None:
            self.applied_offsets[(campaign, partition)] = offset
            if t is not None and t > self.stream_steps.get(campaign, -1):
                self.stream_steps[campaign] = t
        if partition not in self.anchors:
            self.anchors[partition] = (offset, ident)

    # ------------------------------------------------------------------ the Faust layer's side
    async def on_assignment(self, partitions: list[int]) -> dict[int, int]:
        """A rebalance completed and this worker owns ``partitions`` of the reports topic: move the consumer to
        where each restarts (:meth:`start_offsets`, :meth:`ConsumerControl.move_to`), then :meth:`restored`.
        Returns the offsets moved to."""
        self.store.forget_epochs()
        targets: dict[int, int] = {}
        if partitions:
            await self.load_loss_marks(partitions)
            targets = await self.start_offsets(sorted(partitions))
            if self.consumer is not None:
                await self.consumer.move_to(targets)
        await self.restored(targets)
        return targets

    async def load_loss_marks(self, partitions: list[int]) -> None:
        """The loss marks another worker recorded for ``partitions`` (:meth:`broker_lost`): this worker marks their
        lost steps at each partition's next message (:meth:`mark_lost_steps`)."""
        marks = await self.calls(self.store.loss_marks, self.app_id, self.topic, partitions)
        for p, by_campaign in marks.items():
            for c, mark in by_campaign.items():
                if c in self.campaigns:
                    self.lost_from.setdefault(p, {}).setdefault(c, mark)

    async def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Where each partition of the reports topic restarts: after the last message the store handled.

        The recorded message is looked up again in the topic (:meth:`BrokerView.ident_at`): if it is not there
        (the topic was recreated, its offsets restarted) the partition restarts at its first offset; if the
        store has no position (a new or emptied store) too. Messages the broker deleted before they were
        handled raise the ``unrepairable_loss`` alarm."""
        positions = await self.calls(self.store.positions, self.app_id, self.topic)
        earliest = await self.consumer.earliest_offsets(partitions) if self.consumer else {}
        out: dict[int, int] = {}
        for p in partitions:
            first = earliest.get(p, 0)
            if p not in positions:
                out[p] = first
                continue
            offset, ident = positions[p]
            if offset + 1 < first:
                await self.broker_lost([p], f"partition {p}: offsets {offset + 1}..{first - 1} were deleted by the "
                                            f"broker before they were counted")
                out[p] = first
            elif offset + 1 == first or await self._recorded_message_is_there(p, offset, ident):
                out[p] = offset + 1
            else:
                log.warning("partition %s: the message recorded at offset %s (%s) is not in the topic any more "
                            "(the topic was recreated); replaying the partition from offset %s", p, offset,
                            ident, first)
                out[p] = first
        return out

    async def restored(self, targets: dict[int, int]) -> None:
        """The consumer was sought to ``targets`` (partition -> offset; empty: no partition of the topic): forget
        what was handled before, remember the Redis server the positions came from, end a pending replay."""
        if targets:
            self.replay_from, self._reseeks = dict(targets), {}
            self.progress_at = {p: time.monotonic() for p in targets}
            log.info("restored positions from the store: %s", targets)
        self.last_offsets, self.applied_offsets, self.anchors = {}, {}, {}
        try:  # the Redis server whose positions were just read: a later restart is checked against it
            self._redis_run_id = await self.store.server_id()
        except RETRYABLE_ERRORS:
            self._redis_run_id = None
        if self.resyncing:
            self.resyncing = False
            alarm = self.alarms.get("store_reset")
            if alarm is not None:  # the replay runs: the alarm stays listed in /status, the worker is healthy
                alarm.update(blocking=False, replay_started_at=time.time())
            log.warning("replaying the reports topic from the store's positions")

    async def watch(self, every: float = 2.0) -> None:
        """Every ``every`` seconds until the worker stops: a Redis restart that lost writes
        (:meth:`_check_redis_restart`), the anchors and deleted starts (:meth:`_check_anchors`), stalled
        partitions (:meth:`_check_stalls`)."""
        stopping = self.calls.stopping
        while not stopping.is_set():
            try:
                await asyncio.wait_for(stopping.wait(), every)
                return
            except asyncio.TimeoutError:
                pass
            if self.resyncing:
                continue
            try:
                await self._check_redis_restart()
                await self._check_anchors()
                await self._check_stalls()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the broker or Redis may be down: look again next time
                log.debug("incarnation check failed: %s", exc)

    # ------------------------------------------------------------------ losses
    async def store_lost(self, campaign: str, partition: int, offset: int, why: str = "") -> None:
        """Redis lost data (the campaign's epoch changed): raise the alarm and replay from the store's positions."""
        self.metrics.store_resets_total.labels(campaign).inc()
        why = why or f"campaign {campaign!r}: its epoch changed (seen at partition {partition} offset {offset})"
        self.alarms["store_reset"] = {"component": "redis", "since": time.time(), "blocking": True, "error": (
            f"Redis lost data ({why}); holding the stream until the replay from the positions Redis still "
            f"holds starts")}
        log.error("Redis lost data (%s): holding the stream and replaying from the store's positions", why)
        self.resyncing = True
        await self._request_replay()

    async def _request_replay(self) -> None:
        """Ask for the rebalance that starts the replay (again every 10 s while it has not happened)."""
        now = time.monotonic()
        if self.consumer is None or now - self._replay_requested_at < 10.0:
            return
        self._replay_requested_at = now
        try:
            await self.consumer.request_rejoin()
        except Exception:  # noqa: BLE001 - asked again in 10 s; the alarm stays up meanwhile
            log.exception("could not request the consumer-group rebalance that starts the replay")

    async def server_changed(self, campaign: str, partition: int, offset: int) -> bool:
        """Redis restarted since this worker last applied to ``campaign`` (:data:`SERVER_CHANGED`): compare what
        the store holds (the cursors of every campaign this worker applied to, and the positions) with what
        this worker applied since its assignment. If something is missing (an AOF that lost its last
        second, a failover to a replica that lagged), the positions of the partitions concerned are moved
        back to the last message the store still holds, and the stream is held and replayed from there
        (batch ids applied before are skipped); returns ``True``. Otherwise the new server is accepted."""
        store, topic = self.store, self.topic
        lost: dict[int, tuple[int, str] | None] = {}  # partition -> last message the store holds (None: none)

        def lower(p: int, have: tuple[int, str] | None) -> None:
            if p not in lost or (lost[p] is not None and (have is None or have[0] < lost[p][0])):
                lost[p] = have

        for c in sorted({c for c, _ in self.applied_offsets}):
            cursors = await self.calls(store.cursors, c, self.app_id, topic)
            for (c2, p), last in self.applied_offsets.items():
                if c2 == c and (p not in cursors or cursors[p][0] < last):
                    lower(p, cursors.get(p))
        positions = await self.calls(store.positions, self.app_id, topic)
        for p, last in self.last_offsets.items():
            if p not in positions or positions[p][0] < last:
                lower(p, positions.get(p))
        if not lost:
            log.warning("Redis restarted (seen applying to campaign %r at partition %s offset %s); it holds "
                        "everything this worker applied", campaign, partition, offset)
            store.accept_server(campaign)
            return False
        for p, have in sorted(lost.items()):
            if have is None:
                await self.calls(store.forget_positions, self.app_id, topic, [p])
            elif p not in positions or positions[p][0] > have[0]:
                await self.calls(store.set_position, Position(self.app_id, topic, p, *have))
        detail = ", ".join(f"partition {p}: store holds up to {'nothing' if h is None else h[0]}, this worker "
                           f"applied up to {self.last_offsets.get(p)}" for p, h in sorted(lost.items()))
        await self.store_lost(campaign, partition, offset, why=f"Redis restarted without its last writes ({detail})")
        return True

    def lost_before(self, partition: int, campaign: str) -> bool:
        lost = self.lost_from.get(partition)
        return lost is not None and campaign in lost

    async def mark_lost_steps(self, partition: int, campaign: str, t: int) -> None:
        """The first message of ``campaign`` read from ``partition`` after an unrepairable loss, of step ``t``: the
        lost messages of the partition were sent before it, so (producers send a partition's steps in order) their
        steps lie between this worker's stream step at the loss and ``t``. Those steps are marked incomplete before
        anything of them is counted, including steps the store had not seen yet (a backlog the worker never read):
        :meth:`broker_lost` could only mark the steps the store knew."""
        lost = self.lost_from[partition]
        since, why = lost.pop(campaign)
        if not lost:
            del self.lost_from[partition]
        lo = max(min(since, t), t - MAX_LOST_STEPS + 1)
        c = self.campaigns[campaign]
        for attribute in c.attributes:
            await self.calls(self.store.mark_incomplete, c.id, attribute, range(lo, t + 1), why)
        await self.calls(self.store.clear_loss_mark, self.app_id, self.topic, partition, campaign)
        log.error("%s: the broker lost partition %s's messages before step %s: steps %s..%s marked incomplete",
                  campaign, partition, t, lo, t)

    async def broker_lost(self, partitions: list[int], why: str) -> None:
        """An unrepairable broker loss: the ``unrepairable_loss`` alarm (``GET /status``), the metric, an error in
        the log, and every step not final yet marked incomplete: its final says ``complete: false``. The steps the
        lost messages may have held that the store had not seen are marked when each campaign's next message of
        the partition arrives (:meth:`mark_lost_steps`)."""
        now = time.time()
        for p in partitions:
            self.lost_from[p] = {c: (self.stream_steps.get(c, 0), why) for c in self.campaigns}
        # in the store too: a rebalance may move a partition before its next message is read
        await self.calls(self.store.set_loss_marks, self.app_id, self.topic, {p: self.lost_from[p] for p in partitions})
        for p in partitions:
            self.alarms[f"unrepairable_loss:{p}"] = {"component": "kafka", "since": now, "error": (
                f"{why}; the counts of the steps not final yet may be short: their finals say complete=false")}
        self.metrics.unrepairable_losses_total.inc()
        log.error("unrepairable broker loss: %s; marking the steps not final yet incomplete", why)
        for c in self.campaigns.values():
            for attribute in c.attributes:
                ts = await self.calls(self.store.unfinished_steps, c.id, attribute)
                if ts:
                    await self.calls(self.store.mark_incomplete, c.id, attribute, ts, why)

    async def topic_recreated(self, partition: int, offset: int, ident: str) -> None:
        """The anchor of ``partition`` is gone: the broker lost the topic (an unrepairable loss: what it held
        and this worker had not handled is gone); replay every assigned partition's new incarnation from its
        start."""
        log.warning("partition %s: the message read at offset %s (%s) is not there any more: the topic was "
                    "recreated (a broker that lost its data); replaying its new incarnation from the start",
                    partition, offset, ident)
        self.metrics.topic_incarnations_total.inc()
        mine = sorted(set(self.anchors) | set(self.assigned) | {partition})
        await self.broker_lost(mine, f"the reports topic was recreated under this worker (partition {partition}: the "
                                     f"message read at offset {offset} is gone)")
        self.resyncing = True
        await self.calls(self.store.forget_positions, self.app_id, self.topic, mine)
        await self._request_replay()

    # ------------------------------------------------------------------ the periodic checks
    async def _recorded_message_is_there(self, partition: int, offset: int, ident: str) -> bool:
        """Whether the message recorded at ``offset`` is still there (retried; if the broker cannot tell, the
        answer is no: the partition is replayed from its start, and the applied batch ids are skipped)."""
        if self.broker is None:
            return True
        for attempt in range(5):
            try:
                return await self.broker.ident_at(partition, offset) == ident
            except Exception as exc:  # noqa: BLE001 - the broker may be coming back
                log.warning("cannot read back partition %s offset %s (%s); attempt %s of 5", partition, offset,
                            exc, attempt + 1)
                await asyncio.sleep(1.0)
        return False

    async def _check_redis_restart(self) -> None:
        """After Redis restarted, the positions it recorded must still reach what this worker handled: an AOF
        that lost its last second (``appendfsync everysec``) lost counts too, and the campaign epochs survive
        it. If a position is behind, those counts are replayed (as after a loss of the whole store)."""
        run_id = await self.store.server_id()
        previous, self._redis_run_id = self._redis_run_id, run_id
        if previous is None or previous == run_id:
            return
        handled = dict(self.last_offsets)
        recorded = await self.store.positions(self.app_id, self.topic)
        behind = {p: (recorded[p][0] if p in recorded else None, last) for p, last in handled.items()
                  if p not in recorded or recorded[p][0] < last}
        log.warning("Redis restarted (server %s, was %s); positions behind what this worker handled: %s",
                    run_id, previous, behind or "none")
        if behind:
            p, (have, last) = next(iter(behind.items()))
            await self.store_lost("*", p, last, why=f"Redis restarted without its last writes: partition {p} is "
                                                    f"recorded at offset {have}, this worker had handled {last}")

    async def _check_anchors(self) -> None:
        """The broker lost data under this worker? A partition whose log start passed a message not yet handled
        (retention deleted it), or whose anchor message is gone (the topic was recreated, offsets went back) is
        an unrepairable loss (:meth:`broker_lost`); the latter is also replayed from the new incarnation's start.
        (Not the recorded position against the end offset: tansu's memory storage, restarted, has served a
        message at its own end offset.)"""
        if not self.anchors or self.broker is None:
            return
        parts = sorted(self.anchors)
        earliest = await self.consumer.earliest_offsets(parts) if self.consumer else {}
        for p in parts:
            last = self.last_offsets.get(p)
            if last is not None and earliest.get(p, 0) > last + 1:
                key = f"unrepairable_loss:{p}"
                if self.alarms.get(key, {}).get("first_kept") != earliest[p]:
                    await self.broker_lost([p], f"partition {p}: offsets {last + 1}..{earliest[p] - 1} were deleted by "
                                                f"the broker before they were counted")
                    self.alarms[key]["first_kept"] = earliest[p]
        for p, (offset, ident) in list(self.anchors.items()):
            if offset < earliest.get(p, 0):  # deleted by the broker's retention: re-anchor
                self.anchors.pop(p, None)
                continue
            if await self.broker.ident_at(p, offset) != ident and self.anchors.get(p) == (offset, ident):
                await self.topic_recreated(p, offset, ident)
                return

    async def _check_stalls(self, after: float = 10.0) -> None:
        """An assigned partition with messages waiting past the store's position, none of them handled for
        ``after`` seconds while Redis answers, is sought to that position again (seen after a broker lost its
        topic: a consumer left fetching beyond the new incarnation's end, where tansu answers nothing)."""
        if self.broker is None or self.consumer is None or not self.assigned or self.resyncing \
                or self.health.has("redis") or self.health.has("store_retry"):
            return
        now = time.monotonic()
        stalled = [p for p in self.assigned if now - self.progress_at.setdefault(p, now) > after]
        if not stalled:
            return
        ends = await self.broker.report_ends()
        recorded = await self.store.positions(self.app_id, self.topic)
        earliest = await self.consumer.earliest_offsets(stalled)
        for p in stalled:
            start = recorded[p][0] + 1 if p in recorded else earliest.get(p, 0)
            if ends.get(p, 0) > start:
                first = self._reseeks.get(p, (0, -1))[1]  # a later offset that came first after a seek to start
                if start < first <= start + MAX_HOLE and await self._hole(p, start, first):
                    log.error("partition %s: the broker holds no message at offsets %s..%s (a hole its restart left, "
                              "below messages it kept; producers resend what they saw fail): going on at %s", p, start,
                              first - 1, first)
                    start = first
                else:
                    log.warning("partition %s: messages %s..%s wait and none was handled for %.0f s: seeking to %s "
                                "again", p, start, ends[p] - 1, now - self.progress_at[p], start)
                self.replay_from[p] = start
                self._reseeks.pop(p, None)
                self.consumer.reseek(p, start)
            self.progress_at[p] = now

    async def _hole(self, partition: int, start: int, end: int) -> bool:
        """Whether the broker holds no message at any offset of ``start .. end - 1`` (read outside the group: a
        consumer sought into such a hole waits there for ever, as tansu answers a fetch there with nothing)."""
        for offset in range(start, end):
            try:
                if await self.broker.ident_at(partition, offset) is not None:  # type: ignore[union-attr]
                    return False
            except Exception as exc:  # noqa: BLE001 - the broker cannot tell: no hole assumed, seek again
                log.warning("partition %s: cannot read offset %s to look for a hole (%s)", partition, offset, exc)
                return False
        return True
