"""A generated ``qwen3moe``: attention in every layer, routed experts, no shared expert (Qwen3-30B-A3B's layout)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from .vocab import resolve_vocab
from .writer import Tensor, attention_hparams, check_moe, common_hparams, moe_hparams, positive, write_gguf


def moe_tensor_shapes(
    *, n_layers: int, n_embd: int, n_head: int, n_head_kv: int, head_dim: int,
    n_experts: int, expert_ff: int, n_vocab: int,
) -> list[tuple[str, tuple[int, ...]]]:
    """Names and numpy-order shapes of every tensor of a qwen3moe model, in file order."""
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, n_embd))]
    for i in range(n_layers):
        p = f"blk.{i}."
        shapes += [
            (p + "attn_norm.weight", (n_embd,)),
            (p + "attn_q.weight", (n_head * head_dim, n_embd)),
            (p + "attn_k.weight", (n_head_kv * head_dim, n_embd)),
            (p + "attn_v.weight", (n_head_kv * head_dim, n_embd)),
            (p + "attn_output.weight", (n_embd, n_head * head_dim)),
            (p + "attn_q_norm.weight", (head_dim,)),
            (p + "attn_k_norm.weight", (head_dim,)),
            (p + "ffn_norm.weight", (n_embd,)),
            (p + "ffn_gate_inp.weight", (n_experts, n_embd)),
            (p + "ffn_gate_exps.weight", (n_experts, expert_ff, n_embd)),
            (p + "ffn_up_exps.weight", (n_experts, expert_ff, n_embd)),
            (p + "ffn_down_exps.weight", (n_experts, n_embd, expert_ff)),
        ]
    shapes += [("output_norm.weight", (n_embd,)), ("output.weight", (n_vocab, n_embd))]
    return shapes


def _write(path: str | os.PathLike[str], *, name: str, fill: str, dtype: str, n_layers: int = 4, n_embd: int = 64,
           n_head: int = 4, n_head_kv: int = 2, head_dim: int = 16, n_experts: int = 8, n_experts_used: int = 2,
           expert_ff: int = 32, n_ctx_train: int = 65536, vocab: str | int = "bytes", seed: int = 0) -> Path:
    positive(n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
             n_experts=n_experts, n_experts_used=n_experts_used, expert_ff=expert_ff, n_ctx_train=n_ctx_train)
    check_moe(n_head=n_head, n_head_kv=n_head_kv, n_experts=n_experts, n_experts_used=n_experts_used)
    tokens, types, merges = resolve_vocab(vocab, "chatml")
    shapes = moe_tensor_shapes(n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                               head_dim=head_dim, n_experts=n_experts, expert_ff=expert_ff, n_vocab=len(tokens))
    hparams = {**common_hparams(n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers),
               **attention_hparams(n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim),
               **moe_hparams(n_experts=n_experts, n_experts_used=n_experts_used, expert_ff=expert_ff)}
    return write_gguf(path, arch="qwen3moe", name=name, hparams=hparams,
                      tensors=[Tensor(n, s) for n, s in shapes], vocab=(tokens, types, merges), family="chatml",
                      fill=fill, dtype=dtype, seed=seed)


#: The shape keywords of the qwen3moe writers (the defaults make a ~1 MB model with a 64K trained context).
SHAPE_KEYWORDS = ("n_layers", "n_embd", "n_head", "n_head_kv", "head_dim", "n_experts", "n_experts_used",
                  "expert_ff", "n_ctx_train", "vocab", "seed")


def write_moe_model(path: str | os.PathLike[str], *, arch: str = "qwen3moe", zero: bool = False, dtype: str = "f32",
                    **shape: Any) -> Path:
    """Write a generated ``qwen3moe`` GGUF model to ``path`` (atomically) and return the path.

    ``shape``: ``n_layers`` (4), ``n_embd`` (64), ``n_head`` (4), ``n_head_kv`` (2),
    ``head_dim`` (16), ``n_experts`` (8), ``n_experts_used`` (2), ``expert_ff`` (32),
    ``n_ctx_train`` (65536), ``vocab`` (``"bytes"``: 262 tokens, or a size to pad the
    byte vocabulary to) and ``seed`` (0). Weights are small random values from ``seed``,
    or zeros with ``zero=True`` (norms stay ones); ``dtype`` ("f32" or "f16") is the type
    of the matrices, norms and router are always f32.
    """
    if arch != "qwen3moe":
        raise ConfigError(f"write_moe_model writes qwen3moe, not {arch!r} (see devtools.synthetic.write_model).")
    if dtype not in ("f32", "f16"):
        raise ConfigError(f"dtype must be 'f32' or 'f16', not {dtype!r}.")
    return _write(path, name="synthetic-moe", fill="zero" if zero else "random", dtype=dtype, **_shape(shape))


def write_timing_moe_model(path: str | os.PathLike[str], *, qtype: str = "q8_0", **shape: Any) -> Path:
    """A timing-only qwen3moe model with quantized (``q8_0``/``q4_0``) or ``f16`` zero matrices.

    Unlike ``write_moe_model(zero=True)``, routing still varies from token to token:
    the token embeddings (f16) and the routers (f32) are random, every other matrix is
    zero, so the residual stream stays the embedding and each token picks its own
    experts, as with a real model (this matters where llama.cpp copies only the
    experts a micro-batch uses). Sizes match a real model quantized to ``qtype``
    throughout; ``shape`` as :func:`write_moe_model`'s. Written atomically; returns the path.
    """
    if qtype not in ("q8_0", "q4_0", "f16"):
        raise ConfigError(f"qtype must be one of q8_0, q4_0, f16, not {qtype!r}.")
    return _write(path, name="synthetic-moe-timing", fill="timing", dtype=qtype, **_shape(shape))


def _shape(shape: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(shape) - set(SHAPE_KEYWORDS))
    if unknown:
        raise ConfigError(f"A qwen3moe model has no {', '.join(unknown)}.")
    return shape


__all__ = ["SHAPE_KEYWORDS", "moe_tensor_shapes", "write_moe_model", "write_timing_moe_model"]
