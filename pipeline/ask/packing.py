"""Stable packing: which whole documents or fixed sections a prompt holds, so questions share its prefix.

A person or an app asks many *different* questions about the same documents. When
each prompt is laid out the same way up to the question, every question after the
first prefills only itself (the prefix's KV state is reused, see
:mod:`pipeline.engine.cache.prefix_cache`). So the unit placed in a prompt is one that does not
change from question to question: a whole document, or one of its sections, cut once
at ingest (:mod:`pipeline.ingest.sections`).

- **whole** — when every document of the selection (the collection, or ``--doc`` /
  ``--source``) fits the context, all of them are packed, whole, in canonical order
  (source path, then section). Every question over that selection has the same prefix.
- **sections** — otherwise retrieval ranks sections by the fused ranks of their
  chunks (:func:`section_scores`); the best that fit are laid out in canonical order, never by score. When
  another pack that reuses a cached prefix holds the question's best section and
  scores within ``reuse_tolerance`` of the best pack (its total score at least
  ``1 - reuse_tolerance`` of the best one's), that pack wins: a run of related questions
  keeps hitting the cache. Candidates come from the packs earlier questions used
  (:class:`.history.PackHistory`): their leading sections that still exist, extended by the best
  sections that sort after them. Among candidates that reuse anything, the one that would
  prefill the fewest tokens wins (a composed prompt reuses every section with a saved state,
  so once all have one, packs differ by score alone).

The answer's sources are the packed documents whose chunks ranked highest for this
question, with those chunks' pages, so a question answered on page 9 still cites page 9.

What is read from the store is plain data (:class:`Shelf`), gathered under the store's
lock; everything that needs the generator (tokenising, probing the cache) runs after
the lock is released.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Iterable, Sequence

from ..ingest.sections import cut as cut_sections
from ..retrieval.search import merge_chunks
from ..records import DocumentRecord, Hit, Key, PackedSection, Prompt, Section
from .citations import excerpt, numbering, shown_sources
from .prompt import Layout, SectionTokens, Tokenize, render_section, section_prompt

_PROBES = 4  # cache-preferring candidates probed against the cache besides the best-scoring pack


# --------------------------------------------------------------------------- what the store holds


@dataclass
class Shelf:
    """The selection's documents and sections, the texts of those that may be packed, and the
    question's hits: everything packing needs, read from the store under its lock.

    ``fixed_numbers``: each document is numbered by its place in the collection (``places``),
    not in the pack, so a section renders to the same tokens in every pack, whatever the
    selection (a question over the shelf, ``--doc``, a summary, ``rag warm --sections``):
    what composing prompts from section states needs. Otherwise a pack numbers its
    documents 1, 2, ...
    """

    collection: str
    documents: dict[str, DocumentRecord]
    sections: list[Section]  # canonical order: source path, then index
    segments: dict[Key, list[tuple[int | None, str]]]  # per fetched section: (page, text) runs
    hits: list[Hit] = field(default_factory=list)  # fused, best first, within the selection
    pages: dict[tuple[str, int], int | None] = field(default_factory=dict)  # (source, chunk) -> page, fetched
    fixed_numbers: bool = False
    places: dict[str, int] = field(default_factory=dict)  # source -> its place in the collection, from 1
    cut_now: dict[str, list[Section]] = field(default_factory=dict)  # cut by gather, not recorded in the catalog

    @property
    def complete(self) -> bool:
        """Whether every section's text was fetched (so the whole selection can be packed)."""
        return len(self.segments) == len(self.sections)

    @cached_property
    def counts(self) -> dict[str, int]:
        """Sections per document."""
        out: dict[str, int] = {}
        for s in self.sections:
            out[s.source] = out.get(s.source, 0) + 1
        return out


def gather(store, *, sources: Iterable[str] | None, target: int, hits: Sequence[Hit] = (),
           fetch_tokens: int, also: Iterable[Key] = ()) -> Shelf:
    """Read the selection (``sources``, or the whole collection) from the open ``store``; nothing is written.

    Documents committed before sections existed get theirs now, cut at ``target`` in memory
    and listed in the shelf's ``cut_now``: the caller records them after reading
    (:func:`pipeline.ingest.sections.record_cut`), so a read stays a read. Texts are fetched for every
    section when the selection holds at most ``fetch_tokens`` embedder tokens, else only for sections
    with a hit and those in ``also``.
    """
    docs = store.documents()
    places = {source: i for i, source in enumerate(sorted(docs), 1)}
    if sources is not None:
        wanted = set(sources)
        docs = {s: d for s, d in docs.items() if s in wanted}
    by_doc = store.catalog.sections(store.name, [(s, d.content_hash) for s, d in docs.items()])
    cut_now = {source: cut_sections(source, docs[source].content_hash, store.catalog.chunks(store.name, source),
                                    target=target)
               for source in sorted(set(docs) - set(by_doc))}
    by_doc.update(cut_now)
    ordered = [s for source in sorted(by_doc) for s in by_doc[source]]
    total = sum(s.tokens for s in ordered)
    if total <= fetch_tokens:
        fetch = ordered
    else:
        hit_at = {(h.source, h.content_hash, h.index) for h in hits}
        extra = set(also)
        fetch = [s for s in ordered if s.key in extra
                 or any((s.source, s.content_hash, i) in hit_at for i in range(s.first, s.last + 1))]
    segments: dict[Key, list[tuple[int | None, str]]] = {}
    pages: dict[tuple[str, int], int | None] = {}
    wanted_by_doc: dict[str, list[Section]] = {}
    for s in fetch:
        wanted_by_doc.setdefault(s.source, []).append(s)
    for source, secs in wanted_by_doc.items():
        chunks = store.catalog.chunks(store.name, source, first=secs[0].first, last=secs[-1].last)
        pages.update({(source, c.index): c.page for c in chunks})
        for s in secs:
            segments[s.key] = page_segments([c for c in chunks if s.first <= c.index <= s.last])
    within = set(docs)
    return Shelf(store.name, docs, ordered, segments, [h for h in hits if h.source in within], pages,
                 places=places, cut_now=cut_now)


def page_segments(chunks) -> list[tuple[int | None, str]]:
    """A section's chunks as one text run per page (overlaps between neighbours removed)."""
    groups: list[list] = []
    for c in chunks:
        if groups and groups[-1][-1].page == c.page and groups[-1][-1].index + 1 == c.index:
            groups[-1].append(c)
        else:
            groups.append([c])
    return [(g[0].page, "\n\n".join(p.text for p in merge_chunks(g))) for g in groups]


# --------------------------------------------------------------------------- tokens of sections


def number(shelf: Shelf, chosen: Sequence[Section], memo: SectionTokens, *, lead: Sequence[Key] = ()
           ) -> list[PackedSection]:
    """``chosen`` in canonical order (after the sections of ``lead``, in its order), each with its
    document's number (in this pack, or in the collection: :attr:`Shelf.fixed_numbers`) and its tokens."""
    counts = shelf.counts
    out = []
    numbers = {}
    if shelf.fixed_numbers:
        numbers = dict(shelf.places) or {source: i for i, source in enumerate(sorted(shelf.documents), 1)}
    first = {key: i for i, key in enumerate(lead)}
    for s in sorted(chosen, key=lambda s: (first.get(s.key, len(first)), s.source, s.index)):
        n = numbers.setdefault(s.source, len(numbers) + 1)
        out.append(PackedSection(n, s, counts[s.source], memo.get(n, s, counts[s.source], shelf.segments[s.key])))
    return out


# --------------------------------------------------------------------------- choosing


def pack_shelf(shelf: Shelf, question: str, *, layout: Layout, tokenize: Tokenize, memo: SectionTokens,
               n_ctx: int, reserve: int, tolerance: float = 0.2, history: Sequence[Sequence[Key]] = (),
               reusable: Callable[[Prompt], int] | None = None, composes: Callable[[], bool] | None = None,
               top_k: int = 8, neighbours: int = 1) -> Prompt | None:
    """The prompt for ``question`` over the shelf: whole documents when they fit, else sections.

    Returns None when not even the question's best section fits (the caller falls back
    to passages). Where the generator does not compose prompts from section states
    (``composes()`` false: recurrent and hybrid models, or composition off or not allowed yet),
    the chosen sections are ordered so that the longest lead of an earlier pack among them
    comes first (:func:`_lead_first`): its saved state is then this prompt's prefix.
    """
    suffix_text = f"Question: {question}"
    suffix_len = len(layout.suffix(suffix_text, tokenize))
    budget = layout.budget(n_ctx=n_ctx, reserve=reserve, suffix_tokens=suffix_len)

    def prompt_of(packed: list[PackedSection], mode: str) -> Prompt:
        return shelf_prompt(shelf, packed, suffix_text, layout=layout, tokenize=tokenize, mode=mode, top_k=top_k,
                            neighbours=neighbours)

    if shelf.complete and shelf.sections:
        whole = number(shelf, shelf.sections, memo)
        if sum(len(p.tokens) for p in whole) <= budget:
            return prompt_of(whole, "whole")
    ranking = _Ranking(shelf, memo)
    if not ranking.ranked or ranking.cost(ranking.best) > budget:
        return None
    composing = composes is not None and bool(history) and composes()
    candidates = _candidates(ranking, history, budget, composing=composing)
    floor = (1.0 - tolerance) * ranking.total(candidates[0][0])
    close = [c for c in candidates[1:] if ranking.total(c[0]) >= floor]
    close.sort(key=lambda c: (-c[1], -ranking.total(c[0])))
    options = [candidates[0]] + close[:_PROBES]
    best_prompt, best_rank = None, None
    for chosen, _ in options:
        packed = _fit(shelf, chosen, memo, budget, ranking.score, keep=ranking.best)
        prompt = prompt_of(packed, "sections")
        reuse = reusable(prompt) if reusable is not None and len(options) > 1 else 0
        # What it would prefill decides among packs that reuse anything (the best score among the others):
        # once every section has a state, packs differ by score alone.
        rank = (reuse > 0, reuse - len(prompt.tokens) if reuse else 0, ranking.total([p.section for p in packed]))
        if best_rank is None or rank > best_rank:
            best_prompt, best_rank = prompt, rank
    if history and reusable is not None and composes is not None and not composing:
        best_prompt = _lead_first(best_prompt, history, reusable,
                                  lambda lead: prompt_of(number(shelf, [p.section for p in best_prompt.sections],
                                                                memo, lead=lead), "sections"))
    return best_prompt


def _lead_first(prompt: Prompt, history: Sequence[Sequence[Key]], reusable: Callable[[Prompt], int],
                reordered: Callable[[Sequence[Key]], Prompt]) -> Prompt:
    """``prompt``'s sections reordered so that an earlier pack's longest lead among them comes first,
    where that reuses more than the canonical order: for a generator that reuses exact prefixes only,
    the earlier prompt's state at the lead's end then serves this one. The same sections either way."""
    keys = {p.section.key for p in prompt.sections}
    best, best_reuse = prompt, reusable(prompt)
    seen = set()
    for old in history:
        lead = []
        for key in old:
            if tuple(key) not in keys:
                break
            lead.append(tuple(key))
        if not lead or tuple(lead) in seen:
            continue
        seen.add(tuple(lead))
        candidate = reordered(lead)
        reuse = reusable(candidate)
        if reuse > best_reuse:
            best, best_reuse = candidate, reuse
    return best


class _Ranking:
    """The shelf's sections for one question, best first (the leading ones in order when no hit lies
    inside the selection), with what each costs in a prompt."""

    def __init__(self, shelf: Shelf, memo: SectionTokens):
        self.shelf, self.memo = shelf, memo
        self.available = [s for s in shelf.sections if s.key in shelf.segments]
        self.by_key = {s.key: s for s in self.available}
        self.position = {s.key: i for i, s in enumerate(shelf.sections)}
        self.score = section_scores(shelf)
        self.ranked = sorted((s for s in self.available if self.score.get(s.key, 0) > 0),
                             key=lambda s: (-self.score[s.key], self.position[s.key])) or self.available

    @property
    def best(self) -> Section:
        return self.ranked[0]

    def cost(self, s: Section) -> int:
        return len(self.memo.get(1, s, self.shelf.counts[s.source], self.shelf.segments[s.key])) + 2  # numbering

    def total(self, chosen: Sequence[Section]) -> float:
        return sum(self.score.get(s.key, 0.0) for s in chosen)

    def fill(self, base: list[Section], after: int, room: int) -> list[Section]:
        """``base`` and the best-ranked sections that sort after position ``after``, within ``room`` tokens."""
        chosen = list(base)
        for s in self.ranked:
            if s in chosen or self.position[s.key] <= after:
                continue
            c = self.cost(s)
            if c <= room:
                chosen.append(s)
                room -= c
        return chosen


def _candidates(ranking: _Ranking, history: Sequence[Sequence[Key]], budget: int, *, composing: bool = False
                ) -> list[tuple[list[Section], int]]:
    """Packs to choose from, each with the tokens of its lead that an earlier pack holds: the greedy
    best-scoring pack first, then one per pack of ``history`` (its leading sections that still exist,
    with the best section, extended by the best sections that sort after the lead). Where prompts are
    ``composing`` from section states, where a section sits does not matter: one more pack holds the
    best section and, best-scoring first, the sections of earlier packs (their states are saved), then
    the best of the others."""
    best, position, cost = ranking.best, ranking.position, ranking.cost
    greedy = ranking.fill([], -1, budget)
    candidates: list[tuple[list[Section], int]] = [(greedy, 0)]
    seen = {tuple(s.key for s in greedy)}
    if composing:
        earlier = {tuple(key) for old in history for key in old if tuple(key) in ranking.by_key}
        chosen, room = [best], budget - cost(best)
        for s in sorted((ranking.by_key[k] for k in earlier if k != best.key),
                        key=lambda s: (-ranking.score.get(s.key, 0.0), position[s.key])):
            if cost(s) <= room:
                chosen.append(s)
                room -= cost(s)
        held = sum(cost(s) for s in chosen[1:])
        chosen = ranking.fill(chosen, -1, room)
        keys = tuple(s.key for s in sorted(chosen, key=lambda s: position[s.key]))
        if keys not in seen:
            seen.add(keys)
            candidates.append((chosen, held))
    for old in history:
        lead: list[Section] = []
        for key in old:
            if tuple(key) not in ranking.by_key:
                break
            lead.append(ranking.by_key[tuple(key)])
        # The longest lead that the best section can join (it must sort after the lead's end
        # unless the lead holds it), extended by the best sections that sort after the lead.
        while lead:
            has_best = best in lead
            room = budget - sum(cost(s) for s in lead) - (0 if has_best else cost(best))
            if room >= 0 and (has_best or position[best.key] > position[lead[-1].key]):
                chosen = ranking.fill(lead if has_best else lead + [best], position[lead[-1].key], room)
                keys = tuple(s.key for s in sorted(chosen, key=lambda s: position[s.key]))
                if keys not in seen:
                    seen.add(keys)
                    candidates.append((chosen, sum(cost(s) for s in lead)))
                break
            lead.pop()
    return candidates


def section_scores(shelf: Shelf) -> dict[Key, float]:
    """Each section's score: its chunks' weights in the fused ranking of the hits, summed.

    A chunk at fused rank ``r`` (from 1) weighs ``1 / r``. Reciprocal-rank fusion's own
    scores are nearly flat (1/61 at the top, 1/100 at rank 40), so summing them would
    let a section with many deep candidates beat the one holding the best hits.
    """
    spans: dict[tuple[str, str], list[Section]] = {}
    for s in shelf.sections:
        spans.setdefault((s.source, s.content_hash), []).append(s)
    out: dict[Key, float] = {}
    for rank, h in enumerate(shelf.hits, start=1):
        for s in spans.get((h.source, h.content_hash), ()):
            if s.first <= h.index <= s.last:
                out[s.key] = out.get(s.key, 0.0) + 1.0 / rank
                break
    return out


def _fit(shelf: Shelf, chosen: Sequence[Section], memo: SectionTokens, budget: int, score: dict,
         *, keep: Section) -> list[PackedSection]:
    """``chosen`` numbered and tokenised, dropping the lowest-scored (never ``keep``) until it fits exactly."""
    chosen = list(chosen)
    while True:
        packed = number(shelf, chosen, memo)
        if sum(len(p.tokens) for p in packed) <= budget or len(chosen) == 1:
            return packed
        drop = min((s for s in chosen if s is not keep), key=lambda s: (score.get(s.key, 0.0), -s.index))
        chosen.remove(drop)


def shelf_prompt(shelf: Shelf, packed: list[PackedSection], suffix_text: str, *, layout: Layout,
                 tokenize: Tokenize, mode: str, top_k: int, neighbours: int = 1) -> Prompt:
    """The prompt over ``packed`` sections of the shelf with ``suffix_text`` last, citing the documents
    the best ``top_k`` hits inside it come from (:func:`cited`)."""
    texts = [render_section(p.n, p.section, of=p.of, segments=shelf.segments[p.section.key]) for p in packed]
    prompt = section_prompt(layout, packed, suffix_text, tokenize=tokenize, mode=mode, texts=texts)
    sources = cited(shelf.hits, packed, top_k=top_k, neighbours=neighbours, pages=shelf.pages)
    prompt.citations = numbering([p.n for p in packed], [s["n"] for s in sources])
    prompt.sources = shown_sources(sources, prompt.citations)
    return prompt


def cited(hits: Sequence[Hit], packed: Sequence[PackedSection], *, top_k: int, neighbours: int = 0,
          pages: dict[tuple[str, int], int | None] | None = None) -> list[dict]:
    """The packed documents whose chunks rank highest for the question (the best ``top_k`` hits
    inside the packed text), numbered as in the prompt, with the pages of those chunks and of their
    ``neighbours`` on each side that are packed too (as passage mode widens hits) and the start of
    the best of them (``excerpt``); every packed document if none ranked."""
    docs: dict[str, dict] = {}
    for p in packed:
        d = docs.setdefault(p.section.source, {"n": p.n, "source": p.section.source, "pages": set(),
                                               "sections": [], "hit": False, "excerpt": ""})
        d["sections"].append(p.section.index)
    inside = []
    for h in hits:
        for p in packed:
            s = p.section
            if s.source == h.source and s.content_hash == h.content_hash and s.first <= h.index <= s.last:
                inside.append(h)
                break
        if len(inside) >= top_k:
            break
    spans = {(p.section.source, p.section.content_hash): [] for p in packed}
    for p in packed:
        spans[(p.section.source, p.section.content_hash)].append((p.section.first, p.section.last))
    for h in inside:
        d = docs[h.source]
        d["hit"] = True
        d["excerpt"] = d["excerpt"] or excerpt(h.text)
        if h.page is not None:
            d["pages"].add(h.page)
        for i in range(h.index - neighbours, h.index + neighbours + 1):
            page = (pages or {}).get((h.source, i))
            if page is not None and any(a <= i <= b for a, b in spans[(h.source, h.content_hash)]):
                d["pages"].add(page)
    chosen = [d for d in docs.values() if d["hit"]] or list(docs.values())
    return [{"n": d["n"], "source": d["source"], "pages": sorted(d["pages"]), "sections": d["sections"],
             **({"excerpt": d["excerpt"]} if d["excerpt"] else {})} for d in chosen]
