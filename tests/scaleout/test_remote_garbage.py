"""A generator or embedder server that answers garbage: one `Error:` line and exit 6 from the CLI, a 502
``upstream_error`` from `rag serve`, streaming or not, never a traceback or a 500.

The server is :class:`support.upstream_garbage.GarbageServer` (an OpenAI-compatible stand-in that answers one
endpoint with an HTML page, JSON of another shape or a broken event stream); the collection is ingested
with the real local embedder, and the local models answer nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.serving import RagServer, serve_env
from support.upstream_garbage import MODES, GarbageServer

GENERATOR_MODES = [m for m in MODES if not m.startswith("embeddings")]
EMBEDDER_MODES = ["html", *(m for m in MODES if m.startswith("embeddings"))]


@pytest.fixture(scope="module")
def home(tmp_path_factory, model_home):
    """A store with one small document, ingested with the local models."""
    root = tmp_path_factory.mktemp("garbage")
    (root / "docs").mkdir()
    (root / "docs" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    env = serve_env(root, model_home, RAG_REMOTE_MAX_WAIT="3", RAG_REMOTE_CONNECT_TIMEOUT="1")
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(root / "docs")], env=env, check=True,
                   capture_output=True, timeout=300)
    return {"root": root, "env": env}


def _rag(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def _one_error_line(ran: subprocess.CompletedProcess, what: str) -> str:
    assert ran.returncode == 6, (what, ran.returncode, ran.stderr[-2000:])
    assert "Traceback" not in ran.stderr, (what, ran.stderr)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and ran.stderr.strip().endswith(errors[0]), (what, ran.stderr)
    return errors[0]


@pytest.mark.parametrize("mode", GENERATOR_MODES)
def test_rag_ask_with_a_generator_answering_garbage_is_one_error_line_and_exit_6(home, mode):
    with GarbageServer(mode) as fake:
        env = {**home["env"], "RAG_MODELS_GENERATOR": fake.ref}
        for args in (("ask", "What do tomato plants need?"), ("ask", "--json", "What do tomato plants need?")):
            line = _one_error_line(_rag(env, *args), f"{mode} {args}")
            assert "not the OpenAI API" in line and fake.url in line, line
        assert any("/completions" in r or "tokenize" in r or "models" in r for r in fake.requests)


@pytest.mark.parametrize("mode", EMBEDDER_MODES)
def test_an_embedder_answering_garbage_is_one_error_line_and_exit_6(home, mode, tmp_path):
    with GarbageServer(mode) as fake:
        env = {**home["env"], "RAG_MODELS_EMBEDDER": fake.ref}
        line = _one_error_line(_rag(env, "search", "tomato"), f"search {mode}")
        assert "not the OpenAI API" in line, line
        (tmp_path / "more").mkdir()
        (tmp_path / "more" / "a.txt").write_text("Capybaras are the largest rodents.\n")
        other = {**env, "RAG_STORE_PATH": str(tmp_path / "store")}
        line = _one_error_line(_rag(other, "ingest", str(tmp_path / "more")), f"ingest {mode}")
        assert "not the OpenAI API" in line, line


def _ask(server: RagServer, stream: bool) -> tuple[int, dict | None, str]:
    """(status, JSON body of a refused request, the error event of a stream that started)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        body = json.dumps({"stream": stream, "messages": [{"role": "user", "content": "What do tomato plants need?"}]})
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Host": f"127.0.0.1:{server.port}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read().decode()
    finally:
        conn.close()
    if resp.status != 200 or not stream:
        return resp.status, json.loads(raw), ""
    events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith("data: {")]
    return resp.status, None, json.dumps([e for e in events if "error" in e])


def test_rag_serve_answers_502_upstream_error_for_garbage_streaming_or_not(home):
    with GarbageServer("html") as fake:
        env = {**home["env"], "RAG_MODELS_GENERATOR": fake.ref}
        server = RagServer(env, log=home["root"] / "serve-garbage.log").start()
        try:
            for mode in GENERATOR_MODES:  # the probe's failures first: a probe that worked is not repeated
                fake.mode = mode
                for stream in (False, True):
                    status, body, events = _ask(server, stream)
                    assert status == 502, (mode, stream, status, body, events)
                    assert body["error"]["type"] == "upstream_error", (mode, body)
                    assert "not the OpenAI API" in body["error"]["message"], (mode, body)
            assert server.request("GET", "/health")[0] == 200
        finally:
            server.stop()
        out = server.output()
        assert "Traceback" not in out and "internal error" not in out, out[-3000:]


def test_rag_serve_answers_502_for_an_embedder_answering_garbage(home):
    with GarbageServer("embeddings-json") as fake:
        env = {**home["env"], "RAG_MODELS_EMBEDDER": fake.ref}
        server = RagServer(env, log=home["root"] / "serve-garbage-embedder.log").start()
        try:
            for stream in (False, True):
                status, body, _ = _ask(server, stream)
                assert (status, body["error"]["type"]) == (502, "upstream_error"), body
            status, body, _ = server.request("POST", "/search", json_body={"query": "tomato"})
            assert (status, body["error"]["type"]) == (502, "upstream_error"), body
        finally:
            server.stop()
        assert "Traceback" not in server.output()


def test_the_fake_answers_well_outside_its_garbage(home):
    """The stand-in is a usable server where its mode does not apply: the garbage is what fails."""
    with GarbageServer("embeddings-json") as fake:
        env = {**home["env"], "RAG_MODELS_GENERATOR": fake.ref, "RAG_ASK_MAX_TOKENS": "4"}
        ran = _rag(env, "ask", "--json", "What do tomato plants need?")
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["text"] == "Hello."
    assert os.environ.get("RAG_MODELS_GENERATOR") is None
