"""`rag plan`, `rag tune` and `rag bench` through the CLI, and tuned settings reaching the engine."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipeline.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_plan_for_the_recipe_model_beats_llama_cpp_fit(tmp_store):
    out = run("plan", "--spec", "qwen3.6-35b-a3b", "--gpu", "rtx3090", "--ctx", "65536")
    assert out.exit_code == 0, out.output
    assert "fits" in out.output and "--n-cpu-moe" in out.output and "[engine]" in out.output
    data = json.loads(run("plan", "--spec", "qwen3.6-35b-a3b", "--gpu", "rtx3090", "--ctx", "65536",
                          "--json").output)
    plan, fit = data["plan"], data["llama_cpp_fit"]
    assert plan["fits"] and plan["prefill"]["tokens_per_s"] >= fit["prefill"]["tokens_per_s"]
    assert plan["memory"]["gpu"]["total"] <= 24 * 2**30
    table = run("plan", "--spec", "qwen3.6-35b-a3b", "--gpu", "rtx3090", "--ctx", "65536", "--compare").output
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| baseline (-b 512 -ub 128)", "| recipe (--n-cpu-moe 8 -b 1024 -ub 512)",
                                                "| llama.cpp --fit (modelled)", "| plan", "| plan, KV type searched"]
    speeds = [float(r.split(" | ")[7].split()[0]) for r in rows]
    assert speeds[3] > speeds[1] > speeds[0] and speeds[3] >= speeds[2]  # plan beats recipe and fit


def test_plan_reads_a_gguf_and_bad_inputs_are_clear(tmp_store, tmp_path):
    from devtools.synthetic import write_moe_model

    model = write_moe_model(tmp_path / "m.gguf")
    data = json.loads(run("plan", str(model), "--gpu", "rtx3090", "--ctx", "8192", "--json").output)
    assert data["plan"]["fits"] and data["plan"]["plan"]["n_ctx"] == 8192
    bad = run("plan", "--spec", "llama-9000")
    assert bad.exit_code == 2 and "unknown model spec" in bad.output
    missing = run("plan", str(tmp_path / "none.gguf"))
    assert missing.exit_code == 3 and "not found" in missing.output


@pytest.mark.slow
def test_tune_writes_a_profile_that_ask_picks_up(store_dir, tmp_path, monkeypatch, model_home):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(model_home / "models")
    monkeypatch.setenv("RAG_HOME", str(home))
    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")
    out = run("tune", "--max-seconds", "0", "--tokens", "64", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["profile"].startswith(str(home / "tuned"))
    from pipeline import Pipeline
    from pipeline.models import resolve

    rag = Pipeline.from_config(overrides={"engine.n_ubatch": 64})
    path = resolve("builtin:SmolLM2-135M-Instruct", home=home, fetch=False)
    settings = rag.engine_settings(path)
    assert settings.n_ubatch == 64  # what the user set wins over the profile
    from pipeline.config.tuned import read_profile

    profile = read_profile(data["profile"])
    assert profile and all(k.startswith("engine.") for k in profile)
    untouched = Pipeline.from_config().engine_settings(path)
    for key, value in profile.items():
        assert getattr(untouched, key.split(".", 1)[1]) == value


def test_bench_names_the_benchmarks_it_knows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("bench", "no-such-benchmark")
    assert out.exit_code == 2
    assert ("unknown benchmark(s): no-such-benchmark; there are: cache, calibration, citations, compose_memory, compose_quality, "
            "concurrency, expansion, first_token, fusion_choice, generators, heldout, hybrid_order, ingest, prefill, remote, retrieval, section_size, "
            "section_state_types, session, shared_ingest, state_footprint, summarize, warm") in out.output
    assert not (tmp_path / "bench-results").exists()  # nothing ran, nothing written


def test_bench_outside_a_source_checkout_says_it_needs_one(tmp_path):
    """Installed without the checkout (the package alone, as ``pip install`` lays it out), ``rag bench``
    has no benchmarks and no runner: a clear message and status 2, no traceback."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    site = tmp_path / "site"
    shutil.copytree(Path(__file__).resolve().parents[2] / "pipeline", site / "pipeline",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site), "RAG_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-m", "pipeline", "bench", "ingest"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "runs the benchmarks of a source checkout" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "bench-results").exists()


def test_plan_default_model_on_a_gpu_profile_picks_large_micro_batches(store_dir):
    """The issue's case: SmolLM2-135M on an RTX 3090 profile planned -b 128 -ub 128; now >= 512."""
    out = run("plan", "--gpu", "rtx3090", "--ctx", "8192", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["plan"]["plan"]["n_ubatch"] >= 512 and data["plan"]["fits"]
    assert data["plan"]["prefill"]["tokens_per_s"] >= data["llama_cpp_fit"]["prefill"]["tokens_per_s"]


def test_a_gpu_budget_that_holds_no_layer_is_planned_and_said_to_be_a_cpu_plan(store_dir):
    """--vram 0.01 on a GPU profile: a CPU plan (-ngl 0) with the largest tied micro-batch, no experts moved on a
    dense model, and the text says it is a CPU plan; a budget holding some layers says "partial offload"."""
    out = run("plan", "--gpu", "rtx3090", "--vram", "0.01", "--ctx", "8192", "--json")
    assert out.exit_code == 0, out.output
    p = json.loads(out.output)["plan"]
    assert p["fits"] and p["plan"]["gpu_layers"] == 0 and p["memory"]["gpu"]["total"] == 0
    assert p["plan"]["cpu_moe"] is False and p["plan"]["n_cpu_moe"] == 0  # the default model is dense: no experts to move
    assert p["plan"]["n_ubatch"] >= 512
    text = run("plan", "--gpu", "rtx3090", "--vram", "0.01", "--ctx", "8192").output
    assert "a CPU plan: the GPU budget holds no layer" in text and "GPU: nothing placed" in text
    assert "--cpu-moe" not in text
    partial = run("plan", "--gpu", "rtx3090", "--vram", "0.8", "--ctx", "8192", "--json")
    q = json.loads(partial.output)["plan"]
    assert partial.exit_code == 0 and 0 < q["plan"]["gpu_layers"] < 18, q["plan"]  # Gemma 3 270M: 18 layers
    assert q["memory"]["gpu"]["total"] + q["budget"]["gpu_margin"] <= q["budget"]["vram"]
    assert "partial offload:" in run("plan", "--gpu", "rtx3090", "--vram", "0.8", "--ctx", "8192").output


def test_impossible_plan_requests_are_one_line_and_exit_2(store_dir, tmp_path):
    from devtools.synthetic import write_moe_model

    model = str(write_moe_model(tmp_path / "m.gguf"))  # trained context 65536
    cases = {
        ("--vram", "2", "--ctx", "8192"): "has no GPU",  # a GPU budget with the CPU-only profile
        ("--gpu", "rtx3090", "--ram", "0.001", "--vram", "0.001"): "weights alone",
        ("--gpu", "rtx3090", "--ctx", "70000"): "trained context",
        ("--gpu", "voodoo2",): "Unknown hardware profile",
        ("--gpu", "rtx3090", "--vram", "nan"): "positive number",
        ("--gpu", "rtx3090", "-b", "256", "-ub", "512"): "cannot exceed",
    }
    for args, message in cases.items():
        out = CliRunner().invoke(cli, ["plan", model, *args])
        assert out.exit_code == 2, (args, out.output)
        assert out.exception is None or isinstance(out.exception, SystemExit), (args, out.exception)
        assert message in out.output and len(out.output.strip().splitlines()) == 1, (args, out.output)


def test_plan_fuzz_no_traceback_and_fitting_plans_fit(store_dir, tmp_path):
    """500 random option combinations: never a traceback; exit 0 with a plan that really fits, or 2 with one line."""
    import math
    import random

    from pipeline.config import EngineConfig
    from pipeline.tuning.hardware import HardwareProfile
    from pipeline.tuning.footprint import footprint
    from pipeline.tuning.result import Budget, fits
    from pipeline.tuning.spec import ModelSpec
    from devtools.synthetic import write_moe_model

    models = {str(write_moe_model(tmp_path / "tiny.gguf")): None,
              str(write_moe_model(tmp_path / "deep.gguf", n_layers=12, n_embd=128, n_head=8, n_head_kv=1,
                                  head_dim=32, n_experts=32, n_experts_used=8, expert_ff=64, vocab=1000)): None}
    specs = {path: ModelSpec.from_gguf(path) for path in models}
    qwen = ModelSpec.qwen36_35b_a3b("Q6_K")
    bad_profile = tmp_path / "bad.toml"
    bad_profile.write_text('[hardware]\nname = "mine"\ngpu_name = "x"\nvram = 1000000000\ngpu_flops = 0.0\n'
                           'h2d_pinned = 0.0\nh2d_pageable = 0.0\ncpu_flops = 1e9\nram = 1000000000\n')
    rng = random.Random(15)
    gpus = [None, "rtx3090", "rtx3090", "rtx4090", "a100-40gb", "h100", "h200", "cpu", "voodoo2", str(bad_profile)]
    sizes = [None] * 6 + ["0", "0.001", "0.5", "2", "8", "24", "80", "-1", "nan", "inf"]
    ctxs = [None, "1", "17", "512", "4096", "8192", "65536", "70000", "300000"]
    batches = [None] * 6 + ["1", "64", "512", "4096", "100000"]
    seen = {0: 0, 2: 0}
    for i in range(500):
        use_qwen = i % 25 == 0
        target = ["--spec", "qwen3.6-35b-a3b"] if use_qwen else [rng.choice(list(models))]
        args = ["plan", *target, "--json"]
        for flag, choices in (("--gpu", gpus), ("--vram", sizes), ("--ram", sizes), ("--ctx", ctxs),
                              ("--kv", [None, "f16", "q8_0", "q4_0", "auto"]), ("-b", batches), ("-ub", batches)):
            value = rng.choice(choices)
            if value is not None:
                args += [flag, value]
        if use_qwen and rng.random() < 0.3:
            args.append("--compare")
        out = CliRunner().invoke(cli, args)
        assert out.exception is None or isinstance(out.exception, SystemExit), (args, repr(out.exception))
        assert "Traceback" not in out.output, (args, out.output)
        assert out.exit_code in (0, 2), (args, out.output)
        seen[out.exit_code] += 1
        if out.exit_code == 2:  # --json: the error as JSON on stdout, the message as one line on stderr
            assert json.loads(out.stdout)["exit_code"] == 2, (args, out.output)
            assert len(out.stderr.strip().splitlines()) == 1, (args, out.output)
            continue
        data = json.loads(out.stdout)
        spec = qwen if use_qwen else specs[target[0]]
        hw = HardwareProfile.from_dict(data["hardware"])
        for result in filter(None, [data["plan"], data["llama_cpp_fit"], *data.get("compare", [])]):
            if not result["fits"]:
                continue
            mem = footprint(spec, EngineConfig(**result["plan"]), hw)
            assert fits(mem, Budget(**result["budget"])), (args, result["label"])
            assert mem.gpu.total == result["memory"]["gpu"]["total"]
            assert math.isfinite(result["prefill"]["tokens_per_s"]) and result["prefill"]["tokens_per_s"] > 0
        assert data["plan"]["fits"]
    assert seen[0] > 100 and seen[2] > 100  # both outcomes well exercised
