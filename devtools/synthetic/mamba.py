"""A generated ``mamba``: a purely recurrent model, no KV cache at all."""

from __future__ import annotations

import os
from pathlib import Path

from .vocab import resolve_vocab
from .writer import Tensor, common_hparams, positive, write_gguf


def mamba_tensors(*, n_layers: int, n_embd: int, n_vocab: int, d_inner: int, d_state: int, d_conv: int,
                  dt_rank: int) -> list[Tensor]:
    """Every tensor of a mamba model, in file order."""
    out = [Tensor("token_embd.weight", (n_vocab, n_embd))]
    for i in range(n_layers):
        p = f"blk.{i}."
        out += [Tensor(p + "attn_norm.weight", (n_embd,)), Tensor(p + "ssm_in.weight", (2 * d_inner, n_embd)),
                Tensor(p + "ssm_conv1d.weight", (d_inner, d_conv)), Tensor(p + "ssm_conv1d.bias", (d_inner,)),
                Tensor(p + "ssm_x.weight", (dt_rank + 2 * d_state, d_inner)),
                Tensor(p + "ssm_dt.weight", (d_inner, dt_rank)), Tensor(p + "ssm_dt.bias", (d_inner,)),
                Tensor(p + "ssm_a", (d_inner, d_state), init="negative"), Tensor(p + "ssm_d", (d_inner,)),
                Tensor(p + "ssm_out.weight", (n_embd, d_inner))]
    return out + [Tensor("output_norm.weight", (n_embd,)), Tensor("output.weight", (n_vocab, n_embd))]


def write_mamba_model(path: str | os.PathLike[str], *, n_layers: int = 2, n_embd: int = 64, d_inner: int = 128,
                      d_state: int = 16, d_conv: int = 4, dt_rank: int = 8, n_ctx_train: int = 65536,
                      vocab: str | int = "bytes", seed: int = 0, fill: str = "random",
                      dtype: str = "f32") -> Path:
    """Write a tiny generated ``mamba`` (recurrent, no KV cache) GGUF to ``path`` and return the path.

    A model whose memory is a per-sequence state that cannot be cut at an earlier
    position: what the prefix cache must restore exactly at a prefix boundary.
    """
    positive(n_layers=n_layers, n_embd=n_embd, d_inner=d_inner, d_state=d_state, d_conv=d_conv, dt_rank=dt_rank,
             n_ctx_train=n_ctx_train)
    tokens, types, merges = resolve_vocab(vocab, "chatml")
    hparams = {**common_hparams(n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers),
               "feed_forward_length": 0, "attention.head_count": 0, "ssm.conv_kernel": d_conv,
               "ssm.inner_size": d_inner, "ssm.state_size": d_state, "ssm.time_step_rank": dt_rank,
               "attention.layer_norm_rms_epsilon": 1e-5}
    tensors = mamba_tensors(n_layers=n_layers, n_embd=n_embd, n_vocab=len(tokens), d_inner=d_inner,
                            d_state=d_state, d_conv=d_conv, dt_rank=dt_rank)
    return write_gguf(path, arch="mamba", name="synthetic-mamba", hparams=hparams, tensors=tensors,
                      vocab=(tokens, types, merges), family="chatml", fill=fill, dtype=dtype, seed=seed)


__all__ = ["mamba_tensors", "write_mamba_model"]
