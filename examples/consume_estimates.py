"""Read ``ldp.estimates`` and keep the current answer of every step (docs/estimates.md, "The current answer").

    python examples/consume_estimates.py --bootstrap 127.0.0.1:9092 [--topic ldp.estimates] [--idle 5]

A consumer of the topic needs only a Kafka client (here aiokafka) and JSON; not the ldp-stream package. For each
``(campaign, attribute, t)`` it keeps the *final* estimate with the highest ``revision``: provisional estimates
(``final: false``) are live previews that a final replaces, a republished final (same revision) changes nothing,
and a revision after late data replaces the one before. An answer whose ``status`` is ``"insufficient"`` has no
frequencies: the step has no answer (yet; a revision may bring one). Messages of a ``schema_version`` this
consumer does not know are skipped, and fields it does not know are ignored (the compatibility rule).

It prints one JSON line per answer that changed. Without ``--idle`` it follows the topic until interrupted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

#: The schema versions this consumer understands.
KNOWN_VERSIONS = {1}

Step = tuple[str, str, int]  # (campaign, attribute, t)


@dataclass
class Answers:
    """The newest final of every step seen so far."""

    finals: dict[Step, dict[str, Any]] = field(default_factory=dict)
    skipped: int = 0  # messages of an unknown schema version

    def offer(self, doc: dict[str, Any], headers: dict[str, bytes] | None = None) -> dict[str, Any] | None:
        """Fold one message in; returns the document if it became its step's answer."""
        version = (headers or {}).get("ldp-schema-version")
        if (int(version) if version else doc.get("schema_version")) not in KNOWN_VERSIONS:
            self.skipped += 1
            return None
        if not doc.get("final"):
            return None  # a provisional estimate: a preview, never the answer
        step = (doc["campaign"], doc["attribute"], int(doc["t"]))
        held = self.finals.get(step)
        if held is not None and held["revision"] >= doc["revision"]:
            return None  # published again (same revision) or an older revision
        self.finals[step] = doc
        return doc

    def current(self, campaign: str, attribute: str) -> dict[int, list[float] | None]:
        """``t -> frequencies`` of the attribute's steps; ``None`` where the answer is ``insufficient``."""
        return {t: (doc["frequencies"] if doc["status"] == "ok" else None)
                for (c, a, t), doc in sorted(self.finals.items()) if (c, a) == (campaign, attribute)}


async def follow(bootstrap: str, topic: str = "ldp.estimates", *, idle: float | None = None,
                 on_answer: Callable[[dict[str, Any]], None] | None = None) -> Answers:
    """Read ``topic`` from its beginning; stop after ``idle`` seconds without a message (``None``: never)."""
    from aiokafka import AIOKafkaConsumer

    answers = Answers()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=int((idle if idle is not None else 1.0) * 1000))
            if not batch and idle is not None:
                return answers
            for records in batch.values():
                for record in records:
                    doc = json.loads(record.value)
                    changed = answers.offer(doc, dict(record.headers or ()))
                    if changed is not None and on_answer is not None:
                        on_answer(changed)
    finally:
        await consumer.stop()


def _print(doc: dict[str, Any]) -> None:
    answer = doc["frequencies"] if doc["status"] == "ok" else "insufficient"
    print(json.dumps({"campaign": doc["campaign"], "attribute": doc["attribute"], "t": doc["t"],
                      "revision": doc["revision"], "n": doc["n"], "answer": answer}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap host:port")
    parser.add_argument("--topic", default="ldp.estimates")
    parser.add_argument("--idle", type=float, default=None, help="stop after this many seconds without a message")
    args = parser.parse_args(argv)
    try:
        answers = asyncio.run(follow(args.bootstrap, args.topic, idle=args.idle, on_answer=_print))
    except KeyboardInterrupt:
        return 0
    print(f"{len(answers.finals)} steps answered, {answers.skipped} messages of unknown versions skipped",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
