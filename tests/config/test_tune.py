"""rag tune's library: real llama.cpp prefills of a generated MoE model, bounded in time, written to a profile.

The model is the tiny generated qwen3moe model (about 1 MB); prefills are 512 tokens
at n_ctx 2048 on 1 thread, so one candidate takes a fraction of a second (a few on a busy machine).
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path

import pytest

from pipeline.config import EngineConfig, load_config
from pipeline.errors import ConfigError
from pipeline.tuning.hardware import GiB, get_profile, load_profile, save_profile
from pipeline.tuning.footprint import footprint
from pipeline.models import file_identity
from pipeline.tuning.result import Budget
from pipeline.tuning.spec import ModelSpec
from pipeline.tuning.measure import fit_cpu_curve
from pipeline.tuning.tune import TuneEvent, tune
from pipeline.config.tuned import PROFILE_KEYS, profile_path, read_profile, tuned_engine, tuned_settings, write_profile

N_CTX, N_TOKENS = 2048, 512
SETTINGS = EngineConfig(threads=1, threads_batch=1)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from devtools.synthetic import write_moe_model

    return write_moe_model(tmp_path_factory.mktemp("tune") / "moe.gguf")


@pytest.fixture(scope="module")
def tuned(model):
    events: list[TuneEvent] = []
    result = tune(model, engine_settings=SETTINGS, hardware=get_profile("cpu"), n_ctx=N_CTX, n_tokens=N_TOKENS,
                  max_seconds=20, progress=events.append)
    return result, events


def test_tune_measures_the_baseline_first_and_picks_a_winner_that_fits(tuned, model) -> None:
    result, events = tuned
    base = result.baseline
    assert base.label.startswith("baseline") and base.settings == replace(SETTINGS, n_ctx=N_CTX)
    assert base.status == "measured" and base.measured_tokens_per_s > 0
    starts = [e for e in events if e.kind == "start"]
    assert starts[0].index == 0 and starts[0].label == base.label  # the baseline is measured first
    assert events[0].kind == "plan" and events[-1].kind == "done"
    assert all(e.total == len(result.candidates) for e in events)
    measured = [c for c in result.candidates if c.status == "measured"]
    assert len(measured) >= 2  # more than the baseline fits in 20 s, even on a busy machine

    w = result.winner
    assert w is not None and w.status == "measured" and w.fits
    assert w.measured_tokens_per_s == max(c.measured_tokens_per_s for c in measured if c.fits)
    assert result.speedup == pytest.approx(w.measured_tokens_per_s / base.measured_tokens_per_s)

    # never over budget: the winner's memory (recomputed) fits the budget the tuner used
    spec = ModelSpec.from_gguf(model)
    hw = replace(get_profile("cpu"), vram=0)
    mem = footprint(spec, w.settings.as_run(spec.n_layers, gpu=False), hw)
    assert mem.gpu.total == 0  # a CPU-only build: nothing planned on a GPU
    assert mem.cpu.total + w.estimate.budget.ram_margin <= w.estimate.budget.ram

    # the candidates vary the batch sizes and flash attention around the plan
    keys = {(c.settings.n_batch, c.settings.n_ubatch, c.settings.flash_attn) for c in result.candidates}
    assert len({k[1] for k in keys}) >= 2 and {k[2] for k in keys} == {True, False}
    assert all(c.estimate is not None for c in result.candidates)
    assert not result.gpu and result.plan.memory.gpu.total == 0
    assert result.seconds < 20 + 10  # bounded (one candidate of slack)
    d = result.to_dict()
    assert d["winner"] == w.label and d["candidates"][0]["label"] == base.label
    assert "fastest" in result.summary() or "configured settings are the fastest" in result.summary()
    assert base.label in result.describe()


def test_profile_written_and_read_back(tuned, tmp_path) -> None:
    result, _ = tuned
    path = profile_path(tmp_path, result.model_identity, result.n_ctx)
    assert path == tmp_path / "tuned" / f"{file_identity(Path(result.model))}-{N_CTX}.toml"
    write_profile(result.profile_text(), path)
    text = path.read_text()
    assert text.startswith("# Tuned by `rag tune`") and "<- chosen" in text
    engine = tomllib.loads(text)["engine"]
    assert set(engine) <= set(PROFILE_KEYS) and {"n_batch", "n_ubatch", "flash_attn", "type_k", "mmap"} <= set(engine)
    values = read_profile(path)
    assert values == {f"engine.{k}": v for k, v in engine.items()}
    assert values["engine.n_ubatch"] == result.winner.settings.n_ubatch
    # the pipeline can lay it over a configuration
    cfg = load_config(environ={}, overrides=values)
    assert cfg.engine.n_ubatch == result.winner.settings.n_ubatch
    assert tuned_settings(tmp_path, result.model, N_CTX) == values
    assert tuned_settings(tmp_path, result.model, 4096) == {}
    # answering lays it over the settings left at their defaults, never over ones set
    mine = EngineConfig(n_ubatch=64, n_batch=64)
    laid, changes, note = tuned_engine(mine, tmp_path, result.model, N_CTX)
    assert laid.n_ubatch == 64 and "n_ubatch" not in changes and not note
    off = replace(mine, tuned=False)
    assert tuned_engine(off, tmp_path, result.model, N_CTX) == (off, {}, "")
    # a profile that does not go with what you set is not used, and says why
    write_profile(result.profile_text().replace('type_v = "f16"', 'type_v = "q8_0"'), path)
    no_fa = EngineConfig(flash_attn=False)
    laid, changes, note = tuned_engine(no_fa, tmp_path, result.model, N_CTX)
    assert laid == no_fa and changes == {} and "not used" in note and "flash attention" in note
    write_profile(result.profile_text(), path)
    (tmp_path / "typed.toml").write_text('[engine]\nn_ubatch = "lots"\n')
    with pytest.raises(ConfigError, match="n_ubatch"):
        read_profile(tmp_path / "typed.toml")
    (tmp_path / "bad.toml").write_text("[ask]\ntop_k = 3\n")
    with pytest.raises(ConfigError):
        read_profile(tmp_path / "bad.toml")


def test_max_seconds_stops_new_candidates_but_not_the_baseline(model, monkeypatch) -> None:
    from pipeline.tuning import hardware

    monkeypatch.setattr(hardware, "measure_cpu_flops", lambda **kw: 123e9)
    events: list[TuneEvent] = []
    result = tune(model, engine_settings=SETTINGS, hardware=get_profile("cpu"), n_ctx=N_CTX, n_tokens=N_TOKENS,
                  max_seconds=0, progress=events.append, measure_hardware=True)
    # measuring the hardware prefilled at two micro-batch sizes (128, 512: within the 512-token prompt) and fitted
    # the CPU's FLOP/s and micro-batch curve to them, replacing numpy's figure
    assert result.hardware_measured and [r["n_ubatch"] for r in result.cpu_curve] == [128, 512]
    assert result.hardware.cpu_flops != 123e9 and result.hardware.cpu_flops > 0
    for r in result.cpu_curve:
        assert r["estimated_tokens_per_s"] == pytest.approx(r["measured_tokens_per_s"], rel=0.15)
    assert result.baseline.status == "measured"
    assert all(c.status == "out of time" for c in result.candidates[1:])
    assert [e.index for e in events if e.kind == "start"] == [0]
    assert result.winner is result.baseline and result.speedup == 1.0
    # the overrun is explained: the hardware measurement and the baseline always run whole
    assert any(n.startswith("measuring the hardware took") and "always runs whole" in n for n in result.notes)
    assert "measuring the hardware took" in result.describe()


def test_over_budget_candidates_are_never_measured(model) -> None:
    spec = ModelSpec.from_gguf(model)
    # a budget only the smallest micro-batches fit: the baseline (ubatch 512, FA on) is over it
    hw = get_profile("cpu")
    small = footprint(spec, replace(SETTINGS, n_ctx=N_CTX, n_batch=128, n_ubatch=128).as_run(spec.n_layers, gpu=False),
                   hw)
    budget = Budget(vram=0, ram=small.cpu.total + 1024, ram_margin=0)
    result = tune(model, engine_settings=SETTINGS, hardware=hw, n_ctx=N_CTX, n_tokens=N_TOKENS, max_seconds=20,
                  budget=budget)
    assert not result.baseline.fits and result.baseline.status == "measured"  # measured, never chosen
    for c in result.candidates[1:]:
        assert c.fits or c.status == "over budget"
    assert result.winner is not None and result.winner.fits and result.winner is not result.baseline
    assert any("over the memory budget" in n for n in result.notes)
    with pytest.raises(ConfigError):  # nothing fits at all
        tune(model, engine_settings=SETTINGS, hardware=hw, n_ctx=N_CTX, n_tokens=N_TOKENS, max_seconds=5,
             budget=Budget(vram=0, ram=1024, ram_margin=0))


def test_settings_as_run_and_with_planned(model) -> None:
    """One settings type: what the engine runs (as_run) and a plan laid over configured settings (with_planned)."""
    spec = ModelSpec.from_gguf(model)
    s = EngineConfig(n_ctx=4096, n_batch=1024, n_ubatch=256, n_cpu_moe=2, cpu_moe_from="last", gpu_layers=-1)
    run = s.as_run(spec.n_layers, gpu=True)
    assert (run.n_batch, run.n_ubatch, run.n_cpu_moe, run.cpu_moe_from, run.gpu_layers, run.mmap) == (
        1024, 256, 2, "last", -1, False)  # overridden experts load without mmap
    assert run.cpu_expert_layers(spec.n_layers) == [2, 3] and run.gpu_layer_set(spec.n_layers) == {0, 1, 2, 3}
    assert s.as_run(spec.n_layers, gpu=False).gpu_layers == 0
    every = replace(s, n_cpu_moe=spec.n_layers).as_run(spec.n_layers, gpu=True)
    assert every.cpu_moe and every.n_cpu_moe == 0
    mine = EngineConfig(threads=3, seed=7, rope_scaling="yarn")
    back = mine.with_planned(run)
    assert (back.threads, back.seed, back.rope_scaling) == (3, 7, "yarn")
    assert (back.n_batch, back.n_ubatch, back.n_cpu_moe, back.cpu_moe_from) == (1024, 256, 2, "last")
    clamped = EngineConfig(n_ctx=300, n_batch=2048, n_ubatch=512).as_run(spec.n_layers, gpu=False)
    assert (clamped.n_batch, clamped.n_ubatch) == (300, 300)
    # one validation: the config refuses what the tuner refuses, naming the real cause
    with pytest.raises(ConfigError, match="flash attention"):
        EngineConfig(n_ctx=4096, flash_attn=False, type_v="q4_1").as_run(spec.n_layers, gpu=False)
    with pytest.raises(ConfigError, match="flash attention"):
        load_config(environ={}, overrides={"engine.type_v": "q4_1", "engine.flash_attn": False})


def test_fit_cpu_curve_recovers_a_known_curve(model) -> None:
    """Measurements made by the speed model itself with known constants are fitted back to those constants."""
    from pipeline.tuning.speed import prefill_speed

    spec = ModelSpec.from_gguf(model)
    truth = replace(get_profile("cpu"), cpu_flops=40e9, cpu_ubatch_half=45.3, cpu_ubatch_cache=4096.0)
    points = []
    for u in (128, 512, 2048):
        s = replace(SETTINGS, n_ctx=N_CTX, n_batch=u, n_ubatch=u).as_run(spec.n_layers, gpu=False)
        points.append((s, 2048, prefill_speed(spec, s, truth, 2048).tokens_per_s))
    fitted = fit_cpu_curve(spec, get_profile("cpu"), points)
    for s, n, tps in points:
        assert prefill_speed(spec, s, fitted, n).tokens_per_s == pytest.approx(tps, rel=0.05)
    assert fitted.cpu_ubatch_half > 0 and fitted.cpu_ubatch_cache > 0


def test_measured_hardware_profile(tmp_path, monkeypatch) -> None:
    from pipeline.engine.host import detect_ram
    from pipeline.tuning import hardware

    monkeypatch.setattr(hardware, "measure_cpu_flops", lambda **kw: 123e9)
    hw = hardware.measure_hardware(get_profile("cpu"))
    assert hw.cpu_flops == 123e9 and hw.ram == detect_ram() and hw.ram > 1 * GiB
    assert load_profile(save_profile(hw, tmp_path / "hw.toml")) == hw
    real = hardware.measure_cpu_flops(seconds=0.05, n=128)
    assert 1e6 < real < 1e14
