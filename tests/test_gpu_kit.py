"""The GPU kit's parts that run here without its hours-long build: flags, toolchains, the probe, refusals."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pipeline.dev import gpu_kit


def test_kit_flags_are_portable_and_name_both_gpus() -> None:
    args = gpu_kit.kit_cmake_args()
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=86-real;90-real" in args
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args
    assert not any("AMX" in a for a in args) and "-DGGML_CUDA_NO_VMM=ON" in args
    # the CUDA major version is part of the cache key: a CUDA 12 wheel is never handed out for CUDA 13
    assert gpu_kit._key_args("12", gpu_kit.ARCHS) != gpu_kit._key_args("13", gpu_kit.ARCHS)
    assert set(gpu_kit.TOOLCHAINS["12"]) >= {"nvidia-cuda-nvcc-cu12==12.9.*", "nvidia-cuda-runtime-cu12==12.9.*",
                                              "nvidia-cublas-cu12==12.9.*", "nvidia-cuda-cccl-cu12==12.9.*"}
    assert all("==13.0." in p for p in gpu_kit.TOOLCHAINS["13"])


def test_check_and_pack_refuse_without_a_built_wheel(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RAG_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match="gpu_kit.py build --cuda 13"):
        gpu_kit.check(cuda="13")
    with pytest.raises(SystemExit, match="gpu_kit.py build --cuda 12"):
        gpu_kit.pack(cuda="12", out=tmp_path / "kit")
    assert not (tmp_path / "kit").exists()


def test_probe_reads_llama_cpp_backends() -> None:
    """The probe the kit runs on its own install, here on this environment's CPU build: no CUDA backend."""
    import llama_cpp

    site = Path(llama_cpp.__file__).parent.parent
    info = gpu_kit.probe(site, [], python=sys.executable)
    assert info["version"] == "0.3.36" and "CPU" in info["backends"] and "CUDA" not in info["backends"]
    assert info["gpu_offload"] is False


def test_missing_cuda_runtime_is_named(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    with pytest.raises(SystemExit, match=r"no libcudart.so.99 on this machine"):
        gpu_kit.find_cuda_libs("99")
