"""The plan value: engine settings with their memory and speed estimates, and the budget they are judged by.

A :class:`PlanResult` is one :class:`~pipeline.config.EngineConfig` (the settings the
engine reads, so a plan runs as it is) with what the models say about it on a hardware
profile: bytes per device (:mod:`.footprint`), prefill and decode speed (:mod:`.speed`),
and whether that fits a :class:`Budget` (VRAM and host RAM, each less a margin). It
also renders the settings as llama.cpp flags and as an ``[engine]`` config section.
:func:`evaluate` makes one; the search over settings is :mod:`.choice`.

Margins: a plan keeps ``gpu_margin`` bytes free on the GPU (default 256 MiB, above
the profile's ``gpu_reserved`` for the CUDA context) and ``ram_margin`` in host
memory (default 2 GiB); llama.cpp's ``--fit`` keeps 1 GiB per device.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from ..config import PLANNED_KEYS, EngineConfig
from ..engine.offload import EXPERT_PATTERN
from .hardware import GiB, HardwareProfile
from .footprint import Footprint, footprint
from .spec import ModelSpec
from .speed import Speed, decode_speed, prefill_speed

MiB = 1024**2
DEFAULT_GPU_MARGIN = 256 * MiB
DEFAULT_RAM_MARGIN = 2 * GiB


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


def fits(mem: Footprint, budget: Budget) -> bool:
    """Whether ``mem`` plus the margins fits the budget (a device with no budget must hold nothing)."""
    gpu_ok = mem.gpu.total == 0 or mem.gpu.total + budget.gpu_margin <= budget.vram
    return gpu_ok and mem.cpu.total + budget.ram_margin <= budget.ram


def llama_flags(settings: EngineConfig, n_layers: int, *, swa: bool = False) -> list[str]:
    """The ``llama-server``/``llama-cli`` flags equivalent to ``settings`` on a model of ``n_layers`` layers
    (``swa``: a model with sliding-window layers, whose full-size window cache the plan counts)."""
    s = settings
    ngl = "999" if s.gpu_layers < 0 else str(s.gpu_layers)
    flags = ["-c", str(s.n_ctx), "-b", str(s.n_batch), "-ub", str(s.n_ubatch), "-ngl", ngl,
             "-fa", "on" if s.flash_attn else "off"]
    if s.type_k != "f16" or s.type_v != "f16":
        flags += ["-ctk", s.type_k, "-ctv", s.type_v]
    layers = s.cpu_expert_layers(n_layers)
    n = len(layers)
    if n == n_layers and n:
        flags += ["--cpu-moe"]
    elif n and s.cpu_moe_from == "first":
        flags += ["--n-cpu-moe", str(n)]
    elif n:
        alt = "|".join(str(i) for i in layers)
        flags += ["-ot", rf"blk\.({alt}){EXPERT_PATTERN}=CPU"]
    if not s.mmap:
        flags += ["--no-mmap"]
    if swa:
        flags += ["--swa-full"]
    return flags


@dataclass(frozen=True)
class PlanResult:
    """Engine settings with their memory, estimated speeds and the ways to use them."""

    spec: ModelSpec
    settings: EngineConfig
    memory: Footprint
    prefill: Speed
    decode_tokens_per_s: float
    budget: Budget
    label: str = "plan"

    @property
    def fits(self) -> bool:
        return fits(self.memory, self.budget)

    @property
    def experts_on_cpu(self) -> int:
        return len(self.settings.cpu_expert_layers(self.spec.n_layers))

    @property
    def flags(self) -> list[str]:
        return llama_flags(self.settings, self.spec.n_layers, swa=any(lay.kind == "swa" for lay in self.spec.layers))

    @property
    def engine_toml(self) -> str:
        return self.settings.planned_toml()

    def to_dict(self) -> dict[str, Any]:
        return dict(
            label=self.label, model=self.spec.name, plan={k: getattr(self.settings, k) for k in PLANNED_KEYS},
            fits=self.fits, memory=self.memory.to_dict(), budget=asdict(self.budget),
            prefill=self.prefill.to_dict(), decode_tokens_per_s=self.decode_tokens_per_s,
            llama_flags=self.flags, engine_toml=self.engine_toml,
        )

    def describe(self) -> str:
        g, c, s = self.memory.gpu, self.memory.cpu, self.settings
        lines = [
            f"{self.label}: {self.spec.name}, {'fits' if self.fits else 'DOES NOT FIT'}",
            f"  experts on CPU: {self.experts_on_cpu} layers ({s.cpu_moe_from}); "
            f"n_batch {s.n_batch}, n_ubatch {s.n_ubatch}, KV {s.type_k}/{s.type_v}, "
            f"flash attention {'on' if s.flash_attn else 'off'}",
            (f"  GPU: weights {gib(g.weights)}, KV {gib(g.kv)}, compute {gib(g.compute)}, reserved "
             f"{gib(g.reserved)}, margin {gib(self.budget.gpu_margin)} = "
             f"{gib(g.total + self.budget.gpu_margin)} of {gib(self.budget.vram)}") if g.total else
            f"  GPU: nothing placed (budget {gib(self.budget.vram)})",
            f"  CPU: weights {gib(c.weights)}, KV {gib(c.kv)}, compute {gib(c.compute)}, margin "
            f"{gib(self.budget.ram_margin)} = {gib(c.total + self.budget.ram_margin)} of {gib(self.budget.ram)}",
            f"  prefill ~{self.prefill.tokens_per_s:.0f} tok/s over {self.prefill.n_tokens} tokens "
            f"({self.prefill.bound}-bound); decode ~{self.decode_tokens_per_s:.0f} tok/s",
            "  llama.cpp: " + " ".join(_shell_quote(f) for f in self.flags),
        ]
        n = self.spec.n_layers
        if self.budget.vram and 0 <= s.gpu_layers < n:
            lines.insert(1, "  a CPU plan: the GPU budget holds no layer with these margins (-ngl 0)" if s.gpu_layers == 0
                         else f"  partial offload: {s.gpu_layers} of {n} layers on the GPU; no plan with every layer "
                              "there fits the budget")
        return "\n".join(lines)


def gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _shell_quote(s: str) -> str:
    return s if re.fullmatch(r"[A-Za-z0-9_.,=:/+-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def evaluate(spec: ModelSpec, settings: EngineConfig, hw: HardwareProfile, budget: Budget | None = None, *,
             label: str = "plan", n_tokens: int | None = None) -> PlanResult:
    """Memory and speed estimates of ``settings`` (valid, with ``n_ctx`` resolved) on ``hw``."""
    budget = budget or Budget.from_hardware(hw)
    return PlanResult(spec=spec, settings=settings, memory=footprint(spec, settings, hw),
                      prefill=prefill_speed(spec, settings, hw, n_tokens),
                      decode_tokens_per_s=decode_speed(spec, settings, hw), budget=budget, label=label)


__all__ = ["Budget", "DEFAULT_GPU_MARGIN", "DEFAULT_RAM_MARGIN", "PlanResult", "evaluate", "fits", "gib",
           "llama_flags"]
