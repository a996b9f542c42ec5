"""The tuner (pipeline.tuning.spec, .footprint, .speed, .choice): memory model against llama.cpp's own dry run, the recipe's case, budgets, profiles.

The dry-run tests generate small qwen3moe models (under 2 MB each) and load them
with ``no_alloc`` (nothing allocated, a few tens of milliseconds per load); every
other test is pure arithmetic on model specs.
"""

from __future__ import annotations

import json
import re

import pytest

from pipeline.engine.gguf.header import ArrayInfo
from pipeline.errors import ConfigError
from pipeline.engine.host import detect_ram
from pipeline.tuning.hardware import PROFILES, GiB, HardwareProfile, get_profile, load_profile, save_profile
from pipeline.tuning.footprint import compute_buffer_bytes, dry_run, kv_bytes, footprint, parse_dry_run
from pipeline.engine.offload import planned_tensors
from pipeline.tuning.choice import baseline_plan, comparison_table, fastest, fit_like, recipe_plan, search_base
from pipeline.tuning.result import Budget, evaluate, fits, llama_flags
from pipeline.tuning.spec import LayerSpec, ModelSpec, read_gguf
from pipeline.tuning.speed import decode_speed, prefill_speed

MiB = 1024**2


def Plan(**kw):
    """Engine settings as the tuner writes them (flash attention on, mmap off, first-N experts)."""
    from dataclasses import replace

    return replace(search_base(), **kw).validate()

MODELS = {
    "tiny": {},
    "wide": dict(n_embd=256, n_head=8, n_head_kv=4, head_dim=32, n_experts=16, n_experts_used=4, expert_ff=128,
                 vocab=2000),
    "deep": dict(n_layers=12, n_embd=128, n_head=8, n_head_kv=1, head_dim=32, n_experts=32, n_experts_used=8,
                 expert_ff=64, vocab=1000),
    "bigvocab": dict(n_embd=128, vocab=32000),
}

CONFIGS = [
    dict(n_ctx=65536, n_ubatch=1024),
    dict(n_ctx=65536, n_ubatch=2048),
    dict(n_ctx=16384, n_ubatch=512, type_k="q8_0", type_v="q8_0"),
    dict(n_ctx=8192, n_ubatch=256, flash_attn=False),
    dict(n_ctx=32768, n_ubatch=128, type_k="q8_0"),
    dict(n_ctx=20000, n_ubatch=512, type_k="q4_0", type_v="q4_0"),  # n_ctx padded to 256
]
SMALL_CONFIGS = [dict(n_ctx=4096, n_ubatch=2048, type_k="q4_0", type_v="q4_0"), dict(n_ctx=1000, n_ubatch=512)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from devtools.synthetic import write_moe_model

    folder = tmp_path_factory.mktemp("plan-models")
    return {name: write_moe_model(folder / f"{name}.gguf", **kw) for name, kw in MODELS.items()}


def _plan(spec: ModelSpec, cfg: dict):
    kw = dict(cfg)
    kw.setdefault("flash_attn", True)
    p = Plan(n_batch=max(kw["n_ubatch"], 512), **kw)
    if any(t != "f16" and spec.layers[0].head_dim_k % 32 for t in (p.type_k, p.type_v)):
        return None  # llama.cpp refuses a quantized KV type that does not divide the head size
    return p


# --------------------------------------------------------------------------- spec from GGUF


def test_spec_from_gguf_matches_the_file(models) -> None:
    import gguf

    for name, path in models.items():
        spec = ModelSpec.from_gguf(path)
        reader = gguf.GGUFReader(path)
        assert spec.total_bytes == sum(int(t.n_bytes) for t in reader.tensors)
        assert spec.n_layers == MODELS[name].get("n_layers", 4)
        assert spec.n_embd == MODELS[name].get("n_embd", 64)
        assert spec.n_experts_used == MODELS[name].get("n_experts_used", 2)
        # the expert bytes are exactly the tensors the offload pattern matches
        names = [t.name for t in reader.tensors]
        from pipeline.engine.offload import cpu_moe

        expert_names = set(planned_tensors(names, cpu_moe()))
        assert spec.expert_bytes == sum(int(t.n_bytes) for t in reader.tensors if t.name in expert_names)
        meta, tensors = read_gguf(path)
        assert [t[0] for t in tensors] == names
        assert meta["general.architecture"] == "qwen3moe"


def test_read_gguf_skips_long_arrays(models) -> None:
    meta, _ = read_gguf(models["bigvocab"])
    assert meta["tokenizer.ggml.tokens"] == ArrayInfo(type=8, count=32000)  # skipped, recorded as its length
    assert ModelSpec.from_gguf(models["bigvocab"]).n_vocab == 32000


# --------------------------------------------------------------------------- dry-run agreement


def test_memory_model_within_5_percent_of_llama_cpp_dry_run(models) -> None:
    rows = []
    for name, path in models.items():
        spec = ModelSpec.from_gguf(path)
        for cfg in CONFIGS:
            p = _plan(spec, cfg)
            if p is None:
                continue
            real = dry_run(path, p)
            kv = kv_bytes(spec, p)[0]
            cb = compute_buffer_bytes(spec, p)
            rows.append((name, cfg, kv / real.kv_cache, cb / real.compute["CPU"]))
    bad = [r for r in rows if not (0.95 <= r[2] <= 1.05 and 0.95 <= r[3] <= 1.05)]
    assert len(rows) >= 18
    assert not bad, bad


def test_memory_model_never_underestimates_small_contexts(models) -> None:
    # Where the per-layer term dominates the estimate is an upper bound (safe), not within 5%.
    for name, path in models.items():
        spec = ModelSpec.from_gguf(path)
        for cfg in SMALL_CONFIGS:
            p = _plan(spec, cfg)
            if p is None:
                continue
            real = dry_run(path, p)
            assert kv_bytes(spec, p)[0] >= real.kv_cache * 0.99
            assert 0.99 <= compute_buffer_bytes(spec, p) / real.compute["CPU"] <= 1.45, (name, cfg)


def test_parse_dry_run() -> None:
    log = ("llama_kv_cache: size =   32.00 MiB ( 65536 cells,   4 layers,  1/1 seqs), K (f16):   16.00 MiB\n"
           "sched_reserve:      CUDA0 compute buffer size =   300.50 MiB\n"
           "sched_reserve:  CUDA_Host compute buffer size =    10.00 MiB\n")
    d = parse_dry_run(log)
    assert d.kv_cache == 32 * MiB
    assert d.compute == {"CUDA0": int(300.5 * MiB), "CUDA_Host": 10 * MiB}


# --------------------------------------------------------------------------- hybrid / sliding-window KV


def test_kv_accounting_for_hybrid_and_sliding_layers() -> None:
    full = LayerSpec(kind="full", n_head=8, n_head_kv=2, head_dim_k=128, head_dim_v=128)
    swa = LayerSpec(kind="swa", n_head=8, n_head_kv=2, head_dim_k=128, head_dim_v=128, window=4096)
    rec = LayerSpec(kind="recurrent", state_bytes=3 * MiB)
    spec = ModelSpec(name="hybrid", arch="test", n_embd=1024, n_vocab=1000, n_ctx_train=131072, n_experts=0,
                     n_experts_used=0, expert_ff=0, layers=(full, swa, rec, rec), embd_bytes=0, output_bytes=0,
                     output_params=0)
    per_cell = 2 * 2 * 128 * 2  # K + V, 2 heads of 128, f16
    p = Plan(n_ctx=65536, n_batch=512, n_ubatch=512)
    kv, state = kv_bytes(spec, p, swa_full=False)
    assert kv == per_cell * 65536 + per_cell * (4096 + 512)  # window + ubatch cells for the sliding layer
    assert kv_bytes(spec, p)[0] == 2 * per_cell * 65536  # the engine's full-size window cache
    assert state == 2 * 3 * MiB  # fixed per sequence, whatever the context
    assert kv_bytes(spec, Plan(n_ctx=131072, n_batch=512, n_ubatch=512))[1] == state
    # a context shorter than the window: the sliding layer holds n_ctx cells
    assert kv_bytes(spec, Plan(n_ctx=2048, n_batch=512, n_ubatch=512), swa_full=False)[0] == 2 * per_cell * 2048
    q8 = kv_bytes(spec, Plan(n_ctx=65536, n_batch=512, n_ubatch=512, type_k="q8_0", type_v="q8_0"), swa_full=False)[0]
    assert q8 == pytest.approx(kv * 34 / 64, rel=1e-9)
    with pytest.raises(ConfigError):
        Plan(n_ctx=1024, type_v="q8_0", flash_attn=False)


def test_qwen36_spec_matches_published_shapes() -> None:
    spec = ModelSpec.qwen36_35b_a3b("Q6_K")
    assert spec.n_layers == 40
    assert sum(lay.kind == "full" for lay in spec.layers) == 10
    assert sum(lay.kind == "recurrent" for lay in spec.layers) == 30
    total_params = spec.total_bytes * 8 / 6.5625
    assert 33e9 < total_params < 37e9  # "35B parameters in total"
    assert 2.3e9 < spec.active_params + spec.output_params < 3.5e9  # "3B active"
    # only the 10 full-attention layers keep per-token KV: 10 x 2 heads x 256 x (K+V) x f16
    p = Plan(n_ctx=65536, n_batch=512, n_ubatch=512)
    assert kv_bytes(spec, p)[0] == 10 * 2 * 256 * 2 * 2 * 65536
    q4 = ModelSpec.qwen36_35b_a3b("Q4_K_M")
    q8 = ModelSpec.qwen36_35b_a3b("Q8_0")
    assert q4.total_bytes < spec.total_bytes < q8.total_bytes


# --------------------------------------------------------------------------- the recipe's case


@pytest.fixture(scope="module")
def qwen():
    return ModelSpec.qwen36_35b_a3b("Q6_K")


def test_recipe_case_plan_fits_and_beats_recipe(qwen) -> None:
    hw = get_profile("rtx3090")
    budget = Budget.from_hardware(hw)
    recipe = evaluate(qwen, recipe_plan(65536), hw, budget, label="recipe")
    assert recipe.fits  # the recipe runs on a 24 GB card: the model must agree
    best = fastest(qwen, hw, n_ctx=65536, budget=budget)
    assert best.fits
    assert best.memory.gpu.total + budget.gpu_margin <= 24 * GiB
    assert best.prefill.tokens_per_s > recipe.prefill.tokens_per_s * 1.2
    fit = fit_like(qwen, hw, n_ctx=65536, budget=budget)
    assert fit is not None and fit.fits
    assert best.prefill.tokens_per_s >= fit.prefill.tokens_per_s
    table = comparison_table([recipe, fit, best])
    assert table.count("\n") == 5 and "| recipe |" in table


def test_speed_model_reproduces_the_3090_measurements(qwen) -> None:
    """Calibration: 564 tok/s (baseline -b 512 -ub 128) and 1330 tok/s (recipe), within 20%."""
    hw = get_profile("rtx3090")
    base = baseline_plan(qwen, hw, 65536)
    assert base.n_ubatch == 128 and 0 < base.n_cpu_moe <= 8
    est_base = prefill_speed(qwen, base, hw).tokens_per_s
    est_recipe = prefill_speed(qwen, recipe_plan(65536), hw).tokens_per_s
    assert est_base == pytest.approx(564, rel=0.2)
    assert est_recipe == pytest.approx(1330, rel=0.2)
    # pinned host memory (mmap off) copies faster than pageable
    from dataclasses import replace

    mm = prefill_speed(qwen, replace(recipe_plan(65536), mmap=True), hw)
    assert mm.tokens_per_s < est_recipe and mm.bound == "copy"
    # speed grows with n_ubatch when experts are in host memory (one copy per micro-batch)
    speeds = [prefill_speed(qwen, Plan(n_ctx=65536, n_batch=ub, n_ubatch=ub, n_cpu_moe=40), hw).tokens_per_s
              for ub in (128, 256, 512, 1024, 2048)]
    assert speeds == sorted(speeds)
    assert decode_speed(qwen, recipe_plan(65536), hw) > 0


# --------------------------------------------------------------------------- budgets


@pytest.mark.parametrize("vram_gib", [8, 12, 16, 20, 24, 32, 48, 80])
def test_plan_never_over_budget_and_at_least_fit(qwen, vram_gib: int) -> None:
    hw = get_profile("rtx3090")
    for ctx in (16384, 65536):
        for ram_gib in (32, 64):
            budget = Budget(vram=vram_gib * GiB, ram=ram_gib * GiB)
            try:
                best = fastest(qwen, hw, n_ctx=ctx, budget=budget)
            except ConfigError:
                assert fit_like(qwen, hw, n_ctx=ctx, budget=budget) is None
                continue
            m = footprint(qwen, best.settings, hw)
            assert m.gpu.total + budget.gpu_margin <= budget.vram
            assert m.cpu.total + budget.ram_margin <= budget.ram
            assert fits(m, budget)
            fit = fit_like(qwen, hw, n_ctx=ctx, budget=budget)
            if fit is not None:
                assert best.prefill.tokens_per_s >= fit.prefill.tokens_per_s


def test_plan_options_and_outputs(qwen) -> None:
    hw = get_profile("rtx3090")
    searched = fastest(qwen, hw, n_ctx=65536, kv_types=("f16", "q8_0"))
    fixed = fastest(qwen, hw, n_ctx=65536)
    assert searched.prefill.tokens_per_s >= fixed.prefill.tokens_per_s
    pinned = fastest(qwen, hw, n_ctx=65536, n_ubatch=512)
    assert pinned.settings.n_ubatch == 512
    d = json.loads(json.dumps(fixed.to_dict()))
    assert d["fits"] and d["prefill"]["bound"] in ("gpu", "copy", "cpu")
    flags = fixed.flags
    assert flags[:2] == ["-c", "65536"] and "--no-mmap" in flags and "-fa" in flags
    if fixed.settings.n_cpu_moe and fixed.settings.cpu_moe_from == "first":
        assert flags[flags.index("--n-cpu-moe") + 1] == str(fixed.settings.n_cpu_moe)
    toml = fixed.engine_toml
    import tomllib

    engine = tomllib.loads(toml)["engine"]
    assert set(engine) == {"n_ctx", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v", "gpu_layers",
                           "n_cpu_moe", "cpu_moe", "cpu_moe_from", "mmap"}
    assert engine["n_cpu_moe"] == fixed.settings.n_cpu_moe and engine["mmap"] is False
    from pipeline.config import load_config

    assert load_config(overrides={f"engine.{k}": v for k, v in engine.items()}).engine.n_ubatch == \
        fixed.settings.n_ubatch  # the snippet is a valid config
    last = llama_flags(Plan(n_ctx=4096, n_cpu_moe=2, cpu_moe_from="last"), 40)
    assert "-ot" in last and re.search(r"blk\\\.\(38\|39\)", last[last.index("-ot") + 1])
    assert "fits" in fixed.describe()
    # everything fits on an 80 GB card: no experts on the CPU
    assert fastest(qwen, get_profile("a100-80gb"), n_ctx=65536).experts_on_cpu == 0
    # CPU only: no GPU memory used
    cpu = fastest(qwen, get_profile("cpu").with_ram(64 * GiB), n_ctx=16384)
    assert cpu.memory.gpu.total == 0 and cpu.prefill.bound == "cpu"


# --------------------------------------------------------------------------- hardware profiles


def test_hardware_profiles_roundtrip(tmp_path) -> None:
    for name, prof in PROFILES.items():
        assert prof.name == name
        path = save_profile(prof, tmp_path / f"{name}.toml")
        assert load_profile(path) == prof
    (tmp_path / "partial.toml").write_text('[hardware]\nname = "rtx3090"\nh2d_pinned = 20e9\nram = 17179869184\n')
    p = load_profile(tmp_path / "partial.toml")
    assert p.h2d_pinned == 20e9 and p.ram == 16 * GiB and p.vram == 24 * GiB
    (tmp_path / "bad.toml").write_text('[hardware]\nname = "rtx3090"\nwarp_speed = 9\n')
    with pytest.raises(ConfigError):
        load_profile(tmp_path / "bad.toml")
    with pytest.raises(ConfigError):
        get_profile("voodoo2")
    assert isinstance(get_profile("h200"), HardwareProfile) and get_profile("h200").vram > 130 * GiB


def test_detect_ram() -> None:
    text = "MemTotal:       24576000 kB\nMemFree:  100 kB\nMemAvailable:   12000000 kB\n"
    assert detect_ram(meminfo=text) == 24576000 * 1024
    assert detect_ram(available=True, meminfo=text) == 12000000 * 1024
    assert detect_ram() > 1 * GiB  # this machine
    assert get_profile("rtx3090").with_ram().ram == detect_ram()
