"""Redis memory of the campaigns' retention: the byte model of a retained step, the memory Redis may use, and the
check a worker runs at start (:func:`check_retention`).

**The byte model** (the one place its constants live; docs/operations.md, "Redis memory per retained step", shows
the measured table they come from: ``MEMORY USAGE`` on Redis 7.0, ``pytest tests/test_retention.py -k memory -s``).
Per attribute and retained step, with ``s`` the protocol's support size, ``k`` the domain size and ``B`` the
batches applied to the step (:func:`step_bytes`):

* the step hash (counts and the batch ledger, :mod:`.counts`): one field per support count, one per applied batch
  id (kept for the step's retention, so a re-sent batch is never counted twice) and a few more. Redis keeps a hash
  of at most 512 fields as a listpack, ``256 + 11 s + 62 B`` bytes, and a larger one as a hash table,
  ``56 s + 100 B`` bytes (:func:`step_hash_bytes`);
* the history entry, the final estimate's JSON (two floats per value, the labels): ``1600 + 36 k`` bytes and the
  labels' length (:func:`history_entry_bytes`); for an open-domain attribute (no frequencies of a domain) the JSON
  of its top-K and candidates instead, ``1600 + 120 (top + candidates)`` bytes and twice the candidates' length
  (the length of the JSON of one entry, not a ``MEMORY USAGE`` measurement);
* the finals index, step index and watermark time entries: 54 + 108 + 62 bytes.

An attribute whose poisoning defense runs over the step's reports (``defense = "itemset"``) also keeps the step's
packed reports, which depend on the traffic and are not in the model (the check says so). ``B`` is the worker
setting ``retention_batches_per_step`` (100 by default): a fleet sends ``devices / batch size`` batches per
attribute and step (``ldp produce``: 5,000 reports a batch), the HTTP ingest up to one per process and linger
(5 ms) while reports arrive.

**The memory**: Redis's ``maxmemory`` (``CONFIG GET``, else ``INFO memory`` where CONFIG is renamed or forbidden),
per master of a Redis Cluster (a campaign's keys share one slot: its master holds them all), or the worker setting
``redis_memory_bytes`` (``LDP_REDIS_MEMORY_BYTES``), which wins and needs no answer from Redis (on a cluster: the
memory of each master, and every campaign is assumed on one). ``maxmemory 0`` (the default) bounds nothing: no
check, a warning. The retained steps may fill :data:`MEMORY_FRACTION` of it: the rest is for what the model leaves
out (the HTTP ingest's rate-limit slots and idempotency records, touched marks, client buffers, fragmentation).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from wire.campaign import Attribute, Campaign

from .connection import connect_sync, is_cluster_url
from .keys import epoch_key

__all__ = ["BATCHES_PER_STEP", "HASH_LISTPACK_MAX_FIELDS", "INDEX_ENTRIES_BYTES", "MEMORY_FRACTION", "MemoryLimit",
           "RetentionNeed", "RetentionTooLarge", "campaign_need", "check_retention", "history_entry_bytes",
           "open_history_entry_bytes", "read_max_memory", "step_bytes", "step_hash_bytes"]

#: Batches per attribute and step the check assumes by default (the worker setting ``retention_batches_per_step``).
BATCHES_PER_STEP = 100
#: Redis's ``hash-max-listpack-entries`` (default): a larger hash is a hash table.
HASH_LISTPACK_MAX_FIELDS = 512
#: Fields of a step hash besides its counts and batch ids (n, dtype, shape, first_ts, last_ts, closed, ...).
STEP_HASH_OTHER_FIELDS = 8
#: A listpack step hash: bytes of the key and header, per support count, per batch id.
LISTPACK_BASE_BYTES, LISTPACK_COUNT_BYTES, LISTPACK_BATCH_BYTES = 256, 11, 62
#: A hash-table step hash: bytes per support count, per batch id.
TABLE_COUNT_BYTES, TABLE_BATCH_BYTES = 56, 100
#: The history entry (the final's JSON): bytes of its fixed fields, per domain value.
HISTORY_BASE_BYTES, HISTORY_VALUE_BYTES = 1600, 36
#: An open-domain attribute's history entry: bytes per top-K item or candidate (the JSON of one entry).
HISTORY_OPEN_ITEM_BYTES = 120
#: The finals index, step index and watermark time entries of a step.
INDEX_ENTRIES_BYTES = 54 + 108 + 62
#: The share of the Redis memory the retained steps may fill.
MEMORY_FRACTION = 0.8


def step_hash_bytes(support: int, batches: int) -> int:
    """Bytes of a step hash with ``support`` counts and ``batches`` batch ids (module doc)."""
    if support + batches + STEP_HASH_OTHER_FIELDS <= HASH_LISTPACK_MAX_FIELDS:
        return LISTPACK_BASE_BYTES + LISTPACK_COUNT_BYTES * support + LISTPACK_BATCH_BYTES * batches
    return TABLE_COUNT_BYTES * support + TABLE_BATCH_BYTES * batches


def history_entry_bytes(k: int, labels: Iterable[str] = ()) -> int:
    """Bytes of one final in the history of an attribute of domain size ``k`` (and its labels)."""
    return HISTORY_BASE_BYTES + HISTORY_VALUE_BYTES * k + sum(len(x) + 4 for x in labels)


def open_history_entry_bytes(top: int, candidates: Iterable[str | int] = ()) -> int:
    """Bytes of one final in the history of an open-domain attribute publishing ``top`` items and ``candidates``."""
    names = [str(c) for c in candidates]
    return HISTORY_BASE_BYTES + HISTORY_OPEN_ITEM_BYTES * (top + len(names)) + sum(2 * (len(x) + 4) for x in names)


def step_bytes(attribute: Attribute, batches: int = BATCHES_PER_STEP) -> int:
    """Redis bytes of one retained step of ``attribute`` with ``batches`` batches (module doc; an open-domain
    attribute's sketch counted at its full size, however few of its cells the step's reports touched)."""
    history = open_history_entry_bytes(attribute.top, attribute.candidates) if attribute.open_domain \
        else history_entry_bytes(attribute.k, attribute.labels)
    return step_hash_bytes(attribute.protocol.support_size, batches) + history + INDEX_ENTRIES_BYTES


@dataclass(frozen=True)
class RetentionNeed:
    """What a campaign's retention holds in Redis: ``retention_steps × Σ_attributes step_bytes``, an attribute
    with its own ``retention_steps`` counted with it (:attr:`own`)."""

    campaign: Campaign
    batches_per_step: int
    per_attribute: Mapping[str, int]  # attribute -> bytes per retained step, those on the campaign's retention
    own: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # attribute -> (its retention, bytes per step)

    @property
    def step_bytes(self) -> int:
        """Bytes of one retained step of every attribute on the campaign's retention."""
        return sum(self.per_attribute.values())

    @property
    def own_total(self) -> int:
        """Bytes of the attributes with their own retention."""
        return sum(keep * b for keep, b in self.own.values())

    @property
    def total(self) -> int:
        return self.campaign.retention_steps * self.step_bytes + self.own_total

    def formula(self) -> str:
        """``retention_steps (R) × A attributes × M B per attribute and step (mean) = T B``."""
        c, a = self.campaign, len(self.per_attribute)
        head = (f"retention_steps {c.retention_steps:,} × {a} attribute{'s' if a != 1 else ''} × "
                f"{self.step_bytes / a:,.0f} B per attribute and step (mean; "
                f"{', '.join(f'{n} {b:,}' for n, b in self.per_attribute.items())}; "
                f"{self.batches_per_step} batches per step)") if a else "no attribute on the campaign's retention"
        own = "".join(f" + {n}'s own retention_steps {keep:,} × {b:,} B" for n, (keep, b) in self.own.items())
        return f"{head}{own} = {self.total:,} B ({_size(self.total)})"


def campaign_need(campaign: Campaign, batches_per_step: int = BATCHES_PER_STEP) -> RetentionNeed:
    """The retention need of ``campaign`` under the byte model."""
    attrs = campaign.attributes.values()
    return RetentionNeed(campaign, batches_per_step,
                         {a.name: step_bytes(a, batches_per_step) for a in attrs if a.retention_steps is None},
                         {a.name: (a.retention_steps, step_bytes(a, batches_per_step)) for a in attrs
                          if a.retention_steps is not None})


@dataclass(frozen=True)
class MemoryLimit:
    """The memory of the Redis (node) holding a campaign: ``limit`` bytes (0: unbounded), where it comes from."""

    limit: int
    source: str  # e.g. "maxmemory of 127.0.0.1:6379 (CONFIG GET)", "LDP_REDIS_MEMORY_BYTES"
    node: str = ""


class RetentionTooLarge(ValueError):
    """The retention of the campaigns cannot fit the Redis memory: the worker refuses to start (message: what to
    change)."""


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def check_retention(campaigns: Mapping[str, Campaign], limits: Mapping[str, MemoryLimit],
                    batches_per_step: int = BATCHES_PER_STEP) -> list[str]:
    """Raise :class:`RetentionTooLarge` if the campaigns held by one Redis (node) need more than
    :data:`MEMORY_FRACTION` of its memory, naming each campaign that does not fit, its formula and what to change;
    return the warnings (an unbounded memory, a defense's report log outside the model)."""
    warnings: list[str] = []
    needs = {cid: campaign_need(c, batches_per_step) for cid, c in campaigns.items()}
    for cid, c in campaigns.items():
        itemset = [a.name for a in c.attributes.values() if a.defense == "itemset"]
        if itemset:
            warnings.append(f"campaign {cid}: the report log of {', '.join(itemset)} (defense = \"itemset\": every "
                            f"counted report, packed, per retained step) is not in the retention check")
    by_node: dict[tuple[str, int, str], list[str]] = {}
    for cid in campaigns:
        lim = limits.get(cid)
        if lim is None or lim.limit <= 0:
            where = lim.source if lim is not None else "the Redis memory"
            warnings.append(f"campaign {cid}: {where} is unbounded (maxmemory 0): its retention needs "
                            f"{_size(needs[cid].total)} ({needs[cid].formula()}), and Redis (noeviction) refuses "
                            f"writes once the host's memory is gone; set maxmemory (or LDP_REDIS_MEMORY_BYTES) so "
                            f"that the worker checks it")
            continue
        by_node.setdefault((lim.node, lim.limit, lim.source), []).append(cid)
    problems: list[str] = []
    for (node, limit, source), cids in by_node.items():
        usable = int(limit * MEMORY_FRACTION)
        total = sum(needs[cid].total for cid in cids)
        if total <= usable:
            continue
        for cid in cids:
            need = needs[cid]
            others = total - need.total
            fits = max(0, (usable - others - need.own_total) // max(need.step_bytes, 1))
            shared = (f" next to {', '.join(x for x in cids if x != cid)} ({others:,} B) on the same Redis"
                      if others else "")
            raise_to = math.ceil(total / MEMORY_FRACTION)
            problems.append(
                f"campaign {cid}: {need.formula()}{shared}, over {MEMORY_FRACTION:.0%} of the Redis memory, "
                f"{limit:,} B ({_size(limit)}, {source}), i.e. {usable:,} B for retained steps. Lower "
                f"retention_steps in its campaign file ([campaign]) to {fits:,} or less"
                + (" (the other campaigns alone do not fit)" if fits == 0 else "")
                + f", or raise Redis maxmemory to {raise_to:,} B ({_size(raise_to)}) or more"
                + (" (LDP_REDIS_MEMORY_BYTES too)" if source == "LDP_REDIS_MEMORY_BYTES" else "")
                + (f", or assume fewer batches per step (LDP_RETENTION_BATCHES_PER_STEP, now {batches_per_step})"
                   if batches_per_step > 1 else ""))
    if problems:
        raise RetentionTooLarge("the campaigns' retention does not fit the Redis memory (a full Redis refuses "
                                "every write: noeviction): " + " | ".join(problems))
    return warnings


def _config_max_memory(client: object, **target: object) -> tuple[int, str]:
    """``(maxmemory, how it was read)`` of one node: ``CONFIG GET``, else ``INFO memory``."""
    try:
        raw = client.config_get("maxmemory", **target)  # type: ignore[attr-defined]
        return int(raw["maxmemory"]), "CONFIG GET maxmemory"
    except Exception as config_error:  # noqa: BLE001 - CONFIG renamed or forbidden (managed Redis): INFO has it
        try:
            info = client.info("memory", **target)  # type: ignore[attr-defined]
            return int(info["maxmemory"]), "INFO memory"
        except Exception:  # noqa: BLE001
            raise config_error from None


def read_max_memory(url: str, campaign_ids: Iterable[str], timeout: float = 5.0) -> dict[str, MemoryLimit]:
    """The memory of the Redis node holding each campaign (one node: the same for all; a cluster: the master of
    the campaign's slot), read within ``timeout`` seconds; raises the client's error if Redis does not answer."""
    from wire.transport import redact_url

    deadline = time.monotonic() + timeout
    ids = list(campaign_ids)
    while True:
        wait = min(2.0, timeout)
        client = connect_sync(url, socket_connect_timeout=wait, socket_timeout=wait)
        try:
            if not is_cluster_url(url):
                limit, how = _config_max_memory(client)
                return {cid: MemoryLimit(limit, f"maxmemory of {redact_url(url)} ({how})", redact_url(url))
                        for cid in ids}
            out: dict[str, MemoryLimit] = {}
            for cid in ids:
                node = client.get_node_from_key(epoch_key(cid))  # type: ignore[union-attr]
                limit, how = _config_max_memory(client, target_nodes=node)
                out[cid] = MemoryLimit(limit, f"maxmemory of cluster master {node.name} ({how})", node.name)
            return out
        except Exception:  # noqa: BLE001 - retried until the deadline, then the caller reports it
            if time.monotonic() + 0.5 > deadline:
                raise
            time.sleep(0.5)
        finally:
            client.close()

