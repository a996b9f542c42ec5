"""Which tokens of a composed prompt are decoded again at the seams.

A section restored from its state and moved to another place in a prompt did not attend to the
sections now before it (:mod:`.compose`). :class:`Seams` names the tokens of each moved
section that are decoded again at their place, so that they attend to everything before them; :func:`seam_positions` turns that choice into prompt positions, and
:func:`runs` into the consecutive runs they are decoded in. Nothing here touches llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...records import Piece

STRATEGIES = ("none", "first", "last", "headers", "focus", "whole")
"""How a moved section's tokens are chosen for recompute (:class:`Seams`); ``+`` combines them."""


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

    @property
    def key(self) -> str:
        """What names this choice in a calibration record: ``first 32``."""
        return f"{self.strategy} {self.r}"


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


__all__ = ["STRATEGIES", "Seams", "runs", "seam_positions"]
