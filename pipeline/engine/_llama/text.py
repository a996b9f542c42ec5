"""Tokens and text: tokenize, detokenize, token pieces, the special tokens a prompt needs."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp

from ...errors import EngineError


class Vocabulary:
    """The vocabulary half of a :class:`~.model.Model` (its ``_vocab`` handle)."""

    _vocab: Any

    @property
    def bos(self) -> list[int]:
        """The BOS token if the model wants one at the start of a prompt."""
        tok = llama_cpp.llama_vocab_bos(self._vocab)
        return [tok] if llama_cpp.llama_vocab_get_add_bos(self._vocab) and tok >= 0 else []

    @property
    def bos_text(self) -> str:
        tok = llama_cpp.llama_vocab_bos(self._vocab)
        return self.token_text(tok) if tok >= 0 else ""

    @property
    def eos_text(self) -> str:
        tok = llama_cpp.llama_vocab_eos(self._vocab)
        return self.token_text(tok) if tok >= 0 else ""

    def token_text(self, token: int) -> str:
        return llama_cpp.llama_vocab_get_text(self._vocab, token).decode("utf-8")

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes ``tokens`` stand for (control tokens as their text)."""
        return b"".join(self.piece(t, special=True) for t in tokens)

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        """Tokens of ``text``; ``special``: markup such as ``<|im_start|>`` becomes its control token."""
        data = text.encode("utf-8")
        capacity = len(data) + 8  # about one token per byte at most: one call almost always suffices
        out = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), out, capacity, add_bos, special)
        if n < 0:
            capacity = -n
            out = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), out, capacity, add_bos, special)
            if n < 0:
                raise EngineError(f"llama.cpp could not tokenize a text of {len(data):,} bytes")
        return out[:n]

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes ``token`` stands for (control tokens: nothing, or their text with ``special``)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends the generation (EOS, EOT...)."""
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

