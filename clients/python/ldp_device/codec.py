"""The bytes that leave a device (``docs/wire-format.md``): the batch payload of its report, the single-report
JSON object the ingest's ``POST /reports`` accepts, and (optionally) the compact binary body.

* payload: ``"LDPr" | codec version u8 (1) | count u32 | count reports`` (little-endian; a report is the
  protocol's report array of one device, what the randomizers return);
* single report: ``{"campaign": id, "attribute": name, "t": step, "payload": base64(payload)}``;
* compact body (``application/x-ldp-reports``): ``"LDPC" | version u8 (1) | flags u8 (0) | sections u16`` then per
  section ``fingerprint 8 bytes | t u32 | count u32 | payload_len u32 | flags u8 | campaign_len u8 |
  attribute_len u8 | 0 u8 | campaign | attribute | payload``.
"""
from __future__ import annotations

import base64
import struct
from typing import Any, Iterable, Sequence

from .errors import LDPError

__all__ = ["PAYLOAD_MAGIC", "CODEC_VERSION", "MAX_STEP", "check_step", "encode_payload", "single_report",
           "COMPACT_CONTENT_TYPE", "encode_compact"]

PAYLOAD_MAGIC = b"LDPr"
CODEC_VERSION = 1
_PAYLOAD = struct.Struct("<4sBI")
MAX_STEP = 2**32 - 1  # t is a u32

COMPACT_CONTENT_TYPE = "application/x-ldp-reports"
_BODY = struct.Struct("<4sBBH")
_SECTION = struct.Struct("<8sIIIBBBB")
MAX_SECTIONS = 256
MAX_REPORTS = 100_000


def check_step(t: int) -> int:
    """``t`` as an ``int`` if it is a time step the wire can carry (``[0, 2^32 - 1]``)."""
    if isinstance(t, bool):
        raise LDPError(f"time step must be an integer, got {t!r}")
    step = int(t)
    if not 0 <= step <= MAX_STEP:
        raise LDPError(f"time step must lie in [0, {MAX_STEP}], got {step}")
    return step


def encode_payload(reports: Sequence[bytes], report_nbytes: int) -> bytes:
    """The batch payload of ``reports`` (each ``report_nbytes`` bytes): ``proto.encode`` of the reference."""
    for r in reports:
        if len(r) != report_nbytes:
            raise LDPError(f"a report of this protocol has {report_nbytes} bytes, got {len(r)}")
    return _PAYLOAD.pack(PAYLOAD_MAGIC, CODEC_VERSION, len(reports)) + b"".join(reports)


def single_report(campaign_id: str, attribute: str, t: int, payload: bytes) -> dict[str, Any]:
    """The JSON object of one report (``wire.single_report.encode_single_report``)."""
    return {"campaign": campaign_id, "attribute": attribute, "t": check_step(t),
            "payload": base64.b64encode(payload).decode("ascii")}


def _name(s: str, what: str) -> bytes:
    b = s.encode()
    if not 0 < len(b) <= 255:
        raise LDPError(f"{what} {s[:20]!r} must be 1 to 255 utf-8 bytes")
    return b


def encode_compact(sections: Iterable[tuple[str, str, str, int | None, bytes]]) -> bytes:
    """The compact body of ``sections``, each ``(campaign id, attribute, protocol fingerprint (16 hex digits),
    t or None (the receiving step), payload)``."""
    parts: list[bytes] = []
    n_sections = total = 0
    for cid, attribute, fingerprint, t, payload in sections:
        magic, version, count = _PAYLOAD.unpack_from(payload)
        if magic != PAYLOAD_MAGIC or version != CODEC_VERSION or count < 1:
            raise LDPError(f"section {n_sections} ({attribute!r}) holds no report payload")
        flags, step = (0x01, 0) if t is None else (0, check_step(t))
        c, a = _name(cid, "campaign id"), _name(attribute, "attribute name")
        parts += [_SECTION.pack(bytes.fromhex(fingerprint), step, count, len(payload), flags, len(c), len(a), 0),
                  c, a, payload]
        n_sections += 1
        total += count
    if not 1 <= n_sections <= MAX_SECTIONS:
        raise LDPError(f"a body holds 1 to {MAX_SECTIONS} sections, got {n_sections}")
    if total > MAX_REPORTS:
        raise LDPError(f"a body holds at most {MAX_REPORTS} reports, got {total}")
    return _BODY.pack(b"LDPC", 1, 0, n_sections) + b"".join(parts)
