"""Section tokens kept on disk: a rendered section's generator tokens, saved by whichever process
first tokenised it (the ingest's warming, a question, a summary) and read back by the next.

A new ``rag ask`` process would otherwise tokenise every candidate section again once the generator
has loaded (about 0.25 s for 30 sections with Gemma's 262K-token vocabulary), and that wait sits
between the model's load and the first token. Entries are keyed by the model's cache namespace and
a digest of the rendered text, so a changed document, a changed rendering or another model never
finds a stale entry. Kept in ``tokens.sqlite`` beside the prefix cache and shared by processes; a
damaged or unwritable file costs the saving, never an answer.
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Sequence

from .._sqlite import connect

MAX_ENTRIES = 200_000
"""Entries kept per file; past it the least recently used tenth goes."""
_PRUNE_EVERY = 512


def digest(text: str) -> bytes:
    """The key of a rendered text."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _pack(tokens: Sequence[int]) -> bytes:
    arr = array("i", tokens)
    if sys.byteorder != "little":  # pragma: no cover - no such platform in use
        arr.byteswap()
    return arr.tobytes()


def _unpack(data: bytes) -> tuple[int, ...] | None:
    if len(data) % 4:
        return None
    arr = array("i")
    arr.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        arr.byteswap()
    return tuple(arr)


class SavedTokens:
    """The tokens of rendered texts under one model ``namespace``, in the SQLite file at ``path``."""

    def __init__(self, path: Path, namespace: str, *, max_entries: int = MAX_ENTRIES):
        self.path, self.namespace, self.max_entries = path, namespace, max_entries
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._opened = False
        self._writes = 0

    def _conn(self) -> sqlite3.Connection | None:
        if not self._opened:
            self._opened = True
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = connect(self.path, timeout=5, check_same_thread=False)
                db.execute("CREATE TABLE IF NOT EXISTS tokens (namespace TEXT NOT NULL, digest BLOB NOT NULL, "
                           "ids BLOB NOT NULL, used REAL NOT NULL, PRIMARY KEY (namespace, digest))")
                self._db = db
            except (sqlite3.Error, OSError):
                self._db = None
        return self._db

    def get(self, key: bytes) -> tuple[int, ...] | None:
        """The tokens saved under ``key`` (from :func:`digest`), or None."""
        with self._lock:
            db = self._conn()
            if db is None:
                return None
            try:
                row = db.execute("SELECT ids FROM tokens WHERE namespace = ? AND digest = ?",
                                 (self.namespace, key)).fetchone()
            except sqlite3.Error:
                return None
        return _unpack(row[0]) if row is not None else None

    def put(self, key: bytes, tokens: Sequence[int]) -> None:
        """Save ``tokens`` under ``key`` (nothing happens where the file cannot be written)."""
        with self._lock:
            db = self._conn()
            if db is None:
                return
            try:
                db.execute("INSERT OR REPLACE INTO tokens (namespace, digest, ids, used) VALUES (?, ?, ?, ?)",
                           (self.namespace, key, _pack(tokens), time.time()))
                self._writes += 1
                if self._writes % _PRUNE_EVERY == 0:
                    self._prune(db)
            except sqlite3.Error:
                pass

    def _prune(self, db: sqlite3.Connection) -> None:
        (n,) = db.execute("SELECT COUNT(*) FROM tokens").fetchone()
        if n > self.max_entries:
            db.execute("DELETE FROM tokens WHERE rowid IN (SELECT rowid FROM tokens ORDER BY used LIMIT ?)",
                       (n - self.max_entries * 9 // 10,))

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db, self._opened = None, True


__all__ = ["MAX_ENTRIES", "SavedTokens", "digest"]
