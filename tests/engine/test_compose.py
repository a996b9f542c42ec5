"""Prompts composed from section states (pipeline.engine.reuse.compose): the plumbing is exact when nothing is
approximated, a cached and an uncached composition are the same computation, composing needs no more KV
cells than the prompt, and a model whose memory cannot shift is refused.

The fast tests run a tiny generated attention-only model (its text is noise, its KV arithmetic is real);
the exactness check on the real small models is marked slow.
"""

from __future__ import annotations

import numpy as np
import pytest

from pathlib import Path

from devtools.synthetic import write_mamba_model
from pipeline.engine import _llama
from pipeline.engine._llama import composing as mem
from pipeline.engine._llama import state_format as kv_state
from pipeline.engine.reuse.compose import Piece, Seams, compose, runs, seam_positions
from pipeline.engine.reuse.compose import StatesInMemory as Memory
from pipeline.errors import EngineError
from support.composing import answer, decode, model, moe_path, random_prompt  # noqa: F401 - model and moe_path are fixtures

ROOT = Path(__file__).resolve().parents[2]


def exact(model, head, pieces):
    """Exact prefill cut where composition cuts: the head, then each section from its own start."""
    model.clear()
    decode(model, head, 0)
    pos = len(head)
    for p in pieces:
        decode(model, p.tokens, pos)
        pos += len(p)
    return pos


def composed(model, head, pieces, states, seams):
    model.clear()
    decode(model, head, 0)
    done = compose(model, head, pieces, states, seams)
    return done


def test_whole_recompute_is_exact(model):
    head, pieces, q = random_prompt()
    end = exact(model, head, pieces)
    ref_logits, ref = answer(model, q, end)
    states = Memory()
    done = composed(model, head, pieces, states, Seams("whole"))
    assert done.computed == 4 and done.recomputed_tokens == sum(len(p) for p in pieces[1:])
    logits, out = answer(model, q, end)
    assert out == ref
    assert np.allclose(logits, ref_logits, atol=1e-4)


def test_cached_and_uncached_compositions_are_the_same_computation(model):
    head, pieces, q = random_prompt(1)
    states = Memory()
    first = composed(model, head, pieces, states, Seams("first", 16))
    end = len(head) + sum(len(p) for p in pieces)
    logits_cold, out_cold = answer(model, q, end)
    assert (first.computed, first.restored, states.stored) == (4, 0, 4)
    second = composed(model, head, pieces, states, Seams("first", 16))
    logits_warm, out_warm = answer(model, q, end)
    assert (second.computed, second.restored) == (0, 4)
    assert second.restored_tokens == sum(len(p) for p in pieces)
    assert out_warm == out_cold
    assert np.array_equal(logits_warm, logits_cold)


def test_moved_sections_without_recompute_differ_from_exact(model):
    """The measurement can fail: sections that did not attend to what now precedes them change the logits."""
    head, pieces, q = random_prompt(2)
    end = exact(model, head, pieces)
    ref_logits, _ = answer(model, q, end)
    exact_state = mem.state_bytes(model, 0)
    composed(model, head, pieces, Memory(), Seams("none"))
    logits, _ = answer(model, q, end)  # a decode: llama.cpp re-rotates the shifted keys then
    assert mem.seq_remove(model, 0, end)
    dev = kv_state.deviation(exact_state, mem.state_bytes(model, 0))
    assert not np.allclose(logits, ref_logits, atol=1e-4)
    first_section = range(len(head), len(head) + len(pieces[0]))
    moved = range(len(head) + len(pieces[0]), end)
    assert max(dev[p] for p in first_section) < 0.01  # restored at its own place: exact (f16 rounding aside)
    assert np.mean([dev[p] for p in moved]) > 10 * max(0.001, max(dev[p] for p in first_section))
    layers = kv_state.layer_deviation(exact_state, mem.state_bytes(model, 0), moved)
    # The first layer's keys depend on the token and its position only: moved and re-rotated by llama.cpp,
    # they are exact prefill's (f16 rounding aside); its values too. Deeper layers saw other context.
    assert layers[0][0] < 0.002 and layers[0][1] < 1e-6
    assert all(k > 0.1 and v > 0.1 for k, v in layers[1:])


def test_composing_needs_no_more_cells_than_the_prompt(model):
    head, pieces, q = random_prompt(3)
    states = Memory()
    composed(model, head, pieces, states, Seams("first", 32))
    end = len(head) + sum(len(p) for p in pieces)
    assert mem.memory_cells(model) == end
    composed(model, head, pieces, states, Seams("first+last", 32))  # from states, with seams recomputed
    assert mem.memory_cells(model) == end
    assert model.seq_end(1) == -1  # the scratch sequence is gone
    assert list(kv_state.positions(mem.state_bytes(model, 0))) == list(range(end))


def test_held_sections_are_kept(model):
    head, pieces, q = random_prompt(4)
    states = Memory()
    composed(model, head, pieces, states, Seams("first", 8))
    end = len(head) + sum(len(p) for p in pieces)
    logits_a, _ = answer(model, q, end)
    keep = len(head) + len(pieces[0]) + len(pieces[1])
    assert mem.seq_remove(model, 0, keep)
    done = compose(model, head, pieces, states, Seams("first", 8), held=2)
    assert done.sections == 2 and done.restored == 2
    logits_b, _ = answer(model, q, end)
    assert np.array_equal(logits_a, logits_b)


def test_compose_checks_what_sequence_zero_holds(model):
    head, pieces, _ = random_prompt(5)
    model.clear()
    with pytest.raises(EngineError, match="nothing to compose onto"):
        compose(model, head, pieces, Memory(), Seams("first", 8))


def test_a_model_that_cannot_shift_is_refused(tmp_path):
    m = _llama.load(write_mamba_model(tmp_path / "mamba.gguf"), n_ctx=512, n_batch=128, n_ubatch=128, threads=1,
                    n_seq_max=2)
    try:
        assert not mem.can_shift(m)
        head, pieces, _ = random_prompt(6, sizes=(20, 20))
        decode(m, head, 0)
        with pytest.raises(EngineError, match="cannot shift"):
            compose(m, head, pieces, Memory(), Seams("first", 8))
    finally:
        m.close()


# --------------------------------------------------------------------------- choosing the seams


def test_seam_positions():
    a, b = Piece(tuple(range(10)), headers=(0, 1, 5)), Piece(tuple(range(6)), headers=(0,))
    places = [(100, a), (110, b)]
    assert seam_positions(Seams("none"), places) == []
    assert seam_positions(Seams("first", 3), places) == [100, 101, 102, 110, 111, 112]
    assert seam_positions(Seams("first", 8), places) == list(range(100, 108)) + list(range(110, 116))
    assert seam_positions(Seams("last", 2), places) == [112, 113, 114, 115]
    assert seam_positions(Seams("headers"), places) == [100, 101, 105, 110]
    assert seam_positions(Seams("whole"), places) == list(range(100, 116))
    assert seam_positions(Seams("first+last", 1), places) == [100, 110, 114, 115]
    assert seam_positions(Seams("first", 4), []) == []


def test_runs_are_cut_at_section_starts():
    assert runs([1, 2, 3, 7, 8, 10]) == [(1, 4), (7, 9), (10, 11)]
    assert runs([1, 2, 3, 4], bounds=[3]) == [(1, 3), (3, 5)]
    assert runs([]) == []


@pytest.mark.parametrize("bad", [Seams.__init__])
def test_seams_are_checked(bad):
    with pytest.raises(ValueError, match="unknown seam strategy"):
        Seams("middle", 8)
    with pytest.raises(ValueError, match=">= 0"):
        Seams("first", -1)


# --------------------------------------------------------------------------- the real small models


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SmolLM2-135M-Instruct", "gemma-3-270m"])
def test_whole_recompute_is_token_for_token_exact_on_real_models(name, model_home):
    """Sections of a real document, composed with every moved section recomputed: the greedy answer is
    exact prefill's, token for token (Gemma 3's prompt is longer than its 512-token sliding window)."""
    from pipeline.models import resolve

    path = resolve(f"builtin:{name}", home=model_home, fetch=False)
    m = _llama.load(path, n_ctx=2048, n_batch=512, n_ubatch=512, threads=2, flash_attn=True, n_seq_max=3,
                    swa_full=True)
    try:
        assert mem.can_shift(m)
        text = (ROOT / "samples" / "kv-cache-reuse.txt").read_text()
        paras = [p for p in text.split("\n\n") if p.strip()]
        head = m.bos + m.tokenize("You answer questions using only the documents.\n\nDocuments:\n\n")
        pieces = [Piece(tuple(m.tokenize(f"[{i + 1}] " + "\n\n".join(paras[i * 5:i * 5 + 5]) + "\n\n")))
                  for i in range(3)]
        q = m.tokenize("Question: How is the prefix cache keyed?\nAnswer:")
        end = exact(m, head, pieces)
        assert end > 600
        _, ref = answer(m, q, end, n=24)
        composed(m, head, pieces, Memory(), Seams("whole"))
        _, out = answer(m, q, end, n=24)
        assert out == ref
    finally:
        m.close()
