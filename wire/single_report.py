"""The single-report JSON codec: what a device SDK POSTs and what the HTTP ingest accepts.

A request body is one report object or a JSON list of them (:func:`decode_report_request`).
One report object::

    {"campaign": "fleet-health", "attribute": "opt_in", "t": 172345,   # t optional
     "payload": "<base64 of proto.encode(one-row report array)>",
     "protocol": "L-GRR", "fingerprint": "15aadc3a8fac7208"}         # optional, checked if present

:func:`encode_single_report` builds it (the SDK sends ``campaign``, ``attribute``, ``t`` and
``payload``); :func:`decode_single_report` validates it like a batch envelope, with the same
rejection types (:mod:`wire.errors`) plus :class:`~wire.errors.BadJson` for an object that is not
of this shape. A missing ``t`` is the step of the receiving time (:func:`wire.campaign.step_at`).
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any, NamedTuple

import numpy as np

from estimators.errors import LDPError

from .campaign import Campaign, step_at
from .envelope import MAX_STEP, REPORTS, Envelope, decode_reports
from .errors import (BadJson, BadPayload, EnvelopeError, UnknownAttribute, UnknownCampaign, WrongFingerprint,
                     WrongProtocol)

__all__ = ["SingleReport", "check_step", "encode_single_report", "decode_report_request", "decode_single_report"]


class SingleReport(NamedTuple):
    """A validated single report: ``reports`` is the protocol's report array of one row."""

    campaign: Campaign
    attribute: str
    t: int
    reports: np.ndarray


def check_step(t: int) -> int:
    """``t`` as an ``int`` if it is a time step the wire can carry (``[0, MAX_STEP]``), else :class:`LDPError`."""
    step = int(t)
    if not 0 <= step <= MAX_STEP:
        raise LDPError(f"time step must lie in [0, {MAX_STEP}], got {step}")
    return step


def encode_single_report(campaign: Campaign, attribute: str, t: int, reports: np.ndarray) -> dict[str, Any]:
    """The JSON object of one randomized report (``reports``: one row) of step ``t``."""
    proto = campaign.attribute(attribute).protocol
    if len(reports) != 1:
        raise LDPError(f"a single report holds one report, got {len(reports)}")
    return {"campaign": campaign.id, "attribute": attribute, "t": check_step(t),
            "payload": base64.b64encode(proto.encode(reports)).decode("ascii")}


def decode_report_request(body: bytes) -> list[Any]:
    """The report objects of a request body (one object or a non-empty list); :class:`BadJson` otherwise.

    The objects are not validated yet (:func:`decode_single_report` does, one by one).
    """
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadJson(f"request body is not JSON: {exc}") from None
    except RecursionError:  # json's decoder recurses once per nesting level: "[[[[..." exhausts the stack
        raise BadJson("request body nests JSON deeper than the parser's recursion limit") from None
    objs = data if isinstance(data, list) else [data]
    if not objs:
        raise BadJson("empty list of reports")
    return objs


def decode_single_report(obj: Any, campaigns: dict[str, Campaign], now: float | None = None) -> SingleReport:
    """Validate one report object (module doc); ``now`` (unix time) fills in a missing ``t``.

    Raises a subclass of :class:`~wire.errors.EnvelopeError` naming the reason.
    """
    if not isinstance(obj, dict):
        raise BadJson(f"a report must be a JSON object, got {type(obj).__name__}")
    cid, attr, payload = obj.get("campaign"), obj.get("attribute"), obj.get("payload")
    for name, val in (("campaign", cid), ("attribute", attr), ("payload", payload)):
        if not isinstance(val, str):
            raise BadJson(f"field {name!r} must be a string")
    campaign = campaigns.get(cid)
    if campaign is None:
        raise UnknownCampaign(f"campaign {cid!r} is not declared")
    a = campaign.attributes.get(attr)
    if a is None:
        raise UnknownAttribute(f"campaign {cid!r} has no attribute {attr!r}")
    proto = a.protocol
    t = obj.get("t")
    if t is None:
        t = step_at(campaign, now)
    elif isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= MAX_STEP:
        raise BadJson(f"field 't' must be an integer in [0, {MAX_STEP}], got {t!r}")
    if "protocol" in obj and obj["protocol"] != proto.name:
        raise WrongProtocol(f"{attr!r} uses {proto.name}, report says {obj['protocol']!r}")
    if "fingerprint" in obj and obj["fingerprint"] != proto.fingerprint:
        raise WrongFingerprint(f"report parameters {obj['fingerprint']!r} differ from the "
                               f"campaign's {proto.fingerprint} for {attr!r}")
    try:
        blob = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadPayload(f"payload is not base64: {exc}") from None
    env = Envelope(REPORTS, cid, attr, proto.name, proto.fingerprint, t, 1, memoryview(blob))
    try:
        reports = decode_reports(env, campaign)
    except EnvelopeError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever breaks the codec is a bad payload
        raise BadPayload(f"{type(exc).__name__}: {exc}") from None
    return SingleReport(campaign, attr, t, reports)
