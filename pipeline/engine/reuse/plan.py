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

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..contract import CacheKind
from .budget import Refusal
from ...records import PromptShape

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
    """Composition, as it will be carried out: the first ``held`` sections stay in memory as a composition
    left them (``held_tokens`` with the head); else the head's state is restored (``head``) or, with none
    saved, the head is prefilled. Each other section (``sizes``) is restored from its state where one is
    saved (``saved``) or computed on its own and saved; the tokens at ``seams`` (prompt positions) are
    decoded again."""

    held: int
    held_tokens: int
    saved: tuple[bool, ...]
    sizes: tuple[int, ...]
    seams: tuple[int, ...] = ()
    head: Restore | None = None

    @property
    def restorable_tokens(self) -> int:
        return sum(n for n, ok in zip(self.sizes[self.held:], self.saved) if ok)

    @property
    def missing_tokens(self) -> int:
        """Tokens of sections computed now (no state yet)."""
        return sum(n for n, ok in zip(self.sizes[self.held:], self.saved) if not ok)

    @property
    def reused(self) -> int:
        """Tokens this prompt would not prefill (held, or restored with the head; seams aside)."""
        kept = self.held_tokens or (self.head.entry.n_tokens if self.head is not None else 0)
        return kept + self.restorable_tokens


class Need(str, enum.Enum):
    """What a prompt needs of its plan (the one question asked of the planner)."""

    ANSWER = "answer"  # the planner chooses: exact or composed, by the policy and the predicted time
    EXACT = "exact"  # exact prefill: what a calibration compares against, a warmed prefix, shared sequences
    COMPOSED = "composed"  # composed wherever the model can (a calibration's measurement)


@dataclass(frozen=True)
class ReusePlan:
    """One prompt's plan, carried out as it is: ``composed`` where the prompt is composed, else ``exact``
    (always planned: what prefix reuse does). ``refusal`` says why a sections-mode prompt is not composed.
    ``seconds`` are the predicted times to the first token of each way planned (``"exact"``, and
    ``"composed"`` where composition was weighed); ``calibrate``: this prompt's exact answer is recorded
    to measure composition by (:mod:`.calibrate`)."""

    shape: PromptShape
    exact: PrefixPlan
    composed: SectionsPlan | None = None
    refusal: Refusal | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    calibrate: bool = False

    @property
    def reused(self) -> int:
        return self.composed.reused if self.composed is not None else self.exact.reused

    @property
    def kind(self) -> CacheKind:
        return CacheKind.COMPOSED if self.composed is not None else self.exact.source

    @property
    def way(self) -> str:
        return "composed" if self.composed is not None else "exact"

    @property
    def predicted_seconds(self) -> float:
        """The predicted time to the first token of the way chosen."""
        return self.seconds.get(self.way, 0.0)

    @property
    def lost_sections(self) -> int:
        """Sections computed now for want of composing (those the exact prefix does not cover)."""
        s = self.shape.sections
        if self.refusal is None or s is None:
            return 0
        return sum(1 for end in s.ends if end > self.exact.reused)


__all__ = ["Need", "PrefixPlan", "ReusePlan", "Restore", "SectionsPlan"]
