"""Choose expert offload and batch sizes: the fastest estimated prefill that fits the memory.

The tuner (:func:`fastest`) searches exhaustively over the layers with experts on the
CPU (count, first or last), ``n_ubatch`` in 128..4096 (powers of two), ``n_batch =
n_ubatch`` unless fixed, KV type fixed or searched, for the fastest estimated prefill
whose estimated memory plus margin fits both budgets. Estimates within 1 % of the
fastest count as a tie, broken towards fewer experts on the CPU, the earlier KV type,
then the *larger* micro-batch (kernels run closer to their speed on bigger ones, and
the speed model's curve flattens there). The result is a
:class:`~pipeline.tuning.result.PlanResult`: an :class:`~pipeline.config.EngineConfig`
the engine runs as it is, with its memory per device, estimated speeds, llama.cpp
flags and an ``[engine]`` config snippet.

:func:`fit_like` models llama.cpp's ``--fit`` (fewest first layers' experts on the CPU
that fit with 1 GiB margin at ``-b 2048 -ub 512``) for comparison; :func:`recipe_plan`
and :func:`baseline_plan` are the recipe this project starts from and its baseline.

Requests that cannot be planned raise :class:`ConfigError` with one line that names
the cause: a context above the model's trained one, weights larger than the whole
budget, fixed batch sizes that contradict each other, a quantised V cache without
flash attention.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import EngineConfig
from ..errors import ConfigError
from .hardware import GiB, HardwareProfile
from .footprint import footprint
from .result import Budget, PlanResult, evaluate, fits, gib
from .spec import ModelSpec, kv_type_supported
from .speed import decode_speed, prefill_speed

FIT_MARGIN = 1 * GiB  # llama.cpp's --fit, per device
UBATCHES = (128, 256, 512, 1024, 2048, 4096)
TIE = 0.01  # estimates this close to the fastest are ties


def search_base() -> EngineConfig:
    """The settings a plan starts from when none are given: flash attention on, mmap off."""
    return EngineConfig(mmap=False, cpu_moe_from="first", tuned=False)


def placed(base: EngineConfig, k: int, n_layers: int, *, which: str = "first", gpu: bool = True) -> EngineConfig:
    """``base`` with ``k`` layers' experts in host memory (the ``which`` ones) and, on a GPU, every layer there."""
    k = max(0, min(k, n_layers))
    return replace(base, gpu_layers=-1 if gpu else 0, cpu_moe=bool(k) and k == n_layers,
                   n_cpu_moe=k if k < n_layers else 0, cpu_moe_from=which if k else base.cpu_moe_from)


def check_request(spec: ModelSpec, hw: HardwareProfile, budget: Budget, *, n_ctx: int) -> None:
    """Refuse, in one line, a request no plan can meet (before searching)."""
    if n_ctx < 1:
        raise ConfigError(f"the context must be at least 1 token, got {n_ctx}")
    if spec.n_ctx_train and n_ctx > spec.n_ctx_train:
        raise ConfigError(f"a context of {n_ctx:,} tokens is above {spec.name}'s trained context of "
                          f"{spec.n_ctx_train:,}: ask for at most {spec.n_ctx_train:,}")
    room = max(budget.ram - budget.ram_margin, 0) + (max(budget.vram - budget.gpu_margin - hw.gpu_reserved, 0)
                                                     if hw.has_gpu else 0)
    if spec.total_bytes > room:
        where = f"{gib(budget.vram)} of VRAM and {gib(budget.ram)} of RAM" if hw.has_gpu else f"{gib(budget.ram)} of RAM"
        raise ConfigError(f"{spec.name}'s weights alone take {gib(spec.total_bytes)}, more than the "
                          f"{gib(room)} that {where} leave after the margins")


def fastest(spec: ModelSpec, hw: HardwareProfile, *, n_ctx: int, budget: Budget | None = None,
         kv_types: tuple[str, ...] | str = "f16", n_ubatch: int | None = None, n_batch: int | None = None,
         flash_attn: bool = True, mmap: bool = False, n_tokens: int | None = None,
         base: EngineConfig | None = None) -> PlanResult:
    """The fastest estimated plan that fits ``budget`` (default: the profile's VRAM and RAM, default margins).

    ``kv_types`` is one KV type (used for K and V) or a tuple of them to search.
    ``n_ubatch`` / ``n_batch`` fix the batch sizes instead of searching. ``base`` holds
    the settings a plan does not choose (threads, seed, RoPE; default
    :func:`search_base`). Raises :class:`ConfigError` if nothing fits or the request
    cannot be met.
    """
    budget = budget or Budget.from_hardware(hw)
    check_request(spec, hw, budget, n_ctx=n_ctx)
    base = replace(base or search_base(), n_ctx=n_ctx, flash_attn=flash_attn, mmap=mmap)
    if n_ubatch is not None and n_batch is not None and n_ubatch > n_batch:
        raise ConfigError(f"n_ubatch ({n_ubatch}) cannot exceed n_batch ({n_batch})")
    kvs = (kv_types,) if isinstance(kv_types, str) else tuple(kv_types)
    kvs = tuple(t for t in kvs if kv_type_supported(spec, t)) or ("f16",)
    for kv in kvs:
        replace(base, type_k=kv, type_v=kv).validate()  # e.g. a quantised V cache without flash attention
    cap = min(n_ctx, n_batch or n_ctx)  # llama.cpp clamps micro-batches to the batch and the context
    ubs = (min(n_ubatch, n_ctx),) if n_ubatch else tuple(sorted({min(u, cap) for u in UBATCHES}))
    n = spec.n_layers
    gpu = hw.has_gpu
    has_experts = spec.expert_bytes > 0
    cpu_counts = range(n + 1) if (has_experts and gpu) else (0,)
    found: list[tuple[PlanResult, int, int, int]] = []  # (result, experts on CPU, KV index, ubatch)
    for kv_index, kv in enumerate(kvs):
        for ub in ubs:
            nb = max(min(n_batch or ub, n_ctx), ub)  # n_batch = n_ubatch unless fixed
            for frm in (("first", "last") if has_experts and gpu else ("first",)):
                for k in cpu_counts:
                    if frm == "last" and k in (0, n):
                        continue  # same as "first"
                    s = placed(replace(base, n_batch=nb, n_ubatch=ub, type_k=kv, type_v=kv), k, n, which=frm,
                               gpu=gpu)
                    mem = footprint(spec, s, hw)
                    if not fits(mem, budget):
                        continue
                    found.append((PlanResult(spec, s, mem, prefill_speed(spec, s, hw, n_tokens),
                                             decode_speed(spec, s, hw), budget, "plan"), k, kv_index, ub))
                    break  # more experts on the CPU only slows this (kv, ub, from) down
    if found:
        fastest = max(r.prefill.tokens_per_s for r, *_ in found)
        ties = [f for f in found if f[0].prefill.tokens_per_s >= fastest * (1 - TIE)]
        return max(ties, key=lambda f: (-f[1], -f[2], f[3], f[0].prefill.tokens_per_s))[0]
    best = _partial_offload(spec, hw, budget, base=replace(base, type_k=kvs[0], type_v=kvs[0]), ubs=ubs,
                            n_tokens=n_tokens) if gpu else None
    if best is None:
        raise ConfigError(f"{spec.name} does not fit: no plan at {n_ctx:,} context fits {gib(budget.vram)} VRAM "
                          f"and {gib(budget.ram)} RAM with the margins (try a smaller context or KV type, "
                          "or a bigger budget)")
    return best


def _partial_offload(spec: ModelSpec, hw: HardwareProfile, budget: Budget, *, base: EngineConfig,
                     ubs: tuple[int, ...], n_tokens: int | None) -> PlanResult | None:
    """No full offload fits: per micro-batch size, the most GPU layers (-ngl) that fit, every expert on the CPU
    (a dense model has none to move); the fastest of those, ties to the larger micro-batch. ``-ngl 0`` is a
    CPU plan: :meth:`PlanResult.describe` says so."""
    n, found = spec.n_layers, []
    experts = n if spec.expert_bytes > 0 else 0
    for ub in ubs:
        for ngl in range(n, -1, -1):
            s = replace(placed(replace(base, n_batch=max(ub, 1), n_ubatch=ub), experts, n), gpu_layers=ngl)
            mem = footprint(spec, s, hw)
            if fits(mem, budget):
                found.append(PlanResult(spec, s, mem, prefill_speed(spec, s, hw, n_tokens),
                                        decode_speed(spec, s, hw), budget))
                break
    if not found:
        return None
    fastest = max(r.prefill.tokens_per_s for r in found)
    return max((r for r in found if r.prefill.tokens_per_s >= fastest * (1 - TIE)),
               key=lambda r: (r.settings.n_ubatch, r.prefill.tokens_per_s))


def fit_like(spec: ModelSpec, hw: HardwareProfile, *, n_ctx: int, budget: Budget | None = None,
             kv: str = "f16", n_tokens: int | None = None) -> PlanResult | None:
    """A model of llama.cpp's ``--fit``: default ``-b 2048 -ub 512``, the fewest first layers' experts
    on the CPU that fit with a 1 GiB margin per device. None when that fails (llama.cpp would then
    cut layers or context). The result is judged against ``budget`` (its own margins)."""
    budget = budget or Budget.from_hardware(hw)
    fit_budget = replace(budget, gpu_margin=FIT_MARGIN, ram_margin=max(FIT_MARGIN, budget.ram_margin))
    n = spec.n_layers
    base = replace(search_base(), n_ctx=n_ctx, n_batch=min(2048, n_ctx), n_ubatch=min(512, n_ctx),
                   type_k=kv, type_v=kv, mmap=True)
    for k in (range(n + 1) if hw.has_gpu else (0,)):
        s = placed(base, k, n, gpu=hw.has_gpu)
        mem = footprint(spec, s, hw)
        if fits(mem, fit_budget):
            return PlanResult(spec, s, mem, prefill_speed(spec, s, hw, n_tokens), decode_speed(spec, s, hw),
                              budget, "llama.cpp --fit (model)")
    return None


# --------------------------------------------------------------------------- the recipe


def recipe_plan(n_ctx: int = 65536) -> EngineConfig:
    """The recipe this project starts from: 8 layers' experts on the CPU, ``-b 1024 -ub 512``, f16 KV, FA,
    mmap off (pinned host memory: the calibration assumes it)."""
    return replace(search_base(), n_ctx=n_ctx, n_batch=1024, n_ubatch=512, n_cpu_moe=8)


def baseline_plan(spec: ModelSpec, hw: HardwareProfile, n_ctx: int = 65536, budget: Budget | None = None
                  ) -> EngineConfig:
    """The recipe's baseline: ``-b 512 -ub 128``, experts on the GPU as far as they fit (fewest first layers' on CPU)."""
    budget = budget or Budget(vram=hw.vram, ram=hw.ram, gpu_margin=0)
    base = replace(search_base(), n_ctx=n_ctx, n_batch=512, n_ubatch=128)
    for k in range(spec.n_layers + 1):
        s = placed(base, k, spec.n_layers)
        if fits(footprint(spec, s, hw), budget):
            return s
    raise ConfigError("The baseline does not fit.")


def compare(spec: ModelSpec, hw: HardwareProfile, *, n_ctx: int, budget: Budget | None = None
            ) -> list[PlanResult]:
    """The comparison in docs/performance.md: the recipe's baseline (-b 512 -ub 128) and the recipe itself (8 layers'
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
    rows.append(fastest(spec, hw, n_ctx=n_ctx, budget=budget))
    searched = fastest(spec, hw, n_ctx=n_ctx, budget=budget, kv_types=("f16", "q8_0", "q4_0"))
    rows.append(replace(searched, label="plan, KV type searched"))
    return rows


def comparison_table(results: list[PlanResult]) -> str:
    """A markdown table comparing plans: settings, memory per device, estimated speeds."""
    head = ("| configuration | experts on CPU | -b / -ub | KV | GPU memory | host memory | fits | "
            "est. prefill tok/s (bound) | est. decode tok/s |")
    rows = [head, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        s = r.settings
        rows.append(
            f"| {r.label} | {r.experts_on_cpu} ({s.cpu_moe_from}) | {s.n_batch} / {s.n_ubatch} | "
            f"{s.type_k} | {gib(r.memory.gpu.total)} of {gib(r.budget.vram)} | {gib(r.memory.cpu.total)} | "
            f"{'yes' if r.fits else 'no'} | {r.prefill.tokens_per_s:.0f} ({r.prefill.bound}) | "
            f"{r.decode_tokens_per_s:.0f} |")
    return "\n".join(rows) + "\n"


__all__ = ["FIT_MARGIN", "TIE", "UBATCHES", "baseline_plan",
           "check_request", "compare", "comparison_table", "fit_like", "fastest", "placed", "search_base",
           "recipe_plan"]
