"""How a failed read or write of the store is told to a person: a full disk, a read-only store.

SQLite, Chroma and the file system each say "disk full" in their own words, SQLite
often only says "disk I/O error" (it could not create its shared-memory file) and
Chroma's compaction something about its logs; when the file system has (almost) no
free space left, that is what the message says.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import StoreError

_FULL = ("database or disk is full", "no space left on device", "disk quota exceeded", "file too large")
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


#: Free space under which a failed store operation is taken for a full disk, whatever the error says:
#: Chroma's compaction, for one, reports only "Failed to apply logs to the metadata segment".
LOW_SPACE = 16 << 20


def _no_space(path: Path) -> bool:
    try:
        st = os.statvfs(path if path.exists() else path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE


def storage_error(exc: BaseException, path: Path, *, doing: str = "writing to") -> StoreError:
    """``exc``, raised while ``doing`` the store at ``path``, as a :class:`StoreError` for a person."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    code = getattr(exc, "errno", None)
    lower = detail.lower()
    if code in _FULL_ERRNOS or any(m in lower for m in _FULL) or _no_space(path):
        return StoreError(
            f"the disk holding the store {path} is full ({detail}). Nothing committed was lost: "
            "free some space and run the command again; it finishes what this run left undone")
    if code in _READ_ONLY_ERRNOS or "readonly database" in lower or "read-only" in lower:
        return StoreError(f"the store {path} cannot be written ({detail}): rag needs write access to "
                          "the store directory")
    return StoreError(f"{doing} the store {path} failed: {detail}")
