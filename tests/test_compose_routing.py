"""Where composed prompts go and what a packer is told they reuse: two real engines over one section
store (a tiny generated attention-only model), a pool routing by the sections each engine's memory
holds as a composition left them, and ``reusable`` counting restorable section states."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine.pool import EnginePool
from pipeline.config import EngineConfig
from pipeline.engine.cache.store import PrefixCache
from pipeline.engine.local import Engine
from pipeline.engine.reuse.seams import Seams, Sections

from test_compose_ask import moe  # noqa: F401 - a fixture

SETTINGS = EngineConfig(n_ctx=2048, threads=1, n_batch=256, n_ubatch=256)


rng = np.random.default_rng(7)
HEAD = [int(t) for t in rng.integers(3, 250, size=20)]
S = [[int(t) for t in rng.integers(3, 250, size=n)] for n in (120, 90, 150, 110, 80)]


def prompt(*which: int, question: int = 1) -> tuple[list[int], Sections]:
    tokens, ends = list(HEAD), []
    for i in which:
        tokens += S[i]
        ends.append(len(tokens))
    return tokens + [5, 6, question], Sections(len(HEAD), tuple(ends))


def run(engine: Engine, tokens: list[int], layout: Sections) -> dict:
    g = engine.generate(tokens, max_tokens=2, prefix_len=layout.end, boundaries=layout.ends, sections=layout)
    g.read()
    return g.stats.__dict__


@pytest.fixture
def engines(moe, tmp_path):
    cache = PrefixCache(tmp_path / "cache", max_bytes=2**30)
    a, b = (Engine(moe, SETTINGS, cache=cache, compose=Seams()) for _ in range(2))
    yield a, b
    a.close()
    b.close()


def test_the_pool_sends_a_composed_prompt_to_the_engine_holding_its_leading_sections(engines):
    a, b = engines
    pool = EnginePool(lambda: a, lambda: pytest.fail("no third engine"), 2)
    pool._extra = [b]
    run(a, *prompt(0, 1))
    run(b, *prompt(2, 3))  # b's memory: head, S2, S3 as composed
    tokens, layout = prompt(2, 3, 4, question=2)
    kw = dict(prefix_len=layout.end, boundaries=layout.ends)
    held = len(HEAD) + len(S[2]) + len(S[3])
    assert b.held(tokens, **kw, sections=layout) == held
    assert a.held(tokens, **kw, sections=layout) == len(HEAD)  # the head alone
    # Seen as a prefix, a composition's memory is never reusable: the pool would have no reason to choose.
    assert b.held(tokens, **kw) == 0
    assert pool.pick(tokens, **kw, sections=layout) is b
    stats = run(b, tokens, layout)
    assert stats["cached_tokens"] >= held and stats["composed_sections"] == 0  # S4 had no state yet
    other, other_layout = prompt(0, 1, 3, question=3)
    assert pool.pick(other, prefix_len=other_layout.end, boundaries=other_layout.ends, sections=other_layout) is a


def test_reusable_counts_section_states_any_engine_saved(engines):
    a, b = engines
    run(a, *prompt(0, 1, 2))  # saves S1 and S2 (S0, right after the head, is its own state too)
    tokens, layout = prompt(1, 2, 4)
    kw = dict(prefix_len=layout.end, boundaries=layout.ends)
    # b never ran: nothing in memory, but the states a saved are on the shared disk.
    assert b.held(tokens, **kw, sections=layout) == 0
    reusable = b.reusable(tokens, **kw, sections=layout)
    assert reusable == len(HEAD) + len(S[1]) + len(S[2])  # the head's state, and S1's and S2's
    assert b.reusable(tokens, **kw) == 0  # as a prefix, nothing past the head was ever prefilled
    stats = run(b, tokens, layout)
    assert stats["composed_sections"] == 2 and stats["cached_tokens"] == reusable
