"""The estimates contract (docs/estimates.md): the JSON Schemas of ``wire/schemas``, ``schema_version``, the Kafka
headers, ``min_n`` and ``insufficient`` finals, one partition count, and the two consumer examples.

Every message the end-to-end tests publish on an estimates topic is checked at the end of the session
(``tests/conftest.py``, ``local_stack``), and the API answers they read through the harness as they read them
(``ldpstream_dev.contract``); these tests check the pieces, in seconds.
"""
from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import re
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ldpstream_dev.contract import ContractError, check_answer, estimate_problems, schema_of, validator
from stream_app.api import campaign_doc
from stream_app.defense import StepEstimate
from stream_app.metrics import Metrics
from stream_app.publisher import EstimatePublisher
from stream_app.settings import WorkerSettings
from stream_app.store import CountStore
from stream_app.windows import Estimator, build_estimate
from wire import estimates as contract
from wire.campaign import DEFAULT_MIN_N, Campaign, CampaignError
from wire.topics import Topics, estimate_key

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "deploy" / "campaigns" / "demo.toml"
SCHEMA_DIR = ROOT / "wire" / "schemas"


def _campaign(cid: str = "contract", **head: Any) -> Campaign:
    return Campaign.from_dict({"campaign": {"id": cid, "time_step_seconds": 3600.0, "lateness_seconds": 3600.0, **head},
                               "attributes": [{"name": "a", "k": 2, "protocol": "GRR", "eps": 1.0,
                                               "labels": ["no", "yes"]}]})


def _state(counts: list[int], **extra: Any) -> dict[str, Any]:
    return {"n": int(sum(counts)), "counts": np.array(counts, dtype=np.int64), "rejected": 0, "first_ts": 10.0,
            "last_ts": 11.0, "wall": False, **extra}


def _doc(campaign: Campaign, counts: list[int], **kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(final=True, trigger="watermark", now=12.0, closed_ts=11.5, worker="w-1", fence=3)
    args.update(kw)
    state = _state(counts, **args.pop("state", {}))
    return json.loads(json.dumps(build_estimate(campaign, campaign.attribute("a"), 7, state, 8, **args)))


def _errors(name: str, doc: Any) -> list[str]:
    return [e.message for e in validator(name).iter_errors(doc)]


# ---------------------------------------------------------------------------- the schema files
def test_every_schema_is_a_valid_2020_12_schema_with_its_own_id() -> None:
    on_disk = sorted(p.name.removesuffix(".schema.json") for p in SCHEMA_DIR.glob("*.schema.json"))
    assert on_disk == sorted(contract.SCHEMAS)
    ids = set()
    for name in contract.SCHEMAS:
        schema = contract.load_schema(name)
        validator(name)  # passes check_schema
        assert schema["$id"].endswith(name) and schema["$id"] not in ids
        ids.add(schema["$id"])
        assert schema["properties"]["schema_version"]["const"] == contract.SCHEMA_VERSION
        assert name.endswith(f".v{contract.SCHEMA_VERSION}")


def test_the_schema_names_every_field_of_an_estimate_and_requires_it() -> None:
    schema = contract.load_schema("estimate.v1")
    doc = _doc(_campaign(), [30, 20])
    assert set(doc) == set(schema["properties"]) == set(schema["required"])
    assert all(p.get("description") for k, p in schema["properties"].items() if k != "schema_version")


@pytest.mark.parametrize("case", ["final", "provisional", "insufficient", "defended", "incomplete", "wall", "late"])
def test_the_documents_of_build_estimate_validate(case: str) -> None:
    c = _campaign()
    kw: dict[str, Any] = {
        "final": {}, "provisional": {"final": False, "trigger": None, "closed_ts": None},
        "insufficient": {}, "incomplete": {"state": {"expected": 80}}, "wall": {"state": {"wall": True}},
        "late": {"trigger": "late", "revision": 2},
        "defended": {"defended": StepEstimate(n=45, rejected=5, frequencies=np.array([0.6, 0.4]),
                                              frequencies_norm_sub=np.array([0.6, 0.4]), variance=0.02)},
    }[case]
    doc = _doc(c, [1, 0] if case == "insufficient" else [30, 20], **kw)
    assert _errors("estimate.v1", doc) == []
    assert doc["schema_version"] == 1 and doc["min_n"] == DEFAULT_MIN_N
    assert doc["status"] == ("insufficient" if case == "insufficient" else "ok")
    if case == "incomplete":
        assert doc["complete"] is False and doc["expected_n"] == 80


@pytest.mark.parametrize("change, why", [
    (lambda d: d.pop("schema_version"), "'schema_version' is a required property"),
    (lambda d: d.update(schema_version=2), "1 was expected"),
    (lambda d: d.update(n="50"), "'50' is not of type 'integer'"),
    (lambda d: d.update(status="insufficient"), "is not of type 'null'"),
    (lambda d: d.update(final=False), "None was expected"),
    (lambda d: d.update(frequencies=None), "None is not of type 'array'"),
    (lambda d: d.update(complete=False), "None is not of type 'string'"),
    (lambda d: d.update(trigger="clock"), "is not one of"),
])
def test_the_schema_rejects_a_broken_estimate(change, why: str) -> None:
    doc = _doc(_campaign(), [30, 20])
    change(doc)
    errors = _errors("estimate.v1", doc)
    assert errors and any(why in e for e in errors), errors


def test_an_unknown_field_is_allowed_within_the_version() -> None:
    doc = _doc(_campaign(), [30, 20])
    assert _errors("estimate.v1", {**doc, "a_later_field": [1, 2]}) == []


# ---------------------------------------------------------------------------- min_n
def test_min_n_is_a_server_side_campaign_setting() -> None:
    assert _campaign().min_n == DEFAULT_MIN_N == 10
    assert _campaign(min_n=200).min_n == 200
    assert _campaign(min_n=200).fingerprint == _campaign().fingerprint  # not part of the data contract
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(CampaignError, match="min_n"):
            _campaign(min_n=bad)
    assert Campaign.load(DEMO).min_n == 10


def test_a_final_below_min_n_is_insufficient_without_frequencies() -> None:
    c = _campaign(min_n=3)
    for counts, status in (([1, 0], "insufficient"), ([1, 1], "insufficient"), ([2, 1], "ok")):
        doc = _doc(c, counts)
        assert doc["status"] == status and doc["n"] == sum(counts) and doc["final"]
        empty = status == "insufficient"
        assert (doc["frequencies"] is None) is empty and (doc["frequencies_norm_sub"] is None) is empty
        assert (doc["variance"] is None) is empty and (doc["ci95_halfwidth"] is None) is empty
    # the example: one report of a binary GRR at eps = 1 published [1.58, -0.58]
    one = _doc(_campaign(), [1, 0])
    assert one["status"] == "insufficient" and one["frequencies"] is None and one["n"] == one["n_counted"] == 1
    provisional = _doc(_campaign(), [1, 0], final=False, trigger=None)
    assert provisional["status"] == "insufficient" and provisional["frequencies"] is None


def test_the_estimator_publishes_an_insufficient_final_then_a_revision_with_frequencies(local_stack) -> None:
    """One report and a watermark: the final is insufficient; late data bring n to min_n: revision 1 has them."""
    c = _campaign(f"minn-{uuid.uuid4().hex[:6]}", min_n=5)
    published: list[dict] = []

    async def publish(doc: dict) -> None:
        published.append(json.loads(json.dumps(doc)))

    async def run() -> None:
        store = CountStore.from_url(local_stack.info.redis_url)
        est = Estimator({c.id: c}, store, Metrics(), publish, app_id=c.id, refresh_seconds=0.05)
        try:
            await store.apply_batch(c.id, "a", 0, np.array([1, 0]), 1, "m:0:a:0")
            await store.apply_watermark(c.id, "a", 0)
            (first,) = await est.tick(now=0.0)
            await store.apply_batch(c.id, "a", 0, np.array([3, 2]), 5, "m:0:a:1")
            (second,) = await est.tick(now=0.0)
            assert (await store.estimates(c.id, "a"))[0]["revision"] == 1
        finally:
            await est.release()
            await store.close()
        assert (first["final"], first["revision"], first["n"], first["status"]) == (True, 0, 1, "insufficient")
        assert first["frequencies"] is None
        assert (second["final"], second["trigger"], second["revision"], second["n"], second["status"]) == \
            (True, "late", 1, 6, "ok")
        assert second["frequencies"] == c.attribute("a").protocol.estimate(np.array([4, 2]), 6).tolist()

    asyncio.run(run())
    assert [_errors("estimate.v1", d) for d in published] == [[], []]


# ---------------------------------------------------------------------------- headers, key, partitions
def test_a_published_estimate_carries_its_headers_and_key(local_stack) -> None:
    boot = local_stack.info.kafka_bootstrap
    topic = Topics.with_prefix(f"hdr-{uuid.uuid4().hex[:6]}.").estimates
    c = _campaign()
    doc = _doc(c, [30, 20])

    async def run() -> list[Any]:
        from aiokafka import AIOKafkaConsumer

        publisher = EstimatePublisher(boot, topic, partitions=1)
        try:
            await publisher.send(estimate_key(c.id, "a", doc["t"]), doc)
        finally:
            await publisher.close()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=boot, group_id=None, auto_offset_reset="earliest")
        await consumer.start()
        try:
            batch = await consumer.getmany(timeout_ms=5000)
            return [m for msgs in batch.values() for m in msgs]
        finally:
            await consumer.stop()

    (msg,) = asyncio.run(run())
    assert dict(msg.headers) == {"content-type": b"application/json", "ldp-schema-version": b"1",
                                 "ldp-campaign": c.id.encode(), "ldp-attribute": b"a"}
    assert msg.key == b"contract:a:7" and json.loads(msg.value) == doc
    assert estimate_problems(msg.key, msg.value, msg.headers) == []


def test_the_topic_check_names_what_is_wrong() -> None:
    c = _campaign()
    doc = _doc(c, [30, 20])
    value, key = json.dumps(doc).encode(), estimate_key(c.id, "a", 7)
    headers = contract.estimate_headers(doc)
    assert estimate_problems(key, value, headers) == []
    assert estimate_problems(key, value, []) == [f"header {h!r} is missing" for h, _ in headers]
    wrong = [(h, b"other") if h == contract.HEADER_ATTRIBUTE else (h, v) for h, v in headers]
    assert estimate_problems(key, value, wrong) == ["header 'ldp-attribute' is b'other', the document says b'a'"]
    assert estimate_problems(b"contract:a:8", value, headers) == ["key b'contract:a:8', expected b'contract:a:7'"]
    assert estimate_problems(key, b"{", headers)[0].startswith("the value is not JSON")
    old = {k: v for k, v in doc.items() if k != "schema_version"}
    assert any("schema_version" in p for p in estimate_problems(key, json.dumps(old).encode(), headers))


def _compose_value(value: Any, env: dict[str, Any]) -> str:
    """A compose value with its defaults: ``${X:-d}`` -> ``d``; the shell's ``$$X`` -> the service's ``X``."""
    value = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", str(value))
    ref = re.fullmatch(r"\$\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value)
    return _compose_value(env[ref.group(1)], env) if ref else value


def _env(service: dict[str, Any]) -> dict[str, Any]:
    env = service.get("environment") or {}
    return dict(e.split("=", 1) for e in env) if isinstance(env, list) else env


def test_one_estimates_partition_count_everywhere() -> None:
    """The worker creates the topic with ``estimates_partitions`` (default 1); compose's kafka-init creates it alike
    (and its workers, if they are told a count, are told the same)."""
    import yaml

    settings = WorkerSettings(campaign_paths=(DEMO,), kafka_bootstrap="k:9092", redis_url="redis://r")
    default = settings.estimates_partitions
    assert default == 1
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    init = services["kafka-init"]
    script = " ".join(init["command"]) if isinstance(init["command"], list) else init["command"]
    m = re.search(r"--topic\s+ldp\.estimates\b[\s\\]+--partitions\s+\"?([^\s\"]+)", script)
    assert m, "kafka-init must create ldp.estimates with --partitions"
    created = int(_compose_value(m.group(1), _env(init)))
    assert created == default, f"compose creates ldp.estimates with {created} partitions, the workers with {default}"
    worker = services["worker"]
    told = [_compose_value(v, {}) for v in [_env(worker).get("LDP_ESTIMATES_PARTITIONS")] if v is not None]
    argv = [str(a) for a in worker.get("command") or []]
    told += [_compose_value(argv[i + 1], {}) for i, a in enumerate(argv[:-1]) if a == "--estimates-partitions"]
    assert all(int(v) == created for v in told), f"compose's workers are told {told}, kafka-init creates {created}"


# ---------------------------------------------------------------------------- the API answers
def test_each_route_has_its_schema_and_bad_answers_fail() -> None:
    assert schema_of("/estimates/c/a", 200) == "estimate.v1"
    assert schema_of("/estimates/c/a/history", 200) == "api-history.v1"
    assert schema_of("/estimates/c/a", 404) == "api-error.v1"
    assert [schema_of(p, 200) for p in ("/campaigns", "/status", "/health", "/metrics", "/")] == \
        ["api-campaigns.v1", "api-status.v1", "api-health.v1", None, None]
    c = Campaign.load(DEMO)
    check_answer("http://w/campaigns", 200, {"schema_version": 1, "campaigns": [campaign_doc(c)]})
    doc = _doc(_campaign(), [30, 20])
    check_answer("http://w/estimates/contract/a/history", 200,
                 {"schema_version": 1, "campaign": "contract", "attribute": "a", "estimates": [doc]})
    check_answer("http://w/estimates/x/y", 404, {"schema_version": 1, "error": "unknown campaign 'x'"})
    check_answer("http://w/health", 503, {"schema_version": 1, "healthy": False, "worker_id": "w", "problems": [
        {"problem": "redis", "component": "redis", "since": 1.0, "error": "connection refused"}]})
    with pytest.raises(ContractError, match="api-history.v1"):
        check_answer("http://w/estimates/contract/a/history", 200,
                     {"schema_version": 1, "campaign": "contract", "attribute": "a",
                      "estimates": [{**doc, "final": False, "trigger": None}]})
    with pytest.raises(ContractError, match="api-error.v1"):
        check_answer("http://w/estimates/x/y", 404, {"error": "no schema_version"})


# ---------------------------------------------------------------------------- the consumer examples
def _load_python_example() -> Any:
    spec = importlib.util.spec_from_file_location("consume_estimates", ROOT / "examples" / "consume_estimates.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _steps(c: Campaign) -> list[dict[str, Any]]:
    """What a worker publishes for steps 7 and 8: previews, an insufficient final and its revision, a final
    published twice (a retried claim)."""
    step0 = [_doc(c, [1, 0], final=False, trigger=None), _doc(c, [1, 0]),
             _doc(c, [30, 20], trigger="late", revision=1)]
    step1 = [_doc(c, [20, 20], final=False, trigger=None), _doc(c, [40, 30]), _doc(c, [40, 30])]
    for d in step1:
        d["t"] = 8
    return step0 + step1


def test_the_python_consumer_example_keeps_the_newest_final_of_each_step(local_stack) -> None:
    example = _load_python_example()
    c = _campaign(f"py-{uuid.uuid4().hex[:6]}")
    docs = _steps(c)
    boot, topic = local_stack.info.kafka_bootstrap, Topics.with_prefix(f"{c.id}.").estimates

    async def run() -> Any:
        publisher = EstimatePublisher(boot, topic)
        try:
            for d in docs:
                await publisher.send(estimate_key(d["campaign"], d["attribute"], d["t"]), d)
        finally:
            await publisher.close()
        changed: list[dict] = []
        answers = await example.follow(boot, topic, idle=1.5, on_answer=changed.append)
        return answers, changed

    answers, changed = asyncio.run(run())
    # in order within a step (one key, one partition); the steps' partitions interleave in any order
    assert [(d["revision"], d["status"]) for d in changed if d["t"] == 7] == [(0, "insufficient"), (1, "ok")]
    assert [(d["revision"], d["status"]) for d in changed if d["t"] == 8] == [(0, "ok")]
    assert answers.current(c.id, "a") == {7: docs[2]["frequencies"], 8: docs[4]["frequencies"]}
    # a later major version is skipped, not misread (only here: the session checks the topics against v1)
    future = {**_doc(c, [5, 95], trigger="late", revision=2), "t": 8, "schema_version": 2}
    assert answers.offer(future, {"ldp-schema-version": b"2"}) is None and answers.skipped == 1
    assert answers.current(c.id, "a")[8] == docs[4]["frequencies"]


def test_the_node_consumer_example_prints_the_current_answers() -> None:
    """The JS client's example reads a worker's history over HTTP (fetch): served here by a stub of the route."""
    from ldpstream_dev.debian import ToolUnavailable, ensure_binary

    try:
        node = ensure_binary("node", "nodejs")
    except ToolUnavailable as exc:
        pytest.fail(f"the JavaScript example needs Node.js >= 18: {exc}")
    c = _campaign()
    insufficient, ok = _doc(c, [1, 0]), {**_doc(c, [40, 30], trigger="late", revision=1), "t": 8}
    history = {"schema_version": 1, "campaign": c.id, "attribute": "a", "estimates": [insufficient, ok]}
    check_answer("http://stub/estimates/contract/a/history", 200, history)

    class Stub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            known = self.path == f"/estimates/{c.id}/a/history"
            body = json.dumps(history if known else {"schema_version": 1, "error": "unknown"}).encode()
            self.send_response(200 if known else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run([node, str(ROOT / "clients" / "js" / "examples" / "consume-estimates.mjs"),
                               "--url", f"http://127.0.0.1:{server.server_port}", "--campaign", c.id,
                               "--attribute", "a"], capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert lines == [{"t": 7, "revision": 0, "n": 1, "answer": "insufficient"},
                     {"t": 8, "revision": 1, "n": 70, "answer": ok["frequencies"]}]


# ---------------------------------------------------------------------------- numeric attributes
def _numeric_campaign(mechanism: str, **params: Any) -> Campaign:
    return Campaign.from_dict({"campaign": {"id": "numeric", "time_step_seconds": 3600.0},
                               "attributes": [{"name": "a", "type": "numeric", "range": [0.0, 100.0],
                                               "mechanism": mechanism, "eps": 1.0, **params}]})


@pytest.mark.parametrize("mechanism, params", [("PM", {}), ("SW", {"d_in": 32, "d_out": 32})])
@pytest.mark.parametrize("case", ["final", "provisional", "insufficient"])
def test_numeric_estimates_validate_and_carry_a_mean(mechanism: str, params: dict[str, Any], case: str) -> None:
    """A numeric attribute's estimate: kind, range, mean ± 95% CI (null frequencies); for Square Wave the
    distribution and quantiles, with intervals on a final only; all null when insufficient."""
    c = _numeric_campaign(mechanism, **params)
    proto = c.attribute("a").protocol
    n = 5 if case == "insufficient" else 4000
    values = np.random.default_rng(3).uniform(20.0, 60.0, n)
    with pytest.warns(Warning):  # the labelled simulation mode
        reports = proto.randomize(values, np.random.default_rng(4))
    counts = proto.support(reports).tolist()
    kw = {"final": False, "trigger": None, "closed_ts": None} if case == "provisional" else {}
    args: dict[str, Any] = dict(final=True, trigger="watermark", now=12.0, closed_ts=11.5, worker="w-1", fence=3)
    args.update(kw)
    doc = json.loads(json.dumps(build_estimate(c, c.attribute("a"), 7, _state(counts) | {"n": n}, 8, **args)))
    assert _errors("estimate.v1", doc) == []
    assert doc["kind"] == "numeric" and doc["range"] == [0.0, 100.0] and doc["frequencies"] is None
    if case == "insufficient":
        assert doc["status"] == "insufficient" and doc["mean"] is None and doc["quantiles"] is None
        return
    est = proto.estimate_mean(np.array(counts), n)
    assert doc["mean"] == pytest.approx(est.mean) and doc["ci95_halfwidth"] == pytest.approx(est.ci95_halfwidth)
    assert doc["mean_ci95"] == pytest.approx([est.mean - est.ci95_halfwidth, est.mean + est.ci95_halfwidth])
    assert abs(doc["mean"] - values.mean()) < 4 * np.sqrt(doc["mean_variance"])
    if mechanism == "PM":
        assert doc["distribution"] is None and doc["quantiles"] is None
        return
    assert len(doc["distribution"]["grid"]) == len(doc["distribution"]["probabilities"]) == 32
    assert set(doc["quantiles"]) == {"p50", "p90", "p99"}
    bounded = [q["lower"] is not None for q in doc["quantiles"].values()]
    assert all(bounded) if case == "final" else not any(bounded)
    assert _errors("estimate.v1", doc | {"mean": None}) != []  # an ok numeric estimate without its mean is refused


def test_a_categorical_estimate_has_null_numeric_fields() -> None:
    doc = _doc(_campaign(), [30, 20])
    assert doc["kind"] == "categorical" and doc["mean"] is None and doc["range"] is None
    assert _errors("estimate.v1", doc | {"frequencies": None}) != []
