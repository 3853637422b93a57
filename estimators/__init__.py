"""ldp-stream's LDP science: protocols, estimators, variances, solvers and privacy accounting.

>>> import numpy as np, estimators
>>> proto = estimators.make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)
>>> state = proto.new_state(1000)
>>> reports = proto.randomize(np.zeros(1000, dtype=int), np.random.default_rng(0), state=state)
>>> freq = proto.estimate(proto.support(reports), 1000)

Multidimensional solutions (several attributes, one budget; :mod:`estimators.multidim`):

>>> sol = estimators.make_solution("ALLOMFREE", ks=[2, 10, 300], eps_inf=2.0, eps_1=1.0)
>>> st = sol.new_state(1000)
>>> out = sol.randomize(np.zeros((1000, 3), dtype=int), state=st)
>>> counts, ns = sol.support(out), sol.report_counts(out)
>>> freq = sol.estimate(0, counts[0], ns[0])
"""
from __future__ import annotations

from . import adaptive, bitflip, direct, hadamard, hashing, histogram, multidim, subset, unary
from .base import FrequencyProtocol, PureProtocol
from .errors import InfeasibleParameters, InvalidReports, InvalidState, LDPError
from .memo import MemoState
from .multidim import AttributeView, MultiReports, MultiState, Solution
from .registry import from_params, make, protocols, register
from .solution_registry import make_solution, register_solution, solution_from_params, solutions

for _cls in (direct.GRR, unary.SUE, unary.OUE, adaptive.ADP,
             direct.LGRR, unary.LSUE, unary.LOUE, unary.LOSUE, unary.LSOUE, adaptive.LADP,
             hadamard.HR, hadamard.FHR,
             hashing.BLH, hashing.OLH, hashing.LOLOHA,
             bitflip.DBitFlipPM,
             subset.SS, histogram.SHE, histogram.THE):
    register(_cls)

for _sol in (multidim.SPL, multidim.SMP, multidim.RSFD, multidim.LSPL, multidim.LSMP, multidim.ALLOMFREE,
             multidim.LRSFD):
    register_solution(_sol)

PROTOCOLS: tuple[str, ...] = protocols()
SOLUTIONS: tuple[str, ...] = solutions()

__all__ = ["make", "from_params", "PROTOCOLS", "FrequencyProtocol", "PureProtocol", "MemoState",
           "make_solution", "solution_from_params", "SOLUTIONS", "Solution", "AttributeView", "MultiState",
           "MultiReports", "LDPError", "InfeasibleParameters", "InvalidReports", "InvalidState"]
