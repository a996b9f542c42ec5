"""``rag serve``: one process owns the store and the models and answers over HTTP.

Starlette on uvicorn: uvicorn already comes with chromadb; Starlette is a small, well
kept ASGI toolkit (FastAPI is built on it) and needs nothing we do not have (anyio).
FastAPI's validation layer would add pydantic models for five endpoints whose
bodies are checked here in a few lines.

Endpoints (JSON in and out; errors are ``{"error": {"message", "type", "code"}}``
with a 4xx status for bad input, as OpenAI clients expect):

- ``POST /v1/chat/completions``: OpenAI-compatible, streaming (SSE) or not; the
  answer comes from retrieval, with the numbered sources in an extra ``sources``
  field (on the first streamed chunk, and on the whole response) and the engine's
  figures in ``stats``. ``temperature``, ``max_tokens``, ``stop`` and ``top_k`` are
  per-call options. Earlier turns make it a conversation (see :mod:`.chat`).
- ``GET /v1/models``: the generator, so that clients that list models work.
- ``POST /search``: ``{"query", "top_k"}`` → ``{"schema": 1, "hits": [...]}``.
- ``POST /ingest``: ``{"paths": [...], "prune": false}`` → 202 and a job; the job
  runs in the server's one writer thread, and reads go on meanwhile
  (``GET /ingest/{id}`` follows it).
- ``GET /status``, ``GET /health`` (the only endpoint open without the token).

With ``RAG_SERVE_TOKEN`` set, every other request needs ``Authorization: Bearer
<token>``. Request bodies are limited (``--max-body``, 1 MiB by default).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import Cancelled, ConfigError, EngineError, InputError, RagError, StoreBusyError, StoreError

if TYPE_CHECKING:
    from .api import Pipeline

SCHEMA = 1
DEFAULT_PORT = 8765
DEFAULT_MAX_BODY = 1 << 20
TOKEN_ENV = "RAG_SERVE_TOKEN"


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def _status_for(err: RagError) -> tuple[int, str]:
    if isinstance(err, (InputError, ConfigError)):
        return 400, "invalid_request_error"
    if isinstance(err, StoreBusyError):
        return 503, "store_busy"
    if isinstance(err, StoreError):
        return 404, "not_found_error"
    if isinstance(err, Cancelled):
        return 499, "cancelled"
    if isinstance(err, EngineError) and "context" in str(err):
        return 400, "context_length_exceeded"
    return 500, "server_error"


@dataclass
class IngestJob:
    id: str
    paths: list[str]
    prune: bool
    state: str = "queued"  # queued | running | done | failed
    created: float = field(default_factory=time.time)
    report: dict | None = None
    error: dict | None = None
    files_done: int = 0

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "id": self.id, "state": self.state, "paths": self.paths, "prune": self.prune,
                "files_done": self.files_done, "report": self.report, "error": self.error}


class IngestWriter:
    """The server's one writer: ingest jobs run here, one after another, while reads go on."""

    def __init__(self, rag: "Pipeline"):
        self.rag = rag
        self.jobs: dict[str, IngestJob] = {}
        self._queue: "list[IngestJob]" = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="rag-ingest-writer", daemon=True)
        self._thread.start()

    def submit(self, paths: list[str], prune: bool) -> IngestJob:
        job = IngestJob(uuid.uuid4().hex[:12], paths, prune)
        with self._cv:
            self.jobs[job.id] = job
            self._queue.append(job)
            self._cv.notify()
        return job

    @property
    def busy(self) -> bool:
        return any(j.state in ("queued", "running") for j in list(self.jobs.values()))

    def wait_idle(self, poll: float = 0.2) -> None:
        while self.busy:
            time.sleep(poll)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                job = self._queue.pop(0)
            job.state = "running"

            def progress(event, job=job) -> None:
                if event.kind == "file":
                    job.files_done += 1

            try:
                report = self.rag.ingest(job.paths, prune=job.prune, progress=progress)
                job.report = report.to_dict() if hasattr(report, "to_dict") else {"files": len(report.files)}
                job.state = "done"
            except RagError as err:
                job.error = {"message": str(err), "type": type(err).__name__, "exit_code": err.exit_code}
                job.state = "failed"
            except Exception as exc:  # noqa: BLE001 - a job must never kill the writer
                job.error = {"message": f"internal error: {exc}", "type": type(exc).__name__}
                job.state = "failed"


def create_app(rag: "Pipeline", *, token: str | None = None, max_body: int = DEFAULT_MAX_BODY):
    """The ASGI application serving ``rag`` (which it shares between requests)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException as StarletteHTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    writer = IngestWriter(rag)
    model_name = str(rag.config.models.generator)
    counter = itertools.count(1)

    def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": code or status}}, status)

    async def body(request: Request) -> dict:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > max_body):
            raise HTTPError(413, f"the request body is larger than {max_body:,} bytes", "request_too_large")
        raw = b""
        async for part in request.stream():
            raw += part
            if len(raw) > max_body:
                raise HTTPError(413, f"the request body is larger than {max_body:,} bytes", "request_too_large")
        try:
            data = json.loads(raw or b"null")
        except ValueError as exc:
            raise HTTPError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise HTTPError(400, "the body must be a JSON object")
        return data

    def field_of(data: dict, name: str, kind, *, required: bool = False, default=None):
        value = data.get(name, default)
        if value is None:
            if required:
                raise HTTPError(400, f"'{name}' is required", code="missing_field")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise HTTPError(400, f"'{name}' must be of type {names}", code="invalid_type")
        return value

    async def guarded(request: Request, handler):
        try:
            if token and request.url.path != "/health":
                given = request.headers.get("authorization", "")
                if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                    raise HTTPError(401, "missing or wrong bearer token", "authentication_error")
            return await handler(request)
        except HTTPError as exc:
            return error(exc.status, exc.message, exc.kind, exc.code)
        except RagError as err:
            status, kind = _status_for(err)
            return error(status, str(err), kind)

    def route(path: str, handler, methods: list[str]) -> Route:
        async def endpoint(request: Request):
            return await guarded(request, handler)
        return Route(path, endpoint, methods=methods)

    # -- handlers ---------------------------------------------------------------------------

    async def health(request: Request):
        return JSONResponse({"schema": SCHEMA, "status": "ok"})

    async def status(request: Request):
        st = await asyncio.to_thread(rag.status)
        return JSONResponse({"schema": SCHEMA, **st.to_dict()})

    async def search(request: Request):
        data = await body(request)
        query = field_of(data, "query", str, required=True)
        top_k = field_of(data, "top_k", int)
        hits = await rag.asearch(query, top_k=top_k)
        return JSONResponse({"schema": SCHEMA, "query": query, "hits": [h.to_dict() for h in hits]})

    async def ingest(request: Request):
        data = await body(request)
        paths = field_of(data, "paths", list, required=True)
        if not paths or not all(isinstance(p, str) and p for p in paths):
            raise HTTPError(400, "'paths' must be a non-empty list of paths on the server", code="invalid_type")
        prune = field_of(data, "prune", bool, default=False)
        from .ingest.scan import scan

        await asyncio.to_thread(scan, paths)  # a missing path is a 400 now, not a failed job later
        job = writer.submit(paths, prune)
        return JSONResponse(job.to_dict(), 202)

    async def ingest_job(request: Request):
        job = writer.jobs.get(request.path_params["job"])
        if job is None:
            raise HTTPError(404, "no such ingest job", "not_found_error")
        return JSONResponse(job.to_dict())

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "rag"}]})

    async def chat_completions(request: Request):
        data = await body(request)
        messages = field_of(data, "messages", list, required=True)
        turns = _turns(messages)
        options = {
            "temperature": field_of(data, "temperature", (int, float)),
            "max_tokens": field_of(data, "max_completion_tokens", int) or field_of(data, "max_tokens", int),
            "top_k": field_of(data, "top_k", int),
        }
        stop = data.get("stop")
        if stop is not None:
            if isinstance(stop, str):
                stop = [stop]
            if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
                raise HTTPError(400, "'stop' must be a string or a list of strings", code="invalid_type")
            options["stop"] = stop
        options = {k: v for k, v in options.items() if v is not None}
        stream_mode = field_of(data, "stream", bool, default=False)
        include_usage = bool((data.get("stream_options") or {}).get("include_usage")) if isinstance(
            data.get("stream_options"), dict) else False
        cid = f"chatcmpl-{next(counter)}-{uuid.uuid4().hex[:8]}"
        created = int(time.time())
        limit = options.get("max_tokens") or rag.config.ask.max_tokens
        question, history = turns[-1]["content"], turns[:-1]
        answer_stream = rag.aask_stream(question, history=history, **options) if history else \
            rag.aask_stream(question, **options)

        if not stream_mode:
            answer = await answer_stream.result()
            return JSONResponse(_completion(cid, created, model_name, answer, limit))

        # The first piece (or the error before it) is awaited here, so that bad input is a 4xx, not a broken stream.
        iterator = answer_stream.__aiter__()
        try:
            first = await iterator.__anext__()
        except StopAsyncIteration:
            first = None

        async def events():
            head = {"role": "assistant", "content": first or ""}
            yield _sse(_chunk(cid, created, model_name, head, sources=answer_stream.sources))
            try:
                if first is not None:
                    async for piece in iterator:
                        yield _sse(_chunk(cid, created, model_name, {"content": piece}))
            except RagError as err:
                status, kind = _status_for(err)
                yield _sse({"error": {"message": str(err), "type": kind, "code": status}})
                return
            answer = answer_stream.answer
            final = _chunk(cid, created, model_name, {}, finish=_finish(answer, limit))
            if answer is not None:
                final["stats"] = answer.stats.to_dict()
            yield _sse(final)
            if include_usage and answer is not None:
                usage = _chunk(cid, created, model_name, None)
                usage["choices"] = []
                usage["usage"] = _usage(answer)
                yield _sse(usage)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def not_found(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, exc.detail or "not found", kind)

    async def internal(request: Request, exc: Exception):
        return error(500, f"internal error: {type(exc).__name__}", "server_error")

    routes = [
        route("/health", health, ["GET"]),
        route("/status", status, ["GET"]),
        route("/search", search, ["POST"]),
        route("/ingest", ingest, ["POST"]),
        route("/ingest/{job}", ingest_job, ["GET"]),
        route("/v1/models", models, ["GET"]),
        route("/v1/chat/completions", chat_completions, ["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={StarletteHTTPException: not_found, Exception: internal})
    app.state.writer = writer
    return app


def _turns(messages: list) -> list[dict]:
    """OpenAI messages → [{"role", "content"}] with text content; the last one must be the user's."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer", "tool"):
            raise HTTPError(400, f"messages[{i}] must be an object with a role of system, user or assistant",
                            code="invalid_message")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content):
                raise HTTPError(400, f"messages[{i}]: only text content is supported", code="invalid_message")
            content = "".join(texts)
        if not isinstance(content, str):
            raise HTTPError(400, f"messages[{i}].content must be a string", code="invalid_message")
        if m["role"] in ("system", "developer", "tool"):
            continue  # the server's own system prompt frames answers from the documents
        out.append({"role": m["role"], "content": content})
    if not out or out[-1]["role"] != "user" or not out[-1]["content"].strip():
        raise HTTPError(400, "the last message must be a non-empty user message", code="invalid_message")
    return out


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _chunk(cid: str, created: int, model: str, delta: dict | None, *, finish: str | None = None,
           sources: list | None = None) -> dict:
    out = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
           "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    if sources is not None:
        out["sources"] = sources
    return out


def _finish(answer, limit: int) -> str:
    return "length" if answer is not None and answer.stats.decode_tokens >= limit else "stop"


def _usage(answer) -> dict:
    st = answer.stats
    return {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.decode_tokens,
            "total_tokens": st.prompt_tokens + st.decode_tokens,
            "prompt_tokens_details": {"cached_tokens": st.cached_tokens}}


def _completion(cid: str, created: int, model: str, answer, limit: int) -> dict:
    return {"id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text},
                         "finish_reason": _finish(answer, limit)}],
            "usage": _usage(answer), "sources": answer.sources, "stats": answer.stats.to_dict()}


def run(rag: "Pipeline", *, host: str = "127.0.0.1", port: int = DEFAULT_PORT, token: str | None = None,
        max_body: int = DEFAULT_MAX_BODY, log=print) -> None:
    """Serve ``rag`` until interrupted (uvicorn; one process, one event loop)."""
    import uvicorn

    import os

    app = create_app(rag, token=token, max_body=max_body)
    log(f"serving {rag.config.store.collection!r} on http://{host}:{port} "
        f"({'bearer token required' if token else 'no token: local use only'})")
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=10)
    writer: IngestWriter = app.state.writer
    if writer.busy:
        log("waiting for the running ingest to finish (Ctrl-C again stops now: the store is crash-safe, "
            "the next ingest finishes the job)")
        try:
            writer.wait_idle()
        except KeyboardInterrupt:
            os._exit(130)  # the writer thread is mid-document; freeing the models under it would crash
