"""The server's one writer: ingest jobs run in one thread, one after another, while reads go on.

Each job is :meth:`Pipeline.ingest <pipeline.api.Pipeline.ingest>`, so it warms after the ingest as
``ingest.warm`` says, with the meaning it has for ``rag ingest`` (:mod:`pipeline.warm.job`), in the
background: questions come first meanwhile (the engine gives them the context between two steps);
the next job, or the server stopping, cancels it, keeping the states already saved; the job's
``warm`` follows it.

Finished jobs are kept for ``GET /ingest/{id}`` up to :data:`~.limits.FINISHED_JOBS_KEPT`,
the oldest forgotten first, so a long-running server's memory does not grow with every post.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RagError
from .limits import FINISHED_JOBS_KEPT

if TYPE_CHECKING:
    from ..api import Pipeline

SCHEMA = 1


@dataclass
class IngestJob:
    id: str
    paths: list[str]
    prune: bool
    collection: str = ""
    state: str = "queued"  # queued | running | done | failed
    created: float = field(default_factory=time.time)
    report: dict | None = None
    error: dict | None = None
    files_done: int = 0
    warming: Any = None  # the warming its ingest started (a pipeline.warm.job.WarmJob), or None
    rag: "Pipeline | None" = field(default=None, repr=False)  # the collection's pipeline (None: the server's)

    @property
    def warm(self) -> dict | None:
        """After the ingest: {"state": "running", ...progress}, then {"state": "done", ...its report}."""
        return self.warming.to_dict() if self.warming is not None else None

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "id": self.id, "state": self.state, "paths": self.paths, "prune": self.prune,
                "collection": self.collection, "files_done": self.files_done, "report": self.report,
                "error": self.error, "warm": self.warm}


class IngestWriter:
    """Runs :meth:`Pipeline.ingest` for each submitted job, in order, in its own thread."""

    def __init__(self, rag: "Pipeline", *, keep: int = FINISHED_JOBS_KEPT):
        self.rag = rag
        self.keep = keep
        self.jobs: dict[str, IngestJob] = {}
        self._queue: deque[IngestJob] = deque()
        self._finished: deque[str] = deque()
        self._active = 0  # queued or running
        self._stopped = False  # no more warming: the server stops
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rag-ingest-writer", daemon=True)
        self._thread.start()

    def submit(self, paths: list[Path], prune: bool, *, rag: "Pipeline | None" = None) -> IngestJob:
        """Queue an ingest of ``paths`` into ``rag``'s collection (default: the server's own)."""
        rag = rag or self.rag
        job = IngestJob(uuid.uuid4().hex[:12], [str(p) for p in paths], prune, rag.config.store.collection, rag=rag)
        with self._cv:
            self.jobs[job.id] = job
            self._queue.append(job)
            self._active += 1
            self._cv.notify_all()
        warming = self.rag.warming
        if warming is not None:
            warming.cancel()  # the job first; its own warming saves the rest after it
        return job

    def job(self, job_id: str) -> IngestJob | None:
        with self._cv:
            return self.jobs.get(job_id)

    @property
    def busy(self) -> bool:
        with self._cv:
            return self._active > 0

    def wait_idle(self) -> None:
        """Wait until no job is queued or running, nor warming after one."""
        with self._cv:
            while self._active:
                self._cv.wait()
        warming = self.rag.warming
        if warming is not None:
            warming.wait()

    def stop_warming(self) -> None:
        """Cancel the warming after the last job, if it runs (within a micro-batch; the states saved stay), and
        start none after a later job: the server stops."""
        with self._cv:
            self._stopped = True
        warming = self.rag.warming
        if warming is not None:
            warming.cancel()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                job = self._queue.popleft()
                job.state = "running"
            state = self._ingest(job)
            with self._cv:
                job.state = state
                self._active -= 1
                self._finished.append(job.id)
                while len(self._finished) > self.keep:
                    self.jobs.pop(self._finished.popleft(), None)
                self._cv.notify_all()

    def _ingest(self, job: IngestJob) -> str:
        def progress(event) -> None:
            if event.kind == "file":
                job.files_done += 1

        try:  # the scanner's own rule keeps links that leave a folder out, whatever ingest.follow_symlinks says
            with self._cv:
                warm = False if self._stopped else None  # None: as ingest.warm says
            report = job.rag.ingest(job.paths, prune=job.prune, follow_symlinks=False, progress=progress, warm=warm)
            job.report = report.to_dict() if hasattr(report, "to_dict") else {"files": len(report.files)}
            job.warming = getattr(report, "warming", None)
            return "done"
        except RagError as err:
            job.error = {"message": str(err), "type": type(err).__name__, "exit_code": err.exit_code}
        except Exception as exc:  # noqa: BLE001 - a job must never kill the writer
            job.error = {"message": f"internal error: {exc}", "type": type(exc).__name__}
        return "failed"
