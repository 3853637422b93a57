"""Campaigns: what both sides of the pipeline must agree on, loaded from one TOML file.

```toml
[campaign]
id = "fleet-health"          # [A-Za-z0-9_.-]{1,64}
time_step_seconds = 10.0     # length of one time step t
lateness_seconds = 2.0       # how long a closed step still accepts reports
max_batch_reports = 1000000  # a larger batch is rejected ("oversized")
retention_steps = 60480      # steps kept in Redis (default: 7 days of steps, see below)
max_steps_ahead = 1000       # how far past the newest final step a batch's step may be (see below)
min_n = 10                   # fewer reports: a step's estimate is published "insufficient", without frequencies

[[attributes]]
name = "app_version"         # [A-Za-z0-9_.-]{1,64}
k = 100
protocol = "L-OSUE"          # any name of estimators.PROTOCOLS
eps_inf = 2.0                # the protocol's own parameters (estimators.make keywords)
eps_1 = 1.0
labels = ["v1.0", ...]       # optional, k labels for dashboards
defense = "itemset"          # optional poisoning defense of the stream app: "none" (default), "plausibility", "itemset"

[[attributes]]
name = "session_seconds"     # a numeric metric: its mean (and, for SW, its distribution) per step
type = "numeric"             # "categorical" (the default) or "numeric"
range = [0.0, 600.0]         # [lo, hi]: values outside are clipped to the nearest end (the device counts them)
mechanism = "PM"             # any name of estimators.numeric.MECHANISMS
eps = 1.0                    # the mechanism's parameters (estimators.numeric.make_numeric keywords)

[[attributes]]
name = "crash_signature"     # an open-domain attribute: values nobody listed in advance
type = "string"              # a string (its id: value_id, the first 8 bytes of its SHA-256), or "u64" (an integer)
protocol = "CMS"             # any name of estimators.sketch.OPEN_PROTOCOLS
eps = 4.0                    # the protocol's parameters (estimators.sketch.make_open keywords); seed: below
top = 10                     # items in each estimate's top-K (default 10)
candidates = ["...", ...]    # optional: values whose frequencies every estimate carries, and names of found items

[[groups]]                   # a multidimensional solution over several attributes, one total budget
name = "device"              # [A-Za-z0-9_.-]{1,64}
solution = "ALLOMFREE"       # any name of estimators.SOLUTIONS
attributes = ["os", "country", "model"]   # declared in [[attributes]] with name, k, labels only
eps_inf = 2.0                # the solution's parameters (estimators.make_solution keywords)
eps_1 = 1.0
```

A numeric attribute (``type = "numeric"``; ``estimators.numeric``) has a ``range``, a ``mechanism`` and its
parameters instead of ``k`` and ``protocol``; its protocol is the mechanism behind the protocol contract
(:class:`estimators.numeric.protocol.NumericProtocol`: one report is one integer code, the support counts are the
mechanism's exact aggregate). It belongs to no group, has no labels and no poisoning defense.

An open-domain attribute (``type = "string"`` or ``"u64"``; ``estimators.sketch``) reports values nobody
listed: a device sends its value's 64-bit id through a sketch (CMS, HCMS: frequencies of candidate values) or a
heavy-hitter protocol (TreeHist: the top items found without a list), whose support counts are a fixed-size sketch
matrix. Its ``seed`` (the public seed of the protocol's hash rows) defaults to the attribute name's id
(``value_id(name)``), so two attributes never share hash rows by accident. ``top`` items (default 10, at most
1000) are published per step; ``candidates`` (at most 10,000, strings for ``"string"``, integers in
``[0, 2^64)`` for ``"u64"``) are estimated in every step and name the items found. It belongs to no group and has
no labels and no poisoning defense.

An attribute of a group has no protocol and no budget of its own: the group's solution spends one
budget over all its attributes (``estimators.multidim``), so an attribute that declares its own
protocol or ε, or appears in two groups, is refused (its budget would be spent twice). Each attribute
of a group gets the solution's server-side view of it (``solution.attribute_protocol(j)``) as its
protocol: its reports, support counts, estimator, variance and privacy figures are the solution's.

A solution with fake data (RS+FD, L-RS+FD, ALLOMFREE with ``fake_data = true``) must say
``amplification = "paper"`` or ``"none"``: with the paper's amplified budget a device's whole tuple
of reports is ``ln(d(e^eps - 1) + 1)``-LDP, not ``eps``-LDP (``eps`` holds against a change of one
attribute), so the campaign states which one it means and the estimates publish the tuple-level figure.

Poisoning defenses (``defense``, per attribute; Cao, Jia & Gong, USENIX Security 2021; see
``estimators.poisoning``) are server-side: they change what the stream app counts, never what a device
sends, so they are not part of the fingerprint. ``"none"`` counts every valid report (the per-step score
only flags). ``"plausibility"`` (unary protocols: SUE, OUE and the L-UE chains) drops each report whose number
of set bits is implausible for an honest device, at the ingest (the request is refused) and in the worker
(the report is not counted, the step's ``n_rejected`` says how many), and estimates with the law of the kept
reports, so honest data stay unbiased. ``"itemset"`` adds, when a step becomes final, the co-support itemset
detection over the step's reports (unary) or the seed-collision detection (local hashing: BLH, OLH); the
worker keeps the step's reports in the count store until then. Direct encoding (GRR, L-GRR), LOLOHA and the
attributes of a group have no sound report-level defense: only ``"none"`` is accepted (``docs/privacy.md``).

The campaign fingerprint (a hash of the id, the step length and each attribute's protocol
parameters) identifies the data contract; each attribute's protocol fingerprint travels in every
batch envelope and is checked by the stream app, so a producer with other parameters is
rejected, never counted. Server-side settings (``lateness_seconds``, ``max_batch_reports``,
``retention_steps``, ``max_steps_ahead``, ``min_n``, labels, description) are not part of it: devices and fleets
store the fingerprint in their state directories, and changing how long the server keeps counts must not
invalidate them.

Retention (``retention_steps``, R): the stream app keeps the counts, the step index and the
estimate history of the R most recent *final* steps of each attribute (and every step not final
yet): once an attribute has more, the steps below its R-th newest final step are deleted and
batches for them are refused as expired. It is a number of steps, not of seconds: simulated
fleets number their steps 0, 1, 2, ... at any pace, and Redis memory grows with the number of
steps kept (README, "Retention"), so a step count bounds it for logical and wall-clock steps
alike; counting final steps (not step numbers) means a gap, a wall-clock step among logical ones
or a far-future ``t`` deletes nothing early. The default is 7 days of steps,
``ceil(604800 / time_step_seconds)``. An attribute may set its own ``retention_steps`` (its table), which
replaces the campaign's for it: an open-domain attribute's sketch is much larger than a histogram, so it is
usually kept for fewer steps.

Steps bounded in time (``max_steps_ahead``, A, default 1000): a batch or watermark of a logical step
more than A steps past the campaign's newest final step, or of a wall-clock step (the HTTP ingest's)
more than A steps past the current wall-clock step, is rejected as ``future_step`` and never counted,
so it can neither open a step nobody will close nor move the retention floor. Before a campaign's
first final (and after a store loss, until the worker rebuilt the finals from ``ldp.estimates``)
logical steps are not bounded: no reference is known yet.

Minimum ``n`` (``min_n``, default :data:`DEFAULT_MIN_N`): an estimate of a step over fewer reports is published
with ``status = "insufficient"`` and no frequencies, variance or confidence interval (``docs/estimates.md``): a
final of one report is one device's randomized answer, debiased alone (``[1.58, -0.58]`` for a binary GRR at
ε = 1). Server-side, like the retention: not part of the fingerprint.

Lateness (``lateness_seconds``) is the *grace* after stream time passes a step: a step without a
watermark becomes final once a later step's data was counted (a logical step), or its wall-clock
window ended (a wall-clock step), plus the lateness, and only when the count store holds everything
the broker had by then (``stream_app.windows``).

:func:`step_at` is the time step of a wall-clock time, ``t = floor(now / time_step_seconds)``:
the step a device SDK stamps on a report and the stream app's HTTP ingest assumes when a report
carries none.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from estimators.base import FrequencyProtocol
from estimators.errors import LDPError
from estimators.multidim import Solution
from estimators.numeric import MECHANISMS, make_numeric
from estimators.numeric.protocol import NumericProtocol
from estimators.registry import make
from estimators.sketch.base import OpenDomainProtocol
from estimators.sketch.hashing import value_id
from estimators.sketch.registry import OPEN_PROTOCOLS, make_open
from estimators.solution_registry import make_solution

__all__ = ["ATTRIBUTE_TYPES", "Attribute", "Campaign", "CampaignError", "DEFENSES", "Group", "DEFAULT_MIN_N", "DEFAULT_RETENTION_SECONDS",
           "default_retention_steps", "load_campaigns", "step_at"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_CAMPAIGN_KEYS = {"id", "time_step_seconds", "lateness_seconds", "max_batch_reports", "retention_steps",
                  "max_steps_ahead", "min_n", "description"}
#: The shortest time step: the wall-clock step ``floor(now / time_step_seconds)`` must fit the envelope's
#: 32-bit ``t`` (``2**32 - 1`` steps of 1 s reach the year 2106; 0.1 s steps overflowed in 1983).
MIN_TIME_STEP_SECONDS = 1.0
#: The default ``min_n``: fewer reports than this and a step's estimate is ``insufficient`` (docs/estimates.md).
DEFAULT_MIN_N = 10
#: What the default ``retention_steps`` keeps: 7 days of steps.
DEFAULT_RETENTION_SECONDS = 7 * 86400


def default_retention_steps(time_step_seconds: float) -> int:
    """The default ``retention_steps``: :data:`DEFAULT_RETENTION_SECONDS` worth of steps (at least 1)."""
    return max(1, math.ceil(DEFAULT_RETENTION_SECONDS / time_step_seconds))


class CampaignError(LDPError):
    """A campaign file that cannot be used."""


@dataclass(frozen=True)
class Attribute:
    """One attribute of a campaign and its protocol."""

    name: str
    k: int
    protocol: FrequencyProtocol
    labels: tuple[str, ...] = ()
    group: str | None = None  # the multidimensional group whose solution reports this attribute
    defense: str = "none"  # the stream app's poisoning defense (module doc): one of DEFENSES
    value_type: str = "categorical"  # one of ATTRIBUTE_TYPES
    top: int = 0  # an open-domain attribute: items in each estimate's top-K
    candidates: tuple[str | int, ...] = ()  # an open-domain attribute: values estimated in every step
    retention_steps: int | None = None  # its own retention (module doc), else the campaign's

    def label(self, v: int) -> str:
        return self.labels[v] if self.labels else str(v)

    @property
    def open_domain(self) -> bool:
        """Whether values are open-domain strings or 64-bit integers (``type = "string"`` or ``"u64"``)."""
        return isinstance(self.protocol, OpenDomainProtocol)

    def value_id(self, value: str | int) -> int:
        """An open-domain value's 64-bit id (a string for ``"string"``, an integer for ``"u64"``)."""
        if self.value_type == "u64":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
                raise CampaignError(f"attribute {self.name!r} takes integers in [0, 2^64), got {value!r}")
        elif not isinstance(value, str):
            raise CampaignError(f"attribute {self.name!r} takes strings, got {value!r}")
        return value_id(value)

    def candidate_ids(self) -> np.ndarray:
        """An open-domain attribute's candidates' ids, ``uint64`` in the campaign's order (computed once)."""
        ids = self.__dict__.get("_candidate_ids")
        if ids is None:
            ids = np.array([value_id(c) for c in self.candidates], dtype=np.uint64)
            self.__dict__["_candidate_ids"] = ids
        return ids

    def candidate_names(self) -> dict[int, str | int]:
        """An open-domain attribute's candidates by the item of their id (what names a found item; the first
        candidate of an item where several share it)."""
        if not self.candidates:
            return {}
        items = self.protocol.items_of(self.candidate_ids())  # type: ignore[attr-defined]
        out: dict[int, str | int] = {}
        for i, c in zip(items, self.candidates):
            out.setdefault(int(i), c)
        return out

    @property
    def numeric(self) -> bool:
        """Whether the attribute is a numeric metric (``type = "numeric"``): a mean, not a histogram."""
        return isinstance(self.protocol, NumericProtocol)


#: the poisoning defenses an attribute may name (module doc)
DEFENSES = ("none", "plausibility", "itemset")
#: the kinds of attribute (``type``)
ATTRIBUTE_TYPES = ("categorical", "numeric", "string", "u64")
#: the most items an open-domain attribute publishes per step, and the most candidates it lists
MAX_TOP, MAX_CANDIDATES = 1000, 10_000


def _numeric_attribute(name: str, spec: dict[str, Any], labels: tuple[str, ...], defense: Any) -> Attribute:
    """A ``type = "numeric"`` attribute (module doc) from its table without ``name`` and ``type``."""
    spec = dict(spec)
    if labels:
        raise CampaignError(f"attribute {name!r} is numeric: it has no labels")
    if defense != "none":
        raise CampaignError(f"attribute {name!r} is numeric: no report-level poisoning defense applies to a "
                            f"mean (a clipped range bounds what one report can shift); only defense = \"none\"")
    for key in ("k", "protocol"):
        if key in spec:
            raise CampaignError(f"attribute {name!r} is numeric: it has a range and a mechanism, not {key!r}")
    rng = spec.pop("range", None)
    if (not isinstance(rng, list) or len(rng) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rng)):
        raise CampaignError(f"attribute {name!r} needs range = [lo, hi] (two numbers), got {rng!r}")
    mech = spec.pop("mechanism", None)
    if mech not in MECHANISMS:
        raise CampaignError(f"attribute {name!r} needs a mechanism, one of {', '.join(MECHANISMS)}; got {mech!r}")
    try:
        proto = NumericProtocol(make_numeric(mech, lo=float(rng[0]), hi=float(rng[1]), **spec))
    except (LDPError, TypeError) as exc:
        raise CampaignError(f"attribute {name!r}: {exc}") from exc
    return Attribute(name, proto.k, proto, value_type="numeric")


def _open_attribute(name: str, kind: str, spec: dict[str, Any], labels: tuple[str, ...], defense: Any) -> Attribute:
    """A ``type = "string"`` or ``"u64"`` attribute (module doc) from its table without ``name`` and ``type``."""
    spec = dict(spec)
    if labels:
        raise CampaignError(f"attribute {name!r} is open-domain ({kind}): it has no labels (name values with "
                            f"candidates)")
    if defense != "none":
        raise CampaignError(f"attribute {name!r} is open-domain: no report-level poisoning defense applies to a "
                            f"sketch; only defense = \"none\"")
    if "range" in spec or "mechanism" in spec:
        raise CampaignError(f"attribute {name!r} is open-domain: it has a protocol, its parameters, top and "
                            f"candidates, not range or mechanism")
    proto_name = spec.pop("protocol", None)
    if proto_name not in OPEN_PROTOCOLS:
        raise CampaignError(f"attribute {name!r} needs an open-domain protocol, one of {', '.join(OPEN_PROTOCOLS)}; "
                            f"got {proto_name!r}")
    top = spec.pop("top", 10)
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP:
        raise CampaignError(f"attribute {name!r}: top must be an integer in [1, {MAX_TOP}], got {top!r}")
    cands = spec.pop("candidates", [])
    if not isinstance(cands, list) or len(cands) > MAX_CANDIDATES:
        raise CampaignError(f"attribute {name!r}: candidates must be a list of at most {MAX_CANDIDATES} values")
    for c in cands:
        ok = isinstance(c, str) if kind == "string" else \
            (isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 64)
        if not ok:
            want = "string" if kind == "string" else "integer in [0, 2^64)"
            raise CampaignError(f"attribute {name!r}: candidate {c!r} is not a {want}")
    if len(set(cands)) != len(cands):
        raise CampaignError(f"attribute {name!r}: a candidate is listed twice")
    spec.setdefault("seed", value_id(name))
    try:
        proto = make_open(proto_name, **spec)
    except LDPError as exc:
        raise CampaignError(f"attribute {name!r}: {exc}") from exc
    return Attribute(name, proto.support_size, proto, value_type=kind, top=top, candidates=tuple(cands))


def _check_defense(name: str, proto: FrequencyProtocol, defense: Any) -> str:
    """The attribute's ``defense`` if its protocol has it (module doc), else a :class:`CampaignError` saying why."""
    from estimators.hashing import LOLOHA
    from estimators.poisoning import family

    if defense not in DEFENSES:
        raise CampaignError(f"attribute {name!r}: defense must be one of {', '.join(DEFENSES)}, got {defense!r}")
    if defense == "none":
        return defense
    fam = family(proto)
    if fam == "direct" or fam is None or isinstance(proto, LOLOHA):
        raise CampaignError(
            f"attribute {name!r}: {proto.name} has no sound report-level poisoning defense (a report of direct "
            f"encoding is a single value; LOLOHA's seed test would drop a third or more of honest reports); only "
            f"defense = \"none\": what bounds the attack is the number of fake devices, i.e. one device token per "
            f"attested device (docs/privacy.md, \"Poisoning\")")
    if defense == "plausibility" and fam != "unary":
        raise CampaignError(f"attribute {name!r}: the plausibility check applies to unary reports (SUE, OUE, the "
                            f"L-UE chains); {proto.name} can use defense = \"itemset\"")
    return defense


@dataclass(frozen=True)
class Group:
    """Attributes reported together by one multidimensional solution with one total budget."""

    name: str
    solution: Solution
    attributes: tuple[str, ...]  # in the solution's order (attribute j of the solution)


@dataclass(frozen=True)
class Campaign:
    """A campaign: its id, attributes, time-step length, lateness, batch limit, retention and minimum n (module doc).

    ``retention_steps=None`` means the default, 7 days of steps (:func:`default_retention_steps`)."""

    id: str
    attributes: dict[str, Attribute]
    time_step_seconds: float = 10.0
    lateness_seconds: float = 2.0
    max_batch_reports: int = 1_000_000
    description: str = ""
    source: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    groups: dict[str, Group] = field(default_factory=dict)
    # None (the default) is replaced by default_retention_steps(time_step_seconds) in __post_init__
    retention_steps: int = None  # type: ignore[assignment]
    max_steps_ahead: int = 1000
    min_n: int = DEFAULT_MIN_N

    def __post_init__(self) -> None:
        if self.retention_steps is None:
            object.__setattr__(self, "retention_steps", default_retention_steps(self.time_step_seconds))
        elif isinstance(self.retention_steps, bool) or not isinstance(self.retention_steps, int) \
                or self.retention_steps < 1:
            raise CampaignError(f"retention_steps must be an integer >= 1 (the number of steps kept, counted back "
                                f"from the newest final step), got {self.retention_steps!r}")
        if isinstance(self.max_steps_ahead, bool) or not isinstance(self.max_steps_ahead, int) \
                or self.max_steps_ahead < 1:
            raise CampaignError(f"max_steps_ahead must be an integer >= 1 (how many steps past the newest final step "
                                f"a batch may be), got {self.max_steps_ahead!r}")
        if isinstance(self.min_n, bool) or not isinstance(self.min_n, int) or self.min_n < 1:
            raise CampaignError(f"min_n must be an integer >= 1 (the fewest reports a step's estimate is published "
                                f"with frequencies), got {self.min_n!r}")

    @property
    def fingerprint(self) -> str:
        """The data contract's hash (id, step length, protocol parameters; not the server-side settings)."""
        spec = {"id": self.id, "time_step_seconds": self.time_step_seconds,
                "attributes": {a.name: a.protocol.params() for a in self.attributes.values()}}
        if self.groups:
            spec["groups"] = {g.name: {"solution": g.solution.params(), "attributes": list(g.attributes)}
                              for g in self.groups.values()}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    def sample_reports(self, devices: int) -> dict[str, np.ndarray]:
        """``attribute -> reports`` of ``devices`` devices holding value 0, randomized with the OS CSPRNG (no
        simulation mode): an attribute's own protocol, a group's attributes through its solution (a sampling
        solution sends each attribute for part of the devices only, possibly none). Report-shaped samples for
        kernel warm-ups and size bounds."""
        out: dict[str, np.ndarray] = {}
        for g in self.groups.values():
            sol = g.solution
            out.update(zip(g.attributes, sol.randomize(np.zeros((devices, sol.d), dtype=np.int64), None,
                                                       state=sol.new_state(devices)).reports))
        for name in self.ungrouped:
            p = self.attributes[name].protocol
            out[name] = p.randomize(np.zeros(devices, dtype=np.int64), None, state=p.new_state(devices))
        return out

    @property
    def ungrouped(self) -> list[str]:
        """The attributes reported by their own protocol (not by a group's solution)."""
        return [a.name for a in self.attributes.values() if a.group is None]

    def retention_of(self, attribute: Attribute) -> int:
        """The steps kept of ``attribute``: its own ``retention_steps``, else the campaign's."""
        return attribute.retention_steps or self.retention_steps

    def attribute(self, name: str) -> Attribute:
        try:
            return self.attributes[name]
        except KeyError:
            raise CampaignError(f"campaign {self.id!r} has no attribute {name!r}") from None

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Campaign":
        head = data.get("campaign")
        if not isinstance(head, dict):
            raise CampaignError("a campaign file needs a [campaign] table")
        unknown = set(head) - _CAMPAIGN_KEYS
        if unknown:
            raise CampaignError(f"unknown [campaign] keys: {', '.join(sorted(unknown))}")
        cid = head.get("id")
        if not isinstance(cid, str) or not _NAME.match(cid):
            raise CampaignError(f"campaign id must match {_NAME.pattern}, got {cid!r}")
        step = float(head.get("time_step_seconds", 10.0))
        late = float(head.get("lateness_seconds", 2.0))
        max_batch = int(head.get("max_batch_reports", 1_000_000))
        if step < MIN_TIME_STEP_SECONDS:
            raise CampaignError(f"time_step_seconds must be >= {MIN_TIME_STEP_SECONDS:g}, got {step:g}: the wall-clock step "
                                f"floor(now / time_step_seconds) of a report without t must fit the envelope's 32-bit "
                                f"t (with 1 s steps, until the year 2106)")
        if step <= 0 or late < 0 or max_batch < 1:
            raise CampaignError("time_step_seconds > 0, lateness_seconds >= 0 and max_batch_reports >= 1 are required")
        raw = data.get("attributes")
        if not isinstance(raw, list) or not raw:
            raise CampaignError("a campaign needs at least one [[attributes]] entry")
        groups_raw = data.get("groups", [])
        if not isinstance(groups_raw, list):
            raise CampaignError("groups must be an array of tables ([[groups]])")
        member_of: dict[str, str] = {}
        for g in groups_raw:
            gname = g.get("name") if isinstance(g, dict) else None
            if not isinstance(gname, str) or not _NAME.match(gname):
                raise CampaignError(f"group name must match {_NAME.pattern}, got {gname!r}")
            members = g.get("attributes")
            if not isinstance(members, list) or len(members) < 2 or not all(isinstance(m, str) for m in members):
                raise CampaignError(f"group {gname!r} needs a list of at least 2 attribute names")
            for m in members:
                if m in member_of:
                    raise CampaignError(f"attribute {m!r} is in groups {member_of[m]!r} and {gname!r}: its budget "
                                        f"would be spent twice")
                member_of[m] = gname
        attrs: dict[str, Attribute] = {}
        own_retention: dict[str, int] = {}
        ks: dict[str, int] = {}
        labels_of: dict[str, tuple[str, ...]] = {}
        for entry in raw:
            a = dict(entry)
            name = a.pop("name", None)
            if not isinstance(name, str) or not _NAME.match(name):
                raise CampaignError(f"attribute name must match {_NAME.pattern}, got {name!r}")
            if name in attrs or name in ks:
                raise CampaignError(f"attribute {name!r} is declared twice")
            labels = tuple(str(x) for x in a.pop("labels", ()))
            defense = a.pop("defense", "none")
            keep = a.pop("retention_steps", None)
            if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
                raise CampaignError(f"attribute {name!r}: retention_steps must be an integer >= 1 (the final steps "
                                    f"kept of it), got {keep!r}")
            if keep is not None:
                own_retention[name] = keep
            kind = a.pop("type", "categorical")
            if kind not in ATTRIBUTE_TYPES:
                raise CampaignError(f"attribute {name!r}: type must be one of {', '.join(ATTRIBUTE_TYPES)}, got "
                                    f"{kind!r}")
            if kind == "numeric":
                if name in member_of:
                    raise CampaignError(f"attribute {name!r} is numeric: it cannot belong to group "
                                        f"{member_of[name]!r} (a group's solution reports categorical values)")
                attrs[name] = _numeric_attribute(name, a, labels, defense)
                continue
            if kind in ("string", "u64"):
                if name in member_of:
                    raise CampaignError(f"attribute {name!r} is open-domain: it cannot belong to group "
                                        f"{member_of[name]!r} (a group's solution reports categorical values)")
                attrs[name] = _open_attribute(name, kind, a, labels, defense)
                continue
            if name in member_of:
                if defense != "none":
                    raise CampaignError(f"attribute {name!r} belongs to group {member_of[name]!r}: a group's reports "
                                        f"have no sound report-level poisoning defense; only defense = \"none\"")
                extra = set(a) - {"k"}
                if extra:
                    raise CampaignError(f"attribute {name!r} belongs to group {member_of[name]!r}, whose solution "
                                        f"spends one budget over the group: remove its own "
                                        f"{', '.join(sorted(extra))} (a budget spent twice)")
                k = a.get("k")
                if isinstance(k, bool) or not isinstance(k, int) or k < 2:
                    raise CampaignError(f"attribute {name!r} needs an integer domain size k >= 2, got {k!r}")
                ks[name], labels_of[name] = k, labels
                continue
            proto_name = a.pop("protocol", None)
            if not isinstance(proto_name, str):
                raise CampaignError(f"attribute {name!r} needs a protocol")
            try:
                proto = make(proto_name, **a)
            except LDPError as exc:
                raise CampaignError(f"attribute {name!r}: {exc}") from exc
            except TypeError as exc:
                raise CampaignError(f"attribute {name!r}: {exc}") from exc
            if labels and len(labels) != proto.domain_size:
                raise CampaignError(f"attribute {name!r} has {len(labels)} labels for a domain of {proto.domain_size}")
            attrs[name] = Attribute(name, proto.k, proto, labels, defense=_check_defense(name, proto, defense))
        groups: dict[str, Group] = {}
        for g in groups_raw:
            spec = dict(g)
            gname, members = spec.pop("name"), tuple(spec.pop("attributes"))
            if gname in groups:
                raise CampaignError(f"group {gname!r} is declared twice")
            missing = [m for m in members if m not in ks]
            if missing:
                raise CampaignError(f"group {gname!r} names undeclared attributes: {', '.join(missing)}")
            solution_name = spec.pop("solution", None)
            if not isinstance(solution_name, str):
                raise CampaignError(f"group {gname!r} needs a solution")
            try:
                solution = make_solution(solution_name, ks=[ks[m] for m in members], **spec)
            except (LDPError, TypeError, ValueError) as exc:
                raise CampaignError(f"group {gname!r}: {exc}") from exc
            if solution.layout == "fake" and "amplification" not in spec:
                raise CampaignError(
                    f"group {gname!r}: {solution_name} with fake data must state its amplification: "
                    f'amplification = "paper" reports the sampled attribute at the amplified budget '
                    f"eps' = ln(d(e^eps - 1) + 1) (Arcolezi et al., CIKM 2021): eps then holds against a change of "
                    f"one attribute, and a device's whole tuple spends more (the estimates show it as eps_1); "
                    f'amplification = "none" holds the whole tuple at eps (larger variance)')
            groups[gname] = Group(gname, solution, members)
            for j, m in enumerate(members):
                view = solution.attribute_protocol(j)
                if labels_of[m] and len(labels_of[m]) != view.domain_size:
                    raise CampaignError(f"attribute {m!r} has {len(labels_of[m])} labels for a domain of "
                                        f"{view.domain_size}")
                attrs[m] = Attribute(m, ks[m], view, labels_of[m], group=gname)
        attrs = {(e.get("name")): attrs[e.get("name")] for e in raw}  # the file's order
        for name, keep in own_retention.items():
            attrs[name] = dataclasses.replace(attrs[name], retention_steps=keep)
        return cls(cid, attrs, step, late, max_batch, str(head.get("description", "")), data,
                   retention_steps=head.get("retention_steps"), groups=groups,  # validated by __post_init__
                   max_steps_ahead=head.get("max_steps_ahead", 1000), min_n=head.get("min_n", DEFAULT_MIN_N))

    @classmethod
    def load(cls, path: str | Path) -> "Campaign":
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise CampaignError(f"cannot read campaign file {path}: {exc}") from exc
        return cls.from_dict(data)


def load_campaigns(paths: list[str | Path]) -> dict[str, Campaign]:
    """Load several campaign files; ids must be unique."""
    out: dict[str, Campaign] = {}
    for p in paths:
        c = Campaign.load(p)
        if c.id in out:
            raise CampaignError(f"campaign id {c.id!r} is declared by two files")
        out[c.id] = c
    return out


def step_at(campaign: Campaign, now: float | None = None) -> int:
    """Time step of the unix time ``now`` (default: the current time): ``floor(now / time_step_seconds)``."""
    return int(math.floor((time.time() if now is None else now) / campaign.time_step_seconds))
