"""This machine as the engine sees it: the cores it may use and the memory it has.

Standard library only. The engine sizes its threads and checks its KV cache
against these; the tuner's hardware profiles take their RAM from here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import ConfigError


def usable_cpus() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _meminfo(key: str, text: str | None = None) -> int:
    if text is None:
        try:
            text = Path("/proc/meminfo").read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read /proc/meminfo: {exc.strerror or exc}") from None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == key:
            parts = rest.split()
            scale = 1024 if len(parts) > 1 and parts[1].lower() == "kb" else 1
            return int(parts[0]) * scale
    raise ConfigError(f"/proc/meminfo has no {key}.")


def detect_ram(*, available: bool = False, meminfo: str | None = None) -> int:
    """Bytes of host RAM from ``/proc/meminfo``: ``MemTotal``, or ``MemAvailable`` with ``available=True``.

    Raises :class:`~pipeline.errors.ConfigError` where the figure is unknown (no ``/proc``).
    """
    return _meminfo("MemAvailable" if available else "MemTotal", meminfo)


__all__ = ["detect_ram", "usable_cpus"]
