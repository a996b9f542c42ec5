"""Section states on disk: each section's KV cells, computed once after the prompt head, found by content.

A section state is one entry of the prefix cache (:class:`.cache.prefix_cache.PrefixCache`: same
directory, same budget and eviction order, same integrity checks and crash safety), in a
namespace of its own: :func:`namespace` hashes the engine's namespace (the model file and
every setting that shapes its KV cache) with the head's tokens (the chat template's start
and the system prompt the section was computed after) and the type the states are kept in
(the cache's ``section_type``: ``q8_0`` keeps an f16 engine's keys and values in half the
bytes, :mod:`pipeline.engine._llama.state_codec`). Within it
the entry is keyed by the hash of the section's tokens, so a changed document, a
changed header or another system prompt never finds a stale state. The state holds the
section's cells alone, at the positions right after the head (``len(head)..``), which
is where :mod:`.compose` restores it before moving it to its place.

Why a state was not found is said per section (:meth:`SectionStates.why`): "no state
yet", "evicted" for a section this cache directory saved before (recorded, with when, in a
side table of the directory's own, ``sections.sqlite``; if that table is lost, an evicted
section just reads as "no state yet"), or "lost with the cache index" for one saved before
the index was made again (deleted or damaged: raising ``cache.max_gb`` would not help).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Sequence

from ..._sqlite import connect, transaction
from ..._testhooks import crash_point
from .index import Entry
from .keys import full_hash, token_bytes
from .prefix_cache import PrefixCache
from ...records import Piece

SEEN_NAME = "sections.sqlite"
NO_STATE, EVICTED, LOST = "no state yet", "evicted", "lost with the cache index"


def namespace(engine_namespace: str, head: Sequence[int], stored: str = "f16") -> str:
    """The namespace of section states computed by one engine after ``head`` and kept as ``stored``
    (states kept in another type are other states: a composition from them is another approximation)."""
    payload = f"rag section states v1\0{engine_namespace}\0{full_hash(token_bytes(head))}"
    if stored != "f16":
        payload += f"\0stored {stored}"
    return hashlib.sha256(payload.encode()).hexdigest()


def kept_types(section_type: str, type_k: str, type_v: str, *, flash_attn: bool = True) -> tuple[str, str]:
    """The KV types a section state is kept in on disk: ``section_type`` where it applies (an f16 cache
    with flash attention: without it llama.cpp keeps V transposed, which is kept as computed), else the
    engine's own. What :meth:`~pipeline.engine.gguf.info.ModelInfo.state_bytes` sizes a state with."""
    if section_type != "f16" and type_k == type_v == "f16" and flash_attn:
        return section_type, section_type
    return type_k, type_v


class SectionStates:
    """The section states of one engine and one prompt head, in ``cache`` (what :func:`.compose.compose` reads).

    Never raises during a prompt: a fault costs the reuse of that section (it is computed
    again), and :attr:`notes` says what happened.
    """

    def __init__(self, cache: PrefixCache, engine_namespace: str, head: Sequence[int]):
        self.cache = cache
        #: The KV type the states are kept in (the cache's ``section_type``; ``"f16"``: as computed).
        self.stored = cache.section_type
        self.namespace = namespace(engine_namespace, head, self.stored)
        self.start = len(head)
        self.saved = 0  # states saved through this object
        self.saved_bytes = 0
        #: Why the last save failed for lack of space ("" while none has): once the disk is full, no
        #: other save is tried through this object (each would write a file only to fail too).
        self.full = ""
        self._unsaved: dict[str, int] = {}  # why states were not saved -> how many
        self._why: dict[tuple[int, ...], str] = {}
        self._seen: sqlite3.Connection | None = None

    # -- lookup ---------------------------------------------------------------------------------

    def find(self, piece: Piece) -> Entry | None:
        """The saved state of ``piece``, without using it."""
        return self.cache.find(self.namespace, piece.tokens)

    def held(self, pieces: Sequence[Piece]) -> list[bool]:
        """Which of ``pieces`` have a saved state whose file is there (what a packer or a pool weighs
        prompts by; a probe: nothing is changed)."""
        return [(e := self.find(p)) is not None and self.cache.present(e) for p in pieces]

    def verified(self, piece: Piece) -> Entry | None:
        """The saved state of ``piece`` if its file is there and whole (size and checksum); a missing or
        damaged one is dropped, and :meth:`damaged` then says why."""
        entry = self.find(piece)
        if entry is None:
            return None
        if self.cache.verify(entry):
            return entry
        self._why[piece.tokens] = f"its state was discarded ({self.cache.last_error})"
        return None

    def damaged(self, piece: Piece) -> str:
        """Why ``piece``'s state was dropped by :meth:`verified` or :meth:`restore` ("" when it was not)."""
        why = self._why.get(piece.tokens, "")
        return why if why.startswith("its state was discarded") else ""

    def restore(self, piece: Piece, model, seq: int, start: int) -> bool:
        entry = self.find(piece)
        if entry is None:
            seen = self._seen_at(piece)
            self._why[piece.tokens] = (NO_STATE if seen is None else
                                       LOST if seen < self.cache.index_created else EVICTED)
            return False
        if self.cache.load(entry, model, seq=seq, start=start):
            return True
        self._why[piece.tokens] = f"its state was discarded ({self.cache.last_error})"
        return False

    def why(self, piece: Piece) -> str:
        return self._why.get(piece.tokens, NO_STATE)

    # -- saving ---------------------------------------------------------------------------------

    @property
    def notes(self) -> list[str]:
        """What went wrong saving, one line per cause (a question whose states cannot be saved says so
        once, not once per section)."""
        return [f"{n} section state{'s' * (n != 1)} not saved: {why}" for why, n in self._unsaved.items()]

    def store(self, piece: Piece, model, seq: int, start: int) -> None:
        if self.cache.read_only or self.cache.unavailable:
            return
        if self.full:
            self._unsaved[self.full] += 1
            return
        t0 = time.time()
        entry = self.cache.save(self.namespace, piece.tokens, model, seq=seq, start=start,
                                **({"stored": self.stored} if self.stored != "f16" else {}))
        if entry is None:
            if self.cache.last_error:
                self._unsaved[self.cache.last_error] = self._unsaved.get(self.cache.last_error, 0) + 1
            if self.cache.disk_full:
                self.full = self.cache.last_error
            return
        if entry.created >= t0:
            self.saved += 1
            self.saved_bytes += entry.bytes
        self._mark_seen(piece)
        crash_point("SECTION_SAVED")

    # -- which sections this directory saved before ------------------------------------------------

    def _db(self) -> sqlite3.Connection | None:
        if self._seen is None and not self.cache.unavailable:
            try:
                db = connect(Path(self.cache.directory) / SEEN_NAME, check_same_thread=False)
                db.execute("CREATE TABLE IF NOT EXISTS seen (namespace TEXT NOT NULL, full_hash TEXT NOT NULL, "
                           "PRIMARY KEY (namespace, full_hash))")
                if "saved" not in {r[1] for r in db.execute("PRAGMA table_info(seen)")}:  # (rows before: 0)
                    try:
                        db.execute("ALTER TABLE seen ADD COLUMN saved REAL NOT NULL DEFAULT 0")
                    except sqlite3.OperationalError as exc:  # another process added it meanwhile
                        if "duplicate column" not in str(exc):
                            raise
                self._seen = db
            except sqlite3.Error:
                return None
        return self._seen

    def _seen_at(self, piece: Piece) -> float | None:
        """When this directory last saved ``piece``'s state (0: before that was recorded); None: never."""
        db = self._db()
        if db is None:
            return None
        try:
            row = db.execute("SELECT saved FROM seen WHERE namespace = ? AND full_hash = ?",
                             (self.namespace, full_hash(token_bytes(piece.tokens)))).fetchone()
        except sqlite3.Error:
            return None
        return None if row is None else float(row[0])

    def _mark_seen(self, piece: Piece) -> None:
        db = self._db()
        if db is None:
            return
        try:
            with transaction(db):
                db.execute("INSERT INTO seen (namespace, full_hash, saved) VALUES (?, ?, ?) "
                           "ON CONFLICT (namespace, full_hash) DO UPDATE SET saved = excluded.saved",
                           (self.namespace, full_hash(token_bytes(piece.tokens)), time.time()))
        except sqlite3.Error:
            pass

    def close(self) -> None:
        if self._seen is not None:
            self._seen.close()
            self._seen = None


__all__ = ["EVICTED", "LOST", "NO_STATE", "SectionStates", "kept_types", "namespace"]
