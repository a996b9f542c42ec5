"""The GPU kit's parts that run here without its hours-long build: flags, toolchains, the probe, refusals."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from devtools import gpu_kit


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


def _wheel_of_installed_llama_cpp(path: Path) -> Path:
    """A wheel laid out like llama-cpp-python's (every library under three names) from this environment's install."""
    import zipfile

    import llama_cpp

    site = Path(llama_cpp.__file__).parent.parent
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for f in sorted((site / "llama_cpp").rglob("*")) + sorted(site.glob("llama_cpp_python-*.dist-info/*")):
            if f.is_file() and "__pycache__" not in f.parts:
                z.write(f, f.relative_to(site).as_posix())
    return path


@pytest.mark.slow
def test_pack_stores_each_library_once_and_the_kit_installs_and_imports_offline(tmp_path) -> None:
    """The kit's archive holds each shared library once (the others are links); installed as `run` installs it,
    llama.cpp loads from it (here: this environment's CPU build in the same layout as the CUDA wheel)."""
    import tarfile
    import zipfile

    wheel = _wheel_of_installed_llama_cpp(tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    kit = gpu_kit.pack(cuda="13", out=tmp_path / "kit", wheel=wheel, extras=())
    manifest = json.loads((kit / "MANIFEST.json").read_text())
    with tarfile.open(kit / manifest["archive"]) as tar:
        libs = {m.name.rsplit("/", 1)[-1]: m for m in tar.getmembers() if "/lib/lib" in m.name}
    assert {n for n, m in libs.items() if m.isfile()} >= {"libllama.so.0", "libggml.so.0", "libggml-base.so.0",
                                                          "libggml-cpu.so.0"}
    assert all(not m.isfile() or n.count(".so.") == 1 and n.split(".so.")[1].isdigit() for n, m in libs.items())
    assert libs["libllama.so"].issym() and libs["libllama.so"].linkname == "libllama.so.0"
    assert libs["libllama.so.0.5.0"].issym()
    real = sum(m.size for m in libs.values() if m.isfile())
    with zipfile.ZipFile(wheel) as z:
        in_wheel = sum(i.file_size for i in z.infolist() if i.filename.startswith("llama_cpp/lib/lib"))
    assert in_wheel == 3 * real  # each library once, where the wheel holds it thrice
    assert (kit / manifest["archive"]).stat().st_size < 0.5 * wheel.stat().st_size

    site = tmp_path / "site"
    gpu_kit.install_kit(kit, site)
    assert (site / "llama_cpp" / "lib" / "libllama.so").is_symlink()
    info = gpu_kit.probe(site, [], python=sys.executable)
    assert Path(info["path"]).resolve().is_relative_to(site.resolve())  # the kit's copy, not the environment's
    assert info["version"] == "0.3.36" and "CPU" in info["backends"]


@pytest.mark.slow
def test_a_damaged_or_partial_kit_is_refused(tmp_path) -> None:
    wheel = _wheel_of_installed_llama_cpp(tmp_path / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    kit = gpu_kit.pack(cuda="13", out=tmp_path / "kit", wheel=wheel, extras=())
    archive = kit / json.loads((kit / "MANIFEST.json").read_text())["archive"]
    with archive.open("r+b") as f:
        f.seek(archive.stat().st_size // 2)
        f.write(b"\0" * 64)
    with pytest.raises(SystemExit, match="does not match its checksum"):
        gpu_kit.install_kit(kit, tmp_path / "site")
    archive.unlink()
    with pytest.raises(SystemExit, match="is missing: copy the whole kit folder"):
        gpu_kit.install_kit(kit, tmp_path / "site")
    with pytest.raises(SystemExit, match="is not a packed kit"):
        gpu_kit.install_kit(tmp_path / "nowhere", tmp_path / "site")


@pytest.mark.slow
def test_gpu_prefill_measures_every_configuration_on_the_smoke_model(tmp_path) -> None:
    """The benchmark the kit runs, end to end on a tiny model of the same architecture (here on the CPU):
    the model is written, each configuration loads and prefills, and the JSON holds measured next to estimated."""
    import subprocess

    root = Path(gpu_kit.__file__).resolve().parents[1]
    out = tmp_path / "smoke.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_prefill.py"), "--smoke", "--skip-build",
                           "--work", str(tmp_path / "work"), "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(out.read_text())
    rows = data["measurements"]
    assert data["smoke"] is True and {r["config"] for r in rows} == {"recipe", "plan for 24 GiB", "all on GPU"}
    assert sorted({r["prompt_tokens"] for r in rows}) == [504, 1016]
    assert all(r["measured_tok_s"] > 0 and r["estimated_tok_s"] > 0 for r in rows)
    assert "| recipe | 504 |" in done.stdout
