"""The ASGI application: routes to the handlers, the guards in front, errors as JSON.

Starlette on uvicorn: uvicorn already comes with chromadb; Starlette is a small, well
kept ASGI toolkit (FastAPI is built on it) and needs nothing we do not have (anyio).
FastAPI's validation layer would add pydantic models for a handful of endpoints whose
bodies one parser checks (:mod:`.requests`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import RagError
from . import collections, handlers, page, uploads
from .access import AccessLog
from .documents import document
from .folders import ReadableFolders
from .guards import Guard, Policy
from .http_errors import HTTPError, error_response, headers_for, status_for
from .limits import DEFAULT_MAX_BODY, DEFAULT_MAX_UPLOAD, DEFAULT_PORT
from .writer import IngestWriter

if TYPE_CHECKING:
    from ..api import Pipeline

ROUTES = [
    ("/health", handlers.health, ["GET"]),
    ("/status", handlers.status, ["GET"]),
    ("/search", handlers.search, ["POST"]),
    ("/ingest", handlers.ingest, ["POST"]),
    ("/ingest/{job}", handlers.ingest_job, ["GET"]),
    ("/v1/models", handlers.models, ["GET"]),
    ("/v1/chat/completions", handlers.chat_completions, ["POST"]),
    ("/documents", document, ["GET"]),
    ("/collections", collections.listing, ["GET"]),
    ("/upload", uploads.upload, ["PUT"]),
    *((path, page.endpoint(path), ["GET"]) for path in page.ASSETS),
]
#: What is answered without the token: liveness, and the page's files (they hold no data).
OPEN_PATHS = ("/health", *page.ASSETS)


def create_app(rag: "Pipeline", *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY,
               max_upload: int = DEFAULT_MAX_UPLOAD,
               host: str = "127.0.0.1", port: int = DEFAULT_PORT, allow: Sequence[str] | None = None,
               allow_hosts: Sequence[str] | None = None, cors_origins: Sequence[str] | None = None,
               access_log: Callable[[str], None] | None = None):
    """The ASGI application serving ``rag`` (shared between requests), for a server listening on
    ``host:port``. ``allow``, ``allow_hosts`` and ``cors_origins`` default to ``rag.config.serve``'s
    (see :mod:`.folders` and :mod:`.guards`); ``access_log`` gets one line per request (:mod:`.access`)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.middleware import Middleware
    from starlette.routing import Route

    settings = rag.config.serve
    folders = ReadableFolders(settings.allow if allow is None else allow)
    policy = Policy.make(host=host, port=port, token=token, open_paths=OPEN_PATHS,
                         allow_hosts=settings.allow_hosts if allow_hosts is None else allow_hosts,
                         cors_origins=settings.cors_origins if cors_origins is None else cors_origins)
    logged = [Middleware(AccessLog, log=access_log)] if access_log is not None else []
    app = Starlette(routes=[Route(path, fn, methods=methods) for path, fn, methods in ROUTES],
                    middleware=[*logged, Middleware(Guard, policy=policy)],
                    exception_handlers={HTTPError: _refused, RagError: _library_error,
                                        StarletteHTTPException: _starlette_error, Exception: _internal})
    app.state.served = handlers.Served(rag, IngestWriter(rag), folders, max_body, max_upload)
    app.state.writer = app.state.served.writer
    return app


async def _refused(request, exc: HTTPError):
    return error_response(exc.status, exc.message, exc.kind, exc.code)


async def _library_error(request, err: RagError):
    status, kind = status_for(err)
    return error_response(status, str(err), kind, headers=headers_for(err))


async def _starlette_error(request, exc):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(exc.status_code, exc.detail or "not found", kind, headers=getattr(exc, "headers", None))


async def _internal(request, exc: Exception):
    return error_response(500, f"internal error: {type(exc).__name__}", "server_error")
