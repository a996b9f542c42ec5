"""``Pipeline``: the public Python API. The CLI is a thin layer over it.

A pipeline holds settings and lazily loaded models; it opens the store (and so
takes the store's process lock) only for the duration of each call, so a
long-lived application does not block ``rag`` commands between calls.

A pipeline is safe to share between threads: see :mod:`.concurrency` for what runs
at the same time (retrieval beside generation, generation one prompt at a time per
engine, first come first served) and how calls are cancelled.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from .ask import flow as asking
from . import models
from .ask.answer import Answer, AnswerStream, AskStats
from .ask.flow import Paths
from .concurrency import CancelToken, EnginePool, once
from .config import Config, load_config
from .ingest.run import IngestReport, Progress, ingest
from .ingest.scan import scan
from .retrieval.search import Hit, search
from .store.shared import SharedStore
from .store.store import Store

if TYPE_CHECKING:
    from .ask.prompt import Prompt
    from .engine.contract import TextEmbedder, TextGenerator
    from .ask.aio import AsyncAnswerStream
    from .retrieval.evaluate import EvalReport, Question
    from .ask.progress import PrefillProgress
    from .summarize.job import SummaryRun
    from .summarize.outputs import SummaryEvent


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


class Pipeline:
    """Ingest, search and ask over one collection, with settings from :mod:`.config`.

    The embedder and the generator are the configured llama.cpp models, loaded on first
    use, unless ``embedder`` or ``generator`` is given: any object that fulfils
    :class:`~pipeline.engine.contract.TextEmbedder` / :class:`~pipeline.engine.contract.TextGenerator`
    (the tests' fakes, a remote backend). The pipeline closes only what it made.
    """

    def __init__(self, config: Config, *, log: Callable[[str], None] | None = None,
                 embedder: "TextEmbedder | None" = None, generator: "TextGenerator | None" = None):
        self.config = config.validate()
        self._log = log
        self._given: set[str] = set()
        c = self.config.store
        self._stores = SharedStore(self.config.store_path, wait=c.wait, url=c.url, catalog_url=c.catalog_url,
                                   catalog_pool=c.catalog_pool)
        if embedder is not None:
            self.__dict__["embedder"] = embedder  # fills the cached property
            self._given.add("embedder")
        if generator is not None:
            self.__dict__["engine"] = generator
            self._given.add("engine")

    @classmethod
    def from_config(cls, path: str | Path | None = None, *, overrides: Mapping[str, Any] | None = None,
                    environ: Mapping[str, str] | None = None, log: Callable[[str], None] | None = None,
                    embedder: "TextEmbedder | None" = None, generator: "TextGenerator | None" = None
                    ) -> "Pipeline":
        """Settings from a TOML file (or the embedded defaults), the environment and ``overrides``.

        Configuration warnings go to ``log`` when one is given, else to :mod:`warnings`.
        """
        warn = (lambda m: log(f"warning: {m}")) if log else None
        return cls(load_config(path, environ=environ, overrides=overrides, warn=warn), log=log, embedder=embedder,
                   generator=generator)

    # -- resources ----------------------------------------------------------------------------

    @once
    def embedder(self):
        from .engine.embed import Embedder
        from .engine.remote.client import is_remote
        from .engine.embed_prompts import PrefixedEmbedder, gguf_names, resolve
        from .engine.remote.embedder import remote_embedder

        m = self.config.models
        if is_remote(m.embedder):
            inner = remote_embedder(m.embedder, self.config.remote)
            names: tuple[str, ...] = (getattr(getattr(inner, "ref", None), "model", "") or "",)
        else:
            path = models.resolve(m.embedder, home=self.config.home_path, what="embedder", log=self._log)
            e = self.config.embed
            inner = Embedder(path, threads=e.threads, flash_attn=e.flash_attn, gpu_layers=e.gpu_layers,
                             batch_tokens=e.batch_tokens)
            names = gguf_names(path)
        return PrefixedEmbedder(inner, resolve(m.embedder_query_prefix, m.embedder_document_prefix, names=names))

    @once
    def chunker(self):
        from .ingest.chunking import for_embedder

        c = self.config.chunking
        return for_embedder(self.embedder, size=c.size, overlap=c.overlap, contextual=c.contextual)

    @once
    def engine(self):
        from .engine.remote.client import is_remote
        from .engine.remote.generator import remote_generator

        if is_remote(self.config.models.generator):
            return remote_generator(self.config.models.generator, self.config.engine, self.config.remote,
                                    log=self._log)
        path = models.resolve(self.config.models.generator, home=self.config.home_path,
                              what="generator", log=self._log)
        return self._new_engine(path)

    def _new_engine(self, path: Path | None = None):
        import dataclasses

        from .engine.local import Engine
        from .engine.host import usable_cpus

        path = path or self.engine.model_path
        settings = self.engine_settings(path)
        if self.config.engine.parallel > 1 and settings.threads == 0:  # engines share the cores
            settings = dataclasses.replace(settings, threads=max(1, usable_cpus() // self.config.engine.parallel))
        return Engine(path, settings, log=self._log, cache=self.prefix_cache,
                      cache_min_tokens=self.config.cache.min_tokens,
                      boundary_states=self.config.cache.boundary_states)

    @once
    def _pool(self) -> EnginePool:
        """The engines answering questions: ``engine`` and, with ``engine.parallel`` > 1, more as
        concurrent questions need them (never for an injected or a remote generator: servers
        run their own slots)."""
        from .engine.remote.client import is_remote

        local = "engine" not in self._given and not is_remote(self.config.models.generator)
        size = self.config.engine.parallel if local else 1
        return EnginePool(lambda: self.engine, self._new_engine, size)

    @once
    def stops(self):
        """The default stops (a :class:`~.stops.Stops`): the chat template's turn markers and the new-turn guard."""
        from .ask.stops import template_stops

        return template_stops(self.engine)

    @property
    def section_tokens(self) -> int:
        """The size new documents' sections are cut to, in embedder tokens (``chunking.section_tokens``,
        else a quarter of the generator's context; see :mod:`.ingest.sections`)."""
        from .engine.local import Engine
        from .errors import RagError
        from .ingest.sections import target_tokens

        c = self.config
        if c.chunking.section_tokens:
            return c.chunking.section_tokens
        if "engine" in self.__dict__:
            n_ctx = self.engine.n_ctx
        else:  # the context the generator will run with, read from its header if it is here already
            n_ctx = c.engine.n_ctx or 8192
            try:
                path = models.resolve(c.models.generator, home=c.home_path, fetch=False, what="generator")
                n_ctx = Engine(path, c.engine).n_ctx
            except RagError:
                pass
        return target_tokens(n_ctx, chunk_size=c.chunking.size)

    @once
    def _layout(self):
        return self._layout_for(self.config.ask.system_prompt)

    def _layout_for(self, system: str):
        """The prompt layout with ``system`` as its system prompt (made once per system prompt)."""
        from .ask.prompt import Layout

        layouts = self.__dict__.setdefault("_layouts", {})
        if system not in layouts:
            engine = self.engine
            layouts[system] = Layout.make(chat=engine.chat, tokenize=engine.tokenize, bos=engine.bos, system=system)
        return layouts[system]

    @once
    def _section_tokens(self):
        from .ask.packing import SectionTokens

        return SectionTokens(self.engine.tokenize)

    @once
    def pack_history(self):
        """The packs recent questions used (beside the prefix cache; in memory when it is off)."""
        from .ask.packing import PackHistory

        return PackHistory(self.config.cache_path / "packs.sqlite" if self.config.cache.enabled else None)

    def engine_settings(self, model_path: Path):
        """The engine settings: the configuration, with a ``rag tune`` profile over the keys left at default."""
        from .profiles import tuned_engine

        settings = self.config.engine
        if not settings.tuned:
            return settings
        from .engine.gguf.info import ModelInfo

        n_ctx = ModelInfo.read(model_path).context_length(settings.n_ctx, settings.rope_scaling)
        settings, changes, note = tuned_engine(settings, self.config.home_path, model_path, n_ctx)
        if self._log and (changes or note):
            self._log("warning: " + note if note else
                      "using tuned settings: " + ", ".join(f"{k}={v}" for k, v in sorted(changes.items())))
        return settings

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
        import math

        from .errors import ConfigError
        from .planner import plan as plan_mod
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
        for name, value in (("--vram", vram_gb), ("--ram", ram_gb)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number of GiB, got {value:g}")
        if vram_gb is not None:
            if not hw.has_gpu:
                raise ConfigError(f"--vram {vram_gb:g} is a GPU budget, but the hardware profile {hw.name!r} has no "
                                  "GPU: name one with --gpu (rtx3090, h100, ...), or drop --vram for a CPU plan")
            hw = dataclasses.replace(hw, vram=int(vram_gb * 2**30))
        if ram_gb is not None:
            hw = dataclasses.replace(hw, ram=int(ram_gb * 2**30))
        n_ctx = n_ctx or self.config.engine.n_ctx or spec.n_ctx_train
        kv_types = ("f16", "q8_0", "q4_0") if kv == "auto" else (kv or self.config.engine.type_k)
        best = plan_mod.plan(spec, hw, n_ctx=n_ctx, kv_types=kv_types, n_batch=n_batch, n_ubatch=n_ubatch)
        fit = plan_mod.fit_like(spec, hw, n_ctx=n_ctx, kv=best.settings.type_k)
        rows = plan_mod.compare(spec, hw, n_ctx=n_ctx) if compare else None
        return {"plan": best, "fit": fit, "hardware": hw, "compare": rows}

    def tune(self, *, max_seconds: float = 120.0, n_tokens: int | None = None, measure_hardware: bool = False,
             progress=None):
        """Measure candidate settings on this machine, save the fastest as this model's profile.

        Returns ``(TuneResult, profile path)``; later ``ask`` calls pick the profile up.
        """
        from . import profiles
        from .planner import hardware as hw_mod
        from .planner import tune as tune_mod

        path = models.resolve(self.config.models.generator, home=self.config.home_path, what="generator",
                              log=self._log)
        hw = self.hardware()
        result = tune_mod.tune(path, engine_settings=self.config.engine, hardware=hw, n_ctx=self.config.engine.n_ctx,
                               max_seconds=max_seconds, n_tokens=n_tokens, progress=progress,
                               measure_hardware=measure_hardware)
        target = profiles.write_profile(
            result.profile_text(), profiles.profile_path(self.config.home_path, models.file_identity(path),
                                                         result.n_ctx))
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

    @once
    def prefix_cache(self):
        """The on-disk prefix KV cache, or None when ``cache.enabled`` is off."""
        if not self.config.cache.enabled:
            return None
        from .engine.cache.store import PrefixCache

        return PrefixCache(self.config.cache_path, max_bytes=int(self.config.cache.max_gb * 2**30))

    @contextmanager
    def store(self, *, create: bool = True) -> Iterator[Store]:
        """The collection's store, open and locked for the duration of the ``with`` block.

        ``create=False`` (every read) refuses to open a store that does not exist yet. The
        threads of this pipeline share one open store and one process lock, so searches go
        on while this pipeline ingests; another process waits ``store.wait`` seconds.
        """
        with self._stores.open(self.config.store.collection, create=create) as s:
            yield s

    def _check_embedder(self, store: Store) -> None:
        """Dense search with another embedder than the collection's would compare unrelated vectors."""
        if self.config.retrieval.dense:
            store.check_embedder(embedder=self.config.models.embedder, embedder_id=self.embedder.identity)

    def pull_models(self) -> dict[str, str]:
        """Provision the configured models (download, convert) and return their local paths."""
        out = {}
        for role in ("embedder", "generator"):
            ref = getattr(self.config.models, role)
            if ref.startswith("openai:"):
                out[role] = models.redact(ref) + "  (a server: nothing to pull)"
                continue
            out[role] = str(models.resolve(ref, home=self.config.home_path, what=role, log=self._log))
        return out

    # -- operations ---------------------------------------------------------------------------

    def ingest(self, paths: Iterable[str | Path], *, prune: bool = False, include: Iterable[str] = (),
               exclude: Iterable[str] = (), follow_symlinks: bool | None = None,
               progress: Progress | None = None) -> IngestReport:
        """Embed new and changed files under ``paths`` into the collection (see :func:`.ingest.ingest`).

        ``include``/``exclude`` are shell-style globs matched against file names (or against
        paths relative to the folder, for a glob with a ``/``); ``follow_symlinks`` (default:
        ``ingest.follow_symlinks``) also follows links that leave the folder.
        """
        i = self.config.ingest
        follow = i.follow_symlinks if follow_symlinks is None else follow_symlinks
        # A missing path fails before any model loads or the store opens.
        scanned = scan(paths, include=tuple(include), exclude=tuple(exclude), follow_symlinks=follow)
        with self.store() as store:
            c = self.config.chunking
            ref = None if "embedder" in self._given else self.config.models.embedder
            expand = None
            if c.doc2query:
                from .retrieval.expansion import Doc2QueryChunker

                expand = lambda chunker: Doc2QueryChunker(chunker, self.engine, n=c.doc2query)  # noqa: E731
            return ingest(scanned, store=store, embedder=self.embedder, chunk_size=c.size,
                          chunk_overlap=c.overlap, section_tokens=self.section_tokens,
                          embedder_ref=ref, prune=prune, max_bytes=int(i.max_file_mb * 2**20),
                          contextual=c.contextual, expand_chunker=expand, progress=progress)

    def search(self, query: str, *, top_k: int | None = None,
               timings: dict[str, float] | None = None) -> list[Hit]:
        """The best chunks for ``query`` by hybrid retrieval and reranking.

        ``timings``, when given, receives seconds per stage (embed_query, dense, lexical, fuse, rerank).
        """
        from .errors import InputError

        if not query.strip():
            raise InputError("the query is empty")
        with self.store(create=False) as store:
            store.require()
            self._check_embedder(store)
            return self._search(store, query, top_k=top_k or self.config.retrieval.top_k, timings=timings)

    def _search(self, store: Store, query: str, *, top_k: int, source: str | None = None,
                use_mmr: bool = False, timings: dict[str, float] | None = None, **changes) -> list[Hit]:
        """Retrieval as configured (``changes`` override retrieval settings: dense, lexical, rerank)."""
        import dataclasses

        from .retrieval.fusion import AdaptiveFusion
        from .retrieval.rerank import make_reranker

        r = dataclasses.replace(self.config.retrieval, **changes) if changes else self.config.retrieval
        if r.dense:
            self.embedder.dim  # loads the model outside the timed stages
        reranker = make_reranker(r.rerank, candidates=max(r.rerank_candidates, top_k),
                                 dense_weight=r.rerank_dense_weight, normalise=r.rerank_normalise)
        fusion = AdaptiveFusion(r.lexical_floor, r.lexical_full) if r.fusion == "adaptive" else None
        dense_query = None
        if r.hyde and r.dense:
            import time

            from .retrieval.expansion import hyde_query, hypothetical_passage

            started = time.perf_counter()
            passage = hypothetical_passage(self._pool.pick(), query, max_tokens=r.hyde_tokens)
            dense_query = hyde_query(query, passage)
            if timings is not None:
                timings["hyde"] = timings.get("hyde", 0.0) + time.perf_counter() - started
        return search(query, store=store, embedder=self.embedder if r.dense else None, top_k=top_k,
                      dense=r.dense, lexical=r.lexical, candidates=max(r.candidates, top_k), rrf_k=r.rrf_k,
                      source=source, use_mmr=use_mmr, mmr_lambda=self.config.ask.mmr_lambda,
                      rerank=reranker, fusion=fusion, dense_query=dense_query, timings=timings)

    def evaluate(self, questions: "str | Path | Sequence[Question]", *,
                 settings: "Sequence[str] | None" = None, answers: bool = False, packed: bool = False,
                 label: str = "", progress: Callable[[str, int], None] | None = None) -> "EvalReport":
        """Run a question set through each retrieval setting (see :mod:`.evaluate`).

        ``questions`` is a JSONL path or loaded questions; ``settings`` names entries of
        :data:`.evaluate.SETTINGS` (default: dense, lexical, hybrid, hybrid+rerank, adaptive+rerank). With
        ``answers``, each question is also answered and checked (slow: one generation each).
        With ``packed``, each question's prompt is built as ``rag ask`` builds it for a first
        question (no earlier packs preferred) and checked for the answer's page (no generation;
        the generator's tokenizer loads).
        """
        from .retrieval import evaluate as ev

        qs = ev.load_questions(questions) if isinstance(questions, (str, Path)) else list(questions)
        names = tuple(settings or ev.DEFAULT_SETTINGS)
        with self.store(create=False) as store:
            store.require()
            self._check_embedder(store)
            missing = ev.unreachable(qs, store)
            if any(ev.SETTINGS.get(n, {}).get("dense") for n in names):
                self.embedder.embed(["warm-up"])  # the model load is not query latency

            def one(question: str, name: str):
                changes = dict(ev.SETTINGS[name])
                mmr = changes.pop("mmr", False)
                seconds: dict[str, float] = {}
                hits = self._search(store, question, top_k=ev.DEPTH, use_mmr=mmr, timings=seconds, **changes)
                return hits, seconds

            report = ev.run(qs, one, settings=names, label=label, progress=progress)
        report.unreachable = missing
        if packed:
            from .ask.flow import build_prompt

            report.packed = []
            for q in qs:
                prompt, _, _ = build_prompt(self, q.question, doc=None, source=None, mode=None, top_k=None,
                                            remember=False)
                report.packed.append(ev.in_prompt(q, prompt))
        if answers:
            report.answers = []
            for q in qs:
                answer = self.ask(q.question)
                report.answers.append(ev.check_answer(q, answer.text, answer.sources))
        return report

    def eval_template(self, *, per_document: int = 5) -> list[dict]:
        """Starter lines for a question set over this collection (see :func:`.evaluate.template`)."""
        from .retrieval.evaluate import template

        with self.store(create=False) as store:
            store.require()
            return template(store, per_document=per_document)

    def ask(self, question: str, *, doc: Paths = None, source: Paths = None, mode: str | None = None,
            top_k: int | None = None, temperature: float | None = None, max_tokens: int | None = None,
            system_prompt: str | None = None, stop: str | Sequence[str] | None = None,
            cancel: CancelToken | None = None, progress: "Callable[[PrefillProgress], None] | None" = None
            ) -> Answer:
        """Answer ``question`` from the collection, or from the documents ``doc`` and those under ``source``.

        ``mode`` (default ``ask.mode``): "auto" packs every selected document whole when they
        fit the context, else the best fixed sections, in canonical order so that questions
        share their prompt's prefix; "passages" packs retrieved passages. The packing used,
        the tokens reused and why some were not are in ``Answer.stats`` (:class:`AskStats`).

        Options left at None come from ``[ask]`` (see :class:`~.options.AskOptions`); ``stop``
        strings are added to the defaults (the chat template's turn markers, a guard against
        invented "Question:" turns). ``cancel`` stops the call from another thread
        (:class:`~pipeline.errors.Cancelled`); ``progress`` receives a
        :class:`~.progress.PrefillProgress` after each prefilled piece. Safe to call from many
        threads (see :mod:`.concurrency`).
        """
        with self.ask_stream(question, doc=doc, source=source, mode=mode, top_k=top_k, temperature=temperature,
                             max_tokens=max_tokens, system_prompt=system_prompt, stop=stop, cancel=cancel,
                             progress=progress) as stream:
            return stream.result()

    def ask_stream(self, question: str, *, doc: Paths = None, source: Paths = None, mode: str | None = None,
                   top_k: int | None = None, temperature: float | None = None, max_tokens: int | None = None,
                   system_prompt: str | None = None, stop: str | Sequence[str] | None = None,
                   cancel: CancelToken | None = None, progress: "Callable[[PrefillProgress], None] | None" = None,
                   history: Sequence[dict] | None = None) -> AnswerStream:
        """Like :meth:`ask`, streaming: iterate the result for text pieces as they are generated.

        Retrieval and packing happen here, beside any running generation; the engine is
        taken when iteration starts (see :class:`AnswerStream`). ``history`` (earlier
        ``{"role": "user" | "assistant", "content": ...}`` turns) makes it a follow-up: see :meth:`chat`.
        """
        return asking.ask_stream(self, question, doc=doc, source=source, mode=mode, top_k=top_k,
                                 temperature=temperature, max_tokens=max_tokens, system_prompt=system_prompt,
                                 stop=stop, cancel=cancel, progress=progress, history=history)

    def ask_many(self, questions: Sequence[str], *, doc: Paths = None, source: Paths = None,
                 max_tokens: int | None = None, system_prompt: str | None = None) -> list[Answer]:
        """Answer several questions at once: those whose prompts share their prefix (the same packed
        documents) are decoded together in one context (:meth:`~.engine.local.Engine.generate_many`,
        ``engine.n_seq_max`` sequences per decode), the others one after another. Greedy answers
        are those of :meth:`ask`; this is what a server batching concurrent questions calls."""
        return asking.ask_many(self, questions, doc=doc, source=source, max_tokens=max_tokens,
                               system_prompt=system_prompt)

    # -- conversations (see .chat) ------------------------------------------------------------

    def chat(self, question: str, *, chat_id: str | None = None, history: Sequence[dict] | None = None,
             **options: Any) -> Answer:
        """Answer a follow-up in a conversation: ``chat_id`` keeps the turns on disk (``chats/`` in the
        store directory), or pass ``history`` yourself. Retrieval uses a condensed standalone query;
        earlier turns sit after the documents, so the documents' prefix stays cached from turn to
        turn. Other options as for :meth:`ask`."""
        with self.chat_stream(question, chat_id=chat_id, history=history, **options) as stream:
            return stream.result()

    def chat_stream(self, question: str, *, chat_id: str | None = None, history: Sequence[dict] | None = None,
                    **options: Any) -> AnswerStream:
        """:meth:`chat`, streaming. With ``chat_id``, the turn is saved once the answer is complete."""
        return asking.chat_stream(self, question, chat_id=chat_id, history=history, **options)

    # -- asyncio (see .aio) -------------------------------------------------------------------

    async def aask(self, question: str, **options: Any) -> Answer:
        """:meth:`ask` for asyncio: the loop never blocks; cancelling the task cancels the call."""
        from .ask.aio import aask

        return await aask(self, question, **options)

    def aask_stream(self, question: str, **options: Any) -> "AsyncAnswerStream":
        """:meth:`ask_stream` for asyncio: ``async for piece in rag.aask_stream(q)``, then ``.answer``."""
        from .ask.aio import AsyncAnswerStream

        return AsyncAnswerStream(lambda cancel: self.ask_stream(question, cancel=cancel, **options))

    async def asearch(self, query: str, **options: Any) -> list[Hit]:
        """:meth:`search` in a worker thread (it never waits for the engine)."""
        import asyncio

        return await asyncio.to_thread(self.search, query, **options)

    def _prompt(self, question: str, **options: Any
                ) -> "tuple[Prompt, list[str], Callable[[AskStats], None] | None]":
        """The packed prompt for ``question`` and its notes (:func:`.asking.build_prompt`)."""
        return asking.build_prompt(self, question, **options)

    def _reserve(self, max_tokens: int | None = None) -> int:
        """The answer room every layout decision holds back (:func:`.packing.layout_reserve`)."""
        from .ask.packing import layout_reserve

        c = self.config
        return layout_reserve(self.engine.n_ctx, c.ask.max_tokens, c.summarize.max_tokens, max_tokens)

    def warm(self, *, progress: Callable[[str, str], None] | None = None, purpose: str = "ask") -> dict:
        """Prefill and save the prefixes the next prompts will hit, with states at their boundaries.

        When the collection fits the context whole, ``purpose`` chooses: "ask" (default) its
        whole prefix, what every question over it starts from; "summarize" each document's
        own prefix, what its summaries and ``ask --doc`` start from; "all" both. Otherwise each
        document's leading sections (as many as fit), which serve both. Returns ``{"mode":
        "whole" | "sections", "purpose", "prefixes": [...], "prefilled_tokens", "bytes_written"}``,
        one item per prefix with its documents, sections, tokens, the tokens prefilled for it,
        the bytes of the states written and its outcome: "saved", "cached" (already there),
        "too short" (under ``cache.min_tokens``) or "too long" (not even one section fits).
        """
        from .ask import packing
        from .errors import ConfigError

        if purpose not in packing.WARM_PURPOSES:
            raise ConfigError(f"warm is for one of {', '.join(packing.WARM_PURPOSES)}, got {purpose!r}")
        cache = self.prefix_cache
        if cache is None:
            raise ConfigError("the prefix cache is off (cache.enabled = false): nothing to warm")
        if cache.unavailable or cache.read_only:
            raise ConfigError(f"the prefix cache cannot save states: "
                              f"{cache.unavailable or f'{cache.directory} is read-only'}")
        engine = self.engine
        with self.store(create=False) as store:
            store.require()
            shelf = packing.gather(store, sources=None, target=self.section_tokens, fetch_tokens=2**62)
        mode, plans = packing.warm_plans(shelf, layout=self._layout, tokenize=engine.tokenize,
                                         memo=self._section_tokens, n_ctx=engine.n_ctx, reserve=self._reserve(),
                                         purpose=purpose)
        items = []
        for name, prompt in plans:
            prefilled = written = 0
            if prompt is None:
                outcome = "too long"
            elif len(prompt.prefix_tokens) < self.config.cache.min_tokens:
                outcome = "too short"
            else:
                reused = engine.reusable(prompt.tokens, prefix_len=len(prompt.prefix_tokens),
                                         boundaries=prompt.boundaries)
                before = {e.id for e in cache.entries(engine.namespace)}
                outcome = "saved" if engine.warm(prompt.prefix_tokens, boundaries=prompt.boundaries) else "cached"
                written = sum(e.bytes for e in cache.entries(engine.namespace) if e.id not in before)
                prefilled = len(prompt.prefix_tokens) - reused if outcome == "saved" else 0
                self.pack_history.record(engine.namespace, shelf.collection, [p.section.key for p in prompt.sections])
            items.append({"prefix": name, "documents": len({p.section.source for p in prompt.sections}) if prompt else 0,
                          "sections": len(prompt.sections) if prompt else 0,
                          "tokens": len(prompt.prefix_tokens) if prompt else 0, "prefilled": prefilled,
                          "bytes": written, "outcome": outcome})
            if progress:
                progress(name, outcome)
        return {"mode": mode, "purpose": purpose, "prefixes": items,
                "prefilled_tokens": sum(i["prefilled"] for i in items), "bytes_written": sum(i["bytes"] for i in items)}

    # -- batch summaries (rag summarize) ------------------------------------------------------

    def summarize(self, paths: Iterable[str | Path] | None = None, *, prompts: Sequence[str] | None = None,
                  max_tokens: int | None = None, restart: bool = False, out_dir: str | Path | None = None,
                  jsonl: str | Path | None = None, progress: "Callable[[SummaryEvent], None] | None" = None
                  ) -> "SummaryRun":
        """Summarise documents, resumably: iterate the result for :class:`~.summary.Summary` objects as they finish.

        ``paths`` (files or folders) are ingested first where new or changed; with none,
        the whole collection is summarised. Each prompt (default ``summarize.prompt``)
        gives one summary per document. Finished work is kept in the store's job
        database, so the same call after an interruption does only what is left
        (``restart`` discards it first). ``out_dir`` gets one Markdown file per document
        and prompt, ``jsonl`` one JSON line per summary; ``report`` on the result has
        the totals once iteration ends.
        """
        from .summarize.job import SummaryRun

        return SummaryRun(lambda: self._summary_job(paths, prompts=prompts, max_tokens=max_tokens, ingest_first=True),
                          restart=restart, out_dir=out_dir, jsonl=jsonl, progress=progress)

    def summary_status(self, paths: Iterable[str | Path] | None = None, *, prompts: Sequence[str] | None = None,
                       max_tokens: int | None = None) -> dict:
        """How far the job that ``summarize`` with these arguments would run has got; changes nothing."""
        job, jobs, failed, _ = self._summary_job(paths, prompts=prompts, max_tokens=max_tokens, ingest_first=False)
        with jobs:
            status = job.status()
        status["not_ingested"] = [f["source"] for f in failed]
        return status

    def _summary_job(self, paths, *, prompts, max_tokens, ingest_first: bool):
        from .summarize.jobstore import JobStore
        from .summarize.job import Job, Settings

        m, failed, skipped = self.config.summarize, [], []
        prompts = list(prompts) if prompts else [m.prompt]
        if not all(p.strip() for p in prompts):
            from .errors import InputError

            raise InputError("a prompt is empty")
        wanted: list[str] | None = None
        if paths is not None and list(paths):
            paths = list(paths)
            if ingest_first:
                report = self.ingest(paths)
                # report paths are the documents' sources (absolute, as found)
                wanted = [f.path for f in report.files if f.status in ("new", "changed", "unchanged")]
                failed = [{"source": f.path, "error": f.reason or f.status}
                          for f in report.files if f.status == "failed"]
                skipped = [{"source": f.path, "error": f.reason or f.status}
                           for f in report.files if f.status == "skipped"]
            else:
                wanted = [str(f.path) for f in scan(paths).files]
        with self.store(create=False) as store:
            store.require()
            known = store.documents()
            if wanted is None:
                if not known:
                    from .errors import StoreError

                    raise StoreError(f"collection '{store.name}' is empty; run `rag ingest PATH` first")
                documents = list(known.values())
            else:
                documents = [known[s] for s in wanted if s in known]
                if not ingest_first:
                    failed = [{"source": s, "error": "not ingested"} for s in wanted if s not in known]
        s = self.engine.settings
        settings = Settings(max_tokens=max_tokens or m.max_tokens, temperature=m.temperature,
                            repeat_penalty=m.repeat_penalty, seed=s.seed, system=self.config.ask.system_prompt,
                            reserve=self._reserve(max_tokens))
        if self.config.store.catalog_url:  # job state lives with the shared catalog
            from .summarize.jobstore_pg import PostgresJobStore

            jobs = PostgresJobStore(self.config.store.catalog_url)
        else:
            jobs = JobStore(self.config.store_path / "jobs.sqlite")
        job = Job(engine=self.engine, jobs=jobs, open_store=self.store, collection=self.config.store.collection,
                  documents=documents, prompts=prompts, settings=settings, section_target=self.section_tokens,
                  memo=self._section_tokens,
                  record=lambda keys: self.pack_history.record(self.engine.namespace, self.config.store.collection,
                                                                keys))
        return job, jobs, failed, skipped

    def status(self) -> CollectionStatus:
        """What the collection holds; never creates anything."""
        path = self.config.store_path
        name = self.config.store.collection
        if not self.config.store.catalog_url and not (path / "catalog.sqlite").exists():
            return CollectionStatus(collection=name, store=str(path), exists=False,
                                    generator=models.redact(self.config.models.generator))
        with self.store(create=False) as store:
            info = store.info
            if info is None:
                return CollectionStatus(collection=name, store=store.where, exists=False,
                                        collections=tuple(store.catalog.collections()),
                                        generator=models.redact(self.config.models.generator))
            docs, chunks, tokens = store.catalog.totals(name)
            sources = tuple(
                {"source": r.source, "format": r.format, "chunks": r.n_chunks, "tokens": r.n_tokens,
                 "pages": r.pages, "title": r.title}
                for r in sorted(store.documents().values(), key=lambda r: r.source))
            return CollectionStatus(
                collection=name, store=store.where, exists=True, documents=docs, chunks=chunks,
                tokens=tokens, dense_chunks=store.chunk_count(), embedder=info.embedder, dim=info.dim,
                chunk_size=info.chunk_size, chunk_overlap=info.chunk_overlap,
                collections=tuple(store.catalog.collections()), generator=models.redact(self.config.models.generator),
                sources=sources)

    def drop(self) -> bool:
        """Delete the collection; False if it did not exist."""
        if not self.config.store.catalog_url and not (self.config.store_path / "catalog.sqlite").exists():
            return False
        with self.store(create=False) as store:
            if store.info is None:
                return False
            store.drop()
            return True

    def close(self) -> None:
        pool = self.__dict__.pop("_pool", None)
        if pool is not None:
            pool.close_extra()
        for name in ("embedder", "engine", "prefix_cache", "pack_history"):
            resource = self.__dict__.pop(name, None)
            if resource is not None and name not in self._given:
                resource.close()
        self._given.clear()
        self._stores.close()  # the PostgreSQL connections, when this was the last pipeline using them

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
