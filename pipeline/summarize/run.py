"""A summarisation run over the collection: the job assembled from the settings, iterated as it finishes.

:meth:`Pipeline.summarize <pipeline.api.Pipeline.summarize>` returns a :class:`SummaryRun`;
iterating it ingests the paths that are new or changed, assembles the :class:`~.job.Job`
(documents, prompts, generation settings, the one layout reserve) over the runtime's
engine and job store (:func:`open_jobs`), and yields each :class:`~.outputs.Summary` as it
is committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from ..errors import InputError, StoreError
from .job import Job, Settings
from .jobstore import JobStore, SQLiteJobStore
from .outputs import JobReport, Outputs, Summary, SummaryEvent

if TYPE_CHECKING:
    from ..runtime import Runtime

class SummaryRun:
    """A summarisation run: iterate for :class:`Summary` objects as they finish; ``report`` once it ends.

    ``prepare`` returns the job (documents resolved, paths ingested), its open job
    database, and the inputs that could not be taken (failed to load, unsupported),
    each as a dict with "source" and "error".
    """

    def __init__(self, prepare: Callable[[], "tuple[Job, JobStore, list[dict], list[dict]]"], *,
                 restart: bool = False, out_dir: Path | None = None, jsonl: Path | None = None,
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
            outputs = Outputs(out_dir=self.out_dir, jsonl=self.jsonl, sources=[d.source for d in job.documents],
                               n_prompts=len(job.prompts))
            try:
                for f in failed:  # inputs that never reached the collection: reported, the rest go on
                    for i, prompt in enumerate(job.prompts, start=1):
                        s = Summary(f["source"], "", prompt, i, error=f["error"])
                        self.report.failed.append({"source": s.source, "prompt_index": i, "error": s.error})
                        outputs.write(s)
                        yield s
                yield from job.run(outputs=outputs)
                outputs.finish()
            finally:
                outputs.close()

    def result(self) -> list[Summary]:
        """Run to the end; every summary, in order."""
        return list(self)


def summarize(rt: "Runtime", paths: Iterable[str | Path] | None = None, *, prompts: Sequence[str] | None = None,
              max_tokens: int | None = None, restart: bool = False, out_dir: str | Path | None = None,
              jsonl: str | Path | None = None, progress: Callable[[SummaryEvent], None] | None = None
              ) -> SummaryRun:
    """:meth:`Pipeline.summarize <pipeline.api.Pipeline.summarize>`: a run that ingests ``paths`` first."""
    return SummaryRun(lambda: prepare(rt, paths, prompts=prompts, max_tokens=max_tokens, ingest_first=True),
                      restart=restart, out_dir=out_dir, jsonl=jsonl, progress=progress)


def status(rt: "Runtime", paths: Iterable[str | Path] | None = None, *, prompts: Sequence[str] | None = None,
           max_tokens: int | None = None) -> dict:
    """:meth:`Pipeline.summary_status <pipeline.api.Pipeline.summary_status>`: how far that job has got;
    changes nothing."""
    job, jobs, failed, _ = prepare(rt, paths, prompts=prompts, max_tokens=max_tokens, ingest_first=False)
    with jobs:
        out = job.status()
    out["not_ingested"] = [f["source"] for f in failed]
    return out


def prepare(rt: "Runtime", paths: Iterable[str | Path] | None, *, prompts: Sequence[str] | None,
            max_tokens: int | None, ingest_first: bool) -> "tuple[Job, JobStore, list[dict], list[dict]]":
    """The job ``summarize`` with these arguments runs, its open job store, and the inputs that failed to
    load and were skipped (each ``{"source", "error"}``); with ``ingest_first``, new and changed paths are
    ingested now."""
    m = rt.config.summarize
    prompts = list(prompts) if prompts else [m.prompt]
    if not all(p.strip() for p in prompts):
        raise InputError("a prompt is empty")
    documents, failed, skipped = _documents(rt, paths, ingest_first=ingest_first)
    s = rt.engine.settings
    settings = Settings(max_tokens=max_tokens or m.max_tokens, temperature=m.temperature,
                        repeat_penalty=m.repeat_penalty, seed=s.seed, system=rt.config.ask.system_prompt,
                        reserve=rt.reserve(max_tokens), compose=rt.compose_policy.enabled)
    jobs = open_jobs(rt)
    collection = rt.config.store.collection
    job = Job(engine=rt.engine, jobs=jobs, open_store=rt.store, collection=collection, documents=documents,
              prompts=prompts, settings=settings, section_target=rt.section_tokens, memo=rt.section_memo,
              record=lambda keys: rt.pack_history.record(rt.engine.namespace, collection, keys))
    return job, jobs, failed, skipped


def _documents(rt: "Runtime", paths: Iterable[str | Path] | None, *, ingest_first: bool
               ) -> tuple[list, list[dict], list[dict]]:
    """The catalog's records of the documents to summarise (those under ``paths``, else the whole
    collection), and the inputs that failed and were skipped."""
    from ..collection import ingest
    from ..ingest.scan import scan

    failed: list[dict] = []
    skipped: list[dict] = []
    wanted: list[str] | None = None
    if paths is not None and list(paths):
        paths = list(paths)
        if ingest_first:
            report = ingest(rt, paths)
            # report paths are the documents' sources (absolute, as found)
            wanted = [f.path for f in report.files if f.status in ("new", "changed", "unchanged")]
            failed = [{"source": f.path, "error": f.reason or f.status} for f in report.files if f.status == "failed"]
            skipped = [{"source": f.path, "error": f.reason or f.status}
                       for f in report.files if f.status == "skipped"]
        else:
            wanted = [str(f.path) for f in scan(paths).files]
    with rt.store(create=False) as store:
        store.require()
        known = store.documents()
        if wanted is None:
            if not known:
                raise StoreError(f"collection '{store.name}' is empty; run `rag ingest PATH` first")
            return list(known.values()), failed, skipped
        if not ingest_first:
            failed = [{"source": s, "error": "not ingested"} for s in wanted if s not in known]
        return [known[s] for s in wanted if s in known], failed, skipped


def open_jobs(rt: "Runtime") -> JobStore:
    """The job store: in the shared PostgreSQL catalog when there is one, else ``jobs.sqlite`` in the store."""
    if rt.config.store.catalog_url:  # job state lives with the shared catalog
        from .jobstore_pg import PostgresJobStore

        return PostgresJobStore(rt.config.store.catalog_url)
    return SQLiteJobStore(rt.config.store_path / "jobs.sqlite")


__all__ = ["SummaryRun", "open_jobs", "prepare", "status", "summarize"]
