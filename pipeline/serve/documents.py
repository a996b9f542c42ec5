"""The collection's files, read-only: ``GET /documents?source=SOURCE``.

``SOURCE`` is a document's name exactly as the collection lists it (``GET /status``'s
``sources``, an answer's ``sources``); it is looked up in the collection's catalog, never
joined to a folder, so nothing but an ingested file can be named: a path that is not a
source (another file, ``..``, a folder, a near miss) is the same 404 whatever the reason.
The file is served only while it still holds what was ingested (its size and SHA-256 are
those the catalog recorded, checked on the descriptor that is then sent, so a file swapped
after the check is not what is served); a file changed or gone since is a 404 that says to
ingest again.

PDFs are ``application/pdf`` (a browser opens them in its own viewer, where ``#page=N``
goes to that page); every other document is sent as ``text/plain``, never as HTML, so
an ingested page's scripts never run on the server's origin. ``.gz`` files are sent as
they are stored, with ``Content-Encoding: gzip``, which browsers undo.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import quote

from ..errors import RagError
from ..ingest.scan import open_regular
from .collections import from_query, pipeline_for
from .http_errors import HTTPError
from .limits import MAX_SOURCE_CHARS

if TYPE_CHECKING:
    from starlette.requests import Request

    from ..api import Pipeline
    from ..records import DocumentRecord

#: The one answer to a source the collection does not hold (identical for every reason).
NOT_IN_COLLECTION = ("no such document in this collection: 'source' must be a document's name exactly as "
                     "GET /status lists it")
#: The answer for a document of the collection whose file no longer holds what was ingested.
CHANGED = "this document's file changed or is gone since it was ingested: ingest it again to serve it"
HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
           "Content-Security-Policy": "default-src 'none'; sandbox", "Referrer-Policy": "no-referrer"}
_BLOCK = 1 << 16


def requested_source(request: "Request") -> str:
    """The one ``source`` of the query string, bounded; a 400 that names the problem otherwise."""
    values = request.query_params.getlist("source")
    if len(values) != 1 or not values[0]:
        raise HTTPError(400, "GET /documents needs one 'source': a document's name as GET /status lists it",
                        code="missing_field")
    if len(values[0]) > MAX_SOURCE_CHARS:
        raise HTTPError(400, f"'source' is longer than {MAX_SOURCE_CHARS:,} characters", code="out_of_range")
    return values[0]


def lookup(rag: "Pipeline", source: str) -> "DocumentRecord":
    """The collection's record of ``source``, or the one 404."""
    if "\0" in source or "\ufffd" in source:  # not a name the catalog can hold (undecodable %-escapes)
        raise _not_found()
    try:
        with rag.store(create=False) as store:
            record = store.document(source) if store.info is not None else None
    except RagError:  # no store yet
        record = None
    if record is None:
        raise _not_found()
    return record


class OpenDocument:
    """A document's file, opened and checked against its record; iterate for its bytes, then it closes."""

    def __init__(self, record: "DocumentRecord"):
        self.record = record
        try:
            self.file: BinaryIO = open_regular(record.source)
        except (RagError, OSError):
            raise HTTPError(404, CHANGED, "not_found_error", code="document_changed") from None
        try:
            self.utf8 = self._check()
        except BaseException:
            self.file.close()
            raise

    def _check(self) -> bool:
        """That the open file is the ingested one (size, then SHA-256); whether its bytes are UTF-8."""
        if os.fstat(self.file.fileno()).st_size != self.record.size:
            raise HTTPError(404, CHANGED, "not_found_error", code="document_changed")
        digest, utf8 = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")()
        valid = True
        for block in iter(lambda: self.file.read(1 << 20), b""):
            digest.update(block)
            if valid:
                try:
                    utf8.decode(block)
                except UnicodeDecodeError:
                    valid = False
        if digest.hexdigest() != self.record.content_hash:
            raise HTTPError(404, CHANGED, "not_found_error", code="document_changed")
        try:
            utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            valid = False
        self.file.seek(0)
        return valid

    @property
    def headers(self) -> dict[str, str]:
        path = Path(self.record.source)
        gz = path.suffix.lower() == ".gz"
        if self.record.format == "pdf":
            kind = "application/pdf"
        else:
            kind = "text/plain; charset=utf-8" if self.utf8 or gz else "text/plain"
        name = path.stem if gz else path.name
        out = {**HEADERS, "Content-Type": kind, "Content-Length": str(self.record.size),
               "Content-Disposition": f"inline; filename*=UTF-8''{quote(name, safe='')}"}
        if gz:
            out["Content-Encoding"] = "gzip"
        if self.record.format == "pdf":  # the browser's PDF viewer does not run in a sandboxed document
            out["Content-Security-Policy"] = "default-src 'none'"
        return out

    async def __aiter__(self):
        try:
            while block := await asyncio.to_thread(self.file.read, _BLOCK):
                yield block
        finally:
            self.file.close()

    def close(self) -> None:
        self.file.close()


async def document(request: "Request"):
    """``GET /documents?source=SOURCE``: the file of a document of the collection."""
    from starlette.responses import Response, StreamingResponse

    source = requested_source(request)
    rag = await pipeline_for(request, from_query(request))
    opened = await asyncio.to_thread(lambda: OpenDocument(lookup(rag, source)))
    if request.method == "HEAD":
        opened.close()
        return Response(status_code=200, headers=opened.headers)
    headers = opened.headers
    return StreamingResponse(opened, headers=headers, media_type=headers["Content-Type"])


def _not_found() -> HTTPError:
    return HTTPError(404, NOT_IN_COLLECTION, "not_found_error", code="document_not_found")
