"""Randomizer test vectors (``docs/wire-format.md``, "Randomizer vectors"): ``tests/data/randomizer-vectors.json``.

``python -m ldpstream_dev.randomizer_vectors [--out PATH]`` writes them from the reference implementation (the
protocols of :mod:`estimators` and the device ledger of :class:`producers.sdk.Device`):

* ``streams``: ChaCha20 stream words ``(key, domain, a)`` of every stream domain;
* ``protocols``: every protocol of the registry at one or more settings, one device over several steps (a
  repeat, a change of value, a return to the first value): its memo key, each step's value, the 256-bit keys the
  randomizer drew (in draw order), the exact report bytes and the memo cells marked after the step;
* ``solutions``: every multidimensional solution likewise (the keys its device state drew, the sampled
  attribute, the fake inputs, per step the reports of every attribute or ``null``);
* ``numeric``: every numeric mechanism (:data:`estimators.numeric.MECHANISMS`, behind the protocol contract of
  :class:`estimators.numeric.protocol.NumericProtocol`) at one or more settings, one device over
  :data:`NUMERIC_STEPS` (a repeat, a change, a return, a value outside the range: clipped): its parameters and
  calibrated integers, memo key (1BitMean), per step the value, the unit input it randomized, whether it was
  clipped, the keys drawn, the exact report bytes, the memo cells (1BitMean) and how many words the report drew
  past its noise slot (the extension stream: rejection redraws, the exact Laplace sampler);
* ``ledger``: the device ledger's accounting over a schedule of reports under a budget (reserved and actual
  loss, the value each report randomized, frozen reports, refusals), on one campaign (:data:`LEDGER_CAMPAIGN`);
* ``numeric_ledger``: the same with numeric attributes, on their own campaign (:data:`NUMERIC_LEDGER_CAMPAIGN`);
* ``open_domain``: the open-domain values of ``type = "string"`` / ``"u64"`` attributes (:mod:`estimators.sketch`):
  ``value_ids`` (strings, non-ASCII included, and integers -> their 64-bit id), ``sketch_hash`` (the public hash
  family: row seeds, spreads and ``h_j(id)`` of a few ids and seeds) and ``cases``: every open-domain protocol
  (:data:`estimators.sketch.OPEN_PROTOCOLS`) at one or more settings, a device over :data:`OPEN_STEPS` (its
  values, their ids, the keys drawn, the exact report bytes, the words drawn past the noise slot; a memoizing
  protocol's device (TreeHist) also its memo key, level, and per step its memo tag table (``memoized``: the
  ``memo_slots / 64`` little-endian uint64 tags of its state bytes, 16 hex digits each, ``0`` an empty slot, all
  ones in slot 0 an overflowed table), ``memoized_count`` (the distinct memoized prefixes, ``"inf"`` once the
  table overflowed), its memoized report and memoized input). Every 64-bit
  quantity is written as 16 hex digits (``id``, ``seed_hex``: JSON numbers lose bits past 2^53 in JavaScript).

Keys are drawn from a seeded generator (the labelled simulation mode: reproducible, not private) and recorded,
so a client in any language replays a case by handing its randomizer the recorded keys in order.
``tests/test_randomizer_vectors.py`` checks them with the numba kernels and their numpy twins.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from estimators.base import FrequencyProtocol
from estimators.multidim import MultiState, Solution
from estimators.numeric import make_numeric
from estimators.numeric.protocol import NumericProtocol
from estimators.randomness import (BITFLIP_BIT, BITFLIP_J, KEY_WORDS, LH_SEED, NOISE, NOISE_EXT, ONEBIT_ALPHA,
                                   PRR, SimulationWarning, np_stream_words)
from estimators.registry import make
from estimators.solution_registry import make_solution

__all__ = ["VECTORS_PATH", "KeyTape", "key_hex", "key_words", "report_hex", "protocol_case", "solution_case",
           "numeric_case", "replay_numeric", "numeric_twins", "ledger_case", "open_domain_section", "open_case",
           "replay_open", "open_twins", "generate", "main"]

VECTORS_PATH = Path(__file__).resolve().parent.parent / "tests" / "data" / "randomizer-vectors.json"
FORMAT = "ldp-stream/randomizer-vectors"
VERSION = 1
SEED = 20261126
DOMAINS = {"PRR": PRR, "NOISE": NOISE, "LH_SEED": LH_SEED, "BITFLIP_J": BITFLIP_J, "BITFLIP_BIT": BITFLIP_BIT,
           "NOISE_EXT": NOISE_EXT, "ONEBIT_ALPHA": ONEBIT_ALPHA}

#: value sequences of one device: a repeat, a change, a return (indices are taken modulo k)
STEPS = (3, 3, 7, 3, 1)

#: (case name, protocol parameters): every registered protocol at least once
PROTOCOL_CASES: list[tuple[str, dict[str, Any]]] = [
    ("GRR k=5", {"protocol": "GRR", "k": 5, "eps": 1.0}),
    ("GRR k=300", {"protocol": "GRR", "k": 300, "eps": 2.0}),
    ("SUE k=10", {"protocol": "SUE", "k": 10, "eps": 1.0}),
    ("OUE k=10", {"protocol": "OUE", "k": 10, "eps": 1.0}),
    ("OUE k=1000", {"protocol": "OUE", "k": 1000, "eps": 0.5}),
    ("ADP k=5", {"protocol": "ADP", "k": 5, "eps": 2.0}),
    ("ADP k=50", {"protocol": "ADP", "k": 50, "eps": 1.0}),
    ("L-GRR k=5", {"protocol": "L-GRR", "k": 5, "eps_inf": 2.0, "eps_1": 1.0}),
    ("L-GRR k=12 paper", {"protocol": "L-GRR", "k": 12, "eps_inf": 3.0, "eps_1": 1.0, "calibration": "paper"}),
    ("L-SUE k=10", {"protocol": "L-SUE", "k": 10, "eps_inf": 2.0, "eps_1": 1.0}),
    ("L-OUE k=10", {"protocol": "L-OUE", "k": 10, "eps_inf": 2.0, "eps_1": 1.0}),
    ("L-OSUE k=10", {"protocol": "L-OSUE", "k": 10, "eps_inf": 2.0, "eps_1": 1.0}),
    ("L-OSUE k=100", {"protocol": "L-OSUE", "k": 100, "eps_inf": 4.0, "eps_1": 1.0}),
    ("L-OSUE k=1000", {"protocol": "L-OSUE", "k": 1000, "eps_inf": 1.0, "eps_1": 0.5}),
    ("L-SOUE k=10", {"protocol": "L-SOUE", "k": 10, "eps_inf": 2.0, "eps_1": 1.0}),
    ("L-ADP k=5", {"protocol": "L-ADP", "k": 5, "eps_inf": 4.0, "eps_1": 2.0}),
    ("L-ADP k=50", {"protocol": "L-ADP", "k": 50, "eps_inf": 2.0, "eps_1": 1.0}),
    ("HR k=10", {"protocol": "HR", "k": 10, "eps": 1.0}),
    ("FHR k=10", {"protocol": "FHR", "k": 10, "eps": 2.0}),
    ("BLH k=10", {"protocol": "BLH", "k": 10, "eps": 1.0}),
    ("OLH k=100", {"protocol": "OLH", "k": 100, "eps": 2.0}),
    ("LOLOHA k=50", {"protocol": "LOLOHA", "k": 50, "eps_inf": 2.0, "eps_1": 1.0}),
    ("LOLOHA k=50 g=3 paper", {"protocol": "LOLOHA", "k": 50, "eps_inf": 3.0, "eps_1": 1.0, "g": 3,
                               "calibration": "paper"}),
    ("dBitFlipPM d=2 (Floyd)", {"protocol": "dBitFlipPM", "k": 360, "b": 90, "d": 2, "eps_inf": 2.0}),
    ("dBitFlipPM d=6 (selection)", {"protocol": "dBitFlipPM", "k": 40, "b": 8, "d": 6, "eps_inf": 2.0}),
    ("SS k=10", {"protocol": "SS", "k": 10, "eps": 1.0}),
    ("SS k=64 bits", {"protocol": "SS", "k": 64, "eps": 0.5, "layout": "bits"}),
    ("SHE k=5", {"protocol": "SHE", "k": 5, "eps": 1.0}),
    ("THE k=10", {"protocol": "THE", "k": 10, "eps": 1.0}),
]

#: (case name, solution parameters): every registered solution at least once
SOLUTION_CASES: list[tuple[str, dict[str, Any]]] = [
    ("SPL GRR", {"solution": "SPL", "ks": [3, 10], "eps": 2.0, "protocol": "GRR"}),
    ("SMP OUE", {"solution": "SMP", "ks": [3, 10, 20], "eps": 1.0, "protocol": "OUE"}),
    ("SMP GRR per-step", {"solution": "SMP", "ks": [3, 10], "eps": 1.0, "protocol": "GRR", "sampling": "per-step"}),
    ("RS+FD GRR", {"solution": "RS+FD", "ks": [3, 10, 5], "eps": 1.0, "protocol": "GRR"}),
    ("RS+FD OUE-z", {"solution": "RS+FD", "ks": [3, 10], "eps": 1.0, "protocol": "OUE-z"}),
    ("RS+FD OUE-r", {"solution": "RS+FD", "ks": [3, 10], "eps": 1.0, "protocol": "OUE-r"}),
    ("RS+FD ADP per-step", {"solution": "RS+FD", "ks": [3, 40], "eps": 1.0, "protocol": "ADP",
                            "sampling": "per-step"}),
    ("L-SPL L-OSUE", {"solution": "L-SPL", "ks": [3, 10], "eps_inf": 4.0, "eps_1": 2.0, "protocol": "L-OSUE"}),
    ("L-SMP L-GRR", {"solution": "L-SMP", "ks": [3, 10, 4], "eps_inf": 2.0, "eps_1": 1.0, "protocol": "L-GRR"}),
    ("ALLOMFREE", {"solution": "ALLOMFREE", "ks": [2, 10, 60], "eps_inf": 2.0, "eps_1": 1.0}),
    ("ALLOMFREE fake data", {"solution": "ALLOMFREE", "ks": [2, 10, 60], "eps_inf": 2.0, "eps_1": 1.0,
                             "fake_data": True}),
    ("L-RS+FD L-OSUE", {"solution": "L-RS+FD", "ks": [3, 10], "eps_inf": 2.0, "eps_1": 1.0, "protocol": "L-OSUE"}),
]

#: tuples of one device over the steps of a solution case (taken modulo each k)
SOLUTION_STEPS = ((1, 3, 7), (1, 3, 7), (2, 9, 7), (1, 3, 7))


class KeyTape(np.random.Generator):
    """A generator whose 256-bit key draws are recorded (``drawn``) or, with ``replay``, taken from a list.

    Every random draw of the device side goes through :func:`estimators.randomness.keys_from`, i.e. one
    ``integers(0, 2**32, size=(n, 8), dtype=uint32)`` call per key batch: the tape is the whole randomness of a
    case, in draw order.
    """

    def __init__(self, seed: int = 0, replay: list[str] | None = None) -> None:
        super().__init__(np.random.PCG64(seed))
        self.drawn: list[str] = []
        self._replay = None if replay is None else list(replay)

    def integers(self, low, high=None, size=None, dtype=np.int64, endpoint=False):  # type: ignore[override]
        shape = (size,) if isinstance(size, int) else tuple(size or ())
        if low != 0 or high != 1 << 32 or len(shape) != 2 or shape[1] != KEY_WORDS:
            raise AssertionError(f"a device draw that is not a key batch: integers({low}, {high}, size={size})")
        if self._replay is None:
            out = super().integers(low, high, size=shape, dtype=np.uint32)
        else:
            if len(self._replay) < shape[0]:
                raise AssertionError("the randomizer drew more keys than the vector recorded")
            out = np.stack([key_words(self._replay.pop(0)) for _ in range(shape[0])]) if shape[0] else \
                np.zeros((0, KEY_WORDS), dtype=np.uint32)
        self.drawn.extend(key_hex(k) for k in out)
        return out

    @property
    def left(self) -> int:
        return 0 if self._replay is None else len(self._replay)


def key_hex(words: np.ndarray) -> str:
    """A key as the 64 hex digits of its 32 ChaCha20 key bytes (8 little-endian uint32 words)."""
    return np.asarray(words, dtype="<u4").tobytes().hex()


def key_words(text: str) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(text), dtype="<u4").astype(np.uint32)


def report_hex(proto: FrequencyProtocol, reports: np.ndarray) -> str:
    """The report bytes of one device (the report's part of :meth:`FrequencyProtocol.encode`)."""
    r = np.ascontiguousarray(reports, dtype=np.dtype(proto.report_dtype).newbyteorder("<"))
    if r.shape != (1, *proto.report_shape):
        raise AssertionError(f"expected one report, got shape {r.shape}")
    return r.tobytes().hex()


def _cells(seen: np.ndarray, size: int) -> list[int]:
    return [int(i) for i in np.flatnonzero(np.unpackbits(seen.reshape(-1), bitorder="little")[:size])]


_DERIVED = ("p", "q", "p1", "q1", "p2", "q2", "g", "K", "omega", "layout", "s", "bound", "slot", "b", "d", "theta")


def derived(proto: FrequencyProtocol) -> dict[str, Any]:
    """The calibrated parameters of a protocol (what a client computes from the campaign), for diagnosis."""
    out: dict[str, Any] = {"eps_first": float(proto.eps_first), "eps_inf": float(proto.eps_inf),
                           "memo_size": int(proto.memo_size)}
    chosen = getattr(proto, "chosen", None)
    if chosen is not None:
        out["chosen"] = chosen.name
        proto = chosen
    for name in _DERIVED:
        try:
            value = getattr(proto, name)
        except (AttributeError, NotImplementedError):
            continue
        if isinstance(value, (bool, int, float, str, np.integer, np.floating)):
            out[name] = value.item() if isinstance(value, (np.integer, np.floating)) else value
    return out


def _values(step: tuple[int, ...] | int, ks: list[int] | int) -> Any:
    if isinstance(ks, int):
        return int(step) % ks
    return [int(v) % k for v, k in zip(step, ks)]


def protocol_case(name: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One device of ``make(**params)`` over :data:`STEPS`."""
    p = dict(params)
    proto = make(p.pop("protocol"), **p)
    tape = KeyTape(seed)
    state = proto.new_state(1, tape)
    memo_key = tape.drawn[0] if state is not None else None
    steps = []
    for raw in STEPS:
        v = _values(raw, proto.k)
        tape.drawn = []
        reports = proto.randomize(np.array([v], dtype=np.int64), tape, state=state)
        steps.append({"value": v, "keys": tape.drawn, "report": report_hex(proto, reports),
                      "memoized": None if state is None else _cells(state.seen[0], proto.memo_size)})
    return {"case": name, "params": proto.params(), "fingerprint": proto.fingerprint,
            "report_dtype": np.dtype(proto.report_dtype).name, "report_shape": list(proto.report_shape),
            "derived": derived(proto), "memo_key": memo_key, "steps": steps}


def replay_protocol(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Run a protocol case's recorded keys and values through :mod:`estimators` again: the steps it gives."""
    p = dict(case["params"])
    proto = make(p.pop("protocol"), **{k: v for k, v in p.items() if k != "chosen"})
    state = None
    if case["memo_key"] is not None:
        state = proto.new_state(1, KeyTape(replay=[case["memo_key"]]))
    steps = []
    for step in case["steps"]:
        tape = KeyTape(replay=step["keys"])
        reports = proto.randomize(np.array([step["value"]], dtype=np.int64), tape, state=state)
        if tape.left:
            raise AssertionError(f"{case['case']}: the randomizer drew {len(step['keys']) - tape.left} of "
                                 f"{len(step['keys'])} recorded keys")
        steps.append({"value": step["value"], "keys": step["keys"], "report": report_hex(proto, reports),
                      "memoized": None if state is None else _cells(state.seen[0], proto.memo_size)})
    return steps


def _solution_state(sol: Solution, st: MultiState) -> dict[str, Any]:
    return {"sampled": None if st.sampled is None else int(st.sampled[0]),
            "fake": None if st.fake is None else [int(x) for x in st.fake[0]],
            "reported": [int(x) for x in st.reported[0]],
            "memoized": [None if m is None else _cells(m.seen[0], m.memo_size) for m in st.memos]}


def _solution_step(sol: Solution, st: MultiState | None, values: list[int], tape: KeyTape) -> dict[str, Any]:
    out = sol.randomize(np.array([values], dtype=np.int64), tape, state=st)
    reports = [report_hex(c, r) if np.asarray(r).shape[0] else None for c, r in zip(sol.channels, out.reports)]
    step: dict[str, Any] = {"values": values, "keys": list(tape.drawn), "reports": reports}
    if st is not None:
        step["state"] = _solution_state(sol, st)
    return step


def solution_case(name: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One device of ``make_solution(**params)`` over :data:`SOLUTION_STEPS`."""
    sol = make_solution(**params)
    tape = KeyTape(seed)
    st = sol.new_state(1, tape) if sol._needs_state else None
    state_keys = list(tape.drawn)
    initial = None if st is None else _solution_state(sol, st)
    steps = []
    for raw in SOLUTION_STEPS:
        tape.drawn = []
        steps.append(_solution_step(sol, st, _values(raw[:sol.d], list(sol.ks)), tape))
    return {"case": name, "params": sol.params(), "fingerprint": sol.fingerprint,
            "channels": [{"params": c.params(), "report_dtype": np.dtype(c.report_dtype).name,
                          "report_shape": list(c.report_shape), "derived": derived(c)} for c in sol.channels],
            "state_keys": state_keys, "initial_state": initial, "steps": steps}


def replay_solution(case: dict[str, Any]) -> list[dict[str, Any]]:
    sol = make_solution(**case["params"])
    st = None
    if case["initial_state"] is not None:
        tape = KeyTape(replay=case["state_keys"])
        st = sol.new_state(1, tape)
        if tape.left:
            raise AssertionError(f"{case['case']}: new_state drew fewer keys than recorded")
    steps = []
    for step in case["steps"]:
        tape = KeyTape(replay=step["keys"])
        steps.append(_solution_step(sol, st, step["values"], tape))
        if tape.left:
            raise AssertionError(f"{case['case']}: a step drew fewer keys than recorded")
    return steps


# ---------------------------------------------------------------- numeric mechanisms
#: (case name, mechanism parameters, steps): every numeric mechanism at least once. The steps of a device are a
#: repeat, a change, a return and a value outside the range (clipped to its nearest end). Draws past a report's
#: noise slot (its extension stream): "Laplace extension" (46-bit uniforms of the exact sampler: about 40% of its
#: reports need more than the slot's 128 bits, against 8% at the default grid); "redraws": ε = 43.7 on 16 PM
#: cells makes the cell masses' total Z about 0.52 × 2^64, so about half of PM's words are redrawn (every usual
#: setting redraws with probability below 2^-40, and Square Wave's uniform cell below 2^-48: never seen).
NUMERIC_CASES: list[tuple[str, dict[str, Any]]] = [
    ("Laplace", {"mechanism": "Laplace", "eps": 1.0, "lo": 0.0, "hi": 600.0, "grid_bits": 12}),
    ("Laplace grid_bits=4", {"mechanism": "Laplace", "eps": 0.5, "lo": -5.0, "hi": 5.0, "grid_bits": 4}),
    ("Laplace extension", {"mechanism": "Laplace", "eps": 0.1, "lo": 0.0, "hi": 600.0, "grid_bits": 20}),
    ("Duchi", {"mechanism": "Duchi", "eps": 1.0, "lo": 0.0, "hi": 600.0}),
    ("Duchi eps=4", {"mechanism": "Duchi", "eps": 4.0, "lo": -5.0, "hi": 5.0}),
    ("PM", {"mechanism": "PM", "eps": 1.0, "lo": 0.0, "hi": 600.0, "grid_bits": 16}),
    ("PM grid_bits=20 (uint32)", {"mechanism": "PM", "eps": 2.0, "lo": -5.0, "hi": 5.0, "grid_bits": 20}),
    ("PM redraws", {"mechanism": "PM", "eps": 43.7, "lo": 0.0, "hi": 600.0, "grid_bits": 4}),
    ("HM", {"mechanism": "HM", "eps": 1.0, "lo": 0.0, "hi": 600.0, "grid_bits": 16}),
    ("HM below eps* (Duchi only)", {"mechanism": "HM", "eps": 0.5, "lo": -5.0, "hi": 5.0, "grid_bits": 12}),
    ("HM redraws", {"mechanism": "HM", "eps": 43.7, "lo": 0.0, "hi": 600.0, "grid_bits": 4}),
    ("SW", {"mechanism": "SW", "eps": 1.0, "lo": 0.0, "hi": 600.0, "d_in": 1024, "d_out": 1024}),
    ("SW d_in=8 d_out=16", {"mechanism": "SW", "eps": 2.0, "lo": -5.0, "hi": 5.0, "d_in": 8, "d_out": 16}),
    ("1BitMean", {"mechanism": "1BitMean", "eps": 1.0, "lo": 0.0, "hi": 600.0, "s": 16, "gamma": 0.0}),
    ("1BitMean gamma=0.2", {"mechanism": "1BitMean", "eps": 2.0, "lo": -5.0, "hi": 5.0, "s": 4, "gamma": 0.2}),
]

#: a device's values over the steps of a numeric case, by range: repeat, change, return, outside the range
NUMERIC_STEPS: dict[tuple[float, float], tuple[float, ...]] = {
    (0.0, 600.0): (123.4, 123.4, 480.0, 123.4, 750.0),
    (-5.0, 5.0): (-1.25, -1.25, 3.5, -1.25, -7.0),
}

#: the cases that must draw past their noise slot in at least one step (checked when the file is written)
MUST_EXTEND = ("Laplace extension", "PM redraws", "HM redraws")

#: calibrated figures of each mechanism: (small integers, 64-bit integers written as decimal strings, floats)
_NUMERIC_DERIVED: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "Laplace": (("n_grid",), ("noise_s", "noise_t"), ()),
    "Duchi": ((), ("t_lo", "s"), ("B",)),
    "PM": (("m", "k", "l"), ("a", "b", "z"), ()),
    "HM": (("m", "k", "l"), ("a", "b", "z", "t_alpha", "d_tlo", "d_s"), ("B",)),
    "SW": (("k", "l"), ("t_near",), ("b",)),
    "1BitMean": ((), ("t_lo", "step", "g"), ("eps_memo",)),
}


def numeric_derived(proto: NumericProtocol) -> dict[str, Any]:
    """The calibrated parameters of a numeric mechanism (what a client computes from the campaign): the privacy
    figures, the integers its kernel compares (decimal strings: they may exceed 2^53) and its float scales."""
    mech = proto.mechanism

    def get(n: str) -> Any:
        return getattr(mech.pm, n) if mech.name == "HM" and n in ("k", "l", "a", "b", "z") else getattr(mech, n)

    small, big, floats = _NUMERIC_DERIVED[mech.name]
    out: dict[str, Any] = {"eps_first": float(proto.eps_first), "eps_inf": float(proto.eps_inf),
                           "memo_size": int(proto.memo_size)}
    out.update({n: int(get(n)) for n in small})
    out.update({n: str(int(get(n))) for n in big})
    out.update({n: float(get(n)) for n in floats})
    return out


def _twin(name: str):
    """The numpy twin of the numba kernel ``name``, with the kernel's signature."""
    from estimators.numeric import duchi, laplace_kernels as lk, onebit_kernels as obk, piecewise_kernels as pk
    from estimators.numeric import sw_kernels as swk
    return {
        "laplace": lambda x, nkey, n_grid, t, s: lk.np_laplace_randomize(x, nkey, int(n_grid), int(t), int(s)),
        "duchi": lambda x, nkey, t_lo, s: duchi.np_duchi_randomize(x, nkey, int(t_lo), float(s)),
        "pm": lambda x, nkey, l, k, a, b, zlim, out: pk.np_pm_randomize(x, nkey, int(l), int(k), int(a), int(b),
                                                                         int(zlim), dtype=out.dtype),
        "pm_values": lambda v, lo, hi, nkey, l, k, a, b, zlim, out: pk.np_pm_randomize_values(
            v, float(lo), float(hi), nkey, int(l), int(k), int(a), int(b), int(zlim), dtype=out.dtype),
        "hm": lambda x, nkey, t_alpha, l, k, a, b, zlim, d_tlo, d_s, out: pk.np_hm_randomize(
            x, nkey, int(t_alpha), int(l), int(k), int(a), int(b), int(zlim), int(d_tlo), float(d_s)),
        "sw": swk.np_sw_randomize,
        "onebit": obk.np_onebit_randomize,
        "onebit_memo": obk.np_onebit_randomize_memo,
        "onebit_alpha": obk.np_onebit_alpha,
    }[name]


#: (module, attribute, twin): every numba kernel a numeric mechanism's randomizer calls (a test checks that every
#: randomizing kernel of these modules is listed, k-of-d's aside: no campaign attribute uses it)
NUMERIC_KERNELS = (("estimators.numeric.laplace_kernels", "laplace_randomize", "laplace"),
                   ("estimators.numeric.duchi", "duchi_randomize", "duchi"),
                   ("estimators.numeric.piecewise_kernels", "pm_randomize", "pm"),
                   ("estimators.numeric.piecewise_kernels", "pm_randomize_values", "pm_values"),
                   ("estimators.numeric.piecewise_kernels", "hm_randomize", "hm"),
                   ("estimators.numeric.sw_kernels", "sw_randomize", "sw"),
                   ("estimators.numeric.onebit_kernels", "onebit_randomize", "onebit"),
                   ("estimators.numeric.onebit_kernels", "onebit_randomize_memo", "onebit_memo"),
                   ("estimators.numeric.onebit_kernels", "onebit_alpha", "onebit_alpha"))


@contextlib.contextmanager
def numeric_twins() -> Iterator[None]:
    """Every numba kernel of the numeric randomizers replaced by its numpy twin (restored on exit)."""
    import importlib
    saved = []
    try:
        for module, attr, twin in NUMERIC_KERNELS:
            mod = importlib.import_module(module)
            saved.append((mod, attr, getattr(mod, attr)))
            setattr(mod, attr, _twin(twin))
        yield
    finally:
        for mod, attr, fn in reversed(saved):
            setattr(mod, attr, fn)


def _extension_words(proto: NumericProtocol, value: float, keys: list[str], memo_key: str | None) -> int:
    """How many words the report drew past its noise slot (its extension stream ``(noise key, NOISE_EXT, 0)``):
    the report replayed through the numpy twins, counting the draws past the prefix."""
    from estimators import reference

    calls: list[int] = []
    original = reference.Draws.__call__

    def counting(self, j):  # type: ignore[no-untyped-def]
        if j >= self.prefix.shape[0]:
            calls.append(j)
        return original(self, j)

    state = None if memo_key is None else proto.new_state(1, KeyTape(replay=[memo_key]))
    reference.Draws.__call__ = counting  # type: ignore[method-assign]
    try:
        with numeric_twins():
            proto.randomize(np.array([value], dtype=np.float64), KeyTape(replay=keys), state=state)
    finally:
        reference.Draws.__call__ = original  # type: ignore[method-assign]
    return len(calls)


def _numeric_proto(params: dict[str, Any]) -> NumericProtocol:
    p = dict(params)
    return NumericProtocol(make_numeric(p.pop("mechanism"), **p))


def _numeric_step(proto: NumericProtocol, state, value: float, tape: KeyTape, memo_key: str | None) -> dict[str, Any]:
    row = np.array([value], dtype=np.float64)
    x, clipped = proto.mechanism.prepare(row)
    reports = proto.randomize(row, tape, state=state)
    keys = list(tape.drawn)
    ext = _extension_words(proto, value, keys, memo_key)  # on a memo state of its own (the draws only)
    return {"value": float(value), "x": float(x[0]), "clipped": bool(clipped[0]), "keys": keys,
            "report": report_hex(proto, reports), "ext_words": ext,
            "memoized": None if state is None else _cells(state.seen[0], proto.memo_size)}


def numeric_case(name: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """One device of the numeric mechanism ``params`` over its :data:`NUMERIC_STEPS`."""
    proto = _numeric_proto(params)
    tape = KeyTape(seed)
    state = proto.new_state(1, tape)
    memo_key = tape.drawn[0] if state is not None else None
    steps = []
    for v in NUMERIC_STEPS[(proto.lo, proto.hi)]:
        tape.drawn = []
        steps.append(_numeric_step(proto, state, v, tape, memo_key))
    return {"case": name, "mechanism": proto.name, "params": proto.params(), "fingerprint": proto.fingerprint,
            "report_dtype": np.dtype(proto.report_dtype).name, "report_shape": list(proto.report_shape),
            "derived": numeric_derived(proto), "memo_key": memo_key, "steps": steps}


def replay_numeric(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Run a numeric case's recorded keys and values through :mod:`estimators.numeric` again: the steps it gives."""
    proto = _numeric_proto(case["params"])
    state = None
    if case["memo_key"] is not None:
        state = proto.new_state(1, KeyTape(replay=[case["memo_key"]]))
    steps = []
    for step in case["steps"]:
        tape = KeyTape(replay=step["keys"])
        steps.append(_numeric_step(proto, state, step["value"], tape, case["memo_key"]))
        if tape.left:
            raise AssertionError(f"{case['case']}: the randomizer drew {len(step['keys']) - tape.left} of "
                                 f"{len(step['keys'])} recorded keys")
    return steps


# ---------------------------------------------------------------- open-domain protocols
#: (case name, protocol parameters, value type): every open-domain protocol at least once. "CMS m=1024": ~4 flip
#: lanes tie per report (1/256 each), past the slot's 2 refinement words: the extension stream is drawn.
OPEN_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("CMS m=256 k=16", {"protocol": "CMS", "eps": 4.0, "m": 256, "k": 16}, "string"),
    ("CMS m=100 k=3 (bits past m)", {"protocol": "CMS", "eps": 1.0, "m": 100, "k": 3, "seed": 7}, "string"),
    ("CMS m=1024 k=64 u64 (extension)", {"protocol": "CMS", "eps": 0.5, "m": 1024, "k": 64,
                                          "seed": (1 << 64) - 1}, "u64"),
    ("HCMS m=256 k=16", {"protocol": "HCMS", "eps": 4.0, "m": 256, "k": 16}, "string"),
    ("HCMS m=2 k=1 u64", {"protocol": "HCMS", "eps": 0.25, "m": 2, "k": 1, "seed": 0}, "u64"),
    ("HCMS m=4096 k=1000", {"protocol": "HCMS", "eps": 8.0, "m": 4096, "k": 1000, "seed": 123456789}, "string"),
    # TreeHist: without a memo state (a fresh level and row per report), memoized (the level from the memo key, the
    # row and first GRR per level prefix), with an IRR (eps_1), string and u64 values
    ("TreeHist rows=16", {"protocol": "TreeHist", "eps": 4.0, "rows": 16, "memoize": False}, "string"),
    ("TreeHist rows=16 memoized", {"protocol": "TreeHist", "eps": 4.0, "rows": 16}, "string"),
    ("TreeHist eps_1 memoized", {"protocol": "TreeHist", "eps": 2.0, "eps_1": 1.0, "rows": 7, "memo_slots": 256},
     "string"),
    ("TreeHist eps_1 fresh u64", {"protocol": "TreeHist", "eps": 1.0, "eps_1": 0.5, "bits": 64, "step": 8,
                                  "rows": 3, "seed": (1 << 64) - 1, "memoize": False}, "u64"),
    ("TreeHist bits=64 memoized u64", {"protocol": "TreeHist", "eps": 6.0, "bits": 64, "step": 16, "start_bits": 0,
                                       "rows": 1000, "memo_slots": 128, "seed": 0}, "u64"),  # 2 tags: overflows
]

#: a device's values over the steps of an open-domain case, by type: a repeat, a change, a return, non-ASCII
OPEN_STEPS = {"string": ("crash:NullPointerException", "crash:NullPointerException", "café au lait ☕",
                         "crash:NullPointerException", "日本語 🚀", ""),
              "u64": (0, 0, (1 << 64) - 1, 0, 1 << 53 | 1, 12345)}

#: strings (and integers) whose ids the vectors list
ID_STRINGS = ("", "a", "crash", "open-test", "café", "naïve ☃", "日本語", "🚀 emoji", "a\u0000b", "x" * 200)
ID_INTEGERS = (0, 1, 12345, (1 << 53) + 1, (1 << 63), (1 << 64) - 1)
#: (seed, rows, m, ids) of the sketch_hash examples
HASH_EXAMPLES = ((0, 3, 256, (0, 1, (1 << 64) - 1)), ((1 << 64) - 1, 2, 1000, (5, 1 << 63)),
                 (None, 4, 4096, ("crash", "café", "")), (123456789, 1, 2, (7, 8, 9)))


def _u64(x: int) -> str:
    return f"{int(x):016x}"


def _open_name_seed(name: str) -> int:
    from estimators.sketch.hashing import value_id
    return value_id(name)


def open_domain_section() -> dict[str, Any]:
    """``value_ids``, ``sketch_hash`` and ``cases`` (module doc)."""
    from estimators.sketch.hashing import np_sketch_hash, row_seeds, sketch_hash, spread, value_id

    ids = [{"value": v, "utf8": v.encode("utf-8").hex(), "id": _u64(value_id(v))} for v in ID_STRINGS]
    ids += [{"value": str(v), "type": "u64", "id": _u64(value_id(v))} for v in ID_INTEGERS]
    hashes = []
    for seed, rows, m, vals in HASH_EXAMPLES:
        seed = value_id("crash") if seed is None else seed
        seeds = row_seeds(seed, rows)
        vid = np.array([value_id(v) for v in vals], dtype=np.uint64)
        h = sketch_hash(vid, seeds, m)
        if not np.array_equal(h, np_sketch_hash(vid, seeds, m)):
            raise AssertionError("sketch_hash and its numpy twin differ")
        hashes.append({"seed_hex": _u64(seed), "rows": rows, "m": m, "row_seeds": [_u64(s) for s in seeds],
                       "spreads": [_u64(spread(int(s))) for s in seeds], "ids": [_u64(v) for v in vid],
                       "hashes": [[int(x) for x in row] for row in h]})
    cases = [open_case(n, p, kind, SEED + 3000 + i) for i, (n, p, kind) in enumerate(OPEN_CASES)]
    return {"value_ids": ids, "sketch_hash": hashes, "cases": cases}


def _open_proto(params: dict[str, Any]):
    from estimators.sketch.registry import make_open
    p = dict(params)
    return make_open(p.pop("protocol"), **p)


#: (module, attribute, twin module, twin): every numba kernel an open-domain protocol's randomizer calls, as the
#: protocol's module imported it (a new protocol adds its lines)
OPEN_KERNELS = (("estimators.sketch.cms", "cms_randomize", "estimators.sketch.cms_kernels", "np_cms_randomize"),
                ("estimators.sketch.cms", "hcms_randomize", "estimators.sketch.cms_kernels", "np_hcms_randomize"),
                ("estimators.sketch.treehist_kernels", "treehist_randomize", "estimators.sketch.treehist_kernels",
                 "np_treehist_randomize"),
                ("estimators.sketch.treehist_kernels", "keyed_choice", "estimators.sketch.treehist_kernels",
                 "np_keyed_choice"),
                ("estimators.sketch.treehist_kernels", "mark_tags", "estimators.sketch.treehist_kernels",
                 "np_mark_tags"))

#: the calibrated figures an open-domain case lists in ``derived`` when its protocol has them (64-bit ones in hex)
_OPEN_DERIVED = ("T", "q", "support_size", "g", "t1", "t2", "prefix_bits", "memo_tags")
_OPEN_DERIVED_U64 = (("row_seeds", "seeds"), ("rejection_limit", "limit"), ("memo_seed", "memo_seed"))
#: the most row seeds a case lists (TreeHist has L R of them: its ``memo_seed`` and the hash examples suffice)
_MAX_LISTED_SEEDS = 1000


@contextlib.contextmanager
def open_twins() -> Iterator[None]:
    """The open-domain protocols' numba kernels replaced by their numpy twins (restored on exit)."""
    import importlib

    saved = []
    try:
        for mod, name, twin_mod, twin in OPEN_KERNELS:
            m = importlib.import_module(mod)
            saved.append((m, name, getattr(m, name)))
            setattr(m, name, getattr(importlib.import_module(twin_mod), twin))
        yield
    finally:
        for m, name, fn in reversed(saved):
            setattr(m, name, fn)


def _open_ext_words(proto, vid: int, keys: list[str], state=None) -> int:
    """How many words the report drew past its noise slot (the numpy twin's draws, counted)."""
    from estimators import reference

    calls: list[int] = []
    original = reference.Draws.__call__

    def counting(self, j):  # type: ignore[no-untyped-def]
        if j >= self.prefix.shape[0]:
            calls.append(j)
        return original(self, j)

    reference.Draws.__call__ = counting  # type: ignore[method-assign]
    try:
        with open_twins():
            proto.randomize(np.array([vid], dtype=np.uint64), KeyTape(replay=keys),
                            **({} if state is None else {"state": _copy_memo(state)}))
    finally:
        reference.Draws.__call__ = original  # type: ignore[method-assign]
    return len(calls)


def _copy_memo(state):
    import dataclasses
    return dataclasses.replace(state, keys=state.keys.copy(), seen=state.seen.copy())


def _open_step(proto, kind: str, value: str | int, tape: KeyTape, state=None) -> dict[str, Any]:
    """One report; with a memo state (a memoizing protocol's device) also the memo cells marked after it, the
    device's PRR (``memoized_outputs``: no IRR, nothing marked) and the memoized input (its level prefix id)."""
    from estimators.sketch.hashing import value_id

    vid = value_id(value)
    ids = np.array([vid], dtype=np.uint64)
    before = None if state is None else _copy_memo(state)
    reports = proto.randomize(ids, tape, **({} if state is None else {"state": state}))
    keys = list(tape.drawn)
    out = {"value": value if kind == "string" else str(value), "id": _u64(vid), "keys": keys,
           "report": report_hex(proto, reports), "ext_words": _open_ext_words(proto, vid, keys, before)}
    if state is not None and hasattr(proto, "memo_tags"):  # TreeHist: its tag table, and what it counts
        out["memoized"] = [_u64(t) for t in np.ascontiguousarray(state.seen[:1]).view("<u8")[0]]
        count = float(proto.memoized_counts(state)[0])
        out["memoized_count"] = "inf" if np.isinf(count) else int(count)
    elif state is not None:
        out["memoized"] = _cells(state.seen[0], proto.memo_size)
    if state is not None:
        out["prr"] = report_hex(proto, proto.memoized_outputs(ids, state))
        if hasattr(proto, "memo_inputs"):
            out["memo_input"] = _u64(proto.memo_inputs(ids, proto.device_levels(state))[0])
    return out


def _open_memo(params: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The protocol parameters and whether the case's device keeps a memo state (``"memoize": False``: the
    memoizing protocol run without one, as a simulation does)."""
    p = dict(params)
    return p, bool(p.pop("memoize", True))


def open_case(name: str, params: dict[str, Any], kind: str, seed: int) -> dict[str, Any]:
    """One device of the open-domain protocol ``params`` (``seed`` defaulted as a campaign does: the id of
    ``"crash"``) over :data:`OPEN_STEPS` of its type; a memoizing protocol's device draws its memo key first
    (``memo_key``; ``None`` for a memoryless protocol or a case run without a memo state)."""
    p, memoize = _open_memo(params)
    p.setdefault("seed", _open_name_seed("crash"))
    proto = _open_proto(p)
    tape = KeyTape(seed)
    state = proto.new_state(1, tape) if memoize and proto.memo_size else None
    memo_key = tape.drawn[0] if state is not None else None
    steps = []
    for v in OPEN_STEPS[kind]:
        tape.drawn = []
        steps.append(_open_step(proto, kind, v, tape, state))
    derived_: dict[str, Any] = {"eps_first": float(proto.eps_first), "eps_inf": float(proto.eps_inf),
                                "memo_size": int(proto.memo_size)}
    for key in _OPEN_DERIVED:
        if hasattr(proto, key):
            v = getattr(proto, key)
            derived_[key] = [int(x) for x in v] if isinstance(v, (tuple, list)) else \
                float(v) if isinstance(v, (float, np.floating)) else int(v)
    for key, attr in _OPEN_DERIVED_U64:
        if hasattr(proto, attr):
            v = getattr(proto, attr)
            if np.ndim(v) and len(v) > _MAX_LISTED_SEEDS:
                continue
            derived_[key] = _u64(v[0]) if key == "memo_seed" else [_u64(x) for x in v] if np.ndim(v) else _u64(v)
    if state is not None and hasattr(proto, "device_levels"):
        derived_["level"] = int(proto.device_levels(state)[0])
    out = {"case": name, "type": kind, "params": proto.params(), "seed_hex": _u64(proto.seed),
           "fingerprint": proto.fingerprint, "report_dtype": np.dtype(proto.report_dtype).name,
           "report_shape": list(proto.report_shape), "derived": derived_, "steps": steps}
    if proto.memo_size:
        out["memo_key"] = memo_key
    return out


def replay_open(case: dict[str, Any]) -> list[dict[str, Any]]:
    """Run an open-domain case's recorded keys and values through :mod:`estimators.sketch` again: its steps."""
    proto = _open_proto(case["params"])
    state = None
    if case.get("memo_key") is not None:
        state = proto.new_state(1, KeyTape(replay=[case["memo_key"]]))
    steps = []
    for step in case["steps"]:
        tape = KeyTape(replay=step["keys"])
        value = step["value"] if case["type"] == "string" else int(step["value"])
        steps.append(_open_step(proto, case["type"], value, tape, state))
        if tape.left:
            raise AssertionError(f"{case['case']}: the randomizer drew {len(step['keys']) - tape.left} of "
                                 f"{len(step['keys'])} recorded keys")
    return steps


# ---------------------------------------------------------------- the device ledger
LEDGER_CAMPAIGN = """\
[campaign]
id = "ledger-vectors"
time_step_seconds = 60.0

[[attributes]]
name = "model"
k = 6
protocol = "L-GRR"
eps_inf = 1.0
eps_1 = 0.5

[[attributes]]
name = "version"
k = 10
protocol = "L-OSUE"
eps_inf = 1.5
eps_1 = 0.75

[[attributes]]
name = "opt_in"
k = 2
protocol = "GRR"
eps = 0.5
labels = ["no", "yes"]

[[attributes]]
name = "a"
k = 3

[[attributes]]
name = "b"
k = 4

[[groups]]
name = "pair"
attributes = ["a", "b"]
solution = "L-SMP"
protocol = "L-GRR"
eps_inf = 1.0
eps_1 = 0.5
"""

#: (budget, schedule of (attribute or group, value or tuple)): freezing, refusals, a group
LEDGER_SCHEDULES: list[tuple[str, float | None, list[tuple[str, Any]]]] = [
    ("one attribute freezes", 3.0, [("model", 0), ("model", 0), ("model", 1), ("model", 2), ("model", 3),
                                    ("model", 1), ("model", 4), ("model", 0)]),
    ("shared budget, refusal of a memoryless report", 4.0,
     [("opt_in", "yes"), ("version", 2), ("model", 5), ("version", 3), ("opt_in", "no"), ("version", 4),
      ("model", 1), ("opt_in", 1), ("version", 2), ("model", 5), ("opt_in", "yes")]),
    ("a group reserves per step", 3.5, [("group:pair", {"a": 1, "b": 2}), ("model", 2), ("group:pair", {"a": 0, "b": 3}),
                                        ("group:pair", {"a": 1, "b": 2}), ("group:pair", {"a": 2, "b": 0}),
                                        ("model", 3), ("group:pair", {"a": 1, "b": 1})]),
    ("no budget", None, [("opt_in", 0), ("opt_in", 1), ("model", 1), ("model", 2), ("version", 9)]),
]


#: numeric attributes in the ledger: 1BitMean memoizes its rounded points (memo_size = s + 1, each new point
#: ε_memo), PM spends eps_first per report. The values lie on 1BitMean's points (0, 25, 50, 75, 100: no rounding,
#: so the figures do not depend on the device's α), 130 and 300 are clipped to the range.
NUMERIC_LEDGER_CAMPAIGN = """\
[campaign]
id = "ledger-numeric"
time_step_seconds = 60.0

[[attributes]]
name = "battery"
type = "numeric"
range = [0.0, 100.0]
mechanism = "1BitMean"
eps = 1.0
s = 4

[[attributes]]
name = "latency_ms"
type = "numeric"
range = [0.0, 250.0]
mechanism = "PM"
eps = 0.5

[[attributes]]
name = "model"
k = 6
protocol = "L-GRR"
eps_inf = 1.0
eps_1 = 0.5
"""

NUMERIC_LEDGER_SCHEDULES: list[tuple[str, float | None, list[tuple[str, Any]]]] = [
    ("numeric attributes: memoized points, clipping, freezing, refusal", 3.5,
     [("battery", 25.0), ("battery", 25.0), ("latency_ms", 300.0), ("battery", 50.0), ("latency_ms", 40.0),
      ("battery", 130.0), ("battery", 0.0), ("battery", 25.0), ("model", 1), ("latency_ms", 12.5)]),
]


def ledger_case(name: str, budget: float | None, schedule: list[tuple[str, Any]],
                campaign_text: str = LEDGER_CAMPAIGN) -> dict[str, Any]:
    """The device ledger of :class:`producers.sdk.Device` over ``schedule``: after each report, the outcome
    (``reported``, ``frozen`` or ``refused``), the value a memoizing attribute randomized, the reserved and the
    actual loss (the device's and the scope's), the memoized count and, for a numeric attribute, how many of
    its values the device clipped. The figures depend on the schedule and the values only, never on the keys."""
    from producers.sdk import BudgetExceeded, Device
    from wire.campaign import Campaign

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "campaign.toml"
        path.write_text(campaign_text)
        campaign = Campaign.load(path)
        steps = []
        with Device(campaign, Path(tmp) / "state", budget_eps=budget) as dev:
            for scope, value in schedule:
                step: dict[str, Any] = {"scope": scope, "value": value}
                group = scope[len("group:"):] if scope.startswith("group:") else None
                try:
                    if group is not None:
                        dev.report_group(group, value, t=1)
                        step["outcome"] = "reported"
                    else:
                        numeric = campaign.attribute(scope).numeric
                        frozen = dev.frozen(scope)
                        before = dev.memoized_count(scope)
                        dev.report(scope, value, t=1)
                        given = dev.numeric_value(scope, value) if numeric else dev.value_index(scope, value)
                        step["outcome"] = "frozen" if frozen and dev.memoized_count(scope) == before and \
                            dev.last_value(scope) != given else "reported"
                        if campaign.attribute(scope).protocol.memo_size:
                            step["randomized"] = dev.last_value(scope)
                            step["memoized"] = dev.memoized_count(scope)
                except BudgetExceeded:
                    step["outcome"] = "refused"
                if group is None and campaign.attribute(scope).numeric:
                    step["clipped"] = dev.clipped(scope)
                step["reserved_loss"] = dev.reserved_loss()
                step["privacy_loss"] = dev.privacy_loss()
                step["scope_reserved"] = dev.reserved_loss(group=group) if group else dev.reserved_loss(scope)
                step["scope_loss"] = dev.privacy_loss(group=group) if group else dev.privacy_loss(scope)
                steps.append(step)
            plan = dev.budget_plan
    return {"case": name, "campaign": campaign_text, "budget_eps": budget, "budget_plan": plan, "steps": steps}


# ---------------------------------------------------------------- the file
def stream_examples() -> list[dict[str, Any]]:
    rng = np.random.default_rng(SEED)
    out = []
    for i, (dname, domain) in enumerate(DOMAINS.items()):
        key = rng.integers(0, 1 << 32, size=KEY_WORDS, dtype=np.uint32)
        a = [0, 3, (1 << 32) + 5, 7, 1, 2, 0][i]
        words = np_stream_words(key, domain, [a], 16)[0]
        out.append({"key": key_hex(key), "domain": dname, "domain_word": int(domain), "a": a,
                    "words": [f"{int(w):016x}" for w in words]})
    return out


def generate() -> dict[str, Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        protocols = [protocol_case(n, p, SEED + i) for i, (n, p) in enumerate(PROTOCOL_CASES)]
        solutions = [solution_case(n, p, SEED + 1000 + i) for i, (n, p) in enumerate(SOLUTION_CASES)]
        numeric = [numeric_case(n, p, SEED + 2000 + i) for i, (n, p) in enumerate(NUMERIC_CASES)]
    for case in numeric:
        if case["case"] in MUST_EXTEND and not any(s["ext_words"] for s in case["steps"]):
            raise AssertionError(f"{case['case']}: no step drew past its noise slot; choose another seed")
    ledger = [ledger_case(n, b, s) for n, b, s in LEDGER_SCHEDULES]
    numeric_ledger = [ledger_case(n, b, s, NUMERIC_LEDGER_CAMPAIGN) for n, b, s in NUMERIC_LEDGER_SCHEDULES]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        open_domain = open_domain_section()
    if not any(s["ext_words"] for c in open_domain["cases"] if c["params"]["protocol"] == "CMS" for s in c["steps"]):
        raise AssertionError("no CMS step drew past its noise slot; choose other cases")
    return {"format": FORMAT, "version": VERSION, "command": "python -m ldpstream_dev.randomizer_vectors",
            "keys": "256-bit keys: 64 hex digits, the 32 ChaCha20 key bytes (8 little-endian uint32 words); "
                    "each step lists the keys its randomizer drew, in draw order",
            "reports": "report bytes: the protocol's report array of one device, little-endian "
                       "(the report part of a batch payload; the compact body's section rows)",
            "numeric_values": "numeric cases: value (metric units) -> x = 2 (clip(value, lo, hi) - lo) / (hi - lo) - 1 "
                              "(float64), the mechanism's input in [-1, 1]",
            "streams": stream_examples(), "protocols": protocols, "solutions": solutions, "numeric": numeric,
            "ledger": ledger, "numeric_ledger": numeric_ledger,
            "open_values": "open-domain cases: a string's id is the little-endian first 8 bytes of the SHA-256 of its "
                           "UTF-8 bytes, an integer (type u64, written in decimal) is its own id; ids and seeds are "
                           "16 hex digits of the 64-bit value",
            "open_domain": open_domain}


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=VECTORS_PATH, help=f"output file (default {VECTORS_PATH})")
    args = parser.parse_args(argv)
    data = generate()
    args.out.write_text(dumps(data))
    print(f"wrote {args.out}: {len(data['protocols'])} protocol cases, {len(data['solutions'])} solution cases, "
          f"{len(data['numeric'])} numeric cases, {len(data['ledger'])} + {len(data['numeric_ledger'])} ledger "
          f"schedules, {len(data['open_domain']['cases'])} open-domain cases, {len(data['streams'])} streams")


if __name__ == "__main__":
    main()
