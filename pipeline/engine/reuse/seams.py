"""Which tokens of a composed prompt are decoded again: the sections as a prompt places them, and the seams.

:class:`Sections` says where a sections-mode prompt's head and sections are (what the ask
path passes a generator); :class:`Piece` is one section as a prompt places it. A section
restored from its state and moved to another place in a prompt did not attend to the
sections now before it (:mod:`.compose`). :class:`Seams` names the tokens of each moved
section that are decoded again at their place, so that they attend to everything before them; :func:`seam_positions` turns that choice into prompt positions, and
:func:`runs` into the consecutive runs they are decoded in. Nothing here touches llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

STRATEGIES = ("none", "first", "last", "headers", "focus", "whole")
"""How a moved section's tokens are chosen for recompute (:class:`Seams`); ``+`` combines them."""


@dataclass(frozen=True)
class Piece:
    """A section as a prompt places it: its tokens; which of them are its header (offsets), for the
    ``headers`` strategy; and which matter most to the question (offsets, most relevant first: the
    passages retrieval found in it), for the ``focus`` strategy. Only ``tokens`` identify its state."""

    tokens: tuple[int, ...]
    headers: tuple[int, ...] = ()
    focus: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Seams:
    """Which tokens of each moved section are decoded again at their place.

    ``first``: the first ``r`` of each moved section; ``last``: the last ``r`` per moved
    section before the question, all of them at the end of the documents; ``headers``: each
    moved section's header tokens; ``focus``: the first ``r`` of each moved section's
    question-relevant tokens (:attr:`Piece.focus`); ``whole``: every token of every moved
    section (exact, the check of the plumbing); ``none``: nothing. ``"first+last"`` takes
    the union.
    """

    strategy: str = "first"
    r: int = 16

    def __post_init__(self) -> None:
        parts = self.strategy.split("+")
        unknown = [p for p in parts if p not in STRATEGIES]
        if unknown or not parts:
            raise ValueError(f"unknown seam strategy {self.strategy!r}; use {', '.join(STRATEGIES)} (joined by +)")
        if self.r < 0:
            raise ValueError(f"the seam window must be >= 0, got {self.r}")


def seam_positions(seams: Seams, places: Sequence[tuple[int, Piece]]) -> list[int]:
    """The prompt positions :class:`Seams` recomputes, for moved sections at ``places``
    (each section's first position and the section), ascending."""
    if not places:
        return []
    chosen: set[int] = set()
    end = places[-1][0] + len(places[-1][1])
    for part in seams.strategy.split("+"):
        for start, piece in places:
            n = len(piece)
            if part == "first":
                chosen.update(range(start, start + min(seams.r, n)))
            elif part == "headers":
                chosen.update(start + i for i in piece.headers if 0 <= i < n)
            elif part == "focus":
                chosen.update(start + i for i in piece.focus[:seams.r] if 0 <= i < n)
            elif part == "whole":
                chosen.update(range(start, start + n))
        if part == "last":
            chosen.update(range(max(places[0][0], end - seams.r * len(places)), end))
    return sorted(chosen)


def runs(positions: Sequence[int], bounds: Sequence[int] = ()) -> list[tuple[int, int]]:
    """Ascending ``positions`` as runs ``[a, b)`` of consecutive positions, cut at ``bounds``
    (section starts: a section's tokens are always decoded from its own start, as exact prefill does)."""
    cuts = set(bounds)
    out: list[tuple[int, int]] = []
    for p in positions:
        if out and out[-1][1] == p and p not in cuts:
            out[-1] = (out[-1][0], p + 1)
        else:
            out.append((p, p + 1))
    return out



@dataclass(frozen=True)
class Sections:
    """Where a sections-mode prompt's sections are: ``tokens[:head]`` is the head, section ``i``
    ends at ``ends[i]`` (the first starts at ``head``; the last end is the documents' end).
    ``headers`` and ``focus`` are, per section, offsets of its header tokens and of the tokens
    most relevant to the question (best first), for the seam strategies that use them."""

    head: int
    ends: tuple[int, ...]
    headers: tuple[tuple[int, ...], ...] = ()
    focus: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        bounds = (self.head, *self.ends)
        if not self.ends or self.head < 1 or any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"sections must follow a head and each other: head {self.head}, ends {self.ends}")

    @property
    def end(self) -> int:
        return self.ends[-1]

    def pieces(self, tokens: Sequence[int]) -> list[Piece]:
        starts = (self.head, *self.ends[:-1])
        return [Piece(tuple(tokens[a:b]),
                      headers=self.headers[i] if i < len(self.headers) else (),
                      focus=self.focus[i] if i < len(self.focus) else ())
                for i, (a, b) in enumerate(zip(starts, self.ends))]


__all__ = ["Piece", "STRATEGIES", "Seams", "Sections", "runs", "seam_positions"]
