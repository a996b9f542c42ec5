"""The catalog's SQLite schema, its version, and the migrations from every older version.

``meta.schema`` records the version a catalog was written with. Opening a catalog
brings an older one up to :data:`SCHEMA_VERSION` in one transaction (a crash
half-way leaves the old version intact, and the next open migrates again) and
refuses a newer one, which this code could misread or damage.

History:

1. the first catalog: chunk ids unique across the whole store, so one file could
   not be in two collections;
2. chunk ids unique per collection; collections whose names Chroma refuses (they
   could never hold a document) are removed;
3. ``chunks.context``: each chunk's header (document title and heading path), indexed
   by the full-text index beside the text and embedded with it, never shown. Old rows
   keep a NULL header, which indexes exactly as before;
4. sections (:mod:`.sections`): each document version's fixed runs of chunks. Derived
   from the chunks, so the migration only creates the table; documents committed
   before get their sections the first time a question needs them;
5. ``chunks.vector``: each chunk's embedding (float32, little-endian), written in the commit's
   transaction, so that a small collection's dense search reads the catalog instead of starting
   Chroma (see :mod:`.exact`). Old rows keep a NULL vector until ``rag ingest`` copies theirs
   from Chroma; until then their collection is searched through Chroma as before.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from ..errors import StoreError
from .names import name_problem
from .sections import SCHEMA as SECTIONS

SCHEMA_VERSION = 5

_CHUNKS_V2 = """
CREATE TABLE {name} (
    id INTEGER PRIMARY KEY, chunk_id TEXT, collection TEXT, source TEXT, content_hash TEXT,
    idx INTEGER, page INTEGER, start INTEGER, "end" INTEGER, tokens INTEGER, text TEXT,
    UNIQUE (collection, chunk_id));
"""

_CHUNK_INDEXES_V2 = """
CREATE INDEX chunks_by_doc ON chunks (collection, source, idx);
CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text); END;
CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text); END;
"""

_CHUNKS = """
CREATE TABLE {name} (
    id INTEGER PRIMARY KEY, chunk_id TEXT, collection TEXT, source TEXT, content_hash TEXT,
    idx INTEGER, page INTEGER, start INTEGER, "end" INTEGER, tokens INTEGER, text TEXT, context TEXT,
    vector BLOB, UNIQUE (collection, chunk_id));
"""

# The lexical index: a chunk's header (``context``: title and heading path) and its text.
_FTS = """
CREATE VIRTUAL TABLE chunks_fts USING fts5(
    context, text, content='chunks', content_rowid='id', tokenize="unicode61 tokenchars '_'");
"""

# Chunks committed without their vector (before version 5): found at once, and usually none.
_WITHOUT_VECTOR = """
CREATE INDEX chunks_without_vector ON chunks (collection, source) WHERE vector IS NULL;
"""

_CHUNK_INDEXES = """
CREATE INDEX chunks_by_doc ON chunks (collection, source, idx);
CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, context, text) VALUES (new.id, new.context, new.text); END;
CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts(chunks_fts, rowid, context, text) VALUES ('delete', old.id, old.context, old.text);
    END;
"""

# The current schema, for a new catalog.
SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE collections (
    name TEXT PRIMARY KEY, embedder TEXT, embedder_id TEXT, dim INTEGER,
    chunk_size INTEGER, chunk_overlap INTEGER, created_at REAL);
CREATE TABLE documents (
    collection TEXT, source TEXT, content_hash TEXT, size INTEGER, mtime_ns INTEGER,
    format TEXT, title TEXT, pages INTEGER, n_chunks INTEGER, n_tokens INTEGER, ingested_at REAL,
    PRIMARY KEY (collection, source));
""" + _CHUNKS.format(name="chunks") + _FTS + _CHUNK_INDEXES + _WITHOUT_VECTOR + """
CREATE TABLE pending (collection TEXT, source TEXT, PRIMARY KEY (collection, source));
""" + SECTIONS


def _v1_to_v2(db: sqlite3.Connection) -> None:
    # SQLite cannot drop a column's UNIQUE constraint: rebuild the table under the same row ids,
    # so the full-text index (keyed by row id) stays valid; it is rebuilt anyway to be certain.
    db.execute(_CHUNKS_V2.format(name="chunks_v2"))
    db.execute('INSERT INTO chunks_v2 SELECT id, chunk_id, collection, source, content_hash, idx, page,'
               ' start, "end", tokens, text FROM chunks')
    db.execute("DROP TABLE chunks")  # its index and triggers go with it
    db.execute("ALTER TABLE chunks_v2 RENAME TO chunks")
    for statement in _statements(_CHUNK_INDEXES_V2):
        db.execute(statement)
    db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')")
    # Version 1 recorded a collection before Chroma checked its name; such a collection
    # has no documents (Chroma refused every write) and kept status and search failing.
    for (name,) in db.execute("SELECT name FROM collections").fetchall():
        if name_problem(name) and not db.execute(
                "SELECT 1 FROM documents WHERE collection = ? LIMIT 1", (name,)).fetchone():
            db.execute("DELETE FROM collections WHERE name = ?", (name,))
            db.execute("DELETE FROM pending WHERE collection = ?", (name,))


def _v2_to_v3(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE chunks ADD COLUMN context TEXT")
    db.execute("DROP TRIGGER chunks_ai")
    db.execute("DROP TRIGGER chunks_ad")
    db.execute("DROP TABLE chunks_fts")
    db.execute("DROP INDEX chunks_by_doc")
    for statement in _statements(_FTS + _CHUNK_INDEXES):
        db.execute(statement)
    db.execute("INSERT INTO chunks_fts(chunks_fts) VALUES ('rebuild')")


def _v3_to_v4(db: sqlite3.Connection) -> None:
    db.execute(SECTIONS)


def _v4_to_v5(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE chunks ADD COLUMN vector BLOB")
    db.execute(_WITHOUT_VECTOR)


# MIGRATIONS[v] turns a catalog of version v into version v + 1.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4,
                                                               4: _v4_to_v5}


def _statements(script: str) -> list[str]:
    """The statements of a script, one by one (``executescript`` would commit the transaction)."""
    out, current = [], ""
    for line in script.strip().splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    return out


def stored_version(db: sqlite3.Connection) -> int | None:
    """The version recorded in the catalog, or None for an empty database."""
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" in tables:
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is not None:
            try:
                return int(row[0])
            except (TypeError, ValueError):
                raise StoreError(f"the catalog records an unreadable schema version {row[0]!r}") from None
    if "chunks" in tables:
        return 1  # version 1 wrote its tables before its version row
    return None


def upgrade(db: sqlite3.Connection, *, path: object) -> int:
    """Create the schema in an empty catalog, or migrate an older one; return the version found.

    Refuses a catalog written by a newer version of rag. Everything happens in one
    transaction, so a failure leaves the catalog as it was.
    """
    if stored_version(db) == SCHEMA_VERSION:
        return SCHEMA_VERSION  # the usual case: no write, no lock
    db.execute("BEGIN IMMEDIATE")
    try:
        found = stored_version(db)  # again, under the write lock
        if found is not None and found > SCHEMA_VERSION:
            raise StoreError(
                f"the store catalog {path} was written by a newer version of rag (schema version "
                f"{found}; this version reads up to {SCHEMA_VERSION}): upgrade rag to use this store")
        if found is None:
            for statement in _statements(SCHEMA):
                db.execute(statement)
        else:
            for version in range(found, SCHEMA_VERSION):
                MIGRATIONS[version](db)
        if found != SCHEMA_VERSION:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        db.execute("COMMIT")
        return found if found is not None else SCHEMA_VERSION
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
