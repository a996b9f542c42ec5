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
from typing import Any, Callable, Iterator, Sequence

from ..ask.prompt import SectionTokens
from ..records import DocumentRecord
from .jobstore import JobStore

LEASE_SECONDS = 60.0
POLL_SECONDS = 0.5


def spread(job: Any, engines: Sequence, *, lease: float = LEASE_SECONDS, poll: float = POLL_SECONDS
           ) -> Iterator[tuple[DocumentRecord, list]]:
    """Each document's summaries as a worker finishes them, one worker (thread) per engine.

    ``job`` is a :class:`pipeline.summarize.job.Job` (not imported: it calls this); each worker
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


def in_turn(job: Any, compute: Callable[[DocumentRecord], list], *, lease: float = LEASE_SECONDS,
            poll: float = POLL_SECONDS) -> Iterator[tuple[DocumentRecord, list]]:
    """Each document's summaries, in the job's order, computed by this process's one engine while
    other processes on the same job take other documents: a document another live worker holds is
    left to it and read from the job store once it is done (or taken over when the holder's lease
    ends, or at once when the holder was a process of this machine that has ended), so no unit is
    computed twice. Documents finished ahead of their turn wait, so outputs keep the job's order.

    ``compute(doc)`` is :meth:`pipeline.summarize.Job._document` (stored results are reused, the rest
    computed).
    """
    jobs, job_id = job.jobs, job.job_id
    order = [job.doc_key(d) for d in job.documents]
    items = dict(zip(order, job.documents))
    jobs.clear_finished_claims(job_id)
    worker = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"
    left, ready = list(order), {}
    while order:
        while order and order[0] in ready:
            key = order.pop(0)
            yield items[key], ready.pop(key)
        if not left:
            continue
        _free_the_dead(jobs, job_id, left)
        key = jobs.claim(job_id, left, worker=worker, lease=lease)
        if key is not None:
            try:
                with _heartbeat(jobs, job_id, key, worker, lease):
                    ready[key] = compute(items[key])
            except BaseException:
                jobs.release(job_id, key, worker=worker, done=False)
                raise
            jobs.release(job_id, key, worker=worker, done=True)
            left.remove(key)
            continue
        held = jobs.claims(job_id)  # the rest is held by others, or done by them
        done = [k for k in left if held.get(k, {}).get("done")]
        if not done:
            time.sleep(poll)
            continue
        left.remove(done[0])
        ready[done[0]] = compute(items[done[0]])  # their results, from the job store


def _free_the_dead(jobs: JobStore, job_id: str, items: Sequence[str]) -> None:
    """Give back the items of holders on this machine whose process has ended (no need to wait for
    their leases: a rerun after a crash starts at once)."""
    for item, claim in jobs.claims(job_id).items():
        if item in items and not claim["done"] and claim["lease_until"] > time.time() and \
                not _alive(claim["worker"]):
            jobs.release(job_id, item, worker=claim["worker"], done=False)


def _alive(worker: str) -> bool:
    """False for a worker of this machine whose process has ended (its lease need not run out)."""
    host, _, rest = worker.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's: its lease decides
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True


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


__all__ = ["LEASE_SECONDS", "in_turn", "spread"]
