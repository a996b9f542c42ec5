"""The speed model: estimated prefill and decode tokens/s of engine settings on a hardware profile.

A prefill of ``P`` tokens runs ``ceil(P/u)`` micro-batches (``u = n_ubatch``);
each one costs, in sequence (llama.cpp's scheduler does not overlap these)::

    t_gpu  = (2 * active_params_on_gpu * u + attention FLOPs) / (gpu_flops * e_gpu(u))
             (attention: 4 * n_head * head_dim * context per token and full-attention
             layer, the window for sliding layers, charged at gpu_flops * attn_efficiency)
             + gpu_layer_overhead * layers on the GPU
    t_copy = bytes of the experts in host memory / h2d bandwidth
             (once per micro-batch when u >= 32: llama.cpp's op offload; pinned
             bandwidth when mmap is off, pageable when on)
    t_cpu  = 2 * params computed on the CPU * u / (cpu_flops * e_cpu(u))
             (the experts in host memory when u < 32; layers not on the GPU)
             + cpu_layer_overhead * layers on the CPU

**Micro-batch efficiency.** Matrix kernels reach their speed only on enough rows:
below that, each micro-batch pays for reading the weights and for launching its
kernels whatever its size. Per device, the matrix work runs at a fraction of the
device's FLOP/s that saturates with the micro-batch::

    e(u) = 1 / (1 + (u_half / u) ** k)          (u_half = *_ubatch_half, k = *_ubatch_exp)

and on a CPU large micro-batches spill the caches (their activations and, without
flash attention, their attention scores), a cost that grows with ``u``: ``e_cpu(u)``
is further divided by ``1 + u / cpu_ubatch_cache``. Each micro-batch also pays a
fixed cost per layer (``*_layer_overhead``: kernel launches, graph scheduling and
thread barriers). So on a GPU a larger ``n_ubatch`` is never slower by the model
(it is only bigger), and the tuner breaks ties towards the larger micro-batch.

Prefill tokens/s is ``P / sum(t)``; the *bound* is the largest of the three
totals (``gpu``, ``copy``, ``cpu``). The output head runs for one token only.
Decode (one token) is memory-bandwidth bound: bytes of the active weights and of
the KV cache read per token, on each device, over its memory bandwidth.

The hardware figures come from a :class:`~pipeline.tuning.hardware.HardwareProfile`;
how the built-in ones were calibrated (published llama-bench ``-ub`` sweeps, the
recipe's two measurements on an RTX 3090, ``rag tune --measure-hardware`` on a CPU)
is in :mod:`pipeline.tuning.hardware` and ``tests/config/test_speed.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..config import EngineConfig
from .hardware import HardwareProfile
from .footprint import kv_cells
from ..engine.gguf.ggml import type_bytes
from .spec import LayerSpec, ModelSpec

#: llama.cpp's op offload copies host weights to the GPU only for micro-batches of at least this many tokens.
OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class Speed:
    tokens_per_s: float
    bound: str  # "gpu" | "copy" | "cpu"
    seconds: dict[str, float]  # total seconds per component over the prefill
    n_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(tokens_per_s=self.tokens_per_s, bound=self.bound, seconds=self.seconds, n_tokens=self.n_tokens)


def ubatch_efficiency(u: float, half: float, exp: float, cache: float = 0.0) -> float:
    """The fraction of a device's FLOP/s its matrix kernels reach on micro-batches of ``u`` tokens."""
    e = 1.0 / (1.0 + (half / u) ** exp) if half > 0 else 1.0
    return e / (1.0 + u / cache) if cache > 0 else e


def _attn_flops_per_token_ctx(lay: LayerSpec) -> float:
    # QK^T and softmax(QK^T) V: 2 FLOPs per multiply-add, two products
    return 2.0 * lay.n_head * (lay.head_dim_k + lay.head_dim_v)


def _batches(P: int, u: int) -> list[tuple[int, int]]:
    """(size, count) of the micro-batches of a ``P``-token prefill at ``n_ubatch = u``."""
    full, rest = divmod(P, u)
    return [(u, full)] + ([(rest, 1)] if rest else [])


def prefill_speed(spec: ModelSpec, settings: EngineConfig, hw: HardwareProfile,
                  n_tokens: int | None = None) -> Speed:
    """Estimated prefill of ``n_tokens`` (default ``n_ctx``) from an empty cache; see the module docstring."""
    P = max(1, int(n_tokens or settings.n_ctx))
    u = max(1, min(settings.n_ubatch, settings.n_batch, P))
    batches = _batches(P, u)
    n_ub = sum(count for _, count in batches)
    n = spec.n_layers
    gpu_layers = settings.gpu_layer_set(n) if hw.has_gpu else set()
    cpu_exp = set(settings.cpu_expert_layers(n))
    k = spec.n_experts_used
    gpu_params = cpu_params = 0.0
    copy_bytes = 0
    attn_gpu = attn_cpu = 0.0  # FLOPs over the whole prefill
    sum_ctx_full = P * (P + 1) / 2.0  # sum over tokens of the positions they attend to

    for i, lay in enumerate(spec.layers):
        on_gpu = i in gpu_layers
        layer_params = lay.dense_params + k * lay.expert_params
        if lay.kind == "recurrent":
            a = float(lay.state_flops) * P
        elif lay.kind == "swa" and lay.window:
            w = lay.window
            s = sum_ctx_full if P <= w else w * (w + 1) / 2.0 + (P - w) * w
            a = _attn_flops_per_token_ctx(lay) * s
        else:
            a = _attn_flops_per_token_ctx(lay) * sum_ctx_full
        if not on_gpu:
            cpu_params += layer_params
            attn_cpu += a
            continue
        attn_gpu += a
        gpu_params += lay.dense_params
        if i in cpu_exp:
            if u >= OFFLOAD_MIN_BATCH:
                gpu_params += k * lay.expert_params
                copy_bytes += lay.expert_bytes
            else:
                cpu_params += k * lay.expert_params
        else:
            gpu_params += k * lay.expert_params

    def device_seconds(params: float, attn: float, flops: float, attn_eff: float, eff) -> float:
        # each micro-batch at its own efficiency; attention spread over them by tokens
        t = 0.0
        for size, count in batches:
            share = size * count / P
            t += (2.0 * params * size * count + attn * share / attn_eff) / (flops * eff(size))
        return t

    t_gpu = t_cpu = t_copy = 0.0
    if hw.has_gpu and gpu_layers:
        e_gpu = lambda s: ubatch_efficiency(s, hw.gpu_ubatch_half, hw.gpu_ubatch_exp)  # noqa: E731
        t_gpu = device_seconds(gpu_params, attn_gpu, hw.gpu_flops, hw.attn_efficiency, e_gpu)
        t_gpu += n_ub * len(gpu_layers) * hw.gpu_layer_overhead
        t_copy = n_ub * copy_bytes / hw.h2d(pinned=not settings.mmap)
    if cpu_params or attn_cpu:
        e_cpu = lambda s: ubatch_efficiency(s, hw.cpu_ubatch_half, hw.cpu_ubatch_exp, hw.cpu_ubatch_cache)  # noqa
        t_cpu = device_seconds(cpu_params, attn_cpu, hw.cpu_flops, 1.0, e_cpu)
        t_cpu += n_ub * (n - len(gpu_layers)) * hw.cpu_layer_overhead
    # the output head, for the last token only
    if hw.has_gpu and settings.output_on_gpu(n):
        t_gpu += 2.0 * spec.output_params / hw.gpu_flops
    else:
        t_cpu += 2.0 * spec.output_params / hw.cpu_flops
    seconds = {"gpu": t_gpu, "copy": t_copy, "cpu": t_cpu}
    total = sum(seconds.values())
    bound = max(seconds, key=lambda key: seconds[key])
    return Speed(tokens_per_s=P / total if total else math.inf, bound=bound, seconds=seconds, n_tokens=P)


def decode_speed(spec: ModelSpec, settings: EngineConfig, hw: HardwareProfile, context: int | None = None) -> float:
    """Estimated decode tokens/s at ``context`` tokens in the cache (memory-bandwidth bound)."""
    ctx = settings.n_ctx if context is None else context
    n = spec.n_layers
    gpu_layers = settings.gpu_layer_set(n) if hw.has_gpu else set()
    cpu_exp = set(settings.cpu_expert_layers(n))
    frac = spec.n_experts_used / spec.n_experts if spec.n_experts else 1.0
    g = c = 0.0
    for i, lay in enumerate(spec.layers):
        per_tok = 0.0
        if lay.kind != "recurrent":
            cells = min(ctx, kv_cells(lay, settings, swa_full=False))  # what attention reads: the window
            per_tok = cells * (type_bytes(lay.n_head_kv * lay.head_dim_k, settings.type_k)
                               + type_bytes(lay.n_head_kv * lay.head_dim_v, settings.type_v))
        else:
            per_tok = 2 * lay.state_bytes
        if i in gpu_layers:
            g += lay.other_bytes + per_tok
            if i in cpu_exp:
                c += frac * lay.expert_bytes
            else:
                g += frac * lay.expert_bytes
        else:
            c += lay.other_bytes + frac * lay.expert_bytes + per_tok
    if hw.has_gpu and settings.output_on_gpu(n):
        g += spec.output_bytes
    else:
        c += spec.output_bytes
    t = (g / hw.gpu_mem_bw if g else 0.0) + (c / hw.cpu_mem_bw if c else 0.0)
    return 1.0 / t if t else math.inf


__all__ = ["OFFLOAD_MIN_BATCH", "Speed", "decode_speed", "prefill_speed", "ubatch_efficiency"]
