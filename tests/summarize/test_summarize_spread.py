"""A summarisation job spread over several generators: claims with leases in the job store.

Fast tests use the deterministic fake engine of support/summarize_fakes.py (one copy per
worker); the slow one runs a real job over two real llama_cpp.server processes.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest

from pipeline.summarize.jobstore import SQLiteJobStore
from pipeline.summarize.spread import spread

from support.servers import pg_cluster, pg_url  # noqa: F401  (fixtures, for the PostgreSQL job store)
from support.summarize_fakes import FakeEngine, doc_chunks
from support.summarize_fakes import fake_job as _fake_job


def fake_job(*args, **kw):
    """The fake job of support.summarize_fakes, its in-memory catalog usable from the workers' threads (a real
    store is opened per call, in the worker's thread; spread serialises the opens)."""
    import sqlite3

    job, jobs, engine = _fake_job(*args, **kw)
    with job.open_store() as store:
        shared = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        store.catalog.db.backup(shared)
        store.catalog.db = shared
    return job, jobs, engine


class SharedFakeEngine(FakeEngine):
    """The fake engine, thread-safe, with one worker copy per "server" sharing its vocabulary."""

    def __init__(self, n_ctx: int, servers: int):
        super().__init__(n_ctx)
        self.servers = servers
        self.lock = threading.Lock()

    def tokenize(self, text, *, special=False):
        with self.lock:
            return super().tokenize(text, special=special)

    def generate(self, tokens, **kw):
        time.sleep(0.01)  # a server's latency: lets the workers interleave
        with self.lock:
            return super().generate(tokens, **kw)

    def workers(self):
        out = []
        for _ in range(self.servers):
            w = copy.copy(self)
            w.prompts = []
            out.append(w)
        self.copies = out
        return out


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def job_stores(request, tmp_path):
    """A function opening a new connection to one job store: ``jobs.sqlite`` or the PostgreSQL catalog
    (a fresh database in the cluster of ``support/servers.py``)."""
    if request.param == "sqlite":
        path = tmp_path / "jobs.sqlite"
        SQLiteJobStore(path).close()
        return lambda: SQLiteJobStore(path)
    from pipeline.summarize.jobstore_pg import PostgresJobStore

    url = request.getfixturevalue("pg_url")
    return lambda: PostgresJobStore(url)


def test_units_decoded_together_commit_together_on_each_backend(job_stores):
    """``commit_units`` is one transaction on both job stores (units decoded together are finished together)."""
    from pipeline.summarize.jobstore import Unit

    rows = [(Unit(f"u{i}", "map", f"text {i}\x00", 10, 8, 2, 0.5), "doc", "prompt", f"[{i}]") for i in range(3)]
    with job_stores() as jobs:
        jobs.commit_units(rows)
        assert jobs.units_done("doc", "prompt") == 3
        assert jobs.unit("u1").text.startswith("text 1") and jobs.unit("u1").decode_tokens == 2
        jobs.commit_units(rows[:1])  # committing the same unit again replaces it
        assert jobs.units_done("doc", "prompt") == 3


def test_claims_give_each_item_to_one_worker(job_stores):
    """The JobStore claim/renew/release interface, on each backend: workers in parallel take every item
    exactly once; a released item goes back; a lease that ends frees the item of a dead worker."""
    items = [f"doc-{i}" for i in range(40)]
    taken: list[tuple[str, str]] = []

    def worker(name):
        with job_stores() as jobs:
            while (item := jobs.claim("job", items, worker=name, lease=30)) is not None:
                taken.append((item, name))
                jobs.release("job", item, worker=name, done=True)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i for i, _ in taken) == sorted(items)  # every item once, none twice
    with job_stores() as jobs, job_stores() as other:
        claims = jobs.claims("job")
        assert all(c["done"] and c["attempts"] == 1 for c in claims.values()) and len(claims) == 40
        assert jobs.claim("other", ["a", "b"], worker="x", lease=60) == "a"
        assert other.claim("other", ["a", "b"], worker="y", lease=60) == "b"  # a is held
        assert other.claim("other", ["a", "b"], worker="y", lease=60) is None
        jobs.release("other", "a", worker="x", done=False)  # given back
        assert other.claim("other", ["a"], worker="y", lease=0.3) == "a"
        assert jobs.claim("other", ["a"], worker="x", lease=60) is None  # held under a live lease
        assert not jobs.renew("other", "a", worker="x", lease=60)  # not x's
        time.sleep(0.4)  # y "dies": its lease ends
        assert jobs.claim("other", ["a"], worker="x", lease=60) == "a"
        assert not other.renew("other", "a", worker="y", lease=60)  # the dead one lost it
        assert jobs.claims("other")["a"]["attempts"] == 3
        jobs.release("other", "a", worker="x", done=True)
        jobs.clear_finished_claims("other")
        assert set(jobs.claims("other")) == {"b"}
        with jobs.reopen() as again:
            assert again.claims("other").keys() == {"b"}


def test_a_job_over_three_workers_computes_every_unit_once_and_matches_one_worker(tmp_path, job_stores):
    """Workers (threads standing for servers) sharing one job store, SQLite's or PostgreSQL's: the same
    summaries as one worker, every unit computed once, every document claimed once."""
    docs = {f"/d/{i}.txt": doc_chunks(3 if i % 2 else 12) for i in range(6)}
    job, jobs, _ = fake_job(tmp_path / "one", docs, n_ctx=160, prompts=("One.", "Two."))
    with jobs:
        alone = {(s.source, s.prompt_index): s.text for s in job.run()}
        units_alone = job.report.units_computed
    engine = SharedFakeEngine(160, servers=3)
    job, own_jobs, _ = fake_job(tmp_path / "three", docs, n_ctx=160, prompts=("One.", "Two."), engine=engine)
    own_jobs.close()
    job.jobs = job_stores()
    with job.jobs:
        spread_out = {(s.source, s.prompt_index): s.text for s in job.run()}
        assert spread_out == alone  # the same summaries
        assert job.report.units_computed == units_alone  # every unit once
        db = getattr(job.jobs, "db", None) or job.jobs.conn
        assert db.execute("SELECT COUNT(*) FROM units").fetchone()[0] == units_alone
        claims = job.jobs.claims(job.job_id)
    assert len(claims) == 6 and all(c["done"] and c["attempts"] == 1 for c in claims.values())
    assert len({c["worker"] for c in claims.values()}) >= 2  # the work was spread
    assert sum(len(w.prompts) for w in engine.copies) == units_alone and engine.prompts == []


def test_a_document_held_by_a_crashed_worker_is_finished_by_the_others(tmp_path):
    docs = {f"/d/{i}.txt": doc_chunks(3) for i in range(4)}
    engine = SharedFakeEngine(160, servers=2)
    job, jobs, _ = fake_job(tmp_path, docs, n_ctx=160, engine=engine)
    with jobs:
        victim = job.doc_key(job.documents[0])
        assert jobs.claim(job.job_id, [victim], worker="crashed-host:1:0", lease=0.5) == victim
        t0 = time.monotonic()
        finished = [doc.source for doc, summaries in spread(job, engine.workers(), poll=0.05)
                    if all(s.ok for s in summaries)]
        assert sorted(finished) == sorted(docs)
        assert time.monotonic() - t0 >= 0.4  # it waited for the lease to end
        claims = jobs.claims(job.job_id)
    assert claims[victim]["attempts"] == 2 and claims[victim]["worker"] != "crashed-host:1:0"
    assert all(c["done"] for c in claims.values())
