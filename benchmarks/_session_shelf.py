"""Session case (c): a collection larger than the context, questions composed from section states.

The first pages of gnuplot.pdf (Debian's gnuplot-doc, fetched with ``apt-get download``; a
real PDF, cut with pypdf) and a generated long field manual (a PDF written by the project's
own minimal PDF writer), at least 3x SmolLM2's 8K context, with ``ask.compose = "auto"``.
Each question is a new ``rag ask`` process: the first cold, then ``rag warm --sections``,
then 8 different questions. Reported: TTFT(cold) / median TTFT(the 8), engine TTFT
(llama.cpp's counters, from the start of the prompt's run); and for each of the 8, whether
the answer's page (where the question's keyword occurs most in its document, fixed with the
questions before any measurement) is among the answer's sources, against the sources the
same question gets in ``--mode passages`` (the prompt built, nothing generated).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import _corpora

ROOT = Path(__file__).resolve().parent.parent


def shelf_corpus(folder: Path, *, pages: int, manual_pages: int) -> None:
    """The first ``pages`` pages of gnuplot.pdf (a real PDF, cut with pypdf) and the generated field manual."""
    from pypdf import PdfReader, PdfWriter

    folder.mkdir(parents=True, exist_ok=True)
    reader, writer = PdfReader(_corpora.debian_pdf("gnuplot-doc")), PdfWriter()
    for page in reader.pages[:pages]:
        writer.add_page(page)
    with open(folder / "gnuplot-first-pages.pdf", "wb") as f:
        writer.write(f)
    manual, _ = _corpora.manual_pages(manual_pages)
    sys.path.insert(0, str(ROOT / "tests"))
    from support.pdfs import make_pdf  # the project's own minimal PDF writer

    make_pdf(folder / "field-manual.pdf", ["\n".join(textwrap.fill(line, 95) for line in text.split("\n"))
                                          for _, text in manual], title="XR-9 irrigation controller: field manual")


def answer_pages(folder: Path, questions: list[tuple[str, "_corpora.Question"]]) -> list[tuple[str, int]]:
    """(document, page) for each (document file name, question): the page of that document where
    the question's keyword occurs most (the first such page on a tie)."""
    out = []
    for name, q in questions:
        pages = _corpora.pdf_pages(folder / name)
        rx = re.compile(rf"\b{re.escape(q.keyword)}\b", re.I)
        counts = [len(rx.findall(text)) for _, text in pages]
        if not any(counts):
            raise SystemExit(f"{q.keyword!r} occurs nowhere in {name}: the question has no page")
        out.append((name, pages[counts.index(max(counts))][0]))
    return out


def page_cited(sources: list[dict], document: str, page: int) -> bool:
    return any(Path(s["source"]).name == document and page in s.get("pages", []) for s in sources)


def passages_sources(work: Path, env: dict, questions: list[str]) -> list[list[dict]]:
    """The sources each question's prompt cites in ``--mode passages`` (built through the library, not
    generated: which passages a prompt holds does not depend on the answer)."""
    from pipeline import Pipeline

    overrides = {"store.path": env["RAG_STORE_PATH"], "store.collection": env["RAG_STORE_COLLECTION"],
                 "cache.enabled": False, "ask.max_tokens": int(env["RAG_ASK_MAX_TOKENS"])}
    if "RAG_CHUNKING_SECTION_TOKENS" in env:
        overrides["chunking.section_tokens"] = int(env["RAG_CHUNKING_SECTION_TOKENS"])
    with Pipeline.from_config(overrides=overrides) as rag:
        return [rag.prompt(q, mode="passages").sources for q in questions]


def rag_process(env: dict, *args: str) -> dict:
    """One ``rag`` command in a new process, its ``--json`` output."""
    out = subprocess.run([sys.executable, "-m", "pipeline", *args, "--json"], env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"rag {' '.join(args)} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run_composed_case(work: Path, *, quick: bool, section_tokens: int | None = None,
                      recompute: int | None = None, question_set: int = 1) -> dict:
    """Case (c): new processes over a collection larger than the context, composed from section states
    (``section_tokens``: the sections' size, ``chunking.section_tokens``; ``recompute``: the tokens
    recomputed at each seam, ``ask.compose_recompute``; None: the defaults). ``question_set`` 2 asks
    8 other questions, written with the first and asked nowhere else: a check of settings chosen on set 1."""
    pages, manual_pages = (12, 20) if quick else (40, 40)  # about 4x the context in all (2x quick)
    shelf_corpus(work / "shelf", pages=pages, manual_pages=manual_pages)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update({"RAG_HOME": os.environ.get("RAG_HOME", ""), "RAG_STORE_PATH": str(work / "store"),
                "RAG_STORE_COLLECTION": "session-c", "RAG_CACHE_PATH": str(work / "cache-c"),
                "RAG_ASK_COMPOSE": "auto", "RAG_ASK_MAX_TOKENS": "16", "RAG_CACHE_MAX_GB": "32",
                "RAG_INGEST_WARM": "off"})  # a cold question first, then `rag warm --sections` by hand
    if section_tokens:
        env["RAG_CHUNKING_SECTION_TOKENS"] = str(section_tokens)
    if recompute is not None:
        env["RAG_ASK_COMPOSE_RECOMPUTE"] = str(recompute)
    env = {k: v for k, v in env.items() if v != ""}
    ingest = rag_process(env, "ingest", str(work / "shelf"))
    _, manual_qs = _corpora.manual_pages(manual_pages)
    first = 0 if question_set == 1 else 4  # set 2: gnuplot questions 7-10 (5 and 6 are the cold ones), manual 5-8
    asked = [("gnuplot-first-pages.pdf", q) for q in _corpora.GNUPLOT[first + 2 * (first > 0):][:4]] + \
            [("field-manual.pdf", q) for q in manual_qs[first:first + 4]]
    cold_q = _corpora.GNUPLOT[5].text
    if quick:
        asked = asked[:2] + asked[4:6]
    questions = [q.text for _, q in asked]
    truth = answer_pages(work / "shelf", asked)
    rows = []

    def ask(q: str, label: str) -> dict:
        answer = rag_process(env, "ask", q)
        st = answer["stats"]
        row = {"question": q, "ttft_engine": st["ttft_seconds"], "prompt_tokens": st["prompt_tokens"],
               "cached_tokens": st["cached_tokens"], "prefill_tokens": st["prefill_tokens"],
               "composed_sections": st.get("composed_sections", 0), "recomputed_tokens": st.get("recomputed_tokens", 0),
               "sections": len(st["sections"]), "mode": st["mode"], "reuse_lost": st["reuse_lost"],
               "restore_seconds": st["cache_load_seconds"], "prefill_seconds": st["prefill_seconds"],
               "sources": answer["sources"]}
        print(f"    {label:6} TTFT {row['ttft_engine']:7.3f} s; {row['cached_tokens']:>6,}/{row['prompt_tokens']:,} "
              f"reused, {row['prefill_tokens']:,} prefilled ({row['mode']}, {row['sections']} sections, "
              f"{row['composed_sections']} from states; restore {row['restore_seconds']:.2f} s, prefill "
              f"{row['prefill_seconds']:.2f} s)", flush=True)
        return row

    print(f"  case (c): SmolLM2-135M at 8K, {ingest['tokens']:,} embedder tokens in {ingest['chunks']} chunks",
          flush=True)
    cold = ask(cold_q, "cold")
    warm = rag_process(env, "warm", "--sections")
    print(f"    warm --sections: {warm['sections']} sections, {warm['tokens']:,} tokens ({warm['prefilled_tokens']:,} "
          f"prefilled) in {warm['seconds']:.1f} s, {warm['bytes_written'] / 1e6:,.0f} MB written", flush=True)
    for i, q in enumerate(questions):
        rows.append(ask(q, f"q{i + 1}"))
    for row, passages, (document, page) in zip(rows, passages_sources(work, env, questions), truth):
        row.update(answer_page=[document, page], page_cited=page_cited(row["sources"], document, page),
                   page_cited_passages=page_cited(passages, document, page))
    med = statistics.median(r["ttft_engine"] for r in rows)
    cited, cited_passages = (sum(r[k] for r in rows) for k in ("page_cited", "page_cited_passages"))
    out = {"model": "SmolLM2-135M-Instruct, n_ctx 8192, ask.compose = auto"
                    + (f", chunking.section_tokens = {section_tokens}" if section_tokens else "")
                    + (f", ask.compose_recompute = {recompute}" if recompute is not None else "")
                    + f"; question set {question_set}",
           "ingest_tokens": ingest["tokens"],
           "cold": cold, "warm": warm, "rows": rows, "ttft_cold": cold["ttft_engine"], "ttft_median": med,
           "speedup": cold["ttft_engine"] / med, "target": 10, "page_cited": cited,
           "page_cited_passages": cited_passages}
    out["pass"] = out["speedup"] >= 10 and cited >= cited_passages
    print(f"  case (c): cold {cold['ttft_engine']:.2f} s, median of {len(rows)} after warm {med:.3f} s: "
          f"{out['speedup']:.1f}x (>= 10x); the answer's page among the sources in {cited} of {len(rows)}, "
          f"{cited_passages} in --mode passages (composed >= passages) [{'PASS' if out['pass'] else 'FAIL'}]",
          flush=True)
    return out


def print_table(out: dict) -> None:
    n = len(out["rows"])
    print(f"\n| case | TTFT cold (s) | median TTFT of {n} after warm --sections (s) | cold / median | "
          "median prefilled tokens | answer's page among the sources | same, --mode passages |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| (c) | {out['ttft_cold']:.2f} | {out['ttft_median']:.3f} | **{out['speedup']:.1f}x** | "
          f"{statistics.median(r['prefill_tokens'] for r in out['rows']):,.0f} | {out['page_cited']}/{n} | "
          f"{out['page_cited_passages']}/{n} |")


__all__ = ["print_table", "run_composed_case"]
