"""Batch summaries: whole documents where they fit, map-reduce over fixed sections where they do not.

Prompts are laid out exactly as ``rag ask`` lays them out (:mod:`pipeline.ask.packing`,
:func:`pipeline.ask.prompt.section_prompt`): system prompt, the document as its page-marked
fixed sections (the catalog's, cut at ingest), the instruction last, with a boundary
after every section. A document that fits is summarised whole with the very prefix
of ``rag ask --doc`` and ``rag warm``, so a warmed or already-asked document costs
only the instruction's prefill, and a summarised one serves the next question the
same way. Work is ordered so that each prefix is prefilled once: all prompts of a
document (or of a run of sections) go back to back, and the engine reuses the
prefix in memory (or restores it from the prefix cache).

A document longer than the context is summarised over runs of its consecutive
sections that fit (:func:`map_groups`; the first run is the prefix ``rag warm``
saves for it): each run gets every prompt (the *map* step), then each prompt's
partial results are combined in order (the *reduce* step), in several levels when
the partials do not fit one prompt together. Every unit is committed to the job
database as it finishes (:mod:`.jobstore`), so a job stopped at any moment resumes where
it was, with the same output as an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import weakref
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from ..ask import packing
from ..ask.prompt import Layout, SectionTokens, pack, section_prompt
from .digest import digest
from ..errors import EngineError, InputError, RagError
from ..ingest.sections import record_cut
from ..records import DocumentRecord, Passage, Prompt, Section
from .jobstore import JobStore, StoredResult, Unit
from .outputs import JobReport, Outputs, Summary, SummaryEvent

if TYPE_CHECKING:
    from ..engine.contract import EngineStats
    from ..engine.local import Engine
    from ..store.store import Store

# Bumped when prompts or the method change in a way that changes outputs: old units are then not reused.
METHOD_VERSION = 2  # 2: prompts laid out by the packer (page-marked sections), as `ask` and `warm` lay them out

REDUCE_INSTRUCTION = (
    "{prompt}\n(The numbered documents are partial results for consecutive parts of {name}, in order: "
    "combine them into one result for the whole document.)")

# Tokens kept free in a reduce prompt's budget, for the small differences between counting a
# partial alone and counting it inside the whole prompt.
_MARGIN = 16


def sections_of(store: "Store", source: str, *, target: int) -> "packing.Shelf":
    """``source``'s fixed sections (the catalog's, cut at ingest) with their texts: what ``ask`` packs.

    Documents committed before sections existed get theirs now, cut at ``target``
    embedder tokens and recorded, exactly as ``ask`` would cut them.
    """
    shelf = packing.gather(store, sources=[source], target=target, fetch_tokens=2**62)
    record_cut(store, shelf.cut_now)
    return shelf


def map_groups(shelf: "packing.Shelf", budget: int, memo: SectionTokens) -> list[list["Section"]]:
    """The document's sections in order, in runs of consecutive sections that fit ``budget`` together.

    The first run is the prefix ``rag warm`` saves for a document that does not fit
    whole (its leading sections, as many as fit), so a warmed document's first map
    step prefills only its instruction. A section larger than the budget on its own
    cannot be summarised in this context.
    """
    groups: list[list[Section]] = []
    used = 0
    for s in shelf.sections:
        cost = len(memo.get(1, s, shelf.counts[s.source], shelf.segments[s.key]))
        if cost > budget:
            raise EngineError(f"section {s.index + 1} of {Path(s.source).name} ({cost:,} tokens) does not fit "
                              f"the {budget:,} tokens a prompt leaves for it: raise engine.n_ctx, lower chunking.section_tokens, "
                              "or lower summarize.max_tokens and ask.max_tokens (the layout holds back the larger)")
        if groups and used + cost <= budget:
            groups[-1].append(s)
            used += cost
        else:
            groups.append([s])
            used = cost
    return groups


@dataclass(frozen=True)
class Settings:
    """What shapes a summary besides the document and the prompt (all of it keys the job's units)."""

    max_tokens: int
    temperature: float
    repeat_penalty: float
    seed: int
    system: str
    reserve: int = 0
    """The answer room the layout decision holds back (whole or map-reduce, where runs end): the one
    ``ask`` and ``warm`` use (:func:`pipeline.ask.prompt.layout_reserve`); 0 = ``max_tokens``."""

    compose: bool = False
    """Map prompts composed from section states (``ask.compose`` not ``"off"``): each section rendered as
    every composed prompt renders it (its document numbered by its place in the collection), so the
    states ``rag warm --sections`` and earlier questions saved serve the map step, and the sections
    it computes serve them."""

    @property
    def layout_reserve(self) -> int:
        return max(self.reserve, self.max_tokens)


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
                 settings: Settings, section_target: int, memo: SectionTokens | None = None,
                 progress: Callable[[SummaryEvent], None] | None = None,
                 record: "Callable[[Sequence[packing.Key]], None] | None" = None):
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
        self.section_target = section_target  # for documents whose sections are not in the catalog yet
        self.memo = memo or SectionTokens(engine.tokenize)
        self.progress = progress or (lambda ev: None)
        # Each prefix a summary prompt prefilled (its sections' keys), told to ask's pack history, so
        # that a later question prefers a pack whose state a summary saved (see packing.pack_shelf).
        self.record = record or (lambda keys: None)
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

    def run(self, *, outputs: Outputs | None = None) -> Iterator[Summary]:
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
            engines = self.engine.workers()  # several generator servers: one worker each
            if len(engines) > 1:
                from .spread import spread

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
        """Each document's summaries, one document after the other, with progress per unit; other
        processes running the same job take other documents (claims in the job store)."""
        from .spread import in_turn

        done = {"documents": 0, "tokens": 0}

        def compute(doc: "DocumentRecord") -> list[Summary]:
            def tick(fraction: float, detail: str) -> None:
                self.progress(SummaryEvent("unit", doc.source, done["documents"], len(self.documents),
                                           done["tokens"] + int(doc.n_tokens * min(fraction, 1.0)), total, detail))

            summaries = self._document(doc, tick)
            done["documents"] += 1
            done["tokens"] += doc.n_tokens
            return summaries

        yield from in_turn(self, compute)

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

    @cached_property
    def layout(self) -> Layout:
        """The chat template around the documents: the one ``ask`` uses (same system prompt)."""
        e = self.engine
        return Layout.make(chat=e.chat, tokenize=e.tokenize, bos=e.bos, system=self.settings.system)

    def _pack(self, passages: Sequence[Passage], instruction: str) -> Prompt:
        """A reduce prompt: the partial results as numbered passages, the instruction last."""
        e = self.engine
        return pack(passages, instruction, chat=e.chat, tokenize=e.tokenize, bos=e.bos, n_ctx=e.n_ctx,
                    reserve=self.settings.max_tokens, system=self.settings.system)

    def _budget(self, instruction: str) -> int:
        """Tokens left for sections in a prompt with this instruction last (as ``ask`` counts them, with
        the same reserve: a document ``ask`` packs whole is summarised whole, over the same prefix)."""
        suffix = self.layout.suffix(instruction, self.engine.tokenize)
        return self.layout.budget(n_ctx=self.engine.n_ctx, reserve=self.settings.layout_reserve,
                                  suffix_tokens=len(suffix))

    def _reduce_room(self, prompt: str, name: str) -> int:
        """Tokens left for partial results in a reduce prompt."""
        instruction = REDUCE_INSTRUCTION.format(name=name, prompt=prompt)
        return self.engine.n_ctx - self.settings.max_tokens - len(self._pack([], instruction).tokens) - _MARGIN

    def _sections_prompt(self, shelf: "packing.Shelf", sections: Sequence["Section"], instruction: str, *,
                         mode: str) -> Prompt:
        packed = packing.number(shelf, sections, self.memo)
        return section_prompt(self.layout, packed, instruction, tokenize=self.engine.tokenize, mode=mode)

    def _compute(self, doc: "DocumentRecord", todo: list[Summary], tick: Callable[[float, str], None]) -> None:
        with self.open_store() as store:
            record = store.catalog.document(store.name, doc.source)
            if record is None or record.content_hash != doc.content_hash:
                raise InputError(f"{doc.source} changed or was removed during the job: run it again")
            shelf = sections_of(store, doc.source, target=self.section_target)
        shelf.fixed_numbers = self.settings.compose
        # The store is released: tokenising (and loading the generator) happens from here on.
        tokens = sum(len(p.tokens) for p in packing.number(shelf, shelf.sections, self.memo))
        whole = [s for s in todo if tokens <= self._budget(s.prompt)]
        mapped = [s for s in todo if s not in whole]
        groups: list[list[Section]] = []
        if mapped:
            budget = min(self._budget(s.prompt) for s in mapped)
            room = min(self._reduce_room(s.prompt, Path(doc.source).name) for s in mapped)
            if room < 2 * (self.settings.max_tokens + _MARGIN):
                raise EngineError(
                    f"{Path(doc.source).name} needs map-reduce, but the context ({self.engine.n_ctx:,} tokens) "
                    f"cannot hold two partial summaries of {self.settings.max_tokens} tokens: raise "
                    "engine.n_ctx or lower --max-tokens")
            groups = map_groups(shelf, budget, self.memo)
        dk = self.doc_key(doc)
        planned = len(whole) + len(mapped) * (len(groups) + 1)
        finished = 0

        def step(detail: str) -> None:
            nonlocal finished
            finished += 1
            tick(finished / max(planned, 1), detail)

        name = Path(doc.source).name
        for run in reversed(([shelf.sections] if whole else []) + groups):  # the first run most recent
            self.record([sec.key for sec in run])
        # One prefix (system + document), every prompt after it
        texts = self._units([(s, lambda s=s: self._sections_prompt(shelf, shelf.sections, s.prompt, mode="whole"))
                             for s in whole], dk, "whole", [])
        for s, text in zip(whole, texts):
            s.method, s.text = "whole", text
            self._commit(doc, s)
            step(f"{name} (whole)")

        partials: dict[int, list[Passage]] = {s.prompt_index: [] for s in mapped}
        for g, group in enumerate(groups):  # run by run: each run's prefix is prefilled once for all prompts
            pages = tuple(sorted({p for sec in group for p in sec.pages}))
            texts = self._units([(s, lambda group=group, s=s: self._sections_prompt(shelf, group, s.prompt,
                                                                                    mode="sections"))
                                 for s in mapped], dk, "map", [[sec.first, sec.last] for sec in group])
            for s, text in zip(mapped, texts):
                partials[s.prompt_index].append(Passage(doc.source, doc.content_hash, g, g, pages, text, g))
                step(f"{name} (part {g + 1}/{len(groups)})")
        for s in mapped:
            s.method, s.sections = "map-reduce", len(shelf.sections)
            s.text = self._reduce(s, dk, name, partials[s.prompt_index])
            self._commit(doc, s)
            step(f"{name} (reduce)")

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
        return self._units([(s, prompt)], dk, kind, where)[0]

    def _units(self, todo: Sequence[tuple[Summary, Callable[[], Prompt]]], dk: str, kind: str, where: list
               ) -> list[str]:
        """The texts of units that differ only by their prompt's instruction (one prefix): those finished
        before from the job database, the others generated together (:meth:`_generate`), each committed."""
        texts: list[str] = [""] * len(todo)
        pending = []
        for i, (s, make) in enumerate(todo):
            key = digest(dk, self.prompt_key(s.prompt), kind, where)
            unit = self.jobs.unit(key)
            if unit is not None:
                s.units_reused += 1
                texts[i] = unit.text
            else:
                pending.append((i, s, key, make()))
        if not pending:
            return texts
        t0 = time.perf_counter()
        results, together = self._generate([p for *_, p in pending])
        seconds = (time.perf_counter() - t0) / len(pending)
        rows = []
        for (i, s, key, p), (text, st) in zip(pending, results):
            if p.truncated:
                s.notes.append(f"a {kind} prompt's only passage was cut to fit the context")
            self.report.add(st)
            s.units_computed += 1
            s.stats.add(st)
            for note in st.notes:
                if note not in s.notes:
                    s.notes.append(note)
            rows.append((Unit(key, kind, text, st.prompt_tokens, st.prefill_tokens, st.decode_tokens, seconds),
                         dk, self.prompt_key(s.prompt), json.dumps(where[:2])))
            texts[i] = text
        if together:  # decoded as one group: committed as one, so that a resume decodes the same group
            self.jobs.commit_units(rows)
        else:
            for unit, unit_dk, pk, idx in rows:
                self.jobs.commit_unit(unit, doc_key=unit_dk, prompt_key=pk, idx=idx)
        return texts

    def _generate(self, prompts: Sequence[Prompt]) -> tuple[list[tuple[str, "EngineStats"]], bool]:
        """Each prompt's text and figures, and whether they were decoded together. Prompts with one
        prefix are decoded together where the engine runs several sequences (``engine.n_seq_max`` > 1),
        else one after the other (see :mod:`pipeline.engine.multiseq` for when greedy texts match);
        map prompts composed from section states one after the other."""
        g = self.settings
        kw = dict(max_tokens=g.max_tokens, temperature=g.temperature, repeat_penalty=g.repeat_penalty, seed=g.seed)
        first = prompts[0]
        shapes = [p.shape for p in prompts]
        composed = g.compose and any(s.sections is not None for s in shapes)
        if len(prompts) > 1 and self.engine.n_seq_max > 1 and not composed and \
                all(p.prefix_tokens == first.prefix_tokens for p in prompts):
            done = self.engine.generate_many(shapes, **kw)
            return [(c.text.strip(), c.stats) for c in done], True
        out = []
        for shape in shapes:  # a composed prompt's sections stay in memory for the next
            generation = self.engine.generate(shape, **kw)
            out.append((generation.read().strip(), generation.stats))
        return out, False

    def _commit(self, doc: "DocumentRecord", s: Summary) -> None:
        self.jobs.commit_result(
            self.result_key(doc, s.prompt),
            StoredResult(doc.source, doc.content_hash, s.prompt, s.method, s.sections, s.reduce_steps, s.levels,
                         s.text),
            doc_key=self.doc_key(doc), prompt_key=self.prompt_key(s.prompt))
