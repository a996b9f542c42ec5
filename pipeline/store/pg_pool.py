"""PostgreSQL connections kept open between operations: one bounded pool per process and URL.

Without it every ``Pipeline.store()`` (every web request) opened and closed a
connection of its own. A :class:`ConnectionPool` lends a connection for one operation
(a store view, a job store) and takes it back afterwards:

- **bounded**: at most ``size`` connections to one URL exist at once (in use or idle);
  a thread that finds them all in use waits up to ``wait`` seconds, then gets a
  :class:`~pipeline.errors.StoreBusyError` that says so;
- **checked on checkout**: a connection that is closed, broken or mid-transaction, or
  that does not answer ``SELECT 1`` (the server restarted, an administrator ended its
  session), is thrown away and replaced;
- **clean on return**: an open transaction is rolled back and every session-level
  advisory lock is released (``pg_advisory_unlock_all``), so transactions and locks stay
  per operation, as they were with a connection per operation;
- **closed** by :meth:`ConnectionPool.leave` when the last pipeline using the URL closes
  (:meth:`pipeline.store.shared.SharedStore.close`), and at interpreter exit. A child
  process never uses its parent's connections: the pools are per process id.
"""

from __future__ import annotations

import atexit
import os
import threading
import time

from ..errors import StoreBusyError, StoreError, redact

DEFAULT_SIZE = 8


def advisory_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for ``parts`` (the same in every process)."""
    import hashlib

    return int.from_bytes(hashlib.sha1("\0".join(parts).encode()).digest()[:8], "big", signed=True)


def connect(url: str):
    """An autocommit psycopg connection, or a :class:`StoreError` naming the server (never its password)."""
    try:
        import psycopg
    except ImportError:
        raise StoreError("store.catalog_url needs the psycopg package: pip install 'psycopg[binary]' "
                         "(./setup.sh installs it)") from None
    try:
        return psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        detail = " ".join(str(exc).split())[:300]
        raise StoreError(f"cannot connect to the PostgreSQL catalog {redact(url)}: {detail}") from None


class ConnectionPool:
    """Up to ``size`` autocommit connections to ``url``, lent one operation at a time."""

    def __init__(self, url: str, *, size: int = DEFAULT_SIZE, wait: float = 10.0):
        self.url = url
        self.size = max(1, size)
        self.wait = wait
        self._cv = threading.Condition()
        self._idle: list = []
        self._open = 0  # connections that exist: idle plus lent
        self._users = 0  # pipelines that declared they use this pool (enter/leave)
        self._drain = False  # the last user left: connections coming back are closed, not kept

    @property
    def open_connections(self) -> int:
        with self._cv:
            return self._open

    # -- users --------------------------------------------------------------------------------

    def enter(self) -> None:
        with self._cv:
            self._users += 1
            self._drain = False

    def leave(self) -> None:
        """One user is done; with none left, close every idle connection (and the lent ones on return)."""
        with self._cv:
            self._users = max(0, self._users - 1)
            if self._users:
                return
            self._drain = True
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._cv.notify_all()
        for conn in idle:
            _close_quietly(conn)

    # -- lending ------------------------------------------------------------------------------

    def acquire(self):
        """A checked connection: an idle one that still answers, or a new one while there is room."""
        deadline = time.monotonic() + self.wait
        while True:
            with self._cv:
                while not self._idle and self._open >= self.size:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise StoreBusyError(
                            f"all {self.size} connections to the PostgreSQL catalog {redact(self.url)} stayed in "
                            f"use for {self.wait:g} s (store.wait); close stores and streams sooner, or raise "
                            "store.catalog_pool")
                    self._cv.wait(left)
                if self._idle:
                    conn = self._idle.pop()
                else:
                    conn = None
                    self._open += 1  # the room is taken before connecting, outside the lock
            if conn is None:
                try:
                    return connect(self.url)
                except BaseException:
                    self._forget()
                    raise
            if _alive(conn):
                return conn
            _close_quietly(conn)
            self._forget()

    def release(self, conn) -> None:
        """Take ``conn`` back: cleaned and kept, or closed when it is unusable or the pool drains."""
        keep = _reset(conn)
        with self._cv:
            if keep and not self._drain and len(self._idle) < self.size:
                self._idle.append(conn)
                self._cv.notify()
                return
        _close_quietly(conn)
        self._forget()

    def close(self) -> None:
        """Close the idle connections now; lent ones are closed when they come back."""
        with self._cv:
            self._users = 0
        self.leave()

    def _forget(self) -> None:
        with self._cv:
            self._open -= 1
            self._cv.notify()


def _alive(conn) -> bool:
    try:
        if conn.closed or conn.broken or conn.info.transaction_status != _idle_status():
            return False
        conn.execute("SELECT 1")
        return True
    except Exception:  # any failure means: not this connection
        return False


def _reset(conn) -> bool:
    """Roll back and unlock what an operation left behind; False when the connection cannot be reused."""
    try:
        if conn.closed or conn.broken:
            return False
        if conn.info.transaction_status != _idle_status():
            conn.rollback()
        conn.execute("SELECT pg_advisory_unlock_all()")
        return conn.info.transaction_status == _idle_status()
    except Exception:
        return False


def _idle_status():
    from psycopg.pq import TransactionStatus

    return TransactionStatus.IDLE


def _close_quietly(conn) -> None:
    try:
        conn.close()
    except Exception:  # closing must never mask the real outcome
        pass


_pools: dict[str, ConnectionPool] = {}
_pid = os.getpid()
_mu = threading.Lock()


def pool(url: str, *, size: int | None = None, wait: float | None = None) -> ConnectionPool:
    """This process's pool for ``url`` (made on first use; ``size`` and ``wait`` apply when it is made)."""
    global _pid
    with _mu:
        if os.getpid() != _pid:  # a forked child: the parent's connections are not ours to use or close
            _pools.clear()
            _pid = os.getpid()
        p = _pools.get(url)
        if p is None:
            p = _pools[url] = ConnectionPool(url, size=size or DEFAULT_SIZE, wait=10.0 if wait is None else wait)
        return p


@atexit.register
def close_all() -> None:
    """Close every idle pooled connection of this process (at exit)."""
    with _mu:
        pools = list(_pools.values()) if os.getpid() == _pid else []
    for p in pools:
        p.close()
