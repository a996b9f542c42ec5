"""The memory API for prompts composed from section states (:mod:`pipeline.engine.reuse.compose`).

A state restored into a scratch sequence is moved to its place with
``llama_memory_seq_add`` (llama.cpp re-rotates the RoPE keys at the next decode), joined
to the prompt's sequence with ``llama_memory_seq_cp`` (in the unified KV cache the cells
are shared, not copied) and recomputed where it joins what precedes it: positions
shifted, ranges of cells removed, states as bytes, decodes into any sequence with the
logits of every token, the cells in use.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp

from ...errors import EngineError
from .model import Model


def can_shift(model: Model) -> bool:
    """Whether a sequence's cells can be moved to other positions and keep their meaning:
    attention-only models (with every cell of sliding-window layers kept, ``swa_full``).
    Not recurrent or hybrid ones: llama.cpp's ``llama_memory_can_shift`` says true for a
    recurrent memory (renumbering its one state is trivial), but a recurrent state cannot
    be cut into sections, so it cannot be composed."""
    if not model.can_trim:
        return False
    return bool(llama_cpp.llama_memory_can_shift(llama_cpp.llama_get_memory(model._ctx)))


def sliding_window(model: Model) -> int:
    """The attention window of the model's sliding-window layers (Gemma 3: 512), 0 when it has none."""
    return int(llama_cpp.llama_model_n_swa(model._model))


def seq_remove(model: Model, seq: int, p0: int = 0, p1: int = -1) -> bool:
    """Drop the cells of ``seq`` at positions ``[p0, p1)`` (``p1`` -1: to the end; ``seq`` -1:
    every sequence). Removing a whole sequence never fails; False where a part cannot be cut."""
    return bool(llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(model._ctx), seq, p0, p1))


def seq_shift(model: Model, seq: int, p0: int, p1: int, delta: int) -> None:
    """Add ``delta`` to the positions of ``seq``'s cells at ``[p0, p1)``; keys are re-rotated
    before the next decode. Only where :func:`can_shift`."""
    llama_cpp.llama_memory_seq_add(llama_cpp.llama_get_memory(model._ctx), seq, p0, p1, delta)


def seq_start(model: Model, seq: int = 0) -> int:
    """The first position ``seq`` holds, -1 when it is empty."""
    return int(llama_cpp.llama_memory_seq_pos_min(llama_cpp.llama_get_memory(model._ctx), seq))


def state_bytes(model: Model, seq: int) -> bytes:
    """``seq``'s state (its cells' positions, keys and values) as llama.cpp serialises it;
    ``seq`` -1: every cell of the memory."""
    n = int(llama_cpp.llama_state_seq_get_size(model._ctx, seq))
    buf = (ctypes.c_uint8 * n)()
    written = int(llama_cpp.llama_state_seq_get_data(model._ctx, buf, n, seq))
    if written != n:
        raise EngineError(f"llama.cpp wrote {written:,} of {n:,} bytes of sequence {seq}'s state")
    return bytes(buf)


def restore_state_bytes(model: Model, data: bytes, seq: int) -> bool:
    """Replace ``seq``'s cells with a state from :func:`state_bytes` (at the positions it was
    saved at); False (and ``seq`` emptied) if llama.cpp refused it."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    if int(llama_cpp.llama_state_seq_set_data(model._ctx, buf, len(data), seq)) != len(data):
        seq_remove(model, seq)
        return False
    return True


def decode_outputs(model: Model, tokens: Sequence[int], pos: int, *, seq: int = 0, every: bool = False) -> None:
    """Decode ``tokens`` (at most ``n_batch``) at positions ``pos..`` of ``seq``, with logits for
    every token (``every``, read them with :func:`output_logits`) or for the last only."""
    tok, positions, logits, ramp = model._arrays()
    raw = model._batch.batch
    n = len(tokens)
    tok[:n] = tokens
    positions[:n] = ramp[:n] + pos
    logits[:n] = 1 if every else 0
    logits[n - 1] = 1
    for i in range(n):
        raw.seq_id[i][0] = seq
    raw.n_tokens = n
    try:
        model._decode()
    finally:
        for i in range(n):
            raw.seq_id[i][0] = 0


def output_logits(model: Model, rows: int) -> Any:
    """The logits of the last decode's first ``rows`` outputs, a float32 array (rows, n_vocab)."""
    import numpy as np

    ptr = llama_cpp.llama_get_logits(model._ctx)
    return np.ctypeslib.as_array(ptr, shape=(rows, model.n_vocab)).copy()


def last_logits(model: Model) -> Any:
    """The logits of the last decode's last output, a float32 array (n_vocab,): what the next token is
    sampled from."""
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(model._ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(model.n_vocab,)).copy()


def memory_cells(model: Model) -> int:
    """KV cells in use, over every sequence (a cell shared by several counts once): what a
    composed prompt is measured by against its own length."""
    from .state_format import cells

    return cells(state_bytes(model, -1))
