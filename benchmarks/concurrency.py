"""Questions per minute and time to first token under 1, 2 and 4 concurrent clients.

Compares, in one run, on one document (``samples/kv-cache-reuse.txt``, packed whole, so
every question shares the document prefix, the product's main case):

- ``serialised``: one engine (``engine.parallel = 1``); calls queue first come, first served;
  the engine keeps the document prefix in its KV cache, so each question prefills only itself;
- ``pool``: ``engine.parallel = 2``: two llama.cpp contexts, the cores split between them
  (each engine holds its own copy of the prefix);
- ``multi-seq``: one engine with ``engine.n_seq_max = 4``; a batcher takes every question
  waiting at that moment and answers them with ``Pipeline.ask_many`` (the shared prefix once,
  the questions decoded together, one decode call per step). Its answers are not streamed:
  its "TTFT" is the time to the whole answer.

Each client asks its questions one after another (TTFT from the call to the first
piece, queueing included). Every configuration is warmed first (models loaded, prefix
prefilled), so the figures are the steady state. The disk prefix cache is off.

    .venv/bin/python benchmarks/concurrency.py [--questions 8] [--clients 1,2,4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DOC = ROOT / "samples" / "kv-cache-reuse.txt"
QUESTIONS = [
    "How is the prefix cache keyed?",
    "What is the KV cache?",
    "How is a saved state invalidated?",
    "What does a cache hit save?",
    "Why must prompts share a prefix?",
    "What is stored on disk?",
    "How large is a saved state?",
    "When is a state not reused?",
]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Batcher:
    """Concurrent questions answered together: a worker takes every question waiting and calls ask_many."""

    def __init__(self, rag, max_batch: int):
        self.rag, self.max_batch = rag, max_batch
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._work, daemon=True).start()

    def ask(self, question: str):
        done: dict = {"event": threading.Event()}
        self._q.put((question, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done["answer"]

    def _work(self) -> None:
        while True:
            batch = [self._q.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            try:
                answers = self.rag.ask_many([q for q, _ in batch])
                for (_, done), a in zip(batch, answers):
                    done["answer"] = a
            except BaseException as exc:  # noqa: BLE001 - handed to every waiting client
                for _, done in batch:
                    done["error"] = exc
            for _, done in batch:
                done["event"].set()


def run(ask, clients: int, n_questions: int) -> dict:
    """``ask(question)`` returns an iterator of pieces; ``clients`` threads share ``n_questions``."""
    ttfts: list[float] = []
    errors: list[BaseException] = []
    todo = [QUESTIONS[i % len(QUESTIONS)] for i in range(n_questions)]
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                q = todo.pop(0)
            t0 = time.perf_counter()
            try:
                first = None
                for _ in ask(q):
                    if first is None:
                        first = time.perf_counter() - t0
                with lock:
                    ttfts.append(first if first is not None else time.perf_counter() - t0)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
                return

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return {"clients": clients, "questions": n_questions, "seconds": round(wall, 2),
            "questions_per_minute": round(60 * n_questions / wall, 2),
            "ttft_p50": round(percentile(ttfts, 0.5), 2), "ttft_p95": round(percentile(ttfts, 0.95), 2)}


def gpu_model(*, gpu: str = "h100", context: int = 16384, streams=(1, 2, 4)) -> list[dict]:
    """A model, not a measurement: decode throughput of k concurrent answers on one GPU.

    Qwen3.6-35B-A3B (published shapes), all on the GPU, ``context`` tokens in each
    sequence's cache. A decode step is bound by the bytes it reads (the tuner's decode
    model): the dense weights once, the experts the step's tokens route to, and each
    sequence's KV cache. ``multi-seq``: k sequences in one step, so dense weights are
    read once for all and the experts of k tokens are the expected number of distinct
    experts ``E * (1 - (1 - used/E)**k)`` per layer. ``pool``: k contexts on one GPU,
    each step its own (weights read k times; the GPU runs them one after another), so
    the aggregate is about one stream's. ``serialised`` is one stream.
    """
    from pipeline.config import EngineConfig
    from pipeline.engine.gguf.ggml import type_bytes
    from pipeline.tuning.hardware import get_profile
    from pipeline.tuning.footprint import kv_cells
    from pipeline.tuning.spec import ModelSpec

    spec, hw = ModelSpec.qwen36_35b_a3b(quant="Q6_K"), get_profile(gpu)
    settings = EngineConfig(n_ctx=context, gpu_layers=-1, flash_attn=True)

    def step_bytes(k: int) -> float:
        total = spec.output_bytes
        for lay in spec.layers:
            if lay.kind == "recurrent":
                per_seq = 2 * lay.state_bytes
            else:
                per_seq = min(context, kv_cells(lay, settings)) * (
                    type_bytes(lay.n_head_kv * lay.head_dim_k, settings.type_k)
                    + type_bytes(lay.n_head_kv * lay.head_dim_v, settings.type_v))
            distinct = 1 - (1 - spec.n_experts_used / spec.n_experts) ** k if spec.n_experts else 1.0
            total += lay.other_bytes + distinct * lay.expert_bytes + k * per_seq
        return total

    one = step_bytes(1) / hw.gpu_mem_bw
    rows = []
    for k in streams:
        batched = step_bytes(k) / hw.gpu_mem_bw
        for name, tps in (("serialised", 1 / one), ("pool", 1 / one), ("multi-seq", k / batched)):
            rows.append({"streams": k, "config": name, "decode_tokens_per_s": round(tps, 1),
                         "x_serialised": round(tps * one, 2)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=8, help="questions per configuration and client count")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="4 questions per row, 1 and 2 clients")
    ap.add_argument("--gpu-model", action="store_true", help="print the modelled GPU case only (no models run)")
    args = ap.parse_args()
    if args.quick:
        args.questions, args.clients = 4, "1,2"
    clients = [int(c) for c in args.clients.split(",")]
    if args.gpu_model:
        print("MODEL, not measured: Qwen3.6-35B-A3B Q6_K on one H100, 16K tokens per sequence, decode only")
        print("\n| concurrent answers | configuration | decode tokens/s (all answers) | × serialised |")
        print("| --- | --- | --- | --- |")
        for r in gpu_model(streams=clients):
            print(f"| {r['streams']} | {r['config']} | {r['decode_tokens_per_s']:,.0f} | {r['x_serialised']:.2f} |")
        return 0

    from pipeline import Pipeline

    tmp = Path(tempfile.mkdtemp(prefix="rag-bench-concurrency-"))
    base = {"store.path": str(tmp / "store"), "cache.enabled": False, "engine.n_ctx": args.ctx,
            "ask.max_tokens": args.max_tokens}
    with Pipeline.from_config(overrides=base) as rag:
        rag.ingest([DOC])
    pipes = {"serialised": Pipeline.from_config(overrides={**base, "engine.parallel": 1}),
             "pool": Pipeline.from_config(overrides={**base, "engine.parallel": 2}),
             "multi-seq": Pipeline.from_config(overrides={**base, "engine.n_seq_max": 4})}
    batcher = Batcher(pipes["multi-seq"], max_batch=4)
    asks = {"serialised": pipes["serialised"].ask_stream, "pool": pipes["pool"].ask_stream,
            "multi-seq": lambda q: iter([batcher.ask(q).text])}
    modes = set()
    for name, ask in asks.items():  # load the models, prefill the prefix on every engine, before timing
        run(ask, max(clients), max(clients))
        modes.add(pipes[name].ask(QUESTIONS[0]).stats.mode)
    rows = []
    for c in clients:  # interleaved: every configuration under the same machine load
        for name, ask in asks.items():
            row = {"config": name, **run(ask, c, args.questions)}
            rows.append(row)
            print(f"{name:10s} clients={c}  {row['questions_per_minute']:6.2f} q/min  "
                  f"TTFT p50 {row['ttft_p50']:6.2f} s  p95 {row['ttft_p95']:6.2f} s", flush=True)
    for rag in pipes.values():
        rag.close()
    print(f"\npacking mode: {', '.join(sorted(modes))}; {args.questions} questions per row, "
          f"max_tokens {args.max_tokens}, n_ctx {args.ctx}")
    print("\n| clients | configuration | questions/min | × serialised | TTFT p50 | TTFT p95 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ref = next(r for r in rows if r["clients"] == row["clients"] and r["config"] == "serialised")
        print(f"| {row['clients']} | {row['config']} | {row['questions_per_minute']:.2f} | "
              f"{row['questions_per_minute'] / ref['questions_per_minute']:.2f} | {row['ttft_p50']:.2f} s | "
              f"{row['ttft_p95']:.2f} s |")
    if args.json:
        from devtools.bench import document, row

        table = []
        for r in rows:
            at = {"clients": r["clients"], "series": r["config"]}
            table += [row("questions_per_minute", r["questions_per_minute"], "q/min", **at),
                      row("ttft_p50_seconds", r["ttft_p50"], "s", **at), row("ttft_p95_seconds", r["ttft_p95"], "s", **at)]
        args.json.write_text(json.dumps(document(table, measured=rows, gpu_model=gpu_model(streams=clients)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
