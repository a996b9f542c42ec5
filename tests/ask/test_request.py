"""One request per call: ``AskRequest`` checks every per-call option once, when it is made, and the ask path
takes it down unchanged (the CLI, the API and the asyncio API all build one). No model loads."""

from __future__ import annotations

import pytest
from support.fakes import EchoGenerator

from pipeline import AskRequest
from pipeline.ask.request import AskOptions
from pipeline.config import AskConfig
from pipeline.errors import ConfigError, InputError

Q = "Which fruit is rich in potassium?"


@pytest.mark.parametrize("bad, message", [
    ({"temperature": -1}, "temperature"), ({"temperature": 6}, "temperature"), ({"temperature": "hot"}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 2.5}, "max_tokens"), ({"top_k": 0}, "top_k"),
    ({"top_k": 1001}, "top_k"), ({"mode": "sections"}, "mode must be one of auto, passages"),
    ({"stop": [1, 2]}, "stop"), ({"top_k": True}, "top_k"), ({"stop": ["a\ud800"]}, "a stop string is not valid text"),
    ({"system_prompt": "x\0y"}, "NUL"), ({"system_prompt": "\udcff"}, "the system prompt is not valid text"),
    ({"history": [{"role": "user", "content": "\ud800"}]}, "an earlier turn is not valid text"),
])
def test_a_bad_option_is_refused_when_the_request_is_made(bad, message):
    with pytest.raises(InputError, match=message):
        AskRequest(Q, **bad)


def test_an_empty_question_is_refused():
    for question in ("", "   ", None):
        with pytest.raises(InputError, match="the question is empty"):
            AskRequest(question)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="the question is not valid text: character 6"):
        AskRequest("what \udcff is it")  # undecodable bytes of a command-line argument


def test_options_left_out_come_from_the_ask_settings():
    ask = AskConfig(max_tokens=99, temperature=0.5, top_k=4, mode="passages", system_prompt="Be brief.")
    assert AskRequest(Q).options(ask) == AskOptions(temperature=0.5, max_tokens=99, system_prompt="Be brief.",
                                                     stop=(), top_k=4, mode="passages")
    given = AskRequest(Q, max_tokens=3, temperature=0, top_k=1, mode="auto", system_prompt="", stop="END")
    assert given.options(ask) == AskOptions(temperature=0.0, max_tokens=3, system_prompt="", stop=("END",), top_k=1,
                                            mode="auto")
    assert AskOptions.resolve(ask, max_tokens=3) == AskRequest(Q, max_tokens=3).options(ask)


def test_the_request_normalises_what_it_was_given(tmp_path):
    r = AskRequest(Q, doc=tmp_path / "a.md", source=[str(tmp_path)], stop=["", "x"], history=[{"role": "user",
                                                                                                   "content": "hi"}])
    assert r.doc == (tmp_path / "a.md",) and r.source == (str(tmp_path),) and r.stop == ("x",)
    assert r.history == ({"role": "user", "content": "hi"},) and not r.whole_document
    assert AskRequest(Q, doc=["a.md"]).whole_document and AskRequest(Q).history is None
    assert r.text == "hi\n\nQuestion: " + Q and r.query == "hi\n" + Q  # a follow-up's transcript and query
    assert AskRequest(Q).text == AskRequest(Q).query == Q


def test_make_takes_a_request_as_it_is_and_refuses_options_beside_it():
    request = AskRequest(Q, top_k=2)
    assert AskRequest.make(request) is request and AskRequest.make(request, mode=None) is request
    with pytest.raises(InputError, match="options go into the AskRequest"):
        AskRequest.make(request, top_k=3)
    assert AskRequest.make(Q, top_k=None, mode="passages") == AskRequest(Q, mode="passages")


def test_a_bad_ask_mode_in_the_settings_is_a_configuration_error():
    with pytest.raises(ConfigError, match="ask.mode must be one of auto, passages"):
        AskConfig(mode="sections").validate()


@pytest.fixture
def ingested(fake_pipeline, corpus):
    fake_pipeline().ingest([corpus])
    return corpus


def test_the_pipeline_takes_a_request_and_answers_as_with_keywords(fake_pipeline, ingested):
    rag = fake_pipeline(ask__max_tokens=8)
    by_keywords = rag.ask(Q, top_k=1, mode="passages")
    by_request = rag.ask(AskRequest(Q, top_k=1, mode="passages"))
    assert by_request.text == by_keywords.text and by_request.sources == by_keywords.sources
    assert len(by_request.sources) == 1 and by_request.stats.mode == "passages"


def test_the_request_reaches_the_engine(fake_pipeline, ingested):
    generator = EchoGenerator(n_ctx=1024)
    rag = fake_pipeline(generator=generator)
    seen = []
    real = generator.generate

    def generate(tokens, **kw):
        seen.append(kw)
        return real(tokens, **kw)

    generator.generate = generate
    answer = rag.ask(AskRequest(Q, max_tokens=5, temperature=0.25, stop=["zz"]))
    assert seen[-1]["max_tokens"] == 5 and seen[-1]["temperature"] == 0.25
    assert answer.stats.decode_tokens <= 5


def test_prompt_is_the_prompt_ask_sends(fake_pipeline, ingested):
    generator = EchoGenerator(n_ctx=1024)
    rag = fake_pipeline(generator=generator, ask__max_tokens=8)
    prompt = rag.prompt(Q, top_k=2)
    rag.ask(Q, top_k=2)
    assert generator.prompts[-1] == prompt.tokens and prompt.sources and prompt.mode == "whole"
    assert rag.prompt(AskRequest(Q, mode="passages")).mode == "passages"


def test_a_bad_option_fails_before_anything_is_read(fake_pipeline):
    rag = fake_pipeline()  # nothing ingested: a good request would fail on the empty store
    with pytest.raises(InputError, match="top_k"):
        rag.ask(Q, top_k=0)
    assert not rag.runtime.has("pool")


def test_search_refuses_what_cannot_be_a_query(fake_pipeline):
    rag = fake_pipeline()
    for bad, message in (("\ud800", "the query is not valid text"), ("  ", "the query is empty")):
        with pytest.raises(InputError, match=message):
            rag.search(bad)
    for top_k in (0, -1, 10**30, True):
        with pytest.raises(InputError, match="top_k must be between 1 and 1000"):
            rag.search("tomato", top_k=top_k)
