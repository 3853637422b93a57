"""Empirical privacy audit of a protocol's single-report ε (in the spirit of LDP-Audit).

LDP-Audit (Arcolezi & Gambs, PETS 2024) checks an LDP implementation from the outside: run the
randomizer many times on two inputs ``v1 != v2``, count how often a *distinguishing event* ``E``
happens under each, and turn the counts into a statistical lower bound on ε. ε-LDP requires
``P(E | v1) <= e^ε P(E | v2)`` for every event, so a lower bound above the claimed ε is a proof
(at the chosen confidence) that the implementation leaks more than it states.

Here ``E`` is the protocol's own ``audit_event(reports, v1, v2)``: an event whose probability is
as large as possible under ``v1`` and as small as possible under ``v2``. The audit draws
``trials`` reports with input ``v1`` and ``trials`` with input ``v2``; a memoizing protocol gets a
NEW device for every trial (fresh memo keys), so one report per device is audited and the
theoretical value is the single-report ``proto.eps_first`` (ε1).

With hit counts ``c1``, ``c2`` out of ``n = trials`` each:

* point estimate ``ε̂ = ln(p̂1 / p̂2)`` with ``p̂i = ci / n``, and its two-sided interval
  ``[ln(L1/U2), ln(U1/L2)]`` from two-sided Clopper-Pearson intervals at level ``1 - α/2`` each;
* lower bound (one-sided, confidence ``1 - α``): the maximum of
  ``ln(CP_lower(c1) / CP_upper(c2))`` (event ``E``) and ``ln(CP_lower(n - c2) / CP_upper(n - c1))``
  (the complement ``¬E`` with the roles of ``v1`` and ``v2`` swapped, since ε-LDP also bounds
  ``P(¬E | v2) / P(¬E | v1)``). The two bounds rest on four one-sided Clopper-Pearson
  statements, each made at level ``α/4`` (Bonferroni), so the maximum is a valid lower bound
  with probability ``>= 1 - α``. ε >= 0 for every mechanism, so the bound is floored at 0.

Reports are drawn in chunks (default 200 000 per chunk) so a million trials of a k = 1024 unary
protocol never hold more than one chunk of reports and memo state in memory.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from scipy.stats import beta as _beta

from .base import FrequencyProtocol
from .errors import LDPError

ProgressCallback = Callable[[int, int], None]

DEFAULT_CHUNK = 200_000
CHUNK_BYTES = 64 << 20  # memory budget of one chunk's reports + memo state (SHE at k = 1024: 8 KiB a report)
_SLACK = 1e-9  # float slack of ``passed``: ε computed in float64 vs a bound that can meet it exactly


# ---------------------------------------------------------------- Clopper-Pearson
def _check_binomial(c: int, n: int) -> tuple[int, int]:
    if int(n) != n or n < 1:
        raise LDPError(f"n must be a positive integer, got {n}")
    if int(c) != c or not 0 <= c <= n:
        raise LDPError(f"count must be an integer in [0, {n}], got {c}")
    return int(c), int(n)


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise LDPError(f"alpha must lie in (0, 1), got {alpha}")
    return alpha


def cp_lower(c: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound: ``P(p >= L) >= 1 - alpha``; ``L`` = Beta(c, n-c+1) α-quantile."""
    c, n = _check_binomial(c, n)
    alpha = _check_alpha(alpha)
    return 0.0 if c == 0 else float(_beta.ppf(alpha, c, n - c + 1))


def cp_upper(c: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound: ``P(p <= U) >= 1 - alpha``; ``U`` = Beta(c+1, n-c) (1-α)-quantile."""
    c, n = _check_binomial(c, n)
    alpha = _check_alpha(alpha)
    return 1.0 if c == n else float(_beta.isf(alpha, c + 1, n - c))


def clopper_pearson(c: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of a binomial proportion at level ``confidence``."""
    alpha = 1.0 - _check_confidence(confidence)
    return cp_lower(c, n, alpha / 2), cp_upper(c, n, alpha / 2)


def _check_confidence(confidence: float) -> float:
    confidence = float(confidence)
    if not 0.0 < confidence < 1.0:
        raise LDPError(f"confidence must lie in (0, 1), got {confidence}")
    return confidence


def _log_ratio(a: float, b: float) -> float:
    """``ln(a / b)`` for probabilities, with the limits ``-inf`` (a = 0) and ``+inf`` (b = 0)."""
    if a <= 0.0:
        return -math.inf if b > 0.0 else math.nan
    if b <= 0.0:
        return math.inf
    return math.log(a / b)


def eps_point_estimate(c1: int, c2: int, n: int) -> float:
    """``ε̂ = ln(p̂1 / p̂2)`` (``inf`` if the event never happened under v2, ``nan`` if never at all)."""
    return _log_ratio(c1 / n, c2 / n)


def eps_interval(c1: int, c2: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided interval of ``ln(p1/p2)``: each ``pi`` in its two-sided CP interval at ``1 - α/2``."""
    alpha = 1.0 - _check_confidence(confidence)
    l1, u1 = clopper_pearson(c1, n, 1.0 - alpha / 2)
    l2, u2 = clopper_pearson(c2, n, 1.0 - alpha / 2)
    return _log_ratio(l1, u2), _log_ratio(u1, l2)


def eps_lower_bound(c1: int, c2: int, n: int, confidence: float = 0.95, complement: bool = True) -> float:
    """One-sided lower bound on ε at level ``confidence`` (Bonferroni over the bounds tested).

    ``E``: ``ln(CP_lower(c1) / CP_upper(c2))``; with ``complement`` also ``¬E`` with roles swapped:
    ``ln(CP_lower(n - c2) / CP_upper(n - c1))``. Each of the ``2 m`` one-sided CP statements
    (``m`` = number of events) is made at ``α / (2 m)``; the result is the largest bound, floored at 0.
    """
    alpha = 1.0 - _check_confidence(confidence)
    _check_binomial(c1, n)
    _check_binomial(c2, n)
    events = [(c1, c2)] + ([(n - c2, n - c1)] if complement else [])
    a = alpha / (2 * len(events))
    bounds = [_log_ratio(cp_lower(hi, n, a), cp_upper(lo, n, a)) for hi, lo in events]
    valid = [b for b in bounds if not math.isnan(b)]
    return max([0.0, *valid])


# ---------------------------------------------------------------- the audit
@dataclass(frozen=True)
class AuditResult:
    """Outcome of one audit: hit counts, ε̂ with its interval, the lower bound and the claimed ε1."""

    protocol: str
    params: dict
    v1: int
    v2: int
    trials: int
    confidence: float
    hits1: int
    hits2: int
    eps_hat: float
    eps_hat_ci: tuple[float, float]
    eps_lower: float
    eps_theory: float

    @property
    def passed(self) -> bool:
        """No evidence of a leak: the lower bound does not exceed the claimed ε1."""
        return self.eps_lower <= self.eps_theory + _SLACK

    @property
    def tightness(self) -> float:
        """``eps_lower / eps_theory`` (1 = the audit certifies the full claimed ε)."""
        return self.eps_lower / self.eps_theory if self.eps_theory > 0 else math.nan

    @property
    def p1_hat(self) -> float:
        return self.hits1 / self.trials

    @property
    def p2_hat(self) -> float:
        return self.hits2 / self.trials


def _check_input(proto: FrequencyProtocol, v: int, name: str) -> int:
    if isinstance(v, bool) or int(v) != v or not 0 <= v < proto.k:
        raise LDPError(f"{name} must be an integer value in [0, {proto.k}), got {v!r}")
    return int(v)


def _bytes_per_trial(proto: FrequencyProtocol) -> int:
    """Bytes of one report plus one device's memo state (keys and ``seen`` bitset)."""
    report = np.dtype(proto.report_dtype).itemsize * int(np.prod(proto.report_shape, dtype=np.int64))
    memo = 8 + (proto.memo_size + 7) // 8 if proto.memo_size else 0
    return max(1, report + memo)


def audit(proto: FrequencyProtocol, v1: int = 0, v2: int = 1, trials: int = 1_000_000, seed: int = 0,
          confidence: float = 0.95, on_progress: ProgressCallback | None = None,
          chunk: int = DEFAULT_CHUNK) -> AuditResult:
    """Audit ``proto``'s single-report ε with ``trials`` reports of ``v1`` and ``trials`` of ``v2``.

    Memoizing protocols get a new device (fresh memo key) per trial. Reports are drawn in chunks
    of at most ``chunk`` rows, fewer when one chunk of reports and memo state would exceed
    :data:`CHUNK_BYTES`. ``on_progress(done, total)`` is called after every chunk with the number
    of reports drawn so far out of ``2 * trials``.
    """
    v1 = _check_input(proto, v1, "v1")
    v2 = _check_input(proto, v2, "v2")
    if v1 == v2:
        raise LDPError(f"v1 and v2 must differ, got {v1} twice")
    if int(trials) != trials or trials < 1:
        raise LDPError(f"trials must be a positive integer, got {trials}")
    if int(chunk) != chunk or chunk < 1:
        raise LDPError(f"chunk must be a positive integer, got {chunk}")
    trials, chunk = int(trials), int(chunk)
    confidence = _check_confidence(confidence)

    memoizing = proto.memo_size > 0
    chunk = min(chunk, max(1024, CHUNK_BYTES // _bytes_per_trial(proto)))
    total, done = 2 * trials, 0
    hits = []
    for ss in np.random.SeedSequence(seed).spawn(2):  # one independent stream per input
        rng = np.random.default_rng(ss)
        v = v1 if not hits else v2
        count, left = 0, trials
        while left:
            m = min(chunk, left)
            values = np.full(m, v, dtype=np.int64)
            state = proto.new_state(m, rng=rng) if memoizing else None
            reports = proto.randomize(values, rng, state=state)
            event = np.asarray(proto.audit_event(reports, v1, v2))
            if event.shape != (m,):
                raise LDPError(f"{proto.name}.audit_event must return a boolean array of shape ({m},), "
                               f"got {event.dtype} {event.shape}")
            count += int(np.count_nonzero(event))
            left -= m
            done += m
            if on_progress is not None:
                on_progress(done, total)
        hits.append(count)

    c1, c2 = hits
    return AuditResult(
        protocol=proto.name, params=proto.params(), v1=v1, v2=v2, trials=trials, confidence=confidence,
        hits1=c1, hits2=c2,
        eps_hat=eps_point_estimate(c1, c2, trials),
        eps_hat_ci=eps_interval(c1, c2, trials, confidence),
        eps_lower=eps_lower_bound(c1, c2, trials, confidence),
        eps_theory=float(proto.eps_first),
    )


# ---------------------------------------------------------------- default cases
EPS = 1.0       # single-shot ε
EPS_INF = 2.0   # memoized ε∞
EPS_1 = 1.0     # requested single-report ε1 of memoizing protocols
_EPS_1_FALLBACK = (0.5, 0.4, 0.3)  # fractions of ε∞ tried when ε1 = 1 is infeasible


@dataclass(frozen=True)
class SkippedCase:
    """A default case that could not be built, and why."""

    name: str
    params: dict
    reason: str


@dataclass
class AuditPlan:
    """The default cases: buildable ``(name, params)`` pairs and the skipped ones."""

    cases: list[tuple[str, dict]] = field(default_factory=list)
    skipped: list[SkippedCase] = field(default_factory=list)


def _candidates(name: str, k: int) -> list[dict]:
    """Parameter sets to try for a protocol name (the first buildable one of each group wins)."""
    single = {"k": k, "eps": EPS}
    memo = {"k": k, "eps_inf": EPS_INF, "eps_1": EPS_1}
    if name in ("L-GRR", "L-ADP", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE"):
        return [memo]
    if name == "LOLOHA":
        return [memo, {**memo, "g": 2}]
    if name == "dBitFlipPM":
        # b = k so that the default inputs 0 and 1 fall in different buckets: with contiguous
        # buckets (⌊v b / k⌋) any b < k puts them together, their report distributions are equal
        # and the audit is vacuous (audit bucketed configurations with v2 >= k / b instead)
        return [{"k": k, "b": k, "d": 1, "eps_inf": EPS_INF},
                {"k": k, "b": k, "d": 2, "eps_inf": EPS_INF}]
    return [single]


_KNOWN = frozenset({"GRR", "SUE", "OUE", "BLH", "OLH", "SS", "SHE", "THE", "HR", "FHR", "ADP",
                    "L-GRR", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE", "L-ADP", "LOLOHA", "dBitFlipPM"})
# GRR chains differ between the calibrations; for UE chains Eq. 14 is exact, so both coincide
_BOTH_CALIBRATIONS = frozenset({"L-GRR", "L-ADP", "LOLOHA"})
_GENERIC = {"k": None, "eps": EPS, "eps_inf": EPS_INF, "eps_1": EPS_1}


def _fill_generic(cls: type, k: int) -> tuple[dict | None, str]:
    """Parameters of an unknown protocol from its constructor signature, or the reason why not."""
    params: dict[str, Any] = {}
    for p, spec in inspect.signature(cls.__init__).parameters.items():
        if p == "self" or spec.kind in (spec.VAR_POSITIONAL, spec.VAR_KEYWORD):
            continue
        if p in _GENERIC:
            params[p] = k if p == "k" else _GENERIC[p]
        elif spec.default is inspect.Parameter.empty:
            return None, f"no default audit value for required parameter {p!r}"
    return params, ""


def _build(name: str, params: dict) -> tuple[dict | None, str]:
    """``params`` (possibly with a smaller feasible ε1) if ``make`` accepts them, else the reason."""
    from . import make

    tries = [params]
    if "eps_1" in params and "eps_inf" in params:
        tries += [{**params, "eps_1": round(f * params["eps_inf"], 12)} for f in _EPS_1_FALLBACK
                  if f * params["eps_inf"] < params["eps_1"]]
    reason = ""
    for p in tries:
        try:
            make(name, **p)
        except Exception as exc:  # any constructor failure is recorded, never raised
            reason = f"{type(exc).__name__}: {exc}"
            continue
        return p, ""
    return None, reason


def plan_audit_cases(k: int = 8) -> AuditPlan:
    """Default audit cases for every registered protocol, and the cases that had to be skipped.

    Single-shot protocols use ε = 1; memoizing ones ε∞ = 2, ε1 = 1 (or 0.5/0.4/0.3 ε∞ when ε1 = 1
    is infeasible); L-GRR, L-ADP and LOLOHA are audited under both calibrations, LOLOHA with its
    default (optimal) g and with g = 2; dBitFlipPM with b = k and d = 1, 2.
    Unknown names get parameters from their constructor signature.
    """
    from . import PROTOCOLS
    from .registry import _REGISTRY

    plan = AuditPlan()
    for name in PROTOCOLS:
        cls = _REGISTRY[name]
        takes = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        known = _candidates(name, k) if name in _KNOWN else None
        if known is None:
            generic, why = _fill_generic(cls, k)
            if generic is None:
                plan.skipped.append(SkippedCase(name, {}, why))
                continue
            known = [generic]
        for base in known:
            variants = ([{**base, "calibration": c} for c in ("exact", "paper")]
                        if "calibration" in takes and name in _BOTH_CALIBRATIONS else [base])
            for params in variants:
                built, why = _build(name, params)
                if built is None:
                    plan.skipped.append(SkippedCase(name, params, why))
                else:
                    plan.cases.append((name, built))
    return plan


def default_audit_cases(k: int = 8) -> list[tuple[str, dict]]:
    """``(name, make-params)`` of every buildable default case (see :func:`plan_audit_cases`)."""
    return plan_audit_cases(k).cases


def audit_defaults(k: int = 8, trials: int = 1_000_000, seed: int = 0, confidence: float = 0.95,
                   on_progress: ProgressCallback | None = None) -> tuple[list[AuditResult], list[SkippedCase]]:
    """Audit every default case; ``on_progress(done, total)`` counts reports over all cases."""
    from . import make

    plan = plan_audit_cases(k)
    total = 2 * trials * len(plan.cases)
    results = []
    for i, (name, params) in enumerate(plan.cases):
        cb = None
        if on_progress is not None:
            offset = 2 * trials * i
            cb = lambda d, _t, o=offset: on_progress(o + d, total)  # noqa: E731
        results.append(audit(make(name, **params), trials=trials, seed=seed, confidence=confidence, on_progress=cb))
    return results, plan.skipped


def format_results(results: list[AuditResult], skipped: list[SkippedCase] = ()) -> str:
    """A plain-text table of audit results (and the skipped cases)."""
    def extra(p: dict) -> str:
        return " ".join(f"{k}={v}" for k, v in p.items() if k not in ("protocol", "k"))

    lines = [f"{'protocol':<11} {'params':<52} {'eps_theory':>10} {'eps_lower':>10} {'eps_hat':>8} "
             f"{'tight':>6} {'pass':>5}"]
    for r in results:
        lines.append(f"{r.protocol:<11} {extra(r.params):<52} {r.eps_theory:>10.4f} {r.eps_lower:>10.4f} "
                     f"{r.eps_hat:>8.4f} {r.tightness:>6.3f} {str(r.passed):>5}")
    for s in skipped:
        lines.append(f"{s.name:<11} SKIPPED {extra(s.params)}: {s.reason}")
    return "\n".join(lines)
