"""Dense search from the catalog's vectors: a small collection is ranked exactly without starting Chroma,
with the results Chroma's index gives; older stores, large searches and PostgreSQL catalogs stay right."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from support.servers import chroma_url, pg_cluster, pg_url  # noqa: F401  (fixtures)

from pipeline.engine.embed_prompts import embed_query
from pipeline.store import exact
from pipeline.store.store import Store

QUERIES = ("ERR_SOCKET_ZX81 server unreachable", "bananas potassium", "expert tensors in CPU memory",
           "flash attention memory traffic", "tomato plants sun")


def _dense(rag, query: str, *, limit: int = 8, source=None) -> list[tuple[str, float]]:
    vector = embed_query(rag.embedder, [query])[0]
    with rag.store(create=False) as store:
        return [(c.chunk_id, s) for c, s in store.dense(vector, limit=limit, source=source)]


def _same(a: list[tuple[str, float]], b: list[tuple[str, float]]) -> bool:
    """The same chunks in the same order, with the same similarities (to float32's precision)."""
    return [c for c, _ in a] == [c for c, _ in b] and [s for _, s in a] == pytest.approx([s for _, s in b], abs=1e-5)


class _ChromaCalls:
    """Counts the store's trips to Chroma's collection."""

    def __init__(self, monkeypatch):
        self.n = 0
        real = Store._col

        def counted(store):
            self.n += 1
            return real(store)

        monkeypatch.setattr(Store, "_col", counted)


def test_a_small_collection_is_ranked_from_the_catalog_as_chroma_ranks_it(fake_pipeline, corpus, monkeypatch):
    rag = fake_pipeline()
    rag.ingest([corpus])
    calls = _ChromaCalls(monkeypatch)
    from_catalog = {q: _dense(rag, q) for q in QUERIES}
    one_doc = _dense(rag, QUERIES[1], source=str(corpus / "manual.pdf"))
    assert calls.n == 0  # Chroma was not asked
    assert all(from_catalog.values()) and {c for c, _ in one_doc} <= {c for c, _ in _dense(rag, QUERIES[1], limit=99)}
    monkeypatch.setattr(exact, "EXACT_LIMIT", 0)  # every search above the limit: Chroma's index answers
    from_chroma = {q: _dense(rag, q) for q in QUERIES}
    assert calls.n == len(QUERIES)
    assert all(_same(from_catalog[q], from_chroma[q]) for q in QUERIES)
    assert _same(_dense(rag, QUERIES[1], source=str(corpus / "manual.pdf")), one_doc)


def test_mmr_and_reranking_read_the_catalogs_vectors(fake_pipeline, corpus, monkeypatch):
    rag = fake_pipeline(retrieval__rerank="scores")
    rag.ingest([corpus])
    with rag.store(create=False) as store:
        ids = [c.chunk_id for c in store.catalog.chunks(store.name, str(corpus / "guide.md"))]
        calls = _ChromaCalls(monkeypatch)
        kept = store.vectors(ids)
        assert calls.n == 0 and set(kept) == set(ids)
        monkeypatch.setattr(store.catalog, "vectors", lambda *a, **k: [])  # as if none were kept
        from_chroma = store.vectors(ids)
    assert calls.n == 1
    for cid in ids:
        assert kept[cid] == pytest.approx(from_chroma[cid], abs=1e-6)


def test_a_question_over_a_small_collection_never_imports_chromadb(fake_pipeline, corpus, tmp_path):
    fake_pipeline().ingest([corpus])
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from support.fakes import EchoGenerator, HashEmbedder\n"
        "from pipeline import Pipeline\n"
        "with Pipeline.from_config(embedder=HashEmbedder(), generator=EchoGenerator()) as rag:\n"
        "    hits = rag.search('bananas potassium')\n"
        "    answer = rag.ask('Which fruit is rich in potassium?')\n"
        "print(hits[0].source, bool(answer.sources), 'chromadb' in sys.modules)\n")
    tests = Path(__file__).resolve().parents[1]  # the helpers' package, support/
    out = subprocess.run([sys.executable, "-c", script, str(tests)], env=dict(os.environ),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    source, sources, imported = out.stdout.split()
    assert source == str(corpus / "manual.pdf") and sources == "True" and imported == "False"


def test_a_store_from_before_vectors_in_the_catalog_uses_chroma_until_ingest_copies_them(
        fake_pipeline, corpus, tmp_store, monkeypatch):
    rag = fake_pipeline()
    rag.ingest([corpus])
    expected = {q: _dense(rag, q) for q in QUERIES}
    db = sqlite3.connect(tmp_store / "catalog.sqlite")
    with db:
        db.execute("UPDATE chunks SET vector = NULL")  # what a catalog migrated from version 4 holds
    db.close()
    calls = _ChromaCalls(monkeypatch)
    assert {q: [c for c, _ in _dense(rag, q)] for q in QUERIES} == {q: [c for c, _ in v] for q, v in expected.items()}
    assert calls.n == len(QUERIES)
    report = rag.ingest([corpus])  # nothing changed: the vectors are copied from Chroma
    assert report.count("unchanged") == 4
    with rag.store(create=False) as store:
        assert store.catalog.missing_vectors(store.name, limit=10) == []
        assert store.catalog.vector_coverage(store.name) == (store.catalog.totals(store.name)[1], True)
    calls.n = 0
    assert all(_same(_dense(rag, q), expected[q]) for q in QUERIES) and calls.n == 0


def test_a_search_over_more_chunks_than_the_limit_goes_to_chroma(fake_pipeline, corpus, monkeypatch):
    rag = fake_pipeline()
    rag.ingest([corpus])
    with rag.store(create=False) as store:
        total = store.catalog.totals(store.name)[1]
        one = store.catalog.vector_coverage(store.name, str(corpus / "notes.txt"))[0]
    assert 0 < one < total
    monkeypatch.setattr(exact, "EXACT_LIMIT", one)
    calls = _ChromaCalls(monkeypatch)
    assert _dense(rag, QUERIES[0], source=str(corpus / "notes.txt")) and calls.n == 0  # within the limit
    assert _dense(rag, QUERIES[0]) and calls.n == 1  # the whole collection: above it


@pytest.mark.slow
def test_a_postgres_catalog_keeps_the_vectors_and_ranks_as_chroma_does(fake_pipeline, corpus, pg_url, monkeypatch):
    rag = fake_pipeline(store__catalog_url=pg_url)
    rag.ingest([corpus])
    with rag.store(create=False) as store:
        assert store.catalog.vector_coverage(store.name) == (store.catalog.totals(store.name)[1], True)
    calls = _ChromaCalls(monkeypatch)
    from_catalog = {q: _dense(rag, q) for q in QUERIES}
    assert calls.n == 0
    monkeypatch.setattr(exact, "EXACT_LIMIT", 0)
    from_chroma = {q: _dense(rag, q) for q in QUERIES}
    assert all(_same(from_catalog[q], from_chroma[q]) for q in QUERIES)
    monkeypatch.setattr(exact, "EXACT_LIMIT", 4096)
    with rag.store(create=False) as store:  # an older catalog's chunks: copied over by the next ingest
        store.catalog._run("UPDATE chunks SET vector = NULL WHERE source = %s", (str(corpus / "notes.txt"),))
        assert not store.catalog.vector_coverage(store.name)[1]
    rag.ingest([corpus])
    with rag.store(create=False) as store:
        assert store.catalog.vector_coverage(store.name)[1]
    assert all(_same(_dense(rag, q), from_chroma[q]) for q in QUERIES)


@pytest.mark.slow
def test_with_a_chroma_server_the_catalog_ranks_as_the_server_does(fake_pipeline, corpus, chroma_url, monkeypatch):
    rag = fake_pipeline(store__url=chroma_url)
    rag.ingest([corpus])
    calls = _ChromaCalls(monkeypatch)
    from_catalog = {q: _dense(rag, q) for q in QUERIES}
    assert calls.n == 0
    monkeypatch.setattr(exact, "EXACT_LIMIT", 0)
    from_server = {q: _dense(rag, q) for q in QUERIES}
    assert calls.n == len(QUERIES) and all(_same(from_catalog[q], from_server[q]) for q in QUERIES)
    with rag.store(create=False) as store:  # vectors copied back from the server by the next ingest
        store.catalog.db.execute("UPDATE chunks SET vector = NULL")
        store.catalog.db.commit()
    rag.ingest([corpus])
    with rag.store(create=False) as store:
        assert store.catalog.vector_coverage(store.name)[1]
    monkeypatch.setattr(exact, "EXACT_LIMIT", 4096)
    assert all(_same(_dense(rag, q), from_server[q]) for q in QUERIES)


def test_ranking_ties_and_widths(tmp_path):
    """Equal similarities come in chunk-id order (as the Chroma path sorts them); a vector of another width
    than the stored ones is left to the Chroma path, which says what is wrong."""
    import numpy as np

    from pipeline.records import Chunk, DocumentRecord

    with Store(tmp_path / "s", "ties") as store:
        store.ensure_collection(embedder="e", embedder_id="id", dim=4, chunk_size=16, chunk_overlap=0)
        same = np.tile(np.array([[1.0, 0.0, 0.0, 0.0]], dtype=np.float32), (3, 1))
        store.write_document(DocumentRecord("/a.txt", "a" * 64, 1, 1, "text"),
                             [Chunk(f"c{i}", i, None, 0, 2, 1) for i in range(3)], same)
        found = exact.nearest(store.catalog, "ties", np.array([2.0, 0.0, 0.0, 0.0]), limit=2)
        ids = sorted(c.chunk_id for c in store.catalog.chunks("ties", "/a.txt"))
        assert [c.chunk_id for c, _ in found] == ids[:2] and [s for _, s in found] == pytest.approx([1.0, 1.0])
        assert exact.nearest(store.catalog, "ties", np.ones(3), limit=2) is None
        assert json.dumps(exact.nearest(store.catalog, "ties", np.ones(4), limit=0)) == "[]"
