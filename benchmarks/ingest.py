"""Ingest benchmark: the embedder's raw rate against the pipeline's embedding and whole-ingest rates.

Run from the repository root::

    .venv/bin/python benchmarks/ingest.py [--samples DIR] [--repeat N] [--json OUT.json]

What it measures, in one process, over the same corpus (default: the repo's ``samples/``):

* **raw**: a bare ``llama_cpp.Llama(embedding=True)`` with n_ctx = n_batch = n_ubatch = 512,
  one chunk per low-level decode, no I/O; flash attention on (the reference) and off. The
  chunks come from the pipeline's own Chunker and are tokenized before the clock starts.
  Also ``llm.embed(list)`` packed at n_batch = n_ubatch = 2048 (informational; it tokenizes
  inside the timed call).
* **pipeline embedding**: ``Embedder.embed_tokens`` at its default settings over the same
  token sequences.
* **whole ingest**: ``Pipeline.ingest`` into a fresh temporary store, model already loaded;
  at the defaults (contextual chunks: each chunk embedded with its title and heading path)
  and with ``chunking.contextual`` off, interleaved, so their ratio is the headers' cost.
* **re-ingest**: the same ingest again, nothing changed, same Pipeline object.

Repeats are interleaved (rotating order) and each figure is the median, so machine noise hits
every row alike. Token counts everywhere are *content tokens* (``Chunk.tokens``: no
[CLS]/[SEP]), the same definition as ``IngestReport.tokens``. This is a benchmark, not a test:
it always exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pipeline import Pipeline  # noqa: E402
from pipeline.ingest.chunking import for_embedder  # noqa: E402
from pipeline.ingest.loaders import detect_format, load  # noqa: E402
from pipeline.ingest.scan import scan  # noqa: E402

RAW_CTX = 512
PACKED_CTX = 2048
TOLERANCE = 0.97  # pipeline/raw ratio accepted as "not slower" on a noisy shared machine
INGEST_FRACTION = 0.80
REINGEST_FRACTION = 0.05


def bare_llama(model_path: Path, *, ctx: int, flash_attn: bool, threads: int):
    import llama_cpp

    return llama_cpp.Llama(
        model_path=str(model_path), embedding=True, n_ctx=ctx, n_batch=ctx, n_ubatch=ctx,
        n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
        pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, verbose=False,
    )


def raw_decode_loop(llm, seqs: list[list[int]]) -> np.ndarray:
    """One chunk per decode, written independently of ``Embedder._decode``."""
    import llama_cpp

    dim = int(llm.n_embd())
    out = np.empty((len(seqs), dim), dtype=np.float32)
    batch, ctx = llm._batch, llm._ctx
    for i, tokens in enumerate(seqs):
        batch.reset()
        batch.add_sequence(tokens, 0, True)
        ctx.kv_cache_clear()
        ctx.decode(batch)
        ptr = llama_cpp.llama_get_embeddings_seq(ctx.ctx, 0)
        out[i] = np.ctypeslib.as_array(ptr, shape=(dim,))
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def chunker(p: Pipeline):
    """The chunker ``p`` ingests with (the configured sizes over its embedder)."""
    c = p.config.chunking
    return for_embedder(p.embedder, size=c.size, overlap=c.overlap, contextual=c.contextual)


def timed(fn):
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=Path, default=ROOT / "samples")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write the figures to this file")
    ap.add_argument("--quick", action="store_true", help="one repeat (a smoke run; figures are noisier)")
    args = ap.parse_args(argv)
    samples = args.samples.resolve()
    repeat = 1 if args.quick else max(1, args.repeat)

    # -- setup (untimed) -----------------------------------------------------------------
    t0 = time.perf_counter()
    import chromadb  # noqa: F401  (import once here, so no timed ingest pays it)
    chroma_import_s = time.perf_counter() - t0

    base = Pipeline.from_config()
    embedder = base.embedder  # the pipeline's Embedder at default settings
    model_path = embedder.model_path
    threads = embedder.threads
    t0 = time.perf_counter()
    embedder.llm
    model_load_s = time.perf_counter() - t0
    split = chunker(base)

    files = [f.path for f in scan([samples]).files]
    chunks = []
    for path in files:
        if detect_format(path) is None:
            continue
        doc = load(path)
        chunks.extend(split.split(doc.units, fmt=doc.format))
    if not chunks:
        print(f"no chunks from {samples}", file=sys.stderr)
        return 0
    texts = [c.text for c in chunks]
    content_tokens = sum(c.tokens for c in chunks)

    raw_on = bare_llama(model_path, ctx=RAW_CTX, flash_attn=True, threads=threads)
    raw_off = bare_llama(model_path, ctx=RAW_CTX, flash_attn=False, threads=threads)
    packed = bare_llama(model_path, ctx=PACKED_CTX, flash_attn=True, threads=threads)
    seqs = [raw_on.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in texts]
    same_seqs = all(s == embedder.sequence(t) for s, t in zip(seqs, texts))
    full_tokens = sum(len(s) for s in seqs)

    # warm every engine once (first decode allocates compute buffers)
    for llm in (raw_on, raw_off):
        raw_decode_loop(llm, seqs[:1])
    packed.embed(texts[:2])
    check = seqs[:8]  # the vectors must agree (a subset keeps the run short)
    ref = raw_decode_loop(raw_on, check)
    pipe_vecs = embedder.embed_tokens(check)
    agreement = float(np.min(np.sum(ref * pipe_vecs, axis=1)))

    # -- interleaved repeats --------------------------------------------------------------
    samples_s: dict[str, list[float]] = {k: [] for k in (
        "raw_fa_on", "raw_fa_off", "packed_2048", "pipeline_embed", "ingest_report", "ingest_wall",
        "ingest_embed", "reingest_report", "reingest_wall", "ingest_plain_report")}
    ingest_tokens: list[int] = []
    ingest_chunks: list[int] = []
    reingest_status: list[str] = []

    def run_raw_on():
        samples_s["raw_fa_on"].append(timed(lambda: raw_decode_loop(raw_on, seqs))[0])

    def run_raw_off():
        samples_s["raw_fa_off"].append(timed(lambda: raw_decode_loop(raw_off, seqs))[0])

    def run_packed():
        samples_s["packed_2048"].append(timed(lambda: packed.embed(texts, normalize=True))[0])

    def run_pipeline():
        samples_s["pipeline_embed"].append(timed(lambda: embedder.embed_tokens(seqs))[0])

    def run_ingest():
        with tempfile.TemporaryDirectory(prefix="rag-bench-") as tmp:
            p = Pipeline.from_config(overrides={"store.path": tmp, "store.collection": "bench"})
            try:
                p.embedder.llm  # warm: model load excluded from the timing
                chunker(p)  # warm: the splitter's import excluded too
                p.embedder.embed(["warm up"])
                wall, rep = timed(lambda: p.ingest([samples]))
                samples_s["ingest_report"].append(rep.seconds)
                samples_s["ingest_wall"].append(wall)
                samples_s["ingest_embed"].append(rep.embed_seconds)
                ingest_tokens.append(rep.tokens)
                ingest_chunks.append(rep.chunks)
                wall2, rep2 = timed(lambda: p.ingest([samples]))
                samples_s["reingest_report"].append(rep2.seconds)
                samples_s["reingest_wall"].append(wall2)
                reingest_status.append(rep2.summary())
            finally:
                p.close()

    def run_ingest_plain():
        with tempfile.TemporaryDirectory(prefix="rag-bench-") as tmp:
            p = Pipeline.from_config(overrides={"store.path": tmp, "store.collection": "bench",
                                                "chunking.contextual": False})
            try:
                p.embedder.llm
                chunker(p)  # warm: the splitter's import excluded too
                p.embedder.embed(["warm up"])
                samples_s["ingest_plain_report"].append(p.ingest([samples]).seconds)
            finally:
                p.close()

    steps = [run_raw_on, run_pipeline, run_ingest, run_raw_off, run_ingest_plain, run_packed]
    for r in range(repeat):
        k = r % len(steps)
        for step in steps[k:] + steps[:k]:
            step()

    for llm in (raw_on, raw_off, packed):
        llm.close()
    base.close()

    # -- figures ---------------------------------------------------------------------------
    med = {k: statistics.median(v) for k, v in samples_s.items()}
    n_tok = content_tokens
    tokens_match = all(t == content_tokens for t in ingest_tokens)

    def rate(seconds: float) -> float:
        return n_tok / seconds if seconds else 0.0

    raw = rate(med["raw_fa_on"])
    rows = [
        ("raw, 1 chunk/decode, flash attn on (ref)", med["raw_fa_on"], rate(med["raw_fa_on"])),
        ("raw, 1 chunk/decode, flash attn off", med["raw_fa_off"], rate(med["raw_fa_off"])),
        ("llm.embed(list), n_batch=n_ubatch=2048, FA on", med["packed_2048"], rate(med["packed_2048"])),
        (f"pipeline Embedder.embed_tokens (group_tokens={embedder.group_tokens})",
         med["pipeline_embed"], rate(med["pipeline_embed"])),
        ("whole ingest, warm (report.seconds)", med["ingest_report"], rate(med["ingest_report"])),
        ("  same, contextual chunks off", med["ingest_plain_report"], rate(med["ingest_plain_report"])),
        ("  same, wall time around Pipeline.ingest", med["ingest_wall"], rate(med["ingest_wall"])),
        ("  of which embedding (report.embed_seconds)", med["ingest_embed"], rate(med["ingest_embed"])),
        ("re-ingest, unchanged corpus (report.seconds)", med["reingest_report"], None),
        ("  same, wall time around Pipeline.ingest", med["reingest_wall"], None),
    ]

    print(f"corpus: {samples}  ({len(files)} files, {len(chunks)} chunks, {content_tokens:,} content tokens; "
          f"{full_tokens:,} incl. [CLS]/[SEP])")
    print(f"model: {model_path.name}  threads={threads}  flash_attn(pipeline)={embedder.flash_attn}  "
          f"gpu={embedder.gpu}  pipeline grouping: group_tokens={embedder.group_tokens} "
          f"({'one chunk per decode' if embedder.group_tokens == 0 else 'packed'})")
    print(f"repeats: {repeat}, interleaved in rotation; figures are medians. Token unit: content tokens "
          f"(Chunk.tokens, no [CLS]/[SEP]) in every row.")
    print(f"warm: model loaded before timing (pipeline load {model_load_s:.2f} s, excluded); chromadb "
          f"imported before timing ({chroma_import_s:.2f} s, excluded); each ingest into a fresh temp store.")
    print(f"sanity: token sequences identical to Embedder.sequence: {same_seqs}; min cosine raw vs "
          f"pipeline vectors (first {len(check)} chunks): {agreement:.6f}; ingest tokens == chunked tokens: {tokens_match} "
          f"({ingest_tokens[0]:,} tokens, {ingest_chunks[0]} chunks)")
    print()
    w = max(len(r[0]) for r in rows)
    print(f"{'row':<{w}}  {'seconds':>8}  {'tokens/s':>9}  {'x raw':>6}   all runs (s)")
    keys = ["raw_fa_on", "raw_fa_off", "packed_2048", "pipeline_embed", "ingest_report", "ingest_plain_report",
            "ingest_wall",
            "ingest_embed", "reingest_report", "reingest_wall"]
    for (label, sec, rt), key in zip(rows, keys):
        runs = " ".join(f"{x:.3f}" for x in samples_s[key])
        if rt is None:
            print(f"{label:<{w}}  {sec:>8.3f}  {'-':>9}  {'-':>6}   {runs}")
        else:
            print(f"{label:<{w}}  {sec:>8.3f}  {rt:>9,.0f}  {rt / raw:>6.3f}   {runs}")
    print()

    pipe_ratio = rate(med["pipeline_embed"]) / raw
    # The raw rows embed chunk texts without headers: the same work as an ingest with contextual
    # chunks off. The headers' extra tokens are a deliberate cost, shown by its own ratio.
    ingest_ratio = rate(med["ingest_plain_report"]) / raw
    contextual_ratio = rate(med["ingest_report"]) / rate(med["ingest_plain_report"])
    re_ratio = med["reingest_report"] / med["ingest_report"]
    checks = [
        ("pipeline embedding >= raw one-chunk rate", pipe_ratio >= TOLERANCE,
         f"ratio {pipe_ratio:.3f} (PASS if >= {TOLERANCE}, i.e. 3% noise tolerance)"),
        ("whole ingest >= 80% of raw", ingest_ratio >= INGEST_FRACTION,
         f"ratio {ingest_ratio:.3f} (PASS if >= {INGEST_FRACTION}; contextual chunks off, the raw rows' "
         f"work; report.seconds)"),
        ("re-ingest <= 5% of first ingest", re_ratio <= REINGEST_FRACTION,
         f"ratio {re_ratio:.4f} (PASS if <= {REINGEST_FRACTION}; {med['reingest_report']:.3f} s vs "
         f"{med['ingest_report']:.3f} s; wall {med['reingest_wall'] / med['ingest_wall']:.4f}); "
         f"re-ingest said: {reingest_status[0]}"),
    ]
    print(f"contextual chunks (title + heading path embedded with each chunk): {contextual_ratio:.3f} x the "
          f"content tokens/s of plain chunks (wall-time ratio with them on: {rate(med['ingest_wall']) / raw:.3f} of raw)")
    print("target checks:")
    for name, ok, detail in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {detail}")

    if args.json:
        out = {
            "corpus": str(samples), "files": len(files), "chunks": len(chunks),
            "content_tokens": content_tokens, "full_tokens": full_tokens,
            "token_unit": "content tokens (Chunk.tokens, no [CLS]/[SEP])",
            "model": str(model_path), "threads": threads, "group_tokens": embedder.group_tokens,
            "repeat": repeat, "model_load_seconds": model_load_s, "chromadb_import_seconds": chroma_import_s,
            "seconds": {k: {"median": med[k], "runs": v} for k, v in samples_s.items()},
            "tokens_per_second": {k: rate(med[k]) for k in (
                "raw_fa_on", "raw_fa_off", "packed_2048", "pipeline_embed", "ingest_report",
                "ingest_plain_report", "ingest_wall", "ingest_embed")},
            "ratios": {"pipeline_over_raw": pipe_ratio, "ingest_over_raw": ingest_ratio,
                       "reingest_over_ingest": re_ratio,
                       "contextual_over_plain_ingest": contextual_ratio},
            "checks": {name: ok for name, ok, _ in checks},
            "sanity": {"same_sequences": same_seqs, "min_cosine_raw_vs_pipeline": agreement,
                       "ingest_tokens_match": tokens_match},
        }
        from devtools.bench import document, row

        rates = out["tokens_per_second"]
        rows = [row("files", out["files"]), row("chunks", out["chunks"]),
                row("content_tokens", out["content_tokens"], "tokens")]
        rows += [row(f"tokens_per_second.{k}", v, "tok/s") for k, v in rates.items()]
        rows += [row("ratios.pipeline_over_raw", pipe_ratio, "x", ratio=("tokens_per_second.pipeline_embed",
                                                                          "tokens_per_second.raw_fa_on")),
                 row("ratios.ingest_over_raw", ingest_ratio, "x", ratio=("tokens_per_second.ingest_report",
                                                                          "tokens_per_second.raw_fa_on")),
                 row("ratios.reingest_over_ingest", re_ratio, "x", ratio=("seconds.reingest_report",
                                                                           "seconds.ingest_report"))]
        rows += [row(f"checks.{name}", ok) for name, ok, _ in checks]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document(rows, **out), indent=2))
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
