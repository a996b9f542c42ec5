"""Query → hits: dense (Chroma) and lexical (BM25) candidates fused by reciprocal rank.

A small embedder misses exact technical terms (function names, header files,
error codes, flags) that a lexical index finds, and finds paraphrases that BM25
misses; reciprocal-rank fusion needs no score calibration between the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .catalog import StoredChunk
from .embed import Embedder
from .store import Store


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk. ``found_by`` names the sides that returned it."""

    source: str
    page: int | None
    score: float
    text: str
    found_by: tuple[str, ...]
    chunk_id: str
    index: int
    content_hash: str
    dense_rank: int | None = None
    dense_similarity: float | None = None
    lexical_rank: int | None = None
    bm25: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["found_by"] = list(self.found_by)
        return d


def rrf(rankings: dict[str, list[tuple[StoredChunk, float]]], *, k: int) -> list[tuple[StoredChunk, float, dict]]:
    """Reciprocal-rank fusion: score = Σ 1 / (k + rank), rank from 1, over the sides that found a chunk."""
    fused: dict[str, tuple[StoredChunk, float, dict]] = {}
    for side, hits in rankings.items():
        for rank, (chunk, score) in enumerate(hits, start=1):
            entry = fused.get(chunk.chunk_id)
            detail = dict(entry[2]) if entry else {}
            detail[side] = (rank, score)
            total = (entry[1] if entry else 0.0) + 1.0 / (k + rank)
            fused[chunk.chunk_id] = (entry[0] if entry else chunk, total, detail)
    return sorted(fused.values(), key=lambda e: (-e[1], e[0].source, e[0].index))


def search(query: str, *, store: Store, embedder: Embedder | None, top_k: int, dense: bool = True,
           lexical: bool = True, candidates: int = 40, rrf_k: int = 60) -> list[Hit]:
    """The ``top_k`` best chunks for ``query`` from the enabled sides. ``store`` must be open."""
    store.require()
    rankings: dict[str, list[tuple[StoredChunk, float]]] = {}
    if dense and embedder is not None:
        vector = embedder.embed([query])[0]
        rankings["dense"] = store.dense(vector, limit=candidates)
    if lexical:
        rankings["lexical"] = store.lexical(query, limit=candidates)
    hits = []
    for chunk, score, detail in rrf(rankings, k=rrf_k)[:top_k]:
        d_rank, d_score = detail.get("dense", (None, None))
        l_rank, l_score = detail.get("lexical", (None, None))
        hits.append(Hit(source=chunk.source, page=chunk.page, score=round(score, 6), text=chunk.text,
                        found_by=tuple(s for s in ("dense", "lexical") if s in detail),
                        chunk_id=chunk.chunk_id, index=chunk.index, content_hash=chunk.content_hash,
                        dense_rank=d_rank, dense_similarity=None if d_score is None else round(d_score, 4),
                        lexical_rank=l_rank, bm25=None if l_score is None else round(l_score, 4)))
    return hits
