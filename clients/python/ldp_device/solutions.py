"""Multidimensional solutions: ``d`` attributes per device under one total budget (``estimators/multidim.py``).

Every solution randomizes each attribute through a *channel* (an ordinary protocol) and differs in which
reports a device sends: SPL / L-SPL every attribute with a share of the budget; SMP / L-SMP / ALLOMFREE one
sampled attribute with the whole budget; RS+FD / L-RS+FD / ALLOMFREE(fake_data=True) the sampled attribute
with the amplified budget and fake data for every other one. A device's state (:class:`MultiState`) holds a
memo state per memoizing channel, the sampled attribute and the fixed fake inputs, drawn in the reference's
order (memo keys, then the sampled attribute, then the fake inputs; one 256-bit key each).
"""
from __future__ import annotations

import json
import math
from typing import Any, ClassVar, Sequence

from .base import MemoState, Protocol, fingerprint_of, uint_size
from .calibration import CALIBRATIONS, amplified_eps, check_eps, pairwise_sum
from .errors import InvalidState, LDPError
from .registry import construct, lookup, make, parameters
from .streams import NOISE, KeySource, Stream, os_key, threshold32
from .unary import NO_IRR, UEChain

__all__ = ["Solution", "MultiState", "AttributeView", "SOLUTIONS", "make_solution", "uniform_draw", "SPL", "SMP",
           "LSPL", "LSMP", "LRSFD", "RSFD", "ALLOMFREE"]

SAMPLINGS = ("fixed", "per-step")
AMPLIFICATIONS = ("paper", "none")
OBJECTIVES = ("variance", "loss")
RSFD_PROTOCOLS = ("GRR", "OUE-z", "OUE-r", "ADP")
LOSS_VARIANCE_FACTOR = 1.25
_LOSS_RTOL = 1e-6

_RAW_UNIFORM = "uniform value"
_UNIFORM = "channel of a uniform input"
_ZERO = "OUE of the all-zero vector"


def uniform_draw(draw_key: KeySource, m: int) -> int:
    """An integer uniform on ``[0, m)``: ``floor(u m)`` from word 0 of ``(fresh key, NOISE, 0)``
    (``multidim.uniform_draws`` for one device)."""
    return min(int(Stream(draw_key(), NOISE, 0, 8).unit(0) * m), m - 1)


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
    if protocol_params is None:
        return [{} for _ in range(d)]
    if isinstance(protocol_params, dict):
        return [dict(protocol_params) for _ in range(d)]
    if isinstance(protocol_params, (list, tuple)) and len(protocol_params) == d \
            and all(isinstance(p, dict) for p in protocol_params):
        return [dict(p) for p in protocol_params]
    raise LDPError(f"protocol_params must be a dict or a list of {d} dicts (one per attribute), "
                   f"got {protocol_params!r}")


def _channel(protocol: str, k: int, budget: dict[str, float | None], extra: dict, longitudinal: bool,
             solution: str) -> Protocol:
    takes = parameters(protocol)
    if ("eps_inf" in takes) != longitudinal:
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


def fake_data_probabilities(channel: Protocol, d: int, law: str) -> tuple[float, float]:
    ps, qs = float(channel.ps), float(channel.qs)  # type: ignore[attr-defined]
    pi = 0.0 if law == _ZERO else 1.0 / channel.domain_size
    phi = qs + (ps - qs) * pi
    return ps / d + (d - 1) * phi / d, qs / d + (d - 1) * phi / d


def _pure_var_star(ps: float, qs: float) -> float:
    return qs * (1.0 - qs) / (ps - qs) ** 2


def _representatives(channel: Protocol) -> list[int]:
    edges = getattr(channel, "bucket_edges", None)
    return edges()[:-1] if edges is not None else list(range(channel.domain_size))


class MultiState:
    """One device's state for one solution: per attribute a memo state (memoizing channels) or ``None``, the
    sampled attribute (``None`` for SPL / L-SPL), the fixed fake inputs (longitudinal fake-data solutions) and
    the real-data reports sent per attribute (saturating at 255)."""

    __slots__ = ("fingerprint", "sampled", "memos", "fake", "reported")

    def __init__(self, fingerprint: str, sampled: int | None, memos: list[MemoState | None],
                 fake: list[int] | None, reported: list[int]) -> None:
        self.fingerprint, self.sampled, self.memos, self.fake, self.reported = \
            fingerprint, sampled, memos, fake, reported

    @property
    def d(self) -> int:
        return len(self.reported)

    def copy(self) -> "MultiState":
        return MultiState(self.fingerprint, self.sampled, [None if m is None else m.copy() for m in self.memos],
                          None if self.fake is None else list(self.fake), list(self.reported))

    def to_json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "sampled": self.sampled,
                "memos": [None if m is None else m.to_json() for m in self.memos],
                "fake": self.fake, "reported": list(self.reported)}

    @classmethod
    def from_json(cls, obj: Any) -> "MultiState":
        try:
            memos = [None if m is None else MemoState.from_json(m) for m in obj["memos"]]
            reported = [int(r) for r in obj["reported"]]
            sampled = obj["sampled"]
            fake = obj["fake"]
            ok = (isinstance(obj["fingerprint"], str) and len(memos) == len(reported)
                  and (sampled is None or (isinstance(sampled, int) and 0 <= sampled < len(reported)))
                  and (fake is None or (isinstance(fake, list) and len(fake) == len(reported)
                                        and all(isinstance(x, int) for x in fake)))
                  and all(0 <= r <= 255 for r in reported))
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidState(f"malformed group state ({exc!r})") from None
        if not ok:
            raise InvalidState("malformed group state")
        return cls(obj["fingerprint"], sampled, memos, None if fake is None else list(fake), reported)


class AttributeView:
    """Attribute ``j`` of a solution as the campaign sees it: its parameters (hence its fingerprint, the one the
    ingest checks) are the solution's and the channel's; its reports are channel ``j``'s."""

    def __init__(self, solution: "Solution", j: int) -> None:
        self.solution, self.attribute = solution, j
        self.channel: Protocol = solution.channels[j]
        self.name = f"{solution.name}/{self.channel.name}"
        self.k = self.channel.k
        self.fingerprint = fingerprint_of(self.params())

    def params(self) -> dict[str, Any]:
        return {"protocol": self.name, "solution": self.solution.params(), "attribute": self.attribute,
                "channel": self.channel.params()}

    @property
    def domain_size(self) -> int:
        return self.channel.domain_size

    @property
    def memo_size(self) -> int:
        return 0  # a group's attributes are accounted by the group

    @property
    def report_nbytes(self) -> int:
        return self.channel.report_nbytes


class Solution:
    """A multidimensional solution: ``d`` channels, a layout (split / sample / fake) and the device state."""

    name: ClassVar[str]
    longitudinal: ClassVar[bool]
    layout: str

    def _setup(self, ks: tuple[int, ...], channels: Sequence[Protocol], choices: Sequence[tuple[str, str]],
               params: dict[str, Any], sampling: str | None = None, fake_laws: Sequence[str] | None = None) -> None:
        self.ks = ks
        self.channels = tuple(channels)
        self.choices = tuple(choices)
        self.sampling = sampling
        self.fake_laws = None if fake_laws is None else tuple(fake_laws)
        self._params = {"solution": self.name, **params}
        self.fingerprint = fingerprint_of(self.params())
        self._chains: dict[int, UEChain] = {}

    @property
    def d(self) -> int:
        return len(self.ks)

    def params(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._params))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self._params.items() if k != "solution")
        return f"{self.name}({inner})"

    def attribute_protocol(self, j: int) -> AttributeView:
        return AttributeView(self, j)

    # ------------------------------------------------------------------ privacy
    @property
    def _composes(self) -> bool:
        return self.layout == "split" or self.sampling == "per-step"

    @property
    def eps_first(self) -> float:
        e = [float(c.eps_first) for c in self.channels]
        return float(sum(e)) if self.layout == "split" else max(e)

    @property
    def eps_inf(self) -> float:
        if not self.longitudinal:
            return self.eps_first
        e = [float(c.eps_inf) for c in self.channels]
        return float(sum(e)) if self._composes else max(e)

    def loss_bound(self, memoized: int) -> float:
        """Worst-case device-level ε once a device memoized at most ``memoized`` inputs in every attribute."""
        losses = [float(c.longitudinal_loss(memoized)) for c in self.channels]
        return pairwise_sum(losses) if self._composes else max(losses)

    def memoized_cells(self, state: MultiState) -> list[int]:
        return [m.count() if m is not None else min(r, 2) for m, r in zip(state.memos, state.reported)]

    def longitudinal_loss(self, state: MultiState) -> float:
        """The device's longitudinal ε so far over all attributes (real data only)."""
        total = 0.0
        for c, cells in zip(self.channels, self.memoized_cells(state)):
            total += float(c.longitudinal_loss(cells))
        return total

    # ------------------------------------------------------------------ device side
    @property
    def needs_state(self) -> bool:
        return (any(c.memo_size for c in self.channels) or self.sampling == "fixed"
                or (self.layout == "fake" and self.longitudinal))

    def new_state(self, draw_key: KeySource = os_key) -> MultiState:
        """A fresh device: memo keys of the memoizing channels, the sampled attribute, the fixed fake inputs."""
        memos = [c.new_state(draw_key) for c in self.channels]
        sampled = uniform_draw(draw_key, self.d) if self.layout != "split" else None
        fake = None
        if self.layout == "fake" and self.longitudinal:
            fake = []
            for c in self.channels:
                reps = _representatives(c)
                fake.append(int(reps[uniform_draw(draw_key, len(reps))]))
        return MultiState(self.fingerprint, sampled, memos, fake, [0] * self.d)

    def check_state(self, state: MultiState) -> None:
        if state.fingerprint != self.fingerprint:
            raise InvalidState("device state belongs to another solution configuration "
                               f"(state {state.fingerprint}, solution {self.fingerprint})")
        bad = [j for j, (c, m) in enumerate(zip(self.channels, state.memos))
               if (m is None) != (c.memo_size == 0) or (m is not None and m.fingerprint != c.fingerprint)]
        if state.d != self.d or len(state.memos) != self.d or bad \
                or (state.sampled is None) != (self.layout == "split") \
                or (state.fake is None) != (self.layout != "fake" or not self.longitudinal):
            raise InvalidState(f"device state does not match {self.name}'s channels (attributes {bad})")

    def check_values(self, values: Sequence[int]) -> list[int]:
        v = list(values)
        if len(v) != self.d:
            raise LDPError(f"values must hold {self.d} values, got {len(v)}")
        out = []
        for j, (x, k) in enumerate(zip(v, self.ks)):
            if isinstance(x, bool) or not isinstance(x, int):
                raise LDPError(f"values must be integers, got {x!r}")
            if not 0 <= x < k:
                raise LDPError(f"value {x} of attribute {j} is outside the domain [0, {k})")
            out.append(int(x))
        return out

    def randomize(self, values: Sequence[int], draw_key: KeySource = os_key,
                  state: MultiState | None = None) -> list[bytes | None]:
        """One step of one device: per attribute its report bytes, or ``None`` where the solution sends none
        (SMP-like solutions report the sampled attribute only). Updates ``state`` (memo marks, the per-step
        sampled attribute, the real-data report counts)."""
        v = self.check_values(values)
        if state is None:
            if self.needs_state:
                raise LDPError(f"{self.name} keeps device state: pass state=solution.new_state()")
        else:
            self.check_state(state)
        sampled = None
        if self.layout != "split":
            if self.sampling == "per-step" or state is None:
                sampled = uniform_draw(draw_key, self.d)
                if state is not None:
                    state.sampled = sampled
            else:
                sampled = state.sampled
        if self.layout == "split":
            return self._split(v, draw_key, state)
        if self.layout == "sample":
            return self._sample(v, draw_key, state, sampled)
        return self._fake(v, draw_key, state, sampled)

    @staticmethod
    def _count(state: MultiState | None, j: int) -> None:
        if state is not None and state.reported[j] < 255:
            state.reported[j] += 1

    def _split(self, v, draw_key, state) -> list[bytes | None]:
        out: list[bytes | None] = []
        for j, c in enumerate(self.channels):
            out.append(c.randomize(v[j], draw_key, None if state is None else state.memos[j]))
            self._count(state, j)
        return out

    def _sample(self, v, draw_key, state, sampled) -> list[bytes | None]:
        out: list[bytes | None] = [None] * self.d
        c = self.channels[sampled]
        out[sampled] = c.randomize(v[sampled], draw_key, None if state is None else state.memos[sampled])
        self._count(state, sampled)
        return out

    def _fake(self, v, draw_key, state, sampled) -> list[bytes | None]:
        assert self.fake_laws is not None
        out: list[bytes | None] = []
        for j, (c, law) in enumerate(zip(self.channels, self.fake_laws)):
            real = sampled == j
            if self.longitudinal:
                # the channel of the true value (sampled) or of the fixed fake input, never marked as memoized
                memo = state.memos[j]
                saved = None if memo is None or real else bytearray(memo.seen)
                r = c.randomize(v[j] if real else state.fake[j], draw_key, memo)
                if saved is not None:
                    memo.seen = saved
            elif law == _UNIFORM:  # RS+FD[OUE-r]: the channel of a fresh uniform value (drawn in any case)
                u = uniform_draw(draw_key, c.k)
                r = c.randomize(v[j] if real else u, draw_key)
            elif real:
                r = c.randomize(v[j], draw_key)
            else:
                draw_key()  # the reference's call on no rows still draws its batch key
                if law == _RAW_UNIFORM:  # RS+FD[GRR]: a uniform value, not randomized
                    r = uniform_draw(draw_key, c.k).to_bytes(uint_size(c.k), "little")
                else:  # RS+FD[OUE-z]: OUE of the all-zero vector (every bit 1 w.p. q)
                    chain = self._chains.get(j)
                    if chain is None:
                        t = threshold32(c.q)  # type: ignore[attr-defined]
                        chain = self._chains[j] = UEChain(c.k, t, t, *NO_IRR, memo=False)
                    r = chain.run(0, draw_key(), None)
            if real:
                self._count(state, j)
            out.append(r)
        return out


class _Plain(Solution):
    def _build(self, ks, protocol: str, budget: dict[str, float | None], protocol_params, *,
               sampling: str | None = None, extra: dict[str, Any] | None = None, fake_law: str | None = None) -> None:
        ks = _check_ks(ks)
        per = _per_attribute(protocol_params, len(ks))
        if sampling is not None:
            _check_choice("sampling", sampling, SAMPLINGS)
        channels = [_channel(protocol, k, budget, p, self.longitudinal, self.name) for k, p in zip(ks, per)]
        choices = [(c.name, f"fixed by the solution (protocol={protocol!r})") for c in channels]
        params = {"ks": list(ks), **self._budget_params, "protocol": protocol,
                  "protocol_params": protocol_params, **({} if sampling is None else {"sampling": sampling}),
                  **(extra or {})}
        self._setup(ks, channels, choices, params, sampling, None if fake_law is None else [fake_law] * len(ks))


class SPL(_Plain):
    name: ClassVar[str] = "SPL"
    longitudinal: ClassVar[bool] = False
    layout = "split"

    def __init__(self, ks: Sequence[int], eps: float, protocol: str,
                 protocol_params: dict | list | None = None) -> None:
        self.eps = check_eps("eps", eps)
        self._budget_params = {"eps": self.eps}
        self._build(ks, protocol, {"eps": self.eps / len(_check_ks(ks))}, protocol_params)


class SMP(_Plain):
    name: ClassVar[str] = "SMP"
    longitudinal: ClassVar[bool] = False
    layout = "sample"

    def __init__(self, ks: Sequence[int], eps: float, protocol: str, protocol_params: dict | list | None = None,
                 sampling: str = "fixed") -> None:
        self.eps = check_eps("eps", eps)
        self._budget_params = {"eps": self.eps}
        self._build(ks, protocol, {"eps": self.eps}, protocol_params, sampling=sampling)


def _longitudinal_budget(eps_inf: float, eps_1: float | None) -> tuple[float, float | None]:
    return check_eps("eps_inf", eps_inf), None if eps_1 is None else check_eps("eps_1", eps_1)


class LSPL(_Plain):
    name: ClassVar[str] = "L-SPL"
    longitudinal: ClassVar[bool] = True
    layout = "split"

    def __init__(self, ks: Sequence[int], eps_inf: float, protocol: str, eps_1: float | None = None,
                 protocol_params: dict | list | None = None) -> None:
        self.eps_inf_total, self.eps_1_total = _longitudinal_budget(eps_inf, eps_1)
        self._budget_params = {"eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total}
        d = len(_check_ks(ks))
        self._build(ks, protocol, {"eps_inf": self.eps_inf_total / d,
                                   "eps_1": None if eps_1 is None else self.eps_1_total / d}, protocol_params)


class LSMP(_Plain):
    name: ClassVar[str] = "L-SMP"
    longitudinal: ClassVar[bool] = True
    layout = "sample"

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
    name: ClassVar[str] = "L-RS+FD"
    longitudinal: ClassVar[bool] = True
    layout = "fake"

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
    name: ClassVar[str] = "RS+FD"
    longitudinal: ClassVar[bool] = False
    layout = "fake"

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
                why = f"{pick}: smaller RS+FD Var* ({vg:.6g} for GRR vs {vo:.6g} for OUE-z)"
            else:
                pick, why = protocol, f"fixed by the solution (protocol={protocol!r})"
            channels.append(grr if pick == "GRR" else oue)
            laws.append({"GRR": _RAW_UNIFORM, "OUE-z": _ZERO, "OUE-r": _UNIFORM}[pick])
            choices.append((pick, why))
        params = {"ks": list(ks), "eps": self.eps, "protocol": protocol, "sampling": sampling,
                  "amplification": amplification}
        self._setup(ks, channels, choices, params, sampling, laws)


class ALLOMFREE(Solution):
    name: ClassVar[str] = "ALLOMFREE"
    longitudinal: ClassVar[bool] = True
    layout = "sample"

    def __init__(self, ks: Sequence[int], eps_inf: float, eps_1: float, calibration: str = "exact",
                 objective: str = "variance", fake_data: bool = False, sampling: str = "fixed",
                 amplification: str = "paper", variance_factor: float = LOSS_VARIANCE_FACTOR) -> None:
        ks = _check_ks(ks)
        d = len(ks)
        self.eps_inf_total, self.eps_1_total = check_eps("eps_inf", eps_inf), check_eps("eps_1", eps_1)
        _check_choice("calibration", calibration, CALIBRATIONS)
        _check_choice("objective", objective, OBJECTIVES)
        _check_choice("sampling", sampling, SAMPLINGS)
        if not isinstance(fake_data, bool):
            raise LDPError(f"fake_data must be true or false, got {fake_data!r}")
        variance_factor = float(variance_factor)
        if not math.isfinite(variance_factor) or variance_factor < 1.0:
            raise LDPError(f"variance_factor must be a number >= 1, got {variance_factor!r}")
        self.layout = "fake" if fake_data else "sample"
        if fake_data:
            ei, e1 = _amplify(amplification, self.eps_inf_total, d), _amplify(amplification, self.eps_1_total, d)
        else:
            _check_choice("amplification", amplification, AMPLIFICATIONS)
            ei, e1 = self.eps_inf_total, self.eps_1_total
        names = ("L-GRR", "L-OSUE") + (("LOLOHA",) if objective == "loss" else ())
        channels, choices = [], []
        for k in ks:
            cands = [make(nm, k=k, eps_inf=ei, eps_1=e1, calibration=calibration) for nm in names]
            var = [_pure_var_star(*fake_data_probabilities(c, d, _UNIFORM)) if fake_data else float(c.variance(1))
                   for c in cands]
            pick = self._choose(cands, var, objective, variance_factor)
            channels.append(cands[pick])
            choices.append((cands[pick].name, f"Var* {', '.join(f'{c.name} {v:.6g}' for c, v in zip(cands, var))}"))
        params = {"ks": list(ks), "eps_inf": self.eps_inf_total, "eps_1": self.eps_1_total, "calibration": calibration,
                  "objective": objective, "fake_data": fake_data, "sampling": sampling, "amplification": amplification,
                  "variance_factor": variance_factor}
        self._setup(ks, channels, choices, params, sampling, [_UNIFORM] * d if fake_data else None)

    @staticmethod
    def _choose(cands: list[Protocol], var: list[float], objective: str, factor: float) -> int:
        best = min(range(len(var)), key=lambda i: (var[i], i))  # first of equal variances (numpy's argmin)
        if objective == "variance":
            return best
        ok = [i for i, v in enumerate(var) if v <= factor * var[best]]
        loss = {i: float(cands[i].worst_case_loss) for i in ok}
        low = min(loss.values())
        tied = [i for i in ok if loss[i] <= low * (1 + _LOSS_RTOL)]
        return min(tied, key=lambda i: var[i])


SOLUTIONS: dict[str, type[Solution]] = {c.name: c for c in (SPL, SMP, RSFD, LSPL, LSMP, ALLOMFREE, LRSFD)}


def make_solution(solution: str, **params: Any) -> Solution:
    """Build a solution: ``make_solution("ALLOMFREE", ks=[2, 10, 300], eps_inf=2.0, eps_1=1.0)``."""
    return construct(lookup(SOLUTIONS, solution, "solution"), solution, params)
