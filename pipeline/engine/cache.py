"""Prefix KV states on disk: the second question about the same documents starts answering at once.

A :class:`PrefixCache` is a directory holding one llama.cpp sequence-state file per
entry (``<key>-<nonce>.state``, written by ``llama_state_seq_save_file``) and an
SQLite index (``index.sqlite``, WAL) of what each file holds. Several processes may
use one directory at the same time: index writes are SQLite transactions, state
files are written under a temporary name and renamed into place, and every file
name is unique, so no process ever overwrites a file another one may be reading.

Keys
    An entry belongs to a *namespace*: a hash of the model file's identity and of
    every setting that changes the KV contents (see :func:`namespace` and
    :func:`pipeline.models.file_identity`); states are only ever looked up within one namespace.
    Within it, an entry is keyed by the hash of its tokens, so a changed document
    changes the tokens and its old states are simply never found again (they age
    out through LRU eviction).

Lookup without a scan
    Token lists are chain-hashed in blocks of :data:`BLOCK` tokens
    (``h_k = sha256(h_{k-1} || block_k as little-endian int32)``). An entry of
    ``n`` tokens is indexed under ``h_{n // BLOCK}`` (:data:`SHORT_BLOCK_HASH`
    when ``n < BLOCK``) and stores ``full_hash = sha256(all n tokens)``. A lookup
    computes the chain hashes of the query and finds every candidate with one
    indexed query (``namespace = ? AND block_hash IN (...) AND n_tokens <= ?``),
    then checks candidates' ``full_hash`` against its own prefix of that length,
    longest first. Its cost grows with the query's length, not with the number of
    entries.

Integrity
    The index records each file's size and a digest. :meth:`PrefixCache.load`
    checks both *before* llama.cpp reads the file (a damaged file given to
    llama.cpp's loader could make it allocate wildly or assert), then checks that
    llama.cpp restored exactly the claimed tokens. Any failure clears the
    sequence, deletes the entry and its file, and returns False: the caller
    prefills from scratch, so a bad cache costs time, never a wrong answer.

    The digest is SHA-256 over 8 MiB chunks, combined by a final SHA-256; the chunks
    are hashed in parallel threads (hashlib releases the GIL), which pays on
    machines with idle cores. Measured here (2 busy cores, file in the page cache)
    on a 1000-token SmolLM2 state of 23 MB: llama.cpp's load 11 ms, the digest
    19-30 ms, so a checked load takes about 30 ms against 16 s of prefill. The
    check costs more than the 20% of the load once hoped for, but no cheaper full
    check exists: reading the file once more is most of it (22-25 ms for that file
    with no hashing at all; CRC-32 and Adler-32 measured 38-42 ms with the read),
    and a check of sampled blocks would let flipped bytes elsewhere through, to
    answers silently computed from a damaged KV cache. It guards against accidents
    (truncation, files torn by a crash, bit rot, a stray edit), not against an
    attacker, who could rewrite the index as easily as the files.

Durability
    State files are not fsync'ed by default (``fsync=True`` to do so): a file torn
    by a power loss fails the size or digest check and is dropped, so fsync would
    buy the survival of a cache entry, at a cost (tens of ms per 1000 tokens) paid
    on the save path.

What the caller guarantees
    :meth:`PrefixCache.save` saves sequence ``seq_id`` as it is: the caller makes
    sure it holds exactly ``tokens`` at positions ``0..n-1`` (checked: the
    sequence's last position must be ``n - 1``). States hold the KV memory only,
    not logits, so after :meth:`PrefixCache.load` at least one token must still
    be decoded before sampling; :meth:`PrefixCache.lookup` leaves at least one by
    default (``max_tokens = len(tokens) - 1``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import secrets
import sqlite3
import sys
import threading
import time
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Collection, Sequence

BLOCK = 256
"""Tokens per block of the chain hash."""

FORMAT = 1
"""Version of the index schema and key scheme; part of every namespace."""

INDEX_NAME = "index.sqlite"
STATE_SUFFIX = ".state"
TMP_SUFFIX = ".tmp"

SHORT_BLOCK_HASH = hashlib.sha256(b"rag prefix cache: fewer than one block").hexdigest()
"""The ``block_hash`` of entries shorter than one block."""

_CHAIN_SEED = hashlib.sha256(b"rag prefix cache: chain seed").digest()
_CHUNK = 8 * 2**20  # bytes per chunk of the file digest
_PARALLEL_MIN = 2 * _CHUNK  # smaller files are hashed in this thread
_ORPHAN_AGE = 600.0  # seconds before an unindexed state or temporary file counts as left over

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

_COUNTERS = ("hits", "misses", "saves", "evictions", "failures", "tokens_reused", "load_seconds",
             "save_seconds")
_COLUMNS = "id, namespace, n_tokens, full_hash, block_hash, file, bytes, digest, created, last_used, hits"


# --------------------------------------------------------------------------- keys


def token_bytes(tokens: Sequence[int]) -> bytes:
    """``tokens`` as little-endian int32, the form every hash here is computed on."""
    arr = array("i", tokens)
    if arr.itemsize != 4:  # pragma: no cover - no such platform in use
        arr = array("l", tokens)
    if sys.byteorder != "little":  # pragma: no cover
        arr.byteswap()
    return arr.tobytes()


def chain_hashes(data: bytes | memoryview, block: int = BLOCK) -> list[str]:
    """Hex chain hashes ``h_1..h_m`` of the ``m`` full blocks of ``data`` (from :func:`token_bytes`)."""
    view = memoryview(data)
    step = 4 * block
    out: list[str] = []
    h = _CHAIN_SEED
    for k in range(len(view) // step):
        h = hashlib.sha256(h + view[k * step:(k + 1) * step]).digest()
        out.append(h.hex())
    return out


def block_hash(n_tokens: int, chain: Sequence[str], block: int = BLOCK) -> str:
    """The index key of an entry of ``n_tokens`` tokens whose chain hashes are ``chain``."""
    k = n_tokens // block
    return chain[k - 1] if k else SHORT_BLOCK_HASH


def full_hash(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def namespace(model_identity: str, **settings: Any) -> str:
    """The namespace of states made by one model with settings that change the KV contents.

    Pass every setting that changes what the KV cache holds, or how it is laid out:
    context length, K and V cache types, flash attention (it changes the V layout),
    RoPE scaling and frequency settings. Leave out what does not (where experts or
    layers live, threads, batch sizes). Values must be JSON types. The llama.cpp
    binding's version and this module's :data:`FORMAT` are added here, since the
    state format may change between builds.
    """
    payload = {"format": FORMAT, "block": BLOCK, "llama_cpp": _llama_cpp_version(),
               "model": model_identity, "settings": settings}
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _llama_cpp_version() -> str:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        try:
            import llama_cpp

            return str(getattr(llama_cpp, "__version__", "unknown"))
        except Exception:  # noqa: BLE001
            return "unknown"


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 over 8 MiB chunks, hashed in parallel, combined by SHA-256 (see the module notes)."""
    size = os.path.getsize(path)
    n_chunks = max(1, -(-size // _CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:
        def chunk(i: int) -> bytes:
            data = os.pread(fd, _CHUNK, i * _CHUNK)
            return hashlib.sha256(data).digest()

        workers = min(4, os.cpu_count() or 1, n_chunks)
        if size < _PARALLEL_MIN or workers < 2:
            digests = [chunk(i) for i in range(n_chunks)]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                digests = list(pool.map(chunk, range(n_chunks)))
    finally:
        os.close(fd)
    return "sha256x8m:" + hashlib.sha256(f"{size};".encode() + b"".join(digests)).hexdigest()


# --------------------------------------------------------------------------- the cache


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


class PrefixCache:
    """Prefix KV states of llama.cpp sequences, on disk, with an SQLite index and LRU eviction.

    ``max_bytes`` caps the total size of the state files; saving past it evicts
    the least recently used entries (by last save or successful load).
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int, fsync: bool = False,
                 timeout: float = 30.0):
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.fsync = fsync
        self.last_load_seconds = 0.0
        self.last_save_seconds = 0.0
        self.last_error = ""
        self._lock = threading.RLock()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.directory / INDEX_NAME, timeout=timeout, isolation_level=None,
                                   check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self._lock:
            self._db.executescript("BEGIN IMMEDIATE;" + _SCHEMA + "COMMIT;")
            fmt = self._db.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()[0]
        if fmt != str(FORMAT):  # a cache written by another version: start over
            self.clear()
            with self._write():
                self._db.execute("UPDATE meta SET value = ? WHERE key = 'format'", (str(FORMAT),))

    # -- plumbing -----------------------------------------------------------------------------

    class _Tx:
        def __init__(self, cache: "PrefixCache"):
            self.cache = cache

        def __enter__(self):
            self.cache._lock.acquire()
            try:
                self.cache._db.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.cache._lock.release()
                raise
            return self.cache._db

        def __exit__(self, exc_type, exc, tb):
            try:
                self.cache._db.execute("ROLLBACK" if exc_type else "COMMIT")
            finally:
                self.cache._lock.release()
            return False

    def _write(self) -> "PrefixCache._Tx":
        """A write transaction (``BEGIN IMMEDIATE``: one writer at a time across processes)."""
        return PrefixCache._Tx(self)

    def _count(self, db: sqlite3.Connection, **amounts: float) -> None:
        for key, value in amounts.items():
            db.execute("INSERT INTO counters (key, value) VALUES (?, ?) "
                       "ON CONFLICT (key) DO UPDATE SET value = value + excluded.value", (key, value))

    def _path(self, entry: Entry) -> Path:
        return self.directory / entry.file

    @staticmethod
    def _entry(row: sqlite3.Row) -> Entry:
        return Entry(**{k: row[k] for k in row.keys()})

    def _unlink(self, name: str) -> None:
        try:
            (self.directory / name).unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "PrefixCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- lookup -------------------------------------------------------------------------------

    @staticmethod
    def lookup_sql(n_hashes: int) -> str:
        """The one query a lookup runs, for ``n_hashes`` candidate block hashes."""
        marks = ",".join("?" * n_hashes)
        return (f"SELECT {_COLUMNS} FROM entries WHERE namespace = ? AND block_hash IN ({marks}) "
                "AND n_tokens <= ? ORDER BY n_tokens DESC")

    def lookup(self, namespace: str, tokens: Sequence[int], *, max_tokens: int | None = None,
               min_tokens: int = 1, lengths: Collection[int] | None = None, count: bool = True
               ) -> Entry | None:
        """The longest saved prefix of ``tokens`` in ``namespace`` of ``min_tokens..max_tokens`` tokens.

        ``max_tokens`` defaults to ``len(tokens) - 1``: a restored state has no logits,
        so at least one token must be left to decode. ``lengths`` admits only entries of
        those lengths (a prompt's split points). Counts a miss when nothing fits, unless
        ``count`` is off (a probe, not a use).
        """
        limit = len(tokens) - 1 if max_tokens is None else min(max_tokens, len(tokens))
        if limit < max(min_tokens, 1):
            return None
        data = memoryview(token_bytes(tokens))[:4 * limit]
        keys = [SHORT_BLOCK_HASH] + chain_hashes(data)
        with self._lock:
            rows = self._db.execute(self.lookup_sql(len(keys)), (namespace, *keys, limit)).fetchall()
        for row in rows:
            n = row["n_tokens"]
            if n < min_tokens:
                break
            if lengths is not None and n not in lengths:
                continue
            if full_hash(data[:4 * n]) == row["full_hash"]:
                return self._entry(row)
        if count:
            with self._write() as db:
                self._count(db, misses=1)
        return None

    def entries(self, namespace: str | None = None) -> list[Entry]:
        """Every entry (of one namespace), most recently used first."""
        sql = f"SELECT {_COLUMNS} FROM entries"
        args: tuple = ()
        if namespace is not None:
            sql, args = sql + " WHERE namespace = ?", (namespace,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY last_used DESC", args).fetchall()
        return [self._entry(r) for r in rows]

    # -- save ---------------------------------------------------------------------------------

    def save(self, namespace: str, tokens: Sequence[int], ctx, *, seq_id: int = 0) -> Entry | None:
        """Save sequence ``seq_id`` of the llama.cpp context ``ctx``, which holds exactly ``tokens``.

        Returns the entry, or None when nothing was saved (empty, larger than the whole
        cap, the sequence does not end at position ``len(tokens) - 1``, or llama.cpp
        failed; :attr:`last_error` says which). If the same prefix is already saved, it
        is marked used and returned instead. Evicts least recently used entries to stay
        within ``max_bytes``.
        """
        import llama_cpp

        t0 = time.perf_counter()
        self.last_error = ""
        tokens = list(tokens)
        n = len(tokens)
        if n == 0:
            self.last_error = "nothing to save"
            return None
        data = token_bytes(tokens)
        fh = full_hash(data)
        existing = self._existing(namespace, fh)
        if existing is not None:
            return existing
        mem = llama_cpp.llama_get_memory(ctx)
        pos_max = llama_cpp.llama_memory_seq_pos_max(mem, seq_id)
        if pos_max != n - 1:
            self.last_error = f"sequence {seq_id} ends at position {pos_max}, not {n - 1}: not saved"
            return None
        expected = llama_cpp.llama_state_seq_get_size(ctx, seq_id) + 12 + 4 * n
        if expected > self.max_bytes:
            self.last_error = f"the state ({expected:,} bytes) is larger than the cache ({self.max_bytes:,})"
            return None

        key = hashlib.sha256(f"{namespace}:{fh}".encode()).hexdigest()[:32]
        name = f"{key}-{secrets.token_hex(4)}{STATE_SUFFIX}"
        tmp = self.directory / f".{name}.{os.getpid()}{TMP_SUFFIX}"
        final = self.directory / name
        try:
            arr = (llama_cpp.llama_token * n)(*tokens)
            written = llama_cpp.llama_state_seq_save_file(ctx, os.fsencode(tmp), seq_id, arr, n)
            if not written:
                self.last_error = "llama.cpp could not save the sequence state"
                return None
            size = tmp.stat().st_size
            digest = file_digest(tmp)
            if self.fsync:
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, final)
        except OSError as exc:
            self.last_error = f"could not write the state file: {exc}"
            return None
        finally:
            if tmp.exists():
                self._unlink(tmp.name)

        now = time.time()
        chain = chain_hashes(data)
        too_big = size > self.max_bytes  # it alone is over the cap: do not keep it
        remove: list[str] = []
        new_id = None
        with self._write() as db:
            if too_big:
                remove.append(name)
            else:
                cur = db.execute(
                    "INSERT OR IGNORE INTO entries (namespace, n_tokens, full_hash, block_hash, file, bytes, "
                    "digest, created, last_used, hits) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)",
                    (namespace, n, fh, block_hash(n, chain), name, size, digest, now, now))
                if cur.rowcount == 1:
                    new_id = cur.lastrowid
                    evicted = self._evict(db, keep=new_id)
                    remove += evicted
                    self._count(db, saves=1, evictions=len(evicted), save_seconds=time.perf_counter() - t0)
                else:  # another process saved the same prefix meanwhile: keep theirs
                    remove.append(name)
        for f in remove:
            self._unlink(f)
        self.last_save_seconds = time.perf_counter() - t0
        if too_big:
            self.last_error = f"the state ({size:,} bytes) is larger than the cache ({self.max_bytes:,})"
            return None
        if new_id is None:
            return self._existing(namespace, fh)
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE id = ?", (new_id,)).fetchone()
        return self._entry(row) if row else None

    def _existing(self, namespace: str, fh: str) -> Entry | None:
        """The entry saved for this prefix, marked used; a row whose file is gone is removed."""
        with self._lock:
            row = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE namespace = ? AND full_hash = ?",
                                   (namespace, fh)).fetchone()
        if row is None:
            return None
        entry = self._entry(row)
        try:
            ok = self._path(entry).stat().st_size == entry.bytes
        except OSError:
            ok = False
        if not ok:
            self._drop(entry, "state file missing or changed")
            return None
        entry.last_used = time.time()
        with self._write() as db:
            db.execute("UPDATE entries SET last_used = ? WHERE id = ?", (entry.last_used, entry.id))
        return entry

    def _evict(self, db: sqlite3.Connection, *, keep: int | None) -> list[str]:
        """Delete least recently used rows (not ``keep``) until the total fits; return their files."""
        total = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
        out: list[str] = []
        if total <= self.max_bytes:
            return out
        for row in db.execute("SELECT id, file, bytes FROM entries ORDER BY last_used ASC").fetchall():
            if total <= self.max_bytes:
                break
            if row["id"] == keep:
                continue
            db.execute("DELETE FROM entries WHERE id = ?", (row["id"],))
            out.append(row["file"])
            total -= row["bytes"]
        return out

    # -- load ---------------------------------------------------------------------------------

    def load(self, entry: Entry, ctx, *, seq_id: int = 0) -> bool:
        """Restore ``entry`` into sequence ``seq_id`` of ``ctx``; True when it holds exactly its tokens.

        The file's size and digest are checked before llama.cpp reads it, and the tokens
        llama.cpp restored are checked after. On any failure the sequence is cleared (it
        may hold a partial state), the entry and its file are deleted, :attr:`last_error`
        says why, and False is returned: prefill from scratch. On success the entry is
        marked used. :attr:`last_load_seconds` is the time taken, checks included.
        """
        import llama_cpp

        t0 = time.perf_counter()
        self.last_error = ""
        self.last_load_seconds = 0.0
        path = self._path(entry)
        try:
            size = path.stat().st_size
        except OSError:
            return self._fail(entry, None, seq_id, "state file missing", t0)
        if size != entry.bytes:
            return self._fail(entry, None, seq_id, f"state file has {size:,} bytes, not {entry.bytes:,}", t0)
        if file_digest(path) != entry.digest:
            return self._fail(entry, None, seq_id, "state file checksum mismatch", t0)
        n_ctx = llama_cpp.llama_n_ctx(ctx)
        if entry.n_tokens > n_ctx:  # a caller's mistake (namespace without n_ctx), not a bad entry
            self.last_error = f"the state holds {entry.n_tokens:,} tokens; the context only {n_ctx:,}"
            return False
        capacity = entry.n_tokens + 1
        out = (llama_cpp.llama_token * capacity)()
        n_out = ctypes.c_size_t(0)
        read = llama_cpp.llama_state_seq_load_file(ctx, os.fsencode(path), seq_id, out, capacity,
                                                   ctypes.byref(n_out))
        if not read:
            return self._fail(entry, ctx, seq_id, "llama.cpp could not restore the state", t0)
        n = n_out.value
        if n != entry.n_tokens or full_hash(token_bytes(out[:n])) != entry.full_hash:
            return self._fail(entry, ctx, seq_id, "the restored tokens are not the entry's", t0)
        mem = llama_cpp.llama_get_memory(ctx)
        if llama_cpp.llama_memory_seq_pos_max(mem, seq_id) != n - 1:
            return self._fail(entry, ctx, seq_id, "the restored sequence does not end where it should", t0)
        seconds = time.perf_counter() - t0
        self.last_load_seconds = seconds
        entry.last_used = time.time()
        entry.hits += 1
        with self._write() as db:
            db.execute("UPDATE entries SET last_used = ?, hits = hits + 1 WHERE id = ?",
                       (entry.last_used, entry.id))
            self._count(db, hits=1, tokens_reused=n, load_seconds=seconds)
        return True

    def _fail(self, entry: Entry, ctx, seq_id: int, why: str, t0: float) -> bool:
        if ctx is not None:
            import llama_cpp

            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), seq_id, -1, -1)
        self._drop(entry, why)
        self.last_load_seconds = time.perf_counter() - t0
        return False

    def _drop(self, entry: Entry, why: str) -> None:
        self.last_error = why
        with self._write() as db:
            db.execute("DELETE FROM entries WHERE id = ? AND file = ?", (entry.id, entry.file))
            self._count(db, failures=1)
        self._unlink(entry.file)  # file names are unique per save: no other entry uses it

    # -- maintenance --------------------------------------------------------------------------

    def forget(self, namespace: str | None = None) -> int:
        """Delete every entry (of one namespace); return how many."""
        with self._write() as db:
            if namespace is None:
                rows = db.execute("SELECT file FROM entries").fetchall()
                db.execute("DELETE FROM entries")
            else:
                rows = db.execute("SELECT file FROM entries WHERE namespace = ?", (namespace,)).fetchall()
                db.execute("DELETE FROM entries WHERE namespace = ?", (namespace,))
        for r in rows:
            self._unlink(r["file"])
        return len(rows)

    def clear(self) -> int:
        """Delete every entry, every state and temporary file in the directory, and the counters."""
        n = self.forget()
        with self._write() as db:
            db.execute("DELETE FROM counters")
        for p in self.directory.iterdir():
            if p.name.endswith(STATE_SUFFIX) or p.name.endswith(TMP_SUFFIX):
                self._unlink(p.name)
        return n

    def sweep(self, *, min_age: float = _ORPHAN_AGE) -> int:
        """Remove left-overs of crashed processes: unindexed files older than ``min_age``, rows without files."""
        with self._lock:
            rows = self._db.execute("SELECT id, file FROM entries").fetchall()
        known = {r["file"] for r in rows}
        removed = 0
        now = time.time()
        for p in self.directory.iterdir():
            if (p.name.endswith(STATE_SUFFIX) or p.name.endswith(TMP_SUFFIX)) and p.name not in known:
                try:
                    if now - p.stat().st_mtime >= min_age:
                        p.unlink()
                        removed += 1
                except OSError:
                    pass
        gone = [r["id"] for r in rows if not (self.directory / r["file"]).exists()]
        if gone:
            with self._write() as db:
                db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in gone])
            removed += len(gone)
        return removed

    def stats(self) -> dict:
        """Entries, bytes, cap, hits and the other counters, per-namespace counts, bytes per token."""
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
            "directory": str(self.directory),
            "entries": entries,
            "bytes": size,
            "max_bytes": self.max_bytes,
            "tokens": tokens,
            "bytes_per_token": round(size / tokens, 1) if tokens else 0.0,
            "entry_hits": entry_hits,
            "namespaces": {r["namespace"]: {"entries": r["entries"], "bytes": r["bytes"], "tokens": r["tokens"],
                                            "longest": r["longest"]} for r in per_ns},
        }
        for key in _COUNTERS:
            value = counters.get(key, 0)
            out[key] = round(value, 4) if key.endswith("seconds") else int(value)
        return out
