"""The boundary to llama.cpp: the only module that imports ``llama_cpp``.

llama-cpp-python is layered as raw ctypes bindings (``llama_cpp.llama_cpp``), private
internals (``llama_cpp._internals``) and a public ``Llama`` class. This module is our
private layer over all three; the generator (:mod:`.generator`), the embedder
(:mod:`.embed`), the prefix cache's state files (:mod:`.cache`) and the planner's
measurements use only what it exposes:

* :func:`load` builds a :class:`Model`: one model with one context and one batch,
  from typed settings (KV types and RoPE scaling by name), with tensor buffer-type
  overrides and model params the ``Llama`` constructor has no argument for
  (``use_extra_bufts``, ``no_alloc``, ``no_host``...);
* :class:`Model`: tokenize, decode a prompt slice / one token / one token for each of
  several sequences in one call / whole sequences for embeddings, sample, sequence
  memory (clear, trim, copy, end position), sequence state files (size, save, load),
  llama.cpp's timing counters;
* :class:`TensorOverrides`: the C array of ``llama_model_tensor_buft_override``
  (pattern, buffer type) the loader reads, from :class:`pipeline.engine.offload.Override`;
* :class:`LlamaLog`: capture llama.cpp's log (every level, debug included) while
  keeping whatever logging was in place before;
* :func:`supports_gpu_offload`, :func:`binding_version`.

No other module touches llama-cpp-python's private attributes (``_ctx``, ``_model``,
``_batch``); the test suite checks it.

How model params reach the loader: ``Llama.__init__`` fills a ``llama_model_params``
and ``llama_cpp._internals.LlamaModel`` passes it, by value, to
``llama_cpp.llama_cpp.llama_model_load_from_file`` (looked up on the module at
call time). :func:`load` wraps that one function, once per process, with a
pass-through that edits the params only for a load requested by this thread, so
it sees exactly what reaches the loader, after ``Llama`` has set its own fields.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as _llama_cpp_c

from ..errors import EngineError
from .offload import Override

# --------------------------------------------------------------------------- ggml


class _BuftOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; };
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


_ggml_lock = threading.Lock()
_ggml: dict[str, Any] = {}


def _ggml_functions() -> dict[str, Any]:
    """The ggml backend functions used here, from the libraries libllama already loaded."""
    with _ggml_lock:
        if _ggml:
            return _ggml
        # Look the symbols up through libllama's own handle: dlsym on a handle searches
        # the library and its dependencies, so these are the very copies of
        # libggml-base.so.0 / libggml.so.0 that llama.cpp uses. Opening
        # lib/libggml-base.so by path instead would load a *second copy* (the
        # wheel holds real files, not symlinks), whose ggml_backend_cpu_buffer_type()
        # is another object than the one the loader compares with.
        libs = [_llama_cpp_c._lib]

        def find(symbol: str, restype: Any, argtypes: list[Any]) -> Any:
            for lib in libs:
                fn = getattr(lib, symbol, None)
                if fn is not None:
                    fn.restype, fn.argtypes = restype, argtypes
                    return fn
            return None

        funcs = {
            "cpu_buffer_type": find("ggml_backend_cpu_buffer_type", ctypes.c_void_p, []),
            "dev_count": find("ggml_backend_dev_count", ctypes.c_size_t, []),
            "dev_get": find("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
            "dev_buffer_type": find("ggml_backend_dev_buffer_type", ctypes.c_void_p, [ctypes.c_void_p]),
            "buft_name": find("ggml_backend_buft_name", ctypes.c_char_p, [ctypes.c_void_p]),
        }
        if funcs["cpu_buffer_type"] is None:
            raise EngineError("This llama.cpp build does not export ggml_backend_cpu_buffer_type.")
        _ggml.update(funcs)
        return _ggml


def buffer_types() -> dict[str, int]:
    """Buffer type name -> ``ggml_backend_buffer_type_t`` for every device of this build.

    The same table llama.cpp's ``-ot`` parser builds (each device's default buffer
    type, by name: ``CPU``, ``CUDA0``...), with ``CPU`` always present.
    """
    f = _ggml_functions()
    table: dict[str, int] = {}
    if f["dev_count"] and f["dev_get"] and f["dev_buffer_type"] and f["buft_name"]:
        for i in range(f["dev_count"]()):
            dev = f["dev_get"](i)
            buft = f["dev_buffer_type"](dev) if dev else None
            if buft:
                table[f["buft_name"](buft).decode()] = buft
    table["CPU"] = f["cpu_buffer_type"]()
    return table


def buffer_type(name: str) -> int:
    """The ``ggml_backend_buffer_type_t`` called ``name`` on this build, or EngineError."""
    table = buffer_types()
    try:
        return table[name]
    except KeyError:
        raise EngineError(
            f"Unknown buffer type {name!r} for tensor overrides; this llama.cpp build has: "
            f"{', '.join(sorted(table))}."
        ) from None


class TensorOverrides:
    """The NULL-terminated C array of tensor buffer-type overrides, kept alive.

    The array points into byte strings owned by this object: keep it referenced as
    long as the model it was loaded with lives (:func:`load_llama` attaches it to
    the ``Llama``).
    """

    def __init__(self, overrides: Sequence[Override]):
        self.overrides = tuple(overrides)
        self._patterns = [o.pattern.encode("utf-8") for o in self.overrides]
        bufts = [buffer_type(o.buffer) for o in self.overrides]
        self._array = (_BuftOverride * (len(self.overrides) + 1))()
        for i, (pattern, buft) in enumerate(zip(self._patterns, bufts)):
            self._array[i].pattern = pattern
            self._array[i].buft = buft
        # the last entry stays zeroed: {NULL, NULL} ends the list

    def __len__(self) -> int:
        return len(self.overrides)

    @property
    def address(self) -> int | None:
        """Value for ``llama_model_params.tensor_buft_overrides`` (None: no overrides)."""
        return ctypes.addressof(self._array) if self.overrides else None


# --------------------------------------------------------------------------- loading

_MODEL_PARAM_FIELDS = {name for name, _ in _llama_cpp_c.llama_model_params._fields_}
_local = threading.local()  # .pending: dict of field -> value for this thread's next load
_install_lock = threading.Lock()
_original_load = None


def _install_load_hook() -> None:
    """Wrap ``llama_model_load_from_file`` once: a pass-through unless this thread asked for params."""
    global _original_load
    with _install_lock:
        if _original_load is not None:
            return
        original = _llama_cpp_c.llama_model_load_from_file

        def llama_model_load_from_file(path_model: bytes, params: Any) -> Any:
            pending = getattr(_local, "pending", None)
            if pending is not None:
                _local.pending = None  # one load only (a draft model would load plainly)
                for name, value in pending.items():
                    setattr(params, name, value)
                _local.applied = True
            return original(path_model, params)

        llama_model_load_from_file.__wrapped__ = original  # type: ignore[attr-defined]
        _original_load = original
        _llama_cpp_c.llama_model_load_from_file = llama_model_load_from_file

        original_init = _llama_cpp_c.llama_init_from_model

        def llama_init_from_model(model: Any, params: Any) -> Any:
            pending = getattr(_local, "context", None)
            if pending is not None:
                _local.context = None  # this thread's next context only
                for name, value in pending.items():
                    setattr(params, name, value)
            return original_init(model, params)

        llama_init_from_model.__wrapped__ = original_init  # type: ignore[attr-defined]
        _llama_cpp_c.llama_init_from_model = llama_init_from_model


class ModelLoadError(EngineError):
    """llama.cpp could not load the model or create its context; ``reason`` is llama-cpp-python's message."""

    def __init__(self, path: str | os.PathLike[str], reason: str):
        super().__init__(f"llama.cpp could not load {path}: {reason}")
        self.reason = reason


_ROPE_SCALING = {"linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR, "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}
_POOLING = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
            "last": llama_cpp.LLAMA_POOLING_TYPE_LAST, "none": llama_cpp.LLAMA_POOLING_TYPE_NONE}


def load(
    model_path: str | os.PathLike[str],
    *,
    n_ctx: int = 512,
    n_batch: int = 512,
    n_ubatch: int = 512,
    threads: int = 0,
    threads_batch: int = 0,
    flash_attn: bool = False,
    type_k: str = "f16",
    type_v: str = "f16",
    gpu_layers: int = 0,
    mmap: bool = True,
    seed: int = 0,
    rope_scaling: str = "",
    rope_freq_scale: float = 0.0,
    embedding: bool = False,
    pooling: str = "",
    overrides: Sequence[Override] = (),
    model_params: Mapping[str, Any] | None = None,
    n_seq_max: int = 1,
    swa_full: bool = True,
) -> Model:
    """Load ``model_path`` with one context: a :class:`Model`.

    ``n_ctx`` 0 is the trained context; ``threads`` 0 is llama-cpp-python's default
    (half the cores), ``threads_batch`` 0 the same as ``threads``. ``type_k`` and
    ``type_v`` are KV cache type names (:data:`pipeline.engine.ggml.KV_TYPE_IDS`);
    ``rope_scaling`` is "", "none", "linear" or "yarn" (``rope_freq_scale`` 0 keeps
    the model's); ``pooling`` ("mean", "cls", "last", "none"; "" the model's) is for
    ``embedding`` contexts. ``model_params`` sets fields of ``llama_model_params`` by
    name on the params that reach the loader, e.g. ``{"use_extra_bufts": False,
    "no_alloc": True}``; ``no_alloc`` (a dry run: sizes logged, nothing allocated)
    turns mmap off, which llama.cpp requires for it. ``n_seq_max`` > 1 makes a context
    for that many sequences over one unified KV cache of ``n_ctx`` cells (llama.cpp's
    ``kv_unified``): sequences that share a prefix share its cells, and every sequence
    can use the whole context. ``swa_full`` keeps a full-size cache for sliding-window layers
    (llama.cpp's ``--swa-full``), so that their memory can be cut at any earlier position and
    a prefix reused; without it they keep only the window. Raises :class:`ModelLoadError`.
    """
    from .ggml import KV_TYPE_IDS

    kwargs: dict[str, Any] = dict(
        n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads or None,
        n_threads_batch=threads_batch or threads or None, flash_attn=flash_attn, n_gpu_layers=gpu_layers,
        use_mmap=mmap, seed=seed, embedding=embedding, swa_full=swa_full, verbose=False,
    )
    for name, value in (("type_k", type_k), ("type_v", type_v)):
        if value not in KV_TYPE_IDS:
            raise EngineError(f"Unknown KV cache type {value!r}; use one of {', '.join(KV_TYPE_IDS)}.")
        kwargs[name] = KV_TYPE_IDS[value]
    if rope_scaling in _ROPE_SCALING:
        kwargs["rope_scaling_type"] = _ROPE_SCALING[rope_scaling]
        if rope_freq_scale:
            kwargs["rope_freq_scale"] = rope_freq_scale
    elif rope_scaling not in ("", "none"):
        raise EngineError(f"Unknown RoPE scaling {rope_scaling!r}; use linear or yarn.")
    if pooling:
        kwargs["pooling_type"] = _POOLING[pooling]

    params = dict(model_params or {})
    if "use_mmap" in params:
        kwargs["use_mmap"] = bool(params.pop("use_mmap"))
    if params.get("no_alloc"):
        # llama.cpp's dry run maps nothing: with mmap on it aborts the process
        # (GGML_ASSERT(!ml.no_alloc) in load_tensors), so it needs load_mode NONE.
        kwargs["use_mmap"] = False
        kwargs["use_mlock"] = False
    unknown = set(params) - _MODEL_PARAM_FIELDS
    if unknown:
        raise EngineError(f"Unknown llama.cpp model parameter(s): {', '.join(sorted(unknown))}.")
    if "tensor_buft_overrides" in params:
        raise EngineError("Pass tensor overrides as `overrides`, not as a raw model parameter.")
    keep = TensorOverrides(overrides)
    if keep.address is not None:
        params["tensor_buft_overrides"] = keep.address

    if n_seq_max < 1:
        raise EngineError(f"n_seq_max must be >= 1, got {n_seq_max}")
    _install_load_hook()
    _local.pending = params if params else None
    _local.applied = False
    _local.context = {"n_seq_max": n_seq_max, "kv_unified": True} if n_seq_max > 1 and not embedding else None
    try:
        llm = llama_cpp.Llama(model_path=str(model_path), **kwargs)
    except (ValueError, RuntimeError) as exc:  # llama-cpp-python reports load failures as ValueError
        raise ModelLoadError(model_path, str(exc)) from exc
    finally:
        applied = _local.applied or not params
        _local.pending = None
        _local.context = None
    if not applied:  # a future llama-cpp-python that loads some other way
        llm.close()
        raise EngineError("The model params did not reach llama.cpp's loader; this llama-cpp-python is not supported.")
    return Model(llm, keep)


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def binding_version() -> str:
    """The loaded llama-cpp-python's own version string (its state files may change between versions)."""
    return str(getattr(llama_cpp, "__version__", "unknown"))


# --------------------------------------------------------------------------- the model


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


class Model:
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

    # -- text -----------------------------------------------------------------------------------

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes ``tokens`` stand for (control tokens as their text)."""
        return b"".join(self.piece(t, special=True) for t in tokens)

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        """Tokens of ``text``; ``special``: markup such as ``<|im_start|>`` becomes its control token.
        Without it, markup tokens llama.cpp would parse from any text (gpt-oss's ``<|start|>``...) stay text."""
        if not special:
            markup = self.__dict__.get("_markup")
            if markup is None:
                markup = self.__dict__["_markup"] = always_parsed_markup(self._vocab, self.n_vocab)
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

    # -- decoding -------------------------------------------------------------------------------

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

    def seq_copy(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Give sequence ``dst`` the cells of ``src`` at positions ``[p0, p1)`` (``p1`` -1: to the end).
        In a unified KV cache the cells are shared, not copied: no memory and no compute."""
        llama_cpp.llama_memory_seq_cp(llama_cpp.llama_get_memory(self._ctx), src, dst, p0, p1)

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

    # -- sequence memory and state files -----------------------------------------------------------

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

    def save_state(self, path: str | os.PathLike[str], tokens: Sequence[int], *, seq: int = 0) -> bool:
        """Write ``seq``'s state and ``tokens`` (what it holds) to ``path``; False if llama.cpp failed."""
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        return bool(llama_cpp.llama_state_seq_save_file(self._ctx, os.fsencode(path), seq, arr, len(tokens)))

    def load_state(self, path: str | os.PathLike[str], *, capacity: int, seq: int = 0) -> list[int] | None:
        """Restore ``seq`` from ``path``: the tokens it holds (at most ``capacity``), None if llama.cpp failed."""
        out = (llama_cpp.llama_token * capacity)()
        n_out = ctypes.c_size_t(0)
        if not llama_cpp.llama_state_seq_load_file(self._ctx, os.fsencode(path), seq, out, capacity,
                                                   ctypes.byref(n_out)):
            return None
        return out[:n_out.value]

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
    """A llama.cpp sampler chain over a :class:`Model`'s context; :meth:`close` frees it."""

    def __init__(self, model: Model, *, temperature: float, repeat_penalty: float, seed: int):
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


# --------------------------------------------------------------------------- logging

# ggml_log_level, as ggml.h of this build defines it. (llama-cpp-python's _logger.py
# has an older order, INFO=1 ... DEBUG=4, and so misclassifies every level.)
LOG_NONE, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CONT = range(6)

_OVERRIDE_LINE = re.compile(r"tensor (\S+) \((.*?)\) buffer type overridden to (\S+)")
# One capture at a time across threads (the log callback is process-wide);
# re-entrant so captures nest on one thread.
_log_lock = threading.RLock()


@dataclass(frozen=True)
class LogRecord:
    level: int  # ggml_log_level; CONT pieces carry the level of the message they continue
    text: str


class LlamaLog:
    """Capture llama.cpp's log while in the ``with`` block.

    Every message reaches the capture, debug level included (llama.cpp filters
    nothing before the callback). Messages are also passed on to the callback that
    was in place (llama-cpp-python's own, which prints only when ``verbose``), so
    the terminal behaves as it would without the capture; ``chain=False`` keeps
    them from it. The previous callback is restored on exit.
    """

    def __init__(self, *, chain: bool = True):
        self.chain = chain
        self._records: list[LogRecord] = []
        self._lock = threading.Lock()
        self._last_level = LOG_INFO
        self._prev_cb: Any = None
        self._prev_ud = ctypes.c_void_p()
        self._callback = _llama_cpp_c.llama_log_callback(self._on_log)  # referenced while installed

    def _on_log(self, level: int, text: bytes | None, user_data: Any) -> None:
        try:
            s = (text or b"").decode("utf-8", errors="replace")
            with self._lock:
                resolved = self._last_level if level == LOG_CONT else level
                self._last_level = resolved
                self._records.append(LogRecord(resolved, s))
            if self.chain and self._prev_cb:
                self._prev_cb(level, text, self._prev_ud)
        except Exception:  # never let an exception cross into C
            pass

    def __enter__(self) -> LlamaLog:
        _log_lock.acquire()
        try:
            prev = _llama_cpp_c.llama_log_callback()
            _llama_cpp_c.llama_log_get(ctypes.byref(prev), ctypes.byref(self._prev_ud))
            self._prev_cb = prev
            _llama_cpp_c.llama_log_set(self._callback, ctypes.c_void_p(0))
        except BaseException:
            _log_lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            # NULL restores llama.cpp's default (stderr) logger, as before any set.
            _llama_cpp_c.llama_log_set(self._prev_cb, self._prev_ud)
        finally:
            _log_lock.release()

    # ---- reading

    @property
    def records(self) -> list[LogRecord]:
        with self._lock:
            return list(self._records)

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.records)

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines()

    def grep(self, pattern: str) -> list[str]:
        """Lines where ``pattern`` is found (``re.search``)."""
        rx = re.compile(pattern)
        return [line for line in self.lines if rx.search(line)]

    def iter_matches(self, pattern: str) -> Iterator[re.Match[str]]:
        rx = re.compile(pattern)
        for line in self.lines:
            m = rx.search(line)
            if m:
                yield m

    def overridden(self) -> dict[str, str]:
        """Tensor name -> buffer type, from the loader's ``buffer type overridden`` lines (debug level)."""
        return {m.group(1): m.group(3) for m in self.iter_matches(_OVERRIDE_LINE.pattern)}


# --------------------------------------------------------------------------- the build (for `rag status`)


def system_info() -> str:
    """llama.cpp's own account of its build (``llama_print_system_info``), without loading a model:
    the CPU instruction sets it was compiled for (``CPU : AVX2 = 1 | ...``) and, on a GPU build, the
    backend and its architectures (``CUDA : ARCHS = 860,900 | ...``)."""
    return llama_cpp.llama_print_system_info().decode(errors="replace")


def devices() -> list[dict[str, str]]:
    """The devices llama.cpp's backends report (``name`` as ``CPU``, ``CUDA0``; ``description``)."""
    f = _ggml_functions()
    lib = _llama_cpp_c._lib
    name_of, desc_of = (getattr(lib, s, None) for s in ("ggml_backend_dev_name", "ggml_backend_dev_description"))
    if not (f["dev_count"] and f["dev_get"] and name_of and desc_of):
        return []
    for fn in (name_of, desc_of):
        fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    found = []
    for i in range(f["dev_count"]()):
        dev = f["dev_get"](i)
        if dev:
            found.append({"name": (name_of(dev) or b"").decode(errors="replace"),
                          "description": (desc_of(dev) or b"").decode(errors="replace")})
    return found


# --------------------------------------------------------------------------- markup parsed from any text

_MARKUP_SPELLING = re.compile(r"<\|[^|<>\s]{1,48}\|>")


def always_parsed_markup(vocab: Any, n_vocab: int) -> "re.Pattern[str] | bool":
    """The pattern of this vocabulary's markup tokens that llama.cpp parses from *any* text, or False.

    llama.cpp matches user-defined tokens in text even with special-token parsing off, and
    for gpt-oss it marks harmony's ``<|start|>``, ``<|message|>``, ``<|channel|>`` and
    ``<|constrain|>`` user-defined: without care a document could open a turn. Only
    tokens spelled like markup (``<|name|>``) count; other user-defined tokens (runs of
    spaces, HTML tags in some vocabularies) are ordinary text.
    """
    found = []
    for tok in range(n_vocab):
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
