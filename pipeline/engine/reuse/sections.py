"""Section reuse: what a sections-mode prompt takes from section states, decided before it runs.

The counterpart of the prefix-reuse policy (:mod:`.reuse`) for a prompt whose documents
part is fixed sections (``[head][S1]..[Sk][question]``, see :class:`Sections`). Such a
prompt is composed (:mod:`.compose`): every section's state is computed once, on its own
after the head, saved (:mod:`.section_states`), and restored at its place in any prompt
that holds it, with a few tokens recomputed at each seam. The result does not depend on
what was saved (a section without a state is computed the same way, and saved), so an
answer from reused states is token for token the answer without them.

What the engine's memory holds of a prompt is kept as well: a prompt that starts with
the same sections as the one composed before it (same head, same order) keeps them, up
to the first that differs. Memory made any other way (whole mode, passages, an exact
sections prompt) is never taken for composed sections.

:meth:`SectionReuse.why_off` says why a prompt is not composed: composition turned off
(``ask.compose = "off"``), no section store, or a model whose memory cannot shift
(recurrent and hybrid ones keep exact prefix reuse). Every figure a prompt reports comes
from :class:`~.compose.Composed` into :class:`~.contract.EngineStats` (:meth:`report`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from .prefix import common_prefix
from .seams import Piece, Seams, Sections
from ..cache.sections import SectionStates

if TYPE_CHECKING:
    from ..cache.store import PrefixCache
    from .compose import Composed
    from ..contract import EngineStats


@dataclass(frozen=True)
class SectionPlan:
    """What a composed prompt would reuse: ``held`` sections kept in memory (``held_tokens`` with
    the head), and for each other section whether a state is saved."""

    held: int
    held_tokens: int
    saved: tuple[bool, ...]
    sizes: tuple[int, ...]

    @property
    def restorable_tokens(self) -> int:
        return sum(n for n, ok in zip(self.sizes[self.held:], self.saved) if ok)

    @property
    def reused(self) -> int:
        """Tokens this prompt would not prefill (held or restored; seams aside)."""
        return self.held_tokens + self.restorable_tokens


class SectionReuse:
    """The section reuse of one engine: its section store (states in ``store``, a
    :class:`~.cache.store.PrefixCache`, under ``namespace()``), the seams it recomputes, and what
    its memory holds composed. Not thread-safe: the engine calls it within its turn (probes
    only read)."""

    def __init__(self, store: PrefixCache | None, *, namespace: Callable[[], str], seams: Seams,
                 enabled: bool = True):
        self.store = store
        self.seams = seams
        self.enabled = enabled
        self._namespace = namespace
        self.composed: tuple[int, ...] = ()  # the tokens the memory holds as a composition made them

    def why_off(self, *, can_shift: bool | None) -> str:
        """Why prompts are not composed ("" when they are); ``can_shift`` None: the model is not loaded yet."""
        if not self.enabled:
            return "composition is off (ask.compose = \"off\")"
        if self.store is None:
            return "composition needs the prefix cache (cache.enabled = false)"
        if self.store.unavailable:
            return f"composition needs the prefix cache, which is unavailable ({self.store.unavailable})"
        if can_shift is False:
            return ("this model's memory cannot be shifted (recurrent or hybrid layers): sections are reused "
                    "as a prefix only")
        return ""

    def would_compose(self, sections: Sections | None, model) -> bool:
        """Whether a prompt laid out as ``sections`` would be composed on ``model``, running nothing
        (``model`` None: not loaded yet, taken to shift; its section states tell)."""
        if sections is None:
            return False
        if model is None:
            return not self.why_off(can_shift=None)
        from .._llama import composing

        return not self.why_off(can_shift=composing.can_shift(model))

    def exact(self, memory: Sequence[int]) -> Sequence[int]:
        """What of ``memory`` (the tokens the engine's memory holds) prefix reuse may take: nothing
        where a composition made it (:meth:`release` clears it before an exact prompt runs)."""
        return () if self.composed else memory

    def applies(self, model, sections: Sections | None, stats: EngineStats) -> bool:
        """Whether a prompt laid out as ``sections`` (None: not a sections-mode prompt) is composed
        on ``model``; where composition is on but cannot run, ``stats.sections_lost`` says why."""
        if sections is None or not self.enabled:
            return False
        from .._llama import composing

        why = self.why_off(can_shift=composing.can_shift(model))
        if why:
            stats.sections_lost = [why] * len(sections.ends)
            stats.notes.append(why)
        return not why

    def release(self, memory) -> None:
        """Clear ``memory`` where a composition made it: prefix reuse takes only exactly computed states."""
        if self.composed:
            memory.clear()
            self.composed = ()

    def states(self, tokens: Sequence[int], sections: Sections) -> SectionStates:
        return SectionStates(self.store, self._namespace(), tokens[:sections.head])

    def plan(self, memory: Sequence[int], tokens: Sequence[int], sections: Sections) -> SectionPlan:
        """What a run now would reuse (memory, saved states), running nothing and counting no miss."""
        held, held_tokens = self._held(memory, tokens, sections)
        if not held_tokens and self._saved_head(tokens[:sections.head]):
            held_tokens = sections.head
        pieces = sections.pieces(tokens)
        states = self.states(tokens, sections)
        try:
            saved = tuple(states.held(pieces[held:]))
        finally:
            states.close()
        return SectionPlan(held, held_tokens, saved, tuple(len(p) for p in pieces))

    def held(self, memory: Sequence[int], tokens: Sequence[int], sections: Sections) -> int:
        """Tokens of the prompt (head and whole sections) ``memory`` holds as composing it would leave them."""
        return self._held(memory, tokens, sections)[1]

    def _held(self, memory: Sequence[int], tokens: Sequence[int], sections: Sections) -> tuple[int, int]:
        """Sections (and tokens, with the head) the memory holds as this composition would make them."""
        n = common_prefix(self.composed, tokens, sections.end)
        n = min(n, common_prefix(memory, tokens, sections.end))
        if n < sections.head:
            return 0, 0
        held = sum(1 for e in sections.ends if e <= n)
        return held, (sections.ends[held - 1] if held else sections.head)

    def run(self, model, memory, tokens: Sequence[int], sections: Sections, stats: EngineStats,
            prefill: Callable[[Sequence[int], int], None]) -> Composed:
        """Bring ``memory`` (a :class:`~.reuse.Memory` on ``model``) to the prompt's documents part,
        composed; ``prefill(tokens, start)`` decodes the head where the memory does not hold it.
        Fills the composition's figures into ``stats``."""
        from .compose import compose  # llama.cpp's memory API: imported once a model runs

        model.synchronize()
        model.reset_timings()  # composing's decodes (new sections, seams) are the prompt's prefill
        held, held_tokens = self._held(memory.tokens, tokens, sections)
        if held_tokens and not memory.cut(held_tokens):
            held, held_tokens = 0, 0
        if held_tokens == 0:
            held_tokens = self._head(memory, tokens[:sections.head], prefill)
        self.composed = ()
        states = self.states(tokens, sections)
        t0 = time.perf_counter()
        try:
            done = compose(model, tokens[:sections.head], sections.pieces(tokens), states, self.seams, held=held)
        except BaseException:
            memory.clear()
            raise
        finally:
            states.close()
        memory.tokens = list(tokens[:sections.end])
        self.composed = tuple(memory.tokens)
        self.report(done, stats, held_tokens=held_tokens, states=states, seconds=time.perf_counter() - t0)
        return done

    @staticmethod
    def report(done: Composed, stats: EngineStats, *, held_tokens: int, states: SectionStates,
               seconds: float) -> None:
        stats.composed_sections = done.restored
        stats.recomputed_tokens = done.recomputed_tokens
        stats.cached_tokens = held_tokens + done.restored_tokens
        stats.cache = "composed"  # whatever it reused: cached_tokens and composed_sections say how much
        stats.sections_lost = list(done.lost)
        stats.states_saved += states.saved
        stats.cache_load_seconds += done.seconds["restore"]
        stats.notes.extend(states.notes)

    def warm(self, model, memory, head: Sequence[int], sections: Sequence[Sequence[int]],
             prefill: Callable[[Sequence[int], int], None],
             progress: Callable[[int, int], None] | None = None) -> dict:
        """Compute and save the state of each of ``sections`` (token lists) that has none, each on
        its own after ``head``, in order: what composed prompts restore. ``progress(done, total)``
        counts the sections' tokens. Leaves ``memory`` holding ``head``; raises EngineError where
        prompts are not composed (:meth:`why_off`)."""
        from ...errors import EngineError
        from .._llama import composing
        from .compose import compute

        why = self.why_off(can_shift=composing.can_shift(model))
        if why:
            raise EngineError(f"section states cannot be used: {why}")
        self.release(memory)
        if memory.tokens[:len(head)] != list(head) or not memory.cut(len(head)):
            self._head(memory, head, prefill)
        states = SectionStates(self.store, self._namespace(), head)
        total, done, computed, found, t0 = sum(map(len, sections)), 0, 0, 0, time.perf_counter()
        try:
            for tokens in sections:
                piece = Piece(tuple(tokens))
                if states.find(piece) is not None:
                    found += 1
                else:
                    compute(model, len(head), piece, states, scratch=1)
                    composing.seq_remove(model, 1)
                    computed += len(piece)
                done += len(piece)
                if progress is not None:
                    progress(done, total)
        finally:
            states.close()
        return {"sections": len(sections), "saved": states.saved, "cached": found,
                "tokens": total, "prefilled_tokens": computed, "bytes_written": states.saved_bytes,
                "seconds": round(time.perf_counter() - t0, 3), "notes": list(states.notes)}

    def _saved_head(self, head: Sequence[int]) -> bool:
        n = len(head)
        return self.store.lookup(self._namespace(), head, max_tokens=n, min_tokens=n, lengths={n},
                                 count=False) is not None

    def _head(self, memory, head: Sequence[int], prefill: Callable[[Sequence[int], int], None]) -> int:
        """Bring ``memory`` to exactly ``head``: its state restored from the store (its tokens, what it
        reused), else prefilled and saved (0)."""
        n = len(head)
        entry = self.store.lookup(self._namespace(), head, max_tokens=n, min_tokens=n, lengths={n}, count=False)
        if entry is not None and memory.restore(self.store, entry, head):
            return n
        memory.clear()
        prefill(head, 0)
        if not self.store.read_only:
            memory.save(self.store, self._namespace())
        return 0

    def forget(self) -> None:
        """The memory was changed some other way: nothing in it counts as composed."""
        self.composed = ()


__all__ = ["SectionPlan", "SectionReuse", "Sections"]  # (Sections from .seams)
