"""What one prompt reuses and from where, decided before anything runs: a :class:`ReusePlan`.

A plan is one of two ways to bring the KV memory to a prompt's documents part, each
with its predicted time to the first token:

* **exact** (:class:`PrefixPlan`): keep what the memory holds up to a cut, or restore the
  longest state saved at a cut (host memory or disk); prefill the rest;
* **composed** (:class:`SectionsPlan`, sections-mode prompts only): keep the sections a
  composition left in memory, restore every other section's own state, compute those
  that have none, recompute the seams; prefill the question.

:class:`~.planner.Planner` makes it; the engine carries it out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contract import CacheKind
from .budget import Refusal
from .shape import PromptShape

if TYPE_CHECKING:
    from ..cache.index import Entry
    from ..cache.protocol import StateStore


@dataclass(frozen=True)
class Restore:
    """A saved state a plan loads: ``entry`` of ``store``, the prompt's first ``entry.n_tokens`` tokens."""

    store: StateStore
    entry: Entry
    source: CacheKind = CacheKind.DISK


@dataclass(frozen=True)
class PrefixPlan:
    """Exact reuse: ``keep`` tokens of what the memory holds stay (the rest is cut off; 0: the memory
    is cleared), unless ``restore`` names a longer saved state to load instead. ``store``: states are
    looked up and saved for this prompt; ``missed``: a lookup found nothing better than the memory,
    and ``lookup_error`` why, where the store failed. ``notes`` say why the memory keeps less than it
    shares with the prompt."""

    keep: int = 0
    restore: Restore | None = None
    store: bool = False
    missed: bool = False
    lookup_error: str = ""
    notes: tuple[str, ...] = ()

    @property
    def reused(self) -> int:
        return self.restore.entry.n_tokens if self.restore is not None else self.keep

    @property
    def source(self) -> CacheKind:
        """Where the reused state comes from (``miss``: looked up, nothing better found)."""
        if self.restore is not None:
            return self.restore.source
        if self.missed:
            return CacheKind.MISS
        return CacheKind.MEMORY if self.keep else CacheKind.NONE


@dataclass(frozen=True)
class SectionsPlan:
    """Composition: ``held`` sections kept in memory (``held_tokens`` with the head), and for each
    other section (``sizes``) whether a state is saved; ``seams`` tokens recomputed."""

    held: int
    held_tokens: int
    saved: tuple[bool, ...]
    sizes: tuple[int, ...]
    seams: int = 0

    @property
    def restorable_tokens(self) -> int:
        return sum(n for n, ok in zip(self.sizes[self.held:], self.saved) if ok)

    @property
    def missing_tokens(self) -> int:
        """Tokens of sections computed now (no state yet)."""
        return sum(n for n, ok in zip(self.sizes[self.held:], self.saved) if not ok)

    @property
    def reused(self) -> int:
        """Tokens this prompt would not prefill (held or restored; seams aside)."""
        return self.held_tokens + self.restorable_tokens


@dataclass(frozen=True)
class ReusePlan:
    """One prompt's plan: ``exact`` always (what prefix reuse would do), ``composed`` where the prompt is
    composed (None: prefilled exactly, ``refusal`` says why a sections-mode prompt is not). ``seconds``
    are the predicted times to the first token of each way, exact first (what the choice was made by)."""

    shape: PromptShape
    exact: PrefixPlan
    composed: SectionsPlan | None = None
    refusal: Refusal | None = None
    seconds: tuple[float, ...] = field(default=())

    @property
    def reused(self) -> int:
        return self.composed.reused if self.composed is not None else self.exact.reused

    @property
    def kind(self) -> CacheKind:
        return CacheKind.COMPOSED if self.composed is not None else self.exact.source

    def describe(self) -> str:
        """One line for people: the way chosen and the predicted seconds of each."""
        if len(self.seconds) < 2:
            return ""
        exact, composed = self.seconds[:2]
        way = "composed" if self.composed is not None else "exact"
        return f"planned {way}: predicted {composed:.2f} s composed, {exact:.2f} s exact"


__all__ = ["PrefixPlan", "ReusePlan", "Restore", "SectionsPlan"]
