"""What the tuner knows about a model: per-layer bytes and shapes, read from a GGUF or built from shapes.

A :class:`ModelSpec` holds per-layer byte counts (routed experts apart from the
rest), the embeddings and output head, attention shapes and layer kinds (full
attention, sliding window, recurrent). :meth:`ModelSpec.from_gguf` reads them from
a GGUF file's header and tensor list (no weights read): the layers' kinds and shapes
as :class:`pipeline.engine.gguf.info.ModelInfo` reads them, the bytes from the tensor
table; :meth:`ModelSpec.qwen36_35b_a3b` builds them from published shapes. The ggml
type sizes it needs live on the engine side (:mod:`pipeline.engine.gguf.ggml`).

Plain Python; ``gguf`` is imported only for the names of ggml types.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ..engine.gguf.header import ArrayInfo, read_header
from ..engine.gguf.ggml import GGML_TYPES, type_bytes
from ..engine.gguf.info import LayerKind, ModelInfo
from ..errors import ConfigError
from ..engine.offload import EXPERT_PATTERN

#: The KV cache types the tuner searches.
KV_TYPES = ("f16", "q8_0", "q4_0")


# --------------------------------------------------------------------------- model spec


@dataclass(frozen=True)
class LayerSpec:
    """One block of the model: its kind, bytes and the shapes the models need."""

    kind: LayerKind = "full"
    expert_bytes: int = 0  # the routed-expert tensors (what EXPERT_PATTERN matches)
    expert_tensor_max: int = 0  # the largest single routed-expert tensor
    other_bytes: int = 0  # every other tensor of the block
    dense_params: int = 0  # matmul params every token uses (attention, shared expert, router)
    expert_params: int = 0  # matmul params of one routed expert (gate + up + down)
    n_head: int = 0
    n_head_kv: int = 0
    head_dim_k: int = 0
    head_dim_v: int = 0
    window: int = 0  # sliding-window size (kind "swa")
    state_bytes: int = 0  # recurrent state per sequence (kind "recurrent"; f32)
    state_flops: int = 0  # recurrent FLOPs per token (kind "recurrent")

    @property
    def total_bytes(self) -> int:
        return self.expert_bytes + self.other_bytes


def _recurrent_state(key: Callable[[str, Any], Any]) -> tuple[int, int]:
    """A recurrent layer's state per sequence in bytes and its FLOPs per token, from the ``ssm.*`` metadata
    ``key`` reads. The state is f32, as llama.cpp keeps it: the conv window of (d_conv - 1) x channels (Gated
    DeltaNet and Mamba-2: the value width plus queries and keys of every group) and the SSM state, d_inner x
    d_state. Per token a Gated DeltaNet head reads, updates and applies its d_k x d_v state (about 6 FLOPs
    a cell); Mamba's scan about 4."""
    d_conv = int(key("ssm.conv_kernel", 0) or 0)
    d_inner = int(key("ssm.inner_size", 0) or 0)
    d_state = int(key("ssm.state_size", 0) or 0)
    n_group = int(key("ssm.group_count", 0) or 0)
    ssm_heads = int(key("ssm.time_step_rank", 0) or 0)
    conv_ch = d_inner + 2 * n_group * d_state if ssm_heads and d_inner else d_inner  # gated delta net / mamba2
    state = (max(d_conv - 1, 0) * conv_ch + d_inner * d_state) * 4
    return state, (6 if n_group else 4) * d_inner * d_state


@dataclass(frozen=True)
class ModelSpec:
    """What the memory and speed models need to know about a model."""

    name: str
    arch: str
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_experts: int
    n_experts_used: int
    expert_ff: int
    layers: tuple[LayerSpec, ...]
    embd_bytes: int  # token_embd (always in host memory)
    output_bytes: int  # output head + output norm (+ anything outside the blocks)
    output_params: int

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def total_bytes(self) -> int:
        return self.embd_bytes + self.output_bytes + sum(layer.total_bytes for layer in self.layers)

    @property
    def expert_bytes(self) -> int:
        return sum(layer.expert_bytes for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Matmul params per token, output head and embedding lookup excluded."""
        return sum(lay.dense_params + self.n_experts_used * lay.expert_params for lay in self.layers)

    @property
    def max_q_dim(self) -> int:
        return max((lay.n_head * lay.head_dim_k for lay in self.layers if lay.kind != "recurrent"), default=0)

    @property
    def max_n_head(self) -> int:
        return max((lay.n_head for lay in self.layers if lay.kind != "recurrent"), default=0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"] = f"{self.n_layers} layers"
        d.update(total_bytes=self.total_bytes, expert_bytes=self.expert_bytes, active_params=self.active_params)
        return d

    # ---- constructors

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelSpec:
        """Read a spec from a GGUF file's metadata and tensor list (no weights read)."""
        meta, tensors = read_gguf(path)
        return cls.from_metadata(meta, tensors, name=Path(path).name)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], tensors: list[tuple[str, tuple[int, ...], str]],
                      *, name: str = "model") -> ModelSpec:
        info = ModelInfo.from_metadata(meta, [t[0] for t in tensors], name=name)
        arch = info.arch
        if not arch:
            raise ConfigError(f"{name}: no general.architecture in the GGUF metadata.")

        def key(k: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{k}", default)

        n_layers, n_embd, n_experts = info.n_layers, info.n_embd, info.n_experts
        if n_layers <= 0 or n_embd <= 0:
            raise ConfigError(f"{name}: block_count / embedding_length missing.")

        exp_rx = re.compile(EXPERT_PATTERN)
        blk_rx = re.compile(r"^blk\.(\d+)\.")
        exp_b = [0] * n_layers
        exp_max = [0] * n_layers
        other_b = [0] * n_layers
        dense_p = [0] * n_layers
        exp_p = [0] * n_layers
        embd_bytes = output_bytes = output_params = 0
        n_vocab = 0
        for tname, shape, ttype in tensors:
            n = math.prod(shape)
            nbytes = type_bytes(n, ttype) if ttype in GGML_TYPES else n * 2
            m = blk_rx.match(tname)
            if m is None:
                if tname.startswith("token_embd."):
                    embd_bytes += nbytes
                    n_vocab = max(n_vocab, shape[-1] if shape else 0)
                else:
                    output_bytes += nbytes
                    if tname == "output.weight":
                        output_params += n
                        n_vocab = max(n_vocab, shape[-1])
                continue
            i = int(m.group(1))
            if i >= n_layers:
                continue
            if exp_rx.search(tname):
                exp_b[i] += nbytes
                exp_max[i] = max(exp_max[i], nbytes)
                exp_p[i] += n // max(n_experts, 1)
            else:
                other_b[i] += nbytes
                if len(shape) >= 2 and "conv1d" not in tname:
                    dense_p[i] += n
        if output_params == 0:  # tied embeddings: the head reuses token_embd (a GPU copy is not made)
            output_params = n_vocab * n_embd
        if n_vocab == 0:
            toks = meta.get("tokenizer.ggml.tokens")
            n_vocab = toks.count if isinstance(toks, ArrayInfo) else len(toks) if isinstance(toks, list) else 0

        state, state_flops = _recurrent_state(key)
        layers = []
        for i, lay in enumerate(info.layers):
            recurrent = lay.kind == "recurrent"
            layers.append(LayerSpec(
                kind=lay.kind, expert_bytes=exp_b[i], expert_tensor_max=exp_max[i], other_bytes=other_b[i],
                dense_params=dense_p[i], expert_params=exp_p[i], n_head=lay.n_head, n_head_kv=lay.n_head_kv,
                head_dim_k=lay.head_dim_k, head_dim_v=lay.head_dim_v, window=lay.window,
                state_bytes=state if recurrent else 0,
                state_flops=state_flops if recurrent else 0,
            ))
        return cls(
            name=name, arch=arch, n_embd=n_embd, n_vocab=n_vocab, n_ctx_train=info.n_ctx_train,
            n_experts=n_experts, n_experts_used=info.n_experts_used, expert_ff=info.expert_ff, layers=tuple(layers),
            embd_bytes=embd_bytes, output_bytes=output_bytes, output_params=output_params,
        )

    @classmethod
    def qwen36_35b_a3b(cls, quant: str = "Q6_K") -> ModelSpec:
        """Qwen3.6-35B-A3B from its published shapes (see FACTS.md), every matrix at ``quant``.

        ``Q4_K_M`` is modelled as llama.cpp's mix: Q6_K for the output head and for
        ``ffn_down``/``attn_v`` in about half the layers (an average of Q4_K and Q6_K
        there), Q4_K elsewhere. Norms, the SSM scalars and the conv kernels are f32.
        """
        q = quant.lower()
        mix = q == "q4_k_m"
        base = "q4_k" if mix else q
        if base not in GGML_TYPES:
            raise ConfigError(f"Unknown quantization {quant!r}; use Q4_K_M, Q6_K, Q8_0 or F16.")

        def mat(n: int, t: str = base) -> int:
            return type_bytes(n, t)

        def down(n: int) -> int:  # ffn_down / attn_v in a Q4_K_M file: half the layers Q6_K
            return (mat(n, "q4_k") + mat(n, "q6_k")) // 2 if mix else mat(n)

        embd, vocab, n_exp, n_used, eff = 2048, 248_320, 256, 8, 512
        # Gated DeltaNet: 16 QK heads, 32 V heads, head 128, conv kernel 4
        dk = dv = 128
        qk_h, v_h = 16, 32
        d_inner = v_h * dv  # 4096
        conv_ch = 2 * qk_h * dk + d_inner  # 8192
        # Gated attention: 16 Q heads (+ gate), 2 KV heads, head 256
        a_h, a_kv, a_hd = 16, 2, 256
        f32 = 4

        def moe() -> tuple[int, int, int, int, int]:
            gate_up = mat(n_exp * eff * embd)
            dn = down(n_exp * eff * embd)
            experts = 2 * gate_up + dn
            shared = 2 * mat(eff * embd) + down(eff * embd) + embd * f32  # shared expert + its gate
            router = n_exp * embd * f32
            dense_p = 3 * eff * embd + n_exp * embd  # matrices: the shared expert and the router
            return experts, max(gate_up, dn), shared + router + 2 * embd * f32, dense_p, 3 * eff * embd

        layers = []
        for i in range(40):
            experts, emax, moe_other, moe_dense_p, exp_p = moe()
            if i % 4 == 3:  # gated attention
                q_p, kv_p, o_p = embd * a_h * a_hd * 2, embd * a_kv * a_hd, a_h * a_hd * embd
                other = mat(q_p) + mat(kv_p) + down(kv_p) + mat(o_p) + 2 * a_hd * f32
                layers.append(LayerSpec(
                    kind="full", expert_bytes=experts, expert_tensor_max=emax, other_bytes=other + moe_other,
                    dense_params=q_p + 2 * kv_p + o_p + moe_dense_p, expert_params=exp_p,
                    n_head=a_h, n_head_kv=a_kv, head_dim_k=a_hd, head_dim_v=a_hd))
            else:  # gated delta net
                qkv_p, z_p, ba_p, o_p = embd * conv_ch, embd * d_inner, embd * 2 * v_h, d_inner * embd
                other = mat(qkv_p) + mat(z_p) + mat(ba_p) + down(o_p) + (4 * conv_ch + 2 * v_h + dv) * f32
                state = (3 * conv_ch + v_h * dk * dv) * f32
                layers.append(LayerSpec(
                    kind="recurrent", expert_bytes=experts, expert_tensor_max=emax, other_bytes=other + moe_other,
                    dense_params=qkv_p + z_p + ba_p + o_p + moe_dense_p, expert_params=exp_p,
                    state_bytes=state, state_flops=6 * v_h * dk * dv))
        out_t = "q6_k" if mix else base
        return cls(
            name=f"Qwen3.6-35B-A3B-{quant}", arch="qwen35moe", n_embd=embd, n_vocab=vocab, n_ctx_train=262_144,
            n_experts=n_exp, n_experts_used=n_used, expert_ff=eff, layers=tuple(layers),
            embd_bytes=mat(vocab * embd), output_bytes=type_bytes(vocab * embd, out_t) + embd * f32,
            output_params=vocab * embd,
        )


# --------------------------------------------------------------------------- GGUF header


def ggml_type_name(type_id: int) -> str:
    """The lower-case name of a ggml type id (``"q6_k"``), ``"typeN"`` for one ``gguf`` does not know."""
    import gguf  # for the type names only

    try:
        return gguf.GGMLQuantizationType(type_id).name.lower()
    except ValueError:
        return f"type{type_id}"


def read_gguf(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], str]]]:
    """(metadata, tensor infos) of a GGUF file, header only, as :meth:`ModelSpec.from_metadata` takes them.

    A thin adapter over :func:`pipeline.engine.gguf.header.read_header`: long arrays (the
    vocabulary) are :class:`pipeline.engine.gguf.header.ArrayInfo` (type and length), tensor
    infos are (name, shape in ggml order, ggml type name).
    """
    header = read_header(path)
    names: dict[int, str] = {}
    tensors = []
    for t in header.tensors:
        if t.type not in names:
            names[t.type] = ggml_type_name(t.type)
        tensors.append((t.name, tuple(int(d) for d in t.shape), names[t.type]))
    return header.metadata, tensors


def kv_type_supported(spec: ModelSpec, type_name: str) -> bool:
    """Whether llama.cpp accepts this KV type for the model: the head size must be a multiple of its block."""
    block = GGML_TYPES[type_name][0]
    return all(lay.head_dim_k % block == 0 and lay.head_dim_v % block == 0
               for lay in spec.layers if lay.kind != "recurrent")


__all__ = ["KV_TYPES", "LayerSpec", "ModelSpec", "ggml_type_name", "kv_type_supported", "read_gguf"]
