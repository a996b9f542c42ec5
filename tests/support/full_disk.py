"""A real full disk for tests: a small tmpfs, filled to leave a chosen number of bytes free.

Mounting needs root (``mount -t tmpfs``); where it is not permitted the fixture skips and
says so, and each full-disk test has a twin that injects the same failure (``ENOSPC`` from a
file object, the error Chroma raises) so that the behaviour is checked everywhere.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest


class SmallDisk:
    """A mounted tmpfs at ``path``; :meth:`fill` leaves ``free`` bytes (in whole 4 KiB blocks)."""

    def __init__(self, path: Path):
        self.path = path
        self._filler = path / ".filler"

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, *, free: int = 0) -> None:
        self._filler.unlink(missing_ok=True)
        room = self.free() - free
        with open(self._filler, "wb") as fh:
            while room > 0:
                try:
                    room -= fh.write(b"\0" * min(room, 1 << 20))
                    fh.flush()
                except OSError:
                    break

    def empty(self) -> None:
        self._filler.unlink(missing_ok=True)


@contextmanager
def small_disk(where: Path, *, size: str = "8m"):
    where.mkdir(parents=True, exist_ok=True)
    ran = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                         capture_output=True, text=True)
    if ran.returncode != 0:
        pytest.skip(f"NO REAL FULL DISK HERE: mounting a tmpfs is not permitted ({ran.stderr.strip()}); "
                    "the fault-injecting twin of this test checks the same behaviour")
    try:
        yield SmallDisk(where)
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
