"""Orchestration of ``rag ingest``: scan, diff against the store, load → chunk → embed → commit.

A document is identified by its resolved path and versioned by the SHA-256 of
its bytes. Unchanged files (same size and mtime, or same hash) cost nothing;
changed ones replace their old chunks through the store's commit protocol.
Loading and chunking run in a background thread, one document ahead of the
embedder, so that on a multi-core machine they hide behind embedding.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from ..engine.embed import Embedder
from ..errors import LoadError
from ..store.catalog import DocumentRecord
from ..store.store import Store
from .chunking import Chunk, Chunker, for_embedder
from .loaders import detect_format, load
from .sections import cut as cut_sections
from .scan import file_hash

# Chunks embedded between two progress events inside one large document.
_SLICE = 32


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
    """Progress: ``kind`` is "plan" (``total`` files to embed), "chunks" (embedded so far in the
    current file) or "file" (one file finished, ``outcome`` set)."""

    kind: str
    total: int = 0
    path: str = ""
    chunks: int = 0
    outcome: FileOutcome | None = None


Progress = Callable[[IngestEvent], None]


@dataclass
class _Todo:
    path: Path
    source: str
    status: str
    content_hash: str
    size: int
    mtime_ns: int


def ingest(scanned: tuple[list[Path], list[Path]], *, store: Store, embedder: Embedder, chunk_size: int,
           chunk_overlap: int, section_tokens: int, embedder_ref: str = "", prune: bool = False,
           progress: Progress | None = None) -> IngestReport:
    """Bring the store's collection in line with ``scanned`` (files and folders, from :func:`scan`).

    ``store`` must be open. Scanning comes first and apart, so that a missing path fails
    before the store is opened or created. Each new or changed document is cut into
    sections of about ``section_tokens`` embedder tokens (see :mod:`.sections`), committed
    with its chunks; unchanged documents keep theirs.

    Nothing is loaded (no model, no splitter) unless some file needs embedding, so a run
    over an unchanged corpus costs a directory scan and one catalog read.
    """
    started = time.perf_counter()
    emit = progress or (lambda event: None)
    files, folders = scanned
    report = IngestReport(collection=store.name)
    store.check_compatible(embedder=embedder_ref or str(embedder.model_path),
                           embedder_id=embedder.identity, chunk_size=chunk_size,
                           chunk_overlap=chunk_overlap)
    known = store.documents()
    todo: list[_Todo] = []
    present: set[str] = set()
    for path in files:
        source = str(path.resolve())
        present.add(source)
        if detect_format(path) is None:
            report.files.append(FileOutcome(str(path), "skipped", "unsupported file type"))
            continue
        try:
            st = path.stat()
            record = known.get(source)
            if record and record.size == st.st_size and record.mtime_ns == st.st_mtime_ns:
                report.files.append(FileOutcome(str(path), "unchanged"))
                continue
            digest = file_hash(path)
        except OSError as exc:
            report.files.append(FileOutcome(str(path), "failed", exc.strerror or str(exc)))
            continue
        if record and record.content_hash == digest:
            store.touch_document(source, size=st.st_size, mtime_ns=st.st_mtime_ns)
            report.files.append(FileOutcome(str(path), "unchanged"))
            continue
        todo.append(_Todo(path, source, "changed" if record else "new", digest, st.st_size, st.st_mtime_ns))

    for source in sorted(set(known) - present):
        if not _under(source, folders, files):
            continue
        if prune:
            store.remove_document(source)
            report.files.append(FileOutcome(source, "removed"))
        else:
            report.files.append(FileOutcome(source, "missing"))

    if todo:
        chunker = for_embedder(embedder, size=chunk_size, overlap=chunk_overlap)
        store.ensure_collection(embedder=embedder_ref or str(embedder.model_path),
                                embedder_id=embedder.identity, dim=embedder.dim,
                                chunk_size=chunk_size, chunk_overlap=chunk_overlap)
        emit(IngestEvent("plan", total=len(todo)))
        for item, loaded in _prepared(todo, chunker, embedder):
            outcome = _commit(item, loaded, store=store, embedder=embedder, report=report, emit=emit,
                              section_tokens=section_tokens)
            report.files.append(outcome)
            emit(IngestEvent("file", path=str(item.path), outcome=outcome))
    report.seconds = time.perf_counter() - started
    return report


def _under(source: str, folders: list[Path], files: list[Path]) -> bool:
    path = Path(source)
    if any(path == f.resolve() for f in files):
        return True
    return any(folder == path or folder in path.parents for folder in folders)


def _prepared(todo: list[_Todo], chunker: Chunker, embedder: Embedder) -> Iterator[tuple[_Todo, object]]:
    """(item, (document, chunks, token sequences) or LoadError), loaded one document ahead."""
    out: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def work() -> None:
        for item in todo:
            if stop.is_set():
                return
            try:
                doc = load(item.path)
                chunks = chunker.split(doc.units, fmt=doc.format)
                if not chunks:
                    raise LoadError("no text to index")
                seqs = [embedder._sequence(c.text) for c in chunks]
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
        while thread.is_alive():  # unblock a producer waiting on a full queue
            try:
                out.get(timeout=0.1)
            except queue.Empty:
                pass


def _commit(item: _Todo, loaded: object, *, store: Store, embedder: Embedder,
            report: IngestReport, emit: Progress, section_tokens: int) -> FileOutcome:
    if isinstance(loaded, LoadError):
        return FileOutcome(str(item.path), "failed", str(loaded))
    doc, chunks, seqs = loaded
    chunks: list[Chunk]
    t0 = time.perf_counter()
    vectors = []
    for lo in range(0, len(seqs), _SLICE):
        vectors.append(embedder.embed_tokens(seqs[lo:lo + _SLICE]))
        emit(IngestEvent("chunks", path=str(item.path), chunks=min(lo + _SLICE, len(seqs))))
    matrix = np.concatenate(vectors)
    report.embed_seconds += time.perf_counter() - t0
    pages = max((u.page or 0 for u in doc.units), default=0) or None
    record = DocumentRecord(source=item.source, content_hash=item.content_hash, size=item.size,
                            mtime_ns=item.mtime_ns, format=doc.format, title=doc.title, pages=pages)
    sections = cut_sections(item.source, item.content_hash, chunks, target=section_tokens)
    store.write_document(record, chunks, matrix, sections)
    return FileOutcome(str(item.path), item.status, chunks=len(chunks), tokens=sum(c.tokens for c in chunks))
