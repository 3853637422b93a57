"""The pieces of the fuzz tests (``tests/test_fuzz.py``): a campaign with an attribute for every protocol and
every multidimensional solution, reference oracles of each protocol's output space and support counts,
hypothesis strategies of valid, mutated and arbitrary inputs, and the settings of the fuzz runs.

Oracles: :func:`in_output_space` says, from the protocol's definition alone, whether a report array lies in the
protocol's output space, and :func:`reference_support` counts it with the plain-numpy twins of the numba kernels
(:mod:`estimators.reference`): a decoder must accept exactly the arrays of the output space, and what it accepts
must count as the reference says.

Settings: every fuzz test runs ``max_examples`` derandomized cases (a fixed seed: CI is reproducible). The
environment variable ``LDP_FUZZ_SCALE`` multiplies every test's number of cases and ``LDP_FUZZ_RANDOM=1`` draws
fresh random cases (a failure prints the blob that reproduces it)::

    LDP_FUZZ_SCALE=20 LDP_FUZZ_RANDOM=1 .venv/bin/python -m pytest -q tests/test_fuzz.py
"""
from __future__ import annotations

import base64
import json
import os
import struct
from collections import Counter
from typing import Any, Callable, Sequence

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from estimators import reference as ref
from estimators.base import FrequencyProtocol
from wire import envelope as E
from estimators.multidim import report_protocol
from wire.campaign import Campaign
from wire.envelope import MAX_STEP
from wire.single_report import encode_single_report

# ---------------------------------------------------------------------------- settings
FUZZ_SCALE = float(os.environ.get("LDP_FUZZ_SCALE", "1"))
FUZZ_RANDOM = os.environ.get("LDP_FUZZ_RANDOM", "") not in ("", "0")
#: per test: a case slower than this fails (a decoder that hangs or is quadratic in an untrusted length)
DEADLINE_MS = 5000
#: executed cases per test function (summed over its parameters), checked by the last test of test_fuzz.py
CASES: Counter[str] = Counter()
#: cases per (test function, whether the input was accepted)
OUTCOMES: Counter[tuple[str, bool]] = Counter()
#: rejections per (test function, reason)
REJECTIONS: Counter[tuple[str, str]] = Counter()


def examples(n: int) -> int:
    """The number of cases of a test planned with ``n`` (scaled by ``LDP_FUZZ_SCALE``)."""
    return max(1, int(round(n * FUZZ_SCALE)))


def fuzz_settings(n: int) -> settings:
    """Hypothesis settings of a fuzz test of ``n`` cases (module doc)."""
    return settings(max_examples=examples(n), derandomize=not FUZZ_RANDOM, database=None, deadline=DEADLINE_MS,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---------------------------------------------------------------------------- the campaign
#: one attribute per entry: every name of estimators.PROTOCOLS, with report dtypes of 1, 2 and 4 bytes, pad bits,
#: both SS layouts, both ADP choices, the structured LH reports with uint8 and uint16 hash values
PROTOCOL_SPECS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("GRR", dict(k=5, eps=1.0)), ("GRR", dict(k=300, eps=2.0)),
    ("SUE", dict(k=10, eps=1.0)), ("OUE", dict(k=13, eps=1.0)),
    ("ADP", dict(k=4, eps=2.0)), ("ADP", dict(k=40, eps=1.0)),
    ("L-GRR", dict(k=6, eps_inf=2.0, eps_1=1.0)), ("L-SUE", dict(k=9, eps_inf=2.0, eps_1=1.0)),
    ("L-OUE", dict(k=16, eps_inf=2.0, eps_1=1.0)), ("L-OSUE", dict(k=11, eps_inf=2.0, eps_1=1.0)),
    ("L-SOUE", dict(k=7, eps_inf=2.0, eps_1=1.0)),
    ("L-ADP", dict(k=3, eps_inf=2.0, eps_1=1.0)), ("L-ADP", dict(k=50, eps_inf=2.0, eps_1=1.0)),
    ("HR", dict(k=5, eps=1.0)), ("HR", dict(k=130, eps=1.0)),
    ("FHR", dict(k=6, eps=1.0)), ("FHR", dict(k=300, eps=1.0)),
    ("BLH", dict(k=20, eps=1.0)), ("OLH", dict(k=30, eps=1.0)), ("OLH", dict(k=10, eps=6.0)),
    ("LOLOHA", dict(k=25, eps_inf=2.0, eps_1=1.0)), ("LOLOHA", dict(k=12, eps_inf=2.0, eps_1=1.0, g=300)),
    ("dBitFlipPM", dict(k=20, b=10, d=3, eps_inf=2.0)), ("dBitFlipPM", dict(k=300, b=200, d=1, eps_inf=2.0)),
    ("SS", dict(k=10, eps=1.0)), ("SS", dict(k=10, eps=3.0)), ("SS", dict(k=40, eps=3.0, layout="indices")),
    ("SS", dict(k=300, eps=5.0)),
    ("SHE", dict(k=4, eps=1.0)), ("SHE", dict(k=3, eps=0.1)),
    ("THE", dict(k=12, eps=1.0)),
)
#: one group per entry: every name of estimators.SOLUTIONS (the attributes' views are solution.attribute_protocol(j))
SOLUTION_SPECS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("SPL", dict(ks=[3, 5], eps=2.0, protocol="GRR")),
    ("SMP", dict(ks=[6, 9], eps=2.0, protocol="SS")),
    ("RS+FD", dict(ks=[4, 8], eps=1.0, protocol="ADP", amplification="paper")),
    ("RS+FD", dict(ks=[3, 10], eps=1.0, protocol="OUE-z", amplification="none")),
    ("L-SPL", dict(ks=[3, 4], eps_inf=4.0, eps_1=2.0, protocol="L-GRR")),
    ("L-SMP", dict(ks=[5, 6], eps_inf=2.0, protocol="dBitFlipPM",
                   protocol_params=[{"b": 5, "d": 2}, {"b": 3, "d": 1}])),
    ("ALLOMFREE", dict(ks=[2, 10, 200], eps_inf=2.0, eps_1=1.0)),
    ("ALLOMFREE", dict(ks=[3, 7], eps_inf=2.0, eps_1=1.0, fake_data=True, amplification="paper")),
    ("L-RS+FD", dict(ks=[4, 6], eps_inf=2.0, eps_1=1.0, protocol="LOLOHA", amplification="none")),
)
#: a small batch limit, so that mutated counts reach "oversized"
MAX_BATCH = 64
#: the unix time the JSON parser gets for reports without ``t``
NOW = 1_750_000_000.0


def _slug(name: str) -> str:
    return name.replace("+", "p")


def fuzz_campaign(cid: str = "fuzz") -> Campaign:
    """The fuzz campaign: one attribute per :data:`PROTOCOL_SPECS` entry, one group per :data:`SOLUTION_SPECS`."""
    attributes: list[dict[str, Any]] = [{"name": f"{_slug(p)}-{i}", "protocol": p, **params}
                                        for i, (p, params) in enumerate(PROTOCOL_SPECS)]
    groups: list[dict[str, Any]] = []
    for gi, (sol, params) in enumerate(SOLUTION_SPECS):
        spec = dict(params)
        members = [f"g{gi}-{_slug(sol)}-{j}" for j in range(len(spec["ks"]))]
        attributes += [{"name": m, "k": k} for m, k in zip(members, spec.pop("ks"))]
        groups.append({"name": f"g{gi}", "solution": sol, "attributes": members, **spec})
    return Campaign.from_dict({"campaign": {"id": cid, "time_step_seconds": 10.0, "max_batch_reports": MAX_BATCH},
                               "attributes": attributes, "groups": groups})


# ---------------------------------------------------------------------------- valid reports
def valid_reports(campaign: Campaign, attribute: str, n: int, seed: int) -> np.ndarray:
    """Reports of ``n`` devices randomized by the attribute's protocol (a group's attribute: by its solution, so
    an SMP-like attribute gets the reports of the devices that sampled it); seeded simulation mode."""
    a = campaign.attributes[attribute]
    rng = np.random.default_rng(seed)
    if a.group is None:
        p = a.protocol
        return p.randomize(rng.integers(0, p.k, n), rng, state=p.new_state(n, rng=rng))
    group = campaign.groups[a.group]
    sol = group.solution
    values = np.stack([rng.integers(0, k, n) for k in sol.ks], axis=1)
    return sol.randomize(values, rng, state=sol.new_state(n, rng=rng)).reports[group.attributes.index(attribute)]


def one_report(campaign: Campaign, attribute: str, seed: int) -> np.ndarray:
    """A one-row valid report array (an SMP-like attribute needs a device that sampled it)."""
    for s in range(seed, seed + 64):
        r = valid_reports(campaign, attribute, 8, s)
        if len(r):
            return r[:1]
    raise AssertionError(f"no device reported {attribute}")  # pragma: no cover - probability 2^-512


# ---------------------------------------------------------------------------- oracles
_DIRECT = {"GRR", "L-GRR"}
_UNARY = {"SUE", "OUE", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE", "THE"}
_HASHED = {"BLH", "OLH", "LOLOHA"}
#: every protocol name the oracles know (a new protocol must be added here and to PROTOCOL_SPECS)
ORACLE_NAMES = _DIRECT | _UNARY | _HASHED | {"SS", "HR", "FHR", "dBitFlipPM", "SHE"}


def _bits(r: np.ndarray) -> np.ndarray:
    return np.unpackbits(np.ascontiguousarray(r, dtype=np.uint8), axis=1, bitorder="little")


def _increasing(r: np.ndarray) -> bool:
    return bool((r[:, 1:] > r[:, :-1]).all())


def in_output_space(proto: FrequencyProtocol, r: np.ndarray) -> bool:
    """Whether ``r`` (of the protocol's dtype and report shape) holds only reports the protocol can output,
    as its definition says (module doc); independent of the validators under test."""
    b = report_protocol(proto)
    name = b.name
    if r.size == 0:
        return True
    if name in _DIRECT:
        return bool((r.astype(np.int64) < b.k).all())
    if name in _UNARY:
        return not _bits(r)[:, b.k:].any()
    if name == "SS":
        if b.layout == "bits":
            bits = _bits(r)
            return not bits[:, b.k:].any() and bool((bits.sum(axis=1) == b.omega).all())
        return bool((r.astype(np.int64) < b.k).all()) and _increasing(r.astype(np.int64))
    if name in _HASHED:
        return bool((r["y"].astype(np.int64) < b.g).all())
    if name == "HR":
        return bool((r.astype(np.int64) < 2 * b.K).all())
    if name == "FHR":
        x = r.astype(np.int64)
        return bool((x < b.K).all() and (x[:, 0] != x[:, 1]).all())
    if name == "dBitFlipPM":
        j = r.astype(np.int64) >> 1
        return bool((j < b.b).all()) and _increasing(j)
    if name == "SHE":
        return bool((np.abs(r.astype(np.int64)) <= b.bound).all())
    raise AssertionError(f"no oracle for protocol {name}")


def reference_support(proto: FrequencyProtocol, r: np.ndarray) -> np.ndarray:
    """Support counts of reports of the output space, from :mod:`estimators.reference`."""
    b = report_protocol(proto)
    name = b.name
    if name in _DIRECT:
        return ref.bincount(r.astype(np.int64), b.k)
    if name in _UNARY or (name == "SS" and b.layout == "bits"):
        return ref.packed_bit_counts(r, b.k)
    if name == "SS":
        return ref.bincount(r.reshape(-1).astype(np.int64), b.k)
    if name in _HASHED:
        return ref.lh_support(r["seed"].astype(np.int64), r["y"], b.k, b.g)
    if name == "HR":
        return ref.hr_support(r, b.K, b.k)
    if name == "FHR":
        return ref.fhr_support(r, b.K, b.k)
    if name == "dBitFlipPM":
        return ref.bitflip_support(r, b.b)[0]
    if name == "SHE":
        return ref.int_column_sums(r, b.bound)[0]
    raise AssertionError(f"no oracle for protocol {name}")


def check_accepted(proto: FrequencyProtocol, r: np.ndarray) -> np.ndarray:
    """Everything an accepted report array must satisfy; returns its support counts.

    Its dtype and shape are the protocol's, it lies in the output space, ``validate_reports`` passes, and
    ``support`` works and equals the reference: int64 of the support size, additive over a split, each count
    within ``[0, n]`` (``[-n, n]`` for FHR, whose reports add -1, 0 or 1 to a value; ``n`` times the clip
    bound for SHE's sums), summing to ``n`` for GRR-like reports and to ``n ω`` for SS.
    """
    n = len(r)
    b = report_protocol(proto)
    assert r.dtype == proto.report_dtype and r.shape == (n, *proto.report_shape), (r.dtype, r.shape)
    assert in_output_space(proto, r), "accepted reports outside the output space"
    proto.validate_reports(r)
    counts = proto.support(r)
    assert counts.dtype == np.int64 and counts.shape == (proto.support_size,), (counts.dtype, counts.shape)
    np.testing.assert_array_equal(counts, reference_support(proto, r))
    half = n // 2
    np.testing.assert_array_equal(proto.support(r[:half]) + proto.support(r[half:]), counts)
    if b.name == "FHR":
        assert (np.abs(counts) <= n).all()
    elif b.name == "SHE":
        assert (np.abs(counts) <= n * b.bound).all()
    else:
        assert ((counts >= 0) & (counts <= n)).all()
    if b.name in _DIRECT:
        assert counts.sum() == n
    elif b.name == "SS":
        assert counts.sum() == n * b.omega
    elif b.name == "dBitFlipPM":
        assert counts.sum() <= n * b.d
    return counts


def same_reports(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (structured arrays included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------- byte mutations
#: ("flip", pos, bit) | ("set", pos, byte) | ("truncate", pos) | ("insert", pos, bytes) | ("delete", pos, n)
#: | ("add32" | "set32" | "add8", field, value): positions wrap around the blob, ``field`` indexes the blob's
#: field offsets (length and count fields, :func:`mutate`)
Mutation = tuple
_POS = st.integers(0, 1 << 16)
_FIELD = st.integers(0, 63)
_U32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**31, 2**32 - 1, 50_000_001]))
_OP = st.one_of(
    st.tuples(st.just("flip"), _POS, st.integers(0, 7)),
    st.tuples(st.just("set"), _POS, st.integers(0, 255)),
    st.tuples(st.just("truncate"), _POS),
    st.tuples(st.just("insert"), _POS, st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), _POS, st.integers(1, 16)),
    st.tuples(st.just("add32"), _FIELD, st.integers(-3, 3)),
    st.tuples(st.just("set32"), _FIELD, _U32),
    st.tuples(st.just("add8"), _FIELD, st.integers(-3, 3)),
)
#: 1 to 4 mutations
MUTATIONS = st.lists(_OP, min_size=1, max_size=4)


def mutate(blob: bytes, ops: Sequence[Mutation], fields: Sequence[int] = ()) -> bytes:
    """``blob`` after the mutations ``ops``, in order; a field mutation changes the u32 (u8 for ``add8``) at
    ``fields[field % len(fields)]`` (at ``field`` if no ``fields``) if the blob still reaches it."""
    b = bytearray(blob)
    for op in ops:
        kind, where = op[0], op[1]
        size = len(b)
        if kind in ("add32", "set32", "add8"):
            at = fields[where % len(fields)] if fields else where
            if kind == "add8":
                if at < size:
                    b[at] = (b[at] + op[2]) % 256
            elif at + 4 <= size:
                old = struct.unpack_from("<I", b, at)[0]
                struct.pack_into("<I", b, at, (old + op[2]) % 2**32 if kind == "add32" else op[2])
        elif kind == "truncate":
            del b[where % (size + 1):]
        elif kind == "insert":
            p = where % (size + 1)
            b[p:p] = op[2]
        elif size == 0:
            continue
        elif kind == "flip":
            b[where % size] ^= 1 << op[2]
        elif kind == "set":
            b[where % size] = op[2]
        elif kind == "delete":
            p = where % size
            del b[p:p + op[2]]
    return bytes(b)


PAYLOAD_FIELDS = (4, 5)  # the report payload's codec version byte and its report count (u32)


def envelope_fields(blob: bytes) -> list[int]:
    """Offsets of an envelope's version, kind, t, count and payload length, its four u8 field lengths and its
    payload's version and report count (:mod:`wire.envelope` layout)."""
    out = [4, 5, 6, 8, 12, 16]
    pos = E._HEAD.size
    for _ in range(4):
        if pos >= len(blob):
            return out
        out.append(pos)
        pos += 1 + blob[pos]
    return out + [pos + o for o in PAYLOAD_FIELDS]


# ---------------------------------------------------------------------------- JSON values
_JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
json_values = st.recursive(_JSON_LEAVES, lambda c: st.one_of(st.lists(c, max_size=4),
                                                             st.dictionaries(st.text(max_size=10), c, max_size=4)),
                           max_leaves=12)
_KEYS = ("campaign", "attribute", "t", "payload", "protocol", "fingerprint")
_NAMES = st.text(max_size=40)
_BATCH_IDS = st.one_of(st.sampled_from(["a", "b", "c"]), st.text(min_size=1, max_size=30))
_SEED = st.integers(0, 2**32 - 1)
_STEP = st.integers(0, MAX_STEP)


def _arrays_from_bytes(proto: FrequencyProtocol, data: bytes) -> np.ndarray:
    per = proto.report_nbytes
    n = len(data) // per
    return np.frombuffer(data[:n * per], dtype=proto.report_dtype).reshape((n, *proto.report_shape)).copy()


# ---------------------------------------------------------------------------- strategies of one campaign
class CampaignStrategies:
    """The hypothesis strategies of inputs addressed to ``campaign`` (built once: a strategy object is validated
    on first use, so strategies are not rebuilt per case)."""

    def __init__(self, campaign: Campaign, t_max: int = MAX_STEP) -> None:
        self.campaign = campaign
        self.attrs = sorted(campaign.attributes)
        self.protos = {a: campaign.attributes[a].protocol for a in self.attrs}
        self.attribute = st.sampled_from(self.attrs)
        self.arrays = {a: self._report_arrays(a) for a in self.attrs}
        self.payloads = {a: self._payloads(a) for a in self.attrs}
        self.t = st.one_of(st.integers(0, 3), st.integers(0, t_max))
        names = sorted({p.name for p in self.protos.values()})
        fingerprints = sorted({p.fingerprint for p in self.protos.values()})
        self.replacements = {
            "campaign": st.one_of(st.just("other"), _NAMES),
            "attribute": st.one_of(self.attribute, _NAMES),
            "protocol": st.one_of(st.sampled_from(names), _NAMES),
            "fingerprint": st.one_of(st.sampled_from(fingerprints), st.binary(min_size=8, max_size=8).map(bytes.hex)),
            "count": st.one_of(st.integers(0, MAX_BATCH + 1), st.integers(0, 2**32 - 1)),
            "batch_id": st.one_of(st.just(""), _BATCH_IDS),
        }
        # half of the batches get one header field replaced, some of them a second one
        self.replaced = st.one_of(st.just(()), st.lists(st.sampled_from(sorted(self.replacements)), min_size=1,
                                                        max_size=2, unique=True))
        self.special = st.one_of(self.attribute, st.just(campaign.id), st.sampled_from(names), st.just("unknown"),
                                 st.sampled_from(fingerprints),
                                 st.sampled_from([-1, MAX_STEP, MAX_STEP + 1, 2**64, True, 1.0, "1"]))
        self.envelopes = self._envelopes()
        self.report_objects = self._report_objects()
        self.request_bodies = self._request_bodies()

    # ------------------------------------------------------------ report arrays and payloads
    def _report_arrays(self, attribute: str) -> st.SearchStrategy[np.ndarray]:
        """Arrays of the attribute's report dtype and shape: valid reports, valid reports with a few bytes
        changed, or arbitrary bytes (most of these outside the output space of a constrained protocol)."""
        proto = self.protos[attribute]
        arbitrary = st.binary(max_size=24 * proto.report_nbytes)
        changes = st.lists(st.tuples(_POS, st.integers(0, 255)), min_size=1, max_size=3)

        @st.composite
        def arrays(draw: Callable) -> np.ndarray:
            how = draw(st.sampled_from(("valid", "mutated", "arbitrary")))
            if how == "arbitrary":
                return _arrays_from_bytes(proto, draw(arbitrary))
            r = valid_reports(self.campaign, attribute, draw(st.integers(0, 24)), draw(_SEED))
            if how == "valid" or r.size == 0:
                return r
            raw = bytearray(r.tobytes())
            for pos, byte in draw(changes):
                raw[pos % len(raw)] = byte
            return _arrays_from_bytes(proto, bytes(raw))

        return arrays()

    def _payloads(self, attribute: str) -> st.SearchStrategy[bytes]:
        """Report payloads (``proto.encode``) of the attribute, often mutated (bytes, lengths, the report count)."""
        proto = self.protos[attribute]

        @st.composite
        def blobs(draw: Callable) -> bytes:
            blob = proto.encode(draw(self.arrays[attribute]))
            if draw(st.booleans()):
                blob = mutate(blob, draw(MUTATIONS), PAYLOAD_FIELDS)
            return blob

        return blobs()

    # ------------------------------------------------------------ envelopes
    def _envelopes(self) -> st.SearchStrategy[bytes]:
        """Envelope bytes: valid batches; packed batches of an attribute (valid or mutated reports), some header
        fields replaced by another attribute's, another campaign's or arbitrary ones, then often byte-mutated;
        watermarks; or arbitrary bytes, with or without the envelope's magic and version in front."""
        campaign = self.campaign
        how_s = st.sampled_from(("clean", "batch", "batch", "batch", "watermark", "bytes", "magic"))
        junk = st.binary(max_size=400)

        @st.composite
        def envelopes(draw: Callable) -> bytes:
            how = draw(how_s)
            if how == "bytes":
                return draw(junk)
            if how == "magic":
                return E.MAGIC + bytes([E.VERSION, draw(st.integers(0, 2))]) + draw(junk)
            attribute = draw(self.attribute)
            proto = self.protos[attribute]
            t = draw(self.t)
            if how == "watermark":
                blob = E.pack_watermark(campaign, attribute, t)
            elif how == "clean":  # a valid batch, as a producer sends it
                reports = valid_reports(campaign, attribute, draw(st.integers(1, 24)), draw(_SEED))
                return E.pack_reports(campaign, attribute, t, reports, batch_id=draw(_BATCH_IDS))
            else:
                reports = draw(self.arrays[attribute])
                fields: dict[str, Any] = {"campaign": campaign.id, "attribute": attribute, "protocol": proto.name,
                                          "fingerprint": proto.fingerprint, "count": len(reports),
                                          "batch_id": draw(_BATCH_IDS)}
                for name in draw(self.replaced):
                    fields[name] = draw(self.replacements[name])
                blob = E.pack(fields["campaign"], fields["attribute"], fields["protocol"], fields["fingerprint"], t,
                              fields["count"], proto.encode(reports), batch_id=fields["batch_id"])
            if draw(st.booleans()):
                blob = mutate(blob, draw(MUTATIONS), envelope_fields(blob))
            return blob

        return envelopes()

    # ------------------------------------------------------------ JSON single reports
    def _report_objects(self) -> st.SearchStrategy[Any]:
        """Single-report JSON values: valid report objects of any attribute (with or without ``t``,
        ``protocol``, ``fingerprint``), the same with keys deleted or replaced, payloads mutated, or arbitrary
        JSON values."""
        campaign = self.campaign
        how_s = st.sampled_from(("valid", "mutated", "mutated", "arbitrary"))
        op_s = st.sampled_from(("del", "set", "payload", "payload_text"))
        key_s = st.one_of(st.sampled_from(_KEYS), st.sampled_from(_KEYS), st.text(max_size=8))
        value_s = st.one_of(self.special, self.special, json_values)

        @st.composite
        def objects(draw: Callable) -> Any:
            how = draw(how_s)
            if how == "arbitrary":
                return draw(json_values)
            attribute = draw(self.attribute)
            proto = self.protos[attribute]
            obj = encode_single_report(campaign, attribute, draw(_STEP), one_report(campaign, attribute, draw(_SEED)))
            if draw(st.booleans()):
                obj.update(protocol=proto.name, fingerprint=proto.fingerprint)
            if draw(st.booleans()):
                del obj["t"]
            if how == "valid":
                return obj
            for _ in range(draw(st.integers(1, 3))):
                op = draw(op_s)
                payload = obj.get("payload")
                if op == "del" and obj:
                    del obj[draw(st.sampled_from(sorted(obj)))]
                elif op == "set":
                    obj[draw(key_s)] = draw(value_s)
                elif op == "payload" and isinstance(payload, str):
                    try:
                        raw = base64.b64decode(payload, validate=True)
                    except ValueError:  # a payload_text mutation made it invalid already
                        continue
                    obj["payload"] = base64.b64encode(mutate(raw, draw(MUTATIONS), PAYLOAD_FIELDS)).decode("ascii")
                elif op == "payload_text" and isinstance(payload, str):
                    p = draw(st.integers(0, len(payload)))
                    obj["payload"] = payload[:p] + draw(st.text(max_size=3)) + payload[p + draw(st.integers(0, 3)):]
            return obj

        return objects()

    def _request_bodies(self) -> st.SearchStrategy[bytes]:
        """``POST /reports`` bodies: one report object or a list of them as JSON (NaN and all), arbitrary bytes,
        truncated JSON, or deeply nested brackets."""
        how_s = st.sampled_from(("one", "list", "list", "bytes", "truncated", "nested"))
        lists = st.lists(self.report_objects, max_size=4)
        depth_s = st.one_of(st.integers(1, 100), st.integers(100, 200_000))

        @st.composite
        def bodies(draw: Callable) -> bytes:
            how = draw(how_s)
            if how == "bytes":
                return draw(st.binary(max_size=200))
            if how == "nested":
                depth = draw(depth_s)
                return (draw(st.sampled_from((b"[", b'{"a":'))) * depth
                        + draw(st.sampled_from((b"", b"]" * depth, b"1"))))
            body = json.dumps(draw(self.report_objects if how == "one" else lists)).encode()
            if how == "truncated":
                body = body[:draw(st.integers(0, len(body)))]
            return body

        return bodies()
