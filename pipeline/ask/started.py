"""Where the wait for an answer starts: the moment the time to its first token, as a person sees it, counts from.

The engine's ``ttft_seconds`` counts from the moment it takes the prompt; a person waits
longer: for ``rag ask``, from the moment the command starts (the interpreter, the imports,
retrieval, loading the models); for an application, from its call to
:meth:`~pipeline.api.Pipeline.ask`; for ``rag serve``, from the request's arrival. A
:class:`Start` names that moment on ``time.perf_counter()``'s clock, and the answer's
``start_to_first_token_seconds`` runs from it to the first piece of answer text.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: When this module was first imported (the ``rag`` command imports it as it starts): the earliest
#: moment this code sees, where the kernel does not tell when the process started.
_IMPORTED = time.perf_counter()

#: What a start can be: the process's start, read from the kernel; this module's import (where the
#: kernel cannot tell); a library call; a server's request.
POINTS = ("process", "import", "call", "request")


@dataclass(frozen=True)
class Start:
    """A moment on ``time.perf_counter()``'s clock, and what it is (one of :data:`POINTS`)."""

    at: float
    point: str = "call"

    @classmethod
    def now(cls, point: str = "call") -> "Start":
        return cls(time.perf_counter(), point)

    def seconds(self) -> float:
        """Seconds from this start until now."""
        return time.perf_counter() - self.at


def process_start() -> Start:
    """When this process started: on Linux read from the kernel (``/proc/self/stat``, to within a clock
    tick, 10 ms), so that the interpreter's own start-up and every import count; elsewhere, when this
    module was first imported (point "import")."""
    age = _process_age()
    if age is None:
        return Start(_IMPORTED, "import")
    return Start(time.perf_counter() - age, "process")


def _process_age() -> float | None:
    """Seconds since this process started, from its start time in clock ticks since boot against the
    boot-time clock the kernel counts it on; None where either is unavailable."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            stat = fh.read().decode("ascii", errors="replace")
        ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime (fields after the name)
        started = ticks / os.sysconf("SC_CLK_TCK")
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    age = now - started
    return age if 0.0 <= age < 86400.0 * 365 else None


__all__ = ["POINTS", "Start", "process_start"]
