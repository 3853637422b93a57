"""Direct encoding: GRR (Kairouz, Bonawitz & Ramage, ICML 2016; Arcolezi et al., DCN 2022, §2.2.1)
and its memoized chain L-GRR (Arcolezi et al., DCN 2022, §4.2)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import kernels
from .base import SingleShot, SingleShotPure, check_domain, uint_dtype
from .errors import InvalidReports
from .kernels import NO_KEYS, NO_SEEN
from .longitudinal import NO_NOISE_KEY, Rounds, TwoRoundProtocol, grr_chain_eps_first, grr_chain_p2, grr_eps
from .memo import MemoState
from .randomness import noise_key


def grr_probabilities(eps: float, m: int) -> tuple[float, float]:
    """GRR over ``m`` values: ``p = e^ε / (e^ε + m - 1)``, ``q = 1 / (e^ε + m - 1)`` (Arcolezi
    et al., DCN 2022, §2.2.1)."""
    d = np.exp(eps) + m - 1
    return float(np.exp(eps) / d), float(1.0 / d)


class _DirectReports:
    """Reports are the randomized values themselves: support is a histogram."""

    k: int

    @property
    def report_dtype(self) -> np.dtype:
        return uint_dtype(self.k)

    def validate_reports(self, reports: np.ndarray) -> None:
        if reports.size and int(reports.max()) >= self.k:
            raise InvalidReports(f"report value {int(reports.max())} is outside [0, {self.k})")

    def support(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"{self.name} reports must be 1-d, got shape {r.shape}")  # type: ignore[attr-defined]
        if r.size and (int(r.min()) < 0 or int(r.max()) >= self.k):
            raise InvalidReports(f"report values must lie in [0, {self.k})")
        return kernels.bincount(r, self.k)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        return np.asarray(reports) == v1


class GRR(_DirectReports, SingleShotPure):
    """Generalized randomized response (k-RR): keep the value w.p. p, else a uniform other."""

    name: ClassVar[str] = "GRR"

    def __init__(self, k: int, eps: float) -> None:
        SingleShot.__init__(self, k, eps)
        self.p, self.q = grr_probabilities(self.eps, self.k)

    @property
    def eps_first(self) -> float:
        return grr_eps(self.p, self.q)

    def randomize(self, values, rng=None, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        out = kernels.grr_chain_randomize(v, NO_KEYS, False, NO_SEEN, noise_key(rng), self.p, 1.0, self.k)
        return out.astype(self.report_dtype)


class GRRChain(TwoRoundProtocol):
    """Two GRR rounds over ``chain_size`` values: GRR(ε∞) memoized, then GRR per report.

    L-GRR chains over the values themselves (``chain_size = k``, Arcolezi et al., DCN 2022,
    §4.2); LOLOHA over the device's hashed values (``chain_size = g``, Arcolezi et al., EDBT 2023,
    Alg. 1), where the server's ``q1'`` is the collision probability ``1/g`` (EDBT 2023, Alg. 2).
    """

    @property
    def chain_size(self) -> int:
        return self.k

    def _support_q1(self) -> float | None:
        """The server-side ``q1`` when it differs from the PRR's (``None``: the same)."""
        return None

    def _solve_rounds(self) -> Rounds:
        m = self.chain_size
        p1, q1 = grr_probabilities(self.requested_eps_inf, m)
        p2 = grr_chain_p2(p1, q1, m, self.requested_eps_1, self.requested_eps_inf, self.calibration, self.name)
        return Rounds(p1, q1, p2, (1 - p2) / (m - 1), q1s=self._support_q1())

    @property
    def eps_inf(self) -> float:
        """ln(p1 / q1) of the memoized PRR (Arcolezi et al., DCN 2022, §4.2; EDBT 2023, Thm. 3.3)."""
        return grr_eps(self.p1, self.q1)

    @property
    def eps_first(self) -> float:
        """True ε of one report, ``ln(ps / (q1 p2 + (1 - q1) q2))``; Arcolezi et al., DCN 2022, Eq. 12
        and EDBT 2023, Thm. 3.4 are its ``chain_size = 2`` case."""
        return grr_chain_eps_first(self.rounds)

    def _chain(self, x: np.ndarray, keys: np.ndarray, seen: np.ndarray, nkey: np.ndarray | None,
               irr: bool) -> np.ndarray:
        """The memoized chain over ``[0, chain_size)`` for inputs ``x``: the PRR of ``(key, x)``
        (marking ``x`` in ``seen``), then with ``irr`` the IRR from the batch noise key ``nkey``;
        without it the PRR output alone (``p2 = 1`` disables the second round; ``nkey`` is unused).

        The one call of the GRR-chain kernel for memoized reports (L-GRR and LOLOHA).
        """
        nkey = NO_NOISE_KEY if nkey is None else nkey
        return kernels.grr_chain_randomize(x, keys, True, seen, nkey, self.p1, self.p2 if irr else 1.0,
                                           self.chain_size)


class LGRR(_DirectReports, GRRChain):
    """Longitudinal GRR: GRR(ε∞) memoized, then GRR re-randomization per report (Arcolezi et al.,
    DCN 2022, §4.2)."""

    name: ClassVar[str] = "L-GRR"

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration="exact") -> None:
        TwoRoundProtocol.__init__(self, check_domain(k), eps_inf, eps_1, calibration)

    def randomize(self, values, rng=None, state: MemoState | None = None):
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._chain(v, st.keys, st.seen, noise_key(rng), irr=True).astype(self.report_dtype)

    def memoized_outputs(self, values: np.ndarray, state: MemoState) -> np.ndarray:
        """The devices' PRR outputs for ``values`` (GRR(ε∞) of the value, memoized per
        ``(key, value)``), without the IRR round and without marking anything memoized."""
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._chain(v, st.keys, st.seen.copy(), None, irr=False).astype(self.report_dtype)
