"""How an answer's sources are numbered, and the answer's citations made to match them.

A prompt numbers its documents ``[1]``, ``[2]``... in the order it holds them, and that number is
part of every section's tokens: a section renders to the same tokens in every prompt, so its saved
state and the prompt's cached prefix serve every question (with composition, each document keeps
its place in the collection, so a prompt may hold ``[3]`` and ``[4]`` only). The sources shown to
a person are numbered from 1 instead: the documents the answer draws on (those retrieval ranked),
in the order the prompt holds them, then the prompt's other documents, so that every citation the
model may write has a number in the list. :func:`numbering` maps the prompt's numbers to those;
:func:`renumber` rewrites the citations of an answer (``[3]``, ``[3, p. 9]``, ``[3, 4]``) with that
map, and :class:`Renumbering` does the same to an answer as it streams, holding back only a
citation not yet closed. The CLI, ``--json``, ``rag serve`` and the page all show the one result.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Mapping, Sequence

#: A bracket that may be a citation: a number first, on one line, short; not after a letter or digit
#: (``x[3]`` is code, not a citation). Only its items that are a number alone are document numbers.
_BRACKET = re.compile(r"(?<![A-Za-z0-9_])\[([0-9][^\[\]\n]{0,40})\]")
_ITEM = re.compile(r"^(\s*)(\d+)(\s*)$")
_OPEN = re.compile(r"(?<![A-Za-z0-9_])\[(?:[0-9][^\[\]\n]{0,40})?$")


def numbering(in_prompt: Sequence[int], listed: Iterable[int]) -> dict[int, int]:
    """The number shown for each of the prompt's document numbers ``in_prompt`` (in prompt order): the
    ``listed`` ones (the sources) 1, 2, ... in prompt order, then the others."""
    listed = set(listed)
    order = [n for n in in_prompt if n in listed] + [n for n in in_prompt if n not in listed]
    return {n: i for i, n in enumerate(dict.fromkeys(order), start=1)}


def shown_sources(sources: Sequence[dict], shown: Mapping[int, int]) -> list[dict]:
    """``sources`` (numbered as in the prompt) numbered as shown, in that order."""
    out = [{**s, "n": shown.get(s["n"], s["n"])} for s in sources]
    return sorted(out, key=lambda s: s["n"])


def excerpt(text: str, limit: int = 300) -> str:
    """The start of a passage, whole words, at most ``limit`` characters: what a viewer highlights."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut or text[:limit]


def renumber(text: str, shown: Mapping[int, int], *, before: str = "") -> str:
    """``text`` with each citation's document numbers replaced by ``shown``'s (numbers it does not map,
    and page numbers, stay). ``before`` is the text that came before, for a citation at its start."""
    if not shown or all(k == v for k, v in shown.items()) or "[" not in text:
        return text
    lead = before[-2:]

    def one(m: re.Match) -> str:
        parts = m.group(1).split(",")
        out = []
        for part in parts:
            item = _ITEM.match(part)
            if item and int(item.group(2)) in shown:
                part = f"{item.group(1)}{shown[int(item.group(2))]}{item.group(3)}"
            out.append(part)
        return "[" + ",".join(out) + "]"

    return _BRACKET.sub(one, lead + text)[len(lead):]


class Renumbering:
    """:func:`renumber` over a stream of pieces: what :meth:`feed` returns, joined with :meth:`end`,
    is ``renumber`` of the whole text. Only a citation not yet closed is held back."""

    def __init__(self, shown: Mapping[int, int]):
        self.shown = dict(shown)
        self.active = any(k != v for k, v in self.shown.items())
        self._held = ""
        self._before = ""

    def feed(self, piece: str) -> str:
        if not self.active:
            return piece
        text = self._held + piece
        m = _OPEN.search(text, max(0, len(text) - 48))
        cut = m.start() if m else len(text)
        self._held = text[cut:]
        return self._emit(text[:cut])

    def end(self) -> str:
        """What is still held (an unclosed bracket, as written)."""
        held, self._held = self._held, ""
        return self._emit(held) if self.active else held

    def _emit(self, text: str) -> str:
        out = renumber(text, self.shown, before=self._before)
        self._before = (self._before + text)[-2:]
        return out

    def stream(self, pieces: Iterable[str]) -> Iterator[str]:
        for piece in pieces:
            out = self.feed(piece)
            if out:
                yield out
        tail = self.end()
        if tail:
            yield tail


__all__ = ["Renumbering", "excerpt", "numbering", "renumber", "shown_sources"]
