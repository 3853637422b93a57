"""The count store: the only package of the project that speaks Redis.

Everything the pipeline keeps in Redis is defined here and read or written through :class:`CountStore`
methods named after what they mean. One module per concern:

* :mod:`.keys`: every key format (hash tags, layout);
* :mod:`.connection`: URLs, one node or a cluster, the Lua scripts (``lua/*.lua``, read once), the server's
  identity (a restarted or replaced Redis, detected without a command per batch);
* :mod:`.counts`: the apply of batches and watermarks, the batch ledger, the typed step vectors;
* :mod:`.positions`: consumer positions and the campaigns' cursors;
* :mod:`.estimates`: the step index as the estimator reads it, the history, the finals;
* :mod:`.retention`: touched marks, the retention floor, pruning;
* :mod:`.lease`: the estimator lease, fencing tokens and fences, wake-ups;
* :mod:`.ingest_ledger`: what the HTTP ingest stores (rate-limit slots, idempotency records);
* :mod:`.revocations`: the ingest's revoked tokens.

:class:`CountStore` is composed of one class per module, as redis-py composes its client from command
classes; the rest of the project uses it (and the names below) only.
"""
from __future__ import annotations

from .connection import (CLUSTER_SCHEMES, RETRYABLE_ERRORS, StoreConnection, _cluster_seeds, cluster_url, connect,
                         connect_sync, is_cluster_url)
from .counts import (ALREADY_CLOSED, APPLIED, DUPLICATE_BATCH_ID, EXPIRED, FUTURE_STEP, SERVER_CHANGED, STORE_RESET,
                     Counts, StepBound, StepState, VectorType, read_step_sync)
from .estimates import CLAIM_EXISTS, CLAIM_STALE, CLAIMED, Estimates
from .ingest_ledger import IngestClaim, IngestLedger, LedgerEntry, RateSlot, RequestRecord
from .keys import (closed_ts_key, count_key, cursor_key, epoch_key, estimates_key, estimates_read_key,
                   fence_counter_key, fence_key, finals_key, floor_key, latest_key, lease_key, newest_final_key,
                   pending_key, positions_key, pruned_key, rate_slot_key, request_key, revoked_tokens_key,
                   revoked_version_key, server_marker_key, step_reports_key, steps_key, touched_key, wake_channel)
from .lease import Lease, WakeUps
from .positions import Position, Positions
from .retention import Retention
from .revocations import Revocations

__all__ = ["ALREADY_CLOSED", "APPLIED", "CLAIMED", "CLAIM_EXISTS", "CLAIM_STALE", "CLUSTER_SCHEMES", "CountStore",
           "DUPLICATE_BATCH_ID", "EXPIRED", "FUTURE_STEP", "IngestClaim", "LedgerEntry", "Position",
           "RETRYABLE_ERRORS", "RateSlot", "RequestRecord", "SERVER_CHANGED", "STORE_RESET", "StepBound",
           "StepState", "VectorType", "WakeUps", "closed_ts_key", "cluster_url", "connect", "connect_sync",
           "count_key", "cursor_key", "epoch_key", "estimates_key", "estimates_read_key", "fence_counter_key",
           "fence_key", "finals_key", "floor_key", "is_cluster_url", "latest_key", "lease_key", "newest_final_key",
           "pending_key", "positions_key", "pruned_key", "rate_slot_key", "read_step_sync", "request_key",
           "revoked_tokens_key", "revoked_version_key", "Revocations",
           "server_marker_key", "step_reports_key", "steps_key", "touched_key", "wake_channel"]


class CountStore(Counts, Positions, Estimates, Retention, Lease, IngestLedger, Revocations, StoreConnection):
    """Async access to the step vectors, positions, estimates, retention, the estimator lease and the ingest
    ledger and its revocation list (one class per concern, module doc)."""

    @classmethod
    def from_url(cls, url: str) -> "CountStore":
        """A store on one Redis node or on a Redis Cluster (``redis+cluster://host:port,...``; see :func:`connect`)."""
        return cls(connect(url))
