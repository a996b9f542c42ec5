"""Several prompts that share a prefix, decoded together: one ``llama_decode`` per step for all of them.

A context made with ``engine.n_seq_max`` > 1 holds that many sequences over one
unified KV cache. The shared prefix is prefilled once, into sequence 0, and given to
the other sequences by :meth:`._llama.Model.seq_copy` (in a unified cache the cells
are shared, so this costs neither memory nor compute); each sequence's own suffix is
decoded into it, and from then on every step decodes one token of every unfinished
sequence in a single batch, each sampled by its own sampler from its own row of
logits.

Why it helps: a decode step of one token is bound by reading the weights (and on a
GPU by per-kernel launch costs), not by arithmetic, so ``k`` tokens in one step cost
little more than one.

When the answers are the same as one prompt at a time: the shared cells are the very
cells a lone prompt would have, and each row of a batch is computed on its own, so
with one CPU thread greedy outputs are token for token equal (``tests/engine/test_multiseq.py``,
SmolLM2; ``benchmarks/summarize.py --decode-batch`` checks it on a 3K-token document).
With several threads they may not be: llama.cpp's CPU flash-attention kernel splits a
one-token batch's KV cells across the threads (its split-KV path, for 512 cells or
more) and sums the partial results, but gives each thread whole rows of a k-token
batch, so the float sums are taken in another order and a near tie can go the other
way after some tokens (seen: one of two answers diverged at 2 threads). A job that
needs byte-identical output therefore commits a group's answers together
(:meth:`pipeline.summarize.jobstore.JobStore.commit_units`), so that a resumed run decodes the same
group again.

Sequences that do not fit together (the prefix, every suffix and every answer must
fit ``n_ctx`` cells at once) run in several groups, one after the other.
"""

from __future__ import annotations

import codecs
import time
from typing import TYPE_CHECKING, Sequence

from .contract import CacheKind, Completion, EngineStats
from ..errors import EngineError

if TYPE_CHECKING:
    from ..records import PromptShape


def answer_together(engine, prompts: Sequence[PromptShape], *, max_tokens: int, temperature: float,
                    repeat_penalty: float, seed: int | None) -> list[Completion]:
    """Answer ``prompts`` (sharing the first one's prefix) on ``engine`` (a :class:`~.local.Engine`), in groups that fit together
    (:func:`groups`): each group's prefix reused or prefilled once into sequence 0, as
    :meth:`~.local.Engine.generate` would (states saved at its cuts), then the suffixes and answers
    decoded together (:func:`decode_together`)."""
    prefix_len = prompts[0].prefix_len
    for p in prompts:
        if len(p) + 1 > engine.n_ctx:
            raise EngineError(f"the prompt has {len(p):,} tokens; the context holds {engine.n_ctx:,}")
    sampling = (temperature, repeat_penalty, engine.settings.seed if seed is None else seed)
    results: list[Completion | None] = [None] * len(prompts)
    for group in groups([len(p) for p in prompts], prefix_len=prefix_len, max_tokens=max_tokens,
                        n_ctx=engine.n_ctx, n_seq=engine.n_seq_max):
        run = [prompts[i] for i in group]
        stats = [EngineStats(prompt_tokens=len(p)) for p in run]
        with engine.turn():
            texts = _group(engine, run, stats, max_tokens=max_tokens, sampling=sampling)
        for i, text, st in zip(group, texts, stats):
            results[i] = Completion(text, st)
    return results  # type: ignore[return-value]


def _group(engine, prompts: Sequence[PromptShape], stats: list[EngineStats], *, max_tokens: int,
           sampling: tuple) -> list[str]:
    """One group of :func:`answer_together`, holding the context."""
    from .reuse.execute import carry_out
    from .reuse.plan import Need

    llm, memory, prefix = engine.llm, engine.memory, engine.planner.prefix
    shape, prefix_len = prompts[0], prompts[0].prefix_len
    first = stats[0]
    first.load_seconds = engine.load_seconds
    first.notes.extend(engine.notes)
    t0 = time.perf_counter()
    plan = engine.planner.plan(shape, memory, need=Need.EXACT)  # sequences share exactly computed cells
    reused = carry_out(engine.planner, plan, llm, memory, first,
                       lambda tokens, start: engine.prefill(tokens, start=start), begin=lambda reused: None)
    llm.synchronize()
    first.prefill_seconds = time.perf_counter() - t0
    first.notes.extend(prefix.store_notes(prefix_len))
    for st in stats[1:]:  # the prefix was reused from sequence 0
        st.cached_tokens, st.cache, st.notes = prefix_len, CacheKind.MEMORY, list(engine.notes)
    try:
        texts, held = decode_together(llm, [p.tokens for p in prompts], stats, prefix_len=prefix_len,
                                      max_tokens=max_tokens, n_ctx=engine.n_ctx, sampling=sampling)
    except EngineError as exc:
        memory.clear()
        raise EngineError(f"llama.cpp failed decoding {len(prompts)} sequences together: {exc}") from None
    memory.tokens = held
    for i, st in enumerate(stats):
        st.prefill_tokens = len(prompts[i]) - (reused if i == 0 else prefix_len)
        if st.prefill_seconds > 0:
            st.prefill_tokens_per_second = st.prefill_tokens / st.prefill_seconds
    return texts


def groups(lengths: Sequence[int], *, prefix_len: int, max_tokens: int, n_ctx: int, n_seq: int) -> list[list[int]]:
    """Indexes of prompts (of ``lengths`` tokens, all sharing ``prefix_len``) in runs that fit together:
    at most ``n_seq`` sequences, and the prefix plus every suffix and answer within ``n_ctx`` cells."""
    out: list[list[int]] = []
    used = prefix_len
    for i, n in enumerate(lengths):
        need = n - prefix_len + max_tokens
        if out and len(out[-1]) < n_seq and used + need <= n_ctx:
            out[-1].append(i)
            used += need
        else:
            out.append([i])
            used = prefix_len + need
    return out


def decode_together(llm, prompts: Sequence[Sequence[int]], stats: Sequence[EngineStats], *, prefix_len: int,
                    max_tokens: int, n_ctx: int, sampling: tuple) -> tuple[list[str], list[int]]:
    """Answer ``prompts`` whose first ``prefix_len`` tokens sequence 0 already holds (and nothing else).

    Sequence ``i`` gets prompt ``i``. Returns each prompt's text and, for sequence 0,
    the tokens its memory holds afterwards (prompt and decoded answer), so the caller
    can keep reusing it; the other sequences are removed from memory. Adds each
    suffix's prefill time to ``stats`` and fills their decode figures (the shared
    steps' time split by tokens).
    """
    k = len(prompts)
    t0 = time.perf_counter()
    for i in range(1, k):
        llm.trim(0, seq=i)
        llm.seq_copy(0, i, 0, prefix_len)
    samplers = [llm.sampler(temperature=sampling[0], repeat_penalty=sampling[1], seed=sampling[2])
                for _ in range(k)]
    try:
        import numpy as np

        pending: list[int] = []
        for i, tokens in enumerate(prompts):  # each suffix into its sequence, then its first token
            t = time.perf_counter()
            arr = np.asarray(tokens, dtype=np.int32)
            for lo in range(prefix_len, len(arr), llm.n_batch):
                hi = min(lo + llm.n_batch, len(arr))
                llm.decode_seq(arr[lo:hi], lo, i)
            pending.append(samplers[i].sample() if max_tokens > 0 and len(tokens) < n_ctx else -1)
            stats[i].prefill_seconds += time.perf_counter() - t
            stats[i].ttft_seconds = time.perf_counter() - t0
        decoders = [codecs.getincrementaldecoder("utf-8")(errors="replace") for _ in range(k)]
        texts = [[] for _ in range(k)]
        n_out = [0] * k
        pos = [len(p) for p in prompts]
        held0 = list(prompts[0])
        active = [i for i in range(k) if pending[i] >= 0]
        t_decode = time.perf_counter()
        while active:
            step = []
            for i in active:
                token = pending[i]
                if llm.is_eog(token):
                    continue
                n_out[i] += 1
                texts[i].append(decoders[i].decode(llm.piece(token)))
                step.append((i, token, pos[i]))
            if not step:
                break
            llm.decode_sequences(step)
            active = []
            for row, (i, token, p) in enumerate(step):
                pos[i] = p + 1
                if i == 0:
                    held0.append(token)
                if n_out[i] < max_tokens and pos[i] < n_ctx:  # as a lone prompt: sample only while it may go on
                    pending[i] = samplers[i].sample(row)
                    active.append(i)
        llm.synchronize()
        decode_wall = time.perf_counter() - t_decode
    finally:
        for s in samplers:
            s.close()
        for i in range(1, k):
            llm.trim(0, seq=i)
    total = sum(n_out) or 1
    for i in range(k):
        stats[i].decode_tokens = n_out[i]
        stats[i].decode_seconds = decode_wall * n_out[i] / total  # the shared steps, shared by tokens
        if stats[i].decode_seconds > 0:
            stats[i].decode_tokens_per_second = n_out[i] / stats[i].decode_seconds
    return ["".join(t) + d.decode(b"", final=True) for t, d in zip(texts, decoders)], held0
