"""The tuner's memory model against llama.cpp's own numbers, as a table: ``python -m devtools.memory_check``.

For a generated model of each architecture (``qwen3moe``, the hybrid ``qwen35moe``, ``gpt-oss``;
``--model FILE`` adds any GGUF) and each context, the KV cache (with the recurrent state) and the
compute buffer the tuner predicts (:mod:`pipeline.tuning.footprint`) beside what llama.cpp logs for
the same settings in its dry run (model param ``no_alloc``: sizes logged, nothing allocated).
Sliding-window models get two rows per context: the engine's full-size window cache and the
window-size cache (llama-server's default). Flash attention on, ``-ub 512``, f16 KV.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from pipeline.tuning.footprint import compute_buffer_bytes, dry_run, kv_bytes
from pipeline.tuning.choice import search_base
from pipeline.tuning.spec import ModelSpec

CONTEXTS = (8192, 16384, 32768, 65536)
ARCHS = ("qwen3moe", "qwen35moe", "gpt-oss")
MiB = 2**20


def rows_for(path: Path, label: str, contexts=CONTEXTS, n_ubatch: int = 512) -> list[dict]:
    """One row per context (and window-cache size) for the model at ``path``."""
    spec = ModelSpec.from_gguf(path)
    modes = (True, False) if any(lay.kind == "swa" for lay in spec.layers) else (True,)
    out = []
    for n_ctx in contexts:
        if spec.n_ctx_train and n_ctx > spec.n_ctx_train:
            continue
        settings = replace(search_base(), n_ctx=n_ctx, n_batch=max(n_ubatch, 512), n_ubatch=n_ubatch).validate()
        for swa_full in modes:
            real = dry_run(path, settings, swa_full=swa_full)
            kv, state = kv_bytes(spec, settings, swa_full=swa_full)
            cb = compute_buffer_bytes(spec, settings, swa_full=swa_full)
            out.append(dict(model=label, n_ctx=n_ctx, window=("full-size" if swa_full else "window") if len(modes) > 1
                            else "", kv_planned=kv + state, kv_llama=real.kv_cache, compute_planned=cb,
                            compute_llama=real.compute.get("CPU", real.compute_total)))
    return out


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table, sizes in MiB, ratios tuner / llama.cpp."""
    lines = ["| model | context | SWA cache | KV + state: tuner | llama.cpp | ratio | compute: tuner | llama.cpp "
             "| ratio |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['n_ctx'] // 1024}K | {r['window'] or '-'} | "
                     f"{r['kv_planned'] / MiB:.2f} | {r['kv_llama'] / MiB:.2f} | {r['kv_planned'] / r['kv_llama']:.3f} | "
                     f"{r['compute_planned'] / MiB:.2f} | {r['compute_llama'] / MiB:.2f} | "
                     f"{r['compute_planned'] / r['compute_llama']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from .synthetic import write_model

    ap = argparse.ArgumentParser(prog="python -m devtools.memory_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=[], help="also check this GGUF (repeatable)")
    ap.add_argument("-ub", "--n-ubatch", type=int, default=512, help="micro-batch size (default 512)")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rag-memory-check-") as tmp:
        for arch in ARCHS:
            path = write_model(arch, Path(tmp) / f"{arch}.gguf")
            rows += rows_for(path, f"generated {arch}", n_ubatch=args.n_ubatch)
        for model in args.model:
            rows += rows_for(Path(model), Path(model).name, n_ubatch=args.n_ubatch)
    print(table(rows))
    worst = max(max(abs(r["kv_planned"] / r["kv_llama"] - 1), abs(r["compute_planned"] / r["compute_llama"] - 1))
                for r in rows)
    print(f"\nlargest difference: {worst:.1%} (the tuner's target: within 5%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
