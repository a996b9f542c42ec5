"""The catalog: which documents are committed, their chunks and sections, and the lexical index over them.

:class:`Catalog` is what the store asks of one, whichever database keeps it:
:class:`~.catalog_sqlite.SQLiteCatalog` (a file beside the vectors, one process at a
time behind the store lock) and :class:`~.catalog_pg.PostgresCatalog` (a server many
processes share; ``shared`` is True there, so no store lock is taken). Both make a
document visible to queries in exactly one transaction that writes its row, its chunks,
their full-text entries and its sections, so the lexical side never holds half a
document, and the dense side (Chroma) is filtered against this record: the catalog is
the single source of truth about which documents exist.

:func:`~.terms.words` is the one word splitter both lexical sides (and the adaptive fusion) use
on a query.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Iterable, Protocol, Sequence

from ..records import Chunk, CollectionInfo, DocumentRecord, Section, StoredChunk

class Catalog(Protocol):
    """One store's catalog. An instance is not shared between threads (each thread's store view opens its own)."""

    #: Whether several processes may write through catalogs like this one at once (no store lock needed).
    shared: bool
    #: The catalog schema version found when it was opened (before any migration).
    migrated_from: int | None

    def close(self) -> None: ...

    # -- coordination ---------------------------------------------------------------------------

    def collection_lock(self, name: str) -> AbstractContextManager:
        """Held while a collection is created or dropped."""

    def document_lock(self, collection: str, source: str, *, wait: bool = True) -> AbstractContextManager[bool]:
        """Held while one document is written (yields False when ``wait`` is off and another holds it)."""

    # -- collections ------------------------------------------------------------------------------

    def collection(self, name: str) -> CollectionInfo | None: ...

    def collections(self) -> list[str]: ...

    def create_collection(self, info: CollectionInfo) -> None: ...

    def drop_collection(self, name: str) -> None: ...

    # -- documents --------------------------------------------------------------------------------

    def documents(self, collection: str) -> dict[str, DocumentRecord]: ...

    def document(self, collection: str, source: str) -> DocumentRecord | None: ...

    def committed_hashes(self, collection: str) -> dict[str, str]: ...

    def commit_document(self, collection: str, doc: DocumentRecord, chunks: Sequence[Chunk],
                        chunk_ids: Sequence[str], sections: Sequence[Section] = (),
                        vectors: Sequence[bytes] | None = None) -> None:
        """Replace ``doc.source``'s record, chunks (with their ``vectors``: float32 bytes, one per chunk)
        and sections in one transaction: the commit point."""

    def touch_document(self, collection: str, source: str, *, size: int, mtime_ns: int) -> None:
        """Record a new size/mtime for a document whose content did not change."""

    def remove_document(self, collection: str, source: str) -> None: ...

    # -- the reconcile journal (documents whose vectors may be written but not committed) -----------

    def mark_pending(self, collection: str, source: str) -> None: ...

    def clear_pending(self, collection: str, source: str) -> None: ...

    def pending(self, collection: str) -> list[str]: ...

    # -- sections ---------------------------------------------------------------------------------

    def sections(self, collection: str, documents: Iterable[tuple[str, str]]) -> dict[str, list[Section]]:
        """The sections of each committed ``(source, content_hash)``, in order (see :mod:`.sections`)."""

    def backfill_sections(self, collection: str, sections: Sequence[Section]) -> bool:
        """Record sections cut for a document committed without them; False if nothing could be written."""

    # -- reading chunks ---------------------------------------------------------------------------

    def search(self, collection: str, query: str, *, limit: int, source: str | Sequence[str] | None = None
               ) -> list[tuple[StoredChunk, float]]:
        """Lexical hits (of ``source``: one document or several), best first, with a positive score."""

    def bm25(self, collection: str, query: str, chunk_ids: Sequence[str]) -> dict[str, float]:
        """Lexical scores of these chunks for ``query``; chunks that share no term with it are absent."""

    def chunks(self, collection: str, source: str, *, first: int = 0, last: int | None = None
               ) -> list[StoredChunk]:
        """A committed document's chunks with index in [first, last], in order."""

    def totals(self, collection: str) -> tuple[int, int, int]:
        """(documents, chunks, tokens) committed in ``collection``."""

    def chunks_by_id(self, collection: str, chunk_ids: Sequence[str]) -> dict[str, StoredChunk]:
        """The committed chunks of these ids (those that are)."""

    # -- the chunks' vectors (see .exact) ----------------------------------------------------------

    def vector_coverage(self, collection: str, source: str | Sequence[str] | None = None) -> tuple[int, bool]:
        """(chunks committed in ``collection`` (of ``source``), whether every one has its vector)."""

    def vectors(self, collection: str, *, source: str | Sequence[str] | None = None,
                chunk_ids: Sequence[str] | None = None) -> list[tuple[str, bytes]]:
        """(chunk id, vector) of the committed chunks that have one: of ``source`` or with these ids."""

    def missing_vectors(self, collection: str, *, limit: int) -> list[str]:
        """Up to ``limit`` ids of committed chunks stored without their vector (before schema 5 / 4)."""

    def set_vectors(self, collection: str, vectors: Sequence[tuple[str, bytes]]) -> None:
        """Record the vectors of chunks committed without them (the same ones Chroma holds)."""


__all__ = ["Catalog"]
