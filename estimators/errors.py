"""Exceptions raised by the protocol library."""


class LDPError(ValueError):
    """Base class of every error the protocol library raises on bad input."""


class InfeasibleParameters(LDPError):
    """The requested privacy parameters cannot be met by the protocol (e.g. ε1 ≥ ε∞)."""


class InvalidReports(LDPError):
    """Reports or a wire payload that do not belong to the protocol's output space."""


class TruncatedPayload(InvalidReports):
    """A wire payload whose length differs from what its header announces."""


class InvalidState(LDPError):
    """A memo state that does not match the protocol or the batch it is used with."""
