"""Compile, before the first batch, every numba kernel a worker runs on a protocol's reports.

One function for the worker's start (:meth:`stream_app.pipeline.Pipeline.warm_up`) and the test suite's
kernel warm-up (``ldpstream_dev.kernels_warmup``), so both compile the same signatures: the support of freshly
randomized reports and of their decoded, read-only form (what a consumer hands the worker), the poisoning
checks of unary reports, and the estimate.
"""
from __future__ import annotations

import numpy as np

from .base import FrequencyProtocol
from .poisoning import count_implausible, family, implausible

__all__ = ["warm_up_protocol"]


def warm_up_protocol(proto: FrequencyProtocol, reports: np.ndarray, *, defended: bool = False) -> None:
    """Run the worker's kernels once on ``reports`` (a few of ``proto``'s reports) and on their decoded form;
    ``defended``: also the per-report check of an attribute with a poisoning defense."""
    decoded = proto.decode(proto.encode(reports))
    for batch in (reports, decoded):
        count_implausible(proto, batch)
        if defended and family(proto) == "unary":
            implausible(proto, batch)
        support = proto.support(batch)
    n = max(len(reports), 1)
    if getattr(proto, "open_domain", False):  # a sketch or heavy hitter: candidates' estimates and the top-K
        proto.top_k(support, n, 1, candidates=np.zeros(1, dtype=np.uint64))  # type: ignore[attr-defined]
        return
    estimate = getattr(proto, "estimate_mean", proto.estimate)  # a numeric attribute's protocol estimates a mean
    estimate(support, n)  # type: ignore[possibly-undefined]
