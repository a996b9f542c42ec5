"""The engine's contract: the llama.cpp classes, the remote ones and the fakes fulfil the same Protocols."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest
from support.fakes import EchoGenerator, HashEmbedder

from pipeline.engine.embed import Embedder
from pipeline.engine.local import Engine
from pipeline.engine.remote.embedder import RemoteEmbedder
from pipeline.engine.remote.generator import RemoteGenerator
from pipeline.engine.contract import EmbedderBase, EngineStats, GeneratorBase, TextEmbedder, TextGenerator
from pipeline.records import PromptShape


def members(protocol: type) -> set[str]:
    return {name for name in dir(protocol) if not name.startswith("_")} | set(
        typing.get_type_hints(protocol))


@pytest.mark.parametrize("protocol, real", [(TextEmbedder, Embedder), (TextGenerator, Engine),
                                            (TextEmbedder, RemoteEmbedder), (TextGenerator, RemoteGenerator)])
def test_the_engine_classes_have_every_member_of_their_contract(protocol, real):
    instance_attributes = {"model_path"}  # set in __init__
    assert members(protocol) - instance_attributes <= set(dir(real))
    assert issubclass(real, EmbedderBase if protocol is TextEmbedder else GeneratorBase)


def test_the_fakes_fulfil_the_contracts():
    assert isinstance(HashEmbedder(), TextEmbedder)
    assert isinstance(EchoGenerator(), TextGenerator)


def test_the_base_gives_the_capabilities_a_backend_lacks_their_plain_meaning():
    g = EchoGenerator(min_tokens=4)
    assert g.waiting == 0 and g.n_seq_max == 1 and g.workers() == [g]
    assert g.render([{"role": "user", "content": "x"}]) is None  # no template of its own: the stop guard only
    head = g.bos + g.tokenize(g.chat("sys", "Documents:\n\n[1] a long shared passage of text "))
    prompts = [head + g.tokenize(f"Question: {q}?<|im_end|>\n") for q in ("what", "why")]
    done = g.generate_many([PromptShape.of(p, prefix_len=len(head)) for p in prompts])
    assert [c.text for c in done] == ["You asked: what?", "You asked: why?"]  # one after another
    assert done[1].stats.cached_tokens == len(head)
    assert g.held(PromptShape.of(prompts[0], prefix_len=len(head))) == g.reusable(PromptShape.of(prompts[0], prefix_len=len(head))) == len(head)


def test_hash_embedder_is_deterministic_and_similar_for_shared_words():
    e = HashEmbedder(dim=64)
    a, b, c = e.embed(["the lighthouse is red", "the red lighthouse", "bananas are yellow"])
    assert np.allclose(np.linalg.norm([a, b, c], axis=1), 1.0)
    assert np.array_equal(a, HashEmbedder(dim=64).embed(["the lighthouse is red"])[0])
    assert a @ b > a @ c
    assert len(e.sequence("word " * 1000)) == e.max_tokens + 2


def test_echo_generator_reports_reuse_like_the_engine():
    g = EchoGenerator(min_tokens=4)
    head = g.bos + g.tokenize(g.chat("sys", "Documents:\n\n[1] a long shared passage of text "))
    first = head + g.tokenize("Question: what is it?<|im_end|>\n<|im_start|>assistant\n")
    gen = g.generate(PromptShape.of(first, prefix_len=len(head)))
    assert gen.read() == "You asked: what is it?"
    assert gen.stats.cache == "miss" and gen.stats.cached_tokens == 0 and gen.stats.prefill_tokens == len(first)
    second = head + g.tokenize("Question: and why?<|im_end|>\n")
    st = g.generate(PromptShape.of(second, prefix_len=len(head)), stats=EngineStats()).stats
    assert st.cache == "memory" and st.cached_tokens == len(head)
    other = EchoGenerator(saved=g.saved, min_tokens=4)  # another process, the same saved prefixes
    st = other.generate(PromptShape.of(second, prefix_len=len(head))).stats
    assert st.cache == "disk" and st.cached_tokens == len(head) and st.prefill_tokens == len(second) - len(head)


def _distinct(cls: type, offset: int) -> EngineStats:
    """Stats with a different value in every numeric field (what a sum must carry)."""
    numeric = [f for f in dataclasses.fields(cls) if type(f.default) in (int, float)]
    return cls(**{f.name: type(f.default)(offset + i + 1) for i, f in enumerate(numeric)})


def test_every_numeric_engine_figure_is_summed_or_computed_from_the_sums():
    a, b = _distinct(EngineStats, 0), _distinct(EngineStats, 100)
    b.cache, b.plan, b.notes = "disk", "composed", ["b's"]
    total = EngineStats().add(a).add(b)
    numeric = {f.name for f in dataclasses.fields(EngineStats) if type(f.default) in (int, float)}
    rates = {"prefill_tokens_per_second": ("prefill_tokens", "prefill_seconds"),
             "decode_tokens_per_second": ("decode_tokens", "decode_seconds")}
    engine_facts = {"load_seconds"}  # the same on every prompt of one engine
    assert set(EngineStats.counters()) == numeric - set(rates) - engine_facts and len(EngineStats.counters()) >= 10
    for name in EngineStats.counters():
        assert getattr(total, name) == getattr(a, name) + getattr(b, name), name
    for rate, (tokens, seconds) in rates.items():
        assert getattr(total, rate) == pytest.approx(getattr(total, tokens) / getattr(total, seconds))
    for name in engine_facts:
        assert getattr(total, name) == max(getattr(a, name), getattr(b, name)), name
    assert total.cache == "none" and total.plan == "" and total.notes == []  # one prompt's, not summed
    assert total.figures().keys() == numeric


def test_a_new_counter_is_summed_without_being_listed_again():
    @dataclasses.dataclass
    class WithAnotherCounter(EngineStats):
        widgets_built: int = 0
        widget_seconds: float = 0.0

    total = WithAnotherCounter().add(WithAnotherCounter(widgets_built=3, widget_seconds=0.5))
    total.add(WithAnotherCounter(widgets_built=4, widget_seconds=0.25))
    assert total.widgets_built == 7 and total.widget_seconds == 0.75
    assert {"widgets_built", "widget_seconds"} <= set(total.figures())


def test_a_summarize_report_sums_every_engine_counter_and_lists_none_itself():
    from pipeline.summarize.outputs import JobReport, Summary

    for holder in (JobReport, Summary):  # the counters live in EngineStats alone
        assert not {f.name for f in dataclasses.fields(holder)} & set(EngineStats.counters()), holder
    report = JobReport(collection="c")
    a, b = _distinct(EngineStats, 0), _distinct(EngineStats, 100)
    report.add(a)
    report.add(b)
    out = report.to_dict()
    assert out["generate_calls"] == 2 and "stats" not in out
    for name in EngineStats.counters():
        assert out[name] == pytest.approx(getattr(a, name) + getattr(b, name)), name
    assert out["prefill_tokens_per_second"] == pytest.approx(out["prefill_tokens"] / out["prefill_seconds"], abs=1e-3)
    assert out["load_seconds"] == max(a.load_seconds, b.load_seconds)  # one load, not one per generation
    summary = Summary("a.md", "h", "Summarise.", 1)
    summary.stats.add(a)
    assert summary.to_dict()["cached_tokens"] == a.cached_tokens and "stats" not in summary.to_dict()
