"""Prefix cache benchmark: time-to-first-token for a question over a ~6K-token document, cold vs warm.

Cold: an empty prefix cache, so the whole prompt is prefilled. Warm: a new
Pipeline (nothing in memory, as in a new process) with the document's prefix
state on disk, so only the question is prefilled. Runs alternate (cold, warm,
cold, warm, ...) so that machine noise hits both alike; medians are compared.
Target on these CPUs: warm at least 30x faster than cold.

    .venv/bin/python benchmarks/cache.py [--tokens 6000] [--repeat 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402


def build_document(path: Path, tokens: int, count) -> int:
    """A Markdown document of about ``tokens`` generator tokens, made from the samples' text."""
    text_parts = []
    for sample in sorted((ROOT / "samples").glob("*")):
        if sample.suffix in (".md", ".txt"):
            text_parts.append(sample.read_text())
    corpus = "\n\n".join(text_parts)
    words = corpus.split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the longest prefix of the corpus within the token target
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid])) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    path.write_text(text)
    return count(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=6000, help="document size in generator tokens")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="a 2,000-token document, one repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.repeat = 2000, 1

    work = Path(tempfile.mkdtemp(prefix="rag-bench-cache-"))
    overrides = {"store.path": str(work / "store"), "store.collection": "bench",
                 "cache.path": str(work / "cache"), "engine.n_ctx": 8192, "ask.max_tokens": 8}
    try:
        setup = Pipeline.from_config(overrides=overrides)
        doc = work / "long.md"
        n_doc = build_document(doc, args.tokens, setup.engine.count_tokens)
        setup.ingest([doc])
        setup.close()
        question = "Which function saves the state of one sequence to a file?"
        runs: dict[str, list] = {"cold": [], "warm": []}
        for i in range(args.repeat):
            for mode in ("cold", "warm"):
                if mode == "cold":
                    shutil.rmtree(work / "cache", ignore_errors=True)
                rag = Pipeline.from_config(overrides=overrides)
                t0 = time.perf_counter()
                stream = rag.ask_stream(question, doc=doc)
                first = None
                for _ in stream:
                    if first is None:
                        first = time.perf_counter() - t0
                answer = stream.answer
                st = answer.stats
                runs[mode].append({"ttft_engine": st.ttft_seconds, "ttft_wall": first or st.ttft_seconds,
                                   "prompt_tokens": st.prompt_tokens, "cached_tokens": st.cached_tokens,
                                   "cache": st.cache, "cache_load_seconds": st.cache_load_seconds,
                                   "prefill_tokens_per_second": st.prefill_tokens_per_second})
                print(f"  run {i + 1} {mode}: TTFT {st.ttft_seconds:.3f} s (engine), "
                      f"{runs[mode][-1]['ttft_wall']:.3f} s (wall, retrieval and packing included); "
                      f"{st.cached_tokens:,}/{st.prompt_tokens:,} tokens restored, cache {st.cache}", flush=True)
                cache_stats = rag.prefix_cache.stats()
                rag.close()
        cold = statistics.median(r["ttft_engine"] for r in runs["cold"])
        warm = statistics.median(r["ttft_engine"] for r in runs["warm"])
        cold_wall = statistics.median(r["ttft_wall"] for r in runs["cold"])
        warm_wall = statistics.median(r["ttft_wall"] for r in runs["warm"])
        ratio, ratio_wall = cold / warm, cold_wall / warm_wall
        result = {
            "document_tokens": n_doc, "prompt_tokens": runs["cold"][0]["prompt_tokens"],
            "cold_ttft_seconds": cold, "warm_ttft_seconds": warm, "speedup": ratio,
            "cold_wall_seconds": cold_wall, "warm_wall_seconds": warm_wall, "speedup_wall": ratio_wall,
            "state_bytes_per_token": cache_stats["bytes_per_token"],
            "state_load_seconds": statistics.median(r["cache_load_seconds"] for r in runs["warm"]),
            "runs": runs,
        }
        print(f"\nprompt {result['prompt_tokens']:,} tokens (document {n_doc:,}); SmolLM2-135M Q4_1, f16 KV")
        print(f"{'':24}{'cold':>10}{'warm':>10}{'speed-up':>10}")
        print(f"{'TTFT, engine (s)':24}{cold:>10.3f}{warm:>10.3f}{ratio:>9.1f}x")
        print(f"{'TTFT, wall (s)':24}{cold_wall:>10.3f}{warm_wall:>10.3f}{ratio_wall:>9.1f}x")
        print(f"state: {result['state_bytes_per_token']:,.0f} bytes per token, "
              f"load {result['state_load_seconds'] * 1000:.0f} ms (checks included)")
        print(f"[{'PASS' if ratio >= 30 else 'FAIL'}] warm TTFT at least 30x faster than cold: {ratio:.1f}x")
        if args.json:
            from pipeline.dev.bench import document, row

            r = result
            table = [row("document_tokens", r["document_tokens"], "tokens"),
                     row("prompt_tokens", r["prompt_tokens"], "tokens"),
                     row("cold_ttft_seconds", cold, "s"), row("warm_ttft_seconds", warm, "s"),
                     row("speedup", ratio, "x", ratio=("cold_ttft_seconds", "warm_ttft_seconds")),
                     row("cold_wall_seconds", cold_wall, "s"), row("warm_wall_seconds", warm_wall, "s"),
                     row("speedup_wall", ratio_wall, "x", ratio=("cold_wall_seconds", "warm_wall_seconds")),
                     row("state_bytes_per_token", r["state_bytes_per_token"], "B"),
                     row("state_load_seconds", r["state_load_seconds"], "s")]
            args.json.write_text(json.dumps(document(table, **result), indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
