"""Quality of prompts composed from section states, against exact prefill of the same prompt.

For each question: a sections-mode prompt ``[head][S1]..[Sk][question]`` as the product
lays it out (the chat template, the system prompt, sections rendered with their headers
and page marks, in canonical order; the answer's section and k-1 others drawn at random),
prefilled exactly, and the same prompt composed from section states computed on their own
(:mod:`pipeline.engine.reuse.compose`) with each way of choosing the tokens recomputed at the seams:

  none                  nothing recomputed
  first r               the first r tokens of each moved section (EPIC's choice)
  last r                the last r x (moved sections) tokens before the question
  headers               each moved section's header line and page marks
  focus r               the r tokens of each moved section nearest to where the question's keyword
                        occurs in it (what retrieval's hits point at), nearest first
  deviation r           the r tokens of each moved section whose keys and values deviate most
                        from exact prefill's (CacheBlend's criterion, measured on this very
                        prompt: an oracle, the best a per-token choice of that size can do)
  whole                 every token of every moved section (exact: checks the plumbing)

Measured over the first 32 answer tokens, teacher-forced with exact prefill's greedy
answer: top-1 agreement of the next-token distribution, mean KL(exact || composed) in nats,
and whether the greedy answer (32 tokens) is identical. Recompute cost is in tokens and in
seconds of compose (restore, shift, recompute) against exact prefill of the documents part.

    .venv/bin/python benchmarks/compose_quality.py [--models smollm2,gemma3]
        [--corpora manual,dev] [--questions 4] [--ctx 8192] [--threads N] [--json OUT] [--quick]
        [--configs 'first 32,none'] [--no-reference]
    .venv/bin/python benchmarks/compose_quality.py --report A.json [B.json]   # the tables of earlier --json runs

``--corpora gnuplot,asymptote`` are the held-out manuals: a report on them is a held-out figure only
if no setting was chosen on them. Right answers are counted where a corpus knows the value asked for
(the generated manual, the development set), with a Wilson 95 % interval and pair
by pair against exact prefill.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import _corpora  # noqa: E402
from pipeline.ask.prompt import Layout, render_section  # noqa: E402
from pipeline.config.settings import AskConfig  # noqa: E402
from pipeline.engine import _llama  # noqa: E402
from pipeline.engine._llama import composing as mem  # noqa: E402
from pipeline.engine._llama import state_format as kv_state  # noqa: E402
from pipeline.engine.reuse.compose import Piece, Seams, StatesInMemory, compose  # noqa: E402
from pipeline.records import Section  # noqa: E402

MODELS = {"smollm2": "builtin:SmolLM2-135M-Instruct", "gemma3": "builtin:gemma-3-270m"}
ANSWER = 32
REFERENCE = "exact, q8_0 KV (scale)"
RS = (8, 32, 128)
SYSTEM = ("You answer questions using only the numbered documents provided. Cite the documents you "
          "use as [1] or, with a page, as [1, p. 3]. If the documents do not contain the answer, say so.")
VERBOSE = False
_PAGE_MARK = re.compile(r"\[\d+, p\. \d+\] ")


def configs() -> list[tuple[str, Seams | int]]:
    """(name, seams or the r of the deviation oracle) in table order."""
    out: list[tuple[str, Seams | int]] = [("none", Seams("none", 0))]
    out += [(f"first {r}", Seams("first", r)) for r in RS + (512,)]
    out += [(f"last {r}", Seams("last", r)) for r in RS + (512,)]
    out += [("headers", Seams("headers", 0))]
    out += [(f"focus {r}", Seams("focus", r)) for r in RS]
    out += [(f"deviation {r}", r) for r in RS]
    out += [("whole", Seams("whole", 0))]
    return [(name, how) for name, how in out if ONLY is None or name in ONLY or name == "none"]


DEFAULT_SEAMS = f"{AskConfig.compose_seams} {AskConfig.compose_recompute}"  # the defaults' row of configs()
BUDGET = AskConfig.compose_max_kl
CALIBRATION_PROMPTS = 3  # what the product's calibration measures at least (pipeline/warm/calibration.py)
ONLY: set[str] | None = None  # --configs: the rows to run ("none" always runs: the deviation oracle reads it)


# --------------------------------------------------------------------------- prompts


@dataclass
class Doc:
    label: str
    pages: list[tuple[int, str]]
    questions: list


def corpus(name: str, *, questions: int = 12) -> Doc:
    """``manual`` (generated, ``questions`` of its values asked) and ``dev`` (the development set's
    documents and its questions with a known answer) are development corpora; ``gnuplot`` and
    ``asymptote`` are held out: run them only to report, never to choose a setting."""
    if name == "manual":
        pages, qs = _corpora.manual_pages(questions=questions)
        return Doc("xr9-field-manual.pdf", pages, qs)
    if name == "dev":
        pages, qs = _corpora.devset_shelf(questions)
        return Doc("development-shelf", pages, qs)
    package, questions = {"gnuplot": ("gnuplot-doc", _corpora.GNUPLOT),
                          "asymptote": ("asymptote-doc", _corpora.ASYMPTOTE)}[name]
    pdf = _corpora.debian_pdf(package)
    return Doc(pdf.name, _corpora.pdf_pages(pdf), questions)


def cut_pages(counts: list[int], target: int) -> list[tuple[int, int]]:
    """Balanced runs [a, b) of pages of about ``target`` tokens each, cut where a page begins."""
    total = sum(counts)
    n = max(1, math.ceil(total / target))
    prefix = np.cumsum([0] + counts)
    starts = [0]
    for k in range(1, n):
        cut = int(np.argmin(np.abs(prefix - total * k / n)))
        if cut > starts[-1] and cut < len(counts):
            starts.append(cut)
    return list(zip(starts, starts[1:] + [len(counts)]))


def sections(doc: Doc, model, target: int) -> list[tuple[Piece, str, np.ndarray]]:
    """The document's sections of about ``target`` tokens, rendered as the product renders them."""
    counts = [len(model.tokenize(t)) for _, t in doc.pages]
    runs = cut_pages(counts, target)
    out = []
    for i, (a, b) in enumerate(runs):
        pages = doc.pages[a:b]
        s = Section(doc.label, "h", i, a, b - 1, pages[0][0], pages[-1][0], sum(counts[a:b]), target)
        text = render_section(1, s, of=len(runs), segments=pages)
        out.append((*_piece(model, text), text))
    return out


def _spans(text: str, rx: re.Pattern) -> list[tuple[int, int]]:
    """Byte spans of ``rx``'s matches in ``text``."""
    return [(len(text[:m.start()].encode()), len(text[:m.end()].encode())) for m in rx.finditer(text)]


def _overlapping(starts: np.ndarray, spans: list[tuple[int, int]]) -> list[int]:
    """Offsets of the tokens (beginning at byte ``starts``) that overlap any of ``spans``."""
    ends = np.append(starts[1:], 1 << 62)
    return [i for i in range(len(starts)) if any(a < ends[i] and starts[i] < b for a, b in spans)]


def _piece(model, text: str) -> tuple[Piece, np.ndarray]:
    """The section's tokens, which of them overlap its header line or a page mark, and where each begins."""
    tokens = model.tokenize(text)
    starts = np.cumsum([0] + [len(model.piece(t)) for t in tokens])[:-1]
    spans = [(0, len(text[:text.index("\n") + 1].encode()))] + _spans(text, _PAGE_MARK)
    return Piece(tuple(tokens), tuple(_overlapping(starts, spans))), starts


def with_focus(piece: Piece, text: str, starts: np.ndarray, keyword: str) -> Piece:
    """``piece`` with its tokens ordered by their distance to the nearest occurrence of ``keyword``."""
    hits = _overlapping(starts, _spans(text, re.compile(rf"\b{re.escape(keyword)}\b", re.I)))
    if not hits:
        return piece
    at = np.array(hits)
    distance = np.abs(np.arange(len(piece))[:, None] - at[None, :]).min(axis=1)
    return dataclasses.replace(piece, focus=tuple(int(i) for i in np.argsort(distance, kind="stable")))


def samples(doc: Doc, texts: list[str], *, k: int, n: int, seed: int) -> list[tuple[object, list[int]]]:
    """(question, section indexes in canonical order) for the first ``n`` questions: the section
    where the question's keyword occurs most, and k-1 others drawn at random."""
    rng = random.Random(seed)
    out = []
    for q in doc.questions[:n]:
        rx = re.compile(rf"\b{re.escape(q.keyword)}\b", re.I)
        best = int(np.argmax([len(rx.findall(t)) for t in texts]))
        others = rng.sample([i for i in range(len(texts)) if i != best], min(k - 1, len(texts) - 1))
        out.append((q, sorted([best] + others)))
    return out


# --------------------------------------------------------------------------- running one prompt


class Runner:
    def __init__(self, path: Path, *, ctx: int, threads: int, kv: str = "f16"):
        self.model = _llama.load(path, n_ctx=ctx, n_batch=2048, n_ubatch=512, threads=threads, flash_attn=True,
                                 n_seq_max=3, swa_full=True, type_k=kv, type_v=kv)

    def decode(self, tokens, pos: int, seq: int = 0) -> None:
        step = self.model.n_batch
        for lo in range(0, len(tokens), step):
            mem.decode_outputs(self.model, np.asarray(tokens[lo:lo + step], np.int32), pos + lo, seq=seq)

    def exact(self, head, pieces) -> float:
        m = self.model
        m.clear()
        t0 = time.perf_counter()
        self.decode(head, 0)
        pos = len(head)
        for p in pieces:
            self.decode(p.tokens, pos)
            pos += len(p)
        m.synchronize()
        return time.perf_counter() - t0

    def greedy(self, suffix, end: int, n: int = ANSWER) -> list[int]:
        m = self.model
        self.decode(suffix, end)
        out, pos = [], end + len(suffix)
        for _ in range(n):
            t = int(mem.output_logits(m, 1)[0].argmax())
            out.append(t)
            mem.decode_outputs(m, [t], pos)
            pos += 1
        mem.seq_remove(m, 0, end)
        return out

    def forced(self, suffix, answer, end: int) -> np.ndarray:
        toks = list(suffix) + list(answer[:-1])
        mem.decode_outputs(self.model, np.asarray(toks, np.int32), end, every=True)
        rows = mem.output_logits(self.model, len(toks))[len(suffix) - 1:]
        mem.seq_remove(self.model, 0, end)
        return rows

    def states(self, head, pieces, st: MemoryStates) -> MemoryStates:
        """Compute the states of ``pieces`` on their own, into ``st``."""
        m = self.model
        for p in pieces:
            m.clear()
            self.decode(head, 0)
            compose(m, head, [p], st, Seams("none", 0))
        return st


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def score(ref_rows, ref_answer, rows, answer, *, found=None) -> dict:
    """Agreement of ``rows`` (and the greedy ``answer``) with exact prefill's; ``found(tokens)`` says
    whether an answer holds the known right value (where one is known)."""
    lp_ref, lp = _log_softmax(ref_rows), _log_softmax(rows)
    kl = float((np.exp(lp_ref) * (lp_ref - lp)).sum(axis=-1).mean())
    top1 = float(np.mean(rows.argmax(axis=-1) == np.asarray(ref_answer)))
    same = next((i for i, (a, b) in enumerate(zip(answer, ref_answer)) if a != b), len(ref_answer))
    out = {"top1": top1, "kl": kl, "greedy_same": answer == ref_answer, "greedy_prefix": same}
    if found is not None:
        out["correct"] = found(answer)
    return out


def deviation_positions(dev: dict[int, float], places, r: int) -> list[int]:
    out = []
    for start, piece in places:
        span = [(dev.get(p, 0.0), p) for p in range(start, start + len(piece))]
        out += [p for _, p in sorted(span, reverse=True)[:r]]
    return sorted(out)


def profile(dev: dict[int, float], places) -> dict:
    """Mean deviation by offset within the moved sections, and of header tokens against the rest."""
    buckets = {"0-7": (0, 8), "8-31": (8, 32), "32-127": (32, 128), "128-511": (128, 512), "512+": (512, 10**9)}
    out: dict[str, list[float]] = {k: [] for k in buckets}
    out["headers"], out["body"], out["last 32"] = [], [], []
    for start, piece in places:
        heads = set(piece.headers)
        for i in range(len(piece)):
            d = dev.get(start + i)
            if d is None:
                continue
            for name, (a, b) in buckets.items():
                if a <= i < b:
                    out[name].append(d)
            out["headers" if i in heads else "body"].append(d)
            if i >= len(piece) - 32:
                out["last 32"].append(d)
    return {k: float(np.mean(v)) if v else None for k, v in out.items()}


def run_prompt(run: Runner, layout: Layout, pieces: list[Piece], question: str, states: MemoryStates, *,
               whole: bool = True, reference: Runner | None = None, expected: str = "") -> dict:
    """Every configuration on one prompt; ``whole`` False leaves out the exact recompute (a full prefill).
    ``reference`` (a q8_0 KV cache) gives the scale: exact prefill with an approximation users accept.
    ``expected``: a string the right answer holds, where one is known."""
    m = run.model
    head = list(layout.head_tokens)
    suffix = layout.suffix(f"Question: {question}", lambda t, special=False: m.tokenize(t, special=special))
    end = len(head) + sum(len(p) for p in pieces)
    exact_s = run.exact(head, pieces)
    t0 = time.perf_counter()
    ref = run.greedy(suffix, end)
    t1 = time.perf_counter()
    ref_rows = run.forced(suffix, ref, end)
    exact_state = mem.state_bytes(m, 0)
    t2 = time.perf_counter()
    run.states(head, [p for p in pieces if p.tokens not in states.data], states)
    if VERBOSE:
        print(f"    exact {exact_s:.1f} s, greedy {t1 - t0:.1f} s, forced {t2 - t1:.1f} s, "
              f"states {time.perf_counter() - t2:.1f} s", file=sys.stderr, flush=True)
    places, pos = [], len(head)
    for p in pieces:
        if pos != len(head):
            places.append((pos, p))
        pos += len(p)
    dev = None
    found = (lambda toks: expected in m.detokenize(toks).decode("utf-8", "replace")) if expected else None
    result = {"tokens": end + len(suffix), "sections": [len(p) for p in pieces], "exact_s": exact_s,
              "self_top1": float(np.mean(ref_rows.argmax(-1) == np.asarray(ref))), "configs": {}}
    if found is not None:
        result["exact_correct"] = found(ref)
    if reference is not None:
        reference.exact(head, pieces)
        rows = reference.forced(suffix, ref, end)
        result["configs"][REFERENCE] = {**score(ref_rows, ref, rows, reference.greedy(suffix, end), found=found),
                                        "recomputed": 0, "seconds": 0.0, "runs": 0}
    for name, how in configs():
        if name == "whole" and not whole:
            continue
        m.clear()
        run.decode(head, 0)
        t0 = time.perf_counter()
        if isinstance(how, int):
            done = compose(m, head, pieces, states, Seams("none", 0), positions=deviation_positions(dev, places, how))
        else:
            done = compose(m, head, pieces, states, how)
        m.synchronize()
        seconds = time.perf_counter() - t0
        rows = run.forced(suffix, ref, end)
        if dev is None:  # read after a decode: llama.cpp re-rotates shifted keys only when it next decodes
            dev = kv_state.deviation(exact_state, mem.state_bytes(m, 0))
            result["profile"] = profile(dev, places)
        answer = run.greedy(suffix, end)
        result["configs"][name] = {**score(ref_rows, ref, rows, answer, found=found),
                                   "recomputed": done.recomputed_tokens,
                                   "seconds": seconds, "runs": done.runs}
        if VERBOSE:
            print(f"    {name}: compose {seconds:.1f} s, {done.runs} runs, then {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr, flush=True)
    return result


# --------------------------------------------------------------------------- the table


def layout_for(run: Runner, path: Path) -> Layout:
    from pipeline.engine.templates import render_chat
    from pipeline.engine.gguf.info import ModelInfo

    m = run.model
    template = ModelInfo.read(path).chat_template
    return Layout.make(chat=lambda system, user: render_chat(template, system, user, bos=m.bos_text, eos=m.eos_text),
                       tokenize=lambda t, special=False: m.tokenize(t, special=special), bos=m.bos, system=SYSTEM)


def aggregate(results: list[dict]) -> dict[str, dict]:
    out = {}
    for name in [REFERENCE] + [n for n, _ in configs()]:
        rows = [r["configs"][name] for r in results if name in r["configs"]]
        if not rows:
            continue
        out[name] = {"top1": statistics.mean(r["top1"] for r in rows), "kl": statistics.mean(r["kl"] for r in rows),
                     "greedy": statistics.mean(float(r["greedy_same"]) for r in rows),
                     "recomputed": statistics.mean(r["recomputed"] for r in rows),
                     "seconds": statistics.mean(r["seconds"] for r in rows)}
        right = [float(r["correct"]) for r in rows if "correct" in r]
        out[name]["correct"] = statistics.mean(right) if right else None
    return out


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95 % by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    mid, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return ((mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n))


def answers(results: list[dict]) -> dict[str, dict]:
    """Right answers per configuration over the prompts with a known answer, with Wilson intervals,
    and against exact prefill pair by pair: ``lost`` (exact right, this one wrong) and ``won``."""
    known = [r for r in results if "exact_correct" in r]
    exact = [bool(r["exact_correct"]) for r in known]
    out = {"exact": {"right": sum(exact), "n": len(known), "ci": wilson(sum(exact), len(known)), "lost": 0, "won": 0}}
    for name in [REFERENCE] + [n for n, _ in configs()]:
        pairs = [(e, bool(r["configs"][name]["correct"])) for e, r in zip(exact, known) if name in r["configs"]]
        if not pairs:
            continue
        right = sum(c for _, c in pairs)
        out[name] = {"right": right, "n": len(pairs), "ci": wilson(right, len(pairs)),
                     "lost": sum(e and not c for e, c in pairs), "won": sum(c and not e for e, c in pairs)}
    return out


def policy(results: list[dict], *, seams: str = DEFAULT_SEAMS, budget: float = BUDGET) -> dict:
    """Right answers of ``ask.compose = "auto"`` at ``budget``: per corpus (a collection), the model is
    calibrated on the mean of its first :data:`CALIBRATION_PROMPTS` prompts (as the product decides on the mean
    of several prompts over the collection, but over this benchmark's 32 greedy teacher-forced tokens,
    decoded without the answers' repeat penalty) and every prompt of that corpus is composed with ``seams``
    if that calibration is within the budget, else prefilled exactly. Pair by pair against exact prefill."""
    known = [r for r in results if "exact_correct" in r and seams in r["configs"]]
    kls: dict[str, list[float]] = {}
    for r in results:
        if seams in r["configs"] and len(kls.setdefault(r["corpus"], [])) < CALIBRATION_PROMPTS:
            kls[r["corpus"]].append(r["configs"][seams]["kl"])
    first = {c: statistics.fmean(v) for c, v in kls.items()}
    allowed = {c: kl <= budget for c, kl in first.items()}
    pairs = [(bool(r["exact_correct"]),
              bool(r["configs"][seams]["correct"]) if allowed[r["corpus"]] else bool(r["exact_correct"]))
             for r in known]
    right = sum(c for _, c in pairs)
    return {"right": right, "n": len(pairs), "ci": wilson(right, len(pairs)),
            "lost": sum(e and not c for e, c in pairs), "won": sum(c and not e for e, c in pairs),
            "calibrations": {c: {"kl": first[c], "allowed": allowed[c]} for c in first}}


def print_answers(title: str, table: dict[str, dict]) -> None:
    print(f"\n{title}: right answers (the greedy answer holds the value asked for)")
    print("| prefill | right | 95 % interval | lost / won against exact |")
    print("| --- | --- | --- | --- |")
    for name, a in table.items():
        lo, hi = a["ci"]
        print(f"| {name} | {a['right']}/{a['n']} ({a['right'] / max(1, a['n']):.0%}) | {lo:.0%}-{hi:.0%} | "
              f"{a['lost']} / {a['won']} |")


def print_table(title: str, agg: dict[str, dict], exact_s: float) -> None:
    print(f"\n{title} (exact prefill of the documents: {exact_s:.1f} s)")
    print("| recompute | top-1 agreement | mean KL (nats) | greedy identical | right answer | tokens recomputed "
          "| compose (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, a in agg.items():
        right = "" if a.get("correct") is None else f"{a['correct']:.0%}"
        print(f"| {name} | {a['top1']:.1%} | {a['kl']:.4f} | {a['greedy']:.0%} | {right} | {a['recomputed']:.0f} | "
              f"{a['seconds']:.2f} |")


def summarize(mname: str, results: list[dict], *, sections: int) -> dict:
    """Print one model's tables; its part of the JSON report."""
    agg = aggregate(results)
    exact_s = statistics.mean(r["exact_s"] for r in results)
    right = [float(r["exact_correct"]) for r in results if "exact_correct" in r]
    print_table(f"{mname}: {len(results)} prompts of {statistics.mean(r['tokens'] for r in results):,.0f} tokens "
                f"({sections} sections)" + (f"; exact prefill's answer right in {statistics.mean(right):.0%} "
                                            f"of the {len(right)} with a known answer" if right else ""),
                agg, exact_s)
    table = answers(results)
    auto = f"auto at the default budget ({BUDGET})"
    if any(DEFAULT_SEAMS in r["configs"] for r in results):
        table[auto] = policy(results)
    print_answers(mname, table)
    for cname, c in table.get(auto, {}).get("calibrations", {}).items():
        print(f"  calibrated on the first {CALIBRATION_PROMPTS} prompts of {cname}: mean KL {c['kl']:.4f}, "
              f"{'composes' if c['allowed'] else 'stays exact'} at {BUDGET}")
    prof = {k: statistics.mean(r["profile"][k] for r in results if r["profile"].get(k) is not None)
            for k in results[0]["profile"]}
    print("KV deviation with nothing recomputed, mean by offset in a moved section: "
          + ", ".join(f"{k} {v:.3f}" for k, v in prof.items()))
    return {"aggregate": agg, "answers": table, "exact_s": exact_s, "profile": prof, "prompts": results}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--corpora", default="manual,dev",
                    help="manual and dev are development corpora; gnuplot and asymptote are held out")
    ap.add_argument("--questions", type=int, default=4, help="questions per corpus")
    ap.add_argument("--ctx", type=int, default=8192, help="the context the prompts are sized for")
    ap.add_argument("--sections", type=int, default=3, help="sections per prompt")
    ap.add_argument("--section-tokens", type=int, help="each section's size (default: a quarter of --ctx)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=22)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: SmolLM2, the generated manual, one question, prompts for a 2K context")
    ap.add_argument("--configs", help="comma-separated rows to run, e.g. 'first 32,last 512' (default: all)")
    ap.add_argument("--verbose", action="store_true", help="time each step on stderr")
    ap.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                    help="print the tables of earlier runs' --json files (one model each, or several) and exit")
    ap.add_argument("--no-reference", dest="reference", action="store_false",
                    help="leave out the q8_0-KV row (exact prefill with a quantised KV cache, for scale)")
    args = ap.parse_args(argv)
    global VERBOSE, ONLY
    VERBOSE = args.verbose
    if args.configs:
        ONLY = {c.strip() for c in args.configs.split(",")}
        unknown = ONLY - {name for name, _ in configs()}
        if unknown:
            ap.error(f"unknown --configs {', '.join(sorted(unknown))}")
    if args.report:
        for path in args.report:
            data = json.loads(path.read_text())
            for mname, mr in data["models"].items():
                summarize(mname, mr["prompts"], sections=data["sections"])
        return 0
    if args.quick:
        args.models, args.corpora, args.questions, args.ctx = "smollm2", "manual", 1, 2048
    from pipeline.config import resolve_home
    from pipeline.engine.host import usable_cpus
    from pipeline.models import resolve

    threads = args.threads or usable_cpus()
    docs = {name: corpus(name, questions=args.questions) for name in args.corpora.split(",")}
    report: dict = {"ctx": args.ctx, "sections": args.sections, "answer_tokens": ANSWER, "models": {}}
    for mname in args.models.split(","):
        path = resolve(MODELS[mname], home=resolve_home(), fetch=True)
        # Sections follow pages, and a document's pages can be long (the development set's are whole files):
        # room for prompts up to twice the nominal size (a question whose prompt is longer still is skipped, and said so).
        room = 2 * max(args.ctx, args.sections * (args.section_tokens or args.ctx // 4)) + 512
        run = Runner(path, ctx=room, threads=threads)
        reference = Runner(path, ctx=room, threads=threads, kv="q8_0") if args.reference else None
        layout = layout_for(run, path)
        results = []
        for cname, doc in docs.items():
            secs = sections(doc, run.model, args.section_tokens or args.ctx // 4)  # (piece, starts, text)
            states = StatesInMemory()  # one state per section, shared by the corpus's prompts
            for j, (q, idx) in enumerate(samples(doc, [t for *_, t in secs], k=args.sections,
                                                 n=args.questions, seed=args.seed)):
                t0 = time.perf_counter()
                pieces = [with_focus(p, text, starts, q.keyword) for p, starts, text in (secs[i] for i in idx)]
                n = sum(len(p) for p in pieces) + len(layout.head_tokens) + 64 + ANSWER
                if n > room:
                    print(f"  {mname} {cname:9} skipped: its {args.sections} sections need {n:,} of {room:,} cells",
                          flush=True)
                    continue
                r = run_prompt(run, layout, pieces, q.text, states, whole=j == 0, reference=reference,
                               expected=q.answer)
                r.update(corpus=cname, question=q.text, placed=idx)
                results.append(r)
                c = r["configs"]
                right = "" if "exact_correct" not in r else " right " + "".join(
                    "+" if x else "-" for x in [r["exact_correct"]] + [c[n]["correct"] for n in
                                                                       [name for name, _ in configs()] if n in c])
                print(f"  {mname} {cname:9} {r['tokens']:>5} tok {time.perf_counter() - t0:5.0f} s  "
                      + "  ".join(f"{n}: {c[n]['top1']:.0%}/{c[n]['kl']:.3f}" for n in
                                  [name for name, _ in configs()] if n in c) + right, flush=True)
        run.model.close()
        if reference is not None:
            reference.model.close()
        report["models"][mname] = summarize(mname, results, sections=args.sections)
    if args.json:
        from devtools.bench import document, row

        rows = []
        for mname, mr in report["models"].items():
            for name, a in mr["aggregate"].items():
                key = f"{mname}_{name.replace(' ', '')}"
                rows += [row(f"{key}_top1", a["top1"], "fraction", series=mname),
                         row(f"{key}_kl", a["kl"], "nats", series=mname),
                         row(f"{key}_greedy", a["greedy"], "fraction", series=mname)]
        args.json.write_text(json.dumps(document(rows, **report), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
