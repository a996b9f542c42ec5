"""The engine pool (``engine.parallel`` > 1) routes a prompt to the engine whose memory holds its
longest prefix, with fakes of the engine interface. The real-model check is in test_concurrency.py."""

from __future__ import annotations

from typing import Sequence

from pipeline.engine.pool import EnginePool
from pipeline.records import PromptShape


class HoldingEngine:
    """A fake engine: ``memory`` is what its KV cache holds; ``disk`` what a shared prefix cache holds;
    ``waiting`` its queue (the running prompt included)."""

    def __init__(self, name: str, memory: Sequence[int] = (), *, waiting: int = 0, disk: int = 0):
        self.name, self.memory, self.waiting, self.disk = name, list(memory), waiting, disk

    def held(self, prompt: PromptShape) -> int:
        n = 0
        while n < min(len(self.memory), len(prompt)) and self.memory[n] == prompt.tokens[n]:
            n += 1
        return max((c for c in prompt.cuts if c <= n), default=0)

    def reusable(self, prompt: PromptShape) -> int:
        return max(self.held(prompt), min(self.disk, prompt.prefix_len))


def shape(tokens, *, prefix_len, boundaries=()) -> PromptShape:
    return PromptShape.of(tokens, prefix_len=prefix_len, boundaries=boundaries)


DOC_A = list(range(100, 160))
DOC_B = list(range(200, 260))
QUESTION = [7, 8, 9]


def _pool(*engines, size=None):
    made = []

    def make():
        made.append(HoldingEngine(f"new{len(made)}"))
        return made[-1]

    pool = EnginePool(lambda: engines[0], make, size or len(engines))
    pool._extra = list(engines[1:])
    return pool, made


def test_a_prompt_goes_to_the_engine_holding_its_prefix_not_the_first():
    a, b = HoldingEngine("a", DOC_A + [1]), HoldingEngine("b", DOC_B + [2])
    pool, _ = _pool(a, b)
    prompt = DOC_B + QUESTION
    assert pool.pick(shape(prompt, prefix_len=len(DOC_B))) is b  # before: the first free engine, a
    assert pool.reusable(shape(prompt, prefix_len=len(DOC_B))) == len(DOC_B)  # before: a's 0
    assert pool.pick(shape(DOC_A + QUESTION, prefix_len=len(DOC_A))) is a


def test_the_longest_held_prefix_wins_and_ties_go_to_the_free_engine():
    both = DOC_A + DOC_B
    a = HoldingEngine("a", DOC_A + [1], waiting=0)  # the first document only
    b = HoldingEngine("b", both + [2], waiting=1)  # both documents, busy
    c = HoldingEngine("c", both + [3], waiting=0)  # both documents, free
    pool, _ = _pool(a, b, c)
    prompt = both + QUESTION
    assert pool.pick(shape(prompt, prefix_len=len(both), boundaries=[len(DOC_A)])) is c
    c.waiting = 2
    assert pool.pick(shape(prompt, prefix_len=len(both), boundaries=[len(DOC_A)])) is b  # the shorter queue of the two
    c.memory = DOC_A + [9]
    b.waiting = 5
    assert pool.pick(shape(prompt, prefix_len=len(both), boundaries=[len(DOC_A)])) is b  # longest, even when busy


def test_with_no_prefix_held_the_pool_balances_and_grows_as_before():
    a, b = HoldingEngine("a", DOC_A, waiting=1), HoldingEngine("b", DOC_B, waiting=0)
    pool, made = _pool(a, b, size=3)
    prompt = [1, 2, 3] + QUESTION
    assert pool.pick(shape(prompt, prefix_len=3)) is b  # the free one
    b.waiting = 1
    new = pool.pick(shape(prompt, prefix_len=3))  # all busy, room left: a new engine
    assert made == [new] and pool.engines == [a, b, new]
    # a prefix only on disk (every engine restores it alike) does not pin the prompt to one engine
    a.disk = b.disk = new.disk = 3
    new.waiting = 0
    assert pool.pick(shape(prompt, prefix_len=3)) is new
    assert pool.reusable(shape(prompt, prefix_len=3)) == 3
