"""Why a batch or a single report is rejected: one exception type per rejection reason.

Every class carries its ``reason`` (the label of the rejection record on ``ldp.rejected`` and of
the ``ldp_rejected_batches_total{reason}`` metric), so a caller maps exception *types*, never
exception text. Raise the subclass where the fault is found::

    raise WrongFingerprint(f"batch parameters {fp} differ from the campaign's")
"""
from __future__ import annotations

from typing import Any, ClassVar

from estimators.errors import LDPError

__all__ = ["EnvelopeError", "MalformedBatch", "BadVersion", "UnknownCampaign", "UnknownAttribute", "WrongProtocol",
           "WrongFingerprint", "TruncatedBatch", "OversizedBatch", "BadPayload", "BadJson", "ExpiredStep",
           "FutureStep", "REASONS"]


class EnvelopeError(LDPError):
    """A batch or report that must not be counted; ``reason`` is one of :data:`REASONS`.

    A subclass names its reason in its class statement: ``class X(EnvelopeError, reason="x")``.
    """

    reason: ClassVar[str] = "malformed"

    def __init_subclass__(cls, reason: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if reason is not None:
            cls.reason = reason

    def __init__(self, detail: str) -> None:
        super().__init__(f"{self.reason}: {detail}")
        self.detail = detail


class MalformedBatch(EnvelopeError, reason="malformed"):
    """Not an envelope: bad magic, unknown kind, inconsistent lengths, a field that is not utf-8."""


class BadVersion(EnvelopeError, reason="bad_version"):
    """An envelope of another format version."""


class UnknownCampaign(EnvelopeError, reason="unknown_campaign"):
    """A campaign id that is not declared."""


class UnknownAttribute(EnvelopeError, reason="unknown_attribute"):
    """An attribute the campaign does not declare."""


class WrongProtocol(EnvelopeError, reason="wrong_protocol"):
    """A protocol name other than the attribute's."""


class WrongFingerprint(EnvelopeError, reason="wrong_fingerprint"):
    """Protocol parameters other than the attribute's (the fingerprints differ)."""


class TruncatedBatch(EnvelopeError, reason="truncated"):
    """The bytes end before what the header or the payload header announces."""


class OversizedBatch(EnvelopeError, reason="oversized"):
    """More reports than the campaign's ``max_batch_reports``."""


class BadPayload(EnvelopeError, reason="bad_payload"):
    """A payload that does not decode to the announced reports of the protocol's output space."""


class MissingBatchId(EnvelopeError, reason="missing_batch_id"):
    """A REPORTS batch without a batch id: it could not be deduplicated, so it is never counted."""


class ExpiredStep(EnvelopeError, reason="expired"):
    """A batch or watermark for a step below its attribute's retention floor (already pruned): counting it
    into a fresh hash could count a re-sent batch twice, since the step's batch ids are gone."""


class FutureStep(EnvelopeError, reason="future_step"):
    """A batch or watermark for a step further ahead than the campaign's ``max_steps_ahead`` (past its newest final
    step, or past the wall-clock step for the HTTP ingest's steps): it could open a step that never closes or
    move the retention floor past real steps."""


class BadJson(EnvelopeError, reason="bad_json"):
    """A single-report request that is not the expected JSON object."""


REASONS: tuple[str, ...] = tuple(cls.reason for cls in (
    MalformedBatch, BadVersion, UnknownCampaign, UnknownAttribute, WrongProtocol, WrongFingerprint,
    TruncatedBatch, OversizedBatch, BadPayload, MissingBatchId, ExpiredStep, FutureStep, BadJson))
