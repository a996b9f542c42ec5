"""The speed model: estimated prefill and decode tokens/s of a plan on a hardware profile.

A prefill of ``P`` tokens runs ``ceil(P/u)`` micro-batches (``u = n_ubatch``);
each one costs, in sequence (llama.cpp's scheduler does not overlap these)::

    t_gpu  = 2 * active_params_on_gpu * u / gpu_flops
             + attention FLOPs (4 * n_head * head_dim * context per token and
               full-attention layer; the window for sliding layers) / (gpu_flops * attn_efficiency)
    t_copy = bytes of the experts in host memory / h2d bandwidth
             (once per micro-batch when u >= 32: llama.cpp's op offload; pinned
             bandwidth when mmap is off, pageable when on)
    t_cpu  = 2 * params computed on the CPU * u / cpu_flops
             (the experts in host memory when u < 32; layers not on the GPU)

Prefill tokens/s is ``P / sum(t)``; the *bound* is the largest of the three
totals (``gpu``, ``copy``, ``cpu``). The output head runs for one token only.
Decode (one token) is memory-bandwidth bound: bytes of the active weights and of
the KV cache read per token, on each device, over its memory bandwidth.

The hardware figures come from a :class:`~pipeline.planner.hardware.HardwareProfile`.
Calibration: the ``rtx3090`` profile's ``gpu_flops`` and ``h2d_pinned`` were
solved so this model reproduces the recipe's two measurements on a 3090
(Qwen3.6-35B-A3B Q6_K, 64K context, mmap off): 564 tok/s at ``-b 512 -ub 128``
with experts on the GPU as far as they fit (the baseline) and 1330 tok/s at
``-b 1024 -ub 512`` with 8 layers' experts on the CPU; see
:func:`pipeline.planner.plan.recipe_plan`, :func:`pipeline.planner.plan.baseline_plan` and
``tests/test_plan.py``. ``rag tune`` measures the real speeds on a machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .hardware import HardwareProfile
from .memory import kv_cells
from ..engine.ggml import type_bytes
from .spec import LayerSpec, ModelSpec

if TYPE_CHECKING:  # a Plan is only read here; pipeline.planner.plan imports this module
    from .plan import Plan

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


def _attn_flops_per_token_ctx(lay: LayerSpec) -> float:
    # QK^T and softmax(QK^T) V: 2 FLOPs per multiply-add, two products
    return 2.0 * lay.n_head * (lay.head_dim_k + lay.head_dim_v)


def prefill_speed(spec: ModelSpec, plan: Plan, hw: HardwareProfile, n_tokens: int | None = None) -> Speed:
    """Estimated prefill of ``n_tokens`` (default ``n_ctx``) from an empty cache; see the module docstring."""
    P = int(n_tokens or plan.n_ctx)
    u = min(plan.n_ubatch, plan.n_batch, P)
    n_ub = math.ceil(P / u)
    n = spec.n_layers
    gpu_layers = plan.gpu_layer_set(n) if hw.has_gpu else set()
    cpu_exp = set(plan.cpu_expert_layers(n))
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
    t_gpu = t_cpu = t_copy = 0.0
    if hw.has_gpu:
        t_gpu = 2.0 * gpu_params * P / hw.gpu_flops + attn_gpu / (hw.gpu_flops * hw.attn_efficiency)
        t_copy = n_ub * copy_bytes / hw.h2d(pinned=not plan.mmap)
    t_cpu = (2.0 * cpu_params * P + attn_cpu) / hw.cpu_flops if (cpu_params or attn_cpu) else 0.0
    # the output head, for the last token only
    if hw.has_gpu and plan.output_on_gpu(n):
        t_gpu += 2.0 * spec.output_params / hw.gpu_flops
    else:
        t_cpu += 2.0 * spec.output_params / hw.cpu_flops
    seconds = {"gpu": t_gpu, "copy": t_copy, "cpu": t_cpu}
    total = sum(seconds.values())
    bound = max(seconds, key=lambda key: seconds[key])
    return Speed(tokens_per_s=P / total if total else float("inf"), bound=bound, seconds=seconds, n_tokens=P)


def decode_speed(spec: ModelSpec, plan: Plan, hw: HardwareProfile, context: int | None = None) -> float:
    """Estimated decode tokens/s at ``context`` tokens in the cache (memory-bandwidth bound)."""
    ctx = plan.n_ctx if context is None else context
    n = spec.n_layers
    gpu_layers = plan.gpu_layer_set(n) if hw.has_gpu else set()
    cpu_exp = set(plan.cpu_expert_layers(n))
    frac = spec.n_experts_used / spec.n_experts if spec.n_experts else 1.0
    g = c = 0.0
    for i, lay in enumerate(spec.layers):
        per_tok = 0.0
        if lay.kind != "recurrent":
            cells = min(ctx, kv_cells(lay, plan))
            per_tok = cells * (type_bytes(lay.n_head_kv * lay.head_dim_k, plan.type_k)
                               + type_bytes(lay.n_head_kv * lay.head_dim_v, plan.type_v))
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
    if hw.has_gpu and plan.output_on_gpu(n):
        g += spec.output_bytes
    else:
        c += spec.output_bytes
    t = (g / hw.gpu_mem_bw if g else 0.0) + (c / hw.cpu_mem_bw if c else 0.0)
    return 1.0 / t if t else float("inf")


__all__ = ["OFFLOAD_MIN_BATCH", "Speed", "decode_speed", "prefill_speed"]
