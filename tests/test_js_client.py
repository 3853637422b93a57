"""The JavaScript device client (``clients/js``, npm package ``ldp-stream-device``): its own suite (every protocol,
solution and ledger vector replayed byte for byte, storage, labels, retries), the ledger-campaign fixture it reads,
and Node devices sending through the real ingest: counted exactly once, with the supports of the reports they sent."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest

from ldpstream_dev.debian import ToolUnavailable, ensure_binary
from ldpstream_dev.workers import IngestProcess, WorkerProcess, unique_campaign_file, wait_for_counts
from wire.campaign import Campaign, step_at

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "clients" / "js"
E2E = Path(__file__).parent / "data" / "e2e.toml"
VECTORS = Path(__file__).parent / "data" / "randomizer-vectors.json"
DEVICES = 30


def _tools() -> tuple[str, str]:
    """node and npm: on PATH, else Debian's packages (``nodejs``, ``npm``; bookworm's Node 18 runs the client)."""
    try:
        node, npm = ensure_binary("node", "nodejs"), ensure_binary("npm", "npm")
    except ToolUnavailable as exc:
        pytest.fail(f"the JavaScript client's tests need Node.js >= 18 and npm: {exc}")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 18:
        pytest.fail(f"the JavaScript client needs Node.js >= 18, found {version}")
    return node, npm


def _run(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=JS, capture_output=True, text=True, timeout=timeout, **kw)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def node() -> str:
    """``npm ci`` in clients/js (the locked dependencies; from npm's cache when it has them); the node binary."""
    node, npm = _tools()
    _run([npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"], timeout=120)
    return node


def test_npm_test_replays_every_vector(node):
    npm = ensure_binary("npm", "npm")
    proc = _run([npm, "test", "--silent", "--", "--test-reporter=tap"], timeout=120)
    tail = proc.stdout[-600:]
    assert "# fail 0" in proc.stdout, tail
    vectors = json.loads(VECTORS.read_text())
    cases = len(vectors["protocols"]) + len(vectors["solutions"]) + len(vectors["ledger"]) \
        + len(vectors["open_domain"]["cases"])
    passed = int(next(line for line in proc.stdout.splitlines() if line.startswith("# pass")).split()[-1])
    assert passed > cases, tail  # one test per case at least, plus the others


def test_the_ledger_campaign_fixture_is_the_vectors_toml():
    fixture = json.loads((JS / "test-support" / "fixtures" / "ledger-campaign.json").read_text())
    tomls = {case["campaign"] for case in json.loads(VECTORS.read_text())["ledger"]}
    assert len(tomls) == 1 and fixture == tomllib.loads(tomls.pop())


def test_the_wire_campaign_fixture_is_the_wire_vectors_toml():
    fixture = json.loads((JS / "test-support" / "fixtures" / "wire-campaign.json").read_text())
    wire = json.loads((Path(__file__).parent / "data" / "wire-vectors.json").read_text())
    assert fixture == tomllib.loads(wire["campaign_toml"])


def test_the_numeric_ledger_campaign_fixture_is_the_vectors_toml():
    fixture = json.loads((JS / "test-support" / "fixtures" / "ledger-numeric-campaign.json").read_text())
    tomls = {case["campaign"] for case in json.loads(VECTORS.read_text())["numeric_ledger"]}
    assert len(tomls) == 1 and fixture == tomllib.loads(tomls.pop())


OPEN_CAMPAIGN = """[campaign]
id = "js-open"

[[attributes]]
name = "crash"
type = "string"
protocol = "HCMS"
eps = 4.0
m = 256
k = 16
top = 5
candidates = ["a", "b"]

[[attributes]]
name = "pid"
type = "u64"
protocol = "CMS"
eps = 2.0
m = 100
k = 4
"""

_OPEN_SCRIPT = """
import { Device, MemoryStorage, keyTape } from './src/index.js';
const [campaign, keys] = JSON.parse(process.argv[1]);
const dev = new Device(campaign, new MemoryStorage(), { keys: keyTape(keys) });
const objs = [dev.report('crash', 'NullPointerException in café ☕', 7), dev.report('crash', '', 7),
  dev.report('pid', 18446744073709551615n, 7), dev.report('pid', 12345, 7)];
console.log(JSON.stringify(objs));
"""


def test_node_open_domain_reports_are_the_references_and_decode(node):
    """A Node device reporting strings and u64 values: with the same noise keys, the report bytes of the reference
    randomizer on the ids of ``wire.campaign``'s attribute; every object decodes with the ingest's codec."""
    from estimators.randomness import SimulationWarning
    from ldpstream_dev.randomizer_vectors import KeyTape
    from wire.single_report import decode_single_report

    campaign = Campaign.from_dict(tomllib.loads(OPEN_CAMPAIGN))
    keys = [f"{i:02x}" * 32 for i in range(1, 5)]
    proc = subprocess.run([node, "--input-type=module", "-e", _OPEN_SCRIPT,
                           json.dumps([tomllib.loads(OPEN_CAMPAIGN), keys])],
                          cwd=JS, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    objs = json.loads(proc.stdout)
    values = [("crash", "NullPointerException in café ☕"), ("crash", ""), ("pid", (1 << 64) - 1), ("pid", 12345)]
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore", SimulationWarning)
        for obj, key, (attr, value) in zip(objs, keys, values):
            got = decode_single_report(obj, {campaign.id: campaign})
            a = campaign.attribute(attr)
            want = a.protocol.randomize(np.array([a.value_id(value)], dtype=np.uint64), KeyTape(replay=[key]))
            assert (got.attribute, got.t) == (attr, 7) and np.array_equal(got.reports, want), (attr, value)


def test_node_devices_are_counted_exactly_once_through_the_ingest(local_stack, tmp_path, node):
    _send_through_ingest(local_stack, tmp_path, node, E2E, "app_version", [str(v) for v in (0, 7, 42, 99, 42, 13)])


NUMERIC_E2E = """[campaign]
id = "e2e-numeric"
time_step_seconds = 3600.0
lateness_seconds = 3600.0

[[attributes]]
name = "session_seconds"
type = "numeric"
range = [0.0, 600.0]
mechanism = "PM"
eps = 1.0
"""


def test_node_devices_send_a_numeric_attribute_through_the_ingest(local_stack, tmp_path, node):
    source = tmp_path / "e2e-numeric.toml"
    source.write_text(NUMERIC_E2E)
    _send_through_ingest(local_stack, tmp_path, node, source, "session_seconds", ["12.5", "300", "599.99", "-4", "75"])


def _send_through_ingest(local_stack, tmp_path, node, source: Path, attr: str, values: list[str]) -> None:
    """DEVICES Node devices send one report of ``attr`` each (device i the value ``values[i mod len]``) through a
    real ingest and worker: every report accepted, and the counts in Redis are the supports of the sent reports."""
    path = unique_campaign_file(source, tmp_path)
    campaign = Campaign.load(path)
    campaign_json = tmp_path / "campaign.json"
    campaign_json.write_text(json.dumps(tomllib.loads(path.read_text())))  # the TOML converts 1:1
    app_id = f"js-{uuid.uuid4().hex[:6]}"
    boot, redis_url = local_stack.info.kafka_bootstrap, local_stack.info.redis_url
    proto = campaign.attribute(attr).protocol
    numeric = campaign.attribute(attr).numeric
    t = step_at(campaign)
    with WorkerProcess([path], boot, redis_url, app_id=app_id, topic_prefix=f"{app_id}.", refresh_seconds=0.2,
                       session_timeout=3.0, run_dir=tmp_path), \
            IngestProcess([path], boot, redis_url, topic_prefix=f"{app_id}.", run_dir=tmp_path) as ingest:
        cmd = [node, "examples/send.mjs", "--campaign", str(campaign_json), "--ingest", f"{ingest.url}/reports",
               "--state", str(tmp_path / "devices"), "--devices", str(DEVICES), "--t", str(t), "--attribute", attr,
               "--budget", "10"]
        cmd += [f"--value={v}" for v in values]  # --value=-4: a negative number is not an option
        proc = subprocess.run(cmd, cwd=JS, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "NODE_NO_WARNINGS": "1"})
        assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        summary = json.loads(proc.stdout)
        assert (summary["devices"], summary["sent"], summary["accepted"], summary["failed"]) == (DEVICES,) * 3 + (0,)
        support = np.zeros(proto.support_size, dtype=np.int64)
        keys = set()
        for r in summary["results"]:
            want = values[r["device"] % len(values)]
            assert r["reply"] == {"accepted": 1} and r["value"] == (float(want) if numeric else int(want))
            (obj,) = r["reports"]
            assert set(obj) == {"campaign", "attribute", "t", "payload"}
            assert (obj["campaign"], obj["attribute"], obj["t"]) == (campaign.id, attr, t)
            support += proto.support(proto.decode(base64.b64decode(obj["payload"])))
            if proto.memo_size:
                memo = tmp_path / "devices" / f"device-{r['device']}" / f"{attr}.memo.json"
                keys.add(json.loads(memo.read_text())["key"])
        assert len(keys) == (DEVICES if proto.memo_size else 0)  # every device its own 256-bit memo key
        wait_for_counts(redis_url, campaign.id, {(attr, t): (support, DEVICES)}, timeout=30)


_TREEHIST_REJECT_SCRIPT = """
import { TreeHist, MemoState, keyTape, hexToBytes, bytesToHex } from './src/index.js';
const [params, limit, memoKey, ids, keys] = JSON.parse(process.argv[1]);
const out = [];
for (const memo of [false, true]) {
  const p = new TreeHist({ ...params, seed: BigInt(params.seed) });
  p.limL = p.limR = p.limG = BigInt(limit);
  const st = memo ? new MemoState(p.fingerprint, hexToBytes(memoKey), p.memoSize) : null;
  out.push(ids.map((id, i) => bytesToHex(p.randomize(BigInt(id), { keys: keyTape([keys[i]]), state: st }))));
  if (memo) out.push(st.cells());
}
console.log(JSON.stringify(out));
"""


@pytest.mark.parametrize("eps_1", [None, 0.5])
def test_node_treehist_rejection_redraws_are_the_references(node, eps_1):
    """TreeHist's redraws (level, row and other-bucket rejections, the level's word-7 fallback, PRR words past the
    first block, the noise extension stream): with the rejection limits lowered to 2^62 in both implementations
    (three draws in four rejected), the Node client's bytes are the reference kernels'."""
    from estimators.randomness import SimulationWarning
    from estimators.sketch.treehist import TreeHist
    from ldpstream_dev.randomizer_vectors import KeyTape

    params = {"eps": 1.0, "bits": 64, "step": 5, "rows": 3, "seed": 99, "eps_1": eps_1, "memo_slots": 128}
    limit = 1 << 62
    rng = np.random.default_rng(11)
    ids = [int(x) for x in rng.integers(0, (1 << 64) - 1, size=40, dtype=np.uint64, endpoint=True)]
    keys = [bytes(rng.integers(0, 256, 32, dtype=np.uint8)).hex() for _ in ids]
    memo_key = bytes(rng.integers(0, 256, 32, dtype=np.uint8)).hex()
    proc = subprocess.run([node, "--input-type=module", "-e", _TREEHIST_REJECT_SCRIPT,
                           json.dumps([{**params, "seed": str(params["seed"])}, str(limit), memo_key, [str(i) for i in ids],
                                       keys])], cwd=JS, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fresh, memo, cells = json.loads(proc.stdout)
    ref = TreeHist(**params)
    ref._limits = tuple(np.uint64(limit) for _ in range(3))
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore", SimulationWarning)
        st = ref.new_state(1, KeyTape(replay=[memo_key]))
        want_fresh = [ref.randomize(np.array([i], dtype=np.uint64), KeyTape(replay=[k]))[0].tobytes().hex()
                      for i, k in zip(ids, keys)]
        want_memo = [ref.randomize(np.array([i], dtype=np.uint64), KeyTape(replay=[k]), state=st)[0].tobytes().hex()
                     for i, k in zip(ids, keys)]
    assert fresh == want_fresh and memo == want_memo
    assert cells == np.flatnonzero(np.unpackbits(st.seen[0], bitorder="little")[:ref.memo_slots]).tolist()
