"""Boundary states kept in host memory: a bounded, least-recently-used :class:`~.protocol.StateStore`.

A model that cannot cut its memory back (recurrent and hybrid ones, such as Qwen3.6's Gated
DeltaNet layers) starts every later question from a saved state. In a long-lived process
(``rag serve``, an app) those states are kept here too, as llama.cpp's server keeps context
checkpoints and its prompt cache in RAM (``--ctx-checkpoints``, ``--cache-ram``), so a later
question restores one with a memory copy instead of reading and checking a file. The reuse
policy consults this store before the disk and gives it every state it saves or restores.

At most ``max_states`` states and ``max_bytes`` bytes are held; the least recently used go
first, and a state larger than ``max_bytes`` is not kept. A state is llama.cpp's own
serialisation of the sequence (``llama_state_seq_get_data``), with the tokens it holds, so a
lookup matches the prompt's tokens exactly, as on disk. Safe to share between the engines of a
pool (one lock).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Collection, Sequence

from .index import Entry
from .protocol import ExactLookup

if TYPE_CHECKING:
    from .._llama import Model


@dataclass
class _Held:
    entry: Entry
    tokens: tuple[int, ...]
    data: bytearray


class RamStates(ExactLookup):
    """Up to ``max_states`` boundary states, ``max_bytes`` in all, in this process's memory (LRU)."""

    unavailable = ""
    read_only = False

    def __init__(self, *, max_states: int = 4, max_bytes: int = 2 * 2**30):
        self.max_states = max_states
        self.max_bytes = max_bytes
        self.last_error = ""
        self.last_load_seconds = 0.0
        self._held: OrderedDict[int, _Held] = OrderedDict()  # entry id -> state, least recently used first
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_states > 0 and self.max_bytes > 0

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(h.entry.bytes for h in self._held.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def lookup(self, namespace: str, tokens: Sequence[int], *, max_tokens: int | None = None,
               min_tokens: int = 1, lengths: Collection[int] | None = None, count: bool = True) -> Entry | None:
        """The longest state held of a prefix of ``tokens`` (at most ``max_tokens``, at least ``min_tokens``,
        one of ``lengths`` when given); ``count``: a use, which makes it the most recently used."""
        limit = len(tokens) if max_tokens is None else min(max_tokens, len(tokens))
        with self._lock:
            best: _Held | None = None
            for held in self._held.values():
                n = held.entry.n_tokens
                if (held.entry.namespace != namespace or not min_tokens <= n <= limit
                        or (lengths is not None and n not in lengths)
                        or (best is not None and n <= best.entry.n_tokens)):
                    continue
                if tuple(tokens[:n]) == held.tokens:
                    best = held
            if best is None:
                return None
            if count:
                best.entry.hits += 1
                best.entry.last_used = time.time()
                self._held.move_to_end(best.entry.id)
            return best.entry

    def load(self, entry: Entry, model: Model, *, seq: int = 0) -> bool:
        """Put ``entry``'s state into sequence ``seq`` of ``model``; False if it is gone or llama.cpp refused."""
        with self._lock:
            held = self._held.get(entry.id)
        if held is None:
            self.last_error = "the in-memory state was evicted"
            return False
        t0 = time.perf_counter()
        ok = model.set_state_data(held.data, seq=seq)
        self.last_load_seconds = time.perf_counter() - t0
        if not ok:
            self.last_error = "llama.cpp refused the in-memory state"
            with self._lock:
                self._held.pop(entry.id, None)
        return ok

    def save(self, namespace: str, tokens: Sequence[int], model: Model, *, seq: int = 0) -> Entry | None:
        """Keep what sequence ``seq`` holds (``tokens``); the entry held already if there is one, None when it
        does not fit the bounds."""
        if not self.enabled:
            return None
        key = tuple(tokens)
        with self._lock:
            for held in self._held.values():
                if held.entry.namespace == namespace and held.tokens == key:
                    held.entry.last_used = time.time()
                    self._held.move_to_end(held.entry.id)
                    return held.entry
        data = model.state_data(seq=seq)
        if not data or len(data) > self.max_bytes:
            self.last_error = "" if data else "llama.cpp returned no state"
            return None
        now = time.time()
        entry = Entry(id=next(self._ids), namespace=namespace, n_tokens=len(key), full_hash="", block_hash="",
                      file="", bytes=len(data), digest="", created=now, last_used=now, hits=0)
        with self._lock:
            self._held[entry.id] = _Held(entry, key, data)
            total = sum(h.entry.bytes for h in self._held.values())
            while len(self._held) > self.max_states or total > self.max_bytes:
                _, gone = self._held.popitem(last=False)
                total -= gone.entry.bytes
        return entry

    def clear(self) -> None:
        with self._lock:
            self._held.clear()

    def close(self) -> None:
        """Let go of every state (the pipeline closing)."""
        self.clear()

    def take_notes(self) -> list[str]:
        return []


__all__ = ["RamStates"]
