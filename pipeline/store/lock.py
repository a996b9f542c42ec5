"""One process at a time per store.

Chroma's embedded mode is not process-safe, so every process that opens a
store takes an exclusive ``flock`` on a file in it first. A second process
waits up to a deadline, then stops with a message naming the holder. The lock
is released by the kernel when its holder dies, even under ``kill -9``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

from ..errors import StoreBusyError, StoreError

LOCK_NAME = ".rag.lock"


class StoreLock:
    """An exclusive, advisory lock on a store directory."""

    def __init__(self, directory: Path, *, wait: float = 10.0, poll: float = 0.1):
        self.path = directory / LOCK_NAME
        self.wait = wait
        self.poll = poll
        self._fd: int | None = None

    def acquire(self) -> "StoreLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(
                f"cannot take the store lock {self.path}: {exc.strerror or exc}. rag needs write access "
                "to the store directory, even to read it (SQLite and Chroma write their journals there)"
            ) from None
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    pid, holder = self._holder()
                    os.close(fd)
                    who = ("another Pipeline in this process (share one Pipeline between threads instead)"
                           if pid == os.getpid() else f"another rag process{holder}")
                    raise StoreBusyError(
                        f"the store {self.path.parent} is in use by {who}; "
                        f"waited {self.wait:g} s (raise store.wait or RAG_STORE_WAIT to wait longer)"
                    ) from None
                time.sleep(self.poll)
        try:  # who holds it, for the message a waiting process prints; a full disk must not stop us
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "argv": sys.argv[:3], "since": time.time()}).encode())
        except OSError:
            pass
        self._fd = fd
        return self

    def _holder(self) -> tuple[int | None, str]:
        """The holder's pid, and the words naming it (" (pid N: command)")."""
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return None, ""
        if not isinstance(info, dict) or not info.get("pid"):
            return None, ""
        cmd = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(info.get("argv") or []))
        return info["pid"], f" (pid {info['pid']}{': ' + cmd if cmd else ''})"

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> "StoreLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
