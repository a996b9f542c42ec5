"""Drill area `http`: `rag serve` as an attacker's page, curl and a careless client use it.

One server reads an allowed folder that holds links to an outside folder (no token, the
default); a second one has a token and no --allow; a few probes start servers of their
own (a client that leaves, SIGTERM mid-ingest, startup errors). Each probe checks one answer:
a status, the absence of a side effect, or the server's CPU going quiet.
"""

from __future__ import annotations

import json
import signal
import socket
import time

from drill import Defect, Drill, clean, store_env
from support.serving import RagServer

SECRET = "The vault code is 7431 and the walrus guards it."
TOKEN = "drill-token-5d1e"


def _server(d: Drill, name: str, *args: str, env: dict | None = None) -> RagServer:
    base = d.fresh(name)
    server = RagServer({**d.env, **store_env(base), **(env or {})}, *args, log=base / "serve.log").start()
    d.cleanups.append(server.stop)
    return server


def _site(d: Drill) -> dict:
    base = d.fresh("http-site")
    allowed, outside = base / "allowed", base / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    (allowed / "guide.md").write_text("# Prefill\n\nThe flag --n-cpu-moe keeps expert tensors in CPU memory.\n")
    (allowed / "sub" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    (outside / "secret.txt").write_text(SECRET + "\n")
    (allowed / "link.txt").symlink_to(outside / "secret.txt")
    (allowed / "outdir").symlink_to(outside, target_is_directory=True)
    server = _server(d, "http-serve", "--allow", str(allowed), "--max-body", "65536")
    status, job, _ = server.request("POST", "/ingest", json_body={"paths": ["."]})
    if status != 202 or server.wait_job(job["id"])["state"] != "done":
        raise Defect(f"the allowed folder was not ingested: {status} {job}")
    return {"server": server, "allowed": allowed, "outside": outside}


def site(d: Drill) -> dict:
    return d.once("http-site", lambda: _site(d))


def _expect(got: tuple, status: int | set[int], what: str) -> dict:
    code, body, _ = got
    if code not in ({status} if isinstance(status, int) else status):
        raise Defect(f"{what}: expected {status}, got {code} {str(body)[:200]}")
    if code >= 400 and not (isinstance(body, dict) and body.get("error", {}).get("message")):
        raise Defect(f"{what}: a {code} without a JSON error message: {str(body)[:200]}")
    return body or {}


def _no_traceback(server: RagServer) -> None:
    if "Traceback" in server.output():
        raise Defect("the server logged a traceback: " + server.output().split("Traceback")[1][:300])


# -- what /ingest may read --------------------------------------------------------------------------


def _refused_path(path_of) -> callable:
    def check(d: Drill) -> None:
        s = site(d)
        before = s["server"].request("GET", "/status")[1]["documents"]
        body = _expect(s["server"].request("POST", "/ingest", json_body={"paths": [path_of(s)]}), 403,
                       "an ingest of a path outside the allowed folder")
        outside = _expect(s["server"].request("POST", "/ingest", json_body={"paths": ["/etc/passwd"]}), 403,
                          "an ingest of /etc/passwd")
        if body != outside:
            raise Defect(f"the refusal differs from /etc/passwd's (an existence oracle): {body} vs {outside}")
        if s["server"].request("GET", "/status")[1]["documents"] != before:
            raise Defect("a refused ingest changed the collection")
    return check


def probe_links_out_stay_out(d: Drill) -> None:
    s = site(d)
    hits = _expect(s["server"].request("POST", "/search", json_body={"query": "vault code 7431 walrus",
                                                                      "top_k": 5}), 200, "a search")["hits"]
    if any("7431" in h["text"] for h in hits):
        raise Defect("text reached through a link out of the allowed folder was ingested and served")


def probe_ingest_off(d: Drill) -> None:
    server = d.once("http-token", lambda: _server(d, "http-token", env={"RAG_SERVE_TOKEN": TOKEN}))
    body = _expect(server.request("POST", "/ingest", json_body={"paths": ["/tmp"]},
                                  headers={"Authorization": f"Bearer {TOKEN}"}), 403, "/ingest without --allow")
    if "--allow" not in body["error"]["message"]:
        raise Defect(f"the refusal does not say how to turn /ingest on: {body}")


def _token_probe(header: str | None, status: int) -> callable:
    def check(d: Drill) -> None:
        server = d.once("http-token", lambda: _server(d, "http-token", env={"RAG_SERVE_TOKEN": TOKEN}))
        headers = {"Authorization": header} if header else {}
        _expect(server.request("GET", "/status", headers=headers), status, f"/status with {header!r}")
        _expect(server.request("GET", "/health"), 200, "/health without a token")
    return check


# -- who is answered --------------------------------------------------------------------------------


def _foreign(method: str, path: str, headers: dict, status: int, *, body: bytes | None = None) -> callable:
    """A request with ``headers`` (``{port}`` in a value: the server's port) must get ``status`` and change
    nothing."""
    def check(d: Drill) -> None:
        s = site(d)
        sent = {k: v.format(port=s["server"].port) for k, v in headers.items()}
        fresh = s["allowed"] / f"fresh-{time.monotonic_ns()}.md"
        fresh.write_text("# Fresh\n\nOkapis are related to giraffes.\n")
        before = s["server"].request("GET", "/status")[1]["documents"]
        data = body if body is not None else json.dumps({"paths": [str(fresh)], "query": "okapi"}).encode()
        _expect(s["server"].request(method, path, body=data, headers=sent), status, f"{method} {path}")
        time.sleep(0.5)
        if s["server"].request("GET", "/status")[1]["documents"] != before:
            raise Defect("the refused request ingested a document anyway")
    return check


def probe_cors_listed(d: Drill) -> None:
    server = d.once("http-cors", lambda: _server(d, "http-cors", "--cors-origin", "https://app.example"))
    pre = server.request("OPTIONS", "/search", headers={"Origin": "https://app.example",
                                                        "Access-Control-Request-Method": "POST"})
    if pre[0] != 204 or pre[2].get("access-control-allow-origin") != "https://app.example":
        raise Defect(f"a listed origin's preflight was not answered: {pre[0]} {pre[2]}")
    _expect(server.request("GET", "/v1/models", headers={"Origin": "https://other.example"}), 403,
            "an origin that is not listed")


def probe_models_secret(d: Drill) -> None:
    server = d.once("http-secret", lambda: _server(
        d, "http-secret", env={"RAG_MODELS_GENERATOR": "openai:http://alice:hunter2@127.0.0.1:9/v1#tiny"}))
    body = _expect(server.request("GET", "/v1/models"), 200, "/v1/models")
    if "hunter2" in json.dumps(body):
        raise Defect(f"/v1/models shows the generator's password: {body}")


# -- bad input ---------------------------------------------------------------------------------------


def _bad(path: str, body: bytes, status: int = 400) -> callable:
    def check(d: Drill) -> None:
        s = site(d)
        _expect(s["server"].request("POST", path, body=body, headers={"Content-Type": "application/json"}),
                status, f"POST {path} {body[:60]!r}")
        _no_traceback(s["server"])
    return check


def probe_jobs_bounded(d: Drill) -> None:
    from pipeline.serve.limits import FINISHED_JOBS_KEPT

    s = site(d)
    ids = [_expect(s["server"].request("POST", "/ingest", json_body={"paths": ["guide.md"]}), 202,
                   "an ingest")["id"] for _ in range(FINISHED_JOBS_KEPT + 5)]
    s["server"].wait_job(ids[-1])
    if s["server"].request("GET", f"/ingest/{ids[0]}")[0] != 404:
        raise Defect(f"{FINISHED_JOBS_KEPT + 5} finished jobs are all kept in memory")


# -- the process --------------------------------------------------------------------------------------


def probe_client_leaves(d: Drill) -> None:
    base = d.fresh("http-leave")
    docs = base / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"manual{i}.md").write_text(f"# Manual {i}\n\n" + " ".join(
            f"Valve {i}-{j} opens at {j * 7 % 97} bar and closes after {j % 13} seconds." for j in range(90)))
    env = {**store_env(base), "RAG_ENGINE_N_CTX": "4096", "RAG_ASK_MAX_TOKENS": "256", "RAG_CACHE_ENABLED": "false",
           "RAG_ASK_TOP_K": "8"}
    clean(d.rag("ingest", str(docs), env=env, timeout=600), codes={0})
    server = RagServer({**d.env, **env}, log=base / "serve.log").start()
    d.cleanups.append(server.stop)
    server.request("POST", "/search", json_body={"query": "valve"})
    try:
        server.request("POST", "/v1/chat/completions", timeout=3,
                       json_body={"messages": [{"role": "user", "content": "When does valve 2-40 close?"}]})
    except OSError:  # the client gives up (a timeout) and closes the connection
        pass
    time.sleep(3)
    before = server.cpu_seconds()
    time.sleep(5)
    busy = server.cpu_seconds() - before
    server.stop()
    if busy > 0.5:
        raise Defect(f"the server used {busy:.1f} CPU-s in 5 s after the client left: the answer went on")


def probe_sigterm_mid_ingest(d: Drill) -> None:
    base = d.fresh("http-term")
    docs = base / "docs"
    docs.mkdir()
    for i in range(10):
        (docs / f"walrus{i}.md").write_text(f"# Colony {i}\n\n" + " ".join(
            f"Walrus colony {i} counted {i * 13 + j} pups in year {1900 + j}." for j in range(120)))
    env = store_env(base)
    server = RagServer({**d.env, **env}, "--allow", str(docs), log=base / "serve.log").start()
    d.cleanups.append(server.stop)
    job = _expect(server.request("POST", "/ingest", json_body={"paths": ["."]}), 202, "an ingest")
    deadline = time.monotonic() + 300
    while (now := server.request("GET", f"/ingest/{job['id']}")[1])["state"] != "running" or not now["files_done"]:
        if now["state"] not in ("queued", "running") or time.monotonic() > deadline:
            raise Defect(f"the ingest did not run: {now}")
        time.sleep(0.05)
    code = server.stop(signal.SIGTERM, timeout=300)
    st = json.loads(clean(d.rag("status", "--json", env=env), codes={0}).out)
    if code != 0 or st["documents"] != 10:
        raise Defect(f"SIGTERM mid-ingest: exit {code}, {st['documents']} of 10 documents committed")


def probe_port_in_use(d: Drill) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ran = clean(d.rag("serve", "--port", str(busy.getsockname()[1]), timeout=60), codes={2})
    if "serving" in ran.err:
        raise Defect(f"it announced serving before failing: {ran.brief()}")


def probe_generator_unreachable(d: Drill) -> None:
    """The generator is a server nobody answers for: a chat completion is 502 (not 500), streaming or not."""
    from devtools.servers import free_port

    base = d.fresh("http-upstream")
    (base / "docs").mkdir()
    (base / "docs" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    clean(d.rag("ingest", str(base / "docs"), env=store_env(base)), codes={0})
    env = {**d.env, **store_env(base), "RAG_REMOTE_MAX_WAIT": "1", "RAG_REMOTE_CONNECT_TIMEOUT": "0.5",
           "RAG_MODELS_GENERATOR": f"openai:http://127.0.0.1:{free_port()}/v1#m"}
    server = RagServer(env, log=base / "serve.log").start()
    d.cleanups.append(server.stop)
    for stream in (False, True):
        body = _expect(server.request("POST", "/v1/chat/completions", json_body={
            "stream": stream, "messages": [{"role": "user", "content": "What do tomato plants need?"}]}),
            502, f"an unreachable generator (stream={stream})")
        message = body["error"]["message"]
        if message.count("(") != message.count(")"):
            raise Defect(f"the message's parentheses do not close: {message}")
    _no_traceback(server)


PROBES = [
    ("http", "http.ingest-outside-file", "an outside file is 403, the same body as any refusal",
     _refused_path(lambda s: str(s["outside"] / "secret.txt"))),
    ("http", "http.ingest-root", "/ is 403, the same body", _refused_path(lambda s: "/")),
    ("http", "http.ingest-missing", "a missing path is 403, the same body (no existence oracle)",
     _refused_path(lambda s: "/etc/nonexistent-zz")),
    ("http", "http.ingest-missing-inside", "a missing path inside the folder is 403, the same body",
     _refused_path(lambda s: str(s["allowed"] / "nope.md"))),
    ("http", "http.ingest-symlink-file", "a link to an outside file is 403",
     _refused_path(lambda s: str(s["allowed"] / "link.txt"))),
    ("http", "http.ingest-symlink-dir", "a link to an outside folder (relative) is 403",
     _refused_path(lambda s: "outdir")),
    ("http", "http.ingest-dotdot", "`..` out of the folder is 403",
     _refused_path(lambda s: f"{s['allowed']}/../outside/secret.txt")),
    ("http", "http.ingest-dotdot-relative", "a relative `..` is taken against the folder: 403",
     _refused_path(lambda s: "../outside")),
    ("http", "http.links-out-not-ingested", "links out of an allowed folder are skipped when it is ingested",
     probe_links_out_stay_out),
    ("http", "http.ingest-off", "without --allow, /ingest is 403 and says how to enable it", probe_ingest_off),
    ("http", "http.no-token", "with a token set, no token is 401", _token_probe(None, 401)),
    ("http", "http.wrong-token", "a wrong token is 401", _token_probe("Bearer nope", 401)),
    ("http", "http.right-token", "the right token is 200", _token_probe(f"Bearer {TOKEN}", 200)),
    ("http", "http.host-rebound", "Host: evil.example:PORT is 403 and ingests nothing",
     _foreign("POST", "/ingest", {"Host": "evil.example:{port}", "Content-Type": "application/json"}, 403)),
    ("http", "http.host-search", "a search with Host: attacker.example is 403",
     _foreign("POST", "/search", {"Host": "attacker.example", "Content-Type": "application/json"}, 403)),
    ("http", "http.origin-cross", "a cross-origin POST is 403 and ingests nothing",
     _foreign("POST", "/ingest", {"Origin": "http://evil.example", "Content-Type": "application/json"}, 403)),
    ("http", "http.origin-null", "Origin: null is 403",
     _foreign("POST", "/ingest", {"Origin": "null", "Content-Type": "application/json"}, 403)),
    ("http", "http.text-plain", "a text/plain POST (no preflight in a browser) is 415 and ingests nothing",
     _foreign("POST", "/ingest", {"Content-Type": "text/plain"}, 415)),
    ("http", "http.form-post", "a form POST is 415", _foreign("POST", "/ingest", {
        "Content-Type": "application/x-www-form-urlencoded"}, 415)),
    ("http", "http.preflight-evil", "a preflight from another origin is 403",
     _foreign("OPTIONS", "/ingest", {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
              403, body=b"")),
    ("http", "http.cors-listed", "a --cors-origin origin gets its preflight and CORS headers; others 403",
     probe_cors_listed),
    ("http", "http.models-secret", "/v1/models hides the generator's credentials", probe_models_secret),
    ("http", "http.bad-json", "broken JSON is 400", _bad("/search", b"{not json")),
    ("http", "http.deep-json", "JSON nested 30,000 deep is 400", _bad("/search", b"[" * 30000 + b"]" * 30000)),
    ("http", "http.top-k-huge", "top_k 10**30 is 400", _bad("/search", b'{"query": "x", "top_k": 1' + b"0" * 30 + b"}")),
    ("http", "http.top-k-negative", "top_k -1 is 400", _bad("/search", b'{"query": "x", "top_k": -1}')),
    ("http", "http.top-k-zero", "top_k 0 is 400", _bad("/search", b'{"query": "x", "top_k": 0}')),
    ("http", "http.top-k-billion", "top_k 10**9 is 400", _bad("/search", b'{"query": "x", "top_k": 1000000000}')),
    ("http", "http.nan", "NaN is 400", _bad("/search", b'{"query": "x", "top_k": NaN}')),
    ("http", "http.surrogate-query", "a lone surrogate in a query is 400",
     _bad("/search", b'{"query": "code \\ud800"}')),
    ("http", "http.surrogate-message", "a lone surrogate in a message is 400",
     _bad("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x \\udfff"}]}')),
    ("http", "http.part-not-text", "a content part whose text is a number is 400",
     _bad("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}')),
    ("http", "http.no-user-message", "messages without a user turn are 400",
     _bad("/v1/chat/completions", b'{"messages": [{"role": "assistant", "content": "hi"}]}')),
    ("http", "http.body-too-large", "a body over --max-body is 413",
     _bad("/search", b'{"query": "' + b"x" * 70000 + b'"}', 413)),
    ("http", "http.paths-not-a-list", "paths that are not a list are 400", _bad("/ingest", b'{"paths": "/etc"}')),
    ("http", "http.jobs-bounded", "finished ingest jobs are not kept forever", probe_jobs_bounded),
    ("http", "http.client-leaves", "a non-streaming answer stops when its client leaves", probe_client_leaves),
    ("http", "http.sigterm-mid-ingest", "SIGTERM waits for the running ingest to commit", probe_sigterm_mid_ingest),
    ("http", "http.port-in-use", "a busy port is one error line, exit 2, before 'serving on'", probe_port_in_use),
    ("http", "http.generator-unreachable", "a generator server nobody answers for is 502, not 500",
     probe_generator_unreachable),
    ("http", "http.bad-host", "--host 256.1.1.1 is one error line, exit 2",
     lambda d: clean(d.rag("serve", "--host", "256.1.1.1", timeout=60), codes={2})),
]
