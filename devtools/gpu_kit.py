"""The GPU kit: a CUDA build of llama-cpp-python made on a machine without a GPU, carried to one without a network.

Four steps, one command each (``python devtools/gpu_kit.py STEP``):

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
    with no device present. ``check --kit gpu-kit`` does the same with the packed
    kit, installed exactly as ``run`` installs it.
``pack``
    Writes the kit folder (default ``gpu-kit/`` in the repository, ignored by git):
    the wheel's ``llama_cpp`` package as a tar archive with each shared library
    stored once (the wheel stores each three times, and again outside the package),
    the pure-Python wheels it needs that a CUDA image may lack (``diskcache``,
    ``gguf``), a manifest with the archive's checksum, and ``run.sh``. The CUDA kit
    is about 35 MiB, under the device tool's 64 MiB carry limit; the wheel is 231.
``run`` (on the GPU machine, from the repository root)
    Installs the kit into ``gpu-kit/site`` (``pip --no-index --target`` for the
    wheels, then the archive: nothing is fetched), finds the CUDA runtime libraries
    of the kit's CUDA major version there, checks that llama.cpp sees a GPU, runs
    ``benchmarks/gpu_prefill.py --smoke`` (a tiny model, seconds) and then
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
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``pipeline`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline._build import LLAMA_CPP_VERSION, cmake_args, ensure_wheel, rag_home, wheel_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
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


def _key_args(cuda: str, archs: tuple[str, ...]) -> list[str]:
    return kit_cmake_args(archs) + [f"-DRAG_KIT_CUDA={cuda}"]  # the toolchain's major version is part of the key


def cached_wheel(cuda: str, archs: tuple[str, ...] = ARCHS) -> Path:
    """The kit's wheel from the cache; a clear error where ``build`` has not made it yet."""
    cached = sorted(wheel_folder(_key_args(cuda, archs)).glob("llama_cpp_python-*.whl"))
    if not cached:
        raise SystemExit(f"no CUDA {cuda} kit wheel for sm_{', sm_'.join(archs)} in {wheel_folder(_key_args(cuda, archs))}: "
                         f"run `python devtools/gpu_kit.py build --cuda {cuda}` first")
    return cached[0]


def build(*, cuda: str, archs: tuple[str, ...] = ARCHS, python: str = sys.executable,
          sdist: str | None = None) -> Path:
    """The kit's wheel: built once per (version, CUDA major, flags), then taken from the cache."""
    args = _key_args(cuda, archs)
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
    # A fixed source folder and build folder: a build stopped half-way (it takes hours on 2 cores)
    # resumes where it stopped the next time, instead of starting over.
    work = rag_home() / "cuda" / f"cu{cuda}"
    src = work / "src" / f"llama_cpp_python-{LLAMA_CPP_VERSION}"
    if not (src / "pyproject.toml").exists():
        archive = Path(sdist) if sdist else None
        if archive is None:
            dl = work / "src"
            dl.mkdir(parents=True, exist_ok=True)
            subprocess.run([python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(dl),
                            f"llama-cpp-python=={LLAMA_CPP_VERSION}"], check=True)
            archive = dl / f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
        with tarfile.open(archive) as tar:
            tar.extractall(src.parent, filter="data")
    print(f"building llama-cpp-python {LLAMA_CPP_VERSION} for CUDA {cuda}, sm_{', sm_'.join(archs)} "
          "(one-time; hours on 2 cores; resumes if stopped)", file=sys.stderr)
    t = time.perf_counter()
    wheel = ensure_wheel(args, python=python, env=env, sdist=str(src), build_dir=str(work / "build"))
    print(f"built {wheel} in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return wheel


def _site_env(site: Path, lib_dirs: list[Path]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*map(str, lib_dirs), *filter(None, [env.get("LD_LIBRARY_PATH")])])
    return env


def _install(wheels: list[Path], site: Path, *, python: str = sys.executable, offline: bool = True) -> None:
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    *(["--no-index"] if offline else []), "--target", str(site), *map(str, wheels)], check=True)


_PROBE = """
import ctypes, json, pathlib, llama_cpp
lib = pathlib.Path(llama_cpp.__file__).parent / "lib"
ggml = ctypes.CDLL(str(lib / "libggml.so"))
ggml.ggml_backend_load_all() if hasattr(ggml, "ggml_backend_load_all") else None
ggml.ggml_backend_reg_count.restype = ctypes.c_size_t
ggml.ggml_backend_reg_get.restype = ctypes.c_void_p
ggml.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
ggml.ggml_backend_reg_name.restype = ctypes.c_char_p
ggml.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
regs = {}
for i in range(ggml.ggml_backend_reg_count()):
    reg = ggml.ggml_backend_reg_get(i)
    regs[ggml.ggml_backend_reg_name(reg).decode()] = ggml.ggml_backend_reg_dev_count(reg)
print(json.dumps(dict(version=llama_cpp.__version__, path=llama_cpp.__file__, backends=regs,
                      gpu_offload=bool(llama_cpp.llama_supports_gpu_offload()),
                      system_info=llama_cpp.llama_print_system_info().decode(errors="replace"))))
"""


def probe(site: Path, lib_dirs: list[Path], *, python: str = sys.executable) -> dict:
    """What llama.cpp installed in ``site`` reports: its backends (with their device counts), GPU offload."""
    out = subprocess.run([python, "-c", _PROBE], env=_site_env(site, lib_dirs), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"importing the kit's llama_cpp failed:\n{out.stderr.strip()}")
    info = json.loads(out.stdout.strip().splitlines()[-1])
    info["log"] = out.stderr.strip()
    return info


def check(*, cuda: str, archs: tuple[str, ...] = ARCHS, python: str = sys.executable, kit: Path | None = None) -> dict:
    """Here, with no GPU: the cached wheel (or, with ``kit``, the packed kit installed as ``run`` installs it)
    imports, and llama.cpp lists its CUDA backend."""
    source = cached_wheel(cuda, archs) if kit is None else None  # refused before any toolchain is fetched
    root = toolchain(cuda, python=python)
    site = rag_home() / "cuda" / f"cu{cuda}" / "check-site"
    if kit is not None:
        manifest = install_kit(kit, site, python=python)
        source, mib = kit / manifest["archive"], manifest["mib"]
    else:
        _install([source], site, python=python, offline=True)
        mib = round(source.stat().st_size / 2**20, 1)
        # the pure-Python wheels the kit carries too, so the import works with any interpreter here
        subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "--target", str(site), *EXTRA_WHEELS], check=True)
    info = probe(site, [root / "lib"], python=python)
    if "CUDA" not in info["backends"]:
        raise SystemExit(f"llama.cpp lists no CUDA backend: {info['backends']}")
    info["checked"], info["mib"] = str(source), mib
    return info


#: A library's name by its SONAME: ``libggml-cuda.so.0``, the name the others' NEEDED entries ask for.
_SONAME = re.compile(r"^lib[^/]*\.so\.\d+$")


def slim(wheel: Path, archive: Path) -> dict:
    """The wheel's ``llama_cpp`` package as a tar archive with each shared library stored once.

    A wheel cannot hold symlinks, so llama-cpp-python's stores every library three
    times (``libX.so``, ``libX.so.0``, ``libX.so.0.25.3``) and again outside the
    package (``lib/``, the CMake install tree, which nothing imports). The archive
    keeps the package only; in its ``lib/`` the file named by the SONAME is real
    and the other names of the same bytes are symlinks to it, which tar keeps.
    That is what brings the CUDA kit under the device tool's 64 MiB carry limit.
    """
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.infolist() if not m.is_dir() and _kept(m.filename)]
        by_digest: dict[tuple[str, str], list[zipfile.ZipInfo]] = {}
        for m in members:
            folder = m.filename.rsplit("/", 1)[0]
            by_digest.setdefault((folder, hashlib.sha256(z.read(m)).hexdigest()), []).append(m)
        links = 0
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(archive.name + ".partial")
        with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
            for (_, _), same in sorted(by_digest.items(), key=lambda kv: kv[1][0].filename):
                names = sorted(same, key=lambda m: (not _SONAME.match(m.filename.rsplit("/", 1)[-1]), len(m.filename)))
                real = names[0]
                info = tarfile.TarInfo(real.filename)
                info.size, info.mode = real.file_size, (real.external_attr >> 16) & 0o777 or 0o644
                info.mtime = int(time.mktime(real.date_time + (0, 0, -1)))
                tar.addfile(info, io.BytesIO(z.read(real)))
                for other in names[1:]:  # the same bytes under another name: a link to the real file
                    link = tarfile.TarInfo(other.filename)
                    link.type, link.linkname, link.mtime = tarfile.SYMTYPE, real.filename.rsplit("/", 1)[-1], info.mtime
                    tar.addfile(link)
                    links += 1
        partial.replace(archive)
        unpacked = sum(m.file_size for m in members)
    return dict(files=len(members) - links, links=links, unpacked_mib=round(unpacked / 2**20, 1),
                mib=round(archive.stat().st_size / 2**20, 1), sha256=_sha256(archive))


def _kept(name: str) -> bool:
    top = name.split("/", 1)[0]
    return top == "llama_cpp" or top.endswith(".dist-info")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack(*, cuda: str, archs: tuple[str, ...] = ARCHS, out: Path = ROOT / "gpu-kit",
         python: str = sys.executable, wheel: Path | None = None, extras: tuple[str, ...] = EXTRA_WHEELS) -> Path:
    """The kit folder: llama_cpp with each library once, the pure-Python wheels it needs, a manifest, ``run.sh``."""
    wheel = wheel or cached_wheel(cuda, archs)
    shutil.rmtree(out, ignore_errors=True)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    name = f"llama_cpp_python-{LLAMA_CPP_VERSION}-cuda{cuda}-sm{'_'.join(archs)}.tar.gz"
    archive = slim(wheel, out / name)
    if extras:
        subprocess.run([python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                        "--only-binary", ":all:", "-d", str(wheels), *extras], check=True)
    (out / "run.sh").write_text("#!/bin/sh\n# On the GPU machine, from the repository root: install the kit offline, "
                                "run benchmarks/gpu_prefill.py.\n"
                                'exec python3 devtools/gpu_kit.py run --kit "$(dirname "$0")" "$@"\n')
    (out / "run.sh").chmod(0o755)
    manifest = dict(llama_cpp_python=LLAMA_CPP_VERSION, cuda=cuda, archs=list(archs),
                    cmake_args=kit_cmake_args(archs), archive=name, archive_sha256=archive["sha256"],
                    wheels=sorted(p.name for p in wheels.glob("*.whl")),
                    wheel_mib=round(wheel.stat().st_size / 2**20, 1),
                    mib=round(sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20, 1),
                    needs=[f"{lib}.{cuda}" for lib in RUNTIME_LIBS] + ["an NVIDIA driver for CUDA " + cuda])
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"kit: {out} ({manifest['mib']} MiB; the wheel was {manifest['wheel_mib']} MiB): {name} "
          f"({archive['files']} files, {archive['links']} links), {', '.join(manifest['wheels']) or 'no other wheels'}",
          file=sys.stderr)
    return out


def install_kit(kit: Path, site: Path, *, python: str = sys.executable) -> dict:
    """Installs a packed kit into ``site`` with nothing fetched: its wheels with pip, then its llama_cpp archive."""
    try:
        manifest = json.loads((kit / "MANIFEST.json").read_text())
        archive = kit / manifest["archive"]
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"{kit} is not a packed kit ({exc}): run `python devtools/gpu_kit.py pack` "
                         "and copy its whole folder") from None
    if not archive.is_file():
        raise SystemExit(f"{archive} is missing: copy the whole kit folder (pack writes it)")
    if _sha256(archive) != manifest["archive_sha256"]:
        raise SystemExit(f"{archive} does not match its checksum in MANIFEST.json: copy the kit again")
    wheels = sorted((kit / "wheels").glob("*.whl"))
    if wheels:
        _install(wheels, site, python=python, offline=True)
    else:
        shutil.rmtree(site, ignore_errors=True)
        site.mkdir(parents=True)
    shutil.rmtree(site / "llama_cpp", ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(site, filter="data")  # "data" keeps links that stay inside site, refuses any other
    return manifest


def find_cuda_libs(major: str, *, python: str = sys.executable) -> list[Path]:
    """Folders holding this machine's CUDA ``major`` runtime and cuBLAS (pip's nvidia packages, /usr/local/cuda)."""
    prefix = subprocess.run([python, "-c", "import sys, site; print('\\n'.join(site.getsitepackages() + [sys.prefix]))"],
                            capture_output=True, text=True).stdout.split()
    candidates: list[Path] = []
    for base in map(Path, prefix):
        candidates += sorted(base.glob("nvidia/*/lib")) + sorted(base.glob("nvidia/*/*/lib"))
    candidates += [Path(p) for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    candidates += [Path("/usr/local/cuda/lib64"), Path("/usr/local/cuda/targets/x86_64-linux/lib"),
                   Path("/usr/lib/x86_64-linux-gnu")]
    found: list[Path] = []
    for lib in RUNTIME_LIBS:
        for d in candidates:
            if (d / f"{lib}.{major}").exists():
                if d not in found:
                    found.append(d)
                break
        else:
            raise SystemExit(f"no {lib}.{major} on this machine: the kit was built for CUDA {major} "
                             f"(build one with --cuda for the CUDA this machine has)")
    return found


def run(*, kit: Path, json_out: Path, seconds: float = 450.0, extra: list[str] | None = None,
        python: str = sys.executable) -> int:
    """On the GPU machine: install the kit offline, check llama.cpp sees the GPU, run the benchmark in time."""
    t0 = time.perf_counter()
    site = kit / "site"
    manifest = install_kit(kit, site, python=python)
    libs = find_cuda_libs(str(manifest["cuda"]), python=python)
    info = probe(site, libs, python=python)
    print(f"[kit] llama-cpp-python {info['version']}, backends {info['backends']}, GPU offload {info['gpu_offload']}, "
          f"CUDA libraries from {', '.join(map(str, libs))}", flush=True)
    if not info["gpu_offload"]:
        print(info["log"][-2000:], file=sys.stderr)
        raise SystemExit("llama.cpp sees no GPU with this kit")
    bench = str(ROOT / "benchmarks" / "gpu_prefill.py")
    # First the same path on a tiny model (seconds): a broken import or CUDA setup shows before the 30 GiB model
    # is written.
    smoke = [python, bench, "--skip-build", "--smoke", "--json", str(json_out.with_suffix(".smoke.json")),
             "--work", str(Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-prefill-smoke")]
    print("[kit] " + " ".join(smoke), flush=True)
    try:
        rc = subprocess.run(smoke, env=_site_env(site, libs), timeout=120).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    if rc != 0:
        print(f"[kit] the smoke run failed (exit {rc}): not starting the full benchmark", file=sys.stderr)
        return rc
    cmd = [python, bench, "--skip-build", "--json", str(json_out),
           "--max-seconds", str(max(60.0, seconds - 150.0 - (time.perf_counter() - t0))), *(extra or [])]
    print("[kit] " + " ".join(cmd), flush=True)
    try:
        rc = subprocess.run(cmd, env=_site_env(site, libs), timeout=max(1.0, seconds - (time.perf_counter() - t0))
                            ).returncode
    except subprocess.TimeoutExpired:
        print(f"[kit] stopped after {seconds:.0f} s", file=sys.stderr)
        return 124
    print(f"[kit] done in {time.perf_counter() - t0:.0f} s: {json_out}", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="install the CUDA toolchain from PyPI and build the wheel (cached)")
    b.add_argument("--cuda", choices=sorted(TOOLCHAINS), default="13", help="CUDA major version of the target")
    b.add_argument("--archs", default=",".join(ARCHS), help="GPU architectures (default %(default)s)")
    b.add_argument("--sdist", help="build from this llama-cpp-python source archive instead of PyPI's")
    for name, text in (("check", "import the built wheel here and check llama.cpp lists its CUDA backend"),
                       ("pack", "write the kit folder (wheel, pure-Python wheels, manifest, run.sh)")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--cuda", choices=sorted(TOOLCHAINS), default="13")
        c.add_argument("--archs", default=",".join(ARCHS))
        if name == "pack":
            c.add_argument("--out", type=Path, default=ROOT / "gpu-kit")
        else:
            c.add_argument("--kit", type=Path, help="check this packed kit folder (as `run` installs it), not the wheel")
    r = sub.add_parser("run", help="on the GPU machine: install the kit offline and run benchmarks/gpu_prefill.py")
    r.add_argument("--kit", type=Path, default=ROOT / "gpu-kit")
    r.add_argument("--json", dest="json_out", type=Path, default=Path("gpu_prefill.json"))
    r.add_argument("--seconds", type=float, default=450.0, help="the whole run's limit (default %(default)s)")
    r.add_argument("extra", nargs="*", help="more gpu_prefill.py options, after --")
    ns = ap.parse_args(argv)
    archs = tuple(getattr(ns, "archs", ",".join(ARCHS)).split(","))
    if ns.step == "build":
        print(build(cuda=ns.cuda, archs=archs, sdist=ns.sdist))
    elif ns.step == "check":
        info = check(cuda=ns.cuda, archs=archs, kit=ns.kit)
        print(json.dumps({k: v for k, v in info.items() if k != "log"}, indent=2))
        print("\n".join(line for line in info["log"].splitlines() if "cuda" in line.lower())[-2000:])
    elif ns.step == "pack":
        print(pack(cuda=ns.cuda, archs=archs, out=ns.out))
    else:
        return run(kit=ns.kit, json_out=ns.json_out, seconds=ns.seconds, extra=ns.extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
