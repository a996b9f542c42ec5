"""The build, for ``rag status``: llama.cpp's own account of what it was compiled for, and its devices."""

from __future__ import annotations

import ctypes

import llama_cpp
import llama_cpp.llama_cpp as _llama_cpp_c

from .overrides import ggml_functions


def system_info() -> str:
    """llama.cpp's own account of its build (``llama_print_system_info``), without loading a model:
    the CPU instruction sets it was compiled for (``CPU : AVX2 = 1 | ...``) and, on a GPU build, the
    backend and its architectures (``CUDA : ARCHS = 860,900 | ...``)."""
    return llama_cpp.llama_print_system_info().decode(errors="replace")


def devices() -> list[dict[str, str]]:
    """The devices llama.cpp's backends report (``name`` as ``CPU``, ``CUDA0``; ``description``)."""
    f = ggml_functions()
    lib = _llama_cpp_c._lib
    name_of, desc_of = (getattr(lib, s, None) for s in ("ggml_backend_dev_name", "ggml_backend_dev_description"))
    if not (f["dev_count"] and f["dev_get"] and name_of and desc_of):
        return []
    for fn in (name_of, desc_of):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    found = []
    for i in range(f["dev_count"]()):
        dev = f["dev_get"](i)
        if dev:
            found.append({"name": (name_of(dev) or b"").decode(errors="replace"),
                          "description": (desc_of(dev) or b"").decode(errors="replace")})
    return found
