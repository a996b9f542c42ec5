"""A generator on one or several OpenAI-compatible servers (``models.generator = "openai:..."``).

It fulfils :class:`~pipeline.engine.contract.TextGenerator`, so asking, warming and
summarising run on it unchanged. Each prompt goes to the server that owns its
leading documents on a consistent-hash ring (:mod:`.routing`), so a server's slot
keeps reusing the prefix it holds; when that server is down, the next one on the
ring takes the prompt. Answers stream; a stream that breaks off is asked again
(from the same server or the next) and continues after what was already shown,
provided the repeated answer starts the same way (greedy decoding, or a fixed seed);
otherwise, or once ``remote.max_wait`` has passed, the iteration raises an
:class:`~pipeline.errors.EngineError` (exit 6), so no partial answer is ever returned
as complete, and nothing is recorded for it.
"""

from __future__ import annotations

import copy
import re
import threading
import time
from functools import cached_property
from typing import Callable, Iterator, Sequence

from .client import (RemoteRef, Retry, Server, TokenText, Transient, api_key, digest, expect, expect_tokens,
                     not_the_api)
from .routing import HashRing, route_key
from ..contract import CacheKind, EngineStats, Generation, GeneratorBase
from ..context_lock import CancelToken
from ...records import PromptShape, common_prefix
from ..templates import FALLBACK, render_chat
from ...errors import EngineError, UpstreamError, redact

_DEFAULT_N_CTX = 2048  # llama_cpp.server's own default, where a server does not say


class RemoteGenerator(GeneratorBase):
    """Prompts → streamed answers on OpenAI-compatible servers; thread-safe (one HTTP client per server)."""

    def __init__(self, ref: RemoteRef, settings, remote, *, log: Callable[[str], None] | None = None):
        self.ref = ref
        self.settings = settings  # EngineConfig: n_ctx where the server does not report it, the seed
        self.remote = remote
        self._log = log or (lambda message: None)
        key = api_key(remote.api_key_env)
        self.servers = [Server(u, connect_timeout=remote.connect_timeout, read_timeout=remote.read_timeout,
                               api_key=key) for u in ref.urls]
        self._by_url = {s.url: s for s in self.servers}
        self.ring = HashRing(ref.urls)
        self.retry = Retry(max_wait=remote.max_wait)
        self.texts = TokenText()
        self._last: dict[str, tuple[int, ...]] = {}  # the last prompt each server ran (what its slot holds)
        self._lock = threading.Lock()
        self.load_seconds = 0.0
        self.notes: list[str] = []
        self._pin: str | None = None  # a worker's own server (see workers)
        self._probe_lock = threading.Lock()

    # -- what the servers serve -------------------------------------------------------------------

    @property
    def _facts(self) -> dict:
        """Dialect, model name, context length and chat template, from the first server that answers
        (probed once, by one thread)."""
        facts = self.__dict__.get("_probed")
        if facts is None:
            with self._probe_lock:
                facts = self.__dict__.get("_probed") or self._probe()
        return facts

    def _probe(self) -> dict:
        def probe(server: Server) -> dict:
            names = server.models()
            model = self.ref.model or (names[0] if names else "")
            if self.ref.model and names and self.ref.model not in names:
                raise EngineError(f"the server {redact(server.url)} does not serve the model {self.ref.model!r} "
                                  f"(it serves {', '.join(names)})")
            props = server.props
            settings = props.get("default_generation_settings") or {}
            n_ctx = (settings.get("n_ctx") if isinstance(settings, dict) else None) or props.get("n_ctx") or 0
            texts = {k: props.get(k) or "" for k in ("chat_template", "bos_token", "eos_token")}
            if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 0 or not all(
                    isinstance(v, str) for v in texts.values()):
                raise not_the_api(server.url, "/props", "its context length or chat template is not one")
            return {"dialect": server.dialect, "model": model, "n_ctx": n_ctx, "template": texts["chat_template"],
                    "bos_text": texts["bos_token"], "eos_text": texts["eos_token"]}

        facts = self.retry.run(probe, self.servers, what="connecting to the generator server")
        if not facts["template"]:
            family = self._template_family(facts["dialect"])
            facts["template"] = FALLBACK.get(family, "")
            self.notes.append(
                "the server does not publish its chat template (llama_cpp.server does not): "
                + (f"using the {family} template its vocabulary's control tokens point to" if family
                   else "prompts use a plain layout"))
        if not facts["n_ctx"]:
            facts["n_ctx"] = self.settings.n_ctx or _DEFAULT_N_CTX
        self.__dict__["_probed"] = facts
        return facts

    def _template_family(self, dialect: str) -> str:
        """ChatML or Gemma, where the vocabulary has that family's turn markers as single control tokens."""
        bos = self._tokenize_raw("", special=True, add_special=True, dialect=dialect)
        for family, marker in (("ChatML", "<|im_start|>"), ("Gemma", "<start_of_turn>")):
            tokens = self._tokenize_raw(marker, special=True, add_special=False, dialect=dialect)
            if len([t for t in tokens if t not in bos]) == 1:
                return family
        return ""

    @property
    def dialect(self) -> str:
        return self._facts["dialect"]

    @property
    def model(self) -> str:
        return self._facts["model"]

    @property
    def n_ctx(self) -> int:
        return self._facts["n_ctx"]

    @cached_property
    def namespace(self) -> str:
        return "openai-" + digest("openai", self.model, self.n_ctx)

    @cached_property
    def bos(self) -> list[int]:
        return self._tokenize_raw("", special=True, add_special=True)

    # -- text -------------------------------------------------------------------------------------

    def _tokenize_raw(self, text: str, *, special: bool, add_special: bool, dialect: str = "") -> list[int]:
        dialect = dialect or self.dialect

        def call(server: Server) -> list[int]:
            if dialect == "llama-server":
                body = {"content": text, "add_special": add_special, "parse_special": special}
                return expect_tokens(server.post_json("/tokenize", body, root=True), url=server.url, path="/tokenize")
            body = {"input": text}
            if self.ref.model:
                body["model"] = self.ref.model
            return expect_tokens(server.post_json("/extras/tokenize", body, root=True), url=server.url,
                                 path="/extras/tokenize")

        # A worker tokenizes on its own server: llama_cpp.server cuts a running stream short when
        # another request arrives (its interrupt_requests, on by default).
        servers = sorted(self.servers, key=lambda srv: srv.url != self._pin) if self._pin else self.servers
        return self.retry.run(call, servers, what="tokenizing on the generator server")

    def _detokenize(self, tokens: list[int]) -> str:
        """Text for tokens this client did not tokenize (the server's detokenize drops control tokens)."""
        body = {"tokens": tokens, **({"model": self.ref.model} if self.ref.model else {})}
        return self.retry.run(lambda srv: expect(srv.post_json("/extras/detokenize", body, root=True), "text", str,
                                                 url=srv.url, path="/extras/detokenize"),
                              self.servers, what="detokenizing on the generator server")

    def tokenize(self, text: str, *, special: bool = False) -> list[int]:
        """Tokens of ``text`` in the server's vocabulary. llama-server parses control-token text only
        with ``special``; llama_cpp.server always parses it (it takes text prompts only), so there
        document and question text is :func:`defang`-ed first: it must never become chat markup."""
        if not text:
            return []
        if not special and self.dialect != "llama-server":
            text = defang(text, self._facts)
        tokens = self._tokenize_raw(text, special=special, add_special=False)
        bos = self.bos
        if self.dialect != "llama-server" and bos and tokens[:len(bos)] == bos:
            tokens = tokens[len(bos):]  # llama_cpp.server adds BOS where the model wants one
        self.texts.remember(tokens, text)
        return tokens

    def chat(self, system: str, user: str) -> str:
        f = self._facts
        return render_chat(f["template"], system, user, bos=f["bos_text"], eos=f["eos_text"])

    # -- running prompts --------------------------------------------------------------------------

    def route(self, prompt: PromptShape | Sequence[int]) -> list[Server]:
        """The servers for this prompt, in order: its prefix's owner first (or the pinned server of a
        worker, see :meth:`workers`), then failover order."""
        key = route_key(PromptShape.coerce(prompt))
        order = [self._by_url[u] for u in self.ring.preference(key)]
        if self._pin is not None:
            order.sort(key=lambda s: s.url != self._pin)
        return order

    def workers(self) -> list["RemoteGenerator"]:
        """One generator per server, each sending its prompts to its own server first (failing over to
        the others): the engines of a job spread over the servers (:mod:`pipeline.summarize.spread`).
        They share this one's connections, token texts and server state."""
        self._facts  # noqa: B018 - probed once, shared by the copies
        self.namespace  # noqa: B018
        out = []
        for url in self.ref.urls:
            worker = copy.copy(self)
            worker._pin = url
            out.append(worker)
        return out

    def request_body(self, tokens: Sequence[int], *, max_tokens: int, temperature: float, repeat_penalty: float,
                     seed: int | None) -> dict:
        """The JSON body of the completion request for ``tokens``: the token ids for llama-server, else
        the text the client remembers for them (see :class:`.client.TokenText`)."""
        if self.dialect == "llama-server":
            prompt: object = list(tokens)
        else:
            body_tokens = list(tokens)
            bos = self.bos
            if bos and body_tokens[:len(bos)] == bos:
                body_tokens = body_tokens[len(bos):]  # the server adds it again
            prompt = "".join(p if isinstance(p, str) else self._detokenize(p)
                             for p in self.texts.pieces(body_tokens))
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "repeat_penalty": repeat_penalty, "stream": True, "cache_prompt": True,
                "stream_options": {"include_usage": True}}
        if seed is not None:
            body["seed"] = seed
        if self.ref.model:
            body["model"] = self.ref.model
        return body

    def generate(self, prompt: PromptShape | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 repeat_penalty: float = 1.0, seed: int | None = None, stats: EngineStats | None = None,
                 stop_tokens: Sequence[int] = (), progress: Callable[[int, int], None] | None = None,
                 cancel: CancelToken | None = None) -> Generation:
        """Stream the completion of ``prompt`` from the server that owns its prefix (see :meth:`route`).

        The server ends the answer at its own end-of-generation tokens: ``stop_tokens`` are not sent
        (stop strings still apply to the text), and the server reports no prefill ``progress``;
        it reuses a prompt as a prefix only (a sections-mode prompt is not composed).
        ``cancel`` ends the stream at the next piece."""
        shape = PromptShape.coerce(prompt)
        tokens = shape.tokens
        if len(tokens) + 1 > self.n_ctx:
            raise EngineError(f"the prompt has {len(tokens):,} tokens; the server's context holds {self.n_ctx:,}")
        stats = stats or EngineStats()
        stats.prompt_tokens = len(tokens)
        seed = self.settings.seed if seed is None else seed
        body = self.request_body(tokens, max_tokens=max_tokens, temperature=temperature,
                                 repeat_penalty=repeat_penalty, seed=seed)
        order = self.route(shape)
        return Generation(self._run(tuple(tokens), body, order, stats, cancel), stats)

    def _run(self, tokens: tuple[int, ...], body: dict, order: list[Server], stats: EngineStats,
             cancel: CancelToken | None = None) -> Iterator[str]:
        from tenacity import wait_exponential

        backoff = wait_exponential(multiplier=0.25, max=4)
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.remote.max_wait
        shown = ""  # what the caller has already been given
        last = "no attempt"
        last_status = None
        failures = 0
        while True:
            for server in self.retry.order(order):
                got = ""
                first = None
                report: dict = {}
                pieces = 0
                try:
                    start = time.perf_counter()
                    for event in server.stream("/completions", body):
                        piece = _event_text(event, report, server.url)
                        if not piece:
                            continue
                        if cancel is not None:
                            cancel.raise_if_cancelled()
                        pieces += 1
                        if first is None:
                            first = time.perf_counter()
                            if not stats.ttft_seconds:
                                stats.ttft_seconds = first - t0
                        got += piece
                        if len(got) <= len(shown):
                            if not shown.startswith(got):
                                raise self._diverged(server)
                            continue
                        if not got.startswith(shown):
                            raise self._diverged(server)
                        new, shown = got[len(shown):], got
                        yield new
                    if "finish_reason" not in report:
                        raise Transient(server.url, "the stream ended without a finish reason")
                    if len(got) < len(shown):
                        raise self._diverged(server)
                except Transient as exc:
                    self.retry.mark(server, False)
                    failures += 1
                    last, last_status = str(exc), exc.status
                    self._log(f"warning: {last}: retrying")
                    continue
                self.retry.mark(server, True)
                end = time.perf_counter()
                with self._lock:
                    self._last[server.url] = tokens
                self._fill(stats, server, report, start=start, first=first, end=end, pieces=pieces)
                if failures:
                    stats.notes.append(f"answered after {failures} failed attempt(s); last: {last}")
                return
            if time.monotonic() + 0.01 >= deadline:
                where = ", ".join(redact(s.url) for s in order)
                raise UpstreamError(f"no generator server completed the answer within remote.max_wait = "
                                    f"{self.remote.max_wait:g} s ({where}); last failure: {last}"
                                    + ("; the answer shown so far is incomplete" if shown else ""),
                                    starting=last_status == 503 and not shown)
            delay = min(backoff(_Attempt(failures)), max(0.0, deadline - time.monotonic()))
            time.sleep(delay)

    @staticmethod
    def _diverged(server: Server) -> EngineError:
        return EngineError(f"the answer was cut off, and the server {redact(server.url)} answered differently "
                           "when asked again (sampling without a fixed seed?): the answer is incomplete")

    def _fill(self, stats: EngineStats, server: Server, report: dict, *, start: float, first: float | None,
              end: float, pieces: int) -> None:
        """The server's own figures where it reports them (llama-server: ``timings``; OpenAI: ``usage``)."""
        timings, usage = _numbers(report.get("timings")), _numbers(report.get("usage"))
        details = _numbers((report.get("usage") or {}).get("prompt_tokens_details"))
        cached = timings.get("cache_n", details.get("cached_tokens"))
        stats.notes.append(f"answered by {redact(server.url)} ({server.dialect})")
        if cached is None:
            stats.notes.append("the server does not report cached prompt tokens")
            stats.prefill_tokens = int(usage.get("prompt_tokens") or stats.prompt_tokens)
            stats.cache = CacheKind.NONE
        else:
            stats.cached_tokens = int(cached)
            stats.prefill_tokens = int(timings.get("prompt_n", stats.prompt_tokens - stats.cached_tokens))
            stats.cache = CacheKind.SERVER if stats.cached_tokens else CacheKind.MISS
        stats.prefill_seconds = (timings["prompt_ms"] / 1000 if "prompt_ms" in timings
                                 else (first or end) - start)
        if stats.prefill_seconds > 0:
            stats.prefill_tokens_per_second = stats.prefill_tokens / stats.prefill_seconds
        stats.decode_tokens = int(timings.get("predicted_n") or usage.get("completion_tokens") or pieces)
        stats.decode_seconds = (timings["predicted_ms"] / 1000 if "predicted_ms" in timings
                                else end - (first or end))
        if stats.decode_seconds > 0:
            stats.decode_tokens_per_second = stats.decode_tokens / stats.decode_seconds
        stats.notes.extend(self.notes)

    def reusable(self, prompt: PromptShape | Sequence[int]) -> int:
        """How much of the prompt the routed server's slot holds (its last prompt), cut at a cut (a server
        reuses a prefix only)."""
        shape = PromptShape.coerce(prompt)
        server = self.retry.order(self.route(shape))[0]
        with self._lock:
            held = self._last.get(server.url, ())
        n = common_prefix(held, shape.tokens, shape.prefix_len)
        return max((c for c in shape.cuts if c <= n), default=0)

    def warm(self, prompt: PromptShape) -> bool:
        """Have the server of the prompt's shared prefix prefill it (one answer token), so its slot holds it
        for the next question."""
        if not prompt.prefix:
            return False
        self.generate(PromptShape(prompt.prefix, prompt.cuts), max_tokens=1).read()
        return True

    def close(self) -> None:
        for server in self.servers:
            server.close()


def _event_text(event: dict, report: dict, url: str) -> str:
    """The text of one streamed completion event ("" for one without), its finish reason and figures noted
    in ``report``; an event of another shape is :func:`~.client.not_the_api`."""
    for key in ("timings", "usage"):
        if event.get(key):
            report[key] = expect(event, key, dict, url=url, path="/completions")
    choices = event.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise not_the_api(url, "/completions", f"'choices' is {str(choices)[:40]}, not a list of choices")
    if not choices:
        return ""
    piece, finish = choices[0].get("text") or "", choices[0].get("finish_reason")
    if not isinstance(piece, str) or not isinstance(finish, (str, type(None))):
        raise not_the_api(url, "/completions", "a choice whose text or finish reason is not text")
    if finish:
        report["finish_reason"] = finish
    return piece


def _numbers(figures: object) -> dict:
    """The numeric fields of a server's ``timings`` or ``usage`` (others left out: they are only figures)."""
    if not isinstance(figures, dict):
        return {}
    return {k: v for k, v in figures.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0}


class _Attempt:
    """The retry state tenacity's wait strategies read (the attempt number)."""

    def __init__(self, n: int):
        self.attempt_number = max(1, n)


#: Text that llama.cpp's tokenizer turns into a control token where it parses them: ChatML/Llama-3 style
#: ``<|name|>``, Gemma's turn markers, the common BOS/EOS spellings and Mistral's instruction markers.
_CONTROL_TEXT = re.compile(r"<\|[A-Za-z0-9_.:-]{1,48}\|>|<(?:start|end)_of_turn>|</?s>|<(?:bos|eos|pad|unk)>"
                           r"|\[/?INST\]")
_JOINER = "\u2060"  # WORD JOINER: invisible, and it splits the marker into ordinary text tokens


def defang(text: str, facts: dict | None = None) -> str:
    """``text`` with every control-token spelling broken by an invisible joiner after its first character.

    For servers that tokenise text prompts with control tokens parsed (llama_cpp.server
    does, always): a document that contains ``<|im_end|>`` would otherwise end the turn
    and inject instructions. In-process and with llama-server the text is tokenised with
    control tokens off, and this is not needed. The server's own BOS/EOS spellings
    (``facts``) are broken too, whatever they look like.
    """
    extra = [t for t in ((facts or {}).get("bos_text"), (facts or {}).get("eos_text")) if t and len(t) > 1]
    text = _CONTROL_TEXT.sub(lambda m: m.group(0)[0] + _JOINER + m.group(0)[1:], text)
    for marker in extra:
        if marker in text:
            text = text.replace(marker, marker[0] + _JOINER + marker[1:])
    return text


def remote_generator(ref: str, settings, remote, *, log=None) -> RemoteGenerator:
    """The generator an ``openai:`` reference names."""
    return RemoteGenerator(RemoteRef.parse(ref), settings, remote, log=log)


__all__ = ["RemoteGenerator", "remote_generator"]
