"""The collections a server answers for: its own (``--collection``) and the store's others, by name.

``GET /collections`` lists them (with their documents and chunks); every endpoint that reads or
writes a collection takes an optional ``collection`` (a query parameter for ``GET``, a body field
for ``POST``; absent: the server's own). Another collection is answered by a pipeline that shares
the server's models, engines, caches and open store (:meth:`Pipeline.for_collection
<pipeline.api.Pipeline.for_collection>`), made the first time it is asked for; only collections
the store holds can be named (a 404 otherwise), so no request creates one but an ingest into the
server's own.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

from ..errors import ConfigError, InputError
from ..inputs import check_text
from .http_errors import HTTPError

if TYPE_CHECKING:
    from starlette.requests import Request

    from ..api import Pipeline

#: Longest collection name looked up (Chroma's own bound).
MAX_NAME = 512


def _not_found(name: str) -> HTTPError:
    return HTTPError(404, f"no collection named {name!r} in this store: GET /collections lists them",
                     "not_found_error", "collection_not_found")


class Collections:
    """The pipelines answering for the store's collections, made when first asked for."""

    def __init__(self, rag: "Pipeline"):
        self.rag = rag
        self.own = rag.config.store.collection
        self._others: dict[str, "Pipeline"] = {}
        self._mu = threading.Lock()

    def listing(self) -> list[dict]:
        """The store's collections (the server's own first, even before its first ingest)."""
        listed = self.rag.collections()
        names = {c["name"] for c in listed}
        own = [] if self.own in names else [{"name": self.own, "documents": 0, "chunks": 0}]
        return sorted(own + listed, key=lambda c: (c["name"] != self.own, c["name"]))

    def pipeline(self, name: str | None) -> "Pipeline":
        """The pipeline for collection ``name`` (None: the server's own); a 400 for a name no collection
        can have, a 404 for one the store does not hold. Reads the store: call it off the event loop."""
        if name is None or name == self.own:
            return self.rag
        with self._mu:
            known = self._others.get(name)
        if known is not None:
            return known
        try:
            other = self.rag.for_collection(name)
        except ConfigError as err:
            raise HTTPError(400, str(err), code="invalid_collection") from None
        if name not in {c["name"] for c in self.rag.collections()}:
            raise _not_found(name)
        with self._mu:
            return self._others.setdefault(name, other)


def requested(value: str | None) -> str | None:
    """A ``collection`` field or parameter, checked as text and bounded (None: the server's own)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise HTTPError(400, f"'collection' must be a collection's name (1 to {MAX_NAME} characters)",
                        code="invalid_collection")
    try:
        return check_text(value, "'collection'")
    except InputError as err:
        raise HTTPError(400, str(err), code="invalid_text") from None


def from_query(request: "Request") -> str | None:
    """The one ``collection`` of a query string (None: the server's own)."""
    values = request.query_params.getlist("collection")
    if len(values) > 1:
        raise HTTPError(400, "name one 'collection' at most", code="invalid_collection")
    return requested(values[0]) if values else None


async def pipeline_for(request: "Request", name: str | None) -> "Pipeline":
    return await asyncio.to_thread(request.app.state.served.collections.pipeline, name)


async def listing(request: "Request"):
    """``GET /collections``: the store's collections, which is the server's own, and where documents may be
    added from the page (the ``--allow`` folders, the largest upload)."""
    from starlette.responses import JSONResponse

    s = request.app.state.served
    listed = await asyncio.to_thread(s.collections.listing)
    return JSONResponse({"schema": 1, "default": s.collections.own, "collections": listed,
                         "uploads": {"folders": [str(root) for root in s.folders.roots], "max_bytes": s.max_upload}})
