"""What a pipeline owns: the runtime builds each resource once, on first use, and closes what it built (never
what it was given); the one local-or-remote switch; the Protocols of the store and the job store, each with
every member in both of its implementations. No model loads."""

from __future__ import annotations

import inspect

import pytest
from support.fakes import EchoGenerator, HashEmbedder

from pipeline import models
from pipeline.config import load_config
from pipeline.runtime import Runtime
from pipeline.store.catalog import Catalog
from pipeline.store.catalog_pg import PostgresCatalog
from pipeline.store.catalog_sqlite import SQLiteCatalog
from pipeline.summarize.jobstore import JobStore, SQLiteJobStore
from pipeline.summarize.jobstore_pg import PostgresJobStore


class Closing(EchoGenerator):
    closed = 0

    def close(self) -> None:
        type(self).closed += 1


def test_nothing_is_built_before_it_is_used(tmp_store):
    rt = Runtime(load_config())
    assert not any(rt.has(name) for name in ("embedder", "engine", "pool", "prefix_cache", "pack_history"))
    assert rt.config.store_path == tmp_store and rt.prefix_cache is not None and rt.has("prefix_cache")
    rt.close()
    assert not rt.has("prefix_cache")


def test_the_runtime_closes_what_it_built_and_never_what_it_was_given(tmp_store):
    given = Closing()
    rt = Runtime(load_config(), embedder=HashEmbedder(), generator=given)
    assert rt.given("engine") and rt.engine is given and rt.pool.size == 1  # a given generator: one engine
    assert rt.stops is rt.stops and rt.layout() is rt.layout() and rt.layout("other") is not rt.layout()
    history = rt.pack_history
    rt.close()
    assert Closing.closed == 0 and not rt.has("engine") and not rt.given("engine")
    assert history._db is None  # the pack history it made is closed


def test_models_is_the_one_local_or_remote_switch(tmp_store):
    assert models.is_server("openai:http://127.0.0.1:9/v1#m") and models.is_server("  openai:http://h/v1")
    assert not models.is_server("builtin:SmolLM2-135M-Instruct") and not models.is_server("/models/x.gguf")
    rt = Runtime(load_config(overrides={"models.generator": "openai:http://127.0.0.1:9/v1#m", "engine.parallel": 4}))
    try:
        assert rt.pool.size == 1  # a server runs its own slots: one client, however parallel the engine
        assert models.pull({"generator": rt.config.models.generator}, home=rt.config.home_path) == {
            "generator": "openai:http://127.0.0.1:9/v1#m  (a server: nothing to pull)"}
    finally:
        rt.close()


@pytest.mark.parametrize("protocol, implementations", [
    (Catalog, (SQLiteCatalog, PostgresCatalog)),
    (JobStore, (SQLiteJobStore, PostgresJobStore)),
])
def test_each_implementation_has_every_member_of_its_protocol(protocol, implementations):
    members = {name: value for name, value in vars(protocol).items()
               if callable(value) and (not name.startswith("_") or name in ("__enter__", "__exit__"))}
    assert members
    for cls in implementations:
        for name, declared in members.items():
            assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
            want = [p.name for p in inspect.signature(declared).parameters.values()]
            got = [p.name for p in inspect.signature(getattr(cls, name)).parameters.values()]
            assert got == want, f"{cls.__name__}.{name}{got} is not the protocol's {want}"
