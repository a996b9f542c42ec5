"""The endpoints. Each reads its input through :class:`~.requests.Body`, answers JSON, and raises
:class:`~.http_errors.HTTPError` or a library error for bad input (the app turns both into 4xx)."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable

from ..ask.started import Start
from ..errors import Cancelled, RagError, redact
from . import completions as oa
from .collections import Collections, from_query, pipeline_for, requested
from .folders import ReadableFolders
from .http_errors import HTTPError, status_for
from .limits import DEFAULT_MAX_UPLOAD, FINISHED_JOBS_KEPT, MAX_TOP_K
from .requests import Body, ChatRequest, chat_request
from .writer import SCHEMA, IngestWriter

if TYPE_CHECKING:
    from starlette.requests import Request

    from ..ask.aio import AsyncAnswerStream
    from ..api import Pipeline


@dataclass
class Served:
    """What the handlers share: the pipeline (and those of the store's other collections), its writer,
    the folders /ingest and /upload may use, the limits."""

    rag: "Pipeline"
    writer: IngestWriter
    folders: ReadableFolders
    max_body: int
    max_upload: int = DEFAULT_MAX_UPLOAD
    model_name: str = ""
    ids: Any = field(default_factory=lambda: itertools.count(1))
    answers: set = field(default_factory=set)  # the answers in flight (AsyncAnswerStream)
    stopping: bool = False
    collections: Collections = field(init=False)

    def __post_init__(self) -> None:
        self.model_name = self.model_name or redact(str(self.rag.config.models.generator))
        self.collections = Collections(self.rag)

    def stop_answers(self) -> int:
        """The server is stopping: every answer in flight is cancelled, and ends with a 503 (or, once
        streaming, an error event) instead of being cut off with the connection. Returns how many."""
        self.stopping = True
        running = list(self.answers)
        for stream in running:
            stream.cancel()
        return len(running)


STOPPING = "the server is stopping: ask again when it is back"


def served(request: "Request") -> Served:
    return request.app.state.served


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


async def health(request: "Request"):
    from starlette.responses import JSONResponse

    return JSONResponse({"schema": SCHEMA, "status": "ok"})


async def status(request: "Request"):
    from starlette.responses import JSONResponse

    rag = await pipeline_for(request, from_query(request))
    st = await asyncio.to_thread(rag.status)
    return JSONResponse({"schema": SCHEMA, **st.to_dict()})


async def search(request: "Request"):
    from starlette.responses import JSONResponse

    s = served(request)
    body = await Body.read(request, limit=s.max_body)
    query = body.text("query", required=True)
    top_k = body.integer("top_k", low=1, high=MAX_TOP_K)
    rag = await pipeline_for(request, requested(body.value("collection", str)))
    hits = await rag.asearch(query, top_k=top_k)
    return JSONResponse({"schema": SCHEMA, "query": query, "hits": [h.to_dict() for h in hits]})


async def ingest(request: "Request"):
    from starlette.responses import JSONResponse

    s = served(request)
    s.folders.require()  # before the body is read: the answer says how to turn /ingest on
    body = await Body.read(request, limit=s.max_body)
    named = body.paths("paths")
    prune = body.flag("prune")
    rag = await pipeline_for(request, requested(body.value("collection", str)))
    paths = await asyncio.to_thread(lambda: [s.folders.resolve(p) for p in named])
    job = s.writer.submit(list(dict.fromkeys(paths)), prune, rag=rag)
    return JSONResponse(job.to_dict(), 202)


async def ingest_job(request: "Request"):
    from starlette.responses import JSONResponse

    job = served(request).writer.job(request.path_params["job"])
    if job is None:
        raise HTTPError(404, f"no such ingest job (the server keeps the last {FINISHED_JOBS_KEPT} finished ones)",
                        "not_found_error")
    return JSONResponse(job.to_dict())


async def models(request: "Request"):
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list", "data": [
        {"id": served(request).model_name, "object": "model", "created": 0, "owned_by": "rag"}]})


async def chat_completions(request: "Request"):
    from starlette.responses import JSONResponse, Response, StreamingResponse

    arrived = Start.now("request")  # the answer's start_to_first_token_seconds counts from here
    s = served(request)
    chat = chat_request(await Body.read(request, limit=s.max_body))
    if s.stopping:
        raise HTTPError(503, STOPPING, "server_error", "server_stopping")
    rag = await pipeline_for(request, requested(chat.collection))
    reply = _Reply(s, chat)
    stream = rag.aask_stream(chat.ask.replace(start=arrived))
    s.answers.add(stream)
    streaming = False
    try:
        if not chat.stream:
            answer = await until_gone(request, stream.result(), stream.cancel)
            return JSONResponse(oa.completion(reply.id, reply.created, s.model_name, answer, reply.limit))
        # The first piece (or the error before it) is awaited here: bad input is a 4xx, not a broken stream.
        first = await until_gone(request, _first(stream), stream.cancel)
        streaming = True
    except ClientGone:
        return Response(status_code=499)
    except Cancelled:
        if s.stopping:
            raise HTTPError(503, STOPPING, "server_error", "server_stopping") from None
        raise
    finally:
        if not streaming:
            s.answers.discard(stream)
    return StreamingResponse(reply.events(stream, first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _first(stream: "AsyncAnswerStream") -> str | None:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return None


async def until_gone(request: "Request", work: Awaitable, cancel: Callable[[], None]):
    """The result of ``work``, unless the client disconnects first: then ``cancel()`` (the answer
    stops generating) and :class:`ClientGone`."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if task.done():
        return task.result()
    cancel()
    task.cancel()
    try:
        await task
    except BaseException:  # noqa: BLE001 - the client is gone; the cancellation is the outcome
        pass
    raise ClientGone()


async def _disconnected(request: "Request") -> None:
    """Returns when the client closes the connection (the body is read: what comes next is that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Reply:
    """One chat completion's identity and limit, and its stream of server-sent events."""

    def __init__(self, s: Served, chat: ChatRequest):
        self.served = s
        self.model = s.model_name
        self.id = f"chatcmpl-{next(s.ids)}-{uuid.uuid4().hex[:8]}"
        self.created = int(time.time())
        self.limit = chat.ask.max_tokens or s.rag.config.ask.max_tokens
        self.include_usage = chat.include_usage

    def _chunk(self, delta: dict | None, **kw) -> dict:
        return oa.chunk(self.id, self.created, self.model, delta, **kw)

    async def events(self, stream: "AsyncAnswerStream", first: str | None) -> AsyncIterator[str]:
        yield oa.sse(self._chunk({"role": "assistant", "content": first or ""}, sources=stream.sources))
        try:
            if first is not None:
                async for piece in stream:
                    yield oa.sse(self._chunk({"content": piece}))
        except RagError as err:
            code, kind = status_for(err)
            if isinstance(err, Cancelled) and self.served.stopping:
                code, kind, err = 503, "server_error", STOPPING
            yield oa.sse({"error": {"message": str(err), "type": kind, "code": code}})
            return
        finally:
            self.served.answers.discard(stream)
        answer = stream.answer
        final = self._chunk({}, finish=oa.finish_reason(answer, self.limit))
        if answer is not None:
            final["stats"] = answer.stats.to_dict()
        yield oa.sse(final)
        if self.include_usage and answer is not None:
            yield oa.sse(oa.usage_chunk(self.id, self.created, self.model, answer))
        yield oa.DONE
