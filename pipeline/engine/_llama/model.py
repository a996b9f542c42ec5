"""One model loaded in llama.cpp with its context: facts, timing counters, closing.

What a :class:`Model` does is split by concept: tokens and text (:mod:`.tokens`),
decoding and sampling (:mod:`.decode`), sequence memory and state (:mod:`.memory`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import llama_cpp

from .decode import AbortFlag, Decoding
from .memory import SequenceMemory
from .overrides import TensorOverrides
from .tokens import Vocabulary


@dataclass(frozen=True)
class Timings:
    """llama.cpp's own performance counters since the last :meth:`Model.reset_timings`."""

    prompt_ms: float  # prompt (prefill) evaluation
    prompt_tokens: int
    eval_ms: float  # one-token decodes
    eval_tokens: int


_models: weakref.WeakSet[Model] = weakref.WeakSet()


def open_models() -> list[Model]:
    """The models loaded and not closed yet (tests check that they close what they open)."""
    return [m for m in list(_models) if m.is_open]


class Model(Vocabulary, Decoding, SequenceMemory):
    """One model loaded in llama.cpp, with one context and one batch of ``n_batch`` slots.

    Made by :func:`load`. Like the llama.cpp context it wraps, it is not safe to use
    from two threads at once. Prompts use sequence 0 (several prompts sharing a prefix: sequences
    ``0..n_seq_max-1``, see :meth:`decode_sequences`); embeddings use sequences
    ``0..n`` of one batch.
    """

    def __init__(self, llm: llama_cpp.Llama, overrides: TensorOverrides):
        self._llm = llm
        self._overrides = overrides  # the C array the loader read: kept alive with the model
        self._ctx = llm._ctx.ctx
        self._model = llm._model.model
        self._batch = llm._batch
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_batch = int(llm.n_batch)
        self._views: tuple | None = None
        self._abort: AbortFlag | None = None
        _models.add(self)

    # -- facts ----------------------------------------------------------------------------------

    @property
    def n_ctx(self) -> int:
        return int(llama_cpp.llama_n_ctx(self._ctx))

    @property
    def n_ubatch(self) -> int:
        return int(self._llm.context_params.n_ubatch)

    @property
    def n_seq_max(self) -> int:
        return int(self._llm.context_params.n_seq_max)

    @property
    def n_ctx_train(self) -> int:
        return int(llama_cpp.llama_model_n_ctx_train(self._model))

    @property
    def n_embd(self) -> int:
        return int(llama_cpp.llama_model_n_embd(self._model))

    @property
    def n_vocab(self) -> int:
        return int(llama_cpp.llama_vocab_n_tokens(self._vocab))

    @property
    def context_params(self) -> Any:
        """The ``llama_context_params`` the context was made with (read it, do not change it)."""
        return self._llm.context_params

    @property
    def can_trim(self) -> bool:
        """Whether the memory can be cut at any position (false for recurrent and hybrid models)."""
        return not (llama_cpp.llama_model_is_recurrent(self._model) or llama_cpp.llama_model_is_hybrid(self._model))
    # -- timings ----------------------------------------------------------------------------------

    def synchronize(self) -> None:
        """Wait for pending work: llama.cpp books a decode's time when it is synchronised."""
        llama_cpp.llama_synchronize(self._ctx)

    def reset_timings(self) -> None:
        llama_cpp.llama_perf_context_reset(self._ctx)

    def timings(self) -> Timings:
        perf = llama_cpp.llama_perf_context(self._ctx)
        return Timings(prompt_ms=perf.t_p_eval_ms, prompt_tokens=perf.n_p_eval, eval_ms=perf.t_eval_ms,
                       eval_tokens=perf.n_eval)

    @property
    def is_open(self) -> bool:
        return self._llm is not None

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            self._views = None
            llm.close()

