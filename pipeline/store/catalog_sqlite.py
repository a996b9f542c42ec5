"""The catalog in SQLite: one file per store, ``catalog.sqlite`` beside the vectors (see :mod:`.catalog`).

A document becomes visible to queries in exactly one transaction that writes its
row, its chunks, their full-text entries and its sections. The lexical index is
SQLite FTS5 with BM25 ranking (it ships with Python; Chroma's own sparse index is
refused in embedded mode).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .._sqlite import connect, transaction
from ..errors import StoreError
from ..records import Chunk, CollectionInfo, DocumentRecord, StoredChunk
from . import sections as _sections
from .terms import TermStats, query_terms, words
from .failures import storage_error
from .schema import upgrade

# One lock per catalog file, shared by every connection of this process (see collection_lock).
_COLLECTION_LOCKS: dict[str, threading.RLock] = {}
_COLLECTION_LOCKS_MU = threading.Lock()


def fts_query(text: str) -> str | None:
    """An FTS5 query matching any word of ``text``: quoted so that no user input is FTS syntax."""
    terms = query_terms(text)
    if not terms:
        return None
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in terms)


class SQLiteCatalog:
    """The :class:`~.catalog.Catalog` of one store in SQLite. Not shared between threads; the store lock
    serialises processes.

    Opening it creates the schema in a new file and migrates an older one (see :mod:`.schema`);
    ``migrated_from`` is the version found.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.db = connect(path, timeout=30)  # WAL, waiting out another connection switching a new file
        except sqlite3.OperationalError as exc:
            raise storage_error(exc, path.parent, doing="opening the catalog of") from None
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open the catalog {path}: {exc}") from None
        try:
            self.migrated_from = upgrade(self.db, path=path)
        except BaseException as exc:
            self.db.close()
            if isinstance(exc, sqlite3.DatabaseError):
                raise storage_error(exc, path.parent, doing="opening the catalog of") from None
            raise

    #: Several processes may write through catalogs like this one at once (the store lock is not needed).
    shared = False

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def collection_lock(self, name: str) -> Iterator[None]:
        """Held while a collection is created or dropped: the store lock serialises processes, this
        the threads of one process (each with its own catalog connection)."""
        with _COLLECTION_LOCKS_MU:
            lock = _COLLECTION_LOCKS.setdefault(str(self.path.resolve()), threading.RLock())
        with lock:
            yield

    @contextmanager
    def document_lock(self, collection: str, source: str, *, wait: bool = True) -> Iterator[bool]:
        """Held while one document is written (yields False when ``wait`` is off and it is taken)."""
        yield True

    # -- collections ------------------------------------------------------------------------

    def collection(self, name: str) -> CollectionInfo | None:
        row = self.db.execute("SELECT * FROM collections WHERE name = ?", (name,)).fetchone()
        return CollectionInfo(*row) if row else None

    def collections(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM collections ORDER BY name")]

    def create_collection(self, info: CollectionInfo) -> None:
        self.db.execute("INSERT INTO collections VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (info.name, info.embedder, info.embedder_id, info.dim,
                         info.chunk_size, info.chunk_overlap, info.created_at))

    def drop_collection(self, name: str) -> None:
        with self._tx():
            self.db.execute("DELETE FROM chunks WHERE collection = ?", (name,))
            self.db.execute("DELETE FROM documents WHERE collection = ?", (name,))
            self.db.execute("DELETE FROM pending WHERE collection = ?", (name,))
            _sections.remove(self.db, name)
            self.db.execute("DELETE FROM collections WHERE name = ?", (name,))

    # -- documents --------------------------------------------------------------------------

    def documents(self, collection: str) -> dict[str, DocumentRecord]:
        rows = self.db.execute(
            "SELECT source, content_hash, size, mtime_ns, format, title, pages, n_chunks, n_tokens,"
            " ingested_at FROM documents WHERE collection = ?", (collection,))
        return {r[0]: DocumentRecord(*r) for r in rows}

    def document(self, collection: str, source: str) -> DocumentRecord | None:
        row = self.db.execute(
            "SELECT source, content_hash, size, mtime_ns, format, title, pages, n_chunks, n_tokens,"
            " ingested_at FROM documents WHERE collection = ? AND source = ?", (collection, source)).fetchone()
        return DocumentRecord(*row) if row else None

    def committed_hashes(self, collection: str) -> dict[str, str]:
        return dict(self.db.execute(
            "SELECT source, content_hash FROM documents WHERE collection = ?", (collection,)))

    def commit_document(self, collection: str, doc: DocumentRecord, chunks: Sequence["Chunk"],
                        chunk_ids: Sequence[str], sections: Sequence["_sections.Section"] = (),
                        vectors: Sequence[bytes] | None = None) -> None:
        """Replace ``doc.source``'s record, chunks (with their ``vectors``) and sections in one
        transaction: the commit point."""
        blobs = vectors if vectors is not None else [None] * len(chunks)
        with self._tx():
            _sections.replace(self.db, collection, doc.source, sections)
            self.db.execute("DELETE FROM chunks WHERE collection = ? AND source = ?",
                            (collection, doc.source))
            self.db.executemany(
                "INSERT INTO chunks (chunk_id, collection, source, content_hash, idx, page, start,"
                ' "end", tokens, text, context, vector) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
                [(cid, collection, doc.source, doc.content_hash, c.index, c.page, c.start, c.end,
                  c.tokens, c.text, c.context or None, blob) for cid, c, blob in zip(chunk_ids, chunks, blobs)])
            self.db.execute(
                "INSERT OR REPLACE INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (collection, doc.source, doc.content_hash, doc.size, doc.mtime_ns, doc.format,
                 doc.title, doc.pages, len(chunks), sum(c.tokens for c in chunks), time.time()))

    def touch_document(self, collection: str, source: str, *, size: int, mtime_ns: int) -> None:
        """Record a new size/mtime for a document whose content did not change."""
        self.db.execute("UPDATE documents SET size = ?, mtime_ns = ? WHERE collection = ? AND source = ?",
                        (size, mtime_ns, collection, source))

    def remove_document(self, collection: str, source: str) -> None:
        with self._tx():
            self.db.execute("DELETE FROM chunks WHERE collection = ? AND source = ?", (collection, source))
            self.db.execute("DELETE FROM documents WHERE collection = ? AND source = ?", (collection, source))
            _sections.remove(self.db, collection, source)

    # -- the reconcile journal ----------------------------------------------------------------

    def mark_pending(self, collection: str, source: str) -> None:
        self.db.execute("INSERT OR IGNORE INTO pending VALUES (?, ?)", (collection, source))

    def clear_pending(self, collection: str, source: str) -> None:
        self.db.execute("DELETE FROM pending WHERE collection = ? AND source = ?", (collection, source))

    def pending(self, collection: str) -> list[str]:
        return [r[0] for r in self.db.execute(
            "SELECT source FROM pending WHERE collection = ?", (collection,))]

    # -- sections -----------------------------------------------------------------------------

    def sections(self, collection: str, documents: Iterable[tuple[str, str]]
                 ) -> dict[str, list["_sections.Section"]]:
        """The sections of each committed ``(source, content_hash)``, in order (see :mod:`.sections`)."""
        return _sections.read(self.db, collection, documents)

    def backfill_sections(self, collection: str, sections: Sequence["_sections.Section"]) -> bool:
        """Record sections cut for a document committed without them; False if nothing could be written."""
        return _sections.backfill(self.db, collection, sections)

    # -- reading chunks -----------------------------------------------------------------------

    def search(self, collection: str, query: str, *, limit: int, source: str | Sequence[str] | None = None
               ) -> list[tuple[StoredChunk, float]]:
        """BM25 hits (of ``source``: one document or several), best first, with the BM25 score as a
        positive number (higher is better)."""
        match = fts_query(query)
        if match is None:
            return []
        sources = [] if not source else [source] if isinstance(source, str) else list(source)
        where = f" AND c.source IN ({','.join('?' * len(sources))})" if sources else ""
        rows = self.db.execute(
            "SELECT c.chunk_id, c.source, c.content_hash, c.idx, c.page, c.start, c.\"end\", c.tokens,"
            " c.text, bm25(chunks_fts) AS score FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid"
            " WHERE chunks_fts MATCH ? AND c.collection = ?" + where + " ORDER BY score LIMIT ?",
            (match, collection, *sources, limit))
        return [(StoredChunk(*r[:9]), -float(r[9])) for r in rows]

    def term_stats(self, collection: str, query: str, chunk_id: str) -> "tuple[TermStats, set[str]]":
        """The query's words with their document frequencies in the index (0 for words it does not
        hold), and those of them that the chunk ``chunk_id`` contains (see :mod:`pipeline.retrieval.fusion`)."""
        terms = query_terms(query)
        if not terms:
            return TermStats(0, {}), set()
        self.db.execute("CREATE VIRTUAL TABLE IF NOT EXISTS temp.chunks_vocab USING fts5vocab(main, chunks_fts, 'row')")
        marks = ",".join("?" * len(terms))
        df = {t: 0 for t in terms}
        df.update(self.db.execute(f"SELECT term, doc FROM temp.chunks_vocab WHERE term IN ({marks})", terms))
        n = self.db.execute("SELECT count(*) FROM chunks").fetchone()[0]  # bm25() counts the whole index too
        row = self.db.execute("SELECT text, coalesce(context, '') FROM chunks WHERE chunk_id = ? AND collection = ?",
                              (chunk_id, collection)).fetchone()
        matched = set(words(row[0] + " " + row[1])) & set(terms) if row else set()
        return TermStats(int(n), df), matched

    def bm25(self, collection: str, query: str, chunk_ids: Sequence[str]) -> dict[str, float]:
        """BM25 scores (positive, higher is better) of these chunks for ``query``; chunks that
        share no term with it are absent. Scores use whole-index statistics, as :meth:`search` does."""
        match = fts_query(query)
        if match is None or not chunk_ids:
            return {}
        marks = ",".join("?" * len(chunk_ids))
        rows = self.db.execute(
            "SELECT c.chunk_id, bm25(chunks_fts) FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid"
            f" WHERE chunks_fts MATCH ? AND c.collection = ? AND c.chunk_id IN ({marks})",
            (match, collection, *chunk_ids))
        return {cid: -float(score) for cid, score in rows}

    def chunks(self, collection: str, source: str, *, first: int = 0, last: int | None = None
               ) -> list[StoredChunk]:
        """A committed document's chunks with index in [first, last], in order."""
        rows = self.db.execute(
            "SELECT chunk_id, source, content_hash, idx, page, start, \"end\", tokens, text FROM chunks"
            " WHERE collection = ? AND source = ? AND idx >= ? AND idx <= ? ORDER BY idx",
            (collection, source, first, last if last is not None else 2**62))
        return [StoredChunk(*r) for r in rows]

    def totals(self, collection: str) -> tuple[int, int, int]:
        """(documents, chunks, tokens) committed in ``collection``."""
        row = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(n_chunks), 0), COALESCE(SUM(n_tokens), 0) FROM documents"
            " WHERE collection = ?", (collection,)).fetchone()
        return int(row[0]), int(row[1]), int(row[2])

    def chunks_by_id(self, collection: str, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The committed chunks of these ids (those that are)."""
        found: dict[str, StoredChunk] = {}
        for part in _parts(chunk_ids):
            rows = self.db.execute(
                "SELECT chunk_id, source, content_hash, idx, page, start, \"end\", tokens, text FROM chunks"
                f" WHERE collection = ? AND chunk_id IN ({','.join('?' * len(part))})", (collection, *part))
            found.update((r[0], StoredChunk(*r)) for r in rows)
        return found

    # -- the chunks' vectors (see .exact) -------------------------------------------------------

    def vector_coverage(self, collection: str, source: str | Sequence[str] | None = None) -> tuple[int, bool]:
        """(chunks committed in ``collection`` (of ``source``), whether every one has its vector)."""
        where, args = _of_sources(source)
        chunks = self.db.execute(f"SELECT COALESCE(SUM(n_chunks), 0) FROM documents WHERE collection = ?{where}",
                                 (collection, *args)).fetchone()[0]
        lacking = self.db.execute(f"SELECT 1 FROM chunks WHERE collection = ?{where} AND vector IS NULL LIMIT 1",
                                  (collection, *args)).fetchone()
        return int(chunks), lacking is None

    def vectors(self, collection: str, *, source: str | Sequence[str] | None = None,
                chunk_ids: Sequence[str] | None = None) -> list[tuple[str, bytes]]:
        """(chunk id, vector) of the committed chunks that have one: of ``source`` or with these ids."""
        if chunk_ids is None:
            where, args = _of_sources(source)
            return self.db.execute(f"SELECT chunk_id, vector FROM chunks WHERE collection = ?{where}"
                                   " AND vector IS NOT NULL", (collection, *args)).fetchall()
        out: list[tuple[str, bytes]] = []
        for part in _parts(chunk_ids):
            out += self.db.execute(
                f"SELECT chunk_id, vector FROM chunks WHERE collection = ? AND chunk_id IN ({','.join('?' * len(part))})"
                " AND vector IS NOT NULL", (collection, *part)).fetchall()
        return out

    def missing_vectors(self, collection: str, *, limit: int) -> list[str]:
        """Up to ``limit`` ids of committed chunks stored without their vector (catalogs before schema 5)."""
        return [r[0] for r in self.db.execute(
            "SELECT chunk_id FROM chunks WHERE collection = ? AND vector IS NULL LIMIT ?", (collection, limit))]

    def set_vectors(self, collection: str, vectors: Sequence[tuple[str, bytes]]) -> None:
        """Record the vectors of chunks committed without them (the same ones Chroma holds)."""
        with self._tx():
            self.db.executemany("UPDATE chunks SET vector = ? WHERE collection = ? AND chunk_id = ? AND vector IS NULL",
                                [(blob, collection, cid) for cid, blob in vectors])

    def _tx(self):
        return transaction(self.db)


def _of_sources(source: str | Sequence[str] | None) -> tuple[str, list[str]]:
    """A ``WHERE`` clause's continuation (and its arguments) for chunks of ``source``: one document or several."""
    sources = [] if not source else [source] if isinstance(source, str) else list(source)
    return (f" AND source IN ({','.join('?' * len(sources))})" if sources else ""), sources


def _parts(ids: Sequence[str], size: int = 900) -> Iterator[list[str]]:
    """``ids`` in runs short enough for one statement's parameters."""
    ids = list(ids)
    for lo in range(0, len(ids), size):
        yield ids[lo:lo + size]
