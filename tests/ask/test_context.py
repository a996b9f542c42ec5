"""Packing passages into a prompt: budget, order, drops, truncation, shared prefixes."""

from __future__ import annotations

import pytest

from pipeline.ask.prompt import pack
from pipeline.errors import EngineError
from pipeline.records import Passage, StoredChunk
from pipeline.retrieval.search import merge_chunks


def words(text: str, *, special: bool = False) -> list[int]:
    """A stand-in tokenizer: one token per whitespace-separated word (pack only counts tokens)."""
    return [hash(w) % 50000 for w in text.split()]


def chat(system: str, user: str) -> str:
    return f"<sys> {system} </sys> <user> {user} </user> <assistant>"


def passage(source: str, first: int, n_words: int, rank: int, page: int | None = None) -> Passage:
    text = " ".join(f"{source}-{first}-w{i}." for i in range(n_words))
    return Passage(source, "h", first, first, (page,) if page else (), text, rank)


def packed(passages, question="what now?", n_ctx=200, reserve=20):
    return pack(passages, question, chat=chat, tokenize=words, bos=[1], n_ctx=n_ctx, reserve=reserve,
                system="answer")


def test_prompt_never_exceeds_context_and_drops_lowest_ranked():
    ps = [passage("b.md", 0, 40, rank=0), passage("a.md", 5, 40, rank=1), passage("a.md", 1, 40, rank=2),
          passage("c.md", 0, 40, rank=3)]
    p = packed(ps, n_ctx=180, reserve=20)  # room for three of the four passages
    assert len(p.tokens) + 20 <= 180
    assert {x.rank for x in p.passages} == {0, 1, 2} and p.dropped == 1
    # Ordered by document and position, not by rank; numbered in that order.
    assert [(x.source, x.first) for x in p.passages] == [("a.md", 1), ("a.md", 5), ("b.md", 0)]
    assert [s["n"] for s in p.sources] == [1, 2, 3]
    assert p.prefix.index("[1] a.md") < p.prefix.index("[2] a.md") < p.prefix.index("[3] b.md")


def test_question_is_last_and_prefixes_are_shared():
    ps = [passage("a.md", 0, 10, 0), passage("b.md", 0, 10, 1)]
    one, two = packed(ps, "first question?"), packed(ps, "a different one?")
    assert one.prefix == two.prefix and one.prefix_tokens == two.prefix_tokens
    assert one.tokens[:len(one.prefix_tokens)] == one.prefix_tokens
    # split after the shared head and at the end of the passages
    assert one.boundaries[-1] == len(one.prefix_tokens) and len(one.boundaries) == 2
    assert one.suffix.startswith("Question: first question?") and "first question" not in one.prefix


def test_single_oversized_passage_is_cut_at_a_sentence_and_flagged():
    p = packed([passage("a.md", 0, 500, 0)], n_ctx=120, reserve=10)
    assert p.truncated and len(p.passages) == 1
    text = p.passages[0].text
    assert text.endswith(". […]")
    assert len(p.tokens) + 10 <= 120


def test_no_room_for_documents_is_a_clear_error():
    with pytest.raises(EngineError, match="no room for documents"):
        packed([passage("a.md", 0, 5, 0)], n_ctx=20, reserve=15)


def test_merge_chunks_removes_overlap_and_splits_runs():
    page = "Alpha beta gamma. Delta epsilon zeta. Eta theta iota."
    c0 = StoredChunk("0", "s", "h", 0, 1, 0, 36, 5, page[0:36])
    c1 = StoredChunk("1", "s", "h", 1, 1, 18, len(page), 5, page[18:])
    c3 = StoredChunk("3", "s", "h", 3, 2, 0, 5, 1, "Other")
    merged = merge_chunks([c0, c1, c3])
    assert [m.text for m in merged] == [page, "Other"]
    assert [(m.first, m.last, m.pages) for m in merged] == [(0, 1, (1,)), (3, 3, (2,))]
