"""Measuring on this machine: short real prefills of a model with given settings, and the CPU's
micro-batch curve fitted to them (what ``rag tune`` and ``rag tune --measure-hardware`` time).

Every figure is llama.cpp's own prefill timing (``Engine.generate(tokens, max_tokens=1)``),
after a warm-up prefill, each prompt starting with a distinct token so that nothing is
reused from the previous one.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from ..config import EngineConfig
from ..errors import RagError
from .hardware import HardwareProfile
from .spec import ModelSpec
from .speed import prefill_speed


def gpu_offload_available() -> bool:
    """Whether this llama.cpp build can offload to a GPU."""
    from ..engine.loading import supports_gpu_offload

    return supports_gpu_offload()


def _prompt(rng: random.Random, n_vocab: int, n: int, first: int) -> list[int]:
    # a distinct first token: the engine cannot reuse the previous prompt's KV cache
    return [first % n_vocab] + [rng.randrange(n_vocab) for _ in range(n - 1)]


def measure(model_path: Path, settings: EngineConfig, *, n_tokens: int, n_vocab: int, repeats: int = 1,
            seed: int = 0) -> tuple[list[float], float]:
    """(prefill tokens/s of each of ``repeats`` prefills of ``n_tokens`` tokens, load seconds), after a warm-up."""
    from ..engine.contract import EngineStats
    from ..engine.local import Engine

    rng = random.Random(seed)
    warm = max(8, min(settings.n_ubatch, n_tokens // 4))
    prompts = [_prompt(rng, n_vocab, warm, 1)] + [_prompt(rng, n_vocab, n_tokens, 2 + r) for r in range(repeats)]
    engine = Engine(model_path, settings)
    try:
        engine.llm  # load
        runs = []
        for r, tokens in enumerate(prompts):
            stats = EngineStats()
            engine.generate(tokens, max_tokens=1, stats=stats).read()
            # generate() leaves its last decode (the sampled token) unsynchronised; llama.cpp would book the
            # time until the next synchronisation to the next prefill's counter
            engine.llm.synchronize()
            if r == 0:
                continue  # the warm-up
            if stats.prefill_tokens != n_tokens or stats.prefill_tokens_per_second <= 0:
                raise RagError(f"the prefill measured {stats.prefill_tokens} tokens, not {n_tokens}")
            runs.append(stats.prefill_tokens_per_second)
        return runs, engine.load_seconds
    finally:
        engine.close()


#: Micro-batch sizes ``rag tune --measure-hardware`` measures on a CPU.
CURVE_UBATCHES = (128, 512, 2048)


def fit_cpu_curve(spec: ModelSpec, hw: HardwareProfile, points: Sequence[tuple[EngineConfig, int, float]]
                  ) -> HardwareProfile:
    """``hw`` with the CPU FLOP/s and micro-batch curve (``cpu_ubatch_half``, ``cpu_ubatch_cache``) that best
    reproduce measured CPU prefills: ``points`` of (settings as run, prompt tokens, measured tokens/s).

    A least-squares fit in log space over a grid of the three shape parameters; for each, the FLOP/s
    that scales the estimates onto the measurements is exact, because every CPU term of the speed
    model is proportional to ``1 / cpu_flops``.
    """
    if not points:
        return hw
    halves = [0.0] + [8.0 * 2 ** (i / 4) for i in range(33)]  # 8 .. 2048 tokens
    caches = [0.0] + [256.0 * 2 ** (i / 2) for i in range(17)]  # 256 .. 65536 tokens
    base = replace(hw, vram=0, cpu_flops=1e12, cpu_layer_overhead=0.0)
    best: tuple[float, HardwareProfile] | None = None
    for half, cache, exp in itertools.product(halves, caches, (0.75, 1.0, 1.25, 1.5, 2.0)):
        trial = replace(base, cpu_ubatch_half=half, cpu_ubatch_cache=cache, cpu_ubatch_exp=exp)
        logs = [math.log(tps) - math.log(prefill_speed(spec, s, trial, n).tokens_per_s) for s, n, tps in points]
        mean = statistics.fmean(logs)
        err = sum((x - mean) ** 2 for x in logs)
        if best is None or err < best[0] - 1e-12:
            best = (err, replace(trial, cpu_flops=1e12 * math.exp(mean)))
    assert best is not None
    return replace(best[1], vram=hw.vram)


def measure_cpu_curve(model_path: Path, base: EngineConfig, spec: ModelSpec, hw: HardwareProfile, *,
                      n_tokens: int, seed: int = 0) -> tuple[HardwareProfile, list[dict[str, Any]]]:
    """Prefill the model on the CPU at :data:`CURVE_UBATCHES` (those within ``n_tokens``), fit the curve to it.

    Returns the fitted profile and the measurements (``n_ubatch``, tokens/s, estimate after the fit).
    """
    points: list[tuple[EngineConfig, int, float]] = []
    for i, u in enumerate(u for u in CURVE_UBATCHES if u <= n_tokens):
        s = replace(base, n_batch=u, n_ubatch=u, gpu_layers=0).as_run(spec.n_layers, gpu=False)
        runs, _ = measure(model_path, s, n_tokens=n_tokens, n_vocab=spec.n_vocab, repeats=1, seed=seed + 100 + i)
        points.append((s, n_tokens, statistics.median(runs)))
    fitted = fit_cpu_curve(spec, hw, points)
    cpu_only = replace(fitted, vram=0)
    rows = [dict(n_ubatch=s.n_ubatch, measured_tokens_per_s=tps,
                 estimated_tokens_per_s=prefill_speed(spec, s, cpu_only, n).tokens_per_s) for s, n, tps in points]
    return fitted, rows


__all__ = ["CURVE_UBATCHES", "fit_cpu_curve", "gpu_offload_available", "measure", "measure_cpu_curve"]
