"""Loading: a model file and typed settings → one llama.cpp context (a :class:`~.model.Model`).

How model params reach the loader: ``Llama.__init__`` fills a ``llama_model_params``
and ``llama_cpp._internals.LlamaModel`` passes it, by value, to
``llama_cpp.llama_cpp.llama_model_load_from_file`` (looked up on the module at
call time). :func:`load` wraps that one function, once per process, with a
pass-through that edits the params only for a load requested by this thread, so
it sees exactly what reaches the loader, after ``Llama`` has set its own fields.
The context params (``n_seq_max``, ``kv_unified``) reach ``llama_init_from_model``
the same way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as _llama_cpp_c

from ...errors import EngineError
from ..offload import Override
from .log import quick_handover
from .model import Model
from .overrides import TensorOverrides

_MODEL_PARAM_FIELDS = {name for name, _ in _llama_cpp_c.llama_model_params._fields_}
_local = threading.local()  # .pending: dict of field -> value for this thread's next load
_install_lock = threading.Lock()
_original_load = None


class _Unsilenced:
    """What replaces llama-cpp-python's ``suppress_stdout_stderr`` (see :func:`_install_load_hook`)."""

    def __init__(self, disable: bool = True):
        pass

    def __enter__(self) -> "_Unsilenced":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _install_load_hook() -> None:
    """Wrap ``llama_model_load_from_file`` once: a pass-through unless this thread asked for params.

    Also stop llama-cpp-python from silencing loads by pointing the whole process's stdout and
    stderr (file descriptors 1 and 2, and ``sys.stdout``/``sys.stderr``) at /dev/null: a model
    loading in one thread (beside retrieval, or a second engine) would swallow what every other
    thread prints meanwhile, an answer's text included. llama.cpp's own messages reach the log
    callback of :mod:`.log` instead, which shows errors only, so a load stays as quiet as before,
    and two loads may run at once.
    """
    global _original_load
    with _install_lock:
        if _original_load is not None:
            return
        import llama_cpp._internals as _internals
        import llama_cpp.llama as _llama_module

        _internals.suppress_stdout_stderr = _Unsilenced  # type: ignore[attr-defined]
        _llama_module.suppress_stdout_stderr = _Unsilenced  # type: ignore[attr-defined]
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
    ``type_v`` are KV cache type names (:data:`pipeline.engine.gguf.ggml.KV_TYPE_IDS`);
    ``rope_scaling`` is "", "none", "linear" or "yarn" (``rope_freq_scale`` 0 keeps
    the model's); ``pooling`` ("mean", "cls", "last", "none"; "" the model's) is for
    ``embedding`` contexts. ``model_params`` sets fields of ``llama_model_params`` by
    name on the params that reach the loader, e.g. ``{"use_extra_bufts": False,
    "no_alloc": True}``; ``no_alloc`` (a dry run: sizes logged, nothing allocated)
    turns mmap off, which llama.cpp requires for it. ``n_seq_max`` > 1 makes a context
    for that many sequences over one unified KV cache of ``n_ctx`` cells (llama.cpp's
    ``kv_unified``): sequences that share a prefix share its cells, and every sequence
    can use the whole context. ``swa_full`` keeps a full-size cache for sliding-window layers
    (llama.cpp's ``--swa-full``), so that their memory can be cut at any earlier position and a
    prefix reused; without it they keep only the window. Raises :class:`ModelLoadError`.
    """
    kwargs = _llama_kwargs(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, threads=threads,
                           threads_batch=threads_batch, flash_attn=flash_attn, type_k=type_k, type_v=type_v,
                           gpu_layers=gpu_layers, mmap=mmap, seed=seed, rope_scaling=rope_scaling,
                           rope_freq_scale=rope_freq_scale, embedding=embedding, pooling=pooling)
    kwargs["swa_full"] = swa_full
    params = _loader_params(model_params, kwargs)
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
        with quick_handover():
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


def _llama_kwargs(*, n_ctx: int, n_batch: int, n_ubatch: int, threads: int, threads_batch: int, flash_attn: bool,
                  type_k: str, type_v: str, gpu_layers: int, mmap: bool, seed: int, rope_scaling: str,
                  rope_freq_scale: float, embedding: bool, pooling: str) -> dict[str, Any]:
    """The ``Llama`` constructor's keyword arguments for these settings (names checked here)."""
    from ..gguf.ggml import KV_TYPE_IDS

    kwargs: dict[str, Any] = dict(
        n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=threads or None,
        n_threads_batch=threads_batch or threads or None, flash_attn=flash_attn, n_gpu_layers=gpu_layers,
        use_mmap=mmap, seed=seed, embedding=embedding, verbose=False,
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
    return kwargs


def _loader_params(model_params: Mapping[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``llama_model_params`` fields to set at the loader (checked by name); adjusts ``kwargs``
    where a field is one the constructor sets itself (``use_mmap``) or needs (a dry run maps nothing)."""
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
    return params


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU."""
    return bool(llama_cpp.llama_supports_gpu_offload())


def binding_version() -> str:
    """The loaded llama-cpp-python's own version string (its state files may change between versions)."""
    return str(getattr(llama_cpp, "__version__", "unknown"))
