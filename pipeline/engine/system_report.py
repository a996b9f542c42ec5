"""What a bug report needs: versions, this machine, the llama.cpp build, the models and the prefix cache.

``rag status`` prints it after the collection; ``rag status --json`` carries it as
``system``. Nothing is loaded or created to make it: llama.cpp reports its build without
a model, model files are found without fetching, and a prefix cache that does not exist
yet is reported empty rather than created.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from typing import Any

from ..config import Config
from .build_info import BuildInfo, build_info

#: The engine settings that most often explain a speed or memory report.
ENGINE_KEYS = ("n_ctx", "n_batch", "n_ubatch", "flash_attn", "type_k", "type_v", "gpu_layers", "threads",
               "n_cpu_moe", "cpu_moe", "parallel", "n_seq_max")
#: The prefix cache's figures a report shows (of :meth:`PrefixCache.stats`).
CACHE_KEYS = ("entries", "bytes", "max_bytes", "tokens", "hits", "misses", "tokens_reused", "saves",
              "evictions", "failures")


@dataclass(frozen=True)
class SystemReport:
    """The report: ``rag`` and Python versions, the host, the llama.cpp build, models, engine settings, cache."""

    rag: str
    python: str
    platform: str
    cores: int
    memory_bytes: int | None
    build: BuildInfo
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The report as the lines ``rag status`` prints."""
        mem = f", {self.memory_bytes / 2**30:.1f} GiB" if self.memory_bytes else ""
        out = [f"rag {self.rag}, llama-cpp-python {self.build.llama_cpp_python}, Python {self.python}, "
               f"{self.platform}", f"host:         {self.cores} usable cores{mem}"]
        build = self.build.describe().splitlines() or ["(no system info)"]
        out += [f"llama.cpp:    {build[0]}", *(f"              {line}" for line in build[1:])]
        gpus = [d["description"] or d["name"] for d in self.build.devices if d["name"] != "CPU"]
        out.append(f"GPU offload:  {'yes: ' + ', '.join(gpus) if gpus else 'yes' if self.build.gpu_offload else 'no'}")
        for role, m in self.models.items():
            if not m["ready"]:
                where = f"not ready: {m.get('reason', '')}"
            elif m.get("server"):
                where = "an OpenAI-compatible server"
            else:
                where = f"{m['path']} ({m['bytes'] / 2**20:,.1f} MiB)"
            out += [f"{role + ':':13} {m['ref']}", f"              {where}"]
        e = self.engine
        out.append(f"engine:       n_ctx {e['n_ctx']:,}, -b {e['n_batch']} -ub {e['n_ubatch']}, flash attention "
                   f"{'on' if e['flash_attn'] else 'off'}, KV {e['type_k']}/{e['type_v']}, "
                   f"threads {e['threads'] or 'all'}, parallel {e['parallel']}")
        c = self.cache
        if not c["enabled"]:
            out.append("prefix cache: off (cache.enabled = false)")
        elif "unavailable" in c:
            out.append(f"prefix cache: unavailable: {c['unavailable']}")
        else:
            out += [f"prefix cache: {c['directory']}",
                    f"              {c['entries']:,} states, {c['bytes'] / 2**20:,.1f} MiB of "
                    f"{c['max_bytes'] / 2**30:,.1f} GiB; {c['hits']:,} hits, {c['misses']:,} misses, "
                    f"{c['tokens_reused']:,} tokens reused"]
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"rag": self.rag, "python": self.python, "platform": self.platform, "cores": self.cores,
                "memory_bytes": self.memory_bytes, "llama_cpp": self.build.to_dict(), "models": self.models,
                "engine": self.engine, "cache": self.cache}


def rag_version() -> str:
    """This package's version."""
    from .. import __version__

    return __version__


def llama_cpp_python_version() -> str:
    """The installed llama-cpp-python's version, from its package metadata (llama.cpp is not loaded)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:
        return "not installed"


def system_report(config: Config) -> SystemReport:
    """The report for these settings (see the module's docstring for what it never does)."""
    from .host import detect_ram, usable_cpus
    from ..errors import ConfigError
    from ..models import describe

    try:
        memory: int | None = detect_ram()
    except ConfigError:
        memory = None
    home = config.home_path
    return SystemReport(
        rag=rag_version(), python=sys.version.split()[0], platform=platform.platform(), cores=usable_cpus(),
        memory_bytes=memory, build=_build(),
        models={role: describe(getattr(config.models, role), home=home) for role in ("generator", "embedder")},
        engine={key: getattr(config.engine, key) for key in ENGINE_KEYS},
        cache=cache_summary(config))


def _build() -> BuildInfo:
    """The llama.cpp build, or what went wrong loading it (a report is most needed when it fails)."""
    try:
        return build_info()
    except Exception as exc:  # an import or library load failure is what the report must show
        return BuildInfo(llama_cpp_python=llama_cpp_python_version(),
                         system_info=f"llama.cpp could not be loaded: {type(exc).__name__}: {exc}")


def cache_summary(config: Config) -> dict[str, Any]:
    """The prefix cache's size and hit counts; an absent cache directory is reported empty, not created."""
    from .cache.prefix_cache import PrefixCache
    from .cache.index import INDEX_NAME

    directory = config.cache_path
    out: dict[str, Any] = {"enabled": config.cache.enabled, "directory": str(directory)}
    if not config.cache.enabled:
        return out
    max_bytes = int(config.cache.max_gb * 2**30)
    if not (directory / INDEX_NAME).exists():
        from .cache.capacity import cap

        return {**out, **{key: 0 for key in CACHE_KEYS}, "max_bytes": cap(directory, 0, max_bytes=max_bytes)}
    cache = PrefixCache(directory, max_bytes=max_bytes)
    try:
        if cache.unavailable:
            return {**out, "unavailable": cache.unavailable}
        stats = cache.stats()
        notes = cache.take_notes()
    finally:
        cache.close()
    out.update({key: stats.get(key, 0) for key in CACHE_KEYS})
    if notes:
        out["notes"] = notes
    return out


__all__ = ["SystemReport", "cache_summary", "llama_cpp_python_version", "rag_version", "system_report"]
