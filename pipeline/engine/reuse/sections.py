"""Section reuse: what a composed prompt takes from section states, and carrying a composition out.

A sections-mode prompt is ``[head][S1]..[Sk][question]`` (:class:`~.shape.Sections`).
Composed (:mod:`.compose`), every section's state is computed once, on its own after the
head, saved (:mod:`..cache.sections`), and restored at its place in any prompt that
holds it, with a few tokens recomputed at each seam. The result does not depend on what
was saved (a section without a state is computed the same way, and saved), so an answer
from reused states is token for token the answer without them.

What the engine's memory holds of a prompt is kept as well: a prompt that starts with
the same sections as the one composed before it (same head, same order) keeps them, up
to the first that differs. Memory made any other way (whole mode, passages, an exact
sections prompt) is never taken for composed sections (:attr:`.memory.Memory.composed`).
Whether a prompt is composed at all is the planner's (:mod:`.planner`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Callable, ContextManager, Sequence

from ...errors import DiskFullError
from ..cache.sections import SectionStates
from ..contract import CacheKind
from .memory import Memory
from .plan import Restore, SectionsPlan
from .seams import Seams, seam_positions
from ...records import Piece, PromptShape, common_prefix

if TYPE_CHECKING:
    from ..cache.prefix_cache import PrefixCache
    from ..contract import EngineStats
    from .compose import Composed


class SectionReuse:
    """The section reuse of one engine: its section store (states in ``store``, a
    :class:`~..cache.prefix_cache.PrefixCache`, under ``namespace()``) and the seams it recomputes.
    Not thread-safe: the engine calls it within its turn (probes only read)."""

    def __init__(self, store: PrefixCache | None, *, namespace: Callable[[], str], seams: Seams):
        self.store = store
        self.seams = seams
        self._namespace = namespace

    @property
    def available(self) -> bool:
        return self.store is not None and not self.store.unavailable

    def states(self, shape: PromptShape) -> SectionStates:
        assert shape.sections is not None
        return SectionStates(self.store, self._namespace(), shape.tokens[:shape.sections.head])

    # -- deciding ---------------------------------------------------------------------------

    def plan(self, shape: PromptShape, memory: Memory) -> SectionsPlan:
        """What composing the prompt now does (memory kept, saved states restored, sections computed, seams
        recomputed), running nothing and counting no miss."""
        sections = shape.sections
        assert sections is not None
        held, held_tokens = self._held(shape, memory)
        head = None if held_tokens else self._saved_head(shape.tokens[:sections.head])
        pieces = sections.pieces(shape.tokens)
        states = self.states(shape)
        try:
            saved = tuple(states.held(pieces[held:]))
        finally:
            states.close()
        places, pos = [], sections.head
        for i, piece in enumerate(pieces):
            if i >= held and pos != sections.head:
                places.append((pos, piece))
            pos += len(piece)
        return SectionsPlan(held, held_tokens, saved, tuple(len(p) for p in pieces),
                            seams=tuple(seam_positions(self.seams, places)), head=head)

    def held(self, shape: PromptShape, memory: Memory) -> int:
        """Tokens of the prompt (head and whole sections) ``memory`` holds as composing it would leave them."""
        return self._held(shape, memory)[1]

    @staticmethod
    def _held(shape: PromptShape, memory: Memory) -> tuple[int, int]:
        """Sections (and tokens, with the head) the memory holds as this composition would make them."""
        sections = shape.sections
        assert sections is not None
        n = min(memory.composed, common_prefix(memory.tokens, shape.tokens, sections.end))
        if n < sections.head:
            return 0, 0
        held = sum(1 for e in sections.ends if e <= n)
        return held, (sections.ends[held - 1] if held else sections.head)

    # -- carrying a composition out ---------------------------------------------------------

    def run(self, plan: SectionsPlan, shape: PromptShape, model, memory: Memory, stats: EngineStats,
            prefill: Callable[[Sequence[int], int], None], *, progress: Callable[[int], None] | None = None
            ) -> Composed:
        """Carry ``plan`` out: bring ``memory`` (on ``model``) to the prompt's documents part, composed;
        ``prefill(tokens, start)`` decodes the head where the plan restores none. Fills the composition's
        figures into ``stats``. Where a step the plan counted on fails (the memory refuses a cut, a state
        fails its checks), the same work is done the way that needs nothing saved (the head prefilled, the
        section computed): nothing is decided again. ``progress(tokens)``: see :func:`.compose.compose`."""
        from .compose import compose  # llama.cpp's memory API: imported once a model runs

        sections = shape.sections
        assert sections is not None
        head = shape.tokens[:sections.head]
        held, held_tokens = plan.held, plan.held_tokens
        if held_tokens and not memory.cut(held_tokens):
            held, held_tokens = 0, 0
            stats.notes.append("the KV memory could not be cut where the plan kept it: the head was brought back")
        if held_tokens == 0:
            held_tokens = self._head(memory, head, plan.head, prefill)
        memory.composed = 0
        states = self.states(shape)
        t0 = time.perf_counter()
        try:
            done = compose(model, head, sections.pieces(shape.tokens), states, self.seams, held=held,
                           positions=plan.seams if held == plan.held else None, progress=progress)
        except BaseException:
            memory.clear()
            raise
        finally:
            states.close()
        memory.tokens = list(shape.tokens[:sections.end])
        memory.composed = sections.end
        self.report(done, stats, held_tokens=held_tokens, states=states, seconds=time.perf_counter() - t0)
        return done

    @staticmethod
    def report(done: Composed, stats: EngineStats, *, held_tokens: int, states: SectionStates,
               seconds: float) -> None:
        stats.composed_sections = done.restored
        stats.recomputed_tokens = done.recomputed_tokens
        stats.cached_tokens = held_tokens + done.restored_tokens
        stats.cache = CacheKind.COMPOSED  # whatever it reused: cached_tokens and composed_sections say how much
        stats.sections_lost = list(done.lost)
        stats.states_saved += states.saved
        stats.cache_load_seconds += done.seconds["restore"]
        stats.notes.extend(states.notes)

    def saved(self, head: Sequence[int], sections: Sequence[Sequence[int]]) -> list[bool]:
        """Which of ``sections`` (token lists after ``head``) have a saved state whose file is there (a probe)."""
        states = SectionStates(self.store, self._namespace(), head)
        try:
            return states.held([Piece(tuple(t)) for t in sections])
        finally:
            states.close()

    def warm(self, model, memory: Memory, head: Sequence[int], sections: Sequence[Sequence[int]],
             prefill: Callable[[Sequence[int], int], None],
             progress: Callable[[int], None] | None = None, *,
             turn: Callable[[], ContextManager] = nullcontext, give_way: Callable[[], bool] = lambda: False,
             on_wait: Callable[[str], None] | None = None, cancelled: Callable[[], bool] = lambda: False) -> dict:
        """Compute and save the state of each of ``sections`` (token lists) that has none, each on
        its own after ``head``, in order: what composed prompts restore. ``progress(tokens)`` is told of
        the tokens of each section computed. Leaves ``memory`` holding ``head``.

        ``model`` and ``memory`` are used only within ``turn()`` (the engine's hold on its context),
        and the turn is given up between two sections where ``give_way()`` says so (a prompt waits
        for the engine), then taken again: the memory is then brought back to ``head`` first.

        Each saved state is checked first (its file there, its size and checksum): a missing or damaged
        one is dropped and saved again. One process warms a set of states at a time (a lock in the cache
        directory): a second waits (telling ``on_wait(holder)`` first; ``cancelled()`` stops the wait), then
        finds what the first saved, so ``saved + cached`` counts every section. The first save that fails for lack of space stops the warm with a
        :class:`~pipeline.errors.DiskFullError` that says how much was saved."""
        states = SectionStates(self.store, self._namespace(), head)
        counts = {"total": sum(map(len, sections)), "done": 0, "computed": 0, "found": 0, "repaired": 0}
        t0 = time.perf_counter()
        try:
            with self.store.exclusive(f"sections-{states.namespace[:32]}.lock", on_wait=on_wait,
                                      cancelled=cancelled) as waited:
                i = 0
                while i < len(sections):
                    with turn():
                        if memory.composed or memory.tokens[:len(head)] != list(head) or not memory.cut(len(head)):
                            self._head(memory, head, self._saved_head(head), prefill)
                        i = self._warm_each(model, len(head), sections, i, states, counts, progress, give_way)
        finally:
            states.close()
        notes = ["waited for another process warming the same section states"] if waited else []
        if counts["repaired"]:
            notes.append(f"{counts['repaired']} section state(s) were missing or damaged: saved again")
        return {"sections": len(sections), "saved": states.saved, "cached": counts["found"],
                "not_saved": len(sections) - states.saved - counts["found"], "repaired": counts["repaired"],
                "tokens": counts["total"], "prefilled_tokens": counts["computed"], "bytes_written": states.saved_bytes,
                "seconds": round(time.perf_counter() - t0, 3), "notes": notes + states.notes}

    @staticmethod
    def _warm_each(model, h: int, sections: Sequence[Sequence[int]], start: int, states: SectionStates,
                   counts: dict, progress: Callable[[int], None] | None, give_way: Callable[[], bool]) -> int:
        """Warm ``sections[start:]`` until one is to give way before; the index reached."""
        from .._llama import composing
        from .compose import compute

        for i in range(start, len(sections)):
            if i > start and give_way():
                return i
            piece = Piece(tuple(sections[i]))
            if states.verified(piece) is not None:
                counts["found"] += 1
            else:
                counts["repaired"] += bool(states.damaged(piece))
                saved = states.saved
                compute(model, h, piece, states, scratch=1)
                composing.seq_remove(model, 1)
                counts["computed"] += len(piece)
                if states.full:
                    raise DiskFullError(
                        f"{states.full}: {states.saved} section state(s) saved now "
                        f"({states.saved_bytes / 1e6:,.1f} MB), {counts['found']} saved before, "
                        f"{len(sections) - states.saved - counts['found']} of {len(sections)} without a state. "
                        "Free some space (or set cache.max_gb below what the disk holds) and run `rag warm "
                        "--sections` again: it computes only the sections still without a state")
                if states.saved == saved and states.find(piece) is not None:
                    counts["found"] += 1  # saved meanwhile by a process that does not take the lock (a question)
                if progress is not None:
                    progress(len(piece))
            counts["done"] += len(piece)
        return len(sections)

    def _saved_head(self, head: Sequence[int]) -> Restore | None:
        entry = self.store.find(self._namespace(), head)
        return Restore(self.store, entry) if entry is not None else None

    def _head(self, memory: Memory, head: Sequence[int], restore: Restore | None,
              prefill: Callable[[Sequence[int], int], None]) -> int:
        """Bring ``memory`` to exactly ``head``: ``restore`` (its saved state, as planned) loaded, returning its
        tokens; else (none saved, or it failed its checks) prefilled and saved, returning 0."""
        if restore is not None and memory.restore(restore.store, restore.entry, head):
            return len(head)
        memory.clear()
        prefill(head, 0)
        if not self.store.read_only:
            memory.save(self.store, self._namespace())
        return 0


__all__ = ["SectionReuse"]
