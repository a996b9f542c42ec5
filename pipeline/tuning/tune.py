"""Tune the engine on this machine: measure a few plans around the tuner's estimate, keep the fastest that fits.

The library behind ``rag tune``. :func:`tune`

1. reads the model's spec (:mod:`pipeline.tuning.spec`) and asks the tuner
   (:func:`pipeline.tuning.choice.fastest`) for the fastest plan it estimates for this machine:
   on a build without GPU offload (or ``gpu_layers = 0``) the GPU budget is 0 and
   everything is on the CPU;
2. builds a handful of candidate settings around it: the configured settings (the
   *baseline*, always measured first), the plan, the plan at the other micro-batch
   sizes (each with the fewest experts on the CPU that fit), flash attention
   toggled, a q8_0 KV cache where the model's head size allows it, and on a GPU
   the experts of the last layers instead of the first;
3. measures each with short real prefills (``Engine.generate(tokens,
   max_tokens=1)``, tokens/s from llama.cpp's own timings), in order, and stops
   starting new candidates when the next one would overrun ``max_seconds`` (its
   cost predicted from the ones measured so far);
4. picks the fastest measured candidate whose estimated memory fits the budget
   (:mod:`pipeline.tuning.footprint`; a candidate over budget is never measured nor picked).

With ``measure_hardware``, the host's figures are measured first: numpy's matrix
FLOP/s and the RAM, then (on a CPU-only run) a short prefill of the model at three
micro-batch sizes, to which :func:`fit_cpu_curve` fits the CPU's FLOP/s and its
micro-batch curve (see :mod:`pipeline.tuning.speed`); the plans then use them.

:meth:`TuneResult.profile_text` is the winner as an ``[engine]`` TOML table (with the
measurements as comments); :mod:`pipeline.config.tuned` writes it where ``rag ask`` finds it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from ..config import EngineConfig, toml_value
from ..errors import ConfigError, RagError
from ..config.tuned import PROFILE_KEYS
from ..engine.host import detect_ram
from ..engine.gguf.info import effective_n_ctx
from .hardware import GiB, HardwareProfile
from .hardware import measure_hardware as _measure_hardware
from .measure import CURVE_UBATCHES, gpu_offload_available, measure, measure_cpu_curve
from .choice import UBATCHES
from .choice import fastest
from .result import Budget, PlanResult, evaluate
from .spec import ModelSpec, kv_type_supported

DEFAULT_MAX_SECONDS = 120.0
DEFAULT_MAX_CANDIDATES = 10

Status = Literal["pending", "measured", "over budget", "out of time", "failed"]


# --------------------------------------------------------------------------- results


@dataclass
class Candidate:
    """One setting tried: the engine settings, the tuner's estimate for them and what was measured."""

    label: str
    settings: EngineConfig
    estimate: PlanResult | None  # None where the settings are not a valid plan
    status: Status = "pending"
    runs: list[float] = field(default_factory=list)  # prefill tokens/s of each timed prefill
    load_seconds: float = 0.0
    seconds: float = 0.0  # wall time of the whole measurement: load, warm-up, prefills, close
    error: str = ""

    @property
    def fits(self) -> bool:
        return self.estimate is not None and self.estimate.fits

    @property
    def measured_tokens_per_s(self) -> float | None:
        return statistics.median(self.runs) if self.runs else None

    @property
    def estimated_tokens_per_s(self) -> float | None:
        return self.estimate.prefill.tokens_per_s if self.estimate else None

    @property
    def engine(self) -> dict[str, Any]:
        """The ``[engine]`` keys this candidate sets (:data:`PROFILE_KEYS`)."""
        return {k: getattr(self.settings, k) for k in PROFILE_KEYS}

    def describe_settings(self) -> str:
        s = self.settings
        experts = "all" if s.cpu_moe else f"{s.n_cpu_moe} ({s.cpu_moe_from})" if s.n_cpu_moe else "0"
        return (f"-b {s.n_batch} -ub {s.n_ubatch}, FA {'on' if s.flash_attn else 'off'}, KV {s.type_k}/{s.type_v}, "
                f"experts on CPU {experts}, mmap {'on' if s.mmap else 'off'}")

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        return dict(
            label=self.label, status=self.status, engine=self.engine, fits=self.fits,
            measured_tokens_per_s=self.measured_tokens_per_s, runs=self.runs,
            estimated_tokens_per_s=self.estimated_tokens_per_s,
            estimated_bound=est.prefill.bound if est else None,
            estimated_gpu_bytes=est.memory.gpu.total if est else None,
            estimated_cpu_bytes=est.memory.cpu.total if est else None,
            load_seconds=self.load_seconds, seconds=self.seconds, error=self.error,
        )


@dataclass(frozen=True)
class TuneEvent:
    """Progress of :func:`tune`.

    ``kind``: ``"plan"`` (candidates chosen; ``total`` of them, ``message`` the plan),
    ``"start"`` (measuring candidate ``index``), ``"result"`` (measured:
    ``tokens_per_s``), ``"skip"`` (not measured: over budget, out of time or failed;
    ``message`` says which), ``"done"`` (``message`` names the winner).
    """

    kind: Literal["plan", "start", "result", "skip", "done"]
    index: int = 0  # 0-based; 0 is the baseline
    total: int = 0
    label: str = ""
    elapsed: float = 0.0
    max_seconds: float = 0.0
    tokens_per_s: float | None = None
    message: str = ""


@dataclass
class TuneResult:
    """What :func:`tune` found: every candidate with its estimate and measurement, and the winner."""

    model: str
    model_identity: str
    n_ctx: int
    n_tokens: int
    hardware: HardwareProfile  # the profile used (measured when ``hardware_measured``)
    gpu: bool  # whether the plans used the GPU
    plan: PlanResult  # the tuner's estimate for this machine
    candidates: list[Candidate]
    seconds: float
    max_seconds: float
    hardware_measured: bool = False
    notes: list[str] = field(default_factory=list)
    cpu_curve: list[dict[str, Any]] = field(default_factory=list)  # the micro-batch sweep of --measure-hardware

    @property
    def baseline(self) -> Candidate:
        return self.candidates[0]

    @property
    def winner(self) -> Candidate | None:
        """The fastest measured candidate that fits the budget (None if none does)."""
        ok = [c for c in self.candidates if c.status == "measured" and c.fits]
        return max(ok, key=lambda c: c.measured_tokens_per_s or 0.0, default=None)

    @property
    def speedup(self) -> float | None:
        """Winner's measured prefill tokens/s over the baseline's (None where either is missing)."""
        w, b = self.winner, self.baseline.measured_tokens_per_s
        if w is None or not b or w.measured_tokens_per_s is None:
            return None
        return w.measured_tokens_per_s / b

    @property
    def calibration(self) -> float | None:
        """Median measured / estimated prefill speed: how far this machine is from the hardware profile."""
        ratios = [c.measured_tokens_per_s / c.estimated_tokens_per_s for c in self.candidates
                  if c.measured_tokens_per_s and c.estimated_tokens_per_s]
        return statistics.median(ratios) if ratios else None

    def to_dict(self) -> dict[str, Any]:
        w = self.winner
        return dict(
            model=self.model, model_identity=self.model_identity, n_ctx=self.n_ctx, n_tokens=self.n_tokens,
            hardware=self.hardware.to_dict(), hardware_measured=self.hardware_measured, gpu=self.gpu,
            plan=self.plan.to_dict(), candidates=[c.to_dict() for c in self.candidates],
            baseline=self.baseline.label, winner=w.label if w else None, winner_engine=w.engine if w else None,
            speedup=self.speedup, calibration=self.calibration, seconds=self.seconds,
            max_seconds=self.max_seconds, notes=self.notes, cpu_curve=self.cpu_curve,
        )

    def table(self) -> str:
        """One line per candidate: settings, estimate, fit and measurement."""
        lines = [f"{'candidate':<22} {'settings':<72} {'est tok/s':>9} {'fits':>4} {'measured':>9}"]
        for c in self.candidates:
            est = f"{c.estimated_tokens_per_s:.0f}" if c.estimated_tokens_per_s else "-"
            got = f"{c.measured_tokens_per_s:.0f}" if c.measured_tokens_per_s else c.status
            mark = " *" if c is self.winner else ""
            lines.append(f"{c.label:<22} {c.describe_settings():<72} {est:>9} {'yes' if c.fits else 'no':>4} "
                         f"{got:>9}{mark}")
        return "\n".join(lines)

    def summary(self) -> str:
        """One sentence: the winner and how much faster it is than the configured default."""
        w, b = self.winner, self.baseline
        if w is None:
            return "no candidate that fits the memory budget could be measured; nothing to write"
        base = f"{b.measured_tokens_per_s:.0f} tok/s" if b.measured_tokens_per_s else "not measured"
        speed = f"{self.speedup:.2f}x" if self.speedup else "?"
        if w is b:
            return f"the configured settings are the fastest measured ({base})"
        return (f"fastest: {w.label} ({w.describe_settings()}), {w.measured_tokens_per_s:.0f} tok/s, "
                f"{speed} the configured default ({base})")

    def profile_text(self) -> str:
        """The tuned profile's TOML: the measurements as comments, the winner's keys in ``[engine]``."""
        w = self.winner
        if w is None:
            raise ConfigError("No candidate that fits the memory budget was measured: there is no profile to write.")
        hw = self.hardware
        when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        lines = [
            f"# Tuned by `rag tune` on {when}: {Path(self.model).name} (identity {self.model_identity}), "
            f"n_ctx {self.n_ctx}, {self.n_tokens}-token prefills.",
            f"# Hardware: {hw.name}{' (measured)' if self.hardware_measured else ''}, "
            f"{'GPU ' + hw.gpu_name + ', ' if self.gpu else 'CPU only, '}"
            f"RAM {hw.ram / GiB:.0f} GiB, CPU {hw.cpu_flops / 1e9:.0f} GFLOP/s.",
            "# Measured prefill tokens/s (llama.cpp's timings); tuner's estimate in brackets:",
        ]
        for c in self.candidates:
            est = f"{c.estimated_tokens_per_s:.0f}" if c.estimated_tokens_per_s else "-"
            got = f"{c.measured_tokens_per_s:.1f}" if c.measured_tokens_per_s else c.status
            lines.append(f"#   {c.label}: {c.describe_settings()}: {got} [{est}]{' <- chosen' if c is w else ''}")
        lines.append(f"# {self.summary()}.")
        lines.append("[engine]")
        lines += [f"{k} = {toml_value(v)}" for k, v in w.engine.items() if self.gpu or k != "gpu_layers"]
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        head = (f"{Path(self.model).name}: {self.n_tokens}-token prefills at n_ctx {self.n_ctx}, "
                f"{'GPU' if self.gpu else 'CPU only'}, {self.seconds:.1f} s of {self.max_seconds:.0f} s")
        return "\n".join([head, self.table(), self.summary(), *(f"note: {n}" for n in self.notes)])


# --------------------------------------------------------------------------- settings <-> plans


def _key(settings: EngineConfig) -> tuple:
    s = settings
    n_batch = min(s.n_batch, s.n_ctx)
    return (n_batch, min(s.n_ubatch, n_batch), s.flash_attn, s.type_k, s.type_v, s.gpu_layers, s.n_cpu_moe,
            s.cpu_moe, s.cpu_moe_from if (s.n_cpu_moe or s.cpu_moe) else "", s.mmap)


def candidate_plans(spec: ModelSpec, hw: HardwareProfile, best: PlanResult, *, budget: Budget, n_tokens: int,
                    kv_types: Sequence[str], gpu: bool) -> list[tuple[str, EngineConfig]]:
    """Plans around ``best``: the other micro-batch sizes, flash attention toggled, other KV types, last-N experts."""
    p = best.settings
    n_ctx = p.n_ctx
    out: list[tuple[str, EngineConfig]] = [("plan", p)]

    def planned(**kw: Any) -> EngineConfig | None:
        try:
            return fastest(spec, hw, n_ctx=n_ctx, budget=budget, n_tokens=n_tokens, mmap=p.mmap, base=p,
                             **kw).settings
        except ConfigError:
            return None

    ubs = [u for u in UBATCHES if u <= max(min(n_tokens, n_ctx), UBATCHES[0]) and u != p.n_ubatch]
    ubs.sort(key=lambda u: abs(u.bit_length() - p.n_ubatch.bit_length()))
    for u in ubs:
        q = planned(n_ubatch=u, kv_types=p.type_k, flash_attn=p.flash_attn)
        if q is not None:
            out.append((f"plan -ub {u}", q))
    if p.flash_attn and p.type_v in ("f16", "f32", "bf16"):
        out.append(("plan, FA off", replace(p, flash_attn=False)))
    elif not p.flash_attn:
        out.append(("plan, FA on", replace(p, flash_attn=True)))
    for kv in kv_types:
        if kv != p.type_k and kv_type_supported(spec, kv):
            q = planned(n_ubatch=p.n_ubatch, kv_types=kv, flash_attn=True)
            if q is not None:
                out.append((f"plan, KV {kv}", q))
    if gpu and 0 < len(p.cpu_expert_layers(spec.n_layers)) < spec.n_layers:
        other = "last" if p.cpu_moe_from == "first" else "first"
        out.append((f"plan, {other} experts", replace(p, cpu_moe_from=other)))
    return out


def _predicted_seconds(c: Candidate, done: list[Candidate], *, n_tokens: int, repeats: int) -> float:
    """What measuring ``c`` should take, from the candidates measured so far."""
    measured = [d for d in done if d.status == "measured" and d.measured_tokens_per_s]
    if not measured:
        return 0.0
    overheads = [max(d.seconds - n_tokens * len(d.runs) / d.measured_tokens_per_s, 0.0)  # type: ignore[operator]
                 for d in measured]
    # load, warm-up and close; the first measurement also paid one-time costs (imports)
    overhead = statistics.median(overheads[1:] or overheads)
    ratios = [d.measured_tokens_per_s / d.estimated_tokens_per_s for d in measured  # type: ignore[operator]
              if d.estimated_tokens_per_s]
    if c.estimated_tokens_per_s and ratios:
        speed = c.estimated_tokens_per_s * statistics.median(ratios)
    else:
        speed = min(d.measured_tokens_per_s for d in measured)  # type: ignore[type-var]
    return overhead + n_tokens * repeats / speed


# --------------------------------------------------------------------------- tune


def tune(model_path: str | os.PathLike[str], *, engine_settings: EngineConfig, hardware: HardwareProfile,
         n_ctx: int, max_seconds: float = DEFAULT_MAX_SECONDS, n_tokens: int | None = None,
         progress: Callable[[TuneEvent], None] | None = None, budget: Budget | None = None,
         kv_types: Sequence[str] | None = None, max_candidates: int = DEFAULT_MAX_CANDIDATES, repeats: int = 1,
         measure_hardware: bool = False, seed: int = 0) -> TuneResult:
    """Measure candidate settings around the tuner's estimate and return every figure and the winner.

    ``engine_settings`` are the configured settings (the baseline; threads, seed
    and RoPE settings are kept in every candidate). ``n_ctx`` is the context to
    tune for (0: the model's trained context). ``n_tokens`` is the prompt length
    measured (default ``min(n_ctx // 2, 8192)``). ``budget`` defaults to the
    profile's VRAM and RAM (RAM capped at this machine's), default margins.
    ``kv_types`` are the KV cache types tried (default: the configured one and
    q8_0, where the model's head size allows). ``measure_hardware`` measures
    the CPU's FLOP/s and the RAM first (see :func:`pipeline.tuning.hardware.measure_hardware`)
    and, on a CPU-only run, the CPU's micro-batch curve (:func:`measure_cpu_curve`);
    the result's ``hardware`` is then worth saving with
    :func:`pipeline.tuning.hardware.save_profile`. Raises :class:`ConfigError` if no plan fits.
    """
    from ..models import file_identity

    t0 = time.perf_counter()
    model_path = Path(model_path)
    notes: list[str] = []
    spec = ModelSpec.from_gguf(model_path)
    n_ctx, n_tokens = _lengths(spec, engine_settings, n_ctx, n_tokens, notes)
    hw = _measure_hardware(hardware) if measure_hardware else hardware
    hw_seconds = time.perf_counter() - t0
    gpu = hw.has_gpu and engine_settings.gpu_layers != 0 and gpu_offload_available()
    if hw.has_gpu and not gpu:
        notes.append("no GPU offload (CPU-only llama.cpp build or gpu_layers = 0): every plan is on the CPU")
    if budget is None:
        budget = _default_budget(hw if gpu else replace(hw, vram=0))
    if engine_settings.override_tensors.strip():
        notes.append("engine.override_tensors is kept in every candidate; the estimates do not account for it")
    base = replace(engine_settings, n_ctx=n_ctx)
    curve: list[dict[str, Any]] = []
    if measure_hardware and not gpu:
        hw, curve = measure_cpu_curve(model_path, base, spec, hw, n_tokens=min(n_tokens, max(CURVE_UBATCHES)),
                                      seed=seed)
        hw_seconds = time.perf_counter() - t0
        notes.append("CPU micro-batch curve: " + ", ".join(
            f"-ub {r['n_ubatch']} {r['measured_tokens_per_s']:.0f} tok/s (model {r['estimated_tokens_per_s']:.0f})"
            for r in curve))
    elif measure_hardware:
        notes.append("the GPU's micro-batch curve is not measured here: the profile's is kept")
    hw_plan = hw if gpu else replace(hw, vram=0)
    mmap = base.mmap if not gpu else False  # pinned host memory copies faster to a GPU
    best = fastest(spec, hw_plan, n_ctx=n_ctx, budget=budget, kv_types=base.type_k, flash_attn=base.flash_attn,
                     mmap=mmap, n_tokens=n_tokens, base=base)
    kvs = tuple(kv_types) if kv_types is not None else (base.type_k, "q8_0")
    candidates = _candidates(spec, hw_plan, best, base, budget=budget, n_tokens=n_tokens, kv_types=kvs, gpu=gpu,
                             max_candidates=max_candidates)

    def emit(kind: str, i: int = 0, c: Candidate | None = None, **kw: Any) -> None:
        if progress is not None:
            progress(TuneEvent(kind, index=i, total=len(candidates),  # type: ignore[arg-type]
                               label=c.label if c else "", elapsed=time.perf_counter() - t0,
                               max_seconds=max_seconds, **kw))

    if measure_hardware:
        notes.append(f"measuring the hardware took {hw_seconds:.0f} s of the budget; it always runs whole, as "
                     "the baseline does: the budget only keeps later candidates from starting")
    emit("plan", message=best.describe())
    _measure_all(candidates, model_path, spec, n_tokens=n_tokens, repeats=repeats, seed=seed,
                 deadline=t0 + max_seconds, emit=emit)
    if candidates[0].estimate is not None and not candidates[0].fits:
        notes.append("the configured settings are over the memory budget by the memory model: not chosen")
    result = TuneResult(
        model=str(model_path), model_identity=file_identity(model_path), n_ctx=n_ctx, n_tokens=n_tokens,
        hardware=hw, gpu=gpu, plan=best, candidates=candidates, seconds=time.perf_counter() - t0,
        max_seconds=max_seconds, hardware_measured=measure_hardware, notes=notes, cpu_curve=curve)
    emit("done", message=result.summary())
    return result


def _lengths(spec: ModelSpec, settings: EngineConfig, n_ctx: int, n_tokens: int | None, notes: list[str]
             ) -> tuple[int, int]:
    """The context tuned for (clamped to what the model runs) and the prompt length measured."""
    requested, n_ctx = n_ctx, effective_n_ctx(n_ctx, spec.n_ctx_train, settings.rope_scaling)
    if requested > n_ctx:
        notes.append(f"n_ctx {requested} is above the model's trained context: tuned for {n_ctx}")
    if n_ctx < 16:
        raise ConfigError(f"n_ctx {n_ctx} is too small to tune for.")
    n_tokens = int(n_tokens or min(n_ctx // 2, 8192))
    return n_ctx, max(8, min(n_tokens, n_ctx - 2))  # room for the sampled token


def _default_budget(hw: HardwareProfile) -> Budget:
    """The profile's VRAM and RAM (RAM capped at this machine's), default margins."""
    ram = hw.ram
    try:
        ram = min(ram, detect_ram())
    except ConfigError:
        pass
    return Budget.from_hardware(replace(hw, ram=ram))


def _candidates(spec: ModelSpec, hw: HardwareProfile, best: PlanResult, base: EngineConfig, *, budget: Budget,
                n_tokens: int, kv_types: Sequence[str], gpu: bool, max_candidates: int) -> list[Candidate]:
    """The baseline, the plan, then the other candidate plans by estimated speed, each with its estimate."""
    def estimate(s: EngineConfig, label: str) -> PlanResult | None:
        try:
            run = s.as_run(spec.n_layers, gpu=gpu)
        except ConfigError:
            return None
        return evaluate(spec, run, hw, budget, label=label, n_tokens=n_tokens)

    def settings_of(p: EngineConfig) -> EngineConfig:
        s = base.with_planned(p)
        return s if gpu else replace(s, gpu_layers=base.gpu_layers)  # a CPU plan leaves -ngl as configured

    candidates = [Candidate("baseline (configured)", base, estimate(base, "baseline"))]
    seen = {_key(base)}
    for label, p in candidate_plans(spec, hw, best, budget=budget, n_tokens=n_tokens, kv_types=kv_types, gpu=gpu):
        s = settings_of(p)
        if _key(s) in seen:
            continue
        seen.add(_key(s))
        candidates.append(Candidate(label, s, estimate(s, label)))
    # the plan first, then the others by estimated speed (stable: equal estimates keep their order)
    head, rest = candidates[:2], candidates[2:]
    rest.sort(key=lambda c: -round(math.log(c.estimated_tokens_per_s), 2) if c.estimated_tokens_per_s else math.inf)
    return (head + rest)[:max(1, max_candidates)]


def _measure_all(candidates: list[Candidate], model_path: Path, spec: ModelSpec, *, n_tokens: int, repeats: int,
                 seed: int, deadline: float, emit: Callable[..., None]) -> None:
    """Measure the candidates in order (the baseline always), skipping those over the memory budget and,
    once the next would overrun ``deadline``, the rest."""
    out_of_time = False
    for i, c in enumerate(candidates):
        if i and not c.fits:
            c.status = "over budget"
            emit("skip", i, c, message="over the memory budget")
            continue
        if i and (out_of_time or time.perf_counter() + _predicted_seconds(
                c, candidates[:i], n_tokens=n_tokens, repeats=repeats) > deadline):
            out_of_time = True  # candidates come fastest first: the later ones would not fit either
            c.status = "out of time"
            emit("skip", i, c, message="out of time")
            continue
        emit("start", i, c, message=c.describe_settings())
        t = time.perf_counter()
        try:
            c.runs, c.load_seconds = measure(model_path, c.settings, n_tokens=n_tokens, n_vocab=spec.n_vocab,
                                             repeats=max(1, repeats), seed=seed + i)
            c.status = "measured"
        except RagError as exc:
            c.status, c.error = "failed", str(exc)
        c.seconds = time.perf_counter() - t
        if c.status == "measured":
            emit("result", i, c, tokens_per_s=c.measured_tokens_per_s)
        else:
            emit("skip", i, c, message=f"failed: {c.error}")


__all__ = ["Candidate", "TuneEvent", "TuneResult", "candidate_plans", "tune"]
