"""A device fails closed: no crash, deletion, truncation or foreign file makes it report with a new key
while its privacy loss stays uncounted (:mod:`producers.sdk`, "Device state"); campaigns evolve per attribute.

dBitFlipPM has no IRR round, so a memoized response is repeated bit for bit: a report equal to an earlier
one is the same memoized PRR, a different one a re-keyed device.
"""
from __future__ import annotations

import os
import shutil
import stat

import pytest

from estimators import fileio
from producers.sdk import Device, DeviceStateError
from wire.campaign import Campaign

pytestmark = pytest.mark.timeout(180)

BITS = {"name": "bits", "k": 16, "protocol": "dBitFlipPM", "eps_inf": 2.0, "b": 8, "d": 4}
VER = {"name": "ver", "k": 20, "protocol": "L-OSUE", "eps_inf": 1.0, "eps_1": 0.5}
CLICK = {"name": "click", "k": 4, "protocol": "GRR", "eps": 0.5}
GROUP = {"name": "g", "solution": "L-SMP", "attributes": ["size", "os"], "protocol": "dBitFlipPM",
         "eps_inf": 2.0, "protocol_params": {"b": 4, "d": 4}}


def _campaign(*attrs: dict, groups: list[dict] | None = None) -> Campaign:
    spec = {"campaign": {"id": "device-state"}, "attributes": list(attrs)}
    if groups:
        spec["groups"] = groups
    return Campaign.from_dict(spec)


def _grouped() -> Campaign:
    return _campaign(BITS, {"name": "size", "k": 8}, {"name": "os", "k": 4}, groups=[GROUP])


def _payload(dev: Device, attr: str, value: int, t: int = 0) -> str:
    return dev.report(attr, value, t=t)["payload"]


@pytest.mark.parametrize("damage", ["delete", "truncate", "foreign", "key"])
def test_a_damaged_memo_file_refuses_the_attribute_and_sends_nothing(tmp_path, damage):
    camp = _campaign(BITS, CLICK)
    path = tmp_path / "dev"
    with Device(camp, path) as dev:
        _payload(dev, "bits", 3)
    memo = path / "bits.memo.npz"
    if damage == "delete":
        memo.unlink()
    elif damage == "key":
        (path / "memo.bits.key").unlink()
    elif damage == "truncate":
        memo.write_bytes(memo.read_bytes()[:40])
    else:  # right protocol, another key (in the default FileKeyStore)
        (path / "memo.bits.key").write_bytes(os.urandom(32))
    with Device(camp, path) as dev:
        with pytest.raises(DeviceStateError, match="bits.memo.npz") as exc:
            dev.report("bits", 3, t=1)
        assert "reset" in str(exc.value) and "Delete" not in str(exc.value)
        assert dev.report("click", 1, t=1)["attribute"] == "click"  # the other attributes go on
    if damage == "foreign":  # another protocol's file
        _campaign({**BITS, "eps_inf": 3.0}).attribute("bits").protocol.new_state(1).save(memo)
        with Device(camp, path) as dev, pytest.raises(DeviceStateError, match="bits.memo.npz"):
            dev.send("bits", 3) if dev.ingest_url else dev.report("bits", 3, t=2)


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_lost_ledger_or_identity_refuses_the_device(tmp_path, damage):
    camp = _campaign(CLICK)  # memoryless: only the ledger knows how many reports it spent
    for name in ("budget.json", "device.json"):
        path = tmp_path / name
        with Device(camp, path) as dev:
            dev.report("click", 1, t=0)
        f = path / name
        f.unlink() if damage == "delete" else f.write_bytes(f.read_bytes()[:10])
        with pytest.raises(DeviceStateError, match=name):
            Device(camp, path)


@pytest.mark.parametrize("damage", ["delete", "truncate", "foreign"])
def test_a_damaged_group_file_refuses_the_group(tmp_path, damage):
    camp = _grouped()
    path = tmp_path / "dev"
    with Device(camp, path) as dev:
        dev.report_group("g", [1, 2], t=0)
    gfile = path / "g.group.npz"
    if damage == "delete":
        gfile.unlink()
    elif damage == "truncate":
        gfile.write_bytes(gfile.read_bytes()[:100])
    else:  # the same solution, redrawn: new keys and maybe another sampled attribute
        camp.groups["g"].solution.new_state(1).save(gfile)
    with Device(camp, path) as dev:
        with pytest.raises(DeviceStateError, match="g.group.npz"):
            dev.report_group("g", [1, 2], t=1)
        assert dev.report("bits", 1, t=1)


def test_reset_counts_the_fresh_keys_loss(tmp_path):
    camp = _campaign(BITS, VER)
    path = tmp_path / "dev"
    with Device(camp, path) as dev:
        for t, v in enumerate([1, 2]):
            dev.report("ver", v, t=t)
        before = dev.reserved_loss()
        assert dev.privacy_loss() == pytest.approx(2.0)
    (path / "ver.memo.npz").unlink()
    with Device(camp, path) as dev:
        with pytest.raises(DeviceStateError):
            dev.report("ver", 1, t=2)
        assert dev.reserved_loss() == pytest.approx(before)  # the lost key's loss is still counted
        with pytest.raises(ValueError, match="accept_privacy_loss"):
            dev.reset("ver")
        eps_inf = float(camp.attribute("ver").protocol.longitudinal_loss(1))
        assert dev.reset("ver", accept_privacy_loss=True) == pytest.approx(before + eps_inf)
        dev.report("ver", 1, t=2)
        assert dev.privacy_loss() >= 2.0 + eps_inf - 1e-9  # true loss: both keys memoized value 1
    with Device(camp, path) as dev:  # it survives a restart
        assert dev.reserved_loss() >= before + eps_inf - 1e-9
        dev.report("ver", 1, t=3)


def test_group_reset_counts_the_new_state(tmp_path):
    camp = _grouped()
    path = tmp_path / "dev"
    with Device(camp, path) as dev:
        dev.report_group("g", [1, 2], t=0)
        before = dev.reserved_loss()
    (path / "g.group.npz").unlink()
    sol = camp.groups["g"].solution
    with Device(camp, path) as dev:
        after = dev.reset("g", group=True, accept_privacy_loss=True)
        assert after == pytest.approx(before + float(sol.loss_bound(1)))  # the new sampled attribute's ε∞
        assert dev.report_group("g", [1, 2], t=1)


def test_state_directory_is_private(tmp_path):
    path = tmp_path / "dev"
    with Device(_campaign(BITS), path) as dev:
        _payload(dev, "bits", 1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert all(stat.S_IMODE(os.stat(f).st_mode) & 0o077 == 0 for f in path.iterdir())
    os.chmod(path, 0o755)
    Device(_campaign(BITS), path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700


def _ops(path, camp: Campaign, sent: dict[int, str]) -> None:
    """A device's life: construction, first reports, a new value, a memoized one; each report recorded."""
    with Device(camp, path) as dev:
        for t, v in enumerate([3, 3, 5, 3, 7]):
            p = _payload(dev, "bits", v, t=t)
            assert sent.setdefault(v, p) == p
            dev.report("click", v % 4, t=t)


def test_a_crash_at_any_write_never_re_keys(tmp_path, monkeypatch):
    camp = _campaign(BITS, CLICK)
    real = fileio.os.replace
    n_writes = [0]

    def counting(a, b):
        n_writes[0] += 1
        return real(a, b)
    monkeypatch.setattr(fileio.os, "replace", counting)
    _ops(tmp_path / "full", camp, {})
    total = n_writes[0]
    assert total >= 8
    reopened = 0
    for i in range(1, total + 1):
        calls = [0]

        def crashing(a, b, i=i):
            calls[0] += 1
            if calls[0] == i:
                raise OSError("crash")  # the power fails before the i-th rename
            return real(a, b)
        path = tmp_path / f"crash{i}"
        sent: dict[int, str] = {}
        monkeypatch.setattr(fileio.os, "replace", crashing)
        with pytest.raises(OSError, match="crash"):
            _ops(path, camp, sent)
        monkeypatch.setattr(fileio.os, "replace", real)
        try:
            dev = Device(camp, path)
        except DeviceStateError:
            continue
        with dev:
            for t, v in enumerate([3, 5, 7], start=10):
                try:
                    p = _payload(dev, "bits", v, t=t)
                except DeviceStateError:
                    continue
                assert sent.get(v, p) == p, f"crash at write {i}: value {v} re-keyed"
                reopened += v in sent
            memo = float(camp.attribute("bits").protocol.longitudinal_loss(len(sent)))
            assert dev.reserved_loss() >= memo - 1e-9
    assert reopened >= total // 2  # most crash points restart and repeat the memoized PRRs


def test_campaign_evolves_without_re_keying(tmp_path):
    path = tmp_path / "dev"
    two = _campaign(BITS, CLICK)
    with Device(two, path) as dev:
        first = _payload(dev, "bits", 3)
        dev.report("click", 1, t=0)
        loss = dev.privacy_loss()
    three = Campaign.from_dict({"campaign": {"id": "device-state", "time_step_seconds": 3600, "retention_steps": 10},
                                "attributes": [BITS, CLICK, VER]})
    with Device(three, path) as dev:
        assert _payload(dev, "bits", 3, t=1) == first  # the same key and memo
        assert dev.privacy_loss() == pytest.approx(loss)  # nothing memoized anew
        dev.report("ver", 2, t=1)
    changed = _campaign({**BITS, "eps_inf": 3.0}, CLICK, VER)
    with Device(changed, path) as dev:
        with pytest.raises(DeviceStateError, match=r"'bits' changed.*reset\('bits'.*accept_privacy_loss=True"):
            dev.report("bits", 3, t=2)
        dev.report("ver", 2, t=2)  # the others go on
        before = dev.reserved_loss()
        new_first = float(changed.attribute("bits").protocol.longitudinal_loss(1))
        assert dev.reset("bits", accept_privacy_loss=True) == pytest.approx(before + new_first)
        assert _payload(dev, "bits", 3, t=3) != first
        old = float(two.attribute("bits").protocol.longitudinal_loss(1))
        assert dev.privacy_loss("bits") >= old + new_first - 1e-9  # both versions counted
        end = dev.reserved_loss()
    # removing an attribute keeps its loss counted
    with Device(_campaign({**BITS, "eps_inf": 3.0}, VER), path) as dev:
        assert dev.reserved_loss() == pytest.approx(end)


class _MemoryKeyStore:
    """An app's key store (here a dict), as an OS keystore adapter would be."""

    def __init__(self) -> None:
        self.secrets: dict[str, bytes] = {}

    def get(self, name: str) -> bytes | None:
        return self.secrets.get(name)

    def put(self, name: str, secret: bytes) -> None:
        self.secrets[name] = bytes(secret)


def test_keys_go_through_the_key_store(tmp_path):
    from producers.keystore import KeyStore
    store = _MemoryKeyStore()
    assert isinstance(store, KeyStore)
    camp = _campaign(BITS)
    path = tmp_path / "dev"
    with Device(camp, path, keystore=store) as dev:
        first = _payload(dev, "bits", 3)
    assert len(store.secrets["memo.bits"]) == 32 and not list(path.glob("*.key"))
    from estimators.memo import MemoState
    assert not MemoState.load(path / "bits.memo.npz").keys.any()  # no key in the memo file
    with Device(camp, path, keystore=store) as dev:
        assert _payload(dev, "bits", 3, t=1) == first
    with Device(camp, path, keystore=_MemoryKeyStore()) as dev:  # the key store lost the key
        with pytest.raises(DeviceStateError, match="missing from the key store"):
            dev.report("bits", 3, t=2)
    # the default FileKeyStore: one 0600 file per key in the state directory
    with Device(camp, tmp_path / "files") as dev:
        _payload(dev, "bits", 3)
    key = tmp_path / "files" / "memo.bits.key"
    assert key.stat().st_size == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600
