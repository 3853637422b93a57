"""Adaptive protocol choice by smaller approximate variance.

ADP picks GRR or OUE (the ADP protocol of Multi-Freq-LDPy, Arcolezi et al., ESORICS 2022; Var*
of Wang et al., USENIX Security 2017); L-ADP picks L-GRR or L-OSUE (Arcolezi et al., DCN 2022,
Alg. 1, ALLOMFREE's per-attribute choice, with Var* from Eq. 11).
The choice depends only on public parameters, so both sides agree on it.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from .base import FrequencyProtocol
from .direct import GRR, LGRR
from .errors import LDPError
from .memo import MemoState
from .unary import LOSUE, OUE

_N_REF = 10_000  # Var* scales as 1/n: any n gives the same choice


class Adaptive(FrequencyProtocol):
    """Delegates every call to the candidate with the smaller Var*; ``chosen`` tells which."""

    def __init__(self, candidates: tuple[FrequencyProtocol, FrequencyProtocol]) -> None:
        a, b = candidates
        self.chosen: FrequencyProtocol = a if a.variance(_N_REF) <= b.variance(_N_REF) else b
        self.k = self.chosen.k

    def params(self) -> dict:
        inner = dict(self.chosen.params())
        inner["chosen"] = inner.pop("protocol")
        return {"protocol": self.name, **inner}

    def __repr__(self) -> str:
        return f"{self.name}(chosen={self.chosen!r})"

    # identity of the chosen protocol, but the fingerprint of the adaptive one
    eps_first = property(lambda self: self.chosen.eps_first)
    eps_inf = property(lambda self: self.chosen.eps_inf)
    memo_size = property(lambda self: self.chosen.memo_size)
    report_dtype = property(lambda self: self.chosen.report_dtype)
    report_shape = property(lambda self: self.chosen.report_shape)
    ps = property(lambda self: self.chosen.ps)  # type: ignore[attr-defined]
    qs = property(lambda self: self.chosen.qs)  # type: ignore[attr-defined]

    def longitudinal_loss(self, memoized):
        return self.chosen.longitudinal_loss(memoized)

    def _chosen_state(self, values, state: MemoState | None) -> MemoState | None:
        """``state`` (checked against this protocol) as a view for the chosen one (same arrays)."""
        if state is None:
            return None
        self._state_for(state, np.asarray(values).shape[0])
        return MemoState(self.chosen.fingerprint, state.keys, state.seen, state.memo_size)

    def randomize(self, values, rng=None, state=None):
        return self.chosen.randomize(values, rng, state=self._chosen_state(values, state))

    def support(self, reports):
        return self.chosen.support(reports)

    def estimate(self, counts, n, postprocess=None):
        return self.chosen.estimate(counts, n, postprocess=postprocess)

    def variance(self, n):
        return self.chosen.variance(n)

    def variance_exact(self, f, n):
        return self.chosen.variance_exact(f, n)

    def validate_reports(self, reports):
        self.chosen.validate_reports(reports)

    def audit_event(self, reports, v1, v2):
        return self.chosen.audit_event(reports, v1, v2)


class ADP(Adaptive):
    name: ClassVar[str] = "ADP"
    longitudinal: ClassVar[bool] = False

    def __init__(self, k: int, eps: float) -> None:
        super().__init__((GRR(k, eps), OUE(k, eps)))


class LADP(Adaptive):
    name: ClassVar[str] = "L-ADP"
    longitudinal: ClassVar[bool] = True

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration="exact") -> None:
        super().__init__((LGRR(k, eps_inf, eps_1, calibration), LOSUE(k, eps_inf, eps_1, calibration)))

    def memoized_outputs(self, values, state: MemoState):
        """The chosen protocol's PRR outputs (see :meth:`LGRR.memoized_outputs`)."""
        if state is None:
            raise LDPError(f"{self.name} memoizes: pass state=proto.new_state(n_devices)")
        return self.chosen.memoized_outputs(values, self._chosen_state(values, state))

    def memoized_audit_event(self, prr_reports, v1, v2):
        return self.chosen.memoized_audit_event(prr_reports, v1, v2)
