"""Prefix cache benchmark: time-to-first-token for a question over a ~6K-token document, cold vs warm.

Cold: an empty prefix cache, so the whole prompt is prefilled. Warm: a new
Pipeline (nothing in memory, as in a new process) with the document's prefix
state on disk, so only the question is prefilled. Runs alternate (cold, warm,
cold, warm, ...) so that machine noise hits both alike; medians are compared.
Target on these CPUs: warm at least 30x faster than cold.

    .venv/bin/python benchmarks/cache.py [--tokens 6000] [--repeat 2] [--json OUT]

``--restore``: instead, on a generated hybrid (``qwen35moe``, whose memory cannot be cut, so
every later question restores a state), the time to restore a prefix state of 16K and 64K
tokens from host memory (``cache.ram_states``) against the disk (the state file in the page
cache, checks included), alternating, medians of ``--repeat`` (default 5).
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


#: The hybrid of --restore: the tests' shape with wider attention (4 KV heads of 64: 1 KiB of KV a token,
#: on its one attention layer of four) so that a 64K state is tens of MB.
HYBRID_SHAPE = dict(n_layers=4, n_embd=64, n_head=4, n_head_kv=4, head_dim=64, rope_dim=16, n_ctx_train=65536)


def restore_benchmark(args, work: Path) -> dict:
    """RAM against disk restores of the hybrid's prefix state at each of ``args.lengths`` tokens."""
    import numpy as np

    from pipeline.config import EngineConfig
    from devtools.synthetic import write_model
    from pipeline.engine.cache.ram import RamStates
    from pipeline.engine.cache.prefix_cache import PrefixCache
    from pipeline.engine.local import Engine

    path = write_model("qwen35moe", work / "hybrid.gguf", **HYBRID_SHAPE)
    results = {}
    for n in args.lengths:
        cache, ram = PrefixCache(work / f"cache-{n}", max_bytes=2**34), RamStates(max_states=1, max_bytes=2**34)
        engine = Engine(path, EngineConfig(n_ctx=n + 256, n_batch=2048, n_ubatch=512, threads=0))
        try:
            llm = engine.llm
            tokens = np.random.default_rng(n).integers(0, 256, n, dtype=np.int32).tolist()
            t0 = time.perf_counter()
            engine.prefill(tokens)
            llm.synchronize()
            prefill = time.perf_counter() - t0
            ns = engine.namespace
            stores = {"disk": (cache, cache.save(ns, tokens, llm)), "ram": (ram, ram.save(ns, tokens, llm))}
            times: dict[str, list[float]] = {"ram": [], "disk": []}
            for i in range(args.repeat):
                for where in (("ram", "disk") if i % 2 == 0 else ("disk", "ram")):
                    store, entry = stores[where]
                    llm.clear()
                    t0 = time.perf_counter()
                    assert store.load(entry, llm), f"the {where} state did not load"
                    times[where].append(time.perf_counter() - t0)
            ram_s, disk_s = (statistics.median(times[k]) for k in ("ram", "disk"))
            results[n] = {"tokens": n, "prefill_seconds": prefill, "state_bytes": stores["ram"][1].bytes,
                          "ram_seconds": ram_s, "disk_seconds": disk_s, "disk_over_ram": disk_s / ram_s,
                          "samples": times}
            print(f"  {n:,} tokens: state {stores['ram'][1].bytes / 2**20:.1f} MiB (prefill {prefill:.1f} s); "
                  f"restore from RAM {ram_s * 1000:.1f} ms, from disk {disk_s * 1000:.1f} ms "
                  f"({disk_s / ram_s:.1f}x)", flush=True)
        finally:
            engine.close()
    return results


def _arguments(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=6000, help="document size in generator tokens")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 2; --restore: 5)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="a 2,000-token document, one repeat")
    ap.add_argument("--restore", action="store_true",
                    help="time restoring the generated hybrid's 16K and 64K states from RAM against the disk")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _arguments(argv)
    if args.restore:
        return restore_main(args)
    args.repeat = args.repeat or 2
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
            from devtools.bench import document, row

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


def restore_main(args) -> int:
    import os

    args.repeat = args.repeat or (2 if args.quick else 5)
    args.lengths = [4096, 16384] if args.quick else [16384, 65536]
    work = Path(tempfile.mkdtemp(prefix="rag-bench-restore-"))
    load = os.getloadavg()
    print(f"restore benchmark: generated qwen35moe {HYBRID_SHAPE}; load average {load[0]:.2f}", flush=True)
    try:
        results = restore_benchmark(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| prefix | state | restore from RAM | restore from disk (page cache, checks) | disk / RAM |")
    print("| --- | --- | --- | --- | --- |")
    for r in results.values():
        print(f"| {r['tokens']:,} tokens | {r['state_bytes'] / 2**20:.1f} MiB | {r['ram_seconds'] * 1000:.1f} ms | "
              f"{r['disk_seconds'] * 1000:.1f} ms | {r['disk_over_ram']:.1f}x |")
    if args.json:
        from devtools.bench import document, row

        table = []
        for n, r in results.items():
            table += [row(f"restore_ram_{n}", r["ram_seconds"], "s"), row(f"restore_disk_{n}", r["disk_seconds"], "s"),
                      row(f"disk_over_ram_{n}", r["disk_over_ram"], "x", ratio=(f"restore_disk_{n}", f"restore_ram_{n}"))]
        args.json.write_text(json.dumps(document(table, restore=results, load_average=load), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
