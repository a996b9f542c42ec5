"""Tokens and text: tokenize, detokenize, token pieces, the special tokens a prompt needs."""

from __future__ import annotations

import ctypes
import re
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
        """Tokens of ``text``; ``special``: markup such as ``<|im_start|>`` becomes its control token.
        Without it, markup tokens llama.cpp would parse from any text (gpt-oss's ``<|start|>``...) stay text."""
        if not special and _MARKUP_SPELLING.search(text):  # no text spelled like markup, no markup token in it
            markup = self.__dict__.get("_markup")
            if markup is None:  # the vocabulary is scanned once, for the first text that needs it
                markup = self.__dict__["_markup"] = always_parsed_markup(self._vocab)
            if markup is not False and markup.search(text):
                return tokenize_around(markup, text, lambda piece, bos: self._tokenize(piece, bos, False), add_bos)
        return self._tokenize(text, add_bos, special)

    def _tokenize(self, text: str, add_bos: bool, special: bool) -> list[int]:
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


_MARKUP_SPELLING = re.compile(r"<\|[^|<>\s]{1,48}\|>")


def always_parsed_markup(vocab: Any) -> "re.Pattern[str] | bool":
    """The pattern of this vocabulary's markup tokens that llama.cpp parses from *any* text, or False.

    llama.cpp matches user-defined tokens in text even with special-token parsing off, and
    for gpt-oss it marks harmony's ``<|start|>``, ``<|message|>``, ``<|channel|>`` and
    ``<|constrain|>`` user-defined: without care a document could open a turn. Only
    tokens spelled like markup (``<|name|>``) count; other user-defined tokens (runs of
    spaces, HTML tags in some vocabularies) are ordinary text.
    """
    found = []
    for tok in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_get_attr(vocab, tok) & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED:
            text = llama_cpp.llama_vocab_get_text(vocab, tok).decode("utf-8", errors="replace")
            if _MARKUP_SPELLING.fullmatch(text):
                found.append(text)
    if not found:
        return False
    return re.compile("|".join(re.escape(t) for t in sorted(found, key=len, reverse=True)))


def tokenize_around(markup: "re.Pattern[str]", text: str, tokenize: Any, add_bos: bool) -> list[int]:
    """``text`` tokenised with every ``markup`` spelling kept as ordinary text: the pieces between them
    on their own, and each spelling in two halves (``<|`` and the rest), which no markup token matches."""
    out: list[int] = []
    at = 0
    for m in markup.finditer(text):
        for piece in (text[at:m.start()], m.group(0)[:2], m.group(0)[2:]):
            if piece:
                out += tokenize(piece, add_bos and not out)
        at = m.end()
    if at < len(text):
        out += tokenize(text[at:], add_bos and not out)
    return out
