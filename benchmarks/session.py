"""Session benchmark: ten different questions in a row, ``ask.mode = auto`` against ``passages``.

The figure that matters for a person or an app asking many questions about the same
documents: how much faster questions 2-10 start than question 1. Reported per mode as
``TTFT(question 1) / median TTFT(questions 2-10)``, engine TTFT (llama.cpp's counters,
from the start of the prompt's run) and wall TTFT (retrieval and packing included).

Cases (each mode gets a fresh prefix cache and a fresh Pipeline, questions run in one
Pipeline as an app would; the same questions in the same order in both modes):

  (a) the bundled samples/ with the default model (SmolLM2-135M, default n_ctx 8192);
  (b) about 60K tokens of documents with a generated MoE model at a 64K context
      (pipeline/dev/synthetic.py; its text is noise, its timings are real);
  (c) a collection at least 3x the context: the first pages of gnuplot.pdf (Debian's
      gnuplot-doc, fetched with apt-get download) and a generated long manual, SmolLM2 at
      8K, prompts composed from section states (``ask.compose = "auto"``). Each question
      is a new ``rag ask`` process: the first cold, then ``rag warm --sections``, then 8
      different questions. Reported: TTFT(first, cold) / median TTFT(the 8). Target 10x.

Targets in auto: at least 20x for (a), at least 50x for (b), at least 10x for (c).

    .venv/bin/python benchmarks/session.py [--case a|b|c|all] [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402

QUESTIONS_A = [
    "How much faster was prefill with 8 layers' experts on the CPU?",
    "What does --n-cpu-moe do?",
    "Why do larger micro-batches speed up prompt processing?",
    "Which function saves the KV state of one sequence to a file?",
    "How is a prefix cache entry invalidated when a document changes?",
    "What is the difference between PersistentClient and HttpClient in Chroma?",
    "What does flash attention change during prefill?",
    "How much VRAM does the KV cache of a 64K context need?",
    "What batch sizes are recommended for llama-server?",
    "Why is Chroma's embedded mode not safe for several processes?",
]

QUESTIONS_B = [
    "What is the pressure limit of pump station 7?",
    "Which valve failed during the March inspection?",
    "How often is the filter of unit 12 replaced?",
    "Who signs off a maintenance window?",
    "What does alarm code E-41 mean?",
    "Which sensor measures the inlet temperature?",
    "How long may the reserve tank stay empty?",
    "What is the flow rate at nominal load?",
    "When was the control software last updated?",
    "Which tool calibrates the flow meters?",
]


def synthetic_corpus(folder: Path, tokens: int, count) -> int:
    """Manuals of numbered records, about ``tokens`` generator tokens in all."""
    rng = random.Random(7)
    things = ["pump station", "valve", "filter unit", "reserve tank", "flow meter", "inlet sensor",
              "control cabinet", "pressure gauge", "bypass line", "cooling loop"]
    verbs = ["was inspected", "reported a fault", "was recalibrated", "passed its test", "needs a new seal",
             "ran at nominal load", "was replaced", "raised alarm E-41", "was updated", "stayed in reserve"]
    folder.mkdir(parents=True, exist_ok=True)
    total, doc = 0, 0
    while total < tokens:
        lines = [f"# Maintenance manual, volume {doc + 1}", ""]
        for i in range(60):
            t, v = rng.choice(things), rng.choice(verbs)
            lines.append(f"Record {doc * 100 + i}: the {t} {rng.randint(1, 40)} {v} on day {rng.randint(1, 365)}; "
                         f"pressure {rng.randint(10, 900)} kPa, flow {rng.randint(5, 500)} l/min, "
                         f"signed off by engineer {rng.choice('ABCDEFGH')}{rng.randint(1, 9)}.")
            if i % 12 == 11:
                lines.append("")
        text = "\n".join(lines) + "\n"
        n = count(text)
        if total + n > tokens:
            break
        (folder / f"volume-{doc + 1:02d}.md").write_text(text)
        total += n
        doc += 1
    return total


def session(overrides: dict, questions: list[str], mode: str) -> list[dict]:
    rows = []
    with Pipeline.from_config(overrides=overrides) as rag:
        for i, q in enumerate(questions):
            t0 = time.perf_counter()
            stream = rag.ask_stream(q, mode=mode)
            first = None
            for _ in stream:
                if first is None:
                    first = time.perf_counter() - t0
            st = stream.answer.stats
            rows.append({"question": q, "ttft_engine": st.ttft_seconds, "ttft_wall": first or st.ttft_seconds,
                         "prompt_tokens": st.prompt_tokens, "cached_tokens": st.cached_tokens, "cache": st.cache,
                         "mode": st.mode, "sections": len(st.sections), "states_saved": st.states_saved,
                         "reuse_lost": st.reuse_lost})
            print(f"    {mode:8} q{i + 1:<2} TTFT {st.ttft_seconds:7.3f} s engine, {rows[-1]['ttft_wall']:7.3f} s wall; "
                  f"{st.cached_tokens:>6,}/{st.prompt_tokens:,} reused ({st.mode}, {len(st.sections)} sections)",
                  flush=True)
    return rows


def ratios(rows: list[dict]) -> dict:
    first, rest = rows[0], rows[1:]
    med = statistics.median(r["ttft_engine"] for r in rest)
    med_wall = statistics.median(r["ttft_wall"] for r in rest)
    reuse = [r["cached_tokens"] / r["prompt_tokens"] for r in rest]
    return {"ttft_q1": first["ttft_engine"], "ttft_rest_median": med, "speedup": first["ttft_engine"] / med,
            "ttft_q1_wall": first["ttft_wall"], "ttft_rest_median_wall": med_wall,
            "speedup_wall": first["ttft_wall"] / med_wall, "reuse_median": statistics.median(reuse),
            "prompt_tokens_q1": first["prompt_tokens"]}


def shelf_corpus(folder: Path, *, pages: int) -> None:
    """The first ``pages`` pages of gnuplot.pdf (a real PDF, cut with pypdf) and the generated field manual."""
    from pypdf import PdfReader, PdfWriter

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _corpora

    folder.mkdir(parents=True, exist_ok=True)
    reader, writer = PdfReader(_corpora.debian_pdf("gnuplot-doc")), PdfWriter()
    for page in reader.pages[:pages]:
        writer.add_page(page)
    with open(folder / "gnuplot-first-pages.pdf", "wb") as f:
        writer.write(f)
    manual, _ = _corpora.manual_pages(120)
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
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _corpora

    shelf_corpus(work / "shelf", pages=24 if quick else 60)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update({"RAG_HOME": os.environ.get("RAG_HOME", ""), "RAG_STORE_PATH": str(work / "store"),
                "RAG_STORE_COLLECTION": "session-c", "RAG_CACHE_PATH": str(work / "cache-c"),
                "RAG_ASK_COMPOSE": "auto", "RAG_ASK_MAX_TOKENS": "16", "RAG_CACHE_MAX_GB": "32"})
    env = {k: v for k, v in env.items() if v != ""}
    ingest = rag_process(env, "ingest", str(work / "shelf"))
    _, manual_qs = _corpora.manual_pages(120)
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
               "sections": len(st["sections"]), "mode": st["mode"], "reuse_lost": st["reuse_lost"]}
        print(f"    {label:6} TTFT {row['ttft_engine']:7.3f} s; {row['cached_tokens']:>6,}/{row['prompt_tokens']:,} "
              f"reused, {row['prefill_tokens']:,} prefilled ({row['mode']}, {row['sections']} sections, "
              f"{row['composed_sections']} from states)", flush=True)
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


def run_case(name: str, work: Path, *, quick: bool) -> dict:
    overrides = {"store.path": str(work / "store"), "store.collection": f"session-{name}", "ask.max_tokens": 32}
    if name == "a":
        docs, questions, target = [ROOT / "samples"], QUESTIONS_A, 20
        model = "SmolLM2-135M-Instruct (default), n_ctx 8192"
    else:
        from pipeline.dev.synthetic import write_moe_model

        path = write_moe_model(work / "moe.gguf", n_ctx_train=65536)
        overrides.update({"models.generator": str(path), "engine.n_ctx": 65536, "ask.max_tokens": 8})
        questions, target = QUESTIONS_B, 50
        with Pipeline.from_config(overrides=overrides) as probe:
            n = synthetic_corpus(work / "corpus", 20_000 if quick else 58_000,
                                 lambda t: len(probe.engine.tokenize(t)))
        docs = [work / "corpus"]
        model = f"generated qwen3moe (4 layers, 8 experts), n_ctx 65536; corpus {n:,} tokens"
    if quick:
        questions = questions[:4]
    with Pipeline.from_config(overrides=overrides) as rag:
        report = rag.ingest(docs)
        print(f"  case ({name}): {model}; {report.summary()}", flush=True)
    out = {"model": model}
    for mode in ("auto", "passages"):
        shutil.rmtree(work / f"cache-{name}-{mode}", ignore_errors=True)
        rows = session({**overrides, "cache.path": str(work / f"cache-{name}-{mode}")}, questions, mode)
        out[mode] = {"rows": rows, **ratios(rows)}
    auto = out["auto"]["speedup"]
    out["target"] = target
    out["pass"] = auto >= target
    print(f"  case ({name}): auto {auto:.1f}x (wall {out['auto']['speedup_wall']:.1f}x), passages "
          f"{out['passages']['speedup']:.1f}x (wall {out['passages']['speedup_wall']:.1f}x)  "
          f"[{'PASS' if out['pass'] else 'FAIL'}] auto >= {target}x", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["a", "b", "c", "all"], default="all")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="4 questions; a 20K-token corpus for (b)")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rag-bench-session-"))
    results = {}
    try:
        for name in (["a", "b", "c"] if args.case == "all" else [args.case]):
            results[name] = (run_composed_case if name == "c" else
                             lambda w, quick, n=name: run_case(n, w, quick=quick))(work, quick=args.quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    composed = results.pop("c", None)
    if composed is not None:
        print(f"\n| case | TTFT cold (s) | median TTFT of {len(composed['rows'])} after warm --sections (s) | "
              "cold / median | median prefilled tokens |\n| --- | --- | --- | --- | --- |")
        print(f"| (c) | {composed['ttft_cold']:.2f} | {composed['ttft_median']:.3f} | **{composed['speedup']:.1f}x** | "
              f"{statistics.median(r['prefill_tokens'] for r in composed['rows']):,.0f} |")
    if results:
        print("\n| case | mode | prompt tokens (q1) | TTFT q1 (s) | median TTFT q2-10 (s) | q1 / median |"
              " wall q1 / median | median reuse q2-10 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        for mode in ("auto", "passages"):
            m = r[mode]
            print(f"| ({name}) | {mode} | {m['prompt_tokens_q1']:,} | {m['ttft_q1']:.2f} | {m['ttft_rest_median']:.3f} | "
                  f"**{m['speedup']:.1f}x** | {m['speedup_wall']:.1f}x | {m['reuse_median']:.1%} |")
    if args.json:
        from pipeline.dev.bench import document, row

        rows = []
        for name, r in results.items():
            for mode in ("auto", "passages"):
                m, series = r[mode], f"({name}) {mode}"
                rows += [row(f"{name}_{mode}_ttft_q1", m["ttft_q1"], "s", series=series),
                         row(f"{name}_{mode}_ttft_rest_median", m["ttft_rest_median"], "s", series=series),
                         row(f"{name}_{mode}_speedup", m["speedup"], "x", series=series,
                             ratio=(f"{name}_{mode}_ttft_q1", f"{name}_{mode}_ttft_rest_median")),
                         row(f"{name}_{mode}_reuse_median", m["reuse_median"], "fraction", series=series)]
        if composed is not None:
            rows.append(row("c_speedup", composed["speedup"], "x", series="(c) composed"))
            results["c"] = composed
        args.json.write_text(json.dumps(document(rows, cases=results), indent=2))
    if composed is not None:
        results["c"] = composed
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
