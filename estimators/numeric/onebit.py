"""1BitMean with α-point rounding and memoization for repeated collection (Ding, Kulkarni & Yekhanin,
"Collecting Telemetry Data Privately", NeurIPS 2017; below "DKY").

**1BitMean** (DKY, §2.1, Eq. 1). A value ``x in [0, m]`` is reported as one bit, ``1`` with probability
``1 / (e^ε + 1) + (x / m) (e^ε - 1) / (e^ε + 1)``; the ratio of the probabilities of either bit between two
values is at most ``e^ε`` (attained at ``x = 0, m``): ε-LDP. The mean estimate is
``σ̂ = (m / n) Σ_i (b_i (e^ε + 1) - 1) / (e^ε - 1)`` (DKY, §2.1, the estimator that follows Eq. 1), unbiased
since ``E[b]`` is affine in ``x``.
Here ``m = 1`` and the value is ``u = (x + 1) / 2`` of the unit input ``x in [-1, 1]``.

**α-point rounding** (DKY, §3.1). The range is cut into ``s`` buckets of width ``m / s``; each device draws
``α`` uniform once and for all and rounds a value in bucket ``[L, R)`` to ``R`` when it lies past the device's
α-point of the bucket, else to ``L``. Here (widths in units of the bucket) the device's ``α = unit(word)`` is
a 53-bit uniform of ``[0, 1)`` derived from its secret memo key (word 0 of the ChaCha20 stream
``(key, ONEBIT_ALPHA, 0)``: fixed forever, restored with the key), and ``x`` rounds up iff ``α < f``,
``f = u s - floor(u s)`` (DKY write ``x + α ≥ R`` with ``α`` uniform on ``[0, m/s)``: the same law with ``α``
reflected). Over ``α``, ``P[up] = ceil(f 2^53) / 2^53 = f`` up to ``2^-53``: the rounded point ``j'/s`` is an
unbiased estimate of ``u`` and its variance is the rounding term ``(u - L)(R - u) = f (1 - f) / s^2``.

**Memoization** (DKY, §3, following RAPPOR's PRR, Erlingsson, Pihur & Korolova, CCS 2014). The 1BitMean bit of
each rounded point ``j' in {0, ..., s}`` is computed once per device: ``1`` iff the top 53 bits of word 0 of
``(key, PRR, j')`` are below ``T_{j'}`` (a keyed PRF of the point compared with its 1BitMean probability).
A device whose value keeps rounding to the same point therefore sends the same bit every time, and a new bit
is revealed only when a new point is reached.

**Output perturbation** (DKY, §4), optional (``gamma > 0``): every report flips the memoized bit with
probability ``γ`` using fresh noise (the batch noise stream), so that a change of the memoized bit (of the
user's behaviour) is no longer certain from two reports.

**The implemented law** (exact integers). ``T_lo = ceil(2^53 / (e^ε + 1))``, ``step = floor((2^53 - 2 T_lo)
/ s)``, ``T_j = T_lo + j step`` (exactly affine in ``j``, so the estimator stays exactly unbiased), and the
flip threshold ``G = round(γ 2^53)``. The report of a device whose value rounds to ``j'`` is ``1`` with
probability ``P_{j'} = a0 + a1 j'``, ``a0 = (G 2^53 + (2^53 - 2G) T_lo) / 2^106``,
``a1 = (2^53 - 2G) step / 2^106``; for a fresh device (α and key unknown) ``P(x) = a0 + a1 (j + p_up)``.

**Privacy.**

* One report (:attr:`OneBitMean.eps_first`): ``log max(P_s / P_0, (1 - P_0) / (1 - P_s)) <= ε`` (with
  ``γ = 0``: ``log(T_s / T_lo) <= log((2^53 - T_lo) / T_lo) <= ε``).
* Repeated reports with the memo state (:meth:`OneBitMean.longitudinal_loss`): the memoized bit of each point
  is ``ε_memo``-LDP (:attr:`OneBitMean.eps_memo`, the ``γ = 0`` figure) and the reports are functions of the
  memoized bits of the points the device reached (plus value-independent flips). For two value histories that
  reach ``k`` distinct points with the same pattern (which reports share a point), the likelihood ratio of the
  whole view is at most ``e^{k ε_memo}``: ``ε_memo × min(k, s + 1)``, at most ``(s + 1) ε_memo`` however long
  the collection runs (our derivation of the guarantee DKY, §3.2, call "permanent memoization"), and
  ``ε_memo`` for a device whose value never leaves its point however many reports it sends.
* What memoization does not protect (DKY, §3.2 and §4): the *pattern* (a change of the reported bit proves
  that the rounded value changed; two reports with different bits are impossible for a constant user when
  ``γ = 0``). Output perturbation limits that: each report is the memoized bit flipped with probability ``γ``,
  so any one report's bit changes the view's likelihood by a factor at most ``(1 - γ) / γ`` whatever the
  memoized bit, and a single change is plausibly noise. It is not a bound over arbitrarily long histories.
* Without the memo state (``state=None``) every call is a fresh device (fresh α and bit): each report costs
  ``eps_first`` again.

**Estimator and variance.** The unit estimate of a report is ``x̂ = 2 (b - a0) / (a1 s) - 1``
(:meth:`OneBitMean.unit_outputs`; DKY's §2.1 estimator in the unit domain, with the implemented ``a0, a1``). Over a
fresh device ``b ~ Bernoulli(P(x))`` with ``P(x)`` affine, so ``E[x̂] = 2 (j + p_up) / s - 1 = x`` (up to
``2^-52``) and ``Var[x̂] = 4 P(x) (1 - P(x)) / (a1 s)^2`` (:meth:`OneBitMean.unit_variance`). Split by the
rounding (:meth:`OneBitMean.unit_variance_parts`): ``E_j'[4 P_j' (1 - P_j') / (a1 s)^2]`` (the bit's noise)
plus ``4 p_up (1 - p_up) / s^2`` (the rounding's ``(x - L)(R - x)``, in unit-domain scale), whose sum is the
same number because ``P`` is affine: α-point rounding costs no accuracy (DKY, §3.1: the same accuracy as
1BitMean, independent of ``s``), only the split changes.
"""
from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import InfeasibleParameters, InvalidReports, LDPError
from ..memo import MemoState
from ..randomness import KEY_WORDS, noise_key
from . import onebit_kernels as obk
from .base import NumericMechanism, linear_mean

__all__ = ["OneBitMean"]

_TWO53 = 1 << 53
_TWO106 = 1 << 106
MAX_S = 1 << 20


def _log_ratio(num: int, den: int) -> float:
    """``log(num / den)`` of two big integers, to double precision."""
    with localcontext() as ctx:
        ctx.prec = 60
        return float(Decimal(num).ln() - Decimal(den).ln())


class OneBitMean(NumericMechanism):
    """1BitMean with α-point rounding over ``s`` buckets, memoization and optional output perturbation ``gamma``
    (module doc). Reports: uint8 bits."""

    name = "1BitMean"
    longitudinal = True

    def __init__(self, eps: float, lo: float = -1.0, hi: float = 1.0, s: int = 16, gamma: float = 0.0) -> None:
        super().__init__(eps, lo, hi)
        if isinstance(s, bool) or int(s) != s or not 1 <= s <= MAX_S:
            raise LDPError(f"s (rounding buckets) must be an integer in [1, {MAX_S}], got {s!r}")
        self.s = int(s)
        gamma = float(gamma)
        if not 0.0 <= gamma < 0.5:
            raise LDPError(f"gamma (output perturbation) must lie in [0, 0.5), got {gamma}")
        self.gamma = gamma
        with localcontext() as ctx:
            ctx.prec = 60
            t_lo = int((Decimal(_TWO53) / (Decimal(self.eps).exp() + 1)).to_integral_value(rounding="ROUND_CEILING"))
        self.t_lo = max(1, t_lo)
        self.step = (_TWO53 - 2 * self.t_lo) // self.s
        if self.step < 1:
            raise InfeasibleParameters(f"1BitMean: ε = {self.eps} is too small for s = {self.s} buckets")
        self.t_hi = self.t_lo + self.s * self.step
        self.g = int(round(gamma * _TWO53))
        # P_j = (G 2^53 + (2^53 - 2G) T_j) / 2^106 = a0 + a1 j
        self._n0 = self.g * _TWO53 + (_TWO53 - 2 * self.g) * self.t_lo
        self._n1 = (_TWO53 - 2 * self.g) * self.step
        self.a0 = float(Fraction(self._n0, _TWO106))
        self.a1 = float(Fraction(self._n1, _TWO106))

    def params(self) -> dict[str, Any]:
        return {**super().params(), "s": self.s, "gamma": self.gamma}

    # ---------------------------------------------------------------- privacy
    @property
    def eps_first(self) -> float:
        """``log max(P_s / P_0, (1 - P_0) / (1 - P_s))`` of the implemented report law (module doc), ``<= eps``."""
        n_s = self._n0 + self.s * self._n1
        return max(_log_ratio(n_s, self._n0), _log_ratio(_TWO106 - self._n0, _TWO106 - n_s))

    @property
    def eps_memo(self) -> float:
        """ε of one memoized bit (no perturbation): ``log max(T_s / T_lo, (2^53 - T_lo) / (2^53 - T_s))``."""
        return max(_log_ratio(self.t_hi, self.t_lo), _log_ratio(_TWO53 - self.t_lo, _TWO53 - self.t_hi))

    @property
    def memo_size(self) -> int:
        """Memoizable rounded points ``{0, ..., s}``."""
        return self.s + 1

    def longitudinal_loss(self, distinct_points: np.ndarray | int) -> np.ndarray | float:
        """``ε_memo × min(k, s + 1)`` after ``k`` distinct rounded points reported (module doc; DKY, §3.2)."""
        k = np.minimum(np.maximum(np.asarray(distinct_points), 0), self.memo_size)
        loss = k * self.eps_memo
        return float(loss) if np.ndim(loss) == 0 else loss

    def state_loss(self, state: MemoState) -> np.ndarray:
        """The longitudinal loss of every device of a memo state so far."""
        return self.longitudinal_loss(state.memoized_count())

    def p_up(self, x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """``(j, P[round up])`` of unit inputs: the lower point and the exact rounding probability over α."""
        t = (np.asarray(x, dtype=np.float64) + 1.0) * 0.5 * self.s
        j = np.clip(np.floor(t), 0, self.s - 1)
        return j, np.ceil((t - j) * float(_TWO53)) / float(_TWO53)

    def p_one(self, x: np.ndarray | float) -> np.ndarray | float:
        """``P[report = 1 | x]`` for a fresh device (α and key unknown): ``a0 + a1 (j + p_up)``, exact."""
        j, pu = self.p_up(x)
        p = self.a0 + self.a1 * (j + pu)
        return float(p) if np.ndim(p) == 0 else p

    def output_mass(self, x: float, edges: np.ndarray) -> np.ndarray:
        """Mass of the output value ``x̂(b)`` (:meth:`unit_outputs`, two points) in each bin of ``edges``."""
        e = np.asarray(edges, dtype=np.float64)
        p = float(self.p_one(float(x)))
        out = np.zeros(e.shape[0] - 1, dtype=np.float64)
        for value, mass in zip(self.unit_outputs(np.array([0, 1])), (1.0 - p, p)):
            if e[0] <= value <= e[-1]:
                j = min(int(np.searchsorted(e, value, side="right")) - 1, out.shape[0] - 1)
                out[j] += mass
        return out

    # ---------------------------------------------------------------- device side
    def new_state(self, n_devices: int, rng: np.random.Generator | None = None) -> MemoState:
        """Memo state of new devices: 256-bit keys (OS CSPRNG, or the labelled simulation mode with ``rng``);
        each device's α and memoized bits are derived from its key (module doc)."""
        return MemoState.fresh(self.fingerprint, n_devices, self.memo_size, rng)

    def alphas(self, state: MemoState) -> np.ndarray:
        """The devices' α in ``[0, 1)`` (derived from their keys)."""
        return obk.onebit_alpha(np.ascontiguousarray(state.keys))

    def randomize(self, values: np.ndarray, rng: np.random.Generator | None = None,
                  state: MemoState | None = None) -> np.ndarray:
        """Reports (uint8 bits). Without ``state`` every row is a fresh device (α, bit and flip from the batch
        noise key); with ``state`` row ``i`` is device ``i``: its memoized bit of its rounded point (marked in
        ``state.seen``), flipped with probability γ by fresh noise (``rng`` keys that noise; unused when γ = 0)."""
        x, _ = self.prepare(values)
        x = np.ascontiguousarray(x)
        t_lo, step, g = np.uint64(self.t_lo), np.uint64(self.step), np.uint64(self.g)
        if state is None:
            return obk.onebit_randomize(x, noise_key(rng), self.s, t_lo, step, g)
        state.check(self.fingerprint, x.shape[0])
        nkey = noise_key(rng) if self.g > 0 else np.zeros(KEY_WORDS, dtype=np.uint32)
        return obk.onebit_randomize_memo(x, np.ascontiguousarray(state.keys), state.seen, nkey, self.s, t_lo, step, g)

    # ---------------------------------------------------------------- server side
    @property
    def report_dtype(self) -> np.dtype:
        return np.dtype(np.uint8)

    def validate_reports(self, reports: np.ndarray) -> None:
        super().validate_reports(reports)
        r = np.asarray(reports)
        if r.ndim != 1:
            raise InvalidReports(f"1BitMean reports are one bit each, got shape {r.shape}")
        if r.size and int(r.max()) > 1:
            raise InvalidReports("a 1BitMean report is not a bit (0 or 1)")

    def unit_outputs(self, reports: np.ndarray) -> np.ndarray:
        """Each report's unbiased unit estimate ``x̂ = 2 (b - a0) / (a1 s) - 1`` (module doc)."""
        return 2.0 * (np.asarray(reports, dtype=np.float64) - self.a0) / (self.a1 * self.s) - 1.0

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``[Σ b]`` (int64): the step's aggregate."""
        self.validate_reports(np.asarray(reports))
        return np.array([np.sum(reports, dtype=np.int64)], dtype=np.int64)

    def unit_estimate(self, support: np.ndarray, n: int) -> tuple[float, float]:
        """DKY's estimate (:meth:`estimate_unit_mean`) and the sample variance of ``x̂(b)`` over ``n``."""
        ones = int(support[0])
        if not 0 <= ones <= n:
            raise LDPError(f"1BitMean: {ones} one-bits among {n} reports")
        slope = 2.0 / (self.a1 * self.s)
        return linear_mean(ones, ones, n, slope, -slope * self.a0 - 1.0)

    def estimate_unit_mean(self, report_sum: float, n: int) -> float:
        """``2 (Σ b / n - a0) / (a1 s) - 1``: DKY's §2.1 estimator in the unit domain, implemented ``a0, a1``."""
        if n <= 0:
            raise LDPError("no report: no mean")
        return 2.0 * (float(report_sum) / n - self.a0) / (self.a1 * self.s) - 1.0

    def unit_variance(self, x: np.ndarray | float) -> np.ndarray | float:
        """``4 P(x) (1 - P(x)) / (a1 s)^2`` (module doc): 1BitMean's variance, rounding included."""
        p = np.asarray(self.p_one(x))
        v = 4.0 * p * (1.0 - p) / (self.a1 * self.s) ** 2
        return float(v) if np.ndim(v) == 0 else v

    def unit_variance_parts(self, x: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """``(bit noise, rounding)`` terms of :meth:`unit_variance` (module doc); they sum to it."""
        j, pu = self.p_up(x)
        p_lo, p_hi = self.a0 + self.a1 * j, self.a0 + self.a1 * (j + 1.0)
        bit = 4.0 * ((1.0 - pu) * p_lo * (1.0 - p_lo) + pu * p_hi * (1.0 - p_hi)) / (self.a1 * self.s) ** 2
        return bit, 4.0 * pu * (1.0 - pu) / self.s ** 2
