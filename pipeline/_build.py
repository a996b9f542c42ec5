"""Build llama-cpp-python for this machine, once per distinct set of build flags.

A native llama.cpp build enables every instruction set the CPU *reports*. Some
machines report AMX while the kernel does not enable it, and the build then dies
with SIGILL at the first matrix multiply. So the build is never native: the
instruction sets are read from ``/proc/cpuinfo`` and named one by one, AMX never
among them. The wheel is built once per (version, flags) key and kept under the
rag home, so pip's own wheel cache (which ignores ``CMAKE_ARGS``) cannot hand
back a build made with other flags, and an unchanged machine never rebuilds.

Standard library only: this runs before the package's dependencies exist.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LLAMA_CPP_VERSION = "0.3.36"

# cpuinfo flag -> ggml CMake option. Order is irrelevant; AMX is deliberately absent.
_CPU_FLAGS = {
    "avx": "GGML_AVX",
    "avx2": "GGML_AVX2",
    "fma": "GGML_FMA",
    "f16c": "GGML_F16C",
    "bmi2": "GGML_BMI2",
    "avx512f": "GGML_AVX512",
    "avx512_vbmi": "GGML_AVX512_VBMI",
    "avx512_vnni": "GGML_AVX512_VNNI",
    "avx512_bf16": "GGML_AVX512_BF16",
    "avx_vnni": "GGML_AVX_VNNI",
}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The instruction-set flags of the first processor listed in a cpuinfo text."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def cmake_args(flags: set[str], *, cuda: bool = False) -> list[str]:
    """CMake options for a non-native build using exactly the instruction sets in ``flags``."""
    args = ["-DGGML_NATIVE=OFF"]
    for flag, option in sorted(_CPU_FLAGS.items(), key=lambda kv: kv[1]):
        args.append(f"-D{option}={'ON' if flag in flags else 'OFF'}")
    if cuda:
        args += ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=native"]
    return args


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def build_key(args: list[str]) -> str:
    text = " ".join([LLAMA_CPP_VERSION, sys.implementation.cache_tag, *args])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def rag_home() -> Path:
    if os.environ.get("RAG_HOME"):
        return Path(os.environ["RAG_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag"


def resolve_args() -> list[str]:
    override = os.environ.get("RAG_LLAMA_CMAKE_ARGS")
    if override:
        return override.split()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return cmake_args(cpu_flags(cpuinfo), cuda=_has_gpu() and shutil.which("nvcc") is not None)


def ensure_wheel(args: list[str], *, python: str = sys.executable, env: dict[str, str] | None = None,
                 sdist: str | None = None, build_dir: str | None = None) -> Path:
    """Return the wheel for ``args``, building it only if no build with that key exists.

    ``env`` adds environment variables for the build that are not part of its key (a
    toolchain's location, say); ``sdist`` builds from that source archive or folder
    instead of fetching it; ``build_dir`` keeps CMake's build folder there, so that an
    interrupted build resumes where it stopped (with a source folder, which stays put).
    """
    folder = wheel_folder(args)
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if wheels:
        return wheels[0]
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = dict(os.environ, **(env or {}), CMAKE_ARGS=" ".join(args), FORCE_CMAKE="1")
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    print(f"building llama-cpp-python {LLAMA_CPP_VERSION} with {' '.join(args)}", file=sys.stderr)
    if not env:
        print("(one-time, about 8-10 minutes on 2 cores)", file=sys.stderr)
    subprocess.run(
        [python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
         "--no-binary", "llama-cpp-python", "-w", str(tmp),
         *([f"--config-settings=build-dir={build_dir}", "-v"] if build_dir else []),  # a long build: its log
         sdist or f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
        env=env, check=True,
    )
    (tmp / "CMAKE_ARGS").write_text(" ".join(args) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return sorted(folder.glob("llama_cpp_python-*.whl"))[0]


def wheel_folder(args: list[str]) -> Path:
    """Where the wheel built with ``args`` is kept."""
    return rag_home() / "wheels" / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{build_key(args)}"


def ensure_installed(*, python: str = sys.executable) -> None:
    """Install the machine's llama-cpp-python build into ``python``'s environment if it is not there."""
    args = resolve_args()
    key = build_key(args)
    prefix = subprocess.run([python, "-c", "import sys; print(sys.prefix)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    marker = Path(prefix) / "llama-cpp-build-key"
    if marker.exists() and marker.read_text().strip() == key:
        probe = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True)
        if probe.returncode == 0:
            return
    wheel = ensure_wheel(args, python=python)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    "--no-cache-dir", str(wheel)], check=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "numpy", "typing-extensions",
                    "diskcache", "jinja2"], check=True)
    marker.write_text(key + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print-args", action="store_true", help="print the CMake options and exit")
    parser.add_argument("--python", default=sys.executable, help="interpreter to install into")
    ns = parser.parse_args(argv)
    if ns.print_args:
        print(" ".join(resolve_args()))
        return 0
    ensure_installed(python=ns.python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
