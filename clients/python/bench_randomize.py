"""Reports per second of L-OSUE (k = 100, ε∞ = 4, ε1 = 1) randomization with the light device SDK, on one core.

As a real device: one device, its memo key fixed, a fresh 256-bit noise key from the OS CSPRNG per report
(``secrets.token_bytes``), values cycling over 8 memoized values: the report bytes of one device, as
``Device.randomize`` makes them (without the ledger's file writes). ``cold_prr``: the same with every permanent
response (PRR) computed anew from the memo key, as for a value never reported before. Prints one JSON line with
wall-clock and CPU-time rates (the process is pinned to one core; CPU time is what a busy machine cannot steal).

    python clients/python/bench_randomize.py [seconds] [k] [eps_inf] [eps_1]
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ldp_device import make, os_key  # noqa: E402


def bench(seconds: float = 2.0, k: int = 100, eps_inf: float = 4.0, eps_1: float = 1.0) -> dict:
    proto = make("L-OSUE", k=k, eps_inf=eps_inf, eps_1=eps_1)
    state = proto.new_state(os_key)
    randomize = proto.randomize

    def run(duration: float, cold: bool) -> tuple[int, float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        end = t0 + duration
        n = 0
        while time.perf_counter() < end:
            for i in range(256):
                if cold:
                    state.responses.clear()
                randomize((n + i) & 7, os_key, state)
            n += 256
        return n, time.perf_counter() - t0, time.process_time() - c0

    run(0.2, False)  # warm-up
    out: dict = {"sdk": "ldp_device", "protocol": proto.name, "k": k, "eps_inf": eps_inf, "eps_1": eps_1,
                 "report_bytes": proto.report_nbytes}
    for name, cold in (("", False), ("cold_prr_", True)):
        n, wall, cpu = run(seconds, cold)
        out.update({f"{name}reports": n, f"{name}seconds": round(wall, 3),
                    f"{name}reports_per_second": round(n / wall), f"{name}reports_per_cpu_second": round(n / cpu)})
    out["python"] = platform.python_version()
    return out


def main(argv: list[str]) -> None:
    args = [float(a) for a in argv[:4]]
    defaults = [2.0, 100, 4.0, 1.0]
    seconds, k, eps_inf, eps_1 = (args + defaults[len(args):])[:4]
    if hasattr(os, "sched_setaffinity"):  # one core
        try:
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        except OSError:
            pass
    print(json.dumps(bench(seconds, int(k), eps_inf, eps_1)))


if __name__ == "__main__":
    main(sys.argv[1:])
