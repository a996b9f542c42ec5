"""How a failed read or write of the store is told to a person: a full disk, a read-only store.

SQLite, Chroma and the file system each say "disk full" in their own words, SQLite
often only says "disk I/O error" (it could not create its shared-memory file) and
Chroma's compaction something about its logs; when the file system has (almost) no
free space left (:func:`pipeline.disk.is_disk_full`; Chroma's compaction, for one, reports only
"Failed to apply logs to the metadata segment"), that is what the message says.
"""

from __future__ import annotations

import errno
from pathlib import Path

from ..disk import is_disk_full
from ..errors import StoreError

_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def storage_error(exc: BaseException, path: Path, *, doing: str = "writing to") -> StoreError:
    """``exc``, raised while ``doing`` the store at ``path``, as a :class:`StoreError` for a person."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    code = getattr(exc, "errno", None)
    lower = detail.lower()
    if is_disk_full(exc, path):
        return StoreError(
            f"the disk holding the store {path} is full ({detail}). Nothing committed was lost: "
            "free some space and run the command again; it finishes what this run left undone")
    if code in _READ_ONLY_ERRNOS or "readonly database" in lower or "read-only" in lower:
        return StoreError(f"the store {path} cannot be written ({detail}): rag needs write access to "
                          "the store directory")
    return StoreError(f"{doing} the store {path} failed: {detail}")


__all__ = ["storage_error"]
