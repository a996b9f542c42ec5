"""What may run at the same time inside one ``Pipeline``, and how waiting and cancelling work.

The policy (also in the README):

- **Generation is serialised per engine.** One llama.cpp context holds one KV cache
  and one batch; two threads decoding in it at once corrupt it (llama.cpp aborts the
  process with ``GGML_ASSERT(n_outputs_prev + n_outputs <= n_outputs_all)``). Every
  prefill, decode, warm-up and prefix-cache restore holds the engine's
  :class:`FairLock`; waiters are served first come, first served.
- **A stream holds the engine while it is being iterated**: from its first piece
  until it is exhausted, closed, or garbage-collected. An abandoned stream releases
  it when it is closed (``with`` / ``close()``) or collected.
- **Retrieval runs beside generation.** Tokenising, embedding a query, dense and
  lexical search and packing touch no generator context; the embedder has its own
  lock (held per batch of chunks, so a query waits at most for one batch of an ingest).
- **Reads go on during the pipeline's own ingest**: the threads of one pipeline share
  one open store (one process lock), each with its own SQLite connection; readers see
  committed documents only. Across processes the store is still one process at a time.
- **Cancelling** (:class:`CancelToken`) a call that waits for the engine takes it out
  of the queue; cancelling one that runs sets llama.cpp's abort flag, which stops the
  running decode between two graph operations (well within one micro-batch).
"""

from __future__ import annotations

import threading
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

from .errors import Cancelled

if TYPE_CHECKING:
    from .api import AnswerStream


class CancelToken:
    """Cancels one call: while it waits for the engine, or while it runs in it."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._mu = threading.Lock()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._mu:
            if self._event.is_set():
                return
            self._event.set()
            callbacks = list(self._callbacks)
        for cb in callbacks:
            cb()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when cancelled (now, if already); returns a function that unregisters it."""
        with self._mu:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        callback()
        return lambda: None

    def _remove(self, callback) -> None:
        with self._mu:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled("cancelled")


class FairLock:
    """A lock granted in arrival order (FIFO); it may be released by a thread other than its holder.

    ``threading.Lock`` makes no ordering promise, so a thread asking questions in a
    loop could starve the others. Releasing from another thread is what lets a
    garbage-collected stream give the engine back.
    """

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._held = False
        self._queue: deque[threading.Event] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def locked(self) -> bool:
        return self._held

    def acquire(self, *, cancel: CancelToken | None = None, timeout: float | None = None) -> bool:
        """Wait for the lock (in arrival order); False after ``timeout`` seconds without it."""
        with self._mu:
            if not self._held and not self._queue:
                self._held = True
                return True
            turn = threading.Event()
            self._queue.append(turn)
        unregister = cancel.on_cancel(turn.set) if cancel else (lambda: None)
        try:
            turn.wait(timeout)
        finally:
            unregister()
        with self._mu:
            granted = turn not in self._queue  # release() pops a turn when it hands the lock over
            if not granted:  # woken by the cancel or the timeout, still waiting: leave the queue
                self._queue.remove(turn)
        if cancel is not None and cancel.cancelled:
            if granted:
                self.release()
            raise Cancelled("cancelled while waiting for the engine")
        return granted

    def release(self) -> None:
        with self._mu:
            if not self._held:
                raise RuntimeError("release of an unheld FairLock")
            if self._queue:
                self._queue.popleft().set()  # ownership passes straight to the next in line
            else:
                self._held = False

    @contextmanager
    def held(self, *, cancel: CancelToken | None = None) -> Iterator[None]:
        self.acquire(cancel=cancel)
        try:
            yield
        finally:
            self.release()


class EngineGate:
    """One engine's turn-taking: a :class:`FairLock` plus its llama.cpp abort flag.

    ``abort_flag`` is called once, lazily (it needs the loaded model), and returns an
    object with ``set()`` and ``clear()``; see :func:`pipeline.engine._llama.AbortFlag`.
    """

    def __init__(self, abort_flag: Callable[[], object] | None = None) -> None:
        self.lock = FairLock()
        self._abort_flag_factory = abort_flag
        self._flag = None
        self._mu = threading.Lock()
        self._current: CancelToken | None = None

    def _abort(self):
        if self._flag is None and self._abort_flag_factory is not None:
            self._flag = self._abort_flag_factory()
        return self._flag

    @contextmanager
    def turn(self, cancel: CancelToken | None = None) -> Iterator[None]:
        """Hold the engine for the ``with`` block; ``cancel`` aborts what runs in it."""
        self.lock.acquire(cancel=cancel)
        unregister = lambda: None  # noqa: E731
        try:
            flag = self._abort()
            with self._mu:
                self._current = cancel
                if flag is not None:
                    flag.clear()
            if cancel is not None:
                unregister = cancel.on_cancel(lambda: self._abort_if_current(cancel))
            yield
        finally:
            unregister()
            with self._mu:
                self._current = None
                if self._flag is not None:
                    self._flag.clear()
            self.lock.release()

    def stop(self, *, timeout: float = 10.0) -> bool:
        """Abort what runs, wait (up to ``timeout``) for the engine to be free, and keep it.

        For closing: False if it stayed busy (a stream kept alive and never finished).
        """
        with self._mu:
            if self._flag is not None and self.lock.locked:
                self._flag.set()
        return self.lock.acquire(timeout=timeout)

    def _abort_if_current(self, token: CancelToken) -> None:
        with self._mu:
            if self._current is token and self._flag is not None:
                self._flag.set()


def iterate_interruptibly(stream: "AnswerStream") -> Iterator[str]:
    """The stream's pieces, generated in a worker thread, so that Ctrl-C in the main thread is seen
    at once (a signal reaches Python only between bytecodes, never inside a ``llama_decode``) and
    cancels it: the decode stops within one micro-batch and :class:`Cancelled` is raised."""
    import queue as queue_mod

    q: queue_mod.Queue = queue_mod.Queue(maxsize=64)
    end = object()

    def work() -> None:
        try:
            with stream:
                for piece in stream:
                    q.put(piece)
            q.put(end)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            q.put(exc)

    worker = threading.Thread(target=work, name="rag-ask", daemon=True)
    worker.start()
    try:
        while True:
            try:
                item = q.get(timeout=0.1)
            except queue_mod.Empty:
                continue
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    except (KeyboardInterrupt, GeneratorExit):
        stream.cancel()
        while worker.is_alive():  # drain so the worker is never stuck on a full queue
            try:
                q.get(timeout=0.05)
            except queue_mod.Empty:
                pass
        raise
