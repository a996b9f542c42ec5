"""How strongly the lexical side counts, per query: how much of the query's rare-word weight its best
hit matched (and, optionally, how sure the dense side is of its own ranking).

BM25 helps when a question shares rare words with the passage (a function name, a flag, an
error code) and hurts when it shares only common ones: a paraphrased question ("how do I change my
engine oil?" of a manual that says "swap the lubricant of the motor") matches whatever chunk
repeats "how do I", and reciprocal-rank fusion gives that chunk as much weight as the dense side's
best.
The query's words are weighed by their inverse document frequency in the collection, words the
collection does not hold at all included (the question speaks another vocabulary than the
text); :func:`lexical_strength` is the share of that weight the best BM25 hit contains, and
:func:`lexical_weight` maps it to the lexical side's weight: 0 below ``floor`` (the hit matched
only common words: dense alone decides), 1 from ``full`` up (even fusion), linear in between.

Optionally (``sure`` > 0; off by default) a partial lexical match counts only where the dense side
is unsure: a small embedder that is sure of a paraphrase puts its answer well ahead of its fifth hit,
and a lexical hit on some of the question's words would only push it down. Below ``sure`` (a hit
that holds at least that share of the query's weight, such as an exact identifier, always counts)
the weight is then also scaled by :func:`dense_doubt`: 1 while the dense side's first hit leads its
fifth by at most ``gap_floor`` in cosine similarity, 0 from ``gap_full`` up. Every threshold was
chosen on the development sets only, among rules scored offline (``benchmarks/fusion_choice.py``,
docs/retrieval.md); the gap thresholds are in the default embedder's similarity scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

from ..store.terms import TermStats, words

__all__ = ["FUSIONS", "AdaptiveFusion", "TermStats", "dense_doubt", "idf", "lexical_strength", "lexical_weight",
           "words"]

if TYPE_CHECKING:
    from ..config.settings import RetrievalConfig
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


def dense_doubt(similarities: Sequence[float], *, floor: float, full: float) -> float:
    """How unsure the dense side is, from its hits' similarities (best first): 1 while the first leads
    the fifth by at most ``floor``, 0 from ``full`` up, linear in between; 1 with fewer than five hits."""
    if len(similarities) < 5:
        return 1.0
    return 1.0 - lexical_weight(similarities[0] - similarities[4], floor=floor, full=full)


@dataclass(frozen=True)
class AdaptiveFusion:
    """The lexical side's weight for each query (``retrieval.fusion = "adaptive"``)."""

    floor: float = 0.1
    full: float = 0.5
    sure: float = 0.0
    gap_floor: float = 0.04
    gap_full: float = 0.06

    @classmethod
    def from_config(cls, r: "RetrievalConfig") -> "AdaptiveFusion":
        return cls(r.lexical_floor, r.lexical_full, r.lexical_sure, r.dense_gap_floor, r.dense_gap_full)

    def weight(self, query: str, best: "StoredChunk", store: "Store", *,
               dense: Sequence[tuple["StoredChunk", float]] = ()) -> float:
        """The weight for ``query`` whose best BM25 hit is ``best`` and whose dense hits are ``dense``
        (best first, with their similarities): one small index lookup."""
        stats, matched = store.catalog.term_stats(store.name, query, best.chunk_id)
        strength = lexical_strength(stats, matched)
        w = lexical_weight(strength, floor=self.floor, full=self.full)
        if strength < self.sure and dense:
            w *= dense_doubt([s for _, s in dense], floor=self.gap_floor, full=self.gap_full)
        return w
