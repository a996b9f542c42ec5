"""The held-out manuals: fetch them, and check how far their questions are paraphrased.

Run from the repository root::

    .venv/bin/python benchmarks/heldout.py fetch      # the PDFs, into ~/.cache/rag/heldout (once)
    .venv/bin/python benchmarks/heldout.py overlap    # content words each question shares with its passage
    .venv/bin/python benchmarks/heldout.py run [--json OUT.json]   # every setting x every set (the default)

``run`` ingests five corpora into stores kept under the cache folder (ingest is incremental, so
a second run embeds nothing): the development corpus (``samples/`` and
``benchmarks/eval/generated/``), the two manuals these machines carry under ``/usr/share/doc``,
the man pages in ``benchmarks/eval/manpages/``, the man-page shelf (those five among the system's
man pages of 24 other tools, :data:`SHELF_MANPAGES`, rendered into the cache folder the first time),
and the held-out shelf (both fetched manuals in one collection, so each question is searched
against both). It then runs every question set through every retrieval setting and prints one
table: recall@5 and recall@10 by page, MRR, and for the default configuration the share of
questions whose answer page is inside the prompt ``rag ask`` builds (``rag eval --packed``; the
generator's tokenizer loads for it, ``--no-packed`` skips it). Development sets (``dev``,
``dev-paraphrased``, ``usr-share-doc``, ``usr-share-doc-paraphrased``, ``manpages``,
``manpages-shelf``) are marked as such: settings were chosen on them.

Two real manuals no one on the project wrote, from Debian documentation packages: ``gnuplot.pdf``
(``gnuplot-doc``) and ``asymptote.pdf`` (``asymptote-doc``). They are fetched with ``apt-get
download`` and unpacked with ``dpkg -x`` into a cache folder (``$RAG_HELDOUT_CACHE``, default
``~/.cache/rag/heldout``): nothing is installed on the system. Only these two packages are ever
fetched; the other Debian documentation packages are kept back for independent checks.

The question sets (``benchmarks/eval/heldout-<manual>.jsonl``) were written by reading the PDFs
before any retrieval setting was changed or tuned, and are frozen: each line carries the date it was
written (``_written``) and the sentences of its page that answer it (``_passage``). ``overlap``
counts the content words (lower-cased, stop words and one-letter tokens dropped, a light suffix
stemming) a question shares with its passage, and reports the share of questions sharing at most
one: the sets are meant to be worded the way users ask, not copied from the text.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVAL = ROOT / "benchmarks" / "eval"

#: package -> the PDF inside it that is the held-out manual. Nothing else is ever fetched.
MANUALS = {
    "gnuplot-doc": "usr/share/doc/gnuplot/gnuplot.pdf",
    "asymptote-doc": "usr/share/doc/asymptote/asymptote.pdf",
}
#: the question set of each manual
SETS = {
    "gnuplot-doc": EVAL / "heldout-gnuplot.jsonl",
    "asymptote-doc": EVAL / "heldout-asymptote.jsonl",
}


def cache_dir() -> Path:
    return Path(os.environ.get("RAG_HELDOUT_CACHE") or Path.home() / ".cache" / "rag" / "heldout")


def fetch(*, cache: Path | None = None, log=print) -> dict[str, Path]:
    """The held-out PDFs, downloading and unpacking the packages the first time. Raises
    :class:`RuntimeError` with the tool's message when ``apt-get`` or ``dpkg`` fail."""
    cache = cache or cache_dir()
    found: dict[str, Path] = {}
    for package, inner in MANUALS.items():
        pdf = cache / package / inner
        if not pdf.is_file():
            debs = cache / "debs"
            debs.mkdir(parents=True, exist_ok=True)
            deb = next(iter(sorted(debs.glob(f"{package}_*.deb"))), None)
            if deb is None:
                log(f"apt-get download {package}")
                _run(["apt-get", "download", package], cwd=debs)
                deb = next(iter(sorted(debs.glob(f"{package}_*.deb"))), None)
                if deb is None:
                    raise RuntimeError(f"apt-get download {package} left no .deb in {debs}")
            log(f"dpkg -x {deb.name}")
            tmp = Path(tempfile.mkdtemp(dir=cache, prefix=f".{package}-"))  # half-unpacked never looks done
            try:
                _run(["dpkg", "-x", str(deb), str(tmp)])
                if (cache / package).exists():
                    shutil.rmtree(cache / package)
                os.replace(tmp, cache / package)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if not pdf.is_file():
                raise RuntimeError(f"{deb.name} has no {inner}")
        found[package] = pdf
    return found


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError(f"{cmd[0]} is not installed (a Debian-based system is needed to fetch the manuals)")
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.stdout.strip()}")


# --- paraphrase check ---------------------------------------------------------------------------

STOP_WORDS = frozenset("""
a about above across after afterwards again against all almost alone along already also although always am
among amongst an and another any anyhow anyone anything anyway anywhere are around as at back be became
because become becomes becoming been before beforehand behind being below beside besides between beyond both
but by can cannot could did do does doing done down during each either else elsewhere enough etc even ever
every everyone everything everywhere except few for former formerly from further get gets give given gives go
had has have having he hence her here hers herself him himself his how however i ie if in indeed instead into
is it its itself just keep last latter least less let like made make makes many may me meanwhile might mine
more moreover most mostly much must my myself neither never nevertheless next no nobody none nor not nothing
now nowhere of off often on once one only onto or other others otherwise our ours ourselves out over own per
perhaps please put rather re same see seem seemed seems several she should since so some somehow someone
something sometime sometimes somewhere still such than that the their theirs them themselves then thence there
thereafter thereby therefore therein thereupon these they this those though through throughout thru thus to
together too toward towards under until up upon us use used uses using very via was way we well were what
whatever when whence whenever where whereas whereby wherein whereupon wherever whether which while whither who
whoever whole whom whose why will with within without would yet you your yours yourself yourselves
don doesn isn aren won t s ll ve d m want need
""".split())


def content_words(text: str) -> set[str]:
    """Lower-cased word stems of ``text`` without stop words and one-character tokens."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return {_stem(w) for w in words if len(w) > 1 and w not in STOP_WORDS}


def _stem(word: str) -> str:
    for suffix in ("ations", "ation", "ings", "ing", "ies", "ied", "es", "ed", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def overlap(path: Path) -> list[tuple[str, set[str]]]:
    """(id, the content words shared with the passage) for each question of a set."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        q = json.loads(line)
        rows.append((q["id"], content_words(q["question"]) & content_words(q["_passage"])))
    return rows


# --- every setting x every set ------------------------------------------------------------------

USR_SHARE_DOC = [Path("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf"),
                 Path("/usr/share/doc/libtasn1-doc/libtasn1.pdf")]

#: Man pages put on the shelf beside the five of ``benchmarks/eval/manpages/`` so that the shelf is
#: ten times a 64K context: the man-page questions against about 700K embedder tokens of other
#: tools' manuals, where the section size at large contexts can be told apart (development only).
SHELF_MANPAGES = ("git-config", "curl", "gpg", "ld.bfd", "git-log", "top", "as", "zip", "systemctl", "find",
                  "less", "xz", "dash", "git-rebase", "ssh", "ssh_config", "openssl-req",
                  "tar", "grep", "perf-record", "strace", "journalctl", "ps", "lsof")


def man_shelf(*, cache: Path | None = None, log=print) -> Path:
    """The folder of :data:`SHELF_MANPAGES` rendered to text as ``benchmarks/eval/manpages/`` was
    (``MANWIDTH=100 man --nh --nj -P cat NAME | col -bx``), rendering them the first time. Pages this
    system lacks are left out with a warning, so the shelf is only comparable between machines
    that render the same pages (the run logs how many it holds)."""
    folder = (cache or cache_dir()) / "manshelf"
    done = folder / ".complete"
    if done.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    missing = []
    for name in SHELF_MANPAGES:
        try:
            text = subprocess.run(f"MANWIDTH=100 man --nh --nj -P cat {name} 2>/dev/null | col -bx", shell=True,
                                  capture_output=True, text=True, check=True).stdout
        except subprocess.CalledProcessError:
            text = ""
        if len(text) < 1000:
            missing.append(name)
            continue
        (folder / f"{name}.txt").write_text(text)
    if missing:
        log(f"warning: man pages not on this system, left off the shelf: {', '.join(missing)}")
    done.write_text("\n".join(sorted(f.name for f in folder.glob("*.txt"))) + "\n")
    return folder


def corpus(label: str, pdfs: dict[str, Path] | None = None) -> list[Path]:
    """The paths ingested into the store ``label``: the held-out shelf needs the fetched ``pdfs``;
    the man-page shelf is rendered the first time."""
    if label == "heldout":
        if pdfs is None:
            raise ValueError("the held-out shelf needs the fetched PDFs (fetch())")
        return [pdfs["gnuplot-doc"], pdfs["asymptote-doc"]]
    if label == "manshelf":
        return [EVAL / "manpages", man_shelf()]
    return {"dev": [ROOT / "samples", EVAL / "generated"], "usr-share-doc": USR_SHARE_DOC,
            "manpages": [EVAL / "manpages"]}[label]


#: (set name, question file, store label, development set?)
QUESTION_SETS = [
    ("dev", EVAL / "devset.jsonl", "dev", True),
    ("usr-share-doc", EVAL / "outside.jsonl", "usr-share-doc", True),
    ("usr-share-doc-paraphrased", EVAL / "outside-paraphrased.jsonl", "usr-share-doc", True),
    ("dev-paraphrased", EVAL / "devset-paraphrased.jsonl", "dev", True),
    ("manpages", EVAL / "manpages.jsonl", "manpages", True),
    ("manpages-shelf", EVAL / "manpages.jsonl", "manshelf", True),
    ("gnuplot", SETS["gnuplot-doc"], "heldout", False),
    ("asymptote", SETS["asymptote-doc"], "heldout", False),
]

#: the ``rag eval`` setting that is the default configuration
DEFAULT_SETTING = "adaptive+rerank"
#: what each row of the table is called, and the ``rag eval`` setting behind it
ROWS = [("dense only", "dense"), ("lexical only", "lexical"), ("hybrid RRF", "hybrid"),
        ("hybrid RRF + rerank (the default before adaptive fusion)", "hybrid+rerank"),
        ("adaptive fusion", "adaptive"), ("default: adaptive fusion + rerank", "adaptive+rerank")]


def run_sets(*, settings: list[tuple[str, str]] = ROWS, sets: list[str] | None = None, store_root: Path | None = None,
             overrides: dict | None = None, packed: bool = True, log=print) -> list[dict]:
    """Every question set through every setting; one dict per (set, setting). With ``packed``, the
    row of the configured default also says how often the answer's page is inside the prompt
    ``rag ask`` builds (``page_in_prompt``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from pipeline import Pipeline

    pdfs = fetch(log=log)
    store_root = store_root or cache_dir() / "stores"
    wanted = [s for s in QUESTION_SETS if sets is None or s[0] in sets]
    rows = []
    pipelines: dict[str, Pipeline] = {}
    try:
        for name, questions, label, development in wanted:
            if label not in pipelines:
                rag = Pipeline.from_config(overrides={"store.path": str(store_root / label), **(overrides or {})})
                pipelines[label] = rag
                report = rag.ingest(corpus(label, pdfs))
                if report.chunks:
                    log(f"ingested {label}: {report.chunks} chunks, {report.tokens:,} tokens in {report.seconds:.1f} s "
                        f"({1000 * report.seconds / report.chunks:.1f} s per 1,000 chunks)")
            rag = pipelines[label]
            report = rag.evaluate(questions, settings=[s for _, s in settings], label=name, packed=packed)
            share = None
            if report.packed is not None:
                from pipeline.retrieval.evaluate import packed_summary

                summary = packed_summary(report.packed)
                share, modes = summary["share"], summary["modes"]
                prompt_shape = {"prompt_median_tokens": summary["median_tokens"],
                                "prompt_mean_units": round(sum(r["units"] for r in report.packed)
                                                           / max(1, len(report.packed)), 2)}
            for u in report.unreachable:
                log(f"warning: {name} {u['id']}: {u['reason']}")
            for (row_name, _), result in zip(settings, report.settings):
                d = result.summary()
                rows.append({"set": name, "development": development, "setting": row_name,
                             "questions": d["questions"], "recall@5": d["recall@5"], "recall@10": d["recall@10"],
                             "mrr": d["mrr"], "latency_ms": d["latency_ms"].get("total"),
                             "misses@5": [q["id"] for q in result.misses(5)],
                             **({"page_in_prompt": share, "prompt_modes": modes, **prompt_shape}
                                if share is not None and result.name == DEFAULT_SETTING else {})})
    finally:
        for rag in pipelines.values():
            rag.close()
    return rows


def sets_table(rows: list[dict]) -> str:
    lines = ["| set | setting | questions | recall@5 | recall@10 | MRR | page in prompt |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        name = r["set"] + (" (development)" if r["development"] else " (held out)")
        packed = f"{r['page_in_prompt']:.3f}" if r.get("page_in_prompt") is not None else "-"
        lines.append(f"| {name} | {r['setting']} | {r['questions']} | {r['recall@5']:.3f} | {r['recall@10']:.3f} "
                     f"| {r['mrr']:.3f} | {packed} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command")
    sub.add_parser("fetch", help="download and unpack the held-out manuals into the cache folder")
    o = sub.add_parser("overlap", help="content words each question shares with its passage")
    o.add_argument("--verbose", "-v", action="store_true", help="list the shared words of each question")
    r = sub.add_parser("run", help="every retrieval setting over every question set")
    r.add_argument("--set", action="append", dest="sets", help="only this set (repeatable)")
    r.add_argument("--json", type=Path, default=None, help="write the rows to this file")
    r.add_argument("--no-packed", action="store_true", help="skip the page-in-prompt check (no generator needed)")
    r.add_argument("--stores", type=Path, default=None,
                   help="keep the stores here (default: the cache folder's stores/); a fresh folder re-ingests")
    r.add_argument("--setting", action="append", dest="rows", choices=[s for _, s in ROWS],
                   help="only this retrieval setting (repeatable)")
    r.add_argument("--set-config", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for every pipeline, e.g. engine.n_ctx=32768 (repeatable)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["run", *argv]  # what `rag bench` runs: `heldout.py --json OUT`
    args = ap.parse_args(argv)
    if args.command == "run":
        import time

        started = time.time()
        overrides = {}
        for item in args.set_config:
            key, _, value = item.partition("=")
            overrides[key] = json.loads(value) if value[:1] in "0123456789-tf[{\"" else value
        chosen = [row for row in ROWS if not args.rows or row[1] in args.rows]
        rows = run_sets(settings=chosen, sets=args.sets, packed=not args.no_packed, overrides=overrides,
                        store_root=args.stores)
        print(f"load average at the end: {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s")
        print(sets_table(rows))
        if args.json:
            from devtools.bench import document, row

            declared = [row(f"{r['set']} {r['setting']} recall@5", r["recall@5"], "", set=r["set"],
                            setting=r["setting"], development=r["development"]) for r in rows]
            declared += [row(f"{r['set']} page in prompt", r["page_in_prompt"], "", set=r["set"],
                             development=r["development"]) for r in rows if r.get("page_in_prompt") is not None]
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(document(declared, sets=rows), indent=2))
        return 0
    if args.command == "fetch":
        try:
            for package, pdf in fetch().items():
                print(f"{package}: {pdf}")
        except RuntimeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    total = low = 0
    for package, path in SETS.items():
        rows = overlap(path)
        n_low = sum(1 for _, shared in rows if len(shared) <= 1)
        total, low = total + len(rows), low + n_low
        print(f"{path.relative_to(ROOT)}: {n_low} of {len(rows)} questions share at most one content word "
              f"with their passage ({n_low / len(rows):.2f})")
        if args.verbose:
            for qid, shared in rows:
                print(f"  {qid}: {len(shared)} {sorted(shared)}")
    print(f"all held-out sets: {low} of {total} ({low / total:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
