"""A model's memory footprint: bytes per device for engine settings, checked against llama.cpp's own dry run.

:func:`footprint` gives the bytes engine settings (:class:`~pipeline.config.EngineConfig`) need on
the GPU and in host memory, from a :class:`~pipeline.tuning.spec.ModelSpec`:

* weights: llama.cpp keeps ``token_embd`` in host memory always; layers
  ``>= n_layers - gpu_layers`` and (with ``gpu_layers > n_layers``) the output
  head go to the GPU, except the expert tensors of the offloaded layers;
* KV cache (:func:`kv_bytes`): full-attention layers ``n_ctx_pad`` cells (``n_ctx``
  rounded up to 256), sliding-window layers as many (the engine's full-size window
  cache, so that prefixes can be cut) or, with ``swa_full=False`` (llama-server's
  default), ``pad256(min(n_ctx_pad, window + n_ubatch))``, recurrent layers no KV but a
  fixed f32 state per sequence (conv ``(d_conv - 1) x channels`` + SSM state);
  K and V sized by ``type_k``/``type_v`` (f16 2 bytes, q8_0 34 per 32, q4_0 18 per
  32 values);
* compute buffer (:func:`compute_buffer_bytes`), derived from llama.cpp's own
  dry runs of generated qwen3moe models (``tests/config/test_plan.py``) and checked on the
  generated hybrid and gpt-oss and on Gemma 3 (``tests/config/test_plan_archs.py``), in bytes per
  token of the micro-batch, ``u = n_ubatch``, ``c = n_ctx_pad``::

      layer = max(24*embd + 8*q_dim,  12*n_used*expert_ff + 17*embd + 4*n_experts + 4*q_dim)
      flash attention on:   u * max(2*m + layer,  4*n_vocab + 8*embd)
      flash attention off:  u * max(4*n_head*c + 4*m + layer,  4*n_vocab + 8*embd)

  ``m`` is the cells of the KQ masks: ``c``, plus the sliding-window cache's cells for a
  model with sliding-window layers (llama.cpp builds a second mask for them); ``2*m`` is
  the f16 masks, ``4*n_head*c + 4*m`` the f32 KQ scores and masks,
  ``4*n_vocab`` the f32 logits of a micro-batch (llama.cpp reserves the graph for
  every token producing an output). *Assumption*: this CPU-only build can only
  measure the CPU compute buffer; a CUDA build's GPU compute buffer is modelled by
  the same formula (the graph is the same one), plus, when experts are in host
  memory, one expert tensor of an offloaded layer (the scheduler copies CPU
  weights into the GPU compute buffer one split at a time), and the host
  (``CUDA_Host``) compute buffer is the KQ mask plus ``8*embd`` per token.

The margins a plan keeps free on each device are the tuner's business
(:class:`pipeline.tuning.result.Budget`). :func:`dry_run` asks llama.cpp itself (model
param ``no_alloc``: nothing allocated) for the real KV and compute buffer sizes,
and :func:`parse_dry_run` reads them from its log; llama.cpp is used only there (through
:func:`pipeline.engine.loading.dry_run_log`, with the engine's own translation of settings).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from ..config import EngineConfig
from ..errors import ConfigError
from .hardware import HardwareProfile
from ..engine.gguf.ggml import type_bytes
from .spec import LayerSpec, ModelSpec

MiB = 1024**2


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes one device needs for engine settings."""

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
class Footprint:
    """The bytes engine settings need on each device, and the KV, recurrent state and compute buffer within them."""

    gpu: DeviceMemory
    cpu: DeviceMemory
    kv_cache: int  # KV cells only (what llama.cpp logs as "llama_kv_cache: size")
    recurrent_state: int
    compute_buffer: int  # the main compute buffer (CPU here, GPU on a CUDA build)

    def to_dict(self) -> dict[str, Any]:
        return dict(gpu=self.gpu.to_dict(), cpu=self.cpu.to_dict(), kv_cache=self.kv_cache,
                    recurrent_state=self.recurrent_state, compute_buffer=self.compute_buffer)


def kv_cells(layer: LayerSpec, settings: EngineConfig, *, swa_full: bool = True) -> int:
    """KV cells llama.cpp allocates for ``layer`` (0 for a recurrent layer).

    A sliding-window layer has a full-size cache with ``swa_full`` (what the engine runs,
    so that a prefix can be cut anywhere), else the window plus one micro-batch
    (llama-server's default), as llama.cpp sizes it.
    """
    n_ctx = _pad(settings.n_ctx, 256)
    if layer.kind == "recurrent":
        return 0
    if layer.kind == "swa" and layer.window and not swa_full:
        return _pad(min(n_ctx, layer.window + settings.n_ubatch), 256)  # one sequence
    return n_ctx


def kv_bytes(spec: ModelSpec, settings: EngineConfig, layers: set[int] | None = None, *,
             swa_full: bool = True) -> tuple[int, int]:
    """(KV cache bytes, recurrent state bytes) of ``layers`` (default all)."""
    kv = state = 0
    for i, lay in enumerate(spec.layers):
        if layers is not None and i not in layers:
            continue
        if lay.kind == "recurrent":
            state += lay.state_bytes  # one sequence
            continue
        cells = kv_cells(lay, settings, swa_full=swa_full)
        kv += cells * (type_bytes(lay.n_head_kv * lay.head_dim_k, settings.type_k)
                       + type_bytes(lay.n_head_kv * lay.head_dim_v, settings.type_v))
    return kv, state


def _mask_cells(spec: ModelSpec, settings: EngineConfig, swa_full: bool) -> int:
    """Cells of the KQ masks a micro-batch's graph holds: one for full attention, one more for the
    sliding-window layers where the model has any (llama.cpp builds both for such a model)."""
    c = _pad(settings.n_ctx, 256)
    swa = [lay for lay in spec.layers if lay.kind == "swa"]
    if not any(lay.kind != "recurrent" for lay in spec.layers):
        return 0
    return c + (kv_cells(swa[0], settings, swa_full=swa_full) if swa else 0)


def compute_buffer_bytes(spec: ModelSpec, settings: EngineConfig, *, swa_full: bool = True) -> int:
    """The main compute buffer of a plan (see the module docstring for the formula and where it comes from).

    Checked against llama.cpp's dry run (``tests/config/test_plan.py``): within 5% wherever
    the KQ mask / scores or the logits dominate (contexts from about 8K up, or a
    large vocabulary); an upper bound elsewhere (up to about +40% for contexts of a
    few thousand tokens, where the buffer is a few MiB): the per-layer term is the
    upper envelope of what ggml's allocator was seen to reserve.
    """
    u = settings.n_ubatch
    c = _pad(settings.n_ctx, 256)
    masks = _mask_cells(spec, settings, swa_full)
    if not masks:
        c = 0
    e, q = spec.n_embd, spec.max_q_dim
    used_ff = spec.n_experts_used * spec.expert_ff
    layer = max(24 * e + 8 * q, 12 * used_ff + 17 * e + 4 * spec.n_experts + 4 * q)
    out = 4 * spec.n_vocab + 8 * e
    if settings.flash_attn:
        attn = 2 * masks
    else:
        attn = 4 * spec.max_n_head * c + 4 * masks
    return u * max(attn + layer, out)


def footprint(spec: ModelSpec, settings: EngineConfig, hw: HardwareProfile | None = None, *,
           swa_full: bool = True) -> Footprint:
    """Bytes per device for ``settings`` (see the module docstring). ``hw`` without a GPU puts everything on
    the CPU; ``swa_full`` (the engine's way) sizes sliding-window layers' caches as full attention's."""
    has_gpu = hw is None or hw.has_gpu
    n = spec.n_layers
    gpu_layers = settings.gpu_layer_set(n) if has_gpu else set()
    cpu_exp = set(settings.cpu_expert_layers(n))
    w_gpu = w_cpu = spec.embd_bytes * 0
    w_cpu += spec.embd_bytes
    if has_gpu and settings.output_on_gpu(n):
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
    kv_all, state_all = kv_bytes(spec, settings, swa_full=swa_full)
    kv_g, st_g = kv_bytes(spec, settings, gpu_layers, swa_full=swa_full)
    compute = compute_buffer_bytes(spec, settings, swa_full=swa_full)
    out_buf = spec.n_vocab * 4 + spec.n_embd * 4
    if has_gpu and gpu_layers:
        copy = max((spec.layers[i].expert_tensor_max for i in cpu_exp & gpu_layers), default=0)
        host_compute = settings.n_ubatch * (2 * _mask_cells(spec, settings, swa_full) + 8 * spec.n_embd)
        if len(gpu_layers) < n:  # partial offload: the CPU layers need their own graph buffers
            host_compute = max(host_compute, compute)
        gpu = DeviceMemory(weights=w_gpu, kv=kv_g + st_g, compute=compute + copy,
                           reserved=hw.gpu_reserved if hw else 0)
        cpu = DeviceMemory(weights=w_cpu, kv=(kv_all - kv_g) + (state_all - st_g), compute=host_compute + out_buf)
    else:
        gpu = DeviceMemory()
        cpu = DeviceMemory(weights=w_cpu + w_gpu, kv=kv_all + state_all, compute=compute + out_buf)
    return Footprint(gpu=gpu, cpu=cpu, kv_cache=kv_all, recurrent_state=state_all, compute_buffer=compute)


# --------------------------------------------------------------------------- llama.cpp's dry run


@dataclass(frozen=True)
class DryRun:
    """Sizes llama.cpp reported for a load with ``no_alloc`` (bytes)."""

    kv_cache: int
    compute: dict[str, int] = field(default_factory=dict)  # buffer type -> bytes
    log: str = ""


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


def dry_run(path: str | os.PathLike[str], settings: EngineConfig, *, n_threads: int = 1,
            swa_full: bool = True) -> DryRun:
    """Run llama.cpp's own dry run (model param ``no_alloc``) for ``settings`` and read the sizes it logs
    (``swa_full`` False: sliding-window layers keep only their window, llama-server's default)."""
    from ..engine.loading import dry_run_log
    from ..engine.local import Engine

    engine = Engine(path, replace(settings, threads=n_threads, threads_batch=n_threads))
    result = parse_dry_run(dry_run_log(path, engine.settings, n_ctx=engine.n_ctx, swa_full=swa_full))
    if not result.compute:
        raise ConfigError(f"llama.cpp's dry run of {path} logged no compute buffer size.")
    return result


__all__ = ["DeviceMemory", "DryRun", "Footprint", "compute_buffer_bytes", "dry_run", "kv_bytes", "footprint", "kv_cells",
           "parse_dry_run"]
