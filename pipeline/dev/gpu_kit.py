"""The GPU kit: a CUDA build of llama-cpp-python made on a machine without a GPU, carried to one without a network.

Four steps, one command each (``python pipeline/dev/gpu_kit.py STEP``):

``build``
    Installs NVIDIA's CUDA toolchain from PyPI into ``$RAG_HOME/cuda/cuXX`` (no
    system CUDA, no GPU, no driver needed) and builds llama-cpp-python
    :data:`~pipeline._build.LLAMA_CPP_VERSION` with ``GGML_CUDA=ON`` for the RTX 3090
    (``sm_86``) and the H100/H200 (``sm_90``). The wheel is cached like the CPU
    build, under ``$RAG_HOME/wheels/llama-cpp-python-<version>-<hash of the flags>/``:
    an unchanged kit never rebuilds. The CPU side of the build names a portable
    instruction set (x86-64-v3: AVX2, FMA, F16C, BMI2; never native, never AMX),
    because the machine that runs it is not this one.
``check``
    Installs the wheel into a scratch folder, imports it with this interpreter and
    asserts that llama.cpp lists its CUDA backend (``llama_print_system_info``) even
    with no device present.
``pack``
    Writes the kit folder (default ``gpu-kit/`` in the repository, ignored by git):
    the wheel, the pure-Python wheels it needs that a CUDA image may lack
    (``diskcache``, ``gguf``), a manifest, and ``run.sh``.
``run`` (on the GPU machine, from the repository root)
    Installs the kit's wheels into ``gpu-kit/site`` (``pip --no-index --target``:
    nothing is fetched), finds the CUDA runtime libraries of the kit's CUDA major
    version there, checks that llama.cpp sees a GPU, and runs
    ``benchmarks/gpu_prefill.py --skip-build`` under a time limit.

Why the Python version does not matter: llama-cpp-python reaches llama.cpp through
ctypes, so its wheel holds no CPython extension and is tagged ``py3-none`` (one
wheel for 3.11 here and 3.12 there); ``diskcache`` and ``gguf`` are pure Python, and
numpy, Jinja2, PyYAML and tqdm are taken from the target's own Python.

Why the CUDA major version matters: the kit links ``libcudart.so.N``,
``libcublas.so.N`` and ``libcublasLt.so.N`` and does not carry them (cuBLASLt alone
is about 500 MB). ``--cuda 12`` (NVIDIA's ``*-cu12`` packages) is for a machine with
a CUDA 12 runtime; ``--cuda 13`` (the 13.0 packages, which are not suffixed) for
one with CUDA 13, such as the H200 machines this project is lent (driver 580, CUDA
13.0 libraries, no CUDA 12 ones). The driver API is not linked
(``GGML_CUDA_NO_VMM``), so the wheel also imports where no driver is installed.

Standard library only: it runs before (and without) the package's dependencies.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``pipeline`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline._build import LLAMA_CPP_VERSION, cmake_args, ensure_wheel, rag_home, wheel_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ARCHS = ("86", "90")  # RTX 3090, H100/H200
#: The instruction sets of the CPU side: x86-64-v3, which every host of such GPUs has.
PORTABLE_CPU = frozenset({"avx", "avx2", "fma", "f16c", "bmi2"})

#: NVIDIA's toolchain packages on PyPI, per CUDA major version. CUDA 13 ships one
#: tree (``nvidia/cu13``) split over more packages (the C runtime headers and NVVM
#: apart from nvcc); 13.0 matches the driver of the machines this project is lent.
TOOLCHAINS: dict[str, tuple[str, ...]] = {
    "12": ("nvidia-cuda-nvcc-cu12==12.9.*", "nvidia-cuda-runtime-cu12==12.9.*", "nvidia-cublas-cu12==12.9.*",
           "nvidia-cuda-cccl-cu12==12.9.*"),
    "13": ("nvidia-cuda-nvcc==13.0.*", "nvidia-cuda-runtime==13.0.*", "nvidia-cublas==13.0.*",
           "nvidia-cuda-cccl==13.0.*", "nvidia-cuda-crt==13.0.*", "nvidia-nvvm==13.0.*"),
}
#: What the kit carries besides the wheel: pure-Python packages a CUDA image may lack.
EXTRA_WHEELS = ("diskcache>=5.6", "gguf>=0.10")
RUNTIME_LIBS = ("libcudart.so", "libcublas.so", "libcublasLt.so")


def kit_cmake_args(archs: tuple[str, ...] = ARCHS) -> list[str]:
    """The CMake options of the kit's build (part of its cache key)."""
    return cmake_args(set(PORTABLE_CPU)) + [
        "-DGGML_CUDA=ON",
        "-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(f"{a}-real" for a in archs),
        "-DGGML_CUDA_NO_VMM=ON",  # no libcuda at link time: builds with no driver, imports with none
        "-DGGML_CUDA_NCCL=OFF",
        "-DLLAVA_BUILD=OFF",  # the multimodal library: unused here, minutes of compiling
    ]


def toolchain(cuda: str, *, python: str = sys.executable) -> Path:
    """A CUDA toolkit root made of NVIDIA's PyPI packages, installed once under ``$RAG_HOME/cuda``."""
    if cuda not in TOOLCHAINS:
        raise SystemExit(f"--cuda must be one of {', '.join(TOOLCHAINS)}")
    base = rag_home() / "cuda" / f"cu{cuda}"
    root = base / "root"
    if (root / "bin" / "nvcc").exists():
        return root
    site = base / "site"
    shutil.rmtree(base, ignore_errors=True)
    print(f"installing the CUDA {cuda} toolchain from PyPI into {base}", file=sys.stderr)
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--target", str(site), *TOOLCHAINS[cuda]], check=True)
    # One tree with bin/, include/, lib/, nvvm/: CUDA 13's packages share one already; CUDA 12's
    # (nvidia/cuda_nvcc, nvidia/cuda_runtime, nvidia/cublas, nvidia/cuda_cccl) are merged by hard links.
    parts = [site / "nvidia" / "cu13"] if cuda == "13" else sorted(
        p for p in (site / "nvidia").iterdir() if p.is_dir() and (p / "include").is_dir())
    tmp = base / "root.partial"
    for part in parts:
        shutil.copytree(part, tmp, dirs_exist_ok=True, copy_function=os.link, symlinks=True)
    lib = tmp / "lib"
    for so in sorted(lib.glob("lib*.so.*")):  # the link-time names: libcublas.so -> libcublas.so.12
        plain = lib / (so.name.split(".so.")[0] + ".so")
        if not plain.exists():
            plain.symlink_to(so.name)
    if not (tmp / "lib64").exists():
        (tmp / "lib64").symlink_to("lib")
    target = tmp / "targets" / "x86_64-linux"  # where nvcc.profile looks for headers and libraries
    if not target.exists():
        target.parent.mkdir(parents=True)
        for name in ("include", "lib"):
            target.mkdir(exist_ok=True)
            (target / name).symlink_to(Path("..", "..", name))
    for tool in (tmp / "bin").iterdir():
        tool.chmod(tool.stat().st_mode | 0o111)
    for tool in (tmp / "nvvm" / "bin").glob("*"):
        tool.chmod(tool.stat().st_mode | 0o111)
    tmp.rename(root)
    return root


def build(*, cuda: str, archs: tuple[str, ...] = ARCHS, python: str = sys.executable,
          sdist: str | None = None) -> Path:
    """The kit's wheel: built once per (version, CUDA major, flags), then taken from the cache."""
    args = kit_cmake_args(archs) + [f"-DRAG_KIT_CUDA={cuda}"]  # the toolchain's major version is part of the key
    cached = sorted(wheel_folder(args).glob("llama_cpp_python-*.whl"))
    if cached:
        return cached[0]
    root = toolchain(cuda, python=python)
    env = {
        "CUDACXX": str(root / "bin" / "nvcc"),
        "CUDAToolkit_ROOT": str(root),
        "CUDA_PATH": str(root),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "LD_LIBRARY_PATH": f"{root / 'lib'}{os.pathsep}{os.environ.get('LD_LIBRARY_PATH', '')}",
    }
    print(f"building llama-cpp-python {LLAMA_CPP_VERSION} for CUDA {cuda}, sm_{', sm_'.join(archs)} "
          "(one-time; well over an hour on 2 cores)", file=sys.stderr)
    t = time.perf_counter()
    wheel = ensure_wheel(args, python=python, env=env, sdist=sdist)
    print(f"built {wheel} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return wheel


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="install the CUDA toolchain from PyPI and build the wheel (cached)")
    b.add_argument("--cuda", choices=sorted(TOOLCHAINS), default="13", help="CUDA major version of the target")
    b.add_argument("--archs", default=",".join(ARCHS), help="GPU architectures (default %(default)s)")
    b.add_argument("--sdist", help="build from this llama-cpp-python source archive instead of PyPI's")
    ns = ap.parse_args(argv)
    if ns.step == "build":
        print(build(cuda=ns.cuda, archs=tuple(ns.archs.split(",")), sdist=ns.sdist))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
