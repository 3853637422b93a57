"""The batch envelope: a small versioned header in front of a protocol's report payload.

One Kafka message holds one envelope: many reports of one campaign, one attribute, one time
step. Layout (little-endian)::

    magic "LDPB" | version u8 | kind u8 | reserved u16 | t u32 | count u32 | payload_len u32
    | fingerprint 8 bytes | campaign (u8 len + utf-8) | attribute (u8 len + utf-8)
    | protocol (u8 len + utf-8) | payload

``kind`` is ``REPORTS`` (payload = ``proto.encode(reports)``) or ``WATERMARK`` (no payload:
the sender will send no more reports for steps ``<= t`` of that attribute). Parsing never
copies the payload (a ``memoryview``); every inconsistency raises :class:`EnvelopeError`
with a short machine-readable ``reason`` used for the rejection topic and metrics.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from .campaign import Campaign
from .errors import InvalidReports, LDPError

MAGIC = b"LDPB"
# 2: reports randomized from ChaCha20 streams under 256-bit keys, SHE as integer discrete-Laplace
# reports. Batches of version 1 (SplitMix64 randomness, fixed-point SHE) are rejected as
# "bad_version": their randomness is not private and SHE's payload means something else.
VERSION = 2
REPORTS, WATERMARK = 0, 1
_HEAD = struct.Struct("<4sBBHIII8s")
MAX_FIELD = 255


class EnvelopeError(LDPError):
    """A batch that must not be counted; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


REASONS = ("malformed", "bad_version", "unknown_campaign", "unknown_attribute", "wrong_protocol",
           "wrong_fingerprint", "truncated", "oversized", "bad_payload", "bad_json")


@dataclass(frozen=True)
class Envelope:
    kind: int
    campaign: str
    attribute: str
    protocol: str
    fingerprint: str
    t: int
    count: int
    payload: memoryview

    @property
    def key(self) -> bytes:
        """Kafka message key ``"{t}:{attr}"``."""
        return f"{self.t}:{self.attribute}".encode()


def _field(s: str) -> bytes:
    b = s.encode()
    if len(b) > MAX_FIELD:
        raise LDPError(f"envelope field too long: {s[:20]!r}...")
    return bytes([len(b)]) + b


def pack(campaign: str, attribute: str, protocol: str, fingerprint: str, t: int, count: int,
         payload: bytes = b"", kind: int = REPORTS) -> bytes:
    """Serialize an envelope (``payload`` from ``proto.encode``)."""
    head = _HEAD.pack(MAGIC, VERSION, kind, 0, t, count, len(payload), bytes.fromhex(fingerprint))
    return b"".join((head, _field(campaign), _field(attribute), _field(protocol), payload))


def pack_reports(campaign: Campaign, attribute: str, t: int, reports: np.ndarray) -> bytes:
    """Envelope of a batch of reports of ``campaign.attribute(attribute)``."""
    proto = campaign.attribute(attribute).protocol
    return pack(campaign.id, attribute, proto.name, proto.fingerprint, t, len(reports), proto.encode(reports))


def pack_watermark(campaign: Campaign, attribute: str, t: int) -> bytes:
    proto = campaign.attribute(attribute).protocol
    return pack(campaign.id, attribute, proto.name, proto.fingerprint, t, 0, b"", kind=WATERMARK)


def parse(blob: bytes | memoryview) -> Envelope:
    """Parse the header; the payload is not decoded (see :func:`decode_reports`)."""
    mv = memoryview(blob)
    if mv.nbytes < _HEAD.size:
        raise EnvelopeError("malformed", f"{mv.nbytes} bytes is shorter than the envelope header")
    magic, version, kind, _res, t, count, plen, fp = _HEAD.unpack_from(mv)
    if magic != MAGIC:
        raise EnvelopeError("malformed", "not an ldp-stream batch (bad magic)")
    if version != VERSION:
        raise EnvelopeError("bad_version", f"envelope version {version}, expected {VERSION}")
    if kind not in (REPORTS, WATERMARK):
        raise EnvelopeError("malformed", f"unknown envelope kind {kind}")
    pos = _HEAD.size
    names = []
    for what in ("campaign", "attribute", "protocol"):
        if pos >= mv.nbytes:
            raise EnvelopeError("truncated", f"envelope ends before its {what} field")
        n = mv[pos]
        if pos + 1 + n > mv.nbytes:
            raise EnvelopeError("truncated", f"envelope ends inside its {what} field")
        try:
            names.append(bytes(mv[pos + 1:pos + 1 + n]).decode())
        except UnicodeDecodeError:
            raise EnvelopeError("malformed", f"{what} is not utf-8") from None
        pos += 1 + n
    body = mv[pos:]
    if body.nbytes != plen:
        reason = "truncated" if body.nbytes < plen else "malformed"
        raise EnvelopeError(reason, f"payload has {body.nbytes} bytes, the header says {plen}")
    return Envelope(kind, names[0], names[1], names[2], fp.hex(), t, count, body)


def validate(env: Envelope, campaigns: dict[str, Campaign]) -> Campaign:
    """Check the envelope against the declared campaigns; returns the campaign."""
    campaign = campaigns.get(env.campaign)
    if campaign is None:
        raise EnvelopeError("unknown_campaign", f"campaign {env.campaign!r} is not declared")
    attr = campaign.attributes.get(env.attribute)
    if attr is None:
        raise EnvelopeError("unknown_attribute", f"campaign {env.campaign!r} has no attribute {env.attribute!r}")
    if env.protocol != attr.protocol.name:
        raise EnvelopeError("wrong_protocol", f"{env.attribute!r} uses {attr.protocol.name}, batch says {env.protocol}")
    if env.fingerprint != attr.protocol.fingerprint:
        raise EnvelopeError("wrong_fingerprint", f"batch parameters {env.fingerprint} differ from the campaign's "
                                                 f"{attr.protocol.fingerprint} for {env.attribute!r}")
    if env.count > campaign.max_batch_reports:
        raise EnvelopeError("oversized", f"{env.count} reports exceed max_batch_reports={campaign.max_batch_reports}")
    return campaign


def decode_reports(env: Envelope, campaign: Campaign) -> np.ndarray:
    """Decode and validate the payload of a REPORTS envelope (zero-copy where the codec allows)."""
    proto = campaign.attribute(env.attribute).protocol
    try:
        reports = proto.decode(env.payload)
    except InvalidReports as exc:
        msg = str(exc)
        reason = "truncated" if "expected" in msg or "shorter" in msg else "bad_payload"
        raise EnvelopeError(reason, msg) from exc
    if len(reports) != env.count:
        raise EnvelopeError("bad_payload", f"payload holds {len(reports)} reports, the envelope says {env.count}")
    return reports
