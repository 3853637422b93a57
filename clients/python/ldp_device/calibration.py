"""From ε to probabilities: the calibration of every protocol, in the reference's float arithmetic.

Each function is the twin of the reference's (named in its docstring) with the same operations in the same
order; ``math.exp``/``math.log``/``math.log1p``/``math.expm1`` are the C library's functions, which numpy's
scalar functions agree with on the supported platforms (the test suite checks every calibrated parameter of
the randomizer vectors). Probabilities compared with 32-bit uniforms live on the 2^-32 grid
(:func:`ldp_device.streams.quantize32`).
"""
from __future__ import annotations

import math
from typing import Callable

from .errors import InfeasibleParameters, LDPError
from .streams import quantize32

__all__ = ["check_eps", "check_domain", "grr_probabilities", "sue_probabilities", "oue_probabilities", "grr_eps",
           "ue_eps", "Rounds", "grr_chain_eps_first", "solve", "grr_chain_p2", "sue_irr", "oue_irr", "CALIBRATIONS",
           "olh_g", "ololoha_g", "MAX_HASH_RANGE", "keep_probability", "hadamard_order", "ss_optimal_omega",
           "ss_probabilities", "the_probabilities", "the_optimal_theta", "amplified_eps", "pairwise_sum",
           "SHE_T_BITS", "SHE_TAIL", "SHE_MIN_EPS", "SHE_MAX_EPS", "she_noise_parameter", "she_slot_words"]

CALIBRATIONS = ("exact", "paper")
MAX_HASH_RANGE = 1 << 32


def check_eps(name: str, eps: float) -> float:
    """``float(eps)`` if finite and positive (``estimators.base.check_eps``)."""
    try:
        e = float(eps)
    except (TypeError, ValueError):
        raise LDPError(f"{name} must be a finite positive number, got {eps!r}") from None
    if isinstance(eps, bool) or not math.isfinite(e) or e <= 0:
        raise LDPError(f"{name} must be a finite positive number, got {e}")
    return e


def check_domain(k: int, minimum: int = 2) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or int(k) != k or k < minimum:
        raise LDPError(f"k must be an integer >= {minimum}, got {k}")
    return int(k)


# ---------------------------------------------------------------- direct and unary encoding
def grr_probabilities(eps: float, m: int) -> tuple[float, float]:
    """GRR over ``m`` values: ``p = e^ε / (e^ε + m - 1)``, ``q = 1 / (e^ε + m - 1)`` (``direct.grr_probabilities``)."""
    d = math.exp(eps) + m - 1
    return math.exp(eps) / d, 1.0 / d


def sue_probabilities(eps: float) -> tuple[float, float]:
    """SUE on the 2^-32 grid (``unary.sue_probabilities``)."""
    h = math.exp(eps / 2)
    return quantize32(h / (h + 1)), quantize32(1 / (h + 1))


def oue_probabilities(eps: float) -> tuple[float, float]:
    """OUE on the 2^-32 grid (``unary.oue_probabilities``)."""
    return 0.5, quantize32(1 / (math.exp(eps) + 1))


def grr_eps(p: float, q: float) -> float:
    return math.log(p / q)


def ue_eps(p: float, q: float) -> float:
    return math.log(p * (1.0 - q) / ((1.0 - p) * q))


# ---------------------------------------------------------------- the two-round framework
class Rounds:
    """Probabilities of the two rounds; ``q1s`` is the support-side ``q1`` (1/g for hashing)."""

    __slots__ = ("p1", "q1", "p2", "q2", "q1s")

    def __init__(self, p1: float, q1: float, p2: float, q2: float, q1s: float | None = None) -> None:
        self.p1, self.q1, self.p2, self.q2, self.q1s = p1, q1, p2, q2, q1s

    @property
    def ps(self) -> float:
        return self.p1 * self.p2 + (1.0 - self.p1) * self.q2

    @property
    def qs(self) -> float:
        q1 = self.q1 if self.q1s is None else self.q1s
        return q1 * self.p2 + (1.0 - q1) * self.q2


def grr_chain_eps_first(r: Rounds) -> float:
    ps = r.p1 * r.p2 + (1 - r.p1) * r.q2
    qs = r.q1 * r.p2 + (1 - r.q1) * r.q2
    return grr_eps(ps, qs)


def ue_chain_eps_first(r: Rounds) -> float:
    return ue_eps(r.ps, r.qs)


def solve(name: str, eps_of: Callable[[float], float], lo: float, hi: float, eps1: float, eps_inf: float) -> float:
    """Root of ``eps_of(θ) = eps1`` on (lo, hi) by bisection to adjacent floats (``longitudinal._solve``)."""
    if eps1 >= eps_inf:
        raise InfeasibleParameters(f"{name}: ε1 = {eps1:g} must be smaller than ε∞ = {eps_inf:g}")
    top = eps_of(hi)
    if not eps1 < top:
        raise InfeasibleParameters(
            f"{name} cannot reach ε1 = {eps1:g} with ε∞ = {eps_inf:g}: its IRR round caps a "
            f"single report at ε1 < {top:.6g} ({top / eps_inf:.3f} ε∞)")
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


def grr_chain_p2(p1: float, q1: float, m: int, eps1: float, eps_inf: float, calibration: str, name: str) -> float:
    """``p2`` of a GRR IRR round over ``m`` values (``longitudinal.grr_chain_p2``)."""
    if eps1 >= eps_inf:
        raise InfeasibleParameters(f"{name}: ε1 = {eps1:g} must be smaller than ε∞ = {eps_inf:g}")
    e = math.exp(eps1)
    a = 1.0 / (m - 1)
    if calibration == "paper":
        num = e * p1 * a - q1 * a
        den = p1 - q1 * a - e * q1 + e * p1 * a
    elif calibration == "exact":
        num = e * (1 - q1) * a - (1 - p1) * a
        den = p1 - (1 - p1) * a - e * q1 + e * (1 - q1) * a
    else:
        raise LDPError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
    p2 = num / den
    if not (1.0 / m < p2 <= 1.0):
        raise InfeasibleParameters(f"{name}: no IRR probability gives ε1 = {eps1:g} with ε∞ = {eps_inf:g}, m = {m}")
    return p2


def sue_irr(p1: float, q1: float, eps1: float, eps_inf: float, name: str) -> tuple[float, float]:
    p2 = solve(name, lambda p: ue_chain_eps_first(Rounds(p1, q1, p, 1 - p)), 0.5, 1.0 - 1e-15, eps1, eps_inf)
    return p2, 1.0 - p2


def oue_irr(p1: float, q1: float, eps1: float, eps_inf: float, name: str) -> tuple[float, float]:
    q2 = solve(name, lambda t: ue_chain_eps_first(Rounds(p1, q1, 0.5, 0.5 - t)), 0.0, 0.5 - 1e-15, eps1, eps_inf)
    return 0.5, 0.5 - q2


# ---------------------------------------------------------------- local hashing
def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def olh_g(eps: float) -> int:
    """OLH's ``g = round(e^ε + 1)`` (``hashing.olh_g``)."""
    g = _round_half_up(math.exp(eps) + 1.0)
    if g >= MAX_HASH_RANGE:
        raise InfeasibleParameters(f"OLH: ε = {eps:g} needs g = {g} >= 2^32 hash values")
    return max(2, g)


def ololoha_g(eps_inf: float, eps_1: float) -> int:
    """OLOLOHA's ``g`` (Arcolezi et al., EDBT 2023, Eq. 6; ``hashing.ololoha_g``)."""
    if not 0 < eps_1 < eps_inf:
        raise InfeasibleParameters(f"LOLOHA: ε1 = {eps_1:g} must lie in (0, ε∞ = {eps_inf:g})")
    a, b = math.exp(eps_inf), math.exp(eps_1)
    try:
        disc = a**4 - 14 * a**2 + 12 * a * b * (1 - a * b) + 12 * a**3 * b + 1
        r = (1 - a**2 + math.sqrt(max(disc, 0.0))) / (6 * (a - b))
    except (OverflowError, ZeroDivisionError):
        r = math.inf
    if not math.isfinite(r):
        raise InfeasibleParameters(f"LOLOHA: Eq. 6 overflows for ε∞ = {eps_inf:g}; pass g explicitly")
    g = 1 + max(1, _round_half_up(r))
    if g >= MAX_HASH_RANGE:
        raise InfeasibleParameters(f"LOLOHA: Eq. 6 gives g = {g} >= 2^32; pass g explicitly")
    return g


# ---------------------------------------------------------------- Hadamard response
def keep_probability(eps: float) -> float:
    """Binary RR ``p = 1 / (1 + e^-ε)`` (``hadamard._keep_probability``)."""
    return 1.0 / (1.0 + math.exp(-eps))


def hadamard_order(k: int) -> int:
    return 1 << int(k).bit_length()


# ---------------------------------------------------------------- subset selection
def ss_optimal_omega(k: int, eps: float) -> int:
    return max(1, int(math.floor(k / (math.exp(eps) + 1.0) + 0.5)))


def ss_probabilities(k: int, eps: float, omega: int) -> tuple[float, float]:
    d = omega * math.exp(eps) + k - omega
    ps = omega * math.exp(eps) / d
    out = (k - omega) / d
    qs = ps * (omega - 1) / (k - 1) + out * omega / (k - 1)
    return ps, qs


# ---------------------------------------------------------------- histogram encoding
def the_probabilities(eps: float, theta: float) -> tuple[float, float]:
    return 1.0 - 0.5 * math.exp(-eps * (1.0 - theta) / 2.0), 0.5 * math.exp(-eps * theta / 2.0)


def _sign(x: float) -> float:
    return 1.0 if x > 0 else -1.0 if x < 0 else 0.0


def _fminbound(func: Callable[[float], float], x1: float, x2: float, xatol: float, maxfun: int = 500) -> float:
    """Brent's bounded minimization, step for step ``scipy.optimize._optimize._minimize_scalar_bounded``
    (what ``minimize_scalar(method="bounded")`` runs), so that both sides find the same θ."""
    sqrt_eps = math.sqrt(2.2e-16)
    golden_mean = 0.5 * (3.0 - math.sqrt(5.0))
    a, b = x1, x2
    fulc = a + golden_mean * (b - a)
    nfc, xf = fulc, fulc
    rat = e = 0.0
    x = xf
    fx = func(x)
    num = 1
    ffulc = fnfc = fx
    xm = 0.5 * (a + b)
    tol1 = sqrt_eps * abs(xf) + xatol / 3.0
    tol2 = 2.0 * tol1
    while abs(xf - xm) > (tol2 - 0.5 * (b - a)):
        golden = 1
        if abs(e) > tol1:
            golden = 0
            r = (xf - nfc) * (fx - ffulc)
            q = (xf - fulc) * (fx - fnfc)
            p = (xf - fulc) * q - (xf - nfc) * r
            q = 2.0 * (q - r)
            if q > 0.0:
                p = -p
            q = abs(q)
            r = e
            e = rat
            if (abs(p) < abs(0.5 * q * r)) and (p > q * (a - xf)) and (p < q * (b - xf)):
                rat = (p + 0.0) / q
                x = xf + rat
                if ((x - a) < tol2) or ((b - x) < tol2):
                    si = _sign(xm - xf) + ((xm - xf) == 0)
                    rat = tol1 * si
            else:
                golden = 1
        if golden:
            e = a - xf if xf >= xm else b - xf
            rat = golden_mean * e
        si = _sign(rat) + (rat == 0)
        x = xf + si * max(abs(rat), tol1)
        fu = func(x)
        num += 1
        if fu <= fx:
            if x >= xf:
                a = xf
            else:
                b = xf
            fulc, ffulc = nfc, fnfc
            nfc, fnfc = xf, fx
            xf, fx = x, fu
        else:
            if x < xf:
                a = x
            else:
                b = x
            if (fu <= fnfc) or (nfc == xf):
                fulc, ffulc = nfc, fnfc
                nfc, fnfc = x, fu
            elif (fu <= ffulc) or (fulc == xf) or (fulc == nfc):
                fulc, ffulc = x, fu
        xm = 0.5 * (a + b)
        tol1 = sqrt_eps * abs(xf) + xatol / 3.0
        tol2 = 2.0 * tol1
        if num >= maxfun:
            break
    return xf


def the_optimal_theta(eps: float) -> float:
    """θ in (0.5, 1) minimizing THE's Var*, rounded to 1e-6 (``histogram.the_optimal_theta``)."""
    def var(theta: float) -> float:
        ps, qs = the_probabilities(eps, theta)
        return qs * (1.0 - qs) / (ps - qs) ** 2

    return round(float(_fminbound(var, 0.5, 1.0, 1e-10)), 6)


SHE_T_BITS = 48
SHE_DIGIT_BITS = 4
SHE_TAIL = 40
SHE_MIN_EPS = 1e-4
SHE_MAX_EPS = 64.0


def she_noise_parameter(eps: float) -> int:
    """``s = floor((ε/2) 2^48)`` (``histogram.she_noise_parameter``)."""
    return int(math.floor(math.ldexp(float(eps), SHE_T_BITS - 1)))


def she_slot_words(k: int, s: int, t_bits: int) -> int:
    """Noise-slot width of an SHE report (``kernels.she_slot_words``)."""
    alpha = math.exp(-s / 2.0 ** t_bits)
    per = 2.0 * (t_bits + 11) / ((1.0 - math.exp(-1.0)) * (1.0 + alpha))
    count = math.ceil(per * (k + math.sqrt(k)) / 64.0)
    return max(1, -(-int(count) // 8)) * 8


# ---------------------------------------------------------------- multidimensional solutions
def expm1(x: float) -> float:
    """``e^x - 1`` correctly rounded.

    numpy's ``expm1``/``log1p`` (SVML on AVX-512 hosts, the ones the randomizer vectors come from) are correctly
    rounded where the C library's are not (about 10% and 3% of arguments differ in the last bit), and the
    amplified ε' they compute is a channel parameter (it enters a group attribute's fingerprint): computed
    exactly here, in decimal arithmetic, it matches them."""
    if x == 0.0 or not math.isfinite(x) or abs(x) < 1e-300:
        return math.expm1(x)
    if x > 709.0:
        return math.inf
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 80
        d = Decimal(x)
        if abs(x) < 1e-3:
            total, term, n = Decimal(0), Decimal(1), 1
            while True:
                term = term * d / n
                total += term
                if abs(term) < abs(total) * Decimal("1e-78"):
                    break
                n += 1
            return float(total)
        return float(d.exp() - 1)


def log1p(x: float) -> float:
    """``ln(1 + x)`` correctly rounded (see :func:`expm1`)."""
    if x == 0.0 or not math.isfinite(x) or x <= -1.0 or abs(x) < 1e-300:
        return math.log1p(x)
    from decimal import Decimal, localcontext

    with localcontext() as ctx:
        ctx.prec = 80
        d = Decimal(x)
        if abs(x) < 1e-3:
            total, power, n = Decimal(0), Decimal(1), 1
            while True:
                power = power * d
                term = power / n if n % 2 else -power / n
                total += term
                if abs(term) < abs(total) * Decimal("1e-78"):
                    break
                n += 1
            return float(total)
        return float((1 + d).ln())


def amplified_eps(eps: float, d: int) -> float:
    """RS+FD's ``ε' = ln(d (e^ε - 1) + 1)`` (``multidim.amplified_eps``)."""
    return log1p(d * expm1(eps))


def pairwise_sum(values: list[float]) -> float:
    """numpy's float64 ``sum`` of a 1-d array (pairwise summation, 8 accumulators up to 128 values)."""
    n = len(values)
    if n < 8:
        res = 0.0
        for v in values:
            res += v
        return res
    if n <= 128:
        r = list(values[:8])
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] += values[i + j]
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for v in values[i:]:
            res += v
        return res
    half = n // 2
    half -= half % 8
    return pairwise_sum(values[:half]) + pairwise_sum(values[half:])
