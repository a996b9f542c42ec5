"""``rag warm`` for prompts that reuse a prefix: the prefixes the next prompts will hit, prefilled and saved.

The collection is laid out exactly as ``ask`` and ``summarize`` will lay it out (:mod:`pipeline.ask.packing`,
with the one shared answer reserve), and each prefix is saved with states at its boundaries
(:meth:`~pipeline.engine.local.Engine.warm`), so that the first question over the documents prefills
only itself. A collection that does not fit the context is warmed section by section instead, where
prompts may be composed (:mod:`.sections`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError, DiskFullError
from ..records import PackedSection, Prompt, Section
from ..ask.packing import Shelf, gather, number, shelf_prompt
from ..ingest.sections import record_cut
from ..ask.prompt import Layout, SectionTokens, Tokenize
from .progress import WarmProgress
from .sections import warm_sections, writable_cache

if TYPE_CHECKING:
    from ..engine.context_lock import CancelToken
    from ..runtime import Runtime

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
        return shelf_prompt(shelf, packed, "", layout=layout, tokenize=tokenize, mode=mode, top_k=0)

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


def warm(rt: "Runtime", *, progress: Callable[[str, str], None] | None = None, purpose: str = "ask",
         states_progress: Callable[[WarmProgress], None] | None = None, cancel: "CancelToken | None" = None) -> dict:
    """:meth:`Pipeline.warm <pipeline.api.Pipeline.warm>`: each planned prefix prefilled and saved, with
    its outcome (``progress(prefix, outcome)``); where the collection does not fit the context and prompts
    may be composed, the section states instead (:func:`.sections.warm_sections`, ``states_progress``).

    Returns ``{"mode": "whole" | "sections", "purpose", "prefixes": [...], "prefilled_tokens",
    "bytes_written"}``, one item per prefix with its documents, sections, tokens, the tokens prefilled
    for it, the bytes of the states written and its outcome: "saved", "cached" (already there), "too
    short" (under ``cache.min_tokens``) or "too long" (not even one section fits)."""
    if purpose not in WARM_PURPOSES:
        raise ConfigError(f"warm is for one of {', '.join(WARM_PURPOSES)}, got {purpose!r}")
    writable_cache(rt)
    engine = rt.engine
    with rt.store(create=False) as store:
        store.require()
        shelf = gather(store, sources=None, target=rt.section_tokens, fetch_tokens=2**62)
        record_cut(store, shelf.cut_now)
    shelf.fixed_numbers = rt.compose_policy.enabled  # as every prompt numbers documents then
    mode, plans = warm_plans(shelf, layout=rt.layout(), tokenize=engine.tokenize, memo=rt.section_memo,
                             n_ctx=engine.n_ctx, reserve=rt.reserve(), purpose=purpose)
    if mode == "sections" and rt.compose_policy.enabled:  # questions are composed from section states
        states = warm_sections(rt, progress=states_progress, cancel=cancel)
        return {"mode": mode, "purpose": purpose, "prefixes": [], "prefilled_tokens": states["prefilled_tokens"],
                "bytes_written": states["bytes_written"], "section_states": states}
    items = []
    for name, prompt in plans:
        items.append(_warm_one(rt, shelf, name, prompt))
        if progress:
            progress(name, items[-1]["outcome"])
    return {"mode": mode, "purpose": purpose, "prefixes": items,
            "prefilled_tokens": sum(i["prefilled"] for i in items), "bytes_written": sum(i["bytes"] for i in items)}


def _warm_one(rt: "Runtime", shelf: Shelf, name: str, prompt: Prompt | None) -> dict:
    """One planned prefix prefilled and saved (unless too long, too short or cached already)."""
    engine, cache = rt.engine, rt.prefix_cache
    prefilled = written = 0
    if prompt is None:
        outcome = "too long"
    elif len(prompt.prefix_tokens) < rt.config.cache.min_tokens:
        outcome = "too short"
    else:
        reused = engine.reusable(prompt.shape)
        before = {e.id for e in cache.entries(engine.namespace)}
        outcome = "saved" if engine.warm(prompt.shape) else "cached"
        if outcome == "cached" and cache.disk_full:
            raise DiskFullError(f"{cache.last_error}: the prefix of {name} was prefilled but not saved. Free "
                                "some space and run `rag warm` again")
        written = sum(e.bytes for e in cache.entries(engine.namespace) if e.id not in before)
        prefilled = len(prompt.prefix_tokens) - reused if outcome == "saved" else 0
        rt.pack_history.record(engine.namespace, shelf.collection, [p.section.key for p in prompt.sections])
    return {"prefix": name, "documents": len({p.section.source for p in prompt.sections}) if prompt else 0,
            "sections": len(prompt.sections) if prompt else 0,
            "tokens": len(prompt.prefix_tokens) if prompt else 0, "prefilled": prefilled,
            "bytes": written, "outcome": outcome}


__all__ = ["WARM_PURPOSES", "warm", "warm_plans"]
