"""Every Redis key format of the count store, defined once.

The braces are a Redis Cluster hash tag: all keys of a campaign live in one slot, so one script may touch
them together. Keys of a campaign ``<c>`` and attribute ``<a>``:

* ``ldp:{<c>}:<a>:<t>``: hash, the typed step vector of step ``t`` and its state (fields: :mod:`.counts`);
* ``ldp:{<c>}:<a>:steps``: sorted set of the steps ``t`` of an attribute (score ``t``);
* ``ldp:{<c>}:<a>:estimates``: hash ``t -> JSON`` of the final estimates (the history);
* ``ldp:{<c>}:<a>:latest``: JSON of the latest estimate (highest ``t``);
* ``ldp:{<c>}:<a>:closed_ts``: hash ``t -> wall-clock time its watermark was applied``;
* ``ldp:{<c>}:<a>:finals``: hash ``t -> "<n>:<revision>"`` of the published finals (``revision`` -1 is never stored);
* ``ldp:{<c>}:<a>:touched``: sorted set, step ``t`` -> how many batches were applied to it since the estimator
  last looked (late data);
* ``ldp:{<c>}:<a>:floor``: the retention floor (absent: 0): steps below it are expired;
* ``ldp:{<c>}:<a>:pruned``: hash ``count`` / ``max`` of the steps pruned from the step index;
* ``ldp:{<c>}:<a>:pending``: hash ``t -> revision`` of the claimed finals not yet confirmed published;
* ``ldp:{<c>}:epoch``: the campaign's store epoch, a random id written once (gone: Redis lost data);
* ``ldp:{<c>}:server``: the campaign's server marker (:mod:`.connection`: a restarted server);
* ``ldp:{<c>}:cursor``: hash ``<app_id>|<topic>:<partition> -> <offset>|<ident>``, the campaign's last message
  from each partition that the store holds (set by the apply scripts with the counts);
* ``ldp:{<c>}:newest-final``: the campaign's newest final logical step (the step bound's reference);
* ``ldp:{<c>}:fence:<app_id>``: the highest fencing token of the app's lease that claimed a final of the campaign.

Keys of a consumer group ``<app_id>``: ``ldp:positions:<app_id>`` (hash ``<topic>:<partition> ->
<offset>|<ident>``, the last message of each partition a worker handled), ``ldp:{estimator:<app_id>}:lease``
(``<holder>|<fencing token>``) and ``:fence`` (the token counter), ``ldp:estimates-read:<app_id>`` (hash
``partition -> offset`` of ``ldp.estimates`` known to the store), and the pub/sub channel
``ldp:estimator-wake:<app_id>``.

Keys of the HTTP ingest (:mod:`.ingest_ledger`): ``ldp:rate:<c>:<t>:<slot>`` (a rate-limit slot: ``slot`` is a
keyed per-step hash of device and attribute, never a device id; no hash tag, so the slots spread over a
cluster) and ``ldp:request:<id>`` (an idempotency record); the revoked tokens ``ldp:{revoked}:tokens`` (sorted
set: a keyed hash of a token's id -> the token's expiry) and ``ldp:{revoked}:version`` (incremented at every
revocation: the ingest reads the set again when it changes).
"""
from __future__ import annotations

__all__ = ["closed_ts_key", "count_key", "cursor_key", "epoch_key", "estimates_key", "estimates_read_key",
           "fence_counter_key", "fence_key", "finals_key", "floor_key", "latest_key", "lease_key", "newest_final_key",
           "loss_marks_key", "pending_key", "positions_key", "pruned_key", "rate_slot_key", "request_key", "revoked_tokens_key",
           "revoked_version_key", "server_marker_key", "step_reports_key", "steps_key", "touched_key", "wake_channel"]


def _attribute_prefix(campaign: str, attribute: str) -> str:
    return f"ldp:{{{campaign}}}:{attribute}"


def count_key(campaign: str, attribute: str, t: int) -> str:
    """Hash of the support counts of step ``t``."""
    return f"{_attribute_prefix(campaign, attribute)}:{t}"


#: suffix of a step's count key that names its report log (``step_reports_key``; the Lua scripts append it)
REPORTS_SUFFIX = ":reports"


def step_reports_key(campaign: str, attribute: str, t: int) -> str:
    """String of the packed reports of step ``t`` counted so far (kept only for an attribute whose poisoning
    defense runs over the step's reports: ``defense = "itemset"``)."""
    return count_key(campaign, attribute, t) + REPORTS_SUFFIX


def steps_key(campaign: str, attribute: str) -> str:
    """Sorted set of the steps of an attribute."""
    return f"{_attribute_prefix(campaign, attribute)}:steps"


def estimates_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> JSON`` of the final estimates."""
    return f"{_attribute_prefix(campaign, attribute)}:estimates"


def latest_key(campaign: str, attribute: str) -> str:
    """JSON of the latest estimate (highest ``t``) of an attribute (for ``GET /estimates``)."""
    return f"{_attribute_prefix(campaign, attribute)}:latest"


def closed_ts_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> wall-clock time the watermark was applied`` (written by the agent)."""
    return f"{_attribute_prefix(campaign, attribute)}:closed_ts"


def finals_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> "<n>:<revision>"`` of the published final estimates."""
    return f"{_attribute_prefix(campaign, attribute)}:finals"


def touched_key(campaign: str, attribute: str) -> str:
    """Sorted set of the steps that got batches since the estimator last looked (score: how many)."""
    return f"{_attribute_prefix(campaign, attribute)}:touched"


def floor_key(campaign: str, attribute: str) -> str:
    """The retention floor of an attribute: steps below it are expired (absent: 0)."""
    return f"{_attribute_prefix(campaign, attribute)}:floor"


def pruned_key(campaign: str, attribute: str) -> str:
    """Hash ``count`` / ``max`` of the steps pruned from an attribute's step index."""
    return f"{_attribute_prefix(campaign, attribute)}:pruned"


def epoch_key(campaign: str) -> str:
    """The campaign's store epoch: a random id written once; if it vanishes or changes, Redis lost data."""
    return f"ldp:{{{campaign}}}:epoch"


def newest_final_key(campaign: str) -> str:
    """The campaign's newest final logical step (absent before the first): the reference of the step bound."""
    return f"ldp:{{{campaign}}}:newest-final"


def cursor_key(campaign: str) -> str:
    """Hash ``<app_id>|<topic>:<partition> -> <offset>|<message ident>``: the campaign's last message from each
    partition whose effects the store holds (written by the apply scripts, in the campaign's slot)."""
    return f"ldp:{{{campaign}}}:cursor"


def server_marker_key(campaign: str) -> str:
    """The campaign's server marker: a random token the apply scripts compare (module doc of :mod:`.connection`);
    a new one after the server restarted or lost data."""
    return f"ldp:{{{campaign}}}:server"


def positions_key(app_id: str) -> str:
    """Hash ``<topic>:<partition> -> <offset>|<message ident>`` of a consumer group's handled messages."""
    return f"ldp:positions:{app_id}"


def loss_marks_key(app_id: str) -> str:
    """Hash ``<topic>:<partition>:<campaign> -> <stream step>|<why>`` of a consumer group: an unrepairable broker loss
    whose lost steps are marked when the partition's next message of the campaign is read, by whichever worker owns
    the partition then (a rebalance after the loss moves it)."""
    return f"ldp:lossmarks:{app_id}"


def lease_key(app_id: str) -> str:
    """The estimator lease of a consumer group (value ``<holder>|<fencing token>``)."""
    return f"ldp:{{estimator:{app_id}}}:lease"


def fence_counter_key(app_id: str) -> str:
    """The counter the estimator lease's fencing tokens are drawn from (in the lease's slot)."""
    return f"ldp:{{estimator:{app_id}}}:fence"


def fence_key(campaign: str, app_id: str) -> str:
    """The highest fencing token of ``app_id``'s estimator lease that claimed a final of the campaign: an older
    holder's claims are refused. Per consumer group: each has its own lease and its own tokens."""
    return f"ldp:{{{campaign}}}:fence:{app_id}"


def pending_key(campaign: str, attribute: str) -> str:
    """Hash ``t -> revision`` of the finals claimed whose publication was not confirmed yet."""
    return f"{_attribute_prefix(campaign, attribute)}:pending"


def estimates_read_key(app_id: str) -> str:
    """Hash ``partition -> offset``: how far the finals on ``ldp.estimates`` are known to the store."""
    return f"ldp:estimates-read:{app_id}"


def wake_channel(app_id: str) -> str:
    """Pub/sub channel that wakes the estimator of a consumer group."""
    return f"ldp:estimator-wake:{app_id}"


def rate_slot_key(campaign: str, t: int, slot: bytes) -> str:
    """The ingest's rate-limit slot of one report: ``slot`` is a keyed hash, never a device id (no hash tag: the
    slots spread over a cluster's nodes)."""
    return f"ldp:rate:{campaign}:{int(t)}:{slot.hex()}"


def request_key(request: bytes) -> str:
    """The ingest's idempotency record of a request (``request``: a keyed hash of credential and key)."""
    return f"ldp:request:{request.hex()}"


def revoked_tokens_key() -> str:
    """Sorted set of the revoked tokens (member: a keyed hash of a token id, score: the token's expiry)."""
    return "ldp:{revoked}:tokens"


def revoked_version_key() -> str:
    """The revocation list's version, incremented at every revocation (same hash tag as the set)."""
    return "ldp:{revoked}:version"
