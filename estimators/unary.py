"""Unary encoding: SUE (basic one-time RAPPOR, Erlingsson, Pihur & Korolova, CCS 2014), OUE (Wang
et al., USENIX Security 2017), both as in Arcolezi et al., DCN 2022, §2.2.2, and the four memoized
chains L-OUE, L-SUE (basic RAPPOR), L-OSUE and L-SOUE (Arcolezi et al., DCN 2022, §4.3)."""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import kernels
from .base import SingleShot, SingleShotPure, check_domain
from .errors import InvalidReports
from .kernels import NO_KEYS, NO_SEEN, UE_NO_IRR
from .longitudinal import NO_NOISE_KEY, Rounds, TwoRoundProtocol, oue_irr, sue_irr, ue_chain_eps_first, ue_eps
from .memo import MemoState
from .randomness import noise_key, quantize32, threshold32


def sue_probabilities(eps: float) -> tuple[float, float]:
    """SUE: ``p = e^{ε/2} / (e^{ε/2} + 1)``, ``q = 1 - p`` (Arcolezi et al., DCN 2022, §2.2.2; Var*
    Eq. 5), on the 2^-32 grid."""
    h = np.exp(eps / 2)
    return quantize32(h / (h + 1)), quantize32(1 / (h + 1))


def oue_probabilities(eps: float) -> tuple[float, float]:
    """OUE: ``p = 1/2``, ``q = 1 / (e^ε + 1)`` (Arcolezi et al., DCN 2022, §2.2.2; Var* Eq. 6), on
    the 2^-32 grid."""
    return 0.5, quantize32(1 / (np.exp(eps) + 1))


def packed_bit(reports: np.ndarray, v: int) -> np.ndarray:
    """Bit ``v`` of every row of ``uint8 (n, ceil(k/8))`` packed little-endian bit vectors (0 or 1)."""
    return (np.asarray(reports)[:, v >> 3] >> np.uint8(v & 7)) & 1


def check_bit_padding(reports: np.ndarray, k: int, what: str = "report") -> None:
    """Raise :class:`InvalidReports` if a packed row sets one of the pad bits beyond ``k``."""
    pad = (-k) % 8
    if pad and reports.size and (reports[:, -1] >> np.uint8(8 - pad)).any():
        raise InvalidReports(f"{what} sets bits beyond the domain size {k}")


class UnaryReports:
    """Reports are k-bit vectors packed little-endian into ``uint8 (n, ceil(k/8))``."""

    k: int

    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    @property
    def report_shape(self) -> tuple[int, ...]:
        return ((self.k + 7) // 8,)

    def validate_reports(self, reports: np.ndarray) -> None:
        check_bit_padding(reports, self.k)

    def support(self, reports: np.ndarray) -> np.ndarray:
        r = np.asarray(reports)
        if r.dtype != np.uint8 or r.ndim != 2 or r.shape[1] != self.report_shape[0]:
            raise InvalidReports(f"{self.name} reports must be uint8 (n, {self.report_shape[0]}), "  # type: ignore[attr-defined]
                                 f"got {r.dtype} {r.shape}")
        self.validate_reports(r)
        return kernels.packed_bit_counts(np.ascontiguousarray(r), self.k)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        return (packed_bit(reports, v1) == 1) & (packed_bit(reports, v2) == 0)


class UnaryEncoding(UnaryReports, SingleShotPure):
    """Single-shot unary encoding with bit probabilities ``(p, q)``."""

    def __init__(self, k: int, eps: float) -> None:
        SingleShot.__init__(self, k, eps)
        self.p, self.q = self._probabilities(self.eps)

    @staticmethod
    def _probabilities(eps: float) -> tuple[float, float]:
        raise NotImplementedError

    @property
    def eps_first(self) -> float:
        """UE ratio ``ln(p(1-q) / ((1-p) q))``: the worst case for independent bits (Wang et al.,
        Sensors 2020, Eq. 24)."""
        return ue_eps(self.p, self.q)

    def randomize(self, values, rng=None, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        return kernels.ue_chain_randomize(v, NO_KEYS, False, NO_SEEN, noise_key(rng),
                                          threshold32(self.p), threshold32(self.q), *UE_NO_IRR, self.k)


class SUE(UnaryEncoding):
    name: ClassVar[str] = "SUE"
    _probabilities = staticmethod(sue_probabilities)


class OUE(UnaryEncoding):
    name: ClassVar[str] = "OUE"
    _probabilities = staticmethod(oue_probabilities)


class LongitudinalUE(UnaryReports, TwoRoundProtocol):
    """A memoized UE chain; ``prr`` and ``irr`` name the round shapes ("OUE" or "SUE")."""

    prr: ClassVar[str]
    irr: ClassVar[str]

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration="exact") -> None:
        TwoRoundProtocol.__init__(self, check_domain(k), eps_inf, eps_1, calibration)

    def _solve_rounds(self) -> Rounds:
        first = {"OUE": oue_probabilities, "SUE": sue_probabilities}[self.prr]
        p1, q1 = first(self.requested_eps_inf)
        second = {"OUE": oue_irr, "SUE": sue_irr}[self.irr]
        p2, q2 = second(p1, q1, self.requested_eps_1, self.requested_eps_inf, self.name)
        return Rounds(p1, q1, quantize32(p2), quantize32(q2))

    @property
    def eps_inf(self) -> float:
        return ue_eps(self.p1, self.q1)

    @property
    def eps_first(self) -> float:
        return ue_chain_eps_first(self.rounds)

    def _chain(self, v: np.ndarray, keys: np.ndarray, seen: np.ndarray, nkey: np.ndarray | None,
               irr: bool) -> np.ndarray:
        """The memoized UE chain for values ``v``: the PRR of ``(key, v)`` (marking ``v`` in
        ``seen``), then with ``irr`` the IRR from the batch noise key ``nkey``; without it the PRR
        output alone (:data:`~estimators.kernels.UE_NO_IRR` disables the second round, as for
        single-shot UE). The one call of the UE-chain kernel for memoized reports."""
        second = (threshold32(self.p2), threshold32(self.q2)) if irr else UE_NO_IRR
        return kernels.ue_chain_randomize(v, keys, True, seen, NO_NOISE_KEY if nkey is None else nkey,
                                          threshold32(self.p1), threshold32(self.q1), *second, self.k)

    def randomize(self, values, rng=None, state: MemoState | None = None):
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._chain(v, st.keys, st.seen, noise_key(rng), irr=True)

    def memoized_outputs(self, values: np.ndarray, state: MemoState) -> np.ndarray:
        """The devices' PRR bit vectors for ``values`` (memoized per ``(key, value)``), packed
        like reports, without the IRR round and without marking anything memoized."""
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._chain(v, st.keys, st.seen.copy(), None, irr=False)


class LOUE(LongitudinalUE):
    """OUE then OUE (L-OUE)."""
    name: ClassVar[str] = "L-OUE"
    prr, irr = "OUE", "OUE"


class LSUE(LongitudinalUE):
    """SUE then SUE: basic RAPPOR (L-SUE)."""
    name: ClassVar[str] = "L-SUE"
    prr, irr = "SUE", "SUE"


class LOSUE(LongitudinalUE):
    """OUE then SUE (L-OSUE, the optimized chain of Arcolezi et al., DCN 2022, §4.3)."""
    name: ClassVar[str] = "L-OSUE"
    prr, irr = "OUE", "SUE"


class LSOUE(LongitudinalUE):
    """SUE then OUE (L-SOUE)."""
    name: ClassVar[str] = "L-SOUE"
    prr, irr = "SUE", "OUE"
