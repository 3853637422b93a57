"""Prometheus metrics of one stream-app instance (one registry per app, so several apps can live
in one process, e.g. in tests).

Counters (``ldp_reports_total``, ``ldp_rejected_batches_total``) are per worker: Prometheus sums
them over the instances of a consumer group, and reports/s is their ``rate`` (no gauge repeats it). Their series
of every known label value (the rejection reasons, the campaigns' attributes) exist at 0 from the start, so
``rate``/``increase`` see their first increment. The estimate gauges (step ``n``, privacy figures, estimate
latency) are written only by the worker that holds the estimator lease (see :mod:`stream_app.windows`), so exactly
one instance exports them at a time.

Bounded by default: no label grows with a domain size k. The estimated frequency of each value
(``ldp_estimated_frequency_ratio{value}``, k series per attribute) is exported only with the worker option
``per_value_metrics`` (``LDP_PER_VALUE_METRICS``), and then only for attributes with k at most
``per_value_metrics_max_k``; the HTTP API (``GET /estimates/...``) always has every value. The registry also
carries ``ldp_build_info``, the process metrics and no ``_created`` series (:mod:`stream_app.exposition`).
"""
from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, GCCollector, Histogram,
                               PlatformCollector, ProcessCollector, generate_latest)

from wire.errors import REASONS

from .exposition import BuildInfoCollector, disable_created_series

disable_created_series()  # before the first counter: no <name>_created series beside them

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    """All metrics of the pipeline, registered in a private :class:`CollectorRegistry`."""

    def __init__(self, *, per_value_metrics: bool = False, per_value_metrics_max_k: int = 1000) -> None:
        self.registry = r = CollectorRegistry()
        r.register(BuildInfoCollector())
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.per_value_metrics = per_value_metrics
        self.per_value_metrics_max_k = per_value_metrics_max_k
        ca = ["campaign", "attribute"]
        self.reports_total = Counter("ldp_reports_total", "Reports counted into Redis (first application only).",
                                     ca, registry=r)
        self.batches_total = Counter("ldp_batches_total", "Batches applied to Redis (duplicates excluded).",
                                     ca, registry=r)
        self.duplicate_batches_total = Counter(
            "ldp_duplicate_batches_total",
            "Batches skipped because their batch id was already applied (a producer retry or resume, a "
            "redelivery after a crash or rebalance, a replay after a store loss).", ca, registry=r)
        self.store_resets_total = Counter(
            "ldp_store_resets_total", "Times this worker found that Redis lost a campaign's data (its epoch "
            "changed) and replayed the reports topic from the store's positions.", ["campaign"], registry=r)
        self.topic_incarnations_total = Counter(
            "ldp_topic_incarnations_total", "Times this worker found the reports topic recreated under it (a "
            "broker that lost its data) and replayed the new incarnation from its first offset.", registry=r)
        self.unrepairable_losses_total = Counter(
            "ldp_unrepairable_losses_total", "Broker losses a replay cannot repair, seen by this worker: messages "
            "deleted before they were counted (log start past the position), a topic recreated empty, offsets "
            "going back. The steps not final then are marked incomplete.", registry=r)
        self.watermarks_total = Counter("ldp_watermarks_total", "Watermarks applied.", ca, registry=r)
        self.rejected_total = Counter("ldp_rejected_batches_total", "Batches (or HTTP reports) rejected, by reason.",
                                      ["reason"], registry=r)
        for reason in REASONS:  # every reason's series exists from the start: increase() sees the first rejection
            self.rejected_total.labels(reason)
        self.consumer_lag = Gauge("ldp_consumer_lag_messages", "Messages behind the partition high-water mark.",
                                  ["partition"], registry=r)
        self.consumer_lag_seconds = Gauge("ldp_consumer_lag_seconds",
                                          "Processing time minus produce timestamp of the last batch.",
                                          ["partition"], registry=r)
        # registered always (its HELP says how to enable it); samples only with the option (per_value)
        self.estimated_frequency = Gauge(
            "ldp_estimated_frequency_ratio", "Estimated frequency (unbiased, raw) of each value at the latest step: "
            "exported only with the worker option per_value_metrics (LDP_PER_VALUE_METRICS), for attributes with k "
            "<= per_value_metrics_max_k; GET /estimates/{campaign}/{attribute} has every value.",
            ["campaign", "attribute", "value"], registry=r)
        self.step_reports = Gauge("ldp_step_reports", "Reports n of the latest step.", ca, registry=r)
        self.latest_step = Gauge("ldp_latest_step", "Latest time step t with an estimate.", ca, registry=r)
        self.eps_first = Gauge("ldp_eps_first", "epsilon of a single report (eps_1).", ca, registry=r)
        self.eps_inf = Gauge("ldp_eps_inf", "epsilon of one memoized value (eps_inf).", ca, registry=r)
        self.eps_longitudinal_worst = Gauge(
            "ldp_eps_longitudinal_worst", "Worst-case longitudinal epsilon of a device so far (latest step).",
            ca, registry=r)
        self.estimate_latency = Histogram(
            "ldp_estimate_latency_seconds",
            "Final estimate publication time minus the step's last input (last batch or watermark).",
            ["trigger"], buckets=_LATENCY_BUCKETS, registry=r)
        self.estimates_published = Counter("ldp_estimates_published_total", "Estimates published.",
                                           ["final"], registry=r)
        self.estimator_leader = Gauge("ldp_estimator_leader", "1 while this worker holds the estimator lease.",
                                      registry=r)
        # late data and retention (stream_app/windows.py; written by the estimator lease holder)
        self.count_regressions = Counter(
            "ldp_count_regressions_total", "Final steps whose count in Redis fell below their published final's n "
            "(Redis lost data; no revision is published while it is lower), once per step.", ca, registry=r)
        self.incomplete_finals = Counter(
            "ldp_incomplete_finals_total", "Finals published with complete=false: the broker lost some of the step's "
            "reports before they were counted (an unrepairable loss, or fewer reports than its watermark states).",
            ca, registry=r)
        self.steps_pruned = Counter("ldp_steps_pruned_total", "Steps deleted from Redis beyond the campaign's "
                                    "retention (retention_steps).", ca, registry=r)
        self.retention_floor = Gauge("ldp_retention_floor_step", "The attribute's retention floor (a step): "
                                     "batches for lower steps are expired, their data deleted.", ca, registry=r)
        # health (stream_app/health.py): GET /health answers 503 while ldp_worker_healthy is 0
        self.worker_healthy = Gauge("ldp_worker_healthy", "1 while this worker can make progress, 0 while a "
                                    "problem stops it (GET /status lists the problems).", registry=r)
        self.worker_problem_seconds = Gauge(
            "ldp_worker_problem_seconds", "Seconds since each current problem of this worker began (redis, "
            "store_retry, kafka, rebalance, starting, stopping, or an alarm).", ["problem", "component"], registry=r)
        self.store_retries_total = Counter("ldp_store_retries_total", "Store calls of the hot path that failed "
                                           "and were retried (Redis unreachable).", registry=r)
        # poisoning (estimators/poisoning.py, stream_app/defense.py)
        self.implausible_reports_total = Counter(
            "ldp_implausible_reports_total", "Counted unary reports whose number of set bits is outside its honest "
            "law (two-sided exact tails at 1e-6 of honest reports), for attributes without a defense: flagged, "
            "counted all the same.", ca, registry=r)
        self.rejected_reports_total = Counter(
            "ldp_rejected_reports_total", "Reports of valid batches the attribute's poisoning defense did not count, "
            "by reason (implausible: the per-report size check; itemset: the final detection over the step).",
            ca + ["reason"], registry=r)
        self.poisoning_score = Gauge(
            "ldp_poisoning_score", "z-score of the latest step's total support against its honest law (unary "
            "protocols; |z| > 4.89 is a false alarm once in 10^6 honest steps).", ca, registry=r)

        # numeric attributes (type = "numeric"): the latest step's mean and, for Square Wave, its quantiles
        self.estimated_mean = Gauge(
            "ldp_estimated_mean", "Estimated mean (unbiased, metric units) of a numeric attribute at the latest step.",
            ca, registry=r)
        self.estimated_mean_ci95 = Gauge(
            "ldp_estimated_mean_ci95_halfwidth", "Half-width of the 95% confidence interval of ldp_estimated_mean.",
            ca, registry=r)
        self.estimated_quantile = Gauge(
            "ldp_estimated_quantile", "Estimated quantile (metric units; p50, p90, p99) of a numeric attribute whose "
            "mechanism estimates a distribution (Square Wave), at the latest step; bound = value, lower or upper "
            "(the 95% bootstrap interval, on finals).", ca + ["percentile", "bound"], registry=r)
        self.top_frequency = Gauge(
            "ldp_estimated_top_frequency_ratio", "An open-domain attribute's top-K at the latest step: the estimated "
            "frequency of the item of each rank (1 = most frequent); item = its 16-hex-digit id, value = the "
            "candidate that names it (empty if none). The series of a rank is replaced when its item changes.",
            ca + ["rank", "item", "value"], registry=r)

    # ------------------------------------------------------------------ helpers
    def per_value(self, k: int) -> bool:
        """Whether the frequencies of an attribute of domain size ``k`` are exported value by value."""
        return self.per_value_metrics and k <= self.per_value_metrics_max_k

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
