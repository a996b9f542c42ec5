"""Catalog schema versions: a store written by the version before opens migrated, a newer one is refused."""

from __future__ import annotations

import json
import sqlite3

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.store.schema import SCHEMA_VERSION

# The catalog schema as the code before schema versions were read wrote it (version 1), verbatim.
V1_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS collections (
    name TEXT PRIMARY KEY, embedder TEXT, embedder_id TEXT, dim INTEGER,
    chunk_size INTEGER, chunk_overlap INTEGER, created_at REAL);
CREATE TABLE IF NOT EXISTS documents (
    collection TEXT, source TEXT, content_hash TEXT, size INTEGER, mtime_ns INTEGER,
    format TEXT, title TEXT, pages INTEGER, n_chunks INTEGER, n_tokens INTEGER, ingested_at REAL,
    PRIMARY KEY (collection, source));
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY, chunk_id TEXT UNIQUE, collection TEXT, source TEXT, content_hash TEXT,
    idx INTEGER, page INTEGER, start INTEGER, "end" INTEGER, tokens INTEGER, text TEXT);
CREATE INDEX IF NOT EXISTS chunks_by_doc ON chunks (collection, source, idx);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, content='chunks', content_rowid='id', tokenize="unicode61 tokenchars '_'");
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END;
CREATE TABLE IF NOT EXISTS pending (collection TEXT, source TEXT, PRIMARY KEY (collection, source));
"""


V1_CHUNK_COLUMNS = 'id, chunk_id, collection, source, content_hash, idx, page, start, "end", tokens, text'


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def make_v1_store(store_dir, corpus) -> dict:
    """A store as version 1 left it: ingest, then rewrite the catalog into the version-1 schema with
    the same rows (Chroma's side did not change between the versions), plus the row version 1
    left behind for a collection name Chroma refused."""
    assert run("ingest", corpus).exit_code == 0
    path = store_dir / "catalog.sqlite"
    new = sqlite3.connect(path)
    rows = {t: new.execute(f"SELECT * FROM {t}").fetchall()
            for t in ("collections", "documents", "pending")}
    rows["chunks"] = new.execute(f"SELECT {V1_CHUNK_COLUMNS} FROM chunks").fetchall()
    new.close()
    path.unlink()
    for extra in ("-wal", "-shm"):
        (store_dir / f"catalog.sqlite{extra}").unlink(missing_ok=True)
    old = sqlite3.connect(path, isolation_level=None)
    old.executescript(V1_SCHEMA)
    old.execute("INSERT OR IGNORE INTO meta VALUES ('schema', '1')")
    for table, values in rows.items():
        for row in values:
            old.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(row))})", row)
    broken = list(rows["collections"][0])
    broken[0] = "10.0.0.1"
    old.execute("INSERT INTO collections VALUES (?, ?, ?, ?, ?, ?, ?)", broken)
    old.close()
    return rows


def test_a_version_1_store_opens_migrated_with_its_documents_searchable(store_dir, corpus):
    rows = make_v1_store(store_dir, corpus)
    with pytest.raises(sqlite3.IntegrityError):  # what version 1 did with a second collection
        db = sqlite3.connect(store_dir / "catalog.sqlite")
        db.execute("INSERT INTO chunks (chunk_id, collection) VALUES (?, 'other')", (rows["chunks"][0][1],))
    db.close()

    st = json.loads(run("status", "--json").output)
    assert st["documents"] == 4 and st["chunks"] == len(rows["chunks"]) == st["dense_chunks"]
    assert st["collections"] == ["default"]  # the name Chroma refused is gone
    lexical = json.loads(run("search", "ERR_SOCKET_ZX81", "--json", "--no-dense").output)["hits"]
    assert lexical[0]["source"].endswith("notes.txt")  # the full-text index survived the rebuild
    dense = json.loads(run("search", "which fruit is rich in potassium?", "--json", "--no-lexical").output)["hits"]
    assert dense[0]["source"].endswith("manual.pdf")

    db = sqlite3.connect(store_dir / "catalog.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == (str(SCHEMA_VERSION),)
    assert db.execute(f"SELECT {V1_CHUNK_COLUMNS} FROM chunks ORDER BY id").fetchall() == rows["chunks"]
    assert db.execute("SELECT COUNT(*) FROM chunks WHERE context IS NOT NULL").fetchone() == (0,)
    assert db.execute("SELECT * FROM documents ORDER BY source").fetchall() == sorted(rows["documents"],
                                                                                     key=lambda r: r[1])
    db.close()
    # and the defect version 1 had is gone: the same files in a second collection
    second = run("ingest", corpus, "--collection", "second")
    assert second.exit_code == 0 and "4 new" in second.output, second.output
    assert json.loads(run("status", "--json").output)["documents"] == 4


def test_a_failed_migration_leaves_the_old_catalog_as_it_was(store_dir, corpus, monkeypatch):
    from pipeline.store import schema

    rows = make_v1_store(store_dir, corpus)
    real = schema.MIGRATIONS[1]

    def half_then_fail(db):
        real(db)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setitem(schema.MIGRATIONS, 1, half_then_fail)
    result = run("status")
    assert result.exit_code == 4 and "Traceback" not in result.output
    db = sqlite3.connect(store_dir / "catalog.sqlite")
    assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("1",)
    assert db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == len(rows["chunks"])
    db.close()


def test_a_store_from_a_newer_version_is_refused_untouched(store_dir, corpus):
    assert run("ingest", corpus).exit_code == 0
    db = sqlite3.connect(store_dir / "catalog.sqlite", isolation_level=None)
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    db.execute("DROP TABLE pending")  # a newer version may have changed anything
    tables = db.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    db.close()
    for args in (("status",), ("search", "ERR_SOCKET_ZX81"), ("ingest", corpus)):
        result = run(*args)
        assert result.exit_code == 4, (args, result.output)
        assert (f"was written by a newer version of rag (schema version 99; this version reads up to "
                f"{SCHEMA_VERSION}): upgrade rag") in result.output
    db = sqlite3.connect(store_dir / "catalog.sqlite")
    assert db.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall() == tables  # nothing created
    db.close()
