"""Section reuse (pipeline.engine.reuse.sections): plans what a sections-mode prompt reuses, keeps sections the
memory holds composed, restores the others from their states, and reports it in the prompt's stats."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine import _llama
from pipeline.engine._llama import composing as mem
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.cache.sections import NO_STATE
from pipeline.engine.contract import EngineStats
from pipeline.engine.reuse.budget import ComposeMode, ComposePolicy, Refusal
from pipeline.engine.reuse.compose import Seams
from pipeline.engine.reuse.kinds import RECURRENT
from pipeline.engine.reuse.memory import Memory
from pipeline.engine.reuse.planner import Planner
from pipeline.engine.reuse.sections import SectionReuse
from pipeline.records import PromptShape, Sections

from support.composing import answer, decode, moe_path, random_prompt  # noqa: F401 - moe_path is a fixture


@pytest.fixture
def memory(moe_path):
    m = _llama.load(moe_path, n_ctx=2048, n_batch=256, n_ubatch=256, threads=1, n_seq_max=3)
    mem = Memory()
    mem.attach(m)
    yield mem
    m.close()


def layout(head, pieces, q):
    tokens = list(head) + [t for p in pieces for t in p.tokens] + list(q)
    ends, at = [], len(head)
    for p in pieces:
        at += len(p)
        ends.append(at)
    sections = Sections(len(head), tuple(ends))
    return PromptShape.of(tokens, prefix_len=sections.end, boundaries=ends, sections=sections), sections


def prefill(memory):
    def run(tokens, start):
        decode(memory.model, tokens[start:], start)
        memory.tokens.extend(tokens[start:])
    return run


def test_plan_run_and_report(memory, tmp_path):
    head, pieces, q = random_prompt(20)
    tokens, sections = layout(head, pieces, q)
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        reuse = SectionReuse(cache, namespace=lambda: "ns", seams=Seams("first", 16))
        plan = reuse.plan(tokens, memory)
        assert (plan.held, plan.saved, plan.reused) == (0, (False,) * 4, 0)
        stats = EngineStats()
        done = reuse.run(reuse.plan(tokens, memory), tokens, memory.model, memory, stats, prefill(memory))
        assert memory.tokens == list(tokens.tokens[:sections.end]) and memory.composed == sections.end
        assert (stats.composed_sections, stats.states_saved, stats.cached_tokens) == (0, 4, 0)
        assert stats.sections_lost == [NO_STATE] * 4 and stats.recomputed_tokens == done.recomputed_tokens == 48
        cold, _ = answer(memory.model, q, sections.end)
        assert mem.seq_remove(memory.model, 0, sections.end)  # (answer() decoded past what memory.tokens says)

        # the same sections in another order: nothing held in memory past the head, all restored
        other = [pieces[2], pieces[0], pieces[1], pieces[3]]
        tokens2, sections2 = layout(head, other, q)
        plan = reuse.plan(tokens2, memory)
        assert (plan.held, plan.held_tokens, plan.saved) == (0, len(head), (True,) * 4)
        stats = EngineStats()
        reuse.run(reuse.plan(tokens2, memory), tokens2, memory.model, memory, stats, prefill(memory))
        assert stats.composed_sections == 4 and stats.cache == "composed" and stats.sections_lost == []
        assert stats.cached_tokens == len(head) + sum(len(p) for p in pieces)

        # back to the first order: restored again, the answer is the cold one
        reuse.run(reuse.plan(tokens, memory), tokens, memory.model, memory, EngineStats(), prefill(memory))
        warm, _ = answer(memory.model, q, sections.end)
        assert np.array_equal(warm, cold)


def test_sections_held_in_memory_are_kept(memory, tmp_path):
    head, pieces, q = random_prompt(21)
    tokens, sections = layout(head, pieces, q)
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        reuse = SectionReuse(cache, namespace=lambda: "ns", seams=Seams("first", 16))
        reuse.run(reuse.plan(tokens, memory), tokens, memory.model, memory, EngineStats(), prefill(memory))
        longer, sections3 = layout(head, pieces[:2] + [pieces[3]], q)
        plan = reuse.plan(longer, memory)
        assert (plan.held, plan.saved) == (2, (True,))
        stats = EngineStats()
        reuse.run(reuse.plan(longer, memory), longer, memory.model, memory, stats, prefill(memory))
        assert stats.cache == "composed" and stats.composed_sections == 1
        assert stats.cached_tokens == sections3.end
        # memory made another way is never taken for composed sections
        memory.composed = 0
        assert reuse.plan(longer, memory).held == 0


def test_the_planner_says_why_a_prompt_is_not_composed(tmp_path):
    def planner(cache, mode):
        return Planner(cache, namespace=lambda: "ns", policy=ComposePolicy(mode=mode))

    nothing = Memory()
    assert planner(None, ComposeMode.OFF).refusal(nothing) is Refusal.OFF
    assert planner(None, ComposeMode.ON).refusal(nothing) is Refusal.NO_CACHE
    with PrefixCache(tmp_path / "c", max_bytes=2**20) as cache:
        assert planner(cache, ComposeMode.ON).refusal(nothing) is None  # not loaded: taken to shift
        assert planner(cache, ComposeMode.AUTO).refusal(nothing) is Refusal.NOT_CALIBRATED
        assert planner(cache, ComposeMode.AUTO).refusal(nothing, calibrated=False) is None  # could compose
        recurrent = Memory(expected=lambda: RECURRENT)  # what a hybrid model's header says before it loads
        assert planner(cache, ComposeMode.ON).refusal(recurrent) is Refusal.CANNOT_SHIFT
        assert planner(None, ComposeMode.ON).refusal(recurrent) is Refusal.CANNOT_SHIFT  # the model first
        assert "cannot be shifted" in Refusal.CANNOT_SHIFT.value and "prefix" in Refusal.CANNOT_SHIFT.value


def test_sections_are_checked():
    with pytest.raises(ValueError):
        Sections(10, (10, 20))
    with pytest.raises(ValueError):
        Sections(0, (5,))
    with pytest.raises(ValueError):
        Sections(4, ())



@pytest.mark.parametrize("seams_per_second,composes", [(100.0, True), (10.0, False)])
def test_a_composition_that_saves_new_states_wins_where_one_later_question_gains_its_cost_back(
        tmp_path, seams_per_second, composes):
    """No section has a state yet: composing computes them (and saves them) and so costs more than exact
    prefill now. It is chosen where one later question over the same sections, composed from those states
    instead of prefilled exactly, gains that back; with slow enough seams it never does."""
    from pipeline.engine.cache.calibrations import Calibration, Calibrations

    calibrations = Calibrations(tmp_path)
    policy = ComposePolicy(mode=ComposeMode.AUTO)
    calibrations.add(Calibration("m", "ns", policy.seams.key, kl=0.0, top1=1.0, tokens=64, prompts=3,
                                 kls=(0.0, 0.0, 0.0)))
    calibrations.keep_speeds("ns", {"prefill": 1000.0, "seams": seams_per_second, "section_restore": 100_000.0})
    shape = PromptShape.of(list(range(2150)), sections=Sections(100, (1100, 2100)))  # head, 2 sections, question
    with PrefixCache(tmp_path / "cache", max_bytes=2**20) as cache:
        planner = Planner(cache, namespace=lambda: "ns", policy=policy, calibrations=calibrations)
        plan = planner.plan(shape, Memory(), probe=True)
    assert plan.seconds["composed"] > plan.seconds["exact"] * 1.1  # composing is slower now in both cases
    assert (plan.composed is not None) is composes
    assert composes or plan.refusal is Refusal.EXACT_FASTER
