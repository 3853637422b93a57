"""Per-token rates of one ingest process: token buckets keyed by a credential's id.

:class:`TokenRates` gives each token a bucket of ``rate`` units per second holding at most ``burst`` units
(a client may spend a burst at once, then ``rate`` per second). The ingest keeps two of them (:mod:`.handler`):

* requests per token: every request whose token verified takes one unit *before* anything else is checked,
  so refused requests (bad bodies, too many reports, rate-limited reports) count too: 429
  ``token_rate_limited`` past it (device and relay tokens each with their own rate);
* reports per relay token: a relay's decoded request takes one unit per report: 429 ``relay_rate_limited``
  past it (nothing of the request is published).

The buckets are per process, in memory (no Redis round trip): behind ``N`` processes (or hosts) a token may
get up to ``N`` times the rate. At most ``max_tokens`` buckets are kept (the least recently used dropped: a
dropped token starts again with a full bucket).
"""
from __future__ import annotations

import math
import time
from collections import OrderedDict
from typing import Callable

__all__ = ["TokenRates"]


class TokenRates:
    """Token buckets per credential id (module doc); ``clock``: monotonic seconds (tests)."""

    def __init__(self, rate: float, burst: float, *, max_tokens: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not (rate > 0 and burst >= 1 and max_tokens >= 1):
            raise ValueError(f"bad token rate: rate={rate}, burst={burst}, max_tokens={max_tokens}")
        self.rate, self.burst, self.max_tokens = float(rate), float(burst), max_tokens
        self.clock = clock
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # id -> (units, when)

    def take(self, key: bytes, units: float = 1.0) -> float:
        """Take ``units`` from ``key``'s bucket: 0.0 if it held them, else the seconds until it will (nothing taken).
        A request over the burst can never pass: ``math.inf``."""
        if units > self.burst:
            return math.inf
        now = self.clock()
        held, when = self._buckets.pop(key, (self.burst, now))
        held = min(self.burst, held + (now - when) * self.rate)
        if held >= units:
            held -= units
            wait = 0.0
        else:
            wait = (units - held) / self.rate
        self._buckets[key] = (held, now)
        if len(self._buckets) > self.max_tokens:
            self._buckets.popitem(last=False)
        return wait
