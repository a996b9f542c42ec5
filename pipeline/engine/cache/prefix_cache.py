"""Prefix KV states on disk: the second question about the same documents starts answering at once.

A :class:`PrefixCache` is a directory holding one llama.cpp sequence-state file per
entry (:mod:`.files`: unique names, atomic writes, digests, durability) and an index of
what each file holds (:mod:`.index`, keyed as :mod:`.keys` describes). Several
processes may use one directory at the same time: index writes are SQLite
transactions, and no process ever overwrites a file another one may be reading. How
the directory is opened, kept and recovered (a damaged or lost index, a read-only
directory, left-over files) is :mod:`.directory`.

Integrity
    The index records each file's size and a digest. :meth:`PrefixCache.load`
    checks both *before* llama.cpp reads the file (a damaged file given to
    llama.cpp's loader could make it allocate wildly or assert), then checks that
    llama.cpp restored exactly the claimed tokens. Any failure clears the
    sequence, deletes the entry and its file, and returns False: the caller
    prefills from scratch, so a bad cache costs time, never a wrong answer.

What the caller guarantees
    :meth:`PrefixCache.save` saves sequence ``seq`` of a model as it is: the caller
    makes sure it holds exactly ``tokens`` at positions ``0..n-1`` (checked: the
    sequence's last position must be ``n - 1``). States hold the KV memory only,
    not logits, so after :meth:`PrefixCache.load` at least one token must still
    be decoded before sampling; :meth:`PrefixCache.lookup` leaves at least one by
    default (``max_tokens = len(tokens) - 1``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import TYPE_CHECKING, Collection, Sequence

from ...disk import free_bytes, is_disk_full
from ...errors import EngineError
from .capacity import cap
from .directory import SWEEP_INTERVAL, CacheDirectory
from .files import check_file, state_name, write_state
from .index import Entry, is_damaged
from .protocol import ExactLookup
from .keys import SHORT_BLOCK_HASH, block_hash, chain_hashes, full_hash, token_bytes

if TYPE_CHECKING:
    from .._llama import Model


class PrefixCache(CacheDirectory, ExactLookup):
    """Prefix KV states of llama.cpp sequences, on disk, with an SQLite index.

    ``max_bytes`` caps the total size of the state files (0: a share of the disk, read again at
    each save; :meth:`budget_bytes`, :mod:`.budget`); saving past it evicts the least useful
    entries first (used least, by last save or successful load, longest ago). Opening never
    raises: see :attr:`unavailable` and the module notes on faults.
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int, fsync: bool = False,
                 timeout: float = 30.0, section_type: str = "f16"):
        self.max_bytes = int(max_bytes)
        self.fsync = fsync
        #: The KV type section states are kept in (:class:`~.sections.SectionStates`): ``"f16"`` as the
        #: engine computes them, ``"q8_0"`` about half the size (``cache.section_type``).
        self.section_type = section_type
        self.last_load_seconds = 0.0
        self.last_save_seconds = 0.0
        #: Whether the last :meth:`save` failed for lack of space on the cache's disk.
        self.disk_full = False
        super().__init__(directory, timeout=timeout)

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
             start: int = 0, stored: str = "") -> Entry | None:
        """Save sequence ``seq`` of ``model``, which holds exactly ``tokens`` at positions ``start..``;
        ``stored`` ``"q8_0"`` keeps its f16 keys and values as q8_0 (:meth:`load` turns them back).

        Returns the entry, or None when nothing was saved (empty, larger than the whole
        cap, the sequence does not end at position ``start + len(tokens) - 1``, llama.cpp
        failed, the cache is read-only or its index or disk failed; :attr:`last_error`
        says which). If the same prefix is already saved, it is marked used and returned
        instead. Evicts the least useful entries to stay within :meth:`budget_bytes`.
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
        if stored and stored != "f16":  # q8_0 keeps 34 bytes of 64
            expected = expected * 17 // 32
        try:
            limit = self._limit()
        except sqlite3.Error as exc:
            self._fault("save", exc)
            return None
        if expected > limit:
            self.last_error = f"the state ({expected:,} bytes) is larger than the cache ({limit:,})"
            return None

        name = state_name(namespace, fh)
        try:
            written = write_state(self.directory, name, model, tokens, seq=seq, fsync=self.fsync, stored=stored)
        except OSError as exc:
            return self._not_written(exc, f"could not write the state file: {exc}", need=expected)
        if written is None:
            why = getattr(model, "last_save_error", "") or "llama.cpp gave no reason"
            return self._not_written(OSError(why), f"llama.cpp could not save the sequence state ({why})",
                                     need=expected)
        size, digest = written

        if size > limit:  # it alone is over the cap: do not keep it
            self._unlink(name)
            self.last_error = f"the state ({size:,} bytes) is larger than the cache ({limit:,})"
            return None
        return self._index_new(namespace, data, fh, name, size, digest, t0)

    def _index_new(self, namespace: str, data: bytes, fh: str, name: str, size: int, digest: str,
                   t0: float) -> Entry | None:
        """Index the state file ``name`` just written (evicting past ``max_bytes``): its entry, or None
        when the index failed (the file is then removed)."""
        n = len(data) // 4
        remove: list[str] = []
        try:
            with self._index.write() as db:
                new_id = self._index.insert(db, namespace=namespace, n_tokens=n, full_hash=fh,
                                            block_hash=block_hash(n, chain_hashes(data)), file=name, size=size,
                                            digest=digest, now=time.time())
                if new_id is not None:
                    used = db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
                    evicted = self._index.evict(db, self._limit(used), keep=new_id)
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

    # -- the budget ---------------------------------------------------------------------------

    def budget_bytes(self) -> int:
        """The bytes the cache may hold now: ``max_bytes``, or where that is 0 the share of its disk
        :func:`.budget.cap` gives (read now: it follows the disk). 0 where the cache is unavailable."""
        if self._index is None:
            return 0
        try:
            return self._limit()
        except sqlite3.Error as exc:
            self._fault("budget", exc)
            return 0

    def room(self) -> int:
        """The bytes new states may take now (what warming section states may spend): the budget less
        what the states a new one would not evict hold, those restored and used recently enough
        (:func:`.budget.usefulness`) to be worth more than a state just saved and never restored. States
        never restored count as room: new ones replace them, the longest unused first. 0 where the cache
        is unavailable or read-only."""
        if self._index is None or self.read_only:
            return 0
        try:
            used = self._index.total_bytes()
            return max(0, self._limit(used) - self._index.bytes_worth_more_than_new(time.time()))
        except sqlite3.Error as exc:
            self._fault("budget", exc)
            return 0

    @property
    def auto(self) -> bool:
        """Whether the cap follows the disk (``max_bytes`` 0, ``cache.max_gb = 0``)."""
        return self.max_bytes <= 0

    def _limit(self, used: int | None = None) -> int:
        if not self.auto:
            return self.max_bytes
        return cap(self.directory, self._index.total_bytes() if used is None else used)

    # -- maintenance --------------------------------------------------------------------------

    def stats(self) -> dict:
        """Entries, bytes, cap, hits and the other counters, per-namespace counts, bytes per token."""
        try:
            st = self._require().stats()
        except sqlite3.Error as exc:
            if not is_damaged(exc):
                raise EngineError(f"could not read the prefix cache index: {exc}") from None
            self._rebuild(exc)
            st = self._require().stats()
        used = st.pop("bytes")
        return {"directory": str(self.directory), "entries": st.pop("entries"), "bytes": used,
                "max_bytes": self._limit(used),
                "budget": "auto" if self.auto else "fixed", **st}


__all__ = ["PrefixCache", "SWEEP_INTERVAL"]
