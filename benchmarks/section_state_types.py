"""Section states kept as q8_0 against f16: quality (KL, top-1), bytes per token, prefill and restore speed.

For each question of the development man pages (``benchmarks/eval/manpages/``, their questions in
``benchmarks/eval/manpages.jsonl``): a sections-mode prompt ``[head][S1][S2][S3][question]`` as
``rag ask`` lays it out (the section holding the answer's evidence and two others drawn at random,
in document order), and the first 32 answer tokens of exact f16 prefill's greedy answer, teacher-forced.
Every row is compared with exact prefill on an f16 KV cache (the reference):

  exact, q8_0 KV cache        exact prefill with ``engine.type_k = type_v = "q8_0"``
  composed, f16 states        an f16 engine composing from states saved as computed (the default seams)
  composed, q8_0 states       the same engine, states kept as q8_0 on disk (``cache.section_type = "q8_0"``)
  composed, q8_0 KV cache     an engine running a q8_0 KV cache, composing from its own states (so the
                              K-shift runs on q8_0 keys)
  composed, f16 states,       the f16 composition again on an engine with another thread count (1, or 2
    other threads             where --threads is 1): the same computation in another order of arithmetic,
                              what a measurement moves by from one machine to the next (the noise)

States are saved and restored through the prefix cache (files, checksums), as the product does; bytes
per token are the files' sizes over the sections' tokens. Prefill speed is exact prefill of the
documents part on each engine, alternating which runs first; save is the time to write a computed
state (checksum and the f16 -> q8_0 conversion included), restore the composing step's restore time
(checks and the q8_0 -> f16 conversion included), each per 1K tokens.

What "within noise" is judged by: the paired difference of KL (q8_0 states minus f16 states, prompt by
prompt) with its 95 % interval; the 95 % interval of each row's mean KL over the prompts (the noise of
the figure a decision rests on); and the thread-count row (what the same computation moves by in
another order of arithmetic).

    .venv/bin/python benchmarks/section_state_types.py [--models smollm2,gemma3] [--manuals bash,jq,tmux,valgrind,wget]
        [--questions 2] [--ctx 4096] [--threads N] [--json OUT] [--quick]
    .venv/bin/python benchmarks/section_state_types.py --report OUT   # the tables of an earlier --json run
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import compose_quality as cq  # noqa: E402
from pipeline.config.settings import AskConfig  # noqa: E402
from pipeline.engine.cache.sections import SectionStates  # noqa: E402
from pipeline.engine.cache.prefix_cache import PrefixCache  # noqa: E402
from pipeline.engine.reuse.calibrate import compare  # noqa: E402
from pipeline.engine.reuse.compose import Seams, compose, compute  # noqa: E402

MANPAGES = ROOT / "benchmarks/eval/manpages"
LINES_PER_PAGE = 60
SEAMS = Seams(AskConfig.compose_seams, AskConfig.compose_recompute)
ROWS = ("exact, q8_0 KV cache", "composed, f16 states", "composed, q8_0 states", "composed, q8_0 KV cache",
        "composed, f16 states, other threads")


def manual(name: str, questions: int) -> cq.Doc:
    """A man page as pages of 60 lines, and its first ``questions`` development questions."""
    lines = (MANPAGES / f"{name}.txt").read_text().splitlines()
    pages = [(i // LINES_PER_PAGE + 1, "\n".join(lines[i:i + LINES_PER_PAGE]))
             for i in range(0, len(lines), LINES_PER_PAGE)]
    qs = [q for q in map(json.loads, (ROOT / "benchmarks/eval/manpages.jsonl").read_text().splitlines())
          if q["source"] == f"{name}.txt"]
    return cq.Doc(f"{name}.txt", pages, qs[:questions])


def _norm(text: str) -> str:
    return re.sub(r"\W+", " ", text).lower().strip()


def pick(texts: list[str], q: dict, k: int, rng: random.Random) -> list[int]:
    """The section holding the question's evidence (else the first) and ``k - 1`` others, in order."""
    want = _norm(q["evidence"])
    best = next((i for i, t in enumerate(texts) if want in _norm(t)), 0)
    others = rng.sample([i for i in range(len(texts)) if i != best], min(k - 1, len(texts) - 1))
    return sorted([best] + others)


class Both:
    """Section states saved into two stores at once (f16 and q8_0): one computation for both; the
    seconds each save took (writing, checksum, the q8_0 conversion), per store."""

    def __init__(self, *stores: SectionStates):
        self.stores = stores
        self.seconds = [0.0] * len(stores)

    def store(self, piece, model, seq, start):
        for i, s in enumerate(self.stores):
            t0 = time.perf_counter()
            s.store(piece, model, seq, start)
            self.seconds[i] += time.perf_counter() - t0


def warm(run: cq.Runner, head, pieces, states) -> None:
    """Compute and save the state of each piece that has none yet."""
    m = run.model
    first = states.stores[0] if isinstance(states, Both) else states
    todo = [p for p in pieces if first.find(p) is None]
    if not todo:
        return
    m.clear()
    run.decode(head, 0)
    for p in todo:
        compute(m, len(head), p, states, 1)
        cq.mem.seq_remove(m, 1)


def composed(run: cq.Runner, head, pieces, suffix, answer, end, states: SectionStates) -> tuple[np.ndarray, dict]:
    m = run.model
    m.clear()
    run.decode(head, 0)
    t0 = time.perf_counter()
    done = compose(m, head, pieces, states, SEAMS)
    m.synchronize()
    seconds = time.perf_counter() - t0
    rows = run.forced(suffix, answer, end)
    return rows, {"restore_s": done.seconds["restore"], "restored_tokens": done.restored_tokens,
                  "compose_s": seconds, "computed": done.computed}


def one_prompt(f16: cq.Runner, q8: cq.Runner, other: cq.Runner, layout, pieces, question: str, stores: dict,
               order: int) -> dict:
    m = f16.model
    head = list(layout.head_tokens)
    suffix = layout.suffix(f"Question: {question}", lambda t, special=False: m.tokenize(t, special=special))
    end = len(head) + sum(len(p) for p in pieces)
    docs = end - len(head)
    times = {}
    for name, run in ((("f16", f16), ("q8_0", q8)) if order % 2 == 0 else (("q8_0", q8), ("f16", f16))):
        times[name] = run.exact(head, pieces)
    ref = f16.greedy(suffix, end)  # each engine's memory still holds the documents part
    ref_rows = f16.forced(suffix, ref, end)
    out = {"tokens": end + len(suffix), "prefill_tok_s": {k: docs / v for k, v in times.items()},
           "rows": {ROWS[0]: _score(ref_rows, q8.forced(suffix, ref, end))}}
    saving = Both(stores["f16"], stores["q8_0"])
    new = sum(len(p) for p in pieces if stores["f16"].find(p) is None)
    warm(f16, head, pieces, saving)
    warm(q8, head, pieces, stores["q8_0 KV"])
    out["saved_tokens"], out["save_s"] = new, dict(zip(("f16", "q8_0"), saving.seconds))
    for row, run, key in ((ROWS[1], f16, "f16"), (ROWS[2], f16, "q8_0"), (ROWS[3], q8, "q8_0 KV"),
                          (ROWS[4], other, "f16")):
        rows, extra = composed(run, head, pieces, suffix, ref, end, stores[key])
        out["rows"][row] = {**_score(ref_rows, rows), **extra}
    return out


def _score(ref_rows: np.ndarray, rows: np.ndarray) -> dict:
    got = compare(list(ref_rows), rows)
    return {"kl": got.kl, "top1": got.top1}


# --------------------------------------------------------------------------- the table

_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 30: 2.04}


def interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and its 95 % interval (Student's t)."""
    mean = statistics.mean(xs)
    if len(xs) < 2:
        return mean, float("-inf"), float("inf")
    df = len(xs) - 1
    t = _T95[max(k for k in _T95 if k <= df)] if df < 30 else 1.96
    half = t * statistics.stdev(xs) / math.sqrt(len(xs))
    return mean, mean - half, mean + half


def table(name: str, results: list[dict], sizes: dict[str, float]) -> dict:
    n = len(results)
    f16_speed = statistics.median(r["prefill_tok_s"]["f16"] for r in results)
    q8_speed = statistics.median(r["prefill_tok_s"]["q8_0"] for r in results)
    print(f"\n{name}: {n} prompts of {statistics.mean(r['tokens'] for r in results):,.0f} tokens, against exact "
          f"prefill on an f16 KV cache")
    saved = sum(r["saved_tokens"] for r in results)
    save = {k: 1000 * sum(r["save_s"][k] for r in results) / max(1, saved) for k in ("f16", "q8_0")}
    print("| prefill | mean KL (nats), 95 % interval | top-1 agreement | bytes per token (states) | prefill tok/s | "
          "save s per 1K tokens | restore s per 1K tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| exact, f16 KV cache | 0 | 100% | | {f16_speed:,.0f} | | |")
    summary = {"prompts": n, "prefill_tok_s": {"f16": f16_speed, "q8_0": q8_speed}, "bytes_per_token": sizes, "rows": {}}
    for row in ROWS:
        rs = [r["rows"][row] for r in results if row in r["rows"]]
        if not rs:
            continue
        kl, klo, khi = interval([x["kl"] for x in rs])
        top1 = statistics.mean(x["top1"] for x in rs)
        restored = sum(x.get("restored_tokens", 0) for x in rs)
        restore = (1000 * sum(x.get("restore_s", 0.0) for x in rs) / restored) if restored else None
        size = {ROWS[1]: sizes["f16"], ROWS[2]: sizes["q8_0"], ROWS[3]: sizes["q8_0 KV"], ROWS[4]: sizes["f16"]}.get(row)
        speed = "" if row == ROWS[4] else f"{q8_speed if 'q8_0 KV' in row else f16_speed:,.0f}"
        saving = {ROWS[1]: save["f16"], ROWS[2]: save["q8_0"]}.get(row)
        print(f"| {row} | {kl:.4f} ({klo:.4f} to {khi:.4f}) | {top1:.1%} | {'' if size is None else f'{size:,.0f}'} | "
              f"{speed} | {'' if saving is None else f'{saving:.3f}'} | {'' if restore is None else f'{restore:.3f}'} |")
        summary["rows"][row] = {"kl": kl, "kl_interval": (klo, khi), "top1": top1, "restore_s_per_1k": restore,
                                "save_s_per_1k": saving}
    f16, q8 = summary["rows"][ROWS[1]], summary["rows"][ROWS[2]]
    mean, lo, hi = interval([r["rows"][ROWS[2]]["kl"] - r["rows"][ROWS[1]]["kl"] for r in results])
    print(f"KL of q8_0 states minus f16 states, paired over the prompts: {mean:+.4f} (95 % interval {lo:+.4f} to "
          f"{hi:+.4f}), {mean / f16['kl']:+.1%} of composing from f16 states")
    within = f16["kl_interval"][0] <= q8["kl"] <= f16["kl_interval"][1]
    print(f"composing from q8_0 states ({q8['kl']:.4f}) is {'within' if within else 'NOT within'} the 95 % interval "
          f"of composing from f16 states over these prompts ({f16['kl_interval'][0]:.4f} to {f16['kl_interval'][1]:.4f})")
    noise = None
    if all(ROWS[4] in r["rows"] for r in results):
        noise = statistics.mean(abs(r["rows"][ROWS[4]]["kl"] - r["rows"][ROWS[1]]["kl"]) for r in results)
        print(f"the thread count alone moves the f16 composition's KL by {noise:.5f} on average (mean |difference|)")
    m2, lo2, hi2 = interval([r["rows"][ROWS[3]]["kl"] - r["rows"][ROWS[1]]["kl"] for r in results])
    print(f"KL of a q8_0 KV cache's composition minus f16 states: {m2:+.4f} (95 % interval {lo2:+.4f} to {hi2:+.4f});"
          f" exact prefill on a q8_0 KV cache: {summary['rows'][ROWS[0]]['kl']:.4f}")
    print(f"prefill on a q8_0 KV cache runs at {q8_speed / f16_speed:.2f}x the f16 cache's speed (median per prompt)")
    summary.update(kl_diff=(mean, lo, hi), kl_diff_kv=(m2, lo2, hi2), thread_noise=noise, within_interval=within)
    return summary


def sizes_of(stores: dict[str, SectionStates]) -> dict[str, float]:
    out = {}
    for key, st in stores.items():
        entries = st.cache.entries(st.namespace)
        out[key] = sum(e.bytes for e in entries) / max(1, sum(e.n_tokens for e in entries))
    return out


def run_model(mname: str, args, docs: list[cq.Doc]) -> dict:
    from pipeline.config import resolve_home
    from pipeline.models import resolve

    path = resolve(cq.MODELS[mname], home=resolve_home(), fetch=True)
    room = 2 * args.ctx + 512
    f16 = cq.Runner(path, ctx=room, threads=args.threads)
    q8 = cq.Runner(path, ctx=room, threads=args.threads, kv="q8_0")
    other = cq.Runner(path, ctx=room, threads=1 if args.threads != 1 else 2)
    layout = cq.layout_for(f16, path)
    results = []
    with tempfile.TemporaryDirectory(prefix="rag-state-types-") as tmp:
        caches = {key: PrefixCache(Path(tmp) / key.replace(" ", "-"), max_bytes=1 << 40,
                                   section_type="q8_0" if key == "q8_0" else "f16")
                  for key in ("f16", "q8_0", "q8_0 KV")}
        head = list(layout.head_tokens)
        stores = {key: SectionStates(c, f"bench {key}", head) for key, c in caches.items()}
        rng = random.Random(args.seed)
        for doc in docs:
            secs = cq.sections(doc, f16.model, args.ctx // 4)
            for q in doc.questions:
                t0 = time.perf_counter()
                pieces = [secs[i][0] for i in pick([t for *_, t in secs], q, args.sections, rng)]
                r = one_prompt(f16, q8, other, layout, pieces, q["question"], stores, len(results))
                r.update(manual=doc.label, question=q["id"])
                results.append(r)
                print(f"  {mname} {doc.label:13} {r['tokens']:>5} tok {time.perf_counter() - t0:5.0f} s  "
                      + "  ".join(f"{k}: {v['kl']:.4f}" for k, v in r["rows"].items())
                      + f"  prefill f16 {r['prefill_tok_s']['f16']:.0f} q8_0 {r['prefill_tok_s']['q8_0']:.0f} tok/s",
                      flush=True)
        sizes = sizes_of(stores)
        for st in stores.values():
            st.close()
        for c in caches.values():
            c.close()
    for run in (f16, q8, other):
        run.model.close()
    return {**table(mname, results, sizes), "per_prompt": results}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--manuals", default="bash,jq,tmux,valgrind,wget", help="development man pages")
    ap.add_argument("--questions", type=int, default=2, help="questions per manual")
    ap.add_argument("--ctx", type=int, default=4096, help="sections are a quarter of it")
    ap.add_argument("--sections", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=47)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="a smoke run: SmolLM2, one question of wget, a 2K context")
    ap.add_argument("--report", type=Path, metavar="JSON", help="print the tables of an earlier run's --json and exit")
    args = ap.parse_args(argv)
    if args.report:
        data = json.loads(args.report.read_text())
        for mname, mr in data["models"].items():
            table(mname, mr["per_prompt"], mr["bytes_per_token"])
        return 0
    if args.quick:
        args.models, args.manuals, args.questions, args.ctx = "smollm2", "wget", 1, 2048
    from pipeline.engine.host import usable_cpus

    args.threads = args.threads or usable_cpus()
    docs = [manual(name, args.questions) for name in args.manuals.split(",")]
    report = {"ctx": args.ctx, "sections": args.sections, "threads": args.threads, "models": {}}
    for mname in args.models.split(","):
        report["models"][mname] = run_model(mname, args, docs)
    if args.json:
        from devtools.bench import document, row

        rows = []
        for mname, mr in report["models"].items():
            for name, r in mr["rows"].items():
                key = f"{mname} {name}"
                rows += [row(f"{key} KL", r["kl"], "nats", series=mname), row(f"{key} top-1", r["top1"], "fraction",
                                                                                 series=mname)]
            rows += [row(f"{mname} state bytes per token {k}", v, "bytes", series=mname)
                     for k, v in mr["bytes_per_token"].items()]
            rows += [row(f"{mname} prefill {k} KV", v, "tok/s", series=mname) for k, v in mr["prefill_tok_s"].items()]
        args.json.write_text(json.dumps(document(rows, **report), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
