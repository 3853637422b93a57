"""Checks what the workers publish against the estimates contract (:mod:`wire.estimates`, ``docs/estimates.md``).

* :func:`check_topics`: every message of every topic of a broker whose name ends in ``estimates`` (a test's
  ``{prefix}ldp.estimates`` included): its value against ``estimate.v1``, its key (``"{campaign}:{attribute}:{t}"``)
  and its four headers present and agreeing with the value. The test session runs it on its broker at the end.
* :func:`check_answer`: a JSON answer of a worker's HTTP API against the schema of its route. The harness's readers
  (:func:`ldpstream_dev.workers.estimate_history`, the tests' HTTP helpers) call it; it checks only once
  :func:`enable` was called (the test session does), so the CLI's users of the harness need no ``jsonschema``.

Needs the ``jsonschema`` package (the ``test`` extra) when it checks.
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from functools import cache
from typing import Any
from urllib.parse import urlsplit

from wire import estimates as contract
from wire.topics import estimate_key
from wire.transport import kafka_client_options

__all__ = ["ContractError", "check_answer", "check_topics", "enable", "estimate_problems", "schema_of", "validator"]

_enabled = False

#: route (path regex) -> schema of its 200 answer; every 4xx answer is ``api-error.v1``
_ROUTES = ((re.compile(r"^/estimates/[^/]+/[^/]+/history/?$"), "api-history.v1"),
           (re.compile(r"^/estimates/[^/]+/[^/]+/query/?$"), "api-query.v1"),
           (re.compile(r"^/estimates/[^/]+/[^/]+/?$"), "estimate.v1"),
           (re.compile(r"^/campaigns/?$"), "api-campaigns.v1"),
           (re.compile(r"^/status/?$"), "api-status.v1"),
           (re.compile(r"^/health/?$"), "api-health.v1"))


class ContractError(AssertionError):
    """A message or an answer that breaks the estimates contract."""


def enable() -> None:
    """Make :func:`check_answer` check (the test session calls it once)."""
    global _enabled
    _enabled = True


@cache
def validator(name: str) -> Any:
    """The ``jsonschema`` validator of the schema ``name`` (:data:`wire.estimates.SCHEMAS`), checked, the other
    schemas resolvable by their ``$id`` (the history's items are estimates)."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    registry = Registry().with_resources((s["$id"], Resource.from_contents(s))
                                         for s in map(contract.load_schema, contract.SCHEMAS))
    schema = contract.load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=registry)


def _errors(name: str, doc: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(document)'}: {e.message}"
            for e in validator(name).iter_errors(doc)][:5]


def schema_of(path: str, status: int) -> str | None:
    """The schema of the JSON answer to ``GET path`` with HTTP ``status`` (``None``: not a JSON route)."""
    for pattern, name in _ROUTES:
        if pattern.match(path):
            return "api-error.v1" if 400 <= status < 500 else name
    return None


def check_answer(url: str, status: int, doc: Any) -> None:
    """Raise :class:`ContractError` if ``doc``, the answer to ``GET url`` with ``status``, does not validate against
    its route's schema (a no-op before :func:`enable`; ``/health``'s 503 answer is ``api-health.v1`` too)."""
    if not _enabled:
        return
    name = schema_of(urlsplit(url).path, 200 if status == 503 else status)
    if name is None:
        return
    errors = _errors(name, doc)
    if errors:
        raise ContractError(f"GET {url} (HTTP {status}) does not validate against {name}: {'; '.join(errors)}")


def estimate_problems(key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]] | tuple) -> list[str]:
    """What is wrong with one message of ``ldp.estimates``: its value against ``estimate.v1``, its key, its headers
    (an empty list: nothing)."""
    try:
        doc = json.loads(value) if value else None
    except ValueError as exc:
        return [f"the value is not JSON ({exc})"]
    problems = _errors("estimate.v1", doc)
    if not isinstance(doc, dict) or problems:
        return problems or ["the value is not a JSON object"]
    want = dict(contract.estimate_headers(doc))
    got: dict[str, bytes] = {}
    for name, raw in headers or ():
        if name in got:
            problems.append(f"header {name!r} appears twice")
        got[name] = raw
    for name, raw in want.items():
        if name not in got:
            problems.append(f"header {name!r} is missing")
        elif got[name] != raw:
            problems.append(f"header {name!r} is {got[name]!r}, the document says {raw!r}")
    expected_key = estimate_key(doc["campaign"], doc["attribute"], doc["t"])
    if key != expected_key:
        problems.append(f"key {key!r}, expected {expected_key!r}")
    return problems


async def _read_topics(bootstrap: str, suffix: str, timeout: float) -> dict[str, list[Any]]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", **kafka_client_options())
    await consumer.start()
    try:
        names = sorted(t for t in await consumer.topics() if t.endswith(suffix))
        tps = [TopicPartition(t, p) for t in names for p in sorted(consumer.partitions_for_topic(t) or ())]
        out: dict[str, list[Any]] = {t: [] for t in names}
        if not tps:
            return out
        ends = await consumer.end_offsets(tps)
        todo = {tp for tp in tps if ends[tp] > 0}
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {sorted(str(tp) for tp in todo)} to their end took over {timeout} s")
            batch = await consumer.getmany(*todo, timeout_ms=1000, max_records=10_000)
            for tp, msgs in batch.items():
                out[tp.topic].extend(m for m in msgs if m.offset < ends[tp])
            todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
        return out
    finally:
        await consumer.stop()


def check_topics(bootstrap: str, *, suffix: str = "estimates", timeout: float = 120.0) -> tuple[int, list[str]]:
    """Check every message of the broker's topics named ``*{suffix}``: ``(messages checked, problems)``, each
    problem naming its topic, partition and offset."""
    topics = asyncio.run(_read_topics(bootstrap, suffix, timeout))
    problems: list[str] = []
    checked = 0
    for topic, msgs in topics.items():
        for m in msgs:
            checked += 1
            problems += [f"{topic} partition {m.partition} offset {m.offset}: {p}"
                         for p in estimate_problems(m.key, m.value, m.headers)]
    return checked, problems
