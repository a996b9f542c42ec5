"""Section size against the answer's page in the prompt, at one context length.

Run from the repository root (it uses the stores ``benchmarks/heldout.py run`` keeps, and
ingests them there first when they are missing)::

    .venv/bin/python benchmarks/section_size.py [--sizes 2048,1024,512,256] [--ctx 8192]
        [--set NAME ...] [--heldout] [--set-config KEY=VALUE ...] [--json OUT.json] [--quick]
        [--reuse N]

Sections are cut at ingest, so comparing sizes would need one ingest per size. They are cut
from the stored chunks alone, though: for each size every store is copied to a temporary
folder and its sections are cut again at that size (``chunking.section_tokens``), as
``rag sections --recut`` does. Nothing is embedded again.
Then ``rag eval --packed`` for the default configuration: for each question, whether the page
that answers it is inside the prompt ``rag ask`` builds, with the prompt's median length and how
many sections it holds on average.

By default only the development sets run: a section size is chosen on them. ``--heldout`` adds
the two held-out manuals, to report the chosen default once, never to choose it.

``--reuse N`` measures instead what each size costs in reuse with exact prefill: the first N
questions of each set asked in a row through ``rag ask`` (real generation, 8 tokens each, a fresh
prefix cache per size), and the share of each later question's prompt restored from the cache
(median and mean over questions 2..N). It runs the generator over every prompt: minutes per
question on a CPU at 16K.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import heldout  # noqa: E402

DEVELOPMENT = [name for name, _, _, development in heldout.QUESTION_SETS if development]
HELD_OUT = [name for name, _, _, development in heldout.QUESTION_SETS if not development]


def ensure_stores(labels: set[str], root: Path, *, log=print) -> None:
    """Ingest the corpora behind ``labels`` into ``root`` (a no-op for stores already complete)."""
    from pipeline import Pipeline

    pdfs = heldout.fetch(log=log) if "heldout" in labels else None
    for label in sorted(labels):
        with Pipeline.from_config(overrides={"store.path": str(root / label)}) as rag:
            report = rag.ingest(heldout.corpus(label, pdfs))
            if report.chunks:
                log(f"ingested {label}: {report.chunks} chunks")


def recut_copy(source: Path, dest: Path, size: int) -> None:
    """A copy of the store at ``source`` with its sections cut again at ``size`` embedder tokens."""
    from pipeline import Pipeline

    shutil.copytree(source, dest)
    with Pipeline.from_config(overrides={"store.path": str(dest), "chunking.section_tokens": size}) as rag:
        rag.recut_sections()


def measure(sizes: list[int], *, sets: list[str], n_ctx: int, overrides: dict | None = None,
            log=print) -> list[dict]:
    labels = {label for name, _, label, _ in heldout.QUESTION_SETS if name in sets}
    stores = heldout.cache_dir() / "stores"
    ensure_stores(labels, stores, log=log)
    rows = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix=f"rag-sections-{size}-") as tmp:
            for label in labels:
                recut_copy(stores / label, Path(tmp) / label, size)
            found = heldout.run_sets(settings=[("default", heldout.DEFAULT_SETTING)], sets=sets,
                                     store_root=Path(tmp), packed=True, log=log,
                                     overrides={**(overrides or {}), "engine.n_ctx": n_ctx,
                                                "chunking.section_tokens": size})
        for r in found:
            rows.append({"set": r["set"], "development": r["development"], "section_tokens": size, "n_ctx": n_ctx,
                         "questions": r["questions"], "page_in_prompt": r["page_in_prompt"],
                         "prompt_median_tokens": r["prompt_median_tokens"],
                         "prompt_mean_units": r["prompt_mean_units"], "modes": r["prompt_modes"]})
            log(f"{size:>5} {r['set']}: page in prompt {r['page_in_prompt']:.3f} "
                f"({r['prompt_mean_units']:.1f} units, median {r['prompt_median_tokens']:,} tokens)")
    return rows


def reuse(sizes: list[int], *, sets: list[str], n_ctx: int, questions: int, overrides: dict | None = None,
          log=print) -> list[dict]:
    """Questions asked in a row per size: how much of each later prompt was reused (see ``--reuse``)."""
    import statistics

    import session
    from pipeline.retrieval.evaluate import load_questions

    chosen = [s for s in heldout.QUESTION_SETS if s[0] in sets]
    stores = heldout.cache_dir() / "stores"
    ensure_stores({label for _, _, label, _ in chosen}, stores, log=log)
    rows = []
    for name, qfile, label, development in chosen:
        asked = [q.question for q in load_questions(qfile)][:questions]
        for size in sizes:
            with tempfile.TemporaryDirectory(prefix=f"rag-reuse-{size}-") as tmp:
                recut_copy(stores / label, Path(tmp) / label, size)
                settings = {**(overrides or {}), "store.path": str(Path(tmp) / label), "engine.n_ctx": n_ctx,
                            "chunking.section_tokens": size, "ask.max_tokens": 8, "cache.path": str(Path(tmp) / "cache")}
                asks = session.session(settings, asked, "auto")
            shares = [a["cached_tokens"] / a["prompt_tokens"] for a in asks[1:]]
            rows.append({"set": name, "development": development, "section_tokens": size, "n_ctx": n_ctx,
                         "questions": len(asks), "reuse_median": statistics.median(shares),
                         "reuse_mean": statistics.mean(shares),
                         "sections_mean": statistics.mean(a["sections"] for a in asks)})
            log(f"{size:>5} {name}: reuse median {rows[-1]['reuse_median']:.1%}, mean {rows[-1]['reuse_mean']:.1%} "
                f"({rows[-1]['sections_mean']:.1f} sections a prompt)")
    return rows


def table(rows: list[dict]) -> str:
    sizes = sorted({r["section_tokens"] for r in rows}, reverse=True)
    names = list(dict.fromkeys(r["set"] for r in rows))
    by = {(r["set"], r["section_tokens"]): r for r in rows}
    head = "| set | " + " | ".join(f"{s} tokens" for s in sizes) + " |"
    lines = [head, "| --- |" + " --- |" * len(sizes)]
    for name in names:
        dev = by[(name, sizes[0])]["development"]
        cells = [f"{by[(name, s)]['page_in_prompt']:.3f} ({by[(name, s)]['prompt_mean_units']:.1f})" for s in sizes]
        lines.append(f"| {name} ({'development' if dev else 'held out'}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\npage in prompt (sections a prompt holds, on average)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="2048,1024,512,256", help="section sizes in embedder tokens (comma list)")
    ap.add_argument("--ctx", type=int, default=8192, help="the generator's context (engine.n_ctx)")
    ap.add_argument("--set", action="append", dest="sets", choices=DEVELOPMENT + HELD_OUT,
                    help="only this set (repeatable; default: every development set)")
    ap.add_argument("--heldout", action="store_true", help="add the held-out sets (to report a choice, not to make it)")
    ap.add_argument("--set-config", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting for every pipeline, e.g. engine.rope_scaling=linear above the trained context")
    ap.add_argument("--quick", action="store_true", help="sizes 2048 and 512, the man-page set only")
    ap.add_argument("--json", type=Path, default=None, help="write the rows to this file")
    ap.add_argument("--reuse", type=int, default=0, metavar="N",
                    help="instead: ask each set's first N questions in a row and report how much was reused")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        ap.error(f"--sizes must be a comma list of integers, got {args.sizes!r}")
    if any(s < 16 for s in sizes):
        ap.error("every size must be at least 16 tokens")
    sets = args.sets or list(DEVELOPMENT)
    if args.quick:
        sizes, sets = [2048, 512], ["manpages"]
    if args.heldout:
        sets += [s for s in HELD_OUT if s not in sets]
    started = time.time()
    overrides = {}
    for item in args.set_config:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value) if value[:1] in "0123456789-tf[{\"" else value
    if args.reuse:
        if args.reuse < 2:
            ap.error("--reuse needs at least 2 questions")
        rows = reuse(sizes, sets=sets, n_ctx=args.ctx, questions=args.reuse, overrides=overrides)
        print(f"load average at the end: {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s; context {args.ctx:,}")
        for r in rows:
            print(f"| {r['set']} | {r['section_tokens']:,} | {r['reuse_median']:.1%} | {r['reuse_mean']:.1%} |")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=2))
        return 0
    rows = measure(sizes, sets=sets, n_ctx=args.ctx, overrides=overrides)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s; context {args.ctx:,}")
    print(table(rows))
    if args.json:
        from devtools.bench import document, row

        declared = [row(f"{r['set']} page in prompt, sections of {r['section_tokens']}", r["page_in_prompt"], "",
                        set=r["set"], section_tokens=r["section_tokens"], n_ctx=r["n_ctx"],
                        development=r["development"]) for r in rows]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document(declared, sizes=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
