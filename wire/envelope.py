"""The batch envelope: a small versioned header in front of a protocol's report payload.

One Kafka message holds one envelope: many reports of one campaign, one attribute, one time
step. Layout (little-endian)::

    magic "LDPB" | version u8 | kind u8 | reserved u16 | t u32 | count u32 | payload_len u32
    | fingerprint 8 bytes | campaign (u8 len + utf-8) | attribute (u8 len + utf-8)
    | protocol (u8 len + utf-8) | batch_id (u8 len + utf-8) | payload

``kind`` is ``REPORTS`` (payload = ``proto.encode(reports)``) or ``WATERMARK`` (no payload:
the sender will send no more reports for step ``t`` of that attribute; its ``count`` is how many
reports of the step it sent in all, 0 if it does not say). ``batch_id`` is the
producer's stable id of a REPORTS batch (the fleet: ``<producer>:<t>:<attribute>:<index>``, the
HTTP ingest: a fresh unique id): the count store applies each id at most once, so a re-sent batch
(retry, resumed producer, a redelivery after a crash, a replay from Kafka) is never counted twice.
It is required on REPORTS batches (:class:`~wire.errors.MissingBatchId` otherwise) and empty on
watermarks, whose application is idempotent. :func:`message_ident` names a message for the
consumer-position records of the count store. Parsing never
copies the payload (a ``memoryview``); every inconsistency raises a subclass of
:class:`~wire.errors.EnvelopeError` whose type names the rejection reason (its ``reason``
labels the rejection topic and metrics). The Kafka message key of an envelope is
:func:`wire.topics.message_key`.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from estimators.errors import InvalidReports, LDPError, TruncatedPayload

from .campaign import Campaign
from .errors import (REASONS, BadPayload, BadVersion, EnvelopeError, MalformedBatch, MissingBatchId, OversizedBatch,
                     TruncatedBatch, UnknownAttribute, UnknownCampaign, WrongFingerprint, WrongProtocol)
from .topics import message_key

__all__ = ["MAGIC", "VERSION", "REPORTS", "WATERMARK", "MAX_STEP", "Envelope", "EnvelopeError", "REASONS", "pack",
           "pack_reports", "pack_watermark", "parse", "validate", "message_ident", "ident_of", "decode_reports",
           "INGEST_BATCH_PREFIX", "is_wall_clock"]

#: Batch ids of the HTTP ingest begin with this (``http:<uuid4 hex>``): its steps are wall-clock steps,
#: ``t = floor(now / time_step_seconds)``, where a fleet numbers logical steps 0, 1, 2, ...
INGEST_BATCH_PREFIX = "http:"


def is_wall_clock(batch_id: str) -> bool:
    """Whether a batch came from the HTTP ingest (its step is a wall-clock step)."""
    return batch_id.startswith(INGEST_BATCH_PREFIX)

MAGIC = b"LDPB"
# 2: reports randomized from ChaCha20 streams under 256-bit keys, SHE as integer discrete-Laplace
# reports. Batches of version 1 (SplitMix64 randomness, fixed-point SHE) are rejected as
# "bad_version": their randomness is not private and SHE's payload means something else.
VERSION = 2
REPORTS, WATERMARK = 0, 1
_HEAD = struct.Struct("<4sBBHIII8s")
MAX_FIELD = 255
MAX_STEP = 2**32 - 1  # t is a u32


@dataclass(frozen=True)
class Envelope:
    """A parsed envelope header; ``payload`` is a view of the message bytes."""

    kind: int
    campaign: str
    attribute: str
    protocol: str
    fingerprint: str
    t: int
    count: int
    payload: memoryview
    batch_id: str = ""

    @property
    def key(self) -> bytes:
        """Kafka message key (:func:`wire.topics.message_key`)."""
        return message_key(self.t, self.attribute)


def _field(s: str) -> bytes:
    b = s.encode()
    if len(b) > MAX_FIELD:
        raise LDPError(f"envelope field too long: {s[:20]!r}...")
    return bytes([len(b)]) + b


def pack(campaign: str, attribute: str, protocol: str, fingerprint: str, t: int, count: int,
         payload: bytes = b"", kind: int = REPORTS, batch_id: str = "") -> bytes:
    """Serialize an envelope (``payload`` from ``proto.encode``; ``batch_id``: see the module doc)."""
    head = _HEAD.pack(MAGIC, VERSION, kind, 0, t, count, len(payload), bytes.fromhex(fingerprint))
    return b"".join((head, _field(campaign), _field(attribute), _field(protocol), _field(batch_id), payload))


def pack_reports(campaign: Campaign, attribute: str, t: int, reports: np.ndarray, *, batch_id: str) -> bytes:
    """Envelope of a batch of reports of ``campaign.attribute(attribute)`` (``batch_id``: the producer's id)."""
    proto = campaign.attribute(attribute).protocol
    return pack(campaign.id, attribute, proto.name, proto.fingerprint, t, len(reports), proto.encode(reports),
                batch_id=batch_id)


def pack_watermark(campaign: Campaign, attribute: str, t: int, count: int = 0) -> bytes:
    """Watermark envelope: no more reports of ``attribute`` for step ``t`` from this sender, which sent ``count``
    reports of it in all (0: not stated). A step closed with fewer reports counted than its watermark states lost
    some in the broker: its final says ``complete: false``."""
    proto = campaign.attribute(attribute).protocol
    return pack(campaign.id, attribute, proto.name, proto.fingerprint, t, int(count), b"", kind=WATERMARK)


def parse(blob: bytes | memoryview) -> Envelope:
    """Parse the header; the payload is not decoded (see :func:`decode_reports`)."""
    mv = memoryview(blob)
    if mv.nbytes < _HEAD.size:
        raise MalformedBatch(f"{mv.nbytes} bytes is shorter than the envelope header")
    magic, version, kind, _res, t, count, plen, fp = _HEAD.unpack_from(mv)
    if magic != MAGIC:
        raise MalformedBatch("not an ldp-stream batch (bad magic)")
    if version != VERSION:
        raise BadVersion(f"envelope version {version}, expected {VERSION}")
    if kind not in (REPORTS, WATERMARK):
        raise MalformedBatch(f"unknown envelope kind {kind}")
    pos = _HEAD.size
    names = []
    for what in ("campaign", "attribute", "protocol", "batch_id"):
        if pos >= mv.nbytes:
            raise TruncatedBatch(f"envelope ends before its {what} field")
        n = mv[pos]
        if pos + 1 + n > mv.nbytes:
            raise TruncatedBatch(f"envelope ends inside its {what} field")
        try:
            names.append(bytes(mv[pos + 1:pos + 1 + n]).decode())
        except UnicodeDecodeError:
            raise MalformedBatch(f"{what} is not utf-8") from None
        pos += 1 + n
    body = mv[pos:]
    if body.nbytes != plen:
        error = TruncatedBatch if body.nbytes < plen else MalformedBatch
        raise error(f"payload has {body.nbytes} bytes, the header says {plen}")
    return Envelope(kind, names[0], names[1], names[2], fp.hex(), t, count, body, names[3])


def validate(env: Envelope, campaigns: dict[str, Campaign]) -> Campaign:
    """Check the envelope against the declared campaigns; returns the campaign."""
    campaign = campaigns.get(env.campaign)
    if campaign is None:
        raise UnknownCampaign(f"campaign {env.campaign!r} is not declared")
    attr = campaign.attributes.get(env.attribute)
    if attr is None:
        raise UnknownAttribute(f"campaign {env.campaign!r} has no attribute {env.attribute!r}")
    if env.protocol != attr.protocol.name:
        raise WrongProtocol(f"{env.attribute!r} uses {attr.protocol.name}, batch says {env.protocol}")
    if env.fingerprint != attr.protocol.fingerprint:
        raise WrongFingerprint(f"batch parameters {env.fingerprint} differ from the campaign's "
                               f"{attr.protocol.fingerprint} for {env.attribute!r}")
    if env.kind == REPORTS and not env.batch_id:
        raise MissingBatchId("a batch of reports must carry its producer's batch id (it is counted at most once)")
    if env.kind == REPORTS and env.count > campaign.max_batch_reports:
        raise OversizedBatch(f"{env.count} reports exceed max_batch_reports={campaign.max_batch_reports}")
    return campaign


def message_ident(env: Envelope) -> str:
    """What names a message independently of its offset: the batch id, or ``wm:<attribute>:<t>`` for a
    watermark (the count store records it with a consumer position, to recognize that message again)."""
    return env.batch_id if env.kind == REPORTS else f"wm:{env.attribute}:{env.t}"


def ident_of(value: bytes | None) -> str:
    """:func:`message_ident` of a message's bytes, or ``raw:<digest>`` for one that does not parse (or has no batch
    id): what a consumer position records for any message, rejected ones included."""
    try:
        if value is not None:
            env = parse(value)
            ident = message_ident(env)
            if ident:
                return ident
    except EnvelopeError:
        pass
    return "raw:" + hashlib.blake2b(value or b"", digest_size=12).hexdigest()


def decode_reports(env: Envelope, campaign: Campaign) -> np.ndarray:
    """Decode and validate the payload of a REPORTS envelope (zero-copy where the codec allows)."""
    proto = campaign.attribute(env.attribute).protocol
    try:
        reports = proto.decode(env.payload)
    except TruncatedPayload as exc:
        raise TruncatedBatch(str(exc)) from exc
    except InvalidReports as exc:
        raise BadPayload(str(exc)) from exc
    if len(reports) != env.count:
        raise BadPayload(f"payload holds {len(reports)} reports, the envelope says {env.count}")
    return reports
