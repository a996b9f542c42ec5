"""Section states on disk (pipeline.engine.cache.sections): saved once, found by content and head, evicted
with the prefix cache's LRU, and a damaged or missing state costs a recompute, never a different answer."""

from __future__ import annotations

import numpy as np

from pipeline.engine._llama import composing as mem
from pipeline.engine.cache.prefix_cache import PrefixCache
from pipeline.engine.reuse.compose import Seams, compose
from pipeline.engine.cache.sections import EVICTED, NO_STATE, SectionStates, namespace

from support.composing import answer, decode, model, moe_path, random_prompt  # noqa: F401  (fixtures)


def run(model, head, pieces, q, states, seams=Seams("first", 16)):
    model.clear()
    decode(model, head, 0)
    done = compose(model, head, pieces, states, seams)
    logits, out = answer(model, q, len(head) + sum(len(p) for p in pieces), n=6)
    return done, logits, out


def test_states_are_saved_once_and_restored(model, tmp_path):
    head, pieces, q = random_prompt(10)
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        states = SectionStates(cache, "ns", head)
        cold, logits_cold, out_cold = run(model, head, pieces, q, states)
        assert (cold.computed, cold.restored, states.saved) == (4, 0, 4)
        assert cold.lost == [NO_STATE] * 4
        assert states.held(pieces) == [True] * 4
        warm, logits_warm, out_warm = run(model, head, pieces, q, SectionStates(cache, "ns", head))
        assert (warm.computed, warm.restored, warm.lost) == (0, 4, [])
        assert np.array_equal(logits_warm, logits_cold) and out_warm == out_cold
        assert cache.stats()["entries"] == 4
        # another order of the same sections reuses the same states
        again, _, _ = run(model, head, pieces[::-1], q, SectionStates(cache, "ns", head))
        assert again.restored == 4


def test_states_are_keyed_by_engine_and_head(model, tmp_path):
    head, pieces, q = random_prompt(11)
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        run(model, head, pieces, q, SectionStates(cache, "ns", head))
        assert not any(SectionStates(cache, "other engine", head).held(pieces))
        other_head = head[:-1] + [head[-1] + 1]
        assert not any(SectionStates(cache, "ns", other_head).held(pieces))
        assert namespace("ns", head) != namespace("ns", other_head)


def test_an_evicted_state_is_said_so(model, tmp_path):
    head, pieces, q = random_prompt(12, sizes=(100, 100, 100))
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as probe:
        run(model, head, pieces[:1], q, SectionStates(probe, "ns", head))
        one = probe.stats()["bytes"]
    with PrefixCache(tmp_path / "small", max_bytes=int(2.5 * one)) as cache:
        states = SectionStates(cache, "ns", head)
        run(model, head, pieces, q, states)
        assert states.held(pieces) == [False, True, True]  # least recently used first
        done, _, _ = run(model, head, pieces, q, SectionStates(cache, "ns", head))
        assert done.lost[0] == EVICTED  # (saving it again evicts the next: a cache smaller than the working set)


def test_a_damaged_state_is_recomputed_to_the_same_answer(model, tmp_path):
    head, pieces, q = random_prompt(13)
    with PrefixCache(tmp_path / "cache", max_bytes=2**30) as cache:
        _, logits_cold, out_cold = run(model, head, pieces, q, SectionStates(cache, "ns", head))
        victim = SectionStates(cache, "ns", head).find(pieces[2])
        path = cache.directory / victim.file
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
        states = SectionStates(cache, "ns", head)
        done, logits, out = run(model, head, pieces, q, states)
        assert (done.restored, done.computed) == (3, 1)
        assert "discarded" in done.lost[0] and "checksum" in done.lost[0]
        assert np.array_equal(logits, logits_cold) and out == out_cold
        assert states.held(pieces) == [True] * 4  # saved again
