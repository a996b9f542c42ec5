"""`rag serve` as a real process on 127.0.0.1, used by the real `openai` client and plain HTTP.

One server for the module (model loads are the slow part): streaming with sources,
4 concurrent clients while an ingest is posted (searches answer during it), a
follow-up that reuses the document prefix, and 4xx JSON errors for bad requests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the test extra (pip install -e .[test]) brings the openai client")

TOKEN = "test-token-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http(url: str, *, data: dict | bytes | None = None, token: str | None = TOKEN, method: str | None = None,
          timeout: float = 120) -> tuple[int, dict]:
    body = data if isinstance(data, bytes) or data is None else json.dumps(data).encode()
    req = urllib.request.Request(url, data=body, method=method or ("POST" if body is not None else "GET"))
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_home):
    from conftest import CORPUS
    from support.pdfs import make_pdf

    root = tmp_path_factory.mktemp("serve")
    docs = root / "docs"
    docs.mkdir()
    for name, text in CORPUS.items():
        (docs / name).write_text(text)
    make_pdf(docs / "manual.pdf", ["Page one is about KV state.", "Page two explains that bananas are yellow "
                                   "and rich in potassium."], title="Manual")
    more = root / "more"
    more.mkdir()
    for i in range(12):
        (more / f"extra{i}.md").write_text(
            f"# Extra {i}\n\n" + " ".join(f"Walrus colony {i} counted {i * 11 + j} pups in year {2000 + j}."
                                         for j in range(40)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_HOME=str(model_home), RAG_STORE_PATH=str(root / "store"), RAG_CACHE_PATH=str(root / "cache"),
               RAG_ENGINE_N_CTX="768", RAG_ASK_MAX_TOKENS="8", RAG_ASK_TOP_K="2", RAG_ASK_NEIGHBOURS="0",
               RAG_SERVE_TOKEN=TOKEN, RAG_CACHE_MIN_TOKENS="64")
    rag = [sys.executable, "-m", "pipeline"]
    subprocess.run(rag + ["ingest", str(docs)], env=env, check=True, capture_output=True, timeout=600)
    port = _free_port()
    proc = subprocess.Popen(rag + ["serve", "--port", str(port), "--max-body", "4096", "--allow", str(root)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if _http(base + "/health", token=None, timeout=2)[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.stdout.read() if proc.poll() is not None else ""
            proc.kill()
            pytest.fail(f"rag serve did not start: {out}")
        time.sleep(0.2)
    yield {"base": base, "more": more, "docs": docs}
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


def _client(server):
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key=TOKEN, max_retries=0, timeout=300)


def test_openai_client_streams_an_answer_with_sources(server):
    stream = _client(server).chat.completions.create(
        model="rag", messages=[{"role": "user", "content": "Which fruit is rich in potassium?"}], stream=True,
        stream_options={"include_usage": True})
    text, sources, usage, finish = [], None, None, None
    for chunk in stream:
        extra = chunk.model_extra or {}
        if "sources" in extra:
            sources = extra["sources"]
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert "".join(text).strip()
    assert sources and any(s["source"].endswith("manual.pdf") for s in sources)
    assert finish in ("stop", "length") and usage.prompt_tokens > 0 and usage.completion_tokens >= 1

    whole = _client(server).chat.completions.create(
        model="rag", messages=[{"role": "user", "content": "Which fruit is rich in potassium?"}])
    assert whole.choices[0].message.content.strip() == "".join(text).strip()  # greedy: the same answer
    assert whole.model_extra["sources"] == sources
    stats = whole.model_extra["stats"]  # the wait counts from the request's arrival
    assert stats["start_point"] == "request" and stats["start_to_first_token_seconds"] >= stats["ttft_seconds"] > 0


def test_four_clients_while_an_ingest_runs_and_searches_answer_during_it(server):
    status, job = _http(server["base"] + "/ingest", data={"paths": [str(server["more"])]})
    assert status == 202 and job["state"] in ("queued", "running")
    results, errors = [], []

    def client(i: int) -> None:
        try:
            r = _client(server).chat.completions.create(
                model="rag", messages=[{"role": "user", "content": ["What does --n-cpu-moe do?",
                                                                    "When does ERR_SOCKET_ZX81 appear?"][i % 2]}])
            results.append(r.choices[0].message.content)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    during = []
    while True:
        state = _http(f"{server['base']}/ingest/{job['id']}")[1]["state"]
        if state in ("done", "failed"):
            break
        code, found = _http(server["base"] + "/search", data={"query": "tomato sun", "top_k": 1})
        assert code == 200
        if _http(f"{server['base']}/ingest/{job['id']}")[1]["state"] == "running":
            during.append(found["hits"][0]["source"])
    for th in threads:
        th.join(600)
    assert not errors, errors
    assert len(results) == 4 and all(r.strip() for r in results)
    final = _http(f"{server['base']}/ingest/{job['id']}")[1]
    assert final["state"] == "done", final
    assert during and all(src.endswith("page.html") for src in during)  # searches answered mid-ingest
    assert _http(server["base"] + "/status")[1]["documents"] == 4 + 12


def test_a_follow_up_reuses_the_document_prefix(server):
    client = _client(server)
    q1 = "What does the flag --n-cpu-moe keep in CPU memory?"
    first = client.chat.completions.create(model="rag", messages=[{"role": "user", "content": q1}])
    follow = client.chat.completions.create(model="rag", messages=[
        {"role": "user", "content": q1},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And what do larger micro-batches do?"}])
    assert follow.choices[0].message.content.strip()
    cached = follow.usage.prompt_tokens_details.cached_tokens
    first_sources = {s["source"] for s in first.model_extra["sources"]}
    assert first_sources <= {s["source"] for s in follow.model_extra["sources"]}  # the documents stayed
    assert cached > 0.5 * first.usage.prompt_tokens, (cached, first.usage.prompt_tokens)


@pytest.mark.parametrize("case", ["no-token", "bad-json", "no-messages", "not-user-last", "bad-type", "too-large",
                                  "unknown-path", "wrong-method", "missing-path", "empty-query"])
def test_bad_requests_get_4xx_json(server, case):
    base = server["base"]
    chat = base + "/v1/chat/completions"
    code, body = {
        "no-token": lambda: _http(base + "/status", token=None),
        "bad-json": lambda: _http(chat, data=b"{not json"),
        "no-messages": lambda: _http(chat, data={"model": "rag"}),
        "not-user-last": lambda: _http(chat, data={"messages": [{"role": "assistant", "content": "hi"}]}),
        "bad-type": lambda: _http(chat, data={"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}),
        "too-large": lambda: _http(chat, data={"messages": [{"role": "user", "content": "x" * 5000}]}),
        "unknown-path": lambda: _http(base + "/nope"),
        "wrong-method": lambda: _http(base + "/search", method="GET"),
        "missing-path": lambda: _http(base + "/ingest", data={"paths": ["/does/not/exist"]}),
        "empty-query": lambda: _http(base + "/search", data={"query": "  "}),
    }[case]()
    expected = {"no-token": 401, "too-large": 413, "unknown-path": 404, "wrong-method": 405,
                "missing-path": 403}.get(case, 400)
    assert code == expected, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
