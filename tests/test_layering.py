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
COUNT_STORE = "stream_app/store/"  # the count store package: the only code that speaks Redis


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
    assert users and all(f.startswith(COUNT_STORE) for f in users), users


def _key_literals(path: Path) -> list[str]:
    """String constants of ``path`` that look like a Redis key of the project (``ldp:``; topics are ``ldp.``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("ldp:") and id(node) not in docstrings]


def test_only_the_count_store_builds_redis_keys():
    """No module outside the count store holds a Redis key literal (``"ldp:..."``, f-strings included)."""
    bad = {str(p.relative_to(ROOT)): _key_literals(p) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
           if not str(p.relative_to(ROOT)).startswith(COUNT_STORE) and _key_literals(p)}
    assert not bad, f"Redis keys built outside {COUNT_STORE}: {bad}"
    assert _key_literals(ROOT / COUNT_STORE / "keys.py"), "the checker finds the store's own key formats"


def test_the_key_checker_sees_violations(tmp_path):
    """A key built outside the store is caught, an f-string one too; topic names and docstrings are not keys."""
    bad = tmp_path / "m.py"
    bad.write_text('"""ldp:{c}:x in a docstring"""\nTOPIC = "ldp.reports"\nKEY = "ldp:positions:app"\n'
                   'def f(c):\n    return f"ldp:{{{c}}}:epoch"\n')
    assert _key_literals(bad) == ["ldp:positions:app", "ldp:{"]


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
