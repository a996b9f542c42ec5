"""Session case (e): what a new user gets with the defaults, on a manual and on a shelf far larger than the context.

Two collections of real documents from the development set (man pages no one here wrote, as
PDFs of 60-line pages): one manual about 3x the 8K context (wget), and a shelf of five manuals
about 27x it (bash, tmux, valgrind, jq, wget). For each, in one run:

* **defaults**: a fresh home, ``rag ingest`` with the defaults (it calibrates composition and
  saves the section states it has room for), then each question a new ``rag ask`` process;
* **exact**: ``ask.compose = "off"`` and the prefix cache off, its own fresh store: every
  question prefilled exactly, as a user who turns composition off gets it.

Reported per collection: the ingest (seconds, the states it saved or left, the calibration it
measured: KL of each prompt, their mean and spread, and the verdict ``rag status --json``
shows), the median TTFT of each session and their ratio, and how often the answer's page is
among the answer's sources. Targets: the defaults' median at most a tenth of exact's, and the
answer's page cited as often as exact's within one question. Questions were written before any
measurement (benchmarks/eval/manpages.jsonl); these are development documents, so the figures
are development figures.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from _session_defaults import answer_page
from _session_shelf import page_cited, rag_process

ROOT = Path(__file__).resolve().parent.parent
LINES_PER_PAGE = 60
MANUAL = ["wget"]
SHELF = ["bash", "tmux", "valgrind", "jq", "wget"]
PER_MANUAL = {"wget": 8}
PER_SHELF = {"bash": 3, "tmux": 3, "valgrind": 2, "jq": 2, "wget": 2}


def manpage_pdf(name: str, folder: Path) -> Path:
    """The development set's man page ``name`` as a PDF of 60-line pages."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from support.pdfs import make_pdf  # the project's own minimal PDF writer

    lines = (ROOT / f"benchmarks/eval/manpages/{name}.txt").read_text().splitlines()
    pages = ["\n".join(line[:110] for line in lines[i:i + LINES_PER_PAGE]) for i in range(0, len(lines), LINES_PER_PAGE)]
    folder.mkdir(parents=True, exist_ok=True)
    return make_pdf(folder / f"{name}-manual.pdf", pages, title=f"{name} manual")


def questions_for(counts: dict[str, int]) -> list[dict]:
    """The first ``counts[name]`` development questions of each man page, interleaved (one of each in turn)."""
    every = [json.loads(line) for line in (ROOT / "benchmarks/eval/manpages.jsonl").read_text().splitlines()
             if line.strip()]
    per = {name: [q for q in every if q["source"] == f"{name}.txt"][:n] for name, n in counts.items()}
    out = []
    while any(per.values()):
        for name in counts:
            if per[name]:
                out.append(per[name].pop(0))
    return out


def _env(work: Path, name: str, **settings: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update({"RAG_STORE_PATH": str(work / f"store-{name}"), "RAG_CACHE_PATH": str(work / f"cache-{name}"),
                "RAG_ASK_MAX_TOKENS": "16", **settings})
    if os.environ.get("RAG_HOME"):
        env["RAG_HOME"] = os.environ["RAG_HOME"]
    return env


def session(work: Path, name: str, folder: Path, pdfs: dict[str, Path], questions: list[dict], **settings) -> dict:
    env = _env(work, name, **settings)
    t0 = time.perf_counter()
    ingest = rag_process(env, "ingest", str(folder))
    ingest_seconds = time.perf_counter() - t0
    w = ingest.get("warm") or {}
    print(f"    {name:8} ingest {ingest_seconds:7.1f} s: {ingest['tokens']:,} tokens; states "
          f"{w.get('chosen', 0)} of {w.get('sections', 0)} sections, {w.get('left', 0)} left"
          f"{' (' + w['reason'] + ')' if w and not w.get('warmed') else ''}", flush=True)
    rows = []
    for i, q in enumerate(questions):
        pdf = pdfs[q["source"].removesuffix(".txt")]
        page = answer_page(pdf, q)
        started = time.perf_counter()
        answer = rag_process(env, "ask", q["question"])
        st = answer["stats"]
        rows.append({"question": q["question"], "ttft": st["ttft_seconds"], "wall": time.perf_counter() - started,
                     "start_to_first_token": st.get("start_to_first_token_seconds"),
                     "prompt_tokens": st["prompt_tokens"], "cached_tokens": st["cached_tokens"], "cache": st["cache"],
                     "plan": st.get("plan", ""), "document": pdf.name, "page": page,
                     "cited": page_cited(answer["sources"], pdf.name, page)})
        r = rows[-1]
        print(f"    {name:8} q{i + 1:<2} TTFT {r['ttft']:7.2f} s; {r['cached_tokens']:>6,}/{r['prompt_tokens']:,} "
              f"reused ({r['cache']}); {pdf.name} p. {page} {'cited' if r['cited'] else 'NOT cited'}", flush=True)
    status = rag_process(env, "status")
    return {"ingest_seconds": ingest_seconds, "ingest_tokens": ingest["tokens"], "warm": w, "rows": rows,
            "median_ttft": statistics.median(r["ttft"] for r in rows), "cited": sum(r["cited"] for r in rows),
            "composition": status.get("composition")}


def run_proof_case(work: Path, *, shelf: bool, quick: bool = False) -> dict:
    names, counts = (SHELF, PER_SHELF) if shelf else (MANUAL, PER_MANUAL)
    folder = work / ("shelf" if shelf else "manual")
    pdfs = {name: manpage_pdf(name, folder) for name in names}
    questions = questions_for(counts)[:4 if quick else None]
    label = (f"a shelf of {len(names)} manuals ({', '.join(names)})" if shelf else "the wget manual")
    print(f"  case (e): {label}, {len(questions)} questions, each a new process", flush=True)
    out = {"collection": label, "sessions": {}}
    out["sessions"]["defaults"] = session(work, "defaults", folder, pdfs, questions)
    out["sessions"]["exact"] = session(work, "exact", folder, pdfs, questions, RAG_ASK_COMPOSE="off",
                                       RAG_CACHE_ENABLED="false", RAG_INGEST_WARM="off")
    d, e = out["sessions"]["defaults"], out["sessions"]["exact"]
    out["ratio"] = e["median_ttft"] / d["median_ttft"]
    out["pass"] = out["ratio"] >= 10 and d["cited"] >= e["cited"] - 1 and bool((d["composition"] or {}).get("allowed"))
    return out


def print_table(out: dict) -> None:
    d, e = out["sessions"]["defaults"], out["sessions"]["exact"]
    n = len(d["rows"])
    print(f"\n{out['collection']}: {n} questions, each a new `rag ask` process\n")
    print("| session | ingest | states saved / left | calibration (rag status --json) | median TTFT | "
          "answer's page among the sources |\n| --- | --- | --- | --- | --- | --- |")
    for name, s in out["sessions"].items():
        w, c = s["warm"], s["composition"] or {}
        states = f"{w.get('chosen', 0)} of {w.get('sections', 0)} / {w.get('left', 0)}" if w.get("warmed") else "none"
        cal = (f"KL {c['kl']:.4f} ({', '.join(f'{k:.3f}' for k in c.get('kls', []))}; spread "
               f"{c.get('kl_spread', 0):.4f}), allowed {c['allowed']}" if c.get("kl") is not None else "none")
        print(f"| {name} | {s['ingest_seconds']:.0f} s ({s['ingest_tokens']:,} tokens) | {states} | {cal} | "
              f"{s['median_ttft']:.2f} s | {s['cited']}/{n} |")
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    print(f"\nmedian TTFT, exact / defaults: {out['ratio']:.1f}x (>= 10) [{verdict(out['ratio'] >= 10)}]; answer's "
          f"page cited {d['cited']}/{n} against exact's {e['cited']}/{n} (within one) "
          f"[{verdict(d['cited'] >= e['cited'] - 1)}]; all [{verdict(out['pass'])}]")


__all__ = ["print_table", "run_proof_case"]
