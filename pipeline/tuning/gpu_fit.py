"""Where the built-in GPU profile's speed figures come from: published measurements, and the fit to them.

The speed model (:mod:`.speed`) has four figures per GPU that matter for prefill:
effective FLOP/s, pinned host-to-device bandwidth, and the micro-batch curve
``e(u) = 1 / (1 + (u_half / u) ** exp)``. For the RTX 3090 they are fitted to:

* :data:`GEMMA_2B_F16_3090`: a published llama-bench ``-ub`` sweep of a dense model
  with flash attention at a long prompt (Gemma 2B F16, ``pp16384``, one RTX 3090),
  ggml-org/llama.cpp pull request #11583 ("CUDA: use mma PTX instructions for
  FlashAttention", the PR's column), used for the *shape* of the curve (its figures
  relative to each other: cuBLAS on F16 weights runs at another absolute speed than
  the quantised kernels the recipe uses);
* :data:`RECIPE_3090`: the recipe's two measurements (Qwen3.6-35B-A3B Q6_K, 64K
  context, mmap off): 564 tok/s at ``-b 512 -ub 128`` with experts on the GPU as far
  as they fit, 1330 tok/s at ``-b 1024 -ub 512`` with 8 layers' experts on the CPU;
  they set the absolute FLOP/s and the copy bandwidth.

Held back, not used by the fit: :data:`LLAMA_8B_Q5_0_3090`, another published sweep
(Llama 3 8B Q5_0, ``pp2048``, one RTX 3090), ggml-org/llama.cpp pull request #7716
("CUDA: refactor mmq, dmmv, mmvq", the PR's column); ``tests/config/test_speed.py`` checks
the model against it as well as against the figures it was fitted to.

``python -m pipeline.tuning.gpu_fit`` runs the fit and prints the constants that
``pipeline/tuning/hardware.py`` holds. The per-layer launch cost
(:data:`GPU_LAYER_OVERHEAD`) is an assumption, not fitted: about a dozen kernels per
layer at a few microseconds each; it matters only for tiny models.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

from ..config import EngineConfig
from .hardware import HardwareProfile
from .choice import baseline_plan, recipe_plan
from .spec import ModelSpec
from .speed import prefill_speed

#: (n_ubatch, prompt tokens/s): Gemma 2B F16, pp16384, FA, RTX 3090 (llama.cpp PR #11583).
GEMMA_2B_F16_3090 = ((128, 7546.77), (256, 9925.36), (512, 11162.57), (1024, 11560.53), (2048, 11861.19),
                     (4096, 11855.52))
#: (n_ubatch, prompt tokens/s): Llama 3 8B Q5_0, pp2048, RTX 3090 (llama.cpp PR #7716). Held back.
LLAMA_8B_Q5_0_3090 = ((256, 2089.43), (512, 2187.50), (1024, 2267.47), (2048, 2235.98))
#: (label, prompt tokens/s): the recipe on an RTX 3090 (see docs/performance.md).
RECIPE_3090 = (("baseline", 564.0), ("recipe", 1330.0))
GPU_LAYER_OVERHEAD = 50e-6  # seconds per layer per micro-batch (assumed)
UBATCH_EXP = 1.5


def dense_spec(name: str, *, n_layers: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int, n_ff: int,
               n_vocab: int, qtype: str, n_ctx_train: int = 131072) -> ModelSpec:
    """A llama-style dense model from its published shapes, every matrix at ``qtype``."""
    tensors: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (n_embd, n_vocab), qtype),
                                                       ("output.weight", (n_embd, n_vocab), qtype),
                                                       ("output_norm.weight", (n_embd,), "f32")]
    for i in range(n_layers):
        b = f"blk.{i}."
        tensors += [(b + "attn_norm.weight", (n_embd,), "f32"), (b + "ffn_norm.weight", (n_embd,), "f32"),
                    (b + "attn_q.weight", (n_embd, n_head * head_dim), qtype),
                    (b + "attn_k.weight", (n_embd, n_head_kv * head_dim), qtype),
                    (b + "attn_v.weight", (n_embd, n_head_kv * head_dim), qtype),
                    (b + "attn_output.weight", (n_head * head_dim, n_embd), qtype),
                    (b + "ffn_gate.weight", (n_embd, n_ff), qtype), (b + "ffn_up.weight", (n_embd, n_ff), qtype),
                    (b + "ffn_down.weight", (n_ff, n_embd), qtype)]
    meta = {"general.architecture": "llama", "llama.block_count": n_layers, "llama.embedding_length": n_embd,
            "llama.attention.head_count": n_head, "llama.attention.head_count_kv": n_head_kv,
            "llama.attention.key_length": head_dim, "llama.attention.value_length": head_dim,
            "llama.context_length": n_ctx_train}
    return ModelSpec.from_metadata(meta, tensors, name=name)


def gemma_2b(qtype: str = "f16") -> ModelSpec:
    """Gemma 2B's published shapes (18 layers, 2048 wide, 8 heads of 256, 1 KV head, FFN 16384, 256K vocabulary)."""
    return dense_spec("gemma-2b", n_layers=18, n_embd=2048, n_head=8, n_head_kv=1, head_dim=256, n_ff=16384,
                      n_vocab=256000, qtype=qtype)


def llama3_8b(qtype: str = "q5_0") -> ModelSpec:
    """Llama 3 8B's published shapes (32 layers, 4096 wide, 32 heads of 128, 8 KV heads, FFN 14336)."""
    return dense_spec("llama-3-8b", n_layers=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336,
                      n_vocab=128256, qtype=qtype)


def sweep_settings(n_ubatch: int, n_ctx: int) -> EngineConfig:
    """llama-bench's settings for one point of a ``-ub`` sweep: everything on the GPU, FA, ``-b`` = the prompt."""
    return EngineConfig(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ubatch, flash_attn=True, gpu_layers=-1, mmap=False,
                        tuned=False)


def sweep_estimates(spec: ModelSpec, hw: HardwareProfile, sweep, n_tokens: int) -> list[float]:
    return [prefill_speed(spec, sweep_settings(u, n_tokens), hw, n_tokens).tokens_per_s for u, _ in sweep]


def shape_error(estimates: list[float], sweep) -> float:
    """How far a sweep's estimates are from its measurements up to one common factor (RMS of log ratios)."""
    logs = [math.log(e) - math.log(m) for e, (_, m) in zip(estimates, sweep)]
    mean = statistics.fmean(logs)
    return math.sqrt(statistics.fmean([(x - mean) ** 2 for x in logs]))


def solve_recipe(hw: HardwareProfile) -> HardwareProfile:
    """``hw`` with the GPU FLOP/s and pinned bandwidth that reproduce :data:`RECIPE_3090` exactly (its curve kept).

    Each prefill's seconds are ``a / flops + b / bandwidth + c``: two measurements, two unknowns.
    """
    spec = ModelSpec.qwen36_35b_a3b("Q6_K")
    f0, b0 = 1e12, 1e9
    probe = replace(hw, gpu_flops=f0, h2d_pinned=b0, h2d_pageable=b0 / 2)
    rows = []
    for s, (_, measured) in zip((baseline_plan(spec, probe, 65536), recipe_plan(65536)), RECIPE_3090):
        sec = prefill_speed(spec, s, replace(probe, gpu_layer_overhead=0.0)).seconds
        over = prefill_speed(spec, s, probe).seconds["gpu"] - sec["gpu"]
        rows.append((sec["gpu"] * f0, sec["copy"] * b0, sec["cpu"] + over, 65536 / measured))
    (a1, b1, c1, t1), (a2, b2, c2, t2) = rows
    det = a1 * b2 - a2 * b1
    x = ((t1 - c1) * b2 - (t2 - c2) * b1) / det  # 1 / flops
    y = (a1 * (t2 - c2) - a2 * (t1 - c1)) / det  # 1 / bandwidth
    bw = 1 / y
    return replace(hw, gpu_flops=1 / x, h2d_pinned=bw, h2d_pageable=bw / 2)


def fit_rtx3090(base: HardwareProfile) -> tuple[HardwareProfile, float]:
    """The curve that best fits the Gemma sweep's shape, then FLOP/s and bandwidth from the recipe.

    Returns the profile and the sweep's shape error (RMS of log ratios).
    """
    spec = gemma_2b()
    best: tuple[float, HardwareProfile] | None = None
    for half10 in range(100, 3000, 10):  # 10 .. 300 tokens
        trial = replace(base, gpu_ubatch_half=half10 / 10, gpu_ubatch_exp=UBATCH_EXP,
                        gpu_layer_overhead=GPU_LAYER_OVERHEAD)
        solved = solve_recipe(trial)
        err = shape_error(sweep_estimates(spec, solved, GEMMA_2B_F16_3090, 16384), GEMMA_2B_F16_3090)
        if best is None or err < best[0]:
            best = (err, solved)
    assert best is not None
    return best[1], best[0]


def main() -> int:
    from .hardware import PROFILES

    fitted, err = fit_rtx3090(PROFILES["rtx3090"])
    print(f"rtx3090: gpu_flops={fitted.gpu_flops:.4g} h2d_pinned={fitted.h2d_pinned:.4g} "
          f"gpu_ubatch_half={fitted.gpu_ubatch_half:g} gpu_ubatch_exp={fitted.gpu_ubatch_exp:g} "
          f"gpu_layer_overhead={fitted.gpu_layer_overhead:g}; Gemma sweep shape error {err:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
