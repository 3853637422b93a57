"""The protocol contract on the device side (``estimators/base.py``, ``memo.py``): parameters and fingerprint,
privacy figures, the memo state, and the report bytes of one device.

A randomizer returns the report of ONE device as bytes: the reference's report array of one row, little-endian
(what ``proto.encode`` emits after its 9-byte header, :func:`ldp_device.codec.encode_payload`).
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any, ClassVar

from .errors import InvalidState, LDPError
from .streams import KEY_BYTES, KeySource, os_key

__all__ = ["Protocol", "SingleShot", "MemoState", "uint_size", "fingerprint_of", "params_json"]


def uint_size(n_values: int) -> int:
    """Bytes of the smallest unsigned integer type holding ``[0, n_values)`` (uint8, uint16, else uint32)."""
    return 1 if n_values <= 1 << 8 else 2 if n_values <= 1 << 16 else 4


def params_json(params: dict[str, Any]) -> str:
    """The canonical JSON of parameters (``json.dumps(params, sort_keys=True, separators=(",", ":"))``)."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def fingerprint_of(params: dict[str, Any]) -> str:
    """The first 16 hex digits of sha256 of the canonical JSON of ``params`` (``FrequencyProtocol.fingerprint``)."""
    return hashlib.sha256(params_json(params).encode()).hexdigest()[:16]


class MemoState:
    """One device's memo state for one protocol: its secret 256-bit key and the set of memoized cells."""

    __slots__ = ("fingerprint", "key", "memo_size", "seen", "responses")

    def __init__(self, fingerprint: str, key: bytes, memo_size: int, seen: bytearray | None = None,
                 responses: dict | None = None) -> None:
        if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
            raise InvalidState("a memo key has 32 bytes")
        self.fingerprint, self.key, self.memo_size = fingerprint, bytes(key), int(memo_size)
        self.seen = bytearray((self.memo_size + 7) // 8) if seen is None else seen
        #: memoized responses computed so far, in memory only: a pure function of (key, input) kept so that a
        #: report of a memoized input does not compute its permanent response again (never written to disk)
        self.responses: dict = {} if responses is None else responses

    @classmethod
    def fresh(cls, fingerprint: str, memo_size: int, draw_key: KeySource = os_key) -> "MemoState":
        return cls(fingerprint, draw_key(), memo_size)

    def has(self, x: int) -> bool:
        return bool(self.seen[x >> 3] >> (x & 7) & 1)

    def mark(self, x: int) -> None:
        self.seen[x >> 3] |= 1 << (x & 7)

    def count(self) -> int:
        """Number of distinct memoized inputs."""
        return int.from_bytes(self.seen, "little").bit_count()

    def cells(self) -> list[int]:
        """The memoized cells, increasing."""
        return [x for x in range(self.memo_size) if self.has(x)]

    def copy(self) -> "MemoState":
        """A copy with its own memo marks (the memoized responses, a function of the key, are shared)."""
        return MemoState(self.fingerprint, self.key, self.memo_size, bytearray(self.seen), self.responses)

    def check(self, fingerprint: str) -> None:
        if self.fingerprint != fingerprint:
            raise InvalidState("memo state belongs to another protocol configuration "
                               f"(state {self.fingerprint}, protocol {fingerprint})")

    def to_json(self) -> dict[str, Any]:
        """The state as a JSON-able object (the key in hex: a secret)."""
        return {"fingerprint": self.fingerprint, "memo_size": self.memo_size, "key": self.key.hex(),
                "cells": self.cells()}

    @classmethod
    def from_json(cls, obj: Any) -> "MemoState":
        if not isinstance(obj, dict) or not isinstance(obj.get("key"), str) or len(obj["key"]) != 2 * KEY_BYTES:
            raise InvalidState("malformed memo state")
        try:
            st = cls(str(obj["fingerprint"]), bytes.fromhex(obj["key"]), int(obj["memo_size"]))
            for x in obj.get("cells", []):
                if isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < st.memo_size:
                    raise InvalidState(f"memo cell {x!r} outside [0, {st.memo_size})")
                st.mark(x)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidState(f"malformed memo state ({exc})") from None
        return st


class Protocol:
    """A local randomizer: identity (parameters, fingerprint), privacy figures and the device side."""

    name: ClassVar[str]
    longitudinal: ClassVar[bool] = False
    k: int
    _fp: str | None = None

    # ---------------------------------------------------------------- identity
    def params(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        if self._fp is None:
            self._fp = fingerprint_of(self.params())
        return self._fp

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items() if k != "protocol")
        return f"{self.name}({inner})"

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        raise NotImplementedError

    @property
    def eps_inf(self) -> float:
        return self.eps_first

    @property
    def memo_size(self) -> int:
        return 0

    def longitudinal_loss(self, memoized: int) -> float:
        """ε after memoizing ``memoized`` inputs; single-shot: 0, ε1, then ``inf`` (no memo)."""
        return 0.0 if memoized <= 0 else float(self.eps_first) if memoized == 1 else math.inf

    def memoized_count(self, state: "MemoState") -> int | float:
        """Distinct memoized inputs of ``state`` (the argument of :meth:`longitudinal_loss`): its marked cells;
        TreeHist counts its tag table (``inf`` once it overflowed)."""
        return state.count()

    @property
    def worst_case_loss(self) -> float:
        return float(self.longitudinal_loss(max(self.memo_size, 2)))

    @property
    def domain_size(self) -> int:
        return self.k

    # ---------------------------------------------------------------- wire
    @property
    def report_shape(self) -> tuple[int, ...]:
        return ()

    @property
    def report_itemsize(self) -> int:
        raise NotImplementedError

    @property
    def report_nbytes(self) -> int:
        return self.report_itemsize * math.prod(self.report_shape)

    # ---------------------------------------------------------------- device side
    def new_state(self, draw_key: KeySource = os_key) -> MemoState | None:
        """A fresh memo state (one 256-bit key from ``draw_key``), ``None`` for memoryless protocols."""
        if self.memo_size == 0:
            return None
        return MemoState.fresh(self.fingerprint, self.memo_size, draw_key)

    def check_value(self, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                import operator
                value = operator.index(value)
            except TypeError:
                raise LDPError(f"values must be integers, got {value!r}") from None
        if not 0 <= value < self.k:
            raise LDPError(f"value {value} is outside the domain [0, {self.k})")
        return int(value)

    def _state_for(self, state: MemoState | None) -> MemoState | None:
        if self.memo_size == 0:
            if state is not None:
                raise LDPError(f"{self.name} is memoryless; do not pass a memo state")
            return None
        if state is None:
            raise LDPError(f"{self.name} memoizes: pass state=proto.new_state()")
        state.check(self.fingerprint)
        return state

    def randomize(self, value: int, draw_key: KeySource = os_key, state: MemoState | None = None) -> bytes:
        """The report bytes of one device holding ``value``: fresh noise from keys of ``draw_key`` (one per
        ``keys_from`` call of the reference, in its order), memoized responses from ``state``'s key (marking
        the memoized input)."""
        v = self.check_value(value)
        return self._randomize(v, draw_key, self._state_for(state))

    def _randomize(self, v: int, draw_key: KeySource, state: MemoState | None) -> bytes:
        raise NotImplementedError

    def memoized_output(self, value: int, state: MemoState) -> bytes:
        """Memoizing protocols: the device's permanent (PRR) response to ``value``, formatted like a report,
        without the per-report round and without marking anything (``memoized_outputs`` of the reference)."""
        raise LDPError(f"{self.name} has no memoized first round")


class SingleShot(Protocol):
    """A memoryless protocol over ``[0, k)`` with one privacy parameter ``eps`` (its ε1 = ε∞)."""

    p: float
    q: float

    def _init(self, k: int, eps: float) -> None:
        from .calibration import check_domain, check_eps
        self.k = check_domain(k)
        self.eps = check_eps("eps", eps)

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "k": self.k, "eps": self.eps}

    @property
    def ps(self) -> float:
        return self.p

    @property
    def qs(self) -> float:
        return self.q

    def variance(self, n: int) -> float:
        """Var* of a pure protocol: ``qs (1 - qs) / (n (ps - qs)^2)`` (``PureProtocol.variance``)."""
        return pure_variance(self.ps, self.qs, n)


def pure_variance(ps: float, qs: float, n: int) -> float:
    """``PureProtocol.variance_exact(0, n)``: ``γ (1 - γ) / (n (ps - qs)^2)`` with ``γ = qs + 0 (ps - qs)``."""
    gamma = qs + 0.0 * (ps - qs)
    return gamma * (1.0 - gamma) / (n * (ps - qs) ** 2)
