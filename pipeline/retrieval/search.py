"""Query → hits: dense (Chroma) and lexical (BM25) candidates fused by reciprocal rank,
optionally diversified by MMR, then expanded with neighbouring chunks into passages.

A small embedder misses exact technical terms (function names, header files,
error codes, flags) that a lexical index finds, and finds paraphrases that BM25
misses; reciprocal-rank fusion needs no score calibration between the two.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from ..engine.contract import TextEmbedder
from ..engine.embed_prompts import embed_query
from ..store.store import Store
from ..records import Hit, Passage, StoredChunk

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .fusion import AdaptiveFusion
    from .rerank import Reranker


def rrf(rankings: dict[str, list[tuple[StoredChunk, float]]], *, k: int,
        weights: dict[str, float] | None = None) -> list[tuple[StoredChunk, float, dict]]:
    """Reciprocal-rank fusion: score = Σ w / (k + rank), rank from 1, over the sides that found a
    chunk; a side's weight ``w`` is 1 unless ``weights`` says otherwise."""
    fused: dict[str, tuple[StoredChunk, float, dict]] = {}
    for side, hits in rankings.items():
        w = 1.0 if weights is None else weights.get(side, 1.0)
        for rank, (chunk, score) in enumerate(hits, start=1):
            entry = fused.get(chunk.chunk_id)
            detail = dict(entry[2]) if entry else {}
            detail[side] = (rank, score)
            total = (entry[1] if entry else 0.0) + w / (k + rank)
            fused[chunk.chunk_id] = (entry[0] if entry else chunk, total, detail)
    return sorted(fused.values(), key=lambda e: (-e[1], e[0].source, e[0].index))


def mmr(query_vector, candidates: list, vectors: dict, *, k: int, lam: float) -> list:
    """Maximal marginal relevance: trade relevance to the query against redundancy with what is chosen."""
    import numpy as np

    pool = [c for c in candidates if c[0].chunk_id in vectors]
    chosen: list = []
    while pool and len(chosen) < k:
        best, best_score = None, -np.inf
        for cand in pool:
            v = vectors[cand[0].chunk_id]
            rel = float(v @ query_vector)
            red = max((float(v @ vectors[c[0].chunk_id]) for c in chosen), default=0.0)
            score = lam * rel - (1 - lam) * red
            if score > best_score:
                best, best_score = cand, score
        chosen.append(best)
        pool.remove(best)
    return chosen


def search(query: str, *, store: Store, embedder: TextEmbedder | None, top_k: int, dense: bool = True,
           lexical: bool = True, candidates: int = 40, rrf_k: int = 60, source: str | Sequence[str] | None = None,
           use_mmr: bool = False, mmr_lambda: float = 0.7, rerank: "Reranker | None" = None,
           fusion: "AdaptiveFusion | None" = None, dense_query: str | None = None,
           timings: dict[str, float] | None = None) -> list[Hit]:
    """The ``top_k`` best chunks for ``query`` from the enabled sides, of ``source`` (one document,
    several, or all when None). ``store`` must be open.

    ``fusion`` (see :mod:`.fusion`) weighs the lexical side for this query, in the fusion and
    the reranking alike (None: both sides count evenly); ``dense_query`` is what the dense side
    embeds instead of ``query`` (HyDE, see :mod:`.expansion`); ``rerank`` (see :mod:`.rerank`)
    re-orders the fused candidates; ``timings``, when given, receives the seconds spent per
    stage (embed_query, dense, lexical, fuse, rerank).
    """
    store.require()
    clock = _Stopwatch(timings)
    rankings: dict[str, list[tuple[StoredChunk, float]]] = {}
    vector = None
    if dense and embedder is not None:
        vector = embed_query(embedder, [dense_query or query])[0]
        clock.lap("embed_query")
        rankings["dense"] = store.dense(vector, limit=candidates, source=source)
        clock.lap("dense")
    if lexical:
        rankings["lexical"] = store.lexical(query, limit=candidates, source=source)
        clock.lap("lexical")
    lexical_weight = 1.0
    if fusion is not None and "dense" in rankings and rankings.get("lexical"):
        lexical_weight = fusion.weight(query, rankings["lexical"][0][0], store, dense=rankings["dense"])
    fused = rrf(rankings, k=rrf_k, weights={"lexical": lexical_weight})
    clock.lap("fuse")
    if rerank is not None and len(rankings) > 1:
        fused = rerank(query, fused, vector=vector, store=store, lexical_weight=lexical_weight)
        clock.lap("rerank")
    if use_mmr and vector is not None and len(fused) > top_k:
        fused = mmr(vector, fused, store.vectors([c[0].chunk_id for c in fused]), k=top_k, lam=mmr_lambda)
    hits = []
    for chunk, score, detail in fused[:top_k]:
        d_rank, d_score = detail.get("dense", (None, None))
        l_rank, l_score = detail.get("lexical", (None, None))
        hits.append(Hit(source=chunk.source, page=chunk.page, score=round(score, 6), text=chunk.text,
                        found_by=tuple(s for s in ("dense", "lexical") if s in detail),
                        chunk_id=chunk.chunk_id, index=chunk.index, content_hash=chunk.content_hash,
                        dense_rank=d_rank, dense_similarity=None if d_score is None else round(d_score, 4),
                        lexical_rank=l_rank, bm25=None if l_score is None else round(l_score, 4)))
    return hits


def retrieve(rt: "Runtime", store: Store, query: str, *, top_k: int, source: str | Sequence[str] | None = None,
             use_mmr: bool = False, timings: dict[str, float] | None = None, **changes) -> list[Hit]:
    """:func:`search` as configured (``[retrieval]``, ``ask.mmr_lambda``), with the runtime's embedder;
    ``changes`` override retrieval settings for this call (dense, lexical, rerank, fusion)."""
    import dataclasses
    import time

    from .fusion import AdaptiveFusion
    from .rerank import make_reranker

    r = dataclasses.replace(rt.config.retrieval, **changes) if changes else rt.config.retrieval
    if r.dense:
        rt.embedder.dim  # loads the model outside the timed stages
    reranker = make_reranker(r.rerank, candidates=max(r.rerank_candidates, top_k),
                             dense_weight=r.rerank_dense_weight, normalise=r.rerank_normalise)
    fusion = AdaptiveFusion.from_config(r) if r.fusion == "adaptive" else None
    dense_query = None
    if r.hyde and r.dense:
        from .expansion import hyde_query, hypothetical_passage

        started = time.perf_counter()
        passage = hypothetical_passage(rt.pool.pick(), query, max_tokens=r.hyde_tokens)
        dense_query = hyde_query(query, passage)
        if timings is not None:
            timings["hyde"] = timings.get("hyde", 0.0) + time.perf_counter() - started
    return search(query, store=store, embedder=rt.embedder if r.dense else None, top_k=top_k,
                  dense=r.dense, lexical=r.lexical, candidates=max(r.candidates, top_k), rrf_k=r.rrf_k,
                  source=source, use_mmr=use_mmr, mmr_lambda=rt.config.ask.mmr_lambda,
                  rerank=reranker, fusion=fusion, dense_query=dense_query, timings=timings)


def search_collection(rt: "Runtime", query: str, *, top_k: int | None = None,
                      timings: dict[str, float] | None = None) -> list[Hit]:
    """:meth:`Pipeline.search <pipeline.api.Pipeline.search>`: the collection's best chunks for ``query``."""
    from ..errors import InputError
    from ..inputs import check_text, check_top_k

    if not isinstance(query, str) or not query.strip():
        raise InputError("the query is empty")
    check_text(query, "the query")
    check_top_k(top_k)
    with rt.store(create=False) as store:
        store.require()
        rt.check_embedder(store)
        return retrieve(rt, store, query, top_k=top_k or rt.config.retrieval.top_k, timings=timings)


class _Stopwatch:
    """Seconds between laps, added to ``into`` under each lap's name (nothing when ``into`` is None)."""

    def __init__(self, into: dict[str, float] | None):
        self.into = into
        self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.into is not None:
            now = time.perf_counter()
            self.into[name] = self.into.get(name, 0.0) + now - self.last
            self.last = now


def merge_chunks(chunks: list[StoredChunk], *, rank: int = 0) -> list[Passage]:
    """Consecutive chunks (sorted by index) as passages; overlapping text appears once."""
    passages: list[Passage] = []
    run: list[StoredChunk] = []

    def flush() -> None:
        if not run:
            return
        text = run[0].text
        for prev, cur in zip(run, run[1:]):
            if cur.page == prev.page and cur.start < prev.end <= cur.end:
                text += cur.text[prev.end - cur.start:]  # offsets index the same page text
            else:
                text += "\n\n" + cur.text
        pages = tuple(sorted({c.page for c in run if c.page is not None}))
        passages.append(Passage(run[0].source, run[0].content_hash, run[0].index, run[-1].index, pages,
                                text.strip(), rank))
        run.clear()

    for chunk in chunks:
        if run and (chunk.source != run[-1].source or chunk.index != run[-1].index + 1):
            flush()
        run.append(chunk)
    flush()
    return passages


def expand(hits: list[Hit], *, store: Store, neighbours: int) -> list[Passage]:
    """Each hit widened by ``neighbours`` chunks on either side; overlapping windows merged.

    A merged passage keeps the best rank of the hits inside it, so packing can
    drop the least relevant passages first.
    """
    windows: dict[str, dict[int, int]] = {}  # source -> chunk index -> best rank
    for rank, hit in enumerate(hits):
        ranks = windows.setdefault(hit.source, {})
        for i in range(max(0, hit.index - neighbours), hit.index + neighbours + 1):
            ranks[i] = min(ranks.get(i, rank), rank)
    passages: list[Passage] = []
    for source, ranks in windows.items():
        lo, hi = min(ranks), max(ranks)
        chunks = [c for c in store.catalog.chunks(store.name, source, first=lo, last=hi) if c.index in ranks]
        for p in merge_chunks(chunks):
            best = min(ranks[i] for i in range(p.first, p.last + 1) if i in ranks)
            passages.append(Passage(p.source, p.content_hash, p.first, p.last, p.pages, p.text, best))
    return passages


def whole_document(source: str, *, store: Store) -> list[Passage]:
    """Every chunk of one document, in order, as passages (one per run of consecutive chunks)."""
    return merge_chunks(store.catalog.chunks(store.name, source))
