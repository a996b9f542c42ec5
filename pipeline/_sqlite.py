"""SQLite the way this project uses it: autocommit connections in WAL mode, and write transactions.

The store's catalog and the prefix cache's index both keep their data in SQLite
files that several processes may open; both write through :func:`transaction`.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Iterator


def connect(path: str | Path, *, timeout: float = 30.0, check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection with no implicit transactions (:func:`transaction` opens them), WAL journal."""
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=check_same_thread)
    try:
        _wal(db, timeout)
        db.execute("PRAGMA synchronous=NORMAL")
    except BaseException:
        db.close()
        raise
    return db


def _wal(db: sqlite3.Connection, timeout: float) -> None:
    """Switch ``db`` to WAL, waiting up to ``timeout`` seconds: SQLite answers "database is locked"
    at once, without its busy wait, when other connections switch a new file at the same moment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


@contextmanager
def transaction(db: sqlite3.Connection, lock: threading.RLock | threading.Lock | None = None
                ) -> Iterator[sqlite3.Connection]:
    """A write transaction: ``BEGIN IMMEDIATE`` (one writer at a time across processes), committed at
    the end of the ``with`` block, rolled back if it raises. ``lock`` (held throughout) keeps the
    connection's other threads out."""
    with lock if lock is not None else nullcontext():
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:  # the original error says more
                    pass
            raise


__all__ = ["connect", "transaction"]
