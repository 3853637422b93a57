"""The architecture, checked from the module-level import graph (docs/architecture.md).

Imports point one way: ``producers -> wire -> estimators <- stream_app`` (both sides may use
``wire`` and ``estimators``), the dev stack (``ldpstream_dev``) and the CLI (``ldpstream_cli``, console
script ``ldp``) sit on top and no runtime package imports them, the ingest (``stream_app.ingest``) never
imports the worker, and only the count store speaks Redis. No import cycle anywhere, inside a package too.

The graph has one node per module of every package and subpackage (``pkg/sub/mod.py`` is
``pkg.sub.mod``, ``pkg/sub/__init__.py`` is ``pkg.sub``). An edge goes to the most specific project
module an import names: ``import a.b.c`` and ``from a.b import c`` (``c`` a module) to ``a.b.c``,
``from a.b import name`` to ``a.b``; relative imports are resolved. Imports inside functions count: a
cycle closed at call time is still a cycle of the design. Imports under ``if TYPE_CHECKING:`` do not:
they never run.
"""
from __future__ import annotations

import ast
import graphlib
import re
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
# subpackage -> modules (and their submodules) of its own top-level package it must never import
FORBIDDEN_INSIDE = {
    # the ingest imports the wire contract and the store, never the worker
    "stream_app.ingest": {"stream_app.app", "stream_app.windows", "stream_app.worker", "stream_app.api",
                          "stream_app.pipeline", "stream_app.recovery"},
}
COUNT_STORE = "stream_app/store/"  # the count store package: the only code that speaks Redis
DOC = ROOT / "docs" / "architecture.md"


# ---------------------------------------------------------------------------------------------- the graph
def module_name(path: Path, root: Path) -> str:
    """``pkg/sub/mod.py`` -> ``pkg.sub.mod``; ``pkg/sub/__init__.py`` -> ``pkg.sub``."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node``, at any depth, except in the body of ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            found.append(n)
        elif isinstance(n, ast.If) and _is_type_checking(n.test):
            stack.extend(n.orelse)
        else:
            stack.extend(ast.iter_child_nodes(n))
    return found


def imported_names(path: Path, module: str) -> set[str]:
    """Absolute dotted names ``path`` (module ``module``) imports: ``a.b`` for ``import a.b``, ``a.b.c`` for
    ``from a.b import c`` (``c`` a module or a name: the graph keeps its longest prefix that is a module);
    relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - (node.level - 1)])
            source = f"{base}.{node.module}" if node.module else base
        else:
            source = node.module or ""
        out.update(source if alias.name == "*" else f"{source}.{alias.name}" for alias in node.names)
    return out


def _project_module(name: str, modules: set[str]) -> str | None:
    """The most specific project module ``name`` names (``a.b.c`` -> ``a.b.c``, else ``a.b``, else ``a``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in modules:
            return candidate
    return None


def build_graph(root: Path, packages: tuple[str, ...]) -> tuple[dict[str, set[str]], dict[str, set[str]],
                                                                 dict[str, Path]]:
    """``(edges, external, files)``: module -> the project modules it imports, module -> the top-level names
    of what else it imports (``redis``, ``numpy``, ...), module -> its file."""
    files = {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))
             if "__pycache__" not in p.parts}
    modules = set(files)
    edges: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for mod, path in files.items():
        edges[mod], external[mod] = set(), set()
        for name in imported_names(path, mod):
            target = _project_module(name, modules)
            if target is None:
                if name.split(".")[0] not in packages:
                    external[mod].add(name.split(".")[0])
            elif target != mod:
                edges[mod].add(target)
    return edges, external, files


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or ``None``."""
    try:
        tuple(graphlib.TopologicalSorter(edges).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def subpackages(root: Path, packages: tuple[str, ...]) -> set[str]:
    """Every directory with an ``__init__.py`` under the top-level packages, dotted (``stream_app.ingest``)."""
    return {module_name(p, root) for pkg in packages for p in (root / pkg).rglob("__init__.py")
            if "__pycache__" not in p.parts}


def documented_packages(text: str) -> set[str]:
    """The packages of the ``| package | role | ... |`` table of docs/architecture.md (first column, in backticks)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"\|\s*package\s*\|\s*role\s*\|", line)), None)
    assert start is not None, "no `| package | role |` table"
    names: set[str] = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names.update(re.findall(r"`([\w.]+)`", line.split("|")[1]))
    return names


GRAPH, EXTERNAL, FILES = build_graph(ROOT, PACKAGES)


# ---------------------------------------------------------------------------------------------- the rules
def test_every_package_and_subpackage_is_walked():
    walked = {mod.split(".")[0] for mod in GRAPH}
    assert walked == set(PACKAGES)
    assert {"stream_app.ingest.handler", "ldpstream_cli.experiments.runner"} <= GRAPH.keys()
    assert subpackages(ROOT, PACKAGES) <= GRAPH.keys()


def test_no_import_cycle():
    assert find_cycle(GRAPH) is None, f"import cycle: {' -> '.join(find_cycle(GRAPH) or [])}"


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package):
    bad = {mod: sorted({t.split(".")[0] for t in targets} & FORBIDDEN[package])
           for mod, targets in GRAPH.items() if mod.split(".")[0] == package}
    bad = {mod: pkgs for mod, pkgs in bad.items() if pkgs}
    assert not bad, f"{package} imports what it must not: {bad}"


@pytest.mark.parametrize("subpackage", sorted(FORBIDDEN_INSIDE))
def test_subpackage_rules(subpackage):
    forbidden = FORBIDDEN_INSIDE[subpackage]
    bad = {mod: sorted(t for t in targets if any(t == f or t.startswith(f + ".") for f in forbidden))
           for mod, targets in GRAPH.items() if mod == subpackage or mod.startswith(subpackage + ".")}
    bad = {mod: ts for mod, ts in bad.items() if ts}
    assert not bad, f"{subpackage} imports what it must not: {bad}"


def test_only_the_count_store_speaks_redis():
    users = sorted(str(FILES[mod].relative_to(ROOT)) for mod, names in EXTERNAL.items() if "redis" in names)
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


def test_architecture_doc_lists_every_package():
    """The package table of docs/architecture.md names exactly the packages of the tree."""
    assert documented_packages(DOC.read_text()) == subpackages(ROOT, PACKAGES)


def test_architecture_doc_names_every_module():
    """docs/architecture.md mentions every module of every package and subpackage."""
    doc = DOC.read_text()
    missing = [str(p.relative_to(ROOT)) for p in FILES.values()
               if p.name not in ("__init__.py", "__main__.py") and f"`{p.name}`" not in doc]
    assert not missing, f"docs/architecture.md does not mention {missing}"


# ---------------------------------------------------------------------------------------------- the checker
def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_checker_finds_a_cycle_inside_a_subpackage(tmp_path):
    """A cycle closed inside a function, across a relative import of a subpackage, is reported; the same tree
    without it passes, and an import under ``if TYPE_CHECKING:`` does not count."""
    _tree(tmp_path, {
        "top/__init__.py": "",
        "top/sub/__init__.py": "from . import a\n",
        "top/sub/a.py": "from typing import TYPE_CHECKING\nfrom .b import g\nif TYPE_CHECKING:\n    from .c import C\n",
        "top/sub/b.py": "def g():\n    from ..sub.c import h\n    return h()\n",
        "top/sub/c.py": "import top.sub.a\n",
        "top/other.py": "from top.sub import b\nimport redis.asyncio\n",
    })
    edges, external, _ = build_graph(tmp_path, ("top",))
    assert edges["top.sub.a"] == {"top.sub.b"}  # not c: TYPE_CHECKING
    assert edges["top.sub.b"] == {"top.sub.c"} and edges["top.sub"] == {"top.sub.a"}
    assert edges["top.other"] == {"top.sub.b"} and external["top.other"] == {"redis"}
    cycle = find_cycle(edges)
    assert cycle is not None and set(cycle) == {"top.sub.a", "top.sub.b", "top.sub.c"}
    (tmp_path / "top/sub/c.py").write_text("import json\n")
    assert find_cycle(build_graph(tmp_path, ("top",))[0]) is None


def test_the_checker_sees_a_forbidden_import(tmp_path):
    """The one-way rules can fail: a module of ``estimators`` importing ``stream_app`` is caught."""
    _tree(tmp_path, {"estimators/__init__.py": "", "estimators/m.py": "from stream_app import store\n",
                     "stream_app/__init__.py": "", "stream_app/store.py": ""})
    edges, _, _ = build_graph(tmp_path, ("estimators", "stream_app"))
    assert edges["estimators.m"] == {"stream_app.store"}


def test_the_doc_table_is_parsed(tmp_path):
    text = "# A\n\n| package | role | imports |\n| --- | --- | --- |\n| `a` | x | `b` |\n| `a.sub` | y | |\n\nafter\n"
    assert documented_packages(text) == {"a", "a.sub"}


# the worker's modules: the HTTP ingest (stream_app/ingest/) imports the wire contract and the store, never these
WORKER_MODULES = {"app", "pipeline", "recovery", "consumer", "windows", "worker", "api", "broker", "publisher", "health",
                  "metrics"}


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
