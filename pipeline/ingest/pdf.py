"""PDF files: one text unit per page with text, through pypdf.

A damaged file is reported once, as :class:`~pipeline.errors.LoadError` with a short
reason: pypdf raises many exception types on damaged files, and they are all caught
here, at the boundary; its logger's robustness warnings are silenced while it reads.
"""

from __future__ import annotations

import contextlib
import io
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import LoadError
from .text import LoadedDocument, TextUnit, describe, normalize_text

if TYPE_CHECKING:
    from pypdf import PdfReader

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


def load_pdf(path: Path, data: bytes) -> LoadedDocument:
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
            raise LoadError(f"corrupt PDF: {describe(err)}") from err
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


__all__ = ["load_pdf"]
