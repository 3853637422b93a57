"""The open-domain protocols against the peer library *pure-ldp* 1.2.0 (Maddock et al., ``pip install
pure-ldp==1.2.0``, the ``bench`` extra): ``ldp bench protocols -p sketch`` and the sketches' rows of ``ldp audit``.

**Rates** (:func:`bench_rates`), reports/s of ours and of pure-ldp in the same run, same parameters (ε, ``m``
cells, ``k`` rows, RAPPOR's ``m``, ``h``, cohorts and ``f``):

==========  =====================================================  ================================================
ours        pure-ldp client call                                   pure-ldp server calls
==========  =====================================================  ================================================
CMS         ``apple_cms.CMSClient(eps, hash_funcs, m)`` ``         ``CMSServer(eps, k, m)``: ``aggregate`` per
            .privatise(x)`` per value                              report, then ``estimate_all(candidates)``
HCMS        ``CMSClient(..., is_hadamard=True)``                   ``CMSServer(..., is_hadamard=True)``, same
RAPPOR      ``rappor.RAPPORClient(f, m, hash_funcs, cohorts)``     ``RAPPORServer`` needs scikit-learn and
            (PRR only: ours with ``p = 0, q = 1``, no IRR)         statsmodels, outside the bench extra: timed only
                                                                   when they import
PEM         ``prefix_extending.PEMClient`` (OLH per group)         ``PEMServer`` + the lazy OLH server of
                                                                   :func:`estimators.sketch.pem.compare_with_pure_ldp`
==========  =====================================================  ================================================

Ours: ``randomize`` of ``n`` values with batch keys from the OS CSPRNG (as on devices), best of ``repeats``; then
``support`` + ``estimate`` of the candidates (RAPPOR: its least-squares decoding). pure-ldp: one Python call per
value, timed over at most ``peer_seconds`` (its rate is per report over the prefix it reached). The top-K decode
over ``2^32`` values (PEM; TreeHist when :mod:`estimators.sketch.treehist` exists) is timed for ``n`` devices.

**Same reports** (:func:`same_reports`): pure-ldp's *client* reports go through *our* server code — converted to
our report layout, counted by our ``support``, debiased and estimated by our ``estimate`` — with pure-ldp's own
hash functions on the candidates (``xxh64(str(x), seed=j) % m``; the hash lookup of our ``estimate`` is swapped
for theirs, nothing else), and the estimates are set beside pure-ldp's server's on the same reports:

* CMS: Apple's server adds ``k (c_ε/2 x + 1/2)``, ``c_ε = (e^{ε/2}+1)/(e^{ε/2}-1)``; ours uses ``c = 1/(1-2q)`` of
  the *implemented* flip probability ``q = T/2^32`` (``T = ceil(2^32/(e^{ε/2}+1))``). The estimates are affine in
  ``c``: with ``c`` set to ``c_ε`` ours equals pure-ldp's to float rounding (its sketch sums ``n`` floats, ours
  integer counts); with our ``c`` the difference is exactly the quantization of ``q`` (relative ``|c - c_ε|/c``,
  about ``1e-10`` at ε = 1).
* HCMS: the same with ``q = T/2^53`` (the difference is at float rounding already).
* RAPPOR: pure-ldp has no IRR; ours with ``p = 0, q = 1`` has the same law. pure-ldp's ``y = (c - f/2 N)/(1-f)``
  is our ``t̂`` at ``p = 0, q = 1``; its fit is a positive ElasticNet (L2, ``alpha = 0.025 f``) or, over 1000
  values, a Lasso selection first, ours ordinary least squares with standard errors: the estimates differ by the
  regularization (compared when scikit-learn imports; it is not in the bench extra).
* PEM: pure-ldp's OLH hashes ``xxh32(str(prefix), seed)``, ours the project's OLH hash; the same ``g =
  round(e^ε)+1``, ``p = e^ε/(e^ε+g-1)`` and estimator ``(C - n/g)/(p - 1/g)`` (pure-ldp's ``g/(pg-1) C -
  n/(pg-1)``), the same groups and levels. The report formats differ by the hash family, so PEM is compared by
  recall and time on the same data.

Accuracy on the same data: the mean squared error of the estimated frequencies over the candidates, ours end to
end, pure-ldp end to end, ours on pure-ldp's reports, and our exact variance.

**Audit** (:func:`sketch_audit_jobs`): jobs with :class:`estimators.audit.AuditJob`'s interface, so ``ldp audit``
prints them with the other protocols: CMS and HCMS on their exact distinguishing events
(:meth:`estimators.sketch.cms.CMS.audit_event`; ratio ``e^{eps_first}``), RAPPOR's first round (ε1) and PRR (ε∞)
on the event "``v1``'s filter bits all 1 and ``v2``'s all 0" in the report's cohort (filters disjoint there; ratio
exactly ``e^{ε1}`` resp. ``e^{ε∞}``), and PEM's OLH of each level by the generic audit.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import os
import random
import sys
import time
import types
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable
from unittest import mock

import numpy as np

from estimators import audit as A
from estimators.errors import LDPError
from estimators.sketch import cms as cms_module
from estimators.sketch.cms import CMS, HCMS
from estimators.sketch.pem import PEM, compare_with_pure_ldp, zipf_items
from estimators.sketch.rappor import RAPPOR
from estimators.sketch.treehist import TreeHist

__all__ = ["SKETCHES", "SketchAuditJob", "bench_rates", "peer_available", "same_reports", "sketch_audit_jobs",
           "topk_decode"]

SKETCHES = ("CMS", "HCMS", "RAPPOR", "PEM", "TreeHist")


# ------------------------------------------------------------------------------ pure-ldp, imported lazily
def peer_available() -> bool:
    try:
        import pure_ldp  # noqa: F401
        import xxhash  # noqa: F401
    except ImportError:
        return False
    return True


def _package_stub(name: str) -> None:
    """Register ``name`` (a pure-ldp subpackage) without running its ``__init__`` (they import every oracle, RAPPOR's
    scikit-learn included)."""
    import pure_ldp

    if name in sys.modules:
        return
    mod = types.ModuleType(name)
    mod.__path__ = [os.path.join(os.path.dirname(pure_ldp.__file__), *name.split(".")[1:])]
    sys.modules[name] = mod


def _peer():
    """pure-ldp's classes used here: ``(CMSClient, CMSServer, RAPPORClient, RAPPORServer or None, generate_hash,
    generate_hash_funcs)``."""
    for name in ("pure_ldp.frequency_oracles", "pure_ldp.frequency_oracles.rappor"):
        _package_stub(name)
    apple = importlib.import_module("pure_ldp.frequency_oracles.apple_cms")
    rc = importlib.import_module("pure_ldp.frequency_oracles.rappor.rappor_client").RAPPORClient
    try:
        rs = importlib.import_module("pure_ldp.frequency_oracles.rappor.rappor_server").RAPPORServer
    except ImportError:
        rs = None
    core = importlib.import_module("pure_ldp.core")
    fos = importlib.import_module("pure_ldp.core._freq_oracle_server")
    if not isinstance(fos.np, _Numpy2Shim):
        fos.np = _Numpy2Shim("numpy")
    return apple.CMSClient, apple.CMSServer, rc, rs, core.generate_hash, core.generate_hash_funcs


class _Numpy2Shim(types.ModuleType):
    """numpy for pure-ldp's ``FreqOracleServer`` module only: it calls ``np.zeros(d)`` with ``d = None`` for the
    sketch servers (no domain size), which numpy 2 refuses (numpy 1 returned a 0-d array it never reads)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def zeros(shape, *args, **kwargs):
        return np.zeros(() if shape is None else shape, *args, **kwargs)


@contextmanager
def _seeded(seed: int):
    """pure-ldp draws from the global ``random`` and ``np.random``: seed them, restore them after."""
    st, nst = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        random.setstate(st)
        np.random.set_state(nst)


@contextmanager
def _quiet():
    """pure-ldp warns on small n and ε < 1; our seeded simulations warn that they are simulations."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# ------------------------------------------------------------------------------ report conversion
def cms_reports_from_peer(priv: list, m: int) -> np.ndarray:
    """pure-ldp's CMS reports ``(v in {-1,+1}^m, row j)`` in our layout: the row as little-endian uint16, then the
    ``m`` bits (1 = +1) packed little-endian."""
    rows = np.array([j for _, j in priv], dtype="<u2").view(np.uint8).reshape(-1, 2)
    bits = np.packbits(np.stack([np.asarray(v) for v, _ in priv]) == 1, axis=1, bitorder="little")
    return np.ascontiguousarray(np.concatenate([rows, bits], axis=1))


def hcms_reports_from_peer(priv: list, m: int) -> np.ndarray:
    """pure-ldp's HCMS reports ``(b w_l in {-1,+1}, j, l)`` as ours: ``((j m + l) << 1) | (bit == +1)``."""
    a = np.array([(int(j), int(l), int(b) == 1) for b, j, l in priv], dtype=np.int64).reshape(-1, 3)
    return (((a[:, 0] * m + a[:, 1]) << 1) | a[:, 2]).astype(np.uint64)


def rappor_reports_from_peer(priv: list, m: int) -> np.ndarray:
    """pure-ldp's RAPPOR reports ``(filter as a list of m bits, cohort)`` as ours: cohort uint16 LE, bits packed LE."""
    head = np.array([c for _, c in priv], dtype="<u2").view(np.uint8).reshape(-1, 2)
    bits = np.packbits(np.array([b for b, _ in priv], dtype=np.uint8).reshape(-1, m), axis=1, bitorder="little")
    return np.ascontiguousarray(np.concatenate([head, bits], axis=1))


def _peer_hash(funcs: list) -> Callable:
    """A stand-in for :func:`estimators.sketch.hashing.sketch_hash` that evaluates pure-ldp's row hashes on the
    candidate ids (pure-ldp hashes ``str(x)``)."""
    def h(ids, seeds, m):
        return np.array([[f(int(x)) for f in funcs] for x in np.asarray(ids)], dtype=np.int64).reshape(-1, len(funcs))
    return h


def _our_estimate_with(proto, support, n, cands, funcs, c=None) -> np.ndarray:
    """Our ``estimate`` (counts) of ``cands`` with pure-ldp's hash functions (and ``c`` replaced if given)."""
    p = proto
    if c is not None:
        p = copy.copy(proto)
        p.c = c
    with mock.patch.object(cms_module, "sketch_hash", _peer_hash(funcs)):
        return p.estimate(support, n, cands) * n


# ------------------------------------------------------------------------------ same reports
def _population(n: int, n_cands: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` values over ``n_cands`` candidates ``1 .. n_cands`` (Zipf 1.3 ranks, the tail folded onto the last),
    and the candidates."""
    rng = np.random.default_rng(seed)
    v = np.minimum(rng.zipf(1.3, n), n_cands).astype(np.int64)
    return v, np.arange(1, n_cands + 1, dtype=np.int64)


def _mse(est: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean((np.asarray(est, dtype=np.float64) - truth) ** 2))


def _compare_cms(cls, eps, m, k, values, cands, seed) -> dict:
    CMSClient, CMSServer, *_ = _peer()
    had = cls is HCMS
    n = values.shape[0]
    truth = np.bincount(values, minlength=cands.max() + 1)[cands] / n
    with _seeded(seed), _quiet():
        server = CMSServer(eps, k, m, is_hadamard=had)
        funcs = server.get_hash_funcs()
        client = CMSClient(eps, funcs, m, is_hadamard=had)
        priv = [client.privatise(int(x)) for x in values]
        for r in priv:
            server.aggregate(r)
        theirs = np.asarray(server.estimate_all([int(c) for c in cands], suppress_warnings=True), dtype=np.float64)
    proto = cls(eps, m, k, seed)
    conv = hcms_reports_from_peer(priv, m) if had else cms_reports_from_peer(priv, m)
    sup = proto.support(conv)
    ours_same = _our_estimate_with(proto, sup, n, cands, funcs)
    ours_c_eps = _our_estimate_with(proto, sup, n, cands, funcs, c=server.c)
    scale = float(np.max(np.abs(theirs)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        own = proto.estimate(proto.support(proto.randomize(values.astype(np.uint64), np.random.default_rng(seed))),
                             n, cands)
    return {
        "protocol": cls.__name__, "n": n, "eps": eps, "m": m, "k": k, "candidates": int(cands.shape[0]),
        "c_ours": proto.c, "c_pure_ldp": server.c, "c_rel_diff": abs(proto.c - server.c) / server.c,
        "max_abs_diff": float(np.max(np.abs(ours_same - theirs))),
        "max_abs_diff_c_eps": float(np.max(np.abs(ours_c_eps - theirs))),
        "max_abs_estimate": scale,
        "rel_diff": float(np.max(np.abs(ours_same - theirs))) / scale,
        "rel_diff_c_eps": float(np.max(np.abs(ours_c_eps - theirs))) / scale,
        "equal_with_c_eps": bool(np.allclose(ours_c_eps, theirs, rtol=1e-9, atol=1e-9 * scale)),
        "mse": {"ours": _mse(own, truth), "pure_ldp": _mse(theirs / n, truth),
                "ours_on_pure_ldp_reports": _mse(ours_same / n, truth),
                "ours_theory": float(np.mean(proto.variance_exact(truth, n, sumsq=float(np.sum(truth ** 2))
                                                                  - truth ** 2)))},
        "explained": ("ours uses c = 1/(1-2q) of the implemented flip probability q = T/2^%d, pure-ldp Apple's "
                      "c_eps = (e^{%s}+1)/(e^{%s}-1): with c = c_eps the estimates agree to float rounding; the "
                      "rest is that quantization (estimates are affine in c)"
                      % (cls.flip_bits, "eps" if had else "eps/2", "eps" if had else "eps/2")),
    }


def _compare_rappor(m, h, cohorts, f, values, cands, seed) -> dict:
    _, _, RAPPORClient, RAPPORServer, generate_hash, _ = _peer()
    n = values.shape[0]
    truth = np.bincount(values, minlength=cands.max() + 1)[cands] / n
    srng = random.Random(seed)
    family = [[generate_hash(m, srng.randint(0, sys.maxsize)) for _ in range(h)] for _ in range(cohorts)]
    with _seeded(seed), _quiet():
        client = RAPPORClient(f, m, family, num_of_cohorts=cohorts, index_mapper=lambda x: x)
        priv = [client.privatise(int(x)) for x in values]
    proto = RAPPOR(m, h, cohorts, f, 0.0, 1.0, seed=seed, memo_slots=64)
    conv = rappor_reports_from_peer(priv, m)
    X = np.zeros((cohorts, m, cands.shape[0]))
    for j, funcs in enumerate(family):
        for col, c in enumerate(cands):
            for fn in funcs:
                X[j, fn(str(int(c))), col] = 1.0
    X = X.reshape(cohorts * m, -1)
    same = copy.copy(proto)
    same.design = lambda ids: X          # pure-ldp's Bloom hashes; our debiasing and least squares
    est_same = same.estimate(same.support(conv), cands.astype(np.uint64)).counts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rng = np.random.default_rng(seed)
        rep = proto.randomize(values.astype(np.uint64), rng, state=proto.new_state(n, rng))
    own = proto.estimate(proto.support(rep), cands.astype(np.uint64)).counts
    # the measured law of the PRR on the bits of each device's own filter (set) and on the others (clear)
    cohort, bits = proto.split_reports(conv)
    Xv = X.reshape(cohorts, m, -1)[cohort, :, np.searchsorted(cands, values)].astype(bool)      # (n, m)
    S = np.unpackbits(bits, axis=1, bitorder="little")[:, :m].astype(bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mine = proto.memoized_outputs(values.astype(np.uint64), proto.new_state(n, np.random.default_rng(seed)))
    c2, b2 = proto.split_reports(mine)
    X2 = np.zeros((n, m), dtype=bool)
    X2[np.arange(n)[:, None], proto.bloom_bits(values.astype(np.uint64), c2)] = True
    S2 = np.unpackbits(b2, axis=1, bitorder="little")[:, :m].astype(bool)
    scale = (1 - f) / (1 - f / 2)   # pure-ldp's actual law: E[c] = f/2 N + (1 - f/2) t, so t = (c - f/2 N)/(1 - f/2)
    out = {"protocol": "RAPPOR", "n": n, "m": m, "h": h, "cohorts": cohorts, "f": f,
           "candidates": int(cands.shape[0]), "eps_inf": proto.eps_inf,
           "p_set_pure_ldp": float(S[Xv].mean()), "p_clear_pure_ldp": float(S[~Xv].mean()),
           "p_set_ours": float(S2[X2].mean()), "p_clear_ours": float(S2[~X2].mean()), "p_set_stated": 1 - f / 2,
           "mse": {"ours": _mse(own / n, truth), "ours_on_pure_ldp_reports": _mse(est_same / n, truth),
                   "ours_on_pure_ldp_reports_rescaled": _mse(scale * est_same / n, truth), "pure_ldp": None},
           "explained": ("pure-ldp 1.2.0's RAPPORClient._perturb never clears a set bit (it only sets bits), so "
                         "P(B'=1 | B=1) = 1, not 1 - f/2: a 0 at a bit of v's filter rules v out (the PRR's eps_inf "
                         "is unbounded, not 2h ln((1-f/2)/(f/2))), and the paper's debiasing (c - f/2 N)/(1-f), "
                         "its server's y and ours, overestimates by (1-f/2)/(1-f); rescaled, ours on its reports "
                         "is unbiased. Its fit is a positive ElasticNet (alpha = 0.025 f), ours ordinary least "
                         "squares; its RAPPORServer needs scikit-learn and statsmodels (not in the bench extra)")}
    if RAPPORServer is not None:
        with _seeded(seed), _quiet():
            server = RAPPORServer(f, m, h, int(cands.max()) + 1, num_of_cohorts=cohorts, index_mapper=lambda x: x)
            server.hash_family = family
            for r in priv:
                server.aggregate(r)
            y = server._create_y()
            theirs = np.asarray(server.estimate_all([int(c) for c in cands], suppress_warnings=True))
        out["debiased_max_abs_diff"] = float(np.max(np.abs(y - same.debiased(same.support(conv)).reshape(-1))))
        out["mse"]["pure_ldp"] = _mse(theirs / n, truth)
    return out


def same_reports(n: int = 20_000, eps: float = 1.0, m: int = 1024, k: int = 16, n_cands: int = 100,
                 seed: int = 0, rappor: dict | None = None, protocols=("CMS", "HCMS", "RAPPOR")) -> dict:
    """pure-ldp's client reports through our server code, beside pure-ldp's server, and the MSE of each on the same
    data (module doc). ``rappor``: RAPPOR's ``m``, ``h``, ``cohorts``, ``f`` (default 128, 2, 8, 0.5)."""
    values, cands = _population(n, n_cands, seed)
    out = {}
    for name in protocols:
        if name in ("CMS", "HCMS"):
            out[name] = _compare_cms(CMS if name == "CMS" else HCMS, eps, m, k, values, cands, seed)
        elif name == "RAPPOR":
            rp = {"m": 128, "h": 2, "cohorts": 8, "f": 0.5, **(rappor or {})}
            out[name] = _compare_rappor(rp["m"], rp["h"], rp["cohorts"], rp["f"], values, cands, seed)
        else:
            raise LDPError(f"same_reports: no same-report comparison for {name!r} (one of CMS, HCMS, RAPPOR)")
    return out


# ------------------------------------------------------------------------------ rates
def _peer_loop(fn: Callable, items, max_seconds: float) -> tuple[float, int]:
    """Call ``fn`` on items until they or ``max_seconds`` run out: ``(rate per item, items done)``."""
    t0 = time.perf_counter()
    done = 0
    for x in items:
        fn(x)
        done += 1
        if not done & 63 and time.perf_counter() - t0 > max_seconds:
            break
    return done / max(time.perf_counter() - t0, 1e-9), done


def _best(fn: Callable, repeats: int) -> float:
    best = math.inf
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass
class Rate:
    name: str
    ours_rand: float
    peer_rand: float | None
    ours_agg: float
    peer_agg: float | None
    peer_n: int = 0
    note: str = ""


def _rate_cms(cls, eps, m, k, values, cands, repeats, peer_seconds, have_peer) -> Rate:
    n = values.shape[0]
    proto = cls(eps, m, k, 0)
    ids = values.astype(np.uint64)
    proto.estimate(proto.support(proto.randomize(ids[:64])), 64, cands[:4])   # compile
    reps = {}
    t_r = _best(lambda: reps.__setitem__("r", proto.randomize(ids)), repeats)
    t_a = _best(lambda: proto.estimate(proto.support(reps["r"]), n, cands), repeats)
    rate = Rate(cls.__name__, n / t_r, None, n / t_a, None)
    if have_peer:
        CMSClient, CMSServer, *_ = _peer()
        had = cls is HCMS
        with _quiet():
            server = CMSServer(eps, k, m, is_hadamard=had)
            client = CMSClient(eps, server.get_hash_funcs(), m, is_hadamard=had)
            priv = []
            rate.peer_rand, done = _peer_loop(lambda x: priv.append(client.privatise(int(x))), values, peer_seconds)
            t0 = time.perf_counter()
            server.aggregate_all(priv)
            server.estimate_all([int(c) for c in cands], suppress_warnings=True)
            rate.peer_agg = done / (time.perf_counter() - t0)
        rate.peer_n = done
    return rate


def _rate_rappor(rp: dict, values, cands, repeats, peer_seconds, have_peer) -> Rate:
    n = values.shape[0]
    proto = RAPPOR(rp["m"], rp["h"], rp["cohorts"], rp["f"], 0.0, 1.0, seed=0, memo_slots=64)
    ids = values.astype(np.uint64)
    state = proto.new_state(n)
    proto.randomize(ids[:64], state=state.subset(slice(0, 64)))
    reps = {}
    t_r = _best(lambda: reps.__setitem__("r", proto.randomize(ids, state=state)), repeats)
    t_a = _best(lambda: proto.estimate(proto.support(reps["r"]), cands.astype(np.uint64)), repeats)
    rate = Rate("RAPPOR", n / t_r, None, n / t_a, None, note="PRR only (pure-ldp has no IRR): ours p=0, q=1")
    if have_peer:
        _, _, RAPPORClient, RAPPORServer, generate_hash, _ = _peer()
        srng = random.Random(0)
        family = [[generate_hash(rp["m"], srng.randint(0, sys.maxsize)) for _ in range(rp["h"])]
                  for _ in range(rp["cohorts"])]
        with _quiet():
            client = RAPPORClient(rp["f"], rp["m"], family, num_of_cohorts=rp["cohorts"], index_mapper=lambda x: x)
            priv = []
            rate.peer_rand, done = _peer_loop(lambda x: priv.append(client.privatise(int(x))), values, peer_seconds)
            rate.peer_n = done
            if RAPPORServer is not None:
                server = RAPPORServer(rp["f"], rp["m"], rp["h"], int(cands.max()) + 1, num_of_cohorts=rp["cohorts"],
                                      index_mapper=lambda x: x)
                server.hash_family = family
                t0 = time.perf_counter()
                server.aggregate_all(priv)
                server.estimate_all([int(c) for c in cands], suppress_warnings=True)
                rate.peer_agg = done / (time.perf_counter() - t0)
            else:
                rate.note += "; pure-ldp's RAPPORServer needs scikit-learn + statsmodels (not installed)"
    return rate


def bench_rates(n: int = 1_000_000, eps: float = 1.0, m: int = 1024, k: int = 16, n_cands: int = 1000,
                repeats: int = 3, peer_seconds: float = 4.0, seed: int = 0, rappor: dict | None = None,
                protocols=("CMS", "HCMS", "RAPPOR"), on_step: Callable[[str], None] | None = None) -> list[Rate]:
    """reports/s of randomize and of support + estimate of ``n_cands`` candidates, ours vs pure-ldp (module doc)."""
    have_peer = peer_available()
    rng = np.random.default_rng(seed)
    values = rng.integers(1, n_cands + 1, n)
    cands = np.arange(1, n_cands + 1, dtype=np.int64)
    rp = {"m": 128, "h": 2, "cohorts": 8, "f": 0.5, **(rappor or {})}
    out = []
    for name in protocols:
        if on_step is not None:
            on_step(name)
        if name in ("CMS", "HCMS"):
            out.append(_rate_cms(CMS if name == "CMS" else HCMS, eps, m, k, values, cands, repeats, peer_seconds,
                                 have_peer))
        elif name == "RAPPOR":
            out.append(_rate_rappor(rp, values, cands[:min(n_cands, 64)], repeats, peer_seconds, have_peer))
        else:
            raise LDPError(f"bench_rates: unknown sketch {name!r}")
    return out


# ------------------------------------------------------------------------------ top-K over 2^32
def topk_decode(n: int = 1_000_000, eps: float = 4.0, k: int = 20, seed: int = 0, peer_n: int | None = 100_000,
                treehist: bool = True) -> dict:
    """Top-``k`` over ``2^32`` values of ``n`` devices (Zipf 1.1, :func:`estimators.sketch.pem.zipf_items`): PEM's
    randomize and decode times and recall, ours at ``n`` and both ours and pure-ldp's at ``peer_n`` (``None``: no
    peer run; ``peer_n = n``: one run); TreeHist's when the module exists."""
    out: dict = {"n": n, "eps": eps, "k": k}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_peer = peer_n is not None and peer_n == n and peer_available()
        out["pem"] = compare_with_pure_ldp(n=n, seed=seed, eps=eps, k=k, run_pure_ldp=run_peer)
        if peer_n is not None and peer_n != n and peer_available():
            out["pem_peer"] = compare_with_pure_ldp(n=peer_n, seed=seed, eps=eps, k=k, run_pure_ldp=True)
    if treehist:
        out["treehist"] = _treehist_topk(n, eps, k, seed)
    return out


def _treehist_topk(n: int, eps: float, k: int, seed: int) -> dict | str:
    try:
        from estimators.sketch.treehist import TreeHist
    except ImportError:
        return "estimators.sketch.treehist not present"
    try:
        items = zipf_items(n, 32, 1.1, seed)
        ids = items.astype(np.uint64) << np.uint64(32)
        th = TreeHist(eps, bits=32)
        rng = np.random.default_rng(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            rep = th.randomize(ids, rng)
            t1 = time.perf_counter()
            sup = th.support(rep)
            t2 = time.perf_counter()
            top = th.top_k(sup, n, k)
            t3 = time.perf_counter()
        u, c = np.unique(items, return_counts=True)
        truth = set(u[np.argsort(-c, kind="stable")[:k]].tolist())
        found = set((np.asarray(top.items, dtype=np.uint64) >> np.uint64(32)).astype(np.int64).tolist())
        return {"recall": len(found & truth) / k, "randomize_s": t1 - t0, "support_s": t2 - t1, "decode_s": t3 - t2}
    except Exception as exc:  # another session's module in progress: report, do not fail the bench
        return f"TreeHist failed: {type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------ audit
def _rappor_event(proto: RAPPOR, reports: np.ndarray, v1: int, v2: int) -> np.ndarray:
    """Reports (or PRR filters) whose bits at ``v1``'s filter are all 1 and at ``v2``'s all 0, the two filters
    disjoint in the report's cohort."""
    cohort, bits = proto.split_reports(reports)
    n = cohort.shape[0]
    b1 = proto.bloom_bits(np.full(n, v1, dtype=np.uint64), cohort)
    b2 = proto.bloom_bits(np.full(n, v2, dtype=np.uint64), cohort)
    rows = np.arange(n)[:, None]
    s1 = (bits[rows, b1 >> 3] >> (b1 & 7)) & 1
    s2 = (bits[rows, b2 >> 3] >> (b2 & 7)) & 1
    disjoint = ~(b1[:, :, None] == b2[:, None, :]).any(axis=(1, 2))
    return disjoint & s1.all(axis=1) & (s2 == 0).all(axis=1)


@dataclass(frozen=True)
class SketchAuditJob:
    """One sketch audit with :class:`estimators.audit.AuditJob`'s interface (``proto``, ``reports``, ``run``)."""

    name: str
    proto: object
    round: str
    v1: int = 0
    v2: int = 1
    chunk: int = 250_000

    def reports(self, trials: int | None = None) -> int:
        return 2 * (A.DEFAULT_TRIALS[self.round] if trials is None else trials)

    @property
    def label(self) -> str:
        """What ``ldp audit``'s progress bar names."""
        return f"{self.name} {' '.join(f'{a}={v}' for a, v in self._params().items() if a != 'protocol')}"

    def _params(self) -> dict:
        p = self.proto
        if isinstance(p, RAPPOR):
            return {"protocol": "RAPPOR", "m": p.m, "h": p.h, "cohorts": p.cohorts, "f": p.requested[0],
                    "p": p.requested[1], "q": p.requested[2]}
        if isinstance(p, TreeHist):
            return {"protocol": "TreeHist", "eps": p.eps, "bits": p.bits, "step": p.step, "rows": p.R, "g": p.g}
        return {"protocol": p.name, "eps": p.eps, "m": p.m, "rows": p.k}

    def _hits(self, v: int, trials: int, rng, on_chunk) -> int:
        p, count, left = self.proto, 0, trials
        while left:
            m = min(self.chunk, left)
            ids = np.full(m, v, dtype=np.uint64)
            if isinstance(p, RAPPOR):
                state = p.new_state(m, rng=rng)
                out = p.memoized_outputs(ids, state) if self.round == "prr" else p.randomize(ids, rng, state=state)
                ev = _rappor_event(p, out, self.v1, self.v2)
            elif isinstance(p, TreeHist) and self.round == "prr":  # the memoized row and bucket of fresh devices
                ev = p.audit_event(p.memoized_outputs(ids, p.new_state(m, rng=rng)), self.v1, self.v2)
            else:
                ev = p.audit_event(p.randomize(ids, rng), self.v1, self.v2)
            count += int(np.count_nonzero(ev))
            left -= m
            on_chunk(m)
        return count

    def run(self, trials: int | None = None, seed: int = 0, confidence: float = 0.95, on_progress=None):
        trials = A.DEFAULT_TRIALS[self.round] if trials is None else int(trials)
        if trials < 1:
            raise LDPError(f"trials must be positive, got {trials}")
        if self.v1 == self.v2:
            raise LDPError(f"v1 and v2 must differ, got {self.v1} twice")
        done = [0]

        def tick(m):
            done[0] += m
            if on_progress is not None:
                on_progress(done[0], 2 * trials)

        hits = [self._hits(v, trials, np.random.default_rng(ss), tick)
                for v, ss in zip((self.v1, self.v2), np.random.SeedSequence(seed).spawn(2))]
        c1, c2 = hits
        p = self.proto
        claim = p.eps_inf if self.round == "prr" else p.eps_first
        event = ("v1's filter bits 1, v2's 0" if isinstance(p, RAPPOR) else
                 "cell h(v1)=1, h(v2)=0" if isinstance(p, CMS) else
                 "bucket = h(v1's prefix) != h(v2's)" if isinstance(p, TreeHist) else "bit = H[h(v1), l] != H[h(v2), l]")
        return A.AuditResult(
            protocol=self.name, params=self._params(), v1=self.v1, v2=self.v2, trials=trials, confidence=confidence,
            hits1=c1, hits2=c2, eps_hat=A.eps_point_estimate(c1, c2, trials),
            eps_hat_ci=A.eps_interval(c1, c2, trials, confidence),
            eps_lower=A.eps_lower_bound(c1, c2, trials, confidence), eps_theory=float(claim), round=self.round,
            event=event)


@dataclass(frozen=True)
class _PEMLevelJob:
    """PEM's OLH of one level through the generic audit (:func:`estimators.audit.audit`)."""

    name: str
    proto: object
    round: str
    v1: int = 0
    v2: int = 1
    level: int = 0

    def reports(self, trials: int | None = None) -> int:
        return 2 * (A.DEFAULT_TRIALS[self.round] if trials is None else trials)

    def run(self, trials: int | None = None, seed: int = 0, confidence: float = 0.95, on_progress=None):
        # its own draws per level (the same seed would repeat one level's hits seven times)
        r = A.audit(self.proto, self.v1, self.v2, trials=trials, seed=seed + self.level, confidence=confidence,
                    on_progress=on_progress, round="first")
        return dataclasses.replace(r, protocol=self.name)


def sketch_cases(eps: float = 1.0, m: int = 64, rows: int = 16, seed: int = 0, pem_bits: int = 32,
                 pem_step: int = 4, pem_start: int = 4) -> dict[str, object]:
    """The sketch protocols ``ldp audit`` checks, by name: CMS and HCMS (ε, ``m`` cells, ``rows``), RAPPOR at the
    paper's parameters (m=32 here, h=2, 4 cohorts, f=0.5, p=0.5, q=0.75), PEM (ε, 32 bits, levels of 4 bits)."""
    return {"CMS": CMS(eps, m, rows, seed), "HCMS": HCMS(eps, m, rows, seed),
            "RAPPOR": RAPPOR(32, 2, 4, 0.5, 0.5, 0.75, seed=seed, memo_slots=64),
            "PEM": PEM(pem_bits, eps, 20, step=pem_step, start_bits=pem_start),
            "TreeHist": TreeHist(eps, bits=32, step=4, rows=rows, seed=seed)}


def sketch_audit_jobs(names, round: str, eps: float = 1.0, v1: int = 0, v2: int = 1, seed: int = 0,
                      m: int = 64, rows: int = 16) -> list:
    """Audit jobs of the named sketches (``SKETCHES``) in ``round`` (first: all; prr: RAPPOR and TreeHist, the
    memoized response alone; longitudinal: none — the accounting per memoized value is not audited here)."""
    bad = [nm for nm in names if nm not in SKETCHES]
    if bad:
        raise LDPError(f"unknown sketch {', '.join(bad)}; one of {', '.join(SKETCHES)}")
    cases = sketch_cases(eps, m, rows, seed)
    jobs: list = []
    for nm in names:
        p = cases[nm]
        if round == "prr":
            if nm == "RAPPOR":
                jobs.append(SketchAuditJob(nm, p, round, v1, v2))
            elif nm == "TreeHist":
                jobs.append(SketchAuditJob(nm, p, round, v1, v1 ^ (1 << 63)))
        elif round == "first":
            if nm == "PEM":
                jobs += [_PEMLevelJob(f"PEM level {i + 1} OLH k=2^{ell}", o, round, v1, v2, i)
                         for i, (ell, o) in enumerate(zip(p.prefix_bits, p.oracles))]
            elif nm == "TreeHist":  # ids that differ in their top bit: their prefixes differ at every level
                jobs.append(SketchAuditJob(nm, p, round, v1, v1 ^ (1 << 63)))
            else:
                jobs.append(SketchAuditJob(nm, p, round, v1, v2))
    return jobs


# ------------------------------------------------------------------------------ `ldp bench protocols -p sketch`
#: acceptance targets: ours / pure-ldp in the same run
TARGETS = {("CMS", "rand"): 20, ("CMS", "agg"): 20, ("HCMS", "rand"): 20, ("HCMS", "agg"): 20}
TOPK_SECONDS = 10.0  # decode of the top-K over 2^32 values, n = 10^6, on the 2-core machine


def _si(rate: float | None) -> str:
    if not rate:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if rate >= div:
            return f"{rate / div:.3g}{unit}"
    return f"{rate:.3g}"


def _ratio(name: str, kind: str, a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    r = a / b
    target = TARGETS.get((name, kind))
    mark = "" if target is None else (f" [green]≥{target} ok[/green]" if r >= target else f" [red]<{target}![/red]")
    return f"{r:,.1f}x{mark}"


def bench_tables(names, n: int = 100_000, eps: float = 1.0, m: int = 1024, rows: int = 16, repeats: int = 3,
                 peer_seconds: float = 4.0, seed: int = 0, topk_n: int = 1_000_000, topk_eps: float = 4.0,
                 pem_peer_n: int | None = 100_000, same_n: int = 20_000,
                 on_step: Callable[[str], None] | None = None) -> tuple[list, list[str]]:
    """The tables of ``ldp bench protocols -p sketch`` (rich ``Table`` objects) and the notes printed below them."""
    from rich.markup import escape
    from rich.table import Table

    have_peer = peer_available()
    tables, notes = [], []
    if not have_peer:
        notes.append("[yellow]pure-ldp is not installed (pip install -e '.[bench]'): peer columns empty[/yellow]")
    fo = [nm for nm in names if nm in ("CMS", "HCMS", "RAPPOR")]
    if fo:
        rates = bench_rates(n, eps, m, rows, repeats=repeats, peer_seconds=peer_seconds, seed=seed, protocols=fo,
                            on_step=on_step)
        t = Table(title=f"open-domain sketches vs pure-ldp 1.2.0, same run: ε={eps:g} (CMS/HCMS m={m}, {rows} rows; "
                        f"RAPPOR m=128, h=2, 8 cohorts, f=0.5, PRR only), n={n:,} (reports/s; support+estimate of "
                        f"1000 candidates, RAPPOR 64 by least squares)")
        for col in ("protocol", "randomize", "pure-ldp client", "ratio", "support+estimate", "pure-ldp server",
                    "ratio", "pure-ldp n"):
            t.add_column(col, justify="left" if col == "protocol" else "right")
        for r in rates:
            t.add_row(r.name, _si(r.ours_rand), _si(r.peer_rand), _ratio(r.name, "rand", r.ours_rand, r.peer_rand),
                      _si(r.ours_agg), _si(r.peer_agg), _ratio(r.name, "agg", r.ours_agg, r.peer_agg),
                      f"{r.peer_n:,}" if r.peer_n else "-")
            if r.note:
                notes.append(f"{r.name}: {escape(r.note)}")
        tables.append(t)
        if have_peer:
            if on_step is not None:
                on_step("same reports")
            same = same_reports(min(n, same_n), eps, m, rows, seed=seed, protocols=fo)
            t = Table(title=f"same reports: pure-ldp's client reports through our support and estimator (pure-ldp's "
                            f"hashes), n={min(n, same_n):,}, 100 candidates (Zipf 1.3); MSE of the frequencies")
            for col in ("protocol", "c ours", "c pure-ldp", "max |ours - pure-ldp|", "same with c = c_ε",
                        "MSE ours", "MSE pure-ldp", "MSE ours on pure-ldp reports", "our variance"):
                t.add_column(col, justify="left" if col == "protocol" else "right")
            for nm, d in same.items():
                mse = d["mse"]
                if nm == "RAPPOR":
                    t.add_row(nm, "-", "-", "-", "-", f"{mse['ours']:.3e}",
                              "-" if mse["pure_ldp"] is None else f"{mse['pure_ldp']:.3e}",
                              f"{mse['ours_on_pure_ldp_reports']:.3e} "
                              f"(rescaled {mse['ours_on_pure_ldp_reports_rescaled']:.3e})", "-")
                    notes.append(f"RAPPOR same reports: P(B'=1 | B=1) measured {d['p_set_pure_ldp']:.4f} in "
                                 f"pure-ldp's reports, {d['p_set_ours']:.4f} in ours, stated 1 - f/2 = "
                                 f"{d['p_set_stated']:.2f}; P(B'=1 | B=0) {d['p_clear_pure_ldp']:.4f} / "
                                 f"{d['p_clear_ours']:.4f}. {escape(d['explained'])}")
                    continue
                t.add_row(nm, f"{d['c_ours']:.12g}", f"{d['c_pure_ldp']:.12g}",
                          f"{d['max_abs_diff']:.3g} ({d['rel_diff']:.2g} rel.)",
                          f"{d['max_abs_diff_c_eps']:.3g} ({d['rel_diff_c_eps']:.2g} rel.)"
                          + (" [green]equal[/green]" if d["equal_with_c_eps"] else " [red]differ[/red]"),
                          f"{mse['ours']:.3e}", f"{mse['pure_ldp']:.3e}", f"{mse['ours_on_pure_ldp_reports']:.3e}",
                          f"{mse['ours_theory']:.3e}")
                notes.append(f"{nm} same reports: {escape(d['explained'])}")
            tables.append(t)
    if "PEM" in names:
        if on_step is not None:
            on_step("top-K over 2^32")
        res = topk_decode(topk_n, topk_eps, 20, seed, peer_n=pem_peer_n if have_peer else None)
        t = Table(title=f"top-20 over 2^32 values, Zipf 1.1, ε={topk_eps:g} (PEM: 7 levels of 4 bits from 4; "
                        f"TreeHist when present): seconds")
        for col in ("method", "n", "randomize", "decode", f"decode < {TOPK_SECONDS:g} s", "recall",
                    "randomize reports/s"):
            t.add_column(col, justify="left" if col == "method" else "right")

        def row(label, nn, d, target=False):
            dec = d["decode_s"]
            ok = ("[green]ok[/green]" if dec < TOPK_SECONDS else "[red]no[/red]") if target else "-"
            t.add_row(label, f"{nn:,}", f"{d['randomize_s']:.2f}", f"{dec:.2f}", ok, f"{d['recall']:.2f}",
                      _si(nn / d["randomize_s"]))

        pem = res["pem"]
        row("PEM (ours)", topk_n, pem["ours"], target=True)
        if "pure_ldp" in pem:
            row("PEM (pure-ldp)", topk_n, pem["pure_ldp"])
        if "pem_peer" in res:
            row("PEM (ours)", pem_peer_n, res["pem_peer"]["ours"])
            row("PEM (pure-ldp)", pem_peer_n, res["pem_peer"]["pure_ldp"])
        th = res.get("treehist")
        if isinstance(th, dict):
            t.add_row("TreeHist (ours)", f"{topk_n:,}", f"{th['randomize_s']:.2f}",
                      f"{th['support_s'] + th['decode_s']:.2f} (support {th['support_s']:.2f})",
                      "[green]ok[/green]" if th["support_s"] + th["decode_s"] < TOPK_SECONDS else "[red]no[/red]",
                      f"{th['recall']:.2f}", _si(topk_n / th["randomize_s"]))
        elif th:
            notes.append(f"TreeHist: {escape(str(th))}")
        tables.append(t)
        notes.append("PEM: pure-ldp's OLH server is the lazy one of estimators.sketch.pem.compare_with_pure_ldp (its "
                     "own walks 2^32 values per report); its hash family differs from ours, so PEM is compared by "
                     "recall on the same data, not report by report")
    return tables, notes
