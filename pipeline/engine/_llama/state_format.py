"""Reading llama.cpp's serialised sequence state: which cells it holds, at which positions, and their keys and values.

A state from ``llama_state_seq_get_data`` (or a sequence state file past its token list)
is, for this llama.cpp build: a magic and a version (two uint32), then for each memory
(one, or two for models with sliding-window layers: the full-attention cache, then the
window cache) ``n_stream`` and, per stream, the cell count, each cell's position and
sequence ids, the V-transposed flag, the layer count, every layer's keys (type, row size,
rows) and every layer's values (rows, or for a transposed V one column per embedding
element). Nothing here imports llama.cpp.

What it is used for: counting the KV cells a prompt occupies, checking that a saved
section state holds the positions it claims before llama.cpp reads it, measuring
how far each token's keys and values in a composed prompt are from exact prefill's, and
finding every layer's keys and values where a state is stored in another type
(:func:`blocks`, :mod:`.state_codec`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

_TYPES = {0: np.float32, 1: np.float16}  # ggml types this reader can turn into numbers (f32, f16)


class StateFormatError(ValueError):
    """The bytes are not a state this reader understands (truncated, or another format)."""


@dataclass
class LayerKV:
    """One layer's keys and values of every cell, as stored: ``k``/``v`` are (cells, width) arrays
    when their type is f32 or f16, None otherwise (quantised caches)."""

    k: np.ndarray | None
    v: np.ndarray | None


@dataclass
class Stream:
    positions: np.ndarray  # int32, one per cell, in cell order
    layers: list[LayerKV] = field(default_factory=list)


def _rows(data: memoryview, off: int, ggml_type: int, n_rows: int, row_bytes: int) -> tuple[np.ndarray | None, int]:
    end = off + n_rows * row_bytes
    if end > len(data):
        raise StateFormatError("truncated state")
    dtype = _TYPES.get(ggml_type)
    if dtype is None or n_rows == 0:
        return None, end
    width = row_bytes // np.dtype(dtype).itemsize
    return np.frombuffer(data[off:end], dtype=dtype).reshape(n_rows, width), end


def parse(data: bytes | memoryview, *, values: bool = True) -> list[list[Stream]]:
    """The memories of a state, each a list of streams (see the module notes); ``values`` False
    reads positions only (cheap)."""
    view = memoryview(data)
    if len(view) < 12:
        raise StateFormatError("a state of fewer than 12 bytes")
    off, memories = 8, []
    try:
        while off < len(view):
            (n_stream,), off = struct.unpack_from("<I", view, off), off + 4
            streams = []
            for _ in range(n_stream):
                stream, off = _stream(view, off, values)
                streams.append(stream)
            memories.append(streams)
    except struct.error as exc:
        raise StateFormatError(f"truncated state ({exc})") from None
    return memories


def _stream(view: memoryview, off: int, values: bool) -> tuple[Stream, int]:
    (cells,), off = struct.unpack_from("<I", view, off), off + 4
    positions = np.empty(cells, dtype=np.int32)
    for i in range(cells):
        pos, n_seq = struct.unpack_from("<iI", view, off)
        positions[i] = pos
        off += 8 + 4 * n_seq
    stream = Stream(positions)
    if cells == 0:
        return stream, off
    v_trans, n_layer = struct.unpack_from("<II", view, off)
    off += 8
    keys = []
    for _ in range(n_layer):
        k_type, row = struct.unpack_from("<iQ", view, off)
        k, off = _rows(view, off + 12, k_type if values else -1, cells, row)
        keys.append(k)
    for il in range(n_layer):
        if not v_trans:
            v_type, row = struct.unpack_from("<iQ", view, off)
            v, off = _rows(view, off + 12, v_type if values else -1, cells, row)
        else:
            v_type, el, width = struct.unpack_from("<iII", view, off)
            v, off = _rows(view, off + 12, v_type if values else -1, width, el * cells)
            v = None if v is None else v.reshape(width, cells).T
        stream.layers.append(LayerKV(keys[il], v))
    return stream, off


@dataclass(frozen=True)
class Block:
    """One layer's keys or values in a state: its header at ``at`` (type, then row size, or for a
    transposed V element size and width), ``rows`` rows of ``row_bytes`` from ``data_at``."""

    at: int
    type: int
    row_bytes: int
    rows: int
    data_at: int
    transposed: bool = False

    @property
    def end(self) -> int:
        return self.data_at + self.rows * self.row_bytes


def skip_cells(view: memoryview, off: int, n_cells: int) -> int:
    """Where the ``n_cells`` cells' positions and sequences that begin at ``off`` end."""
    if n_cells and off + 12 * n_cells <= len(view):  # one sequence per cell, the usual case: 12 bytes each
        seqs = np.frombuffer(view, np.int32, 3 * n_cells, off)[1::3]
        if (seqs == 1).all():
            return off + 12 * n_cells
    for _ in range(n_cells):
        off += 8 + 4 * struct.unpack_from("<iI", view, off)[1]
    return off


def blocks(data: bytes | memoryview, *, start: int = 8) -> list[Block]:
    """Every layer's keys and values in the state (every memory and stream), in the order stored;
    ``start`` is where its memories begin (0 in a state file past its token list)."""
    view = memoryview(data)
    if len(view) < start + 4:
        raise StateFormatError(f"a state of fewer than {start + 4} bytes")
    off, out = start, []
    try:
        while off < len(view):
            (n_stream,), off = struct.unpack_from("<I", view, off), off + 4
            for _ in range(n_stream):
                (n_cells,), off = struct.unpack_from("<I", view, off), off + 4
                off = skip_cells(view, off, n_cells)
                if n_cells == 0:
                    continue
                v_trans, n_layer = struct.unpack_from("<II", view, off)
                off += 8
                for i in range(2 * n_layer):
                    if i >= n_layer and v_trans:
                        v_type, el, width = struct.unpack_from("<iII", view, off)
                        out.append(Block(off, v_type, el * n_cells, width, off + 12, True))
                    else:
                        k_type, row = struct.unpack_from("<iQ", view, off)
                        out.append(Block(off, k_type, row, n_cells, off + 12))
                    off = out[-1].end
                    if off > len(view):
                        raise StateFormatError("truncated state")
    except struct.error as exc:
        raise StateFormatError(f"truncated state ({exc})") from None
    return out


def cells(data: bytes | memoryview) -> int:
    """Cells held by the state's first memory (a model with two memories keeps the same cells in both)."""
    memories = parse(data, values=False)
    return sum(len(s.positions) for s in memories[0]) if memories else 0


def positions(data: bytes | memoryview) -> np.ndarray:
    """The positions of the first memory's cells, in cell order."""
    memories = parse(data, values=False)
    return np.concatenate([s.positions for s in memories[0]]) if memories and memories[0] else np.empty(0, np.int32)


def deviation(exact: bytes, approx: bytes) -> dict[int, float]:
    """Position -> how far ``approx``'s keys and values are from ``exact``'s for that position:
    the mean over layers (every memory) of ``|dK|/|K| + |dV|/|V|``. Positions held by only one
    of them are left out; quantised layers do not count."""
    out: dict[int, list[float]] = {}
    for mem_e, mem_a in zip(parse(exact), parse(approx)):
        for se, sa in zip(mem_e, mem_a):
            ie = {int(p): i for i, p in enumerate(se.positions)}
            pairs = [(ie[int(p)], j) for j, p in enumerate(sa.positions) if int(p) in ie]
            if not pairs:
                continue
            rows_e = np.array([a for a, _ in pairs])
            rows_a = np.array([b for _, b in pairs])
            pos = [int(se.positions[a]) for a in rows_e]
            for le, la in zip(se.layers, sa.layers):
                for xe, xa in ((le.k, la.k), (le.v, la.v)):
                    if xe is None or xa is None:
                        continue
                    e = xe[rows_e].astype(np.float32)
                    a = xa[rows_a].astype(np.float32)
                    rel = np.linalg.norm(e - a, axis=1) / np.maximum(np.linalg.norm(e, axis=1), 1e-6)
                    for p, d in zip(pos, rel):
                        out.setdefault(p, []).append(float(d))
    return {p: 2 * float(np.mean(d)) for p, d in out.items()}


def layer_deviation(exact: bytes, approx: bytes, at: range | list[int]) -> list[tuple[float, float]]:
    """Per layer of the first memory, ``(|dK|/|K|, |dV|/|V|)`` over the cells at positions ``at``
    (held by both states): where in the network two states part."""
    (se, *_), (sa, *_) = parse(exact)[0], parse(approx)[0]
    ie = {int(p): i for i, p in enumerate(se.positions)}
    ia = {int(p): i for i, p in enumerate(sa.positions)}
    rows_e = [ie[p] for p in at]
    rows_a = [ia[p] for p in at]
    out = []
    for le, la in zip(se.layers, sa.layers):
        pair = []
        for xe, xa in ((le.k, la.k), (le.v, la.v)):
            e, a = xe[rows_e].astype(np.float32), xa[rows_a].astype(np.float32)
            pair.append(float(np.linalg.norm(e - a) / max(float(np.linalg.norm(e)), 1e-6)))
        out.append((pair[0], pair[1]))
    return out
