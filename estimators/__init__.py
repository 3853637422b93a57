"""ldp-stream's LDP science: protocols, estimators, variances, solvers and privacy accounting.

>>> import numpy as np, estimators
>>> proto = estimators.make("L-OSUE", k=100, eps_inf=2.0, eps_1=1.0)
>>> state = proto.new_state(1000)
>>> reports = proto.randomize(np.zeros(1000, dtype=int), np.random.default_rng(0), state=state)
>>> freq = proto.estimate(proto.support(reports), 1000)
"""
from __future__ import annotations

from . import adaptive, bitflip, direct, hadamard, hashing, histogram, subset, unary
from .base import FrequencyProtocol, PureProtocol
from .errors import InfeasibleParameters, InvalidReports, InvalidState, LDPError
from .memo import MemoState
from .registry import from_params, make, protocols, register

for _cls in (direct.GRR, unary.SUE, unary.OUE, adaptive.ADP,
             direct.LGRR, unary.LSUE, unary.LOUE, unary.LOSUE, unary.LSOUE, adaptive.LADP,
             hadamard.HR, hadamard.FHR,
             hashing.BLH, hashing.OLH, hashing.LOLOHA,
             bitflip.DBitFlipPM,
             subset.SS, histogram.SHE, histogram.THE):
    register(_cls)

PROTOCOLS: tuple[str, ...] = protocols()

__all__ = ["make", "from_params", "PROTOCOLS", "FrequencyProtocol", "PureProtocol", "MemoState",
           "LDPError", "InfeasibleParameters", "InvalidReports", "InvalidState"]
