"""Boundary states in host memory (``cache.ram_states`` / ``cache.ram_gb``): a model that cannot cut its memory
(the generated hybrid, Mamba) restores a later question's prefix from RAM instead of the disk, bounded and
least recently used first; answers stay token for token the same."""

from __future__ import annotations

import threading

import pytest

from pipeline.config import EngineConfig
from pipeline.engine.cache.ram import RamStates
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.local import Engine
from pipeline.records import PromptShape

SETTINGS = EngineConfig(n_ctx=2048, n_batch=256, n_ubatch=256, threads=2)
DOC = "document: " + "the quick brown fox jumps over the lazy dog. " * 12


class FakeModel:
    """What the store needs of a model: its sequence's state as bytes, and a place to put one back."""

    def __init__(self, size: int = 100):
        self.data = bytearray(b"x" * size)
        self.loaded: bytearray | None = None

    def state_data(self, seq: int = 0) -> bytearray:
        return bytearray(self.data)

    def set_state_data(self, data: bytearray, *, seq: int = 0) -> bool:
        self.loaded = data
        return True


def test_longest_prefix_at_a_cut_in_its_namespace():
    ram = RamStates(max_states=8, max_bytes=10_000)
    model = FakeModel()
    tokens = list(range(100))
    for n in (10, 40, 70):
        assert ram.save("ns", tokens[:n], model) is not None
    assert ram.save("other", tokens[:90], model) is not None
    assert ram.lookup("ns", tokens).n_tokens == 70
    assert ram.lookup("ns", tokens, max_tokens=69).n_tokens == 40
    assert ram.lookup("ns", tokens, lengths={10, 40}).n_tokens == 40
    assert ram.lookup("ns", tokens, min_tokens=71) is None
    assert ram.lookup("ns", tokens[:5] + [-1] + tokens[6:]) is None  # a different token early on: no prefix
    assert ram.lookup("missing", tokens) is None
    again = ram.save("ns", tokens[:40], model)  # the same state again: the entry held, not a copy
    assert again.n_tokens == 40 and len(ram) == 4
    entry = ram.lookup("ns", tokens)
    assert ram.load(entry, model) and model.loaded == model.data


def test_bounded_by_count_and_bytes_least_recently_used_first():
    model = FakeModel(size=100)
    ram = RamStates(max_states=2, max_bytes=10_000)
    a, b, c = ([i] * 10 for i in (1, 2, 3))
    ram.save("ns", a, model)
    ram.save("ns", b, model)
    assert ram.lookup("ns", a + [0]) is not None  # a is now the most recently used
    ram.save("ns", c, model)
    assert ram.lookup("ns", b + [0]) is None and ram.lookup("ns", a + [0]) and ram.lookup("ns", c + [0])
    small = RamStates(max_states=10, max_bytes=250)  # room for two states of 100 bytes
    for t in (a, b, c):
        small.save("ns", t, model)
    assert len(small) == 2 and small.bytes == 200 and small.lookup("ns", a + [0]) is None
    assert RamStates(max_states=10, max_bytes=50).save("ns", a, model) is None  # larger than the whole budget
    off = RamStates(max_states=0)
    assert not off.enabled and off.save("ns", a, model) is None


def test_safe_to_share_between_threads():
    ram = RamStates(max_states=3, max_bytes=10_000)
    errors = []

    def work(k: int) -> None:
        try:
            for i in range(200):
                tokens = [k, i % 7] * 5
                ram.save("ns", tokens, FakeModel())
                entry = ram.lookup("ns", tokens + [1])
                if entry is not None:
                    ram.load(entry, FakeModel())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and len(ram) <= 3


# --------------------------------------------------------------------------- real models


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from devtools.synthetic import write_model

    folder = tmp_path_factory.mktemp("ram")
    return {arch: write_model(arch, folder / f"{arch}.gguf") for arch in ("qwen35moe", "mamba", "qwen3moe")}


def _ask(engine: Engine, question: str) -> tuple[str, object]:
    prefix = engine.tokenize(DOC)
    gen = engine.generate(PromptShape.of(prefix + engine.tokenize(f"question: {question}"), prefix_len=len(prefix)), max_tokens=8)
    return gen.read(), gen.stats


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen35moe", "mamba"])
def test_a_later_question_restores_from_ram_with_the_same_answer(models, arch, tmp_path):
    ram = RamStates(max_states=4, max_bytes=2**30)
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    engines = [Engine(models[arch], SETTINGS, cache=cache, cache_min_tokens=16, ram_states=ram) for _ in range(2)]
    plain = Engine(models[arch], SETTINGS)
    try:
        first, st1 = _ask(engines[0], "what jumps?")
        assert st1.cache == "miss" and len(ram) == 1  # saved on disk and kept in RAM
        other, st2 = _ask(engines[0], "who is lazy?")  # same engine: its memory cannot be cut back
        assert st2.cache == "ram" and st2.cached_tokens == len(engines[0].tokenize(DOC))
        assert other == _ask(plain, "who is lazy?")[0]
        again, st3 = _ask(engines[1], "what jumps?")  # another engine of the pool shares the states
        assert st3.cache == "ram" and again == first
    finally:
        for e in (*engines, plain):
            e.close()
    fresh = Engine(models[arch], SETTINGS, cache=cache, cache_min_tokens=16, ram_states=RamStates())
    try:  # a new process: the disk first, then RAM for the next question
        assert _ask(fresh, "what jumps?")[1].cache == "disk"
        assert _ask(fresh, "who is lazy?")[1].cache == "ram"
    finally:
        fresh.close()


@pytest.mark.slow
def test_ram_only_without_the_disk_and_nothing_kept_for_a_model_that_cuts(models):
    ram = RamStates()
    hybrid = Engine(models["qwen35moe"], SETTINGS, cache=None, cache_min_tokens=16, ram_states=ram)
    try:  # cache.enabled = false: still no second prefill of the documents in this process
        assert _ask(hybrid, "what jumps?")[1].cache == "miss"  # looked up in RAM: nothing yet
        assert _ask(hybrid, "who is lazy?")[1].cache == "ram"
    finally:
        hybrid.close()
    kept = len(ram)
    moe = Engine(models["qwen3moe"], SETTINGS, cache=None, cache_min_tokens=16, ram_states=ram)
    try:  # attention only: the KV cache is cut in place, no copy is made
        _ask(moe, "what jumps?")
        assert _ask(moe, "who is lazy?")[1].cache == "memory" and len(ram) == kept
    finally:
        moe.close()


@pytest.mark.slow
def test_a_longer_state_on_disk_wins_over_a_shorter_one_in_ram(models, tmp_path):
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    ram = RamStates()
    writer = Engine(models["qwen35moe"], SETTINGS, cache=cache, cache_min_tokens=16)  # disk only
    reader = Engine(models["qwen35moe"], SETTINGS, cache=cache, cache_min_tokens=16, ram_states=ram)
    try:
        head = writer.tokenize(DOC)
        more = writer.tokenize("appendix: the dog sleeps all day. " * 6)
        tail = writer.tokenize("question: who sleeps?")
        reader.generate(PromptShape.of(head + tail, prefix_len=len(head)), max_tokens=2).read()  # RAM holds the short prefix
        writer.generate(PromptShape.of(head + more + tail, prefix_len=len(head + more), boundaries=[len(head)]), max_tokens=2).read()  # the disk holds the long one too
        gen = reader.generate(PromptShape.of(head + more + tail, prefix_len=len(head + more), boundaries=[len(head)]), max_tokens=2)
        gen.read()
        assert gen.stats.cache == "disk" and gen.stats.cached_tokens == len(head + more)
    finally:
        writer.close()
        reader.close()


@pytest.mark.slow
def test_the_settings_and_the_pipeline(models, tmp_path, monkeypatch):
    from support.fakes import HashEmbedder
    from pipeline import Pipeline
    from pipeline.config import load_config
    from pipeline.errors import ConfigError

    monkeypatch.setenv("RAG_CACHE_RAM_STATES", "2")
    config = load_config(overrides={"cache.ram_gb": 0.5})
    assert config.cache.ram_states == 2 and config.cache.ram_gb == 0.5
    with pytest.raises(ConfigError, match="ram_states"):
        load_config(overrides={"cache.ram_states": -1})
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(DOC)
    overrides = {"models.generator": str(models["qwen35moe"]), "engine.n_ctx": 2048, "ask.max_tokens": 4,
                 "cache.min_tokens": 16, "store.path": str(tmp_path / "store"), "cache.path": str(tmp_path / "c")}
    with Pipeline.from_config(overrides=overrides, embedder=HashEmbedder()) as rag:
        rag.ingest([docs])
        assert rag.ask("what jumps?").stats.cache == "miss"
        assert rag.ask("who is lazy?").stats.cache == "ram"  # a long-lived process: no disk round trip
        assert rag.ram_states.max_states == 2
        ram = rag.ram_states
        assert len(ram) > 0
    assert len(ram) == 0  # closing the pipeline lets go of the states


@pytest.mark.slow
def test_a_state_evicted_between_lookup_and_load_falls_back_to_the_disk(models, tmp_path, monkeypatch):
    ram = RamStates()
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    engine = Engine(models["qwen35moe"], SETTINGS, cache=cache, cache_min_tokens=16, ram_states=ram)
    plain = Engine(models["qwen35moe"], SETTINGS)
    try:
        _ask(engine, "what jumps?")
        stale = ram.lookup(engine.namespace, engine.tokenize(DOC) + [0])
        assert stale is not None
        ram.clear()  # another engine of the pool evicted it after this one looked it up
        monkeypatch.setattr(ram, "lookup", lambda *a, **k: stale)
        text, stats = _ask(engine, "who is lazy?")
        assert stats.cache == "disk" and stats.cached_tokens == len(engine.tokenize(DOC))
        assert text == _ask(plain, "who is lazy?")[0]
    finally:
        engine.close()
        plain.close()
