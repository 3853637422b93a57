"""Test vectors of the compact binary body (``docs/wire-format.md``): ``tests/data/wire-vectors.json``.

``python -m ldpstream_dev.wire_vectors [--out PATH]`` writes them: the campaign they use (its TOML text and
each attribute's protocol, parameters and fingerprint), valid bodies as hex with their decoded meaning
(one or more sections, every protocol family, a grouped attribute, the receiving-time flag), and
invalid bodies with the rejection reason a server must give. Reports come from the protocols'
randomizers in the labelled simulation mode (a seeded generator: reproducible, not private), so they
are real reports of each output space. ``tests/test_compact.py`` decodes every valid vector and
re-encodes it byte for byte, and checks every invalid one's reason.
"""
from __future__ import annotations

import argparse
import json
import struct
import tomllib
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from estimators.base import FrequencyProtocol
from estimators.randomness import SimulationWarning
from estimators.reference import lh_hash
from estimators.multidim import report_protocol
from wire.campaign import Campaign
from wire.compact import encode_compact

__all__ = ["CAMPAIGN_TOML", "VECTORS_PATH", "campaign", "report_rows", "report_meaning", "generate", "dumps", "main"]

VECTORS_PATH = Path(__file__).resolve().parent.parent / "tests" / "data" / "wire-vectors.json"
SEED = 20240610

CAMPAIGN_TOML = """\
[campaign]
id = "wire-vectors"
time_step_seconds = 60.0

[[attributes]]
name = "grr"
k = 5
protocol = "GRR"
eps = 1.0

[[attributes]]
name = "grr_wide"
k = 300
protocol = "GRR"
eps = 2.0

[[attributes]]
name = "oue"
k = 10
protocol = "OUE"
eps = 1.0

[[attributes]]
name = "app_version"
k = 100
protocol = "L-OSUE"
eps_inf = 2.0
eps_1 = 1.0

[[attributes]]
name = "lgrr"
k = 20
protocol = "L-GRR"
eps_inf = 2.0
eps_1 = 1.0

[[attributes]]
name = "olh"
k = 100
protocol = "OLH"
eps = 1.0

[[attributes]]
name = "crash_minute"
k = 360
protocol = "LOLOHA"
eps_inf = 2.0
eps_1 = 1.0

[[attributes]]
name = "hr"
k = 100
protocol = "HR"
eps = 1.0

[[attributes]]
name = "fhr"
k = 100
protocol = "FHR"
eps = 1.0

[[attributes]]
name = "ss_bits"
k = 50
protocol = "SS"
eps = 1.0

[[attributes]]
name = "ss_indices"
k = 50
protocol = "SS"
eps = 3.0

[[attributes]]
name = "she"
k = 4
protocol = "SHE"
eps = 1.0

[[attributes]]
name = "bitflip"
k = 100
protocol = "dBitFlipPM"
b = 10
d = 2
eps_inf = 2.0

[[attributes]]
name = "adp"
k = 10
protocol = "ADP"
eps = 1.0

[[attributes]]
name = "dark_mode"
k = 2

[[attributes]]
name = "language"
k = 20

[[groups]]
name = "device"
solution = "ALLOMFREE"
attributes = ["dark_mode", "language"]
eps_inf = 2.0
eps_1 = 1.0
"""


def campaign() -> Campaign:
    """The campaign of the vectors."""
    return Campaign.from_dict(tomllib.loads(CAMPAIGN_TOML))


def report_rows(reports: np.ndarray) -> list[Any]:
    """The report array as JSON numbers: one entry per report (a number, a list, or ``[seed, y]``)."""
    if reports.dtype.names:
        return [[int(r[name]) for name in reports.dtype.names] for r in reports]
    return reports.tolist()


def report_meaning(proto: FrequencyProtocol, row: np.ndarray) -> dict[str, Any]:
    """What one report says, in the terms of ``docs/wire-format.md``."""
    p = report_protocol(proto)
    name = p.name
    if name in ("GRR", "L-GRR"):
        return {"value": int(row)}
    if name in ("BLH", "OLH", "LOLOHA"):
        return {"seed": int(row["seed"]), "y": int(row["y"])}
    if name == "HR":
        return {"row": int(row) >> 1, "bit": int(row) & 1}
    if name == "FHR":
        return {"plus": int(row[0]), "minus": int(row[1])}
    if name == "dBitFlipPM":
        return {"pairs": [[int(c) >> 1, int(c) & 1] for c in row]}
    if name == "SHE":
        return {"coordinates": [int(c) for c in row]}
    if name == "SS" and getattr(p, "layout", "") == "indices":
        return {"subset": [int(c) for c in row]}
    # unary encodings and SS bits: k bits packed little-endian
    bits = np.unpackbits(np.asarray(row, dtype=np.uint8), bitorder="little")[:p.k]
    return {"set_bits": [int(i) for i in np.flatnonzero(bits)]}


def _randomize(c: Campaign, attribute: str, values: list[int], rng: np.random.Generator) -> np.ndarray:
    a = c.attribute(attribute)
    if a.group is not None:
        g = c.groups[a.group]
        j = g.attributes.index(attribute)
        sol = g.solution
        # ALLOMFREE samples one attribute per device: draw devices until enough sampled j
        out: list[np.ndarray] = []
        while sum(len(r) for r in out) < len(values):
            tuples = np.array([[v % k for k in sol.ks] for v in values], dtype=np.int64)
            rep = sol.randomize(tuples, rng, state=sol.new_state(len(values), rng))
            out.append(rep.reports[j])
        return np.concatenate(out)[:len(values)]
    proto = a.protocol
    state = proto.new_state(len(values), rng) if proto.memo_size else None
    return proto.randomize(np.array(values, dtype=np.int64), rng, state=state)


def _section_doc(c: Campaign, attribute: str, t: int | None, reports: np.ndarray) -> dict[str, Any]:
    proto = c.attribute(attribute).protocol
    return {"campaign": c.id, "attribute": attribute, "protocol": proto.name, "fingerprint": proto.fingerprint,
            "t": t, "count": len(reports), "report_bytes": proto.report_nbytes,
            "reports": report_rows(reports), "meaning": [report_meaning(proto, r) for r in reports]}


def _vector(name: str, description: str, c: Campaign, sections: list[tuple[str, int | None, np.ndarray]]) -> dict:
    body = encode_compact([(c, attr, t, r) for attr, t, r in sections])
    return {"name": name, "description": description, "length": len(body), "hex": body.hex(),
            "sections": [_section_doc(c, attr, t, r) for attr, t, r in sections]}


def _patched(body: bytes, offset: int, new: bytes) -> str:
    b = bytearray(body)
    b[offset:offset + len(new)] = new
    return bytes(b).hex()


def _invalid(c: Campaign, grr: np.ndarray, oue: np.ndarray) -> list[dict[str, str]]:
    """Bodies a server must refuse, by byte surgery on valid ones (offsets of docs/wire-format.md)."""
    one = encode_compact([(c, "grr", 28_000_000, grr[:1])])
    names_at = 32                                      # body header 8 + section header 24
    grr_payload = names_at + len(c.id) + len("grr")     # the report codec header, then the report
    u32 = struct.Struct("<I").pack
    ue = encode_compact([(c, "oue", 28_000_000, oue[:1])])
    ue_last = len(ue) - 1                               # the report's second byte holds bits 8..15
    out = [
        ("bad_magic", "malformed", _patched(one, 0, b"LDPX")),
        ("bad_version", "bad_version", _patched(one, 4, b"\x02")),
        ("body_flags", "malformed", _patched(one, 5, b"\x01")),
        ("no_section", "malformed", _patched(one, 6, struct.pack("<H", 0))[:16]),
        ("too_many_sections", "oversized", _patched(one, 6, struct.pack("<H", 257))),
        ("short_header", "truncated", one[:6].hex()),
        ("truncated_section_header", "truncated", one[:20].hex()),
        ("truncated_payload", "truncated", one[:-1].hex()),
        ("trailing_bytes", "malformed", (one + b"\x00").hex()),
        ("payload_len_beyond_body", "truncated", _patched(one, 24, u32(1000))),
        ("unknown_campaign", "unknown_campaign", _patched(one, names_at, b"x")),
        ("unknown_attribute", "unknown_attribute", _patched(one, names_at + len(c.id), b"g-r")),
        ("wrong_fingerprint", "wrong_fingerprint", _patched(one, 8, bytes([one[8] ^ 0xFF]))),
        ("zero_count", "malformed", _patched(one, 20, u32(0))),
        ("count_differs_from_payload", "bad_payload", _patched(one, 20, u32(2))),
        ("received_time_with_t", "malformed", _patched(one, 28, b"\x01")),
        ("unknown_section_flag", "malformed", _patched(one, 28, b"\x02")),
        ("bad_report_codec_magic", "bad_payload", _patched(one, grr_payload, b"LDPx")),
        ("grr_value_outside_domain", "bad_payload", _patched(one, len(one) - 1, b"\x05")),
        ("unary_pad_bit_set", "bad_payload", _patched(ue, ue_last, bytes([ue[ue_last] | 0x80]))),
    ]
    return [{"name": n, "reason": r, "hex": h} for n, r, h in out]


def _hash_examples(reps: dict[str, np.ndarray], c: Campaign) -> list[dict[str, Any]]:
    """``H_seed(v)`` of the local-hashing vectors' seeds for the first values (docs/wire-format.md)."""
    out = []
    for attr in ("olh", "crash_minute"):
        proto = c.attribute(attr).protocol
        seed = int(reps[attr]["seed"][0])
        values = list(range(12))
        out.append({"attribute": attr, "seed": seed, "g": proto.g, "values": values,
                    "hashes": lh_hash(np.full(len(values), seed, dtype=np.uint32), values, proto.g).tolist()})
    return out


def generate() -> dict[str, Any]:
    """The vectors document (see the module doc)."""
    c = campaign()
    rng = np.random.default_rng(SEED)
    t = 28_000_000  # a step of 60 s: 2023-03-28
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        reps = {a: _randomize(c, a, [3, 1, 0], rng) for a in c.attributes}
    vectors = [
        _vector("grr_single", "one GRR report (k = 5: uint8 value)", c, [("grr", t, reps["grr"][:1])]),
        _vector("grr_wide_single", "one GRR report over k = 300 (uint16 value, little-endian)", c,
                [("grr_wide", t, reps["grr_wide"][:1])]),
        _vector("oue_single", "one OUE report (k = 10: 2 bytes of packed bits, 6 pad bits 0)", c,
                [("oue", t, reps["oue"][:1])]),
        _vector("losue_single", "one L-OSUE report (k = 100: 13 bytes of packed bits)", c,
                [("app_version", t, reps["app_version"][:1])]),
        _vector("lgrr_single", "one L-GRR report (k = 20)", c, [("lgrr", t, reps["lgrr"][:1])]),
        _vector("olh_single", "one OLH report (seed u32, y uint8)", c, [("olh", t, reps["olh"][:1])]),
        _vector("loloha_single", "one LOLOHA report (the device's fixed seed u32, y uint8)", c,
                [("crash_minute", t, reps["crash_minute"][:1])]),
        _vector("hr_single", "one HR report (2 row + bit, uint8 for K = 128)", c, [("hr", t, reps["hr"][:1])]),
        _vector("fhr_single", "one FHR report (+1 and -1 positions, 2 x uint8)", c, [("fhr", t, reps["fhr"][:1])]),
        _vector("ss_bits_single", "one SS report, bits layout (k = 50, omega = 13)", c,
                [("ss_bits", t, reps["ss_bits"][:1])]),
        _vector("ss_indices_single", "one SS report, indices layout (omega = 2 increasing uint8)", c,
                [("ss_indices", t, reps["ss_indices"][:1])]),
        _vector("she_single", "one SHE report (k = 4 int8 coordinates)", c, [("she", t, reps["she"][:1])]),
        _vector("bitflip_single", "one dBitFlipPM report (d = 2 pair codes 2 j + x, buckets increasing)", c,
                [("bitflip", t, reps["bitflip"][:1])]),
        _vector("adp_single", "one ADP report (ADP chose GRR at k = 10, eps = 1)", c, [("adp", t, reps["adp"][:1])]),
        _vector("group_attribute_single", "one report of a grouped attribute (ALLOMFREE's channel for 'language', "
                                          "L-OSUE over k = 20)", c, [("language", t, reps["language"][:1])]),
        _vector("received_time", "one GRR report without t: flag T_RECEIVED, t field 0 (the server's step)", c,
                [("grr", None, reps["grr"][:1])]),
        _vector("batch_three", "one section of 3 L-OSUE reports", c, [("app_version", t, reps["app_version"])]),
        _vector("mixed_sections", "4 sections: GRR x3, OLH x2, a grouped attribute x1, LOLOHA x1 at another step",
                c, [("grr", t, reps["grr"]), ("olh", t, reps["olh"][:2]), ("dark_mode", t, reps["dark_mode"][:1]),
                    ("crash_minute", t - 1, reps["crash_minute"][:1])]),
    ]
    return {
        "format": "ldp-stream compact report body (application/x-ldp-reports), version 1: docs/wire-format.md",
        "generator": "python -m ldpstream_dev.wire_vectors (reports drawn in simulation mode: reproducible, not private)",
        "campaign_toml": CAMPAIGN_TOML,
        "attributes": {a.name: {"protocol": a.protocol.name, "params": a.protocol.params(),
                                "fingerprint": a.protocol.fingerprint, "report_bytes": a.protocol.report_nbytes}
                       for a in c.attributes.values()},
        "lh_hash_examples": _hash_examples(reps, c),
        "valid": vectors,
        "invalid": _invalid(c, reps["grr"], reps["oue"]),
    }


def _flat(o: Any) -> bool:
    """A value written on one line: a scalar, or a list/dict of scalars and lists of scalars."""
    if isinstance(o, dict):
        return len(o) <= 4 and all(_flat(v) and not isinstance(v, dict) for v in o.values())
    if isinstance(o, list):
        return all(not isinstance(v, (list, dict)) or (isinstance(v, list) and _flat(v)) for v in o)
    return True


def dumps(doc: Any, indent: str = "") -> str:
    """``doc`` as indented JSON with flat values (report rows, small objects) on one line."""
    if _flat(doc):
        return json.dumps(doc)
    inner = indent + " "
    if isinstance(doc, dict):
        items = [f"{inner}{json.dumps(k)}: {dumps(v, inner)}" for k, v in doc.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}" + ("" if indent else "\n")
    items = [inner + dumps(v, inner) for v in doc]
    return "[\n" + ",\n".join(items) + f"\n{indent}]"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=VECTORS_PATH)
    args = ap.parse_args(argv)
    doc = generate()
    args.out.write_text(dumps(doc))
    print(f"{len(doc['valid'])} valid and {len(doc['invalid'])} invalid vectors -> {args.out}")


if __name__ == "__main__":
    main()
