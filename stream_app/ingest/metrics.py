"""Prometheus metrics of the ingest service's report handler.

``ldp ingest`` runs several processes behind one port: each records into prometheus_client's
multiprocess files (``PROMETHEUS_MULTIPROC_DIR``, set up by :func:`stream_app.ingest.service.serve`) and
``GET /metrics`` of any process answers the sum over all of them (:func:`render`), with ``ldp_build_info`` and the
process metrics of every live ingest process, one series per process (``pid`` label:
:class:`stream_app.exposition.SiblingProcessCollector`; prometheus_client's own would report only the process
that answers, a different one from scrape to scrape), and no ``_created`` series.
"""
from __future__ import annotations

import os

from prometheus_client import (CollectorRegistry, Counter, Histogram, PlatformCollector, ProcessCollector,
                               generate_latest)

from ..exposition import BuildInfoCollector, SiblingProcessCollector, disable_created_series

disable_created_series()  # before the first counter: no <name>_created series beside them

__all__ = ["IngestMetrics", "MULTIPROC_ENV", "process_registry", "render", "use_multiprocess_values"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5,
                    5.0, 10.0)


class IngestMetrics:
    """The handler's metrics in ``registry`` (``reports``: also count accepted reports per attribute)."""

    def __init__(self, registry: CollectorRegistry | None, *, reports: bool = True) -> None:
        r = registry
        self.requests_total = Counter("ldp_ingest_requests_total", "Report requests answered, by HTTP status.",
                                      ["status"], registry=r)
        self.refused_total = Counter(
            "ldp_ingest_refused_requests_total", "Report requests refused, by reason (missing/forged/expired token, "
            "rate_limited, body_too_large, a decoding reason ...): nothing of them is counted.", ["reason"],
            registry=r)
        self.reports_total = Counter("ldp_ingest_reports_total", "Reports published to Kafka by the ingest.",
                                     ["campaign", "attribute"], registry=r) if reports else None
        self.rejected_reports_total = Counter(
            "ldp_rejected_reports_total", "Reports the attribute's poisoning defense refused, by reason (at the "
            "ingest: implausible, the per-report size check of unary reports; the request is refused).",
            ["campaign", "attribute", "reason"], registry=r)
        self.replayed_total = Counter("ldp_ingest_replayed_requests_total", "Requests answered from their idempotency "
                                      "record (a retry with the same Idempotency-Key): nothing published.", registry=r)
        self.publish_seconds = Histogram("ldp_ingest_publish_seconds", "From a request's validated reports to "
                                         "the broker's acknowledgement of their batch (linger included).",
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.request_seconds = Histogram("ldp_ingest_request_seconds", "Report request handling time, from the "
                                         "headers to the answer.", buckets=_LATENCY_BUCKETS, registry=r)


def process_registry() -> CollectorRegistry:
    """A registry of the metrics of no handler: ``ldp_build_info``, ``python_info`` and the process metrics (of this
    process; in multiprocess mode of every ingest process, module doc)."""
    registry = CollectorRegistry()
    registry.register(BuildInfoCollector())
    PlatformCollector(registry=registry)
    if os.environ.get(MULTIPROC_ENV):
        registry.register(SiblingProcessCollector(os.environ[MULTIPROC_ENV]))
    else:
        ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The exposition of ``registry``, or of every process's files in multiprocess mode, after
    :func:`process_registry`'s."""
    head = generate_latest(process_registry())
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        merged = CollectorRegistry()
        multiprocess.MultiProcessCollector(merged)
        return head + generate_latest(merged)
    return head + generate_latest(registry)


def use_multiprocess_values() -> None:
    """Make metrics created from now on write to the multiprocess files if ``PROMETHEUS_MULTIPROC_DIR`` is set
    (prometheus_client picks its value class when first imported, possibly before the variable was set)."""
    from prometheus_client import values

    if os.environ.get(MULTIPROC_ENV) and not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.MultiProcessValue(process_identifier=_process_id)


_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


def _process_id() -> int:
    """This process's id, kept up to date across forks: prometheus_client asks for it at every increment (to
    notice a fork), and ``os.getpid`` is a system call each time."""
    return _pid
