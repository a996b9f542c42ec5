"""The prefix cache's index: which saved states exist, what each holds, their use and counters.

One SQLite file (``index.sqlite``, WAL) per cache directory, shared by every process
that uses the directory: each write is one transaction (``BEGIN IMMEDIATE``, one
writer at a time). A lookup is one indexed query (``namespace = ? AND block_hash IN
(...) AND n_tokens <= ?``) over the block hashes of :mod:`.keys`, never a scan.
Plain SQLite: the state files themselves are :mod:`.files`' and :mod:`.store`'s business.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from ..._sqlite import connect, transaction
from .capacity import usefulness
from .keys import FORMAT

INDEX_NAME = "index.sqlite"

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    namespace TEXT NOT NULL,
    n_tokens INTEGER NOT NULL,
    full_hash TEXT NOT NULL,
    block_hash TEXT NOT NULL,
    file TEXT NOT NULL UNIQUE,
    bytes INTEGER NOT NULL,
    digest TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_key ON entries (namespace, full_hash);
CREATE INDEX IF NOT EXISTS entries_lookup ON entries (namespace, block_hash, n_tokens);
CREATE INDEX IF NOT EXISTS entries_lru ON entries (last_used);
CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value REAL NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('format', '{FORMAT}');
"""

COUNTERS = ("hits", "misses", "saves", "evictions", "failures", "tokens_reused", "load_seconds", "save_seconds")
_COLUMNS = "id, namespace, n_tokens, full_hash, block_hash, file, bytes, digest, created, last_used, hits"


@dataclass
class Entry:
    """One saved prefix state, as the index describes it."""

    id: int
    namespace: str
    n_tokens: int
    full_hash: str
    block_hash: str
    file: str
    bytes: int
    digest: str
    created: float
    last_used: float
    hits: int

    def to_dict(self) -> dict:
        return asdict(self)


def is_damaged(exc: BaseException) -> bool:
    """Whether an SQLite error says the file is not a database or is corrupt (rather than busy or read-only)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB
    text = str(exc).lower()
    return "malformed" in text or "not a database" in text


class CacheIndex:
    """The index of one cache directory. Safe to share between threads (one lock around the connection).

    ``read_only`` opens an index that cannot be written (its directory is read-only):
    lookups work, every write raises ``sqlite3.OperationalError``.
    """

    def __init__(self, path: str | Path, *, timeout: float = 30.0, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        #: Whether this open made the file (there was no index before).
        self.made = not read_only and not self.path.exists()
        if read_only:
            self._db = _connect_read_only(self.path, timeout)
        else:
            self._db = connect(self.path, timeout=timeout, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        try:
            with self._lock:
                if not read_only:  # executescript commits any open transaction: the script holds its own
                    # (``created``: when the index was made; 0 for one made before it was recorded)
                    created = repr(time.time()) if self.made else "0"
                    try:
                        self._db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "INSERT OR IGNORE INTO meta (key, value) "
                                               f"VALUES ('created', '{created}');COMMIT;")
                    except BaseException:
                        if self._db.in_transaction:
                            self._db.execute("ROLLBACK")
                        raise
                row = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
                self._db.execute(f"SELECT {_COLUMNS} FROM entries LIMIT 1").fetchall()
        except BaseException:
            self._db.close()
            raise
        #: Whether the index was written by another version of the key scheme (:meth:`reformat` it).
        self.stale = row is None or row[0] != str(FORMAT)
        try:
            #: When the index was made (seconds since the epoch; 0: before this was recorded). Anything
            #: a cache directory saved before then was lost with an earlier index, not evicted.
            self.created = float(self.get_meta("created") or 0.0)
        except ValueError:
            self.created = 0.0

    def write(self):
        """A write transaction (see :func:`pipeline._sqlite.transaction`)."""
        return transaction(self._db, self._lock)

    def reformat(self) -> list[str]:
        """Forget everything (entries and counters) and mark the index as this format's; the files to delete."""
        with self.write() as db:
            files = [r["file"] for r in db.execute("SELECT file FROM entries")]
            db.execute("DELETE FROM entries")
            db.execute("DELETE FROM counters")
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('format', ?)", (str(FORMAT),))
        self.stale = False
        return files

    def intact(self) -> bool:
        """Whether SQLite's own check finds the file sound (``PRAGMA quick_check``; the index is small)."""
        with self._lock:
            rows = self._db.execute("PRAGMA quick_check").fetchall()
        return [tuple(r) for r in rows] == [("ok",)]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- reading ------------------------------------------------------------------------------

    @staticmethod
    def lookup_sql(n_hashes: int) -> str:
        """The one query a lookup runs, for ``n_hashes`` candidate block hashes."""
        marks = ",".join("?" * n_hashes)
        return (f"SELECT {_COLUMNS} FROM entries WHERE namespace = ? AND block_hash IN ({marks}) "
                "AND n_tokens <= ? ORDER BY n_tokens DESC")

    def candidates(self, namespace: str, block_hashes: list[str], max_tokens: int) -> list[Entry]:
        """Entries of ``namespace`` under any of ``block_hashes`` with at most ``max_tokens`` tokens, longest first."""
        with self._lock:
            rows = self._db.execute(self.lookup_sql(len(block_hashes)),
                                    (namespace, *block_hashes, max_tokens)).fetchall()
        return [_entry(r) for r in rows]

    def find(self, namespace: str, full_hash: str) -> Entry | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE namespace = ? AND full_hash = ?",
                                   (namespace, full_hash)).fetchone()
        return _entry(row) if row else None

    def get(self, entry_id: int) -> Entry | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE id = ?", (entry_id,)).fetchone()
        return _entry(row) if row else None

    def entries(self, namespace: str | None = None) -> list[Entry]:
        """Every entry (of one namespace), most recently used first."""
        sql = f"SELECT {_COLUMNS} FROM entries"
        args: tuple = ()
        if namespace is not None:
            sql, args = sql + " WHERE namespace = ?", (namespace,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY last_used DESC", args).fetchall()
        return [_entry(r) for r in rows]

    def files(self) -> dict[str, int]:
        """File name -> entry id, for every entry."""
        with self._lock:
            return {r["file"]: r["id"] for r in self._db.execute("SELECT id, file FROM entries")}

    def stats(self) -> dict:
        """Entries, bytes, tokens, hits, per-namespace figures and the counters (see :data:`COUNTERS`)."""
        with self._lock:
            total = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(n_tokens), 0), COALESCE(SUM(hits), 0) "
                "FROM entries").fetchone()
            per_ns = self._db.execute(
                "SELECT namespace, COUNT(*) AS entries, SUM(bytes) AS bytes, SUM(n_tokens) AS tokens, "
                "MAX(n_tokens) AS longest FROM entries GROUP BY namespace").fetchall()
            counters = dict(self._db.execute("SELECT key, value FROM counters").fetchall())
        entries, size, tokens, entry_hits = total
        out = {
            "entries": entries,
            "bytes": size,
            "tokens": tokens,
            "bytes_per_token": round(size / tokens, 1) if tokens else 0.0,
            "entry_hits": entry_hits,
            "namespaces": {r["namespace"]: {"entries": r["entries"], "bytes": r["bytes"], "tokens": r["tokens"],
                                            "longest": r["longest"]} for r in per_ns},
        }
        for key in COUNTERS:
            value = counters.get(key, 0)
            out[key] = round(value, 4) if key.endswith("seconds") else int(value)
        return out

    # -- writing ------------------------------------------------------------------------------

    @staticmethod
    def count(db: sqlite3.Connection, **amounts: float) -> None:
        """Add to the counters, inside a :meth:`write` transaction."""
        for key, value in amounts.items():
            db.execute("INSERT INTO counters (key, value) VALUES (?, ?) "
                       "ON CONFLICT (key) DO UPDATE SET value = value + excluded.value", (key, value))

    def add(self, **amounts: float) -> None:
        """Add to the counters in a transaction of their own."""
        with self.write() as db:
            self.count(db, **amounts)

    def insert(self, db: sqlite3.Connection, *, namespace: str, n_tokens: int, full_hash: str, block_hash: str,
               file: str, size: int, digest: str, now: float) -> int | None:
        """Add an entry, inside a :meth:`write` transaction; None when the same prefix is already there."""
        cur = db.execute(
            "INSERT OR IGNORE INTO entries (namespace, n_tokens, full_hash, block_hash, file, bytes, digest, "
            "created, last_used, hits) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (namespace, n_tokens, full_hash, block_hash, file, size, digest, now, now))
        return cur.lastrowid if cur.rowcount == 1 else None

    @staticmethod
    def evict(db: sqlite3.Connection, max_bytes: int, *, keep: int | None, now: float | None = None) -> list[str]:
        """Delete the least useful entries (not ``keep``) until the total fits ``max_bytes``; their files.
        Least useful: :func:`.budget.usefulness` (tokens per byte, times uses, fading with time unused)."""
        total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
        out: list[str] = []
        if total <= max_bytes:
            return out
        now = time.time() if now is None else now
        rows = db.execute("SELECT id, file, bytes, n_tokens, hits, last_used FROM entries").fetchall()
        rows.sort(key=lambda r: (usefulness(hits=r["hits"], n_tokens=r["n_tokens"], size=r["bytes"],
                                            last_used=r["last_used"], now=now), r["last_used"]))
        for row in rows:
            if total <= max_bytes:
                break
            if row["id"] == keep:
                continue
            db.execute("DELETE FROM entries WHERE id = ?", (row["id"],))
            out.append(row["file"])
            total -= row["bytes"]
        return out

    def bytes_worth_more_than_new(self, now: float) -> int:
        """Bytes of the entries worth more than one just saved and never used (its worth: 1 use, now):
        those a new entry would not evict (:func:`.budget.usefulness`, per byte, taken per token)."""
        with self._lock:
            rows = self._db.execute("SELECT bytes, hits, last_used FROM entries WHERE hits > 0").fetchall()
        return sum(r["bytes"] for r in rows
                   if usefulness(hits=r["hits"], n_tokens=1, size=1, last_used=r["last_used"], now=now) > 1.0)

    def total_bytes(self) -> int:
        """Bytes of every entry's file, as indexed."""
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0])

    def touch(self, entry: Entry, now: float, *, hit_tokens: int = 0, load_seconds: float = 0.0) -> None:
        """Mark ``entry`` used at ``now``; with ``hit_tokens``, count a successful load of it."""
        with self.write() as db:
            if hit_tokens:
                db.execute("UPDATE entries SET last_used = ?, hits = hits + 1 WHERE id = ?", (now, entry.id))
                self.count(db, hits=1, tokens_reused=hit_tokens, load_seconds=load_seconds)
            else:
                db.execute("UPDATE entries SET last_used = ? WHERE id = ?", (now, entry.id))

    def drop(self, entry: Entry, *, failure: bool = True) -> None:
        """Delete ``entry``'s row (only if it still names the same file); count a failure."""
        with self.write() as db:
            db.execute("DELETE FROM entries WHERE id = ? AND file = ?", (entry.id, entry.file))
            if failure:
                self.count(db, failures=1)

    def forget(self, namespace: str | None = None) -> list[str]:
        """Delete every entry (of one namespace); their files."""
        with self.write() as db:
            if namespace is None:
                rows = db.execute("SELECT file FROM entries").fetchall()
                db.execute("DELETE FROM entries")
            else:
                rows = db.execute("SELECT file FROM entries WHERE namespace = ?", (namespace,)).fetchall()
                db.execute("DELETE FROM entries WHERE namespace = ?", (namespace,))
        return [r["file"] for r in rows]

    def reset_counters(self) -> None:
        with self.write() as db:
            db.execute("DELETE FROM counters")

    def delete_ids(self, ids: Iterable[int]) -> None:
        with self.write() as db:
            db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in ids])

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self.write() as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


def _connect_read_only(path: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection; where SQLite cannot make its -shm file (a read-only directory), an
    immutable one (no locks; what a last writer left in a -wal file is not seen)."""
    uri = path.resolve().as_uri()
    try:
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=timeout, isolation_level=None,
                             check_same_thread=False)
        db.execute("SELECT 1 FROM meta LIMIT 1").fetchall()
        return db
    except sqlite3.Error:
        return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=timeout, isolation_level=None,
                               check_same_thread=False)


def _entry(row: sqlite3.Row) -> Entry:
    return Entry(**{k: row[k] for k in row.keys()})


__all__ = ["COUNTERS", "CacheIndex", "Entry", "INDEX_NAME", "is_damaged"]
