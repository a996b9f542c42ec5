"""What the lexical index knows about a query's words, the same for both catalogs.

Adaptive fusion (:mod:`pipeline.retrieval.fusion`) weighs the lexical side of a query by how
much of the query's idf weight its best hit matched; the catalogs answer it with
:class:`TermStats` (``Catalog.term_stats``), and split text into words with :func:`words`
the way SQLite's ``unicode61`` tokenizer does.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Mapping

_WORD = re.compile(r"\w+", re.UNICODE)

MAX_QUERY_TERMS = 128
"""The most distinct words of a query the lexical side searches: the first ones. A question is far
shorter; a pasted book would otherwise cost a term (a posting-list scan) per word."""


@dataclass(frozen=True)
class TermStats:
    """How many chunks the index holds, and in how many of them each of a query's words occurs
    (0 for a word it does not hold)."""

    chunks: int
    df: Mapping[str, int]


def words(text: str) -> list[str]:
    """The distinct index words of ``text``, in order: lower-cased and without diacritics, as
    SQLite's ``unicode61`` tokenizer folds them."""
    return list(dict.fromkeys(_WORD.findall(_fold(text))))


def _fold(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text.lower())
    return "".join(c for c in folded if not unicodedata.combining(c))


def query_text(text: str) -> str:
    """The part of a query the lexical side searches: up to its :data:`MAX_QUERY_TERMS` + 1st
    distinct word (the whole of any question)."""
    seen: set[str] = set()
    for m in _WORD.finditer(text):
        w = _fold(m.group())
        if w not in seen:
            if len(seen) == MAX_QUERY_TERMS:
                return text[:m.start()]
            seen.add(w)
    return text


def query_terms(text: str) -> list[str]:
    """The distinct words the lexical side searches for a query: :func:`words` of :func:`query_text`."""
    return words(query_text(text))
