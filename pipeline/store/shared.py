"""One open store per process, shared by the threads of a pipeline.

A :class:`~.store.Store` opened on its own takes the store's process lock, so two
threads of one application that each opened one would queue behind each other (and
a search during the application's own ingest would wait for the ingest to end). A
:class:`SharedStore` takes the process lock once for as long as any of its threads
has the store open, and gives every thread its own :class:`~.store.Store` view: its
own SQLite connection (WAL: readers see committed documents while a writer commits
others) over one Chroma client (documented thread-safe). Leftovers of a crashed
writer are cleaned up by the first view of a collection after the lock is taken,
never while this process may be writing that collection.

Other processes still wait for the lock: Chroma's embedded mode is not process-safe.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .lock import StoreLock
from .store import Store
from .vectors import client as vector_client


class SharedStore:
    """The store directory ``path``, held open while any thread uses it."""

    def __init__(self, path: Path, *, wait: float = 10.0, url: str = "", catalog_url: str = "",
                 catalog_pool: int | None = None, timeout: float = 30.0):
        """``url`` and ``catalog_url`` as for :class:`~.store.Store`; with both, every view is a
        store on servers of its own (no process lock to share). Views on a PostgreSQL catalog
        borrow connections from the process's pool for it (at most ``catalog_pool``; None: the
        pool's default, :data:`.pg_pool.DEFAULT_SIZE`)."""
        self.path = Path(path)
        self.wait = wait
        self.url = url
        self.timeout = timeout
        self.catalog_url = catalog_url
        self._mu = threading.Lock()
        self._users = 0
        self._lock: StoreLock | None = None
        self._client = None
        self._cleaned: set[str] = set()
        self.catalog_pool = catalog_pool
        self._pg = None  # the process's pool of connections to the catalog, while this store uses it

    def close(self) -> None:
        """This pipeline is done with the store: the last one using a PostgreSQL catalog closes its
        pool's connections (a later view uses the pool again)."""
        with self._mu:
            pg, self._pg = self._pg, None
        if pg is not None:
            pg.leave()

    @contextmanager
    def open(self, collection: str, *, create: bool = True) -> Iterator[Store]:
        """A view of ``collection`` for this thread, open for the ``with`` block (see :class:`~.store.Store`)."""
        if self.catalog_url:
            with self._mu:
                if self._pg is None:
                    from .pg_pool import pool

                    self._pg = pool(self.catalog_url, size=self.catalog_pool, wait=self.wait)
                    self._pg.enter()
        store = Store(self.path, collection, wait=self.wait, create=create, url=self.url,
                      catalog_url=self.catalog_url, shared=self, timeout=self.timeout)
        with store:
            yield store

    # -- called by Store --------------------------------------------------------------------

    def enter(self) -> None:
        with self._mu:  # a thread that must wait for another process holds the others back too
            if self._users == 0:
                self._lock = StoreLock(self.path, wait=self.wait).acquire()
                self._cleaned = set()
            self._users += 1

    def leave(self) -> None:
        with self._mu:
            self._users -= 1
            if self._users:
                return
            client, self._client = self._client, None
            lock, self._lock = self._lock, None
            try:
                if client is not None:
                    client.close()
            except Exception:  # closing must never mask the real error
                pass
            finally:
                lock.release()

    def first_view(self, collection: str) -> bool:
        """True once per collection per lock tenure: that view finishes the crash journal."""
        with self._mu:
            if collection in self._cleaned:
                return False
            self._cleaned.add(collection)
            return True

    def client(self):
        with self._mu:
            if self._client is None:
                self._client = vector_client(path=self.path, url=self.url, timeout=self.timeout)
            return self._client
