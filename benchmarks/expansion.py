"""Query- and document-side expansion, measured on every set: BM25 pseudo-relevance feedback and
multi-vector chunks, each against the default retrieval, with what they cost.

Run from the repository root, after ``benchmarks/heldout.py run`` has built the stores::

    .venv/bin/python benchmarks/expansion.py [--set gnuplot ...] [--json OUT.json]

- **PRF (RM3-style)**: the ten words weighing most in the top five dense hits (term frequency over
  chunk length, times idf, times the hit's similarity; stop words and the query's own words left
  out) are searched with BM25 as a second lexical query, whose ranking joins the fusion at half
  the lexical side's weight (RM3's usual even split between the original query and its feedback).
- **Multi-vector chunks**: every chunk is also embedded as its heading path and as its first
  sentence; a chunk's dense score is the best of its three similarities. The extra vectors are
  computed once per store (their time is the ingest cost) and kept beside it.
- **Window vectors**: every chunk is also embedded as windows of 128 embedder tokens (the length
  all-MiniLM-L6-v2 was trained on; chunks are 256), each under the chunk's header, a chunk's dense
  score the best of its similarities: ``+ windows`` starts a window every 64 tokens, ``+ halves``
  every 128. Chosen before scoring: a window variant becomes the default only if, over the six
  development sets, it finds more questions at recall@5 than the default in total and loses more
  than one on none (both passing: the one finding more, ``+ halves`` on a tie); the held-out sets
  are then run once and reported whatever they say.

HyDE and doc2query need a generator and run through the product itself (``retrieval.hyde``,
``chunking.doc2query``): ``benchmarks/heldout.py run --set-config retrieval.hyde=true``.
This is a benchmark, not a test: it always exits 0.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import numpy as np  # noqa: E402

from heldout import QUESTION_SETS, STOP_WORDS, cache_dir  # noqa: E402
from pipeline import Pipeline  # noqa: E402
from pipeline.retrieval import evaluate as ev  # noqa: E402
from pipeline.retrieval.fusion import AdaptiveFusion, idf  # noqa: E402
from pipeline.retrieval.rerank import ScoreRerank  # noqa: E402
from pipeline.retrieval.search import rrf  # noqa: E402

VARIANTS = ("default", "+ PRF", "+ multi-vector", "+ windows", "+ halves")
WINDOW, STRIDE = 128, 64
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n\n")


def _chunk_rows(store) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The collection's (chunk id, header, text) rows in order, and their ids."""
    rows = store.catalog.db.execute("SELECT chunk_id, coalesce(context, ''), text FROM chunks WHERE collection = ?"
                                    " ORDER BY id", (store.name,)).fetchall()
    return rows, [r[0] for r in rows]


def _cached(path: Path, ids: list[str]):
    """The vectors saved at ``path`` for exactly these chunks, or None."""
    if path.exists():
        z = np.load(path, allow_pickle=False)
        if list(z["ids"]) == ids:
            return z
    return None


def extra_vectors(rag: Pipeline, store, path: Path) -> tuple[list[str], np.ndarray, np.ndarray, float]:
    """(chunk ids, heading-path vectors, first-sentence vectors, seconds to embed them), cached at ``path``."""
    rows, ids = _chunk_rows(store)
    if (z := _cached(path, ids)) is not None:
        return ids, z["heads"], z["firsts"], float(z["seconds"])
    heads = [c.split("\n")[0] for _, c, _ in rows]
    firsts = [_SENTENCE.split(t.strip(), maxsplit=1)[0][:400] for _, _, t in rows]
    started = time.perf_counter()
    h, f = rag.embedder.embed(heads), rag.embedder.embed(firsts)
    seconds = time.perf_counter() - started
    np.savez(path, ids=np.array(ids), heads=h, firsts=f, seconds=seconds)
    return ids, h, f, seconds


def window_vectors(rag: Pipeline, store, path: Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, float]:
    """(chunk ids, window vectors, the row of each window's chunk, each window's start in STRIDE
    steps, seconds to embed them), cached at ``path``."""
    rows, ids = _chunk_rows(store)
    if (z := _cached(path, ids)) is not None:
        return ids, z["vectors"], z["owner"], z["step"], float(z["seconds"])
    texts, owner, step = [], [], []
    for i, (_, context, text) in enumerate(rows):
        words = text.split()
        counts = [len(rag.embedder.tokenize(" " + w)) for w in words]
        ends = np.cumsum(counts)
        total = int(ends[-1]) if len(ends) else 0
        k = 0
        while k * STRIDE < total and (k == 0 or k * STRIDE + WINDOW - STRIDE < total):
            lo, hi = k * STRIDE, k * STRIDE + WINDOW
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(ends, hi, side="right"))
            piece = " ".join(words[first:max(last, first + 1)])
            texts.append(f"{context}\n\n{piece}" if context else piece)
            owner.append(i)
            step.append(k)
            k += 1
    started = time.perf_counter()
    vectors = rag.embedder.embed(texts)
    seconds = time.perf_counter() - started
    np.savez(path, ids=np.array(ids), vectors=vectors, owner=np.array(owner), step=np.array(step), seconds=seconds)
    return ids, vectors, np.array(owner), np.array(step), seconds


def feedback_terms(store, query: str, dense_hits, *, docs: int = 5, terms: int = 10) -> list[str]:
    """RM3-style expansion words from the top dense hits."""
    from pipeline.store.terms import words

    asked = set(words(query))
    weights: Counter = Counter()
    n = store.catalog.db.execute("SELECT count(*) FROM chunks").fetchone()[0]
    for chunk, sim in dense_hits[:docs]:
        found = [w for w in re.findall(r"\w+", chunk.text.lower()) if len(w) > 2 and w not in STOP_WORDS
                 and not w.isdigit()]
        if not found:
            continue
        tf = Counter(found)
        stats, _ = store.catalog.term_stats(store.name, " ".join(tf), chunk.chunk_id)
        for w, k in tf.items():
            if w not in asked:
                weights[w] += max(sim, 0.0) * k / len(found) * idf(stats.df.get(w, 0), max(n, 1))
    return [w for w, _ in weights.most_common(terms)]


def ranked(rag: Pipeline, store, query: str, variant: str, mv, windows=None) -> tuple[list, float]:
    """The fused, reranked candidates of one variant, and the seconds its extra work took."""
    r = rag.config.retrieval
    vector = rag.embedder.embed_query([query])[0] if hasattr(rag.embedder, "embed_query") else \
        rag.embedder.embed([query])[0]
    dense = store.dense(vector, limit=r.candidates)
    lexical = store.lexical(query, limit=r.candidates)
    rankings = {"dense": dense, "lexical": lexical}
    extra = 0.0
    started = time.perf_counter()
    if variant in ("+ multi-vector", "+ windows", "+ halves"):
        if variant == "+ multi-vector":
            ids, heads, firsts, _ = mv
            best = np.maximum(heads @ vector, firsts @ vector)
        else:
            ids, vectors, owner, step, _ = windows
            keep = slice(None) if variant == "+ windows" else (step % (WINDOW // STRIDE) == 0)
            best = np.full(len(ids), -np.inf)
            np.maximum.at(best, owner[keep], vectors[keep] @ vector)
        pool = {c.chunk_id: (c, s) for c, s in dense}
        top = np.argsort(-best)[: r.candidates]
        wanted = [ids[i] for i in top if ids[i] not in pool]
        if wanted:
            vecs = store.vectors(wanted)
            for cid in wanted:
                pool[cid] = (None, float(vecs[cid] @ vector) if cid in vecs else 0.0)
        index = {cid: i for i, cid in enumerate(ids)}
        scored = {cid: max(s, float(best[index[cid]])) for cid, (_, s) in pool.items() if cid in index}
        chunks = {c.chunk_id: c for c, _ in dense}
        missing = [cid for cid in scored if cid not in chunks]
        if missing:
            for c in _chunks(store, missing):
                chunks[c.chunk_id] = c
        rankings["dense"] = sorted(((chunks[cid], s) for cid, s in scored.items() if cid in chunks),
                                   key=lambda e: -e[1])[: r.candidates]
    weight = AdaptiveFusion.from_config(r).weight(query, lexical[0][0], store, dense=dense) if lexical else 1.0
    weights = {"lexical": weight}
    if variant == "+ PRF":
        terms = feedback_terms(store, query, dense)
        rankings["feedback"] = store.lexical(" ".join(terms), limit=r.candidates) if terms else []
        weights["feedback"] = 0.5 * weight
    extra += time.perf_counter() - started
    fused = rrf(rankings, k=r.rrf_k, weights=weights)
    fused = ScoreRerank(candidates=r.rerank_candidates, dense_weight=r.rerank_dense_weight)(
        query, fused, vector=vector, store=store, lexical_weight=weight)
    return fused, extra


def _chunks(store, chunk_ids):
    from pipeline.records import StoredChunk

    marks = ",".join("?" * len(chunk_ids))
    rows = store.catalog.db.execute(
        'SELECT chunk_id, source, content_hash, idx, page, start, "end", tokens, text FROM chunks'
        f" WHERE chunk_id IN ({marks})", list(chunk_ids))
    return [StoredChunk(*row) for row in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", action="append", dest="sets", help="only this set (repeatable)")
    ap.add_argument("--variant", action="append", dest="variants", choices=VARIANTS,
                    help="only this variant (repeatable; the default is always run)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    out = []
    opened: dict[str, Pipeline] = {}
    try:
        for name, qfile, label, development in QUESTION_SETS:
            if args.sets and name not in args.sets:
                continue
            path = cache_dir() / "stores" / label
            if not path.exists():
                print(f"{name}: no store at {path} (run benchmarks/heldout.py run first)")
                continue
            rag = opened.setdefault(label, Pipeline.from_config(overrides={"store.path": str(path)}))
            questions = ev.load_questions(qfile)
            with rag.store(create=False) as store:
                mv = extra_vectors(rag, store, path.with_suffix(".multivector.npz"))
                wv = window_vectors(rag, store, path.with_suffix(".windows.npz"))
                n_chunks = len(mv[0])
                ingest_s = {"+ multi-vector": mv[3], "+ windows": wv[4],
                            "+ halves": wv[4] * float(np.mean(wv[3] % (WINDOW // STRIDE) == 0))}
                for variant in VARIANTS:
                    if args.variants and variant != "default" and variant not in args.variants:
                        continue
                    found, costs = [], []
                    for q in questions:
                        fused, extra = ranked(rag, store, q.question, variant, mv, wv)
                        costs.append(extra)
                        hits = [ev.targets_found(q, c.source, c.page, c.text) for c, _, _ in fused[: ev.DEPTH]]
                        found.append(ev.question_metrics(hits, len(q.targets)))
                    row = {"set": name, "development": development, "variant": variant, "questions": len(questions),
                           "recall@5": round(statistics.fmean(m["recall@5"] for m in found), 4),
                           "recall@10": round(statistics.fmean(m["recall@10"] for m in found), 4),
                           "extra_ms_per_query": round(1000 * statistics.median(costs), 2),
                           "ingest_s_per_1000_chunks": round(1000 * ingest_s.get(variant, 0.0) / n_chunks, 1)}
                    out.append(row)
                    print(json.dumps(row))
    finally:
        for rag in opened.values():
            rag.close()
    print("| set | variant | recall@5 | recall@10 | extra ms/query | ingest s/1000 chunks |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in out:
        tag = "development" if r["development"] else "held out"
        print(f"| {r['set']} ({tag}) | {r['variant']} | {r['recall@5']:.3f} | {r['recall@10']:.3f} | "
              f"{r['extra_ms_per_query']:.1f} | {r['ingest_s_per_1000_chunks']:.1f} |")
    if args.json:
        from devtools.bench import document, row

        declared = [row(f"{r['set']} {r['variant']} recall@5", r["recall@5"], "", set=r["set"], variant=r["variant"])
                    for r in out]
        declared += [row(f"{r['set']} {r['variant']} extra ms/query", r["extra_ms_per_query"], "ms", set=r["set"],
                         variant=r["variant"]) for r in out if r["variant"] != "default"]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document(declared, variants=out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
