"""The live poisoning defense of an attribute (the campaign's ``defense``; :mod:`wire.campaign`).

What the worker counts of a batch (:meth:`AttributeDefense.screen`) and how a step is estimated from what was
counted (:meth:`AttributeDefense.estimate`), with the defenses of :mod:`estimators.poisoning` (Cao, Jia & Gong,
USENIX Security 2021, threat model):

* ``"none"``: every valid report is counted; the estimate is the protocol's.
* ``"plausibility"`` (unary): a report whose number of set bits lies outside the exact ``α`` tails of the honest
  law is not counted (reason ``implausible``); the step is estimated with the law of the kept reports
  (:class:`~estimators.poisoning.PlausibilityCheck`: ``ps'``, ``qs'``), exactly unbiased for honest data.
* ``"itemset"``: the same per report (unary), and the counted reports are kept in the step's report log; the
  *final* estimate runs :func:`~estimators.poisoning.defend` over the log: the co-support itemset (unary) or the
  seed-collision itemset (local hashing) and its compensated estimator; the reports it drops are the step's
  rejected reports of reason ``itemset``. Provisional estimates (before the step is final) use the counts.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from estimators import poisoning
from estimators import postprocess
from wire.campaign import Attribute, Campaign

__all__ = ["AttributeDefense", "Screened", "StepEstimate", "defenses_of"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Screened:
    """What the worker counts of one batch."""

    reports: np.ndarray  # the reports counted
    rejected: int  # the batch's reports not counted (reason ``implausible``)
    log: bytes  # the counted reports, packed, for the step's report log (b"" unless ``itemset``)


@dataclass(frozen=True)
class StepEstimate:
    """A step's estimate under the defense."""

    n: int  # reports the estimate is over
    rejected: int  # reports of the step not in it (every reason)
    frequencies: np.ndarray
    frequencies_norm_sub: np.ndarray
    variance: float
    itemset: tuple[int, ...] = ()  # the itemset the final detection dropped (``itemset`` only)


class AttributeDefense:
    """The defense of one attribute (module doc)."""

    def __init__(self, attribute: Attribute, alpha: float = poisoning.DEFAULT_ALPHA) -> None:
        self.attribute, self.name, self.alpha = attribute, attribute.defense, alpha
        self.proto = attribute.protocol
        self.family = poisoning.family(self.proto)
        self.check = (poisoning.plausibility_check(self.proto, alpha)
                      if self.name != "none" and self.family == "unary" else None)
        self.keeps_log = self.name == "itemset"
        self._row: tuple[np.dtype, tuple[int, ...]] | None = None

    # ------------------------------------------------------------------ the worker, per batch
    def screen(self, reports: np.ndarray) -> Screened:
        """The reports of a batch the worker counts, how many it rejects, and what goes to the report log."""
        kept = reports
        if self.check is not None:
            bad = poisoning.implausible(self.proto, reports, self.alpha)
            if bad.any():
                kept = reports[~bad]
        log = np.ascontiguousarray(kept).tobytes() if self.keeps_log else b""
        return Screened(kept, len(reports) - len(kept), log)

    # ------------------------------------------------------------------ the estimator, per step
    def estimate(self, counts: np.ndarray, n: int, rejected: int = 0, log: bytes | None = None) -> StepEstimate:
        """The estimate of a step with support ``counts`` over ``n`` counted reports (``rejected`` not counted);
        with ``log`` (the step's report log, ``itemset`` only) the final detection runs over it."""
        if log is not None and self.keeps_log:
            rows = self.rows(log) if len(log) % self.row_size == 0 else None
            if rows is not None and len(rows) == n:
                return self._final(rows, n, rejected)
            logger.warning("%s: the step's report log holds %s bytes, not the %d counted reports (the defense was "
                         "turned on during the step?): its final estimate is the per-report defense's only",
                         self.attribute.name, len(log), n)
        if self.check is None:
            p = self.proto
            return StepEstimate(n, rejected, p.estimate(counts, n), p.estimate(counts, n, postprocess="norm-sub"),
                                float(p.variance(n)))
        chk = self.check
        f = chk.estimate(counts, n)
        return StepEstimate(n, rejected, f, postprocess.apply("norm-sub", f),
                            _pure_variance(chk.kept_ps, chk.kept_qs, n))

    def _final(self, reports: np.ndarray, n: int, rejected: int) -> StepEstimate:
        out = poisoning.defend(self.proto, reports, self.alpha)
        n_kept = int(out.kept.sum())
        dropped = n - n_kept
        if self.check is not None:
            variance = _pure_variance(self.check.kept_ps, self.check.kept_qs, n_kept)
        else:
            variance = float(self.proto.variance(n_kept))
        return StepEstimate(n_kept, rejected + dropped, out.estimate, postprocess.apply("norm-sub", out.estimate),
                            variance, out.itemset)

    @property
    def row_size(self) -> int:
        """Bytes of one report in a report log."""
        dtype, shape = self._row_type()
        return dtype.itemsize * int(np.prod(shape, dtype=np.int64))

    def rows(self, log: bytes) -> np.ndarray:
        """The reports of a report log (the protocol's decoded report rows)."""
        if len(log) % self.row_size:
            raise ValueError(f"a report log of {len(log)} bytes is not a whole number of {self.row_size}-byte reports")
        dtype, shape = self._row_type()
        return np.frombuffer(log, dtype=dtype).reshape(-1, *shape)

    def _row_type(self) -> tuple[np.dtype, tuple[int, ...]]:
        if self._row is None:
            sample = self.proto.randomize(np.zeros(1, dtype=np.int64), None, state=self.proto.new_state(1))
            self._row = (sample.dtype, tuple(sample.shape[1:]))
        return self._row


def defenses_of(campaigns: Mapping[str, Campaign]) -> dict[tuple[str, str], AttributeDefense]:
    """``(campaign id, attribute) -> AttributeDefense`` of every attribute whose ``defense`` is not ``"none"``."""
    return {(c.id, a.name): AttributeDefense(a) for c in campaigns.values() for a in c.attributes.values()
            if a.defense != "none"}


def _pure_variance(ps: float, qs: float, n: int) -> float:
    """Var* = qs (1 - qs) / (n (ps - qs)^2) of a pure protocol with law ``(ps, qs)`` over ``n`` reports (Arcolezi et
    al., DCN 2022, Eqs. 2 and 11; :meth:`estimators.base.PureProtocol.variance` for a protocol's own law)."""
    return qs * (1.0 - qs) / (n * (ps - qs) ** 2) if n > 0 and not math.isclose(ps, qs) else math.inf
