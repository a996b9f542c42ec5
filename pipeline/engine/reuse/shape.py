"""A prompt's shape: its tokens, where shared parts may end (its cuts), and its sections.

Everything reuse decides reads the shape, never loose keywords. A prompt's *cuts* are
the positions where a part it shares with other prompts may end: each document or
section end within its prefix, and the prefix's end; never its last token (sampling
needs one decoded token). State is reused, restored and saved only at cuts, and a
prompt is always prefilled in pieces split there, so an answer from reused state is
token for token the answer without it. A sections-mode prompt also names its head
and sections (:class:`Sections`): what composing it from section states reads.

:class:`PromptShape` is built once per prompt (the ask path: :func:`pipeline.ask.prompt.shape_of`)
and handed to the pool, the engine and the planner. A plain token list is a shape with
no cuts (:meth:`PromptShape.of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def cuts(n_tokens: int, prefix_len: int, boundaries: Sequence[int]) -> tuple[int, ...]:
    """A prompt's cuts: the boundaries within its prefix and the prefix's end, one token left to decode."""
    limit = min(prefix_len, n_tokens - 1)
    if limit <= 0:
        return ()
    return tuple(sorted({int(b) for b in boundaries if 0 < b < limit} | {limit}))


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n, limit = 0, min(len(a), len(b), limit)
    while n < limit and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class Piece:
    """A section as a prompt places it: its tokens; which of them are its header (offsets), for the
    ``headers`` seam strategy; and which matter most to the question (offsets, most relevant first),
    for the ``focus`` strategy. Only ``tokens`` identify its state."""

    tokens: tuple[int, ...]
    headers: tuple[int, ...] = ()
    focus: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)


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

    @property
    def starts(self) -> tuple[int, ...]:
        return (self.head, *self.ends[:-1])

    def pieces(self, tokens: Sequence[int]) -> list[Piece]:
        return [Piece(tuple(tokens[a:b]),
                      headers=self.headers[i] if i < len(self.headers) else (),
                      focus=self.focus[i] if i < len(self.focus) else ())
                for i, (a, b) in enumerate(zip(self.starts, self.ends))]


@dataclass(frozen=True)
class PromptShape:
    """One prompt as reuse sees it: ``tokens``, its ``cuts`` (see the module notes) and, for a
    sections-mode prompt, its ``sections`` (None for whole documents and passages)."""

    tokens: tuple[int, ...]
    cuts: tuple[int, ...] = ()
    sections: Sections | None = None

    @classmethod
    def of(cls, tokens: Sequence[int], *, prefix_len: int = 0, boundaries: Sequence[int] = (),
           sections: Sections | None = None) -> PromptShape:
        """The shape of ``tokens`` whose first ``prefix_len`` are shared with other prompts, with
        earlier shared ends at ``boundaries``."""
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, cuts(len(tokens), prefix_len, boundaries), sections)

    @classmethod
    def coerce(cls, prompt: PromptShape | Sequence[int]) -> PromptShape:
        """``prompt`` as a shape: a plain token list shares nothing (no cuts)."""
        return prompt if isinstance(prompt, PromptShape) else cls.of(prompt)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def prefix_len(self) -> int:
        """How many leading tokens other prompts may share (the last cut; 0 with none)."""
        return self.cuts[-1] if self.cuts else 0

    @property
    def prefix(self) -> tuple[int, ...]:
        return self.tokens[:self.prefix_len]


__all__ = ["Piece", "PromptShape", "Sections", "common_prefix", "cuts"]
