"""Section size against the answer's page in the prompt, at one context length.

Run from the repository root (it uses the stores ``benchmarks/heldout.py run`` keeps, and
ingests them there first when they are missing)::

    .venv/bin/python benchmarks/section_size.py [--sizes 2048,1024,512,256] [--ctx 8192]
        [--set NAME ...] [--heldout] [--set-config KEY=VALUE ...] [--json OUT.json] [--quick]

Sections are cut at ingest, so comparing sizes would need one ingest per size. They are cut
from the stored chunks alone, though: for each size every store is copied to a temporary
folder and its sections are cut again at that size (``chunking.section_tokens``), as
``rag sections --recut`` does. Nothing is embedded again.
Then ``rag eval --packed`` for the default configuration: for each question, whether the page
that answers it is inside the prompt ``rag ask`` builds, with the prompt's median length and how
many sections it holds on average.

By default only the development sets run: a section size is chosen on them. ``--heldout`` adds
the two held-out manuals, to report the chosen default once, never to choose it.
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
    rows = measure(sizes, sets=sets, n_ctx=args.ctx, overrides=overrides)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s; context {args.ctx:,}")
    print(table(rows))
    if args.json:
        from pipeline.dev.bench import document, row

        declared = [row(f"{r['set']} page in prompt, sections of {r['section_tokens']}", r["page_in_prompt"], "",
                        set=r["set"], section_tokens=r["section_tokens"], n_ctx=r["n_ctx"],
                        development=r["development"]) for r in rows]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document(declared, sizes=rows), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
