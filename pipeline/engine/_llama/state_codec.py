"""Sequence states stored in a smaller KV type: f16 keys and values written as q8_0 blocks, and back.

A section state is written once and restored by every prompt that holds the section, so
it may be stored smaller than the engine computes it: each f16 row of keys or values as
ggml's q8_0 (blocks of 32 values: an f16 scale and 32 int8, 34 bytes for 64), 53 % of
the size. The engine itself keeps its f16 cache (a q8_0 cache would quantise every
prompt, and on a CPU llama.cpp's attention over q8_0 keys is slower); only the stored
copy is rounded, and a restored state is turned back into f16 before llama.cpp reads it
(its loader takes only the cache's own type).

A stored state keeps llama.cpp's layout (:mod:`.state_format`): only each layer's type,
row size and rows change, so the file of an encoded state is a sequence-state file whose
layers say ``q8_0``. A state is encoded only where every layer is f16 rows whose width is
a multiple of 32 (a V cache stored transposed, without flash attention, is kept as it is).

The arithmetic is ggml's own (``ggml_quantize_chunk``, ``dequantize_row_q8_0`` and the
fp16 row conversions, looked up in the libraries libllama loaded), with numpy doing the
same where a build does not export them.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any, Callable

import numpy as np

from .state_format import Block, StateFormatError, blocks, skip_cells

F32, F16, Q8_0 = 0, 1, 8
#: Stored KV type name -> ggml type id (what ``cache.section_type`` may name).
TYPES = {"f16": F16, "q8_0": Q8_0}
_QK = 32  # values per q8_0 block
_Q8_BYTES = 34  # bytes per q8_0 block: an f16 scale and 32 int8
_CHUNK = 1 << 16  # values converted at a time (a 256 KiB f32 buffer)


def encodable(data: bytes | memoryview, *, start: int = 8) -> bool:
    """Whether every layer of the state is f16 rows that q8_0 can hold (``start``: see :func:`.state_format.blocks`)."""
    return _all_f16(blocks(data, start=start))


def _all_f16(found: list[Block]) -> bool:
    return bool(found) and all(b.type == F16 and not b.transposed and (b.row_bytes // 2) % _QK == 0 for b in found)


def encode(data: bytes | memoryview, write: Callable[[bytes | memoryview], Any], *, skip: int = 0) -> bool:
    """Write the state ``data`` (a buffer state, as ``llama_state_seq_get_data`` gives it) with every
    layer as q8_0, piece by piece through ``write``, leaving out its first ``skip`` bytes; False
    (nothing written) where it cannot be (:func:`encodable`)."""
    view = memoryview(data)
    found = blocks(view)
    if not _all_f16(found):
        return False
    q = _arithmetic()
    at = skip
    for b in found:
        write(view[at:b.at])
        write(struct.pack("<iQ", Q8_0, b.row_bytes // 2 // _QK * _Q8_BYTES))
        write(q.quantize(view[b.data_at:b.end], b.rows * (b.row_bytes // 2)))
        at = b.end
    write(view[at:])
    return True


def decode(data: bytes | memoryview, *, start: int = 8, prefix: bytes = b"") -> np.ndarray:
    """The state ``data`` with every q8_0 layer back in f16 (others as they are), in one new buffer
    (bytes in a numpy array) that begins with ``prefix``; ``start`` is where its memories begin (see :func:`.state_format.blocks`)."""
    view = memoryview(data)
    found = blocks(view, start=start)
    grow = sum(b.rows * (b.row_bytes // _Q8_BYTES * _QK * 2 - b.row_bytes)
               for b in found if b.type == Q8_0 and not b.transposed)
    out = np.empty(len(prefix) + len(view) + grow, np.uint8)  # (every byte is written below)
    out[:len(prefix)] = np.frombuffer(prefix, np.uint8)
    q = _arithmetic()
    at, to = 0, len(prefix)

    def copy(a: int, b: int) -> None:
        nonlocal to
        out[to:to + b - a] = np.frombuffer(view[a:b], np.uint8)
        to += b - a

    for b in found:
        if b.type != Q8_0 or b.transposed:
            continue
        copy(at, b.at)
        width = b.row_bytes // _Q8_BYTES * _QK
        out[to:to + 12] = np.frombuffer(struct.pack("<iQ", F16, width * 2), np.uint8)
        q.dequantize_into(view[b.data_at:b.end], out, to + 12, b.rows * width)
        to += 12 + b.rows * width * 2
        at = b.end
    copy(at, len(view))
    return out


def stored_type(view: memoryview) -> int | None:
    """The ggml type of the first layer's keys in a state, reading no further than its header (None
    where the state holds no cells); raises :class:`StateFormatError` where ``view`` ends before it."""
    try:
        off = 8
        (n_stream,), off = struct.unpack_from("<I", view, off), off + 4
        for _ in range(n_stream):
            (n_cells,), off = struct.unpack_from("<I", view, off), off + 4
            if n_cells == 0:
                continue
            return struct.unpack_from("<i", view, skip_cells(view, off, n_cells) + 8)[0]
    except struct.error as exc:
        raise StateFormatError(f"truncated state ({exc})") from None
    return None


# --------------------------------------------------------------------------- the arithmetic


class _Numpy:
    """q8_0 in numpy, as ggml's reference code rounds it (for builds that do not export ggml's)."""

    @staticmethod
    def quantize(f16: memoryview, n: int) -> bytes:
        x = np.frombuffer(f16, np.float16, n).astype(np.float32).reshape(-1, _QK)
        d = np.abs(x).max(axis=1) / 127.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
        y = x * inv[:, None]
        out = np.empty((len(x), _Q8_BYTES), np.uint8)
        out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        out[:, 2:] = np.trunc(y + np.copysign(0.5, y)).astype(np.int8).view(np.uint8)
        return out.tobytes()

    @staticmethod
    def dequantize_into(q8: memoryview, out: np.ndarray, at: int, n: int) -> None:
        b = np.frombuffer(q8, np.uint8, n // _QK * _Q8_BYTES).reshape(-1, _Q8_BYTES)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        dst = np.frombuffer(out, np.float16, n, at).reshape(-1, _QK)
        np.copyto(dst, b[:, 2:].view(np.int8).astype(np.float32) * d, casting="unsafe")


class _Ggml:
    """q8_0 through ggml's own functions (the copies libllama loaded): its reference q8_0 rounding and
    its CPU backend's fp16 conversions."""

    def __init__(self, fns: dict[str, Any]):
        self.fns = fns

    def quantize(self, f16: memoryview, n: int) -> bytes:
        src = np.frombuffer(f16, np.float16, n)
        f32 = np.empty(n, np.float32)
        self.fns["to_f32"](src.ctypes.data, f32.ctypes.data, n)
        out = np.empty(n // _QK * _Q8_BYTES, np.uint8)
        self.fns["quantize"](Q8_0, f32.ctypes.data, out.ctypes.data, 0, n // _QK, _QK, None)
        return out.tobytes()

    def dequantize_into(self, q8: memoryview, out: np.ndarray, at: int, n: int) -> None:
        src = np.frombuffer(q8, np.uint8, n // _QK * _Q8_BYTES)
        dst = np.frombuffer(out, np.float16, n, at)
        f32 = np.empty(min(n, _CHUNK), np.float32)  # a small buffer, in cache: through it in chunks
        for lo in range(0, n, _CHUNK):
            k = min(_CHUNK, n - lo)
            self.fns["dequantize"](src[lo // _QK * _Q8_BYTES:].ctypes.data, f32.ctypes.data, k)
            self.fns["to_f16"](f32.ctypes.data, dst[lo:].ctypes.data, k)


_lock = threading.Lock()
_impl: list[Any] = []


def _arithmetic() -> _Ggml | _Numpy:
    with _lock:
        if not _impl:
            _impl.append(_load())
        return _impl[0]


def _load() -> _Ggml | _Numpy:
    import llama_cpp.llama_cpp as c

    p, i64 = ctypes.c_void_p, ctypes.c_int64
    # (the CPU backend's fp16 rows are vectorised, the base library's are not: each where exported)
    want = {"to_f32": (("ggml_cpu_fp16_to_fp32", "ggml_fp16_to_fp32_row"), None, [p, p, i64]),
            "to_f16": (("ggml_cpu_fp32_to_fp16", "ggml_fp32_to_fp16_row"), None, [p, p, i64]),
            "quantize": (("ggml_quantize_chunk",), ctypes.c_size_t, [ctypes.c_int, p, p, i64, i64, i64, p]),
            "dequantize": (("dequantize_row_q8_0",), None, [p, p, i64])}
    fns = {}
    for key, (symbols, restype, argtypes) in want.items():
        fn = next((f for f in (getattr(c._lib, name, None) for name in symbols) if f is not None), None)
        if fn is None:
            return _Numpy()
        fn.restype, fn.argtypes = restype, argtypes
        fns[key] = fn
    return _Ggml(fns)


__all__ = ["F16", "Q8_0", "TYPES", "decode", "encodable", "encode", "stored_type"]
