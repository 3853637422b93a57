"""ldp-stream's light device SDK: local differential privacy on the device, with the standard library and
``cryptography`` only.

``Device`` randomizes a device's values with the campaign's protocols (every protocol, multidimensional solution
and numeric mechanism of ldp-stream, byte for byte the reference's reports: ``tests/data/randomizer-vectors.json``),
keeps its memo state and lifetime privacy budget in a private state directory, and sends single reports to the
ingest. A numeric attribute (``type = "numeric"``) takes a measurement: ``dev.send("session_seconds", 312.5)``; an
open-domain attribute (``type = "string"`` / ``"u64"``: CMS, HCMS, TreeHist) a string or a 64-bit integer, hashed on the
device: ``dev.send("crash_signature", "NullPointerException@Foo.java:42")``.

>>> from ldp_device import Campaign, Device
>>> dev = Device(Campaign.load("deploy/campaigns/demo.toml"), "device-state", budget_eps=20.0,
...              ingest_url="http://127.0.0.1:8080/reports", token=TOKEN)   # doctest: +SKIP
>>> dev.send("app_version", 42)                                             # doctest: +SKIP
{'accepted': 1}
"""
from __future__ import annotations

from .base import MemoState, Protocol
from .campaign import Attribute, Campaign, Group, step_at
from .codec import encode_payload, single_report
from .device import Device
from .errors import (BudgetExceeded, CampaignError, DeviceStateError, InfeasibleParameters, IngestError,
                     InvalidState, LDPError, MemoTableFull)
from .ledger import budget_plan
from .numeric import NumericMechanism
from .registry import MECHANISMS, OPEN_PROTOCOLS, PROTOCOLS, from_params, make, make_numeric, make_open
from .sketch import OpenDomainProtocol, row_seeds, sketch_hash, value_id
from .solutions import SOLUTIONS, MultiState, Solution, make_solution
from .streams import key_tape, os_key

__version__ = "0.1.0"

__all__ = ["Device", "Campaign", "Attribute", "Group", "step_at", "budget_plan", "make", "from_params", "PROTOCOLS",
           "make_numeric", "MECHANISMS", "NumericMechanism", "make_open", "OPEN_PROTOCOLS", "OpenDomainProtocol", "value_id",
           "sketch_hash", "row_seeds", "make_solution", "SOLUTIONS", "Solution", "Protocol",
           "MemoState", "MultiState", "encode_payload", "single_report", "key_tape", "os_key", "LDPError",
           "InfeasibleParameters", "InvalidState", "CampaignError", "BudgetExceeded", "DeviceStateError", "IngestError",
           "MemoTableFull", "__version__"]
