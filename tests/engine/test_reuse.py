"""Prefix reuse (:mod:`pipeline.engine.reuse.prefix`) through its public API, with a fake model and
store: what the memory holds, what a prompt reuses and from where, fallbacks, save points. The same
on real llama.cpp is checked in test_cache.py and test_prefix_cache.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pipeline.engine.cache.protocol import ExactLookup
from pipeline.engine.contract import EngineStats
from pipeline.engine.reuse.kinds import ATTENTION, RECURRENT
from pipeline.engine.reuse.memory import Memory
from pipeline.engine.reuse.prefix import PrefixReuse
from pipeline.records import PromptShape, common_prefix, cuts


@dataclass
class Entry:
    tokens: tuple[int, ...]
    created: float = field(default_factory=time.time)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class FakeModel:
    """What :class:`Memory` asks of a model: cut, clear, whether it can cut, synchronise."""

    def __init__(self, *, can_trim: bool = True, trims: bool = True):
        self.can_trim, self.trims = can_trim, trims
        self.cleared = 0

    def trim(self, n: int) -> bool:
        return self.trims

    def clear(self) -> None:
        self.cleared += 1

    def synchronize(self) -> None:
        pass


class FakeStore(ExactLookup):
    """Saved prefixes by their tokens; ``broken`` ones fail their checks when loaded."""

    unavailable = ""
    read_only = False

    def __init__(self, saved=(), broken=()):
        self.saved = {tuple(s) for s in saved}
        self.broken = {tuple(b) for b in broken}
        self.misses = 0
        self.last_error = ""
        self.last_load_seconds = 0.01

    def lookup(self, namespace, tokens, *, max_tokens=None, min_tokens=1, lengths=None, count=True):
        fits = [s for s in self.saved if min_tokens <= len(s) <= max_tokens
                and (lengths is None or len(s) in lengths) and tuple(tokens[:len(s)]) == s]
        if not fits:
            self.misses += count
            return None
        return Entry(max(fits, key=len))

    def load(self, entry, model, *, seq=0) -> bool:
        if entry.tokens in self.broken:
            self.last_error = "state file checksum mismatch"
            return False
        return True

    def save(self, namespace, tokens, model, *, seq=0):
        self.saved.add(tuple(tokens))
        return Entry(tuple(tokens))

    def take_notes(self):
        return []


def policy(store=None, **kw) -> PrefixReuse:
    return PrefixReuse(store, namespace=lambda: "ns", min_tokens=kw.pop("min_tokens", 10), **kw)


def prepare(p: PrefixReuse, mem: Memory, stats: EngineStats):
    return p.prepare(p.plan(SHAPE, mem), SHAPE, mem, stats)


def memory(tokens=(), **kw) -> Memory:
    m = Memory(expected=lambda: ATTENTION if kw.get("can_trim", True) else RECURRENT)  # the fake's kind
    m.model = FakeModel(**kw)
    m.tokens = list(tokens)
    return m


PROMPT = list(range(100))
CUTS = cuts(len(PROMPT), 60, [20, 40])
SHAPE = PromptShape(tuple(PROMPT), CUTS)


def shape(tokens, cuts_=CUTS) -> PromptShape:
    return PromptShape(tuple(tokens), tuple(cuts_))


def test_cuts_are_the_boundaries_within_the_prefix_and_its_end_one_token_left():
    assert CUTS == (20, 40, 60)
    assert cuts(10, 10, [3]) == (3, 9) and cuts(1, 1, []) == () and cuts(50, 0, [10]) == ()
    assert common_prefix([1, 2, 3], [1, 2, 4], 10) == 2 and common_prefix([1, 2], [1, 2], 1) == 1


def test_held_is_the_common_prefix_cut_back_to_a_cut():
    p = policy()
    assert p.held(SHAPE, memory(PROMPT[:50] + [7], can_trim=True)) == 40
    assert p.held(SHAPE, memory(PROMPT, can_trim=True)) == 60  # never past the prefix
    assert p.held(SHAPE, memory([], can_trim=True)) == 0 and p.held(shape(PROMPT, ()), memory(PROMPT)) == 0
    # A memory that cannot be cut keeps only what is exactly a prefix of the prompt at a cut.
    assert p.held(SHAPE, memory(PROMPT[:40], can_trim=False)) == 40
    assert p.held(SHAPE, memory(PROMPT[:50], can_trim=False)) == 0


def test_a_plan_keeps_the_memory_unless_a_longer_state_is_saved():
    store = FakeStore(saved=[PROMPT[:20], PROMPT[:60]])
    p = policy(store)
    plan = p.plan(SHAPE, memory(PROMPT[:45]))
    assert plan.keep == 40 and plan.restore is not None and plan.reused == 60 and plan.source == "disk"
    held_all = p.plan(SHAPE, memory(PROMPT[:70]))  # the memory holds the whole prefix
    assert held_all.restore is None and held_all.reused == 60 and held_all.source == "memory"
    assert store.misses == 0
    nothing = policy(FakeStore()).plan(SHAPE, memory([]))
    assert nothing.source == "miss" and nothing.reused == 0 and nothing.store
    short = policy(FakeStore(), min_tokens=100).plan(SHAPE, memory(PROMPT[:30]))
    assert not short.store and short.source == "memory" and short.keep == 20  # a prefix too short to save


def test_reusable_is_a_probe_and_counts_no_miss():
    store = FakeStore(saved=[PROMPT[:40]])
    p = policy(store)
    assert p.plan(SHAPE, memory(), probe=True).reused == 40
    assert p.plan(shape([9] + PROMPT[1:]), memory(), probe=True).reused == 0 and store.misses == 0
    p.plan(shape([9] + PROMPT[1:]), memory())
    assert store.misses == 1  # a use counts


def test_prepare_fills_the_figures_and_a_state_that_fails_its_checks_costs_a_full_prefill():
    store = FakeStore(saved=[PROMPT[:60]], broken=[PROMPT[:60]])
    mem, stats = memory(PROMPT[:30]), EngineStats()
    done = prepare(policy(store), mem, stats)
    assert done.reused == 0 and mem.tokens == [] and stats.cache == "miss" and stats.cached_tokens == 0
    assert any("ignored and deleted" in n for n in stats.notes)

    store = FakeStore(saved=[PROMPT[:60]])
    mem, stats = memory(PROMPT[:30]), EngineStats()
    done = prepare(policy(store), mem, stats)
    assert done.source == "disk" and mem.tokens == PROMPT[:60] and stats.cached_tokens == 60
    assert stats.cache == "disk" and stats.cache_load_seconds == 0.01

    mem, stats = memory(PROMPT[:50] + [1, 2]), EngineStats()
    done = prepare(policy(None), mem, stats)
    assert mem.tokens == PROMPT[:40] and stats.cache == "memory" and stats.cached_tokens == 40


def test_a_memory_that_cannot_be_cut_is_cleared_with_a_note():
    mem, stats = memory(PROMPT[:50], can_trim=False), EngineStats()
    done = prepare(policy(None), mem, stats)
    assert done.reused == 0 and mem.tokens == [] and any("cannot be cut at token 40" in n for n in done.notes)


def test_a_cut_llama_cpp_refuses_falls_back_to_a_shorter_saved_state_counting_one_miss():
    store = FakeStore(saved=[PROMPT[:20]])
    mem, stats = memory(PROMPT[:50], trims=False), EngineStats()  # sliding-window layers dropped cells
    done = prepare(policy(store), mem, stats)
    assert done.source == "disk" and done.reused == 20 and mem.tokens == PROMPT[:20]
    assert any("could not be cut at token 40" in n for n in done.notes) and store.misses == 1


def test_advance_prefills_piece_by_piece_and_saves_at_the_save_points():
    store = FakeStore()
    p = policy(store, boundary_states=1)
    mem, stats = memory(PROMPT[:20]), EngineStats()
    pieces = []

    def prefill(tokens, start):
        pieces.append((start, len(tokens)))
        mem.tokens.extend(tokens[start:])

    plan = prepare(p, mem, stats)
    assert plan.store and plan.reused == 20 and stats.cache == "miss"
    saved = p.advance(plan, SHAPE, mem, stats, prefill)
    assert pieces == [(20, 40), (40, 60)] and saved == {40, 60} and stats.states_saved == 2
    assert store.saved == {tuple(PROMPT[:40]), tuple(PROMPT[:60])}
    assert p.advance(plan, SHAPE, mem, EngineStats(), prefill) == set()  # nothing left to prefill
    unsaved = policy(FakeStore(), min_tokens=100).plan(SHAPE, memory([]))
    assert not unsaved.store and policy(FakeStore(), min_tokens=100).advance(
        unsaved, SHAPE, memory(), EngineStats(), lambda t, s: None) == set()


def test_states_are_saved_at_the_prefix_and_a_bounded_spread_of_boundaries():
    p = policy(min_tokens=100, boundary_states=4)
    at = [50, 200, 300, 400, 500, 600, 700, 800, 900]
    points = p.save_points(at, start=0)
    assert 900 in points and 50 not in points and len(points) == 5  # the prefix + 4 spread from the first
    assert 200 in points and 800 in points
    assert p.save_points(at, start=800) == {900}
    assert policy(min_tokens=100, boundary_states=0).save_points(at, start=0) == {900}
