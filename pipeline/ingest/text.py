"""Text as ingest handles it: a document's text units, and turning bytes into clean text.

:func:`decode` finds the encoding (a BOM, UTF-16 by its NUL pattern, a declared HTML
charset, UTF-8, then the legacy fallbacks) and refuses binary content;
:func:`normalize_text` cleans extracted text while keeping its shape. The loaders
(:mod:`.loaders`, :mod:`.pdf`, :mod:`.html`) build :class:`LoadedDocument` from them.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import LoadError

SNIFF_BYTES = 8192
"""How much of a file is checked for NUL bytes and a charset declaration."""
_MAX_CONTROL_RATIO = 0.05  # more control characters than this means binary, not text


@dataclass(frozen=True)
class TextUnit:
    """A piece of a document's text and where it is.

    ``page`` is the PDF page number as a reader's page counter shows it (page
    index + 1), not the printed page label (a book's "iv" or "215"): labels can
    be non-numeric or absent, the index always exists. ``None`` for non-paged formats.
    """

    text: str
    page: int | None


@dataclass(frozen=True)
class LoadedDocument:
    """The text of one file. ``skipped_pages`` lists PDF pages whose text could not be extracted."""

    path: Path
    format: str  # "pdf" | "markdown" | "text" | "html"
    units: list[TextUnit]
    title: str | None
    skipped_pages: tuple[int, ...] = ()


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
_SPACES = re.compile(r"[ \t\u00a0\u2000-\u200a\u202f\u205f\u3000]+")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANK_RUNS = re.compile(r"\n{3,}")


def normalize_text(text: str, *, collapse_spaces: bool = True) -> str:
    """Clean extracted text while keeping its shape.

    Line endings become ``\\n``, form feeds paragraph breaks, NULs and other control
    characters go, trailing spaces go, and runs of blank lines shrink to one blank
    line (``\\n\\n``, the paragraph break the chunker splits on). With
    *collapse_spaces* (PDF text) runs of spaces also become one and lines are
    stripped; without it (Markdown, text) indentation is kept, since it carries
    meaning there (code blocks, nested lists).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\u2028", "\n").replace("\u2029", "\n\n").replace("\x0c", "\n\n")
    text = _CONTROL.sub("", text).replace("\ufeff", "")
    if collapse_spaces:
        text = "\n".join(_SPACES.sub(" ", line).strip() for line in text.split("\n"))
    text = _TRAILING.sub("\n", text)
    text = _BLANK_RUNS.sub("\n\n", text)
    return text.strip("\n").rstrip()


def _utf16_without_bom(head: bytes) -> str | None:
    """"utf-16-le"/"utf-16-be" if NUL bytes sit in every other position, as in UTF-16 text of
    mostly Latin script written without a byte order mark; else None."""
    n = len(head) // 2
    if n < 2:
        return None
    even, odd = head[0:2 * n:2].count(0), head[1:2 * n:2].count(0)
    if odd >= 0.3 * n and even <= 0.02 * n:
        return "utf-16-le"
    if even >= 0.3 * n and odd <= 0.02 * n:
        return "utf-16-be"
    return None


def decode(data: bytes, *, html: bool = False, partial: bool = False) -> str:
    """Bytes to text: BOM, UTF-16 by its NUL pattern, declared HTML charset, UTF-8, then cp1252/latin-1.

    The legacy fallback is tried only when the bytes are not valid UTF-8, so UTF-8
    files are never mis-decoded. Binary content (NUL bytes in no UTF-16 pattern,
    or many control characters) raises LoadError("binary file"). ``partial``: *data*
    is the start of a file and may end inside a character.
    """
    errors = "ignore" if partial else "strict"
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                       (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            try:
                return _check_not_binary(data.decode(codec, errors))
            except UnicodeDecodeError as err:
                raise LoadError("binary file") from err
    if b"\x00" in data[:SNIFF_BYTES]:
        codec = _utf16_without_bom(data[:SNIFF_BYTES])
        if codec is None:
            raise LoadError("binary file")
        try:
            return _check_not_binary(data.decode(codec, errors))
        except UnicodeDecodeError as err:
            raise LoadError("binary file") from err
    if partial:  # a multi-byte character cut at the end of the sample is still UTF-8
        data = data[:len(data) - _incomplete_utf8_tail(data)]
    candidates = ["utf-8"]
    if html:
        declared = _declared_charset(data[:SNIFF_BYTES])
        if declared:
            candidates.insert(0, declared)
    for codec in (*candidates, "cp1252"):
        try:
            return _check_not_binary(data.decode(codec))
        except (UnicodeDecodeError, LookupError):
            continue
    return _check_not_binary(data.decode("latin-1"))  # total: every byte maps


def _incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of *data* begin a UTF-8 character that is cut off (0-3)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII)
            need = 2 if byte >= 0xC0 else 1
            need = 3 if byte >= 0xE0 else need
            need = 4 if byte >= 0xF0 else need
            return back if need > back else 0
    return 0


def _check_not_binary(text: str) -> str:
    sample = text[:SNIFF_BYTES]
    controls = len(_CONTROL.findall(sample))
    if sample and controls / len(sample) > _MAX_CONTROL_RATIO:
        raise LoadError("binary file")
    return text


_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def _declared_charset(head: bytes) -> str | None:
    match = _CHARSET.search(head)
    if not match:
        return None
    name = match.group(1).decode("ascii").lower()
    try:
        name = codecs.lookup(name).name
    except LookupError:
        return None
    if name.startswith(("utf-16", "utf-32")):  # a declaration in ASCII bytes cannot be true
        return None
    return "cp1252" if name in ("iso8859-1", "ascii") else name  # as browsers read them


def describe(err: BaseException) -> str:
    """A parser's exception as a short reason (one line, at most 200 characters)."""
    message = " ".join(str(err).split())
    message = message[:200] + "..." if len(message) > 200 else message
    return message or type(err).__name__


__all__ = ["SNIFF_BYTES", "LoadedDocument", "TextUnit", "decode", "describe", "normalize_text"]
