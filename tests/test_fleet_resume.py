"""Fleet resumes that cannot diverge (issue 18): the state directory holds what a step drew before it is sent.

Unit level (no broker): a drawn step is re-sent byte for byte by a resumed private-mode fleet, its
group's sampling and its devices' keys included; a resume with another batch-shaping option is
refused naming it; one producer per state directory (an exclusive lock); an unreadable state file is
a :class:`FleetStateError` naming the file.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from producers.fleet import Fleet, FleetConfig, FleetStateError
from wire.campaign import Campaign

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "deploy" / "campaigns" / "demo.toml"  # three attributes and an ALLOMFREE group of three


def _campaign() -> Campaign:
    return Campaign.load(DEMO)


def _config(state: Path | None, **kw) -> FleetConfig:
    base = dict(campaign=_campaign(), n_devices=3_000, steps=3, batch_size=700, state_dir=state)
    return FleetConfig(**{**base, **kw})


def _messages(fleet: Fleet, data) -> list[tuple[bytes, bytes]]:
    return [(key, blob) for d in data for key, blob, _ in fleet.messages(d)]


def _device_state(fleet: Fleet) -> dict[str, np.ndarray]:
    """Every array that decides a device's future reports: memo keys and marks, a group's sampling and memos."""
    out: dict[str, np.ndarray] = {}
    for name, st in fleet.states.items():
        if st is not None:
            out[f"{name}.keys"], out[f"{name}.seen"] = st.keys, st.seen
    for group, gst in fleet.group_states.items():
        out[f"{group}.sampled"], out[f"{group}.reported"] = gst.sampled, gst.reported
        for j, memo in enumerate(gst.memos):
            if memo is not None:
                out[f"{group}.{j}.keys"], out[f"{group}.{j}.seen"] = memo.keys, memo.seen
    for name, pop in fleet.populations.items():
        out[f"{name}.values"] = pop.values
    return out


# --------------------------------------------------------------------------- unit level
def test_private_fleet_resumed_mid_step_resends_identical_bytes(tmp_path):
    state = tmp_path / "state"
    first = Fleet(_config(state))
    assert not first.simulation and first.resent_step is None
    data = first.draw(0)                    # what publish does before the step's first batch
    sent = _messages(first, data)
    drawn = {k: v.copy() for k, v in _device_state(first).items()}
    meta = json.loads((state / "fleet.json").read_text())
    assert meta["pending"] and meta["next_step"] == 0 and meta["snapshot"] is None
    first.close()                           # the crash: some batches out, nothing committed

    second = Fleet(_config(state))
    assert second.resumed and second.resent_step == 0 and list(second.step_range) == [0, 1, 2]
    assert second.producer_id == first.producer_id
    again = second.draw(0)
    assert _messages(second, again) == sent  # same bytes, same batch ids, same order
    after = _device_state(second)
    assert set(after) == set(drawn)
    for name, arr in drawn.items():         # the state after step 0: group sampling, keys, memo marks, values
        assert np.array_equal(after[name], arr), name
    # ALLOMFREE: each device reports the one attribute it sampled; the three counts sum to the fleet
    group = [d for d in again if d.attribute in ("dark_mode", "country", "device_model")]
    assert sum(d.n for d in group) == 3_000
    assert [d.n for d in group] == list(np.bincount(after["device.sampled"], minlength=3))
    # the step is sent again, not drawn again, however often the fleet asks for it
    assert second.draw(0) is again
    with pytest.raises(FleetStateError, match="step 0 was drawn"):
        second.draw(1)
    second.commit(0)
    assert not list(state.glob("step-*/*.reports.npy"))  # acknowledged: its reports are not kept
    step1 = _messages(second, second.draw(1))
    assert not set(step1) & set(sent)
    second.close()

    # a fleet of new devices (another state directory) draws other keys and another sampling: the
    # comparisons above could fail
    other = Fleet(_config(tmp_path / "other"))
    other.draw(0)
    assert not np.array_equal(_device_state(other)["device.sampled"], drawn["device.sampled"])
    other.close()


def test_committed_step_resumes_at_the_next_with_the_same_devices(tmp_path):
    state = tmp_path / "state"
    with Fleet(_config(state)) as first:
        first.draw(0)
        first.commit(0)
        keys = {k: v.copy() for k, v in _device_state(first).items()}
    with Fleet(_config(state)) as second:
        assert second.resumed and second.resent_step is None and second.next_step == 1
        for name, arr in keys.items():
            assert np.array_equal(_device_state(second)[name], arr), name
    meta = json.loads((state / "fleet.json").read_text())
    assert meta["next_step"] == 1 and meta["pending"] is None and len(list(state.glob("step-*"))) == 1


@pytest.mark.parametrize("option, value, shown", [
    ("batch_size", 350, "--batch-size 700; this run has --batch-size 350"),
    ("dataset", "uniform", "--dataset syn; this run has --dataset uniform"),
    ("p_change", 0.5, "--p-change 0.25; this run has --p-change 0.5"),
    ("seed", 7, "--seed none (private mode); this run has --seed 7"),
    ("n_devices", 2_000, "--devices 3000; this run has --devices 2000"),
])
def test_resume_with_another_batch_shaping_option_is_refused(tmp_path, option, value, shown):
    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.draw(0)
    with pytest.raises(FleetStateError, match=shown.replace("(", r"\(").replace(")", r"\)")):
        Fleet(_config(state, **{option: value}))
    with Fleet(_config(state)) as fleet:    # the refusal changed nothing
        assert fleet.resent_step == 0


def test_options_of_a_fleet_that_never_drew_may_change(tmp_path):
    state = tmp_path / "state"
    Fleet(_config(state)).close()           # killed before drawing anything: nothing was sent
    with Fleet(_config(state, batch_size=350)) as fleet:
        assert not fleet.resumed
    assert json.loads((state / "fleet.json").read_text())["options"]["batch_size"] == 350


def test_one_producer_per_state_directory(tmp_path):
    state = tmp_path / "state"
    first = Fleet(_config(state))
    with pytest.raises(FleetStateError, match=rf"is in use by another producer \(pid {os.getpid()}\)"):
        Fleet(_config(state))
    first.close()
    Fleet(_config(state)).close()
    # another process holding it; the kernel releases the lock when that process is SIGKILLed
    code = ("import sys, time; from producers.fleet import Fleet, FleetConfig; from wire.campaign import Campaign; "
            f"f = Fleet(FleetConfig(Campaign.load({str(DEMO)!r}), 3000, 1, batch_size=700, state_dir={str(state)!r})); "
            "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(FleetStateError, match=rf"in use by another producer \(pid {proc.pid}\)"):
            Fleet(_config(state))
    finally:
        proc.kill()
        proc.wait()
    Fleet(_config(state)).close()


def _corrupt(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("target", ["app_version.memo.npz", "device.group.npz", "opt_in.values.npy",
                                    "country.reports.npy", "manifest.json", "fleet.json", "producer.json"])
def test_a_corrupt_state_file_is_a_clear_error(tmp_path, target):
    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.draw(0)
    snap = state / json.loads((state / "fleet.json").read_text())["pending"]
    path = state / target if target.endswith(".json") and target != "manifest.json" else snap / target
    _corrupt(path)
    with pytest.raises(FleetStateError) as info:
        Fleet(_config(state))
    text = str(info.value)
    assert str(path) in text and "another --state-dir" in text and "backup" in text, text


@pytest.mark.parametrize("garbage", [b"PK\x03\x04 not a zip", b""])
def test_a_corrupt_legacy_state_file_is_a_clear_error(tmp_path, garbage):
    """A version-1 state (no checksums): the loaders' own errors (BadZipFile, ValueError) name the file."""
    state = tmp_path / "state"
    with Fleet(_config(state)) as fleet:
        fleet.step(0)
    meta = json.loads((state / "fleet.json").read_text())
    snap = state / meta["snapshot"]
    (snap / "manifest.json").unlink()
    legacy = {k: v for k, v in meta.items() if k not in ("options", "pending", "simulation", "sha256")}
    legacy.update(version=1, n_devices=3_000, dataset="syn", base="zipf", p_change=0.25, seed=None)
    (state / "fleet.json").write_text(json.dumps(legacy))
    with Fleet(_config(state)) as fleet:    # an intact legacy state is resumed
        assert fleet.resumed and fleet.next_step == 1
    (snap / "device.group.npz").write_bytes(garbage)
    with pytest.raises(FleetStateError, match=str(snap / "device.group.npz")):
        Fleet(_config(state))
