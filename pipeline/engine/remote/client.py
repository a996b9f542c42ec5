"""OpenAI-compatible servers: references, the HTTP client, retries, and what each dialect accepts.

A reference ``openai:http://host:port/v1#model`` (``models.generator`` or
``models.embedder``) names one server, or several separated by commas
(``openai:http://a:8080/v1,http://b:8080/v1#model``), all serving the same model.
``#model`` is the model name the server knows (optional where it serves one).

Two dialects are told apart on first contact:

- ``llama-server`` (llama.cpp's own server; it answers ``GET /props``): prompts go as
  token ids, so what the packer laid out is exactly what the server decodes;
  tokenisation is ``/tokenize`` (control-token text parsed only for the chat markup);
  ``cache_prompt`` asks the slot to keep and reuse its prefix, and the streamed answer
  ends with ``timings`` (``prompt_n``, ``cache_n``, ``prompt_ms``): the stats report them.
- ``openai`` (``python -m llama_cpp.server``, and other OpenAI-compatible servers that
  take text prompts): llama_cpp.server accepts only text prompts, tokenises them with
  control tokens parsed, and its ``/extras/detokenize`` drops control tokens; so the
  text of every token run this client tokenised is remembered (:class:`TokenText`) and
  prompts are sent as that text. Its streamed answers carry no usage and no cache figures
  (its log says ``Llama.generate: N prefix-match hit``; the API does not).

Failures: a connection error, a timeout, HTTP 429 or 5xx is retried with exponential
backoff (tenacity), moving to the next server when there are several, until
``remote.max_wait`` seconds have passed; then an :class:`~pipeline.errors.UpstreamError`
(exit 6; ``rag serve`` answers 502) names the servers and the last failure. Other HTTP errors
are not retried, nor is an answer that is not the API (an HTML page, JSON of another shape, an
event that is not JSON): each is one :class:`~pipeline.errors.UpstreamError` at once that says
what the server sent (:func:`not_the_api`), never a parsing error from deep inside.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterator, Sequence

from ...errors import ConfigError, UpstreamError, redact

PREFIX = "openai:"


@dataclass(frozen=True)
class RemoteRef:
    """The servers (each an OpenAI base URL ending in ``/v1``) and the model name of a reference."""

    urls: tuple[str, ...]
    model: str = ""

    @classmethod
    def parse(cls, ref: str) -> "RemoteRef":
        body = ref.strip()[len(PREFIX):]
        urls_part, _, model = body.partition("#")
        urls = tuple(u.strip().rstrip("/") for u in urls_part.split(",") if u.strip())
        if not urls:
            raise ConfigError(f"{redact(ref)!r}: expected openai:http://host:port/v1[,http://...][#model]")
        for url in urls:
            try:
                parts = urllib.parse.urlsplit(url)
                ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(f"{redact(url)!r} is not an http:// or https:// URL "
                                  "(expected openai:http://host:port/v1[#model])")
        if len(set(urls)) != len(urls):
            raise ConfigError(f"{redact(ref)!r} names a server twice")
        return cls(urls, model.strip())


class Transient(Exception):
    """A failure worth retrying (connection, timeout, 429, 5xx, a stream cut short)."""

    def __init__(self, url: str, reason: str, *, status: int | None = None):
        super().__init__(f"{redact(url)}: {reason}")
        self.url = url
        self.status = status  # the HTTP status that made it, where there was one


class Refused(UpstreamError):
    """The server refused the request with an HTTP 4xx (not retried: asking again gets the same)."""

    def __init__(self, message: str, *, status: int):
        super().__init__(message)
        self.status = status


def not_the_api(url: str, path: str, detail: str) -> UpstreamError:
    """The error for a server whose answer to ``path`` is not what the OpenAI API (or llama.cpp's server)
    sends: a proxy's HTML page, JSON of another shape, a stream of something else."""
    return UpstreamError(f"the server {redact(url)} answered {path} with something that is not the OpenAI API "
                         f"({detail}): is it an OpenAI-compatible server?")


def expect(data: object, key: str, kinds: type | tuple[type, ...], *, url: str, path: str):
    """``data[key]``, which must be of ``kinds`` (never a bool for a number); else :func:`not_the_api`."""
    value = data.get(key) if isinstance(data, dict) else None
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise not_the_api(url, path, f"{key!r} is {_clip(json.dumps(value), 80) if _jsonable(value) else '?'}, "
                                     f"not {' or '.join(k.__name__ for k in kinds)}")
    return value


def expect_tokens(data: object, *, url: str, path: str) -> list[int]:
    """The ``tokens`` of a tokenize answer: a list of token ids."""
    tokens = expect(data, "tokens", list, url=url, path=path)
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens):
        raise not_the_api(url, path, "'tokens' holds something other than token ids")
    return list(tokens)


def _jsonable(value: object) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False


def _api_root(url: str) -> str:
    """``http://h:p`` of ``http://h:p/v1``: where llama-server's and llama_cpp.server's own endpoints live."""
    return url[: -len("/v1")] if url.endswith("/v1") else url


class Server:
    """One server: an HTTP client with the configured timeouts, and its dialect, found on first use."""

    def __init__(self, url: str, *, connect_timeout: float, read_timeout: float, api_key: str = ""):
        import httpx

        self.url = url
        self.root = _api_root(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=httpx.Timeout(
            read_timeout, connect=connect_timeout, pool=connect_timeout))
        self._props: dict | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Server({redact(self.url)})"

    def close(self) -> None:
        self._client.close()

    # -- requests -------------------------------------------------------------------------------

    def _request(self, method: str, url: str, body: dict | None = None):
        import httpx

        try:
            resp = self._client.request(method, url, json=body)
        except httpx.TransportError as exc:  # connect, read, write, timeouts, protocol errors
            raise Transient(self.url, f"{type(exc).__name__}: {exc or 'no response'}") from None
        self._check(resp)
        return resp

    def _check(self, resp) -> None:
        if resp.status_code == 429 or resp.status_code >= 500:
            raise Transient(self.url, f"HTTP {resp.status_code} {_detail(resp)}".rstrip(), status=resp.status_code)
        if resp.status_code >= 400:
            raise Refused(f"the server {redact(self.url)} refused the request: HTTP {resp.status_code} "
                          f"{_detail(resp)}", status=resp.status_code)

    def _object(self, resp, path: str) -> dict:
        """The JSON object ``resp`` holds, or :func:`not_the_api`."""
        try:
            data = resp.json()
        except ValueError:
            kind = resp.headers.get("content-type", "no content type").split(";")[0]
            raise not_the_api(self.url, path, f"{kind}: {_clip(resp.text, 80)!r}") from None
        if not isinstance(data, dict):
            raise not_the_api(self.url, path, f"JSON {type(data).__name__}, not an object")
        return data

    def get_json(self, path: str, *, root: bool = False) -> dict:
        return self._object(self._request("GET", (self.root if root else self.url) + path), path)

    def post_json(self, path: str, body: dict, *, root: bool = False) -> dict:
        return self._object(self._request("POST", (self.root if root else self.url) + path, body), path)

    def stream(self, path: str, body: dict) -> Iterator[dict]:
        """The JSON events of a server-sent-event stream, up to ``[DONE]``; a stream cut short
        (connection lost, no ``[DONE]``) raises :class:`Transient`."""
        import httpx

        try:
            with self._client.stream("POST", self.url + path, json=body) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._check(resp)
                kind = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind and kind != "text/event-stream":
                    resp.read()
                    raise not_the_api(self.url, path, f"{kind} where an event stream was asked for: "
                                                      f"{_clip(resp.text, 80)!r}")
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        event = json.loads(data)
                    except ValueError:
                        raise not_the_api(self.url, path, f"an event that is not JSON: {_clip(data, 80)!r}") from None
                    if not isinstance(event, dict):
                        raise not_the_api(self.url, path, f"an event that is JSON {type(event).__name__}, "
                                                          "not an object")
                    yield event
        except httpx.TransportError as exc:
            raise Transient(self.url, f"the stream broke off ({type(exc).__name__}: {exc or 'closed'})") from None
        raise Transient(self.url, "the stream ended without [DONE]")

    # -- what the server is -------------------------------------------------------------------

    @property
    def props(self) -> dict:
        """llama-server's ``/props`` (context length, chat template, ...), or ``{}`` for other servers."""
        with self._lock:
            if self._props is None:
                try:
                    resp = self._request("GET", self.root + "/props")
                    self._props = self._object(resp, "/props") if resp.headers.get("content-type", "").startswith(
                        "application/json") else {}
                except Refused:  # 404: not llama-server
                    self._props = {}
            return self._props

    @property
    def dialect(self) -> str:
        return "llama-server" if self.props else "openai"

    def models(self) -> list[str]:
        listed = expect(self.get_json("/models"), "data", list, url=self.url, path="/models")
        if not all(isinstance(m, dict) and isinstance(m.get("id", ""), str) for m in listed):
            raise not_the_api(self.url, "/models", "'data' holds something other than models")
        return [m.get("id", "") for m in listed]


def _detail(resp) -> str:
    """What a server said with its error status, on one line, cut (and marked so) past a few hundred characters."""
    try:
        body = resp.json()
    except ValueError:
        return _clip(resp.text, 200)
    if isinstance(body, dict):
        err = body.get("error") or body.get("detail") or body
        if isinstance(err, dict):
            err = err.get("message") or err
        return _clip(str(err), 300)
    return _clip(str(body), 200)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n].rstrip() + " [...]"


class Retry:
    """Retries with exponential backoff across servers until ``max_wait`` seconds have passed.

    ``run(attempt, servers)`` calls ``attempt(server)`` on each server in the given order,
    skipping to the next one on a transient failure; once every one failed it waits
    (0.25 s, doubling, at most 4 s) and starts over, marking failed servers so that other
    calls try them last for a while. The last failure is in the final error.
    """

    COOLDOWN = 5.0

    def __init__(self, *, max_wait: float):
        self.max_wait = max_wait
        self._down: dict[str, float] = {}
        self._lock = threading.Lock()

    def order(self, servers: Sequence[Server]) -> list[Server]:
        """``servers`` with those that failed in the last few seconds moved to the end (order kept)."""
        now = time.monotonic()
        with self._lock:
            down = {u for u, t in self._down.items() if t > now}
        return [s for s in servers if s.url not in down] + [s for s in servers if s.url in down]

    def mark(self, server: Server, ok: bool) -> None:
        with self._lock:
            if ok:
                self._down.pop(server.url, None)
            else:
                self._down[server.url] = time.monotonic() + self.COOLDOWN

    def run(self, attempt, servers: Sequence[Server], *, what: str, deadline: float | None = None):
        from tenacity import (RetryError, Retrying, retry_if_exception_type, stop_after_delay,
                              wait_exponential)

        last: list[Transient] = []

        def one_round():
            for server in self.order(servers):
                try:
                    result = attempt(server)
                except Transient as exc:
                    self.mark(server, False)
                    last[:] = [exc]
                    continue
                self.mark(server, True)
                return result
            raise last[0]

        budget = self.max_wait if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            for round_ in Retrying(retry=retry_if_exception_type(Transient), stop=stop_after_delay(budget),
                                   wait=wait_exponential(multiplier=0.25, max=4), reraise=False):
                with round_:
                    return one_round()
        except RetryError:
            pass
        names = ", ".join(redact(s.url) for s in servers)
        reason = str(last[0]) if last else "no attempt"
        raise UpstreamError(f"{what}: no server answered within remote.max_wait = {self.max_wait:g} s "
                            f"({names}); last failure: {reason}",
                            starting=bool(last) and getattr(last[0], "status", None) == 503)


class TokenText:
    """The text of the token runs this client made, so that a prompt of tokens can be sent as text.

    Servers that take only text prompts (llama_cpp.server) re-tokenise them; their
    detokenize endpoint drops control tokens (the chat markup), so the text is taken from
    the ``tokenize`` call that produced each run instead. Runs are matched greedily,
    longest first; tokens no remembered run covers come back as token spans, for the
    server's detokenize. Bounded by tokens held (least recently used runs go first), above
    the packer's own memory of section tokens.
    """

    def __init__(self, *, max_tokens: int = 8_000_000):
        self._runs: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._by_first: dict[int, set[tuple[int, ...]]] = {}
        self._max = max_tokens
        self._held = 0
        self._lock = threading.Lock()

    def remember(self, tokens: Sequence[int], text: str) -> None:
        if not tokens:
            return
        key = tuple(tokens)
        with self._lock:
            if key not in self._runs:
                self._held += len(key)
                self._by_first.setdefault(key[0], set()).add(key)
            self._runs[key] = text
            self._runs.move_to_end(key)
            while self._held > self._max and len(self._runs) > 1:
                old, _ = self._runs.popitem(last=False)
                self._held -= len(old)
                self._by_first[old[0]].discard(old)

    def pieces(self, tokens: Sequence[int]) -> list[str | list[int]]:
        """``tokens`` as remembered texts, with the spans no remembered run covers as token lists."""
        out: list[str | list[int]] = []
        i, n = 0, len(tokens)
        with self._lock:
            while i < n:
                best = None
                for run in self._by_first.get(tokens[i], ()):
                    if (best is None or len(run) > len(best)) and tuple(tokens[i:i + len(run)]) == run:
                        best = run
                if best is None:
                    if out and isinstance(out[-1], list):
                        out[-1].append(tokens[i])
                    else:
                        out.append([tokens[i]])
                    i += 1
                    continue
                self._runs.move_to_end(best)
                out.append(self._runs[best])
                i += len(best)
        return out

    def text(self, tokens: Sequence[int]) -> str | None:
        """The text of ``tokens`` if remembered runs cover them all, else None."""
        parts = self.pieces(tokens)
        return None if any(isinstance(p, list) for p in parts) else "".join(parts)


def digest(*parts) -> str:
    """A short stable hash of ``parts`` (names of what servers serve). Not :func:`pipeline.summarize.digest.digest`:
    a remote embedder's name is its identity in every collection it filled, so its form is frozen."""
    import hashlib

    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def api_key(env_name: str) -> str:
    """The bearer token from the environment variable named by ``remote.api_key_env`` (never logged)."""
    return os.environ.get(env_name, "") if env_name else ""


__all__ = ["PREFIX", "Refused", "RemoteRef", "Retry", "Server", "TokenText", "Transient", "api_key", "digest", "expect",
           "expect_tokens", "not_the_api"]
