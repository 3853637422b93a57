"""The compact binary body of the ingest: one or many single reports, ``application/x-ldp-reports``.

The JSON request of :mod:`wire.single_report` wraps a report of a few bytes in base64, field names
and a JSON parse; this body carries the same reports as raw bytes, in *sections* of one (campaign,
attribute, step) each: a device's single report is about 40% smaller than its JSON (57 bytes for
a GRR report of vector ``grr_single``), and a gateway's section of 1,000 L-OSUE reports costs 13
bytes a report, not about 100. ``docs/wire-format.md`` is the specification (byte tables, each
protocol's report encoding, test vectors in ``tests/data/wire-vectors.json``). All integers are
little-endian::

    body     = magic "LDPC" | version u8 (1) | flags u8 (0) | sections u16 | section * sections
    section  = fingerprint 8 bytes | t u32 | count u32 | payload_len u32 | flags u8
               | campaign_len u8 | attribute_len u8 | reserved u8 (0)
               | campaign (utf-8) | attribute (utf-8) | payload (payload_len bytes)
    payload  = proto.encode(reports): "LDPr" | codec version u8 (1) | count u32 | count reports

``fingerprint`` is the attribute's protocol fingerprint (8 raw bytes of its 16 hex digits), so a
device configured with other parameters is refused as ``wrong_fingerprint``, never counted, as a
batch envelope is. Section flag :data:`T_RECEIVED` (bit 0) asks for the step of the receiving time
(``t`` must then be 0), like a JSON report without ``t``. The payload is byte for byte the JSON
form's base64-decoded ``payload`` and a batch envelope's payload.

Hard limits: at most :data:`MAX_SECTIONS` sections and :data:`MAX_REPORTS` reports per body (and a
section's ``count`` at most the campaign's ``max_batch_reports``). Every length is checked against
the bytes actually present before it is used, and decoding never copies a payload (the report
arrays are read-only views of the body), so a parser allocates nothing from an untrusted length.

:func:`decode_compact` returns one :class:`~wire.single_report.SingleReport` per *section*, whose
``reports`` array holds the section's ``count`` rows (``len(item.reports)`` reports): the ingest
groups rows, not Python objects, so a batch of 1,000 reports costs one array, not 1,000. Every
fault raises the :class:`~wire.errors.EnvelopeError` subclass of its reason; a body is valid or
refused as a whole.
"""
from __future__ import annotations

import struct
import time
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from estimators.base import FrequencyProtocol
from estimators.errors import LDPError

from .campaign import Campaign, step_at
from .envelope import REPORTS, Envelope, decode_reports
from .errors import (BadPayload, BadVersion, EnvelopeError, MalformedBatch, OversizedBatch, TruncatedBatch,
                     UnknownAttribute, UnknownCampaign, WrongFingerprint)
from .single_report import SingleReport, check_step

__all__ = ["CONTENT_TYPE", "MAGIC", "VERSION", "MAX_SECTIONS", "MAX_REPORTS", "T_RECEIVED", "Section",
           "encode_compact", "parse_compact", "decode_compact", "count_reports"]

CONTENT_TYPE = "application/x-ldp-reports"
MAGIC = b"LDPC"
VERSION = 1
MAX_SECTIONS = 256
MAX_REPORTS = 100_000
T_RECEIVED = 0x01  # section flag: t is the step of the receiving time (the t field must be 0)
_BODY = struct.Struct("<4sBBH")          # magic, version, flags, sections
_SECTION = struct.Struct("<8sIIIBBBB")   # fingerprint, t, count, payload_len, flags, campaign_len, attribute_len, 0
_FINGERPRINTS: dict[int, tuple[FrequencyProtocol, bytes]] = {}  # id(proto) -> (proto, raw fingerprint)
_FINGERPRINTS_MAX = 4096


class Section(NamedTuple):
    """One parsed section header; ``payload`` is a view of the body (not decoded yet)."""

    campaign: str
    attribute: str
    fingerprint: bytes
    t: int
    count: int
    flags: int
    payload: memoryview


def _fingerprint(proto: FrequencyProtocol) -> bytes:
    """The protocol's fingerprint as 8 raw bytes (cached: computing it hashes the parameters)."""
    hit = _FINGERPRINTS.get(id(proto))
    if hit is not None and hit[0] is proto:
        return hit[1]
    if len(_FINGERPRINTS) >= _FINGERPRINTS_MAX:  # campaigns reloaded many times: start over
        _FINGERPRINTS.clear()
    fp = bytes.fromhex(proto.fingerprint)
    _FINGERPRINTS[id(proto)] = (proto, fp)
    return fp


def _name(s: str, what: str) -> bytes:
    b = s.encode()
    if not 0 < len(b) <= 255:
        raise LDPError(f"{what} {s[:20]!r} must be 1 to 255 utf-8 bytes")
    return b


def encode_compact(sections: Iterable[SingleReport | tuple[Campaign, str, int | None, np.ndarray]]) -> bytes:
    """The body of ``sections``, each a (campaign, attribute, t, reports) (a :class:`SingleReport`);
    ``t=None`` sets :data:`T_RECEIVED` (the server's step of the receiving time). Raises :class:`LDPError`."""
    parts: list[bytes] = []
    n_sections = total = 0
    for campaign, attribute, t, reports in sections:
        proto = campaign.attribute(attribute).protocol
        count = len(reports)
        if count < 1:
            raise LDPError(f"section {n_sections} ({attribute!r}) holds no report")
        flags, step = (T_RECEIVED, 0) if t is None else (0, check_step(t))
        cid, attr = _name(campaign.id, "campaign id"), _name(attribute, "attribute name")
        payload = proto.encode(reports)
        parts += [_SECTION.pack(_fingerprint(proto), step, count, len(payload), flags, len(cid), len(attr), 0),
                  cid, attr, payload]
        n_sections += 1
        total += count
    if not 1 <= n_sections <= MAX_SECTIONS:
        raise LDPError(f"a body holds 1 to {MAX_SECTIONS} sections, got {n_sections}")
    if total > MAX_REPORTS:
        raise LDPError(f"a body holds at most {MAX_REPORTS} reports, got {total}")
    return _BODY.pack(MAGIC, VERSION, 0, n_sections) + b"".join(parts)


def parse_compact(body: bytes | bytearray | memoryview) -> list[Section]:
    """The sections of ``body`` (structure only: no campaign is consulted, no payload decoded).

    Raises :class:`~wire.errors.TruncatedBatch`, :class:`~wire.errors.MalformedBatch`,
    :class:`~wire.errors.BadVersion` or :class:`~wire.errors.OversizedBatch`.
    """
    mv = memoryview(body).cast("B")
    size = mv.nbytes
    if size < _BODY.size:
        raise TruncatedBatch(f"{size} bytes is shorter than the {_BODY.size}-byte body header")
    magic, version, flags, n_sections = _BODY.unpack_from(mv)
    if magic != MAGIC:
        raise MalformedBatch("not a compact report body (bad magic)")
    if version != VERSION:
        raise BadVersion(f"compact body version {version}, expected {VERSION}")
    if flags:
        raise MalformedBatch(f"unknown body flags 0x{flags:02x}")
    if n_sections == 0:
        raise MalformedBatch("a body needs at least one section")
    if n_sections > MAX_SECTIONS:
        raise OversizedBatch(f"{n_sections} sections exceed the limit of {MAX_SECTIONS}")
    out: list[Section] = []
    pos, total = _BODY.size, 0
    for i in range(n_sections):
        if pos + _SECTION.size > size:
            raise TruncatedBatch(f"section {i}: the body ends inside its header")
        fp, t, count, plen, sflags, clen, alen, reserved = _SECTION.unpack_from(mv, pos)
        if sflags & ~T_RECEIVED or reserved:
            raise MalformedBatch(f"section {i}: unknown flags 0x{sflags:02x} or reserved byte {reserved}")
        if sflags & T_RECEIVED and t:
            raise MalformedBatch(f"section {i}: t must be 0 when the receiving time gives the step")
        if count == 0:
            raise MalformedBatch(f"section {i} holds no report")
        total += count
        if total > MAX_REPORTS:
            raise OversizedBatch(f"more than {MAX_REPORTS} reports in one body")
        if clen == 0 or alen == 0:
            raise MalformedBatch(f"section {i}: empty campaign or attribute name")
        pos += _SECTION.size
        end = pos + clen + alen + plen
        if end > size:
            raise TruncatedBatch(f"section {i}: the body ends {end - size} bytes before the section's end")
        try:
            cid = bytes(mv[pos:pos + clen]).decode()
            attr = bytes(mv[pos + clen:pos + clen + alen]).decode()
        except UnicodeDecodeError:
            raise MalformedBatch(f"section {i}: campaign or attribute name is not utf-8") from None
        out.append(Section(cid, attr, fp, t, count, sflags, mv[pos + clen + alen:end]))
        pos = end
    if pos != size:
        raise MalformedBatch(f"{size - pos} bytes after the last section")
    return out


def decode_compact(body: bytes | bytearray | memoryview, campaigns: Mapping[str, Campaign],
                   now: float | None = None) -> list[SingleReport]:
    """Parse and validate a compact body against the declared ``campaigns``: one
    :class:`~wire.single_report.SingleReport` per section, ``reports`` = its ``count`` rows (read-only
    views of ``body``). ``now`` (unix time, default the current time) gives the step of a section
    flagged :data:`T_RECEIVED`. Raises the :class:`~wire.errors.EnvelopeError` subclass of the first
    fault, its detail naming the section."""
    out: list[SingleReport] = []
    for i, s in enumerate(parse_compact(body)):
        campaign = campaigns.get(s.campaign)
        if campaign is None:
            raise UnknownCampaign(f"section {i}: campaign {s.campaign!r} is not declared")
        a = campaign.attributes.get(s.attribute)
        if a is None:
            raise UnknownAttribute(f"section {i}: campaign {s.campaign!r} has no attribute {s.attribute!r}")
        proto = a.protocol
        if s.fingerprint != _fingerprint(proto):
            raise WrongFingerprint(f"section {i}: report parameters {s.fingerprint.hex()} differ from the "
                                   f"campaign's {proto.fingerprint} for {s.attribute!r}")
        if s.count > campaign.max_batch_reports:
            raise OversizedBatch(f"section {i}: {s.count} reports exceed max_batch_reports="
                                 f"{campaign.max_batch_reports}")
        t = step_at(campaign, time.time() if now is None else now) if s.flags & T_RECEIVED else s.t
        env = Envelope(REPORTS, s.campaign, s.attribute, proto.name, s.fingerprint.hex(), t, s.count, s.payload)
        try:
            reports = decode_reports(env, campaign)
        except EnvelopeError as exc:
            raise type(exc)(f"section {i}: {exc.detail}") from None
        except Exception as exc:  # noqa: BLE001 - whatever breaks a codec is a bad payload
            raise BadPayload(f"section {i}: {type(exc).__name__}: {exc}") from None
        out.append(SingleReport(campaign, s.attribute, t, reports))
    return out


def count_reports(items: Sequence[SingleReport]) -> int:
    """The number of reports in decoded ``items`` (a section holds ``len(item.reports)`` of them)."""
    return sum(len(item.reports) for item in items)
