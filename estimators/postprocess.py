"""Post-processing of unbiased frequency estimates into consistent histograms.

Every method is a function of the unbiased estimate (itself a function of ``(counts, n)``),
so post-processing keeps the server state mergeable. References: Wang et al., NDSS 2020 ("Locally
differentially private frequency estimation with consistency") for Norm-Sub; Duchi et al.,
ICML 2008 for the Euclidean projection onto the simplex; Agrawal & Aggarwal, PODS 2001, and
ElSalamouny & Palamidessi, EuroS&P 2020, for the iterative Bayesian update (IBU).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import LDPError

METHODS = ("clip", "norm-sub", "project", "ibu")


def clip(f: np.ndarray) -> np.ndarray:
    """Clip negatives to zero, then rescale to sum to one (uniform if nothing is left)."""
    g = np.clip(np.asarray(f, dtype=np.float64), 0.0, None)
    s = g.sum()
    return g / s if s > 0 else np.full_like(g, 1.0 / g.size)


def norm_sub(f: np.ndarray, max_iter: int = 10_000) -> np.ndarray:
    """Norm-Sub: zero the negatives and shift the positives by a common δ until consistent."""
    g = np.asarray(f, dtype=np.float64).copy()
    for _ in range(max_iter):
        pos = g > 0
        if not pos.any():
            return np.full_like(g, 1.0 / g.size)
        g[~pos] = 0.0
        g[pos] += (1.0 - g[pos].sum()) / pos.sum()
        if (g >= 0).all():
            return g
    raise LDPError("norm-sub did not converge")  # pragma: no cover - bounded by k iterations


def project(f: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (sort-based, O(k log k))."""
    x = np.asarray(f, dtype=np.float64)
    u = np.sort(x)[::-1]
    css = np.cumsum(u) - 1.0
    idx = np.arange(1, x.size + 1)
    rho = np.nonzero(u - css / idx > 0)[0][-1]
    tau = css[rho] / (rho + 1)
    return np.maximum(x - tau, 0.0)


def ibu(counts: np.ndarray, n: int, ps: float, qs: float, iters: int = 1000, tol: float = 1e-12) -> np.ndarray:
    """Iterative Bayesian update on support counts.

    The observation channel of a pure protocol is ``P(a report supports j | value i) = ps``
    if ``i == j`` else ``qs``; IBU is the EM fixed point of the likelihood of the observed
    support rates ``counts / n`` under that channel, started from the uniform histogram.
    """
    k = counts.shape[0]
    obs = np.asarray(counts, dtype=np.float64) / max(n, 1)
    f = np.full(k, 1.0 / k)
    col = ps + (k - 1) * qs  # column sums of the channel
    for _ in range(iters):
        pred = qs + (ps - qs) * f  # (A f)_j
        ratio = np.divide(obs, pred, out=np.zeros(k), where=pred > 0)
        back = qs * ratio.sum() + (ps - qs) * ratio  # (A^T ratio)_i
        new = f * back / col
        s = new.sum()
        new = new / s if s > 0 else np.full(k, 1.0 / k)
        if np.abs(new - f).max() < tol:
            return new
        f = new
    return f


_SIMPLE: dict[str, Callable[[np.ndarray], np.ndarray]] = {"clip": clip, "norm-sub": norm_sub, "project": project}


def apply(method: str | None, f: np.ndarray, counts: np.ndarray | None = None, n: int | None = None,
          ps: float | None = None, qs: float | None = None) -> np.ndarray:
    """Dispatch by name; ``None`` returns the unbiased estimate unchanged."""
    if method is None:
        return f
    if method in _SIMPLE:
        return _SIMPLE[method](f)
    if method == "ibu":
        if counts is None or n is None or ps is None or qs is None:
            raise LDPError("ibu needs the support counts and a pure protocol's (ps, qs)")
        return ibu(counts, n, ps, qs)
    raise LDPError(f"unknown post-processing {method!r}; choose one of {', '.join(METHODS)}")
