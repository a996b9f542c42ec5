"""Sequence memory and state: clear, cut, copy between sequences, end position; state size, files."""

from __future__ import annotations

import array
import ctypes
import os
import struct
from collections.abc import Sequence
from typing import Any

import llama_cpp


#: Bytes a buffer state (``llama_state_seq_get_data``) holds before what a state file holds after its
#: token list: llama.cpp's magic and the sequence's id.
_DATA_HEADER = 8


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

    def save_state(self, path: str | os.PathLike[str], tokens: Sequence[int], *, seq: int = 0,
                   stored: str = "") -> bool:
        """Write ``seq``'s state and ``tokens`` (what it holds) to ``path``; False if llama.cpp failed,
        with :attr:`last_save_error` saying why (llama.cpp's error line is kept off stderr: the caller
        reports the failure in its own words). ``stored`` ``"q8_0"`` writes f16 keys and values as q8_0
        (:mod:`.state_codec`; a state that cannot be is written as it is); raises :class:`OSError`
        where that file cannot be written."""
        from .log import LOG_ERROR, LlamaLog

        if stored and stored != "f16" and self._save_encoded(path, tokens, seq, stored):
            return True
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        with LlamaLog(chain=False) as log:
            ok = bool(llama_cpp.llama_state_seq_save_file(self._ctx, os.fsencode(path), seq, arr, len(tokens)))
        errors = " ".join(r.text.strip() for r in log.records if r.level == LOG_ERROR and r.text.strip())
        self.last_save_error = "" if ok else (errors.split(": ", 1)[-1] if errors else "llama.cpp gave no reason")
        if ok or not errors:
            log.pass_on()
        return ok

    def _save_encoded(self, path: str | os.PathLike[str], tokens: Sequence[int], seq: int, stored: str) -> bool:
        """Write ``seq``'s state as a sequence-state file whose layers are ``stored`` (see
        :meth:`save_state`); False (nothing written) where the state cannot be encoded."""
        from . import state_codec

        if state_codec.TYPES.get(stored) != state_codec.Q8_0:
            raise ValueError(f"cannot store states as {stored!r}")
        data = self.state_data(seq)
        if not data or not state_codec.encodable(data):
            return False
        with open(path, "wb") as f:
            f.write(struct.pack("<III", llama_cpp.LLAMA_STATE_SEQ_MAGIC, llama_cpp.LLAMA_STATE_SEQ_VERSION,
                                len(tokens)))
            f.write(array.array("i", tokens).tobytes())
            state_codec.encode(data, f.write, skip=_DATA_HEADER)  # the file holds no buffer header
        self.last_save_error = ""
        return True

    def load_state(self, path: str | os.PathLike[str], *, capacity: int, seq: int = 0) -> list[int] | None:
        """Restore ``seq`` from ``path``: the tokens it holds (at most ``capacity``), None if llama.cpp failed.
        A state stored in another KV type than this context's (:meth:`save_state`'s ``stored``) is turned
        back into this context's type first."""
        stored = self._stored_type(path, capacity)
        if stored is not None and stored != int(self.context_params.type_k):
            return self._load_encoded(path, capacity, seq)
        out = (llama_cpp.llama_token * capacity)()
        n_out = ctypes.c_size_t(0)
        if not llama_cpp.llama_state_seq_load_file(self._ctx, os.fsencode(path), seq, out, capacity,
                                                   ctypes.byref(n_out)):
            return None
        return out[:n_out.value]

    @staticmethod
    def _stored_type(path: str | os.PathLike[str], capacity: int) -> int | None:
        """The KV type of the state file at ``path`` (its first layer's keys), reading only its head;
        None where that cannot be told (llama.cpp's loader then judges the file)."""
        from .state_codec import stored_type
        from .state_format import StateFormatError

        try:
            with open(path, "rb") as f:
                head = f.read(12)
                if len(head) < 12:
                    return None
                n = struct.unpack_from("<I", head, 8)[0]
                if n > capacity:
                    return None
                f.seek(4 * n, os.SEEK_CUR)
                body = f.read(16 * n + 64)
            return stored_type(memoryview(bytes(_DATA_HEADER) + body))
        except (OSError, StateFormatError):
            return None

    def _load_encoded(self, path: str | os.PathLike[str], capacity: int, seq: int) -> list[int] | None:
        """Restore ``seq`` from a state file :meth:`save_state` encoded; None where it cannot be."""
        from . import state_codec

        try:
            with open(path, "rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(data) != len(data):
                    return None
            magic, version, n = struct.unpack_from("<III", data, 0)
            if magic != llama_cpp.LLAMA_STATE_SEQ_MAGIC or version != llama_cpp.LLAMA_STATE_SEQ_VERSION or n > capacity:
                return None
            tokens = array.array("i", data[12:12 + 4 * n]).tolist()
            self.trim(0, seq=seq)  # (restoring replaces the sequence's cells anyway)
            # a buffer state starts with llama.cpp's own header for the sequence: the empty sequence's
            head = bytes(self.state_data(seq)[:_DATA_HEADER])
            state = state_codec.decode(memoryview(data)[12 + 4 * n:], start=0, prefix=head)
        except (OSError, struct.error, ValueError):  # (StateFormatError is a ValueError)
            return None
        if not self.set_state_data(state, seq=seq):
            return None
        return tokens

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

    def set_state_data(self, data: bytearray | Any, *, seq: int = 0) -> bool:
        """Replace ``seq``'s state by ``data`` (from :meth:`state_data`, or any writable buffer of bytes,
        read in place); False if llama.cpp refused it."""
        if len(data) == 0:
            return False
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        return int(llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(data), seq)) > 0
