"""What the installed llama.cpp was built with: its version, instruction sets or GPU architectures, devices.

Read from llama.cpp itself (``llama_print_system_info`` and the backend device list,
through :mod:`._llama`) without loading a model, so ``rag status`` can say in a bug
report which build ran: a CPU build lists the instruction sets it was compiled for
(``AVX2``, ``AVX512``...), a CUDA build its architectures (``ARCHS = 860,900``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BuildInfo:
    """The llama.cpp build: the binding's version, llama.cpp's own system info, parsed, and its devices."""

    llama_cpp_python: str
    system_info: str
    #: backend -> its flags, as llama.cpp prints them (``{"CPU": {"AVX2": "1", ...}, "CUDA": {"ARCHS": "860,900"}}``)
    backends: dict[str, dict[str, str]] = field(default_factory=dict)
    gpu_offload: bool = False
    devices: tuple[dict[str, str], ...] = ()

    @property
    def cpu_features(self) -> list[str]:
        """The CPU features the build has on (``SSE3``, ``AVX2``, ``AVX512``, ``OPENMP``...)."""
        return [k for k, v in self.backends.get("CPU", {}).items() if v == "1"]

    @property
    def gpu_backends(self) -> dict[str, dict[str, str]]:
        """Every backend but the CPU's (``CUDA``, ``Metal``, ``Vulkan``...) with its flags."""
        return {name: flags for name, flags in self.backends.items() if name != "CPU"}

    def describe(self) -> str:
        """One line per backend: ``CPU: AVX, AVX2, ...`` and, on a GPU build, ``CUDA: ARCHS = 860,900, ...``."""
        lines = []
        for name, flags in self.backends.items():
            shown = [k if v == "1" else f"{k} = {v}" for k, v in flags.items() if v != "0"]
            lines.append(f"{name}: {', '.join(shown) or '(no flags)'}")
        return "\n".join(lines) or self.system_info.strip()

    def to_dict(self) -> dict:
        return {"llama_cpp_python": self.llama_cpp_python, "system_info": self.system_info,
                "backends": self.backends, "cpu_features": self.cpu_features, "gpu_offload": self.gpu_offload,
                "devices": [dict(d) for d in self.devices]}


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """``"CUDA : ARCHS = 860 | NO_VMM = 1 | CPU : SSE3 = 1 | AVX2 = 1 |"`` -> backend -> flag -> value.

    llama.cpp prints each backend as ``NAME : KEY = VALUE`` followed by ``KEY = VALUE`` items,
    all separated by ``|``; an item with no ``=`` keeps an empty value.
    """
    backends: dict[str, dict[str, str]] = {}
    current = ""
    for item in text.split("|"):
        item = item.strip()
        if not item:
            continue
        name, colon, rest = item.partition(" : ")
        if colon:
            current, item = name.strip(), rest.strip()
            backends.setdefault(current, {})
        key, _, value = item.partition("=")
        backends.setdefault(current, {})[key.strip()] = value.strip()
    return backends


def build_info() -> BuildInfo:
    """The installed llama.cpp's build, from llama.cpp itself; loads llama-cpp-python, never a model."""
    from . import _llama

    text = _llama.system_info()
    return BuildInfo(llama_cpp_python=_llama.binding_version(), system_info=text.strip(),
                     backends=parse_system_info(text), gpu_offload=_llama.supports_gpu_offload(),
                     devices=tuple(_llama.devices()))


__all__ = ["BuildInfo", "build_info", "parse_system_info"]
