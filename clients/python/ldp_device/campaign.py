"""Campaigns: the TOML file both sides load (``wire/campaign.py``), read with :mod:`tomllib`.

The device derives every protocol's probabilities from the campaign's ε itself (never from a server), and
its fingerprints are the reference's: an attribute's is its protocol's (``sha256`` of the parameters' canonical
JSON), a group attribute's the solution's view of it, the campaign's the hash of its id, step length and every
attribute's parameters. The validation is the reference's, so a file the workers refuse is refused here too.

A numeric attribute (``type = "numeric"``) has a ``range = [lo, hi]``, a ``mechanism`` (a name of
:data:`ldp_device.registry.MECHANISMS`) and the mechanism's parameters instead of ``k`` and ``protocol``; its
protocol is the mechanism (:mod:`ldp_device.numeric`), its parameters ``{"mechanism", "eps", "lo", "hi", ...}``.
It belongs to no group and has no labels and no poisoning defense.

An open-domain attribute (``type = "string"`` or ``"u64"``) reports values nobody listed: a string (its id:
:func:`ldp_device.sketch.value_id`, the first 8 bytes of its SHA-256) or an integer in ``[0, 2^64)``, randomized by
an open-domain protocol (a name of :data:`ldp_device.registry.OPEN_PROTOCOLS`: CMS, HCMS, TreeHist) with its parameters;
its ``seed`` defaults to the attribute name's id, ``top`` (default 10, at most 1000) and ``candidates`` (at most
10,000, strings or integers by the type) are server-side but validated as the reference does. No group, labels or
poisoning defense.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
from pathlib import Path
from typing import Any, Union

from .adaptive import Adaptive
from .base import Protocol
from .direct import GRR, LGRR
from .errors import CampaignError, LDPError
from .hashing import LOLOHA, LocalHashing
from .numeric import NumericMechanism
from .registry import MECHANISMS, OPEN_PROTOCOLS, make, make_numeric, make_open
from .sketch import value_id as _value_id
from .solutions import AttributeView, Solution, make_solution
from .unary import UnaryReports

__all__ = ["Attribute", "Group", "Campaign", "DEFENSES", "ATTRIBUTE_TYPES", "MAX_TOP", "MAX_CANDIDATES", "step_at",
           "default_retention_steps"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_CAMPAIGN_KEYS = {"id", "time_step_seconds", "lateness_seconds", "max_batch_reports", "retention_steps",
                  "max_steps_ahead", "min_n", "description"}  # min_n: server-side (the estimates), unused here
MIN_TIME_STEP_SECONDS = 1.0
DEFAULT_RETENTION_SECONDS = 7 * 86400
DEFENSES = ("none", "plausibility", "itemset")
ATTRIBUTE_TYPES = ("categorical", "numeric", "string", "u64")
#: the most items an open-domain attribute publishes per step, and the most candidates it lists
MAX_TOP, MAX_CANDIDATES = 1000, 10_000

AttributeProtocol = Union[Protocol, AttributeView]


def default_retention_steps(time_step_seconds: float) -> int:
    return max(1, math.ceil(DEFAULT_RETENTION_SECONDS / time_step_seconds))


class Attribute:
    """One attribute of a campaign: its protocol (a group attribute: the solution's view of it)."""

    __slots__ = ("name", "k", "protocol", "labels", "group", "defense", "value_type", "top", "candidates")

    def __init__(self, name: str, k: int, protocol: AttributeProtocol, labels: tuple[str, ...] = (),
                 group: str | None = None, defense: str = "none", value_type: str = "categorical", top: int = 0,
                 candidates: tuple[str | int, ...] = ()) -> None:
        self.name, self.k, self.protocol, self.labels, self.group, self.defense = \
            name, k, protocol, tuple(labels), group, defense
        self.value_type, self.top, self.candidates = value_type, top, tuple(candidates)

    @property
    def open_domain(self) -> bool:
        """Whether values are open-domain strings or 64-bit integers (``type = "string"`` or ``"u64"``)."""
        return self.value_type in ("string", "u64")

    def value_id(self, value: str | int) -> int:
        """An open-domain value's 64-bit id (a string for ``"string"``, an integer in ``[0, 2^64)`` for ``"u64"``);
        :class:`CampaignError` for anything else."""
        if self.value_type == "u64":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
                raise CampaignError(f"attribute {self.name!r} takes integers in [0, 2^64), got {value!r}")
        elif self.value_type == "string":
            if not isinstance(value, str):
                raise CampaignError(f"attribute {self.name!r} takes strings, got {value!r}")
        else:
            raise CampaignError(f"attribute {self.name!r} is not open-domain ({self.value_type})")
        return _value_id(value)

    def label(self, v: int) -> str:
        return self.labels[v] if self.labels else str(v)

    @property
    def numeric(self) -> bool:
        """Whether the attribute is a numeric metric (``type = "numeric"``): a measurement, not an index."""
        return isinstance(self.protocol, NumericMechanism)

    def __repr__(self) -> str:
        return f"Attribute({self.name!r}, k={self.k}, protocol={self.protocol.name}, group={self.group!r})"


class Group:
    """Attributes reported together by one multidimensional solution with one total budget."""

    __slots__ = ("name", "solution", "attributes")

    def __init__(self, name: str, solution: Solution, attributes: tuple[str, ...]) -> None:
        self.name, self.solution, self.attributes = name, solution, tuple(attributes)

    def __repr__(self) -> str:
        return f"Group({self.name!r}, {self.solution!r}, {self.attributes!r})"


def _family(proto: Protocol) -> str | None:
    while isinstance(proto, Adaptive):
        proto = proto.chosen
    if isinstance(proto, (GRR, LGRR)):
        return "direct"
    if isinstance(proto, UnaryReports) and hasattr(type(proto), "ps"):
        return "unary"
    if isinstance(proto, (LocalHashing, LOLOHA)):
        return "hashing"
    return None


def _numeric_attribute(name: str, spec: dict[str, Any], labels: tuple[str, ...], defense: Any) -> Attribute:
    """A ``type = "numeric"`` attribute from its table without ``name`` and ``type`` (``wire.campaign``'s rules)."""
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
        proto = make_numeric(mech, lo=float(rng[0]), hi=float(rng[1]), **spec)
    except (LDPError, TypeError) as exc:
        raise CampaignError(f"attribute {name!r}: {exc}") from exc
    return Attribute(name, proto.k, proto)


def _open_attribute(name: str, kind: str, spec: dict[str, Any], labels: tuple[str, ...], defense: Any) -> Attribute:
    """A ``type = "string"`` or ``"u64"`` attribute from its table without ``name`` and ``type`` (``wire.campaign``'s
    rules)."""
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
    if not isinstance(proto_name, str) or proto_name not in OPEN_PROTOCOLS:
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
            what = "string" if kind == "string" else "integer in [0, 2^64)"
            raise CampaignError(f"attribute {name!r}: candidate {c!r} is not a {what}")
    if len(set(cands)) != len(cands):
        raise CampaignError(f"attribute {name!r}: a candidate is listed twice")
    spec.setdefault("seed", _value_id(name))
    try:
        proto = make_open(proto_name, **spec)
    except (LDPError, TypeError) as exc:
        raise CampaignError(f"attribute {name!r}: {exc}") from exc
    return Attribute(name, proto.support_size, proto, value_type=kind, top=top,  # type: ignore[attr-defined]
                     candidates=tuple(cands))


def _check_defense(name: str, proto: Protocol, defense: Any) -> str:
    if defense not in DEFENSES:
        raise CampaignError(f"attribute {name!r}: defense must be one of {', '.join(DEFENSES)}, got {defense!r}")
    if defense == "none":
        return defense
    fam = _family(proto)
    if fam == "direct" or fam is None or isinstance(proto, LOLOHA):
        raise CampaignError(f"attribute {name!r}: {proto.name} has no sound report-level poisoning defense; only "
                            f"defense = \"none\"")
    if defense == "plausibility" and fam != "unary":
        raise CampaignError(f"attribute {name!r}: the plausibility check applies to unary reports (SUE, OUE, the "
                            f"L-UE chains); {proto.name} can use defense = \"itemset\"")
    return defense


class Campaign:
    """A campaign: its id, attributes, groups and time-step length (what the device needs of it)."""

    def __init__(self, id: str, attributes: dict[str, Attribute], time_step_seconds: float = 10.0,
                 lateness_seconds: float = 2.0, max_batch_reports: int = 1_000_000, description: str = "",
                 source: dict[str, Any] | None = None, groups: dict[str, Group] | None = None,
                 retention_steps: int | None = None, max_steps_ahead: int = 1000) -> None:
        self.id, self.attributes = id, attributes
        self.time_step_seconds, self.lateness_seconds = time_step_seconds, lateness_seconds
        self.max_batch_reports, self.description = max_batch_reports, description
        self.source = {} if source is None else source
        self.groups = {} if groups is None else groups
        if retention_steps is None:
            retention_steps = default_retention_steps(time_step_seconds)
        elif isinstance(retention_steps, bool) or not isinstance(retention_steps, int) or retention_steps < 1:
            raise CampaignError(f"retention_steps must be an integer >= 1, got {retention_steps!r}")
        if isinstance(max_steps_ahead, bool) or not isinstance(max_steps_ahead, int) or max_steps_ahead < 1:
            raise CampaignError(f"max_steps_ahead must be an integer >= 1, got {max_steps_ahead!r}")
        self.retention_steps, self.max_steps_ahead = retention_steps, max_steps_ahead

    def __repr__(self) -> str:
        return f"Campaign({self.id!r}, attributes={list(self.attributes)}, groups={list(self.groups)})"

    @property
    def fingerprint(self) -> str:
        """The data contract's hash (id, step length, protocol parameters), as ``wire.campaign.Campaign``'s."""
        spec: dict[str, Any] = {"id": self.id, "time_step_seconds": self.time_step_seconds,
                                "attributes": {a.name: a.protocol.params() for a in self.attributes.values()}}
        if self.groups:
            spec["groups"] = {g.name: {"solution": g.solution.params(), "attributes": list(g.attributes)}
                              for g in self.groups.values()}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

    @property
    def ungrouped(self) -> list[str]:
        """The attributes reported by their own protocol (not by a group's solution)."""
        return [a.name for a in self.attributes.values() if a.group is None]

    def attribute(self, name: str) -> Attribute:
        try:
            return self.attributes[name]
        except KeyError:
            raise CampaignError(f"campaign {self.id!r} has no attribute {name!r}") from None

    def step_at(self, now: float | None = None) -> int:
        return step_at(self, now)

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
        try:
            step = float(head.get("time_step_seconds", 10.0))
            late = float(head.get("lateness_seconds", 2.0))
            max_batch = int(head.get("max_batch_reports", 1_000_000))
        except (TypeError, ValueError) as exc:
            raise CampaignError(f"[campaign]: {exc}") from None
        if step < MIN_TIME_STEP_SECONDS:
            raise CampaignError(f"time_step_seconds must be >= {MIN_TIME_STEP_SECONDS:g}, got {step:g}")
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
        ks: dict[str, int] = {}
        labels_of: dict[str, tuple[str, ...]] = {}
        for entry in raw:
            if not isinstance(entry, dict):
                raise CampaignError("every [[attributes]] entry must be a table")
            a = dict(entry)
            name = a.pop("name", None)
            if not isinstance(name, str) or not _NAME.match(name):
                raise CampaignError(f"attribute name must match {_NAME.pattern}, got {name!r}")
            if name in attrs or name in ks:
                raise CampaignError(f"attribute {name!r} is declared twice")
            labels = tuple(str(x) for x in a.pop("labels", ()))
            defense = a.pop("defense", "none")
            keep = a.pop("retention_steps", None)  # server-side (the steps kept of it): validated, unused here
            if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
                raise CampaignError(f"attribute {name!r}: retention_steps must be an integer >= 1 (the final steps "
                                    f"kept of it), got {keep!r}")
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
                    raise CampaignError(f"attribute {name!r} belongs to group {member_of[name]!r}: only "
                                        f"defense = \"none\"")
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
            except (LDPError, TypeError) as exc:
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
                raise CampaignError(f"group {gname!r}: {solution_name} with fake data must state its amplification "
                                    f"(\"paper\" or \"none\")")
            groups[gname] = Group(gname, solution, members)
            for j, m in enumerate(members):
                view = solution.attribute_protocol(j)
                if labels_of[m] and len(labels_of[m]) != view.domain_size:
                    raise CampaignError(f"attribute {m!r} has {len(labels_of[m])} labels for a domain of "
                                        f"{view.domain_size}")
                attrs[m] = Attribute(m, ks[m], view, labels_of[m], group=gname)
        attrs = {e.get("name"): attrs[e.get("name")] for e in raw}  # the file's order
        return cls(cid, attrs, step, late, max_batch, str(head.get("description", "")), data,
                   groups=groups, retention_steps=head.get("retention_steps"),
                   max_steps_ahead=head.get("max_steps_ahead", 1000))

    @classmethod
    def loads(cls, text: str) -> "Campaign":
        import tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise CampaignError(f"cannot read campaign: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> "Campaign":
        import tomllib
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise CampaignError(f"cannot read campaign file {path}: {exc}") from exc
        return cls.from_dict(data)


def step_at(campaign: Campaign, now: float | None = None) -> int:
    """Time step of the unix time ``now`` (default: now): ``floor(now / time_step_seconds)``."""
    return int(math.floor((time.time() if now is None else now) / campaign.time_step_seconds))
