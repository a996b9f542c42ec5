"""A summarisation job spread over several generator servers: one worker per server.

Workers share the job's state through the job store (:class:`~pipeline.summarize.jobstore.JobStore`):
each takes a document with :meth:`~pipeline.summarize.jobstore.JobStore.claim` (one transaction, so
no document is taken twice), keeps its lease alive while it works, and marks it done
when its summaries are committed. Units are content-addressed and committed as they
finish, as in a single-worker job. A worker that stops renewing its lease (its
process was killed, its thread died) leaves the document to the others once the lease
ends; they resume it from its committed units. Workers may also be other processes or
machines running the same job against the same job store.
"""

from __future__ import annotations

import copy
import os
import queue
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from .jobstore import JobStore
from ..store.catalog_sqlite import DocumentRecord

LEASE_SECONDS = 60.0
POLL_SECONDS = 0.5


def spread(job: Any, engines: Sequence, *, lease: float = LEASE_SECONDS, poll: float = POLL_SECONDS
           ) -> Iterator[tuple[DocumentRecord, list]]:
    """Each document's summaries as a worker finishes them, one worker (thread) per engine.

    ``job`` is a :class:`pipeline.summarize.Job` (not imported: it calls this); each worker
    runs a copy of it on its engine, with a job-store connection of its own.
    """
    items = {job.doc_key(d): d for d in job.documents}
    order = list(items)
    job_id = job.job_id  # computed before the workers copy the job
    job.jobs.clear_finished_claims(job_id)
    out: queue.Queue = queue.Queue()
    stop = threading.Event()
    store_lock = threading.Lock()  # the store's process lock is per open: the workers take turns

    @contextmanager
    def open_store():
        with store_lock, job.open_store() as store:
            yield store

    def work(index: int, engine) -> None:
        worker = f"{socket.gethostname()}:{os.getpid()}:{index}"
        jobs = job.jobs.reopen()  # a connection of its own (SQLite connections stay in their thread)
        mine = copy.copy(job)
        mine.engine, mine.jobs, mine.open_store = engine, jobs, open_store
        # Tokens from the worker's own server: llama_cpp.server cuts a running stream short when another
        # request (a tokenize call from another worker) arrives. The tokens are the same on every server.
        mine.__dict__.pop("layout", None)
        if hasattr(job, "memo"):
            from ..ask.packing import SectionTokens

            mine.memo = SectionTokens(engine.tokenize)
        key = None
        try:
            while not stop.is_set():
                key = jobs.claim(job_id, order, worker=worker, lease=lease)
                if key is None:
                    held = jobs.claims(job_id)
                    if all(held.get(k, {}).get("done") for k in order):
                        return
                    time.sleep(poll)  # others hold the rest; a crashed one's lease will end
                    continue
                with _heartbeat(jobs, job_id, key, worker, lease):
                    summaries = mine._document(items[key], lambda fraction, detail: None)
                jobs.release(job_id, key, worker=worker, done=True)
                out.put((items[key], summaries))
                key = None
        except BaseException as exc:  # noqa: BLE001 - reported by the caller's thread
            if key is not None:  # a worker that fails (not one that was killed) gives its document back now
                jobs.release(job_id, key, worker=worker, done=False)
            out.put(exc)
        finally:
            jobs.close()
            out.put(None)

    threads = [threading.Thread(target=work, args=(i, e), name=f"summarize-worker-{i}", daemon=True)
               for i, e in enumerate(engines)]
    for t in threads:
        t.start()
    running, errors, done = len(threads), [], 0
    try:
        while running:
            got = out.get()
            if got is None:
                running -= 1
            elif isinstance(got, BaseException):
                errors.append(got)  # the others go on, and take its document once the lease ends
            else:
                done += 1
                yield got
    finally:
        stop.set()
        for t in threads:
            t.join()
    if errors and done < len(order):
        raise errors[0]


@contextmanager
def _heartbeat(store: JobStore, job_id: str, item: str, worker: str, lease: float):
    """Renew ``worker``'s lease on ``item`` every third of the lease while the block runs."""
    finished = threading.Event()

    def beat() -> None:
        jobs = store.reopen()
        try:
            while not finished.wait(lease / 3):
                jobs.renew(job_id, item, worker=worker, lease=lease)
        finally:
            jobs.close()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        finished.set()
        thread.join()


__all__ = ["LEASE_SECONDS", "spread"]
