"""Compile the numba kernels of every protocol, numeric mechanism and solution once, into numba's on-disk cache.

A fresh checkout has no compiled kernels: the first process that calls one compiles it (the UE chain kernel
alone takes about 25 s of CPU), and every process that starts before the cache holds it compiles it again.
The test suite (``tests/conftest.py``) runs this first, in one process per CPU, each compiling a disjoint
family of kernels, so that the test processes, workers and producers it starts load them from the cache.
A deployment can run it at image build time for the same reason (``python -m ldpstream_dev.kernels_warmup``).

    python -m ldpstream_dev.kernels_warmup [--part I --parts N]
"""
from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

__all__ = ["FAMILIES", "NUMERIC_FAMILIES", "OPEN_FAMILIES", "partition", "plan", "warm"]

#: Protocols grouped by the kernels they compile, with the CPU seconds a cold compile of the group took
#: (2026-11-27, the 2-core machine, the ChaCha20 core no longer IR-inlined, in this order in one process, the
#: shared ChaCha20 code in the first: ``docs/benchmarks.md``). A part compiles whole groups, so two parts never
#: compile the same kernel at the same time; the parts are balanced on these weights (longest first). The
#: multidimensional solutions reuse the protocols' kernels and come last, in part 0.
FAMILIES: tuple[tuple[float, tuple[str, ...]], ...] = (
    (13.3, ("SUE", "OUE", "L-SUE", "L-OUE", "L-OSUE", "L-SOUE", "THE")),
    (14.6, ("SHE",)),
    (12.6, ("dBitFlipPM", "SS")),
    (9.5, ("HR", "FHR")),
    (4.9, ("BLH", "OLH", "LOLOHA")),
    (3.5, ("GRR", "L-GRR", "ADP", "L-ADP")),
)

#: The numeric mechanisms (:data:`estimators.numeric.MECHANISMS`, and ``"k-of-d"``: PM's and HM's k-of-d sampling)
#: grouped the same way, with the CPU seconds each group adds to a part after its protocols (measured with them). Not in
#: :data:`FAMILIES` (the frequency protocols, each once): :func:`plan` puts each group on the part with the least
#: weight once the protocols' groups are placed, so :func:`partition` is unchanged.
NUMERIC_FAMILIES: tuple[tuple[float, tuple[str, ...]], ...] = (
    (4.6, ("PM", "HM", "k-of-d", "Duchi")),
    (7.1, ("SW", "Laplace", "1BitMean")),
)

#: The open-domain protocols (:data:`estimators.sketch.registry.OPEN_PROTOCOLS`) and the library's heavy hitters and
#: RAPPOR, grouped the same way (CPU seconds of a cold compile after the protocols and numeric mechanisms), placed
#: after the numeric mechanisms.
OPEN_FAMILIES: tuple[tuple[float, tuple[str, ...]], ...] = (
    (3.4, ("TreeHist",)),
    (2.4, ("CMS", "HCMS")),
    (2.0, ("PEM", "RAPPOR")),
)

#: The parameter sets each protocol is compiled for: a small domain (8-bit reports) and a wide one with a small
#: ε (16-bit reports, SHE's 16-bit noise), the report types of the campaigns the tests and the demo run.
_OPTION_SETS = (dict(k=20, eps=1.0, eps_inf=2.0, eps_1=1.0, b=20, d=1),
                dict(k=300, eps=0.5, eps_inf=1.0, eps_1=0.5, b=300, d=1))


def _protocol(name: str) -> None:
    import estimators
    from estimators.registry import parameters
    from estimators.warmup import warm_up_protocol

    takes = parameters(name)
    for options in _OPTION_SETS:
        proto = estimators.make(name, **{k: v for k, v in options.items() if k in takes})
        values = np.arange(64, dtype=np.int64) % proto.k
        for rng in (None, np.random.default_rng(0)):  # the CSPRNG path and the labelled simulation mode
            warm_up_protocol(proto, proto.randomize(values, rng, state=proto.new_state(64, rng=rng)))


def _solution(name: str) -> None:
    import estimators

    for params in (dict(ks=[2, 10, 50], eps_inf=2.0, eps_1=1.0), dict(ks=[2, 10, 50], eps=1.0)):
        try:
            sol = estimators.make_solution(name, **params)
        except (TypeError, estimators.LDPError):
            continue
        for rng in (None, np.random.default_rng(0)):
            out = sol.randomize(np.zeros((64, sol.d), dtype=np.int64), rng, state=sol.new_state(64, rng=rng))
            counts, ns = sol.support(out), sol.report_counts(out)
            for j in range(sol.d):
                sol.estimate(j, counts[j], ns[j])


#: The parameter sets each numeric mechanism is compiled for (beyond ``eps``, ``lo``, ``hi``): every report dtype
#: (PM: ``uint16`` up to 16 grid bits, ``uint32`` above); Square Wave on a small grid (the kernels' types do not
#: depend on its size, and its distribution's EMS and bootstrap run here too).
_NUMERIC_OPTIONS: dict[str, tuple[dict, ...]] = {"PM": (dict(grid_bits=16), dict(grid_bits=20)),
                                                 "SW": (dict(d_in=32, d_out=32),)}


def _numeric(name: str) -> None:
    """A numeric mechanism as a campaign attribute's protocol: randomize (both randomness modes; 1BitMean with and
    without a memo state), the worker's support and mean, and Square Wave's distribution; ``"k-of-d"``: PM's and
    HM's k-of-d kernels."""
    from estimators.numeric import make_numeric
    from estimators.numeric.piecewise import PiecewiseMultidim
    from estimators.numeric.protocol import NumericProtocol
    from estimators.warmup import warm_up_protocol

    if name == "k-of-d":
        for base in ("PM", "HM"):
            multi = PiecewiseMultidim(4, 5.0, base=base)
            for rng in (None, np.random.default_rng(0)):
                multi.attribute_sums(*multi.randomize(np.zeros((64, 4)), rng))
        return
    values = np.linspace(-10.0, 110.0, 64)  # both ends clipped
    for options in _NUMERIC_OPTIONS.get(name, ({},)):
        proto = NumericProtocol(make_numeric(name, eps=1.0, lo=0.0, hi=100.0, **options))
        for rng in (None, np.random.default_rng(0)):
            for state in (None, proto.new_state(64, rng=rng)) if proto.memo_size else (None,):
                reports = proto.randomize(values, rng, state=state)
                warm_up_protocol(proto, reports)
            if proto.is_distribution:
                proto.estimate_step(proto.support(reports), len(values), rng=np.random.default_rng(0))


def _open(name: str) -> None:
    """An open-domain protocol as a campaign attribute's protocol (both randomness modes; TreeHist with and without a
    memo state and an IRR), or the library's PEM decode and RAPPOR's memoized randomizer, support and decoding."""
    from estimators.warmup import warm_up_protocol

    ids = np.arange(64, dtype=np.uint64)
    if name == "PEM":
        from estimators.sketch.pem import PEM

        pem = PEM(16, 2.0, 4, step=4)
        pem.decode(pem.randomize(np.arange(64) % 100, np.random.default_rng(0)))
        return
    if name == "RAPPOR":
        from estimators.sketch.rappor import RAPPOR

        rappor = RAPPOR(32, 2, 4, 0.5, 0.5, 0.75, seed=1)
        for rng in (None, np.random.default_rng(0)):
            support = rappor.support(rappor.randomize(ids, rng, state=rappor.new_state(64, rng=rng)))
        rappor.estimate(support, ids[:8])
        return
    from estimators.sketch.registry import make_open

    options = {"CMS": (dict(m=64, k=4),), "HCMS": (dict(m=64, k=4),),
               "TreeHist": (dict(rows=4), dict(rows=4, eps_1=1.0))}[name]
    for extra in options:
        proto = make_open(name, eps=2.0, seed=1, **extra)
        for rng in (None, np.random.default_rng(0)):
            for state in (None, proto.new_state(64, rng=rng)) if proto.memo_size else (None,):
                warm_up_protocol(proto, proto.randomize(ids, rng, state=state))


def plan(parts: int) -> list[tuple[list[str], list[str], list[str]]]:
    """``(protocols, numeric mechanisms, open-domain protocols)`` of each of ``parts`` parts: the groups of
    :data:`FAMILIES`, longest first, each to the part with the least weight so far, then those of
    :data:`NUMERIC_FAMILIES` and :data:`OPEN_FAMILIES` the same way."""
    load = [0.0] * parts
    out: list[tuple[list[str], list[str], list[str]]] = [([], [], []) for _ in range(parts)]
    for which, families in ((0, FAMILIES), (1, NUMERIC_FAMILIES), (2, OPEN_FAMILIES)):
        for seconds, family in sorted(families, key=lambda f: -f[0]):
            lightest = load.index(min(load))
            load[lightest] += seconds
            out[lightest][which].extend(family)
    return out


def partition(parts: int) -> list[list[str]]:
    """The protocols of each of ``parts`` parts (:func:`plan`)."""
    return [protocols for protocols, _, _ in plan(parts)]


def warm(part: int = 0, parts: int = 1) -> list[str]:
    """Compile the kernels of part ``part`` of :func:`plan` (all of them for one part); the solutions in part 0.
    Returns the names warmed."""
    from estimators.randomness import SimulationWarning

    names, numeric, open_domain = plan(parts)[part]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SimulationWarning)
        for name in names:
            _protocol(name)
        for name in numeric:
            _numeric(name)
        for name in open_domain:
            _open(name)
        names = names + numeric + open_domain
        if part == 0:
            import estimators

            for name in estimators.SOLUTIONS:
                _solution(name)
                names.append(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", type=int, default=0)
    parser.add_argument("--parts", type=int, default=1)
    args = parser.parse_args()
    if not 0 <= args.part < args.parts:
        parser.error("--part must be in [0, --parts)")
    start = time.monotonic()
    names = warm(args.part, args.parts)
    print(f"compiled the kernels of {len(names)} protocols/mechanisms/solutions in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
