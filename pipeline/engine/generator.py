"""The generator: llama.cpp configured for fast prefill, with timings from llama.cpp's own counters.

Every setting that matters for prefill comes from :class:`~pipeline.config.EngineConfig`:
context length (clamped to the trained context unless RoPE scaling is set), batch
and micro-batch sizes, flash attention, KV cache types, GPU layers, threads, mmap,
and expert offload (see :mod:`.offload`). When experts are overridden to the CPU
the model loads without mmap, so that a GPU build can keep them in pinned memory.

Within one process the engine keeps what is in its KV cache and reuses the
longest common token prefix of the next prompt (exact, so lossless). Models
whose memory cannot be cut at an arbitrary position (recurrent and hybrid ones)
reuse only a saved prefix state (see :mod:`.cache`), or prefill in full.

A prompt may name *boundaries*: positions where its shared part can end (after
each document or section, and the whole prefix). The prompt is always decoded in
pieces split there, whether or not anything is cached, and state is reused, saved
and restored only there, so an answer from a reused state is token for token the
answer without one.
"""

from __future__ import annotations

import codecs
import threading
import time
import weakref
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from . import offload
from .host import detect_ram, usable_cpus
from .model_info import ModelInfo
from .stages import EngineStats, Generation
from .turns import CancelToken, FairLock, Revocable, once

if TYPE_CHECKING:
    from .multiseq import Completion
from ..config import EngineConfig
from ..errors import Cancelled, ConfigError, EngineClosed, EngineError


def resolve_overrides(settings: EngineConfig, n_layers: int) -> list[offload.Override]:
    """Tensor overrides in llama.cpp's order: explicit ``-ot`` patterns first, then expert offload."""
    out: list[offload.Override] = []
    if settings.override_tensors.strip():
        out += offload.parse_override(settings.override_tensors)
    if settings.cpu_moe:
        out += offload.cpu_moe()
    elif settings.n_cpu_moe:
        out += offload.n_cpu_moe(settings.n_cpu_moe, n_layers, which=settings.cpu_moe_from)
    return out


def render_chat(template: str, system: str, user: str, *, bos: str = "", eos: str = "") -> str:
    """``system`` and ``user`` through a chat template (Jinja, sandboxed), ready for the answer;
    a plain layout where the model has no template."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if not template:
        return f"{system}\n\n{user}\n\nAnswer:"
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=bos, eos_token=eos)


class Engine:
    """One generator model in llama.cpp. The model loads on first use.

    Safe to share between threads: prompts take turns on the one llama.cpp context, first
    come first served (a stream holds it from its first piece until it ends, is closed or
    is garbage-collected; see :mod:`.turns`), and a thread that starts a second prompt while
    it still reads the first gets an :class:`~pipeline.errors.EngineError` instead of a
    deadlock. A ``cancel`` token stops a waiting prompt, or a running one within one micro-batch.
    """

    def __init__(self, model_path: Path, settings: EngineConfig, *, log: Callable[[str], None] | None = None,
                 cache=None, cache_min_tokens: int = 256, boundary_states: int = 4):
        self.model_path = Path(model_path)
        self.settings = settings
        self.cache = cache  # a PrefixCache, or None
        self.cache_min_tokens = cache_min_tokens
        self.boundary_states = boundary_states  # states saved per prompt at boundaries before its prefix
        self._log = log or (lambda message: None)
        self._tokens: list[int] = []  # what the KV cache holds, position by position
        self.load_seconds = 0.0
        self.notes: list[str] = []  # about the model and settings: reported with every prompt
        self._prompt_notes: list[str] = []  # about the prompt being run: reported with it only
        # One llama.cpp context must never be used by two threads at once (llama.cpp aborts the
        # process): prompts take turns, each from its first token until its stream ends or closes.
        self._turns = FairLock()
        self._holder: int | None = None
        self._progress: Callable[[int], None] | None = None  # the running turn's prefill hook
        self._cancel: CancelToken | None = None  # the running turn's cancel token
        self._closing = False
        self._epoch = 0  # how many times close() ran: a stream made before a close never runs after it
        self._streams: "weakref.WeakSet[Revocable]" = weakref.WeakSet()  # what close() ends
        self._streams_mu = threading.Lock()

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
        """Keyword arguments of :func:`._llama.load` that these settings mean (see :func:`load_params`)."""
        return load_params(self.settings, n_ctx=self.n_ctx, overrides=self.overrides)

    def check_memory(self) -> None:
        """Refuse, with the setting to lower, a KV cache that cannot fit in this machine's memory."""
        from ._llama import supports_gpu_offload

        if supports_gpu_offload() and self.settings.gpu_layers != 0:
            return  # VRAM is checked by llama.cpp itself, which fails cleanly
        need = self.info.kv_bytes(self.n_ctx, self.settings.type_k, self.settings.type_v)
        try:
            avail = detect_ram(available=True)
        except ConfigError:  # no /proc/meminfo: llama.cpp's own allocation failure will have to do
            return
        if need > 0.9 * avail:
            raise EngineError(
                f"a context of {self.n_ctx:,} tokens needs about {need / 2**30:.1f} GiB of KV cache, more than "
                f"the {avail / 2**30:.1f} GiB of memory available: lower engine.n_ctx, or set engine.type_k "
                "and engine.type_v to q8_0 (half the size) or q4_0")

    @once  # two threads' first calls must not load it twice
    def llm(self):
        """The model in llama.cpp (a :class:`._llama.Model`), loaded on first use."""
        from ._llama import ModelLoadError, load

        if not self.info.causal:
            raise EngineError(f"{self.model_path.name} is an embedding (encoder) model ({self.info.arch}), "
                              "not a generator: set models.generator to a text-generation GGUF")
        self.check_memory()
        t0 = time.perf_counter()
        try:
            llm = load(self.model_path, **self.load_params())
        except ModelLoadError as exc:
            if "context" in exc.reason.lower():
                raise EngineError(
                    f"llama.cpp could not create a context of {self.n_ctx:,} tokens for {self.model_path.name}: "
                    "lower engine.n_ctx or engine.n_ubatch, use a smaller KV type (engine.type_k/type_v = q8_0), "
                    "or keep more experts on the CPU (engine.n_cpu_moe)") from None
            raise EngineError(f"llama.cpp could not load the generator {self.model_path}: {exc.reason}") from None
        self.load_seconds = time.perf_counter() - t0
        return llm

    @property
    def can_trim(self) -> bool:
        """Whether the KV memory can be cut at any position (false for recurrent and hybrid models)."""
        return self.llm.can_trim

    @cached_property
    def namespace(self) -> str:
        """The prefix cache's namespace: this model file and every setting that shapes its KV contents."""
        from .cache_keys import namespace
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

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

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

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """``messages`` rendered with the model's chat template (which must exist): where the
        default stops read the template's turn markers from (:mod:`pipeline.stops`)."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(self.info.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.llm.bos_text, eos_token=self.llm.eos_text)

    # -- running prompts ----------------------------------------------------------------------

    def _reset(self) -> None:
        self.llm.clear()
        self._tokens = []

    def _keep_prefix(self, tokens: Sequence[int], *, limit: int, cuts: Sequence[int] | None = None) -> int:
        """Keep the longest common prefix (at most ``limit`` tokens, ending at one of ``cuts`` when
        given) of the KV cache and ``tokens``."""
        n = 0
        limit = min(len(self._tokens), len(tokens), limit)
        while n < limit and self._tokens[n] == tokens[n]:
            n += 1
        if cuts is not None:
            n = max((c for c in cuts if c <= n), default=0)
        if n == len(self._tokens):
            return n
        if n and not self.can_trim:
            self._prompt_notes.append(f"this model's memory (recurrent/hybrid) cannot be cut at token {n}: "
                                      "only a saved prefix state can be reused")
        if n == 0 or not self.can_trim:
            self._reset()
            return 0
        if not self.llm.trim(n):  # e.g. sliding-window layers dropped cells
            self._prompt_notes.append(f"the KV memory could not be cut at token {n} (sliding window?): full prefill")
            self._reset()
            return 0
        del self._tokens[n:]
        return n

    def prefill(self, tokens: Sequence[int], *, start: int = 0) -> None:
        """Decode ``tokens[start:]`` in ``n_batch`` pieces, logits for the last token only."""
        import numpy as np

        llm = self.llm
        n_batch = llm.n_batch
        all_tokens = np.asarray(tokens, dtype=np.int32)
        for lo in range(start, len(tokens), n_batch):
            hi = min(lo + n_batch, len(tokens))
            try:
                llm.decode(all_tokens[lo:hi], lo)
            except EngineError as exc:
                self._reset()
                if self._stopping():
                    raise Cancelled(f"cancelled during the prefill, at token {lo:,}") from None
                raise EngineError(f"llama.cpp failed during prefill at token {lo}: {exc}") from None
            self._tokens.extend(tokens[lo:hi])
            if self._progress is not None:
                self._progress(len(self._tokens))

    def generate(self, tokens: Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, prefix_len: int = 0,
                 boundaries: Sequence[int] = (), stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
                 cancel: CancelToken | None = None) -> Generation:
        """Stream the completion of ``tokens``.

        Generation ends at an end-of-generation token or one of ``stop_tokens``;
        ``progress(done, total)`` is called after each prefilled piece (tokens not reused);
        ``cancel`` takes the prompt out of the engine's queue, or stops its decode.

        ``tokens[:prefix_len]`` is the part shared with other prompts, and ``boundaries``
        the earlier positions where a shared part may end (document and section ends).
        The KV cache's prefix in common with the previous prompt is reused up to the last
        such point; with a prefix cache, the longest state saved at one of them is
        restored from disk, and states are saved at the whole prefix and at up to
        ``boundary_states`` earlier boundaries (spread evenly) that were prefilled now.
        """
        if len(tokens) + 1 > self.n_ctx:
            raise EngineError(f"the prompt has {len(tokens):,} tokens; the context holds {self.n_ctx:,}")
        stats = stats or EngineStats()
        stats.prompt_tokens = len(tokens)
        sampling = (temperature, repeat_penalty, self.settings.seed if seed is None else seed)
        cuts = self._cuts(len(tokens), prefix_len, boundaries)
        pieces = Revocable(self._run(list(tokens), max_tokens, sampling, stats, cuts, frozenset(stop_tokens),
                                     progress, cancel, self._epoch), _CLOSED)
        with self._streams_mu:
            self._streams.add(pieces)
        return Generation(pieces, stats)

    @property
    def n_seq_max(self) -> int:
        """How many sequences one decode can run (``engine.n_seq_max``; 1 for recurrent and hybrid
        models, whose memory cannot share a prefix between sequences)."""
        if self.settings.n_seq_max <= 1 or not self.can_trim:
            return 1
        return self.llm.n_seq_max

    def generate_many(self, prompts: Sequence[Sequence[int]], *, prefix_len: int, boundaries: Sequence[int] = (),
                      max_tokens: int = 256, temperature: float = 0.0, repeat_penalty: float = 1.0,
                      seed: int | None = None) -> list["Completion"]:
        """Answer several ``prompts`` that share their first ``prefix_len`` tokens: the prefix is
        reused or prefilled once (as :meth:`generate` does, states saved at ``boundaries``), and with
        ``n_seq_max`` > 1 the answers are decoded together, one decode call per step for all of
        them (:mod:`.multiseq`); else one after the other. Greedy answers are the same either way
        with one thread; with several, llama.cpp's CPU kernels may round differently (see :mod:`.multiseq`).
        """
        from .multiseq import Completion, decode_together, groups

        prompts = [list(p) for p in prompts]
        if not prompts:
            return []
        head = prompts[0][:prefix_len]
        shared = all(len(p) > prefix_len and p[:prefix_len] == head for p in prompts)
        if len(prompts) == 1 or not shared or prefix_len <= 0 or self.n_seq_max <= 1:
            out = []
            for p in prompts:
                g = self.generate(p, max_tokens=max_tokens, temperature=temperature, repeat_penalty=repeat_penalty,
                                  seed=seed, prefix_len=prefix_len, boundaries=boundaries)
                out.append(Completion(g.read(), g.stats))
            return out
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
                                       max_tokens=max_tokens, sampling=sampling, decode=decode_together)
            for i, text, st in zip(group, texts, stats):
                results[i] = Completion(text, st)
        return results  # type: ignore[return-value]

    def _together(self, prompts: list[list[int]], stats: list[EngineStats], *, prefix_len: int,
                  boundaries: Sequence[int], max_tokens: int, sampling: tuple, decode) -> list[str]:
        """One group of :meth:`generate_many`, holding the context: the prefix into sequence 0, then ``decode``."""
        llm = self.llm
        cuts = self._cuts(len(prompts[0]), prefix_len, boundaries)
        first = stats[0]
        first.load_seconds = self.load_seconds
        t0 = time.perf_counter()
        reused = self._keep_prefix(prompts[0], limit=prefix_len, cuts=cuts)
        if reused:
            first.cache = "memory"
        disk = self._use_disk_cache(prefix_len)
        if disk and reused < prefix_len:
            reused = self._restore(prompts[0], cuts, reused, first)
        first.cached_tokens = reused
        first.notes.extend(self.notes + self._prompt_notes)
        self._prompt_notes = []
        self._advance(prompts[0], cuts, first, save=disk)
        llm.synchronize()
        first.prefill_seconds = time.perf_counter() - t0
        first.notes.extend(self._cache_notes(prefix_len))
        for st in stats[1:]:  # the prefix was reused from sequence 0
            st.cached_tokens, st.cache, st.notes = prefix_len, "memory", list(self.notes)
        try:
            texts, held = decode(llm, prompts, stats, prefix_len=prefix_len, max_tokens=max_tokens,
                                 n_ctx=self.n_ctx, sampling=sampling)
        except EngineError as exc:
            self._reset()
            raise EngineError(f"llama.cpp failed decoding {len(prompts)} sequences together: {exc}") from None
        self._tokens = held
        for i, st in enumerate(stats):
            st.prefill_tokens = len(prompts[i]) - (reused if i == 0 else prefix_len)
            if st.prefill_seconds > 0:
                st.prefill_tokens_per_second = st.prefill_tokens / st.prefill_seconds
        return texts

    @staticmethod
    def _cuts(n_tokens: int, prefix_len: int, boundaries: Sequence[int]) -> list[int]:
        """The split points: the boundaries within the prefix and the prefix's end, one token left to decode."""
        limit = min(prefix_len, n_tokens - 1)
        if limit <= 0:
            return []
        return sorted({int(b) for b in boundaries if 0 < b < limit} | {limit})

    def _use_disk_cache(self, prefix_len: int) -> bool:
        # Recurrent and hybrid models qualify too: states are saved and restored exactly at
        # boundaries, never cut afterwards; in memory such a model cannot drop a previous
        # question, so its next one restores the prefix from disk instead.
        return self.cache is not None and not self.cache.unavailable and prefix_len >= self.cache_min_tokens

    def _cache_notes(self, prefix_len: int) -> list[str]:
        """What the prefix cache has to say about this prompt: faults it handled, or why it was not used."""
        if self.cache is None:
            return []
        if self.cache.unavailable and prefix_len >= self.cache_min_tokens:
            return [f"the prefix cache is unavailable ({self.cache.unavailable}): answered without it"]
        return self.cache.take_notes()

    def _restore(self, tokens: list[int], cuts: Sequence[int], reused: int, stats: EngineStats) -> int:
        """Load the longest state saved at one of ``cuts`` if it beats what the KV cache already holds."""
        entry = self.cache.lookup(self.namespace, tokens, max_tokens=cuts[-1], lengths=set(cuts),
                                  min_tokens=max(reused + 1, self.cache_min_tokens))
        if entry is None:
            if self.cache.last_error:
                stats.notes.append(self.cache.last_error)
            if reused < cuts[-1]:
                stats.cache = "miss"
            return reused
        self._reset()
        if not self.cache.load(entry, self.llm):
            stats.notes.append(f"a cached prefix state was ignored and deleted: {self.cache.last_error}")
            stats.cache = "miss"
            self._reset()
            return 0
        self._tokens = list(tokens[:entry.n_tokens])
        stats.cache = "disk"
        stats.cache_load_seconds = self.cache.last_load_seconds
        return entry.n_tokens

    def _save(self, prefix: list[int], stats: EngineStats | None = None):
        """Save the state of ``prefix`` (what the KV cache holds now) and return its entry; a failure
        costs a note, never the answer."""
        if self.cache.read_only:  # said once, when the cache was opened
            return None
        entry = self.cache.save(self.namespace, prefix, self.llm)
        if entry is None and self.cache.last_error and stats is not None:
            stats.notes.append(f"prefix state not saved: {self.cache.last_error}")
        return entry

    def _save_points(self, cuts: Sequence[int], start: int) -> set[int]:
        """The cuts after ``start`` to save a state at: the last, and at most ``boundary_states`` others,
        spread evenly from the first; none shorter than ``cache_min_tokens``."""
        eligible = [c for c in cuts if c > start and c >= self.cache_min_tokens]
        if not eligible:
            return set()
        out = {cuts[-1]} & set(eligible)
        inner = [c for c in eligible if c != cuts[-1]]
        k = self.boundary_states
        if len(inner) <= k:
            out.update(inner)
        elif k == 1:
            out.add(inner[len(inner) // 2])
        elif k > 1:
            out.update(inner[round(i * (len(inner) - 1) / (k - 1))] for i in range(k))
        return out

    def _advance(self, tokens: Sequence[int], cuts: Sequence[int], stats: EngineStats, *, save: bool) -> set[int]:
        """Prefill from what the KV cache holds up to the last cut, piece by piece at every cut,
        saving states where :meth:`_save_points` says. Returns the cuts saved now."""
        saved: set[int] = set()
        points = self._save_points(cuts, len(self._tokens)) if save else set()
        for cut in cuts:
            if cut <= len(self._tokens):
                continue
            self.prefill(tokens[:cut], start=len(self._tokens))
            if cut not in points:
                continue
            self.llm.synchronize()  # the prefill is booked as prefill, the save is not
            t0, wall = time.perf_counter(), time.time()
            entry = self._save(tokens[:cut], stats)
            stats.cache_save_seconds += time.perf_counter() - t0
            if entry is not None and entry.created >= wall:  # not one saved before (save then only marks it used)
                stats.states_saved += 1
                saved.add(cut)
        return saved

    def held(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = ()) -> int:
        """How many tokens of this prompt this engine's KV memory holds now, up to a point where
        :meth:`generate` may reuse them (the disk cache aside): what a pool routes prompts by.
        Safe beside a running prompt: it reads a copy of what the memory holds."""
        return self._held(list(self._tokens), tokens, self._cuts(len(tokens), prefix_len, boundaries))

    def _held(self, memory: list[int], tokens: Sequence[int], cuts: Sequence[int]) -> int:
        if not cuts:
            return 0
        n, limit = 0, min(len(memory), cuts[-1])
        while n < limit and memory[n] == tokens[n]:
            n += 1
        reuse = max((c for c in cuts if c <= n), default=0)
        if reuse != len(memory) and "llm" in self.__dict__ and not self.can_trim:
            return 0
        return reuse

    def reusable(self, tokens: Sequence[int], *, prefix_len: int, boundaries: Sequence[int] = ()) -> int:
        """How many tokens of this prompt :meth:`generate` would reuse now (memory or disk), without
        running anything or loading the model: what a packer weighs candidate prompts by."""
        cuts = self._cuts(len(tokens), prefix_len, boundaries)
        if not cuts:
            return 0
        memory = self._held(list(self._tokens), tokens, cuts)  # a copy: a running prompt may change it
        if self.cache is None or cuts[-1] < self.cache_min_tokens or memory == cuts[-1]:
            return memory
        entry = self.cache.lookup(self.namespace, tokens, max_tokens=cuts[-1], lengths=set(cuts),
                                  min_tokens=max(memory + 1, self.cache_min_tokens), count=False)
        return entry.n_tokens if entry is not None else memory

    @contextmanager
    def _turn(self, cancel: CancelToken | None = None, epoch: int | None = None) -> Iterator[None]:
        """Hold the llama.cpp context: other threads wait (first come, first served); the holding
        thread may not start a second prompt. ``cancel`` aborts what runs in the turn; a stream
        made before the engine was closed (``epoch``) never gets a turn after it."""
        me = threading.get_ident()
        if self._holder == me:
            raise EngineError("this thread is still reading an earlier answer from this engine: finish it "
                              "(or close its stream) before starting another")
        self._turns.acquire(cancel=cancel)
        if self._closing or (epoch is not None and epoch != self._epoch):
            self._turns.release()
            raise EngineClosed(_CLOSED)
        self._holder, self._cancel = me, cancel
        flag = self.llm.abort_flag() if cancel is not None else None
        unregister = cancel.on_cancel(flag.set) if flag is not None else (lambda: None)
        try:
            yield
        finally:
            unregister()
            if flag is not None and not self._closing:  # close() keeps it set until it holds the context
                flag.clear()
            self._holder = self._cancel = None
            self._progress = None
            self._turns.release()

    @property
    def waiting(self) -> int:
        """Prompts queued for this engine, the running one included (what a pool balances by)."""
        return self._turns.waiting + self._turns.locked

    def warm(self, prefix: Sequence[int], *, boundaries: Sequence[int] = ()) -> bool:
        """Prefill ``prefix`` and save its state (and states at ``boundaries``, as :meth:`generate`
        does), unless it is already saved. True if the whole prefix was saved now."""
        stats = EngineStats()
        prefix = list(prefix)
        if not prefix or not self._use_disk_cache(len(prefix)):
            return False
        if self.cache.lookup(self.namespace, prefix, max_tokens=len(prefix), min_tokens=len(prefix), count=False):
            return False
        cuts = sorted({int(b) for b in boundaries if 0 < b < len(prefix)} | {len(prefix)})
        with self._turn():
            reused = self._keep_prefix(prefix, limit=len(prefix), cuts=cuts)
            if reused < len(prefix):
                self._restore(prefix, cuts, reused, stats)
            return len(prefix) in self._advance(prefix, cuts, stats, save=True)

    def _run(self, tokens: list[int], max_tokens: int, sampling: tuple, stats: EngineStats,
             cuts: list[int], stop_tokens: frozenset[int] = frozenset(),
             progress: Callable[[int, int], None] | None = None,
             cancel: CancelToken | None = None, epoch: int | None = None) -> Iterator[str]:
        with self._turn(cancel, epoch):  # from the first piece until the stream ends, is closed or is collected
            try:
                yield from self._run_turn(tokens, max_tokens, sampling, stats, cuts, stop_tokens, progress)
            except EngineError:
                if self._stopping():
                    self._reset()  # the aborted micro-batch left the memory unknown
                    if self._closing:
                        raise EngineClosed(_CLOSED) from None
                    raise Cancelled("cancelled while generating") from None
                raise

    def _stopping(self) -> bool:
        """Whether the running turn was asked to stop (its cancel token, or :meth:`close`)."""
        return self._closing or (self._cancel is not None and self._cancel.cancelled)

    def _run_turn(self, tokens: list[int], max_tokens: int, sampling: tuple, stats: EngineStats,
                  cuts: list[int], stop_tokens: frozenset[int] = frozenset(),
                  progress: Callable[[int, int], None] | None = None) -> Iterator[str]:
        llm = self.llm
        stats.load_seconds = self.load_seconds
        t0 = time.perf_counter()
        # The prompt is always decoded in pieces split at the cuts, and state is reused only
        # up to a cut: a reused or restored prefix then leaves the computation exactly as
        # it is without any cache, so greedy answers match token for token. Without cuts
        # (no shared prefix named), any common prefix with the KV cache is reused.
        # At least one token is always decoded: sampling needs its logits.
        prefix_len = cuts[-1] if cuts else 0
        reused = self._keep_prefix(tokens, limit=prefix_len or len(tokens) - 1, cuts=cuts or None)
        if reused:
            stats.cache = "memory"
        disk = self._use_disk_cache(prefix_len)
        if disk and reused < prefix_len:
            reused = self._restore(tokens, cuts, reused, stats)
        stats.cached_tokens = reused
        stats.notes.extend(self.notes + self._prompt_notes)
        self._prompt_notes = []
        llm.synchronize()  # anything pending is booked before the counters restart
        llm.reset_timings()
        t_prefill = time.perf_counter()
        if progress is not None:
            self._progress = lambda position: progress(position - reused, len(tokens) - reused)
            progress(0, len(tokens) - reused)
        self._advance(tokens, cuts, stats, save=disk)
        self.prefill(tokens, start=len(self._tokens))
        self._progress = None
        stats.prefill_tokens = len(tokens) - reused
        stats.notes.extend(self._cache_notes(prefix_len))

        sampler = llm.sampler(temperature=sampling[0], repeat_penalty=sampling[1], seed=sampling[2])
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        n_out = 0
        t_first = None
        try:
            while n_out < max_tokens and len(self._tokens) < self.n_ctx:
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
                llm.decode_token(token, len(self._tokens))
                self._tokens.append(token)
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

    def close(self) -> None:
        """Free the model, ending this engine's unfinished streams first, on any thread: one paused
        between two pieces (or not started yet) ends now; a running prefill or decode stops within
        one micro-batch; a prompt queued for the engine leaves the queue. Each raises
        :class:`~pipeline.errors.EngineClosed` (a :class:`~pipeline.errors.Cancelled`) at its next read. Called from inside a running turn of
        this thread (a progress callback), it cannot wait for that turn and leaves the model."""
        self._epoch += 1
        self._closing = True
        if "llm" in self.__dict__:
            self.llm.abort_flag().set()
        try:
            deadline = time.monotonic() + 30
            while True:
                with self._streams_mu:
                    streams = list(self._streams)
                for stream in streams:
                    stream.revoke()  # a paused one gives the context back here, in this thread
                if self._turns.acquire(timeout=0.05):
                    break
                if self._holder == threading.get_ident() or time.monotonic() > deadline:
                    return
        finally:
            if "llm" in self.__dict__:
                self.llm.abort_flag().clear()
            self._closing = False
        try:
            self._close()
        finally:
            self._turns.release()

    def _close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        self._tokens = []
        if llm is not None:
            llm.close()


_CLOSED = ("the engine was closed (Pipeline.close) before this answer was finished; "
           "ask again with an open pipeline")


def load_params(settings: EngineConfig, *, n_ctx: int, overrides: Sequence[offload.Override] = ()) -> dict:
    """The keyword arguments of :func:`._llama.load` that engine ``settings`` mean at context ``n_ctx``.

    The one translation of settings into llama.cpp's: batch sizes within the context,
    threads (0: every usable core), KV types, RoPE scaling, and mmap off where tensors
    are overridden (so that a GPU build can pin them for fast copies).
    """
    s = settings
    cpus = usable_cpus()  # more threads than cores only wait at ggml's barriers (10-50x slower decodes)
    threads = min(s.threads, cpus) if s.threads else cpus
    return dict(
        n_ctx=n_ctx, n_batch=min(s.n_batch, n_ctx), n_ubatch=min(s.n_ubatch, s.n_batch, n_ctx),
        threads=threads, threads_batch=min(s.threads_batch, cpus) if s.threads_batch else threads,
        flash_attn=s.flash_attn,
        type_k=s.type_k, type_v=s.type_v, gpu_layers=s.gpu_layers, seed=s.seed,
        mmap=s.mmap and not overrides, rope_scaling=s.rope_scaling, rope_freq_scale=s.rope_freq_scale,
        overrides=list(overrides), n_seq_max=max(1, s.n_seq_max),
    )
