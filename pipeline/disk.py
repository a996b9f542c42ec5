"""Telling a full disk: by the error (its errno, its words) or by the room the file system has left.

SQLite, Chroma, llama.cpp and the file system each say "disk full" their own way, and some say
nothing useful (SQLite's "disk I/O error", llama.cpp's bare failure to save a state): when the file
system holding the path has (almost) no free space left, that is what happened. Whoever writes
(the store, the prefix cache, summary outputs) then raises :class:`~pipeline.errors.DiskFullError`
(exit 4) with its own account of what was kept.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: What the errors of a full disk say, in the words of SQLite, the C library and Python.
FULL_WORDS = ("database or disk is full", "no space left on device", "disk quota exceeded", "file too large")
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

#: Free space under which a failed write is taken for a full disk, whatever the error says.
LOW_SPACE = 16 << 20


def space(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(free bytes for an unprivileged writer, size in bytes) of the file system of ``path`` or of its
    nearest existing parent; None where that cannot be told."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes (for an unprivileged writer) on the file system of ``path`` or of its nearest
    existing parent; None where that cannot be told."""
    found = space(path)
    return None if found is None else found[0]


def is_disk_full(exc: BaseException | None, path: str | os.PathLike[str], *, need: int = 0) -> bool:
    """Whether ``exc`` (a failed write under ``path``; None where the writer gave no error) came from a full
    disk: its errno or its words say so, or the file system has less than :data:`LOW_SPACE` free (or less
    than ``need`` bytes, what the write needed)."""
    if exc is not None:
        if getattr(exc, "errno", None) in FULL_ERRNOS:
            return True
        if any(w in " ".join(str(exc).split()).lower() for w in FULL_WORDS):
            return True
    free = free_bytes(path)
    return free is not None and free < max(LOW_SPACE, need)


__all__ = ["FULL_ERRNOS", "FULL_WORDS", "LOW_SPACE", "free_bytes", "is_disk_full", "space"]
