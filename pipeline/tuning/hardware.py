"""Hardware profiles: the few figures the tuner's speed and memory models need.

A :class:`HardwareProfile` holds the GPU's memory and effective speeds, the
host-to-device copy bandwidth and the host's CPU speed and memory. Built-in
profiles (:data:`PROFILES`) give defaults for common cards; ``rag tune`` can
measure the real values on a machine and save them with :func:`save_profile`
(a small TOML file, read back with :func:`load_profile`).

What the figures mean (all in SI units: bytes, bytes/s, FLOP/s):

* ``gpu_flops``: *effective* FLOP/s of llama.cpp's prefill matrix products on
  this GPU (quantized or f16 weights, large batches), not the datasheet peak.
  Attention FLOPs are charged at ``gpu_flops * attn_efficiency``.
* ``h2d_pinned`` / ``h2d_pageable``: host-to-device copy bandwidth from pinned
  memory (llama.cpp pins host buffers when mmap is off on a CUDA build) and from
  ordinary pageable memory (mmap on).
* ``gpu_mem_bw`` / ``cpu_mem_bw``: memory bandwidth, for the decode estimate.
* ``gpu_reserved``: VRAM the driver and the CUDA context take before llama.cpp
  allocates anything (not usable by the model).

The RTX 3090 figures are *calibrated* (:mod:`pipeline.tuning.gpu_fit`, which
cites its sources): the micro-batch curve (``gpu_ubatch_half`` 84 tokens, exponent
1.5) from the shape of a published llama-bench ``-ub`` sweep (Gemma 2B F16,
``pp16384``, llama.cpp PR #11583), then ``gpu_flops`` 40.4e12 and ``h2d_pinned``
31.2e9 solved so that the model reproduces the recipe's two measurements on that
card (Qwen3.6-35B-A3B Q6_K at 64K context: 564 prompt tokens/s at ``-b 512 -ub
128``, 1330 at ``-b 1024 -ub 512`` with 8 layers' experts on the CPU). The other
cards scale the 3090's efficiency (effective / datasheet dense f16 tensor FLOP/s)
to their own datasheet figures, and its curve's ``u_half`` by their number of
multiprocessors (more of them need more rows to fill): estimates, to be replaced by
measurements (``benchmarks/gpu_prefill.py`` reports the figures it implies).

The ``cpu`` profile's micro-batch curve was measured on this project's 2-core
development machine by ``rag tune --measure-hardware`` (SmolLM2-135M Q4_1, 2048-token
prefills at ``-ub`` 128, 512 and 2048: 7.8, 17.6 and 28.6 tok/s, fitted exactly by
``cpu_ubatch_half`` 2048, ``cpu_ubatch_exp`` 0.75, ``cpu_ubatch_cache`` 8192), with a
load average of 18 on its 2 cores; ``cpu_flops`` scales that fit to the 180 tok/s
FACTS.md records for the same prefill on an idle machine. Run it on yours: the
result is saved as ``$RAG_HOME/hardware.toml`` and used by later plans.

:func:`measure_cpu_flops` and :func:`measure_hardware` measure the host's figures
(``rag tune --measure-hardware``). Standard library only, but for numpy in
:func:`measure_cpu_flops`.
"""

from __future__ import annotations

import math
import os
import time
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..engine.host import detect_ram
from ..errors import ConfigError

GiB = 1024**3
GB = 1e9

#: Effective / datasheet dense f16 tensor FLOP/s, from the 3090 calibration (40.4 / 71 TFLOP/s).
#: Hopper cards get about half of it: llama.cpp's CUDA kernels do not use Hopper's wgmma path.
_EFFICIENCY = 0.57
#: The 3090's micro-batch curve (pipeline.tuning.gpu_fit), and its multiprocessor count to scale it by.
_UBATCH_HALF, _SMS_3090 = 84.0, 82
_LAYER_OVERHEAD = 50e-6


@dataclass(frozen=True)
class HardwareProfile:
    """One machine: a GPU (``vram == 0`` for none) and its host."""

    name: str
    gpu_name: str
    vram: int  # bytes of GPU memory in total
    gpu_flops: float  # effective FLOP/s for prefill matrix products
    h2d_pinned: float  # host-to-device bytes/s from pinned memory
    h2d_pageable: float  # host-to-device bytes/s from pageable memory
    cpu_flops: float  # effective FLOP/s of llama.cpp's CPU matrix products (all threads)
    ram: int  # bytes of host memory
    gpu_mem_bw: float = 900 * GB  # bytes/s
    cpu_mem_bw: float = 50 * GB  # bytes/s
    gpu_reserved: int = 300 * 1024**2  # bytes taken by driver + CUDA context
    attn_efficiency: float = 0.5  # attention FLOP/s as a fraction of gpu_flops
    # micro-batch efficiency (pipeline.tuning.speed): e(u) = 1 / (1 + (half / u) ** exp), 0 = none
    gpu_ubatch_half: float = 0.0  # tokens
    gpu_ubatch_exp: float = 1.5
    gpu_layer_overhead: float = 0.0  # seconds per layer per micro-batch (kernel launches, scheduling)
    cpu_ubatch_half: float = 0.0  # tokens
    cpu_ubatch_exp: float = 1.5
    cpu_ubatch_cache: float = 0.0  # tokens: larger micro-batches spill the caches, cost x (1 + u / cache); 0 = none
    cpu_layer_overhead: float = 0.0  # seconds per layer per micro-batch (thread barriers, scheduling)

    @property
    def has_gpu(self) -> bool:
        return self.vram > 0

    def h2d(self, *, pinned: bool) -> float:
        return self.h2d_pinned if pinned else self.h2d_pageable

    def with_ram(self, ram: int | None = None) -> HardwareProfile:
        """This profile with the host RAM of this machine (``/proc/meminfo``), or ``ram`` bytes."""
        return replace(self, ram=int(ram if ram is not None else detect_ram()))

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def to_toml(self) -> str:
        lines = ["[hardware]"]
        for key, value in self.to_dict().items():
            if isinstance(value, str):
                lines.append(f'{key} = "{_escape(value)}"')
            elif isinstance(value, float):
                lines.append(f"{key} = {value!r}")
            else:
                lines.append(f"{key} = {int(value)}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> HardwareProfile:
        known = {f.name: f for f in fields(cls)}
        unknown = set(data) - set(known)
        if unknown:
            raise ConfigError(f"Unknown hardware profile key(s): {', '.join(sorted(unknown))}.")
        base = PROFILES.get(str(data.get("name", "")), None)
        values: dict[str, object] = base.to_dict() if base else {}
        values.update(data)
        missing = [n for n in known if n not in values]
        if missing:
            raise ConfigError(f"The hardware profile lacks: {', '.join(missing)}.")
        out: dict[str, object] = {}
        for name, f in known.items():
            v = values[name]
            try:
                if f.type in ("int", int):
                    out[name] = int(v)  # type: ignore[arg-type]
                elif f.type in ("float", float):
                    out[name] = float(v)  # type: ignore[arg-type]
                else:
                    out[name] = str(v)
            except (TypeError, ValueError):
                raise ConfigError(f"Hardware profile key {name} has a bad value {v!r}.") from None
            if isinstance(out[name], (int, float)) and not (math.isfinite(out[name]) and out[name] >= 0):  # type: ignore[arg-type]
                raise ConfigError(f"Hardware profile key {name} must be a finite number >= 0, not {v!r}.")
        return cls(**out).checked()  # type: ignore[arg-type]

    def checked(self) -> HardwareProfile:
        """``self``, or a :class:`ConfigError` naming the figure a tuner would divide by zero with."""
        need = ["cpu_flops", "cpu_mem_bw", "cpu_ubatch_exp"]
        if self.has_gpu:
            need += ["gpu_flops", "h2d_pinned", "h2d_pageable", "gpu_mem_bw", "attn_efficiency", "gpu_ubatch_exp"]
        zero = [k for k in need if not getattr(self, k) > 0]
        if zero:
            what = "a GPU (vram > 0)" if self.has_gpu else "a host"
            raise ConfigError(f"The hardware profile {self.name!r} describes {what} but has no "
                              f"{', '.join(zero)} (must be > 0).")
        return self


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _gpu(name: str, gpu_name: str, vram_gib: float, peak_tflops: float, pcie_gen: int, mem_bw_gbs: float,
         sms: int, efficiency: float = _EFFICIENCY, **kw: object) -> HardwareProfile:
    pinned = {4: 25.0, 5: 50.0}[pcie_gen] * GB
    return HardwareProfile(
        name=name, gpu_name=gpu_name, vram=int(vram_gib * GiB),
        gpu_flops=peak_tflops * 1e12 * efficiency,
        h2d_pinned=pinned, h2d_pageable=pinned / 2,
        cpu_flops=1.0e12, ram=128 * GiB, gpu_mem_bw=mem_bw_gbs * GB, cpu_mem_bw=60 * GB,
        gpu_ubatch_half=_UBATCH_HALF * sms / _SMS_3090, gpu_layer_overhead=_LAYER_OVERHEAD,
        **kw,  # type: ignore[arg-type]
    )


#: Built-in profiles. ``rtx3090`` is calibrated (see the module docstring); the
#: others scale the same efficiency to datasheet figures. Host figures (CPU FLOP/s,
#: RAM, CPU memory bandwidth) are typical of the machines these cards sit in; use
#: :meth:`HardwareProfile.with_ram` or a saved profile for the real ones.
PROFILES: dict[str, HardwareProfile] = {
    "rtx3090": HardwareProfile(
        name="rtx3090", gpu_name="NVIDIA GeForce RTX 3090", vram=24 * GiB,
        gpu_flops=40.4e12, h2d_pinned=31.2 * GB, h2d_pageable=15.6 * GB,
        cpu_flops=1.0e12, ram=64 * GiB, gpu_mem_bw=936 * GB, cpu_mem_bw=50 * GB,
        gpu_ubatch_half=_UBATCH_HALF, gpu_ubatch_exp=1.5, gpu_layer_overhead=_LAYER_OVERHEAD,
    ),
    "rtx4090": _gpu("rtx4090", "NVIDIA GeForce RTX 4090", 24, 165.2, 4, 1008, 128),
    "a100-40gb": _gpu("a100-40gb", "NVIDIA A100-SXM4-40GB", 40, 312, 4, 1555, 108),
    "a100-80gb": _gpu("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 312, 4, 2039, 108),
    "h100": _gpu("h100", "NVIDIA H100 80GB HBM3", 80, 989, 5, 3350, 132, efficiency=0.3, attn_efficiency=0.4),
    "h200": _gpu("h200", "NVIDIA H200", 143771 / 1024, 989, 5, 4800, 132, efficiency=0.3, attn_efficiency=0.4),
    "cpu": HardwareProfile(
        name="cpu", gpu_name="", vram=0, gpu_flops=0.0, h2d_pinned=0.0, h2d_pageable=0.0,
        cpu_flops=127e9, ram=32 * GiB, gpu_mem_bw=0.0, cpu_mem_bw=40 * GB, gpu_reserved=0,
        cpu_ubatch_half=2048.0, cpu_ubatch_exp=0.75, cpu_ubatch_cache=8192.0,
    ),
}


def get_profile(name: str) -> HardwareProfile:
    """A built-in profile by name (``rtx3090``, ``rtx4090``, ``a100-40gb``, ``a100-80gb``, ``h100``, ``h200``, ``cpu``)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(f"Unknown hardware profile {name!r}; built in: {', '.join(PROFILES)}.") from None


def load_profile(path: str | os.PathLike[str]) -> HardwareProfile:
    """Read a profile TOML (a ``[hardware]`` table; keys missing there come from the built-in profile of that ``name``)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"Cannot read the hardware profile {path}: {exc}") from None
    table = data.get("hardware", data)
    if not isinstance(table, dict):
        raise ConfigError(f"The hardware profile {path} has no [hardware] table.")
    return HardwareProfile.from_dict(table)


def save_profile(profile: HardwareProfile, path: str | os.PathLike[str]) -> Path:
    """Write ``profile`` as TOML to ``path`` (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(profile.to_toml(), encoding="utf-8")
    os.replace(tmp, path)
    return path


def measure_cpu_flops(*, seconds: float = 0.5, n: int = 512) -> float:
    """FLOP/s of float32 ``n x n`` matrix products in numpy (its BLAS, all its threads), over about ``seconds``.

    A quick stand-in for ``cpu_flops``: llama.cpp's own quantized CPU kernels are
    usually within a small factor of it; ``rag tune`` also reports the figure its
    prefill measurements imply.
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS threads start, caches fill
    reps = 0
    t0 = time.perf_counter()
    elapsed = 0.0
    while reps < 2 or elapsed < seconds:
        a @ b
        reps += 1
        elapsed = time.perf_counter() - t0
    return 2.0 * n**3 * reps / elapsed


def measure_hardware(base: HardwareProfile, *, seconds: float = 0.5) -> HardwareProfile:
    """``base`` with this machine's measured CPU FLOP/s and its RAM (``/proc/meminfo``); GPU figures kept.

    Save the result with :func:`save_profile` so later plans use it.
    """
    return replace(base, cpu_flops=measure_cpu_flops(seconds=seconds), ram=detect_ram())


__all__ = ["GB", "GiB", "HardwareProfile", "PROFILES", "get_profile", "load_profile",
           "measure_cpu_flops", "measure_hardware", "save_profile"]
