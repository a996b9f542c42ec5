"""Building and keeping a collection: ingest with the configured settings, what it holds, dropping it.

The operations behind :meth:`Pipeline.ingest <pipeline.api.Pipeline.ingest>`,
:meth:`~pipeline.api.Pipeline.status` and :meth:`~pipeline.api.Pipeline.drop`, over a
:class:`~pipeline.runtime.Runtime`. The work itself is :mod:`pipeline.ingest` and
:mod:`pipeline.store`; this maps the settings onto it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from .errors import redact
from .ingest.run import IngestReport, Progress, ingest as ingest_scanned
from .ingest.scan import scan

if TYPE_CHECKING:
    from .runtime import Runtime


@dataclass(frozen=True)
class CollectionStatus:
    """What a collection holds."""

    collection: str
    store: str
    exists: bool
    documents: int = 0
    chunks: int = 0
    tokens: int = 0
    dense_chunks: int = 0
    embedder: str | None = None
    dim: int | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    collections: tuple[str, ...] = ()
    generator: str | None = None
    sources: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["collections"] = list(self.collections)
        d["sources"] = list(self.sources)
        return d


def ingest(rt: "Runtime", paths: Iterable[str | Path], *, prune: bool = False, include: Iterable[str] = (),
           exclude: Iterable[str] = (), follow_symlinks: bool | None = None,
           progress: Progress | None = None) -> IngestReport:
    """:meth:`Pipeline.ingest <pipeline.api.Pipeline.ingest>`: the files under ``paths`` scanned, then
    embedded into the collection with the configured chunking (see :func:`.ingest.run.ingest`)."""
    i, c = rt.config.ingest, rt.config.chunking
    follow = i.follow_symlinks if follow_symlinks is None else follow_symlinks
    # A missing path fails before any model loads or the store opens.
    scanned = scan(paths, include=tuple(include), exclude=tuple(exclude), follow_symlinks=follow)
    with rt.store() as store:
        ref = None if rt.given("embedder") else rt.config.models.embedder
        expand = None
        if c.doc2query:
            from .ingest.doc2query import Doc2QueryChunker

            def expand(chunker):
                return Doc2QueryChunker(chunker, rt.engine, n=c.doc2query)
        return ingest_scanned(scanned, store=store, embedder=rt.embedder, chunk_size=c.size,
                              chunk_overlap=c.overlap, section_tokens=rt.section_tokens, embedder_ref=ref,
                              prune=prune, max_bytes=int(i.max_file_mb * 2**20), contextual=c.contextual,
                              expand_chunker=expand, progress=progress)


def _exists(rt: "Runtime") -> bool:
    """Whether a store may exist where the settings point (an embedded store is a directory with a catalog)."""
    return bool(rt.config.store.catalog_url) or (rt.config.store_path / "catalog.sqlite").exists()


def status(rt: "Runtime") -> CollectionStatus:
    """:meth:`Pipeline.status <pipeline.api.Pipeline.status>`: what the collection holds; never creates
    anything."""
    name = rt.config.store.collection
    generator = redact(rt.config.models.generator)
    if not _exists(rt):
        return CollectionStatus(collection=name, store=str(rt.config.store_path), exists=False, generator=generator)
    with rt.store(create=False) as store:
        info = store.info
        if info is None:
            return CollectionStatus(collection=name, store=store.where, exists=False,
                                    collections=tuple(store.catalog.collections()), generator=generator)
        docs, chunks, tokens = store.catalog.totals(name)
        sources = tuple(
            {"source": r.source, "format": r.format, "chunks": r.n_chunks, "tokens": r.n_tokens,
             "pages": r.pages, "title": r.title}
            for r in sorted(store.documents().values(), key=lambda r: r.source))
        return CollectionStatus(
            collection=name, store=store.where, exists=True, documents=docs, chunks=chunks,
            tokens=tokens, dense_chunks=store.chunk_count(), embedder=info.embedder, dim=info.dim,
            chunk_size=info.chunk_size, chunk_overlap=info.chunk_overlap,
            collections=tuple(store.catalog.collections()), generator=generator, sources=sources)


def drop(rt: "Runtime") -> bool:
    """:meth:`Pipeline.drop <pipeline.api.Pipeline.drop>`: delete the collection; False if it did not exist."""
    if not _exists(rt):
        return False
    with rt.store(create=False) as store:
        if store.info is None:
            return False
        store.drop()
        return True


__all__ = ["CollectionStatus", "drop", "ingest", "status"]
