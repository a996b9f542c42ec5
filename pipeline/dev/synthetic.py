"""Tiny generated GGUF models, for tests and benchmarks.

:func:`write_moe_model` writes a ``qwen3moe`` mixture-of-experts model with random
(or zero) weights that llama.cpp loads and generates with: a byte-level ``gpt2``
vocabulary, a ChatML chat template, and every tensor of the real architecture, so
expert-offload patterns, KV cache sizes and compute buffers behave as they would
for a real model of the same shapes. The text it generates is noise.

The defaults make a ~1 MB model. The shapes are parameters, so a benchmark can
write a timing-only model with a real model's shapes (``zero=True``,
``dtype="f16"``); tensors are generated and written one at a time, so memory use
stays at about one tensor even for a model of tens of gigabytes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import ConfigError

_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# At least one merge is required: llama.cpp refuses a gpt2 vocabulary without merges.
_MERGES = ("Ġ t", "h e", "i n")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# gguf token types (llama_token_type)
_NORMAL, _CONTROL, _UNUSED = 1, 3, 5


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: one printable character per byte value."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    table = {}
    extra = 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def byte_vocab(size: int | None = None) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of the byte-level vocabulary.

    256 byte tokens, one token per merge, then the special tokens; ``size`` pads
    with unused filler tokens up to that many (to give the output head a real size).
    """
    tokens = _byte_tokens()
    types = [_NORMAL] * len(tokens)
    for merge in _MERGES:
        tokens.append(merge.replace(" ", ""))
        types.append(_NORMAL)
    for special in _SPECIAL_TOKENS:
        tokens.append(special)
        types.append(_CONTROL)
    if size is not None:
        if size < len(tokens):
            raise ConfigError(f"The byte vocabulary needs at least {len(tokens)} tokens (asked for {size}).")
        for i in range(size - len(tokens)):
            tokens.append(f"<|filler_{i}|>")
            types.append(_UNUSED)
    return tokens, types, list(_MERGES)


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


def _is_norm(name: str) -> bool:
    return name.endswith("norm.weight")


def _tensor_dtype(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.dtype:
    # Norms (1-D) and the router stay f32, as llama.cpp's converter keeps them.
    if len(shape) == 1 or ".ffn_gate_inp." in name:
        return np.dtype(np.float32)
    return dtype


def _add_tokenizer(writer, tokens: list[str], types: list[int], merges: list[str]) -> None:
    """The byte-level ``gpt2`` vocabulary, its special tokens and a ChatML template."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)


def _add_moe_hparams(writer, *, n_ctx_train: int, n_embd: int, n_layers: int, expert_ff: int, n_head: int,
                     n_head_kv: int, head_dim: int, n_experts: int, n_experts_used: int) -> None:
    """The qwen3moe hyperparameters."""
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(expert_ff)
    writer.add_expert_feed_forward_length(expert_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_expert_count(n_experts)
    writer.add_expert_used_count(n_experts_used)


def write_moe_model(
    path: str | os.PathLike[str],
    *,
    arch: str = "qwen3moe",
    n_layers: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_experts: int = 8,
    n_experts_used: int = 2,
    expert_ff: int = 32,
    n_ctx_train: int = 65536,
    vocab: str | int = "bytes",
    seed: int = 0,
    zero: bool = False,
    dtype: str = "f32",
) -> Path:
    """Write a generated mixture-of-experts GGUF model to ``path`` (atomically) and return the path.

    ``vocab`` is ``"bytes"`` (262 tokens) or a vocabulary size to pad the byte
    vocabulary to. Weights are small random values from ``seed``, or zeros with
    ``zero=True`` (norms stay ones); ``dtype`` ("f32" or "f16") is the type of the
    matrices, norms and router are always f32.
    """
    import gguf  # the writer is only needed here

    if arch != "qwen3moe":
        raise ConfigError(f"Only the qwen3moe architecture can be generated, not {arch!r}.")
    if dtype not in ("f32", "f16"):
        raise ConfigError(f"dtype must be 'f32' or 'f16', not {dtype!r}.")
    for key, value in dict(
        n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_experts=n_experts, n_experts_used=n_experts_used, expert_ff=expert_ff, n_ctx_train=n_ctx_train,
    ).items():
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, not {value!r}.")
    if n_head % n_head_kv:
        raise ConfigError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv}).")
    if n_experts_used > n_experts:
        raise ConfigError(f"n_experts_used ({n_experts_used}) cannot exceed n_experts ({n_experts}).")
    if vocab == "bytes":
        tokens, types, merges = byte_vocab()
    elif isinstance(vocab, int) and not isinstance(vocab, bool):
        tokens, types, merges = byte_vocab(vocab)
    else:
        raise ConfigError(f"vocab must be 'bytes' or a vocabulary size, not {vocab!r}.")

    np_dtype = np.dtype(np.float16 if dtype == "f16" else np.float32)
    shapes = moe_tensor_shapes(
        n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_experts=n_experts, expert_ff=expert_ff, n_vocab=len(tokens),
    )
    rng = np.random.default_rng(seed)

    def make(name: str, shape: tuple[int, ...]) -> np.ndarray:
        dt = _tensor_dtype(name, shape, np_dtype)
        if _is_norm(name):
            return np.ones(shape, dtype=dt)
        if zero:
            return np.zeros(shape, dtype=dt)
        # Scale by 1/sqrt(fan_in) so activations stay in a sane range at any size.
        scale = 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dt, copy=False)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            writer.add_name("synthetic-moe")
            _add_moe_hparams(writer, n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers,
                             expert_ff=expert_ff, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                             n_experts=n_experts, n_experts_used=n_experts_used)
            writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)

            _add_tokenizer(writer, tokens, types, merges)

            # Stream: declare every tensor, write the header, then generate and
            # write the tensors one by one so only one is ever in memory.
            for name, shape in shapes:
                dt = _tensor_dtype(name, shape, np_dtype)
                writer.add_tensor_info(name, shape, dt, int(np.prod(shape)) * dt.itemsize)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for name, shape in shapes:
                writer.write_tensor_data(make(name, shape))
        finally:
            writer.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def tensor_names(path: str | os.PathLike[str]) -> list[str]:
    """The tensor names of a GGUF file, in file order (read with ``gguf.GGUFReader``)."""
    import gguf

    return [t.name for t in gguf.GGUFReader(path).tensors]



def write_timing_moe_model(
    path: str | os.PathLike[str],
    *,
    qtype: str = "q8_0",
    n_layers: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    head_dim: int = 16,
    n_experts: int = 8,
    n_experts_used: int = 2,
    expert_ff: int = 32,
    n_ctx_train: int = 65536,
    vocab: str | int = "bytes",
    seed: int = 0,
) -> Path:
    """A timing-only qwen3moe model with quantized (``q8_0``/``q4_0``) or ``f16`` zero matrices.

    Unlike ``write_moe_model(zero=True)``, routing still varies from token to token:
    the token embeddings (f16) and the routers (f32) are random, every other matrix is
    zero (a zero q8_0/q4_0 block is all zero bytes), so the residual stream stays the
    embedding and each token picks its own experts, as with a real model (this matters
    where llama.cpp copies only the experts a micro-batch uses). Sizes match a real
    model quantized to ``qtype`` throughout. Written atomically; returns the path.
    """
    import gguf

    qtypes = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
              "f16": gguf.GGMLQuantizationType.F16}
    if qtype not in qtypes:
        raise ConfigError(f"qtype must be one of {', '.join(qtypes)}, not {qtype!r}.")
    block, type_size = gguf.GGML_QUANT_SIZES[qtypes[qtype]]
    if n_embd % block or expert_ff % block or (n_head * head_dim) % block:
        raise ConfigError(f"{qtype} needs every matrix row to be a multiple of {block} values.")
    tokens, types, merges = byte_vocab() if vocab == "bytes" else byte_vocab(int(vocab))
    shapes = moe_tensor_shapes(
        n_layers=n_layers, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
        n_experts=n_experts, expert_ff=expert_ff, n_vocab=len(tokens),
    )
    rng = np.random.default_rng(seed)

    def kind(name: str, shape: tuple[int, ...]) -> str:
        if len(shape) == 1 or ".ffn_gate_inp." in name:
            return "f32"
        if name == "token_embd.weight":
            return "f16"
        return qtype

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer = gguf.GGUFWriter(tmp, "qwen3moe")
        try:
            writer.add_name("synthetic-moe-timing")
            _add_moe_hparams(writer, n_ctx_train=n_ctx_train, n_embd=n_embd, n_layers=n_layers,
                             expert_ff=expert_ff, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                             n_experts=n_experts, n_experts_used=n_experts_used)
            _add_tokenizer(writer, tokens, types, merges)
            for name, shape in shapes:
                k = kind(name, shape)
                if k == "f32":
                    writer.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
                elif k == "f16" or qtype == "f16":
                    writer.add_tensor_info(name, shape, np.dtype(np.float16), int(np.prod(shape)) * 2)
                else:
                    byte_shape = (*shape[:-1], shape[-1] // block * type_size)
                    writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                                           raw_dtype=qtypes[qtype])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for name, shape in shapes:
                k = kind(name, shape)
                if name.endswith("norm.weight"):
                    data = np.ones(shape, dtype=np.float32)
                elif k == "f32":
                    data = (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)
                elif name == "token_embd.weight":
                    data = rng.standard_normal(shape, dtype=np.float32).astype(np.float16)
                elif qtype == "f16":
                    data = np.zeros(shape, dtype=np.float16)
                else:
                    data = np.zeros((*shape[:-1], shape[-1] // block * type_size), dtype=np.uint8)
                writer.write_tensor_data(data)
        finally:
            writer.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


__all__ = ["CHATML_TEMPLATE", "byte_vocab", "moe_tensor_shapes", "tensor_names", "write_mamba_model",
           "write_moe_model", "write_timing_moe_model"]


def write_mamba_model(path: str | os.PathLike[str], *, n_layers: int = 2, n_embd: int = 64, d_inner: int = 128,
                      d_state: int = 16, d_conv: int = 4, dt_rank: int = 8, n_ctx_train: int = 65536,
                      seed: int = 0) -> Path:
    """Write a tiny generated ``mamba`` (recurrent, no KV cache) GGUF to ``path`` and return the path.

    A model whose memory is a per-sequence state that cannot be cut at an earlier
    position: what the prefix cache must restore exactly at a prefix boundary.
    """
    import gguf

    tokens, types, merges = byte_vocab()
    rng = np.random.default_rng(seed)
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (len(tokens), n_embd))]
    for i in range(n_layers):
        p = f"blk.{i}."
        shapes += [(p + "attn_norm.weight", (n_embd,)), (p + "ssm_in.weight", (2 * d_inner, n_embd)),
                   (p + "ssm_conv1d.weight", (d_inner, d_conv)), (p + "ssm_conv1d.bias", (d_inner,)),
                   (p + "ssm_x.weight", (dt_rank + 2 * d_state, d_inner)), (p + "ssm_dt.weight", (d_inner, dt_rank)),
                   (p + "ssm_dt.bias", (d_inner,)), (p + "ssm_a", (d_inner, d_state)), (p + "ssm_d", (d_inner,)),
                   (p + "ssm_out.weight", (n_embd, d_inner))]
    shapes += [("output_norm.weight", (n_embd,)), ("output.weight", (len(tokens), n_embd))]

    def make(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        if name.endswith("ssm_a"):  # A = -exp(A_log): negative for a stable recurrence
            return -np.exp(rng.standard_normal(shape).astype(np.float32) * 0.5)
        return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer = gguf.GGUFWriter(tmp, "mamba")
        try:
            writer.add_name("synthetic-mamba")
            writer.add_context_length(n_ctx_train)
            writer.add_embedding_length(n_embd)
            writer.add_block_count(n_layers)
            writer.add_feed_forward_length(0)
            writer.add_head_count(0)
            writer.add_ssm_conv_kernel(d_conv)
            writer.add_ssm_inner_size(d_inner)
            writer.add_ssm_state_size(d_state)
            writer.add_ssm_time_step_rank(dt_rank)
            writer.add_layer_norm_rms_eps(1e-5)
            writer.add_file_type(gguf.LlamaFileType.ALL_F32)
            _add_tokenizer(writer, tokens, types, merges)
            for name, shape in shapes:
                writer.add_tensor(name, make(name, shape))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
