"""Exact prefix reuse: what a prompt keeps of the memory or restores from a saved state, and where it saves.

State is reused, restored and saved only at a prompt's cuts (:mod:`.shape`), and a prompt
is always prefilled in pieces split there, so an answer from a reused state is token
for token the answer without one.

:meth:`PrefixReuse.plan` decides (keep a prefix of what the memory holds, or restore a
longer state saved at a cut), running nothing; :meth:`PrefixReuse.apply` brings a
:class:`~.memory.Memory` to the plan (a state that fails its checks falls back to a full
prefill), and :meth:`PrefixReuse.advance` prefills up to the last cut, saving states at
the save points.

Models whose memory cannot be cut at an arbitrary position (recurrent and hybrid ones)
keep their memory only when it is exactly a prefix of the prompt ending at a cut;
otherwise they reuse a saved state, or prefill in full. For them states are also kept in
host memory (``ram``, :class:`~..cache.ram.RamStates`), consulted before the disk and given
every state saved or restored from disk, and saved at every section boundary of a
prompt (checkpoints), so a later question in a long-lived process restores without a
file (``stats.cache == "ram"``) from wherever its prompt leaves the earlier one.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

from ..contract import CacheKind, EngineStats
from .memory import Memory
from .plan import PrefixPlan, Restore
from ...records import PromptShape, common_prefix

if TYPE_CHECKING:
    from ..cache.index import Entry
    from ..cache.protocol import StateStore


_NOT_SAVED = "prefix state not saved: "
_NOT_SAVED_FULL = "prefix states not saved (no other is tried for this prompt): "


class PrefixReuse:
    """The prefix reuse of one engine over an optional disk store and host-memory store.

    States are looked up and saved only for prompts whose prefix has at least
    ``min_tokens`` tokens; a prompt saves its whole prefix and at most
    ``boundary_states`` earlier boundaries it prefilled (spread evenly; every one, in host
    memory, for a model that cannot cut its memory). ``namespace()`` names the model and
    settings the states belong to (computed on first use).
    """

    def __init__(self, store: StateStore | None, *, namespace: Callable[[], str], min_tokens: int = 256,
                 boundary_states: int = 4, ram: StateStore | None = None):
        self.store = store
        self.ram = ram if ram is not None and getattr(ram, "enabled", True) else None
        self.min_tokens = min_tokens
        self.boundary_states = boundary_states
        self._namespace = namespace

    def _disk(self) -> bool:
        return self.store is not None and not self.store.unavailable

    # -- deciding ---------------------------------------------------------------------------

    def uses_store(self, prefix_len: int) -> bool:
        """Whether a prompt sharing ``prefix_len`` tokens looks up and saves states.

        Recurrent and hybrid models qualify too: states are saved and restored exactly at
        cuts, never cut afterwards; in memory such a model cannot drop a previous question,
        so its next one restores the prefix from the store instead."""
        return (self._disk() or self.ram is not None) and prefix_len >= self.min_tokens

    def held(self, shape: PromptShape, memory: Memory) -> int:
        """How many tokens of the prompt ``memory`` holds, up to a cut the prompt may reuse."""
        if not shape.cuts:
            return 0
        return self._keepable(memory, shape)[0]

    def plan(self, shape: PromptShape, memory: Memory, *, probe: bool = False) -> PrefixPlan:
        """What the prompt would reuse: what ``memory`` holds of it up to a cut (with no cuts, any
        common prefix but the last token), or a longer state saved at a cut. ``probe``: a look
        that is not a use (the store counts no miss)."""
        keep, notes = self._keepable(memory, shape)
        cuts = shape.cuts
        if not cuts:
            return PrefixPlan(keep=keep, notes=notes)
        store = self.uses_store(cuts[-1]) and (self._disk() or memory.kind.checkpoints)
        if not store or keep >= cuts[-1]:
            return PrefixPlan(keep=keep, store=store, notes=notes)
        restore = self._lookup(shape, floor=max(keep + 1, self.min_tokens), ram=memory.kind.checkpoints, probe=probe)
        if restore is None:
            return PrefixPlan(keep=keep, store=True, missed=True,
                              lookup_error=self.store.last_error if self._disk() else "", notes=notes)
        return PrefixPlan(keep=keep, restore=restore, store=True, notes=notes)

    def _lookup(self, shape: PromptShape, *, floor: int, ram: bool, probe: bool) -> Restore | None:
        """The longest state saved at a cut, at least ``floor`` tokens: in host memory first (``ram``: a copy
        restores without reading a file), then on disk where the disk holds a longer one."""
        ns, tokens, cuts = self._namespace(), shape.tokens, shape.cuts
        at, best = set(cuts), None
        if ram and self.ram is not None:
            entry = self.ram.lookup(ns, tokens, max_tokens=cuts[-1], lengths=at, min_tokens=floor, count=not probe)
            if entry is not None:
                best, floor = Restore(self.ram, entry, source=CacheKind.RAM), entry.n_tokens + 1
        if not self._disk() or floor > cuts[-1]:
            return best
        entry = self.store.lookup(ns, tokens, max_tokens=cuts[-1], lengths=at, min_tokens=floor,
                                  count=not probe and best is None)
        if entry is not None and best is not None and not probe:  # now a use: counted as one
            entry = self.store.lookup(ns, tokens, max_tokens=entry.n_tokens, lengths={entry.n_tokens},
                                      min_tokens=entry.n_tokens) or entry
        return Restore(self.store, entry) if entry is not None else best

    def save_points(self, cuts: Sequence[int], start: int, *, every: bool = False) -> set[int]:
        """The cuts after ``start`` to save a state at: the last, and at most ``boundary_states`` others,
        spread evenly from the first (``every``: all of them); none shorter than ``min_tokens``."""
        eligible = [c for c in cuts if c > start and c >= self.min_tokens]
        if not eligible:
            return set()
        out = {cuts[-1]} & set(eligible)
        inner = [c for c in eligible if c != cuts[-1]]
        k = len(inner) if every else self.boundary_states
        if len(inner) <= k:
            out.update(inner)
        elif k == 1:
            out.add(inner[len(inner) // 2])
        elif k > 1:
            out.update(inner[round(i * (len(inner) - 1) / (k - 1))] for i in range(k))
        return out

    def _keepable(self, memory: Memory, shape: PromptShape) -> tuple[int, tuple[str, ...]]:
        """What the memory can keep of the prompt, up to a cut (no cuts: any common prefix but the last
        token), and why it keeps less than it shares."""
        held, tokens, cuts = memory.exact, shape.tokens, shape.cuts
        if cuts:
            n = common_prefix(held, tokens, cuts[-1])
            n = max((c for c in cuts if c <= n), default=0)
        else:
            n = common_prefix(held, tokens, len(tokens) - 1)
        keep = memory.kind.keepable(n, len(held))
        if keep < n:
            return keep, (f"this model's memory ({memory.kind.name}) cannot be cut at token {n}: "
                          "only a saved prefix state can be reused",)
        return keep, ()

    # -- carrying a plan out ----------------------------------------------------------------

    def apply(self, plan: PrefixPlan, shape: PromptShape, memory: Memory, stats: EngineStats) -> PrefixPlan:
        """Bring ``memory`` to ``plan``; returns the plan as carried out. A restored state that fails
        its checks falls back to a full prefill; a cut llama.cpp refuses (sliding-window layers
        dropped cells) to a state saved at an earlier cut, else a full prefill. What went wrong
        is noted in ``stats`` (the store's faults) or the returned plan's ``notes``."""
        if memory.composed:
            memory.clear()  # prefix reuse takes only exactly computed memory
        if plan.restore is not None:
            if memory.restore(plan.restore.store, plan.restore.entry, shape.tokens):
                stats.cache_load_seconds = plan.restore.store.last_load_seconds
                if plan.restore.source is not CacheKind.RAM:
                    self._keep_in_ram(memory)
                return plan
            if plan.restore.source is CacheKind.RAM:  # evicted meanwhile by another engine of the pool: the disk's
                again = self._lookup(shape, floor=self.min_tokens, ram=False, probe=False)
                return self.apply(replace(plan, keep=0, restore=again, missed=again is None), shape, memory, stats)
            stats.notes.append(f"a cached prefix state was ignored and deleted: {plan.restore.store.last_error}")
            return replace(plan, keep=0, restore=None, missed=True)
        if plan.keep == 0:
            memory.clear()
            return plan
        if memory.cut(plan.keep):
            return plan
        memory.clear()
        notes = plan.notes + (f"the KV memory could not be cut at token {plan.keep} (sliding window?): "
                              "full prefill",)
        if not plan.store:
            return replace(plan, keep=0, notes=notes)
        again = self.plan(shape, memory, probe=True)  # one miss counted
        again = replace(again, missed=True, notes=notes, lookup_error=plan.lookup_error or again.lookup_error)
        return self.apply(again, shape, memory, stats) if again.restore is not None else again

    def prepare(self, plan: PrefixPlan, shape: PromptShape, memory: Memory, stats: EngineStats) -> PrefixPlan:
        """Carry ``plan`` out, filling ``stats.cache``, ``cached_tokens`` and the store's faults; returns
        the plan carried out (its ``notes`` are for the caller to report)."""
        done = self.apply(plan, shape, memory, stats)
        if done.lookup_error:
            stats.notes.append(done.lookup_error)
        if done.source is not CacheKind.NONE:
            stats.cache = done.source
        stats.cached_tokens = done.reused
        return done

    def advance(self, plan: PrefixPlan, shape: PromptShape, memory: Memory, stats: EngineStats,
                prefill: Callable[[Sequence[int], int], None]) -> set[int]:
        """Carry ``plan`` on from what :meth:`apply` left in ``memory``: prefill up to its last cut, piece
        by piece at every cut (``prefill(tokens, start)`` decodes ``tokens[start:]``), saving states at
        :meth:`save_points` where the plan uses the store. Returns the cuts saved now."""
        saved: set[int] = set()
        tokens, cuts = shape.tokens, shape.cuts
        checkpoints = memory.kind.checkpoints and self.ram is not None
        points = self.save_points(cuts, len(memory.tokens), every=checkpoints) if plan.store else set()
        disk_points = self.save_points(cuts, len(memory.tokens)) if plan.store else set()
        for cut in cuts:
            if cut <= len(memory.tokens):
                continue
            prefill(tokens[:cut], len(memory.tokens))
            if cut not in points:
                continue
            memory.synchronize()  # the prefill is booked as prefill, the save is not
            t0, wall = time.perf_counter(), time.time()
            entry = self._save(memory, stats, disk=cut in disk_points)
            stats.cache_save_seconds += time.perf_counter() - t0
            if entry is not None and entry.created >= wall:  # not one saved before (save then only marks it used)
                stats.states_saved += 1
                saved.add(cut)
        return saved

    def _save(self, memory: Memory, stats: EngineStats, *, disk: bool = True) -> Entry | None:
        """Save what the memory holds (on disk, and in host memory for a model that cannot cut its memory);
        a failure costs a note, never the answer."""
        entry = None
        full = any(n.startswith(_NOT_SAVED_FULL) for n in stats.notes)  # said once; no other write is tried
        if disk and self._disk() and not self.store.read_only and not full:  # (read-only: said when opened)
            entry = memory.save(self.store, self._namespace())
            if entry is None and self.store.last_error:
                said = _NOT_SAVED_FULL if getattr(self.store, "disk_full", False) else _NOT_SAVED
                stats.notes.append(said + self.store.last_error)
        kept = self._keep_in_ram(memory)
        return entry if entry is not None else kept

    def _keep_in_ram(self, memory: Memory) -> Entry | None:
        """A copy of what the memory holds in the host-memory store, for a model that cannot cut its memory
        (others reuse their KV cache in place)."""
        if self.ram is None or not memory.kind.checkpoints:
            return None
        return memory.save(self.ram, self._namespace())

    def has(self, tokens: Sequence[int]) -> bool:
        """Whether a state of exactly ``tokens`` is saved (host memory or disk)."""
        ns = self._namespace()
        return any(s is not None and not s.unavailable and s.find(ns, tokens) is not None
                   for s in (self.ram, self.store if self._disk() else None))

    def store_notes(self, prefix_len: int) -> list[str]:
        """What the store has to say about this prompt: faults it handled, or why it was not used."""
        if self.store is None:
            return []
        if self.store.unavailable and prefix_len >= self.min_tokens:
            return [f"the prefix cache is unavailable ({self.store.unavailable}): answered without it"]
        return self.store.take_notes()


__all__ = ["PrefixReuse"]
