"""Taking turns on one llama.cpp context: a first-come-first-served lock, and cancelling a turn.

One llama.cpp context holds one KV cache and one batch; two threads decoding in it
at once corrupt it (llama.cpp aborts the process with ``GGML_ASSERT(n_outputs_prev
+ n_outputs <= n_outputs_all)``). The engine therefore runs one prompt at a time,
each holding a :class:`FairLock` from its first token until its stream ends or is
closed; waiters are served in arrival order (``threading.Lock`` promises no order,
so a thread asking in a loop could starve the others). A :class:`CancelToken`
takes a waiting call out of the queue, and stops a running one: the engine sets
llama.cpp's abort flag, which ends the running decode within one micro-batch. A
stream paused between two pieces runs nothing, so closing the engine ends its turn
from the closing thread (:class:`Revocable`) instead of waiting for it. :class:`ContextLock`
puts these together for one context: who holds it, its queue, its streams, closing it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Generator, Iterator

from ..errors import Cancelled, EngineClosed, EngineError

if TYPE_CHECKING:
    from ._llama import AbortFlag


class CancelToken:
    """Cancels one call, from any thread: while it waits for the engine, or while it runs in it."""

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
    """A lock granted in arrival order (FIFO); it may be released by a thread other than its holder
    (a stream garbage-collected on another thread gives the engine back)."""

    def __init__(self, *, on_queue: Callable[[], None] | None = None) -> None:
        self._mu = threading.Lock()
        self._held = False
        self._queue: deque[threading.Event] = deque()
        self._on_queue = on_queue  # called (outside the lock) when a caller starts waiting

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def locked(self) -> bool:
        return self._held

    def acquire(self, *, cancel: CancelToken | None = None, timeout: float | None = None) -> bool:
        """Wait for the lock in arrival order; False after ``timeout`` seconds without it,
        :class:`~pipeline.errors.Cancelled` if ``cancel`` fires first."""
        with self._mu:
            if not self._held and not self._queue and not (cancel is not None and cancel.cancelled):
                self._held = True
                return True
            turn = threading.Event()
            self._queue.append(turn)
        if self._on_queue is not None:
            self._on_queue()
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


class Revocable:
    """The pieces of one turn (a generator holding the engine), which another thread may end while
    it is paused between two pieces: :meth:`revoke` closes the generator there and then (its
    ``finally`` gives the engine back), and the next read raises :class:`~pipeline.errors.EngineClosed`
    with ``message``. A read in progress is never interrupted: :meth:`revoke` then returns False."""

    def __init__(self, pieces: Generator[str, None, None], message: str):
        self._pieces = pieces
        self._message = message
        self._mu = threading.Lock()  # held while a piece is computed
        self._revoked = False
        self._done = False

    def __iter__(self) -> "Revocable":
        return self

    def __next__(self) -> str:
        with self._mu:
            if self._revoked:
                raise EngineClosed(self._message)
            try:
                return next(self._pieces)
            except BaseException:
                self._done = True  # finished, failed or stopped: nothing left to revoke
                raise

    def close(self) -> None:
        with self._mu:
            self._pieces.close()

    def revoke(self) -> bool:
        """End the turn now unless a piece is being computed; True when it is ended."""
        if not self._mu.acquire(blocking=False):
            return False
        try:
            if not self._done:
                self._revoked = True
                self._pieces.close()
        finally:
            self._mu.release()
        return True


class ContextLock:
    """Prompts taking turns on one llama.cpp context, and ending them all when it closes.

    A turn given a cancel token and the context's :class:`~._llama.AbortFlag` sets the flag
    when cancelled, which stops the running decode. ``closed`` is the message a stream made
    before a close raises when it is read.
    """

    def __init__(self, *, closed: str):
        self._closed = closed
        self._lock = FairLock(on_queue=self._someone_waits)
        self._preemptible = False  # the running turn gives way to the next in line (background work)
        self._holder: int | None = None
        self._cancel: CancelToken | None = None  # the running turn's cancel token
        self._closing = False
        self.epoch = 0  # how many times close() ran: a stream made before a close never runs after it
        self._streams: weakref.WeakSet[Revocable] = weakref.WeakSet()  # what close() ends
        self._streams_mu = threading.Lock()

    @property
    def queued(self) -> int:
        """Prompts waiting for the context (the running one not included)."""
        return self._lock.waiting

    @property
    def busy(self) -> bool:
        """Whether a prompt holds the context now."""
        return self._lock.locked

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def stopping(self) -> bool:
        """Whether the running turn was asked to stop (its cancel token, or :meth:`close`)."""
        return self._closing or (self._cancel is not None and self._cancel.cancelled)

    def stream(self, pieces: Generator[str, None, None]) -> Revocable:
        """``pieces`` (a generator that holds a turn while it runs) as a stream :meth:`close` can end."""
        out = Revocable(pieces, self._closed)
        with self._streams_mu:
            self._streams.add(out)
        return out

    def _someone_waits(self) -> None:
        cancel = self._cancel
        if self._preemptible and cancel is not None:
            cancel.cancel()

    @contextmanager
    def hold(self, cancel: CancelToken | None = None, epoch: int | None = None, *,
             flag: Callable[[], AbortFlag] | None = None, preemptible: bool = False) -> Iterator[None]:
        """Hold the context: other threads wait (first come, first served); the holding thread may
        not start a second prompt. ``cancel`` aborts what runs in the turn (through ``flag()``, the
        context's abort flag, got once the turn is granted); a stream made before the context was
        closed (``epoch``) never gets a turn after it. A ``preemptible`` turn (background work) is
        cancelled as soon as another caller waits, and is not started while one does (its own token
        then, cancelled with ``cancel`` too: giving way leaves the caller's token as it was)."""
        me = threading.get_ident()
        if self._holder == me:
            raise EngineError("this thread is still reading an earlier answer from this engine: finish it "
                              "(or close its stream) before starting another")
        if preemptible:
            own = CancelToken()
            unlink = cancel.on_cancel(own.cancel) if cancel is not None else (lambda: None)
            try:
                with self._hold(own, epoch, flag, preemptible=True):
                    yield
            finally:
                unlink()
            return
        with self._hold(cancel, epoch, flag):
            yield

    @contextmanager
    def _hold(self, cancel: CancelToken | None, epoch: int | None, flag: Callable[[], AbortFlag] | None, *,
              preemptible: bool = False) -> Iterator[None]:
        me = threading.get_ident()
        self._lock.acquire(cancel=cancel)
        if self._closing or (epoch is not None and epoch != self.epoch):
            self._lock.release()
            raise EngineClosed(self._closed)
        self._holder, self._cancel, self._preemptible = me, cancel, preemptible
        if preemptible and self._lock.waiting:
            self._holder = self._cancel = None
            self._preemptible = False
            self._lock.release()
            raise Cancelled("gave way to a waiting prompt")
        abort = flag() if cancel is not None and flag is not None else None
        unregister = cancel.on_cancel(abort.set) if abort is not None else (lambda: None)
        try:
            yield
        except EngineError:
            if cancel is None or not cancel.cancelled or self._closing:
                raise
            raise Cancelled("cancelled while the engine ran it") from None  # the abort's doing
        finally:
            unregister()
            if abort is not None and not self._closing:  # close() keeps it set until it holds the context
                abort.clear()
            self._holder = self._cancel = None
            self._preemptible = False
            self._lock.release()

    def close(self, free: Callable[[], None], *, flag: AbortFlag | None = None) -> None:
        """End every unfinished stream (``flag``, the context's abort flag where a model is loaded, stops
        a running decode), then call ``free`` holding the context (see :meth:`.local.Engine.close`).
        Called from inside a running turn of this thread, it cannot wait for that turn and frees nothing."""
        self.epoch += 1
        self._closing = True
        if flag is not None:
            flag.set()
        try:
            deadline = time.monotonic() + 30
            while True:
                with self._streams_mu:
                    streams = list(self._streams)
                for stream in streams:
                    stream.revoke()  # a paused one gives the context back here, in this thread
                if self._lock.acquire(timeout=0.05):
                    break
                if self._holder == threading.get_ident() or time.monotonic() > deadline:
                    return
        finally:
            if flag is not None:
                flag.clear()
            self._closing = False
        try:
            free()
        finally:
            self._lock.release()
