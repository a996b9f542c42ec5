"""Chunks → unit vectors, through llama.cpp.

How chunks are grouped per decode follows the hardware. On a CPU an encoder's
attention spans the whole micro-batch, so packing many chunks into one decode
costs more than it saves: one chunk per decode with flash attention was the
fastest grouping measured here (see ``benchmarks/ingest.py``). On a GPU the
per-decode overhead dominates and packing chunks up to a large micro-batch wins.
``embed.batch_tokens`` overrides the choice.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np  # light (~0.1 s); llama_cpp loads only with the model

from .contract import EmbedderBase
from .host import usable_cpus
from .once import once
from ..errors import EngineError, ModelError

# Tokens per decode when chunks are packed on a GPU.
GPU_GROUP_TOKENS = 4096


def default_threads() -> int:
    """Every usable core but one, which the ingest's loader thread needs.

    ggml's threads synchronise at a barrier after every operation; with more
    runnable threads than cores, each barrier waits for a scheduler slice and a
    decode was seen to slow down 10-50×. One core less costs far less than that.
    """
    return max(1, usable_cpus() - 1)


class Embedder(EmbedderBase):
    """A BERT-style embedding model in llama.cpp. The model loads on first use."""

    def __init__(self, model_path: Path, *, threads: int = 0, flash_attn: bool = True,
                 gpu_layers: int = 0, batch_tokens: int = 0):
        self.model_path = Path(model_path)
        self.threads = min(threads, usable_cpus()) if threads else default_threads()  # see default_threads
        self.flash_attn = flash_attn
        self.gpu_layers = gpu_layers
        self._batch_tokens = batch_tokens
        self._lock = threading.Lock()  # one decode at a time
        self._users = threading.Condition()  # guards _in_use, which close() waits on
        self._in_use: dict[int, int] = {}  # id(model) -> calls using it now

    @cached_property
    def gpu(self) -> bool:
        from ._llama import supports_gpu_offload

        return self.gpu_layers != 0 and supports_gpu_offload()

    @cached_property
    def group_tokens(self) -> int:
        """Tokens packed per decode; 0 means one chunk per decode."""
        if self._batch_tokens:
            return self._batch_tokens
        return GPU_GROUP_TOKENS if self.gpu else 0

    @once  # two threads' first calls must not load it twice
    def llm(self):
        """The model in llama.cpp (a :class:`._llama.Model`), loaded on first use."""
        from ._llama import ModelLoadError, load

        # An encoder must see each batch in one micro-batch: n_ubatch = n_batch, and no input
        # longer than that is ever sent (see max_tokens). n_ctx 0 = the trained length.
        window = self.group_tokens or 512
        try:
            return load(self.model_path, embedding=True, pooling=self.pooling, n_ctx=0, n_batch=window,
                        n_ubatch=window, threads=self.threads, threads_batch=self.threads,
                        flash_attn=self.flash_attn, gpu_layers=self.gpu_layers)
        except ModelLoadError as exc:
            raise ModelError(f"llama.cpp could not load the embedder {self.model_path}: {exc.reason}") from None

    @cached_property
    def pooling(self) -> str:
        """The model's own pooling ("": llama.cpp reads it) when its GGUF names one (bge pools the
        [CLS] token, Qwen3-Embedding the last one), else mean pooling."""
        from .gguf.header import read_header

        try:
            named = read_header(self.model_path, tensors=False).get("pooling_type") is not None
        except (ModelError, OSError):
            named = False
        return "" if named else "mean"

    @cached_property
    def dim(self) -> int:
        return self.llm.n_embd

    @cached_property
    def max_tokens(self) -> int:
        """The longest text, in tokens without the [CLS]/[SEP] pair, that one embedding covers."""
        llm = self.llm
        return min(llm.n_ctx_train, llm.n_ubatch) - 2

    @contextmanager
    def _borrowed(self) -> Iterator:
        """The loaded model, held for one call: :meth:`close` frees it only once no call uses it."""
        llm = self.llm
        with self._users:
            if self.__dict__.get("llm") is not llm:  # closed between the two lines: load again
                llm = None
            else:
                self._in_use[id(llm)] = self._in_use.get(id(llm), 0) + 1
        if llm is None:
            with self._borrowed() as llm:
                yield llm
            return
        try:
            yield llm
        finally:
            with self._users:
                self._in_use[id(llm)] -= 1
                if not self._in_use[id(llm)]:
                    del self._in_use[id(llm)]
                    self._users.notify_all()

    def tokenize(self, text: str) -> list[int]:
        """Content tokens of ``text`` (no special tokens): what chunk sizes are measured in."""
        with self._borrowed() as llm:
            return llm.tokenize(text, add_bos=False, special=False)

    def sequence(self, text: str) -> list[int]:
        """The tokens of one embedding input: [CLS] ``text`` [SEP], cut to :attr:`max_tokens` in between."""
        with self._borrowed() as llm:
            tokens = llm.tokenize(text, add_bos=True, special=False)
        limit = self.max_tokens + 2
        if len(tokens) > limit:  # the encoder would abort the process, not raise
            tokens = tokens[: limit - 1] + tokens[-1:]
        return tokens

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        group_limit = self.group_tokens
        with self._lock, self._borrowed() as llm:
            n_seq_max = llm.n_seq_max
            start = 0
            while start < len(seqs):
                end, used = start + 1, len(seqs[start])
                if group_limit:
                    while (end < len(seqs) and end - start < n_seq_max
                           and used + len(seqs[end]) <= group_limit):
                        used += len(seqs[end])
                        end += 1
                try:
                    out[start:end] = llm.embed_sequences(seqs[start:end])
                except EngineError as exc:
                    raise EngineError(f"llama.cpp failed to embed a batch: {exc}") from None
                start = end
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)

    @cached_property
    def identity(self) -> str:
        from ..models import file_identity

        return file_identity(self.model_path)

    def close(self) -> None:
        """Free the model once the calls using it have finished (a later call loads it again)."""
        with self._users:
            llm = self.__dict__.pop("llm", None)
            while llm is not None and self._in_use.get(id(llm)):
                self._users.wait()
        if llm is not None:
            llm.close()

