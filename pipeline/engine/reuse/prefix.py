"""The prefix-reuse policy: what a prompt reuses, from where, and where its states are saved.

A prompt is its tokens and its *cuts*: the positions where a part shared with other
prompts may end (each boundary within its prefix, and the prefix's end), never its last
token (sampling needs one decoded token). State is reused, restored and saved only at
cuts, and a prompt is always prefilled in pieces split there, so an answer from a
reused state is token for token the answer without one.

The policy answers three questions, each in one place:

* what the memory holds of a prompt, up to a cut: :meth:`ReusePolicy.held` (memory only:
  what a pool of engines routes prompts by);
* what a prompt would reuse and from where: :meth:`ReusePolicy.plan` makes a
  :class:`Plan` (keep a prefix of what the memory holds, or restore a longer saved
  state from the store), without running anything; :meth:`ReusePolicy.reusable` is its
  size, what a packer weighs candidate prompts by;
* where states are saved as the prefill passes them: :meth:`ReusePolicy.save_points`.

Carrying a plan out is separate: :meth:`ReusePolicy.apply` brings a :class:`Memory` to
the plan (cut it, or restore the state; a state that fails its checks falls back to a
full prefill), :meth:`ReusePolicy.prepare` is plan-then-apply with the prompt's figures,
and :meth:`ReusePolicy.advance` prefills up to the last cut, saving states at the save
points.

Models whose memory cannot be cut at an arbitrary position (recurrent and hybrid ones)
keep their memory only when it is exactly a prefix of the prompt ending at a cut;
otherwise they reuse a saved state, or prefill in full. For them the policy also keeps
copies of boundary states in host memory (``ram``, a second :class:`StateStore`:
:class:`~.cache.ram.RamStates`), consulted before the disk and given every state saved
or restored from disk, so a later question in a long-lived process restores without a
file (``stats.cache == "ram"``).

Where this grows: a plan is "what to reuse from where", so new sources are new parts of
a plan and new branches of :meth:`~ReusePolicy.apply`, not a new policy. Section states
composed into a prompt (each restored, shifted to its place, joined through a scratch
sequence) would be restores at positions other than 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Collection, Protocol, Sequence

from ..contract import EngineStats

if TYPE_CHECKING:
    from .._llama import Model
    from ..cache.index import Entry


def cuts(n_tokens: int, prefix_len: int, boundaries: Sequence[int]) -> list[int]:
    """A prompt's cuts: the boundaries within its prefix and the prefix's end, one token left to decode."""
    limit = min(prefix_len, n_tokens - 1)
    if limit <= 0:
        return []
    return sorted({int(b) for b in boundaries if 0 < b < limit} | {limit})


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n, limit = 0, min(len(a), len(b), limit)
    while n < limit and a[n] == b[n]:
        n += 1
    return n


class StateStore(Protocol):
    """Where saved prefix states live (:class:`~.cache.store.PrefixCache` on disk)."""

    unavailable: str
    last_error: str
    last_load_seconds: float

    @property
    def read_only(self) -> bool: ...

    def lookup(self, namespace: str, tokens: Sequence[int], *, max_tokens: int | None = None,
               min_tokens: int = 1, lengths: Collection[int] | None = None, count: bool = True) -> Entry | None: ...

    def load(self, entry: Entry, model: Model, *, seq: int = 0) -> bool: ...

    def save(self, namespace: str, tokens: Sequence[int], model: Model, *, seq: int = 0) -> Entry | None: ...

    def take_notes(self) -> list[str]: ...


class Memory:
    """Sequence 0 of one llama.cpp context as reuse sees it: the tokens it holds, position by position.

    ``model`` is the loaded model, None until its owner (the engine) loads it: an unloaded
    model holds nothing. Not thread-safe: the owner calls it within its turn.
    """

    def __init__(self) -> None:
        self.model: Model | None = None
        self.tokens: list[int] = []

    def _loaded(self) -> Model:
        if self.model is None:
            raise RuntimeError("the model is not loaded")
        return self.model

    @property
    def can_trim(self) -> bool:
        """Whether the memory can be cut at any position (assumed until the model is loaded)."""
        return self.model.can_trim if self.model is not None else True

    def clear(self) -> None:
        if self.model is not None:
            self.model.clear()
        self.tokens = []

    def cut(self, n: int) -> bool:
        """Keep the first ``n`` tokens; False (and the memory unchanged) where llama.cpp cannot cut there."""
        if n >= len(self.tokens):
            return True
        if not self._loaded().trim(n):
            return False
        del self.tokens[n:]
        return True

    def restore(self, store: StateStore, entry: Entry, tokens: Sequence[int]) -> bool:
        """Load ``entry`` (a saved state of ``tokens[:entry.n_tokens]``) in place of what the memory holds;
        False (and the memory empty) when the state failed its checks."""
        self.clear()
        if not store.load(entry, self._loaded()):
            self.clear()
            return False
        self.tokens = list(tokens[:entry.n_tokens])
        return True

    def synchronize(self) -> None:
        """Wait for pending decodes: llama.cpp books their time when they are synchronised."""
        self._loaded().synchronize()

    def save(self, store: StateStore, namespace: str) -> Entry | None:
        """Save what the memory holds now (the store checks that the sequence ends where it should)."""
        return store.save(namespace, self.tokens, self._loaded())


@dataclass(frozen=True)
class Restore:
    """A saved state a plan loads: ``entry`` of ``store``, the prompt's first ``entry.n_tokens`` tokens."""

    store: StateStore
    entry: Entry
    source: str = "disk"


@dataclass(frozen=True)
class Plan:
    """What one prompt reuses and from where, decided before anything runs.

    ``keep`` tokens of what the memory holds stay as they are (the rest is cut off; 0:
    the memory is cleared), unless ``restore`` names a longer saved state to load
    instead. ``store`` says whether the state store takes part in this prompt (states
    are looked up and saved); ``missed`` that a lookup found nothing better than the
    memory, and ``lookup_error`` why, where the store failed. ``notes`` say why the
    memory keeps less than it shares with the prompt.
    """

    tokens: Sequence[int]
    cuts: tuple[int, ...]
    keep: int = 0
    restore: Restore | None = None
    store: bool = False
    missed: bool = False
    lookup_error: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def reused(self) -> int:
        return self.restore.entry.n_tokens if self.restore is not None else self.keep

    @property
    def source(self) -> str:
        """``disk`` (a restore), ``miss`` (looked up, nothing better found), ``memory`` or ``none``."""
        if self.restore is not None:
            return self.restore.source
        if self.missed:
            return "miss"
        return "memory" if self.keep else "none"


class ReusePolicy:
    """The prefix-reuse policy of one engine over an optional :class:`StateStore`.

    States are looked up and saved only for prompts whose prefix has at least
    ``min_tokens`` tokens; a prompt saves its whole prefix and at most
    ``boundary_states`` earlier boundaries it prefilled (spread evenly). ``namespace()``
    names the model and settings the states belong to (computed on first use). ``ram``
    (host-memory copies, for models that cannot cut their memory) is consulted first.
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

    def held(self, memory: Sequence[int], tokens: Sequence[int], cuts: Sequence[int], *, can_trim: bool) -> int:
        """How many tokens of the prompt ``memory`` holds, up to a cut the prompt may reuse."""
        if not cuts:
            return 0
        return self._keepable(memory, tokens, cuts, can_trim=can_trim)[0]

    def plan(self, memory: Sequence[int], tokens: Sequence[int], cuts: Sequence[int], *, can_trim: bool,
             probe: bool = False) -> Plan:
        """What the prompt would reuse: what ``memory`` holds of it up to a cut (with no cuts, any
        common prefix but the last token), or a longer state saved at a cut. ``probe``: a look
        that is not a use (the store counts no miss)."""
        keep, notes = self._keepable(memory, tokens, cuts, can_trim=can_trim)
        if not cuts:
            return Plan(tokens, (), keep=keep, notes=notes)
        store = self.uses_store(cuts[-1]) and (self._disk() or not can_trim)  # RAM states: uncuttable models
        if not store or keep >= cuts[-1]:
            return Plan(tokens, tuple(cuts), keep=keep, store=store, notes=notes)
        restore = self._lookup(tokens, cuts, floor=max(keep + 1, self.min_tokens), ram=not can_trim, probe=probe)
        if restore is None:
            return Plan(tokens, tuple(cuts), keep=keep, store=True, missed=True,
                        lookup_error=self.store.last_error if self._disk() else "", notes=notes)
        return Plan(tokens, tuple(cuts), keep=keep, restore=restore, store=True, notes=notes)

    def _lookup(self, tokens: Sequence[int], cuts: Sequence[int], *, floor: int, ram: bool,
                probe: bool) -> Restore | None:
        """The longest state saved at a cut, at least ``floor`` tokens: in host memory first (``ram``: a copy
        restores without reading a file), then on disk where the disk holds a longer one."""
        ns, at = self._namespace(), set(cuts)
        best = None
        if ram and self.ram is not None:
            entry = self.ram.lookup(ns, tokens, max_tokens=cuts[-1], lengths=at, min_tokens=floor, count=not probe)
            if entry is not None:
                best, floor = Restore(self.ram, entry, source="ram"), entry.n_tokens + 1
        if not self._disk() or floor > cuts[-1]:
            return best
        entry = self.store.lookup(ns, tokens, max_tokens=cuts[-1], lengths=at, min_tokens=floor,
                                  count=not probe and best is None)
        if entry is not None and best is not None and not probe:  # now a use: counted as one
            entry = self.store.lookup(ns, tokens, max_tokens=entry.n_tokens, lengths={entry.n_tokens},
                                      min_tokens=entry.n_tokens) or entry
        return Restore(self.store, entry) if entry is not None else best

    def reusable(self, memory: Sequence[int], tokens: Sequence[int], cuts: Sequence[int], *,
                 can_trim: bool) -> int:
        """How many tokens of the prompt a run now would reuse (memory or store), running nothing."""
        if not cuts:
            return 0
        return self.plan(memory, tokens, cuts, can_trim=can_trim, probe=True).reused

    def save_points(self, cuts: Sequence[int], start: int) -> set[int]:
        """The cuts after ``start`` to save a state at: the last, and at most ``boundary_states`` others,
        spread evenly from the first; none shorter than ``min_tokens``."""
        eligible = [c for c in cuts if c > start and c >= self.min_tokens]
        if not eligible:
            return set()
        out = {cuts[-1]} & set(eligible)
        inner = [c for c in eligible if c != cuts[-1]]
        k = self.boundary_states
        if len(inner) <= k:
            out.update(inner)
        elif k == 1:
            out.add(inner[len(inner) // 2])
        elif k > 1:
            out.update(inner[round(i * (len(inner) - 1) / (k - 1))] for i in range(k))
        return out

    def _keepable(self, memory: Sequence[int], tokens: Sequence[int], cuts: Sequence[int], *,
                  can_trim: bool) -> tuple[int, tuple[str, ...]]:
        """What the memory can keep of the prompt, up to a cut (no cuts: any common prefix but the last
        token), and why it keeps less than it shares."""
        if cuts:
            n = common_prefix(memory, tokens, cuts[-1])
            n = max((c for c in cuts if c <= n), default=0)
        else:
            n = common_prefix(memory, tokens, len(tokens) - 1)
        if n == len(memory) or can_trim:
            return n, ()
        if n:
            return 0, (f"this model's memory (recurrent/hybrid) cannot be cut at token {n}: "
                       "only a saved prefix state can be reused",)
        return 0, ()

    # -- carrying a plan out ----------------------------------------------------------------

    def apply(self, plan: Plan, memory: Memory, stats: EngineStats) -> Plan:
        """Bring ``memory`` to ``plan``; returns the plan as carried out. A restored state that fails
        its checks falls back to a full prefill; a cut llama.cpp refuses (sliding-window layers
        dropped cells) to a state saved at an earlier cut, else a full prefill. What went wrong
        is noted in ``stats`` (the store's faults) or the returned plan's ``notes``."""
        if plan.restore is not None:
            if memory.restore(plan.restore.store, plan.restore.entry, plan.tokens):
                stats.cache_load_seconds = plan.restore.store.last_load_seconds
                if plan.restore.source != "ram":
                    self._keep_in_ram(memory)
                return plan
            if plan.restore.source == "ram":  # evicted meanwhile by another engine of the pool: the disk's
                again = self._lookup(plan.tokens, plan.cuts, floor=self.min_tokens, ram=False, probe=False)
                return self.apply(replace(plan, keep=0, restore=again, missed=again is None), memory, stats)
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
        again = self.plan([], plan.tokens, plan.cuts, can_trim=memory.can_trim, probe=True)  # one miss counted
        again = replace(again, missed=True, notes=notes, lookup_error=plan.lookup_error or again.lookup_error)
        return self.apply(again, memory, stats) if again.restore is not None else again

    def prepare(self, memory: Memory, tokens: Sequence[int], cuts: Sequence[int], stats: EngineStats) -> Plan:
        """Plan the prompt's reuse and carry it out, filling ``stats.cache``, ``cached_tokens`` and the
        store's faults; returns the plan carried out (its ``notes`` are for the caller to report)."""
        plan = self.plan(memory.tokens, tokens, cuts, can_trim=memory.can_trim)
        done = self.apply(plan, memory, stats)
        if done.lookup_error:
            stats.notes.append(done.lookup_error)
        if done.source != "none":
            stats.cache = done.source
        stats.cached_tokens = done.reused
        return done

    def advance(self, plan: Plan, memory: Memory, stats: EngineStats,
                prefill: Callable[[Sequence[int], int], None]) -> set[int]:
        """Carry ``plan`` on from what :meth:`apply` left in ``memory``: prefill up to its last cut, piece
        by piece at every cut (``prefill(tokens, start)`` decodes ``tokens[start:]``), saving states at
        :meth:`save_points` where the plan uses the store. Returns the cuts saved now."""
        saved: set[int] = set()
        tokens, cuts = plan.tokens, plan.cuts
        points = self.save_points(cuts, len(memory.tokens)) if plan.store else set()
        for cut in cuts:
            if cut <= len(memory.tokens):
                continue
            prefill(tokens[:cut], len(memory.tokens))
            if cut not in points:
                continue
            memory.synchronize()  # the prefill is booked as prefill, the save is not
            t0, wall = time.perf_counter(), time.time()
            entry = self._save(memory, stats)
            stats.cache_save_seconds += time.perf_counter() - t0
            if entry is not None and entry.created >= wall:  # not one saved before (save then only marks it used)
                stats.states_saved += 1
                saved.add(cut)
        return saved

    def _save(self, memory: Memory, stats: EngineStats) -> Entry | None:
        """Save what the memory holds (on disk, and in host memory for a model that cannot cut its memory);
        a failure costs a note, never the answer."""
        entry = None
        if self._disk() and not self.store.read_only:  # a read-only store was said once, when it was opened
            entry = memory.save(self.store, self._namespace())
            if entry is None and self.store.last_error:
                stats.notes.append(f"prefix state not saved: {self.store.last_error}")
        kept = self._keep_in_ram(memory)
        return entry if entry is not None else kept

    def _keep_in_ram(self, memory: Memory) -> Entry | None:
        """A copy of what the memory holds in the host-memory store, for a model that cannot cut its memory
        (others reuse their KV cache in place)."""
        if self.ram is None or memory.can_trim:
            return None
        return memory.save(self.ram, self._namespace())

    def store_notes(self, prefix_len: int) -> list[str]:
        """What the store has to say about this prompt: faults it handled, or why it was not used."""
        if self.store is None:
            return []
        if self.store.unavailable and prefix_len >= self.min_tokens:
            return [f"the prefix cache is unavailable ({self.store.unavailable}): answered without it"]
        return self.store.take_notes()


__all__ = ["Memory", "Plan", "Restore", "ReusePolicy", "StateStore", "common_prefix", "cuts"]
