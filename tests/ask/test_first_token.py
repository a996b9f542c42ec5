"""The wait a person sees for the first answer text (``start_to_first_token_seconds``), and what shortens it:
the generator loading beside retrieval, safely, and text passed on as soon as it cannot be a stop."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from pipeline.ask.started import Start, process_start
from pipeline.ask.stops import until_stop
from pipeline.cli import cli

FAST = {"engine__n_ctx": 768, "ask__max_tokens": 6, "ask__top_k": 2, "ask__neighbours": 0}
QUESTIONS = ("Which fruit is rich in potassium?", "What does --n-cpu-moe do?")


def _figure(stats) -> float:
    d = stats if isinstance(stats, dict) else stats.to_dict()
    return d["start_to_first_token_seconds"]


def test_the_library_reports_the_wait_from_the_call(fake_pipeline, corpus):
    rag = fake_pipeline()
    rag.ingest([corpus])
    answer = rag.ask(QUESTIONS[0])
    st = answer.stats
    assert st.start_point == "call" and _figure(st) >= st.ttft_seconds > 0
    assert answer.to_dict()["stats"]["start_to_first_token_seconds"] == round(_figure(st), 4)
    called = time.perf_counter()
    with rag.ask_stream(QUESTIONS[0]) as stream:  # a stream counts from its call to its first piece
        first = next(iter(stream))
        at_first = time.perf_counter() - called
        answer = stream.result()
    assert first and answer.stats.start_point == "call" and _figure(answer.stats) <= at_first
    # a start given with the request (a server's request, a command's process) is where it counts from
    earlier = Start.now("request")
    answer = rag.ask(rag_request(QUESTIONS[0], start=earlier))
    assert answer.stats.start_point == "request" and _figure(answer.stats) <= earlier.seconds()
    assert all(a.stats.start_to_first_token_seconds is None for a in rag.ask_many(list(QUESTIONS)))


def rag_request(question: str, **fields):
    from pipeline.ask.request import AskRequest

    return AskRequest(question, **fields)


def test_the_process_start_comes_from_the_kernel():
    start = process_start()
    assert start.point == "process"  # Linux: /proc/self/stat
    # this test process started before this test did, and not before the machine did
    assert 0.0 < start.seconds() < float(open("/proc/uptime").read().split()[0]) + 1.0


def test_rag_ask_reports_the_wait_from_its_start_in_json_and_stats(store_dir, corpus):
    runner = CliRunner()
    assert runner.invoke(cli, ["ingest", str(corpus)]).exit_code == 0
    args = ["ask", QUESTIONS[0], "--ctx", "768", "--max-tokens", "6", "-k", "2"]
    result = runner.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    st = json.loads(result.stdout)["stats"]
    assert st["start_point"] == "process" and st["start_to_first_token_seconds"] >= st["ttft_seconds"] > 0
    result = runner.invoke(cli, [*args, "--stats"])
    assert result.exit_code == 0, result.output
    assert "TTFT" in result.stderr and " (from the start " in result.stderr
    # several questions: the first counts from the start, the next from its own turn
    result = runner.invoke(cli, ["ask", *QUESTIONS, "--ctx", "768", "--max-tokens", "6", "-k", "2", "--json"])
    lines = [json.loads(line)["stats"] for line in result.stdout.splitlines()]
    assert [s["start_point"] for s in lines] == ["process", "call"]


def test_two_threads_asking_a_new_pipeline_at_once_load_the_generator_once(make_pipeline, ingested, monkeypatch):
    import pipeline.engine.local as local
    from pipeline.runtime import Runtime

    reference = make_pipeline(**FAST)
    expected = {q: reference.ask(q).text for q in QUESTIONS}
    loads, real, background, real_background = [], local.load_generator, [], Runtime._load_generator

    def counted(*args, **kwargs):
        loads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    def started(runtime, *args) -> None:
        background.append(threading.current_thread().name)
        real_background(runtime, *args)

    monkeypatch.setattr(local, "load_generator", counted)
    monkeypatch.setattr(Runtime, "_load_generator", started)
    rag = make_pipeline(**FAST)
    barrier, got, errors = threading.Barrier(2), {}, []

    def ask(q: str) -> None:
        try:
            barrier.wait()
            got[q] = rag.ask(q)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(q,)) for q in QUESTIONS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    assert {q: a.text for q, a in got.items()} == expected and all(a.sources for a in got.values())
    assert background == ["rag-load-generator"]  # the first question started loading it beside retrieval
    assert len(loads) == 1  # and it loaded once, however many threads needed it meanwhile
    assert all(_figure(a.stats) >= a.stats.ttft_seconds for a in got.values())


def test_what_other_threads_print_while_the_generator_loads_is_kept(make_pipeline, capfd):
    rag = make_pipeline(**FAST)
    engine = rag.engine  # the model file is found; it has not loaded
    assert "llm" not in engine.__dict__
    rag.runtime.load_generator_soon()
    printed = 0
    while "llm" not in engine.__dict__:  # print through the file descriptors and through sys.stderr
        os.write(1, f"fd line {printed}\n".encode())
        print(f"py line {printed}", file=sys.stderr, flush=True)
        printed += 1
        time.sleep(0.002)
    engine.tokenize("loaded")
    out, err = capfd.readouterr()
    assert printed > 0
    assert out.count("fd line ") == printed and err.count("py line ") == printed


def test_closing_a_pipeline_while_its_generator_loads_waits_for_it_and_closes_it(make_pipeline, monkeypatch):
    import pipeline.engine.local as local

    loaded, real = [], local.load_generator

    def kept(*args, **kwargs):
        loaded.append(real(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(local, "load_generator", kept)
    rag = make_pipeline(**FAST)
    rag.engine  # noqa: B018 - found, not loaded
    rag.runtime.load_generator_soon()
    rag.close()  # the load finishes first, then the model is closed
    assert len(loaded) == 1 and not loaded[0][0].is_open and not rag.runtime.has("engine")


def test_text_reaches_the_reader_as_soon_as_it_cannot_be_a_stop():
    stops = ["<end_of_turn>", "\nQuestion:"]
    pieces = iter(["- Use", " the cache", "\nQue", "stion: next"])
    stream = until_stop(pieces, stops)
    assert next(stream) == "- Use"  # not held until a stop's length of text has come
    assert list(stream) == [" the cache"]
    assert "".join(until_stop(["a <end_of", "_turn> b"], stops)) == "a "
    assert "".join(until_stop(["x\nQuest", "ionable"], stops)) == "x\nQuestionable"


@pytest.mark.parametrize("point", ["call", "request", "process"])
def test_the_json_schema_accepts_each_start(point, fake_pipeline, corpus):
    from pipeline.schemas import validate, versioned

    rag = fake_pipeline()
    rag.ingest([corpus])
    answer = rag.ask(rag_request(QUESTIONS[0], start=Start.now(point)))
    validate("ask", versioned(answer.to_dict()))
    assert answer.to_dict()["stats"]["start_point"] == point


def test_preload_starts_the_load_where_there_is_a_store_to_answer_from(make_pipeline, corpus):
    rag = make_pipeline(**FAST)
    rag.preload()  # no store yet: a question would fail at once, so no model is loaded for it
    assert not rag.runtime.has("engine")
    rag.ingest([corpus])
    rag.preload()
    assert rag.runtime.has("engine")  # found in this thread; llama.cpp loads it in the background
    assert rag.engine.tokenize("Hello")  # waits for that load
    assert rag.ask(QUESTIONS[0]).text


def test_preload_returns_once_llama_cpp_has_begun_loading_and_not_later(make_pipeline, ingested, monkeypatch):
    """What the caller does next (imports, retrieval) would slow the imports the load waits for, since
    Python runs one thread at a time; beside llama.cpp's own load it runs in parallel."""
    import pipeline.engine.loading as loading
    import pipeline.engine.local as local

    events, release = [], threading.Event()
    real_import, real_load = loading.import_bindings, local.load_generator

    def slow_import() -> None:
        time.sleep(0.5)
        real_import()
        events.append("bindings imported")

    def held_load(*args, **kwargs):
        release.wait(10)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(loading, "import_bindings", slow_import)
    monkeypatch.setattr(local, "load_generator", held_load)
    rag = make_pipeline(**FAST)
    rag.preload()
    events.append("preload returned")
    release.set()  # the load could not end before this: preload did not wait for its end
    assert events == ["bindings imported", "preload returned"]
    assert rag.ask(QUESTIONS[0]).text


def test_importing_the_api_leaves_the_ask_path_and_ingest_for_later():
    import subprocess

    script = ("import sys, pipeline.api\n"
              "print(sorted(m for m in ('pipeline.ask.flow', 'pipeline.collection', 'pipeline.ingest.run', 'numpy',"
              " 'llama_cpp', 'chromadb', 'http.client', 'tenacity') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_new_pipeline_reads_the_section_tokens_an_earlier_one_saved(make_pipeline, ingested, monkeypatch):
    """A new process tokenises only the question: the sections' tokens come from ``tokens.sqlite``."""
    import pipeline.engine.local as local

    first = make_pipeline(**FAST)
    answer = first.ask(QUESTIONS[0])
    saved = first.config.cache_path / "tokens.sqlite"
    first.close()
    with sqlite3.connect(saved) as db:
        assert db.execute("SELECT COUNT(*) FROM tokens").fetchone()[0] > 0  # the sections' tokens
    tokenized: list[str] = []
    real = local.Engine.tokenize

    def spy(self, text, **kwargs):
        tokenized.append(text)
        return real(self, text, **kwargs)

    monkeypatch.setattr(local.Engine, "tokenize", spy)
    again = make_pipeline(**FAST).ask(QUESTIONS[0])
    assert again.text == answer.text and again.stats.prompt_tokens == answer.stats.prompt_tokens
    assert tokenized and not [t for t in tokenized if t.startswith("[1] ")]  # no section was tokenised again
    assert any(QUESTIONS[0] in t for t in tokenized)


def test_a_damaged_section_tokens_file_costs_the_saving_not_the_answer(make_pipeline, ingested):
    first = make_pipeline(**FAST)
    expected = first.ask(QUESTIONS[0]).text
    path = first.config.cache_path / "tokens.sqlite"
    first.close()
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    path.write_bytes(b"not a database" * 100)
    assert make_pipeline(**FAST).ask(QUESTIONS[0]).text == expected


def test_the_gil_changes_hands_quickly_while_a_model_loads_and_the_interval_comes_back(model_home, monkeypatch):
    """llama.cpp's loader calls back into Python for every log line: a busy thread beside a load must
    hand the GIL over often, and the process's own switch interval is back once the loads end."""
    import llama_cpp

    from pipeline.engine._llama import LOADING_SWITCH_SECONDS, load
    from pipeline.models import resolve

    seen: list[float] = []
    real = llama_cpp.Llama.__init__

    def spy(self, *args, **kwargs):
        seen.append(sys.getswitchinterval())
        real(self, *args, **kwargs)

    monkeypatch.setattr(llama_cpp.Llama, "__init__", spy)
    before = sys.getswitchinterval()
    path = resolve("builtin:gemma-3-270m", home=model_home)
    models = []
    threads = [threading.Thread(target=lambda: models.append(load(path, n_ctx=256))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for m in models:
        m.close()
    assert len(models) == 2 and seen == [LOADING_SWITCH_SECONDS] * 2
    assert sys.getswitchinterval() == before
