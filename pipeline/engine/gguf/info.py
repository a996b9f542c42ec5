"""What a GGUF model is, from its header alone: architecture, trained context, layers and their kinds,
attention shapes, experts, chat template.

The one reading of a model's metadata: the generator clamps its context and sizes its
KV cache with it, and the tuner's :class:`~pipeline.tuning.spec.ModelSpec` adds the
byte counts of the tensor table to it. No weights are read
(:func:`pipeline.engine.gguf.header.read_header`).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from .header import read_header
from .ggml import type_bytes

LayerKind = Literal["full", "swa", "recurrent"]

#: llama.cpp's sliding-window layout per architecture where the GGUF declares a window but no
#: pattern: ``(n, dense_first)`` as its loaders pass them to ``set_swa_pattern`` (``n`` 0: every
#: layer slides; else layer ``i`` slides when ``i % n < n - 1``, or ``i % n != 0`` dense-first).
_SWA_DEFAULTS = {"gpt-oss": (2, False), "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False),
                 "gemma-embedding": (6, False), "cohere2": (4, False), "cohere2moe": (4, True),
                 "llama4": (4, False), "exaone4": (4, False), "olmo2": (4, False), "plamo3": (8, False),
                 "smallthinker": (4, True), "mistral": (0, False)}
_SSM_TENSOR = re.compile(r"^blk\.(\d+)\..*ssm_")
# ModelInfo.read's results by file version (path, inode, size, times): ModelInfo is immutable.
_READ: dict[tuple, "ModelInfo"] = {}
_READ_MU = threading.Lock()


@dataclass(frozen=True)
class LayerInfo:
    """One block's attention: its kind and shapes (a recurrent layer keeps no per-token KV)."""

    kind: LayerKind = "full"
    n_head: int = 0
    n_head_kv: int = 0
    head_dim_k: int = 0
    head_dim_v: int = 0
    window: int = 0  # sliding-window size (kind "swa")


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a GGUF model, read from its header without loading weights."""

    name: str
    arch: str
    n_embd: int
    n_ctx_train: int
    n_experts: int
    n_experts_used: int
    expert_ff: int
    layers: tuple[LayerInfo, ...]
    chat_template: str | None = None
    causal: bool = True  # False for encoders (embedding models), which cannot generate
    path: Path | None = None

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def n_head_kv(self) -> int:
        """The most KV heads of any layer."""
        return max((lay.n_head_kv for lay in self.layers), default=0)

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> ModelInfo:
        """The facts of the GGUF at ``path`` (its metadata and tensor names), read once per version of the
        file in this process (the settings, the engine and the tuner all ask, and a large vocabulary
        takes tens of milliseconds to walk past)."""
        path = Path(path)
        try:
            st = path.stat()
            key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None  # read_header says what is wrong
        with _READ_MU:
            if key is not None and key in _READ:
                return _READ[key]
        header = read_header(path)
        info = cls.from_metadata(header.metadata, [t.name for t in header.tensors], name=path.name, path=path)
        if key is not None:
            with _READ_MU:
                if len(_READ) >= 32:
                    _READ.pop(next(iter(_READ)))
                _READ[key] = info
        return info

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], tensor_names: Sequence[str], *, name: str = "model",
                      path: Path | None = None) -> ModelInfo:
        """The facts in GGUF metadata; ``tensor_names`` tell recurrent (``ssm_``) layers apart."""
        arch = str(meta.get("general.architecture", ""))

        def key(k: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{k}", default)

        n_layers = int(key("block_count", 0) or 0)
        n_embd = int(key("embedding_length", 0) or 0)

        def per_layer(v: Any, default: int) -> list[int]:
            if v is None:
                return [default] * n_layers
            if isinstance(v, (list, tuple)):
                return [int(x) for x in v][:n_layers] + [int(v[-1]) if v else default] * (n_layers - len(v))
            return [int(v)] * n_layers

        n_head = per_layer(key("attention.head_count"), 0)
        if key("attention.head_count_kv") is None:  # no GQA: as many KV heads as query heads
            n_head_kv = list(n_head)
        else:
            n_head_kv = per_layer(key("attention.head_count_kv"), 0)
        hd_default = n_embd // n_head[0] if n_layers and n_head[0] else 0
        hd_k = int(key("attention.key_length", hd_default) or 0)
        hd_v = int(key("attention.value_length", hd_default) or 0)
        window = int(key("attention.sliding_window", 0) or 0)
        swa_pattern = key("attention.sliding_window_pattern")

        recurrent = [False] * n_layers
        for tname in tensor_names:
            m = _SSM_TENSOR.match(tname)
            if m and int(m.group(1)) < n_layers:
                recurrent[int(m.group(1))] = True
        interval = key("full_attention_interval")
        if isinstance(interval, int) and interval > 0:  # hybrid: every interval-th layer is attention
            recurrent = [r or (i + 1) % interval != 0 for i, r in enumerate(recurrent)]

        layers = []
        for i in range(n_layers):
            if recurrent[i] or (n_head_kv[i] == 0 and any(recurrent)):
                kind: LayerKind = "recurrent"
            elif window and _slides(i, arch, swa_pattern):
                kind = "swa"
            else:
                kind = "full"
            layers.append(LayerInfo(kind=kind, n_head=n_head[i], n_head_kv=n_head_kv[i], head_dim_k=hd_k,
                                    head_dim_v=hd_v, window=window if kind == "swa" else 0))
        return cls(
            name=name, arch=arch, n_embd=n_embd, n_ctx_train=int(key("context_length", 0) or 0),
            n_experts=int(key("expert_count", 0) or 0), n_experts_used=int(key("expert_used_count", 0) or 0),
            expert_ff=int(key("expert_feed_forward_length", 0) or 0), layers=tuple(layers),
            chat_template=meta.get("tokenizer.chat_template"),
            causal=key("attention.causal", True) is not False, path=path,
        )

    def kv_bytes(self, n_ctx: int, type_k: str, type_v: str) -> int:
        """Bytes of a KV cache of ``n_ctx`` cells in every attention layer (sliding ones kept full-size)."""
        per_token = sum(type_bytes(lay.n_head_kv * lay.head_dim_k, type_k)
                        + type_bytes(lay.n_head_kv * lay.head_dim_v, type_v)
                        for lay in self.layers if lay.kind != "recurrent")
        return per_token * n_ctx

    def state_bytes(self, n_tokens: int, type_k: str = "f16", type_v: str = "f16") -> int:
        """Bytes of the file a saved state of ``n_tokens`` cells takes (one sequence, prefilled on its
        own, as prefix and section states are), KV types ``type_k``/``type_v`` as stored.

        As llama.cpp writes it (:mod:`pipeline.engine._llama.state_format`): the token list, then one
        memory for the full-attention layers and, on a sliding-window model, another for the window
        layers; per memory a cell's position and sequence (12 bytes) and each layer's keys and values.
        A window layer keeps only the cells its window still sees (llama.cpp reuses the others while
        the sequence is prefilled, even with a full-size window cache): the last ``window`` of them. A
        recurrent layer's fixed state is not counted (such models keep no section states)."""
        if n_tokens <= 0:
            return 0
        total = 12 + 4 * n_tokens
        attention = [lay for lay in self.layers if lay.kind != "recurrent"]
        groups = [[lay for lay in attention if lay.kind == "full"], [lay for lay in attention if lay.kind == "swa"]]
        for layers in (g for g in groups if g):
            cells = min(n_tokens, min(lay.window for lay in layers)) if layers[0].kind == "swa" else n_tokens
            per_cell = 12 + sum(type_bytes(lay.n_head_kv * lay.head_dim_k, type_k)
                                + type_bytes(lay.n_head_kv * lay.head_dim_v, type_v) for lay in layers)
            total += 4 + 4 + 8 + 24 * len(layers) + cells * per_cell
        return total

    def context_length(self, requested: int, rope_scaling: str = "") -> int:
        """See :func:`effective_n_ctx`."""
        return effective_n_ctx(requested, self.n_ctx_train, rope_scaling)


def _slides(i: int, arch: str, pattern: Any) -> bool:
    """Whether layer ``i`` uses the sliding window, as llama.cpp reads the pattern (a per-layer list, a
    period, or none: the architecture's default, see :data:`_SWA_DEFAULTS`)."""
    if isinstance(pattern, list):
        return bool(pattern[i % len(pattern)]) if pattern else False
    n, dense_first = _SWA_DEFAULTS.get(arch, (None, False))
    if pattern is not None:
        n = int(pattern)
    if n is None:  # an architecture llama.cpp reads no sliding layout for
        return False
    if n == 0:
        return True
    return i % n != 0 if dense_first else i % n < n - 1


def effective_n_ctx(requested: int, trained: int, rope_scaling: str = "") -> int:
    """The context length a run uses: ``requested`` (0: the trained one), clamped to the trained
    context unless RoPE scaling (``"linear"``, ``"yarn"``) extends it."""
    want = requested or trained
    if trained and want > trained and rope_scaling in ("", "none"):
        return trained
    return want


__all__ = ["LayerInfo", "LayerKind", "ModelInfo", "effective_n_ctx"]
