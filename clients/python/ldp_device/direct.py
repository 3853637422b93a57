"""Direct encoding: GRR and its memoized chain L-GRR (``estimators/direct.py``; the draws of
``kernels.grr_chain_randomize``), and the two-round framework they share with the other chains."""
from __future__ import annotations

from typing import Any, ClassVar

from .base import MemoState, Protocol, SingleShot, pure_variance, uint_size
from .calibration import (CALIBRATIONS, Rounds, check_domain, check_eps, grr_chain_eps_first, grr_chain_p2, grr_eps,
                          grr_probabilities)
from .errors import LDPError
from .streams import NOISE, PRR, TWO_M53, KeySource, keystream, other_than

__all__ = ["GRR", "LGRR", "TwoRoundProtocol", "grr_chain", "int_bytes"]


def int_bytes(v: int, size: int) -> bytes:
    return v.to_bytes(size, "little")


def _unit_at(buf: bytes, j: int) -> float:
    return (int.from_bytes(buf[8 * j:8 * j + 8], "little") >> 11) * TWO_M53


def grr_chain(x: int, m: int, p1: float, p2: float, nkey: bytes, memo: MemoState | None) -> int:
    """Two GRR rounds over ``[0, m)`` for one device: the PRR with ``p1`` (memoized when ``memo`` is given: words 0
    (keep?) and 1 (which other value) of ``(memo key, PRR, x)``, marking ``x``; else noise words 0 and 1), then
    the IRR with ``p2`` from the next two noise words (``p2 = 1`` disables it)."""
    irr = p2 < 1.0
    first = 0 if memo is not None else 2
    noise = keystream(nkey, NOISE, 0, 0, 1) if irr or memo is None else b""  # at most 4 words: one block
    if memo is not None:
        memo.mark(x)
        ck = ("grr", m, p1, x)
        y = memo.responses.get(ck)
        if y is None:
            pre = keystream(memo.key, PRR, x, 0, 1)
            y = memo.responses[ck] = other_than(x, m, _unit_at(pre, 1)) if _unit_at(pre, 0) >= p1 else x
        x = y
    elif _unit_at(noise, 0) >= p1:
        x = other_than(x, m, _unit_at(noise, 1))
    if irr and _unit_at(noise, first) >= p2:
        x = other_than(x, m, _unit_at(noise, first + 1))
    return x


class _DirectReports(Protocol):
    """Reports are the randomized values themselves (the smallest unsigned integer holding ``[0, k)``)."""

    @property
    def report_itemsize(self) -> int:
        return uint_size(self.k)


class GRR(_DirectReports, SingleShot):
    """Generalized randomized response (k-RR)."""

    name: ClassVar[str] = "GRR"

    def __init__(self, k: int, eps: float) -> None:
        self._init(k, eps)
        self.p, self.q = grr_probabilities(self.eps, self.k)

    @property
    def eps_first(self) -> float:
        return grr_eps(self.p, self.q)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        return int_bytes(grr_chain(v, self.k, self.p, 1.0, draw_key(), None), self.report_itemsize)


class TwoRoundProtocol(Protocol):
    """Base of every memoizing two-round protocol: PRR memoized per device, IRR per report."""

    longitudinal: ClassVar[bool] = True
    rounds: Rounds

    def _init_rounds(self, k: int, eps_inf: float, eps_1: float, calibration: str) -> None:
        if calibration not in CALIBRATIONS:
            raise LDPError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        self.k = k
        self.requested_eps_inf = check_eps("eps_inf", eps_inf)
        self.requested_eps_1 = check_eps("eps_1", eps_1)
        self.calibration = calibration
        self.rounds = self._solve_rounds()

    def _solve_rounds(self) -> Rounds:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "k": self.k, "eps_inf": self.requested_eps_inf,
                "eps_1": self.requested_eps_1, "calibration": self.calibration}

    ps = property(lambda self: self.rounds.ps)
    qs = property(lambda self: self.rounds.qs)
    p1 = property(lambda self: self.rounds.p1)
    q1 = property(lambda self: self.rounds.q1)
    p2 = property(lambda self: self.rounds.p2)
    q2 = property(lambda self: self.rounds.q2)

    @property
    def memo_size(self) -> int:
        return self.k

    def longitudinal_loss(self, memoized: int) -> float:
        """Each memoized input leaks one ε∞, at most ``memo_size`` of them."""
        return min(memoized, self.memo_size) * self.eps_inf

    def variance(self, n: int) -> float:
        return pure_variance(self.ps, self.qs, n)


class GRRChain(TwoRoundProtocol):
    """Two GRR rounds over ``chain_size`` values (L-GRR: the values; LOLOHA: the hash values)."""

    @property
    def chain_size(self) -> int:
        return self.k

    def _support_q1(self) -> float | None:
        return None

    def _solve_rounds(self) -> Rounds:
        m = self.chain_size
        p1, q1 = grr_probabilities(self.requested_eps_inf, m)
        p2 = grr_chain_p2(p1, q1, m, self.requested_eps_1, self.requested_eps_inf, self.calibration, self.name)
        return Rounds(p1, q1, p2, (1 - p2) / (m - 1), q1s=self._support_q1())

    @property
    def eps_inf(self) -> float:
        return grr_eps(self.p1, self.q1)

    @property
    def eps_first(self) -> float:
        return grr_chain_eps_first(self.rounds)


class LGRR(_DirectReports, GRRChain):
    """Longitudinal GRR: GRR(ε∞) memoized, then GRR per report."""

    name: ClassVar[str] = "L-GRR"

    def __init__(self, k: int, eps_inf: float, eps_1: float, calibration: str = "exact") -> None:
        self._init_rounds(check_domain(k), eps_inf, eps_1, calibration)

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        assert state is not None
        return int_bytes(grr_chain(v, self.k, self.p1, self.p2, draw_key(), state), self.report_itemsize)

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        v = self.check_value(value)
        st = self._state_for(state).copy()  # type: ignore[union-attr]
        return int_bytes(grr_chain(v, self.k, self.p1, 1.0, bytes(32), st), self.report_itemsize)
