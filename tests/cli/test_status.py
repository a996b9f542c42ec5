"""``rag --version`` and ``rag status``: what a user pastes into a bug report."""

from __future__ import annotations

import json
import os
from importlib.metadata import version

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.engine.build_info import parse_system_info
from pipeline.schemas import validate

CUDA_INFO = ("CUDA : ARCHS = 860,900 | NO_VMM = 1 | USE_GRAPHS = 1 | FA_QUANTS = q4_0-q4_0,f16-f16 | "
             "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | F16C = 1 | FMA = 1 | BMI2 = 1 | OPENMP = 1 | ")


def test_system_info_is_parsed_per_backend():
    backends = parse_system_info(CUDA_INFO)
    assert list(backends) == ["CUDA", "CPU"]
    assert backends["CUDA"]["ARCHS"] == "860,900" and backends["CUDA"]["NO_VMM"] == "1"
    assert backends["CPU"]["AVX2"] == "1" and backends["CPU"]["AVX512"] == "0"
    assert parse_system_info("") == {}


def test_a_cuda_build_is_described_with_its_architectures():
    from pipeline.engine.build_info import BuildInfo

    info = BuildInfo("0.3.36", CUDA_INFO, parse_system_info(CUDA_INFO), gpu_offload=True,
                     devices=({"name": "CUDA0", "description": "NVIDIA H200"}, {"name": "CPU", "description": "x"}))
    lines = info.describe().splitlines()
    assert lines[0].startswith("CUDA: ARCHS = 860,900, NO_VMM, USE_GRAPHS")
    assert lines[1].startswith("CPU: SSE3, AVX, AVX2, F16C") and "AVX512" not in lines[1]
    assert info.cpu_features == ["SSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "OPENMP"]
    assert info.gpu_backends == {"CUDA": parse_system_info(CUDA_INFO)["CUDA"]}


def test_version_names_rag_and_llama_cpp_python():
    import pipeline

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"rag {pipeline.__version__} (llama-cpp-python {version('llama_cpp_python')}, ")


def test_status_reports_the_build_models_and_cache_without_creating_anything(tmp_path, monkeypatch):
    """The build is llama.cpp's own account of itself; the sizes are the files'; nothing is created."""
    import llama_cpp

    monkeypatch.setenv("RAG_STORE_PATH", str(tmp_path / "store"))
    monkeypatch.setenv("RAG_CACHE_PATH", str(tmp_path / "cache"))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(3 * 2**20))
    monkeypatch.setenv("RAG_MODELS_GENERATOR", str(model))
    runner = CliRunner()

    data = json.loads(runner.invoke(cli, ["status", "--json"]).output)
    validate("status", data)
    system = data["system"]
    truth = parse_system_info(llama_cpp.llama_print_system_info().decode())
    assert system["llama_cpp"]["backends"] == truth and truth["CPU"]
    assert system["llama_cpp"]["llama_cpp_python"] == llama_cpp.__version__
    assert set(system["llama_cpp"]["cpu_features"]) == {k for k, v in truth["CPU"].items() if v == "1"}
    assert system["models"]["generator"] == {"ref": str(model), "path": str(model), "ready": True,
                                             "bytes": model.stat().st_size}
    assert system["cache"]["entries"] == 0 and system["cache"]["hits"] == 0 and system["cache"]["enabled"]
    assert system["cores"] >= 1 and system["engine"]["n_ctx"] == 8192

    text = runner.invoke(cli, ["status"]).output
    cpu_line = next(line for line in text.splitlines() if line.startswith("llama.cpp:"))
    assert all(flag in cpu_line for flag in system["llama_cpp"]["cpu_features"])
    assert f"{model} (3.0 MiB)" in text
    assert "0 states" in text and "0 hits" in text
    assert not (tmp_path / "store").exists() and not (tmp_path / "cache").exists()


def test_status_says_when_a_model_is_missing_and_the_cache_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_STORE_PATH", str(tmp_path / "store"))
    monkeypatch.setenv("RAG_MODELS_GENERATOR", str(tmp_path / "missing.gguf"))
    monkeypatch.setenv("RAG_CACHE_ENABLED", "false")
    result = CliRunner().invoke(cli, ["status"])
    assert result.exit_code == 0, result.output
    assert "not ready" in result.output and "prefix cache: off" in result.output


@pytest.mark.slow
def test_status_counts_the_prefix_cache_hits_of_real_questions(store_dir, corpus, monkeypatch):
    """The hits and sizes are the cache's own counters: the same figures as `rag cache stats`."""
    monkeypatch.setenv("RAG_CACHE_MIN_TOKENS", "16")
    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(corpus)]).exit_code == 0
    for _ in range(2):  # separate processes' worth of pipelines: the second restores from disk
        out = runner.invoke(cli, ["ask", "What reduces memory traffic?", "--max-tokens", "4", "--doc",
                                  str(corpus / "guide.md")])
        assert out.exit_code == 0, out.output
    cache = json.loads(runner.invoke(cli, ["status", "--json"]).output)["system"]["cache"]
    stats = json.loads(runner.invoke(cli, ["cache", "stats", "--json"]).output)
    assert cache["hits"] >= 1 and cache["entries"] >= 1 and cache["bytes"] > 0
    assert {k: cache[k] for k in ("entries", "bytes", "hits", "misses", "tokens_reused")} == \
        {k: stats[k] for k in ("entries", "bytes", "hits", "misses", "tokens_reused")}
    assert f"{cache['hits']:,} hits" in runner.invoke(cli, ["status"]).output
    assert os.path.isdir(cache["directory"])
