"""Documents added over HTTP: ``PUT /upload?name=NAME[&folder=DIR][&collection=C]`` with the file's bytes.

The file is written into a folder the operator allowed (``--allow``; ``folder`` names one of them
or a folder inside one, resolved as ``POST /ingest`` resolves paths: the first allowed folder when
absent), then ingested into the collection like any ``POST /ingest`` job (the answer is 202 and
the job, which ``GET /ingest/{id}`` follows). Every rule is checked before a byte is written:

- no folder allowed: 403, saying how to allow one; a folder outside them: the one 403 of
  :mod:`.folders`;
- ``name`` is a file name only (no folder part, no leading dot, printable, at most
  :data:`MAX_NAME` characters) of a format the loaders read (``.pdf``, ``.md``, ``.txt``,
  ``.html``..., or those ``.gz``); anything else is a 400 that says which;
- the size must be given (``Content-Length``, 411 otherwise) and at most ``--max-upload`` bytes
  (413); a body that stalls is a 408, a body that ends short a 400;
- an existing file is never replaced (409): the file is written under a temporary name in the
  folder and linked to its name only when whole, so a reader never sees half a file;
- a full disk is a 507 and leaves nothing behind.

A ``PUT`` from another site's page needs a CORS preflight, which only ``--cors-origin`` sites
get, and the token is required as everywhere.
"""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from ..disk import is_disk_full
from ..ingest.loaders import detect_format
from . import limits
from .collections import from_query, pipeline_for
from .http_errors import HTTPError
from .requests import body_parts

if TYPE_CHECKING:
    from starlette.requests import Request

#: The one answer to a folder documents may not be added to (identical for every reason).
OUTSIDE = ("documents can be added only to the folders this server was allowed (rag serve --allow DIR) or a "
           "folder inside them; this request names one that is not")
#: The answer when no folder is allowed at all.
UPLOADS_OFF = ("this server takes no documents: adding them is off. Start it with `rag serve --allow DIR` (or set "
               "serve.allow) to let the page add documents to DIR")
#: Longest file name accepted (most file systems allow 255 bytes).
MAX_NAME = 200
_FLUSH = 1 << 20


def file_name(value: str | None) -> str:
    """``value`` if it is a plain file name of a format the loaders read; a 400 that says why not."""
    if not value:
        raise HTTPError(400, "PUT /upload needs 'name': the file's name, e.g. ?name=manual.pdf", code="missing_field")
    bad = None
    if len(value) > MAX_NAME or len(value.encode("utf-8", "surrogatepass")) > 255:
        bad = f"longer than {MAX_NAME} characters"
    elif any(c in value for c in "/\\\0") or value in (".", ".."):
        bad = "a file name only, without a folder"
    elif value.startswith(".") or value != value.strip():
        bad = "a name that does not start with a dot or a space"
    elif not value.isprintable():
        bad = "printable characters only"
    elif detect_format(Path(value)) is None:
        bad = "a document the ingest reads: .pdf, .md, .txt, .html (or those .gz)"
    if bad:
        raise HTTPError(400, f"'name' must be {bad}", code="invalid_name")
    return value


def _declared_size(request: "Request", limit: int) -> int:
    length = request.headers.get("content-length")
    if length is None:
        raise HTTPError(411, "PUT /upload needs the file's size (Content-Length)", code="length_required")
    if not length.isdigit():
        raise HTTPError(400, "Content-Length is not a size", code="invalid_length")
    size = int(length)
    if size > limit:
        raise HTTPError(413, f"the file is larger than this server takes ({limit:,} bytes; rag serve --max-upload)",
                        "request_too_large")
    if size == 0:
        raise HTTPError(400, "the file is empty", code="empty_file")
    return size


async def _target_folder(request: "Request") -> Path:
    s = request.app.state.served
    if not s.folders.enabled:
        raise HTTPError(403, UPLOADS_OFF, "permission_error", "uploads_disabled")
    values = request.query_params.getlist("folder")
    if len(values) > 1:
        raise HTTPError(400, "name one 'folder' at most", code="invalid_folder")
    if not values:
        return s.folders.roots[0]
    try:
        folder = await asyncio.to_thread(s.folders.resolve, values[0])
    except HTTPError as err:
        if err.code != "path_not_allowed":
            raise
        raise HTTPError(403, OUTSIDE, "permission_error", "folder_not_allowed") from None
    if not folder.is_dir():
        raise HTTPError(400, "'folder' must be a folder (one of the allowed ones, or one inside them)",
                        code="invalid_folder")
    return folder


class _Partial:
    """The file being written, under a temporary name in its folder; :meth:`keep` links it to its name."""

    def __init__(self, folder: Path, name: str):
        self.target = folder / name
        self.path = folder / f".rag-upload-{uuid.uuid4().hex[:12]}.part"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.written = 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        self.written += len(data)

    def keep(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = -1
        try:
            os.link(self.path, self.target)  # never over an existing file
        finally:
            self.path.unlink(missing_ok=True)

    def discard(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.path.unlink(missing_ok=True)


def _exists(path: Path) -> HTTPError:
    return HTTPError(409, f"{path.name} is already in that folder: rename the file, or remove the old one on the "
                          "server first", code="file_exists")


async def _finish(fn, *args) -> None:
    """``fn(*args)`` in a worker thread, awaited to its end even if this request is cancelled meanwhile
    (the file's descriptor must not be closed under a write still running)."""
    running = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        raise


async def _receive(request: "Request", partial: _Partial, size: int) -> None:
    """The body into ``partial``: exactly ``size`` bytes, within the stall bound."""
    buffered = bytearray()
    async for part in body_parts(request, what="file"):
        buffered += part
        if partial.written + len(buffered) > size:
            raise HTTPError(400, "the body is longer than its Content-Length", code="invalid_length")
        if len(buffered) >= _FLUSH:
            await _finish(partial.write, bytes(buffered))
            buffered.clear()
    if buffered:
        await _finish(partial.write, bytes(buffered))
    if partial.written != size:
        raise HTTPError(400, f"the body ended after {partial.written:,} of {size:,} bytes", code="incomplete_body")


async def upload(request: "Request"):
    """``PUT /upload``: the file written into an allowed folder, then a job ingesting it (202)."""
    from starlette.responses import JSONResponse

    s = request.app.state.served
    folder = await _target_folder(request)
    values = request.query_params.getlist("name")
    name = file_name(values[0] if len(values) == 1 else None)
    size = _declared_size(request, s.max_upload)
    rag = await pipeline_for(request, from_query(request))
    if os.path.lexists(folder / name):
        raise _exists(folder / name)
    # Creating and discarding the partial file stay on the event loop (two system calls each): a task
    # cancelled between a worker thread's return and its await could otherwise leave the file behind.
    try:
        partial = _Partial(folder, name)
    except OSError as exc:
        raise _failed(exc, folder) from None
    try:
        await _receive(request, partial, size)
        await _finish(partial.keep)
    except FileExistsError:
        raise _exists(folder / name) from None
    except OSError as exc:
        raise _failed(exc, folder) from None
    finally:
        partial.discard()
    job = s.writer.submit([partial.target], False, rag=rag)
    return JSONResponse({"schema": 1, "path": str(partial.target), "bytes": size, "job": job.to_dict()}, 202)


def _failed(exc: OSError, folder: Path) -> HTTPError:
    if is_disk_full(exc, folder):
        return HTTPError(507, f"the disk holding {folder} is full: nothing was kept", "insufficient_storage",
                         "disk_full")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return HTTPError(403, f"the server may not write into {folder} ({exc.strerror})", "permission_error",
                         "folder_not_writable")
    return HTTPError(500, f"the file could not be written ({exc.strerror or type(exc).__name__})", "server_error")
