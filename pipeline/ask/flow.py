"""Answering a question: which documents, what is retrieved, how it is packed, how it is generated.

The ask path of :class:`~pipeline.api.Pipeline` (``ask``, ``ask_stream``, ``ask_many``,
``chat_stream``): each function takes the pipeline first and uses its settings and lazily
loaded resources (engine, stops, prompt layouts, pack history, store). Retrieval and
packing run beside any generation; the engine is taken only when a stream is iterated
(see :mod:`.concurrency`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from .answer import Answer, AnswerStream, AskStats
from ..concurrency import CancelToken
from ..config import ASK_MODES
from ..ingest.scan import source_names
from ..store.store import Store

if TYPE_CHECKING:
    from .prompt import Prompt
    from .request import AskOptions
    from .progress import PrefillProgress

# Pipeline is named in strings only: api imports this module, so importing api here would make the two one.

Paths = "str | Path | Sequence[str | Path] | None"


def ask_stream(rag: "Pipeline", question: str, *, doc: Paths = None, source: Paths = None, mode: str | None = None,
               top_k: int | None = None, temperature: float | None = None, max_tokens: int | None = None,
               system_prompt: str | None = None, stop: str | Sequence[str] | None = None,
               cancel: CancelToken | None = None, progress: "Callable[[PrefillProgress], None] | None" = None,
               history: Sequence[dict] | None = None) -> AnswerStream:
    """:meth:`Pipeline.ask_stream`: the prompt is built here, generation starts when the stream is iterated."""
    from ..errors import InputError
    from .request import AskOptions

    if not isinstance(question, str) or not question.strip():
        raise InputError("the question is empty")
    options = AskOptions.resolve(rag.config.ask, temperature=temperature, max_tokens=max_tokens,
                                 system_prompt=system_prompt, stop=stop, top_k=top_k, mode=mode)
    text, query = question, None
    if history:
        from . import chat

        text, query = chat.transcript(history, question), chat.condense(history, question)
    timings: dict[str, float] = {}
    prompt, notes, finish = build_prompt(rag, text, doc=doc, source=source, mode=options.mode,
                                         top_k=options.top_k, timings=timings, options=options, query=query)
    stats = AskStats(mode=prompt.mode, sections=[p.to_dict() for p in prompt.sections])
    stops = rag.stops.with_strings(options.stop)
    engine = rag._pool.pick(prompt.tokens, prefix_len=len(prompt.prefix_tokens), boundaries=prompt.boundaries)
    cancel = cancel or CancelToken()  # every generator takes one: a stream can always be cancelled
    generation = engine.generate(prompt.tokens, max_tokens=options.max_tokens, temperature=options.temperature,
                                 repeat_penalty=rag.config.ask.repeat_penalty,
                                 prefix_len=len(prompt.prefix_tokens), boundaries=prompt.boundaries,
                                 stats=stats, stop_tokens=stops.tokens, cancel=cancel,
                                 progress=_tracker(progress) if progress else None)
    return AnswerStream(question, prompt, generation, notes, timings, finish, stops=stops.strings, cancel=cancel)


def ask_many(rag: "Pipeline", questions: Sequence[str], *, doc: Paths = None, source: Paths = None,
             max_tokens: int | None = None, system_prompt: str | None = None) -> list[Answer]:
    """:meth:`Pipeline.ask_many`: the questions grouped by their prompts' prefix, each group decoded together."""
    from .request import AskOptions
    from .stops import until_stop

    options = AskOptions.resolve(rag.config.ask, max_tokens=max_tokens, system_prompt=system_prompt)
    built = []
    for q in questions:
        if not isinstance(q, str) or not q.strip():
            from ..errors import InputError

            raise InputError("a question is empty")
        timings: dict[str, float] = {}
        built.append((q, *build_prompt(rag, q, doc=doc, source=source, mode=options.mode, top_k=options.top_k,
                                       timings=timings, options=options), timings))
    engine, stops = rag.engine, rag.stops
    answers: list[Answer | None] = [None] * len(built)
    by_prefix: dict[tuple, list[int]] = {}
    for i, (_, prompt, *_rest) in enumerate(built):
        by_prefix.setdefault((tuple(prompt.prefix_tokens), tuple(prompt.boundaries)), []).append(i)
    for (prefix, boundaries), members in by_prefix.items():
        kw = dict(prefix_len=len(prefix), boundaries=boundaries, max_tokens=options.max_tokens,
                  temperature=options.temperature, repeat_penalty=rag.config.ask.repeat_penalty)
        done = engine.generate_many([built[i][1].tokens for i in members], **kw)
        for i, completion in zip(members, done):
            q, prompt, notes, finish, timings = built[i]
            stats = AskStats(**completion.stats.__dict__, mode=prompt.mode,
                             sections=[p.to_dict() for p in prompt.sections])
            if finish is not None:
                finish(stats)
            text = "".join(until_stop([completion.text], stops.strings)).strip()
            answers[i] = Answer(q, text, prompt.sources, stats, prompt.dropped, prompt.truncated,
                                notes + stats.notes, timings)
    return answers  # type: ignore[return-value]


def chat_stream(rag: "Pipeline", question: str, *, chat_id: str | None = None,
                history: Sequence[dict] | None = None, **options: Any) -> AnswerStream:
    """:meth:`Pipeline.chat_stream`: earlier turns from ``chat_id``'s file (or ``history``); the new one is
    saved once the answer is complete."""
    from .chat import ChatStore

    store = ChatStore(rag.config.store_path / "chats") if chat_id else None
    if store is not None and history is None:
        history = store.history(chat_id)
    stream = rag.ask_stream(question, history=history, **options)
    if store is not None:
        stream.on_complete(lambda answer: store.append(chat_id, question, answer.text))
    return stream


def build_prompt(rag: "Pipeline", question: str, *, doc: Paths, source: Paths, mode: str | None,
                 top_k: int | None, timings: dict[str, float] | None = None, options: "AskOptions | None" = None,
                 query: str | None = None, remember: bool = True
                 ) -> "tuple[Prompt, list[str], Callable[[AskStats], None] | None]":
    """The packed prompt for ``question`` (what goes last in it); retrieval uses ``query``
    (default: the question). ``options`` set the system prompt and the answer's room.
    ``remember=False`` neither prefers nor records earlier packs (the prompt a first question
    gets: what ``rag eval --packed`` measures)."""
    from . import packing
    from ..errors import ConfigError

    a, r = rag.config.ask, rag.config.retrieval
    o = options or a
    query = query or question
    mode = mode or a.mode
    if mode not in ASK_MODES:
        raise ConfigError(f"mode must be one of {', '.join(ASK_MODES)}, got {mode!r}")
    k = top_k or a.top_k
    engine = rag.engine  # the model file is found now; it loads only after the store is released
    notes: list[str] = []

    if mode == "auto":
        namespace = engine.namespace
        history = rag.pack_history.recent(namespace, rag.config.store.collection) if remember else []
        with _reading(rag) as store:
            selection = selected_sources(store, doc, source)
            hits = _retrieve(rag, query, store, k=2 * r.candidates, sources=selection, expand_passages=False,
                             timings=timings)
            shelf = packing.gather(store, sources=selection, target=rag.section_tokens, hits=hits,
                                   fetch_tokens=3 * engine.n_ctx, also={key for p in history[:16] for key in p})
        # The store is released: tokenising (and loading the generator) happens from here on.
        prompt = packing.plan(
            shelf, question, layout=rag._layout_for(o.system_prompt), tokenize=engine.tokenize,
            memo=rag._section_tokens, n_ctx=engine.n_ctx, reserve=rag._reserve(o.max_tokens),
            tolerance=a.reuse_tolerance, history=history,
            reusable=lambda p: rag._pool.reusable(p.tokens, prefix_len=len(p.prefix_tokens),
                                                  boundaries=p.boundaries),
            top_k=k, neighbours=a.neighbours)
        if prompt is not None:
            if prompt.mode == "sections":
                notes.append(f"the selection ({sum(s.tokens for s in shelf.sections):,} tokens) does not fit the "
                             f"context of {engine.n_ctx:,}: packed {len(prompt.sections)} of its "
                             f"{len(shelf.sections)} sections, the most relevant, in document order")
            keys = [p.section.key for p in prompt.sections]
            if remember:
                rag.pack_history.record(namespace, shelf.collection, keys)
            previous = history[0] if history else None

            def finish(stats: AskStats) -> None:
                stats.reuse_lost = packing.reuse_note(
                    prompt, cached_tokens=stats.cached_tokens, previous=previous, documents=shelf.documents,
                    cache_on=rag.prefix_cache is not None, min_tokens=rag.config.cache.min_tokens)

            return prompt, notes, finish
        notes.append(f"not even one section fits the context of {engine.n_ctx:,} tokens: answering from "
                     "retrieved passages (sections were cut for a longer context; see chunking.section_tokens)")
    return _passages_prompt(rag, question, doc=doc, source=source, k=k, notes=notes, timings=timings,
                            options=options, query=query)


def selected_sources(store: Store, doc: Paths, source: Paths) -> list[str] | None:
    """The sources ``doc`` (documents) and ``source`` (documents or folders) select; None for all."""
    from ..errors import InputError

    def listed(value) -> list:
        if value is None:
            return []
        return [value] if isinstance(value, (str, os.PathLike)) else list(value)

    docs, folders = listed(doc), listed(source)
    if not docs and not folders:
        return None
    known = store.documents()

    def spellings(path) -> list[str]:
        return source_names(path)

    chosen: set[str] = set()
    for d in docs:
        found = next((s for s in spellings(d) if s in known), None)
        if found is None:
            raise InputError(f"{d} is not in collection '{store.name}' (ingest it first)")
        chosen.add(found)
    for f in folders:
        under = {s for s in known for p in spellings(f) if s == p or s.startswith(p.rstrip(os.sep) + os.sep)}
        if not under:
            raise InputError(f"no document of collection '{store.name}' is {f} or under it")
        chosen |= under
    return sorted(chosen)


def _retrieve(rag: "Pipeline", question: str, store: Store, *, k: int, sources: list[str] | None,
              expand_passages: bool = True, timings: dict[str, float] | None = None):
    from ..retrieval.search import expand

    a = rag.config.ask
    hits = rag._search(store, question, top_k=k, source=sources, use_mmr=a.mmr and expand_passages,
                       timings=timings)
    return expand(hits, store=store, neighbours=a.neighbours) if expand_passages else hits


@contextmanager
def _reading(rag: "Pipeline") -> Iterator[Store]:
    """The store, for answering: the collection must exist and hold documents."""
    from ..errors import StoreError

    with rag.store(create=False) as store:
        store.require()
        if store.catalog.totals(store.name)[0] == 0:
            raise StoreError(f"collection '{store.name}' is empty; run `rag ingest PATH` first")
        rag._check_embedder(store)
        yield store


def _pack(rag: "Pipeline", passages, question: str, options: "AskOptions | None" = None) -> "Prompt":
    """``passages`` and ``question`` as a prompt for the generator (:func:`.context.pack`)."""
    from .prompt import pack

    engine, a = rag.engine, options or rag.config.ask
    return pack(passages, question, chat=engine.chat, tokenize=engine.tokenize, bos=engine.bos,
                n_ctx=engine.n_ctx, reserve=a.max_tokens, system=a.system_prompt)


def _passages_prompt(rag: "Pipeline", question: str, *, doc: Paths, source: Paths, k: int, notes: list[str],
                     timings: dict[str, float] | None = None, options: "AskOptions | None" = None,
                     query: str | None = None):
    from ..retrieval.search import whole_document

    engine = rag.engine
    with _reading(rag) as store:
        selection = selected_sources(store, doc, source)
        whole = None
        if selection is not None and len(selection) == 1 and doc is not None and source is None:
            whole = whole_document(selection[0], store=store)  # `--doc FILE`: the whole of it, if it fits
            n_tokens = store.documents()[selection[0]].n_tokens
            passages = _retrieve(rag, query or question, store, k=max(4 * k, 16), sources=selection,
                                 timings=timings)
        else:
            passages = _retrieve(rag, query or question, store, k=k, sources=selection, timings=timings)

    def packed(ps):
        return _pack(rag, ps, question, options)

    prompt = None
    if whole is not None:
        prompt = packed(whole)
        if prompt.dropped or prompt.truncated:
            notes.append(f"{Path(selection[0]).name} ({n_tokens:,} tokens) does not fit the context of "
                         f"{engine.n_ctx:,} tokens: answering from its most relevant passages")
            prompt = None
    if prompt is None:
        prompt = packed(passages)
    if prompt.dropped:
        notes.append(f"{prompt.dropped} lower-ranked passage(s) did not fit the context and were left out")
    if prompt.truncated:
        notes.append("the best passage alone exceeds the context: it was cut at a sentence boundary")

    def finish(stats: AskStats) -> None:
        from .packing import reuse_note

        stats.reuse_lost = reuse_note(prompt, cached_tokens=stats.cached_tokens, previous=None, documents={},
                                      cache_on=rag.prefix_cache is not None,
                                      min_tokens=rag.config.cache.min_tokens)

    return prompt, notes, finish


def _tracker(callback):
    from .progress import tracker

    return tracker(callback)

