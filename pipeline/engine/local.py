"""The local generator: one model in llama.cpp configured for fast prefill, with llama.cpp's own timings.

:class:`Engine` loads the model on first use (:mod:`.loading`),
renders its chat template (:mod:`.templates`), and streams answers: it prefills a
prompt in pieces split at its cuts, then samples and decodes token by token. What a
prompt reuses (the KV memory's common prefix, or a state saved in the prefix cache)
and where states are saved is the reuse policy's (:mod:`.reuse`); several prompts over one
prefix decode together (:mod:`.multiseq`); prompts take turns on the context (:mod:`.context_lock`).
"""

from __future__ import annotations

import codecs
import time
import weakref
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Sequence

from . import offload
from .contract import Completion, EngineStats, Generation, GeneratorBase
from .gguf.info import ModelInfo
from .loading import check_memory, load_generator, load_params, resolve_overrides
from .reuse.prefix import Memory, Plan, ReusePolicy, cuts as prompt_cuts
from .reuse.seams import Seams
from .reuse.sections import SectionReuse, Sections
from .templates import render, render_chat
from .context_lock import CancelToken, ContextLock
from .once import once
from ..config import EngineConfig
from ..errors import Cancelled, EngineClosed, EngineError

_CLOSED = ("the engine was closed (Pipeline.close) before this answer was finished; "
           "ask again with an open pipeline")


class Engine(GeneratorBase):
    """One generator model in llama.cpp. The model loads on first use.

    Safe to share between threads: prompts take turns on the one llama.cpp context, first
    come first served (a stream holds it from its first piece until it ends, is closed or
    is garbage-collected; see :mod:`.context_lock`), and a thread that starts a second prompt while
    it still reads the first gets an :class:`~pipeline.errors.EngineError` instead of a
    deadlock. A ``cancel`` token stops a waiting prompt, or a running one within one micro-batch.

    ``cache`` (a :class:`~.cache.store.PrefixCache`, or None) holds saved prefix states;
    ``cache_min_tokens`` and ``boundary_states`` are the reuse policy's (:class:`~.reuse.ReusePolicy`),
    and ``ram_states`` (a :class:`~.cache.ram.RamStates`, shared by a pool's engines) its host-memory
    copies of boundary states for models that cannot cut their memory. ``compose`` (the
    :class:`~.seams.Seams` to recompute; None: off) composes sections-mode prompts from section
    states in that cache (:class:`~.section_reuse.SectionReuse`).
    """

    def __init__(self, model_path: Path, settings: EngineConfig, *, log: Callable[[str], None] | None = None,
                 cache=None, cache_min_tokens: int = 256, boundary_states: int = 4, ram_states=None,
                 compose: Seams | None = None):
        self.model_path = Path(model_path)
        self.settings = settings
        me = weakref.ref(self)  # the parts hold no strong reference back: an engine dropped is freed at once
        self.reuse = ReusePolicy(cache, namespace=lambda: me().namespace, min_tokens=cache_min_tokens,
                                 boundary_states=boundary_states, ram=ram_states)
        self.sections = SectionReuse(cache, namespace=lambda: me().namespace, seams=compose or Seams(),
                                     enabled=compose is not None)
        self.memory = Memory()  # what the KV cache holds (the model is attached when it loads)
        self._log = log or (lambda message: None)
        self.load_seconds = 0.0
        self.notes: list[str] = []  # about the model and settings: reported with every prompt
        # One llama.cpp context must never be used by two threads at once (llama.cpp aborts the
        # process): prompts take turns, each from its first token until its stream ends or closes.
        self.lock = ContextLock(closed=_CLOSED)
        self._progress: Callable[[int], None] | None = None  # the running turn's prefill hook

    # -- model facts and settings ---------------------------------------------------------------

    @cached_property
    def info(self) -> ModelInfo:
        return ModelInfo.read(self.model_path)

    @cached_property
    def n_ctx(self) -> int:
        """The context length used: the configured one, clamped to the trained one without RoPE scaling."""
        s = self.settings
        n_ctx = self.info.context_length(s.n_ctx, s.rope_scaling)
        if s.n_ctx > n_ctx:
            note = (f"engine.n_ctx {s.n_ctx} is above the model's trained context {n_ctx}: using {n_ctx} "
                    "(set engine.rope_scaling to extend it)")
            self._log("warning: " + note)
            self.notes.append(note)
        return n_ctx

    @cached_property
    def overrides(self) -> list[offload.Override]:
        return resolve_overrides(self.settings, self.info.n_layers)

    @property
    def use_mmap(self) -> bool:
        return self.load_params()["mmap"]

    def load_params(self) -> dict:
        """Keyword arguments of :func:`._llama.load` that these settings mean (see :func:`.loading.load_params`)."""
        return load_params(self.settings, n_ctx=self.n_ctx, overrides=self.overrides, compose=self.sections.enabled)

    def check_memory(self) -> None:
        """Refuse, with the setting to lower, a KV cache that cannot fit in this machine's memory."""
        check_memory(self.info, self.settings, self.n_ctx)

    @once  # two threads' first calls must not load it twice
    def llm(self):
        """The model in llama.cpp (a :class:`._llama.Model`), loaded on first use."""
        llm, self.load_seconds = load_generator(self.model_path, self.settings, info=self.info, n_ctx=self.n_ctx,
                                                overrides=self.overrides, compose=self.sections.enabled)
        self.memory.model = llm
        return llm

    @property
    def can_trim(self) -> bool:
        """Whether the KV memory can be cut at any position (false for recurrent and hybrid models)."""
        return self.llm.can_trim

    @cached_property
    def namespace(self) -> str:
        """The prefix cache's namespace: this model file and every setting that shapes its KV contents."""
        from .cache.keys import namespace
        from ..models import file_identity

        s = self.settings
        return namespace(file_identity(self.model_path), n_ctx=self.n_ctx, type_k=s.type_k, type_v=s.type_v,
                         flash_attn=s.flash_attn, rope_scaling=s.rope_scaling, rope_freq_scale=s.rope_freq_scale)

    # -- text ---------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        """Tokens of ``text``. Control-token text (``<|im_end|>``...) becomes control tokens only
        with ``special``: pass it for the chat template's own markup, never for documents or
        questions, which could otherwise forge turns."""
        return self.llm.tokenize(text, add_bos=add_bos, special=special)

    @property
    def bos(self) -> list[int]:
        """The BOS token if the model wants one at the start of a prompt."""
        return self.llm.bos

    def chat(self, system: str, user: str) -> str:
        """``system`` and ``user`` rendered with the model's chat template, ready for the answer."""
        template = self.info.chat_template
        if not template:
            return render_chat("", system, user)
        return render_chat(template, system, user, bos=self.llm.bos_text, eos=self.llm.eos_text)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str | None:
        """``messages`` rendered with the model's chat template; None where the model has none.
        Where the default stops read the template's turn markers from (:mod:`pipeline.ask.stops`)."""
        if not self.info.chat_template:
            return None
        return render(self.info.chat_template, messages, add_generation_prompt=add_generation_prompt,
                      bos=self.llm.bos_text, eos=self.llm.eos_text)

    # -- what the memory holds ------------------------------------------------------------------

    @property
    def held_tokens(self) -> list[int]:
        """What the KV memory holds now, position by position (a copy): the last prompt and its answer."""
        return list(self.memory.tokens)

    def reset(self) -> None:
        """Forget what the KV memory holds: the next prompt reuses nothing from memory."""
        with self._turn():
            self.memory.clear()
            self.sections.forget()

    def keep(self, n: int) -> bool:
        """Cut the KV memory back to its first ``n`` tokens; False (nothing cut) where llama.cpp
        cannot cut it there (recurrent and hybrid memory, sliding-window layers)."""
        with self._turn():
            return self.memory.cut(n)

    def restore(self, store, entry, tokens: Sequence[int]) -> bool:
        """Load the saved state ``entry`` of ``store`` (a :class:`~.cache.store.PrefixCache`), which holds
        ``tokens[:entry.n_tokens]``, in place of what the KV memory holds; False (memory empty) when the
        state fails its checks."""
        with self._turn():
            self.llm  # noqa: B018 - loaded first: the state is restored into it
            self.sections.forget()
            return self.memory.restore(store, entry, tokens)

    def held(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = (),
             sections: Sections | None = None) -> int:
        """How many tokens of this prompt this engine's KV memory holds now, up to a point where
        :meth:`generate` may reuse them (the disk cache aside): what a pool routes prompts by. With
        ``sections`` (a prompt :meth:`generate` would compose), the sections a composition left there.
        Safe beside a running prompt: it reads a copy of what the memory holds."""
        memory = list(self.memory.tokens)
        if self.sections.would_compose(sections, self.__dict__.get("llm")):
            return self.sections.held(memory, tokens, sections)
        cuts = prompt_cuts(len(tokens), prefix_len, boundaries)
        return self.reuse.held(self.sections.exact(memory), tokens, cuts, can_trim=self.memory.can_trim)

    def reusable(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = (),
                 sections: Sections | None = None) -> int:
        """How many tokens of this prompt :meth:`generate` would reuse now (memory or disk; with
        ``sections``, section states too), running nothing and loading no model: what a packer weighs
        candidate prompts by."""
        memory = list(self.memory.tokens)
        if self.sections.would_compose(sections, self.__dict__.get("llm")):
            return self.sections.plan(memory, tokens, sections).reused
        cuts = prompt_cuts(len(tokens), prefix_len, boundaries)
        return self.reuse.reusable(self.sections.exact(memory), tokens, cuts, can_trim=self.memory.can_trim)

    # -- running prompts ----------------------------------------------------------------------

    def prefill(self, tokens: Sequence[int], *, start: int = 0) -> None:
        """Decode ``tokens[start:]`` in ``n_batch`` pieces, logits for the last token only."""
        import numpy as np

        llm = self.llm
        n_batch = llm.n_batch
        all_tokens = np.asarray(tokens, dtype=np.int32)
        held = self.memory.tokens
        for lo in range(start, len(tokens), n_batch):
            hi = min(lo + n_batch, len(tokens))
            try:
                llm.decode(all_tokens[lo:hi], lo)
            except EngineError as exc:
                self.memory.clear()
                if self.lock.stopping:
                    raise Cancelled(f"cancelled during the prefill, at token {lo:,}") from None
                raise EngineError(f"llama.cpp failed during prefill at token {lo}: {exc}") from None
            held.extend(tokens[lo:hi])
            if self._progress is not None:
                self._progress(len(held))

    def _prefill_piece(self, tokens: Sequence[int], start: int) -> None:
        self.prefill(tokens, start=start)  # looked up on the instance: a benchmark may wrap it

    def generate(self, tokens: Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, prefix_len: int = 0,
                 boundaries: Sequence[int] = (), stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
                 cancel: CancelToken | None = None, sections: Sections | None = None) -> Generation:
        """Stream the completion of ``tokens``.

        Generation ends at an end-of-generation token or one of ``stop_tokens``;
        ``progress(done, total)`` is called after each prefilled piece (tokens not reused);
        ``cancel`` takes the prompt out of the engine's queue, or stops its decode.

        ``tokens[:prefix_len]`` is shared with other prompts, ``boundaries`` the earlier points
        where a shared part may end (document and section ends): memory in common with the
        previous prompt is reused up to the last such point, else the longest state saved at one
        is restored; states are saved at the prefix and at up to ``boundary_states`` earlier
        boundaries prefilled now. ``sections`` (a sections-mode prompt's layout) composes it from
        section states where that is on and the model can shift (:mod:`.section_reuse`)."""
        if len(tokens) + 1 > self.n_ctx:
            raise EngineError(f"the prompt has {len(tokens):,} tokens; the context holds {self.n_ctx:,}")
        stats = stats or EngineStats()
        stats.prompt_tokens = len(tokens)
        sampling = (temperature, repeat_penalty, self.settings.seed if seed is None else seed)
        cuts = prompt_cuts(len(tokens), prefix_len, boundaries)
        pieces = self.lock.stream(self._run(list(tokens), max_tokens, sampling, stats, cuts,
                                             frozenset(stop_tokens), progress, cancel, self.lock.epoch, sections))
        return Generation(pieces, stats)

    def _run(self, tokens: list[int], max_tokens: int, sampling: tuple, stats: EngineStats,
             cuts: list[int], stop_tokens: frozenset[int] = frozenset(),
             progress: Callable[[int, int], None] | None = None,
             cancel: CancelToken | None = None, epoch: int | None = None,
             sections: Sections | None = None) -> Iterator[str]:
        with self._turn(cancel, epoch):  # from the first piece until the stream ends, is closed or is collected
            try:
                started = self._start(tokens, cuts, stats, progress, sections)
                yield from self._decode(max_tokens, sampling, stats, stop_tokens, started)
            except EngineError:
                if self.lock.stopping:
                    self.memory.clear()  # the aborted micro-batch left the memory unknown
                    if self.lock.closing:
                        raise EngineClosed(_CLOSED) from None
                    raise Cancelled("cancelled while generating") from None
                raise
            finally:
                self._progress = None

    def _reuse(self, tokens: Sequence[int], cuts: Sequence[int], stats: EngineStats) -> Plan:
        """Carry out the reuse policy's plan for this prompt (see :meth:`.reuse.ReusePolicy.prepare`);
        the engine's notes and the plan's go to ``stats``. Returns the plan carried out."""
        self.sections.release(self.memory)
        plan = self.reuse.prepare(self.memory, tokens, cuts, stats)
        stats.notes.extend(self.notes + list(plan.notes))
        return plan

    def _start(self, tokens: list[int], cuts: list[int], stats: EngineStats,
               progress: Callable[[int, int], None] | None, sections: Sections | None = None) -> tuple[float, float]:
        """Reuse what the policy plans, then prefill the prompt (states saved at its save points).
        The prompt is always decoded in pieces split at the cuts, and state is reused only up to a
        cut: a reused or restored prefix then leaves the computation exactly as it is without any
        cache, so greedy answers match token for token. At least one token is always decoded:
        sampling needs its logits. Returns when it started and when its prefill did."""
        llm = self.llm
        stats.load_seconds = self.load_seconds
        t0 = time.perf_counter()
        prefix_len = cuts[-1] if cuts else 0
        composed = self.sections.applies(llm, sections, stats)
        if composed:  # from section states
            stats.notes.extend(self.notes)
            t_prefill = time.perf_counter()
            if progress is not None:
                progress(0, len(tokens))
            self.sections.run(llm, self.memory, tokens, sections, stats, self._prefill_piece)
            reused = stats.cached_tokens - stats.recomputed_tokens
        else:
            plan = self._reuse(tokens, cuts, stats)
            reused = plan.reused
            llm.synchronize()  # anything pending is booked before the counters restart
            llm.reset_timings()
            t_prefill = time.perf_counter()
            if progress is not None:
                progress(0, len(tokens) - reused)
        if progress is not None:
            self._progress = lambda position: progress(position - reused, len(tokens) - reused)
        if not composed:
            self.reuse.advance(plan, self.memory, stats, self._prefill_piece)
        self.prefill(tokens, start=len(self.memory.tokens))
        self._progress = None
        stats.prefill_tokens = len(tokens) - reused
        stats.notes.extend(self.reuse.store_notes(prefix_len))
        return t0, t_prefill

    def _decode(self, max_tokens: int, sampling: tuple, stats: EngineStats, stop_tokens: frozenset[int],
                started: tuple[float, float]) -> Iterator[str]:
        """Sample and decode token by token, streaming the text; the figures from llama.cpp's counters
        (``started``: when the prompt and its prefill started)."""
        llm = self.llm
        t0, t_prefill = started
        held = self.memory.tokens
        sampler = llm.sampler(temperature=sampling[0], repeat_penalty=sampling[1], seed=sampling[2])
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n_out = 0
        t_first = None
        try:
            while n_out < max_tokens and len(held) < self.n_ctx:
                token = sampler.sample()
                if t_first is None:
                    # llama.cpp books a batch's time when its outputs are first read: now.
                    t_first = time.perf_counter()
                    stats.ttft_seconds = t_first - t0
                    perf = llm.timings()
                    stats.prefill_seconds = (perf.prompt_ms / 1000 if perf.prompt_tokens
                                             else t_first - t_prefill)
                    if stats.prefill_seconds > 0:
                        stats.prefill_tokens_per_second = stats.prefill_tokens / stats.prefill_seconds
                if llm.is_eog(token) or token in stop_tokens:
                    break
                n_out += 1
                text = decoder.decode(llm.piece(token))
                llm.decode_token(token, len(held))
                held.append(token)
                if text:
                    yield text
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
        finally:
            sampler.close()
            # Book the last decode now, or llama.cpp would count it into the next prompt's prefill.
            llm.synchronize()
            perf = llm.timings()
            stats.decode_tokens = n_out
            stats.decode_seconds = perf.eval_ms / 1000
            if perf.eval_tokens and perf.eval_ms > 0:
                stats.decode_tokens_per_second = perf.eval_tokens / (perf.eval_ms / 1000)

    def warm(self, prefix: Sequence[int], *, boundaries: Sequence[int] = ()) -> bool:
        """Prefill ``prefix`` and save its state (and states at ``boundaries``, as :meth:`generate`
        does), unless it is already saved. True if the whole prefix was saved now."""
        stats = EngineStats()
        prefix = list(prefix)
        if not prefix or not self.reuse.uses_store(len(prefix)):
            return False
        store = self.reuse.store
        if store is not None and store.lookup(self.namespace, prefix, max_tokens=len(prefix), min_tokens=len(prefix),
                                              count=False):
            return False
        cuts = sorted({int(b) for b in boundaries if 0 < b < len(prefix)} | {len(prefix)})
        with self._turn():
            self.sections.release(self.memory)
            plan = self.reuse.prepare(self.memory, prefix, cuts, stats)
            return len(prefix) in self.reuse.advance(plan, self.memory, stats, self._prefill_piece)

    def warm_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]], *,
                      progress: Callable[[int, int], None] | None = None) -> dict:
        """Save the state of every section (token lists, each prefilled on its own after ``head``) that
        has none: see :meth:`.section_reuse.SectionReuse.warm`. Needs composition on."""
        if not self.sections.enabled:
            raise EngineError("section states are saved only where prompts are composed: set ask.compose = \"auto\"")
        with self._turn():
            return self.sections.warm(self.llm, self.memory, list(head), sections, self._prefill_piece, progress)

    # -- several prompts over one prefix ---------------------------------------------------------

    @property
    def n_seq_max(self) -> int:
        """How many sequences one decode can run (``engine.n_seq_max``; 1 for recurrent and hybrid
        models, whose memory cannot share a prefix between sequences)."""
        if self.settings.n_seq_max <= 1 or not self.can_trim:
            return 1
        return self.llm.n_seq_max

    def generate_many(self, prompts: Sequence[Sequence[int]], *, prefix_len: int, boundaries: Sequence[int] = (),
                      max_tokens: int = 256, temperature: float = 0.0, repeat_penalty: float = 1.0,
                      seed: int | None = None) -> list[Completion]:
        """Answer several ``prompts`` that share their first ``prefix_len`` tokens: the prefix is
        reused or prefilled once (as :meth:`generate` does, states saved at ``boundaries``), and with
        ``n_seq_max`` > 1 the answers are decoded together, one decode call per step for all of
        them (:mod:`.multiseq`); else one after the other. Greedy answers are the same either way
        with one thread; with several, llama.cpp's CPU kernels may round differently (see :mod:`.multiseq`).
        """
        from .multiseq import groups

        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        head = prompts[0][:prefix_len]
        shared = all(len(p) > prefix_len and p[:prefix_len] == head for p in prompts)
        if len(prompts) == 1 or not shared or prefix_len <= 0 or self.n_seq_max <= 1:
            return super().generate_many(prompts, prefix_len=prefix_len, boundaries=boundaries,
                                         max_tokens=max_tokens, temperature=temperature,
                                         repeat_penalty=repeat_penalty, seed=seed)
        for p in prompts:
            if len(p) + 1 > self.n_ctx:
                raise EngineError(f"the prompt has {len(p):,} tokens; the context holds {self.n_ctx:,}")
        sampling = (temperature, repeat_penalty, self.settings.seed if seed is None else seed)
        results: list[Completion | None] = [None] * len(prompts)
        for group in groups([len(p) for p in prompts], prefix_len=prefix_len, max_tokens=max_tokens,
                            n_ctx=self.n_ctx, n_seq=self.n_seq_max):
            run = [prompts[i] for i in group]
            stats = [EngineStats(prompt_tokens=len(p)) for p in run]
            with self._turn():
                texts = self._together(run, stats, prefix_len=prefix_len, boundaries=boundaries,
                                       max_tokens=max_tokens, sampling=sampling)
            for i, text, st in zip(group, texts, stats):
                results[i] = Completion(text, st)
        return results  # type: ignore[return-value]

    def _together(self, prompts: list[list[int]], stats: list[EngineStats], *, prefix_len: int,
                  boundaries: Sequence[int], max_tokens: int, sampling: tuple) -> list[str]:
        """One group of :meth:`generate_many`, holding the context: the prefix into sequence 0, then
        the suffixes and answers decoded together."""
        from .multiseq import decode_together

        llm = self.llm
        cuts = prompt_cuts(len(prompts[0]), prefix_len, boundaries)
        first = stats[0]
        first.load_seconds = self.load_seconds
        t0 = time.perf_counter()
        plan = self._reuse(prompts[0], cuts, first)
        reused = plan.reused
        self.reuse.advance(plan, self.memory, first, self._prefill_piece)
        llm.synchronize()
        first.prefill_seconds = time.perf_counter() - t0
        first.notes.extend(self.reuse.store_notes(prefix_len))
        for st in stats[1:]:  # the prefix was reused from sequence 0
            st.cached_tokens, st.cache, st.notes = prefix_len, "memory", list(self.notes)
        try:
            texts, held = decode_together(llm, prompts, stats, prefix_len=prefix_len, max_tokens=max_tokens,
                                          n_ctx=self.n_ctx, sampling=sampling)
        except EngineError as exc:
            self.memory.clear()
            raise EngineError(f"llama.cpp failed decoding {len(prompts)} sequences together: {exc}") from None
        self.memory.tokens = held
        for i, st in enumerate(stats):
            st.prefill_tokens = len(prompts[i]) - (reused if i == 0 else prefix_len)
            if st.prefill_seconds > 0:
                st.prefill_tokens_per_second = st.prefill_tokens / st.prefill_seconds
        return texts

    # -- turns ----------------------------------------------------------------------------------

    def _turn(self, cancel: CancelToken | None = None, epoch: int | None = None):
        return self.lock.hold(cancel, epoch, flag=lambda: self.llm.abort_flag())

    @property
    def waiting(self) -> int:
        """Prompts queued for this engine, the running one included (what a pool balances by)."""
        return self.lock.queued + self.lock.busy

    def close(self) -> None:
        """Free the model, ending this engine's unfinished streams first, on any thread: one paused
        between two pieces (or not started yet) ends now; a running prefill or decode stops within
        one micro-batch; a prompt queued for the engine leaves the queue. Each raises
        :class:`~pipeline.errors.EngineClosed` (a :class:`~pipeline.errors.Cancelled`) at its next read.
        Called from inside a running turn of this thread (a progress callback), it cannot wait for
        that turn and leaves the model."""
        self.lock.close(self._free, flag=self.llm.abort_flag() if "llm" in self.__dict__ else None)

    def _free(self) -> None:
        llm = self.__dict__.pop("llm", None)
        self.memory.model, self.memory.tokens = None, []
        if llm is not None:
            llm.close()


__all__ = ["Engine"]
