"""Every numeric setting has a range: a value outside it is a one-line error naming that one key and
the value it got, before anything uses it (a huge cache budget or timeout used to pass validation and
then overflow deep inside a command)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.config import load_config
from pipeline.config.ranges import RANGES
from pipeline.config.reference import settings
from pipeline.errors import ConfigError

NUMERIC = [s for s in settings() if s.type in ("int", "float")]


def _past(key: str, *, above: bool) -> int | float:
    """A value just outside ``key``'s range (above or below it), of the setting's own type."""
    r = RANGES[key]
    kind = next(s.type for s in NUMERIC if s.key == key)
    if kind == "int":
        return int(r.high) + 1 if above else (int(r.low) if r.open_low else int(r.low) - 1)
    return r.high * 2 + 1 if above else (r.low if r.open_low else r.low - 0.5)


def _error(key: str, value) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, overrides={key: value})
    return str(info.value)


def test_every_numeric_setting_has_a_range_with_an_upper_bound():
    assert {s.key for s in NUMERIC} == set(RANGES)
    for key, r in RANGES.items():
        assert r.low < r.high < 2**31, key
        default = next(s.default for s in NUMERIC if s.key == key)
        assert r.holds(default), f"{key}'s default {default} is outside its own range"


@pytest.mark.parametrize("above", [True, False], ids=["above", "below"])
@pytest.mark.parametrize("key", [s.key for s in NUMERIC])
def test_a_value_outside_the_range_names_the_key_and_the_value(key, above):
    value = _past(key, above=above)
    message = _error(key, value)
    assert message.startswith(f"{key} "), message
    assert repr(value) in message, message


@pytest.mark.parametrize("key,value", [
    ("cache.max_gb", 1.7e299), ("cache.ram_gb", 1.7e299), ("remote.connect_timeout", 1e10),
    ("remote.read_timeout", 1e300), ("ingest.max_file_mb", 1e12), ("store.wait", 1e300),
])
def test_huge_finite_numbers_are_refused(key, value):
    assert _error(key, value) == f"{key} must be {RANGES[key].describe()}, got {value!r}"


@pytest.mark.parametrize("variable,value,says", [
    ("RAG_ASK_COMPOSE_RECOMPUTE", "-1", "ask.compose_recompute must be between 0 and 1,048,576 tokens, got -1"),
    ("RAG_CACHE_RAM_GB", "-0.5", "cache.ram_gb must be between 0 and 65,536 GB, got -0.5"),
    ("RAG_CACHE_MAX_GB", "-1", "cache.max_gb must be between 0 and 1,048,576 GB (0 = a share of the disk), got -1.0"),
    ("RAG_ASK_REPEAT_PENALTY", "0", "ask.repeat_penalty must be > 0 and at most 100 (1 = off), got 0.0"),
    ("RAG_RETRIEVAL_HYDE_TOKENS", "0", "retrieval.hyde_tokens must be between 1 and 65,536 tokens, got 0"),
])
def test_each_message_names_one_key_and_the_value_it_got(variable, value, says):
    with pytest.raises(ConfigError) as info:
        load_config(environ={variable: value})
    assert str(info.value) == says


def test_relations_between_settings_name_the_key_and_the_value():
    with pytest.raises(ConfigError, match=r"^chunking\.overlap must be between 0 and chunking\.size - 1 \(99\), "
                                          r"got 100$"):
        load_config(environ={"RAG_CHUNKING_SIZE": "100", "RAG_CHUNKING_OVERLAP": "100"})
    with pytest.raises(ConfigError, match=r"^engine\.n_ubatch cannot exceed engine\.n_batch \(512\), got 4096$"):
        load_config(environ={"RAG_ENGINE_N_UBATCH": "4096", "RAG_ENGINE_N_BATCH": "512"})
    with pytest.raises(ConfigError, match=r"^retrieval\.candidates must be at least retrieval\.top_k \(5\), got 3$"):
        load_config(environ={"RAG_RETRIEVAL_CANDIDATES": "3"})


@pytest.mark.parametrize("env,args", [
    ({"RAG_CACHE_MAX_GB": "1.7e299"}, ["cache", "stats"]),
    ({"RAG_CACHE_RAM_GB": "1.7e299"}, ["cache", "stats"]),
    ({"RAG_REMOTE_CONNECT_TIMEOUT": "1e10", "RAG_MODELS_GENERATOR": "openai:http://127.0.0.1:9/v1#m"},
     ["ask", "anything"]),
], ids=["max_gb", "ram_gb", "connect_timeout"])
def test_commands_given_huge_values_end_in_one_line_and_exit_2(tmp_store, env, args):
    ran = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    key = {"RAG_CACHE_MAX_GB": "cache.max_gb", "RAG_CACHE_RAM_GB": "cache.ram_gb",
           "RAG_REMOTE_CONNECT_TIMEOUT": "remote.connect_timeout"}[next(iter(env))]
    assert ran.stderr.strip().splitlines() == [f"Error: {key} must be {RANGES[key].describe()}, "
                                               f"got {float(next(iter(env.values())))!r}"]
