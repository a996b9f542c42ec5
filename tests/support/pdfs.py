"""A tiny PDF writer for tests: real, extractable text without reportlab.

The files are minimal but valid PDF 1.4: a catalog, a page tree, one shared
Helvetica (standard Type1, WinAnsiEncoding) font, one content stream per page
that draws each line of the page text with ``BT /F1 .. Tf .. Td (..) Tj ET``,
and a byte-exact xref table. Output is deterministic (no dates, no IDs), so a
sample generated with it does not change from run to run.

Also here: an encrypted PDF (via pypdf), a corrupt one and a "scanned" one (a
page with drawings but no text), for the loader's error paths.
"""

from __future__ import annotations

import io
from pathlib import Path

PAGE_WIDTH = 612  # US Letter, points
PAGE_HEIGHT = 792
MARGIN = 54
FONT_SIZE = 10
LEADING = 13


def _pdf_string(line: str) -> bytes:
    """Encode *line* as a PDF literal string body: WinAnsi bytes, ( ) \\ escaped.

    Characters outside cp1252 become ``?``; bytes outside printable ASCII are
    written as octal escapes so the content stream stays 7-bit clean.
    """
    out = bytearray()
    for byte in line.encode("cp1252", errors="replace"):
        if byte in b"()\\":
            out += b"\\" + bytes([byte])
        elif 32 <= byte < 127:
            out.append(byte)
        else:
            out += b"\\%03o" % byte
    return bytes(out)


def _content_stream(text: str) -> bytes:
    """One text object drawing every line of *text*, top to bottom."""
    lines = text.replace("\r\n", "\n").split("\n")
    ops = [b"BT", b"/F1 %d Tf" % FONT_SIZE, b"%d %d Td" % (MARGIN, PAGE_HEIGHT - MARGIN)]
    for i, line in enumerate(lines):
        if i:
            ops.append(b"0 -%d Td" % LEADING)
        ops.append(b"(" + _pdf_string(line) + b") Tj")
    ops.append(b"ET")
    return b"\n".join(ops) + b"\n"


def _stream(data: bytes) -> bytes:
    return b"<< /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def _serialize(objects: list[bytes], *, info: int | None = None) -> bytes:
    """Assemble numbered objects (1-based, in order) with an exact xref table."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n" % (len(objects) + 1)
    out += b"0000000000 65535 f \n"  # each entry is exactly 20 bytes
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    trailer = b"<< /Size %d /Root 1 0 R" % (len(objects) + 1)
    if info is not None:
        trailer += b" /Info %d 0 R" % info
    out += b"trailer\n" + trailer + b" >>\nstartxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def _build(page_streams: list[bytes], *, title: str | None = None) -> bytes:
    """Objects: 1 catalog, 2 pages, 3 font, then page/content pairs, then info."""
    objects: list[bytes] = [b"", b"", b""]
    kids = []
    for content in page_streams:
        page_number = len(objects) + 1
        kids.append(b"%d 0 R" % page_number)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>"
            % (PAGE_WIDTH, PAGE_HEIGHT, page_number + 1)
        )
        objects.append(_stream(content))
    objects[0] = b"<< /Type /Catalog /Pages 2 0 R >>"
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(kids), len(kids))
    objects[2] = (
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"
    )
    info = None
    if title is not None:
        objects.append(b"<< /Title (" + _pdf_string(title) + b") /Producer (tests/pdfs.py) >>")
        info = len(objects)
    return _serialize(objects, info=info)


def make_pdf(path: Path, pages: list[str], *, title: str | None = None) -> Path:
    """Write a PDF with one page per string in *pages*, one text line per line.

    Lines are not wrapped: pass text already broken to fit (about 95 characters
    of 10 pt Helvetica per line) and at most ~52 lines per page to stay visible.
    """
    path = Path(path)
    path.write_bytes(_build([_content_stream(text) for text in pages], title=title))
    return path


def make_encrypted_pdf(path: Path, pages: list[str], password: str) -> Path:
    """Write a PDF that opens only with *password* (RC4-128, no extra packages).

    RC4 is what pypdf can both write and read without ``cryptography``; the
    point is only that the file is encrypted with a non-empty user password.
    """
    from pypdf import PdfReader, PdfWriter  # import here: only this helper needs pypdf

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(_build([_content_stream(t) for t in pages]))))
    writer.encrypt(user_password=password, owner_password=password + "-owner", algorithm="RC4-128")
    path = Path(path)
    with path.open("wb") as fh:
        writer.write(fh)
    return path


def make_corrupt_pdf(path: Path) -> Path:
    """Write a ``%PDF`` header followed by garbage: no objects, no xref, no trailer."""
    path = Path(path)
    path.write_bytes(b"%PDF-1.4\n" + bytes(range(256)) * 4 + b"\nthis is not a PDF body\n")
    return path


def make_scanned_pdf(path: Path, *, pages: int = 1) -> Path:
    """Write a PDF whose pages only draw shapes (as a scan draws an image): no text."""
    drawing = b"0.5 g\n72 72 468 648 re f\n0 0 1 RG 4 w 100 100 m 500 700 l S\n"
    path = Path(path)
    path.write_bytes(_build([drawing] * pages))
    return path
