"""``rag ask`` end to end on the default models: retrieval, packing, streaming, sources, stats."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import InputError, ModelError, StoreError

pytestmark = pytest.mark.slow  # the real default models (see conftest.py)

FAST = {"engine__n_ctx": 1024, "ask__max_tokens": 12, "ask__top_k": 3}


@pytest.mark.parametrize("mode", ["auto", "passages"])
def test_ask_answers_with_numbered_sources_and_stats(make_pipeline, ingested, mode):
    rag = make_pipeline(**FAST)
    answer = rag.ask("Which fruit is rich in potassium?", mode=mode)
    assert answer.text
    numbers = [s["n"] for s in answer.sources]
    if mode == "passages":
        assert answer.sources and numbers == list(range(1, len(answer.sources) + 1))
    else:  # the packed documents whose chunks matched best, numbered as in the prompt
        assert answer.sources and numbers == sorted(set(numbers)) and answer.stats.mode == "whole"
    pdf = [s for s in answer.sources if s["source"].endswith("manual.pdf")]
    assert pdf and 2 in pdf[0]["pages"]
    st = answer.stats
    assert st.prompt_tokens <= 1024 - 12
    assert st.prefill_tokens_per_second > 0 and st.ttft_seconds > 0 and st.decode_tokens <= 12


def test_streaming_yields_the_same_text(make_pipeline, ingested):
    rag = make_pipeline(**FAST)
    stream = rag.ask_stream("What does --n-cpu-moe do?")
    pieces = list(stream)
    assert len(pieces) >= 1 and "".join(pieces).strip() == stream.answer.text
    again = rag.ask("What does --n-cpu-moe do?")
    assert again.text == stream.answer.text  # greedy: deterministic
    assert again.stats.cached_tokens > 0  # the same prompt's prefix stayed in the KV cache


def test_ask_whole_document(make_pipeline, ingested):
    rag = make_pipeline(**FAST)
    answer = rag.ask("What is on page three?", doc=ingested / "manual.pdf", mode="passages")
    assert {s["source"] for s in answer.sources} == {str((ingested / "manual.pdf").resolve())}
    assert answer.sources[0]["pages"] == [1, 2, 3]  # all of it, in order
    auto = rag.ask("What is on page three?", doc=ingested / "manual.pdf")
    assert auto.stats.mode == "whole" and [s["source"] for s in auto.stats.sections] == [answer.sources[0]["source"]]
    assert 3 in auto.sources[0]["pages"]  # the page whose chunk matched
    with pytest.raises(InputError, match="not in collection"):
        rag.ask("x", doc=ingested / "image.png")


def test_ask_whole_document_too_long_falls_back_to_its_best_passages(make_pipeline, tmp_path):
    doc = tmp_path / "long.md"
    doc.write_text("\n\n".join(f"Paragraph {i} is about topic {i} and the zebra count is {i * 3}."
                               for i in range(400)))
    make_pipeline().ingest([doc])
    rag = make_pipeline(engine__n_ctx=512, ask__max_tokens=8, ask__top_k=2)
    answer = rag.ask("What is the zebra count of paragraph 7?", doc=doc)
    assert any("does not fit the context" in n for n in answer.notes)
    assert answer.stats.prompt_tokens <= 512 - 8


def test_clear_errors(make_pipeline, corpus, tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        make_pipeline(**FAST).ask("anything")
    make_pipeline().ingest([corpus])
    with pytest.raises(ModelError, match="generator file not found"):
        make_pipeline(models__generator=str(tmp_path / "nope.gguf")).ask("anything")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("hello")
    with pytest.raises(ModelError, match="not a GGUF"):
        make_pipeline(models__generator=str(bogus)).ask("anything")
    with pytest.raises(InputError, match="empty"):
        make_pipeline(**FAST).ask("   ")


def test_cli_ask_streams_then_lists_sources(store_dir, ingested, monkeypatch):
    monkeypatch.setenv("RAG_ENGINE_N_CTX", "1024")
    monkeypatch.setenv("RAG_ASK_MAX_TOKENS", "8")
    runner = CliRunner()
    result = runner.invoke(cli, ["ask", "Where do tomatoes grow best?", "--stats"])
    assert result.exit_code == 0, result.output
    assert "Sources:" in result.output and "[1] " in result.output
    assert "prefill" in result.output and "TTFT" in result.output
    assert "retrieval: embed query" in result.output and "| rerank " in result.output
    data = json.loads(runner.invoke(cli, ["ask", "Where do tomatoes grow best?", "--json"]).output)
    assert set(data) >= {"text", "sources", "stats"}
    assert set(data["retrieval_seconds"]) == {"embed_query", "dense", "lexical", "fuse", "rerank"}
    assert data["stats"]["prompt_tokens"] > 0 and data["sources"][0]["n"] >= 1
    assert data["stats"]["mode"] == "whole" and len(data["stats"]["sections"]) == 4
    assert data["stats"]["cached_tokens"] > 0 and data["stats"]["reuse_lost"] == ""  # the question before left it
    assert all("pages" in s for s in data["sources"])
    passages = json.loads(runner.invoke(cli, ["ask", "Where do tomatoes grow best?", "--json", "--mode", "passages"]).output)
    assert passages["stats"]["mode"] == "passages" and passages["sources"][0]["n"] == 1
    bad = runner.invoke(cli, ["ask", "x", "--doc", "/nonexistent.pdf"])
    assert bad.exit_code == 2 and "not in collection" in bad.output


def test_an_embedding_model_is_refused_as_generator(make_pipeline, ingested, model_home):
    from pipeline.errors import EngineError
    from pipeline.models import resolve

    bert = resolve("builtin:all-MiniLM-L6-v2", home=model_home, fetch=False)
    with pytest.raises(EngineError, match="embedding \\(encoder\\) model"):
        make_pipeline(models__generator=str(bert), **FAST).ask("anything")
    with pytest.raises(InputError, match="query is empty"):
        make_pipeline().search("  ")
