"""Session case (d): a real manual larger than the context, the defaults against ``ask.compose = "off"``.

What a new user gets: a fresh home and cache, ``rag ingest``, no ``rag warm``, then 8 different
questions, each a new ``rag ask`` process. With the defaults, ``rag ingest`` calibrates composition
on the manual's own sections and saves every section's state (``ingest.warm = "auto"``), so every
question, the first included, is composed from states. Beside it, in the same run: the defaults
with ``rag ingest --no-warm`` (the first question prefilled exactly, its answer calibrating
composition after it has streamed; later questions composed from the states saved so far), and
``ask.compose = "off"`` on a store cut the way that setting cuts it. Reported per session: the
ingest's time, TTFT of question 1, the median of questions 2-8, their ratio, the median against
the cold first question (``off``'s), whether the answer's page is among the sources, and the
calibration ``rag status --json`` shows; and the cold-question ratio: a first question with
composition allowed (``ask.compose = "on"``, no states yet) against ``"off"``, which must stay
within 10 %.

The manual: ``--pdf FILE --questions FILE.jsonl`` (one object a line: ``question`` and either
``page`` or ``evidence``, a phrase of the answer's page), or by default the wget man page of the
development set (``benchmarks/eval/manpages/wget.txt`` as a PDF of 60-line pages, its 8 questions
of ``benchmarks/eval/manpages.jsonl``; a development figure).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from pathlib import Path

from _session_shelf import page_cited, rag_process

ROOT = Path(__file__).resolve().parent.parent
LINES_PER_PAGE = 60


def default_manual(folder: Path) -> tuple[Path, list[dict]]:
    """The wget man page as a PDF, and its development questions."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from support.pdfs import make_pdf  # the project's own minimal PDF writer

    lines = (ROOT / "benchmarks/eval/manpages/wget.txt").read_text().splitlines()
    pages = ["\n".join(line[:110] for line in lines[i:i + LINES_PER_PAGE]) for i in range(0, len(lines), LINES_PER_PAGE)]
    folder.mkdir(parents=True, exist_ok=True)
    pdf = make_pdf(folder / "wget-manual.pdf", pages, title="GNU Wget manual")
    questions = [json.loads(line) for line in (ROOT / "benchmarks/eval/manpages.jsonl").read_text().splitlines()
                 if line.strip() and json.loads(line)["source"] == "wget.txt"]
    return pdf, questions[:8]


def answer_page(pdf: Path, q: dict) -> int:
    """The page a question's answer is on: given, or the first page holding its evidence phrase."""
    if "page" in q:
        return int(q["page"])
    from _corpora import pdf_pages

    def norm(text: str) -> str:
        return re.sub(r"\W+", " ", text).lower().strip()

    want = norm(q["evidence"])
    pages = list(pdf_pages(pdf))
    for page, text in pages:
        if want in norm(text):
            return page
    for (page, text), (_, after) in zip(pages, pages[1:]):  # evidence running over a page break
        if want in norm(text + " " + after):
            return page
    raise SystemExit(f"the evidence of {q['question']!r} is on no page of {pdf.name}")


def _env(work: Path, name: str, compose: str, store: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update({"RAG_STORE_PATH": str(work / f"store-{store}"), "RAG_CACHE_PATH": str(work / f"cache-{name}"),
                "RAG_ASK_COMPOSE": compose, "RAG_ASK_MAX_TOKENS": "16"})
    if os.environ.get("RAG_HOME"):
        env["RAG_HOME"] = os.environ["RAG_HOME"]
    return env


def session(work: Path, name: str, compose: str, pdf: Path, questions: list[dict], *, count: int,
            store: str | None = None, warm: bool = True) -> dict:
    """One session: ingest into a fresh store (or use ``store``'s, already ingested) with a fresh cache
    (``warm``: as ``ingest.warm`` says, else ``--no-warm``), then ``count`` questions as new processes."""
    env = _env(work, name, compose, store or name)
    started = time.perf_counter()
    ingest = rag_process(env, "ingest", str(pdf), *(() if warm else ("--no-warm",)))  # (nothing new to embed
    ingest_seconds = time.perf_counter() - started                                     # where the store holds it)
    w = ingest.get("warm") or {}
    print(f"    {name:8} ingest {ingest_seconds:6.1f} s; section states "
          f"{'saved: ' + format(w['prefilled_tokens'], ',') + ' tokens prefilled' if w.get('warmed') else 'none'}"
          f"{' (' + w['reason'] + ')' if w and not w.get('warmed') else ''}", flush=True)
    rows = []
    for i, q in enumerate(questions[:count]):
        answer = rag_process(env, "ask", q["question"])
        st = answer["stats"]
        page = answer_page(pdf, q)
        rows.append({"question": q["question"], "ttft": st["ttft_seconds"], "prompt_tokens": st["prompt_tokens"],
                     "cached_tokens": st["cached_tokens"], "cache": st["cache"], "sections": len(st["sections"]),
                     "answer_page": page, "cited": page_cited(answer["sources"], pdf.name, page),
                     "reuse_lost": st["reuse_lost"]})
        r = rows[-1]
        print(f"    {name:8} q{i + 1} TTFT {r['ttft']:7.2f} s; {r['cached_tokens']:>6,}/{r['prompt_tokens']:,} reused "
              f"({r['cache']}, {r['sections']} sections); page {page} {'cited' if r['cited'] else 'NOT cited'}",
              flush=True)
    status = rag_process(env, "status")
    rest = [r["ttft"] for r in rows[1:]]
    med = statistics.median(rest) if rest else float("nan")
    return {"ingest_tokens": ingest["tokens"], "ingest_seconds": ingest_seconds, "warm": w, "rows": rows, "ttft_q1": rows[0]["ttft"], "ttft_rest_median": med,
            "speedup": rows[0]["ttft"] / med if rest else float("nan"), "cited": sum(r["cited"] for r in rows),
            "reused_median": statistics.median(r["cached_tokens"] for r in rows[1:]) if rest else 0,
            "composition": status.get("composition")}


def run_defaults_case(work: Path, *, quick: bool, pdf: Path | None = None, questions: Path | None = None) -> dict:
    if pdf is None:
        pdf, qs = default_manual(work / "manual")
        label = f"{pdf.name} (development set)"
    else:
        qs = [json.loads(line) for line in Path(questions).read_text().splitlines() if line.strip()]
        label = pdf.name
    count = 3 if quick else 8
    print(f"  case (d): {label}, {count} questions, new processes, no rag warm", flush=True)
    out = {"manual": label, "sessions": {}}
    out["sessions"]["defaults"] = session(work, "defaults", "auto", pdf, qs, count=count)
    out["sessions"]["no-warm"] = session(work, "no-warm", "auto", pdf, qs, count=count, store="defaults",
                                         warm=False)
    # The same sections (the defaults' store), fresh caches: only how the first prompt is prefilled differs.
    cold_on = session(work, "cold-on", "on", pdf, qs, count=1, store="defaults", warm=False)
    cold_off = session(work, "cold-off", "off", pdf, qs, count=1, store="defaults", warm=False)
    out["cold"] = {"on": cold_on["ttft_q1"], "off": cold_off["ttft_q1"], "ratio": cold_on["ttft_q1"] / cold_off["ttft_q1"]}
    out["sessions"]["off"] = session(work, "off", "off", pdf, qs, count=count)
    cold_first = out["sessions"]["off"]["ttft_q1"]
    for s in out["sessions"].values():
        s["against_cold"] = cold_first / s["ttft_rest_median"]
    d = out["sessions"]["defaults"]
    out["pass"] = (d["against_cold"] >= 10 and d["cited"] >= count - 1 and out["cold"]["ratio"] <= 1.1
                   and bool(d["composition"] and d["composition"]["tokens"]))
    return out


def print_table(out: dict) -> None:
    n = len(out["sessions"]["defaults"]["rows"])
    print(f"\n{out['manual']}: {n} questions, each a new `rag ask` process, fresh home, no `rag warm`\n")
    print(f"| session | ingest (s) | TTFT q1 (s) | median TTFT q2-{n} (s) | q1 / median | cold q1 / median | "
          f"median reused q2-{n} | answer's page among the sources | calibration (status --json) |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    labels = {"defaults": "defaults", "no-warm": "defaults, `rag ingest --no-warm`", "off": "ask.compose = off"}
    for name, s in out["sessions"].items():
        c = s["composition"] or {}
        cal = (f"KL {c['kl']:.4f}, top-1 {c['top1']:.1%}, {c['tokens']} tokens, allowed {c['allowed']}"
               if c.get("kl") is not None else "none")
        print(f"| {labels.get(name, name)} | {s['ingest_seconds']:.1f} | {s['ttft_q1']:.2f} | "
              f"{s['ttft_rest_median']:.2f} | {s['speedup']:.1f}x | **{s['against_cold']:.1f}x** | "
              f"{s['reused_median']:,.0f} | {s['cited']}/{n} | {cal} |")
    c = out["cold"]
    d = out["sessions"]["defaults"]
    verdict = lambda ok: "PASS" if ok else "FAIL"  # noqa: E731
    print(f"\ncold question, composition allowed (on) against off: {c['on']:.2f} s / {c['off']:.2f} s = "
          f"{c['ratio']:.2f} (<= 1.10)  [{verdict(c['ratio'] <= 1.1)}]")
    print(f"defaults: the cold first question (off) / median q2-{n} = {d['against_cold']:.1f}x (>= 10) "
          f"[{verdict(d['against_cold'] >= 10)}] (q1 itself / median: {d['speedup']:.1f}x, q1 composed too); "
          f"answer's page cited {d['cited']}/{n} (>= {n - 1}) [{verdict(d['cited'] >= n - 1)}]; "
          f"calibrated [{verdict(bool(d['composition'] and d['composition'].get('tokens')))}]; "
          f"all [{verdict(out['pass'])}]")


__all__ = ["print_table", "run_defaults_case"]
