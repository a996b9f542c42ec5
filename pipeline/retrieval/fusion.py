"""How strongly the lexical side counts, per query: the share of the query's idf weight its best hit matched.

BM25 helps when a question shares rare words with the passage (a function name, a flag, an
error code) and hurts when it shares only common ones: a paraphrased question ("how do I change my
engine oil?" of a manual that says "swap the lubricant of the motor") matches whatever chunk
repeats "how do I", and reciprocal-rank fusion gives that chunk as much weight as the dense side's
best.
The query's words are weighed by their inverse document frequency in the collection, words the
collection does not hold at all included (the question speaks another vocabulary than the
text); :func:`lexical_strength` is the share of that weight the best BM25 hit contains, and
:func:`lexical_weight` maps it to the lexical side's weight: 0 below ``floor`` (the hit matched
only common words: dense alone decides), 1 from ``full`` up (today's even fusion), linear in
between. Both thresholds were chosen on the development sets only (see docs/retrieval.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ..store.terms import TermStats, words

__all__ = ["FUSIONS", "AdaptiveFusion", "TermStats", "idf", "lexical_strength", "lexical_weight", "words"]

if TYPE_CHECKING:
    from ..records import StoredChunk
    from ..store.store import Store

FUSIONS = ("adaptive", "rrf")


def idf(df: int, n: int) -> float:
    """BM25's inverse document frequency (never negative)."""
    return math.log(1 + (n - df + 0.5) / (df + 0.5))


def lexical_strength(stats: TermStats, matched: Iterable[str]) -> float:
    """The share of the query's idf weight that the words in ``matched`` carry (0 to 1)."""
    n = max(stats.chunks, max(stats.df.values(), default=0), 1)
    weights = {t: idf(d, n) for t, d in stats.df.items()}
    total = sum(weights.values())
    if total <= 0:
        return 0.0
    return sum(weights[t] for t in sorted(set(matched)) if t in weights) / total  # sorted: the same float every run


def lexical_weight(strength: float, *, floor: float, full: float) -> float:
    """The lexical side's weight for a query of this strength: 0 up to ``floor``, 1 from ``full``."""
    if full <= floor:
        return 1.0 if strength >= full else 0.0
    return min(1.0, max(0.0, (strength - floor) / (full - floor)))


@dataclass(frozen=True)
class AdaptiveFusion:
    """The lexical side's weight for each query (``retrieval.fusion = "adaptive"``)."""

    floor: float = 0.1
    full: float = 0.5

    def weight(self, query: str, best: "StoredChunk", store: "Store") -> float:
        """The weight for ``query`` whose best BM25 hit is ``best``: one small index lookup."""
        stats, matched = store.catalog.term_stats(store.name, query, best.chunk_id)
        return lexical_weight(lexical_strength(stats, matched), floor=self.floor, full=self.full)
