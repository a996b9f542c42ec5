"""The local generator: one model in llama.cpp configured for fast prefill, with llama.cpp's own timings.

:class:`Engine` loads the model on first use (:mod:`.loading`),
renders its chat template (:mod:`.templates`), and streams answers: it prefills a
prompt in pieces split at its cuts, then samples and decodes token by token. What a
prompt reuses (the KV memory's common prefix, a saved prefix state, or section states
composed into it) is the reuse planner's one plan (:mod:`.reuse.planner`), which the
engine carries out; several prompts over one prefix decode together (:mod:`.multiseq`);
prompts take turns on the context (:mod:`.context_lock`).
"""

from __future__ import annotations

import codecs
import time
import weakref
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Sequence

from . import offload
from .cache.sections import kept_types
from .contract import CacheKind, Completion, EngineStats, Generation, GeneratorBase
from .gguf.info import ModelInfo
from .loading import check_memory, load_generator, load_params, resolve_overrides
from .reuse import calibrate
from .cache.calibrations import Calibration
from .reuse.budget import ComposeMode, ComposePolicy, Refusal
from .reuse.kinds import MemoryKind, kind_of_info
from .reuse.memory import Memory
from .reuse.execute import carry_out
from .reuse.plan import Need
from .reuse.planner import Planner
from ..records import PromptShape
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

    ``cache`` (a :class:`~.cache.prefix_cache.PrefixCache`, or None) holds saved prefix and section states;
    ``cache_min_tokens`` and ``boundary_states`` are prefix reuse's (:class:`~.reuse.prefix.PrefixReuse`),
    ``ram_states`` (a :class:`~.cache.ram.RamStates`, shared by a pool's engines) its host-memory
    copies of boundary states for models that cannot cut their memory; ``compose`` (a
    :class:`~.reuse.budget.ComposePolicy`; default: ``ask.compose = "off"``) says when sections-mode
    prompts are composed from section states, judged by ``calibrations``
    (:class:`~.cache.calibrations.Calibrations`).
    """

    def __init__(self, model_path: Path, settings: EngineConfig, *, log: Callable[[str], None] | None = None,
                 cache=None, cache_min_tokens: int = 256, boundary_states: int = 4, ram_states=None,
                 compose: ComposePolicy | None = None, calibrations=None):
        self.model_path = Path(model_path)
        self.settings = settings
        me = weakref.ref(self)  # the parts hold no strong reference back: an engine dropped is freed at once
        self.planner = Planner(cache, namespace=lambda: me().namespace,
                               policy=compose or ComposePolicy(mode=ComposeMode.OFF), min_tokens=cache_min_tokens,
                               boundary_states=boundary_states, ram=ram_states, calibrations=calibrations,
                               model_name=lambda: me().model_path.name)
        self.pending_calibration: calibrate.Recorder | None = None  # an exact answer to measure composition by
        # What the KV cache holds (the model is attached when it loads; its kind read from the header until then).
        self.memory = Memory(expected=lambda: kind_of_info(me().info))
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
        return load_params(self.settings, n_ctx=self.n_ctx, overrides=self.overrides,
                           compose=self.planner.policy.enabled)

    def check_memory(self) -> None:
        """Refuse, with the setting to lower, a KV cache that cannot fit in this machine's memory."""
        check_memory(self.info, self.settings, self.n_ctx)

    @once  # two threads' first calls must not load it twice
    def llm(self):
        """The model in llama.cpp (a :class:`._llama.Model`), loaded on first use."""
        llm, self.load_seconds = load_generator(self.model_path, self.settings, info=self.info, n_ctx=self.n_ctx,
                                                overrides=self.overrides, compose=self.planner.policy.enabled)
        self.memory.attach(llm)
        return llm

    @property
    def memory_kind(self) -> MemoryKind:
        """What reuse may do with this model's memory (:mod:`.reuse.kinds`): the header's word until the
        model loads, then llama.cpp's."""
        return self.memory.kind

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
        with self.turn():
            self.memory.clear()

    def keep(self, n: int) -> bool:
        """Cut the KV memory back to its first ``n`` tokens; False (nothing cut) where llama.cpp
        cannot cut it there (recurrent and hybrid memory, sliding-window layers)."""
        with self.turn():
            return self.memory.cut(n)

    def restore(self, store, entry, tokens: Sequence[int]) -> bool:
        """Load the saved state ``entry`` of ``store`` (a :class:`~.cache.prefix_cache.PrefixCache`), which holds
        ``tokens[:entry.n_tokens]``, in place of what the KV memory holds; False (memory empty) when the
        state fails its checks."""
        with self.turn():
            self.llm  # noqa: B018 - loaded first: the state is restored into it
            return self.memory.restore(store, entry, tokens)

    def plan(self, prompt: PromptShape | Sequence[int]):
        """The reuse plan a run of ``prompt`` now would carry out (:class:`~.reuse.plan.ReusePlan`),
        running nothing, loading no model and counting no miss. Safe beside a running prompt: it reads
        a copy of what the memory holds."""
        return self.planner.plan(PromptShape.coerce(prompt), self.memory.snapshot(), probe=True)

    def held(self, prompt: PromptShape | Sequence[int]) -> int:
        """How many tokens of ``prompt`` this engine's KV memory holds now, as the plan would use them
        (the disk aside): what a pool routes prompts by."""
        return self.planner.held(PromptShape.coerce(prompt), self.memory.snapshot())

    def reusable(self, prompt: PromptShape | Sequence[int]) -> int:
        """How many tokens of ``prompt`` a run now would reuse (memory, saved prefix states, section
        states): what a packer weighs candidate prompts by."""
        return self.plan(prompt).reused

    @property
    def composes(self) -> bool:
        """Whether sections-mode prompts are composed from section states now (the model shifts, the
        policy and its calibration allow it); where not, a packer puts held sections first."""
        return self.composition_refusal() is None

    def composition_refusal(self, *, calibrated: bool = True) -> Refusal | None:
        """The planner's answer to "may prompts be composed here" (:meth:`.reuse.planner.Planner.refusal`):
        why not, or None; ``calibrated=False``: whether they ever could be (the calibration aside). Loads
        nothing: before the model loads, its header says what its memory can do."""
        return self.planner.refusal(self.memory, calibrated=calibrated)

    @property
    def calibration(self) -> Calibration | None:
        """This model's composition calibration for the configured seams (None: not measured yet)."""
        return self.planner.calibration()

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

    def generate(self, prompt: PromptShape | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
                 cancel: CancelToken | None = None, exact: bool = False, preemptible: bool = False) -> Generation:
        """Stream the completion of ``prompt`` (a :class:`~pipeline.records.PromptShape`, or plain tokens
        that share nothing with other prompts); ``exact``: never composed (what a calibration compares
        composition against); ``preemptible``: background work, cancelled when a prompt queues.

        Generation ends at an end-of-generation token or one of ``stop_tokens``;
        ``progress(done, total)`` is called after each prefilled piece (tokens not reused);
        ``cancel`` takes the prompt out of the engine's queue, or stops its decode. What the
        prompt reuses is the planner's plan (:mod:`.reuse.planner`), carried out in the turn."""
        shape = PromptShape.coerce(prompt)
        if len(shape) + 1 > self.n_ctx:
            raise EngineError(f"the prompt has {len(shape):,} tokens; the context holds {self.n_ctx:,}")
        stats = stats or EngineStats()
        stats.prompt_tokens = len(shape)
        sampling = (temperature, repeat_penalty, self.settings.seed if seed is None else seed)
        run = self._run(shape, max_tokens, sampling, stats, frozenset(stop_tokens), progress, cancel, self.lock.epoch,
                        exact=exact, preemptible=preemptible)
        return Generation(self.lock.stream(run), stats)

    def _run(self, shape: PromptShape, max_tokens: int, sampling: tuple, stats: EngineStats,
             stop_tokens: frozenset[int] = frozenset(), progress: Callable[[int, int], None] | None = None,
             cancel: CancelToken | None = None, epoch: int | None = None, *, exact: bool = False,
             preemptible: bool = False) -> Iterator[str]:
        with self.turn(cancel, epoch, preemptible=preemptible):  # until the stream ends, is closed or collected
            try:
                started, record = self._start(shape, stats, progress, exact=exact)
                yield from self._decode(max_tokens, sampling, stats, stop_tokens, started, record)
            except EngineError:
                if self.lock.stopping:
                    self.memory.clear()  # the aborted micro-batch left the memory unknown
                    if self.lock.closing:
                        raise EngineClosed(_CLOSED) from None
                    raise Cancelled("cancelled while generating") from None
                raise
            finally:
                self._progress = None

    def _start(self, shape: PromptShape, stats: EngineStats, progress: Callable[[int, int], None] | None, *,
               exact: bool = False) -> tuple[tuple[float, float], calibrate.Recorder | None]:
        """Ask the planner for the prompt's plan, carry it out as planned (:func:`.reuse.execute.carry_out`),
        then prefill the rest. An exact prompt is always decoded in pieces split at its cuts and reuses
        state only up to a cut, so a reused or restored prefix leaves the computation exactly as it is
        without any cache. At least one token is always decoded: sampling needs its logits. Returns when
        it started and when its prefill did, and the recorder of a prompt whose answer calibrates
        composition (``exact``: never composed)."""
        llm = self.llm
        stats.load_seconds = self.load_seconds
        stats.notes.extend(self.notes)
        t0 = time.perf_counter()
        plan = self.planner.plan(shape, self.memory, need=Need.EXACT if exact else Need.ANSWER)
        started: list[float] = []

        def begin(reused: int | None) -> None:
            llm.synchronize()  # anything pending is booked before the counters restart
            llm.reset_timings()
            started.append(time.perf_counter())
            if progress is not None:
                progress(0, len(shape) - (reused or 0))
                if reused is not None:
                    self._progress = lambda position: progress(position - reused, len(shape) - reused)

        reused = carry_out(self.planner, plan, llm, self.memory, stats, self._prefill_piece, begin=begin)
        if progress is not None:
            self._progress = lambda position: progress(position - reused, len(shape) - reused)
        self.prefill(shape.tokens, start=len(self.memory.tokens))
        self._progress = None
        stats.prefill_tokens = len(shape) - reused
        stats.notes.extend(self.planner.prefix.store_notes(shape.prefix_len))
        return (t0, started[0]), (calibrate.Recorder(shape) if plan.calibrate else None)

    def _decode(self, max_tokens: int, sampling: tuple, stats: EngineStats, stop_tokens: frozenset[int],
                started: tuple[float, float], record: calibrate.Recorder | None = None) -> Iterator[str]:
        """Sample and decode token by token, streaming the text; the figures from llama.cpp's counters
        (``started``: when the prompt and its prefill started). ``record`` keeps the exact logits of the
        first positions, for a calibration once the answer is done."""
        from ._llama.composing import last_logits

        llm = self.llm
        t0, t_prefill = started
        held = self.memory.tokens
        sampler = llm.sampler(temperature=sampling[0], repeat_penalty=sampling[1], seed=sampling[2])
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n_out = 0
        t_first = None
        try:
            while n_out < max_tokens and len(held) < self.n_ctx:
                logits = last_logits(llm) if record is not None and not record.full else None
                token = sampler.sample()
                if logits is not None:
                    record.saw(logits, token)
                if t_first is None:
                    # llama.cpp books a batch's time when its outputs are first read: now.
                    t_first = time.perf_counter()
                    stats.ttft_seconds = t_first - t0
                    perf = llm.timings()
                    stats.prefill_seconds = (perf.prompt_ms / 1000 if perf.prompt_tokens
                                             else t_first - t_prefill)
                    if stats.prefill_seconds > 0:
                        stats.prefill_tokens_per_second = stats.prefill_tokens / stats.prefill_seconds
                    if stats.cache is not CacheKind.COMPOSED:
                        self.planner.speeds.saw(tokens=stats.prefill_tokens, seconds=stats.prefill_seconds)
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
            if record is not None and len(record.tokens) >= 2:
                self.pending_calibration = record  # measured once the answer is done (calibrate_pending)
        finally:
            sampler.close()
            # Book the last decode now, or llama.cpp would count it into the next prompt's prefill.
            llm.synchronize()
            perf = llm.timings()
            stats.decode_tokens = n_out
            stats.decode_seconds = perf.eval_ms / 1000
            if perf.eval_tokens and perf.eval_ms > 0:
                stats.decode_tokens_per_second = perf.eval_tokens / (perf.eval_ms / 1000)
            self.planner.keep_speeds()

    # -- calibrating composition -------------------------------------------------------------

    def calibrate_pending(self, *, cancel: CancelToken | None = None) -> Calibration | None:
        """Measure composition against the exact answer an earlier prompt recorded, if one is pending
        (:func:`.reuse.calibrate.run_pending`); the record now in force, or None."""
        return calibrate.run_pending(self, cancel=cancel)

    def calibrate(self, prompt: PromptShape, *, repeat_penalty: float, cancel: CancelToken | None = None,
                  progress: Callable[[int], None] | None = None) -> Calibration | None:
        """Answer ``prompt`` exactly (decoded with ``repeat_penalty``, as questions are), then measure
        composition on it (:func:`.reuse.calibrate.run_on`): one of the prompts warming calibrates by.
        ``progress(tokens)`` is told of the tokens computed as it goes."""
        return calibrate.run_on(self, prompt, repeat_penalty=repeat_penalty, cancel=cancel, progress=progress)

    # -- warming ------------------------------------------------------------------------------

    def warm(self, prompt: PromptShape) -> bool:
        """Prefill ``prompt``'s shared prefix and save its state (and states at its cuts, as :meth:`generate`
        does), unless it is already saved. True if the whole prefix was saved now."""
        stats = EngineStats()
        prefix_reuse = self.planner.prefix
        if not prompt.prefix or not prefix_reuse.uses_store(prompt.prefix_len) or prefix_reuse.has(prompt.prefix):
            return False
        with self.turn():
            self.llm  # noqa: B018 - loaded first
            plan = self.planner.plan(prompt, self.memory, need=Need.EXACT)
            done = prefix_reuse.prepare(plan.exact, prompt, self.memory, stats)
            return prompt.prefix_len in prefix_reuse.advance(done, prompt, self.memory, stats, self._prefill_piece)

    def warm_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]], *,
                      progress: Callable[[int], None] | None = None, cancel: CancelToken | None = None,
                      on_wait: Callable[[str], None] | None = None) -> dict:
        """Save the state of every section (token lists, each prefilled on its own after ``head``) that has
        none (:meth:`.reuse.sections.SectionReuse.warm`), giving the context to any prompt that queues
        meanwhile before the next section; ``cancel`` stops it within a micro-batch, keeping what is saved.
        ``progress(tokens)`` is told of the tokens of each section computed; ``on_wait(holder)`` that another
        process saves the same states and this one waits for it."""
        with self.turn(cancel):
            self.llm  # noqa: B018 - loaded: its memory's kind is llama.cpp's word
            self.planner.require_sections(self.memory)
        return self.planner.sections.warm(self.llm, self.memory, list(head), sections, self._prefill_piece, progress,
                                          turn=lambda: self.turn(cancel), give_way=lambda: self.lock.queued > 0,
                                          on_wait=on_wait, cancelled=lambda: cancel is not None and cancel.cancelled)

    def saved_sections(self, head: Sequence[int], sections: Sequence[Sequence[int]]) -> list[bool]:
        """Which of ``sections`` (token lists placed after ``head``) have a saved state (a look: nothing runs)."""
        return self.planner.sections.saved(list(head), sections)

    def section_state_bytes(self, n_tokens: int) -> int:
        """The bytes a section's saved state of ``n_tokens`` takes on disk: the model's header sized
        (:meth:`~.gguf.info.ModelInfo.state_bytes`) for the KV types the cache keeps section states in
        (:func:`.cache.sections.kept_types`), the code the footprint tables of docs/packing.md come from."""
        s, store = self.settings, self.planner.sections.store
        kept = kept_types(store.section_type if store is not None else "f16", s.type_k, s.type_v,
                          flash_attn=s.flash_attn)
        return self.info.state_bytes(n_tokens, *kept)

    # -- several prompts over one prefix ---------------------------------------------------------

    @property
    def n_seq_max(self) -> int:
        """How many sequences one decode can run (``engine.n_seq_max``; 1 for recurrent and hybrid
        models, whose memory cannot share a prefix between sequences)."""
        if self.settings.n_seq_max <= 1 or not self.memory_kind.shares_prefix:
            return 1
        return self.llm.n_seq_max

    def generate_many(self, prompts: Sequence[PromptShape], *, max_tokens: int = 256, temperature: float = 0.0,
                      repeat_penalty: float = 1.0, seed: int | None = None) -> list[Completion]:
        """Answer several prompts that share their prefix (the first one's cuts): the prefix is reused
        or prefilled once, and with ``n_seq_max`` > 1 the answers are decoded together, one decode call
        per step for all of them (:func:`.multiseq.answer_together`); else one after the other. Prompts
        the planner composes (sections-mode prompts whose section states it restores) are answered one
        after the other as planned: each keeps the sections the one before it composed."""
        from .multiseq import answer_together

        shapes = [PromptShape.coerce(p) for p in prompts]
        kw = dict(max_tokens=max_tokens, temperature=temperature, repeat_penalty=repeat_penalty, seed=seed)
        if not shapes:
            return []
        prefix = shapes[0].prefix
        shared = all(len(p) > len(prefix) and p.tokens[:len(prefix)] == prefix for p in shapes)
        if len(shapes) == 1 or not shared or not prefix or self.n_seq_max <= 1 or self.plan(shapes[0]).composed:
            return super().generate_many(shapes, **kw)
        return answer_together(self, shapes, **kw)

    # -- turns ----------------------------------------------------------------------------------

    def turn(self, cancel: CancelToken | None = None, epoch: int | None = None, *, preemptible: bool = False):
        """Hold the context (a ``with`` block): prompts queue behind it; ``preemptible``: a prompt that
        queues meanwhile cancels it (background work)."""
        return self.lock.hold(cancel, epoch, flag=lambda: self.llm.abort_flag(), preemptible=preemptible)

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
        self.memory.detach()
        if llm is not None:
            llm.close()


__all__ = ["Engine"]
