"""A pool of engines for concurrent questions, and the policy of what may run at the same time inside one ``Pipeline``.

The policy (also in docs/app.md, Threads):

- **Generation is serialised per engine, first come first served.** One llama.cpp
  context must never run two prompts at once (llama.cpp aborts the process); every
  prefill, decode, warm-up and prefix-state restore holds the engine's turn
  (:mod:`.context_lock`), and waiters are served in arrival order. With
  ``engine.parallel = N`` the pipeline keeps up to N engines (each its own context;
  loaded as concurrent questions need them) and gives each question the one whose
  memory holds the longest prefix of its prompt (ties, and none: the shortest queue).
- **A stream holds its engine while it is being iterated**: from its first piece
  until it is exhausted, closed or garbage-collected. Use it in a ``with`` block (or
  call ``close()``) to give the engine back at a known moment.
- **Retrieval runs beside generation.** Embedding a query, dense and lexical search,
  tokenising and packing touch no generator context.
- **Reads go on during the pipeline's own ingest**: the threads of one pipeline share
  one open store (one process lock), each with its own SQLite connection; readers
  see committed documents only. Across processes the store is one process at a time.
- **Cancelling** (:class:`CancelToken`) a call that waits for the engine takes it out
  of the queue; cancelling one that runs sets llama.cpp's abort flag, which stops the
  running decode within one micro-batch (:class:`~pipeline.errors.Cancelled` is raised).
- **Models load once**, however many threads ask for them first (:class:`.once.once`).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from ..records import PromptShape


class EnginePool:
    """Up to ``size`` engines for concurrent questions; the first is made by ``first()``, the others
    by ``make()`` when every engine already has a prompt running or queued."""

    def __init__(self, first: Callable[[], Any], make: Callable[[], Any], size: int):
        self._first, self._make, self.size = first, make, max(1, size)
        self._extra: list[Any] = []
        self._mu = threading.Lock()

    @property
    def engines(self) -> list[Any]:
        with self._mu:
            return [self._first(), *self._extra]

    def reusable(self, prompt: PromptShape | Sequence[int]) -> int:
        """The most of this prompt any engine of the pool would reuse now, by each engine's reuse plan
        (memory, prefix states, section states): what :meth:`pick` then routes it to, and what a
        packer weighs candidate prompts by."""
        return max(e.reusable(prompt) for e in self.engines)

    @property
    def composes(self) -> bool:
        """Whether the pool's engines compose sections-mode prompts (they share one setting)."""
        return self.engines[0].composes

    def pick(self, prompt: PromptShape | Sequence[int] | None = None) -> Any:
        """The engine for a prompt: the one whose memory holds the most of it as its reuse plan would
        use it (a prefix, or the leading sections a composition left in it; ties: the shortest queue);
        where none holds any, the one with the shortest queue, or a new one while all are busy and the
        pool has room. Section states on disk are shared by every engine, so only what each holds in
        memory tells them apart."""
        engines = self.engines
        load = [e.waiting for e in engines]
        if prompt is not None and len(engines) > 1:
            held = [e.held(prompt) for e in engines]
            best = max(held)
            if best > 0:
                return engines[min((i for i, n in enumerate(held) if n == best), key=load.__getitem__)]
        if min(load) == 0 or len(engines) >= self.size:
            return engines[load.index(min(load))]
        with self._mu:
            if len(self._extra) + 1 < self.size:
                self._extra.append(self._make())
                return self._extra[-1]
        return self.pick()

    def close_extra(self) -> None:
        with self._mu:
            extra, self._extra = self._extra, []
        for e in extra:
            e.close()


__all__ = ["EnginePool"]
