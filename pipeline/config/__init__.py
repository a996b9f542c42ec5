"""Typed settings: defaults here, then a TOML file, then ``RAG_*`` environment variables, then flags.

The dataclass defaults *are* the embedded default configuration
(``configs/default.toml`` repeats them for reading, and a test keeps the two equal).
Each ``[table]`` is a frozen dataclass that checks its own values (:mod:`.settings`,
:mod:`.engine`); :meth:`Config.validate` runs the checks every setting of a type has,
then each section's, once per settings object. How the layers are read (an unknown
section or key is an error that names it and where it came from) is :mod:`.sources`;
tuned engine profiles laid over these settings are :mod:`pipeline.config.tuned`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import ConfigError
from . import sources
from .engine import KV_TYPES, MAX_THREADS, PLANNED_KEYS, UNQUANTISED_KV, EngineConfig
from .settings import (ASK_MODES, AskConfig, CacheConfig, ChunkingConfig, EmbedConfig, IngestConfig, ModelsConfig,
                       RemoteConfig, RetrievalConfig, ServeConfig, StoreConfig, SummarizeConfig)
from .sources import ENV_PREFIX, toml_value


class ConfigWarning(UserWarning):
    """A setting that is probably a mistake but not an error, e.g. a ``RAG_*`` variable that matches nothing."""


@dataclass(frozen=True)
class Config:
    """All settings. ``home`` empty means ``$RAG_HOME`` or the per-user cache directory."""

    home: str = ""
    """Directory for models, caches and the default store; empty = $RAG_HOME or ~/.cache/rag."""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    """Which embedder and generator to run."""
    ingest: IngestConfig = field(default_factory=IngestConfig)
    """What rag ingest reads."""
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    """How documents are cut into chunks and sections."""
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    """How the embedder runs."""
    store: StoreConfig = field(default_factory=StoreConfig)
    """Where vectors, catalog and full-text index live."""
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    """Hybrid search: dense, lexical, fusion, reranking."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The generator in llama.cpp, configured for fast prefill."""
    ask: AskConfig = field(default_factory=AskConfig)
    """How questions are answered: packing, sources, sampling."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """Prefix KV states on disk."""
    summarize: SummarizeConfig = field(default_factory=SummarizeConfig)
    """Batch summaries."""
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """OpenAI-compatible servers for generation and embeddings."""
    serve: ServeConfig = field(default_factory=ServeConfig)
    """What rag serve may read and whom it answers."""

    @property
    def home_path(self) -> Path:
        return resolve_home(self.home)

    @property
    def cache_path(self) -> Path:
        return Path(self.cache.path).expanduser() if self.cache.path else self.home_path / "cache"

    @property
    def store_path(self) -> Path:
        if self.store.path:
            return Path(self.store.path).expanduser()
        return self.home_path / "store"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolved(self) -> "Config":
        """These settings with ``home``, ``store.path`` and ``cache.path`` as the paths that will be used."""
        return dataclasses.replace(
            self, home=str(self.home_path.absolute()),
            store=dataclasses.replace(self.store, path=str(self.store_path.absolute())),
            cache=dataclasses.replace(self.cache, path=str(self.cache_path.absolute())))

    def validate(self) -> "Config":
        """Refuse settings that cannot work, naming the setting; return ``self``. The checks run once per
        settings object (a changed copy is checked again)."""
        if not self.__dict__.get("_valid"):
            _check_values(self)
            for name in sources.tables(Config):
                getattr(self, name).validate()
            object.__setattr__(self, "_valid", True)
        return self


def _check_values(config: Config) -> None:
    """Checks that hold for every setting of a type: floats are finite, integers fit the 32 bits
    llama.cpp's parameters have, strings hold no NUL.

    A NaN passes every range check (each comparison is false) and an infinity passes the
    lower bounds; either breaks the arithmetic later (``int(nan)``, a sampler at ``inf``).
    """
    settings = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            settings += [(f"{f.name}.{g.name}", getattr(value, g.name)) for g in dataclasses.fields(value)]
        else:
            settings.append((f.name, value))
    for key, v in settings:
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{key} must be a finite number, got {v!r}")
        if isinstance(v, int) and not -2**31 <= v < 2**31:
            raise ConfigError(f"{key} is out of range: {v} (at most {2**31 - 1:,})")
        if any(isinstance(t, str) and "\0" in t for t in (v if isinstance(v, tuple) else (v,))):
            raise ConfigError(f"{key} contains a NUL character")


def resolve_home(home: str = "") -> Path:
    """The directory holding models, caches and (by default) the store."""
    if home:
        return Path(home).expanduser()
    if os.environ.get("RAG_HOME"):
        return Path(os.environ["RAG_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag"


def apply_settings(config: "Config", values: Mapping[str, Any], *, origin: str, from_text: bool = False
                   ) -> "Config":
    """``config`` with dotted-key ``values`` laid over it, every key checked (see :func:`.sources.apply`)."""
    return sources.apply(config, values, origin=origin, from_text=from_text)


def read_toml(path: Path) -> dict[str, Any]:
    """The dotted-key settings of one TOML file, with a clear error for a missing or malformed file."""
    return sources.read_toml(path, settings=Config)


def env_names() -> dict[str, str]:
    """Every ``RAG_SECTION_KEY`` variable that sets something, mapped to its dotted setting."""
    return sources.env_names(Config)


def env_settings(environ: Mapping[str, str], *, warn: Callable[[str], None] | None = None) -> dict[str, str]:
    """``RAG_SECTION_KEY=value`` variables as dotted keys (see :func:`.sources.env_settings`)."""
    return sources.env_settings(environ, settings=Config, warn=warn)


def _warn(message: str) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=4)


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Config:
    """Build the settings: defaults, then ``path`` (or ``$RAG_CONFIG``), then the environment, then ``overrides``.

    ``overrides`` uses dotted keys (``{"store.collection": "papers"}``); ``None`` values are ignored,
    so CLI options that were not given can be passed straight through. Warnings (a ``RAG_*``
    variable that matches no setting) go to ``warn``, by default as a :class:`ConfigWarning`.
    """
    environ = os.environ if environ is None else environ
    config = Config()
    path = path or environ.get("RAG_CONFIG") or None
    if path:
        config = apply_settings(config, read_toml(Path(path)), origin=str(path))
    config = apply_settings(config, env_settings(environ, warn=warn or _warn), origin="the environment",
                            from_text=True)
    if overrides:
        config = apply_settings(config, dict(overrides), origin="the options")
    return config.validate()


def to_toml(config: Config) -> str:
    """TOML text that :func:`load_config` reads back into ``config``."""
    return sources.to_toml(config)


__all__ = [
    "Config", "ModelsConfig", "IngestConfig", "ChunkingConfig", "EmbedConfig", "StoreConfig", "RetrievalConfig",
    "EngineConfig", "AskConfig", "CacheConfig", "SummarizeConfig", "RemoteConfig", "ServeConfig", "ConfigWarning",
    "MAX_THREADS", "PLANNED_KEYS",
    "UNQUANTISED_KV", "ASK_MODES", "ENV_PREFIX", "KV_TYPES", "apply_settings", "load_config", "read_toml",
    "env_settings", "env_names", "resolve_home", "to_toml", "toml_value",
]
