"""Drill area `upstream`: a generator or embedder server (``openai:`` models) that answers garbage.

The server is a stand-in (:class:`upstream_garbage.GarbageServer`) that speaks the API except for one
endpoint, where it sends what a misconfigured proxy or another kind of server would: an HTML page,
``{"choices": 5}``, JSON where an event stream was asked for, an event stream of HTML or broken JSON,
embeddings that are not numbers. `rag ask`, `rag search` and `rag ingest` must end with one `Error:`
line and exit 6; `rag serve` must answer 502 ``upstream_error``, streaming or not, and stay up.
"""

from __future__ import annotations

import json

from drill import Defect, Drill, clean, store_env
from support.serving import RagServer
from support.upstream_garbage import MODES, GarbageServer

QUESTION = "What do tomato plants need?"
GENERATOR_MODES = [m for m in MODES if not m.startswith("embeddings")]
EMBEDDER_MODES = ["html", *(m for m in MODES if m.startswith("embeddings"))]


def _collection(d: Drill) -> dict:
    base = d.fresh("upstream")
    (base / "docs").mkdir()
    (base / "docs" / "notes.txt").write_text("Tomato plants need full sun and regular watering.\n")
    env = {**store_env(base), "RAG_REMOTE_MAX_WAIT": "3", "RAG_REMOTE_CONNECT_TIMEOUT": "1"}
    clean(d.rag("ingest", str(base / "docs"), env=env), codes={0})
    return {"base": base, "env": env}


def collection(d: Drill) -> dict:
    return d.once("upstream", lambda: _collection(d))


def _fake(d: Drill, mode: str) -> GarbageServer:
    fake = GarbageServer(mode)
    d.cleanups.append(fake.close)
    return fake


def _says_so(ran, fake: GarbageServer) -> None:
    line = ran.err.strip().splitlines()[-1]
    if "not the OpenAI API" not in line:
        raise Defect(f"the message does not say the server's answer is not the API: {ran.brief()}")


def _generator_probe(mode: str):
    def check(d: Drill) -> None:
        c, fake = collection(d), _fake(d, mode)
        env = {**c["env"], "RAG_MODELS_GENERATOR": fake.ref}
        for args in (["ask", QUESTION], ["ask", "--json", QUESTION]):
            _says_so(clean(d.rag(*args, env=env), codes={6}), fake)
    return check


def _embedder_probe(mode: str):
    def check(d: Drill) -> None:
        c, fake = collection(d), _fake(d, mode)
        env = {**c["env"], "RAG_MODELS_EMBEDDER": fake.ref}
        _says_so(clean(d.rag("search", "tomato", env=env), codes={6}), fake)
        other = {**env, **store_env(d.fresh("upstream-ingest"))}
        _says_so(clean(d.rag("ingest", str(c["base"] / "docs"), env=other), codes={6}), fake)
    return check


def _serving(d: Drill) -> dict:
    """One `rag serve` whose generator is a stand-in (its mode set by each probe) and one whose embedder is."""
    c = collection(d)
    generator, embedder = _fake(d, "html"), _fake(d, "embeddings-json")
    out = {"generator": generator, "embedder": embedder}
    for role, fake in (("GENERATOR", generator), ("EMBEDDER", embedder)):
        env = {**d.env, **c["env"], f"RAG_MODELS_{role}": fake.ref}
        server = RagServer(env, log=d.fresh(f"upstream-serve-{role.lower()}") / "serve.log").start()
        d.cleanups.append(server.stop)
        out[role.lower() + "_server"] = server
    return out


def _post(server: RagServer, stream: bool) -> tuple[int, dict]:
    status, body, _ = server.request("POST", "/v1/chat/completions", json_body={
        "stream": stream, "messages": [{"role": "user", "content": QUESTION}]})
    return status, body or {}


def _serve_probe(role: str, mode: str | None):
    def check(d: Drill) -> None:
        s = d.once("upstream-serve", lambda: _serving(d))
        server = s[f"{role}_server"]
        if mode is not None:
            s[role].mode = mode
        for stream in (False, True):
            status, body = _post(server, stream)
            kind = (body.get("error") or {}).get("type")
            if (status, kind) != (502, "upstream_error"):
                raise Defect(f"stream={stream}: HTTP {status} {json.dumps(body)[:300]}, expected 502 upstream_error")
        if server.request("GET", "/health")[0] != 200:
            raise Defect("the server stopped answering /health")
        if "Traceback" in server.output():
            raise Defect("the server printed a traceback: " + server.output()[-500:])
    return check


PROBES = [
    *(("upstream", f"upstream.generator-{m}", f"a generator server where {MODES[m]}: `rag ask` exit 6, one line",
       _generator_probe(m)) for m in GENERATOR_MODES),
    *(("upstream", f"upstream.embedder-{m}", f"an embedder server where {MODES[m]}: `rag search` and `rag ingest` "
       "exit 6, one line", _embedder_probe(m)) for m in EMBEDDER_MODES),
    *(("upstream", f"upstream.serve-generator-{m}", f"`rag serve` whose generator server {MODES[m].split(' ', 1)[1]}: "
       "502 upstream_error, streaming or not", _serve_probe("generator", m)) for m in GENERATOR_MODES),
    ("upstream", "upstream.serve-embedder", "`rag serve` whose embedder server answers {\"data\": 5}: 502 "
     "upstream_error, streaming or not", _serve_probe("embedder", None)),
]
