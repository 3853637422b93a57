"""Rate limits and idempotency of report requests, shared by every ingest process through Redis.

A request is admitted by :meth:`RequestLedger.begin` in one Redis round trip (coalesced with the other
requests of the same event-loop tick): it claims, each with ``SET NX EX``, its idempotency record (if it
carries an ``Idempotency-Key``) and one rate-limit slot per report (device tokens only: at most one
report per device per (campaign, attribute, t)). The claims are per key, so a request is refused as a
whole (HTTP 429, every slot it won released) if any of its slots is held by another request: nothing
of a refused request is counted. After the broker acknowledged the reports, :meth:`RequestLedger.commit`
replaces the pending record by the answer; if publishing failed, :meth:`RequestLedger.abort` releases
the slots and the record, so that the device's retry can publish.

Slots live as long as their step takes reports: a report of step ``t`` is accepted until
``(t + 1) * time_step_seconds + lateness_seconds + max_late_seconds`` and at most ``max_early_seconds``
ahead of the ingest's clock (:func:`step_window`); its slot expires a margin after that
(:func:`slot_ttl`), so a device cannot send a second report of a step while that step takes any.
"""
from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Collection, Generic, Sequence, TypeVar

from wire.campaign import Campaign, step_at

from ..store import CountStore, IngestClaim, LedgerEntry, RateSlot, RequestRecord

__all__ = ["Admission", "RequestLedger", "SLOT_MARGIN_SECONDS", "slot_ttl", "step_window"]

SLOT_MARGIN_SECONDS = 60.0  # a slot outlives its step's last accepted report by this much
_PENDING, _DONE = b"P", b"D"

T = TypeVar("T")
R = TypeVar("R")


def step_window(campaign: Campaign, now: float, max_late_seconds: float, max_early_seconds: float) -> tuple[int, int]:
    """The steps ``[lo, hi]`` whose reports the ingest accepts at ``now`` (module doc)."""
    lo = step_at(campaign, now - campaign.lateness_seconds - max_late_seconds)
    return max(0, lo), step_at(campaign, now + max_early_seconds)


def slot_ttl(campaign: Campaign, t: int, now: float, max_late_seconds: float) -> int:
    """Seconds the rate-limit slot of a report of step ``t`` must live (until its step's window closes, plus a margin)."""
    closes = (t + 1) * campaign.time_step_seconds + campaign.lateness_seconds + max_late_seconds
    return max(1, math.ceil(closes - now + SLOT_MARGIN_SECONDS))


class _Coalesced(Generic[T, R]):
    """Merges the calls ``fn(items)`` made within one event-loop tick into one call (one Redis round trip)."""

    def __init__(self, fn: Callable[[list[T]], Awaitable[list[R]]]) -> None:
        self._fn = fn
        self._queue: list[tuple[list[T], asyncio.Future]] = []

    async def __call__(self, items: list[T]) -> list[R]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        if not self._queue:
            loop.call_soon(self._fire)
        self._queue.append((items, fut))
        return await fut

    def _fire(self) -> None:
        batch, self._queue = self._queue, []
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[list[T], asyncio.Future]]) -> None:
        flat = [item for items, _ in batch for item in items]
        try:
            out = await self._fn(flat) if flat else []
        except BaseException as exc:  # noqa: BLE001 - every caller gets the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        pos = 0
        for items, fut in batch:
            if not fut.done():
                fut.set_result(out[pos:pos + len(items)])
            pos += len(items)


@dataclass
class Admission:
    """What :meth:`RequestLedger.begin` decided for a request.

    ``state``: ``"new"`` (publish it), ``"replay"`` (answer ``answer``: the first attempt's), ``"in_progress"``
    (an earlier attempt is still running: 409), ``"in_doubt"`` (an earlier attempt's process stopped before
    answering: its reports were published at most once, nothing is published again), ``"key_reused"`` (the
    key was used for another body: 422) or ``"rate_limited"`` (``conflicts``: indices of the reports whose
    slot another request holds: 429)."""

    state: str
    answer: tuple[int, bytes] | None = None
    conflicts: list[int] = field(default_factory=list)
    record: RequestRecord | None = None  # the idempotency record (None without Idempotency-Key)
    claimed: list[LedgerEntry] = field(default_factory=list)  # what this attempt holds (released by abort)


class RequestLedger:
    """Idempotency records and rate-limit slots of report requests in the count store (module doc)."""

    def __init__(self, store: CountStore, *, idempotency_seconds: int = 3600, lease_seconds: float = 15.0) -> None:
        self.store = store
        self.idempotency_seconds = int(idempotency_seconds)
        self.lease_seconds = float(lease_seconds)
        self._claim = _Coalesced(store.claim_ingest_keys)
        self._settle = _Coalesced(self._settle_all)

    async def _settle_all(self, ops: list[tuple[IngestClaim | None, LedgerEntry | None]]) -> list[None]:
        records = [r for r, _ in ops if r is not None]
        forget = [k for _, k in ops if k is not None]
        await self.store.settle_ingest_keys(records, forget)
        return [None] * len(ops)

    async def begin(self, slots: Sequence[tuple[str, int, bytes, int]], request: bytes | None, body_hash: bytes,
                    now: float | None = None) -> Admission:
        """Claim the request's record (``request``: its 128-bit id, ``None`` without a key) and its ``slots``
        (``(campaign, t, slot, ttl)`` each) in one round trip and decide (:class:`Admission`)."""
        now = time.time() if now is None else now
        attempt = secrets.token_bytes(16)  # the value of every key this attempt claims
        record = RequestRecord(request) if request is not None else None
        pending = b"|".join((_PENDING, f"{now + self.lease_seconds:.3f}".encode(), body_hash.hex().encode(),
                             attempt.hex().encode()))
        claims = [IngestClaim(record, pending, self.idempotency_seconds)] if record else []
        claims += [IngestClaim(RateSlot(c, t, slot), attempt, ttl) for c, t, slot, ttl in slots]
        held = await self._claim(claims)
        won = [c.entry for c, h in zip(claims, held) if h == c.value]
        if record is not None:
            state, answer = self._read_record(held[0], pending, body_hash, now)
            if state != "new":
                # an attempt in doubt takes the record over: its answer becomes the one every retry gets
                adm = Admission(state, answer, record=record if state == "in_doubt" else None,
                                claimed=[k for k in won if k != record])
                await self.abort(adm)  # a slot it won now is not this attempt's to keep
                return adm
            held = held[1:]
        conflicts = [i for i, h in enumerate(held) if h != attempt]
        adm = Admission("new", record=record, claimed=won)
        if conflicts:
            adm.state, adm.conflicts = "rate_limited", conflicts
            await self.abort(adm)
            adm.claimed = []
        return adm

    @staticmethod
    def _read_record(value: bytes | None, pending: bytes, body_hash: bytes,
                     now: float) -> tuple[str, tuple[int, bytes] | None]:
        if value == pending:
            return "new", None
        if value is None:  # expired between the claim and the read: let the client retry
            return "in_progress", None
        parts = value.split(b"|", 3)
        if len(parts) == 4 and parts[2] != body_hash.hex().encode():
            return "key_reused", None
        if parts[0] == _DONE and len(parts) == 4:
            return "replay", (int(parts[1]), parts[3])
        if parts[0] == _PENDING and len(parts) == 4:
            return ("in_progress" if float(parts[1]) > now else "in_doubt"), None
        return "in_progress", None

    async def commit(self, adm: Admission, status: int, body: bytes, body_hash: bytes) -> None:
        """Record the request's answer (a retry with its key gets it); its slots stay held."""
        if adm.record is not None:
            value = b"|".join((_DONE, str(int(status)).encode(), body_hash.hex().encode(), body))
            await self._settle([(IngestClaim(adm.record, value, self.idempotency_seconds), None)])

    async def abort(self, adm: Admission, keep: Collection[LedgerEntry] = ()) -> None:
        """Release what this attempt claimed but ``keep`` (the slots of reports that were published)."""
        forget = [k for k in adm.claimed if k not in keep]
        if forget:
            await self._settle([(None, k) for k in forget])

    @staticmethod
    def body_hash(body: bytes) -> bytes:
        """What ties an idempotency key to one request body."""
        return hashlib.sha256(body).digest()[:16]
