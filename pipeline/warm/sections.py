"""Section states ahead of questions: the most useful first, within the room the cache has for them.

For a collection larger than the context, every question's prompt is composed from the states of
the sections it holds (:mod:`pipeline.engine.reuse.sections`). Saving those states ahead makes the
first question as fast as the next. A shelf can hold more sections than the cache has room for:
then the sections most likely to be needed are saved (:func:`order`) until the room is used, what
was left and why is said, and a question that needs one of the others computes it then (and saves
it, the cache evicting its least useful states for it).

:func:`warm_sections` is ``rag warm --sections``; :func:`warm_auto` is what ``ingest.warm = "auto"``
runs after an ingest: it calibrates composition first (:mod:`.calibration`) and saves states only
where the collection is larger than the context and the calibration allows composing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import Cancelled, ConfigError, RagError
from ..records import Key, PackedSection
from ..ask.packing import Shelf, gather, number
from ..ingest.sections import record_cut
from . import calibration
from .progress import Meter, WarmProgress

if TYPE_CHECKING:
    from ..engine.context_lock import CancelToken
    from ..runtime import Runtime

#: The share of the cache's budget section states may fill: the rest stays for prefix states and the
#: states questions compute.
SECTIONS_SHARE = 0.8


def order(shelf: Shelf, packed: Sequence[PackedSection], history: Sequence[Sequence[Key]]) -> list[int]:
    """Indices of ``packed`` (the shelf's sections), most likely to be needed first: those recent questions
    packed (the more often and the more recently, the sooner), then the others spread over the collection,
    each document in turn and each from its start (a question over any document finds its sections first,
    where every section cannot be saved)."""
    used: dict[Key, float] = {}
    for age, pack in enumerate(history):
        for key in pack:
            used[key] = used.get(key, 0.0) + 1.0 / (1 + age)
    by_doc: dict[str, list[int]] = {}
    for i, p in enumerate(packed):
        by_doc.setdefault(p.section.source, []).append(i)
    spread: dict[int, tuple[int, int]] = {}
    for d, indices in enumerate(by_doc.values()):
        for rank, i in enumerate(indices):
            spread[i] = (rank, d)
    return sorted(range(len(packed)), key=lambda i: (-used.get(packed[i].section.key, 0.0), spread[i]))


@dataclass(frozen=True)
class Choice:
    """The sections to save now, most useful first (``chosen``, indices of the shelf's packed sections), and
    what is left for questions to compute, with why."""

    chosen: list[int]
    left: list[int]
    room_bytes: int
    reason: str = ""


def choose(rt: "Runtime", shelf: Shelf, packed: Sequence[PackedSection]) -> Choice:
    """What fits the room section states have in the cache, most useful first (:func:`order`); every section
    where all fit. The room is the cache's room for new states (its budget in force, ``cache.max_gb`` or a
    share of its disk, less the states used lately: :meth:`~pipeline.engine.cache.prefix_cache.PrefixCache.room`),
    at most :data:`SECTIONS_SHARE` of the budget; each state is sized as it will be written
    (:meth:`~pipeline.engine.local.Engine.section_state_bytes`)."""
    engine, cache = rt.engine, rt.prefix_cache
    ranked = order(shelf, packed, rt.pack_history.recent(engine.namespace, shelf.collection))
    budget = cache.budget_bytes()
    room = min(int(budget * SECTIONS_SHARE), cache.room())
    need = [engine.section_state_bytes(len(p.tokens)) for p in packed]
    chosen, used = [], 0
    for i in ranked:
        if used + need[i] > room:
            break
        chosen.append(i)
        used += need[i]
    taken = set(chosen)
    left = [i for i in ranked if i not in taken]
    reason = ""
    if left:
        of = f"cache.max_gb = 0: {budget / 1e9:,.1f} GB, a share of its disk" if cache.auto else "cache.max_gb"
        reason = (f"the states of all {len(packed)} sections would take about {sum(need) / 1e9:,.1f} GB; the cache "
                  f"has room for about {room / 1e9:,.1f} GB of them (at most {SECTIONS_SHARE:.0%} of {of}, less "
                  f"the states questions use)")
    return Choice(chosen, left, room, reason)


def shelf_of(rt: "Runtime", *, require: bool) -> tuple[Shelf, list[PackedSection]] | None:
    """The whole collection's shelf and its sections as every prompt renders them (None: no collection, unless
    ``require``, which raises)."""
    with rt.store(create=False) as store:
        if require:
            store.require()
        elif store.info is None:
            return None
        shelf = gather(store, sources=None, target=rt.section_tokens, fetch_tokens=2**62)
        record_cut(store, shelf.cut_now)
    shelf.fixed_numbers = True  # as questions over the whole collection number its documents
    return shelf, number(shelf, shelf.sections, rt.section_memo)


def _fits_context(rt: "Runtime", packed: Sequence[PackedSection]) -> str:
    """Why the sections cannot be composed at this context ("" where they can): sections cut for a larger one."""
    engine = rt.engine
    room = rt.layout().budget(n_ctx=engine.n_ctx, reserve=rt.reserve(), suffix_tokens=0)
    longest = max((len(p.tokens) for p in packed), default=0)
    if longest <= room:
        return ""
    return (f"the collection's sections were cut for a larger context: the longest has {longest:,} tokens, and a "
            f"prompt at this context (engine.n_ctx = {engine.n_ctx:,}) holds {room:,} for documents. Cut them again "
            f"for it with `rag sections --recut`, or raise engine.n_ctx")


def _save(rt: "Runtime", shelf: Shelf, packed: list[PackedSection], meter: Meter, cancel: "CancelToken | None",
          prompts: list, *, allowed_only: bool = True) -> dict:
    """Calibrate on ``prompts``, then save the chosen sections' states (``allowed_only``: only where the
    calibration lets prompts be composed); the report of both."""
    engine = rt.engine
    head = rt.layout().head_tokens
    choice = choose(rt, shelf, packed)
    tokens = [packed[i].tokens for i in choice.chosen]
    had = engine.saved_sections(head, tokens)
    by_prompts = calibration.sections_of(prompts)  # the calibration computes and saves these itself
    missing = sum(len(t) for t, saved in zip(tokens, had) if not saved and tuple(t) not in by_prompts)
    meter.stage("starting", total=meter.progress.done + calibration.cost(prompts) + missing)
    calibration.calibrate(rt, prompts, meter=meter, cancel=cancel)
    refusal = engine.composition_refusal()
    if refusal is not None and allowed_only:
        return {"warmed": False, "reason": refusal.value, "calibration": calibration.calibration_dict(rt)}
    now = engine.saved_sections(head, tokens)
    missing = sum(len(t) for t, saved in zip(tokens, now) if not saved)
    meter.stage(f"saving section states ({len(tokens)} of {len(packed)} sections)",
                total=meter.progress.done + missing)  # the calibration saved some of them
    report = engine.warm_sections(head, tokens, progress=meter.add, cancel=cancel, on_wait=lambda holder: meter.stage(
        f"waiting for another rag process{holder} that saves the same section states"))
    meter.stage("done", total=meter.progress.done)
    # States the calibration saved are this run's too: "cached" counts those saved before it.
    by_calibration = min(report["cached"], sum(1 for before, after in zip(had, now) if after and not before))
    report["saved"] += by_calibration
    report["cached"] -= by_calibration
    left = [packed[i] for i in choice.left]
    return {"warmed": True, "mode": "sections", "documents": len(shelf.documents), **report,
            "sections": len(packed), "chosen": len(tokens), "left": len(left),
            "left_tokens": sum(len(p.tokens) for p in left), "left_reason": choice.reason,
            "room_bytes": choice.room_bytes, "calibration": calibration.calibration_dict(rt)}


def writable_cache(rt: "Runtime"):
    """The prefix cache, where states can be saved in it; else a :class:`~pipeline.errors.ConfigError`."""
    cache = rt.prefix_cache
    if cache is None:
        raise ConfigError("the prefix cache is off (cache.enabled = false): nothing to warm")
    if cache.unavailable or cache.read_only:
        raise ConfigError(f"the prefix cache cannot save states: "
                          f"{cache.unavailable or f'{cache.directory} is read-only'}")
    return cache


def warm_sections(rt: "Runtime", *, progress: Callable[[WarmProgress], None] | None = None,
                  cancel: "CancelToken | None" = None) -> dict:
    """:meth:`Pipeline.warm_sections <pipeline.api.Pipeline.warm_sections>`: composition calibrated where
    it is not yet, then each section's state saved, the most useful first, within the cache's room.

    Returns ``{"mode": "sections", "documents", "sections", "chosen" (saved now or before), "saved",
    "cached" (had a whole state already, or another process saved it meanwhile), "not_saved", "repaired"
    (states found missing or damaged, saved again), "left" / "left_tokens" / "left_reason" (sections
    without a state for want of room, and why), "room_bytes", "tokens", "prefilled_tokens",
    "bytes_written", "seconds", "notes", "calibration"}``: ``saved + cached + not_saved`` is ``chosen``."""
    if not rt.compose_policy.enabled:
        raise ConfigError("section states serve composed prompts, and ask.compose is \"off\": set it to "
                          "\"auto\" (RAG_ASK_COMPOSE=auto) to save and use them")
    writable_cache(rt)
    shelf, packed = shelf_of(rt, require=True)
    refusal = rt.engine.composition_refusal(calibrated=False)
    if refusal is not None:
        raise ConfigError(f"section states cannot be used: {refusal.value}")
    why = _fits_context(rt, packed)
    if why:
        raise ConfigError(why)
    # Saved even where the calibration is over the budget, as asked: ask.compose = "on" or another budget uses them.
    return _save(rt, shelf, packed, Meter(progress), cancel, calibration.wanted_prompts(rt, shelf),
                 allowed_only=False)


def warm_auto(rt: "Runtime", *, progress: Callable[[WarmProgress], None] | None = None,
              cancel: "CancelToken | None" = None) -> dict:
    """:meth:`Pipeline.warm_auto <pipeline.api.Pipeline.warm_auto>`: section states where they pay, else
    nothing, and why. A failure (a generator that does not load, a full cache disk) is a reason too: the
    ingest before it stands, and the questions compute what is missing."""
    try:
        return _warm_auto(rt, Meter(progress), cancel)
    except Cancelled:
        raise
    except RagError as exc:
        return {"warmed": False, "reason": f"section states not saved: {exc}", "failed": True}


def _warm_auto(rt: "Runtime", meter: Meter, cancel: "CancelToken | None") -> dict:
    from ..models import is_server

    def skipped(reason: str, **more) -> dict:
        return {"warmed": False, "reason": reason, **more}

    if not rt.compose_policy.enabled:
        return skipped("ask.compose is \"off\"")
    if is_server(rt.config.models.generator):
        return skipped("the generator is a server: its own cache holds its states")
    cache = rt.prefix_cache
    if cache is None or cache.unavailable or cache.read_only:
        return skipped("the prefix cache cannot save states")
    meter.stage("reading the collection's sections")
    found = shelf_of(rt, require=False)
    if found is None:
        return skipped("the collection does not exist")
    shelf, packed = found
    if not packed:
        return skipped("the collection is empty")
    engine = rt.engine
    if sum(len(p.tokens) for p in packed) <= rt.layout().budget(n_ctx=engine.n_ctx, reserve=rt.reserve(),
                                                                 suffix_tokens=0):
        return skipped("the collection fits the context: the first question saves its prefix for the next")
    refusal = engine.composition_refusal(calibrated=False)
    if refusal is not None:
        return skipped(refusal.value)
    why = _fits_context(rt, packed)
    if why:
        return skipped(why)
    report = _save(rt, shelf, packed, meter, cancel, calibration.wanted_prompts(rt, shelf))
    if report["warmed"]:
        report["reason"] = "the collection is larger than the context and this model composes"
    return report


__all__ = ["Choice", "SECTIONS_SHARE", "choose", "order", "shelf_of", "warm_auto", "warm_sections",
           "writable_cache"]
