"""The protocol contract shared by every frequency oracle (DESIGN.md, "The protocol contract").

``FrequencyProtocol`` fixes the public API; ``PureProtocol`` implements everything that is a
function of ``(counts, n)`` for *pure* protocols (Wang et al., USENIX Security 2017): a report
supports each value independently, with probability ``ps`` for the holder's value and ``qs``
for any other, so ``E[counts] = n (qs + (ps - qs) f)``. Every protocol of the project except
SHE is pure once its support is defined (two-round protocols with ``ps``/``qs`` from Arcolezi
et al., DCN 2022, Eq. 9; LOLOHA with ``q1' = 1/g``; dBitFlipPM over buckets with ``n d / b``
sampled users).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import struct
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from . import postprocess as _pp
from .errors import InvalidReports, LDPError, TruncatedPayload
from .memo import MemoState

_PAYLOAD = struct.Struct("<4sBI")  # magic, codec version, report count
_MAGIC = b"LDPr"
_CODEC_VERSION = 1
MAX_REPORTS_PER_PAYLOAD = 50_000_000


def uint_dtype(n_values: int) -> np.dtype:
    """The smallest unsigned integer dtype holding every integer in ``[0, n_values)``
    (uint8, uint16, else uint32): report values, hash values, pair codes, stored true values."""
    return np.dtype(np.uint8 if n_values <= 1 << 8 else np.uint16 if n_values <= 1 << 16 else np.uint32)


def check_eps(name: str, eps: float) -> float:
    eps = float(eps)
    if not np.isfinite(eps) or eps <= 0:
        raise LDPError(f"{name} must be a finite positive number, got {eps}")
    return eps


def check_domain(k: int, minimum: int = 2) -> int:
    if int(k) != k or k < minimum:
        raise LDPError(f"k must be an integer >= {minimum}, got {k}")
    return int(k)


class FrequencyProtocol(ABC):
    """A local randomizer with its server-side support counting and estimator."""

    name: ClassVar[str]
    longitudinal: ClassVar[bool] = False
    k: int

    # ---------------------------------------------------------------- identity
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Canonical parameters (everything the two sides must agree on)."""

    @functools.cached_property
    def fingerprint(self) -> str:
        """Short hash of :meth:`params`; travels in every batch envelope (computed once: a protocol's
        parameters do not change after construction, and the ingest checks it for every report)."""
        blob = json.dumps(self.params(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params().items() if k != "protocol")
        return f"{self.name}({inner})"

    # ---------------------------------------------------------------- privacy
    @property
    @abstractmethod
    def eps_first(self) -> float:
        """True ε of a single report (ε1), computed from the output probabilities."""

    @property
    def eps_inf(self) -> float:
        """True ε of one memoized value (ε∞); equals ``eps_first`` for single-shot protocols."""
        return self.eps_first

    @property
    def memo_size(self) -> int:
        """Number of distinct memoizable inputs of one device (0 for memoryless protocols)."""
        return 0

    def longitudinal_loss(self, memoized: np.ndarray | int) -> np.ndarray | float:
        """ε on a device's values after it memoized ``memoized`` distinct inputs (Arcolezi et al.,
        EDBT 2023, Def. 3.2).

        Single-shot protocols have no memo: every report spends a fresh ε, so their loss is
        unbounded; they report ``inf`` once a device has reported at least twice.
        """
        m = np.asarray(memoized)
        return np.where(m <= 0, 0.0, np.where(m == 1, self.eps_first, np.inf))

    def memoized_counts(self, state: MemoState) -> np.ndarray:
        """Distinct memoized inputs of each device of ``state``, the argument of :meth:`longitudinal_loss`: by
        default the marked cells (:meth:`MemoState.memoized_count`); TreeHist counts its tag tables (``inf``
        where one overflowed)."""
        return state.memoized_count()

    def public_cells(self, reports: np.ndarray, v: int) -> np.ndarray | None:
        """The memo cell of value ``v`` on every reporting device, as a server reads it from the
        public part of the reports (``int64 (n,)``), or ``None`` when the cell is the value itself
        (one memoized response per value). LOLOHA (hash under the device's public seed) and
        dBitFlipPM (case under the sampled buckets) override it; the longitudinal audit's
        seed-aware events use it (estimators/audit.py)."""
        return None

    def longitudinal_bound(self, reports: int) -> float:
        """Published worst-case longitudinal ε of a device after ``reports`` reports (the figure of
        ``/status``, the estimate documents and ``ldp_eps_longitudinal_worst``): an upper bound on
        the loss between two input sequences of that length with the same change pattern, against a
        server that sees everything a report carries. By default the accounted loss of ``reports``
        memoized inputs; LOLOHA and dBitFlipPM, whose memo cells depend on public seeds, override it
        (docs/privacy.md, "Limit of the accounted longitudinal ε")."""
        return float(self.longitudinal_loss(max(int(reports), 0)))

    @property
    def worst_case_loss(self) -> float:
        """Worst-case longitudinal ε on a device's values over an unbounded number of reports."""
        return float(self.longitudinal_loss(max(self.memo_size, 2)))

    # ---------------------------------------------------------------- device side
    def new_state(self, n_devices: int, rng: np.random.Generator | None = None) -> MemoState | None:
        """Per-device memo state (``None`` for memoryless protocols)."""
        if self.memo_size == 0:
            return None
        return MemoState.fresh(self.fingerprint, n_devices, self.memo_size, rng)

    @abstractmethod
    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None,
                  state: MemoState | None = None) -> np.ndarray:
        """Randomize a batch: ``values`` int array ``(n,)``, device ``i`` = row ``i``."""

    def check_values(self, values: np.ndarray) -> np.ndarray:
        v = np.asarray(values)
        if v.ndim != 1:
            raise LDPError(f"values must be a 1-d array, got shape {v.shape}")
        if v.size and not np.issubdtype(v.dtype, np.integer):
            raise LDPError(f"values must be integers, got dtype {v.dtype}")
        v = np.ascontiguousarray(v, dtype=np.int64)  # one kernel signature (a column slice is strided)
        if v.size and (v.min() < 0 or v.max() >= self.k):
            bad = v[(v < 0) | (v >= self.k)][0]
            raise LDPError(f"value {bad} is outside the domain [0, {self.k})")
        return v

    def _state_for(self, state: MemoState | None, n: int) -> MemoState:
        if self.memo_size == 0:
            if state is not None:
                raise LDPError(f"{self.name} is memoryless; do not pass a memo state")
            return None  # type: ignore[return-value]
        if state is None:
            raise LDPError(f"{self.name} memoizes: pass state=proto.new_state(n_devices)")
        state.check(self.fingerprint, n)
        return state

    # ---------------------------------------------------------------- server side
    @property
    def domain_size(self) -> int:
        """Length of the estimated histogram (``k``; ``b`` buckets for dBitFlipPM)."""
        return self.k

    @property
    def support_size(self) -> int:
        """Length of the support-count vector."""
        return self.domain_size

    @abstractmethod
    def support(self, reports: np.ndarray) -> np.ndarray:
        """Support counts ``int64 (support_size,)``; additive over disjoint report sets."""

    @abstractmethod
    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """Frequency estimates ``float (domain_size,)`` from support counts of ``n`` reports."""

    @abstractmethod
    def variance(self, n: int) -> float:
        """Approximate variance Var* of one estimated frequency (true frequency → 0)."""

    @abstractmethod
    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        """Exact variance of the estimate of a value whose true frequency is ``f``."""

    def check_counts(self, counts: np.ndarray, n: int) -> np.ndarray:
        c = np.asarray(counts)
        if c.shape != (self.support_size,):
            raise LDPError(f"counts must have shape ({self.support_size},), got {c.shape}")
        if int(n) != n or n <= 0:
            raise LDPError(f"n must be a positive integer, got {n}")
        return c

    # ---------------------------------------------------------------- audit hooks
    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """Boolean ``(n,)``: the distinguishing event of the privacy audit (supports v1, not v2)."""
        raise NotImplementedError

    def memoized_outputs(self, values: np.ndarray, state: MemoState) -> np.ndarray:
        """Memoizing protocols: each device's memoized first-round output (the PRR of RAPPOR,
        Erlingsson, Pihur & Korolova, CCS 2014) for ``values``, without the per-report second
        round and without marking anything memoized (``state.seen`` is left unchanged)."""
        raise NotImplementedError(f"{self.name} has no memoized first round")

    def memoized_audit_event(self, prr_reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """Boolean ``(n,)``: the distinguishing event of the PRR audit, on outputs of
        :meth:`memoized_outputs`. Every protocol here formats its PRR output like a report, and
        its :meth:`audit_event` has probability ratio exactly ``e^ε∞`` on it, so that is the default."""
        return self.audit_event(prr_reports, v1, v2)

    # ---------------------------------------------------------------- wire codec
    @property
    @abstractmethod
    def report_dtype(self) -> np.dtype:
        """Element dtype of the report array."""

    @property
    def report_shape(self) -> tuple[int, ...]:
        """Shape of one report (``()`` for a scalar report)."""
        return ()

    @property
    def report_nbytes(self) -> int:
        """Bytes of one report in the wire payload (:meth:`encode` adds a fixed header per batch)."""
        return np.dtype(self.report_dtype).itemsize * math.prod(self.report_shape)  # on every ingested report

    def encode(self, reports: np.ndarray) -> bytes:
        """Wire payload of a batch: a small header and the report array's raw bytes."""
        r = np.ascontiguousarray(reports, dtype=self.report_dtype)
        if r.shape[1:] != self.report_shape:
            raise InvalidReports(f"reports must have shape (n, *{self.report_shape}), got {r.shape}")
        return _PAYLOAD.pack(_MAGIC, _CODEC_VERSION, r.shape[0]) + r.tobytes()

    def decode(self, blob: bytes | memoryview) -> np.ndarray:
        """Inverse of :meth:`encode` (zero-copy view); raises :class:`InvalidReports`."""
        mv = memoryview(blob)
        if mv.nbytes < _PAYLOAD.size:
            raise TruncatedPayload(f"payload of {mv.nbytes} bytes is shorter than its header")
        magic, version, n = _PAYLOAD.unpack_from(mv)
        if magic != _MAGIC:
            raise InvalidReports("payload does not start with the report magic")
        if version != _CODEC_VERSION:
            raise InvalidReports(f"unsupported payload version {version}")
        if n > MAX_REPORTS_PER_PAYLOAD:
            raise InvalidReports(f"payload claims {n} reports, more than {MAX_REPORTS_PER_PAYLOAD}")
        dt = np.dtype(self.report_dtype)
        per = self.report_nbytes
        body = mv.nbytes - _PAYLOAD.size
        if body != n * per:
            raise TruncatedPayload(f"payload body has {body} bytes, expected {n} reports x {per} bytes")
        r = np.frombuffer(mv, dtype=dt, offset=_PAYLOAD.size, count=n * (per // dt.itemsize))
        r = r.reshape((n, *self.report_shape))
        self.validate_reports(r)
        return r

    def validate_reports(self, reports: np.ndarray) -> None:
        """Raise :class:`InvalidReports` if any report is outside the output space."""


class PureProtocol(FrequencyProtocol):
    """A pure frequency oracle: estimator, variances and post-processing from ``(ps, qs)``."""

    @property
    @abstractmethod
    def ps(self) -> float:
        """P(a report supports v | the device holds v)."""

    @property
    @abstractmethod
    def qs(self) -> float:
        """P(a report supports v | the device holds another value)."""

    @property
    def effective_n_factor(self) -> float:
        """Expected fraction of reports that can support a given value (1; d/b for dBitFlipPM)."""
        return 1.0

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """Unbiased estimator ``(c - n qs) / (n (ps - qs))`` (Arcolezi et al., DCN 2022, Eqs. 1 and 9)."""
        c = self.check_counts(counts, n).astype(np.float64)
        f = (c - n * self.qs) / (n * (self.ps - self.qs))
        return _pp.apply(postprocess, f, counts=c, n=n, ps=self.ps, qs=self.qs)

    def variance(self, n: int) -> float:
        """Var* = qs (1 - qs) / (n (ps - qs)^2) (Arcolezi et al., DCN 2022, Eqs. 2 and 11)."""
        return float(self.variance_exact(0.0, n))

    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        """Var = γ (1 - γ) / (n (ps - qs)^2) with γ = qs + f (ps - qs) (Arcolezi et al., DCN 2022,
        Thm. 2, Eq. 10)."""
        gamma = self.qs + np.asarray(f, dtype=np.float64) * (self.ps - self.qs)
        return gamma * (1.0 - gamma) / (n * (self.ps - self.qs) ** 2)


class SingleShot(FrequencyProtocol):
    """A memoryless protocol over ``[0, k)`` with one privacy parameter ``eps`` (its ε1 = ε∞)."""

    eps: float

    def __init__(self, k: int, eps: float) -> None:
        self.k = check_domain(k)
        self.eps = check_eps("eps", eps)

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "k": self.k, "eps": self.eps}


class SingleShotPure(SingleShot, PureProtocol):
    """A memoryless pure protocol whose support probabilities are its attributes ``p`` and ``q``."""

    p: float
    q: float

    @property
    def ps(self) -> float:
        return self.p

    @property
    def qs(self) -> float:
        return self.q
