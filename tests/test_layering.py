"""The architecture, checked from the import graph (docs/architecture.md).

Imports point one way: ``producers -> wire -> estimators <- stream_app`` (both sides may use
``wire`` and ``estimators``), the dev stack (``ldpstream_dev``) and the CLI (``ldpstream_cli``, console script ``ldp``) sit on top and
no runtime package imports them, and only the count store speaks Redis.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("estimators", "wire", "producers", "stream_app", "ldpstream_dev", "ldpstream_cli")

# package -> the project packages it must never import
FORBIDDEN = {
    "estimators": {"wire", "producers", "stream_app", "ldpstream_dev", "ldpstream_cli"},
    "wire": {"producers", "stream_app", "ldpstream_dev", "ldpstream_cli"},
    "producers": {"stream_app", "ldpstream_dev", "ldpstream_cli"},
    "stream_app": {"producers", "ldpstream_dev", "ldpstream_cli"},
    "ldpstream_dev": {"ldpstream_cli"},
    "ldpstream_cli": set(),
}
COUNT_STORE = "stream_app/store.py"


def _imports(path: Path, package: str) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports resolve to ``package``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.add(package if node.level else (node.module or "").split(".")[0])
    return out


def _graph() -> dict[str, dict[str, set[str]]]:
    graph: dict[str, dict[str, set[str]]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            graph.setdefault(pkg, {})[str(path.relative_to(ROOT))] = _imports(path, pkg)
    return graph


def test_every_package_exists():
    assert set(_graph()) == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
    bad = {f: sorted(mods & FORBIDDEN[package]) for f, mods in _graph()[package].items() if mods & FORBIDDEN[package]}
    assert not bad, f"{package} imports what it must not: {bad}"


def test_only_the_count_store_speaks_redis():
    users = sorted(f for files in _graph().values() for f, mods in files.items() if "redis" in mods)
    assert users == [COUNT_STORE]


def test_the_checker_sees_violations(tmp_path):
    """The check itself can fail: a module importing upward is caught."""
    bad = tmp_path / "m.py"
    bad.write_text("from stream_app import store\nimport redis.asyncio\nfrom . import x\n")
    assert _imports(bad, "estimators") == {"stream_app", "redis", "estimators"}


def test_architecture_doc_names_every_module():
    """docs/architecture.md lists every module of every room (it must match the tree)."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [f"{pkg}/{p.name}" for pkg in PACKAGES for p in sorted((ROOT / pkg).glob("*.py"))
               if p.name not in ("__init__.py", "__main__.py") and f"`{p.name}`" not in doc]
    assert not missing, f"docs/architecture.md does not mention {missing}"


# the worker's modules: the HTTP ingest (stream_app/ingest/) imports the wire contract and the store, never these
WORKER_MODULES = {"app", "pipeline", "recovery", "consumer", "windows", "worker", "api", "broker", "health", "metrics"}


def _stream_app_modules(path: Path, package: str) -> set[str]:
    """The ``stream_app`` submodules (first name below ``stream_app``) that ``path``, a module of ``package``
    (dotted, e.g. ``stream_app.ingest``), imports, absolute or relative."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                full = ".".join(base + ([node.module] if node.module else []))
                names = [full] if node.module else [f"{full}.{alias.name}" for alias in node.names]
            else:
                names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "stream_app" and len(parts) > 1:
                out.add(parts[1])
    return out


def test_the_ingest_never_imports_the_worker():
    """The ingest is a door of its own: stream_app/ingest/ imports the wire contract and the store, not the
    worker's modules (app, pipeline, recovery, windows, worker, api, ...)."""
    bad = {}
    for path in sorted((ROOT / "stream_app" / "ingest").rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        found = _stream_app_modules(path, package) & WORKER_MODULES
        if found:
            bad[str(path.relative_to(ROOT))] = sorted(found)
    assert not bad, f"the ingest imports the worker: {bad}"


def test_the_ingest_check_sees_violations(tmp_path):
    """The check itself can fail: relative and absolute imports of worker modules are caught, the store is not."""
    bad = tmp_path / "m.py"
    bad.write_text("from ..pipeline import Pipeline\nfrom .. import windows\nimport stream_app.app\n"
                   "from ..store import CountStore\nfrom .handler import ReportHandler\n")
    assert _stream_app_modules(bad, "stream_app.ingest") == {"pipeline", "windows", "app", "store", "ingest"}
