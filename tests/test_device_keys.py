"""No 64-bit secret on any path from a device's true value to its report.

The fleet (``ldp produce``) and the device SDK draw every memo key and every batch noise key
as 256 bits from the OS CSPRNG; seeded randomness is the labelled simulation mode only.
"""
from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

import estimators
from estimators import randomness
from estimators.memo import MemoState
from producers.fleet import Fleet, FleetConfig
from wire.campaign import Campaign


def _campaign() -> Campaign:
    return Campaign.from_dict({"campaign": {"id": "keys-test"}, "attributes": [
        {"name": "ver", "k": 40, "protocol": "L-OSUE", "eps_inf": 2.0, "eps_1": 1.0},
        {"name": "minute", "k": 60, "protocol": "LOLOHA", "eps_inf": 2.0, "eps_1": 1.0},
        {"name": "bucket", "k": 16, "protocol": "GRR", "eps": 1.0},
    ]})


class _EntropyTap:
    """Records every request to the OS CSPRNG (``secrets.token_bytes``) made by the randomness module."""

    def __init__(self, monkeypatch) -> None:
        self.sizes: list[int] = []
        real = randomness.secrets.token_bytes

        def tap(n: int) -> bytes:
            self.sizes.append(n)
            return real(n)
        monkeypatch.setattr(randomness.secrets, "token_bytes", tap)


def test_fleet_default_is_private_256_bit_keys_from_the_os(monkeypatch):
    tap = _EntropyTap(monkeypatch)
    n = 1_000
    with warnings.catch_warnings():
        warnings.simplefilter("error", randomness.SimulationWarning)  # no seeded draw anywhere
        fleet = Fleet(FleetConfig(_campaign(), n_devices=n, steps=1))
        assert FleetConfig(_campaign(), n_devices=1, steps=1).seed is None and not fleet.simulation
        for name in ("ver", "minute"):
            st = fleet.states[name]
            assert st.keys.dtype == np.uint32 and st.keys.shape == (n, 8)  # 256 bits per device
        assert tap.sizes == [32 * n, 32 * n]  # the two memo-key draws
        tap.sizes.clear()
        fleet.step(persist=False)
    assert tap.sizes == [32, 32, 32]  # one 256-bit noise key per attribute's randomize call
    other = Fleet(FleetConfig(_campaign(), n_devices=n, steps=1))
    assert not np.array_equal(other.states["ver"].keys, fleet.states["ver"].keys)


def test_seeded_fleet_is_labelled_simulation():
    with pytest.warns(randomness.SimulationWarning):
        fleet = Fleet(FleetConfig(_campaign(), n_devices=100, steps=1, seed=3))
    assert fleet.simulation


def test_ldp_produce_defaults_to_os_entropy_and_labels_seeds():
    from ldpstream_cli.cli import produce
    assert inspect.signature(produce).parameters["seed"].default is None
    from ldpstream_cli.cli import app
    out = CliRunner().invoke(app, ["produce", "--help"], terminal_width=200).output
    words = " ".join(out.replace("│", " ").split())  # rich wraps the help inside a box
    assert "NOT private" in words and "OS CSPRNG" in words


@pytest.mark.parametrize("name,kw", [("L-OSUE", dict(k=20, eps_inf=2.0, eps_1=1.0)),
                                     ("LOLOHA", dict(k=20, eps_inf=2.0, eps_1=1.0)),
                                     ("dBitFlipPM", dict(k=20, b=10, d=2, eps_inf=2.0)), ("OUE", dict(k=20, eps=1.0))])
def test_protocols_draw_256_bit_keys_per_call_without_rng(monkeypatch, name, kw):
    proto = estimators.make(name, **kw)
    tap = _EntropyTap(monkeypatch)
    state = proto.new_state(50)
    if state is not None:
        assert isinstance(state, MemoState) and state.keys.shape == (50, 8) and state.keys.dtype == np.uint32
    tap.sizes.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", randomness.SimulationWarning)
        proto.randomize(np.zeros(50, dtype=np.int64), state=state)
    assert all(s >= 32 for s in tap.sizes) and (tap.sizes or name == "dBitFlipPM")


def test_old_memo_state_files_are_refused(tmp_path):
    import io
    import json
    path = tmp_path / "old.memo.npz"
    header = json.dumps({"format": "ldp-stream/memo-state", "version": 1, "fingerprint": "x",
                         "n_devices": 2, "memo_size": 8}).encode()
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(header, dtype=np.uint8), keys=np.arange(2, dtype=np.uint64),
             seen=np.zeros((2, 1), np.uint8))
    path.write_bytes(buf.getvalue())
    with pytest.raises(estimators.errors.InvalidState, match="version-1 .*64-bit keys"):
        MemoState.load(path)


def test_device_sdk_uses_256_bit_keys_from_the_os_and_no_generator(tmp_path, monkeypatch):
    from producers.sdk import Device
    camp = _campaign()
    with pytest.raises(TypeError):
        Device(camp, tmp_path / "sim", rng=np.random.default_rng(1))  # no simulation mode on a device
    tap = _EntropyTap(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", randomness.SimulationWarning)
        dev = Device(camp, tmp_path / "dev")
        for name in ("ver", "minute", "bucket"):
            dev.randomize(name, 3)
    for name in ("ver", "minute"):
        st = dev.states[name]
        assert st.keys.dtype == np.uint32 and st.keys.shape == (1, 8)
    assert tap.sizes.count(32) >= 5 and all(s >= 32 for s in tap.sizes)  # 2 memo keys + 3 noise keys
