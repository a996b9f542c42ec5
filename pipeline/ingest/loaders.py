"""Turn one file into text units: PDF pages, or the whole text of Markdown/text/HTML.

The format comes from the name (``README.md.gz`` is gzip-compressed Markdown);
a file whose name says nothing (``README``, ``copyright``, ``NEWS.Debian``) is
read as text if its content is text. Only regular files are opened, and a
file over the size limit is not read at all (nor decompressed past it).

This module only reads and cleans text (decoding and cleaning in :mod:`.text`, the
formats in :mod:`.pdf` and :mod:`.html`); splitting into chunks is the chunker's job.
Every way a file can fail to give text (unreadable, corrupt, encrypted, scanned,
binary, empty) surfaces as :class:`~pipeline.errors.LoadError` with a short reason,
so ingest can report the file and go on with the others.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

from ..errors import LoadError
from .html import html_to_text
from .pdf import load_pdf
from .scan import open_regular
from .text import SNIFF_BYTES, LoadedDocument, TextUnit, decode, describe, normalize_text

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
        head = read_bytes(path, limit=SNIFF_BYTES, truncate=True)
    except LoadError:
        return True  # let the load report why it cannot be read
    return _looks_like_text(head)


def _looks_like_text(head: bytes) -> bool:
    try:
        decode(head, partial=True)
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
    with open_regular(path) as fh:
        try:
            data = _read_at_most(gzip.GzipFile(fileobj=fh) if gz else fh, limit + 1 if limit else 0)
        except (EOFError, zlib.error, gzip.BadGzipFile) as err:
            raise LoadError(f"corrupt gzip file: {describe(err)}") from None
        except OSError as err:
            raise LoadError(f"cannot read file: {err.strerror or err}") from None
    if limit and len(data) > limit:
        if truncate:
            return data[:limit]
        what = "decompressed size" if gz else "size"
        raise NotADocument(f"{what} over the limit of {limit / 2**20:.3g} MB (ingest.max_file_mb)")
    return data


_READ_BLOCK = 1 << 20


def _read_at_most(fh, n: int) -> bytes:
    """What ``fh`` holds, up to ``n`` bytes (0: all of it), read in blocks: a buffer grows with what
    was read, never to the size of the limit (``read(n)`` allocates ``n`` bytes up front, so a limit
    larger than free memory would fail every file)."""
    out = bytearray()
    while not n or len(out) < n:
        block = fh.read(_READ_BLOCK if not n else min(_READ_BLOCK, n - len(out)))
        if not block:
            break
        out += block
    return bytes(out)


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
            text = normalize_text(decode(data), collapse_spaces=False)
        except LoadError:
            raise NotADocument("not a text file (binary content)") from None
        if not text:
            raise LoadError("empty file")
        return LoadedDocument(path, fmt, [TextUnit(text, None)], None)

    if fmt == "pdf":
        return load_pdf(path, data)
    if fmt == "html":
        source = decode(data, html=True)
        text, title = html_to_text(source)
        text = normalize_text(text, collapse_spaces=False)
        if not text:
            raise LoadError("no visible text in HTML" if source.strip() else "empty file")
        return LoadedDocument(path, fmt, [TextUnit(text, None)], title)
    text = normalize_text(decode(data), collapse_spaces=False)
    if not text:
        raise LoadError("empty file")
    title = _markdown_title(text) if fmt == "markdown" else None
    return LoadedDocument(path, fmt, [TextUnit(text, None)], title)


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
