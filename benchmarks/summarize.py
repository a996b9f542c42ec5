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
    .venv/bin/python benchmarks/summarize.py --decode-batch   # k prompts decoded together vs one at a time
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
from typing import Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import llama_cpp  # noqa: E402

from pipeline import Pipeline
from pipeline.ask import packing  # noqa: E402
from pipeline.ask.prompt import SectionTokens, section_prompt  # noqa: E402
from pipeline.engine.host import usable_cpus  # noqa: E402
from pipeline.summarize.job import sections_of  # noqa: E402
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


def batched_decode(rag: Pipeline, *, sequences: Sequence[int] = (2, 4), max_tokens: int = 32,
                   repeat: int = 3) -> dict:
    """Several prompts over one document: ``Engine.generate_many`` with ``n_seq_max`` = k (one decode call
    per step for all k) against the same prompts one at a time (``n_seq_max`` 1), interleaved ``repeat``
    times in one run. The document's prefix is in memory for both (a first call prefilled it), so the
    wall time is the suffixes' prefill and the answers' decode. Outputs must be equal (greedy).
    Each k runs in its own engine (``n_seq_max`` is a context setting); the engines share the
    prefix through the prefix cache, so it is prefilled once."""
    from pipeline.engine.local import Engine

    engine = rag.engine
    with rag.store() as store:
        source = sorted(store.documents(), key=lambda s: store.documents()[s].n_tokens)[0]
        shelf = sections_of(store, source, target=rag.section_tokens)
    layout = rag.runtime.layout()
    memo = SectionTokens(engine.tokenize)
    questions = ["Summarise the document in three sentences.", "List every command-line flag it names.",
                 "Which numbers does it give, and for what?", "Who should read it, and why?"]
    k_max = max(sequences)
    packed = packing.number(shelf, shelf.sections, memo)
    prompts = [section_prompt(layout, packed, q, tokenize=engine.tokenize, mode="whole")
               for q in (questions * k_max)[:k_max]]
    prefix_len, boundaries = len(prompts[0].prefix_tokens), prompts[0].boundaries
    kw = dict(max_tokens=max_tokens, temperature=0.0, repeat_penalty=rag.config.summarize.repeat_penalty,
              prefix_len=prefix_len, boundaries=boundaries)
    def make(k: int) -> Engine:  # the prefix is prefilled once, by the first; the others restore it from disk
        return Engine(engine.model_path, dataclasses.replace(engine.settings, n_seq_max=k), cache=rag.prefix_cache,
                      cache_min_tokens=16)

    engines = {k: make(k) for k in (1, *sequences)}
    walls: dict[tuple[str, int], list[float]] = {}
    tokens: dict[tuple[str, int], int] = {}
    identical: dict[int, int] = {}
    prompts_run: dict[int, int] = {}
    try:
        for e in engines.values():  # the prefix into memory; not timed
            e.generate(prompts[0].tokens, **{**kw, "max_tokens": 1}).read()
        for _ in range(repeat):
            for k in sequences:
                run = [p.tokens for p in prompts[:k]]
                t0 = time.perf_counter()
                alone = [engines[1].generate(p, **kw) for p in run]
                alone_texts = [g.read() for g in alone]
                walls.setdefault(("alone", k), []).append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                together = engines[k].generate_many(run, **kw)
                walls.setdefault(("together", k), []).append(time.perf_counter() - t0)
                same = [c.text == t for c, t in zip(together, alone_texts)]
                identical[k] = identical.get(k, 0) + sum(same)
                prompts_run[k] = prompts_run.get(k, 0) + len(same)
                tokens[("alone", k)] = sum(g.stats.decode_tokens for g in alone)
                tokens[("together", k)] = sum(c.stats.decode_tokens for c in together)
    finally:
        for e in engines.values():
            e.close()
    out = {"prefix_tokens": prefix_len, "max_tokens": max_tokens, "repeat": repeat, "rows": [],
           "threads": engine.settings.threads or usable_cpus()}
    for k in sequences:
        a, t = walls[("alone", k)], walls[("together", k)]
        ratios = sorted(x / y for x, y in zip(a, t))
        out["rows"].append({"sequences": k, "output_tokens": tokens[("alone", k)],
                            "alone_seconds": statistics.median(a), "together_seconds": statistics.median(t),
                            "ratio": statistics.median(ratios), "ratio_min": ratios[0], "ratio_max": ratios[-1],
                            "identical": identical[k], "answers": prompts_run[k]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--docs", type=int, default=0, help="only the N smallest samples (default: all four)")
    ap.add_argument("--repeat", type=int, default=2, help="alternating job/bare runs (medians)")
    ap.add_argument("--quick", action="store_true", help="the smallest sample, one run")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--decode-batch", action="store_true",
                    help="only measure k prompts over one document decoded together (engine.n_seq_max = k) "
                         "against one at a time, then stop")
    args = ap.parse_args(argv)
    if args.quick:
        args.docs, args.repeat = 1, 1
    if args.decode_batch:
        return decode_batch_main(args)

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
            pairs.append((rep.stats.prefill_seconds, bare_seconds))
            st = rep.stats
            print(f"  run {i + 1}: job {rep.documents} documents x {rep.prompts} prompts, {st.prompt_tokens:,} prompt "
                  f"tokens, {st.prefill_tokens:,} prefilled ({st.cached_tokens:,} reused) in {st.prefill_seconds:.2f} s, "
                  f"wall {wall:.2f} s; bare {bare_tokens:,} unique tokens in {bare_seconds:.2f} s", flush=True)

        # Resuming the finished job, as a new process would: nothing loaded.
        again = Pipeline.from_config(overrides=overrides)
        t0 = time.perf_counter()
        resumed = again.summarize([docs], prompts=PROMPTS, max_tokens=args.max_tokens)
        same = [s.text for s in resumed.result()] == summaries
        resume_wall = time.perf_counter() - t0
        assert resumed.report.units_computed == 0 and same
        loaded = again.runtime.has("engine") and "llm" in again.engine.__dict__
        again.close()

        ratio = statistics.median(j / b for j, b in pairs)
        job_prefill = statistics.median(j for j, _ in pairs)
        bare_prefill = statistics.median(b for _, b in pairs)
        resume_share = resume_wall / job_wall
        result = {
            "documents": rep.documents, "prompts": rep.prompts, "repeat": args.repeat,
            "job_prompt_tokens": rep.stats.prompt_tokens, "job_prefill_tokens": rep.stats.prefill_tokens,
            "job_cached_tokens": rep.stats.cached_tokens, "job_prefill_seconds": job_prefill,
            "bare_tokens": bare_tokens,
            "bare_prefill_seconds": bare_prefill, "prefill_ratio": ratio, "pairs": pairs,
            "input_tokens_per_second": rep.stats.prefill_tokens / job_prefill, "output_tokens": rep.stats.decode_tokens,
            "decode_seconds": rep.stats.decode_seconds, "job_wall_seconds": job_wall,
            "resume_wall_seconds": resume_wall, "resume_share": resume_share, "resume_loaded_the_model": loaded,
        }
        print(f"\n{'':34}{'tokens':>10}{'prefill s':>11}{'tok/s':>9}   (medians of {args.repeat} alternating runs)")
        print(f"{'job (2 prompts per document)':34}{rep.stats.prefill_tokens:>10,}{job_prefill:>11.2f}"
              f"{rep.stats.prefill_tokens / job_prefill:>9.0f}")
        print(f"{'bare, unique tokens once':34}{bare_tokens:>10,}{bare_prefill:>11.2f}{bare_tokens / bare_prefill:>9.0f}")
        print(f"output: {rep.stats.decode_tokens} tokens in {len(summaries)} summaries (max {args.max_tokens} each), "
              f"decode {rep.stats.decode_seconds:.2f} s")
        print(f"resume of the finished job: {resume_wall:.3f} s of a {job_wall:.1f} s job "
              f"({resume_share:.2%}; model loaded: {loaded})")
        print(f"[{'PASS' if rep.stats.prefill_tokens <= bare_tokens else 'FAIL'}] nothing prefilled twice: the job "
              f"prefilled {rep.stats.prefill_tokens:,} tokens, the unique tokens are {bare_tokens:,} (the engine also "
              "keeps the system prompt in memory between documents)")
        print(f"[{'PASS' if ratio <= 1.05 else 'FAIL'}] job prefill time at most 1.05x the bare prefill: {ratio:.3f}x "
              f"(per-run ratios {', '.join(f'{j / b:.3f}' for j, b in pairs)})")
        print(f"[{'PASS' if resume_share < 0.01 else 'FAIL'}] resuming a finished job under 1 % of the job: "
              f"{resume_share:.2%}")
        if args.json:
            from devtools.bench import document, row

            rows = [row("job_prefill_tokens", rep.stats.prefill_tokens, "tokens"),
                    row("bare_tokens", bare_tokens, "tokens"),
                    row("job_prefill_seconds", job_prefill, "s"), row("bare_prefill_seconds", bare_prefill, "s"),
                    row("prefill_ratio", ratio, "x", ratio=("job_prefill_seconds", "bare_prefill_seconds")),
                    row("input_tokens_per_second", result["input_tokens_per_second"], "tokens/s"),
                    row("output_tokens", rep.stats.decode_tokens, "tokens"),
                    row("resume_share", resume_share, "x", ratio=("resume_wall_seconds", "job_wall_seconds"))]
            args.json.write_text(json.dumps(document(rows, **result), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def decode_batch_main(args) -> int:
    work = Path(tempfile.mkdtemp(prefix="rag-bench-decode-"))
    try:
        docs = work / "docs"
        docs.mkdir()
        shutil.copy(sorted((ROOT / "samples").iterdir(), key=lambda p: p.stat().st_size)[0], docs)
        rag = Pipeline.from_config(overrides={"store.path": str(work / "store"), "store.collection": "bench",
                                              "cache.path": str(work / "cache"), "engine.n_ctx": 8192})
        rag.ingest([docs])
        r = batched_decode(rag, max_tokens=args.max_tokens, repeat=args.repeat)
        rag.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"k prompts over one {r['prefix_tokens']:,}-token document (in memory), answers of at most "
          f"{r['max_tokens']} tokens, greedy; medians of {r['repeat']} interleaved runs")
    print(f"{r['threads']} threads")
    print(f"{'k':>3}{'tokens':>8}{'one at a time s':>17}{'together s':>12}{'ratio':>8}   spread (min-max)"
          "   answers identical to one at a time")
    for row in r["rows"]:
        print(f"{row['sequences']:>3}{row['output_tokens']:>8}{row['alone_seconds']:>17.2f}"
              f"{row['together_seconds']:>12.2f}{row['ratio']:>7.2f}x   {row['ratio_min']:.2f}-{row['ratio_max']:.2f}"
              f"{'':12}{row['identical']} of {row['answers']}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))
    return 0


def bare_pass(rag: Pipeline, max_tokens: int) -> tuple[float, int]:
    """The job's unique tokens through :class:`BareLoop`: each document's prompt once, then the second
    instruction after the document. Returns (prefill seconds from llama.cpp's counters, tokens)."""
    engine = rag.engine
    memo = SectionTokens(engine.tokenize)
    with rag.store() as store:
        shelves = [sections_of(store, source, target=rag.section_tokens) for source in sorted(store.documents())]
    prompts = []
    for shelf in shelves:  # the prompts summarize builds: ask's layout, the instruction last
        packed = packing.number(shelf, shelf.sections, memo)
        prompts.append([section_prompt(rag.runtime.layout(), packed, q, tokenize=engine.tokenize, mode="whole")
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
