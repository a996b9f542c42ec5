"""Prompts composed from section states: each section is prefilled once, on its own, and reused anywhere.

A sections-mode prompt is ``[head][S1][S2]...[Sk][question]``. Each section's KV state
is computed once, after the head alone, at the positions right after it
(``len(head)..``), and saved (:mod:`.section_states`). A prompt that places the
section elsewhere restores that state into a scratch sequence, moves it to its place
(``llama_memory_seq_add``: llama.cpp re-rotates the RoPE keys by the shift), and joins
it to the prompt's sequence (``llama_memory_seq_cp``: in the unified KV cache the
cells are shared, not copied), then drops the scratch sequence. A section with no
saved state is computed the same way, on its own in the scratch sequence, and saved:
so a prompt's result does not depend on what was cached, and an answer from reused
states is token for token the answer without them.

What is approximate: a moved section did not attend to the sections now before it.
A few of its tokens are therefore decoded again at their place (the *seams*, see
:class:`Seams`): their new cells attend to everything before them. Which ones, and
how many, is measured by ``benchmarks/compose_quality.py``. A section right after
the head (the first one) is exact as restored, so it is never recomputed.

Composition needs a memory whose positions can be shifted (:func:`.mem.can_shift`):
attention-only models, with every cell of sliding-window layers kept. Recurrent and
hybrid models cannot shift a recurrent state; they keep exact prefix reuse.

Memory: a state is restored into the scratch sequence and its cells handed to the
prompt's sequence before the next is restored, and a recomputed token's old cell is
freed before its new one is made, so composing never needs more KV cells than the
prompt itself.

llama.cpp decodes a sequence's tokens only at positions that continue what it holds,
so a token in the middle of the prompt is recomputed through the scratch sequence:
its old cell is removed from the prompt's sequence, the cells before it are shared
with the scratch sequence, it is decoded there, and its new cell is shared back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from ..._testhooks import crash_point
from ...errors import EngineError
from .._llama import composing as mem
from .seams import STRATEGIES, Seams, runs, seam_positions
from ...records import Piece


class States(Protocol):
    """Where section states come from and go to (:class:`.section_states.SectionStates`, or bytes
    in memory for a benchmark)."""

    def restore(self, piece: Piece, model, seq: int, start: int) -> bool:
        """Put ``piece``'s saved state into the empty sequence ``seq``, at ``start..``; False when
        there is none (:meth:`why` says why) or it could not be used."""

    def store(self, piece: Piece, model, seq: int, start: int) -> None:
        """Save ``piece``'s state, which sequence ``seq`` holds alone at ``start..``."""

    def why(self, piece: Piece) -> str:
        """Why ``piece`` had no usable state ("no state yet", "evicted"...)."""


class StatesInMemory:
    """Section states kept as bytes in this process, never evicted: for measurements and tests of
    composition apart from the disk store (:class:`.section_states.SectionStates`). Counts what
    it restored and stored."""

    def __init__(self):
        self.data: dict[tuple[int, ...], bytes] = {}
        self.restored = self.stored = 0

    def restore(self, piece: Piece, model, seq: int, start: int) -> bool:
        data = self.data.get(piece.tokens)
        if data is None or not mem.restore_state_bytes(model, data, seq):
            return False
        self.restored += 1
        return True

    def store(self, piece: Piece, model, seq: int, start: int) -> None:
        self.stored += 1
        self.data[piece.tokens] = mem.state_bytes(model, seq)

    def why(self, piece: Piece) -> str:
        return "no state yet"


@dataclass
class Composed:
    """What :func:`compose` did."""

    sections: int = 0  # sections it placed (not held already)
    restored: int = 0  # of them, from a saved state
    computed: int = 0  # of them, computed now on their own (and saved)
    restored_tokens: int = 0
    computed_tokens: int = 0
    recomputed_tokens: int = 0
    runs: int = 0  # decodes the recompute took
    lost: list[str] = field(default_factory=list)  # why sections were not reused
    seconds: dict[str, float] = field(default_factory=lambda: {"restore": 0.0, "compute": 0.0, "recompute": 0.0})


def compose(model, head: Sequence[int], pieces: Sequence[Piece], states: States, seams: Seams, *,
            held: int = 0, scratch: int = 1, guard: int = 2, positions: Sequence[int] | None = None,
            progress: Callable[[int], None] | None = None) -> Composed:
    """Fill sequence 0 of ``model`` with ``head`` and ``pieces`` composed from section states.

    Sequence 0 must hold exactly ``head`` and the first ``held`` pieces (as a composition made
    them); ``scratch`` is a sequence the model may use and that is empty; on a model with
    sliding-window layers, ``guard`` is another (see :func:`_guarded`). ``positions``
    replaces the seams' choice of tokens to recompute (a benchmark's). On return sequence 0
    holds the whole documents part, ready for the question; raises EngineError if llama.cpp
    refused a step (sequence 0 is then cleared). ``progress(tokens)`` is told of the tokens decoded
    (sections computed, seams), as it goes.
    """
    if not mem.can_shift(model):
        raise EngineError("this model's memory cannot shift positions (recurrent or hybrid): it cannot compose")
    h = len(head)
    pos = h + sum(len(p) for p in pieces[:held])
    if model.seq_end(0) != pos - 1:
        raise EngineError(f"sequence 0 ends at {model.seq_end(0)}, not at {pos - 1}: nothing to compose onto")
    out = Composed(sections=len(pieces) - held)
    places: list[tuple[int, Piece]] = []
    guard_seq = _guarded(model, guard)
    try:
        for piece in pieces[held:]:
            computed = out.computed_tokens
            _place(model, head, piece, pos, states, scratch, out)
            if progress is not None and out.computed_tokens > computed:
                progress(out.computed_tokens - computed)
            _protect(model, guard_seq, pos, pos + len(piece))
            crash_point("COMPOSING")
            if pos != h:
                places.append((pos, piece))
            pos += len(piece)
        tokens = list(head) + [t for p in pieces for t in p.tokens]
        chosen = seam_positions(seams, places) if positions is None else sorted(positions)
        t0 = time.perf_counter()
        for a, b in runs(chosen, [s for s, _ in places]):
            _recompute(model, tokens, a, b, scratch, guard_seq)
            out.runs += 1
            out.recomputed_tokens += b - a
            if progress is not None:
                progress(b - a)
        out.seconds["recompute"] += time.perf_counter() - t0
    except BaseException:
        model.clear()
        raise
    finally:
        if guard_seq is not None:
            mem.seq_remove(model, guard_seq)
    return out


def _guarded(model, guard: int) -> int | None:
    """Give ``guard`` every cell of sequence 0, on a model with sliding-window layers; the guard sequence, or None.

    llama.cpp reuses a cell that only one sequence holds once it lies a window behind that
    sequence's last position, since in a prompt that only grows it is never attended to again.
    A composed prompt does attend to such cells (a seam recomputed before a section placed
    after it), so while it is composed every cell of sequence 0 is also held by ``guard``
    (shared, not copied: no memory).
    """
    if mem.sliding_window(model) == 0:
        return None
    if model.n_seq_max <= guard:
        raise EngineError(f"composing on a sliding-window model needs {guard + 1} sequences; the context has "
                          f"{model.n_seq_max}")
    mem.seq_remove(model, guard)
    model.seq_copy(0, guard, 0, -1)
    return guard


def _protect(model, guard: int | None, p0: int, p1: int) -> None:
    if guard is not None:
        model.seq_copy(0, guard, p0, p1)


def _place(model, head: Sequence[int], piece: Piece, pos: int, states: States, scratch: int, out: Composed) -> None:
    """Put ``piece`` at ``pos`` of sequence 0: restored from its state, or computed on its own and saved."""
    h, n = len(head), len(piece)
    t0 = time.perf_counter()
    if states.restore(piece, model, scratch, h):
        out.restored += 1
        out.restored_tokens += n
        out.seconds["restore"] += time.perf_counter() - t0
    else:
        out.lost.append(states.why(piece))
        compute(model, h, piece, states, scratch)
        out.computed += 1
        out.computed_tokens += n
        out.seconds["compute"] += time.perf_counter() - t0
    # (a sliding-window cache keeps only a window's worth of a section's cells: they may start later)
    if model.seq_end(scratch) != h + n - 1 or not h <= mem.seq_start(model, scratch) <= h + n - 1:
        raise EngineError("a section state does not hold the positions it was saved at")
    if pos != h:
        mem.seq_shift(model, scratch, h, h + n, pos - h)
    model.seq_copy(scratch, 0, pos, pos + n)
    mem.seq_remove(model, scratch)


def compute(model, h: int, piece: Piece, states: States, scratch: int = 1) -> None:
    """Compute ``piece``'s state on its own after the head (the first ``h`` cells of sequence 0) in
    ``scratch``, and save it; ``scratch`` then holds the piece's cells alone."""
    mem.seq_remove(model, scratch)
    model.seq_copy(0, scratch, 0, h)  # the scratch sequence sees the head only
    _decode_span(model, piece.tokens, h, scratch)
    mem.seq_remove(model, scratch, 0, h)
    states.store(piece, model, scratch, h)


def _recompute(model, tokens: Sequence[int], a: int, b: int, scratch: int, guard: int | None) -> None:
    """Decode positions ``[a, b)`` of sequence 0 again, attending to everything before them."""
    if not mem.seq_remove(model, 0, a, b):
        raise EngineError(f"the KV memory could not drop positions {a}..{b - 1} to recompute them")
    if guard is not None:
        mem.seq_remove(model, guard, a, b)  # the old cells are freed
    model.seq_copy(0, scratch, 0, a)
    _decode_span(model, tokens[a:b], a, scratch)
    model.seq_copy(scratch, 0, a, b)
    mem.seq_remove(model, scratch)
    _protect(model, guard, a, b)


def _decode_span(model, tokens: Sequence[int], pos: int, seq: int) -> None:
    """Decode ``tokens`` at ``pos..`` of ``seq`` in ``n_batch`` pieces from ``pos`` (as prefill splits them)."""
    import numpy as np

    arr = np.asarray(tokens, dtype=np.int32)
    step = model.n_batch
    for lo in range(0, len(arr), step):
        mem.decode_outputs(model, arr[lo:lo + step], pos + lo, seq=seq)


__all__ = ["Composed", "Piece", "compute", "STRATEGIES", "Seams", "States", "StatesInMemory", "compose", "runs",
           "seam_positions"]
