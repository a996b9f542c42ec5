"""Conversations: the follow-up retrieves with a condensed query and reuses the document prefix."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pipeline.ask import flow
from pipeline.ask.chat import condense, transcript
from pipeline.cli import cli

FAST = {"engine__n_ctx": 1024, "ask__max_tokens": 8, "ask__top_k": 2, "ask__neighbours": 0}


def test_condense_and_transcript_keep_the_turn_layout():
    history = [{"role": "user", "content": "How is the prefix cache keyed?"},
               {"role": "assistant", "content": "By a hash of the tokens."}]
    assert condense(history, "And how is it invalidated?") == \
        "How is the prefix cache keyed?\nAnd how is it invalidated?"
    assert transcript(history, "And how is it invalidated?") == (
        "How is the prefix cache keyed?\nAnswer: By a hash of the tokens.\n\nQuestion: And how is it invalidated?")
    assert transcript([], "Q?") == "Q?"


def test_chat_follow_up_keeps_documents_and_reports_cached_tokens(make_pipeline, corpus, model_home):
    make_pipeline().ingest([corpus])
    rag = make_pipeline(**FAST)
    first = rag.chat("What does the flag --n-cpu-moe keep in CPU memory?", chat_id="t1")
    follow = rag.chat("And what does flash attention reduce?", chat_id="t1")
    first_sources = {s["source"] for s in first.sources}
    follow_sources = {s["source"] for s in follow.sources}
    assert first_sources <= follow_sources  # the first question's documents stay in the prompt
    assert any(s.endswith("guide.md") for s in follow_sources)
    # everything up to the turns (system + documents) came from the KV cache
    assert follow.stats.cached_tokens > 0.6 * first.stats.prompt_tokens, (
        follow.stats.cached_tokens, first.stats.prompt_tokens)
    saved = json.loads((rag.config.store_path / "chats" / "t1.json").read_text())
    assert [t["role"] for t in saved["turns"]] == ["user", "assistant", "user", "assistant"]
    assert saved["turns"][2]["content"] == "And what does flash attention reduce?"


def test_cli_ask_chat_continues_a_conversation(store_dir, corpus, tmp_path, monkeypatch):
    # Each command is a new engine: the documents' prefix comes back from the disk cache,
    # which by default skips prefixes under 256 tokens (this corpus is tiny).
    monkeypatch.setenv("RAG_CACHE_MIN_TOKENS", "32")
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(corpus)]).exit_code == 0
    args = ["--ctx", "1024", "--max-tokens", "6", "-k", "2", "--json"]
    one = runner.invoke(cli, ["ask", "What do tomato plants need?", "--chat", "c1", *args])
    assert one.exit_code == 0, one.output
    two = runner.invoke(cli, ["ask", "And how much water?", "--chat", "c1", *args])
    assert two.exit_code == 0, two.output
    stats = json.loads(two.output)["stats"]
    assert stats["cache"] == "disk" and stats["cached_tokens"] > 0
    bad = runner.invoke(cli, ["ask", "x", "--chat", "../escape"])
    assert bad.exit_code == 2 and "invalid chat id" in bad.output


def test_a_follow_up_retrieves_with_the_condensed_query(fake_pipeline, tmp_path, monkeypatch):
    """Retrieval sees the earlier question with the follow-up (a bare "And how is it invalidated?"
    names nothing to find)."""
    (tmp_path / "a.md").write_text("# Cache\n\nThe prefix cache is keyed by a hash of the tokens.\n")
    (tmp_path / "b.md").write_text("# Pumps\n\nThe pump pressure rises while the valve stays closed.\n")
    rag = fake_pipeline()
    rag.ingest([tmp_path])
    queries = []
    real = flow.retrieve

    def spy(rt, store, query, **kw):
        queries.append(query)
        return real(rt, store, query, **kw)

    monkeypatch.setattr(flow, "retrieve", spy)
    first = rag.chat("How is the prefix cache keyed?", chat_id="c")
    queries.clear()
    follow = rag.chat("And how is it invalidated?", chat_id="c")
    assert queries and all(q == "How is the prefix cache keyed?\nAnd how is it invalidated?" for q in queries)
    assert first.text and follow.question == "And how is it invalidated?"
