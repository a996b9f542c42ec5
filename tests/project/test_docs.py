"""The documentation holds: README.md stays short, and every relative link in it and in docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def prose(text: str) -> str:
    """``text`` without its fenced code blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"^#{1,6} (.+)$", line)
        if m:
            base = anchor(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page.read_text()))]


def test_readme_is_short_and_maps_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = {target.split("#")[0] for target in links(ROOT / "README.md")}
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in linked, f"README.md does not link docs/{page.name}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken links: {broken}"


def test_anchor_rules():
    assert anchor("Generation and embeddings on llama.cpp servers") == "generation-and-embeddings-on-llamacpp-servers"
    assert anchor("JSON outputs (schema 1)") == "json-outputs-schema-1"
    assert anchor("Answers: rag eval --answers") == "answers-rag-eval---answers"
    assert anchor("Whole or map-reduce, on ask's prefix") == "whole-or-map-reduce-on-asks-prefix"
    assert anchor("`rag summarize`: batch summaries") == "rag-summarize-batch-summaries"


# -- the settings reference (docs/settings.md), generated from the settings dataclasses --

def test_every_setting_has_a_one_line_docstring():
    from pipeline.config.reference import settings, undocumented

    assert undocumented() == [], f"settings without an attribute docstring: {undocumented()}"
    long = [s.key for s in settings() if "\n" in s.doc]
    assert not long, f"settings whose docstring is more than one line: {long}"


def test_the_committed_settings_reference_is_the_generated_one():
    from pipeline.config.reference import reference_markdown

    committed = (ROOT / "docs" / "settings.md").read_text()
    assert committed == reference_markdown(), "docs/settings.md is stale: run `make docs` and commit it"


def test_the_reference_lists_every_setting_with_its_variable_and_default():
    from pipeline.config import Config, env_names, toml_value
    from pipeline.config.reference import reference_markdown, settings

    text = reference_markdown()
    listed = {s.key: s for s in settings()}
    assert {v: k for k, v in env_names().items()}.keys() <= listed.keys()
    for variable, key in env_names().items():
        assert listed[key].variable == variable
        assert f"| `{key}` |" in text and f"`{variable}`" in text
    section, name = "engine", "n_ctx"
    assert listed[f"{section}.{name}"].default == getattr(getattr(Config(), section), name)
    assert (f"| `engine.n_ctx` | int | `{toml_value(Config().engine.n_ctx)}` | between 0 and 16,777,216 tokens "
            "(0 = the trained context) | `RAG_ENGINE_N_CTX` |") in text


def test_rag_config_reference_prints_it():
    from click.testing import CliRunner

    from pipeline.cli import cli
    from pipeline.config.reference import reference_markdown

    result = CliRunner().invoke(cli, ["config", "--reference"], env={"RAG_ENGINE_N_CTX": "1024"})
    assert result.exit_code == 0, result.output
    assert result.output == reference_markdown()  # defaults, not the effective values


def test_field_docs_read_any_dataclass_wherever_it_is_defined():
    """The reader depends on no module layout: a class in another module, and its bases, are read too."""
    from dataclasses import dataclass

    from pipeline.config.reference import field_docs

    @dataclass
    class Base:
        a: int = 1
        """The first."""

    @dataclass
    class Section(Base):
        b: str = "x"
        """The second,
        on two lines."""
        c: float = 0.5  # a comment is not a docstring

    assert field_docs(Section) == {"a": "The first.", "b": "The second,\non two lines."}


# -- every `rag ...` command line shown in README.md and docs/ parses --

SHELL_OPERATORS = {"&&", "||", "|", ";", "&"}
ENV_PREFIX = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def command_lines(text: str) -> list[tuple[int, list[str]]]:
    """The ``rag`` invocations in ``text`` (line number, arguments after ``rag``): from shell code
    blocks, one per line (comments dropped, continuations joined, ``&&``/``|``/``&`` split), and
    from inline code spans that start with ``rag``."""
    import shlex

    found: list[tuple[int, list[str]]] = []

    def add(lineno: int, line: str) -> None:
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            return
        part: list[str] = []
        for token in [*tokens, ";"]:
            if token not in SHELL_OPERATORS:
                part.append(token)
                continue
            while part and ENV_PREFIX.match(part[0]):
                part.pop(0)
            if part and part[0] in ("rag", ".venv/bin/rag"):
                found.append((lineno, part[1:]))
            part = []

    lines = text.splitlines()
    in_shell = in_fence = False
    pending, start = "", 0
    for i, line in enumerate(lines, start=1):
        fence = re.match(r"^\s*(```|~~~)(\w*)", line)
        if fence:
            in_fence = not in_fence
            in_shell = in_fence and fence.group(2) in ("bash", "sh", "shell", "console")
            continue
        if in_fence:
            if in_shell:
                if not pending:
                    start = i
                pending += line.rstrip("\\") + " " if line.endswith("\\") else line
                if not line.endswith("\\"):
                    add(start, pending)
                    pending = ""
            continue
        for span in re.findall(r"`([^`\n]+)`", line):
            if re.match(r"^(\.venv/bin/)?rag( |$)", span) or ENV_PREFIX.match(span):
                add(i, span)
    return found


def test_command_lines_are_found_in_blocks_and_spans():
    text = ("Run `rag ask --doc FILE` or `RAG_X=1 rag status`, not `rag-ish`.\n```bash\n"
            "rag ingest a &  # comment\nrag ingest b && rag eval q.jsonl \\\n  --answers\nchroma run\n```\n"
            "```text\nrag is not run here\n```\n")
    assert command_lines(text) == [(1, ["ask", "--doc", "FILE"]), (1, ["status"]), (3, ["ingest", "a"]),
                                   (4, ["ingest", "b"]), (4, ["eval", "q.jsonl", "--answers"])]


def _parses(args: list[str]) -> str:
    """'' when ``rag ARGS`` names a command and options it has (checked by click's own parser, with
    --help appended so that nothing runs), else click's complaint."""
    from pipeline.cli import cli

    cut = args.index("--") if "--" in args else len(args)
    result = CliRunner().invoke(cli, [*args[:cut], "--help", *args[cut:]])
    if result.exit_code != 0 and cut == len(args) and args and args[-1].startswith("-"):
        # prose names an option without its value (`rag ask --doc`): give it one
        retry = CliRunner().invoke(cli, [*args, "VALUE", "--help"])
        if retry.exit_code == 0:
            return ""
    return "" if result.exit_code == 0 else (result.output.strip().splitlines() or [repr(result.exception)])[-1]


def test_every_rag_command_line_in_the_docs_parses():
    bad = []
    seen = 0
    for page in PAGES:
        for lineno, args in command_lines(page.read_text()):
            seen += 1
            complaint = _parses(args)
            if complaint:
                bad.append(f"{page.relative_to(ROOT)}:{lineno}: rag {' '.join(args)}: {complaint}")
    assert seen > 50
    assert not bad, "command lines in the docs that rag does not accept:\n" + "\n".join(bad)


def test_a_wrong_option_is_caught():
    assert _parses(["ask", "q", "--max-tokens", "64"]) == ""
    assert _parses(["search", "--", "--n-cpu-moe"]) == ""
    assert "No such option" in _parses(["ask", "q", "--max-token", "64"])
    assert "No such command" in _parses(["asks", "q"])
    assert _parses(["ask", "--doc"]) == ""  # an option named in prose, without its value
    assert _parses(["status", "--doc"]) != ""


def test_every_repository_path_named_in_the_docs_exists():
    """A module, test or benchmark named in the docs (`pipeline/ask/flow.py`) is where they say."""
    named = re.compile(r"(?<![\w/.~$-])((?:pipeline|devtools|tests|benchmarks|configs|samples)/[\w./-]*[\w/])")
    missing = []
    for page in PAGES:
        for lineno, line in enumerate(page.read_text().splitlines(), start=1):
            for path in named.findall(line):
                if "*" not in path and not (ROOT / path).exists():
                    missing.append(f"{page.relative_to(ROOT)}:{lineno}: {path}")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_the_layout_names_every_module():
    """docs/design.md's layout table is the tree: every module of the package and of the development tools
    has its row, or is named in its folder's row."""
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    rows = {line.split("`")[1]: line for line in design.splitlines() if line.startswith(("| `pipeline", "| `devtools"))}
    missing = []
    for path in sorted([*(ROOT / "pipeline").rglob("*.py"), *(ROOT / "devtools").rglob("*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py") or rel in rows:
            continue
        folder = rows.get(path.parent.relative_to(ROOT).as_posix() + "/", "")
        if not re.search(rf"\b{re.escape(path.stem)}\b", folder):
            missing.append(rel)
    assert missing == []
