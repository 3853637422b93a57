"""Kafka topic names and message keys: the only place they are spelled.

* ``ldp.reports``: batch envelopes (:mod:`wire.envelope`), key :func:`message_key` ``"{t}:{attr}"``:
  every batch and the watermark of one step of one attribute share a key, hence a partition, so
  the watermark follows the step's batches;
* ``ldp.rejected``: one JSON record per rejected batch or report (key: the rejected message's);
* ``ldp.estimates``: one JSON document per final estimate, key :func:`estimate_key`
  ``"{campaign}:{attr}:{t}"``.

A prefix (:meth:`Topics.with_prefix`) renames all three, so tests and benchmarks can share one
broker without sharing topics.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["REPORTS_TOPIC", "REJECTED_TOPIC", "ESTIMATES_TOPIC", "Topics", "message_key", "estimate_key"]

REPORTS_TOPIC = "ldp.reports"
REJECTED_TOPIC = "ldp.rejected"
ESTIMATES_TOPIC = "ldp.estimates"


@dataclass(frozen=True)
class Topics:
    """The three topic names of one deployment (``prefix`` lets tests share a broker)."""

    reports: str = REPORTS_TOPIC
    rejected: str = REJECTED_TOPIC
    estimates: str = ESTIMATES_TOPIC

    @classmethod
    def with_prefix(cls, prefix: str = "") -> "Topics":
        """``{prefix}ldp.reports``, ``{prefix}ldp.rejected``, ``{prefix}ldp.estimates``."""
        return cls(prefix + REPORTS_TOPIC, prefix + REJECTED_TOPIC, prefix + ESTIMATES_TOPIC)


def message_key(t: int, attribute: str) -> bytes:
    """Key of a batch or watermark of step ``t`` of ``attribute`` on ``ldp.reports``: ``"{t}:{attr}"``."""
    return f"{int(t)}:{attribute}".encode()


def estimate_key(campaign: str, attribute: str, t: int) -> bytes:
    """Key of the final estimate of step ``t`` on ``ldp.estimates``: ``"{campaign}:{attr}:{t}"``."""
    return f"{campaign}:{attribute}:{int(t)}".encode()
