"""Turn one file into text units: PDF pages, or the whole text of Markdown/text/HTML.

The format comes from the name (``README.md.gz`` is gzip-compressed Markdown);
a file whose name says nothing (``README``, ``copyright``, ``NEWS.Debian``) is
read as text if its content is text. Only regular files are opened, and a
file over the size limit is not read at all (nor decompressed past it).

This module only reads and cleans text; splitting into chunks is the chunker's job.
Every way a file can fail to give text (unreadable, corrupt, encrypted, scanned,
binary, empty) surfaces as :class:`~pipeline.errors.LoadError` with a short reason,
so ingest can report the file and go on with the others. No third-party exception
escapes: pypdf raises many types on damaged files and they are caught at the boundary.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import io
import logging
import re
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import LoadError

from .scan import open_regular

if TYPE_CHECKING:
    from pypdf import PdfReader

__all__ = ["LoadedDocument", "NotADocument", "TextUnit", "detect_format", "load", "may_be_text",
           "sniff_text"]


class NotADocument(LoadError):
    """The file is not something to index (binary content where text was guessed, over the size
    limit): ingest reports it as skipped, not failed."""

_FORMATS = {
    ".pdf": "pdf",
    ".md": "markdown",
    ".markdown": "markdown",
    ".mdown": "markdown",
    ".mkd": "markdown",
    ".txt": "text",
    ".text": "text",
    ".rst": "text",  # reStructuredText reads well as plain text
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
}

# Extensions that are never text: such files are skipped without being opened.
_BINARY = frozenset("""
    .png .jpg .jpeg .gif .bmp .tif .tiff .webp .ico .icns .heic .psd .xcf .svgz .ps .eps
    .zip .tar .tgz .tbz2 .txz .bz2 .xz .zst .lz .lzma .7z .rar .z .jar .war .whl .egg
    .deb .rpm .apk .dmg .iso .img .qcow2 .vmdk .cab .msi
    .exe .dll .so .dylib .o .a .lib .obj .bin .elf .class .pyc .pyo .pyd .wasm .dex
    .mp3 .mp4 .m4a .m4v .wav .flac .ogg .oga .opus .aac .avi .mov .mkv .webm .wmv .flv .mid .midi
    .doc .docx .xls .xlsx .ppt .pptx .odt .ods .odp .epub .mobi .djvu
    .ttf .otf .woff .woff2 .eot .pfb
    .sqlite .sqlite3 .db .mdb .parquet .arrow .feather .npy .npz .pkl .pickle .pt .pth .ckpt
    .gguf .safetensors .onnx .h5 .hdf5 .tflite .mo .gmo
""".split())

_SNIFF_BYTES = 8192  # how much of a file is checked for NUL bytes / a charset declaration
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


def _inner_suffix(path: Path) -> str:
    """The extension that names the content: ``a.md.gz`` -> ``.md`` (lower case)."""
    path = Path(path)
    if path.suffix.lower() == ".gz":
        path = Path(path.stem)
    return path.suffix.lower()


def detect_format(path: Path) -> str | None:
    """The format of *path* by its name (case-insensitive; ``.gz`` looks inside), or None."""
    return _FORMATS.get(_inner_suffix(path))


def may_be_text(path: Path) -> bool:
    """True if the name says nothing about the format (``README``, ``NEWS.Debian.gz``): the content decides."""
    return detect_format(path) is None and _inner_suffix(path) not in _BINARY


def sniff_text(path: Path) -> bool:
    """True if the start of *path* (decompressed for ``.gz``) reads as text."""
    try:
        head = read_bytes(path, limit=_SNIFF_BYTES, truncate=True)
    except LoadError:
        return True  # let the load report why it cannot be read
    return _looks_like_text(head)


def _looks_like_text(head: bytes) -> bool:
    try:
        _decode(head, partial=True)
    except LoadError:
        return False
    return True


def read_bytes(path: Path, *, limit: int = 0, truncate: bool = False) -> bytes:
    """The bytes of a regular file, decompressed if its name ends in ``.gz``.

    With ``limit`` (bytes), more than that is :class:`NotADocument` (too large), or with
    ``truncate`` the first ``limit`` bytes. Decompression stops at the limit, so a small
    file that inflates without end costs no more than a file of the limit's size.
    """
    gz = Path(path).suffix.lower() == ".gz"
    want = limit + 1 if limit else -1
    with open_regular(path) as fh:
        try:
            data = gzip.GzipFile(fileobj=fh).read(want) if gz else fh.read(want)
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise LoadError(f"corrupt gzip file: {_describe(err)}") from None
        except OSError as err:
            raise LoadError(f"cannot read file: {err.strerror or err}") from None
    if limit and len(data) > limit:
        if truncate:
            return data[:limit]
        what = "decompressed size" if gz else "size"
        raise NotADocument(f"{what} over the limit of {limit / 2**20:.3g} MB (ingest.max_file_mb)")
    return data


def load(path: Path, *, max_bytes: int = 0) -> LoadedDocument:
    """Read *path* and return its text; raise LoadError(reason) if it gives none.

    ``max_bytes`` (0 = no limit) bounds the bytes read, after decompression.
    """
    path = Path(path)
    fmt = detect_format(path)
    guessed = fmt is None
    if guessed and not may_be_text(path):
        raise LoadError(f"unsupported file type {path.suffix or '(no extension)'!r}")
    data = read_bytes(path, limit=max_bytes)
    if guessed:
        fmt = "text"
        try:
            text = normalize_text(_decode(data), collapse_spaces=False)
        except LoadError:
            raise NotADocument("not a text file (binary content)") from None
        if not text:
            raise LoadError("empty file")
        return LoadedDocument(path, fmt, [TextUnit(text, None)], None)

    if fmt == "pdf":
        return _load_pdf(path, data)
    if fmt == "html":
        source = _decode(data, html=True)
        text, title = _html_to_text(source)
        text = normalize_text(text, collapse_spaces=False)
        if not text:
            raise LoadError("no visible text in HTML" if source.strip() else "empty file")
        return LoadedDocument(path, fmt, [TextUnit(text, None)], title)
    text = normalize_text(_decode(data), collapse_spaces=False)
    if not text:
        raise LoadError("empty file")
    title = _markdown_title(text) if fmt == "markdown" else None
    return LoadedDocument(path, fmt, [TextUnit(text, None)], title)


# --- text normalisation ----------------------------------------------------------

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


def _decode(data: bytes, *, html: bool = False, partial: bool = False) -> str:
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
    if b"\x00" in data[:_SNIFF_BYTES]:
        codec = _utf16_without_bom(data[:_SNIFF_BYTES])
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
        declared = _declared_charset(data[:_SNIFF_BYTES])
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
    sample = text[:_SNIFF_BYTES]
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


_ATX = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def _markdown_title(text: str) -> str | None:
    """The first heading (ATX ``# x`` or setext underline), skipping front matter and code."""
    lines = text.split("\n")
    start = 0
    if lines and lines[0].strip() == "---":  # YAML front matter
        for i in range(1, len(lines)):
            if lines[i].strip() in ("---", "..."):
                start = i + 1
                break
    in_fence = False
    previous = ""
    for line in lines[start:]:
        if _FENCE.match(line):
            in_fence = not in_fence
            previous = ""
            continue
        if in_fence:
            continue
        match = _ATX.match(line)
        if match:
            return match.group(1).strip() or None
        if previous.strip() and _SETEXT.match(line) and not previous.startswith(("    ", "\t")):
            return previous.strip()
        previous = line
    return None


# --- PDF ---------------------------------------------------------------------------

_pypdf_quiet_lock = threading.Lock()
_pypdf_quiet_depth = 0
_pypdf_saved_level = logging.NOTSET


@contextlib.contextmanager
def _quiet_pypdf() -> Iterator[None]:
    """Silence pypdf's logger while reading: a damaged file is reported once, as LoadError.

    pypdf logs its robustness fixes ("EOF marker not found", "Ignoring wrong pointing
    object") through ``logging``; on a bad file that is dozens of lines. The level is
    restored afterwards; a counter keeps concurrent loads from restoring it too early.
    """
    global _pypdf_quiet_depth, _pypdf_saved_level
    logger = logging.getLogger("pypdf")
    with _pypdf_quiet_lock:
        if _pypdf_quiet_depth == 0:
            _pypdf_saved_level = logger.level
            logger.setLevel(logging.CRITICAL + 1)
        _pypdf_quiet_depth += 1
    try:
        yield
    finally:
        with _pypdf_quiet_lock:
            _pypdf_quiet_depth -= 1
            if _pypdf_quiet_depth == 0:
                logger.setLevel(_pypdf_saved_level)


def _load_pdf(path: Path, data: bytes) -> LoadedDocument:
    """One unit per page with text; pages whose extraction fails are skipped and listed.

    A page that breaks pypdf should not cost the rest of the document, so failures
    are per page; if every page fails the file is reported as corrupt.
    """
    from pypdf import PasswordType, PdfReader  # imported here: only PDFs pay for it
    from pypdf.errors import DependencyError

    with _quiet_pypdf():
        try:
            reader = PdfReader(io.BytesIO(data), strict=False)
            if reader.is_encrypted:
                if reader.decrypt("") == PasswordType.NOT_DECRYPTED:
                    raise LoadError("encrypted PDF (password required)")
            pages = list(reader.pages)
            title = _pdf_title(reader)
        except LoadError:
            raise
        except DependencyError as err:  # AES encryption, and 'cryptography' is not installed
            raise LoadError(
                "encrypted PDF (AES: install the 'cryptography' package to open it)"
            ) from err
        except Exception as err:  # pypdf raises many types; all mean "cannot parse"
            raise LoadError(f"corrupt PDF: {_describe(err)}") from err
        if not pages:
            raise LoadError("corrupt PDF: no pages")

        units: list[TextUnit] = []
        skipped: list[int] = []
        for number, page in enumerate(pages, start=1):
            try:
                text = page.extract_text() or ""
            except Exception:
                skipped.append(number)
                continue
            text = normalize_text(text)
            if text:
                units.append(TextUnit(text, number))
    if not units:
        if len(skipped) == len(pages):
            raise LoadError("corrupt PDF: text extraction failed on every page")
        raise LoadError("no extractable text (scanned PDF?)")
    return LoadedDocument(path, "pdf", units, title, tuple(skipped))


def _pdf_title(reader: PdfReader) -> str | None:
    try:
        raw = reader.metadata.title if reader.metadata else None
    except Exception:
        return None
    title = " ".join(str(raw).split()) if raw else ""
    return title or None


def _describe(err: BaseException) -> str:
    message = " ".join(str(err).split())
    message = message[:200] + "..." if len(message) > 200 else message
    return message or type(err).__name__


# --- HTML --------------------------------------------------------------------------

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


def _html_to_text(source: str) -> tuple[str, str | None]:
    parser = _TextExtractor()
    try:
        parser.feed(source)
        parser.close()
    except Exception as err:  # html.parser is lenient; this is a safety net
        raise LoadError(f"malformed HTML: {_describe(err)}") from err
    if parser._in_title and parser.title is None:  # unterminated <title>
        parser.title = " ".join("".join(parser._title_parts).split()) or None
    return "".join(parser.parts), parser.title
