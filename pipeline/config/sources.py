"""Where settings come from: TOML files, ``RAG_SECTION_KEY`` environment variables and overrides, each
turned into dotted keys (``"store.collection"``) and laid over a settings object; and back to TOML.

Every layer is read the same way: an unknown section or key is an error that names it
and where it came from, and a value of the wrong type is an error that names the key.
Nothing here knows the settings themselves: each function reads the sections and their
fields from the settings class it is given (:class:`~pipeline.config.Config`), so the
dataclasses stay the one description of what can be set.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import ConfigError

ENV_PREFIX = "RAG_"
#: Variables with a meaning of their own, not "section_key" overrides.
RESERVED_ENV = frozenset({
    "RAG_HOME", "RAG_CONFIG", "RAG_TEST_MINILM_DIR", "RAG_LLAMA_CMAKE_ARGS",
    "RAG_STORE_TOKEN",  # the Chroma server's token: read by pipeline.store.vectors, never a setting
    "RAG_SERVE_TOKEN",  # the token of `rag serve`: a secret, never a setting
})
RESERVED_ENV_PREFIXES = ("RAG_TEST_",)  # the test suite's own knobs


def tables(settings: type) -> dict[str, type]:
    """The ``[table]`` names of a settings class (the TOML tables of a settings file) and their dataclasses,
    in declaration order."""
    defaults = settings()
    return {f.name: type(getattr(defaults, f.name)) for f in dataclasses.fields(settings)
            if dataclasses.is_dataclass(getattr(defaults, f.name))}


def coerce(key: str, value: Any, typ: Any, *, from_text: bool) -> Any:
    """``value`` as a setting of type ``typ`` (bool, int, float, str, a tuple of str); text (``from_text``)
    is parsed, a list from comma-separated text."""
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
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif from_text:
            try:
                number = float(str(value))
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):  # quoted as given: "1e400" overflows to inf, which it does not say
                given = str(value).strip() if from_text or isinstance(value, TomlFloat) else repr(value)
                raise ConfigError(f"{key} must be a finite number, got {given}")
            return number
    elif typ in ("str", str):
        if isinstance(value, str):
            return value
        if from_text:
            return str(value)
    elif typ == "tuple[str, ...]":
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if from_text:
            return tuple(part.strip() for part in str(value).split(",") if part.strip())
        raise ConfigError(f"{key}: expected a list of strings, got {value!r}")
    else:  # pragma: no cover - every field uses one of the types above
        return value
    expected = typ if isinstance(typ, str) else typ.__name__
    raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def apply(settings: Any, values: Mapping[str, Any], *, origin: str, from_text: bool) -> Any:
    """``settings`` (a dataclass of sections) with dotted-key ``values`` applied, every key checked;
    ``origin`` names where the values came from in messages. None values are left out."""
    by_section: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for dotted, value in values.items():
        if value is None:
            continue
        section, _, key = dotted.partition(".")
        if not key:
            top[section] = value
        else:
            by_section.setdefault(section, {})[key] = value
    known = tables(type(settings))
    changes: dict[str, Any] = {}
    top_fields = {f.name: f for f in dataclasses.fields(settings)}
    for key, value in top.items():
        if key not in top_fields or key in known:
            raise ConfigError(f"unknown setting '{key}' in {origin}")
        changes[key] = coerce(key, value, top_fields[key].type, from_text=from_text)
    for section, items in by_section.items():
        if section not in known:
            raise ConfigError(f"unknown section '{section}' in {origin}")
        current = getattr(settings, section)
        fields = {f.name: f for f in dataclasses.fields(current)}
        updates = {}
        for key, value in items.items():
            if key not in fields:
                raise ConfigError(f"unknown setting '{section}.{key}' in {origin}")
            updates[key] = coerce(f"{section}.{key}", value, fields[key].type, from_text=from_text)
        changes[section] = dataclasses.replace(current, **updates)
    return dataclasses.replace(settings, **changes)


class TomlFloat(float):
    """A TOML float that remembers how the file wrote it (``1e400``, not the ``inf`` it parses to), for messages."""

    text: str

    def __new__(cls, text: str) -> "TomlFloat":
        number = super().__new__(cls, text.replace("_", ""))
        number.text = text
        return number

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return self.text


def flatten(data: Mapping[str, Any], origin: str, *, settings: type) -> dict[str, Any]:
    """A TOML document's tables as dotted keys; a table that is not a section is an error."""
    known = tables(settings)
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            if key not in known:
                raise ConfigError(f"unknown section '{key}' in {origin}")
            for sub, subvalue in value.items():
                if isinstance(subvalue, dict):
                    raise ConfigError(f"unexpected table '{key}.{sub}' in {origin}")
                flat[f"{key}.{sub}"] = subvalue
        else:
            flat[key] = value
    return flat


#: The largest settings file read (a settings file is a few KiB; ``/dev/zero`` never ends).
MAX_TOML_BYTES = 1 << 20


def read_toml(path: Path, *, settings: type) -> dict[str, Any]:
    """The dotted-key settings of one TOML file, with a clear error for a missing or malformed file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TOML_BYTES + 1)
        if len(raw) > MAX_TOML_BYTES:
            raise ConfigError(f"config file {path} is larger than {MAX_TOML_BYTES // 1024} KiB: not a settings file")
        data = tomllib.loads(raw.decode("utf-8"), parse_float=TomlFloat)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); TOML files are UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    return flatten(data, str(path), settings=settings)


def env_names(settings: type) -> dict[str, str]:
    """Every ``RAG_SECTION_KEY`` variable that sets something, mapped to its dotted setting."""
    return {f"{ENV_PREFIX}{section}_{f.name}".upper(): f"{section}.{f.name}"
            for section, typ in tables(settings).items() for f in dataclasses.fields(typ)}


def env_settings(environ: Mapping[str, str], *, settings: type, warn: Callable[[str], None] | None = None
                 ) -> dict[str, str]:
    """``RAG_SECTION_KEY=value`` variables as dotted keys.

    An unknown key in a known section is an error; a ``RAG_*`` variable that names no
    section is reported to ``warn`` (it may belong to another program), with the likely
    setting when one is close.
    """
    out: dict[str, str] = {}
    known = tables(settings)
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
            continue
        rest = name[len(ENV_PREFIX):].lower()
        for section, typ in known.items():
            if rest.startswith(section + "_"):
                key = rest[len(section) + 1:]
                if key not in {f.name for f in dataclasses.fields(typ)}:
                    raise ConfigError(f"unknown setting '{section}.{key}' in environment variable {name}")
                out[f"{section}.{key}"] = value
                break
        else:
            if warn is not None:
                warn(_unknown_env_message(name, settings))
    return out


def _unknown_env_message(name: str, settings: type) -> str:
    names = env_names(settings)
    close = difflib.get_close_matches(name.upper(), [*names, *sorted(RESERVED_ENV)], n=1, cutoff=0.75)
    hint = ""
    if close:
        hint = f" (did you mean {close[0]}" + (f", setting {names[close[0]]}" if close[0] in names else "") + "?)"
    return f"environment variable {name} matches no setting and is ignored{hint}"


def to_toml(settings: Any) -> str:
    """TOML text that reads back into ``settings`` (top-level keys first, then one table per section)."""
    lines: list[str] = []
    data = dataclasses.asdict(settings)
    for key, value in data.items():
        if not isinstance(value, dict):
            lines.append(f"{key} = {toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"\n[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    """A TOML literal for a setting's value (bool, number, string or a list of them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = ["ENV_PREFIX", "RESERVED_ENV", "RESERVED_ENV_PREFIXES", "apply", "coerce", "env_names", "env_settings",
           "flatten", "read_toml", "tables", "to_toml", "toml_value"]
