"""Plan expert offload and batch sizes for the fastest prefill that fits the memory.

Four parts, all plain Python (llama_cpp is imported only by :func:`dry_run`):

**Model spec** (:class:`ModelSpec`): per-layer byte counts (routed experts apart
from the rest), embeddings and output head, attention shapes and layer kinds,
read from a GGUF's header and tensor list (:meth:`ModelSpec.from_gguf`, no
weights read) or built from published shapes (:meth:`ModelSpec.qwen36_35b_a3b`).

**Memory model** (:func:`memory`): bytes per device for a :class:`Plan`:

* weights: llama.cpp keeps ``token_embd`` in host memory always; layers
  ``>= n_layers - gpu_layers`` and (with ``gpu_layers > n_layers``) the output
  head go to the GPU, except the expert tensors of the offloaded layers;
* KV cache: full-attention layers ``n_ctx_pad`` cells (``n_ctx`` rounded up to
  256), sliding-window layers ``min(n_ctx_pad, pad256(window + n_ubatch))`` cells,
  recurrent layers no KV but a fixed f32 state per sequence; K and V sized by
  ``type_k``/``type_v`` (f16 2 bytes, q8_0 34 per 32, q4_0 18 per 32 values);
* compute buffer (:func:`compute_buffer_bytes`), derived from llama.cpp's own
  dry runs of generated qwen3moe models (see ``tests/test_plan.py``), in bytes per
  token of the micro-batch, ``u = n_ubatch``, ``c = n_ctx_pad``::

      layer = max(24*embd + 8*q_dim,  12*n_used*expert_ff + 17*embd + 4*n_experts + 4*q_dim)
      flash attention on:   u * max(2*c + layer,  4*n_vocab + 8*embd)
      flash attention off:  u * max((4*n_head + 4)*c + layer,  4*n_vocab + 8*embd)

  ``2*c`` is the f16 KQ mask, ``(4*n_head+4)*c`` the f32 KQ scores and mask,
  ``4*n_vocab`` the f32 logits of a micro-batch (llama.cpp reserves the graph for
  every token producing an output). *Assumption*: this CPU-only build can only
  measure the CPU compute buffer; a CUDA build's GPU compute buffer is modelled by
  the same formula (the graph is the same one), plus, when experts are in host
  memory, one expert tensor of an offloaded layer (the scheduler copies CPU
  weights into the GPU compute buffer one split at a time), and the host
  (``CUDA_Host``) compute buffer is the KQ mask plus ``8*embd`` per token.
* margin: the planner keeps ``margin`` bytes free per device (default 256 MiB on
  the GPU, above the profile's ``gpu_reserved`` for the CUDA context); llama.cpp's
  ``--fit`` keeps 1 GiB.

**Speed model** (:func:`prefill_speed`, :func:`decode_speed`): a prefill of ``P``
tokens runs ``ceil(P/u)`` micro-batches; each one costs, in sequence (llama.cpp's
scheduler does not overlap these)::

    t_gpu  = 2 * active_params_on_gpu * u / gpu_flops
             + attention FLOPs (4 * n_head * head_dim * context per token and
               full-attention layer; the window for sliding layers) / (gpu_flops * attn_efficiency)
    t_copy = bytes of the experts in host memory / h2d bandwidth
             (once per micro-batch when u >= 32: llama.cpp's op offload; pinned
             bandwidth when mmap is off, pageable when on)
    t_cpu  = 2 * params computed on the CPU * u / cpu_flops
             (the experts in host memory when u < 32; layers not on the GPU)

Prefill tokens/s is ``P / sum(t)``; the *bound* is the largest of the three
totals (``gpu``, ``copy``, ``cpu``). The output head runs for one token only.
Decode (one token) is memory-bandwidth bound: bytes of the active weights and of
the KV cache read per token, on each device, over its memory bandwidth.

Calibration: the ``rtx3090`` profile's ``gpu_flops`` (33.4e12) and
``h2d_pinned`` (25e9) were solved so this model reproduces the recipe's two
measurements on a 3090 (Qwen3.6-35B-A3B Q6_K, 64K context, mmap off): 564 tok/s
at ``-b 512 -ub 128`` with experts on the GPU as far as they fit (the baseline)
and 1330 tok/s at ``-b 1024 -ub 512`` with 8 layers' experts on the CPU; see
:func:`recipe_plan`, :func:`baseline_plan` and ``tests/test_plan.py``.

**Planner** (:func:`plan`): exhaustive search over layers with experts on the CPU
(count, first or last), ``n_ubatch`` in 128..4096 (powers of two), ``n_batch =
n_ubatch`` unless fixed, KV type fixed or searched, for the fastest estimated
prefill whose estimated memory plus margin fits both budgets. :func:`fit_like`
models llama.cpp's ``--fit`` (fewest first layers' experts on the CPU that fit with
1 GiB margin at ``-b 2048 -ub 512``) for comparison.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import struct
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError
from .hardware import GiB, HardwareProfile
from .offload import EXPERT_PATTERN, n_cpu_moe

MiB = 1024**2

# --------------------------------------------------------------------------- ggml types

#: ggml type name -> (block size in values, bytes per block), as ggml defines them.
GGML_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "q8_0": (32, 34),
    "q2_k": (256, 84), "q3_k": (256, 110), "q4_k": (256, 144), "q5_k": (256, 176), "q6_k": (256, 210),
    "q8_k": (256, 292), "iq4_nl": (32, 18), "iq4_xs": (256, 136),
}
#: ggml_type enum values for the KV cache types llama.cpp accepts (``-ctk``/``-ctv``).
KV_TYPE_IDS = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30, "iq4_nl": 20}
KV_TYPES = ("f16", "q8_0", "q4_0")


def type_bytes(n_values: int, type_name: str) -> int:
    """Bytes of ``n_values`` values stored as ggml type ``type_name`` (rounded up to whole blocks)."""
    try:
        block, size = GGML_TYPES[type_name.lower()]
    except KeyError:
        raise ConfigError(f"Unknown ggml type {type_name!r}.") from None
    return -(-n_values // block) * size


def bits_per_weight(type_name: str) -> float:
    block, size = GGML_TYPES[type_name.lower()]
    return size * 8 / block


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


# --------------------------------------------------------------------------- model spec


LayerKind = Literal["full", "swa", "recurrent"]


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

    def kv_bytes_per_token(self, type_k: str = "f16", type_v: str = "f16") -> dict[str, int]:
        """KV bytes per cell, summed per layer kind (recurrent layers: 0)."""
        out = {"full": 0, "swa": 0, "recurrent": 0}
        for lay in self.layers:
            if lay.kind == "recurrent":
                continue
            out[lay.kind] += type_bytes(lay.n_head_kv * lay.head_dim_k, type_k) + type_bytes(
                lay.n_head_kv * lay.head_dim_v, type_v)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"] = f"{self.n_layers} layers"
        d.update(total_bytes=self.total_bytes, expert_bytes=self.expert_bytes, active_params=self.active_params)
        return d

    # ---- constructors

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> ModelSpec:
        """Read a spec from a GGUF file's metadata and tensor list (no weights read)."""
        meta, tensors = read_gguf_header(path)
        return cls.from_metadata(meta, tensors, name=Path(path).name)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], tensors: list[tuple[str, tuple[int, ...], str]],
                      *, name: str = "model") -> ModelSpec:
        arch = str(meta.get("general.architecture", ""))
        if not arch:
            raise ConfigError(f"{name}: no general.architecture in the GGUF metadata.")

        def key(k: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{k}", default)

        n_layers = int(key("block_count", 0))
        n_embd = int(key("embedding_length", 0))
        if n_layers <= 0 or n_embd <= 0:
            raise ConfigError(f"{name}: block_count / embedding_length missing.")

        def per_layer(v: Any, default: int) -> list[int]:
            if v is None:
                return [default] * n_layers
            if isinstance(v, (list, tuple)):
                return [int(x) for x in v] + [int(v[-1]) if v else default] * (n_layers - len(v))
            return [int(v)] * n_layers

        n_head = per_layer(key("attention.head_count"), 0)
        n_head_kv = per_layer(key("attention.head_count_kv"), 0)
        n_head_kv = [kv if kv else h for kv, h in zip(n_head_kv, n_head)] if key("attention.head_count_kv") is None \
            else n_head_kv
        hd_default = n_embd // max(n_head[0], 1) if n_head[0] else 0
        hd_k = int(key("attention.key_length", hd_default))
        hd_v = int(key("attention.value_length", hd_default))
        window = int(key("attention.sliding_window", 0) or 0)
        swa_pattern = key("attention.sliding_window_pattern")
        n_experts = int(key("expert_count", 0) or 0)
        n_used = int(key("expert_used_count", 0) or 0)
        expert_ff = int(key("expert_feed_forward_length", 0) or 0)
        n_ctx_train = int(key("context_length", 0) or 0)

        exp_rx = re.compile(EXPERT_PATTERN)
        blk_rx = re.compile(r"^blk\.(\d+)\.")
        exp_b = [0] * n_layers
        exp_max = [0] * n_layers
        other_b = [0] * n_layers
        dense_p = [0] * n_layers
        exp_p = [0] * n_layers
        recurrent = [False] * n_layers
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
            if ".ssm_" in tname:
                recurrent[i] = True
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
            n_vocab = int(toks) if isinstance(toks, int) else 0

        # recurrent state (f32 per sequence): conv (d_conv-1) x channels + ssm state
        d_conv = int(key("ssm.conv_kernel", 0) or 0)
        d_inner = int(key("ssm.inner_size", 0) or 0)
        d_state = int(key("ssm.state_size", 0) or 0)
        n_group = int(key("ssm.group_count", 0) or 0)
        ssm_heads = int(key("ssm.time_step_rank", 0) or 0)
        if ssm_heads and d_inner:  # gated delta net / mamba2 style
            conv_ch = d_inner + 2 * n_group * d_state
            state = (max(d_conv - 1, 0) * conv_ch + d_inner * d_state) * 4
        else:
            conv_ch = d_inner
            state = (max(d_conv - 1, 0) * conv_ch + d_inner * d_state) * 4

        layers = []
        for i in range(n_layers):
            if recurrent[i] or (n_head_kv[i] == 0 and any(recurrent)):
                kind: LayerKind = "recurrent"
            elif window and swa_pattern is not None:
                pat = int(swa_pattern) if not isinstance(swa_pattern, list) else 0
                if isinstance(swa_pattern, list):
                    kind = "swa" if swa_pattern[i % len(swa_pattern)] else "full"
                else:
                    kind = "swa" if pat and (i % pat) < pat - 1 else "full"
            elif window and arch in ("mistral", "gpt-oss", "gpt_oss"):
                kind = "swa"
            else:
                kind = "full"
            layers.append(LayerSpec(
                kind=kind, expert_bytes=exp_b[i], expert_tensor_max=exp_max[i], other_bytes=other_b[i],
                dense_params=dense_p[i], expert_params=exp_p[i], n_head=n_head[i], n_head_kv=n_head_kv[i],
                head_dim_k=hd_k, head_dim_v=hd_v, window=window if kind == "swa" else 0,
                state_bytes=state if kind == "recurrent" else 0,
                state_flops=4 * d_inner * d_state if kind == "recurrent" else 0,
            ))
        return cls(
            name=name, arch=arch, n_embd=n_embd, n_vocab=n_vocab, n_ctx_train=n_ctx_train,
            n_experts=n_experts, n_experts_used=n_used, expert_ff=expert_ff, layers=tuple(layers),
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
            dense_p = 3 * eff * embd + embd + n_exp * embd
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
                other = mat(qkv_p) + mat(z_p) + ba_p * f32 + down(o_p) + (4 * conv_ch + 2 * v_h + dv) * f32
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


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_header(path: str | os.PathLike[str], *, max_array: int = 4096
                     ) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], str]]]:
    """(metadata, tensor infos) of a GGUF file, reading the header only.

    A small reader instead of ``gguf.GGUFReader``, which parses every array
    (several seconds for a large vocabulary): arrays longer than ``max_array`` are
    skipped and recorded as their length. Tensor infos are (name, shape in ggml
    order, ggml type name).
    """
    import gguf  # for the type names only

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != b"GGUF":
            raise ConfigError(f"{path} is not a GGUF file.")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", mm, 4)
        if version < 2:
            raise ConfigError(f"{path}: GGUF version {version} is not supported.")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", mm, pos)
            s = mm[pos + 8:pos + 8 + n].decode("utf-8", errors="replace")
            pos += 8 + n
            return s

        def value(vtype: int) -> Any:
            nonlocal pos
            if vtype == 8:
                return string()
            if vtype == 9:
                (etype, count) = struct.unpack_from("<IQ", mm, pos)
                pos += 12
                if etype in _GGUF_SCALARS and count > max_array:
                    pos += count * struct.calcsize(_GGUF_SCALARS[etype])
                    return count
                if etype == 8 and count > max_array:
                    for _ in range(count):
                        (n,) = struct.unpack_from("<Q", mm, pos)
                        pos += 8 + n
                    return count
                return [value(etype) for _ in range(count)]
            fmt = _GGUF_SCALARS.get(vtype)
            if fmt is None:
                raise ConfigError(f"{path}: unknown GGUF value type {vtype}.")
            (v,) = struct.unpack_from(fmt, mm, pos)
            pos += struct.calcsize(fmt)
            return v

        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            k = string()
            (vtype,) = struct.unpack_from("<I", mm, pos)
            pos += 4
            meta[k] = value(vtype)
        tensors = []
        for _ in range(n_tensors):
            name = string()
            (nd,) = struct.unpack_from("<I", mm, pos)
            dims = struct.unpack_from(f"<{nd}Q", mm, pos + 4)
            (ttype,) = struct.unpack_from("<I", mm, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 4 + 8
            try:
                tname = gguf.GGMLQuantizationType(ttype).name.lower()
            except ValueError:
                tname = f"type{ttype}"
            tensors.append((name, tuple(int(d) for d in dims), tname))
    return meta, tensors


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class Plan:
    """One llama.cpp configuration: context, batches, KV type, where the layers and experts live."""

    n_ctx: int
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    gpu_layers: int = 999  # llama.cpp's -ngl: > n_layers puts every layer and the output head on the GPU
    n_cpu_moe: int = 0  # layers whose routed experts stay in host memory
    cpu_moe_from: Literal["first", "last"] = "first"
    mmap: bool = False
    n_seq: int = 1

    def __post_init__(self) -> None:
        if self.n_ctx < 1 or self.n_batch < 1 or self.n_ubatch < 1:
            raise ConfigError("n_ctx, n_batch and n_ubatch must be positive.")
        if self.n_ubatch > self.n_batch:
            raise ConfigError(f"n_ubatch ({self.n_ubatch}) cannot exceed n_batch ({self.n_batch}).")
        for t in (self.type_k, self.type_v):
            if t not in KV_TYPE_IDS:
                raise ConfigError(f"Unknown KV cache type {t!r}; use one of {', '.join(KV_TYPE_IDS)}.")
        if self.type_v not in ("f16", "f32", "bf16") and not self.flash_attn:
            raise ConfigError("A quantized V cache needs flash attention.")
        if self.cpu_moe_from not in ("first", "last"):
            raise ConfigError(f"cpu_moe_from must be 'first' or 'last', not {self.cpu_moe_from!r}.")
        if self.n_cpu_moe < 0 or self.gpu_layers < 0:
            raise ConfigError("n_cpu_moe and gpu_layers cannot be negative.")

    def gpu_layer_set(self, n_layers: int) -> set[int]:
        """Layers llama.cpp puts on the GPU for ``-ngl gpu_layers``: the last ones."""
        return set(range(max(n_layers - self.gpu_layers, 0), n_layers))

    def output_on_gpu(self, n_layers: int) -> bool:
        return self.gpu_layers > n_layers

    def cpu_expert_layers(self, n_layers: int) -> list[int]:
        n = min(self.n_cpu_moe, n_layers)
        return list(range(n)) if self.cpu_moe_from == "first" else list(range(n_layers - n, n_layers))

    def overrides(self, n_layers: int):
        """The :class:`pipeline.offload.Override` list of this plan's expert placement."""
        return n_cpu_moe(self.n_cpu_moe, n_layers, which=self.cpu_moe_from)

    def llama_flags(self, n_layers: int) -> list[str]:
        """The equivalent ``llama-server``/``llama-cli`` flags."""
        flags = ["-c", str(self.n_ctx), "-b", str(self.n_batch), "-ub", str(self.n_ubatch),
                 "-ngl", str(self.gpu_layers), "-fa", "on" if self.flash_attn else "off"]
        if self.type_k != "f16" or self.type_v != "f16":
            flags += ["-ctk", self.type_k, "-ctv", self.type_v]
        n = min(self.n_cpu_moe, n_layers)
        if n == n_layers and n:
            flags += ["--cpu-moe"]
        elif n and self.cpu_moe_from == "first":
            flags += ["--n-cpu-moe", str(n)]
        elif n:
            layers = self.cpu_expert_layers(n_layers)
            alt = "|".join(str(i) for i in layers)
            flags += ["-ot", rf"blk\.({alt}){EXPERT_PATTERN}=CPU"]
        if not self.mmap:
            flags += ["--no-mmap"]
        return flags

    def engine_toml(self, n_layers: int | None = None) -> str:
        """An ``[engine]`` section with this plan's settings."""
        n = self.n_cpu_moe if n_layers is None else min(self.n_cpu_moe, n_layers)
        return "\n".join([
            "[engine]",
            f"n_ctx = {self.n_ctx}",
            f"n_batch = {self.n_batch}",
            f"n_ubatch = {self.n_ubatch}",
            f"flash_attn = {'true' if self.flash_attn else 'false'}",
            f'type_k = "{self.type_k}"',
            f'type_v = "{self.type_v}"',
            f"gpu_layers = {self.gpu_layers}",
            f"n_cpu_moe = {n}",
            f'cpu_moe_from = "{self.cpu_moe_from}"',
            f"mmap = {'true' if self.mmap else 'false'}",
        ]) + "\n"

    def llama_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``llama_cpp.Llama`` / :func:`pipeline._llama.load_llama` (no overrides)."""
        return dict(n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch, flash_attn=self.flash_attn,
                    type_k=KV_TYPE_IDS[self.type_k], type_v=KV_TYPE_IDS[self.type_v],
                    n_gpu_layers=self.gpu_layers, use_mmap=self.mmap)


# --------------------------------------------------------------------------- memory model


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device needs for a plan."""

    weights: int = 0
    kv: int = 0  # KV cache + recurrent state
    compute: int = 0  # compute buffer(s) + output buffer
    reserved: int = 0  # driver / context, not allocated by llama.cpp

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.reserved

    def to_dict(self) -> dict[str, int]:
        return dict(weights=self.weights, kv=self.kv, compute=self.compute, reserved=self.reserved, total=self.total)


@dataclass(frozen=True)
class Memory:
    gpu: DeviceMemory
    cpu: DeviceMemory
    kv_cache: int  # KV cells only (what llama.cpp logs as "llama_kv_cache: size")
    recurrent_state: int
    compute_buffer: int  # the main compute buffer (CPU here, GPU on a CUDA build)

    def to_dict(self) -> dict[str, Any]:
        return dict(gpu=self.gpu.to_dict(), cpu=self.cpu.to_dict(), kv_cache=self.kv_cache,
                    recurrent_state=self.recurrent_state, compute_buffer=self.compute_buffer)


def kv_cells(layer: LayerSpec, plan: Plan) -> int:
    """KV cells llama.cpp allocates for ``layer`` (0 for a recurrent layer)."""
    n_ctx = _pad(plan.n_ctx, 256)
    if layer.kind == "recurrent":
        return 0
    if layer.kind == "swa" and layer.window:
        return min(n_ctx, _pad(layer.window * plan.n_seq + plan.n_ubatch, 256))
    return n_ctx


def kv_bytes(spec: ModelSpec, plan: Plan, layers: set[int] | None = None) -> tuple[int, int]:
    """(KV cache bytes, recurrent state bytes) of ``layers`` (default all)."""
    kv = state = 0
    for i, lay in enumerate(spec.layers):
        if layers is not None and i not in layers:
            continue
        if lay.kind == "recurrent":
            state += lay.state_bytes * plan.n_seq
            continue
        cells = kv_cells(lay, plan)
        kv += cells * (type_bytes(lay.n_head_kv * lay.head_dim_k, plan.type_k)
                       + type_bytes(lay.n_head_kv * lay.head_dim_v, plan.type_v))
    return kv, state


def kv_type_supported(spec: ModelSpec, type_name: str) -> bool:
    """Whether llama.cpp accepts this KV type for the model: the head size must be a multiple of its block."""
    block = GGML_TYPES[type_name][0]
    return all(lay.head_dim_k % block == 0 and lay.head_dim_v % block == 0
               for lay in spec.layers if lay.kind != "recurrent")


def compute_buffer_bytes(spec: ModelSpec, plan: Plan) -> int:
    """The main compute buffer of a plan (see the module docstring for the formula and where it comes from).

    Checked against llama.cpp's dry run (``tests/test_plan.py``): within 5% wherever
    the KQ mask / scores or the logits dominate (contexts from about 8K up, or a
    large vocabulary); an upper bound elsewhere (up to about +40% for contexts of a
    few thousand tokens, where the buffer is a few MiB): the per-layer term is the
    upper envelope of what ggml's allocator was seen to reserve.
    """
    u = plan.n_ubatch
    c = _pad(plan.n_ctx, 256)
    if not any(lay.kind != "recurrent" for lay in spec.layers):
        c = 0
    e, q = spec.n_embd, spec.max_q_dim
    used_ff = spec.n_experts_used * spec.expert_ff
    layer = max(24 * e + 8 * q, 12 * used_ff + 17 * e + 4 * spec.n_experts + 4 * q)
    out = 4 * spec.n_vocab + 8 * e
    if plan.flash_attn:
        attn = 2 * c
    else:
        attn = (4 * spec.max_n_head + 4) * c
    return u * max(attn + layer, out)


def memory(spec: ModelSpec, plan: Plan, hw: HardwareProfile | None = None) -> Memory:
    """Bytes per device for ``plan`` (see the module docstring). ``hw`` without a GPU puts everything on the CPU."""
    has_gpu = hw is None or hw.has_gpu
    n = spec.n_layers
    gpu_layers = plan.gpu_layer_set(n) if has_gpu else set()
    cpu_exp = set(plan.cpu_expert_layers(n))
    w_gpu = w_cpu = spec.embd_bytes * 0
    w_cpu += spec.embd_bytes
    if has_gpu and plan.output_on_gpu(n):
        w_gpu += spec.output_bytes
    else:
        w_cpu += spec.output_bytes
    for i, lay in enumerate(spec.layers):
        if i in gpu_layers:
            w_gpu += lay.other_bytes
            if i in cpu_exp:
                w_cpu += lay.expert_bytes
            else:
                w_gpu += lay.expert_bytes
        else:
            w_cpu += lay.total_bytes
    kv_all, state_all = kv_bytes(spec, plan)
    kv_g, st_g = kv_bytes(spec, plan, gpu_layers)
    compute = compute_buffer_bytes(spec, plan)
    out_buf = spec.n_vocab * 4 * plan.n_seq + spec.n_embd * 4
    if has_gpu and gpu_layers:
        copy = max((spec.layers[i].expert_tensor_max for i in cpu_exp & gpu_layers), default=0)
        host_compute = plan.n_ubatch * (2 * _pad(plan.n_ctx, 256) + 8 * spec.n_embd)
        if len(gpu_layers) < n:  # partial offload: the CPU layers need their own graph buffers
            host_compute = max(host_compute, compute)
        gpu = DeviceMemory(weights=w_gpu, kv=kv_g + st_g, compute=compute + copy,
                           reserved=hw.gpu_reserved if hw else 0)
        cpu = DeviceMemory(weights=w_cpu, kv=(kv_all - kv_g) + (state_all - st_g), compute=host_compute + out_buf)
    else:
        gpu = DeviceMemory()
        cpu = DeviceMemory(weights=w_cpu + w_gpu, kv=kv_all + state_all, compute=compute + out_buf)
    return Memory(gpu=gpu, cpu=cpu, kv_cache=kv_all, recurrent_state=state_all, compute_buffer=compute)


# --------------------------------------------------------------------------- speed model

#: llama.cpp's op offload copies host weights to the GPU only for micro-batches of at least this many tokens.
OFFLOAD_MIN_BATCH = 32


@dataclass(frozen=True)
class Speed:
    tokens_per_s: float
    bound: str  # "gpu" | "copy" | "cpu"
    seconds: dict[str, float]  # total seconds per component over the prefill
    n_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return dict(tokens_per_s=self.tokens_per_s, bound=self.bound, seconds=self.seconds, n_tokens=self.n_tokens)


def _attn_flops_per_token_ctx(lay: LayerSpec) -> float:
    # QK^T and softmax(QK^T) V: 2 FLOPs per multiply-add, two products
    return 2.0 * lay.n_head * (lay.head_dim_k + lay.head_dim_v)


def prefill_speed(spec: ModelSpec, plan: Plan, hw: HardwareProfile, n_tokens: int | None = None) -> Speed:
    """Estimated prefill of ``n_tokens`` (default ``n_ctx``) from an empty cache; see the module docstring."""
    P = int(n_tokens or plan.n_ctx)
    u = min(plan.n_ubatch, plan.n_batch, P)
    n_ub = math.ceil(P / u)
    n = spec.n_layers
    gpu_layers = plan.gpu_layer_set(n) if hw.has_gpu else set()
    cpu_exp = set(plan.cpu_expert_layers(n))
    k = spec.n_experts_used
    gpu_params = cpu_params = 0.0
    copy_bytes = 0
    attn_gpu = attn_cpu = 0.0  # FLOPs over the whole prefill
    sum_ctx_full = P * (P + 1) / 2.0  # sum over tokens of the positions they attend to

    for i, lay in enumerate(spec.layers):
        on_gpu = i in gpu_layers
        layer_params = lay.dense_params + k * lay.expert_params
        if lay.kind == "recurrent":
            a = float(lay.state_flops) * P
        elif lay.kind == "swa" and lay.window:
            w = lay.window
            s = sum_ctx_full if P <= w else w * (w + 1) / 2.0 + (P - w) * w
            a = _attn_flops_per_token_ctx(lay) * s
        else:
            a = _attn_flops_per_token_ctx(lay) * sum_ctx_full
        if not on_gpu:
            cpu_params += layer_params
            attn_cpu += a
            continue
        attn_gpu += a
        gpu_params += lay.dense_params
        if i in cpu_exp:
            if u >= OFFLOAD_MIN_BATCH:
                gpu_params += k * lay.expert_params
                copy_bytes += lay.expert_bytes
            else:
                cpu_params += k * lay.expert_params
        else:
            gpu_params += k * lay.expert_params
    t_gpu = t_cpu = t_copy = 0.0
    if hw.has_gpu:
        t_gpu = 2.0 * gpu_params * P / hw.gpu_flops + attn_gpu / (hw.gpu_flops * hw.attn_efficiency)
        t_copy = n_ub * copy_bytes / hw.h2d(pinned=not plan.mmap)
    t_cpu = (2.0 * cpu_params * P + attn_cpu) / hw.cpu_flops if (cpu_params or attn_cpu) else 0.0
    # the output head, for the last token only
    if hw.has_gpu and plan.output_on_gpu(n):
        t_gpu += 2.0 * spec.output_params / hw.gpu_flops
    else:
        t_cpu += 2.0 * spec.output_params / hw.cpu_flops
    seconds = {"gpu": t_gpu, "copy": t_copy, "cpu": t_cpu}
    total = sum(seconds.values())
    bound = max(seconds, key=lambda key: seconds[key])
    return Speed(tokens_per_s=P / total if total else float("inf"), bound=bound, seconds=seconds, n_tokens=P)


def decode_speed(spec: ModelSpec, plan: Plan, hw: HardwareProfile, context: int | None = None) -> float:
    """Estimated decode tokens/s at ``context`` tokens in the cache (memory-bandwidth bound)."""
    ctx = plan.n_ctx if context is None else context
    n = spec.n_layers
    gpu_layers = plan.gpu_layer_set(n) if hw.has_gpu else set()
    cpu_exp = set(plan.cpu_expert_layers(n))
    frac = spec.n_experts_used / spec.n_experts if spec.n_experts else 1.0
    g = c = 0.0
    for i, lay in enumerate(spec.layers):
        per_tok = 0.0
        if lay.kind != "recurrent":
            cells = min(ctx, kv_cells(lay, plan))
            per_tok = cells * (type_bytes(lay.n_head_kv * lay.head_dim_k, plan.type_k)
                               + type_bytes(lay.n_head_kv * lay.head_dim_v, plan.type_v))
        else:
            per_tok = 2 * lay.state_bytes
        if i in gpu_layers:
            g += lay.other_bytes + per_tok
            if i in cpu_exp:
                c += frac * lay.expert_bytes
            else:
                g += frac * lay.expert_bytes
        else:
            c += lay.other_bytes + frac * lay.expert_bytes + per_tok
    if hw.has_gpu and plan.output_on_gpu(n):
        g += spec.output_bytes
    else:
        c += spec.output_bytes
    t = (g / hw.gpu_mem_bw if g else 0.0) + (c / hw.cpu_mem_bw if c else 0.0)
    return 1.0 / t if t else float("inf")


# --------------------------------------------------------------------------- fitting and planning

DEFAULT_GPU_MARGIN = 256 * MiB
DEFAULT_RAM_MARGIN = 2 * GiB
FIT_MARGIN = 1 * GiB  # llama.cpp's --fit, per device
UBATCHES = (128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class Budget:
    """What a plan may use: VRAM and host RAM, each less its margin."""

    vram: int
    ram: int
    gpu_margin: int = DEFAULT_GPU_MARGIN
    ram_margin: int = DEFAULT_RAM_MARGIN

    @classmethod
    def from_hardware(cls, hw: HardwareProfile, *, gpu_margin: int = DEFAULT_GPU_MARGIN,
                      ram_margin: int = DEFAULT_RAM_MARGIN) -> Budget:
        return cls(vram=hw.vram, ram=hw.ram, gpu_margin=gpu_margin, ram_margin=ram_margin)


def fits(mem: Memory, budget: Budget) -> bool:
    """Whether ``mem`` plus the margins fits the budget (a device with no budget must hold nothing)."""
    gpu_ok = mem.gpu.total == 0 or mem.gpu.total + budget.gpu_margin <= budget.vram
    return gpu_ok and mem.cpu.total + budget.ram_margin <= budget.ram


@dataclass(frozen=True)
class PlanResult:
    """A plan with its memory, estimated speeds and the ways to use it."""

    spec: ModelSpec
    plan: Plan
    memory: Memory
    prefill: Speed
    decode_tokens_per_s: float
    budget: Budget
    label: str = "plan"

    @property
    def fits(self) -> bool:
        return fits(self.memory, self.budget)

    @property
    def flags(self) -> list[str]:
        return self.plan.llama_flags(self.spec.n_layers)

    @property
    def engine_toml(self) -> str:
        return self.plan.engine_toml(self.spec.n_layers)

    def to_dict(self) -> dict[str, Any]:
        return dict(
            label=self.label, model=self.spec.name, plan=asdict(self.plan), fits=self.fits,
            memory=self.memory.to_dict(), budget=asdict(self.budget),
            prefill=self.prefill.to_dict(), decode_tokens_per_s=self.decode_tokens_per_s,
            llama_flags=self.flags, engine_toml=self.engine_toml,
        )

    def describe(self) -> str:
        g, c = self.memory.gpu, self.memory.cpu
        lines = [
            f"{self.label}: {self.spec.name}, {'fits' if self.fits else 'DOES NOT FIT'}",
            f"  experts on CPU: {min(self.plan.n_cpu_moe, self.spec.n_layers)} layers ({self.plan.cpu_moe_from}); "
            f"n_batch {self.plan.n_batch}, n_ubatch {self.plan.n_ubatch}, KV {self.plan.type_k}/{self.plan.type_v}, "
            f"flash attention {'on' if self.plan.flash_attn else 'off'}",
            f"  GPU: weights {_gib(g.weights)}, KV {_gib(g.kv)}, compute {_gib(g.compute)}, reserved "
            f"{_gib(g.reserved)}, margin {_gib(self.budget.gpu_margin)} = "
            f"{_gib(g.total + self.budget.gpu_margin)} of {_gib(self.budget.vram)}",
            f"  CPU: weights {_gib(c.weights)}, KV {_gib(c.kv)}, compute {_gib(c.compute)}, margin "
            f"{_gib(self.budget.ram_margin)} = {_gib(c.total + self.budget.ram_margin)} of {_gib(self.budget.ram)}",
            f"  prefill ~{self.prefill.tokens_per_s:.0f} tok/s over {self.prefill.n_tokens} tokens "
            f"({self.prefill.bound}-bound); decode ~{self.decode_tokens_per_s:.0f} tok/s",
            "  llama.cpp: " + " ".join(_shell_quote(f) for f in self.flags),
        ]
        return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _shell_quote(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_.,=:/+-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def evaluate(spec: ModelSpec, plan: Plan, hw: HardwareProfile, budget: Budget | None = None, *,
             label: str = "plan", n_tokens: int | None = None) -> PlanResult:
    """Memory and speed estimates of one plan."""
    budget = budget or Budget.from_hardware(hw)
    return PlanResult(spec=spec, plan=plan, memory=memory(spec, plan, hw),
                      prefill=prefill_speed(spec, plan, hw, n_tokens),
                      decode_tokens_per_s=decode_speed(spec, plan, hw), budget=budget, label=label)


def plan(spec: ModelSpec, hw: HardwareProfile, *, n_ctx: int, budget: Budget | None = None,
         kv_types: tuple[str, ...] | str = "f16", n_ubatch: int | None = None, n_batch: int | None = None,
         flash_attn: bool = True, mmap: bool = False, n_tokens: int | None = None) -> PlanResult:
    """The fastest estimated plan that fits ``budget`` (default: the profile's VRAM and RAM, default margins).

    ``kv_types`` is one KV type (used for K and V) or a tuple of them to search.
    ``n_ubatch`` / ``n_batch`` fix the batch sizes instead of searching. Raises
    :class:`ConfigError` if nothing fits.
    """
    budget = budget or Budget.from_hardware(hw)
    kvs = (kv_types,) if isinstance(kv_types, str) else tuple(kv_types)
    kvs = tuple(t for t in kvs if kv_type_supported(spec, t)) or ("f16",)
    ubs = (n_ubatch,) if n_ubatch else tuple(u for u in UBATCHES if u <= max(n_ctx, UBATCHES[0]))
    n = spec.n_layers
    has_experts = spec.expert_bytes > 0
    cpu_counts = range(n + 1) if (has_experts and hw.has_gpu) else (0,)
    gpu_layer_options = [n + 1] if hw.has_gpu else [0]
    best: PlanResult | None = None
    best_key: tuple[float, ...] | None = None
    for kv in kvs:
        for ub in ubs:
            nb = max(n_batch or ub, ub)
            for frm in (("first", "last") if has_experts and hw.has_gpu else ("first",)):
                for ngl in gpu_layer_options:
                    for k in cpu_counts:
                        if frm == "last" and k in (0, n):
                            continue  # same as "first"
                        p = Plan(n_ctx=n_ctx, n_batch=nb, n_ubatch=ub, flash_attn=flash_attn, type_k=kv, type_v=kv,
                                 gpu_layers=ngl, n_cpu_moe=k, cpu_moe_from=frm, mmap=mmap)  # type: ignore[arg-type]
                        mem = memory(spec, p, hw)
                        if not fits(mem, budget):
                            continue
                        sp = prefill_speed(spec, p, hw, n_tokens)
                        # fastest; then fewer experts on the CPU, better KV, smaller ubatch
                        key = (sp.tokens_per_s, -k, -kvs.index(kv), -ub)
                        if best_key is None or key > best_key:
                            best_key = key
                            best = PlanResult(spec, p, mem, sp, decode_speed(spec, p, hw), budget, "plan")
                        break  # more experts on the CPU only slows this (kv, ub, from) down
    if best is None and hw.has_gpu:
        best = _partial_offload(spec, hw, budget, n_ctx=n_ctx, kv=kvs[0], ub=ubs[0], flash_attn=flash_attn,
                                mmap=mmap, n_tokens=n_tokens)
    if best is None:
        raise ConfigError(f"{spec.name} does not fit: no plan at {n_ctx} context fits {_gib(budget.vram)} VRAM "
                          f"and {_gib(budget.ram)} RAM with the margins.")
    return best


def _partial_offload(spec: ModelSpec, hw: HardwareProfile, budget: Budget, *, n_ctx: int, kv: str, ub: int,
                     flash_attn: bool, mmap: bool, n_tokens: int | None) -> PlanResult | None:
    """All experts on the CPU and still too big: the most GPU layers (-ngl) that fit."""
    n = spec.n_layers
    for ngl in range(n, -1, -1):
        p = Plan(n_ctx=n_ctx, n_batch=ub, n_ubatch=ub, flash_attn=flash_attn, type_k=kv, type_v=kv,
                 gpu_layers=ngl, n_cpu_moe=n, mmap=mmap)
        mem = memory(spec, p, hw)
        if fits(mem, budget):
            return PlanResult(spec, p, mem, prefill_speed(spec, p, hw, n_tokens), decode_speed(spec, p, hw), budget)
    return None


def fit_like(spec: ModelSpec, hw: HardwareProfile, *, n_ctx: int, budget: Budget | None = None,
             kv: str = "f16", n_tokens: int | None = None) -> PlanResult | None:
    """A model of llama.cpp's ``--fit``: default ``-b 2048 -ub 512``, the fewest first layers' experts
    on the CPU that fit with a 1 GiB margin per device. None when that fails (llama.cpp would then
    cut layers or context). The result is judged against ``budget`` (its own margins)."""
    budget = budget or Budget.from_hardware(hw)
    fit_budget = replace(budget, gpu_margin=FIT_MARGIN, ram_margin=max(FIT_MARGIN, budget.ram_margin))
    n = spec.n_layers
    for k in (range(n + 1) if hw.has_gpu else (0,)):
        p = Plan(n_ctx=n_ctx, n_batch=2048, n_ubatch=512, flash_attn=True, type_k=kv, type_v=kv,
                 gpu_layers=n + 1 if hw.has_gpu else 0, n_cpu_moe=k, mmap=True)
        mem = memory(spec, p, hw)
        if fits(mem, fit_budget):
            return PlanResult(spec, p, mem, prefill_speed(spec, p, hw, n_tokens), decode_speed(spec, p, hw),
                              budget, "llama.cpp --fit (model)")
    return None


# --------------------------------------------------------------------------- the recipe


def recipe_plan(n_ctx: int = 65536) -> Plan:
    """The recipe this project starts from: 8 layers' experts on the CPU, ``-b 1024 -ub 512``, f16 KV, FA,
    mmap off (pinned host memory: the calibration assumes it)."""
    return Plan(n_ctx=n_ctx, n_batch=1024, n_ubatch=512, flash_attn=True, n_cpu_moe=8, mmap=False)


def baseline_plan(spec: ModelSpec, hw: HardwareProfile, n_ctx: int = 65536, budget: Budget | None = None) -> Plan:
    """The recipe's baseline: ``-b 512 -ub 128``, experts on the GPU as far as they fit (fewest first layers' on CPU)."""
    budget = budget or Budget(vram=hw.vram, ram=hw.ram, gpu_margin=0)
    for k in range(spec.n_layers + 1):
        p = Plan(n_ctx=n_ctx, n_batch=512, n_ubatch=128, flash_attn=True, n_cpu_moe=k, mmap=False)
        if fits(memory(spec, p, hw), budget):
            return p
    raise ConfigError("The baseline does not fit.")


def comparison_table(results: list[PlanResult]) -> str:
    """A markdown table comparing plans: settings, memory per device, estimated speeds."""
    head = ("| configuration | experts on CPU | -b / -ub | KV | GPU memory | host memory | fits | "
            "est. prefill tok/s (bound) | est. decode tok/s |")
    rows = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        p = r.plan
        rows.append(
            f"| {r.label} | {min(p.n_cpu_moe, r.spec.n_layers)} ({p.cpu_moe_from}) | {p.n_batch} / {p.n_ubatch} | "
            f"{p.type_k} | {_gib(r.memory.gpu.total)} of {_gib(r.budget.vram)} | {_gib(r.memory.cpu.total)} | "
            f"{'yes' if r.fits else 'no'} | {r.prefill.tokens_per_s:.0f} ({r.prefill.bound}) | "
            f"{r.decode_tokens_per_s:.0f} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------- llama.cpp's dry run


@dataclass(frozen=True)
class DryRun:
    """Sizes llama.cpp reported for a load with ``no_alloc`` (bytes)."""

    kv_cache: int
    compute: dict[str, int] = field(default_factory=dict)  # buffer type -> bytes
    log: str = ""

    @property
    def compute_total(self) -> int:
        return sum(self.compute.values())


_KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB")
_RS_LINE = re.compile(r"llama_memory_recurrent: size = +([\d.]+) MiB")
_COMPUTE_LINE = re.compile(r"(\S+) compute buffer size = +([\d.]+) MiB")


def parse_dry_run(log: str) -> DryRun:
    """The KV cache and compute buffer sizes from a llama.cpp load log."""
    kv = sum(float(m) for m in _KV_LINE.findall(log)) + sum(float(m) for m in _RS_LINE.findall(log))
    compute: dict[str, int] = {}
    for buf, mib in _COMPUTE_LINE.findall(log):
        compute[buf] = int(float(mib) * MiB)
    return DryRun(kv_cache=int(kv * MiB), compute=compute, log=log)


def dry_run(path: str | os.PathLike[str], plan: Plan, *, n_threads: int = 1) -> DryRun:
    """Run llama.cpp's own dry run (model param ``no_alloc``) for ``plan`` and read the sizes it logs."""
    from ._llama import LlamaLog, load_llama

    kwargs = plan.llama_kwargs()
    kwargs.pop("use_mmap")  # a dry run cannot map
    with LlamaLog(chain=False) as log:
        llm = load_llama(path, model_params={"no_alloc": True}, n_threads=n_threads, verbose=False, **kwargs)
        llm.close()
    result = parse_dry_run(log.text)
    if not result.compute:
        raise ConfigError(f"llama.cpp's dry run of {path} logged no compute buffer size.")
    return result


__all__ = [
    "Budget", "DeviceMemory", "DryRun", "GGML_TYPES", "KV_TYPES", "LayerSpec", "Memory", "ModelSpec", "Plan",
    "PlanResult", "Speed", "baseline_plan", "comparison_table", "compute_buffer_bytes", "decode_speed", "dry_run",
    "evaluate", "fit_like", "fits", "kv_bytes", "kv_type_supported", "memory", "parse_dry_run", "plan", "prefill_speed",
    "read_gguf_header", "recipe_plan", "type_bytes",
]
