"""KV cells a composed prompt needs, against the prompt's own length, at a 64K context.

A prompt of k sections is composed from section states (each restored into a scratch
sequence, moved to its place, joined to the prompt's sequence, its first tokens recomputed)
in a context whose KV cache has exactly as many cells as the prompt needs (the prompt, the
question and the first answer token): if composing ever needed more cells than that, a
restore or a decode would fail. After each section the cells in use are counted
(llama.cpp's own state, every sequence) and compared with the positions the prompt holds.

Model: a generated qwen3moe (4 layers, 8 experts; devtools/synthetic/): its text is
noise, its KV cache is real.

    .venv/bin/python benchmarks/compose_memory.py [--ctx 65536] [--sections 15] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.synthetic import write_moe_model  # noqa: E402
from pipeline.engine import _llama  # noqa: E402
from pipeline.engine._llama import composing as mem  # noqa: E402
from pipeline.engine.reuse.compose import Piece, Seams, StatesInMemory, compose  # noqa: E402


def decode(model, tokens, pos):
    for lo in range(0, len(tokens), model.n_batch):
        mem.decode_outputs(model, np.asarray(tokens[lo:lo + model.n_batch], np.int32), pos + lo)


def run(ctx: int, k: int, r: int, threads: int) -> dict:
    rng = np.random.default_rng(22)
    head = [int(t) for t in rng.integers(3, 250, 32)]
    question = [int(t) for t in rng.integers(3, 250, 31)]
    room = ctx - 1 - len(head) - len(question)
    sizes = [room // k] * (k - 1) + [room - (k - 1) * (room // k)]  # the documents fill the context exactly
    pieces = [Piece(tuple(int(t) for t in rng.integers(3, 250, n))) for n in sizes]
    docs_end = len(head) + room
    need = docs_end + len(question) + 1  # the prompt, and the first answer token's cell
    with tempfile.TemporaryDirectory() as tmp:
        path = write_moe_model(Path(tmp) / "moe.gguf", n_ctx_train=ctx)
        m = _llama.load(path, n_ctx=ctx, n_batch=2048, n_ubatch=512, threads=threads, flash_attn=True, n_seq_max=2)
        try:
            states = StatesInMemory()
            t0 = time.perf_counter()
            for p in pieces:  # each section's state, computed on its own after the head
                m.clear()
                decode(m, head, 0)
                compose(m, head, [p], states, Seams("none"))
            t_states = time.perf_counter() - t0
            m.clear()
            decode(m, head, 0)
            steps, held = [], len(head)
            t0 = time.perf_counter()
            for j in range(k):  # one section at a time, counting the cells after each
                compose(m, head, pieces[:j + 1], states, Seams("first", r), held=j)
                held += sizes[j]
                steps.append({"positions": held, "cells": mem.memory_cells(m)})
            t_compose = time.perf_counter() - t0
            decode(m, question, docs_end)
            token = int(mem.output_logits(m, 1)[0].argmax())
            mem.decode_outputs(m, [token], docs_end + len(question))
            final = mem.memory_cells(m)
        finally:
            m.close()
    return {"n_ctx": ctx, "sections": k, "section_tokens": sizes[0], "seam_tokens": r, "prompt_tokens": need - 1,
            "cells_needed": need, "cells_after_each_section": steps, "cells_at_answer": final,
            "max_excess": max(s["cells"] - s["positions"] for s in steps), "states_seconds": t_states,
            "compose_seconds": t_compose}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctx", type=int, default=65536)
    ap.add_argument("--sections", type=int, default=15)
    ap.add_argument("--seam", type=int, default=32, help="tokens recomputed at each seam")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="a 16K context")
    args = ap.parse_args(argv)
    from pipeline.engine.host import usable_cpus

    ctx = 16384 if args.quick else args.ctx
    out = run(ctx, args.sections, args.seam, args.threads or usable_cpus())
    ok = out["max_excess"] == 0 and out["cells_at_answer"] == out["cells_needed"] <= ctx
    print(f"n_ctx {ctx:,}: {args.sections} sections of {out['section_tokens']:,} tokens composed "
          f"({args.seam} recomputed at each seam) in a context of {ctx:,} cells; prompt {out['prompt_tokens']:,} "
          f"tokens")
    print(f"cells in use after each section minus positions held: max {out['max_excess']}; at the first answer "
          f"token {out['cells_at_answer']:,} of {out['cells_needed']:,} needed  [{'PASS' if ok else 'FAIL'}]")
    print(f"(states {out['states_seconds']:.1f} s, compose {out['compose_seconds']:.1f} s)")
    if args.json:
        from devtools.bench import document, row

        rows = [row("max_excess_cells", out["max_excess"], "cells"),
                row("cells_at_answer", out["cells_at_answer"], "cells"),
                row("prompt_tokens", out["prompt_tokens"], "tokens")]
        args.json.write_text(json.dumps(document(rows, **out), indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
