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
    from pipeline.dev.synthetic import write_moe_model

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
    from pipeline.planner.tune import read_profile

    profile = read_profile(data["profile"])
    assert profile and all(k.startswith("engine.") for k in profile)
    untouched = Pipeline.from_config().engine_settings(path)
    for key, value in profile.items():
        assert getattr(untouched, key.split(".", 1)[1]) == value


def test_bench_names_the_benchmarks_it_knows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = run("bench", "no-such-benchmark")
    assert out.exit_code == 2
    assert "unknown benchmark(s): no-such-benchmark; there are: cache, ingest, prefill" in out.output
    assert not (tmp_path / "bench-results").exists()  # nothing ran, nothing written
