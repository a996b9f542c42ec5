"""The pipeline from asyncio: answers and streams that never block the event loop.

Each call runs in a thread of its own (retrieval and packing, then generation in the
engine's FIFO queue; see :mod:`pipeline.engine.pool`), and pieces come back to the loop with
``call_soon_threadsafe``. A dedicated thread per stream, not the loop's default
executor: streams wait for the engine for as long as the queue is, and eight of them
would exhaust a small executor that other work needs.

Cancelling the awaiting task, ``aclose()``, leaving an ``async with`` block, or dropping an
unfinished stream (leaving ``async for piece in pipeline.aask_stream(q)`` early drops it)
cancels the call: one that waits for the engine leaves the queue, one that prefills or
decodes stops within one micro-batch (llama.cpp's abort callback).
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Callable

from ..engine.context_lock import CancelToken
from ..errors import Cancelled, EngineClosed

if TYPE_CHECKING:
    from .answer import Answer, AnswerStream

class AsyncAnswerStream:
    """``async for piece in stream``; then ``stream.answer``. Created by :meth:`Pipeline.aask_stream`."""

    def __init__(self, start: Callable[[CancelToken], "AnswerStream"]):
        self._start = start
        self.cancel_token = CancelToken()
        self.answer: "Answer | None" = None
        self.sources: list[dict] | None = None
        self._queue: asyncio.Queue | None = None
        self._thread: threading.Thread | None = None
        self._done = False
        # The pipeline was closed under it: the next read says so. A box, not an attribute set by the
        # worker thread, so that the thread holds no reference to the stream (see __del__).
        self._closed: list[BaseException] = []
        self.finished = threading.Event()  # set when the worker thread has given the engine back

    def __aiter__(self) -> "AsyncAnswerStream":
        return self

    async def __anext__(self) -> str:
        if self._closed:
            self._done = True
            raise self._closed.pop()
        if self._done:
            raise StopAsyncIteration
        if self._queue is None:
            self._launch()
        try:
            kind, value = await self._queue.get()
        except BaseException:  # the task was cancelled (or the loop is going away)
            self.cancel()
            raise
        if kind == "sources":
            self.sources = value
            return await self.__anext__()
        if kind == "piece":
            return value
        self._done = True
        if kind == "done":
            self.answer = value
            raise StopAsyncIteration
        self._closed.clear()
        raise value

    def _launch(self) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        self._queue = queue
        token, start, closed, finished = self.cancel_token, self._start, self._closed, self.finished

        def put(item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop was closed: nobody is listening any more
                token.cancel()

        def work() -> None:
            try:
                token.raise_if_cancelled()
                stream = start(token)
                put(("sources", stream.sources))
                with stream:
                    for piece in stream:
                        if token.cancelled:
                            raise Cancelled("cancelled")
                        put(("piece", piece))
                put(("done", stream.answer))
            except EngineClosed as exc:  # pieces not read yet are void: the next read raises
                closed.append(exc)
                put(("error", exc))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                put(("error", exc))
            finally:
                finished.set()

        self._thread = threading.Thread(target=work, name="rag-aask", daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Stop the call: it leaves the engine's queue, or its prefill/decode stops."""
        self._done = True
        self.cancel_token.cancel()

    async def aclose(self) -> None:
        self.cancel()

    async def __aenter__(self) -> "AsyncAnswerStream":
        return self

    async def __aexit__(self, *exc) -> None:
        if self.answer is None:
            self.cancel()

    def __del__(self) -> None:
        token = getattr(self, "cancel_token", None)
        if token is not None and getattr(self, "answer", None) is None and not token.cancelled:
            token.cancel()  # dropped unfinished: nobody will read it

    async def result(self) -> "Answer":
        async for _ in self:
            pass
        if self.answer is None:  # cancelled between two pieces
            raise Cancelled("cancelled")
        return self.answer


async def aask(stream: AsyncAnswerStream) -> "Answer":
    """The answer ``stream`` completes to; cancelling the awaiting task cancels the call."""
    try:
        return await stream.result()
    finally:
        if stream.answer is None:
            stream.cancel()
