"""The package's shape, checked from its source: one boundary to llama.cpp, no import cycles.

Read with ``ast`` (nothing is imported), so the checks see every import: at module
level, inside functions, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"
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
    assert {"pipeline.api", BOUNDARY, "pipeline.engine.local", "pipeline.engine.cache.prefix_cache"} <= set(MODULES)
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
        if _in_boundary(module):
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


#: Above everything: the façade, the command line and the server, which nothing of the library imports.
TOP = ("pipeline.api", "pipeline.cli", "pipeline.serve")
#: The operations over a runtime (the product's parts); the runtime and the layers below never import them.
OPERATIONS = ("pipeline.ask", "pipeline.retrieval", "pipeline.summarize", "pipeline.collection", "pipeline.warm")
#: The leaf modules of the ask path that the runtime builds its caches from (layouts, section tokens and
#: those saved on disk, the pack history, the stops, the numbering of citations): they import nothing above the store and the engine.
ASK_LEAVES = ("pipeline.ask.prompt", "pipeline.ask.history", "pipeline.ask.stops", "pipeline.ask.citations",
              "pipeline.ask.saved_tokens")


def _layer_rules():
    below_runtime = (*TOP, *OPERATIONS, "pipeline.runtime", "pipeline.tuning")
    return [
        ("pipeline.records", ("pipeline.",)),  # the shared records import nothing of the package
        ("pipeline.engine.", (*below_runtime, "pipeline.ingest", "pipeline.store", "pipeline.config.tuned")),
        ("pipeline.store.", (*below_runtime, "pipeline.engine", "pipeline.ingest")),
        ("pipeline.ingest.", below_runtime),
        ("pipeline.runtime", (*TOP, *OPERATIONS, "pipeline.tuning")),  # but the ask path's leaves
        *((leaf, (*TOP, *OPERATIONS, "pipeline.runtime")) for leaf in ASK_LEAVES),
        ("pipeline.retrieval.", (*TOP, "pipeline.ask", "pipeline.summarize", "pipeline.collection",
                                 "pipeline.tuning", "pipeline.warm")),
        ("pipeline.ask.", (*TOP, "pipeline.summarize", "pipeline.collection", "pipeline.tuning", "pipeline.warm")),
        ("pipeline.warm.", (*TOP, "pipeline.summarize", "pipeline.collection", "pipeline.tuning")),
        ("pipeline.summarize.", (*TOP, "pipeline.tuning", "pipeline.warm")),
        ("pipeline.collection", (*TOP, "pipeline.ask", "pipeline.retrieval", "pipeline.summarize", "pipeline.tuning",
                                 "pipeline.warm")),
    ]


def _violations(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    def matches(module: str) -> bool:
        return module == layer or (layer.endswith(".") and module.startswith(layer))

    def denied(target: str) -> bool:
        return any(target == f.rstrip(".") or target.startswith(f if f.endswith(".") else f + ".")
                   for f in forbidden) and not matches(target)

    return sorted(f"{m} -> {o}" for m in MODULES if matches(m)
                  for n in _imports(m) if (o := _owner(n)) and denied(o) and not _allowed_runtime_edge(m, o))


def _allowed_runtime_edge(module: str, target: str) -> bool:
    """The runtime builds the ask path's caches from its leaf modules (which may use each other), and
    nothing else of the ask path."""
    return module in ("pipeline.runtime", *ASK_LEAVES) and target in ASK_LEAVES


@pytest.mark.parametrize("layer, forbidden", _layer_rules(), ids=lambda v: v if isinstance(v, str) else "")
def test_layers_import_only_downwards(layer, forbidden):
    """Questions flow one way: ask -> retrieval -> runtime -> store / engine (docs/design.md, Layout);
    ingest uses the store and the engine; summaries use the ask path's packing; nothing imports the
    façade, the command line or the server."""
    assert _violations(layer, forbidden) == []


def test_the_layer_check_sees_a_wrong_way_import():
    module = "pipeline.retrieval.search"
    saved = TREES[module]
    TREES[module] = ast.parse("from ..ask.flow import build_prompt\nfrom ..runtime import Runtime\n")
    try:
        rules = dict(_layer_rules())
        assert _violations("pipeline.retrieval.", rules["pipeline.retrieval."]) == [
            "pipeline.retrieval.search -> pipeline.ask.flow"]
    finally:
        TREES[module] = saved
    saved = TREES["pipeline.runtime"]
    TREES["pipeline.runtime"] = ast.parse("from .ask.prompt import Layout\nfrom .ask.flow import Built\n")
    try:
        assert _violations("pipeline.runtime", dict(_layer_rules())["pipeline.runtime"]) == [
            "pipeline.runtime -> pipeline.ask.flow"]
    finally:
        TREES["pipeline.runtime"] = saved


def _private_names_imported(module: str, tree: ast.AST | None = None) -> list[str]:
    """``from X import _name`` and ``x._name`` (``x`` a module of the package) in ``module``: another
    module's private names. Private *modules* (``_llama``, ``_sqlite``) are the package's own and may
    be imported by the modules of the package that holds them."""
    tree = tree or TREES[module]
    bad, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias, name in zip(node.names, _imported(module, node)):
                if name.endswith("." + alias.name):  # a module: its own name may be private, if it is ours to use
                    aliases[alias.asname or alias.name] = name
                    if alias.name.startswith("_") and not _may_use_private_module(module, name):
                        bad.append(f"{module}: {name}")
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    bad.append(f"{module}: {name}.{alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            bad.append(f"{module}: {aliases[node.value.id]}.{node.attr}")
    return bad


def _may_use_private_module(module: str, private: str) -> bool:
    """A private module is its package's: usable by the modules in that package (and its subpackages)."""
    package = private.rsplit(".", 1)[0]
    return module.startswith(package + ".") or module == package


#: Private modules still reached from outside their package, and why (remove an entry once it is not).
PRIVATE_MODULE_USES_PENDING: dict[tuple[str, str], str] = {}


def test_no_module_imports_another_modules_private_names():
    bad = [b for m in MODULES for b in _private_names_imported(m)]
    pending = {f"{m}: {p}" for m, p in PRIVATE_MODULE_USES_PENDING}
    assert sorted(set(bad) - pending) == []


def test_the_private_name_check_sees_each_form():
    source = ast.parse("from .config import _apply\nfrom . import models\nmodels._identity('x')\n"
                       "from .engine import _llama\nfrom ._sqlite import connect\n")
    assert _private_names_imported("pipeline.runtime", source) == [
        "pipeline.runtime: pipeline.config._apply", "pipeline.runtime: pipeline.engine._llama",
        "pipeline.runtime: pipeline.models._identity"]


#: The development tools' package, beside ``pipeline/`` in the checkout and not installed with it.
DEV_TOOLS = "devtools"
#: What a module of the package may load from the development tools, and why. Each use loads them from
#: the source checkout the package runs from, and refuses with a clear message where there is none.
DEV_TOOL_USES: dict[tuple[str, str], str] = {
    ("pipeline.cli.tuning", "devtools.bench"): "`rag bench` runs the checkout's benchmarks with their runner",
}


def _dev_tool_imports(module: str, tree: ast.AST | None = None) -> list[str]:
    """What ``module`` imports from the development tools: import statements anywhere in it, and
    ``importlib.import_module("devtools...")`` / ``__import__("devtools...")`` with a literal name."""
    names = set()
    for node in ast.walk(tree or TREES[module]):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) in ("import_module", "__import__")):
            names.add(node.args[0].value)
    return sorted(f"{module} -> {n}" for n in names if n.split(".")[0] == DEV_TOOLS)


def test_the_package_does_not_import_the_development_tools():
    """``pip install`` installs ``pipeline/`` alone: an import of the development tools fails there."""
    allowed = {f"{m} -> {t}" for m, t in DEV_TOOL_USES}
    bad = [b for m in MODULES for b in _dev_tool_imports(m)]
    assert sorted(set(bad) - allowed) == []
    assert allowed <= set(bad), "an allowed use that is gone: remove it from DEV_TOOL_USES"


def test_the_development_tool_check_sees_each_form():
    source = ast.parse("import devtools.servers\nfrom devtools.synthetic import write_model\nimport devtoolsx\n"
                       "def f():\n    from devtools import bench\n    importlib.import_module('devtools.gpu_kit')\n")
    assert _dev_tool_imports("pipeline.runtime", source) == [
        "pipeline.runtime -> devtools.bench", "pipeline.runtime -> devtools.gpu_kit",
        "pipeline.runtime -> devtools.servers", "pipeline.runtime -> devtools.synthetic.write_model"]


def _installed_packages(include: list[str]) -> list[str]:
    """The packages setuptools puts in the wheel for ``[tool.setuptools.packages.find] include`` (found as
    ``pip install`` finds them: namespace packages too)."""
    from setuptools import find_namespace_packages

    return sorted(find_namespace_packages(where=str(PACKAGE.parent), include=include))


def _not_the_product(packages: list[str]) -> list[str]:
    return [p for p in packages if p != "pipeline" and not p.startswith("pipeline.")]


def test_the_wheel_carries_only_the_product():
    """What ``pip install`` installs is the ``pipeline`` package, every part of it, and nothing beside it."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    packages = _installed_packages(config["tool"]["setuptools"]["packages"]["find"]["include"])
    assert _not_the_product(packages) == []
    assert {m for m, path in MODULES.items() if path.name == "__init__.py"} <= set(packages)
    assert not any(p == DEV_TOOLS or p.startswith(DEV_TOOLS + ".") for p in packages)


def test_the_wheel_check_sees_a_development_tool_included():
    assert _not_the_product(_installed_packages(["pipeline*", "devtools*"])) == ["devtools", "devtools.synthetic"]


def test_only_api_cli_and_profiles_use_tuning():
    users = {"pipeline.api", "pipeline.cli", "pipeline.config.tuned"}
    bad = sorted(f"{m} -> {o}" for m in MODULES
                 if m not in users and not m.startswith(("pipeline.tuning.", "pipeline.cli."))
                 for n in _imports(m) if (o := _owner(n)) and o.startswith("pipeline.tuning"))
    assert bad == []


def test_answering_does_not_import_the_tuner():
    """The runtime reads tuned profiles through pipeline.config.tuned, which needs no tuning module at all."""
    seen, todo = set(), ["pipeline.config.tuned"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += [o for n in _imports(m) if (o := _owner(n))]
    assert not any(m.startswith("pipeline.tuning") for m in seen), seen
    runtime = MODULES["pipeline.runtime"].read_text(encoding="utf-8")
    engine_settings = runtime[runtime.index("def engine_settings"):runtime.index("def pool(")]
    assert "tuning" not in engine_settings and "config.tuned" in engine_settings


#: Modules whose split by concept is still under way, exempt from the size rules until it lands.
SIZE_PENDING: tuple[str, ...] = ()
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
DESIGN = PACKAGE.parent / "docs" / "design.md"


def _pending(module: str) -> bool:
    return module.startswith(SIZE_PENDING)


def test_no_module_is_longer_than_500_lines():
    """A module past a few hundred lines probably holds two concepts."""
    long = {m: n for m, path in MODULES.items() if not _pending(m)
            and (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _long_functions(module: str, tree: ast.AST | None = None) -> dict[str, int]:
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}"
                if not isinstance(child, ast.ClassDef) and child.end_lineno - child.lineno + 1 > MAX_FUNCTION_LINES:
                    out[name] = child.end_lineno - child.lineno + 1
                visit(child, name)

    visit(tree or TREES[module], module)
    return out


def _named_in_the_design() -> set[str]:
    """The functions docs/design.md names (``pipeline.x.f``) in its section on functions over 80 lines."""
    text = DESIGN.read_text(encoding="utf-8")
    start = text.find("Functions over 80 lines")
    section = text[start:text.find("\n## ", start + 1)] if start >= 0 else ""
    return set(re.findall(r"`(pipeline(?:\.\w+)+)`", section))


def test_no_function_is_longer_than_80_lines_unless_the_design_says_why():
    long = {f: n for m in MODULES if not _pending(m) for f, n in _long_functions(m).items()}
    assert sorted(set(long) - _named_in_the_design()) == []


def test_the_length_check_sees_a_long_method():
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    tree = ast.parse(f"class A:\n    def f(self):\n{body}\n\ndef g():\n    pass\n")
    assert _long_functions("pipeline.x", tree) == {"pipeline.x.A.f": MAX_FUNCTION_LINES + 1}


def test_no_top_level_module_shadows_the_standard_library():
    """``python pipeline/_build.py`` puts ``pipeline/`` first on sys.path: a ``pipeline/types.py``
    there would replace the standard library's ``types`` and break set-up before anything runs."""
    import subprocess
    import sys

    top = sorted(p.stem for p in PACKAGE.glob("*.py")) + sorted(p.name for p in PACKAGE.iterdir() if p.is_dir())
    clashes = [name for name in top if name in sys.stdlib_module_names]
    assert clashes == []
    # And the build script itself starts (its --help exits before building anything).
    run = subprocess.run([sys.executable, str(PACKAGE / "_build.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


#: The most modules directly under ``pipeline/`` (besides ``__init__`` and ``__main__``): past it, the
#: top level stops telling a reader which part of the product a module belongs to.
MAX_TOP_LEVEL_MODULES = 12


def test_the_package_top_level_stays_small():
    """A new concept goes into the folder of the part it belongs to (``ask/``, ``engine/``, ...), not beside them."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if not p.stem.startswith("__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {', '.join(top)}"


#: File names that several modules share, and what the name means in each: one concept, at the layer or
#: in the part of the product each sits in. Any other repeated file name under ``pipeline/`` is refused:
#: name the new module for what it holds.
SHARED_MODULE_NAMES: dict[str, str] = {
    "sections.py": "document sections: cut (ingest), the catalog's table (store), their states on disk "
                   "(engine/cache), composed from those states (engine/reuse), warmed ahead (warm)",
    "memory.py": "an engine's KV memory: its sequence operations in llama.cpp (engine/_llama) and what it "
                 "holds for reuse (engine/reuse)",
    "loading.py": "loading a generator: llama.cpp's load (engine/_llama) and the one from the settings above "
                  "it (engine)",
    "collection.py": "a collection: its operations (pipeline/) and their commands (cli/)",
    "settings.py": "the settings: one dataclass per table of the settings file (config/) and the commands that "
                   "show them and provision the models they name (cli/: `rag config`, `rag models`)",
    "job.py": "a part's work in the background, resumable or cancellable: a summarisation job (summarize), the "
              "warming after an ingest (warm)",
    "run.py": "one run of a part over a set of documents: an ingest (ingest), a summarisation (summarize)",
    "progress.py": "how far a part's work is, in tokens, for callbacks and the CLI: an answer's prefill (ask), "
                   "warming (warm)",
}
#: Shared file names that still mean different things, and why each is not renamed yet (remove an entry
#: once it is).
SHARED_MODULE_NAMES_PENDING: dict[str, str] = {}


def _shared_names(paths) -> dict[str, list[str]]:
    """File names held by more than one module among ``paths`` (package ``__init__``/``__main__`` aside)."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE.parent)))
    return {name: sorted(where) for name, where in sorted(by_name.items()) if len(where) > 1}


def _unexplained_shared_names(paths) -> dict[str, list[str]]:
    return {name: where for name, where in _shared_names(paths).items()
            if name not in SHARED_MODULE_NAMES and name not in SHARED_MODULE_NAMES_PENDING}


def test_modules_that_share_a_name_mean_the_same_thing():
    """A reader who has met ``sections.py`` once knows what every ``sections.py`` holds."""
    assert _unexplained_shared_names(MODULES.values()) == {}
    listed = {**SHARED_MODULE_NAMES, **SHARED_MODULE_NAMES_PENDING}
    assert sorted(set(listed) - set(_shared_names(MODULES.values()))) == []  # no stale entries
    assert not set(SHARED_MODULE_NAMES) & set(SHARED_MODULE_NAMES_PENDING)


def test_the_name_check_sees_a_second_module_of_a_name():
    planted = [*MODULES.values(), PACKAGE / "config" / "sections.py", PACKAGE / "tuning" / "plan.py"]
    assert _unexplained_shared_names(planted) == {
        "plan.py": ["pipeline/engine/reuse/plan.py", "pipeline/tuning/plan.py"]}  # sections.py: listed
    assert "pipeline/config/sections.py" in _shared_names(planted)["sections.py"]


#: The packages in their order, lowest first: each may import those before it (and a package and its
#: own subpackages may use each other). An import of a package later in the order runs back up and is
#: refused, unless it is in ALLOWED_UPWARD with its reason. Packages on one line have no order between them.
PACKAGE_ORDER: tuple[tuple[str, ...], ...] = (
    ("pipeline.records", "pipeline.errors", "pipeline.inputs", "pipeline.disk", "pipeline.schemas",
     "pipeline._sqlite", "pipeline._testhooks", "pipeline._build"),
    ("pipeline.config",),
    ("pipeline.models",),
    ("pipeline.engine.gguf",),
    ("pipeline.engine._llama",),
    ("pipeline.engine.cache",),
    ("pipeline.engine.reuse",),
    ("pipeline.engine.remote",),
    ("pipeline.engine",),
    ("pipeline.store",),
    ("pipeline.ingest",),
    ("pipeline.tuning",),
    ("pipeline.runtime",),
    ("pipeline.retrieval",),
    ("pipeline.ask",),
    ("pipeline.collection",),
    ("pipeline.warm",),
    ("pipeline.summarize",),
    ("pipeline.api",),
    ("pipeline.serve",),
    ("pipeline.cli",),
    ("pipeline",),
)
#: Imports from a package to one above it that stay, and why (package -> package).
ALLOWED_UPWARD: dict[tuple[str, str], str] = {
    ("pipeline.runtime", "pipeline.ask"): "the runtime builds the ask path's caches from its leaf modules "
                                          "(ASK_LEAVES), which import nothing above the store and the engine",
    ("pipeline.models", "pipeline.engine.remote"): "is_server, the one local-or-remote switch, reads the "
                                                   "`openai:` prefix the remote client owns",
    ("pipeline.models", "pipeline.engine.gguf"): "provisioning a BERT embedder converts it to GGUF once, "
                                                 "with the engine's converter",
    ("pipeline.config", "pipeline.engine.gguf"): "EngineConfig checks KV cache types against the one table of "
                                                 "the ggml types llama.cpp takes",
    ("pipeline.config", "pipeline.models"): "a tuned profile is found by its model file's identity",
    ("pipeline.config", "pipeline.store"): "the [store] settings check collection names and store URLs by the "
                                           "store's own rules, so a bad one fails when the settings load",
}


def _package_of(module: str) -> str | None:
    """The most specific package of PACKAGE_ORDER that ``module`` is or lies in."""
    placed = [p for tier in PACKAGE_ORDER for p in tier if module == p or module.startswith(p + ".")]
    return max(placed, key=len) if placed else None


def _rank(package: str) -> int:
    return next(i for i, tier in enumerate(PACKAGE_ORDER) if package in tier)


def _upward_imports(allowed: dict[tuple[str, str], str] = ALLOWED_UPWARD) -> list[str]:
    """``module -> imported`` for every import that runs back up between packages and is not allowed."""
    bad = set()
    for module in MODULES:
        for name in _imports(module):
            if not (target := _owner(name)):
                continue
            a, b = _package_of(module), _package_of(target)
            related = a == b or a.startswith(b + ".") or b.startswith(a + ".")
            if not related and _rank(b) > _rank(a) and (a, b) not in allowed:
                bad.add(f"{module} -> {target}")
    return sorted(bad)


def test_every_module_has_a_place_in_the_package_order():
    assert [m for m in MODULES if _package_of(m) is None] == []


def test_no_import_runs_back_up_between_packages_unless_allowed():
    """The order of PACKAGE_ORDER is the tree's: a package reads only what sits below it."""
    assert _upward_imports() == []
    used = {(_package_of(m), _package_of(t)) for m in MODULES for n in _imports(m) if (t := _owner(n))}
    assert sorted(set(ALLOWED_UPWARD) - used) == []  # every allowance still needed


def test_the_upward_check_sees_a_back_up_import():
    module = "pipeline.engine.cache.calibrations"
    saved = TREES[module]
    TREES[module] = ast.parse("from ..reuse.budget import ComposePolicy\nfrom ..._sqlite import connect\n")
    try:
        assert _upward_imports() == ["pipeline.engine.cache.calibrations -> pipeline.engine.reuse.budget"]
    finally:
        TREES[module] = saved
    assert "pipeline.runtime -> pipeline.ask.prompt" in _upward_imports(allowed={})  # an allowance at work
