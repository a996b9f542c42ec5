"""Sections in the catalog: each document's fixed runs of chunks, the unit a prompt is built from.

A section is cut once, when its document is committed (see :mod:`pipeline.ingest.sections`),
and never changes while the document's content does not: a re-ingest of an unchanged
file keeps it, so every prompt that places it stays token-for-token the same and its
saved KV states keep matching. A changed document gets new sections under its new
content hash in the same transaction that replaces its chunks.

Schema (catalog schema version 3, see :mod:`.schema`; a catalog migrated from an
older version has no sections yet, and they are cut from its chunks the first time
they are needed, see :func:`pipeline.ask.packing.gather`, and recorded by
:func:`pipeline.ingest.sections.record_cut`)::

    CREATE TABLE IF NOT EXISTS sections (
        collection TEXT NOT NULL, source TEXT NOT NULL, content_hash TEXT NOT NULL,
        idx INTEGER NOT NULL,          -- 0, 1, ... within the document
        first_chunk INTEGER NOT NULL,  -- chunk indexes, inclusive
        last_chunk INTEGER NOT NULL,
        first_page INTEGER, last_page INTEGER,   -- NULL for documents without pages
        tokens INTEGER NOT NULL,       -- embedder tokens of its chunks
        target INTEGER NOT NULL,       -- the size it was cut to, in embedder tokens
        PRIMARY KEY (collection, source, content_hash, idx));

Only rows whose ``content_hash`` is the document's committed one are ever read.
"""

from __future__ import annotations

import sqlite3
from typing import Iterable, Sequence

from ..records import Section

SCHEMA = """
CREATE TABLE IF NOT EXISTS sections (
    collection TEXT NOT NULL, source TEXT NOT NULL, content_hash TEXT NOT NULL,
    idx INTEGER NOT NULL, first_chunk INTEGER NOT NULL, last_chunk INTEGER NOT NULL,
    first_page INTEGER, last_page INTEGER, tokens INTEGER NOT NULL, target INTEGER NOT NULL,
    PRIMARY KEY (collection, source, content_hash, idx));
"""


def replace(db: sqlite3.Connection, collection: str, source: str, sections: Sequence[Section]) -> None:
    """Make ``sections`` the document's only ones (call inside the commit's transaction)."""
    db.execute("DELETE FROM sections WHERE collection = ? AND source = ?", (collection, source))
    db.executemany(
        "INSERT INTO sections VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(collection, s.source, s.content_hash, s.index, s.first, s.last, s.first_page, s.last_page,
          s.tokens, s.target) for s in sections])


def remove(db: sqlite3.Connection, collection: str, source: str | None = None) -> None:
    """Forget a document's sections, or (``source`` None) the whole collection's."""
    if source is None:
        db.execute("DELETE FROM sections WHERE collection = ?", (collection,))
    else:
        db.execute("DELETE FROM sections WHERE collection = ? AND source = ?", (collection, source))


def read(db: sqlite3.Connection, collection: str, documents: Iterable[tuple[str, str]]
         ) -> dict[str, list[Section]]:
    """The sections of each ``(source, content_hash)``, in order; documents without any are absent."""
    wanted = dict(documents)
    out: dict[str, list[Section]] = {}
    sources = sorted(wanted)
    step = 500  # well under SQLite's limit of bound parameters
    for lo in range(0, len(sources), step):
        part = sources[lo:lo + step]
        rows = db.execute(
            "SELECT source, content_hash, idx, first_chunk, last_chunk, first_page, last_page, tokens, target "
            f"FROM sections WHERE collection = ? AND source IN ({','.join('?' * len(part))}) "
            "ORDER BY source, idx", (collection, *part))
        for row in rows:
            if wanted[row[0]] == row[1]:
                out.setdefault(row[0], []).append(Section(*row))
    return out


def backfill(db: sqlite3.Connection, collection: str, sections: Sequence[Section]) -> bool:
    """Record sections cut for a document committed without them (a catalog older than sections).

    Written only while the document is still at the sections' version. False (nothing
    written) when the catalog cannot be written, e.g. a read-only store: the caller
    uses the sections it cut all the same.
    """
    if not sections:
        return True
    source, content_hash = sections[0].source, sections[0].content_hash
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT content_hash FROM documents WHERE collection = ? AND source = ?",
                             (collection, source)).fetchone()
            if row is not None and row[0] == content_hash:
                replace(db, collection, source, sections)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    except sqlite3.Error:
        return False
    return True
