"""The randomizer vectors (tests/data/randomizer-vectors.json): complete, current, and reproduced byte for byte
by the numba kernels and by their numpy twins (the frequency protocols, the solutions, the numeric mechanisms and
the open-domain protocols, with the value ids and sketch hashes they rest on); a one-bit change of a key or an input changes the bytes.

The light device SDK (``clients/python``) and the JavaScript client (``clients/js``) replay the same file in
their own tests."""
from __future__ import annotations

import copy
import json
import math
import warnings

import numpy as np
import pytest

from estimators import kernels, multidim, reference
from estimators.numeric import MECHANISMS
from estimators.randomness import SimulationWarning, np_stream_words
from estimators.registry import protocols
from estimators.solution_registry import solutions
from ldpstream_dev import randomizer_vectors as rv

VECTORS = json.loads(rv.VECTORS_PATH.read_text())
PROTOCOL_IDS = [c["case"] for c in VECTORS["protocols"]]
SOLUTION_IDS = [c["case"] for c in VECTORS["solutions"]]
NUMERIC_IDS = [c["case"] for c in VECTORS["numeric"]]
OPEN_IDS = [c["case"] for c in VECTORS["open_domain"]["cases"]]

#: the kernels a device's randomizer calls, each replaced by its numpy twin in the twin test
RANDOMIZER_KERNELS = ("grr_chain_randomize", "ue_chain_randomize", "hr_randomize", "fhr_randomize", "lh_encode",
                      "lh_hash_rows", "bitflip_randomize", "ss_randomize", "packed_to_indices", "she_randomize")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        yield


@pytest.fixture
def numpy_twins(monkeypatch):
    """Every randomizer kernel (and the solutions' uniform draws) replaced by its plain-numpy twin."""
    for name in RANDOMIZER_KERNELS:
        monkeypatch.setattr(kernels, name, getattr(reference, name))

    def np_fill_run(key, domain, a, w0, out):
        out[:] = np_stream_words(key, domain, [a], w0 + out.shape[0])[0][w0:]

    monkeypatch.setattr(multidim, "fill_run", np_fill_run)


def _expected(case: dict) -> list[dict]:
    return case["steps"]


def test_every_device_protocol_and_solution_has_vectors():
    covered = {c["params"]["protocol"] for c in VECTORS["protocols"]}
    assert set(protocols()) - covered == set(), "protocols without randomizer vectors"
    covered = {c["params"]["solution"] for c in VECTORS["solutions"]}
    assert set(solutions()) - covered == set(), "solutions without randomizer vectors"
    covered = {c["params"]["mechanism"] for c in VECTORS["numeric"]}
    assert set(MECHANISMS) - covered == set(), "numeric mechanisms without randomizer vectors"
    assert {c["params"]["gamma"] > 0 for c in VECTORS["numeric"] if c["mechanism"] == "1BitMean"} == {True, False}
    assert {s["domain"] for s in VECTORS["streams"]} == set(rv.DOMAINS)
    assert VECTORS["ledger"] and all(c["steps"] for c in VECTORS["ledger"])
    assert {s["outcome"] for c in VECTORS["ledger"] for s in c["steps"]} == {"reported", "frozen", "refused"}
    assert len({c["campaign"] for c in VECTORS["ledger"]}) == 1  # the clients' fixtures hold that one campaign
    numeric = [s for c in VECTORS["numeric_ledger"] for s in c["steps"]]
    assert {s["outcome"] for s in numeric} == {"reported", "frozen", "refused"} and max(s.get("clipped", 0)
                                                                                          for s in numeric) > 0


def test_cases_exercise_memoization_and_change():
    for case in VECTORS["protocols"]:
        values = [s["value"] for s in case["steps"]]
        assert values[0] == values[1] and values[2] != values[1], case["case"]
        if case["memo_key"] is not None:
            assert case["steps"][0]["memoized"] == case["steps"][1]["memoized"], case["case"]
    # the lazy Bernoulli's refinement draws occur in the wide UE cases (one tie per 256 bits)
    assert VECTORS["protocols"][PROTOCOL_IDS.index("OUE k=1000")]["params"]["k"] == 1000
    for case in VECTORS["numeric"]:
        values = [s["value"] for s in case["steps"]]
        lo, hi = case["params"]["lo"], case["params"]["hi"]
        assert values[0] == values[1] == values[3] != values[2], case["case"]
        assert [s["clipped"] for s in case["steps"]] == [False] * 4 + [True] and not lo <= values[4] <= hi
        assert case["steps"][4]["x"] in (-1.0, 1.0)
        if case["memo_key"] is not None:
            cells = [s["memoized"] for s in case["steps"]]
            assert cells[0] == cells[1] and cells[2] == cells[3] != cells[1] and cells[4] != cells[3], case["case"]
    # the extension stream (the exact Laplace sampler's bits, PM's and HM's rejection redraws) is exercised
    for name in rv.MUST_EXTEND:
        assert any(s["ext_words"] for s in VECTORS["numeric"][NUMERIC_IDS.index(name)]["steps"]), name


def _same(a, b, where: str = "") -> list[str]:
    """Where two JSON documents differ; floats equal to 1e-9 relative (the ledger's losses are sums whose last bit
    depends on which attribute a group's device sampled: an OS CSPRNG draw of the reference SDK)."""
    if isinstance(a, float) or isinstance(b, float):
        ok = isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
        return [] if ok else [f"{where}: {a!r} != {b!r}"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in _same(a[k], b[k], f"{where}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def test_vectors_file_is_what_the_command_writes():
    differ = _same(json.loads(rv.dumps(rv.generate())), VECTORS)
    assert not differ, "tests/data/randomizer-vectors.json is stale (run python -m ldpstream_dev.randomizer_vectors): " \
        + "; ".join(differ[:5])


def test_the_staleness_check_sees_a_changed_byte():
    changed = copy.deepcopy(VECTORS)
    changed["protocols"][0]["steps"][0]["report"] = "ff"
    changed["ledger"][0]["steps"][0]["reserved_loss"] += 1e-6
    assert len(_same(changed, VECTORS)) == 2 and not _same(VECTORS, copy.deepcopy(VECTORS))


def test_streams_are_chacha20_words():
    for s in VECTORS["streams"]:
        words = np_stream_words(rv.key_words(s["key"]), np.uint32(s["domain_word"]), [s["a"]], 16)[0]
        assert [f"{int(w):016x}" for w in words] == s["words"]


@pytest.mark.parametrize("case", VECTORS["protocols"], ids=PROTOCOL_IDS)
def test_numba_kernels_reproduce_protocol_vectors(case):
    assert rv.replay_protocol(case) == _expected(case)


@pytest.mark.parametrize("case", VECTORS["protocols"], ids=PROTOCOL_IDS)
def test_numpy_twins_reproduce_protocol_vectors(case, numpy_twins):
    assert rv.replay_protocol(case) == _expected(case)


@pytest.mark.parametrize("case", VECTORS["solutions"], ids=SOLUTION_IDS)
def test_numba_kernels_reproduce_solution_vectors(case):
    assert rv.replay_solution(case) == _expected(case)


@pytest.mark.parametrize("case", VECTORS["solutions"], ids=SOLUTION_IDS)
def test_numpy_twins_reproduce_solution_vectors(case, numpy_twins):
    assert rv.replay_solution(case) == _expected(case)


def test_every_numeric_randomizing_kernel_has_its_twin_in_the_replay():
    """A randomizing numba kernel added to a numeric mechanism is replaced by its numpy twin in the twin replay."""
    import importlib

    from numba.core.registry import CPUDispatcher

    listed = {(m, a) for m, a, _ in rv.NUMERIC_KERNELS}
    found = set()
    for module in {m for m, _, _ in rv.NUMERIC_KERNELS}:
        mod = importlib.import_module(module)
        found |= {(module, n) for n, f in vars(mod).items() if isinstance(f, CPUDispatcher) and not n.startswith("_")
                  and ("randomize" in n or "alpha" in n) and not n.startswith("kofd")}
    assert found == listed
    with rv.numeric_twins():
        assert not any(isinstance(getattr(importlib.import_module(m), a), CPUDispatcher) for m, a in listed)


@pytest.mark.parametrize("case", VECTORS["numeric"], ids=NUMERIC_IDS)
def test_numba_kernels_reproduce_numeric_vectors(case):
    assert rv.replay_numeric(case) == _expected(case)


@pytest.mark.parametrize("case", VECTORS["numeric"], ids=NUMERIC_IDS)
def test_numpy_twins_reproduce_numeric_vectors(case):
    with rv.numeric_twins():
        assert rv.replay_numeric(case) == _expected(case)


def _flip(hex_text: str, bit: int) -> str:
    b = bytearray(bytes.fromhex(hex_text))
    b[bit // 8] ^= 1 << (bit % 8)
    return b.hex()


@pytest.mark.parametrize("change", ["memo key", "noise key", "value"])
def test_one_bit_changes_the_expected_bytes(change):
    case = copy.deepcopy(VECTORS["protocols"][PROTOCOL_IDS.index("L-OSUE k=100")])
    if change == "memo key":
        case["memo_key"] = _flip(case["memo_key"], 201)
    elif change == "noise key":
        case["steps"][2]["keys"][0] = _flip(case["steps"][2]["keys"][0], 7)
    else:
        case["steps"][2]["value"] ^= 1
    got = rv.replay_protocol(case)
    reports = [s["report"] for s in got]
    want = [s["report"] for s in VECTORS["protocols"][PROTOCOL_IDS.index("L-OSUE k=100")]["steps"]]
    differ = [i for i, (a, b) in enumerate(zip(reports, want)) if a != b]
    assert differ == ([0, 1, 2, 3, 4] if change == "memo key" else [2])


def test_one_bit_of_a_solution_key_changes_the_expected_bytes():
    original = VECTORS["solutions"][SOLUTION_IDS.index("L-SPL L-OSUE")]
    case = copy.deepcopy(original)
    case["state_keys"][1] = _flip(case["state_keys"][1], 100)  # the second attribute's memo key
    got = rv.replay_solution(case)
    assert all(g["reports"][0] == w["reports"][0] for g, w in zip(got, original["steps"]))
    assert all(g["reports"][1] != w["reports"][1] for g, w in zip(got, original["steps"]))


def test_a_replay_that_draws_other_keys_fails():
    case = copy.deepcopy(VECTORS["protocols"][PROTOCOL_IDS.index("GRR k=5")])
    case["steps"][0]["keys"].append(case["steps"][0]["keys"][0])
    with pytest.raises(AssertionError, match="drew 1 of 2 recorded keys"):
        rv.replay_protocol(case)


@pytest.mark.parametrize("change", ["memo key", "noise key", "value"])
def test_one_bit_changes_the_expected_numeric_bytes(change):
    name = "PM" if change != "memo key" else "1BitMean"
    original = VECTORS["numeric"][NUMERIC_IDS.index(name)]
    case = copy.deepcopy(original)
    if change == "memo key":  # another α and other memoized bits: the cells or the bits differ
        case["memo_key"] = _flip(case["memo_key"], 201)
        got = rv.replay_numeric(case)
        assert [(s["report"], s["memoized"]) for s in got] != [(s["report"], s["memoized"]) for s in original["steps"]]
        return
    if change == "noise key":
        case["steps"][2]["keys"][0] = _flip(case["steps"][2]["keys"][0], 7)
    else:
        case["steps"][2]["value"] = math.nextafter(case["steps"][2]["value"], math.inf) + 1.0
    got = [s["report"] for s in rv.replay_numeric(case)]
    want = [s["report"] for s in original["steps"]]
    assert [i for i, (a, b) in enumerate(zip(got, want)) if a != b] == [2]


# ---------------------------------------------------------------- open-domain protocols (estimators.sketch)
def test_every_open_domain_protocol_has_vectors():
    from estimators.sketch.registry import OPEN_PROTOCOLS

    cases = VECTORS["open_domain"]["cases"]
    assert set(OPEN_PROTOCOLS) - {c["params"]["protocol"] for c in cases} == set()
    assert {c["type"] for c in cases} == {"string", "u64"}
    assert any(s["ext_words"] for c in cases if c["params"]["protocol"] == "CMS" for s in c["steps"])
    assert any(ord(ch) > 127 for v in VECTORS["open_domain"]["value_ids"] for ch in v["value"])
    th = [c for c in cases if c["params"]["protocol"] == "TreeHist"]
    # memoized and not, with and without an IRR, string and u64
    assert {(c["memo_key"] is not None, c["params"]["eps_1"] is not None) for c in th} == \
        {(True, True), (True, False), (False, True), (False, False)}
    assert {c["type"] for c in th} == {"string", "u64"}


def test_treehist_memoized_vectors_repeat_per_prefix_and_count_one_tag_per_new_prefix():
    """A memoized TreeHist device without an IRR reports the same bytes for the same level prefix (its PRR), and its
    tag table gains one tag exactly when a prefix it has not memoized arrives (the loss: one eps_inf per distinct
    prefix, counted exactly); a full table meeting a new prefix overflows (all ones in slot 0, count "inf")."""
    overflowed = probed = False
    for case in VECTORS["open_domain"]["cases"]:
        if case["params"]["protocol"] != "TreeHist" or case["memo_key"] is None:
            continue
        T = case["derived"]["memo_tags"]
        assert T == case["params"]["memo_slots"] // 64
        seen: dict[str, str] = {}
        tags: list[str] = ["0" * 16] * T
        for step in case["steps"]:
            if case["params"]["eps_1"] is None:
                assert step["report"] == step["prr"]
            assert step["report"][:2] == f"{case['derived']['level']:02x}"
            assert len(step["memoized"]) == T
            if step["memoized_count"] == "inf":
                assert step["memoized"][0] == "f" * 16 and (len(seen) >= T or tags[0] == "f" * 16)
                overflowed = True
            else:
                if step["memo_input"] in seen:
                    assert step["prr"] == seen[step["memo_input"]] and step["memoized"] == tags
                new = [i for i, (a, b) in enumerate(zip(tags, step["memoized"])) if a != b]
                assert len(new) == (0 if step["memo_input"] in seen else 1)
                assert all(tags[i] == "0" * 16 and int(step["memoized"][i], 16) & 1 for i in new)
                probed |= any(int(step["memoized"][i], 16) % T != i for i in new)  # linear probing exercised
                assert step["memoized_count"] == sum(t != "0" * 16 for t in step["memoized"])
                seen[step["memo_input"]] = step["prr"]
                assert step["memoized_count"] == len(seen)
            tags = step["memoized"]
    assert overflowed and probed


def test_value_ids_and_sketch_hashes():
    from estimators.sketch.hashing import row_seeds, sketch_hash, spread, value_id

    for v in VECTORS["open_domain"]["value_ids"]:
        value = int(v["value"]) if v.get("type") == "u64" else v["value"]
        assert f"{value_id(value):016x}" == v["id"], v
        if "utf8" in v:
            assert bytes.fromhex(v["utf8"]) == v["value"].encode("utf-8")
    for h in VECTORS["open_domain"]["sketch_hash"]:
        seeds = row_seeds(int(h["seed_hex"], 16), h["rows"])
        assert [f"{int(s):016x}" for s in seeds] == h["row_seeds"]
        assert [f"{spread(int(s)):016x}" for s in seeds] == h["spreads"]
        ids = np.array([int(x, 16) for x in h["ids"]], dtype=np.uint64)
        assert sketch_hash(ids, seeds, h["m"]).tolist() == h["hashes"]


def test_every_open_domain_randomizing_kernel_has_its_twin_in_the_replay():
    """A randomizing numba kernel an open-domain protocol's module calls is replaced by its twin in the twin replay."""
    import importlib
    import sys

    from numba.core.registry import CPUDispatcher

    from estimators.sketch.registry import OPEN_PROTOCOLS

    listed = {(m, a) for m, a, _, _ in rv.OPEN_KERNELS}
    found = set()
    for module in {cls.__module__ for cls in OPEN_PROTOCOLS.values()}:
        found |= {(module, n) for n, f in vars(sys.modules[module]).items()
                  if isinstance(f, CPUDispatcher) and "randomize" in n}
        # kernels called through a kernel module the protocol's module imports (TreeHist: ``tk.treehist_randomize``)
        for sub in vars(sys.modules[module]).values():
            if isinstance(sub, type(sys)) and sub.__name__.startswith("estimators.sketch."):
                found |= {(sub.__name__, n) for n, f in vars(sub).items()
                          if isinstance(f, CPUDispatcher) and "randomize" in n}
    assert found <= listed
    assert ("estimators.sketch.treehist_kernels", "keyed_choice") in listed  # a TreeHist device's level
    with rv.open_twins():
        assert not any(isinstance(getattr(importlib.import_module(m), a), CPUDispatcher) for m, a in listed)


@pytest.mark.parametrize("case", VECTORS["open_domain"]["cases"], ids=OPEN_IDS)
def test_numba_kernels_reproduce_open_domain_vectors(case):
    assert rv.replay_open(case) == _expected(case)
    proto = rv._open_proto(case["params"])
    assert proto.fingerprint == case["fingerprint"] and f"{proto.seed:016x}" == case["seed_hex"]


@pytest.mark.parametrize("case", VECTORS["open_domain"]["cases"], ids=OPEN_IDS)
def test_numpy_twins_reproduce_open_domain_vectors(case):
    with rv.open_twins():
        assert rv.replay_open(case) == _expected(case)


@pytest.mark.parametrize("change", ["noise key", "value"])
def test_one_bit_changes_the_expected_open_domain_bytes(change):
    original = VECTORS["open_domain"]["cases"][OPEN_IDS.index("CMS m=256 k=16")]
    case = copy.deepcopy(original)
    if change == "noise key":
        case["steps"][2]["keys"][0] = _flip(case["steps"][2]["keys"][0], 7)
    else:
        case["steps"][2]["value"] += "."  # another id: another cell of the row (the hash of this pair differs)
    got = [s["report"] for s in rv.replay_open(case)]
    differ = [i for i, (a, b) in enumerate(zip(got, [s["report"] for s in original["steps"]])) if a != b]
    assert differ == [2]
