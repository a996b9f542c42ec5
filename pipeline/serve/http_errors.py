"""Errors as HTTP answers: ``{"error": {"message", "type", "code"}}`` with a 4xx for bad input,
the shape OpenAI clients expect."""

from __future__ import annotations

from ..errors import (Cancelled, ConfigError, DiskFullError, EngineError, InputError, RagError, StoreBusyError,
                      StoreError, UpstreamError)

#: Seconds a client is told to wait (``Retry-After``) before asking a generator server that is starting again.
RETRY_AFTER = 5


class HTTPError(Exception):
    """A request the server refuses: ``status``, a message for a person, the error ``kind`` and a ``code``."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def status_for(err: RagError) -> tuple[int, str]:
    """The HTTP status and error type of a library error."""
    if isinstance(err, (InputError, ConfigError)):
        return 400, "invalid_request_error"
    if isinstance(err, UpstreamError):  # the generator or embedding server behind this one
        return (503, "upstream_starting") if err.starting else (502, "upstream_error")
    if isinstance(err, StoreBusyError):
        return 503, "store_busy"
    if isinstance(err, DiskFullError):
        return 507, "insufficient_storage"
    if isinstance(err, StoreError):
        return 404, "not_found_error"
    if isinstance(err, Cancelled):
        return 499, "cancelled"
    if isinstance(err, EngineError) and "context" in str(err):
        return 400, "context_length_exceeded"
    return 500, "server_error"


def headers_for(err: RagError) -> dict | None:
    """The headers an error's answer carries: ``Retry-After`` where asking again soon may work."""
    if isinstance(err, UpstreamError) and err.starting:
        return {"Retry-After": str(RETRY_AFTER)}
    return None


def error_body(status: int, message: str, kind: str, code: str | int | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "code": code or status}}


def error_response(status: int, message: str, kind: str, code: str | int | None = None, *,
                   headers: dict | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(error_body(status, message, kind, code), status, headers=headers)
