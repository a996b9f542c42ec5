"""The catalog's PostgreSQL schema, its version, and the migrations from every older version.

``meta.schema`` records the version a PostgreSQL catalog was written with; its
numbering is its own (the SQLite catalog's history is in :mod:`.schema`). Opening a
catalog creates the schema in an empty database or migrates an older one in one
transaction, under a transaction-level advisory lock so that processes starting at
once do it exactly once, and refuses a newer version, which this code could misread.

History:

1. collections, documents, chunks with a generated ``tsvector`` (full-text ranking by
   PostgreSQL: ``ts_rank`` over the ``simple`` configuration, which neither stems nor
   drops stop words, as the SQLite catalog's FTS5 ``unicode61`` tokenizer does not),
   the reconcile journal (``pending``) and sections;
2. summarisation job state (``jobs``, ``units``, ``results``, and ``claims``: the leases of
   workers sharing one job; see :mod:`pipeline.summarize.jobstore`),
   which the SQLite side keeps in ``jobs.sqlite`` beside the store;
3. the ``tsvector`` splits words at ASCII punctuation first, as FTS5's ``unicode61`` does:
   PostgreSQL's parser keeps ``audio/midi`` or ``bug-libtasn1@gnu.org`` as one lexeme, so a
   question about "midi" or "libtasn1" did not match them (the held-out set lost two
   questions to this). The column is regenerated, which rewrites the chunks table once;
4. ``chunks.vector``: each chunk's embedding (float32, little-endian ``bytea``), written in the
   commit's transaction, so that a small collection's dense search reads the catalog instead of
   asking Chroma (see :mod:`.exact`); old rows keep NULL until ``rag ingest`` copies theirs from Chroma.
"""

from __future__ import annotations

from typing import Callable

from ..errors import StoreError

SCHEMA_VERSION = 4

# Any constant shared by every rag process: the key of the advisory lock held while migrating.
_MIGRATION_LOCK = 0x7261670001

_V1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE collections (
    name TEXT PRIMARY KEY, embedder TEXT, embedder_id TEXT, dim INTEGER,
    chunk_size INTEGER, chunk_overlap INTEGER, created_at DOUBLE PRECISION);
CREATE TABLE documents (
    collection TEXT NOT NULL, source TEXT NOT NULL, content_hash TEXT NOT NULL, size BIGINT, mtime_ns BIGINT,
    format TEXT, title TEXT, pages INTEGER, n_chunks INTEGER, n_tokens INTEGER, ingested_at DOUBLE PRECISION,
    PRIMARY KEY (collection, source));
CREATE TABLE chunks (
    collection TEXT NOT NULL, chunk_id TEXT NOT NULL, source TEXT NOT NULL, content_hash TEXT NOT NULL,
    idx INTEGER NOT NULL, page INTEGER, start INTEGER, "end" INTEGER, tokens INTEGER, text TEXT NOT NULL,
    context TEXT,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('simple', coalesce(context, '') || ' ' || text)) STORED,
    PRIMARY KEY (collection, chunk_id));
CREATE INDEX chunks_by_doc ON chunks (collection, source, idx);
CREATE INDEX chunks_fts ON chunks USING GIN (tsv);
CREATE TABLE pending (collection TEXT NOT NULL, source TEXT NOT NULL, PRIMARY KEY (collection, source));
CREATE TABLE sections (
    collection TEXT NOT NULL, source TEXT NOT NULL, content_hash TEXT NOT NULL,
    idx INTEGER NOT NULL, first_chunk INTEGER NOT NULL, last_chunk INTEGER NOT NULL,
    first_page INTEGER, last_page INTEGER, tokens INTEGER NOT NULL, target INTEGER NOT NULL,
    PRIMARY KEY (collection, source, content_hash, idx));
"""

_V2 = """
CREATE TABLE jobs (
    job_id TEXT PRIMARY KEY, collection TEXT, spec TEXT, state TEXT,
    created_at DOUBLE PRECISION, updated_at DOUBLE PRECISION);
CREATE TABLE units (
    key TEXT PRIMARY KEY, doc_key TEXT, prompt_key TEXT, kind TEXT, idx TEXT, text TEXT,
    prompt_tokens INTEGER, prefill_tokens INTEGER, decode_tokens INTEGER, seconds DOUBLE PRECISION,
    finished_at DOUBLE PRECISION);
CREATE INDEX units_by_doc ON units (doc_key, prompt_key);
CREATE TABLE results (
    key TEXT PRIMARY KEY, doc_key TEXT, prompt_key TEXT, source TEXT, content_hash TEXT, prompt TEXT,
    method TEXT, sections INTEGER, reduce_steps INTEGER, levels INTEGER, text TEXT,
    finished_at DOUBLE PRECISION);
CREATE INDEX results_by_doc ON results (doc_key, prompt_key);
CREATE TABLE claims (
    job_id TEXT, item TEXT, worker TEXT, lease_until DOUBLE PRECISION, done INTEGER, attempts INTEGER,
    PRIMARY KEY (job_id, item));
"""


#: What the full-text index holds: the chunk's heading path and text, split at punctuation
#: (:data:`LEXEMES` is the same expression for any text, the query's included).
LEXEMES = "to_tsvector('simple', regexp_replace({}, '[[:punct:]]+', ' ', 'g'))"

_V3 = f"""
ALTER TABLE chunks DROP COLUMN tsv;
ALTER TABLE chunks ADD COLUMN tsv tsvector GENERATED ALWAYS AS
    ({LEXEMES.format("coalesce(context, '') || ' ' || text")}) STORED;
CREATE INDEX chunks_fts ON chunks USING GIN (tsv);
"""


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _v1_to_v2(cur) -> None:
    for statement in _statements(_V2):
        cur.execute(statement)


def _v2_to_v3(cur) -> None:
    for statement in _statements(_V3):
        cur.execute(statement)


def _v3_to_v4(cur) -> None:
    cur.execute("ALTER TABLE chunks ADD COLUMN vector BYTEA")
    # Chunks committed without their vector: found at once, and usually none.
    cur.execute("CREATE INDEX chunks_without_vector ON chunks (collection, source) WHERE vector IS NULL")


#: MIGRATIONS[v] turns a catalog of version v into version v + 1.
MIGRATIONS: dict[int, Callable] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}
#: The scripts that create each version from nothing: a new catalog runs version 1, then the migrations.
CREATE = _V1


def stored_version(cur) -> int | None:
    """The version recorded in the database, or None when it holds no catalog yet."""
    cur.execute("SELECT to_regclass('meta') IS NOT NULL")
    if not cur.fetchone()[0]:
        return None
    cur.execute("SELECT value FROM meta WHERE key = 'schema'")
    row = cur.fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise StoreError(f"the PostgreSQL catalog records an unreadable schema version {row[0]!r}") from None


def upgrade(conn, *, where: str, target: int = SCHEMA_VERSION) -> int | None:
    """Create the schema in an empty database or migrate an older one to ``target``, in one transaction.

    Returns the version found (None for a new catalog). Refuses a catalog of a newer version.
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        found = stored_version(cur)
        if found is not None and found > SCHEMA_VERSION:
            raise StoreError(
                f"the PostgreSQL catalog at {where} was written by a newer version of rag (schema version "
                f"{found}; this version reads up to {SCHEMA_VERSION}): upgrade rag to use this store")
        if found == target:
            return found
        if found is None:
            for statement in _statements(CREATE):
                cur.execute(statement)
            version = 1
        else:
            version = found
        while version < target:
            MIGRATIONS[version](cur)
            version += 1
        cur.execute("INSERT INTO meta VALUES ('schema', %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (str(target),))
        return found
