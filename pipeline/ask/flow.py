"""How a question flows: the ask path of :class:`~pipeline.api.Pipeline` (``ask``, ``ask_stream``,
``ask_many``, ``chat_stream``), over a :class:`~pipeline.runtime.Runtime`.

An :class:`~.request.AskRequest` comes in, checked. Its documents are selected in the
store and retrieval ranks their chunks (:mod:`pipeline.retrieval.search`); packing lays
out whole documents or fixed sections in canonical order (:mod:`.packing`, the prompt's
layout in :mod:`.prompt`), or, when not even a section fits, retrieved passages; the
generator then streams the answer (:mod:`.answer`), ended by the stops (:mod:`.stops`).
Retrieval and packing run beside any generation; the engine is taken only when a stream
is iterated (see :mod:`pipeline.engine.pool`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ..engine.context_lock import CancelToken
from ..engine.contract import CacheKind
from ..errors import InputError, StoreError
from ..ingest.scan import source_names
from ..ingest.sections import record_cut
from ..retrieval.search import expand, retrieve, whole_document
from ..store.store import Store
from . import packing
from .answer import Answer, AnswerStream, AskStats, complete
from .history import reuse_note, sections_note
from .prompt import pack
from .request import AskOptions, AskRequest
from .started import Start

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..records import Prompt


@dataclass
class Built:
    """A request's packed prompt, what to tell the user about it, and what completes its figures."""

    prompt: "Prompt"
    notes: list[str] = field(default_factory=list)
    finish: Callable[[AskStats], None] | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per retrieval stage


def ask_stream(rt: "Runtime", request: AskRequest) -> AnswerStream:
    """:meth:`Pipeline.ask_stream <pipeline.api.Pipeline.ask_stream>`: the prompt is built here,
    generation starts when the stream is iterated."""
    start = request.start or Start.now()
    options = request.options(rt.config.ask)
    built = build_prompt(rt, request, options=options)
    prompt = built.prompt
    stats = AskStats(mode=prompt.mode, sections=[p.to_dict() for p in prompt.sections])
    stops = rt.stops.with_strings(options.stop)
    shape = prompt.shape
    engine = rt.pool.pick(shape)
    cancel = request.cancel or CancelToken()  # every generator takes one: a stream can always be cancelled
    generation = engine.generate(shape, max_tokens=options.max_tokens, temperature=options.temperature,
                                 repeat_penalty=rt.config.ask.repeat_penalty, stats=stats,
                                 stop_tokens=stops.tokens, cancel=cancel,
                                 progress=_tracker(request.progress) if request.progress else None)
    stream = AnswerStream(request.question, prompt, generation, built.notes, built.timings, built.finish,
                          stops=stops.strings, cancel=cancel, start=start)
    stream.on_complete(lambda answer: rt.after_answer(engine))
    return stream


def ask_many(rt: "Runtime", requests: Sequence[AskRequest]) -> list[Answer]:
    """:meth:`Pipeline.ask_many <pipeline.api.Pipeline.ask_many>`: the questions grouped by their
    prompts' prefix, each group decoded together."""
    from .stops import until_stop

    built = [build_prompt(rt, r) for r in requests]
    engine, stops = rt.engine, rt.stops
    answers: list[Answer | None] = [None] * len(built)
    shapes = [b.prompt.shape for b in built]
    by_prefix: dict[tuple, list[int]] = {}
    for i, shape in enumerate(shapes):
        by_prefix.setdefault((shape.prefix, shape.cuts), []).append(i)
    for members in by_prefix.values():
        options = requests[members[0]].options(rt.config.ask)
        done = engine.generate_many([shapes[i] for i in members], max_tokens=options.max_tokens,
                                    temperature=options.temperature, repeat_penalty=rt.config.ask.repeat_penalty)
        for i, completion in zip(members, done):
            b = built[i]
            stats = AskStats(**completion.stats.__dict__, mode=b.prompt.mode,
                             sections=[p.to_dict() for p in b.prompt.sections])
            text = "".join(until_stop([completion.text], stops.strings))
            answers[i] = complete(requests[i].question, b.prompt, text, stats, b.notes, b.timings, b.finish)
    return answers  # type: ignore[return-value]


def chat_stream(rt: "Runtime", request: AskRequest) -> AnswerStream:
    """:meth:`Pipeline.chat_stream <pipeline.api.Pipeline.chat_stream>`: earlier turns from the
    ``chat_id``'s file (unless the request has its ``history``); the new turn is saved once the
    answer is complete."""
    from .chat import ChatStore

    chat_id = request.chat_id
    store = ChatStore(rt.config.store_path / "chats") if chat_id else None
    if store is not None and request.history is None:
        request = request.replace(history=tuple(store.history(chat_id)))
    stream = ask_stream(rt, request)
    if store is not None:
        stream.on_complete(lambda answer: store.append(chat_id, request.question, answer.text))
    return stream


def build_prompt(rt: "Runtime", request: AskRequest, *, options: AskOptions | None = None,
                 remember: bool = True) -> Built:
    """The packed prompt for ``request``: the documents (whole, or the sections that fit best) and the
    question last; retrieved passages where not even one section fits, or in passage mode.

    Packing records the pack in the runtime's pack history (as an answer would) and prefers earlier
    packs; ``remember=False`` does neither (the prompt a first question gets: what ``rag eval
    --packed`` measures).
    """
    options = options or request.options(rt.config.ask)
    engine = rt.engine  # the model file is found now; it loads beside retrieval (see _reading)
    timings: dict[str, float] = {}
    notes: list[str] = []
    if options.mode == "auto":
        built = _sections_prompt(rt, request, options, timings, remember=remember)
        if built is not None:
            return built
        notes.append(f"not even one section fits the context of {engine.n_ctx:,} tokens: answering from "
                     "retrieved passages (sections were cut for a longer context; see chunking.section_tokens)")
    return _passages_prompt(rt, request, options, notes, timings)


def selected_sources(store: Store, doc: Sequence, source: Sequence) -> list[str] | None:
    """The sources ``doc`` (documents) and ``source`` (documents or folders) select; None for all."""
    if not doc and not source:
        return None
    known = store.documents()
    chosen: set[str] = set()
    for d in doc:
        found = next((s for s in source_names(d) if s in known), None)
        if found is None:
            raise InputError(f"{d} is not in collection '{store.name}' (ingest it first)")
        chosen.add(found)
    for f in source:
        under = {s for s in known for p in source_names(f) if s == p or s.startswith(p.rstrip(os.sep) + os.sep)}
        if not under:
            raise InputError(f"no document of collection '{store.name}' is {f} or under it")
        chosen |= under
    return sorted(chosen)


def packing_depth(rt: "Runtime") -> int:
    """Hits that rank sections for packing: twice the retrieval candidates, or as many as sections
    fit the context where more do (small sections in a large context), so that the prompt can fill."""
    return max(2 * rt.config.retrieval.candidates, rt.engine.n_ctx // max(1, rt.section_tokens))


def _sections_prompt(rt: "Runtime", request: AskRequest, options: AskOptions, timings: dict[str, float],
                     *, remember: bool = True) -> Built | None:
    """Whole documents or the best fixed sections (:func:`.packing.pack_shelf`); None where not even the
    question's best section fits."""
    a, engine = rt.config.ask, rt.engine
    namespace = engine.namespace
    history = rt.pack_history.recent(namespace, rt.config.store.collection) if remember else []
    with _reading(rt) as store:
        selection = selected_sources(store, request.doc, request.source)
        hits = retrieve(rt, store, request.query, top_k=packing_depth(rt), source=selection, timings=timings)
        shelf = packing.gather(store, sources=selection, target=rt.section_tokens, hits=hits,
                               fetch_tokens=3 * engine.n_ctx, also={key for p in history[:16] for key in p})
        record_cut(store, shelf.cut_now)
    shelf.fixed_numbers = rt.compose_policy.enabled  # a section's tokens, so its state, the same in every pack
    # The store is released: tokenising (once the generator has loaded) happens from here on.
    prompt = packing.pack_shelf(
        shelf, request.text, layout=rt.layout(options.system_prompt), tokenize=engine.tokenize,
        memo=rt.section_memo, n_ctx=engine.n_ctx, reserve=rt.reserve(options.max_tokens),
        tolerance=a.reuse_tolerance, history=history,
        reusable=lambda p: rt.pool.reusable(p.shape), composes=lambda: rt.pool.composes,
        top_k=options.top_k, neighbours=a.neighbours)
    if prompt is None:
        return None
    notes = []
    if prompt.mode == "sections":
        notes.append(f"the selection ({sum(s.tokens for s in shelf.sections):,} tokens) does not fit the "
                     f"context of {engine.n_ctx:,}: packed {len(prompt.sections)} of its "
                     f"{len(shelf.sections)} sections, the most relevant, in document order")
        other = sorted({p.section.target for p in prompt.sections} - {rt.section_tokens})
        if other:
            notes.append(f"these sections were cut at {', '.join(f'{t:,}' for t in other)} tokens and the settings "
                         f"cut {rt.section_tokens:,} for a {engine.n_ctx:,}-token context: `rag sections --recut "
                         f"--ctx {engine.n_ctx}` cuts them again")
    if remember:
        rt.pack_history.record(namespace, shelf.collection, [p.section.key for p in prompt.sections])
    previous = history[0] if history else None

    def finish(stats: AskStats) -> None:
        prefix = "" if stats.cache is CacheKind.COMPOSED else reuse_note(
            prompt, cached_tokens=stats.cached_tokens, previous=previous, documents=shelf.documents,
            cache_on=rt.prefix_cache is not None, min_tokens=rt.config.cache.min_tokens)
        stats.reuse_lost = "; ".join(n for n in (sections_note(stats.sections_lost), prefix) if n)

    return Built(prompt, notes, finish, timings)


def _passages_prompt(rt: "Runtime", request: AskRequest, options: AskOptions, notes: list[str],
                     timings: dict[str, float]) -> Built:
    """Retrieved passages, best first as many as fit (the whole of a ``--doc`` document where it fits)."""
    engine, a, k = rt.engine, rt.config.ask, options.top_k

    def passages(store: Store, k: int, selection: list[str] | None):
        hits = retrieve(rt, store, request.query, top_k=k, source=selection, use_mmr=a.mmr, timings=timings)
        return expand(hits, store=store, neighbours=a.neighbours)

    with _reading(rt) as store:
        selection = selected_sources(store, request.doc, request.source)
        whole = None
        if selection is not None and len(selection) == 1 and request.whole_document:
            whole = whole_document(selection[0], store=store)  # `--doc FILE`: the whole of it, if it fits
            n_tokens = store.documents()[selection[0]].n_tokens
            found = passages(store, max(4 * k, 16), selection)
        else:
            found = passages(store, k, selection)

    def packed(ps):
        return pack(ps, request.text, chat=engine.chat, tokenize=engine.tokenize, bos=engine.bos,
                    n_ctx=engine.n_ctx, reserve=options.max_tokens, system=options.system_prompt)

    prompt = None
    if whole is not None:
        prompt = packed(whole)
        if prompt.dropped or prompt.truncated:
            notes.append(f"{Path(selection[0]).name} ({n_tokens:,} tokens) does not fit the context of "
                         f"{engine.n_ctx:,} tokens: answering from its most relevant passages")
            prompt = None
    if prompt is None:
        prompt = packed(found)
    if prompt.dropped:
        notes.append(f"{prompt.dropped} lower-ranked passage(s) did not fit the context and were left out")
    if prompt.truncated:
        notes.append("the best passage alone exceeds the context: it was cut at a sentence boundary")

    def finish(stats: AskStats) -> None:
        stats.reuse_lost = reuse_note(prompt, cached_tokens=stats.cached_tokens, previous=None, documents={},
                                      cache_on=rt.prefix_cache is not None, min_tokens=rt.config.cache.min_tokens)

    return Built(prompt, notes, finish, timings)


@contextmanager
def _reading(rt: "Runtime") -> Iterator[Store]:
    """The store, for answering: the collection must exist and hold documents."""
    with rt.store(create=False) as store:
        store.require()
        if store.catalog.totals(store.name)[0] == 0:
            raise StoreError(f"collection '{store.name}' is empty; run `rag ingest PATH` first")
        rt.check_embedder(store)
        rt.load_generator_soon()  # the model loads while retrieval runs
        yield store


def _tracker(callback):
    from .progress import tracker

    return tracker(callback)


__all__ = ["Built", "ask_many", "ask_stream", "build_prompt", "chat_stream", "selected_sources"]
