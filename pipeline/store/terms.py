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


@dataclass(frozen=True)
class TermStats:
    """How many chunks the index holds, and in how many of them each of a query's words occurs
    (0 for a word it does not hold)."""

    chunks: int
    df: Mapping[str, int]


def words(text: str) -> list[str]:
    """The distinct index words of ``text``, in order: lower-cased and without diacritics, as
    SQLite's ``unicode61`` tokenizer folds them."""
    folded = unicodedata.normalize("NFKD", text.lower())
    folded = "".join(c for c in folded if not unicodedata.combining(c))
    return list(dict.fromkeys(_WORD.findall(folded)))
