"""Sections and the section choice, without models: cutting, cache preference, reasons."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline.ask.prompt import Layout
from pipeline.ingest.sections import cut, target_tokens
from pipeline.ask.history import PackHistory, reuse_note
from pipeline.ask.packing import Shelf, pack_shelf
from pipeline.ask.prompt import SectionTokens
from pipeline.records import DocumentRecord, Hit


def words(text: str, *, special: bool = False) -> list[int]:
    return [hash(w) % 50000 for w in text.split()]


def chunks(n, tokens=100, per_page=None):
    return [SimpleNamespace(index=i, tokens=tokens, page=(1 + i // per_page) if per_page else None)
            for i in range(n)]


def test_sections_are_balanced_cut_at_chunk_boundaries_and_prefer_page_starts():
    secs = cut("a", "h", chunks(30, per_page=3), target=1000)
    assert [s.index for s in secs] == list(range(len(secs))) and len(secs) == 3
    assert [(s.first, s.last) for s in secs] == [(0, 8), (9, 20), (21, 29)]  # page starts near 1000 and 2000
    assert all(s.first_page is not None and s.target == 1000 for s in secs)
    assert secs[0].first == 0 and secs[-1].last == 29
    assert [(s.first, s.last) for s in cut("a", "h", chunks(3), target=1000)] == [(0, 2)]
    assert cut("a", "h", [], target=100) == []


def test_default_section_size_is_512_from_8k_up_or_a_quarter_of_the_context_when_composing():
    """Small sections whatever the context (a question's hits in different places each find room),
    a sixteenth of the context below 8K; a quarter where every extra section is a recomputed seam,
    up to 4,096; never below one chunk."""
    assert target_tokens(8192, chunk_size=256) == 512
    assert target_tokens(32768, chunk_size=256) == 512 and target_tokens(262144, chunk_size=256) == 512
    assert target_tokens(4096, chunk_size=256) == 256 and target_tokens(4096, chunk_size=128) == 256
    assert target_tokens(2048, chunk_size=256) == 256  # never below one chunk
    assert target_tokens(65536, chunk_size=1024) == 1024
    assert target_tokens(8192, chunk_size=256, composed=True) == 2048
    assert target_tokens(16384, chunk_size=256, composed=True) == 4096
    # Past 16K a prompt would hold many seams: the exact default (retrieval's best) stands.
    assert target_tokens(65536, chunk_size=256, composed=True) == 512
    assert target_tokens(262144, chunk_size=256, composed=True) == 512
    assert target_tokens(512, chunk_size=256, composed=True) == 256


def _shelf(n_docs=4, per_doc=3, words_per=60):
    from pipeline.records import Section

    sections, segments, docs = [], {}, {}
    for d in range(n_docs):
        src = f"/d/{chr(97 + d)}.md"
        docs[src] = DocumentRecord(src, f"h{d}", 0, 0, "markdown")
        for i in range(per_doc):
            s = Section(src, f"h{d}", i, i, i, None, None, words_per, 100)
            sections.append(s)
            segments[s.key] = [(None, " ".join(f"{src}-{i}-w{j}" for j in range(words_per)))]
    return Shelf("c", docs, sections, segments)


def _hits(shelf, *order):
    """Hits on the given sections' single chunks, best first."""
    out = []
    for key in order:
        s = next(x for x in shelf.sections if x.key == key)
        out.append(Hit(s.source, None, 0.01, "", ("lexical",), f"{key}", s.first, s.content_hash))
    return out


def _plan(shelf, history=(), reusable=None, tolerance=0.2):
    layout = Layout("<head>", "<tail>", (1, 2, 3), (4, 5))
    return pack_shelf(shelf, "q?", layout=layout, tokenize=words, memo=SectionTokens(words), n_ctx=300, reserve=10,
                      tolerance=tolerance, history=history, reusable=reusable, top_k=4)


def test_sections_are_chosen_by_score_and_laid_out_in_canonical_order():
    shelf = _shelf()
    shelf.hits = _hits(shelf, ("/d/c.md", "h2", 1), ("/d/a.md", "h0", 2), ("/d/d.md", "h3", 0))
    prompt = _plan(shelf)
    assert prompt.mode == "sections"
    keys = [p.section.key for p in prompt.sections]
    assert keys == sorted(keys) and ("/d/c.md", "h2", 1) in keys  # never by score
    assert [p.n for p in prompt.sections] == sorted(p.n for p in prompt.sections)
    assert len(prompt.tokens) + 10 <= 300 and prompt.boundaries[-1] == len(prompt.prefix_tokens)


def test_a_cached_pack_wins_when_it_holds_the_best_section_and_scores_close():
    shelf = _shelf()
    best, second, third = ("/d/b.md", "h1", 0), ("/d/c.md", "h2", 2), ("/d/a.md", "h0", 1)
    shelf.hits = _hits(shelf, best, second, third)
    greedy = [p.section.key for p in _plan(shelf).sections]
    cached = (("/d/b.md", "h1", 0), ("/d/b.md", "h1", 1))  # an earlier question's pack, holding the best

    def reuse(prompt):
        keys = [p.section.key for p in prompt.sections]
        return prompt.boundaries[1] if tuple(keys[:2]) == cached else 0

    chosen = [p.section.key for p in _plan(shelf, history=[cached], reusable=reuse, tolerance=0.9).sections]
    assert tuple(chosen[:2]) == cached and best in chosen and chosen != greedy
    # With no tolerance the best-scoring pack stays, cached or not.
    strict = [p.section.key for p in _plan(shelf, history=[cached], reusable=reuse, tolerance=0.0).sections]
    assert strict == greedy
    # A cached pack that cannot hold the best section (it sorts before the pack's end) is not taken.
    late = (("/d/a.md", "h0", 0), ("/d/d.md", "h3", 2))
    never = [p.section.key for p in _plan(shelf, history=[late], reusable=lambda p: 10**6, tolerance=1.0).sections]
    assert tuple(never[:2]) != late and best in never


def test_composed_packs_are_weighed_by_what_they_would_prefill():
    """A composed prompt reuses every section with a saved state, wherever it sits: once all have one,
    no pack saves anything over another, so the best-scoring pack wins whatever the history holds."""
    shelf = _shelf()
    for s in shelf.sections:  # b.md's sections are longer: the pack built on the earlier one holds more tokens
        if s.source == "/d/b.md":
            shelf.segments[s.key] = [(None, " ".join(f"{s.source}-{s.index}-w{j}" for j in range(75)))]
    best, second, third = ("/d/b.md", "h1", 0), ("/d/c.md", "h2", 2), ("/d/a.md", "h0", 1)
    shelf.hits = _hits(shelf, best, second, third)
    greedy = [p.section.key for p in _plan(shelf).sections]
    earlier = (("/d/b.md", "h1", 0), ("/d/b.md", "h1", 1))

    def composed(saved):
        def reuse(prompt):
            return len(prompt.tokens[:prompt.head]) + sum(len(p.tokens) for p in prompt.sections
                                                           if p.section.key in saved)
        return reuse

    everything = {s.key for s in shelf.sections}
    chosen = [p.section.key for p in _plan(shelf, history=[earlier], reusable=composed(everything),
                                           tolerance=0.9).sections]
    assert chosen == greedy
    # Only the earlier pack's sections saved: the pack built on them prefills less, and wins.
    chosen = [p.section.key for p in _plan(shelf, history=[earlier], reusable=composed(set(earlier)),
                                           tolerance=0.9).sections]
    assert tuple(chosen[:2]) == earlier and chosen != greedy


def test_the_whole_selection_is_packed_when_it_fits():
    shelf = _shelf(n_docs=2, per_doc=1, words_per=30)
    shelf.hits = _hits(shelf, ("/d/b.md", "h1", 0))
    prompt = _plan(shelf)
    assert prompt.mode == "whole" and [p.n for p in prompt.sections] == [1, 2]
    # b.md is the prompt's [2]; the one source listed is numbered 1, and the answer's [2] becomes [1].
    assert prompt.sources == [{"n": 1, "source": "/d/b.md", "pages": [], "sections": [0]}]
    assert prompt.citations == {2: 1, 1: 2}


def test_reasons_for_lost_reuse():
    shelf = _shelf(n_docs=2, per_doc=1, words_per=30)
    prompt = _plan(shelf)
    docs = shelf.documents
    full = len(prompt.prefix_tokens)
    keys = [p.section.key for p in prompt.sections]
    assert reuse_note(prompt, cached_tokens=full, previous=keys, documents=docs, cache_on=True, min_tokens=1) == ""
    assert "nothing was cached" in reuse_note(prompt, cached_tokens=0, previous=None, documents=docs,
                                              cache_on=True, min_tokens=1)
    changed = [keys[0], ("/d/b.md", "old", 0)]
    assert "b.md changed" in reuse_note(prompt, cached_tokens=prompt.boundaries[0], previous=changed,
                                        documents=docs, cache_on=True, min_tokens=1)
    gone = [keys[0], ("/d/z.md", "h9", 0)]
    assert "z.md is no longer" in reuse_note(prompt, cached_tokens=prompt.boundaries[0], previous=gone,
                                             documents=docs, cache_on=True, min_tokens=1)
    lost = reuse_note(prompt, cached_tokens=0, previous=keys, documents=docs, cache_on=True, min_tokens=1)
    assert "evicted" in lost and "never saved" in lost  # the last pack may have been under cache.min_tokens
    assert "cache is off" in reuse_note(prompt, cached_tokens=0, previous=keys, documents=docs, cache_on=False,
                                        min_tokens=1)


def test_pack_history_persists_and_survives_a_damaged_file(tmp_path):
    path = tmp_path / "packs.sqlite"
    h = PackHistory(path)
    h.record("ns", "c", [("a", "h", 0), ("a", "h", 1)])
    h.record("ns", "c", [("b", "h", 0)])
    h.close()
    assert PackHistory(path).recent("ns", "c") == [(("b", "h", 0),), (("a", "h", 0), ("a", "h", 1))]
    assert PackHistory(path).recent("ns", "other") == []
    path.write_bytes(b"not a database" * 100)
    broken = PackHistory(path)
    broken.record("ns", "c", [("x", "h", 0)])  # no error: kept in memory
    assert broken.recent("ns", "c") == [(("x", "h", 0),)]
