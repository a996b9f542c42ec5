"""Building and keeping a collection: ingest with the configured settings, what it holds, its
sections, dropping it; the store's other collections, and a runtime over one of them.

The operations behind :meth:`Pipeline.ingest <pipeline.api.Pipeline.ingest>`,
:meth:`~pipeline.api.Pipeline.status`, :meth:`~pipeline.api.Pipeline.sections`,
:meth:`~pipeline.api.Pipeline.recut_sections` and :meth:`~pipeline.api.Pipeline.drop`, over a
:class:`~pipeline.runtime.Runtime`. The work itself is :mod:`pipeline.ingest` and
:mod:`pipeline.store`; this maps the settings onto it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from ._testhooks import crash_point
from .errors import InputError, StoreError, redact
from .ingest.run import IngestReport, Progress, ingest as ingest_scanned
from .ingest.scan import scan
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
    # A missing path, or nothing to read under the paths, fails before any model loads or the store opens.
    scanned = scan(paths, include=tuple(include), exclude=tuple(exclude), follow_symlinks=follow)
    if not scanned.files and not scanned.problems and not prune:
        filters = " matching --include/--exclude" if include or exclude else ""
        raise InputError(f"no files{filters} under {', '.join(str(p) for p in paths)}: nothing to ingest "
                         "(PDF, Markdown, text and HTML files are read; hidden files and folders are skipped)")
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


def collections(rt: "Runtime") -> list[dict]:
    """:meth:`Pipeline.collections <pipeline.api.Pipeline.collections>`: the store's collections, with
    their documents and chunks, by name; never creates anything."""
    if not _exists(rt):
        return []
    with rt.store(create=False) as store:
        out = []
        for name in sorted(store.catalog.collections()):
            docs, chunks, _ = store.catalog.totals(name)
            out.append({"name": name, "documents": docs, "chunks": chunks})
        return out


class SiblingRuntime(Runtime):
    """A runtime over another collection of the same store that shares everything of ``parent`` but the
    collection: its models, engines, caches, calibrations, pack history and open store (one process
    lock). What a server answering several collections asks them with
    (:meth:`Pipeline.for_collection <pipeline.api.Pipeline.for_collection>`).
    Closing it closes nothing: the parent owns what they share."""

    SHARED = ("embedder", "engine", "pool", "prefix_cache", "ram_states", "calibrations", "pack_history",
              "section_memo", "compose_policy", "stops")

    def __init__(self, parent: Runtime, collection: str):
        config = dataclasses.replace(parent.config, store=dataclasses.replace(parent.config.store,
                                                                              collection=collection))
        super().__init__(config, log=parent.log)
        self._parent = parent
        self._stores = parent._stores

    embedder = property(lambda self: self._parent.embedder)
    engine = property(lambda self: self._parent.engine)
    pool = property(lambda self: self._parent.pool)
    prefix_cache = property(lambda self: self._parent.prefix_cache)
    ram_states = property(lambda self: self._parent.ram_states)
    calibrations = property(lambda self: self._parent.calibrations)
    pack_history = property(lambda self: self._parent.pack_history)
    section_memo = property(lambda self: self._parent.section_memo)
    compose_policy = property(lambda self: self._parent.compose_policy)
    stops = property(lambda self: self._parent.stops)

    def has(self, name: str) -> bool:
        return self._parent.has(name) if name in self.SHARED else super().has(name)

    def given(self, name: str) -> bool:
        return self._parent.given(name) if name in self.SHARED else super().given(name)

    def layout(self, system: str | None = None):
        return self._parent.layout(system)

    def after_answer(self, engine) -> None:
        self._parent.after_answer(engine)

    @property
    def settling(self) -> bool:
        return self._parent.settling

    def settle(self, *, cancel: bool = False) -> None:
        self._parent.settle(cancel=cancel)

    #: One warming at a time for the engine they share: the parent's (``Runtime.__init__``'s None is not kept).
    warming = property(lambda self: self._parent.warming, lambda self, _job: None)

    def stop_warming(self) -> None:
        self._parent.stop_warming()

    def start_warming(self, start: Callable[[], Any]) -> Any:
        return self._parent.start_warming(start)

    def close(self) -> None:
        """Nothing to close: the parent owns what this shares."""


@dataclass(frozen=True)
class SectionsReport:
    """How a collection's documents are cut into sections, against the size new documents get.

    ``by_target`` maps each size sections were cut to (embedder tokens) to
    ``(documents, sections)``; ``target`` is the size the settings cut new documents to now
    (``chunking.section_tokens``, or the default for the generator's context). Documents
    committed before sections existed have none yet (``uncut``): packing cuts theirs at
    ``target`` the first time it needs them.
    """

    collection: str
    target: int
    documents: int
    sections: int
    by_target: dict[int, tuple[int, int]]
    uncut: int = 0
    recut: int = 0  # documents cut again by this call (recut_sections)

    @property
    def stale(self) -> int:
        """Documents whose sections were cut to another size than ``target``."""
        return sum(d for t, (d, _) in self.by_target.items() if t != self.target)

    def to_dict(self) -> dict:
        return {"collection": self.collection, "target": self.target, "documents": self.documents,
                "sections": self.sections, "uncut": self.uncut, "stale": self.stale, "recut": self.recut,
                "by_target": [{"target": t, "documents": d, "sections": n}
                              for t, (d, n) in sorted(self.by_target.items())]}


def sections(rt: "Runtime", *, recut: bool = False,
             progress: Callable[[int, int], None] | None = None) -> SectionsReport:
    """:meth:`Pipeline.sections <pipeline.api.Pipeline.sections>` and, with ``recut``,
    :meth:`~pipeline.api.Pipeline.recut_sections`: how the collection is cut, after cutting every
    document whose sections have another size than the settings' again from its stored chunks
    (nothing is embedded). Each document's sections are replaced in one transaction, and only
    while the document is still the version they were cut from, so a concurrent ingest or
    question sees each document's old sections or its new ones, never a mix of both. Prompts
    built from the new sections differ from the old ones: their saved prefix and section states
    go unused (the cache evicts them in time), and the first question over them prefills again.
    ``progress(done, total)`` is called after each document looked at.
    """
    from .ingest.sections import cut

    target = rt.section_tokens
    name = rt.config.store.collection
    if not _exists(rt):
        raise StoreError(f"collection '{name}' does not exist in {rt.config.store_path}; run `rag ingest PATH` first")
    recut_docs = 0
    with rt.store(create=False) as store:
        store.require()
        docs = store.documents()
        cut_now = store.catalog.sections(store.name, [(s, d.content_hash) for s, d in docs.items()])
        order = sorted(docs)
        for i, source in enumerate(order, 1):
            old = cut_now.get(source, [])
            if recut and old and any(x.target != target for x in old):
                new = cut(source, docs[source].content_hash, store.catalog.chunks(store.name, source), target=target)
                if not store.catalog.backfill_sections(store.name, new):
                    raise StoreError(f"could not write the sections of {source} to {store.where} (is the "
                                     f"store read-only?); {recut_docs} documents before it were cut again")
                cut_now[source] = new
                recut_docs += 1
                crash_point("SECTIONS_RECUT")
            if progress is not None:
                progress(i, len(order))
    by_target: dict[int, tuple[int, int]] = {}
    for secs in cut_now.values():
        for t in {x.target for x in secs}:
            d, n = by_target.get(t, (0, 0))
            by_target[t] = (d + 1, n + sum(1 for x in secs if x.target == t))
    return SectionsReport(collection=name, target=target, documents=len(docs),
                          sections=sum(len(v) for v in cut_now.values()), by_target=by_target,
                          uncut=sum(1 for s in docs if not cut_now.get(s)), recut=recut_docs)


def drop(rt: "Runtime") -> bool:
    """:meth:`Pipeline.drop <pipeline.api.Pipeline.drop>`: delete the collection; False if it did not exist."""
    if not _exists(rt):
        return False
    with rt.store(create=False) as store:
        if store.info is None:
            return False
        store.drop()
        return True


__all__ = ["CollectionStatus", "SectionsReport", "SiblingRuntime", "collections", "drop", "ingest", "sections",
           "status"]
