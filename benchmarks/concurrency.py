"""Questions per minute and time to first token under 1, 2 and 4 concurrent clients.

Compares, in one run, on one store (``samples/`` ingested into a temporary store):

- ``serialised``: one engine (``engine.parallel = 1``), calls queue first come, first served;
- ``pool``: ``engine.parallel = 2``, two llama.cpp contexts, the cores split between them.

Each client asks its questions one after another, through ``Pipeline.ask_stream`` (TTFT
is measured from the call to the first piece, queueing included). The prefix cache is
off so that every question prefills (reuse would measure the cache, not concurrency).
llama.cpp multi-sequence batching (several sequences in one context) is not implemented.

    .venv/bin/python benchmarks/concurrency.py [--questions 8] [--clients 1,2,4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUESTIONS = [
    "What does --n-cpu-moe do?",
    "How is the prefix cache keyed?",
    "What is the KV cache?",
    "How does Chroma run embedded?",
    "What do larger micro-batches change?",
    "Which KV cache types are there?",
    "What is expert offload?",
    "How is a saved state invalidated?",
]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def run(rag, clients: int, n_questions: int) -> dict:
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
                stream = rag.ask_stream(q)
                first = None
                for _ in stream:
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=8, help="questions per configuration and client count")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="4 questions, clients 1 and 2")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.quick:
        args.questions, args.clients = 4, "1,2"
    clients = [int(c) for c in args.clients.split(",")]

    from pipeline import Pipeline

    tmp = Path(tempfile.mkdtemp(prefix="rag-bench-concurrency-"))
    base = {"store.path": str(tmp / "store"), "cache.enabled": False, "engine.n_ctx": args.ctx,
            "ask.max_tokens": args.max_tokens, "ask.top_k": 3}
    with Pipeline.from_config(overrides=base) as rag:
        rag.ingest([ROOT / "samples"])
    pipes = {name: Pipeline.from_config(overrides={**base, "engine.parallel": n})
             for name, n in (("serialised", 1), ("pool", 2))}
    for rag in pipes.values():  # load models and the pool's engines before timing
        run(rag, max(clients), max(clients))
    rows = []
    for c in clients:  # interleaved: both configurations under the same machine load
        for name, rag in pipes.items():
            row = {"config": name, **run(rag, c, args.questions)}
            rows.append(row)
            print(f"{name:10s} clients={c}  {row['questions_per_minute']:6.2f} q/min  "
                  f"TTFT p50 {row['ttft_p50']:6.2f} s  p95 {row['ttft_p95']:6.2f} s", flush=True)
    for rag in pipes.values():
        rag.close()
    print("\n| clients | configuration | questions/min | × serialised | TTFT p50 | TTFT p95 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        ref = next(r for r in rows if r["clients"] == row["clients"] and r["config"] == "serialised")
        print(f"| {row['clients']} | {row['config']} | {row['questions_per_minute']:.2f} | "
              f"{row['questions_per_minute'] / ref['questions_per_minute']:.2f} | {row['ttft_p50']:.2f} s | "
              f"{row['ttft_p95']:.2f} s |")
    if args.json:
        args.json.write_text(json.dumps({"name": "concurrency", "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
