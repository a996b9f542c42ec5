"""Session benchmark: ten different questions in a row, ``ask.mode = auto`` against ``passages``.

The figure that matters for a person or an app asking many questions about the same
documents: how much faster questions 2-10 start than question 1. Reported per mode as
``TTFT(question 1) / median TTFT(questions 2-10)``, engine TTFT (llama.cpp's counters,
from the start of the prompt's run) and wall TTFT (retrieval and packing included).

Cases (each mode gets a fresh prefix cache and a fresh Pipeline, questions run in one
Pipeline as an app would; the same questions in the same order in both modes):

  (a) the bundled samples/ with the default model (SmolLM2-135M, default n_ctx 8192);
  (b) about 60K tokens of documents with a generated MoE model at a 64K context
      (devtools/synthetic; its text is noise, its timings are real): ``qwen3moe``, and with
      ``--arch`` the hybrid ``qwen35moe`` (Gated DeltaNet + attention: a later question restores the
      saved state instead of cutting memory) and ``gpt-oss`` (sliding-window layers), in the same run;
  (d) a real manual about 3x the context with the defaults against ``ask.compose = "off"``: each
      question a new ``rag ask`` process, fresh home, no ``rag warm`` (benchmarks/_session_defaults.py;
      ``--pdf FILE --questions FILE.jsonl`` for your own manual); and a cold question with
      composition allowed against ``off``;
  (e) what a new user gets with the defaults on a manual about 3x the context (wget) and, with ``--shelf``,
      on a shelf of five manuals about 27x it, against exact prefill (composition and the cache off): each
      question a new ``rag ask`` process (benchmarks/_session_proof.py);
  (c) a collection at least 3x the context (the first 40 pages of gnuplot.pdf and a 40-page generated manual,
      SmolLM2 at 8K), prompts composed from section states: each question a new ``rag ask``
      process, the first cold, then ``rag warm --sections``, then 8 different questions
      (benchmarks/_session_shelf.py). Reported: TTFT(cold) / median TTFT(the 8).

Targets in auto: at least 20x for (a), at least 50x for (b); at least 10x for (c) and (d), whose cold
question with composition allowed is within 10 % of ``off``.

    .venv/bin/python benchmarks/session.py [--case a|b|c|d|e|all] [--shelf] [--pdf FILE --questions FILE.jsonl] [--arch qwen3moe,qwen35moe,gpt-oss|all]
        [--json OUT] [--quick]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
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


ARCHS = ("qwen3moe", "qwen35moe", "gpt-oss")


def run_case(name: str, work: Path, *, quick: bool, arch: str = "qwen3moe") -> dict:
    overrides = {"store.path": str(work / "store"), "store.collection": f"session-{name}", "ask.max_tokens": 32}
    if name == "a":
        docs, questions, target = [ROOT / "samples"], QUESTIONS_A, 20
        model = "SmolLM2-135M-Instruct (default), n_ctx 8192"
    else:
        from devtools.synthetic import write_model

        path = write_model(arch, work / f"{arch}.gguf", n_ctx_train=65536)
        overrides.update({"models.generator": str(path), "engine.n_ctx": 65536, "ask.max_tokens": 8})
        questions, target = QUESTIONS_B, 50
        with Pipeline.from_config(overrides=overrides) as probe:
            n = synthetic_corpus(work / "corpus", 20_000 if quick else 58_000,
                                 lambda t: len(probe.engine.tokenize(t)))
        docs = [work / "corpus"]
        model = f"generated {arch} (4 layers, 8 experts), n_ctx 65536; corpus {n:,} tokens"
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
    ap.add_argument("--case", choices=["a", "b", "c", "d", "e", "all"], default="all")
    ap.add_argument("--shelf", action="store_true", help="case (e): the shelf of five manuals (default: one manual)")
    ap.add_argument("--pdf", type=Path, help="case (d): your own manual (default: the wget man page, development)")
    ap.add_argument("--questions", type=Path, help="case (d): its questions, JSON lines with question and "
                    "page or evidence")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="4 questions; a 20K-token corpus for (b)")
    ap.add_argument("--section-tokens", type=int, help="case (c): the sections' size (chunking.section_tokens)")
    ap.add_argument("--recompute", type=int, help="case (c): tokens recomputed per seam (ask.compose_recompute)")
    ap.add_argument("--question-set", type=int, choices=[1, 2], default=1,
                    help="case (c): the 8 questions asked (2: others, to check settings chosen on 1)")
    ap.add_argument("--arch", default="qwen3moe", help="case (b)'s generated models: a comma list of "
                    f"{', '.join(ARCHS)}, or all")
    args = ap.parse_args(argv)
    archs = list(ARCHS) if args.arch == "all" else args.arch.split(",")
    if any(a not in ARCHS for a in archs):
        ap.error(f"--arch takes {', '.join(ARCHS)} or all, not {args.arch!r}")
    work = Path(tempfile.mkdtemp(prefix="rag-bench-session-"))
    results, composed, defaults, proof = {}, None, None, None
    try:
        if args.case == "e":  # (not part of all: it ingests 30x the context, twice)
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import _session_proof

            proof = _session_proof.run_proof_case(work, shelf=args.shelf, quick=args.quick)
        if args.case in ("d", "all"):
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import _session_defaults

            defaults = _session_defaults.run_defaults_case(work, quick=args.quick, pdf=args.pdf,
                                                           questions=args.questions)
        if args.case in ("c", "all"):
            sys.path.insert(0, str(ROOT / "benchmarks"))
            import _session_shelf

            composed = _session_shelf.run_composed_case(work, quick=args.quick, section_tokens=args.section_tokens,
                                                        recompute=args.recompute, question_set=args.question_set)
        for name in (["a", "b"] if args.case == "all" else [args.case] if args.case in ("a", "b") else []):
            for arch in (archs if name == "b" else ["-"]):
                key = name if arch in ("-", "qwen3moe") else f"{name}-{arch}"
                results[key] = run_case(key, work, quick=args.quick, arch="qwen3moe" if arch == "-" else arch)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if composed is not None:
        _session_shelf.print_table(composed)
    if defaults is not None:
        _session_defaults.print_table(defaults)
    if proof is not None:
        _session_proof.print_table(proof)
        if args.json:
            from devtools.bench import document, row

            rows = [row("e_median_ttft_ratio", proof["ratio"], "x", series="(e) exact / defaults")]
            rows += [row(f"e_{name}_median_ttft", s["median_ttft"], "s", series=f"(e) {name}")
                     for name, s in proof["sessions"].items()]
            args.json.write_text(json.dumps(document(rows, case=proof), indent=2))
        return 0 if proof["pass"] else 1
    print("\n| case | mode | prompt tokens (q1) | TTFT q1 (s) | median TTFT q2-10 (s) | q1 / median | wall q1 / median |"
          " median reuse q2-10 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in results.items():
        for mode in ("auto", "passages"):
            m = r[mode]
            print(f"| ({name}) | {mode} | {m['prompt_tokens_q1']:,} | {m['ttft_q1']:.2f} | {m['ttft_rest_median']:.3f} | "
                  f"**{m['speedup']:.1f}x** | {m['speedup_wall']:.1f}x | {m['reuse_median']:.1%} |")
    if args.json:
        from devtools.bench import document, row

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
        if defaults is not None:
            for name, d in defaults["sessions"].items():
                rows.append(row(f"d_{name}_speedup", d["speedup"], "x", series=f"(d) {name}"))
            rows.append(row("d_cold_on_over_off", defaults["cold"]["ratio"], "x", series="(d) cold"))
        cases = {**results, **({"c": composed} if composed else {}), **({"d": defaults} if defaults else {})}
        args.json.write_text(json.dumps(document(rows, cases=cases), indent=2))
    done = [*results.values(), *([composed] if composed else []), *([defaults] if defaults else [])]
    return 0 if all(r["pass"] for r in done) else 1


if __name__ == "__main__":
    raise SystemExit(main())
