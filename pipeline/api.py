"""``Pipeline``: the public Python API. The CLI is a thin layer over it.

A pipeline holds settings and lazily loaded models; it opens the store (and so
takes the store's process lock) only while calls use it, so a long-lived
application does not block ``rag`` commands between calls.

A pipeline is safe to share between threads: see :mod:`.concurrency` for what runs
at the same time (retrieval beside generation, generation one at a time per engine,
first come first served) and how calls are cancelled.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from . import models
from .config import Config, load_config
from .ingest.run import IngestReport, Progress, ingest
from .ingest.scan import scan
from .concurrency import CancelToken, EngineGate
from .retrieve import Hit, search
from .stops import Stops, template_stops, until_stop
from .store.shared import SharedStore
from .store.store import Store

if TYPE_CHECKING:
    from .aio import AsyncAnswerStream
    from .context import Prompt
    from .engine.generator import EngineStats, Generation
    from .progress import PrefillProgress


@dataclass(frozen=True)
class CollectionStatus:
    """What a collection holds."""

    collection: str
    store: str
    exists: bool
    documents: int = 0
    chunks: int = 0
    tokens: int = 0
    dense_chunks: int = 0
    embedder: str | None = None
    dim: int | None = None
    chunk_size: int | None = None
    chunk_overlap: int | None = None
    collections: tuple[str, ...] = ()
    generator: str | None = None
    sources: tuple[dict, ...] = ()

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d["collections"] = list(self.collections)
        d["sources"] = list(self.sources)
        return d


@dataclass
class Answer:
    """An answer with the numbered sources it may cite as [1], [2] and the engine's figures."""

    question: str
    text: str
    sources: list[dict]
    stats: "EngineStats"
    dropped_passages: int = 0
    truncated: bool = False
    notes: list[str] | None = None

    def to_dict(self) -> dict:
        return {"question": self.question, "text": self.text, "sources": self.sources,
                "stats": self.stats.to_dict(), "dropped_passages": self.dropped_passages,
                "truncated": self.truncated, "notes": list(self.notes or [])}


@dataclass(frozen=True)
class AskOptions:
    """One call's answer settings: the ``[ask]`` configuration with the call's overrides."""

    temperature: float
    max_tokens: int
    system_prompt: str
    stop: tuple[str, ...] = ()
    top_k: int = 8
    mode: str | None = None


def _merge_passages(lists):
    """Passages of several retrievals: all of the first, then those of the others that add chunks."""
    import dataclasses

    out = []
    for passages in lists:
        for p in sorted(passages, key=lambda p: p.rank):
            if not any(q.source == p.source and q.first <= p.last and p.first <= q.last for q in out):
                out.append(dataclasses.replace(p, rank=len(out)))
    return out


class AnswerStream:
    """Text pieces as the model writes them; ``answer`` is complete once iteration ends.

    Iterating holds the pipeline's engine (other calls' generation waits, first come
    first served) from the first piece until the stream is exhausted or closed; a
    stream dropped half-way gives the engine back when it is garbage-collected. Use
    it in a ``with`` block (or call :meth:`close`) to give it back at a known moment.
    """

    def __init__(self, question: str, prompt: "Prompt", generation: "Generation", notes: list[str], *,
                 gate: EngineGate, stops: Sequence[str] = (), cancel: CancelToken | None = None):
        self.question = question
        self.prompt = prompt
        self.cancel_token = cancel or CancelToken()
        self._result: dict = {}  # filled by the iterator; no reference back to self (no cycle)
        self._iter = _stream(question, prompt, generation, notes, gate, tuple(stops), self.cancel_token,
                             self._result)

    @property
    def sources(self) -> list[dict]:
        return self.prompt.sources

    @property
    def answer(self) -> "Answer | None":
        return self._result.get("answer")

    def __iter__(self) -> Iterator[str]:
        return self._iter

    def result(self) -> Answer:
        for _ in self:
            pass
        if self.answer is None:
            from .errors import Cancelled

            raise Cancelled("the stream was closed before the answer was complete")
        return self.answer

    def on_complete(self, callback: Callable[["Answer"], None]) -> None:
        """Call ``callback(answer)`` when the answer is complete (not if cancelled or failed)."""
        self._result.setdefault("callbacks", []).append(callback)

    def cancel(self) -> None:
        """Stop generating: a running prefill or decode stops within one micro-batch."""
        self.cancel_token.cancel()

    def close(self) -> None:
        """Stop (if running) and give the engine back."""
        self._iter.close()

    def __enter__(self) -> "AnswerStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _stream(question, prompt, generation, notes, gate: EngineGate, stops, cancel: CancelToken,
            result: dict) -> Iterator[str]:
    from .errors import Cancelled, EngineError

    parts: list[str] = []
    with gate.turn(cancel):
        try:
            for piece in until_stop(generation, stops):
                cancel.raise_if_cancelled()
                parts.append(piece)
                yield piece
        except (EngineError, RuntimeError) as exc:
            if cancel.cancelled:
                raise Cancelled("generation was cancelled") from None
            if isinstance(exc, EngineError):
                raise
            raise EngineError(f"llama.cpp failed while generating: {exc}") from None
        finally:
            generation.close()  # sampler and counters settle while the engine is still ours
    stats = generation.stats
    result["answer"] = answer = Answer(question, "".join(parts).strip(), prompt.sources, stats, prompt.dropped,
                                       prompt.truncated, notes + stats.notes)
    for callback in result.get("callbacks", ()):
        callback(answer)


class Pipeline:
    """Ingest, search and (later) ask over one collection, with settings from :mod:`.config`."""

    def __init__(self, config: Config, *, log: Callable[[str], None] | None = None):
        self.config = config.validate()
        self._log = log
        self._made: dict[str, Any] = {}  # models and caches, created once (see _resource)
        self._making = threading.RLock()
        self._pool: list[tuple[Any, EngineGate]] = []  # (engine, its gate); grows to engine.parallel
        self._stores = SharedStore(self.config.store_path, wait=self.config.store.wait)

    @classmethod
    def from_config(cls, path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None,
                    environ: Mapping[str, str] | None = None, log: Callable[[str], None] | None = None
                    ) -> "Pipeline":
        """Settings from a TOML file (or the embedded defaults), the environment and ``overrides``."""
        return cls(load_config(path, environ=environ, overrides=overrides), log=log)

    # -- resources ----------------------------------------------------------------------------

    def _resource(self, name: str, make: Callable[[], Any]) -> Any:
        """``make()`` once, however many threads ask at the same time."""
        made = self._made.get(name)
        if made is None:
            with self._making:
                made = self._made.get(name)
                if made is None:
                    made = self._made[name] = make()
        return made

    @property
    def embedder(self):
        def make():
            from .engine.embed import Embedder

            path = models.resolve(self.config.models.embedder, home=self.config.home_path,
                                  what="embedder", log=self._log)
            e = self.config.embed
            embedder = Embedder(path, threads=e.threads, flash_attn=e.flash_attn, gpu_layers=e.gpu_layers,
                                batch_tokens=e.batch_tokens)
            embedder.llm  # loaded here, once: two threads must not both load it
            return embedder

        return self._resource("embedder", make)

    @property
    def chunker(self):
        def make():
            from .ingest.chunking import for_embedder

            c = self.config.chunking
            return for_embedder(self.embedder, size=c.size, overlap=c.overlap)

        return self._resource("chunker", make)

    @property
    def engine(self):
        """The (first) generator engine: tokenising, templates and, with ``engine.parallel = 1``, every answer."""
        return self._resource("engine", self._new_engine)

    def _new_engine(self):
        import dataclasses

        from .engine.embed import usable_cpus
        from .engine.generator import Engine

        path = models.resolve(self.config.models.generator, home=self.config.home_path,
                              what="generator", log=self._log)
        settings = self.engine_settings(path)
        if settings.parallel > 1 and settings.threads == 0:  # engines share the cores, not oversubscribe them
            settings = dataclasses.replace(settings, threads=max(1, usable_cpus() // settings.parallel))
        engine = Engine(path, settings, log=self._log, cache=self.prefix_cache,
                        cache_min_tokens=self.config.cache.min_tokens)
        engine.llm  # loaded here, once
        return engine

    @property
    def _gate(self) -> EngineGate:
        """The first engine's gate (warm-ups and single-engine use)."""
        return self._engines()[0][1]

    def _engines(self) -> list[tuple[Any, EngineGate]]:
        with self._making:
            if not self._pool:
                first = self.engine
                self._pool.append((first, EngineGate(lambda: first.abort)))
            return list(self._pool)

    def _pick_engine(self) -> tuple[Any, EngineGate]:
        """The engine with the shortest queue; another one is loaded while all are busy and
        fewer than ``engine.parallel`` exist. With one engine, calls queue first come, first served."""
        pool = self._engines()
        free = [p for p in pool if not p[1].lock.locked and not p[1].lock.waiting]
        if free:
            return free[0]
        with self._making:
            if len(self._pool) < self.config.engine.parallel:
                engine = self._new_engine()
                self._pool.append((engine, EngineGate(lambda: engine.abort)))
                return self._pool[-1]
            return min(self._pool, key=lambda p: p[1].lock.waiting + p[1].lock.locked)

    @property
    def stops(self) -> Stops:
        """The default stops: the chat template's turn markers and the new-turn guard."""
        return self._resource("stops", lambda: template_stops(self.engine))

    def engine_settings(self, model_path: Path):
        """The engine settings: the configuration, with a ``rag tune`` profile over the keys left at default."""
        import dataclasses

        from .config import EngineConfig

        settings = self.config.engine
        if not settings.tuned:
            return settings
        from .engine.generator import ModelInfo
        from .planner.tune import tuned_settings

        n_ctx = settings.n_ctx or ModelInfo.read(model_path).n_ctx_train
        tuned = tuned_settings(self.config.home_path, model_path, n_ctx)
        default = EngineConfig()
        changes = {k.split(".", 1)[1]: v for k, v in tuned.items()
                   if getattr(settings, k.split(".", 1)[1]) == getattr(default, k.split(".", 1)[1])}
        if changes and self._log:
            self._log("using tuned settings: " + ", ".join(f"{k}={v}" for k, v in sorted(changes.items())))
        return dataclasses.replace(settings, **changes)

    def plan(self, model: str | Path | None = None, *, builtin_spec: str | None = None, quant: str = "Q6_K",
             hardware: str | Path | None = None, vram_gb: float | None = None, ram_gb: float | None = None,
             n_ctx: int | None = None, kv: str | None = None, n_batch: int | None = None,
             n_ubatch: int | None = None, compare: bool = False) -> dict:
        """The fastest estimated offload/batch plan that fits, with llama.cpp's fit (modelled) beside it.

        ``model`` is a GGUF (default: the configured generator) unless ``builtin_spec`` names
        published shapes ("qwen3.6-35b-a3b"); ``hardware`` is a built-in profile name or a
        profile TOML (default: the one ``rag tune`` saved, else "cpu"); ``kv`` "auto" searches
        the KV cache type. ``compare`` adds the recipe, its baseline and llama.cpp's fit side by side.
        """
        import dataclasses

        from .planner import plan as plan_mod
        from .errors import ConfigError
        from .planner.spec import ModelSpec

        if builtin_spec:
            if builtin_spec.lower().replace(".", "") not in ("qwen36-35b-a3b", "qwen3635ba3b"):
                raise ConfigError(f"unknown model spec {builtin_spec!r} (known: qwen3.6-35b-a3b)")
            spec = ModelSpec.qwen36_35b_a3b(quant=quant)
        else:
            ref = str(model) if model else self.config.models.generator
            spec = ModelSpec.from_gguf(models.resolve(ref, home=self.config.home_path, what="model",
                                                      log=self._log))
        hw = self.hardware(hardware)
        if vram_gb is not None:
            hw = dataclasses.replace(hw, vram=int(vram_gb * 2**30))
        if ram_gb is not None:
            hw = dataclasses.replace(hw, ram=int(ram_gb * 2**30))
        n_ctx = n_ctx or self.config.engine.n_ctx or spec.n_ctx_train
        kv_types = ("f16", "q8_0", "q4_0") if kv == "auto" else (kv or self.config.engine.type_k)
        best = plan_mod.plan(spec, hw, n_ctx=n_ctx, kv_types=kv_types, n_batch=n_batch, n_ubatch=n_ubatch)
        fit = plan_mod.fit_like(spec, hw, n_ctx=n_ctx, kv=best.plan.type_k)
        rows = plan_mod.compare(spec, hw, n_ctx=n_ctx) if compare else None
        return {"plan": best, "fit": fit, "hardware": hw, "compare": rows}

    def tune(self, *, max_seconds: float = 120.0, n_tokens: int | None = None, measure_hardware: bool = False,
             progress=None):
        """Measure candidate settings on this machine, save the fastest as this model's profile.

        Returns ``(TuneResult, profile path)``; later ``ask`` calls pick the profile up.
        """
        from .planner import hardware as hw_mod
        from .planner import tune as tune_mod
        from .engine.generator import ModelInfo

        path = models.resolve(self.config.models.generator, home=self.config.home_path, what="generator",
                              log=self._log)
        hw = self.hardware()
        n_ctx = self.config.engine.n_ctx or ModelInfo.read(path).n_ctx_train
        result = tune_mod.tune(path, engine_settings=self.config.engine, hardware=hw, n_ctx=n_ctx,
                               max_seconds=max_seconds, n_tokens=n_tokens, progress=progress,
                               measure_hardware=measure_hardware)
        target = tune_mod.write_profile(
            result, tune_mod.profile_path(self.config.home_path, models.file_identity(path), n_ctx))
        if measure_hardware and result.hardware is not None:
            hw_mod.save_profile(result.hardware, self.config.home_path / "hardware.toml")
        return result, target

    def hardware(self, profile: str | Path | None = None):
        """A hardware profile: a built-in name or a TOML file; by default the one ``rag tune
        --measure-hardware`` saved in the home, else the CPU profile with this machine's RAM."""
        from .planner import hardware as hw_mod

        saved = self.config.home_path / "hardware.toml"
        if profile is None:
            return hw_mod.load_profile(saved) if saved.exists() else hw_mod.get_profile("cpu").with_ram()
        if Path(str(profile)).suffix == ".toml":
            return hw_mod.load_profile(profile)
        return hw_mod.get_profile(str(profile))

    @property
    def prefix_cache(self):
        """The on-disk prefix KV cache, or None when ``cache.enabled`` is off."""
        if not self.config.cache.enabled:
            return None

        def make():
            from .engine.cache import PrefixCache

            return PrefixCache(self.config.cache_path, max_bytes=int(self.config.cache.max_gb * 2**30))

        return self._resource("prefix_cache", make)

    @contextmanager
    def store(self) -> Iterator[Store]:
        """The collection's store, open for the ``with`` block.

        The threads of this pipeline share one open store (and one process lock), so
        searches go on while this pipeline ingests; another process waits ``store.wait``.
        """
        with self._stores.open(self.config.store.collection) as s:
            yield s

    def pull_models(self) -> dict[str, str]:
        """Provision the configured models (download, convert) and return their local paths."""
        out = {}
        for role in ("embedder", "generator"):
            ref = getattr(self.config.models, role)
            out[role] = str(models.resolve(ref, home=self.config.home_path, what=role, log=self._log))
        return out

    # -- operations ---------------------------------------------------------------------------

    def ingest(self, paths: Iterable[str | Path], *, prune: bool = False,
               progress: Progress | None = None) -> IngestReport:
        """Embed new and changed files under ``paths`` into the collection (see :func:`.ingest.ingest`)."""
        scanned = scan(paths)  # a missing path fails before any model loads or the store opens
        with self.store() as store:
            c = self.config.chunking
            return ingest(scanned, store=store, embedder=self.embedder, chunk_size=c.size,
                          chunk_overlap=c.overlap, embedder_ref=self.config.models.embedder,
                          prune=prune, progress=progress)

    def search(self, query: str, *, top_k: int | None = None) -> list[Hit]:
        """The best chunks for ``query`` by hybrid retrieval."""
        from .errors import InputError

        if not query.strip():
            raise InputError("the query is empty")
        r = self.config.retrieval
        with self.store() as store:
            store.require()
            return search(query, store=store, embedder=self.embedder if r.dense else None,
                          top_k=top_k or r.top_k, dense=r.dense, lexical=r.lexical,
                          candidates=max(r.candidates, top_k or 0), rrf_k=r.rrf_k)

    # -- asking (per-call options, streams, cancellation) --------------------------------------

    def ask(self, question: str, *, doc: str | Path | None = None, top_k: int | None = None,
            temperature: float | None = None, max_tokens: int | None = None,
            system_prompt: str | None = None, stop: Sequence[str] | None = None, mode: str | None = None,
            cancel: CancelToken | None = None, progress: "Callable[[PrefillProgress], None] | None" = None
            ) -> Answer:
        """Answer ``question`` from retrieved passages (or from one whole document with ``doc``).

        Options left at None come from the ``[ask]`` settings. ``stop`` strings end the
        answer (added to the defaults: the chat template's turn markers and a guard
        against invented "Question:" turns). ``cancel`` stops the call from another
        thread (:class:`~pipeline.errors.Cancelled` is raised). ``progress`` receives a
        :class:`~pipeline.progress.PrefillProgress` after each piece of the prefill. Safe to
        call from many threads: generation runs one call at a time, in arrival order.
        """
        return self.ask_stream(question, doc=doc, top_k=top_k, temperature=temperature,
                               max_tokens=max_tokens, system_prompt=system_prompt, stop=stop, mode=mode,
                               cancel=cancel, progress=progress).result()

    def ask_stream(self, question: str, *, doc: str | Path | None = None, top_k: int | None = None,
                   temperature: float | None = None, max_tokens: int | None = None,
                   system_prompt: str | None = None, stop: Sequence[str] | None = None,
                   mode: str | None = None, cancel: CancelToken | None = None,
                   history: Sequence[dict] | None = None,
                   progress: "Callable[[PrefillProgress], None] | None" = None) -> AnswerStream:
        """Like :meth:`ask`, streaming: iterate the result for text pieces as they are generated.

        Retrieval and packing happen here (beside any running generation); the engine
        is taken when iteration starts (see :class:`AnswerStream`). ``history`` (earlier
        ``{"role": "user"|"assistant", "content": ...}`` turns) makes it a follow-up:
        see :meth:`chat`.
        """
        from .errors import InputError

        if not question.strip():
            raise InputError("the question is empty")
        options = self._options(temperature=temperature, max_tokens=max_tokens, system_prompt=system_prompt,
                                stop=stop, mode=mode, top_k=top_k)
        if history:
            from . import chat

            earlier = chat.user_questions(history)
            prompt, notes = self._prompt(chat.transcript(history, question), doc=doc, top_k=options.top_k,
                                         options=options, queries=[*earlier[:1], chat.condense(history, question)])
        else:
            prompt, notes = self._prompt(question, doc=doc, top_k=options.top_k, options=options)
        return self._stream_prompt(question, prompt, notes, options, cancel=cancel, progress=progress)

    # -- conversations (see .chat) ------------------------------------------------------------

    def chat(self, question: str, *, chat_id: str | None = None, history: Sequence[dict] | None = None,
             **options: Any) -> Answer:
        """Answer a follow-up in a conversation: ``chat_id`` keeps the turns on disk
        (``chats/`` in the store directory), or pass ``history`` yourself. Retrieval uses a condensed
        standalone query; earlier turns sit after the documents, so the documents'
        prefix stays cached from turn to turn. Other options as for :meth:`ask`."""
        return self.chat_stream(question, chat_id=chat_id, history=history, **options).result()

    def chat_stream(self, question: str, *, chat_id: str | None = None, history: Sequence[dict] | None = None,
                    **options: Any) -> AnswerStream:
        """:meth:`chat`, streaming. With ``chat_id``, the turn is saved once the answer is complete."""
        from .chat import ChatStore

        store = ChatStore(self.config.store_path / "chats") if chat_id else None
        if store is not None and history is None:
            history = store.history(chat_id)
        stream = self.ask_stream(question, history=history, **options)
        if store is not None:
            stream.on_complete(lambda answer: store.append(chat_id, question, answer.text))
        return stream

    # -- asyncio (see .aio) -------------------------------------------------------------------

    async def aask(self, question: str, **options: Any) -> Answer:
        """:meth:`ask` for asyncio: the loop never blocks; cancelling the task cancels the call."""
        from .aio import aask

        return await aask(self, question, **options)

    def aask_stream(self, question: str, **options: Any) -> "AsyncAnswerStream":
        """:meth:`ask_stream` for asyncio: ``async for piece in rag.aask_stream(q)``, then ``.answer``."""
        from .aio import AsyncAnswerStream

        return AsyncAnswerStream(lambda cancel: self.ask_stream(question, cancel=cancel, **options))

    async def asearch(self, query: str, **options: Any) -> list[Hit]:
        """:meth:`search` in a worker thread (it never waits for the engine)."""
        from .aio import in_thread

        return await in_thread(self.search, query, **options)

    def _stream_prompt(self, question: str, prompt: "Prompt", notes: list[str], options: "AskOptions", *,
                       cancel: CancelToken | None, progress=None) -> AnswerStream:
        from .progress import tracker

        stops = self.stops.with_strings(options.stop)
        engine, gate = self._pick_engine()
        generation = engine.generate(prompt.tokens, max_tokens=options.max_tokens,
                                          temperature=options.temperature,
                                          repeat_penalty=self.config.ask.repeat_penalty,
                                          prefix_len=len(prompt.prefix_tokens), stop_tokens=stops.tokens,
                                          progress=tracker(progress) if progress else None)
        return AnswerStream(question, prompt, generation, notes, gate=gate, stops=stops.strings,
                            cancel=cancel)

    def _options(self, *, temperature, max_tokens, system_prompt, stop, mode, top_k) -> "AskOptions":
        from .errors import InputError

        a = self.config.ask
        if temperature is not None and not (0.0 <= float(temperature) <= 5.0):
            raise InputError(f"temperature must be between 0 and 5 (got {temperature})")
        if max_tokens is not None and not (1 <= int(max_tokens) <= 1_000_000):
            raise InputError(f"max_tokens must be a positive number of tokens (got {max_tokens})")
        if top_k is not None and not (1 <= int(top_k) <= 1000):
            raise InputError(f"top_k must be between 1 and 1000 (got {top_k})")
        if isinstance(stop, str):
            stop = [stop]
        if mode is not None:
            # The packing mode (issue 10) plugs in here: pass it to _prompt once packing has modes.
            raise InputError(f"mode {mode!r} is not available in this version (packing has one layout)")
        return AskOptions(
            temperature=a.temperature if temperature is None else float(temperature),
            max_tokens=a.max_tokens if max_tokens is None else int(max_tokens),
            system_prompt=a.system_prompt if system_prompt is None else str(system_prompt),
            stop=tuple(str(s) for s in (stop or ()) if s), top_k=top_k or a.top_k, mode=mode)

    def _prompt(self, question: str, *, doc, top_k: int | None, options: "AskOptions | None" = None,
                queries: Sequence[str] | None = None) -> "tuple[Prompt, list[str]]":
        """The packed prompt for ``question``; retrieval uses ``queries`` (default: the question),
        the passages of the first one first, then what the others add."""
        from .context import pack
        from .errors import InputError, StoreError
        from .retrieve import expand, whole_document

        a, r = self.config.ask, self.config.retrieval
        reserve = options.max_tokens if options else a.max_tokens
        system = options.system_prompt if options else a.system_prompt
        engine = self.engine
        notes: list[str] = []

        def packed(passages):
            return pack(passages, question, chat=engine.chat, tokenize=engine.tokenize, bos=engine.bos,
                        n_ctx=engine.n_ctx, reserve=reserve, system=system)

        def retrieve(store, *, k, source=None):
            found = []
            for query in queries or [question]:
                hits = search(query, store=store, embedder=self.embedder if r.dense else None, top_k=k,
                              dense=r.dense, lexical=r.lexical, candidates=max(r.candidates, k), rrf_k=r.rrf_k,
                              source=source, use_mmr=a.mmr, mmr_lambda=a.mmr_lambda)
                found.append(expand(hits, store=store, neighbours=a.neighbours))
            return found[0] if len(found) == 1 else _merge_passages(found)

        with self.store() as store:
            store.require()
            if store.catalog.totals(store.name)[0] == 0:
                raise StoreError(f"collection '{store.name}' is empty; run `rag ingest PATH` first")
            if doc is None:
                prompt = packed(retrieve(store, k=top_k or a.top_k))
            else:
                source = str(Path(doc).expanduser().resolve())
                record = store.catalog.document(store.name, source)
                if record is None:
                    raise InputError(f"{doc} is not in collection '{store.name}' (ingest it first)")
                prompt = packed(whole_document(source, store=store))
                if prompt.dropped or prompt.truncated:
                    notes.append(f"{Path(source).name} ({record.n_tokens:,} tokens) does not fit the "
                                 f"context of {engine.n_ctx:,} tokens: answering from its most relevant passages")
                    prompt = packed(retrieve(store, k=max(4 * (top_k or a.top_k), 16), source=source))
        if prompt.dropped:
            notes.append(f"{prompt.dropped} lower-ranked passage(s) did not fit the context and were left out")
        if prompt.truncated:
            notes.append("the best passage alone exceeds the context: it was cut at a sentence boundary")
        return prompt, notes

    def warm(self, *, progress: Callable[[str, str], None] | None = None) -> dict[str, str]:
        """Save the prefix state of every document's whole-document prompt (the ``ask --doc`` layout).

        Returns ``{source: outcome}`` with outcome "saved", "cached" (already there) or
        "too long" (does not fit the context; questions about it use retrieved passages).
        """
        from .context import pack
        from .retrieve import whole_document

        if self.prefix_cache is None:
            from .errors import ConfigError

            raise ConfigError("the prefix cache is off (cache.enabled = false): nothing to warm")
        engine, a = self.engine, self.config.ask
        with self.store() as store:
            store.require()
            prompts = {}
            for source in sorted(store.documents()):
                prompts[source] = pack(whole_document(source, store=store), "", chat=engine.chat,
                                       tokenize=engine.tokenize, bos=engine.bos, n_ctx=engine.n_ctx,
                                       reserve=a.max_tokens, system=a.system_prompt)
        outcomes = {}
        for source, prompt in prompts.items():
            if prompt.dropped or prompt.truncated:
                outcome = "too long"
            else:
                with self._gate.turn():
                    outcome = "saved" if engine.warm(prompt.prefix_tokens) else "cached"
            outcomes[source] = outcome
            if progress:
                progress(source, outcome)
        return outcomes

    def status(self) -> CollectionStatus:
        """What the collection holds; never creates anything."""
        path = self.config.store_path
        name = self.config.store.collection
        if not (path / "catalog.sqlite").exists():
            return CollectionStatus(collection=name, store=str(path), exists=False,
                                    generator=self.config.models.generator)
        with self.store() as store:
            info = store.info
            if info is None:
                return CollectionStatus(collection=name, store=str(path), exists=False,
                                        collections=tuple(store.catalog.collections()),
                                        generator=self.config.models.generator)
            docs, chunks, tokens = store.catalog.totals(name)
            sources = tuple(
                {"source": r.source, "format": r.format, "chunks": r.n_chunks, "tokens": r.n_tokens,
                 "pages": r.pages, "title": r.title}
                for r in sorted(store.documents().values(), key=lambda r: r.source))
            return CollectionStatus(
                collection=name, store=str(path), exists=True, documents=docs, chunks=chunks,
                tokens=tokens, dense_chunks=store.chunk_count(), embedder=info.embedder, dim=info.dim,
                chunk_size=info.chunk_size, chunk_overlap=info.chunk_overlap,
                collections=tuple(store.catalog.collections()), generator=self.config.models.generator,
                sources=sources)

    def drop(self) -> bool:
        """Delete the collection; False if it did not exist."""
        with self.store() as store:
            if store.info is None:
                return False
            store.drop()
            return True

    def close(self) -> None:
        """Free the models. Answers still running are stopped first (an engine that stays busy
        for 10 s, e.g. held by a stream kept alive and never finished, is left loaded)."""
        with self._making:
            busy = []
            for engine, gate in self._pool:
                if gate.stop():
                    if engine is not self._made.get("engine"):
                        engine.close()
                else:
                    busy.append(engine)
            self._pool.clear()
            if self._made.get("engine") in busy:
                self._made.pop("engine")
                if self._log:
                    self._log("warning: an engine was still in use at close: left loaded")
            for name in ("embedder", "engine", "prefix_cache"):
                resource = self._made.pop(name, None)
                if resource is not None:
                    resource.close()
            self._made.clear()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
