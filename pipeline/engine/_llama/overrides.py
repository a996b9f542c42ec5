"""Tensor buffer-type overrides: the C array of ``llama_model_tensor_buft_override`` the loader reads.

The ggml backend functions come from the libraries libllama already loaded; buffer
types are looked up by name the way llama.cpp's own ``-ot`` parser does.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import llama_cpp.llama_cpp as _llama_cpp_c

from ...errors import EngineError
from ..offload import Override


class _BuftOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


_ggml_lock = threading.Lock()
_ggml: dict[str, Any] = {}


def ggml_functions() -> dict[str, Any]:
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
    f = ggml_functions()
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

