"""Several prompts over one prefix decoded together (``engine.n_seq_max`` > 1): the same greedy answers
as one prompt at a time, the prefix prefilled once, and groups that fit the context."""

from __future__ import annotations

import dataclasses

import pytest

from devtools.synthetic import write_moe_model
from pipeline.config import EngineConfig
from pipeline.engine.local import Engine
from pipeline.engine.multiseq import groups
from pipeline.records import PromptShape


def settings(**kw) -> EngineConfig:
    # One thread: with several, llama.cpp's CPU flash attention splits a one-token batch's KV across the
    # threads but not a k-token batch's, so outputs may differ by rounding (see pipeline/engine/multiseq.py).
    return dataclasses.replace(EngineConfig(n_ctx=1024, n_batch=512, n_ubatch=256, threads=1), **kw)


def test_groups_fit_the_sequences_and_the_context():
    # prefix 100, each prompt 10 past it, answers of 20: 30 cells per sequence after the prefix
    assert groups([110] * 5, prefix_len=100, max_tokens=20, n_ctx=1000, n_seq=2) == [[0, 1], [2, 3], [4]]
    assert groups([110] * 5, prefix_len=100, max_tokens=20, n_ctx=190, n_seq=8) == [[0, 1, 2], [3, 4]]
    assert groups([110, 500, 110], prefix_len=100, max_tokens=20, n_ctx=560, n_seq=8) == [[0, 1], [2]]


def _prompts(eng: Engine, head_text: str, questions: list[str]) -> tuple[list[list[int]], int]:
    head = eng.bos + eng.tokenize(eng.chat("Be brief.", "Documents:\n\n" + head_text), special=True)
    tail = eng.tokenize("<|im_end|>\n<|im_start|>assistant\n", special=True)
    return [head + eng.tokenize(f"Question: {q}") + tail for q in questions], len(head)


def _one_at_a_time(eng: Engine, prompts, prefix_len, **kw) -> list[str]:
    return [eng.generate(PromptShape.of(p, prefix_len=prefix_len), **kw).read() for p in prompts]


def test_together_equals_one_at_a_time_on_a_generated_model(tmp_path):
    # A tiny generated model (real llama.cpp, random weights): fast, and greedy ties are rare.
    path = write_moe_model(tmp_path / "tiny.gguf", n_layers=4, n_ctx_train=4096)
    alone, together = Engine(path, settings()), Engine(path, settings(n_seq_max=4))
    try:
        assert together.n_seq_max == 4 and alone.n_seq_max == 1
        prompts, n = _prompts(alone, "the quick brown fox " * 20, ["why?", "how so?", "what next, then?"])
        kw = dict(max_tokens=16, temperature=0.0, repeat_penalty=1.2)
        expected = _one_at_a_time(alone, prompts, n, **kw)
        got = together.generate_many([PromptShape.of(p, prefix_len=n) for p in prompts], **kw)
        assert [c.text for c in got] == expected
        assert got[0].stats.prefill_tokens == len(prompts[0]) and got[0].stats.cached_tokens == 0
        assert [c.stats.prefill_tokens for c in got[1:]] == [len(p) - n for p in prompts[1:]]
        assert all(c.stats.cached_tokens == n for c in got[1:])
        # the engine still reuses sequence 0's prefix for the next prompt, and the result is unchanged
        again = together.generate(PromptShape.of(prompts[2], prefix_len=n), **kw)
        assert again.read() == expected[2] and again.stats.cached_tokens == n
    finally:
        alone.close()
        together.close()


@pytest.mark.slow
@pytest.mark.parametrize("repeat_penalty", [1.0, 1.2])
def test_together_equals_one_at_a_time_on_smollm2(model_home, repeat_penalty):
    from pipeline.models import resolve

    path = resolve("builtin:SmolLM2-135M-Instruct", home=model_home, fetch=False)
    alone, together = Engine(path, settings()), Engine(path, settings(n_seq_max=3))
    try:
        doc = ("[1] mars.txt\nThe sky on Mars is butterscotch by day and blue at sunset. Olympus Mons is the "
               "tallest volcano in the solar system. A day on Mars lasts 24 hours and 39 minutes. ") * 4
        prompts, n = _prompts(alone, doc + "\n\n", ["What colour is the sky?", "How long is a day?",
                                                  "Summarise the document in one sentence."])
        kw = dict(max_tokens=24, temperature=0.0, repeat_penalty=repeat_penalty)
        expected = _one_at_a_time(alone, prompts, n, **kw)
        got = together.generate_many([PromptShape.of(p, prefix_len=n) for p in prompts], **kw)
        assert [c.text for c in got] == expected and all(expected)
        assert sum(c.stats.prefill_tokens for c in got) == len(prompts[0]) + sum(len(p) - n for p in prompts[1:])
        assert all(0 < c.stats.decode_tokens <= 24 for c in got)
    finally:
        alone.close()
        together.close()
