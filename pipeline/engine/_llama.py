"""Private ctypes glue for what llama-cpp-python 0.3.36 does not expose.

Three things:

* :class:`TensorOverrides`: the C array of ``llama_model_tensor_buft_override``
  (pattern, buffer type) that llama.cpp's loader reads, built from
  :class:`pipeline.engine.offload.Override` values;
* :func:`load_llama`: build a ``llama_cpp.Llama`` whose model loads with those
  overrides and with model params the ``Llama`` constructor has no argument for
  (``use_extra_bufts``, ``no_alloc``, ``no_host``...);
* :class:`LlamaLog`: capture llama.cpp's log (every level, debug included) while
  keeping whatever logging was in place before.

Besides the engine, this is the only module that touches llama_cpp internals.
How params reach the loader: ``Llama.__init__`` fills a ``llama_model_params``
and ``llama_cpp._internals.LlamaModel`` passes it, by value, to
``llama_cpp.llama_cpp.llama_model_load_from_file`` (looked up on the module at
call time). :func:`load_llama` wraps that one function, once per process, with a
pass-through that edits the params only for a load requested by this thread, so
it sees exactly what reaches the loader, after ``Llama`` has set its own fields.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as _llama_cpp_c

from ..errors import EngineError
from .offload import Override

# --------------------------------------------------------------------------- ggml


class _BuftOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


_ggml_lock = threading.Lock()
_ggml: dict[str, Any] = {}


def _ggml_functions() -> dict[str, Any]:
    """The ggml backend functions used here, from the libraries libllama already loaded."""
    with _ggml_lock:
        if _ggml:
            return _ggml
        # Look the symbols up through libllama's own handle: dlsym on a handle searches
        # the library and its dependencies, so these are the very copies of
        # libggml-base.so.0 / libggml.so.0 that llama.cpp uses. Opening
        # lib/libggml-base.so by path instead would load a *second copy* (the
        # wheel holds real files, not symlinks), whose ggml_backend_cpu_buffer_type()
        # is another object than the one the loader compares with.
        libs = [_llama_cpp_c._lib]

        def find(symbol: str, restype: Any, argtypes: list[Any]) -> Any:
            for lib in libs:
                fn = getattr(lib, symbol, None)
                if fn is not None:
                    fn.restype, fn.argtypes = restype, argtypes
                    return fn
            return None

        funcs = {
            "cpu_buffer_type": find("ggml_backend_cpu_buffer_type", ctypes.c_void_p, []),
            "dev_count": find("ggml_backend_dev_count", ctypes.c_size_t, []),
            "dev_get": find("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
            "dev_buffer_type": find("ggml_backend_dev_buffer_type", ctypes.c_void_p, [ctypes.c_void_p]),
            "buft_name": find("ggml_backend_buft_name", ctypes.c_char_p, [ctypes.c_void_p]),
        }
        if funcs["cpu_buffer_type"] is None:
            raise EngineError("This llama.cpp build does not export ggml_backend_cpu_buffer_type.")
        _ggml.update(funcs)
        return _ggml


def buffer_types() -> dict[str, int]:
    """Buffer type name -> ``ggml_backend_buffer_type_t`` for every device of this build.

    The same table llama.cpp's ``-ot`` parser builds (each device's default buffer
    type, by name: ``CPU``, ``CUDA0``...), with ``CPU`` always present.
    """
    f = _ggml_functions()
    table: dict[str, int] = {}
    if f["dev_count"] and f["dev_get"] and f["dev_buffer_type"] and f["buft_name"]:
        for i in range(f["dev_count"]()):
            dev = f["dev_get"](i)
            buft = f["dev_buffer_type"](dev) if dev else None
            if buft:
                table[f["buft_name"](buft).decode()] = buft
    table["CPU"] = f["cpu_buffer_type"]()
    return table


def buffer_type(name: str) -> int:
    """The ``ggml_backend_buffer_type_t`` called ``name`` on this build, or EngineError."""
    table = buffer_types()
    try:
        return table[name]
    except KeyError:
        raise EngineError(
            f"Unknown buffer type {name!r} for tensor overrides; this llama.cpp build has: "
            f"{', '.join(sorted(table))}."
        ) from None


class TensorOverrides:
    """The NULL-terminated C array of tensor buffer-type overrides, kept alive.

    The array points into byte strings owned by this object: keep it referenced as
    long as the model it was loaded with lives (:func:`load_llama` attaches it to
    the ``Llama``).
    """

    def __init__(self, overrides: Sequence[Override]):
        self.overrides = tuple(overrides)
        self._patterns = [o.pattern.encode("utf-8") for o in self.overrides]
        bufts = [buffer_type(o.buffer) for o in self.overrides]
        self._array = (_BuftOverride * (len(self.overrides) + 1))()
        for i, (pattern, buft) in enumerate(zip(self._patterns, bufts)):
            self._array[i].pattern = pattern
            self._array[i].buft = buft
        # the last entry stays zeroed: {NULL, NULL} ends the list

    def __len__(self) -> int:
        return len(self.overrides)

    @property
    def address(self) -> int | None:
        """Value for ``llama_model_params.tensor_buft_overrides`` (None: no overrides)."""
        return ctypes.addressof(self._array) if self.overrides else None


# --------------------------------------------------------------------------- loading

_MODEL_PARAM_FIELDS = {name for name, _ in _llama_cpp_c.llama_model_params._fields_}
_local = threading.local()  # .pending: dict of field -> value for this thread's next load
_install_lock = threading.Lock()
_original_load = None


def _install_load_hook() -> None:
    """Wrap ``llama_model_load_from_file`` once: a pass-through unless this thread asked for params."""
    global _original_load
    with _install_lock:
        if _original_load is not None:
            return
        original = _llama_cpp_c.llama_model_load_from_file

        def llama_model_load_from_file(path_model: bytes, params: Any) -> Any:
            pending = getattr(_local, "pending", None)
            if pending is not None:
                _local.pending = None  # one load only (a draft model would load plainly)
                for name, value in pending.items():
                    setattr(params, name, value)
                _local.applied = True
            return original(path_model, params)

        llama_model_load_from_file.__wrapped__ = original  # type: ignore[attr-defined]
        _original_load = original
        _llama_cpp_c.llama_model_load_from_file = llama_model_load_from_file


def load_llama(
    model_path: str | os.PathLike[str],
    *,
    overrides: Sequence[Override] = (),
    model_params: Mapping[str, Any] | None = None,
    **llama_kwargs: Any,
) -> llama_cpp.Llama:
    """``llama_cpp.Llama(model_path, **llama_kwargs)`` with tensor overrides and extra model params.

    ``model_params`` sets fields of ``llama_model_params`` by name on the params that
    reach the loader, e.g. ``{"use_extra_bufts": False, "no_alloc": True}``;
    ``use_mmap`` there is passed on to ``Llama`` (which maps it to ``load_mode``);
    ``no_alloc`` (a dry run) turns mmap off, which llama.cpp requires for it.
    The overrides' C array is kept on the returned object as ``_tensor_overrides``.
    """
    params = dict(model_params or {})
    if "use_mmap" in params:
        llama_kwargs["use_mmap"] = bool(params.pop("use_mmap"))
    if params.get("no_alloc"):
        # llama.cpp's dry run maps nothing: with mmap on it aborts the process
        # (GGML_ASSERT(!ml.no_alloc) in load_tensors), so it needs load_mode NONE.
        if llama_kwargs.get("use_mmap", False) or llama_kwargs.get("use_mlock", False):
            raise EngineError("A dry run (no_alloc) cannot use mmap or mlock.")
        llama_kwargs["use_mmap"] = False
        llama_kwargs["use_mlock"] = False
    unknown = set(params) - _MODEL_PARAM_FIELDS
    if unknown:
        raise EngineError(f"Unknown llama.cpp model parameter(s): {', '.join(sorted(unknown))}.")
    if "tensor_buft_overrides" in params:
        raise EngineError("Pass tensor overrides as `overrides`, not as a raw model parameter.")
    keep = TensorOverrides(overrides)
    if keep.address is not None:
        params["tensor_buft_overrides"] = keep.address

    _install_load_hook()
    _local.pending = params if params else None
    _local.applied = False
    try:
        llm = llama_cpp.Llama(model_path=str(model_path), **llama_kwargs)
    except ValueError as exc:  # llama-cpp-python reports load failures as ValueError
        raise EngineError(f"llama.cpp could not load {model_path}: {exc}") from exc
    finally:
        applied = _local.applied or not params
        _local.pending = None
    if not applied:  # a future llama-cpp-python that loads some other way
        llm.close()
        raise EngineError("The model params did not reach llama.cpp's loader; this llama-cpp-python is not supported.")
    llm._tensor_overrides = keep  # type: ignore[attr-defined]
    return llm


# --------------------------------------------------------------------------- logging

# ggml_log_level, as ggml.h of this build defines it. (llama-cpp-python's _logger.py
# has an older order, INFO=1 ... DEBUG=4, and so misclassifies every level.)
LOG_NONE, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CONT = range(6)

_OVERRIDE_LINE = re.compile(r"tensor (\S+) \((.*?)\) buffer type overridden to (\S+)")
# One capture at a time across threads (the log callback is process-wide);
# re-entrant so captures nest on one thread.
_log_lock = threading.RLock()


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


# --------------------------------------------------------------------------- abort


class AbortFlag:
    """llama.cpp's abort callback on one context, driven by a flag that is read without the GIL.

    ``llama_set_abort_callback`` makes the CPU backend call ``cb(data)`` after every
    graph operation (hundreds per micro-batch), on a ggml worker thread. A Python
    callback would take the GIL each time, so a busy Python thread elsewhere in the
    process (a web server, retrieval) would stall every ggml barrier. The callback is
    therefore libc's ``strlen`` over a two-byte buffer: ``"\\0\\0"`` reads as length 0
    (false: go on), ``"\\1\\0"`` as 1 (true: abort). The signatures differ only in the
    return width, which the x86-64 and AArch64 ABIs pass in the same register, low
    byte first. An aborted ``llama_decode`` returns 2 and llama.cpp drops the cells of
    the unfinished micro-batch; the engine then clears its memory (see ``prefill``).
    """

    def __init__(self, ctx) -> None:
        libc = ctypes.CDLL(None)
        self._buf = ctypes.create_string_buffer(2)  # kept alive as long as the context uses it
        self._callback = ctypes.cast(libc.strlen, llama_cpp.ggml_abort_callback)
        llama_cpp.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._buf, ctypes.c_void_p))

    def set(self) -> None:
        self._buf[0] = 1

    def clear(self) -> None:
        self._buf[0] = 0

    @property
    def is_set(self) -> bool:
        return self._buf.raw[0] == 1
