"""Summarisation job benchmark: the job's prefill against a bare prefill of its unique tokens, and resuming.

Corpus: the bundled ``samples/`` (4 documents, or the ``--docs N`` smallest, each
summarised whole at an 8K context) with two prompts per document, so the job must prefill every document
once and only the second instruction after it.

1. The job (``Pipeline.summarize``, empty job database and prefix cache): its total
   prefill time from llama.cpp's own counters, input tokens/s, output tokens.
2. A bare prefill, in the same process and run, of the same unique tokens, written
   independently of the engine (:class:`prefill.BareLoop`: llama.cpp's low-level API,
   the same context parameters): per document its prompt with the first
   instruction, then the second instruction after the document (memory cut back to
   the end of the document). Job and bare runs alternate ``--repeat`` times (a fresh
   job database and prefix cache each time); the median ratio is compared.
   Target: job / bare at most 1.05.
3. Resuming the finished job: the same call in a new Pipeline (as a new process:
   nothing loaded), against the job's wall time. Target: under 1 %.

    .venv/bin/python benchmarks/summarize.py [--docs N] [--repeat 2] [--quick] [--max-tokens 32] [--json OUT]
    .venv/bin/python benchmarks/summarize.py --decode-batch   # two sequences per decode vs one at a time
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import llama_cpp  # noqa: E402

from pipeline import Pipeline  # noqa: E402
from pipeline.context import pack  # noqa: E402
from pipeline.engine.embed import usable_cpus  # noqa: E402
from pipeline.retrieve import whole_document  # noqa: E402
from prefill import BareLoop  # noqa: E402

PROMPTS = ["Summarise the document in three sentences.", "List every command-line flag and setting it names."]


def bare_extend(bare: BareLoop, tokens: list[int], start: int) -> float:
    """Decode ``tokens`` at positions from ``start`` after what the bare context holds; prefill seconds."""
    llama_cpp.llama_perf_context_reset(bare.ctx)
    n_batch, batch = bare.n_batch, bare.batch
    arr = np.asarray(tokens, dtype=np.int32)
    for lo in range(0, len(arr), n_batch):
        m = min(n_batch, len(arr) - lo)
        bare._tok[:m] = arr[lo:lo + m]
        bare._pos[:m] = np.arange(start + lo, start + lo + m, dtype=np.int32)
        bare._logits[:m] = 0
        bare._logits[m - 1] = 1
        batch.n_tokens = m
        if llama_cpp.llama_decode(bare.ctx, batch) != 0:
            raise RuntimeError("bare loop: llama_decode failed")
    llama_cpp.llama_synchronize(bare.ctx)
    return llama_cpp.llama_perf_context(bare.ctx).t_p_eval_ms / 1000


def batched_decode(model_path: Path, *, threads: int, prompt_tokens: int = 256, steps: int = 24,
                   repeat: int = 3) -> dict:
    """Decode ``steps`` tokens for two sequences sharing one prompt: one token per decode call, one sequence
    after the other, against both sequences' tokens in one decode call. Medians of ``repeat`` interleaved runs."""
    mp = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mp)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 2048, 512, 512, 2
    cp.n_threads = cp.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cp)
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(512, 0, 2)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    def decode(items):  # (token, position, sequence) per slot, logits for each
        for i, (tok, pos, seq) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = tok, pos, 1, seq, 1
        batch.n_tokens = len(items)
        assert llama_cpp.llama_decode(ctx, batch) == 0

    def prefill():
        llama_cpp.llama_memory_clear(mem, True)
        for lo in range(0, prompt_tokens, 512):
            m = min(512, prompt_tokens - lo)
            for i in range(m):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = (lo + i) % n_vocab, lo + i, 1, 0
                batch.logits[i] = 0
            batch.logits[m - 1] = 1
            batch.n_tokens = m
            assert llama_cpp.llama_decode(ctx, batch) == 0
        llama_cpp.llama_memory_seq_cp(mem, 0, 1, -1, -1)

    times = {"one sequence at a time": [], "two sequences per decode": []}
    try:
        for _ in range(repeat):
            prefill()
            t0 = time.perf_counter()
            for seq in (0, 1):
                for k in range(steps):
                    decode([(100 + k, prompt_tokens + k, seq)])
            llama_cpp.llama_synchronize(ctx)
            times["one sequence at a time"].append(time.perf_counter() - t0)
            prefill()
            t0 = time.perf_counter()
            for k in range(steps):
                decode([(100 + k, prompt_tokens + k, 0), (100 + k, prompt_tokens + k, 1)])
            llama_cpp.llama_synchronize(ctx)
            times["two sequences per decode"].append(time.perf_counter() - t0)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return {k: 2 * steps / statistics.median(v) for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--docs", type=int, default=0, help="only the N smallest samples (default: all four)")
    ap.add_argument("--repeat", type=int, default=2, help="alternating job/bare runs (medians)")
    ap.add_argument("--quick", action="store_true", help="the smallest sample, one run")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--decode-batch", action="store_true",
                    help="only measure decoding two sequences per batch against one at a time, then stop")
    args = ap.parse_args(argv)
    if args.quick:
        args.docs, args.repeat = 1, 1
    if args.decode_batch:
        from pipeline.models import resolve

        rag = Pipeline.from_config()
        path = resolve(rag.config.models.generator, home=rag.config.home_path)
        threads = rag.config.engine.threads or usable_cpus()
        rates = batched_decode(path, threads=threads)
        for name, rate in rates.items():
            print(f"{name:28} {rate:7.1f} tokens/s (both sequences together)")
        print(f"ratio: {rates['two sequences per decode'] / rates['one sequence at a time']:.2f}x")
        return 0

    work = Path(tempfile.mkdtemp(prefix="rag-bench-summarize-"))
    docs = work / "docs"
    docs.mkdir()
    samples = sorted((ROOT / "samples").iterdir(), key=lambda p: p.stat().st_size)
    for p in samples[:args.docs] if args.docs else samples:
        shutil.copy(p, docs / p.name)
    overrides = {"store.path": str(work / "store"), "store.collection": "bench", "cache.path": str(work / "cache"),
                 "engine.n_ctx": 8192}
    try:
        setup = Pipeline.from_config(overrides=overrides)
        setup.ingest([docs])
        setup.close()
        pairs, summaries, job_wall, bare_tokens, rep = [], None, 0.0, 0, None
        for i in range(args.repeat):  # job and bare alternate, so that machine noise hits both alike
            (work / "store" / "jobs.sqlite").unlink(missing_ok=True)
            shutil.rmtree(work / "cache", ignore_errors=True)
            rag = Pipeline.from_config(overrides=overrides)
            t0 = time.perf_counter()
            run = rag.summarize([docs], prompts=PROMPTS, max_tokens=args.max_tokens)
            texts = [s.text for s in run.result()]
            wall = time.perf_counter() - t0
            rep = run.report
            assert not rep.failed and set(rep.methods) == {"whole"} and rep.units_computed == len(texts), rep.to_dict()
            assert summaries is None or texts == summaries  # greedy: the same every time
            summaries, job_wall = texts, wall
            bare_seconds, bare_tokens = bare_pass(rag, args.max_tokens)
            rag.close()
            pairs.append((rep.prefill_seconds, bare_seconds))
            print(f"  run {i + 1}: job {rep.documents} documents x {rep.prompts} prompts, {rep.prompt_tokens:,} prompt "
                  f"tokens, {rep.prefill_tokens:,} prefilled ({rep.cached_tokens:,} reused) in {rep.prefill_seconds:.2f} s, "
                  f"wall {wall:.2f} s; bare {bare_tokens:,} unique tokens in {bare_seconds:.2f} s", flush=True)

        # Resuming the finished job, as a new process would: nothing loaded.
        again = Pipeline.from_config(overrides=overrides)
        t0 = time.perf_counter()
        resumed = again.summarize([docs], prompts=PROMPTS, max_tokens=args.max_tokens)
        same = [s.text for s in resumed.result()] == summaries
        resume_wall = time.perf_counter() - t0
        assert resumed.report.units_computed == 0 and same
        loaded = "engine" in again.__dict__ and "llm" in again.engine.__dict__
        again.close()

        ratio = statistics.median(j / b for j, b in pairs)
        job_prefill = statistics.median(j for j, _ in pairs)
        bare_prefill = statistics.median(b for _, b in pairs)
        resume_share = resume_wall / job_wall
        result = {
            "documents": rep.documents, "prompts": rep.prompts, "repeat": args.repeat,
            "job_prompt_tokens": rep.prompt_tokens, "job_prefill_tokens": rep.prefill_tokens,
            "job_cached_tokens": rep.cached_tokens, "job_prefill_seconds": job_prefill, "bare_tokens": bare_tokens,
            "bare_prefill_seconds": bare_prefill, "prefill_ratio": ratio, "pairs": pairs,
            "input_tokens_per_second": rep.prefill_tokens / job_prefill, "output_tokens": rep.decode_tokens,
            "decode_seconds": rep.decode_seconds, "job_wall_seconds": job_wall,
            "resume_wall_seconds": resume_wall, "resume_share": resume_share, "resume_loaded_the_model": loaded,
        }
        print(f"\n{'':34}{'tokens':>10}{'prefill s':>11}{'tok/s':>9}   (medians of {args.repeat} alternating runs)")
        print(f"{'job (2 prompts per document)':34}{rep.prefill_tokens:>10,}{job_prefill:>11.2f}"
              f"{rep.prefill_tokens / job_prefill:>9.0f}")
        print(f"{'bare, unique tokens once':34}{bare_tokens:>10,}{bare_prefill:>11.2f}{bare_tokens / bare_prefill:>9.0f}")
        print(f"output: {rep.decode_tokens} tokens in {len(summaries)} summaries (max {args.max_tokens} each), "
              f"decode {rep.decode_seconds:.2f} s")
        print(f"resume of the finished job: {resume_wall:.3f} s of a {job_wall:.1f} s job "
              f"({resume_share:.2%}; model loaded: {loaded})")
        print(f"[{'PASS' if rep.prefill_tokens <= bare_tokens else 'FAIL'}] nothing prefilled twice: the job "
              f"prefilled {rep.prefill_tokens:,} tokens, the unique tokens are {bare_tokens:,} (the engine also "
              "keeps the system prompt in memory between documents)")
        print(f"[{'PASS' if ratio <= 1.05 else 'FAIL'}] job prefill time at most 1.05x the bare prefill: {ratio:.3f}x "
              f"(per-run ratios {', '.join(f'{j / b:.3f}' for j, b in pairs)})")
        print(f"[{'PASS' if resume_share < 0.01 else 'FAIL'}] resuming a finished job under 1 % of the job: "
              f"{resume_share:.2%}")
        if args.json:
            from pipeline.dev.bench import document, row

            rows = [row("job_prefill_tokens", rep.prefill_tokens, "tokens"),
                    row("bare_tokens", bare_tokens, "tokens"),
                    row("job_prefill_seconds", job_prefill, "s"), row("bare_prefill_seconds", bare_prefill, "s"),
                    row("prefill_ratio", ratio, "x", ratio=("job_prefill_seconds", "bare_prefill_seconds")),
                    row("input_tokens_per_second", result["input_tokens_per_second"], "tokens/s"),
                    row("output_tokens", rep.decode_tokens, "tokens"),
                    row("resume_share", resume_share, "x", ratio=("resume_wall_seconds", "job_wall_seconds"))]
            args.json.write_text(json.dumps(document(rows, **result), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def bare_pass(rag: Pipeline, max_tokens: int) -> tuple[float, int]:
    """The job's unique tokens through :class:`BareLoop`: each document's prompt once, then the second
    instruction after the document. Returns (prefill seconds from llama.cpp's counters, tokens)."""
    engine = rag.engine
    with rag.store() as store:
        prompts = []
        for source in sorted(store.documents()):
            passages = whole_document(source, store=store)
            prompts.append([pack(passages, q, chat=engine.chat, tokenize=engine.tokenize, bos=engine.bos,
                                 n_ctx=engine.n_ctx, reserve=max_tokens, system=rag.config.ask.system_prompt)
                            for q in PROMPTS])
    cfg = dataclasses.replace(engine.settings, threads=engine.settings.threads or usable_cpus())
    bare = BareLoop(engine.model_path, cfg, n_ctx=engine.n_ctx, use_mmap=engine.use_mmap, expert_layers=[])
    seconds, tokens = 0.0, 0
    try:
        for first, second in prompts:
            toks = np.asarray(first.tokens, dtype=np.int32)
            seconds += bare.run(toks, np.arange(len(toks), dtype=np.int32))["prefill_seconds"]
            n_prefix = len(second.prefix_tokens)
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(bare.ctx), 0, n_prefix, -1)
            seconds += bare_extend(bare, second.tokens[n_prefix:], n_prefix)
            tokens += len(first.tokens) + len(second.tokens) - n_prefix
    finally:
        bare.close()
    return seconds, tokens


if __name__ == "__main__":
    raise SystemExit(main())
