"""The tuner's front end: what ``rag plan``, ``rag tune`` and the hardware profiles ask of it, from the
settings.

:meth:`Pipeline.plan <pipeline.api.Pipeline.plan>`, :meth:`~pipeline.api.Pipeline.tune` and
:meth:`~pipeline.api.Pipeline.hardware` land here: the model to read (a GGUF, the configured
generator, or published shapes), the hardware profile (a built-in name, a TOML file, or the one
``rag tune --measure-hardware`` saved), the budgets given on the command line, checked; then
:mod:`.choice`, :mod:`.tune` and :mod:`pipeline.config.tuned` do the work.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable

from .. import models
from ..config import Config
from ..errors import ConfigError
from . import hardware as hw_mod

Log = Callable[[str], None]


def hardware(config: Config, profile: str | Path | None = None) -> hw_mod.HardwareProfile:
    """A hardware profile: a built-in name or a TOML file; by default the one ``rag tune
    --measure-hardware`` saved in the home, else the CPU profile with this machine's RAM."""
    saved = config.home_path / "hardware.toml"
    if profile is None:
        return hw_mod.load_profile(saved) if saved.exists() else hw_mod.get_profile("cpu").with_ram()
    if Path(str(profile)).suffix == ".toml":
        return hw_mod.load_profile(profile)
    return hw_mod.get_profile(str(profile))


def choose_settings(config: Config, model: str | Path | None = None, *, builtin_spec: str | None = None,
                    quant: str = "Q6_K", hardware_profile: str | Path | None = None, vram_gb: float | None = None,
                    ram_gb: float | None = None, n_ctx: int | None = None, kv: str | None = None,
                    n_batch: int | None = None, n_ubatch: int | None = None, compare: bool = False,
                    log: Log | None = None) -> dict:
    """:meth:`Pipeline.plan <pipeline.api.Pipeline.plan>`: the fastest estimated plan that fits, llama.cpp's
    fit beside it, and with ``compare`` the recipe and its baseline side by side."""
    from . import choice
    from .spec import ModelSpec

    if builtin_spec:
        if builtin_spec.lower().replace(".", "") not in ("qwen36-35b-a3b", "qwen3635ba3b"):
            raise ConfigError(f"unknown model spec {builtin_spec!r} (known: qwen3.6-35b-a3b)")
        spec = ModelSpec.qwen36_35b_a3b(quant=quant)
    else:
        ref = str(model) if model else config.models.generator
        spec = ModelSpec.from_gguf(models.resolve(ref, home=config.home_path, what="model", log=log))
    hw = _budgeted(hardware(config, hardware_profile), vram_gb=vram_gb, ram_gb=ram_gb)
    n_ctx = n_ctx or config.engine.n_ctx or spec.n_ctx_train
    kv_types = ("f16", "q8_0", "q4_0") if kv == "auto" else (kv or config.engine.type_k)
    best = choice.fastest(spec, hw, n_ctx=n_ctx, kv_types=kv_types, n_batch=n_batch, n_ubatch=n_ubatch)
    fit = choice.fit_like(spec, hw, n_ctx=n_ctx, kv=best.settings.type_k)
    rows = choice.compare(spec, hw, n_ctx=n_ctx) if compare else None
    return {"plan": best, "fit": fit, "hardware": hw, "compare": rows}


def _budgeted(hw: hw_mod.HardwareProfile, *, vram_gb: float | None, ram_gb: float | None
              ) -> hw_mod.HardwareProfile:
    """``hw`` with the memory budgets given (``--vram``, ``--ram``, in GiB) in place of its own."""
    for name, value in (("--vram", vram_gb), ("--ram", ram_gb)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"{name} must be a positive number of GiB, got {value:g}")
    if vram_gb is not None:
        if not hw.has_gpu:
            raise ConfigError(f"--vram {vram_gb:g} is a GPU budget, but the hardware profile {hw.name!r} has no "
                              "GPU: name one with --gpu (rtx3090, h100, ...), or drop --vram for a CPU plan")
        hw = dataclasses.replace(hw, vram=int(vram_gb * 2**30))
    if ram_gb is not None:
        hw = dataclasses.replace(hw, ram=int(ram_gb * 2**30))
    return hw


def tune(config: Config, *, max_seconds: float = 120.0, n_tokens: int | None = None, measure_hardware: bool = False,
         progress=None, log: Log | None = None):
    """:meth:`Pipeline.tune <pipeline.api.Pipeline.tune>`: candidate settings measured on this machine, the
    fastest saved as the configured generator's profile. Returns ``(TuneResult, profile path)``."""
    from ..config import tuned as profiles
    from . import tune as tune_mod

    path = models.resolve(config.models.generator, home=config.home_path, what="generator", log=log)
    hw = hardware(config)
    result = tune_mod.tune(path, engine_settings=config.engine, hardware=hw, n_ctx=config.engine.n_ctx,
                           max_seconds=max_seconds, n_tokens=n_tokens, progress=progress,
                           measure_hardware=measure_hardware)
    target = profiles.write_profile(
        result.profile_text(), profiles.profile_path(config.home_path, models.file_identity(path), result.n_ctx))
    if measure_hardware and result.hardware is not None:
        hw_mod.save_profile(result.hardware, config.home_path / "hardware.toml")
    return result, target


__all__ = ["choose_settings", "hardware", "tune"]
