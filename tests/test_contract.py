"""The engine's contract: the llama.cpp classes, the remote ones and the fakes fulfil the same Protocols."""

from __future__ import annotations

import typing

import numpy as np
import pytest
from fakes import EchoGenerator, HashEmbedder

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
