"""Generator comparison: SmolLM2-135M-Instruct against Gemma 3 270M, answers and prefill speed, in one run.

Answers: what ``rag eval --answers`` checks, on the development set (``benchmarks/eval/devset.jsonl``
over ``samples/`` and ``benchmarks/eval/generated/``, ingested once into a fresh store),
each model with its own empty prefix cache: how many answers contain the expected text,
how many cite the expected page as [n], and how often that page was in the prompt at
all (the retrieval side, the same for both). Questions run in the set's order, so
consecutive questions share packed sections as they would for a user.

Speed: the same text (the samples' prose, cut to about ``--speed-tokens`` tokens of each
model's tokenizer) prefilled by each model on a fresh engine, models alternating, medians
of ``--repeat`` runs from llama.cpp's own counters; seconds for the same text and tokens/s.

    .venv/bin/python benchmarks/generators.py [--ctx 4096] [--max-tokens 48] [--limit N] [--json OUT]
    .venv/bin/python benchmarks/generators.py --quick    # 6 questions, one speed run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402

MODELS = ("builtin:SmolLM2-135M-Instruct", "builtin:gemma-3-270m")


def prose(tokens: int, count) -> str:
    """The samples' Markdown and text, cut to the longest prefix within ``tokens`` (by ``count``)."""
    corpus = "\n\n".join(p.read_text() for p in sorted((ROOT / "samples").glob("*")) if p.suffix in (".md", ".txt"))
    words = corpus.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def prefill_once(path: Path, text: str, *, n_ctx: int, threads: int) -> dict:
    """One cold prefill of ``text`` on a fresh engine: tokens, seconds and tokens/s from llama.cpp."""
    from pipeline.config import EngineConfig
    from pipeline.engine.local import Engine

    engine = Engine(path, EngineConfig(n_ctx=n_ctx, threads=threads))
    try:
        tokens = engine.bos + engine.tokenize(text)
        gen = engine.generate(tokens, max_tokens=1)
        for _ in gen:
            pass
        st = gen.stats
        return {"tokens": st.prefill_tokens, "seconds": st.prefill_seconds,
                "tokens_per_second": st.prefill_tokens_per_second}
    finally:
        engine.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--questions", type=Path, default=ROOT / "benchmarks" / "eval" / "devset.jsonl")
    ap.add_argument("--limit", type=int, default=0, help="only the first N questions (0 = all)")
    ap.add_argument("--ctx", type=int, default=4096, help="engine.n_ctx for the answers")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=0, help="engine.threads (0 = every usable core)")
    ap.add_argument("--speed-tokens", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3, help="prefill runs per model")
    ap.add_argument("--skip-answers", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="6 questions, one prefill run per model")
    args = ap.parse_args(argv)
    if args.quick:
        args.limit, args.repeat = 6, 1

    from pipeline.evaluate import answer_summary, check_answer, load_questions
    from pipeline.models import resolve

    with open("/proc/loadavg") as fh:
        load_start = fh.read().split()[:3]
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="rag-bench-generators-"))
    home = Pipeline.from_config().config.home_path
    paths = {ref: resolve(ref, home=home) for ref in args.models}
    results: dict[str, dict] = {ref: {} for ref in args.models}
    try:
        # -- speed: the same text, models alternating
        smol = Pipeline.from_config(overrides={"models.generator": args.models[0]})
        text = prose(args.speed_tokens, smol.engine.count_tokens)
        smol.close()
        runs: dict[str, list] = {ref: [] for ref in args.models}
        for i in range(args.repeat):
            for ref in args.models:
                r = prefill_once(paths[ref], text, n_ctx=max(4096, 2 * args.speed_tokens), threads=args.threads)
                runs[ref].append(r)
                print(f"  prefill run {i + 1} {ref}: {r['tokens']:,} tokens in {r['seconds']:.2f} s "
                      f"({r['tokens_per_second']:,.0f} tok/s)", flush=True)
        for ref in args.models:
            results[ref]["prefill"] = {
                "tokens": runs[ref][0]["tokens"],
                "seconds": statistics.median(r["seconds"] for r in runs[ref]),
                "tokens_per_second": statistics.median(r["tokens_per_second"] for r in runs[ref]),
                "runs": runs[ref]}

        # -- answers: one store, each model with its own prefix cache
        if not args.skip_answers:
            questions = load_questions(args.questions)
            if args.limit:
                questions = questions[:args.limit]
            base = {"store.path": str(work / "store"), "store.collection": "devset", "engine.n_ctx": args.ctx,
                    "ask.max_tokens": args.max_tokens, "engine.threads": args.threads}
            setup = Pipeline.from_config(overrides={**base, "cache.path": str(work / "cache-setup")})
            setup.ingest([ROOT / "samples", ROOT / "benchmarks" / "eval" / "generated"])
            setup.close()
            for ref in args.models:
                rag = Pipeline.from_config(overrides={**base, "models.generator": ref,
                                                      "cache.path": str(work / f"cache-{ref.removeprefix('builtin:')}")})
                t0 = time.perf_counter()
                checked, prefilled, decoded = [], 0, 0
                for i, q in enumerate(questions, start=1):  # what `rag eval --answers` does, with progress
                    answer = rag.ask(q.question)
                    checked.append(check_answer(q, answer.text, answer.sources))
                    st = answer.stats
                    prefilled, decoded = prefilled + st.prefill_tokens, decoded + st.decode_tokens
                    print(f"    {ref} {i}/{len(questions)} [{q.id}] answer {'ok' if checked[-1]['answer_ok'] else '-'}"
                          f" cited {'ok' if checked[-1]['cited_ok'] else '-'} | prefilled {st.prefill_tokens:,} of "
                          f"{st.prompt_tokens:,} in {st.prefill_seconds:.1f} s, {time.perf_counter() - t0:.0f} s so far",
                          flush=True)
                seconds = time.perf_counter() - t0
                rag.close()
                summary = answer_summary(checked)
                results[ref]["answers"] = {**summary, "seconds": seconds, "prefill_tokens": prefilled,
                                           "decode_tokens": decoded, "questions_list": checked}
                print(f"  answers {ref}: {summary['answer_contains_expected']}/{summary['with_expected_answer']} "
                      f"contain the expected text, {summary['cites_expected_page']}/{summary['questions']} cite "
                      f"the expected page ({summary['expected_page_in_prompt']} had it in the prompt), "
                      f"{seconds:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with open("/proc/loadavg") as fh:
        load_end = fh.read().split()[:3]
    wall = time.perf_counter() - started

    print(f"\n{len(args.models)} generators; answers at n_ctx {args.ctx}, max_tokens {args.max_tokens}, "
          f"threads {args.threads or 'all'}; load average {' '.join(load_start)} at the start, "
          f"{' '.join(load_end)} at the end; {wall:.0f} s")
    print("| generator | file MiB | answer contains the expected text | cites the expected page | "
          f"prefill tok/s ({results[args.models[0]]['prefill']['tokens']:,}-token text) | "
          "seconds for the same text |")
    print("| --- | --- | --- | --- | --- | --- |")
    for ref in args.models:
        r = results[ref]
        a = r.get("answers")
        contains = f"{a['answer_contains_expected']} of {a['with_expected_answer']}" if a else "-"
        cites = f"{a['cites_expected_page']} of {a['questions']}" if a else "-"
        p = r["prefill"]
        print(f"| {ref} | {paths[ref].stat().st_size / 2**20:,.0f} | {contains} | {cites} | "
              f"{p['tokens_per_second']:,.0f} ({p['tokens']:,} tokens) | {p['seconds']:.2f} |")
    if args.json:
        from devtools.bench import document, row

        table = []
        for ref in args.models:
            name = ref.removeprefix("builtin:")
            p = results[ref]["prefill"]
            table += [row(f"{name} prefill tokens/s", p["tokens_per_second"], "tok/s"),
                      row(f"{name} prefill seconds (same text)", p["seconds"], "s")]
            if "answers" in results[ref]:
                a = results[ref]["answers"]
                table += [row(f"{name} answers containing the expected text", a["answer_contains_expected"], ""),
                          row(f"{name} answers citing the expected page", a["cites_expected_page"], "")]
        args.json.write_text(json.dumps(document(table, models=results, load_start=load_start, load_end=load_end,
                                                 n_ctx=args.ctx, max_tokens=args.max_tokens, threads=args.threads,
                                                 wall_seconds=wall, cpus=os.cpu_count()), indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
