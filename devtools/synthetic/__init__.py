"""Tiny generated GGUF models, for tests and benchmarks.

Each architecture module writes a model with random (or zero) weights that llama.cpp
loads and generates with: a byte-level ``gpt2`` vocabulary, its family's chat template,
and every tensor and hyperparameter key of the real architecture, so expert-offload
patterns, KV cache and recurrent state sizes and compute buffers behave as they would
for a real model of the same shapes. The text they generate is noise.

* ``qwen3moe`` (:func:`write_moe_model`, :func:`write_timing_moe_model`): attention and
  routed experts in every layer;
* ``qwen35moe`` (:func:`write_hybrid_model`): Qwen3.5/3.6's hybrid, Gated DeltaNet and
  gated attention layers, routed and shared experts;
* ``gpt-oss`` (:func:`write_gpt_oss_model`): alternating sliding-window and full
  attention with attention sinks, experts with biases, the harmony template;
* ``mamba`` (:func:`write_mamba_model`): recurrent only.

The shapes are parameters, so a benchmark can write a timing-only model with a real
model's shapes; tensors are generated and written one at a time (:mod:`.writer`, the
one writer all of them use), so memory stays at about one tensor. From the shell::

    python -m devtools.synthetic qwen35moe hybrid.gguf --layers 8 --ctx 131072
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from pipeline.errors import ConfigError
from .gpt_oss import write_gpt_oss_model
from .mamba import write_mamba_model
from .qwen35moe import write_hybrid_model
from .qwen3moe import SHAPE_KEYWORDS, moe_tensor_shapes, write_moe_model, write_timing_moe_model
from .vocab import CHATML_TEMPLATE, HARMONY_TEMPLATE, byte_vocab
from .writer import tensor_names


def _qwen3moe(path: str | os.PathLike[str], *, fill: str = "random", dtype: str = "f32", **kw: Any) -> Path:
    if fill == "timing":
        return write_timing_moe_model(path, qtype=dtype if dtype != "f32" else "q8_0", **kw)
    return write_moe_model(path, zero=fill == "zero", dtype=dtype, **kw)


#: Architecture name (GGUF ``general.architecture``) -> writer taking the path and keyword shapes.
WRITERS: dict[str, Callable[..., Path]] = {
    "qwen3moe": _qwen3moe,
    "qwen35moe": write_hybrid_model,
    "gpt-oss": write_gpt_oss_model,
    "mamba": write_mamba_model,
}


def write_model(arch: str, path: str | os.PathLike[str], **shapes: Any) -> Path:
    """Write a generated model of architecture ``arch`` (see :data:`WRITERS`) to ``path``; return the path.

    ``shapes`` are the architecture writer's keyword arguments (``n_layers``,
    ``n_ctx_train``, ``fill``, ``dtype``...); one it does not take is a ConfigError.
    """
    import inspect

    writer = WRITERS.get(arch)
    if writer is None:
        raise ConfigError(f"Unknown architecture {arch!r}; one of: {', '.join(WRITERS)}.")
    if writer is _qwen3moe:
        accepted = {*SHAPE_KEYWORDS, "fill", "dtype"}
    else:
        accepted = set(inspect.signature(writer).parameters)
    unknown = sorted(set(shapes) - accepted - {"path"})
    if unknown:
        raise ConfigError(f"A {arch} model has no {', '.join(unknown)}.")
    return writer(path, **shapes)


__all__ = ["CHATML_TEMPLATE", "HARMONY_TEMPLATE", "WRITERS", "byte_vocab", "moe_tensor_shapes", "tensor_names",
           "write_gpt_oss_model", "write_hybrid_model", "write_mamba_model", "write_model", "write_moe_model",
           "write_timing_moe_model"]
