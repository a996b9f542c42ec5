"""Where the dense vectors live: Chroma embedded in the store directory, or a Chroma server.

``store.url = "http://host:port"`` switches from ``chromadb.PersistentClient`` (one
process at a time, see :mod:`.lock`) to ``chromadb.HttpClient``, which any number of
processes on any number of machines may share. A token for a server that wants one
is read from the environment (``RAG_STORE_TOKEN``), never from a file, and never
appears in a message.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import StoreError, redact

#: The environment variable holding the Chroma server's auth token (sent as a bearer token).
TOKEN_ENV = "RAG_STORE_TOKEN"


def parse_url(url: str) -> tuple[str, int, bool]:
    """(host, port, ssl) of a Chroma server URL, or a :class:`StoreError` that says what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreError(f"store.url must look like http://host:port, got {redact(url)!r}")
    if parts.path not in ("", "/"):
        raise StoreError(f"store.url must name a Chroma server (http://host:port), not a path: {redact(url)!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 8000)
    except ValueError:
        raise StoreError(f"store.url has an invalid port: {redact(url)!r}") from None
    return parts.hostname, port, parts.scheme == "https"


def client(*, path: Path, url: str = "", timeout: float = 30.0):
    """A Chroma client: embedded under ``path / "chroma"``, or the server at ``url``, whose every
    request fails after ``timeout`` seconds (``store.timeout``) instead of waiting for a stopped server."""
    import chromadb
    from chromadb.config import Settings

    if not url:
        try:
            return chromadb.PersistentClient(path=str(path / "chroma"),
                                             settings=Settings(anonymized_telemetry=False, allow_reset=False))
        except Exception as exc:  # opening writes (its log, a full disk): the store's state, told as such
            from .failures import storage_error

            raise storage_error(exc, path, doing="opening") from None
    host, port, ssl = parse_url(url)
    token = os.environ.get(TOKEN_ENV) or None
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        _heartbeat(url, headers, timeout)  # chromadb's own first requests have no timeout
        made = chromadb.HttpClient(host=host, port=port, ssl=ssl, headers=headers,
                                   settings=Settings(anonymized_telemetry=False, allow_reset=False))
    except Exception as exc:  # chromadb checks the server at once: unreachable, refused, bad token
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        if "timeout" in type(exc).__name__.lower():
            detail = f"no answer within store.timeout = {timeout:g} s: is it stopped or overloaded?"
        if token:
            detail = detail.replace(token, "***")
        raise StoreError(f"cannot reach the Chroma server at {redact(url)} ({detail}); start it with "
                         "`chroma run --path DIR --host HOST --port PORT`, or check store.url") from None
    _set_timeout(made, timeout)
    return made


def _heartbeat(url: str, headers: dict | None, timeout: float) -> None:
    """Any answer from the server at ``url`` within ``timeout`` seconds (an error status too: chromadb
    reports those itself), or the exception that says why not."""
    import httpx

    httpx.get(url.rstrip("/") + "/api/v2/heartbeat", headers=headers, timeout=timeout)


def _set_timeout(made, timeout: float) -> None:
    """Bound every request of ``made`` (an ``HttpClient``) to ``timeout`` seconds. chromadb builds its
    HTTP session with no timeout and has no setting for one, so the session's own is set."""
    import httpx

    session = getattr(getattr(made, "_server", None), "_session", None)
    if not isinstance(session, httpx.Client):
        raise StoreError("this chromadb version keeps its HTTP session elsewhere: store.timeout cannot be "
                         "applied (install the chromadb version pyproject.toml names)")
    session.timeout = httpx.Timeout(timeout)


def check_store_urls(url: str, catalog_url: str) -> None:
    """A :class:`ConfigError` for a ``store.url`` or ``store.catalog_url`` that cannot be right."""
    from ..errors import ConfigError

    if url:
        try:
            parse_url(url)
        except StoreError as exc:
            raise ConfigError(str(exc)) from None
    if catalog_url and urlsplit(catalog_url).scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"store.catalog_url must be a PostgreSQL URL (postgresql://user@host:port/db), "
                          f"got {redact(catalog_url)!r}")
