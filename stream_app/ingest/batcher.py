"""Groups validated single reports into batch envelopes and publishes them, acknowledging each request once the
broker acknowledged every envelope holding its reports.

The first report after an idle moment starts a short *linger* (5 ms by default, at most 10 ms at the
ingest); when it ends, or as soon as ``max_reports`` wait, everything waiting is grouped per (campaign,
attribute, t) and sent as ordinary batch envelopes on ``ldp.reports``, while the next reports start the
next linger: publishes overlap, a request waits for its own batch only. Each envelope gets a fresh unique
batch id (``http:<uuid4 hex>``), so the count store applies it at most once whatever the broker or the
consumer redeliver. Used by the ingest service.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Awaitable, Callable, Mapping

import numpy as np

from wire import envelope
from wire.campaign import Campaign
from wire.single_report import SingleReport
from wire.topics import message_key

__all__ = ["Batcher", "PublishError", "SendReports", "ShuttingDown"]

log = logging.getLogger(__name__)

SendReports = Callable[[bytes, bytes], Awaitable[Any]]  # (message key, batch envelope) -> the broker's ack
Published = Callable[[str, str, int], None]  # (campaign, attribute, reports) after the broker's ack


class ShuttingDown(RuntimeError):
    """The batcher was stopped: no new reports (the request gets 503, the device retries elsewhere)."""


class PublishError(RuntimeError):
    """The broker did not acknowledge a batch holding some of a request's reports. ``published``: the request's
    (campaign, attribute, t) groups whose batches it did acknowledge (Kafka has no atomic multi-partition write:
    those reports are in, the others are not)."""

    def __init__(self, cause: BaseException, published: set[tuple[str, str, int]]) -> None:
        super().__init__(f"the broker did not acknowledge a batch: {cause}")
        self.cause, self.published = cause, published


class Batcher:
    """Batches single reports (module doc); :meth:`submit` returns once they are in Kafka."""

    def __init__(self, campaigns: Mapping[str, Campaign], send_reports: SendReports, *,
                 linger_seconds: float = 0.005, max_reports: int = 10_000, on_published: Published | None = None) -> None:
        if not linger_seconds >= 0:
            raise ValueError(f"linger_seconds must be >= 0, got {linger_seconds}")
        if max_reports < 1:
            raise ValueError(f"max_reports must be >= 1, got {max_reports}")
        self.campaigns = campaigns
        self.send_reports = send_reports
        self.linger_seconds = linger_seconds
        self.max_reports = max_reports
        self.on_published = on_published
        self._groups: dict[tuple[str, str, int], list[np.ndarray]] = {}
        self._waiters: list[tuple[asyncio.Future, set[tuple[str, str, int]]]] = []  # a request, its groups
        self._pending = 0
        self._timer: asyncio.TimerHandle | None = None
        self._publishing: set[asyncio.Task] = set()
        self._stopping = False
        self.batches_sent = 0
        self.reports_sent = 0

    async def submit(self, items: list[SingleReport]) -> int:
        """Queue validated reports; returns how many once the broker acknowledged them (raises if it did not)."""
        if self._stopping:
            raise ShuttingDown("the ingest is shutting down")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        n = 0
        keys = set()
        for campaign, attr, t, reports in items:
            key = (campaign.id, attr, t)
            self._groups.setdefault(key, []).append(reports)
            keys.add(key)
            n += len(reports)
        self._waiters.append((fut, keys))
        self._pending += n
        if self._pending >= self.max_reports:
            self._flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.linger_seconds, self._flush)
        await fut
        return n

    def _flush(self) -> None:
        """Publish everything waiting, in a task of its own (the next linger starts meanwhile)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiters:
            return
        groups, waiters = self._groups, self._waiters
        self._groups, self._waiters, self._pending = {}, [], 0
        task = asyncio.get_running_loop().create_task(self._publish(groups, waiters))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, groups: dict[tuple[str, str, int], list[np.ndarray]],
                       waiters: list[tuple[asyncio.Future, set[tuple[str, str, int]]]]) -> None:
        """Send one envelope per group (or per ``max_reports`` of it); a request fails (503, its device retries)
        only if an envelope holding some of its reports was not acknowledged."""
        failed: dict[tuple[str, str, int], BaseException] = {}
        sends, owners = [], []
        for key, rows in groups.items():
            cid, attr, t = key
            campaign = self.campaigns[cid]
            try:
                reports = np.concatenate(rows) if len(rows) > 1 else rows[0]
                step = max(1, min(self.max_reports, campaign.max_batch_reports))
                for i in range(0, len(reports), step):
                    # a fresh unique batch id: the store applies it at most once
                    blob = envelope.pack_reports(campaign, attr, t, reports[i:i + step],
                                                 batch_id=f"{envelope.INGEST_BATCH_PREFIX}{uuid.uuid4().hex}")
                    sends.append(self.send_reports(message_key(t, attr), blob))
                    owners.append(key)
            except Exception as exc:  # noqa: BLE001 - its requests fail, the others go on
                failed[key] = exc
        for key, result in zip(owners, await asyncio.gather(*sends, return_exceptions=True)):
            if isinstance(result, BaseException):
                failed.setdefault(key, result)
        if failed:
            log.warning("publishing to the broker failed for %d of %d group(s): %s", len(failed), len(groups),
                        next(iter(failed.values())))
        for key, rows in groups.items():
            if key not in failed:
                n = sum(len(r) for r in rows)
                self.reports_sent += n
                if self.on_published is not None:
                    self.on_published(key[0], key[1], n)
        self.batches_sent += sum(1 for key in owners if key not in failed)
        for fut, keys in waiters:
            if fut.done():
                continue
            errors = [failed[k] for k in keys if k in failed]
            if errors:
                fut.set_exception(PublishError(errors[0], {k for k in keys if k not in failed}))
            else:
                fut.set_result(None)

    async def flush(self) -> None:
        """Publish what waits now and wait for every publish under way."""
        self._flush()
        if self._publishing:
            await asyncio.wait(set(self._publishing))

    async def stop(self) -> None:
        """Refuse new reports, publish those accepted, wait for the broker's answers."""
        self._stopping = True
        await self.flush()
