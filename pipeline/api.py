"""``Pipeline``: the public Python API. The CLI is a thin layer over it.

A pipeline holds a :class:`~.runtime.Runtime` (settings and lazily loaded models,
engines, caches); it opens the store (and so takes the store's process lock) only for
the duration of each call, so a long-lived application does not block ``rag`` commands
between calls. Each method is one operation, carried out where it belongs:
:mod:`.ask` (answers), :mod:`.warm` (states saved ahead of questions), :mod:`.retrieval` (search, evaluation),
:mod:`.summarize`, :mod:`.collection` (ingest, status, drop), :mod:`.tuning.front`.

A pipeline is safe to share between threads: see :mod:`.engine.pool` for what runs
at the same time (retrieval beside generation, generation one prompt at a time per
engine, first come first served) and how calls are cancelled.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Sequence

from .ask.answer import Answer, AnswerStream
from .ask.request import AskRequest, Paths
from .engine.context_lock import CancelToken
from .config import Config, load_config
from .engine.once import Later
from .runtime import Runtime

collection = Later(".collection", __package__)  # imported when first used
flow = Later(".ask.flow", __package__)

if TYPE_CHECKING:
    from .collection import CollectionStatus
    from .ask.aio import AsyncAnswerStream
    from .ask.progress import PrefillProgress
    from .ask.stops import Stops
    from .engine.contract import TextEmbedder, TextGenerator
    from .ingest.run import IngestReport, Progress
    from .retrieval.evaluate import EvalReport, Question
    from .store.store import Store
    from .summarize.outputs import SummaryEvent
    from .summarize.run import SummaryRun
    from .warm.progress import WarmProgress
    from .records import Hit, Prompt

__all__ = ["CollectionStatus", "Pipeline"]


def __getattr__(name: str):
    if name == "CollectionStatus":
        from .collection import CollectionStatus

        return CollectionStatus
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Pipeline:
    """Ingest, search and ask over one collection, with settings from :mod:`.config`.

    The embedder and the generator are the configured llama.cpp models, loaded on first
    use, unless ``embedder`` or ``generator`` is given: any object that fulfils
    :class:`~pipeline.engine.contract.TextEmbedder` / :class:`~pipeline.engine.contract.TextGenerator`
    (the tests' fakes, a remote backend). The pipeline closes only what it made.
    """

    def __init__(self, config: Config, *, log: Callable[[str], None] | None = None,
                 embedder: "TextEmbedder | None" = None, generator: "TextGenerator | None" = None):
        self.runtime = Runtime(config, log=log, embedder=embedder, generator=generator)

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

    # -- what it holds (see .runtime) ---------------------------------------------------------

    @property
    def config(self) -> Config:
        return self.runtime.config

    @property
    def embedder(self) -> "TextEmbedder":
        """The embedder (loaded on first use)."""
        return self.runtime.embedder

    @property
    def engine(self) -> "TextGenerator":
        """The generator (loaded on first use)."""
        return self.runtime.engine

    @property
    def stops(self) -> "Stops":
        """The default stops: the chat template's turn markers and the new-turn guard."""
        return self.runtime.stops

    @property
    def prefix_cache(self):
        """The on-disk prefix KV cache, or None when ``cache.enabled`` is off."""
        return self.runtime.prefix_cache

    @property
    def ram_states(self):
        """Boundary states kept in host memory for the engines (models that cannot cut their memory)."""
        return self.runtime.ram_states

    @property
    def pack_history(self):
        """The packs recent questions used (see :mod:`.ask.history`)."""
        return self.runtime.pack_history

    @property
    def section_tokens(self) -> int:
        """The size new documents' sections are cut to, in embedder tokens (see :mod:`.ingest.sections`)."""
        return self.runtime.section_tokens

    def engine_settings(self, model_path: Path):
        """The engine settings: the configuration, with a ``rag tune`` profile over the keys left at default."""
        return self.runtime.engine_settings(model_path)

    @contextmanager
    def store(self, *, create: bool = True) -> Iterator["Store"]:
        """The collection's store, open and locked for the duration of the ``with`` block
        (``create=False``: an existing store only; see :meth:`.runtime.Runtime.store`)."""
        with self.runtime.store(create=create) as s:
            yield s

    def preload(self) -> None:
        """Start loading the generator's model now, in the background, so that it loads while the rest
        of a question's work goes on (what ``rag ask`` does as it starts; an application may call it at
        start-up). The model file is found (and fetched, if it must be) in the calling thread, which
        goes on once llama.cpp has begun loading it (a fraction of a second); nothing happens for a
        remote or given generator, a model already loaded, or where no store exists yet. Questions
        asked meanwhile wait for that one load; :meth:`close` waits for it too."""
        c = self.config.store
        if not c.catalog_url and not (self.config.store_path / "catalog.sqlite").exists():
            return  # nothing to answer from: the question fails fast, without loading a model first
        self.runtime.load_generator_soon(build=True)

    # -- models and tuning --------------------------------------------------------------------

    def pull_models(self) -> dict[str, str]:
        """Provision the configured models (download, convert) and return their local paths."""
        from . import models

        m = self.config.models
        return models.pull({"embedder": m.embedder, "generator": m.generator}, home=self.config.home_path,
                           log=self.runtime.log)

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
        from .tuning import front

        return front.choose_settings(self.config, model, builtin_spec=builtin_spec, quant=quant, hardware_profile=hardware,
                          vram_gb=vram_gb, ram_gb=ram_gb, n_ctx=n_ctx, kv=kv, n_batch=n_batch, n_ubatch=n_ubatch,
                          compare=compare, log=self.runtime.log)

    def tune(self, *, max_seconds: float = 120.0, n_tokens: int | None = None, measure_hardware: bool = False,
             progress=None):
        """Measure candidate settings on this machine, save the fastest as this model's profile.

        Returns ``(TuneResult, profile path)``; later ``ask`` calls pick the profile up.
        """
        from .tuning import front

        return front.tune(self.config, max_seconds=max_seconds, n_tokens=n_tokens,
                          measure_hardware=measure_hardware, progress=progress, log=self.runtime.log)

    def hardware(self, profile: str | Path | None = None):
        """A hardware profile: a built-in name or a TOML file; by default the one ``rag tune
        --measure-hardware`` saved in the home, else the CPU profile with this machine's RAM."""
        from .tuning import front

        return front.hardware(self.config, profile)

    # -- the collection (see .collection) -----------------------------------------------------

    def ingest(self, paths: Iterable[str | Path], *, prune: bool = False, include: Iterable[str] = (),
               exclude: Iterable[str] = (), follow_symlinks: bool | None = None,
               progress: "Progress | None" = None, warm: bool | None = None) -> "IngestReport":
        """Embed new and changed files under ``paths`` into the collection (see :func:`.ingest.run.ingest`),
        then start warming as ``ingest.warm`` says (``warm`` True/False: "on"/"off" for this call), exactly
        as ``rag ingest`` and ``rag serve`` do (:mod:`.warm.job`).

        ``include``/``exclude`` are shell-style globs matched against file names (or against
        paths relative to the folder, for a glob with a ``/``); ``follow_symlinks`` (default:
        ``ingest.follow_symlinks``) also follows links that leave the folder.

        Warming runs in the background: the report's ``warming`` (a :class:`~.warm.job.WarmJob`, None when
        off) shows its progress, and ``report.warming.wait()`` its outcome; a question asked meanwhile runs
        first. Wait for it where the first question should be composed from the states it saves. A warming
        still running is cancelled by the next ingest and by :meth:`close` (what it saved is kept).
        """
        from .warm.job import after_ingest

        self.runtime.stop_warming()  # this ingest first: the states saved so far are kept
        report = collection.ingest(self.runtime, paths, prune=prune, include=include, exclude=exclude,
                                   follow_symlinks=follow_symlinks, progress=progress)
        setting = self.config.ingest.warm if warm is None else ("on" if warm else "off")
        if not (report.nothing_read or report.nothing_found):
            report.warming = self.runtime.start_warming(lambda: after_ingest(self.runtime, setting))
        return report

    @property
    def warming(self):
        """The warming the last :meth:`ingest` started (a :class:`~.warm.job.WarmJob`), or None."""
        return self.runtime.warming

    def status(self) -> CollectionStatus:
        """What the collection holds; never creates anything."""
        return collection.status(self.runtime)

    def drop(self) -> bool:
        """Delete the collection; False if it did not exist."""
        return collection.drop(self.runtime)

    def collections(self) -> list[dict]:
        """Every collection of the store: ``{"name", "documents", "chunks"}``, by name; never creates anything."""
        return collection.collections(self.runtime)

    def for_collection(self, name: str) -> "Pipeline":
        """A pipeline over the store's collection ``name`` sharing this one's models, engines, caches, warming
        and open store (:class:`~.collection.SiblingRuntime`); closing it closes nothing they share. Use it
        while this one is open."""
        other = object.__new__(Pipeline)
        other.runtime = collection.SiblingRuntime(self.runtime, name)
        return other

    def sections(self) -> "collection.SectionsReport":
        """How the collection's documents are cut into sections (the units prompts are packed from),
        against the size the settings cut new documents to (:attr:`section_tokens`)."""
        return collection.sections(self.runtime)

    def recut_sections(self, *, progress: Callable[[int, int], None] | None = None) -> "collection.SectionsReport":
        """Cut again, from the stored chunks, every document whose sections have another size than
        the settings' (after a change of ``chunking.section_tokens``, of the generator's context, or of
        the default); nothing is embedded. Prompts over the new sections prefill again once.
        ``progress(done, total)`` follows the documents."""
        return collection.sections(self.runtime, recut=True, progress=progress)

    # -- retrieval (see .retrieval) -----------------------------------------------------------

    def search(self, query: str, *, top_k: int | None = None,
               timings: dict[str, float] | None = None) -> list["Hit"]:
        """The best chunks for ``query`` by hybrid retrieval and reranking.

        ``timings``, when given, receives seconds per stage (embed_query, dense, lexical, fuse, rerank).
        """
        from .retrieval.search import search_collection

        return search_collection(self.runtime, query, top_k=top_k, timings=timings)

    async def asearch(self, query: str, **options: Any) -> list["Hit"]:
        """:meth:`search` in a worker thread (it never waits for the engine)."""
        import asyncio

        return await asyncio.to_thread(self.search, query, **options)

    def evaluate(self, questions: "str | Path | Sequence[Question]", *,
                 settings: "Sequence[str] | None" = None, answers: bool = False, packed: bool = False,
                 label: str = "", progress: Callable[[str, int], None] | None = None) -> "EvalReport":
        """Run a question set through each retrieval setting (see :mod:`.retrieval.evaluate`).

        ``questions`` is a JSONL path or loaded questions; ``settings`` names entries of
        :data:`.retrieval.evaluate.SETTINGS` (default: dense, lexical, hybrid, hybrid+rerank,
        adaptive+rerank). With
        ``answers``, each question is also answered and checked (slow: one generation each).
        With ``packed``, each question's prompt is built as ``rag ask`` builds it for a first
        question (no earlier packs preferred) and checked for the answer's page (no generation;
        the generator's tokenizer loads).
        """
        from .retrieval.evaluate import evaluate

        def prompt(question: str) -> "Prompt":
            from .ask.flow import build_prompt
            from .ask.request import AskRequest

            return build_prompt(self.runtime, AskRequest(question), remember=False).prompt

        return evaluate(self.runtime, questions, settings=settings, answer=self.ask if answers else None,
                        prompt=prompt if packed else None, label=label, progress=progress)

    def eval_template(self, *, per_document: int = 5) -> list[dict]:
        """Starter lines for a question set over this collection (see :func:`.retrieval.evaluate.template`)."""
        from .retrieval.evaluate import collection_template

        return collection_template(self.runtime, per_document=per_document)

    # -- answers (see .ask) -------------------------------------------------------------------

    def ask(self, question: "str | AskRequest", *, doc: Paths = None, source: Paths = None,
            mode: str | None = None, top_k: int | None = None, temperature: float | None = None,
            max_tokens: int | None = None, system_prompt: str | None = None, stop: str | Sequence[str] | None = None,
            cancel: CancelToken | None = None, progress: "Callable[[PrefillProgress], None] | None" = None
            ) -> Answer:
        """Answer ``question`` from the collection, or from the documents ``doc`` and those under ``source``.

        ``mode`` (default ``ask.mode``): "auto" packs every selected document whole when they
        fit the context, else the best fixed sections, in canonical order so that questions
        share their prompt's prefix; "passages" packs retrieved passages. The packing used,
        the tokens reused and why some were not are in ``Answer.stats`` (:class:`~.ask.answer.AskStats`).

        Options left at None come from ``[ask]`` (see :class:`~.ask.request.AskRequest`); ``stop``
        strings are added to the defaults (the chat template's turn markers, a guard against
        invented "Question:" turns). ``cancel`` stops the call from another thread
        (:class:`~pipeline.errors.Cancelled`); ``progress`` receives a
        :class:`~.ask.progress.PrefillProgress` after each prefilled piece. ``question`` may be an
        :class:`~.ask.request.AskRequest` holding all of these instead. Safe to call from many
        threads (see :mod:`.engine.pool`).
        """
        with self.ask_stream(question, doc=doc, source=source, mode=mode, top_k=top_k, temperature=temperature,
                             max_tokens=max_tokens, system_prompt=system_prompt, stop=stop, cancel=cancel,
                             progress=progress) as stream:
            return stream.result()

    def ask_stream(self, question: "str | AskRequest", *, doc: Paths = None, source: Paths = None,
                   mode: str | None = None, top_k: int | None = None, temperature: float | None = None,
                   max_tokens: int | None = None, system_prompt: str | None = None,
                   stop: str | Sequence[str] | None = None, cancel: CancelToken | None = None,
                   progress: "Callable[[PrefillProgress], None] | None" = None,
                   history: Sequence[dict] | None = None) -> AnswerStream:
        """Like :meth:`ask`, streaming: iterate the result for text pieces as they are generated.

        Retrieval and packing happen here, beside any running generation; the engine is
        taken when iteration starts (see :class:`~.ask.answer.AnswerStream`). ``history`` (earlier
        ``{"role": "user" | "assistant", "content": ...}`` turns) makes it a follow-up: see :meth:`chat`.
        """
        request = AskRequest.make(question, doc=doc, source=source, mode=mode, top_k=top_k, temperature=temperature,
                                  max_tokens=max_tokens, system_prompt=system_prompt, stop=stop, cancel=cancel,
                                  progress=progress, history=history)
        return flow.ask_stream(self.runtime, request)

    def ask_many(self, questions: Sequence[str], *, doc: Paths = None, source: Paths = None,
                 max_tokens: int | None = None, system_prompt: str | None = None) -> list[Answer]:
        """Answer several questions at once: those whose prompts share their prefix (the same packed
        documents) are decoded together in one context (:meth:`~.engine.local.Engine.generate_many`,
        ``engine.n_seq_max`` sequences per decode), the others one after another. Greedy answers
        are those of :meth:`ask`; this is what a server batching concurrent questions calls."""
        return flow.ask_many(self.runtime, [AskRequest.make(q, doc=doc, source=source, max_tokens=max_tokens,
                                                            system_prompt=system_prompt) for q in questions])

    def prompt(self, question: "str | AskRequest", **options: Any) -> "Prompt":
        """The packed prompt :meth:`ask` would send for ``question`` (options as for :meth:`ask`),
        without generating: its text, tokens, boundaries, sections and sources."""
        return flow.build_prompt(self.runtime, AskRequest.make(question, **options)).prompt

    def warm(self, *, progress: Callable[[str, str], None] | None = None, purpose: str = "ask",
             states_progress: "Callable[[WarmProgress], None] | None" = None,
             cancel: CancelToken | None = None) -> dict:
        """Prefill and save the prefixes the next prompts will hit, with states at their boundaries.

        When the collection fits the context whole, ``purpose`` chooses: "ask" (default) its whole prefix,
        what every question over it starts from; "summarize" each document's own prefix, what its summaries
        and ``ask --doc`` start from; "all" both. Otherwise each document's leading sections (as many as
        fit), which serve both. Returns the report :func:`.warm.prefixes.warm` describes. Where the
        collection does not fit and prompts may be composed, it saves the section states instead
        (:meth:`warm_sections`; ``states_progress``, ``cancel``) and returns them as ``"section_states"``."""
        from .warm.prefixes import warm

        return warm(self.runtime, progress=progress, purpose=purpose, states_progress=states_progress, cancel=cancel)

    def warm_sections(self, *, progress: "Callable[[WarmProgress], None] | None" = None,
                      cancel: CancelToken | None = None) -> dict:
        """Save each section's own state, so that any question's prompt is composed from states: for
        collections larger than the context. Composition is calibrated first where it is not yet
        (``ask.compose = "auto"``, :mod:`.warm.calibration`); then the sections are saved most useful first
        (those recent questions used, then spread over the collection) within the room the cache has for
        them, the rest left for the questions that need them to compute (:mod:`.warm.sections`).
        ``progress`` receives a :class:`~.warm.progress.WarmProgress` (tokens done of the total, rate, time
        left) from the start. Returns the report :func:`.warm.sections.warm_sections` describes. A second
        call while another process warms the same states waits for it. A full cache disk stops it at the
        first state it cannot save (:class:`~pipeline.errors.DiskFullError`, exit 4).

        Questions come first: one asked meanwhile (another thread, ``rag serve``) runs before the next
        step. ``cancel`` stops it within a micro-batch (:class:`~pipeline.errors.Cancelled`); the
        states saved until then are kept, and a later call computes only the rest."""
        from .warm.sections import warm_sections

        return warm_sections(self.runtime, progress=progress, cancel=cancel)

    def warm_auto(self, *, progress: "Callable[[WarmProgress], None] | None" = None,
                  cancel: CancelToken | None = None) -> dict:
        """What ``ingest.warm = "auto"`` (the default) runs after an ingest, here in the calling thread: where
        the collection is larger than the context and the local generator can compose, calibrate composition
        on the collection's own sections (once per model and settings) and, if it is within the budget, save
        the section states as :meth:`warm_sections` does, so every question, the first included, is composed
        from states. Where the collection fits the context, the first question saves its prefix for the next,
        and nothing is done here. Returns ``{"warmed": bool, "reason": str}``, and when warmed
        :meth:`warm_sections`' report; ``"calibration"`` where one was measured. Questions come first, and
        ``cancel`` stops it, as in :meth:`warm_sections`."""
        from .warm.sections import warm_auto

        return warm_auto(self.runtime, progress=progress, cancel=cancel)

    def settle(self, *, cancel: bool = False, log: Callable[[str], None] | None = None) -> None:
        """Wait for the work an answer left for afterwards: the composition calibration the first
        answer over a collection larger than the context asks for (``ask.compose = "auto"``, at most
        once per model and settings). It runs by itself in the background and gives way to any new
        question; a command that exits right after an answer (``rag ask``) waits for it here, and
        ``log`` is told when it does. ``cancel``: stop it instead (it is measured after a later answer)."""
        if log is not None and self.runtime.settling and not cancel:
            log("calibrating composition on this answer (once per model and settings; Ctrl-C skips it) ...")
        self.runtime.settle(cancel=cancel)

    def calibration(self) -> dict:
        """The composition calibration of the configured generator, as ``rag status --json`` shows it
        (``"composition"``): ``mode``, ``model``, ``kl``, ``top1``, ``tokens``, ``budget``, ``allowed``
        (null figures where it is not measured yet)."""
        from .warm import calibration

        return calibration.status(self.runtime)

    # -- conversations (see .ask.chat) --------------------------------------------------------

    def chat(self, question: str, *, chat_id: str | None = None, history: Sequence[dict] | None = None,
             **options: Any) -> Answer:
        """Answer a follow-up in a conversation: ``chat_id`` keeps the turns on disk (``chats/`` in the
        store directory), or pass ``history`` yourself. Retrieval uses a condensed standalone query;
        earlier turns sit after the documents, so the documents' prefix stays cached from turn to
        turn. Other options as for :meth:`ask`."""
        with self.chat_stream(question, chat_id=chat_id, history=history, **options) as stream:
            return stream.result()

    def chat_stream(self, question: "str | AskRequest", *, chat_id: str | None = None,
                    history: Sequence[dict] | None = None, **options: Any) -> AnswerStream:
        """:meth:`chat`, streaming. With ``chat_id``, the turn is saved once the answer is complete."""
        request = AskRequest.make(question, chat_id=chat_id, history=history, **options)
        return flow.chat_stream(self.runtime, request)

    # -- asyncio (see .ask.aio) ---------------------------------------------------------------

    async def aask(self, question: "str | AskRequest", **options: Any) -> Answer:
        """:meth:`ask` for asyncio: the loop never blocks; cancelling the task cancels the call."""
        from .ask.aio import aask

        return await aask(self.aask_stream(question, **options))

    def aask_stream(self, question: "str | AskRequest", **options: Any) -> "AsyncAnswerStream":
        """:meth:`ask_stream` for asyncio: ``async for piece in rag.aask_stream(q)``, then ``.answer``."""
        from .ask.aio import AsyncAnswerStream

        request = AskRequest.make(question, **options)
        return AsyncAnswerStream(lambda cancel: flow.ask_stream(self.runtime, request.replace(cancel=cancel)))

    # -- batch summaries (see .summarize) -----------------------------------------------------

    def summarize(self, paths: Iterable[str | Path] | None = None, *, prompts: Sequence[str] | None = None,
                  max_tokens: int | None = None, restart: bool = False, out_dir: str | Path | None = None,
                  jsonl: str | Path | None = None, progress: "Callable[[SummaryEvent], None] | None" = None
                  ) -> "SummaryRun":
        """Summarise documents, resumably: iterate the result for :class:`~.summarize.outputs.Summary`
        objects as they finish.

        ``paths`` (files or folders) are ingested first where new or changed; with none,
        the whole collection is summarised. Each prompt (default ``summarize.prompt``)
        gives one summary per document. Finished work is kept in the store's job
        database, so the same call after an interruption does only what is left
        (``restart`` discards it first). ``out_dir`` gets one Markdown file per document
        and prompt, ``jsonl`` one JSON line per summary; ``report`` on the result has
        the totals once iteration ends.
        """
        from .summarize import run

        return run.summarize(self.runtime, paths, prompts=prompts, max_tokens=max_tokens, restart=restart,
                             out_dir=out_dir, jsonl=jsonl, progress=progress)

    def summary_status(self, paths: Iterable[str | Path] | None = None, *, prompts: Sequence[str] | None = None,
                       max_tokens: int | None = None) -> dict:
        """How far the job that ``summarize`` with these arguments would run has got; changes nothing."""
        from .summarize import run

        return run.status(self.runtime, paths, prompts=prompts, max_tokens=max_tokens)

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the models, engines and caches this pipeline made (see :meth:`.runtime.Runtime.close`)."""
        self.runtime.close()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
