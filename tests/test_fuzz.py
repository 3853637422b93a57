"""Issue 10 acceptance 4: property-based fuzzing of every decoder of untrusted bytes (hypothesis).

No input crashes a worker or an ingest process or changes counts it should not:

* every protocol codec (every name of ``estimators.PROTOCOLS`` and the attribute views of every solution of
  ``estimators.SOLUTIONS``): ``decode`` accepts exactly the report arrays of the output space (an independent
  oracle, :func:`fuzz_strategies.in_output_space`), byte for byte, and raises ``InvalidReports`` otherwise; what
  it accepts validates and counts as the plain-numpy reference says, within the bounds the protocol implies;
* the batch envelope (:mod:`wire.envelope`, the worker's decoder): arbitrary bytes and mutations of valid
  envelopes (bit flips, truncations, extensions, length and count fields, replaced header fields) are decoded
  or rejected with an ``EnvelopeError`` subclass naming a reason, nothing else; a decode allocates no more than
  a small multiple of the bytes received, whatever the lengths in the header say;
* the ingest's parsers: the JSON single report and request body (:mod:`wire.single_report`) and the compact
  binary body (:mod:`wire.compact`), likewise; and its ``POST /reports`` handler (credentials, headers, body,
  limits; :mod:`stream_app.ingest.handler`): always an answer, never an exception, and nothing of a refused
  request published;
* the worker's hot path (``Pipeline.process``) against a real Redis: a rejected message leaves every count
  unchanged, an accepted batch adds exactly its own support and number of reports to its own step, once.

The cases are derandomized (a fixed seed: CI is reproducible) and counted; the last test checks that at least
10,000 ran. A longer run with fresh random cases (:mod:`fuzz_strategies`)::

    LDP_FUZZ_SCALE=20 LDP_FUZZ_RANDOM=1 .venv/bin/python -m pytest -q tests/test_fuzz.py
"""
from __future__ import annotations

import asyncio
import base64
import json
import tracemalloc
import uuid
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import estimators
from estimators.errors import InvalidReports
from fuzz_strategies import (CASES, MUTATIONS, NOW, ORACLE_NAMES, OUTCOMES, PROTOCOL_SPECS, REJECTIONS, SOLUTION_SPECS,
                             CampaignStrategies, check_accepted, examples, fuzz_campaign, fuzz_settings,
                             in_output_space, mutate, same_reports, valid_reports)
from wire import envelope as E
from estimators.multidim import report_protocol
from wire.campaign import Campaign
from wire.errors import REASONS, EnvelopeError
from wire.single_report import SingleReport, decode_report_request, decode_single_report

pytestmark = pytest.mark.timeout(300)

CAMPAIGN = fuzz_campaign("fuzz")
CAMPAIGNS = {CAMPAIGN.id: CAMPAIGN}
PIPE_CAMPAIGN = fuzz_campaign(f"fuzz-{uuid.uuid4().hex[:8]}")  # a fresh id: the session's Redis may be shared
S = CampaignStrategies(CAMPAIGN)
PIPE_S = CampaignStrategies(PIPE_CAMPAIGN, t_max=5)
ATTRIBUTES = sorted(CAMPAIGN.attributes)
MIN_CASES = 10_000
PEAKS: list[tuple[int, int]] = []  # (peak bytes allocated by the worker's decode, bytes received)

# cases per test (a parametrized test: per parameter)
N_CODEC = 40
N_ENVELOPE = 3000
N_JSON = 1500
N_BODY = 800
N_COMPACT = 1200
N_HANDLER = 800
N_PIPELINE = 500
PLAN: dict[str, int] = {
    **{f"test_codec_report_arrays[{a}]": N_CODEC for a in ATTRIBUTES},
    **{f"test_codec_payload_bytes[{a}]": N_CODEC for a in ATTRIBUTES},
    "test_envelope_decoder": N_ENVELOPE,
    "test_single_report_objects": N_JSON,
    "test_report_request_bodies": N_BODY,
    "test_compact_bodies": N_COMPACT,
    "test_ingest_handler_requests": N_HANDLER,
    "test_pipeline_counts": N_PIPELINE,
}


def _done(name: str, accepted: bool) -> None:
    """Count a case of test ``name`` and whether its input was accepted (the last test checks both happen)."""
    CASES[name] += 1
    OUTCOMES[name.split("[")[0], accepted] += 1


def _rejected(test: str, exc: EnvelopeError) -> None:
    """A clean rejection: a subclass of ``EnvelopeError`` naming one of the reasons (counted per test)."""
    assert type(exc) is not EnvelopeError and exc.reason in REASONS, (type(exc), exc.reason)
    REJECTIONS[test, exc.reason] += 1


@pytest.fixture(scope="module", autouse=True)
def warm_kernels() -> Any:
    """One numba thread (the cases are tiny: a parallel region's wake-ups cost more than the work on a busy
    machine) and every support kernel compiled before the timed cases (a first numba call is not a slow
    decoder)."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    for attribute in ATTRIBUTES:
        proto = CAMPAIGN.attributes[attribute].protocol
        r = valid_reports(CAMPAIGN, attribute, 8, 0)
        for arr in (r, r.copy(), r[:0], proto.decode(proto.encode(r)), proto.decode(proto.encode(r[:0]))):
            proto.validate_reports(arr)  # writable and read-only arrays are different numba signatures
            proto.support(arr)
    yield
    numba.set_num_threads(threads)


def test_every_protocol_and_solution_is_fuzzed() -> None:
    """A new protocol or solution fails here until the fuzz campaign and the oracles cover it."""
    assert {p for p, _ in PROTOCOL_SPECS} == set(estimators.PROTOCOLS)
    assert {s for s, _ in SOLUTION_SPECS} == set(estimators.SOLUTIONS)
    assert {report_protocol(a.protocol).name for a in CAMPAIGN.attributes.values()} <= ORACLE_NAMES


# ---------------------------------------------------------------------------- protocol codecs
@pytest.mark.parametrize("attribute", ATTRIBUTES)
@fuzz_settings(N_CODEC)
@given(data=st.data())
def test_codec_report_arrays(attribute: str, data: st.DataObject) -> None:
    """``decode(encode(r))`` is ``r`` if ``r`` lies in the output space, else ``InvalidReports``."""
    proto = CAMPAIGN.attributes[attribute].protocol
    r = data.draw(S.arrays[attribute])
    blob = proto.encode(r)
    try:
        out = proto.decode(blob)
    except InvalidReports:
        assert not in_output_space(proto, r), "valid reports refused"
        with pytest.raises(InvalidReports):
            proto.validate_reports(r)
    else:
        assert same_reports(out, r)
        check_accepted(proto, out)
    _done(f"test_codec_report_arrays[{attribute}]", in_output_space(proto, r))


@pytest.mark.parametrize("attribute", ATTRIBUTES)
@fuzz_settings(N_CODEC)
@given(data=st.data())
def test_codec_payload_bytes(attribute: str, data: st.DataObject) -> None:
    """``decode`` of mutated payloads: ``InvalidReports``, or exactly the reports the bytes hold, which are valid."""
    proto = CAMPAIGN.attributes[attribute].protocol
    blob = data.draw(S.payloads[attribute])
    try:
        out = proto.decode(blob)
    except InvalidReports:
        _done(f"test_codec_payload_bytes[{attribute}]", False)
    else:
        assert blob[:5] == b"LDPr\x01" and int.from_bytes(blob[5:9], "little") == len(out)
        assert out.tobytes() == blob[9:]
        check_accepted(proto, out)
        _done(f"test_codec_payload_bytes[{attribute}]", True)


# ---------------------------------------------------------------------------- the batch envelope
def decode_envelope(blob: bytes, campaigns: dict, test: str = "",
                    peak: list[int] | None = None) -> tuple[str, Any, Any, Any]:
    """What the worker makes of ``blob`` before Redis: ``("rejected", reason)``, ``("watermark", env)``,
    ``("empty", env)`` or ``("reports", env, reports, counts)``; only ``EnvelopeError`` may be raised.
    ``peak``: append the peak of the memory the worker's steps allocated (parse, validate, decode, support)."""
    if peak is not None:
        tracemalloc.start()
    try:
        env = E.parse(blob)
        campaign = E.validate(env, campaigns)
        if env.kind == E.WATERMARK:
            return "watermark", env, None, None
        if env.count == 0:
            return "empty", env, None, None
        reports = E.decode_reports(env, campaign)
        counts = campaign.attributes[env.attribute].protocol.support(reports)
    except EnvelopeError as exc:
        _rejected(test, exc)
        return "rejected", exc.reason, None, None
    finally:
        if peak is not None:
            peak.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    assert env.kind == E.REPORTS and env.batch_id
    assert env.campaign in campaigns and env.attribute in campaign.attributes
    proto = campaign.attributes[env.attribute].protocol
    assert env.protocol == proto.name and env.fingerprint == proto.fingerprint
    assert 0 < env.count <= campaign.max_batch_reports and len(reports) == env.count
    assert reports.tobytes() == bytes(env.payload[9:])
    np.testing.assert_array_equal(check_accepted(proto, reports), counts)
    return "reports", env, reports, counts


@fuzz_settings(N_ENVELOPE)
@given(blob=S.envelopes)
def test_envelope_decoder(blob: bytes) -> None:
    """parse + validate + decode_reports + support: valid reports and their counts or an ``EnvelopeError``; the
    worker's steps allocate at most a small multiple of the bytes received, whatever the header says."""
    peak: list[int] = []
    kind = decode_envelope(blob, CAMPAIGNS, "test_envelope_decoder", peak)[0]
    assert kind in ("rejected", "watermark", "empty", "reports")
    assert peak[0] <= 8 * len(blob) + (256 << 10), f"decoding {len(blob)} bytes allocated {peak[0]} bytes"
    PEAKS.append((peak[0], len(blob)))
    _done("test_envelope_decoder", kind == "reports")


def test_valid_envelopes_of_every_attribute_decode_to_their_reports() -> None:
    """The mutation-free case, for every attribute: a packed batch decodes to its own reports."""
    for i, attribute in enumerate(ATTRIBUTES):
        reports = valid_reports(CAMPAIGN, attribute, 20, i)
        blob = E.pack_reports(CAMPAIGN, attribute, 7, reports, batch_id=f"b{i}")
        kind, env, got, counts = decode_envelope(blob, CAMPAIGNS)
        if len(reports) == 0:
            assert kind == "empty"
            continue
        assert kind == "reports" and env.t == 7 and same_reports(got, reports)
        np.testing.assert_array_equal(counts, CAMPAIGN.attributes[attribute].protocol.support(reports))


def test_untrusted_lengths_are_checked_before_use() -> None:
    """Header counts and lengths far beyond the bytes present are rejected without allocating them."""
    attribute = ATTRIBUTES[0]
    proto = CAMPAIGN.attributes[attribute].protocol
    good = E.pack_reports(CAMPAIGN, attribute, 0, valid_reports(CAMPAIGN, attribute, 10, 1), batch_id="x")
    huge_count, huge_payload = bytearray(good), bytearray(good)
    huge_count[12:16] = (2**32 - 1).to_bytes(4, "little")
    huge_payload[16:20] = (2**32 - 1).to_bytes(4, "little")
    huge_reports = E.pack(CAMPAIGN.id, attribute, proto.name, proto.fingerprint, 0, 10,
                          b"LDPr\x01" + (50_000_000).to_bytes(4, "little") + b"\0" * 10, batch_id="x")
    for blob, reason in ((huge_count, "oversized"), (huge_payload, "truncated"), (huge_reports, "truncated")):
        peak: list[int] = []
        assert decode_envelope(bytes(blob), CAMPAIGNS, peak=peak)[:2] == ("rejected", reason)
        assert peak[0] < 64 << 10


# ---------------------------------------------------------------------------- the ingest's parsers
def check_single(item: SingleReport, obj: Any = None) -> None:
    """An accepted single report (JSON object ``obj``) of a declared attribute, in the output space."""
    assert item.campaign is CAMPAIGN and item.attribute in CAMPAIGN.attributes
    assert isinstance(item.t, int) and 0 <= item.t <= E.MAX_STEP
    proto = CAMPAIGN.attributes[item.attribute].protocol
    check_accepted(proto, item.reports)
    if obj is not None:
        assert len(item.reports) == 1 and obj["campaign"] == CAMPAIGN.id and obj["attribute"] == item.attribute
        if obj.get("t") is not None:
            assert item.t == obj["t"]
        assert item.reports.tobytes() == base64.b64decode(obj["payload"])[9:]


def decode_objects(objs: list[Any], test: str) -> int:
    """Decode each report object as the ingest does; returns how many were accepted."""
    accepted = 0
    for obj in objs:
        try:
            item = decode_single_report(obj, CAMPAIGNS, NOW)
        except EnvelopeError as exc:
            _rejected(test, exc)
        else:
            check_single(item, obj)
            accepted += 1
    return accepted


@fuzz_settings(N_JSON)
@given(obj=S.report_objects)
def test_single_report_objects(obj: Any) -> None:
    """``decode_single_report`` of valid, mutated and arbitrary JSON values: a valid report or a reason."""
    _done("test_single_report_objects", decode_objects([obj], "test_single_report_objects") == 1)


@fuzz_settings(N_BODY)
@given(body=S.request_bodies)
def test_report_request_bodies(body: bytes) -> None:
    """A ``POST /reports`` body as the ingest parses it: ``decode_report_request`` then each object."""
    try:
        objs = decode_report_request(body)
    except EnvelopeError as exc:
        _rejected("test_report_request_bodies", exc)
        _done("test_report_request_bodies", False)
    else:
        assert isinstance(objs, list) and objs
        _done("test_report_request_bodies", decode_objects(objs, "test_report_request_bodies") > 0)


def compact_fields(body: bytes) -> list[int]:
    """Offsets of a compact body's version, flags and section count, and of each section's t, count, payload
    length, flags, name lengths and reserved byte and its payload's version and report count
    (:mod:`wire.compact` layout)."""
    out, pos = [4, 5, 6], 8
    while pos + 24 <= len(body):
        out += [pos + 8, pos + 12, pos + 16, pos + 20, pos + 21, pos + 22, pos + 23]
        payload = pos + 24 + body[pos + 21] + body[pos + 22]
        out += [payload + 4, payload + 5]
        pos = payload + int.from_bytes(body[pos + 16:pos + 20], "little")
    return out


@st.composite
def compact_bodies(draw: Any) -> tuple[bytes, list | None]:
    """Compact bodies (:mod:`wire.compact`) of 1 to 4 sections of valid or mutated reports with their sections
    (``None`` once mutated: section counts, lengths, flags, bytes), or arbitrary bytes after the compact magic."""
    from wire import compact as C

    how = draw(st.sampled_from(["body", "body", "body", "bytes"]))
    if how == "bytes":
        return C.MAGIC + bytes([C.VERSION, 0]) + draw(st.binary(max_size=300)), None
    sections = []
    for _ in range(draw(st.integers(1, 4))):
        attribute = draw(S.attribute)
        reports = draw(S.arrays[attribute])
        if len(reports) == 0:
            reports = valid_reports(CAMPAIGN, attribute, 8, 0)[:1]
        t = draw(st.one_of(st.none(), st.integers(0, E.MAX_STEP)))
        sections.append((CAMPAIGN, attribute, t, reports))
    body = C.encode_compact(sections)
    patch = draw(st.sampled_from([None, None, None, "fingerprint", "campaign", "attribute"]))
    if patch is not None:  # the first section addressed elsewhere: 8 + 24 bytes of headers before its names
        b = bytearray(body)
        if patch == "fingerprint":
            b[8:16] = bytes.fromhex(CAMPAIGN.attributes[draw(S.attribute)].protocol.fingerprint)
        else:
            b[32 + (0 if patch == "campaign" else b[29])] = ord("#")
        body = bytes(b)
    if patch is not None or draw(st.booleans()):
        return mutate(body, draw(MUTATIONS), compact_fields(body)) if draw(st.booleans()) else body, None
    return body, sections


@fuzz_settings(N_COMPACT)
@given(case=compact_bodies())
def test_compact_bodies(case: tuple[bytes, list | None]) -> None:
    """``decode_compact``: one valid report array per section, or a reason for the whole body; a body as
    encoded is accepted, section by section, iff every section's reports lie in the output space."""
    from wire import compact as C
    from wire.campaign import step_at

    body, sections = case
    try:
        items = C.decode_compact(body, CAMPAIGNS, NOW)
    except EnvelopeError as exc:
        _rejected("test_compact_bodies", exc)
        if sections is not None:
            assert not all(in_output_space(CAMPAIGN.attributes[a].protocol, r) for _, a, _, r in sections), exc
        _done("test_compact_bodies", False)
        return
    assert 1 <= len(items) <= C.MAX_SECTIONS and C.count_reports(items) <= C.MAX_REPORTS
    for item in items:
        assert 1 <= len(item.reports) <= CAMPAIGN.max_batch_reports
        check_single(item)
    if sections is not None:
        assert len(items) == len(sections)
        for item, (_, attribute, t, reports) in zip(items, sections):
            assert item.attribute == attribute and same_reports(item.reports, reports)
            assert item.t == (step_at(CAMPAIGN, NOW) if t is None else t)
    _done("test_compact_bodies", True)


# ---------------------------------------------------------------------------- the ingest's request handler
_TOKEN_IDS = {"device": b"\x01" * 16, "relay": b"\x02" * 16, "expired": b"\x03" * 16}
_SECRET = bytes(range(32))


def _raw_token(header: str) -> bytes | None:
    """The bytes of a bearer token as the verifier decodes them (characters outside base64url dropped)."""
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith("ldp1."):
        return None
    text = token[5:]
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None


def _handler_requests() -> st.SearchStrategy[tuple[str, dict[str, str], bytes]]:
    """(mode, headers, body) of ``POST /reports``: open mode or with tokens; valid, mutated, expired, missing or
    arbitrary credentials; JSON, compact or other content types; idempotency keys and content lengths, valid
    or not; JSON, compact or arbitrary bodies."""
    from stream_app.ingest.auth import RELAY, DeviceSecret, TokenAuthority
    from wire.compact import CONTENT_TYPE

    authority = TokenAuthority(DeviceSecret(_SECRET))
    year = 365 * 86400.0
    tokens = [authority.issue(year, token_id=_TOKEN_IDS["device"]),
              authority.issue(year, kind=RELAY, token_id=_TOKEN_IDS["relay"]),
              authority.issue(10.0, now=1000.0, token_id=_TOKEN_IDS["expired"])]

    def mutated_token(case: tuple[str, list]) -> str:
        token, ops = case
        text = token[5:]
        raw = mutate(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), ops)
        return "Bearer ldp1." + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    valid = st.sampled_from(["Bearer " + t for t in tokens[:2]] + ["bearer  " + tokens[0] + " "])
    auth = st.one_of(valid, valid, st.none(), st.just("Bearer " + tokens[2]),
                     st.tuples(st.sampled_from(tokens), MUTATIONS).map(mutated_token),
                     st.text(max_size=80), st.text(max_size=80).map(lambda t: "Bearer ldp1." + t))
    json_types = st.sampled_from(["application/json", "application/json; charset=utf-8", "TEXT/JSON"])
    ctype = st.one_of(st.none(), json_types, st.sampled_from([CONTENT_TYPE, CONTENT_TYPE + "; v=1"]),
                      st.sampled_from(["text/plain", ""]), st.text(max_size=30))
    key = st.one_of(st.none(), st.none(), st.sampled_from(["k1", "k-2"]), st.text(max_size=300))
    digits = st.text(st.characters(categories=("Nd", "No")), min_size=1, max_size=4)  # "²".isdigit(), int("²") fails
    length = st.one_of(st.none(), st.none(), st.just("exact"), st.text(max_size=12), digits,
                       st.integers(0, 2**70).map(str))
    compact = compact_bodies().map(lambda case: case[0])
    junk = st.binary(max_size=300)
    clean = {"authorization": valid, "content-type": st.one_of(st.none(), json_types, st.just(CONTENT_TYPE)),
             "idempotency-key": st.sampled_from([None, "k1"]), "content-length": st.sampled_from([None, "exact"])}
    fuzzed = {"authorization": auth, "content-type": ctype, "idempotency-key": key, "content-length": length}

    @st.composite
    def requests(draw: Any) -> tuple[str, dict[str, str], bytes]:
        mode = draw(st.sampled_from(("open", "tokens")))
        headers: dict[str, str] = {}
        for name, strategy in (clean if draw(st.booleans()) else fuzzed).items():
            value = draw(strategy)
            if value is not None:
                headers[name] = value
        kind = headers.get("content-type", "application/json").split(";")[0].strip().lower()
        body = draw(compact if kind == CONTENT_TYPE else S.request_bodies if "json" in kind else junk)
        if headers.get("content-length") == "exact":
            headers["content-length"] = str(len(body))
        return mode, headers, body

    return requests()


class IngestRig:
    """Report handlers of the ingest (open mode and with tokens; no ledger) whose ``submit`` records what it gets."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        from stream_app.ingest.auth import DeviceSecret, TokenAuthority
        from stream_app.ingest.handler import HandlerLimits, ReportHandler
        from stream_app.ingest.metrics import IngestMetrics

        self.submitted: list[list[SingleReport]] = []
        self.limits = HandlerLimits(max_body_bytes=2048, max_device_reports=4, max_relay_reports=1000,
                                    max_open_reports=1000)

        async def submit(items: list[SingleReport]) -> int:
            self.submitted.append(items)
            return sum(len(item.reports) for item in items)

        metrics = IngestMetrics(CollectorRegistry())
        self.handlers = {
            "open": ReportHandler(CAMPAIGNS, submit, metrics, authority=None, ledger=None, limits=self.limits),
            "tokens": ReportHandler(CAMPAIGNS, submit, metrics, authority=TokenAuthority(DeviceSecret(_SECRET)),
                                    ledger=None, limits=self.limits),
        }
        self.loop = asyncio.new_event_loop()

    def handle(self, mode: str, headers: dict[str, str], body: bytes) -> Any:
        from stream_app.ingest.handler import BodyTooLarge

        async def read_body(limit: int) -> bytes:
            if len(body) > limit:
                raise BodyTooLarge(f"more than {limit} bytes")
            return body

        return self.loop.run_until_complete(self.handlers[mode].handle(headers, read_body))


@pytest.fixture(scope="module")
def ingest() -> Any:
    rig = IngestRig()
    yield rig
    rig.loop.close()


@fuzz_settings(N_HANDLER)
@given(request=st.deferred(_handler_requests))
def test_ingest_handler_requests(ingest: IngestRig, request: tuple[str, dict[str, str], bytes]) -> None:
    """The ingest's ``POST /reports`` handler (credential, headers, body, decoding, limits): an answer, never an
    exception; 200 publishes exactly the request's valid reports once, under a valid credential in token mode;
    any other answer names its reason and publishes nothing."""
    mode, headers, body = request
    before = len(ingest.submitted)
    reply = ingest.handle(mode, headers, body)
    doc = json.loads(reply.body)
    published = ingest.submitted[before:]
    if reply.status == 200:
        assert len(published) == 1 and doc["accepted"] == sum(len(item.reports) for item in published[0])
        for item in published[0]:
            check_single(item)
        if mode == "tokens":
            assert _raw_token(headers["authorization"])[:22][6:] in (_TOKEN_IDS["device"], _TOKEN_IDS["relay"])
        assert len(body) <= ingest.limits.max_body_bytes
    else:
        assert reply.status in (400, 401, 413, 415, 429) and isinstance(doc["error"], str), (reply.status, doc)
        assert not published
        REJECTIONS["test_ingest_handler_requests", doc["error"]] += 1
    _done("test_ingest_handler_requests", reply.status == 200)


# ---------------------------------------------------------------------------- the worker's hot path
class PipelineRig:
    """One ``Pipeline`` on a real Redis, a model of the counts it must hold, and the batch ids it applied."""

    def __init__(self, campaign: Campaign, redis_url: str) -> None:
        from stream_app.app import Worker
        from stream_app.store import connect_sync
        from wire.topics import Topics

        self.campaign = campaign
        self.campaigns = {self.campaign.id: self.campaign}
        self.loop = asyncio.new_event_loop()
        self.rejections: list[tuple[str, str]] = []

        async def record(key: bytes | None, doc: dict[str, Any]) -> None:  # each rejection's published record
            self.rejections.append((doc["reason"], doc["detail"]))

        self.worker = Worker(self.campaigns, redis_url, app_id=f"fuzz-{uuid.uuid4().hex[:6]}", topics=Topics(),
                             send_rejected=record)
        self.pipe = self.worker.pipeline
        self.redis = connect_sync(redis_url)
        self.model: dict[str, dict[str, int]] = {}  # count key -> non-zero "c:<j>" and "n" fields
        self.applied: set[tuple[str, int, str]] = set()
        self.offset = 0

    def snapshot(self) -> dict[str, dict[str, int]]:
        """Every count hash of the campaign: its non-zero counts and number of reports."""
        from stream_app.store import count_key

        prefix = count_key(self.campaign.id, "", 0)[:-2]  # "ldp:{<campaign>}:"
        keys = [k.decode() for k in self.redis.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*",
                                                         count=1000)]
        keys = [k for k in keys if k.rsplit(":", 1)[-1].isdigit()]
        pipe = self.redis.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k)
        out = {}
        for k, raw in zip(keys, pipe.execute()):
            fields = {f.decode(): int(v) for f, v in raw.items() if f.startswith(b"c:") or f == b"n"}
            fields = {f: v for f, v in fields.items() if v}
            if fields:
                out[k] = fields
        return out

    def process(self, blob: bytes) -> str:
        self.offset += 1
        return self.loop.run_until_complete(self.pipe.process(blob, 0, self.offset))

    def close(self) -> None:
        self.loop.run_until_complete(self.worker.close())
        self.loop.close()
        self.redis.close()


@pytest.fixture(scope="module")
def rig(local_stack) -> PipelineRig:
    r = PipelineRig(PIPE_CAMPAIGN, local_stack.info.redis_url)
    yield r
    r.close()


@fuzz_settings(N_PIPELINE)
@given(blob=PIPE_S.envelopes)
def test_pipeline_counts(rig: PipelineRig, blob: bytes) -> None:
    """Through ``Pipeline.process`` with Redis: a rejected or empty message or a watermark changes no count, an
    accepted batch adds exactly its support and its number of reports to its step, once per batch id."""
    kind, env, _, counts = decode_envelope(blob, rig.campaigns, "test_pipeline_counts")
    assert rig.snapshot() == rig.model
    n_rejected = len(rig.rejections)
    status = rig.process(blob)
    if kind == "reports":
        ident = (env.attribute, env.t, env.batch_id)
        assert status == ("duplicate" if ident in rig.applied else "applied")
        if status == "applied":
            rig.applied.add(ident)
            from stream_app.store import count_key

            fields = rig.model.setdefault(count_key(env.campaign, env.attribute, env.t), {})
            for j in np.flatnonzero(counts):
                fields[f"c:{j}"] = fields.get(f"c:{j}", 0) + int(counts[j])
            fields["n"] = fields.get("n", 0) + env.count
            for f in [f for f, v in fields.items() if v == 0]:
                del fields[f]
    else:
        assert status == kind
    assert rig.snapshot() == rig.model
    new = rig.rejections[n_rejected:]
    assert len(new) == (status == "rejected")
    assert not any(detail.startswith("unexpected ") for _, detail in new), new
    _done("test_pipeline_counts", status == "applied")


# ---------------------------------------------------------------------------- the number of cases
#: the reasons each decoder must have been driven to (each of its rejection paths was explored)
EXPECTED_REASONS = {
    "test_envelope_decoder": {"malformed", "bad_version", "unknown_campaign", "unknown_attribute", "wrong_protocol",
                              "wrong_fingerprint", "truncated", "oversized", "bad_payload", "missing_batch_id"},
    "test_single_report_objects": {"bad_json", "unknown_campaign", "unknown_attribute", "wrong_protocol",
                                   "wrong_fingerprint", "truncated", "bad_payload"},
    "test_report_request_bodies": {"bad_json", "bad_payload"},
    "test_compact_bodies": {"malformed", "bad_version", "truncated", "oversized", "unknown_campaign",
                            "unknown_attribute", "wrong_fingerprint", "bad_payload"},
    "test_pipeline_counts": {"malformed", "truncated", "bad_payload"},
}


def test_fuzz_case_count() -> None:
    """At least 10,000 cases in all; every fuzz test that ran in this session ran all its planned cases, both
    accepted and rejected inputs (at least 5% each) and every rejection reason of its decoder."""
    assert sum(PLAN.values()) >= MIN_CASES
    ran = dict(CASES)
    print(f"\nfuzz cases: {sum(ran.values())} in {len(ran)} tests (planned {sum(map(examples, PLAN.values()))})")
    families = sorted({name.split("[")[0] for name in ran})
    for family in families:
        reasons = {r: n for (t, r), n in sorted(REJECTIONS.items()) if t == family}
        print(f"  {family}: {sum(n for name, n in ran.items() if name.split('[')[0] == family)} cases, accepted "
              f"{OUTCOMES[family, True]}, rejected {OUTCOMES[family, False]} {reasons}")
    if PEAKS:
        top = max(PEAKS)
        print(f"  envelope decode: largest allocation {top[0]} bytes (for {top[1]} bytes received), "
              f"largest per byte received {max(p / max(n, 1) for p, n in PEAKS):.1f}")
    short = {name: (n, examples(PLAN[name])) for name, n in ran.items() if n < examples(PLAN[name])}
    assert not short, short
    for family in families:
        yes, no = OUTCOMES[family, True], OUTCOMES[family, False]
        assert min(yes, no) >= 0.05 * (yes + no), (family, yes, no)
        seen = {r for t, r in REJECTIONS if t == family}
        assert EXPECTED_REASONS.get(family, set()) <= seen, (family, EXPECTED_REASONS[family] - seen)
    if set(ran) == set(PLAN):
        assert sum(ran.values()) >= sum(map(examples, PLAN.values()))
