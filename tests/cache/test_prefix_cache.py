"""The prefix cache wired into ``rag ask``: across processes, warm-up, invalidation, damage."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.records import PromptShape

FAST = {"engine__n_ctx": 1024, "ask__max_tokens": 16, "cache__min_tokens": 16}


@pytest.fixture
def cached(make_pipeline, corpus, tmp_path):
    """Pipeline factory sharing one cache directory in tmp_path (a fresh Pipeline = a fresh process)."""
    make_pipeline().ingest([corpus])

    def factory(**kw):
        return make_pipeline(cache__path=str(tmp_path / "cache"), **{**FAST, **kw})

    return factory


@pytest.mark.slow
def test_second_question_on_a_document_restores_the_prefix_and_answers_the_same(cached, corpus):
    doc = corpus / "guide.md"
    first = cached().ask("What does --n-cpu-moe do?", doc=doc)
    assert first.stats.cache == "miss" and first.stats.cached_tokens == 0
    second = cached().ask("What does --n-cpu-moe do?", doc=doc)  # a new pipeline: nothing in memory
    assert second.stats.cache == "disk"
    assert second.stats.cached_tokens > 0 and second.stats.cache_load_seconds > 0
    assert second.stats.prefill_tokens == second.stats.prompt_tokens - second.stats.cached_tokens
    uncached = cached(cache__enabled=False).ask("What does --n-cpu-moe do?", doc=doc)
    assert second.text == first.text == uncached.text  # greedy decoding: lossless
    other = cached().ask("Why do larger micro-batches help?", doc=doc)
    assert other.stats.cache == "disk" and other.stats.cached_tokens == second.stats.cached_tokens


@pytest.mark.slow
def test_warm_makes_the_first_question_fast(cached, corpus):
    rag = cached()
    report = rag.warm()  # the collection fits the context: one prefix, all of it
    assert report["mode"] == "whole" and [p["outcome"] for p in report["prefixes"]] == ["saved"]
    assert report["prefixes"][0]["documents"] == 4
    assert [p["outcome"] for p in cached().warm()["prefixes"]] == ["cached"]
    answer = cached().ask("What colour is a banana?")
    assert answer.stats.cache == "disk" and answer.stats.cached_tokens == report["prefixes"][0]["tokens"]
    assert answer.stats.reuse_lost == ""


@pytest.mark.slow
def test_a_changed_document_never_uses_old_states(cached, make_pipeline, corpus):
    doc = corpus / "notes.txt"
    cached().ask("Which client runs Chroma as a server?", doc=doc)
    doc.write_text("Chroma can also run in a container; HttpClient talks to it over HTTP.\n")
    make_pipeline().ingest([corpus])
    answer = cached().ask("Which client runs Chroma as a server?", doc=doc)
    assert answer.stats.cache == "miss" and answer.stats.cached_tokens == 0


@pytest.mark.slow
def test_damaged_state_file_is_ignored_deleted_and_the_answer_still_right(cached, corpus, tmp_path):
    doc = corpus / "guide.md"
    good = cached().ask("What reduces memory traffic?", doc=doc)
    states = list((tmp_path / "cache").glob("*.state"))
    assert len(states) == 1
    data = bytearray(states[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    states[0].write_bytes(bytes(data))
    again = cached().ask("What reduces memory traffic?", doc=doc)
    assert again.text == good.text and again.stats.cache == "miss"
    assert any("ignored and deleted" in n for n in again.notes)
    assert not states[0].exists()


@pytest.mark.slow
def test_cli_warm_stats_and_clear(store_dir, corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_CACHE_PATH", str(tmp_path / "cache"))
    monkeypatch.setenv("RAG_CACHE_MIN_TOKENS", "16")
    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")
    runner = CliRunner()
    out = runner.invoke(cli, ["ingest", str(corpus), "--warm"])
    assert out.exit_code == 0, out.output
    assert "warmed the whole collection (4 documents)" in out.output and ": saved" in out.output
    stats = json.loads(runner.invoke(cli, ["cache", "stats", "--json"]).output)
    # the whole prefix, and states at the document boundaries before it (3 here, all over min_tokens)
    n = stats["entries"]
    assert 2 <= n <= 4 and stats["bytes"] > 0 and stats["bytes_per_token"] > 0
    assert f"deleted {n} cached prefix states" in runner.invoke(cli, ["cache", "clear", "--yes"]).output
    assert json.loads(runner.invoke(cli, ["cache", "stats", "--json"]).output)["entries"] == 0


@pytest.mark.slow
def test_sliding_window_model_restores_exactly(model_home, tmp_path):
    """Gemma 3 has interleaved sliding-window layers (window 512): a prefix longer than the window,
    restored from disk or kept in memory, gives the same greedy answer as a plain run."""
    from pipeline.engine.cache.prefix_cache import PrefixCache
    from pipeline.config import EngineConfig
    from pipeline.engine.local import Engine
    from pipeline.models import resolve

    path = resolve("builtin:gemma-3-270m", home=model_home)
    settings = EngineConfig(n_ctx=1024, n_batch=512, n_ubatch=512, threads=2)
    text = " ".join(f"Record {i}: the reactor {i % 7} reported pressure {i * 3} kPa." for i in range(60))

    def ask(question, *, cache=None, engine=None):
        engine = engine or Engine(path, settings, cache=cache, cache_min_tokens=16)
        prefix = engine.bos + engine.tokenize(f"Document:\n{text}\n\n")
        tokens = prefix + engine.tokenize(f"Question: {question}\nAnswer:")
        gen = engine.generate(PromptShape.of(tokens, prefix_len=len(prefix)), max_tokens=12)
        return engine, gen.read(), gen.stats

    assert len(ask("x")[0].tokenize(text)) > 512  # longer than the sliding window
    plain_engine, plain, _ = ask("What pressure did record 5 report?")
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**31)
    _, first, st1 = ask("What pressure did record 5 report?", cache=cache)
    _, again, st2 = ask("What pressure did record 5 report?", cache=cache)
    assert st1.cache == "miss" and st2.cache == "disk" and st2.cached_tokens > 512
    assert plain == first == again
    _, other, st3 = ask("Which reactor reported 30 kPa?", engine=plain_engine)  # in memory, same engine
    assert st3.cache == "memory" and other == ask("Which reactor reported 30 kPa?")[1]


#: Models whose memory cannot be cut at an earlier position: recurrent (Mamba) and hybrid (Qwen3.5/3.6's
#: Gated DeltaNet + attention), both generated.
UNCUTTABLE = ["mamba", "qwen35moe"]


@pytest.mark.parametrize("arch", UNCUTTABLE)
def test_recurrent_model_restores_its_state_at_the_prefix_boundary(tmp_path, arch):
    """A Mamba or hybrid model keeps a per-sequence state that cannot be cut at an earlier position: the
    prefix state saved at the boundary, restored from disk, gives the same greedy answer as a plain run,
    and a second question in the same process restores it rather than prefilling again."""
    from pipeline.engine.cache.prefix_cache import PrefixCache
    from pipeline.config import EngineConfig
    from pipeline.engine.local import Engine
    from devtools.synthetic import write_model

    path = write_model(arch, tmp_path / f"{arch}.gguf")
    settings = EngineConfig(n_ctx=2048, n_batch=256, n_ubatch=256, threads=1)

    def ask(question, *, cache=None, engine=None):
        engine = engine or Engine(path, settings, cache=cache, cache_min_tokens=16)
        prefix = engine.tokenize("document: " + "the quick brown fox jumps over the lazy dog. " * 12)
        tokens = prefix + engine.tokenize(f"question: {question}")
        gen = engine.generate(PromptShape.of(tokens, prefix_len=len(prefix)), max_tokens=10)
        return engine, gen.read(), gen.stats

    _, plain, _ = ask("what jumps?")
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    engine, first, st1 = ask("what jumps?", cache=cache)
    assert not engine.memory_kind.composes and st1.cache == "miss"
    _, again, st2 = ask("what jumps?", cache=cache)
    assert st2.cache == "disk" and st2.cached_tokens > 0 and plain == first == again
    _, other, st3 = ask("who is lazy?", engine=engine)  # same process: the old question cannot be cut off
    assert st3.cache == "disk" and other == ask("who is lazy?")[1]
    assert any("cannot be cut" in n for n in st3.notes)


@pytest.mark.parametrize("arch", UNCUTTABLE)
def test_recurrent_model_resumes_a_pack_from_a_state_saved_at_an_inner_boundary(tmp_path, arch):
    """A pack [A, B, C] saves states at the A and A+B boundaries; a later pack [A, B, D] on a Mamba or
    hybrid model (no cutting back) restores exactly the A+B state and prefills only D and the question,
    and answers as a plain run does."""
    from pipeline.engine.cache.prefix_cache import PrefixCache
    from pipeline.config import EngineConfig
    from pipeline.engine.local import Engine
    from devtools.synthetic import write_model

    path = write_model(arch, tmp_path / f"{arch}.gguf")
    settings = EngineConfig(n_ctx=2048, n_batch=256, n_ubatch=256, threads=1)
    docs = {k: f"document {k}: " + f"the {k} quick brown fox jumps over the lazy dog. " * 6 for k in "ABCD"}

    def ask(keys, *, cache=None):
        engine = Engine(path, settings, cache=cache, cache_min_tokens=16)
        tokens, bounds = [], []
        for k in keys:
            tokens += engine.tokenize(docs[k])
            bounds.append(len(tokens))
        prefix_len = len(tokens)
        tokens += engine.tokenize("question: what jumps?")
        gen = engine.generate(PromptShape.of(tokens, prefix_len=prefix_len, boundaries=bounds[:-1]), max_tokens=8)
        return gen.read(), gen.stats, bounds

    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    _, first, bounds_abc = ask("ABC", cache=cache)
    assert first.cache == "miss" and first.states_saved == 3  # A, A+B and the whole prefix
    plain, _, bounds_abd = ask("ABD")
    text, st, _ = ask("ABD", cache=cache)
    assert bounds_abd[1] == bounds_abc[1]
    assert st.cache == "disk" and st.cached_tokens == bounds_abc[1]  # exactly the A+B boundary
    assert text == plain
