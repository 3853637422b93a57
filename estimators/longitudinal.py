"""The two-round memoization framework (RAPPOR's PRR then IRR, Erlingsson, Pihur & Korolova,
CCS 2014; Arcolezi et al., DCN 2022, §4; Arcolezi et al., EDBT 2023, §2.4).

Every longitudinal protocol of the project is this one mechanism with different
``(p1, q1, p2, q2)`` and a different encoding of the memoized input:

* PRR (permanent randomized response): the device's input ``x`` (its value, its hash value or
  its bucket) is randomized once with ``(p1, q1)`` and the result memoized forever; ε∞ is the
  ε of this round alone.
* IRR (instantaneous randomized response): every report re-randomizes the memoized output
  with ``(p2, q2)``; ε1 is the ε of one report through both rounds.

The server sees ``ps = p1 p2 + (1 - p1) q2`` and ``qs = q1 p2 + (1 - q1) q2`` (the estimator of
Arcolezi et al., DCN 2022, Eq. 9; ``p_s``/``q_s`` of EDBT 2023, §2.4.2) and estimates with
:class:`~estimators.base.PureProtocol`.

Calibration of ``p2`` from ``(ε∞, ε1)``:

* ``"exact"`` (default) solves for the ``p2`` whose *true* worst-case single-report likelihood
  ratio is ``e^ε1``. For a GRR chain over ``m`` values that ratio is ``ps / qs``.
* ``"paper"`` reproduces the papers: Arcolezi et al., DCN 2022, Eqs. 12-13 (L-GRR) and
  Arcolezi et al., EDBT 2023, Thm. 3.4 (LOLOHA) set ``(p1 p2 + q1 q2) / (p1 q2 + q1 p2) = e^ε1``,
  which is the true ratio only for ``m = 2``. For UE chains DCN 2022's Eq. 14 is already exact,
  so both calibrations coincide.

Whatever the calibration, ``eps_first`` and ``eps_inf`` are recomputed from the parameters in use.
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Literal

import numpy as np

from .base import PureProtocol, check_eps
from .errors import InfeasibleParameters, LDPError
from .randomness import KEY_WORDS

Calibration = Literal["exact", "paper"]
CALIBRATIONS = ("exact", "paper")

#: batch seed passed to a chain kernel when only the PRR is computed (``memoized_outputs``): the
#: batch seed only drives the IRR round, which those calls disable, so its value is never used
NO_NOISE_KEY = np.zeros(KEY_WORDS, dtype=np.uint32)  # noise key of calls that draw no fresh noise


@dataclass(frozen=True)
class Rounds:
    """Probabilities of the two rounds; ``q1s`` is the support-side ``q1`` (1/g for hashing)."""

    p1: float
    q1: float
    p2: float
    q2: float
    q1s: float | None = None

    @property
    def ps(self) -> float:
        return self.p1 * self.p2 + (1.0 - self.p1) * self.q2

    @property
    def qs(self) -> float:
        q1 = self.q1 if self.q1s is None else self.q1s
        return q1 * self.p2 + (1.0 - q1) * self.q2


# ---------------------------------------------------------------- ε of a round or a chain
def grr_eps(p: float, q: float) -> float:
    """ε of GRR with ``P(keep) = p`` and ``P(each other) = q``: ln(p/q)."""
    return float(np.log(p / q))


def ue_eps(p: float, q: float) -> float:
    """ε of UE with bit probabilities ``p`` (hot) and ``q`` (cold): ln(p(1-q) / ((1-p)q))
    (Arcolezi et al., DCN 2022, Eq. 4)."""
    return float(np.log(p * (1.0 - q) / ((1.0 - p) * q)))


def grr_chain_eps_first(r: Rounds) -> float:
    """True ε1 of a GRR chain (over any number ``m`` of values): the worst ratio ``ps / qs``.

    ``qs = q1 p2 + (1 - q1) q2`` is the probability of reporting ``y`` when ``y`` is not the
    input (the PRR's ``q1``, also when the server's ``q1s`` differs); for ``m = 2`` the ratio
    equals Arcolezi et al., DCN 2022, Eq. 12.
    """
    ps = r.p1 * r.p2 + (1 - r.p1) * r.q2
    qs = r.q1 * r.p2 + (1 - r.q1) * r.q2
    return grr_eps(ps, qs)


def grr_chain_eps_paper(r: Rounds) -> float:
    """Arcolezi et al., DCN 2022, Eq. 12 / EDBT 2023, Thm. 3.4: ln((p1 p2 + q1 q2) / (p1 q2 + q1 p2))."""
    return float(np.log((r.p1 * r.p2 + r.q1 * r.q2) / (r.p1 * r.q2 + r.q1 * r.p2)))


def ue_chain_eps_first(r: Rounds) -> float:
    """True ε1 of a UE chain: Arcolezi et al., DCN 2022, Eq. 14 (Eq. 4 with ``ps``, ``qs`` of the
    two rounds)."""
    return ue_eps(r.ps, r.qs)


# ---------------------------------------------------------------- solvers
def _solve(name: str, eps_of: Callable[[float], float], lo: float, hi: float, eps1: float, eps_inf: float) -> float:
    """Root of ``eps_of(θ) = eps1`` for θ in (lo, hi), ``eps_of`` increasing from 0."""
    if eps1 >= eps_inf:
        raise InfeasibleParameters(f"{name}: ε1 = {eps1:g} must be smaller than ε∞ = {eps_inf:g}")
    top = eps_of(hi)
    if not eps1 < top:
        raise InfeasibleParameters(
            f"{name} cannot reach ε1 = {eps1:g} with ε∞ = {eps_inf:g}: its IRR round caps a "
            f"single report at ε1 < {top:.6g} ({top / eps_inf:.3f} ε∞)")
    # Bisection to adjacent floats (at most ~1,100 halvings; about 60 from a unit interval), not scipy's brentq:
    # every worker, device and CLI process solves its campaign's rounds at start, and importing scipy.optimize
    # costs it more CPU than the rest of its start. tests/test_framework.py checks the root against brentq.
    f_lo = eps_of(lo) - eps1
    while True:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            return hi if abs(eps_of(hi) - eps1) < abs(f_lo) else lo
        f_mid = eps_of(mid) - eps1
        if f_mid == 0.0:
            return mid
        if (f_mid < 0.0) == (f_lo < 0.0):
            lo, f_lo = mid, f_mid
        else:
            hi = mid


def grr_chain_p2(p1: float, q1: float, m: int, eps1: float, eps_inf: float,
                 calibration: Calibration, name: str) -> float:
    """``p2`` of a GRR IRR round over ``m`` values (``q2 = (1 - p2)/(m - 1)``).

    ``"paper"`` uses the closed form of Arcolezi et al., DCN 2022, Eq. 13 (equivalently the
    ε_IRR of Arcolezi et al., EDBT 2023, Alg. 1 line 3);
    ``"exact"`` solves ``ps / qs = e^ε1`` (affine in ``p2``, so in closed form too).
    """
    if eps1 >= eps_inf:
        raise InfeasibleParameters(f"{name}: ε1 = {eps1:g} must be smaller than ε∞ = {eps_inf:g}")
    e = np.exp(eps1)
    a = 1.0 / (m - 1)
    if calibration == "paper":
        # (p1 p2 + q1 q2) = e (p1 q2 + q1 p2), q2 = a (1 - p2)
        num = e * p1 * a - q1 * a
        den = p1 - q1 * a - e * q1 + e * p1 * a
    elif calibration == "exact":
        # p1 p2 + (1 - p1) q2 = e (q1 p2 + (1 - q1) q2)
        num = e * (1 - q1) * a - (1 - p1) * a
        den = p1 - (1 - p1) * a - e * q1 + e * (1 - q1) * a
    else:
        raise LDPError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    p2 = float(num / den)
    if not (1.0 / m < p2 <= 1.0):
        raise InfeasibleParameters(f"{name}: no IRR probability gives ε1 = {eps1:g} with ε∞ = {eps_inf:g}, m = {m}")
    return p2


def sue_irr(p1: float, q1: float, eps1: float, eps_inf: float, name: str) -> tuple[float, float]:
    """Symmetric IRR (``q2 = 1 - p2``) meeting ε1 through Arcolezi et al., DCN 2022, Eq. 14 (its
    Eq. 15 is the closed form for L-OSUE)."""
    p2 = _solve(name, lambda p: ue_chain_eps_first(Rounds(p1, q1, p, 1 - p)), 0.5, 1.0 - 1e-15, eps1, eps_inf)
    return p2, 1.0 - p2


def oue_irr(p1: float, q1: float, eps1: float, eps_inf: float, name: str) -> tuple[float, float]:
    """OUE-shaped IRR (``p2 = 1/2``) meeting ε1 through Arcolezi et al., DCN 2022, Eq. 14;
    infeasible above a cap (≈0.6-0.9 ε∞; DCN 2022, §4.4)."""
    q2 = _solve(name, lambda t: ue_chain_eps_first(Rounds(p1, q1, 0.5, 0.5 - t)), 0.0, 0.5 - 1e-15, eps1, eps_inf)
    return 0.5, 0.5 - q2


# ---------------------------------------------------------------- the framework
class TwoRoundProtocol(PureProtocol):
    """Base of every memoizing protocol: PRR memoized per device, IRR per report."""

    longitudinal: ClassVar[bool] = True

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration: Calibration = "exact") -> None:
        if calibration not in CALIBRATIONS:
            raise LDPError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        self.k = k
        self.requested_eps_inf = check_eps("eps_inf", eps_inf)
        self.requested_eps_1 = check_eps("eps_1", eps_1)
        self.calibration: Calibration = calibration
        self.rounds = self._solve_rounds()

    @abstractmethod
    def _solve_rounds(self) -> Rounds:
        """``(p1, q1, p2, q2)`` from the requested ``(ε∞, ε1)`` and the calibration."""

    def params(self) -> dict:
        return {"protocol": self.name, "k": self.k, "eps_inf": self.requested_eps_inf,
                "eps_1": self.requested_eps_1, "calibration": self.calibration}

    @property
    def ps(self) -> float:
        return self.rounds.ps

    @property
    def qs(self) -> float:
        return self.rounds.qs

    @property
    def p1(self) -> float:
        return self.rounds.p1

    @property
    def q1(self) -> float:
        return self.rounds.q1

    @property
    def p2(self) -> float:
        return self.rounds.p2

    @property
    def q2(self) -> float:
        return self.rounds.q2

    @property
    def memo_size(self) -> int:
        return self.k

    def longitudinal_loss(self, memoized: np.ndarray | int) -> np.ndarray | float:
        """ε on a device's values after memoizing ``memoized`` distinct inputs (the per-device
        ε̌∞ averaged in Arcolezi et al., EDBT 2023, Eq. 8).

        Each memoized input leaks one ε∞ (sequential composition, EDBT 2023, Prop. 2.3), at most
        ``memo_size`` of them (Def. 3.2).
        """
        m = np.minimum(np.asarray(memoized), self.memo_size)
        return m * self.eps_inf
