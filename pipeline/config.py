"""Typed settings: defaults here, then a TOML file, then ``RAG_*`` environment variables, then flags.

The dataclass defaults *are* the embedded default configuration
(``configs/default.toml`` repeats them for reading, and a test keeps the two equal).
Every layer is validated the same way: an unknown section or key is an error
that names it, and a value of the wrong type is an error that names the key.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .planner.spec import KV_TYPE_IDS

ENV_PREFIX = "RAG_"
# Variables with a meaning of their own, not "section_key" overrides.
_ENV_RESERVED = {"RAG_HOME", "RAG_CONFIG", "RAG_TEST_MINILM_DIR", "RAG_LLAMA_CMAKE_ARGS",
                 "RAG_SERVE_TOKEN"}  # the token of `rag serve`: a secret, never a setting


@dataclass(frozen=True)
class ModelsConfig:
    """Which models to use: ``builtin:NAME``, a path to a ``.gguf`` file, or ``hf:owner/repo/file.gguf``."""

    embedder: str = "builtin:all-MiniLM-L6-v2"
    generator: str = "builtin:SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ChunkingConfig:
    """Chunk sizes, in tokens of the embedder's own tokenizer."""

    size: int = 256
    overlap: int = 32


@dataclass(frozen=True)
class EmbedConfig:
    """How the embedder runs. ``batch_tokens = 0`` lets the hardware decide how chunks are grouped per decode."""

    threads: int = 0
    flash_attn: bool = True
    gpu_layers: int = 0
    batch_tokens: int = 0


@dataclass(frozen=True)
class StoreConfig:
    """Where vectors and the lexical index live. An empty ``path`` means ``$RAG_HOME/store``."""

    path: str = ""
    collection: str = "default"
    wait: float = 10.0


@dataclass(frozen=True)
class RetrievalConfig:
    """Hybrid retrieval: dense (Chroma) and lexical (BM25) hits fused by reciprocal rank."""

    top_k: int = 5
    dense: bool = True
    lexical: bool = True
    candidates: int = 40
    rrf_k: int = 60


@dataclass(frozen=True)
class EngineConfig:
    """The generator in llama.cpp, configured for fast prefill.

    ``n_ctx`` above the model's trained context is clamped (with a warning) unless
    ``rope_scaling`` is set. Expert offload has llama.cpp's meaning: ``n_cpu_moe``
    layers' experts in CPU memory (the first or last ``cpu_moe_from``), ``cpu_moe``
    for all of them, and ``override_tensors`` for ``-ot``-style ``regex=BUFFER`` lists.
    With ``tuned``, the profile ``rag tune`` wrote for this model and context replaces
    the settings left at their defaults (never ones you set).
    """

    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    gpu_layers: int = -1
    threads: int = 0
    threads_batch: int = 0
    mmap: bool = True
    n_cpu_moe: int = 0
    cpu_moe: bool = False
    cpu_moe_from: str = "last"
    override_tensors: str = ""
    rope_scaling: str = ""
    rope_freq_scale: float = 0.0
    seed: int = 0
    tuned: bool = True
    parallel: int = 1  # engines (llama.cpp contexts) answering concurrent questions in one process


@dataclass(frozen=True)
class AskConfig:
    """How questions are answered: retrieval breadth, packing and sampling."""

    top_k: int = 8
    neighbours: int = 1
    mmr: bool = False
    mmr_lambda: float = 0.7
    max_tokens: int = 256
    temperature: float = 0.0
    repeat_penalty: float = 1.2
    system_prompt: str = (
        "You answer questions using only the numbered documents provided. Cite the documents you "
        "use as [1], [2]. If the documents do not contain the answer, say so.")


@dataclass(frozen=True)
class CacheConfig:
    """Prefix KV states on disk: prompts that start like an earlier one skip that part of prefill.

    An empty ``path`` means ``$RAG_HOME/cache``. Prefixes shorter than ``min_tokens``
    are not worth a file.
    """

    enabled: bool = True
    path: str = ""
    max_gb: float = 8.0
    min_tokens: int = 256


@dataclass(frozen=True)
class Config:
    """All settings. ``home`` empty means ``$RAG_HOME`` or the per-user cache directory."""

    home: str = ""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    ask: AskConfig = field(default_factory=AskConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)

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

    def validate(self) -> "Config":
        c = self.chunking
        if c.size < 16:
            raise ConfigError(f"chunking.size must be at least 16 tokens, got {c.size}")
        if not 0 <= c.overlap < c.size:
            raise ConfigError(f"chunking.overlap must be between 0 and chunking.size - 1, got {c.overlap}")
        if self.embed.threads < 0 or self.embed.batch_tokens < 0:
            raise ConfigError("embed.threads and embed.batch_tokens must be >= 0 (0 = automatic)")
        r = self.retrieval
        if r.top_k < 1:
            raise ConfigError(f"retrieval.top_k must be at least 1, got {r.top_k}")
        if not (r.dense or r.lexical):
            raise ConfigError("retrieval.dense and retrieval.lexical cannot both be off")
        if r.candidates < r.top_k:
            raise ConfigError(f"retrieval.candidates ({r.candidates}) must be >= retrieval.top_k ({r.top_k})")
        if self.store.wait < 0:
            raise ConfigError("store.wait must be >= 0 seconds")
        e = self.engine
        for key in ("type_k", "type_v"):
            if getattr(e, key) not in KV_TYPES:
                raise ConfigError(f"engine.{key} must be one of {', '.join(KV_TYPES)}, got {getattr(e, key)!r}")
        if e.n_ctx < 0 or e.n_batch < 1 or e.n_ubatch < 1:
            raise ConfigError("engine.n_ctx must be >= 0 (0 = trained context), n_batch and n_ubatch >= 1")
        if e.n_ubatch > e.n_batch:
            raise ConfigError(f"engine.n_ubatch ({e.n_ubatch}) cannot exceed engine.n_batch ({e.n_batch})")
        if e.cpu_moe_from not in ("first", "last"):
            raise ConfigError(f"engine.cpu_moe_from must be 'first' or 'last', got {e.cpu_moe_from!r}")
        if e.rope_scaling not in ("", "none", "linear", "yarn"):
            raise ConfigError(f"engine.rope_scaling must be '', 'linear' or 'yarn', got {e.rope_scaling!r}")
        if not 1 <= e.parallel <= 64:
            raise ConfigError(f"engine.parallel must be between 1 and 64 (got {e.parallel})")
        if e.n_cpu_moe < 0 or e.threads < 0 or e.threads_batch < 0:
            raise ConfigError("engine.n_cpu_moe, engine.threads and engine.threads_batch must be >= 0")
        a = self.ask
        if a.top_k < 1 or a.neighbours < 0 or a.max_tokens < 1:
            raise ConfigError("ask.top_k and ask.max_tokens must be >= 1, ask.neighbours >= 0")
        if not 0.0 <= a.mmr_lambda <= 1.0 or a.temperature < 0 or a.repeat_penalty <= 0:
            raise ConfigError("ask.mmr_lambda must be in [0, 1], ask.temperature >= 0, ask.repeat_penalty > 0")
        if self.cache.max_gb <= 0 or self.cache.min_tokens < 1:
            raise ConfigError("cache.max_gb must be > 0 and cache.min_tokens >= 1")
        return self


KV_TYPES = tuple(KV_TYPE_IDS)


def resolve_home(home: str = "") -> Path:
    """The directory holding models, caches and (by default) the store."""
    if home:
        return Path(home).expanduser()
    if os.environ.get("RAG_HOME"):
        return Path(os.environ["RAG_HOME"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rag"


def _sections() -> dict[str, type]:
    return {f.name: f.type for f in dataclasses.fields(Config) if dataclasses.is_dataclass(_resolve(f.type))}


_TYPES = {name: obj for name, obj in globals().items() if isinstance(obj, type)}


def _resolve(t: Any) -> Any:
    return _TYPES.get(t, t) if isinstance(t, str) else t


def _coerce(key: str, value: Any, typ: Any, *, from_text: bool) -> Any:
    typ = _resolve(typ)
    if typ in ("bool", bool):
        if isinstance(value, bool):
            return value
        if from_text and str(value).lower() in {"1", "true", "yes", "on"}:
            return True
        if from_text and str(value).lower() in {"0", "false", "no", "off"}:
            return False
    elif typ in ("int", int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_text:
            try:
                return int(str(value))
            except ValueError:
                pass
    elif typ in ("float", float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_text:
            try:
                return float(str(value))
            except ValueError:
                pass
    elif typ in ("str", str):
        if isinstance(value, str):
            return value
        if from_text:
            return str(value)
    else:  # pragma: no cover - every field uses one of the types above
        return value
    expected = typ if isinstance(typ, str) else typ.__name__
    raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def _apply(config: Config, values: Mapping[str, Any], *, origin: str, from_text: bool) -> Config:
    """Return ``config`` with dotted-key ``values`` applied, validating every key."""
    sections: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for dotted, value in values.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        if not key:
            top[section] = value
        else:
            sections.setdefault(section, {})[key] = value
    changes: dict[str, Any] = {}
    top_fields = {f.name: f for f in dataclasses.fields(Config)}
    for key, value in top.items():
        if key not in top_fields or key in _sections():
            raise ConfigError(f"unknown setting '{key}' in {origin}")
        changes[key] = _coerce(key, value, top_fields[key].type, from_text=from_text)
    for section, items in sections.items():
        if section not in _sections():
            raise ConfigError(f"unknown section '{section}' in {origin}")
        current = getattr(config, section)
        fields = {f.name: f for f in dataclasses.fields(current)}
        updates = {}
        for key, value in items.items():
            if key not in fields:
                raise ConfigError(f"unknown setting '{section}.{key}' in {origin}")
            updates[key] = _coerce(f"{section}.{key}", value, fields[key].type, from_text=from_text)
        changes[section] = dataclasses.replace(current, **updates)
    return dataclasses.replace(config, **changes)


def _flatten(data: Mapping[str, Any], origin: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in _sections():
                raise ConfigError(f"unknown section '{key}' in {origin}")
            for sub, subvalue in value.items():
                if isinstance(subvalue, dict):
                    raise ConfigError(f"unexpected table '{key}.{sub}' in {origin}")
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    return flat


def read_toml(path: Path) -> dict[str, Any]:
    """The dotted-key settings of one TOML file, with a clear error for a missing or malformed file."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    return _flatten(data, str(path))


def env_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """``RAG_SECTION_KEY=value`` variables as dotted keys; an unknown key in a known section is an error."""
    out: dict[str, str] = {}
    sections = _sections()
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _ENV_RESERVED:
            continue
        rest = name[len(ENV_PREFIX):].lower()
        for section in sections:
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1:]
                section_fields = {f.name for f in dataclasses.fields(_resolve(sections[section]))}
                if key not in section_fields:
                    raise ConfigError(f"unknown setting '{section}.{key}' in environment variable {name}")
                out[f"{section}.{key}"] = value
                break
    return out


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the settings: defaults, then ``path`` (or ``$RAG_CONFIG``), then the environment, then ``overrides``.

    ``overrides`` uses dotted keys (``{"store.collection": "papers"}``); ``None`` values are ignored,
    so CLI options that were not given can be passed straight through.
    """
    environ = os.environ if environ is None else environ
    config = Config()
    path = path or environ.get("RAG_CONFIG") or None
    if path:
        config = _apply(config, read_toml(Path(path)), origin=str(path), from_text=False)
    config = _apply(config, env_settings(environ), origin="the environment", from_text=True)
    if overrides:
        config = _apply(config, dict(overrides), origin="the options", from_text=False)
    return config.validate()


def to_toml(config: Config) -> str:
    """TOML text that :func:`load_config` reads back into ``config``."""
    lines: list[str] = []
    data = config.to_dict()
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"\n[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """A TOML literal for a setting's value (bool, number or string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = [
    "Config", "ModelsConfig", "ChunkingConfig", "EmbedConfig", "StoreConfig", "RetrievalConfig",
    "EngineConfig", "AskConfig", "CacheConfig",
    "load_config", "read_toml", "env_settings", "resolve_home", "to_toml",
]
