"""Orchestration of ``rag ingest``: scan, diff against the store, load → chunk → embed → commit.

A document is identified by its absolute path as found (symlinks not resolved,
see :mod:`.scan`) and versioned by the SHA-256 of its bytes. Unchanged files
(same size and mtime, or same hash) cost nothing; changed ones replace their
old chunks through the store's commit protocol.
Loading and chunking run in a background thread, one document ahead of the
embedder, so that on a multi-core machine they hide behind embedding.

On a shared store (Chroma server + PostgreSQL catalog), several ingests of the same
files split the work: each process starts at a random place in the list of files to embed,
each file is embedded under its document lock, a file whose lock another process holds is
put off to a second pass, and a file that another process has committed at the same
content by then is reported unchanged instead of loaded and embedded again.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..engine.contract import TextEmbedder
from ..errors import LoadError, StoreError
from ..store.store import Store
from ..records import Chunk, DocumentRecord
from .chunking import Chunker, for_embedder
from .loaders import NotADocument, detect_format, load, may_be_text, sniff_text
from .scan import Scan, file_hash
from .sections import cut as cut_sections

# Chunks embedded between two progress events inside one large document.
_SLICE = 32
# Reasons for skipping a file that a summary count says well enough.
_ROUTINE_SKIPS = ("unsupported file type", "not a text file")


@dataclass
class FileOutcome:
    """What happened to one file."""

    path: str
    status: str  # new | changed | unchanged | skipped | failed | removed | missing
    reason: str | None = None
    chunks: int = 0
    tokens: int = 0


@dataclass
class IngestReport:
    """The result of one ingest run: per-file outcomes and totals."""

    files: list[FileOutcome] = field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0
    collection: str = ""
    #: The warming started after it (:meth:`Pipeline.ingest <pipeline.api.Pipeline.ingest>`): a
    #: :class:`~pipeline.warm.job.WarmJob`, or None (off, or not started by the caller).
    warming: Any = field(default=None, repr=False, compare=False)

    def count(self, status: str) -> int:
        return sum(1 for f in self.files if f.status == status)

    @property
    def chunks(self) -> int:
        return sum(f.chunks for f in self.files)

    @property
    def tokens(self) -> int:
        return sum(f.tokens for f in self.files)

    @property
    def failed(self) -> list[FileOutcome]:
        return [f for f in self.files if f.status == "failed"]

    @property
    def nothing_read(self) -> bool:
        """Whether files failed and none was read (new, changed or unchanged): a run that must not look
        like a success."""
        return bool(self.failed) and not any(f.status in ("new", "changed", "unchanged") for f in self.files)

    @property
    def nothing_found(self) -> bool:
        """Whether no file was a document (every one skipped, none read, failed or removed): a run that must
        not look like a success either."""
        return not any(f.status != "skipped" for f in self.files)

    @property
    def notable_skips(self) -> list[FileOutcome]:
        """Skipped files worth a line: special files, links, size limit (not mere file types)."""
        return [f for f in self.files if f.status == "skipped" and not (f.reason or "").startswith(_ROUTINE_SKIPS)]

    def to_dict(self) -> dict:
        statuses = ("new", "changed", "unchanged", "skipped", "failed", "removed", "missing")
        return {
            "collection": self.collection,
            "counts": {s: self.count(s) for s in statuses},
            "chunks": self.chunks,
            "tokens": self.tokens,
            "seconds": round(self.seconds, 3),
            "embed_seconds": round(self.embed_seconds, 3),
            "tokens_per_second": round(self.tokens / self.seconds, 1) if self.seconds and self.tokens else 0.0,
            "files": [asdict(f) for f in self.files],
        }

    def summary(self) -> str:
        n = {s: self.count(s) for s in ("new", "changed", "unchanged", "skipped", "failed", "removed", "missing")}
        parts = [f"{n['new']} new", f"{n['changed']} changed", f"{n['unchanged']} unchanged",
                 f"{n['skipped']} skipped", f"{n['failed']} failed"]
        if n["removed"]:
            parts.append(f"{n['removed']} removed")
        if n["missing"]:
            parts.append(f"{n['missing']} missing (use --prune to remove)")
        head = f"{', '.join(parts)}; "
        if self.chunks:
            rate = f" ({self.tokens / self.seconds:,.0f} tokens/s)" if self.seconds else ""
            return head + f"{self.chunks:,} chunks, {self.tokens:,} tokens embedded in {self.seconds:.1f} s{rate}"
        return head + f"nothing to embed ({self.seconds:.1f} s)"


@dataclass(frozen=True)
class IngestEvent:
    """Progress: ``kind`` is "plan" (``total`` files and ``total_bytes`` to embed), "chunks" (a slice
    of the current file embedded: ``chunks`` of its ``file_chunks`` so far) or "file" (one file
    finished, ``outcome`` set).

    Every event carries the run's totals so far: ``done_chunks`` and ``done_tokens`` embedded,
    and ``done_bytes``, the bytes of finished files plus the embedded share of the current one,
    which measures progress against ``total_bytes`` however long a single file is.
    """

    kind: str
    total: int = 0
    path: str = ""
    chunks: int = 0
    outcome: FileOutcome | None = None
    file_chunks: int = 0
    total_bytes: int = 0
    done_bytes: int = 0
    done_chunks: int = 0
    done_tokens: int = 0


Progress = Callable[[IngestEvent], None]


@dataclass
class _Todo:
    path: Path
    source: str
    status: str
    content_hash: str
    size: int
    mtime_ns: int


def ingest(scanned: Scan, *, store: Store, embedder: TextEmbedder, chunk_size: int,
           chunk_overlap: int, section_tokens: int, embedder_ref: str = "", prune: bool = False,
           max_bytes: int = 0, contextual: bool = False, expand_chunker: Callable[[Chunker], Any] | None = None,
           progress: Progress | None = None) -> IngestReport:
    """Bring the store's collection in line with ``scanned`` (from :func:`.scan.scan`).

    ``store`` must be open. Scanning comes first and apart, so that a missing path fails
    before the store is opened or created. Files over ``max_bytes`` (0 = no limit) are
    skipped and reported. Documents under paths the scan could not read, or did not
    select, are never pruned. With ``contextual``, chunks are embedded and indexed with
    their title and heading path (see :mod:`.chunking`); ``expand_chunker`` wraps the chunker
    (doc2query adds generated questions to each chunk's header). Each new or changed document is
    cut into sections of about ``section_tokens`` embedder tokens (see
    :mod:`pipeline.store.sections`), committed with its chunks; unchanged documents keep theirs.

    Nothing is loaded (no model, no splitter) unless some file needs embedding, so a run
    over an unchanged corpus costs a directory scan and one catalog read.
    """
    started = time.perf_counter()
    emit = progress or (lambda event: None)
    report = IngestReport(collection=store.name)
    store.check_compatible(embedder=embedder_ref or str(embedder.model_path),
                           embedder_id=embedder.identity, chunk_size=chunk_size,
                           chunk_overlap=chunk_overlap)
    known = store.documents()
    report.files.extend(FileOutcome(p.path, p.status, p.reason) for p in scanned.problems)
    todo = _changed(scanned, store, known, report, max_bytes=max_bytes)
    present = {str(found.path) for found in scanned.files}
    for source in sorted(set(known) - present):
        if not scanned.covers(source) or scanned.is_protected(source):
            continue
        if prune:
            store.remove_document(source)
            report.files.append(FileOutcome(source, "removed"))
        else:
            report.files.append(FileOutcome(source, "missing"))
    if todo:
        chunker = for_embedder(embedder, size=chunk_size, overlap=chunk_overlap, contextual=contextual)
        if expand_chunker is not None:  # e.g. doc2query (pipeline.ingest.doc2query)
            chunker = expand_chunker(chunker)
        store.ensure_collection(embedder=embedder_ref or str(embedder.model_path),
                                embedder_id=embedder.identity, dim=embedder.dim,
                                chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        _embed(todo, chunker, store=store, embedder=embedder, report=report, emit=emit, max_bytes=max_bytes,
               section_tokens=section_tokens)
    if known:  # documents committed before the catalog kept vectors get theirs (one catalog read when none lack them)
        store.backfill_vectors()
    report.seconds = time.perf_counter() - started
    return report


def _changed(scanned: Scan, store: Store, known: dict[str, DocumentRecord], report: IngestReport, *,
             max_bytes: int) -> list[_Todo]:
    """The scanned files that are new or changed (by size and mtime, then content hash); the others are
    reported (unchanged, skipped, failed) as they are found."""
    todo: list[_Todo] = []
    for found in scanned.files:
        path, source = found.path, str(found.path)
        guessed = detect_format(path) is None
        if guessed and not may_be_text(path):
            report.files.append(FileOutcome(source, "skipped", "unsupported file type"))
            continue
        if max_bytes and found.size > max_bytes:
            report.files.append(FileOutcome(source, "skipped", f"{found.size / 2**20:.3g} MB is over the "
                                            f"size limit of {max_bytes / 2**20:.3g} MB (ingest.max_file_mb)"))
            continue
        record = known.get(source)
        if record and record.size == found.size and record.mtime_ns == found.mtime_ns:
            report.files.append(FileOutcome(source, "unchanged"))
            continue
        if guessed and not sniff_text(path):
            report.files.append(FileOutcome(source, "skipped", "not a text file (binary content)"))
            continue
        try:
            digest = file_hash(path)
        except LoadError as exc:
            report.files.append(FileOutcome(source, "failed", str(exc)))
            continue
        except OSError as exc:
            report.files.append(FileOutcome(source, "failed", exc.strerror or str(exc)))
            continue
        if record and record.content_hash == digest:
            store.touch_document(source, size=found.size, mtime_ns=found.mtime_ns)
            report.files.append(FileOutcome(source, "unchanged"))
            continue
        todo.append(_Todo(path, source, "changed" if record else "new", digest, found.size, found.mtime_ns))
    return todo


def _embed(todo: list[_Todo], chunker, *, store: Store, embedder: TextEmbedder, report: IngestReport,
           emit: Progress, max_bytes: int, section_tokens: int) -> None:
    """Load, chunk, embed and commit each file of ``todo`` (loading one document ahead of the embedding)."""
    tally = _Tally(total_bytes=sum(t.size for t in todo))
    emit(IngestEvent("plan", total=len(todo), total_bytes=tally.total_bytes))
    committed = 0
    # A shared store's other writers may be embedding some of these files right now: a file whose
    # document lock is taken waits for a second pass, by which time it is usually committed.
    deferred: list[_Todo] = []
    if store.catalog.shared and len(todo) > 1:  # start where the others probably are not
        start = random.randrange(len(todo))
        todo = todo[start:] + todo[:start]
    for items, wait in ((todo, False), (deferred, True)):
        if wait:  # those the others have finished meanwhile need no loading
            items = _still_to_do(store, deferred, report, tally, emit)
        with _Claims(store, items, wait=wait, deferred=deferred) as claims:
            for item, loaded in _prepared(claims.feed(), chunker, embedder, max_bytes=max_bytes,
                                          on_stop=claims.stop):
                if not wait:
                    claims.more()
                try:
                    outcome = _done_elsewhere(store, item) or _commit(
                        item, loaded, store=store, embedder=embedder, report=report, emit=emit,
                        tally=tally, section_tokens=section_tokens)
                except StoreError as exc:
                    raise StoreError(f"{exc} ({committed} of {len(todo)} files to embed were committed "
                                     "before this)") from None
                finally:
                    claims.release(item)
                if wait:  # waiting for a lock while holding another could deadlock with a peer
                    claims.more()
                committed += outcome.status in ("new", "changed")
                report.files.append(outcome)
                tally.finish(item.size)
                emit(tally.event("file", path=str(item.path), outcome=outcome))


@dataclass
class _Tally:
    """The run's progress so far, for events."""

    total_bytes: int
    done_bytes: int = 0  # of finished files
    done_chunks: int = 0
    done_tokens: int = 0

    def finish(self, size: int) -> None:
        self.done_bytes += size

    def event(self, kind: str, *, share: int = 0, **fields) -> IngestEvent:
        return IngestEvent(kind, total_bytes=self.total_bytes, done_bytes=self.done_bytes + share,
                           done_chunks=self.done_chunks, done_tokens=self.done_tokens, **fields)


def _prepared(todo: Iterable[_Todo], chunker: Chunker, embedder: TextEmbedder, *,
              max_bytes: int = 0, on_stop: Callable[[], None] | None = None) -> Iterator[tuple[_Todo, object]]:
    """(item, (document, chunks, token sequences) or LoadError), loaded one document ahead.

    ``on_stop`` is called when the consumer stops early, to end a ``todo`` that blocks."""
    out: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def work() -> None:
        for item in todo:
            if stop.is_set():
                return
            try:
                doc = load(item.path, max_bytes=max_bytes)
                chunks = chunker.split(doc.units, fmt=doc.format, title=doc.title or item.path.name)
                if not chunks:
                    raise LoadError("no text to index")
                seqs = [embedder.sequence(c.indexed_text) for c in chunks]
                result: object = (doc, chunks, seqs)
            except LoadError as exc:
                result = exc
            except Exception as exc:  # a loader bug must not kill the whole run
                result = LoadError(f"{type(exc).__name__}: {exc}")
            out.put((item, result))
        out.put(None)

    thread = threading.Thread(target=work, name="rag-ingest-loader", daemon=True)
    thread.start()
    try:
        while (entry := out.get()) is not None:
            yield entry
    finally:
        stop.set()
        if on_stop is not None:
            on_stop()
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                out.get(timeout=0.1)
            except queue.Empty:
                pass


class _Claims:
    """The files this process loads and embeds: each one's document lock is taken (in this thread,
    the catalog's) before the loader thread sees it, a little ahead of the embedder, and released
    once it is committed. A file whose lock is taken goes to ``deferred`` unless ``wait``; with
    ``wait``, one file is claimed at a time (waiting while holding a lock could deadlock)."""

    AHEAD = 2  # claimed files waiting for the loader, beside the one being embedded (without wait)

    def __init__(self, store: Store, items: list[_Todo], *, wait: bool, deferred: list[_Todo]):
        self.store, self.wait, self.deferred = store, wait, deferred
        self._items = iter(items)
        self._queue: queue.Queue = queue.Queue()
        self._held: dict[str, object] = {}

    def __enter__(self) -> "_Claims":
        for _ in range(1 if self.wait else self.AHEAD):
            self.more()
        return self

    def feed(self) -> Iterator[_Todo]:
        """The claimed files, for the loader thread (it only reads a queue)."""
        return iter(self._queue.get, None)

    def more(self) -> None:
        """Claim the next free file and hand it to the loader (or tell it that there is none left)."""
        for item in self._items:
            lock = self.store.catalog.document_lock(self.store.name, item.source, wait=self.wait)
            if lock.__enter__():
                self._held[item.source] = lock
                self._queue.put(item)
                return
            lock.__exit__(None, None, None)
            self.deferred.append(item)
        self._queue.put(None)

    def release(self, item: _Todo) -> None:
        lock = self._held.pop(item.source, None)
        if lock is not None:
            lock.__exit__(None, None, None)

    def stop(self) -> None:
        """Tell a loader waiting for work that there is none (safe from any thread)."""
        self._queue.put(None)

    def __exit__(self, *exc) -> None:
        self.stop()
        for source in list(self._held):
            self._held.pop(source).__exit__(None, None, None)


def _still_to_do(store: Store, items: list[_Todo], report: IngestReport, tally: "_Tally",
                 emit: Progress) -> list[_Todo]:
    """``items`` less those another process has committed at the same content (reported unchanged)."""
    left = []
    for item in items:
        outcome = _done_elsewhere(store, item)
        if outcome is None:
            left.append(item)
            continue
        report.files.append(outcome)
        tally.finish(item.size)
        emit(tally.event("file", path=str(item.path), outcome=outcome))
    return left


def _done_elsewhere(store: Store, item: _Todo) -> FileOutcome | None:
    """An outcome for a file that another process committed at this very content since the run began."""
    if not store.catalog.shared:
        return None
    record = store.catalog.document(store.name, item.source)
    if record is None or record.content_hash != item.content_hash:
        return None
    return FileOutcome(item.source, "unchanged", "committed by another process")


def _commit(item: _Todo, loaded: object, *, store: Store, embedder: TextEmbedder,
            report: IngestReport, emit: Progress, tally: _Tally, section_tokens: int) -> FileOutcome:
    if isinstance(loaded, NotADocument):
        return FileOutcome(item.source, "skipped", str(loaded))
    if isinstance(loaded, LoadError):
        return FileOutcome(item.source, "failed", str(loaded))
    doc, chunks, seqs = loaded
    chunks: list[Chunk]
    t0 = time.perf_counter()
    vectors = []
    for lo in range(0, len(seqs), _SLICE):
        vectors.append(embedder.embed_tokens(seqs[lo:lo + _SLICE]))
        done = min(lo + _SLICE, len(seqs))
        tally.done_chunks += done - lo
        tally.done_tokens += sum(c.tokens for c in chunks[lo:done])
        emit(tally.event("chunks", path=str(item.path), chunks=done, file_chunks=len(seqs),
                         share=item.size * done // len(seqs)))
    matrix = np.concatenate(vectors)
    report.embed_seconds += time.perf_counter() - t0
    pages = max((u.page or 0 for u in doc.units), default=0) or None
    record = DocumentRecord(source=item.source, content_hash=item.content_hash, size=item.size,
                            mtime_ns=item.mtime_ns, format=doc.format, title=doc.title, pages=pages)
    sections = cut_sections(item.source, item.content_hash, chunks, target=section_tokens)
    store.write_document(record, chunks, matrix, sections)
    return FileOutcome(item.source, item.status, chunks=len(chunks), tokens=sum(c.tokens for c in chunks))
