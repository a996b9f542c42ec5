"""llama.cpp's log: captured (every level, debug included) and, outside a capture, shown as a
command-line tool should: errors on stderr, warnings and chatter only when llama-cpp-python is verbose."""

from __future__ import annotations

import ctypes
import logging
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import llama_cpp.llama_cpp as _llama_cpp_c

# ggml_log_level, as ggml.h of this build defines it. (llama-cpp-python's _logger.py
# has an older order, INFO=1 ... DEBUG=4, and so misclassifies every level.)
LOG_NONE, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CONT = range(6)

# What llama.cpp logs as errors when a decode was cancelled on purpose (its abort callback said so:
# ggml status 1 = aborted, llama_decode 2 = aborted), and the memory clean-up that follows.
_ABORTED = re.compile(r"compute status: 1\b|failed with error 1\b|failed to decode, ret = 2\b"
                      r"|removing memory module entries")
_OVERRIDE_LINE = re.compile(r"tensor (\S+) \((.*?)\) buffer type overridden to (\S+)")
# One capture at a time across threads (the log callback is process-wide);
# re-entrant so captures nest on one thread.
_log_lock = threading.RLock()


class _Default:
    """The process's llama.cpp log callback. llama-cpp-python's own reads the levels in an older order
    and so prints every warning as an error (Gemma's "using full-size SWA cache" on every question)."""

    def __init__(self) -> None:
        self.last = LOG_INFO
        self.callback = _llama_cpp_c.llama_log_callback(self._on_log)  # referenced while installed

    def _on_log(self, level: int, text: bytes | None, user_data: Any) -> None:
        try:
            self.last = level = self.last if level == LOG_CONT else level
            line = (text or b"").decode("utf-8", errors="replace")
            verbose = logging.NOTSET < logging.getLogger("llama-cpp-python").level <= logging.DEBUG  # set_verbose(True)
            if verbose or level == LOG_ERROR and not _ABORTED.search(line):
                print(line, end="", flush=True, file=sys.stderr)
        except Exception:  # never let an exception cross into C
            pass


_default = _Default()
_llama_cpp_c.llama_log_set(_default.callback, ctypes.c_void_p(0))


#: The interpreter's switch interval while a model loads (Python's default is 5 ms).
LOADING_SWITCH_SECONDS = 0.0005
_handover_mu = threading.Lock()
_handover: list = [0, None]  # loads under way, the interval to restore when the last one ends


class quick_handover:
    """While a model loads, hand the GIL between threads every :data:`LOADING_SWITCH_SECONDS`.

    llama.cpp's loader calls the log callback above for every line it logs (about 1,400 for a
    model with a 262K-token vocabulary), and each call needs the GIL. A thread busy in Python
    meanwhile (retrieval beside a background load, a web app's requests) holds it for up to the
    switch interval before each call gets it: at Python's default of 5 ms a load that takes 0.8 s
    alone took 2.5-3.7 s beside one busy thread, 1.0 s at 0.5 ms. Loads may overlap; the interval
    in force before the first is restored when the last ends.
    """

    def __enter__(self) -> "quick_handover":
        with _handover_mu:
            if _handover[0] == 0:
                _handover[1] = sys.getswitchinterval()
                sys.setswitchinterval(min(_handover[1], LOADING_SWITCH_SECONDS))
            _handover[0] += 1
        return self

    def __exit__(self, *exc: object) -> None:
        with _handover_mu:
            _handover[0] -= 1
            if _handover[0] == 0:
                sys.setswitchinterval(_handover[1])


@dataclass(frozen=True)
class LogRecord:
    level: int  # ggml_log_level; CONT pieces carry the level of the message they continue
    text: str


class LlamaLog:
    """Capture llama.cpp's log while in the ``with`` block.

    Every message reaches the capture, debug level included (llama.cpp filters
    nothing before the callback). Messages are also passed on to the callback that
    was in place (llama-cpp-python's own, which prints only when ``verbose``), so
    the terminal behaves as it would without the capture; ``chain=False`` keeps
    them from it. The previous callback is restored on exit.
    """

    def __init__(self, *, chain: bool = True):
        self.chain = chain
        self._records: list[LogRecord] = []
        self._lock = threading.Lock()
        self._last_level = LOG_INFO
        self._prev_cb: Any = None
        self._prev_ud = ctypes.c_void_p()
        self._callback = _llama_cpp_c.llama_log_callback(self._on_log)  # referenced while installed

    def _on_log(self, level: int, text: bytes | None, user_data: Any) -> None:
        try:
            s = (text or b"").decode("utf-8", errors="replace")
            with self._lock:
                resolved = self._last_level if level == LOG_CONT else level
                self._last_level = resolved
                self._records.append(LogRecord(resolved, s))
            if self.chain and self._prev_cb:
                self._prev_cb(level, text, self._prev_ud)
        except Exception:  # never let an exception cross into C
            pass

    def __enter__(self) -> LlamaLog:
        _log_lock.acquire()
        try:
            prev = _llama_cpp_c.llama_log_callback()
            _llama_cpp_c.llama_log_get(ctypes.byref(prev), ctypes.byref(self._prev_ud))
            self._prev_cb = prev
            _llama_cpp_c.llama_log_set(self._callback, ctypes.c_void_p(0))
        except BaseException:
            _log_lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            # NULL restores llama.cpp's default (stderr) logger, as before any set.
            _llama_cpp_c.llama_log_set(self._prev_cb, self._prev_ud)
        finally:
            _log_lock.release()

    def pass_on(self) -> None:
        """After the block, hand what was captured to the callback that was in place (what ``chain`` does
        as messages come): for a capture that keeps back what it reports itself, and only that."""
        if self._prev_cb:
            for r in self.records:
                self._prev_cb(r.level, r.text.encode("utf-8"), self._prev_ud)

    # ---- reading

    @property
    def records(self) -> list[LogRecord]:
        with self._lock:
            return list(self._records)

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.records)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    def grep(self, pattern: str) -> list[str]:
        """Lines where ``pattern`` is found (``re.search``)."""
        rx = re.compile(pattern)
        return [line for line in self.lines if rx.search(line)]

    def iter_matches(self, pattern: str) -> Iterator[re.Match[str]]:
        rx = re.compile(pattern)
        for line in self.lines:
            m = rx.search(line)
            if m:
                yield m

    def overridden(self) -> dict[str, str]:
        """Tensor name -> buffer type, from the loader's ``buffer type overridden`` lines (debug level)."""
        return {m.group(1): m.group(3) for m in self.iter_matches(_OVERRIDE_LINE.pattern)}
