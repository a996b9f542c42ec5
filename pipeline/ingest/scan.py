"""Which files an ingest run looks at: the paths given, walked, and identified by content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterable

from ..errors import InputError


def scan(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    """Files under ``paths`` (hidden files and folders skipped), and the folders given."""
    roots = [Path(p).expanduser() for p in paths]
    missing = [str(p) for p in roots if not p.exists()]
    if missing:
        raise InputError("path does not exist: " + ", ".join(missing))
    files: list[Path] = []
    folders: list[Path] = []
    for root in roots:
        if root.is_dir():
            folders.append(root.resolve())
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                files.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
        else:
            files.append(root)
    seen: set[Path] = set()
    unique = []
    for f in files:
        r = f.resolve()
        if r not in seen:
            seen.add(r)
            unique.append(f)
    return unique, folders


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
