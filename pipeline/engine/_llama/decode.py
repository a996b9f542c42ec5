"""Decoding and sampling: prompt slices, one token, one token for each of several sequences,
whole sequences for embeddings; the sampler chain; the abort flag that stops a running decode."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp

from ...errors import EngineError


class Decoding:
    """The decoding half of a :class:`~.model.Model`: its context, its one batch of ``n_batch`` slots."""

    _ctx: Any
    _batch: Any
    _views: tuple | None
    _abort: AbortFlag | None
    n_batch: int
    n_embd: int
    n_vocab: int

    def _arrays(self) -> tuple:
        """NumPy views of the batch's token, position and logits arrays, every slot in sequence 0."""
        if self._views is None:
            import numpy as np

            raw, n = self._batch.batch, self.n_batch
            for i in range(n):
                raw.n_seq_id[i] = 1
                raw.seq_id[i][0] = 0
            views = tuple(np.ctypeslib.as_array(ptr, shape=(n,)) for ptr in (raw.token, raw.pos, raw.logits))
            self._views = (*views, np.arange(n, dtype=np.int32))
        return self._views

    def _decode(self) -> None:
        rc = llama_cpp.llama_decode(self._ctx, self._batch.batch)
        if rc == 2 and self._abort is not None and self._abort.is_set:
            raise Aborted("the decode was aborted")
        if rc != 0:
            raise EngineError(f"llama_decode returned {rc}")

    def abort_flag(self) -> "AbortFlag":
        """This context's abort flag (made once): set, it stops the running decode within one micro-batch."""
        if self._abort is None:
            self._abort = AbortFlag(self._ctx)
        return self._abort

    def decode(self, tokens: Any, pos: int) -> None:
        """Decode ``tokens`` (an int32 array of at most ``n_batch``) at positions ``pos..`` of
        sequence 0, with logits for the last token only. Raises :class:`EngineError`."""
        tok, positions, logits, ramp = self._arrays()
        n = len(tokens)
        tok[:n] = tokens
        positions[:n] = ramp[:n] + pos
        logits[:n] = 0
        logits[n - 1] = 1
        self._batch.batch.n_tokens = n
        self._decode()

    def decode_token(self, token: int, pos: int) -> None:
        """Decode one token at position ``pos`` of sequence 0, with its logits."""
        tok, positions, logits, _ = self._arrays()
        tok[0], positions[0], logits[0] = token, pos, 1
        self._batch.batch.n_tokens = 1
        self._decode()

    def decode_sequences(self, items: Sequence[tuple[int, int, int]]) -> None:
        """Decode one token for each ``(seq, token, pos)`` in ``items`` in one ``llama_decode``, with
        logits for every one of them: row ``i`` of the result is ``items[i]``'s (see :meth:`Sampler.sample`).
        At most ``n_batch`` items, at most one per sequence, ``seq`` below ``n_seq_max``."""
        tok, positions, logits, _ = self._arrays()
        raw = self._batch.batch
        n = len(items)
        for i, (seq, token, pos) in enumerate(items):
            tok[i], positions[i], logits[i] = token, pos, 1
            raw.seq_id[i][0] = seq
        raw.n_tokens = n
        try:
            self._decode()
        finally:
            for i in range(n):  # every slot back in sequence 0, as the other decodes expect
                raw.seq_id[i][0] = 0

    def decode_seq(self, tokens: Any, pos: int, seq: int) -> None:
        """:meth:`decode` into sequence ``seq``: ``tokens`` at positions ``pos..``, logits for the last."""
        raw = self._batch.batch
        n = len(tokens)
        self._arrays()
        for i in range(n):
            raw.seq_id[i][0] = seq
        try:
            self.decode(tokens, pos)
        finally:
            for i in range(n):
                raw.seq_id[i][0] = 0

    def embed_sequences(self, seqs: Sequence[Sequence[int]]) -> Any:
        """Pooled embeddings (one float32 row per sequence, not normalised) of ``seqs`` decoded as
        sequences ``0..len(seqs)-1`` of one batch, from an empty memory."""
        import numpy as np

        batch = self._batch
        batch.reset()
        for i, tokens in enumerate(seqs):
            batch.add_sequence(list(tokens), i, True)
        self._views = None  # add_sequence rewrote the sequence ids
        mem = llama_cpp.llama_get_memory(self._ctx)
        if mem:  # encoders with non-causal attention may have no memory
            llama_cpp.llama_memory_clear(mem, True)
        self._decode()
        dim = self.n_embd
        rows = np.empty((len(seqs), dim), dtype=np.float32)
        for i in range(len(seqs)):
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx, i)
            rows[i] = np.ctypeslib.as_array(ptr, shape=(dim,))
        return rows

    def sampler(self, *, temperature: float, repeat_penalty: float, seed: int) -> Sampler:
        """A sampler over this context's last logits: greedy at temperature 0, else top-k 40, top-p 0.95."""
        return Sampler(self, temperature=temperature, repeat_penalty=repeat_penalty, seed=seed)



class Aborted(EngineError):
    """A decode stopped by its context's :class:`AbortFlag` (llama.cpp dropped the unfinished micro-batch)."""


class AbortFlag:
    """llama.cpp's abort callback on one context, driven by a flag that is read without the GIL.

    ``llama_set_abort_callback`` makes the CPU backend call ``cb(data)`` between graph
    operations (hundreds per micro-batch), on a ggml worker thread. A Python callback
    would take the GIL each time, so a busy Python thread elsewhere in the process (a
    web server, retrieval) would stall every ggml barrier. The callback is therefore
    libc's ``strlen`` over a two-byte buffer: ``"\\0\\0"`` reads as length 0 (false: go
    on), ``"\\1\\0"`` as 1 (true: abort). The signatures differ only in the return
    width, which the x86-64 and AArch64 ABIs pass in the same register, low byte first.
    An aborted ``llama_decode`` returns 2.
    """

    def __init__(self, ctx) -> None:
        libc = ctypes.CDLL(None)
        self._buf = ctypes.create_string_buffer(2)  # kept alive as long as the context uses it
        self._callback = ctypes.cast(libc.strlen, llama_cpp.ggml_abort_callback)
        llama_cpp.llama_set_abort_callback(ctx, self._callback, ctypes.cast(self._buf, ctypes.c_void_p))

    def set(self) -> None:
        self._buf[0] = 1

    def clear(self) -> None:
        self._buf[0] = 0

    @property
    def is_set(self) -> bool:
        return self._buf.raw[0] == 1


class Sampler:
    """A llama.cpp sampler chain over a :class:`~.model.Model`'s context; :meth:`close` frees it."""

    def __init__(self, model: Decoding, *, temperature: float, repeat_penalty: float, seed: int):
        self._ctx = model._ctx
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if repeat_penalty != 1.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_penalties(
                model.n_vocab, 256, repeat_penalty, 0.0, 0.0))
        if temperature <= 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(40))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(0.95, 1))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
        self._chain = chain

    def sample(self, row: int = -1) -> int:
        """The next token from the logits of output ``row`` of the last decode (-1: its last); the
        sampler accepts it."""
        return int(llama_cpp.llama_sampler_sample(self._chain, self._ctx, row))

    def close(self) -> None:
        chain, self._chain = self._chain, None
        if chain is not None:
            llama_cpp.llama_sampler_free(chain)

