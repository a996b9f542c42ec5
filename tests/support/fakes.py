"""Deterministic fakes of the engine's contract (:mod:`pipeline.engine.contract`), for fast tests.

:class:`HashEmbedder` embeds by feature hashing: every word adds to one of ``dim``
coordinates, so texts sharing words are close and the same text always gives the
same vector. :class:`EchoGenerator` answers by repeating the question, tokenizes by
words, and reports prefill figures the way the engine does: the common prefix with
the previous prompt (up to ``prefix_len``) is reused in memory, a prefix saved by
an earlier prompt or by ``warm`` (in ``saved``, which pipelines may share, as
processes share a cache directory) is "restored from disk". Neither loads a model.
"""

from __future__ import annotations

import re
import time
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from pipeline.engine.contract import EmbedderBase, EngineStats, Generation, GeneratorBase
from pipeline.records import PromptShape

_WORDS = re.compile(r"\w+|[^\w\s]")
_PIECES = re.compile(r"\s+|\w+|[^\w\s]")
_QUESTION = re.compile(r"Question: (.*?)(?:<\|im_end\|>|$)", re.S)


def _token_id(piece: str, vocab: int) -> int:
    return 10 + zlib.crc32(piece.encode("utf-8")) % vocab  # ids below 10 are special


class HashEmbedder(EmbedderBase):
    """Words → hashed coordinates of a ``dim``-dimensional unit vector; ``delay`` seconds per embedding."""

    CLS, SEP = 1, 2

    def __init__(self, dim: int = 64, *, max_tokens: int = 256, delay: float = 0.0):
        self.model_path = Path(f"fake-hash-embedder-{dim}")
        self.dim = dim
        self.max_tokens = max_tokens
        self.identity = f"fake-hash-embedder-{dim}"
        self.delay = delay
        self.embedded = 0  # sequences embedded so far
        self.closed = False

    def tokenize(self, text: str) -> list[int]:
        return [_token_id(w.lower(), 50_000) for w in _WORDS.findall(text)]

    def sequence(self, text: str) -> list[int]:
        return [self.CLS] + self.tokenize(text)[:self.max_tokens] + [self.SEP]

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        out = np.zeros((len(seqs), self.dim), dtype=np.float32)
        for i, seq in enumerate(seqs):
            for tok in seq:
                if tok >= 10:
                    out[i, tok % self.dim] += 1.0 if (tok // self.dim) % 2 else -1.0
            out[i, 0] += 1e-3  # no zero vector, even for an empty text
            if self.delay:
                time.sleep(self.delay)
        self.embedded += len(seqs)
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def close(self) -> None:
        self.closed = True


class EchoGenerator(GeneratorBase):
    """Answers "You asked: <question>" word by word, with the engine's prefix-reuse figures."""

    BOS = 1

    def __init__(self, *, n_ctx: int = 4096, saved: set[tuple[int, ...]] | None = None, min_tokens: int = 16):
        self.n_ctx = n_ctx
        self.delay = 0.0  # seconds per generated word
        self.saved = saved if saved is not None else set()  # prefixes "on disk"
        self.min_tokens = min_tokens
        self.prompts: list[list[int]] = []  # every prompt generated from, in order
        self.closed = False
        self._kv: list[int] = []  # what the "KV cache" holds
        self._pieces: dict[int, str] = {}

    @property
    def bos(self) -> list[int]:
        return [self.BOS]

    namespace = "echo"  # one model, one setting: every prefix state belongs together

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        out = []
        for piece in _PIECES.findall(text):
            tok = _token_id(piece, 100_000)
            self._pieces[tok] = piece
            out.append(tok)
        return out

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(self._pieces.get(t, "") for t in tokens)

    def chat(self, system: str, user: str) -> str:
        return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")

    def _reuse(self, tokens: Sequence[int], cuts: list[int]) -> tuple[int, str]:
        """(tokens reused, where from) as the engine would: memory up to a cut, else the longest saved cut."""
        n = 0
        limit = cuts[-1] if cuts else len(tokens) - 1
        while n < min(limit, len(self._kv)) and self._kv[n] == tokens[n]:
            n += 1
        memory = max((c for c in cuts if c <= n), default=0) if cuts else n
        disk = max((c for c in cuts if c > memory and c >= self.min_tokens and tuple(tokens[:c]) in self.saved),
                   default=0)
        if disk:
            return disk, "disk"
        return memory, "memory" if memory else "none"

    def reusable(self, prompt) -> int:
        shape = PromptShape.coerce(prompt)
        return self._reuse(list(shape.tokens), list(shape.cuts))[0]

    def generate(self, prompt, *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress=None, cancel=None) -> Generation:
        from pipeline.errors import EngineError

        shape = PromptShape.coerce(prompt)
        tokens, cuts, prefix_len = shape.tokens, list(shape.cuts), shape.prefix_len
        if len(tokens) + 1 > self.n_ctx:
            raise EngineError(f"the prompt has {len(tokens):,} tokens; the context holds {self.n_ctx:,}")
        tokens = list(tokens)
        self.prompts.append(tokens)
        stats = stats or EngineStats()
        stats.prompt_tokens = len(tokens)
        reused, where = self._reuse(tokens, cuts)
        stats.cache = where
        if cuts and cuts[-1] >= self.min_tokens and reused < cuts[-1]:
            stats.cache = where if where == "disk" else "miss"
            for c in cuts:
                if c > reused and c >= self.min_tokens and tuple(tokens[:c]) not in self.saved:
                    self.saved.add(tuple(tokens[:c]))
                    stats.states_saved += 1
        self._kv = tokens[:]
        stats.cached_tokens = reused
        stats.prefill_tokens = len(tokens) - reused
        stats.prefill_seconds = stats.ttft_seconds = 1e-5 * stats.prefill_tokens
        stats.prefill_tokens_per_second = 1e5
        found = _QUESTION.search(self.detokenize(tokens[prefix_len:]))
        words = ["You", " asked:"] + [" " + w for w in (found.group(1) if found else "").split()]
        if progress is not None:
            progress(0, stats.prefill_tokens)
            progress(stats.prefill_tokens, stats.prefill_tokens)
        return Generation(self._stream(words[:max_tokens], stats, cancel), stats)

    def _stream(self, words: list[str], stats: EngineStats, cancel=None) -> Iterator[str]:
        from pipeline.errors import Cancelled

        for word in words:
            if cancel is not None and cancel.cancelled:
                raise Cancelled("cancelled while generating")
            if self.delay:
                time.sleep(self.delay)
            stats.decode_tokens += 1
            yield word

    def warm(self, prompt: PromptShape) -> bool:
        key = tuple(prompt.prefix)
        if len(key) < self.min_tokens or key in self.saved:
            return False
        for cut in prompt.cuts:
            if self.min_tokens <= cut < len(key):
                self.saved.add(key[:cut])
        self.saved.add(key)
        self._kv = list(key)
        return True

    def close(self) -> None:
        self.closed = True
        self._kv = []
