"""Benchmark adapter for the peer library *multi-freq-ldpy* (Arcolezi et al., ESORICS 2022; PyPI
``multi-freq-ldpy==0.2.5``).

It times the peer's client (randomizer) and aggregator (estimator) for a side-by-side
benchmark with our own protocols. ``multi_freq_ldpy`` is imported lazily, inside the
functions, so importing this module never fails when the peer is not installed.

Requirements (tested with Python 3.11, numpy 2.4.6, numba 0.68.1, llvmlite 0.50.0)::

    pip install "multi-freq-ldpy==0.2.5" "xxhash<4" numba

``xxhash<4`` is required: the peer's local-hashing code calls ``xxhash.xxh32(str(v), seed=...)``
with a *str*, which xxhash 4.x rejects ("TypeError: Strings must be encoded before hashing").
numpy 2.x works; no change to the peer is needed.

How the peer is called
----------------------
A user of the peer sanitizes one value per call and collects the reports in a Python list
(that is what the peer's own tutorials do: ``[GRR_Client(x, k, eps) for x in data]``); then
one aggregator call turns the list into normalized frequency estimates. The peer has no
vectorized helper. We do exactly that: a Python loop over users (values are Python ints),
and the ``*_Aggregator_MI`` (matrix-inversion / unbiased estimator + clip + renormalize)
aggregator. The peer also has ``*_Aggregator_IBU`` (iterative Bayesian update); not timed.

All peer paths below are relative to ``multi_freq_ldpy``. ``eps_perm`` is the peer's
name for our ``eps_inf`` (budget of the permanent memoization, infinitely many reports);
the peer's ``eps_1`` is our ``eps_1`` (single-report budget); the peer demands
``eps_1 < eps_perm``. "numba" marks an ``@numba.jit(nopython=True)`` client.

==========  =========================================================================  ======================================================  =====
our name    peer client call                                                           peer aggregator call                                    numba
==========  =========================================================================  ======================================================  =====
GRR         pure_frequency_oracles.GRR.GRR_Client(x, k, epsilon=eps)                   GRR.GRR_Aggregator_MI(reports, k, epsilon=eps)          yes
SUE         pure_frequency_oracles.UE.UE_Client(x, k, epsilon=eps, optimal=False)      UE.UE_Aggregator_MI(reports, epsilon=eps, optimal=False) yes
OUE         pure_frequency_oracles.UE.UE_Client(x, k, epsilon=eps, optimal=True)       UE.UE_Aggregator_MI(reports, epsilon=eps, optimal=True)  yes
BLH         pure_frequency_oracles.LH.LH_Client(x, k, epsilon=eps, optimal=False)      LH.LH_Aggregator_MI(reports, k, eps, optimal=False)     no (g=2)
OLH         pure_frequency_oracles.LH.LH_Client(x, k, epsilon=eps, optimal=True)       LH.LH_Aggregator_MI(reports, k, eps, optimal=True)      no (g=round(e^eps)+1)
ADP         pure_frequency_oracles.ADP.ADP_Client(x, k, epsilon=eps, optimal=True)     ADP.ADP_Aggregator_MI(reports, k, eps, optimal=True)    no (calls GRR or OUE client)
L-GRR       long_freq_est.L_GRR.L_GRR_Client(x, k, eps_perm=eps_inf, eps_1=eps_1)      L_GRR.L_GRR_Aggregator_MI(reports, k, eps_perm, eps_1)  no (calls GRR_Client twice)
L-SUE       long_freq_est.L_SUE.L_SUE_Client(x, k, eps_perm=eps_inf, eps_1=eps_1)      L_SUE.L_SUE_Aggregator_MI(reports, eps_perm, eps_1)     yes
L-OUE       long_freq_est.L_OUE.L_OUE_Client(x, k, eps_perm=eps_inf, eps_1=eps_1)      L_OUE.L_OUE_Aggregator_MI(reports, eps_perm, eps_1)     yes
L-OSUE      long_freq_est.L_OSUE.L_OSUE_Client(x, k, eps_perm=eps_inf, eps_1=eps_1)    L_OSUE.L_OSUE_Aggregator_MI(reports, eps_perm, eps_1)   yes
L-SOUE      long_freq_est.L_SOUE.L_SOUE_Client(x, k, eps_perm=eps_inf, eps_1=eps_1)    L_SOUE.L_SOUE_Aggregator_MI(reports, eps_perm, eps_1)   yes
L-ADP       long_freq_est.L_ADP.L_ADP_Client(x, k, eps_perm=eps_inf, eps_1=eps_1)      L_ADP.L_ADP_Aggregator_MI(reports, k, eps_perm, eps_1)  no (calls L-GRR or L-OSUE)
LOLOHA      long_freq_est.L_LH.L_LH_Client(x, k, eps_perm=eps_inf, eps_1=eps_1,        L_LH.L_LH_Aggregator_MI(reports, k, eps_perm, eps_1,    no (L-GRR on hashed value)
              optimal=True)                                                              optimal=True)
dBitFlipPM  long_freq_est.dBitFlipPM.dBitFlipPM_Client(x, k, b, d_bits,                dBitFlipPM.dBitFlipPM_Aggregator_MI(reports, b, d_bits, yes
              eps_perm=eps_inf or eps)                                                   eps_perm)
==========  =========================================================================  ======================================================  =====

Notes on the mapping:

* LOLOHA: the peer's ``L_LH`` cites Arcolezi et al. (EDBT 2023), the LOLOHA paper;
  ``optimal=True`` uses LOLOHA's optimal ``g`` (``g=3`` at eps_inf=2, eps_1=1), ``optimal=False``
  would be BiLOLOHA (g=2, not listed here). The peer keeps no per-user state: every call
  draws a fresh hash seed and redoes the memoized first round, i.e. it times the cost of a
  user's *first* report.
* dBitFlipPM: the peer's randomizer is a single memoized round with privacy ``eps_perm``;
  we pass ``eps_inf`` (or ``eps`` if ``eps_inf`` is None). Buckets ``b`` default to ``k`` and
  ``d_bits`` to 1; both can be given as keyword arguments.
* ADP / L-ADP pick a sub-protocol by variance; at k=100, eps=1 ADP runs OUE and L-ADP
  (eps_inf=2, eps_1=1) runs L-OSUE.
* The peer's local-hashing aggregators (BLH, OLH, LOLOHA) re-hash every domain value for
  every report (k xxhash calls per report), so their aggregation is O(n*k) Python calls.

Multidimensional solutions
--------------------------
The peer's ``mdim_freq_est`` (SPL, SMP, RS+FD; Arcolezi et al., CIKM 2021, for RS+FD) and
``long_mdim_freq_est`` (L-SPL, L-SMP; Arcolezi et al., DCN 2022) packages are called the way
their tutorials do: one client call per user with the user's tuple of ``d`` values (a Python
list of ints), the reports collected in a list, then one aggregator call that returns the
normalized estimates of all ``d`` attributes. ``lst_k`` is the list of domain sizes and ``d``
its length. None of these clients is jitted: each is a Python loop over the ``d`` attributes
(SPL, RS+FD) or one ``np.random.randint(d)`` draw and one call (SMP) around the jitted or plain
single-attribute clients of the table above. SPL divides the budget by ``d`` itself; SMP,
RS+FD and L-SMP receive the whole budget (RS+FD amplifies it itself: ``ln(d(e^eps - 1) + 1)``).

==================  ======================================================================  ==========================================================
our name            peer client call (module: mdim_freq_est.)                               peer aggregator call
==================  ======================================================================  ==========================================================
SPL[GRR]            SPL_solution.SPL_GRR_Client(x, lst_k, d, eps)                           SPL_GRR_Aggregator_MI(reports, lst_k, d, eps)
SPL[SUE], SPL[OUE]  SPL_solution.SPL_UE_Client(x, lst_k, d, eps, optimal=False/True)        SPL_UE_Aggregator_MI(reports, d, eps, optimal)
SPL[BLH], SPL[OLH]  SPL_solution.SPL_LH_Client(x, lst_k, d, eps, optimal=False/True)        SPL_LH_Aggregator_MI(reports, lst_k, d, eps, optimal)
SPL[ADP]            SPL_solution.SPL_ADP_Client(x, lst_k, d, eps, optimal=True)             SPL_ADP_Aggregator_MI(reports, lst_k, d, eps, True)
SPL[SS]             SPL_solution.SPL_SS_Client(x, lst_k, d, eps)                            SPL_SS_Aggregator_MI(reports, lst_k, d, eps)
SMP[...]            SMP_solution.SMP_<GRR|UE|LH|ADP|SS>_Client, same arguments as SPL       SMP_<...>_Aggregator_MI, same arguments as SPL
RS+FD[GRR]          RSpFD_solution.RSpFD_GRR_Client(x, lst_k, d, eps)                       RSpFD_GRR_Aggregator_MI(reports, lst_k, d, eps)
RS+FD[OUE-z]        RSpFD_solution.RSpFD_UE_zero_Client(x, lst_k, d, eps, optimal=True)     RSpFD_UE_zero_Aggregator_MI(reports, lst_k, d, eps, True)
RS+FD[SUE-z]        the same with optimal=False                                             the same with optimal=False
RS+FD[OUE-r]        RSpFD_solution.RSpFD_UE_rnd_Client(x, lst_k, d, eps, optimal=True)      RSpFD_UE_rnd_Aggregator_MI(reports, lst_k, d, eps, True)
RS+FD[SUE-r]        the same with optimal=False                                             the same with optimal=False
RS+FD[ADP]          RSpFD_solution.RSpFD_ADP_Client(x, lst_k, d, eps, optimal=True)         RSpFD_ADP_Aggregator_MI(reports, lst_k, d, eps, True)
==================  ======================================================================  ==========================================================

==================  ======================================================================  ==========================================================
our name            peer client call (module: long_mdim_freq_est.)                          peer aggregator call
==================  ======================================================================  ==========================================================
L-SPL[L-GRR]        L_SPL_Solution.SPL_L_GRR_Client(x, lst_k, d, eps_perm, eps_1)           SPL_L_GRR_Aggregator_MI(reports, lst_k, d, eps_perm, eps_1)
L-SPL[L-ADP]        L_SPL_Solution.SPL_L_ADP_Client(x, lst_k, d, eps_perm, eps_1)           SPL_L_ADP_Aggregator_MI(reports, lst_k, d, eps_perm, eps_1)
L-SPL[L-<UE>]       L_SPL_Solution.SPL_L_<UE>_Client(x, lst_k, d, eps_perm, eps_1),         SPL_L_<UE>_Aggregator_MI(reports, d, eps_perm, eps_1)
                      <UE> = SUE, OUE, OSUE, SOUE
L-SPL[dBitFlipPM]   L_SPL_Solution.SPL_dBitFlipPM_Client(x, lst_k, lst_b, d_bits, d,        SPL_dBitFlipPM_Aggregator_MI(reports, lst_b, d_bits, d,
                      eps_perm), lst_b = lst_k                                                eps_perm)
L-SMP[...]          L_SMP_Solution.SMP_L_<...>_Client, same arguments as L-SPL              SMP_L_<...>_Aggregator_MI, same arguments as L-SPL
ALLOMFREE           L_SMP_Solution.SMP_L_ADP_Client(x, lst_k, d, eps_perm, eps_1)           SMP_L_ADP_Aggregator_MI(reports, lst_k, d, eps_perm, eps_1)
==================  ======================================================================  ==========================================================

Notes on the mapping:

* A *report* of a solution is one user's report for one collection: the list of ``d``
  sanitized values or UE vectors (SPL, RS+FD, L-SPL) or the pair (sampled attribute, sanitized
  value) (SMP, L-SMP, ALLOMFREE). Rates are users (one report each) per second.
* ALLOMFREE: the peer's ``L_ADP_Client`` is documented as "a.k.a. ALLOMFREE" (L-GRR or L-OSUE,
  whichever has the smaller approximate variance, Arcolezi et al., DCN 2022, Algorithm 1), and
  ``SMP_L_ADP_Client`` samples the attribute, so L-SMP[L-ADP] is the peer's ALLOMFREE. Its
  L-GRR ``p2`` is the closed form of DCN 2022, Eq. 13 (our ``calibration="paper"``).
* The peer's SMP clients draw the sampled attribute anew at every call; L-SMP, like its
  longitudinal clients, keeps no per-user state and redoes the memoized round at every call.
* RS+FD[ADP] picks, per attribute, RS+FD[GRR] or RS+FD[OUE-z] by the smaller variance (the
  peer's ``Variance_RSpFD``), the fake data following the chosen variant.
* The peer's SPL/RS+FD aggregators first turn the list of reports into a ``dtype=object``
  array and slice a column per attribute; SMP aggregators regroup the reports by attribute
  in a Python loop.

Timing rules
------------
* Inputs: ``numpy.random.default_rng(seed).integers(0, k, n)``, converted to Python ints.
  Both numpy's legacy global RNG (used by the peer's LH clients) and numba's own RNG
  (used inside jitted clients) are seeded with ``seed``.
* Clients are called once before timing (numba compile time is excluded).
* Client: users are processed in chunks until all ``n`` are done or ``max_seconds`` passed
  (at least ``min(n, 200)`` users are always timed); rate = users timed / seconds.
* Aggregator: reports come from the peer's own client (generation is not timed). The
  aggregator is first timed on ``min(n, 200)`` reports to estimate its per-report cost;
  then it is timed on ``m`` reports, ``m = n`` unless that is predicted to exceed
  ``max_seconds`` (or generating the reports would exceed ``max_seconds``, or they would take
  more than 1 GiB), in which case ``m`` is the largest prefix that fits (at least 200).
  Short runs are repeated (up to 5 times within 0.5 s) and the fastest is kept.
  Rate = m / seconds (aggregation cost is linear in the number of reports).
* Solutions: inputs are :func:`solution_values` (column ``j`` uniform on ``range(k_j)``, the
  same array our side is timed on), converted to lists of Python ints. The client is called
  ``16 d`` times before timing, so that the numba specializations of every attribute and
  sub-protocol are compiled. The rules above then apply per user; the timing functions also
  return how many users were timed, so that a caller can say when a prefix was used.
"""

from __future__ import annotations

import functools
import importlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

__all__ = [
    "PEER_PROTOCOLS",
    "PEER_SOLUTIONS",
    "PeerSolutionSpec",
    "PeerSpec",
    "peer_available",
    "solution_values",
    "time_peer_randomize",
    "time_peer_solution_randomize",
    "time_peer_solution_support",
    "time_peer_support",
]

_PKG = "multi_freq_ldpy"
_MIN_USERS = 200
_MAX_REPORT_BYTES = 1 << 30


@dataclass(frozen=True)
class PeerSpec:
    """How to call the peer for one of our protocol names."""

    module: str          # module under multi_freq_ldpy, e.g. "pure_frequency_oracles.GRR"
    client: str          # client (randomizer) function name in that module
    aggregator: str      # aggregator (estimator) function name in that module
    shape: str           # argument layout, see _bind()
    optimal: bool | None = None   # value of the peer's ``optimal`` argument, if any
    numba: bool = False  # True if the client itself is @numba.jit

    @property
    def client_path(self) -> str:
        return f"{_PKG}.{self.module}.{self.client}"

    @property
    def aggregator_path(self) -> str:
        return f"{_PKG}.{self.module}.{self.aggregator}"


_P = "pure_frequency_oracles."
_L = "long_freq_est."

PEER_PROTOCOLS: dict[str, PeerSpec] = {
    "GRR": PeerSpec(_P + "GRR", "GRR_Client", "GRR_Aggregator_MI", "grr", None, True),
    "SUE": PeerSpec(_P + "UE", "UE_Client", "UE_Aggregator_MI", "ue", False, True),
    "OUE": PeerSpec(_P + "UE", "UE_Client", "UE_Aggregator_MI", "ue", True, True),
    "BLH": PeerSpec(_P + "LH", "LH_Client", "LH_Aggregator_MI", "lh", False),
    "OLH": PeerSpec(_P + "LH", "LH_Client", "LH_Aggregator_MI", "lh", True),
    "ADP": PeerSpec(_P + "ADP", "ADP_Client", "ADP_Aggregator_MI", "adp", True),
    "L-GRR": PeerSpec(_L + "L_GRR", "L_GRR_Client", "L_GRR_Aggregator_MI", "long_k"),
    "L-SUE": PeerSpec(_L + "L_SUE", "L_SUE_Client", "L_SUE_Aggregator_MI", "long", None, True),
    "L-OUE": PeerSpec(_L + "L_OUE", "L_OUE_Client", "L_OUE_Aggregator_MI", "long", None, True),
    "L-OSUE": PeerSpec(_L + "L_OSUE", "L_OSUE_Client", "L_OSUE_Aggregator_MI", "long", None, True),
    "L-SOUE": PeerSpec(_L + "L_SOUE", "L_SOUE_Client", "L_SOUE_Aggregator_MI", "long", None, True),
    "L-ADP": PeerSpec(_L + "L_ADP", "L_ADP_Client", "L_ADP_Aggregator_MI", "long_k"),
    "LOLOHA": PeerSpec(_L + "L_LH", "L_LH_Client", "L_LH_Aggregator_MI", "long_lh", True),
    "dBitFlipPM": PeerSpec(
        _L + "dBitFlipPM", "dBitFlipPM_Client", "dBitFlipPM_Aggregator_MI", "dbit", None, True
    ),
}


def peer_available() -> bool:
    """True if multi_freq_ldpy (with numba) and a usable xxhash (<4) can be imported."""
    try:
        import xxhash

        # xxhash>=4 refuses str input, which the peer's LH code passes.
        xxhash.xxh32("1", seed=1).intdigest()
        for mod in {spec.module for spec in (*PEER_PROTOCOLS.values(), *PEER_SOLUTIONS.values())}:
            importlib.import_module(f"{_PKG}.{mod}")
    except Exception:  # ImportError, TypeError from xxhash 4, numba/numpy mismatch, ...
        return False
    return True


@functools.lru_cache(maxsize=None)
def _numba_seeder() -> Callable[[int], None]:
    """A jitted function that seeds numba's internal RNG (separate from numpy's)."""
    import numba

    @numba.njit(cache=False)
    def _seed(s: int) -> None:
        np.random.seed(s)

    return _seed


def _seed_all(seed: int) -> None:
    np.random.seed(seed)
    _numba_seeder()(seed)


def _bind(
    name: str,
    k: int,
    eps: float | None,
    eps_inf: float | None,
    eps_1: float | None,
    b: int | None,
    d_bits: int,
) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[..., Any], tuple[Any, ...]]:
    """Return (client, client_args_after_x, aggregator, aggregator_args_after_reports)."""
    if name not in PEER_PROTOCOLS:
        raise KeyError(f"peer has no protocol {name!r}; known: {sorted(PEER_PROTOCOLS)}")
    spec = PEER_PROTOCOLS[name]
    try:
        module = importlib.import_module(f"{_PKG}.{spec.module}")
    except Exception as exc:
        raise RuntimeError(
            'multi-freq-ldpy is not usable; pip install "multi-freq-ldpy==0.2.5" "xxhash<4" numba'
        ) from exc
    client = getattr(module, spec.client)
    agg = getattr(module, spec.aggregator)
    k = int(k)  # the peer checks isinstance(k, int)

    if spec.shape in ("grr", "ue", "lh", "adp"):
        if eps is None:
            raise ValueError(f"{name} needs eps")
        e = float(eps)
        if spec.shape == "grr":
            return client, (k, e), agg, (k, e)
        if spec.shape == "ue":
            return client, (k, e, spec.optimal), agg, (e, spec.optimal)
        return client, (k, e, spec.optimal), agg, (k, e, spec.optimal)  # lh, adp

    if spec.shape == "dbit":
        e_perm = eps_inf if eps_inf is not None else eps
        if e_perm is None:
            raise ValueError(f"{name} needs eps_inf (or eps)")
        bb = k if b is None else int(b)
        d = int(d_bits)
        return client, (k, bb, d, float(e_perm)), agg, (bb, d, float(e_perm))

    # longitudinal: peer's (eps_perm, eps_1) = our (eps_inf, eps_1)
    if eps_inf is None or eps_1 is None:
        raise ValueError(f"{name} needs eps_inf and eps_1")
    ei, e1 = float(eps_inf), float(eps_1)
    if not e1 < ei:
        raise ValueError(f"{name}: the peer requires eps_1 < eps_inf (got {e1}, {ei})")
    if spec.shape == "long":
        return client, (k, ei, e1), agg, (ei, e1)
    if spec.shape == "long_k":
        return client, (k, ei, e1), agg, (k, ei, e1)
    if spec.shape == "long_lh":
        return client, (k, ei, e1, spec.optimal), agg, (k, ei, e1, spec.optimal)
    raise AssertionError(spec.shape)


def _inputs(k: int, n: int, seed: int) -> list[int]:
    if n < 1 or k < 2:
        raise ValueError("need n >= 1 and k >= 2")
    return np.random.default_rng(seed).integers(0, k, size=n).tolist()


def _time_clients(client: Callable[..., Any], args: tuple[Any, ...], values: list[Any],
                  max_seconds: float) -> tuple[float, int]:
    """(users/second, users timed) of ``[client(x, *args) for x in values]``, in chunks, stopping
    after max_seconds (at least ``min(len(values), 200)`` users are timed)."""
    n = len(values)
    min_users = min(n, _MIN_USERS)
    done = 0
    chunk = min_users
    t0 = time.perf_counter()
    while done < n:
        stop = min(n, done + chunk)
        _reports = [client(x, *args) for x in values[done:stop]]
        done = stop
        elapsed = time.perf_counter() - t0
        if elapsed >= max_seconds and done >= min_users:
            break
        # next chunk: ~2% of the budget, so we overshoot max_seconds only a little
        rate = done / max(elapsed, 1e-9)
        chunk = int(min(max(rate * max_seconds * 0.02, 16), 100_000))
    elapsed = time.perf_counter() - t0
    return done / elapsed, done


def _report_nbytes(report: Any) -> int:
    """Rough memory of one peer report (ndarray data, plus object overhead), for the 1 GiB cap."""
    if isinstance(report, (list, tuple)):
        return sum(_report_nbytes(r) for r in report) + 100
    return getattr(report, "nbytes", 0) + 100


def _time_aggregator(client: Callable[..., Any], cargs: tuple[Any, ...], agg: Callable[..., Any],
                     aargs: tuple[Any, ...], values: list[Any], max_seconds: float) -> tuple[float, int]:
    """(reports/second, reports aggregated) of the peer's aggregator on reports of its own client
    (see "Timing rules"); the caller has warmed up and seeded the client."""
    n = len(values)
    # 1) calibration on a small prefix
    m0 = min(n, _MIN_USERS)
    t0 = time.perf_counter()
    reports = [client(x, *cargs) for x in values[:m0]]
    gen_per_report = (time.perf_counter() - t0) / m0
    agg(reports[: min(m0, 20)], *aargs)  # warm-up of the aggregator
    t_cal = _time_call(lambda: agg(reports, *aargs), budget=min(0.5, max_seconds))
    if m0 == n:
        return n / t_cal, n

    # 2) choose how many reports to time
    per_report = t_cal / m0
    m = n
    if per_report * n > max_seconds:
        m = int(max_seconds * 0.9 / per_report)
    if gen_per_report * m > max_seconds:
        m = int(max_seconds / gen_per_report)
    m = min(m, _MAX_REPORT_BYTES // _report_nbytes(reports[0]))
    m = max(min(m, n), m0)
    if m == m0:
        return m0 / t_cal, m0

    reports.extend(client(x, *cargs) for x in values[m0:m])
    t = _time_call(lambda: agg(reports, *aargs), budget=min(0.5, max_seconds))
    return m / t, m


def time_peer_randomize(
    name: str,
    k: int,
    n: int,
    eps: float | None = None,
    eps_inf: float | None = None,
    eps_1: float | None = None,
    seed: int = 0,
    max_seconds: float = 5.0,
    *,
    b: int | None = None,
    d_bits: int = 1,
) -> float:
    """Reports/second of the peer's client for n users (prefix of >= 200 users if slow).

    ``b``/``d_bits`` are used by dBitFlipPM only (defaults: b=k, d_bits=1).
    """
    client, args, _, _ = _bind(name, k, eps, eps_inf, eps_1, b, d_bits)
    values = _inputs(k, n, seed)
    _seed_all(seed)
    client(values[0], *args)  # warm-up: numba compilation happens here
    _seed_all(seed)
    return _time_clients(client, args, values, max_seconds)[0]


def _time_call(fn: Callable[[], Any], budget: float) -> float:
    """Fastest of up to 5 runs of fn(), repeating only while total time < budget."""
    best = float("inf")
    total = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = min(best, dt)
        total += dt
        if total >= budget:
            break
    return best


def time_peer_support(
    name: str,
    k: int,
    n: int,
    eps: float | None = None,
    eps_inf: float | None = None,
    eps_1: float | None = None,
    seed: int = 0,
    max_seconds: float = 5.0,
    *,
    b: int | None = None,
    d_bits: int = 1,
) -> float:
    """Reports/second of the peer's aggregator on reports made by the peer's own client.

    Times a prefix of (>= 200) reports if aggregating all n would exceed max_seconds.
    """
    client, cargs, agg, aargs = _bind(name, k, eps, eps_inf, eps_1, b, d_bits)
    values = _inputs(k, n, seed)
    _seed_all(seed)
    client(values[0], *cargs)  # warm-up
    _seed_all(seed)
    return _time_aggregator(client, cargs, agg, aargs, values, max_seconds)[0]


# --------------------------------------------------------------------------- multidimensional


@dataclass(frozen=True)
class PeerSolutionSpec:
    """How to call the peer for one of our (solution, protocol) pairs."""

    module: str          # module under multi_freq_ldpy, e.g. "mdim_freq_est.SPL_solution"
    client: str          # client function: one call sanitizes one user's tuple of d values
    aggregator: str      # aggregator function: one call estimates all d attributes
    shape: str           # "ks": the aggregator takes lst_k; "no_ks": it does not; "dbit": dBitFlipPM's
    longitudinal: bool   # budget (eps_perm, eps_1) = our (eps_inf, eps_1), else eps
    optimal: bool | None = None   # value of the peer's ``optimal`` argument, if any

    @property
    def client_path(self) -> str:
        return f"{_PKG}.{self.module}.{self.client}"

    @property
    def aggregator_path(self) -> str:
        return f"{_PKG}.{self.module}.{self.aggregator}"


def _solution_specs() -> dict[tuple[str, str | None], PeerSolutionSpec]:
    """The table of the module docstring, as data."""
    specs: dict[tuple[str, str | None], PeerSolutionSpec] = {}
    pure = {"GRR": ("GRR", "ks", None), "SUE": ("UE", "no_ks", False), "OUE": ("UE", "no_ks", True),
            "BLH": ("LH", "ks", False), "OLH": ("LH", "ks", True), "ADP": ("ADP", "ks", True),
            "SS": ("SS", "ks", None)}
    for sol, mod in (("SPL", "SPL_solution"), ("SMP", "SMP_solution")):
        for proto, (fo, shape, opt) in pure.items():
            specs[sol, proto] = PeerSolutionSpec(
                f"mdim_freq_est.{mod}", f"{sol}_{fo}_Client", f"{sol}_{fo}_Aggregator_MI", shape, False, opt)
    rsfd = {"GRR": ("GRR", None), "OUE-z": ("UE_zero", True), "SUE-z": ("UE_zero", False),
            "OUE-r": ("UE_rnd", True), "SUE-r": ("UE_rnd", False), "ADP": ("ADP", True)}
    for proto, (fo, opt) in rsfd.items():
        specs["RS+FD", proto] = PeerSolutionSpec(
            "mdim_freq_est.RSpFD_solution", f"RSpFD_{fo}_Client", f"RSpFD_{fo}_Aggregator_MI", "ks", False, opt)
    long = {"L-GRR": ("L_GRR", "ks"), "L-SUE": ("L_SUE", "no_ks"), "L-OUE": ("L_OUE", "no_ks"),
            "L-OSUE": ("L_OSUE", "no_ks"), "L-SOUE": ("L_SOUE", "no_ks"), "L-ADP": ("L_ADP", "ks"),
            "dBitFlipPM": ("dBitFlipPM", "dbit")}
    for sol, mod in (("L-SPL", "L_SPL_Solution"), ("L-SMP", "L_SMP_Solution")):
        pre = sol[2:]
        for proto, (fo, shape) in long.items():
            specs[sol, proto] = PeerSolutionSpec(
                f"long_mdim_freq_est.{mod}", f"{pre}_{fo}_Client", f"{pre}_{fo}_Aggregator_MI", shape, True)
    # the peer's L_ADP_Client says "a.k.a. ALLOMFREE": L-SMP with L-GRR or L-OSUE by the smaller variance
    specs["ALLOMFREE", None] = specs["L-SMP", "L-ADP"]
    return specs


PEER_SOLUTIONS: dict[tuple[str, str | None], PeerSolutionSpec] = _solution_specs()


def solution_values(ks: Sequence[int], n: int, seed: int) -> np.ndarray:
    """The (n, d) int64 inputs of a solution benchmark: column j uniform on ``range(ks[j])``."""
    if n < 1 or len(ks) < 1 or min(ks) < 2:
        raise ValueError("need n >= 1, at least one attribute and every k >= 2")
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.integers(0, int(k), size=n) for k in ks])


def _bind_solution(
    solution: str,
    protocol: str | None,
    ks: Sequence[int],
    eps: float | None,
    eps_inf: float | None,
    eps_1: float | None,
    d_bits: int,
) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[..., Any], tuple[Any, ...]]:
    """Return (client, client_args_after_tuple, aggregator, aggregator_args_after_reports)."""
    key = (solution, protocol)
    if key not in PEER_SOLUTIONS:
        raise KeyError(f"peer has no solution {solution}[{protocol}]; known: "
                       f"{sorted(f'{s}[{p}]' for s, p in PEER_SOLUTIONS)}")
    spec = PEER_SOLUTIONS[key]
    try:
        module = importlib.import_module(f"{_PKG}.{spec.module}")
    except Exception as exc:
        raise RuntimeError(
            'multi-freq-ldpy is not usable; pip install "multi-freq-ldpy==0.2.5" "xxhash<4" numba'
        ) from exc
    client = getattr(module, spec.client)
    agg = getattr(module, spec.aggregator)
    lst_k = [int(k) for k in ks]  # the peer checks isinstance(k, int)
    d = len(lst_k)
    if spec.shape == "dbit":
        e_perm = eps_inf if eps_inf is not None else eps
        if e_perm is None:
            raise ValueError(f"{solution}[{protocol}] needs eps_inf (or eps)")
        lst_b = list(lst_k)
        return (client, (lst_k, lst_b, int(d_bits), d, float(e_perm)),
                agg, (lst_b, int(d_bits), d, float(e_perm)))
    if spec.longitudinal:
        if eps_inf is None or eps_1 is None:
            raise ValueError(f"{solution}[{protocol}] needs eps_inf and eps_1")
        if not eps_1 < eps_inf:
            raise ValueError(f"{solution}: the peer requires eps_1 < eps_inf (got {eps_1}, {eps_inf})")
        budget: tuple[Any, ...] = (float(eps_inf), float(eps_1))
    else:
        if eps is None:
            raise ValueError(f"{solution}[{protocol}] needs eps")
        budget = (float(eps),)
    opt = () if spec.optimal is None else (spec.optimal,)
    cargs = (lst_k, d, *budget, *opt)
    aargs = cargs if spec.shape == "ks" else (d, *budget, *opt)
    return client, cargs, agg, aargs


def _solution_setup(solution: str, protocol: str | None, ks: Sequence[int], n: int,
                    eps: float | None, eps_inf: float | None, eps_1: float | None, seed: int, d_bits: int
                    ) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[..., Any], tuple[Any, ...], list[Any]]:
    client, cargs, agg, aargs = _bind_solution(solution, protocol, ks, eps, eps_inf, eps_1, d_bits)
    values = solution_values(ks, n, seed).tolist()
    _seed_all(seed)
    # warm-up: SMP clients sample one attribute per call and adaptive ones (ADP, L-ADP) switch
    # sub-protocol per attribute, so call enough times that every numba specialization is compiled
    for x in values[: min(n, 16 * len(ks))]:
        client(x, *cargs)
    _seed_all(seed)
    return client, cargs, agg, aargs, values


def time_peer_solution_randomize(
    solution: str,
    protocol: str | None,
    ks: Sequence[int],
    n: int,
    eps: float | None = None,
    eps_inf: float | None = None,
    eps_1: float | None = None,
    seed: int = 0,
    max_seconds: float = 5.0,
    *,
    d_bits: int = 1,
) -> tuple[float, int]:
    """(reports/second, users timed) of the peer's multidimensional client: one call per user,
    on the inputs of :func:`solution_values` (a prefix of >= 200 users if slow).

    ``protocol`` is None for ALLOMFREE. A report is one user's whole sanitized tuple (SPL, RS+FD)
    or its (sampled attribute, sanitized value) pair (SMP); ``d_bits`` is dBitFlipPM's (b = k).
    """
    client, cargs, _, _, values = _solution_setup(solution, protocol, ks, n, eps, eps_inf, eps_1, seed, d_bits)
    return _time_clients(client, cargs, values, max_seconds)


def time_peer_solution_support(
    solution: str,
    protocol: str | None,
    ks: Sequence[int],
    n: int,
    eps: float | None = None,
    eps_inf: float | None = None,
    eps_1: float | None = None,
    seed: int = 0,
    max_seconds: float = 5.0,
    *,
    d_bits: int = 1,
) -> tuple[float, int]:
    """(reports/second, reports aggregated) of the peer's multidimensional aggregator (estimates of
    all d attributes in one call) on reports of its own client; a prefix of >= 200 if slow."""
    client, cargs, agg, aargs, values = _solution_setup(
        solution, protocol, ks, n, eps, eps_inf, eps_1, seed, d_bits)
    return _time_aggregator(client, cargs, agg, aargs, values, max_seconds)
