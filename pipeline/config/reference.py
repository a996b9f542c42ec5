"""The settings reference: every setting with its type, default, variable and meaning, from the code.

Each field of a settings dataclass carries an attribute docstring (a string literal on the
line after it); Python keeps no trace of those at run time, so they are read from the
class's own source with :mod:`ast` (:func:`field_docs`), wherever the class is defined.
``rag config --reference`` prints :func:`reference_markdown`; ``make docs`` writes it to
``docs/settings.md``, and a test keeps that file equal to it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from . import ENV_PREFIX, Config, toml_value
from .ranges import RANGES


@dataclass(frozen=True)
class Setting:
    """One setting: its dotted key, type name, default, environment variable and one-line meaning."""

    key: str
    type: str
    default: Any
    variable: str
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """The attribute docstrings of ``cls``'s fields (and of its dataclass bases'), by field name."""
    return dict(_field_docs(cls))


@lru_cache(maxsize=None)  # inspect.getsource parses the class's whole module each time
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    docs: dict[str, str] = {}
    for klass in reversed([c for c in cls.__mro__ if dataclasses.is_dataclass(c)]):
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == klass.__name__).body
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return tuple(docs.items())


def tables(config: type = Config) -> list[tuple[str, type]]:
    """The ``[table]`` names of the settings (the TOML tables of a settings file) and their dataclasses, in
    declaration order."""
    defaults = config()
    return [(f.name, type(getattr(defaults, f.name))) for f in dataclasses.fields(config)
            if dataclasses.is_dataclass(getattr(defaults, f.name))]


def settings(config: type = Config) -> list[Setting]:
    """Every setting, top-level keys first, then each section's in declaration order."""
    defaults = config()
    out = []
    top_docs = field_docs(config)
    section_names = {name for name, _ in tables(config)}
    for f in dataclasses.fields(config):
        if f.name not in section_names:
            out.append(Setting(f.name, _type_name(f), getattr(defaults, f.name), "", top_docs.get(f.name, "")))
    for name, cls in tables(config):
        docs = field_docs(cls)
        values = getattr(defaults, name)
        for f in dataclasses.fields(cls):
            out.append(Setting(f"{name}.{f.name}", _type_name(f), getattr(values, f.name),
                               f"{ENV_PREFIX}{name}_{f.name}".upper(), docs.get(f.name, "")))
    return out


def undocumented(config: type = Config) -> list[str]:
    """The fields of the settings dataclasses (sections included) that have no docstring."""
    missing = [f"{f.name}" for f in dataclasses.fields(config) if not field_docs(config).get(f.name)]
    for name, cls in tables(config):
        docs = field_docs(cls)
        missing += [f"{name}.{f.name}" for f in dataclasses.fields(cls) if not docs.get(f.name)]
    return missing


def reference_markdown(config: type = Config) -> str:
    """``docs/settings.md``: an introduction, then one table per section."""
    lines = [
        "# Settings reference",
        "",
        "<!-- Generated from the settings dataclasses by `rag config --reference` (`make docs`); do not edit. -->",
        "",
        "Settings are layered: these defaults, then a TOML file (`--config FILE` or `RAG_CONFIG`), then",
        "`RAG_SECTION_KEY` environment variables, then command options. A TOML file sets a key in its",
        "section (`[engine]` `n_ctx = 16384`); `rag config` prints the effective settings as TOML that",
        "`--config` reads back. Unknown sections and keys are errors; numbers must be finite and within",
        "their range (an error names the setting and the value it got). See [the guide](guide.md#configuration).",
        "",
    ]
    every = settings(config)
    top = [s for s in every if "." not in s.key]
    if top:
        lines += ["## Top level", "", *_table(top, variables={"home": "`RAG_HOME` when empty"}), ""]
    for name, cls in tables(config):
        lines += [f"## [{name}]", ""]
        for paragraph in _paragraphs(cls.__doc__ or "") or [field_docs(config).get(name, "")]:
            lines += [_markdown(paragraph), ""]
        lines += [*_table([s for s in every if s.key.startswith(name + ".")]), ""]
    return "\n".join(lines).rstrip() + "\n"


def _table(rows: list[Setting], *, variables: dict[str, str] | None = None) -> list[str]:
    out = ["| setting | type | default | range | variable | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for s in rows:
        variable = (variables or {}).get(s.key) or (f"`{s.variable}`" if s.variable else "")
        limits = RANGES.get(s.key)
        out.append(f"| `{s.key}` | {s.type} | {_cell(_code(toml_value(s.default)))} | "
                   f"{_cell(limits.describe()) if limits else ''} | {variable} | {_cell(_markdown(s.doc))} |")
    return out


def _type_name(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else f.type.__name__


def _paragraphs(doc: str) -> list[str]:
    return [p for p in inspect.cleandoc(doc).split("\n\n") if p.strip()]


def _markdown(text: str) -> str:
    """reStructuredText's ``code`` and :role:`target` as Markdown's `code`, on one line."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return " ".join(text.replace("``", "`").split())


def _code(text: str) -> str:
    return f"``{text}``" if "`" in text else f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


__all__ = ["Setting", "field_docs", "reference_markdown", "settings", "tables", "undocumented"]
