"""The store: a Chroma collection for dense vectors plus the catalog (record + BM25), kept in agreement.

Commit protocol for one document, designed so that a crash (``kill -9``) at any
moment leaves nothing half-visible and nothing duplicated:

1. the source is written to the catalog's ``pending`` journal;
2. its chunks are upserted into Chroma under ids derived from (source, content
   hash, index), so a retry rewrites the same ids instead of adding copies;
3. one SQLite transaction replaces the document's record, chunks and full-text
   rows: the commit point;
4. Chroma's chunks of any other version of that source are deleted, and the
   journal entry is cleared.

Crash point ``BEFORE_COMMIT`` (:mod:`pipeline._testhooks`): with ``RAG_TEST_KILL_BEFORE_COMMIT=N``
set, the process SIGKILLs itself after writing the vectors of its Nth document, before the
commit point (step 3), so the crash tests stop an ingest exactly mid-document.

Dense hits are filtered against the catalog, so chunks written before a crash
are never returned, and every open of the store finishes the journal's pending
cleanups first. The catalog also keeps each chunk's vector (written at the commit
point with the rest), so a small collection's dense search is answered from it
exactly, without starting Chroma (:mod:`.exact`).

Embedded (the default), only one process opens a store at a time (see :mod:`.lock`).
With a Chroma server (``url``) and a PostgreSQL catalog (``catalog_url``), any number of
processes on any number of machines share one collection, and the protocol holds across
them: steps 1-4 run under the catalog's lock on that one document (a PostgreSQL advisory
lock, released by the server when its holder dies), taken before the journal entry, so
a reconcile never deletes vectors that another live process is about to commit, and the
cleanups of a crashed process are finished by the next process that opens the store.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from .._testhooks import crash_point
from ..errors import StoreError, redact
from ..records import Chunk, CollectionInfo, DocumentRecord, Section, StoredChunk
from . import exact
from .catalog import Catalog
from .failures import storage_error
from .lock import StoreLock
from .names import check_collection_name
from .vectors import client as vector_client

if TYPE_CHECKING:
    import numpy as np

__all__ = ["Store", "check_collection_name", "chunk_id"]

DENSE_OVERFETCH = 100  # nearest neighbours asked of Chroma at least, of which the best are kept (see Store.dense)


def _where_source(source: str | Sequence[str] | None) -> dict | None:
    """Chroma's filter for chunks of one document or of several."""
    if not source:
        return None
    return {"source": source} if isinstance(source, str) else {"source": {"$in": list(source)}}


def chunk_id(source: str, content_hash: str, index: int) -> str:
    return f"{hashlib.sha1(source.encode()).hexdigest()[:16]}-{content_hash[:16]}-{index:06d}"


class Store:
    """One collection's store. Use as a context manager.

    Embedded, the store is the directory ``path``, opened by one process at a time. ``url``
    (a Chroma server) and ``catalog_url`` (a PostgreSQL catalog), both given, put it on
    servers: no directory and no lock, and any number of processes open it at once.
    """

    def __init__(self, path: Path, collection: str, *, wait: float = 10.0, create: bool = True,
                 url: str = "", catalog_url: str = "", shared=None, timeout: float = 30.0):
        """``create=False`` opens an existing store only: reads never create one. ``shared`` (a
        :class:`~.shared.SharedStore`) supplies the process lock and Chroma client of this process's
        threads (embedded stores only)."""
        self.path = Path(path)
        self.create = create
        self.name = check_collection_name(collection)
        self.url = url
        self.timeout = timeout  # seconds a Chroma server may take per request
        self.catalog_url = catalog_url
        self.on_servers = bool(url and catalog_url)
        self._lock = None if self.on_servers else StoreLock(self.path, wait=wait)
        self._shared = None if self.on_servers else shared
        self._entered = False
        self._client = None
        self._collection = None
        self._max_batch: int | None = None
        self.catalog: Catalog | None = None

    @property
    def where(self) -> str:
        """The store as messages name it (no password)."""
        if self.catalog_url:
            return f"{redact(self.catalog_url)} + {self.url or self.path / 'chroma'}"
        return str(self.path) if not self.url else f"{self.path} + {self.url}"

    # -- lifecycle --------------------------------------------------------------------------

    def open(self) -> "Store":
        if not self.on_servers:
            self._open_directory()
        try:
            if self.catalog_url:
                from .catalog_pg import PostgresCatalog

                self.catalog = PostgresCatalog(self.catalog_url)
            else:
                from .catalog_sqlite import SQLiteCatalog

                self.catalog = SQLiteCatalog(self.path / "catalog.sqlite")
            if self.catalog.collection(self.name) is not None and (
                    self._shared is None or self._shared.first_view(self.name)):
                with self._writing():
                    self._finish_pending()
        except BaseException:
            self.close()
            raise
        return self

    def _open_directory(self) -> None:
        """Create (or check) the store directory and take its lock: the embedded parts live there."""
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"store path is not a directory: {self.path}")
        if not self.create and not self.catalog_url and not (self.path / "catalog.sqlite").is_file():
            raise StoreError(f"collection '{self.name}' does not exist: there is no store at {self.path} "
                             "(run `rag ingest PATH` first, or give the right --store)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the store directory {self.path}: {exc.strerror}") from None
        if self._shared is not None:
            self._shared.enter()
        else:
            self._lock.acquire()
        self._entered = True

    def close(self) -> None:
        if self._shared is not None:  # the client and the lock are the shared store's
            self._client = self._collection = None
            if self.catalog is not None:
                self.catalog.close()
                self.catalog = None
            if self._entered:
                self._entered = False
                self._shared.leave()
            return
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # closing must never mask the real error
                pass
            self._client = self._collection = None
        if self.catalog is not None:
            self.catalog.close()
            self.catalog = None
        if self._lock is not None and self._entered:
            self._entered = False
            self._lock.release()

    def __enter__(self) -> "Store":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _writing(self, doing: str = "writing to") -> Iterator[None]:
        """Turn a failed write or read (full disk, read-only files, a Chroma error, a Chroma server
        that does not answer) into a :class:`StoreError`."""
        try:
            yield
        except (OSError, sqlite3.Error) as exc:
            raise storage_error(exc, self.path, doing=doing) from None
        except Exception as exc:
            # Chroma (embedded or its HTTP client), PostgreSQL: the store's state; anything else is a bug.
            if not type(exc).__module__.startswith(("chromadb", "psycopg", "httpx")):
                raise
            if self.url and "timeout" in type(exc).__name__.lower():
                raise StoreError(f"the Chroma server at {redact(self.url)} did not answer within store.timeout "
                                 f"({self.timeout:g} s): is it stopped or overloaded? (raise store.timeout "
                                 "for a slow server)") from None
            if self.on_servers:
                raise StoreError(f"{doing} the store {self.where} failed: "
                                 f"{' '.join(str(exc).split())[:300] or type(exc).__name__}") from None
            raise storage_error(exc, self.path, doing=doing) from None

    @property
    def _chroma(self):
        if self._client is None and self._shared is not None:
            self._client = self._shared.client()
        if self._client is None:
            self._client = vector_client(path=self.path, url=self.url, timeout=self.timeout)
        return self._client

    def _batch_size(self) -> int:
        """The most records one upsert may carry, as the Chroma client (or server) reports it."""
        if self._max_batch is None:
            self._max_batch = max(1, int(self._chroma.get_max_batch_size()))
        return self._max_batch

    def _col(self):
        """The Chroma collection (cosine space). The catalog decides whether the collection exists."""
        if self._collection is None:
            with self._writing(doing="opening"):
                self._collection = self._chroma.get_or_create_collection(
                    self.name, configuration={"hnsw": {"space": "cosine"}}, embedding_function=None)
        return self._collection

    # -- collections ------------------------------------------------------------------------

    @property
    def info(self) -> CollectionInfo | None:
        return self.catalog.collection(self.name)

    def require(self) -> CollectionInfo:
        """The collection's info, or a :class:`StoreError` that says what exists instead."""
        info = self.info
        if info is None:
            others = self.catalog.collections()
            hint = f" (collections here: {', '.join(others)})" if others else ""
            raise StoreError(f"collection '{self.name}' does not exist in {self.where}{hint}; "
                             "run `rag ingest PATH` first")
        return info

    def ensure_collection(self, *, embedder: str, embedder_id: str, dim: int,
                          chunk_size: int, chunk_overlap: int) -> CollectionInfo:
        """Create the collection, or check that it was built with the same embedder and chunking."""
        info = self.info
        if info is None:
            with self._writing(), self.catalog.collection_lock(self.name):
                info = self.info  # again, under the lock: another process may have created it meanwhile
                if info is None:
                    info = CollectionInfo(self.name, embedder, embedder_id, dim, chunk_size, chunk_overlap,
                                          time.time())
                    try:  # vectors left by a drop that crashed half-way are not part of the new collection
                        self._chroma.delete_collection(self.name)
                    except Exception:
                        pass
                    self._collection = None
                    self._col()  # first: a collection Chroma refuses never reaches the catalog
                    self.catalog.create_collection(info)
                    return info
        self.check_compatible(embedder=embedder, embedder_id=embedder_id, chunk_size=chunk_size,
                              chunk_overlap=chunk_overlap)
        return info

    def check_compatible(self, *, embedder: str, embedder_id: str, chunk_size: int,
                         chunk_overlap: int) -> None:
        """Refuse to mix vectors of two embedders, or chunks of two sizes, in one collection."""
        info = self.info
        if info is None:
            return
        self.check_embedder(embedder=embedder, embedder_id=embedder_id)
        if (info.chunk_size, info.chunk_overlap) != (chunk_size, chunk_overlap):
            raise StoreError(
                f"collection '{self.name}' was chunked with size {info.chunk_size} / overlap "
                f"{info.chunk_overlap}; the configuration says {chunk_size} / {chunk_overlap}. "
                "Use another --collection, or `rag drop` this one first")

    def check_embedder(self, *, embedder: str, embedder_id: str) -> None:
        """Refuse to compare vectors of two embedders: ingest, search and ask say so alike."""
        info = self.info
        if info is not None and info.embedder_id != embedder_id:
            if info.embedder_id.split("+doc:")[0] == embedder_id.split("+doc:")[0]:  # see engine.embed_prompts
                raise StoreError(
                    f"collection '{self.name}' was built with the same embedder but another document prefix "
                    "(models.embedder_document_prefix); use that one, another --collection, or `rag drop` "
                    "this one first")
            raise StoreError(
                f"collection '{self.name}' was built with the embedder {info.embedder}; the configured "
                f"one is {embedder} (a different model file). Use another --collection, or "
                "`rag drop` this one first")

    def drop(self) -> None:
        """Delete the collection: from the catalog first (the commit point), then from Chroma."""
        with self._writing(), self.catalog.collection_lock(self.name):
            self.catalog.drop_collection(self.name)
            try:  # under the lock: a process creating the collection anew waits for this delete
                self._chroma.delete_collection(self.name)
            except Exception:
                pass
            self._collection = None

    # -- documents --------------------------------------------------------------------------

    def documents(self) -> dict[str, DocumentRecord]:
        return self.catalog.documents(self.name)

    def document(self, source: str) -> DocumentRecord | None:
        """The committed document named exactly ``source`` (as :meth:`documents` names it), or None."""
        return self.catalog.document(self.name, source)

    def write_document(self, doc: DocumentRecord, chunks: Sequence["Chunk"], vectors: "np.ndarray",
                       sections: Sequence["Section"] = ()) -> None:
        """Make ``doc`` with these chunks, vectors and sections the committed version of its source."""
        import numpy as np

        if len(chunks) != len(vectors):
            raise ValueError("one vector per chunk")
        ids = [chunk_id(doc.source, doc.content_hash, c.index) for c in chunks]
        with self._writing(), self.catalog.document_lock(self.name, doc.source):
            committed = self.catalog.document(self.name, doc.source)
            if committed is not None and committed.content_hash == doc.content_hash \
                    and committed.n_chunks == len(chunks):
                return  # another process committed this very version while we embedded it
            self.catalog.mark_pending(self.name, doc.source)
            col = self._col()
            step = self._batch_size()
            for lo in range(0, len(chunks), step):
                part = chunks[lo:lo + step]
                col.upsert(
                    ids=ids[lo:lo + step],
                    embeddings=np.ascontiguousarray(vectors[lo:lo + step], dtype=np.float32),
                    documents=[c.text for c in part],
                    metadatas=[{"source": doc.source, "content_hash": doc.content_hash, "idx": c.index,
                                "page": c.page if c.page is not None else -1, "start": c.start,
                                "end": c.end, "tokens": c.tokens} for c in part],
                )
            crash_point("BEFORE_COMMIT")
            self.catalog.commit_document(self.name, doc, chunks, ids, sections, vectors=exact.encode(vectors))
            self._reconcile(doc.source, keep=doc.content_hash)

    def touch_document(self, source: str, *, size: int, mtime_ns: int) -> None:
        with self._writing():
            self.catalog.touch_document(self.name, source, size=size, mtime_ns=mtime_ns)

    def remove_document(self, source: str) -> None:
        with self._writing(), self.catalog.document_lock(self.name, source):
            self.catalog.mark_pending(self.name, source)
            self.catalog.remove_document(self.name, source)
            self._reconcile(source, keep=None)

    def _reconcile(self, source: str, *, keep: str | None) -> None:
        where = {"source": source} if keep is None else {
            "$and": [{"source": source}, {"content_hash": {"$ne": keep}}]}
        self._col().delete(where=where)
        self.catalog.clear_pending(self.name, source)

    def _finish_pending(self) -> None:
        """Finish the cleanups of writes that stopped half-way; a live writer's own are left to it."""
        for source in self.catalog.pending(self.name):
            with self.catalog.document_lock(self.name, source, wait=False) as free:
                if free:
                    record = self.catalog.document(self.name, source)
                    self._reconcile(source, keep=record.content_hash if record else None)

    # -- queries ----------------------------------------------------------------------------

    def dense(self, vector: "np.ndarray", *, limit: int, source: str | Sequence[str] | None = None
              ) -> list[tuple[StoredChunk, float]]:
        """Nearest committed chunks (of ``source``: one document or several) with their cosine similarity:
        ranked exactly from the catalog's vectors where the search is small (:mod:`.exact`), else by Chroma."""
        import numpy as np

        with self._writing(doing="reading"):
            found = exact.nearest(self.catalog, self.name, vector, limit=limit, source=source)
        if found is not None:
            return found
        col = self._col()
        committed = self.catalog.committed_hashes(self.name)
        hits: list[tuple[StoredChunk, float]] = []
        with self._writing(doing="reading"):
            count = col.count()
            n = min(limit, count)
            if n == 0:
                return []
            # HNSW is approximate, and its misses differed from process to process: with Chroma's
            # defaults, 8 of 20 queries over 1,841 chunks got the exact 40 nearest. Asking for ten
            # times as many (ids and distances only: as fast) and keeping the nearest gave 19 of 20;
            # the kept ones' texts and metadata are then read by id.
            res = col.query(query_embeddings=np.asarray(vector, dtype=np.float32).reshape(1, -1),
                            n_results=min(count, max(10 * n, DENSE_OVERFETCH)), include=["distances"],
                            where=_where_source(source))
            ranked = sorted(zip(res["distances"][0], res["ids"][0]))
            start = 0
            while len(hits) < n and start < len(ranked):
                batch = ranked[start:start + 2 * n]
                start += len(batch)
                got = col.get(ids=[cid for _, cid in batch], include=["metadatas", "documents"])
                found = {cid: (meta, text) for cid, meta, text in zip(got["ids"], got["metadatas"], got["documents"])}
                for dist, cid in batch:
                    if cid not in found:
                        continue
                    meta, text = found[cid]
                    if committed.get(meta["source"]) != meta["content_hash"]:
                        continue  # written before a crash or being replaced: not committed
                    page = int(meta["page"])
                    hits.append((StoredChunk(cid, meta["source"], meta["content_hash"], int(meta["idx"]),
                                             page if page >= 0 else None, int(meta["start"]), int(meta["end"]),
                                             int(meta["tokens"]), text), 1.0 - float(dist)))
        return hits[:n]

    def lexical(self, query: str, *, limit: int, source: str | Sequence[str] | None = None
                ) -> list[tuple[StoredChunk, float]]:
        return self.catalog.search(self.name, query, limit=limit, source=source)

    def vectors(self, chunk_ids: list[str]) -> dict[str, "np.ndarray"]:
        """The stored embeddings of these chunks (for MMR and reranking): the catalog's, else Chroma's."""
        import numpy as np

        if not chunk_ids:
            return {}
        with self._writing(doing="reading"):
            kept = self.catalog.vectors(self.name, chunk_ids=chunk_ids)
        found = dict(zip((cid for cid, _ in kept), exact.decode([blob for _, blob in kept])))
        missing = [cid for cid in chunk_ids if cid not in found]
        if missing:
            col = self._col()
            with self._writing(doing="reading"):
                got = col.get(ids=missing, include=["embeddings"])
            found.update((cid, np.asarray(v, dtype=np.float32)) for cid, v in zip(got["ids"], got["embeddings"]))
        return found

    def backfill_vectors(self, *, batch: int = 1000) -> int:
        """Copy into the catalog, from Chroma, the vectors of chunks committed before the catalog kept them
        (so that dense search over them skips Chroma, see :mod:`.exact`); returns how many."""
        done = 0
        while True:
            with self._writing(doing="reading"):
                ids = self.catalog.missing_vectors(self.name, limit=batch)
                if not ids:
                    return done
                got = self._col().get(ids=ids, include=["embeddings"])
            pairs = list(zip(got["ids"], exact.encode(got["embeddings"]))) if len(got["ids"]) else []
            if pairs:
                with self._writing():
                    self.catalog.set_vectors(self.name, pairs)
            done += len(pairs)
            if len(pairs) < len(ids):  # Chroma lacks some: they stay on the Chroma path
                return done

    def chunk_count(self) -> int:
        """Chunks on the dense side, committed or not (for status and consistency checks)."""
        col = self._col()
        with self._writing(doing="reading"):
            return col.count()
