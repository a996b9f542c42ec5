"""Where composed prompts go and what a packer is told they reuse: two real engines over one section
store (a tiny generated attention-only model), a pool routing by the sections each engine's memory
holds as a composition left them, and ``reusable`` counting restorable section states."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine.pool import EnginePool
from pipeline.config import EngineConfig
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.local import Engine
from pipeline.engine.reuse.budget import ComposeMode, ComposePolicy
from pipeline.records import PromptShape, Sections

from support.composing import moe  # noqa: F401 - a fixture

SETTINGS = EngineConfig(n_ctx=2048, threads=1, n_batch=256, n_ubatch=256)


rng = np.random.default_rng(7)
HEAD = [int(t) for t in rng.integers(3, 250, size=20)]
S = [[int(t) for t in rng.integers(3, 250, size=n)] for n in (120, 90, 150, 110, 80)]


def prompt(*which: int, question: int = 1) -> PromptShape:
    tokens, ends = list(HEAD), []
    for i in which:
        tokens += S[i]
        ends.append(len(tokens))
    sections = Sections(len(HEAD), tuple(ends))
    return PromptShape.of(tokens + [5, 6, question], prefix_len=sections.end, boundaries=ends, sections=sections)


def as_prefix(shape: PromptShape) -> PromptShape:
    """The same prompt seen as a prefix only (no sections)."""
    return PromptShape(shape.tokens, shape.cuts)


def run(engine: Engine, shape: PromptShape) -> dict:
    g = engine.generate(shape, max_tokens=2)
    g.read()
    return g.stats.__dict__


@pytest.fixture
def engines(moe, tmp_path):
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    a, b = (Engine(moe, SETTINGS, cache=cache, compose=ComposePolicy(mode=ComposeMode.ON)) for _ in range(2))
    yield a, b
    a.close()
    b.close()


def test_the_pool_sends_a_composed_prompt_to_the_engine_holding_its_leading_sections(engines):
    a, b = engines
    pool = EnginePool(lambda: a, lambda: pytest.fail("no third engine"), 2)
    pool._extra = [b]
    run(a, prompt(0, 1))
    run(b, prompt(2, 3))  # b's memory: head, S2, S3 as composed
    shape = prompt(2, 3, 4, question=2)
    held = len(HEAD) + len(S[2]) + len(S[3])
    assert b.held(shape) == held
    assert a.held(shape) == len(HEAD)  # the head alone
    # Seen as a prefix, a composition's memory is never reusable: the pool would have no reason to choose.
    assert b.held(as_prefix(shape)) == 0
    assert pool.pick(shape) is b
    stats = run(b, shape)
    assert stats["cached_tokens"] >= held and stats["composed_sections"] == 0  # S4 had no state yet
    assert pool.pick(prompt(0, 1, 3, question=3)) is a


def test_reusable_counts_section_states_any_engine_saved(engines):
    a, b = engines
    run(a, prompt(0, 1, 2))  # saves S1 and S2 (S0, right after the head, is its own state too)
    shape = prompt(1, 2, 4)
    # b never ran: nothing in memory, but the states a saved are on the shared disk.
    assert b.held(shape) == 0
    reusable = b.reusable(shape)
    assert reusable == len(HEAD) + len(S[1]) + len(S[2])  # the head's state, and S1's and S2's
    assert b.reusable(as_prefix(shape)) == 0  # as a prefix, nothing past the head was ever prefilled
    stats = run(b, shape)
    assert stats["composed_sections"] == 2 and stats["cached_tokens"] == reusable
