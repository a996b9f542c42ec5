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
"""

from __future__ import annotations

import codecs
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator, Sequence

from . import offload
from ._gguf import read_header
from ..config import EngineConfig
from ..errors import EngineError
from ..planner.spec import KV_TYPE_IDS, type_bytes


@dataclass
class EngineStats:
    """What one prompt cost, mostly from llama.cpp's own performance counters."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens_per_second: float = 0.0
    ttft_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_tokens_per_second: float = 0.0
    load_seconds: float = 0.0
    cache: str = "none"  # none | memory (kept in the KV cache) | disk (restored) | miss
    cache_load_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return d


@dataclass(frozen=True)
class ModelInfo:
    """Facts about a GGUF read from its header, without loading weights."""

    path: Path
    arch: str
    n_layers: int
    n_ctx_train: int
    n_embd: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_experts: int
    kv_layers: int
    chat_template: str | None
    causal: bool  # False for encoders (embedding models), which cannot generate

    @classmethod
    def read(cls, path: Path) -> "ModelInfo":
        h = read_header(path, tensors=False)
        n_layers = int(h.get("block_count", 0) or 0)
        n_embd = int(h.get("embedding_length", 0) or 0)
        n_head = _scalar(h.get("attention.head_count", 1))
        n_head_kv = h.get("attention.head_count_kv", n_head)
        kv_layers = n_layers
        if isinstance(n_head_kv, list):  # per-layer counts: layers with 0 KV heads keep no cache
            kv_layers = sum(1 for v in n_head_kv if v)
            n_head_kv = max(n_head_kv) if n_head_kv else 0
        interval = h.get("full_attention_interval")
        if isinstance(interval, int) and interval > 0:
            kv_layers = n_layers // interval
        head_dim = n_embd // max(n_head, 1)
        return cls(
            path=path, arch=h.arch, n_layers=n_layers, n_ctx_train=int(h.get("context_length", 0) or 0),
            n_embd=n_embd, n_head_kv=int(n_head_kv or 0),
            head_dim_k=int(h.get("attention.key_length", head_dim) or head_dim),
            head_dim_v=int(h.get("attention.value_length", head_dim) or head_dim),
            n_experts=int(h.get("expert_count", 0) or 0), kv_layers=kv_layers,
            chat_template=h.metadata.get("tokenizer.chat_template"),
            causal=h.get("attention.causal", True) is not False,
        )

    def kv_bytes(self, n_ctx: int, type_k: str, type_v: str) -> int:
        per_token = self.kv_layers * self.n_head_kv * (
            type_bytes(self.head_dim_k, type_k) + type_bytes(self.head_dim_v, type_v))
        return per_token * n_ctx


def _scalar(value) -> int:
    if isinstance(value, list):
        return int(max(value)) if value else 0
    return int(value or 0)


def mem_available() -> int | None:
    """Bytes of memory available to new allocations (Linux), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


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


class Generation:
    """A streamed completion: iterate for text pieces; ``stats`` is complete once iteration ends."""

    def __init__(self, pieces: Iterator[str], stats: EngineStats):
        self._pieces = pieces
        self.stats = stats
        self.text = ""

    def __iter__(self) -> Iterator[str]:
        for piece in self._pieces:
            self.text += piece
            yield piece

    def read(self) -> str:
        for _ in self:
            pass
        return self.text

    def close(self) -> None:
        """Stop generating now (the engine's sampler and counters are settled before this returns)."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


class Engine:
    """One generator model in llama.cpp. The model loads on first use."""

    def __init__(self, model_path: Path, settings: EngineConfig, *, log: Callable[[str], None] | None = None,
                 cache=None, cache_min_tokens: int = 256):
        self.model_path = Path(model_path)
        self.settings = settings
        self.cache = cache  # a PrefixCache, or None
        self.cache_min_tokens = cache_min_tokens
        self._log = log or (lambda message: None)
        self._tokens: list[int] = []  # what the KV cache holds, position by position
        self.load_seconds = 0.0
        self.notes: list[str] = []  # about the model and settings: reported with every prompt
        self._prompt_notes: list[str] = []  # about the prompt being run: reported with it only

    # -- model facts and settings ---------------------------------------------------------------

    @cached_property
    def info(self) -> ModelInfo:
        return ModelInfo.read(self.model_path)

    @cached_property
    def n_ctx(self) -> int:
        """The context length used: the configured one, clamped to the trained one without RoPE scaling."""
        s, trained = self.settings, self.info.n_ctx_train
        want = s.n_ctx or trained
        if trained and want > trained and s.rope_scaling in ("", "none"):
            note = (f"engine.n_ctx {want} is above the model's trained context {trained}: using {trained} "
                    "(set engine.rope_scaling to extend it)")
            self._log("warning: " + note)
            self.notes.append(note)
            want = trained
        return want

    @cached_property
    def overrides(self) -> list[offload.Override]:
        return resolve_overrides(self.settings, self.info.n_layers)

    @property
    def use_mmap(self) -> bool:
        # Overridden tensors load without mmap so that a GPU build can pin them for fast copies.
        return self.settings.mmap and not self.overrides

    def llama_kwargs(self) -> dict:
        """Keyword arguments for ``llama_cpp.Llama`` that these settings imply."""
        import llama_cpp

        from .embed import usable_cpus

        s = self.settings
        threads = s.threads or usable_cpus()
        kwargs = dict(
            n_ctx=self.n_ctx, n_batch=min(s.n_batch, self.n_ctx), n_ubatch=min(s.n_ubatch, s.n_batch, self.n_ctx),
            n_threads=threads, n_threads_batch=s.threads_batch or threads, flash_attn=s.flash_attn,
            type_k=KV_TYPE_IDS[s.type_k], type_v=KV_TYPE_IDS[s.type_v], n_gpu_layers=s.gpu_layers,
            seed=s.seed, use_mmap=self.use_mmap, verbose=False,
        )
        if s.rope_scaling in ("linear", "yarn"):
            kwargs["rope_scaling_type"] = (llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN if s.rope_scaling == "yarn"
                                           else llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR)
            if s.rope_freq_scale:
                kwargs["rope_freq_scale"] = s.rope_freq_scale
        return kwargs

    def check_memory(self) -> None:
        """Refuse, with the setting to lower, a KV cache that cannot fit in this machine's memory."""
        import llama_cpp

        if llama_cpp.llama_supports_gpu_offload() and self.settings.gpu_layers != 0:
            return  # VRAM is checked by llama.cpp itself, which fails cleanly
        need = self.info.kv_bytes(self.n_ctx, self.settings.type_k, self.settings.type_v)
        avail = mem_available()
        if avail is not None and need > 0.9 * avail:
            raise EngineError(
                f"a context of {self.n_ctx:,} tokens needs about {need / 2**30:.1f} GiB of KV cache, more than "
                f"the {avail / 2**30:.1f} GiB of memory available: lower engine.n_ctx, or set engine.type_k "
                "and engine.type_v to q8_0 (half the size) or q4_0")

    @cached_property
    def llm(self):
        from ._llama import load_llama

        if not self.info.causal:
            raise EngineError(f"{self.model_path.name} is an embedding (encoder) model ({self.info.arch}), "
                              "not a generator: set models.generator to a text-generation GGUF")
        self.check_memory()
        t0 = time.perf_counter()
        try:
            llm = load_llama(self.model_path, overrides=self.overrides, **self.llama_kwargs())
        except EngineError as exc:
            text = str(exc)
            if "context" in text.lower():
                raise EngineError(
                    f"llama.cpp could not create a context of {self.n_ctx:,} tokens for {self.model_path.name}: "
                    "lower engine.n_ctx or engine.n_ubatch, use a smaller KV type (engine.type_k/type_v = q8_0), "
                    "or keep more experts on the CPU (engine.n_cpu_moe)") from None
            raise EngineError(f"llama.cpp could not load the generator {self.model_path}: {text}") from None
        self.load_seconds = time.perf_counter() - t0
        return llm

    @cached_property
    def abort(self):
        """This context's abort flag: set, it stops the running decode (see ``_llama.AbortFlag``)."""
        from ._llama import AbortFlag

        return AbortFlag(self.llm._ctx.ctx)

    @cached_property
    def _vocab(self):
        import llama_cpp

        return llama_cpp.llama_model_get_vocab(self.llm._model.model)

    @cached_property
    def can_trim(self) -> bool:
        """Whether the KV memory can be cut at any position (false for recurrent and hybrid models)."""
        import llama_cpp

        model = self.llm._model.model
        return not (llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))

    @cached_property
    def namespace(self) -> str:
        """The prefix cache's namespace: this model file and every setting that shapes its KV contents."""
        from .cache import namespace
        from ..models import file_identity

        s = self.settings
        return namespace(file_identity(self.model_path), n_ctx=self.n_ctx, type_k=s.type_k, type_v=s.type_v,
                         flash_attn=s.flash_attn, rope_scaling=s.rope_scaling, rope_freq_scale=s.rope_freq_scale)

    # -- text ---------------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Tokens of ``text``, special tokens (chat markup) parsed as such."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenize(text))

    @property
    def bos(self) -> list[int]:
        """The BOS token if the model wants one at the start of a prompt."""
        m = self.llm._model
        return [m.token_bos()] if m.add_bos_token() and m.token_bos() >= 0 else []

    def chat(self, system: str, user: str) -> str:
        """``system`` and ``user`` rendered with the model's chat template, ready for the answer."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        if not self.info.chat_template:
            return f"{system}\n\n{user}\n\nAnswer:"
        return self.render(messages)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """``messages`` rendered with the model's chat template (which must exist)."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        m = self.llm._model
        return env.from_string(self.info.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=m.token_get_text(m.token_bos()) if m.token_bos() >= 0 else "",
            eos_token=m.token_get_text(m.token_eos()) if m.token_eos() >= 0 else "",
        )

    # -- running prompts ----------------------------------------------------------------------

    def _reset(self) -> None:
        import llama_cpp

        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm._ctx.ctx), True)
        self._tokens = []

    def _keep_prefix(self, tokens: Sequence[int], *, limit: int) -> int:
        """Keep the longest common prefix (at most ``limit`` tokens) of the KV cache and ``tokens``."""
        import llama_cpp

        n = 0
        limit = min(len(self._tokens), len(tokens), limit)
        while n < limit and self._tokens[n] == tokens[n]:
            n += 1
        if n == len(self._tokens):
            return n
        if n and not self.can_trim:
            self._prompt_notes.append(f"this model's memory (recurrent/hybrid) cannot be cut at token {n}: "
                              "only a saved prefix state can be reused")
        if n == 0 or not self.can_trim:
            self._reset()
            return 0
        mem = llama_cpp.llama_get_memory(self.llm._ctx.ctx)
        if not llama_cpp.llama_memory_seq_rm(mem, 0, n, -1):  # e.g. sliding-window layers dropped cells
            self._prompt_notes.append(f"the KV memory could not be cut at token {n} (sliding window?): full prefill")
            self._reset()
            return 0
        del self._tokens[n:]
        return n

    @cached_property
    def _batch_arrays(self):
        """NumPy views of the llama_batch's token, position and logits arrays (filled without a Python loop)."""
        import numpy as np

        llm = self.llm
        raw, n = llm._batch.batch, llm.n_batch
        for i in range(n):  # one sequence, id 0, for every slot
            raw.n_seq_id[i] = 1
            raw.seq_id[i][0] = 0
        views = tuple(np.ctypeslib.as_array(ptr, shape=(n,)) for ptr in (raw.token, raw.pos, raw.logits))
        return (*views, np.arange(n, dtype=np.int32))

    def prefill(self, tokens: Sequence[int], *, start: int = 0,
                progress: Callable[[int], None] | None = None) -> None:
        """Decode ``tokens[start:]`` in ``n_batch`` pieces, logits for the last token only.

        ``progress(position)`` is called after each piece with the tokens in the KV cache.
        """
        import numpy as np

        llm = self.llm
        batch, n_batch = llm._batch, llm.n_batch
        tok, pos, logits, ramp = self._batch_arrays
        all_tokens = np.asarray(tokens, dtype=np.int32)
        for lo in range(start, len(tokens), n_batch):
            n = min(n_batch, len(tokens) - lo)
            tok[:n] = all_tokens[lo:lo + n]
            pos[:n] = ramp[:n] + lo
            logits[:n] = 0
            logits[n - 1] = 1
            batch.batch.n_tokens = n
            try:
                llm._ctx.decode(batch)
            except RuntimeError as exc:
                self._reset()
                raise EngineError(f"llama.cpp failed during prefill at token {lo}: {exc}") from None
            self._tokens.extend(tokens[lo:lo + n])
            if progress is not None:
                progress(lo + n)

    def generate(self, tokens: Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, prefix_len: int = 0,
                 stats: EngineStats | None = None, stop_tokens: Sequence[int] = (),
                 progress: Callable[[int, int], None] | None = None) -> Generation:
        """Stream the completion of ``tokens``.

        The KV cache's common prefix with the previous prompt is reused; with a prefix
        cache, ``tokens[:prefix_len]`` (the part shared by other prompts) is restored from
        disk when saved before, and saved after prefill when not.
        """
        if len(tokens) + 1 > self.n_ctx:
            raise EngineError(f"the prompt has {len(tokens):,} tokens; the context holds {self.n_ctx:,}")
        stats = stats or EngineStats()
        stats.prompt_tokens = len(tokens)
        sampling = (temperature, repeat_penalty, self.settings.seed if seed is None else seed)
        return Generation(self._run(list(tokens), max_tokens, sampling, stats, prefix_len,
                                    frozenset(stop_tokens), progress), stats)

    def _use_disk_cache(self, prefix_len: int, stats: EngineStats) -> bool:
        # Recurrent and hybrid models qualify too: states are saved and restored exactly at the
        # prefix boundary, never cut afterwards; in memory such a model cannot drop a previous
        # question, so its next one restores the prefix from disk instead.
        return self.cache is not None and prefix_len >= self.cache_min_tokens

    def _restore(self, tokens: list[int], prefix_len: int, reused: int, stats: EngineStats) -> int:
        """Load the longest saved prefix of ``tokens`` if it beats what the KV cache already holds."""
        entry = self.cache.lookup(self.namespace, tokens, max_tokens=len(tokens) - 1,
                                  min_tokens=max(reused + 1, self.cache_min_tokens))
        if entry is None:
            if reused < prefix_len:
                stats.cache = "miss"
            return reused
        self._reset()
        if not self.cache.load(entry, self.llm._ctx.ctx):
            stats.notes.append(f"a cached prefix state was ignored and deleted: {self.cache.last_error}")
            stats.cache = "miss"
            self._reset()
            return 0
        self._tokens = list(tokens[:entry.n_tokens])
        stats.cache = "disk"
        stats.cache_load_seconds = self.cache.last_load_seconds
        return entry.n_tokens

    def warm(self, prefix: Sequence[int]) -> bool:
        """Prefill ``prefix`` and save its state, unless it is already saved. True if it was saved now."""
        stats = EngineStats()
        if not self._use_disk_cache(len(prefix), stats):
            return False
        prefix = list(prefix)
        if self.cache.lookup(self.namespace, prefix, max_tokens=len(prefix), min_tokens=len(prefix)):
            return False
        self._keep_prefix(prefix, limit=len(prefix))
        self.prefill(prefix, start=len(self._tokens))
        return self.cache.save(self.namespace, prefix, self.llm._ctx.ctx) is not None

    def _run(self, tokens: list[int], max_tokens: int, sampling: tuple, stats: EngineStats,
             prefix_len: int = 0, stop_tokens: frozenset[int] = frozenset(),
             progress: Callable[[int, int], None] | None = None) -> Iterator[str]:
        import llama_cpp

        llm = self.llm
        stats.load_seconds = self.load_seconds
        ctx = llm._ctx.ctx
        t0 = time.perf_counter()
        # The prompt is always decoded in two parts split at prefix_len, and nothing past
        # prefix_len is reused: a restored or reused prefix then leaves the computation
        # exactly as it is without any cache, so greedy answers match token for token.
        # At least one token is always decoded: sampling needs its logits.
        reused = self._keep_prefix(tokens, limit=min(prefix_len or len(tokens), len(tokens) - 1))
        if reused:
            stats.cache = "memory"
        disk = self._use_disk_cache(prefix_len, stats)
        if disk and reused < prefix_len:
            reused = self._restore(tokens, prefix_len, reused, stats)
        stats.cached_tokens = reused
        stats.notes.extend(self.notes + self._prompt_notes)
        self._prompt_notes = []
        llama_cpp.llama_synchronize(ctx)  # anything pending is booked before the counters restart
        llama_cpp.llama_perf_context_reset(ctx)
        t_prefill = time.perf_counter()

        def done(position: int) -> None:  # progress as (tokens prefilled, tokens to prefill)
            if progress is not None:
                progress(position - reused, len(tokens) - reused)

        done(reused)
        if len(self._tokens) < prefix_len:
            self.prefill(tokens[:prefix_len], start=len(self._tokens), progress=done)
            if disk and self.cache.save(self.namespace, tokens[:prefix_len], ctx) is None and self.cache.last_error:
                stats.notes.append(f"prefix state not saved: {self.cache.last_error}")
        self.prefill(tokens, start=len(self._tokens), progress=done)
        stats.prefill_tokens = len(tokens) - reused

        sampler = self._sampler(*sampling)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        batch = llm._batch
        n_out = 0
        t_first = None
        try:
            while n_out < max_tokens and len(self._tokens) < self.n_ctx:
                token = llama_cpp.llama_sampler_sample(sampler, ctx, -1)
                if t_first is None:
                    # llama.cpp books a batch's time when its outputs are first read: now.
                    t_first = time.perf_counter()
                    stats.ttft_seconds = t_first - t0
                    perf = llama_cpp.llama_perf_context(ctx)
                    stats.prefill_seconds = (perf.t_p_eval_ms / 1000 if perf.n_p_eval
                                             else t_first - t_prefill)
                    if stats.prefill_seconds > 0:
                        stats.prefill_tokens_per_second = stats.prefill_tokens / stats.prefill_seconds
                if llama_cpp.llama_vocab_is_eog(self._vocab, token) or token in stop_tokens:
                    break
                n_out += 1
                text = decoder.decode(self._piece(token))
                batch.set_batch([token], n_past=len(self._tokens), logits_all=True)
                llm._ctx.decode(batch)
                self._tokens.append(token)
                if text:
                    yield text
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
        finally:
            llama_cpp.llama_sampler_free(sampler)
            # Book the last decode now, or llama.cpp would count it into the next prompt's prefill.
            llama_cpp.llama_synchronize(ctx)
            perf = llama_cpp.llama_perf_context(ctx)
            stats.decode_tokens = n_out
            stats.decode_seconds = perf.t_eval_ms / 1000
            if perf.n_eval and perf.t_eval_ms > 0:
                stats.decode_tokens_per_second = perf.n_eval / (perf.t_eval_ms / 1000)

    def _piece(self, token: int) -> bytes:
        import ctypes

        import llama_cpp

        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def _sampler(self, temperature: float, repeat_penalty: float, seed: int):
        import llama_cpp

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if repeat_penalty != 1.0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_penalties(
                self.llm._model.n_vocab(), 256, repeat_penalty, 0.0, 0.0))
        if temperature <= 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(40))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(0.95, 1))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
        return chain

    def close(self) -> None:
        llm = self.__dict__.pop("llm", None)
        self.__dict__.pop("_vocab", None)
        self.__dict__.pop("can_trim", None)
        self._tokens = []
        if llm is not None:
            llm.close()
