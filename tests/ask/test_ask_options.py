"""Per-call options on ask/ask_stream, and where answers stop (template turn markers, the new-turn guard)."""

from __future__ import annotations

import pytest

from pipeline.errors import InputError
from pipeline.ask.stops import Stops

FAST = {"engine__n_ctx": 768, "ask__max_tokens": 16, "ask__top_k": 2, "ask__neighbours": 0}
Q = "What do tomato plants need?"


def test_per_call_options_override_the_settings(make_pipeline, ingested):
    rag = make_pipeline(**FAST)
    base = rag.ask(Q)
    assert base.text and base.stats.decode_tokens <= 16
    short = rag.ask(Q, max_tokens=2)
    assert short.stats.decode_tokens <= 2 and base.text.startswith(short.text)
    words = base.text.split()
    if len(words) > 1:
        cut = rag.ask(Q, stop=[" " + words[1]])
        assert cut.text == words[0]
    other = rag.ask(Q, system_prompt="Answer in one word.")
    assert other.stats.prompt_tokens != base.stats.prompt_tokens
    assert len(rag.ask(Q, top_k=1).sources) == 1
    warm = rag.ask(Q, temperature=0.9)
    assert warm.text  # sampled, valid
    for bad in ({"temperature": -1}, {"max_tokens": 0}, {"top_k": 0}, {"mode": "sections"}):
        with pytest.raises(InputError):
            rag.ask(Q, **bad)


def test_chat_template_turn_markers_are_stop_tokens(make_pipeline, ingested):
    rag = make_pipeline(models__generator="builtin:SmolLM2-135M-Instruct", **FAST)  # a model with a chat template
    stops = rag.stops
    im_start, im_end = rag.engine.tokenize("<|im_start|>", special=True), rag.engine.tokenize("<|im_end|>", special=True)
    assert len(im_start) == len(im_end) == 1
    assert {im_start[0], im_end[0]} <= stops.tokens
    assert "\nQuestion:" in stops.strings


def test_gemma_base_model_answers_without_inventing_new_turns(make_pipeline, ingested):
    """Gemma 3 270M (a base model, no chat template): the stops are the new-turn guard only."""
    rag = make_pipeline(models__generator="builtin:gemma-3-270m", engine__n_ctx=1024, ask__max_tokens=80,
                        ask__top_k=2)
    assert rag.stops.tokens == frozenset() and "\nQuestion:" in rag.stops.strings
    answer = rag.ask(Q)
    assert answer.text and "Question:" not in answer.text and "Answer:" not in answer.text


def test_an_invented_turn_ends_the_answer_and_the_decode(fake_pipeline):
    """A generator that writes the next "Question: ... Answer: ..." turn itself: the answer ends
    before it, and the engine stops decoding there (its turn is given back)."""
    from support.fakes import EchoGenerator

    class Inventor(EchoGenerator):
        def _stream(self, words, stats, cancel=None):
            yield from super()._stream([*words, "\n", "Question:", " more?", "\n", "Answer:", " yes"] * 20, stats,
                                       cancel)

    gen = Inventor()
    rag = fake_pipeline(generator=gen)
    rag.ingest([_write_doc(rag)])
    answer = rag.ask("Where do zebras live?")
    assert answer.text == "You asked: Where do zebras live?"
    assert answer.stats.decode_tokens < 12  # stopped at the invented turn, not after 20 of them
    rag.runtime.stops = Stops()
    assert "Question: more?" in rag.ask("Where do zebras live?").text  # what the guard prevents


def _write_doc(rag):
    path = rag.config.store_path.parent / "zebras.md"
    path.write_text("# Zebras\n\nZebras live on the savanna in Africa.\n")
    return path


def test_prefill_progress_is_reported_to_a_callback(make_pipeline, ingested):
    rag = make_pipeline(**{**FAST, "engine__n_batch": 64, "engine__n_ubatch": 64, "cache__enabled": False})
    seen = []
    answer = rag.ask("Which fruit is rich in potassium?", progress=seen.append)
    total = answer.stats.prefill_tokens
    assert len(seen) >= total // 64 and seen[-1].done == seen[-1].total == total and seen[-1].finished
    assert [p.done for p in seen] == sorted(p.done for p in seen) and seen[0].done == 0
    assert seen[-1].tokens_per_second > 0 and "tok/s" in seen[-1].describe()
    assert any(p.eta_seconds is not None for p in seen[1:-1])
