"""The package's modules import each other without cycles.

Module-level imports count, those under ``if TYPE_CHECKING:`` too (a cycle for the type
checker is a cycle in the design); lazy imports inside functions, how heavy parts load on
first use, do not."""

from __future__ import annotations

import ast
from pathlib import Path

import pipeline

ROOT = Path(pipeline.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path, name: str) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    nodes = list(tree.body)
    for node in nodes:  # module level, and inside module-level `if` / `try` blocks
        if isinstance(node, (ast.If, ast.Try)):
            nodes += node.body + getattr(node, "orelse", []) + [h for x in getattr(node, "handlers", []) for h in x.body]
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    mods = {_module_name(p): p for p in ROOT.rglob("*.py")}
    # a package's __init__ runs before any of its modules anyway: an edge to an enclosing package is no dependency
    return {name: {m for m in _top_level_imports(path, name) if m in mods and m != name and
                   not name.startswith(m + ".")} for name, path in mods.items()}


def test_no_import_cycles() -> None:
    g = graph()
    assert "pipeline.planner.plan" in g and "pipeline.planner.result" in g["pipeline.planner.plan"]
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m)


def test_answering_does_not_import_the_tuner() -> None:
    """The API reads tuned profiles through pipeline.profiles, which needs no planner module at all."""
    g = graph()
    seen, todo = set(), ["pipeline.profiles"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += g[m]
    assert not any(m.startswith("pipeline.planner.tune") for m in seen), seen
    api = (ROOT / "api.py").read_text(encoding="utf-8")
    engine_settings = api[api.index("def engine_settings"):api.index("def plan(")]
    assert "planner" not in engine_settings and "profiles" in engine_settings
