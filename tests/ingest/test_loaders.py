"""Behaviour of pipeline.ingest.loaders: what text comes out of each format, and how files fail."""

from __future__ import annotations

import logging
import gzip
import os
from pathlib import Path

import pytest

from pipeline.errors import LoadError
from pipeline.ingest.loaders import LoadedDocument, TextUnit, detect_format, load

from support.pdfs import make_corrupt_pdf, make_encrypted_pdf, make_pdf, make_scanned_pdf

PAGES = [
    "Chapter one: prefill throughput\nThe aardvark measures n_ubatch.",
    "Chapter two: the KV cache\nA bobolink quantizes keys to q8_0.",
    "Chapter three: offloading experts (with regexes) \\ backslash\nThe capybara moves experts to CPU.",
]


def _load_error(path: Path) -> str:
    with pytest.raises(LoadError) as info:
        load(path)
    return str(info.value)


# --- PDF ---------------------------------------------------------------------------


def test_pdf_gives_one_unit_per_page_numbered_from_one(tmp_path: Path) -> None:
    doc = load(make_pdf(tmp_path / "book.pdf", PAGES, title="Prefill Guide"))

    assert isinstance(doc, LoadedDocument)
    assert doc.format == "pdf"
    assert doc.title == "Prefill Guide"
    assert doc.skipped_pages == ()
    assert [unit.page for unit in doc.units] == [1, 2, 3]
    for unit, word in zip(doc.units, ["aardvark", "bobolink", "capybara"]):
        assert word in unit.text
        assert sum(word in other.text for other in doc.units) == 1
    assert doc.units[0].text.startswith("Chapter one: prefill throughput\n")
    assert "(with regexes) \\ backslash" in doc.units[2].text


def test_pdf_without_title_metadata_has_no_title(tmp_path: Path) -> None:
    assert load(make_pdf(tmp_path / "a.pdf", ["just text"])).title is None


def test_blank_pdf_pages_are_omitted_but_numbering_is_kept(tmp_path: Path) -> None:
    doc = load(make_pdf(tmp_path / "a.pdf", ["first", "", "third"]))
    assert [(u.page, u.text) for u in doc.units] == [(1, "first"), (3, "third")]


def test_corrupt_pdf_is_a_load_error(tmp_path: Path) -> None:
    assert _load_error(make_corrupt_pdf(tmp_path / "bad.pdf")).startswith("corrupt PDF: ")


def test_truncated_pdf_is_a_load_error(tmp_path: Path) -> None:
    whole = make_pdf(tmp_path / "whole.pdf", PAGES).read_bytes()
    cut = tmp_path / "cut.pdf"
    cut.write_bytes(whole[: len(whole) // 3])  # the page streams end mid-way: nothing is recoverable
    assert _load_error(cut).startswith("corrupt PDF: ")


def test_corrupt_pdf_does_not_spam_pypdf_logging(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    level = logging.getLogger("pypdf").level
    with caplog.at_level(logging.DEBUG):
        _load_error(make_corrupt_pdf(tmp_path / "bad.pdf"))
    assert not [r for r in caplog.records if r.name.startswith("pypdf")]
    assert logging.getLogger("pypdf").level == level


def test_encrypted_pdf_needs_a_password(tmp_path: Path) -> None:
    path = make_encrypted_pdf(tmp_path / "locked.pdf", PAGES, "s3cret")
    assert _load_error(path) == "encrypted PDF (password required)"


def test_encrypted_pdf_fixture_really_is_encrypted(tmp_path: Path) -> None:
    from pypdf import PdfReader

    reader = PdfReader(make_encrypted_pdf(tmp_path / "locked.pdf", PAGES, "s3cret"))
    assert reader.is_encrypted
    assert reader.decrypt("s3cret")
    assert "aardvark" in reader.pages[0].extract_text()


def test_encrypted_pdf_with_empty_user_password_opens(tmp_path: Path) -> None:
    # Owner-password-only PDFs (printing/copying restricted) are common and readable.
    path = make_encrypted_pdf(tmp_path / "restricted.pdf", PAGES, "")
    assert [u.page for u in load(path).units] == [1, 2, 3]


def test_pdf_without_text_is_reported_as_scanned(tmp_path: Path) -> None:
    path = make_scanned_pdf(tmp_path / "scan.pdf", pages=2)
    assert _load_error(path) == "no extractable text (scanned PDF?)"


# --- Markdown and text -------------------------------------------------------------


def test_markdown_keeps_its_text_and_takes_the_first_heading_as_title(tmp_path: Path) -> None:
    source = "---\ntitle: ignored\n---\n\n```\n# not a heading\n```\n\n# KV cache reuse\n\n## Details\n\n    indented code\n- item\n"
    path = tmp_path / "notes.md"
    path.write_text(source, encoding="utf-8")

    doc = load(path)
    assert doc.format == "markdown"
    assert doc.title == "KV cache reuse"
    assert doc.units == [TextUnit(source.rstrip("\n"), None)]


def test_setext_heading_is_a_title(tmp_path: Path) -> None:
    path = tmp_path / "a.markdown"
    path.write_text("Prefill tuning\n==============\n\nBody.\n", encoding="utf-8")
    assert load(path).title == "Prefill tuning"


def test_utf8_with_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffcafé line one\r\nline two\r\n\r\n\r\n\r\nnext para\r\n".encode("utf-8"))

    doc = load(path)
    assert doc.format == "text"
    assert doc.title is None
    assert doc.units[0].text == "café line one\nline two\n\nnext para"


def test_legacy_encoding_falls_back_when_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "old.txt"
    path.write_bytes("naïve café — “quoted”".encode("cp1252"))
    assert load(path).units[0].text == "naïve café — “quoted”"

    latin = tmp_path / "latin.md"
    latin.write_bytes("# Überschrift\n\nGrüße".encode("latin-1"))
    assert load(latin).title == "Überschrift"


def test_utf16_with_bom_is_text_not_binary(tmp_path: Path) -> None:
    path = tmp_path / "wide.txt"
    path.write_text("wide text", encoding="utf-16")
    assert load(path).units[0].text == "wide text"


def test_nuls_and_trailing_spaces_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"x" * 9000 + b"\x00tail   \n  indented\n")
    assert load(path).units[0].text == "x" * 9000 + "tail\n  indented"


@pytest.mark.parametrize(
    "payload",
    [b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64), bytes(range(1, 32)) * 50],
    ids=["nul-bytes", "control-characters"],
)
def test_binary_file_is_a_load_error(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "image.txt"
    path.write_bytes(payload)
    assert _load_error(path) == "binary file"


@pytest.mark.parametrize("content", [b"", b"  \n\t\r\n  ", b"\xef\xbb\xbf\n"])
@pytest.mark.parametrize("name", ["a.txt", "a.md", "a.html"])
def test_empty_file_is_a_load_error(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert _load_error(path) == "empty file"


# --- HTML --------------------------------------------------------------------------

HTML = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>  Chroma &amp; notes </title>
<style>body { color: red }</style><script>var s = "<p>hidden</p>";</script></head>
<body><nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
<h1>Embedded&nbsp;mode</h1><p>Use   PersistentClient
   for &lt;local&gt; stores &mdash; <b>one</b> process.</p>
<ul><li>first item</li><li>second item</li></ul>
<pre>client = chromadb.HttpClient(
    host="localhost")</pre>
<table><tr><td>a</td><td>b</td></tr></table>
line<br>break
<svg><title>icon</title></svg><noscript>enable JS</noscript><template><p>tpl</p></template>
</body></html>
"""


def test_html_visible_text_with_block_breaks(tmp_path: Path) -> None:
    path = tmp_path / "page.html"
    path.write_text(HTML, encoding="utf-8")

    doc = load(path)
    assert doc.format == "html"
    assert doc.title == "Chroma & notes"
    assert doc.units[0].text == (
        "Embedded mode\n\n"
        "Use PersistentClient for <local> stores \u2014 one process.\n\n"
        "first item\nsecond item\n\n"
        'client = chromadb.HttpClient(\n    host="localhost")\n\n'
        "a b\n\n"
        "line\nbreak"
    )
    for hidden in ("color", "hidden", "Home", "icon", "enable JS", "tpl"):
        assert hidden not in doc.units[0].text


def test_html_declared_charset_is_honoured(tmp_path: Path) -> None:
    path = tmp_path / "old.htm"
    path.write_bytes(
        '<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
        "</head><body><p>caf\u00e9 \u2013 ok</p></body></html>".encode("cp1252")
    )
    doc = load(path)
    assert doc.units[0].text == "caf\u00e9 \u2013 ok"
    assert doc.title is None


def test_html_with_only_markup_has_no_text(tmp_path: Path) -> None:
    path = tmp_path / "blank.html"
    path.write_text("<html><head><script>x()</script></head><body></body></html>")
    assert _load_error(path) == "no visible text in HTML"


# --- formats and unreadable files --------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.pdf", "pdf"),
        ("A.PDF", "pdf"),
        ("a.md", "markdown"),
        ("a.markdown", "markdown"),
        ("a.txt", "text"),
        ("a.text", "text"),
        ("a.rst", "text"),
        ("a.html", "html"),
        ("a.htm", "html"),
        ("a.png", None),
        ("a.docx", None),
        ("a.pdf.bak", None),
        ("README", None),
    ],
)
def test_detect_format(name: str, expected: str | None) -> None:
    assert detect_format(Path(name)) == expected


def test_unsupported_extension_is_a_load_error(tmp_path: Path) -> None:
    path = tmp_path / "x.png"
    path.write_bytes(b"\x89PNG")
    assert "unsupported" in _load_error(path)


def test_missing_file_and_directory_give_the_os_reason(tmp_path: Path) -> None:
    assert _load_error(tmp_path / "gone.txt") == "cannot read file: No such file or directory"
    (tmp_path / "dir.md").mkdir()
    assert _load_error(tmp_path / "dir.md") == "cannot read file: Is a directory"


def test_unreadable_file_gives_permission_denied(tmp_path: Path) -> None:
    path = tmp_path / "secret.txt"
    path.write_text("text")
    path.chmod(0)
    # Root reads anything: act as 'nobody' for the open (the real uid stays root to switch back).
    as_root = os.geteuid() == 0
    if as_root:
        tmp_path.chmod(0o755)
        os.seteuid(65534)
    try:
        assert _load_error(path) == "cannot read file: Permission denied"
    finally:
        if as_root:
            os.seteuid(0)
        path.chmod(0o600)


def test_pdf_page_whose_extraction_fails_is_skipped_and_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pypdf import PageObject

    original = PageObject.extract_text

    def flaky(self: PageObject, *args: object, **kwargs: object) -> str:
        text = original(self, *args, **kwargs)
        if "bobolink" in text:
            raise KeyError("/Font")  # the kind of error a damaged page raises
        return text

    monkeypatch.setattr(PageObject, "extract_text", flaky)
    doc = load(make_pdf(tmp_path / "a.pdf", PAGES))
    assert [u.page for u in doc.units] == [1, 3]
    assert doc.skipped_pages == (2,)


def test_demo_samples_all_load() -> None:
    samples = Path(__file__).resolve().parents[2] / "samples"
    formats = {}
    for path in sorted(samples.iterdir()):
        if detect_format(path) is not None:
            doc = load(path)
            assert doc.title or doc.format == "text", path
            formats[doc.format] = formats.get(doc.format, 0) + 1
    assert set(formats) == {"pdf", "markdown", "text", "html"}


# --- text by content, gzip, UTF-16 without a byte order mark, size limit ---------------


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_utf16_without_bom_is_decoded(tmp_path: Path, codec: str) -> None:
    text = "Ünïcödé notes about the Ω constant, written by a Windows editor.\nSecond line."
    path = tmp_path / "notes.txt"
    path.write_bytes(text.encode(codec))
    assert load(path).units[0].text == text


def test_files_named_without_a_format_are_read_by_content(tmp_path: Path) -> None:
    from pipeline.ingest.loaders import NotADocument, may_be_text

    (tmp_path / "README").write_text("Read me first.\n")
    (tmp_path / "NEWS.Debian.gz").write_bytes(gzip.compress(b"Version 2 is out.\n"))
    (tmp_path / "blob").write_bytes(bytes(range(256)) * 4)
    assert load(tmp_path / "README").units[0].text == "Read me first."
    assert load(tmp_path / "NEWS.Debian.gz").units[0].text == "Version 2 is out."
    with pytest.raises(NotADocument, match="not a text file"):
        load(tmp_path / "blob")
    assert may_be_text(Path("copyright")) and not may_be_text(Path("photo.jpeg"))
    assert not may_be_text(Path("a.tar.gz")) and detect_format(Path("guide.md.gz")) == "markdown"


def test_gzip_is_bounded_and_checked(tmp_path: Path) -> None:
    from pipeline.ingest.loaders import NotADocument

    bomb = tmp_path / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(b"a" * (8 << 20)))  # 8 MiB inside, a few KiB on disk
    with pytest.raises(NotADocument, match="decompressed size over the limit of 1 MB"):
        load(bomb, max_bytes=1 << 20)
    broken = tmp_path / "broken.md.gz"
    whole = gzip.compress(b"# Title\n\n" + os.urandom(4000).hex().encode())
    broken.write_bytes(whole[:len(whole) // 2])  # cut off mid-stream
    assert _load_error(broken).startswith("corrupt gzip file")


@pytest.mark.parametrize("name,data", [("notes.txt", b"Otters hold hands.\n"),
                                       ("notes.txt.gz", gzip.compress(b"Otters hold hands.\n", mtime=0))],
                         ids=["plain", "gzip"])
def test_a_size_limit_larger_than_memory_reads_the_file_as_it_is(tmp_path: Path, name: str, data: bytes) -> None:
    """The buffer grows with what the file holds, never to the size of the limit (1 TiB here:
    ``read(limit + 1)`` allocated that much and failed every file with MemoryError)."""
    (tmp_path / name).write_bytes(data)
    assert load(tmp_path / name, max_bytes=1 << 40).units[0].text == "Otters hold hands."
