"""`rag serve` reads only what the operator allowed and answers only its own Host and origin.

Real `rag serve` processes on 127.0.0.1, sent what an attacker's page or curl would send
(any Host, Origin, Content-Type, path), and the real `openai` client.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from devtools.servers import free_port
from support.serving import RagServer, serve_env

openai = pytest.importorskip("openai", reason="the test extra (pip install -e .[test]) brings the openai client")

SECRET = "The vault code is 7431 and the walrus guards it."


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_home):
    """A server allowed to read ``allowed/`` (which holds links to ``outside/``), no token (the default)."""
    from conftest import CORPUS

    root = tmp_path_factory.mktemp("site")
    allowed, outside = root / "allowed", root / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    (allowed / "guide.md").write_text(CORPUS["guide.md"])
    (allowed / "sub" / "notes.txt").write_text(CORPUS["notes.txt"])
    (outside / "secret.txt").write_text(SECRET + "\n")
    (allowed / "link.txt").symlink_to(outside / "secret.txt")
    (allowed / "outdir").symlink_to(outside, target_is_directory=True)
    server = RagServer(serve_env(root, model_home), "--allow", str(allowed), log=root / "serve.log").start()
    status, job, _ = server.request("POST", "/ingest", json_body={"paths": ["."]})  # relative: the allowed folder
    assert status == 202, job
    done = server.wait_job(job["id"])
    yield {"server": server, "root": root, "allowed": allowed, "outside": outside, "first_job": done}
    server.stop()


def _documents(server) -> int:
    return server.request("GET", "/status")[1]["documents"]


def test_an_allowed_folder_is_ingested_and_its_links_out_are_not(site):
    job = site["first_job"]
    assert job["state"] == "done", job
    assert job["paths"] == [str(site["allowed"].resolve())]  # "." was taken against the allowed folder
    files = {f["path"].rsplit("/", 1)[-1]: f for f in job["report"]["files"]}
    assert files["guide.md"]["status"] == files["notes.txt"]["status"] == "new"
    assert files["link.txt"]["status"] == files["outdir"]["status"] == "skipped"
    status, found, _ = site["server"].request("POST", "/search", json_body={"query": "vault code 7431 walrus"})
    assert status == 200 and found["hits"]
    assert not any("7431" in h["text"] for h in found["hits"])
    assert _documents(site["server"]) == 2


def test_every_path_outside_the_allowed_folders_gets_the_same_403(site):
    server, allowed, outside = site["server"], site["allowed"], site["outside"]
    before = _documents(server)
    cases = {
        "outside file": str(outside / "secret.txt"),
        "outside folder": str(outside),
        "system file": "/etc/passwd",
        "root": "/",
        "missing outside": "/etc/nonexistent-zz",
        "missing inside": str(allowed / "nope.md"),
        "missing relative": "nope.md",
        "symlink out (file)": str(allowed / "link.txt"),
        "symlink out (folder)": "outdir",
        "dot-dot absolute": f"{allowed}/../outside/secret.txt",
        "dot-dot relative": "../outside/secret.txt",
        "dot-dot through a subfolder": "sub/../../outside",
        "one bad among good ones": ["guide.md", "/etc/passwd"],
    }
    answers = {}
    for name, path in cases.items():
        status, body, _ = server.request("POST", "/ingest", json_body={"paths": path if isinstance(path, list)
                                                                                else [path]})
        answers[name] = (status, json.dumps(body, sort_keys=True))
    assert {status for status, _ in answers.values()} == {403}, answers
    assert len({body for _, body in answers.values()}) == 1, answers  # no existence oracle
    assert "--allow" in json.loads(next(iter(answers.values()))[1])["error"]["message"]
    assert _documents(server) == before


def test_a_foreign_host_origin_or_non_json_post_gets_4xx_and_changes_nothing(site):
    server, allowed = site["server"], site["allowed"]
    (allowed / "fresh.md").write_text("# Fresh\n\nOkapis are related to giraffes.\n")
    before = _documents(server)
    ingest = json.dumps({"paths": [str(allowed / "fresh.md")]}).encode()
    attempts = {
        "rebound host": dict(headers={"Host": f"evil.example:{server.port}", "Content-Type": "application/json"}),
        "host without port": dict(headers={"Host": "attacker.example", "Content-Type": "application/json"}),
        "other port": dict(headers={"Host": f"127.0.0.1:{server.port + 1}", "Content-Type": "application/json"}),
        "cross-site page": dict(headers={"Origin": "http://evil.example", "Content-Type": "application/json"}),
        "null origin": dict(headers={"Origin": "null", "Content-Type": "application/json"}),
        "text/plain": dict(headers={"Origin": "http://evil.example", "Content-Type": "text/plain"}),
        "text/plain, same origin": dict(headers={"Content-Type": "text/plain"}),
        "form": dict(headers={"Content-Type": "application/x-www-form-urlencoded"}),
        "no content type": dict(headers={"Content-Type": ""}),
    }
    got = {name: server.request("POST", "/ingest", body=ingest, **kw)[0] for name, kw in attempts.items()}
    assert got == {**{k: 403 for k in list(attempts)[:5]}, "text/plain": 403, "text/plain, same origin": 415,
                   "form": 415, "no content type": 415}
    reads = [server.request("POST", "/search", json_body={"query": "okapi"},
                            headers={"Host": "attacker.example"})[0],
             server.request("GET", "/status", headers={"Host": f"attacker.example:{server.port}"})[0],
             server.request("GET", "/health", headers={"Host": "evil.example"})[0],
             server.request("OPTIONS", "/ingest", headers={"Origin": "http://evil.example",
                                                           "Access-Control-Request-Method": "POST"})[0]]
    assert reads == [403, 403, 403, 403]
    time.sleep(1)
    assert _documents(server) == before  # no job ran
    same_origin = {"Origin": server.base, "Content-Type": "application/json"}
    status, job, headers = server.request("POST", "/ingest", body=ingest, headers=same_origin)
    assert status == 202 and "access-control-allow-origin" not in headers
    assert server.wait_job(job["id"])["state"] == "done"
    assert _documents(server) == before + 1  # the same request, from the server's own page, works


@pytest.mark.parametrize("case", ["deep-json", "top-k-huge", "top-k-negative", "top-k-zero", "top-k-billion",
                                  "top-k-float", "surrogate-query", "nan", "infinity"])
def test_bad_search_input_is_a_4xx_never_a_500(site, case):
    server = site["server"]
    body = {
        "deep-json": b"[" * 60000 + b"]" * 60000,
        "top-k-huge": b'{"query": "x", "top_k": 1000000000000000000000000000000}',
        "top-k-negative": b'{"query": "x", "top_k": -1}',
        "top-k-zero": b'{"query": "x", "top_k": 0}',
        "top-k-billion": b'{"query": "x", "top_k": 1000000000}',
        "top-k-float": b'{"query": "x", "top_k": 1e30}',
        "surrogate-query": b'{"query": "code \\ud800 here"}',
        "nan": b'{"query": "x", "top_k": NaN}',
        "infinity": b'{"query": "x", "top_k": Infinity}',
    }[case]
    status, answer, _ = server.request("POST", "/search", body=body, headers={"Content-Type": "application/json"})
    assert status == 400, answer
    assert answer["error"]["message"]
    assert "Traceback" not in server.output()


def _raw(server, head: bytes, *, close_after: float | None = None) -> bytes:
    """What the server answers to bytes sent as they are (``close_after``: hang up that many seconds later)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        try:
            s.sendall(head)
        except (BrokenPipeError, ConnectionResetError):
            return b"reset"
        if close_after is not None:
            time.sleep(close_after)
            return b""
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:  # refused while still sending: the server closed on unread bytes
            return answer or b"reset"
        return answer


def test_repeated_guard_headers_huge_headers_and_a_half_sent_body_are_4xx_without_a_traceback(site):
    server = site["server"]
    own = f"127.0.0.1:{server.port}".encode()
    twice = {  # the guard must not check one copy while the app reads the other
        "host": b"Host: evil.example\r\nHost: " + own,
        "origin": b"Host: " + own + b"\r\nOrigin: http://evil.example\r\nOrigin: http://" + own,
    }
    for name, headers in twice.items():
        answer = _raw(server, b"GET /status HTTP/1.1\r\n" + headers + b"\r\nConnection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 400"), answer  # two Hosts: h11 refuses them before the guard
        assert name == "host" or b"more than one Origin header" in answer, answer
    big = b"GET /health HTTP/1.1\r\nHost: " + own + b"\r\nX-A: " + b"a" * (1 << 20) + b"\r\nConnection: close\r\n\r\n"
    many = b"".join(b"X-%d: 1\r\n" % i for i in range(20_000))
    for head in (big, b"GET /health HTTP/1.1\r\nHost: " + own + b"\r\n" + many + b"Connection: close\r\n\r\n"):
        assert _raw(server, head).startswith((b"HTTP/1.1 400", b"reset"))  # never read whole, never a 200
    _raw(server, b"POST /search HTTP/1.1\r\nHost: " + own + b"\r\nContent-Type: application/json\r\n"
         b"Content-Length: 100\r\n\r\n{", close_after=1.0)
    assert server.request("GET", "/health")[0] == 200
    time.sleep(0.5)
    assert "Traceback" not in server.output() and "Exception in ASGI" not in server.output()


def _client(server, **kw):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, **kw)


def test_a_text_part_that_is_not_a_string_is_a_400_through_the_openai_client(site):
    with pytest.raises(openai.BadRequestError) as caught:
        _client(site["server"], timeout=60).chat.completions.create(
            model="rag", messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])
    assert caught.value.status_code == 400 and "string" in caught.value.message
    assert "Traceback" not in site["server"].output()


def test_openai_fields_it_cannot_honour_are_a_400_and_ignored_ones_are_still_type_checked(site):
    server = site["server"]
    ask = [{"role": "user", "content": "What guards the vault?"}]
    refused = {"n": 2, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
               "tool_choice": "required", "logprobs": True, "top_logprobs": 2,
               "response_format": {"type": "json_object"}}
    for name, value in refused.items():
        status, answer, _ = server.request("POST", "/v1/chat/completions",
                                           json_body={"messages": ask, "max_tokens": 1, name: value})
        assert status == 400 and answer["error"]["code"] == "unsupported_parameter", (name, answer)
    wrong = {"presence_penalty": "x", "frequency_penalty": 3, "top_p": True, "seed": 1.5, "user": 7, "n": 0}
    for name, value in wrong.items():
        status, answer, _ = server.request("POST", "/v1/chat/completions",
                                           json_body={"messages": ask, "max_tokens": 1, name: value})
        assert status == 400 and f"'{name}'" in answer["error"]["message"], (name, answer)
    fine = {"n": 1, "tool_choice": "none", "presence_penalty": 0.5, "frequency_penalty": 0, "top_p": 0.9,
            "seed": 7, "user": "u-1", "logprobs": False, "response_format": {"type": "text"}, "logit_bias": {}}
    status, answer, _ = server.request("POST", "/v1/chat/completions",
                                       json_body={"messages": ask, "max_tokens": 1, **fine})
    assert status == 200 and len(answer["choices"]) == 1, answer
    assert "Traceback" not in server.output()


@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "what \\ud800 is it"}]}',
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a \\udfff"}]}]}',
    b'{"messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a \\udfff b"},'
    b' {"role": "user", "content": "second"}]}',
], ids=["question", "text-part", "history"])
def test_a_lone_surrogate_in_a_message_is_a_400(site, body):
    """(The openai client cannot even send one: it encodes its JSON as UTF-8; any other client can.)"""
    status, answer, _ = site["server"].request("POST", "/v1/chat/completions", body=body,
                                               headers={"Content-Type": "application/json"})
    assert status == 400 and "not valid text" in answer["error"]["message"], answer
    assert "Traceback" not in site["server"].output()


def test_finished_ingest_jobs_are_forgotten_past_the_limit(site):
    from pipeline.serve.limits import FINISHED_JOBS_KEPT

    server = site["server"]
    ids = []
    for _ in range(FINISHED_JOBS_KEPT + 5):
        status, job, _ = server.request("POST", "/ingest", json_body={"paths": ["guide.md"]})
        assert status == 202
        ids.append(job["id"])
    assert server.wait_job(ids[-1])["state"] == "done"
    assert [server.request("GET", f"/ingest/{i}")[0] for i in ids[:5]] == [404] * 5
    assert {server.request("GET", f"/ingest/{i}")[0] for i in ids[5:]} == {200}


# -- servers of their own -------------------------------------------------------------------------


def test_ingest_is_off_without_allow_and_cors_and_host_names_are_the_operators(tmp_path, model_home):
    server = RagServer(serve_env(tmp_path, model_home), "--cors-origin", "https://app.example",
                       "--allow-host", "rag.example", log=tmp_path / "serve.log").start()
    try:
        status, body, _ = server.request("POST", "/ingest", json_body={"paths": ["/tmp"]})
        assert status == 403 and "--allow" in body["error"]["message"] and "off" in body["error"]["message"]
        pre = server.request("OPTIONS", "/search", headers={"Origin": "https://app.example",
                                                            "Access-Control-Request-Method": "POST",
                                                            "Access-Control-Request-Headers": "content-type"})
        assert pre[0] == 204 and pre[2]["access-control-allow-origin"] == "https://app.example"
        assert "content-type" in pre[2]["access-control-allow-headers"].lower()
        listed = server.request("GET", "/v1/models", headers={"Origin": "https://app.example"})
        assert listed[0] == 200 and listed[2]["access-control-allow-origin"] == "https://app.example"
        assert server.request("GET", "/v1/models", headers={"Origin": "https://other.example"})[0] == 403
        assert server.request("GET", "/health", headers={"Host": "rag.example"})[0] == 200  # a proxy's name
        assert server.request("GET", "/health", headers={"Host": "rag.example.evil"})[0] == 403
    finally:
        server.stop()


def _serve(*args, env, timeout=60):
    return subprocess.run([sys.executable, "-m", "pipeline", "serve", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _one_error_line(ran) -> str:
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), ran.stderr
    return lines[0]


def test_off_loopback_without_a_token_refuses_to_start_unless_insecure(tmp_path, model_home):
    env = serve_env(tmp_path, model_home)
    ran = _serve("--host", "0.0.0.0", "--port", str(free_port()), env=env)
    assert ran.returncode == 2
    assert "RAG_SERVE_TOKEN" in _one_error_line(ran) and "--insecure" in ran.stderr
    server = RagServer(env, "--host", "0.0.0.0", "--insecure", log=tmp_path / "serve.log").start()
    try:
        assert "warning" in server.output()
        assert server.request("GET", "/health")[0] == 200  # an IP literal cannot be rebound
        assert server.request("GET", "/health", headers={"Host": f"evil.example:{server.port}"})[0] == 403
    finally:
        server.stop()


def test_a_busy_port_or_an_impossible_host_is_one_error_line_exit_2(tmp_path, model_home):
    env = serve_env(tmp_path, model_home)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ran = _serve("--port", str(port), env=env)
    assert ran.returncode == 2 and "in use" in _one_error_line(ran)
    ran = _serve("--host", "256.1.1.1", env=env)
    assert ran.returncode == 2 and "256.1.1.1" in _one_error_line(ran)


def test_models_names_the_generator_without_its_credentials(tmp_path, model_home):
    env = serve_env(tmp_path, model_home, RAG_MODELS_GENERATOR="openai:http://alice:hunter2@127.0.0.1:9/v1#tiny")
    server = RagServer(env, log=tmp_path / "serve.log").start()
    try:
        ids = [m.id for m in _client(server, timeout=30).models.list()]
    finally:
        server.stop()
    assert len(ids) == 1 and "hunter2" not in ids[0] and "alice" not in ids[0] and ids[0].endswith("#tiny")


def test_sigterm_lets_the_running_ingest_commit(tmp_path, model_home):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(10):
        (docs / f"walrus{i}.md").write_text(f"# Colony {i}\n\n" + " ".join(
            f"Walrus colony {i} counted {i * 13 + j} pups in year {1900 + j}." for j in range(120)))
    env = serve_env(tmp_path, model_home)
    server = RagServer(env, "--allow", str(docs), log=tmp_path / "serve.log").start()
    status, job, _ = server.request("POST", "/ingest", json_body={"paths": ["."]})
    assert status == 202
    deadline = time.monotonic() + 300
    while (now := server.request("GET", f"/ingest/{job['id']}")[1])["state"] != "running" or not now["files_done"]:
        assert now["state"] in ("queued", "running") and time.monotonic() < deadline, now
        time.sleep(0.05)
    code = server.stop(signal.SIGTERM, timeout=300)
    assert code == 0, server.output()
    assert "waiting for the running ingest" in server.output()  # it was mid-job when the signal came
    st = subprocess.run([sys.executable, "-m", "pipeline", "status", "--json"], env=env, capture_output=True,
                        text=True, timeout=120)
    assert json.loads(st.stdout)["documents"] == 10


def test_a_client_that_leaves_stops_its_answer(tmp_path, model_home):
    """A non-streaming answer whose client gave up stops prefilling: the server's CPU goes quiet."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):  # about 3,000 tokens, packed whole: a prefill of many seconds on these cores
        (docs / f"manual{i}.md").write_text(f"# Manual {i}\n\n" + " ".join(
            f"Valve {i}-{j} opens at {j * 7 % 97} bar and closes after {j % 13} seconds." for j in range(90)))
    env = serve_env(tmp_path, model_home, RAG_ENGINE_N_CTX="4096", RAG_ASK_MAX_TOKENS="256",
                    RAG_CACHE_ENABLED="false", RAG_ASK_TOP_K="8")
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(docs)], env=env, check=True,
                   capture_output=True, timeout=600)
    server = RagServer(env, log=tmp_path / "serve.log").start()
    try:
        assert server.request("POST", "/search", json_body={"query": "valve"})[0] == 200  # the embedder loads
        with pytest.raises(openai.APITimeoutError):
            _client(server, timeout=3).chat.completions.create(
                model="rag", messages=[{"role": "user", "content": "When does valve 2-40 close?"}])
        time.sleep(3)  # the cancel lands within one micro-batch
        before = server.cpu_seconds()
        time.sleep(5)
        busy = server.cpu_seconds() - before
    finally:
        server.stop()
    assert busy < 0.5, f"the server used {busy:.1f} CPU-s in 5 s after its client left"


def test_a_stop_during_a_long_answer_gives_it_a_503_not_a_bare_500(tmp_path, model_home):
    """SIGTERM while an answer is still prefilling: it is cancelled before uvicorn's grace period ends
    and answers a JSON 503 the client can retry on; the server exits cleanly, without a traceback."""
    import threading

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(7):  # about 7,000 tokens packed whole: a prefill far longer than the grace period here
        (docs / f"manual{i}.md").write_text(f"# Manual {i}\n\n" + " ".join(
            f"Valve {i}-{j} opens at {j * 7 % 97} bar and closes after {j % 13} seconds." for j in range(90)))
    env = serve_env(tmp_path, model_home, RAG_ENGINE_N_CTX="8192", RAG_CACHE_ENABLED="false")
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(docs)], env=env, check=True,
                   capture_output=True, timeout=600)
    server = RagServer(env, log=tmp_path / "serve.log").start()
    got = {}

    def ask() -> None:
        got["answer"] = server.request("POST", "/v1/chat/completions", timeout=120, json_body={
            "messages": [{"role": "user", "content": "When does valve 2-40 close?"}], "max_tokens": 8})

    try:
        assert server.request("POST", "/search", json_body={"query": "valve"})[0] == 200  # the embedder loads
        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(2)  # retrieval done, prefill under way
        started = time.monotonic()
        code = server.stop(signal.SIGTERM, timeout=60)
        asking.join(60)
    finally:
        server.stop(signal.SIGKILL)
    status, answer, _ = got["answer"]
    assert (status, answer["error"]["code"]) == (503, "server_stopping"), (status, answer)
    assert code == 0 and time.monotonic() - started < 30, server.output()
    said = server.output()  # the operator is told what happens, as it happens
    assert "stopping (SIGTERM): 1 answer in flight gets 3 s to finish, then is cancelled" in said, said
    assert "cancelled 1 answer still running" in said and said.rstrip().endswith("stopped"), said
    for bad in ("Traceback", "Exception in ASGI", "Cancel 1 running task"):
        assert bad not in server.output(), server.output()


def test_a_body_that_stalls_is_a_408_and_frees_the_request(monkeypatch):
    """A client that opens a body and then sends nothing cannot hold its connection (an in-process
    request: the real bound is 30 seconds)."""
    import asyncio

    from starlette.requests import Request

    from pipeline.serve import limits
    from pipeline.serve.http_errors import HTTPError
    from pipeline.serve.requests import Body

    monkeypatch.setattr(limits, "BODY_STALL_SECONDS", 0.2)
    sent = []

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": b'{"query": ', "more_body": True}
        await asyncio.sleep(3600)

    request = Request({"type": "http", "method": "POST", "path": "/search", "headers": []}, receive)
    started = time.monotonic()
    with pytest.raises(HTTPError) as caught:
        asyncio.run(Body.read(request, limit=1000))
    assert caught.value.status == 408 and "stalled" in caught.value.message
    assert time.monotonic() - started < 5


# -- a generator server behind this one that is down or starting ----------------------------------------


class _Starting:
    """A stand-in for a llama-server still loading its model: 503 ``Loading model`` to everything."""

    def __init__(self):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _loading(self):
                data = json.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
                self.send_response(503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            do_GET = do_POST = _loading

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def ingested_root(tmp_path_factory, model_home):
    root = tmp_path_factory.mktemp("upstream")
    (root / "docs").mkdir()
    (root / "docs" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    ran = subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(root / "docs")],
                         env=serve_env(root, model_home), capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    return root


CHAT = {"messages": [{"role": "user", "content": "What do tomato plants need?"}]}


@pytest.mark.parametrize("upstream", ["gone", "starting"])
def test_a_generator_server_that_is_down_is_502_and_one_starting_503_with_retry_after(ingested_root, model_home,
                                                                                      upstream):
    stub = _Starting() if upstream == "starting" else None
    url = stub.url if stub else f"http://127.0.0.1:{free_port()}/v1"  # nobody listens there
    env = serve_env(ingested_root, model_home, RAG_MODELS_GENERATOR=f"openai:{url}#m", RAG_REMOTE_MAX_WAIT="1",
                    RAG_REMOTE_CONNECT_TIMEOUT="0.5")
    server = RagServer(env, log=ingested_root / f"serve-{upstream}.log").start()
    try:
        for body in (CHAT, {**CHAT, "stream": True}):
            status, answer, headers = server.request("POST", "/v1/chat/completions", json_body=body)
            message = answer["error"]["message"]
            if upstream == "gone":
                assert (status, answer["error"]["type"]) == (502, "upstream_error"), answer
                assert "retry-after" not in headers and "ConnectError" in message
            else:
                assert (status, answer["error"]["type"]) == (503, "upstream_starting"), answer
                assert headers["retry-after"] == "5" and "HTTP 503 Loading model" in message
            assert message.startswith("connecting to the generator server: no server answered within "
                                      "remote.max_wait = 1 s")
            assert message.count("(") == message.count(")")
        assert "Traceback" not in server.output()
    finally:
        server.stop()
        if stub:
            stub.close()
