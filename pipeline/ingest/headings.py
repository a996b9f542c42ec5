"""Section headings in a document's text, and the heading path in force at any offset.

A chunk read alone often lacks the words that say what it is about: "Lower N
until loading fails" means little without "Expressing the split" above it.
Contextual chunks carry their document title and heading path into the
embedding and the BM25 index (never into the passages a reader or the model
sees). Headings come from the text itself, so the loaders need not change:

- Markdown: ATX (``## Title``) and setext (underlined) headings, outside code fences;
- other formats (plain text, HTML as extracted, PDF pages): *detected* headings —
  numbered section lines (``2.3 Planning the budget``) and short standalone
  lines between blank lines that read like titles, or lines underlined with
  ``===``/``---``. Detection is deliberately conservative: a missed heading
  costs a little recall, a false one puts a stray sentence in the header.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ATX = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")
_NUMBERED = re.compile(r"^(\d{1,2}(?:\.\d{1,2})*)\.?[ \t]+([A-Za-z][^\n]*)$")
_MAX_HEADING = 90  # characters
_MAX_WORDS = 12


@dataclass(frozen=True)
class Heading:
    offset: int  # where the heading line starts in the unit's text
    level: int  # 1 = top
    title: str


def find_headings(text: str, fmt: str) -> list[Heading]:
    """The headings of one text unit, in order."""
    return _markdown(text) if fmt == "markdown" else _detected(text)


def _lines(text: str):
    offset = 0
    for line in text.split("\n"):
        yield offset, line
        offset += len(line) + 1


def _markdown(text: str) -> list[Heading]:
    out: list[Heading] = []
    in_fence = False
    prev: tuple[int, str] | None = None
    for offset, line in _lines(text):
        if _FENCE.match(line):
            in_fence, prev = not in_fence, None
            continue
        if in_fence:
            continue
        m = _ATX.match(line)
        if m:
            out.append(Heading(offset, len(m.group(1)), _clean(m.group(2))))
            prev = None
            continue
        s = _SETEXT.match(line)
        if s and prev and prev[1].strip() and not prev[1].startswith(("    ", "\t")) \
                and len(prev[1].strip()) <= _MAX_HEADING:
            out.append(Heading(prev[0], 1 if s.group(1)[0] == "=" else 2, _clean(prev[1])))
            prev = None
            continue
        prev = (offset, line)
    return out


def _detected(text: str) -> list[Heading]:
    out: list[Heading] = []
    lines = list(_lines(text))
    for i, (offset, line) in enumerate(lines):
        stripped = line.strip()
        if not stripped or line[:1] in (" ", "\t") or len(stripped) > _MAX_HEADING:
            continue
        after = lines[i + 1][1] if i + 1 < len(lines) else ""
        m = _NUMBERED.match(stripped)
        if m and _titlelike(m.group(2), numbered=True):
            out.append(Heading(offset, m.group(1).count(".") + 1, _clean(stripped)))
            continue
        if _SETEXT.match(after) and len(after.strip()) >= 3 and _titlelike(stripped):
            out.append(Heading(offset, 1 if after.strip()[0] == "=" else 2, _clean(stripped)))
            continue
        before = lines[i - 1][1] if i > 0 else ""
        if not before.strip() and not after.strip() and i + 1 < len(lines) and _titlelike(stripped):
            out.append(Heading(offset, 1, _clean(stripped)))
    return out


def _titlelike(line: str, *, numbered: bool = False) -> bool:
    """Short, starts with a capital letter or digit (any letter after a section number),
    no sentence punctuation at the end, no code or formulas, mostly letters."""
    words = line.split()
    return (0 < len(words) <= _MAX_WORDS and (numbered or line[0].isupper() or line[0].isdigit())
            and not (numbered and any(w[:1].isdigit() for w in words[:2]))
            and not line.endswith((".", ",", ";", ":", "!", "?", ")", "}", "]", "\\"))
            and not any(ch in line for ch in "=(){}[]<>`$|·•")
            and sum(ch.isalpha() for ch in line) >= 0.6 * len(line.replace(" ", "")))


def _clean(title: str) -> str:
    return " ".join(title.replace("*", "").replace("`", "").split())


class HeadingTrail:
    """The heading path in force as a document is read in order, across its text units."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self._stack: list[Heading] = []
        self._pending: list[Heading] = []

    def start_unit(self, text: str) -> None:
        self._pending = find_headings(text, self.fmt)

    def path_at(self, offset: int) -> tuple[str, ...]:
        """The path at ``offset`` of the current unit (offsets must not decrease within a unit)."""
        while self._pending and self._pending[0].offset <= offset:
            h = self._pending.pop(0)
            while self._stack and self._stack[-1].level >= h.level:
                self._stack.pop()
            self._stack.append(h)
        return tuple(h.title for h in self._stack)


def context_header(title: str | None, path: tuple[str, ...], *, limit: int = 200) -> str:
    """``Title > Heading > Subheading`` (the title once, even when it is also the first heading)."""
    parts = [title] if title else []
    for p in path:
        if not parts or p.casefold() != parts[-1].casefold():
            parts.append(p)
    header = " > ".join(parts)
    return header if len(header) <= limit else header[:limit].rsplit(" ", 1)[0] + " …"
