"""The pool of PostgreSQL connections (``store.catalog_url``), against the real throwaway cluster the
tests start (``support/servers.py``): what the server itself reports in ``pg_stat_activity``."""

from __future__ import annotations

import threading

import pytest

from support.servers import pg_cluster, pg_url  # noqa: F401  (fixtures)

from pipeline.errors import StoreBusyError
from pipeline.store import pg_pool

# A real PostgreSQL server: not the fakes-only fast subset.
pytestmark = pytest.mark.slow


def _sessions(pg_url) -> set[int]:
    """Backend pids of the sessions connected to this test's database (the watchers left out)."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True, application_name="watcher") as watcher:
        rows = watcher.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                               " AND application_name <> 'watcher'").fetchall()
    return {r[0] for r in rows}


def test_store_calls_reuse_a_bounded_set_of_connections(fake_pipeline, pg_url):
    rag = fake_pipeline(store__catalog_url=pg_url, store__catalog_pool=3)
    seen: set[int] = set()
    for _ in range(30):  # a request each, one after another
        with rag.store() as store:
            seen.add(store.catalog.conn.info.backend_pid)
    assert len(seen) == 1  # one connection, reused (before the pool: 30 connections)

    peak = []
    errors = []
    barrier = threading.Barrier(12)

    def request() -> None:
        try:
            barrier.wait()
            for _ in range(5):
                with rag.store() as store:
                    store.collections = store.catalog.collections()
                    peak.append(len(_sessions(pg_url)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=request) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert max(peak) <= 3  # 12 threads at once share the pool's 3 connections
    assert 1 <= len(_sessions(pg_url)) <= 3  # kept open between requests
    rag.close()
    assert _sessions(pg_url) == set()  # closed with the last pipeline using them


def test_a_connection_the_server_ended_is_replaced_on_checkout(fake_pipeline, pg_url):
    import psycopg

    rag = fake_pipeline(store__catalog_url=pg_url)
    with rag.store() as store:
        pid = store.catalog.conn.info.backend_pid
    with psycopg.connect(pg_url, autocommit=True) as admin:  # an administrator (or a restart) ends it
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    with rag.store() as store:
        assert store.catalog.conn.info.backend_pid != pid
        assert store.catalog.collections() == []
    rag.close()


def test_locks_and_transactions_stay_per_operation(pg_url):
    import psycopg

    from pipeline.store.catalog_pg import PostgresCatalog
    from pipeline.store.pg_pool import advisory_key

    catalog = PostgresCatalog(pg_url)
    pid = catalog.conn.info.backend_pid
    catalog._run("SELECT pg_advisory_lock(%s)", (advisory_key("left", "behind"),))  # as an operation that failed half-way
    catalog.conn.execute("BEGIN")
    catalog.close()
    with psycopg.connect(pg_url, autocommit=True) as other:  # the lock went with the operation
        assert other.execute("SELECT pg_try_advisory_lock(%s)", (advisory_key("left", "behind"),)).fetchone()[0]
    again = PostgresCatalog(pg_url)
    try:
        assert again.conn.info.backend_pid == pid  # the same connection, cleaned
        assert again.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    finally:
        again.close()
    pg_pool.pool(pg_url).close()


def test_a_full_pool_waits_then_says_so(pg_url):
    pool = pg_pool.ConnectionPool(pg_url, size=2, wait=0.3)
    a, b = pool.acquire(), pool.acquire()
    with pytest.raises(StoreBusyError, match="all 2 connections to the PostgreSQL catalog .* stayed in use"):
        pool.acquire()
    freed = threading.Timer(0.1, pool.release, (a,))
    freed.start()
    c = pool.acquire()  # a waiter gets the connection given back
    assert c is a and pool.open_connections == 2
    pool.release(b)
    pool.release(c)
    pool.close()
    assert pool.open_connections == 0 and _sessions(pg_url) == set()


def test_a_bad_pool_size_is_a_config_error():
    from pipeline.config import load_config
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="store.catalog_pool"):
        load_config(None, environ={}, overrides={"store.catalog_pool": 0})


def test_a_pipeline_used_again_after_close_pools_again(fake_pipeline, pg_url):
    rag = fake_pipeline(store__catalog_url=pg_url)
    with rag.store() as store:
        store.catalog.collections()
    rag.close()
    assert _sessions(pg_url) == set()
    pids = set()
    for _ in range(5):
        with rag.store() as store:
            pids.add(store.catalog.conn.info.backend_pid)
    assert len(pids) == 1 and len(_sessions(pg_url)) == 1  # pooled again, not one connection per call
    rag.close()
    assert _sessions(pg_url) == set()
