"""Loading the generator: engine settings → llama.cpp's load arguments, the memory check, load errors.

:func:`load_params` is the one translation of settings into llama.cpp's. Every setting that matters for prefill comes from :class:`~pipeline.config.EngineConfig`:
context length, batch and micro-batch sizes, flash attention, KV cache types, GPU
layers, threads, mmap, RoPE scaling, sequences per context, and expert offload (see
:mod:`.offload`). When tensors are overridden to the CPU the model loads without mmap,
so that a GPU build can keep them in pinned memory. :func:`load_generator` refuses a KV
cache that cannot fit and names the setting to change when llama.cpp fails.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from . import offload
from .host import detect_ram, usable_cpus
from ..config import EngineConfig
from ..errors import ConfigError, EngineError

if TYPE_CHECKING:
    from ._llama import Model
    from .gguf.info import ModelInfo


def resolve_overrides(settings: EngineConfig, n_layers: int) -> list[offload.Override]:
    """Tensor overrides in llama.cpp's order: explicit ``-ot`` patterns first, then expert offload."""
    out: list[offload.Override] = []
    if settings.override_tensors.strip():
        out += offload.parse_override(settings.override_tensors)
    if settings.cpu_moe:
        out += offload.cpu_moe()
    elif settings.n_cpu_moe:
        out += offload.n_cpu_moe(settings.n_cpu_moe, n_layers, which=settings.cpu_moe_from)
    return out


def load_params(settings: EngineConfig, *, n_ctx: int, overrides: Sequence[offload.Override] = (),
                compose: bool = False) -> dict:
    """The keyword arguments of :func:`._llama.load` that engine ``settings`` mean at context ``n_ctx``.

    Batch sizes within the context, threads (0: every usable core), KV types, RoPE
    scaling, and mmap off where tensors are overridden (so that a GPU build can pin
    them for fast copies). ``compose``: prompts are composed from section states
    (:mod:`.compose`), which needs three sequences (the prompt's, a scratch one, a guard
    for sliding-window layers) in the unified KV cache and every cell of sliding-window
    layers kept (``swa_full``: more KV memory on such models, none on others).
    """
    s = settings
    cpus = usable_cpus()  # more threads than cores only wait at ggml's barriers (10-50x slower decodes)
    threads = min(s.threads, cpus) if s.threads else cpus
    return dict(
        n_ctx=n_ctx, n_batch=min(s.n_batch, n_ctx), n_ubatch=min(s.n_ubatch, s.n_batch, n_ctx),
        threads=threads, threads_batch=min(s.threads_batch, cpus) if s.threads_batch else threads,
        flash_attn=s.flash_attn,
        type_k=s.type_k, type_v=s.type_v, gpu_layers=s.gpu_layers, seed=s.seed,
        mmap=s.mmap and not overrides, rope_scaling=s.rope_scaling, rope_freq_scale=s.rope_freq_scale,
        overrides=list(overrides), n_seq_max=max(1, s.n_seq_max, 3 if compose else 1),
        **({"swa_full": True} if compose else {}),
    )


def check_memory(info: ModelInfo, settings: EngineConfig, n_ctx: int) -> None:
    """Refuse, with the setting to lower, a KV cache that cannot fit in this machine's memory."""
    from ._llama import supports_gpu_offload

    if supports_gpu_offload() and settings.gpu_layers != 0:
        return  # VRAM is checked by llama.cpp itself, which fails cleanly
    need = info.kv_bytes(n_ctx, settings.type_k, settings.type_v)
    try:
        avail = detect_ram(available=True)
    except ConfigError:  # no /proc/meminfo: llama.cpp's own allocation failure will have to do
        return
    if need > 0.9 * avail:
        raise EngineError(
            f"a context of {n_ctx:,} tokens needs about {need / 2**30:.1f} GiB of KV cache, more than "
            f"the {avail / 2**30:.1f} GiB of memory available: lower engine.n_ctx, or set engine.type_k "
            "and engine.type_v to q8_0 (half the size) or q4_0")


def load_generator(model_path: Path, settings: EngineConfig, *, info: ModelInfo, n_ctx: int,
                   overrides: Sequence[offload.Override], compose: bool = False) -> tuple[Model, float]:
    """The generator model in llama.cpp and the seconds its load took; :class:`EngineError` naming the
    setting to change where it cannot load (an encoder, a context too large for the memory)."""
    from ._llama import ModelLoadError, load

    if not info.causal:
        raise EngineError(f"{model_path.name} is an embedding (encoder) model ({info.arch}), "
                          "not a generator: set models.generator to a text-generation GGUF")
    check_memory(info, settings, n_ctx)
    t0 = time.perf_counter()
    try:
        llm = load(model_path, **load_params(settings, n_ctx=n_ctx, overrides=overrides, compose=compose))
    except ModelLoadError as exc:
        if "context" in exc.reason.lower():
            raise EngineError(
                f"llama.cpp could not create a context of {n_ctx:,} tokens for {model_path.name}: "
                "lower engine.n_ctx or engine.n_ubatch, use a smaller KV type (engine.type_k/type_v = q8_0), "
                "or keep more experts on the CPU (engine.n_cpu_moe)") from None
        raise EngineError(f"llama.cpp could not load the generator {model_path}: {exc.reason}") from None
    return llm, time.perf_counter() - t0


def dry_run_log(model_path: Path, settings: EngineConfig, *, n_ctx: int, swa_full: bool = True) -> str:
    """llama.cpp's log of a dry run of ``settings`` (model param ``no_alloc``: the real KV cache and
    compute buffer sizes are logged, nothing is allocated). Expert placement is left out: it moves
    no buffer's size. ``swa_full`` False: sliding-window layers with only their window (not the
    engine's way; for comparing with llama-server's default)."""
    from ._llama import LlamaLog, load

    with LlamaLog(chain=False) as log:
        load(model_path, model_params={"no_alloc": True}, swa_full=swa_full,
             **load_params(settings, n_ctx=n_ctx)).close()
    return log.text


def import_bindings() -> None:
    """Import llama.cpp's bindings now (about 0.2 s of Python), ahead of a load that will need them."""
    from . import _llama  # noqa: F401


def supports_gpu_offload() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU."""
    from ._llama import supports_gpu_offload as supported

    return supported()


__all__ = ["check_memory", "dry_run_log", "import_bindings", "load_generator", "load_params", "resolve_overrides",
           "supports_gpu_offload"]
