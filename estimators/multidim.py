"""Multidimensional solutions: ``d`` attributes per device (domain sizes ``ks``) under ONE total budget.

Every solution randomizes each attribute through a *channel*, an ordinary protocol of the library
(``channels[j]``, reports in its format), and differs in which reports a device sends:

* **SPL** / **L-SPL** (split): every attribute, each with ``ε/d`` (``ε∞/d`` and ``ε1/d``);
  sequential composition over the ``d`` reports gives ``ε`` (Arcolezi et al., DCN 2022, §3, Eq. 7).
* **SMP** / **L-SMP** / **ALLOMFREE** (sample): each device samples ONE attribute uniformly and
  reports it, with its index, under the whole budget (DCN 2022, §3, Eq. 8 with ``r = 1``; ALLOMFREE
  is DCN 2022, Alg. 1: per attribute L-GRR or L-OSUE by the smaller Var*, Eq. 11).
* **RS+FD** / **L-RS+FD** / **ALLOMFREE(fake_data=True)** (fake): each device samples one attribute,
  reports it with the amplified budget ``ε' = ln(d (e^ε - 1) + 1)`` and *fake data* for every other
  attribute, so the server is not told which attribute is real (Arcolezi, Couchot, Al Bouna & Xiao,
  CIKM 2021, "RS+FD"; DCN 2022, §6 names the longitudinal version as future work).

Estimators and variances (derived from the output laws)
    *split*: attribute ``j`` is the channel's protocol over all ``n`` devices: its unbiased
    estimator and variance with ``n``.
    *sample*: ``n_j ~ Bin(n, 1/d)`` devices report attribute ``j``; given ``n_j`` it is the channel's
    protocol over ``n_j`` devices, so the estimator is the channel's with ``n_j`` and, as Var ∝ 1/n,
    ``Var ≈ Var_channel(n/d) = d Var_channel(n)`` (DCN 2022, Eq. 8).
    *fake*: every device reports attribute ``j``; the report is real w.p. ``1/d`` (support
    probabilities ``ps`` for the holder's value, ``qs`` for any other) and fake otherwise, supporting
    ``v`` w.p. ``φ = qs + (ps - qs) π`` where ``π`` is the probability that the fake input is ``v``
    (``π = 1/k`` for a uniform fake value: RS+FD[GRR], whose raw uniform value has the law of GRR of a
    uniform value, RS+FD[OUE-r] and every longitudinal channel; ``π = 0`` for OUE-z, OUE of the all-zero
    vector). Hence ``P(a report supports v) = γ = (qs + f (ps - qs))/d + (d - 1) φ / d`` and, with
    ``N_v ~ Bin(n, γ)`` for i.i.d. devices,

        ``f̂ = (d N_v / n - qs - (d - 1) φ) / (ps - qs)``,   ``Var[f̂] = d² γ (1 - γ) / (n (ps - qs)²)``,

    which are CIKM 2021's RS+FD[GRR], RS+FD[OUE-z] and RS+FD[OUE-r] estimators and variances
    (``σ = γ`` in the peer library multi-freq-ldpy). It is the pure-protocol estimator (DCN 2022,
    Eqs. 1-2) with ``ps' = ps/d + (d-1) φ/d`` and ``qs' = qs/d + (d-1) φ/d``: :class:`FakeDataView`.

Privacy figures (computed from the channels, never echoed)
    ``eps_first`` is the ε of one step's reports of a device over its whole tuple: split, the sum
    over the channels (sequential composition); sample and fake, the largest channel ``eps_first``.
    For *fake* this is exact, not only a bound: ``P(y | v) = Π_l P_fake(y_l) · (1/d) Σ_j R_j`` with
    ``R_j = P_j(y_j | v_j) / P_fake(y_j)``, so the ratio for two tuples is a mediant of the channels'
    ratios, at most ``max_j e^{ε_j}``, and equal to it when every attribute differs (the channels share
    one ε1: one budget). **RS+FD's ``ε`` (CIKM 2021) is therefore the ε against a change of ONE
    attribute, not of the tuple**: with the amplified budget the tuple-level ε of a report is ``ε'``;
    and even the one-attribute figure equals ``ε`` only for GRR with equal domain sizes and for OUE-z;
    it is larger for OUE-r, for GRR with unequal ``ks`` (``ln(1 + (e^ε' - 1) k_j q_j / Σ_l k_l q_l)`` for
    attribute ``j``) and for ADP's mix of GRR and OUE-z (``tests/test_multidim.py`` computes all of it
    exactly by enumeration). ``amplification="none"`` runs RS+FD with ``ε' = ε``: the tuple-level ε is
    then ``ε``, and the fake data only hide which attribute was sampled.

Longitudinal accounting (:meth:`Solution.longitudinal_loss`)
    Per device, the sum over attributes of the channel's ``longitudinal_loss`` of the inputs (values,
    hash values, buckets) the device memoized from REAL data in that attribute (single-shot channels:
    0 reports → 0, 1 → ε1, more → ∞): sequential composition over attributes and over memoized
    responses (Dwork & Roth, Found. Trends TCS 2014, Thm. 3.16; Arcolezi et al., EDBT 2023, Prop. 2.3 and Eq. 8). Fake
    reports are functions of data-independent inputs and cost nothing (their memo cells are not
    marked). No amplification by sampling or fake data is claimed over time: the sampled attribute is
    given to the server by SMP, and with fake data it can be learnt from a device's history (a fake
    input never changes, a real one may), so the sampled attribute's channel figures apply as run.
    With ``sampling="fixed"`` (default) the attribute is drawn once, kept in the device's state for its
    life, and only that attribute's memo ever grows: the loss is that one channel's. With
    ``sampling="per-step"`` it is re-drawn at every :meth:`Solution.randomize` call: over time the
    device memoizes in EVERY attribute, so the loss is the sum over attributes (``d`` times the fixed
    loss for static values, ``ε∞`` per attribute instead of once), and the server links a device's
    reports of every attribute.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Sequence

import numpy as np

from . import kernels
from .adaptive import Adaptive
from .base import FrequencyProtocol, PureProtocol, check_eps, uint_dtype
from .errors import InvalidReports, InvalidState, LDPError
from .fileio import atomic_write
from .kernels import NO_KEYS, NO_SEEN, UE_NO_IRR
from .memo import MemoState
from .randomness import KEY_WORDS, NOISE, fill_run, noise_key, np_unit, threshold32
from .registry import make, parameters

Layout = Literal["split", "sample", "fake"]
SAMPLINGS = ("fixed", "per-step")
AMPLIFICATIONS = ("paper", "none")
OBJECTIVES = ("variance", "loss")
RSFD_PROTOCOLS = ("GRR", "OUE-z", "OUE-r", "ADP")
#: ALLOMFREE, objective "loss": a candidate whose Var* is at most this factor times the smallest qualifies
LOSS_VARIANCE_FACTOR = 1.25
_LOSS_RTOL = 1e-6  # worst-case losses closer than this (relative) are equal (ε∞ of UE lives on the 2^-32 grid)

# fake-data laws of an attribute (what a non-sampled attribute reports)
_RAW_UNIFORM = "uniform value"            # RS+FD[GRR]: a uniform value, not randomized (= GRR of a uniform value)
_UNIFORM = "channel of a uniform input"   # RS+FD[OUE-r]; longitudinal: the channel of a fixed uniform input
_ZERO = "OUE of the all-zero vector"      # RS+FD[OUE-z]


def amplified_eps(eps: float, d: int) -> float:
    """``ε' = ln(d (e^ε - 1) + 1)``: RS+FD's budget for the sampled attribute (Arcolezi et al., CIKM 2021;
    amplification by sampling with rate ``1/d``, Li, Qardaji & Su, ASIACCS 2012)."""
    return float(np.log1p(d * np.expm1(eps)))


def uniform_draws(rng: np.random.Generator | None, n: int, m: int) -> np.ndarray:
    """``n`` integers uniform on ``[0, m)`` (``int64``): words of the ChaCha20 stream ``(key, NOISE, 0)``
    under a fresh batch key (OS CSPRNG for ``rng=None``, else the labelled simulation mode,
    :func:`estimators.randomness.noise_key`), as ``floor(u m)`` with 53-bit uniforms ``u``."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    words = np.empty(n, dtype=np.uint64)
    fill_run(noise_key(rng), NOISE, 0, 0, words)
    return np.minimum((np_unit(words) * m).astype(np.int64), m - 1)


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    try:
        out = tuple(int(k) for k in ks)
        ok = all(not isinstance(k, bool) and int(k) == k for k in ks)
    except (TypeError, ValueError):
        raise LDPError(f"ks must be a list of domain sizes, got {ks!r}") from None
    if not ok or len(out) < 2 or min(out) < 2:
        raise LDPError(f"ks must list at least 2 integer domain sizes >= 2, got {list(ks)!r}")
    return out


def _check_choice(what: str, value: Any, allowed: Sequence[Any]) -> Any:
    if value not in allowed:
        raise LDPError(f"{what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _per_attribute(protocol_params: dict | list | None, d: int) -> list[dict]:
    """``protocol_params``: ``None``, one dict for every attribute, or a list of ``d`` dicts."""
    if protocol_params is None:
        return [{} for _ in range(d)]
    if isinstance(protocol_params, dict):
        return [dict(protocol_params) for _ in range(d)]
    if isinstance(protocol_params, (list, tuple)) and len(protocol_params) == d \
            and all(isinstance(p, dict) for p in protocol_params):
        return [dict(p) for p in protocol_params]
    raise LDPError(f"protocol_params must be a dict or a list of {d} dicts (one per attribute), "
                   f"got {protocol_params!r}")


def _channel(protocol: str, k: int, budget: dict[str, float | None], extra: dict,
             longitudinal: bool, solution: str) -> FrequencyProtocol:
    """``make(protocol, k=k, **budget, **extra)``; the budget comes from the solution only."""
    takes = parameters(protocol)
    if ("eps_inf" in takes) != longitudinal:  # memoizing protocols take ε∞, single-shot ones ε
        kind = "a longitudinal (memoizing)" if longitudinal else "a single-shot"
        raise LDPError(f"{solution} needs {kind} protocol, got {protocol}")
    clash = sorted(set(extra) & {"k", "eps", "eps_inf", "eps_1"})
    if clash:
        raise LDPError(f"{solution}: protocol_params cannot set {', '.join(clash)} (the solution sets the domain "
                       "size and spends the budget)")
    opts: dict[str, Any] = {"k": k, **extra}
    for name, value in budget.items():
        if value is None:
            continue
        if name not in takes:
            raise LDPError(f"{solution}: {protocol} takes no {name}"
                           + (" (it has no IRR round: its ε1 is its ε∞); pass eps_1=None" if name == "eps_1" else ""))
        opts[name] = value
    return make(protocol, **opts)


def fake_data_probabilities(channel: FrequencyProtocol, d: int, law: str) -> tuple[float, float]:
    """``(ps', qs')`` of attribute reports that are real w.p. ``1/d`` and fake otherwise (module doc):
    ``ps' = ps/d + (d-1) φ/d``, ``qs' = qs/d + (d-1) φ/d``, ``φ = qs + (ps - qs) π``."""
    ps, qs = float(channel.ps), float(channel.qs)  # type: ignore[attr-defined]
    pi = 0.0 if law == _ZERO else 1.0 / channel.domain_size
    phi = qs + (ps - qs) * pi
    return ps / d + (d - 1) * phi / d, qs / d + (d - 1) * phi / d


def _pure_var_star(ps: float, qs: float) -> float:
    """Var* at n = 1 of a pure protocol, ``qs (1 - qs) / (ps - qs)^2`` (DCN 2022, Eq. 2)."""
    return qs * (1.0 - qs) / (ps - qs) ** 2


def _representatives(channel: FrequencyProtocol) -> np.ndarray:
    """One input value per memo cell of the channel (a bucket's first value for dBitFlipPM)."""
    edges = getattr(channel, "bucket_edges", None)
    return edges()[:-1] if edges is not None else np.arange(channel.domain_size, dtype=np.int64)


# ====================================================================== device state and reports
_FORMAT = "ldp-stream/multi-state"
_VERSION = 1


@dataclass
class MultiState:
    """Device state of ``n_devices`` devices for one solution.

    Attributes:
        fingerprint: fingerprint of the solution the state belongs to.
        sampled: the attribute each device sampled (fixed sampling: for its life; per-step: at the
            last step), ``uint (n_devices,)``; ``None`` for SPL / L-SPL.
        memos: per attribute, the devices' :class:`MemoState` for that attribute's channel (one 256-bit
            key per device and attribute), ``None`` for single-shot channels.
        fake: per device and attribute, the fixed fake input of the longitudinal fake-data solutions,
            ``int64 (n_devices, d)`` (unused for the sampled attribute); ``None`` otherwise.
        reported: per device and attribute, the reports of real data sent, ``uint8 (n_devices, d)``,
            saturating at 255 (the accounting of single-shot channels needs 0, 1 or more).
    """

    fingerprint: str
    sampled: np.ndarray | None
    memos: list[MemoState | None]
    fake: np.ndarray | None
    reported: np.ndarray

    @property
    def n_devices(self) -> int:
        return int(self.reported.shape[0])

    @property
    def d(self) -> int:
        return int(self.reported.shape[1])

    def check(self, fingerprint: str, n_rows: int) -> None:
        """Raise :class:`InvalidState` unless this state fits a solution and a batch."""
        if self.fingerprint != fingerprint:
            raise InvalidState("device state belongs to another solution configuration "
                               f"(state {self.fingerprint}, solution {fingerprint})")
        if n_rows != self.n_devices:
            raise InvalidState(f"batch has {n_rows} devices but the state holds {self.n_devices}")

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (:func:`estimators.fileio.atomic_write`): a reader sees the old file or the new one."""
        memo = [None if m is None else {"fingerprint": m.fingerprint, "memo_size": m.memo_size} for m in self.memos]
        header = json.dumps({"format": _FORMAT, "version": _VERSION, "fingerprint": self.fingerprint,
                             "n_devices": self.n_devices, "d": self.d, "memo": memo,
                             "sampled": self.sampled is not None, "fake": self.fake is not None}).encode()
        arrays: dict[str, np.ndarray] = {"header": np.frombuffer(header, dtype=np.uint8), "reported": self.reported}
        if self.sampled is not None:
            arrays["sampled"] = self.sampled
        if self.fake is not None:
            arrays["fake"] = self.fake
        for j, m in enumerate(self.memos):
            if m is not None:
                arrays[f"keys_{j}"], arrays[f"seen_{j}"] = m.keys, m.seen
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        atomic_write(Path(path), buf.getvalue())

    @classmethod
    def load(cls, path: str | os.PathLike, fingerprint: str | None = None,
             solution: "Solution | None" = None) -> "MultiState":
        """Read a state saved by :meth:`save`; optionally require a solution (or its fingerprint)."""
        try:
            with np.load(path, allow_pickle=False) as z:
                header = json.loads(z["header"].tobytes().decode())
                arrays = {name: z[name].copy() for name in z.files if name != "header"}
        except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise InvalidState(f"cannot read device state {path}: {exc}") from exc
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            raise InvalidState(f"{path} is not a multidimensional device state file")
        if header.get("version") != _VERSION:
            raise InvalidState(f"{path} is a version-{header.get('version')} device state file; "
                               f"this release reads version {_VERSION}")
        try:
            n, d, memo = int(header["n_devices"]), int(header["d"]), header["memo"]
            reported = arrays["reported"]
            sampled = arrays["sampled"] if header["sampled"] else None
            fake = arrays["fake"] if header["fake"] else None
            memos = [None if m is None else MemoState(m["fingerprint"], arrays[f"keys_{j}"], arrays[f"seen_{j}"],
                                                      int(m["memo_size"])) for j, m in enumerate(memo)]
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidState(f"{path}: malformed device state ({exc!r})") from exc
        ok = (reported.dtype == np.uint8 and reported.shape == (n, d) and len(memos) == d
              and (sampled is None or (sampled.shape == (n,) and np.issubdtype(sampled.dtype, np.unsignedinteger)
                                       and (sampled.size == 0 or int(sampled.max()) < d)))
              and (fake is None or (fake.dtype == np.int64 and fake.shape == (n, d)))
              and all(m is None or (m.keys.dtype == np.uint32 and m.keys.shape == (n, KEY_WORDS)
                                    and m.seen.dtype == np.uint8 and m.seen.shape == (n, (m.memo_size + 7) // 8))
                      for m in memos))
        if not ok:
            raise InvalidState(f"{path}: arrays do not match the header")
        state = cls(header["fingerprint"], sampled, memos, fake, reported)
        want = solution.fingerprint if solution is not None else fingerprint
        if want is not None and state.fingerprint != want:
            raise InvalidState(f"{path} belongs to solution {state.fingerprint}, not {want}")
        if solution is not None:
            solution.check_state(state)
        return state


@dataclass
class MultiReports:
    """One step's reports of a batch of devices.

    ``reports[j]``: the report array of attribute ``j`` (channel ``j``'s format); ``senders[j]``: the
    device rows that sent them, ``int64`` (SPL and fake-data solutions: every row; SMP-like: the
    devices that sampled ``j``).
    """

    reports: list[np.ndarray]
    senders: list[np.ndarray]


# ====================================================================== the server-side view of one attribute
class AttributeView(FrequencyProtocol):
    """The server side of attribute ``j`` of a solution, as a :class:`FrequencyProtocol`.

    Support counting, codec and report validation are channel ``j``'s; :meth:`estimate` and
    :meth:`variance` take ``n`` = the reports COUNTED for attribute ``j`` (what the server knows);
    the privacy figures (``eps_first``, ``eps_inf``, :meth:`longitudinal_loss`, ``worst_case_loss``)
    are the solution's device-level figures (the whole budget over the group of attributes). Devices
    randomize through the solution: :meth:`randomize` and :meth:`new_state` raise.
    """

    _DELEGATED = frozenset({"bucket", "bucket_edges", "hash_values", "g", "b"})

    def __init__(self, solution: "Solution", j: int) -> None:
        self.solution, self.attribute = solution, j
        self.channel: FrequencyProtocol = solution.channels[j]
        self.name = f"{solution.name}/{self.channel.name}"  # type: ignore[misc]
        self.longitudinal = solution.longitudinal  # type: ignore[misc]
        self.k = self.channel.k

    def __getattr__(self, attr: str) -> Any:
        if attr in AttributeView._DELEGATED:
            return getattr(self.channel, attr)
        raise AttributeError(f"{type(self).__name__!s} has no attribute {attr!r}")

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "solution": self.solution.params(), "attribute": self.attribute,
                "channel": self.channel.params()}

    # privacy: the solution's device-level figures
    @property
    def eps_first(self) -> float:
        return self.solution.eps_first

    @property
    def eps_inf(self) -> float:
        return self.solution.eps_inf

    def longitudinal_loss(self, memoized: np.ndarray | int) -> np.ndarray | float:
        """The solution's worst-case device-level ε once a device memoized ``memoized`` inputs in
        every attribute it reports (:meth:`Solution.loss_bound`)."""
        return self.solution.loss_bound(memoized)

    def longitudinal_bound(self, reports: int) -> float:
        return self.solution.reports_bound(reports)

    @property
    def worst_case_loss(self) -> float:
        return self.solution.worst_case_loss

    # device side: through the solution only
    def new_state(self, n_devices: int, rng: np.random.Generator | None = None) -> MemoState | None:
        raise LDPError(f"attribute {self.attribute} of {self.solution.name} has no device state of its own: "
                       "use solution.new_state(n_devices)")

    def randomize(self, values, rng=None, state=None):
        raise LDPError(f"attribute {self.attribute} of {self.solution.name} is randomized with the other attributes: "
                       "devices call solution.randomize(values, state=...)")

    # server side and codec: channel j's
    @property
    def domain_size(self) -> int:
        return self.channel.domain_size

    @property
    def support_size(self) -> int:
        return self.channel.support_size

    @property
    def report_dtype(self) -> np.dtype:
        return self.channel.report_dtype

    @property
    def report_shape(self) -> tuple[int, ...]:
        return self.channel.report_shape

    def support(self, reports: np.ndarray) -> np.ndarray:
        return self.channel.support(reports)

    def encode(self, reports: np.ndarray) -> bytes:
        return self.channel.encode(reports)

    def decode(self, blob: bytes | memoryview) -> np.ndarray:
        return self.channel.decode(blob)

    def validate_reports(self, reports: np.ndarray) -> None:
        self.channel.validate_reports(reports)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """Channel ``j``'s distinguishing event (about one report of attribute ``j``)."""
        return self.channel.audit_event(reports, v1, v2)


class ChannelView(AttributeView):
    """Attribute ``j`` of SPL / SMP-like solutions: the channel's estimator over the reports counted."""

    def estimate(self, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        return self.channel.estimate(counts, n, postprocess=postprocess)

    def variance(self, n: int) -> float:
        return self.channel.variance(n)

    def variance_exact(self, f: np.ndarray | float, n: int) -> np.ndarray:
        return self.channel.variance_exact(f, n)


class FakeDataView(AttributeView, PureProtocol):
    """Attribute ``j`` of a fake-data solution: a pure protocol with ``ps' = ps/d + (d-1) φ/d`` and
    ``qs' = qs/d + (d-1) φ/d`` (module doc), so :class:`PureProtocol`'s estimator
    ``(c - n qs') / (n (ps' - qs'))`` is RS+FD's ``(d c/n - qs - (d-1) φ) / (ps - qs)`` and its variance
    ``γ (1 - γ) / (n (ps' - qs')^2)`` is RS+FD's ``d² γ (1 - γ) / (n (ps - qs)²)`` (CIKM 2021)."""

    def __init__(self, solution: "Solution", j: int, law: str) -> None:
        super().__init__(solution, j)
        self.law = law
        self._ps, self._qs = fake_data_probabilities(self.channel, solution.d, law)

    @property
    def ps(self) -> float:
        return self._ps

    @property
    def qs(self) -> float:
        return self._qs

    @property
    def effective_n_factor(self) -> float:
        return float(getattr(self.channel, "effective_n_factor", 1.0))


# ====================================================================== solutions
class Solution:
    """A multidimensional solution: ``d`` channels, a layout (split / sample / fake) and the device state.

    Build with :func:`estimators.make_solution`; ``make_solution(**sol.params())`` rebuilds it.
    """

    name: ClassVar[str]
    longitudinal: ClassVar[bool]
    layout: ClassVar[Layout]

    ks: tuple[int, ...]
    channels: tuple[FrequencyProtocol, ...]
    choices: tuple[tuple[str, str], ...]
    sampling: str | None
    fake_laws: tuple[str, ...] | None
    _params: dict[str, Any]

    def _setup(self, ks: tuple[int, ...], channels: Sequence[FrequencyProtocol], choices: Sequence[tuple[str, str]],
               params: dict[str, Any], sampling: str | None = None, fake_laws: Sequence[str] | None = None) -> None:
        self.ks = ks
        self.channels = tuple(channels)
        self.choices = tuple(choices)
        self.sampling = sampling
        self.fake_laws = None if fake_laws is None else tuple(fake_laws)
        self._params = {"solution": self.name, **params}
        if self.layout == "fake":
            assert self.fake_laws is not None
            self._views: tuple[AttributeView, ...] = tuple(FakeDataView(self, j, law)
                                                          for j, law in enumerate(self.fake_laws))
        else:
            self._views = tuple(ChannelView(self, j) for j in range(self.d))

    # ------------------------------------------------------------------ identity
    @property
    def d(self) -> int:
        return len(self.ks)

    def params(self) -> dict[str, Any]:
        """JSON-able parameters; ``make_solution(**params)`` (or :func:`solution_from_params`) rebuilds."""
        return json.loads(json.dumps(self._params))

    @property
    def fingerprint(self) -> str:
        blob = json.dumps(self.params(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._params.items() if k != "solution")
        return f"{self.name}({inner})"

    def attribute_protocol(self, j: int) -> AttributeView:
        """The server-side :class:`FrequencyProtocol` of attribute ``j`` (:class:`AttributeView`)."""
        return self._views[self._check_j(j)]

    def _check_j(self, j: int) -> int:
        if isinstance(j, bool) or int(j) != j or not 0 <= j < self.d:
            raise LDPError(f"attribute index must be an integer in [0, {self.d}), got {j!r}")
        return int(j)

    # ------------------------------------------------------------------ privacy
    @property
    def _composes(self) -> bool:
        """True if a device's loss composes over attributes (split, or sampling re-drawn per step)."""
        return self.layout == "split" or self.sampling == "per-step"

    @property
    def eps_first(self) -> float:
        """ε of one step's reports of a device over its whole tuple (module doc): split, the sum of the
        channels' ε1; sample and fake, the largest."""
        e = [float(c.eps_first) for c in self.channels]
        return float(sum(e)) if self.layout == "split" else max(e)

    @property
    def eps_inf(self) -> float:
        """ε of a device's memoized responses for life while its values do not change: the sum of the
        channels' ε∞ when the loss composes over attributes (split, per-step sampling), the largest
        with fixed sampling; ``eps_first`` for single-shot solutions."""
        if not self.longitudinal:
            return self.eps_first
        e = [float(c.eps_inf) for c in self.channels]
        return float(sum(e)) if self._composes else max(e)

    def loss_bound(self, memoized: np.ndarray | int) -> np.ndarray | float:
        """Worst-case device-level ε once a device memoized (at most) ``memoized`` inputs in every
        attribute it reports real data for: the channels' ``longitudinal_loss`` summed over attributes
        (split, per-step sampling) or the largest (fixed sampling)."""
        losses = [np.asarray(c.longitudinal_loss(memoized), dtype=np.float64) for c in self.channels]
        out = np.sum(losses, axis=0) if self._composes else np.max(losses, axis=0)
        return float(out) if np.ndim(out) == 0 else out

    def reports_bound(self, reports: int) -> float:
        """Published worst-case device-level ε after ``reports`` steps: the channels'
        ``longitudinal_bound`` (seed-aware for LOLOHA and dBitFlipPM), composed like :meth:`loss_bound`."""
        b = [float(c.longitudinal_bound(reports)) for c in self.channels]
        return float(sum(b)) if self._composes else max(b)

    @property
    def worst_case_loss(self) -> float:
        """Worst-case device-level ε over an unbounded number of steps with changing values."""
        if any(np.isinf(c.worst_case_loss) for c in self.channels):  # LOLOHA / dBitFlipPM channels too
            return float("inf")
        return float(self.loss_bound(max(max(c.memo_size for c in self.channels), 2)))

    def memoized_cells(self, state: MultiState) -> np.ndarray:
        """``int64 (n_devices, d)``: per device and attribute, the inputs memoized from real data
        (memoizing channels) or the real-data reports capped at 2 (single-shot channels)."""
        self.check_state(state)
        cols = []
        for c, m, r in zip(self.channels, state.memos, state.reported.T):
            cols.append(m.memoized_count() if m is not None else np.minimum(r, 2).astype(np.int64))
        return np.stack(cols, axis=1) if cols else np.zeros((state.n_devices, 0), dtype=np.int64)

    def longitudinal_loss(self, state: MultiState) -> np.ndarray:
        """Per device, the worst-case longitudinal ε so far over all attributes: ``Σ_j
        channels[j].longitudinal_loss(cells_j)`` over the cells each device memoized from real data in
        attribute ``j`` (:meth:`memoized_cells`). Sequential composition over attributes and memoized
        responses; fake reports cost nothing; no amplification claimed (module doc)."""
        cells = self.memoized_cells(state)
        total = np.zeros(state.n_devices, dtype=np.float64)
        for j, c in enumerate(self.channels):
            total += np.asarray(c.longitudinal_loss(cells[:, j]), dtype=np.float64)
        return total

    # ------------------------------------------------------------------ device side
    @property
    def _needs_state(self) -> bool:
        return (any(c.memo_size for c in self.channels) or self.sampling == "fixed"
                or (self.layout == "fake" and self.longitudinal))

    def new_state(self, n_devices: int, rng: np.random.Generator | None = None) -> MultiState:
        """Fresh devices: per attribute a :class:`MemoState` (256-bit keys) for memoizing channels, the
        sampled attribute (uniform), the fixed fake inputs (uniform over the channel's memo cells);
        from the OS CSPRNG for ``rng=None``, else the labelled simulation mode."""
        if isinstance(n_devices, bool) or int(n_devices) != n_devices or n_devices < 0:
            raise InvalidState(f"n_devices must be an integer >= 0, got {n_devices!r}")
        n = int(n_devices)
        memos = [c.new_state(n, rng) for c in self.channels]
        sampled = None
        if self.layout != "split":
            sampled = uniform_draws(rng, n, self.d).astype(uint_dtype(self.d))
        fake = None
        if self.layout == "fake" and self.longitudinal:
            fake = np.empty((n, self.d), dtype=np.int64)
            for j, c in enumerate(self.channels):
                reps = _representatives(c)
                fake[:, j] = reps[uniform_draws(rng, n, reps.shape[0])]
        return MultiState(self.fingerprint, sampled, memos, fake, np.zeros((n, self.d), dtype=np.uint8))

    def check_state(self, state: MultiState, n_rows: int | None = None) -> None:
        """Raise :class:`InvalidState` unless ``state`` belongs to this solution (and holds ``n_rows``)."""
        state.check(self.fingerprint, state.n_devices if n_rows is None else n_rows)
        bad = [j for j, (c, m) in enumerate(zip(self.channels, state.memos))
               if (m is None) != (c.memo_size == 0) or (m is not None and m.fingerprint != c.fingerprint)]
        if state.d != self.d or bad or (state.sampled is None) != (self.layout == "split") \
                or (state.fake is None) != (self.layout != "fake" or not self.longitudinal):
            raise InvalidState(f"device state does not match {self.name}'s channels (attributes {bad})")

    def check_values(self, values: np.ndarray) -> np.ndarray:
        """``int64 (n, d)``: row ``i`` = device ``i``'s tuple, column ``j`` in ``[0, ks[j])``."""
        v = np.asarray(values)
        if v.ndim != 2 or v.shape[1] != self.d:
            raise LDPError(f"values must have shape (n, {self.d}), got {v.shape}")
        if v.size and not np.issubdtype(v.dtype, np.integer):
            raise LDPError(f"values must be integers, got dtype {v.dtype}")
        v = v.astype(np.int64, copy=False)
        if v.size:
            bad = (v < 0) | (v >= np.asarray(self.ks, dtype=np.int64))
            if bad.any():
                i, j = np.argwhere(bad)[0]
                raise LDPError(f"value {v[i, j]} of attribute {j} is outside the domain [0, {self.ks[j]})")
        return v

    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None,
                  state: MultiState | None = None) -> MultiReports:
        """One step of ``n`` devices (row ``i`` of ``values`` and of ``state`` = device ``i``).

        ``rng=None``: every draw from the OS CSPRNG / ChaCha20 streams; a Generator is the labelled
        simulation mode. ``state`` may be omitted only by solutions that keep nothing (memoryless
        channels and no fixed sampling); then nothing is accounted.
        """
        v = self.check_values(values)
        n = v.shape[0]
        if state is None:
            if self._needs_state:
                raise LDPError(f"{self.name} keeps device state: pass state=solution.new_state(n_devices)")
        else:
            self.check_state(state, n)
        sampled = None
        if self.layout != "split":
            if self.sampling == "per-step" or state is None:
                sampled = uniform_draws(rng, n, self.d).astype(uint_dtype(self.d))
                if state is not None:
                    state.sampled[:] = sampled  # type: ignore[index]
            else:
                sampled = state.sampled  # type: ignore[union-attr]
        layout = {"split": self._randomize_split, "sample": self._randomize_sample, "fake": self._randomize_fake}
        return layout[self.layout](v, rng, state, sampled)

    @staticmethod
    def _count(state: MultiState | None, rows: np.ndarray | slice, j: int) -> None:
        if state is not None:
            r = state.reported[rows, j]
            state.reported[rows, j] = np.where(r < 255, r + 1, r)

    def _randomize_split(self, v, rng, state, sampled) -> MultiReports:
        everyone = np.arange(v.shape[0], dtype=np.int64)
        reports = []
        for j, c in enumerate(self.channels):
            memo = None if state is None else state.memos[j]
            reports.append(c.randomize(v[:, j], rng, state=memo))
            self._count(state, slice(None), j)
        return MultiReports(reports, [everyone] * self.d)

    def _randomize_sample(self, v, rng, state, sampled) -> MultiReports:
        order = np.argsort(sampled, kind="stable")
        bounds = np.cumsum(np.bincount(sampled, minlength=self.d))[:-1]
        reports, senders = [], []
        for j, (c, rows) in enumerate(zip(self.channels, np.split(order.astype(np.int64), bounds))):
            memo = None if state is None else state.memos[j]
            if rows.size == 0:
                r = np.empty((0, *c.report_shape), dtype=c.report_dtype)
            elif memo is None:
                r = c.randomize(v[rows, j], rng)
            else:
                sub = memo.subset(rows)  # copies (fancy index): write the memo marks back
                r = c.randomize(v[rows, j], rng, state=sub)
                memo.seen[rows] = sub.seen
            self._count(state, rows, j)
            reports.append(r)
            senders.append(rows)
        return MultiReports(reports, senders)

    def _randomize_fake(self, v, rng, state, sampled) -> MultiReports:
        n = v.shape[0]
        everyone = np.arange(n, dtype=np.int64)
        reports = []
        assert self.fake_laws is not None
        for j, (c, law) in enumerate(zip(self.channels, self.fake_laws)):
            real = sampled == j
            if self.longitudinal:
                # the channel of the true value (sampled) or of the device's fixed fake input; fake
                # inputs are not marked as memoized (they cost nothing: module doc)
                memo = state.memos[j]
                inputs = np.where(real, v[:, j], state.fake[:, j])
                fake_rows = np.flatnonzero(~real)
                saved = memo.seen[fake_rows] if memo is not None else None
                r = c.randomize(inputs, rng, state=memo)
                if memo is not None:
                    memo.seen[fake_rows] = saved
            elif law == _UNIFORM:  # RS+FD[OUE-r]: the channel of a fresh uniform value
                r = c.randomize(np.where(real, v[:, j], uniform_draws(rng, n, c.k)), rng)
            else:
                rows, fake_rows = np.flatnonzero(real), np.flatnonzero(~real)
                r = np.empty((n, *c.report_shape), dtype=c.report_dtype)
                r[rows] = c.randomize(v[rows, j], rng)
                if law == _RAW_UNIFORM:  # RS+FD[GRR]: a uniform value, not randomized
                    r[fake_rows] = uniform_draws(rng, fake_rows.size, c.k)
                elif fake_rows.size:  # RS+FD[OUE-z]: OUE of the all-zero vector (every bit 1 w.p. q)
                    t = threshold32(c.q)  # type: ignore[attr-defined]
                    r[fake_rows] = kernels.ue_chain_randomize(np.zeros(fake_rows.size, dtype=np.int64), NO_KEYS,
                                                              False, NO_SEEN, noise_key(rng), t, t, *UE_NO_IRR, c.k)
            self._count(state, real, j)
            reports.append(r)
        return MultiReports(reports, [everyone] * self.d)

    # ------------------------------------------------------------------ server side
    def support(self, out: MultiReports) -> list[np.ndarray]:
        """Per attribute, ``channels[j].support(out.reports[j])`` (``int64``; additive over report sets)."""
        if len(out.reports) != self.d:
            raise InvalidReports(f"{self.name} expects reports of {self.d} attributes, got {len(out.reports)}")
        return [c.support(r) for c, r in zip(self.channels, out.reports)]

    def report_counts(self, out: MultiReports) -> list[int]:
        """Per attribute, the number of reports counted."""
        return [int(np.asarray(r).shape[0]) for r in out.reports]

    def estimate(self, j: int, counts: np.ndarray, n: int, postprocess: str | None = None) -> np.ndarray:
        """Unbiased frequencies of attribute ``j`` from its support counts and its number of reports ``n``."""
        return self.attribute_protocol(j).estimate(counts, n, postprocess=postprocess)

    @property
    def _n_factor(self) -> float:
        """Devices per report of one attribute: ``d`` when each device reports one sampled attribute."""
        return float(self.d) if self.layout == "sample" else 1.0

    def variance(self, j: int, n_devices: int) -> float:
        """Var* (true frequency → 0) of attribute ``j``'s estimate after one step of ``n_devices`` devices
        in all: ``attribute_protocol(j).variance(n_devices)`` when every device reports attribute ``j``
        (split, fake data: CIKM 2021's RS+FD variances), ``d`` times it when each device reports one
        sampled attribute (``n/d`` reports of ``j``, DCN 2022, Eq. 8)."""
        return self._n_factor * float(self.attribute_protocol(j).variance(n_devices))

    def variance_exact(self, j: int, f: np.ndarray | float, n_devices: int) -> np.ndarray:
        """Exact variance of attribute ``j``'s estimate of a value of true frequency ``f`` (as :meth:`variance`)."""
        return self._n_factor * np.asarray(self.attribute_protocol(j).variance_exact(f, n_devices))


class _Plain(Solution):
    """A solution with one protocol for every attribute (SPL, SMP, L-SPL, L-SMP, L-RS+FD)."""

    def _build(self, ks, protocol: str, budget: dict[str, float | None], protocol_params, *,
               sampling: str | None = None, extra: dict[str, Any] | None = None,
               fake_law: str | None = None) -> None:
        ks = _check_ks(ks)
        per = _per_attribute(protocol_params, len(ks))
        if sampling is not None:
            _check_choice("sampling", sampling, SAMPLINGS)
        channels = [_channel(protocol, k, budget, p, self.longitudinal, self.name) for k, p in zip(ks, per)]
        choices = [(c.name, f"fixed by the solution (protocol={protocol!r})") for c in channels]
        params = {"ks": list(ks), **self._budget_params, "protocol": protocol,
                  "protocol_params": protocol_params, **({} if sampling is None else {"sampling": sampling}),
                  **(extra or {})}
        self._setup(ks, channels, choices, params, sampling,
                    None if fake_law is None else [fake_law] * len(ks))


class SPL(_Plain):
    """Split the budget: every attribute with ``ε/d`` (DCN 2022, §3, Eq. 7)."""

    name: ClassVar[str] = "SPL"
    longitudinal: ClassVar[bool] = False
    layout: ClassVar[Layout] = "split"

    def __init__(self, ks: Sequence[int], eps: float, protocol: str,
                 protocol_params: dict | list | None = None) -> None:
        self.eps = check_eps("eps", eps)
        self._budget_params = {"eps": self.eps}
        self._build(ks, protocol, {"eps": self.eps / len(_check_ks(ks))}, protocol_params)


class SMP(_Plain):
    """Sample one attribute per device, reported with the whole ``ε`` (DCN 2022, §3, Eq. 8, ``r = 1``)."""

    name: ClassVar[str] = "SMP"
    longitudinal: ClassVar[bool] = False
    layout: ClassVar[Layout] = "sample"

    def __init__(self, ks: Sequence[int], eps: float, protocol: str, protocol_params: dict | list | None = None,
                 sampling: str = "fixed") -> None:
        self.eps = check_eps("eps", eps)
        self._budget_params = {"eps": self.eps}
        self._build(ks, protocol, {"eps": self.eps}, protocol_params, sampling=sampling)


def _longitudinal_budget(eps_inf: float, eps_1: float | None) -> tuple[float, float | None]:
    return check_eps("eps_inf", eps_inf), None if eps_1 is None else check_eps("eps_1", eps_1)


class LSPL(_Plain):
    """L-SPL: every attribute through a longitudinal protocol with ``ε∞/d`` and ``ε1/d`` (multi-freq-ldpy's
    L_SPL; Arcolezi et al., DCN 2022, §3 with the memoized protocols of §4)."""

    name: ClassVar[str] = "L-SPL"
    longitudinal: ClassVar[bool] = True
    layout: ClassVar[Layout] = "split"

    def __init__(self, ks: Sequence[int], eps_inf: float, protocol: str, eps_1: float | None = None,
                 protocol_params: dict | list | None = None) -> None:
        self.eps_inf_total, self.eps_1_total = _longitudinal_budget(eps_inf, eps_1)
        self._budget_params = {"eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total}
        d = len(_check_ks(ks))
        self._build(ks, protocol, {"eps_inf": self.eps_inf_total / d,
                                   "eps_1": None if eps_1 is None else self.eps_1_total / d}, protocol_params)


class LSMP(_Plain):
    """L-SMP: one sampled attribute per device through a longitudinal protocol with the whole ``ε∞``, ``ε1``
    (DCN 2022, §3-4; multi-freq-ldpy's L_SMP)."""

    name: ClassVar[str] = "L-SMP"
    longitudinal: ClassVar[bool] = True
    layout: ClassVar[Layout] = "sample"

    def __init__(self, ks: Sequence[int], eps_inf: float, protocol: str, eps_1: float | None = None,
                 protocol_params: dict | list | None = None, sampling: str = "fixed") -> None:
        self.eps_inf_total, self.eps_1_total = _longitudinal_budget(eps_inf, eps_1)
        self._budget_params = {"eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total}
        self._build(ks, protocol, {"eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total}, protocol_params,
                    sampling=sampling)


def _amplify(amplification: str, eps: float | None, d: int) -> float | None:
    _check_choice("amplification", amplification, AMPLIFICATIONS)
    return None if eps is None else amplified_eps(eps, d) if amplification == "paper" else eps


class LRSFD(_Plain):
    """L-RS+FD (beyond the papers; DCN 2022, §6 names it): one sampled attribute per device through a
    longitudinal protocol with the amplified ``ε∞' = ln(d(e^ε∞ - 1) + 1)`` and ``ε1'`` (likewise); every
    other attribute reports the same protocol applied to the device's FIXED fake input (uniform over the
    protocol's memo cells, drawn once and kept in the state), memoized like a real value, so fake
    reports are as persistent over time as real ones. Estimator and variance: module doc with
    ``π = 1/cells``; privacy: ``eps_first``/``eps_inf`` are the amplified channel figures (tuple-level),
    the accounting is the sampled attribute's (module doc)."""

    name: ClassVar[str] = "L-RS+FD"
    longitudinal: ClassVar[bool] = True
    layout: ClassVar[Layout] = "fake"

    def __init__(self, ks: Sequence[int], eps_inf: float, protocol: str, eps_1: float | None = None,
                 protocol_params: dict | list | None = None, sampling: str = "fixed",
                 amplification: str = "paper") -> None:
        self.eps_inf_total, self.eps_1_total = _longitudinal_budget(eps_inf, eps_1)
        self._budget_params = {"eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total}
        d = len(_check_ks(ks))
        budget = {"eps_inf": _amplify(amplification, self.eps_inf_total, d),
                  "eps_1": _amplify(amplification, self.eps_1_total, d)}
        self._build(ks, protocol, budget, protocol_params, sampling=sampling,
                    extra={"amplification": amplification}, fake_law=_UNIFORM)


class RSFD(Solution):
    """RS+FD (Arcolezi et al., CIKM 2021): one sampled attribute reported with ``ε' = ln(d(e^ε - 1) + 1)``,
    fake data for the others. ``protocol``: ``"GRR"`` (fake: a uniform value, not randomized),
    ``"OUE-z"`` (fake: OUE of the all-zero vector), ``"OUE-r"`` (fake: OUE of a uniform value) or
    ``"ADP"`` (per attribute GRR or OUE-z, whichever has the smaller RS+FD Var*, as the CIKM paper's
    RS+FD[ADP]). Estimators and variances: module doc; ``eps_first`` is the tuple-level ``ε'``."""

    name: ClassVar[str] = "RS+FD"
    longitudinal: ClassVar[bool] = False
    layout: ClassVar[Layout] = "fake"

    def __init__(self, ks: Sequence[int], eps: float, protocol: str, sampling: str = "fixed",
                 amplification: str = "paper") -> None:
        ks = _check_ks(ks)
        d = len(ks)
        self.eps = check_eps("eps", eps)
        _check_choice("protocol", protocol, RSFD_PROTOCOLS)
        _check_choice("sampling", sampling, SAMPLINGS)
        amp = _amplify(amplification, self.eps, d)
        channels, choices, laws = [], [], []
        for k in ks:
            grr, oue = make("GRR", k=k, eps=amp), make("OUE", k=k, eps=amp)
            if protocol == "ADP":
                vg = _pure_var_star(*fake_data_probabilities(grr, d, _RAW_UNIFORM))
                vo = _pure_var_star(*fake_data_probabilities(oue, d, _ZERO))
                pick = "GRR" if vg <= vo else "OUE-z"
                why = (f"{pick}: smaller RS+FD Var* ({vg:.6g} for GRR vs {vo:.6g} for OUE-z, per device at n = 1; "
                       f"k = {k}, ε' = {amp:.6g})")
            else:
                pick, why = protocol, f"fixed by the solution (protocol={protocol!r})"
            channels.append(grr if pick == "GRR" else oue)
            laws.append({"GRR": _RAW_UNIFORM, "OUE-z": _ZERO, "OUE-r": _UNIFORM}[pick])
            choices.append((pick, why))
        params = {"ks": list(ks), "eps": self.eps, "protocol": protocol, "sampling": sampling,
                  "amplification": amplification}
        self._setup(ks, channels, choices, params, sampling, laws)


class ALLOMFREE(Solution):
    """ALLOMFREE (Arcolezi et al., DCN 2022, Alg. 1): L-SMP with, per attribute, L-GRR or L-OSUE, whichever
    has the smaller variance (Var*, Eq. 11, with the library's ``calibration``: ``"exact"`` by default,
    so the choice can differ from the paper's; ``choices[j]`` says why).

    ``objective="loss"`` (beyond the paper) also considers LOLOHA (OLOLOHA's ``g``, Arcolezi et al.,
    EDBT 2023, Eq. 6) and picks, among the candidates whose Var* is at most ``variance_factor`` times the
    smallest, the one of smallest worst-case longitudinal loss (``worst_case_loss``), ties (equal losses) broken
    by the smaller Var*. L-GRR and L-OSUE have the same bound (``k ε∞``), and LOLOHA's is unbounded against a
    server that knows its public hash seed (:mod:`estimators.seedaware`; the paper's ``g ε∞`` does not hold),
    so LOLOHA is never picked and the objective gives the variance rule's choice.

    ``fake_data=True`` (beyond the paper, its §6 future work) is L-RS+FD with the per-attribute choice,
    by the smaller L-RS+FD variance, at the amplified budgets (``amplification="paper"``) or the given
    ones (``"none"``).
    """

    name: ClassVar[str] = "ALLOMFREE"
    longitudinal: ClassVar[bool] = True
    layout: ClassVar[Layout] = "sample"  # "fake" on instances with fake_data=True

    def __init__(self, ks: Sequence[int], eps_inf: float, eps_1: float, calibration: str = "exact",
                 objective: str = "variance", fake_data: bool = False, sampling: str = "fixed",
                 amplification: str = "paper", variance_factor: float = LOSS_VARIANCE_FACTOR) -> None:
        from .longitudinal import CALIBRATIONS

        ks = _check_ks(ks)
        d = len(ks)
        self.eps_inf_total, self.eps_1_total = check_eps("eps_inf", eps_inf), check_eps("eps_1", eps_1)
        _check_choice("calibration", calibration, CALIBRATIONS)
        _check_choice("objective", objective, OBJECTIVES)
        _check_choice("sampling", sampling, SAMPLINGS)
        if not isinstance(fake_data, bool):
            raise LDPError(f"fake_data must be true or false, got {fake_data!r}")
        variance_factor = float(variance_factor)
        if not np.isfinite(variance_factor) or variance_factor < 1.0:
            raise LDPError(f"variance_factor must be a number >= 1, got {variance_factor!r}")
        self.layout = "fake" if fake_data else "sample"  # type: ignore[misc]
        if fake_data:
            ei, e1 = _amplify(amplification, self.eps_inf_total, d), _amplify(amplification, self.eps_1_total, d)
        else:
            _check_choice("amplification", amplification, AMPLIFICATIONS)
            ei, e1 = self.eps_inf_total, self.eps_1_total
        names = ("L-GRR", "L-OSUE") + (("LOLOHA",) if objective == "loss" else ())
        channels, choices = [], []
        for k in ks:
            cands = [make(nm, k=k, eps_inf=ei, eps_1=e1, calibration=calibration) for nm in names]
            var = [self._var_star(c, d, fake_data) for c in cands]
            pick, why = self._choose(cands, var, objective, variance_factor)
            tag = (f"calibration {calibration!r}" + (", L-RS+FD variance with fake data" if fake_data else "")
                   + f", k = {k}, ε∞ = {ei:.6g}, ε1 = {e1:.6g}")
            channels.append(cands[pick])
            choices.append((cands[pick].name, f"{why} ({tag})"))
        params = {"ks": list(ks), "eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total, "calibration": calibration,
                  "objective": objective, "fake_data": fake_data, "sampling": sampling, "amplification": amplification,
                  "variance_factor": variance_factor}
        self._setup(ks, channels, choices, params, sampling, [_UNIFORM] * d if fake_data else None)

    @staticmethod
    def _var_star(channel: FrequencyProtocol, d: int, fake_data: bool) -> float:
        """Per-device Var* (n = 1) of the attribute's estimate: the channel's (SMP multiplies every
        candidate by the same ``d``) or, with fake data, the L-RS+FD one."""
        if fake_data:
            return _pure_var_star(*fake_data_probabilities(channel, d, _UNIFORM))
        return float(channel.variance(1))

    @staticmethod
    def _choose(cands: list[FrequencyProtocol], var: list[float], objective: str,
                factor: float) -> tuple[int, str]:
        best = int(np.argmin(var))  # first of equal variances: L-GRR on ties, as DCN 2022, Alg. 1 line 6
        listing = ", ".join(f"{c.name} {v:.6g}" for c, v in zip(cands, var))
        if objective == "variance":
            return best, f"{cands[best].name}: smallest Var* ({listing})"
        ok = [i for i, v in enumerate(var) if v <= factor * var[best]]
        loss = {i: float(cands[i].worst_case_loss) for i in ok}
        low = min(loss.values())
        tied = [i for i in ok if loss[i] <= low * (1 + _LOSS_RTOL)]
        pick = min(tied, key=lambda i: var[i])
        losses = ", ".join(f"{cands[i].name} {loss[i]:.6g}" for i in ok)
        return pick, (f"{cands[pick].name}: smallest worst-case longitudinal loss ({losses}) among the candidates "
                      f"with Var* <= {factor:g} x the smallest ({listing})")


def report_protocol(proto: FrequencyProtocol) -> FrequencyProtocol:
    """The single-attribute protocol whose reports ``proto`` carries: a group attribute's channel, an adaptive
    protocol's choice (what a wire codec, a test oracle or a plausibility check must know)."""
    while True:
        if isinstance(proto, AttributeView):
            proto = proto.channel
        elif isinstance(proto, Adaptive):
            proto = proto.chosen
        else:
            return proto
