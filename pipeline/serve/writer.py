"""The server's one writer: ingest jobs run in one thread, one after another, while reads go on.

After a job, where ``ingest.warm`` is not "off", the writer saves the collection's section states
(:meth:`Pipeline.warm_auto <pipeline.api.Pipeline.warm_auto>`: a collection larger than the context,
a generator that composes) as ``rag ingest`` does. Questions come first meanwhile (the engine gives
them the context between two sections); the next job, or the server stopping, cancels it, keeping
the states already saved; the job's ``warm`` follows it.

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
from typing import TYPE_CHECKING

from ..engine.context_lock import CancelToken
from ..errors import Cancelled, RagError
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
    warm: dict | None = None  # after the ingest: {"state": "running", "done", "total"}, then warm_auto's report
    rag: "Pipeline | None" = field(default=None, repr=False)  # the collection's pipeline (None: the server's)

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
        self._warming: CancelToken | None = None  # the section states being saved after a job
        self._stopped = False  # no more of them: the server stops
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
            if self._warming is not None:
                self._warming.cancel()  # the job first; the states are saved after it
            self._cv.notify_all()
        return job

    def job(self, job_id: str) -> IngestJob | None:
        with self._cv:
            return self.jobs.get(job_id)

    @property
    def busy(self) -> bool:
        with self._cv:
            return self._active > 0

    def wait_idle(self) -> None:
        """Wait until no job is queued or running, nor section states are being saved."""
        with self._cv:
            while self._active or self._warming is not None:
                self._cv.wait()

    def stop_warming(self) -> None:
        """Cancel the section states being saved, if any (within a micro-batch; those saved stay), and
        start none after a later job: the server stops."""
        with self._cv:
            self._stopped = True
            if self._warming is not None:
                self._warming.cancel()

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
                warm = (state == "done" and not self._queue and not self._stopped
                        and job.rag.config.ingest.warm != "off")
                self._warming = CancelToken() if warm else None
                self._cv.notify_all()
            if warm:
                self._warm(job)

    def _ingest(self, job: IngestJob) -> str:
        def progress(event) -> None:
            if event.kind == "file":
                job.files_done += 1

        try:  # the scanner's own rule keeps links that leave a folder out, whatever ingest.follow_symlinks says
            report = job.rag.ingest(job.paths, prune=job.prune, follow_symlinks=False, progress=progress)
            job.report = report.to_dict() if hasattr(report, "to_dict") else {"files": len(report.files)}
            return "done"
        except RagError as err:
            job.error = {"message": str(err), "type": type(err).__name__, "exit_code": err.exit_code}
        except Exception as exc:  # noqa: BLE001 - a job must never kill the writer
            job.error = {"message": f"internal error: {exc}", "type": type(exc).__name__}
        return "failed"

    def _warm(self, job: IngestJob) -> None:
        """Section states after ``job``, as ``rag ingest`` saves them by default (with "on" too: the
        prefix of a collection that fits the context is saved by the server's first question)."""
        def progress(done: int, total: int) -> None:
            job.warm = {"state": "running", "done": done, "total": total}

        job.warm = {"state": "running", "done": 0, "total": 0}
        try:
            job.warm = job.rag.warm_auto(progress=progress, cancel=self._warming)
        except Cancelled:
            job.warm = {"warmed": False, "reason": "cancelled (a later job, or the server stopping): the states "
                                                   "saved so far are kept, and the next job saves the rest"}
        except Exception as exc:  # noqa: BLE001 - the ingest stands; warming must never kill the writer
            job.warm = {"warmed": False, "reason": f"section states not saved: internal error: {exc}",
                        "failed": True}
        finally:
            with self._cv:
                self._warming = None
                self._cv.notify_all()
