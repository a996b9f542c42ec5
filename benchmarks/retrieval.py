"""Retrieval benchmark: the development set through every retrieval setting, with and without
contextual chunks, in one run.

Run from the repository root::

    .venv/bin/python benchmarks/retrieval.py [--questions benchmarks/eval/devset.jsonl] [--json OUT.json]

It ingests ``samples/`` and ``benchmarks/eval/generated/`` into two fresh temporary stores
(``chunking.contextual`` on, the default, and off), then runs ``Pipeline.evaluate`` over the
question set for dense, lexical, hybrid, hybrid+mmr and hybrid+rerank on each, and prints the
``rag eval`` table (recall@1/5/10, MRR, nDCG@10, median query latency per stage) and the ingest
rate of each store. The same figures come from ``rag eval``; this script only makes the two
stores. This is a benchmark, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402
from pipeline.retrieval.evaluate import SETTINGS, table  # noqa: E402

CORPUS = [ROOT / "samples", ROOT / "benchmarks" / "eval" / "generated"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=Path, default=ROOT / "benchmarks" / "eval" / "devset.jsonl")
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    args = ap.parse_args(argv)
    reports, ingests = [], {}
    with tempfile.TemporaryDirectory(prefix="rag-retrieval-") as tmp:
        for label, contextual in (("contextual chunks", True), ("plain chunks", False)):
            rag = Pipeline.from_config(overrides={"store.path": f"{tmp}/{int(contextual)}",
                                                  "chunking.contextual": contextual})
            try:
                rag.embedder.embed(["warm up"])  # the model load is not ingest time
                report = rag.ingest(CORPUS)
                ingests[label] = {"chunks": report.chunks, "tokens": report.tokens,
                                  "seconds": round(report.seconds, 3),
                                  "tokens_per_second": round(report.tokens / report.seconds, 1)}
                reports.append(rag.evaluate(args.questions, settings=list(SETTINGS), label=label))
            finally:
                rag.close()
    print(f"questions: {args.questions}; corpus: {', '.join(str(c.relative_to(ROOT)) for c in CORPUS)}")
    print(table(reports))
    print()
    for label, i in ingests.items():
        print(f"ingest, {label}: {i['chunks']} chunks, {i['tokens']:,} tokens in {i['seconds']:.2f} s "
              f"({i['tokens_per_second']:,.0f} tokens/s)")
    for r in reports:
        for u in r.unreachable:
            print(f"warning: question {u['id']}: {u['reason']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        from devtools.bench import document, row

        rows = []
        for r in reports:
            chunks = "contextual" if r.label.startswith("contextual") else "plain"
            for s in r.settings:
                d = s.summary()
                rows += [row(f"{chunks} {d['setting']} recall@5", d["recall@5"], "", chunks=chunks,
                             setting=d["setting"]),
                         row(f"{chunks} {d['setting']} MRR", d["mrr"], "", chunks=chunks, setting=d["setting"])]
        for label, i in ingests.items():
            rows.append(row(f"ingest tokens/s, {label}", i["tokens_per_second"], "tokens/s"))
        args.json.write_text(json.dumps(document(rows, ingest=ingests,
                                                 reports=[r.to_dict(details=False) for r in reports]), indent=2))
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
