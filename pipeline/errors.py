"""The exceptions a user of the pipeline can see.

Every error meant for a person derives from :class:`RagError`: the CLI prints its
message (no traceback) and exits with its ``exit_code``. Anything else escaping
the library is a bug.
"""

from __future__ import annotations

import re

# user:password@ in any URL, and query parameters that carry credentials.
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#\"']*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:access_token|api_key|apikey|auth|key|password|secret|sig|signature|token)=)[^&#\s\"']+")


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it (``user:pass@``, ``?token=``) replaced by ``***``."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


class RagError(Exception):
    """Base of every user-facing error; ``str(err)`` is a complete sentence for a person.

    Credentials in URLs are redacted from the message when the error is made, so no
    message, log line or traceback built from it carries them.
    """

    exit_code = 1

    def __init__(self, *args: object):
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class ConfigError(RagError):
    """The configuration is invalid: an unknown key, a wrong type, an impossible value."""

    exit_code = 2


class InputError(RagError):
    """A path or argument given by the user does not exist or cannot be used."""

    exit_code = 2


class ModelError(RagError):
    """A model file is missing, unreadable, not a GGUF, or cannot be provisioned."""

    exit_code = 3


class StoreError(RagError):
    """The store cannot be opened or used (missing collection, bad path, corrupt index)."""

    exit_code = 4


class DiskFullError(RagError):
    """A disk rag writes to is full: the store's, the prefix cache's, an output file's. Exit 4, as for
    the store: the message says what was kept, and a rerun once there is room finishes the work."""

    exit_code = 4


class StoreBusyError(StoreError):
    """Another process holds the store; Chroma's embedded mode is not process-safe."""

    exit_code = 5


class LoadError(RagError):
    """One document could not be read (corrupt, encrypted, binary, empty).

    Ingest reports it per file and goes on with the others.
    """


class EngineError(RagError):
    """llama.cpp could not load a model or run a prompt with the given settings."""

    exit_code = 6


class UpstreamError(EngineError):
    """A generator or embedding server (``openai:`` models) could not be reached, or kept failing, for
    ``remote.max_wait`` seconds. ``starting``: it answered 503, as llama-server does while it loads its
    model, so asking again in a moment may work (``rag serve`` then answers 503 with ``Retry-After``,
    else 502)."""

    def __init__(self, *args: object, starting: bool = False):
        super().__init__(*args)
        self.starting = starting


class Cancelled(RagError):
    """The call was cancelled (a cancel token, an asyncio cancellation, Ctrl-C) before it finished."""

    exit_code = 130


class EngineClosed(Cancelled):
    """The pipeline (its engine) was closed while this answer was unfinished: a stream's next read
    raises it at once, whether the stream was running, paused or not started yet."""
