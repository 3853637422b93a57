"""Local hashing: BLH and OLH (Wang et al., USENIX Security 2017; as summarized in Wang et al.,
Sensors 2020, §3.1.3, Eqs. 34-43, and Arcolezi et al., EDBT 2023, §2.3.2) and its memoized
two-round version LOLOHA (Arcolezi et al., EDBT 2023, §3: Alg. 1 client, Alg. 2 server,
Thms. 3.3-3.5, Eq. 6 for OLOLOHA's g).

A device hashes its value into ``[0, g)`` with a hash function drawn from a universal family
and randomizes the hash value with GRR over ``[0, g)``; a report is ``(hash seed, y)``. The
server counts the reports that *support* each value, ``C(v) = #{reports : H_seed(v) = y}``
(an ``O(n k)`` loop, :func:`estimators.kernels.lh_support`), and every protocol here is pure
with ``qs = 1/g`` (Wang et al., Sensors 2020, Eq. 36; the ``q1' = 1/g`` of Arcolezi et al.,
EDBT 2023, Alg. 2).

**Hash family.** ``H_seed(v) = ((((a v + b) mod 2^64) >> 32) g) >> 32`` with ``(a, b)`` spread
from the 32-bit seed by the SplitMix64 finalizer (:func:`estimators.kernels.lh_coeffs`):
Dietzfelbinger's multiply-add-shift, which is strongly universal onto 32 bits for uniform
``(a, b)`` (here a pseudo-random member indexed by a 32-bit seed), followed by a multiply-shift
range reduction to ``[0, g)`` (bias at most ``g / 2^32`` per bucket). Identical in numba and
numpy (:func:`estimators.reference.lh_hash`); over ``v`` it is one add per value, so the
support loop vectorizes. The family is public: no secret enters it.

**Hash seeds.** Seeds are public (they travel in reports), so they come from ChaCha20 streams
of their own (:mod:`estimators.randomness`), never from the streams that drive the GRR coins.
Single-shot BLH/OLH draw a fresh seed per report (word ``row`` of the batch stream
``(noise key, LH_SEED, 1)``); LOLOHA fixes one seed per device for ever (EDBT 2023, Alg. 1
line 1), word 0 of ``(memo key, LH_SEED, 0)``, so it survives restarts with the memo state.

**Wire layout.** A packed structured array ``[("seed", "<u4"), ("y", uint8|uint16|uint32)]``
(``y`` in the smallest unsigned type holding ``g - 1``): 5 bytes per report for ``g <= 256``.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from . import kernels
from .base import PureProtocol, SingleShot, check_domain, check_eps, uint_dtype
from .direct import GRRChain, grr_probabilities
from .errors import InfeasibleParameters, InvalidReports, LDPError
from .kernels import NO_KEYS, NO_SEEN
from .longitudinal import NO_NOISE_KEY, Calibration, TwoRoundProtocol, grr_eps
from .memo import MemoState
from .randomness import noise_key

MAX_HASH_RANGE = 1 << 32  # g and k must fit the 32-bit hash input / output


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def _check_g(g: int) -> int:
    if isinstance(g, bool) or int(g) != g or not 2 <= g < MAX_HASH_RANGE:
        raise LDPError(f"g must be an integer in [2, 2^32), got {g}")
    return int(g)


def olh_g(eps: float) -> int:
    """OLH's hash range ``g = e^ε + 1`` rounded to the closest integer (Arcolezi et al., EDBT 2023,
    §2.3.2; the minimizer of Wang et al., Sensors 2020, Eq. 39)."""
    g = _round_half_up(float(np.exp(eps)) + 1.0)
    if g >= MAX_HASH_RANGE:
        raise InfeasibleParameters(f"OLH: ε = {eps:g} needs g = {g} >= 2^32 hash values")
    return max(2, g)


def ololoha_g(eps_inf: float, eps_1: float) -> int:
    """OLOLOHA's ``g`` (Arcolezi et al., EDBT 2023, Eq. 6), ``a = e^ε∞``, ``b = e^ε1``:

    ``g = 1 + max(1, round((1 - a² + sqrt(a⁴ - 14a² + 12ab(1 - ab) + 12a³b + 1)) / (6(a - b))))``.
    It minimizes Var* under the paper's calibration of ε_IRR (see :func:`loloha_optimal_g`).
    """
    if not 0 < eps_1 < eps_inf:
        raise InfeasibleParameters(f"LOLOHA: ε1 = {eps_1:g} must lie in (0, ε∞ = {eps_inf:g})")
    a, b = np.exp(eps_inf), np.exp(eps_1)
    with np.errstate(over="ignore", invalid="ignore"):
        disc = a**4 - 14 * a**2 + 12 * a * b * (1 - a * b) + 12 * a**3 * b + 1
        r = (1 - a**2 + np.sqrt(max(disc, 0.0))) / (6 * (a - b))
    if not np.isfinite(r):
        raise InfeasibleParameters(f"LOLOHA: Eq. 6 overflows for ε∞ = {eps_inf:g}; pass g explicitly")
    g = 1 + max(1, _round_half_up(float(r)))
    if g >= MAX_HASH_RANGE:
        raise InfeasibleParameters(f"LOLOHA: Eq. 6 gives g = {g} >= 2^32; pass g explicitly")
    return g


def loloha_var_star(g: int, eps_inf: float, eps_1: float, calibration: Calibration = "exact", n: int = 1) -> float:
    """Var* of LOLOHA with hash range ``g`` (Arcolezi et al., EDBT 2023, Eq. 5 with Alg. 2's
    parameters)."""
    return LOLOHA(2, eps_inf, eps_1, g=g, calibration=calibration).variance(n)


def loloha_optimal_g(eps_inf: float, eps_1: float, calibration: Calibration = "exact", g_max: int = 4096) -> int:
    """The integer ``g`` in ``[2, g_max]`` of smallest Var*, by direct search (checks Eq. 6)."""
    best, best_var = 2, np.inf
    for g in range(2, g_max + 1):
        try:
            v = loloha_var_star(g, eps_inf, eps_1, calibration)
        except InfeasibleParameters:
            continue
        if v < best_var:
            best, best_var = g, v
    return best


def lh_report_dtype(g: int) -> np.dtype:
    """Packed ``[("seed", "<u4"), ("y", smallest uint holding g - 1)]``."""
    return np.dtype([("seed", "<u4"), ("y", uint_dtype(g).newbyteorder("<"))])


class _HashedReports:
    """Reports ``(hash seed, y)``; a report supports ``v`` iff ``H_seed(v) == y``."""

    k: int
    g: int
    name: ClassVar[str]

    @property
    def report_dtype(self) -> np.dtype:
        return lh_report_dtype(self.g)

    def validate_reports(self, reports: np.ndarray) -> None:
        if reports.size and int(reports["y"].max()) >= self.g:
            raise InvalidReports(f"report hash value {int(reports['y'].max())} is outside [0, {self.g})")

    def _fields(self, reports: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        r = np.asarray(reports)
        if r.ndim != 1 or r.dtype != self.report_dtype:
            raise InvalidReports(f"{self.name} reports must be a 1-d array of dtype {self.report_dtype}, "
                                 f"got {r.dtype} {r.shape}")
        self.validate_reports(r)
        return np.ascontiguousarray(r["seed"]), np.ascontiguousarray(r["y"])

    def _pack(self, hseeds: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = np.empty(hseeds.shape[0], dtype=self.report_dtype)
        out["seed"] = hseeds
        out["y"] = y
        return out

    def support(self, reports: np.ndarray) -> np.ndarray:
        """``C(v) = #{reports : H_seed(v) = y}`` (Wang et al., Sensors 2020, §3.1.3; Arcolezi et al.,
        EDBT 2023, Alg. 2 line 4)."""
        seeds, ys = self._fields(reports)
        return kernels.lh_support(seeds, ys, self.k, self.g)

    def hash_values(self, reports: np.ndarray, v: int) -> np.ndarray:
        """``H_seed(v)`` of every report's hash function, ``int64 (n,)``."""
        seeds, _ = self._fields(reports)
        return kernels.lh_hash_rows(seeds, np.full(seeds.shape[0], v, dtype=np.int64), self.g)

    def audit_event(self, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
        """The report supports ``v1`` and not ``v2``: its probability ratio is exactly ``e^ε1``
        (``ps (1 - 1/g)`` under ``v1`` vs ``q (1 - 1/g)`` under ``v2``, q = P(y = given other))."""
        y = np.asarray(reports)["y"].astype(np.int64)
        return (self.hash_values(reports, v1) == y) & (self.hash_values(reports, v2) != y)


class LocalHashing(_HashedReports, SingleShot, PureProtocol):
    """Single-shot LH over ``[0, g)``: GRR with ``p = e^ε / (e^ε + g - 1)`` (Wang et al., Sensors
    2020, Eq. 35), a fresh hash function per report; ``ps = p``, ``qs = 1/g`` (Eq. 36)."""

    def __init__(self, k: int, eps: float, g: int) -> None:
        SingleShot.__init__(self, k, eps)
        if self.k > MAX_HASH_RANGE:
            raise LDPError(f"k must be at most 2^32 for local hashing, got {k}")
        self.g = _check_g(g)
        self.p, self.q = grr_probabilities(self.eps, self.g)

    @property
    def ps(self) -> float:
        return self.p

    @property
    def qs(self) -> float:
        return 1.0 / self.g

    @property
    def eps_first(self) -> float:
        """ln(p / q): the GRR round's ratio (the hash function is independent of the value)."""
        return grr_eps(self.p, self.q)

    def randomize(self, values, rng=None, state=None):
        v = self.check_values(values)
        self._state_for(state, v.shape[0])
        nkey = noise_key(rng)
        hseeds, x = kernels.lh_encode(v, NO_KEYS, False, nkey, self.g)
        y = kernels.grr_chain_randomize(x, NO_KEYS, False, NO_SEEN, nkey, self.p, 1.0, self.g)
        return self._pack(hseeds, y)


class BLH(LocalHashing):
    """Binary local hashing, ``g = 2`` (Wang et al., Sensors 2020, Eqs. 40-42)."""

    name: ClassVar[str] = "BLH"

    def __init__(self, k: int, eps: float) -> None:
        super().__init__(k, eps, 2)


class OLH(LocalHashing):
    """Optimal local hashing, ``g = round(e^ε + 1)`` (Wang et al., Sensors 2020, Eq. 43; Arcolezi
    et al., EDBT 2023, §2.3.2)."""

    name: ClassVar[str] = "OLH"

    def __init__(self, k: int, eps: float) -> None:
        super().__init__(k, eps, olh_g(check_eps("eps", eps)))


class LOLOHA(_HashedReports, GRRChain):
    """Longitudinal local hashing (Arcolezi et al., EDBT 2023, §3): a fixed hash function per
    device, PRR = GRR(ε∞) over ``[0, g)`` memoized per hash value, IRR = GRR over ``[0, g)`` per
    report.

    ``g=None`` is OLOLOHA (Eq. 6), ``g=2`` BiLOLOHA. ``calibration="paper"`` uses Alg. 1 line 3's
    ε_IRR = ln((e^(ε∞+ε1) - 1) / (e^ε∞ - e^ε1)), whose true single-report ε differs from ε1 when
    ``g > 2`` (it is below: 0.948 instead of 1 at ε∞ = 2, g = 3, so budget is wasted);
    ``"exact"`` (default) makes the true ratio ``ps / q_s`` equal ``e^ε1``.
    The server uses ``q1' = 1/g`` (Alg. 2 line 1), so ``qs = 1/g`` and ``ps - qs =
    (p1 - 1/g)(p2 - q2)`` (Alg. 2 line 5).
    """

    name: ClassVar[str] = "LOLOHA"

    def __init__(self, k: int, eps_inf: float, eps_1: float, g: int | None = None,
                 calibration: Calibration = "exact") -> None:
        k = check_domain(k)
        if k > MAX_HASH_RANGE:
            raise LDPError(f"k must be at most 2^32 for local hashing, got {k}")
        eps_inf, eps_1 = check_eps("eps_inf", eps_inf), check_eps("eps_1", eps_1)
        if eps_1 >= eps_inf:
            raise InfeasibleParameters(f"LOLOHA: ε1 = {eps_1:g} must be smaller than ε∞ = {eps_inf:g}")
        self.g = ololoha_g(eps_inf, eps_1) if g is None else _check_g(g)
        TwoRoundProtocol.__init__(self, k, eps_inf, eps_1, calibration)

    @property
    def chain_size(self) -> int:
        """The GRR chain runs over the hashed domain ``[0, g)`` (Thm. 3.3, 3.4)."""
        return self.g

    def _support_q1(self) -> float:
        """Alg. 2's ``q1' = 1/g``: another value hashes to the report w.p. 1/g."""
        return 1.0 / self.g

    def params(self) -> dict:
        return {**TwoRoundProtocol.params(self), "g": self.g}

    @property
    def memo_size(self) -> int:
        """Memoization is per hash value: at most ``g`` memoized inputs (Thm. 3.5)."""
        return self.g

    @property
    def eps_irr(self) -> float:
        """ε of the IRR round alone, ``ln(p2 / q2)``: what one report adds against a server that
        knows which reports share a memoized PRR."""
        return grr_eps(self.p2, self.q2)

    def public_cells(self, reports: np.ndarray, v: int) -> np.ndarray:
        """``H_seed(v)``: the memo cell of ``v`` under each device's public hash seed."""
        return self.hash_values(reports, v)

    def longitudinal_bound(self, reports: int) -> float:
        """Worst case against a seed-aware server after ``reports`` reports: ``ε1`` for one,
        ``reports · ε_IRR`` for more (:func:`estimators.seedaware.loloha_seed_aware_bound`).

        Not ``min(reports, g) ε∞`` (EDBT 2023, Thm. 3.5): the public hash seed tells the server
        which steps share a memoized PRR, two sequences with the same change pattern can have
        different cell patterns, and the reports of merged steps agree more than those of split
        ones, by a factor that grows with every report (docs/privacy.md; exact values in
        tests/test_seedaware.py). ``longitudinal_loss`` keeps the paper's accounted metric (Eq. 8).
        """
        from .seedaware import loloha_seed_aware_bound
        return loloha_seed_aware_bound(self.eps_first, self.eps_irr, int(reports))

    @property
    def worst_case_loss(self) -> float:
        """Unbounded over an unbounded number of reports against a seed-aware server (see
        :meth:`longitudinal_bound`); the accounted ``g ε∞`` is ``longitudinal_loss(g)``."""
        return float("inf")

    def _hashed_chain(self, v: np.ndarray, keys: np.ndarray, seen: np.ndarray, nkey: np.ndarray | None,
                      irr: bool) -> np.ndarray:
        """Hash with the device's fixed hash function, then the GRR chain over ``[0, g)``
        (with the IRR round iff ``irr``): packed ``(hash seed, y)`` reports."""
        hseeds, x = kernels.lh_encode(v, keys, True, NO_NOISE_KEY if nkey is None else nkey, self.g)
        return self._pack(hseeds, self._chain(x, keys, seen, nkey, irr))

    def randomize(self, values, rng=None, state: MemoState | None = None):
        """Alg. 1 for one time step of ``n`` devices (device ``i`` = row ``i`` of ``state``)."""
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._hashed_chain(v, st.keys, st.seen, noise_key(rng), irr=True)

    def memoized_outputs(self, values: np.ndarray, state: MemoState) -> np.ndarray:
        """The devices' (hash seed, PRR output x') for ``values``, without the IRR round and
        without marking anything memoized (inspection, tests and the PRR audit)."""
        v = self.check_values(values)
        st = self._state_for(state, v.shape[0])
        return self._hashed_chain(v, st.keys, st.seen.copy(), None, irr=False)
