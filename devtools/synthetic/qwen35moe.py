"""A generated ``qwen35moe``: Qwen3.5/3.6's hybrid MoE (Qwen3.6-35B-A3B's layout, at any size).

Every ``full_attention_interval``-th layer is gated attention (a query projection twice
the heads wide: queries and their output gate, Q/K norms, partial rotary embedding in
sections, few KV heads); the others are Gated DeltaNet layers (a fused QKV projection
and an output gate ``z``, a short causal convolution, per-head decay ``ssm_a`` and
time step ``ssm_dt``, ``beta``/``alpha`` projections, a gated RMS norm, ``ssm_out``),
which keep a fixed-size recurrent state per sequence instead of a KV cache. Every layer
has routed experts and one shared expert with its sigmoid gate.

The tensor set and the hyperparameter keys are the ones llama.cpp's ``qwen35moe``
loader reads (``src/models/qwen35moe.cpp``): the SSM keys give the DeltaNet shapes,
``ssm.state_size`` the head size of keys and values, ``ssm.group_count`` the
key heads, ``ssm.time_step_rank`` the value heads and ``ssm.inner_size`` their width.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import ConfigError
from .vocab import resolve_vocab
from .writer import Tensor, attention_hparams, check_moe, common_hparams, moe_hparams, positive, write_gguf


def _attention(p: str, *, n_embd: int, n_head: int, n_head_kv: int, head_dim: int) -> list[Tensor]:
    return [Tensor(p + "attn_q.weight", (2 * n_head * head_dim, n_embd)),  # queries and their gate
            Tensor(p + "attn_k.weight", (n_head_kv * head_dim, n_embd)),
            Tensor(p + "attn_v.weight", (n_head_kv * head_dim, n_embd)),
            Tensor(p + "attn_output.weight", (n_embd, n_head * head_dim)),
            Tensor(p + "attn_q_norm.weight", (head_dim,)), Tensor(p + "attn_k_norm.weight", (head_dim,))]


def _delta_net(p: str, *, n_embd: int, d_conv: int, d_state: int, n_group: int, dt_rank: int) -> list[Tensor]:
    value_dim = d_state * dt_rank
    conv_dim = 2 * d_state * n_group + value_dim
    return [Tensor(p + "attn_qkv.weight", (conv_dim, n_embd)),
            Tensor(p + "attn_gate.weight", (value_dim, n_embd)),
            Tensor(p + "ssm_conv1d.weight", (conv_dim, d_conv)),
            Tensor(p + "ssm_dt.bias", (dt_rank,)),
            Tensor(p + "ssm_a", (dt_rank,), init="negative"),
            Tensor(p + "ssm_beta.weight", (dt_rank, n_embd)),
            Tensor(p + "ssm_alpha.weight", (dt_rank, n_embd)),
            Tensor(p + "ssm_norm.weight", (d_state,)),
            Tensor(p + "ssm_out.weight", (n_embd, value_dim))]


def _moe(p: str, *, n_embd: int, n_experts: int, expert_ff: int, shared_ff: int) -> list[Tensor]:
    return [Tensor(p + "ffn_gate_inp.weight", (n_experts, n_embd)),
            Tensor(p + "ffn_gate_exps.weight", (n_experts, expert_ff, n_embd)),
            Tensor(p + "ffn_up_exps.weight", (n_experts, expert_ff, n_embd)),
            Tensor(p + "ffn_down_exps.weight", (n_experts, n_embd, expert_ff)),
            Tensor(p + "ffn_gate_inp_shexp.weight", (n_embd,)),  # the shared expert's gate
            Tensor(p + "ffn_gate_shexp.weight", (shared_ff, n_embd)),
            Tensor(p + "ffn_up_shexp.weight", (shared_ff, n_embd)),
            Tensor(p + "ffn_down_shexp.weight", (n_embd, shared_ff))]


def hybrid_tensors(*, n_layers: int, n_embd: int, n_vocab: int, interval: int, n_head: int, n_head_kv: int,
                   head_dim: int, d_conv: int, d_state: int, n_group: int, dt_rank: int, n_experts: int,
                   expert_ff: int, shared_ff: int) -> list[Tensor]:
    """Every tensor of a qwen35moe model, in file order."""
    out = [Tensor("token_embd.weight", (n_vocab, n_embd))]
    for i in range(n_layers):
        p = f"blk.{i}."
        out += [Tensor(p + "attn_norm.weight", (n_embd,)), Tensor(p + "post_attention_norm.weight", (n_embd,))]
        if (i + 1) % interval == 0:
            out += _attention(p, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim)
        else:
            out += _delta_net(p, n_embd=n_embd, d_conv=d_conv, d_state=d_state, n_group=n_group, dt_rank=dt_rank)
        out += _moe(p, n_embd=n_embd, n_experts=n_experts, expert_ff=expert_ff, shared_ff=shared_ff)
    return out + [Tensor("output_norm.weight", (n_embd,)), Tensor("output.weight", (n_vocab, n_embd))]


def hybrid_hparams(*, n_ctx_train: int, n_embd: int, n_layers: int, interval: int, n_head: int, n_head_kv: int,
                   head_dim: int, rope_dim: int, d_conv: int, d_state: int, n_group: int, dt_rank: int,
                   n_experts: int, n_experts_used: int, expert_ff: int, shared_ff: int) -> dict:
    """The qwen35moe hyperparameter keys (below ``qwen35moe.``), as llama.cpp's loader reads them."""
    return {
        **common_hparams(n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers),
        **attention_hparams(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, rope_base=10_000_000.0),
        "rope.dimension_count": rope_dim, "rope.dimension_sections": rope_sections(rope_dim),
        **moe_hparams(n_experts=n_experts, n_experts_used=n_experts_used, expert_ff=expert_ff),
        "expert_shared_feed_forward_length": shared_ff,
        "ssm.conv_kernel": d_conv, "ssm.state_size": d_state, "ssm.group_count": n_group,
        "ssm.time_step_rank": dt_rank, "ssm.inner_size": d_state * dt_rank, "full_attention_interval": interval,
    }


def rope_sections(rope_dim: int) -> list[int]:
    """Multi-section RoPE split of ``rope_dim / 2`` rotated pairs, in Qwen3.5's proportions (11, 11, 10, 0 of 32)."""
    pairs = rope_dim // 2
    a = round(pairs * 11 / 32)
    return [a, a, pairs - 2 * a, 0]


def write_hybrid_model(
    path: str | os.PathLike[str], *, n_layers: int = 4, n_embd: int = 64, full_attention_interval: int = 4,
    n_head: int = 4, n_head_kv: int = 2, head_dim: int = 16, rope_dim: int = 8, ssm_conv_kernel: int = 4,
    ssm_state_size: int = 16, ssm_group_count: int = 2, ssm_time_step_rank: int = 4, n_experts: int = 8,
    n_experts_used: int = 2, expert_ff: int = 32, shared_ff: int = 32, n_ctx_train: int = 65536,
    vocab: str | int = "bytes", seed: int = 0, fill: str = "random", dtype: str = "f32",
) -> Path:
    """Write a generated ``qwen35moe`` GGUF to ``path`` (atomically) and return the path.

    The defaults (about 1 MB) keep Qwen3.6-35B-A3B's proportions: three DeltaNet layers to
    one attention layer, twice as many value heads as key heads, a quarter of the
    attention head rotated, a shared expert as wide as a routed one. See
    :func:`devtools.synthetic.writer.write_gguf` for ``fill`` and ``dtype``.
    """
    positive(n_layers=n_layers, n_embd=n_embd, full_attention_interval=full_attention_interval, n_head=n_head,
             n_head_kv=n_head_kv, head_dim=head_dim, rope_dim=rope_dim, ssm_conv_kernel=ssm_conv_kernel,
             ssm_state_size=ssm_state_size, ssm_group_count=ssm_group_count, ssm_time_step_rank=ssm_time_step_rank,
             n_experts=n_experts, n_experts_used=n_experts_used, expert_ff=expert_ff, shared_ff=shared_ff,
             n_ctx_train=n_ctx_train)
    check_moe(n_head=n_head, n_head_kv=n_head_kv, n_experts=n_experts, n_experts_used=n_experts_used)
    if ssm_time_step_rank % ssm_group_count:
        raise ConfigError(f"ssm_time_step_rank (value heads, {ssm_time_step_rank}) must be a multiple of "
                          f"ssm_group_count (key heads, {ssm_group_count}).")
    if rope_dim > head_dim or rope_dim % 2:
        raise ConfigError(f"rope_dim ({rope_dim}) must be even and at most head_dim ({head_dim}).")
    tokens, types, merges = resolve_vocab(vocab, "chatml")
    hparams = hybrid_hparams(n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers,
                             interval=full_attention_interval, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                             rope_dim=rope_dim, d_conv=ssm_conv_kernel, d_state=ssm_state_size,
                             n_group=ssm_group_count, dt_rank=ssm_time_step_rank, n_experts=n_experts,
                             n_experts_used=n_experts_used, expert_ff=expert_ff, shared_ff=shared_ff)
    tensors = hybrid_tensors(n_layers=n_layers, n_embd=n_embd, n_vocab=len(tokens), interval=full_attention_interval,
                             n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, d_conv=ssm_conv_kernel,
                             d_state=ssm_state_size, n_group=ssm_group_count, dt_rank=ssm_time_step_rank,
                             n_experts=n_experts, expert_ff=expert_ff, shared_ff=shared_ff)
    return write_gguf(path, arch="qwen35moe", name="synthetic-hybrid-moe", hparams=hparams, tensors=tensors,
                      vocab=(tokens, types, merges), family="chatml", fill=fill, dtype=dtype, seed=seed)


__all__ = ["hybrid_hparams", "hybrid_tensors", "rope_sections", "write_hybrid_model"]
