"""Stable packing: which whole documents or fixed sections a prompt holds, so questions share its prefix.

A person or an app asks many *different* questions about the same documents. When
each prompt is laid out the same way up to the question, every question after the
first prefills only itself (the prefix's KV state is reused, see
:mod:`pipeline.engine.cache.store`). So the unit placed in a prompt is one that does not
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
  (:class:`PackHistory`): their leading sections that still exist, extended by the best
  sections that sort after them.

The answer's sources are the packed documents whose chunks ranked highest for this
question, with those chunks' pages, so a question answered on page 9 still cites page 9.

What is read from the store is plain data (:class:`Shelf`), gathered under the store's
lock; everything that needs the generator (tokenising, probing the cache) runs after
the lock is released.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .prompt import Layout, PackedSection, Prompt, Tokenize, label, render_section, section_prompt
from ..ingest.sections import cut as cut_sections
from ..retrieval.search import Hit, merge_chunks
from ..store.catalog_sqlite import DocumentRecord
from ..store.sections import Section

Key = tuple[str, str, int]  # (source, content_hash, section index)

HISTORY_KEEP = 64
"""Packs remembered per model and collection, most recent first."""
_PROBES = 4  # cache-preferring candidates probed against the cache besides the best-scoring pack


# --------------------------------------------------------------------------- what the store holds


@dataclass
class Shelf:
    """The selection's documents and sections, the texts of those that may be packed, and the
    question's hits: everything packing needs, read from the store under its lock."""

    collection: str
    documents: dict[str, DocumentRecord]
    sections: list[Section]  # canonical order: source path, then index
    segments: dict[Key, list[tuple[int | None, str]]]  # per fetched section: (page, text) runs
    hits: list[Hit] = field(default_factory=list)  # fused, best first, within the selection
    pages: dict[tuple[str, int], int | None] = field(default_factory=dict)  # (source, chunk) -> page, fetched

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
    """Read the selection (``sources``, or the whole collection) from the open ``store``.

    Documents committed before sections existed get theirs now, cut at ``target`` and
    recorded. Texts are fetched for every section when the selection holds at most
    ``fetch_tokens`` embedder tokens, else only for sections with a hit and those in ``also``.
    """
    docs = store.documents()
    if sources is not None:
        wanted = set(sources)
        docs = {s: d for s, d in docs.items() if s in wanted}
    by_doc = store.catalog.sections(store.name, [(s, d.content_hash) for s, d in docs.items()])
    for source in sorted(set(docs) - set(by_doc)):
        chunks = store.catalog.chunks(store.name, source)
        cut = cut_sections(source, docs[source].content_hash, chunks, target=target)
        store.catalog.backfill_sections(store.name, cut)
        by_doc[source] = cut
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
    return Shelf(store.name, docs, ordered, segments, [h for h in hits if h.source in within], pages)


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


class SectionTokens:
    """The generator tokens of rendered sections, remembered (they never change for a document
    version), so a question over a packed 60K-token collection tokenises only itself."""

    def __init__(self, tokenize: Tokenize, *, max_tokens: int = 4_000_000):
        self._tokenize = tokenize
        self._max = max_tokens
        self._held = 0
        self._memo: OrderedDict[tuple, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, n: int, section: Section, of: int, segments: Sequence[tuple[int | None, str]]
            ) -> tuple[int, ...]:
        key = (*section.key, section.first, section.last, n, of)
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return hit
        tokens = tuple(self._tokenize(render_section(n, section, of=of, segments=segments)))
        with self._lock:
            self._memo[key] = tokens
            self._held += len(tokens)
            while self._held > self._max and len(self._memo) > 1:
                _, old = self._memo.popitem(last=False)
                self._held -= len(old)
        return tokens


def number(shelf: Shelf, chosen: Sequence[Section], memo: SectionTokens) -> list[PackedSection]:
    """``chosen`` in canonical order, each with its document's number in this pack and its tokens."""
    counts = shelf.counts
    out, numbers = [], {}
    for s in sorted(chosen, key=lambda s: (s.source, s.index)):
        n = numbers.setdefault(s.source, len(numbers) + 1)
        out.append(PackedSection(n, s, counts[s.source], memo.get(n, s, counts[s.source], shelf.segments[s.key])))
    return out


# --------------------------------------------------------------------------- choosing


def layout_reserve(n_ctx: int, ask_max_tokens: int, summarize_max_tokens: int, max_tokens: int | None = None) -> int:
    """The tokens every layout decision holds back for the answer: the larger of ``ask.max_tokens``
    and ``summarize.max_tokens``, at most a quarter of the context; a call's own ``max_tokens``
    only where it is larger still.

    ``ask``, ``warm`` and ``summarize`` decide with this one figure whether a document goes
    whole, which sections fit and where a map-reduce run ends, so a document is laid out the
    same way by all three and they share its prefix (with each its own reserve, a document
    between the two edges went whole in one and map-reduce in the other). Generation then
    uses its own ``max_tokens`` within it, so a shorter answer never changes the layout. The
    quarter keeps a small context usable for questions when summaries are configured long:
    a call that needs more than the shared figure holds back its own and may lay out differently.
    """
    shared = min(max(ask_max_tokens, summarize_max_tokens), n_ctx // 4)
    return max(shared, max_tokens or 0)


def plan(shelf: Shelf, question: str, *, layout: Layout, tokenize: Tokenize, memo: SectionTokens, n_ctx: int,
         reserve: int, tolerance: float = 0.2, history: Sequence[Sequence[Key]] = (),
         reusable: Callable[[Prompt], int] | None = None, top_k: int = 8, neighbours: int = 1) -> Prompt | None:
    """The prompt for ``question`` over the shelf: whole documents when they fit, else sections.

    Returns None when not even the question's best section fits (the caller falls back
    to passages).
    """
    suffix_text = f"Question: {question}"
    suffix_len = len(layout.suffix(suffix_text, tokenize))
    budget = layout.budget(n_ctx=n_ctx, reserve=reserve, suffix_tokens=suffix_len)
    if shelf.complete and shelf.sections:
        whole = number(shelf, shelf.sections, memo)
        if sum(len(p.tokens) for p in whole) <= budget:
            return _finish(shelf, whole, suffix_text, layout=layout, tokenize=tokenize, mode="whole", top_k=top_k,
                           neighbours=neighbours)

    available = [s for s in shelf.sections if s.key in shelf.segments]
    position = {s.key: i for i, s in enumerate(shelf.sections)}
    score = section_scores(shelf)
    ranked = sorted((s for s in available if score.get(s.key, 0) > 0), key=lambda s: (-score[s.key], position[s.key]))
    if not ranked:  # no hit inside the selection: its leading sections, in order
        ranked = available
    if not ranked:
        return None

    def cost(s: Section) -> int:
        return len(memo.get(1, s, shelf.counts[s.source], shelf.segments[s.key])) + 2  # numbering slack

    def fill(base: list[Section], after: int, room: int) -> list[Section]:
        chosen = list(base)
        for s in ranked:
            if s in chosen or position[s.key] <= after:
                continue
            c = cost(s)
            if c <= room:
                chosen.append(s)
                room -= c
        return chosen

    best = ranked[0]
    if cost(best) > budget:
        return None
    greedy = fill([], -1, budget)
    candidates: list[tuple[list[Section], int]] = [(greedy, 0)]  # (sections, tokens of the cached lead)
    by_key = {s.key: s for s in available}
    seen = {tuple(s.key for s in greedy)}
    for old in history:
        lead: list[Section] = []
        for key in old:
            if tuple(key) not in by_key:
                break
            lead.append(by_key[tuple(key)])
        # The longest lead that the best section can join (it must sort after the lead's end
        # unless the lead holds it), extended by the best sections that sort after the lead.
        while lead:
            has_best = best in lead
            room = budget - sum(cost(s) for s in lead) - (0 if has_best else cost(best))
            if room >= 0 and (has_best or position[best.key] > position[lead[-1].key]):
                chosen = fill(lead if has_best else lead + [best], position[lead[-1].key], room)
                keys = tuple(s.key for s in sorted(chosen, key=lambda s: position[s.key]))
                if keys not in seen:
                    seen.add(keys)
                    candidates.append((chosen, sum(cost(s) for s in lead)))
                break
            lead.pop()

    def total(chosen: Sequence[Section]) -> float:
        return sum(score.get(s.key, 0.0) for s in chosen)

    floor = (1.0 - tolerance) * total(greedy)
    close = [c for c in candidates[1:] if total(c[0]) >= floor]
    close.sort(key=lambda c: (-c[1], -total(c[0])))
    options = [candidates[0]] + close[:_PROBES]
    best_prompt, best_rank = None, None
    for chosen, _ in options:
        packed = _fit(shelf, chosen, memo, budget, score, keep=best)
        prompt = _finish(shelf, packed, suffix_text, layout=layout, tokenize=tokenize, mode="sections", top_k=top_k,
                         neighbours=neighbours)
        reuse = reusable(prompt) if reusable is not None and len(options) > 1 else 0
        rank = (reuse, total([p.section for p in packed]))
        if best_rank is None or rank > best_rank:
            best_prompt, best_rank = prompt, rank
    return best_prompt


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


def _finish(shelf: Shelf, packed: list[PackedSection], suffix_text: str, *, layout: Layout, tokenize: Tokenize,
            mode: str, top_k: int, neighbours: int = 1) -> Prompt:
    texts = [render_section(p.n, p.section, of=p.of, segments=shelf.segments[p.section.key]) for p in packed]
    prompt = section_prompt(layout, packed, suffix_text, tokenize=tokenize, mode=mode, texts=texts)
    prompt.sources = cited(shelf.hits, packed, top_k=top_k, neighbours=neighbours, pages=shelf.pages)
    return prompt


def cited(hits: Sequence[Hit], packed: Sequence[PackedSection], *, top_k: int, neighbours: int = 0,
          pages: dict[tuple[str, int], int | None] | None = None) -> list[dict]:
    """The packed documents whose chunks rank highest for the question (the best ``top_k`` hits
    inside the packed text), with the pages of those chunks and of their ``neighbours`` on each
    side that are packed too (as passage mode widens hits); every packed document if none ranked."""
    docs: dict[str, dict] = {}
    for p in packed:
        d = docs.setdefault(p.section.source, {"n": p.n, "source": p.section.source, "pages": set(),
                                               "sections": [], "hit": False})
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
        if h.page is not None:
            d["pages"].add(h.page)
        for i in range(h.index - neighbours, h.index + neighbours + 1):
            page = (pages or {}).get((h.source, i))
            if page is not None and any(a <= i <= b for a, b in spans[(h.source, h.content_hash)]):
                d["pages"].add(page)
    chosen = [d for d in docs.values() if d["hit"]] or list(docs.values())
    return [{"n": d["n"], "source": d["source"], "pages": sorted(d["pages"]), "sections": d["sections"]}
            for d in sorted(chosen, key=lambda d: d["n"])]


# --------------------------------------------------------------------------- warming


WARM_PURPOSES = ("ask", "summarize", "all")


def warm_plans(shelf: Shelf, *, layout: Layout, tokenize: Tokenize, memo: SectionTokens, n_ctx: int,
               reserve: int, purpose: str = "ask") -> tuple[str, list[tuple[str, Prompt | None]]]:
    """The prefixes the next prompts will hit, labelled, and the mode: "whole" when the selection
    fits the context, else "sections"; None where not even one section fits.

    When it fits, ``purpose`` says which: "ask" the whole selection's prefix (what every question
    over it starts from), "summarize" each document's own prefix (what its summaries and
    ``ask --doc`` start from), "all" both. When it does not fit, each document's leading
    sections (as many as fit) serve both: the prefix of its summary's first run, and of the
    pack a question about its beginning reuses.
    """
    if purpose not in WARM_PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(WARM_PURPOSES)}, got {purpose!r}")
    budget = layout.budget(n_ctx=n_ctx, reserve=reserve, suffix_tokens=0)
    whole = number(shelf, shelf.sections, memo)

    def prompt(packed: list[PackedSection], mode: str) -> Prompt:
        return _finish(shelf, packed, "", layout=layout, tokenize=tokenize, mode=mode, top_k=0)

    if shelf.sections and sum(len(p.tokens) for p in whole) <= budget:
        out: list[tuple[str, Prompt | None]] = []
        if purpose != "summarize":
            docs = len(shelf.documents)
            out.append((f"the whole collection ({docs} document{'s' * (docs != 1)})", prompt(whole, "whole")))
        if purpose != "ask":
            for source in sorted(shelf.documents):
                own = [s for s in shelf.sections if s.source == source]
                out.append((source, prompt(number(shelf, own, memo), "whole") if own else None))
        return "whole", out
    out = []
    for source in sorted(shelf.documents):
        lead: list[Section] = []
        used = 0
        for s in (s for s in shelf.sections if s.source == source):
            c = len(memo.get(1, s, shelf.counts[source], shelf.segments[s.key]))
            if used + c > budget:
                break
            lead.append(s)
            used += c
        out.append((source, prompt(number(shelf, lead, memo), "sections") if lead else None))
    return "sections", out


# --------------------------------------------------------------------------- history and reasons


class PackHistory:
    """The packs recent questions used, per model namespace and collection, most recent first.

    Kept in ``packs.sqlite`` beside the prefix cache (shared by processes, like the
    cache), or in memory when there is no cache directory. Only a hint: what is
    really cached is always probed. A damaged or unwritable file costs the hint,
    never an answer.
    """

    def __init__(self, path: Path | None):
        self.path = path
        self._memory: dict[tuple[str, str], list[tuple[Key, ...]]] = {}
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(path, timeout=5, isolation_level=None, check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # a hint: losing the last one costs nothing
                self._db.execute("CREATE TABLE IF NOT EXISTS packs (namespace TEXT NOT NULL, collection TEXT "
                                 "NOT NULL, keys TEXT NOT NULL, used REAL NOT NULL, "
                                 "PRIMARY KEY (namespace, collection, keys))")
            except (sqlite3.Error, OSError):
                self._db = None

    def recent(self, namespace: str, collection: str) -> list[tuple[Key, ...]]:
        with self._lock:
            if self._db is not None:
                try:
                    rows = self._db.execute("SELECT keys FROM packs WHERE namespace = ? AND collection = ? "
                                            "ORDER BY used DESC LIMIT ?", (namespace, collection, HISTORY_KEEP))
                    return [tuple(tuple(k) for k in json.loads(r[0])) for r in rows]
                except (sqlite3.Error, ValueError, TypeError):
                    pass
            return list(self._memory.get((namespace, collection), []))

    def record(self, namespace: str, collection: str, keys: Sequence[Key]) -> None:
        keys = tuple(tuple(k) for k in keys)
        if not keys:
            return
        with self._lock:
            packs = self._memory.setdefault((namespace, collection), [])
            if keys in packs:
                packs.remove(keys)
            packs.insert(0, keys)
            del packs[HISTORY_KEEP:]
            if self._db is None:
                return
            try:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.execute("INSERT OR REPLACE INTO packs VALUES (?, ?, ?, ?)",
                                 (namespace, collection, json.dumps(keys), time.time()))
                self._db.execute(
                    "DELETE FROM packs WHERE namespace = ? AND collection = ? AND keys NOT IN (SELECT keys FROM "
                    "packs WHERE namespace = ? AND collection = ? ORDER BY used DESC LIMIT ?)",
                    (namespace, collection, namespace, collection, HISTORY_KEEP))
                self._db.execute("COMMIT")
            except sqlite3.Error:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def reuse_note(prompt: Prompt, *, cached_tokens: int, previous: Sequence[Key] | None,
               documents: dict[str, DocumentRecord], cache_on: bool, min_tokens: int) -> str:
    """Why this prompt reused less than its whole prefix, in words ("" when it reused all of it)."""
    prefix_len = len(prompt.prefix_tokens)
    if cached_tokens >= prefix_len:
        return ""
    if prompt.mode == "passages":
        return ("passage mode: each question packs its own passages, so prompts share little more "
                "than the system prompt")
    keys = [p.section.key for p in prompt.sections]
    if previous is None:
        return "nothing was cached for these documents yet: the first question prefills them (`rag warm` does it ahead)"
    previous = [tuple(k) for k in previous]
    same = 0
    while same < min(len(keys), len(previous)) and keys[same] == previous[same]:
        same += 1
    shared_end = prompt.boundaries[same - 1] if same else 0
    if cached_tokens >= shared_end and same < len(keys):  # what it shared with the last pack was reused
        new = keys[same]
        if same < len(previous):
            old = previous[same]
            record = documents.get(old[0])
            if record is None:
                return f"{label(old[0])} is no longer in the collection: the prompt differs from there on"
            if record.content_hash != old[1]:
                return f"{label(old[0])} changed since it was last packed: its sections are new"
            return (f"this question needs other sections than the last pack, from {label(new[0])} "
                    f"section {new[2] + 1} on")
        return f"the pack extends the last one: {label(new[0])} section {new[2] + 1} on is new"
    if not cache_on:
        return "the prefix cache is off (cache.enabled = false) and the KV memory held another prompt"
    if prefix_len < min_tokens:
        return f"the prefix ({prefix_len} tokens) is shorter than cache.min_tokens, so no state is saved"
    return "its saved prefix state is gone (evicted past cache.max_gb, or damaged)"
