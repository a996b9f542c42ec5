"""The speed model's micro-batch efficiency against the published figures it was calibrated on, and one it was not.

Pure arithmetic on model specs built from published shapes: no model file, no llama.cpp.
Sources (pipeline/tuning/gpu_fit.py): llama.cpp PR #11583 (Gemma 2B F16 -ub sweep on an
RTX 3090, fitted: its shape), the recipe's two RTX 3090 measurements (fitted: absolute speed),
llama.cpp PR #7716 (Llama 3 8B Q5_0 -ub sweep on an RTX 3090, held back).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.tuning import gpu_fit as cal
from pipeline.tuning.hardware import PROFILES, get_profile
from pipeline.tuning.choice import baseline_plan, fastest, recipe_plan, search_base
from pipeline.tuning.spec import ModelSpec
from pipeline.tuning.speed import prefill_speed, ubatch_efficiency


@pytest.fixture(scope="module")
def rtx3090():
    return get_profile("rtx3090")


def _relative(values: list[float], ref: int) -> list[float]:
    return [v / values[ref] for v in values]


def test_the_built_in_profile_is_the_fit(rtx3090) -> None:
    """hardware.py holds what `python -m pipeline.tuning.gpu_fit` computes (to the digits written there)."""
    fitted, err = cal.fit_rtx3090(rtx3090)
    assert fitted.gpu_ubatch_half == pytest.approx(rtx3090.gpu_ubatch_half, abs=1)
    assert fitted.gpu_flops == pytest.approx(rtx3090.gpu_flops, rel=0.01)
    assert fitted.h2d_pinned == pytest.approx(rtx3090.h2d_pinned, rel=0.01)
    assert err < 0.02


def test_recipe_measurements_reproduced_within_15_percent(rtx3090) -> None:
    qwen = ModelSpec.qwen36_35b_a3b("Q6_K")
    base = baseline_plan(qwen, rtx3090, 65536)
    assert base.n_ubatch == 128
    assert prefill_speed(qwen, base, rtx3090).tokens_per_s == pytest.approx(564, rel=0.15)
    assert prefill_speed(qwen, recipe_plan(65536), rtx3090).tokens_per_s == pytest.approx(1330, rel=0.15)


def test_published_gemma_sweep_reproduced_within_15_percent(rtx3090) -> None:
    """Calibrated on the sweep's shape: every point relative to the -ub 2048 one, within 15 % (in fact ~1 %)."""
    est = cal.sweep_estimates(cal.gemma_2b(), rtx3090, cal.GEMMA_2B_F16_3090, 16384)
    measured = [m for _, m in cal.GEMMA_2B_F16_3090]
    ref = [u for u, _ in cal.GEMMA_2B_F16_3090].index(2048)
    for (u, _), e, m in zip(cal.GEMMA_2B_F16_3090, _relative(est, ref), _relative(measured, ref)):
        assert e == pytest.approx(m, rel=0.15), u
        assert e == pytest.approx(m, rel=0.03), u
    assert est == sorted(est)  # throughput rises with -ub on a dense model too


def test_held_back_llama_8b_sweep(rtx3090) -> None:
    """Not used by the fit: another model, weight type, prompt length and kernel (MMQ) on the same card."""
    est = cal.sweep_estimates(cal.llama3_8b("q5_0"), rtx3090, cal.LLAMA_8B_Q5_0_3090, 2048)
    measured = [m for _, m in cal.LLAMA_8B_Q5_0_3090]
    ref = [u for u, _ in cal.LLAMA_8B_Q5_0_3090].index(512)
    for e, m in zip(_relative(est, ref), _relative(measured, ref)):
        assert e == pytest.approx(m, rel=0.15)
    # absolute: within 20 % (the sweep is from mid-2024 kernels; the fit's speed from the 2026 recipe)
    for e, m in zip(est, measured):
        assert e == pytest.approx(m, rel=0.20)


def test_efficiency_curve_saturates_and_ties_prefer_the_larger_micro_batch() -> None:
    effs = [ubatch_efficiency(u, 84, 1.5) for u in (32, 128, 512, 2048, 8192)]
    assert effs == sorted(effs) and effs[-1] < 1.0 and effs[-1] > 0.99
    assert ubatch_efficiency(512, 0, 1.5) == 1.0  # no curve
    cpu = [ubatch_efficiency(u, 64, 1.5, cache=2048) for u in (128, 512, 2048, 8192)]
    assert max(cpu) in cpu[1:3] and cpu[-1] < cpu[1]  # on a CPU large micro-batches spill the caches
    # a device with no micro-batch costs at all: every -ub estimates the same, the tuner takes the largest
    flat = replace(get_profile("rtx3090"), gpu_ubatch_half=0.0, gpu_layer_overhead=0.0)
    spec = cal.llama3_8b("q4_0")
    best = fastest(spec, flat, n_ctx=8192, budget=None)
    assert best.settings.n_ubatch == 4096


def test_small_dense_model_on_a_gpu_plans_large_micro_batches(rtx3090) -> None:
    """A 135M-class dense model: 128-token micro-batches are far from the kernels' speed (the issue's case)."""
    spec = cal.dense_spec("smol", n_layers=30, n_embd=576, n_head=9, n_head_kv=3, head_dim=64, n_ff=1536,
                          n_vocab=49152, qtype="q4_1", n_ctx_train=8192)
    best = fastest(spec, rtx3090, n_ctx=8192)
    assert best.settings.n_ubatch >= 512
    small = prefill_speed(spec, replace(search_base(), n_ctx=8192, n_batch=128, n_ubatch=128), rtx3090)
    assert best.prefill.tokens_per_s > 1.5 * small.tokens_per_s


def test_every_built_in_gpu_profile_has_a_curve() -> None:
    for name, hw in PROFILES.items():
        if hw.has_gpu:
            assert hw.gpu_ubatch_half > 0 and hw.gpu_layer_overhead > 0, name
    assert PROFILES["h200"].gpu_ubatch_half > PROFILES["rtx3090"].gpu_ubatch_half  # more SMs to fill
