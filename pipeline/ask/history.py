"""Pack history: the packs recent questions used, and why a prompt reused less than its whole prefix.

Stable packing (:mod:`.packing`) prefers a pack that an earlier question (or a summary,
or ``rag warm``) already prefilled, when it scores nearly as well as the best one: the
candidates come from :class:`PackHistory`. :func:`reuse_note` explains, in words, the
reuse an answer did not get (``AskStats.reuse_lost``), by comparing its pack with the last one.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Sequence

from .._sqlite import connect
from ..records import DocumentRecord, Key, Prompt
from .prompt import label

HISTORY_KEEP = 64
"""Packs remembered per model and collection, most recent first."""


class PackHistory:
    """The packs recent questions used, per model namespace and collection, most recent first.

    Kept in ``packs.sqlite`` beside the prefix cache (shared by processes, like the
    cache), or in memory when there is no cache directory. Only a hint: what is
    really cached is always probed. A damaged or unwritable file costs the hint,
    never an answer.
    """

    def __init__(self, path: Path | None):
        self.path = path
        self._memory: dict[tuple[str, str], list[tuple[Key, ...]]] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._db = connect(path, timeout=5, check_same_thread=False)  # a hint: NORMAL sync is plenty
                self._db.execute("CREATE TABLE IF NOT EXISTS packs (namespace TEXT NOT NULL, collection TEXT "
                                 "NOT NULL, keys TEXT NOT NULL, used REAL NOT NULL, "
                                 "PRIMARY KEY (namespace, collection, keys))")
            except (sqlite3.Error, OSError):
                self._db = None

    def recent(self, namespace: str, collection: str) -> list[tuple[Key, ...]]:
        with self._lock:
            if self._db is not None:
                try:
                    rows = self._db.execute("SELECT keys FROM packs WHERE namespace = ? AND collection = ? "
                                            "ORDER BY used DESC LIMIT ?", (namespace, collection, HISTORY_KEEP))
                    return [tuple(tuple(k) for k in json.loads(r[0])) for r in rows]
                except (sqlite3.Error, ValueError, TypeError):
                    pass
            return list(self._memory.get((namespace, collection), []))

    def record(self, namespace: str, collection: str, keys: Sequence[Key]) -> None:
        keys = tuple(tuple(k) for k in keys)
        if not keys:
            return
        with self._lock:
            packs = self._memory.setdefault((namespace, collection), [])
            if keys in packs:
                packs.remove(keys)
            packs.insert(0, keys)
            del packs[HISTORY_KEEP:]
            if self._db is None:
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("INSERT OR REPLACE INTO packs VALUES (?, ?, ?, ?)",
                                 (namespace, collection, json.dumps(keys), time.time()))
                self._db.execute(
                    "DELETE FROM packs WHERE namespace = ? AND collection = ? AND keys NOT IN (SELECT keys FROM "
                    "packs WHERE namespace = ? AND collection = ? ORDER BY used DESC LIMIT ?)",
                    (namespace, collection, namespace, collection, HISTORY_KEEP))
                self._db.execute("COMMIT")
            except sqlite3.Error:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def reuse_note(prompt: Prompt, *, cached_tokens: int, previous: Sequence[Key] | None,
               documents: dict[str, DocumentRecord], cache_on: bool, min_tokens: int) -> str:
    """Why this prompt reused less than its whole prefix, in words ("" when it reused all of it)."""
    prefix_len = len(prompt.prefix_tokens)
    if cached_tokens >= prefix_len:
        return ""
    if prompt.mode == "passages":
        return ("passage mode: each question packs its own passages, so prompts share little more "
                "than the system prompt")
    keys = [p.section.key for p in prompt.sections]
    if previous is None:
        return "nothing was cached for these documents yet: the first question prefills them (`rag warm` does it ahead)"
    previous = [tuple(k) for k in previous]
    same = 0
    while same < min(len(keys), len(previous)) and keys[same] == previous[same]:
        same += 1
    shared_end = prompt.boundaries[same - 1] if same else 0
    if cached_tokens >= shared_end and same < len(keys):  # what it shared with the last pack was reused
        new = keys[same]
        if same < len(previous):
            old = previous[same]
            record = documents.get(old[0])
            if record is None:
                return f"{label(old[0])} is no longer in the collection: the prompt differs from there on"
            if record.content_hash != old[1]:
                return f"{label(old[0])} changed since it was last packed: its sections are new"
            return (f"this question needs other sections than the last pack, from {label(new[0])} "
                    f"section {new[2] + 1} on")
        return f"the pack extends the last one: {label(new[0])} section {new[2] + 1} on is new"
    if not cache_on:
        return "the prefix cache is off (cache.enabled = false) and the KV memory held another prompt"
    if prefix_len < min_tokens:
        return f"the prefix ({prefix_len} tokens) is shorter than cache.min_tokens, so no state is saved"
    return ("no state is saved for its prefix: evicted past cache.max_gb, damaged, or never saved "
            "(shorter than cache.min_tokens when it was last packed)")


def sections_note(lost: Sequence[str]) -> str:
    """Why sections were not reused from their saved states, in words ("" when none was lost): each
    reason once, with how many sections it cost."""
    counts: dict[str, int] = {}
    for why in lost:
        counts[why] = counts.get(why, 0) + 1
    return "; ".join(f"{n} section{'s' if n > 1 else ''}: {why}" for why, n in counts.items())


__all__ = ["HISTORY_KEEP", "PackHistory", "reuse_note", "sections_note"]
