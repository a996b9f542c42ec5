"""The prefix cache's state files: unique names, atomic writes, digests, left-overs.

Each entry is one llama.cpp sequence-state file, ``<key>-<nonce>.state`` (written by
:meth:`pipeline.engine._llama.Model.save_state`). A file is written under a temporary
name, digested, optionally fsync'ed and renamed into place; every name is unique per
save, so no process ever overwrites a file another one may be reading.

The digest is SHA-256 over 8 MiB chunks, combined by a final SHA-256; the chunks
are hashed in parallel threads (hashlib releases the GIL), which pays on
machines with idle cores. Measured here (2 busy cores, file in the page cache)
on a 1000-token SmolLM2 state of 23 MB: llama.cpp's load 11 ms, the digest
19-30 ms, so a checked load takes about 30 ms against 16 s of prefill. The
check costs more than the 20% of the load once hoped for, but no cheaper full
check exists: reading the file once more is most of it (22-25 ms for that file
with no hashing at all; CRC-32 and Adler-32 measured 38-42 ms with the read),
and a check of sampled blocks would let flipped bytes elsewhere through, to
answers silently computed from a damaged KV cache. It guards against accidents
(truncation, files torn by a crash, bit rot, a stray edit), not against an
attacker, who could rewrite the index as easily as the files.

State files are not fsync'ed by default (``fsync=True`` to do so): a file torn by a
power loss fails the size or digest check and is dropped, so fsync would buy the
survival of a cache entry, at a cost (tens of ms per 1000 tokens) paid on the save path.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Collection, Sequence

if TYPE_CHECKING:
    from .._llama import Model

STATE_SUFFIX = ".state"
TMP_SUFFIX = ".tmp"

_CHUNK = 8 * 2**20  # bytes per chunk of the file digest
_PARALLEL_MIN = 2 * _CHUNK  # smaller files are hashed in this thread


def file_digest(path: str | os.PathLike[str]) -> str:
    """SHA-256 over 8 MiB chunks, hashed in parallel, combined by SHA-256 (see the module notes)."""
    size = os.path.getsize(path)
    n_chunks = max(1, -(-size // _CHUNK))
    fd = os.open(path, os.O_RDONLY)
    try:
        def chunk(i: int) -> bytes:
            data = os.pread(fd, _CHUNK, i * _CHUNK)
            return hashlib.sha256(data).digest()

        workers = min(4, os.cpu_count() or 1, n_chunks)
        if size < _PARALLEL_MIN or workers < 2:
            digests = [chunk(i) for i in range(n_chunks)]
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                digests = list(pool.map(chunk, range(n_chunks)))
    finally:
        os.close(fd)
    return "sha256x8m:" + hashlib.sha256(f"{size};".encode() + b"".join(digests)).hexdigest()


def is_state_file(name: str) -> bool:
    """Whether ``name`` is a state file or a temporary one (what a cache directory's sweep looks at)."""
    return name.endswith(STATE_SUFFIX) or name.endswith(TMP_SUFFIX)


def state_name(namespace: str, full_hash: str) -> str:
    """A new, unique file name for the state of the prefix ``full_hash`` in ``namespace``."""
    key = hashlib.sha256(f"{namespace}:{full_hash}".encode()).hexdigest()[:32]
    return f"{key}-{secrets.token_hex(4)}{STATE_SUFFIX}"


def write_state(directory: Path, name: str, model: Model, tokens: Sequence[int], *, seq: int = 0,
                fsync: bool = False, stored: str = "") -> tuple[int, str] | None:
    """Write sequence ``seq`` of ``model`` (holding ``tokens``) to ``directory / name``, atomically:
    (its size, its digest), None if llama.cpp could not save it. ``stored`` names the KV type the
    file keeps (``"q8_0"``; empty: the engine's own). Raises :class:`OSError`; no temporary file is
    left behind either way."""
    tmp = directory / f".{name}.{os.getpid()}{TMP_SUFFIX}"
    try:
        if not model.save_state(tmp, tokens, seq=seq, **({"stored": stored} if stored else {})):
            return None
        size = tmp.stat().st_size
        digest = file_digest(tmp)
        if fsync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, directory / name)
    finally:
        if tmp.exists():
            try:
                tmp.unlink()
            except OSError:
                pass
    return size, digest


def check_file(path: Path, *, size: int, digest: str) -> str:
    """Why the file at ``path`` is not the one indexed with ``size`` and ``digest`` ("" when it is)."""
    try:
        actual = path.stat().st_size
    except OSError:
        return "state file missing"
    if actual != size:
        return f"state file has {actual:,} bytes, not {size:,}"
    try:
        if file_digest(path) != digest:
            return "state file checksum mismatch"
    except OSError as exc:
        return f"state file unreadable: {exc.strerror or exc}"
    return ""


def sweep_files(directory: Path, known: Collection[str], *, min_age: float,
                temp_age: float | None = None) -> tuple[int, int, set[str]]:
    """Delete the state and temporary files of ``directory`` that are not ``known`` and are older than
    ``min_age`` seconds (temporaries: ``temp_age``, by default the same): (how many were deleted, their
    bytes, the names of those present). Raises :class:`OSError` where the directory cannot be listed."""
    import time

    removed, freed, present, now = 0, 0, set(), time.time()
    with os.scandir(directory) as it:
        for item in it:
            if not is_state_file(item.name):
                continue
            present.add(item.name)
            if item.name in known:
                continue
            age = min_age if item.name.endswith(STATE_SUFFIX) or temp_age is None else temp_age
            try:
                st = item.stat()
                if now - st.st_mtime >= age:
                    os.unlink(item.path)
                    removed += 1
                    freed += st.st_size
            except OSError:
                pass
    return removed, freed, present


__all__ = ["STATE_SUFFIX", "TMP_SUFFIX", "check_file", "file_digest", "is_state_file", "state_name",
           "sweep_files", "write_state"]
