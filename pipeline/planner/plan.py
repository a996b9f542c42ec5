"""Plan expert offload and batch sizes for the fastest prefill that fits the memory.

A :class:`Plan` is one llama.cpp configuration (context, batch sizes, KV type,
flash attention, where layers and experts live); :class:`Budget` is what it may
use on each device (VRAM and host RAM, each less a margin). The planner
(:func:`plan`) searches exhaustively over the layers with experts on the CPU
(count, first or last), ``n_ubatch`` in 128..4096 (powers of two), ``n_batch =
n_ubatch`` unless fixed, KV type fixed or searched, for the fastest estimated
prefill whose estimated memory plus margin fits both budgets; the result is a
:class:`PlanResult` (memory per device, estimated speeds, llama.cpp flags, an
``[engine]`` config snippet). :func:`fit_like` models llama.cpp's ``--fit`` (fewest
first layers' experts on the CPU that fit with 1 GiB margin at ``-b 2048 -ub
512``) for comparison; :func:`recipe_plan` and :func:`baseline_plan` are the recipe
this project starts from and its baseline.

The models it relies on live in their own modules: :mod:`pipeline.planner.spec` (what a
model is made of, read from a GGUF), :mod:`pipeline.planner.memory` (bytes per device,
checked against llama.cpp's dry run) and :mod:`pipeline.planner.speed` (estimated prefill
and decode tokens/s). Their public names are re-exported here for convenience.

Margins: the planner keeps ``gpu_margin`` bytes free on the GPU (default 256 MiB,
above the profile's ``gpu_reserved`` for the CUDA context) and ``ram_margin`` in
host memory (default 2 GiB); llama.cpp's ``--fit`` keeps 1 GiB per device.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from ..errors import ConfigError
from .hardware import GiB, HardwareProfile
from .memory import DeviceMemory, DryRun, Memory, compute_buffer_bytes, dry_run, kv_bytes, kv_cells, memory, \
    parse_dry_run
from ..engine.offload import EXPERT_PATTERN, n_cpu_moe
from ..engine.ggml import GGML_TYPES, KV_TYPE_IDS, type_bytes
from .spec import KV_TYPES, LayerSpec, ModelSpec, kv_type_supported, read_gguf
from .speed import Speed, decode_speed, prefill_speed

MiB = 1024**2


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
        """The :class:`pipeline.engine.offload.Override` list of this plan's expert placement."""
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

    def engine_settings(self, **extra: Any):
        """This plan as engine settings (:class:`pipeline.config.EngineConfig`; ``extra``: threads...),
        which :func:`pipeline.engine.generator.load_params` turns into llama.cpp's."""
        from ..config import EngineConfig

        return EngineConfig(n_ctx=self.n_ctx, n_batch=self.n_batch, n_ubatch=self.n_ubatch,
                            flash_attn=self.flash_attn, type_k=self.type_k, type_v=self.type_v,
                            gpu_layers=self.gpu_layers, n_cpu_moe=self.n_cpu_moe, cpu_moe_from=self.cpu_moe_from,
                            mmap=self.mmap, **extra)


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


def compare(spec: ModelSpec, hw: HardwareProfile, *, n_ctx: int, budget: Budget | None = None
            ) -> list[PlanResult]:
    """The README's comparison: the recipe's baseline (-b 512 -ub 128) and the recipe itself (8 layers'
    experts on the CPU, -b 1024 -ub 512), llama.cpp's fit (modelled), the plan, and the plan with the KV
    type searched. The baseline is checked with no margin, as it was run; configurations that cannot be
    built for this model or budget are left out."""
    budget = budget or Budget.from_hardware(hw)
    rows: list[PlanResult] = []
    try:
        rows.append(evaluate(spec, baseline_plan(spec, hw, n_ctx), hw, Budget(vram=hw.vram, ram=hw.ram, gpu_margin=0),
                             label="baseline (-b 512 -ub 128)"))
    except ConfigError:
        pass
    rows.append(evaluate(spec, recipe_plan(n_ctx), hw, budget, label="recipe (--n-cpu-moe 8 -b 1024 -ub 512)"))
    fit = fit_like(spec, hw, n_ctx=n_ctx, budget=budget)
    if fit is not None:
        rows.append(replace(fit, label="llama.cpp --fit (modelled)"))
    rows.append(plan(spec, hw, n_ctx=n_ctx, budget=budget))
    searched = plan(spec, hw, n_ctx=n_ctx, budget=budget, kv_types=("f16", "q8_0", "q4_0"))
    rows.append(replace(searched, label="plan, KV type searched"))
    return rows


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


__all__ = [
    "Budget", "DEFAULT_GPU_MARGIN", "DEFAULT_RAM_MARGIN", "FIT_MARGIN", "Plan", "PlanResult", "UBATCHES",
    "baseline_plan", "compare", "comparison_table", "evaluate", "fit_like", "fits", "plan", "recipe_plan",
    # re-exported from pipeline.planner.spec, pipeline.planner.memory and pipeline.planner.speed
    "DeviceMemory", "DryRun", "GGML_TYPES", "KV_TYPES", "KV_TYPE_IDS", "LayerSpec", "Memory", "ModelSpec", "Speed",
    "compute_buffer_bytes", "decode_speed", "dry_run", "kv_bytes", "kv_cells", "kv_type_supported", "memory",
    "parse_dry_run", "prefill_speed", "read_gguf", "type_bytes",
]
