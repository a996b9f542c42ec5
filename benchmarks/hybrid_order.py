"""Reuse on a model that cannot compose: the earlier pack's lead first, against document order, in one run.

A recurrent or hybrid model (here a generated Qwen3.5/3.6-style ``qwen35moe``: Gated DeltaNet
layers beside gated attention, routed and shared experts) reuses only exact prefixes of saved
states. Packing therefore orders a question's chosen sections so that the longest lead of an
earlier pack among them comes first (:func:`pipeline.ask.packing.pack_shelf`); this benchmark asks the
same questions over ``samples/kv-cache-reuse.txt`` at an 8K context (a collection larger than it
in that model's byte-level tokens) with that ordering and with plain document order, each in a
fresh pipeline and cache, and prints the tokens each question reused and its time to the first
token. Its text is noise (the model is generated), its token counts and timings are real.

    .venv/bin/python benchmarks/hybrid_order.py [--questions 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402

QUESTIONS = ["How is the prefix cache keyed?", "What happens when a document changes?",
             "Which function saves the KV state?", "Why do recurrent models restore from disk?",
             "How are boundary states spread?", "What does a boundary state cost?",
             "When is a prefix too short to save?", "What happens to a damaged state file?"]


def session(work: Path, model: Path, order: bool, questions: list[str]) -> list[dict]:
    import pipeline.ask.packing as packing

    lead_first = packing._lead_first
    if not order:
        packing._lead_first = lambda prompt, *_: prompt  # document order: what packing did before
    overrides = {"models.generator": str(model), "engine.n_ctx": 8192, "ask.max_tokens": 4,
                 "store.path": str(work / "store"), "cache.path": str(work / f"cache-{order}")}
    rows = []
    try:
        with Pipeline.from_config(overrides=overrides) as rag:
            rag.ingest([work / "docs"])
            for q in questions:
                st = rag.ask(q).stats
                rows.append({"question": q, "prompt_tokens": st.prompt_tokens, "cached_tokens": st.cached_tokens,
                             "cache": str(st.cache), "ttft": st.ttft_seconds, "sections": len(st.sections)})
    finally:
        packing._lead_first = lead_first
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--questions", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from devtools.synthetic import write_model

    work = Path(tempfile.mkdtemp(prefix="rag-bench-hybrid-"))
    try:
        model = write_model("qwen35moe", work / "qwen35moe.gguf", n_ctx_train=65536)
        (work / "docs").mkdir()
        shutil.copy(ROOT / "samples" / "kv-cache-reuse.txt", work / "docs")
        questions = QUESTIONS[:args.questions]
        result = {name: session(work, model, order, questions) for name, order in (("lead first", True),
                                                                                    ("document order", False))}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| question | " + " | ".join(f"{name}: reused / prompt (TTFT s)" for name in result) + " |")
    print("| --- |" + " --- |" * len(result))
    for i, q in enumerate(questions):
        cells = [f"{r[i]['cached_tokens']:,} / {r[i]['prompt_tokens']:,} ({r[i]['ttft']:.2f})" for r in result.values()]
        print(f"| {i + 1}. {q} | " + " | ".join(cells) + " |")
    for name, rows in result.items():
        rest = rows[1:]
        print(f"{name}: median reused of questions 2-{len(rows)}: "
              f"{statistics.median(r['cached_tokens'] for r in rest):,.0f} tokens; median TTFT "
              f"{statistics.median(r['ttft'] for r in rest):.2f} s")
    if args.json:
        from devtools.bench import document, row

        rows = []
        for name, runs in result.items():
            rest = runs[1:]
            rows += [row(f"{name}: median reused tokens, questions 2-{len(runs)}",
                         statistics.median(r["cached_tokens"] for r in rest), "tokens", series=name),
                     row(f"{name}: median TTFT, questions 2-{len(runs)}",
                         statistics.median(r["ttft"] for r in rest), "s", series=name)]
        args.json.write_text(json.dumps(document(rows, sessions=result), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
