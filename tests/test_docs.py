"""The documentation holds: README.md stays short, and every relative link in it and in docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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
