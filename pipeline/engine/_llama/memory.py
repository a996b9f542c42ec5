"""Sequence memory and state: clear, cut, copy between sequences, end position; state size, files."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

import llama_cpp


class SequenceMemory:
    """The memory half of a :class:`~.model.Model`: its sequences' KV cells (or recurrent state)."""

    _ctx: Any

    def seq_copy(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Give sequence ``dst`` the cells of ``src`` at positions ``[p0, p1)`` (``p1`` -1: to the end).
        In a unified KV cache the cells are shared, not copied: no memory and no compute."""
        llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(self._ctx), src, dst, p0, p1)

    def clear(self) -> None:
        """Empty the memory (every sequence)."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)

    def trim(self, n: int, *, seq: int = 0) -> bool:
        """Drop positions ``n..`` of ``seq`` (``n`` 0: all of it); False where the memory cannot be cut there."""
        return bool(llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx), seq, n, -1))

    def seq_end(self, seq: int = 0) -> int:
        """The last position ``seq`` holds, -1 when it is empty."""
        return int(llama_cpp.llama_memory_seq_pos_max(llama_cpp.llama_get_memory(self._ctx), seq))

    def state_size(self, seq: int = 0) -> int:
        """Bytes of ``seq``'s state (its KV cells or recurrent state), framing excluded."""
        return int(llama_cpp.llama_state_seq_get_size(self._ctx, seq))

    #: Why the last :meth:`save_state` failed, in llama.cpp's words ("write error: No space left on
    #: device"); "" after a save that worked.
    last_save_error: str = ""

    def save_state(self, path: str | os.PathLike[str], tokens: Sequence[int], *, seq: int = 0) -> bool:
        """Write ``seq``'s state and ``tokens`` (what it holds) to ``path``; False if llama.cpp failed,
        with :attr:`last_save_error` saying why (llama.cpp's error line is kept off stderr: the caller
        reports the failure in its own words)."""
        from .log import LOG_ERROR, LlamaLog

        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        with LlamaLog(chain=False) as log:
            ok = bool(llama_cpp.llama_state_seq_save_file(self._ctx, os.fsencode(path), seq, arr, len(tokens)))
        errors = " ".join(r.text.strip() for r in log.records if r.level == LOG_ERROR and r.text.strip())
        self.last_save_error = "" if ok else (errors.split(": ", 1)[-1] if errors else "llama.cpp gave no reason")
        if ok or not errors:
            log.pass_on()
        return ok

    def load_state(self, path: str | os.PathLike[str], *, capacity: int, seq: int = 0) -> list[int] | None:
        """Restore ``seq`` from ``path``: the tokens it holds (at most ``capacity``), None if llama.cpp failed."""
        out = (llama_cpp.llama_token * capacity)()
        n_out = ctypes.c_size_t(0)
        if not llama_cpp.llama_state_seq_load_file(self._ctx, os.fsencode(path), seq, out, capacity,
                                                   ctypes.byref(n_out)):
            return None
        return out[:n_out.value]


    def state_data(self, seq: int = 0) -> bytearray:
        """``seq``'s state as llama.cpp serialises it (``llama_state_seq_get_data``), for a copy kept in
        memory (one buffer, written in place); empty if llama.cpp failed."""
        size = int(llama_cpp.llama_state_seq_get_size(self._ctx, seq))
        data = bytearray(max(size, 0))
        if size <= 0:
            return data
        n = int(llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, seq))
        del data[max(n, 0):]
        return data

    def set_state_data(self, data: bytearray, *, seq: int = 0) -> bool:
        """Replace ``seq``'s state by ``data`` (from :meth:`state_data`, read in place); False if llama.cpp
        refused it."""
        if not data:
            return False
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return int(llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(data), seq)) > 0
