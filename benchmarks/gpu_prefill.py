"""GPU prefill benchmark: measured prefill tokens/s next to the tuner's estimates.

Meant for one call of at most 10 minutes on one H200 (the device tool)::

    python benchmarks/gpu_prefill.py [--json OUT.json] [--contexts 16384,65536] [--qtype q8_0]
                                     [--budget-gib 24] [--wheelhouse DIR] [--skip-build] [--dry-run]

What it does, in order:

1. **Build** llama-cpp-python with CUDA for that GPU only (``-DGGML_CUDA=ON
   -DCMAKE_CUDA_ARCHITECTURES=90`` plus the CPU's instruction sets, never native)
   through ``python pipeline/_build.py`` with ``RAG_LLAMA_CMAKE_ARGS`` set. The
   device machine cannot download: pass ``--wheelhouse DIR`` holding the
   ``llama_cpp_python-0.3.36.tar.gz`` sdist, its build backend
   (scikit-build-core and its dependencies) and numpy/typing-extensions/diskcache/
   jinja2/gguf wheels for the device's Python (3.12); it becomes ``PIP_FIND_LINKS``
   with ``PIP_NO_INDEX=1``. ``--skip-build`` uses the llama_cpp already installed.
2. **Generate** a timing model with Qwen3-30B-A3B's shapes (48 layers, 2048
   embd, 32 heads, 4 KV heads, head 128, 128 experts, 8 used, expert ff 768,
   vocabulary 151,936) with :func:`devtools.synthetic.write_timing_moe_model`:
   zero matrices at ``--qtype`` (q8_0 by default: about 32 GB, so a 24 GB budget
   needs experts in host memory; f16 would be about 61 GB, close to the device's
   64 GiB disk), random embeddings and routers so routing varies per token.
3. **Measure** prefill (``Llama.eval`` of a random prompt, from an empty cache) at
   each context length for three configurations: the recipe's settings (8 layers'
   experts on the CPU, ``-b 1024 -ub 512``, f16 KV, flash attention, no mmap), the
   tuner's plan for a simulated 24 GB budget, and everything on the GPU. Each
   configuration is loaded once at the largest context.
4. **Print** measured vs estimated (the ``h200`` profile) and the effective GPU
   FLOP/s and host-to-device bandwidth implied by the measurements, and write JSON.

``--dry-run`` prints the plan of all this (commands, model size, configurations
and their estimates) without building, writing or loading anything.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

QWEN3_30B_A3B = dict(n_layers=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_experts=128,
                     n_experts_used=8, expert_ff=768, vocab=151_936, n_ctx_train=65536)
#: ``--smoke``: the same architecture, small enough to run the whole measurement path on a CPU in seconds
#: (a check of the code and of the target's Python, before spending GPU time; its figures mean nothing).
SMOKE = dict(n_layers=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_experts=8, n_experts_used=2,
             expert_ff=128, vocab=2000, n_ctx_train=4096)
GiB = 1024**3


def cuda_cmake_args() -> list[str]:
    from pipeline._build import cmake_args, cpu_flags

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return cmake_args(cpu_flags(cpuinfo)) + ["-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]


def build(args: argparse.Namespace, log) -> None:
    env = dict(os.environ, RAG_LLAMA_CMAKE_ARGS=" ".join(cuda_cmake_args()))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 8))
    if args.wheelhouse:
        env["PIP_FIND_LINKS"] = str(Path(args.wheelhouse).resolve())
        env["PIP_NO_INDEX"] = "1"
    cmd = [sys.executable, str(ROOT / "pipeline" / "_build.py")]
    log(f"build: RAG_LLAMA_CMAKE_ARGS='{env['RAG_LLAMA_CMAKE_ARGS']}' {' '.join(cmd)}")
    if args.dry_run:
        return
    t = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    log(f"build: done in {time.perf_counter() - t:.0f} s")


def model_spec_from_shapes(qtype: str, shapes: dict | None = None):
    """The tuner's spec of the timing model, from the shapes alone (nothing written)."""
    from pipeline.tuning.spec import ModelSpec
    from devtools.synthetic import byte_vocab, moe_tensor_shapes

    s = shapes or QWEN3_30B_A3B
    n_vocab = len(byte_vocab(s["vocab"])[0])
    shapes = moe_tensor_shapes(n_layers=s["n_layers"], n_embd=s["n_embd"], n_head=s["n_head"],
                               n_head_kv=s["n_head_kv"], head_dim=s["head_dim"], n_experts=s["n_experts"],
                               expert_ff=s["expert_ff"], n_vocab=n_vocab)
    tensors = []
    for name, shape in shapes:
        t = "f32" if (len(shape) == 1 or ".ffn_gate_inp." in name) else ("f16" if name == "token_embd.weight"
                                                                           else qtype)
        tensors.append((name, tuple(reversed(shape)), t))
    arch = "qwen3moe"
    meta = {"general.architecture": arch, f"{arch}.block_count": s["n_layers"],
            f"{arch}.embedding_length": s["n_embd"], f"{arch}.attention.head_count": s["n_head"],
            f"{arch}.attention.head_count_kv": s["n_head_kv"], f"{arch}.attention.key_length": s["head_dim"],
            f"{arch}.attention.value_length": s["head_dim"], f"{arch}.expert_count": s["n_experts"],
            f"{arch}.expert_used_count": s["n_experts_used"],
            f"{arch}.expert_feed_forward_length": s["expert_ff"], f"{arch}.context_length": s["n_ctx_train"]}
    name = "smoke" if shapes is SMOKE else "qwen3-30b-a3b-shapes"
    return ModelSpec.from_metadata(meta, tensors, name=f"{name}-{qtype}")


def configurations(spec, n_ctx: int, budget_gib: float):
    from dataclasses import replace

    from pipeline.tuning.hardware import get_profile
    from pipeline.tuning.choice import fastest, recipe_plan, search_base
    from pipeline.tuning.result import Budget, evaluate

    hw = get_profile("h200")
    budget24 = Budget(vram=int(budget_gib * GiB), ram=hw.ram)
    planned = fastest(spec, hw, n_ctx=n_ctx, budget=budget24)
    return hw, [
        ("recipe", recipe_plan(n_ctx)),
        (f"plan for {budget_gib:g} GiB", planned.settings),
        ("all on GPU", replace(search_base(), n_ctx=n_ctx, n_batch=2048, n_ubatch=2048)),
    ], evaluate


def measure(args: argparse.Namespace, log) -> dict:
    import numpy as np

    from devtools.synthetic import write_timing_moe_model

    contexts = sorted(int(c) for c in args.contexts.split(","))
    work = Path(args.work)
    shapes = SMOKE if args.smoke else QWEN3_30B_A3B
    spec = model_spec_from_shapes(args.qtype, shapes)
    hw, configs, evaluate = configurations(spec, max(contexts), args.budget_gib)
    log(f"model: {spec.name}, {spec.total_bytes / GiB:.1f} GiB, experts {spec.expert_bytes / GiB:.1f} GiB")
    from pipeline.tuning.result import llama_flags

    for label, p in configs:
        log(f"config {label}: " + " ".join(llama_flags(p, spec.n_layers)))
        for ctx in contexts:
            est = evaluate(spec, p, hw, n_tokens=ctx, label=label)
            log(f"  estimate at {ctx}: {est.prefill.tokens_per_s:.0f} tok/s ({est.prefill.bound}-bound), "
                f"GPU {est.memory.gpu.total / GiB:.1f} GiB")
    if args.dry_run:
        log(f"would write the model to {work / (spec.name + '.gguf')} and measure {len(configs)} configs "
            f"at {contexts} tokens")
        return {}

    path = work / f"{spec.name}.gguf"
    if not path.exists():
        t = time.perf_counter()
        write_timing_moe_model(path, qtype=args.qtype, **shapes)
        log(f"model: written in {time.perf_counter() - t:.0f} s ({path.stat().st_size / GiB:.1f} GiB)")

    from dataclasses import replace

    from pipeline.engine.local import Engine

    rng = random.Random(0)
    rows = []
    deadline = time.perf_counter() + args.max_seconds
    for label, p in configs:
        if time.perf_counter() > deadline:
            log(f"skipping {label}: out of time")
            continue
        t = time.perf_counter()
        engine = Engine(path, replace(p, threads=os.cpu_count() or 8))  # the engine's own loading and overrides
        llm = engine.llm
        load_s = time.perf_counter() - t
        try:
            for ctx in contexts:
                if time.perf_counter() > deadline:
                    break
                tokens = np.array([rng.randrange(300, spec.n_vocab) for _ in range(ctx - 8)], dtype=np.int32)
                llm.clear()
                t = time.perf_counter()
                for lo in range(0, len(tokens), llm.n_batch):
                    llm.decode(tokens[lo:lo + llm.n_batch], lo)
                llm.synchronize()
                sec = time.perf_counter() - t
                est = evaluate(spec, p, hw, n_tokens=len(tokens), label=label)
                row = dict(config=label, n_ctx=p.n_ctx, prompt_tokens=len(tokens), seconds=sec,
                           measured_tok_s=len(tokens) / sec, estimated_tok_s=est.prefill.tokens_per_s,
                           estimated_bound=est.prefill.bound, estimated_seconds=est.prefill.seconds,
                           load_seconds=load_s, flags=llama_flags(p, spec.n_layers),
                           estimated_gpu_gib=est.memory.gpu.total / GiB)
                rows.append(row)
                log(f"{label} @ {len(tokens)}: measured {row['measured_tok_s']:.0f} tok/s, "
                    f"estimated {row['estimated_tok_s']:.0f}")
        finally:
            engine.close()
    from devtools.bench import document, row

    declared = []
    for r in rows:
        at = dict(n_ubatch=int(r["flags"][r["flags"].index("-ub") + 1]), series=r["config"], context=r["prompt_tokens"])
        declared.append(row(f"{r['config']} @ {r['prompt_tokens']}: measured", r["measured_tok_s"], "tok/s", **at))
        declared.append(row(f"{r['config']} @ {r['prompt_tokens']}: estimated", r["estimated_tok_s"], "tok/s"))
    return document(declared, measurements=rows, implied=implied_constants(rows, spec, hw))


def implied_constants(rows: list[dict], spec, hw) -> dict:
    """Effective GPU FLOP/s (from 'all on GPU') and pinned h2d bandwidth (from the offloaded runs)."""
    out: dict[str, float] = {}
    gpu_rows = [r for r in rows if r["config"] == "all on GPU"]
    if gpu_rows:
        r = max(gpu_rows, key=lambda r: r["prompt_tokens"])
        est = r["estimated_seconds"]
        out["gpu_flops"] = hw.gpu_flops * (est["gpu"] / r["seconds"])
    bws = []
    for r in rows:
        est = r["estimated_seconds"]
        if r["config"] != "all on GPU" and est["copy"] > 0:
            gpu_part = est["gpu"] * (hw.gpu_flops / out.get("gpu_flops", hw.gpu_flops))
            left = r["seconds"] - gpu_part - est["cpu"]
            if left > 0:
                bws.append(hw.h2d_pinned * est["copy"] / left)
    if bws:
        out["h2d_pinned"] = sum(bws) / len(bws)
    return out


def table(rows: list[dict]) -> str:
    lines = ["| configuration | prompt tokens | measured tok/s | estimated tok/s (bound) | est / measured |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['prompt_tokens']} | {r['measured_tok_s']:.0f} | "
                     f"{r['estimated_tok_s']:.0f} ({r['estimated_bound']}) | "
                     f"{r['estimated_tok_s'] / r['measured_tok_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="print what would be done, do nothing")
    ap.add_argument("--json", default="gpu_prefill.json", help="where to write the results (default %(default)s)")
    ap.add_argument("--contexts", default="16384,65536", help="prompt lengths, comma-separated")
    ap.add_argument("--qtype", default="q8_0", choices=("q8_0", "q4_0", "f16"), help="matrix type of the model")
    ap.add_argument("--budget-gib", type=float, default=24.0, help="simulated VRAM budget for the plan")
    ap.add_argument("--work", default="/tmp/gpu-prefill",
                    help="folder for the generated model")
    ap.add_argument("--wheelhouse", help="offline package folder for the build (PIP_FIND_LINKS)")
    ap.add_argument("--skip-build", action="store_true", help="use the llama_cpp already installed")
    ap.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--max-seconds", type=float, default=240, help="time allowed for the measurements")
    ap.add_argument("--smoke", action="store_true",
                    help="a tiny model of the same architecture at 512 and 1024 tokens: runs every step on a CPU in "
                         "seconds, to check the code and the Python it runs with (the figures mean nothing)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.contexts = "512,1024"

    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    log(f"python {platform.python_version()} on {platform.node()}")
    if not args.skip_build and not args.measure_only:
        build(args, log)
        if not args.dry_run:
            # measure in a fresh interpreter: the new llama_cpp must be imported after the install
            cmd = [sys.executable, __file__, "--measure-only", "--json", args.json, "--contexts", args.contexts,
                   "--qtype", args.qtype, "--budget-gib", str(args.budget_gib), "--work", args.work,
                   "--max-seconds", str(args.max_seconds), *(["--smoke"] if args.smoke else [])]
            return subprocess.run(cmd).returncode
    result = measure(args, log)
    if args.dry_run:
        return 0
    result.update(device=platform.node(), qtype=args.qtype, budget_gib=args.budget_gib,
                  shapes=SMOKE if args.smoke else QWEN3_30B_A3B, smoke=args.smoke, total_seconds=time.perf_counter() - t0)
    print(table(result["measurements"]))
    if result["implied"]:
        print("implied constants:", json.dumps(result["implied"]))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
