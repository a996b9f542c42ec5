"""``rag eval``: does retrieval find the page that holds the answer?

A question set is JSON Lines, one question per line::

    {"question": "...", "source": "samples/guide.pdf", "pages": [3], "answer": "n-cpu-moe"}
    {"question": "...", "source": "notes.md", "evidence": "first matching pattern wins"}

``source`` matches a stored document whose path ends with it (``guide.pdf`` or
``samples/guide.pdf``). A retrieved chunk is *relevant* when it comes from that
source, lies on one of ``pages`` (when given; PDF page numbers from 1) and
contains ``evidence`` (when given; case and spacing ignored) — the way to point
at a place in a document without pages. ``answer`` is an optional substring the
generated answer should contain (``--answers``). Keys starting with ``_`` are
comments (``rag eval --template`` writes an excerpt there); other unknown keys
are errors, so a typo cannot silently drop a condition.

Metrics, per question, averaged over questions (the targets of a question are
its pages, or the one place ``evidence`` marks):

- recall@k: the share of the question's targets found among the first k chunks;
- MRR: the mean of 1 / rank of the first relevant chunk (0 if none in the list);
- nDCG@10: each target gains 1 at the rank where it is first found, discounted
  by log2(1 + rank); the ideal finds every target at the top ranks.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ..errors import InputError

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..store.store import Store
    from ..records import Hit

KS = (1, 5, 10)
DEPTH = max(KS)  # chunks retrieved per question

# The retrieval settings `rag eval` compares: overrides of the retrieval configuration. "hybrid"
# weighs both sides evenly (plain reciprocal-rank fusion); "adaptive" weighs BM25 per query
# (see pipeline.retrieval.fusion); "adaptive+rerank" is the default configuration.
SETTINGS: dict[str, dict] = {
    "dense": {"dense": True, "lexical": False, "rerank": "none"},
    "lexical": {"dense": False, "lexical": True, "rerank": "none"},
    "hybrid": {"dense": True, "lexical": True, "rerank": "none", "fusion": "rrf"},
    "hybrid+mmr": {"dense": True, "lexical": True, "rerank": "none", "fusion": "rrf", "mmr": True},
    "hybrid+rerank": {"dense": True, "lexical": True, "rerank": "scores", "fusion": "rrf"},
    "adaptive": {"dense": True, "lexical": True, "rerank": "none", "fusion": "adaptive"},
    "adaptive+rerank": {"dense": True, "lexical": True, "rerank": "scores", "fusion": "adaptive"},
}
DEFAULT_SETTINGS = ("dense", "lexical", "hybrid", "hybrid+rerank", "adaptive+rerank")
STAGES = ("embed_query", "dense", "lexical", "fuse", "rerank")

_KEYS = {"question", "source", "pages", "evidence", "answer", "id"}


@dataclass(frozen=True)
class Question:
    """One line of a question set."""

    question: str
    source: str
    pages: tuple[int, ...] = ()
    evidence: str | None = None
    answer: str | None = None
    id: str = ""

    @property
    def targets(self) -> tuple[int | None, ...]:
        return self.pages or (None,)


def load_questions(path: str | Path) -> list[Question]:
    """The questions of a JSONL file; a bad line is an :class:`InputError` naming it."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    questions = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{where}: not JSON ({exc.msg})") from None
        questions.append(_question(data, where, default_id=str(len(questions) + 1)))
    if not questions:
        raise InputError(f"{path}: no questions")
    return questions


def _question(data, where: str, *, default_id: str) -> Question:
    if not isinstance(data, dict):
        raise InputError(f"{where}: each line must be a JSON object")
    unknown = sorted(k for k in data if k not in _KEYS and not k.startswith("_"))
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
    text, source = data.get("question"), data.get("source")
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{where}: 'question' must be a non-empty string (fill in the template?)")
    if not isinstance(source, str) or not source.strip():
        raise InputError(f"{where}: 'source' must name the document that holds the answer")
    pages = data.get("pages", [])
    if isinstance(pages, int) and not isinstance(pages, bool):
        pages = [pages]
    if not isinstance(pages, list) or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1
                                              for p in pages):
        raise InputError(f"{where}: 'pages' must be a list of page numbers from 1")
    for key in ("evidence", "answer", "id"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise InputError(f"{where}: '{key}' must be a string")
    evidence = (data.get("evidence") or "").strip() or None
    return Question(question=text.strip(), source=source.strip(), pages=tuple(dict.fromkeys(pages)),
                    evidence=evidence, answer=(data.get("answer") or "").strip() or None,
                    id=str(data.get("id") or default_id))


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def source_matches(expected: str, source: str) -> bool:
    """True when ``source`` (a stored, resolved path) ends with the path ``expected``."""
    want = Path(expected).parts
    have = Path(source).parts
    return bool(want) and have[-len(want):] == want


def targets_found(q: Question, source: str, page: int | None, text: str) -> frozenset:
    """The targets of ``q`` that a chunk (source, page, text) is relevant to."""
    if not source_matches(q.source, source):
        return frozenset()
    if q.evidence and _norm(q.evidence) not in _norm(text):
        return frozenset()
    if q.pages:
        return frozenset({page}) if page in q.pages else frozenset()
    return frozenset({None})


def question_metrics(found: Sequence[frozenset], n_targets: int, *, ks: Iterable[int] = KS) -> dict:
    """Metrics of one ranked list: ``found[i]`` holds the targets the chunk at rank i + 1 is relevant to."""
    first = next((i + 1 for i, f in enumerate(found) if f), None)
    out: dict = {"rank": first, "rr": 1.0 / first if first else 0.0}
    for k in ks:
        seen = frozenset().union(*found[:k]) if found[:k] else frozenset()
        out[f"recall@{k}"] = len(seen) / n_targets
    seen: set = set()
    dcg = 0.0
    for i, f in enumerate(found[:10]):
        new = f - seen
        dcg += len(new) / math.log2(i + 2)
        seen |= new
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(n_targets, 10)))
    out["ndcg@10"] = dcg / ideal
    return out


@dataclass
class SettingResult:
    """One retrieval setting over the whole question set."""

    name: str
    questions: list[dict] = field(default_factory=list)  # per question: id, rank, metrics, seconds

    def mean(self, metric: str) -> float:
        return statistics.fmean(q[metric] for q in self.questions) if self.questions else 0.0

    def latency(self) -> dict[str, float]:
        """Median seconds per stage over the questions (stages the setting ran), and in total."""
        out = {}
        for stage in STAGES:
            values = [q["seconds"][stage] for q in self.questions if stage in q["seconds"]]
            if values:
                out[stage] = statistics.median(values)
        totals = [sum(q["seconds"].values()) for q in self.questions]
        if totals:
            out["total"] = statistics.median(totals)
        return out

    def summary(self) -> dict:
        d = {"setting": self.name, "questions": len(self.questions)}
        for k in KS:
            d[f"recall@{k}"] = round(self.mean(f"recall@{k}"), 4)
        d["mrr"] = round(self.mean("rr"), 4)
        d["ndcg@10"] = round(self.mean("ndcg@10"), 4)
        d["latency_ms"] = {k: round(v * 1000, 2) for k, v in self.latency().items()}
        return d

    def misses(self, k: int = 5) -> list[dict]:
        return [q for q in self.questions if q[f"recall@{k}"] < 1.0]


@dataclass
class EvalReport:
    """Every setting's results, and the questions whose target is not in the collection."""

    label: str
    settings: list[SettingResult]
    unreachable: list[dict] = field(default_factory=list)
    answers: list[dict] | None = None
    packed: list[dict] | None = None  # per question: is the answer inside the prompt `rag ask` builds?

    def to_dict(self, *, details: bool = True) -> dict:
        d: dict = {"label": self.label, "settings": [s.summary() for s in self.settings],
                   "unreachable": self.unreachable}
        if details:
            d["questions"] = {s.name: s.questions for s in self.settings}
        if self.answers is not None:
            d["answers"] = {"summary": answer_summary(self.answers), "questions": self.answers}
        if self.packed is not None:
            d["packed"] = {"summary": packed_summary(self.packed), **({"questions": self.packed} if details else {})}
        return d


def table(reports: Sequence[EvalReport]) -> str:
    """A Markdown table: one row per config and setting, metrics then median latency per stage."""
    head = ["config", "setting", "questions", "recall@1", "recall@5", "recall@10", "MRR", "nDCG@10",
            "embed ms", "dense ms", "lexical ms", "rerank ms", "total ms"]
    rows = []
    for r in reports:
        for s in r.settings:
            d = s.summary()
            lat = d["latency_ms"]
            rows.append([r.label, d["setting"], str(d["questions"])]
                        + [f"{d[m]:.3f}" for m in ("recall@1", "recall@5", "recall@10", "mrr", "ndcg@10")]
                        + [f"{lat[k]:.1f}" if k in lat else "-"
                           for k in ("embed_query", "dense", "lexical", "rerank", "total")])
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


Search = Callable[[str, str], "tuple[list[Hit], dict[str, float]]"]


def run(questions: Sequence[Question], search: Search, *, settings: Sequence[str] = DEFAULT_SETTINGS,
        label: str = "", progress: Callable[[str, int], None] | None = None) -> EvalReport:
    """Every question through every setting. ``search(question, setting)`` returns the ranked
    hits (at least :data:`DEPTH` when there are that many) and the seconds per stage."""
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise InputError(f"unknown retrieval setting(s) {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
    results = [SettingResult(name) for name in settings]
    for n, q in enumerate(questions, start=1):
        for result in results:
            hits, seconds = search(q.question, result.name)
            found = [targets_found(q, h.source, h.page, h.text) for h in hits[:DEPTH]]
            m = question_metrics(found, len(q.targets))
            result.questions.append({"id": q.id, "question": q.question, **m,
                                     "top": [{"source": h.source, "page": h.page} for h in hits[:3]],
                                     "seconds": {k: round(v, 6) for k, v in seconds.items()}})
        if progress:
            progress(q.id, n)
    return EvalReport(label, results)


def unreachable(questions: Sequence[Question], store: "Store") -> list[dict]:
    """Questions whose target no stored chunk can satisfy (wrong source, page or evidence):
    their misses say nothing about retrieval, so they are reported apart."""
    sources = sorted(store.documents())
    chunks_of: dict[str, list] = {}
    out = []
    for q in questions:
        matching = [s for s in sources if source_matches(q.source, s)]
        if not matching:
            out.append({"id": q.id, "reason": f"no document in the collection matches {q.source!r}"})
            continue
        for s in matching:
            if s not in chunks_of:
                chunks_of[s] = store.catalog.chunks(store.name, s)
        missing = [t for t in q.targets
                   if not any(t in targets_found(q, c.source, c.page, c.text)
                              for s in matching for c in chunks_of[s])]
        if missing:
            what = "the evidence text" if missing == [None] else "page(s) " + ", ".join(map(str, missing))
            out.append({"id": q.id, "reason": f"no chunk of {q.source} holds {what}"})
    return out


_CITATION = re.compile(r"\[(\d+)\]")


def check_answer(q: Question, text: str, sources: Sequence[dict]) -> dict:
    """Whether an answer contains the expected substring and cites the expected page.

    ``sources`` are the numbered sources of the prompt (``n``, ``source``, ``pages``);
    "cited" counts only those the answer names as [n], "given" all that were in the prompt.
    """
    def holds(src: dict) -> bool:
        if not source_matches(q.source, src["source"]):
            return False
        return not q.pages or bool(set(q.pages) & set(src.get("pages") or ()))

    cited_numbers = {int(m) for m in _CITATION.findall(text)}
    return {"id": q.id, "question": q.question,
            "answer_ok": None if q.answer is None else _norm(q.answer) in _norm(text),
            "cited_ok": any(holds(s) for s in sources if s["n"] in cited_numbers),
            "given_ok": any(holds(s) for s in sources),
            "cited": sorted(cited_numbers), "answer": text}


def in_prompt(q: Question, prompt) -> dict:
    """Whether the place that answers ``q`` is inside ``prompt`` (a packed :class:`Prompt`): one
    of its pages within a packed section (whole or sections mode) or passage of its source, or
    for a question without pages, its evidence phrase in the prompt's text. What packing does
    with the ranking decides this, more than any one chunk's rank."""
    if prompt.mode in ("whole", "sections"):
        spans = [(p.section.source, p.section.first_page, p.section.last_page) for p in prompt.sections]
    else:
        spans = [(ps.source, min(ps.pages), max(ps.pages)) if ps.pages else (ps.source, None, None)
                 for ps in prompt.passages]
    if q.pages:
        found = sorted({page for source, lo, hi in spans if source_matches(q.source, source) and lo is not None
                        for page in q.pages if lo <= page <= (hi if hi is not None else lo)})
        ok = bool(found)
    else:
        found = []
        ok = any(source_matches(q.source, source) for source, _, _ in spans) and (
            q.evidence is None or _norm(q.evidence) in _norm(prompt.prefix))
    return {"id": q.id, "question": q.question, "in_prompt": ok, "pages_found": found, "mode": prompt.mode,
            "units": len(spans), "tokens": len(prompt.tokens)}


def packed_summary(rows: Sequence[dict]) -> dict:
    modes: dict[str, int] = {}
    for r in rows:
        modes[r["mode"]] = modes.get(r["mode"], 0) + 1
    n = len(rows)
    return {"questions": n, "in_prompt": sum(r["in_prompt"] for r in rows),
            "share": round(sum(r["in_prompt"] for r in rows) / n, 4) if n else 0.0, "modes": modes,
            "median_tokens": statistics.median(r["tokens"] for r in rows) if rows else 0}


def answer_summary(rows: Sequence[dict]) -> dict:
    with_answer = [r for r in rows if r["answer_ok"] is not None]
    return {"questions": len(rows),
            "answer_contains_expected": sum(bool(r["answer_ok"]) for r in with_answer),
            "with_expected_answer": len(with_answer),
            "cites_expected_page": sum(r["cited_ok"] for r in rows),
            "expected_page_in_prompt": sum(r["given_ok"] for r in rows)}


def template(store: "Store", *, per_document: int = 5, relative_to: Path | None = None) -> list[dict]:
    """Starter lines for a question set: ``per_document`` chunks spread over each document,
    each with its source, page and a short evidence phrase from the chunk, the question left
    empty for a person to write (in their own words, not the excerpt's), and the excerpt under
    ``_excerpt`` to read while writing it."""
    base = (relative_to or Path.cwd()).resolve()
    lines = []
    for source in sorted(store.documents()):
        chunks = store.catalog.chunks(store.name, source)
        if not chunks:
            continue
        n = min(per_document, len(chunks))
        picks = sorted({round(i * (len(chunks) - 1) / max(n - 1, 1)) for i in range(n)})
        try:
            shown = str(Path(source).relative_to(base))
        except ValueError:
            shown = source
        for i in picks:
            c = chunks[i]
            line: dict = {"question": "", "source": shown}
            if c.page is not None:
                line["pages"] = [c.page]
            else:
                line["evidence"] = _phrase(c.text)
            line["answer"] = ""
            line["_excerpt"] = " ".join(c.text.split())[:400]
            lines.append(line)
    return lines


_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _phrase(text: str, words: int = 8) -> str:
    """A run of words from the middle of the chunk's longest sentence (headings and markup
    skipped): specific enough to point at the chunk, readable as a hint."""
    sentences = [s.split() for s in _SENTENCE.split(text) if s.strip() and not s.lstrip().startswith(("#", "|"))]
    tokens = max(sentences, key=len, default=text.split())
    mid = max(0, len(tokens) // 2 - words // 2)
    return " ".join(tokens[mid:mid + words])


def evaluate(rt: "Runtime", questions: "str | Path | Sequence[Question]", *, settings: Sequence[str] | None = None,
             answer: Callable[[str], Any] | None = None, prompt: Callable[[str], Any] | None = None,
             label: str = "", progress: Callable[[str, int], None] | None = None) -> EvalReport:
    """:meth:`Pipeline.evaluate <pipeline.api.Pipeline.evaluate>`: ``questions`` (a JSONL path or loaded
    questions) through each retrieval setting, over the runtime's collection; with ``answer``, each
    question is also answered by it (an :class:`~pipeline.ask.answer.Answer`: its text and sources) and
    the answer checked; with ``prompt``, whether the answer's page is inside the prompt it builds
    for each question (a packed :class:`~pipeline.records.Prompt`, see :func:`in_prompt`)."""
    from .search import retrieve

    qs = load_questions(questions) if isinstance(questions, (str, Path)) else list(questions)
    names = tuple(settings or DEFAULT_SETTINGS)
    with rt.store(create=False) as store:
        store.require()
        rt.check_embedder(store)
        missing = unreachable(qs, store)
        if any(SETTINGS.get(n, {}).get("dense") for n in names):
            rt.embedder.embed(["warm-up"])  # the model load is not query latency

        def one(question: str, name: str):
            changes = dict(SETTINGS[name])
            mmr = changes.pop("mmr", False)
            seconds: dict[str, float] = {}
            hits = retrieve(rt, store, question, top_k=DEPTH, use_mmr=mmr, timings=seconds, **changes)
            return hits, seconds

        report = run(qs, one, settings=names, label=label, progress=progress)
    report.unreachable = missing
    if prompt is not None:
        report.packed = [in_prompt(q, prompt(q.question)) for q in qs]
    if answer is not None:
        report.answers = []
        for q in qs:
            a = answer(q.question)
            report.answers.append(check_answer(q, a.text, a.sources))
    return report


def collection_template(rt: "Runtime", *, per_document: int = 5) -> list[dict]:
    """:meth:`Pipeline.eval_template <pipeline.api.Pipeline.eval_template>`: starter lines over the
    runtime's collection (:func:`template`)."""
    with rt.store(create=False) as store:
        store.require()
        return template(store, per_document=per_document)
