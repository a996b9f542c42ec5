"""One summary and where it goes: the record of a document × prompt, a run's totals, progress
events, and the output files (Markdown per summary, JSON Lines) written as summaries finish.

The job that computes them is :mod:`.job`; this module holds what it produces, so
that an app can consume results without the job's machinery.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from ..disk import is_disk_full
from ..engine.contract import EngineStats
from ..errors import DiskFullError, InputError, RagError


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
    stats: EngineStats = field(default_factory=EngineStats)  # its units' generations, summed
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
        del d["stats"]
        return {**d, **self.stats.figures()}

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
    stats: EngineStats = field(default_factory=EngineStats)  # every generation's figures, summed
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)

    def add(self, stats: EngineStats) -> None:
        """Count one generation and add its figures to the run's."""
        self.generate_calls += 1
        self.stats.add(stats)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["stats"]
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        return {**d, **self.stats.figures()}

    def describe(self) -> str:
        methods = ", ".join(f"{n} {m}" for m, n in sorted(self.methods.items())) or "none"
        e = self.stats
        rate = f" at {e.prefill_tokens_per_second:,.0f} tok/s" if e.prefill_seconds else ""
        text = (f"summarized {self.documents} documents × {self.prompts} prompts ({methods}); "
                f"{self.units_computed} units computed, {self.units_reused} reused"
                f"{f', {self.results_reused} summaries already done' if self.results_reused else ''}; "
                f"prefill {e.prefill_tokens:,} tokens{rate} ({e.cached_tokens:,} reused"
                f"{f', {e.composed_sections} sections from their states' if e.composed_sections else ''}), "
                f"{e.decode_tokens:,} tokens written, {self.seconds:.1f} s")
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


def output_names(sources: Sequence[str]) -> dict[str, str]:
    """A file-name stem per source: its file name, or its path below the common folder where names repeat
    (``p/q/r.md`` → ``p__q__r.md``); stems that still collide (``p__q/r.md``) get a digest of their path."""
    names = {s: Path(s).name for s in sources}
    if len(set(names.values())) == len(names):
        return names
    common = Path(os.path.commonpath([str(Path(s).parent) for s in sources]))
    names = {s: "__".join(Path(s).relative_to(common).parts) for s in sources}
    taken = Counter(names.values())
    return {s: f"{n}.{hashlib.sha256(s.encode('utf-8', 'surrogateescape')).hexdigest()[:8]}" if taken[n] > 1 else n
            for s, n in names.items()}


def _output_error(exc: OSError, where: Path) -> RagError:
    """A failed write of an output as a person's error: a full disk is exit 4 (as for the store), any
    other failure (a folder that is a file, no permission) a bad output path, exit 2."""
    if is_disk_full(exc, where):
        return DiskFullError(f"cannot write the output: the disk holding {where} is full ({exc}). The summaries "
                             "computed are kept in the job: free some space and run the command again; it "
                             "writes them without computing them again")
    return InputError(f"cannot write the output: {exc}")


class Outputs:
    """Markdown files (one per document and prompt) and a JSON Lines file, written as summaries finish.

    Each file replaces its previous version whole: a Markdown file when its summary is written, the
    JSON Lines file when the run ends (:meth:`finish`; until then it grows beside it as
    ``.NAME.partial``), so a run that is killed or fails leaves the previous outputs complete.
    """

    def __init__(self, *, out_dir: Path | None, jsonl: Path | None, sources: Sequence[str], n_prompts: int):
        self.out_dir, self.n_prompts = out_dir, n_prompts
        self.names = output_names(sources)
        self.written: list[str] = []
        self._jsonl = None
        self._jsonl_path = jsonl
        self._partial = jsonl.with_name(f".{jsonl.name}.partial") if jsonl is not None else None
        try:
            if out_dir is not None:
                out_dir.mkdir(parents=True, exist_ok=True)
            if jsonl is not None:
                jsonl.parent.mkdir(parents=True, exist_ok=True)
                self._jsonl = open(self._partial, "w", encoding="utf-8")
                self.written.append(str(jsonl))
        except OSError as exc:
            self.close()
            raise _output_error(exc, self._where) from None

    @property
    def _where(self) -> Path:
        return self.out_dir if self.out_dir is not None else self._jsonl_path

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
            self.close()
            raise _output_error(exc, self._where) from None

    def finish(self) -> None:
        """The run is complete: the JSON Lines file replaces the previous one."""
        fh, self._jsonl = self._jsonl, None
        if fh is None:
            return
        try:
            fh.close()
            os.replace(self._partial, self._jsonl_path)
        except OSError as exc:
            self._partial.unlink(missing_ok=True)
            raise _output_error(exc, self._where) from None

    def close(self) -> None:
        """Give up what :meth:`finish` did not make final (the previous JSON Lines file stays)."""
        fh, self._jsonl = self._jsonl, None
        if fh is None:
            return
        try:
            fh.close()
        except OSError:  # a full disk fails the flush again: the error was reported already
            pass
        self._partial.unlink(missing_ok=True)
