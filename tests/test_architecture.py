"""The package's shape, checked from its source: one boundary to llama.cpp, no import cycles.

Read with ``ast`` (nothing is imported), so the checks see every import: at module
level, inside functions, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pipeline"
BOUNDARY = "pipeline.engine._llama"  # a private package: it and its modules


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in MODULES.items()}


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute names of what ``node`` (in ``module``) imports: modules, or modules' attributes."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1] if node.level else []
    source = ".".join(base + ([node.module] if node.module else []))
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source for alias in node.names]


def _imports(module: str, tree: ast.AST | None = None) -> set[str]:
    return {name for node in ast.walk(tree or TREES[module]) if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _imported(module, node)}


def _owner(name: str) -> str | None:
    """The package module ``name`` is or lies in (None: not ours)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES and name != "pipeline" else None


def test_the_checks_see_every_import():
    assert {"pipeline.api", BOUNDARY, "pipeline.engine.local", "pipeline.engine.cache.store"} <= set(MODULES)
    source = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "from . import reuse\n"
        "from ..errors import EngineError\n"
        "if TYPE_CHECKING:\n    from .contract import EngineStats\n"
        "def f():\n    import llama_cpp.llama_cpp\n    from ._llama import load\n")
    assert _imports("pipeline.engine.local", source) == {
        "typing", "pipeline.engine.reuse", "pipeline.errors", "pipeline.engine.contract", "llama_cpp.llama_cpp",
        "pipeline.engine._llama"}


def _in_boundary(module: str) -> bool:
    return module == BOUNDARY or module.startswith(BOUNDARY + ".")


def _top_level_names(module: str) -> set[str]:
    """The names ``module`` binds at its top level (definitions, assignments, imports)."""
    names: set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def test_every_name_imported_from_the_package_exists():
    """An import of a module that moved, or of a name it no longer has, fails here even where it sits in a
    function no fast test runs."""
    bad = []
    for module, tree in TREES.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.level or (node.module or "").startswith("pipeline")):
                continue
            source = _imported(module, ast.ImportFrom(module=node.module, names=[ast.alias("*")], level=node.level))[0]
            if source not in MODULES:
                bad.append(f"{module}: {source}")
                continue
            bad += [f"{module}: {source}.{a.name}" for a in node.names
                    if f"{source}.{a.name}" not in MODULES and a.name not in _top_level_names(source)]
    assert bad == []


def test_only_the_boundary_imports_llama_cpp():
    importers = {m for m in MODULES if any(n == "llama_cpp" or n.startswith("llama_cpp.") for n in _imports(m))}
    assert importers and all(_in_boundary(m) for m in importers), sorted(importers)
    assert {"pipeline.engine._llama.loading", "pipeline.engine._llama.model"} <= importers


def _llama_cpp_private_names() -> set[str]:
    """Private attribute names of llama-cpp-python's classes (``Llama``, ``LlamaModel``, ``LlamaContext``...)
    and modules, read from its source."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.submodule_search_locations, "llama-cpp-python is not installed"
    names = set()
    for path in Path(next(iter(spec.submodule_search_locations))).glob("*.py"):
        if path.stem.startswith("_"):
            names.add(path.stem)  # llama_cpp._internals
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and node.attr.startswith("_"):
                names.add(node.attr)  # self._ctx = ...
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.name.startswith("_"):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name) and t.id.startswith("_"))
    return {n for n in names if not n.startswith("__")}


#: llama-cpp-python's internals that no name of ours may shadow: always flagged outside the boundary.
CORE_PRIVATES = {"_ctx", "_model", "_batch", "_lib", "_internals"}


def _own_names(tree: ast.AST) -> set[str]:
    """Attribute and method names a module defines itself (``self._x = ...``, ``def _x``)."""
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    return names | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_module_outside_the_boundary_reaches_llama_cpp_privates():
    """Read as names: an attribute access ``x._name`` where ``_name`` is private to llama-cpp-python,
    unless the module defines ``_name`` itself (its own objects' attribute)."""
    private = _llama_cpp_private_names()
    assert CORE_PRIVATES <= private
    hits = []
    for module, tree in TREES.items():
        if _in_boundary(module) or module.startswith("pipeline.dev."):
            continue
        flagged = CORE_PRIVATES | (private - _own_names(tree))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in flagged:
                hits.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{node.lineno}: .{node.attr}")
    assert hits == [], "private attributes of llama-cpp-python objects used outside the boundary:\n" + "\n".join(hits)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_among_the_package_modules():
    """Every import counts (module level, in functions, under TYPE_CHECKING): a cycle through any of
    them means two modules that cannot be understood one without the other."""
    edges = {m: {o for n in _imports(m) if (o := _owner(n)) and o != m} for m in MODULES}
    assert _cycles(edges) == []


@pytest.mark.parametrize("layer, forbidden", [
    ("pipeline.engine.", ("pipeline.planner", "pipeline.api", "pipeline.cli", "pipeline.ingest", "pipeline.store",
                          "pipeline.retrieval", "pipeline.ask", "pipeline.profiles")),
    ("pipeline.store.", ("pipeline.engine", "pipeline.planner", "pipeline.api", "pipeline.cli", "pipeline.retrieval")),
    ("pipeline.ingest.", ("pipeline.planner", "pipeline.api", "pipeline.cli")),
])
def test_layers_import_only_downwards(layer, forbidden):
    """The engine and the store are the bottom layers; ingest uses them (docs/design.md, Layout)."""
    bad = sorted(f"{m} -> {o}" for m in MODULES if m.startswith(layer)
                 for n in _imports(m) if (o := _owner(n)) and o.startswith(forbidden))
    assert bad == []


def test_only_api_cli_and_profiles_use_the_planner():
    users = {"pipeline.api", "pipeline.cli", "pipeline.profiles"}
    bad = sorted(f"{m} -> {o}" for m in MODULES
                 if m not in users and not m.startswith(("pipeline.planner.", "pipeline.dev.", "pipeline.cli."))
                 for n in _imports(m) if (o := _owner(n)) and o.startswith("pipeline.planner"))
    assert bad == []


def test_answering_does_not_import_the_tuner():
    """The API reads tuned profiles through pipeline.profiles, which needs no planner module at all."""
    seen, todo = set(), ["pipeline.profiles"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [o for n in _imports(m) if (o := _owner(n))]
    assert not any(m.startswith("pipeline.planner") for m in seen), seen
    api = MODULES["pipeline.api"].read_text(encoding="utf-8")
    engine_settings = api[api.index("def engine_settings"):api.index("def plan(")]
    assert "planner" not in engine_settings and "profiles" in engine_settings
