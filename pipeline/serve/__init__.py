"""``rag serve``: one process owns the store and the models and answers over HTTP.

Endpoints (JSON in and out; errors are ``{"error": {"message", "type", "code"}}`` with a
4xx status for bad input, as OpenAI clients expect):

- ``POST /v1/chat/completions``: OpenAI-compatible, streaming (SSE) or not; the answer comes
  from retrieval, with the numbered sources in an extra ``sources`` field (on the first
  streamed chunk, and on the whole response) and the engine's figures in ``stats``.
  ``temperature``, ``max_tokens``, ``stop`` and ``top_k`` are per-call options. Earlier
  turns make it a conversation (see :mod:`pipeline.ask.chat`).
- ``GET /v1/models``: the generator (credentials in its URL hidden), for clients that list models.
- ``POST /search``: ``{"query", "top_k"}`` → ``{"schema": 1, "hits": [...]}``.
- ``POST /ingest``: ``{"paths": [...], "prune": false}`` → 202 and a job, only for paths inside
  the folders the operator allowed (:mod:`.folders`); the job runs in the server's one writer
  thread while reads go on (``GET /ingest/{id}`` follows it), then saves the collection's section
  states where they pay (:mod:`.writer`).
- ``GET /documents?source=SOURCE``: a document of the collection, read-only, as it was ingested
  (:mod:`.documents`); nothing else can be named.
- ``GET /status``, ``GET /health`` (open without the token, as are the web page's files).
- ``GET /``: a web page for asking (:mod:`.page`; its files are in ``web/``).

Who is answered (:mod:`.guards`): the ``Host`` the server listens on, same-origin pages or
``--cors-origin`` ones, ``RAG_SERVE_TOKEN`` holders when it is set, JSON bodies only. Bounds
on sizes and ranges are in :mod:`.limits`; the one request parser in :mod:`.requests`; the
process (binding, signals) in :mod:`.server`.
"""

from .app import create_app
from .limits import DEFAULT_MAX_BODY, DEFAULT_PORT
from .server import TOKEN_ENV, run

__all__ = ["create_app", "run", "TOKEN_ENV", "DEFAULT_PORT", "DEFAULT_MAX_BODY"]
