"""One Pipeline shared by threads: prompts take turns on the engine, never a llama.cpp abort.

Before the engine took turns, three concurrent ``ask`` calls aborted the whole process
(``GGML_ASSERT(n_outputs_prev + n_outputs <= n_outputs_all)``).
"""

from __future__ import annotations

import threading

import pytest

from pipeline.errors import EngineError

FAST = {"engine__n_ctx": 2048, "ask__max_tokens": 8}
QUESTIONS = ["Where do tomatoes grow best?", "What does --n-cpu-moe keep in CPU memory?",
             "What is ERR_SOCKET_ZX81?", "Which fruit is rich in potassium?"]


@pytest.fixture
def shared(make_pipeline, corpus):
    rag = make_pipeline(**FAST)
    rag.ingest([corpus])
    return rag


def test_threads_share_one_pipeline_and_get_the_single_threaded_answers(shared):
    alone = {q: shared.ask(q).text for q in QUESTIONS}
    answers: dict[tuple[int, str], str] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for q in QUESTIONS[i % 2::2]:
                answers[(i, q)] = shared.ask(q).text
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors and len(answers) == 8
    assert all(text == alone[q] for (_, q), text in answers.items())


def test_search_runs_while_another_thread_holds_the_engine(shared):
    stream = shared.ask_stream(QUESTIONS[0])
    first = next(iter(stream))  # this thread now holds the engine, mid-answer
    found: list = []
    t = threading.Thread(target=lambda: found.extend(shared.search("tomatoes")))
    t.start()
    t.join(timeout=120)
    assert found and found[0].source.endswith("page.html")
    with pytest.raises(EngineError, match="still reading an earlier answer"):
        next(iter(shared.ask_stream(QUESTIONS[1])))  # a second prompt on the same thread: refused, no deadlock
    rest = "".join(stream)
    assert (first + rest).strip() == shared.ask(QUESTIONS[0]).text
