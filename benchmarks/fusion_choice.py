"""Choosing the fusion rule on the development sets only: every candidate rule scored offline.

Run from the repository root (it ingests the development corpora into the stores
``benchmarks/heldout.py run`` keeps, when that has not been done)::

    .venv/bin/python benchmarks/fusion_choice.py [--json OUT.json] [--top 15]

For each question of each *development* set it gathers once what every rule needs: the dense
side's and the lexical side's 40 candidates with their scores, both scores completed for every
candidate, and the query's word statistics. Each candidate rule then ranks those candidates as the
product does (checked against the product's own fusion and reranker on a sample of rules for every
question, and the default's row reproduces ``rag eval``'s ``adaptive+rerank`` figures), and the rule
is chosen by one criterion fixed before
any rule was scored:

1. the largest *worst margin*: over the development sets, the smallest difference between the
   rule's recall@5 and the better of the two single retrievers (dense alone, lexical alone);
2. then the mean recall@5 over the sets, then the mean MRR.

Two families of rules are compared, and a family is kept only if it wins when it is made to
generalise: leave one development set out, choose the family's best rule on the others by the
criterion, and score it on the set left out (the mean of those margins over the five sets).
A larger family always fits the sets it is chosen on better; this check asks whether it also
does better on a set it did not see.

- ``ramp``: the lexical weight λ is a ramp of the share of the query's idf weight its best BM25 hit
  holds, between ``floor`` and ``full`` (``full`` = 0: plain RRF); reranked or not, with the dense
  side's share of the reranked score.
- ``ramp + dense gap``: the same, with λ also scaled down as the dense side grows sure of its
  ranking: by 1 - ramp(gap; ``gap_low``, ``gap_high``), where the gap is the cosine similarity of
  the dense side's first hit minus that of its fifth.

The held-out sets (gnuplot, asymptote) are not accepted here: a rule chosen with them would make
their figures development figures.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from heldout import QUESTION_SETS, cache_dir, corpus  # noqa: E402
from pipeline import Pipeline  # noqa: E402
from pipeline.retrieval import evaluate as ev  # noqa: E402
from pipeline.retrieval.fusion import dense_doubt, lexical_strength, lexical_weight  # noqa: E402
from pipeline.retrieval.rerank import ScoreRerank, bymax  # noqa: E402
from pipeline.retrieval.search import rrf  # noqa: E402

CANDIDATES = 40
RRF_K = 60


@dataclass(frozen=True)
class Rule:
    floor: float
    full: float                     # 0: λ = 1 always (plain reciprocal-rank fusion)
    rerank: bool
    dense_weight: float
    gap_low: float | None = None    # None: no dense-gap factor
    gap_high: float | None = None
    sure: float = 1.0               # from this idf share up, the dense gap does not scale λ down

    @property
    def family(self) -> str:
        return "ramp" if self.gap_low is None else "ramp + dense gap"

    @property
    def name(self) -> str:
        out = "rrf" if self.full == 0 else f"ramp {self.floor:.2f}-{self.full:.2f}"
        if self.gap_low is not None:
            out += f", dense gap {self.gap_low:.2f}-{self.gap_high:.2f}"
            out += f" below {self.sure:.2f}" if self.sure < 1 else ""
        return out + (f", rerank dense {self.dense_weight:.2f}" if self.rerank else ", no rerank")


def shipped() -> Rule:
    """The rule the default configuration runs."""
    from pipeline.config import load_config

    r = load_config().retrieval
    gap = r.lexical_sure > 0
    return Rule(r.lexical_floor, r.lexical_full, r.rerank == "scores", r.rerank_dense_weight,
                r.dense_gap_floor if gap else None, r.dense_gap_full if gap else None, r.lexical_sure if gap else 1.0)


def rules() -> list[Rule]:
    levels = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0)
    ramps = [(0.0, 0.0), *itertools.combinations(levels, 2)]
    gaps = [(None, None)] + [(lo, hi) for lo in (0.0, 0.02, 0.04, 0.06) for hi in (0.06, 0.08, 0.1, 0.15, 0.2)
                             if hi > lo]
    out = []
    for (floor, full), (lo, hi) in itertools.product(ramps, gaps):
        for sure in ((1.0,) if lo is None else (0.5, 0.7, 1.0)):
            out.append(Rule(floor, full, False, 0.5, lo, hi, sure))
            out += [Rule(floor, full, True, dw, lo, hi, sure) for dw in (0.5, 0.6, 0.7)]
    return out


def gather(rag: Pipeline, store, q: ev.Question) -> dict:
    """Everything a rule needs to rank one question's candidates."""
    vector = rag.embedder.embed_query([q.question])[0] if hasattr(rag.embedder, "embed_query") else \
        rag.embedder.embed([q.question])[0]
    dense = store.dense(vector, limit=CANDIDATES)
    lexical = store.lexical(q.question, limit=CANDIDATES)
    chunks = {c.chunk_id: c for c, _ in dense + lexical}
    ids = list(chunks)
    sims = {c.chunk_id: s for c, s in dense}
    missing = [cid for cid in ids if cid not in sims]
    for cid, v in store.vectors(missing).items():
        sims[cid] = float(v @ vector)
    bm25 = store.catalog.bm25(store.name, q.question, ids)
    strength = 0.0
    if lexical:
        stats, matched = store.catalog.term_stats(store.name, q.question, lexical[0][0].chunk_id)
        strength = lexical_strength(stats, matched)
    found = {cid: ev.targets_found(q, c.source, c.page, c.text) for cid, c in chunks.items()}
    return {"q": q, "chunks": chunks, "found": found, "dense": [c.chunk_id for c, _ in dense],
            "lexical": [c.chunk_id for c, _ in lexical], "sims": sims, "bm25": bm25, "strength": strength}


def rank(data: dict, rule: Rule | None, *, side: str | None = None) -> list[str]:
    """Chunk ids, best first, as the product ranks them under ``rule`` (or one ``side`` alone): the
    product's fusion and reranker written out over the gathered figures, many times faster
    than calling them (:func:`check` compares the two)."""
    if side is not None:
        return data[side]
    lam = weight(data, rule)
    chunks = data["chunks"]
    fused: dict[str, float] = {}
    for name, w in (("dense", 1.0), ("lexical", lam)):
        for r, cid in enumerate(data[name], start=1):
            fused[cid] = fused.get(cid, 0.0) + w / (RRF_K + r)
    order = sorted(fused, key=lambda cid: (-fused[cid], chunks[cid].source, chunks[cid].index))
    if not rule.rerank or len(order) < 2:
        return order
    head, tail = order[:CANDIDATES], order[CANDIDATES:]
    d = bymax([data["sims"].get(cid, 0.0) for cid in head])
    lex = bymax([data["bm25"].get(cid, 0.0) for cid in head])
    w = 1.0 - (1.0 - rule.dense_weight) * lam
    scores = {cid: w * x + (1 - w) * y for cid, x, y in zip(head, d, lex)}
    head = sorted(head, key=lambda cid: (-scores[cid], chunks[cid].source, chunks[cid].index))
    return head + tail


def weight(data: dict, rule: Rule) -> float:
    """The lexical side's weight λ for one question under ``rule``."""
    if not data["lexical"]:
        return 1.0
    lam = 1.0 if rule.full == 0 else lexical_weight(data["strength"], floor=rule.floor, full=rule.full)
    if rule.gap_low is not None and data["strength"] < rule.sure:
        lam *= dense_doubt([data["sims"][cid] for cid in data["dense"]], floor=rule.gap_low, full=rule.gap_high)
    return lam


class _Gathered:
    """What :class:`ScoreRerank` asks of a store, answered from one question's gathered figures: a
    candidate's "vector" is its similarity, so that ``vector @ [1]`` is that similarity."""

    name = "gathered"

    def __init__(self, data: dict):
        self.data = data
        self.catalog = self

    def vectors(self, ids):
        return {cid: np.array([self.data["sims"][cid]], dtype=np.float32) for cid in ids if cid in self.data["sims"]}

    def bm25(self, collection, query, ids):
        return {cid: self.data["bm25"][cid] for cid in ids if cid in self.data["bm25"]}


def product_rank(data: dict, rule: Rule) -> list[str]:
    """The same ranking through the product's own :func:`rrf` and :class:`ScoreRerank`."""
    chunks, sims, bm25 = data["chunks"], data["sims"], data["bm25"]
    lam = weight(data, rule)
    rankings = {"dense": [(chunks[cid], sims[cid]) for cid in data["dense"]],
                "lexical": [(chunks[cid], bm25.get(cid, 0.0)) for cid in data["lexical"]]}
    fused = rrf(rankings, k=RRF_K, weights={"lexical": lam})
    if rule.rerank:
        fused = ScoreRerank(candidates=CANDIDATES, dense_weight=rule.dense_weight)(
            data["q"].question, fused, vector=np.array([1.0], dtype=np.float32), store=_Gathered(data),
            lexical_weight=lam)
    return [c.chunk_id for c, _, _ in fused]


def check(gathered: dict[str, list[dict]], sample: list[Rule]) -> int:
    """Raises when :func:`rank` and the product's functions disagree on any top 10; returns the count compared."""
    n = 0
    for items in gathered.values():
        for data in items:
            for rule in sample:
                ours, theirs = rank(data, rule)[:ev.DEPTH], product_rank(data, rule)[:ev.DEPTH]
                if ours != theirs:
                    raise SystemExit(f"the offline ranking differs from the product's for {data['q'].id} under "
                                     f"{rule.name}: {ours} != {theirs}")
                n += 1
    return n


def metrics(data: dict, ranked: list[str]) -> dict:
    return ev.question_metrics([data["found"][c] for c in ranked[:ev.DEPTH]], len(data["q"].targets))


def score(gathered: dict[str, list[dict]], rule: Rule | None, side: str | None = None) -> dict[str, dict]:
    out = {}
    for name, items in gathered.items():
        ms = [metrics(d, rank(d, rule, side=side)) for d in items]
        out[name] = {"recall@5": statistics.fmean(m["recall@5"] for m in ms),
                     "mrr": statistics.fmean(m["rr"] for m in ms)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--top", type=int, default=15, help="rules to print, best first")
    args = ap.parse_args(argv)
    # The man-page shelf asks the man-page questions again among distractors; it judges section sizes.
    development = [(n, f, label) for n, f, label, dev in QUESTION_SETS if dev and label != "manshelf"]
    gathered: dict[str, list[dict]] = {}
    opened: dict[str, Pipeline] = {}
    try:
        for name, qfile, label in development:
            if label not in opened:
                path = cache_dir() / "stores" / label
                opened[label] = Pipeline.from_config(overrides={"store.path": str(path)})
                opened[label].ingest(corpus(label))  # incremental: nothing to do once heldout.py built it
            rag = opened[label]
            with rag.store(create=False) as store:
                unreachable = {u["id"] for u in ev.unreachable(ev.load_questions(qfile), store)}
                gathered[name] = [gather(rag, store, q) for q in ev.load_questions(qfile) if q.id not in unreachable]
            print(f"{name}: {len(gathered[name])} questions gathered", file=sys.stderr)
    finally:
        for rag in opened.values():
            rag.close()
    singles = {side: score(gathered, None, side) for side in ("dense", "lexical")}
    best_single = {n: max(singles["dense"][n]["recall@5"], singles["lexical"][n]["recall@5"]) for n in gathered}
    names = list(gathered)
    every = rules()
    sample = [shipped(), *random.Random(0).sample(every, 24)]
    print(f"{check(gathered, sample):,} rankings compared with the product's fusion and reranker: all equal",
          file=sys.stderr)
    scored = [(rule, score(gathered, rule)) for rule in every]

    def best(candidates, sets):
        return max(candidates, key=lambda rs: (min(rs[1][n]["recall@5"] - best_single[n] for n in sets),
                                                statistics.fmean(rs[1][n]["recall@5"] for n in sets),
                                                statistics.fmean(rs[1][n]["mrr"] for n in sets), rs[0].name))

    families = {}
    for family in ("ramp", "ramp + dense gap"):
        members = [rs for rs in scored if rs[0].family == family]
        left_out = {n: best(members, [m for m in names if m != n]) for n in names}
        margins = {n: rs[1][n]["recall@5"] - best_single[n] for n, rs in left_out.items()}
        families[family] = {"rules": len(members), "chosen": best(members, names)[0].name,
                            "left_out_margins": {n: round(m, 4) for n, m in margins.items()},
                            "left_out_mean": round(statistics.fmean(margins.values()), 4),
                            "left_out_worst": round(min(margins.values()), 4),
                            "left_out_choices": {n: rs[0].name for n, rs in left_out.items()}}
    kept = max(families, key=lambda f: (families[f]["left_out_mean"], families[f]["left_out_worst"], f == "ramp"))
    default, rows = shipped(), []
    for rule, s in scored:
        margin = min(s[n]["recall@5"] - best_single[n] for n in names)
        rows.append({"rule": rule.name, "family": rule.family, "shipped": rule == default,
                     "worst_margin": round(margin, 4),
                     "mean_recall@5": round(statistics.fmean(v["recall@5"] for v in s.values()), 4),
                     "mean_mrr": round(statistics.fmean(v["mrr"] for v in s.values()), 4),
                     "sets": {n: {k: round(v, 4) for k, v in m.items()} for n, m in s.items()},
                     "params": rule.__dict__})
    rows.sort(key=lambda r: (-r["worst_margin"], -r["mean_recall@5"], -r["mean_mrr"], r["rule"]))
    print("| rule | worst margin | mean recall@5 | mean MRR | " + " | ".join(names) + " |")
    print("| " + " | ".join("---" for _ in range(4 + len(names))) + " |")
    for label, side in (("dense only", "dense"), ("lexical only", "lexical")):
        print(f"| {label} | - | {statistics.fmean(v['recall@5'] for v in singles[side].values()):.3f} | "
              f"{statistics.fmean(v['mrr'] for v in singles[side].values()):.3f} | "
              + " | ".join(f"{singles[side][n]['recall@5']:.3f}" for n in names) + " |")
    chosen = {families[f]["chosen"] for f in families}
    shown = rows[:args.top] + [r for r in rows[args.top:] if r["shipped"] or r["rule"] in chosen]
    for r in shown:
        mark = " (the default)" if r["shipped"] else ""
        print(f"| {r['rule']}{mark} | {r['worst_margin']:+.3f} | {r['mean_recall@5']:.3f} | {r['mean_mrr']:.3f} | "
              + " | ".join(f"{r['sets'][n]['recall@5']:.3f}" for n in names) + " |")
    print()
    print("| family | rules | best on all five | recall@5 margin on the set left out: " + " | ".join(names)
          + " | mean | worst |")
    print("| " + " | ".join("---" for _ in range(5 + len(names))) + " |")
    for f, d in families.items():
        print(f"| {f} | {d['rules']} | {d['chosen']} | " + " | ".join(f"{d['left_out_margins'][n]:+.3f}" for n in names)
              + f" | {d['left_out_mean']:+.3f} | {d['left_out_worst']:+.3f} |")
    print(f"on the development sets: family {kept}, rule {families[kept]['chosen']}")
    if args.json:
        from devtools.bench import document, row

        best_rule = families[kept]["chosen"]
        declared = [row(f"{f} left-out margin (mean)", d["left_out_mean"], "", family=f) for f, d in families.items()]
        for r in rows:
            if r["shipped"] or r["rule"] == best_rule:
                who = "default" if r["shipped"] else "development choice"
                declared.append(row(f"{who} worst margin", r["worst_margin"], "", rule=r["rule"]))
                declared += [row(f"{who} {n} recall@5", v["recall@5"], "", rule=r["rule"], set=n)
                             for n, v in r["sets"].items()]
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document(declared, singles=singles, families=families, kept=kept, rules=rows),
                                        indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
