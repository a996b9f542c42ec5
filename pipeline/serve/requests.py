"""The one request parser: a body read within its limit, parsed as strict JSON, and typed fields.

Every handler reads its input through :class:`Body`, so every field is checked the same
way and every bad value is a 400 that names the field: a wrong type, a number out of
range, text that is not Unicode (a lone surrogate), JSON nested too deeply to parse.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..ask.request import AskRequest
from ..errors import InputError
from ..inputs import MAX_TOP_K, check_text
from .http_errors import HTTPError
from . import limits
from .limits import MAX_PATHS, MAX_TEMPERATURE, MAX_TOKENS

if TYPE_CHECKING:
    from starlette.requests import Request

_ROLES = ("system", "user", "assistant", "developer", "tool")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _invalid(message: str, code: str = "invalid_type") -> HTTPError:
    return HTTPError(400, message, code=code)


async def body_parts(request: "Request", *, what: str = "body"):
    """The parts of ``request``'s body as they arrive: a client that leaves is a 400, one that holds the
    connection open without sending for :data:`~.limits.BODY_STALL_SECONDS` a 408 (``what`` names the
    body in those messages)."""
    from starlette.requests import ClientDisconnect

    parts = request.stream().__aiter__()
    try:
        while True:
            try:
                yield await asyncio.wait_for(parts.__anext__(), limits.BODY_STALL_SECONDS)
            except StopAsyncIteration:
                return
    except ClientDisconnect:  # nobody is left to answer; end the request without a traceback
        raise HTTPError(400, f"the client closed the connection before sending the whole {what}",
                        code="client_disconnected") from None
    except asyncio.TimeoutError:
        raise HTTPError(408, f"the {what} stalled for {limits.BODY_STALL_SECONDS:g} seconds",
                        code="request_timeout") from None


class Body:
    """A request's JSON object and typed access to its fields (None: absent or null)."""

    def __init__(self, data: dict):
        self.data = data

    @classmethod
    async def read(cls, request: "Request", *, limit: int) -> "Body":
        """The body of ``request``: at most ``limit`` bytes (else 413), a JSON object (else 400)."""
        too_large = HTTPError(413, f"the request body is larger than {limit:,} bytes", "request_too_large")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            raise too_large
        raw = bytearray()
        async for part in body_parts(request, what="request body"):
            raw += part
            if len(raw) > limit:
                raise too_large
        try:
            data = json.loads(bytes(raw) or b"null", parse_constant=_no_constant)
        except RecursionError:
            raise _invalid("the body is nested too deeply to be a request", "invalid_json") from None
        except ValueError as exc:
            raise _invalid(f"the body is not valid JSON: {exc}", "invalid_json") from None
        if not isinstance(data, dict):
            raise _invalid("the body must be a JSON object", "invalid_json")
        return cls(data)

    def value(self, name: str, kinds: type | tuple[type, ...], *, required: bool = False) -> Any:
        value = self.data.get(name)
        if value is None:
            if required:
                raise _invalid(f"'{name}' is required", "missing_field")
            return None
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise _invalid(f"'{name}' must be of type {' or '.join(k.__name__ for k in kinds)}")
        return value

    def text(self, name: str, *, required: bool = False) -> str | None:
        value = self.value(name, str, required=required)
        return None if value is None else _text(value, f"'{name}'")

    def integer(self, name: str, *, low: int, high: int) -> int | None:
        value = self.value(name, int)
        if value is not None and not low <= value <= high:
            raise _invalid(f"'{name}' must be between {low:,} and {high:,}", "out_of_range")
        return value

    def number(self, name: str, *, low: float, high: float) -> float | None:
        value = self.value(name, (int, float))
        if value is not None and not low <= value <= high:
            raise _invalid(f"'{name}' must be between {low:g} and {high:g}", "out_of_range")
        return value

    def flag(self, name: str, *, default: bool = False) -> bool:
        value = self.value(name, bool)
        return default if value is None else value

    def strings(self, name: str) -> list[str] | None:
        """A string or a list of strings."""
        value = self.data.get(name)
        if value is None:
            return None
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not all(isinstance(s, str) for s in values):
            raise _invalid(f"'{name}' must be a string or a list of strings")
        return [_text(s, f"'{name}'") for s in values]

    def paths(self, name: str) -> list[str]:
        """A non-empty list of at most :data:`~.limits.MAX_PATHS` paths."""
        value = self.value(name, list, required=True)
        if not value or not all(isinstance(p, str) and p for p in value):
            raise _invalid(f"'{name}' must be a non-empty list of paths on the server")
        if len(value) > MAX_PATHS:
            raise _invalid(f"'{name}' may name at most {MAX_PATHS:,} paths (name their folders instead)",
                           "out_of_range")
        return [_text(p, f"'{name}'") for p in value]


def _text(value: str, what: str) -> str:
    try:
        return check_text(value, what)
    except InputError as err:
        raise _invalid(str(err), "invalid_text") from None


# -- the chat request ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatRequest:
    """What ``POST /v1/chat/completions`` asks: the question with its earlier turns and per-call options
    (an :class:`~pipeline.ask.request.AskRequest`), and how the answer is sent."""

    ask: AskRequest
    stream: bool
    include_usage: bool
    collection: str | None = None  # None: the server's own


def chat_request(body: Body) -> ChatRequest:
    _refuse_unsupported(body)
    turns = messages(body.value("messages", list, required=True))
    ask = AskRequest.make(turns[-1]["content"], history=turns[:-1] or None,
                          temperature=body.number("temperature", low=0.0, high=MAX_TEMPERATURE),
                          max_tokens=(body.integer("max_completion_tokens", low=1, high=MAX_TOKENS)
                                      or body.integer("max_tokens", low=1, high=MAX_TOKENS)),
                          top_k=body.integer("top_k", low=1, high=MAX_TOP_K), stop=body.strings("stop"))
    stream_options = body.value("stream_options", dict) or {}
    return ChatRequest(ask=ask, stream=body.flag("stream"),
                       include_usage=stream_options.get("include_usage") is True,
                       collection=body.text("collection"))


def _unsupported(message: str) -> HTTPError:
    return HTTPError(400, message, code="unsupported_parameter")


def _refuse_unsupported(body: Body) -> None:
    """OpenAI fields this server cannot honour are a 400 that says so, never silently ignored;
    sampling fields it ignores are still type-checked, as the others are."""
    if body.integer("n", low=1, high=2**31 - 1) not in (None, 1):
        raise _unsupported("only 'n' = 1 is supported: one answer per request")
    if body.value("tools", list) or body.value("functions", list):
        raise _unsupported("tools and functions are not supported: answers come from the documents")
    choice = body.value("tool_choice", (str, dict))
    if choice not in (None, "none", "auto"):
        raise _unsupported("'tool_choice' other than \"none\" or \"auto\" is not supported (no tools)")
    if body.flag("logprobs") or body.value("top_logprobs", int) is not None:
        raise _unsupported("log probabilities are not supported")
    fmt = body.value("response_format", dict)
    if fmt is not None and fmt.get("type") != "text":
        raise _unsupported("only the \"text\" response format is supported")
    for name in ("presence_penalty", "frequency_penalty"):  # accepted, as llama-server does; not applied
        body.number(name, low=-2.0, high=2.0)
    body.number("top_p", low=0.0, high=1.0)
    body.integer("seed", low=-(2**63), high=2**64 - 1)
    body.value("user", str)
    body.value("logit_bias", dict)


def messages(items: list) -> list[dict]:
    """OpenAI messages as ``[{"role", "content"}]`` turns of text; the last must be the user's.

    System, developer and tool messages are dropped: the server's own system prompt frames
    answers from the documents.
    """
    out = []
    for i, m in enumerate(items):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _invalid(f"messages[{i}] must be an object with a role of system, user or assistant",
                           "invalid_message")
        content = _content(m.get("content"), i)
        if m["role"] in ("user", "assistant"):
            out.append({"role": m["role"], "content": content})
    if not out or out[-1]["role"] != "user" or not out[-1]["content"].strip():
        raise _invalid("the last message must be a non-empty user message", "invalid_message")
    return out


def _content(content: Any, i: int) -> str:
    if isinstance(content, list):  # content parts: only text is understood
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise _invalid(f"messages[{i}]: only text content is supported", "invalid_message")
        if not all(isinstance(p.get("text"), str) for p in content):
            raise _invalid(f"messages[{i}]: a text part's 'text' must be a string", "invalid_message")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise _invalid(f"messages[{i}].content must be a string", "invalid_message")
    return _text(content, f"messages[{i}].content")
