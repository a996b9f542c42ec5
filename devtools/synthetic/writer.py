"""The one GGUF writer behind every generated model: hyperparameters, tokenizer, tensors, streamed.

An architecture module (:mod:`.qwen3moe`, :mod:`.qwen35moe`, :mod:`.gpt_oss`, :mod:`.mamba`)
says *what* its model holds (a dict of hyperparameter keys and a list of
:class:`Tensor`); :func:`write_gguf` writes it: keys typed from their Python values,
the tokenizer of :mod:`.vocab`, and the tensors generated and written one at a time,
so memory use stays at about one tensor even for a model of tens of gigabytes. The
file appears atomically (written beside it, then renamed).

Weights (``fill``):

* ``"random"``: small normal values scaled by ``1/sqrt(fan_in)``, norms ones, decay
  parameters (``init="negative"``) negative, as a stable recurrence needs;
* ``"zero"``: zeros, norms ones (a timing-only model whose every token routes alike);
* ``"timing"``: zero matrices at ``dtype`` (a zero ``q8_0``/``q4_0`` block is all zero
  bytes) but random token embeddings (f16), routers and other f32 vectors, so each
  token still picks its own experts, as with a real model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.errors import ConfigError
from .vocab import add_tokenizer

#: Matrix types a generated model can have.
DTYPES = ("f32", "f16", "q8_0", "q4_0")
FILLS = ("random", "zero", "timing")


@dataclass(frozen=True)
class Tensor:
    """One tensor of a generated model: its GGUF name, numpy-order shape and how to fill it."""

    name: str
    shape: tuple[int, ...]
    init: str = ""  # "ones", "negative", "normal"; "" derives it from the name

    @property
    def kind(self) -> str:
        if self.init:
            return self.init
        return "ones" if self.name.endswith("norm.weight") else "normal"

    @property
    def always_f32(self) -> bool:
        """Vectors, biases, routers and conv kernels stay f32, as llama.cpp's converters keep them."""
        return (len(self.shape) == 1 or self.name.endswith((".bias", ".ssm_a", ".ssm_d"))
                or ".ffn_gate_inp." in self.name or ".ssm_conv1d." in self.name)


def positive(**values: Any) -> None:
    """Refuse any value that is not a positive integer, naming it."""
    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{key} must be a positive integer, not {value!r}.")


def _qtypes():
    import gguf

    return {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def _file_type(dtype: str):
    import gguf

    return {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}[dtype]


def tensor_type(t: Tensor, dtype: str, fill: str) -> str:
    """The ggml type ``t`` is written in."""
    if t.always_f32:
        return "f32"
    if t.name == "token_embd.weight" and fill == "timing" and dtype not in ("f32", "f16"):
        return "f16"
    return dtype


def _add_key(writer, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)):
        writer.add_array(key, list(value))
    else:
        raise TypeError(f"no GGUF type for {key} = {value!r}")


class _Filler:
    """Makes each tensor's data for one ``fill`` mode, from one random generator."""

    def __init__(self, fill: str, dtype: str, seed: int):
        self.fill, self.dtype = fill, dtype
        self.rng = np.random.default_rng(seed)

    def _normal(self, shape: tuple[int, ...]) -> np.ndarray:
        # Scale by 1/sqrt(fan_in) so activations stay in a sane range at any size.
        return self.rng.standard_normal(shape, dtype=np.float32) * (1.0 / np.sqrt(shape[-1]))

    def make(self, t: Tensor, ttype: str) -> np.ndarray:
        if ttype in _qtypes():
            import gguf

            block, size = gguf.GGML_QUANT_SIZES[_qtypes()[ttype]]
            return np.zeros((*t.shape[:-1], t.shape[-1] // block * size), dtype=np.uint8)
        np_type = np.float16 if ttype == "f16" else np.float32
        if t.kind == "ones":
            return np.ones(t.shape, dtype=np_type)
        random = self.fill == "random" or (self.fill == "timing" and (ttype == "f32" or t.name == "token_embd.weight"))
        if not random:
            return np.zeros(t.shape, dtype=np_type)
        if t.kind == "negative":  # A = -exp(A_log): negative for a stable recurrence
            return (-np.exp(self.rng.standard_normal(t.shape).astype(np.float32) * 0.5)).astype(np_type)
        if t.name == "token_embd.weight" and self.fill == "timing":
            return self.rng.standard_normal(t.shape, dtype=np.float32).astype(np_type)
        return self._normal(t.shape).astype(np_type, copy=False)


def write_gguf(path: str | os.PathLike[str], *, arch: str, name: str, hparams: dict[str, Any],
               tensors: Sequence[Tensor], vocab: tuple[list[str], list[int], list[str]], family: str,
               fill: str = "random", dtype: str = "f32", seed: int = 0) -> Path:
    """Write a generated model to ``path`` (atomically) and return the path.

    ``hparams`` maps keys below the architecture (``"context_length"``,
    ``"ssm.conv_kernel"``...) to values: ``int`` is written as uint32, ``float`` as
    float32, lists as arrays, as llama.cpp's converters write them.
    """
    import gguf  # the writer is only needed here

    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}.")
    if fill not in FILLS:
        raise ConfigError(f"fill must be one of {', '.join(FILLS)}, not {fill!r}.")
    types = [tensor_type(t, dtype, fill) for t in tensors]
    for t, ttype in zip(tensors, types):
        if ttype in _qtypes() and t.shape[-1] % gguf.GGML_QUANT_SIZES[_qtypes()[ttype]][0]:
            raise ConfigError(f"{dtype} needs every matrix row to be a multiple of 32 values ({t.name}: {t.shape}).")
    filler = _Filler(fill, dtype, seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            writer.add_name(name)
            for key, value in hparams.items():
                _add_key(writer, f"{arch}.{key}", value)
            writer.add_file_type(_file_type(dtype))
            add_tokenizer(writer, *vocab, family)
            # Stream: declare every tensor, write the header, then generate and
            # write the tensors one by one so only one is ever in memory.
            for t, ttype in zip(tensors, types):
                if ttype in _qtypes():
                    block, size = gguf.GGML_QUANT_SIZES[_qtypes()[ttype]]
                    raw = (*t.shape[:-1], t.shape[-1] // block * size)
                    writer.add_tensor_info(t.name, raw, np.dtype(np.uint8), int(np.prod(raw)),
                                           raw_dtype=_qtypes()[ttype])
                else:
                    dt = np.dtype(np.float16 if ttype == "f16" else np.float32)
                    writer.add_tensor_info(t.name, t.shape, dt, int(np.prod(t.shape)) * dt.itemsize)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t, ttype in zip(tensors, types):
                writer.write_tensor_data(filler.make(t, ttype))
        finally:
            writer.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def common_hparams(*, n_ctx_train: int, n_embd: int, n_layers: int) -> dict[str, Any]:
    """The keys every generated architecture has."""
    return {"context_length": n_ctx_train, "embedding_length": n_embd, "block_count": n_layers}


def attention_hparams(*, n_head: int, n_head_kv: int, head_dim: int, rope_base: float = 1_000_000.0,
                      eps: float = 1e-6) -> dict[str, Any]:
    """Attention's keys: heads, head sizes, RoPE base, RMS norm epsilon."""
    return {"attention.head_count": n_head, "attention.head_count_kv": n_head_kv, "attention.key_length": head_dim,
            "attention.value_length": head_dim, "rope.freq_base": rope_base,
            "attention.layer_norm_rms_epsilon": eps}


def moe_hparams(*, n_experts: int, n_experts_used: int, expert_ff: int) -> dict[str, Any]:
    """The routed experts' keys."""
    return {"feed_forward_length": expert_ff, "expert_feed_forward_length": expert_ff, "expert_count": n_experts,
            "expert_used_count": n_experts_used}


def check_moe(*, n_head: int, n_head_kv: int, n_experts: int, n_experts_used: int) -> None:
    """Refuse head and expert counts llama.cpp would refuse (or abort on)."""
    if n_head % n_head_kv:
        raise ConfigError(f"n_head ({n_head}) must be a multiple of n_head_kv ({n_head_kv}).")
    if n_experts_used > n_experts:
        raise ConfigError(f"n_experts_used ({n_experts_used}) cannot exceed n_experts ({n_experts}).")


def tensor_names(path: str | os.PathLike[str]) -> list[str]:
    """The tensor names of a GGUF file, in file order (read with ``gguf.GGUFReader``)."""
    import gguf

    return [t.name for t in gguf.GGUFReader(path).tensors]


__all__ = ["DTYPES", "FILLS", "Tensor", "attention_hparams", "check_moe", "common_hparams", "moe_hparams",
           "positive", "tensor_names", "tensor_type", "write_gguf"]
