"""A generated ``gpt-oss``: OpenAI's open-weight MoE (gpt-oss-20b's layout, at any size).

Layers alternate sliding-window and full attention (llama.cpp's default pattern for the
architecture: even layers use the window), each attention head has a learned *sink*
(a logit every query attends to, ``attn_sinks``), Q/K/V and the output projection have
biases, and the routed experts have biases too (router included). YaRN extends RoPE
from a 4K original context, as in the real model. The vocabulary is byte-level with
the harmony format's control tokens and a harmony chat template.

The tensor set and keys are the ones llama.cpp's ``gpt-oss`` loader reads
(``src/models/openai-moe.cpp``).
"""

from __future__ import annotations

import os
from pathlib import Path

from .vocab import resolve_vocab
from .writer import Tensor, attention_hparams, check_moe, common_hparams, moe_hparams, positive, write_gguf


def gpt_oss_tensors(*, n_layers: int, n_embd: int, n_vocab: int, n_head: int, n_head_kv: int, head_dim: int,
                    n_experts: int, expert_ff: int) -> list[Tensor]:
    """Every tensor of a gpt-oss model, in file order."""
    q, kv = n_head * head_dim, n_head_kv * head_dim
    out = [Tensor("token_embd.weight", (n_vocab, n_embd))]
    for i in range(n_layers):
        p = f"blk.{i}."
        out += [
            Tensor(p + "attn_norm.weight", (n_embd,)), Tensor(p + "post_attention_norm.weight", (n_embd,)),
            Tensor(p + "attn_q.weight", (q, n_embd)), Tensor(p + "attn_q.bias", (q,)),
            Tensor(p + "attn_k.weight", (kv, n_embd)), Tensor(p + "attn_k.bias", (kv,)),
            Tensor(p + "attn_v.weight", (kv, n_embd)), Tensor(p + "attn_v.bias", (kv,)),
            Tensor(p + "attn_output.weight", (n_embd, q)), Tensor(p + "attn_output.bias", (n_embd,)),
            Tensor(p + "attn_sinks.weight", (n_head,)),
            Tensor(p + "ffn_gate_inp.weight", (n_experts, n_embd)), Tensor(p + "ffn_gate_inp.bias", (n_experts,)),
            Tensor(p + "ffn_gate_exps.weight", (n_experts, expert_ff, n_embd)),
            Tensor(p + "ffn_gate_exps.bias", (n_experts, expert_ff)),
            Tensor(p + "ffn_up_exps.weight", (n_experts, expert_ff, n_embd)),
            Tensor(p + "ffn_up_exps.bias", (n_experts, expert_ff)),
            Tensor(p + "ffn_down_exps.weight", (n_experts, n_embd, expert_ff)),
            Tensor(p + "ffn_down_exps.bias", (n_experts, n_embd)),
        ]
    return out + [Tensor("output_norm.weight", (n_embd,)), Tensor("output.weight", (n_vocab, n_embd))]


def write_gpt_oss_model(
    path: str | os.PathLike[str], *, n_layers: int = 4, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
    head_dim: int = 16, sliding_window: int = 128, n_experts: int = 8, n_experts_used: int = 2, expert_ff: int = 32,
    n_ctx_train: int = 65536, vocab: str | int = "bytes", seed: int = 0, fill: str = "random", dtype: str = "f32",
) -> Path:
    """Write a generated ``gpt-oss`` GGUF to ``path`` (atomically) and return the path.

    The defaults make a model of about 1 MB with gpt-oss's 128-token window; see
    :func:`devtools.synthetic.writer.write_gguf` for ``fill`` and ``dtype``.
    """
    positive(n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
             sliding_window=sliding_window, n_experts=n_experts, n_experts_used=n_experts_used,
             expert_ff=expert_ff, n_ctx_train=n_ctx_train)
    check_moe(n_head=n_head, n_head_kv=n_head_kv, n_experts=n_experts, n_experts_used=n_experts_used)
    tokens, types, merges = resolve_vocab(vocab, "harmony")
    original = min(4096, n_ctx_train)
    hparams = {
        **common_hparams(n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers),
        **attention_hparams(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, rope_base=150_000.0, eps=1e-5),
        "rope.dimension_count": head_dim, "attention.sliding_window": sliding_window,
        "rope.scaling.type": "yarn", "rope.scaling.factor": float(n_ctx_train / original),
        "rope.scaling.original_context_length": original,
        **moe_hparams(n_experts=n_experts, n_experts_used=n_experts_used, expert_ff=expert_ff),
    }
    tensors = gpt_oss_tensors(n_layers=n_layers, n_embd=n_embd, n_vocab=len(tokens), n_head=n_head,
                              n_head_kv=n_head_kv, head_dim=head_dim, n_experts=n_experts, expert_ff=expert_ff)
    return write_gguf(path, arch="gpt-oss", name="synthetic-gpt-oss", hparams=hparams, tensors=tensors,
                      vocab=(tokens, types, merges), family="harmony", fill=fill, dtype=dtype, seed=seed)


__all__ = ["gpt_oss_tensors", "write_gpt_oss_model"]
