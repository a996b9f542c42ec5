"""Tuned profiles: the engine settings ``rag tune`` measured fastest for one model file at one context.

A profile is a small TOML file, ``$RAG_HOME/tuned/<model identity>-<n_ctx>.toml``
(:func:`profile_path`; the identity is :func:`pipeline.models.file_identity`), holding
an ``[engine]`` table of :data:`PROFILE_KEYS` and the measurements as comments. The
tuner writes it (:func:`write_profile`); answering reads it (:func:`tuned_engine`) and
lays it over the settings the user left at their defaults, without importing the tuner.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from . import PLANNED_KEYS, Config, EngineConfig, apply_settings, read_toml

#: The ``[engine]`` keys a tuned profile sets (the context is part of the profile's name instead).
PROFILE_KEYS = tuple(k for k in PLANNED_KEYS if k != "n_ctx")


def profile_path(home: Path, model_identity: str, n_ctx: int) -> Path:
    """Where the tuned profile of a model (by :func:`pipeline.models.file_identity`) at ``n_ctx`` lives."""
    return Path(home) / "tuned" / f"{model_identity}-{n_ctx}.toml"


def write_profile(text: str, path: str | os.PathLike[str]) -> Path:
    """Write a profile's TOML ``text`` to ``path``, atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_profile(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The dotted ``engine.*`` settings of a tuned profile (``{"engine.n_ubatch": 512, ...}``)."""
    from ..errors import ConfigError

    values = read_toml(Path(path))
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    for key in values:
        section, _, name = key.partition(".")
        if section != "engine" or name not in known:
            raise ConfigError(f"{path}: a tuned profile holds only [engine] settings, not {key!r}")
    apply_settings(Config(), values, origin=str(path))  # the types, key by key
    return values


def tuned_settings(home: Path, model_path: str | os.PathLike[str], n_ctx: int) -> dict[str, Any]:
    """The tuned profile's settings for this model file at ``n_ctx``, or ``{}`` where it was not tuned."""
    from ..models import file_identity

    path = profile_path(home, file_identity(Path(model_path)), n_ctx)
    return read_profile(path) if path.is_file() else {}


def tuned_engine(settings: EngineConfig, home: Path, model_path: str | os.PathLike[str], n_ctx: int
                 ) -> tuple[EngineConfig, dict[str, Any], str]:
    """``settings`` with the tuned profile laid over the keys left at their defaults: (settings, the changes,
    a note).

    Unchanged where ``settings.tuned`` is off or the model was not tuned at ``n_ctx``. A profile
    whose keys do not go with the ones you set (a quantised V cache from the profile with flash
    attention you turned off, say) is not used, and the note says why.
    """
    from ..errors import ConfigError

    if not settings.tuned:
        return settings, {}, ""
    default = EngineConfig()
    changes = {}
    for key, value in tuned_settings(home, model_path, n_ctx).items():
        name = key.split(".", 1)[1]
        if getattr(settings, name) == getattr(default, name):
            changes[name] = value
    if not changes:
        return settings, {}, ""
    merged = dataclasses.replace(settings, **changes)
    if merged.n_ubatch > merged.n_batch:  # your n_batch, the profile's n_ubatch: llama.cpp would clamp it too
        merged = dataclasses.replace(merged, n_ubatch=merged.n_batch)
        changes.pop("n_ubatch", None)
    try:
        return merged.validate(), changes, ""
    except ConfigError as exc:
        return settings, {}, f"the tuned profile does not go with the settings you set, not used: {exc}"


__all__ = ["PROFILE_KEYS", "profile_path", "read_profile", "tuned_engine", "tuned_settings", "write_profile"]
