"""``ldp bench devices``: how fast each device-side implementation randomizes, side by side in one run.

One protocol setting (L-OSUE, k = 100, ε∞ = 4, ε1 = 1 by default), each implementation on one core:

* the numba kernel (``estimators``), one thread, a batch of ``n`` devices per call (the simulated fleet's path);
* the same protocol object called for one report at a time (what ``producers.sdk.Device`` does per report);
* the light Python SDK (``clients/python``, pure Python and ``cryptography``), one report per call, with its
  memoized responses kept in memory and computed anew;
* the JavaScript client (``clients/js``, Node), one report per call (it computes the memoized response anew).

Every one draws a fresh 256-bit noise key per call from the OS CSPRNG and memoizes under a fixed memo key, so the
rates compare like with like; the ratio column is each rate over the numba kernel's.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LIGHT_SDK = ROOT / "clients" / "python"
JS_CLIENT = ROOT / "clients" / "js"

__all__ = ["Rate", "numba_batch_rate", "single_report_rate", "light_sdk_rates", "js_client_rate", "run"]


@dataclass(frozen=True)
class Rate:
    """Reports per second of one implementation (``None``: not measured, with the reason in ``note``)."""

    name: str
    reports_per_second: float | None
    note: str = ""


def _protocol(k: int, eps_inf: float, eps_1: float):
    from estimators.registry import make

    return make("L-OSUE", k=k, eps_inf=eps_inf, eps_1=eps_1)


def numba_batch_rate(k: int, eps_inf: float, eps_1: float, n: int = 100_000, seconds: float = 2.0) -> Rate:
    """The numba kernel on one thread: ``n`` devices (memo keys from the CSPRNG) per ``randomize`` call."""
    import numba

    proto = _protocol(k, eps_inf, eps_1)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        state = proto.new_state(n)
        values = np.arange(n, dtype=np.int64) % 8
        proto.randomize(values[:1000], state=state.subset(slice(0, 1000)))  # compile or load the kernel
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            proto.randomize(values, state=state)
            done += n
        return Rate("numba kernel (batch of %s, 1 thread)" % f"{n:,}", done / (time.perf_counter() - start))
    finally:
        numba.set_num_threads(threads)


def single_report_rate(k: int, eps_inf: float, eps_1: float, seconds: float = 2.0) -> Rate:
    """The reference protocol object called for one report at a time (numba kernel, call overhead included)."""
    proto = _protocol(k, eps_inf, eps_1)
    state = proto.new_state(1)
    one = np.zeros(1, dtype=np.int64)
    proto.randomize(one, state=state)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i in range(256):
            one[0] = i & 7
            proto.randomize(one, state=state)
        done += 256
    return Rate("reference SDK path (numba, one report per call)", done / (time.perf_counter() - start))


def _json_line(cmd: list[str], cwd: Path, timeout: float) -> dict:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def light_sdk_rates(k: int, eps_inf: float, eps_1: float, seconds: float = 2.0) -> list[Rate]:
    """The light Python SDK in its own interpreter (no numpy loaded), ``clients/python/bench_randomize.py``: with
    the memoized responses kept in memory (a value reported before), and with each one computed anew (a new
    value, and what the JavaScript client does for every report)."""
    names = ("light Python SDK (one report per call)", "light Python SDK (PRR computed anew each report)")
    try:
        out = _json_line([sys.executable, str(LIGHT_SDK / "bench_randomize.py"), str(seconds), str(k), str(eps_inf),
                          str(eps_1)], LIGHT_SDK, 60 + 6 * seconds)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return [Rate(names[0], None, str(exc))]
    note = f"Python {out.get('python', '?')}, pinned to one core"
    return [Rate(names[0], float(out["reports_per_second"]), note),
            Rate(names[1], float(out["cold_prr_reports_per_second"]), note)]


def js_client_rate(k: int, eps_inf: float, eps_1: float, seconds: float = 2.0) -> Rate:
    """The JavaScript client under Node: ``clients/js/bench/randomize.mjs`` (needs ``npm ci`` in clients/js)."""
    name = "JavaScript client (Node, one report per call, PRR computed anew)"
    node = shutil.which("node")
    if node is None:
        return Rate(name, None, "node is not installed")
    if not (JS_CLIENT / "node_modules").is_dir():
        return Rate(name, None, "run `npm ci` in clients/js first")
    try:
        out = _json_line([node, "bench/randomize.mjs", str(seconds), str(k), str(eps_inf), str(eps_1)], JS_CLIENT,
                         60 + 4 * seconds)
    except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        return Rate(name, None, str(exc))
    return Rate(name, float(out["reports_per_second"]), f"Node {out.get('node', '?')}")


def run(k: int = 100, eps_inf: float = 4.0, eps_1: float = 1.0, n: int = 100_000, seconds: float = 2.0,
        progress=None) -> list[Rate]:
    """Every implementation, one after the other (never two at once: each has the core to itself)."""
    steps = [("numba kernel", lambda: [numba_batch_rate(k, eps_inf, eps_1, n, seconds)]),
             ("reference SDK path", lambda: [single_report_rate(k, eps_inf, eps_1, seconds)]),
             ("light Python SDK", lambda: light_sdk_rates(k, eps_inf, eps_1, seconds)),
             ("JavaScript client", lambda: [js_client_rate(k, eps_inf, eps_1, seconds)])]
    rates: list[Rate] = []
    for label, step in steps:
        if progress is not None:
            progress(label)
        rates += step()
    return rates
