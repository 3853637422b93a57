"""Building a protocol from command-line options (only the parameters it accepts)."""
from __future__ import annotations

import math
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


def check_options(**values: float | None) -> None:
    """Raise ``ValueError`` for the first option out of range (``None``: not given), named as its flag.

    By name: ``eps*`` and ``*_seconds`` positive and finite, ``k`` and ``ks`` (a domain size) at least 2, anything else (a
    count) at least 1; ``eps_1`` below ``eps_inf`` when both are given (a longitudinal budget)."""
    for name, value in values.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if name.startswith("eps") or name.endswith("_seconds"):
            ok, rule = math.isfinite(value) and value > 0, "a positive number"
        elif name in ("k", "ks"):
            ok, rule = value >= 2, "at least 2"
        else:
            ok, rule = value >= 1, "at least 1"
        if not ok:
            raise ValueError(f"{flag} must be {rule}, got {value:g}")
    eps_1, eps_inf = values.get("eps_1"), values.get("eps_inf")
    if eps_1 is not None and eps_inf is not None and not eps_1 < eps_inf:
        raise ValueError(f"--eps-1 must be smaller than --eps-inf (ε1 = {eps_1:g}, ε∞ = {eps_inf:g})")
