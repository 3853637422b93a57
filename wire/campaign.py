"""Campaigns: what both sides of the pipeline must agree on, loaded from one TOML file.

```toml
[campaign]
id = "fleet-health"          # [A-Za-z0-9_.-]{1,64}
time_step_seconds = 10.0     # length of one time step t
lateness_seconds = 2.0       # how long a closed step still accepts reports
max_batch_reports = 1000000  # a larger batch is rejected ("oversized")

[[attributes]]
name = "app_version"         # [A-Za-z0-9_.-]{1,64}
k = 100
protocol = "L-OSUE"          # any name of estimators.PROTOCOLS
eps_inf = 2.0                # the protocol's own parameters (estimators.make keywords)
eps_1 = 1.0
labels = ["v1.0", ...]       # optional, k labels for dashboards
```

The campaign fingerprint (a hash of everything above but the labels) identifies a
configuration; each attribute's protocol fingerprint travels in every batch envelope and is
checked by the stream app, so a producer with other parameters is rejected, never counted.

:func:`step_at` is the time step of a wall-clock time, ``t = floor(now / time_step_seconds)``:
the step a device SDK stamps on a report and the stream app's HTTP ingest assumes when a report
carries none.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from estimators.base import FrequencyProtocol
from estimators.errors import LDPError
from estimators.registry import make

__all__ = ["Attribute", "Campaign", "CampaignError", "load_campaigns", "step_at"]

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_CAMPAIGN_KEYS = {"id", "time_step_seconds", "lateness_seconds", "max_batch_reports", "description"}


class CampaignError(LDPError):
    """A campaign file that cannot be used."""


@dataclass(frozen=True)
class Attribute:
    """One attribute of a campaign and its protocol."""

    name: str
    k: int
    protocol: FrequencyProtocol
    labels: tuple[str, ...] = ()

    def label(self, v: int) -> str:
        return self.labels[v] if self.labels else str(v)


@dataclass(frozen=True)
class Campaign:
    """A campaign: its id, attributes, time-step length, lateness and batch limit (module doc)."""

    id: str
    attributes: dict[str, Attribute]
    time_step_seconds: float = 10.0
    lateness_seconds: float = 2.0
    max_batch_reports: int = 1_000_000
    description: str = ""
    source: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def fingerprint(self) -> str:
        spec = {"id": self.id, "time_step_seconds": self.time_step_seconds,
                "attributes": {a.name: a.protocol.params() for a in self.attributes.values()}}
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]

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
        if step <= 0 or late < 0 or max_batch < 1:
            raise CampaignError("time_step_seconds > 0, lateness_seconds >= 0 and max_batch_reports >= 1 are required")
        attrs: dict[str, Attribute] = {}
        raw = data.get("attributes")
        if not isinstance(raw, list) or not raw:
            raise CampaignError("a campaign needs at least one [[attributes]] entry")
        for entry in raw:
            a = dict(entry)
            name = a.pop("name", None)
            if not isinstance(name, str) or not _NAME.match(name):
                raise CampaignError(f"attribute name must match {_NAME.pattern}, got {name!r}")
            if name in attrs:
                raise CampaignError(f"attribute {name!r} is declared twice")
            labels = tuple(str(x) for x in a.pop("labels", ()))
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
            attrs[name] = Attribute(name, proto.k, proto, labels)
        return cls(cid, attrs, step, late, max_batch, str(head.get("description", "")), data)

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
