"""`rag serve`'s collections (GET /collections, a `collection` per request) and documents added over HTTP
(PUT /upload into an --allow folder), against a real server with the bundled models: what works, and
every refusal (a folder outside, a bad name, a file too large or of no size, one already there, no
token, another site), each a 4xx that leaves nothing behind."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from urllib.parse import quote

import pytest

from pipeline.serve import limits

from support.serving import RagServer, serve_env

TOKEN = "uploads-token-9321"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX = 4096


def _ingest(env: dict, folder, *extra: str) -> None:
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(folder), *extra], env=env, check=True,
                   capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory, model_home):
    root = tmp_path_factory.mktemp("uploads")
    docs, second, allowed, outside = (root / n for n in ("docs", "second", "allowed", "outside"))
    for d in (docs, second, allowed / "sub", outside):
        d.mkdir(parents=True)
    (docs / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    (second / "okapi.md").write_text("# Okapis\n\nOkapis live in the rainforests of the Congo.\n")
    (allowed / "out").symlink_to(outside, target_is_directory=True)
    env = serve_env(root, model_home, RAG_SERVE_TOKEN=TOKEN)
    _ingest(env, docs)
    _ingest(env, second, "--collection", "second")
    server = RagServer(env, "--allow", str(allowed), "--max-upload", str(MAX), log=root / "serve.log").start()
    yield {"server": server, "root": root, "allowed": allowed.resolve(), "outside": outside.resolve(), "env": env}
    server.stop()


def _put(server: RagServer, query: str, data: bytes, headers: dict | None = None) -> tuple[int, dict]:
    status, body, _ = server.request("PUT", "/upload?" + query, body=data, headers={**AUTH, **(headers or {})})
    return status, body or {}


def test_collections_are_listed_with_the_servers_own_first_and_where_documents_may_be_added(site):
    server = site["server"]
    status, body, _ = server.request("GET", "/collections", headers=AUTH)
    assert status == 200 and body["default"] == "default"
    assert [(c["name"], c["documents"]) for c in body["collections"]] == [("default", 1), ("second", 1)]
    assert body["uploads"] == {"folders": [str(site["allowed"])], "max_bytes": MAX}
    assert server.request("GET", "/collections")[0] == 401
    assert server.request("GET", "/collections", headers={**AUTH, "Origin": "http://evil.example"})[0] == 403


def test_each_request_may_name_another_collection_of_the_store(site):
    server = site["server"]
    status, st, _ = server.request("GET", "/status?collection=second", headers=AUTH)
    assert status == 200 and st["collection"] == "second" and st["sources"][0]["source"].endswith("okapi.md")
    status, found, _ = server.request("POST", "/search", json_body={"query": "okapi", "collection": "second"},
                                      headers=AUTH)
    assert status == 200 and found["hits"][0]["source"].endswith("okapi.md")
    status, answer, _ = server.request("POST", "/v1/chat/completions", headers=AUTH, json_body={
        "collection": "second", "max_tokens": 4, "messages": [{"role": "user", "content": "Where do okapis live?"}]})
    assert status == 200 and [s["source"][-8:] for s in answer["sources"]] == ["okapi.md"]
    assert answer["sources"][0]["n"] == 1
    source = quote(st["sources"][0]["source"], safe="")
    assert server.request("GET", f"/documents?collection=second&source={source}", headers=AUTH)[0] == 200
    assert server.request("GET", f"/documents?source={source}", headers=AUTH)[0] == 404  # not in the server's own
    for bad, code in (("nope", 404), ("a%20b", 400), ("second&collection=default", 400)):
        assert server.request("GET", f"/status?collection={bad}", headers=AUTH)[0] == code, bad
    assert server.request("POST", "/search", json_body={"query": "x", "collection": 5}, headers=AUTH)[0] == 400


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.startswith(".rag-upload"))


def test_an_upload_into_an_allowed_folder_is_written_whole_and_ingested_into_the_chosen_collection(site):
    server, allowed = site["server"], site["allowed"]
    data = b"# Capybaras\n\nCapybaras are the largest rodents; they live near rivers.\n"
    status, body = _put(server, "name=capybara.md&collection=second", data)
    assert status == 202, body
    assert body["path"] == str(allowed / "capybara.md") and (allowed / "capybara.md").read_bytes() == data
    job = server.wait_job(body["job"]["id"], headers=AUTH)
    assert job["state"] == "done" and job["collection"] == "second" and job["report"]["counts"]["new"] == 1, job
    found = server.request("POST", "/search", json_body={"query": "capybara rodents", "collection": "second"},
                           headers=AUTH)[1]
    assert found["hits"][0]["source"].endswith("capybara.md")
    status, body = _put(server, f"name=deep.txt&folder={quote(str(allowed / 'sub'))}", b"Deep notes.\n")
    assert status == 202 and (allowed / "sub" / "deep.txt").read_bytes() == b"Deep notes.\n"
    server.wait_job(body["job"]["id"], headers=AUTH)
    assert _leftovers(allowed) == []


def test_uploads_outside_the_allowed_folders_or_badly_named_are_refused_and_leave_nothing(site):
    server, allowed, outside = site["server"], site["allowed"], site["outside"]
    before = sorted(p.name for p in allowed.rglob("*")), sorted(p.name for p in outside.rglob("*"))
    data = b"A secret plan.\n"
    outside_folders = [str(outside), f"{allowed}/../outside", "out", str(allowed / "nope"), "/", "/etc"]
    answers = [_put(server, f"name=x.txt&folder={quote(f, safe='')}", data) for f in outside_folders]
    assert {s for s, _ in answers} == {403}
    assert len({json.dumps(b) for _, b in answers}) == 1 and "--allow" in answers[0][1]["error"]["message"]
    names = ["../x.txt", "a/b.txt", ".hidden.txt", "x.exe", "noext", "a" * 300 + ".txt", "bad\x01.txt", " x.txt"]
    for name in names:
        status, body = _put(server, f"name={quote(name, safe='')}", data)
        assert (status, body["error"]["code"]) == (400, "invalid_name"), (name, body)
    assert _put(server, "name=x.txt&name=y.txt", data)[0] == 400
    status, body = _put(server, "name=big.txt", b"x" * (MAX + 1))
    assert status == 413 and f"{MAX:,} bytes" in body["error"]["message"]
    assert _put(server, "name=empty.txt", b"")[0] == 400
    (allowed / "there.txt").write_text("first\n")
    status, body = _put(server, "name=there.txt", b"second\n")
    assert (status, body["error"]["code"]) == (409, "file_exists") and (allowed / "there.txt").read_text() == "first\n"
    assert _put(server, "name=x.txt", data, {"Authorization": "Bearer nope"})[0] == 401
    assert _put(server, "name=x.txt", data, {"Origin": "http://evil.example"})[0] == 403
    assert _put(server, "name=x.txt", data, {"Host": f"evil.example:{server.port}"})[0] == 403
    assert _put(server, "name=x.txt&collection=nope", data)[0] == 404
    after = sorted(p.name for p in allowed.rglob("*")), sorted(p.name for p in outside.rglob("*"))
    assert after[1] == before[1] and set(after[0]) - set(before[0]) <= {"there.txt"}
    assert "x.txt" not in after[0] and _leftovers(allowed) == []


def test_an_upload_without_a_size_or_cut_short_is_refused(site):
    server = site["server"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:  # chunked: no Content-Length
        sock.sendall(f"PUT /upload?name=chunked.txt HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                     f"Authorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                     .encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 411")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)  # says 100 bytes, sends 10, leaves
    conn.putrequest("PUT", "/upload?name=short.txt", skip_host=True)
    for k, v in {"Host": f"127.0.0.1:{server.port}", **AUTH, "Content-Length": "100"}.items():
        conn.putheader(k, v)
    conn.endheaders(b"0123456789")
    conn.sock.shutdown(socket.SHUT_WR)
    try:
        status = conn.getresponse().status
    except (ConnectionError, http.client.HTTPException):
        status = None  # the server may just close it: either way nothing is kept
    finally:
        conn.close()
    assert status in (400, None)
    assert not (site["allowed"] / "short.txt").exists() and not (site["allowed"] / "chunked.txt").exists()
    # A connection closed before the response may reach the client before the handler has removed its
    # partial file: it goes when the handler sees the close, at the latest when the body's stall bound ends.
    deadline = time.monotonic() + limits.BODY_STALL_SECONDS + 15
    while _leftovers(site["allowed"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(site["allowed"]) == []
    assert "Traceback" not in server.output()


def test_a_server_without_allowed_folders_takes_no_document_and_says_how_to_allow_one(tmp_path, model_home):
    env = serve_env(tmp_path, model_home)
    server = RagServer(env, log=tmp_path / "serve.log").start()
    try:
        status, body, _ = server.request("PUT", "/upload?name=x.txt", body=b"hello\n")
        listed = server.request("GET", "/collections")[1]
    finally:
        server.stop()
    assert (status, body["error"]["code"]) == (403, "uploads_disabled") and "--allow" in body["error"]["message"]
    assert listed["uploads"]["folders"] == [] and listed["collections"][0]["name"] == "default"
