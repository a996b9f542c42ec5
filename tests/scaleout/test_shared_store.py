"""The store on servers: vectors in a real Chroma server (``store.url``), the catalog in a real
PostgreSQL (``store.catalog_url``), both started by the tests on 127.0.0.1 (see ``support/servers.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from support.servers import chroma_url, pg_cluster, pg_url  # noqa: F401  (fixtures)

from pipeline.errors import StoreBusyError, StoreError
from pipeline.retrieval.search import retrieve
from pipeline.store.store import Store
from pipeline.store.terms import MAX_QUERY_TERMS
from pipeline.records import Chunk, DocumentRecord

# Real servers (chroma run, a PostgreSQL cluster) and real processes: not the fakes-only fast subset.
pytestmark = pytest.mark.slow


def _chunks(n: int, word: str = "chunk") -> list[Chunk]:
    return [Chunk(f"{word} number {i}", i, None, 0, 7, 2) for i in range(n)]


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32)


def _die(conn, pg_url) -> None:
    """Close ``conn`` as a dying process would and wait until the server has ended its session."""
    import time

    import psycopg

    pid = conn.info.backend_pid
    conn.close()
    with psycopg.connect(pg_url, autocommit=True) as watcher:
        deadline = time.monotonic() + 10
        while watcher.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the server kept a closed session"
            time.sleep(0.05)


def _snapshot(rag) -> dict:
    """What a user sees of a collection: documents with their chunk texts, and a few searches."""
    with rag.store(create=False) as store:
        docs = {s: (d.content_hash, d.n_chunks) for s, d in store.documents().items()}
        chunks = {s: [c.text for c in store.catalog.chunks(store.name, s)] for s in docs}
        dense = store.chunk_count()
    hits = {q: [h.source for h in rag.search(q)] for q in ("ERR_SOCKET_ZX81", "bananas potassium",
                                                            "expert tensors in CPU memory")}
    return {"docs": docs, "chunks": chunks, "dense": dense, "hits": hits}


# -- Chroma server ---------------------------------------------------------------------------

def test_vectors_live_in_the_chroma_server(fake_pipeline, corpus, chroma_url, tmp_store):
    import chromadb

    rag = fake_pipeline(store__url=chroma_url)
    report = rag.ingest([corpus])
    assert report.count("new") == 4
    assert not (tmp_store / "chroma").exists()  # nothing embedded: the vectors went to the server
    server = chromadb.HttpClient(host="127.0.0.1", port=int(chroma_url.rsplit(":", 1)[1]))
    assert server.get_collection("default").count() == report.chunks
    hits = rag.search("ERR_SOCKET_ZX81")
    assert hits and hits[0].source.endswith("notes.txt")
    with rag.store(create=False) as store:  # the dense side alone, through the server
        found = retrieve(rag.runtime, store, "Chroma server HttpClient", top_k=3, lexical=False)
    assert found and all(h.source.startswith(str(corpus)) for h in found)


def test_writes_stay_within_the_servers_batch_limit(tmp_path, chroma_url, monkeypatch):
    import chromadb

    server = chromadb.HttpClient(host="127.0.0.1", port=int(chroma_url.rsplit(":", 1)[1]))
    with Store(tmp_path / "s", "big", url=chroma_url) as store:
        assert store._batch_size() == server.get_max_batch_size()
        store.ensure_collection(embedder="e", embedder_id="id", dim=8, chunk_size=16, chunk_overlap=0)
        col = store._col()
        sizes = []
        real = col.upsert
        monkeypatch.setattr(col, "upsert", lambda **kw: (sizes.append(len(kw["ids"])), real(**kw))[1])
        store._max_batch = 7  # as if the server reported 7: a 30-chunk document goes in 5 calls
        store.write_document(DocumentRecord("/big.txt", "f" * 64, 1, 1, "text"), _chunks(30), _vectors(30))
        assert sizes == [7, 7, 7, 7, 2]
        assert store.chunk_count() == 30 and store.catalog.totals("big")[1] == 30


def test_an_unreachable_chroma_server_is_a_clear_error(fake_pipeline, corpus, monkeypatch):
    from support.servers import free_port

    monkeypatch.setenv("RAG_STORE_TOKEN", "s3cret-token")
    rag = fake_pipeline(store__url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(StoreError) as err:
        rag.ingest([corpus])
    assert "cannot reach the Chroma server" in str(err.value) and "chroma run" in str(err.value)
    assert "s3cret-token" not in str(err.value)


def test_bad_store_urls_are_config_errors():
    from pipeline.config import load_config
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="http://host:port"):
        load_config(overrides={"store.url": "localhost:8000"})
    with pytest.raises(ConfigError, match="PostgreSQL URL") as err:
        load_config(overrides={"store.catalog_url": "mysql://u:hunter2@db/x"})
    assert "hunter2" not in str(err.value)


# -- PostgreSQL catalog ----------------------------------------------------------------------

def test_postgres_catalog_behaves_like_sqlite(fake_pipeline, corpus, pg_url, tmp_path, monkeypatch):
    """The same corpus ingested with the embedded catalog and with PostgreSQL: the same documents,
    chunks, sections and search results (PostgreSQL ranks the lexical side with ts_rank)."""
    embedded = _snapshot_after_ingest(fake_pipeline, corpus)
    monkeypatch.setenv("RAG_STORE_PATH", str(tmp_path / "store-pg"))
    rag = fake_pipeline(store__catalog_url=pg_url)
    rag.ingest([corpus])
    assert _snapshot(rag) == embedded
    assert not (tmp_path / "store-pg" / "catalog.sqlite").exists()
    with rag.store(create=False) as store:
        hits = store.lexical("bananas", limit=5)
        assert [h.source for h, _ in hits] == [str(corpus / "manual.pdf")] and hits[0][1] > 0
        assert store.lexical("!!!", limit=5) == []  # no word: no query, no syntax error
        assert store.lexical("it's a \"quote\" | & ! :*", limit=5) is not None
        docs = store.documents()
        sections = store.catalog.sections(store.name, [(s, d.content_hash) for s, d in docs.items()])
        assert set(sections) == set(docs)
    # Sections cut again at another size (`rag sections --recut`) in PostgreSQL as in SQLite.
    recut = fake_pipeline(store__catalog_url=pg_url, chunking__section_tokens=96).recut_sections()
    assert recut.recut == recut.documents == 4 and set(recut.by_target) == {96} and recut.stale == 0
    assert rag.sections().stale == 4  # against rag's own settings, they are another size now
    status = rag.status()
    assert status.exists and status.documents == 4 and status.dense_chunks == status.chunks
    # A re-run changes nothing; a changed file replaces its chunks; --prune removes.
    assert rag.ingest([corpus]).count("unchanged") == 4
    (corpus / "notes.txt").write_text("Completely new words about zeppelins.\n")
    assert rag.ingest([corpus]).count("changed") == 1
    assert [h.source for h in rag.search("zeppelins")][:1] == [str(corpus / "notes.txt")]
    with rag.store(create=False) as store:
        assert store.lexical("ERR_SOCKET_ZX81", limit=5) == []  # the old version's chunks are gone
        assert store.chunk_count() == store.catalog.totals(store.name)[1]
    (corpus / "page.html").unlink()
    assert rag.ingest([corpus], prune=True).count("removed") == 1
    assert rag.drop() and not rag.status().exists


def test_postgres_lexical_ranking_splits_at_punctuation_and_weights_rare_words_as_sqlite_does(
        fake_pipeline, pg_url, tmp_path, monkeypatch):
    """PostgreSQL's parser keeps `audio/midi` and `bug-libtasn1@gnu.org` as one lexeme, and ts_rank has no
    idf: both cost the held-out set questions until the index split at punctuation and terms were
    weighted. The rare word's chunk now ranks first, as with SQLite's BM25."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "mime.txt").write_text("The type audio/midi has the alias audio/x-midi in this database.\n")
    (docs / "bugs.txt").write_text("Report bugs to bug-libtasn1@gnu.org with a short test case.\n")
    for i in range(6):  # chatter full of the question's common words
        (docs / f"chatter{i}.txt").write_text("What does it have? What does it have, and what does it do? " * 4 + "\n")
    question, bugs = "What alias does audio/midi have?", "Where should bugs in libtasn1 be reported?"
    embedded = fake_pipeline()
    embedded.ingest([docs])
    monkeypatch.setenv("RAG_STORE_PATH", str(tmp_path / "store-pg"))
    shared = fake_pipeline(store__catalog_url=pg_url)
    shared.ingest([docs])
    for rag in (embedded, shared):
        with rag.store(create=False) as store:
            hits = store.lexical(question, limit=3)
            assert hits[0][0].source == str(docs / "mime.txt"), [h.source for h, _ in hits]
            assert store.lexical(bugs, limit=1)[0][0].source == str(docs / "bugs.txt")
            assert store.lexical("midi", limit=5)[0][0].source == str(docs / "mime.txt")
            assert store.lexical("x-midi libtasn1", limit=5) and store.lexical("gnu.org", limit=5)
            scores = store.catalog.bm25(store.name, question, [h.chunk_id for h, _ in hits])
            assert len(scores) == len(hits)
            # A pasted book is searched by its first MAX_QUERY_TERMS distinct words, in both catalogs:
            # bounded work for any query (a term costs a posting-list scan, and a subquery in PostgreSQL).
            filler = " ".join(f"zq{i}" for i in range(20_000))
            assert store.lexical("midi " + filler, limit=1)[0][0].source == str(docs / "mime.txt")
            assert store.lexical(filler + " libtasn1", limit=1) == []  # past the bound: not searched
            assert store.lexical(" ".join(f"zq{i}" for i in range(MAX_QUERY_TERMS - 1)) + " libtasn1", limit=1)


def _snapshot_after_ingest(fake_pipeline, corpus) -> dict:
    rag = fake_pipeline()
    rag.ingest([corpus])
    return _snapshot(rag)


def test_postgres_schema_version_and_migrations(pg_url):
    import psycopg

    from pipeline.store import pg_schema
    from pipeline.store.catalog_pg import PostgresCatalog

    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert pg_schema.upgrade(conn, where="test", target=1) is None  # a version-1 catalog, as rag wrote it
        conn.execute("INSERT INTO collections VALUES ('kept', 'e', 'id', 8, 16, 0, 0)")
        conn.execute("INSERT INTO documents (collection, source, content_hash, n_chunks) VALUES ('kept', '/m', 'h', 1)")
        conn.execute("INSERT INTO chunks (collection, chunk_id, source, content_hash, idx, text)"
                     " VALUES ('kept', 'c1', '/m', 'h', 0, 'the type audio/midi')")
    catalog = PostgresCatalog(pg_url)  # migrates 1 -> current in one transaction
    try:
        assert catalog.migrated_from == 1
        assert catalog.collections() == ["kept"]
        # schema 3 regenerated the index of the rows already there: words split at punctuation
        assert [c.chunk_id for c, _ in catalog.search("kept", "midi", limit=5)] == ["c1"]
        assert catalog._rows("SELECT value FROM meta WHERE key = 'schema'") == [(str(pg_schema.SCHEMA_VERSION),)]
        assert catalog._rows("SELECT to_regclass('units') IS NOT NULL") == [(True,)]
    finally:
        catalog.close()
    again = PostgresCatalog(pg_url)
    assert again.migrated_from == pg_schema.SCHEMA_VERSION
    again._run("UPDATE meta SET value = '99' WHERE key = 'schema'")
    again.close()
    with pytest.raises(StoreError, match="newer version of rag"):
        PostgresCatalog(pg_url)


def test_an_unreachable_postgres_is_a_clear_error(fake_pipeline, corpus):
    from support.servers import free_port

    rag = fake_pipeline(store__catalog_url=f"postgresql://rag:hunter2@127.0.0.1:{free_port()}/x")
    with pytest.raises(StoreError) as err:
        rag.ingest([corpus])
    assert "cannot connect to the PostgreSQL catalog" in str(err.value) and "hunter2" not in str(err.value)


def test_server_store_takes_no_file_lock_but_the_embedded_one_does(tmp_path, chroma_url, pg_url):
    with Store(tmp_path / "shared", "col", url=chroma_url, catalog_url=pg_url) as one, \
            Store(tmp_path / "shared", "col", url=chroma_url, catalog_url=pg_url) as two:
        one.ensure_collection(embedder="e", embedder_id="id", dim=8, chunk_size=16, chunk_overlap=0)
        two.write_document(DocumentRecord("/a.txt", "a" * 64, 1, 1, "text"), _chunks(3), _vectors(3))
        assert one.catalog.totals("col")[1] == 3 and one.chunk_count() == 3
    assert not (tmp_path / "shared").exists()
    with Store(tmp_path / "embedded", "col", wait=0.2):
        with pytest.raises(StoreBusyError):
            Store(tmp_path / "embedded", "col", wait=0.2).open()


def test_a_crashed_writers_vectors_are_reconciled_but_a_live_writers_are_not(tmp_path, chroma_url, pg_url):
    """The journal across processes: an entry whose writer still holds the document's lock is left to
    it; once that writer is gone (its connection closed, as under kill -9), the next open cleans up."""
    doc = DocumentRecord("/d.txt", "d" * 64, 1, 1, "text")
    writer = Store(tmp_path / "s", "col", url=chroma_url, catalog_url=pg_url).open()
    writer.ensure_collection(embedder="e", embedder_id="id", dim=8, chunk_size=16, chunk_overlap=0)
    lock = writer.catalog.document_lock("col", doc.source)
    lock.__enter__()  # a writer half-way: journal entry and vectors written, no commit yet
    writer.catalog.mark_pending("col", doc.source)
    writer._col().upsert(ids=["x1", "x2"], embeddings=_vectors(2),
                         metadatas=[{"source": doc.source, "content_hash": doc.content_hash}] * 2)
    with Store(tmp_path / "s", "col", url=chroma_url, catalog_url=pg_url) as other:
        assert other.catalog.pending("col") == [doc.source] and other.chunk_count() == 2  # left alone
    _die(writer.catalog.conn, pg_url)  # the writer dies: the server releases its lock
    writer._client = None
    with Store(tmp_path / "s", "col", url=chroma_url, catalog_url=pg_url) as other:
        assert other.catalog.pending("col") == [] and other.chunk_count() == 0


# -- summarisation job state in PostgreSQL -------------------------------------------------------

def _pg_job(pg_url, docs, *, engine=None):
    from contextlib import contextmanager
    from types import SimpleNamespace

    from support.summarize_fakes import FakeCatalog, FakeEngine

    from pipeline.summarize.jobstore_pg import PostgresJobStore
    from pipeline.summarize.job import Job, Settings

    catalog = FakeCatalog(docs)
    store = SimpleNamespace(name="c", catalog=catalog, documents=lambda: dict(catalog.docs))

    @contextmanager
    def open_store():
        yield store

    engine = engine or FakeEngine(160)
    jobs = PostgresJobStore(pg_url)
    settings = Settings(max_tokens=8, temperature=0.0, repeat_penalty=1.0, seed=0, system="Be brief.")
    return Job(engine=engine, jobs=jobs, open_store=open_store, collection="c", documents=list(catalog.docs.values()),
               prompts=["One.", "Two."], settings=settings, section_target=160 // 4), jobs, engine


def test_job_state_in_postgres_resumes_and_restarts_like_sqlite(pg_url, tmp_path):
    from support.summarize_fakes import doc_chunks, fake_job

    docs = {"/d/a.txt": doc_chunks(12), "/d/b.txt": doc_chunks(12)}
    job, jobs, engine = fake_job(tmp_path, docs, n_ctx=160, prompts=("One.", "Two."))
    with jobs:
        expected = [s.text for s in job.run()]
    job, jobs, engine = _pg_job(pg_url, docs)
    with jobs:
        assert [s.text for s in job.run()] == expected  # the same summaries as with the SQLite job store
        n_first = len(engine.prompts)
        assert job.report.units_computed == n_first > 4
    job, jobs, engine = _pg_job(pg_url, docs)  # another process, later: everything is reused
    with jobs:
        assert [s.text for s in job.run()] == expected
        assert engine.prompts == [] and job.report.results_reused == 4 and job.status()["state"] == "done"
        assert job.forget() > 0 and job.status()["state"] == "not started"
