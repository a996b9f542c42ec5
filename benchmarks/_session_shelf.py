"""Session case (c): a collection larger than the context, questions composed from section states.

The first pages of gnuplot.pdf (Debian's gnuplot-doc, fetched with ``apt-get download``; a
real PDF, cut with pypdf) and a generated long field manual, at least 3x SmolLM2's 8K
context, with ``ask.compose = "auto"``. Each question is a new ``rag ask`` process: the first
cold, then ``rag warm --sections``, then 8 different questions. Reported: TTFT(cold) /
median TTFT(the 8), engine TTFT (llama.cpp's counters, from the start of the prompt's run).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
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
    (folder / "field-manual.md").write_text("\n\n".join(f"## Page {p}\n\n{text}" for p, text in manual) + "\n")


def rag_process(env: dict, *args: str) -> dict:
    """One ``rag`` command in a new process, its ``--json`` output."""
    out = subprocess.run([sys.executable, "-m", "pipeline", *args, "--json"], env=env, capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"rag {' '.join(args)} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def run_composed_case(work: Path, *, quick: bool) -> dict:
    """Case (c): new processes over a collection larger than the context, composed from section states."""
    pages, manual_pages = (12, 20) if quick else (40, 40)  # about 4x the context in all (2x quick)
    shelf_corpus(work / "shelf", pages=pages, manual_pages=manual_pages)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update({"RAG_HOME": os.environ.get("RAG_HOME", ""), "RAG_STORE_PATH": str(work / "store"),
                "RAG_STORE_COLLECTION": "session-c", "RAG_CACHE_PATH": str(work / "cache-c"),
                "RAG_ASK_COMPOSE": "auto", "RAG_ASK_MAX_TOKENS": "16", "RAG_CACHE_MAX_GB": "32"})
    env = {k: v for k, v in env.items() if v != ""}
    ingest = rag_process(env, "ingest", str(work / "shelf"))
    _, manual_qs = _corpora.manual_pages(manual_pages)
    questions = [q.text for q in _corpora.GNUPLOT[:4]] + [q.text for q in manual_qs[:4]]
    cold_q = _corpora.GNUPLOT[5].text
    if quick:
        questions = questions[:2] + questions[4:6]
    rows = []

    def ask(q: str, label: str) -> dict:
        st = rag_process(env, "ask", q)["stats"]
        row = {"question": q, "ttft_engine": st["ttft_seconds"], "prompt_tokens": st["prompt_tokens"],
               "cached_tokens": st["cached_tokens"], "prefill_tokens": st["prefill_tokens"],
               "composed_sections": st.get("composed_sections", 0), "recomputed_tokens": st.get("recomputed_tokens", 0),
               "sections": len(st["sections"]), "mode": st["mode"], "reuse_lost": st["reuse_lost"],
               "restore_seconds": st["cache_load_seconds"], "prefill_seconds": st["prefill_seconds"]}
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
    med = statistics.median(r["ttft_engine"] for r in rows)
    out = {"model": "SmolLM2-135M-Instruct, n_ctx 8192, ask.compose = auto", "ingest_tokens": ingest["tokens"],
           "cold": cold, "warm": warm, "rows": rows, "ttft_cold": cold["ttft_engine"], "ttft_median": med,
           "speedup": cold["ttft_engine"] / med, "target": 10}
    out["pass"] = out["speedup"] >= 10
    print(f"  case (c): cold {cold['ttft_engine']:.2f} s, median of {len(rows)} after warm {med:.3f} s: "
          f"{out['speedup']:.1f}x [{'PASS' if out['pass'] else 'FAIL'}] >= 10x", flush=True)
    return out


def print_table(out: dict) -> None:
    print(f"\n| case | TTFT cold (s) | median TTFT of {len(out['rows'])} after warm --sections (s) | cold / median | "
          "median prefilled tokens |\n| --- | --- | --- | --- | --- |")
    print(f"| (c) | {out['ttft_cold']:.2f} | {out['ttft_median']:.3f} | **{out['speedup']:.1f}x** | "
          f"{statistics.median(r['prefill_tokens'] for r in out['rows']):,.0f} |")


__all__ = ["print_table", "run_composed_case"]
