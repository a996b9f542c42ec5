"""The Python API end to end with the fake embedder and generator: retrieval, packing, streaming, sources,
stats, prefix reuse, warm-up. No model loads; ``test_ask.py`` and ``test_prefix_cache.py`` run the real ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.fakes import EchoGenerator

from pipeline.errors import ConfigError, EngineError, InputError, StoreError

FAST = {"ask__max_tokens": 12, "ask__top_k": 3}


@pytest.fixture
def ingested(fake_pipeline, corpus):
    fake_pipeline().ingest([corpus])
    return corpus


def test_ask_answers_with_numbered_sources_and_stats(fake_pipeline, ingested):
    generator = EchoGenerator(n_ctx=1024)
    answer = fake_pipeline(generator=generator, **FAST).ask("Which fruit is rich in potassium?")
    assert answer.text == "You asked: Which fruit is rich in potassium?"
    assert [s["n"] for s in answer.sources] == list(range(1, len(answer.sources) + 1)) and len(answer.sources) >= 1
    pdf = [s for s in answer.sources if s["source"].endswith("manual.pdf")]
    assert pdf and 2 in pdf[0]["pages"]
    prompt = generator.detokenize(generator.prompts[-1])
    assert prompt.rstrip().endswith("assistant") and "Question: Which fruit" in prompt  # the question last
    st = answer.stats
    assert st.prompt_tokens == len(generator.prompts[-1]) <= 1024 - 12 and st.decode_tokens <= 12
    assert answer.to_dict()["stats"]["prompt_tokens"] == st.prompt_tokens


def test_streaming_yields_the_answer_and_the_next_question_reuses_the_prefix(fake_pipeline, ingested):
    rag = fake_pipeline(**FAST)
    stream = rag.ask_stream("What does --n-cpu-moe do?")
    pieces = list(stream)
    assert len(pieces) > 2 and "".join(pieces).strip() == stream.answer.text
    assert stream.answer.stats.cache == "miss"  # nothing saved before
    again = rag.ask("What does --n-cpu-moe do?")
    assert again.text == stream.answer.text and again.stats.cache == "memory"
    assert again.stats.cached_tokens > 0 and again.stats.prefill_tokens == again.stats.prompt_tokens - \
        again.stats.cached_tokens


def test_ask_whole_document_and_its_errors(fake_pipeline, ingested):
    rag = fake_pipeline(**FAST)
    answer = rag.ask("What is on page three?", doc=ingested / "manual.pdf")
    assert {s["source"] for s in answer.sources} == {str((ingested / "manual.pdf").resolve())}
    assert answer.sources[0]["pages"] == [1, 2, 3]  # all of it, in order
    with pytest.raises(InputError, match="not in collection"):
        rag.ask("x", doc=ingested / "image.png")
    with pytest.raises(InputError, match="empty"):
        rag.ask("   ")


def test_a_document_too_long_for_the_context_falls_back_to_its_best_passages(fake_pipeline, tmp_path):
    doc = tmp_path / "long.md"
    doc.write_text("\n\n".join(f"Paragraph {i} is about topic {i} and the zebra count is {i * 3}."
                               for i in range(400)))
    fake_pipeline().ingest([doc])
    answer = fake_pipeline(generator=EchoGenerator(n_ctx=512), ask__max_tokens=8, ask__top_k=2).ask(
        "What is the zebra count of paragraph 7?", doc=doc)
    assert any("does not fit the context" in n for n in answer.notes)
    assert answer.stats.prompt_tokens <= 512 - 8


def test_questions_about_one_document_share_its_prefix_across_pipelines(fake_pipeline, ingested):
    doc = ingested / "guide.md"
    first = fake_pipeline(**FAST).ask("What does --n-cpu-moe do?", doc=doc)
    other = fake_pipeline(**FAST).ask("Why do larger micro-batches help?", doc=doc)  # "another process"
    assert first.stats.cache == "miss" and other.stats.cache == "disk"
    assert other.stats.cached_tokens > 0 and other.stats.prefill_tokens < first.stats.prefill_tokens


def test_warm_saves_the_prefix_the_next_question_hits_once(fake_pipeline, ingested):
    report = fake_pipeline(**FAST).warm()  # the four small documents fit: one whole-collection prefix
    assert report["mode"] == "whole" and [p["outcome"] for p in report["prefixes"]] == ["saved"]
    assert report["prefixes"][0]["documents"] == 4
    assert [p["outcome"] for p in fake_pipeline(**FAST).warm()["prefixes"]] == ["cached"]
    answer = fake_pipeline(**FAST).ask("What colour is a banana?")
    assert answer.stats.cache == "disk" and answer.stats.cached_tokens == report["prefixes"][0]["tokens"]
    with pytest.raises(ConfigError, match="prefix cache is off"):
        fake_pipeline(cache__enabled=False).warm()


def test_warm_for_summaries_saves_each_documents_own_prefix(fake_pipeline, ingested):
    # The collection fits whole: "ask" saves its one prefix, "summarize" each document's own (what
    # `ask --doc` and summaries start from), "all" both; each is then found on disk.
    s = {**FAST, "cache__min_tokens": 16}
    only_ask = fake_pipeline(**s).warm()
    assert [p["prefix"] for p in only_ask["prefixes"]] == ["the whole collection (4 documents)"]
    report = fake_pipeline(**s).warm(purpose="all")
    assert report["mode"] == "whole" and report["purpose"] == "all"
    whole, *own = report["prefixes"]
    assert whole["outcome"] == "cached" and whole["prefilled"] == 0
    assert [Path(p["prefix"]).name for p in own] == ["guide.md", "manual.pdf", "notes.txt", "page.html"]
    assert all(p["documents"] == 1 and p["tokens"] > 100 for p in own)
    # the first document's own prefix is the collection's up to its end: saved there already
    assert own[0]["outcome"] == "cached" and own[0]["prefilled"] == 0
    assert all(p["outcome"] == "saved" and p["prefilled"] == p["tokens"] for p in own[1:])
    assert report["prefilled_tokens"] == sum(p["tokens"] for p in own[1:])
    from pipeline.schemas import validate, versioned

    validate("ingest", versioned({**fake_pipeline(**s).ingest([ingested]).to_dict(), "warm": report}))  # --warm --json
    assert [p["outcome"] for p in fake_pipeline(**s).warm(purpose="summarize")["prefixes"]] == ["cached"] * 4
    for p in own:
        answer = fake_pipeline(**s).ask("What is it about?", doc=p["prefix"])
        assert answer.stats.cache == "disk" and answer.stats.cached_tokens == p["tokens"]
    with pytest.raises(ConfigError, match="warm is for one of ask, summarize, all"):
        fake_pipeline(**s).warm(purpose="questions")


def test_clear_errors_before_any_model(fake_pipeline, corpus):
    with pytest.raises(StoreError, match="does not exist"):
        fake_pipeline().ask("anything")
    fake_pipeline().ingest([corpus / "notes.txt"])
    with pytest.raises(EngineError, match="no room for documents"):
        fake_pipeline(generator=EchoGenerator(n_ctx=64), ask__max_tokens=60).ask("anything")
    with pytest.raises(InputError, match="empty"):
        fake_pipeline().search("  ")


def test_the_pipeline_closes_what_it_made_not_what_it_was_given(fake_pipeline, corpus):
    generator = EchoGenerator()
    rag = fake_pipeline(generator=generator)
    rag.ingest([corpus / "notes.txt"])
    rag.ask("Which client runs Chroma as a server?")
    embedder = rag.embedder
    rag.close()
    assert not generator.closed and not embedder.closed
