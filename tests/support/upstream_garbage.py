"""A fake OpenAI-compatible server on 127.0.0.1 that answers one endpoint with garbage.

It speaks llama_cpp.server's dialect well enough for `rag` to get that far (``/v1/models``,
``/extras/tokenize`` with one token per character, ``/extras/detokenize``, a streamed
``/v1/completions``, ``/v1/embeddings``), except where its ``mode`` says otherwise: what a
misconfigured proxy, another kind of server, or a broken one sends instead. The tests of a
remote generator or embedder (``tests/scaleout/test_remote_garbage.py``) and the drill's ``upstream`` area
start it with ``models.generator`` / ``models.embedder`` = ``openai:URL#fake``.

    with GarbageServer("completions-choices") as fake:
        env["RAG_MODELS_GENERATOR"] = fake.ref
"""

from __future__ import annotations

import http.server
import json
import threading

HTML = b"<!doctype html><html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>"

#: mode -> what it does differently (every other endpoint answers as the API does).
MODES = {
    "html": "every endpoint answers 200 with an HTML page (a proxy's error page)",
    "tokenize-json": "/extras/tokenize answers {\"choices\": 5} (JSON of another shape)",
    "completions-json": "/v1/completions answers {\"choices\": 5} as JSON where an event stream was asked for",
    "completions-choices": "/v1/completions streams events {\"choices\": 5}",
    "completions-broken": "/v1/completions streams an event that is not JSON",
    "completions-html-events": "/v1/completions streams 'data: <html>...' lines",
    "embeddings-html": "/v1/embeddings answers 200 with an HTML page",
    "embeddings-json": "/v1/embeddings answers {\"data\": 5}",
    "embeddings-vectors": "/v1/embeddings answers vectors that are not numbers",
}
DIM = 8


def _vector(text: str) -> list[float]:
    v = [0.0] * DIM
    for i, c in enumerate(text):
        v[(ord(c) + i) % DIM] += 1.0
    v[0] += 1.0
    return v


class GarbageServer:
    """The fake server in a thread; ``url`` is its OpenAI base URL, ``ref`` a model reference to it."""

    def __init__(self, mode: str):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
        self.mode = mode
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, body: bytes, kind: str, code: int = 200):
                self.send_response(code)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, obj, code: int = 200):
                self._send(json.dumps(obj).encode(), "application/json", code)

            def _garbage(self) -> bool:
                if outer.mode == "html":
                    self._send(HTML, "text/html; charset=utf-8")
                    return True
                return False

            def do_GET(self):
                outer.requests.append(f"GET {self.path}")
                if self._garbage():
                    return
                if self.path == "/v1/models":
                    return self._json({"object": "list", "data": [{"id": "fake", "object": "model"}]})
                self._json({"detail": "Not Found"}, 404)

            def do_POST(self):
                outer.requests.append(f"POST {self.path}")
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
                if self._garbage():
                    return
                mode = outer.mode
                if self.path == "/extras/tokenize":
                    if mode == "tokenize-json":
                        return self._json({"choices": 5})
                    return self._json({"tokens": [ord(c) % 5000 + 10 for c in body.get("input", "")]})
                if self.path == "/extras/detokenize":
                    return self._json({"text": "".join(chr(t - 10) for t in body.get("tokens", []))})
                if self.path == "/v1/embeddings":
                    return self._embeddings(body)
                if self.path == "/v1/completions":
                    return self._completions()
                self._json({"detail": "Not Found"}, 404)

            def _embeddings(self, body):
                mode = outer.mode
                if mode == "embeddings-html":
                    return self._send(HTML, "text/html")
                if mode == "embeddings-json":
                    return self._json({"data": 5})
                inputs = body.get("input") or []
                inputs = [inputs] if isinstance(inputs, str) else inputs
                if mode == "embeddings-vectors":
                    return self._json({"data": [{"index": i, "embedding": ["x"] * DIM} for i in range(len(inputs))]})
                self._json({"object": "list", "data": [{"index": i, "object": "embedding", "embedding": _vector(str(t))}
                                                       for i, t in enumerate(inputs)]})

            def _completions(self):
                mode = outer.mode
                if mode == "completions-json":
                    return self._json({"choices": 5})
                events = {
                    "completions-choices": [b'data: {"choices": 5}\n\n'],
                    "completions-broken": [b'data: {"choices": [{"text": "Hel\n\n', b"data: [DONE]\n\n"],
                    "completions-html-events": [b"data: " + HTML + b"\n\n"],
                }.get(mode)
                if events is None:
                    events = [f"data: {json.dumps({'choices': [{'text': t, 'index': 0, 'finish_reason': f}]})}\n\n"
                              .encode() for t, f in (("Hello", None), (".", "stop"))] + [b"data: [DONE]\n\n"]
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for event in events:
                    self.wfile.write(event)
                self.wfile.flush()
                self.close_connection = True

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name=f"garbage-{mode}", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.ref = f"openai:{self.url}#fake"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "GarbageServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
