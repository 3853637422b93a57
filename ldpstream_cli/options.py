"""Building a protocol from command-line options (only the parameters it accepts)."""
from __future__ import annotations

from typing import Any

import estimators
from estimators.registry import parameters


def build(name: str, **options: Any) -> estimators.FrequencyProtocol:
    """``estimators.make(name, ...)`` with the options the protocol takes; ``None`` means default.

    dBitFlipPM gets ``b = k`` buckets unless ``b`` is given (Arcolezi et al., EDBT 2023, §5.2, use
    ``b = k`` for Syn) and ``d = 1`` sampled bucket (its most private setting), and its ε is the ε∞ of the
    longitudinal options.
    """
    takes = parameters(name)
    opts = {k: v for k, v in options.items() if v is not None}
    if "b" in takes and "b" not in opts and "k" in opts:
        opts["b"] = opts["k"]
    if "d" in takes and "d" not in opts:
        opts["d"] = 1
    return estimators.make(name, **{k: v for k, v in opts.items() if k in takes})
