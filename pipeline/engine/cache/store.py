"""Prefix KV states on disk: the second question about the same documents starts answering at once.

A :class:`PrefixCache` is a directory holding one llama.cpp sequence-state file per
entry (:mod:`.files`: unique names, atomic writes, digests, durability) and an index of
what each file holds (:mod:`.index`, keyed as :mod:`.keys` describes). Several
processes may use one directory at the same time: index writes are SQLite
transactions, and no process ever overwrites a file another one may be reading.

Integrity
    The index records each file's size and a digest. :meth:`PrefixCache.load`
    checks both *before* llama.cpp reads the file (a damaged file given to
    llama.cpp's loader could make it allocate wildly or assert), then checks that
    llama.cpp restored exactly the claimed tokens. Any failure clears the
    sequence, deletes the entry and its file, and returns False: the caller
    prefills from scratch, so a bad cache costs time, never a wrong answer.

Faults cost time, never an answer
    Nothing here raises during a prompt. A directory that cannot be created or used
    (``cache.path`` names a file, no permission) makes the cache *unavailable*
    (:attr:`PrefixCache.unavailable` says why) and every prompt runs uncached. A
    read-only directory is used read-only: saved states still load, nothing new is
    saved. A damaged index (not a database, corrupt pages) is rebuilt empty the
    moment it is seen, and the state files it described are swept away. Other
    failures (a busy index, a full disk) make that one lookup a miss or that one
    save not happen, with :attr:`PrefixCache.last_error` saying why. Notes about
    what was done (:meth:`PrefixCache.take_notes`) reach the prompt's stats.

Left-overs
    A state file that no index row names (its process crashed between writing and
    indexing, or the index was lost) is an orphan: :meth:`PrefixCache.sweep` deletes
    orphans older than a few minutes, and rows whose file is gone. It runs when a
    cache is opened, at most once an hour per directory (:data:`SWEEP_INTERVAL`),
    after a rebuild, and on :meth:`PrefixCache.clear`; its cost is one directory
    listing. A new index made beside state files means the index was lost: its
    orphans are removed at once, with a note (they cannot be found again).

What the caller guarantees
    :meth:`PrefixCache.save` saves sequence ``seq`` of a model as it is: the caller
    makes sure it holds exactly ``tokens`` at positions ``0..n-1`` (checked: the
    sequence's last position must be ``n - 1``). States hold the KV memory only,
    not logits, so after :meth:`PrefixCache.load` at least one token must still
    be decoded before sampling; :meth:`PrefixCache.lookup` leaves at least one by
    default (``max_tokens = len(tokens) - 1``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Iterator, Sequence

from ...disk import free_bytes, is_disk_full
from ...errors import ConfigError, EngineError
from .files import check_file, is_state_file, state_name, sweep_files, write_state
from .index import INDEX_NAME, CacheIndex, Entry, is_damaged
from .protocol import ExactLookup
from .keys import SHORT_BLOCK_HASH, block_hash, chain_hashes, full_hash, token_bytes

if TYPE_CHECKING:
    from .._llama import Model

LOCK_NAME = "index.lock"

SWEEP_INTERVAL = 3600.0
"""Seconds between two automatic sweeps of one cache directory."""

_ORPHAN_AGE = 600.0  # seconds before an unindexed state or temporary file counts as left over
_REBUILT_ORPHAN_AGE = 60.0  # after a lost index nothing old can be found again


class PrefixCache(ExactLookup):
    """Prefix KV states of llama.cpp sequences, on disk, with an SQLite index and LRU eviction.

    ``max_bytes`` caps the total size of the state files; saving past it evicts
    the least recently used entries (by last save or successful load). Opening
    never raises: see :attr:`unavailable` and the module notes on faults.
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int, fsync: bool = False,
                 timeout: float = 30.0):
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.fsync = fsync
        self.timeout = timeout
        self.last_load_seconds = 0.0
        self.last_save_seconds = 0.0
        self.last_error = ""
        #: Whether the last :meth:`save` failed for lack of space on the cache's disk.
        self.disk_full = False
        #: Why the cache cannot be used at all ("" when it can); prompts then run uncached.
        self.unavailable = ""
        self._notes: list[str] = []
        self.swept_bytes = 0  # what the last sweep freed
        self._lock = threading.RLock()
        self._index: CacheIndex | None = None
        self._open()

    # -- opening, faults, rebuilding ----------------------------------------------------------

    @property
    def read_only(self) -> bool:
        """Whether saved states can be loaded but nothing can be written (a read-only directory)."""
        return self._index is not None and self._index.read_only

    def _open(self) -> None:
        if self.directory.exists() and not self.directory.is_dir():
            self.unavailable = f"{self.directory} is not a directory"
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.unavailable = f"cannot create {self.directory}: {exc.strerror or exc}"
            return
        index_path = self.directory / INDEX_NAME
        try:
            self._index = CacheIndex(index_path, timeout=self.timeout)
        except sqlite3.Error as exc:
            if is_damaged(exc):
                self._rebuild(exc)
                return
            if os.access(self.directory, os.W_OK) or not index_path.exists():
                self.unavailable = f"cannot open {index_path}: {exc}"
                return
            try:  # a read-only directory: use what is there, save nothing
                self._index = CacheIndex(index_path, timeout=self.timeout, read_only=True)
            except sqlite3.Error as exc2:
                self.unavailable = f"{self.directory} is read-only and its index cannot be read ({exc2})"
                return
            self._notes.append(f"the prefix cache {self.directory} is read-only: saved states are used, "
                               "no new ones are saved")
            return
        if self._index.stale:  # written by another version of the key scheme: start over
            self._remove_files(self._index.reformat())
            self.sweep(min_age=0.0)
            return
        if self._index.made:
            self._adopt_lost()
            return
        self._maybe_sweep()

    def _adopt_lost(self) -> None:
        """A new index beside state files: the index was lost (deleted by hand, a disk restored without
        it). Its states cannot be found again (their names hold a digest of what they are, not what):
        they are removed at once, not left outside ``cache.max_gb`` until a sweep, and it is said."""
        removed = self.sweep(min_age=0.0, temp_age=_ORPHAN_AGE)  # a temporary file may be a save in flight
        if removed:
            self._notes.append(f"the prefix cache index {self.directory / INDEX_NAME} was missing: rebuilt empty, "
                               f"{removed} orphaned state file(s) ({self.swept_bytes / 1e6:,.1f} MB) removed "
                               "(their prefixes are computed again and saved)")

    @contextlib.contextmanager
    def _directory_lock(self) -> Iterator[None]:
        """An exclusive lock on the directory (across processes), for rebuilding the index."""
        with self.exclusive(LOCK_NAME):
            yield

    @contextlib.contextmanager
    def exclusive(self, name: str) -> Iterator[bool]:
        """An exclusive lock on the file ``name`` of the directory, across processes (and across the threads
        of one), held through the block: yields whether it had to wait for another holder. For work that
        two processes must not do twice at once (warming one set of section states)."""
        fd = os.open(self.directory / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                waited = False
            except BlockingIOError:
                fcntl.flock(fd, fcntl.LOCK_EX)
                waited = True
            yield waited
        finally:
            os.close(fd)

    def _rebuild(self, cause: BaseException) -> None:
        """Replace a damaged index with an empty one (unless another process already did); sweep orphans."""
        with self._lock:
            old, self._index = self._index, None
            if old is not None:
                with contextlib.suppress(sqlite3.Error):
                    old.close()
            index_path = self.directory / INDEX_NAME
            try:
                with self._directory_lock():
                    try:  # another process may have rebuilt it meanwhile
                        self._index = CacheIndex(index_path, timeout=self.timeout)
                        if self._index.intact():
                            return
                        raise sqlite3.DatabaseError("database disk image is malformed")
                    except sqlite3.Error as exc:
                        if not is_damaged(exc):
                            raise
                        if self._index is not None:
                            self._index.close()
                            self._index = None
                        for suffix in ("", "-wal", "-shm", "-journal"):
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(f"{index_path}{suffix}")
                        self._index = CacheIndex(index_path, timeout=self.timeout)
            except (OSError, sqlite3.Error) as exc:
                self._index = None
                self.unavailable = f"the index {index_path} is damaged ({cause}) and cannot be rebuilt: {exc}"
                return
            removed = self.sweep(min_age=_REBUILT_ORPHAN_AGE)
            self._notes.append(f"the prefix cache index {index_path} was damaged ({cause}): rebuilt empty"
                               + (f", {removed} orphaned state file(s) removed" if removed else ""))

    def _fault(self, what: str, exc: BaseException) -> None:
        """Record a failed index operation; a damaged index is rebuilt at once."""
        self.last_error = f"prefix cache {what} failed: {exc}"
        if isinstance(exc, sqlite3.Error) and is_damaged(exc):
            self._rebuild(exc)

    @property
    def index_created(self) -> float:
        """When the index was made (0: before this was recorded, or none): what a directory saved before
        then was lost with an earlier index."""
        return self._index.created if self._index is not None else 0.0

    def take_notes(self) -> list[str]:
        """What the cache did about faults since the last call (rebuilt, read-only...), for a prompt's notes."""
        with self._lock:
            notes, self._notes = self._notes, []
        return notes

    def _path(self, entry: Entry) -> Path:
        return self.directory / entry.file

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(OSError):
            (self.directory / name).unlink()

    def _remove_files(self, names: Sequence[str]) -> None:
        for name in names:
            self._unlink(name)

    def close(self) -> None:
        with self._lock:
            if self._index is not None:
                self._index.close()
                self._index = None

    def __enter__(self) -> PrefixCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- lookup -------------------------------------------------------------------------------

    def lookup(self, namespace: str, tokens: Sequence[int], *, max_tokens: int | None = None,
               min_tokens: int = 1, lengths: Collection[int] | None = None, count: bool = True
               ) -> Entry | None:
        """The longest saved prefix of ``tokens`` in ``namespace`` of ``min_tokens..max_tokens`` tokens.

        ``max_tokens`` defaults to ``len(tokens) - 1``: a restored state has no logits,
        so at least one token must be left to decode. ``lengths`` admits only entries of
        those lengths (a prompt's split points). Counts a miss when nothing fits, unless
        ``count`` is off (a probe, not a use). None also when the index fails
        (:attr:`last_error` says why).
        """
        self.last_error = ""
        limit = len(tokens) - 1 if max_tokens is None else min(max_tokens, len(tokens))
        if self._index is None or limit < max(min_tokens, 1):
            return None
        data = memoryview(token_bytes(tokens))[:4 * limit]
        keys = [SHORT_BLOCK_HASH] + chain_hashes(data)
        try:
            for entry in self._index.candidates(namespace, keys, limit):
                if entry.n_tokens < min_tokens:
                    break
                if lengths is not None and entry.n_tokens not in lengths:
                    continue
                if full_hash(data[:4 * entry.n_tokens]) == entry.full_hash:
                    return entry
            if count and not self.read_only:
                self._index.add(misses=1)
        except sqlite3.Error as exc:
            self._fault("lookup", exc)
        return None

    def entries(self, namespace: str | None = None) -> list[Entry]:
        """Every entry (of one namespace), most recently used first."""
        return self._require().entries(namespace)

    # -- save ---------------------------------------------------------------------------------

    def save(self, namespace: str, tokens: Sequence[int], model: Model, *, seq: int = 0,
             start: int = 0) -> Entry | None:
        """Save sequence ``seq`` of ``model``, which holds exactly ``tokens`` at positions ``start..``.

        Returns the entry, or None when nothing was saved (empty, larger than the whole
        cap, the sequence does not end at position ``start + len(tokens) - 1``, llama.cpp
        failed, the cache is read-only or its index or disk failed; :attr:`last_error`
        says which). If the same prefix is already saved, it is marked used and returned
        instead. Evicts least recently used entries to stay within ``max_bytes``.
        """
        t0 = time.perf_counter()
        self.last_error = ""
        self.disk_full = False
        if self._index is None:
            self.last_error = f"the prefix cache is unavailable: {self.unavailable}"
            return None
        if self.read_only:
            self.last_error = f"the prefix cache {self.directory} is read-only"
            return None
        tokens = list(tokens)
        n = len(tokens)
        if n == 0:
            self.last_error = "nothing to save"
            return None
        data = token_bytes(tokens)
        fh = full_hash(data)
        try:
            existing = self._existing(namespace, fh)
        except sqlite3.Error as exc:
            self._fault("save", exc)
            return None
        if existing is not None:
            return existing
        pos_max = model.seq_end(seq)
        if pos_max != start + n - 1:
            self.last_error = f"sequence {seq} ends at position {pos_max}, not {start + n - 1}: not saved"
            return None
        expected = model.state_size(seq) + 12 + 4 * n
        if expected > self.max_bytes:
            self.last_error = f"the state ({expected:,} bytes) is larger than the cache ({self.max_bytes:,})"
            return None

        name = state_name(namespace, fh)
        try:
            written = write_state(self.directory, name, model, tokens, seq=seq, fsync=self.fsync)
        except OSError as exc:
            return self._not_written(exc, f"could not write the state file: {exc}", need=expected)
        if written is None:
            why = getattr(model, "last_save_error", "") or "llama.cpp gave no reason"
            return self._not_written(OSError(why), f"llama.cpp could not save the sequence state ({why})",
                                     need=expected)
        size, digest = written

        if size > self.max_bytes:  # it alone is over the cap: do not keep it
            self._unlink(name)
            self.last_error = f"the state ({size:,} bytes) is larger than the cache ({self.max_bytes:,})"
            return None
        now = time.time()
        remove: list[str] = []
        try:
            with self._index.write() as db:
                new_id = self._index.insert(db, namespace=namespace, n_tokens=n, full_hash=fh,
                                            block_hash=block_hash(n, chain_hashes(data)), file=name, size=size,
                                            digest=digest, now=now)
                if new_id is not None:
                    evicted = self._index.evict(db, self.max_bytes, keep=new_id)
                    remove += evicted
                    self._index.count(db, saves=1, evictions=len(evicted), save_seconds=time.perf_counter() - t0)
                else:  # another process saved the same prefix meanwhile: keep theirs
                    remove.append(name)
        except sqlite3.Error as exc:
            self._unlink(name)
            self._fault("save", exc)
            if is_disk_full(exc, self.directory):
                self.disk_full = True
                self.last_error = f"the disk holding the prefix cache {self.directory} is full ({exc})"
            return None
        self._remove_files(remove)
        self.last_save_seconds = time.perf_counter() - t0
        try:
            return self._existing(namespace, fh) if new_id is None else self._index.get(new_id)
        except sqlite3.Error as exc:
            self._fault("save", exc)
            return None

    def _not_written(self, exc: OSError | None, why: str, *, need: int) -> None:
        """A state file that could not be written: :attr:`last_error` says why, and :attr:`disk_full`
        whether it was for lack of space (then the message says the disk is full, and how full)."""
        self.disk_full = is_disk_full(exc, self.directory, need=need)
        if self.disk_full:
            free = free_bytes(self.directory)
            room = f"{free:,} bytes free, a state of about {need:,} bytes to write" if free is not None else ""
            said = (exc.strerror or str(exc)) if exc is not None else ""
            detail = "; ".join(x for x in (said, room) if x)
            why = f"the disk holding the prefix cache {self.directory} is full ({detail})"
        self.last_error = why
        return None

    def _existing(self, namespace: str, fh: str) -> Entry | None:
        """The entry saved for this prefix, marked used; a row whose file is gone is removed."""
        entry = self._index.find(namespace, fh)
        if entry is None:
            return None
        try:
            ok = self._path(entry).stat().st_size == entry.bytes
        except OSError:
            ok = False
        if not ok:
            self._drop(entry, "state file missing or changed")
            return None
        entry.last_used = time.time()
        self._index.touch(entry, entry.last_used)
        return entry

    # -- load ---------------------------------------------------------------------------------

    def load(self, entry: Entry, model: Model, *, seq: int = 0, start: int = 0) -> bool:
        """Restore ``entry`` into sequence ``seq`` of ``model``; True when it holds exactly its tokens
        (at positions ``start..``, where it was saved from).

        The file's size and digest are checked before llama.cpp reads it, and the tokens
        llama.cpp restored are checked after. On any failure the sequence is cleared (it
        may hold a partial state), the entry and its file are deleted, :attr:`last_error`
        says why, and False is returned: prefill from scratch. On success the entry is
        marked used. :attr:`last_load_seconds` is the time taken, checks included.
        """
        t0 = time.perf_counter()
        self.last_error = ""
        self.last_load_seconds = 0.0
        path = self._path(entry)
        damage = check_file(path, size=entry.bytes, digest=entry.digest)
        if damage:
            return self._fail(entry, None, seq, damage, t0)
        n_ctx = model.n_ctx
        if entry.n_tokens > n_ctx:  # a caller's mistake (namespace without n_ctx), not a bad entry
            self.last_error = f"the state holds {entry.n_tokens:,} tokens; the context only {n_ctx:,}"
            return False
        restored = model.load_state(path, capacity=entry.n_tokens + 1, seq=seq)
        if restored is None:
            return self._fail(entry, model, seq, "llama.cpp could not restore the state", t0)
        n = len(restored)
        if n != entry.n_tokens or full_hash(token_bytes(restored)) != entry.full_hash:
            return self._fail(entry, model, seq, "the restored tokens are not the entry's", t0)
        if model.seq_end(seq) != start + n - 1:
            return self._fail(entry, model, seq, "the restored sequence does not end where it should", t0)
        seconds = time.perf_counter() - t0
        self.last_load_seconds = seconds
        entry.last_used = time.time()
        entry.hits += 1
        if not self.read_only:
            try:  # the state is restored and checked: a failed bookkeeping write does not undo that
                self._index.touch(entry, entry.last_used, hit_tokens=n, load_seconds=seconds)
            except sqlite3.Error as exc:
                self._fault("bookkeeping", exc)
        return True

    def present(self, entry: Entry) -> bool:
        """Whether ``entry``'s file is there at its indexed size (one ``stat``, changing nothing): what a
        probe of which states are held counts by, so that an entry whose file is gone is not held."""
        try:
            return self._path(entry).stat().st_size == entry.bytes
        except OSError:
            return False

    def verify(self, entry: Entry) -> bool:
        """Whether ``entry``'s file is there and whole (its size and checksum, as :meth:`load` checks them
        before llama.cpp reads it); one that is not is dropped, row and file, and :attr:`last_error` says why."""
        self.last_error = ""
        damage = check_file(self._path(entry), size=entry.bytes, digest=entry.digest)
        if damage:
            self._drop(entry, damage)
            self.last_error = damage
        return not damage

    def _fail(self, entry: Entry, model: Model | None, seq: int, why: str, t0: float) -> bool:
        if model is not None:
            model.trim(0, seq=seq)
        self._drop(entry, why)
        self.last_load_seconds = time.perf_counter() - t0
        return False

    def _drop(self, entry: Entry, why: str) -> None:
        self.last_error = why
        if self._index is None or self.read_only:
            return
        try:
            self._index.drop(entry)
        except sqlite3.Error as exc:
            self._fault("bookkeeping", exc)
            self.last_error = why
            return
        self._unlink(entry.file)  # file names are unique per save: no other entry uses it

    # -- maintenance --------------------------------------------------------------------------

    def _require(self) -> CacheIndex:
        """The index, for the maintenance calls a person makes (``rag cache``): errors are raised."""
        if self._index is None:
            raise ConfigError(f"the prefix cache cannot be used: {self.unavailable}")
        return self._index

    def forget(self, namespace: str | None = None) -> int:
        """Delete every entry (of one namespace); return how many."""
        files = self._writable().forget(namespace)
        self._remove_files(files)
        return len(files)

    def _writable(self) -> CacheIndex:
        index = self._require()
        if index.read_only:
            raise EngineError(f"the prefix cache {self.directory} is read-only: nothing can be deleted")
        return index

    def clear(self) -> int:
        """Delete every entry, every state and temporary file in the directory, and the counters.

        A damaged index is rebuilt first (opening the cache does that), so this always
        resets a cache whose directory can be written.
        """
        index = self._writable()
        try:
            n = self.forget()
            index.reset_counters()
        except sqlite3.Error as exc:
            if not is_damaged(exc):
                raise EngineError(f"could not clear the prefix cache: {exc}") from None
            self._rebuild(exc)
            n = 0
        for p in self.directory.iterdir():
            if is_state_file(p.name):
                self._unlink(p.name)
        return n

    def sweep(self, *, min_age: float = _ORPHAN_AGE, temp_age: float | None = None) -> int:
        """Remove left-overs of crashed processes or of a lost index: unindexed state files older than
        ``min_age`` seconds (temporary ones: ``temp_age``, by default the same), and rows whose file is
        gone. Returns how many were removed (:attr:`swept_bytes`: the files' bytes)."""
        index = self._index
        self.swept_bytes = 0
        if index is None or index.read_only:
            return 0
        try:
            known = index.files()
            now = time.time()
            removed, self.swept_bytes, present = sweep_files(self.directory, set(known), min_age=min_age,
                                                             temp_age=temp_age)
            gone = [i for f, i in known.items() if f not in present]
            if gone:
                index.delete_ids(gone)
                removed += len(gone)
            index.set_meta("last_sweep", repr(now))
        except (OSError, sqlite3.Error) as exc:
            self.last_error = f"prefix cache sweep failed: {exc}"
            return 0
        return removed

    def _maybe_sweep(self) -> None:
        """Sweep if this directory was not swept in the last :data:`SWEEP_INTERVAL` seconds."""
        try:
            last = float(self._index.get_meta("last_sweep") or 0.0)
        except (sqlite3.Error, ValueError):
            last = 0.0
        if time.time() - last >= SWEEP_INTERVAL:
            removed = self.sweep()
            if removed:
                self._notes.append(f"{removed} left-over prefix cache file(s) removed")

    def stats(self) -> dict:
        """Entries, bytes, cap, hits and the other counters, per-namespace counts, bytes per token."""
        try:
            st = self._require().stats()
        except sqlite3.Error as exc:
            if not is_damaged(exc):
                raise EngineError(f"could not read the prefix cache index: {exc}") from None
            self._rebuild(exc)
            st = self._require().stats()
        return {"directory": str(self.directory), "entries": st.pop("entries"), "bytes": st.pop("bytes"),
                "max_bytes": self.max_bytes, **st}


__all__ = ["PrefixCache", "SWEEP_INTERVAL"]
