"""Warming: prefill and save, ahead of the first question, the prefixes the next prompts will hit.

``rag warm`` (and ``rag ingest --warm``) lays the collection out exactly as ``ask`` and
``summarize`` will (:mod:`.packing`, with the one shared answer reserve) and saves the
prefix states with states at their boundaries (:meth:`~pipeline.engine.local.Engine.warm`),
so that the first question over the documents prefills only itself.

``rag warm --sections`` (:func:`warm_sections`) is for collections that do not fit the
context: every section's own state is computed once, in order, and saved, so any
question's prompt is then composed from states and prefills only the seams and itself;
with ``ask.compose = "auto"`` it then calibrates composition on one prompt of the
collection's own sections (:func:`calibration_prompt`), so even the first question is
composed. Unless composition is off, ``rag warm`` (and ``rag ingest --warm``) does that too
for a collection that does not fit whole.

``rag ingest`` runs :func:`warm_auto` by default (``ingest.warm = "auto"``): the same section
states, calibrated first, but only where they pay and are kept: a collection larger than the
context, a local generator that composes within its budget, states within half the cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..engine.reuse.budget import Refusal
from ..errors import Cancelled, ConfigError, DiskFullError, RagError
from ..records import PackedSection, Prompt, Section
from .packing import Shelf, gather, number, shelf_prompt
from .prompt import Layout, SectionTokens, Tokenize, shape_of

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


def _writable_cache(rt: "Runtime"):
    cache = rt.prefix_cache
    if cache is None:
        raise ConfigError("the prefix cache is off (cache.enabled = false): nothing to warm")
    if cache.unavailable or cache.read_only:
        raise ConfigError(f"the prefix cache cannot save states: "
                          f"{cache.unavailable or f'{cache.directory} is read-only'}")
    return cache


def warm_sections(rt: "Runtime", *, progress: Callable[[int, int], None] | None = None,
                  cancel: "CancelToken | None" = None) -> dict:
    """:meth:`Pipeline.warm_sections <pipeline.api.Pipeline.warm_sections>`: every section of the
    collection, rendered as every pack renders it, prefilled once on its own and saved."""
    if not rt.compose_policy.enabled:
        raise ConfigError("section states serve composed prompts, and ask.compose is \"off\": set it to "
                          "\"auto\" (RAG_ASK_COMPOSE=auto) to save and use them")
    _writable_cache(rt)
    engine = rt.engine
    with rt.store(create=False) as store:
        store.require()
        shelf = gather(store, sources=None, target=rt.section_tokens, fetch_tokens=2**62)
    shelf.fixed_numbers = True  # as questions over the whole collection number its documents
    packed = number(shelf, shelf.sections, rt.section_memo)
    head = rt.layout().head_tokens
    report = engine.warm_sections(head, [p.tokens for p in packed], progress=progress, cancel=cancel)
    _calibrate(rt, shelf, cancel)
    return {"mode": "sections", "documents": len(shelf.documents), **report, "calibration": _calibration(rt)}


def _calibrate(rt: "Runtime", shelf: Shelf, cancel: "CancelToken | None") -> None:
    """Calibrate composition on one prompt of ``shelf``'s own sections, unless it is calibrated already
    (or ``ask.compose`` is not ``auto``): once per model and settings."""
    engine = rt.engine
    if not rt.compose_policy.wants_calibration(engine.calibration):
        return
    prompt = calibration_prompt(shelf, layout=rt.layout(), tokenize=engine.tokenize, memo=rt.section_memo,
                                n_ctx=engine.n_ctx, reserve=rt.reserve())
    if prompt is not None:
        engine.calibrate(shape_of(prompt), repeat_penalty=rt.config.ask.repeat_penalty, cancel=cancel)


def _calibration(rt: "Runtime") -> dict | None:
    record = rt.engine.calibration
    return record.to_dict(budget=rt.compose_policy.max_kl) if record is not None else None


def warm_auto(rt: "Runtime", *, progress: Callable[[int, int], None] | None = None,
              cancel: "CancelToken | None" = None) -> dict:
    """:meth:`Pipeline.warm_auto <pipeline.api.Pipeline.warm_auto>`: section states where they pay, else
    nothing, and why. A failure (a generator that does not load, a full cache disk) is a reason too: the
    ingest before it stands, and the questions compute what is missing."""
    try:
        return _warm_auto(rt, progress, cancel)
    except Cancelled:
        raise
    except RagError as exc:
        return {"warmed": False, "reason": f"section states not saved: {exc}", "failed": True}


def _warm_auto(rt: "Runtime", progress: Callable[[int, int], None] | None, cancel: "CancelToken | None") -> dict:
    from ..engine.cache.sections import kept_types
    from ..models import is_server

    def skipped(reason: str, **more) -> dict:
        return {"warmed": False, "reason": reason, **more}

    policy = rt.compose_policy
    if not policy.enabled:
        return skipped("ask.compose is \"off\"")
    if is_server(rt.config.models.generator):
        return skipped("the generator is a server: its own cache holds its states")
    cache = rt.prefix_cache
    if cache is None or cache.unavailable or cache.read_only:
        return skipped("the prefix cache cannot save states")
    with rt.store(create=False) as store:
        if store.info is None:
            return skipped("the collection does not exist")
        shelf = gather(store, sources=None, target=rt.section_tokens, fetch_tokens=2**62)
    if not shelf.sections:
        return skipped("the collection is empty")
    engine = rt.engine
    shelf.fixed_numbers = True
    packed = number(shelf, shelf.sections, rt.section_memo)
    tokens = sum(len(p.tokens) for p in packed)
    if tokens <= rt.layout().budget(n_ctx=engine.n_ctx, reserve=rt.reserve(), suffix_tokens=0):
        return skipped("the collection fits the context: the first question saves its prefix for the next")
    refusal = engine.composition_refusal
    if refusal is not None and refusal not in (Refusal.NOT_CALIBRATED, Refusal.OVER_BUDGET):
        return skipped(refusal.value)
    s = engine.settings
    kv = kept_types(cache.section_type, s.type_k, s.type_v, flash_attn=s.flash_attn)
    size = sum(engine.info.state_bytes(len(p.tokens), *kv) for p in packed)
    budget = cache.budget_bytes()
    if size > budget / 2:
        return skipped(f"the section states would take about {size / 1e9:,.1f} GB, more than half of "
                       f"cache.max_gb ({budget / 1e9:,.1f} GB{', a share of the disk' if cache.auto else ''}): "
                       "`rag warm --sections` saves them anyway")
    _calibrate(rt, shelf, cancel)
    refusal = engine.composition_refusal
    if refusal is not None:
        return skipped(refusal.value, calibration=_calibration(rt))
    report = engine.warm_sections(rt.layout().head_tokens, [p.tokens for p in packed], progress=progress,
                                  cancel=cancel)
    return {"warmed": True, "reason": "the collection is larger than the context and this model composes",
            "mode": "sections", "documents": len(shelf.documents), **report, "calibration": _calibration(rt)}


#: What a calibration prompt asks: any question works (it compares distributions), one that makes the
#: model read the documents is closest to a real one.
CALIBRATION_QUESTION = "Summarize what the documents above say, citing them."


def calibration_prompt(shelf: Shelf, *, layout: Layout, tokenize: Tokenize, memo: SectionTokens, n_ctx: int,
                       reserve: int) -> Prompt | None:
    """A sections-mode prompt of the collection's own sections to calibrate composition on: sections
    spread evenly over the collection (as a question's best sections are), as many as fit, at least
    two; None where two do not fit."""
    suffix = f"Question: {CALIBRATION_QUESTION}"
    budget = layout.budget(n_ctx=n_ctx, reserve=reserve, suffix_tokens=len(layout.suffix(suffix, tokenize)))
    sections = [s for s in shelf.sections if s.key in shelf.segments]
    shortest = min((len(p.tokens) for p in number(shelf, sections, memo)), default=1)
    for k in range(min(len(sections), budget // max(1, shortest)), 1, -1):
        chosen = [sections[round(i * (len(sections) - 1) / (k - 1))] for i in range(k)]
        packed = number(shelf, chosen, memo)
        if sum(len(p.tokens) for p in packed) <= budget:
            return shelf_prompt(shelf, packed, suffix, layout=layout, tokenize=tokenize, mode="sections", top_k=0)
    return None


def warm(rt: "Runtime", *, progress: Callable[[str, str], None] | None = None, purpose: str = "ask") -> dict:
    """:meth:`Pipeline.warm <pipeline.api.Pipeline.warm>`: each planned prefix prefilled and saved, with
    its outcome."""
    if purpose not in WARM_PURPOSES:
        raise ConfigError(f"warm is for one of {', '.join(WARM_PURPOSES)}, got {purpose!r}")
    _writable_cache(rt)
    engine = rt.engine
    with rt.store(create=False) as store:
        store.require()
        shelf = gather(store, sources=None, target=rt.section_tokens, fetch_tokens=2**62)
    shelf.fixed_numbers = rt.compose_policy.enabled  # as every prompt numbers documents then
    mode, plans = warm_plans(shelf, layout=rt.layout(), tokenize=engine.tokenize, memo=rt.section_memo,
                             n_ctx=engine.n_ctx, reserve=rt.reserve(), purpose=purpose)
    if mode == "sections" and rt.compose_policy.enabled:  # questions are composed from section states
        states = warm_sections(rt)
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
        reused = engine.reusable(shape_of(prompt))
        before = {e.id for e in cache.entries(engine.namespace)}
        outcome = "saved" if engine.warm(prompt.prefix_tokens, boundaries=prompt.boundaries) else "cached"
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


__all__ = ["CALIBRATION_QUESTION", "WARM_PURPOSES", "calibration_prompt", "warm", "warm_auto", "warm_plans",
           "warm_sections"]
