"""Ending streams when the pipeline closes, with fakes (no model): :class:`~pipeline.engine.context_lock.Revocable`
and the asyncio stream. The real-model checks are in test_concurrency.py."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline.ask.aio import AsyncAnswerStream
from pipeline.engine.context_lock import FairLock, Revocable
from pipeline.errors import Cancelled, EngineClosed


def _turn(lock: FairLock, log: list, started: threading.Event | None = None, gate: threading.Event | None = None):
    """A generator shaped like the engine's turn: holds ``lock`` from its first piece to its end."""
    with lock.held():
        log.append(threading.current_thread().name)
        try:
            for i in range(3):
                if started is not None:
                    started.set()
                if gate is not None:
                    gate.wait(10)
                yield f"p{i}"
        finally:
            log.append("released")


def test_a_paused_turn_is_ended_from_another_thread_and_its_next_read_says_why():
    lock, log = FairLock(), []
    pieces = Revocable(_turn(lock, log), "closed under it")
    assert next(pieces) == "p0" and lock.locked  # paused between two pieces, holding the lock
    closer = threading.Thread(target=lambda: log.append(pieces.revoke()), name="closer")
    closer.start()
    closer.join(5)
    assert log[-2:] == ["released", True] and not lock.locked  # the turn's finally ran in the closer
    with pytest.raises(EngineClosed, match="closed under it"):
        next(pieces)
    assert isinstance(EngineClosed("x"), Cancelled)  # what apps already catch


def test_a_running_piece_is_not_interrupted_and_a_finished_stream_is_left_alone():
    lock, log = FairLock(), []
    started, gate = threading.Event(), threading.Event()
    pieces = Revocable(_turn(lock, log, started, gate), "closed")
    reader = threading.Thread(target=lambda: log.append(next(pieces)))
    reader.start()
    assert started.wait(5)
    assert pieces.revoke() is False  # computing a piece now: the engine aborts it instead
    gate.set()
    reader.join(5)
    assert log[-1] == "p0"
    assert list(pieces) == ["p1", "p2"] and not lock.locked
    assert pieces.revoke() is True
    with pytest.raises(StopIteration):  # finished before the close: it stays finished
        next(pieces)


def test_a_turn_never_started_is_ended_without_running():
    lock, log = FairLock(), []
    pieces = Revocable(_turn(lock, log), "closed")
    assert pieces.revoke() is True and log == []
    with pytest.raises(EngineClosed):
        next(pieces)


class _ClosedMidway:
    """An AnswerStream stand-in whose engine is closed after two pieces, once ``gate`` is set."""

    sources: list = []
    answer = None

    def __init__(self):
        self.gate = threading.Event()

    def __iter__(self):
        yield "one"
        yield "two"
        self.gate.wait(5)
        raise EngineClosed("closed while generating")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_an_async_stream_raises_at_its_next_read_once_the_engine_was_closed():
    async def main():
        fake = _ClosedMidway()
        stream = AsyncAnswerStream(lambda token: fake)
        first = await stream.__anext__()
        fake.gate.set()  # the engine is closed now, after the first piece was read
        await asyncio.to_thread(stream.finished.wait, 5)  # the worker saw the close; "two" waits unread
        with pytest.raises(EngineClosed):
            await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        return first

    assert asyncio.run(main()) == "one"
