"""Batch summaries: whole documents where they fit, map-reduce over fixed sections where they do not.

Prompts use the packer's one layout (:func:`.context.pack`): system prompt, the
document (or one section, or the partial results being combined), and the
instruction last. A document that fits is summarised whole with exactly the prefix
of ``rag ask --doc`` and ``rag warm``, so a warmed or already-asked document costs
only the instruction's prefill. Work is ordered so that each prefix is prefilled
once: all prompts of a document (or of a section) run back to back, and the
engine reuses the prefix in memory (or restores it from the prefix cache).

A document longer than the context is cut into sections at chunk boundaries
(:func:`sections_of`); each section gets every prompt (the *map* step), then each
prompt's partial results are combined in order (the *reduce* step), in several
levels when the partials do not fit one prompt together. Every unit is committed
to the job database as it finishes (:mod:`.jobs`), so a job stopped at any moment
resumes where it was, with the same output as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
import weakref
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from .context import Prompt, pack, render_passage
from .errors import EngineError, InputError, RagError
from .jobs import JobStore, StoredResult, Unit, digest
from .retrieve import Passage, merge_chunks

if TYPE_CHECKING:
    from .engine.generator import Engine, EngineStats
    from .store.catalog import DocumentRecord, StoredChunk
    from .store.store import Store

# Bumped when prompts or the method change in a way that changes outputs: old units are then not reused.
METHOD_VERSION = 1

REDUCE_INSTRUCTION = (
    "{prompt}\n(The numbered documents are partial results for consecutive parts of {name}, in order: "
    "combine them into one result for the whole document.)")

# Tokens kept free in a section's budget, for the small differences between counting a
# section alone and counting it inside the whole prompt.
_MARGIN = 16


@dataclass(frozen=True)
class Section:
    """A fixed run of consecutive chunks of one document, summarised as one map unit."""

    index: int
    first: int  # chunk indexes, inclusive
    last: int
    passages: tuple[Passage, ...]
    tokens: int  # the catalog's (embedder) token count of its chunks, for progress

    @property
    def pages(self) -> tuple[int, ...]:
        return tuple(sorted({p for passage in self.passages for p in passage.pages}))


def sections_of(store: "Store", source: str, budget: int, *, count: Callable[[str], int]) -> list[Section]:
    """The fixed sections of ``source``, in order, each fitting ``budget`` generator tokens in a prompt.

    This is the one place sections come from. Until the catalog records sections cut at
    ingest (issue 10), they are cut here from the catalog's chunks, at chunk boundaries,
    in sizes as even as the budget allows; the result depends only on the document's
    chunks and ``budget``, so it is the same on every run.
    """
    return cut_sections(store.catalog.chunks(store.name, source), budget, count=count)


def cut_sections(chunks: Sequence["StoredChunk"], budget: int, *, count: Callable[[str], int]) -> list[Section]:
    """``chunks`` (one document, in order) cut into consecutive runs whose rendered text fits ``budget``."""
    if not chunks:
        return []
    costs = [count(c.text) for c in chunks]
    n = max(1, math.ceil(sum(costs) / max(budget, 1)))
    target = sum(costs) / n
    groups: list[list] = []
    current: list = []
    size = 0
    for chunk, cost in zip(chunks, costs):
        if current and (size + cost > budget or size >= target):
            groups.append(current)
            current, size = [], 0
        current.append(chunk)
        size += cost
    groups.append(current)

    def rendered(group) -> int:
        return sum(count(render_passage(1, p)) for p in merge_chunks(list(group)))

    out: list[list] = []
    stack = list(reversed(groups))
    while stack:  # chunk overlaps and labels make the rendered text differ from the sum: split to fit
        group = stack.pop()
        if len(group) > 1 and rendered(group) > budget:
            half = len(group) // 2
            stack += [group[half:], group[:half]]
        else:
            out.append(group)
    return [Section(i, g[0].index, g[-1].index, tuple(merge_chunks(list(g))), sum(c.tokens for c in g))
            for i, g in enumerate(out)]


@dataclass
class Summary:
    """One document × prompt: the summary, how it was made, and what computing it cost in this run."""

    source: str
    content_hash: str
    prompt: str
    prompt_index: int  # from 1, in the order the prompts were given
    text: str = ""
    method: str = ""  # whole | map-reduce
    sections: int = 0  # map-reduce: how many sections were summarised
    reduce_steps: int = 0
    levels: int = 0  # reduce levels (1 = all partials combined at once)
    error: str | None = None
    reused: bool = False  # taken whole from the job database
    units_computed: int = 0
    units_reused: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decode_tokens: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def method_label(self) -> str:
        if self.method == "whole":
            return "whole document"
        if self.method == "map-reduce":
            return (f"map-reduce over {_plural(self.sections, 'section')} "
                    f"({_plural(self.reduce_steps, 'reduce step')} in {_plural(self.levels, 'level')})")
        return "failed"

    def record(self) -> dict:
        """What is written to output files: the same bytes on every run of the same job."""
        d = {"source": self.source, "content_hash": self.content_hash, "prompt": self.prompt,
             "method": self.method, "sections": self.sections, "reduce_steps": self.reduce_steps,
             "levels": self.levels, "summary": self.text}
        if self.error is not None:
            d["error"] = self.error
        return d

    def to_dict(self) -> dict:
        d = asdict(self)
        d["summary"] = d.pop("text")
        return d

    def markdown(self) -> str:
        head = [f"# {Path(self.source).name}", "", f"- source: {self.source}", f"- prompt: {self.prompt}",
                f"- method: {self.method_label}"]
        body = self.text if self.ok else f"(failed: {self.error})"
        return "\n".join(head) + "\n\n" + body.rstrip() + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class JobReport:
    """Totals of one run of a job (what this run computed, and what it found already done)."""

    job_id: str = ""
    collection: str = ""
    documents: int = 0
    prompts: int = 0
    summaries: int = 0
    failed: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    methods: dict[str, int] = field(default_factory=dict)
    units_computed: int = 0
    units_reused: int = 0
    results_reused: int = 0
    generate_calls: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)

    def add(self, stats: "EngineStats") -> None:
        self.generate_calls += 1
        self.prompt_tokens += stats.prompt_tokens
        self.prefill_tokens += stats.prefill_tokens
        self.cached_tokens += stats.cached_tokens
        self.prefill_seconds += stats.prefill_seconds
        self.decode_tokens += stats.decode_tokens
        self.decode_seconds += stats.decode_seconds

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        d["prefill_tokens_per_second"] = (round(self.prefill_tokens / self.prefill_seconds, 1)
                                          if self.prefill_seconds else 0.0)
        return d

    def describe(self) -> str:
        methods = ", ".join(f"{n} {m}" for m, n in sorted(self.methods.items())) or "none"
        rate = f" at {self.prefill_tokens / self.prefill_seconds:,.0f} tok/s" if self.prefill_seconds else ""
        text = (f"summarized {self.documents} documents × {self.prompts} prompts ({methods}); "
                f"{self.units_computed} units computed, {self.units_reused} reused"
                f"{f', {self.results_reused} summaries already done' if self.results_reused else ''}; "
                f"prefill {self.prefill_tokens:,} tokens{rate} ({self.cached_tokens:,} reused), "
                f"{self.decode_tokens:,} tokens written, {self.seconds:.1f} s")
        if self.failed:
            text += f"; {len(self.failed)} failed"
        return text


@dataclass(frozen=True)
class SummaryEvent:
    """Progress: ``kind`` is "plan", "unit" (a unit finished or was found done) or "document" (all its prompts)."""

    kind: str
    source: str = ""
    documents_done: int = 0
    documents: int = 0
    tokens_done: int = 0  # catalog (embedder) tokens of the documents, as a measure of the work
    tokens: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Settings:
    """What shapes a summary besides the document and the prompt (all of it keys the job's units)."""

    max_tokens: int
    temperature: float
    repeat_penalty: float
    seed: int
    system: str


def output_names(sources: Sequence[str]) -> dict[str, str]:
    """A file-name stem per source: its file name, or its path below the common folder where names repeat."""
    names = {s: Path(s).name for s in sources}
    if len(set(names.values())) == len(names):
        return names
    common = Path(os.path.commonpath([str(Path(s).parent) for s in sources]))
    return {s: "__".join(Path(s).relative_to(common).parts) for s in sources}


class _Outputs:
    """Markdown files (one per document and prompt) and a JSON Lines file, written as summaries finish."""

    def __init__(self, *, out_dir: Path | None, jsonl: Path | None, sources: Sequence[str], n_prompts: int):
        self.out_dir, self.n_prompts = out_dir, n_prompts
        self.names = output_names(sources)
        self.written: list[str] = []
        self._jsonl = None
        try:
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
            if jsonl is not None:
                jsonl.parent.mkdir(parents=True, exist_ok=True)
                self._jsonl = open(jsonl, "w", encoding="utf-8")  # rewritten whole on every run
                self.written.append(str(jsonl))
        except OSError as exc:
            self.close()
            raise InputError(f"cannot write the output: {exc}") from None

    def path_for(self, summary: Summary) -> Path | None:
        if self.out_dir is None:
            return None
        stem = self.names[summary.source]
        suffix = ".summary.md" if self.n_prompts == 1 else f".summary-{summary.prompt_index}.md"
        return self.out_dir / (stem + suffix)

    def write(self, summary: Summary) -> None:
        try:
            target = self.path_for(summary) if summary.ok else None
            if target is not None:
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_text(summary.markdown(), encoding="utf-8")
                os.replace(tmp, target)
                self.written.append(str(target))
            if self._jsonl is not None:
                self._jsonl.write(json.dumps(summary.record(), ensure_ascii=False) + "\n")
                self._jsonl.flush()
        except OSError as exc:
            raise InputError(f"cannot write the output: {exc}") from None

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None


# Engines with a job running: one llama.cpp context must never be used by two threads at once.
_busy: "weakref.WeakSet" = weakref.WeakSet()
_busy_lock = threading.Lock()


class Job:
    """One summarisation job: documents × prompts with fixed settings, resumable through a :class:`JobStore`.

    Iterate :meth:`run` for :class:`Summary` objects as they finish; ``report`` is
    complete once it ends. ``open_store`` opens the collection's store (briefly, per
    document, so that other commands are not locked out for the job's duration).
    """

    def __init__(self, *, engine: "Engine", jobs: JobStore, open_store: Callable[[], AbstractContextManager],
                 collection: str, documents: Sequence["DocumentRecord"], prompts: Sequence[str],
                 settings: Settings, progress: Callable[[SummaryEvent], None] | None = None):
        if not prompts:
            raise InputError("no prompt given")
        for p in prompts:
            if not p.strip():
                raise InputError("a prompt is empty")
        self.engine, self.jobs, self.open_store = engine, jobs, open_store
        self.collection = collection
        self.documents = sorted(documents, key=lambda d: d.source)  # canonical order
        self.prompts = list(dict.fromkeys(p.strip() for p in prompts))
        self.settings = settings
        self.progress = progress or (lambda ev: None)
        self.report = JobReport(collection=collection, documents=len(self.documents), prompts=len(self.prompts))

    # -- identity -----------------------------------------------------------------------------

    @cached_property
    def settings_key(self) -> str:
        """The model (file identity and every KV-shaping setting), batch sizes and generation settings."""
        e = self.engine
        return digest(METHOD_VERSION, e.namespace, e.settings.n_batch, e.settings.n_ubatch,
                      asdict(self.settings))

    @cached_property
    def job_id(self) -> str:
        return digest(self.settings_key, [(d.source, d.content_hash) for d in self.documents], self.prompts)

    def doc_key(self, doc: "DocumentRecord") -> str:
        return digest(self.settings_key, doc.source, doc.content_hash)

    @staticmethod
    def prompt_key(prompt: str) -> str:
        return digest(prompt)

    def result_key(self, doc: "DocumentRecord", prompt: str) -> str:
        return digest(self.doc_key(doc), self.prompt_key(prompt))

    def spec(self) -> dict:
        return {"documents": [[d.source, d.content_hash] for d in self.documents], "prompts": self.prompts,
                "settings": asdict(self.settings), "model": self.engine.namespace}

    # -- status and restart -------------------------------------------------------------------

    def status(self) -> dict:
        """Per document and prompt: done (with the method), in progress (units done) or not started."""
        rows, done = [], 0
        for doc in self.documents:
            dk = self.doc_key(doc)
            for i, prompt in enumerate(self.prompts, start=1):
                stored = self.jobs.result(self.result_key(doc, prompt))
                units = self.jobs.units_done(dk, self.prompt_key(prompt))
                state = "done" if stored else ("in progress" if units else "not started")
                done += stored is not None
                rows.append({"source": doc.source, "prompt_index": i, "state": state, "units_done": units,
                             "method": stored.method if stored else None,
                             "sections": stored.sections if stored else None})
        job = self.jobs.job(self.job_id)
        total = len(self.documents) * len(self.prompts)
        state = "done" if total and done == total else ("not started" if job is None and not done
                                                        else "incomplete")
        return {"job_id": self.job_id, "collection": self.collection, "state": state,
                "recorded_state": job["state"] if job else None, "documents": len(self.documents),
                "prompts": self.prompts, "summaries_done": done, "summaries": total, "items": rows}

    def forget(self) -> int:
        """Delete every finished unit and result of this job, so that the next run computes it all again."""
        return self.jobs.forget(self.job_id, [(self.doc_key(d), self.prompt_key(p))
                                              for d in self.documents for p in self.prompts])

    # -- running ------------------------------------------------------------------------------

    def run(self, *, outputs: _Outputs | None = None) -> Iterator[Summary]:
        with _busy_lock:
            if self.engine in _busy:
                raise EngineError("a summarize job is already running on this pipeline's engine; "
                                  "use one Pipeline per thread")
            _busy.add(self.engine)
        t0 = time.perf_counter()
        try:
            self.report.job_id = self.job_id
            self.jobs.begin(self.job_id, collection=self.collection, spec=self.spec())
            total = sum(d.n_tokens for d in self.documents)
            done_tokens = 0
            self.progress(SummaryEvent("plan", documents=len(self.documents), tokens=total))
            workers = getattr(self.engine, "workers", None)  # several generator servers: one worker each
            engines = workers() if workers else []
            if len(engines) > 1:
                from .summarize_spread import spread

                finished = spread(self, engines)
            else:
                finished = self._in_order(total)
            for n, (doc, summaries) in enumerate(finished, start=1):
                for summary in summaries:
                    self._account(summary)
                    if outputs is not None:
                        outputs.write(summary)
                    yield summary
                done_tokens += doc.n_tokens
                self.progress(SummaryEvent("document", doc.source, n, len(self.documents), done_tokens, total))
            self.jobs.finish(self.job_id, "failed" if self.report.failed else "done")
        finally:
            _busy.discard(self.engine)
            self.report.seconds = time.perf_counter() - t0
            if outputs is not None:
                self.report.outputs = list(outputs.written)

    def _in_order(self, total: int) -> Iterator[tuple["DocumentRecord", list[Summary]]]:
        """Each document's summaries, one document after the other, with progress per unit."""
        done_tokens = 0
        for n, doc in enumerate(self.documents, start=1):
            def tick(fraction: float, detail: str, _base=done_tokens, _doc=doc, _n=n) -> None:
                self.progress(SummaryEvent("unit", _doc.source, _n - 1, len(self.documents),
                                           _base + int(_doc.n_tokens * min(fraction, 1.0)), total, detail))

            yield doc, self._document(doc, tick)
            done_tokens += doc.n_tokens

    def _account(self, s: Summary) -> None:
        self.report.summaries += 1
        self.report.units_computed += s.units_computed
        self.report.units_reused += s.units_reused
        self.report.results_reused += s.reused
        if s.ok:
            self.report.methods[s.method] = self.report.methods.get(s.method, 0) + 1
        else:
            self.report.failed.append({"source": s.source, "prompt_index": s.prompt_index, "error": s.error})

    def _document(self, doc: "DocumentRecord", tick: Callable[[float, str], None]) -> list[Summary]:
        summaries = [Summary(doc.source, doc.content_hash, p, i) for i, p in enumerate(self.prompts, start=1)]
        todo = []
        for s in summaries:
            stored = self.jobs.result(self.result_key(doc, s.prompt))
            if stored is None:
                todo.append(s)
            else:
                s.text, s.method, s.sections = stored.text, stored.method, stored.sections
                s.reduce_steps, s.levels, s.reused = stored.reduce_steps, stored.levels, True
        if todo:
            try:
                self._compute(doc, todo, tick)
            except RagError as exc:  # this document fails; the job goes on with the others
                for s in todo:
                    if self.jobs.result(self.result_key(doc, s.prompt)) is None:
                        s.error, s.text, s.method = str(exc), "", ""
        tick(1.0, Path(doc.source).name)
        return summaries

    # -- the work of one document -------------------------------------------------------------

    def _pack(self, passages: Sequence[Passage], instruction: str) -> Prompt:
        e = self.engine
        return pack(passages, instruction, chat=e.chat, tokenize=e.tokenize, bos=e.bos, n_ctx=e.n_ctx,
                    reserve=self.settings.max_tokens, system=self.settings.system)

    def _budget(self, instruction: str) -> int:
        """Tokens left for document text in a prompt with this instruction."""
        return self.engine.n_ctx - self.settings.max_tokens - len(self._pack([], instruction).tokens) - _MARGIN

    def _compute(self, doc: "DocumentRecord", todo: list[Summary], tick: Callable[[float, str], None]) -> None:
        with self.open_store() as store:
            record = store.catalog.document(store.name, doc.source)
            if record is None or record.content_hash != doc.content_hash:
                raise InputError(f"{doc.source} changed or was removed during the job: run it again")
            passages = merge_chunks(store.catalog.chunks(store.name, doc.source))
            whole: list[tuple[Summary, Prompt]] = []
            mapped: list[Summary] = []
            for s in todo:
                prompt = self._pack(passages, s.prompt)
                if prompt.dropped or prompt.truncated:
                    mapped.append(s)
                else:
                    whole.append((s, prompt))
            sections: list[Section] = []
            if mapped:
                budget = min(self._budget(s.prompt) for s in mapped)
                if budget < 2 * (self.settings.max_tokens + _MARGIN):
                    raise EngineError(
                        f"{Path(doc.source).name} needs map-reduce, but the context ({self.engine.n_ctx:,} tokens) "
                        f"cannot hold two partial summaries of {self.settings.max_tokens} tokens: raise "
                        "engine.n_ctx or lower --max-tokens")
                sections = sections_of(store, doc.source, budget, count=self.engine.count_tokens)
        dk = self.doc_key(doc)
        planned = len(whole) + len(mapped) * (len(sections) + 1)
        finished = 0

        def step(detail: str) -> None:
            nonlocal finished
            finished += 1
            tick(finished / max(planned, 1), detail)

        name = Path(doc.source).name
        for s, prompt in whole:  # one prefix (system + document), every prompt after it
            s.method = "whole"
            s.text = self._unit(s, dk, "whole", [], prompt=lambda p=prompt: p)
            self._commit(doc, s)
            step(f"{name} (whole)")

        partials: dict[int, list[Passage]] = {s.prompt_index: [] for s in mapped}
        for sec in sections:  # section-major: each section's prefix is prefilled once for all prompts
            for s in mapped:
                text = self._unit(s, dk, "map", [sec.first, sec.last],
                                  prompt=lambda sec=sec, s=s: self._section_prompt(sec, s.prompt))
                partials[s.prompt_index].append(
                    Passage(doc.source, doc.content_hash, sec.index, sec.index, sec.pages, text, sec.index))
                step(f"{name} (section {sec.index + 1}/{len(sections)})")
        for s in mapped:
            s.method, s.sections = "map-reduce", len(sections)
            s.text = self._reduce(s, dk, name, partials[s.prompt_index])
            self._commit(doc, s)
            step(f"{name} (reduce)")

    def _section_prompt(self, sec: Section, instruction: str) -> Prompt:
        prompt = self._pack(list(sec.passages), instruction)
        if prompt.dropped:
            raise EngineError(f"section {sec.index + 1} (chunks {sec.first}-{sec.last}) does not fit the context")
        return prompt

    def _reduce(self, s: Summary, dk: str, name: str, parts: list[Passage]) -> str:
        """Combine ``parts`` in order, in groups that fit one prompt, level by level, until one is left."""
        instruction = REDUCE_INSTRUCTION.format(name=name, prompt=s.prompt)
        level = 0
        while len(parts) > 1:
            level += 1
            groups: list[list[Passage]] = []
            for part in parts:
                if groups and self._fits(groups[-1] + [part], instruction):
                    groups[-1].append(part)
                else:
                    groups.append([part])
            if len(groups) == len(parts):
                raise EngineError(f"the partial summaries of {name} are too long to combine in a context of "
                                  f"{self.engine.n_ctx:,} tokens: raise engine.n_ctx or lower --max-tokens")
            combined = []
            for g, group in enumerate(groups):
                if len(group) == 1:  # carried to the next level as it is, numbered in order there
                    combined.append(dataclasses.replace(group[0], first=g, last=g, rank=g))
                    continue
                text = self._unit(s, dk, "reduce", [level, g, [p.text for p in group]],
                                  prompt=lambda group=group: self._pack(group, instruction))
                s.reduce_steps += 1
                pages = tuple(sorted({p for part in group for p in part.pages}))
                combined.append(Passage(group[0].source, group[0].content_hash, g, g, pages, text, g))
            parts = combined
        s.levels = level
        return parts[0].text if parts else ""

    def _fits(self, group: list[Passage], instruction: str) -> bool:
        prompt = self._pack(group, instruction)
        return not prompt.dropped and not prompt.truncated

    def _unit(self, s: Summary, dk: str, kind: str, where: list, *, prompt: Callable[[], Prompt]) -> str:
        """The text of one unit: from the job database if it was finished before, else generated and committed."""
        pk = self.prompt_key(s.prompt)
        key = digest(dk, pk, kind, where)
        unit = self.jobs.unit(key)
        if unit is not None:
            s.units_reused += 1
            return unit.text
        p = prompt()
        if p.truncated:
            s.notes.append(f"a {kind} prompt's only passage was cut to fit the context")
        t0 = time.perf_counter()
        generation = self.engine.generate(p.tokens, max_tokens=self.settings.max_tokens,
                                          temperature=self.settings.temperature,
                                          repeat_penalty=self.settings.repeat_penalty, seed=self.settings.seed,
                                          prefix_len=len(p.prefix_tokens))
        text = generation.read().strip()
        st = generation.stats
        self.report.add(st)
        s.units_computed += 1
        s.prefill_tokens += st.prefill_tokens
        s.cached_tokens += st.cached_tokens
        s.decode_tokens += st.decode_tokens
        for note in st.notes:
            if note not in s.notes:
                s.notes.append(note)
        self.jobs.commit_unit(Unit(key, kind, text, st.prompt_tokens, st.prefill_tokens, st.decode_tokens,
                                   time.perf_counter() - t0), doc_key=dk, prompt_key=pk,
                              idx=json.dumps(where[:2]))
        return text

    def _commit(self, doc: "DocumentRecord", s: Summary) -> None:
        self.jobs.commit_result(
            self.result_key(doc, s.prompt),
            StoredResult(doc.source, doc.content_hash, s.prompt, s.method, s.sections, s.reduce_steps, s.levels,
                         s.text),
            doc_key=self.doc_key(doc), prompt_key=self.prompt_key(s.prompt))


class SummaryRun:
    """A summarisation run: iterate for :class:`Summary` objects as they finish; ``report`` once it ends.

    ``prepare`` returns the job (documents resolved, paths ingested), its open job
    database, and the inputs that could not be taken (failed to load, unsupported),
    each as a dict with "source" and "error".
    """

    def __init__(self, prepare: Callable[[], tuple[Job, JobStore, list[dict], list[dict]]], *, restart: bool = False,
                 out_dir: Path | None = None, jsonl: Path | None = None,
                 progress: Callable[[SummaryEvent], None] | None = None):
        self._prepare = prepare
        self.restart = restart
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.jsonl = Path(jsonl) if jsonl is not None else None
        self.progress = progress
        self.report: JobReport | None = None

    def __iter__(self) -> Iterator[Summary]:
        job, jobs, failed, skipped = self._prepare()
        with jobs:
            if self.progress is not None:
                job.progress = self.progress
            self.report = job.report
            self.report.skipped = list(skipped)
            if self.restart:
                job.forget()
            outputs = _Outputs(out_dir=self.out_dir, jsonl=self.jsonl, sources=[d.source for d in job.documents],
                               n_prompts=len(job.prompts))
            try:
                for f in failed:  # inputs that never reached the collection: reported, the rest go on
                    for i, prompt in enumerate(job.prompts, start=1):
                        s = Summary(f["source"], "", prompt, i, error=f["error"])
                        self.report.failed.append({"source": s.source, "prompt_index": i, "error": s.error})
                        outputs.write(s)
                        yield s
                yield from job.run(outputs=outputs)
            finally:
                outputs.close()

    def result(self) -> list[Summary]:
        """Run to the end; every summary, in order."""
        return list(self)
