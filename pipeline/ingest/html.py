"""HTML pages: their visible text, with block elements as line and paragraph breaks, and their title."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from ..errors import LoadError
from .text import describe

# Content that is never visible text. <head> is not listed: apart from <title>
# (captured separately) everything legitimately in it is void or listed here.
_SKIP = frozenset({"script", "style", "noscript", "template", "svg", "math", "nav", "iframe"})
_PARAGRAPH = frozenset({
    "p", "div", "section", "article", "main", "header", "footer", "aside", "blockquote",
    "pre", "table", "ul", "ol", "dl", "figure", "figcaption", "form", "fieldset",
    "details", "summary", "address", "hr", "h1", "h2", "h3", "h4", "h5", "h6",
})
_LINE = frozenset({"br", "li", "tr", "dt", "dd", "caption", "option", "legend"})
_CELL = frozenset({"td", "th"})
_WS = re.compile(r"\s+")


class _TextExtractor(HTMLParser):
    """Visible text of an HTML page, with block elements as line/paragraph breaks.

    Whitespace collapses as a browser renders it, except inside <pre>, which is
    kept verbatim (code). Entities are unescaped by ``convert_charrefs``.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title: str | None = None
        self._skip: list[str] = []
        self._pre = 0
        self._in_title = False
        self._title_parts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIP:
            self._skip.append(tag)
        elif self._skip:
            return
        elif tag == "title" and self.title is None:
            self._in_title = True
        elif tag in _PARAGRAPH:
            self._break(2)
            if tag == "pre":
                self._pre += 1
        elif tag in _LINE:
            self._break(1)
        elif tag in _CELL:
            self._write(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            if tag in self._skip:  # tolerate stray end tags
                while self._skip.pop() != tag:
                    pass
        elif self._skip:
            return
        elif tag == "title" and self._in_title:
            self._in_title = False
            self.title = " ".join("".join(self._title_parts).split()) or None
        elif tag in _PARAGRAPH:
            if tag == "pre" and self._pre:
                self._pre -= 1
            self._break(2)
        elif tag in _LINE and tag != "br":
            self._break(1)

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._in_title:
            self._title_parts.append(data)
        else:
            self._write(data)

    def _write(self, data: str) -> None:
        if self._pre:
            self.parts.append(data)
            return
        data = _WS.sub(" ", data)
        at_line_start = not self.parts or self.parts[-1].endswith(("\n", " "))
        if at_line_start:
            data = data.lstrip(" ")
        if data:
            self.parts.append(data)

    def _break(self, newlines: int) -> None:
        if not self.parts:
            return
        tail = "".join(self.parts[-3:]).rstrip(" ")
        have = len(tail) - len(tail.rstrip("\n"))
        if have < newlines:
            while self.parts and self.parts[-1].endswith(" ") and not self._pre:
                self.parts[-1] = self.parts[-1].rstrip(" ")
                if not self.parts[-1]:
                    self.parts.pop()
            self.parts.append("\n" * (newlines - have))


def html_to_text(source: str) -> tuple[str, str | None]:
    """The visible text of an HTML page and its <title>."""
    parser = _TextExtractor()
    try:
        parser.feed(source)
        parser.close()
    except Exception as err:  # html.parser is lenient; this is a safety net
        raise LoadError(f"malformed HTML: {describe(err)}") from err
    if parser._in_title and parser.title is None:  # unterminated <title>
        parser.title = " ".join("".join(parser._title_parts).split()) or None
    return "".join(parser.parts), parser.title


__all__ = ["html_to_text"]
