"""Adaptive fusion: BM25 counts when the query shares rare words with its best hit, not when it shares common ones.

Two constructed cases on a real store (SQLite FTS5 + Chroma), with an embedder fake that knows
synonyms (so the dense side bridges a paraphrase and the lexical side cannot):

- BM25 must win: the query names a rare fault code that one chunk holds, while the dense side
  prefers a chunk about faults in general;
- BM25 must not win: a paraphrased question shares only "how", "do", "I", "the" with a chunk
  that repeats them, while the dense side finds the answer through synonyms;
- with the dense side's doubt on (opt-in), a partial match counts only while the dense side is unsure.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import load_config
from pipeline.retrieval.fusion import AdaptiveFusion, TermStats, dense_doubt, lexical_strength, lexical_weight, words
from support.servers import pg_cluster, pg_url  # noqa: F401  (fixtures)

# Words that mean the same thing share a coordinate: what a real embedder learns and BM25 cannot.
CONCEPTS = [("car", "automobile", "vehicle"), ("engine", "motor"), ("oil", "lubricant"),
            ("change", "replace", "swap"), ("tyre", "tire", "wheel"), ("pressure", "inflate"),
            ("fault", "faults", "error"), ("lamp", "light", "lights"), ("mean", "means", "meaning"),
            ("brake", "brakes"), ("seat", "seats"), ("battery", "charge")]
_CONCEPT = {w: i for i, group in enumerate(CONCEPTS) for w in group}


class ConceptEmbedder:
    """Bag of concepts: synonyms land on one coordinate, other words on small hashed ones."""

    def __init__(self, dim: int = 64):
        self.model_path = Path("fake-concept-embedder")
        self.dim = dim
        self.max_tokens = 256
        self.identity = "fake-concept-embedder"

    def tokenize(self, text: str) -> list[int]:
        return [zlib.crc32(w.encode()) % 50_000 for w in re.findall(r"\w+", text.lower())]

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    def sequence(self, text: str) -> list[str]:  # the text itself: embed_tokens needs the words
        return [text]

    def embed(self, texts):
        return self.embed_tokens([[t] for t in texts])

    def embed_tokens(self, seqs):
        out = np.zeros((len(seqs), self.dim), dtype=np.float32)
        for i, (text,) in enumerate(seqs):
            for w in re.findall(r"\w+", text.lower()):
                if w in _CONCEPT:
                    out[i, _CONCEPT[w]] += 1.0
                else:
                    out[i, len(CONCEPTS) + zlib.crc32(w.encode()) % (self.dim - len(CONCEPTS))] += 0.15
            out[i, -1] += 1e-3
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def close(self) -> None:
        pass


# Most chunks end with the manual's footer, so "how", "do", "I", "what" and "does" are as common
# as in a real manual; the introduction repeats them; the two answers have no footer.
FOOTER = " What does a word mean, and how do I do it? I ask at the garage."
DOCS = {
    "oil.md": "# Servicing\n\nSwap the lubricant of the motor every 10,000 km, with the motor warm.",
    "intro.md": "# Using it\n\nHow do I? How do I do it? What do I do? How do I? What does it do?",
    "faults.md": "# Fault codes\n\nE42_QX7: the pressure sensor of the rear axle is unplugged.",
    "lamp.md": "# The fault lamp\n\nA fault lights the lamp. Every fault and error lights the fault lamp; "
               "the fault list says what each one means." + FOOTER,
    "tyres.md": "# Tyres\n\nInflate each tire to the pressure printed on the door frame." + FOOTER,
    "brakes.md": "# Brakes\n\nBrake pads wear faster in town; check the brakes at every service." + FOOTER,
    "seats.md": "# Seats\n\nThe seats fold flat from the boot with one lever on each side." + FOOTER,
    "battery.md": "# Battery\n\nCharge the battery when the car stands for more than a month." + FOOTER,
}


@pytest.fixture
def shelf(tmp_path, fake_pipeline):
    folder = tmp_path / "manual"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")

    def make(**overrides):
        rag = fake_pipeline(embedder=ConceptEmbedder(), **overrides)
        rag.ingest([folder])
        return rag

    return make


def top(rag, query: str, **changes) -> str:
    from pipeline.retrieval.search import retrieve

    with rag.store(create=False) as store:
        hits = retrieve(rag.runtime, store, query, top_k=5, **changes)
    return Path(hits[0].source).name


PARAPHRASE = "How do I change my engine oil?"
RARE = "What does fault E42_QX7 mean?"


def test_bm25_must_not_win_when_the_query_shares_only_common_words(shelf):
    rag = shelf()
    assert top(rag, PARAPHRASE, rerank="none", lexical=False) == "oil.md"  # dense alone finds it
    assert top(rag, PARAPHRASE, rerank="none", dense=False) == "intro.md"  # BM25 alone: the common words
    # Even fusion lets the chunk that repeats "how do I" outvote the dense side; adaptive fusion does not.
    assert top(rag, PARAPHRASE, fusion="rrf") == "intro.md"
    assert top(rag, PARAPHRASE) == "oil.md"
    assert top(rag, PARAPHRASE, rerank="none") == "oil.md"


def test_bm25_must_win_when_the_query_shares_a_rare_word(shelf):
    rag = shelf()
    assert top(rag, RARE, rerank="none", lexical=False) == "lamp.md"  # dense: faults in general
    assert top(rag, RARE, rerank="none", dense=False) == "faults.md"
    assert top(rag, RARE) == "faults.md"
    assert top(rag, RARE, rerank="none") == "faults.md"


def test_the_weight_follows_the_idf_share_the_best_hit_matched(shelf):
    rag = shelf()
    with rag.store(create=False) as store:
        best = store.lexical(PARAPHRASE, limit=1)[0][0]
        stats, matched = store.catalog.term_stats(store.name, PARAPHRASE, best.chunk_id)
        assert best.source.endswith("intro.md")
        assert stats.df["oil"] == 0 and stats.df["how"] == len(DOCS) - 2  # words the shelf lacks count too
        assert matched == {"how", "do", "i"}
        assert lexical_strength(stats, matched) < 0.1
        best = store.lexical(RARE, limit=1)[0][0]
        stats, matched = store.catalog.term_stats(store.name, RARE, best.chunk_id)
        assert "e42_qx7" in matched and stats.df["e42_qx7"] == 1
        assert lexical_strength(stats, matched) > 0.5


def test_a_floor_of_zero_and_full_of_zero_is_plain_fusion(shelf):
    rag = shelf(retrieval__lexical_floor=0.0, retrieval__lexical_full=0.0)
    assert top(rag, PARAPHRASE) == top(rag, PARAPHRASE, fusion="rrf") == "intro.md"


def test_strength_and_weight_arithmetic():
    stats = TermStats(100, {"rare": 1, "common": 90, "absent": 0})
    assert lexical_strength(stats, set()) == 0.0
    assert lexical_strength(stats, {"rare", "common", "absent"}) == pytest.approx(1.0)
    assert lexical_strength(stats, {"common"}) < 0.05 < lexical_strength(stats, {"rare"})
    assert lexical_strength(TermStats(0, {}), set()) == 0.0
    assert lexical_weight(0.05, floor=0.1, full=0.5) == 0.0
    assert lexical_weight(0.3, floor=0.1, full=0.5) == pytest.approx(0.5)
    assert lexical_weight(0.9, floor=0.1, full=0.5) == 1.0
    assert lexical_weight(0.2, floor=0.3, full=0.3) == 0.0 and lexical_weight(0.3, floor=0.3, full=0.3) == 1.0
    assert words("Naïve CAFÉ naive_x, café") == ["naive", "cafe", "naive_x"]


PARTIAL = "How often should I check the brakes of the car?"  # "brakes" is rare, "check", "car" and the rest are not


def test_a_partial_match_counts_only_while_the_dense_side_is_unsure(shelf):
    """With ``lexical_sure`` on, below it the lexical weight follows the dense side's doubt: a sure dense side
    (its first hit far ahead of its fifth) keeps a partial BM25 match out, an unsure one lets it in;
    a match that holds most of the query's rare weight counts whatever the dense side says."""
    rag = shelf(retrieval__lexical_floor=0.0, retrieval__lexical_full=0.3, retrieval__lexical_sure=0.5)
    fusion = AdaptiveFusion.from_config(rag.config.retrieval)
    assert AdaptiveFusion.from_config(load_config().retrieval).sure == 0.0  # off by default
    with rag.store(create=False) as store:
        best = store.lexical(PARTIAL, limit=1)[0][0]
        assert best.source.endswith("brakes.md")
        stats, matched = store.catalog.term_stats(store.name, PARTIAL, best.chunk_id)
        strength = lexical_strength(stats, matched)
        assert fusion.full <= strength < fusion.sure  # a partial match: full weight without the dense side's say
        sure = [(best, s) for s in (0.90, 0.80, 0.79, 0.78, 0.77)]     # the first leads the fifth by 0.13
        unsure = [(best, s) for s in (0.80, 0.79, 0.79, 0.78, 0.78)]   # by 0.02
        between = [(best, s) for s in (0.80, 0.79, 0.78, 0.77, 0.75)]  # by 0.05: half way
        assert fusion.weight(PARTIAL, best, store, dense=sure) == 0.0
        assert fusion.weight(PARTIAL, best, store, dense=unsure) == 1.0
        assert fusion.weight(PARTIAL, best, store, dense=between) == pytest.approx(0.5)
        assert fusion.weight(PARTIAL, best, store) == 1.0  # no dense side: nothing to doubt
        rare = store.lexical(RARE, limit=1)[0][0]
        assert fusion.weight(RARE, rare, store, dense=sure) == 1.0  # an exact identifier always counts


def test_dense_doubt_arithmetic():
    assert dense_doubt([0.9, 0.8, 0.8, 0.8, 0.8], floor=0.04, full=0.06) == 0.0
    assert dense_doubt([0.81, 0.8, 0.8, 0.8, 0.8], floor=0.04, full=0.06) == 1.0
    assert dense_doubt([0.85, 0.8, 0.8, 0.8, 0.8], floor=0.04, full=0.06) == pytest.approx(0.5)
    assert dense_doubt([0.9, 0.1], floor=0.04, full=0.06) == 1.0  # fewer than five hits: no evidence


def test_fusion_settings_are_checked():
    from pipeline.config import load_config
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="retrieval.fusion"):
        load_config(overrides={"retrieval.fusion": "weighted"})
    with pytest.raises(ConfigError, match="lexical_floor"):
        load_config(overrides={"retrieval.lexical_floor": 0.6, "retrieval.lexical_full": 0.5})
    with pytest.raises(ConfigError, match="dense_gap_floor"):
        load_config(overrides={"retrieval.dense_gap_floor": 0.1, "retrieval.dense_gap_full": 0.05})
    with pytest.raises(ConfigError, match="lexical_sure"):
        load_config(overrides={"retrieval.lexical_sure": 1.5})


@pytest.mark.slow
def test_both_cases_hold_with_the_catalog_in_postgresql(tmp_path, fake_pipeline, pg_url):
    """The same two cases with the full-text index in PostgreSQL (its own lexemes and counts)."""
    folder = tmp_path / "manual"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    rag = fake_pipeline(embedder=ConceptEmbedder(), store__catalog_url=pg_url)
    rag.ingest([folder])
    assert top(rag, PARAPHRASE, fusion="rrf") == "intro.md"
    assert top(rag, PARAPHRASE) == "oil.md"
    assert top(rag, RARE, rerank="none", lexical=False) == "lamp.md"
    assert top(rag, RARE) == "faults.md"
    with rag.store(create=False) as store:
        best = store.lexical(RARE, limit=1)[0][0]
        stats, matched = store.catalog.term_stats(store.name, RARE, best.chunk_id)
        assert stats.df["e42"] == 1 and {"e42", "qx7", "fault"} <= matched  # PostgreSQL splits at "_"
        assert lexical_strength(stats, matched) > 0.5
