"""Whether composition's calibration decides the same way on the next machine: the same collection calibrated with
1 and with 2 threads, side by side in one run.

A small model's answer moves with the CPU's arithmetic (the order float sums are taken in), so one prompt's
KL can land on either side of the budget. The calibration measures several prompts over different parts of
the collection and decides on their mean (pipeline/warm/calibration.py). For each collection and thread
count this prints each prompt's KL, their mean and spread, the verdict, and what one prompt alone (the
first) would have decided; and the calibration's cost in tokens prefilled exactly, against one question's
prompt.

Collections (development documents, as PDFs of 60-line pages): ``manual`` (wget, about 3x the 8K
context), ``shelf`` (bash, tmux, valgrind, jq, wget, about 27x), ``samples`` (the bundled samples/).

    .venv/bin/python benchmarks/calibration.py [--collections manual,shelf,samples] [--threads 1,2]
        [--generator builtin:gemma-3-270m] [--json OUT]
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline import Pipeline  # noqa: E402


def folder_of(name: str, work: Path) -> Path:
    import _session_proof

    if name == "samples":
        return ROOT / "samples"
    names = _session_proof.MANUAL if name == "manual" else _session_proof.SHELF
    folder = work / name
    for n in names:
        _session_proof.manpage_pdf(n, folder)
    return folder


def calibrate(store: Path, cache: Path, *, threads: int, generator: str | None) -> dict:
    from pipeline.warm import calibration
    from pipeline.warm.sections import shelf_of

    overrides = {"store.path": str(store), "cache.path": str(cache), "engine.threads": threads}
    if generator:
        overrides["models.generator"] = generator
    with Pipeline.from_config(overrides=overrides) as rag:
        rt = rag.runtime
        shelf, _ = shelf_of(rt, require=True)
        prompts = calibration.wanted_prompts(rt, shelf)
        t0 = time.perf_counter()
        calibration.calibrate(rt, prompts)
        seconds = time.perf_counter() - t0
        record = rt.engine.calibration
        budget = rt.compose_policy.max_kl
        question = rt.layout().budget(n_ctx=rt.engine.n_ctx, reserve=rt.reserve(), suffix_tokens=0)
    return {"threads": threads, "kls": list(record.kls), "kl": record.kl, "spread": record.spread,
            "top1": record.top1, "tokens": record.tokens, "allowed": record.allowed(budget), "budget": budget,
            "first_alone": record.kls[0] <= budget, "prompt_tokens": [len(p.tokens) for p in prompts],
            "one_question": question, "seconds": seconds}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default="manual,shelf")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--generator", help="a model reference (default: the configured generator)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rag-bench-calibration-"))
    results = []
    try:
        for name in args.collections.split(","):
            folder = folder_of(name, work)
            store = work / f"store-{name}"
            with Pipeline.from_config(overrides={"store.path": str(store), "cache.enabled": False,
                                                 **({"models.generator": args.generator} if args.generator else {})}
                                      ) as rag:
                report = rag.ingest([folder], warm=False)
            print(f"{name}: {report.tokens:,} tokens ingested", flush=True)
            for t in (int(x) for x in args.threads.split(",")):
                r = calibrate(store, work / f"cache-{name}-{t}", threads=t, generator=args.generator)
                r["collection"], r["collection_tokens"] = name, report.tokens
                results.append(r)
                print(f"  {t} thread(s): KL {r['kl']:.4f} (prompts {', '.join(f'{k:.4f}' for k in r['kls'])}; spread "
                      f"{r['spread']:.4f}), allowed {r['allowed']}; the first prompt alone: allowed "
                      f"{r['first_alone']}; {r['seconds']:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| collection | threads | KL of each prompt | mean | spread | verdict (mean) | first prompt alone | "
          "prefilled exactly (one question) |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        verdict = lambda ok: "composes" if ok else "stays exact"  # noqa: E731
        print(f"| {r['collection']} ({r['collection_tokens']:,} tokens) | {r['threads']} | "
              f"{', '.join(f'{k:.4f}' for k in r['kls'])} | {r['kl']:.4f} | {r['spread']:.4f} | "
              f"{verdict(r['allowed'])} | {verdict(r['first_alone'])} | {sum(r['prompt_tokens']):,} "
              f"({r['one_question']:,}) |")
    by = {}
    for r in results:
        by.setdefault(r["collection"], set()).add(r["allowed"])
    stable = all(len(v) == 1 for v in by.values())
    print(f"\nthe verdict is the same at every thread count: {'PASS' if stable else 'FAIL'}; mean spread "
          f"{statistics.fmean(r['spread'] for r in results):.4f}")
    if args.json:
        from devtools.bench import document, row

        rows = [row(f"{r['collection']} {r['threads']} thread(s) mean KL", r["kl"], "nats", series=r["collection"])
                for r in results]
        rows += [row(f"{r['collection']} {r['threads']} thread(s) KL spread", r["spread"], "nats",
                     series=r["collection"]) for r in results]
        args.json.write_text(json.dumps(document(rows, runs=results), indent=2))
    return 0 if stable else 1


if __name__ == "__main__":
    raise SystemExit(main())
