"""Contextual chunks: title and heading path are embedded and BM25-indexed, never shown."""

from __future__ import annotations

import sqlite3

import pytest

from pipeline.ingest.chunking import Chunker
from pipeline.ingest.headings import HeadingTrail, context_header, find_headings
from pipeline.ingest.loaders import TextUnit


def test_markdown_headings_give_a_path_and_code_fences_are_skipped():
    text = "# Guide\n\nintro\n\n## Setup\n\n```\n# not a heading\n```\n\n### Linux\n\nsteps\n\nOther\n-----\n\nmore\n"
    heads = [(h.level, h.title) for h in find_headings(text, "markdown")]
    assert heads == [(1, "Guide"), (2, "Setup"), (3, "Linux"), (2, "Other")]
    trail = HeadingTrail("markdown")
    trail.start_unit(text)
    assert trail.path_at(text.index("steps")) == ("Guide", "Setup", "Linux")
    assert trail.path_at(text.index("more")) == ("Guide", "Other")


def test_detected_headings_in_plain_text_and_pdf_pages():
    page1 = "1. What this guide covers\nSome text here.\n2. Anatomy of a layer\nblk.N.attn_q.weight projections\n"
    page2 = ("3. Planning the memory budget\n18.1 GB holds the experts of 40 layers (40 x 0.45 = 18.0 GB)\n"
             "2 x 12 x 4 x 256 tokens\n3.1 Headroom\nkeep a gigabyte free.\n")
    trail = HeadingTrail("pdf")
    trail.start_unit(page1)
    assert trail.path_at(len(page1) - 1) == ("2. Anatomy of a layer",)
    trail.start_unit(page2)
    assert trail.path_at(0) == ("3. Planning the memory budget",)  # a new top-level section
    assert trail.path_at(page2.index("keep")) == ("3. Planning the memory budget", "3.1 Headroom")
    assert [h.title for h in find_headings(page2, "pdf")] == ["3. Planning the memory budget", "3.1 Headroom"]
    text = "NOTES ON CACHES\n===============\n\nThe three clients\n\nEvery interaction starts here.\n\nx = 1\n\nEnd.\n"
    assert [h.title for h in find_headings(text, "text")] == ["NOTES ON CACHES", "The three clients"]


def test_header_holds_the_title_once():
    assert context_header("Guide", ("Guide", "Setup")) == "Guide > Setup"
    assert context_header("manual.pdf", ()) == "manual.pdf"
    assert context_header(None, ("A", "B")) == "A > B"
    assert len(context_header("T", ("x" * 300,))) <= 202


def test_chunks_carry_the_header_beside_their_text():
    words = lambda s: s.split()  # noqa: E731 - a whitespace tokenizer is enough here
    text = "# Manual\n\n## Zanzibar procedure\n\n" + " ".join(f"step{i}" for i in range(60))
    plain = Chunker(words, size=20, overlap=0, max_tokens=100).split([TextUnit(text, None)], fmt="markdown")
    ctx = Chunker(words, size=20, overlap=0, max_tokens=100, contextual=True).split(
        [TextUnit(text, None)], fmt="markdown", title="Manual")
    assert [c.text for c in ctx] == [c.text for c in plain]  # the shown text is unchanged
    assert all(c.context == "" for c in plain)
    assert ctx[-1].context == "Manual > Zanzibar procedure" and "Zanzibar" not in ctx[-1].text
    assert ctx[-1].indexed_text == "Manual > Zanzibar procedure\n\n" + ctx[-1].text
    assert ctx[-1].tokens == plain[-1].tokens  # passages cost what their text costs


def body(n: int) -> str:
    return " ".join(f"The operator records reading number {i} in the log book." for i in range(n))


def test_headers_are_indexed_but_never_shown(make_pipeline, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ops.md").write_text("# Plant operations\n\n## Zanzibar procedure\n\n" + body(60) + "\n")
    rag = make_pipeline(chunking__size=64, chunking__overlap=0, retrieval__top_k=3)
    rag.ingest([docs])
    with rag.store() as store:
        source = str((docs / "ops.md").resolve())
        chunks = store.catalog.chunks(store.name, source)
        row = store.catalog.db.execute("SELECT context FROM chunks WHERE chunk_id = ?",
                                       (chunks[-1].chunk_id,)).fetchone()
        vector = store.vectors([chunks[-1].chunk_id])[chunks[-1].chunk_id]
    last = chunks[-1]
    assert row[0] == "Plant operations > Zanzibar procedure"
    assert "Zanzibar" not in last.text and len(chunks) > 2
    # dense: the stored vector is the embedding of header + text, not of the text alone
    header_text, alone = rag.embedder.embed([f"{row[0]}\n\n{last.text}", last.text])
    assert float(vector @ header_text) == pytest.approx(1.0, abs=1e-3)
    assert float(vector @ alone) < 0.999
    # lexical: a word only in the heading finds the chunks under it, and the hit shows only the text
    lexical = make_pipeline(retrieval__dense=False, retrieval__top_k=10)
    hits = lexical.search("Zanzibar")
    assert last.chunk_id in {h.chunk_id for h in hits}
    assert all("Plant operations >" not in h.text for h in hits)
    # the passages of a prompt never show it either
    from pipeline.retrieval.search import expand

    with rag.store() as store:
        passages = expand(hits, store=store, neighbours=1)
    assert passages and all("Plant operations > Zanzibar" not in p.text for p in passages)


def test_without_contextual_chunks_the_heading_word_finds_only_its_own_chunk(make_pipeline, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "ops.md").write_text("# Plant operations\n\n## Zanzibar procedure\n\n" + body(60) + "\n")
    rag = make_pipeline(chunking__size=64, chunking__overlap=0, chunking__contextual=False,
                        retrieval__dense=False, retrieval__top_k=10)
    rag.ingest([docs])
    hits = rag.search("Zanzibar")
    assert len(hits) == 1 and "Zanzibar" in hits[0].text


def test_a_version_1_catalog_gains_the_context_column_and_keeps_its_index(tmp_path):
    from pipeline.store.catalog_sqlite import SQLiteCatalog
    from pipeline.store.schema import SCHEMA_VERSION

    path = tmp_path / "catalog.sqlite"
    db = sqlite3.connect(path)
    from test_schema import V1_SCHEMA

    db.executescript(V1_SCHEMA + """
        INSERT INTO meta VALUES ('schema', '1');
        INSERT INTO chunks VALUES (1, 'c1', 'default', '/d/a.md', 'h', 0, NULL, 0, 10, 3, 'old potassium text');
    """)
    db.close()
    catalog = SQLiteCatalog(path)
    try:
        assert [c.chunk_id for c, _ in catalog.search("default", "potassium", limit=5)] == ["c1"]
        assert catalog.db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (str(SCHEMA_VERSION),)
        catalog.db.execute("DELETE FROM chunks WHERE chunk_id = 'c1'")  # the delete trigger still matches
        assert catalog.search("default", "potassium", limit=5) == []
        assert catalog.db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('integrity-check')") is not None
    finally:
        catalog.close()
    SQLiteCatalog(path).close()  # opening again migrates nothing


def test_contextual_setting_is_typed(make_pipeline):
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError):
        make_pipeline(chunking__contextual="maybe")
