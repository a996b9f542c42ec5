"""The ``[engine]`` settings: the generator in llama.cpp, configured for fast prefill.

:class:`EngineConfig` is the one settings type of the engine: the engine runs it, the
tuner estimates it and ``rag tune`` measures and saves it (a tuned profile sets the
:data:`PLANNED_KEYS`). :meth:`EngineConfig.validate` is the one check all of them use;
the placement rules (which layers and experts go where) read it the way llama.cpp does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..engine.gguf.ggml import KV_TYPE_IDS
from ..errors import ConfigError
from .ranges import MAX_THREADS, check_section
from .sources import toml_value

KV_TYPES = tuple(KV_TYPE_IDS)
"""The KV cache types llama.cpp knows."""

#: The ``[engine]`` keys that say what llama.cpp runs with and where the weights live: what the
#: tuner chooses and a tuned profile sets (threads, seed, RoPE and ``-ot`` patterns are left alone).
PLANNED_KEYS = ("n_ctx", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v", "gpu_layers", "n_cpu_moe",
                "cpu_moe", "cpu_moe_from", "mmap")
#: KV cache types that are not quantised: llama.cpp needs flash attention for any other V cache type.
UNQUANTISED_KV = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class EngineConfig:
    """The generator in llama.cpp, configured for fast prefill: the one settings type of the engine.

    The engine runs it, the tuner estimates it (a plan is an ``EngineConfig`` plus its
    memory and speed estimates) and ``rag tune`` measures and saves it; :meth:`validate`
    is the one check all of them use.

    ``n_ctx`` above the model's trained context is clamped (with a warning) unless
    ``rope_scaling`` is set; ``n_ctx = 0`` means the trained context. ``gpu_layers = -1``
    puts every layer and the output head on the GPU (llama.cpp's ``-ngl`` above the layer
    count). Expert offload has llama.cpp's meaning: ``n_cpu_moe`` layers' experts in CPU
    memory (the first or last ``cpu_moe_from``), ``cpu_moe`` for all of them, and
    ``override_tensors`` for ``-ot``-style ``regex=BUFFER`` lists. With ``tuned``, the
    profile ``rag tune`` wrote for this model and context replaces the settings left at
    their defaults (never ones you set).
    """

    n_ctx: int = 8192
    """Context length in tokens, the longest prompt plus answer; 0 = the model's trained context."""
    n_batch: int = 2048
    """Logical batch (llama.cpp's -b): prompt tokens submitted per decode call."""
    n_ubatch: int = 512
    """Micro-batch (-ub): tokens computed at once; larger amortises per-batch costs such as expert copies."""
    flash_attn: bool = True
    """Flash attention: faster prefill, and needed for a quantised V cache."""
    type_k: str = "f16"
    """KV cache type of the keys (f16, q8_0 = half the memory, q4_0 = a quarter, ...)."""
    type_v: str = "f16"
    """KV cache type of the values; a quantised one needs flash_attn."""
    gpu_layers: int = -1
    """Layers on the GPU on a GPU build (-ngl); -1 = every layer and the output head."""
    threads: int = 0
    """CPU threads for decoding; 0 = every usable core (split between engines when parallel > 1)."""
    threads_batch: int = 0
    """CPU threads for prefill; 0 = the same as threads."""
    mmap: bool = True
    """Map the model file instead of reading it; off by itself when tensors are overridden (pinned memory)."""
    n_cpu_moe: int = 0
    """Keep the routed experts of this many layers in CPU memory (--n-cpu-moe), so VRAM goes to KV and batch."""
    cpu_moe: bool = False
    """Keep every layer's routed experts in CPU memory (--cpu-moe)."""
    cpu_moe_from: str = "last"
    """Which n_cpu_moe layers: "first" (llama.cpp's choice) or "last"."""
    override_tensors: str = ""
    """llama.cpp -ot style "regex=BUFFER,..." tensor placements, applied before the expert settings."""
    rope_scaling: str = ""
    """RoPE scaling ("linear" or "yarn") that allows n_ctx above the trained context; empty = none."""
    rope_freq_scale: float = 0.0
    """RoPE frequency scale with rope_scaling; 0 = the model's own."""
    seed: int = 0
    """Sampling seed, so that answers at temperature > 0 are reproducible."""
    n_seq_max: int = 1
    """Sequences one context decodes together (several prompts over one prefix, one decode per step)."""
    tuned: bool = True
    """Use the profile `rag tune` saved for this model and context, for settings left at their defaults."""
    parallel: int = 1
    """Engines (llama.cpp contexts) answering concurrent questions in one process."""

    def validate(self) -> "EngineConfig":
        """Refuse settings llama.cpp cannot run, naming the setting and the cause; return ``self``."""
        for key in ("type_k", "type_v"):
            if getattr(self, key) not in KV_TYPES:
                raise ConfigError(f"engine.{key} must be one of {', '.join(KV_TYPES)}, got {getattr(self, key)!r}")
        if self.type_v not in UNQUANTISED_KV and not self.flash_attn:
            raise ConfigError(f"engine.type_v = {self.type_v!r} is a quantised V cache, which llama.cpp runs only "
                              "with flash attention: set engine.flash_attn = true, or engine.type_v = \"f16\"")
        check_section("engine", self)
        if self.n_ubatch > self.n_batch:
            raise ConfigError(f"engine.n_ubatch cannot exceed engine.n_batch ({self.n_batch}), got {self.n_ubatch}")
        if self.cpu_moe_from not in ("first", "last"):
            raise ConfigError(f"engine.cpu_moe_from must be 'first' or 'last', got {self.cpu_moe_from!r}")
        if self.rope_scaling not in ("", "none", "linear", "yarn"):
            raise ConfigError(f"engine.rope_scaling must be '', 'linear' or 'yarn', got {self.rope_scaling!r}")
        return self

    # -- what the settings mean for a model of ``n_layers`` layers (llama.cpp's placement rules) --

    def gpu_layer_set(self, n_layers: int) -> set[int]:
        """Layers llama.cpp puts on the GPU for ``-ngl gpu_layers``: the last ones."""
        k = n_layers + 1 if self.gpu_layers < 0 else self.gpu_layers
        return set(range(max(n_layers - k, 0), n_layers))

    def output_on_gpu(self, n_layers: int) -> bool:
        """Whether the output head is on the GPU (``-ngl`` above the layer count)."""
        return self.gpu_layers < 0 or self.gpu_layers > n_layers

    def cpu_expert_layers(self, n_layers: int) -> list[int]:
        """Layers whose routed experts stay in host memory (``cpu_moe``: all of them)."""
        n = n_layers if self.cpu_moe else min(self.n_cpu_moe, n_layers)
        return list(range(n)) if self.cpu_moe_from == "first" else list(range(n_layers - n, n_layers))

    @property
    def uses_mmap(self) -> bool:
        """Whether the engine maps the file: tensors overridden to the CPU load without mmap, so that a
        GPU build can pin them for fast copies."""
        return self.mmap and not (self.cpu_moe or self.n_cpu_moe or self.override_tensors.strip())

    def as_run(self, n_layers: int, *, gpu: bool) -> "EngineConfig":
        """These settings as the engine runs them on a model of ``n_layers`` layers: batches clamped
        to the context, expert offload in one form (``cpu_moe`` for every layer), mmap as loaded,
        no GPU layers without ``gpu``. Raises :class:`ConfigError` for settings that cannot run.

        ``n_ctx`` must be resolved (not 0) by the caller.
        """
        n_batch = min(self.n_batch, self.n_ctx)
        k = n_layers if self.cpu_moe else min(self.n_cpu_moe, n_layers)
        out = dataclasses.replace(
            self, n_batch=n_batch, n_ubatch=min(self.n_ubatch, n_batch), mmap=self.uses_mmap,
            gpu_layers=self.gpu_layers if gpu else 0, cpu_moe=bool(k) and k == n_layers,
            n_cpu_moe=k if k < n_layers else 0)
        return out.validate()

    def with_planned(self, planned: "EngineConfig") -> "EngineConfig":
        """These settings with the planned keys (:data:`PLANNED_KEYS`) of ``planned``: threads, seed,
        RoPE and ``-ot`` patterns kept."""
        return dataclasses.replace(self, **{k: getattr(planned, k) for k in PLANNED_KEYS})

    def planned_toml(self) -> str:
        """An ``[engine]`` section with the planned keys, for a config file or a tuned profile."""
        return "\n".join(["[engine]", *(f"{k} = {toml_value(getattr(self, k))}" for k in PLANNED_KEYS)]) + "\n"


__all__ = ["EngineConfig", "KV_TYPES", "PLANNED_KEYS", "UNQUANTISED_KV"]
