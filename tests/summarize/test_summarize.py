"""``rag summarize``: whole documents and map-reduce, shared prefixes, resumable jobs, outputs.

Fast tests run the job logic on a deterministic fake engine (its output names the
chunks its prompt covered, so the reduce tree can be checked; ``tests/support/summarize_fakes.py``);
the real-model tests run SmolLM2 with small contexts and short outputs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from support.summarize_fakes import FakeMultiEngine, doc_chunks, fake_job
from pipeline.ask import packing
from pipeline.ask.prompt import layout_reserve
from pipeline.cli import cli
from pipeline.summarize.jobstore import SQLiteJobStore
from pipeline.store import sections as section_rows
from pipeline.summarize.outputs import output_names


# -- fast tests ----------------------------------------------------------------------------------


def test_map_steps_run_over_the_catalogs_fixed_sections_in_order(tmp_path):
    # The document is cut into the catalog's sections (recorded, as ``ask`` would cut and read them);
    # each map prompt holds a run of consecutive whole sections, page-marked as ``ask`` renders them.
    job, jobs, engine = fake_job(tmp_path, {"/docs/long.txt": doc_chunks(23)}, n_ctx=200, max_tokens=20,
                                 section_target=40)
    with job.open_store() as store:  # a read cuts the sections and writes nothing: recording them is the caller's step
        shelf = packing.gather(store, sources=None, target=40, fetch_tokens=2**62)
        assert list(shelf.cut_now) == ["/docs/long.txt"]
        docs = [(s, d.content_hash) for s, d in store.documents().items()]
        assert section_rows.read(store.catalog.db, "c", docs) == {}
    with jobs:
        (long,) = list(job.run())
    recorded = section_rows.read(_db(job), "c",
                                 [("/docs/long.txt", long.content_hash)])["/docs/long.txt"]
    assert len(recorded) >= 10 and long.method == "map-reduce" and long.sections == len(recorded)
    maps = [p for p in engine.prompts if "(The numbered documents are partial" not in p]
    assert 1 < len(maps) < len(recorded)  # several sections per map prompt, as many as fit
    shown = [[int(x) for x in re.findall(r"\(section (\d+) of \d+\)", p)] for p in maps]
    assert sum(shown, []) == list(range(1, len(recorded) + 1))  # every section once, in order
    assert all(p.startswith("SYSTEM Be brief. USER Documents: [1] long.txt (section ") for p in maps)
    assert long.text.split()[0] == "C0..C22"


def test_ask_and_summarize_decide_the_layout_with_one_reserve(tmp_path):
    # Document sizes on both sides of the two old edges (ask held back ask.max_tokens, summaries
    # summarize.max_tokens): with the one reserve, a document ``ask`` packs whole is summarised whole,
    # one it packs in sections goes map-reduce, whatever answer length a call asks for.
    n_ctx, ask_max, summarize_max = 400, 4, 40
    reserve = layout_reserve(n_ctx, ask_max, summarize_max)
    assert reserve == summarize_max and layout_reserve(n_ctx, ask_max, summarize_max, 1) == reserve
    assert layout_reserve(120, ask_max, summarize_max) == 30  # at most a quarter of the context
    assert layout_reserve(n_ctx, ask_max, summarize_max, 90) == 90  # a longer call holds back its own
    new, old = [], []
    for n in range(9, 16):
        job, jobs, engine = fake_job(tmp_path / str(n), {"/d/a.txt": doc_chunks(n)}, n_ctx=n_ctx,
                                     max_tokens=summarize_max, reserve=reserve, section_target=60)
        with jobs:
            (summary,) = list(job.run())
        with job.open_store() as store:
            shelf = packing.gather(store, sources=None, target=60, fetch_tokens=2**62)

        def ask_mode(r: int) -> str:
            prompt = packing.pack_shelf(shelf, "What now?", layout=job.layout, tokenize=engine.tokenize, memo=job.memo,
                                        n_ctx=n_ctx, reserve=r)
            return prompt.mode

        new.append((ask_mode(reserve), summary.method))
        old_job, old_jobs, _ = fake_job(tmp_path / f"old{n}", {"/d/a.txt": doc_chunks(n)}, n_ctx=n_ctx,
                                        max_tokens=summarize_max, section_target=60)  # its own reserve only
        with old_jobs:
            (old_summary,) = list(old_job.run())
        old.append((ask_mode(ask_max), old_summary.method))
    assert set(new) == {("whole", "whole"), ("sections", "map-reduce")}  # both sides of the edge, agreeing
    assert ("whole", "map-reduce") in old  # the sizes between the old edges were laid out differently


def _db(job):
    with job.open_store() as store:
        return store.catalog.db


def test_a_long_document_goes_map_reduce_in_levels_and_every_section_contributes(tmp_path):
    job, jobs, engine = fake_job(tmp_path, {"/docs/long.txt": doc_chunks(100), "/docs/short.txt": doc_chunks(1)},
                                 n_ctx=160, max_tokens=20)
    with jobs:
        out = {s.source: s for s in job.run()}
    long, short = out["/docs/long.txt"], out["/docs/short.txt"]
    assert short.method == "whole" and short.text.startswith("C0..C0 ")
    assert long.method == "map-reduce" and long.sections >= 10 and long.levels >= 2
    assert long.text.split()[0] == "C0..C99"  # every chunk, through its section, reached the final result
    assert "map-reduce over" in long.method_label and f"{long.sections} sections" in long.method_label
    maps = [p for p in engine.prompts if "(The numbered documents are partial" not in p]
    assert len(maps) >= 10 + 1  # the map prompts, plus the short document
    assert long.reduce_steps == len(engine.prompts) - len(maps)
    assert all(len(engine.tokenize(p)) + 20 <= 160 for p in engine.prompts)  # every prompt fitted the context


def test_prompts_over_one_prefix_are_decoded_together_where_the_engine_can(tmp_path):
    docs = {"/d/long.txt": doc_chunks(40), "/d/short.txt": doc_chunks(2)}
    prompts = ("One.", "Two.", "Three.")
    job, jobs, alone = fake_job(tmp_path / "a", docs, n_ctx=200, prompts=prompts, max_tokens=20)
    with jobs:
        expected = [(s.source, s.text, s.method) for s in job.run()]
    job, jobs, multi = fake_job(tmp_path / "b", docs, n_ctx=200, prompts=prompts, max_tokens=20,
                                engine=FakeMultiEngine(200))
    with jobs:
        got = [(s.source, s.text, s.method) for s in job.run()]
    assert got == expected and {m for _, _, m in got} == {"whole", "map-reduce"}
    n_maps = sum(1 for p in multi.prompts if "(The numbered documents are partial" not in p) - len(prompts)
    assert multi.together == [3] * (n_maps // 3 + 1)  # every map run and the short document: 3 prompts at once
    assert multi.prompts == alone.prompts


def test_units_decoded_together_are_committed_together(tmp_path, monkeypatch):
    # A kill between two units of one group must not leave half a group done: a resumed job would
    # then decode fewer sequences together, and on several threads that may change greedy output.
    commits: list[int] = []
    real = SQLiteJobStore.commit_units
    monkeypatch.setattr(SQLiteJobStore, "commit_units", lambda self, rows: (commits.append(len(rows)), real(self, rows)))
    job, jobs, multi = fake_job(tmp_path, {"/d/short.txt": doc_chunks(2)}, n_ctx=200, prompts=("One.", "Two."),
                                engine=FakeMultiEngine(200))
    with jobs:
        list(job.run())
        assert commits == [2] and jobs.db.execute("SELECT COUNT(DISTINCT finished_at) FROM units").fetchone()[0] == 1


def test_rerun_does_nothing_and_a_changed_document_redoes_only_its_own_units(tmp_path):
    docs = {"/d/a.txt": doc_chunks(12), "/d/b.txt": doc_chunks(12)}
    job, jobs, engine = fake_job(tmp_path, docs, n_ctx=160, prompts=("One.", "Two."))
    with jobs:
        first = [s.text for s in job.run()]
        n_first = len(engine.prompts)
    assert job.report.units_computed == n_first > 4
    job, jobs, engine = fake_job(tmp_path, docs, n_ctx=160, prompts=("One.", "Two."))
    with jobs:
        assert [s.text for s in job.run()] == first
        assert engine.prompts == [] and job.report.results_reused == 4
        assert job.status()["state"] == "done"
    docs["/d/b.txt"] = [t.replace("w3x5", "changed") for t in docs["/d/b.txt"]]  # b changes: a new content hash
    job, jobs, engine = fake_job(tmp_path, docs, n_ctx=160, prompts=("One.", "Two."))
    with jobs:
        result = {(s.source, s.prompt_index): s for s in job.run()}
    assert result[("/d/a.txt", 1)].reused and result[("/d/a.txt", 2)].reused
    assert not result[("/d/b.txt", 1)].reused and job.report.units_computed == n_first // 2
    assert all("b.txt" in p and "a.txt" not in p for p in engine.prompts)


def test_restart_discards_the_job_and_status_reports_progress(tmp_path):
    docs = {"/d/a.txt": doc_chunks(12)}
    job, jobs, engine = fake_job(tmp_path, docs, n_ctx=160)
    with jobs:
        assert job.status()["state"] == "not started"
        list(job.run())
        st = job.status()
        assert st["state"] == "done" and st["items"][0]["method"] == "map-reduce"
        assert job.forget() > 0
        assert job.status()["state"] == "not started"
        n_first = len(engine.prompts)
        list(job.run())
        assert len(engine.prompts) == 2 * n_first  # everything computed again
        assert job.report.units_computed == 2 * n_first  # (over both runs of this Job)


def test_a_document_that_cannot_be_summarised_fails_alone(tmp_path):
    # a.txt needs map-reduce but two partials cannot fit this context: it fails, the other is summarised.
    job, jobs, _ = fake_job(tmp_path, {"/d/a.txt": doc_chunks(3, words=150), "/d/b.txt": doc_chunks(1)},
                            n_ctx=120, max_tokens=40)
    with jobs:
        out = {s.source: s for s in job.run()}
    assert out["/d/a.txt"].error and "raise engine.n_ctx" in out["/d/a.txt"].error
    assert out["/d/b.txt"].ok and out["/d/b.txt"].method == "whole"
    assert job.report.failed == [{"source": "/d/a.txt", "prompt_index": 1, "error": out["/d/a.txt"].error}]


def test_output_names_are_file_names_unless_they_repeat():
    assert output_names(["/x/docs/a.pdf", "/x/docs/b.md"]) == {"/x/docs/a.pdf": "a.pdf", "/x/docs/b.md": "b.md"}
    assert output_names(["/x/docs/one/a.pdf", "/x/docs/two/a.pdf"]) == {
        "/x/docs/one/a.pdf": "one__a.pdf", "/x/docs/two/a.pdf": "two__a.pdf"}


# -- the real model ------------------------------------------------------------------------------

FAST = {"engine__n_ctx": 1024, "cache__min_tokens": 16}


def _ask_prompt(rag, doc: Path, instruction: str):
    """The prompt ``rag ask --doc`` builds for ``doc`` with ``instruction`` as its question (auto mode)."""
    prompt = rag.prompt(instruction, doc=str(doc.resolve()), mode="auto")
    return prompt


def _suffix(rag, instruction: str) -> int:
    """Tokens of a summary prompt after the document: the instruction and the template's tail."""
    return len(rag.runtime.layout().suffix(instruction, rag.engine.tokenize))


def test_two_prompts_prefill_the_document_once(make_pipeline, corpus, tmp_path):
    doc = corpus / "guide.md"
    rag = make_pipeline(**FAST)
    first, second = rag.summarize([doc], prompts=["Summarise in one sentence.", "List the flags it names."],
                                  max_tokens=8).result()  # paths not ingested yet are ingested first
    p1 = _ask_prompt(rag, doc, first.prompt)
    p2 = _ask_prompt(rag, doc, second.prompt)
    assert p1.mode == "whole" and p1.prefix_tokens == p2.prefix_tokens and len(p1.prefix_tokens) > 60
    assert first.method == second.method == "whole" and first.ok and second.ok and first.text
    assert first.stats.cached_tokens == 0 and first.stats.prefill_tokens > len(p1.prefix_tokens)
    assert second.stats.cached_tokens == len(p2.prefix_tokens)  # the document was not prefilled again
    assert first.stats.prefill_tokens == len(p1.prefix_tokens) + _suffix(rag, first.prompt)
    assert second.stats.prefill_tokens == _suffix(rag, second.prompt)  # only the instruction


def test_a_document_summarised_before_prefills_only_the_instruction(make_pipeline, corpus, tmp_path):
    # Both directions, each in a new pipeline (nothing in memory: the state comes from the prefix
    # cache on disk), with prefilled-token counters: summarize and ``ask --doc`` share one prefix.
    doc = corpus / "notes.txt"
    rag = make_pipeline(**FAST)
    rag.ingest([corpus])
    (first,) = rag.summarize([doc], prompts=["Summarise it."], max_tokens=8).result()
    assert first.ok and first.stats.cached_tokens == 0
    # summarize, then ask: the question prefills only itself
    asker = make_pipeline(**FAST)
    answer = asker.ask("Which error code appears?", doc=str(doc))
    expected = _ask_prompt(asker, doc, "Which error code appears?")
    assert answer.stats.mode == "whole" and answer.stats.cached_tokens == len(expected.prefix_tokens) > 40
    assert answer.stats.prefill_tokens == len(expected.tokens) - len(expected.prefix_tokens)
    # ask, then summarize: another document, asked about first, costs its summary only the instruction
    pdf = corpus / "manual.pdf"
    make_pipeline(**FAST).ask("What is on page two?", doc=str(pdf))
    fresh = make_pipeline(**FAST)
    (summary,) = fresh.summarize([pdf], prompts=["List the functions it names."], max_tokens=8).result()
    prompt = _ask_prompt(fresh, pdf, summary.prompt)
    assert summary.method == "whole" and summary.stats.cached_tokens == len(prompt.prefix_tokens)
    assert summary.stats.prefill_tokens == _suffix(fresh, summary.prompt)
    assert re.search(r"\[\d+, p\. 2\]", fresh.engine.llm.detokenize(prompt.prefix_tokens).decode())  # ask's page marks


def test_a_warmed_document_costs_its_summary_only_the_instruction(make_pipeline, corpus, tmp_path):
    pdf = corpus / "manual.pdf"
    one = {**FAST, "store__collection": "one-doc"}
    rag = make_pipeline(**one)
    rag.ingest([pdf])
    (item,) = rag.warm()["prefixes"]
    assert item["outcome"] == "saved"
    fresh = make_pipeline(**one)
    (summary,) = fresh.summarize([pdf], prompts=["Summarise it."], max_tokens=8).result()
    prompt = _ask_prompt(fresh, pdf, summary.prompt)
    assert item["tokens"] == len(prompt.prefix_tokens)  # warm saved exactly this prompt's prefix
    assert summary.stats.cached_tokens == len(prompt.prefix_tokens)
    assert summary.stats.prefill_tokens == _suffix(fresh, summary.prompt)


def test_cli_files_jsonl_status_failures_and_stdout(store_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("RAG_CACHE_MIN_TOKENS", "16")
    docs = tmp_path / "docs"
    (docs / "one").mkdir(parents=True)
    (docs / "two").mkdir()
    (docs / "one" / "notes.txt").write_text("The error code ERR_SOCKET_ZX81 appears when the server is down.\n")
    (docs / "two" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# one instruction per line\nSummarise in one sentence.\n\n")
    runner = CliRunner()
    args = ["summarize", str(docs), "--prompt-file", str(prompts), "--max-tokens", "6", "--ctx", "1024"]
    res = runner.invoke(cli, args + ["--out", str(tmp_path / "md"), "--jsonl", str(tmp_path / "s.jsonl"), "--json"])
    assert res.exit_code == 1, res.output  # the broken file failed; the others were summarised
    report = json.loads(res.stdout)
    assert [f["source"] for f in report["failed"]] == [str((docs / "broken.pdf").resolve())]
    assert report["methods"] == {"whole": 2} and report["units_computed"] == 2
    assert sorted(p.name for p in (tmp_path / "md").iterdir()) == ["one__notes.txt.summary.md",
                                                                    "two__notes.txt.summary.md"]
    md = (tmp_path / "md" / "one__notes.txt.summary.md").read_text()
    first = next(s for s in report["summaries"] if s["source"].endswith("one/notes.txt"))
    assert "- method: whole document" in md and first["summary"] in md and "- prompt: Summarise in one" in md
    lines = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert [x["source"][len(str(docs.resolve())):] for x in lines] == ["/broken.pdf", "/one/notes.txt",
                                                                      "/two/notes.txt"]
    assert "error" in lines[0] and lines[1]["summary"] == first["summary"] and lines[1]["method"] == "whole"

    status = runner.invoke(cli, args + ["--status", "--json"])
    assert status.exit_code == 0, status.output
    st = json.loads(status.stdout)
    assert st["state"] == "done" and st["summaries_done"] == 2 and st["job_id"] == report["job_id"]
    assert runner.invoke(cli, args + ["--status"]).output.startswith(f"job {report['job_id']}")
    again = runner.invoke(cli, args)  # to stdout, nothing computed, nothing written
    assert again.exit_code == 1 and first["summary"] in again.stdout and "(whole document)" in again.stdout
    assert "0 units computed" in again.stderr and "failed: " in again.stderr


def test_summarize_errors_are_messages(store_dir, tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["summarize", str(tmp_path / "missing")])
    assert res.exit_code == 2 and "does not exist" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, ["summarize", "-p", "  ", str(tmp_path)])
    assert res.exit_code == 2 and "prompt is empty" in res.output
    (tmp_path / "prompts.txt").write_text("# nothing but a comment\n")
    res = runner.invoke(cli, ["summarize", "--prompt-file", str(tmp_path / "prompts.txt")])
    assert res.exit_code == 2 and "holds no instruction" in res.output


# A context where the two old edges lie apart: ask held back 16 tokens, summaries 96. The one reserve
# is 96 (the larger, under a quarter of the context).
EDGES = {"engine__n_ctx": 1024, "ask__max_tokens": 16, "summarize__max_tokens": 96, "cache__min_tokens": 16}
_TOPICS = ["pumps", "valves", "filters", "sensors", "cables", "motors", "fans", "seals", "gears", "belts"]


def _between_the_old_edges(folder: Path, name: str) -> Path:
    """A generated service note whose size (as packed) lies between the two old edges."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = folder / name
    doc.write_text("# Service notes\n\n" + "\n\n".join(
        f"Part {i + 1} is about the {_TOPICS[i % 10]}. The {_TOPICS[i % 10]} of unit {i + 1} are checked every "
        f"{i + 3} weeks, and a worn one is replaced with spare number {1000 + i}." for i in range(18)))
    return doc


def _old_edges(rag, doc: Path) -> tuple[int, int, int]:
    """(the document's packed tokens, the old ask edge, the old summary edge) for a short question."""
    from pipeline.ask import packing as p

    with rag.store(create=False) as store:
        shelf = p.gather(store, sources=[str(doc.resolve())], target=rag.section_tokens, fetch_tokens=2**62)
    tokens = sum(len(s.tokens) for s in p.number(shelf, shelf.sections, rag.runtime.section_memo))
    layout, n_ctx = rag.runtime.layout(), rag.engine.n_ctx
    ask_edge = layout.budget(n_ctx=n_ctx, reserve=16, suffix_tokens=0)
    summary_edge = layout.budget(n_ctx=n_ctx, reserve=96, suffix_tokens=_suffix(rag, rag.config.summarize.prompt))
    return tokens, ask_edge, summary_edge


def test_a_document_between_the_old_edges_is_laid_out_alike_and_reused_both_ways(make_pipeline, tmp_path):
    # Before, such a document went whole in `ask` and map-reduce in `summarize`. Now both cut it the same
    # way: summarize, then ask (new pipelines, states from disk): the question prefills only itself;
    # ask, then summarize: the summary's first run is the question's pack and prefills only its instruction.
    question = "Which spare number replaces a worn pump of unit 1?"
    doc = _between_the_old_edges(tmp_path, "service.md")
    rag = make_pipeline(**EDGES, store__collection="first-summary")
    rag.ingest([doc])
    tokens, ask_edge, summary_edge = _old_edges(rag, doc)
    assert summary_edge < tokens <= ask_edge  # between the old edges
    (summary,) = make_pipeline(**EDGES, store__collection="first-summary").summarize([doc]).result()
    assert summary.ok and summary.method == "map-reduce" and summary.units_computed == 3
    asker = make_pipeline(**EDGES, store__collection="first-summary")
    answer = asker.ask(question, doc=str(doc), max_tokens=8)  # a shorter answer: the same layout
    prompt = _ask_prompt(asker, doc, question)
    assert answer.stats.mode == "sections" and [s["section"] for s in answer.stats.sections] == [0, 1]
    assert answer.stats.cached_tokens == len(prompt.prefix_tokens)  # the summary's first run, from disk
    assert answer.stats.prefill_tokens == len(prompt.tokens) - len(prompt.prefix_tokens)  # only the question

    other = _between_the_old_edges(tmp_path, "spares.md")  # another name: other tokens
    first = make_pipeline(**EDGES, store__collection="first-ask")
    first.ingest([other])
    asked = first.ask(question, doc=str(other))
    assert asked.stats.mode == "sections" and asked.stats.cache == "miss"
    fresh = make_pipeline(**EDGES, store__collection="first-ask")
    (later,) = fresh.summarize([other]).result()
    pack = _ask_prompt(fresh, other, question)
    assert later.method == "map-reduce" and later.units_computed == 3  # two runs and the reduce step
    # the first run is the question's pack, restored from disk; the later run and the reduce step each start
    # from the template's head (a tokenizer that merges across the head's end gives the reduce step none)
    head = len(fresh.runtime.layout().head_tokens)
    assert later.stats.cached_tokens - len(pack.prefix_tokens) in (head, 2 * head)


def test_after_warm_for_summaries_every_summary_prefills_only_its_instruction(make_pipeline, corpus, tmp_path,
                                                                                monkeypatch):
    # The collection fits whole. `rag warm` alone saves its one prefix, which only the first document's
    # summary (in path order) starts from; `rag warm --for summarize` saves each document's own prefix
    # and says what it prefilled and wrote; then every summary prefills only its instruction.
    for key, value in {"RAG_ENGINE_N_CTX": "1024", "RAG_CACHE_MIN_TOKENS": "16"}.items():
        monkeypatch.setenv(key, value)
    runner = CliRunner()
    out = runner.invoke(cli, ["ingest", str(corpus), "--warm"])
    assert out.exit_code == 0, out.output
    assert "warmed the whole collection (4 documents)" in out.output
    assert "`rag warm --for summarize` saves those too" in out.output
    out = runner.invoke(cli, ["warm", "--for", "summarize", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["mode"] == "whole" and len(report["prefixes"]) == 4
    first, *others = report["prefixes"]
    assert first["outcome"] == "cached" and first["prefilled"] == 0  # the collection's prefix up to its end
    assert all(p["outcome"] == "saved" and p["prefilled"] == p["tokens"] and p["bytes"] > 0 for p in others)
    assert report["prefilled_tokens"] == sum(p["tokens"] for p in others)
    assert report["bytes_written"] == sum(p["bytes"] for p in report["prefixes"])
    text = runner.invoke(cli, ["warm", "--for", "summarize"]).output
    assert "each document's own prefix" in text and "0 saved, 4 already cached" in text
    assert "0 tokens prefilled, 0.0 MB of states written" in text

    rag = make_pipeline(**FAST)
    summaries = rag.summarize(prompts=["Summarise it."], max_tokens=4).result()  # a new process: states from disk
    assert [Path(s.source).name for s in summaries] == ["guide.md", "manual.pdf", "notes.txt", "page.html"]
    for s, warmed in zip(summaries, report["prefixes"]):
        prompt = _ask_prompt(rag, Path(s.source), s.prompt)
        assert s.ok and s.method == "whole" and len(prompt.prefix_tokens) == warmed["tokens"]
        assert s.stats.cached_tokens == warmed["tokens"] and s.stats.prefill_tokens == _suffix(rag, s.prompt)
