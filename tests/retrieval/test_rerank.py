"""The rerank stage: a chunk that fusion ranks low because one side missed it comes back up."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.retrieval.rerank import ScoreRerank, make_reranker, minmax
from pipeline.retrieval.search import rrf
from pipeline.records import StoredChunk


def chunk(name: str, index: int) -> StoredChunk:
    return StoredChunk(name, "/d/doc.md", "h", index, None, 0, 1, 1, f"text of {name}")


class FakeStore:
    """The two reads the reranker makes: stored vectors and BM25 scores of given chunks."""

    name = "c"

    def __init__(self, vectors: dict, bm25: dict):
        self._vectors, self._bm25 = vectors, bm25
        self.catalog = self

    def vectors(self, ids):
        return {i: self._vectors[i] for i in ids if i in self._vectors}

    def bm25(self, collection, query, ids):
        return {i: self._bm25[i] for i in ids if i in self._bm25}


def unit(angle: float) -> np.ndarray:
    return np.array([np.cos(angle), np.sin(angle)], dtype=np.float32)


def test_fusion_ranks_a_lexical_only_hit_low_and_the_reranker_puts_it_first():
    query = unit(0.0)
    target, a, b, c = chunk("target", 0), chunk("a", 1), chunk("b", 2), chunk("c", 3)
    # The dense side returned a, b, c (not the target); BM25 ranks the target first by far.
    vectors = {"target": unit(0.50), "a": unit(0.40), "b": unit(0.45), "c": unit(0.48)}
    bm25 = {"target": 12.0, "a": 3.0, "b": 2.5, "c": 2.0}
    rankings = {
        "dense": [(x, float(vectors[x.chunk_id] @ query)) for x in (a, b, c)],
        "lexical": [(x, bm25[x.chunk_id]) for x in (target, a, b, c)],
    }
    fused = rrf(rankings, k=60)
    assert [f[0].chunk_id for f in fused] == ["a", "b", "c", "target"]  # both-sides hits outvote it

    reranked = ScoreRerank(candidates=40, dense_weight=0.5)("query", fused, vector=query,
                                                           store=FakeStore(vectors, bm25))
    assert [r[0].chunk_id for r in reranked] == ["target", "a", "b", "c"]
    assert reranked[0][2]["lexical"] == (1, 12.0)  # the fusion details are kept
    scores = [r[1] for r in reranked]
    assert scores == sorted(scores, reverse=True)


def test_the_dense_weight_decides_between_the_sides():
    query = unit(0.0)
    x, y = chunk("x", 0), chunk("y", 1)
    vectors, bm25 = {"x": unit(0.1), "y": unit(0.9)}, {"x": 1.0, "y": 9.0}
    fused = [(x, 0.02, {"dense": (1, float(vectors["x"] @ query))}), (y, 0.01, {"lexical": (1, 9.0)})]
    store = FakeStore(vectors, bm25)
    dense_led = ScoreRerank(dense_weight=0.9)("q", fused, vector=query, store=store)
    lexical_led = ScoreRerank(dense_weight=0.1)("q", fused, vector=query, store=store)
    assert [r[0].chunk_id for r in dense_led] == ["x", "y"]
    assert [r[0].chunk_id for r in lexical_led] == ["y", "x"]


def test_only_the_top_candidates_are_reranked():
    query = unit(0.0)
    chunks = [chunk(f"c{i}", i) for i in range(5)]
    vectors = {c.chunk_id: unit(0.1 * i) for i, c in enumerate(chunks)}
    bm25 = {c.chunk_id: float(i) for i, c in enumerate(chunks)}  # the last is the best lexical match
    fused = [(c, 1.0 - 0.1 * i, {}) for i, c in enumerate(chunks)]
    out = ScoreRerank(candidates=3, dense_weight=0.0)("q", fused, vector=query, store=FakeStore(vectors, bm25))
    assert [r[0].chunk_id for r in out] == ["c2", "c1", "c0", "c3", "c4"]


def test_minmax_and_the_configured_choice():
    assert minmax([2.0, 4.0, 3.0]) == [0.0, 1.0, 0.5]
    assert minmax([5.0, 5.0]) == [1.0, 1.0]
    assert make_reranker("none", candidates=40, dense_weight=0.5) is None
    assert make_reranker("scores", candidates=12, dense_weight=0.3) == ScoreRerank(candidates=12, dense_weight=0.3)
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="retrieval.rerank"):
        make_reranker("cross", candidates=40, dense_weight=0.5)


def test_real_store_reranking_recovers_the_page_only_bm25_found(make_pipeline, tmp_path):
    """Real Chroma + FTS5 + the real embedder, with a constructed weak query vector (what a small
    embedder does with a paraphrase): the dense side misses the page holding the exact code,
    fusion ranks pages both sides found above it, and the reranker puts it first."""
    import sys
    from pathlib import Path

    from pipeline.retrieval.search import search

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from support.pdfs import make_pdf

    docs = tmp_path / "docs"
    docs.mkdir()
    make_pdf(docs / "unit.pdf", [
        "When the power fails, restart the unit and restore its latest backup.",
        "If the power supply is lost, the controller keeps running on its battery for ten minutes.",
        "A power cut can corrupt open files; the device checks its disks at the next boot.",
        "During a power outage the machine shuts down safely and resumes when supply returns.",
        "Code QX7731 marks a journal checksum mismatch; run the repair tool on the journal volume.",
    ])
    rag = make_pipeline()
    rag.ingest([docs])
    real = rag.embedder

    class Misled:
        """The real embedder, embedding a paraphrase that drifted away from the exact code."""

        def embed(self, texts):
            return real.embed(["what to do after an electricity outage"])

    def run(rerank):
        with rag.store() as store:
            return search("QX7731 after the power went out", store=store, embedder=Misled(), top_k=5,
                          candidates=3, rerank=rerank)

    fused = run(None)
    target = [h for h in fused if h.page == 5]
    assert target and target[0].found_by == ("lexical",) and target[0].lexical_rank == 1
    assert fused.index(target[0]) > 0, [h.page for h in fused]  # fusion let the dense side outvote it
    reranked = run(ScoreRerank())
    assert reranked[0].page == 5, [(h.page, h.score) for h in reranked]
