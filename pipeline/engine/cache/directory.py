"""A prefix cache's directory: its index opened, recovered and kept, its locks, its left-overs.

:class:`CacheDirectory` is what :class:`~.store.PrefixCache` stands on: the states
themselves (lookup, save, load) are :mod:`.store`'s, the files :mod:`.files`', the
index :mod:`.index`'s.

Faults cost time, never an answer
    Nothing here raises during a prompt. A directory that cannot be created or used
    (``cache.path`` names a file, no permission) makes the cache *unavailable*
    (:attr:`CacheDirectory.unavailable` says why) and every prompt runs uncached. A
    read-only directory is used read-only: saved states still load, nothing new is
    saved. A damaged index (not a database, corrupt pages) is rebuilt empty the
    moment it is seen, and the state files it described are swept away. Other
    failures (a busy index, a full disk) make that one lookup a miss or that one
    save not happen, with :attr:`CacheDirectory.last_error` saying why. Notes about
    what was done (:meth:`CacheDirectory.take_notes`) reach the prompt's stats.

Left-overs
    A state file that no index row names (its process crashed between writing and
    indexing, or the index was lost) is an orphan: :meth:`CacheDirectory.sweep` deletes
    orphans older than a few minutes, and rows whose file is gone. It runs when a
    cache is opened, at most once an hour per directory (:data:`SWEEP_INTERVAL`),
    after a rebuild, and on :meth:`CacheDirectory.clear`; its cost is one directory
    listing. A new index made beside state files means the index was lost: its
    orphans are removed at once, with a note (they cannot be found again).

"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ...disk import is_disk_full
from ...errors import Cancelled, ConfigError, DiskFullError, EngineError
from .files import is_state_file, sweep_files
from .index import INDEX_NAME, CacheIndex, Entry, is_damaged

LOCK_NAME = "index.lock"

SWEEP_INTERVAL = 3600.0
"""Seconds between two automatic sweeps of one cache directory."""

_ORPHAN_AGE = 600.0  # seconds before an unindexed state or temporary file counts as left over
_REBUILT_ORPHAN_AGE = 60.0  # after a lost index nothing old can be found again


class CacheDirectory:
    """One cache directory and its index. Opening never raises: a directory that cannot be used is
    :attr:`unavailable` (and why), one that cannot be written :attr:`read_only`, a damaged index is
    rebuilt and a lost one made again, each with a note (:meth:`take_notes`)."""

    def __init__(self, directory: str | os.PathLike[str], *, timeout: float = 30.0):
        self.directory = Path(directory)
        self.timeout = timeout
        self.last_error = ""
        #: Why the cache cannot be used at all ("" when it can); prompts then run uncached.
        self.unavailable = ""
        self._full = False  # it cannot be used because its disk is full
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
            self._full = is_disk_full(exc, self.directory)
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
                self._full = is_disk_full(exc, self.directory)
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
    def exclusive(self, name: str, *, on_wait: Callable[[str], None] | None = None,
                  cancelled: Callable[[], bool] = lambda: False) -> Iterator[bool]:
        """An exclusive lock on the file ``name`` of the directory, across processes (and across the threads
        of one), held through the block: yields whether it had to wait for another holder. For work that
        two processes must not do twice at once (warming one set of section states). Before waiting,
        ``on_wait(holder)`` is told who holds it (" (pid N)", or ""); ``cancelled()`` true stops the wait
        with :class:`~pipeline.errors.Cancelled`."""
        fd = os.open(self.directory / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            waited = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited and on_wait is not None:
                        on_wait(_holder(fd))
                    waited = True
                    if cancelled():
                        raise Cancelled("cancelled while waiting for another process") from None
                    time.sleep(0.2)
            try:  # who holds it, for a process that waits for it
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError:
                pass
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

    # -- maintenance --------------------------------------------------------------------------

    def _require(self) -> CacheIndex:
        """The index, for the maintenance calls a person makes (``rag cache``): errors are raised."""
        if self._index is None:
            if self._full:
                raise DiskFullError(f"the prefix cache cannot be used: {self.unavailable}: the disk holding "
                                    f"{self.directory} is full. Free some space, or point cache.path elsewhere")
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


def _holder(fd: int) -> str:
    """Who holds a lock file (" (pid N)"), as its holder wrote it; "" where unknown."""
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


__all__ = ["CacheDirectory", "LOCK_NAME", "SWEEP_INTERVAL"]
