"""What a :class:`~pipeline.api.Pipeline` owns, built lazily: the models, the engine pool, the caches,
the store, the pack history.

A :class:`Runtime` is settings plus resources. Nothing is built until first used
(``rag --help`` and most tests start instantly), each resource is built once however
many threads ask for it at the same time (:class:`~.concurrency.once`), and
:meth:`Runtime.close` closes what it built (never an embedder or generator that was
given to it). The operations (:mod:`.ask`, :mod:`.retrieval`, :mod:`.summarize`,
:mod:`.collection`) take a runtime and use these resources; the runtime itself answers
no question.
"""

from __future__ import annotations

import dataclasses
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from . import models
from .engine.once import once
from .engine.pool import EnginePool
from .config import Config
from .store.shared import SharedStore
from .store.store import Store

if TYPE_CHECKING:
    from .ask.history import PackHistory
    from .ask.prompt import Layout, SectionTokens
    from .ask.stops import Stops
    from .config import EngineConfig
    from .engine.cache.calibrations import Calibrations
    from .engine.cache.ram import RamStates
    from .engine.cache.prefix_cache import PrefixCache
    from .engine.contract import TextEmbedder, TextGenerator
    from .engine.reuse.budget import ComposePolicy, Refusal

#: The lazily built resources :meth:`Runtime.close` closes (those it made).
RESOURCES = ("embedder", "engine", "prefix_cache", "ram_states", "pack_history", "calibrations")
#: The longest :meth:`Runtime.load_generator_soon` waits for llama.cpp to begin loading (its bindings'
#: first import, compiling them, can take seconds; the caller goes on after this either way).
_LOAD_BEGIN_WAIT = 5.0


class Runtime:
    """The settings and the resources of one pipeline.

    ``embedder`` and ``generator``, when given, are used instead of the configured models
    (any :class:`~pipeline.engine.contract.TextEmbedder` / ``TextGenerator``: the tests'
    fakes, a backend of the application's own); the runtime never closes them.
    """

    def __init__(self, config: Config, *, log: Callable[[str], None] | None = None,
                 embedder: "TextEmbedder | None" = None, generator: "TextGenerator | None" = None):
        self.config = config.validate()
        self.log = log
        self._given: set[str] = set()
        self._layouts: dict[str, "Layout"] = {}
        self._layouts_mu = threading.Lock()
        self._background: threading.Thread | None = None  # a calibration after an answer
        self._background_cancel = None
        self._background_mu = threading.Lock()
        self._loading: threading.Thread | None = None  # the generator's model, loading beside retrieval
        #: The warming the last ingest started (a :class:`~pipeline.warm.job.WarmJob`; None: none), cancelled by
        #: the next ingest and by :meth:`close` (the states it saved are kept).
        self.warming = None
        self._warming_mu = threading.Lock()
        c = self.config.store
        self._stores = SharedStore(self.config.store_path, wait=c.wait, url=c.url, catalog_url=c.catalog_url,
                                   catalog_pool=c.catalog_pool, timeout=c.timeout)
        if embedder is not None:
            self.__dict__["embedder"] = embedder  # fills the lazily built resource
            self._given.add("embedder")
        if generator is not None:
            self.__dict__["engine"] = generator
            self._given.add("engine")

    def has(self, name: str) -> bool:
        """Whether the resource ``name`` (``"engine"``, ``"embedder"``, ...) is built or given already."""
        return name in self.__dict__

    def given(self, name: str) -> bool:
        """Whether the resource ``name`` was given to the runtime rather than built from the settings."""
        return name in self._given

    # -- models -------------------------------------------------------------------------------

    @once
    def embedder(self) -> "TextEmbedder":
        """The configured embedder: a server's (``openai:``) or the local GGUF, loaded on first use."""
        from .engine.embed_prompts import PrefixedEmbedder, gguf_names, resolve

        m = self.config.models
        if models.is_server(m.embedder):
            from .engine.remote.embedder import remote_embedder

            inner = remote_embedder(m.embedder, self.config.remote)
            names: tuple[str, ...] = (getattr(getattr(inner, "ref", None), "model", "") or "",)
        else:
            from .engine.embed import Embedder

            e, path = self.config.embed, self.model_path("embedder")
            inner = Embedder(path, threads=e.threads, flash_attn=e.flash_attn, gpu_layers=e.gpu_layers,
                             batch_tokens=e.batch_tokens)
            names = gguf_names(path)
        # Instruction-tuned embedders want "query: " / "passage: " style prefixes (models.embedder_*_prefix).
        return PrefixedEmbedder(inner, resolve(m.embedder_query_prefix, m.embedder_document_prefix, names=names))

    @once
    def engine(self) -> "TextGenerator":
        """The configured generator: a server's (``openai:``) or a local llama.cpp engine."""
        ref = self.config.models.generator
        if models.is_server(ref):
            from .engine.remote.generator import remote_generator

            return remote_generator(ref, self.config.engine, self.config.remote, log=self.log)
        return self.new_engine(self.model_path("generator"))

    def load_generator_soon(self, *, build: bool = False) -> None:
        """Start loading the local generator's model in a thread of its own, so that it loads while
        retrieval runs (llama.cpp releases the GIL while it loads); the first thread that needs the
        model waits for that load (:class:`~.engine.once.once`), never starts a second. ``build``:
        make the engine here first (find the model file, read its header), so that only llama.cpp's
        load runs beside what this thread does next. Returns once llama.cpp has begun loading. Nothing
        happens for a given or remote generator, a model loaded already, or, unless ``build``, one not
        on disk yet (it is fetched, with its messages, where it is first needed); a load that fails
        here is tried again, and reported, where the model is needed."""
        with self._background_mu:
            if self._loading is not None or self.given("engine") or models.is_server(self.config.models.generator):
                return
            # The thread starts at once: it imports llama.cpp's bindings while this one finds the model.
            found, usable, begun = threading.Event(), [], threading.Event()
            self._loading = threading.Thread(target=self._load_generator, args=(found, usable, begun),
                                             name="rag-load-generator", daemon=True)
            self._loading.start()
        try:
            if build:
                self.engine  # noqa: B018 - found (fetched if it must be) and its header read, in this thread
            elif not self.has("engine"):
                try:
                    models.resolve(self.config.models.generator, home=self.config.home_path, fetch=False)
                except Exception:  # not provisioned yet (or not a model at all): the ask path says so
                    return
            usable.append(True)
        finally:
            found.set()
            if not usable:  # the thread ends without loading: a later call may start one
                with self._background_mu:
                    self._loading = None
        # Python runs one thread at a time: what this thread would do next (imports, retrieval) would
        # slow the imports the load waits for, not overlap them. Once llama.cpp loads (without the
        # GIL) the two run side by side.
        begun.wait(timeout=_LOAD_BEGIN_WAIT)

    def _load_generator(self, found: threading.Event, usable: list, begun: threading.Event) -> None:
        try:
            from .engine.loading import import_bindings
            from .engine.local import Engine

            import_bindings()  # while the calling thread finds the model

            found.wait()
            if not usable:
                return
            engine = self.engine
            if isinstance(engine, Engine) and "llm" not in engine.__dict__:
                begun.set()
                engine.llm  # noqa: B018 - loads it (once, whoever asks first)
        except Exception:  # noqa: BLE001 - the thread that needs the model loads it again and reports why not
            pass
        finally:
            begun.set()

    def model_path(self, role: str) -> Path:
        """The local GGUF of the configured ``role`` ("embedder" or "generator"), provisioned on first use."""
        return models.resolve(getattr(self.config.models, role), home=self.config.home_path, what=role,
                              log=self.log)

    def new_engine(self, path: Path | None = None):
        """Another local engine on the generator's file (or ``path``), with the tuned settings and the
        prefix cache (and section states, with ``ask.compose = "auto"``); with ``engine.parallel`` > 1
        and automatic threads, the engines share the cores."""
        from .engine.local import Engine
        from .engine.host import usable_cpus

        path = path or self.engine.model_path
        settings = self.engine_settings(path)
        if self.config.engine.parallel > 1 and settings.threads == 0:
            settings = dataclasses.replace(settings, threads=max(1, usable_cpus() // self.config.engine.parallel))
        return Engine(path, settings, log=self.log, cache=self.prefix_cache,
                      cache_min_tokens=self.config.cache.min_tokens,
                      boundary_states=self.config.cache.boundary_states, ram_states=self.ram_states,
                      compose=self.compose_policy, calibrations=self.calibrations)

    @once
    def compose_policy(self) -> "ComposePolicy":
        """``ask.compose``, its seams and its quality budget, resolved once into their types."""
        from .engine.reuse.budget import ComposeMode, ComposePolicy
        from .engine.reuse.seams import Seams

        a = self.config.ask
        return ComposePolicy(mode=ComposeMode(a.compose), seams=Seams(a.compose_seams, a.compose_recompute),
                             max_kl=a.compose_max_kl)

    @once
    def calibrations(self) -> "Calibrations":
        """Composition calibrations, kept with the section states in the prefix cache's directory."""
        from .engine.cache.calibrations import Calibrations

        cache = self.prefix_cache
        return Calibrations(cache.directory if cache is not None and not cache.unavailable else None)

    # -- work after an answer -----------------------------------------------------------------

    def after_answer(self, engine) -> None:
        """An answer is complete: where it left a composition calibration pending, measure it in the
        background (its turn gives way to any prompt that queues for the engine)."""
        if getattr(engine, "pending_calibration", None) is None:
            return
        from .engine.context_lock import CancelToken

        with self._background_mu:
            if self._background is not None and self._background.is_alive():
                return
            cancel = CancelToken()
            thread = threading.Thread(target=self._calibrate, args=(engine, cancel), name="rag-calibrate",
                                      daemon=True)
            self._background, self._background_cancel = thread, cancel
            thread.start()

    def _calibrate(self, engine, cancel) -> None:
        from .errors import RagError

        try:
            record = engine.calibrate_pending(cancel=cancel)
        except RagError as exc:  # a calibration that fails costs itself, never an answer
            if self.log:
                self.log(f"warning: composition calibration failed: {exc}")
            return
        if record is not None and self.log:
            self.log(calibration_line(record, self.compose_policy.max_kl))

    @property
    def settling(self) -> bool:
        """Whether work left after an answer (a calibration) runs now."""
        with self._background_mu:
            return self._background is not None and self._background.is_alive()

    def settle(self, *, cancel: bool = False) -> None:
        """Wait for work left after answers (a calibration) to finish; ``cancel`` (or Ctrl-C while
        waiting): stop it first (it is measured again after a later answer)."""
        with self._background_mu:
            thread, token = self._background, self._background_cancel
        if thread is None:
            return
        if cancel and token is not None:
            token.cancel()
        try:
            while thread.is_alive():
                thread.join(0.1)  # in steps: Ctrl-C reaches this thread between them
        except KeyboardInterrupt:
            if token is not None:
                token.cancel()
            thread.join()
            raise

    def stop_warming(self) -> None:
        """Cancel the warming an ingest started, if it runs, and wait for it to stop (within a micro-batch)."""
        with self._warming_mu:
            job, self.warming = self.warming, None
        if job is not None:
            job.cancel()
            job.wait()

    def start_warming(self, start: Callable[[], Any]) -> Any:
        """Stop the warming running, if any, then ``start()`` the next and keep it: one at a time, however many
        threads ingest at once."""
        with self._warming_mu:
            job, self.warming = self.warming, None
            if job is not None:
                job.cancel()
                job.wait()
            self.warming = start()
            return self.warming

    def engine_settings(self, model_path: Path) -> "EngineConfig":
        """The engine settings: the configuration, with a ``rag tune`` profile over the keys left at default."""
        from .config.tuned import tuned_engine

        settings = self.config.engine
        if not settings.tuned:
            return settings
        from .engine.gguf.info import ModelInfo

        n_ctx = ModelInfo.read(model_path).context_length(settings.n_ctx, settings.rope_scaling)
        settings, changes, note = tuned_engine(settings, self.config.home_path, model_path, n_ctx)
        if self.log and (changes or note):
            self.log("warning: " + note if note else
                     "using tuned settings: " + ", ".join(f"{k}={v}" for k, v in sorted(changes.items())))
        return settings

    @once
    def pool(self) -> EnginePool:
        """The engines answering questions: ``engine`` and, with ``engine.parallel`` > 1, more as
        concurrent questions need them (never for a given or a remote generator: servers run
        their own slots)."""
        local = not self.given("engine") and not models.is_server(self.config.models.generator)
        size = self.config.engine.parallel if local else 1
        return EnginePool(lambda: self.engine, self.new_engine, size)

    # -- what prompts are made of -------------------------------------------------------------

    @once
    def stops(self) -> "Stops":
        """The default stops: the chat template's turn markers and the new-turn guard."""
        from .ask.stops import template_stops

        return template_stops(self.engine)

    def layout(self, system: str | None = None) -> "Layout":
        """The prompt layout with ``system`` (default ``ask.system_prompt``) as its system prompt, made
        once per system prompt."""
        from .ask.prompt import Layout

        system = self.config.ask.system_prompt if system is None else system
        with self._layouts_mu:
            layout = self._layouts.get(system)
        if layout is None:
            engine = self.engine
            layout = Layout.make(chat=engine.chat, tokenize=engine.tokenize, bos=engine.bos, system=system)
            with self._layouts_mu:
                layout = self._layouts.setdefault(system, layout)
        return layout

    @once
    def section_memo(self) -> "SectionTokens":
        """The generator tokens of rendered sections, remembered across questions and summaries."""
        from .ask.prompt import SectionTokens
        from .ask.saved_tokens import SavedTokens
        from .engine.local import Engine

        engine = self.engine
        saved = None
        if isinstance(engine, Engine) and self.config.cache.enabled:  # a server's tokens come with its own bookkeeping
            saved = SavedTokens(self.config.cache_path / "tokens.sqlite", engine.namespace)
        return SectionTokens(engine.tokenize, saved=saved)

    @property
    def section_tokens(self) -> int:
        """The size new documents' sections are cut to, in embedder tokens (``chunking.section_tokens``,
        else derived from the generator's context: 512 from 8K up; a quarter of it up to 16K where
        prompts may be composed, as the generator's reuse planner answers it, calibration aside: not with
        ``ask.compose = "off"``, without the prefix cache, on a model that cannot shift (recurrent and
        hybrid layers) or a server; see :func:`.ingest.sections.target_tokens`)."""
        from .ingest.sections import target_tokens

        c = self.config
        if c.chunking.section_tokens:
            return c.chunking.section_tokens
        engine, refusal = self.composition(calibrated=False)
        if engine is None:
            # A local generator not fetched yet (a new home: `rag ingest` fetches it after the embedding, to
            # warm) is taken to compose, as most do: cutting for it as for a server would leave every section a
            # quarter of the size composing wants, until `rag sections --recut`.
            composed, n_ctx = self.compose_policy.enabled and c.cache.enabled, c.engine.n_ctx or 8192
        else:
            composed, n_ctx = refusal is None, engine.n_ctx
        return target_tokens(n_ctx, chunk_size=c.chunking.size, composed=composed)

    def composition(self, *, calibrated: bool = True) -> "tuple[TextGenerator | None, Refusal | None]":
        """The generator as it runs (or will: read from its header, loading nothing) and its reuse planner's
        answer to "may prompts be composed here" (``calibrated=False``: could they ever be); ``(None, None)``
        where a local generator is not provisioned yet. Creates nothing: a prefix cache not made yet holds
        no calibration, and would be made on first use."""
        from .engine.cache.calibrations import Calibrations
        from .engine.local import Engine
        from .engine.reuse.budget import Refusal
        from .errors import RagError

        c = self.config
        if self.has("engine") or models.is_server(c.models.generator):
            return self.engine, self.engine.composition_refusal(calibrated=calibrated)
        try:
            path = models.resolve(c.models.generator, home=c.home_path, fetch=False, what="generator")
        except RagError:
            return None, None
        made = c.cache.enabled and c.cache_path.is_dir()
        engine = Engine(path, self.engine_settings(path), cache=self.prefix_cache if made else None,
                        compose=self.compose_policy, calibrations=Calibrations(c.cache_path if made else None))
        refusal = engine.composition_refusal(calibrated=calibrated)
        if refusal is Refusal.NO_CACHE and c.cache.enabled:
            refusal = self.compose_policy.refusal(None) if calibrated else None
        return engine, refusal

    def reserve(self, max_tokens: int | None = None) -> int:
        """The answer room every layout decision holds back (:func:`.ask.prompt.layout_reserve`)."""
        from .ask.prompt import layout_reserve

        c = self.config
        return layout_reserve(self.engine.n_ctx, c.ask.max_tokens, c.summarize.max_tokens, max_tokens)

    # -- caches and the store -----------------------------------------------------------------

    @once
    def prefix_cache(self) -> "PrefixCache | None":
        """The on-disk prefix KV cache, or None when ``cache.enabled`` is off. Its
        :meth:`~.engine.cache.prefix_cache.PrefixCache.budget_bytes` is what states may take now
        (``cache.max_gb``, or at 0 a share of its disk)."""
        if not self.config.cache.enabled:
            return None
        from .engine.cache.prefix_cache import PrefixCache

        c = self.config.cache
        return PrefixCache(self.config.cache_path, max_bytes=int(c.max_gb * 2**30), section_type=c.section_type)

    @once
    def ram_states(self) -> "RamStates":
        """Boundary states kept in host memory for this pipeline's engines (models that cannot cut their
        memory: a later question restores without the disk)."""
        from .engine.cache.ram import RamStates

        c = self.config.cache
        return RamStates(max_states=c.ram_states, max_bytes=int(c.ram_gb * 2**30))

    @once
    def pack_history(self) -> "PackHistory":
        """The packs recent questions used (beside the prefix cache; in memory when it is off)."""
        from .ask.history import PackHistory

        return PackHistory(self.config.cache_path / "packs.sqlite" if self.config.cache.enabled else None)

    @contextmanager
    def store(self, *, create: bool = True) -> Iterator[Store]:
        """The collection's store, open and locked for the duration of the ``with`` block.

        ``create=False`` (every read) refuses to open a store that does not exist yet. The
        threads of this runtime share one open store and one process lock, so searches go
        on while it ingests; another process waits ``store.wait`` seconds.
        """
        with self._stores.open(self.config.store.collection, create=create) as s:
            yield s

    def check_embedder(self, store: Store) -> None:
        """Refuse dense search with another embedder than the collection's (it would compare unrelated
        vectors)."""
        if self.config.retrieval.dense:
            store.check_embedder(embedder=self.config.models.embedder, embedder_id=self.embedder.identity)

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close what the runtime built (engines, embedder, caches, the store's connections); work left
        after answers, and warming, are cancelled first (the states they saved are kept), and a model still
        loading is waited for."""
        self.stop_warming()
        self.settle(cancel=True)
        with self._background_mu:
            loading, self._loading = self._loading, None
        if loading is not None:
            loading.join()
        pool = self.__dict__.pop("pool", None)
        if pool is not None:
            pool.close_extra()
        for name in RESOURCES:
            resource = self.__dict__.pop(name, None)
            if resource is not None and name not in self._given:
                resource.close()
        self._given.clear()
        with self._layouts_mu:
            self._layouts.clear()
        memo = self.__dict__.pop("section_memo", None)
        if memo is not None:
            memo.close()
        for name in ("stops", "compose_policy"):
            self.__dict__.pop(name, None)
        self._stores.close()  # the PostgreSQL connections, when this was the last pipeline using them


def calibration_line(record, budget: float) -> str:
    """One line for people about a calibration: its figures and what it decides."""
    verdict = ("prompts over sections are composed from their states from now on" if record.allowed(budget) else
               f"above ask.compose_max_kl = {budget}: prompts stay exact")
    return (f"composition calibrated for {record.model}: mean KL {record.kl:.4f} nats, top-1 agreement "
            f"{record.top1:.1%} over {record.tokens} tokens; {verdict}")


__all__ = ["RESOURCES", "Runtime", "calibration_line"]
