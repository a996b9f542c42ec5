"""Citation check on real PDFs no one on the project wrote: do the sources name the answer's page?

For each question the page holding its answer was found by reading the PDF. The
check is on packing alone (no generation): the answer's ``sources`` in ``auto`` mode
(the pages of the best hits inside the packed sections) against ``passages`` mode
(the pages of the packed passages), with the default models and context. Reported:
how often the answer page is among the sources of the right document, per mode.

The questions are ``benchmarks/eval/outside.jsonl`` (a development set of ``rag eval``), over the two
PDFs found on these machines under /usr/share/doc (Debian packages ``libtasn1-doc`` and
``shared-mime-info``); a PDF that is missing is skipped and said so.

    .venv/bin/python benchmarks/citations.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402

QUESTIONS = ROOT / "benchmarks" / "eval" / "outside.jsonl"  # also a `rag eval` development set


def load_questions(path: Path = QUESTIONS) -> dict[str, list[tuple[str, int]]]:
    """The questions by PDF: (question, the page that holds its answer)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            q = json.loads(line)
            out.setdefault(q["source"], []).append((q["question"], q["pages"][0]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    questions = load_questions()
    present = {p: q for p, q in questions.items() if Path(p).is_file()}
    for p in sorted(set(questions) - set(present)):
        print(f"skipped (not on this machine): {p}")
    if not present:
        print("no PDF to check")
        return 0
    work = Path(tempfile.mkdtemp(prefix="rag-bench-citations-"))
    overrides = {"store.path": str(work / "store"), "cache.enabled": False, "store.collection": "citations"}
    rows, hits = [], {"auto": 0, "passages": 0}
    try:
        with Pipeline.from_config(overrides=overrides) as rag:
            report = rag.ingest([Path(p) for p in present])
            print(report.summary())
            for pdf, questions in present.items():
                for question, page in questions:
                    row = {"pdf": Path(pdf).name, "question": question, "page": page}
                    for mode in ("auto", "passages"):
                        prompt = rag.prompt(question, mode=mode)
                        pages = sorted({p for s in prompt.sources if s["source"] == pdf for p in s["pages"]})
                        row[mode] = {"cited": page in pages, "pages": pages, "packing": prompt.mode,
                                     "prompt_tokens": len(prompt.tokens)}
                        hits[mode] += row[mode]["cited"]
                    rows.append(row)
                    print(f"  p.{page:<3} auto {'yes' if row['auto']['cited'] else 'no ':3} {row['auto']['pages']!s:24} "
                          f"passages {'yes' if row['passages']['cited'] else 'no ':3} {row['passages']['pages']!s:24} "
                          f"{question}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(rows)
    print(f"\nanswer page among the sources: auto {hits['auto']}/{n}, passages {hits['passages']}/{n} "
          f"[{'PASS' if hits['auto'] >= hits['passages'] else 'FAIL'}] auto at least as often as passages")
    if args.json:
        from devtools.bench import document, row

        table = [row("questions", n, "questions"), row("auto_cited", hits["auto"], "questions"),
                 row("passages_cited", hits["passages"], "questions")]
        args.json.write_text(json.dumps(document(table, questions=rows), indent=2))
    return 0 if hits["auto"] >= hits["passages"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
