"""The exceptions of the light device SDK (the names of the reference's: ``estimators.errors``, ``producers.sdk``)."""
from __future__ import annotations

__all__ = ["LDPError", "InfeasibleParameters", "InvalidState", "CampaignError", "BudgetExceeded", "DeviceStateError",
           "IngestError", "MemoTableFull"]


class LDPError(ValueError):
    """Base class of every error the SDK raises on bad parameters, values or state."""


class InfeasibleParameters(LDPError):
    """Parameters that no protocol configuration can meet (e.g. an ε1 its IRR round cannot reach)."""


class InvalidState(LDPError):
    """A memo or group state that does not fit the protocol or cannot be read."""


class CampaignError(LDPError):
    """A campaign file that cannot be used."""


class BudgetExceeded(LDPError):
    """The report would push the device's reserved privacy loss over its budget.

    Raised only on data-independent grounds: nothing was memoized, saved or sent. ``spent`` is the reserved
    loss before the report, ``cost`` what it needed."""

    def __init__(self, attribute: str, spent: float, cost: float, budget: float, detail: str | None = None) -> None:
        msg = (f"privacy budget exceeded: reporting {attribute!r} would raise the device's reserved "
               f"longitudinal loss from {spent:.4g} to {spent + cost:.4g} > budget {budget:.4g}; "
               "nothing was memoized or sent")
        super().__init__(msg if detail is None else f"{msg} ({detail})")
        self.attribute, self.spent, self.cost, self.budget = attribute, spent, cost, budget


class DeviceStateError(LDPError):
    """A state directory (or one attribute's state in it) that does not belong to this campaign, is missing or
    cannot be read: the device refuses to report what it cannot account for."""


class MemoTableFull(LDPError):
    """A memoizing attribute met a new value while its memo table is full (TreeHist: ``memo_slots / 64`` tags): the
    loss of a new memoized value could not be accounted, so the value is refused; nothing was memoized or sent."""

    def __init__(self, attribute: str, capacity: int) -> None:
        super().__init__(f"the memo table of {attribute!r} is full: it holds {capacity} distinct memoized values "
                         "and a new one could not be accounted for, so it is refused (nothing was memoized or "
                         "sent; values already memoized still report; a campaign with a larger memo_slots, or "
                         "Device.reset with accept_privacy_loss=True, makes room)")
        self.attribute, self.capacity = attribute, capacity


class IngestError(LDPError):
    """The ingest endpoint did not accept a report (``status`` is None if it was unreachable)."""

    def __init__(self, message: str, status: int | None = None, body: str = "") -> None:
        super().__init__(message)
        self.status, self.body = status, body
