"""The catalog in PostgreSQL (``store.catalog_url``): shared by every process on every machine.

The same interface and the same guarantees as the SQLite :class:`~.catalog.Catalog`
(a document becomes visible in exactly one transaction that writes its row, its chunks
and their full-text entries), with what SQLite's single-writer file cannot give:

- full-text ranking by PostgreSQL itself: a generated ``tsvector`` per chunk (title and
  heading path plus text, split at punctuation), a GIN index, ``ts_rank`` weighted by each
  query term's inverse document frequency (see :meth:`PostgresCatalog._terms` and :mod:`.pg_schema`);
- coordination by the server instead of the store's file lock: a session-level advisory
  lock per document (held while its vectors are written and its rows committed; the
  server releases it when the holder's connection ends, ``kill -9`` included) and one
  per collection (creating or dropping it);
- an explicit schema version with migrations (:mod:`.pg_schema`).

One connection per instance, in autocommit mode, lent by this process's pool for the URL
(:mod:`.pg_pool`) until :meth:`PostgresCatalog.close`; transactions are explicit and
advisory locks are released before the connection goes back. Not shared between
threads, like the SQLite catalog.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Iterable, Iterator, Sequence

from ..errors import StoreError, redact
from ..records import Chunk, CollectionInfo, DocumentRecord, Section, StoredChunk
from .terms import TermStats, query_text, words
from .pg_pool import advisory_key, pool
from .pg_schema import LEXEMES, upgrade

_DOC = ("source, content_hash, size, mtime_ns, format, title, pages, n_chunks, n_tokens, ingested_at")
_CHUNK = 'chunk_id, source, content_hash, idx, page, start, "end", tokens, text'


def _quoted(lexeme: str) -> str:
    # Lexemes come from text with ASCII punctuation removed (pg_schema.LEXEMES): no quote, no backslash.
    return "'" + lexeme + "'"


def _clean(text: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL characters."""
    return text.replace("\x00", " ") if text else text


class PostgresCatalog:
    """The :class:`~.catalog.Catalog` of one store in a PostgreSQL database, shared by many processes."""

    shared = True

    def __init__(self, url: str):
        import psycopg

        self.url = url
        self.where = redact(url)
        self.path = self.where  # what messages name
        self._pool = pool(url)
        self.conn = self._pool.acquire()
        self._error = psycopg.Error
        try:
            self.migrated_from = upgrade(self.conn, where=self.where)
        except BaseException as exc:
            self.close()
            if isinstance(exc, psycopg.Error):
                raise StoreError(f"opening the PostgreSQL catalog {self.where} failed: {exc}") from None
            raise

    def close(self) -> None:
        """Give the connection back to the pool (once)."""
        pool_, self._pool = self._pool, None
        if pool_ is not None:
            pool_.release(self.conn)

    def _rows(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def _run(self, sql: str, args: Sequence = ()) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql, args)

    # -- locks ------------------------------------------------------------------------------

    @contextmanager
    def _advisory(self, key: int, *, wait: bool) -> Iterator[bool]:
        if wait:
            self._run("SELECT pg_advisory_lock(%s)", (key,))
            got = True
        else:
            got = bool(self._rows("SELECT pg_try_advisory_lock(%s)", (key,))[0][0])
        try:
            yield got
        finally:
            if got and not self.conn.closed:
                self._run("SELECT pg_advisory_unlock(%s)", (key,))

    def collection_lock(self, name: str):
        return self._advisory(advisory_key("collection", name), wait=True)

    def document_lock(self, collection: str, source: str, *, wait: bool = True):
        return self._advisory(advisory_key("document", collection, source), wait=wait)

    # -- collections ------------------------------------------------------------------------

    def collection(self, name: str) -> CollectionInfo | None:
        rows = self._rows("SELECT name, embedder, embedder_id, dim, chunk_size, chunk_overlap, created_at"
                          " FROM collections WHERE name = %s", (name,))
        return CollectionInfo(*rows[0]) if rows else None

    def collections(self) -> list[str]:
        return [r[0] for r in self._rows("SELECT name FROM collections ORDER BY name")]

    def create_collection(self, info: CollectionInfo) -> None:
        self._run("INSERT INTO collections VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                  (info.name, info.embedder, info.embedder_id, info.dim, info.chunk_size, info.chunk_overlap,
                   info.created_at))

    def drop_collection(self, name: str) -> None:
        with self.conn.transaction():
            for table in ("chunks", "documents", "pending", "sections"):
                self._run(f"DELETE FROM {table} WHERE collection = %s", (name,))
            self._run("DELETE FROM collections WHERE name = %s", (name,))

    # -- documents --------------------------------------------------------------------------

    def documents(self, collection: str) -> dict[str, DocumentRecord]:
        rows = self._rows(f"SELECT {_DOC} FROM documents WHERE collection = %s", (collection,))
        return {r[0]: DocumentRecord(*r) for r in rows}

    def document(self, collection: str, source: str) -> DocumentRecord | None:
        rows = self._rows(f"SELECT {_DOC} FROM documents WHERE collection = %s AND source = %s",
                          (collection, source))
        return DocumentRecord(*rows[0]) if rows else None

    def committed_hashes(self, collection: str) -> dict[str, str]:
        return dict(self._rows("SELECT source, content_hash FROM documents WHERE collection = %s", (collection,)))

    def commit_document(self, collection: str, doc: DocumentRecord, chunks: Sequence["Chunk"],
                        chunk_ids: Sequence[str], sections: Sequence[Section] = (),
                        vectors: Sequence[bytes] | None = None) -> None:
        """Replace ``doc.source``'s record, chunks (with their ``vectors``) and sections in one
        transaction: the commit point."""
        blobs = vectors if vectors is not None else [None] * len(chunks)
        with self.conn.transaction(), self.conn.cursor() as cur:
            # The document's row, locked (or created) first: a concurrent writer of the same source waits here.
            cur.execute(
                "INSERT INTO documents VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (collection, source) DO UPDATE SET content_hash = excluded.content_hash,"
                " size = excluded.size, mtime_ns = excluded.mtime_ns, format = excluded.format,"
                " title = excluded.title, pages = excluded.pages, n_chunks = excluded.n_chunks,"
                " n_tokens = excluded.n_tokens, ingested_at = excluded.ingested_at",
                (collection, doc.source, doc.content_hash, doc.size, doc.mtime_ns, doc.format,
                 _clean(doc.title), doc.pages, len(chunks), sum(c.tokens for c in chunks), time.time()))
            cur.execute("DELETE FROM sections WHERE collection = %s AND source = %s", (collection, doc.source))
            cur.executemany("INSERT INTO sections VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                            [(collection, s.source, s.content_hash, s.index, s.first, s.last, s.first_page,
                              s.last_page, s.tokens, s.target) for s in sections])
            cur.execute("DELETE FROM chunks WHERE collection = %s AND source = %s", (collection, doc.source))
            cur.executemany(
                "INSERT INTO chunks (collection, chunk_id, source, content_hash, idx, page, start, \"end\","
                " tokens, text, context, vector) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [(collection, cid, doc.source, doc.content_hash, c.index, c.page, c.start, c.end, c.tokens,
                  _clean(c.text), _clean(c.context) or None, blob)
                 for cid, c, blob in zip(chunk_ids, chunks, blobs)])

    def touch_document(self, collection: str, source: str, *, size: int, mtime_ns: int) -> None:
        self._run("UPDATE documents SET size = %s, mtime_ns = %s WHERE collection = %s AND source = %s",
                  (size, mtime_ns, collection, source))

    def remove_document(self, collection: str, source: str) -> None:
        with self.conn.transaction():
            for table in ("documents", "chunks", "sections"):
                self._run(f"DELETE FROM {table} WHERE collection = %s AND source = %s", (collection, source))

    # -- the reconcile journal ----------------------------------------------------------------

    def mark_pending(self, collection: str, source: str) -> None:
        self._run("INSERT INTO pending VALUES (%s, %s) ON CONFLICT DO NOTHING", (collection, source))

    def clear_pending(self, collection: str, source: str) -> None:
        self._run("DELETE FROM pending WHERE collection = %s AND source = %s", (collection, source))

    def pending(self, collection: str) -> list[str]:
        return [r[0] for r in self._rows("SELECT source FROM pending WHERE collection = %s", (collection,))]

    # -- sections -----------------------------------------------------------------------------

    def sections(self, collection: str, documents: Iterable[tuple[str, str]]) -> dict[str, list[Section]]:
        wanted = dict(documents)
        if not wanted:
            return {}
        rows = self._rows(
            "SELECT source, content_hash, idx, first_chunk, last_chunk, first_page, last_page, tokens, target"
            " FROM sections WHERE collection = %s AND source = ANY(%s) ORDER BY source, idx",
            (collection, sorted(wanted)))
        out: dict[str, list[Section]] = {}
        for row in rows:
            if wanted[row[0]] == row[1]:
                out.setdefault(row[0], []).append(Section(*row))
        return out

    def backfill_sections(self, collection: str, sections: Sequence[Section]) -> bool:
        if not sections:
            return True
        source, content_hash = sections[0].source, sections[0].content_hash
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.execute("SELECT content_hash FROM documents WHERE collection = %s AND source = %s FOR UPDATE",
                            (collection, source))
                row = cur.fetchone()
                if row is not None and row[0] == content_hash:
                    cur.execute("DELETE FROM sections WHERE collection = %s AND source = %s", (collection, source))
                    cur.executemany("INSERT INTO sections VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                                    [(collection, s.source, s.content_hash, s.index, s.first, s.last,
                                      s.first_page, s.last_page, s.tokens, s.target) for s in sections])
        except self._error:
            return False
        return True

    # -- reading chunks -----------------------------------------------------------------------

    def _terms(self, collection: str, query: str) -> list[tuple[str, float]]:
        """The query's terms, split by the server exactly as the index is (``pg_schema.LEXEMES``), each
        with BM25's inverse document frequency in the collection, so that a rare word ("midi")
        outweighs the common ones around it ("what", "does", "have"): ``ts_rank`` alone has no
        corpus statistics. Two small queries, each answered from the GIN index."""
        n, counts = self._lexeme_counts(collection, query)
        return [(lx, math.log(1 + (n - df + 0.5) / (df + 0.5))) for lx, df in counts.items() if df]

    def _lexeme_counts(self, collection: str, query: str) -> tuple[int, dict[str, int]]:
        """The collection's chunk count and, for each of the query's lexemes, the chunks holding it."""
        if not words(query):  # no word at all: nothing to ask the server
            return 0, {}
        lexemes = [r[0] for r in self._rows("SELECT lexeme FROM unnest(" + LEXEMES.format("%s") + ")",
                                            (query_text(query),))
                   if "'" not in r[0] and "\\" not in r[0]]
        if not lexemes:
            return 0, {}
        counts = self._rows(
            "SELECT (SELECT coalesce(sum(n_chunks), 0) FROM documents WHERE collection = %s), "
            + ", ".join(["(SELECT count(*) FROM chunks WHERE collection = %s AND tsv @@ %s::tsquery)"] * len(lexemes)),
            [collection, *[a for lx in lexemes for a in (collection, _quoted(lx))]])[0]
        n = max(int(counts[0]), *counts[1:], 1)  # a document being rewritten may count chunks twice for a moment
        return n, {lx: int(df) for lx, df in zip(lexemes, counts[1:])}

    def term_stats(self, collection: str, query: str, chunk_id: str) -> "tuple[TermStats, set[str]]":
        """The query's lexemes with their document frequencies (0 for lexemes no chunk holds), and
        those of them that the chunk ``chunk_id`` holds (see :mod:`pipeline.retrieval.fusion`)."""
        n, df = self._lexeme_counts(collection, query)
        if not df:
            return TermStats(0, {}), set()
        held = self._rows("SELECT tsvector_to_array(tsv) FROM chunks WHERE collection = %s AND chunk_id = %s",
                          (collection, chunk_id))
        matched = set(held[0][0] or ()) & set(df) if held else set()
        return TermStats(n, df), matched

    def _scored(self, terms: list[tuple[str, float]], where: str, columns: str) -> str:
        """A query for the chunks matching any term under ``where``, with their score last: each
        term's ``ts_rank`` (length-normalised, saturating in the term's frequency) times its idf,
        summed. The inner query detoasts each chunk's ``tsvector`` once for all the terms."""
        score = " + ".join(f"%(idf{i})s * ts_rank(x.tsv, %(q{i})s::tsquery, 1)" for i in range(len(terms)))
        return (f"SELECT {columns}, {score} AS score FROM (SELECT {_CHUNK}, tsv || ''::tsvector AS tsv"
                f" FROM chunks WHERE {where} AND tsv @@ %(any)s::tsquery OFFSET 0) x")

    @staticmethod
    def _params(terms: list[tuple[str, float]], **more) -> dict:
        params = dict(more, any=" | ".join(_quoted(t) for t, _ in terms))
        for i, (t, idf) in enumerate(terms):
            params[f"q{i}"], params[f"idf{i}"] = _quoted(t), idf
        return params

    def search(self, collection: str, query: str, *, limit: int, source: str | Sequence[str] | None = None
               ) -> list[tuple[StoredChunk, float]]:
        """Full-text hits ranked by idf-weighted ``ts_rank`` (see :meth:`_terms`), best first
        (positive scores, higher is better)."""
        terms = self._terms(collection, query)
        if not terms:
            return []
        sources = [] if not source else [source] if isinstance(source, str) else list(source)
        where = "collection = %(collection)s" + (" AND source = ANY(%(sources)s)" if sources else "")
        cols = ", ".join("x." + c.strip() for c in _CHUNK.split(","))
        rows = self._rows(self._scored(terms, where, cols) + " ORDER BY score DESC, x.chunk_id LIMIT %(limit)s",
                          self._params(terms, collection=collection, sources=sources, limit=limit))
        return [(StoredChunk(*r[:9]), float(r[9])) for r in rows]

    def bm25(self, collection: str, query: str, chunk_ids: Sequence[str]) -> dict[str, float]:
        """Full-text scores of these chunks for ``query`` (the same scale as :meth:`search`)."""
        terms = self._terms(collection, query) if chunk_ids else []
        if not terms:
            return {}
        rows = self._rows(self._scored(terms, "collection = %(collection)s AND chunk_id = ANY(%(ids)s)", "x.chunk_id"),
                          self._params(terms, collection=collection, ids=list(chunk_ids)))
        return {cid: float(score) for cid, score in rows}

    def chunks(self, collection: str, source: str, *, first: int = 0, last: int | None = None
               ) -> list[StoredChunk]:
        rows = self._rows(
            f"SELECT {_CHUNK} FROM chunks WHERE collection = %s AND source = %s AND idx >= %s AND idx <= %s"
            " ORDER BY idx", (collection, source, first, last if last is not None else 2**31 - 1))
        return [StoredChunk(*r) for r in rows]

    def totals(self, collection: str) -> tuple[int, int, int]:
        row = self._rows("SELECT COUNT(*), COALESCE(SUM(n_chunks), 0), COALESCE(SUM(n_tokens), 0) FROM documents"
                         " WHERE collection = %s", (collection,))[0]
        return int(row[0]), int(row[1]), int(row[2])

    def chunks_by_id(self, collection: str, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        rows = self._rows(f"SELECT {_CHUNK} FROM chunks WHERE collection = %s AND chunk_id = ANY(%s)",
                          (collection, list(chunk_ids)))
        return {r[0]: StoredChunk(*r) for r in rows}

    # -- the chunks' vectors (see .exact) -------------------------------------------------------

    def vector_coverage(self, collection: str, source: str | Sequence[str] | None = None) -> tuple[int, bool]:
        where, args = _of_sources(source)
        chunks = self._rows(f"SELECT COALESCE(SUM(n_chunks), 0) FROM documents WHERE collection = %s{where}",
                            (collection, *args))[0][0]
        lacking = self._rows(f"SELECT 1 FROM chunks WHERE collection = %s{where} AND vector IS NULL LIMIT 1",
                             (collection, *args))
        return int(chunks), not lacking

    def vectors(self, collection: str, *, source: str | Sequence[str] | None = None,
                chunk_ids: Sequence[str] | None = None) -> list[tuple[str, bytes]]:
        if chunk_ids is not None:
            where, args = " AND chunk_id = ANY(%s)", [list(chunk_ids)]
        else:
            where, args = _of_sources(source)
        return [(cid, bytes(v)) for cid, v in self._rows(
            f"SELECT chunk_id, vector FROM chunks WHERE collection = %s{where} AND vector IS NOT NULL",
            (collection, *args))]

    def missing_vectors(self, collection: str, *, limit: int) -> list[str]:
        return [r[0] for r in self._rows("SELECT chunk_id FROM chunks WHERE collection = %s AND vector IS NULL"
                                         " LIMIT %s", (collection, limit))]

    def set_vectors(self, collection: str, vectors: Sequence[tuple[str, bytes]]) -> None:
        with self.conn.transaction(), self.conn.cursor() as cur:
            cur.executemany("UPDATE chunks SET vector = %s WHERE collection = %s AND chunk_id = %s"
                            " AND vector IS NULL", [(blob, collection, cid) for cid, blob in vectors])


def _of_sources(source: str | Sequence[str] | None) -> tuple[str, list]:
    """A ``WHERE`` clause's continuation (and its argument) for chunks of ``source``: one document or several."""
    sources = [] if not source else [source] if isinstance(source, str) else list(source)
    return (" AND source = ANY(%s)", [sources]) if sources else ("", [])
