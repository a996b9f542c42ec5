"""Shared-store ingest benchmark: 1, 2 and 4 ``rag ingest`` processes into one collection on a
Chroma server + PostgreSQL, against one process into the embedded store, in one run.

Run from the repository root::

    .venv/bin/python benchmarks/shared_ingest.py [--files 24] [--repeat 1] [--fake [--delay S]] [--json OUT.json]

It starts its own servers on 127.0.0.1 (``chroma run`` and a throwaway PostgreSQL cluster, see
:mod:`devtools.servers`), writes a synthetic corpus of ``--files`` Markdown files, then for
each configuration starts N ``rag ingest CORPUS`` processes at once on the same folder (they split
the files through their document locks, see :mod:`pipeline.ingest.run`) into a fresh collection,
and times from the first start to the last exit (model loads included: each process loads its
embedder, as separate machines would). Tokens are the collection's committed content tokens.

``--fake`` uses the tests' deterministic fake embedder (``tests/support/fake_ingest.py``) instead of
all-MiniLM-L6-v2, sleeping ``--delay`` seconds per chunk instead of computing: it stands for
embedders on other machines (each ingest process on its own box), so the rows show how the
shared store itself scales, without the embedder's CPU time, which on a 2-core machine no number
of processes can multiply. Configurations are
interleaved over repeats and each figure is the median. A benchmark, not a test: it exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devtools.bench import document, row  # noqa: E402
from devtools.servers import ChromaServer, PostgresCluster, postgres_bin  # noqa: E402

CONFIGS = [("embedded", 1), ("server", 1), ("server", 2), ("server", 4)]


def write_corpus(root: Path, files: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        body = "\n\n".join(f"Section {j} of report {i}: measurement {i * 100 + j} shows the pump pressure "
                           f"rising while valve {j} stays closed and the operator logs reading {j * 7}."
                           for j in range(24))
        (root / f"report{i:03d}.md").write_text(f"# Report {i}\n\n{body}\n")
    return root


def run_config(kind: str, n: int, *, corpus: Path, base: Path, run: int, chroma: str, pg: str,
               fake: bool, delay: float) -> dict:
    collection = f"bench-{kind}-{n}-{run}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_STORE_")}
    env.update(RAG_STORE_PATH=str(base / f"store-{collection}"), RAG_STORE_COLLECTION=collection,
               RAG_CACHE_PATH=str(base / "cache"), RAG_INGEST_WARM="off")  # embedding and the store only
    if kind == "server":
        env.update(RAG_STORE_URL=chroma, RAG_STORE_CATALOG_URL=pg)
    cmd = ([sys.executable, str(ROOT / "tests" / "support" / "fake_ingest.py"), str(corpus), str(delay)] if fake
           else [sys.executable, "-m", "pipeline", "ingest", str(corpus)])
    started = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(n)]
    outs = [p.communicate()[0].decode(errors="replace") for p in procs]
    seconds = time.perf_counter() - started
    failed = [o[-500:] for p, o in zip(procs, outs) if p.returncode != 0]
    status = subprocess.run([sys.executable, "-m", "pipeline", "status", "--json"], env=env,
                            capture_output=True, text=True)
    st = json.loads(status.stdout) if status.returncode == 0 else {}
    return {"store": kind, "processes": n, "seconds": seconds, "documents": st.get("documents"),
            "chunks": st.get("chunks"), "dense_chunks": st.get("dense_chunks"), "tokens": st.get("tokens") or 0,
            "failed": failed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--fake", action="store_true", help="the tests' fake embedder: the store's cost alone")
    ap.add_argument("--delay", type=float, default=0.05, help="with --fake: seconds per chunk (sleeping)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="8 files, fake embedder: a smoke run")
    args = ap.parse_args(argv)
    if args.quick:
        args.files, args.fake, args.repeat = 8, True, 1
    bindir = postgres_bin()
    if bindir is None:
        print("PostgreSQL is not installed (apt-get install postgresql): cannot run this benchmark")
        return 0
    with tempfile.TemporaryDirectory(prefix="rag-bench-shared-") as tmp:
        base = Path(tmp)
        corpus = write_corpus(base / "corpus", args.files)
        chroma = ChromaServer(base / "chroma").start()
        cluster = PostgresCluster(bindir).start()
        try:
            pg = cluster.create_database()
            rows: dict[tuple[str, int], list[dict]] = {c: [] for c in CONFIGS}
            for run in range(args.repeat):
                order = CONFIGS[run % len(CONFIGS):] + CONFIGS[:run % len(CONFIGS)]
                for kind, n in order:
                    r = run_config(kind, n, corpus=corpus, base=base, run=run, chroma=chroma.url, pg=pg,
                                   fake=args.fake, delay=args.delay)
                    rows[(kind, n)].append(r)
                    print(f"  run {run + 1}: {kind} x{n}: {r['seconds']:.2f} s, {r['documents']} documents, "
                          f"{r['chunks']} chunks ({r['dense_chunks']} vectors)"
                          + (f"  FAILED: {r['failed']}" if r["failed"] else ""), flush=True)
        finally:
            chroma.stop()
            cluster.stop()
    embedder = (f"fake embedder sleeping {args.delay:g} s per chunk (tests/support/fake_ingest.py)" if args.fake
                else "all-MiniLM-L6-v2 (rag ingest)")
    print(f"\n{args.files} files, {embedder}, {os.cpu_count()} CPUs, median of {args.repeat}")
    print("| store | processes | seconds | tokens/s | × embedded, 1 process | documents | chunks = vectors |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    summary = []
    base_rate = None
    for kind, n in CONFIGS:
        rs = rows[(kind, n)]
        secs = statistics.median(r["seconds"] for r in rs)
        tokens = rs[0]["tokens"]
        rate = tokens / secs if secs else 0.0
        base_rate = base_rate or rate
        ok = all(r["chunks"] == r["dense_chunks"] and not r["failed"] for r in rs)
        label = "embedded (SQLite + Chroma files)" if kind == "embedded" else "Chroma server + PostgreSQL"
        print(f"| {label} | {n} | {secs:.2f} | {rate:,.0f} | {rate / base_rate:.2f} | {rs[0]['documents']} | "
              f"{'yes' if ok else 'NO'} |")
        summary.append({"store": kind, "processes": n, "seconds": secs, "tokens": tokens, "tokens_per_second": rate,
                        "ratio": rate / base_rate, "consistent": ok, "runs": rs})
    if args.json:
        rows_out = []
        for r in summary:
            name = f"{r['store']} x{r['processes']}"
            rows_out += [row(f"{name} tokens/s", round(r["tokens_per_second"], 1), "tokens/s"),
                         row(f"{name} vs embedded x1", round(r["ratio"], 3), "x",
                             ratio=(f"{name} tokens/s", "embedded x1 tokens/s")),
                         row(f"{name} consistent", r["consistent"])]
        args.json.write_text(json.dumps(document(rows_out, files=args.files, fake=args.fake, delay=args.delay,
                                                 results=summary), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
