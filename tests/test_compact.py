"""The compact binary report body (wire/compact.py, docs/wire-format.md) and its test vectors."""
from __future__ import annotations

import base64
import json
import threading
import tomllib
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from ldpstream_dev.wire_vectors import VECTORS_PATH, campaign, generate, report_meaning, report_rows
from estimators.errors import LDPError
from estimators.randomness import SimulationWarning
from producers.sdk import Device, IngestError
from wire import compact
from wire.campaign import Campaign, step_at
from wire.compact import (CONTENT_TYPE, MAX_REPORTS, MAX_SECTIONS, T_RECEIVED, count_reports, decode_compact,
                          encode_compact, parse_compact)
from wire.errors import EnvelopeError
from wire.single_report import decode_single_report, encode_single_report

VECTORS = json.loads(VECTORS_PATH.read_text())
NOW = 1_700_000_000.0


def _campaigns(doc: dict) -> dict[str, Campaign]:
    c = Campaign.from_dict(tomllib.loads(doc["campaign_toml"]))
    return {c.id: c}


def _check_valid(doc: dict, vector: dict) -> None:
    """Decode the vector, compare with its stated meaning, re-encode byte for byte."""
    campaigns = _campaigns(doc)
    body = bytes.fromhex(vector["hex"])
    assert len(body) == vector["length"]
    items = decode_compact(body, campaigns, now=NOW)
    assert len(items) == len(vector["sections"])
    for item, sec in zip(items, vector["sections"]):
        c = campaigns[sec["campaign"]]
        proto = c.attribute(sec["attribute"]).protocol
        assert item.campaign is c and item.attribute == sec["attribute"]
        assert (proto.name, proto.fingerprint, proto.report_nbytes) == (sec["protocol"], sec["fingerprint"],
                                                                         sec["report_bytes"])
        assert doc["attributes"][sec["attribute"]]["fingerprint"] == proto.fingerprint
        assert item.t == (step_at(c, NOW) if sec["t"] is None else sec["t"])
        assert len(item.reports) == sec["count"]
        assert report_rows(item.reports) == sec["reports"]
        assert [report_meaning(proto, r) for r in item.reports] == sec["meaning"]
    again = encode_compact([(it.campaign, it.attribute, sec["t"], it.reports)
                            for it, sec in zip(items, vector["sections"])])
    assert again.hex() == vector["hex"]


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=[v["name"] for v in VECTORS["valid"]])
def test_valid_vector_decodes_and_reencodes_byte_for_byte(vector):
    _check_valid(VECTORS, vector)


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=[v["name"] for v in VECTORS["invalid"]])
def test_invalid_vector_is_refused_with_its_reason(vector):
    with pytest.raises(EnvelopeError) as info:
        decode_compact(bytes.fromhex(vector["hex"]), _campaigns(VECTORS), now=NOW)
    assert info.value.reason == vector["reason"], str(info.value)


def test_vectors_cover_every_protocol_family_and_the_generator_agrees():
    """The committed file holds GRR, unary, local hashing and grouped vectors; a fresh generation passes the
    same checks (the generator and the file cannot drift apart in structure)."""
    protocols = {s["protocol"] for v in VECTORS["valid"] for s in v["sections"]}
    assert {"GRR", "OUE", "L-OSUE", "OLH", "LOLOHA", "HR", "FHR", "SS", "SHE", "dBitFlipPM",
            "ALLOMFREE/L-OSUE"} <= protocols
    assert any(len(v["sections"]) > 1 for v in VECTORS["valid"])
    assert any(s["t"] is None for v in VECTORS["valid"] for s in v["sections"])
    fresh = generate()
    assert [v["name"] for v in fresh["valid"]] == [v["name"] for v in VECTORS["valid"]]
    assert [(v["name"], v["reason"]) for v in fresh["invalid"]] == [(v["name"], v["reason"])
                                                                    for v in VECTORS["invalid"]]
    for vector in fresh["valid"]:
        _check_valid(fresh, vector)
    for vector in fresh["invalid"]:
        with pytest.raises(EnvelopeError) as info:
            decode_compact(bytes.fromhex(vector["hex"]), _campaigns(fresh), now=NOW)
        assert info.value.reason == vector["reason"]


def _reports(c: Campaign, attribute: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = c.attribute(attribute)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        if a.group is not None:
            g = c.groups[a.group]
            j = g.attributes.index(attribute)
            tuples = np.stack([rng.integers(0, k, 4 * n) for k in g.solution.ks], axis=1)
            return g.solution.randomize(tuples, rng, state=g.solution.new_state(4 * n, rng)).reports[j][:n]
        proto = a.protocol
        state = proto.new_state(n, rng) if proto.memo_size else None
        return proto.randomize(rng.integers(0, proto.k, n), rng, state=state)


def test_every_attribute_round_trips_and_matches_the_json_form():
    """Binary and JSON carry the same payload: the JSON ``payload`` is base64 of the section payload."""
    c = campaign()
    campaigns = {c.id: c}
    for i, name in enumerate(c.attributes):
        r = _reports(c, name, 50, seed=i)
        assert len(r) == 50
        [item] = decode_compact(encode_compact([(c, name, 7, r)]), campaigns)
        assert item.t == 7 and np.array_equal(item.reports, r) and item.reports.dtype == r.dtype
        assert not item.reports.flags.writeable  # a view of the body, not a copy
        obj = encode_single_report(c, name, 7, r[:1])
        body = encode_compact([(c, name, 7, r[:1])])
        [section] = parse_compact(body)
        assert base64.b64decode(obj["payload"]) == bytes(section.payload)
        assert np.array_equal(decode_single_report(obj, campaigns).reports, decode_compact(body, campaigns)[0].reports)


def test_sections_keep_their_order_and_count_reports_counts_rows():
    c = campaign()
    grr, olh = _reports(c, "grr", 10, 1), _reports(c, "olh", 3, 2)
    body = encode_compact([(c, "grr", 5, grr), (c, "olh", 5, olh), (c, "grr", 6, grr[:2])])
    items = decode_compact(body, {c.id: c})
    assert [(it.attribute, it.t, len(it.reports)) for it in items] == [("grr", 5, 10), ("olh", 5, 3), ("grr", 6, 2)]
    assert count_reports(items) == 15
    assert CONTENT_TYPE == "application/x-ldp-reports"


def test_received_time_flag_takes_the_step_of_now():
    c = campaign()
    body = encode_compact([(c, "grr", None, _reports(c, "grr", 1, 0))])
    assert parse_compact(body)[0].flags == T_RECEIVED and parse_compact(body)[0].t == 0
    assert decode_compact(body, {c.id: c}, now=NOW)[0].t == step_at(c, NOW) == int(NOW // 60)


def test_limits_are_enforced_on_both_sides():
    c = campaign()
    one = _reports(c, "grr", 1, 0)
    with pytest.raises(LDPError, match="sections"):
        encode_compact([(c, "grr", 1, one)] * (MAX_SECTIONS + 1))
    with pytest.raises(LDPError, match="sections"):
        encode_compact([])
    with pytest.raises(LDPError, match="no report"):
        encode_compact([(c, "grr", 1, one[:0])])
    with pytest.raises(LDPError, match="at most"):
        encode_compact([(c, "grr", 1, np.zeros(MAX_REPORTS + 1, dtype=np.uint8))])
    with pytest.raises(LDPError):
        encode_compact([(c, "grr", -1, one)])
    # a header that announces more reports than the limit is refused before any payload is looked at
    body = bytearray(encode_compact([(c, "grr", 1, one)]))
    body[20:24] = (MAX_REPORTS + 1).to_bytes(4, "little")
    with pytest.raises(EnvelopeError) as info:
        parse_compact(bytes(body))
    assert info.value.reason == "oversized"
    # the campaign's own batch limit
    small = Campaign.from_dict({**tomllib.loads(VECTORS["campaign_toml"]),
                                "campaign": {"id": "wire-vectors", "time_step_seconds": 60.0, "max_batch_reports": 2}})
    with pytest.raises(EnvelopeError) as info:
        decode_compact(encode_compact([(c, "grr", 1, _reports(c, "grr", 3, 0))]), {small.id: small})
    assert info.value.reason == "oversized" and "section 0" in str(info.value)


def test_errors_name_the_section():
    c = campaign()
    good = (c, "grr", 1, _reports(c, "grr", 1, 0))
    body = bytearray(encode_compact([good, good]))
    second = len(body) // 2 + 4  # the two sections have the same length after the 8-byte body header
    body[second] ^= 0xFF         # the first fingerprint byte of section 1
    with pytest.raises(EnvelopeError, match="section 1") as info:
        decode_compact(bytes(body), {c.id: c})
    assert info.value.reason == "wrong_fingerprint"


def test_every_prefix_and_byte_flip_is_refused_cleanly():
    """No truncation or single-byte change makes the parser fail with anything but an EnvelopeError (and no
    truncation is accepted); a flip inside a report may still decode to a valid report."""
    c = campaign()
    body = bytes.fromhex(next(v for v in VECTORS["valid"] if v["name"] == "mixed_sections")["hex"])
    campaigns = {c.id: c}
    for n in range(len(body)):
        with pytest.raises(EnvelopeError):
            decode_compact(body[:n], campaigns, now=NOW)
    for i in range(len(body)):
        for x in (0x01, 0x80, 0xFF):
            b = bytearray(body)
            b[i] ^= x
            try:
                decode_compact(bytes(b), campaigns, now=NOW)
            except EnvelopeError:
                pass


def test_fingerprint_cache_follows_the_protocol_object():
    c = campaign()
    proto = c.attribute("grr").protocol
    assert compact._fingerprint(proto) == bytes.fromhex(proto.fingerprint)
    other = Campaign.from_dict({**tomllib.loads(VECTORS["campaign_toml"]),
                                "attributes": [{"name": "grr", "k": 5, "protocol": "GRR", "eps": 2.0}],
                                "groups": []})
    body = encode_compact([(other, "grr", 1, _reports(other, "grr", 1, 0))])
    with pytest.raises(EnvelopeError) as info:
        decode_compact(body, {c.id: c})
    assert info.value.reason == "wrong_fingerprint"


def test_local_hashing_examples_match_the_server_hash():
    """The spec's ``H_seed(v)`` examples are what the server's support counting computes."""
    c = campaign()
    assert VECTORS["lh_hash_examples"]
    for ex in VECTORS["lh_hash_examples"]:
        proto = c.attribute(ex["attribute"]).protocol
        assert proto.g == ex["g"]
        reports = np.zeros(1, dtype=proto.report_dtype)
        reports["seed"] = ex["seed"]
        assert [int(proto.hash_values(reports, v)[0]) for v in ex["values"]] == ex["hashes"]


class _Capture(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Capture.bodies.append((self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"accepted": 1}')

    def log_message(self, *args):
        pass


def test_sdk_send_binary_posts_the_compact_body(tmp_path):
    """Device.send_binary: report objects of several attributes (a group's too) in one binary request that
    decodes to the same reports as their JSON form."""
    c = campaign()
    server = HTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dev = Device(c, tmp_path / "dev", budget_eps=None,
                     ingest_url=f"http://127.0.0.1:{server.server_address[1]}/reports")
        objs = [dev.report("grr", 3, t=9), dev.report("app_version", 42, t=9), dev.report("olh", 7, t=10),
                *dev.report_group("device", {"dark_mode": 1, "language": 5}, t=9)]
        assert dev.send_binary(objs) == {"accepted": 1}
        assert dev.send_binary(objs[0]) == {"accepted": 1}
    finally:
        server.shutdown()
        server.server_close()
    (ctype, body), (_, one) = _Capture.bodies[-2:]
    assert ctype == CONTENT_TYPE
    items = decode_compact(body, {c.id: c})
    assert [(it.attribute, it.t) for it in items] == [(o["attribute"], o["t"]) for o in objs]
    for it, o in zip(items, objs):
        assert np.array_equal(it.reports, decode_single_report(o, {c.id: c}).reports)
    assert len(body) < 0.75 * len(json.dumps(objs))
    assert decode_compact(one, {c.id: c})[0].attribute == "grr"
    with pytest.raises(EnvelopeError):
        dev.send_binary({**objs[0], "attribute": "nope"})
    with pytest.raises(IngestError, match="no ingest_url"):
        Device(c, tmp_path / "dev").send_binary(objs)
