"""The bounds ``rag serve`` holds every request to, in one place.

Sizes bound memory (a body, a path list, the jobs kept), ranges bound work (hits, tokens),
and each is answered with a 4xx that names the bound, never a 500.
"""

from __future__ import annotations

from ..inputs import MAX_TOP_K

DEFAULT_PORT = 8765
DEFAULT_MAX_BODY = 1 << 20
"""Largest request body in bytes (``--max-body``)."""
DEFAULT_MAX_UPLOAD = 64 << 20
"""Largest document ``PUT /upload`` takes, in bytes (``--max-upload``)."""
MAX_HEADER_BYTES = 64 << 10
"""Largest request line and headers together, in bytes (a 400 past it: the body limit bounds the rest)."""
BODY_STALL_SECONDS = 30.0
"""Longest wait for the next piece of a request body (a 408 past it): a client cannot hold a
connection open by sending nothing."""
MAX_PATHS = 1000
"""Most paths one ``POST /ingest`` may name."""
MAX_TOKENS = 1_000_000
"""Largest ``max_tokens`` a chat request may ask for (the context bounds it further)."""
MAX_TEMPERATURE = 5.0
MAX_SOURCE_CHARS = 4096
"""Longest document name ``GET /documents`` looks up (a path of the file system: PATH_MAX)."""
FINISHED_JOBS_KEPT = 100
"""Finished ingest jobs ``GET /ingest/{id}`` still knows; older ones are forgotten."""
GRACEFUL_SHUTDOWN_SECONDS = 10
"""How long a stop (Ctrl-C, SIGTERM) waits for requests in flight before closing them."""
ANSWERS_GRACE_SECONDS = 3
"""How long after a stop answers still running are cancelled (a 503), well before the server closes them."""

__all__ = ["DEFAULT_PORT", "DEFAULT_MAX_BODY", "DEFAULT_MAX_UPLOAD",
           "MAX_HEADER_BYTES", "BODY_STALL_SECONDS", "MAX_PATHS", "MAX_TOKENS",
           "MAX_TEMPERATURE", "MAX_SOURCE_CHARS", "MAX_TOP_K", "FINISHED_JOBS_KEPT", "GRACEFUL_SHUTDOWN_SECONDS",
           "ANSWERS_GRACE_SECONDS"]
