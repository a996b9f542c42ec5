"""Crash points, for the crash tests only: ``RAG_TEST_KILL_<POINT>=N`` makes the process SIGKILL itself
the Nth time it passes the crash point ``POINT``.

The crash tests stop real ``rag`` processes at exact moments that a signal from outside
cannot hit reliably. These places are marked:

- ``BEFORE_COMMIT`` (:mod:`pipeline.store.store`): a document's vectors are written, its catalog
  commit is not (``RAG_TEST_KILL_BEFORE_COMMIT``);
- ``AFTER_COMMITS`` (the summarisation job stores): right after a unit or a result is committed
  (``RAG_TEST_KILL_AFTER_COMMITS``), so a job stops mid-map, mid-reduce or between documents;
- ``SECTION_SAVED`` (:mod:`pipeline.engine.cache.sections`): a section's state was saved
  (``rag warm --sections``, or a composed prompt computing a section);
- ``COMPOSING`` (:mod:`pipeline.engine.reuse.compose`): a section was placed in a prompt being composed;
- ``SECTIONS_RECUT`` (:mod:`pipeline.collection`): one document's sections were cut again and
  committed (``rag sections --recut``), the next not yet.

With no such variable set a crash point costs one environment lookup. It has no other use.
"""

from __future__ import annotations

import os
import signal
import threading

PREFIX = "RAG_TEST_KILL_"

_passes: dict[str, int] = {}
_mu = threading.Lock()


def crash_point(point: str) -> None:
    """SIGKILL this process if ``RAG_TEST_KILL_<point>`` is N and this is its Nth pass here."""
    limit = os.environ.get(PREFIX + point, "")
    if not limit.isdigit() or not int(limit):
        return
    with _mu:
        _passes[point] = n = _passes.get(point, 0) + 1
    if n >= int(limit):
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["PREFIX", "crash_point"]
