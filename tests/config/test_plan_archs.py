"""The tuner on the hybrid (qwen35moe), gpt-oss and Gemma 3: layer kinds, the memory model against
llama.cpp's own dry run at 8K-64K (recurrent state per sequence, KV only on attention layers,
sliding-window KV at full size or at window size), and `rag plan` giving a plan llama.cpp loads within
its budget.

The generated models are under 2 MB each; a dry run (``no_alloc``) allocates nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.config import EngineConfig
from pipeline.tuning.footprint import compute_buffer_bytes, dry_run, kv_bytes, footprint
from pipeline.tuning.choice import search_base
from pipeline.tuning.spec import ModelSpec

GiB = 1024**3

MODELS = {
    "hybrid": ("qwen35moe", {}),
    "hybrid-wide": ("qwen35moe", dict(n_layers=8, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, rope_dim=16,
                                      ssm_state_size=32, ssm_group_count=4, ssm_time_step_rank=8, n_experts=16,
                                      n_experts_used=4, expert_ff=64, shared_ff=128, vocab=2000)),
    "gpt-oss": ("gpt-oss", {}),
    "gpt-oss-wide": ("gpt-oss", dict(n_layers=6, n_embd=256, n_head=8, n_head_kv=2, head_dim=32, sliding_window=256,
                                     n_experts=16, n_experts_used=4, expert_ff=128, vocab=2000)),
}

CONFIGS = [
    dict(n_ctx=65536, n_ubatch=1024),
    dict(n_ctx=65536, n_ubatch=2048),
    dict(n_ctx=16384, n_ubatch=512, type_k="q8_0", type_v="q8_0"),
    dict(n_ctx=8192, n_ubatch=256, flash_attn=False),
    dict(n_ctx=32768, n_ubatch=128),
    dict(n_ctx=20000, n_ubatch=512),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from devtools.synthetic import write_model

    folder = tmp_path_factory.mktemp("plan-archs")
    return {name: write_model(arch, folder / f"{name}.gguf", **kw) for name, (arch, kw) in MODELS.items()}


def _plan(spec: ModelSpec, cfg: dict) -> EngineConfig | None:
    kw = dict(cfg)
    kw.setdefault("flash_attn", True)
    p = replace(search_base(), n_batch=max(kw["n_ubatch"], 512), **kw).validate()
    heads = {lay.head_dim_k for lay in spec.layers if lay.kind != "recurrent"}
    if any(t != "f16" and any(h % 32 for h in heads) for t in (p.type_k, p.type_v)):
        return None  # llama.cpp refuses a quantized KV type that does not divide the head size
    return p


def _ratios(path, spec, cfg, *, swa_full: bool = True) -> tuple[float, float]:
    p = _plan(spec, cfg)
    if p is None:
        return 1.0, 1.0
    real = dry_run(path, p, swa_full=swa_full)
    kv, state = kv_bytes(spec, p, swa_full=swa_full)
    return (kv + state) / real.kv_cache, compute_buffer_bytes(spec, p, swa_full=swa_full) / real.compute["CPU"]


def test_layer_kinds_as_llama_cpp_reads_them(models):
    hybrid = ModelSpec.from_gguf(models["hybrid-wide"])
    assert [lay.kind for lay in hybrid.layers] == ["recurrent", "recurrent", "recurrent", "full"] * 2
    assert all(lay.state_bytes > 0 for lay in hybrid.layers if lay.kind == "recurrent")
    oss = ModelSpec.from_gguf(models["gpt-oss-wide"])
    assert [lay.kind for lay in oss.layers] == ["swa", "full"] * 3  # even layers slide, as llama.cpp's default
    assert {lay.window for lay in oss.layers if lay.kind == "swa"} == {256}


@pytest.mark.parametrize("name", list(MODELS))
def test_memory_model_within_5_percent_of_llama_cpp_dry_run(models, name):
    spec = ModelSpec.from_gguf(models[name])
    modes = (True, False) if any(lay.kind == "swa" for lay in spec.layers) else (True,)
    bad = []
    for swa_full in modes:
        for cfg in CONFIGS:
            kv, cb = _ratios(models[name], spec, cfg, swa_full=swa_full)
            if not (0.95 <= kv <= 1.05 and 0.95 <= cb <= 1.05):
                bad.append((swa_full, cfg, round(kv, 3), round(cb, 3)))
    assert not bad, bad


def test_recurrent_state_and_windowed_kv_do_not_grow_with_the_context(models):
    hybrid = ModelSpec.from_gguf(models["hybrid"])
    small, large = (EngineConfig(n_ctx=n, n_batch=512, n_ubatch=512) for n in (8192, 65536))
    assert kv_bytes(hybrid, small)[1] == kv_bytes(hybrid, large)[1] > 0  # per sequence, whatever the context
    assert kv_bytes(hybrid, large)[0] == 8 * kv_bytes(hybrid, small)[0]  # the one attention layer's cells
    oss = ModelSpec.from_gguf(models["gpt-oss"])
    window = [kv_bytes(oss, s, swa_full=False)[0] for s in (small, large)]
    full = [kv_bytes(oss, s)[0] for s in (small, large)]
    assert full[1] == 8 * full[0] and window[1] - window[0] == (full[1] - full[0]) / 2  # only full layers grow


@pytest.mark.slow
def test_gemma3_sliding_layers_are_read_and_sized_as_llama_cpp_does(model_home):
    from pipeline.models import resolve

    path = resolve("builtin:gemma-3-270m", home=model_home)
    spec = ModelSpec.from_gguf(path)
    kinds = [lay.kind for lay in spec.layers]
    assert kinds == (["swa"] * 5 + ["full"]) * 3 and {lay.window for lay in spec.layers if lay.window} == {512}
    bad = []
    for swa_full in (True, False):
        for cfg in [dict(n_ctx=32768, n_ubatch=512), dict(n_ctx=8192, n_ubatch=1024), dict(n_ctx=16384, n_ubatch=256)]:
            kv, cb = _ratios(path, spec, cfg, swa_full=swa_full)
            if not (0.95 <= kv <= 1.05 and 0.95 <= cb <= 1.05):
                bad.append((swa_full, cfg, round(kv, 3), round(cb, 3)))
    assert not bad, bad


_BUFFER = re.compile(r"(\S+) +(model|output|KV|RS|compute) buffer size = +([\d.]+) MiB")


@pytest.mark.parametrize("name", ["hybrid", "gpt-oss"])
def test_rag_plan_gives_settings_llama_cpp_loads_within_the_budget(models, name, tmp_store):
    """`rag plan FILE --ctx 65536 --ram 3` (2 GiB of it kept as margin): the planned settings, loaded for
    real by the engine, allocate what the plan said (within 5%) and no more than the budget allows."""
    from pipeline.engine._llama import LlamaLog
    from pipeline.engine.local import Engine

    out = CliRunner().invoke(cli, ["plan", str(models[name]), "--ctx", "65536", "--ram", "3", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)["plan"]
    assert data["fits"] and data["plan"]["n_ctx"] == 65536
    settings = replace(EngineConfig(**data["plan"]), threads=2)
    engine = Engine(models[name], settings)
    with LlamaLog(chain=False) as log:
        llm = engine.llm
    try:
        allocated = sum(float(m.group(3)) for m in _BUFFER.finditer(log.text)) * 2**20
        assert allocated <= data["budget"]["ram"] - data["budget"]["ram_margin"]
        planned = footprint(ModelSpec.from_gguf(models[name]), settings).cpu.total
        assert planned == pytest.approx(allocated, rel=0.05)
        if name == "gpt-oss":
            assert "--swa-full" in data["llama_flags"]  # llama-server runs the window cache the plan counted
        assert llm.n_ctx == 65536
    finally:
        llm.close()


def test_the_published_qwen36_spec_has_the_tensor_set_llama_cpp_loads():
    """``--spec qwen3.6-35b-a3b`` (built from published shapes) against the tensor table of a qwen35moe
    of the same shapes as the generator writes it (llama.cpp's tensor set; header only, nothing written):
    the same bytes per layer, recurrent state and active parameters, at F16."""
    import dataclasses

    from devtools.synthetic.qwen35moe import hybrid_hparams, hybrid_tensors
    from devtools.synthetic.writer import tensor_type

    shape = dict(n_layers=40, n_embd=2048, interval=4, n_head=16, n_head_kv=2, head_dim=256, d_conv=4, d_state=128,
                 n_group=16, dt_rank=32, n_experts=256, expert_ff=512, shared_ff=512)
    hparams = hybrid_hparams(n_ctx_train=262144, rope_dim=64, n_experts_used=8, **shape)
    tensors = [(t.name, tuple(reversed(t.shape)), tensor_type(t, "f16", "random"))
               for t in hybrid_tensors(n_vocab=248320, **shape)]
    meta = {"general.architecture": "qwen35moe", **{f"qwen35moe.{k}": v for k, v in hparams.items()}}
    generated = ModelSpec.from_metadata(meta, tensors)
    published = ModelSpec.qwen36_35b_a3b("F16")
    for key in ("n_vocab", "n_ctx_train", "n_experts", "n_experts_used", "expert_ff", "embd_bytes", "output_bytes",
                "total_bytes", "active_params"):
        assert getattr(generated, key) == getattr(published, key), key
    skip = {"n_head", "n_head_kv", "head_dim_k", "head_dim_v"}  # unused on a recurrent layer
    for gen, pub in zip(generated.layers, published.layers):
        got, want = dataclasses.asdict(gen), dataclasses.asdict(pub)
        if gen.kind == "recurrent":
            got, want = ({k: v for k, v in d.items() if k not in skip} for d in (got, want))
        assert got == want
